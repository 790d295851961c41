/*
 * Datagram sockets over datagram RDMA (src/dgram_wr, dgram.h): both modes (sendrecv, wrecord) with every size
 * from 0 to 65,507 and data checks, source addresses, MSG_TRUNC / MSG_PEEK / MSG_DONTWAIT, connected UDP, a plain
 * kernel UDP peer on the same port in both directions, discovery never reaching the application, a peer restart,
 * the readiness fd, timeouts and EINTR, threads.
 *
 * Real sockets on 127.0.0.x, no mocks. Both ends live in this process and share one RNIC. The provider comes from
 * RS_RNIC_KIND (soft | verbs, default soft); tests that need the soft RNIC's own behaviour skip elsewhere. A plain
 * peer binds 127.0.0.2, which the test rules (`127.0.0.1`) do not cover, so it stays on the kernel.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/log.h"
#include "dgram_wr/dgram.h"
#include "test_dgram_util.h"

/* ---- sizes, both modes ---- */

static const size_t sizes[] = { 0, 1, 2, 17, 255, 256, 257, 1023, 1024, 1025, 4096, 9000, 16383, 16384, 32768,
                                60000, 64511, 64512, 64513, 65000, 65506, 65507 };

static void exchange_sizes(const char *rules)
{
    struct dt_ep a, b;
    struct dt_world *w = dt_pair_open(&a, &b, rules);
    struct rs_dgram_stats sa0 = dt_stats(&a), sb0 = dt_stats(&b);
    uint8_t *out = malloc(65507), *in = malloc(70000);
    assert_non_null(out);
    assert_non_null(in);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i];
        dt_fill(out, len, (uint32_t)(len * 7 + 1));
        /* a -> b, then b -> a */
        assert_int_equal(dt_send(&a, &b, out, len), (ssize_t)len);
        struct sockaddr_in src = { 0 };
        memset(in, 0xee, 70000);
        ssize_t n = dt_recv(&b, in, 70000, &src, 2000);
        assert_int_equal(n, (ssize_t)len);
        assert_memory_equal(in, out, len);
        assert_int_equal(in[len], 0xee);            /* nothing written past the datagram */
        assert_true(dt_same(&src, &a.addr));
        assert_int_equal(dt_send(&b, &a, out, len), (ssize_t)len);
        n = dt_recv(&a, in, 70000, &src, 2000);
        assert_int_equal(n, (ssize_t)len);
        assert_memory_equal(in, out, len);
        assert_true(dt_same(&src, &b.addr));
    }
    struct rs_dgram_stats sa = dt_stats(&a), sb = dt_stats(&b);
    size_t count = sizeof(sizes) / sizeof(sizes[0]);
    /* Every datagram of the test went over RDMA, none through the kernel. */
    assert_int_equal(sa.tx_kernel - sa0.tx_kernel, 0);
    assert_int_equal(sb.tx_kernel - sb0.tx_kernel, 0);
    assert_int_equal(sb.rx_rdma - sb0.rx_rdma, count);
    assert_int_equal(sa.rx_rdma - sa0.rx_rdma, count);
    printf("# a: send %llu record %llu sink %llu; b received %llu copied, %llu zero-copy\n",
           (unsigned long long)(sa.tx_send - sa0.tx_send), (unsigned long long)(sa.tx_record - sa0.tx_record),
           (unsigned long long)(sa.tx_sink - sa0.tx_sink), (unsigned long long)(sb.rx_copied - sb0.rx_copied),
           (unsigned long long)(sb.rx_zcopy - sb0.rx_zcopy));
    if (strstr(rules, "wrecord")) {
        assert_true(sa.tx_record - sa0.tx_record >= count);
        assert_int_equal(sa.tx_send - sa0.tx_send, 0);
    } else {
        assert_int_equal(sa.tx_send - sa0.tx_send, count);
        assert_int_equal(sa.tx_record - sa0.tx_record, 0);
    }
    free(out);
    free(in);
    dt_pair_close(&a, &b, w);
}

static void test_sizes_sendrecv(void **state)
{
    (void)state;
    exchange_sizes("use both udp any 127.0.0.1 dgram=sendrecv\n");
}

static void test_sizes_wrecord(void **state)
{
    (void)state;
    exchange_sizes("use both udp any 127.0.0.1 dgram=wrecord\n");
}

static void test_too_big(void **state)
{
    (void)state;
    struct dt_ep a, b;
    struct dt_world *w = dt_pair_open(&a, &b, "use both udp any 127.0.0.1 dgram=sendrecv\n");
    uint8_t *buf = calloc(1, 70000);
    assert_non_null(buf);
    /* The IPv4 UDP limit holds over RDMA too, although the RNIC could carry more. */
    assert_int_equal(dt_send(&a, &b, buf, 65508), -EMSGSIZE);
    assert_int_equal(dt_send(&a, &b, buf, 65507), 65507);
    free(buf);
    dt_pair_close(&a, &b, w);
}

/* ---- flags and boundaries ---- */

static void flags_test(const char *rules)
{
    struct dt_ep a, b;
    struct dt_world *w = dt_pair_open(&a, &b, rules);
    char buf[64];
    struct sockaddr_in src = { 0 };
    socklen_t sl = sizeof(src);
    /* MSG_DONTWAIT on an empty socket. */
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL), -EAGAIN);
    /* Boundaries: two datagrams stay two. */
    assert_int_equal(dt_send(&a, &b, "first", 5), 5);
    assert_int_equal(dt_send(&a, &b, "second!", 7), 7);
    dt_wait_readable(&b, 2000);
    /* MSG_PEEK twice returns the same datagram, then a normal read consumes it. */
    memset(buf, 0, sizeof(buf));
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_PEEK, (struct sockaddr *)&src, &sl), 5);
    assert_memory_equal(buf, "first", 5);
    assert_true(dt_same(&src, &a.addr));
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT, NULL, NULL), 5);
    assert_int_equal(rs_dgram_inq(b.s), 5);
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), 0, NULL, NULL), 5);
    /* Truncation: 3 bytes of 7; MSG_TRUNC in msg_flags; the rest of the datagram is gone. */
    struct iovec iov = { .iov_base = buf, .iov_len = 3 };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    dt_wait_readable(&b, 2000);
    assert_int_equal(rs_dgram_recvmsg(b.s, &msg, 0), 3);
    assert_memory_equal(buf, "sec", 3);
    assert_true(msg.msg_flags & MSG_TRUNC);
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL), -EAGAIN);
    /* MSG_TRUNC as a flag returns the real length (Linux UDP). */
    assert_int_equal(dt_send(&a, &b, "0123456789", 10), 10);
    dt_wait_readable(&b, 2000);
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, 4, MSG_TRUNC, NULL, NULL), 10);
    assert_memory_equal(buf, "0123", 4);
    /* Scatter over several iovecs, and a zero-length buffer still consumes the datagram. */
    assert_int_equal(dt_send(&a, &b, "abcdefgh", 8), 8);
    assert_int_equal(dt_send(&a, &b, "zz", 2), 2);
    char p1[3], p2[10];
    struct iovec two[2] = { { p1, sizeof(p1) }, { p2, sizeof(p2) } };
    struct msghdr m2 = { .msg_iov = two, .msg_iovlen = 2 };
    dt_wait_readable(&b, 2000);
    assert_int_equal(rs_dgram_recvmsg(b.s, &m2, 0), 8);
    assert_memory_equal(p1, "abc", 3);
    assert_memory_equal(p2, "defgh", 5);
    assert_false(m2.msg_flags & MSG_TRUNC);
    dt_wait_readable(&b, 2000);
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, 0, 0, NULL, NULL), 0);
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL), -EAGAIN);
    /* Sending from several iovecs. */
    struct iovec parts[3] = { { "ab", 2 }, { "", 0 }, { "cde", 3 } };
    struct msghdr sm = { .msg_name = &b.addr, .msg_namelen = sizeof(b.addr), .msg_iov = parts, .msg_iovlen = 3 };
    assert_int_equal(rs_dgram_sendmsg(a.s, &sm, 0), 5);
    assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 2000), 5);
    assert_memory_equal(buf, "abcde", 5);
    dt_pair_close(&a, &b, w);
}

static void test_flags_sendrecv(void **state)
{
    (void)state;
    flags_test("use both udp any 127.0.0.1 dgram=sendrecv\n");
}

static void test_flags_wrecord(void **state)
{
    (void)state;
    flags_test("use both udp any 127.0.0.1 dgram=wrecord\n");
}

/* ---- connected UDP ---- */

static void connected_test(const char *rules)
{
    struct dt_world *w = dt_world(rules);
    struct dt_ep a, b, other;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    dt_open(&other, w, "127.0.0.1", 0);
    assert_int_equal(rs_dgram_connect(a.s, (struct sockaddr *)&b.addr, sizeof(b.addr)), 0);
    assert_int_equal(rs_dgram_connect(b.s, (struct sockaddr *)&a.addr, sizeof(a.addr)), 0);
    struct sockaddr_in pn;
    socklen_t pl = sizeof(pn);
    assert_int_equal(rs_dgram_getpeername(a.s, (struct sockaddr *)&pn, &pl), 0);
    assert_true(dt_same(&pn, &b.addr));
    dt_warm(&a, &b);
    char buf[100];
    for (int i = 0; i < 20; i++) {
        char msg[32];
        int len = snprintf(msg, sizeof(msg), "conn %d", i);
        assert_int_equal(rs_dgram_sendto(a.s, msg, (size_t)len, 0, NULL, 0), len);
        struct sockaddr_in src = { 0 };
        assert_int_equal(dt_recv(&b, buf, sizeof(buf), &src, 2000), len);
        assert_memory_equal(buf, msg, (size_t)len);
        assert_true(dt_same(&src, &a.addr));
        assert_int_equal(rs_dgram_sendto(b.s, msg, (size_t)len, 0, NULL, 0), len);
        assert_int_equal(dt_recv(&a, buf, sizeof(buf), &src, 2000), len);
    }
    struct rs_dgram_stats st = dt_stats(&a);
    assert_true(st.rx_rdma >= 20);
    /* A connected socket only hears its peer: a datagram from elsewhere never shows. */
    assert_int_equal(dt_send(&other, &a, "intruder", 8), 8);
    assert_int_equal(rs_dgram_sendto(b.s, "peer", 4, 0, NULL, 0), 4);
    struct sockaddr_in src = { 0 };
    assert_int_equal(dt_recv(&a, buf, sizeof(buf), &src, 2000), 4);
    assert_memory_equal(buf, "peer", 4);
    assert_int_equal(dt_recv(&a, buf, sizeof(buf), &src, 100), -EAGAIN);
    /* Without an address an unconnected socket has nowhere to send. */
    assert_int_equal(rs_dgram_sendto(other.s, "x", 1, 0, NULL, 0), -EDESTADDRREQ);
    /* Dissolving the association. */
    struct sockaddr unspec = { .sa_family = AF_UNSPEC };
    assert_int_equal(rs_dgram_connect(a.s, &unspec, sizeof(unspec)), 0);
    assert_int_equal(rs_dgram_sendto(a.s, "x", 1, 0, NULL, 0), -EDESTADDRREQ);
    dt_close(&a);
    dt_close(&b);
    dt_close(&other);
    dt_world_free(w);
}

static void test_connected_sendrecv(void **state)
{
    (void)state;
    connected_test("use both udp any 127.0.0.1 dgram=sendrecv\n");
}

static void test_connected_wrecord(void **state)
{
    (void)state;
    connected_test("use both udp any 127.0.0.1 dgram=wrecord\n");
}

/* ---- a plain kernel peer on the same port ---- */

static void plain_peer_test(const char *rules)
{
    struct dt_ep a, b;
    struct dt_world *w = dt_pair_open(&a, &b, rules);  /* a's port carries RDMA traffic as well */
    int plain = dt_plain("127.0.0.2", 0);
    struct sockaddr_in paddr = dt_plain_addr(plain);
    uint8_t *out = malloc(65507), *in = malloc(70000);
    assert_non_null(out);
    assert_non_null(in);
    struct rs_dgram_stats before = dt_stats(&a);
    /* Payloads that look like datagram-iWARP or like our control messages must pass untouched too. */
    static const uint8_t ddp_like[] = { 0x41, 0x43, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
                                        'd', 'a', 't', 'a', 0xde, 0xad, 0xbe, 0xef };
    static const uint8_t magic_like[] = { 'R', 'S', 'D', 'G', 1, 1, 0, 8, 1, 2, 3 };
    const size_t lens[] = { 0, 1, 100, 1472, 9000, 65507 };
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]) + 2; i++) {
        size_t len;
        if (i < sizeof(lens) / sizeof(lens[0])) {
            len = lens[i];
            dt_fill(out, len, (uint32_t)(i + 99));
        } else if (i == sizeof(lens) / sizeof(lens[0])) {
            len = sizeof(ddp_like);
            memcpy(out, ddp_like, len);
        } else {
            len = sizeof(magic_like);
            memcpy(out, magic_like, len);
        }
        /* plain -> converted */
        assert_int_equal(sendto(plain, out, len, 0, (struct sockaddr *)&a.addr, sizeof(a.addr)), (ssize_t)len);
        struct sockaddr_in src = { 0 };
        ssize_t n = dt_recv(&a, in, 70000, &src, 2000);
        assert_int_equal(n, (ssize_t)len);
        assert_memory_equal(in, out, len);
        assert_true(dt_same(&src, &paddr));
        /* converted -> plain */
        assert_int_equal(dt_sendto(&a, &paddr, out, len), (ssize_t)len);
        socklen_t sl = sizeof(src);
        n = dt_plain_recv(plain, in, 70000, &src, &sl, 2000);
        assert_int_equal(n, (ssize_t)len);
        assert_memory_equal(in, out, len);
        assert_true(dt_same(&src, &a.addr));
    }
    struct rs_dgram_stats after = dt_stats(&a);
    size_t count = sizeof(lens) / sizeof(lens[0]) + 2;
    assert_int_equal(after.rx_kernel - before.rx_kernel, count);
    assert_int_equal(after.tx_kernel - before.tx_kernel, count);
    assert_int_equal(after.probes_sent - before.probes_sent, 0);     /* no rule names the plain peer */
    /* RDMA still works on the same port afterwards. */
    assert_int_equal(dt_send(&b, &a, "rdma", 4), 4);
    assert_int_equal(dt_recv(&a, in, 100, NULL, 2000), 4);
    assert_true(dt_stats(&a).rx_rdma > after.rx_rdma);
    free(out);
    free(in);
    close(plain);
    dt_pair_close(&a, &b, w);
}

static void test_plain_peer_sendrecv(void **state)
{
    (void)state;
    plain_peer_test("use both udp any 127.0.0.1 dgram=sendrecv\n");
}

static void test_plain_peer_wrecord(void **state)
{
    (void)state;
    plain_peer_test("use both udp any 127.0.0.1 dgram=wrecord\n");
}

/* ---- discovery ---- */

static void test_probe_invisible(void **state)
{
    (void)state;
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=sendrecv\n"
                                  "use both udp any 127.0.0.2 dgram=sendrecv\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    /* The first datagram travels through the kernel while a probes b; b answers inside its recv and returns
     * only the datagram. */
    assert_int_equal(dt_send(&a, &b, "hello", 5), 5);
    char buf[100];
    assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 2000), 5);
    assert_memory_equal(buf, "hello", 5);
    assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 100), -EAGAIN);
    struct rs_dgram_stats sb = dt_stats(&b);
    assert_true(sb.probes_received >= 1);
    assert_true(sb.answers_sent >= 1);
    assert_int_equal(sb.rx_kernel, 1);          /* the application saw one plain datagram: "hello" */
    /* A probe forged by a plain socket (a rule names 127.0.0.2 as a peer): answered, never delivered. */
    int plain = dt_plain("127.0.0.2", 0);
    uint8_t probe[32] = { 'R', 'S', 'D', 'G', 1, 1, 0, 8 };
    probe[15] = 7;                              /* instance 7 */
    probe[23] = 9;                              /* nonce 9 */
    probe[25] = 1;                              /* rnic kind soft */
    if (dt_kind() != 1)
        probe[25] = 2;
    assert_int_equal(sendto(plain, probe, sizeof(probe), 0, (struct sockaddr *)&b.addr, sizeof(b.addr)), 32);
    assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 200), -EAGAIN);
    uint8_t ans[100];
    struct sockaddr_in src = { 0 };
    socklen_t sl = sizeof(src);
    ssize_t n = dt_plain_recv(plain, ans, sizeof(ans), &src, &sl, 2000);
    assert_int_equal(n, 24 + 32);
    assert_memory_equal(ans, "RSDG", 4);
    assert_int_equal(ans[5], 2);                /* ANSWER */
    assert_int_equal(ans[23], 9);               /* our nonce echoed */
    assert_int_equal(ans[24] & 1, 1);           /* accepted */
    assert_true(dt_same(&src, &b.addr));
    assert_int_equal(dt_stats(&b).rx_kernel, 1);
    close(plain);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_kernel_rule(void **state)
{
    (void)state;
    /* 127.0.0.1 is not named: every peer stays on the kernel, nobody is probed. */
    struct dt_world *w = dt_world("use both udp any 10.99.0.0/16 dgram=sendrecv\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    char buf[16];
    for (int i = 0; i < 5; i++) {
        assert_int_equal(dt_send(&a, &b, "k", 1), 1);
        assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 2000), 1);
    }
    struct rs_dgram_stats sa = dt_stats(&a), sb = dt_stats(&b);
    assert_int_equal(sa.tx_kernel, 5);
    assert_int_equal(sa.probes_sent, 0);
    assert_int_equal(sb.rx_kernel, 5);
    assert_int_equal(sb.rx_rdma, 0);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

static void test_rdma_mode_unreachable(void **state)
{
    (void)state;
    /* `rdma` names a peer that does not run rdmasock: the send fails after the probes, nothing else reaches it. */
    struct dt_world *w = dt_world("use rdma udp any 127.0.0.2 dgram=sendrecv\n");
    struct dt_ep a;
    dt_open(&a, w, "127.0.0.1", 0);
    int plain = dt_plain("127.0.0.2", 0);
    struct sockaddr_in paddr = dt_plain_addr(plain);
    uint64_t t0 = dt_now_ms();
    assert_int_equal(dt_sendto(&a, &paddr, "data", 4), -EHOSTUNREACH);
    uint64_t took = dt_now_ms() - t0;
    assert_true(took >= 250 && took < 2000);    /* three probes 100 ms apart */
    uint8_t buf[100];
    struct sockaddr_in src = { 0 };
    socklen_t sl;
    int probes = 0;
    for (;;) {
        sl = sizeof(src);
        ssize_t n = dt_plain_recv(plain, buf, sizeof(buf), &src, &sl, 50);
        if (n < 0)
            break;
        assert_int_equal(n, 32);
        assert_memory_equal(buf, "RSDG", 4);
        assert_int_equal(buf[5], 1);
        probes++;
    }
    assert_int_equal(probes, 3);
    /* Later sends fail at once (negative cache) instead of probing again. */
    t0 = dt_now_ms();
    assert_int_equal(dt_sendto(&a, &paddr, "data", 4), -EHOSTUNREACH);
    assert_true(dt_now_ms() - t0 < 50);
    close(plain);
    dt_close(&a);
    dt_world_free(w);
}

static void test_both_mode_plain_peer(void **state)
{
    (void)state;
    /* `both` names a peer without rdmasock: it receives a few probes (they cannot be avoided) and then every
     * datagram as plain UDP, nothing lost, the first ones included. */
    struct dt_world *w = dt_world("use both udp any 127.0.0.2 dgram=wrecord\n");
    struct dt_ep a;
    dt_open(&a, w, "127.0.0.1", 0);
    int plain = dt_plain("127.0.0.2", 0);
    struct sockaddr_in paddr = dt_plain_addr(plain);
    int data = 0, probes = 0;
    for (int i = 0; i < 50; i++) {
        char msg[16];
        int len = snprintf(msg, sizeof(msg), "m%d", i);
        assert_int_equal(dt_sendto(&a, &paddr, msg, (size_t)len), len);
        dt_sleep_ms(10);
    }
    uint8_t buf[100];
    struct sockaddr_in src = { 0 };
    socklen_t sl;
    for (;;) {
        sl = sizeof(src);
        ssize_t n = dt_plain_recv(plain, buf, sizeof(buf), &src, &sl, 100);
        if (n < 0)
            break;
        if (n >= 4 && memcmp(buf, "RSDG", 4) == 0) {
            probes++;
            continue;
        }
        char expect[16];
        int len = snprintf(expect, sizeof(expect), "m%d", data);
        assert_int_equal(n, len);
        assert_memory_equal(buf, expect, (size_t)len);
        data++;
    }
    assert_int_equal(data, 50);
    assert_int_equal(probes, 3);
    close(plain);
    dt_close(&a);
    dt_world_free(w);
}

/* ---- peer restart ---- */

static void restart_test(const char *rules)
{
    struct dt_ep a, b;
    struct dt_world *w = dt_pair_open(&a, &b, rules);
    char buf[2000];
    uint8_t out[1500];
    dt_fill(out, sizeof(out), 5);
    assert_int_equal(dt_send(&a, &b, out, sizeof(out)), (ssize_t)sizeof(out));
    assert_int_equal(dt_recv(&b, buf, sizeof(buf), NULL, 2000), (ssize_t)sizeof(out));
    uint16_t port = ntohs(b.addr.sin_port);
    struct sockaddr_in old_b = b.addr;
    /* b restarts: a new socket, QP and lane on the same port. abrupt = no goodbye (as after a crash). */
    dt_close_abrupt(&b);
    dt_open(&b, w, "127.0.0.1", port);
    assert_true(dt_same(&b.addr, &old_b));
    /* a keeps sending as usual; within a few datagrams b receives over RDMA again. */
    int got = 0, sent = 0;
    uint64_t end = dt_now_ms() + 5000;
    struct rs_dgram_stats b0 = dt_stats(&b);
    while (dt_now_ms() < end) {
        assert_int_equal(dt_send(&a, &b, out, sizeof(out)), (ssize_t)sizeof(out));
        sent++;
        ssize_t n;
        while ((n = dt_recv(&b, buf, sizeof(buf), NULL, 5)) > 0) {
            assert_int_equal(n, (ssize_t)sizeof(out));
            assert_memory_equal(buf, out, sizeof(out));
            got++;
        }
        (void)rs_dgram_poll(a.s);
        if (dt_stats(&b).rx_rdma - b0.rx_rdma >= 10)
            break;
    }
    struct rs_dgram_stats sa = dt_stats(&a), sb = dt_stats(&b);
    printf("# restart: sent %d, received %d (%llu over RDMA); a saw %llu restarts, %llu announcements\n", sent, got,
           (unsigned long long)(sb.rx_rdma - b0.rx_rdma), (unsigned long long)sa.peer_restarts,
           (unsigned long long)sa.announces_received);
    assert_true(sb.rx_rdma - b0.rx_rdma >= 10);
    assert_true(got >= sent - 10);              /* only what raced the restart may be lost */
    assert_true(rs_dgram_test_peer_rdma(a.s, (struct sockaddr *)&b.addr));
    dt_pair_close(&a, &b, w);
}

static void test_restart_sendrecv(void **state)
{
    (void)state;
    restart_test("use both udp any 127.0.0.1 dgram=sendrecv\n");
}

static void test_restart_wrecord(void **state)
{
    (void)state;
    restart_test("use both udp any 127.0.0.1 dgram=wrecord\n");
}

static void test_close_says_bye(void **state)
{
    (void)state;
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=wrecord\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    dt_warm(&a, &b);
    uint16_t port = ntohs(b.addr.sin_port);
    dt_close(&b);               /* orderly: a hears BYE and forgets b */
    (void)rs_dgram_poll(a.s);
    assert_false(rs_dgram_test_peer_rdma(a.s, (struct sockaddr *)&b.addr));
    /* A plain socket now on b's port receives plain UDP (a probe first), never datagram-iWARP. */
    int plain = dt_plain("127.0.0.1", port);
    assert_int_equal(dt_send(&a, &b, "after", 5), 5);
    uint8_t buf[100];
    struct sockaddr_in src = { 0 };
    socklen_t sl = sizeof(src);
    bool got = false;
    for (int i = 0; i < 4 && !got; i++) {
        ssize_t n = dt_plain_recv(plain, buf, sizeof(buf), &src, &sl, 500);
        assert_true(n > 0);
        got = n == 5 && memcmp(buf, "after", 5) == 0;
        if (!got)
            assert_memory_equal(buf, "RSDG", 4);
    }
    assert_true(got);
    close(plain);
    dt_close(&a);
    dt_world_free(w);
}

/* With owns_fd the socket closes the application's fd itself, and only once the last reference is gone: the soft
 * RNIC adopts that fd and watches it until its QP is destroyed, so closing it at rs_dgram_close while another
 * holder keeps the socket alive left the RNIC's thread watching a closed (or reused) fd number. */
static void test_owned_fd_outlives_close(void **state)
{
    (void)state;
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=wrecord\n");
    struct rs_dgram_opts o;
    rs_dgram_default_opts(&o);
    o.owns_fd = true;
    struct dt_ep a, b;
    dt_open_opts(&a, w, "127.0.0.1", 0, 0, &o);
    dt_open(&b, w, "127.0.0.1", 0);
    dt_warm(&a, &b);
    rs_dgram_hold(a.s);                 /* another holder, as a thread still inside a call would be */
    assert_int_equal(rs_dgram_close(a.s), 0);
    assert_true(fcntl(a.fd, F_GETFD) >= 0);
    /* Traffic towards the closed socket keeps its QP busy meanwhile. */
    char buf[1000];
    memset(buf, 'x', sizeof(buf));
    for (int i = 0; i < 200; i++)
        (void)dt_send(&b, &a, buf, sizeof(buf));
    usleep(20000);
    assert_true(fcntl(a.fd, F_GETFD) >= 0);
    rs_dgram_release(a.s);              /* the last reference: QP gone, then the fd */
    errno = 0;
    assert_int_equal(fcntl(a.fd, F_GETFD), -1);
    assert_int_equal(errno, EBADF);
    a.s = NULL;
    a.fd = -1;
    dt_close(&b);
    dt_world_free(w);
}

/* ---- readiness, timeouts, signals ---- */

static void test_readiness_fd(void **state)
{
    (void)state;
    struct dt_ep a, b;
    struct dt_world *w = dt_pair_open(&a, &b, "use both udp any 127.0.0.1 dgram=sendrecv\n");
    int kfd = dt_plain("127.0.0.2", 0);
    rs_dgram_interest(b.s, POLLIN, 1);
    struct pollfd p[2] = { { .fd = rs_dgram_fd(b.s), .events = POLLIN }, { .fd = kfd, .events = POLLIN } };
    /* Nothing to read: the fd stays quiet (after processing what woke it, if anything). */
    for (int i = 0; i < 3; i++) {
        int n = poll(p, 2, 50);
        if (n == 0)
            break;
        assert_false(rs_dgram_poll(b.s) & POLLIN);
    }
    assert_int_equal(poll(p, 2, 50), 0);
    assert_false(rs_dgram_poll(b.s) & POLLIN);
    assert_true(rs_dgram_poll(b.s) & POLLOUT);
    /* An RDMA datagram wakes the poller, together with an unrelated kernel fd in the same set. */
    uint64_t t0 = dt_now_ms();
    assert_int_equal(dt_send(&a, &b, "wake", 4), 4);
    assert_int_equal(poll(p, 2, 2000), 1);
    assert_true(p[0].revents & POLLIN);
    assert_true(dt_now_ms() - t0 < 1000);
    assert_true(rs_dgram_poll(b.s) & POLLIN);
    char buf[16];
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL), 4);
    assert_false(rs_dgram_poll(b.s) & POLLIN);
    assert_int_equal(poll(p, 2, 50), 0);
    /* A plain datagram wakes it too. */
    assert_int_equal(sendto(kfd, "k", 1, 0, (struct sockaddr *)&b.addr, sizeof(b.addr)), 1);
    assert_int_equal(poll(p, 2, 2000), 1);
    assert_true(rs_dgram_poll(b.s) & POLLIN);
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL), 1);
    rs_dgram_interest(b.s, POLLIN, -1);
    close(kfd);
    dt_pair_close(&a, &b, w);
}

static void test_rcvtimeo(void **state)
{
    (void)state;
    struct dt_ep a, b;
    struct dt_world *w = dt_pair_open(&a, &b, "use both udp any 127.0.0.1 dgram=wrecord\n");
    struct timeval tv = { 0, 150000 };
    assert_int_equal(rs_dgram_setsockopt(b.s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    struct timeval back;
    socklen_t bl = sizeof(back);
    assert_int_equal(rs_dgram_getsockopt(b.s, SOL_SOCKET, SO_RCVTIMEO, &back, &bl), 0);
    assert_int_equal(back.tv_usec, 150000);
    char buf[100];
    uint64_t t0 = dt_now_ms();
    assert_int_equal(rs_dgram_recvfrom(b.s, buf, sizeof(buf), 0, NULL, NULL), -EAGAIN);
    uint64_t took = dt_now_ms() - t0;
    assert_true(took >= 140 && took < 1000);
    dt_pair_close(&a, &b, w);
}

static void on_signal(int sig) { (void)sig; }

struct blocked {
    struct rs_dgram_sock *s;
    ssize_t result;
};

static void *blocked_recv(void *arg)
{
    struct blocked *bl = arg;
    char buf[100];
    bl->result = rs_dgram_recvfrom(bl->s, buf, sizeof(buf), 0, NULL, NULL);
    return NULL;
}

static void test_eintr_and_close(void **state)
{
    (void)state;
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=sendrecv\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open(&b, w, "127.0.0.1", 0);
    dt_warm(&a, &b);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;      /* no SA_RESTART */
    sigaction(SIGUSR1, &sa, &old);
    struct blocked bl = { .s = b.s, .result = 1 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, blocked_recv, &bl), 0);
    dt_sleep_ms(100);
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
    assert_int_equal(bl.result, -EINTR);
    /* close wakes a blocked receiver: -EBADF, and the object lives until the last reference goes. */
    rs_dgram_hold(b.s);
    bl.result = 1;
    assert_int_equal(pthread_create(&t, NULL, blocked_recv, &bl), 0);
    dt_sleep_ms(100);
    assert_int_equal(rs_dgram_close(b.s), 0);
    pthread_join(t, NULL);
    assert_int_equal(bl.result, -EBADF);
    rs_dgram_release(b.s);
    close(b.fd);
    b.s = NULL;
    sigaction(SIGUSR1, &old, NULL);
    dt_close(&a);
    dt_world_free(w);
}

/* ---- threads ---- */

struct th {
    struct dt_ep *from, *to;
    int count;
    int got;
};

static void *th_send(void *arg)
{
    struct th *t = arg;
    for (int i = 0; i < t->count; i++) {
        uint32_t v = (uint32_t)i;
        uint8_t msg[300];
        memset(msg, (int)(i & 0xff), sizeof(msg));
        memcpy(msg, &v, sizeof(v));
        while (dt_send(t->from, t->to, msg, sizeof(msg)) != (ssize_t)sizeof(msg))
            dt_sleep_ms(1);
        if (i % 64 == 63)
            dt_sleep_ms(2);     /* no flow control: give the receivers a chance */
    }
    return NULL;
}

static void *th_recv(void *arg)
{
    struct th *t = arg;
    uint8_t buf[400];
    for (;;) {
        ssize_t n = dt_recv(t->to, buf, sizeof(buf), NULL, 500);
        if (n < 0)
            break;
        assert_int_equal(n, 300);
        uint32_t v;
        memcpy(&v, buf, sizeof(v));
        for (int k = 4; k < 300; k++)
            if (buf[k] != (uint8_t)(v & 0xff))
                fail_msg("datagram %u corrupted at %d", v, k);
        t->got++;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=wrecord\n");
    struct dt_ep a, b;
    dt_open(&a, w, "127.0.0.1", 0);
    dt_open_opts(&b, w, "127.0.0.1", 0, 1 << 20, NULL);
    dt_warm(&a, &b);
    struct th s1 = { &a, &b, 2000, 0 }, s2 = { &a, &b, 2000, 0 }, r1 = { &a, &b, 0, 0 }, r2 = { &a, &b, 0, 0 };
    pthread_t t[4];
    pthread_create(&t[0], NULL, th_recv, &r1);
    pthread_create(&t[1], NULL, th_recv, &r2);
    pthread_create(&t[2], NULL, th_send, &s1);
    pthread_create(&t[3], NULL, th_send, &s2);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    struct rs_dgram_stats sb = dt_stats(&b);
    printf("# threads: %d + %d received of 4000, %llu dropped\n", r1.got, r2.got, (unsigned long long)sb.rx_dropped);
    /* Every datagram is either delivered whole or counted as dropped (no flow control, so a loaded machine
     * may drop some); both receivers took part. */
    assert_int_equal(r1.got + r2.got + (int)sb.rx_dropped, 4000);
    assert_true(r1.got + r2.got >= 400);
    assert_true(r1.got > 0 && r2.got > 0);
    dt_close(&a);
    dt_close(&b);
    dt_world_free(w);
}

/* ---- options ---- */

static void test_options(void **state)
{
    (void)state;
    struct dt_world *w = dt_world("use both udp any 127.0.0.1 dgram=sendrecv\n");
    struct dt_ep a;
    dt_open(&a, w, "127.0.0.1", 0);
    int v = 100000;
    assert_int_equal(rs_dgram_setsockopt(a.s, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)), 0);
    socklen_t l = sizeof(v);
    assert_int_equal(rs_dgram_getsockopt(a.s, SOL_SOCKET, SO_RCVBUF, &v, &l), 0);
    assert_int_equal(v, 200000);                /* doubled, as Linux reports it */
    v = 1;
    assert_int_equal(rs_dgram_setsockopt(a.s, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)), 0);
    l = sizeof(v);
    assert_int_equal(rs_dgram_getsockopt(a.s, SOL_SOCKET, SO_RCVBUF, &v, &l), 0);
    assert_int_equal(v, 2304);                  /* Linux's floor */
    /* Options rdmasock does not own reach the kernel socket and come back from it. */
    v = 1;
    assert_int_equal(rs_dgram_setsockopt(a.s, SOL_SOCKET, SO_BROADCAST, &v, sizeof(v)), 0);
    v = 0;
    l = sizeof(v);
    assert_int_equal(getsockopt(a.fd, SOL_SOCKET, SO_BROADCAST, &v, &l), 0);
    assert_int_equal(v, 1);
    l = sizeof(v);
    assert_int_equal(rs_dgram_getsockopt(a.s, SOL_SOCKET, SO_TYPE, &v, &l), 0);
    assert_int_equal(v, SOCK_DGRAM);
    l = sizeof(v);
    assert_int_equal(rs_dgram_getsockopt(a.s, SOL_SOCKET, SO_ERROR, &v, &l), 0);
    assert_int_equal(v, 0);
    assert_int_equal(rs_dgram_setsockopt(a.s, SOL_SOCKET, 9999, &v, sizeof(v)), -ENOPROTOOPT);
    struct rs_dgram_stats st;
    l = sizeof(st);
    assert_int_equal(rs_dgram_getsockopt(a.s, RS_SOL_DGRAM, RS_DGRAM_STATS, &st, &l), 0);
    assert_int_equal(l, sizeof(st));
    l = 4;
    assert_int_equal(rs_dgram_getsockopt(a.s, RS_SOL_DGRAM, RS_DGRAM_STATS, &st, &l), -EINVAL);
    dt_close(&a);
    dt_world_free(w);
}

/* ---- IPv6 ---- */

static void test_ipv6(void **state)
{
    (void)state;
    if (!dt_is_soft())
        skip();     /* on verbs, IPv6 needs a GID for the address: the VM suites */
    struct dt_world *w = dt_world("use both udp any ::1 dgram=wrecord\n");
    int fd[2];
    struct rs_dgram_sock *s[2];
    struct sockaddr_in6 addr[2];
    for (int i = 0; i < 2; i++) {
        fd[i] = socket(AF_INET6, SOCK_DGRAM, 0);
        assert_true(fd[i] >= 0);
        struct rs_dgram_opts o;
        rs_dgram_default_opts(&o);
        o.policy = rs_dgram_config_policy;
        o.policy_arg = &w->pol;
        o.rnic_kind = dt_kind();
        assert_int_equal(rs_dgram_attach(fd[i], &o, &s[i]), 0);
        struct sockaddr_in6 lo = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
        if (rs_dgram_bind(s[i], (struct sockaddr *)&lo, sizeof(lo)) != 0) {
            rs_dgram_close(s[i]);
            close(fd[i]);
            if (i == 1) {
                rs_dgram_close(s[0]);
                close(fd[0]);
            }
            dt_world_free(w);
            skip();
        }
        socklen_t l = sizeof(addr[i]);
        assert_int_equal(rs_dgram_getsockname(s[i], (struct sockaddr *)&addr[i], &l), 0);
    }
    uint8_t *out = malloc(65527), *in = malloc(70000);
    assert_non_null(out);
    assert_non_null(in);
    bool rdma = false;
    /* Until both sides discovered each other some datagrams go through the kernel; all arrive either way. */
    for (int round = 0; round < 100; round++) {
        size_t len = round < 50 ? (size_t)round * 97 : 65527 - (size_t)(round - 50);
        dt_fill(out, len, (uint32_t)round);
        assert_int_equal(rs_dgram_sendto(s[0], out, len, 0, (struct sockaddr *)&addr[1], sizeof(addr[1])),
                         (ssize_t)len);
        struct sockaddr_in6 src;
        socklen_t sl = sizeof(src);
        ssize_t n = -EAGAIN;
        for (int i = 0; i < 200 && n == -EAGAIN; i++) {
            n = rs_dgram_recvfrom(s[1], in, 70000, MSG_DONTWAIT, (struct sockaddr *)&src, &sl);
            if (n == -EAGAIN)
                dt_sleep_ms(1);
        }
        assert_int_equal(n, (ssize_t)len);
        assert_memory_equal(in, out, len);
        assert_int_equal(sl, sizeof(src));
        assert_memory_equal(&src.sin6_addr, &addr[0].sin6_addr, sizeof(src.sin6_addr));
        assert_int_equal(src.sin6_port, addr[0].sin6_port);
        rdma = rdma || rs_dgram_test_peer_rdma(s[0], (struct sockaddr *)&addr[1]);
    }
    assert_true(rdma);
    struct rs_dgram_stats st;
    socklen_t l = sizeof(st);
    assert_int_equal(rs_dgram_getsockopt(s[1], RS_SOL_DGRAM, RS_DGRAM_STATS, &st, &l), 0);
    assert_true(st.rx_rdma > 50);
    /* 65,527 is the IPv6 limit; one more is too big. */
    assert_int_equal(rs_dgram_sendto(s[0], out, 65528, 0, (struct sockaddr *)&addr[1], sizeof(addr[1])), -EMSGSIZE);
    free(out);
    free(in);
    for (int i = 0; i < 2; i++) {
        rs_dgram_close(s[i]);
        close(fd[i]);
    }
    dt_world_free(w);
}

int main(void)
{
    rs_log_configure_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_sendrecv),
        cmocka_unit_test(test_sizes_wrecord),
        cmocka_unit_test(test_too_big),
        cmocka_unit_test(test_flags_sendrecv),
        cmocka_unit_test(test_flags_wrecord),
        cmocka_unit_test(test_connected_sendrecv),
        cmocka_unit_test(test_connected_wrecord),
        cmocka_unit_test(test_plain_peer_sendrecv),
        cmocka_unit_test(test_plain_peer_wrecord),
        cmocka_unit_test(test_probe_invisible),
        cmocka_unit_test(test_kernel_rule),
        cmocka_unit_test(test_rdma_mode_unreachable),
        cmocka_unit_test(test_both_mode_plain_peer),
        cmocka_unit_test(test_restart_sendrecv),
        cmocka_unit_test(test_restart_wrecord),
        cmocka_unit_test(test_close_says_bye),
        cmocka_unit_test(test_owned_fd_outlives_close),
        cmocka_unit_test(test_readiness_fd),
        cmocka_unit_test(test_rcvtimeo),
        cmocka_unit_test(test_eintr_and_close),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_ipv6),
    };
    return cmocka_run_group_tests_name("dgram", tests, NULL, NULL);
}
