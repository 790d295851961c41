/* libc.c: resolution of the real libc functions behind the interposers (see libc.h for why and when). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "intercept/libc.h"

/*
 * Functions reachable while dlsym is still resolving (from inside malloc, or from a constructor that runs before
 * ours) start out as direct system calls, so they never see a NULL pointer; rs_libc_init replaces them with
 * glibc's (which add cancellation points and the fortify checks).
 */
static ssize_t early_read(int fd, void *buf, size_t len) { return syscall(SYS_read, fd, buf, len); }
static ssize_t early_write(int fd, const void *buf, size_t len) { return syscall(SYS_write, fd, buf, len); }
static int early_close(int fd) { return (int)syscall(SYS_close, fd); }
static int early_poll(struct pollfd *fds, nfds_t n, int timeout) { return (int)syscall(SYS_poll, fds, n, timeout); }
static int early_fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return (int)syscall(SYS_fcntl, fd, cmd, arg);
}
static int early_ioctl(int fd, unsigned long req, ...)
{
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return (int)syscall(SYS_ioctl, fd, req, arg);
}
static int early_munmap(void *addr, size_t len) { return (int)syscall(SYS_munmap, addr, len); }
static int early_madvise(void *addr, size_t len, int advice) { return (int)syscall(SYS_madvise, addr, len, advice); }

#define RS_LIBC_DEFINE(ret, name, params) ret(*rs_real_##name) params;
RS_LIBC_FUNCTIONS(RS_LIBC_DEFINE)
#undef RS_LIBC_DEFINE

__attribute__((constructor(101))) static void early_pointers(void)
{
    /* Before any other constructor of the library: the syscall fallbacks, so no early caller sees NULL. */
    if (!rs_real_read)
        rs_real_read = early_read;
    if (!rs_real_write)
        rs_real_write = early_write;
    if (!rs_real_close)
        rs_real_close = early_close;
    if (!rs_real_poll)
        rs_real_poll = early_poll;
    if (!rs_real_fcntl)
        rs_real_fcntl = early_fcntl;
    if (!rs_real_fcntl64)
        rs_real_fcntl64 = early_fcntl;
    if (!rs_real_ioctl)
        rs_real_ioctl = early_ioctl;
    if (!rs_real_munmap)
        rs_real_munmap = early_munmap;
    if (!rs_real_madvise)
        rs_real_madvise = early_madvise;
    rs_libc_init();
}

static __thread int resolving;
static int resolved;                        /* atomic */
static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;

_Bool rs_libc_resolving(void) { return resolving != 0; }

int rs_libc_init(void)
{
    if (__atomic_load_n(&resolved, __ATOMIC_ACQUIRE))
        return 0;
    if (resolving)
        return -1;
    if (!rs_real_read)
        early_pointers();       /* a caller reached us before the constructors ran */
    resolving = 1;
    pthread_mutex_lock(&resolve_lock);
    if (!resolved) {
        void *p;
#define RS_LIBC_RESOLVE(ret, name, params)                                                                     \
        p = dlsym(RTLD_NEXT, #name);                                                                           \
        if (p)                                                                                                 \
            __atomic_store_n((void **)&rs_real_##name, p, __ATOMIC_RELEASE);
        RS_LIBC_FUNCTIONS(RS_LIBC_RESOLVE)
#undef RS_LIBC_RESOLVE
        __atomic_store_n(&resolved, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&resolve_lock);
    resolving = 0;
    return 0;
}
