/*
 * wait.h: the wait layer. poll, ppoll, select, pselect and the epoll calls report intercepted sockets (isock.h)
 * and kernel fds together, with the kernel's semantics.
 *
 * Cost model. A call that names no intercepted socket goes straight to the real libc function: poll/select test
 * rs_fd_any(RS_FD_SOCK) and then look each fd up; epoll calls test whether the epoll fd has an RS_FD_EPOLL entry.
 * libev, librdmacm and rdmasock's own threads wait on their own fds and so always pass through.
 *
 * poll and select (wait_poll.c, wait_select.c) translate each intercepted socket into its wait fds for one call,
 * sleep in the real ppoll, and compute what the application sees with rs_isock_poll. A wake-up that turns out to
 * be for another waiter (isock.h rule 3) switches the call to sleeping on a private edge-triggered epoll instance
 * holding the wait fds, so a wait fd that stays readable for someone else's sake cannot make the call spin.
 *
 * epoll (wait_epoll.c): an application epoll fd E that gets an intercepted socket owns a private epoll fd P
 * (RS_FD_INTERNAL) holding the wait fds of E's sockets; P sits in E under a data value no application
 * registration uses. Kernel fds stay in E with the application's data, so they cost nothing extra. epoll_wait(E)
 * waits on E for real and expands P's event into application events.
 *
 * fork: wait_epoll.c registers its own pthread_atfork handlers (when the first such E is made) so that no lock
 * of the wait layer is held in a child; registrations are revalidated at the next epoll_wait after a fork
 * (rs_isock_fork_generation). The socket layer calls rs_wait_isock_closed (isock.h) before a socket's last fd is
 * really closed, so a wait fd that is the application's own fd can still be deleted from P.
 */
#ifndef RS_INTERCEPT_WAIT_H
#define RS_INTERCEPT_WAIT_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ---- time: deadlines are CLOCK_MONOTONIC nanoseconds ---- */

#define RS_WAIT_FOREVER INT64_MAX

/* The deadline of a relative timeout; NULL means forever. A negative or malformed timespec is the caller's to
 * reject before calling. */
int64_t rs_wait_deadline(const struct timespec *timeout);
/* Time left until deadline (never negative), as a timespec for ppoll/epoll_pwait2. */
void rs_wait_remaining_ts(int64_t deadline, struct timespec *out);
/* Time left in milliseconds rounded up (so a wait never ends early), -1 for forever, for epoll_wait. */
int rs_wait_remaining_ms(int64_t deadline);

/* ---- events ---- */

/* The isock interest (POLLIN, POLLOUT, POLLPRI, POLLRDHUP) behind application poll/epoll event bits. */
unsigned rs_wait_interest_of(unsigned app_events);
/* What the application sees for requested events app_events given the isock readiness mask (rs_isock_poll):
 * the kernel's answer for a TCP socket, with POLLRDNORM/POLLWRNORM alongside POLLIN/POLLOUT and POLLERR/POLLHUP
 * always reported. */
unsigned rs_wait_report(unsigned isock_mask, unsigned app_events);

/* ---- the poll engine (wait_poll.c), shared by poll, ppoll, select and pselect ---- */

/*
 * Waits like ppoll(fds, nfds, timeout, sigmask) when some fd of fds is an intercepted socket. When none is (a
 * socket closed since the caller looked), sets *passthrough and returns 0 without touching anything, so the
 * caller makes its own real call with its own arguments. *deadline_out, when not NULL, receives the deadline
 * used (select reports the time left from it).
 */
int rs_wait_poll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask,
                 bool *passthrough, int64_t *deadline_out);

/* ---- glibc's fortified entry points (no public prototype without _FORTIFY_SOURCE) ---- */

int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fds_len);
int __ppoll_chk(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask,
                size_t fds_len);

#endif /* RS_INTERCEPT_WAIT_H */
