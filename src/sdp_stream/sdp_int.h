/*
 * sdp_int.h: what the sdp_stream files share. Not for other layers (they use sdp.h).
 *
 * Locking: one mutex per socket (s->lock) guards everything in struct rs_sdp_sock except refs (atomic) and the
 * fields marked "progress thread". Copies between the application's buffers and the rings run outside the lock:
 * a receiver owns the head of the receive queue while rx_busy is set, a sender owns the free part of the send ring
 * while tx_busy is set. Lock order: listener before child is never taken; a child's lock is released before its
 * listener's is taken. The progress module's queue lock, the device table lock and the registration cache lock are
 * leaves. Nothing calls into the progress thread synchronously while holding a socket lock.
 */
#ifndef RS_SDP_STREAM_SDP_INT_H
#define RS_SDP_STREAM_SDP_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "rnic/rnic.h"
#include "common/compiler.h"
#include "common/lock.h"
#include "sdp_stream/sdp.h"
#include "sdp_stream/sdp_wire.h"

/* ---- tunables (docs/sdp.md explains each) ---- */
#define SDP_DEFAULT_RCVBUF (1u << 20)           /* receive ring, bytes, as SO_RCVBUF reports it */
#define SDP_DEFAULT_SNDBUF (1u << 20)           /* send buffer */
#define SDP_MIN_BUFSPACE (16u * 1024u)
#define SDP_MAX_BUFSPACE (64u << 20)
#define SDP_MIN_RBUF 4096u                      /* smallest receive buffer (BSDH included) */
#define SDP_MAX_RBUF (64u * 1024u)
#define SDP_RING_TARGET_BUFS 16u                /* the ring is split into about this many buffers */
#define SDP_REPOST_MAX 16u                      /* receive buffers reposted in one chained request, at most */
#define SDP_MIN_RX_BUFS 8u
#define SDP_MAX_RX_BUFS 4096u
#define SDP_HDR_SLOT 64u                        /* bytes of header space per send queue slot */
/* Messages up to this size (BSDH included) go inline, if the RNIC can. */
#define SDP_INLINE_MAX (RS_SDP_SHORT_SEND_MAX + RS_SDP_BSDH_LEN)
/* Copies up to this size keep the socket lock (sdp_tx.c, sdp_rx.c). */
#define SDP_COPY_LOCKED_MAX RS_SDP_SHORT_RECV_MAX
#define SDP_QUIET_RUN 16u                       /* at most this many inline Data messages between signaled sends */
#define SDP_LAZY_TICK_MS 1u                     /* CQ left to the application: the progress thread's first look */
#define SDP_LAZY_TICK_MAX_MS 256u               /* ... doubling up to this while the application stays at the CQ */
_Static_assert(SDP_LAZY_TICK_MAX_MS <= UINT16_MAX, "lazy_tick_ms must hold the longest look interval");
#define SDP_NAGLE_MS 5u                         /* longest a partial message waits for an acknowledgement */
#define SDP_CORK_MS 200u                        /* longest TCP_CORK / MSG_MORE hold a partial message */
#define SDP_ORPHAN_TIMEOUT_MS 60000u            /* a closed socket's connection is given this long to finish */
#define SDP_EXIT_FLUSH_MS 3000u                 /* at process exit, time given to orphans to deliver data */
#define SDP_CONNECT_TIMEOUT_MS 5000u
#define SDP_CANCEL_TIMEOUT_MS 2000u             /* a cancel not answered within this resets the connection */
#define SDP_SRCAVAIL_IDLE_MS 200u               /* a SrcAvail nobody reads is cancelled after this (bcopy takes over) */
#define SDP_ZCOPY_MIN_THRESHOLD 4096u
#define SDP_ZCOPY_MAX_THRESHOLD (1u << 20)
#define SDP_ZC_CLASSES 12                       /* write sizes 4 KiB .. 8 MiB and above, by powers of two */
#define SDP_ZC_PROBE_EVERY 32                   /* the slower method is tried again after 32, 64, ... 4096 writes */
#define SDP_ZC_PROBE_MAX_LEVEL 7
#define SDP_KA_IDLE_DEFAULT 7200
#define SDP_KA_INTVL_DEFAULT 75
#define SDP_KA_CNT_DEFAULT 9
#define SDP_REDIRECT_MAX_HOPS 3                 /* a connect follows at most this many redirects (sdp_family.c) */
#define SDP_DISPATCH_HOLD_MS 2000u              /* a request no member waits for is held this long, then dealt out */
#define SDP_DISPATCH_HOLD_EMPTY_MS 3000u        /* ... or this long while the family has no member at all */
#define SDP_DISPATCH_TICK_MS 2u                 /* how often held requests look at the table again */
#define SDP_DISPATCH_MAX_HELD 64u
#define SDP_FAMILY_CHECK_MS 1000u               /* a member looks this often whether its holder still lives */
#define SDP_HB_RESPONDER_TIMEOUT_MS 10000u      /* a hand-back the peer started must be over within this */
#define SDP_HB_BUF_FORCE (8u << 20)             /* kernel socket buffers asked for a hand-back's tails (root only) */

/* Hand-back to kernel TCP (sdp_handback.c, docs/sdp.md). */
enum sdp_hb_phase {
    SDP_HB_NONE = 0,
    SDP_HB_QUIESCE,         /* the application's calls wait; zero-copy transfers are being finished or cancelled */
    SDP_HB_SUSPENDED,       /* our SuspComm / SuspCommAck is sent: nothing more goes on the QP but control messages */
    SDP_HB_DONE,            /* the kernel socket continues the stream; calls answer -EREMCHG */
};

enum sdp_state {
    SDP_ST_IDLE,            /* created, maybe bound */
    SDP_ST_LISTEN,
    SDP_ST_CONNECTING,      /* active side, waiting for ESTABLISHED */
    SDP_ST_ACCEPTING,       /* passive child, accepted, waiting for ESTABLISHED */
    SDP_ST_CONNECTED,       /* both directions may still be open: see the shutdown flags */
    SDP_ST_CLOSED,          /* the connection is over (closed, reset or failed to connect) */
};

/* wr_id layout: bit 63 set for send-queue work, the low bits are the slot or receive buffer index. */
#define SDP_WR_SEND (1ull << 63)

enum sdp_slot_kind {
    SDP_SLOT_FREE = 0,
    SDP_SLOT_MSG,           /* a SEND; ring_bytes of the send ring are released on completion */
    SDP_SLOT_WRITE,         /* RDMA WRITE into the peer's sink; ring_bytes as above */
    SDP_SLOT_READ,          /* RDMA READ of the peer's SrcAvail */
    SDP_SLOT_KA_READ,       /* keepalive probe */
    SDP_SLOT_ZWRITE,        /* RDMA WRITE from the application's buffer into the peer's sink */
};

struct sdp_slot {
    uint8_t kind;
    bool done;
    bool quiet;                     /* posted unsignaled: retired by the next signaled completion */
    uint8_t mid;
    uint32_t ring_bytes;
};

enum sdp_rx_kind { SDP_RX_DATA = 1, SDP_RX_SRC = 2 };

struct sdp_rx_entry {
    uint8_t kind;
    uint32_t buf;           /* DATA: receive buffer index */
    uint32_t off;           /* DATA: next unread byte within the buffer */
    uint32_t len;           /* DATA: unread bytes; SRC: unread bytes of the advertisement */
};

struct sdp_waiter {
    struct sdp_waiter *next;
    int fd;
    bool signalled;
    bool rx_only;                   /* only the peer's messages can end this wait (a reader waiting for data) */
    bool spinning;                  /* its thread is polling, not asleep: a signal need not write its fd */
    bool fd_written;                /* a signal wrote its fd: read it back before the fd serves another wait */
};

/* A socket's spin policy under RDMASOCK_SPIN_US=auto (sdp_spin.c); socket lock. */
struct sdp_spin_state {
    uint16_t hist;                  /* recent spin outcomes, newest in bit 0: 1 caught, 0 missed */
    uint8_t n;                      /* how many of hist's bits are outcomes (up to 16) */
    uint8_t off_waits;              /* waits without a spin since the last probe */
    bool probe_next;                /* a sleep ended soon: the next wait probes */
    bool probing;                   /* the current wait's spin is a probe */
    bool learning;                  /* the current wait's outcome is remembered (auto) */
};

enum sdp_spin_outcome {
    SDP_SPIN_MISSED,                /* the budget ran out */
    SDP_SPIN_CAUGHT_AT_ONCE,        /* signalled in the first round: it was there before the wait */
    SDP_SPIN_CAUGHT,                /* signalled in a later round: the spin saved a sleep */
    SDP_SPIN_CAUGHT_LATE,           /* signalled only after twice the budget: the yields between rounds slept
                                     * (every CPU busy), so the spin was a sleep that happened to end with data */
    SDP_SPIN_ENDED_OTHERWISE,       /* the budget ran out after signals that brought a reader no data, or the
                                     * connection left CONNECTED */
};

struct sdp_reg;             /* registration cache entry (sdp_regcache.c) */

/* One opened RNIC, its PD and what every socket on it shares. Lives until process exit. */
struct sdp_dev {
    struct sdp_dev *next;
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    int kind;
    const struct rs_rnic_caps *caps;
    uint8_t *ka_target;             /* 64 readable bytes: the target of the peers' keepalive READs */
    struct rs_rnic_mr *ka_mr;
    struct sdp_regcache *cache;
};

struct rs_sdp_sock {
    struct rs_lock lock;            /* common/lock.h: taken on every data call */
    atomic_int refs;
    unsigned epoch;                 /* fork generation the socket belongs to */
    int family;
    int kind_wanted;
    enum sdp_state state;
    /* The flags that end the steady state (rs_sdp_steady), side by side so that one load tests them all: the short
     * path asks on every call, and under TCG each branch it takes is a block of its own. */
    union {
        struct {
            bool app_closed;        /* rs_sdp_close was called */
            bool rx_eof;            /* peer sent DisConn (or the connection is gone): reads end */
            bool rd_shut;           /* SHUT_RD */
            bool wr_shut;           /* SHUT_WR asked: DisConn follows the pending data */
            bool broken;            /* reset / aborted / failed: nothing is sent any more */
            bool cm_gone;           /* DISCONNECTED or ERROR seen: the QP is in ERROR */
            bool owed_send_sm;      /* a SendSm must still go out (zero copy) */
            bool unsteady_spare_;
        };
        uint64_t unsteady_flags;
    };
    bool park_listener;             /* rs_sdp_close_parked: park the RNIC listener rather than close it */
    bool nonblock;
    bool bound;
    bool peer_valid;
    struct sockaddr_storage local, peer;

    /* options */
    uint32_t rcvbuf, sndbuf;        /* as reported (doubled) */
    int rcvlowat;
    int64_t rcvtimeo_ms, sndtimeo_ms;   /* 0: wait for ever */
    bool linger_on;
    int linger_s;
    bool keepalive;
    int ka_idle, ka_intvl, ka_cnt;
    bool nodelay, cork, reuseaddr, zerocopy_opt;
    int zcopy_opt;                  /* -1: default threshold; 0: off; else bytes */
    bool zcopy_adaptive;

    /* RNIC objects */
    struct sdp_dev *dev;
    struct rs_rnic_cm *cm;
    struct rs_rnic_cq *cq;
    struct rs_rnic_qp *qp;
    struct rs_rnic_listener *listener;
    uint32_t cq_depth;

    /* listener side */
    struct rs_sdp_sock *parent;     /* child: its listener (a reference is held) until accepted */
    struct rs_sdp_sock *q_next;     /* link in the listener's accept queue */
    struct rs_sdp_sock *acceptq_head, *acceptq_tail;
    int backlog;
    int children;                   /* accepted by us, not yet taken by rs_sdp_accept (queued or establishing) */
    /* A listener whose backlog other processes share takes connections only as the application asks for them
     * (rs_rnic_listener_intake; rs_sdp_intake_update says when). */
    bool intake_paced;
    bool intake_want;               /* accept found nothing, and has not returned a connection since */
    unsigned intake_set;            /* the intake last given to the RNIC */
    uint32_t requests_seen;         /* CONNECT_REQUESTs taken from the RNIC listener */
    uint32_t intake_set_seen;       /* requests_seen as last given */

    /* errors and shutdown */
    int so_error;                   /* positive errno pending for the application */
    bool disconn_sent;
    bool disconn_rcvd;
    bool ack_owed;                  /* the peer's DisConn must be acknowledged (its SO_LINGER waits for that) */
    uint32_t disconn_mseq;
    bool rnic_disconnect_done;      /* rs_rnic_disconnect called */
    bool teardown_queued;
    bool orphan_counted;            /* counted in the progress module's orphans (exit flush) */
    bool dirty;                     /* something the application may see changed: signal at the end */
    bool graceful;                  /* DisConn both ways: a later DISCONNECTED is the normal end */

    /* readiness */
    int notify_fd;
    bool notify_on;
    uint16_t interest_count[16];    /* per poll bit */
    unsigned interest_mask;         /* the bits whose count is not 0 */
    struct sdp_waiter *waiters;
    /* CQ duty (sdp_conn.c): who looks at the CQ. Under the lock; cq_lazy is written on the loop thread only. */
    unsigned app_poll_misses;       /* nonblocking calls that found nothing in the current window of looks */
    uint8_t app_poll_looks;         /* the progress thread's looks in that window */
    uint8_t app_absent_ticks;       /* lazy: consecutive ticks that found no application thread at the CQ */
    int cq_waiters;                 /* application threads asleep on the CQ fd */
    bool app_waited;                /* one slept on the CQ fd since the progress thread looked */
    bool cq_lazy;                   /* the progress thread has left the CQ to application threads */
    bool empty_wake_expected;       /* the next CQ wake-up may find nothing through no application's doing: the
                                     * thread's look after arming took completions, or it fed the event itself
                                     * (loop thread only) */
    uint16_t lazy_tick_ms;          /* lazy: time to the thread's next look (loop thread only, like cq_lazy) */
    bool duty_wanted;               /* an application thread waits for readiness: the thread must take the CQ back */

    /* receive ring */
    uint32_t rbuf_size;             /* each buffer, BSDH included */
    uint32_t nbufs;
    uint8_t *rbuf_mem;
    struct rs_rnic_mr *rbuf_mr;
    uint32_t rx_posted;
    uint32_t *rx_repost;            /* buffers recv() emptied, reposted together (capacity nbufs) */
    uint32_t rx_repost_n, rx_repost_batch;
    struct sdp_rx_entry *rxq;       /* FIFO of received data, capacity nbufs + 2 */
    uint32_t rxq_cap, rxq_head, rxq_count;
    uint64_t rx_bytes_queued;       /* what recv can return without waiting (SrcAvail bytes included) */
    bool rx_busy;                   /* a receiver owns the queue head */
    /* The short receive's direct hand-over (sdp_fast.c): while rx_direct_max is set (a short recv with the queue
     * empty, for one look at the CQ under its lock), the first compact Data that fits it is left here rather than
     * queued, and that recv copies it out before anything queued after it. Empty again before the lock is let go. */
    uint32_t rx_direct_max, rx_direct_len, rx_direct_buf;
    uint32_t rx_mseq_last;          /* last mseq received and processed */
    uint32_t adv_bufs, adv_ack;     /* bufs and mseq_ack in the last message we sent */
    bool last_rx_pure;              /* the last message received was a pure credit update */

    /* transmit */
    uint32_t peer_rbuf_size;        /* the peer's receive buffers: the largest message we may send */
    uint32_t tx_mseq_next;          /* mseq of the next message (starts at 1) */
    uint32_t peer_bufs, peer_ack;   /* from the latest message received */
    bool overdraft_out;             /* a control message sent beyond our credits is not yet acknowledged */
    uint32_t overdraft_mseq;
    uint32_t last_data_mseq;        /* our last data-bearing message (Data, SrcAvail, RdmaWrCompl, DisConn) */
    uint8_t *sbuf_mem;
    struct rs_rnic_mr *sbuf_mr;
    uint32_t sbuf_size;
    uint64_t tx_tail;               /* bytes the application handed over */
    uint64_t tx_posted;             /* bytes put on the wire (Data or RDMA WRITE) */
    uint64_t tx_done;               /* bytes whose work request completed: ring space free again */
    bool tx_busy;                   /* a sender owns the free part of the ring */
    uint8_t *hdr_mem;               /* SDP_HDR_SLOT bytes per slot; also the keepalive READ sink */
    struct rs_rnic_mr *hdr_mr;
    struct sdp_slot *slots;
    uint32_t sq_depth, sq_head, sq_tail, sq_used;
    uint32_t inline_max;            /* the QP's inline size: smaller messages are posted inline */
    uint32_t quiet_run;             /* unsignaled sends since the last signaled one */
    uint32_t quiet_bytes;           /* ring bytes of unsignaled sends not yet retired */
    bool more_hold;                 /* the last send had MSG_MORE */
    bool tx_stalled;                /* the last push stopped for lack of credits */
    uint32_t nagle_mseq;            /* our last partial Data message, unacknowledged while peer_ack < it */
    bool nagle_wait;
    uint64_t hold_since_ms;         /* when the pending partial message started waiting */

    /* timers (all CLOCK_MONOTONIC ms, 0 = none) */
    uint64_t close_deadline;        /* orphan / linger */

    /* keepalive */
    uint64_t last_rx_ms, last_tx_ms;
    /* Data moved while the CQ is the application's (cq_lazy) and its time not read yet: rs_sdp_stamps_settle
     * gives it the time of the next timer run (sdp_tx.c rs_sdp_stamp). */
    bool rx_stamp_due, tx_stamp_due;
    bool ka_read_out;
    uint64_t ka_probe_ms;           /* when the outstanding probe was posted */
    int ka_missed;
    uint32_t peer_ka_rkey;
    uint64_t peer_ka_addr;
    uint32_t rtt_us;                /* smoothed keepalive/handshake round trip */

    /* zero copy */
    bool peer_zcopy;                /* the peer understands SrcAvail/SinkAvail */
    uint32_t zthresh;               /* adaptive threshold in force; 0 = off */
    struct sdp_zclass {             /* adaptivity per size class (sdp_zcopy.c): measured rates, MB/s EWMA */
        uint32_t zc_rate, bc_rate;
        uint16_t since_probe;
        uint8_t probe_level;        /* probes of a method that keeps losing become rarer: every 32 << level */
        bool probing;
    } zclass[SDP_ZC_CLASSES],       /* sending: SrcAvail or copy, by write size */
      zsink_class[SDP_ZC_CLASSES];  /* receiving into an empty queue: SinkAvail or copy, by read size */
    struct {                        /* our SrcAvail (we send) */
        bool active;
        bool cancel_sent;
        bool resolved;              /* SendSm received, or every byte acknowledged */
        bool send_sm;               /* resolved by SendSm */
        uint32_t mseq, len, acked;
        uint64_t posted_ms;
        struct sdp_reg *reg;
    } zsrc;
    /* Our SrcAvail over bytes of the send ring (sdp_zcopy.c "Lending the ring"): send() has returned, the peer
     * RDMA-reads them from the ring. Ring bytes it acknowledged are freed in ring order: only once the SrcAvail's
     * own work request has retired (every earlier Data message then has). */
    struct {
        bool active;                /* outstanding: no other data-bearing message until it is resolved */
        bool cancel_sent;
        bool slot_open;             /* the SrcAvail's send slot has not retired yet */
        uint32_t slot, len, acked;
        uint32_t hold;              /* acknowledged bytes waiting for slot_open to clear */
        uint64_t ring_pos;          /* stream position of its first byte */
        uint64_t idle_from_ms;      /* posted, or last acknowledgement: the idle cancel counts from here */
        uint64_t cancel_deadline;
        uint32_t skip, backoff;     /* after a SendSm: regions sent by copy before lending again, and the next */
    } rsrc;
    int lend_ring_opt;              /* RS_SDP_LEND_RING: -1 auto, 0 off, 1 on */
    struct {                        /* the peer's SinkAvail we accepted (we send into it) */
        bool active;
        uint32_t mseq, len, rkey;
        uint64_t vaddr;
    } psink;
    uint64_t zsrc_cancel_deadline;
    bool zwrite_out;                /* an RDMA WRITE straight from the application's buffer is in flight */
    bool zwrite_failed;
    uint32_t owed_sink_cancel_acks; /* SinkCancelAck we must still send */
    uint32_t owed_rd_compl;         /* bytes read from the peer's SrcAvail not yet acknowledged by RdmaRdCompl */
    struct {                        /* the peer's SrcAvail we consume (we receive) */
        bool active;
        bool cancel_pending;        /* SrcAvailCancel arrived while a READ was in flight */
        bool send_sm_sent;
        bool read_out;              /* an RDMA READ into the application's buffer is in flight */
        bool read_uncounted;        /* a READ was posted and its reader has not yet counted its bytes: a cancel
                                     * must wait for that count (its completion alone clears read_out) */
        bool read_failed;
        uint32_t mseq, len, consumed, rkey;
        uint64_t vaddr;
    } psrc;
    struct {                        /* our SinkAvail (we receive) */
        bool active;
        bool dead;                  /* crossed by data: the peer drops it */
        bool retired;               /* RdmaWrCompl arrived */
        bool cancel_sent;
        bool cancel_acked;
        uint32_t mseq, len, written;
        uint64_t cancel_deadline;
        struct sdp_reg *reg;
    } sink;
    uint32_t late_cancel_acks;      /* SinkCancelAck still to come for sinks we stopped waiting for */
    uint32_t sink_skip;             /* receives left before we advertise a sink again (backoff) */
    uint8_t sink_backoff;           /* log2 of the current backoff */

    /* MSG_ZEROCOPY notifications (copied at once) */
    uint32_t zc_next_id;
    bool zc_pending;
    uint32_t zc_lo, zc_hi;

    struct rs_sdp_stats stats;
    struct sdp_spin_state spin;
    void *pw;                       /* progress watchers (sdp_progress.c) */
    /* prefork family (sdp_family.c): listeners and, for public_port, their children */
    struct sdp_family *fam;         /* the family's shared table; NULL when the listener is alone */
    int fam_slot;                   /* our entry in it (valid while fam is set) */
    bool fam_holder;                /* listens on the public port and dispatches */
    uint16_t public_port;           /* member listener and its children: the port clients dialled (host order) */
    struct sdp_held *held;          /* holder: requests waiting for a member (SDP_DISPATCH_MAX_HELD) */
    uint32_t n_held;
    uint64_t fam_check_ms;          /* member: when to look whether the holder still lives */
    bool fam_polling;               /* member: counted as waiting because a thread polls the listener */
    /* hand-back (sdp_handback.c) */
    bool peer_handback;             /* the peer announced RS_SDP_EXT_HANDBACK */
    bool peer_solicits;             /* the peer announced RS_SDP_EXT_SOLICITED */
    bool imm_rx;                    /* our QP takes compact Data (RS_SDP_EXT_IMM_DATA, announced in our Hello) */
    bool peer_imm;                  /* the peer announced it: small Data goes to it compact */
    bool passive;                   /* accepted (not connected) side: yields when both start a hand-back */
    struct {
        enum sdp_hb_phase phase;
        bool initiator;             /* we listen for the TCP connection; the peer connects */
        bool suspend_sent;          /* our SuspComm (initiator) or SuspCommAck (responder) is on the QP */
        bool ack_rcvd;              /* initiator: the peer's SuspCommAck arrived (all its data is in our ring) */
        bool fd_taken;
        uint64_t service_id;        /* token << 16 | port, as in the SuspComm */
        bool early_suspend;         /* active side: the peer's SuspComm came before its HelloAck was applied */
        uint64_t early_service_id;  /* that SuspComm's service id, answered once the HelloAck says hand-back */
        int fd;                     /* the kernel socket once DONE (-1 before, or after it was taken) */
    } hb;
    /* active side: redirects followed by the current connect */
    uint8_t redirects;
    struct sockaddr_storage dial;   /* where the current attempt goes (s->peer stays what the application named) */
};

/* Ring arithmetic without a division (a helper call per use under TCG): the index after i in a ring of n, and the
 * distance from `from` forward to `to` (both below n). */
static inline uint32_t sdp_next(uint32_t i, uint32_t n)
{
    return i + 1 == n ? 0 : i + 1;
}

static inline uint32_t sdp_ring_dist(uint32_t from, uint32_t to, uint32_t n)
{
    return to >= from ? to - from : to + n - from;
}

/* ---- sdp_fast.c ---- */
/* A connected socket in steady state, where the short path applies: no close, shutdown, error, hand-back or
 * zero-copy exchange under way. Lock held. */
_Static_assert(sizeof(((struct rs_sdp_sock *)0)->unsteady_flags) == 8 * sizeof(bool),
               "the steady-state flags fill unsteady_flags");

static inline bool rs_sdp_steady(const struct rs_sdp_sock *s)
{
    /* ORed rather than tested one by one: the answer is nearly always yes, and a chain of branches is a chain of
     * blocks under TCG. */
    return !(((uint32_t)s->state ^ SDP_ST_CONNECTED) | ((uint32_t)s->hb.phase ^ SDP_HB_NONE) | s->unsteady_flags |
             (uint32_t)s->so_error | s->owed_rd_compl | s->owed_sink_cancel_acks |
             (unsigned)(s->psrc.active | s->sink.active | s->zsrc.active | s->rsrc.active | s->psink.active));
}

/* In the steady state: whether a signal has anybody to tell (rs_sdp_signal returns at once otherwise), and whether
 * a timer may be due or need moving (timers_quiet in sdp_conn.c says no otherwise). Lock held. */
static inline bool rs_sdp_steady_listened(const struct rs_sdp_sock *s)
{
    return s->interest_mask || s->waiters || s->notify_on;
}
static inline bool rs_sdp_steady_timed(const struct rs_sdp_sock *s)
{
    return s->keepalive || s->close_deadline || s->hold_since_ms || s->duty_wanted;
}
/* Neither of the two: the end of a short call has nothing to signal or time. ORed, one branch, as rs_sdp_steady. */
static inline bool rs_sdp_steady_quiet(const struct rs_sdp_sock *s)
{
    return !(s->interest_mask | (uintptr_t)s->waiters | s->notify_on | s->keepalive | s->close_deadline |
             s->hold_since_ms | s->duty_wanted);
}

/* ---- sdp_spin.c ---- */
/* Lock held, at the start of a blocking wait on a connected socket: how long to spin (ns, 0: sleep at once). */
uint64_t rs_sdp_spin_budget(struct rs_sdp_sock *s, bool rx_only);
/* Lock held (dropped between rounds): polls until w is signalled or the budget is spent. in_bracket: the thread is
 * between rs_rnic_cq_wait_begin and _end, so each round asks the RNIC to look at its sources again. */
enum sdp_spin_outcome rs_sdp_spin(struct rs_sdp_sock *s, struct sdp_waiter *w, uint64_t budget_ns, bool in_bracket);
/* Lock held: what the wait's spin found, or how long its sleep lasted (it had no spin). */
void rs_sdp_spin_learn_spin(struct rs_sdp_sock *s, enum sdp_spin_outcome o);
void rs_sdp_spin_learn_sleep(struct rs_sdp_sock *s, uint64_t slept_us);

/* ---- sdp_sock.c ---- */
uint64_t rs_sdp_now_ms(void);
/* last_rx_ms / last_tx_ms of a message just received or sent (lock held), and the settling of deferred ones. */
void rs_sdp_stamp(struct rs_sdp_sock *s, bool rx);
void rs_sdp_stamps_settle(struct rs_sdp_sock *s, uint64_t now);
uint64_t rs_sdp_now_us(void);
void rs_sdp_get(struct rs_sdp_sock *s);
void rs_sdp_put(struct rs_sdp_sock *s);
struct rs_sdp_sock *rs_sdp_sock_alloc(int family, int kind);
/* Recomputes readiness, updates the notification fd and wakes blocked threads; lock held. */
void rs_sdp_signal(struct rs_sdp_sock *s);
unsigned rs_sdp_mask_locked(struct rs_sdp_sock *s);
/* Sleeps until signalled, the deadline (0: none) or a signal; lock held on entry and return.
 * Returns 0, -ETIMEDOUT or -EINTR. */
int rs_sdp_wait(struct rs_sdp_sock *s, uint64_t deadline_ms);
/* Same, for a reader that waits for the peer's data and nothing else. */
int rs_sdp_wait_rx(struct rs_sdp_sock *s, uint64_t deadline_ms);
/* Same, for the answer to a zero-copy step (the peer's READ and RdmaRdCompl, our READ's completion): spins first as a
 * reader's wait does (sdp_spin.c), since each lent buffer otherwise costs a sleep and a wake-up on both sides. */
int rs_sdp_wait_reply(struct rs_sdp_sock *s, uint64_t deadline_ms, bool interruptible);
/* What a blocking send/recv does when it cannot progress: -EAGAIN at once with MSG_DONTWAIT, otherwise waits
 * (0: woken, try again; -EAGAIN: SO_RCVTIMEO/SO_SNDTIMEO expired, as Linux reports it; -EINTR). Lock held. */
int rs_sdp_wait_io(struct rs_sdp_sock *s, bool dontwait, uint64_t deadline_ms);
/* Same, but not interruptible by signals (for waits the protocol must finish). */
int rs_sdp_wait_uninterruptible(struct rs_sdp_sock *s, uint64_t deadline_ms);
int rs_sdp_check_epoch(const struct rs_sdp_sock *s);
/* The pending socket error as a negative errno, consumed (reported once, as TCP does); fallback if none. */
int rs_sdp_take_error(struct rs_sdp_sock *s, int fallback);

/* ---- sdp_dev.c ---- */
int rs_sdp_dev_get(int kind, const struct sockaddr *local, struct sdp_dev **out);
int rs_sdp_kind_from_env(void);
extern unsigned rs_sdp_epoch;
void rs_sdp_global_init(void);

/* ---- sdp_progress.c ---- */
int rs_sdp_progress_attach(struct rs_sdp_sock *s);
/* Stops watching; asynchronous when called on the loop thread. Drops the progress thread's reference. */
void rs_sdp_progress_detach(struct rs_sdp_sock *s);
/* Asks the loop to re-read the socket's deadline (rs_sdp_next_deadline) when it is earlier than the armed one. */
void rs_sdp_progress_retime(struct rs_sdp_sock *s, uint64_t deadline_ms);
bool rs_sdp_progress_on_loop(void);
/* Runs at process exit: gives orphaned connections a bounded time to deliver their data. */
void rs_sdp_progress_exit_flush(uint64_t budget_ms);
void rs_sdp_progress_register_orphan(struct rs_sdp_sock *s, int delta);
/* At process exit, for a connection the application never closed: what the kernel's implicit close does (data
 * still delivered, then DisConn), so the exit flush can wait for it. */
void rs_sdp_exit_close(struct rs_sdp_sock *s);

/* ---- sdp_conn.c ---- */
/* Callbacks of the progress thread (lock not held on entry). Each returns the socket's next timer deadline
 * (CLOCK_MONOTONIC ms, 0 for none). */
uint64_t rs_sdp_on_cq(struct rs_sdp_sock *s);
uint64_t rs_sdp_on_cm(struct rs_sdp_sock *s);
uint64_t rs_sdp_on_timer(struct rs_sdp_sock *s);
/* A nonblocking call on a connected socket found nothing to do (lock held): counts towards "an application
 * thread polls this socket", which lets the progress thread leave the CQ to it. */
static inline void rs_sdp_note_poll_miss(struct rs_sdp_sock *s)
{
    if (s->app_poll_misses < UINT_MAX)
        s->app_poll_misses++;
}
/* Processes CM events and completions, then pushes what became possible; lock held. */
void rs_sdp_progress(struct rs_sdp_sock *s);
/* The same at the top of a send or receive call's loop: the timers are evaluated only if the step found
 * something, since the calls end with rs_sdp_call_done (a busy poller's misses run only the step). */
void rs_sdp_progress_poll(struct rs_sdp_sock *s);
/* The end of a send or receive call that did something: credit update, timers, readiness, without another look
 * at the CQ (the next call, or the progress thread, takes what arrived meanwhile); lock held. */
void rs_sdp_call_done(struct rs_sdp_sock *s);
/* The short path's look at the CQ (steady state; lock held): 0 nothing found, 1 handled, -1 the full step is
 * needed (the slow path runs it). */
#define SDP_FAST_BATCH 8
int rs_sdp_progress_fast(struct rs_sdp_sock *s);
/* Moves the connection to CLOSED with err (positive errno, 0 for none) and resets the QP; lock held. */
void rs_sdp_fail(struct rs_sdp_sock *s, int err, bool send_abort);
/* Warns what the peer got wrong (what, v), then resets the connection with EPROTO (sdp_rx.c). */
void rs_sdp_protocol_error(struct rs_sdp_sock *s, const char *what, uint32_t v);
/* Lock held: evaluates timers, returns the next deadline (0 none). */
uint64_t rs_sdp_timers(struct rs_sdp_sock *s, uint64_t now);
void rs_sdp_maybe_finish(struct rs_sdp_sock *s);
void rs_sdp_intake_start(struct rs_sdp_sock *l);
void rs_sdp_intake_update(struct rs_sdp_sock *l);
int rs_sdp_setup_rings(struct rs_sdp_sock *s);
void rs_sdp_free_rnic(struct rs_sdp_sock *s);

/* ---- sdp_family.c ---- */
#define RS_SDP_FAMILY_SLOTS 254
#define RS_SDP_ASSIGN_GRACE_MS 1000u    /* a member sent a connection is not "waiting" again before it arrived */
#define RS_SDP_REDIRECT_LEN 8
#define RS_SDP_REDIRECT_VERSION 1
enum rs_sdp_member_state {
    RS_SDP_MEMBER_IDLE = 1,         /* registered; its application has not asked for a connection */
    RS_SDP_MEMBER_WAITING = 2,      /* its application waits in accept (found the queue empty) */
    RS_SDP_MEMBER_BUSY = 3,         /* its application took a connection and has not come back */
    RS_SDP_MEMBER_ASSIGNED = 4,     /* the holder just sent it a connection */
};
struct sdp_family;
struct sdp_held {                   /* a connect request the holder keeps for a while */
    struct rs_rnic_cm_event ev;
    uint64_t since_ms;
};
bool rs_sdp_family_pid_alive(pid_t pid);
/* The holder's table for its listening address (port P), registered for its descendants; NULL on failure. */
struct sdp_family *rs_sdp_family_create(const struct sockaddr_storage *addr, int *holder_slot);
/* The family a descendant of the holder joins when it listens on addr; NULL if none (or we are its holder). */
struct sdp_family *rs_sdp_family_find(const struct sockaddr_storage *addr);
/* A member listening on port (host order): its slot, or -ENOSPC. */
int rs_sdp_family_join(struct sdp_family *f, uint16_t port);
void rs_sdp_family_leave(struct sdp_family *f, int slot, bool holder);
void rs_sdp_family_set_state(struct sdp_family *f, int slot, enum rs_sdp_member_state st, uint64_t now);
enum rs_sdp_member_state rs_sdp_family_state(const struct sdp_family *f, int slot);
enum rs_sdp_pick {
    RS_SDP_PICK_WAITING,            /* a member that waits */
    RS_SDP_PICK_ANY,                /* round-robin among all live members */
};
/* Picks a live member and marks it ASSIGNED: its slot, with *port, or -ENOENT. */
int rs_sdp_family_pick(struct sdp_family *f, enum rs_sdp_pick how, uint64_t now, uint16_t *port);
/* Live members (waiting_only: those that wait in accept). */
int rs_sdp_family_members(struct sdp_family *f, bool waiting_only);
bool rs_sdp_family_holder_alive(const struct sdp_family *f);
size_t rs_sdp_redirect_encode(uint16_t port, uint8_t *buf, size_t len);
int rs_sdp_redirect_decode(const uint8_t *buf, size_t len, uint16_t *port);
/* ---- sdp_tx.c ---- */
int32_t rs_sdp_credits(const struct rs_sdp_sock *s);
/* Posts one message whose header is built here; payload from the send ring ([ring_off, +ring_len)).
 * Returns 0 or a negative errno (no slot / no credit: -EAGAIN). */
int rs_sdp_post_msg(struct rs_sdp_sock *s, uint8_t mid, const struct rs_sdp_avail *avail, uint32_t compl_len,
                    uint64_t ring_off, uint32_t ring_len);
/* Posts one Data message whose payload is the application's buffer, inline (the RNIC copies it during the post:
 * the buffer is free when this returns). -EINVAL when it does not fit inline. */
int rs_sdp_post_data_inline(struct rs_sdp_sock *s, const void *buf, uint32_t len);
/* An on/off/auto environment setting, read once into *cache (start it at -2): 1 on, 0 off, -1 auto or unset
 * (a warning names anything else). */
int rs_sdp_env_choice(const char *name, int *cache);
bool rs_sdp_can_send_ctrl(const struct rs_sdp_sock *s);
bool rs_sdp_can_send_data(const struct rs_sdp_sock *s);
/* Sends what the credits, Nagle, cork and the peer's sink allow; lock held. */
void rs_sdp_tx_push(struct rs_sdp_sock *s, bool force);
void rs_sdp_credit_update_check(struct rs_sdp_sock *s);
/*
 * True when rs_sdp_credit_update_check would do nothing: no acknowledgement owed, and the peer's view of our
 * credits (what we last advertised, less what it sent since) is at least half the ring and at least 2. Each of the
 * check's reasons to act needs less than that (its window update a view below half the posted buffers, its overdraft
 * and last-credit cases a view of 0 or below, its early repost a view below half the ring), so the answer is exact.
 * The short path asks this first: in a ping-pong every answer carries our credits, the view stays high, and the
 * call, its state tests and its arithmetic were about 60 instructions of each received message.
 */
/* What the peer believes its credits are (at most: it may have sent more that we have not seen yet). */
static inline int32_t rs_sdp_peer_credit_view(const struct rs_sdp_sock *s)
{
    return (int32_t)(s->adv_ack + s->adv_bufs - s->rx_mseq_last);
}
static inline bool rs_sdp_credit_view_roomy(const struct rs_sdp_sock *s)
{
    int32_t view = rs_sdp_peer_credit_view(s);
    int32_t half = (int32_t)(s->nbufs / 2);
    return !s->ack_owed && view >= (half > 2 ? half : 2);
}
void rs_sdp_on_send_complete(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc);
uint32_t rs_sdp_slot_alloc(struct rs_sdp_sock *s, enum sdp_slot_kind kind);
bool rs_sdp_sq_has_room(const struct rs_sdp_sock *s, uint32_t n);
uint64_t rs_sdp_tx_hold_deadline(const struct rs_sdp_sock *s);
uint64_t rs_sdp_tx_unacked(const struct rs_sdp_sock *s);

/* ---- sdp_rx.c ---- */
void rs_sdp_post_recv_buf(struct rs_sdp_sock *s, uint32_t idx);
/* A buffer recv() emptied: reposted with others once rx_repost_batch have gathered (or the peer runs short). With
 * defer (the short path), it waits until SDP_REPOST_MAX have gathered instead: the short path's next miss reposts
 * them (sdp_fast.c), off the round trip of a busy poller. */
void rs_sdp_rx_repost_flush(struct rs_sdp_sock *s);
static RS_ALWAYS_INLINE void rs_sdp_rx_release_buf(struct rs_sdp_sock *s, uint32_t idx, bool defer)
{
    if (s->rx_repost_batch <= 1 || !s->rx_repost) {
        rs_sdp_post_recv_buf(s, idx);
        return;
    }
    s->rx_repost[s->rx_repost_n++] = idx;
    if (s->rx_repost_n >= (defer ? SDP_REPOST_MAX : s->rx_repost_batch))
        rs_sdp_rx_repost_flush(s);
}

/* n bytes of the queue's head entry were read: advances it, and drops it with its buffer released once empty
 * (returns true then). Inline, as the release above: both run on every short receive. */
static RS_ALWAYS_INLINE bool rs_sdp_rx_consume(struct rs_sdp_sock *s, uint32_t n, bool defer)
{
    struct sdp_rx_entry *e = &s->rxq[s->rxq_head];
    e->off += n;
    e->len -= n;
    s->rx_bytes_queued -= n;
    s->stats.bytes_received += n;
    if (e->len != 0)
        return false;
    uint32_t buf = e->buf;
    s->rxq_head = sdp_next(s->rxq_head, s->rxq_cap);
    s->rxq_count--;
    rs_sdp_rx_release_buf(s, buf, defer);
    return true;
}
void rs_sdp_on_recv(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc);
/* rs_sdp_on_recv for a socket known to be steady (the caller tested rs_sdp_steady under this hold of the lock and
 * nothing since could change it): true when the completion was compact Data, which leaves it steady. */
bool rs_sdp_on_recv_steady(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc);
void rs_sdp_rx_discard_all(struct rs_sdp_sock *s);

/* ---- sdp_zcopy.c ---- */
uint32_t rs_sdp_zthresh(const struct rs_sdp_sock *s);
void rs_sdp_z_on_msg(struct rs_sdp_sock *s, const struct rs_sdp_bsdh *h, const struct rs_sdp_avail *avail,
                     uint32_t compl_len);
void rs_sdp_z_on_read_complete(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc);
/* Sender: offer the ring's pending bytes by SrcAvail (sdp_zcopy.c "lending the send ring"); true if it posted one
 * (or failed the connection trying). Lock held. */
bool rs_sdp_z_lend_ring(struct rs_sdp_sock *s);
/* The lending SrcAvail's send slot retired: the ring bytes read so far are free. */
void rs_sdp_z_ring_slot_retired(struct rs_sdp_sock *s);
/* Sender: push pending ring bytes into an accepted peer sink; lock held. Returns true if it did anything. */
bool rs_sdp_z_push_sink(struct rs_sdp_sock *s, bool force);
/* Sender: blocking zero-copy of [buf, len) through SrcAvail or the peer's sink. Returns bytes sent (may be short:
 * the caller sends the rest by copy), or a negative errno. lock held, tx_busy owned. */
ssize_t rs_sdp_z_send(struct rs_sdp_sock *s, const uint8_t *buf, size_t len, uint64_t deadline, bool *interrupted);
/* Receiver: consume the SrcAvail at the queue head into buf; returns bytes placed or a negative errno. */
ssize_t rs_sdp_z_read_src(struct rs_sdp_sock *s, uint8_t *buf, size_t len, bool peek);
/* Receiver: advertise buf as a sink and wait; returns bytes written by the peer, 0 when the sink ended without
 * data, -EAGAIN when no sink was offered (nothing ran: the socket is as the caller last saw it), or another
 * negative errno. After 0 the caller must look at the socket again before it sleeps: the sink's wait ran the
 * protocol on this thread (data, the peer's DisConn, a reset may have arrived), and the wake-up those raised
 * went to the waiters of that moment, not to a sleep that starts afterwards. */
ssize_t rs_sdp_z_sink_recv(struct rs_sdp_sock *s, uint8_t *buf, size_t len, uint64_t deadline, bool *interrupted);
void rs_sdp_z_fail(struct rs_sdp_sock *s);
/* Adaptivity: should a blocking write of len bytes be lent (SrcAvail) rather than copied? And the measured
 * outcome of either method for a write of len bytes that took us microseconds. */
bool rs_sdp_z_choose_src(struct rs_sdp_sock *s, size_t len);
void rs_sdp_z_record(struct rs_sdp_sock *s, size_t len, bool zcopy, uint64_t bytes, uint64_t us);
/* The same for a reader of len bytes that finds the queue empty: offer a SinkAvail, or wait for copied data. */
bool rs_sdp_z_choose_sink(struct rs_sdp_sock *s, size_t len);
/* Whether a reader advertises sinks at all: not by default on an RNIC that copies payload (a WRITE into a sink goes
 * through its socket like a Data message, after a round trip), unless a threshold was set. */
bool rs_sdp_z_sinks_by_default(const struct rs_sdp_sock *s);
void rs_sdp_z_record_sink(struct rs_sdp_sock *s, size_t len, bool zcopy, uint64_t bytes, uint64_t us);
/* Sends the zero-copy answers that were waiting for a credit; lock held. */
void rs_sdp_z_flush_owed(struct rs_sdp_sock *s);
void rs_sdp_z_on_write_complete(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc);
uint64_t rs_sdp_z_deadline(const struct rs_sdp_sock *s);
void rs_sdp_z_timer(struct rs_sdp_sock *s, uint64_t now);

/* ---- sdp_handback.c ---- */
/* The peer's SuspComm (service_id) or SuspCommAck arrived; lock held (progress). */
void rs_sdp_hb_on_suspend(struct rs_sdp_sock *s, uint64_t service_id);
void rs_sdp_hb_on_suspend_ack(struct rs_sdp_sock *s);
/* What the application's calls do during a hand-back: 0 = go on as usual; -EREMCHG = handed back; -EAGAIN /
 * other = return that; 1 = wait (rs_sdp_wait_io) and look again. Lock held. */
int rs_sdp_hb_gate(struct rs_sdp_sock *s, bool dontwait);
/* For calls that do not block otherwise (shutdown, setsockopt, FIONREAD...): waits out a hand-back under way;
 * -EREMCHG once handed back, else 0. Lock held. */
int rs_sdp_hb_settle(struct rs_sdp_sock *s);

/* ---- sdp_regcache.c ---- */
struct sdp_regcache *rs_sdp_regcache_new(struct rs_rnic_pd *pd, bool pins_pages);
/* A registration covering [addr, addr+len) with at least access; referenced until rs_sdp_reg_put. Its rkey is
 * valid (fresh key bits since the last rs_sdp_reg_revoke). */
int rs_sdp_reg_get(struct sdp_regcache *c, void *addr, size_t len, unsigned access, struct sdp_reg **out,
                   bool *hit);
struct rs_rnic_mr *rs_sdp_reg_mr(struct sdp_reg *r);
/* Revokes remote access granted for the last advertisement (invalidates the rkey; the next get re-keys). Cache
 * lock held: rs_sdp_reg_put does it when the last user lets go. */
void rs_sdp_reg_revoke(struct sdp_reg *r);
void rs_sdp_reg_put(struct sdp_regcache *c, struct sdp_reg *r);
/* Buffer-reuse detection: true if [addr, addr+len) is cached, large enough to register for one use, or was seen
 * before; otherwise remembers it and returns false (copy it this time). */
bool rs_sdp_reg_worth(struct sdp_regcache *c, const void *addr, size_t len, size_t threshold);
void rs_sdp_regcache_unmapped(struct sdp_regcache *c, uintptr_t start, uintptr_t end);
void rs_sdp_regcache_all_unmapped(uintptr_t start, uintptr_t end);

#endif /* RS_SDP_STREAM_SDP_INT_H */
