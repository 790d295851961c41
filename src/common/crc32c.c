/*
 * CRC32c: slicing-by-8 software path, the SSE4.2 crc32 instruction path, a
 * multi-lane crc32 path for long buffers (with pclmul), and 512-bit folding
 * run alongside crc32 lanes (with AVX-512 and VPCLMULQDQ); the fastest the CPU
 * has is chosen once at run time. See crc32c.h for the conventions.
 *
 * Why lanes: one crc32 instruction depends on the previous one's result, so a
 * single chain runs at the instruction's latency (3 cycles per 8 bytes, about
 * 11.5 GB/s on the project VM), while the CPU can start one or two of them
 * every cycle. Splitting a long buffer into RS_CRC_LANES adjacent blocks
 * that are summed by independent chains keeps the unit busy; the partial
 * results are then moved to their place in the message and added (see
 * lanes_round) with one carry-less multiplication each.
 *
 * The algebra, in the bit-reflected representation the instruction uses (a
 * 32-bit value r stands for the polynomial sum r_i * x^(31-i)): with state s
 * and data D, crc32 yields s * x^(8 |D|) + crc(0, D) mod P, so a block's
 * chain started at 0 gives its own contribution and the state left by the
 * blocks before it only needs multiplying by x^(8 * bytes after it). pclmul of
 * two 32-bit reflected values is their product times x in the 64-bit reflected
 * representation, and crc32_u64(0, v) multiplies v by x^32 and reduces it; so
 * crc32_u64(0, clmul(s, x^(8n - 33) mod P)) = s * x^(8n) mod P.
 */
#include "common/crc32c.h"

#include <string.h>

#include "common/compiler.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define RS_CRC32C_HAVE_X86_HW 1
#endif

#define CRC32C_POLY_REFLECTED 0x82F63B78u

/*
 * Tables are computed on first use instead of being spelled out in the
 * source. Building them (with the lane and fold multipliers, each a power of
 * x computed by square-and-multiply) takes about 30 microseconds, once per
 * process, in the constructor below; callers that arrive while another
 * thread builds them use a path without tables for that call (the bitwise
 * loop, or one crc32 chain) instead of waiting, which keeps the functions
 * lock-free and signal-safe.
 */
enum { TABLES_EMPTY, TABLES_BUILDING, TABLES_READY };
static int tables_state = TABLES_EMPTY;
static uint32_t slice_table[8][256];

#ifdef RS_CRC32C_HAVE_X86_HW
/*
 * Lane geometry. Each round sums RS_CRC_LANES blocks of one of these sizes
 * (bytes per lane, largest first, multiples of 8); what is left after the
 * smallest round goes through a single chain. Large blocks make the merge
 * (a few multiplications per round) negligible; the smaller sizes keep the
 * single-chain tail short for lengths just under a large round.
 */
#define RS_CRC_LANES 6
static const size_t lane_block[] = { 4096, 512, 64 };
#define RS_CRC_LANE_SIZES (sizeof(lane_block) / sizeof(lane_block[0]))
/* lane_shift[s][j] = x^(8 * lane_block[s] * (RS_CRC_LANES - 1 - j) - 33) mod P: moves lane j's sum past the
 * lanes after it (the last lane needs no move). */
static uint32_t lane_shift[RS_CRC_LANE_SIZES][RS_CRC_LANES - 1];

/*
 * Folding (rs_crc32c_hw_fold): 128-bit lanes of the message are carried forward by carry-less multiplication
 * instead of being summed. A lane holds a 128-bit piece A of the message polynomial (reflected: bit k is the
 * coefficient of x^(127-k)), so its low 64 bits are A_hi (times x^64) and its high 64 bits A_lo. Moving it d bits
 * further down the message is A * x^d = A_hi * x^(d+64) + A_lo * x^d; pclmul of a 64-bit reflected half with a
 * 32-bit reflected constant R (stored in the low 32 bits, so it stands for R * x^32) gives half * R * x^33, so
 * the constants are x^(d+31) and x^(d-33) mod P; the product stays within 128 bits. When the lanes have been
 * folded down to one 128-bit value A that ends where the data so far ends, running the crc32 instruction over
 * A's 16 bytes from state 0 gives A * x^32 mod P: the state after that data.
 */
enum { FOLD_2048, FOLD_1536, FOLD_1024, FOLD_512, FOLD_384, FOLD_256, FOLD_128, FOLD_DISTANCES };
static const unsigned fold_bits[FOLD_DISTANCES] = { 2048, 1536, 1024, 512, 384, 256, 128 };
/* fold_k[d] = { x^(bits+31) mod P, x^(bits-33) mod P }: the multipliers of a lane's low and high halves. */
static uint64_t fold_k[FOLD_DISTANCES][2];

/* Mixed rounds (mixed_round): RS_CRC_MIXED_STEPS steps, each folding 256 bytes and adding RS_CRC_MIXED_WORDS
 * words to each of RS_CRC_LANES crc32 lanes; the folded part comes first in the round, the lanes after it. */
#define RS_CRC_MIXED_STEPS 64
#define RS_CRC_MIXED_WORDS 5
#define RS_CRC_MIXED_FOLD (256 * RS_CRC_MIXED_STEPS)
#define RS_CRC_MIXED_LANE (8 * RS_CRC_MIXED_WORDS * RS_CRC_MIXED_STEPS)
#define RS_CRC_MIXED_ROUND (RS_CRC_MIXED_FOLD + RS_CRC_LANES * RS_CRC_MIXED_LANE)
/* mixed_shift[j] moves lane j (j < 5) past the lanes after it; mixed_shift[5] moves the folded part past all. */
static uint32_t mixed_shift[RS_CRC_LANES];

/* a * x mod P, reflected: the coefficient of x^31 sits in bit 0 and overflows into P's low terms. */
static uint32_t gf2_times_x(uint32_t a)
{
    return (a >> 1) ^ (CRC32C_POLY_REFLECTED & (0u - (a & 1u)));
}

/* a * b mod P, reflected (Horner over a's coefficients, highest degree first). */
static uint32_t gf2_mulmod(uint32_t a, uint32_t b)
{
    uint32_t acc = 0;
    for (int bit = 0; bit < 32; bit++)
        acc = gf2_times_x(acc) ^ (((a >> bit) & 1u) ? b : 0u);
    return acc;
}

/* x^n mod P, reflected (x^0 is bit 31). */
static uint32_t gf2_xpow(uint64_t n)
{
    uint32_t result = 0x80000000u, square = 0x40000000u;
    for (; n; n >>= 1) {
        if (n & 1)
            result = gf2_mulmod(result, square);
        square = gf2_mulmod(square, square);
    }
    return result;
}
#endif

static void build_tables(void)
{
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++)
            crc = (crc >> 1) ^ (CRC32C_POLY_REFLECTED & (0u - (crc & 1u)));
        slice_table[0][byte] = crc;
    }
    /* slice_table[k][b]: the CRC contribution of byte b followed by k zero
     * bytes, which lets eight input bytes be folded with eight lookups. */
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = slice_table[0][byte];
        for (int k = 1; k < 8; k++) {
            crc = (crc >> 8) ^ slice_table[0][crc & 0xff];
            slice_table[k][byte] = crc;
        }
    }
#ifdef RS_CRC32C_HAVE_X86_HW
    for (size_t size = 0; size < RS_CRC_LANE_SIZES; size++)
        for (int lane = 0; lane < RS_CRC_LANES - 1; lane++)
            lane_shift[size][lane] = gf2_xpow(8 * (uint64_t)lane_block[size] * (RS_CRC_LANES - 1 - lane) - 33);
    for (int lane = 0; lane < RS_CRC_LANES - 1; lane++)
        mixed_shift[lane] = gf2_xpow(8 * (uint64_t)RS_CRC_MIXED_LANE * (RS_CRC_LANES - 1 - lane) - 33);
    mixed_shift[RS_CRC_LANES - 1] = gf2_xpow(8 * (uint64_t)RS_CRC_MIXED_LANE * RS_CRC_LANES - 33);
    for (int d = 0; d < FOLD_DISTANCES; d++) {
        fold_k[d][0] = gf2_xpow(fold_bits[d] + 31);
        fold_k[d][1] = gf2_xpow(fold_bits[d] - 33);
    }
#endif
}

static bool tables_ready(void)
{
    int state = __atomic_load_n(&tables_state, __ATOMIC_ACQUIRE);
    if (RS_LIKELY(state == TABLES_READY))
        return true;
    int expected = TABLES_EMPTY;
    if (state == TABLES_EMPTY &&
        __atomic_compare_exchange_n(&tables_state, &expected, TABLES_BUILDING, false,
                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        build_tables();
        __atomic_store_n(&tables_state, TABLES_READY, __ATOMIC_RELEASE);
        return true;
    }
    return false;
}

static uint32_t crc_bitwise(uint32_t state, const uint8_t *p, size_t len)
{
    while (len--) {
        state ^= *p++;
        for (int bit = 0; bit < 8; bit++)
            state = (state >> 1) ^ (CRC32C_POLY_REFLECTED & (0u - (state & 1u)));
    }
    return state;
}

uint32_t rs_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t state = ~crc;

    if (!tables_ready())
        return ~crc_bitwise(state, p, len);

    /* Byte steps up to 8-byte alignment so the main loop reads whole words. */
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        state = (state >> 8) ^ slice_table[0][(state ^ *p++) & 0xff];
        len--;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, sizeof(word));
        word ^= state;
        state = slice_table[7][word & 0xff] ^
                slice_table[6][(word >> 8) & 0xff] ^
                slice_table[5][(word >> 16) & 0xff] ^
                slice_table[4][(word >> 24) & 0xff] ^
                slice_table[3][(word >> 32) & 0xff] ^
                slice_table[2][(word >> 40) & 0xff] ^
                slice_table[1][(word >> 48) & 0xff] ^
                slice_table[0][word >> 56];
        p += 8;
        len -= 8;
    }
#endif
    while (len > 0) {
        state = (state >> 8) ^ slice_table[0][(state ^ *p++) & 0xff];
        len--;
    }
    return ~state;
}

#ifdef RS_CRC32C_HAVE_X86_HW
/* One dependent chain over a raw state (no inversions): bytes up to 8-byte alignment, words, tail bytes. */
__attribute__((target("sse4.2")))
static uint32_t hw_chain(uint32_t state, const uint8_t *p, size_t len)
{
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        state = _mm_crc32_u8(state, *p++);
        len--;
    }
    uint64_t wide = state;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, sizeof(word));
        wide = _mm_crc32_u64(wide, word);
        p += 8;
        len -= 8;
    }
    state = (uint32_t)wide;
    while (len > 0) {
        state = _mm_crc32_u8(state, *p++);
        len--;
    }
    return state;
}

uint32_t rs_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    return ~hw_chain(~crc, buf, len);
}

bool rs_crc32c_hw_available(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

/* The carry-less product of two 32-bit reflected values: their product times x, as a 64-bit reflected value. */
__attribute__((target("sse4.2,pclmul")))
static inline uint64_t clmul32(uint32_t a, uint32_t b)
{
    __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)b), 0x00);
    return (uint64_t)_mm_cvtsi128_si64(product);
}

static inline uint64_t load_word(const uint8_t *p)
{
    uint64_t word;
    memcpy(&word, p, sizeof(word));
    return word;
}

/*
 * One round: RS_CRC_LANES adjacent blocks of block bytes each (p 8-byte aligned). Lane 0 continues state, the
 * others start at 0; each lane but the last is then multiplied past the blocks that follow it. The products are
 * added before the one reduction (crc32_u64 of their sum), since reduction is linear.
 */
__attribute__((target("sse4.2,pclmul")))
static uint32_t lanes_round(uint32_t state, const uint8_t *p, size_t block, const uint32_t *shift)
{
    uint64_t c0 = state, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0;
    const uint8_t *p1 = p + block, *p2 = p1 + block, *p3 = p2 + block, *p4 = p3 + block, *p5 = p4 + block;
    for (size_t i = 0; i < block; i += 8) {
        c0 = _mm_crc32_u64(c0, load_word(p + i));
        c1 = _mm_crc32_u64(c1, load_word(p1 + i));
        c2 = _mm_crc32_u64(c2, load_word(p2 + i));
        c3 = _mm_crc32_u64(c3, load_word(p3 + i));
        c4 = _mm_crc32_u64(c4, load_word(p4 + i));
        c5 = _mm_crc32_u64(c5, load_word(p5 + i));
    }
    uint64_t moved = clmul32((uint32_t)c0, shift[0]) ^ clmul32((uint32_t)c1, shift[1]) ^
                     clmul32((uint32_t)c2, shift[2]) ^ clmul32((uint32_t)c3, shift[3]) ^
                     clmul32((uint32_t)c4, shift[4]);
    return (uint32_t)_mm_crc32_u64(0, moved) ^ (uint32_t)c5;
}
_Static_assert(RS_CRC_LANES == 6, "lanes_round and mixed_round spell out six lanes");

__attribute__((target("sse4.2,pclmul")))
uint32_t rs_crc32c_hw_lanes(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t state = ~crc;
    if (len < RS_CRC_LANES * lane_block[RS_CRC_LANE_SIZES - 1] || !tables_ready())
        return ~hw_chain(state, p, len);
    while (((uintptr_t)p & 7) != 0) {
        state = _mm_crc32_u8(state, *p++);
        len--;
    }
    for (size_t size = 0; size < RS_CRC_LANE_SIZES; size++) {
        size_t round = RS_CRC_LANES * lane_block[size];
        while (len >= round) {
            state = lanes_round(state, p, lane_block[size], lane_shift[size]);
            p += round;
            len -= round;
        }
    }
    return ~hw_chain(state, p, len);
}

bool rs_crc32c_hw_lanes_available(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
}

#define RS_CRC_FOLD_TARGET "sse4.2,pclmul,avx512f,vpclmulqdq"

/* Every 128-bit lane of acc moved by the distance whose multipliers k holds (per lane). */
__attribute__((target(RS_CRC_FOLD_TARGET)))
static inline __m512i fold_lanes(__m512i acc, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(acc, k, 0x00), _mm512_clmulepi64_epi128(acc, k, 0x11));
}

/* The same, with the next data XORed in (one vpternlog). */
__attribute__((target(RS_CRC_FOLD_TARGET)))
static inline __m512i fold_lanes_in(__m512i acc, __m512i k, const uint8_t *next)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00), _mm512_clmulepi64_epi128(acc, k, 0x11),
                                     _mm512_loadu_si512(next), 0x96);
}

__attribute__((target(RS_CRC_FOLD_TARGET)))
static inline __m512i fold_const(int distance)
{
    return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)fold_k[distance][1], (long long)fold_k[distance][0]));
}

/* The first 256 bytes at p as four accumulators, with the state so far added to the first 32 bits (crc32c's
 * linearity, as in the lanes). */
__attribute__((target(RS_CRC_FOLD_TARGET)))
static inline void fold_start(__m512i x[4], uint32_t state, const uint8_t *p)
{
    x[0] = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)state)));
    x[1] = _mm512_loadu_si512(p + 64);
    x[2] = _mm512_loadu_si512(p + 128);
    x[3] = _mm512_loadu_si512(p + 192);
}

/* The four accumulators folded onto the last one: its lanes cover the last 64 bytes folded so far. */
__attribute__((target(RS_CRC_FOLD_TARGET)))
static inline __m512i fold_merge(const __m512i x[4])
{
    __m512i acc = _mm512_ternarylogic_epi64(fold_lanes(x[0], fold_const(FOLD_1536)),
                                            fold_lanes(x[1], fold_const(FOLD_1024)),
                                            fold_lanes(x[2], fold_const(FOLD_512)), 0x96);
    return _mm512_xor_si512(acc, x[3]);
}

/* The four 128-bit lanes of acc folded onto the last (whose multipliers are zero: it stays where it is), and the
 * 128 bits left turned into the crc32 state after the data folded so far. */
__attribute__((target(RS_CRC_FOLD_TARGET)))
static inline uint32_t fold_finish(__m512i acc)
{
    __m512i to_last = _mm512_set_epi64(0, 0, (long long)fold_k[FOLD_128][1], (long long)fold_k[FOLD_128][0],
                                       (long long)fold_k[FOLD_256][1], (long long)fold_k[FOLD_256][0],
                                       (long long)fold_k[FOLD_384][1], (long long)fold_k[FOLD_384][0]);
    __m512i moved = fold_lanes(acc, to_last);
    __m128i lanes01 = _mm_xor_si128(_mm512_extracti32x4_epi32(moved, 0), _mm512_extracti32x4_epi32(moved, 1));
    __m128i lanes23 = _mm_xor_si128(_mm512_extracti32x4_epi32(moved, 2), _mm512_extracti32x4_epi32(acc, 3));
    __m128i last = _mm_xor_si128(lanes01, lanes23);
    uint64_t first_half = (uint64_t)_mm_cvtsi128_si64(last);
    uint64_t second_half = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(last, last));
    return (uint32_t)_mm_crc32_u64(_mm_crc32_u64(0, first_half), second_half);
}

/*
 * A mixed round: the carry-less multiplier and the crc32 unit are separate execution units, so one loop keeps
 * both busy: each step folds 256 bytes of the round's first part and adds RS_CRC_MIXED_WORDS words to each of six
 * crc32 lanes over its second part. The folded part becomes a state, which is then moved past the lanes like lane
 * 0 of lanes_round.
 */
__attribute__((target(RS_CRC_FOLD_TARGET)))
static uint32_t mixed_round(uint32_t state, const uint8_t *p)
{
    const uint8_t *q0 = p + RS_CRC_MIXED_FOLD, *q1 = q0 + RS_CRC_MIXED_LANE, *q2 = q1 + RS_CRC_MIXED_LANE,
                  *q3 = q2 + RS_CRC_MIXED_LANE, *q4 = q3 + RS_CRC_MIXED_LANE, *q5 = q4 + RS_CRC_MIXED_LANE;
    uint64_t c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0;
    __m512i x[4];
    fold_start(x, state, p);
    __m512i k = fold_const(FOLD_2048);
    for (size_t step = 0; step < RS_CRC_MIXED_STEPS; step++) {
        if (step > 0) {
            const uint8_t *f = p + 256 * step;
            x[0] = fold_lanes_in(x[0], k, f);
            x[1] = fold_lanes_in(x[1], k, f + 64);
            x[2] = fold_lanes_in(x[2], k, f + 128);
            x[3] = fold_lanes_in(x[3], k, f + 192);
        }
        size_t at = step * 8 * RS_CRC_MIXED_WORDS;
        for (size_t w = at; w < at + 8 * RS_CRC_MIXED_WORDS; w += 8) {
            c0 = _mm_crc32_u64(c0, load_word(q0 + w));
            c1 = _mm_crc32_u64(c1, load_word(q1 + w));
            c2 = _mm_crc32_u64(c2, load_word(q2 + w));
            c3 = _mm_crc32_u64(c3, load_word(q3 + w));
            c4 = _mm_crc32_u64(c4, load_word(q4 + w));
            c5 = _mm_crc32_u64(c5, load_word(q5 + w));
        }
    }
    uint32_t folded = fold_finish(fold_merge(x));
    uint64_t moved = clmul32(folded, mixed_shift[RS_CRC_LANES - 1]) ^ clmul32((uint32_t)c0, mixed_shift[0]) ^
                     clmul32((uint32_t)c1, mixed_shift[1]) ^ clmul32((uint32_t)c2, mixed_shift[2]) ^
                     clmul32((uint32_t)c3, mixed_shift[3]) ^ clmul32((uint32_t)c4, mixed_shift[4]);
    return (uint32_t)_mm_crc32_u64(0, moved) ^ (uint32_t)c5;
}

/*
 * Mixed rounds while a whole one fits; then the rest folded alone (four accumulators of 256 bytes, merged, 64-byte
 * steps while they fit) when it is long enough; the last bytes in one chain. Under RS_CRC_FOLD_MIN the lanes (or
 * their single chain) are faster than setting up and reducing the accumulators.
 */
#define RS_CRC_FOLD_MIN 512
__attribute__((target(RS_CRC_FOLD_TARGET)))
uint32_t rs_crc32c_hw_fold(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t state = ~crc;
    if (len < RS_CRC_FOLD_MIN || !tables_ready())
        return rs_crc32c_hw_lanes(crc, buf, len);
    while (len >= RS_CRC_MIXED_ROUND) {
        state = mixed_round(state, p);
        p += RS_CRC_MIXED_ROUND;
        len -= RS_CRC_MIXED_ROUND;
    }
    if (len >= RS_CRC_FOLD_MIN) {
        __m512i x[4];
        fold_start(x, state, p);
        p += 256;
        len -= 256;
        __m512i k = fold_const(FOLD_2048);
        while (len >= 256) {
            x[0] = fold_lanes_in(x[0], k, p);
            x[1] = fold_lanes_in(x[1], k, p + 64);
            x[2] = fold_lanes_in(x[2], k, p + 128);
            x[3] = fold_lanes_in(x[3], k, p + 192);
            p += 256;
            len -= 256;
        }
        __m512i acc = fold_merge(x);
        k = fold_const(FOLD_512);
        while (len >= 64) {
            acc = fold_lanes_in(acc, k, p);
            p += 64;
            len -= 64;
        }
        state = fold_finish(acc);
    }
    return ~hw_chain(state, p, len);
}

bool rs_crc32c_hw_fold_available(void)
{
    __builtin_cpu_init();
    return rs_crc32c_hw_lanes_available() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("vpclmulqdq");
}
#else
uint32_t rs_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    return rs_crc32c_sw(crc, buf, len);
}

bool rs_crc32c_hw_available(void)
{
    return false;
}

uint32_t rs_crc32c_hw_lanes(uint32_t crc, const void *buf, size_t len)
{
    return rs_crc32c_sw(crc, buf, len);
}

bool rs_crc32c_hw_lanes_available(void)
{
    return false;
}

uint32_t rs_crc32c_hw_fold(uint32_t crc, const void *buf, size_t len)
{
    return rs_crc32c_sw(crc, buf, len);
}

bool rs_crc32c_hw_fold_available(void)
{
    return false;
}
#endif

typedef uint32_t (*crc_impl_fn)(uint32_t, const void *, size_t);
static crc_impl_fn selected_impl;

static crc_impl_fn select_impl(void)
{
    crc_impl_fn impl = rs_crc32c_hw_fold_available()    ? rs_crc32c_hw_fold
                       : rs_crc32c_hw_lanes_available() ? rs_crc32c_hw_lanes
                       : rs_crc32c_hw_available()       ? rs_crc32c_hw
                                                        : rs_crc32c_sw;
    __atomic_store_n(&selected_impl, impl, __ATOMIC_RELAXED);
    return impl;
}

/* Select early so the first caller on a hot path does not pay for it. */
__attribute__((constructor))
static void crc32c_init(void)
{
    select_impl();
    tables_ready();
}

uint32_t rs_crc32c(uint32_t crc, const void *buf, size_t len)
{
    crc_impl_fn impl = __atomic_load_n(&selected_impl, __ATOMIC_RELAXED);
    if (RS_UNLIKELY(impl == NULL))
        impl = select_impl();
    return impl(crc, buf, len);
}

void rs_crc32c_wire_put(uint8_t out[4], uint32_t crc)
{
    out[0] = (uint8_t)crc;
    out[1] = (uint8_t)(crc >> 8);
    out[2] = (uint8_t)(crc >> 16);
    out[3] = (uint8_t)(crc >> 24);
}

uint32_t rs_crc32c_wire_get(const uint8_t in[4])
{
    return (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 |
           (uint32_t)in[3] << 24;
}
