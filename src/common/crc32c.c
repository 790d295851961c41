/*
 * CRC32c: slicing-by-8 software path and the SSE4.2 crc32 instruction path,
 * chosen once at run time. See crc32c.h for the conventions.
 */
#include "common/crc32c.h"

#include <string.h>

#include "common/compiler.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#define RS_CRC32C_HAVE_X86_HW 1
#endif

#define CRC32C_POLY_REFLECTED 0x82F63B78u

/*
 * Tables are computed on first use instead of being spelled out in the
 * source. Building them takes a few microseconds; callers that arrive while
 * another thread builds them use the bitwise loop for that call instead of
 * waiting, which keeps the function lock-free and signal-safe.
 */
enum { TABLES_EMPTY, TABLES_BUILDING, TABLES_READY };
static int tables_state = TABLES_EMPTY;
static uint32_t slice_table[8][256];

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
__attribute__((target("sse4.2")))
uint32_t rs_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t state = ~crc;
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
    return ~state;
}

bool rs_crc32c_hw_available(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
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
#endif

typedef uint32_t (*crc_impl_fn)(uint32_t, const void *, size_t);
static crc_impl_fn selected_impl;

static crc_impl_fn select_impl(void)
{
    crc_impl_fn impl = rs_crc32c_hw_available() ? rs_crc32c_hw : rs_crc32c_sw;
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
