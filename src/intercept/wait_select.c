/*
 * wait_select.c: select and pselect. Sets that name no intercepted socket go to the real call untouched; the
 * others become a poll array for the engine in wait_poll.c, whose answer is written back the way the kernel's
 * select writes it (fs/select.c): readable is POLLIN|POLLHUP|POLLERR, writable POLLOUT|POLLERR, exceptional
 * POLLPRI; every set bit counts once; an fd that is not open fails the call with EBADF and leaves the sets alone;
 * select's timeval receives the time left.
 *
 * The sets are read as arrays of longs up to nfds, so callers that allocate sets larger than FD_SETSIZE (which
 * Linux allows) work too.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/compiler.h"
#include "intercept/fdtable.h"
#include "intercept/isock.h"
#include "intercept/libc.h"
#include "intercept/wait.h"

#define BITS_PER_WORD (CHAR_BIT * sizeof(unsigned long))
#define STACK_POLLFDS 64

#define READABLE (POLLIN | POLLRDNORM | POLLRDBAND | POLLHUP | POLLERR)
#define WRITABLE (POLLOUT | POLLWRNORM | POLLWRBAND | POLLERR)
#define EXCEPTIONAL POLLPRI

static unsigned long *words_of(fd_set *set)
{
    return (unsigned long *)(void *)set;
}

static bool bit_is_set(fd_set *set, int fd)
{
    return set && (words_of(set)[fd / BITS_PER_WORD] >> (fd % BITS_PER_WORD)) & 1UL;
}

static unsigned long word_or(fd_set *r, fd_set *w, fd_set *e, size_t i)
{
    return (r ? words_of(r)[i] : 0) | (w ? words_of(w)[i] : 0) | (e ? words_of(e)[i] : 0);
}

/* Calls fn for every fd below nfds in any of the sets, in order; stops when fn returns false. */
static void for_each_fd(int nfds, fd_set *r, fd_set *w, fd_set *e, bool (*fn)(int fd, void *arg), void *arg)
{
    size_t nwords = ((size_t)nfds + BITS_PER_WORD - 1) / BITS_PER_WORD;
    for (size_t i = 0; i < nwords; i++) {
        unsigned long bits = word_or(r, w, e, i);
        while (bits) {
            int fd = (int)(i * BITS_PER_WORD) + __builtin_ctzl(bits);
            bits &= bits - 1;
            if (fd >= nfds)
                return;
            if (!fn(fd, arg))
                return;
        }
    }
}

static bool find_intercepted(int fd, void *arg)
{
    struct rs_isock *sock = rs_isock_get(fd);
    if (sock == NULL)
        return true;
    rs_isock_put(sock);
    *(bool *)arg = true;
    return false;
}

static bool count_fd(int fd, void *arg)
{
    (void)fd;
    (*(size_t *)arg)++;
    return true;
}

struct fill_state {
    struct pollfd *pfds;
    size_t n;
    fd_set *r, *w, *e;
};

static bool fill_fd(int fd, void *arg)
{
    struct fill_state *st = arg;
    short events = 0;
    if (bit_is_set(st->r, fd))
        events |= POLLIN;
    if (bit_is_set(st->w, fd))
        events |= POLLOUT;
    if (bit_is_set(st->e, fd))
        events |= POLLPRI;
    st->pfds[st->n++] = (struct pollfd){ .fd = fd, .events = events };
    return true;
}

static void clear_sets(int nfds, fd_set *r, fd_set *w, fd_set *e)
{
    size_t bytes = ((size_t)nfds + BITS_PER_WORD - 1) / BITS_PER_WORD * sizeof(unsigned long);
    if (r)
        memset(r, 0, bytes);
    if (w)
        memset(w, 0, bytes);
    if (e)
        memset(e, 0, bytes);
}

static void set_bit(fd_set *set, int fd)
{
    words_of(set)[fd / BITS_PER_WORD] |= 1UL << (fd % BITS_PER_WORD);
}

/*
 * The select of sets that hold at least one intercepted socket. Returns -2 when none is left (the caller then
 * makes the real call), else what select returns. *deadline receives the deadline used.
 */
static int select_sockets(int nfds, fd_set *r, fd_set *w, fd_set *e, const struct timespec *timeout,
                          const sigset_t *sigmask, int64_t *deadline)
{
    size_t n = 0;
    for_each_fd(nfds, r, w, e, count_fd, &n);
    struct pollfd stack_pfds[STACK_POLLFDS];
    struct pollfd *pfds = n <= STACK_POLLFDS ? stack_pfds : malloc(n * sizeof(*pfds));
    if (pfds == NULL) {
        errno = ENOMEM;
        return -1;
    }
    struct fill_state st = { .pfds = pfds, .r = r, .w = w, .e = e };
    for_each_fd(nfds, r, w, e, fill_fd, &st);

    bool passthrough;
    int rc = rs_wait_poll(pfds, st.n, timeout, sigmask, &passthrough, deadline);
    if (passthrough) {
        rc = -2;
    } else if (rc >= 0) {
        for (size_t i = 0; i < st.n; i++) {
            if (pfds[i].revents & POLLNVAL) {
                rc = -1;
                errno = EBADF;
                break;
            }
        }
    }
    if (rc >= 0) {
        /* The sets are both the question and the answer; the question is kept in the pollfds' events. */
        clear_sets(nfds, r, w, e);
        rc = 0;
        for (size_t i = 0; i < st.n; i++) {
            short events = pfds[i].events, revents = pfds[i].revents;
            if ((events & POLLIN) && (revents & READABLE)) {
                set_bit(r, pfds[i].fd);
                rc++;
            }
            if ((events & POLLOUT) && (revents & WRITABLE)) {
                set_bit(w, pfds[i].fd);
                rc++;
            }
            if ((events & POLLPRI) && (revents & EXCEPTIONAL)) {
                set_bit(e, pfds[i].fd);
                rc++;
            }
        }
    }
    if (pfds != stack_pfds) {
        int saved_errno = errno;
        free(pfds);
        errno = saved_errno;
    }
    return rc;
}

static bool has_intercepted(int nfds, fd_set *r, fd_set *w, fd_set *e)
{
    if (RS_LIKELY(!rs_fd_any(RS_FD_SOCK)) || nfds <= 0 || (!r && !w && !e))
        return false;
    bool found = false;
    for_each_fd(nfds, r, w, e, find_intercepted, &found);
    return found;
}

static int real_select(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
    if (RS_LIKELY(rs_real_select != NULL) || (rs_libc_init(), rs_real_select != NULL))
        return rs_real_select(nfds, r, w, e, tv);
#ifdef SYS_select
    return (int)syscall(SYS_select, nfds, r, w, e, tv);
#else
    errno = ENOSYS;
    return -1;
#endif
}

static int real_pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const struct timespec *timeout,
                        const sigset_t *sigmask)
{
    if (RS_LIKELY(rs_real_pselect != NULL) || (rs_libc_init(), rs_real_pselect != NULL))
        return rs_real_pselect(nfds, r, w, e, timeout, sigmask);
    struct timespec copy;
    if (timeout) {
        copy = *timeout;
        timeout = &copy;
    }
    struct { const sigset_t *set; size_t size; } mask = { sigmask, _NSIG / 8 };
    return (int)syscall(SYS_pselect6, nfds, r, w, e, timeout, sigmask ? &mask : NULL);
}

RS_EXPORT int select(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval *tv)
{
    if (RS_LIKELY(!has_intercepted(nfds, readfds, writefds, exceptfds)))
        return real_select(nfds, readfds, writefds, exceptfds, tv);
    if (tv && (tv->tv_sec < 0 || tv->tv_usec < 0 || tv->tv_usec >= 1000000)) {
        errno = EINVAL;
        return -1;
    }
    struct timespec timeout;
    if (tv)
        timeout = (struct timespec){ tv->tv_sec, tv->tv_usec * 1000 };
    int64_t deadline = rs_wait_deadline(tv ? &timeout : NULL);
    int rc = select_sockets(nfds, readfds, writefds, exceptfds, tv ? &timeout : NULL, NULL, &deadline);
    if (rc == -2)
        return real_select(nfds, readfds, writefds, exceptfds, tv);
    if (tv) {
        /* Linux reports the time not slept, whatever the outcome (man select, "Linux notes"). */
        int saved_errno = errno;
        struct timespec left;
        rs_wait_remaining_ts(deadline, &left);
        tv->tv_sec = left.tv_sec;
        tv->tv_usec = left.tv_nsec / 1000;
        errno = saved_errno;
    }
    return rc;
}

RS_EXPORT int pselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
                      const struct timespec *timeout, const sigset_t *sigmask)
{
    if (RS_LIKELY(!has_intercepted(nfds, readfds, writefds, exceptfds)))
        return real_pselect(nfds, readfds, writefds, exceptfds, timeout, sigmask);
    if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L)) {
        errno = EINVAL;
        return -1;
    }
    int64_t deadline;
    int rc = select_sockets(nfds, readfds, writefds, exceptfds, timeout, sigmask, &deadline);
    if (rc == -2)
        return real_pselect(nfds, readfds, writefds, exceptfds, timeout, sigmask);
    return rc;
}
