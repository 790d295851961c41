/*
 * sys.h: the kernel socket calls rdmasock-perf makes, as raw system calls.
 *
 * rdmasock-perf is linked against librdmasock.a, which will carry the socket interposers (src/intercept). A static
 * link pulls an archive member in for any symbol still undefined, so a plain call to socket() or send() here could
 * end up in an interposer instead of libc, and the "plain kernel TCP/UDP" baseline and the control channel would
 * silently go through rdmasock. The soft RNIC avoids this the same way (rs_soft_sys_*); using the same raw calls for
 * the baseline also means both sides of every ratio pay the same per-call cost.
 *
 * Each wrapper returns the result or -errno (never sets errno for the caller to look at).
 */
#ifndef RS_PERF_SYS_H
#define RS_PERF_SYS_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline long perf_sys_ret(long r) { return r < 0 ? -errno : r; }

static inline int perf_sys_socket(int domain, int type, int protocol)
{
    return (int)perf_sys_ret(syscall(SYS_socket, domain, type, protocol));
}
static inline int perf_sys_close(int fd) { return (int)perf_sys_ret(syscall(SYS_close, fd)); }
static inline int perf_sys_bind(int fd, const struct sockaddr *a, socklen_t len)
{
    return (int)perf_sys_ret(syscall(SYS_bind, fd, a, len));
}
static inline int perf_sys_listen(int fd, int backlog) { return (int)perf_sys_ret(syscall(SYS_listen, fd, backlog)); }
static inline int perf_sys_accept(int fd, struct sockaddr *a, socklen_t *len)
{
    return (int)perf_sys_ret(syscall(SYS_accept4, fd, a, len, SOCK_CLOEXEC));
}
static inline int perf_sys_connect(int fd, const struct sockaddr *a, socklen_t len)
{
    return (int)perf_sys_ret(syscall(SYS_connect, fd, a, len));
}
static inline int perf_sys_setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    return (int)perf_sys_ret(syscall(SYS_setsockopt, fd, level, name, val, len));
}
static inline int perf_sys_getsockname(int fd, struct sockaddr *a, socklen_t *len)
{
    return (int)perf_sys_ret(syscall(SYS_getsockname, fd, a, len));
}
static inline int perf_sys_getpeername(int fd, struct sockaddr *a, socklen_t *len)
{
    return (int)perf_sys_ret(syscall(SYS_getpeername, fd, a, len));
}
static inline ssize_t perf_sys_send(int fd, const void *buf, size_t len, int flags)
{
    return perf_sys_ret(syscall(SYS_sendto, fd, buf, len, flags | MSG_NOSIGNAL, NULL, 0));
}
static inline ssize_t perf_sys_sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *a,
                                      socklen_t alen)
{
    return perf_sys_ret(syscall(SYS_sendto, fd, buf, len, flags | MSG_NOSIGNAL, a, alen));
}
static inline ssize_t perf_sys_recv(int fd, void *buf, size_t len, int flags)
{
    return perf_sys_ret(syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL));
}
static inline ssize_t perf_sys_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *a,
                                        socklen_t *alen)
{
    return perf_sys_ret(syscall(SYS_recvfrom, fd, buf, len, flags, a, alen));
}
/* poll(2) through ppoll, which every Linux architecture has; timeout_ms < 0 waits for ever. */
static inline int perf_sys_poll(struct pollfd *fds, nfds_t n, int timeout_ms)
{
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
    return (int)perf_sys_ret(syscall(SYS_ppoll, fds, n, timeout_ms < 0 ? NULL : &ts, NULL, (size_t)_NSIG / 8));
}

#endif /* RS_PERF_SYS_H */
