/*
 * ud.h: the datagram half of the soft RNIC (datagram-iWARP over UDP), private to ud_*.c and soft_device.c.
 * Wire format: docs/wire-formats.md ("Datagram iWARP"). One DDP segment per UDP datagram, no MPA, CRC32c
 * trailer (little-endian like MPA) over everything before it.
 */
#ifndef RS_RNIC_SOFT_UD_H
#define RS_RNIC_SOFT_UD_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "rnic/soft/iwarp_wire.h"
#include "common/sockaddr.h"
#include "rnic/soft/soft.h"

/* ---- wire constants ---- */

#define RS_UD_SEG_LEN 64512u                /* payload per datagram when the RNIC segments a message (63 KiB) */
#define RS_UD_MAX_SEGMENTS 64u              /* a message spans at most this many datagrams (valid_map width) */
#define RS_UD_MAX_MSG (RS_UD_SEG_LEN * RS_UD_MAX_SEGMENTS)
#define RS_UD_CRC_LEN 4u
#define RS_UD_RECORD_EXT_LEN 20u            /* msg_id(4) msg_len(4) base_to(8) seg_len(4) */
#define RS_UD_SEND_HDR_LEN RS_DDP_UNTAGGED_HDR_LEN                                       /* 18 */
#define RS_UD_READ_REQ_HDR_LEN (RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN)         /* 46 */
#define RS_UD_READ_RESP_HDR_LEN RS_DDP_TAGGED_HDR_LEN                                    /* 14 */
#define RS_UD_RECORD_HDR_LEN (RS_DDP_TAGGED_HDR_LEN + RS_UD_RECORD_EXT_LEN)              /* 34 */
#define RS_UD_TERM_HDR_LEN (RS_DDP_UNTAGGED_HDR_LEN + RS_TERM_HDR_LEN + RS_RDMAP_READ_REQ_LEN) /* 50 */
#define RS_UD_MAX_HDR_LEN 64u               /* bytes peeked to decode any header */
#define RS_UD_MAX_DATAGRAM 65507u           /* largest IPv4 UDP payload */

enum rs_ud_kind {
    RS_UD_KIND_SEND,                        /* untagged QN 0: Send, Send with SE */
    RS_UD_KIND_READ_REQ,                    /* untagged QN 1 */
    RS_UD_KIND_TERMINATE,                   /* untagged QN 2: here only to refuse a Read Request */
    RS_UD_KIND_READ_RESP,                   /* tagged, opcode 0x2 */
    RS_UD_KIND_WRITE_RECORD,                /* tagged, opcode 0xD */
};

/* A decoded, structurally validated header (no memory checked yet). */
struct rs_ud_hdr {
    enum rs_ud_kind kind;
    uint8_t opcode;
    bool last;
    bool solicited;
    uint32_t hdr_len;
    uint32_t payload_len;
    /* untagged */
    uint32_t qn, msn, mo;
    uint32_t msg_len;                       /* SEND: RsvdULP carries the message length; Write-Record: ext */
    /* tagged */
    uint32_t stag;
    uint64_t to;
    /* Write-Record extension */
    uint32_t msg_id;
    uint64_t base_to;
    uint32_t seg_len;
    uint32_t seg_index;                     /* derived: (to - base_to) / seg_len, or mo / RS_UD_SEG_LEN */
    uint32_t seg_count;                     /* derived: segments of the whole message (>= 1) */
    /* Read Request (also echoed in a Terminate) */
    uint32_t sink_stag;
    uint64_t sink_to;
    uint32_t read_len;
    uint32_t src_stag;
    uint64_t src_to;
    /* Terminate */
    uint32_t term_word;
};

/* ---- ud_wire.c ---- */

/* Each writes the header into buf (at least its *_HDR_LEN bytes) and returns the header length. */
size_t rs_ud_put_send(uint8_t *buf, bool last, bool solicited, uint32_t msg_len, uint32_t msn, uint32_t mo);
size_t rs_ud_put_read_req(uint8_t *buf, uint32_t msn, uint32_t sink_stag, uint64_t sink_to, uint32_t read_len,
                          uint32_t src_stag, uint64_t src_to);
size_t rs_ud_put_read_resp(uint8_t *buf, bool last, uint32_t sink_stag, uint64_t sink_to);
size_t rs_ud_put_write_record(uint8_t *buf, bool last, uint32_t stag, uint64_t to, uint32_t msg_id,
                              uint32_t msg_len, uint64_t base_to, uint32_t seg_len);
size_t rs_ud_put_terminate(uint8_t *buf, uint32_t term_word, const struct rs_ud_hdr *read_req);
/*
 * Decodes the header at the front of a datagram of dgram_len bytes (header + payload + CRC) of which avail are in
 * buf. Checks versions, opcode/model/queue, lengths and every relation between the fields (segment index and
 * count, last flag, no wrap), so the receive paths only have memory left to check. 0 or -EBADMSG.
 */
int rs_ud_decode(const uint8_t *buf, size_t avail, size_t dgram_len, struct rs_ud_hdr *h);
/* CRC32c of header and payload iovecs, as carried in the trailer. */
uint32_t rs_ud_crc(const uint8_t *hdr, size_t hdr_len, const struct iovec *iov, int iovcnt);

/* ---- per-QP state ---- */

struct rs_ud_read;                          /* ud_read.c */
struct rs_ud_mcast;

/* A segmented SEND being reassembled into a posted receive (or a tombstone for one that finished or failed). */
struct rs_ud_partial {
    bool used, active;
    struct sockaddr_storage src;
    uint32_t msn, msg_len, seg_count;
    uint64_t seg_map;
    struct rs_soft_recv_wqe *wqe;           /* active only */
    uint64_t deadline_ns;                   /* active: abandon; tombstone: forget */
};

/* A Write-Record message being placed (or a tombstone). */
struct rs_ud_record {
    bool used, active;
    struct sockaddr_storage src;
    socklen_t src_len;
    uint32_t msg_id, stag, msg_len, seg_len, seg_count;
    uint64_t base_to;
    uint64_t region_offset;                 /* base_to - region start */
    uint64_t valid_map;
    uint32_t valid_bytes;
    uint64_t deadline_ns;
};

#define RS_UD_MAX_PARTIAL 16u
#define RS_UD_MAX_RECORDS 32u

struct rs_soft_ud {
    struct rs_soft_qp *qp;
    int fd;                                 /* -1 until bound */
    int family;
    struct rs_soft_watch *watch;
    struct rs_soft_timer *timer;
    uint64_t timer_deadline_ns;             /* rx_lock */
    /* transmit side, under qp->sq_lock */
    bool want_write;
    bool tx_stalled;                        /* atomic: a READ waits for a free ORD slot; kick when one frees */
    uint32_t next_msn, next_record_id, next_read_msn;
    uint64_t tag_state;                     /* random READ tags */
    /* receive side, under rx_lock */
    pthread_mutex_t rx_lock;
    struct rs_ud_partial partial[RS_UD_MAX_PARTIAL];
    struct rs_ud_record records[RS_UD_MAX_RECORDS];
    struct rs_ud_read *reads;               /* pending READs (initiator) */
    uint32_t read_count;
    uint8_t *scratch;                       /* RS_UD_MAX_DATAGRAM bytes, only for discarding with a CRC check */
    struct rs_ud_mcast *mcast;              /* joined groups (sq_lock) */
    /* Adopted socket (rs_rnic_ud_adopt_fd): the fd is the application's, datagrams that are not ours go back raw. */
    bool adopted;
    struct rs_rnic_raw_dgram *raw_head, *raw_tail;     /* rx_lock */
    uint32_t raw_count, raw_max_count;
    uint64_t raw_bytes, raw_max_bytes;
    struct rs_rnic_ud_counters counters;    /* relaxed atomic adds (RS_UD_COUNT), read by rs_rnic_ud_counters */
};

#define RS_UD_COUNT(ud, field, n) __atomic_add_fetch(&(ud)->counters.field, (uint64_t)(n), __ATOMIC_RELAXED)

/* One inbound datagram on its way through the receive path. */
struct rs_ud_rx {
    struct rs_soft_ud *ud;
    int fd;                                 /* socket to read it from, or -1: buf holds it */
    const uint8_t *buf;
    size_t dgram_len;
    uint8_t hdr_bytes[RS_UD_MAX_HDR_LEN];
    struct rs_ud_hdr h;
    struct sockaddr_storage src;
    socklen_t src_len;
    bool consumed;
};

/* ---- ud_rx.c ---- */

/* Handles every datagram waiting on the socket, at most budget of them. Progress thread. */
void rs_ud_rx_socket(struct rs_soft_ud *ud, unsigned budget);
/*
 * Reads the datagram: header, then the payload scattered over iov (which must total h.payload_len), then the
 * trailer, and checks the CRC. 0 when intact; -EBADMSG on a CRC mismatch (counted); other -errno on read errors.
 */
int rs_ud_rx_consume(struct rs_ud_rx *rx, const struct iovec *iov, int iovcnt);
/* Drops the datagram unread (if it came from a socket) */
void rs_ud_rx_discard(struct rs_ud_rx *rx);
/* Segmented SEND reassembly timeouts (rx_lock held); returns the next deadline, 0 = none. */
uint64_t rs_ud_partial_expire(struct rs_soft_ud *ud, uint64_t now_ns);
/* Arms the QP timer for a new deadline and notes it for lazy checks. rx_lock held. */
void rs_ud_note_deadline(struct rs_soft_ud *ud, uint64_t deadline_ns);

/*
 * Raw hand-back of an adopted socket (rx_lock held). rs_ud_raw_room says whether one more raw datagram of len bytes
 * (and its completion) fits; rs_ud_raw_push queues an entry the caller allocated and adds its RS_WC_RECV_RAW
 * completion. rs_ud_cq_room: the recv CQ can take one more completion that no active record already reserved.
 */
bool rs_ud_cq_room(struct rs_soft_ud *ud);
bool rs_ud_raw_room(struct rs_soft_ud *ud, size_t len);
void rs_ud_raw_push(struct rs_soft_ud *ud, struct rs_rnic_raw_dgram *d);
struct rs_rnic_raw_dgram *rs_ud_raw_alloc(const struct rs_ud_rx *rx, size_t len, enum rs_rnic_wc_status status);

/* ---- ud_record.c (target of Write-Record), rx_lock held ---- */
void rs_ud_record_rx(struct rs_ud_rx *rx);
uint64_t rs_ud_record_expire(struct rs_soft_ud *ud, uint64_t now_ns);   /* returns the next deadline, 0 = none */
void rs_ud_record_reset(struct rs_soft_ud *ud);

/* ---- ud_read.c ---- */
/* Initiator: starts a READ from the send queue (sq_lock held). 0, or a completion status to fail the WQE with;
 * -EAGAIN when the socket refused the request (try again later). */
int rs_ud_read_start(struct rs_soft_ud *ud, struct rs_soft_send_wqe *e);
void rs_ud_read_resp_rx(struct rs_ud_rx *rx);           /* rx_lock held */
void rs_ud_read_term_rx(struct rs_ud_rx *rx);           /* rx_lock held */
void rs_ud_read_req_rx(struct rs_ud_rx *rx);            /* responder; rx_lock held */
uint64_t rs_ud_read_expire(struct rs_soft_ud *ud, uint64_t now_ns);     /* rx_lock held */
void rs_ud_read_flush(struct rs_soft_ud *ud);           /* every pending READ fails with RS_WC_WR_FLUSH_ERR */

/* ---- ud_tx.c ---- */
/* Transmits queued sends while the socket accepts them (takes sq_lock). */
void rs_ud_tx_kick(struct rs_soft_ud *ud);
/* sendmsg of header + payload iovecs + CRC trailer to dst; bytes or -errno. */
ssize_t rs_ud_send_datagram(struct rs_soft_ud *ud, const struct sockaddr_storage *dst, socklen_t dst_len,
                            const uint8_t *hdr, size_t hdr_len, const struct iovec *payload, int iovcnt,
                            const struct rs_rnic_qos *tclass);

#endif /* RS_RNIC_SOFT_UD_H */
