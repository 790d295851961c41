/*
 * SDP wire layouts: the BSDH and extended headers byte for byte as Annex A4 (and Wireshark's SDP dissector) lay
 * them out, the 56-byte Hello, the HelloAck, and the receive-side validation of every message. The last tests
 * drive rs_sdp_on_recv (what the progress step calls for a receive completion) on a socket without a QP, for
 * protocol violations a correct peer never commits and tests over a real connection therefore cannot produce
 * (found by tests/fuzz/fuzz_sdp_rx.c).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"
#include "sdp_stream/sdp_wire.h"

static void test_bsdh_bytes(void **state)
{
    (void)state;
    struct rs_sdp_bsdh h = { .mid = 0xff, .flags = 0, .bufs = 0x0102, .len = 0x03040506, .mseq = 0x0708090a,
                             .mseq_ack = 0x0b0c0d0e };
    uint8_t out[16];
    rs_sdp_bsdh_encode(&h, out);
    const uint8_t want[16] = { 0xff, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
                               0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e };
    assert_memory_equal(out, want, 16);
    struct rs_sdp_bsdh d;
    assert_int_equal(rs_sdp_bsdh_decode(out, 16, &d), 0);
    assert_int_equal(d.mid, 0xff);
    assert_int_equal(d.bufs, 0x0102);
    assert_int_equal(d.len, 0x03040506);
    assert_int_equal(d.mseq, 0x0708090a);
    assert_int_equal(d.mseq_ack, 0x0b0c0d0e);
    assert_int_equal(rs_sdp_bsdh_decode(out, 15, &d), -EBADMSG);
}

static void test_avail_and_compl_bytes(void **state)
{
    (void)state;
    uint8_t out[64];
    struct rs_sdp_bsdh h = { .mid = RS_SDP_MID_SRC_AVAIL, .bufs = 7, .len = 32, .mseq = 5, .mseq_ack = 4 };
    struct rs_sdp_avail a = { .len = 0x100000, .rkey = 0xdeadbeef, .vaddr = 0x1122334455667788ull };
    rs_sdp_avail_encode(&h, &a, out);
    const uint8_t srcah[16] = { 0x00, 0x10, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef,
                                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88 };
    assert_memory_equal(out + 16, srcah, 16);
    assert_int_equal(rs_sdp_hdr_len(RS_SDP_MID_SRC_AVAIL), 32);
    struct rs_sdp_bsdh d;
    struct rs_sdp_avail da;
    uint32_t cl = 0;
    assert_int_equal(rs_sdp_msg_check(out, 32, &d, &da, &cl), 0);
    assert_int_equal(da.len, 0x100000);
    assert_int_equal(da.rkey, 0xdeadbeef);
    assert_true(da.vaddr == 0x1122334455667788ull);

    h.mid = RS_SDP_MID_SINK_AVAIL;
    h.len = 36;
    a.non_disc = 0x01020304;
    rs_sdp_avail_encode(&h, &a, out);
    assert_int_equal(rs_sdp_hdr_len(RS_SDP_MID_SINK_AVAIL), 36);
    const uint8_t nd[4] = { 1, 2, 3, 4 };
    assert_memory_equal(out + 32, nd, 4);
    assert_int_equal(rs_sdp_msg_check(out, 36, &d, &da, &cl), 0);
    assert_int_equal(da.non_disc, 0x01020304);

    h.mid = RS_SDP_MID_RDMA_RD_COMPL;
    h.len = 20;
    rs_sdp_compl_encode(&h, 0xabcdef, out);
    const uint8_t rrch[4] = { 0x00, 0xab, 0xcd, 0xef };
    assert_memory_equal(out + 16, rrch, 4);
    assert_int_equal(rs_sdp_msg_check(out, 20, &d, NULL, &cl), 0);
    assert_int_equal(cl, 0xabcdef);
}

/* SuspComm (hand-back): the SCH is the big-endian service ID, token << 16 | TCP port; SuspCommAck is a bare BSDH. */
static void test_suspend_bytes(void **state)
{
    (void)state;
    uint8_t out[32];
    struct rs_sdp_bsdh h = { .mid = RS_SDP_MID_SUSPEND, .bufs = 3, .len = 24, .mseq = 9, .mseq_ack = 8 };
    rs_sdp_suspend_encode(&h, 0x0102030405064e21ull, out);
    const uint8_t sch[8] = { 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x4e, 0x21 };
    assert_int_equal(out[0], 0x0d);
    assert_memory_equal(out + 16, sch, 8);
    assert_int_equal(rs_sdp_hdr_len(RS_SDP_MID_SUSPEND), 24);
    struct rs_sdp_bsdh d;
    assert_int_equal(rs_sdp_msg_check(out, 24, &d, NULL, NULL), 0);
    assert_true(rs_sdp_suspend_decode(out) == 0x0102030405064e21ull);
    assert_int_not_equal(rs_sdp_msg_check(out, 16, &d, NULL, NULL), 0);     /* the SCH is missing */
    h.mid = RS_SDP_MID_SUSPEND_ACK;
    h.len = 16;
    rs_sdp_bsdh_encode(&h, out);
    assert_int_equal(rs_sdp_msg_check(out, 16, &d, NULL, NULL), 0);
    assert_string_equal(rs_sdp_mid_name(0x0d), "SuspComm");

    /* the TCP header that follows it: token and residue length, refused with another token or a silly length */
    uint8_t hb[RS_SDP_HB_HDR_LEN];
    rs_sdp_hb_hdr_encode(hb, 0x123456789abcull, 70000);
    const uint8_t hb_bytes[24] = { 'R', 'S', 'H', 'B', 1, 0, 0, 0, 0, 0, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc,
                                   0, 0, 0, 0, 0, 0x01, 0x11, 0x70 };
    assert_memory_equal(hb, hb_bytes, 24);
    uint64_t residue = 0;
    assert_int_equal(rs_sdp_hb_hdr_decode(hb, 24, 0x123456789abcull, &residue), 0);
    assert_int_equal(residue, 70000);
    assert_int_equal(rs_sdp_hb_hdr_decode(hb, 24, 0x123456789abdull, &residue), -EPROTO);
    assert_int_equal(rs_sdp_hb_hdr_decode(hb, 23, 0x123456789abcull, &residue), -EBADMSG);
    rs_sdp_hb_hdr_encode(hb, 7, RS_SDP_HB_MAX_RESIDUE + 1);
    assert_int_equal(rs_sdp_hb_hdr_decode(hb, 24, 7, &residue), -EPROTO);
}

static void test_msg_check_rejects(void **state)
{
    (void)state;
    uint8_t buf[64] = { 0 };
    struct rs_sdp_bsdh h = { .mid = RS_SDP_MID_DATA, .len = 40, .mseq = 1 };
    struct rs_sdp_bsdh d;
    rs_sdp_bsdh_encode(&h, buf);
    assert_int_equal(rs_sdp_msg_check(buf, 40, &d, NULL, NULL), 0);
    /* len must equal what arrived */
    assert_int_equal(rs_sdp_msg_check(buf, 39, &d, NULL, NULL), -EBADMSG);
    assert_int_equal(rs_sdp_msg_check(buf, 12, &d, NULL, NULL), -EBADMSG);
    /* control messages carry no payload */
    h.mid = RS_SDP_MID_DISCONN;
    rs_sdp_bsdh_encode(&h, buf);
    assert_int_equal(rs_sdp_msg_check(buf, 40, &d, NULL, NULL), -EPROTO);
    h.len = 16;
    rs_sdp_bsdh_encode(&h, buf);
    assert_int_equal(rs_sdp_msg_check(buf, 16, &d, NULL, NULL), 0);
    /* unknown MIDs, Hello on the QP, modes rdmasock never negotiates (SuspComm: test_suspend_bytes) */
    const uint8_t bad_mids[] = { 0x00, 0x01, 0x07, 0x0b, 0x0f, 0x40, 0x80, 0xfc };
    for (size_t i = 0; i < sizeof(bad_mids); i++) {
        h.mid = bad_mids[i];
        rs_sdp_bsdh_encode(&h, buf);
        assert_int_equal(rs_sdp_msg_check(buf, 16, &d, NULL, NULL), -EPROTO);
    }
    /* urgent data */
    h.mid = RS_SDP_MID_DATA;
    h.flags = RS_SDP_FLAG_OOB_PRES;
    rs_sdp_bsdh_encode(&h, buf);
    assert_int_equal(rs_sdp_msg_check(buf, 16, &d, NULL, NULL), -EPROTO);
    /* a SrcAvail needs its SrcAH and a non-zero length */
    h.flags = 0;
    h.mid = RS_SDP_MID_SRC_AVAIL;
    h.len = 16;
    rs_sdp_bsdh_encode(&h, buf);
    assert_int_equal(rs_sdp_msg_check(buf, 16, &d, NULL, NULL), -EBADMSG);
    h.len = 32;
    struct rs_sdp_avail a = { .len = 0, .rkey = 1, .vaddr = 2 };
    rs_sdp_avail_encode(&h, &a, buf);
    assert_int_equal(rs_sdp_msg_check(buf, 32, &d, NULL, NULL), -EPROTO);
    assert_string_equal(rs_sdp_mid_name(RS_SDP_MID_SINK_CANCEL_ACK), "SinkCancelAck");
    assert_string_equal(rs_sdp_mid_name(0x55), "Unknown");
}

static void test_hello_fits_rdma_cm(void **state)
{
    (void)state;
    struct rs_sdp_hello h = {
        .bsdh = { .bufs = 15 }, .version = RS_SDP_VERSION, .ip_version = 4, .caps = RS_SDP_CAP_INVALIDATE,
        .max_adverts = 1, .desired_remote_rcv_size = 65552, .rcv_size = 65552, .port = 0x1f90, .has_ext = true,
        .ext_flags = RS_SDP_EXT_ZCOPY, .ka_rkey = 0x12345678, .ka_addr = 0xa1a2a3a4a5a6a7a8ull,
    };
    uint8_t out[64];
    memset(out, 0xee, sizeof(out));
    size_t n = rs_sdp_hello_encode(&h, out, sizeof(out));
    /* rdma_cm leaves 56 bytes of REQ private data on IP addresses */
    assert_true(n <= 56);
    assert_int_equal(n, RS_SDP_HELLO_LEN);
    /* BSDH: Hello, bufs, len = whole Hello, mseq 0 */
    const uint8_t bsdh[16] = { 0x00, 0x00, 0x00, 0x0f, 0x00, 0x00, 0x00, 48, 0, 0, 0, 0, 0, 0, 0, 0 };
    assert_memory_equal(out, bsdh, 16);
    /* HH at the Annex A4 offsets */
    assert_int_equal(out[16], 0x22);                /* majv_minv */
    assert_int_equal(out[17], 0x41);                /* IP version 4, cap: incoming Send w/ Invalidate */
    assert_int_equal(out[19], 1);                   /* max_adverts */
    const uint8_t sizes[8] = { 0x00, 0x01, 0x00, 0x10, 0x00, 0x01, 0x00, 0x10 };
    assert_memory_equal(out + 20, sizes, 8);        /* desremrcvsz, localrcvsz */
    assert_int_equal(out[28], 0x1f);
    assert_int_equal(out[29], 0x90);                /* port */
    assert_int_equal(out[32], 0x52);
    assert_int_equal(out[33], 0x53);                /* extension magic "RS" */
    assert_int_equal(out[48], 0xee);                /* nothing written past the Hello */
    struct rs_sdp_hello d;
    /* rdma_cm may hand over padded private data */
    assert_int_equal(rs_sdp_hello_decode(out, 56, &d), 0);
    assert_int_equal(d.bsdh.bufs, 15);
    assert_int_equal(d.rcv_size, 65552);
    assert_int_equal(d.desired_remote_rcv_size, 65552);
    assert_int_equal(d.port, 0x1f90);
    assert_int_equal(d.ip_version, 4);
    assert_true(d.has_ext);
    assert_int_equal(d.ext_flags, RS_SDP_EXT_ZCOPY);
    assert_int_equal(d.ka_rkey, 0x12345678);
    assert_true(d.ka_addr == 0xa1a2a3a4a5a6a7a8ull);
    /* a peer that sends only BSDH + the standard HH part still works (no extension: no zero copy) */
    out[7] = 32;
    assert_int_equal(rs_sdp_hello_decode(out, 32, &d), 0);
    assert_false(d.has_ext);
    out[7] = 48;
    /* other major versions, other MIDs, truncation */
    out[16] = 0x11;
    assert_int_equal(rs_sdp_hello_decode(out, 48, &d), -EPROTO);
    out[16] = 0x22;
    out[0] = 0x01;
    assert_int_equal(rs_sdp_hello_decode(out, 48, &d), -EPROTO);
    out[0] = 0x00;
    assert_int_equal(rs_sdp_hello_decode(out, 20, &d), -EBADMSG);
    assert_int_equal(rs_sdp_hello_encode(&h, out, 40), 0);
}

static void test_hello_ack(void **state)
{
    (void)state;
    struct rs_sdp_hello h = {
        .bsdh = { .bufs = 300 }, .version = RS_SDP_VERSION, .ip_version = 6, .max_adverts = 1, .rcv_size = 4112,
        .has_ext = true, .ext_flags = RS_SDP_EXT_ZCOPY, .ka_rkey = 9, .ka_addr = 10,
    };
    uint8_t out[196];
    size_t n = rs_sdp_hello_ack_encode(&h, out, sizeof(out));
    assert_int_equal(n, RS_SDP_HELLO_ACK_LEN);
    assert_int_equal(out[0], RS_SDP_MID_HELLO_ACK);
    assert_int_equal(out[2], 0x01);
    assert_int_equal(out[3], 0x2c);     /* bufs 300 */
    assert_int_equal(out[16], 0x22);
    assert_int_equal(out[17], 0x60);
    const uint8_t actrcvsz[4] = { 0x00, 0x00, 0x10, 0x10 };
    assert_memory_equal(out + 20, actrcvsz, 4);
    struct rs_sdp_hello d;
    assert_int_equal(rs_sdp_hello_ack_decode(out, n, &d), 0);
    assert_int_equal(d.bsdh.bufs, 300);
    assert_int_equal(d.rcv_size, 4112);
    assert_int_equal(d.ka_rkey, 9);
    /* a Hello is not a HelloAck */
    assert_int_equal(rs_sdp_hello_decode(out, n, &d), -EPROTO);
}

static void test_seq_diff_wraps(void **state)
{
    (void)state;
    assert_true(rs_sdp_seq_diff(5, 3) == 2);
    assert_true(rs_sdp_seq_diff(3, 5) == -2);
    assert_true(rs_sdp_seq_diff(1, 0xffffffffu) == 2);
    assert_true(rs_sdp_seq_diff(0xffffffffu, 1) == -2);
}

/* ---- the receive side on a socket without a QP ---- */

#define RX_NBUFS 4u
#define RX_RBUF (4096u + RS_SDP_BSDH_LEN)

static struct rs_sdp_sock *rx_socket(void)
{
    struct rs_sdp_sock *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    s->notify_fd = -1;
    s->state = SDP_ST_CONNECTED;
    s->rbuf_size = RX_RBUF;
    s->nbufs = RX_NBUFS;
    s->rbuf_mem = calloc(RX_NBUFS, RX_RBUF);
    s->rxq_cap = RX_NBUFS + 4;
    s->rxq = calloc(s->rxq_cap, sizeof(*s->rxq));
    assert_non_null(s->rbuf_mem);
    assert_non_null(s->rxq);
    s->peer_zcopy = true;
    s->tx_mseq_next = 1;
    s->peer_bufs = RX_NBUFS - 1;
    return s;
}

static void rx_socket_free(struct rs_sdp_sock *s)
{
    free(s->rbuf_mem);
    free(s->rxq);
    free(s);
}

/* The RNIC placed n bytes of msg in receive buffer idx. */
static void rx_deliver(struct rs_sdp_sock *s, uint32_t idx, const uint8_t *msg, uint32_t n)
{
    memcpy(s->rbuf_mem + (size_t)idx * s->rbuf_size, msg, n);
    struct rs_rnic_wc wc = { .wr_id = idx, .status = RS_WC_SUCCESS, .opcode = RS_WC_RECV, .byte_len = n };
    rs_sdp_on_recv(s, &wc);
}

/* The next message of the peer's stream: BSDH (and extended header, payload) in out; returns its length. */
static uint32_t rx_msg(struct rs_sdp_sock *s, uint8_t mid, uint32_t avail_len, const char *payload, uint8_t *out)
{
    uint32_t plen = payload ? (uint32_t)strlen(payload) : 0;
    struct rs_sdp_bsdh h = { .mid = mid, .bufs = 3, .len = rs_sdp_hdr_len(mid) + plen, .mseq = s->rx_mseq_last + 1,
                             .mseq_ack = 0 };
    if (mid == RS_SDP_MID_SRC_AVAIL) {
        struct rs_sdp_avail a = { .len = avail_len, .rkey = 0x42, .vaddr = 0x10000 };
        rs_sdp_avail_encode(&h, &a, out);
    } else {
        rs_sdp_bsdh_encode(&h, out);
    }
    if (plen)
        memcpy(out + rs_sdp_hdr_len(mid), payload, plen);
    return h.len;
}

static void test_rx_data_behind_srcavail_refused(void **state)
{
    (void)state;
    uint8_t m[64];
    /* What a correct source does: SrcAvail, then (after the receiver's SendSm) the bytes as Data. */
    struct rs_sdp_sock *s = rx_socket();
    rx_deliver(s, 0, m, rx_msg(s, RS_SDP_MID_SRC_AVAIL, 65536, NULL, m));
    assert_true(s->psrc.active);
    assert_int_equal(s->rxq_count, 1);
    rx_deliver(s, 1, m, rx_msg(s, RS_SDP_MID_SRC_CANCEL, 0, NULL, m));
    assert_false(s->psrc.active);
    assert_int_equal(s->rxq_count, 0);
    rx_deliver(s, 2, m, rx_msg(s, RS_SDP_MID_DATA, 0, "by copy", m));
    assert_int_equal(s->state, SDP_ST_CONNECTED);
    assert_int_equal(s->rxq_count, 1);
    assert_int_equal(s->rx_bytes_queued, 7);
    rx_socket_free(s);

    /* A source that sends Data while its SrcAvail is pending breaks the stream: queued behind the SrcAvail, the
     * data would leave it stuck mid-stream and recv() blocked for ever. The connection is reset with EPROTO. */
    s = rx_socket();
    rx_deliver(s, 0, m, rx_msg(s, RS_SDP_MID_SRC_AVAIL, 65536, NULL, m));
    rx_deliver(s, 1, m, rx_msg(s, RS_SDP_MID_DATA, 0, "too early", m));
    assert_int_equal(s->state, SDP_ST_CLOSED);
    assert_int_equal(s->so_error, EPROTO);
    assert_int_equal(s->rxq_count, 0);
    assert_int_equal(s->rx_bytes_queued, 0);
    rx_socket_free(s);
}

static void test_rx_empty_message_refused(void **state)
{
    (void)state;
    char path[] = "/tmp/test_sdp_wire_log.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char spec[64];
    snprintf(spec, sizeof(spec), "warn,file:%s", path);
    assert_int_equal(rs_log_configure(spec, NULL, 0), 0);

    uint8_t m[64];
    struct rs_sdp_sock *s = rx_socket();
    rx_deliver(s, 0, m, rx_msg(s, RS_SDP_MID_DATA, 0, "abc", m));
    assert_int_equal(s->rxq_count, 1);
    /* A zero-length SEND into buffer 1 after buffer 1 held a Data message: byte 0 is stale, not a MID. */
    memcpy(s->rbuf_mem + RX_RBUF, m, 16);
    rx_deliver(s, 1, m, 0);
    assert_int_equal(s->state, SDP_ST_CLOSED);
    assert_int_equal(s->so_error, EPROTO);
    rx_socket_free(s);

    assert_int_equal(rs_log_configure(NULL, NULL, 0), 0);
    char text[1024] = "";
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    text[got] = 0;
    fclose(f);
    unlink(path);
    assert_non_null(strstr(text, "empty message"));
    assert_null(strstr(text, "mid 255"));
}

/* Compact Data: the BSDH of a small Data message in 32 bits of immediate data, rebuilt exactly. */
static void test_imm_roundtrip(void **state)
{
    (void)state;
    uint32_t imm = 0;
    struct rs_sdp_bsdh h = { .mid = RS_SDP_MID_DATA, .bufs = 4095, .len = 16 + 64, .mseq = 7, .mseq_ack = 0x12345678 };
    assert_true(rs_sdp_imm_encode(&h, &imm));
    assert_int_equal(imm, 4095u << 20 | 0x45678u);
    /* The receiver's last sent mseq is at or after the acknowledgement, within 2^20 - 1. */
    uint32_t last_sent[] = { 0x12345678, 0x12345679, 0x12345678 + 0xfffff, 0x12345678 + 1000 };
    for (size_t i = 0; i < sizeof(last_sent) / sizeof(last_sent[0]); i++) {
        struct rs_sdp_bsdh d;
        rs_sdp_imm_decode(imm, 64, 7, last_sent[i], &d);
        assert_int_equal(d.mid, RS_SDP_MID_DATA);
        assert_int_equal(d.flags, 0);
        assert_int_equal(d.bufs, 4095);
        assert_int_equal(d.len, 80);
        assert_int_equal(d.mseq, 7);
        assert_int_equal(d.mseq_ack, 0x12345678u);
    }
    /* Across the 32-bit wrap, and acknowledging nothing yet (0). */
    h.mseq_ack = 0xfffffff0u;
    h.bufs = 0;
    assert_true(rs_sdp_imm_encode(&h, &imm));
    struct rs_sdp_bsdh d;
    rs_sdp_imm_decode(imm, 1, 1, 5, &d);
    assert_int_equal(d.mseq_ack, 0xfffffff0u);
    assert_int_equal(d.len, 17);
    h.mseq_ack = 0;
    assert_true(rs_sdp_imm_encode(&h, &imm));
    rs_sdp_imm_decode(imm, 1, 1, 0, &d);
    assert_int_equal(d.mseq_ack, 0);
    /* What cannot be compact: more than 4095 buffers, flags, no payload, any other MID. */
    h = (struct rs_sdp_bsdh){ .mid = RS_SDP_MID_DATA, .bufs = 4096, .len = 20 };
    assert_false(rs_sdp_imm_encode(&h, &imm));
    h.bufs = 1;
    h.flags = RS_SDP_FLAG_OOB_PRES;
    assert_false(rs_sdp_imm_encode(&h, &imm));
    h.flags = 0;
    h.len = 16;
    assert_false(rs_sdp_imm_encode(&h, &imm));
    h.len = 20;
    h.mid = RS_SDP_MID_SEND_SM;
    assert_false(rs_sdp_imm_encode(&h, &imm));
}

/* A compact Data message as the RNIC completes it: payload at offset 0, the BSDH in the immediate. */
static void rx_deliver_compact(struct rs_sdp_sock *s, uint32_t idx, const char *payload, uint16_t bufs)
{
    uint32_t n = (uint32_t)strlen(payload);
    memcpy(s->rbuf_mem + (size_t)idx * s->rbuf_size, payload, n);
    struct rs_sdp_bsdh h = { .mid = RS_SDP_MID_DATA, .bufs = bufs, .len = 16 + n, .mseq = s->rx_mseq_last + 1 };
    struct rs_rnic_wc wc = { .wr_id = idx, .status = RS_WC_SUCCESS, .opcode = RS_WC_RECV, .byte_len = n,
                             .flags = RS_WC_WITH_IMM };
    assert_true(n == 0 || rs_sdp_imm_encode(&h, &wc.imm_data));
    rs_sdp_on_recv(s, &wc);
}

static void test_rx_compact_data(void **state)
{
    (void)state;
    uint8_t m[64];
    struct rs_sdp_sock *s = rx_socket();
    s->imm_rx = true;
    rx_deliver(s, 0, m, rx_msg(s, RS_SDP_MID_DATA, 0, "full ", m));
    rx_deliver_compact(s, 1, "compact", 2);
    assert_int_equal(s->state, SDP_ST_CONNECTED);
    assert_int_equal(s->rx_mseq_last, 2);
    assert_int_equal(s->peer_bufs, 2);
    assert_int_equal(s->rxq_count, 2);
    assert_int_equal(s->rx_bytes_queued, 12);
    assert_int_equal(s->rxq[1].off, 0);
    assert_memory_equal(s->rbuf_mem + (size_t)s->rxq[1].buf * s->rbuf_size + s->rxq[1].off, "compact", 7);
    assert_int_equal(s->stats.compact_received, 1);
    rx_socket_free(s);

    /* Not announced (the QP takes no immediate as data): a protocol error, nothing queued. */
    s = rx_socket();
    rx_deliver_compact(s, 0, "unasked", 1);
    assert_int_equal(s->state, SDP_ST_CLOSED);
    assert_int_equal(s->so_error, EPROTO);
    assert_int_equal(s->rxq_count, 0);
    rx_socket_free(s);

    /* Compact Data has a payload by definition. */
    s = rx_socket();
    s->imm_rx = true;
    rx_deliver_compact(s, 0, "", 1);
    assert_int_equal(s->state, SDP_ST_CLOSED);
    assert_int_equal(s->so_error, EPROTO);
    rx_socket_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bsdh_bytes),
        cmocka_unit_test(test_avail_and_compl_bytes),
        cmocka_unit_test(test_suspend_bytes),
        cmocka_unit_test(test_msg_check_rejects),
        cmocka_unit_test(test_hello_fits_rdma_cm),
        cmocka_unit_test(test_hello_ack),
        cmocka_unit_test(test_seq_diff_wraps),
        cmocka_unit_test(test_rx_data_behind_srcavail_refused),
        cmocka_unit_test(test_rx_empty_message_refused),
        cmocka_unit_test(test_imm_roundtrip),
        cmocka_unit_test(test_rx_compact_data),
    };
    return cmocka_run_group_tests_name("sdp_wire", tests, NULL, NULL);
}
