/* CRC32c: RFC 3720 B.4 vectors, chaining, agreement of the table, chain, lanes and folding paths, wire byte order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/crc32c.h"

/* RFC 3720 B.4: a 48-byte SCSI Read (10) command PDU. */
static const uint8_t iscsi_read_pdu[48] = {
    0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
    0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void check_rfc3720_vectors(crc_fn crc)
{
    uint8_t buf[32];

    memset(buf, 0x00, sizeof(buf));
    assert_int_equal(crc(0, buf, sizeof(buf)), 0x8a9136aa);
    memset(buf, 0xff, sizeof(buf));
    assert_int_equal(crc(0, buf, sizeof(buf)), 0x62a8ab43);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(crc(0, buf, sizeof(buf)), 0x46dd794e);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    assert_int_equal(crc(0, buf, sizeof(buf)), 0x113fdb5c);
    assert_int_equal(crc(0, iscsi_read_pdu, sizeof(iscsi_read_pdu)), 0xd9963a56);
    /* The classic check value for "123456789" and the empty input. */
    assert_int_equal(crc(0, "123456789", 9), 0xe3069283);
    assert_int_equal(crc(0, "", 0), 0);
    assert_int_equal(crc(0x12345678, "", 0), 0x12345678);
}

static void test_vectors_dispatch(void **state)
{
    (void)state;
    check_rfc3720_vectors(rs_crc32c);
}

static void test_vectors_software(void **state)
{
    (void)state;
    check_rfc3720_vectors(rs_crc32c_sw);
}

static void test_vectors_hardware(void **state)
{
    (void)state;
    if (!rs_crc32c_hw_available())
        skip();
    check_rfc3720_vectors(rs_crc32c_hw);
}

static void test_vectors_lanes(void **state)
{
    (void)state;
    if (!rs_crc32c_hw_lanes_available())
        skip();
    check_rfc3720_vectors(rs_crc32c_hw_lanes);
}

/* Reference: one bit at a time, straight from the polynomial. */
static uint32_t crc_reference(uint32_t crc, const uint8_t *p, size_t len)
{
    crc = ~crc;
    while (len--) {
        crc ^= *p++;
        for (int bit = 0; bit < 8; bit++)
            crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

static void test_chaining(void **state)
{
    (void)state;
    uint8_t data[1000];
    srand(7);
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)rand();
    uint32_t whole = rs_crc32c(0, data, sizeof(data));
    assert_int_equal(whole, crc_reference(0, data, sizeof(data)));
    for (size_t split = 0; split <= sizeof(data); split += 37) {
        uint32_t first = rs_crc32c(0, data, split);
        assert_int_equal(rs_crc32c(first, data + split, sizeof(data) - split), whole);
        uint32_t first_sw = rs_crc32c_sw(0, data, split);
        assert_int_equal(rs_crc32c_sw(first_sw, data + split, sizeof(data) - split), whole);
    }
    /* Byte-by-byte chaining hits every alignment of the word loops. */
    uint32_t running = 0;
    for (size_t i = 0; i < sizeof(data); i++)
        running = rs_crc32c(running, data + i, 1);
    assert_int_equal(running, whole);
}

static void test_sw_hw_agree_random(void **state)
{
    (void)state;
    enum { MAX_LEN = 4096, PAD = 16 };
    uint8_t *buf = malloc(MAX_LEN + PAD);
    assert_non_null(buf);
    srand(12345);
    for (size_t i = 0; i < MAX_LEN + PAD; i++)
        buf[i] = (uint8_t)rand();

    bool have_hw = rs_crc32c_hw_available();
    unsigned compared = 0;
    for (int round = 0; round < 3000; round++) {
        size_t offset = (size_t)rand() % PAD;
        size_t len = round < 300 ? (size_t)round : (size_t)rand() % (MAX_LEN + 1);
        uint32_t seed = round % 3 == 0 ? 0 : (uint32_t)rand();
        uint32_t sw = rs_crc32c_sw(seed, buf + offset, len);
        if (len <= 300)
            assert_int_equal(sw, crc_reference(seed, buf + offset, len));
        if (have_hw) {
            assert_int_equal(rs_crc32c_hw(seed, buf + offset, len), sw);
            compared++;
        }
        assert_int_equal(rs_crc32c(seed, buf + offset, len), sw);
    }
    /* Both lengths and offsets were exercised, including the full 4096. */
    assert_int_equal(rs_crc32c_sw(0, buf, MAX_LEN), crc_reference(0, buf, MAX_LEN));
    if (have_hw) {
        assert_int_equal(compared, 3000);
        assert_int_equal(rs_crc32c_hw(0, buf, MAX_LEN), crc_reference(0, buf, MAX_LEN));
    }
    free(buf);
}

/*
 * The multi-lane and folding paths against the single chain and the table path. Their geometry (crc32c.c): lanes
 * run rounds of 6 x 4096, 6 x 512 and 6 x 64 bytes after up to 7 bytes that align the pointer, one chain below
 * 384 bytes and for the tail; folding runs mixed rounds of 31744 bytes, then 256-byte steps, then 64-byte steps,
 * one chain below 512 bytes and for the last 63. Every round and step size is a multiple of 64, so: every length
 * up to a few KiB, and lengths next to every multiple of 64 up to 70000 at several alignments (all eight next to
 * the multiples of 384): each round size entered, left, and the tail of each.
 */
enum { LANES_MAX_LEN = 70000, LANES_PAD = 16 };

static uint8_t *random_buffer(size_t len, unsigned seed)
{
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    srand(seed);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)rand();
    return buf;
}

static void check_lanes_at(const uint8_t *buf, size_t offset, size_t len, uint32_t seed, bool with_sw)
{
    uint32_t lanes = rs_crc32c_hw_lanes(seed, buf + offset, len);
    assert_int_equal(lanes, rs_crc32c_hw(seed, buf + offset, len));
    if (rs_crc32c_hw_fold_available())
        assert_int_equal(rs_crc32c_hw_fold(seed, buf + offset, len), lanes);
    if (with_sw)
        assert_int_equal(lanes, rs_crc32c_sw(seed, buf + offset, len));
    assert_int_equal(rs_crc32c(seed, buf + offset, len), lanes);
}

static void test_vectors_fold(void **state)
{
    (void)state;
    if (!rs_crc32c_hw_fold_available())
        skip();
    check_rfc3720_vectors(rs_crc32c_hw_fold);
}

static void test_lanes_agree_short(void **state)
{
    (void)state;
    if (!rs_crc32c_hw_lanes_available())
        skip();
    uint8_t *buf = random_buffer(5000 + LANES_PAD, 99);
    for (size_t len = 0; len <= 5000; len++)
        check_lanes_at(buf, len % LANES_PAD, len, len % 5 == 0 ? 0 : (uint32_t)len * 2654435761u, true);
    free(buf);
}

static void test_lanes_agree_edges(void **state)
{
    (void)state;
    if (!rs_crc32c_hw_lanes_available())
        skip();
    uint8_t *buf = random_buffer(LANES_MAX_LEN + LANES_PAD, 4242);
    static const size_t some_offsets[] = { 0, 1, 5 };
    unsigned checked = 0;
    for (size_t multiple = 64; multiple <= LANES_MAX_LEN; multiple += 64) {
        bool all_offsets = multiple % 384 == 0;
        for (size_t i = 0; i < (all_offsets ? 8 : 3); i++) {
            size_t offset = all_offsets ? i : some_offsets[i];
            for (size_t len = multiple - 9; len <= multiple + 9 && len <= LANES_MAX_LEN; len++) {
                /* Misalignment eats (8 - offset) % 8 bytes before the lanes: cover both sides of each edge. */
                check_lanes_at(buf, offset, len, (uint32_t)(len ^ offset), multiple % 3072 == 0 && offset < 2);
                checked++;
            }
        }
    }
    /* Lengths an FPDU's payload has (64 KiB FPDUs: 65512 for a SEND, 65516 tagged), and a 16-bit ULPDU's max. */
    static const size_t sums[] = {
        6 * 4096 + 6 * 512 + 6 * 64, 31744, 2 * 31744, 2 * 31744 + 2024, 65512, 65516, 65535, 65536, LANES_MAX_LEN,
    };
    for (size_t i = 0; i < sizeof(sums) / sizeof(sums[0]); i++)
        for (size_t offset = 0; offset < LANES_PAD; offset++)
            for (size_t len = sums[i] - 3; len <= sums[i] && len <= LANES_MAX_LEN; len++)
                check_lanes_at(buf, offset, len, 0, true);
    /* The whole buffer against the bit-at-a-time reference, not only against the other tables. */
    assert_int_equal(rs_crc32c_hw_lanes(0, buf, LANES_MAX_LEN), crc_reference(0, buf, LANES_MAX_LEN));
    assert_int_equal(rs_crc32c_hw_lanes(0x1234abcd, buf + 3, 65536), crc_reference(0x1234abcd, buf + 3, 65536));
    if (rs_crc32c_hw_fold_available())
        assert_int_equal(rs_crc32c_hw_fold(0x1234abcd, buf + 5, 65512), crc_reference(0x1234abcd, buf + 5, 65512));
    assert_true(checked > 50000);
    free(buf);
}

static void test_lanes_agree_random(void **state)
{
    (void)state;
    if (!rs_crc32c_hw_lanes_available())
        skip();
    uint8_t *buf = random_buffer(LANES_MAX_LEN + LANES_PAD, 777);
    srand(31337);
    for (int round = 0; round < 2000; round++) {
        size_t offset = (size_t)rand() % LANES_PAD;
        size_t len = (size_t)rand() % (LANES_MAX_LEN + 1);
        uint32_t seed = round % 4 == 0 ? 0 : (uint32_t)rand();
        check_lanes_at(buf, offset, len, seed, round % 10 == 0);
    }
    /* Chaining through the fast paths: a message CRCed in pieces, as the RC transmitter does over iovecs. */
    uint32_t whole = rs_crc32c_hw_lanes(0, buf, LANES_MAX_LEN);
    bool fold = rs_crc32c_hw_fold_available();
    for (int round = 0; round < 200; round++) {
        size_t split = (size_t)rand() % (LANES_MAX_LEN + 1);
        uint32_t first = rs_crc32c_hw_lanes(0, buf, split);
        assert_int_equal(rs_crc32c_hw_lanes(first, buf + split, LANES_MAX_LEN - split), whole);
        if (fold) {
            first = rs_crc32c_hw_fold(0, buf, split);
            assert_int_equal(rs_crc32c_hw_fold(first, buf + split, LANES_MAX_LEN - split), whole);
        }
    }
    free(buf);
}

static void test_wire_byte_order(void **state)
{
    (void)state;
    uint8_t zeros[32] = { 0 };
    uint8_t wire[4];
    rs_crc32c_wire_put(wire, rs_crc32c(0, zeros, sizeof(zeros)));
    /* RFC 3720 B.4 prints this CRC as the byte sequence aa 36 91 8a. */
    assert_int_equal(wire[0], 0xaa);
    assert_int_equal(wire[1], 0x36);
    assert_int_equal(wire[2], 0x91);
    assert_int_equal(wire[3], 0x8a);
    assert_int_equal(rs_crc32c_wire_get(wire), 0x8a9136aa);

    /* An MPA-style frame: CRC over header+payload, stored little-endian
     * after it, then verified the way a receiver would. */
    uint8_t frame[2 + 6 + 4] = { 0x00, 0x06, 'r', 'd', 'm', 'a', 0, 0 };
    rs_crc32c_wire_put(frame + 8, rs_crc32c(0, frame, 8));
    assert_int_equal(rs_crc32c_wire_get(frame + 8), rs_crc32c(0, frame, 8));
    frame[3] ^= 1;
    assert_int_not_equal(rs_crc32c_wire_get(frame + 8), rs_crc32c(0, frame, 8));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_dispatch),
        cmocka_unit_test(test_vectors_software),
        cmocka_unit_test(test_vectors_hardware),
        cmocka_unit_test(test_vectors_lanes),
        cmocka_unit_test(test_vectors_fold),
        cmocka_unit_test(test_chaining),
        cmocka_unit_test(test_sw_hw_agree_random),
        cmocka_unit_test(test_lanes_agree_short),
        cmocka_unit_test(test_lanes_agree_edges),
        cmocka_unit_test(test_lanes_agree_random),
        cmocka_unit_test(test_wire_byte_order),
    };
    return cmocka_run_group_tests_name("crc32c", tests, NULL, NULL);
}
