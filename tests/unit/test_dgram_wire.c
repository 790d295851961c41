/*
 * The datagram control messages (src/dgram_wr/dgram_wire.c, docs/dgram.md §4) byte for byte: every type round-
 * trips, the layout matches the document, and the decoder refuses everything else (wrong magic, version, type,
 * length, reserved bits, zero instance, inconsistent lanes and sinks). Also: no control message can be taken for
 * a datagram-iWARP one (the first byte sets DDP reserved bits).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dgram_wr/dgram_wire.h"

static struct rs_dgw_msg sample(enum rs_dgw_type type)
{
    struct rs_dgw_msg m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.instance = 0x0102030405060708ull;
    switch (type) {
    case RS_DGW_PROBE:
        m.nonce = 0x1112131415161718ull;
        m.u.probe.want = RS_DGW_WANT_LANE;
        m.u.probe.rnic_kind = 1;
        break;
    case RS_DGW_ANSWER:
    case RS_DGW_ANNOUNCE:
        m.nonce = type == RS_DGW_ANSWER ? 0x1112131415161718ull : 0;
        m.u.answer.flags = RS_DGW_ACCEPT | RS_DGW_HAS_LANE;
        m.u.answer.rnic_kind = 1;
        m.u.answer.qpn = 0x00abcdef;
        m.u.answer.lane_rkey = 0x12345678;
        m.u.answer.lane_size = 262144;
        m.u.answer.lane_to = 0x00007f0011223000ull;
        m.u.answer.lane_records = 256;
        break;
    case RS_DGW_SINK:
        m.u.sink.sink_id = 3;
        m.u.sink.rkey = 0xdeadbe01;
        m.u.sink.to = 0x00007f00aabbc000ull;
        m.u.sink.len = 65536;
        break;
    case RS_DGW_CONSUMED:
        m.u.consumed.lane_rkey = 0x12345678;
        m.u.consumed.records = 77;
        m.u.consumed.consumed = 0x10000;
        break;
    case RS_DGW_BYE:
        break;
    }
    return m;
}

static void test_round_trip(void **state)
{
    (void)state;
    const enum rs_dgw_type types[] = { RS_DGW_PROBE, RS_DGW_ANSWER, RS_DGW_ANNOUNCE, RS_DGW_SINK, RS_DGW_CONSUMED,
                                       RS_DGW_BYE };
    const size_t lens[] = { 32, 56, 56, 48, 40, 24 };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        struct rs_dgw_msg m = sample(types[i]), back;
        uint8_t buf[RS_DGW_MAX_LEN];
        size_t len = rs_dgw_encode(&m, buf);
        assert_int_equal(len, lens[i]);
        assert_true(rs_dgw_has_magic(buf, len));
        assert_int_equal(rs_dgw_decode(buf, len, &back), 0);
        assert_memory_equal(&back, &m, sizeof(m));
        /* One byte more or less is not a message. */
        assert_int_equal(rs_dgw_decode(buf, len - 1, &back), -EBADMSG);
        buf[len] = 0;
        assert_int_equal(rs_dgw_decode(buf, len + 1, &back), -EBADMSG);
    }
}

static void test_layout(void **state)
{
    (void)state;
    struct rs_dgw_msg m = sample(RS_DGW_ANSWER);
    uint8_t buf[RS_DGW_MAX_LEN];
    assert_int_equal(rs_dgw_encode(&m, buf), 56);
    static const uint8_t expect[56] = {
        'R', 'S', 'D', 'G', 1, 2, 0, 32,                    /* magic, version, type, body length */
        1, 2, 3, 4, 5, 6, 7, 8,                             /* instance */
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,     /* nonce */
        3, 1, 0, 0,                                         /* flags, rnic kind, reserved */
        0x00, 0xab, 0xcd, 0xef,                             /* qpn */
        0x12, 0x34, 0x56, 0x78,                             /* lane rkey */
        0, 4, 0, 0,                                         /* lane size 262144 */
        0, 0, 0x7f, 0, 0x11, 0x22, 0x30, 0,                 /* lane TO */
        0, 0, 1, 0,                                         /* lane records 256 */
        0, 0, 0, 0,                                         /* reserved */
    };
    assert_memory_equal(buf, expect, sizeof(expect));
    /* DDP reserved bits (byte 0, bits 5:2) are set: a datagram-iWARP decoder refuses it at once. */
    assert_true((buf[0] & 0x3c) != 0);
}

static void expect_bad(const uint8_t *buf, size_t len)
{
    struct rs_dgw_msg m;
    assert_int_equal(rs_dgw_decode(buf, len, &m), -EBADMSG);
}

static void test_refusals(void **state)
{
    (void)state;
    uint8_t good[RS_DGW_MAX_LEN], b[RS_DGW_MAX_LEN];
    struct rs_dgw_msg m = sample(RS_DGW_PROBE);
    size_t len = rs_dgw_encode(&m, good);
#define MUTATE(offset, value) do { memcpy(b, good, len); b[offset] = (value); expect_bad(b, len); } while (0)
    MUTATE(0, 'r');             /* magic */
    MUTATE(3, 'H');
    MUTATE(4, 2);               /* version */
    MUTATE(5, 0);               /* type */
    MUTATE(5, 7);
    MUTATE(7, 9);               /* body length disagrees */
    MUTATE(24, 0x02);           /* unknown want bit */
    MUTATE(30, 1);              /* reserved */
    memcpy(b, good, len);
    memset(b + 8, 0, 8);        /* instance 0 */
    expect_bad(b, len);
    memcpy(b, good, len);
    memset(b + 16, 0, 8);       /* a probe needs a nonce */
    expect_bad(b, len);
    expect_bad(good, 0);
    expect_bad(good, 3);
    expect_bad(good, RS_DGW_HDR_LEN - 1);

    /* Answers: a lane needs ACCEPT, a sane size and records, no wrapping addresses; no lane means zero fields. */
    struct rs_dgw_msg a = sample(RS_DGW_ANSWER), back;
    uint8_t buf[RS_DGW_MAX_LEN];
    a.u.answer.flags = RS_DGW_HAS_LANE;
    expect_bad(buf, rs_dgw_encode(&a, buf));
    a = sample(RS_DGW_ANSWER);
    a.u.answer.lane_size = 100;
    expect_bad(buf, rs_dgw_encode(&a, buf));
    a = sample(RS_DGW_ANSWER);
    a.u.answer.lane_records = 0;
    expect_bad(buf, rs_dgw_encode(&a, buf));
    a = sample(RS_DGW_ANSWER);
    a.u.answer.lane_to = UINT64_MAX - 10;
    expect_bad(buf, rs_dgw_encode(&a, buf));
    a = sample(RS_DGW_ANSWER);
    a.u.answer.flags = RS_DGW_ACCEPT;
    expect_bad(buf, rs_dgw_encode(&a, buf));        /* lane fields without HAS_LANE */
    a.u.answer.lane_rkey = a.u.answer.lane_size = a.u.answer.lane_records = 0;
    a.u.answer.lane_to = 0;
    assert_int_equal(rs_dgw_decode(buf, rs_dgw_encode(&a, buf), &back), 0);
    a.u.answer.flags = 0;                           /* a refusal */
    assert_int_equal(rs_dgw_decode(buf, rs_dgw_encode(&a, buf), &back), 0);
    a.nonce = 0;                                    /* an ANSWER echoes a probe's nonce */
    expect_bad(buf, rs_dgw_encode(&a, buf));

    /* Sinks: non-empty and not wrapping. */
    struct rs_dgw_msg s = sample(RS_DGW_SINK);
    s.u.sink.len = 0;
    expect_bad(buf, rs_dgw_encode(&s, buf));
    s = sample(RS_DGW_SINK);
    s.u.sink.to = UINT64_MAX - 100;
    expect_bad(buf, rs_dgw_encode(&s, buf));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests_name("dgram_wire", tests, NULL, NULL);
}
