/*
 * Datagram sockets under load and in the special cases of issue 7: zero-copy placement into a waiting buffer
 * (and the race of a sink with its revocation), drops counted when the receiver is slow (small SO_RCVBUF) in
 * both modes, multicast and broadcast on loopback, loss (the soft RNIC's TEST ONLY drop knob) in both modes.
 *
 * Real sockets on 127.0.0.x, both ends in this process. RS_RNIC_KIND picks the provider (default soft).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/log.h"
#include "dgram_wr/dgram.h"
#include "rnic/soft/soft.h"     /* only rs_soft_test_set_drop, the TEST ONLY loss knob */
#include "rnic/verbs/verbs.h"   /* only rs_v_test_set_drop, the same knob in the verbs provider */
#include "test_dgram_util.h"

/* ---- zero copy ---- */

struct zc_recv {
    struct rs_dgram_sock *s;
    uint8_t *buf;
    size_t len;
    ssize_t result;
    struct sockaddr_in src;
};

static void *zc_receiver(void *arg)
{
    struct zc_recv *r = arg;
    socklen_t sl = sizeof(r->src);
    r->result = rs_dgram_recvfrom(r->s, r->buf, r->len, 0, (struct sockaddr *)&r->src, &sl);
    return NULL;
}

static void zero_copy_test(bool connected)
{
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=wrecord\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    if (connected)
        assert_int_equal(rs_dgram_connect(b.s, (struct sockaddr *)&a.addr, sizeof(a.addr)), 0);
    dt_warm(&a, &b);
    struct timeval tv = { 5, 0 };
    assert_int_equal(rs_dgram_setsockopt(b.s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    uint8_t *out = malloc(65536), *buf = malloc(65536);
    assert_non_null(out);
    assert_non_null(buf);
    if (!connected) {
        /* An unconnected receiver advertises to the peer that last sent it large datagrams. */
        dt_fill(out, 40000, 1);
        assert_int_equal(dt_send(&a, &b, out, 40000), 40000);
        assert_int_equal(dt_recv(&b, buf, 65536, NULL, 2000), 40000);
    }
    struct rs_dgram_stats a0 = dt_stats(&a), b0 = dt_stats(&b);
    const size_t lens[] = { 16384, 60000, 64512, 30000 };
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        size_t len = lens[i];
        dt_fill(out, len, (uint32_t)(i + 10));
        memset(buf, 0, 65536);
        struct zc_recv r = { .s = b.s, .buf = buf, .len = 65536, .result = 1 };
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, zc_receiver, &r), 0);
        dt_sleep_ms(50);        /* b's recv is waiting and has advertised its buffer */
        assert_int_equal(dt_send(&a, &b, out, len), (ssize_t)len);
        pthread_join(t, NULL);
        assert_int_equal(r.result, (ssize_t)len);
        assert_memory_equal(buf, out, len);
        assert_true(dt_same(&r.src, &a.addr));
    }
    struct rs_dgram_stats sa = dt_stats(&a), sb = dt_stats(&b);
    printf("# zero copy (%s): %llu of 4 placed directly, %llu copied\n", connected ? "connected" : "unconnected",
           (unsigned long long)(sb.rx_zcopy - b0.rx_zcopy), (unsigned long long)(sb.rx_copied - b0.rx_copied));
    /* Proof: every one went through a sink, none through the copy path. */
    assert_int_equal(sa.tx_sink - a0.tx_sink, 4);
    assert_int_equal(sb.sinks_filled - b0.sinks_filled, 4);
    assert_int_equal(sb.rx_zcopy - b0.rx_zcopy, 4);
    assert_int_equal(sb.rx_copied - b0.rx_copied, 0);
    /* Small datagrams and short buffers keep using the copy path. */
    struct zc_recv r = { .s = b.s, .buf = buf, .len = 1000, .result = 1 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, zc_receiver, &r), 0);
    dt_sleep_ms(30);
    assert_int_equal(dt_send(&a, &b, out, 900), 900);
    pthread_join(t, NULL);
    assert_int_equal(r.result, 900);
    assert_int_equal(dt_stats(&b).rx_zcopy, sb.rx_zcopy);
    free(out);
    free(buf);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_zero_copy_connected(void **state)
{
    (void)state;
    zero_copy_test(true);
}

static void test_zero_copy_unconnected(void **state)
{
    (void)state;
    zero_copy_test(false);
}

static void test_sink_revoked_salvaged(void **state)
{
    (void)state;
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=wrecord\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    assert_int_equal(rs_dgram_connect(b.s, (struct sockaddr *)&a.addr, sizeof(a.addr)), 0);
    dt_warm(&a, &b);
    struct timeval tv = { 0, 100000 };
    assert_int_equal(rs_dgram_setsockopt(b.s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    uint8_t *buf = malloc(65536), *out = malloc(60000);
    assert_non_null(buf);
    assert_non_null(out);
    memset(buf, 0x5a, 65536);
    struct rs_dgram_stats b0 = dt_stats(&b);
    /* b's recv advertises its buffer, then times out and takes it back before a uses it. */
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, 65536, 0, NULL, NULL), -EAGAIN);
    assert_int_equal(dt_stats(&b).sinks_revoked - b0.sinks_revoked, 1);
    /* a still holds the (fresh) advertisement and writes into it: the RNIC refuses, b salvages the payload. */
    dt_fill(out, 60000, 77);
    assert_int_equal(dt_send(&a, &b, out, 60000), 60000);
    assert_int_equal(dt_stats(&a).tx_sink, 1);
    uint8_t *got = malloc(65536);
    assert_non_null(got);
    assert_int_equal(dt_recv(&b, got, 65536, NULL, 2000), 60000);
    assert_memory_equal(got, out, 60000);
    /* The buffer the application got back was never written. */
    for (size_t i = 0; i < 65536; i++)
        if (buf[i] != 0x5a)
            fail_msg("revoked buffer written at %zu", i);
    struct rs_dgram_stats sb = dt_stats(&b);
    assert_int_equal(sb.sinks_salvaged - b0.sinks_salvaged, 1);
    assert_int_equal(sb.rx_dropped - b0.rx_dropped, 0);
    free(buf);
    free(out);
    free(got);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

/* ---- drops when the receiver is slow ---- */

static void drops_test(const char *rules, int count, int expect_lane)
{
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open_opts(&b, w, "127.0.0.1", 0, 4096, NULL);     /* SO_RCVBUF 4096: 8192 as Linux counts it */
    dt_warm(&a, &b);
    struct rs_dgram_stats b0 = dt_stats(&b);
    uint8_t out[1000];
    for (int i = 0; i < count; i++) {
        dt_fill(out, sizeof(out), (uint32_t)i);
        memcpy(out, &i, sizeof(i));
        assert_int_equal(dt_send(&a, &b, out, sizeof(out)), (ssize_t)sizeof(out));
    }
    dt_sleep_ms(100);
    int got = 0;
    uint8_t in[2000];
    ssize_t n;
    while ((n = dt_recv(&b, in, sizeof(in), NULL, 100)) >= 0) {
        assert_int_equal(n, (ssize_t)sizeof(out));
        int seq;
        memcpy(&seq, in, sizeof(seq));
        dt_fill(out, sizeof(out), (uint32_t)seq);
        memcpy(out, &seq, sizeof(seq));
        assert_memory_equal(in, out, sizeof(out));
        got++;
    }
    struct rs_dgram_stats sb = dt_stats(&b);
    uint64_t dropped = sb.rx_dropped - b0.rx_dropped;
    printf("# slow receiver: %d sent, %d received, %llu dropped and counted (no receive %llu, no room %llu)\n",
           count, got, (unsigned long long)dropped, (unsigned long long)(sb.rx_drop_no_recv - b0.rx_drop_no_recv),
           (unsigned long long)(sb.rx_drop_no_room - b0.rx_drop_no_room));
    /* Nothing vanishes uncounted, nothing waits for the receiver. */
    assert_int_equal(got + (int)dropped, count);
    assert_true(dropped > 0);
    /* 4 posted receives (8192 / 2048), plus what the lane took: its window, less the few records of the warm-up
     * it has not heard were consumed yet. */
    assert_true(got <= 4 + expect_lane);
    assert_true(got >= 4 + expect_lane - expect_lane / 8);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_drops_sendrecv(void **state)
{
    (void)state;
    drops_test("use both udp any 127.0.0.1 dgram=sendrecv\n", 200, 0);
}

static void test_drops_wrecord(void **state)
{
    (void)state;
    /* The lane (256 KiB, at most 256 unconsumed records) takes 256 datagrams of 1000 bytes, then the sender
     * falls back to SEND into the 4 posted receives, and the rest is dropped at b. */
    drops_test("use both udp any 127.0.0.1 dgram=wrecord\n", 600, 256);
}

/* ---- multicast and broadcast ---- */

/* Closing right after a burst loses nothing the sender's RNIC had taken: like a kernel UDP socket, whose close
 * leaves queued datagrams to the device, the socket lets its send queue finish before its QP goes (and before its
 * goodbye, which would otherwise overtake the datagrams and make the receiver refuse them). RS_TEST_ADDR as in
 * test_multicast, so it runs over verbs in the VM too. */
static void close_after_burst(const char *mode)
{
    const char *env_ip = getenv("RS_TEST_ADDR");
    const char *ip = env_ip && *env_ip ? env_ip : "127.0.0.1";
    char rules[200];
    snprintf(rules, sizeof(rules), "use both udp any %s dgram=%s\n", ip, mode);
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b;
    dt_open_opts(&b, w, ip, 0, 4 << 20, NULL);
    dt_open(&a, w, ip, 0);
    dt_warm(&a, &b);
    enum { BURST = 64, LEN = 1000 };
    uint8_t out[LEN], in[LEN + 1];
    struct rs_dgram_stats sa0 = dt_stats(&a);
    for (uint32_t i = 0; i < BURST; i++) {
        dt_fill(out, LEN, 1000 + i);
        assert_int_equal(dt_send(&a, &b, out, LEN), LEN);
    }
    struct rs_dgram_stats sa = dt_stats(&a);
    dt_close(&a);
    uint32_t got = 0;
    for (uint32_t i = 0; i < BURST; i++) {
        ssize_t n = dt_recv(&b, in, sizeof(in), NULL, 2000);
        if (n < 0)
            break;
        assert_int_equal(n, LEN);
        dt_fill(out, LEN, 1000 + i);
        assert_memory_equal(in, out, LEN);      /* in order, intact */
        got++;
    }
    unsigned long long rdma = (sa.tx_send + sa.tx_record + sa.tx_sink) - (sa0.tx_send + sa0.tx_record + sa0.tx_sink);
    printf("# %s: %u of %u datagrams sent just before close arrived (%llu of them over RDMA)\n", mode, got,
           (unsigned)BURST, rdma);
    assert_int_equal(got, BURST);
    assert_int_equal(rdma, BURST);
    dt_close(&b);
    dt_world_free(w);
}

static void test_close_after_burst_sendrecv(void **state)
{
    (void)state;
    close_after_burst("sendrecv");
}

static void test_close_after_burst_wrecord(void **state)
{
    (void)state;
    close_after_burst("wrecord");
}

static void test_multicast(void **state)
{
    (void)state;
    /* RS_TEST_ADDR: the address of an RDMA device (verbs in the VM: rdma_join_multicast on rxe0); dt_world skips
     * when the provider has no device for loopback. */
    const char *env_ip = getenv("RS_TEST_ADDR");
    const char *ip = env_ip && *env_ip ? env_ip : "127.0.0.1";
    char rules[200];
    snprintf(rules, sizeof(rules),
             "use rdma udp any 239.255.0.0/16 dgram=sendrecv\n"
             "use both udp any %s dgram=sendrecv\n", ip);
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b;
    dt_open(&a, w, ip, 0);
    dt_open(&b, w, "0.0.0.0", 0);
    struct ip_mreq m;
    inet_pton(AF_INET, "239.255.42.99", &m.imr_multiaddr);
    inet_pton(AF_INET, ip, &m.imr_interface);
    int rc = rs_dgram_setsockopt(b.s, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m));
    if (rc == -ENODEV || rc == -EADDRNOTAVAIL)
        skip();
    assert_int_equal(rc, 0);
    struct in_addr lo;
    inet_pton(AF_INET, ip, &lo);
    assert_int_equal(rs_dgram_setsockopt(a.s, IPPROTO_IP, IP_MULTICAST_IF, &lo, sizeof(lo)), 0);
    struct sockaddr_in group = { .sin_family = AF_INET, .sin_port = b.addr.sin_port, .sin_addr = m.imr_multiaddr };
    char buf[100];
    for (int i = 0; i < 20; i++) {
        char msg[32];
        int len = snprintf(msg, sizeof(msg), "group %d", i);
        assert_int_equal(dt_sendto(&a, &group, msg, (size_t)len), len);
        struct sockaddr_in src = { 0 };
        assert_int_equal(dt_recv(&b, buf, sizeof(buf), &src, 2000), len);
        assert_memory_equal(buf, msg, (size_t)len);
        assert_int_equal(src.sin_port, a.addr.sin_port);
    }
    struct rs_dgram_stats sa = dt_stats(&a), sb = dt_stats(&b);
    assert_int_equal(sa.tx_send, 20);           /* datagram-iWARP SEND to the group, no probe */
    assert_int_equal(sa.probes_sent, 0);
    assert_int_equal(sb.rx_rdma, 20);
    /* A plain sender to the group reaches the member unchanged. */
    int plain = dt_plain(env_ip && *env_ip ? ip : "127.0.0.2", 0);     /* a VM has one address */
    assert_int_equal(setsockopt(plain, IPPROTO_IP, IP_MULTICAST_IF, &lo, sizeof(lo)), 0);
    assert_int_equal(sendto(plain, "plain", 5, 0, (struct sockaddr *)&group, sizeof(group)), 5);
    assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 2000), 5);
    assert_memory_equal(buf, "plain", 5);
    assert_int_equal(dt_stats(&b).rx_kernel, 1);
    /* After leaving, nothing more arrives. */
    assert_int_equal(rs_dgram_setsockopt(b.s, IPPROTO_IP, IP_DROP_MEMBERSHIP, &m, sizeof(m)), 0);
    assert_int_equal(dt_sendto(&a, &group, "late", 4), 4);
    assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 200), -EAGAIN);
    close(plain);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_broadcast(void **state)
{
    (void)state;
    if (!dt_is_soft() || getenv("RS_TEST_ADDR"))
        skip();     /* 127.255.255.255 is the loopback broadcast address */
    struct dt_world *w = dt_world("use rdma udp any 127.0.0.0/8 dgram=sendrecv\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "0.0.0.0", 0);
    struct sockaddr_in bcast = { .sin_family = AF_INET, .sin_port = b.addr.sin_port };
    inet_pton(AF_INET, "127.255.255.255", &bcast.sin_addr);
    /* Without SO_BROADCAST, as the kernel would. */
    assert_int_equal(dt_sendto(&a, &bcast, "no", 2), -EACCES);
    int on = 1;
    assert_int_equal(rs_dgram_setsockopt(a.s, SOL_SOCKET, SO_BROADCAST, &on, sizeof(on)), 0);
    char buf[100];
    for (int i = 0; i < 10; i++) {
        char msg[32];
        int len = snprintf(msg, sizeof(msg), "bcast %d", i);
        assert_int_equal(dt_sendto(&a, &bcast, msg, (size_t)len), len);
        struct sockaddr_in src = { 0 };
        assert_int_equal(dt_recv(&b, buf, sizeof(buf), &src, 2000), len);
        assert_memory_equal(buf, msg, (size_t)len);
        assert_true(dt_same(&src, &a.addr));
    }
    assert_int_equal(dt_stats(&a).tx_send, 10);
    assert_int_equal(dt_stats(&b).rx_rdma, 10);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

/* ---- loss ---- */

/* Inbound datagrams of the (shared) RNIC lost: data, probes, reports, answers. The soft RNIC carries up to 64 KiB
 * in one datagram, so it loses 5%; over verbs a datagram is one MTU (a 65,000-byte message is 67 of them, a small
 * one up to 7), so 1% there loses about as many messages. */
static void set_loss(struct rs_rnic *rnic, bool on)
{
    if (dt_is_soft())
        rs_soft_test_set_drop(rnic, on ? 50000 : 0, 42);
    else
        rs_v_test_set_drop(rnic, on ? 10000 : 0, 42);
}

static void loss_test(const char *mode)
{
    const char *env_ip = getenv("RS_TEST_ADDR");
    const char *ip = env_ip && *env_ip ? env_ip : "127.0.0.1";
    char rules[200];
    snprintf(rules, sizeof(rules), "use both udp any %s dgram=%s\n", ip, mode);
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b;
    dt_open(&a, w, ip, 0);
    dt_open(&b, w, ip, 0);
    dt_warm(&a, &b);
    struct rs_dgram_stats b0 = dt_stats(&b);
    set_loss(rs_dgram_test_rnic(b.s), true);
    enum { COUNT = 1500 };
    static uint8_t seen[COUNT];
    memset(seen, 0, sizeof(seen));
    uint8_t *out = malloc(65507), *in = malloc(70000);
    assert_non_null(out);
    assert_non_null(in);
    int got = 0;
    size_t big = 0;
    for (int i = 0; i < COUNT; i++) {
        /* Mostly small, some beyond one segment (65,000 bytes: two datagrams on the soft RNIC's wire). */
        size_t len = i % 10 == 9 ? 65000 : 100 + (size_t)(i % 7) * 1000;
        big += len == 65000;
        dt_fill(out, len, (uint32_t)i);
        memcpy(out, &i, sizeof(i));
        assert_int_equal(dt_send(&a, &b, out, len), (ssize_t)len);
        ssize_t n;
        while ((n = dt_recv(&b, in, 70000, NULL, i % 20 == 19 ? 5 : 0)) >= 0) {
            int seq;
            memcpy(&seq, in, sizeof(seq));
            assert_true(seq >= 0 && seq < COUNT);
            size_t want = seq % 10 == 9 ? 65000 : 100 + (size_t)(seq % 7) * 1000;
            assert_int_equal(n, (ssize_t)want);
            dt_fill(out, want, (uint32_t)seq);
            memcpy(out, &seq, sizeof(seq));
            assert_memory_equal(in, out, want);     /* a damaged datagram is never delivered */
            assert_int_equal(seen[seq], 0);         /* nor one twice */
            seen[seq] = 1;
            got++;
        }
    }
    while (dt_recv(&b, in, 70000, NULL, 100) >= 0)
        got++;
    set_loss(rs_dgram_test_rnic(b.s), false);
    struct rs_dgram_stats sb = dt_stats(&b), sa = dt_stats(&a);
    printf("# %s loss: %d of %d delivered intact (%zu of 65,000 bytes); sender: send %llu record %llu "
           "kernel %llu; receiver: %llu partial dropped\n",
           dt_is_soft() ? "5%" : "1%", got, COUNT, big, (unsigned long long)sa.tx_send, (unsigned long long)sa.tx_record,
           (unsigned long long)sa.tx_kernel, (unsigned long long)(sb.rx_drop_partial - b0.rx_drop_partial));
    assert_true(got >= COUNT * 85 / 100);
    assert_true(got <= COUNT * 99 / 100);
    /* After the loss, the pair still works. */
    for (int i = 0; i < 5; i++)
        assert_int_equal(dt_send(&a, &b, "ok", 2), 2);
    int after = 0;
    while (dt_recv(&b, in, 100, NULL, 200) >= 0)
        after++;
    assert_int_equal(after, 5);
    free(out);
    free(in);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_loss_sendrecv(void **state)
{
    (void)state;
    loss_test("sendrecv");
}

static void test_loss_wrecord(void **state)
{
    (void)state;
    loss_test("wrecord");
}

int main(void)
{
    rs_log_configure_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_copy_connected),
        cmocka_unit_test(test_zero_copy_unconnected),
        cmocka_unit_test(test_sink_revoked_salvaged),
        cmocka_unit_test(test_drops_sendrecv),
        cmocka_unit_test(test_drops_wrecord),
        cmocka_unit_test(test_close_after_burst_sendrecv),
        cmocka_unit_test(test_close_after_burst_wrecord),
        cmocka_unit_test(test_multicast),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_loss_sendrecv),
        cmocka_unit_test(test_loss_wrecord),
    };
    return cmocka_run_group_tests_name("dgram_load", tests, NULL, NULL);
}
