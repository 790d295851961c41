/*
 * isock.h: an intercepted socket, as the wait layer (poll, select, epoll) and the process layer (fork, exec) see
 * it. The socket calls themselves live in sock_calls.c and io_calls.c.
 *
 * One struct rs_isock stands for one kernel open file description of the application (an fd and all its dups
 * share it). It is the fd-table object of type RS_FD_SOCK. What it carries:
 *   - SDP stream (a TCP socket converted to RDMA, connected or connecting, or a listener that also serves
 *     rdmasock clients over RDMA);
 *   - datagram (a UDP socket whose kernel fd the datagram layer adopted);
 *   - kernel (a TCP socket that fell back, or a both-mode socket whose RDMA side is gone): every call goes to the
 *     kernel fd, the entry stays for the statistics and for the wait layer's bookkeeping.
 *
 * Waiting. A waiter never sleeps on the socket itself but on its wait fds: at most RS_ISOCK_WAIT_FDS fds with the
 * poll events to ask for (a notification eventfd of the SDP or datagram layer, and/or the application's own kernel
 * fd when the kernel has part of the answer, e.g. plain TCP clients of a both-mode listener, or a socket that fell
 * back). The rules:
 *   1. rs_isock_interest(s, events, +1) before sleeping, the same with -1 after (counted: independent waiters
 *      each add and remove their own);
 *   2. sleep in the kernel (poll/epoll) on the fds rs_isock_wait_fds gives;
 *   3. on any wake-up call rs_isock_poll(s, fd) for the true readiness, which is what the application sees.
 *      A wait fd can be readable while the socket has nothing for this waiter (another waiter's interest): treat
 *      that as "not ready" and sleep again;
 *   4. the wait fds change when the socket changes path (a nonblocking connect that falls back to the kernel, a
 *      listener revived after fork): rs_isock_generation changes then, and rs_isock_poll may be what changes it.
 *      A waiter that keeps registrations (epoll) compares generations after each rs_isock_poll and re-registers.
 *   5. Edge-triggered waiters (EPOLLET) may register the wait fds edge-triggered: every change that ADDS
 *      readiness produces a new edge on a wait fd.
 */
#ifndef RS_INTERCEPT_ISOCK_H
#define RS_INTERCEPT_ISOCK_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "intercept/fdtable.h"

struct rs_isock;

#define RS_ISOCK_WAIT_FDS 2

/* The isock of fd with a reference (put with rs_isock_put), or NULL when fd is not an intercepted socket. */
struct rs_isock *rs_isock_get(int fd);
void rs_isock_put(struct rs_isock *s);
struct rs_fd_obj *rs_isock_obj(struct rs_isock *s);

/*
 * Fills out[] (fd and events; revents zeroed) with what to sleep on to learn about the application events
 * `events` (POLLIN, POLLOUT, POLLRDHUP, POLLPRI) of socket s reached through the application's fd `fd`.
 * Returns how many (0..RS_ISOCK_WAIT_FDS).
 */
int rs_isock_wait_fds(struct rs_isock *s, int fd, unsigned events, struct pollfd out[RS_ISOCK_WAIT_FDS]);

/* Readiness now, in poll(2) bits (POLLIN, POLLOUT, POLLRDHUP, POLLHUP, POLLERR, POLLPRI, POLLNVAL never). */
unsigned rs_isock_poll(struct rs_isock *s, int fd);

/* Interest of waiters, counted per bit (see rule 1). */
void rs_isock_interest(struct rs_isock *s, unsigned events, int delta);
/* A listening socket (an SDP listener, dormant or not). */
bool rs_isock_listener(struct rs_isock *s);

/* Changes whenever the wait fds may have changed (rule 4). */
uint32_t rs_isock_generation(struct rs_isock *s);

/* ---- hooks between layers of src/intercept ---- */

/* Called by the socket layer when the LAST fd of s is closed (the application can no longer name it), before s
 * is shut down: the wait layer drops every registration of s (implemented in wait_epoll.c). */
void rs_wait_isock_closed(struct rs_isock *s);

/* Process events, implemented in isock.c, called by proc.c around fork and exec. */
void rs_isock_fork_prepare(void);
void rs_isock_fork_parent(void);
void rs_isock_fork_child(void);
/* In fork() of the parent, once the real fork returned the child's pid (> 0): the child holds every connection the
 * parent had, and is entered as such before the application can close any (handover.h). */
void rs_isock_fork_returned(pid_t child);
void rs_isock_before_exec(void);            /* an exec is about to replace the image */
void rs_isock_exec_failed(void);            /* ... and did not */
void rs_isock_before_exit(void);            /* _exit/_Exit: the process ends without its atexit handlers */

/* Bumped at every fork (parent and child): waiters that keep registrations revalidate them when it changed. */
uint32_t rs_isock_fork_generation(void);

#endif /* RS_INTERCEPT_ISOCK_H */
