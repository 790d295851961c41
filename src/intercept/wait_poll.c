/*
 * wait_poll.c: poll and ppoll over intercepted sockets and kernel fds together, and the engine select reuses.
 *
 * One call: every intercepted socket of the array is replaced by its wait fds (isock.h), with the application's
 * interest registered for the duration of the call; the real ppoll sleeps on kernel fds and wait fds together;
 * after each wake-up rs_isock_poll says what the socket really has. The socket's readiness is checked once before
 * sleeping, so a socket that is already ready turns the real call into a zero-timeout sweep of the kernel fds.
 *
 * Wake-ups for nothing: a wait fd is shared by every waiter of a socket and stays readable while any of them has
 * something (isock.h rule 3). Sleeping on it again in the same level-triggered way would return at once for as
 * long as the other waiter leaves its data unread, i.e. spin. So after the first such wake-up the call moves the
 * wait fds into a private epoll instance, edge-triggered, and sleeps on that one fd instead: only a change that
 * adds readiness (which writes the wait fd again, rule 5) wakes it. Pending edges are consumed before each
 * readiness check, so an edge that arrives between the check and the sleep is never lost.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"
#include "intercept/fdtable.h"
#include "intercept/isock.h"
#include "intercept/libc.h"
#include "intercept/wait.h"

extern void __chk_fail(void) __attribute__((noreturn));

#define NS_PER_SEC 1000000000LL

/* Arrays up to these sizes live on the stack: a typical event loop polls a few dozen fds. */
#define STACK_WATCHED 16
#define STACK_REAL 64

/* ---- time ---- */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_SEC + ts.tv_nsec;
}

int64_t rs_wait_deadline(const struct timespec *timeout)
{
    if (timeout == NULL)
        return RS_WAIT_FOREVER;
    int64_t now = now_ns();
    /* Timeouts of centuries are forever in practice, and treating them so keeps the arithmetic in range. */
    if (timeout->tv_sec >= (RS_WAIT_FOREVER - now) / NS_PER_SEC - 1)
        return RS_WAIT_FOREVER;
    return now + (int64_t)timeout->tv_sec * NS_PER_SEC + timeout->tv_nsec;
}

void rs_wait_remaining_ts(int64_t deadline, struct timespec *out)
{
    int64_t left = deadline - now_ns();
    if (left < 0)
        left = 0;
    out->tv_sec = (time_t)(left / NS_PER_SEC);
    out->tv_nsec = (long)(left % NS_PER_SEC);
}

int rs_wait_remaining_ms(int64_t deadline)
{
    if (deadline == RS_WAIT_FOREVER)
        return -1;
    int64_t left = deadline - now_ns();
    if (left <= 0)
        return 0;
    int64_t ms = (left + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* ---- events ---- */

unsigned rs_wait_interest_of(unsigned app_events)
{
    unsigned interest = 0;
    if (app_events & (POLLIN | POLLRDNORM))
        interest |= POLLIN;
    if (app_events & (POLLOUT | POLLWRNORM))
        interest |= POLLOUT;
    if (app_events & POLLPRI)
        interest |= POLLPRI;
    if (app_events & POLLRDHUP)
        interest |= POLLRDHUP;
    return interest;
}

unsigned rs_wait_report(unsigned isock_mask, unsigned app_events)
{
    /* tcp_poll sets POLLRDNORM with POLLIN and POLLWRNORM with POLLOUT; an application may ask for either. */
    unsigned report = isock_mask & (POLLERR | POLLHUP);
    if (isock_mask & POLLIN)
        report |= app_events & (POLLIN | POLLRDNORM);
    if (isock_mask & POLLOUT)
        report |= app_events & (POLLOUT | POLLWRNORM);
    if (isock_mask & POLLPRI)
        report |= app_events & POLLPRI;
    if (isock_mask & POLLRDHUP)
        report |= app_events & POLLRDHUP;
    return report;
}

/* ---- the real calls, usable even while libc.c is still resolving pointers on this thread ---- */

static int real_ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask)
{
    if (RS_LIKELY(rs_real_ppoll != NULL) || (rs_libc_init(), rs_real_ppoll != NULL))
        return rs_real_ppoll(fds, nfds, timeout, sigmask);
    /* The kernel writes the time left into the timespec; the caller's is const (glibc copies it too). */
    struct timespec copy;
    if (timeout) {
        copy = *timeout;
        timeout = &copy;
    }
    return (int)syscall(SYS_ppoll, fds, nfds, timeout, sigmask, sigmask ? (size_t)(_NSIG / 8) : (size_t)0);
}

static int real_poll(struct pollfd *fds, nfds_t nfds, int timeout_ms)
{
    if (RS_LIKELY(rs_real_poll != NULL) || (rs_libc_init(), rs_real_poll != NULL))
        return rs_real_poll(fds, nfds, timeout_ms);
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000 };
    return real_ppoll(fds, nfds, timeout_ms < 0 ? NULL : &ts, NULL);
}

/* ---- one call of the engine ---- */

/* An intercepted socket named by the application's array. */
struct watched {
    struct rs_isock *sock;
    nfds_t index;               /* in the application's array */
    unsigned interest;          /* registered with rs_isock_interest for the whole call */
    uint32_t generation;        /* of the wait fds now in the real array */
    short revents;              /* what the application will see */
};

struct poll_call {
    struct pollfd *app;
    nfds_t nfds;
    struct watched *watched;
    size_t nwatched;
    size_t watched_cap;
    /*
     * What the real ppoll sees: [0, nfds) mirrors the application's array with intercepted sockets as fd -1
     * (ignored by the kernel); then RS_ISOCK_WAIT_FDS slots per watched socket; then one slot for the edge epoll.
     */
    struct pollfd *real;
    nfds_t nreal;
    int edge_fd;                /* private edge-triggered epoll, -1 until the first wake-up for nothing */
};

static struct pollfd *wait_slots(struct poll_call *call, size_t k)
{
    return &call->real[call->nfds + k * RS_ISOCK_WAIT_FDS];
}

static struct pollfd *edge_slot(struct poll_call *call)
{
    return &call->real[call->nreal - 1];
}

/* Puts the wait fds of watched socket k in its slots (and in the edge epoll once there is one). */
static void fetch_wait_fds(struct poll_call *call, size_t k)
{
    struct watched *w = &call->watched[k];
    struct pollfd *slots = wait_slots(call, k);
    for (int j = 0; j < RS_ISOCK_WAIT_FDS; j++)
        slots[j] = (struct pollfd){ .fd = -1 };
    int n = rs_isock_wait_fds(w->sock, call->app[w->index].fd, w->interest, slots);
    if (call->edge_fd < 0)
        return;
    for (int j = 0; j < n; j++) {
        struct epoll_event ev = { .events = (uint32_t)slots[j].events | EPOLLET, .data.u64 = 0 };
        /* EEXIST: the same wait fd for two entries of the array; one registration wakes us for both. If
         * registration fails otherwise, the fd stays in the level-triggered set: never a lost wake-up. */
        if (RS_REAL(epoll_ctl)(call->edge_fd, EPOLL_CTL_ADD, slots[j].fd, &ev) == 0 || errno == EEXIST)
            slots[j].fd = -1;
    }
}

/* Recomputes every watched socket's revents; returns how many have some. Refetches the wait fds of a socket
 * whose generation moved (rule 4) and says so in *moved. */
static int refresh(struct poll_call *call, bool *moved)
{
    int ready = 0;
    for (size_t k = 0; k < call->nwatched; k++) {
        struct watched *w = &call->watched[k];
        const struct pollfd *app = &call->app[w->index];
        unsigned mask = rs_isock_poll(w->sock, app->fd);
        uint32_t generation = rs_isock_generation(w->sock);
        if (generation != w->generation) {
            w->generation = generation;
            fetch_wait_fds(call, k);
            *moved = true;
        }
        w->revents = (short)rs_wait_report(mask, (unsigned short)app->events);
        if (w->revents)
            ready++;
    }
    return ready;
}

/* A wait fd closed under us is the socket layer changing path (rule 4), which the next refresh sees; should
 * the generation not have moved, polling the dead fd again would return POLLNVAL forever, so it is dropped. */
static void forget_closed_wait_fds(struct poll_call *call)
{
    for (nfds_t i = call->nfds; i < call->nreal; i++) {
        if (call->real[i].fd >= 0 && (call->real[i].revents & POLLNVAL)) {
            RS_LOG_ONCE(RS_LOG_WARN, "poll: wait fd %d was closed under a waiter", call->real[i].fd);
            call->real[i].fd = -1;
        }
    }
}

static void drain_edges(int edge_fd)
{
    struct epoll_event events[16];
    while (RS_REAL(epoll_wait)(edge_fd, events, (int)RS_ARRAY_SIZE(events), 0) == (int)RS_ARRAY_SIZE(events))
        ;
}

/* Moves the wait fds from the level-triggered set into a private edge-triggered epoll (see the top of file). */
static void enter_edge_mode(struct poll_call *call)
{
    int edge_fd = RS_REAL(epoll_create1)(EPOLL_CLOEXEC);
    if (edge_fd < 0)
        return;                 /* keep sleeping level-triggered: correct, only less frugal */
    rs_fd_mark_internal(edge_fd);
    call->edge_fd = edge_fd;
    for (size_t k = 0; k < call->nwatched; k++)
        fetch_wait_fds(call, k);
    *edge_slot(call) = (struct pollfd){ .fd = edge_fd, .events = POLLIN };
}

static bool add_watched(struct poll_call *call, struct watched *stack_watched, struct rs_isock *sock, nfds_t index)
{
    if (call->nwatched == call->watched_cap) {
        size_t cap = call->watched_cap * 2;
        struct watched *grown;
        if (call->watched == stack_watched) {
            grown = malloc(cap * sizeof(*grown));
            if (grown)
                memcpy(grown, stack_watched, call->nwatched * sizeof(*grown));
        } else {
            grown = realloc(call->watched, cap * sizeof(*grown));
        }
        if (grown == NULL)
            return false;
        call->watched = grown;
        call->watched_cap = cap;
    }
    call->watched[call->nwatched++] = (struct watched){ .sock = sock, .index = index };
    return true;
}

static void release_watched(struct poll_call *call, struct watched *stack_watched, bool registered)
{
    for (size_t k = 0; k < call->nwatched; k++) {
        if (registered)
            rs_isock_interest(call->watched[k].sock, call->watched[k].interest, -1);
        rs_isock_put(call->watched[k].sock);
    }
    if (call->watched != stack_watched)
        free(call->watched);
}

int rs_wait_poll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask,
                 bool *passthrough, int64_t *deadline_out)
{
    struct watched stack_watched[STACK_WATCHED];
    struct pollfd stack_real[STACK_REAL];
    struct poll_call call = {
        .app = fds, .nfds = nfds, .watched = stack_watched, .watched_cap = STACK_WATCHED, .edge_fd = -1,
    };

    *passthrough = false;
    for (nfds_t i = 0; i < nfds; i++) {
        if (fds[i].fd < 0)
            continue;
        struct rs_isock *sock = rs_isock_get(fds[i].fd);
        if (sock == NULL)
            continue;
        if (!add_watched(&call, stack_watched, sock, i)) {
            rs_isock_put(sock);
            release_watched(&call, stack_watched, false);
            errno = ENOMEM;
            return -1;
        }
    }
    if (call.nwatched == 0) {
        *passthrough = true;
        return 0;
    }

    int64_t deadline = rs_wait_deadline(timeout);
    if (deadline_out)
        *deadline_out = deadline;

    call.nreal = nfds + call.nwatched * RS_ISOCK_WAIT_FDS + 1;
    call.real = call.nreal <= STACK_REAL ? stack_real : malloc(call.nreal * sizeof(*call.real));
    if (call.real == NULL) {
        release_watched(&call, stack_watched, false);
        errno = ENOMEM;
        return -1;
    }
    memcpy(call.real, fds, nfds * sizeof(*fds));
    for (size_t k = 0; k < call.nwatched; k++) {
        struct watched *w = &call.watched[k];
        call.real[w->index] = (struct pollfd){ .fd = -1 };
        w->interest = rs_wait_interest_of((unsigned short)fds[w->index].events);
        rs_isock_interest(w->sock, w->interest, +1);
        w->generation = rs_isock_generation(w->sock);
        fetch_wait_fds(&call, k);
    }
    *edge_slot(&call) = (struct pollfd){ .fd = -1 };

    int result;
    for (;;) {
        bool moved = false;
        if (call.edge_fd >= 0)
            drain_edges(call.edge_fd);
        int ready = refresh(&call, &moved);

        struct timespec left;
        const struct timespec *wait_for = NULL;
        if (ready) {
            left = (struct timespec){ 0, 0 };
            wait_for = &left;
        } else if (deadline != RS_WAIT_FOREVER) {
            rs_wait_remaining_ts(deadline, &left);
            wait_for = &left;
        }
        int fired = real_ppoll(call.real, call.nreal, wait_for, sigmask);
        if (fired < 0) {
            if (errno != EINTR || !ready) {
                result = -1;
                break;
            }
            /* The kernel returns ready fds rather than EINTR when it has any; the handler has run, so sweep
             * the kernel fds once more without the mask and report what is ready. */
            left = (struct timespec){ 0, 0 };
            fired = real_ppoll(call.real, call.nreal, &left, NULL);
            if (fired < 0) {
                for (nfds_t i = 0; i < call.nreal; i++)
                    call.real[i].revents = 0;
                fired = 0;
            }
        }

        int kernel_ready = 0;
        for (nfds_t i = 0; i < nfds; i++)
            kernel_ready += call.real[i].revents != 0;
        forget_closed_wait_fds(&call);
        if (!ready && fired > kernel_ready) {
            /* A wait fd (or the edge epoll) fired: what does the socket say? */
            if (call.edge_fd >= 0)
                drain_edges(call.edge_fd);
            ready = refresh(&call, &moved);
        }
        if (ready + kernel_ready > 0) {
            for (nfds_t i = 0; i < nfds; i++)
                fds[i].revents = call.real[i].revents;
            for (size_t k = 0; k < call.nwatched; k++)
                fds[call.watched[k].index].revents = call.watched[k].revents;
            result = ready + kernel_ready;
            break;
        }
        if (fired == 0 || (deadline != RS_WAIT_FOREVER && now_ns() >= deadline)) {
            for (nfds_t i = 0; i < nfds; i++)
                fds[i].revents = 0;
            result = 0;
            break;
        }
        /* Woken for another waiter's sake: sleep again with the time left, edge-triggered from now on unless
         * the wait fds just changed (then the new ones have not had their chance yet). */
        if (!moved && call.edge_fd < 0)
            enter_edge_mode(&call);
    }

    int saved_errno = errno;
    release_watched(&call, stack_watched, true);
    if (call.edge_fd >= 0) {
        rs_fd_unmark_internal(call.edge_fd);
        RS_REAL(close)(call.edge_fd);
    }
    if (call.real != stack_real)
        free(call.real);
    errno = saved_errno;
    return result;
}

/* ---- the interposers ---- */

static bool timespec_valid(const struct timespec *ts)
{
    return ts == NULL || (ts->tv_sec >= 0 && ts->tv_nsec >= 0 && ts->tv_nsec < NS_PER_SEC);
}

static int poll_impl(struct pollfd *fds, nfds_t nfds, int timeout_ms)
{
    if (RS_LIKELY(!rs_fd_any(RS_FD_SOCK)) || nfds == 0)
        return real_poll(fds, nfds, timeout_ms);
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000 };
    bool passthrough;
    int rc = rs_wait_poll(fds, nfds, timeout_ms < 0 ? NULL : &ts, NULL, &passthrough, NULL);
    return passthrough ? real_poll(fds, nfds, timeout_ms) : rc;
}

static int ppoll_impl(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask)
{
    if (RS_LIKELY(!rs_fd_any(RS_FD_SOCK)) || nfds == 0)
        return real_ppoll(fds, nfds, timeout, sigmask);
    if (!timespec_valid(timeout)) {
        errno = EINVAL;
        return -1;
    }
    bool passthrough;
    int rc = rs_wait_poll(fds, nfds, timeout, sigmask, &passthrough, NULL);
    return passthrough ? real_ppoll(fds, nfds, timeout, sigmask) : rc;
}

RS_EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    return poll_impl(fds, nfds, timeout);
}

RS_EXPORT int ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask)
{
    return ppoll_impl(fds, nfds, timeout, sigmask);
}

RS_EXPORT int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fds_len)
{
    if (fds_len / sizeof(*fds) < nfds)
        __chk_fail();
    return poll_impl(fds, nfds, timeout);
}

RS_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask,
                          size_t fds_len)
{
    if (fds_len / sizeof(*fds) < nfds)
        __chk_fail();
    return ppoll_impl(fds, nfds, timeout, sigmask);
}
