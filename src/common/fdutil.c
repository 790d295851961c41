/* fdutil.c: moving rdmasock's own fds above the application's range (see fdutil.h). Raw system calls only: this
 * runs under the interposers. */
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/fdutil.h"

static int high_base(void)
{
    static int base;            /* computed once; a benign race computes the same value */
    int b = __atomic_load_n(&base, __ATOMIC_RELAXED);
    if (b)
        return b;
    struct rlimit rl;
    if (syscall(SYS_getrlimit, RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        rl.rlim_cur = 1024;
    b = rl.rlim_cur >= 2048 ? 1024 : (int)(rl.rlim_cur / 2);
    if (b < 16)
        b = -1;                 /* too few fds to keep a range apart */
    __atomic_store_n(&base, b, __ATOMIC_RELAXED);
    return b;
}

int rs_fd_move_high(int fd)
{
    int base = high_base();
    if (fd < 0 || base < 0 || fd >= base)
        return fd;
    int nfd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, base);
    if (nfd < 0)
        return fd;
    syscall(SYS_close, fd);
    return nfd;
}
