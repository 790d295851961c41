/*
 * iwarp_wire.h: the bytes on the wire of the software RNIC, shared by its RC (MPA/DDP/RDMAP over TCP) and
 * datagram (DDP/RDMAP over UDP) halves. Layouts follow RFC 5044 (MPA), RFC 6581 (MPA v2), RFC 5041 (DDP) and
 * RFC 5040 (RDMAP) as documented in shared/research/wire-formats.md §2; the datagram additions (Write-Record)
 * are documented in docs/wire-formats.md.
 *
 * All multi-byte fields are big-endian except the CRC32c trailer, which is sent little-endian as in iSCSI
 * (rs_crc32c_wire_put). Headers are encoded and decoded field by field through these helpers, never by casting
 * packet bytes to structs, so unaligned or short input can never be misread.
 */
#ifndef RS_RNIC_SOFT_IWARP_WIRE_H
#define RS_RNIC_SOFT_IWARP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- byte order helpers ---- */

static inline void rs_put_be16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void rs_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void rs_put_be64(uint8_t *p, uint64_t v) { rs_put_be32(p, (uint32_t)(v >> 32)); rs_put_be32(p + 4, (uint32_t)v); }
static inline uint16_t rs_get_be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t rs_get_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t rs_get_be64(const uint8_t *p) { return ((uint64_t)rs_get_be32(p) << 32) | rs_get_be32(p + 4); }

/* ---- MPA (RFC 5044, RFC 6581) ---- */

#define RS_MPA_KEY_REQ "MPA ID Req Frame"
#define RS_MPA_KEY_REP "MPA ID Rep Frame"
#define RS_MPA_KEY_LEN 16
#define RS_MPA_REQREP_HDR_LEN 20            /* key(16) flags(1) rev(1) pd_length(2) */
#define RS_MPA_FLAG_MARKERS 0x80            /* M */
#define RS_MPA_FLAG_CRC 0x40                /* C */
#define RS_MPA_FLAG_REJECT 0x20             /* R (reply only) */
#define RS_MPA_FLAG_ENHANCED 0x10           /* RFC 6581 enhanced connection establishment */
#define RS_MPA_REV1 1
#define RS_MPA_REV2 2
#define RS_MPA_MAX_PRIVATE_DATA 512
#define RS_MPA_V2_IRD_ORD_LEN 4             /* first 4 bytes of private data with REV2 + ENHANCED */
#define RS_MPA_V2_PEER_TO_PEER 0x8000       /* in the IRD word */
#define RS_MPA_V2_ZERO_LEN_SEND_RTR 0x4000  /* in the IRD word */
#define RS_MPA_V2_WRITE_RTR 0x8000          /* in the ORD word */
#define RS_MPA_V2_READ_RTR 0x4000           /* in the ORD word */
#define RS_MPA_V2_IRD_ORD_MASK 0x3fff
#define RS_MPA_CRC_LEN 4
#define RS_MPA_LEN_FIELD 2                  /* ULPDU_Length before each FPDU */

/* Pad that makes (2 + ulpdu_len + pad) a multiple of 4. */
static inline unsigned rs_mpa_pad(size_t ulpdu_len) { return (unsigned)(-(ulpdu_len + RS_MPA_LEN_FIELD) & 3u); }

/* ---- DDP (RFC 5041) and RDMAP (RFC 5040) ---- */

#define RS_DDP_FLAG_TAGGED 0x80
#define RS_DDP_FLAG_LAST 0x40
#define RS_DDP_VERSION 1
#define RS_RDMAP_VERSION 1
#define RS_DDP_TAGGED_HDR_LEN 14            /* ctrl(2) stag(4) to(8) */
#define RS_DDP_UNTAGGED_HDR_LEN 18          /* ctrl(2) rsvdulp/inv-stag(4) qn(4) msn(4) mo(4) */

enum rs_rdmap_opcode {
    RS_RDMAP_WRITE = 0x0,
    RS_RDMAP_READ_REQUEST = 0x1,
    RS_RDMAP_READ_RESPONSE = 0x2,
    RS_RDMAP_SEND = 0x3,
    RS_RDMAP_SEND_INVALIDATE = 0x4,
    RS_RDMAP_SEND_SE = 0x5,
    RS_RDMAP_SEND_SE_INVALIDATE = 0x6,
    RS_RDMAP_TERMINATE = 0x7,
    /* 0x8-0xC belong to RFC 7306 (Write with Immediate, Immediate Data, Atomics); 0xD is unassigned by any RFC:
     * rdmasock uses it for datagram RDMA Write-Record (tagged, UD only; see docs/wire-formats.md). */
    RS_RDMAP_WRITE_RECORD = 0xD,
};

enum rs_ddp_queue {                         /* untagged queue numbers used by RDMAP */
    RS_DDP_QN_SEND = 0,
    RS_DDP_QN_READ_REQUEST = 1,
    RS_DDP_QN_TERMINATE = 2,
};

#define RS_RDMAP_READ_REQ_LEN 28            /* sink stag(4) sink to(8) size(4) src stag(4) src to(8) */

/* Decoded first two bytes of every DDP segment. */
struct rs_ddp_ctrl {
    bool tagged;
    bool last;
    uint8_t ddp_version;
    uint8_t rdmap_version;
    uint8_t opcode;
};

static inline void rs_ddp_ctrl_put(uint8_t *p, bool tagged, bool last, uint8_t opcode)
{
    p[0] = (uint8_t)((tagged ? RS_DDP_FLAG_TAGGED : 0) | (last ? RS_DDP_FLAG_LAST : 0) | RS_DDP_VERSION);
    p[1] = (uint8_t)((RS_RDMAP_VERSION << 6) | (opcode & 0x0f));
}

static inline struct rs_ddp_ctrl rs_ddp_ctrl_get(const uint8_t *p)
{
    struct rs_ddp_ctrl c = {
        .tagged = (p[0] & RS_DDP_FLAG_TAGGED) != 0,
        .last = (p[0] & RS_DDP_FLAG_LAST) != 0,
        .ddp_version = (uint8_t)(p[0] & 0x03),
        .rdmap_version = (uint8_t)(p[1] >> 6),
        .opcode = (uint8_t)(p[1] & 0x0f),
    };
    return c;
}

/* ---- Terminate (RFC 5040 §5.4) ---- */

enum rs_term_layer { RS_TERM_LAYER_RDMAP = 0, RS_TERM_LAYER_DDP = 1, RS_TERM_LAYER_LLP = 2 };

/* Error types (4 bits) per layer, RFC 5040 §7.1 / RFC 5041 §7.2. */
#define RS_TERM_RDMAP_ETYPE_LOCAL_CATASTROPHIC 0x0
#define RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION 0x1
#define RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION 0x2
#define RS_TERM_DDP_ETYPE_CATASTROPHIC 0x0
#define RS_TERM_DDP_ETYPE_TAGGED_BUFFER 0x1
#define RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER 0x2
#define RS_TERM_DDP_ETYPE_RSVD 0x3
#define RS_TERM_LLP_ETYPE_MPA 0x0

/* Error codes (8 bits). RDMAP, remote protection / operation: */
#define RS_TERM_RDMAP_INVALID_STAG 0x00
#define RS_TERM_RDMAP_BASE_BOUNDS 0x01
#define RS_TERM_RDMAP_ACCESS_RIGHTS 0x02
#define RS_TERM_RDMAP_STAG_PD_MISMATCH 0x03
#define RS_TERM_RDMAP_TO_WRAP 0x04
#define RS_TERM_RDMAP_INVALID_VERSION 0x05
#define RS_TERM_RDMAP_UNEXPECTED_OPCODE 0x06
#define RS_TERM_RDMAP_CATASTROPHIC_STREAM 0x07
#define RS_TERM_RDMAP_CATASTROPHIC_GLOBAL 0x08
#define RS_TERM_RDMAP_STAG_NOT_INVALIDATABLE 0x09
#define RS_TERM_RDMAP_UNSPECIFIED 0xff
/* DDP tagged buffer errors: */
#define RS_TERM_DDP_TAGGED_INVALID_STAG 0x00
#define RS_TERM_DDP_TAGGED_BASE_BOUNDS 0x01
#define RS_TERM_DDP_TAGGED_STAG_NOT_ASSOCIATED 0x02
#define RS_TERM_DDP_TAGGED_TO_WRAP 0x03
#define RS_TERM_DDP_TAGGED_INVALID_VERSION 0x04
/* DDP untagged buffer errors: */
#define RS_TERM_DDP_UNTAGGED_INVALID_QN 0x01
#define RS_TERM_DDP_UNTAGGED_INVALID_MSN_NO_BUFFER 0x02
#define RS_TERM_DDP_UNTAGGED_INVALID_MSN_RANGE 0x03
#define RS_TERM_DDP_UNTAGGED_INVALID_MO 0x04
#define RS_TERM_DDP_UNTAGGED_MSG_TOO_LONG 0x05
#define RS_TERM_DDP_UNTAGGED_INVALID_VERSION 0x06
/* LLP (MPA) errors: */
#define RS_TERM_LLP_TCP_LOST 0x01
#define RS_TERM_LLP_CRC 0x02
#define RS_TERM_LLP_MARKER 0x03
#define RS_TERM_LLP_BAD_REQ_REP 0x04
#define RS_TERM_LLP_LOCAL_CATASTROPHIC 0x05
#define RS_TERM_LLP_INSUFFICIENT_IRD 0x06
#define RS_TERM_LLP_NO_MATCHING_RTR 0x07

#define RS_TERM_HDR_LEN 4                   /* layer/etype/ecode/flags word after the untagged DDP header */
#define RS_TERM_FLAG_M 0x8000               /* DDP segment length was MPA-framed */
#define RS_TERM_FLAG_D 0x4000               /* the terminated DDP header follows */
#define RS_TERM_FLAG_R 0x2000               /* the terminated RDMAP (Read Request) header follows */

static inline uint32_t rs_term_word(enum rs_term_layer layer, unsigned etype, unsigned ecode, unsigned flags)
{
    return ((uint32_t)layer << 28) | ((uint32_t)(etype & 0xf) << 24) | ((uint32_t)(ecode & 0xff) << 16) |
           (flags & 0xe000u);
}

/*
 * RC half (note for the datagram half): the encoders, parsers and rules built on these layouts live in mpa.h:
 * MPA Request/Reply and IRD/ORD negotiation, FPDU framing and CRC, rs_ddp_seg_parse (header validation with the
 * Terminate cause of every refusal), rs_ddp_tagged_hdr / rs_ddp_untagged_hdr / rs_rdmap_read_req_hdr, and
 * rs_term_build (a whole Terminate ULPDU with the M/D/R header copies). mpa.c depends on nothing but this file and
 * common/crc32c, so the datagram half may use them too. Nothing above was changed by the RC half.
 */

#endif /* RS_RNIC_SOFT_IWARP_WIRE_H */
