/*
 * io_calls.c: the interposed data calls: read, write, their vector forms, recv*, send*, the mmsg forms, sendfile,
 * and glibc's fortified variants. An fd that is not intercepted costs one table lookup; an SDP connection goes to
 * sdp_stream, an adopted UDP socket to dgram_wr, anything else to the kernel.
 */
#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/thread.h"
#include "intercept/isock_int.h"
#include "intercept/libc.h"
#include "intercept/signals.h"

/* What one data call goes to. */
struct io_target {
    struct rs_isock *s;             /* NULL: the kernel, untracked fd */
    struct rs_sdp_sock *sdp;        /* held: a reference of our own, or counted in io_users (io_user) */
    struct rs_dgram_sock *dg;       /* the isock keeps it alive while s is held */
    bool io_user;                   /* sdp found by rs_isock_io_begin: rs_isock_io_end, not a release */
    bool inherited;                 /* an SDP connection inherited across fork that could not follow: */
    int error;                      /* what every call on it answers */
    bool cached;                    /* s and sdp come from the thread's cache (io_cache): nothing held by the call */
    int fd;
};

/*
 * The thread's cache of its SDP connections (docs/sdp.md, "A thread's connections"). Each thread
 * remembers the last connection it moved data on per fd % IO_CACHE_WAYS, with a reference on the interposer socket
 * and one on its SDP side. A call on such an fd checks that the fd still names that socket, that the socket still
 * has that SDP side, owned by this process, and goes ahead with no lock, no reference and no atomic instruction:
 * the slot lock, two reference counts and the in-flight count were about a tenth of a busy poller's round trip over
 * rxe. The entry's references keep the two objects' memory and nothing more: a close still closes at once (the
 * count of names decides that); the memory goes when the closing thread drops its entry (rs_io_cache_forget), or
 * else when the entry is replaced or the thread exits.
 *
 * Signal handlers: a call that uses or changes the cache marks it busy first, and a call nested in a handler that
 * finds it busy takes the locked path, so an entry never changes under the call that uses it.
 */
#define IO_CACHE_WAYS 4u
/*
 * The short calls' statistics (io_short) gather in the entry and go to the shared counters every IO_STATS_BATCH
 * calls and when the entry is dropped: four locked adds per call were as much as 150 instructions of a busy
 * poller's round trip under TCG. So `rdmasock stat` may show up to IO_STATS_BATCH - 1 small transfers per thread
 * and connection late while the connection is open; a connection's counts are complete once the thread that used
 * it closes it, replaces it in its cache or exits (docs/sdp.md, "No clock, no shared counters, few calls").
 */
#define IO_STATS_BATCH 16u
struct io_cache_entry {
    struct rs_isock *s;
    struct rs_sdp_sock *sdp;
    const uintptr_t *slot;          /* fd's word in the fd table (rs_fd_slot): still s while fd names s */
    int fd;                         /* the fd the entry was made for (the way serves every fd with its remainder) */
    pid_t pid;                      /* the process that took the references */
    uint32_t calls;                 /* short calls counted below, not yet in the shared counters */
    uint32_t msgs_tx, msgs_rx;
    uint64_t bytes_tx, bytes_rx;
};
static __thread struct {
    struct io_cache_entry way[IO_CACHE_WAYS];
    unsigned busy;
    bool registered;                /* io_cache_key is set on this thread: its exit empties the cache */
} io_cache;
static pthread_key_t io_cache_key;
static pthread_once_t io_cache_once = PTHREAD_ONCE_INIT;
static bool io_cache_key_ok;

static RS_ALWAYS_INLINE void io_cache_mark(unsigned busy)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    io_cache.busy = busy;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* The entry's gathered counts into the shared statistics (its reference keeps the socket's slot). */
static void io_cache_flush_stats(struct io_cache_entry *e)
{
    rs_stats_add_io_batch(e->s->stats_slot, RS_STATS_PROTO_TCP, e->bytes_tx, e->bytes_rx, e->msgs_tx, e->msgs_rx);
    e->calls = e->msgs_tx = e->msgs_rx = 0;
    e->bytes_tx = e->bytes_rx = 0;
}

static void io_cache_drop(struct io_cache_entry e)
{
    if (!e.s)
        return;
    /* A child after fork leaves its parent's SDP side alone, as isock_destroy does: its RNIC state is the
     * parent's, and so are the counts gathered before the fork. */
    if (e.pid == rs_self_pid()) {
        if (e.calls)
            io_cache_flush_stats(&e);
        rs_sdp_release(e.sdp);
    }
    rs_isock_put(e.s);
}

static void io_cache_thread_exit(void *unused)
{
    (void)unused;
    io_cache_mark(1);
    struct io_cache_entry old[IO_CACHE_WAYS];
    memcpy(old, io_cache.way, sizeof(old));
    memset(io_cache.way, 0, sizeof(io_cache.way));
    io_cache.registered = false;
    io_cache_mark(0);
    for (unsigned i = 0; i < IO_CACHE_WAYS; i++)
        io_cache_drop(old[i]);
}

void rs_io_cache_forget(const struct rs_isock *s)
{
    if (io_cache.busy)
        return;                 /* a close in a signal handler, over a cached call: the entry stays as it is */
    for (unsigned i = 0; i < IO_CACHE_WAYS; i++) {
        if (io_cache.way[i].s != s)
            continue;
        io_cache_mark(1);
        struct io_cache_entry old = io_cache.way[i];
        io_cache.way[i] = (struct io_cache_entry){ 0 };
        io_cache_mark(0);
        io_cache_drop(old);
    }
}

static void io_cache_key_create(void) { io_cache_key_ok = pthread_key_create(&io_cache_key, io_cache_thread_exit) == 0; }

/* The way fd's entry lives in. */
static RS_ALWAYS_INLINE struct io_cache_entry *io_cache_way(int fd) { return &io_cache.way[(unsigned)fd % IO_CACHE_WAYS]; }

/* The cached entry of fd is still its connection (cache marked busy by the caller). */
static inline __attribute__((always_inline)) bool io_cache_valid(int fd, const struct io_cache_entry *e,
                                                                 const struct rs_isock *s)
{
    /* The entry's own fd is tested with the slot it kept; another fd of the same remainder (a dup of the socket
     * names it too) is looked up. */
    const uintptr_t *slot = RS_LIKELY(e->fd == fd) ? e->slot : rs_fd_slot(fd);
    return e->s == s && slot && rs_fd_slot_peek(slot) == &s->obj &&
           __atomic_load_n(&s->sdp, __ATOMIC_ACQUIRE) == e->sdp &&
           rs_isock_path_now((struct rs_isock *)s) == RS_IPATH_SDP && s->owner == rs_self_pid() &&
           !__atomic_load_n(&s->connecting, __ATOMIC_ACQUIRE);
}

/* fd's cache entry, still its connection, with the cache marked busy (io_cache_mark(0) ends the use); or NULL. */
static inline __attribute__((always_inline)) struct io_cache_entry *io_cache_take(int fd)
{
    struct io_cache_entry *e = io_cache_way(fd);
    if (!e->s || io_cache.busy)
        return NULL;
    io_cache_mark(1);
    /* Read once busy: a handler that ran before could have changed the entry, none can now. */
    struct rs_isock *s = e->s;
    if (s && io_cache_valid(fd, e, s))
        return e;
    io_cache_mark(0);
    return NULL;
}

/* The cached connection of fd, when it still is what fd names and this process's SDP connection. */
static inline __attribute__((always_inline)) bool target_cached(int fd, struct io_target *t)
{
    const struct io_cache_entry *e = io_cache_take(fd);
    if (!e)
        return false;
    *t = (struct io_target){ .s = e->s, .sdp = e->sdp, .cached = true, .fd = fd };
    return true;
}

/* After a call that found fd's connection the locked way (before it ends its in-flight count): the call's
 * reference on the socket moves into the cache (true), with a new one on its SDP side; the entry it replaces lets
 * go of its own. */
static bool io_cache_fill(struct io_target *t)
{
    const uintptr_t *slot = rs_fd_slot(t->fd);
    if (io_cache.busy || !slot)
        return false;
    if (!io_cache.registered) {
        pthread_once(&io_cache_once, io_cache_key_create);
        if (!io_cache_key_ok || pthread_setspecific(io_cache_key, &io_cache) != 0)
            return false;
        io_cache.registered = true;
    }
    io_cache_mark(1);
    struct io_cache_entry *e = io_cache_way(t->fd);
    struct io_cache_entry old = *e;
    rs_sdp_hold(t->sdp);
    *e = (struct io_cache_entry){ .s = t->s, .sdp = t->sdp, .slot = slot, .fd = t->fd, .pid = rs_self_pid() };
    io_cache_mark(0);
    io_cache_drop(old);
    return true;
}

/* Fills t for fd, a converted socket; false when fd is not one (t->s NULL, nothing held). */
static bool target_of(int fd, struct io_target *t)
{
    if (target_cached(fd, t))
        return true;
    /* Most fds are not ours (a verbs device takes a write(2) per doorbell): the lookup comes first, and one that
     * finds nothing answers at once. */
    t->cached = false;
    t->fd = fd;
    t->s = rs_isock_get(fd);
    if (!t->s)
        return false;
    t->sdp = NULL;
    t->dg = NULL;
    t->inherited = false;
    t->io_user = false;
    t->error = 0;
    rs_isock_settle_connect(t->s, fd);
    switch (rs_isock_path_now(t->s)) {
    case RS_IPATH_DGRAM:
        t->dg = t->s->dg;
        break;
    case RS_IPATH_SDP:
        if (rs_isock_io_begin(t->s, &t->sdp)) {
            t->io_user = true;          /* the connection of this process: no lock, no reference of our own */
            break;
        }
        rs_lock(&t->s->lock);
        if (t->s->sdp && t->s->owner == rs_self_pid() && t->s->path == RS_IPATH_SDP) {
            t->sdp = t->s->sdp;
            rs_sdp_hold(t->sdp);
        } else if (t->s->path == RS_IPATH_SDP) {
            t->inherited = true;
        }
        rs_unlock(&t->s->lock);
        if (t->inherited) {
            /* The parent's connection: claim it (it continues on kernel TCP, which the caller then uses). */
            int r = rs_isock_follow(t->s);
            if (r == 0 && rs_isock_path_now(t->s) != RS_IPATH_SDP)
                t->inherited = false;
            else
                t->error = r < 0 ? r : -EBADF;
        }
        break;
    default:
        break;
    }
    return true;
}

static void target_done(struct io_target *t)
{
    if (t->cached) {
        io_cache_mark(0);
        return;
    }
    if (t->io_user) {
        /* The cache takes its reference on the SDP side while the in-flight count still keeps that alive. */
        bool kept = io_cache_fill(t);
        rs_isock_io_end(t->s);
        if (kept)
            return;
    } else if (t->sdp) {
        rs_sdp_release(t->sdp);
    }
    if (t->s)
        rs_isock_put(t->s);
}

/*
 * The whole of a small send or receive on a connection in the thread's cache, when the SDP short path takes it
 * (sdp_fast.c): no io_target, no call but the SDP layer's. A busy poller's miss costs what this path costs, and
 * under TCG the instructions of a miss delay the round trip as much as those of a hit (docs/results/sdp-verbs.md).
 * True with *r set (bytes, or -EAGAIN); false: the general way does the call, from the start.
 */
static inline __attribute__((always_inline)) bool io_short(int fd, void *buf, size_t len, int flags, bool sending,
                                                           ssize_t *r)
{
    if (len == 0 || len > (sending ? RS_SDP_SHORT_SEND_MAX : RS_SDP_SHORT_RECV_MAX))
        return false;
    struct io_cache_entry *e = io_cache_take(fd);
    if (!e)
        return false;
    bool done = sending ? rs_sdp_send_fast(e->sdp, buf, len, flags, r) : rs_sdp_recv_fast(e->sdp, buf, len, flags, r);
    if (done && *r > 0) {
        if (sending) {
            e->msgs_tx++;
            e->bytes_tx += (size_t)*r;
        } else {
            e->msgs_rx++;
            e->bytes_rx += (size_t)*r;
        }
        if (++e->calls >= IO_STATS_BATCH)
            io_cache_flush_stats(e);
    }
    io_cache_mark(0);
    return done;
}

static bool target_is_rdma(const struct io_target *t) { return t->sdp || t->dg || t->inherited; }

/*
 * A blocking datagram call is a thread-cancellation point, as in the kernel (the datagram layer's wait acts on
 * pthread_cancel, see rs_dg_wait): a thread cancelled there lets go of its target on the way out.
 */
static void target_cancelled(void *t) { target_done(t); }

static ssize_t dg_recvmsg(struct io_target *t, struct msghdr *msg, int flags)
{
    ssize_t r;
    pthread_cleanup_push(target_cancelled, t);
    r = rs_dgram_recvmsg(t->dg, msg, flags);
    pthread_cleanup_pop(0);
    return r;
}

static ssize_t dg_recvfrom(struct io_target *t, void *buf, size_t len, int flags, struct sockaddr *from,
                           socklen_t *fromlen)
{
    ssize_t r;
    pthread_cleanup_push(target_cancelled, t);
    r = rs_dgram_recvfrom(t->dg, buf, len, flags, from, fromlen);
    pthread_cleanup_pop(0);
    return r;
}

static ssize_t dg_sendmsg(struct io_target *t, const struct msghdr *msg, int flags)
{
    ssize_t r;
    pthread_cleanup_push(target_cancelled, t);
    r = rs_dgram_sendmsg(t->dg, msg, flags);
    pthread_cleanup_pop(0);
    return r;
}

static ssize_t dg_sendto(struct io_target *t, const void *buf, size_t len, int flags, const struct sockaddr *to,
                         socklen_t tolen)
{
    ssize_t r;
    pthread_cleanup_push(target_cancelled, t);
    r = rs_dgram_sendto(t->dg, buf, len, flags, to, tolen);
    pthread_cleanup_pop(0);
    return r;
}

/*
 * After a blocking SDP call returned EINTR (nothing moved): would the kernel have restarted it? Yes when every
 * handler that ran had SA_RESTART and the socket has no timeout for that direction (Linux returns EINTR for a
 * socket with SO_RCVTIMEO / SO_SNDTIMEO even under SA_RESTART).
 */
static bool restart_after_eintr(struct io_target *t, const struct rs_signal_mark *mark, int timeo_opt)
{
    if (!rs_signal_restart_allowed(mark))
        return false;
    struct timeval tv = { 0, 0 };
    socklen_t len = sizeof(tv);
    if (rs_sdp_getsockopt(t->sdp, SOL_SOCKET, timeo_opt, &tv, &len) == 0 && (tv.tv_sec || tv.tv_usec))
        return false;
    return true;
}

/* The SDP side answered -EREMCHG (handed back): switch the socket over. -EREMCHG tells the interposer to repeat the
 * call, which now reaches the kernel socket; a failed switch is the call's -ECONNRESET. */
static ssize_t handed_back(struct io_target *t)
{
    int r = rs_isock_adopt(t->s);
    return r == 0 ? -EREMCHG : r;
}

/* One byte-stream transfer on an SDP connection, restarted after EINTR where the kernel would restart it. */
static ssize_t sdp_io(struct io_target *t, const struct iovec *iov, int iovcnt, int flags, bool sending)
{
    if (t->inherited)
        return t->error;
    ssize_t r;
    size_t len = iovcnt == 1 ? iov[0].iov_len : 0;
    if (len && (sending ? len <= RS_SDP_SHORT_SEND_MAX && rs_sdp_send_fast(t->sdp, iov[0].iov_base, len, flags, &r)
                        : len <= RS_SDP_SHORT_RECV_MAX && rs_sdp_recv_fast(t->sdp, iov[0].iov_base, len, flags, &r))) {
        if (r > 0)
            rs_isock_set_stats_io(t->s, (size_t)r, sending);
        return r;
    }
    struct rs_signal_mark mark;
    do {
        rs_signal_mark(&mark);
        r = sending ? rs_sdp_sendmsg(t->sdp, iov, iovcnt, flags) : rs_sdp_recvmsg(t->sdp, iov, iovcnt, flags);
    } while (r == -EINTR && restart_after_eintr(t, &mark, sending ? SO_SNDTIMEO : SO_RCVTIMEO));
    if (r == -EREMCHG)
        return handed_back(t);
    if (r > 0)
        rs_isock_set_stats_io(t->s, (size_t)r, sending);
    return r;
}

static ssize_t sdp_recv(struct io_target *t, const struct iovec *iov, int iovcnt, int flags)
{
    return sdp_io(t, iov, iovcnt, flags, false);
}

static ssize_t sdp_send(struct io_target *t, const struct iovec *iov, int iovcnt, int flags)
{
    return sdp_io(t, iov, iovcnt, flags, true);
}

/* Fills msg's control buffer with one IP_RECVERR / IPV6_RECVERR message carrying ee (MSG_ZEROCOPY completions). */
static ssize_t deliver_errqueue(struct io_target *t, struct msghdr *msg)
{
    struct sock_extended_err ee;
    int r = rs_sdp_recv_errqueue(t->sdp, &ee);
    if (r == -EREMCHG)
        return handed_back(t);
    if (r < 0)
        return r;
    msg->msg_flags = MSG_ERRQUEUE;
    if (msg->msg_namelen)
        msg->msg_namelen = 0;
    size_t need = CMSG_SPACE(sizeof(ee));
    if (!msg->msg_control || msg->msg_controllen < need) {
        msg->msg_flags |= MSG_CTRUNC;
        msg->msg_controllen = 0;
        return 0;
    }
    struct cmsghdr *c = (struct cmsghdr *)msg->msg_control;
    c->cmsg_level = t->s->family == AF_INET6 ? SOL_IPV6 : SOL_IP;
    c->cmsg_type = t->s->family == AF_INET6 ? IPV6_RECVERR : IP_RECVERR;
    c->cmsg_len = CMSG_LEN(sizeof(ee));
    memcpy(CMSG_DATA(c), &ee, sizeof(ee));
    msg->msg_controllen = need;
    return 0;
}

/*
 * Each interposer below: rdma_target() finds out whether fd is a converted socket of this process (an SDP
 * connection, an adopted UDP socket, or an SDP connection inherited across fork); if not, the real function runs
 * with the caller's arguments; if so, one of the rdma_* helpers does the work and target_done() lets go.
 */
static inline __attribute__((always_inline)) bool rdma_target(int fd, struct io_target *t)
{
    if (!target_of(fd, t))
        return false;
    if (target_is_rdma(t))
        return true;
    target_done(t);
    return false;
}

/*
 * The body of each interposer: while fd is a converted socket of this process, the rdma_* helper does the call.
 * -EREMCHG from it means the connection was just handed back to kernel TCP and the socket switched over: the call
 * is made again, and now reaches the kernel as on any kernel socket (no -EREMCHG ever reaches the application).
 */
#define IO_CALL(fd, t, real_call, rdma_call)            \
    do {                                                \
        ssize_t r_;                                     \
        do {                                            \
            if (!rdma_target((fd), &(t)))               \
                return real_call;                       \
            r_ = (rdma_call);                           \
            target_done(&(t));                          \
        } while (r_ == -EREMCHG);                       \
        return rs_ret(r_);                              \
    } while (0)

/* ---- receive ---- */

static ssize_t rdma_recvmsg(struct io_target *t, int fd, struct msghdr *msg, int flags)
{
    if (t->dg)
        return flags & MSG_ERRQUEUE ? (RS_REAL(recvmsg)(fd, msg, flags) < 0 ? -errno : 0)
                                    : dg_recvmsg(t, msg, flags);
    if (flags & MSG_ERRQUEUE)
        return t->sdp ? deliver_errqueue(t, msg) : t->error;
    ssize_t r = sdp_recv(t, msg->msg_iov, (int)msg->msg_iovlen, flags);
    if (r >= 0) {
        msg->msg_namelen = 0;
        msg->msg_controllen = 0;
        msg->msg_flags = 0;
    }
    return r;
}

/* recv, recvfrom and read on a converted socket (read is recv without flags, for sockets). */
static ssize_t rdma_recv(struct io_target *t, void *buf, size_t len, int flags, struct sockaddr *from,
                         socklen_t *fromlen)
{
    if (t->dg)
        return dg_recvfrom(t, buf, len, flags, from, fromlen);
    struct iovec iov = { buf, len };
    ssize_t r = sdp_recv(t, &iov, 1, flags);
    if (r >= 0 && from && fromlen)
        *fromlen = 0;       /* as Linux TCP: no address with stream data */
    return r;
}

static ssize_t rdma_readv(struct io_target *t, const struct iovec *iov, int iovcnt)
{
    if (t->dg) {
        struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
        return dg_recvmsg(t, &m, 0);
    }
    return sdp_recv(t, iov, iovcnt, 0);
}

RS_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    struct io_target t;
    IO_CALL(fd, t, RS_REAL(recvmsg)(fd, msg, flags), rdma_recvmsg(&t, fd, msg, flags));
}

RS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from, socklen_t *fromlen)
{
    struct io_target t;
    IO_CALL(fd, t, RS_REAL(recvfrom)(fd, buf, len, flags, from, fromlen),
            rdma_recv(&t, buf, len, flags, from, fromlen));
}

/* The general way of recv, read, send and write, out of line: their short path then saves and restores no more
 * registers than it needs (a busy poller's every miss runs that prologue). */
static RS_NOINLINE ssize_t recv_general(int fd, void *buf, size_t len, int flags)
{
    struct io_target t;
    IO_CALL(fd, t, RS_REAL(recv)(fd, buf, len, flags), rdma_recv(&t, buf, len, flags, NULL, NULL));
}

RS_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    ssize_t r;
    if (io_short(fd, buf, len, flags, false, &r))
        return rs_ret(r);
    return recv_general(fd, buf, len, flags);
}

static RS_NOINLINE ssize_t read_general(int fd, void *buf, size_t len)
{
    struct io_target t;
    if (!rs_fd_any(RS_FD_SOCK))
        return RS_REAL(read)(fd, buf, len);
    IO_CALL(fd, t, RS_REAL(read)(fd, buf, len), rdma_recv(&t, buf, len, 0, NULL, NULL));
}

RS_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
    ssize_t r;
    if (io_short(fd, buf, len, 0, false, &r))
        return rs_ret(r);
    return read_general(fd, buf, len);
}

RS_EXPORT ssize_t readv(int fd, const struct iovec *iov, int iovcnt)
{
    struct io_target t;
    if (!rs_fd_any(RS_FD_SOCK))
        return RS_REAL(readv)(fd, iov, iovcnt);
    IO_CALL(fd, t, RS_REAL(readv)(fd, iov, iovcnt), rdma_readv(&t, iov, iovcnt));
}

RS_EXPORT int recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags, struct timespec *timeout)
{
    struct io_target t;
    unsigned i;
    ssize_t r;
    do {
        if (!rdma_target(fd, &t))
            return RS_REAL(recvmmsg)(fd, vec, vlen, flags, timeout);
        /* One recvmsg per entry: after the first, MSG_WAITFORONE makes the rest nonblocking, as in the kernel. */
        r = 0;
        for (i = 0; i < vlen; i++) {
            int f = flags & ~MSG_WAITFORONE;
            if (i > 0 && (flags & MSG_WAITFORONE))
                f |= MSG_DONTWAIT;
            r = rdma_recvmsg(&t, fd, &vec[i].msg_hdr, f);
            if (r < 0)
                break;
            vec[i].msg_len = (unsigned)r;
            if (r == 0 && !t.dg) {
                i++;            /* end of stream */
                break;
            }
        }
        target_done(&t);
    } while (i == 0 && r == -EREMCHG);
    if (i == 0 && r < 0)
        return (int)rs_ret(r);
    return (int)i;
}

/* ---- send ---- */

static ssize_t rdma_sendmsg(struct io_target *t, const struct msghdr *msg, int flags)
{
    if (t->dg)
        return dg_sendmsg(t, msg, flags);
    return sdp_send(t, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

/* send, sendto and write on a converted socket. Linux TCP ignores the address on a connected socket. */
static ssize_t rdma_send(struct io_target *t, const void *buf, size_t len, int flags, const struct sockaddr *to,
                         socklen_t tolen)
{
    if (t->dg)
        return dg_sendto(t, buf, len, flags, to, tolen);
    struct iovec iov = { (void *)buf, len };
    return sdp_send(t, &iov, 1, flags);
}

RS_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    struct io_target t;
    IO_CALL(fd, t, RS_REAL(sendmsg)(fd, msg, flags), rdma_sendmsg(&t, msg, flags));
}

RS_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to, socklen_t tolen)
{
    struct io_target t;
    IO_CALL(fd, t, RS_REAL(sendto)(fd, buf, len, flags, to, tolen), rdma_send(&t, buf, len, flags, to, tolen));
}

static RS_NOINLINE ssize_t send_general(int fd, const void *buf, size_t len, int flags)
{
    struct io_target t;
    IO_CALL(fd, t, RS_REAL(send)(fd, buf, len, flags), rdma_send(&t, buf, len, flags, NULL, 0));
}

RS_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    ssize_t r;
    if (io_short(fd, (void *)buf, len, flags, true, &r))
        return rs_ret(r);
    return send_general(fd, buf, len, flags);
}

static RS_NOINLINE ssize_t write_general(int fd, const void *buf, size_t len)
{
    struct io_target t;
    IO_CALL(fd, t, RS_REAL(write)(fd, buf, len), rdma_send(&t, buf, len, 0, NULL, 0));
}

/* A write that may be to a socket of ours: the short path, then the general one. */
static RS_NOINLINE ssize_t write_ours(int fd, const void *buf, size_t len)
{
    ssize_t r;
    if (io_cache_way(fd)->fd == fd && io_short(fd, (void *)buf, len, 0, true, &r))
        return rs_ret(r);
    return write_general(fd, buf, len);
}

RS_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
    /* Most writes are not to sockets of ours: a verbs provider's doorbell, on every send, is one. They are told
     * apart first, by the cache way and the table's cheap test, in a function with no frame of its own, so that
     * they go on to libc at once (a jump, not a call). */
    if (io_cache_way(fd)->fd != fd && !rs_fd_maybe(fd, RS_FD_SOCK))
        return RS_REAL(write)(fd, buf, len);
    return write_ours(fd, buf, len);
}

RS_EXPORT ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
    struct io_target t;
    if (!rs_fd_any(RS_FD_SOCK))
        return RS_REAL(writev)(fd, iov, iovcnt);
    struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
    IO_CALL(fd, t, RS_REAL(writev)(fd, iov, iovcnt), rdma_sendmsg(&t, &m, 0));
}

RS_EXPORT int sendmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags)
{
    struct io_target t;
    unsigned i;
    ssize_t r;
    do {
        if (!rdma_target(fd, &t))
            return RS_REAL(sendmmsg)(fd, vec, vlen, flags);
        r = 0;
        for (i = 0; i < vlen; i++) {
            r = rdma_sendmsg(&t, &vec[i].msg_hdr, flags);
            if (r < 0)
                break;
            vec[i].msg_len = (unsigned)r;
        }
        target_done(&t);
    } while (i == 0 && r == -EREMCHG);
    if (i == 0 && r < 0)
        return (int)rs_ret(r);
    return (int)i;
}

/*
 * sendfile to an SDP connection: the file is read in chunks and sent (there is no page cache to lend to an RDMA
 * QP here). The offset rules are sendfile's: with offset, *offset advances and the file position does not; without,
 * the file position advances by exactly the bytes sent.
 */
static ssize_t sendfile_sdp(struct io_target *t, int in_fd, off64_t *offset, size_t count)
{
    off64_t pos = offset ? *offset : lseek64(in_fd, 0, SEEK_CUR);
    if (pos < 0)
        return -errno;
    size_t chunk = count < 256 * 1024 ? count : 256 * 1024;
    char *buf = chunk ? malloc(chunk) : NULL;
    if (chunk && !buf)
        return -ENOMEM;
    size_t sent = 0;
    ssize_t err = 0;
    while (sent < count) {
        size_t want = count - sent < chunk ? count - sent : chunk;
        ssize_t got = pread64(in_fd, buf, want, pos + (off64_t)sent);
        if (got < 0) {
            err = -errno;
            break;
        }
        if (got == 0)
            break;
        struct iovec iov = { buf, (size_t)got };
        ssize_t w = sdp_send(t, &iov, 1, sent ? MSG_DONTWAIT : 0);
        if (w < 0) {
            err = w;
            break;
        }
        sent += (size_t)w;
        if ((size_t)w < (size_t)got)
            break;
    }
    free(buf);
    if (offset)
        *offset = pos + (off64_t)sent;
    else
        lseek64(in_fd, pos + (off64_t)sent, SEEK_SET);
    if (sent > 0)
        return (ssize_t)sent;
    return err;
}

RS_EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t *offset, size_t count)
{
    struct io_target t;
    /* A converted UDP socket: datagram-iWARP has no file path (docs/interception.md). */
    IO_CALL(out_fd, t, RS_REAL(sendfile64)(out_fd, in_fd, offset, count),
            t.dg ? -EINVAL : t.inherited ? t.error : sendfile_sdp(&t, in_fd, offset, count));
}

RS_EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t *offset, size_t count)
{
    if (!offset)
        return sendfile64(out_fd, in_fd, NULL, count);
    off64_t o = *offset;
    ssize_t r = sendfile64(out_fd, in_fd, &o, count);
    if (r >= 0)
        *offset = (off_t)o;
    return r;
}

/* ---- glibc's fortified variants (_FORTIFY_SOURCE) ---- */

extern void __chk_fail(void) __attribute__((noreturn));
ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen);
ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags);
ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *from,
                       socklen_t *fromlen);

RS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
    if (len > buflen)
        __chk_fail();
    return read(fd, buf, len);
}

RS_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
    if (len > buflen)
        __chk_fail();
    return recv(fd, buf, len, flags);
}

RS_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *from,
                                 socklen_t *fromlen)
{
    if (len > buflen)
        __chk_fail();
    return recvfrom(fd, buf, len, flags, from, fromlen);
}
