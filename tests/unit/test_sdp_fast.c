/*
 * The short path (sdp_fast.c): rs_sdp_send_fast and rs_sdp_recv_fast on a connected pair. They must answer the
 * steady state's calls (a busy-polled ping-pong takes them every time), deliver exactly the bytes the general path
 * would, and decline everything outside the steady state so that the general path keeps its semantics: flags,
 * blocking waits, Nagle, large transfers, shutdown, the peer's close.
 */
#include "test_sdp_util.h"

#include <netinet/tcp.h>

/* Busy-polls the short path until it delivers something; returns what it returned. */
static ssize_t recv_fast_spin(struct rs_sdp_sock *s, void *buf, size_t len)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    for (;;) {
        ssize_t r = 0;
        assert_true(rs_sdp_recv_fast(s, buf, len, MSG_DONTWAIT, &r));
        if (r != -EAGAIN)
            return r;
        assert_true(now_ms() < deadline);
    }
}

/* One nonblocking receive, by the short path when it takes the call, else by the general one. */
static ssize_t recv_either(struct rs_sdp_sock *s, void *buf, size_t len)
{
    ssize_t r = 0;
    if (!rs_sdp_recv_fast(s, buf, len, MSG_DONTWAIT, &r))
        r = rs_sdp_recv(s, buf, len, MSG_DONTWAIT);
    return r;
}

/* Random sizes 1..200 B both ways, every call on the short path, every byte checked; nothing taken twice. */
static void test_ping_pong_takes_the_short_path(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    set_int(c, IPPROTO_TCP, TCP_NODELAY, 1);
    set_int(s, IPPROTO_TCP, TCP_NODELAY, 1);
    struct rs_sdp_stats before = sdp_stats(c);
    uint8_t out[256], in[256];
    uint64_t sent = 0;
    srand(7);
    for (int i = 0; i < 2000; i++) {
        size_t n = 1 + (size_t)(rand() % 200);
        struct rs_sdp_sock *from = i % 2 ? s : c, *to = i % 2 ? c : s;
        fill_pattern(out, n, (uint32_t)i + 1, 0);
        ssize_t r = -1;
        assert_true(rs_sdp_send_fast(from, out, n, MSG_NOSIGNAL, &r));
        assert_int_equal(r, (ssize_t)n);
        size_t got = 0;
        while (got < n) {
            ssize_t m = recv_fast_spin(to, in + got, sizeof(in) - got);
            assert_true(m > 0);
            got += (size_t)m;
        }
        assert_int_equal(got, n);
        assert_int_equal(check_pattern(in, n, (uint32_t)i + 1, 0), -1);
        if (from == c)
            sent += n;
    }
    struct rs_sdp_stats after = sdp_stats(c);
    assert_int_equal(after.bytes_sent - before.bytes_sent, sent);
    assert_int_equal(after.data_msgs_sent - before.data_msgs_sent, 1000);
    /* Where the RNIC has SEND with immediate (verbs: rxe is RoCE), the small messages went compact (docs/sdp.md
     * "Compact Data"), every one of them received as such; the soft RNIC has none. */
    struct rs_sdp_stats peer = sdp_stats(s);
    const char *compact = getenv("RDMASOCK_SDP_COMPACT");
    if (sdp_kind() == RS_RNIC_KIND_VERBS && !(compact && strcmp(compact, "off") == 0))
        assert_true(after.compact_sent - before.compact_sent > 500);
    else
        assert_int_equal(after.compact_sent, 0);
    assert_int_equal(peer.compact_received, after.compact_sent);
    /* Nothing is left over on either side. */
    ssize_t r = 0;
    assert_true(rs_sdp_recv_fast(c, in, sizeof(in), MSG_DONTWAIT, &r));
    assert_int_equal(r, -EAGAIN);
    assert_int_equal(rs_sdp_recv(s, in, sizeof(in), MSG_DONTWAIT), -EAGAIN);
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
}

/* What the short path declines, it leaves untouched: the general path then does the call as before. */
static void test_declines_outside_the_steady_state(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    set_int(c, IPPROTO_TCP, TCP_NODELAY, 1);
    uint8_t buf[8192];
    memset(buf, 'x', sizeof(buf));
    ssize_t r = 12345;
    /* Flags of the general path, empty and large transfers. */
    assert_false(rs_sdp_send_fast(c, buf, 10, MSG_MORE, &r));
    assert_false(rs_sdp_send_fast(c, buf, 0, 0, &r));
    assert_false(rs_sdp_send_fast(c, buf, 1000, 0, &r));
    assert_false(rs_sdp_recv_fast(s, buf, 10, MSG_PEEK | MSG_DONTWAIT, &r));
    assert_false(rs_sdp_recv_fast(s, buf, 10, MSG_WAITALL, &r));
    assert_false(rs_sdp_recv_fast(s, buf, sizeof(buf), MSG_DONTWAIT, &r));
    /* A blocking receive with nothing queued waits, which is the general path's business. */
    assert_false(rs_sdp_recv_fast(s, buf, 10, 0, &r));
    assert_int_equal(r, 12345);
    /* PEEK through the general path leaves the bytes for the short path. */
    assert_int_equal(rs_sdp_send(c, "hello", 5, 0), 5);
    uint8_t in[16] = { 0 };
    uint64_t deadline = now_ms() + WAIT_MS;
    while (rs_sdp_recv(s, in, sizeof(in), MSG_PEEK | MSG_DONTWAIT) != 5)
        assert_true(now_ms() < deadline);
    memset(in, 0, sizeof(in));
    assert_true(rs_sdp_recv_fast(s, in, 3, 0, &r));
    assert_int_equal(r, 3);
    assert_memory_equal(in, "hel", 3);
    assert_true(rs_sdp_recv_fast(s, in, sizeof(in), 0, &r));
    assert_int_equal(r, 2);
    assert_memory_equal(in, "lo", 2);
    /* After shutdown(SHUT_WR) a send is the general path's EPIPE; the peer reads the end of stream there. */
    assert_int_equal(rs_sdp_shutdown(c, SHUT_WR), 0);
    assert_false(rs_sdp_send_fast(c, buf, 10, MSG_NOSIGNAL, &r));
    assert_int_equal(rs_sdp_send(c, buf, 10, MSG_NOSIGNAL), -EPIPE);
    deadline = now_ms() + WAIT_MS;
    while ((r = recv_either(s, in, sizeof(in))) == -EAGAIN)
        assert_true(now_ms() < deadline);
    assert_int_equal(r, 0);
    assert_false(rs_sdp_recv_fast(s, in, sizeof(in), MSG_DONTWAIT, &r));
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
}

/* Nagle: a second small write while the first is unacknowledged is held by the general path, and arrives behind
 * the first. */
static void test_nagle_holds_the_second_write(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    ssize_t r = 0;
    assert_true(rs_sdp_send_fast(c, "a", 1, 0, &r));
    assert_int_equal(r, 1);
    if (!rs_sdp_send_fast(c, "b", 1, 0, &r))
        r = rs_sdp_send(c, "b", 1, 0);
    assert_int_equal(r, 1);
    char in[4] = { 0 };
    size_t got = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (got < 2) {
        ssize_t m = rs_sdp_recv(s, in + got, sizeof(in) - got, MSG_DONTWAIT);
        if (m > 0)
            got += (size_t)m;
        else
            assert_int_equal(m, -EAGAIN);
        assert_true(now_ms() < deadline);
    }
    assert_memory_equal(in, "ab", 2);
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
}

struct sender {
    struct rs_sdp_sock *s;
    const uint8_t *p;
    size_t n;
};

static void *sender(void *a)
{
    struct sender *x = a;
    send_all(x->s, x->p, x->n);
    return NULL;
}

/* Bytes the general path queued (a large write in many Data messages) come out of the short path intact. */
static void test_short_path_reads_a_large_write(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    size_t size = 1u << 20;
    uint8_t *out = malloc(size), *in = malloc(size);
    assert_non_null(out);
    assert_non_null(in);
    fill_pattern(out, size, 99, 0);
    pthread_t t;
    struct sender arg = { c, out, size };
    assert_int_equal(pthread_create(&t, NULL, sender, &arg), 0);
    size_t got = 0;
    uint64_t deadline = now_ms() + 4 * WAIT_MS;
    while (got < size) {
        size_t want = size - got < 4096 ? size - got : 4096;
        ssize_t r = recv_either(s, in + got, want);
        if (r > 0)
            got += (size_t)r;
        else
            assert_int_equal(r, -EAGAIN);
        assert_true(now_ms() < deadline);
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(check_pattern(in, size, 99, 0), -1);
    free(out);
    free(in);
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping_pong_takes_the_short_path),
        cmocka_unit_test(test_declines_outside_the_steady_state),
        cmocka_unit_test(test_nagle_holds_the_second_write),
        cmocka_unit_test(test_short_path_reads_a_large_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
