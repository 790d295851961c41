/*
 * Regression tests for what the UDP compatibility matrix (tests/suites/compat_udp.sh) found in src/dgram_wr:
 *   - SO_RCVBUF raised after bind (iperf3 -w, ffmpeg's buffer_size) must size the posted receives as the kernel
 *     sizes its buffer at once; before, the receives stayed at the default and a paced stream lost datagrams
 *     the kernel kept;
 *   - what a socket moves over RDMA (and only that) shows in the process's statistics area and its socket slot
 *     (rdmasock stat), with the socket's addresses; before, UDP moved no counter at all;
 *   - an address of this host is never taken for a broadcast address: getifaddrs reports an address configured
 *     without `brd` (the soft-RoCE VM's dummy0) with itself as ifa_broadaddr, and every datagram to it failed
 *     with EACCES (reproduces only where such an address exists, e.g. in the VM: tests/suites/vm_compat_udp.sh);
 *   - a blocking recv is a thread-cancellation point (ffmpeg's UDP reader thread is stopped with pthread_cancel,
 *     then joined); before, the wait was a raw ppoll that no cancel request could end, and ffmpeg hung at exit.
 */
#include <ifaddrs.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "common/stats.h"
#include "test_dgram_util.h"

/* ---- SO_RCVBUF after bind ---- */

static void rcvbuf_after_bind(const char *rules)
{
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open_opts(&b, w, "127.0.0.1", 0, 4096, NULL);     /* 8192 as Linux counts it: 4 posted receives */
    dt_warm(&a, &b);
    /* As iperf3 -w does: after bind (and after the RDMA side exists). 64 KiB doubled pays for 64 receives. */
    int rcvbuf = 65536;
    assert_int_equal(rs_dgram_setsockopt(b.s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    socklen_t l = sizeof(rcvbuf);
    assert_int_equal(rs_dgram_getsockopt(b.s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &l), 0);
    if (rcvbuf < 40 * 2048)
        skip();     /* net.core.rmem_max below 40 KiB: the kernel would not grow either */
    struct rs_dgram_stats b0 = dt_stats(&b);
    enum { COUNT = 40, LEN = 1000 };
    uint8_t out[LEN], in[2 * LEN];
    for (int i = 0; i < COUNT; i++) {
        dt_fill(out, sizeof(out), (uint32_t)i);
        memcpy(out, &i, sizeof(i));
        assert_int_equal(dt_send(&a, &b, out, sizeof(out)), (ssize_t)sizeof(out));
    }
    dt_sleep_ms(100);       /* the receiver does not read while they arrive */
    int got = 0;
    ssize_t n;
    while ((n = dt_recv(&b, in, sizeof(in), NULL, 200)) >= 0) {
        assert_int_equal(n, LEN);
        int seq;
        memcpy(&seq, in, sizeof(seq));
        assert_int_equal(seq, got);     /* in order, none missing */
        dt_fill(out, sizeof(out), (uint32_t)seq);
        memcpy(out, &seq, sizeof(seq));
        assert_memory_equal(in, out, sizeof(out));
        got++;
    }
    struct rs_dgram_stats sb = dt_stats(&b);
    printf("# SO_RCVBUF %d after bind: %d of %d received, %llu dropped\n", rcvbuf, got, COUNT,
           (unsigned long long)(sb.rx_dropped - b0.rx_dropped));
    assert_int_equal(sb.rx_dropped - b0.rx_dropped, 0);
    assert_int_equal(got, COUNT);
    assert_int_equal(sb.rx_rdma - b0.rx_rdma, COUNT);
    /* A smaller value later keeps what was posted and the socket keeps working. */
    rcvbuf = 4096;
    assert_int_equal(rs_dgram_setsockopt(b.s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    dt_sync(&a, &b);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_rcvbuf_after_bind_sendrecv(void **state)
{
    (void)state;
    rcvbuf_after_bind("use both udp any 127.0.0.1 dgram=sendrecv\n");
}

static void test_rcvbuf_after_bind_wrecord(void **state)
{
    (void)state;
    /* wrecord: the lane takes these anyway; the posted receives grow all the same and nothing is lost. */
    rcvbuf_after_bind("use both udp any 127.0.0.1 dgram=wrecord\n");
}

/* ---- statistics area ---- */

struct counts {
    uint64_t bytes_tx, bytes_rx, msgs_tx, msgs_rx;
};

static struct counts process_counts(void)
{
    const struct rs_stats_counters *c = &rs_stats_get()->counters;
    return (struct counts){ rs_stats_counter_read(&c->rdma_bytes_tx[RS_STATS_PROTO_UDP]),
                            rs_stats_counter_read(&c->rdma_bytes_rx[RS_STATS_PROTO_UDP]),
                            rs_stats_counter_read(&c->rdma_msgs_tx[RS_STATS_PROTO_UDP]),
                            rs_stats_counter_read(&c->rdma_msgs_rx[RS_STATS_PROTO_UDP]) };
}

static struct rs_stats_socket slot_of(int slot)
{
    struct rs_stats_socket out;
    assert_int_equal(rs_stats_snapshot_slot(rs_stats_get(), (unsigned)slot, &out), 1);
    return out;
}

static void stats_test(const char *mode, size_t len)
{
    char rules[200];
    snprintf(rules, sizeof(rules), "use kernel udp any 127.0.0.2\nuse both udp any 127.0.0.1 dgram=%s\n", mode);
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b, k;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    dt_open(&k, w, "127.0.0.2", 0);     /* a peer the rules keep on the kernel */
    dt_warm(&a, &b);
    int slot_a = rs_stats_slot_acquire(a.fd, RS_STATS_PROTO_UDP);
    int slot_b = rs_stats_slot_acquire(b.fd, RS_STATS_PROTO_UDP);
    assert_true(slot_a >= 0 && slot_b >= 0);
    rs_dgram_set_stats_slot(a.s, slot_a);
    rs_dgram_set_stats_slot(b.s, slot_b);
    /* The addresses are published as soon as the slot is named (the socket was bound before). */
    struct rs_stats_socket sa = slot_of(slot_a);
    assert_int_equal(sa.local.sin6_port, a.addr.sin_port);
    struct counts c0 = process_counts();
    enum { COUNT = 10 };
    uint8_t *out = malloc(len), *in = malloc(len + 1);
    assert_non_null(out);
    assert_non_null(in);
    for (int i = 0; i < COUNT; i++) {
        dt_fill(out, len, (uint32_t)i);
        assert_int_equal(dt_send(&a, &b, out, len), (ssize_t)len);
        assert_int_equal(dt_recv(&b, in, len + 1, NULL, 2000), (ssize_t)len);
        assert_memory_equal(in, out, len);
    }
    /* Through the kernel (rule): not RDMA, so not counted. */
    for (int i = 0; i < COUNT; i++) {
        assert_int_equal(dt_send(&a, &k, out, len), (ssize_t)len);
        assert_int_equal(dt_recv(&k, in, len + 1, NULL, 2000), (ssize_t)len);
    }
    struct counts c1 = process_counts();
    /* a and b live in this one process: the process counters see both ends. */
    assert_int_equal(c1.bytes_tx - c0.bytes_tx, COUNT * len);
    assert_int_equal(c1.msgs_tx - c0.msgs_tx, COUNT);
    assert_int_equal(c1.bytes_rx - c0.bytes_rx, COUNT * len);
    assert_int_equal(c1.msgs_rx - c0.msgs_rx, COUNT);
    sa = slot_of(slot_a);
    struct rs_stats_socket sb = slot_of(slot_b);
    assert_int_equal(sa.bytes_tx, COUNT * len);
    assert_int_equal(sa.msgs_tx, COUNT);
    assert_int_equal(sa.bytes_rx, 0);
    assert_int_equal(sb.bytes_rx, COUNT * len);
    assert_int_equal(sb.msgs_rx, COUNT);
    assert_int_equal(sb.local.sin6_port, b.addr.sin_port);
    /* connect() publishes the peer. */
    assert_int_equal(rs_dgram_connect(a.s, (struct sockaddr *)&b.addr, sizeof(b.addr)), 0);
    sa = slot_of(slot_a);
    assert_int_equal(sa.peer.sin6_port, b.addr.sin_port);
    free(out);
    free(in);
    dt_close(&a);
    dt_close(&b);
    dt_close(&k);
    rs_stats_slot_release(slot_a);
    rs_stats_slot_release(slot_b);
    dt_world_free(w);
}

static void test_stats_sendrecv(void **state)
{
    (void)state;
    stats_test("sendrecv", 1000);
}

static void test_stats_wrecord(void **state)
{
    (void)state;
    /* 32 KiB datagrams: lane records, the Write-Record path. */
    stats_test("wrecord", 32768);
}

/* ---- thread cancellation ---- */

struct blocked_recv {
    struct dt_ep *ep;
    uint8_t *buf;
    size_t len;
    volatile int started;
};

static void *blocked_recv_main(void *arg)
{
    struct blocked_recv *b = arg;
    b->started = 1;
    /* Deferred cancellation, as ffmpeg's reader thread: only a cancellation point can end this call. */
    ssize_t n = rs_dgram_recvfrom(b->ep->s, b->buf, b->len, 0, NULL, NULL);
    return (void *)(intptr_t)n;     /* reached only if a datagram came: the test fails then */
}

static void cancel_test(const char *mode, size_t len)
{
    char rules[120];
    snprintf(rules, sizeof(rules), "use both udp any 127.0.0.1 dgram=%s\n", mode);
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    dt_warm(&a, &b);
    uint8_t *abandoned = malloc(len);
    assert_non_null(abandoned);
    memset(abandoned, 0x5a, len);
    if (len >= 16384) {
        /* A sink is advertised to the latest sender of large datagrams: make a that sender. */
        memset(abandoned, 1, len);
        assert_int_equal(dt_send(&a, &b, abandoned, len), (ssize_t)len);
        assert_int_equal(dt_recv(&b, abandoned, len, NULL, 2000), (ssize_t)len);
        memset(abandoned, 0x5a, len);
    }
    uint64_t sinks0 = dt_stats(&b).sinks_advertised;
    struct blocked_recv br = { .ep = &b, .buf = abandoned, .len = len };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, blocked_recv_main, &br), 0);
    while (!br.started)
        dt_sleep_ms(1);
    dt_sleep_ms(50);        /* let it block (and, with a large buffer in wrecord, advertise its sink) */
    if (len >= 16384)
        assert_true(dt_stats(&b).sinks_advertised > sinks0);   /* the case under test: a sink was out */
    assert_int_equal(pthread_cancel(th), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    void *ret = NULL;
    int rc = pthread_timedjoin_np(th, &ret, &until);
    if (rc == ETIMEDOUT)
        fail_msg("a thread blocked in recv was not cancelled within 5 s");
    assert_int_equal(rc, 0);
    assert_ptr_equal(ret, PTHREAD_CANCELED);
    /* The socket works on: the cancelled wait is gone, the sink (if any) revoked, and a datagram that fits it goes
     * to the next reader, never into the abandoned buffer. */
    uint8_t *out = malloc(len), *in = malloc(len + 1);
    assert_non_null(out);
    assert_non_null(in);
    dt_fill(out, len, 7);
    assert_int_equal(dt_send(&a, &b, out, len), (ssize_t)len);
    assert_int_equal(dt_recv(&b, in, len + 1, NULL, 2000), (ssize_t)len);
    assert_memory_equal(in, out, len);
    for (size_t i = 0; i < len; i++)
        if (abandoned[i] != 0x5a)
            fail_msg("the cancelled reader's buffer was written at %zu", i);
    dt_sync(&a, &b);
    free(out);
    free(in);
    free(abandoned);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_cancel_blocked_recv_sendrecv(void **state)
{
    (void)state;
    cancel_test("sendrecv", 1500);
}

static void test_cancel_blocked_recv_sink(void **state)
{
    (void)state;
    /* 60,000-byte buffer in wrecord mode: the blocked recv advertises it as a sink before it is cancelled. */
    cancel_test("wrecord", 60000);
}

/* ---- broadcast detection ---- */

bool rs_dg_is_group(const struct sockaddr *sa, bool *broadcast);   /* dgram_int.h */

static void test_local_addresses_are_not_broadcast(void **state)
{
    (void)state;
    struct ifaddrs *list = NULL;
    assert_int_equal(getifaddrs(&list), 0);
    int checked = 0;
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        bool broadcast = true;
        char text[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, text, sizeof(text));
        if (rs_dg_is_group(i->ifa_addr, &broadcast) || broadcast)
            fail_msg("%s (%s) is this host's address, taken for a broadcast or group address", text, i->ifa_name);
        checked++;
    }
    freeifaddrs(list);
    assert_true(checked >= 1);      /* loopback at least */
    struct sockaddr_in all = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_BROADCAST) };
    bool broadcast = false;
    assert_true(rs_dg_is_group((struct sockaddr *)&all, &broadcast));
    assert_true(broadcast);
}

/* A receiver on a fixed port, senders on ephemeral ports (ffmpeg, VLC, sipp clients): a rule can only name the
 * receiver's port. The sender probes it (the rule names its peer); the receiver lets it in because the rule names
 * its own address and port. */
static void test_rule_naming_the_receivers_port(void **state)
{
    (void)state;
    int probe = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in any = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof(any);
    assert_int_equal(bind(probe, (struct sockaddr *)&any, sizeof(any)), 0);
    assert_int_equal(getsockname(probe, (struct sockaddr *)&any, &al), 0);
    close(probe);
    uint16_t port = ntohs(any.sin_port);
    char rules[128];
    snprintf(rules, sizeof(rules), "use both udp any 127.0.0.1:%u\n", (unsigned)port);
    struct dt_world *w = dt_world(rules);
    struct dt_ep sender, receiver;
    dt_open(&receiver, w, "127.0.0.1", port);
    dt_open(&sender, w, "127.0.0.1", 0);
    uint8_t buf[256], in[512];
    uint64_t end = dt_now_ms() + 5000;
    int sent = 0, got = 0;
    while (dt_now_ms() < end && dt_stats(&receiver).rx_rdma == 0) {
        dt_fill(buf, sizeof(buf), (uint32_t)sent);
        assert_int_equal(dt_send(&sender, &receiver, buf, sizeof(buf)), (ssize_t)sizeof(buf));
        sent++;
        while (dt_recv(&receiver, in, sizeof(in), NULL, 20) == (ssize_t)sizeof(buf))
            got++;
    }
    dt_sync(&sender, &receiver);
    struct rs_dgram_stats r = dt_stats(&receiver), s = dt_stats(&sender);
    printf("# %d sent, %d received before the switch; receiver: %llu over RDMA, %llu refusals sent\n", sent, got,
           (unsigned long long)r.rx_rdma, (unsigned long long)r.refusals_sent);
    assert_int_equal(r.refusals_sent, 0);
    assert_true(s.answers_received >= 1);
    assert_true(r.rx_rdma >= 1);
    dt_close(&sender);
    dt_close(&receiver);
    dt_world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rcvbuf_after_bind_sendrecv),
        cmocka_unit_test(test_rcvbuf_after_bind_wrecord),
        cmocka_unit_test(test_stats_sendrecv),
        cmocka_unit_test(test_stats_wrecord),
        cmocka_unit_test(test_cancel_blocked_recv_sendrecv),
        cmocka_unit_test(test_cancel_blocked_recv_sink),
        cmocka_unit_test(test_local_addresses_are_not_broadcast),
        cmocka_unit_test(test_rule_naming_the_receivers_port),
    };
    return cmocka_run_group_tests_name("dgram_apps", tests, NULL, NULL);
}
