/*
 * Helpers shared by the SDP test binaries (test_sdp.c, test_sdp_stress.c, test_sdp_zcopy.c). Header-only so each
 * binary stays one file for the build.
 *
 * The RNIC comes from RS_RNIC_KIND=soft|verbs (default soft) and the address from RS_RNIC_ADDR (default 127.0.0.1),
 * so the same binaries run against the verbs provider in a VM.
 */
#ifndef TEST_SDP_UTIL_H
#define TEST_SDP_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "rnic/rnic.h"
#include "sdp_stream/sdp.h"

#define WAIT_MS 5000

static inline int sdp_kind(void)
{
    const char *k = getenv("RS_RNIC_KIND");
    return k && strcmp(k, "verbs") == 0 ? RS_RNIC_KIND_VERBS : RS_RNIC_KIND_SOFT;
}

static inline const char *sdp_addr(void)
{
    const char *a = getenv("RS_RNIC_ADDR");
    return a && *a ? a : "127.0.0.1";
}

static inline uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static inline struct sockaddr_in sdp_sockaddr(uint16_t port)
{
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    assert_int_equal(inet_pton(AF_INET, sdp_addr(), &sin.sin_addr), 1);
    return sin;
}

/* A listener on an ephemeral port; *addr gets the address to connect to. */
static inline struct rs_sdp_sock *sdp_listener(struct sockaddr_in *addr)
{
    struct rs_sdp_sock *l;
    assert_int_equal(rs_sdp_socket(AF_INET, sdp_kind(), 0, &l), 0);
    struct sockaddr_in sin = sdp_sockaddr(0);
    assert_int_equal(rs_sdp_bind(l, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(rs_sdp_listen(l, 16), 0);
    socklen_t len = sizeof(*addr);
    assert_int_equal(rs_sdp_getsockname(l, (struct sockaddr *)addr, &len), 0);
    assert_int_not_equal(ntohs(addr->sin_port), 0);
    return l;
}

/* Options applied to both ends before they connect (SO_RCVBUF etc. must precede the connection). */
typedef void (*sdp_opts_fn)(struct rs_sdp_sock *s);

static inline void sdp_pair_opts(struct rs_sdp_sock **client, struct rs_sdp_sock **server, sdp_opts_fn opts)
{
    struct sockaddr_in addr;
    struct rs_sdp_sock *l = sdp_listener(&addr);
    if (opts)
        opts(l);
    struct rs_sdp_sock *c;
    assert_int_equal(rs_sdp_socket(AF_INET, sdp_kind(), 0, &c), 0);
    if (opts)
        opts(c);
    assert_int_equal(rs_sdp_connect(c, (struct sockaddr *)&addr, sizeof(addr)), 0);
    struct sockaddr_in peer;
    socklen_t plen = sizeof(peer);
    assert_int_equal(rs_sdp_accept(l, 0, server, (struct sockaddr *)&peer, &plen), 0);
    assert_int_equal(plen, sizeof(struct sockaddr_in));
    assert_int_equal(rs_sdp_close(l), 0);
    *client = c;
}

static inline void sdp_pair(struct rs_sdp_sock **client, struct rs_sdp_sock **server)
{
    sdp_pair_opts(client, server, NULL);
}

static inline void set_int(struct rs_sdp_sock *s, int level, int name, int v)
{
    assert_int_equal(rs_sdp_setsockopt(s, level, name, &v, sizeof(v)), 0);
}

static inline int get_int(struct rs_sdp_sock *s, int level, int name)
{
    int v = -12345;
    socklen_t len = sizeof(v);
    assert_int_equal(rs_sdp_getsockopt(s, level, name, &v, &len), 0);
    return v;
}

static inline struct rs_sdp_stats sdp_stats(struct rs_sdp_sock *s)
{
    struct rs_sdp_stats st;
    socklen_t len = sizeof(st);
    assert_int_equal(rs_sdp_getsockopt(s, RS_SOL_SDP, RS_SDP_STATS, &st, &len), 0);
    return st;
}

/*
 * Both ends' statistics once their crossed-SinkAvail counts agree (up to 2 s). Each side counts a crossing when it
 * processes the message that shows it: a SinkAvail posted just before the peer's DisConn arrived is counted by its
 * poster at once and by the peer only when that SinkAvail reaches it, which may be after the test's threads are
 * done. Nothing may be in flight any more when the counts are compared.
 */
static inline void stats_settled(struct rs_sdp_sock *x, struct rs_sdp_sock *y, struct rs_sdp_stats *sx,
                                 struct rs_sdp_stats *sy)
{
    *sx = sdp_stats(x);
    *sy = sdp_stats(y);
    for (int i = 0; i < 200 && sx->sinks_crossed != sy->sinks_crossed; i++) {
        usleep(10000);
        *sx = sdp_stats(x);
        *sy = sdp_stats(y);
    }
}

/* Sends all of buf (blocking socket). */
static inline void send_all(struct rs_sdp_sock *s, const void *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = rs_sdp_send(s, (const char *)buf + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            fail_msg("send returned %zd after %zu of %zu bytes", n, off, len);
        off += (size_t)n;
    }
}

/* Receives exactly len bytes (blocking socket). */
static inline void recv_all(struct rs_sdp_sock *s, void *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = rs_sdp_recv(s, (char *)buf + off, len - off, 0);
        if (n <= 0)
            fail_msg("recv returned %zd after %zu of %zu bytes", n, off, len);
        off += (size_t)n;
    }
}

/* Deterministic pattern: byte i of stream `seed` (position-based, so any split of the stream checks). */
static inline uint8_t pattern_byte(uint32_t seed, uint64_t pos)
{
    uint64_t x = (pos >> 3) * 0x9e3779b97f4a7c15ull + seed * 0xc2b2ae3d27d4eb4full;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (uint8_t)(x >> ((pos & 7) * 8));
}

static inline void fill_pattern(uint8_t *p, size_t len, uint32_t seed, uint64_t pos)
{
    for (size_t i = 0; i < len; i++)
        p[i] = pattern_byte(seed, pos + i);
}

/* Index of the first byte that differs from the pattern, or -1. */
static inline long check_pattern(const uint8_t *p, size_t len, uint32_t seed, uint64_t pos)
{
    for (size_t i = 0; i < len; i++) {
        if (p[i] != pattern_byte(seed, pos + i))
            return (long)i;
    }
    return -1;
}

/*
 * After check_pattern found byte `bad` of p[0, len) wrong (the stream at pos): says on stderr what is there
 * instead, which tells a hole (still the canary), the sender's buffer reused too early (its fill byte), or bytes of
 * another part of the stream (a late or repeated write: their stream offset, searched within 4 MiB), and how long
 * the wrong run is.
 */
static inline void describe_mismatch(const uint8_t *p, size_t len, size_t bad, uint32_t seed, uint64_t pos,
                                     int canary, int sender_fill)
{
    size_t end = bad;
    while (end < len && p[end] != pattern_byte(seed, pos + end))
        end++;
    fprintf(stderr, "# mismatch at stream offset %llu (byte %zu of a read of %zu): %zu wrong bytes, then %s\n",
            (unsigned long long)(pos + bad), bad, len, end - bad, end < len ? "right again" : "the read ends");
    fprintf(stderr, "# got     :");
    for (size_t i = bad; i < bad + 16 && i < len; i++)
        fprintf(stderr, " %02x", p[i]);
    fprintf(stderr, "\n# expected:");
    for (size_t i = bad; i < bad + 16 && i < len; i++)
        fprintf(stderr, " %02x", pattern_byte(seed, pos + i));
    fprintf(stderr, "\n");
    size_t run = end - bad < 16 ? end - bad : 16;
    bool all_canary = run > 0, all_fill = run > 0;
    for (size_t i = bad; i < bad + run; i++) {
        all_canary = all_canary && p[i] == (uint8_t)canary;
        all_fill = all_fill && p[i] == (uint8_t)sender_fill;
    }
    if (all_canary)
        fprintf(stderr, "# the wrong bytes are the canary: nothing was written there\n");
    if (all_fill)
        fprintf(stderr, "# the wrong bytes are the sender's fill: its buffer was reused before the bytes left it\n");
    if (run < 8 || all_canary || all_fill)
        return;
    uint64_t here = pos + bad, lo = here > (4u << 20) ? here - (4u << 20) : 0, hi = here + (4u << 20);
    for (uint64_t o = lo; o < hi; o++) {
        size_t k = 0;
        while (k < run && p[bad + k] == pattern_byte(seed, o + k))
            k++;
        if (k == run) {
            fprintf(stderr, "# they are the stream's bytes at offset %llu (%+lld from where they landed)\n",
                    (unsigned long long)o, (long long)(o - here));
            return;
        }
    }
    fprintf(stderr, "# they are no part of the stream within 4 MiB\n");
}

static inline int wait_readable(int fd, int timeout_ms)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    return poll(&pfd, 1, timeout_ms);
}

/* Waits until rs_sdp_poll reports any of events (or timeout); returns the last mask. */
static inline unsigned wait_mask(struct rs_sdp_sock *s, unsigned events, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    rs_sdp_interest(s, events, 1);
    unsigned m;
    for (;;) {
        m = rs_sdp_poll(s);
        if ((m & events) || now_ms() >= deadline)
            break;
        wait_readable(rs_sdp_fd(s), (int)(deadline - now_ms()));
    }
    rs_sdp_interest(s, events, -1);
    return m;
}

#endif /* TEST_SDP_UTIL_H */
