/*
 * dgram_wire.h: the control messages rdmasock datagram sockets exchange over the application's own UDP port
 * (discovery, announcements, receive-buffer advertisements). Layout and rules: docs/dgram.md §4.
 *
 * Every message starts with the magic "RSDG". Its first byte (0x52) has DDP reserved bits set, so no
 * datagram-iWARP receiver can take it for one of its own datagrams: an RNIC that adopted the socket always hands
 * it back raw. The decoder trusts nothing: a message is accepted only when its length, version, type and body
 * length agree exactly, so anything else on the port (the application's own plain UDP) is never mistaken for one.
 */
#ifndef RS_DGRAM_WR_DGRAM_WIRE_H
#define RS_DGRAM_WR_DGRAM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RS_DGW_MAGIC0 0x52u                 /* 'R' */
#define RS_DGW_MAGIC1 0x53u                 /* 'S' */
#define RS_DGW_MAGIC2 0x44u                 /* 'D' */
#define RS_DGW_MAGIC3 0x47u                 /* 'G' */
#define RS_DGW_VERSION 1u
#define RS_DGW_HDR_LEN 24u
#define RS_DGW_MAX_LEN 64u                  /* largest message (header + largest body) */

enum rs_dgw_type {
    RS_DGW_PROBE = 1,                       /* "do you run rdmasock on this port?" */
    RS_DGW_ANSWER = 2,                      /* reply to a probe (echoes its nonce) */
    RS_DGW_ANNOUNCE = 3,                    /* unsolicited ANSWER: after a restart, or to a sender whose state is stale */
    RS_DGW_SINK = 4,                        /* a receive buffer waiting now: write the next large datagram here */
    RS_DGW_CONSUMED = 5,                    /* how far the receiver consumed the sender's lane */
    RS_DGW_BYE = 6,                         /* the socket is closing: forget it */
};

/* PROBE want flags */
#define RS_DGW_WANT_LANE 0x01u              /* the prober would like to Write-Record into a lane */

/* ANSWER / ANNOUNCE flags */
#define RS_DGW_ACCEPT 0x01u                 /* send datagram-iWARP to me */
#define RS_DGW_HAS_LANE 0x02u               /* lane_* describe a receive region reserved for you */

struct rs_dgw_msg {
    enum rs_dgw_type type;
    uint64_t instance;                      /* random per socket incarnation, never 0 */
    uint64_t nonce;                         /* PROBE: random; ANSWER: the probe's; others: 0 */
    union {
        struct {
            uint8_t want;                   /* RS_DGW_WANT_* */
            uint8_t rnic_kind;              /* enum rs_rnic_kind of the prober */
        } probe;
        struct {                            /* ANSWER and ANNOUNCE */
            uint8_t flags;                  /* RS_DGW_ACCEPT, RS_DGW_HAS_LANE */
            uint8_t rnic_kind;
            uint32_t qpn;                   /* the answering QP (verbs resolves GID and Q_Key itself, by SIDR) */
            uint32_t lane_rkey;
            uint32_t lane_size;             /* bytes */
            uint64_t lane_to;               /* wire address of the lane's first byte */
            uint32_t lane_records;          /* records the sender may have unconsumed in the lane */
        } answer;
        struct {
            uint32_t sink_id;
            uint32_t rkey;
            uint64_t to;
            uint32_t len;
        } sink;
        struct {
            uint32_t lane_rkey;             /* which lane (a report for an older lane is ignored) */
            uint32_t records;               /* records consumed so far (wraps) */
            uint64_t consumed;              /* lane position consumed so far */
        } consumed;
    } u;
};

/* Encodes m into buf (at least RS_DGW_MAX_LEN bytes); returns the message length. */
size_t rs_dgw_encode(const struct rs_dgw_msg *m, uint8_t *buf);
/* Decodes len bytes; 0 and *m filled when they are exactly one valid message, else -EBADMSG. */
int rs_dgw_decode(const uint8_t *buf, size_t len, struct rs_dgw_msg *m);
/* True when the bytes start with the magic (cheap pre-check; rs_dgw_decode decides). */
bool rs_dgw_has_magic(const uint8_t *buf, size_t len);

#endif /* RS_DGRAM_WR_DGRAM_WIRE_H */
