/*
 * sdp_wire.h: SDP messages as they travel (IBTA Annex A4 layouts, all fields big-endian), encoders and validating
 * decoders. Pure functions, no state: the unit tests and a fuzz target can drive them directly.
 *
 * Every message on the QP starts with the 16-byte BSDH. The Hello and HelloAck travel in the connection's private
 * data instead; the Hello is cut to fit rdma_cm's 56 bytes (docs/sdp.md, "Hello in 56 bytes").
 */
#ifndef RS_SDP_STREAM_SDP_WIRE_H
#define RS_SDP_STREAM_SDP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RS_SDP_BSDH_LEN 16u

enum rs_sdp_mid {
    RS_SDP_MID_HELLO = 0x00,
    RS_SDP_MID_HELLO_ACK = 0x01,
    RS_SDP_MID_DISCONN = 0x02,
    RS_SDP_MID_ABORT = 0x03,
    RS_SDP_MID_SEND_SM = 0x04,
    RS_SDP_MID_RDMA_WR_COMPL = 0x05,
    RS_SDP_MID_RDMA_RD_COMPL = 0x06,
    RS_SDP_MID_MODE_CHANGE = 0x07,
    RS_SDP_MID_SRC_CANCEL = 0x08,
    RS_SDP_MID_SINK_CANCEL = 0x09,
    RS_SDP_MID_SINK_CANCEL_ACK = 0x0a,
    RS_SDP_MID_CH_RCVBUF = 0x0b,
    RS_SDP_MID_CH_RCVBUF_ACK = 0x0c,
    RS_SDP_MID_SUSPEND = 0x0d,
    RS_SDP_MID_SUSPEND_ACK = 0x0e,
    RS_SDP_MID_SINK_AVAIL = 0xfd,
    RS_SDP_MID_SRC_AVAIL = 0xfe,
    RS_SDP_MID_DATA = 0xff,
};

/* BSDH flags */
#define RS_SDP_FLAG_OOB_PRES 0x01u
#define RS_SDP_FLAG_OOB_PEND 0x02u
#define RS_SDP_FLAG_REQ_PIPE 0x04u

struct rs_sdp_bsdh {
    uint8_t mid;
    uint8_t flags;
    uint16_t bufs;          /* receive buffers the sender has posted for us (its credit advertisement) */
    uint32_t len;           /* whole message: BSDH + extended header + payload */
    uint32_t mseq;          /* this message's sequence number (first message on the QP: 1) */
    uint32_t mseq_ack;      /* last mseq the sender received and processed from us */
};

/* Extended headers (lengths on the wire). */
#define RS_SDP_SRCAH_LEN 16u     /* SrcAvail: len, rkey, vaddr */
#define RS_SDP_SINKAH_LEN 20u    /* SinkAvail: len, rkey, vaddr, non_disc */
#define RS_SDP_COMPL_LEN 4u      /* RdmaWrCompl (RWCH), RdmaRdCompl (RRCH): len */

struct rs_sdp_avail {           /* SrcAH / SinkAH */
    uint32_t len;
    uint32_t rkey;
    uint64_t vaddr;
    uint32_t non_disc;          /* SinkAH only */
};

/*
 * Hello (connect private data) in 56 bytes:
 *   0  BSDH (16)      mid 0x00, bufs = receive buffers posted, len = 48, mseq 0, mseq_ack 0
 *   16 HH, first 16 bytes exactly as Annex A4: majv_minv 0x22, ipv_cap (IP version << 4 | caps), rsvd,
 *      max_adverts, desremrcvsz (u32), localrcvsz (u32), port (u16), rsvd (u16)
 *   32 rdmasock extension (16) where the HH's src_addr would start (rdma_cm carries both addresses already):
 *      magic "RS" (u16 0x5253), ext_flags (u16), keepalive target rkey (u32), keepalive target vaddr (u64)
 * HelloAck (accept private data, 196 allowed):
 *   0  BSDH (16)      mid 0x01, bufs, len = 40
 *   16 HAH, first 8 bytes as Annex A4: majv_minv, ipv_cap, rsvd, ext_max_adverts, actrcvsz (u32)
 *   24 the same 16-byte rdmasock extension
 */
#define RS_SDP_VERSION 0x22u                /* major 2, minor 2 (OFED gen2) */
#define RS_SDP_HH_LEN 16u                   /* the part of the HH we send */
#define RS_SDP_HAH_LEN 8u
#define RS_SDP_EXT_LEN 16u
#define RS_SDP_HELLO_LEN (RS_SDP_BSDH_LEN + RS_SDP_HH_LEN + RS_SDP_EXT_LEN)          /* 48 */
#define RS_SDP_HELLO_ACK_LEN (RS_SDP_BSDH_LEN + RS_SDP_HAH_LEN + RS_SDP_EXT_LEN)     /* 40 */
#define RS_SDP_EXT_MAGIC 0x5253u            /* "RS" */

/* ipv_cap low nibble (Wireshark's Cap field) */
#define RS_SDP_CAP_INVALIDATE 0x1u

/* ext_flags */
#define RS_SDP_EXT_ZCOPY 0x1u               /* sender understands SrcAvail/SinkAvail and their cancels */
#define RS_SDP_EXT_HANDBACK 0x2u            /* sender can hand the connection back to TCP (SuspComm, docs/sdp.md) */
#define RS_SDP_EXT_SOLICITED 0x4u           /* sender marks every message solicited (a reader may sleep on those) */
#define RS_SDP_EXT_IMM_DATA 0x8u            /* sender takes compact Data: the BSDH in a SEND's immediate data */

struct rs_sdp_hello {
    struct rs_sdp_bsdh bsdh;
    uint8_t version;                /* majv_minv */
    uint8_t ip_version;             /* 4 or 6 */
    uint8_t caps;                   /* RS_SDP_CAP_* */
    uint8_t max_adverts;
    uint32_t desired_remote_rcv_size;   /* desremrcvsz (Hello only) */
    uint32_t rcv_size;              /* localrcvsz (Hello) / actrcvsz (HelloAck): each receive buffer, BSDH included */
    uint16_t port;                  /* Hello only */
    bool has_ext;                   /* the rdmasock extension was present */
    uint16_t ext_flags;             /* RS_SDP_EXT_* */
    uint32_t ka_rkey;               /* keepalive target: 8 readable bytes at the sender */
    uint64_t ka_addr;
};

void rs_sdp_bsdh_encode(const struct rs_sdp_bsdh *h, uint8_t out[RS_SDP_BSDH_LEN]);
/* 0, or -EBADMSG when fewer than 16 bytes. No semantic checks (see rs_sdp_msg_check). */
int rs_sdp_bsdh_decode(const uint8_t *buf, size_t len, struct rs_sdp_bsdh *out);

/*
 * Checks a received message of byte_len bytes: BSDH present, len equals byte_len, MID known and allowed on the QP,
 * extended header present for the MIDs that have one, no payload on control messages. Fills *h and, for
 * SrcAvail/SinkAvail, *avail, and for the completions *compl_len. Returns 0 or -EPROTO / -EBADMSG.
 */
int rs_sdp_msg_check(const uint8_t *buf, uint32_t byte_len, struct rs_sdp_bsdh *h, struct rs_sdp_avail *avail,
                     uint32_t *compl_len);

/* Header length (BSDH + extended header) of a message with this MID; 0 for an unknown MID. */
uint32_t rs_sdp_hdr_len(uint8_t mid);

/* Encoders: write the BSDH (and the extended header) into out, which must hold rs_sdp_hdr_len(mid) bytes.
 * h->len must already be the whole message length. */
void rs_sdp_avail_encode(const struct rs_sdp_bsdh *h, const struct rs_sdp_avail *a, uint8_t *out);
void rs_sdp_compl_encode(const struct rs_sdp_bsdh *h, uint32_t len, uint8_t *out);

/* SuspComm (0x0D): the BSDH and the SCH, a big-endian u64 "service ID" (for the hand-back: token << 16 | TCP
 * port, docs/sdp.md). decode reads it from a message rs_sdp_msg_check accepted. */
#define RS_SDP_SCH_LEN 8u
void rs_sdp_suspend_encode(const struct rs_sdp_bsdh *h, uint64_t service_id, uint8_t *out);
uint64_t rs_sdp_suspend_decode(const uint8_t *msg);

/* The hand-back's TCP header (docs/sdp.md, "Hand-back"), 24 bytes: magic "RSHB", version 1, 3 reserved, the token
 * (u64), the sender's residue length (u64), big-endian. decode: 0, or -EPROTO (not ours, wrong token, a length no
 * ring can hold) / -EBADMSG (short). */
#define RS_SDP_HB_HDR_LEN 24u
#define RS_SDP_HB_MAGIC 0x52534842u         /* "RSHB" */
#define RS_SDP_HB_VERSION 1u
#define RS_SDP_HB_MAX_RESIDUE (128ull << 20)
void rs_sdp_hb_hdr_encode(uint8_t out[RS_SDP_HB_HDR_LEN], uint64_t token, uint64_t residue);
int rs_sdp_hb_hdr_decode(const uint8_t *in, size_t len, uint64_t token, uint64_t *residue);

/* Hello / HelloAck; encode returns the length written (RS_SDP_HELLO_LEN / RS_SDP_HELLO_ACK_LEN). Decode accepts
 * longer private data (rdma_cm pads) and returns 0, -EPROTO (not SDP / wrong MID / unsupported major version) or
 * -EBADMSG (too short). */
size_t rs_sdp_hello_encode(const struct rs_sdp_hello *h, uint8_t *out, size_t cap);
int rs_sdp_hello_decode(const uint8_t *buf, size_t len, struct rs_sdp_hello *out);
size_t rs_sdp_hello_ack_encode(const struct rs_sdp_hello *h, uint8_t *out, size_t cap);
int rs_sdp_hello_ack_decode(const uint8_t *buf, size_t len, struct rs_sdp_hello *out);

/*
 * Compact Data (RS_SDP_EXT_IMM_DATA, docs/sdp.md "Compact Data"). A Data message with payload and no flags, to a
 * peer that announced the extension, may travel as a SEND_WITH_IMM of the payload alone; its BSDH rides in the
 * 32-bit immediate data:
 *   bits 31-20  bufs (0-4095)
 *   bits 19-0   the low 20 bits of mseq_ack
 * The receiver rebuilds the BSDH exactly: mid Data, flags 0, len 16 + the bytes received, mseq the next it expects
 * (RC delivers in order), and mseq_ack the latest number with those low bits that is not after the last mseq the
 * receiver sent (a peer cannot acknowledge more; fewer than 2^20 messages are ever unacknowledged, as credits bound
 * them). So every message still has its BSDH, 16 bytes fewer of it on the wire.
 */
#define RS_SDP_IMM_BUFS_MAX 0xfffu
#define RS_SDP_IMM_ACK_MASK 0xfffffu
/* The immediate for h, or false when h cannot be compact (not Data, flags, no payload, bufs over 4095). */
bool rs_sdp_imm_encode(const struct rs_sdp_bsdh *h, uint32_t *imm);
/* The BSDH of a compact Data message of payload_len bytes. */
void rs_sdp_imm_decode(uint32_t imm, uint32_t payload_len, uint32_t next_mseq, uint32_t last_sent_mseq,
                       struct rs_sdp_bsdh *out);

/* Name of a MID ("Data", "SrcAvail", ...), as Wireshark prints it; "Unknown" otherwise. */
const char *rs_sdp_mid_name(uint8_t mid);

/* Serial-number comparison on 32-bit sequence numbers: a - b as a signed distance. */
static inline int32_t rs_sdp_seq_diff(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b);
}

#endif /* RS_SDP_STREAM_SDP_WIRE_H */
