/*
 * sockcheck: socket-call semantics an unmodified program relies on, checked through whatever socket layer the
 * process has (the kernel, or rdmasock when preloaded). Prints TAP lines "ok/not ok - NAME"; the suite
 * (tests/suites/intercept_core.sh) runs it with and without the preload and checks the statistics area too.
 *
 *   sockcheck local PORT            server and client threads in this process, ports PORT..PORT+9
 *   sockcheck serve PORT COUNT      a plain echo server for COUNT connections (run without the preload: the peer
 *                                   that does not run rdmasock)
 *   sockcheck client HOST PORT MODE [HOLD]
 *                                   connect to HOST:PORT, send 1 MiB of a pattern, expect it echoed back, then keep
 *                                   the connection HOLD seconds; MODE ok | refused (expects ECONNREFUSED)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int failures;

static long long mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

#define CHECK(cond, name)                                                                                      \
    do {                                                                                                       \
        if (cond) {                                                                                            \
            printf("ok - %s\n", name);                                                                         \
        } else {                                                                                               \
            printf("not ok - %s (%s:%d errno %d %s)\n", name, __FILE__, __LINE__, errno, strerror(errno));     \
            failures++;                                                                                        \
        }                                                                                                      \
        fflush(stdout);                                                                                        \
    } while (0)

static uint8_t pattern_byte(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static bool write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static bool read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static struct sockaddr_in addr4(const char *host, int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, host, &a.sin_addr);
    return a;
}

static int listen_on(int family, int port)
{
    int fd = socket(family, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int r;
    if (family == AF_INET6) {
        struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port) };
        a.sin6_addr = in6addr_loopback;
        r = bind(fd, (struct sockaddr *)&a, sizeof(a));
    } else {
        struct sockaddr_in a = addr4("127.0.0.1", port);
        r = bind(fd, (struct sockaddr *)&a, sizeof(a));
    }
    if (r != 0 || listen(fd, 16) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Echoes one connection until EOF. */
static void echo(int c)
{
    char buf[65536];
    for (;;) {
        ssize_t n = read(c, buf, sizeof(buf));
        if (n <= 0)
            break;
        if (!write_all(c, buf, (size_t)n))
            break;
    }
}

struct server_args {
    int lfd;
    int count;
    /* The first accepted connection's names, as accept, getsockname and getpeername give them. */
    struct sockaddr_in from_accept, local, peer;
    bool names_taken;
};

static void *server_thread(void *arg)
{
    struct server_args *a = arg;
    for (int i = 0; i < a->count; i++) {
        socklen_t fl = sizeof(a->from_accept), ll = sizeof(a->local), pl = sizeof(a->peer);
        int c = accept(a->lfd, i == 0 ? (struct sockaddr *)&a->from_accept : NULL, i == 0 ? &fl : NULL);
        if (c < 0)
            break;
        if (i == 0 && getsockname(c, (struct sockaddr *)&a->local, &ll) == 0 &&
            getpeername(c, (struct sockaddr *)&a->peer, &pl) == 0)
            __atomic_store_n(&a->names_taken, true, __ATOMIC_RELEASE);
        echo(c);
        close(c);
    }
    return NULL;
}

/* A thread that reads fd without blocking until a call fails with EBADF (the fd was closed under it): the data
 * calls in flight when the last name closes (isock.c, rs_isock_io_begin). A call that runs between rdmasock
 * forgetting the fd and the kernel closing it reaches the kernel socket behind the SDP connection, which is not
 * connected: ENOTCONN, where Linux says EAGAIN. Tolerated (forgetting the fd after closing it could misroute a new
 * fd that reuses the number); anything else is counted in `unexpected`. */
struct spin_reader {
    int fd;
    size_t bytes;
    int error;
    int unexpected;
};

static void *spin_reader(void *arg)
{
    struct spin_reader *r = arg;
    char b[64];
    for (;;) {
        ssize_t n = recv(r->fd, b, sizeof(b), MSG_DONTWAIT);
        if (n > 0) {
            r->bytes += (size_t)n;
        } else if (n == 0 || errno == EBADF) {
            r->error = n == 0 ? 0 : errno;
            return NULL;
        } else if (errno != EAGAIN && errno != ENOTCONN) {
            r->unexpected = errno;
        }
    }
}

/* Sends len pattern bytes and reads them back, concurrently enough for any buffer size. */
static bool echo_roundtrip(int fd, size_t len)
{
    uint8_t *out = malloc(len), *in = malloc(len);
    for (size_t i = 0; i < len; i++)
        out[i] = pattern_byte(i);
    size_t sent = 0, got = 0;
    bool ok = true;
    while (got < len && ok) {
        struct pollfd p = { .fd = fd, .events = POLLIN | (sent < len ? POLLOUT : 0) };
        if (poll(&p, 1, 10000) <= 0) {
            fprintf(stderr, "echo: poll timed out: sent %zu got %zu of %zu\n", sent, got, len);
            ok = false;
            break;
        }
        if ((p.revents & POLLOUT) && sent < len) {
            ssize_t n = send(fd, out + sent, len - sent < 65536 ? len - sent : 65536, MSG_DONTWAIT);
            if (n > 0)
                sent += (size_t)n;
            else if (n < 0 && errno != EAGAIN) {
                fprintf(stderr, "echo: send: %s\n", strerror(errno));
                ok = false;
            }
        }
        if (p.revents & POLLIN) {
            ssize_t n = recv(fd, in + got, len - got, MSG_DONTWAIT);
            if (n > 0)
                got += (size_t)n;
            else if (n == 0 || errno != EAGAIN) {
                fprintf(stderr, "echo: recv %zd: %s\n", n, strerror(errno));
                ok = false;
            }
        }
    }
    if (ok && memcmp(in, out, len) != 0) {
        fprintf(stderr, "echo: data differs\n");
        ok = false;
    }
    free(out);
    free(in);
    return ok;
}

static int run_local(int port)
{
    /* 1. blocking connect/accept, echo with integrity, names */
    int l = listen_on(AF_INET, port);
    CHECK(l >= 0, "listen on 127.0.0.1");
    struct server_args sa = { .lfd = l, .count = 3 };
    pthread_t th;
    pthread_create(&th, NULL, server_thread, &sa);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in dst = addr4("127.0.0.1", port);
    CHECK(connect(c, (struct sockaddr *)&dst, sizeof(dst)) == 0, "blocking connect");
    struct sockaddr_in peer;
    socklen_t plen = sizeof(peer);
    CHECK(getpeername(c, (struct sockaddr *)&peer, &plen) == 0 && peer.sin_port == htons((uint16_t)port) &&
              peer.sin_addr.s_addr == dst.sin_addr.s_addr, "getpeername is the server");
    CHECK(connect(c, (struct sockaddr *)&dst, sizeof(dst)) == -1 && errno == EISCONN, "second connect: EISCONN");
    CHECK(echo_roundtrip(c, 4 << 20), "4 MiB echoed intact");
    /* Both ends name the same connection, as TCP's four-tuple does (the server has accepted: the echo came back). */
    struct sockaddr_in me;
    socklen_t mlen = sizeof(me);
    CHECK(getsockname(c, (struct sockaddr *)&me, &mlen) == 0 && mlen == sizeof(me) && me.sin_family == AF_INET &&
              me.sin_port != 0 && me.sin_addr.s_addr == dst.sin_addr.s_addr,
          "client getsockname: a real local address and port");
    CHECK(__atomic_load_n(&sa.names_taken, __ATOMIC_ACQUIRE), "server took the accepted socket's names");
    CHECK(sa.peer.sin_port == me.sin_port && sa.peer.sin_addr.s_addr == me.sin_addr.s_addr &&
              sa.from_accept.sin_port == me.sin_port && sa.from_accept.sin_addr.s_addr == me.sin_addr.s_addr,
          "server's getpeername and accept's address are the client's getsockname");
    CHECK(sa.local.sin_port == htons((uint16_t)port) && sa.local.sin_addr.s_addr == dst.sin_addr.s_addr,
          "server's getsockname is the listening address");
    int one = 1;
    CHECK(setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0, "TCP_NODELAY set");
    int v = 0;
    socklen_t vl = sizeof(v);
    CHECK(getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, &vl) == 0 && v == 1, "TCP_NODELAY reads back");
    vl = sizeof(v);
    CHECK(getsockopt(c, SOL_SOCKET, SO_TYPE, &v, &vl) == 0 && v == SOCK_STREAM, "SO_TYPE");

    /* 2. nonblocking reads: EAGAIN, FIONREAD */
    int fl = fcntl(c, F_GETFL);
    CHECK(fcntl(c, F_SETFL, fl | O_NONBLOCK) == 0 && (fcntl(c, F_GETFL) & O_NONBLOCK), "O_NONBLOCK set");
    char b[16];
    CHECK(recv(c, b, sizeof(b), 0) == -1 && errno == EAGAIN, "empty nonblocking recv: EAGAIN");
    CHECK(write(c, "abcdef", 6) == 6, "write 6 bytes");
    struct pollfd p = { .fd = c, .events = POLLIN };
    CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "poll: echo readable");
    int avail = -1;
    for (int i = 0; i < 100 && avail < 6; i++) {
        ioctl(c, FIONREAD, &avail);
        if (avail < 6)
            usleep(10000);
    }
    CHECK(avail == 6, "FIONREAD counts the echoed bytes");
    CHECK(recv(c, b, 3, MSG_PEEK) == 3 && memcmp(b, "abc", 3) == 0, "MSG_PEEK");
    CHECK(read(c, b, 6) == 6 && memcmp(b, "abcdef", 6) == 0, "read after peek");
    fcntl(c, F_SETFL, fl);

    /* 3. dup: one socket, two names; closing one keeps the connection */
    int d = dup(c);
    CHECK(d >= 0, "dup");
    CHECK(close(c) == 0, "close the first name");
    CHECK(write(d, "xyz", 3) == 3 && read_all(d, b, 3) && memcmp(b, "xyz", 3) == 0, "the dup still works");
    int d2 = dup2(d, 200);
    CHECK(d2 == 200 && close(d) == 0, "dup2 to 200, close the dup");
    CHECK(write(200, "q", 1) == 1 && read_all(200, b, 1) && b[0] == 'q', "fd 200 still works");

    /* 4. half-close: shutdown(SHUT_WR) -> the echo server sees EOF and closes -> we read 0 */
    CHECK(shutdown(200, SHUT_WR) == 0, "shutdown SHUT_WR");
    CHECK(read(200, b, 1) == 0, "end of stream after the server closes");
    close(200);

    /* 5. nonblocking connect: EINPROGRESS then POLLOUT and SO_ERROR 0 */
    c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = connect(c, (struct sockaddr *)&dst, sizeof(dst));
    CHECK(r == 0 || errno == EINPROGRESS, "nonblocking connect: 0 or EINPROGRESS");
    p.fd = c;
    p.events = POLLOUT;
    CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLOUT), "POLLOUT when connected");
    int err = -1;
    vl = sizeof(err);
    CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &vl) == 0 && err == 0, "SO_ERROR 0");
    fcntl(c, F_SETFL, 0);
    CHECK(echo_roundtrip(c, 100000), "echo after nonblocking connect");
    close(c);

    /* 6. accept4 flags */
    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(c, (struct sockaddr *)&dst, sizeof(dst)) == 0, "connect for the echo thread's last turn");
    CHECK(echo_roundtrip(c, 1000), "third echo");
    close(c);
    pthread_join(th, NULL);

    /* Nothing queued: a nonblocking accept says EAGAIN at once; a blocking one waits SO_RCVTIMEO, then EAGAIN. */
    int lfl = fcntl(l, F_GETFL);
    fcntl(l, F_SETFL, lfl | O_NONBLOCK);
    long long t0 = mono_ms();
    CHECK(accept(l, NULL, NULL) == -1 && errno == EAGAIN, "nonblocking accept with nothing queued: EAGAIN");
    CHECK(mono_ms() - t0 < 1000, "nonblocking accept does not wait");
    fcntl(l, F_SETFL, lfl);
    struct timeval tmo = { 0, 150000 };
    CHECK(setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo)) == 0, "SO_RCVTIMEO on the listener");
    t0 = mono_ms();
    int ta = accept(l, NULL, NULL);
    long long waited = mono_ms() - t0;
    CHECK(ta == -1 && errno == EAGAIN && waited >= 140 && waited < 5000, "blocking accept times out after SO_RCVTIMEO");
    struct timeval no_tmo = { 0, 0 };
    setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &no_tmo, sizeof(no_tmo));

    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(c, (struct sockaddr *)&dst, sizeof(dst)) == 0, "connect to a listener nobody accepts yet");
    struct sockaddr_in from;
    socklen_t fl2 = sizeof(from);
    int a = accept4(l, (struct sockaddr *)&from, &fl2, SOCK_NONBLOCK | SOCK_CLOEXEC);
    CHECK(a >= 0 && from.sin_family == AF_INET && from.sin_addr.s_addr == htonl(INADDR_LOOPBACK),
          "accept4 returns the peer");
    CHECK((fcntl(a, F_GETFL) & O_NONBLOCK) && (fcntl(a, F_GETFD) & FD_CLOEXEC), "accept4 flags applied");
    CHECK(recv(a, b, 1, 0) == -1 && errno == EAGAIN, "accepted socket is nonblocking");
    /* abortive close with unread data: the peer gets ECONNRESET */
    CHECK(write(c, "unread", 6) == 6, "write data the peer will not read");
    usleep(100000);
    CHECK(close(a) == 0, "close with unread data");
    p.fd = c;
    p.events = POLLIN;
    poll(&p, 1, 5000);
    ssize_t n = read(c, b, 1);
    CHECK(n == -1 && errno == ECONNRESET, "peer sees ECONNRESET");
    close(c);
    close(l);

    /* 7. IPv6 loopback and a v4-mapped connect to a dual-stack listener */
    l = listen_on(AF_INET6, port + 1);
    CHECK(l >= 0, "listen on ::1");
    sa.lfd = l;
    sa.count = 1;
    pthread_create(&th, NULL, server_thread, &sa);
    c = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 d6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)(port + 1)) };
    d6.sin6_addr = in6addr_loopback;
    CHECK(connect(c, (struct sockaddr *)&d6, sizeof(d6)) == 0 && echo_roundtrip(c, 300000), "IPv6 echo");
    struct sockaddr_in6 p6;
    socklen_t p6l = sizeof(p6);
    CHECK(getpeername(c, (struct sockaddr *)&p6, &p6l) == 0 && p6l == sizeof(p6) && p6.sin6_family == AF_INET6,
          "IPv6 getpeername");
    close(c);
    pthread_join(th, NULL);
    close(l);

    int l6 = socket(AF_INET6, SOCK_STREAM, 0);
    int zero = 0;
    setsockopt(l6, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    setsockopt(l6, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)(port + 2)) };
    CHECK(bind(l6, (struct sockaddr *)&any6, sizeof(any6)) == 0 && listen(l6, 4) == 0, "dual-stack listener");
    sa.lfd = l6;
    pthread_create(&th, NULL, server_thread, &sa);
    c = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 mapped = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)(port + 2)) };
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped.sin6_addr);
    CHECK(connect(c, (struct sockaddr *)&mapped, sizeof(mapped)) == 0 && echo_roundtrip(c, 200000),
          "v4-mapped echo");
    p6l = sizeof(p6);
    CHECK(getpeername(c, (struct sockaddr *)&p6, &p6l) == 0 && IN6_IS_ADDR_V4MAPPED(&p6.sin6_addr),
          "v4-mapped getpeername");
    close(c);
    pthread_join(th, NULL);
    close(l6);

    /* 8. connect to a port nobody listens on: ECONNREFUSED, as the kernel */
    c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in none = addr4("127.0.0.1", port + 3);
    CHECK(connect(c, (struct sockaddr *)&none, sizeof(none)) == -1 && errno == ECONNREFUSED,
          "nobody listening: ECONNREFUSED");
    close(c);

    /* 9. accept with no fd to give: EMFILE, and the connection stays queued for the next accept, as in Linux */
    l = listen_on(AF_INET, port + 4);
    c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in d9 = addr4("127.0.0.1", port + 4);
    CHECK(l >= 0 && connect(c, (struct sockaddr *)&d9, sizeof(d9)) == 0, "connect for the EMFILE check");
    int lowest_free = dup(0);
    close(lowest_free);
    struct rlimit old_limit, tight;
    getrlimit(RLIMIT_NOFILE, &old_limit);
    tight = old_limit;
    tight.rlim_cur = (rlim_t)lowest_free;
    setrlimit(RLIMIT_NOFILE, &tight);
    int na = accept(l, NULL, NULL);
    int accept_errno = errno;
    setrlimit(RLIMIT_NOFILE, &old_limit);
    CHECK(na == -1 && accept_errno == EMFILE, "accept with no free fd: EMFILE");
    if (na >= 0)
        close(na);
    na = accept(l, NULL, NULL);
    CHECK(na >= 0, "the connection stayed queued: the next accept takes it");
    char x = 0;
    CHECK(na >= 0 && send(c, "x", 1, 0) == 1 && recv(na, &x, 1, MSG_WAITALL) == 1 && x == 'x', "and it carries data");
    if (na >= 0)
        close(na);
    close(c);
    close(l);

    /* 10. the last name closed while another thread's reads run on it, many times: each read in flight finishes
     * on the connection it found (not freed under it), the next one sees EBADF, and the echoed bytes all arrived
     * before that. */
    l = listen_on(AF_INET, port + 5);
    CHECK(l >= 0, "listener for the close-under-reads check");
    enum { CLOSE_ROUNDS = 20 };
    struct server_args sa10 = { .lfd = l, .count = CLOSE_ROUNDS };
    pthread_create(&th, NULL, server_thread, &sa10);
    int close_ok = 0;
    for (int round = 0; round < CLOSE_ROUNDS; round++) {
        c = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in d10 = addr4("127.0.0.1", port + 5);
        if (connect(c, (struct sockaddr *)&d10, sizeof(d10)) != 0)
            break;
        struct spin_reader reader = { .fd = c };
        pthread_t rt;
        pthread_create(&rt, NULL, spin_reader, &reader);
        if (write(c, "ping", 4) != 4)
            break;
        for (int i = 0; i < 2000 && __atomic_load_n(&reader.bytes, __ATOMIC_RELAXED) < 4; i++)
            usleep(1000);
        usleep((useconds_t)(round % 4) * 500);
        close(c);
        pthread_join(rt, NULL);
        if (reader.error == EBADF && reader.bytes == 4 && !reader.unexpected)
            close_ok++;
        else
            fprintf(stderr, "close under reads, round %d: error %d, unexpected %d, %zu bytes\n", round,
                    reader.error, reader.unexpected, reader.bytes);
    }
    CHECK(close_ok == CLOSE_ROUNDS, "closed under a reading thread 20 times: its calls ended with EBADF, data intact");
    pthread_join(th, NULL);
    close(l);

    /* 11. An fd number the thread just moved data on (rdmasock remembers such connections per thread, io_calls.c)
     * names something else after close or dup2: the calls reach the new object, never the old connection. The
     * server takes one connection at a time: a thread blocked in accept holds the lowest free number (Linux reserves
     * it before waiting). */
    l = listen_on(AF_INET, port + 6);
    CHECK(l >= 0, "listener for the reused-number check");
    struct server_args sa11 = { .lfd = l, .count = 1 };
    pthread_create(&th, NULL, server_thread, &sa11);
    struct sockaddr_in d11 = addr4("127.0.0.1", port + 6);
    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(c, (struct sockaddr *)&d11, sizeof(d11)) == 0 && echo_roundtrip(c, 64) && echo_roundtrip(c, 64),
          "echo twice on a connection");
    int old_fd = c;
    close(c);
    pthread_join(th, NULL);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 && (sv[0] == old_fd || dup2(sv[0], old_fd) == old_fd),
          "a socketpair's end takes the closed connection's number");
    int reused = old_fd, other = sv[1];
    char got11[8] = { 0 };
    CHECK(send(other, "unix", 4, 0) == 4 && recv(reused, got11, sizeof(got11), 0) == 4 && memcmp(got11, "unix", 4) == 0 &&
              send(reused, "back", 4, 0) == 4 && read(other, got11, sizeof(got11)) == 4 && memcmp(got11, "back", 4) == 0,
          "the reused number reaches the socketpair, both ways");
    sa11 = (struct server_args){ .lfd = l, .count = 1 };
    pthread_create(&th, NULL, server_thread, &sa11);
    c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(c, (struct sockaddr *)&d11, sizeof(d11)) == 0 && echo_roundtrip(c, 64), "echo on a second connection");
    CHECK(dup2(other, c) == c, "dup2 of the socketpair over it");
    memset(got11, 0, sizeof(got11));
    CHECK(send(reused, "dup2", 4, 0) == 4 && recv(c, got11, sizeof(got11), 0) == 4 && memcmp(got11, "dup2", 4) == 0,
          "the dup2'd number reaches the socketpair");
    close(c);
    if (reused != sv[0])
        close(reused);
    close(sv[0]);
    close(sv[1]);
    pthread_join(th, NULL);
    close(l);
    return failures ? 1 : 0;
}

static int run_serve(int port, int count)
{
    int l = listen_on(AF_INET, port);
    if (l < 0)
        return 1;
    printf("listening\n");
    fflush(stdout);
    struct server_args sa = { .lfd = l, .count = count };
    server_thread(&sa);
    return 0;
}

static int run_client(const char *host, int port, const char *mode, int hold_seconds)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in dst = addr4(host, port);
    int r = connect(c, (struct sockaddr *)&dst, sizeof(dst));
    if (strcmp(mode, "refused") == 0) {
        CHECK(r == -1 && errno == ECONNREFUSED, "connect refused");
        return failures ? 1 : 0;
    }
    CHECK(r == 0, "connect");
    CHECK(echo_roundtrip(c, 1 << 20), "1 MiB echoed intact");
    /* Holding the connection open lets the suite read this process's statistics area. */
    printf("connected\n");
    fflush(stdout);
    sleep((unsigned)hold_seconds);
    close(c);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "local") == 0)
        return run_local(atoi(argv[2]));
    if (argc >= 4 && strcmp(argv[1], "serve") == 0)
        return run_serve(atoi(argv[2]), atoi(argv[3]));
    if (argc >= 5 && strcmp(argv[1], "client") == 0)
        return run_client(argv[2], atoi(argv[3]), argv[4], argc >= 6 ? atoi(argv[5]) : 0);
    fprintf(stderr, "usage: sockcheck local PORT | serve PORT COUNT | client HOST PORT ok|refused [HOLD]\n");
    return 2;
}
