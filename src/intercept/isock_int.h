/*
 * isock_int.h: the intercepted socket's insides, shared by isock.c (object, paths, waiting, fork) and the call
 * files (sock_calls.c, io_calls.c). Nothing outside src/intercept includes this.
 */
#ifndef RS_INTERCEPT_ISOCK_INT_H
#define RS_INTERCEPT_ISOCK_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "common/config.h"
#include "common/lock.h"
#include "common/stats.h"
#include "common/thread.h"
#include "dgram_wr/dgram.h"
#include "intercept/isock.h"
#include "intercept/policy.h"
#include "sdp_stream/sdp.h"

/* Where the application's traffic on this socket goes now. */
enum rs_isock_path {
    RS_IPATH_UNDECIDED,     /* stream socket before listen/connect: the kernel socket answers everything */
    RS_IPATH_KERNEL,        /* the rules (or a fallback) put it on the kernel: every call goes to the kernel fd */
    RS_IPATH_SDP,           /* SDP connection (connected, or connecting over RDMA) */
    RS_IPATH_LISTEN,        /* listener with an SDP side (and a kernel side when both_kernel) */
    RS_IPATH_DGRAM,         /* UDP socket adopted by the datagram layer */
};

#define RS_ISOCK_SAVED_OPTS 16
#define RS_ISOCK_APP_OPTS 16

/* The reason recorded for a connection handed back to kernel TCP (its statistics slot says path kernel). */
#define RS_ISOCK_REASON_HANDED_BACK RS_REASON_HANDED_BACK

/* A socket option the application set before the socket had an SDP side: replayed onto it when it gets one. */
struct rs_saved_opt {
    int level, name;
    socklen_t len;
    unsigned char val[16];
};

struct rs_isock {
    struct rs_fd_obj obj;                   /* first: the fd table points here */
    struct rs_lock lock;                    /* state changes only (common/lock.h); the data path reads the fields below
                                             * it published with release stores */
    int family, type, protocol;
    int nfds;                               /* application fds naming this socket (atomic) */
    pid_t owner;                            /* process whose RNIC state sdp/listener belong to */

    enum rs_isock_path path;                /* atomic load on the data path */
    struct rs_sdp_sock *sdp;                /* SDP connection or listener (isock holds one rs_sdp_hold); written
                                             * with atomic stores: data calls read it without the lock */
    struct rs_dgram_sock *dg;               /* datagram side (isock holds one rs_dgram_hold) */
    int dg_fd;                              /* private dup of the UDP socket the datagram layer reads */

    /* stream state */
    enum rs_mode mode;                      /* of the rule that decided */
    enum rs_reason reason;                  /* why (statistics area) */
    const struct rs_rule *rule;
    bool connecting;                        /* nonblocking SDP connect under way; may still fall back */
    bool kernel_listening;                  /* both-mode listener: the kernel socket listens too */
    bool dormant;                           /* listener whose SDP side must be (re)created in this process */
    int backlog;
    int pending_error;                      /* SO_ERROR to report (a fallback connect that failed at once) */
    struct sockaddr_storage dst;            /* connect destination as the application gave it */
    socklen_t dst_len;
    struct sockaddr_storage local;          /* for getsockname of converted sockets (application's family) */
    socklen_t local_len;
    struct rs_saved_opt saved[RS_ISOCK_SAVED_OPTS];
    int n_saved;
    /* Options the application set, whatever the path: what a kernel socket that takes over the connection after
     * a hand-back must get (kernel sockets keep their options across fork; an accepted socket starts with its
     * listener's, as in Linux). */
    struct rs_saved_opt app_opts[RS_ISOCK_APP_OPTS];
    int n_app_opts;

    /* hand-back (the connection continues on kernel TCP: fork, exec; handover.h) */
    int ho_slot;                            /* record in the family's hand-over arena, -1 none */
    uint64_t ho_token;
    bool hb_busy;                           /* a hand-back or claim of this process is under way (lock) */
    struct rs_cond hb_cond;                 /* broadcast when hb_busy clears (with lock) */
    int handed_fd;                          /* owner: kernel socket of a finished hand-back the application's names
                                             * have not switched to yet (internal fd), -1 */
    bool lost;                              /* a claim or hand-back failed: the names hold a dead socket */

    bool seen_by_waiter;                    /* a poll/epoll has looked at it (its registrations name it) */
    unsigned interest[4];                   /* waiters per event: POLLIN, POLLOUT, POLLRDHUP, POLLPRI */
    uint32_t generation;                    /* atomic */
    int stats_slot;

    /* Data calls in flight that read sdp without the lock (rs_isock_io_begin). An SDP side detached while some
     * run is kept here, with its reference, until the last of them ends (lock). */
    uint32_t io_users;                      /* atomic */
    bool retired_pending;                   /* atomic: retired holds something */
    struct rs_sdp_sock **retired;
    uint32_t n_retired, retired_cap;
};

/* Ends what rs_isock_io_begin began; the last call out releases the SDP sides detached meanwhile. */
void rs_isock_io_release_retired(struct rs_isock *s);
static inline void rs_isock_io_end(struct rs_isock *s)
{
    if (__atomic_sub_fetch(&s->io_users, 1, __ATOMIC_SEQ_CST) == 0 &&
        __atomic_load_n(&s->retired_pending, __ATOMIC_SEQ_CST))
        rs_isock_io_release_retired(s);
}

/*
 * The data path's way to the SDP side of a connection this process owns, without the lock or a reference of its
 * own: io_users counts the call, and a side detached meanwhile stays alive until the count falls to zero. True with
 * *sdp set; rs_isock_io_end must follow. False (nothing held) when s is not such a connection right now.
 */
static inline bool rs_isock_io_begin(struct rs_isock *s, struct rs_sdp_sock **sdp)
{
    __atomic_add_fetch(&s->io_users, 1, __ATOMIC_SEQ_CST);
    struct rs_sdp_sock *found = __atomic_load_n(&s->sdp, __ATOMIC_SEQ_CST);
    if (found && __atomic_load_n(&s->path, __ATOMIC_ACQUIRE) == RS_IPATH_SDP && s->owner == rs_self_pid()) {
        *sdp = found;
        return true;
    }
    rs_isock_io_end(s);
    return false;
}

/* Creates an isock for a fresh kernel socket fd and installs it at fd. NULL when the socket is not one rdmasock
 * may ever convert (the caller then leaves the fd untracked). */
struct rs_isock *rs_isock_create(int fd, int family, int type, int protocol);
/* Installs s at another fd naming the same open file (dup, accept of a converted connection). */
int rs_isock_install(struct rs_isock *s, int fd);

/*
 * A socket the rules put on the kernel needs nothing from rdmasock: stop tracking fd so every later call goes
 * straight to libc (the 1% budget of issue 6). Only when fd is its only name and no waiter registered it, so no
 * registration is lost. Returns true when untracked.
 */
bool rs_isock_untrack_if_kernel(struct rs_isock *s, int fd);

/* Closes the application's last name of s: the SDP/datagram side closes as a kernel socket would. */
int rs_isock_last_close(struct rs_isock *s);
/* The calling thread lets go of s if its data calls' cache holds it (io_calls.c): closed by the thread that used it
 * last, a connection's memory goes at once rather than when the entry is next replaced. */
void rs_io_cache_forget(const struct rs_isock *s);

/* Stream path changes (isock.c) */
int rs_isock_listen(struct rs_isock *s, int fd, int backlog);
int rs_isock_connect(struct rs_isock *s, int fd, const struct sockaddr *dst, socklen_t len);
int rs_isock_accept(struct rs_isock *s, int fd, struct sockaddr *addr, socklen_t *len, int flags);
/* Finishes a nonblocking SDP connect if its outcome is known: success, or fallback to the kernel. */
void rs_isock_settle_connect(struct rs_isock *s, int fd);
/* Recreates a dormant listener's SDP side in this process. */
void rs_isock_revive(struct rs_isock *s, int fd);

/*
 * Hand-back: the connection continues on a kernel TCP socket, which the application's names (every fd of s in this
 * process) are switched to with dup3, keeping their close-on-exec flags, the open file's status flags and the
 * options the application set. The path becomes RS_IPATH_KERNEL (reason RS_ISOCK_REASON_HANDED_BACK) and the
 * generation moves, so waiters re-register. A failure puts a dead socket in their place (reads end, writes get
 * EPIPE) with SO_ERROR ECONNRESET, as a reset kernel connection behaves.
 *
 * rs_isock_follow: before a call uses s, a connection inherited across fork is claimed from its owner (handover.h).
 *   0: nothing to do, or done (the path is no longer SDP); -ECONNRESET: the claim failed (the triggering call fails
 *   with it); -EBADF: inherited with no record (the parent forked while it was still connecting, or the arena was
 *   full): the connection cannot follow.
 * rs_isock_adopt: the SDP side answered -EREMCHG (or its mask says handed back): switch over. 0, or -ECONNRESET.
 * rs_isock_handback: the owner starts (or joins) a hand-back, bounded by timeout_ms, for a claim or an exec. The
 *   kernel socket is parked for the record's holders (rs_ho_park); the names switch at once with adopt_now, else
 *   on the application's next call. 0, or -errno (-EOPNOTSUPP: not a connected SDP connection, or a peer without
 *   hand-back: nothing changed).
 */
int rs_isock_follow(struct rs_isock *s);
int rs_isock_adopt(struct rs_isock *s);
int rs_isock_handback(struct rs_isock *s, int timeout_ms, bool adopt_now);
/* True when s answers from kernel TCP after a hand-back (its addresses are still the RDMA connection's). */
bool rs_isock_handed_back(struct rs_isock *s);
/* Remembers an option the application set (for a kernel socket that may take over the connection). */
void rs_isock_record_opt(struct rs_isock *s, int level, int name, const void *val, socklen_t len);

/* Data-path accessors: the current path with a reference on its object, so a concurrent close cannot free it. */
static inline enum rs_isock_path rs_isock_path_now(struct rs_isock *s)
{
    return __atomic_load_n(&s->path, __ATOMIC_ACQUIRE);
}

void rs_isock_save_opt(struct rs_isock *s, int level, int name, const void *val, socklen_t len);
/* One data call on s moved bytes over RDMA (statistics). */
static inline void rs_isock_set_stats_io(struct rs_isock *s, size_t bytes, bool sent)
{
    rs_stats_add_io(s->stats_slot, s->type == SOCK_DGRAM ? RS_STATS_PROTO_UDP : RS_STATS_PROTO_TCP, bytes, sent);
}

/* Converts a v4-mapped IPv6 address to IPv4 (for the RNIC), and an IPv4 address to the application's family. */
socklen_t rs_addr_unmap(const struct sockaddr *in, socklen_t len, struct sockaddr_storage *out);
socklen_t rs_addr_to_family(int family, const struct sockaddr *in, socklen_t len, struct sockaddr_storage *out);
/* Copies a sockaddr out as the kernel does (truncated to *len, *len set to the full size). */
void rs_addr_copy_out(const struct sockaddr_storage *a, socklen_t alen, struct sockaddr *out, socklen_t *len);

/* errno convention: -errno from the lower layers to -1/errno for the application. */
static inline long rs_ret(long r)
{
    if (r < 0) {
        errno = (int)-r;
        return -1;
    }
    return r;
}

#endif /* RS_INTERCEPT_ISOCK_INT_H */
