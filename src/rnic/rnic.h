/*
 * rnic.h: the one narrow RDMA interface every protocol layer (sdp_stream, dgram_wr, xrc, qos) uses.
 *
 * Two providers implement exactly this interface: src/rnic/soft (iWARP over kernel TCP for RC, datagram-iWARP
 * over kernel UDP for UD) and src/rnic/verbs (rdma-core: libibverbs + librdmacm). Protocol layers include nothing
 * else from the RDMA world; this file knows nothing of sockets.
 *
 * The model is the verbs model, cut down to what rdmasock needs:
 *
 *   device ─┬─ protection domain ─┬─ memory regions (lkey for local use, rkey = STag for the peer)
 *           │                     ├─ shared receive queues
 *           │                     └─ queue pairs (RC or UD) ── send CQ, recv CQ
 *           └─ connection manager (events on a pollable fd: requests, established, rejected, disconnected...)
 *
 * Threads: every call is thread-safe for distinct objects. A QP's send queue may be used by one thread while
 * another posts receives or polls its CQs. Two threads posting to the same queue must serialise themselves.
 *
 * Errors: calls return 0 or a negative errno (never set errno). Completions carry a status.
 *
 * Completion and ordering rules (both providers):
 *   - Work requests on one send queue start in order. On RC they also complete in order, and the peer
 *     observes their effects in order: a SEND posted after an RDMA WRITE is only delivered after the write's
 *     data is placed (so "write data, then send a notice" is safe without a fence).
 *     RDMA READ is the exception: a later SEND may overtake a READ unless it carries RS_SEND_FENCE.
 *   - RC SEND/WRITE complete at the initiator when the peer has acknowledged them (verbs) or when the whole
 *     message was handed to the reliable kernel TCP socket (soft); in both cases the buffer may be reused.
 *     RDMA READ completes when the data is placed in the local buffer.
 *   - UD SEND and WRITE_RECORD complete when the datagram was handed to the network (the kernel UDP socket for
 *     soft, the HCA for verbs). Delivery is not guaranteed and datagrams are not ordered.
 *   - Receives complete in the order they were posted (per receive queue or SRQ).
 *   - A WRITE_RECORD needs no posted receive at the target: the target's receive CQ gets a RECV_WRITE_RECORD
 *     completion saying which bytes of which region are now valid (see struct rs_rnic_wc).
 *   - Unsignaled sends (no RS_SEND_SIGNALED and sq_sig_all == false) produce no completion on success, but the
 *     send queue slot is only freed by a later signaled completion: signal at least every max_send_wr/2.
 *   - When an RC QP fails (transport error, protection error, peer reset) it enters the ERROR state; every
 *     outstanding and later-posted work request completes with RS_WC_WR_FLUSH_ERR (the first failing one with its
 *     own status) and the connection manager reports RS_RNIC_CM_EV_ERROR. A UD QP reports the failing work
 *     request's status and keeps working for every other peer.
 *   - A CQ that overflows is in error from then on: rs_rnic_poll_cq returns -EOVERFLOW and the QPs attached to
 *     it go to ERROR. Size CQs for the worst case (sum of the queues attached).
 */
#ifndef RS_RNIC_RNIC_H
#define RS_RNIC_RNIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct rs_rnic;
struct rs_rnic_pd;
struct rs_rnic_cq;
struct rs_rnic_srq;
struct rs_rnic_qp;
struct rs_rnic_cm;
struct rs_rnic_listener;
struct rs_rnic_conn_request;
struct rs_rnic_ud_peer;
struct rs_rnic_xrcd;

/* ---- devices --------------------------------------------------------------------------------------------- */

enum rs_rnic_kind {
    RS_RNIC_KIND_SOFT = 1,          /* software iWARP / datagram-iWARP on kernel TCP/UDP */
    RS_RNIC_KIND_VERBS = 2,         /* rdma-core device: InfiniBand, RoCE or iWARP hardware, rxe, siw */
};

struct rs_rnic_caps {
    enum rs_rnic_kind kind;
    char name[64];                  /* "soft", "rxe0", "mlx5_0", ... */
    uint32_t max_qp_wr;             /* per send or receive queue */
    uint32_t max_sge;
    uint32_t max_inline;            /* bytes a SEND may carry with RS_SEND_INLINE */
    uint32_t max_cqe;
    uint32_t max_rc_msg;            /* largest RC message */
    uint32_t max_ud_msg;            /* largest UD SEND or WRITE_RECORD payload (soft: 65,507 minus headers
                                     * per datagram, larger messages segmented by the RNIC; verbs: the MTU) */
    uint32_t max_record_msg;        /* largest WRITE_RECORD message (segmented) */
    uint32_t max_connect_private_data;  /* rdma_cm on IP addresses: 56 */
    uint32_t max_accept_private_data;   /* 196 on rdma_cm */
    uint32_t max_ird, max_ord;      /* RDMA READs in flight as responder / initiator */
    bool has_srq;
    bool has_xrc;                   /* XRC domains and XRC QPs (verbs, device capability) */
    bool has_write_with_imm;
    bool has_send_with_imm;         /* RS_WR_SEND_WITH_IMM, on RC QPs created with imm_data */
    bool has_native_write_record;   /* soft: native; verbs: emulated (see docs) */
    bool mr_pins_pages;             /* a memory region keeps the pages mapped when it was made (verbs without
                                     * on-demand paging); the soft RNIC resolves addresses at each access */
    bool copies_payload;            /* every payload byte passes through the CPU and a kernel socket anyway
                                     * (soft), so a protocol that lends a buffer instead of copying it saves
                                     * less than on a device that places data itself */
};

/*
 * Opens the RNIC that serves local_addr (NULL: any). kind 0 means auto: the verbs device whose address matches,
 * else the software RNIC. -ENODEV when no device of the asked kind can serve the address: a normal outcome the
 * caller handles by staying on the kernel.
 */
int rs_rnic_open(int kind, const struct sockaddr *local_addr, struct rs_rnic **out);
void rs_rnic_close(struct rs_rnic *rnic);
const struct rs_rnic_caps *rs_rnic_caps(const struct rs_rnic *rnic);

/* ---- protection domains and memory ----------------------------------------------------------------------- */

int rs_rnic_alloc_pd(struct rs_rnic *rnic, struct rs_rnic_pd **out);
int rs_rnic_dealloc_pd(struct rs_rnic_pd *pd);     /* -EBUSY while MRs, SRQs or QPs use it */

enum rs_rnic_access {
    RS_ACCESS_LOCAL_WRITE = 1u << 0,    /* needed for receive buffers and READ destinations */
    RS_ACCESS_REMOTE_READ = 1u << 1,
    RS_ACCESS_REMOTE_WRITE = 1u << 2,   /* RDMA WRITE and WRITE_RECORD targets; implies LOCAL_WRITE */
};

struct rs_rnic_mr {
    struct rs_rnic_pd *pd;
    void *addr;
    size_t length;
    uint32_t lkey;                  /* names the region in local SGEs */
    uint32_t rkey;                  /* the STag a peer uses; its low 8 key bits are random per registration, so
                                     * an rkey cannot be guessed from earlier ones */
    unsigned access;                /* enum rs_rnic_access bits */
};

/* Registers [addr, addr+length). The memory must stay mapped until deregistration. */
int rs_rnic_reg_mr(struct rs_rnic_pd *pd, void *addr, size_t length, unsigned access, struct rs_rnic_mr **out);
int rs_rnic_dereg_mr(struct rs_rnic_mr *mr);

/*
 * Invalidates the rkey locally: remote access with it fails from now on (a peer can do the same with
 * SEND_WITH_INVALIDATE). rs_rnic_mr_rekey then gives the region a fresh rkey with new random key bits.
 */
int rs_rnic_mr_invalidate(struct rs_rnic_mr *mr);
int rs_rnic_mr_rekey(struct rs_rnic_mr *mr);

/* ---- completion queues ----------------------------------------------------------------------------------- */

enum rs_rnic_wc_status {
    RS_WC_SUCCESS = 0,
    RS_WC_LOC_LEN_ERR,              /* receive buffer too small, or SGE out of its region */
    RS_WC_LOC_PROT_ERR,             /* bad lkey or access */
    RS_WC_REM_ACCESS_ERR,           /* the peer refused the STag, its access rights or the bounds */
    RS_WC_REM_INV_REQ_ERR,          /* the peer could not accept the request (e.g. no posted receive on RC) */
    RS_WC_RETRY_EXC_ERR,            /* peer unreachable or transport lost */
    RS_WC_WR_FLUSH_ERR,             /* flushed because the QP is in ERROR or being destroyed */
    RS_WC_TIMEOUT,                  /* UD RDMA READ whose response did not arrive in time; or (soft) a receive
                                     * that a segmented UD SEND had started to fill when the message was given up
                                     * for a missing segment (byte_len 0, the message is not delivered) */
    RS_WC_RECORD_PARTIAL,           /* WRITE_RECORD whose last segment did not arrive in time: see valid map */
    RS_WC_GENERAL_ERR,
};

enum rs_rnic_wc_opcode {
    RS_WC_SEND,
    RS_WC_RDMA_WRITE,
    RS_WC_RDMA_READ,
    RS_WC_WRITE_RECORD,             /* initiator side */
    RS_WC_RECV,                     /* a SEND (any variant) consumed a posted receive; SEND_WITH_IMM sets
                                     * RS_WC_WITH_IMM (on a QP created with imm_data) */
    RS_WC_RECV_RDMA_WITH_IMM,       /* a WRITE_WITH_IMM consumed a posted receive */
    RS_WC_RECV_WRITE_RECORD,        /* target side of a WRITE_RECORD: no receive consumed */
    RS_WC_RECV_RAW,                 /* a QP that adopted a socket hands a datagram back (rs_rnic_ud_adopt_fd) */
};

enum rs_rnic_wc_flags {
    RS_WC_WITH_INVALIDATE = 1u << 0,    /* invalidated_rkey is valid */
    RS_WC_WITH_IMM = 1u << 1,           /* imm_data is valid */
    RS_WC_SOLICITED = 1u << 2,
};

struct rs_rnic_wc {
    uint64_t wr_id;                 /* as posted; 0 for RECV_WRITE_RECORD (nothing was posted) */
    enum rs_rnic_wc_status status;
    enum rs_rnic_wc_opcode opcode;
    unsigned flags;
    uint32_t byte_len;              /* bytes received (RECV) or placed (RECV_WRITE_RECORD: valid bytes) */
    uint32_t imm_data;              /* host order */
    uint32_t invalidated_rkey;
    struct rs_rnic_qp *qp;
    struct sockaddr_storage src;    /* UD receives and records: the sender's IP address and UDP port */
    uint32_t src_qpn;               /* UD: the sender's QP number (verbs) or queue number (soft) */
    struct {                        /* RECV_WRITE_RECORD only */
        uint32_t rkey;              /* region written */
        uint64_t offset;            /* byte offset of the message in the region */
        uint32_t msg_len;           /* length of the whole message */
        uint32_t seg_len;           /* segment size the sender used; the last segment may be shorter */
        uint64_t valid_map;         /* bit i set: segment i is placed and valid (at most 64 segments) */
    } record;
};

/*
 * A CQ has a notification fd that becomes readable after rs_rnic_cq_arm when a completion (or, with
 * solicited_only, a solicited one) is added. The fd is for poll/epoll only; rs_rnic_cq_ack_events drains it.
 * Usage: arm, poll the CQ once more (to close the race), then wait on the fd.
 */
int rs_rnic_create_cq(struct rs_rnic *rnic, uint32_t depth, struct rs_rnic_cq **out);
int rs_rnic_destroy_cq(struct rs_rnic_cq *cq);         /* -EBUSY while QPs use it */
int rs_rnic_cq_fd(const struct rs_rnic_cq *cq);
int rs_rnic_cq_arm(struct rs_rnic_cq *cq, bool solicited_only);
void rs_rnic_cq_ack_events(struct rs_rnic_cq *cq);
/* Up to n completions, oldest first; returns how many (0 if none), or -EOVERFLOW once the CQ overflowed.
 * Between rs_rnic_cq_wait_begin and _end (below) a provider may make progress on the calling thread when the CQ
 * has nothing queued (soft: it receives what waits on the sockets of the RC QPs whose receive CQ this is). A
 * completion such a call produces and returns itself does not fire the armed notification: the arm stays for the
 * next completion nobody took. */
int rs_rnic_poll_cq(struct rs_rnic_cq *cq, int n, struct rs_rnic_wc *wc);
/*
 * Blocking on a CQ, with one wake-up per event: besides rs_rnic_cq_fd, wait for readability on the fds that
 * rs_rnic_cq_wait_begin returns (at most max; 0 when the provider needs none, or cannot hand over all it would
 * need). When one of them is readable, rs_rnic_poll_cq on this thread makes the progress itself, so the
 * completion does not first wake a provider thread that then wakes this one; meanwhile the provider leaves
 * those events to the waiter. One wait at a time per thread. Each begin that returned more than 0 is followed, on
 * the same thread, by exactly one rs_rnic_cq_wait_end, after the wake-up was handled (whatever woke it). Order:
 * arm, poll once more, begin, wait on the CQ fd and these fds, ack (if the CQ fd fired) and poll, end.
 * On a CQ that brackets are used on, a provider may fire the arm late (soft: 1 ms) for a successful completion an
 * application thread added itself (a SEND that completed while it was posted) and not at all if a poll empties the
 * CQ first: the poster polls anyway, and others watching the CQ fd are not woken for nothing. A thread entering a
 * bracket is told at once, so it never sleeps on such a completion.
 */
int rs_rnic_cq_wait_begin(struct rs_rnic_cq *cq, int *fds, int max);
/* Inside a bracket, before a poll that follows an earlier one after some time (a spin's next round, the look after
 * an arm): the provider looks at its sources again even if an earlier poll of this bracket found them dry (soft:
 * it reads the sockets once per bracket otherwise, so a spinning waiter would never receive). */
void rs_rnic_cq_wait_recheck(struct rs_rnic_cq *cq);
void rs_rnic_cq_wait_end(struct rs_rnic_cq *cq);

/* ---- queue pairs and shared receive queues ---------------------------------------------------------------- */

enum rs_rnic_qp_type {
    RS_QPT_RC = 1,
    RS_QPT_UD = 2,
    RS_QPT_XRC_INI = 3,             /* XRC send side (caps.has_xrc): connects like RC, sends to remote XRC SRQs */
    RS_QPT_XRC_TGT = 4,             /* XRC receive side: accepts like RC, delivers into its domain's SRQs */
};

enum rs_rnic_qp_state { RS_QPS_INIT, RS_QPS_CONNECTING, RS_QPS_RTS, RS_QPS_CLOSING, RS_QPS_ERROR };

struct rs_rnic_qos {
    uint8_t sl;                     /* InfiniBand service level 0-15 (verbs) */
    uint8_t tclass;                 /* IP traffic class / ToS byte: DSCP in the top 6 bits */
};

struct rs_rnic_qp_attr {
    enum rs_rnic_qp_type type;
    struct rs_rnic_cq *send_cq, *recv_cq;       /* may be the same CQ */
    struct rs_rnic_srq *srq;                    /* NULL: the QP has its own receive queue */
    uint32_t max_send_wr, max_recv_wr;
    uint32_t max_send_sge, max_recv_sge;
    uint32_t max_inline;
    bool sq_sig_all;
    struct rs_rnic_qos qos;
    uint32_t ud_read_timeout_ms;    /* UD RDMA READ: a request with no response is failed after this
                                     * (checked lazily, when the CQ is polled); 0 = provider default */
    uint32_t record_timeout_ms;     /* UD WRITE_RECORD target: a message whose last segment is missing completes
                                     * as RS_WC_RECORD_PARTIAL this long after its latest segment (silence, not
                                     * length); 0 = provider default */
    void *context;                  /* returned by rs_rnic_qp_context */
    bool imm_data;                  /* RC, caps.has_send_with_imm: SEND_WITH_IMM carries 32 bits of the caller's, sent
                                     * and received. The verbs provider emulates SEND_WITH_INVALIDATE with the
                                     * immediate on InfiniBand and RoCE, so such a QP may not send that (-EINVAL),
                                     * and both ends of a connection must agree on the flag. */
    struct rs_rnic_xrcd *xrcd;      /* RS_QPT_XRC_TGT: the XRC domain it serves */
};

int rs_rnic_create_srq(struct rs_rnic_pd *pd, uint32_t max_wr, uint32_t max_sge, struct rs_rnic_srq **out);
int rs_rnic_destroy_srq(struct rs_rnic_srq *srq);

/* Creates a QP in INIT. An RC QP is connected through the connection manager; a UD QP through rs_rnic_ud_bind. */
int rs_rnic_create_qp(struct rs_rnic_pd *pd, const struct rs_rnic_qp_attr *attr, struct rs_rnic_qp **out);
/* Flushes outstanding work (RS_WC_WR_FLUSH_ERR) and frees the QP; an RC QP that is still connected is reset. */
int rs_rnic_destroy_qp(struct rs_rnic_qp *qp);
enum rs_rnic_qp_state rs_rnic_qp_state(const struct rs_rnic_qp *qp);
void *rs_rnic_qp_context(const struct rs_rnic_qp *qp);
uint32_t rs_rnic_qp_num(const struct rs_rnic_qp *qp);
/* Changes the service level / traffic class used for what is sent from now on. */
int rs_rnic_qp_set_qos(struct rs_rnic_qp *qp, const struct rs_rnic_qos *qos);
/* Moves the QP to ERROR (for tests and abortive close): outstanding work is flushed. */
int rs_rnic_qp_set_error(struct rs_rnic_qp *qp);

/* ---- work requests ---------------------------------------------------------------------------------------- */

struct rs_rnic_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

enum rs_rnic_wr_opcode {
    RS_WR_SEND,
    RS_WR_SEND_WITH_INVALIDATE,     /* RC: also invalidates invalidate_rkey at the peer */
    RS_WR_RDMA_WRITE,               /* RC */
    RS_WR_RDMA_WRITE_WITH_IMM,      /* RC, if caps.has_write_with_imm: consumes a receive at the peer */
    RS_WR_RDMA_READ,                /* RC; UD on the soft RNIC (with a timeout) */
    RS_WR_WRITE_RECORD,             /* UD: one-sided placement with a record at the target */
    RS_WR_SEND_WITH_IMM,            /* RC QP created with imm_data: a SEND whose receive completion carries imm_data */
};

enum rs_rnic_send_flags {
    RS_SEND_SIGNALED = 1u << 0,
    RS_SEND_SOLICITED = 1u << 1,    /* the peer's CQ wakes a solicited_only waiter */
    RS_SEND_INLINE = 1u << 2,       /* the data is copied at post time: the buffer may be reused at once */
    RS_SEND_FENCE = 1u << 3,        /* start only after earlier RDMA READs completed */
};

struct rs_rnic_send_wr {
    struct rs_rnic_send_wr *next;
    uint64_t wr_id;
    enum rs_rnic_wr_opcode opcode;
    unsigned flags;
    struct rs_rnic_sge *sg_list;
    int num_sge;
    uint32_t imm_data;              /* WRITE_WITH_IMM, SEND_WITH_IMM */
    uint32_t invalidate_rkey;       /* SEND_WITH_INVALIDATE */
    struct {                        /* RDMA_WRITE*, RDMA_READ, WRITE_RECORD: the peer's region */
        uint64_t remote_addr;       /* address or offset as the peer advertised it */
        uint32_t rkey;
    } rdma;
    struct rs_rnic_ud_peer *ud_peer;    /* UD only: where to send */
    uint32_t xrc_remote_srq_num;        /* XRC_INI only: the peer's XRC SRQ (rs_rnic_srq_num) */
};

struct rs_rnic_recv_wr {
    struct rs_rnic_recv_wr *next;
    uint64_t wr_id;
    struct rs_rnic_sge *sg_list;
    int num_sge;
};

/* Posts a chain; on error *bad_wr is the first request not posted and nothing after it was posted. */
int rs_rnic_post_send(struct rs_rnic_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr);
/*
 * One SEND of one buffer, carried inline (SEND_WITH_IMM with imm_data when with_imm, on a QP created with
 * imm_data): what a stream socket posts for each small message, without a request to fill in and check. flags:
 * RS_SEND_SIGNALED, RS_SEND_SOLICITED (RS_SEND_INLINE is implied). The results are rs_rnic_post_send's for the same
 * request (RS_WR_SEND or RS_WR_SEND_WITH_IMM, one sge, RS_SEND_INLINE), completion included.
 */
int rs_rnic_post_send_inline(struct rs_rnic_qp *qp, uint64_t wr_id, const struct rs_rnic_sge *sge, unsigned flags,
                             bool with_imm, uint32_t imm_data);
int rs_rnic_post_recv(struct rs_rnic_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
int rs_rnic_post_srq_recv(struct rs_rnic_srq *srq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);

/* ---- UD addressing ---------------------------------------------------------------------------------------- */

/* Binds a UD QP to a local IP address and UDP port (port 0: any) and moves it to RTS. */
int rs_rnic_ud_bind(struct rs_rnic_qp *qp, const struct sockaddr *local, socklen_t len);
int rs_rnic_ud_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);

/*
 * Starts resolving a peer (its IP address and port, and on verbs its QP number and Q_Key) for sends from qp.
 * Never blocks: the result arrives as RS_RNIC_CM_EV_UD_PEER_RESOLVED or _UNREACHABLE on cm, with *out already
 * returned for use once resolved. The soft RNIC resolves at once (the event is queued before the call returns).
 */
int rs_rnic_ud_resolve_peer(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *peer,
                            const struct rs_rnic_qos *qos, uint32_t timeout_ms, void *context,
                            struct rs_rnic_ud_peer **out);
void rs_rnic_ud_peer_free(struct rs_rnic_ud_peer *peer);
/* IP multicast (soft) or rdma_join_multicast (verbs); sends to a group go through a peer resolved for it. */
int rs_rnic_ud_join_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group, const struct sockaddr *iface);
int rs_rnic_ud_leave_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group);

/* ---- UD on the application's own UDP socket (added for src/dgram_wr; see docs/dgram.md) ------------------ */

/*
 * Where the RNIC's UD QP is itself a UDP socket (soft), a datagram socket layer can let the QP ADOPT the
 * application's bound kernel UDP socket instead of opening its own, so RDMA datagrams and plain UDP share the
 * application's port. An adopting QP (RAW mode):
 *   - reads every datagram of the socket; datagram-iWARP for this QP is handled as usual;
 *   - hands every other datagram back untouched: not datagram-iWARP, or failing its CRC (the kernel already checked
 *     UDP's own checksum, so a CRC mismatch means the datagram was never ours). Each goes to the QP's raw queue
 *     and an RS_WC_RECV_RAW completion (status RS_WC_SUCCESS, byte_len = its length, src) is added to the recv CQ;
 *   - also hands back the payload of every Write-Record segment the region checks refuse (unknown, invalidated or
 *     foreign STag, access, bounds): RS_WC_RECV_RAW with status RS_WC_REM_ACCESS_ERR and wc.record filled (rkey =
 *     STag, offset = the segment's wire TO, msg_len, seg_len, valid_map = this segment's bit), so the socket layer
 *     can salvage a datagram that raced a revoked buffer or tell a peer that its cached region is stale;
 *   - drops instead of overflowing its recv CQ: a Write-Record or raw datagram that would need a completion slot
 *     the CQ may not have is dropped and counted (rx_no_room), because a remote sender must never be able to put
 *     the QP into ERROR;
 *   - completes the RECV_WRITE_RECORD of a placement before the region's lock is released, so once
 *     rs_rnic_mr_invalidate returns, every completion for bytes placed under the old STag is already on the CQ;
 *   - never closes the fd and leaves its options alone, except the kernel receive/send buffer sizes (raised so the
 *     kernel does not drop while the RNIC drains it; the socket layer keeps the application's own SO_RCVBUF).
 * Each RS_WC_RECV_RAW completion matches one entry of the raw queue, in the same order: take it with
 * rs_rnic_ud_take_raw, release it with free(). Entries beyond raw_max_bytes (sum of lengths) or raw_max_count are
 * dropped and counted (rx_raw_dropped). The recv CQ must be sized for posted receives + raw_max_count + the
 * Write-Record completions the consumer expects.
 *
 * Providers without the capability return -EOPNOTSUPP: the socket layer then keeps the application's socket for
 * plain UDP (and its discovery) and binds a QP of its own with rs_rnic_ud_bind.
 */
struct rs_rnic_ud_adopt {
    int fd;                         /* bound AF_INET/AF_INET6 SOCK_DGRAM socket; stays the caller's */
    uint32_t raw_max_bytes;
    uint32_t raw_max_count;
};
int rs_rnic_ud_adopt_fd(struct rs_rnic_qp *qp, const struct rs_rnic_ud_adopt *how);
/* Changes the raw queue bounds (e.g. after SO_RCVBUF); entries already queued stay. */
int rs_rnic_ud_set_raw_limits(struct rs_rnic_qp *qp, uint32_t raw_max_bytes, uint32_t raw_max_count);

struct rs_rnic_raw_dgram {
    struct rs_rnic_raw_dgram *next;     /* free for the consumer's use */
    enum rs_rnic_wc_status status;      /* as in its completion */
    uint32_t len;                       /* bytes in data */
    struct sockaddr_storage src;
    socklen_t src_len;
    struct {                            /* status RS_WC_REM_ACCESS_ERR: the refused Write-Record segment */
        uint32_t rkey;
        uint64_t to;                    /* wire TO of this segment */
        uint64_t base_to;               /* wire TO of the message's first byte */
        uint32_t msg_len;
    } record;
    uint8_t data[];
};
/* 0 and the oldest raw entry (caller frees it with free()), or -EAGAIN when the raw queue is empty. */
int rs_rnic_ud_take_raw(struct rs_rnic_qp *qp, struct rs_rnic_raw_dgram **out);

/* Per-QP receive counters of a UD QP, so a socket layer can report drops per socket like the kernel does. */
struct rs_rnic_ud_counters {
    uint64_t rx_no_recv;            /* SEND messages dropped: no receive was posted (the receiver had no room) */
    uint64_t rx_no_room;            /* Write-Record or raw datagrams dropped: the recv CQ had no room */
    uint64_t rx_raw;                /* datagrams handed back raw (both statuses) */
    uint64_t rx_raw_dropped;        /* raw datagrams dropped: raw queue full */
    uint64_t rx_refused;            /* datagram-iWARP refused: protection, malformed, late (not handed back) */
    uint64_t thread_wakeups;        /* times the provider's thread was woken to carry this QP's datagrams because no
                                       caller was polling (verbs; the soft RNIC's engine has no such hand-over: 0) */
};
int rs_rnic_ud_counters(const struct rs_rnic_qp *qp, struct rs_rnic_ud_counters *out);

/* ---- XRC (verbs devices that report IBV_DEVICE_XRC; caps.has_xrc) ------------------------------------------ */

/*
 * An XRC domain groups XRC SRQs that any XRC_TGT QP of the domain delivers into, so one process (or several
 * sharing the domain through fd, a file both open) needs one connection per peer host rather than per peer
 * process. Without the capability every call returns -EOPNOTSUPP and creates nothing; the soft RNIC has none.
 * XRC QPs connect through the connection manager like RC QPs (INI connects, TGT accepts).
 */
int rs_rnic_xrcd_open(struct rs_rnic *rnic, int fd, struct rs_rnic_xrcd **out);     /* fd -1: private domain */
int rs_rnic_xrcd_close(struct rs_rnic_xrcd *xrcd);      /* -EBUSY while SRQs or QPs use it */
/* An SRQ of the domain; its receives complete on cq. Senders name it by rs_rnic_srq_num. */
int rs_rnic_create_xsrq(struct rs_rnic_pd *pd, struct rs_rnic_xrcd *xrcd, struct rs_rnic_cq *cq, uint32_t max_wr,
                        uint32_t max_sge, struct rs_rnic_srq **out);
uint32_t rs_rnic_srq_num(const struct rs_rnic_srq *srq);

/* ---- connection management (RC) --------------------------------------------------------------------------- */

enum rs_rnic_cm_event_type {
    RS_RNIC_CM_EV_CONNECT_REQUEST,  /* on a listener: request holds the peer's private data; accept or reject */
    RS_RNIC_CM_EV_ESTABLISHED,      /* the QP is in RTS; private data holds the acceptor's reply (active side) */
    RS_RNIC_CM_EV_REJECTED,         /* the peer rejected; private data holds its reason, if any */
    RS_RNIC_CM_EV_UNREACHABLE,      /* no route, no RDMA peer at that address, or address resolution failed */
    RS_RNIC_CM_EV_TIMEOUT,          /* no answer within the connect timeout */
    RS_RNIC_CM_EV_DISCONNECTED,     /* orderly disconnect by either side completed */
    RS_RNIC_CM_EV_ERROR,            /* the QP entered ERROR (transport failure, protection error, reset) */
    RS_RNIC_CM_EV_UD_PEER_RESOLVED,
    RS_RNIC_CM_EV_UD_PEER_UNREACHABLE,
};

struct rs_rnic_cm_event {
    enum rs_rnic_cm_event_type type;
    struct rs_rnic_qp *qp;                      /* the QP concerned (NULL for CONNECT_REQUEST) */
    struct rs_rnic_listener *listener;          /* CONNECT_REQUEST */
    struct rs_rnic_conn_request *request;       /* CONNECT_REQUEST: pass to accept or reject */
    struct rs_rnic_ud_peer *ud_peer;            /* UD_PEER_* */
    void *context;                              /* UD_PEER_*: as given to resolve */
    int error;                                  /* -errno detail for REJECTED/UNREACHABLE/ERROR */
    struct sockaddr_storage peer;               /* the peer's address */
    uint8_t private_data[256];
    uint32_t private_data_len;
};

/* A CM is an event channel: one pollable fd, events read without blocking. */
int rs_rnic_cm_create(struct rs_rnic *rnic, struct rs_rnic_cm **out);
void rs_rnic_cm_destroy(struct rs_rnic_cm *cm);
int rs_rnic_cm_fd(const struct rs_rnic_cm *cm);
/* 0 with *ev filled, or -EAGAIN when no event is pending. */
int rs_rnic_cm_get_event(struct rs_rnic_cm *cm, struct rs_rnic_cm_event *ev);

/* Listens on an IP address and port (the soft RNIC on kernel TCP; verbs on rdma_cm's TCP port space). */
int rs_rnic_listen(struct rs_rnic_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                   struct rs_rnic_listener **out);
int rs_rnic_listener_addr(const struct rs_rnic_listener *listener, struct sockaddr_storage *out);
void rs_rnic_listener_close(struct rs_rnic_listener *listener);
/* For a listener that goes dormant at fork: like rs_rnic_listener_close, except that a provider whose listening
 * endpoint is shared with forked processes (the soft RNIC: a kernel TCP socket, inherited) keeps it open, parked:
 * connections wait in its backlog until a process of the family listens on the same address again, and that
 * rs_rnic_listen adopts it. Providers that cannot share one (verbs: an rdma_cm id is per process) close it. */
void rs_rnic_listener_park(struct rs_rnic_listener *listener);
/* Pacing a listener whose backlog other processes share (the soft RNIC's listening socket adopted after a fork).
 * The kernel holds a TCP connection in a shared backlog until some process accepts it; an RDMA connection belongs
 * to the process that took it off, and is reset if that process exits before its application accepts it. So such
 * a listener takes connections only as the application asks: at most `want` may be on the way to it (being set up,
 * or reported as CONNECT_REQUEST but not among the `seen` CONNECT_REQUESTs the application has taken from this
 * listener so far). It starts at 0. -EOPNOTSUPP for a listener that is not shared (it takes whatever arrives). */
int rs_rnic_listener_intake(struct rs_rnic_listener *listener, unsigned want, uint32_t seen);

/* Starts connecting qp; completes with ESTABLISHED, REJECTED, UNREACHABLE or TIMEOUT on cm. Never blocks. */
int rs_rnic_connect(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *dst, socklen_t len,
                    const void *private_data, uint32_t private_data_len, uint32_t timeout_ms);
/* Accepts a request on qp (fresh, in INIT) with a reply; ESTABLISHED follows on cm for qp. */
int rs_rnic_accept(struct rs_rnic_conn_request *request, struct rs_rnic_qp *qp, struct rs_rnic_cm *cm,
                   const void *private_data, uint32_t private_data_len);
/* Rejects a request; the private data reaches the peer in its REJECTED event. Frees the request. */
int rs_rnic_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len);
/* Orderly disconnect: outstanding work completes or flushes, then DISCONNECTED on both sides. */
int rs_rnic_disconnect(struct rs_rnic_qp *qp);
/* The local address of a connected RC QP, as its peer sees it (the peer's ESTABLISHED/CONNECT_REQUEST `peer`
 * names the same address and port): what getsockname returns for a connected socket. -ENOTCONN before the QP was
 * established. */
int rs_rnic_qp_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);
/* On an RNIC that copies payload (caps.copies_payload): true while this connected QP's peer, a process on this host,
 * takes RDMA READ responses by one direct copy (soft RNIC, docs/rnic-rc.md "Local Read placement"). So a READ of
 * a lent buffer costs one CPU copy instead of the kernel socket's two, as lending saves copies on hardware. SENDs
 * and WRITEs still go through the socket. false on devices that place data themselves. */
bool rs_rnic_qp_reads_placed_directly(const struct rs_rnic_qp *qp);

#endif /* RS_RNIC_RNIC_H */
