/*
 * libc.h: the real C library functions behind rdmasock's interposers.
 *
 * Every interposed symbol (socket, read, poll, epoll_wait, ...) is defined by librdmasock.so with default
 * visibility, so once the library is preloaded EVERY caller in the process reaches rdmasock first: the
 * application, libev, librdmacm, and rdmasock's own code. Code that must reach the kernel object (the wait layer
 * polling a kernel fd, the socket layer creating a placeholder socket) calls RS_REAL(name)(args...).
 *
 * The pointers are resolved with dlsym(RTLD_NEXT) once, by rs_libc_init(), which the library constructor calls
 * and every RS_REAL use calls again when the pointer is still NULL (a call that arrives before our constructor ran,
 * e.g. from another library's constructor or from inside malloc). While resolution is in progress on this thread
 * (dlsym itself may allocate and re-enter us), the functions that have a system-call equivalent fall back to
 * syscall(2) (rs_libc_fallback_*), so nothing recurses and nothing fails for lack of a pointer.
 */
#ifndef RS_INTERCEPT_LIBC_H
#define RS_INTERCEPT_LIBC_H

#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

/* X(return type, name, parameter list) for every libc function an interposer may need to call for real. */
#define RS_LIBC_FUNCTIONS(X)                                                                                   \
    X(int, socket, (int, int, int))                                                                            \
    X(int, socketpair, (int, int, int, int *))                                                                 \
    X(int, bind, (int, const struct sockaddr *, socklen_t))                                                     \
    X(int, listen, (int, int))                                                                                 \
    X(int, accept, (int, struct sockaddr *, socklen_t *))                                                      \
    X(int, accept4, (int, struct sockaddr *, socklen_t *, int))                                                \
    X(int, connect, (int, const struct sockaddr *, socklen_t))                                                  \
    X(int, shutdown, (int, int))                                                                               \
    X(int, close, (int))                                                                                       \
    X(ssize_t, read, (int, void *, size_t))                                                                    \
    X(ssize_t, readv, (int, const struct iovec *, int))                                                        \
    X(ssize_t, write, (int, const void *, size_t))                                                             \
    X(ssize_t, writev, (int, const struct iovec *, int))                                                       \
    X(ssize_t, recv, (int, void *, size_t, int))                                                               \
    X(ssize_t, recvfrom, (int, void *, size_t, int, struct sockaddr *, socklen_t *))                            \
    X(ssize_t, recvmsg, (int, struct msghdr *, int))                                                           \
    X(int, recvmmsg, (int, struct mmsghdr *, unsigned int, int, struct timespec *))                            \
    X(ssize_t, send, (int, const void *, size_t, int))                                                         \
    X(ssize_t, sendto, (int, const void *, size_t, int, const struct sockaddr *, socklen_t))                    \
    X(ssize_t, sendmsg, (int, const struct msghdr *, int))                                                     \
    X(int, sendmmsg, (int, struct mmsghdr *, unsigned int, int))                                               \
    X(ssize_t, sendfile, (int, int, off_t *, size_t))                                                          \
    X(ssize_t, sendfile64, (int, int, off64_t *, size_t))                                                      \
    X(int, poll, (struct pollfd *, nfds_t, int))                                                               \
    X(int, ppoll, (struct pollfd *, nfds_t, const struct timespec *, const sigset_t *))                        \
    X(int, select, (int, fd_set *, fd_set *, fd_set *, struct timeval *))                                      \
    X(int, pselect, (int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *))            \
    X(int, epoll_create, (int))                                                                                \
    X(int, epoll_create1, (int))                                                                               \
    X(int, epoll_ctl, (int, int, int, struct epoll_event *))                                                   \
    X(int, epoll_wait, (int, struct epoll_event *, int, int))                                                  \
    X(int, epoll_pwait, (int, struct epoll_event *, int, int, const sigset_t *))                               \
    X(int, epoll_pwait2, (int, struct epoll_event *, int, const struct timespec *, const sigset_t *))          \
    X(int, fcntl, (int, int, ...))                                                                             \
    X(int, fcntl64, (int, int, ...))                                                                           \
    X(int, ioctl, (int, unsigned long, ...))                                                                   \
    X(int, getsockopt, (int, int, int, void *, socklen_t *))                                                   \
    X(int, setsockopt, (int, int, int, const void *, socklen_t))                                               \
    X(int, getsockname, (int, struct sockaddr *, socklen_t *))                                                 \
    X(int, getpeername, (int, struct sockaddr *, socklen_t *))                                                 \
    X(int, dup, (int))                                                                                         \
    X(int, dup2, (int, int))                                                                                   \
    X(int, dup3, (int, int, int))                                                                              \
    X(pid_t, fork, (void))                                                                                     \
    X(pid_t, vfork, (void))                                                                                    \
    X(int, daemon, (int, int))                                                                                 \
    X(int, execve, (const char *, char *const[], char *const[]))                                               \
    X(int, execveat, (int, const char *, char *const[], char *const[], int))                                   \
    X(int, fexecve, (int, char *const[], char *const[]))                                                       \
    X(int, sigaction, (int, const struct sigaction *, struct sigaction *))                                     \
    X(sighandler_t, signal, (int, sighandler_t))                                                               \
    X(sighandler_t, sysv_signal, (int, sighandler_t))                                                          \
    X(sighandler_t, bsd_signal, (int, sighandler_t))                                                           \
    X(int, siginterrupt, (int, int))                                                                           \
    X(int, munmap, (void *, size_t))                                                                           \
    X(void *, mremap, (void *, size_t, size_t, int, ...))                                                      \
    X(int, madvise, (void *, size_t, int))                                                                     \
    X(int, brk, (void *))                                                                                      \
    X(void *, sbrk, (intptr_t))

#define RS_LIBC_DECLARE(ret, name, params) extern ret(*rs_real_##name) params;
RS_LIBC_FUNCTIONS(RS_LIBC_DECLARE)
#undef RS_LIBC_DECLARE

/* Resolves every pointer (idempotent, thread-safe). Returns 0, or -1 while this thread is already resolving. */
int rs_libc_init(void);

/* True while this thread is inside rs_libc_init (dlsym may call back into interposers). */
_Bool rs_libc_resolving(void);

/*
 * RS_REAL(name): the real function, resolving on first use. Before the pointer exists (only while dlsym is
 * running on this thread) it is NULL: callers that can be reached then (read, write, close, fcntl, poll...) use
 * RS_REAL_OR_SYSCALL in their interposer instead; see libc.c.
 */
#define RS_REAL(name) (__builtin_expect(rs_real_##name != NULL, 1) ? rs_real_##name : (rs_libc_init(), rs_real_##name))

#endif /* RS_INTERCEPT_LIBC_H */
