/*
 * sock_calls.c: the interposed socket control calls: socket, bind, listen, accept, connect, shutdown, close,
 * dup*, fcntl, ioctl, socket options and names. Each one finds the fd's isock (one table load when the fd is not
 * intercepted) and either hands the call to the kernel unchanged or drives the isock (isock.c). Errors are the
 * kernel's errno values; docs/interception.md lists every difference.
 */
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"
#include "common/thread.h"
#include "intercept/isock_int.h"
#include "intercept/libc.h"

static int fail(int err)
{
    errno = err;
    return -1;
}

/* An fd the application must not touch: rdmasock's own (log file, notification fds, private dups). */
static bool is_ours(int fd)
{
    return rs_fd_is_internal(fd) || rs_log_owns_fd(fd);
}

RS_EXPORT int socket(int domain, int type, int protocol)
{
    int fd = RS_REAL(socket)(domain, type, protocol);
    if (fd >= 0 && (domain == AF_INET || domain == AF_INET6) && !rs_libc_resolving())
        (void)rs_isock_create(fd, domain, type, protocol);
    return fd;
}

RS_EXPORT int socketpair(int domain, int type, int protocol, int sv[2])
{
    /* AF_UNIX pairs never leave the host: always the kernel's. */
    return RS_REAL(socketpair)(domain, type, protocol, sv);
}

RS_EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(bind)(fd, addr, len);
    long r;
    if (rs_isock_path_now(s) == RS_IPATH_DGRAM)
        r = rs_ret(rs_dgram_bind(s->dg, addr, len));
    else
        r = RS_REAL(bind)(fd, addr, len);
    rs_isock_put(s);
    return (int)r;
}

RS_EXPORT int listen(int fd, int backlog)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(listen)(fd, backlog);
    int r = s->type == SOCK_STREAM ? rs_isock_listen(s, fd, backlog) : (RS_REAL(listen)(fd, backlog) ? -errno : 0);
    if (r == 0)
        rs_isock_untrack_if_kernel(s, fd);
    rs_isock_put(s);
    return (int)rs_ret(r);
}

RS_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(accept4)(fd, addr, len, flags);
    int r = rs_isock_accept(s, fd, addr, len, flags);
    rs_isock_put(s);
    return (int)rs_ret(r);
}

RS_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    return accept4(fd, addr, len, 0);
}

RS_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(connect)(fd, addr, len);
    int r;
    if (rs_isock_path_now(s) == RS_IPATH_DGRAM)
        r = rs_dgram_connect(s->dg, addr, len);
    else if (s->type == SOCK_STREAM) {
        r = rs_isock_connect(s, fd, addr, len);
        rs_isock_untrack_if_kernel(s, fd);
    }
    else
        r = RS_REAL(connect)(fd, addr, len) ? -errno : 0;
    rs_isock_put(s);
    return (int)rs_ret(r);
}

/* The SDP side of s with a reference, or NULL when the socket is not on an SDP path in this process. */
static struct rs_sdp_sock *sdp_of(struct rs_isock *s)
{
    rs_lock(&s->lock);
    struct rs_sdp_sock *sdp = NULL;
    if (s->sdp && s->owner == rs_self_pid() && (s->path == RS_IPATH_SDP || s->path == RS_IPATH_LISTEN)) {
        sdp = s->sdp;
        rs_sdp_hold(sdp);
    }
    rs_unlock(&s->lock);
    return sdp;
}

/*
 * Before a control call uses s: an SDP connection inherited across fork is claimed (it continues on kernel TCP).
 * Returns 0, or the error the call must answer when the connection cannot be used here.
 */
static int follow(struct rs_isock *s)
{
    return rs_isock_path_now(s) == RS_IPATH_SDP ? rs_isock_follow(s) : 0;
}

/* An SDP call answered -EREMCHG: the connection was handed back; switch the socket over. true: repeat the call
 * (it now reaches the kernel socket); false: *r holds the call's error. */
static bool repeat_after(struct rs_isock *s, int *r)
{
    if (*r != -EREMCHG)
        return false;
    *r = rs_isock_adopt(s);
    return *r == 0;
}

RS_EXPORT int shutdown(int fd, int how)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(shutdown)(fd, how);
    int r;
    do {
        rs_isock_settle_connect(s, fd);
        int claim = follow(s);
        enum rs_isock_path path = rs_isock_path_now(s);
        struct rs_sdp_sock *sdp = path == RS_IPATH_SDP ? sdp_of(s) : NULL;
        if (sdp) {
            r = rs_sdp_shutdown(sdp, how);
            rs_sdp_release(sdp);
        } else if (claim < 0) {
            r = claim;          /* inherited across fork and not usable here (docs/interception.md) */
        } else if (path == RS_IPATH_SDP) {
            r = -EBADF;
        } else {
            r = RS_REAL(shutdown)(fd, how) ? -errno : 0;
        }
    } while (repeat_after(s, &r));
    rs_isock_put(s);
    return (int)rs_ret(r);
}

/* Forgets fd's entry; when it was the socket's last name, the RDMA side closes as the kernel socket would. */
static int forget_fd(int fd)
{
    struct rs_fd_obj *obj = rs_fd_clear(fd);
    if (!obj)
        return 0;
    int r = 0;
    if (obj->type == RS_FD_SOCK) {
        struct rs_isock *s = (struct rs_isock *)obj;
        if (__atomic_sub_fetch(&s->nfds, 1, __ATOMIC_ACQ_REL) == 0) {
            r = rs_isock_last_close(s);
            rs_io_cache_forget(s);
        }
    }
    rs_fd_obj_put(obj);
    return r;
}

RS_EXPORT int close(int fd)
{
    if (!rs_fd_any(RS_FD_SOCK) && !rs_fd_any(RS_FD_EPOLL) && !rs_fd_any(RS_FD_INTERNAL) && !rs_log_owns_fd(fd))
        return RS_REAL(close)(fd);
    if (is_ours(fd)) {
        RS_LOG_ONCE(RS_LOG_WARN, "close(%d) refused: the fd belongs to rdmasock", fd);
        return fail(EBADF);
    }
    (void)forget_fd(fd);
    return RS_REAL(close)(fd);
}

/* newfd now names what oldfd names: the same intercepted socket or epoll set (the kernel shares the file). */
static int dup_into(int oldfd, int newfd)
{
    struct rs_fd_obj *obj = rs_fd_get(oldfd);
    if (!obj)
        return newfd;
    int err = 0;
    if (obj->type == RS_FD_SOCK) {
        err = rs_isock_install((struct rs_isock *)obj, newfd);
    } else if (obj->type == RS_FD_EPOLL) {
        struct rs_fd_obj *old = rs_fd_set(newfd, obj, &err);
        rs_fd_obj_put(old);
    }
    rs_fd_obj_put(obj);
    if (err) {
        RS_REAL(close)(newfd);
        return fail(-err);
    }
    return newfd;
}

static bool any_shared_objects(void) { return rs_fd_any(RS_FD_SOCK) || rs_fd_any(RS_FD_EPOLL); }

RS_EXPORT int dup(int oldfd)
{
    int fd = RS_REAL(dup)(oldfd);
    if (fd < 0 || !any_shared_objects())
        return fd;
    return dup_into(oldfd, fd);
}

RS_EXPORT int dup3(int oldfd, int newfd, int flags)
{
    if (rs_fd_any(RS_FD_INTERNAL) || rs_log_owns_fd(newfd)) {
        if (is_ours(newfd) && oldfd != newfd) {
            RS_LOG_ONCE(RS_LOG_WARN, "dup2/dup3 onto fd %d refused: the fd belongs to rdmasock", newfd);
            return fail(EBADF);
        }
    }
    int fd = RS_REAL(dup3)(oldfd, newfd, flags);
    if (fd < 0 || !any_shared_objects())
        return fd;
    (void)forget_fd(newfd);         /* the kernel closed what newfd named */
    return dup_into(oldfd, fd);
}

RS_EXPORT int dup2(int oldfd, int newfd)
{
    if (oldfd == newfd)
        return RS_REAL(dup2)(oldfd, newfd);
    if (is_ours(newfd)) {
        RS_LOG_ONCE(RS_LOG_WARN, "dup2 onto fd %d refused: the fd belongs to rdmasock", newfd);
        return fail(EBADF);
    }
    int fd = RS_REAL(dup2)(oldfd, newfd);
    if (fd < 0 || !any_shared_objects())
        return fd;
    (void)forget_fd(newfd);
    return dup_into(oldfd, fd);
}

static void set_nonblock(struct rs_isock *s, bool on)
{
    rs_lock(&s->lock);
    if (s->sdp && s->owner == rs_self_pid() && s->path == RS_IPATH_SDP)
        rs_sdp_set_nonblock(s->sdp, on);
    if (s->dg)
        rs_dgram_set_nonblock(s->dg, on);
    rs_unlock(&s->lock);
}

static int fcntl_common(int (*real)(int, int, ...), int fd, int cmd, long arg)
{
    switch (cmd) {
    case F_DUPFD:
    case F_DUPFD_CLOEXEC: {
        int nfd = real(fd, cmd, arg);
        if (nfd < 0 || !any_shared_objects())
            return nfd;
        return dup_into(fd, nfd);
    }
    case F_SETFL: {
        int r = real(fd, cmd, arg);
        if (r == 0 && rs_fd_any(RS_FD_SOCK)) {
            struct rs_isock *s = rs_isock_get(fd);
            if (s) {
                set_nonblock(s, (arg & O_NONBLOCK) != 0);
                rs_isock_put(s);
            }
        }
        return r;
    }
    default:
        return real(fd, cmd, arg);
    }
}

RS_EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return fcntl_common(RS_REAL(fcntl), fd, cmd, arg);
}

RS_EXPORT int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return fcntl_common(RS_REAL(fcntl64) ? RS_REAL(fcntl64) : RS_REAL(fcntl), fd, cmd, arg);
}

RS_EXPORT int ioctl(int fd, unsigned long req, ...)
{
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(ioctl)(fd, req, arg);
    int r;
again:
    (void)follow(s);
    enum rs_isock_path path = rs_isock_path_now(s);
    struct rs_sdp_sock *sdp = path == RS_IPATH_SDP ? sdp_of(s) : NULL;
    if (req == FIONBIO) {
        r = RS_REAL(ioctl)(fd, req, arg);
        if (r == 0 && arg)
            set_nonblock(s, *(int *)arg != 0);
    } else if ((req == FIONREAD || req == SIOCOUTQ) && (sdp || path == RS_IPATH_DGRAM)) {
        int v = sdp ? (req == FIONREAD ? rs_sdp_inq(sdp) : rs_sdp_outq(sdp))
                    : (req == FIONREAD ? rs_dgram_inq(s->dg) : 0);
        if (sdp && repeat_after(s, &v)) {
            rs_sdp_release(sdp);
            goto again;
        }
        if (v < 0) {
            r = fail(-v);
        } else if (!arg) {
            r = fail(EFAULT);
        } else {
            *(int *)arg = v;
            r = 0;
        }
        if (path == RS_IPATH_DGRAM && req == SIOCOUTQ)
            r = RS_REAL(ioctl)(fd, req, arg);
    } else {
        r = RS_REAL(ioctl)(fd, req, arg);
    }
    if (sdp)
        rs_sdp_release(sdp);
    rs_isock_put(s);
    return r;
}

RS_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(getsockopt)(fd, level, name, val, len);
    rs_isock_settle_connect(s, fd);
    (void)follow(s);            /* a claim that failed shows as SO_ERROR, as a reset connection does */
    int r;
again:;
    enum rs_isock_path path = rs_isock_path_now(s);
    if (level == SOL_SOCKET && name == SO_ERROR && s->pending_error && val && len && *len >= sizeof(int)) {
        rs_lock(&s->lock);
        *(int *)val = s->pending_error;
        s->pending_error = 0;
        rs_unlock(&s->lock);
        *len = sizeof(int);
        r = 0;
    } else if (path == RS_IPATH_DGRAM) {
        r = rs_dgram_getsockopt(s->dg, level, name, val, len);
    } else if (path == RS_IPATH_SDP) {
        struct rs_sdp_sock *sdp = sdp_of(s);
        r = sdp ? rs_sdp_getsockopt(sdp, level, name, val, len) : -ENOPROTOOPT;
        if (sdp)
            rs_sdp_release(sdp);
        if (repeat_after(s, &r))
            goto again;
        if (r == -ENOPROTOOPT && level != RS_SOL_SDP)
            r = RS_REAL(getsockopt)(fd, level, name, val, len) ? -errno : 0;
    } else if (level == RS_SOL_SDP && path == RS_IPATH_LISTEN) {
        struct rs_sdp_sock *sdp = sdp_of(s);
        r = sdp ? rs_sdp_getsockopt(sdp, level, name, val, len) : -ENOPROTOOPT;
        if (sdp)
            rs_sdp_release(sdp);
    } else if (level == RS_SOL_SDP) {
        r = -ENOPROTOOPT;
    } else {
        r = RS_REAL(getsockopt)(fd, level, name, val, len) ? -errno : 0;
        if (r == 0 && level == SOL_SOCKET && name == SO_ACCEPTCONN && path == RS_IPATH_LISTEN && val)
            *(int *)val = 1;
    }
    rs_isock_put(s);
    return (int)rs_ret(r);
}

RS_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(setsockopt)(fd, level, name, val, len);
    (void)follow(s);
    int r;
again:;
    enum rs_isock_path path = rs_isock_path_now(s);
    if (path == RS_IPATH_DGRAM) {
        r = rs_dgram_setsockopt(s->dg, level, name, val, len);
    } else if (path == RS_IPATH_SDP || path == RS_IPATH_LISTEN) {
        struct rs_sdp_sock *sdp = sdp_of(s);
        r = sdp ? rs_sdp_setsockopt(sdp, level, name, val, len) : -ENOPROTOOPT;
        if (sdp)
            rs_sdp_release(sdp);
        if (repeat_after(s, &r))
            goto again;
        /* The kernel socket keeps what it understands too: a listener's plain TCP clients inherit it, and
         * options SDP does not model (IP_TOS, SO_PRIORITY, ...) are stored and read back as the kernel does. */
        if (level != RS_SOL_SDP) {
            int k = RS_REAL(setsockopt)(fd, level, name, val, len) ? -errno : 0;
            if (r == -ENOPROTOOPT)
                r = k;
        }
        if (path == RS_IPATH_LISTEN)
            rs_isock_save_opt(s, level, name, val, len);       /* for a listener recreated after fork */
    } else if (level == RS_SOL_SDP) {
        /* Before the socket has an SDP side: kept for when it gets one. */
        rs_isock_save_opt(s, level, name, val, len);
        r = 0;
    } else {
        r = RS_REAL(setsockopt)(fd, level, name, val, len) ? -errno : 0;
        if (r == 0 && path == RS_IPATH_UNDECIDED)
            rs_isock_save_opt(s, level, name, val, len);
    }
    /* A kernel socket that takes the connection over after a hand-back gets it too. */
    if (r == 0 && path != RS_IPATH_DGRAM)
        rs_isock_record_opt(s, level, name, val, len);
    rs_isock_put(s);
    return (int)rs_ret(r);
}

RS_EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(getsockname)(fd, addr, len);
    int r = 0;
    /* A connection handed back to kernel TCP keeps the addresses of its RDMA connection, as the kernel socket it
     * stands for would (the kernel socket that carries it now has ports of its own). */
    bool handed = rs_isock_path_now(s) == RS_IPATH_KERNEL && s->reason == RS_ISOCK_REASON_HANDED_BACK;
    if ((rs_isock_path_now(s) == RS_IPATH_SDP || handed) && s->local_len) {
        if (!addr || !len)
            r = -EFAULT;
        else
            rs_addr_copy_out(&s->local, s->local_len, addr, len);
    } else {
        r = RS_REAL(getsockname)(fd, addr, len) ? -errno : 0;
    }
    rs_isock_put(s);
    return (int)rs_ret(r);
}

RS_EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
    struct rs_isock *s = rs_isock_get(fd);
    if (!s)
        return RS_REAL(getpeername)(fd, addr, len);
    rs_isock_settle_connect(s, fd);
    int r;
    if (s->lost) {
        r = -ENOTCONN;          /* as for a kernel connection that was reset */
    } else if (rs_isock_path_now(s) == RS_IPATH_SDP || rs_isock_handed_back(s)) {
        if (__atomic_load_n(&s->connecting, __ATOMIC_ACQUIRE))
            r = -ENOTCONN;
        else if (!addr || !len)
            r = -EFAULT;
        else {
            rs_addr_copy_out(&s->dst, s->dst_len, addr, len);
            r = 0;
        }
    } else {
        r = RS_REAL(getpeername)(fd, addr, len) ? -errno : 0;
    }
    rs_isock_put(s);
    return (int)rs_ret(r);
}
