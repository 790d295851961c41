/*
 * waitcheck: poll, select and epoll readiness on real TCP sockets, checked the way an application relies on it.
 * It must pass on the plain kernel; tests/suites/intercept_wait.sh runs it again under LD_PRELOAD=librdmasock.so
 * with a rule that moves its port onto SDP, so that every check then exercises rdmasock's wait layer.
 *
 *   usage: waitcheck --port PORT [--expect sdp|kernel] [--only NAME] [--hold]
 *     --port    the TCP port of the listener on 127.0.0.1 (every connection of the run goes to it)
 *     --expect  sdp: every socket of the run must report an SDP side (getsockopt at level RS_SOL_SDP answers);
 *               kernel: none may
 *     --only    run one check
 *     --hold    after the checks, print "HOLD <pid>" and keep one connected pair open until stdin closes (so
 *               that `rdmasock stat PID` can look at the process)
 *   Output: "PLAN n" (how many checks will run), then one line per check, "PASS name" or "FAIL name: line N:
 *   why", and comment lines starting with '#'; exit status 0 when all passed.
 *
 * The Makefile links helpers with librdmasock.a. This program must stay a plain program (its "without rdmasock"
 * run means exactly that): the archive leaves the interposers out, and the libc functions rdmasock interposes
 * are referenced weakly below as well, because a weak reference never pulls an archive member in. At run time
 * each binds to libc, or to librdmasock.so when that is preloaded, like any other program's reference.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "sdp_stream/sdp.h"         /* RS_SOL_SDP and RS_SDP_ZCOPY_THRESHOLD: the conversion probe */

/* glibc's fortified poll, which programs built with _FORTIFY_SOURCE call instead of poll. */
int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fds_len);

#pragma weak socket
#pragma weak bind
#pragma weak listen
#pragma weak accept
#pragma weak accept4
#pragma weak connect
#pragma weak shutdown
#pragma weak close
#pragma weak read
#pragma weak write
#pragma weak recv
#pragma weak send
#pragma weak poll
#pragma weak ppoll
#pragma weak select
#pragma weak pselect
#pragma weak epoll_create
#pragma weak epoll_create1
#pragma weak epoll_ctl
#pragma weak epoll_wait
#pragma weak epoll_pwait
#pragma weak epoll_pwait2
#pragma weak getsockopt
#pragma weak setsockopt
#pragma weak dup
#pragma weak fcntl
#pragma weak __poll_chk
#pragma weak fork
#pragma weak sigaction
#pragma weak signal

/* ---- reporting ---- */

static const char *current;
static bool current_failed;
static int failures;

static void fail_at(int line, const char *cond, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_at(int line, const char *cond, const char *fmt, ...)
{
    int saved_errno = errno;
    char msg[256] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
    }
    const char *detail = msg[0] == ' ' ? msg + 1 : msg;    /* CHECK prefixes one space to its format */
    printf("FAIL %s: line %d: %s%s%s (errno %d %s)\n", current, line, cond, *detail ? ": " : "", detail,
           saved_errno, strerror(saved_errno));
    fflush(stdout);
    current_failed = true;
}

/* A failed check ends the current test (its fds leak; the run is short). */
#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            fail_at(__LINE__, #cond, " " __VA_ARGS__);             \
            return;                                               \
        }                                                         \
    } while (0)

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

/* ---- sockets ---- */

enum expect { EXPECT_ANY, EXPECT_SDP, EXPECT_KERNEL };

static int port;
static int listener = -1;
static enum expect expect = EXPECT_ANY;

static struct sockaddr_in listen_addr(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static bool has_sdp_side(int fd)
{
    int threshold = 0;
    socklen_t len = sizeof(threshold);
    return getsockopt(fd, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, &threshold, &len) == 0;
}

static bool side_as_expected(int fd)
{
    if (expect == EXPECT_ANY)
        return true;
    return has_sdp_side(fd) == (expect == EXPECT_SDP);
}

static int open_listener(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = listen_addr();
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int connect_client(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = listen_addr();
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* A connected pair: client end c, accepted end s. Both must be on the expected side. */
static bool make_pair(int *c, int *s)
{
    *c = connect_client();
    if (*c < 0) {
        fail_at(__LINE__, "connect", "to 127.0.0.1:%d", port);
        return false;
    }
    *s = accept(listener, NULL, NULL);
    if (*s < 0) {
        fail_at(__LINE__, "accept", " ");
        close(*c);
        return false;
    }
    if (!side_as_expected(*c) || !side_as_expected(*s)) {
        fail_at(__LINE__, "side_as_expected", "connection is %s, expected %s",
                has_sdp_side(*c) ? "SDP" : "kernel", expect == EXPECT_SDP ? "SDP" : "kernel");
        close(*c);
        close(*s);
        return false;
    }
    return true;
}

#define PAIR(c, s)                      \
    int c, s;                           \
    do {                                \
        if (!make_pair(&c, &s))         \
            return;                     \
    } while (0)

static bool put(int fd, const char *text)
{
    size_t len = strlen(text);
    return write(fd, text, len) == (ssize_t)len;
}

/* Reads whatever is there without blocking. */
static ssize_t drain(int fd)
{
    char buf[4096];
    ssize_t total = 0, n;
    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
        total += n;
    return total;
}

struct later {
    int fd;
    int delay_ms;
    const char *text;
    pthread_t thread;
};

static void *later_main(void *arg)
{
    struct later *l = arg;
    usleep((useconds_t)l->delay_ms * 1000);
    if (l->text)
        put(l->fd, l->text);
    return NULL;
}

/* Writes text to fd from another thread after delay_ms. */
static void write_later(struct later *l, int fd, int delay_ms, const char *text)
{
    *l = (struct later){ .fd = fd, .delay_ms = delay_ms, .text = text };
    pthread_create(&l->thread, NULL, later_main, l);
}

/*
 * An fd number that is not open and that nothing will take while the check runs: fds are allocated lowest first,
 * and rdmasock's threads open fds of their own at any time, so a number just closed could be reused. It stays
 * below 64, the smallest fd table the kernel gives a process: select silently ignores fds beyond the table.
 */
static int closed_fd(void)
{
    for (int fd = 63; fd > 2; fd--)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF)
            return fd;
    return -1;
}

static void close_all(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        close(va_arg(ap, int));
    va_end(ap);
}

/* ---- poll ---- */

static void t_poll_pollout(void)
{
    PAIR(c, s);
    struct pollfd p = { .fd = c, .events = POLLOUT };
    int64_t t0 = now_ms();
    CHECK(poll(&p, 1, 2000) == 1);
    CHECK(p.revents == POLLOUT, "revents 0x%x", p.revents);
    CHECK(now_ms() - t0 < 500);
    close_all(2, c, s);
}

static void t_poll_timeout(void)
{
    PAIR(c, s);
    struct pollfd p = { .fd = s, .events = POLLIN };
    int64_t t0 = now_ms();
    CHECK(poll(&p, 1, 300) == 0);
    int64_t took = now_ms() - t0;
    CHECK(took >= 290 && took < 1000, "took %lld ms", (long long)took);
    CHECK(p.revents == 0);
    close_all(2, c, s);
}

static void t_poll_pollin(void)
{
    PAIR(c, s);
    CHECK(put(c, "x"));
    struct pollfd p = { .fd = s, .events = POLLIN | POLLRDNORM };
    CHECK(poll(&p, 1, 2000) == 1);
    CHECK(p.revents == (POLLIN | POLLRDNORM), "revents 0x%x", p.revents);
    CHECK(drain(s) == 1);
    CHECK(poll(&p, 1, 100) == 0);
    close_all(2, c, s);
}

static void t_poll_chk(void)
{
    PAIR(c, s);
    CHECK(put(c, "x"));
    struct pollfd p[2] = { { .fd = s, .events = POLLIN }, { .fd = c, .events = POLLIN } };
    CHECK(__poll_chk(p, 2, 2000, sizeof(p)) == 1);
    CHECK(p[0].revents == POLLIN && p[1].revents == 0, "revents 0x%x 0x%x", p[0].revents, p[1].revents);
    close_all(2, c, s);
}

static void t_poll_wakes(void)
{
    PAIR(c, s);
    struct later l;
    write_later(&l, c, 200, "wake");
    struct pollfd p = { .fd = s, .events = POLLIN };
    int64_t t0 = now_ms();
    int n = poll(&p, 1, 5000);
    int64_t took = now_ms() - t0;
    pthread_join(l.thread, NULL);
    CHECK(n == 1 && (p.revents & POLLIN), "n %d revents 0x%x", n, p.revents);
    CHECK(took >= 150 && took < 2000, "took %lld ms", (long long)took);
    CHECK(drain(s) == 4);
    close_all(2, c, s);
}

static void t_poll_rdhup(void)
{
    PAIR(c, s);
    CHECK(shutdown(c, SHUT_WR) == 0);
    struct pollfd p = { .fd = s, .events = POLLIN | POLLRDHUP };
    CHECK(poll(&p, 1, 2000) == 1);
    CHECK((p.revents & (POLLIN | POLLRDHUP)) == (POLLIN | POLLRDHUP), "revents 0x%x", p.revents);
    char b;
    CHECK(read(s, &b, 1) == 0);
    /* The other direction still works, and c is not hung up. */
    CHECK(put(s, "y"));
    struct pollfd q = { .fd = c, .events = POLLIN | POLLRDHUP };
    CHECK(poll(&q, 1, 2000) == 1);
    CHECK(q.revents == POLLIN, "revents 0x%x", q.revents);
    close_all(2, c, s);
}

static void t_poll_listener(void)
{
    struct pollfd p = { .fd = listener, .events = POLLIN };
    CHECK(poll(&p, 1, 100) == 0, "listener readable with nothing pending");
    int c = connect_client();
    CHECK(c >= 0);
    CHECK(poll(&p, 1, 2000) == 1);
    CHECK(p.revents == POLLIN, "revents 0x%x", p.revents);
    int s = accept(listener, NULL, NULL);
    CHECK(s >= 0);
    CHECK(side_as_expected(s));
    CHECK(poll(&p, 1, 100) == 0, "listener still readable after accept");
    close_all(2, c, s);
}

static void t_poll_nval(void)
{
    PAIR(c, s);
    int closed = closed_fd();
    CHECK(closed >= 0);
    struct pollfd p[3] = {
        { .fd = s, .events = POLLIN },
        { .fd = closed, .events = POLLIN },
        { .fd = -1, .events = POLLIN },
    };
    int64_t t0 = now_ms();
    CHECK(poll(p, 3, 2000) == 1);
    CHECK(now_ms() - t0 < 500);
    CHECK(p[0].revents == 0 && p[1].revents == POLLNVAL && p[2].revents == 0, "revents 0x%x 0x%x 0x%x",
          p[0].revents, p[1].revents, p[2].revents);
    close_all(2, c, s);
}

static void t_poll_mixed(void)
{
    PAIR(c, s);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    struct pollfd p[3] = {
        { .fd = pipefd[0], .events = POLLIN },
        { .fd = s, .events = POLLIN },
        { .fd = c, .events = POLLIN },
    };
    CHECK(poll(p, 3, 100) == 0);
    struct later l;
    write_later(&l, pipefd[1], 100, "p");
    CHECK(poll(p, 3, 2000) == 1);
    pthread_join(l.thread, NULL);
    CHECK(p[0].revents == POLLIN && p[1].revents == 0 && p[2].revents == 0);
    char b;
    CHECK(read(pipefd[0], &b, 1) == 1);
    write_later(&l, c, 100, "s");
    CHECK(poll(p, 3, 2000) == 1);
    pthread_join(l.thread, NULL);
    CHECK(p[0].revents == 0 && p[1].revents == POLLIN && p[2].revents == 0);
    CHECK(put(s, "t") && put(pipefd[1], "q"));
    usleep(50000);
    CHECK(poll(p, 3, 2000) == 3, "all three ready");
    close_all(4, c, s, pipefd[0], pipefd[1]);
}

static volatile sig_atomic_t got_usr1;
static void on_usr1(int sig)
{
    (void)sig;
    got_usr1 = 1;
}

struct signal_later {
    pthread_t target;
    pthread_t thread;
};

static void *signal_main(void *arg)
{
    struct signal_later *sl = arg;
    usleep(200000);
    pthread_kill(sl->target, SIGUSR1);
    return NULL;
}

/* ppoll applies its mask atomically: a signal blocked outside is delivered inside and ends the call (EINTR). */
static void t_ppoll_sigmask(void)
{
    PAIR(c, s);
    struct sigaction sa = { .sa_handler = on_usr1 };
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    sigset_t block, old, during;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    during = old;
    sigdelset(&during, SIGUSR1);
    got_usr1 = 0;
    struct signal_later sl = { .target = pthread_self() };
    pthread_create(&sl.thread, NULL, signal_main, &sl);
    struct pollfd p = { .fd = s, .events = POLLIN };
    struct timespec ts = { 5, 0 };
    int64_t t0 = now_ms();
    int n = ppoll(&p, 1, &ts, &during);
    int e = errno;
    int64_t took = now_ms() - t0;
    pthread_join(sl.thread, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = e;
    CHECK(n == -1 && e == EINTR, "ppoll returned %d", n);
    CHECK(got_usr1 == 1);
    CHECK(took >= 150 && took < 2000, "took %lld ms", (long long)took);
    /* And with data ready, ppoll reports it at once. */
    CHECK(put(c, "x"));
    ts = (struct timespec){ 2, 0 };
    CHECK(ppoll(&p, 1, &ts, &during) == 1 && p.revents == POLLIN);
    close_all(2, c, s);
}

/* ---- select ---- */

static void t_select_basic(void)
{
    PAIR(c, s);
    CHECK(put(c, "x"));
    usleep(50000);
    fd_set r, w, e;
    FD_ZERO(&r);
    FD_ZERO(&w);
    FD_ZERO(&e);
    FD_SET(s, &r);
    FD_SET(c, &r);
    FD_SET(c, &w);
    FD_SET(s, &e);
    int nfds = (s > c ? s : c) + 1;
    struct timeval tv = { 2, 0 };
    CHECK(select(nfds, &r, &w, &e, &tv) == 2);
    CHECK(FD_ISSET(s, &r) && !FD_ISSET(c, &r) && FD_ISSET(c, &w) && !FD_ISSET(s, &e));
    CHECK(tv.tv_sec == 1 || tv.tv_sec == 2, "time left %ld s", (long)tv.tv_sec);
    close_all(2, c, s);
}

static void t_select_timeout(void)
{
    PAIR(c, s);
    fd_set r;
    FD_ZERO(&r);
    FD_SET(s, &r);
    struct timeval tv = { 0, 300000 };
    int64_t t0 = now_ms();
    CHECK(select(s + 1, &r, NULL, NULL, &tv) == 0);
    int64_t took = now_ms() - t0;
    CHECK(took >= 290 && took < 1000, "took %lld ms", (long long)took);
    CHECK(tv.tv_sec == 0 && tv.tv_usec == 0, "time left %ld.%06ld", (long)tv.tv_sec, (long)tv.tv_usec);
    CHECK(!FD_ISSET(s, &r));
    close_all(2, c, s);
}

static void t_select_ebadf(void)
{
    PAIR(c, s);
    int closed = closed_fd();
    CHECK(closed >= 0);
    fd_set r;
    FD_ZERO(&r);
    FD_SET(s, &r);
    FD_SET(closed, &r);
    struct timeval tv = { 1, 0 };
    int nfds = (s > closed ? s : closed) + 1;
    CHECK(select(nfds, &r, NULL, NULL, &tv) == -1 && errno == EBADF);
    close_all(2, c, s);
}

static void t_pselect_wakes(void)
{
    PAIR(c, s);
    struct later l;
    write_later(&l, c, 200, "x");
    fd_set r;
    FD_ZERO(&r);
    FD_SET(s, &r);
    struct timespec ts = { 5, 0 };
    int64_t t0 = now_ms();
    int n = pselect(s + 1, &r, NULL, NULL, &ts, NULL);
    int64_t took = now_ms() - t0;
    pthread_join(l.thread, NULL);
    CHECK(n == 1 && FD_ISSET(s, &r));
    CHECK(took >= 150 && took < 2000, "took %lld ms", (long long)took);
    close_all(2, c, s);
}

/* ---- epoll ---- */

static int ep_add(int ep, int fd, uint32_t events, uint64_t cookie)
{
    struct epoll_event ev = { .events = events, .data.u64 = cookie };
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static int ep_mod(int ep, int fd, uint32_t events, uint64_t cookie)
{
    struct epoll_event ev = { .events = events, .data.u64 = cookie };
    return epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

static void t_epoll_level(void)
{
    PAIR(c, s);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN, 0x5151) == 0);
    struct epoll_event ev[4];
    CHECK(epoll_wait(ep, ev, 4, 100) == 0);
    CHECK(put(c, "x"));
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1);
    CHECK(ev[0].events == EPOLLIN && ev[0].data.u64 == 0x5151, "events 0x%x data 0x%llx", ev[0].events,
          (unsigned long long)ev[0].data.u64);
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1, "level-triggered: reported again while unread");
    CHECK(drain(s) == 1);
    CHECK(epoll_wait(ep, ev, 4, 100) == 0);
    CHECK(ep_mod(ep, s, EPOLLIN | EPOLLOUT, 0x5252) == 0);
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1);
    CHECK(ev[0].events == EPOLLOUT && ev[0].data.u64 == 0x5252, "events 0x%x", ev[0].events);
    CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == 0);
    CHECK(epoll_wait(ep, ev, 4, 100) == 0);
    close_all(3, c, s, ep);
}

static void t_epoll_edge(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN | EPOLLET, 7) == 0);
    struct epoll_event ev[4];
    CHECK(put(c, "x"));
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1 && ev[0].events == EPOLLIN && ev[0].data.u64 == 7);
    CHECK(epoll_wait(ep, ev, 4, 200) == 0, "edge-triggered: no new edge while the data stays unread");
    CHECK(put(c, "y"));
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1, "new data is a new edge");
    CHECK(epoll_wait(ep, ev, 4, 200) == 0);
    CHECK(drain(s) == 2);
    close_all(3, c, s, ep);
}

static void t_epoll_oneshot(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN | EPOLLONESHOT, 9) == 0);
    struct epoll_event ev[4];
    CHECK(put(c, "x"));
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1 && ev[0].data.u64 == 9);
    CHECK(epoll_wait(ep, ev, 4, 200) == 0, "one-shot: disabled after one report");
    CHECK(put(c, "y"));
    CHECK(epoll_wait(ep, ev, 4, 200) == 0, "one-shot: still disabled with new data");
    CHECK(ep_mod(ep, s, EPOLLIN | EPOLLONESHOT, 10) == 0);
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1 && ev[0].data.u64 == 10, "re-armed with data pending");
    CHECK(epoll_wait(ep, ev, 4, 200) == 0);
    CHECK(ep_add(ep, s, EPOLLIN, 11) == -1 && errno == EEXIST, "a disabled registration still exists");
    close_all(3, c, s, ep);
}

static void t_epoll_rdhup(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN | EPOLLRDHUP, 1) == 0);
    struct epoll_event ev[2];
    CHECK(epoll_wait(ep, ev, 2, 100) == 0);
    CHECK(shutdown(c, SHUT_WR) == 0);
    CHECK(epoll_wait(ep, ev, 2, 2000) == 1);
    CHECK(ev[0].events == (EPOLLIN | EPOLLRDHUP), "events 0x%x", ev[0].events);
    close_all(3, c, s, ep);
}

static void t_epoll_hup(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    /* EPOLLHUP and EPOLLERR are reported without being asked for. */
    CHECK(ep_add(ep, s, EPOLLOUT, 1) == 0);
    struct epoll_event ev[2];
    CHECK(epoll_wait(ep, ev, 2, 2000) == 1 && ev[0].events == EPOLLOUT);
    CHECK(ep_mod(ep, s, 0, 2) == 0);
    CHECK(epoll_wait(ep, ev, 2, 100) == 0);
    close(c);
    CHECK(shutdown(s, SHUT_WR) == 0);
    CHECK(epoll_wait(ep, ev, 2, 2000) == 1);
    CHECK(ev[0].events & EPOLLHUP, "events 0x%x", ev[0].events);
    CHECK(!(ev[0].events & (EPOLLIN | EPOLLOUT)), "not asked for: events 0x%x", ev[0].events);
    close_all(2, s, ep);
}

/* Closing a registered socket takes it out of the set; a registration made through a dup'd fd lives on while
 * the socket has a name (the kernel keys registrations by file and fd). */
static void t_epoll_close(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    int d = dup(s);
    CHECK(d >= 0);
    CHECK(ep_add(ep, s, EPOLLIN, 1) == 0);
    CHECK(ep_add(ep, d, EPOLLIN, 2) == 0, "the same socket under another fd");
    struct epoll_event ev[4];
    CHECK(put(c, "x"));
    int n = epoll_wait(ep, ev, 4, 2000);
    CHECK(n == 2 && ev[0].data.u64 + ev[1].data.u64 == 3, "n %d", n);
    close(s);
    n = epoll_wait(ep, ev, 4, 2000);
    CHECK(n == 2, "both registrations stay while the socket has a name: n %d", n);
    CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == -1 && errno == EBADF);
    CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, d, NULL) == 0);
    n = epoll_wait(ep, ev, 4, 2000);
    CHECK(n == 1 && ev[0].data.u64 == 1, "n %d", n);
    close(d);
    /* The data is still unread: a registration left behind would report it. */
    CHECK(epoll_wait(ep, ev, 4, 200) == 0, "a closed socket is gone from the set");
    close_all(2, c, ep);
}

/* Another fd for the same epoll instance (dup) is the same set: same registrations, same events. */
static void t_epoll_dup_epfd(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN, 0x42) == 0);
    int ep2 = dup(ep);
    CHECK(ep2 >= 0);
    struct epoll_event ev[2];
    CHECK(epoll_wait(ep2, ev, 2, 100) == 0);
    CHECK(put(c, "x"));
    CHECK(epoll_wait(ep2, ev, 2, 2000) == 1 && ev[0].data.u64 == 0x42 && ev[0].events == EPOLLIN,
          "data 0x%llx events 0x%x", (unsigned long long)ev[0].data.u64, ev[0].events);
    close(ep);
    CHECK(ep_mod(ep2, s, EPOLLIN, 0x43) == 0);
    CHECK(epoll_wait(ep2, ev, 2, 2000) == 1 && ev[0].data.u64 == 0x43);
    close_all(3, c, s, ep2);
}

static void t_epoll_two_sets(void)
{
    PAIR(c, s);
    int e1 = epoll_create1(0), e2 = epoll_create1(0);
    CHECK(e1 >= 0 && e2 >= 0);
    CHECK(ep_add(e1, s, EPOLLIN, 1) == 0);
    CHECK(ep_add(e2, s, EPOLLIN | EPOLLET, 2) == 0);
    struct epoll_event ev[2];
    CHECK(put(c, "x"));
    CHECK(epoll_wait(e1, ev, 2, 2000) == 1 && ev[0].data.u64 == 1);
    CHECK(epoll_wait(e2, ev, 2, 2000) == 1 && ev[0].data.u64 == 2);
    CHECK(epoll_ctl(e1, EPOLL_CTL_DEL, s, NULL) == 0);
    CHECK(epoll_wait(e1, ev, 2, 100) == 0);
    CHECK(put(c, "y"));
    CHECK(epoll_wait(e2, ev, 2, 2000) == 1 && ev[0].data.u64 == 2, "the other set is untouched");
    close(e1);
    CHECK(put(c, "z"));
    CHECK(epoll_wait(e2, ev, 2, 2000) == 1 && ev[0].data.u64 == 2, "closing one set leaves the other");
    close_all(3, c, s, e2);
}

static void t_epoll_nested(void)
{
    PAIR(c, s);
    int inner = epoll_create1(0), outer = epoll_create1(0);
    CHECK(inner >= 0 && outer >= 0);
    CHECK(ep_add(inner, s, EPOLLIN, 0xabc) == 0);
    CHECK(ep_add(outer, inner, EPOLLIN, 0xdef) == 0);
    struct epoll_event ev[2];
    CHECK(epoll_wait(outer, ev, 2, 100) == 0);
    struct later l;
    write_later(&l, c, 100, "x");
    CHECK(epoll_wait(outer, ev, 2, 2000) == 1 && ev[0].data.u64 == 0xdef);
    pthread_join(l.thread, NULL);
    CHECK(epoll_wait(inner, ev, 2, 0) == 1 && ev[0].data.u64 == 0xabc && ev[0].events == EPOLLIN);
    CHECK(drain(s) == 1);
    CHECK(epoll_wait(outer, ev, 2, 100) == 0, "outer set quiet once the socket is drained");
    close_all(4, c, s, inner, outer);
}

static void t_epoll_in_poll(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN, 3) == 0);
    struct pollfd p = { .fd = ep, .events = POLLIN };
    CHECK(poll(&p, 1, 100) == 0);
    struct later l;
    write_later(&l, c, 100, "x");
    CHECK(poll(&p, 1, 2000) == 1 && p.revents == POLLIN);
    pthread_join(l.thread, NULL);
    struct epoll_event ev[2];
    CHECK(epoll_wait(ep, ev, 2, 0) == 1 && ev[0].data.u64 == 3);
    close_all(3, c, s, ep);
}

static void t_epoll_mixed(void)
{
    PAIR(c, s);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, pipefd[0], EPOLLIN, 100) == 0);
    CHECK(ep_add(ep, s, EPOLLIN, 200) == 0);
    struct epoll_event ev[4];
    CHECK(put(pipefd[1], "p"));
    CHECK(epoll_wait(ep, ev, 4, 2000) == 1 && ev[0].data.u64 == 100);
    CHECK(put(c, "s"));
    usleep(50000);
    int n = epoll_wait(ep, ev, 4, 2000);
    CHECK(n == 2, "got %d events", n);
    CHECK(ev[0].data.u64 + ev[1].data.u64 == 300);
    close_all(5, c, s, pipefd[0], pipefd[1], ep);
}

static void t_epoll_maxevents(void)
{
    int c[3], s[3];
    for (int i = 0; i < 3; i++) {
        if (!make_pair(&c[i], &s[i]))
            return;
        CHECK(put(c[i], "x"));
    }
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    for (int i = 0; i < 3; i++)
        CHECK(ep_add(ep, s[i], EPOLLIN, (uint64_t)i) == 0);
    usleep(50000);
    unsigned seen = 0;
    struct epoll_event ev[2];
    for (int round = 0; round < 3; round++) {
        int n = epoll_wait(ep, ev, 2, 2000);
        CHECK(n >= 1 && n <= 2, "round %d: %d events", round, n);
        for (int i = 0; i < n; i++)
            seen |= 1u << ev[i].data.u64;
    }
    CHECK(seen == 7, "every socket reported within three calls of two events (seen 0x%x)", seen);
    for (int i = 0; i < 3; i++)
        close_all(2, c[i], s[i]);
    close(ep);
}

static void t_epoll_ctl_errors(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN, 1) == 0);
    CHECK(ep_add(ep, s, EPOLLIN, 1) == -1 && errno == EEXIST);
    CHECK(ep_mod(ep, c, EPOLLIN, 1) == -1 && errno == ENOENT);
    CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL) == -1 && errno == ENOENT);
    CHECK(ep_add(ep, ep, EPOLLIN, 1) == -1 && errno == EINVAL);
    CHECK(ep_add(ep, c, EPOLLIN | EPOLLEXCLUSIVE, 2) == 0);
    CHECK(ep_mod(ep, c, EPOLLIN, 2) == -1 && errno == EINVAL, "MOD of an exclusive registration");
    CHECK(ep_mod(ep, s, EPOLLIN | EPOLLEXCLUSIVE, 2) == -1 && errno == EINVAL);
    struct epoll_event any = { .events = EPOLLIN };
    CHECK(epoll_ctl(ep, 99, s, &any) == -1 && errno == EINVAL);
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, NULL) == -1 && errno == EFAULT);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    CHECK(ep_add(pipefd[0], s, EPOLLIN, 1) == -1 && errno == EINVAL, "not an epoll fd");
    close_all(2, pipefd[0], pipefd[1]);
    CHECK(ep_add(closed_fd(), s, EPOLLIN, 1) == -1 && errno == EBADF, "epoll fd not open");
    struct epoll_event ev[2];
    CHECK(epoll_wait(ep, ev, 0, 0) == -1 && errno == EINVAL);
    close_all(3, c, s, ep);
}

struct waiter {
    int ep;
    int n;
    int64_t took;
    struct epoll_event ev[2];
    pthread_t thread;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    int64_t t0 = now_ms();
    w->n = epoll_wait(w->ep, w->ev, 2, 5000);
    w->took = now_ms() - t0;
    return NULL;
}

/* A thread already asleep in epoll_wait sees a socket another thread adds. */
static void t_epoll_threads(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct waiter w = { .ep = ep };
    pthread_create(&w.thread, NULL, waiter_main, &w);
    usleep(200000);
    CHECK(put(c, "x"));
    int rc = ep_add(ep, s, EPOLLIN, 0x77);
    pthread_join(w.thread, NULL);
    CHECK(rc == 0);
    CHECK(w.n == 1 && w.ev[0].data.u64 == 0x77, "n %d", w.n);
    CHECK(w.took < 2000, "took %lld ms", (long long)w.took);
    close_all(3, c, s, ep);
}

static void t_epoll_timeouts(void)
{
    PAIR(c, s);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN, 1) == 0);
    struct epoll_event ev[2];
    int64_t t0 = now_ms();
    CHECK(epoll_wait(ep, ev, 2, 250) == 0);
    int64_t took = now_ms() - t0;
    CHECK(took >= 240 && took < 1000, "epoll_wait took %lld ms", (long long)took);
    t0 = now_ms();
    CHECK(epoll_pwait(ep, ev, 2, 250, NULL) == 0);
    took = now_ms() - t0;
    CHECK(took >= 240 && took < 1000, "epoll_pwait took %lld ms", (long long)took);
    struct timespec ts = { 0, 250000000 };
    t0 = now_ms();
    int n = epoll_pwait2(ep, ev, 2, &ts, NULL);
    took = now_ms() - t0;
    if (n == -1 && errno == ENOSYS) {
        printf("# epoll_pwait2: not supported by this kernel\n");
    } else {
        CHECK(n == 0);
        CHECK(took >= 240 && took < 1000, "epoll_pwait2 took %lld ms", (long long)took);
        struct later l;
        write_later(&l, c, 100, "x");
        ts = (struct timespec){ 5, 0 };
        n = epoll_pwait2(ep, ev, 2, &ts, NULL);
        pthread_join(l.thread, NULL);
        CHECK(n == 1 && ev[0].data.u64 == 1);
    }
    close_all(3, c, s, ep);
}

/* ---- cost of waiting ---- */

static void t_idle_cpu(void)
{
    PAIR(c, s);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    CHECK(ep_add(ep, s, EPOLLIN, 1) == 0 && ep_add(ep, pipefd[0], EPOLLIN, 2) == 0);
    int64_t cpu0 = cpu_ms(), t0 = now_ms();
    struct pollfd p[2] = { { .fd = s, .events = POLLIN }, { .fd = pipefd[0], .events = POLLIN } };
    CHECK(poll(p, 2, 1000) == 0);
    fd_set r;
    FD_ZERO(&r);
    FD_SET(s, &r);
    FD_SET(pipefd[0], &r);
    struct timeval tv = { 1, 0 };
    CHECK(select((s > pipefd[0] ? s : pipefd[0]) + 1, &r, NULL, NULL, &tv) == 0);
    struct epoll_event ev[2];
    CHECK(epoll_wait(ep, ev, 2, 1000) == 0);
    int64_t cpu = cpu_ms() - cpu0, took = now_ms() - t0;
    CHECK(took >= 2950, "three 1 s waits took %lld ms", (long long)took);
    /* Whole process: includes rdmasock's progress thread when preloaded. */
    CHECK(cpu < 150, "%lld ms of CPU in 3 s of idle waiting", (long long)cpu);
    printf("# idle: %lld ms CPU over %lld ms of poll+select+epoll_wait\n", (long long)cpu, (long long)took);
    close_all(5, c, s, pipefd[0], pipefd[1], ep);
}

/*
 * The socket has unread data that another waiter (an epoll set watching EPOLLIN) is interested in, while this
 * wait asks for something that never comes (POLLPRI). The shared readiness must not make this wait spin.
 */
static void t_no_spin_for_others(void)
{
    PAIR(c, s);
    int watcher = epoll_create1(0), quiet = epoll_create1(0);
    CHECK(watcher >= 0 && quiet >= 0);
    CHECK(ep_add(watcher, s, EPOLLIN, 1) == 0);
    CHECK(ep_add(quiet, s, EPOLLPRI, 2) == 0);
    CHECK(put(c, "unread"));
    usleep(50000);
    int64_t cpu0 = cpu_ms(), t0 = now_ms();
    struct epoll_event ev[2];
    CHECK(epoll_wait(quiet, ev, 2, 1000) == 0);
    struct pollfd p = { .fd = s, .events = POLLPRI };
    CHECK(poll(&p, 1, 1000) == 0);
    int64_t cpu = cpu_ms() - cpu0, took = now_ms() - t0;
    CHECK(took >= 1950, "took %lld ms", (long long)took);
    CHECK(cpu < 150, "%lld ms of CPU in 2 s of waiting for nothing", (long long)cpu);
    CHECK(epoll_wait(watcher, ev, 2, 0) == 1, "the other waiter still sees its data");
    printf("# waiting beside a ready socket: %lld ms CPU over %lld ms\n", (long long)cpu, (long long)took);
    close_all(4, c, s, watcher, quiet);
}

/* ---- processes ---- */

/* Child: waits for a connection on the inherited listener (with poll, or with an epoll set made before the
 * fork), accepts and echoes one byte. Exit status 0 on success. */
static int child_serve(int ep, int ready_fd)
{
    struct pollfd p = { .fd = listener, .events = POLLIN };
    struct epoll_event ev;
    /* A first look makes the listener this process's own (rdmasock revives it here), then the parent may
     * connect. */
    if (ep >= 0)
        epoll_wait(ep, &ev, 1, 0);
    else
        poll(&p, 1, 0);
    if (write(ready_fd, "r", 1) != 1)
        return 10;
    int n = ep >= 0 ? epoll_wait(ep, &ev, 1, 5000) : poll(&p, 1, 5000);
    if (n != 1)
        return 11;
    if (ep >= 0 ? ev.data.u64 != 0x1157 : p.revents != POLLIN)
        return 12;
    int s = accept(listener, NULL, NULL);
    if (s < 0)
        return 13;
    struct pollfd q = { .fd = s, .events = POLLIN };
    char b;
    if (poll(&q, 1, 5000) != 1 || read(s, &b, 1) != 1 || write(s, &b, 1) != 1)
        return 14;
    close(s);
    return 0;
}

/* Parent side of a fork case: connects and expects the child's echo. */
static void talk_to_child(int ready_fd)
{
    char r;
    CHECK(read(ready_fd, &r, 1) == 1, "child ready");
    int c = connect_client();
    CHECK(c >= 0);
    bool converted = side_as_expected(c);
    bool sent = put(c, "e");
    struct pollfd p = { .fd = c, .events = POLLIN };
    char b = 0;
    bool echoed = poll(&p, 1, 5000) == 1 && read(c, &b, 1) == 1 && b == 'e';
    close(c);
    CHECK(converted);
    CHECK(sent);
    CHECK(echoed, "echo from the child");
}

static void fork_case(bool use_epoll)
{
    int ep = -1;
    if (use_epoll) {
        ep = epoll_create1(0);
        CHECK(ep >= 0);
        CHECK(ep_add(ep, listener, EPOLLIN, 0x1157) == 0);
    }
    int sync[2];
    CHECK(pipe(sync) == 0);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(sync[0]);
        _exit(child_serve(ep, sync[1]));
    }
    close(sync[1]);
    talk_to_child(sync[0]);
    close(sync[0]);
    if (current_failed)
        kill(pid, SIGKILL);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(current_failed || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "child status 0x%x", status);
    if (ep >= 0)
        close(ep);
    /* The parent waits on the listener again: rdmasock revives it here for the next checks. */
    struct pollfd p = { .fd = listener, .events = POLLIN };
    poll(&p, 1, 0);
}

static void t_fork_poll_listener(void) { fork_case(false); }
static void t_fork_epoll_listener(void) { fork_case(true); }

/* A client that connects right after the fork, before any process has looked at the listener again: a kernel
 * listener keeps its backlog across fork, so the connection waits for the child (which starts 200 ms late). */
static void t_fork_connect_first(void)
{
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        usleep(200000);
        struct pollfd p = { .fd = listener, .events = POLLIN };
        if (poll(&p, 1, 5000) != 1)
            _exit(11);
        int s = accept(listener, NULL, NULL);
        if (s < 0)
            _exit(13);
        struct pollfd q = { .fd = s, .events = POLLIN };
        char b;
        if (poll(&q, 1, 5000) != 1 || read(s, &b, 1) != 1 || write(s, &b, 1) != 1)
            _exit(14);
        close(s);
        _exit(0);
    }
    int c = connect_client();
    CHECK(c >= 0);
    bool converted = side_as_expected(c);
    bool sent = put(c, "f");
    struct pollfd p = { .fd = c, .events = POLLIN };
    char b = 0;
    bool echoed = poll(&p, 1, 5000) == 1 && read(c, &b, 1) == 1 && b == 'f';
    close(c);
    if (current_failed || !echoed)
        kill(pid, SIGKILL);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(converted);
    CHECK(sent);
    CHECK(echoed, "echo from the child that listened late");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
    struct pollfd lp = { .fd = listener, .events = POLLIN };
    poll(&lp, 1, 0);
}

/* ---- main ---- */

struct check {
    const char *name;
    void (*fn)(void);
};

static const struct check checks[] = {
    { "poll_pollout", t_poll_pollout },
    { "poll_timeout", t_poll_timeout },
    { "poll_pollin", t_poll_pollin },
    { "poll_chk", t_poll_chk },
    { "poll_wakes", t_poll_wakes },
    { "poll_rdhup", t_poll_rdhup },
    { "poll_listener", t_poll_listener },
    { "poll_nval", t_poll_nval },
    { "poll_mixed", t_poll_mixed },
    { "ppoll_sigmask", t_ppoll_sigmask },
    { "select_basic", t_select_basic },
    { "select_timeout", t_select_timeout },
    { "select_ebadf", t_select_ebadf },
    { "pselect_wakes", t_pselect_wakes },
    { "epoll_level", t_epoll_level },
    { "epoll_edge", t_epoll_edge },
    { "epoll_oneshot", t_epoll_oneshot },
    { "epoll_rdhup", t_epoll_rdhup },
    { "epoll_hup", t_epoll_hup },
    { "epoll_close", t_epoll_close },
    { "epoll_dup_epfd", t_epoll_dup_epfd },
    { "epoll_two_sets", t_epoll_two_sets },
    { "epoll_nested", t_epoll_nested },
    { "epoll_in_poll", t_epoll_in_poll },
    { "epoll_mixed", t_epoll_mixed },
    { "epoll_maxevents", t_epoll_maxevents },
    { "epoll_ctl_errors", t_epoll_ctl_errors },
    { "epoll_threads", t_epoll_threads },
    { "epoll_timeouts", t_epoll_timeouts },
    { "idle_cpu", t_idle_cpu },
    { "no_spin_for_others", t_no_spin_for_others },
    { "fork_poll_listener", t_fork_poll_listener },
    { "fork_epoll_listener", t_fork_epoll_listener },
    { "fork_connect_first", t_fork_connect_first },
};

static void on_alarm(int sig)
{
    (void)sig;
    static const char prefix[] = "FAIL ";
    static const char suffix[] = ": hung for 30 s\n";
    if (write(STDOUT_FILENO, prefix, sizeof(prefix) - 1) < 0 ||
        write(STDOUT_FILENO, current, strlen(current)) < 0 || write(STDOUT_FILENO, suffix, sizeof(suffix) - 1) < 0)
        _exit(3);
    _exit(2);
}

static void usage(void)
{
    fprintf(stderr, "usage: waitcheck --port PORT [--expect sdp|kernel] [--only NAME] [--hold]\n");
    exit(64);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    bool hold = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc) {
            port = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--expect") && i + 1 < argc) {
            i++;
            if (!strcmp(argv[i], "sdp"))
                expect = EXPECT_SDP;
            else if (!strcmp(argv[i], "kernel"))
                expect = EXPECT_KERNEL;
            else
                usage();
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--hold")) {
            hold = true;
        } else {
            usage();
        }
    }
    if (port <= 0 || port > 65535)
        usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = { .sa_handler = on_alarm };
    sigaction(SIGALRM, &sa, NULL);

    current = "listener";
    listener = open_listener();
    if (listener < 0) {
        printf("FAIL listener: cannot listen on 127.0.0.1:%d: %s\n", port, strerror(errno));
        return 1;
    }
    if (!side_as_expected(listener)) {
        printf("FAIL listener: the listener is %s, expected %s\n", has_sdp_side(listener) ? "SDP" : "kernel",
               expect == EXPECT_SDP ? "SDP" : "kernel");
        return 1;
    }

    size_t planned = 0;
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++)
        planned += !only || !strcmp(only, checks[i].name);
    printf("PLAN %zu\n", planned);      /* lets the caller notice a run that died half-way */

    int ran = 0;
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
        if (only && strcmp(only, checks[i].name))
            continue;
        current = checks[i].name;
        current_failed = false;
        alarm(30);
        checks[i].fn();
        alarm(0);
        ran++;
        if (current_failed)
            failures++;
        else
            printf("PASS %s\n", current);
    }
    if (ran == 0) {
        printf("FAIL %s: no such check\n", only);
        return 1;
    }

    if (hold) {
        current = "hold";
        int c, s;
        if (!make_pair(&c, &s))
            return 1;
        printf("HOLD %d\n", (int)getpid());
        char b;
        while (read(STDIN_FILENO, &b, 1) > 0)
            ;
        close_all(2, c, s);
    }
    close(listener);
    return failures ? 1 : 0;
}
