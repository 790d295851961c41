/*
 * Helpers shared by the datagram socket tests (test_dgram*.c): endpoints over real sockets on 127.0.0.x, a rule
 * file parsed from text, plain kernel UDP sockets, waiting with the readiness fd.
 * Include after <cmocka.h>.
 */
#ifndef RS_TEST_DGRAM_UTIL_H
#define RS_TEST_DGRAM_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "dgram_wr/dgram.h"
#include "rnic/rnic.h"

static inline uint64_t dt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void dt_sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* RS_RNIC_KIND: 1 soft (default), 2 verbs. */
static inline int dt_kind(void)
{
    const char *k = getenv("RS_RNIC_KIND");
    return k && strcmp(k, "verbs") == 0 ? RS_RNIC_KIND_VERBS : RS_RNIC_KIND_SOFT;
}

static inline bool dt_is_soft(void) { return dt_kind() == RS_RNIC_KIND_SOFT; }

static inline void dt_fill(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

static inline bool dt_same(const struct sockaddr_in *a, const struct sockaddr_in *b)
{
    return a->sin_family == b->sin_family && a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
}

/* ---- a rule file ---- */

struct dt_world {
    struct rs_config *cfg;
    struct rs_dgram_config_policy pol;
};

static inline struct dt_world *dt_world(const char *rules)
{
    /* Skip everything when the provider under test has no device here (verbs outside the VM). In the VM
     * (RS_TEST_ADDR: rxe0's address) the tests written for loopback (their rules name 127.0.0.x, which no RDMA
     * device serves) skip; those that take RS_TEST_ADDR run. */
    static int usable = -1;
    const char *test_ip = getenv("RS_TEST_ADDR");
    bool on_test_addr = test_ip && *test_ip;
    if (usable < 0) {
        struct rs_rnic *rnic = NULL;
        struct sockaddr_in at = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (on_test_addr && inet_pton(AF_INET, test_ip, &at.sin_addr) != 1)
            at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        usable = rs_rnic_open(dt_kind(), (struct sockaddr *)&at, &rnic) == 0;
        if (rnic)
            rs_rnic_close(rnic);
    }
    if (!usable || (on_test_addr && strstr(rules, "127.0.0.")))
        skip();
    struct dt_world *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    struct rs_config_error err;
    if (rs_config_parse_buffer("test", rules, strlen(rules), &w->cfg, &err) != 0)
        fail_msg("rules do not parse: %s", err.message);
    w->pol.cfg = w->cfg;
    w->pol.program = "test_dgram";
    return w;
}

static inline void dt_world_free(struct dt_world *w)
{
    rs_config_free(w->cfg);
    free(w);
}

/* ---- converted endpoints ---- */

struct dt_ep {
    int fd;
    struct rs_dgram_sock *s;
    struct sockaddr_in addr;
};

static inline void dt_open_opts(struct dt_ep *e, struct dt_world *w, const char *ip, uint16_t port, int rcvbuf,
                                const struct rs_dgram_opts *tmpl)
{
    memset(e, 0, sizeof(*e));
    e->fd = socket(AF_INET, SOCK_DGRAM, 0);
    assert_true(e->fd >= 0);
    struct rs_dgram_opts o;
    if (tmpl)
        o = *tmpl;
    else
        rs_dgram_default_opts(&o);
    o.policy = rs_dgram_config_policy;
    o.policy_arg = &w->pol;
    o.rnic_kind = dt_kind();
    assert_int_equal(rs_dgram_attach(e->fd, &o, &e->s), 0);
    if (rcvbuf)
        assert_int_equal(rs_dgram_setsockopt(e->s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    assert_int_equal(inet_pton(AF_INET, ip, &a.sin_addr), 1);
    assert_int_equal(rs_dgram_bind(e->s, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t l = sizeof(e->addr);
    assert_int_equal(rs_dgram_getsockname(e->s, (struct sockaddr *)&e->addr, &l), 0);
}

static inline void dt_open(struct dt_ep *e, struct dt_world *w, const char *ip, uint16_t port)
{
    dt_open_opts(e, w, ip, port, 0, NULL);
}

static inline void dt_close(struct dt_ep *e)
{
    if (e->s)
        assert_int_equal(rs_dgram_close(e->s), 0);
    close(e->fd);
    e->s = NULL;
    e->fd = -1;
}

/* As if the process died: no goodbye to the peers. */
static inline void dt_close_abrupt(struct dt_ep *e)
{
    rs_dgram_test_close_silently(e->s);
    close(e->fd);
    e->s = NULL;
    e->fd = -1;
}

static inline struct rs_dgram_stats dt_stats(struct dt_ep *e)
{
    struct rs_dgram_stats st;
    socklen_t l = sizeof(st);
    assert_int_equal(rs_dgram_getsockopt(e->s, RS_SOL_DGRAM, RS_DGRAM_STATS, &st, &l), 0);
    return st;
}

static inline ssize_t dt_sendto(struct dt_ep *from, const struct sockaddr_in *to, const void *buf, size_t len)
{
    return rs_dgram_sendto(from->s, buf, len, 0, (const struct sockaddr *)to, sizeof(*to));
}

static inline ssize_t dt_send(struct dt_ep *from, const struct dt_ep *to, const void *buf, size_t len)
{
    return dt_sendto(from, &to->addr, buf, len);
}

/* Waits on the readiness fd until the socket has a datagram (or timeout). */
static inline bool dt_wait_readable(struct dt_ep *e, unsigned timeout_ms)
{
    uint64_t end = dt_now_ms() + timeout_ms;
    rs_dgram_interest(e->s, POLLIN, 1);
    bool ok = false;
    for (;;) {
        if (rs_dgram_poll(e->s) & POLLIN) {
            ok = true;
            break;
        }
        uint64_t now = dt_now_ms();
        if (now >= end)
            break;
        struct pollfd p = { .fd = rs_dgram_fd(e->s), .events = POLLIN };
        (void)poll(&p, 1, (int)(end - now));
    }
    rs_dgram_interest(e->s, POLLIN, -1);
    return ok;
}

/* recvfrom that waits at most timeout_ms through the readiness fd; -EAGAIN on timeout. */
static inline ssize_t dt_recv(struct dt_ep *e, void *buf, size_t len, struct sockaddr_in *src, unsigned timeout_ms)
{
    uint64_t end = dt_now_ms() + timeout_ms;
    for (;;) {
        struct sockaddr_in from;
        socklen_t fl = sizeof(from);
        ssize_t n = rs_dgram_recvfrom(e->s, buf, len, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (n != -EAGAIN) {
            if (n >= 0 && src) {
                assert_int_equal(fl, sizeof(from));
                *src = from;
            }
            return n;
        }
        uint64_t now = dt_now_ms();
        if (now >= end)
            return -EAGAIN;
        rs_dgram_interest(e->s, POLLIN, 1);
        if (!(rs_dgram_poll(e->s) & POLLIN)) {
            struct pollfd p = { .fd = rs_dgram_fd(e->s), .events = POLLIN };
            (void)poll(&p, 1, (int)(end - now));
        }
        rs_dgram_interest(e->s, POLLIN, -1);
    }
}

/* Reads everything queued now (and what arrives within quiet_ms). */
static inline int dt_drain(struct dt_ep *e, unsigned quiet_ms)
{
    static uint8_t buf[70000];
    int n = 0;
    while (dt_recv(e, buf, sizeof(buf), NULL, quiet_ms) >= 0)
        n++;
    return n;
}

static inline void dt_sync(struct dt_ep *from, struct dt_ep *to)
{
    static const char marker[] = "dt-sync-marker";
    assert_int_equal(dt_send(from, to, marker, sizeof(marker)), (ssize_t)sizeof(marker));
    static uint8_t buf[70000];
    uint64_t end = dt_now_ms() + 5000;
    for (;;) {
        ssize_t n = dt_recv(to, buf, sizeof(buf), NULL, 100);
        if (n == (ssize_t)sizeof(marker) && memcmp(buf, marker, sizeof(marker)) == 0)
            return;
        if (dt_now_ms() > end)
            fail_msg("sync marker never arrived");
    }
}

/* Exchanges datagrams until both sides send to each other over RDMA, then empties both. */
static inline void dt_warm(struct dt_ep *a, struct dt_ep *b)
{
    uint64_t end = dt_now_ms() + 5000;      /* generous: a loaded machine delays the answers */
    while (dt_now_ms() < end) {
        (void)dt_send(a, b, "warm", 4);
        (void)dt_send(b, a, "warm", 4);
        dt_drain(a, 0);
        dt_drain(b, 0);
        if (rs_dgram_test_peer_rdma(a->s, (struct sockaddr *)&b->addr) &&
            rs_dgram_test_peer_rdma(b->s, (struct sockaddr *)&a->addr))
            break;
        dt_sleep_ms(2);
    }
    assert_true(rs_dgram_test_peer_rdma(a->s, (struct sockaddr *)&b->addr));
    assert_true(rs_dgram_test_peer_rdma(b->s, (struct sockaddr *)&a->addr));
    /* Everything reaches a socket through its one kernel socket, in order (the RNIC reads it in order): once a
     * marker sent last has arrived, no warm-up datagram can show up later in the test. */
    dt_sync(a, b);
    dt_sync(b, a);
}

/* The set-up most tests start from: two endpoints on 127.0.0.1 under `rules`, already talking over RDMA.
 * Returns the world for dt_pair_close. */
static inline struct dt_world *dt_pair_open(struct dt_ep *a, struct dt_ep *b, const char *rules)
{
    struct dt_world *w = dt_world(rules);
    dt_open(a, w, "127.0.0.1", 0);
    dt_open(b, w, "127.0.0.1", 0);
    dt_warm(a, b);
    return w;
}

static inline void dt_pair_close(struct dt_ep *a, struct dt_ep *b, struct dt_world *w)
{
    dt_close(a);
    dt_close(b);
    dt_world_free(w);
}

/* ---- plain kernel sockets (a peer without rdmasock) ---- */

static inline int dt_plain(const char *ip, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    assert_int_equal(inet_pton(AF_INET, ip, &a.sin_addr), 1);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static inline struct sockaddr_in dt_plain_addr(int fd)
{
    struct sockaddr_in a;
    socklen_t l = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    return a;
}

static inline ssize_t dt_plain_recv(int fd, void *buf, size_t len, struct sockaddr_in *src, socklen_t *sl,
                                    unsigned timeout_ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (poll(&p, 1, (int)timeout_ms) != 1)
        return -EAGAIN;
    ssize_t n = recvfrom(fd, buf, len, MSG_DONTWAIT, (struct sockaddr *)src, sl);
    return n < 0 ? -errno : n;
}

#endif /* RS_TEST_DGRAM_UTIL_H */
