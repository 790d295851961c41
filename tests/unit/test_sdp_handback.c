/*
 * test_sdp_handback.c: a connection continues over kernel TCP (sdp.h "hand-back", docs/sdp.md). Every check
 * follows both streams byte by byte across the switch: what was read over SDP, what was received and not read,
 * what was written and not sent, and what goes afterwards.
 *
 * RS_RNIC_KIND / RS_RNIC_ADDR choose the RNIC (test_sdp_util.h), so the same checks run over verbs in the VM.
 */
#include <fcntl.h>
#include <sys/socket.h>

#include "test_sdp_util.h"

#define HB_TIMEOUT_MS 10000

static void small_ring(struct rs_sdp_sock *s)
{
    set_int(s, SOL_SOCKET, SO_RCVBUF, 32 * 1024);    /* doubled: a 64 KiB ring, so most of a big write stays unsent */
}

/* One direction of a stream: `seed` is its pattern, `pos` how far this end has got. */
struct dir {
    uint32_t seed;
    uint64_t pos;
};

static void sdp_write(struct rs_sdp_sock *s, struct dir *d, size_t len)
{
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    fill_pattern(buf, len, d->seed, d->pos);
    send_all(s, buf, len);
    d->pos += len;
    free(buf);
}

static void sdp_read(struct rs_sdp_sock *s, struct dir *d, size_t len)
{
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    recv_all(s, buf, len);
    long bad = check_pattern(buf, len, d->seed, d->pos);
    if (bad >= 0)
        fail_msg("SDP stream %u differs at %llu", d->seed, (unsigned long long)(d->pos + (uint64_t)bad));
    d->pos += len;
    free(buf);
}

/* A check that goes wrong fails rather than waits for ever. */
static void bound_waits(int fd)
{
    struct timeval tv = { HB_TIMEOUT_MS / 1000, 0 };
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
}

static void fd_write(int fd, struct dir *d, size_t len)
{
    bound_waits(fd);
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    fill_pattern(buf, len, d->seed, d->pos);
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            fail_msg("kernel send returned %zd (%s) after %zu of %zu", n, strerror(errno), off, len);
        off += (size_t)n;
    }
    d->pos += len;
    free(buf);
}

static void fd_read(int fd, struct dir *d, size_t len)
{
    bound_waits(fd);
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    for (size_t off = 0; off < len;) {
        ssize_t n = recv(fd, buf + off, len - off, 0);
        if (n <= 0)
            fail_msg("kernel recv returned %zd (%s) after %zu of %zu (stream %u at %llu)", n, strerror(errno), off,
                     len, d->seed, (unsigned long long)d->pos);
        off += (size_t)n;
    }
    long bad = check_pattern(buf, len, d->seed, d->pos);
    if (bad >= 0)
        fail_msg("TCP stream %u differs at %llu", d->seed, (unsigned long long)(d->pos + (uint64_t)bad));
    d->pos += len;
    free(buf);
}

static void fd_expect_eof(int fd)
{
    bound_waits(fd);
    char c;
    ssize_t n = recv(fd, &c, 1, 0);
    assert_int_equal(n, 0);
}

/* The side whose peer handed back: its calls answer -EREMCHG, then its fd can be taken (once). */
static int take_fd(struct rs_sdp_sock *s)
{
    char c;
    uint64_t until = now_ms() + HB_TIMEOUT_MS;
    ssize_t r;
    while ((r = rs_sdp_recv(s, &c, 1, MSG_PEEK)) != -EREMCHG) {
        if (r != -EAGAIN && r != 1)
            fail_msg("recv during a hand-back returned %zd", r);
        if (now_ms() > until)
            fail_msg("no hand-back seen within %d ms", HB_TIMEOUT_MS);
        usleep(1000);
    }
    assert_true(rs_sdp_handed_back(s));
    assert_true(rs_sdp_poll(s) & POLLIN);
    int fd = rs_sdp_take_handback_fd(s);
    assert_true(fd >= 0);
    assert_int_equal(rs_sdp_take_handback_fd(s), -ENOENT);
    assert_int_equal(rs_sdp_send(s, "x", 1, MSG_NOSIGNAL), -EREMCHG);
    assert_int_equal(rs_sdp_shutdown(s, SHUT_WR), -EREMCHG);
    return fd;
}

static void check_kernel_socket(int fd)
{
    assert_true(fd >= 0);
    int type = 0;
    socklen_t len = sizeof(type);
    assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len), 0);
    assert_int_equal(type, SOCK_STREAM);
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
}

/*
 * Both directions have bytes read over SDP, bytes received and not read (the residue) and bytes written and not
 * yet sent (a 64 KiB ring at the receiver holds back most of 400 KiB); each side's kernel socket starts exactly
 * where its application stopped reading, then both streams go on over TCP.
 */
static void check_residues(bool passive_starts)
{
    struct rs_sdp_sock *c, *s;
    sdp_pair_opts(&c, &s, small_ring);
    struct dir c2s = { 11, 0 }, s2c = { 12, 0 };
    struct dir c2s_rx = c2s, s2c_rx = s2c;
    sdp_write(c, &c2s, 10000);
    sdp_read(s, &c2s_rx, 4000);
    sdp_write(s, &s2c, 7000);
    sdp_read(c, &s2c_rx, 7000);
    sdp_write(c, &c2s, 400 * 1024);
    sdp_write(s, &s2c, 300 * 1024);
    usleep(100 * 1000);             /* let the peers' rings fill */
    struct rs_sdp_stats cs = sdp_stats(c);
    assert_true(rs_sdp_outq(c) > 0);    /* bytes not yet acknowledged: some were never sent */
    struct rs_sdp_sock *init = passive_starts ? s : c, *resp = passive_starts ? c : s;
    uint64_t t0 = now_us();
    int fd_init = rs_sdp_handback(init, HB_TIMEOUT_MS);
    if (fd_init < 0)
        fail_msg("rs_sdp_handback: %s", strerror(-fd_init));
    print_message("# hand-back with %llu + %llu bytes pending took %llu us\n",
                  (unsigned long long)(c2s.pos - c2s_rx.pos), (unsigned long long)(s2c.pos - s2c_rx.pos),
                  (unsigned long long)(now_us() - t0));
    int fd_resp = take_fd(resp);
    check_kernel_socket(fd_init);
    check_kernel_socket(fd_resp);
    int fd_c = passive_starts ? fd_resp : fd_init, fd_s = passive_starts ? fd_init : fd_resp;
    /* Everything not read yet, from wherever it was, arrives in order on the kernel sockets. */
    fd_read(fd_s, &c2s_rx, (size_t)(c2s.pos - c2s_rx.pos));
    fd_read(fd_c, &s2c_rx, (size_t)(s2c.pos - s2c_rx.pos));
    /* And the streams go on. */
    fd_write(fd_c, &c2s, 1 << 20);
    fd_write(fd_s, &s2c, 1 << 20);
    fd_read(fd_s, &c2s_rx, 1 << 20);
    fd_read(fd_c, &s2c_rx, 1 << 20);
    assert_true(cs.bytes_sent >= c2s.pos - (1 << 20));
    close(fd_c);
    fd_expect_eof(fd_s);
    close(fd_s);
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
}

static void test_handback_active_starts(void **state)
{
    (void)state;
    check_residues(false);
}

static void test_handback_passive_starts(void **state)
{
    (void)state;
    check_residues(true);
}

/* A stream shut for writing stays shut: the peer reads what was sent, then end of stream, over TCP. */
static void test_handback_after_shutdown(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    struct dir c2s = { 21, 0 }, c2s_rx = c2s, s2c = { 22, 0 }, s2c_rx = s2c;
    sdp_write(c, &c2s, 5000);
    assert_int_equal(rs_sdp_shutdown(c, SHUT_WR), 0);
    usleep(50 * 1000);
    int fd_s = rs_sdp_handback(s, HB_TIMEOUT_MS);
    if (fd_s < 0)
        fail_msg("rs_sdp_handback: %s", strerror(-fd_s));
    int fd_c = take_fd(c);
    fd_read(fd_s, &c2s_rx, 5000);
    fd_expect_eof(fd_s);
    fd_write(fd_s, &s2c, 70000);        /* the other direction is still open */
    fd_read(fd_c, &s2c_rx, 70000);
    close(fd_c);
    close(fd_s);
    rs_sdp_close(c);
    rs_sdp_close(s);
}

struct crossing {
    struct rs_sdp_sock *s;
    int fd;
};

static void *handback_thread(void *arg)
{
    struct crossing *x = arg;
    x->fd = rs_sdp_handback(x->s, HB_TIMEOUT_MS);
    return NULL;
}

/* Both ends start at once: one SuspComm wins, both calls return the ends of one TCP connection. */
static void test_handback_both_start(void **state)
{
    (void)state;
    for (int round = 0; round < 5; round++) {
        struct rs_sdp_sock *c, *s;
        sdp_pair(&c, &s);
        struct dir c2s = { 31, 0 }, c2s_rx = c2s, s2c = { 32, 0 }, s2c_rx = s2c;
        sdp_write(c, &c2s, 3000);
        sdp_write(s, &s2c, 2000);
        struct crossing xc = { c, -1 }, xs = { s, -1 };
        pthread_t tc, ts;
        assert_int_equal(pthread_create(&tc, NULL, handback_thread, &xc), 0);
        assert_int_equal(pthread_create(&ts, NULL, handback_thread, &xs), 0);
        pthread_join(tc, NULL);
        pthread_join(ts, NULL);
        if (xc.fd < 0 || xs.fd < 0)
            fail_msg("round %d: hand-backs returned %d and %d", round, xc.fd, xs.fd);
        fd_read(xs.fd, &c2s_rx, 3000);
        fd_read(xc.fd, &s2c_rx, 2000);
        fd_write(xc.fd, &c2s, 100);
        fd_read(xs.fd, &c2s_rx, 100);
        close(xc.fd);
        close(xs.fd);
        rs_sdp_close(c);
        rs_sdp_close(s);
    }
}

struct blocked {
    struct rs_sdp_sock *s;
    size_t len;
    ssize_t r;
    uint8_t *buf;
};

static void *recv_thread(void *arg)
{
    struct blocked *b = arg;
    b->r = rs_sdp_recv(b->s, b->buf, b->len, MSG_WAITALL);
    return NULL;
}

static void *send_thread(void *arg)
{
    struct blocked *b = arg;
    b->r = rs_sdp_send(b->s, b->buf, b->len, MSG_NOSIGNAL);
    return NULL;
}

/*
 * Threads inside calls when the hand-back comes: a reader waiting for data (with zero copy, its buffer is
 * advertised as a sink) and a writer whose large write is lent to the peer (SrcAvail) that nobody reads. Both
 * return what moved over SDP (or -EREMCHG when nothing did); the rest of their work goes over TCP, in order.
 */
static void test_handback_blocked_callers(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    struct dir c2s = { 41, 0 }, c2s_rx = c2s, s2c = { 42, 0 }, s2c_rx = s2c;
    sdp_write(c, &c2s, 1000);
    sdp_read(s, &c2s_rx, 1000);
    struct blocked rd = { .s = c, .len = 256 * 1024 };          /* c waits for s's data: a sink */
    rd.buf = malloc(rd.len);
    struct blocked wr = { .s = s, .len = 2u << 20 };            /* s lends 2 MiB to c's sink or as SrcAvail */
    wr.buf = malloc(wr.len);
    assert_non_null(rd.buf);
    assert_non_null(wr.buf);
    fill_pattern(wr.buf, wr.len, s2c.seed, s2c.pos);
    pthread_t tr, tw;
    assert_int_equal(pthread_create(&tr, NULL, recv_thread, &rd), 0);
    usleep(50 * 1000);
    assert_int_equal(pthread_create(&tw, NULL, send_thread, &wr), 0);
    usleep(30 * 1000);
    int fd_c = rs_sdp_handback(c, HB_TIMEOUT_MS);
    if (fd_c < 0)
        fail_msg("rs_sdp_handback: %s", strerror(-fd_c));
    pthread_join(tr, NULL);
    /* The writer may still be lending its buffer: the reader's peer (s) finishes that first. */
    int fd_s = take_fd(s);
    pthread_join(tw, NULL);
    /* The reader got a prefix over SDP (or nothing); the rest is on the kernel socket. */
    size_t got = rd.r > 0 ? (size_t)rd.r : 0;
    if (rd.r < 0 && rd.r != -EREMCHG)
        fail_msg("blocked recv returned %zd", rd.r);
    long bad = check_pattern(rd.buf, got, s2c_rx.seed, s2c_rx.pos);
    if (bad >= 0)
        fail_msg("SDP part of the blocked recv differs at %ld", bad);
    s2c_rx.pos += got;
    size_t sent = wr.r > 0 ? (size_t)wr.r : 0;
    if (wr.r < 0 && wr.r != -EREMCHG)
        fail_msg("blocked send returned %zd", wr.r);
    s2c.pos += sent;
    /* The writer's application goes on where its call stopped: over TCP now. */
    if (sent < wr.len)
        fd_write(fd_s, &s2c, wr.len - sent);
    fd_read(fd_c, &s2c_rx, (size_t)(s2c.pos - s2c_rx.pos));
    fd_write(fd_c, &c2s, 5000);
    fd_read(fd_s, &c2s_rx, 5000);
    free(rd.buf);
    free(wr.buf);
    close(fd_c);
    close(fd_s);
    rs_sdp_close(c);
    rs_sdp_close(s);
}

/* A failed check leaves the test early: later tests must connect normally. */
static int release_established(void **state)
{
    (void)state;
    rs_sdp_test_hold_established(false);
    return 0;
}

/*
 * The server hands back the moment it accepts (it forked and closed its copy), so its SuspComm reaches the client
 * before the CM event that carries its HelloAck, which is what says the server may hand back at all. The client
 * keeps the SuspComm until then and answers it; it used to call it a protocol error and fail its connect (EPROTO).
 */
static void test_handback_before_established(void **state)
{
    (void)state;
    struct sockaddr_in addr;
    struct rs_sdp_sock *l = sdp_listener(&addr), *c, *s;
    assert_int_equal(rs_sdp_socket(AF_INET, sdp_kind(), RS_SDP_NONBLOCK, &c), 0);
    rs_sdp_test_hold_established(true);
    assert_int_equal(rs_sdp_connect(c, (struct sockaddr *)&addr, sizeof(addr)), -EINPROGRESS);
    assert_int_equal(rs_sdp_accept(l, 0, &s, NULL, NULL), 0);
    rs_sdp_close(l);
    struct crossing xs = { s, -1 };
    pthread_t ts;
    assert_int_equal(pthread_create(&ts, NULL, handback_thread, &xs), 0);
    /* The SuspComm arrives while the client still waits for its connection. */
    uint64_t until = now_ms() + WAIT_MS;
    while (sdp_stats(c).msgs_received == 0 && now_ms() < until) {
        rs_sdp_poll(c);
        usleep(1000);
    }
    assert_true(sdp_stats(c).msgs_received > 0);
    assert_int_equal(rs_sdp_send(c, "x", 1, MSG_NOSIGNAL), -EAGAIN);      /* not connected yet */
    rs_sdp_test_hold_established(false);
    int fd_c = take_fd(c);
    pthread_join(ts, NULL);
    if (xs.fd < 0)
        fail_msg("the server's rs_sdp_handback: %s", strerror(-xs.fd));
    check_kernel_socket(fd_c);
    check_kernel_socket(xs.fd);
    struct dir c2s = { 41, 0 }, c2s_rx = c2s, s2c = { 42, 0 }, s2c_rx = s2c;
    fd_write(fd_c, &c2s, 100000);
    fd_write(xs.fd, &s2c, 100000);
    fd_read(xs.fd, &c2s_rx, 100000);
    fd_read(fd_c, &s2c_rx, 100000);
    close(fd_c);
    fd_expect_eof(xs.fd);
    close(xs.fd);
    rs_sdp_close(c);
    rs_sdp_close(s);
}

/* What cannot be handed back says so and changes nothing. */
static void test_handback_refused(void **state)
{
    (void)state;
    struct rs_sdp_sock *u;
    assert_int_equal(rs_sdp_socket(AF_INET, sdp_kind(), 0, &u), 0);
    assert_int_equal(rs_sdp_handback(u, 1000), -EOPNOTSUPP);
    assert_false(rs_sdp_handed_back(u));
    assert_int_equal(rs_sdp_take_handback_fd(u), -ENOENT);
    rs_sdp_close(u);
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    rs_sdp_close(s);        /* the peer is gone: the connection is over, no hand-back */
    uint64_t until = now_ms() + WAIT_MS;
    int r;
    while ((r = rs_sdp_handback(c, 1000)) == -EOPNOTSUPP && now_ms() < until)
        usleep(10000);      /* (until the DisConn arrives the connection looks alive and half-closed) */
    assert_true(r == -EPIPE || r == -ECONNRESET || r >= 0);
    if (r >= 0)
        close(r);
    rs_sdp_close(c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handback_active_starts),
        cmocka_unit_test(test_handback_passive_starts),
        cmocka_unit_test(test_handback_after_shutdown),
        cmocka_unit_test(test_handback_both_start),
        cmocka_unit_test(test_handback_blocked_callers),
        cmocka_unit_test_teardown(test_handback_before_established, release_established),
        cmocka_unit_test(test_handback_refused),
    };
    return cmocka_run_group_tests_name("sdp_handback", tests, NULL, NULL);
}
