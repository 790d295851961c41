/*
 * verbs.h: internals of the verbs RNIC provider (rdma-core: libibverbs + librdmacm), shared by its files.
 *
 *   device.c   opening a device by address (RDMASOCK_DEVICE overrides), caps, the ops table, async events
 *   mem.c      PDs and MRs (an MR with remote access owns a second ibv_mr whose rkey can be dropped and renewed)
 *   cq.c       CQs: an ibv_cq for RC plus a software ring for what the provider completes itself (UD, flushes)
 *   qp.c       QPs and SRQs; the RC data path (work requests go straight to the device)
 *   cm.c       rdma_cm, event driven: connect/listen/accept/reject/disconnect, UD peer resolution (SIDR)
 *   progress.c one thread per device: UD datagrams, timers, async events, SIDR answers
 *   ud.c       UD QPs: binding, the datagram framing, sending (segmentation) and receiving (reassembly)
 *   record.c   Write-Record and RDMA READ emulated over UD datagrams
 *   xrc.c      XRC domains, SRQs and INI/TGT QPs, only where the device reports IBV_DEVICE_XRC
 *
 * docs/verbs.md explains the design choices and what was measured.
 */
#ifndef RS_RNIC_VERBS_VERBS_H
#define RS_RNIC_VERBS_VERBS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common/lock.h"
#include "rnic/provider.h"

/* ---- tunables (documented in docs/verbs.md) --------------------------------------------------------------- */

#define RS_V_MAX_QP_WR 32768u           /* per queue; keeps our shadow indexes small */
#define RS_V_MAX_INLINE 512u            /* bytes a SEND may carry with RS_SEND_INLINE */
#define RS_V_CONNECT_PRIVATE 56u        /* 92-byte REQ private data minus rdma_cm's 36-byte IP header */
#define RS_V_ACCEPT_PRIVATE 180u        /* REP private data for the application: 196 minus our mailbox trailer */
#define RS_V_REP_PRIVATE 196u           /* REP private data on the wire */
#define RS_V_REJECT_PRIVATE 148u        /* REJ private data */
#define RS_V_RD_ATOMIC 16u              /* RDMA READs in flight we ask for per connection */
#define RS_V_ACK_TIMEOUT 15u            /* local ACK timeout exponent: 4.096 us * 2^15 = 134 ms */
#define RS_V_RETRY_COUNT 7u
#define RS_V_RNR_RETRY 0u               /* a SEND with no posted receive fails at once (rnic.h semantics) */
#define RS_V_UD_QKEY 0x01234567u        /* RDMA_UDP_QKEY: what rdma_cm's SIDR answers with */
#define RS_V_UD_MAX_MSG (16u << 20)     /* largest UD SEND we segment */
#define RS_V_RECORD_MAX_MSG (16u << 20) /* largest WRITE_RECORD message */
#define RS_V_RECORD_SEGMENTS 64u        /* validity map bits */
#define RS_V_RECORD_STAGES 4u           /* segments of one record put together at once (UD arrives in order) */
#define RS_V_RECORD_STAGE_BUDGET (16u << 20) /* staging bytes one UD QP may hold */
#define RS_V_DEFAULT_READ_TIMEOUT_MS 1000u
#define RS_V_DEFAULT_RECORD_TIMEOUT_MS 1000u
#define RS_V_DEFAULT_SEND_TIMEOUT_MS 1000u  /* a segmented SEND with no datagram for this long is given up */
#define RS_V_DONE_LINGER_MS 2000u       /* how long a finished message's id is remembered (stragglers) */
#define RS_V_DRAIN_TIMEOUT_MS 2000u
#define RS_V_MC_JOIN_TIMEOUT_MS 3000u   /* rs_rnic_ud_join_multicast: longest wait for rdma_cm's join */
#define RS_V_UD_HDR_LEN 40u            /* our header in front of every UD datagram (ud.c) */
#define RS_V_GRH_LEN 40u               /* what a UD receive buffer holds before the payload */     /* orderly disconnect: longest wait for the send queue to drain */

/* ---- objects ---------------------------------------------------------------------------------------------- */

struct rs_v_progress;
struct rs_v_ud;
struct rs_v_cm;

/* A u32 -> pointer map (open addressing); callers bring their own lock. */
struct rs_v_keymap {
    uint32_t *keys;
    void **values;                  /* NULL: empty; RS_V_KEYMAP_GONE: deleted */
    uint32_t cap, used, live;
};
int rs_v_keymap_put(struct rs_v_keymap *map, uint32_t key, void *value);
void *rs_v_keymap_get(const struct rs_v_keymap *map, uint32_t key);
void rs_v_keymap_del(struct rs_v_keymap *map, uint32_t key, const void *value);
void rs_v_keymap_free(struct rs_v_keymap *map);

struct rs_v_dev {
    struct rs_rnic base;
    struct ibv_context *ctx;
    uint8_t port;
    enum ibv_mtu active_mtu;
    uint32_t mtu;                   /* path MTU in bytes (UD datagram size) */
    bool is_iwarp;
    struct ibv_device_attr attr;
    struct sockaddr_storage addr;   /* the address the device was opened for (family AF_UNSPEC: any) */
    pthread_mutex_t lock;           /* progress start-up, object lists */
    /* Registered memory, by key: the UD emulation checks STags and lkeys in software. */
    pthread_rwlock_t mr_lock;
    struct rs_v_keymap by_lkey, by_rkey;
    /* QP number -> QP, for completions that come through an SRQ. */
    pthread_rwlock_t qp_lock;
    struct rs_v_keymap by_qpn;
    struct rs_v_progress *progress;     /* started on first need */
    pthread_mutex_t overflow_lock;      /* a leaf lock: pushers may hold QP locks */
    struct rs_v_cq *overflowed[8];      /* CQs that overflowed, for the progress thread */
    uint32_t noverflowed;
    atomic_int objects;                 /* PDs, CQs, CMs alive; close frees the context when 0 */
    /* TEST ONLY (rs_v_test_set_drop): inbound UD datagrams dropped per million, and the generator's state */
    atomic_uint test_drop_per_million;
    _Atomic uint64_t test_drop_state;
    atomic_bool test_drop_last;         /* TEST ONLY (rs_v_test_drop_last) */
};

struct rs_v_pd {
    struct rs_rnic_pd base;
    struct ibv_pd *pd;
    atomic_int users;               /* MRs, SRQs, QPs */
};

/* The rs_rnic_mr handed out; lkey from `local`, rkey from `remote` (absent without remote access, or after
 * rs_rnic_mr_invalidate). */
struct rs_v_mr {
    struct rs_rnic_mr pub;
    struct ibv_mr *local;
    struct ibv_mr *remote;
    atomic_int refs;                /* 1 for the application + emulated operations in flight */
    bool dead;                      /* deregistered by the application; freed at the last reference */
};

struct rs_v_qp;

/* What an rdma_cm_id's context points at: the object its events belong to. */
enum rs_v_idkind { RS_V_ID_QP = 1, RS_V_ID_LISTENER, RS_V_ID_PEER, RS_V_ID_UDBIND };
struct rs_v_idref {
    enum rs_v_idkind kind;
    void *obj;
};

/* A CQ: RC completions come from `cq`; everything the provider completes itself goes through `ring`. */
struct rs_v_cq {
    struct rs_rnic_cq base;
    struct ibv_cq *cq;
    struct ibv_comp_channel *channel;
    int event_fd;                   /* software completions wake waiters through this */
    int poll_fd;                    /* epoll set of channel fd + event_fd: what rs_rnic_cq_fd returns */
    struct rs_lock lock;            /* common/lock.h: taken on every poll */
    struct rs_rnic_wc *ring;
    uint32_t depth, head, count;
    atomic_bool overflow;
    bool overflow_handled;          /* the QPs attached were moved to ERROR */
    int armed;                      /* 0, 1 any completion, 2 solicited (or error) only */
    int hw_armed;                   /* the same for the device CQ: 0 also once its event was read */
    atomic_uint event_fd_pending;   /* writes to event_fd announced and not yet read: the next ack reads it */
    uint32_t unacked_events;        /* ibv_get_cq_event results not yet acknowledged */
    struct rs_v_qp **qps;           /* attached QPs */
    uint32_t nqps, qps_cap;
    /* UD QPs whose datagrams complete here: a poller that finds nothing runs their progress itself, so a
     * spinning application never waits for the progress thread to be scheduled. */
    pthread_mutex_t ud_lock;
    struct rs_v_qp **ud_qps;
    uint32_t nud, ud_cap;
};

/* Shadow of a verbs work queue: the ibv wr_id of every request is the address of its slot, so a completion
 * finds its QP and the application's wr_id without a lookup, and we know exactly what is outstanding. */
struct rs_v_srq;
struct rs_v_slot {
    uint64_t wr_id;
    struct rs_v_qp *qp;             /* NULL for an SRQ's slot */
    struct rs_v_srq *srq;
    uint32_t index;
    uint8_t opcode;                 /* enum rs_rnic_wc_opcode */
    uint8_t internal;               /* provider's own request: never shown to the application */
};

struct rs_v_wq {
    struct rs_v_slot *slots;
    uint32_t size;                  /* requests the queue takes */
    uint32_t mask;                  /* slots - 1: a power of two at least size, so a sequence number finds its slot
                                     * by a mask (a division costs a helper call per request under TCG) */
    atomic_uint head;               /* posted (producer: the posting thread) */
    atomic_uint tail;               /* retired (consumer: the CQ poller) */
};

/* A software receive queue (UD QPs, and SRQs used by UD QPs): entries are taken in posting order and completed
 * in posting order even when filled out of order (segmented SENDs). */
struct rs_v_recv {
    uint64_t wr_id;
    struct rs_rnic_sge *sge;        /* points into the queue's SGE pool */
    int num_sge;
    uint64_t total;
    /* filled when taken */
    struct rs_v_qp *qp;
    bool done;
    enum rs_rnic_wc_status status;
    uint32_t byte_len;
    unsigned flags;
    struct sockaddr_storage src;
    uint32_t src_qpn;
};

struct rs_v_rq {
    pthread_mutex_t lock;
    struct rs_v_recv *entries;
    struct rs_rnic_sge *sges;
    uint32_t size, max_sge;
    uint64_t head, taken, tail;     /* head <= taken <= tail; [head,taken) taken, [taken,tail) posted */
};

struct rs_v_srq {
    struct rs_rnic_srq base;
    struct rs_v_pd *pd;
    struct ibv_srq *srq;            /* used when RC QPs attach */
    uint32_t max_wr, max_sge;
    int mode;                       /* 0 undecided, 1 RC (ibv_srq), 2 UD (software queue) */
    atomic_int users;
    atomic_int *xrcd_users;         /* XRC SRQ: its domain's user count */
    pthread_mutex_t lock;           /* slots (RC) */
    struct rs_v_slot *slots;
    uint32_t *free_slots, nfree;
    struct rs_v_rq rq;              /* UD mode, and receives posted before the mode is known */
};

enum rs_v_conn_state {
    RS_V_CONN_NONE,                 /* never connected (or back to INIT after a failed attempt) */
    RS_V_CONN_RESOLVING,            /* active: address / route resolution */
    RS_V_CONN_CONNECTING,           /* active: REQ sent; passive: REP sent */
    RS_V_CONN_ESTABLISHED,
    RS_V_CONN_DRAINING,             /* orderly disconnect: waiting for the send queue to drain */
    RS_V_CONN_DISCONNECTING,        /* DREQ sent */
    RS_V_CONN_CLOSED,               /* disconnected or failed; the QP is in ERROR */
};

struct rs_v_qp {
    struct rs_rnic_qp base;
    struct rs_v_pd *pd;
    struct rs_v_dev *dev;
    enum rs_rnic_qp_type type;
    struct rs_v_cq *send_cq, *recv_cq;
    struct rs_v_srq *srq;
    struct ibv_qp *qp;
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
    bool sq_sig_all;
    bool imm_data;                  /* SEND_WITH_IMM is the caller's (rnic.h), not an emulated invalidation */
    struct rs_rnic_qos qos;
    uint32_t read_timeout_ms, record_timeout_ms;
    pthread_mutex_t lock;           /* state, connection */
    _Atomic int state;              /* enum rs_rnic_qp_state */
    /* RC */
    struct rs_v_wq sq, rq;
    struct rs_v_idref idref;
    struct rdma_cm_id *id;
    struct rs_v_cm *cm;
    enum rs_v_conn_state conn;
    bool error_reported;            /* an ERROR or DISCONNECTED event went out: nothing more */
    bool qos_pending;               /* the send queue drains (SQD) so the path can take new QoS */
    bool passive;
    uint64_t deadline_ms;           /* connect timeout (active) */
    uint8_t private_data[RS_V_CONNECT_PRIVATE];
    uint32_t private_len;
    uint8_t responder_resources, initiator_depth;
    /* Mailbox: 64 bytes the peer may RDMA WRITE (docs/verbs.md: orderly or abortive close). The peer writes
     * RS_V_MBOX_ORDERLY at [0] before an orderly disconnect; an active peer writes its own mailbox's address at
     * [16]; [32] and [48] hold what we write to the peer's. */
    uint8_t *mbox;
    struct ibv_mr *mbox_mr;
    bool peer_mbox_known;
    uint64_t peer_mbox_addr;
    uint32_t peer_mbox_rkey;
    atomic_int *xrcd_users;         /* XRC TGT: its domain's user count */
    /* UD */
    struct rs_v_ud *ud;
    struct rs_v_rq own_rq;          /* UD receive queue (software), unless srq */
};

/* What the progress thread's epoll entries point at. */
struct rs_v_watch {
    int tag;
    void *obj;
};

/* One rdma_cm event channel, read by the progress thread, and the queue of rnic.h events it produced (plus the
 * provider's own: errors, timeouts) behind an eventfd. */
struct rs_v_cm {
    struct rs_rnic_cm base;
    struct rs_v_dev *dev;
    struct rdma_event_channel *channel;
    struct rs_v_watch watch;
    int event_fd;
    pthread_mutex_t lock;
    struct rs_v_cm_item *head, *tail;   /* synthetic events */
    struct rs_v_pending *pending;       /* operations with a deadline */
    atomic_int refs;
};

struct rs_v_cm_item {
    struct rs_v_cm_item *next;
    struct rs_rnic_cm_event ev;
};

/* Something waiting with a deadline: an active connect, a drain before the DREQ, a UD peer resolution. */
enum rs_v_pending_kind { RS_V_PENDING_CONNECT = 1, RS_V_PENDING_DRAIN, RS_V_PENDING_PEER };
struct rs_v_pending {
    struct rs_v_pending *next;
    enum rs_v_pending_kind kind;
    uint64_t deadline_ms;
    struct rs_v_qp *qp;
    struct rs_v_peer *peer;
};

struct rs_v_listener {
    struct rs_rnic_listener base;
    struct rs_v_idref idref;
    struct rs_v_cm *cm;
    struct rdma_cm_id *id;
};

struct rs_v_conn_request {
    struct rs_rnic_conn_request base;
    struct rs_v_cm *cm;
    struct rdma_cm_id *id;
    uint8_t responder_resources, initiator_depth;
};

enum rs_v_peer_state { RS_V_PEER_RESOLVING, RS_V_PEER_READY, RS_V_PEER_FAILED };

struct rs_v_peer {
    struct rs_rnic_ud_peer base;
    struct rs_v_idref idref;
    struct rs_v_qp *qp;
    struct rs_v_cm *cm;
    struct rdma_cm_id *id;          /* while resolving */
    _Atomic int state;
    struct sockaddr_storage addr;
    void *context;
    struct rs_rnic_qos qos;
    bool own_qos;                   /* qos given to resolve; otherwise the QP's */
    struct ibv_ah_attr ah_attr;
    struct ibv_ah *ah;
    uint32_t ah_qos_gen;            /* the QP's qos generation the AH was built with */
    uint32_t remote_qpn, remote_qkey;
    bool multicast;
    atomic_int refs;                /* the application + queued sends */
    bool freed;
    uint64_t deadline_ms;
};

/* ---- device.c --------------------------------------------------------------------------------------------- */

extern const struct rs_rnic_ops rs_v_ops;
uint64_t rs_v_now_ms(void);
void rs_v_dev_get(struct rs_v_dev *dev);
void rs_v_dev_put(struct rs_v_dev *dev);
/* Handles every pending async event of the device (non-blocking). */
void rs_v_async_drain(struct rs_v_dev *dev);
int rs_v_errno_from_rdma(int ret);
void rs_v_register_qpn(struct rs_v_dev *dev, struct rs_v_qp *qp);
void rs_v_unregister_qpn(struct rs_v_dev *dev, struct rs_v_qp *qp);
struct rs_v_qp *rs_v_find_qpn(struct rs_v_dev *dev, uint32_t qpn);

/* ---- mem.c ------------------------------------------------------------------------------------------------ */

int rs_v_alloc_pd(struct rs_rnic *rnic, struct rs_rnic_pd **out);
int rs_v_dealloc_pd(struct rs_rnic_pd *pd);
int rs_v_reg_mr(struct rs_rnic_pd *pd, void *addr, size_t length, unsigned access, struct rs_rnic_mr **out);
int rs_v_dereg_mr(struct rs_rnic_mr *mr);
int rs_v_mr_invalidate(struct rs_rnic_mr *mr);
int rs_v_mr_rekey(struct rs_rnic_mr *mr);
/* Software checks for the UD emulation, with dev->mr_lock held (for reading at least). A region found this way
 * stays registered while the lock is held; rs_v_mr_get keeps its ibv_mr alive longer (the device reads it). */
struct rs_v_mr *rs_v_mr_find_rkey_locked(struct rs_v_dev *dev, uint32_t rkey);
struct rs_v_mr *rs_v_mr_find_lkey_locked(struct rs_v_dev *dev, uint32_t lkey);
void rs_v_mr_get(struct rs_v_mr *mr);
void rs_v_mr_put(struct rs_v_mr *mr);
/* Remote invalidation (emulated SEND_WITH_INVALIDATE): drops the rkey if it names a region of pd. */
bool rs_v_mr_invalidate_rkey(struct rs_v_dev *dev, struct rs_v_pd *pd, uint32_t rkey);
/* [addr, addr+len) lies inside the region, without wrapping. */
bool rs_v_mr_covers(const struct rs_v_mr *mr, uint64_t addr, uint64_t len);

/* ---- cq.c ------------------------------------------------------------------------------------------------- */

int rs_v_create_cq(struct rs_rnic *rnic, uint32_t depth, struct rs_rnic_cq **out);
int rs_v_destroy_cq(struct rs_rnic_cq *cq);
int rs_v_cq_fd(const struct rs_rnic_cq *cq);
int rs_v_cq_arm(struct rs_rnic_cq *cq, bool solicited_only);
void rs_v_cq_ack_events(struct rs_rnic_cq *cq);
int rs_v_poll_cq(struct rs_rnic_cq *cq, int n, struct rs_rnic_wc *wc);
/* Adds a completion the provider made; false when the CQ overflowed (the CQ is then in error). */
bool rs_v_cq_push(struct rs_v_cq *cq, const struct rs_rnic_wc *wc);
/* Whether the CQ has more than `reserved` free slots (and did not overflow). */
bool rs_v_cq_room(struct rs_v_cq *cq, uint32_t reserved);
void rs_v_cq_attach(struct rs_v_cq *cq, struct rs_v_qp *qp);
void rs_v_cq_detach(struct rs_v_cq *cq, struct rs_v_qp *qp);
/* UD QPs whose progress a poller of cq may run (added at bind, removed before the QP goes away). */
int rs_v_cq_add_ud(struct rs_v_cq *cq, struct rs_v_qp *qp);
void rs_v_cq_remove_ud(struct rs_v_cq *cq, struct rs_v_qp *qp);
/* Moves every completion the device holds into the software ring (before a QP goes away). */
void rs_v_cq_pump(struct rs_v_cq *cq);
/* The CQ overflowed: marks it and moves the QPs attached to it to ERROR. */
void rs_v_cq_overflowed(struct rs_v_cq *cq);
enum rs_rnic_wc_status rs_v_wc_status(enum ibv_wc_status status, bool receive);

/* ---- qp.c ------------------------------------------------------------------------------------------------- */

int rs_v_create_srq(struct rs_rnic_pd *pd, uint32_t max_wr, uint32_t max_sge, struct rs_rnic_srq **out);
int rs_v_destroy_srq(struct rs_rnic_srq *srq);
int rs_v_post_srq_recv(struct rs_rnic_srq *srq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
int rs_v_create_qp(struct rs_rnic_pd *pd, const struct rs_rnic_qp_attr *attr, struct rs_rnic_qp **out);
int rs_v_destroy_qp(struct rs_rnic_qp *qp);
enum rs_rnic_qp_state rs_v_qp_state(const struct rs_rnic_qp *qp);
uint32_t rs_v_qp_num(const struct rs_rnic_qp *qp);
int rs_v_qp_set_qos(struct rs_rnic_qp *qp, const struct rs_rnic_qos *qos);
int rs_v_qp_set_error(struct rs_rnic_qp *qp);
int rs_v_post_send(struct rs_rnic_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr);
int rs_v_post_send_inline(struct rs_rnic_qp *qp, uint64_t wr_id, const struct rs_rnic_sge *sge, unsigned flags,
                          bool with_imm, uint32_t imm_data);
int rs_v_post_recv(struct rs_rnic_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
/* RC state changes driven by rdma_cm (attributes from rdma_init_qp_attr, our QoS and timeouts on top). */
int rs_v_rc_to_init(struct rs_v_qp *qp, struct rdma_cm_id *id);
int rs_v_rc_to_rtr_rts(struct rs_v_qp *qp, struct rdma_cm_id *id);
int rs_v_rc_modify_state(struct rs_v_qp *qp, enum ibv_qp_state state);
int rs_v_rc_reset_to_init(struct rs_v_qp *qp);
void rs_v_rc_apply_qos(struct rs_v_qp *qp);
/* Mailbox: the REP trailer (accept), taking the peer's from a REP, telling it ours, flagging an orderly close. */
void rs_v_mbox_trailer(struct rs_v_qp *qp, uint8_t *rep);
void rs_v_mbox_from_rep(struct rs_v_qp *qp, const uint8_t *rep, uint32_t len);
int rs_v_mbox_introduce(struct rs_v_qp *qp);
int rs_v_mbox_say_orderly(struct rs_v_qp *qp);
/* What the peer's DREQ means: 1 orderly, 0 abortive, -1 unknown (a peer without mailboxes). */
int rs_v_mbox_peer_closed_orderly(struct rs_v_qp *qp);
/* The verbs QP is in ERROR (asked the device). */
bool rs_v_rc_device_error(struct rs_v_qp *qp);
/* Marks the QP failed: state ERROR, the device QP to ERROR, one ERROR event on its CM. */
void rs_v_qp_fail(struct rs_v_qp *qp, int error);
/* A completion of qp came back with an error status (a flush during an orderly close is not a failure). */
void rs_v_qp_completion_error(struct rs_v_qp *qp, enum rs_rnic_wc_status status);
void rs_v_srq_slot_free(struct rs_v_srq *srq, struct rs_v_slot *slot);
/* Software receive queues. */
int rs_v_rq_init(struct rs_v_rq *rq, uint32_t size, uint32_t max_sge);
void rs_v_rq_fini(struct rs_v_rq *rq);
int rs_v_rq_post(struct rs_v_rq *rq, struct rs_v_dev *dev, struct rs_rnic_recv_wr *wr,
                 struct rs_rnic_recv_wr **bad_wr);
/* Takes the oldest posted receive for qp (lock held by the caller); NULL if none. */
struct rs_v_recv *rs_v_rq_take(struct rs_v_rq *rq, struct rs_v_qp *qp);
/* Finishes a taken receive and releases, in posting order, every finished one (lock held). */
void rs_v_rq_finish(struct rs_v_rq *rq, struct rs_v_recv *r);
/* Flushes what qp took and, when `all`, every posted receive too (lock held). */
void rs_v_rq_flush(struct rs_v_rq *rq, struct rs_v_qp *qp, bool all);
struct rs_v_rq *rs_v_qp_rq(struct rs_v_qp *qp);

/* ---- cm.c ------------------------------------------------------------------------------------------------- */

int rs_v_cm_create(struct rs_rnic *rnic, struct rs_rnic_cm **out);
void rs_v_cm_destroy(struct rs_rnic_cm *cm);
int rs_v_cm_fd(const struct rs_rnic_cm *cm);
int rs_v_cm_get_event(struct rs_rnic_cm *cm, struct rs_rnic_cm_event *ev);
int rs_v_listen(struct rs_rnic_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                struct rs_rnic_listener **out);
int rs_v_listener_addr(const struct rs_rnic_listener *listener, struct sockaddr_storage *out);
void rs_v_listener_close(struct rs_rnic_listener *listener);
int rs_v_connect(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *dst, socklen_t len,
                 const void *private_data, uint32_t private_data_len, uint32_t timeout_ms);
int rs_v_accept(struct rs_rnic_conn_request *request, struct rs_rnic_qp *qp, struct rs_rnic_cm *cm,
                const void *private_data, uint32_t private_data_len);
int rs_v_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len);
int rs_v_disconnect(struct rs_rnic_qp *qp);
int rs_v_qp_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);
/* Queues a provider-made event and wakes the channel. */
void rs_v_cm_push(struct rs_v_cm *cm, const struct rs_rnic_cm_event *ev);
void rs_v_cm_get(struct rs_v_cm *cm);
void rs_v_cm_put(struct rs_v_cm *cm);
/* Deadlines. */
int rs_v_cm_add_pending(struct rs_v_cm *cm, enum rs_v_pending_kind kind, struct rs_v_qp *qp, struct rs_v_peer *peer,
                        uint64_t deadline_ms);
void rs_v_cm_remove_pending(struct rs_v_cm *cm, struct rs_v_qp *qp, struct rs_v_peer *peer);
/* Progress thread: reads the channel and takes the next steps; runs deadlines (returns the next one, 0 none). */
void rs_v_cm_process(struct rs_v_cm *cm);
uint64_t rs_v_cm_deadlines(struct rs_v_cm *cm, uint64_t now);
/* Drops queued events that name qp (it is being destroyed). */
void rs_v_cm_forget_qp(struct rs_v_cm *cm, struct rs_v_qp *qp);
/* The send queue drained (or the wait timed out): applies new QoS and resumes, or sends the DREQ and flushes. */
void rs_v_rc_drained(struct rs_v_qp *qp);
size_t rs_v_sockaddr_len(const struct sockaddr *sa);
bool rs_v_sockaddr_ok(const struct sockaddr *sa, socklen_t len);

/* ---- progress.c ------------------------------------------------------------------------------------------- */

/* The device's progress thread, started on first use. */
int rs_v_progress_start(struct rs_v_dev *dev);
void rs_v_progress_stop(struct rs_v_dev *dev);
struct ibv_comp_channel *rs_v_progress_channel(struct rs_v_dev *dev);
struct rdma_event_channel *rs_v_progress_cm_channel(struct rs_v_dev *dev);
/* Wakes the thread so it re-reads its timers. */
void rs_v_progress_kick(struct rs_v_dev *dev);
/* A deadline another thread set (a message being put together): wakes the thread if it would sleep past it. */
void rs_v_progress_note_deadline(struct rs_v_dev *dev, uint64_t deadline_ms);
/* UD QPs whose internal CQ, timers and SIDR answers the thread serves. Unwatching waits until the thread is not
 * working on the QP, so the caller may free it afterwards. */
int rs_v_progress_watch_qp(struct rs_v_dev *dev, struct rs_v_qp *qp);
void rs_v_progress_unwatch_qp(struct rs_v_dev *dev, struct rs_v_qp *qp);
/* A CQ overflowed while the caller held QP locks: the thread moves its QPs to ERROR. */
void rs_v_progress_overflow(struct rs_v_dev *dev, struct rs_v_cq *cq);
void rs_v_progress_forget_cq(struct rs_v_dev *dev, struct rs_v_cq *cq);
int rs_v_progress_watch_cm(struct rs_v_dev *dev, struct rs_v_cm *cm);
void rs_v_progress_unwatch_cm(struct rs_v_dev *dev, struct rs_v_cm *cm);
bool rs_v_on_progress_thread(const struct rs_v_dev *dev);

/* ---- ud.c ------------------------------------------------------------------------------------------------- */

int rs_v_ud_create(struct rs_v_qp *qp);
void rs_v_ud_destroy(struct rs_v_qp *qp);
int rs_v_ud_bind(struct rs_rnic_qp *qp, const struct sockaddr *local, socklen_t len);
int rs_v_ud_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);
int rs_v_ud_resolve_peer(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *peer,
                         const struct rs_rnic_qos *qos, uint32_t timeout_ms, void *context,
                         struct rs_rnic_ud_peer **out);
void rs_v_ud_peer_free(struct rs_rnic_ud_peer *peer);
void rs_v_peer_put(struct rs_v_peer *peer);
int rs_v_ud_counters(const struct rs_rnic_qp *qp, struct rs_rnic_ud_counters *out);
int rs_v_ud_join_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group, const struct sockaddr *iface);
int rs_v_ud_leave_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group);
int rs_v_ud_post_send(struct rs_v_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr);
int rs_v_ud_post_recv(struct rs_v_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
void rs_v_ud_set_error(struct rs_v_qp *qp);
void rs_v_ud_qos_changed(struct rs_v_qp *qp);
/* ud_progress.c: who runs the internal CQ. The progress thread after the CQ's event: */
void rs_v_ud_on_event(struct rs_v_qp *qp);
/* ... and while the CQ is left to polling callers: returns when to look again (ms, 0 = armed, no need). */
uint64_t rs_v_ud_duty_tick(struct rs_v_qp *qp, uint64_t now_ms);
/* An application thread polling a CQ of the QP: skipped when someone else is at it. */
void rs_v_ud_try_progress(struct rs_v_qp *qp);
/* An application thread arming a CQ of the QP, to sleep on its fd: the thread must be woken again. */
void rs_v_ud_app_waits(struct rs_v_qp *qp);
/* Runs what is due; returns the next deadline (ms, 0 = none). */
uint64_t rs_v_ud_timers(struct rs_v_qp *qp, uint64_t now_ms);
/* rdma_cm events for the ids the progress thread owns (UD binds: SIDR requests, multicast joins). */
void rs_v_ud_cm_event(struct rs_v_qp *qp, struct rdma_cm_event *event);
/* cm.c hands the events of a peer resolution here; true when the peer reached a final state. */
bool rs_v_ud_peer_event(struct rs_v_peer *peer, struct rdma_cm_event *event, struct rs_rnic_cm_event *out,
                        struct rdma_cm_id **destroy);
void rs_v_ud_peer_timeout(struct rs_v_peer *peer, struct rs_rnic_cm_event *out);

/* ---- xrc.c ------------------------------------------------------------------------------------------------ */

bool rs_v_xrc_supported(struct rs_v_dev *dev);
bool rs_v_is_xrc(enum rs_rnic_qp_type type);
int rs_v_xrcd_open(struct rs_rnic *rnic, int fd, struct rs_rnic_xrcd **out);
int rs_v_xrcd_close(struct rs_rnic_xrcd *xrcd);
int rs_v_create_xsrq(struct rs_rnic_pd *pd, struct rs_rnic_xrcd *xrcd, struct rs_rnic_cq *cq, uint32_t max_wr,
                     uint32_t max_sge, struct rs_rnic_srq **out);
uint32_t rs_v_srq_num(const struct rs_rnic_srq *srq);
int rs_v_xrc_create_qp(struct rs_v_qp *qp, struct rs_rnic_xrcd *xrcd);
int rs_v_xrc_create_id(struct rdma_event_channel *channel, const struct sockaddr *src, void *context,
                       struct rdma_cm_id **out);
/* qp.c: wraps a device SRQ (plain or XRC) in the provider's SRQ. */
int rs_v_srq_wrap(struct rs_rnic_pd *pd, struct ibv_srq *srq, uint32_t max_wr, uint32_t max_sge,
                  struct rs_rnic_srq **out);

/* ---- TEST ONLY -------------------------------------------------------------------------------------------- */

/* Drops this share of the datagrams the device's UD QPs receive, before the provider looks at them, the way a
 * lossy network would (rxe's loopback never loses one). 0 turns it off. For the Write-Record loss tests. */
void rs_v_test_set_drop(struct rs_rnic *rnic, uint32_t per_million, uint64_t seed);
/* Drops the last datagram of every message longer than one datagram (on), so a Write-Record's timeout can be
 * shown on a device that loses nothing. */
void rs_v_test_drop_last(struct rs_rnic *rnic, bool on);

/* ---- helpers ---------------------------------------------------------------------------------------------- */

static inline struct rs_v_dev *rs_v_dev(struct rs_rnic *rnic) { return (struct rs_v_dev *)rnic; }
static inline struct rs_v_qp *rs_v_qp(struct rs_rnic_qp *qp) { return (struct rs_v_qp *)qp; }
static inline struct rs_v_cq *rs_v_cq(struct rs_rnic_cq *cq) { return (struct rs_v_cq *)cq; }
static inline struct rs_v_cm *rs_v_cm(struct rs_rnic_cm *cm) { return (struct rs_v_cm *)cm; }
static inline struct rs_v_pd *rs_v_pd(struct rs_rnic_pd *pd) { return (struct rs_v_pd *)pd; }
static inline struct rs_v_mr *rs_v_mr(struct rs_rnic_mr *mr) { return (struct rs_v_mr *)mr; }
static inline struct rs_v_srq *rs_v_srq(struct rs_rnic_srq *srq) { return (struct rs_v_srq *)srq; }
/* RC and the XRC types: QPs with a connection (rdma_cm), as opposed to UD. */
static inline bool rs_v_connected(const struct rs_v_qp *qp) { return qp->type != RS_QPT_UD; }

#endif /* RS_RNIC_VERBS_VERBS_H */
