/*
 * soft.h: internal API of the software RNIC (provider "soft"). Shared by the core (soft_*.c), the datagram half
 * (ud_*.c) and the RC half (rc_*.c, mpa*.c, cm_tcp*.c). Protocol layers never include this; they use rnic.h.
 *
 * CHANGES (newest last, so the RC half can see what moved; all additive except v3, a linkage fix):
 *   v1  first version: device, PD, MR/STag table, CQ, RQ/SRQ, SQ, QP base, CM event channel, progress engine,
 *       rs_soft_rc_ops hook, raw system-call wrappers, test-only drop knob.
 *   v2  lock order written out as a chain (qp->sq_lock before the UD rx lock); provider entry points and
 *       rs_soft_cq_attach/detach declared here; RS_SOFT_RECV_DONE_EMITTED state; rs_soft_rq_try_untake;
 *       rs_soft_send_wqe.peer_qos_set; rs_soft_ud_fill_peer. rs_soft_rc_ops.expire runs with a CQ's attach_lock
 *       held (see the hook's comment).
 *   v3  rs_soft_rc_ops is referenced strongly (not weak): with the weak reference, programs linked with
 *       librdmasock.a silently lacked the RC half (same reasoning as provider.h's providers). Optional members
 *       (post_recv, set_error, set_qos, expire, request_discard) may still be NULL.
 *   v4  rs_soft_cq_defer_begin/_end: a progress callback's completions wake a CQ waiter once, when the callback
 *       ends (additive; measured by tools/perf: RC SEND 64 KiB streams use ~10% less CPU, see docs/perf.md).
 *   v5  UD QPs may adopt the application's socket (rs_soft_ud_adopt_fd and friends, rnic.h): raw hand-back, per-QP
 *       counters, Write-Record completions added before the MR read lock is released (additive; src/dgram_wr).
 *   v6  consumer progress (additive): rs_soft_cq_wait_begin/_end let a blocking thread wait on the sockets of the
 *       RC QPs that receive into a CQ, and rs_soft_poll_cq inside that bracket receives on them inline
 *       (rs_soft_rc_ops.rx_inline); cq->blocked_waiters tells the progress thread to leave those sockets alone. A
 *       completion the polling thread produced and took itself does not fire the CQ's notification; on a CQ with
 *       brackets, an application thread's own successful completions notify late (RS_SOFT_LATE_NOTIFY_US). RC QPs
 *       leave their CQs before the RC half is destroyed. The RC receive state is no longer the progress thread's
 *       alone: see rc.h (rx_lock).
 *   v7  rs_soft_rc_ops.reads_placed_directly (additive): an RC QP whose peer, a process on this host, takes READ
 *       responses by process_vm_writev (rc_local.c) answers rs_rnic_qp_reads_placed_directly.
 *
 * ---- Objects ----------------------------------------------------------------------------------------------
 * Every object starts with its rnic.h base struct (provider.h) so a public pointer casts to the soft one:
 *   struct rs_rnic       -> struct rs_soft_device   (rs_soft_dev())
 *   struct rs_rnic_pd    -> struct rs_soft_pd       (rs_soft_pd())
 *   struct rs_rnic_mr    -> struct rs_soft_mr       (rs_soft_mr(); the public struct is the first member)
 *   struct rs_rnic_cq    -> struct rs_soft_cq, rs_rnic_srq -> rs_soft_srq, rs_rnic_qp -> rs_soft_qp,
 *   struct rs_rnic_cm    -> struct rs_soft_cm.
 * Listeners and connection requests belong to the RC half: it defines structs that start with
 * struct rs_rnic_listener / struct rs_rnic_conn_request.
 *
 * ---- Threads -----------------------------------------------------------------------------------------------
 * Each device runs ONE progress thread (a libev loop, soft_progress.c). It watches every QP's socket and places
 * inbound data without the application calling in (independent progress: a receive, a Write-Record or a READ
 * response lands while the application computes), and because a single thread owns all receive-side state of a
 * device, the receive paths need no locks against each other, only against the application threads that post
 * and poll. Application threads call rnic.h; sends are transmitted on the posting thread while the socket accepts
 * them (no thread hop on the fast path) and the progress thread finishes what the socket refused (EAGAIN).
 * The one exception (v6): an application thread blocked on a CQ (a wait bracket, rs_soft_cq_wait_begin) watches
 * the sockets of the RC QPs whose receive CQ it is, and its polls receive on them itself (consumer progress,
 * docs/rnic-rc.md): a message then costs one wake-up, the waiter's, instead of two (progress thread, then waiter).
 * The RC half serialises that with a per-QP rx_lock.
 *
 * ---- Lock order (never take a lock to the left while holding one to its right) ---------------------------
 *   cq->attach_lock  ->  RC rx_lock (rc.h)  ->  RC tx_lock  ->  qp->sq_lock  ->  UD rx lock
 *                    ->  device MR rwlock (read)  ->  rq->lock  ->  cq->lock
 *   cm->lock is a leaf. The device lock (dev->lock) is a leaf.
 *   Never call rs_soft_progress_call_sync / rs_soft_watch_del / rs_soft_timer_free while holding any of these
 *   locks from an application thread: the loop thread may be waiting for the same lock.
 *
 * ---- System calls ------------------------------------------------------------------------------------------
 * The library interposes the socket API of the host program. The soft RNIC's own sockets must never go through
 * those interposers, so all socket I/O here uses the rs_soft_sys_* wrappers (raw syscall(2)).
 */
#ifndef RS_RNIC_SOFT_SOFT_H
#define RS_RNIC_SOFT_SOFT_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/fdutil.h"
#include "rnic/provider.h"

/* ---- limits and defaults -------------------------------------------------------------------------------- */

#define RS_SOFT_MAX_QP_WR 16384u
#define RS_SOFT_MAX_SGE 16u
#define RS_SOFT_MAX_INLINE 1024u
#define RS_SOFT_MAX_CQE 65536u
#define RS_SOFT_MAX_RC_MSG (1u << 30)
#define RS_SOFT_MAX_IRD 128u
#define RS_SOFT_MAX_ORD 128u
#define RS_SOFT_MR_INDEX_BITS 24            /* STag = index << 8 | 8 random key bits */
#define RS_SOFT_MR_MAX_INDEX ((1u << RS_SOFT_MR_INDEX_BITS) - 1)
#define RS_SOFT_DEFAULT_READ_TIMEOUT_MS 1000u
#define RS_SOFT_DEFAULT_RECORD_TIMEOUT_MS 200u

/* ---- raw system calls (see header comment) --------------------------------------------------------------- */

static inline long rs_soft_sys_ret(long r) { return r < 0 ? -errno : r; }
/*
 * Sockets the soft RNIC creates are recorded (soft_fork.c): a forked child closes its copies at once, because
 * they are the parent's. A listening socket left open in the child would take its share of SO_REUSEPORT
 * connections that nobody serves, and a connected one would hold back the FIN when the parent closes.
 */
void rs_soft_fd_owned(int fd);
void rs_soft_fd_released(int fd);
/* Listening sockets are the exception: a child keeps its copies, parked, and so does a process whose listener goes
 * dormant at fork (rs_rnic_listener_park). The kernel socket and its backlog then outlive the fork in every process
 * of the family, as a TCP listener does, and the next rs_rnic_listen on the same address adopts a parked copy. */
void rs_soft_fd_listening(int fd);
void rs_soft_listener_fd_park(int fd);
int rs_soft_listener_fd_take(const struct sockaddr_storage *tcp_addr);     /* the fd, or -1 */

static inline int rs_soft_sys_socket(int domain, int type, int protocol)
{
    int fd = rs_fd_move_high((int)rs_soft_sys_ret(syscall(SYS_socket, domain, type, protocol)));
    if (fd >= 0)
        rs_soft_fd_owned(fd);
    return fd;
}
static inline int rs_soft_sys_close(int fd)
{
    rs_soft_fd_released(fd);
    return (int)rs_soft_sys_ret(syscall(SYS_close, fd));
}
static inline int rs_soft_sys_bind(int fd, const struct sockaddr *a, socklen_t len)
{
    return (int)rs_soft_sys_ret(syscall(SYS_bind, fd, a, len));
}
static inline int rs_soft_sys_connect(int fd, const struct sockaddr *a, socklen_t len)
{
    return (int)rs_soft_sys_ret(syscall(SYS_connect, fd, a, len));
}
static inline int rs_soft_sys_listen(int fd, int backlog) { return (int)rs_soft_sys_ret(syscall(SYS_listen, fd, backlog)); }
static inline int rs_soft_sys_accept4(int fd, struct sockaddr *a, socklen_t *len, int flags)
{
    int nfd = rs_fd_move_high((int)rs_soft_sys_ret(syscall(SYS_accept4, fd, a, len, flags)));
    if (nfd >= 0)
        rs_soft_fd_owned(nfd);
    return nfd;
}
static inline int rs_soft_sys_shutdown(int fd, int how) { return (int)rs_soft_sys_ret(syscall(SYS_shutdown, fd, how)); }
static inline int rs_soft_sys_setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    return (int)rs_soft_sys_ret(syscall(SYS_setsockopt, fd, level, name, val, len));
}
static inline int rs_soft_sys_getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
    return (int)rs_soft_sys_ret(syscall(SYS_getsockopt, fd, level, name, val, len));
}
static inline int rs_soft_sys_getsockname(int fd, struct sockaddr *a, socklen_t *len)
{
    return (int)rs_soft_sys_ret(syscall(SYS_getsockname, fd, a, len));
}
static inline int rs_soft_sys_getpeername(int fd, struct sockaddr *a, socklen_t *len)
{
    return (int)rs_soft_sys_ret(syscall(SYS_getpeername, fd, a, len));
}
/* Return bytes or -errno. */
static inline ssize_t rs_soft_sys_sendmsg(int fd, const struct msghdr *m, int flags)
{
    return rs_soft_sys_ret(syscall(SYS_sendmsg, fd, m, flags));
}
static inline ssize_t rs_soft_sys_recvmsg(int fd, struct msghdr *m, int flags)
{
    return rs_soft_sys_ret(syscall(SYS_recvmsg, fd, m, flags));
}
static inline ssize_t rs_soft_sys_read(int fd, void *buf, size_t len) { return rs_soft_sys_ret(syscall(SYS_read, fd, buf, len)); }
static inline ssize_t rs_soft_sys_write(int fd, const void *buf, size_t len)
{
    return rs_soft_sys_ret(syscall(SYS_write, fd, buf, len));
}

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t rs_soft_now_ns(void);

/* ---- device ---------------------------------------------------------------------------------------------- */

/* Counters of one device; relaxed atomic adds (RS_SOFT_STAT), read with rs_soft_get_stats. */
struct rs_soft_stats {
    uint64_t tx_datagrams, tx_bytes, tx_errors;     /* UD: datagrams handed to UDP, payload bytes, failures */
    uint64_t rx_datagrams, rx_bytes;                /* UD: datagrams read, payload bytes placed */
    uint64_t rx_drop_crc;                           /* CRC32c mismatch */
    uint64_t rx_drop_header;                        /* malformed: short, bad version, bad opcode, bad fields */
    uint64_t rx_drop_protection;                    /* STag/PD/access/bounds/wrap refused */
    uint64_t rx_drop_no_recv;                       /* SEND with no posted receive */
    uint64_t rx_drop_late;                          /* segment of a message already completed or abandoned */
    uint64_t rx_drop_test;                          /* dropped by the TEST ONLY drop knob */
    uint64_t rx_msg_incomplete;                     /* segmented SEND abandoned for a missing segment */
    uint64_t record_complete, record_partial;       /* Write-Record target completions */
    uint64_t read_responses_sent, read_timeouts;    /* UD RDMA READ */
    uint64_t cq_overflows;
};
#define RS_SOFT_STAT(dev, field, n) __atomic_add_fetch(&(dev)->stats.field, (uint64_t)(n), __ATOMIC_RELAXED)

struct rs_soft_progress;                    /* soft_progress.c */
struct rs_soft_mr;

struct rs_soft_device {
    struct rs_rnic base;                    /* first: ops + caps */
    struct rs_soft_progress *progress;
    pthread_mutex_t lock;                   /* leaf: qpn counter, test knob */
    uint32_t next_qpn;
    /* STag table: entries[index] (index 0 unused). rwlock: read side held while bytes are placed into or read
     * from registered memory, so deregistration (write side) waits until no access is in flight. */
    pthread_rwlock_t mr_lock;
    struct rs_soft_mr **mr_entries;
    uint32_t mr_capacity;
    uint32_t mr_free_head;                  /* free-list through unused entries' indexes; 0 = none */
    uint32_t *mr_free_next;
    uint8_t rand_pool[64];                  /* getrandom() bytes for STag keys, refilled when used up */
    unsigned rand_used;
    /* TEST ONLY drop knob (dev->lock): */
    uint32_t test_drop_per_million;
    uint64_t test_drop_state;
    struct rs_soft_stats stats;
    uint32_t ud_segment_len;                /* payload bytes per UD datagram when segmenting */
};

static inline struct rs_soft_device *rs_soft_dev(struct rs_rnic *r) { return (struct rs_soft_device *)r; }

/* Snapshot of the counters (each read atomically). */
void rs_soft_get_stats(struct rs_rnic *rnic, struct rs_soft_stats *out);

/* ---- protection domains and memory regions (soft_mem.c) -------------------------------------------------- */

struct rs_soft_pd {
    struct rs_rnic_pd base;
    struct rs_soft_device *dev;
    uint32_t users;                         /* MRs, SRQs, QPs (atomic) */
};
static inline struct rs_soft_pd *rs_soft_pd(struct rs_rnic_pd *p) { return (struct rs_soft_pd *)p; }

struct rs_soft_mr {
    struct rs_rnic_mr pub;                  /* first: what rnic.h hands out */
    struct rs_soft_pd *pd;
    uint32_t index;
    bool remote_valid;                      /* false after invalidation until rekey */
};
static inline struct rs_soft_mr *rs_soft_mr(struct rs_rnic_mr *m) { return (struct rs_soft_mr *)m; }

/* Outcome of a protection check, in the order checks are made. */
enum rs_soft_prot {
    RS_SOFT_PROT_OK = 0,
    RS_SOFT_PROT_INVALID_STAG,              /* no such index, wrong key bits, or invalidated */
    RS_SOFT_PROT_PD_MISMATCH,
    RS_SOFT_PROT_ACCESS,
    RS_SOFT_PROT_WRAP,                      /* offset + length wraps around 2^64 */
    RS_SOFT_PROT_BOUNDS,
};
const char *rs_soft_prot_name(enum rs_soft_prot p);
/* Terminate error code (iwarp_wire.h RS_TERM_RDMAP_*) for a refused access. */
uint8_t rs_soft_prot_term_ecode(enum rs_soft_prot p);

/* Take/drop the read side of the MR table around every access to registered memory. */
void rs_soft_mr_read_lock(struct rs_soft_device *dev);
void rs_soft_mr_read_unlock(struct rs_soft_device *dev);

/*
 * Remote access check, read lock held: the STag (rkey) must name a live, remotely valid region of pd that grants
 * every bit of need (RS_ACCESS_REMOTE_*), and [to, to+len) (to = a virtual address inside the region, as
 * verbs advertises it) must lie inside it without wrapping. On success *where points at byte `to`.
 */
enum rs_soft_prot rs_soft_mr_check_remote(struct rs_soft_device *dev, const struct rs_soft_pd *pd, uint32_t stag,
                                          uint64_t to, uint64_t len, unsigned need, uint8_t **where,
                                          struct rs_soft_mr **mr_out);
/* Local check of one SGE (lkey) for pd; need = 0 (read) or RS_ACCESS_LOCAL_WRITE. Read lock held. */
enum rs_soft_prot rs_soft_mr_check_local(struct rs_soft_device *dev, const struct rs_soft_pd *pd,
                                         const struct rs_rnic_sge *sge, unsigned need, uint8_t **where);
/*
 * Builds iovecs for bytes [offset, offset+len) of an SGE list, checking every SGE it touches (lkey, PD, need,
 * bounds). Read lock held. Returns the iovec count (0 when len is 0), -ENOSPC if the list is shorter than
 * offset+len, -EFAULT on a protection failure (*prot says which), -E2BIG if more than max_iov are needed.
 */
int rs_soft_sge_iov(struct rs_soft_device *dev, const struct rs_soft_pd *pd, const struct rs_rnic_sge *sge,
                    uint32_t num_sge, uint64_t offset, uint64_t len, unsigned need, struct iovec *iov, int max_iov,
                    enum rs_soft_prot *prot);
/* SEND_WITH_INVALIDATE at this end: invalidates stag if it is a region of pd. Takes the write lock itself. */
enum rs_soft_prot rs_soft_mr_invalidate_remote(struct rs_soft_device *dev, const struct rs_soft_pd *pd, uint32_t stag);

/* ---- completion queues (soft_cq.c) ----------------------------------------------------------------------- */

struct rs_soft_qp;

struct rs_soft_cq {
    struct rs_rnic_cq base;
    struct rs_soft_device *dev;
    pthread_mutex_t lock;                   /* ring, arm state, overflow */
    struct rs_rnic_wc *ring;
    uint32_t depth, head, count;
    int event_fd;                           /* eventfd: readable after an armed event */
    bool armed, armed_solicited_only;
    bool overflowed;
    /* QPs using this CQ (either side), for overflow and for lazy timeout checks on poll. */
    pthread_mutex_t attach_lock;
    struct rs_soft_qp **attached;
    uint32_t attached_count, attached_capacity;
    uint64_t next_deadline_ns;              /* earliest timeout among attached QPs (atomic; 0 = none) */
    uint32_t blocked_waiters;               /* threads between rs_soft_cq_wait_begin and _end (atomic) */
    bool inline_pushed;                     /* lock: completions added by a polling thread's own progress */
    /* Late notification of completions an application thread added (see rs_soft_cq_push), from the first wait
     * bracket on (lock): */
    bool consumer_waits;                    /* a wait bracket was used on this CQ */
    bool notify_pending;                    /* the arm was due to fire; it fires when the delay expires unless a
                                             * poll empties the ring first */
    bool delay_armed;                       /* delay_fd is running */
    int delay_fd;                           /* timerfd watched by the progress thread (-1 until needed) */
    struct rs_soft_watch *delay_watch;
};
static inline struct rs_soft_cq *rs_soft_cq(struct rs_rnic_cq *c) { return (struct rs_soft_cq *)c; }

/*
 * Adds a completion (any thread; cq->lock taken inside). Returns 0, or -EOVERFLOW when the CQ was full: the
 * completion is lost, the CQ is in error from now on and every attached QP is moved to ERROR (asynchronously,
 * on the progress thread).
 * On a CQ that wait brackets are used on (consumer progress), a successful completion an application thread adds
 * (e.g. a SEND handed to TCP while it is posted) fires the armed notification RS_SOFT_LATE_NOTIFY_US late, and not
 * at all if a poll empties the CQ before: the poster almost always polls right after, and the notification would
 * only wake whoever else watches the CQ fd (SDP's progress thread) to find the CQ empty, and make it fight the
 * poster for its socket's lock. A waiter never sleeps on such a completion: rs_soft_cq_wait_begin fires it.
 */
#define RS_SOFT_LATE_NOTIFY_US 1000u
int rs_soft_cq_push(struct rs_soft_cq *cq, const struct rs_rnic_wc *wc);
/*
 * The progress thread brackets each socket callback with these. A CQ whose armed notification fires meanwhile gets
 * its fd written once when the callback ends, not at the first completion: the application thread then wakes to a
 * batch instead of being woken (and, on a shared CPU, switched to) per completion. A callback handles a bounded
 * budget, so the notification is late by at most that budget's work. Other threads notify at once.
 */
void rs_soft_cq_defer_begin(void);
void rs_soft_cq_defer_end(void);
/* QPs register with the CQs they use (create_qp) and leave before they are freed (destroy_qp). */
int rs_soft_cq_attach(struct rs_soft_cq *cq, struct rs_soft_qp *qp);
void rs_soft_cq_detach(struct rs_soft_cq *cq, struct rs_soft_qp *qp);
/* Lowers cq->next_deadline_ns to deadline if earlier (a QP attached to cq has a timeout pending then). */
void rs_soft_cq_note_deadline(struct rs_soft_cq *cq, uint64_t deadline_ns);
/* rnic.h's rs_rnic_cq_wait_begin/_end: the sockets of the attached RC QPs that receive into cq, and the count the
 * RC half reads (rs_soft_cq_has_blocked_waiter) to leave those sockets to the waiters. */
int rs_soft_cq_wait_begin(struct rs_rnic_cq *cq, int *fds, int max);
void rs_soft_cq_wait_recheck(struct rs_rnic_cq *cq);
void rs_soft_cq_wait_end(struct rs_rnic_cq *cq);
static inline bool rs_soft_cq_has_blocked_waiter(const struct rs_soft_cq *cq)
{
    return __atomic_load_n(&cq->blocked_waiters, __ATOMIC_ACQUIRE) != 0;
}

/* ---- receive queues and SRQs (soft_srq.c) ---------------------------------------------------------------- */

enum rs_soft_recv_state {
    RS_SOFT_RECV_POSTED,
    RS_SOFT_RECV_TAKEN,
    RS_SOFT_RECV_DONE,                      /* finished; its wc waits for earlier receives */
    RS_SOFT_RECV_DONE_EMITTED,              /* finished and already delivered (flushed out of order) */
};

struct rs_soft_recv_wqe {
    uint64_t wr_id;
    uint32_t num_sge;
    uint32_t state;                         /* enum rs_soft_recv_state */
    uint64_t length;                        /* sum of the SGE lengths */
    struct rs_rnic_sge *sge;                /* num_sge entries, owned by the queue */
    struct rs_soft_qp *qp;                  /* the QP that took it */
    struct rs_rnic_wc wc;                   /* completion held until every earlier receive is done */
};

/*
 * A ring of posted receives. Receives are taken in posting order and complete in posting order: a receive that
 * finishes while an earlier taken one is still in progress (a segmented UD message) waits for it.
 *   head <= taken <= tail; [head, taken) taken or done, [taken, tail) posted.
 */
struct rs_soft_rq {
    pthread_mutex_t lock;
    struct rs_soft_pd *pd;
    struct rs_soft_recv_wqe *ring;
    struct rs_rnic_sge *sges;
    uint32_t capacity, max_sge;
    uint64_t head, taken, tail;
    bool shared;                            /* part of an SRQ */
};

struct rs_soft_srq {
    struct rs_rnic_srq base;
    struct rs_soft_pd *pd;
    struct rs_soft_rq rq;
    uint32_t users;                         /* QPs (atomic) */
};
static inline struct rs_soft_srq *rs_soft_srq(struct rs_rnic_srq *s) { return (struct rs_soft_srq *)s; }

int rs_soft_rq_init(struct rs_soft_rq *rq, struct rs_soft_pd *pd, uint32_t capacity, uint32_t max_sge, bool shared);
void rs_soft_rq_fini(struct rs_soft_rq *rq);
/* Posts a chain (validates num_sge; SGEs are checked when data is placed). */
int rs_soft_rq_post(struct rs_soft_rq *rq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
/* Takes the oldest posted receive of qp's queue for qp: 0, or -EAGAIN when none is posted. */
int rs_soft_rq_take(struct rs_soft_qp *qp, struct rs_soft_recv_wqe **out);
/* Gives back the most recently taken receive untouched (e.g. its datagram failed the CRC). If it is no longer the
 * most recent one it cannot go back without reordering: it then completes with RS_WC_GENERAL_ERR. */
void rs_soft_rq_untake(struct rs_soft_qp *qp, struct rs_soft_recv_wqe *wqe);
/* Like rs_soft_rq_untake but only when possible: true if the receive went back, false (nothing done) if not. */
bool rs_soft_rq_try_untake(struct rs_soft_qp *qp, struct rs_soft_recv_wqe *wqe);
/* Finishes a taken receive: wc (status, opcode, byte_len, flags, src...) is completed on qp->recv_cq in posting
 * order; wr_id and qp are filled in here. */
void rs_soft_rq_finish(struct rs_soft_qp *qp, struct rs_soft_recv_wqe *wqe, const struct rs_rnic_wc *wc);
/* Flushes qp's receives: every posted (own RQ only) and every taken-by-qp receive completes RS_WC_WR_FLUSH_ERR. */
void rs_soft_rq_flush(struct rs_soft_qp *qp);

/* ---- send queues (soft_qp.c) ----------------------------------------------------------------------------- */

struct rs_soft_send_wqe {
    uint64_t wr_id;
    enum rs_rnic_wr_opcode opcode;
    unsigned flags;                         /* RS_SEND_*; RS_SEND_SIGNALED set when sq_sig_all */
    uint32_t num_sge;
    struct rs_rnic_sge *sge;                /* copied at post time; owned by the queue */
    uint64_t length;                        /* sum of SGE lengths */
    uint8_t *inline_data;                   /* RS_SEND_INLINE: length bytes copied at post time, else NULL */
    uint32_t imm_data, invalidate_rkey;
    uint64_t remote_addr;
    uint32_t rkey;
    struct sockaddr_storage peer;           /* UD: destination, copied from the ud_peer at post time */
    socklen_t peer_len;
    struct rs_rnic_qos peer_qos;
    bool peer_qos_set;                      /* the peer was resolved with its own qos (else the QP's applies) */
    uint64_t sent;                          /* bytes already handed to the socket (transmitting half's cursor) */
    uint32_t msg_id;                        /* assigned by the transmitting half when it starts the WQE */
};

/*
 * Ring of posted sends, under qp->sq_lock.  head <= next <= tail:
 *   [head, next) started, not yet completed (completion order = ring order);
 *   [next, tail) posted, not yet started.
 */
struct rs_soft_sq {
    struct rs_soft_send_wqe *ring;
    struct rs_rnic_sge *sges;
    uint8_t *inline_buf;                    /* capacity * max_inline bytes */
    uint32_t capacity, max_sge, max_inline;
    uint64_t head, next, tail;
};

/* Oldest started-but-incomplete WQE, or NULL. sq_lock held. */
struct rs_soft_send_wqe *rs_soft_sq_head(struct rs_soft_qp *qp);
/* Next WQE to start, or NULL. sq_lock held; rs_soft_sq_started() moves past it. */
struct rs_soft_send_wqe *rs_soft_sq_next(struct rs_soft_qp *qp);
void rs_soft_sq_started(struct rs_soft_qp *qp);
/* Completes the oldest WQE (sq_lock held): a completion goes to send_cq when it is signaled or failed. */
void rs_soft_sq_complete_head(struct rs_soft_qp *qp, enum rs_rnic_wc_status status);
/* Frees the oldest WQE's slot without a completion (its work continues elsewhere, e.g. a UD READ). */
void rs_soft_sq_retire_head(struct rs_soft_qp *qp);
/* A send-side completion for work that already left the ring (e.g. a UD READ); no lock needed. */
void rs_soft_send_wc(struct rs_soft_qp *qp, uint64_t wr_id, enum rs_rnic_wr_opcode opcode, bool signaled,
                     enum rs_rnic_wc_status status, uint32_t byte_len);
/* Flushes every WQE of the send queue with RS_WC_WR_FLUSH_ERR (takes sq_lock). */
void rs_soft_sq_flush(struct rs_soft_qp *qp);
/* Completion opcode of a work request opcode. */
enum rs_rnic_wc_opcode rs_soft_wc_opcode(enum rs_rnic_wr_opcode op);

/* ---- queue pairs (soft_qp.c) ----------------------------------------------------------------------------- */

struct rs_soft_ud;                          /* ud.h */

struct rs_soft_qp {
    struct rs_rnic_qp base;                 /* first: rnic + context */
    struct rs_soft_device *dev;
    struct rs_soft_pd *pd;
    enum rs_rnic_qp_type type;
    uint32_t qpn;
    int state;                              /* enum rs_rnic_qp_state; read/written with rs_soft_qp_{get,set}_state */
    struct rs_rnic_qp_attr attr;            /* as created; timeouts filled with defaults */
    struct rs_soft_cq *send_cq, *recv_cq;
    struct rs_soft_srq *srq;
    struct rs_soft_rq *rq;                  /* own queue, or &srq->rq */
    struct rs_soft_rq own_rq;
    pthread_mutex_t sq_lock;                /* send queue, qos */
    struct rs_soft_sq sq;
    struct rs_rnic_qos qos;
    struct rs_soft_ud *ud;                  /* UD half state (RS_QPT_UD) */
    void *rc;                               /* RC half state (RS_QPT_RC), owned by rs_soft_rc_ops */
    uint64_t next_deadline_ns;              /* earliest pending timeout (atomic; 0 = none) */
};
static inline struct rs_soft_qp *rs_soft_qp(struct rs_rnic_qp *q) { return (struct rs_soft_qp *)q; }

static inline enum rs_rnic_qp_state rs_soft_qp_get_state(const struct rs_soft_qp *qp)
{
    return (enum rs_rnic_qp_state)__atomic_load_n(&qp->state, __ATOMIC_ACQUIRE);
}
static inline void rs_soft_qp_set_state(struct rs_soft_qp *qp, enum rs_rnic_qp_state s)
{
    __atomic_store_n(&qp->state, (int)s, __ATOMIC_RELEASE);
}
/*
 * Moves qp to ERROR and flushes its send queue and receives (RS_WC_WR_FLUSH_ERR). Idempotent. For RC QPs the RC
 * half's set_error runs first (it closes the socket and reports RS_RNIC_CM_EV_ERROR). Any thread, no locks held.
 */
void rs_soft_qp_enter_error(struct rs_soft_qp *qp);
/* Records a pending timeout of qp (UD READ, record, reassembly) so polling its CQs checks it lazily. */
void rs_soft_qp_note_deadline(struct rs_soft_qp *qp, uint64_t deadline_ns);
/* Runs every timeout of qp that is due at now (poll_cq and the progress thread call it). */
void rs_soft_qp_expire(struct rs_soft_qp *qp, uint64_t now_ns);

/* ---- connection-manager event channel (soft_cm.c) --------------------------------------------------------- */

struct rs_soft_cm_event_node;

struct rs_soft_cm {
    struct rs_rnic_cm base;
    struct rs_soft_device *dev;
    pthread_mutex_t lock;                   /* leaf */
    int event_fd;                           /* readable while events are queued */
    struct rs_soft_cm_event_node *first, *last;
    uint32_t refs;                          /* the application's + one per holder (rs_soft_cm_get) */
    bool closed;                            /* rs_rnic_cm_destroy called: pushes are discarded */
};
static inline struct rs_soft_cm *rs_soft_cm(struct rs_rnic_cm *c) { return (struct rs_soft_cm *)c; }

/* Queues an event (any thread). 0, -ENOMEM, or -ESHUTDOWN after the application destroyed the channel (the
 * event is dropped; if it carried a connection request the caller still owns it). */
int rs_soft_cm_push(struct rs_soft_cm *cm, const struct rs_rnic_cm_event *ev);
/* References held by objects that push later (a connecting QP, a listener): the channel memory lives until the
 * last put, even after rs_rnic_cm_destroy. */
void rs_soft_cm_get(struct rs_soft_cm *cm);
void rs_soft_cm_put(struct rs_soft_cm *cm);

/* ---- progress engine (soft_progress.c) ------------------------------------------------------------------- */

#define RS_SOFT_EV_READ 1u
#define RS_SOFT_EV_WRITE 2u

struct rs_soft_watch;
struct rs_soft_timer;
/* Callbacks run on the progress thread. A callback should do a bounded amount of work (a budget of datagrams
 * or bytes) and return: every ready fd gets its turn in each loop iteration, so no QP starves another. */
typedef void (*rs_soft_io_cb)(struct rs_soft_watch *w, int fd, unsigned revents, void *arg);
typedef void (*rs_soft_timer_cb)(struct rs_soft_timer *t, void *arg);
typedef void (*rs_soft_call_fn)(void *arg);

int rs_soft_progress_start(struct rs_soft_device *dev);
void rs_soft_progress_stop(struct rs_soft_device *dev);     /* joins the thread; watches must be gone */
bool rs_soft_progress_on_loop(const struct rs_soft_device *dev);

/* Runs fn(arg) on the progress thread: _call queues it and returns at once (-ENOMEM possible); _call_sync
 * returns after fn returned (runs it directly when already on the loop thread). */
int rs_soft_progress_call(struct rs_soft_device *dev, rs_soft_call_fn fn, void *arg);
void rs_soft_progress_call_sync(struct rs_soft_device *dev, rs_soft_call_fn fn, void *arg);

/* Watches fd for events (RS_SOFT_EV_*); active once the loop thread picked it up (immediately when called on it).
 * Level-triggered. NULL on allocation failure. */
struct rs_soft_watch *rs_soft_watch_add(struct rs_soft_device *dev, int fd, unsigned events, rs_soft_io_cb cb,
                                        void *arg);
/* Changes the events watched (0 pauses); any thread. */
void rs_soft_watch_set(struct rs_soft_watch *w, unsigned events);
/* Stops and frees the watch. When it returns the callback is not running and never runs again. Any thread
 * (including from inside the callback itself). Does not close fd. */
void rs_soft_watch_del(struct rs_soft_watch *w);

/* One-shot timers on the loop thread. arm(ms) (re)starts it, arm(0) stops it; free is synchronous like
 * rs_soft_watch_del. */
struct rs_soft_timer *rs_soft_timer_new(struct rs_soft_device *dev, rs_soft_timer_cb cb, void *arg);
void rs_soft_timer_arm(struct rs_soft_timer *t, uint32_t ms);
void rs_soft_timer_free(struct rs_soft_timer *t);

/* ---- the RC half's hook ----------------------------------------------------------------------------------- */

/*
 * Filled by the RC half (rc_*.c, mpa*.c, cm_tcp*.c). The reference is strong (since v3): a weak one does not pull
 * the RC half out of librdmasock.a, so a program linked statically got -EOPNOTSUPP for every RC call. Optional
 * members may be NULL. Which thread calls what:
 *   qp_create      application thread, from rs_rnic_create_qp after the core built the queues; set qp->rc.
 *   qp_destroy     application thread, from rs_rnic_destroy_qp, no soft locks held. Must reset any connection,
 *                  delete its watches/timers (synchronously) and free qp->rc; the core flushes the queues after.
 *   post_send      any thread, no locks held, after new WQEs were queued in qp->sq (already validated: opcode
 *                  allowed on RC, num_sge, inline copy). Start transmitting (from [sq.next, sq.tail)).
 *   post_recv      optional; any thread, no locks held, after receives were posted to qp's own RQ.
 *   set_error      any thread, no locks held, from rs_soft_qp_enter_error before the core flushes the queues:
 *                  close the connection and push RS_RNIC_CM_EV_ERROR. Must not call rs_soft_qp_enter_error.
 *   set_qos        application thread; qp->qos already updated (under sq_lock).
 *   expire         optional; lazy timeouts, from rs_rnic_poll_cq (application thread, holding that CQ's
 *                  attach_lock) or from the progress thread. Must not call the _sync / _del / _free functions of
 *                  the progress engine (the loop thread may be waiting for the same attach_lock).
 *   listen .. disconnect, request_discard: as in rnic.h / provider.h, application thread.
 *   request_discard optional: a CONNECT_REQUEST event dropped unread with its channel; free the request.
 *   rx_inline      optional; an application thread polling qp's receive CQ (attach_lock held, so qp stays
 *                  attached and alive): receive what the socket holds, on this thread, without ever waiting for
 *                  the progress thread. Returns true if the call may have added completions; *drained
 *                  false when bytes were left (its budget ran out).
 *   wait_fd        optional; like rx_inline's context: the fd a thread about to block on qp's receive CQ should
 *                  watch for readability (then poll the CQ), or -1 when the progress thread must handle it.
 */
struct rs_soft_rc_ops {
    int (*qp_create)(struct rs_soft_qp *qp);
    void (*qp_destroy)(struct rs_soft_qp *qp);
    int (*post_send)(struct rs_soft_qp *qp);
    void (*post_recv)(struct rs_soft_qp *qp);
    void (*set_error)(struct rs_soft_qp *qp);
    int (*set_qos)(struct rs_soft_qp *qp, const struct rs_rnic_qos *qos);
    void (*expire)(struct rs_soft_qp *qp, uint64_t now_ns);
    int (*listen)(struct rs_soft_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                  struct rs_rnic_listener **out);
    int (*listener_addr)(const struct rs_rnic_listener *listener, struct sockaddr_storage *out);
    void (*listener_close)(struct rs_rnic_listener *listener);
    void (*listener_park)(struct rs_rnic_listener *listener);
    int (*listener_intake)(struct rs_rnic_listener *listener, unsigned want, uint32_t seen);
    int (*connect)(struct rs_soft_qp *qp, struct rs_soft_cm *cm, const struct sockaddr *dst, socklen_t len,
                   const void *private_data, uint32_t private_data_len, uint32_t timeout_ms);
    int (*accept)(struct rs_rnic_conn_request *request, struct rs_soft_qp *qp, struct rs_soft_cm *cm,
                  const void *private_data, uint32_t private_data_len);
    int (*reject)(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len);
    int (*disconnect)(struct rs_soft_qp *qp);
    int (*local_addr)(const struct rs_soft_qp *qp, struct sockaddr_storage *out);
    void (*request_discard)(struct rs_rnic_conn_request *request);
    bool (*rx_inline)(struct rs_soft_qp *qp, bool *drained);
    int (*wait_fd)(struct rs_soft_qp *qp);
    bool (*reads_placed_directly)(const struct rs_soft_qp *qp);     /* v7: local Read placement (rc_local.c) */
};
extern const struct rs_soft_rc_ops rs_soft_rc_ops;

/* ---- UD half entry points used by the core (ud_*.c) ------------------------------------------------------ */

int rs_soft_ud_qp_create(struct rs_soft_qp *qp);
void rs_soft_ud_qp_destroy(struct rs_soft_qp *qp);         /* socket closed, watches gone, pending work flushed */
int rs_soft_ud_post_send(struct rs_soft_qp *qp);           /* like rc post_send */
/* Copies a UD destination (address, port, qos) into a send WQE at post time (sq_lock held). */
void rs_soft_ud_fill_peer(struct rs_soft_send_wqe *e, const struct rs_rnic_ud_peer *peer);
void rs_soft_ud_set_error(struct rs_soft_qp *qp);
int rs_soft_ud_set_qos(struct rs_soft_qp *qp, const struct rs_rnic_qos *qos);
void rs_soft_ud_expire(struct rs_soft_qp *qp, uint64_t now_ns);
int rs_soft_ud_bind(struct rs_rnic_qp *qp, const struct sockaddr *local, socklen_t len);
int rs_soft_ud_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);
int rs_soft_ud_resolve_peer(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *peer,
                            const struct rs_rnic_qos *qos, uint32_t timeout_ms, void *context,
                            struct rs_rnic_ud_peer **out);
void rs_soft_ud_peer_free(struct rs_rnic_ud_peer *peer);
int rs_soft_ud_join_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group, const struct sockaddr *iface);
int rs_soft_ud_leave_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group);
/* Adopting the application's socket (rnic.h, since v5). */
int rs_soft_ud_adopt_fd(struct rs_rnic_qp *qp, const struct rs_rnic_ud_adopt *how);
int rs_soft_ud_set_raw_limits(struct rs_rnic_qp *qp, uint32_t raw_max_bytes, uint32_t raw_max_count);
int rs_soft_ud_take_raw(struct rs_rnic_qp *qp, struct rs_rnic_raw_dgram **out);
int rs_soft_ud_counters(const struct rs_rnic_qp *qp, struct rs_rnic_ud_counters *out);

/*
 * Feeds one datagram to a UD QP's receive path as if it had arrived on its socket from src (the fuzz target and
 * tests use it; bypasses the socket, not the checks). Returns 0 if it was accepted (placed or consumed), or a
 * negative errno saying why it was dropped (the drop is counted like a socket one).
 */
int rs_soft_ud_rx_buffer(struct rs_rnic_qp *qp, const void *buf, size_t len, const struct sockaddr *src,
                         socklen_t src_len);

/* ---- provider entry points (one per rnic.h call; soft_*.c, wired into the ops table in soft_device.c) ---- */

int rs_soft_alloc_pd(struct rs_rnic *rnic, struct rs_rnic_pd **out);
int rs_soft_dealloc_pd(struct rs_rnic_pd *pd);
int rs_soft_reg_mr(struct rs_rnic_pd *pd, void *addr, size_t length, unsigned access, struct rs_rnic_mr **out);
int rs_soft_dereg_mr(struct rs_rnic_mr *mr);
int rs_soft_mr_invalidate(struct rs_rnic_mr *mr);
int rs_soft_mr_rekey(struct rs_rnic_mr *mr);
int rs_soft_mr_table_init(struct rs_soft_device *dev);
void rs_soft_mr_table_fini(struct rs_soft_device *dev);
int rs_soft_create_cq(struct rs_rnic *rnic, uint32_t depth, struct rs_rnic_cq **out);
int rs_soft_destroy_cq(struct rs_rnic_cq *cq);
int rs_soft_cq_fd(const struct rs_rnic_cq *cq);
int rs_soft_cq_arm(struct rs_rnic_cq *cq, bool solicited_only);
void rs_soft_cq_ack_events(struct rs_rnic_cq *cq);
int rs_soft_poll_cq(struct rs_rnic_cq *cq, int n, struct rs_rnic_wc *wc);
int rs_soft_create_srq(struct rs_rnic_pd *pd, uint32_t max_wr, uint32_t max_sge, struct rs_rnic_srq **out);
int rs_soft_destroy_srq(struct rs_rnic_srq *srq);
int rs_soft_post_srq_recv(struct rs_rnic_srq *srq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
int rs_soft_create_qp(struct rs_rnic_pd *pd, const struct rs_rnic_qp_attr *attr, struct rs_rnic_qp **out);
int rs_soft_destroy_qp(struct rs_rnic_qp *qp);
enum rs_rnic_qp_state rs_soft_qp_state(const struct rs_rnic_qp *qp);
uint32_t rs_soft_qp_num(const struct rs_rnic_qp *qp);
int rs_soft_qp_set_qos(struct rs_rnic_qp *qp, const struct rs_rnic_qos *qos);
int rs_soft_qp_set_error(struct rs_rnic_qp *qp);
int rs_soft_post_send(struct rs_rnic_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr);
int rs_soft_post_recv(struct rs_rnic_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
int rs_soft_cm_create(struct rs_rnic *rnic, struct rs_rnic_cm **out);
void rs_soft_cm_destroy(struct rs_rnic_cm *cm);
int rs_soft_cm_fd(const struct rs_rnic_cm *cm);
int rs_soft_cm_get_event(struct rs_rnic_cm *cm, struct rs_rnic_cm_event *ev);
int rs_soft_listen(struct rs_rnic_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                   struct rs_rnic_listener **out);
int rs_soft_listener_addr(const struct rs_rnic_listener *listener, struct sockaddr_storage *out);
void rs_soft_listener_park(struct rs_rnic_listener *listener);
int rs_soft_listener_intake(struct rs_rnic_listener *listener, unsigned want, uint32_t seen);
void rs_soft_listener_close(struct rs_rnic_listener *listener);
int rs_soft_connect(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *dst, socklen_t len,
                    const void *private_data, uint32_t private_data_len, uint32_t timeout_ms);
int rs_soft_accept(struct rs_rnic_conn_request *request, struct rs_rnic_qp *qp, struct rs_rnic_cm *cm,
                   const void *private_data, uint32_t private_data_len);
int rs_soft_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len);
int rs_soft_disconnect(struct rs_rnic_qp *qp);
int rs_soft_qp_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);
bool rs_soft_qp_reads_placed_directly(const struct rs_rnic_qp *qp);

/* =========================================== TEST ONLY ===================================================== */
/*
 * Drops inbound UD datagrams of this device at random, per_million in a million, before a byte is placed
 * (deterministic for a seed). 0 disables. The same can be set for every device opened later with the environment
 * variable RDMASOCK_SOFT_TEST_DROP="per_million[:seed]". Never use outside tests.
 */
void rs_soft_test_set_drop(struct rs_rnic *rnic, uint32_t per_million, uint64_t seed);
/* True when the knob says drop this datagram (counts it). */
bool rs_soft_test_should_drop(struct rs_soft_device *dev);

#endif /* RS_RNIC_SOFT_SOFT_H */
