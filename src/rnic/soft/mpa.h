/*
 * mpa.h: the wire logic of the soft RNIC's RC half that needs no socket and no QP: MPA connection setup
 * (RFC 5044 Request/Reply, RFC 6581 enhanced mode with IRD/ORD), FPDU framing and its CRC32c, and the DDP/RDMAP
 * segment headers carried inside FPDUs (RFC 5041/5040) with the validation a receiver must do before it places
 * a byte, plus the Terminate message that reports a failed validation.
 *
 * Byte layouts and constants live in iwarp_wire.h (shared with the datagram half); this file adds the RC-only
 * encoders, parsers and negotiation rules. Every parser takes a length and never reads past it.
 *
 * Policy decided here (documented in docs/rnic-rc.md):
 *   - We never ask for markers; a Request that asks for them is answered with a Reply that has R set, and the
 *     connection is closed. A Reply that asks us for markers fails the connection the same way.
 *   - We always ask for CRC, so CRC is in force on every connection (RFC 5044: used if either side asks).
 *   - We speak MPA rev 2 with the Enhanced flag (IRD/ORD exchange) by default and fall back to rev 1 when the
 *     peer does; rev 1 connections assume the peer's IRD equals our ORD limit (there is nothing to negotiate).
 *   - Peer-to-peer mode (RTR messages) is not offered; a Request asking for it gets a Reply without P2P.
 */
#ifndef RS_RNIC_SOFT_MPA_H
#define RS_RNIC_SOFT_MPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "rnic/soft/iwarp_wire.h"

/* ---- MPA Request / Reply ---------------------------------------------------------------------------------- */

#define RS_MPA_REQREP_MAX (RS_MPA_REQREP_HDR_LEN + RS_MPA_MAX_PRIVATE_DATA)
/* ULP private data that fits next to the 4-byte IRD/ORD block of an enhanced frame. */
#define RS_MPA_MAX_ULP_PRIVATE_DATA (RS_MPA_MAX_PRIVATE_DATA - RS_MPA_V2_IRD_ORD_LEN)
/* IRD/ORD are 14-bit fields on the wire. */
#define RS_MPA_MAX_IRD_ORD RS_MPA_V2_IRD_ORD_MASK

enum rs_mpa_rtr {                   /* RFC 6581 ready-to-receive message kinds (P2P mode) */
    RS_MPA_RTR_ZERO_SEND = 1u << 0,
    RS_MPA_RTR_WRITE = 1u << 1,
    RS_MPA_RTR_READ = 1u << 2,
};

/* One Request or Reply, decoded. */
struct rs_mpa_frame {
    bool reply;
    uint8_t rev;
    bool markers;                   /* M: the sender wants markers in the FPDUs it receives */
    bool crc;                       /* C */
    bool reject;                    /* R (reply only) */
    bool enhanced;                  /* rev 2 with the Enhanced flag: the fields below are on the wire */
    bool p2p;
    unsigned rtr;                   /* enum rs_mpa_rtr */
    uint16_t ird, ord;
    const uint8_t *pd;              /* ULP private data (after the IRD/ORD block), not owned */
    uint16_t pd_len;
};

/*
 * Encodes f into out. Returns the frame length, -EMSGSIZE if the private data (plus the IRD/ORD block) exceeds
 * 512 bytes or out is smaller than the frame, -EINVAL for a revision other than 1 or 2, IRD/ORD above 14 bits,
 * or an enhanced frame with rev 1.
 */
int rs_mpa_frame_encode(const struct rs_mpa_frame *f, uint8_t *out, size_t cap);

/*
 * Looks at the first bytes of an expected Request (reply == false) or Reply. Returns the whole frame length
 * (20 + PD_Length) once the 20-byte header is there, -EAGAIN while fewer than 20 bytes are available, -EPROTO if
 * the key is not the expected one (a peer that is not MPA, or an FPDU), -EMSGSIZE if PD_Length exceeds 512.
 */
int rs_mpa_frame_length(const uint8_t *buf, size_t len, bool reply);

/*
 * Decodes a whole frame (len must equal rs_mpa_frame_length). Checks the key, the length, and the revision
 * (0 and above 2 give -EPROTONOSUPPORT, with *f still filled so a Reply can be built); an enhanced frame whose
 * private data is shorter than the IRD/ORD block gives -EPROTO. f->pd points into buf.
 */
int rs_mpa_frame_parse(const uint8_t *buf, size_t len, bool reply, struct rs_mpa_frame *f);

/* What this end offers. */
struct rs_mpa_local {
    uint8_t rev;                    /* 1 or 2: the highest revision we send */
    bool crc;                       /* we ask for FPDU CRCs (the peer may still ask: one side asking is enough) */
    uint16_t ird, ord;              /* our limits: Read Requests we accept / issue concurrently */
};

/* What is in force once both frames were exchanged. */
struct rs_mpa_result {
    uint8_t rev;
    bool crc;
    uint16_t ird;                   /* inbound Read Requests we must serve concurrently */
    uint16_t ord;                   /* outbound Read Requests we may have in flight */
};

/* Initiator: fills the Request for our limits and private data. */
void rs_mpa_request_init(struct rs_mpa_frame *req, const struct rs_mpa_local *local, const void *pd,
                         uint16_t pd_len);

/*
 * Responder: decides on a parsed Request. Returns 0 if it can be accepted (the application may still reject it)
 * and fills *result; otherwise a negative errno: -EPROTONOSUPPORT (markers wanted, unsupported revision) after
 * which the Reply must carry R and the connection closes. *term_ecode gets the LLP error code that explains it.
 */
int rs_mpa_responder_negotiate(const struct rs_mpa_frame *req, const struct rs_mpa_local *local,
                               struct rs_mpa_result *result, uint8_t *term_ecode);

/*
 * Responder: fills the Reply to req. With reject set, R is set and result may be NULL. The revision echoes the
 * Request's (capped at ours); an enhanced Request gets an enhanced Reply carrying our IRD/ORD.
 */
void rs_mpa_reply_init(struct rs_mpa_frame *rep, const struct rs_mpa_frame *req, const struct rs_mpa_local *local,
                       const struct rs_mpa_result *result, bool reject, const void *pd, uint16_t pd_len);

/*
 * Initiator: checks the Reply to our Request. Returns 0 and fills *result when the connection is up,
 * -ECONNREFUSED if the responder set R (its private data is in rep), -EPROTO if the Reply is not acceptable
 * (a higher revision than asked, markers wanted, an enhanced Reply to a rev 1 Request).
 */
int rs_mpa_initiator_negotiate(const struct rs_mpa_frame *req, const struct rs_mpa_frame *rep,
                               const struct rs_mpa_local *local, struct rs_mpa_result *result);

/* ---- FPDU framing ----------------------------------------------------------------------------------------- */

/* Bytes an FPDU adds around a ULPDU of len bytes: length field, pad, CRC. */
static inline size_t rs_mpa_fpdu_len(size_t ulpdu_len)
{
    return RS_MPA_LEN_FIELD + ulpdu_len + rs_mpa_pad(ulpdu_len) + RS_MPA_CRC_LEN;
}
/* The ULPDU_Length field is 16 bits; the smallest legal ULPDU is a tagged DDP header. */
#define RS_MPA_MAX_ULPDU 65535u
#define RS_MPA_TRAILER_MAX (3 + RS_MPA_CRC_LEN)

/* Continues a running CRC32c (rs_crc32c convention) over the pieces of an iovec. */
uint32_t rs_mpa_crc_iov(uint32_t crc, const struct iovec *iov, int iovcnt);

/*
 * Writes the pad and CRC trailer of an FPDU into out (3 + 4 bytes at most). crc is the running CRC over the
 * length field and the ULPDU; the pad bytes are zero and covered by the CRC. Returns the trailer length.
 */
size_t rs_mpa_fpdu_trailer(uint8_t out[RS_MPA_TRAILER_MAX], size_t ulpdu_len, uint32_t crc);

/* Builds a whole FPDU around a contiguous ULPDU (control messages, tests). Returns its length or -EMSGSIZE. */
int rs_mpa_fpdu_build(uint8_t *out, size_t cap, const uint8_t *ulpdu, size_t ulpdu_len);

/*
 * Checks one FPDU at the start of buf: returns its total length if it is complete and its CRC is right,
 * -EAGAIN if buf holds less than the whole FPDU, -EBADMSG on a CRC mismatch. *ulpdu and *ulpdu_len give the
 * ULPDU on success.
 */
int rs_mpa_fpdu_check(const uint8_t *buf, size_t len, const uint8_t **ulpdu, size_t *ulpdu_len);

/* ---- DDP / RDMAP segments --------------------------------------------------------------------------------- */

/* Why a segment is refused: what goes into the Terminate. */
struct rs_term_cause {
    uint8_t layer;                  /* enum rs_term_layer */
    uint8_t etype;
    uint8_t ecode;
};

/* The largest DDP+RDMAP header a segment can start with (untagged + Read Request). */
#define RS_DDP_MAX_HDR_LEN (RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN)
/* Terminate message: header + control word + DDP segment length + the largest terminated headers. */
#define RS_TERM_MAX_LEN (RS_DDP_UNTAGGED_HDR_LEN + RS_TERM_HDR_LEN + 2 + RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN)

struct rs_rdmap_read_req {
    uint32_t sink_stag;
    uint64_t sink_to;
    uint32_t size;
    uint32_t src_stag;
    uint64_t src_to;
};

/* A decoded DDP segment header (and the RDMAP header that follows it for Read Request and Terminate). */
struct rs_ddp_seg {
    struct rs_ddp_ctrl ctrl;
    size_t hdr_len;                 /* bytes of header before the payload */
    size_t payload_len;             /* ULPDU length minus hdr_len */
    /* tagged */
    uint32_t stag;
    uint64_t to;
    /* untagged */
    uint32_t inval_stag;            /* Send with Invalidate: the STag to invalidate (RsvdULP) */
    uint32_t qn, msn, mo;
    struct rs_rdmap_read_req rr;    /* Read Request */
    uint32_t term_word;             /* Terminate: layer/etype/ecode/flags */
};

/*
 * The header length a segment starting with these two control bytes has (14 tagged, 18 untagged, 46 for a
 * Read Request, 22 for a Terminate). A receiver reads this many bytes before calling rs_ddp_seg_parse.
 * Unknown opcodes give the plain tagged/untagged length; the parser then refuses them.
 */
size_t rs_ddp_hdr_len(const uint8_t ctrl[2]);

/*
 * Decodes and validates the header at p for a ULPDU of ulpdu_len bytes (p must hold rs_ddp_hdr_len bytes, or
 * ulpdu_len if that is less). Checks, in this order: DDP version, ULPDU long enough for its header, RDMAP
 * version, opcode known to RC and consistent with the T flag, queue number matching the opcode, single-segment
 * shape of Read Request and Terminate. Returns 0, or -EPROTO with *cause saying which Terminate to send.
 * Per-stream checks (MSN, MO, STags, bounds) are the receiver's: they need QP state.
 */
int rs_ddp_seg_parse(const uint8_t *p, size_t ulpdu_len, struct rs_ddp_seg *seg, struct rs_term_cause *cause);

/* Header builders: they write the DDP (and RDMAP) header into out and return its length. */
size_t rs_ddp_tagged_hdr(uint8_t out[RS_DDP_TAGGED_HDR_LEN], uint8_t opcode, bool last, uint32_t stag, uint64_t to);
size_t rs_ddp_untagged_hdr(uint8_t out[RS_DDP_UNTAGGED_HDR_LEN], uint8_t opcode, bool last, uint32_t inval_stag,
                           uint32_t qn, uint32_t msn, uint32_t mo);
size_t rs_rdmap_read_req_hdr(uint8_t out[RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN], uint32_t msn,
                             const struct rs_rdmap_read_req *rr);

/*
 * Builds a Terminate ULPDU (untagged, QN 2, MSN msn, L set) for cause. When the offending segment's header is
 * known, pass it with its ULPDU length: it is copied after the control word (M and D set; R too when it is a
 * whole Read Request header). offending may be NULL. Returns the ULPDU length (at most RS_TERM_MAX_LEN).
 */
size_t rs_term_build(uint8_t out[RS_TERM_MAX_LEN], uint32_t msn, const struct rs_term_cause *cause,
                     const uint8_t *offending, size_t offending_len, uint16_t offending_ulpdu_len);

/* Decoded Terminate control word. */
static inline struct rs_term_cause rs_term_cause_of(uint32_t word)
{
    struct rs_term_cause c = {
        .layer = (uint8_t)(word >> 28), .etype = (uint8_t)((word >> 24) & 0xf), .ecode = (uint8_t)(word >> 16),
    };
    return c;
}

/* Human-readable cause, e.g. "DDP tagged buffer: invalid STag" (for logs and tests). */
const char *rs_term_cause_str(const struct rs_term_cause *cause);

#endif /* RS_RNIC_SOFT_MPA_H */
