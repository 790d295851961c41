/*
 * Fuzz target: SDP's receive side, everything a peer can make us parse.
 *
 *  1. The connection private data: the whole input goes to rs_sdp_hello_decode and rs_sdp_hello_ack_decode. An
 *     accepted Hello/HelloAck must survive encode + decode unchanged (the decoders read only fields that exist).
 *  2. Messages on the QP: the input (after a header, below) is cut into messages, each written into a receive
 *     buffer of a connected-looking socket and handed to rs_sdp_on_recv, the function the progress step calls for
 *     a receive completion: rs_sdp_msg_check (BSDH and extended headers), the sequence and acknowledgement checks,
 *     credits, the receive queue, and the zero-copy state machine (SrcAvail, SinkAvail, the completions, the
 *     cancels, the race rules). The socket has no QP: anything it would send is refused for lack of a send queue
 *     (it owes the answer instead), and a reset only changes state, which is what the receive side decides.
 *     rs_sdp_msg_check is also compared with an independent reading of the rules in docs/sdp.md ("Wire format").
 *
 * The bytes of each receive buffer beyond what the "RNIC" delivered are poisoned for AddressSanitizer, so a parser
 * that reads past the received length crashes at once, as does one that reads past the ring.
 *
 * After every message the receive queue must stay consistent: its byte count equals the sum of its entries, every
 * Data entry lies inside the message that brought it, at most one SrcAvail is queued and only as the last entry
 * while an advertisement is pending, and a reset leaves nothing queued.
 *
 * Input: byte 0 chooses the starting state (bits: 0 large buffers, 1 our SinkAvail is out, 2 our SrcAvail is out,
 * 3 we sent DisConn, 4 the peer sent DisConn, 5 our sink is being cancelled, 6 our SrcAvail is being cancelled,
 * 7 a SinkAvail of the peer's is accepted); bytes 1-4 the peer's last mseq, 5-8 our next mseq, byte 9: bits 0-3
 * how many of our messages the peer has not acknowledged, 4 our last control message went on overdraft, 5 a partial
 * message waits for Nagle, 6 a SinkCancelAck is still due for a sink we gave up on. Then messages: a control byte,
 * a 16-bit big-endian length, the bytes. The control byte lets the fuzzer get past the sequence checks: bit 0 sets
 * mseq to the next one, bit 1 puts mseq_ack in the valid range, bit 2 sets len to the received length, bit 3 clears
 * the flags, bits 4-7 (when 1-14) pick the MID from a table of every MID the parser knows and a few it must refuse.
 * With bits 4-7 all set the entry is a local event instead of a message (its bytes are skipped): by bits 0-1, the
 * application reads the head of the queue; a READ of the pending SrcAvail starts; that READ completes; a receive
 * completes in error.
 */
#include <errno.h>
#include <sanitizer/asan_interface.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"
#include "sdp_stream/sdp_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define NBUFS 8u
#define SMALL_RBUF (4096u + RS_SDP_BSDH_LEN)
#define LARGE_RBUF (16384u + RS_SDP_BSDH_LEN)
#define SINK_LEN (256u * 1024u)
#define SRC_LEN (256u * 1024u)

static const uint8_t mid_table[14] = {
    RS_SDP_MID_DATA, RS_SDP_MID_DISCONN, RS_SDP_MID_ABORT, RS_SDP_MID_SEND_SM, RS_SDP_MID_RDMA_WR_COMPL,
    RS_SDP_MID_RDMA_RD_COMPL, RS_SDP_MID_SRC_CANCEL, RS_SDP_MID_SINK_CANCEL, RS_SDP_MID_SINK_CANCEL_ACK,
    RS_SDP_MID_SINK_AVAIL, RS_SDP_MID_SRC_AVAIL, RS_SDP_MID_MODE_CHANGE, RS_SDP_MID_SUSPEND, RS_SDP_MID_HELLO,
};

static struct {
    struct rs_sdp_sock s;
    uint8_t *ring;                  /* NBUFS * LARGE_RBUF bytes (malloc'd: ASan guards both ends) */
    struct sdp_rx_entry rxq[NBUFS + 4];
    uint32_t delivered[NBUFS];      /* bytes the "RNIC" placed in each buffer */
    bool queued[NBUFS];             /* the buffer is held by a Data entry of the receive queue */
} F;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* Protocol errors are the expected outcome of most inputs: their warnings would only slow the fuzzer.
     * FUZZ_SDP_RX_LOG=trace shows what each message did (to check a seed). */
    const char *spec = getenv("FUZZ_SDP_RX_LOG");
    rs_log_configure(spec ? spec : "off", NULL, 0);
    F.ring = malloc((size_t)NBUFS * LARGE_RBUF);
    if (!F.ring)
        abort();
    return 0;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* ---- 1. private data ---- */

static void check_hello_roundtrip(const struct rs_sdp_hello *h, bool ack)
{
    uint8_t wire[RS_SDP_HELLO_LEN];
    struct rs_sdp_hello again;
    size_t n = ack ? rs_sdp_hello_ack_encode(h, wire, sizeof(wire)) : rs_sdp_hello_encode(h, wire, sizeof(wire));
    if (n != (ack ? RS_SDP_HELLO_ACK_LEN : RS_SDP_HELLO_LEN))
        abort();
    /* The re-encoded message always carries the extension; compare the fields both forms have. */
    int r = ack ? rs_sdp_hello_ack_decode(wire, n, &again) : rs_sdp_hello_decode(wire, n, &again);
    if (r != 0 || again.version != h->version || again.ip_version != h->ip_version || again.caps != h->caps ||
        again.max_adverts != h->max_adverts || again.rcv_size != h->rcv_size || again.bsdh.bufs != h->bsdh.bufs)
        abort();
    if (!ack && (again.desired_remote_rcv_size != h->desired_remote_rcv_size || again.port != h->port))
        abort();
    if (h->has_ext && (again.ext_flags != h->ext_flags || again.ka_rkey != h->ka_rkey ||
                       again.ka_addr != h->ka_addr))
        abort();
}

static void fuzz_private_data(const uint8_t *data, size_t size)
{
    /* A copy of exactly size bytes, so ASan sees a read past the private data the CM delivered. */
    uint8_t *pd = malloc(size ? size : 1);
    if (!pd)
        abort();
    memcpy(pd, data, size);
    struct rs_sdp_hello h;
    int r = rs_sdp_hello_decode(pd, size, &h);
    if (r != 0 && r != -EPROTO && r != -EBADMSG)
        abort();
    if (r == 0) {
        if (size < RS_SDP_BSDH_LEN + RS_SDP_HH_LEN || pd[0] != RS_SDP_MID_HELLO || (pd[16] >> 4) != 2 ||
            h.bsdh.len > size)
            abort();    /* accepted something too short, of another MID or of another major version */
        if (h.has_ext && h.bsdh.len < RS_SDP_HELLO_LEN)
            abort();    /* the extension was read beyond the message's own length */
        check_hello_roundtrip(&h, false);
    }
    r = rs_sdp_hello_ack_decode(pd, size, &h);
    if (r != 0 && r != -EPROTO && r != -EBADMSG)
        abort();
    if (r == 0) {
        if (size < RS_SDP_BSDH_LEN + RS_SDP_HAH_LEN || pd[0] != RS_SDP_MID_HELLO_ACK || (pd[16] >> 4) != 2 ||
            h.bsdh.len > size)
            abort();
        if (h.has_ext && h.bsdh.len < RS_SDP_HELLO_ACK_LEN)
            abort();
        check_hello_roundtrip(&h, true);
    }
    /* The hand-back's TCP header, with the token it carries (a wrong one is refused: checked below). */
    uint64_t residue = 0;
    uint64_t token = size >= 16 ? be64(pd + 8) : 0;
    r = rs_sdp_hb_hdr_decode(pd, size, token, &residue);
    if (r != 0 && r != -EPROTO && r != -EBADMSG)
        abort();
    if (r == 0) {
        uint8_t again[RS_SDP_HB_HDR_LEN];
        rs_sdp_hb_hdr_encode(again, token, residue);
        if (size < RS_SDP_HB_HDR_LEN || memcmp(again, pd, 5) != 0 || memcmp(again + 8, pd + 8, 16) != 0 ||
            residue > RS_SDP_HB_MAX_RESIDUE || rs_sdp_hb_hdr_decode(pd, size, token ^ 1, &residue) != -EPROTO)
            abort();
    }
    free(pd);
}

/* ---- 2. messages on the QP ---- */

/* docs/sdp.md, "Wire format", read independently of sdp_wire.c: may this message be accepted? */
static bool reference_valid(const uint8_t *m, uint32_t n)
{
    if (n < RS_SDP_BSDH_LEN || be32(m + 4) != n || (m[1] & (RS_SDP_FLAG_OOB_PRES | RS_SDP_FLAG_OOB_PEND)))
        return false;
    switch (m[0]) {
    case RS_SDP_MID_DATA:
        return true;
    case RS_SDP_MID_DISCONN:
    case RS_SDP_MID_ABORT:
    case RS_SDP_MID_SEND_SM:
    case RS_SDP_MID_SRC_CANCEL:
    case RS_SDP_MID_SINK_CANCEL:
    case RS_SDP_MID_SINK_CANCEL_ACK:
        return n == 16;
    case RS_SDP_MID_RDMA_WR_COMPL:
    case RS_SDP_MID_RDMA_RD_COMPL:
        return n == 20;
    case RS_SDP_MID_SRC_AVAIL:
        return n == 32 && be32(m + 16) != 0;
    case RS_SDP_MID_SINK_AVAIL:
        return n == 36 && be32(m + 16) != 0;
    case RS_SDP_MID_SUSPEND:
        return n == 24;     /* the SCH; whether the peer may send it is the receiver's check */
    case RS_SDP_MID_SUSPEND_ACK:
        return n == 16;
    default:
        return false;   /* Hello/HelloAck on the QP, the mode-change and resize families, unknown */
    }
}

static void check_msg_check(const uint8_t *m, uint32_t n)
{
    struct rs_sdp_bsdh h;
    struct rs_sdp_avail a = { 0 };
    uint32_t compl_len = 0xdeadbeef;
    int r = rs_sdp_msg_check(m, n, &h, &a, &compl_len);
    if ((r == 0) != reference_valid(m, n))
        abort();
    if (r != 0) {
        if (r != -EPROTO && r != -EBADMSG)
            abort();
        return;
    }
    if (h.mid != m[0] || h.len != n || h.mseq != be32(m + 8) || h.mseq_ack != be32(m + 12))
        abort();
    if ((h.mid == RS_SDP_MID_SRC_AVAIL || h.mid == RS_SDP_MID_SINK_AVAIL) &&
        (a.len != be32(m + 16) || a.rkey != be32(m + 20)))
        abort();
    if ((h.mid == RS_SDP_MID_RDMA_WR_COMPL || h.mid == RS_SDP_MID_RDMA_RD_COMPL) && compl_len != be32(m + 16))
        abort();
}

static void socket_reset(uint8_t setup, const uint8_t *seq)
{
    struct rs_sdp_sock *s = &F.s;
    memset(s, 0, sizeof(*s));
    memset(F.rxq, 0, sizeof(F.rxq));
    memset(F.delivered, 0, sizeof(F.delivered));
    memset(F.queued, 0, sizeof(F.queued));
    s->notify_fd = -1;
    s->state = SDP_ST_CONNECTED;
    s->rcvlowat = 1;
    s->zcopy_opt = -1;
    s->peer_zcopy = true;
    s->rbuf_size = (setup & 1) ? LARGE_RBUF : SMALL_RBUF;
    s->nbufs = NBUFS;
    s->rbuf_mem = F.ring;
    s->rxq = F.rxq;
    s->rxq_cap = NBUFS + 4;
    s->peer_rbuf_size = s->rbuf_size;
    s->rx_mseq_last = be32(seq);
    s->tx_mseq_next = be32(seq + 4);
    s->peer_ack = s->tx_mseq_next - 1 - (seq[8] & 15);
    s->peer_bufs = NBUFS - 1;
    s->last_data_mseq = s->peer_ack;
    s->rx_posted = NBUFS;
    if (seq[8] & 0x10) {
        s->overdraft_out = true;
        s->overdraft_mseq = s->tx_mseq_next - 1;
    }
    if (seq[8] & 0x20) {
        s->nagle_wait = true;
        s->nagle_mseq = s->tx_mseq_next - 1;
        s->hold_since_ms = 1;
    }
    if (seq[8] & 0x40)
        s->late_cancel_acks = 1;
    if (setup & 2) {        /* our SinkAvail is out: the last message we sent */
        s->sink.active = true;
        s->sink.mseq = s->tx_mseq_next - 1;
        s->sink.len = SINK_LEN;
        s->sink.cancel_sent = (setup & 0x20) != 0;
        s->last_data_mseq = s->sink.mseq;
    }
    if (setup & 4) {        /* our SrcAvail is out */
        s->zsrc.active = true;
        s->zsrc.mseq = s->tx_mseq_next - 1;
        s->zsrc.len = SRC_LEN;
        s->zsrc.cancel_sent = (setup & 0x40) != 0;
        s->last_data_mseq = s->zsrc.mseq;
    }
    if (setup & 8) {
        s->disconn_sent = true;
        s->wr_shut = true;
    }
    if (setup & 0x10) {
        s->disconn_rcvd = true;
        s->rx_eof = true;
    }
    if ((setup & 0x80) && !(setup & 4)) {
        s->psink.active = true;
        s->psink.len = SINK_LEN;
    }
}

/* The application reads the Data entry at the head of the queue (as recv() does once it has copied it out). */
static int read_head(void)
{
    struct rs_sdp_sock *s = &F.s;
    if (s->rxq_count == 0)
        return -1;
    struct sdp_rx_entry *e = &s->rxq[s->rxq_head];
    if (e->kind != SDP_RX_DATA)
        return -1;      /* a SrcAvail: reading it takes an RDMA READ */
    s->rx_bytes_queued -= e->len;
    s->rxq_head = (s->rxq_head + 1) % s->rxq_cap;
    s->rxq_count--;
    F.queued[e->buf] = false;
    return (int)e->buf;
}

/* A free receive buffer, as the RNIC would pick one; if every buffer holds unread data, the "application" reads
 * the head of the queue first. Returns -1 when that is not possible. */
static int take_buffer(void)
{
    for (uint32_t i = 0; i < NBUFS; i++) {
        if (!F.queued[i])
            return (int)i;
    }
    if (F.s.rxq_count == 0)
        abort();        /* every buffer held, nothing queued: a buffer leaked */
    return read_head();
}

static void check_queue(void);

static void local_event(uint8_t what)
{
    struct rs_sdp_sock *s = &F.s;
    switch (what & 3) {
    case 0:
        read_head();
        break;
    case 1:             /* recv() reached the SrcAvail and posted a READ into the application's buffer */
        if (s->psrc.active && !s->broken && !s->psrc.send_sm_sent) {
            s->psrc.read_out = true;
            s->psrc.read_uncounted = true;
        }
        break;
    case 2: {           /* the READ completed; its reader counts it later (not simulated) */
        if (!s->psrc.read_out)
            break;
        struct rs_rnic_wc wc = { .wr_id = SDP_WR_SEND, .status = RS_WC_SUCCESS, .opcode = RS_WC_RDMA_READ };
        rs_sdp_z_on_read_complete(s, &wc);
        s->psrc.read_uncounted = false;
        break;
    }
    case 3: {           /* a receive completes in error (the peer's QP broke, or ours was flushed) */
        int idx = take_buffer();
        if (idx < 0)
            break;
        struct rs_rnic_wc wc = { .wr_id = (uint64_t)idx, .opcode = RS_WC_RECV,
                                 .status = (what & 4) ? RS_WC_WR_FLUSH_ERR : RS_WC_REM_INV_REQ_ERR };
        rs_sdp_on_recv(s, &wc);
        break;
    }
    }
    check_queue();
}

static void check_queue(void)
{
    struct rs_sdp_sock *s = &F.s;
    if (s->rxq_count > s->rxq_cap || s->rxq_head >= s->rxq_cap)
        abort();
    if (s->state == SDP_ST_CLOSED && (!s->broken || s->rxq_count != 0 || s->rx_bytes_queued != 0))
        abort();        /* a reset discards what was received */
    uint64_t bytes = 0;
    bool held[NBUFS] = { false };
    uint32_t srcs = 0;
    for (uint32_t k = 0; k < s->rxq_count; k++) {
        const struct sdp_rx_entry *e = &s->rxq[(s->rxq_head + k) % s->rxq_cap];
        bytes += e->len;
        if (e->kind == SDP_RX_DATA) {
            if (e->buf >= NBUFS || held[e->buf] || e->len == 0 || e->off != RS_SDP_BSDH_LEN ||
                (uint64_t)e->off + e->len != F.delivered[e->buf])
                abort();
            held[e->buf] = true;
        } else if (e->kind == SDP_RX_SRC) {
            srcs++;
            if (!s->psrc.active || e->len != s->psrc.len - s->psrc.consumed)
                abort();
        } else {
            abort();
        }
    }
    if (bytes != s->rx_bytes_queued || srcs > 1)
        abort();
    if (srcs == 1 && s->rxq[(s->rxq_head + s->rxq_count - 1) % s->rxq_cap].kind != SDP_RX_SRC)
        abort();        /* nothing may follow a pending SrcAvail in the stream */
    if (s->psrc.active && srcs == 0 && !s->broken)
        abort();        /* a SrcAvail pending that recv() can never reach */
    for (uint32_t i = 0; i < NBUFS; i++)
        F.queued[i] = held[i];
}

static void deliver(const uint8_t *msg, uint32_t n)
{
    struct rs_sdp_sock *s = &F.s;
    int idx = take_buffer();
    if (idx < 0)
        return;
    uint8_t *buf = s->rbuf_mem + (size_t)idx * s->rbuf_size;
    ASAN_UNPOISON_MEMORY_REGION(buf, s->rbuf_size);
    memcpy(buf, msg, n);
    ASAN_POISON_MEMORY_REGION(buf + n, s->rbuf_size - n);
    F.delivered[idx] = n;
    F.queued[idx] = true;       /* until check_queue finds whether a Data entry holds it */
    uint32_t mseq_before = s->rx_mseq_last;
    bool was_broken = s->broken;
    struct rs_rnic_wc wc = { .wr_id = (uint64_t)idx, .status = RS_WC_SUCCESS, .opcode = RS_WC_RECV, .byte_len = n };
    rs_sdp_on_recv(s, &wc);
    ASAN_UNPOISON_MEMORY_REGION(buf, s->rbuf_size);
    if (was_broken && s->rx_mseq_last != mseq_before)
        abort();        /* a reset connection processed a message */
    if (!s->broken && reference_valid(msg, n) && be32(msg + 8) != mseq_before + 1)
        abort();        /* accepted a message out of sequence */
    check_queue();
}

static void fuzz_messages(const uint8_t *data, size_t size)
{
    if (size < 10)
        return;
    socket_reset(data[0], data + 1);
    data += 10;
    size -= 10;
    uint8_t msg[LARGE_RBUF];
    while (size >= 3) {
        uint8_t ctl = data[0];
        uint32_t n = (uint32_t)data[1] << 8 | data[2];
        data += 3;
        size -= 3;
        if (n > F.s.rbuf_size)
            n = F.s.rbuf_size;
        if (n > size)
            n = (uint32_t)size;
        memcpy(msg, data, n);
        data += n;
        size -= n;
        if ((ctl >> 4) == 15) {
            local_event(ctl);
            continue;
        }
        if (n >= RS_SDP_BSDH_LEN) {
            if (ctl >> 4)
                msg[0] = mid_table[(ctl >> 4) - 1];
            if (ctl & 1)
                put_be32(msg + 8, F.s.rx_mseq_last + 1);
            if (ctl & 2) {
                uint32_t span = F.s.tx_mseq_next - F.s.peer_ack;     /* acks peer_ack .. tx_mseq_next - 1 */
                put_be32(msg + 12, F.s.peer_ack + (span ? be32(msg + 12) % span : 0));
            }
            if (ctl & 4)
                put_be32(msg + 4, n);
            if (ctl & 8)
                msg[1] = 0;
        }
        check_msg_check(msg, n);
        deliver(msg, n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_private_data(data, size);
    fuzz_messages(data, size);
    return 0;
}
