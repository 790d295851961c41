/*
 * MPA Request/Reply negotiation, FPDU framing and CRC, DDP/RDMAP header validation and Terminate messages
 * (src/rnic/soft/mpa.h). The reference FPDUs below were sent over a real TCP connection on lo and decoded by
 * tshark 4.0.17, which reported "Good CRC32" for each; they pin the CRC byte order and the pad rules.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/crc32c.h"
#include "rnic/soft/mpa.h"

/* Send "hello", untagged QN 0 MSN 1 MO 0, L set. tshark: "CRC check: 0xb990b10c (Good CRC32)". */
static const uint8_t ref_send_fpdu[] = {
    0x00, 0x17, 0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00, 0xb9, 0x90, 0xb1, 0x0c,
};
/* RDMA Write "ABCDEFG" to STag 0x12345678 TO 0x1000, L set. tshark: "0xe0e08ae5 (Good CRC32)". */
static const uint8_t ref_write_fpdu[] = {
    0x00, 0x15, 0xc1, 0x40, 0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,
    0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x00, 0xe0, 0xe0, 0x8a, 0xe5,
};

/* ---- FPDU framing ---- */

static void test_fpdu_reference_crc(void **state)
{
    (void)state;
    const uint8_t *ulpdu;
    size_t ulpdu_len;
    assert_int_equal(rs_mpa_fpdu_check(ref_send_fpdu, sizeof(ref_send_fpdu), &ulpdu, &ulpdu_len),
                     (int)sizeof(ref_send_fpdu));
    assert_int_equal(ulpdu_len, 23);
    assert_ptr_equal(ulpdu, ref_send_fpdu + 2);
    assert_int_equal(rs_mpa_fpdu_check(ref_write_fpdu, sizeof(ref_write_fpdu), &ulpdu, &ulpdu_len),
                     (int)sizeof(ref_write_fpdu));
    assert_int_equal(ulpdu_len, 21);
    /* The CRC field holds the final CRC least significant byte first. */
    assert_int_equal(rs_crc32c(0, ref_send_fpdu, sizeof(ref_send_fpdu) - 4), 0x0cb190b9);
}

static void test_fpdu_build_matches_reference(void **state)
{
    (void)state;
    uint8_t ulpdu[64], out[128];
    size_t h = rs_ddp_untagged_hdr(ulpdu, RS_RDMAP_SEND, true, 0, RS_DDP_QN_SEND, 1, 0);
    memcpy(ulpdu + h, "hello", 5);
    int n = rs_mpa_fpdu_build(out, sizeof(out), ulpdu, h + 5);
    assert_int_equal(n, (int)sizeof(ref_send_fpdu));
    assert_memory_equal(out, ref_send_fpdu, sizeof(ref_send_fpdu));

    h = rs_ddp_tagged_hdr(ulpdu, RS_RDMAP_WRITE, true, 0x12345678, 0x1000);
    memcpy(ulpdu + h, "ABCDEFG", 7);
    n = rs_mpa_fpdu_build(out, sizeof(out), ulpdu, h + 7);
    assert_int_equal(n, (int)sizeof(ref_write_fpdu));
    assert_memory_equal(out, ref_write_fpdu, sizeof(ref_write_fpdu));

    /* Too small an output buffer, or a ULPDU over 16 bits of length, is refused. */
    assert_int_equal(rs_mpa_fpdu_build(out, sizeof(ref_send_fpdu) - 1, ulpdu, 23), -EMSGSIZE);
    static uint8_t big[70000];
    assert_int_equal(rs_mpa_fpdu_build(big, sizeof(big), big, 65536), -EMSGSIZE);
}

static void test_fpdu_corruption_detected(void **state)
{
    (void)state;
    const uint8_t *ulpdu;
    size_t ulpdu_len;
    uint8_t copy[sizeof(ref_write_fpdu)];
    /* Every single-bit flip anywhere in the FPDU (length field excluded: it changes the framing) is caught. */
    for (size_t byte = 2; byte < sizeof(copy); byte++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(copy, ref_write_fpdu, sizeof(copy));
            copy[byte] ^= (uint8_t)(1u << bit);
            assert_int_equal(rs_mpa_fpdu_check(copy, sizeof(copy), &ulpdu, &ulpdu_len), -EBADMSG);
        }
    }
    /* A big-endian CRC (the classic mistake) is refused. */
    memcpy(copy, ref_write_fpdu, sizeof(copy));
    uint32_t crc = rs_crc32c(0, copy, sizeof(copy) - 4);
    rs_put_be32(copy + sizeof(copy) - 4, crc);
    assert_int_equal(rs_mpa_fpdu_check(copy, sizeof(copy), &ulpdu, &ulpdu_len), -EBADMSG);
    /* Short input waits for more. */
    assert_int_equal(rs_mpa_fpdu_check(ref_write_fpdu, 1, &ulpdu, &ulpdu_len), -EAGAIN);
    assert_int_equal(rs_mpa_fpdu_check(ref_write_fpdu, sizeof(ref_write_fpdu) - 1, &ulpdu, &ulpdu_len), -EAGAIN);
}

static void test_fpdu_pad_and_trailer(void **state)
{
    (void)state;
    /* (2 + L + pad) % 4 == 0 for every length. */
    for (size_t len = 0; len < 64; len++) {
        unsigned pad = rs_mpa_pad(len);
        assert_true(pad <= 3);
        assert_int_equal((2 + len + pad) % 4, 0);
        assert_int_equal(rs_mpa_fpdu_len(len), 2 + len + pad + 4);
    }
    /* The trailer over an iovec split anywhere equals the contiguous build. */
    uint8_t ulpdu[300], whole[400];
    for (size_t i = 0; i < sizeof(ulpdu); i++)
        ulpdu[i] = (uint8_t)(i * 7 + 3);
    for (size_t len = 14; len < 40; len++) {
        int n = rs_mpa_fpdu_build(whole, sizeof(whole), ulpdu, len);
        assert_int_equal(n, (int)rs_mpa_fpdu_len(len));
        uint8_t lenf[2], trailer[RS_MPA_TRAILER_MAX];
        rs_put_be16(lenf, (uint16_t)len);
        for (size_t cut = 0; cut <= len; cut += 5) {
            struct iovec iov[3] = {
                { lenf, 2 }, { ulpdu, cut }, { ulpdu + cut, len - cut },
            };
            uint32_t crc = rs_mpa_crc_iov(0, iov, 3);
            size_t t = rs_mpa_fpdu_trailer(trailer, len, crc);
            assert_int_equal(t, rs_mpa_pad(len) + 4);
            assert_memory_equal(trailer, whole + 2 + len, t);
        }
    }
}

/* ---- Request / Reply ---- */

static void test_reqrep_v2_bytes(void **state)
{
    (void)state;
    struct rs_mpa_frame f = {
        .rev = 2, .crc = true, .enhanced = true, .p2p = true, .rtr = RS_MPA_RTR_WRITE | RS_MPA_RTR_ZERO_SEND,
        .ird = 0x1234, .ord = 0x0005, .pd = (const uint8_t *)"xyz", .pd_len = 3,
    };
    uint8_t out[64];
    int n = rs_mpa_frame_encode(&f, out, sizeof(out));
    assert_int_equal(n, 20 + 4 + 3);
    assert_memory_equal(out, "MPA ID Req Frame", 16);
    assert_int_equal(out[16], 0x50);        /* C | Enhanced */
    assert_int_equal(out[17], 2);
    assert_int_equal(rs_get_be16(out + 18), 7);
    assert_int_equal(rs_get_be16(out + 20), 0x8000 | 0x4000 | 0x1234);
    assert_int_equal(rs_get_be16(out + 22), 0x8000 | 0x0005);
    assert_memory_equal(out + 24, "xyz", 3);

    struct rs_mpa_frame g;
    assert_int_equal(rs_mpa_frame_length(out, (size_t)n, false), n);
    assert_int_equal(rs_mpa_frame_parse(out, (size_t)n, false, &g), 0);
    assert_true(g.enhanced && g.crc && g.p2p && !g.markers && !g.reject);
    assert_int_equal(g.rtr, RS_MPA_RTR_WRITE | RS_MPA_RTR_ZERO_SEND);
    assert_int_equal(g.ird, 0x1234);
    assert_int_equal(g.ord, 5);
    assert_int_equal(g.pd_len, 3);
    assert_memory_equal(g.pd, "xyz", 3);

    /* IRD/ORD wider than 14 bits, enhanced rev 1, and unknown revisions cannot be encoded. */
    f.ird = 0x4000;
    assert_int_equal(rs_mpa_frame_encode(&f, out, sizeof(out)), -EINVAL);
    f.ird = 1;
    f.rev = 1;
    assert_int_equal(rs_mpa_frame_encode(&f, out, sizeof(out)), -EINVAL);
    f.rev = 3;
    assert_int_equal(rs_mpa_frame_encode(&f, out, sizeof(out)), -EINVAL);
}

static void test_reqrep_private_data_limits(void **state)
{
    (void)state;
    static uint8_t pd[600], out[700];
    for (size_t i = 0; i < sizeof(pd); i++)
        pd[i] = (uint8_t)(i ^ 0x5a);
    struct rs_mpa_local v1 = { .rev = 1, .ird = 4, .ord = 4 }, v2 = { .rev = 2, .ird = 4, .ord = 4 };
    const uint16_t sizes[] = { 0, 1, 255, 256, 508, 512 };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        for (int rev = 1; rev <= 2; rev++) {
            struct rs_mpa_frame req, got;
            rs_mpa_request_init(&req, rev == 1 ? &v1 : &v2, pd, sizes[i]);
            int n = rs_mpa_frame_encode(&req, out, sizeof(out));
            if (rev == 2 && sizes[i] > RS_MPA_MAX_ULP_PRIVATE_DATA) {
                assert_int_equal(n, -EMSGSIZE);
                continue;
            }
            assert_int_equal(n, 20 + (rev == 2 ? 4 : 0) + sizes[i]);
            assert_int_equal(rs_mpa_frame_parse(out, (size_t)n, false, &got), 0);
            assert_int_equal(got.pd_len, sizes[i]);
            if (sizes[i])
                assert_memory_equal(got.pd, pd, sizes[i]);
        }
    }
    struct rs_mpa_frame req;
    rs_mpa_request_init(&req, &v1, pd, 513);
    assert_int_equal(rs_mpa_frame_encode(&req, out, sizeof(out)), -EMSGSIZE);
    /* A frame claiming more than 512 bytes of private data is refused from its header alone. */
    rs_mpa_request_init(&req, &v1, pd, 10);
    int n = rs_mpa_frame_encode(&req, out, sizeof(out));
    rs_put_be16(out + 18, 513);
    assert_int_equal(rs_mpa_frame_length(out, (size_t)n, false), -EMSGSIZE);
}

static void test_reqrep_header_scanning(void **state)
{
    (void)state;
    struct rs_mpa_local v2 = { .rev = 2, .ird = 4, .ord = 4 };
    struct rs_mpa_frame req;
    uint8_t out[64];
    rs_mpa_request_init(&req, &v2, "ab", 2);
    int n = rs_mpa_frame_encode(&req, out, sizeof(out));
    assert_int_equal(n, 26);
    for (size_t have = 0; have < 20; have++)
        assert_int_equal(rs_mpa_frame_length(out, have, false), -EAGAIN);
    assert_int_equal(rs_mpa_frame_length(out, 20, false), 26);
    /* The wrong key is refused as soon as the first differing byte arrives. */
    assert_int_equal(rs_mpa_frame_length(out, 20, true), -EPROTO);
    assert_int_equal(rs_mpa_frame_length((const uint8_t *)"GET / HTTP/1.1\r\n", 3, false), -EPROTO);
    assert_int_equal(rs_mpa_frame_length((const uint8_t *)"MPA ID Rep", 10, false), -EPROTO);
    /* A whole-frame parse needs exactly the frame. */
    struct rs_mpa_frame got;
    assert_int_equal(rs_mpa_frame_parse(out, 25, false, &got), -EPROTO);
    assert_int_equal(rs_mpa_frame_parse(out, 27, false, &got), -EPROTO);
    /* An enhanced frame too short for its IRD/ORD block. */
    rs_put_be16(out + 18, 2);
    assert_int_equal(rs_mpa_frame_parse(out, 22, false, &got), -EPROTO);
}

static void test_our_requests(void **state)
{
    (void)state;
    /* We never ask for markers, and ask for CRC when local.crc says so, in either revision. */
    for (int i = 0; i < 4; i++) {
        int rev = 1 + i % 2;
        bool crc = i < 2;
        struct rs_mpa_local local = { .rev = (uint8_t)rev, .crc = crc, .ird = 16, .ord = 16 };
        struct rs_mpa_frame req;
        uint8_t out[64];
        rs_mpa_request_init(&req, &local, NULL, 0);
        int n = rs_mpa_frame_encode(&req, out, sizeof(out));
        assert_true(n >= 20);
        assert_int_equal(out[16] & RS_MPA_FLAG_MARKERS, 0);
        assert_int_equal(out[16] & RS_MPA_FLAG_CRC, crc ? RS_MPA_FLAG_CRC : 0);
        assert_int_equal(out[16] & RS_MPA_FLAG_REJECT, 0);
        assert_int_equal(out[17], rev);
        assert_int_equal((out[16] & RS_MPA_FLAG_ENHANCED) != 0, rev == 2);
    }
}

static void test_markers_refused(void **state)
{
    (void)state;
    struct rs_mpa_local local = { .rev = 2, .ird = 8, .ord = 8 };
    /* A peer's Request asking for markers. */
    struct rs_mpa_frame peer = { .rev = 1, .markers = true, .crc = true };
    uint8_t wire[64], rep_wire[64];
    int n = rs_mpa_frame_encode(&peer, wire, sizeof(wire));
    struct rs_mpa_frame req, rep, rep_got;
    assert_int_equal(rs_mpa_frame_parse(wire, (size_t)n, false, &req), 0);
    assert_true(req.markers);
    struct rs_mpa_result res;
    uint8_t ecode = 0;
    assert_int_equal(rs_mpa_responder_negotiate(&req, &local, &res, &ecode), -EPROTONOSUPPORT);
    assert_int_equal(ecode, RS_TERM_LLP_MARKER);
    rs_mpa_reply_init(&rep, &req, &local, NULL, true, NULL, 0);
    n = rs_mpa_frame_encode(&rep, rep_wire, sizeof(rep_wire));
    assert_int_equal(n, 20);
    assert_memory_equal(rep_wire, "MPA ID Rep Frame", 16);
    assert_int_equal(rep_wire[16] & (RS_MPA_FLAG_REJECT | RS_MPA_FLAG_MARKERS), RS_MPA_FLAG_REJECT);
    assert_int_equal(rep_wire[17], 1);
    assert_int_equal(rs_mpa_frame_parse(rep_wire, (size_t)n, true, &rep_got), 0);
    assert_true(rep_got.reject);

    /* A Reply asking us for markers fails our connection. */
    struct rs_mpa_frame ours, bad_rep = { .reply = true, .rev = 2, .markers = true, .crc = true };
    struct rs_mpa_result r2;
    rs_mpa_request_init(&ours, &local, NULL, 0);
    assert_int_equal(rs_mpa_initiator_negotiate(&ours, &bad_rep, &local, &r2), -EPROTO);
}

/* CRCs are used when either side asks (RFC 5044 7.1), and the Reply says what is in force. */
static void test_crc_negotiation(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++) {
        bool ini_asks = i & 1, resp_asks = (i & 2) != 0;
        struct rs_mpa_local ini = { .rev = 2, .crc = ini_asks, .ird = 4, .ord = 4 },
                            resp = { .rev = 2, .crc = resp_asks, .ird = 4, .ord = 4 };
        struct rs_mpa_frame req, req_got, rep, rep_got;
        uint8_t wreq[64], wrep[64], ecode;
        rs_mpa_request_init(&req, &ini, NULL, 0);
        int n = rs_mpa_frame_encode(&req, wreq, sizeof(wreq));
        assert_int_equal(rs_mpa_frame_parse(wreq, (size_t)n, false, &req_got), 0);
        assert_int_equal(req_got.crc, ini_asks);
        struct rs_mpa_result rres, ires;
        assert_int_equal(rs_mpa_responder_negotiate(&req_got, &resp, &rres, &ecode), 0);
        rs_mpa_reply_init(&rep, &req_got, &resp, &rres, false, NULL, 0);
        n = rs_mpa_frame_encode(&rep, wrep, sizeof(wrep));
        assert_int_equal(rs_mpa_frame_parse(wrep, (size_t)n, true, &rep_got), 0);
        assert_int_equal(rs_mpa_initiator_negotiate(&req, &rep_got, &ini, &ires), 0);
        assert_int_equal(rres.crc, ini_asks || resp_asks);
        assert_int_equal(ires.crc, ini_asks || resp_asks);
        assert_int_equal(rep_got.crc, ini_asks || resp_asks);
    }
}

static void test_ird_ord_negotiation(void **state)
{
    (void)state;
    struct rs_mpa_local ini = { .rev = 2, .crc = true, .ird = 8, .ord = 16 }, resp = { .rev = 2, .ird = 4, .ord = 2 };
    struct rs_mpa_frame req, req_got, rep, rep_got;
    uint8_t wreq[64], wrep[64];
    rs_mpa_request_init(&req, &ini, "req", 3);
    int n = rs_mpa_frame_encode(&req, wreq, sizeof(wreq));
    assert_int_equal(rs_mpa_frame_parse(wreq, (size_t)n, false, &req_got), 0);
    struct rs_mpa_result rres, ires;
    uint8_t ecode;
    assert_int_equal(rs_mpa_responder_negotiate(&req_got, &resp, &rres, &ecode), 0);
    assert_int_equal(rres.rev, 2);
    assert_true(rres.crc);
    assert_int_equal(rres.ird, 4);
    assert_int_equal(rres.ord, 2);          /* min(our 2, initiator IRD 8) */
    rs_mpa_reply_init(&rep, &req_got, &resp, &rres, false, "rep!", 4);
    n = rs_mpa_frame_encode(&rep, wrep, sizeof(wrep));
    assert_int_equal(n, 20 + 4 + 4);
    assert_int_equal(rs_mpa_frame_parse(wrep, (size_t)n, true, &rep_got), 0);
    assert_memory_equal(rep_got.pd, "rep!", 4);
    assert_int_equal(rs_mpa_initiator_negotiate(&req, &rep_got, &ini, &ires), 0);
    assert_int_equal(ires.rev, 2);
    assert_int_equal(ires.ird, 8);
    assert_int_equal(ires.ord, 4);          /* lowered to the responder's IRD */
    assert_true(ires.crc);
    /* Neither side issues more Reads than the other serves. */
    assert_true(ires.ord <= rres.ird);
    assert_true(rres.ord <= ires.ird);

    /* The responder wins with a smaller revision: rev 1, no IRD/ORD block, local limits apply. */
    struct rs_mpa_local old = { .rev = 1, .ird = 3, .ord = 3 };
    assert_int_equal(rs_mpa_responder_negotiate(&req_got, &old, &rres, &ecode), 0);
    assert_int_equal(rres.rev, 1);
    rs_mpa_reply_init(&rep, &req_got, &old, &rres, false, NULL, 0);
    assert_false(rep.enhanced);
    n = rs_mpa_frame_encode(&rep, wrep, sizeof(wrep));
    assert_int_equal(n, 20);
    assert_int_equal(wrep[17], 1);
    assert_int_equal(rs_mpa_frame_parse(wrep, (size_t)n, true, &rep_got), 0);
    assert_int_equal(rs_mpa_initiator_negotiate(&req, &rep_got, &ini, &ires), 0);
    assert_int_equal(ires.rev, 1);
    assert_int_equal(ires.ord, 16);
}

static void test_reply_checks(void **state)
{
    (void)state;
    struct rs_mpa_local v1 = { .rev = 1, .ird = 4, .ord = 4 }, v2 = { .rev = 2, .ird = 4, .ord = 4 };
    struct rs_mpa_frame req1, req2;
    struct rs_mpa_result res;
    rs_mpa_request_init(&req1, &v1, NULL, 0);
    rs_mpa_request_init(&req2, &v2, NULL, 0);
    struct rs_mpa_frame rep = { .reply = true, .rev = 2, .crc = true, .enhanced = true, .ird = 1, .ord = 1 };
    assert_int_equal(rs_mpa_initiator_negotiate(&req1, &rep, &v1, &res), -EPROTO);     /* higher rev */
    rep.rev = 1;
    assert_int_equal(rs_mpa_initiator_negotiate(&req1, &rep, &v1, &res), -EPROTO);     /* enhanced to rev 1 */
    rep.enhanced = false;
    assert_int_equal(rs_mpa_initiator_negotiate(&req1, &rep, &v1, &res), 0);
    rep.rev = 0;
    assert_int_equal(rs_mpa_initiator_negotiate(&req2, &rep, &v2, &res), -EPROTO);
    rep.rev = 2;
    rep.reject = true;
    assert_int_equal(rs_mpa_initiator_negotiate(&req2, &rep, &v2, &res), -ECONNREFUSED);

    /* Unknown Request revisions: parsed (so a Reply can be built) but refused with R and our revision. */
    struct rs_mpa_frame odd = { .rev = 2, .crc = true };
    uint8_t w[64];
    int n = rs_mpa_frame_encode(&odd, w, sizeof(w));
    w[17] = 3;
    struct rs_mpa_frame got, reply;
    assert_int_equal(rs_mpa_frame_parse(w, (size_t)n, false, &got), -EPROTONOSUPPORT);
    assert_int_equal(got.rev, 3);
    uint8_t ecode;
    assert_int_equal(rs_mpa_responder_negotiate(&got, &v2, &res, &ecode), -EPROTONOSUPPORT);
    assert_int_equal(ecode, RS_TERM_LLP_BAD_REQ_REP);
    rs_mpa_reply_init(&reply, &got, &v2, NULL, true, NULL, 0);
    assert_int_equal(reply.rev, 2);
    assert_true(reply.reject);
    w[17] = 0;
    assert_int_equal(rs_mpa_frame_parse(w, (size_t)n, false, &got), -EPROTONOSUPPORT);

    /* A rejecting Reply carries the application's private data through an enhanced frame. */
    struct rs_mpa_frame rej;
    rs_mpa_reply_init(&rej, &req2, &v2, NULL, true, "no thanks", 9);
    n = rs_mpa_frame_encode(&rej, w, sizeof(w));
    assert_int_equal(rs_mpa_frame_parse(w, (size_t)n, true, &got), 0);
    assert_true(got.reject && got.enhanced);
    assert_int_equal(got.pd_len, 9);
    assert_memory_equal(got.pd, "no thanks", 9);
    assert_int_equal(rs_mpa_initiator_negotiate(&req2, &got, &v2, &res), -ECONNREFUSED);
}

/* ---- DDP / RDMAP ---- */

static void expect_cause(const uint8_t *p, size_t len, uint8_t layer, uint8_t etype, uint8_t ecode)
{
    struct rs_ddp_seg seg;
    struct rs_term_cause cause;
    assert_int_equal(rs_ddp_seg_parse(p, len, &seg, &cause), -EPROTO);
    assert_int_equal(cause.layer, layer);
    assert_int_equal(cause.etype, etype);
    assert_int_equal(cause.ecode, ecode);
}

static void test_ddp_valid_segments(void **state)
{
    (void)state;
    uint8_t h[64];
    struct rs_ddp_seg seg;
    struct rs_term_cause cause;

    rs_ddp_tagged_hdr(h, RS_RDMAP_WRITE, false, 0xaabbccdd, 0x0102030405060708ull);
    assert_int_equal(rs_ddp_hdr_len(h), 14);
    assert_int_equal(rs_ddp_seg_parse(h, 14 + 100, &seg, &cause), 0);
    assert_true(seg.ctrl.tagged);
    assert_false(seg.ctrl.last);
    assert_int_equal(seg.ctrl.opcode, RS_RDMAP_WRITE);
    assert_int_equal(seg.stag, 0xaabbccdd);
    assert_int_equal(seg.to, 0x0102030405060708ull);
    assert_int_equal(seg.hdr_len, 14);
    assert_int_equal(seg.payload_len, 100);

    rs_ddp_tagged_hdr(h, RS_RDMAP_READ_RESPONSE, true, 7, 0);
    assert_int_equal(rs_ddp_seg_parse(h, 14, &seg, &cause), 0);
    assert_int_equal(seg.payload_len, 0);

    rs_ddp_untagged_hdr(h, RS_RDMAP_SEND_SE_INVALIDATE, true, 0x11223344, RS_DDP_QN_SEND, 9, 4096);
    assert_int_equal(rs_ddp_hdr_len(h), 18);
    assert_int_equal(rs_ddp_seg_parse(h, 18 + 5, &seg, &cause), 0);
    assert_int_equal(seg.inval_stag, 0x11223344);
    assert_int_equal(seg.qn, 0);
    assert_int_equal(seg.msn, 9);
    assert_int_equal(seg.mo, 4096);
    assert_int_equal(seg.payload_len, 5);
    /* RsvdULP of a plain Send is not an STag. */
    rs_ddp_untagged_hdr(h, RS_RDMAP_SEND, true, 0x11223344, RS_DDP_QN_SEND, 9, 0);
    assert_int_equal(rs_ddp_seg_parse(h, 18, &seg, &cause), 0);
    assert_int_equal(seg.inval_stag, 0);

    struct rs_rdmap_read_req rr = { 0x01020304, 0x1111222233334444ull, 65536, 0x0a0b0c0d, 0x5555666677778888ull };
    size_t n = rs_rdmap_read_req_hdr(h, 3, &rr);
    assert_int_equal(n, 46);
    assert_int_equal(rs_ddp_hdr_len(h), 46);
    assert_int_equal(rs_ddp_seg_parse(h, n, &seg, &cause), 0);
    assert_int_equal(seg.qn, RS_DDP_QN_READ_REQUEST);
    assert_int_equal(seg.msn, 3);
    assert_memory_equal(&seg.rr, &rr, sizeof(rr));
}

static void test_ddp_invalid_segments(void **state)
{
    (void)state;
    uint8_t h[64];
    /* DDP version, reported per buffer model. */
    rs_ddp_tagged_hdr(h, RS_RDMAP_WRITE, true, 1, 0);
    h[0] = (uint8_t)((h[0] & ~3) | 2);
    expect_cause(h, 20, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_TAGGED_BUFFER, RS_TERM_DDP_TAGGED_INVALID_VERSION);
    rs_ddp_untagged_hdr(h, RS_RDMAP_SEND, true, 0, 0, 1, 0);
    h[0] = (uint8_t)(h[0] & ~3);
    expect_cause(h, 20, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER,
                 RS_TERM_DDP_UNTAGGED_INVALID_VERSION);
    /* RDMAP version. */
    rs_ddp_untagged_hdr(h, RS_RDMAP_SEND, true, 0, 0, 1, 0);
    h[1] = (uint8_t)((h[1] & 0x3f) | (2 << 6));
    expect_cause(h, 20, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION, RS_TERM_RDMAP_INVALID_VERSION);
    /* Opcodes RC does not know, and known opcodes with the wrong buffer model. */
    const uint8_t bad_ops[] = { 0x8, 0x9, 0xa, 0xb, 0xc, RS_RDMAP_WRITE_RECORD, 0xe, 0xf };
    for (size_t i = 0; i < sizeof(bad_ops); i++) {
        rs_ddp_tagged_hdr(h, bad_ops[i], true, 1, 0);
        expect_cause(h, 20, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                     RS_TERM_RDMAP_UNEXPECTED_OPCODE);
    }
    rs_ddp_tagged_hdr(h, RS_RDMAP_SEND, true, 1, 0);
    expect_cause(h, 20, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION, RS_TERM_RDMAP_UNEXPECTED_OPCODE);
    rs_ddp_untagged_hdr(h, RS_RDMAP_WRITE, true, 0, 0, 1, 0);
    expect_cause(h, 20, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION, RS_TERM_RDMAP_UNEXPECTED_OPCODE);
    /* Queue number not the opcode's. */
    rs_ddp_untagged_hdr(h, RS_RDMAP_SEND, true, 0, RS_DDP_QN_READ_REQUEST, 1, 0);
    expect_cause(h, 20, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER, RS_TERM_DDP_UNTAGGED_INVALID_QN);
    rs_ddp_untagged_hdr(h, RS_RDMAP_TERMINATE, true, 0, RS_DDP_QN_SEND, 1, 0);
    expect_cause(h, 30, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER, RS_TERM_DDP_UNTAGGED_INVALID_QN);
    /* Segments shorter than their headers. */
    rs_ddp_tagged_hdr(h, RS_RDMAP_WRITE, true, 1, 0);
    expect_cause(h, 13, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_CATASTROPHIC, 0);
    expect_cause(h, 1, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_CATASTROPHIC, 0);
    rs_ddp_untagged_hdr(h, RS_RDMAP_SEND, true, 0, 0, 1, 0);
    expect_cause(h, 17, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_CATASTROPHIC, 0);
    /* Read Requests: exactly one whole 28-byte header. */
    struct rs_rdmap_read_req rr = { 1, 2, 3, 4, 5 };
    rs_rdmap_read_req_hdr(h, 1, &rr);
    expect_cause(h, 45, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                 RS_TERM_RDMAP_CATASTROPHIC_STREAM);
    expect_cause(h, 47, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER, RS_TERM_DDP_UNTAGGED_MSG_TOO_LONG);
    h[0] = (uint8_t)(h[0] & ~RS_DDP_FLAG_LAST);
    expect_cause(h, 46, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER, RS_TERM_DDP_UNTAGGED_MSG_TOO_LONG);
    rs_rdmap_read_req_hdr(h, 1, &rr);
    rs_put_be32(h + 14, 28);
    expect_cause(h, 46, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER, RS_TERM_DDP_UNTAGGED_INVALID_MO);
}

static void test_terminate_messages(void **state)
{
    (void)state;
    uint8_t t[RS_TERM_MAX_LEN], off[64];
    struct rs_ddp_seg seg;
    struct rs_term_cause cause, got;

    /* No offending header: just the control word. */
    struct rs_term_cause crc = { RS_TERM_LAYER_LLP, RS_TERM_LLP_ETYPE_MPA, RS_TERM_LLP_CRC };
    size_t n = rs_term_build(t, 1, &crc, NULL, 0, 0);
    assert_int_equal(n, 22);
    assert_int_equal(rs_ddp_seg_parse(t, n, &seg, &cause), 0);
    assert_int_equal(seg.ctrl.opcode, RS_RDMAP_TERMINATE);
    assert_true(seg.ctrl.last);
    assert_int_equal(seg.qn, RS_DDP_QN_TERMINATE);
    assert_int_equal(seg.msn, 1);
    assert_int_equal(seg.term_word, 0x20020000u);
    got = rs_term_cause_of(seg.term_word);
    assert_memory_equal(&got, &crc, sizeof(crc));

    /* A refused tagged Write: M and D, its ULPDU length and its 14-byte header follow. */
    struct rs_term_cause stag = { RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_TAGGED_BUFFER,
                                  RS_TERM_DDP_TAGGED_INVALID_STAG };
    rs_ddp_tagged_hdr(off, RS_RDMAP_WRITE, true, 0xdeadbeef, 42);
    n = rs_term_build(t, 1, &stag, off, 14, 14 + 4096);
    assert_int_equal(n, 22 + 2 + 14);
    assert_int_equal(rs_get_be32(t + 18), 0x11000000u | RS_TERM_FLAG_M | RS_TERM_FLAG_D);
    assert_int_equal(rs_get_be16(t + 22), 14 + 4096);
    assert_memory_equal(t + 24, off, 14);
    assert_int_equal(rs_ddp_seg_parse(t, n, &seg, &cause), 0);

    /* A refused Read Request: R too, with the 28-byte RDMAP header. */
    struct rs_term_cause prot = { RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION,
                                  RS_TERM_RDMAP_ACCESS_RIGHTS };
    struct rs_rdmap_read_req rr = { 1, 2, 3, 4, 5 };
    size_t rn = rs_rdmap_read_req_hdr(off, 7, &rr);
    n = rs_term_build(t, 2, &prot, off, rn, (uint16_t)rn);
    assert_int_equal(n, RS_TERM_MAX_LEN);
    assert_int_equal(rs_get_be32(t + 18), 0x01020000u | RS_TERM_FLAG_M | RS_TERM_FLAG_D | RS_TERM_FLAG_R);
    assert_memory_equal(t + 24, off, 46);
    /* An offending header cut short is left out rather than invented. */
    n = rs_term_build(t, 1, &prot, off, 10, 10);
    assert_int_equal(n, 22);
    assert_int_equal(rs_get_be32(t + 18) & 0xe000, 0);

    assert_string_equal(rs_term_cause_str(&stag), "DDP tagged buffer: invalid STag");
    assert_string_equal(rs_term_cause_str(&crc), "MPA: CRC error");
    assert_string_equal(rs_term_cause_str(&prot), "RDMAP: access rights violation");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fpdu_reference_crc),
        cmocka_unit_test(test_fpdu_build_matches_reference),
        cmocka_unit_test(test_fpdu_corruption_detected),
        cmocka_unit_test(test_fpdu_pad_and_trailer),
        cmocka_unit_test(test_reqrep_v2_bytes),
        cmocka_unit_test(test_reqrep_private_data_limits),
        cmocka_unit_test(test_reqrep_header_scanning),
        cmocka_unit_test(test_our_requests),
        cmocka_unit_test(test_markers_refused),
        cmocka_unit_test(test_ird_ord_negotiation),
        cmocka_unit_test(test_crc_negotiation),
        cmocka_unit_test(test_reply_checks),
        cmocka_unit_test(test_ddp_valid_segments),
        cmocka_unit_test(test_ddp_invalid_segments),
        cmocka_unit_test(test_terminate_messages),
    };
    return cmocka_run_group_tests_name("mpa", tests, NULL, NULL);
}
