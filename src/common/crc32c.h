/*
 * CRC32c (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
 * SCTP and iWARP MPA.
 *
 * rs_crc32c() is a running CRC: start with crc = 0, feed the data in any
 * number of pieces, and the returned value is already the final CRC (the
 * pre- and post-inversion are done inside). So
 *   rs_crc32c(rs_crc32c(0, a, n), b, m) == rs_crc32c(0, a||b, n+m)
 * and rs_crc32c(0, 32 zero bytes, 32) == 0x8a9136aa (RFC 3720 B.4).
 *
 * The SSE4.2 crc32 instruction is used when the CPU has it (checked once at
 * run time): for buffers of a few hundred bytes and more in several
 * independent chains merged with pclmul when the CPU also has pclmul, and
 * from 512 bytes with 512-bit carry-less folding running alongside such
 * chains when it has AVX-512 and VPCLMULQDQ; without SSE4.2 a slicing-by-8
 * table implementation. All are safe to call from any thread and from signal
 * handlers.
 */
#ifndef RS_COMMON_CRC32C_H
#define RS_COMMON_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

uint32_t rs_crc32c(uint32_t crc, const void *buf, size_t len);

/*
 * Stores a CRC in the byte order iWARP MPA puts on the wire (RFC 5044 §4,
 * checked against Linux siw and Wireshark, see research/wire-formats.md
 * §2.3): the final CRC value is sent least significant byte first, as in
 * iSCSI. E.g. 0x8a9136aa is sent as aa 36 91 8a.
 */
void rs_crc32c_wire_put(uint8_t out[4], uint32_t crc);
/* Inverse of rs_crc32c_wire_put, for checking a received CRC. */
uint32_t rs_crc32c_wire_get(const uint8_t in[4]);

/* Individual implementations, for tests and benchmarks. rs_crc32c_hw (one
 * chain of crc32 instructions) must only be called when
 * rs_crc32c_hw_available() is true, rs_crc32c_hw_lanes (several chains merged
 * with pclmul; one chain below a few hundred bytes) only when
 * rs_crc32c_hw_lanes_available() is true, rs_crc32c_hw_fold (folding with
 * VPCLMULQDQ next to lanes; the lanes below 512 bytes) only when
 * rs_crc32c_hw_fold_available() is true. rs_crc32c uses the fastest one. */
uint32_t rs_crc32c_sw(uint32_t crc, const void *buf, size_t len);
uint32_t rs_crc32c_hw(uint32_t crc, const void *buf, size_t len);
bool rs_crc32c_hw_available(void);
uint32_t rs_crc32c_hw_lanes(uint32_t crc, const void *buf, size_t len);
bool rs_crc32c_hw_lanes_available(void);
uint32_t rs_crc32c_hw_fold(uint32_t crc, const void *buf, size_t len);
bool rs_crc32c_hw_fold_available(void);

#endif /* RS_COMMON_CRC32C_H */
