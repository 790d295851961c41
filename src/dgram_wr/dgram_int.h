/*
 * dgram_int.h: what the files of src/dgram_wr share. Not for other modules (they use dgram.h).
 *
 * Files: dgram_sock.c (life, options, readiness, waits), dgram_peer.c (peers, discovery, control messages),
 * dgram_rx.c (completions, the receive queue, lanes and sinks on the receiving side, recvmsg), dgram_tx.c
 * (sendmsg, the staging ring, lane and sink use on the sending side), dgram_dev.c (process-wide RNIC and PD,
 * raw system calls, per-thread wake-up fds), dgram_wire.c (control messages), dgram_policy.c (rule file policy).
 *
 * Locking: one mutex per socket (s->lock) guards all of its state; every function here that takes a socket
 * expects it held unless it says otherwise. Blocking waits drop it while they sleep. The RNIC's own locks are
 * taken inside rnic.h calls only.
 */
#ifndef RS_DGRAM_WR_DGRAM_INT_H
#define RS_DGRAM_WR_DGRAM_INT_H

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dgram_wr/dgram.h"
#include "dgram_wr/dgram_wire.h"
#include "rnic/rnic.h"

/* ---- sizes and defaults ---- */

#define RS_DG_MAX_V4 65507u                 /* largest UDP payload over IPv4 */
#define RS_DG_MAX_V6 65527u                 /* over IPv6 (no jumbograms) */
#define RS_DG_SLOT_SIZE 65536u              /* one posted receive holds any datagram */
#define RS_DG_SLOT_CHARGE 2048u             /* SO_RCVBUF bytes per posted receive: what a small kernel datagram costs */
#define RS_DG_MIN_SLOTS 2u
#define RS_DG_MAX_SLOTS 1024u
#define RS_DG_SLOT_MRS 8u                   /* registrations of receive slots: the first, then growth steps */
#define RS_DG_LANE_MIN (256u * 1024u)       /* a lane holds at least a few of the largest datagrams */
#define RS_DG_LANE_MAX (16u * 1024u * 1024u)
#define RS_DG_LANE_RECORDS 256u             /* records a sender may have unconsumed in one lane */
#define RS_DG_LANE_HDR 16u                  /* each lane record starts with: position (8), sequence (4), length (4) */
#define RS_DG_LANE_ALIGN 64u
#define RS_DG_MAX_LANES 64u                 /* peers that may Write-Record into one socket at a time */
#define RS_DG_RAW_MAX_COUNT 1024u
#define RS_DG_SEND_DEPTH 256u
#define RS_DG_RAW_OVERHEAD 256u             /* bytes charged per queued plain datagram besides its payload */
#define RS_DG_SINK_TTL_MS 1000u             /* a sink advertisement older than this is not used */
#define RS_DG_REVOKED_KEEP 16u              /* revoked sinks remembered for salvage */
#define RS_DG_SINK_BACKOFF_NS 2000000ull    /* no new sink for this long after one went unused */
#define RS_DG_ANNOUNCE_GAP_MS 100u          /* at most one stale-state announcement per peer per this */
#define RS_DG_CLOSE_DRAIN_NS 500000000ull  /* close waits at most this long for its posted datagrams */
#define RS_DG_LINUX_MIN_RCVBUF 2304         /* SOCK_MIN_RCVBUF on 64-bit Linux */
#define RS_DG_LINUX_MIN_SNDBUF 4608
#define RS_DG_DEFAULT_BUF 212992            /* net.core.rmem_default / wmem_default */

/* wr_id tags of the socket's work requests */
#define RS_DG_WR_SLOT (1ull << 62)          /* | slot index: a posted receive */
#define RS_DG_WR_STAGE (2ull << 62)         /* | staging ring end offset: a send */

/* ---- raw system calls on the application's fd (never through the interposers) ---- */

static inline long rs_dg_sys(long r) { return r < 0 ? -errno : r; }
static inline ssize_t rs_dg_sys_sendmsg(int fd, const struct msghdr *m, int flags)
{
    return rs_dg_sys(syscall(SYS_sendmsg, fd, m, flags));
}
static inline ssize_t rs_dg_sys_recvmsg(int fd, struct msghdr *m, int flags)
{
    return rs_dg_sys(syscall(SYS_recvmsg, fd, m, flags));
}
static inline int rs_dg_sys_bind(int fd, const struct sockaddr *a, socklen_t len)
{
    return (int)rs_dg_sys(syscall(SYS_bind, fd, a, len));
}
static inline int rs_dg_sys_connect(int fd, const struct sockaddr *a, socklen_t len)
{
    return (int)rs_dg_sys(syscall(SYS_connect, fd, a, len));
}
static inline int rs_dg_sys_getsockname(int fd, struct sockaddr *a, socklen_t *len)
{
    return (int)rs_dg_sys(syscall(SYS_getsockname, fd, a, len));
}
static inline int rs_dg_sys_getpeername(int fd, struct sockaddr *a, socklen_t *len)
{
    return (int)rs_dg_sys(syscall(SYS_getpeername, fd, a, len));
}
static inline int rs_dg_sys_setsockopt(int fd, int level, int name, const void *v, socklen_t len)
{
    return (int)rs_dg_sys(syscall(SYS_setsockopt, fd, level, name, v, len));
}
static inline int rs_dg_sys_getsockopt(int fd, int level, int name, void *v, socklen_t *len)
{
    return (int)rs_dg_sys(syscall(SYS_getsockopt, fd, level, name, v, len));
}

uint64_t rs_dg_now_ns(void);
uint64_t rs_dg_random64(void);              /* non-zero */

/* ---- process-wide RNIC (dgram_dev.c) ---- */

struct rs_dg_dev {
    struct rs_dg_dev *next;
    int kind;
    struct sockaddr_storage local;          /* verbs devices are per local address; soft serves all */
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    unsigned refs;
};

/* Opens (or shares) the RNIC for a socket bound to local. 0 or -errno (-ENODEV: none of that kind). */
int rs_dg_dev_get(int kind, const struct sockaddr *local, struct rs_dg_dev **out);
void rs_dg_dev_put(struct rs_dg_dev *dev);
int rs_dg_kind_from_env(int kind);

/* Per-thread eventfd a blocked call sleeps on (created on first use, closed at thread exit). -errno if none. */
int rs_dg_thread_efd(void);
void rs_dg_efd_signal(int efd);
void rs_dg_efd_drain(int efd);

/* ---- addresses ---- */

/* A peer's address as a key: v4 addresses in v4-mapped form, so AF_INET and mapped AF_INET6 agree. */
struct rs_dg_key {
    uint8_t addr[16];
    uint16_t port;                          /* network order */
};
void rs_dg_key_of(const struct sockaddr *sa, struct rs_dg_key *k);
bool rs_dg_key_equal(const struct rs_dg_key *a, const struct rs_dg_key *b);
/* Copies sa into out in the form the socket (family) uses; returns its length or 0 if it cannot. */
socklen_t rs_dg_addr_for_family(int family, const struct sockaddr *sa, socklen_t salen, struct sockaddr_storage *out);
/* Multicast, limited broadcast or a subnet broadcast address of one of the host's interfaces. */
bool rs_dg_is_group(const struct sockaddr *sa, bool *broadcast);

/* ---- the socket ---- */

struct rs_dg_lane;
struct rs_dg_peer;

/* A datagram waiting in the receive queue. */
enum rs_dg_rxq_kind {
    RS_DG_RXQ_SLOT,                         /* in a posted receive (sendrecv) */
    RS_DG_RXQ_LANE,                         /* in a lane (wrecord), after its lane header */
    RS_DG_RXQ_RAW,                          /* in a raw buffer (plain UDP, or a salvaged sink record) */
};

struct rs_dg_rxq {
    struct rs_dg_rxq *next;
    enum rs_dg_rxq_kind kind;
    bool rdma;                              /* came as datagram-iWARP (stats) */
    uint32_t len;
    const uint8_t *data;
    struct sockaddr_storage src;
    socklen_t src_len;
    uint32_t slot;                          /* SLOT */
    struct rs_dg_lane *lane;                /* LANE */
    uint64_t lane_pos, lane_end;
    uint32_t lane_seq;
    struct rs_rnic_raw_dgram *raw;          /* RAW */
    uint32_t charge;                        /* RAW: bytes charged against SO_RCVBUF */
};

/* A receive region we reserved for one peer's Write-Records. */
struct rs_dg_lane {
    struct rs_dg_lane *next;
    struct rs_dg_peer *peer;
    uint8_t *mem;
    uint32_t size;
    struct rs_rnic_mr *mr;
    uint64_t reported;                      /* lane position last reported consumed (CONSUMED) */
    uint32_t seq_reported;                  /* record sequence number last reported */
    uint32_t released_since;                /* records released since the last report */
    uint64_t seen_end;                      /* end of the furthest record seen */
    uint32_t seen_seq;                      /* sequence number after the furthest record seen */
    uint32_t queued;                        /* records of this lane in the receive queue */
    bool retired;                           /* peer gone: freed once queued drops to 0 */
};

enum rs_dg_peer_state {
    RS_DG_PEER_NEW,                         /* policy known, nothing sent */
    RS_DG_PEER_KERNEL,                      /* policy kernel, or discovery failed / refused (until retry_ns) */
    RS_DG_PEER_PROBING,
    RS_DG_PEER_RESOLVING,                   /* answered; the RNIC is resolving its address (verbs) */
    RS_DG_PEER_RDMA,
};

struct rs_dg_peer {
    struct rs_dg_peer *hnext;               /* hash chain */
    struct rs_dg_key key;
    struct sockaddr_storage addr;           /* in the socket's family */
    socklen_t addr_len;
    struct rs_dgram_peer_policy tx_pol;     /* RS_ROLE_CLIENT */
    bool tx_pol_valid;
    bool group, broadcast;
    enum rs_dg_peer_state state;
    int refused;                            /* -errno the last discovery ended with (rdma mode reports it) */
    uint64_t probe_nonce;
    unsigned probe_tries;
    uint64_t probe_deadline_ns;             /* PROBING: resend or give up then */
    uint64_t retry_ns;                      /* KERNEL after a failure: probe again after this */
    uint64_t refresh_ns;                    /* RDMA: probe again (in the background) after this */
    bool refreshing;
    uint64_t instance;                      /* the peer socket's incarnation (0: unknown) */
    struct rs_rnic_ud_peer *ah;
    /* their lane (we Write-Record into it) */
    bool lane_ok;
    uint32_t lane_rkey, lane_size, lane_records;
    uint64_t lane_to, lane_head, lane_consumed;
    uint32_t lane_written, lane_consumed_records;
    /* their sink (a buffer their blocked recv advertised) */
    bool sink_ok;
    uint32_t sink_id, sink_rkey, sink_len;
    uint64_t sink_to, sink_ns;
    /* our side */
    struct rs_dg_lane *rx_lane;             /* the lane we reserved for them */
    uint64_t announce_ns;                   /* last stale-state announcement sent */
    uint64_t last_large_ns;                 /* last large datagram received from them (sink choice) */
};

struct rs_dg_revoked {
    uint32_t rkey;
    uint64_t to;
    uint32_t len;
    uint8_t *buf;
};

struct rs_dg_regcache {                     /* one registered application buffer (sinks) */
    struct rs_dg_regcache *next;
    void *addr;
    size_t len;
    struct rs_rnic_mr *mr;
};

struct rs_dg_waiter {
    struct rs_dg_waiter *next;
    int efd;
};

struct rs_dgram_sock {
    pthread_mutex_t lock;
    unsigned refs;                          /* atomic */
    bool closed;
    int fd;                                 /* the application's kernel socket */
    int family;
    struct rs_dgram_opts opts;
    bool nonblock;
    uint64_t instance;
    /* addresses */
    bool bound;
    struct sockaddr_storage local;
    socklen_t local_len;
    bool connected;
    struct sockaddr_storage peer_addr;
    socklen_t peer_len;
    struct rs_dg_peer *conn_peer;
    /* options */
    int rcvbuf, sndbuf;                     /* as getsockopt reports them (doubled) */
    uint64_t rcvtimeo_ns, sndtimeo_ns;      /* 0 = forever */
    int so_error;                           /* pending -errno for the application, 0 */
    /* RDMA side (rdma_ready once bound and an RNIC was found; rdma_err says why not) */
    bool rdma_ready;
    int rdma_err;
    bool adopted;                           /* the QP reads the fd; else we read it ourselves */
    struct rs_dg_dev *dev;
    struct rs_rnic_cq *rcq, *scq;
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
    uint32_t rcq_depth;
    /* CQ notification state, so the fast paths make no system call: an fd is drained only when it may have
     * been written (armed and a completion found, or seen readable by a waiter or a poller). */
    bool rcq_armed, rcq_hot, scq_armed;
    uint32_t max_inline, max_ud_msg;
    /* receive slots (sendrecv): slots_cap reserved (address space, RQ and CQ depth), nslots registered and
     * posted; SO_RCVBUF raised after set-up registers and posts more, up to slots_cap (one region per step) */
    uint8_t *slot_mem;
    struct rs_rnic_mr *slot_mrs[RS_DG_SLOT_MRS];
    uint32_t slot_mr_end[RS_DG_SLOT_MRS];   /* slot_mrs[k] covers slots [slot_mr_end[k-1], slot_mr_end[k]) */
    uint32_t nslot_mrs;
    uint32_t nslots, slots_cap, slots_posted;
    /* the receive queue */
    struct rs_dg_rxq *rxq_head, *rxq_tail, *rxq_free;
    uint32_t rxq_count;
    uint64_t raw_queued;                    /* bytes charged by queued raw datagrams */
    /* lanes we reserved for peers */
    struct rs_dg_lane *lanes;
    uint32_t nlanes;
    /* sink (one receive buffer advertised at a time) */
    bool sink_active;
    struct rs_dg_regcache *sink_reg;
    uint32_t sink_id, sink_rkey, sink_len;
    uint8_t *sink_buf;
    struct rs_dg_peer *sink_peer;
    bool sink_filled, sink_spent;
    uint32_t sink_got_len;
    struct sockaddr_storage sink_src;
    socklen_t sink_src_len;
    uint64_t sink_unused_ns;                /* when the last sink was revoked unused */
    struct rs_dg_revoked revoked[RS_DG_REVOKED_KEEP];
    unsigned revoked_next;
    struct rs_dg_regcache *regs;
    /* send staging ring (registered): [stage_tail, stage_head) in use, completions free from the tail */
    uint8_t *stage_mem;
    struct rs_rnic_mr *stage_mr;
    uint32_t stage_size;
    uint64_t stage_head, stage_tail;
    uint32_t sends_out;
    /* peers */
    struct rs_dg_peer **buckets;
    uint32_t nbuckets, npeers;
    /* readiness */
    int notify_fd;                          /* epoll: pending_efd + CQ/CM fds + (not adopted) the kernel fd */
    int pending_efd;                        /* readable while mask & (interest | POLLERR) */
    bool pending_set;
    unsigned interest_in, interest_out;
    struct rs_dg_waiter *waiters;
    struct rs_dgram_stats st;
    /* The process's statistics area (rdmasock stat): off until the interception layer names the socket's slot. */
    bool stats_on;
    int stats_slot;                         /* -1: no slot, process counters only */
};

/* ---- dgram_stats.c ---- */
/* Publishes the socket's addresses in its statistics slot (after bind, autobind, connect). */
void rs_dg_stats_addresses(struct rs_dgram_sock *s);
/* One datagram moved over RDMA: sent (datagram-iWARP posted), or received (delivered to the application). */
void rs_dg_stats_rdma_tx(struct rs_dgram_sock *s, size_t bytes);
void rs_dg_stats_rdma_rx(struct rs_dgram_sock *s, size_t bytes);

/* ---- dgram_sock.c ---- */
/* Sets up the RDMA side once the fd is bound (idempotent; failure leaves the socket kernel-only). */
void rs_dg_setup_rdma(struct rs_dgram_sock *s);
/* Recomputes readiness, updates the pending eventfd and wakes blocked calls. */
void rs_dg_changed(struct rs_dgram_sock *s);
unsigned rs_dg_mask(struct rs_dgram_sock *s);
/*
 * Sleeps until something may have changed (a completion, a wake-up from another thread, the kernel fd), the
 * deadline (absolute ns, 0 = none) or a signal. Drops the lock while sleeping. 0, -EAGAIN (deadline), -EINTR,
 * -EBADF (closed meanwhile).
 *
 * It is also a thread-cancellation point, as the recv/send it stands for is in the kernel (ffmpeg's and VLC's
 * reader threads are stopped with pthread_cancel while blocked in recvfrom): a cancel request pending or arriving
 * while it sleeps ends the thread there, after unregistering the wait and, when sink_mine (the calling recv
 * advertised the socket's sink), revoking the sink so nothing is placed into the abandoned buffer. The lock is
 * left unlocked for a cancelled thread.
 */
int rs_dg_wait(struct rs_dgram_sock *s, uint64_t deadline_ns, bool want_send_space, bool sink_mine);
/* Revokes the socket's active sink (dgram_rx.c). */
void rs_dg_sink_revoke(struct rs_dgram_sock *s);
int rs_dg_repost_slot(struct rs_dgram_sock *s, uint32_t i);
/* SO_RCVBUF grew after set-up: registers and posts the receives it now pays for (up to slots_cap). */
void rs_dg_grow_slots(struct rs_dgram_sock *s);
/* Sizes from SO_RCVBUF. */
uint32_t rs_dg_slots_for(int rcvbuf);
uint32_t rs_dg_lane_size_for(int rcvbuf);

/* ---- dgram_peer.c ---- */
struct rs_dg_peer *rs_dg_peer_find(struct rs_dgram_sock *s, const struct sockaddr *addr);
struct rs_dg_peer *rs_dg_peer_get(struct rs_dgram_sock *s, const struct sockaddr *addr, socklen_t len);
void rs_dg_peers_free(struct rs_dgram_sock *s);
/* The peer's sending state now, probing / refreshing as the clocks say (sends probes). */
enum rs_dg_peer_state rs_dg_peer_tx_state(struct rs_dgram_sock *s, struct rs_dg_peer *p);
void rs_dg_peer_start_probe(struct rs_dgram_sock *s, struct rs_dg_peer *p);
/* Handles a control message from src. */
void rs_dg_control_rx(struct rs_dgram_sock *s, const struct rs_dgw_msg *m, const struct sockaddr *src,
                      socklen_t src_len);
/* Sends a control message to a peer through the kernel socket (best effort). */
void rs_dg_control_tx(struct rs_dgram_sock *s, struct rs_dg_peer *p, struct rs_dgw_msg *m);
/* A refused Write-Record from p: its idea of our lane is stale; tell it (rate-limited). */
void rs_dg_peer_stale(struct rs_dgram_sock *s, struct rs_dg_peer *p);
void rs_dg_cm_events(struct rs_dgram_sock *s);
/* Announces the socket's departure to every peer with RDMA state. */
void rs_dg_peers_bye(struct rs_dgram_sock *s);

/* ---- dgram_rx.c ---- */
/* Moves completions, raw datagrams and kernel datagrams into the receive queue; handles control traffic. */
void rs_dg_progress(struct rs_dgram_sock *s);
/* The same, after a wake-up: also drains the notification fds that may have fired. */
void rs_dg_progress_woken(struct rs_dgram_sock *s);
struct rs_dg_lane *rs_dg_lane_new(struct rs_dgram_sock *s, struct rs_dg_peer *p);
void rs_dg_lane_retire(struct rs_dgram_sock *s, struct rs_dg_lane *lane);
void rs_dg_lanes_free(struct rs_dgram_sock *s);
void rs_dg_rxq_free_all(struct rs_dgram_sock *s);
void rs_dg_regs_free(struct rs_dgram_sock *s);
/* Allocates a region for an RNIC (lazily backed anonymous memory). */
void *rs_dg_map_region(size_t len);
void rs_dg_unmap_region(void *p, size_t len);
ssize_t rs_dg_recvmsg(struct rs_dgram_sock *s, struct msghdr *msg, int flags);
/* Takes in what the receive CQ holds (the RDMA datagrams that arrived so far). */
void rs_dg_rx_poll_cq(struct rs_dgram_sock *s);

/* ---- dgram_tx.c ---- */
ssize_t rs_dg_sendmsg(struct rs_dgram_sock *s, const struct msghdr *msg, int flags);
/* Frees staging space of completed sends (send CQ); true if any completed. */
bool rs_dg_tx_reap(struct rs_dgram_sock *s);
/* When the send ring is short of room, arms the send CQ so its fd wakes pollers waiting for POLLOUT. */
void rs_dg_tx_watch(struct rs_dgram_sock *s);
/* Waits (lock held, dropped while asleep) until every posted datagram completed, or until deadline_ns. */
void rs_dg_tx_drain(struct rs_dgram_sock *s, uint64_t deadline_ns);
bool rs_dg_tx_space(const struct rs_dgram_sock *s, uint32_t len);

#endif /* RS_DGRAM_WR_DGRAM_INT_H */
