/*
 * SDP zero copy: SrcAvail read by the receiver, SinkAvail written by the sender, the switch-over between copy and
 * zero copy around the threshold, SendSm (MSG_PEEK, small reads), both cancels (idle source, receiver timeout and
 * signal) with canaries proving no RDMA access lands after a cancel completed, a race stress where sinks and data
 * cross all the time, registration-cache coherence after munmap, and nonblocking sends that must copy.
 */
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <linux/errqueue.h>

#include "test_sdp_util.h"

/* The soft RNIC's count of READ response bytes it placed by process_vm_writev (src/rnic/soft/rc_local.c). */
uint64_t rs_rc_local_read_bytes(void);

#define CANARY 0xc5

static void zcopy_64k_fixed(struct rs_sdp_sock *s)
{
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 65536);
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_ADAPTIVE, 0);
    /* These tests count the SrcAvails of lent application buffers: the ring is not lent (on verbs it would be). */
    set_int(s, RS_SOL_SDP, RS_SDP_LEND_RING, 0);
}

/* Lending the send ring, on any RNIC (on the soft RNIC only when asked). */
static void lend_ring_on(struct rs_sdp_sock *s)
{
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 65536);
    set_int(s, RS_SOL_SDP, RS_SDP_LEND_RING, 1);
}

/* The default threshold, asked for: adaptive, and on whatever the RNIC. */
static void adaptive_64k(struct rs_sdp_sock *s)
{
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 65536);
}

struct reader {
    struct rs_sdp_sock *s;
    uint8_t *buf;
    size_t len;
    unsigned delay_ms;
    size_t chunk;           /* recv size (0: all at once) */
    int flags;
    size_t got;
    ssize_t error;
};

static void *reader_main(void *p)
{
    struct reader *r = p;
    usleep(r->delay_ms * 1000u);
    r->got = 0;
    r->error = 0;
    while (r->got < r->len) {
        size_t want = r->len - r->got;
        if (r->chunk && want > r->chunk)
            want = r->chunk;
        ssize_t n = rs_sdp_recv(r->s, r->buf + r->got, want, r->flags);
        if (n <= 0) {
            r->error = n;
            break;
        }
        r->got += (size_t)n;
    }
    return NULL;
}

static void test_srcavail_read(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    size_t len = 1u << 20;
    uint8_t *data = malloc(len), *got = malloc(len);
    fill_pattern(data, len, 21, 0);
    /* the receiver arrives late: the SrcAvail waits in its queue and is read straight into its buffer */
    struct reader r = { a, got, len, 100, 0, 0, 0, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    assert_int_equal(rs_sdp_send(c, data, len, 0), (ssize_t)len);
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    assert_memory_equal(got, data, len);
    struct rs_sdp_stats sc = sdp_stats(c), sa = sdp_stats(a);
    assert_int_equal(sc.src_avail_sent, 1);
    assert_true(sc.zcopy_src_bytes == len);
    assert_true(sa.zcopy_read_bytes == len);
    assert_int_equal(sc.data_msgs_sent, 0);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

static void test_sinkavail_write(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    size_t len = 1u << 20;
    uint8_t *data = malloc(len), *got = malloc(len);
    fill_pattern(data, len, 22, 0);
    /* the receiver is waiting first: its buffer becomes a sink and the sender writes straight into it */
    struct reader r = { a, got, len, 0, 0, 0, 0, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    usleep(100000);
    assert_int_equal(rs_sdp_send(c, data, len, 0), (ssize_t)len);
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    assert_memory_equal(got, data, len);
    struct rs_sdp_stats sc = sdp_stats(c), sa = sdp_stats(a);
    assert_true(sa.sink_avail_sent >= 1);
    assert_true(sc.zcopy_sink_bytes > 0);
    assert_true(sa.zcopy_written_bytes == sc.zcopy_sink_bytes);
    assert_int_equal(sa.sinks_crossed, 0);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

static void test_switch_over(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    static const size_t sizes[] = { 1, 100, 4095, 65535, 65536, 65537, 1u << 20, 17, 300000, 2u << 20, 5,
                                    131072, 3, 70000, 1u << 20, 64 };
    size_t total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        total += sizes[i];
    uint8_t *data = malloc(total), *got = malloc(total);
    fill_pattern(data, total, 23, 0);
    struct reader r = { a, got, total, 0, 200000, 0, 0, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    size_t off = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        /* each write from its own buffer, scribbled afterwards */
        uint8_t *b = malloc(sizes[i]);
        memcpy(b, data + off, sizes[i]);
        send_all(c, b, sizes[i]);
        memset(b, 0xee, sizes[i]);
        free(b);
        off += sizes[i];
        if (i % 3 == 0)
            usleep(20000);
    }
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    long bad = check_pattern(got, total, 23, 0);
    if (bad >= 0)
        fail_msg("stream differs at %ld", bad);
    struct rs_sdp_stats sc = sdp_stats(c);
    print_message("# switch-over: %zu bytes intact, %llu Data messages, %llu bytes by SrcAvail, %llu into sinks\n",
                  total, (unsigned long long)sc.data_msgs_sent, (unsigned long long)sc.zcopy_src_bytes,
                  (unsigned long long)sc.zcopy_sink_bytes);
    assert_true(sc.data_msgs_sent > 0);
    assert_true(sc.zcopy_src_bytes + sc.zcopy_sink_bytes > 0);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

/* One blocking write of len bytes to a reader that starts 50 ms later, checked. */
static void send_to_reader(struct rs_sdp_sock *c, struct rs_sdp_sock *a, const uint8_t *data, uint8_t *got, size_t len)
{
    struct reader r = { a, got, len, 50, 0, 0, 0, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    send_all(c, data, len);
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    assert_memory_equal(got, data, len);
}

static void test_threshold_option(void **state)
{
    (void)state;
    struct rs_sdp_sock *s;
    assert_int_equal(rs_sdp_socket(AF_INET, sdp_kind(), 0, &s), 0);
    assert_int_equal(get_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD), -1);
    int v = 100;
    assert_int_equal(rs_sdp_setsockopt(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, &v, sizeof(v)), -EINVAL);
    v = -2;
    assert_int_equal(rs_sdp_setsockopt(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, &v, sizeof(v)), -EINVAL);
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 262144);
    assert_int_equal(get_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD), 262144);
    assert_int_equal(rs_sdp_setsockopt(s, 999, 1, &v, sizeof(v)), -ENOPROTOOPT);
    rs_sdp_close(s);

    /* off on both ends: nothing but Data messages */
    struct rs_sdp_sock *c, *a;
    sdp_pair(&c, &a);
    set_int(c, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 0);
    set_int(a, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 0);
    size_t len = 1u << 20;
    uint8_t *data = malloc(len), *got = malloc(len);
    fill_pattern(data, len, 24, 0);
    send_to_reader(c, a, data, got, len);
    struct rs_sdp_stats sc = sdp_stats(c), sa = sdp_stats(a);
    assert_int_equal(sc.src_avail_sent + sa.sink_avail_sent, 0);
    pthread_t t;
    struct reader r;
    assert_int_equal(sc.zcopy_threshold_now, 0);

    /* 256 KiB: writes of 128 KiB are copied, 512 KiB ones are lent */
    set_int(c, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 262144);
    set_int(c, RS_SOL_SDP, RS_SDP_ZCOPY_ADAPTIVE, 0);
    r = (struct reader){ a, got, 131072, 100, 0, 0, 0, 0 };
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    send_all(c, data, 131072);
    pthread_join(t, NULL);
    assert_int_equal(sdp_stats(c).src_avail_sent, 0);
    r = (struct reader){ a, got, 524288, 100, 0, 0, 0, 0 };
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    send_all(c, data, 524288);
    pthread_join(t, NULL);
    assert_memory_equal(got, data, 524288);
    assert_int_equal(sdp_stats(c).src_avail_sent, 1);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

/*
 * The default follows the RNIC: off on the soft RNIC, which copies every byte anyway and where copying measured
 * faster (rs_sdp_zthresh), on (adaptive, from 64 KiB) over verbs, where an unmeasured method is tried first so the
 * first large write is lent. A threshold the application sets turns it on anywhere.
 */
/*
 * Default threshold: zero copy over verbs; on the soft RNIC only towards a peer on this host whose READs it places
 * by one direct copy (rc_local.c), and then by SrcAvail only (a reader's sink would be filled through the socket).
 * Cases: 0 default, 1 default with local Read placement off (RDMASOCK_SOFT_LOCAL_READ=off), 2 threshold asked for.
 */
static void test_default_follows_rnic(void **state)
{
    (void)state;
    size_t len = 1u << 20;
    uint8_t *data = malloc(len), *got = malloc(len);
    fill_pattern(data, len, 26, 0);
    bool soft = sdp_kind() != RS_RNIC_KIND_VERBS;
    for (int mode = 0; mode < 3; mode++) {
        bool asked = mode == 2;
        if (mode == 1)
            setenv("RDMASOCK_SOFT_LOCAL_READ", "off", 1);
        struct rs_sdp_sock *c, *a;
        sdp_pair_opts(&c, &a, asked ? adaptive_64k : NULL);
        unsetenv("RDMASOCK_SOFT_LOCAL_READ");
        uint64_t local_before = soft ? rs_rc_local_read_bytes() : 0;
        memset(got, 0, len);
        send_to_reader(c, a, data, got, len);
        struct rs_sdp_stats sc = sdp_stats(c), sa = sdp_stats(a);
        uint64_t lent = sc.src_avail_sent + sa.sink_avail_sent;
        uint64_t local = soft ? rs_rc_local_read_bytes() - local_before : 0;
        print_message("# %s: %llu SrcAvail + %llu SinkAvail, threshold now %u, %llu bytes placed locally\n",
                      asked ? "asked-for" : mode ? "default, local reads off" : "default",
                      (unsigned long long)sc.src_avail_sent, (unsigned long long)sa.sink_avail_sent,
                      sc.zcopy_threshold_now, (unsigned long long)local);
        if (asked || !soft || mode == 0) {
            assert_true(lent >= 1);
            assert_true(sc.zcopy_threshold_now >= RS_SDP_ZCOPY_DEFAULT_THRESHOLD);
        } else {
            assert_int_equal(lent, 0);
            assert_int_equal(sc.zcopy_threshold_now, 0);
            assert_int_equal(local, 0);
        }
        if (soft && mode == 0) {
            assert_int_equal(sa.sink_avail_sent, 0);
            assert_true(sc.src_avail_sent >= 1);
            assert_true(local >= 65536);
        }
        assert_int_equal(get_int(c, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD), asked ? 65536 : -1);
        rs_sdp_close(c);
        rs_sdp_close(a);
    }
    free(data);
    free(got);
}

static void test_peek_and_small_reads_get_sendsm(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    size_t len = 1u << 20;
    uint8_t *data = malloc(len), *got = malloc(len);
    fill_pattern(data, len, 25, 0);
    /* MSG_PEEK cannot consume a SrcAvail: SendSm, and the bytes come by copy */
    struct reader r = { a, got, 100, 100, 0, MSG_PEEK, 0, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    send_all(c, data, len);
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    assert_memory_equal(got, data, 100);
    recv_all(a, got, len);
    assert_memory_equal(got, data, len);
    struct rs_sdp_stats sc = sdp_stats(c), sa = sdp_stats(a);
    assert_int_equal(sa.send_sm_sent, 1);
    assert_int_equal(sc.send_sm_received, 1);
    assert_true(sc.zcopy_src_bytes == 0);

    /* reads of 1000 bytes: not worth an RDMA READ each */
    r = (struct reader){ a, got, len, 100, 1000, 0, 0, 0 };
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    send_all(c, data, len);
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    assert_memory_equal(got, data, len);
    assert_int_equal(sdp_stats(a).send_sm_sent, 2);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

static void test_src_idle_cancel(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    size_t len = 512u << 10;
    uint8_t *data = malloc(len), *got = malloc(len);
    fill_pattern(data, len, 26, 0);
    /* nobody reads for a second: the SrcAvail is cancelled and the bytes go into the send ring instead */
    struct reader r = { a, got, len, 1000, 0, 0, 0, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(rs_sdp_send(c, data, len, 0), (ssize_t)len);
    uint64_t took = now_ms() - t0;
    assert_true(took >= 150 && took < 900);
    memset(data + len / 2, 0xee, 16);   /* send() returned: our buffer is ours again */
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    long bad = check_pattern(got, len, 26, 0);
    if (bad >= 0)
        fail_msg("stream differs at %ld", bad);
    struct rs_sdp_stats sc = sdp_stats(c);
    assert_int_equal(sc.src_cancels, 1);
    assert_int_equal(sc.src_avail_sent, 1);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

static volatile sig_atomic_t usr1_hits;

static void on_usr1(int sig)
{
    (void)sig;
    usr1_hits++;
}

struct sink_arg {
    struct rs_sdp_sock *s;
    uint8_t *buf;
    size_t len;
    ssize_t result;
};

static void *sink_recv(void *p)
{
    struct sink_arg *a = p;
    a->result = rs_sdp_recv(a->s, a->buf, a->len, 0);
    return NULL;
}

static void check_canary(const uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != CANARY)
            fail_msg("byte %zu of a cancelled sink changed: %#x", i, buf[i]);
    }
}

static void test_sink_cancels(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    size_t len = 1u << 20;
    uint8_t *sink1 = malloc(len), *sink2 = malloc(len), *data = malloc(len), *got = malloc(len);
    memset(sink1, CANARY, len);
    memset(sink2, CANARY, len);
    fill_pattern(data, len, 27, 0);
    /* timeout: the sink is cancelled and acknowledged before recv returns */
    struct timeval tv = { 0, 200000 };
    assert_int_equal(rs_sdp_setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(rs_sdp_recv(a, sink1, len, 0), -EAGAIN);
    assert_true(now_ms() - t0 >= 190);
    assert_int_equal(sdp_stats(a).sink_avail_sent, 1);
    assert_int_equal(sdp_stats(a).sink_cancels, 1);
    /* signal: the same, reported as EINTR */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, &old);
    tv.tv_sec = 5;
    assert_int_equal(rs_sdp_setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    struct sink_arg arg = { a, sink2, len, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, sink_recv, &arg), 0);
    usleep(150000);
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
    sigaction(SIGUSR1, &old, NULL);
    assert_int_equal(arg.result, -EINTR);
    assert_int_equal(sdp_stats(a).sink_cancels, 2);
    /* data sent afterwards goes elsewhere: both cancelled buffers stay untouched */
    struct reader r = { a, got, len, 0, 0, 0, 0, 0 };
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    send_all(c, data, len);
    pthread_join(t, NULL);
    assert_int_equal(r.error, 0);
    assert_memory_equal(got, data, len);
    check_canary(sink1, len);
    check_canary(sink2, len);
    free(sink1);
    free(sink2);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

/* ---- races ---- */

static void zcopy_4k_fixed(struct rs_sdp_sock *s)
{
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 4096);
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_ADAPTIVE, 0);
}

struct race_sender {
    struct rs_sdp_sock *s;
    uint64_t duration_ms;
    uint64_t sent;
    ssize_t error;
};

static void *race_send(void *p)
{
    struct race_sender *rs = p;
    uint64_t x = 88172645463325252ull;
    uint8_t *buf = malloc(512u << 10);
    uint64_t end = now_ms() + rs->duration_ms;
    while (now_ms() < end) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t n = 1 + (size_t)(x % (512u << 10));
        if (x & 0x100)
            n = 1 + n % 8192;
        fill_pattern(buf, n, 28, rs->sent);
        size_t off = 0;
        while (off < n) {
            ssize_t r = rs_sdp_send(rs->s, buf + off, n - off, MSG_NOSIGNAL);
            if (r <= 0) {
                rs->error = r;
                goto out;
            }
            off += (size_t)r;
        }
        memset(buf, 0xee, n);
        rs->sent += n;
        if (x & 0x200)
            usleep((unsigned)(x >> 40) % 2000);
        /* A pause longer than any receive timeout, so sinks must get cancelled: long enough for a receiver that is
         * behind by a 512 KiB write (25 ms at the 20 MB/s of rxe under TCG) to drain it and time out; 10 ms left
         * a VM run with a single cancel. */
        if ((x & 0xf000) == 0)
            usleep(50000);
    }
    rs->error = rs_sdp_shutdown(rs->s, SHUT_WR);
out:
    free(buf);
    return NULL;
}

static void test_cancel_race_stress(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_4k_fixed);
    struct race_sender rs = { c, 3000, 0, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, race_send, &rs), 0);
    /* the receiver posts large sinks with timeouts of a few milliseconds: sinks cross data, get cancelled while
     * the sender is writing into them, expire while an RdmaWrCompl is on its way... */
    size_t len = 1u << 20;
    uint8_t *buf = malloc(len);
    uint64_t pos = 0, x = 0x5deece66dull;
    int timeouts = 0;
    for (;;) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        struct timeval tv = { 0, 500 + (suseconds_t)(x % 3000) };
        /* One receive in four waits 20-50 ms, so some sinks live long enough to be written into: with only
         * short waits, a VM run saw every one of its 50 sinks cancelled or crossed. */
        if ((x & 0x300) == 0)
            tv.tv_usec = 20000 + (suseconds_t)(x % 30000);
        assert_int_equal(rs_sdp_setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
        memset(buf, CANARY, len);
        ssize_t n = rs_sdp_recv(a, buf, len, 0);
        if (n == -EAGAIN) {
            timeouts++;
            check_canary(buf, len);
            continue;
        }
        assert_true(n >= 0);
        if (n == 0)
            break;
        long bad = check_pattern(buf, (size_t)n, 28, pos);
        if (bad >= 0) {
            describe_mismatch(buf, (size_t)n, (size_t)bad, 28, pos, CANARY, 0xee);
            fail_msg("stream differs at %llu", (unsigned long long)(pos + (uint64_t)bad));
        }
        /* nothing beyond what recv reported may have been written */
        check_canary(buf + n, len - (size_t)n);
        pos += (uint64_t)n;
    }
    pthread_join(t, NULL);
    assert_int_equal(rs.error, 0);
    assert_true(pos == rs.sent);
    struct rs_sdp_stats sc, sa;
    stats_settled(c, a, &sc, &sa);
    print_message("# %llu MiB, %d receive timeouts, SinkAvail %llu cancels %llu crossed %llu/%llu, written %llu "
                  "KiB, SrcAvail %llu read %llu MiB\n",
                  (unsigned long long)(pos >> 20), timeouts, (unsigned long long)sa.sink_avail_sent,
                  (unsigned long long)sa.sink_cancels, (unsigned long long)sa.sinks_crossed,
                  (unsigned long long)sc.sinks_crossed, (unsigned long long)(sa.zcopy_written_bytes >> 10),
                  (unsigned long long)sc.src_avail_sent, (unsigned long long)(sa.zcopy_read_bytes >> 20));
    assert_true(sa.sink_cancels > 0);
    /* Over rxe under TCG most sinks time out or cross before the sender writes into them, and the receiver's
     * backoff then offers few: VM runs wrote 0-622 KiB into sinks with short waits only (one of six none at
     * all), 3-1372 KiB with the long waits. The soft RNIC writes megabytes; the verbs runs report the figure,
     * and test_sink_choice_is_measured proves their sinks. */
    if (sdp_kind() != RS_RNIC_KIND_VERBS)
        assert_true(sa.zcopy_written_bytes > 0);
    assert_true(sa.sinks_crossed == sc.sinks_crossed);
    free(buf);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

/* ---- registration cache ---- */

static void test_regcache_unmapped(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    size_t len = 2u << 20;
    uint8_t *got = malloc(len);
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    fill_pattern(m, len, 29, 0);
    /* first use: registered (a miss) */
    send_to_reader(c, a, m, got, len);
    struct rs_sdp_stats s0 = sdp_stats(c);
    assert_int_equal(s0.src_avail_sent, 1);
    /* same buffer again: the cached registration (a hit); a device that pins pages keeps nothing idle (no hook
     * sees glibc's free() unmap a chunk, sdp_regcache.c), so there it is registered again (a miss) */
    bool pins = sdp_kind() == RS_RNIC_KIND_VERBS;
    send_to_reader(c, a, m, got, len);
    struct rs_sdp_stats s1 = sdp_stats(c);
    assert_true(s1.regcache_hits == s0.regcache_hits + (pins ? 0 : 1));
    assert_true(s1.regcache_misses == s0.regcache_misses + (pins ? 1 : 0));
    /* unmapped and mapped again at the same address with other contents: the stale registration is gone */
    assert_int_equal(munmap(m, len), 0);
    rs_sdp_mem_unmapped(m, len);
    uint8_t *m2 = mmap(m, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    assert_true(m2 == m);
    fill_pattern(m2, len, 30, 0);
    memset(got, 0, len);
    send_to_reader(c, a, m2, got, len);      /* stale contents would differ */
    struct rs_sdp_stats s2 = sdp_stats(c);
    assert_true(s2.regcache_misses == s1.regcache_misses + 1);
    munmap(m2, len);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

static void test_nonblocking_send_copies(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, zcopy_64k_fixed);
    size_t len = 1u << 20;
    uint8_t *data = malloc(len), *got = malloc(len);
    fill_pattern(data, len, 31, 0);
    /* a nonblocking send cannot lend the buffer: it copies what fits and returns at once */
    ssize_t n = rs_sdp_send(c, data, len, MSG_DONTWAIT);
    assert_true(n > 0);
    memset(data, 0xee, (size_t)n);
    recv_all(a, got, (size_t)n);
    long bad = check_pattern(got, (size_t)n, 31, 0);
    if (bad >= 0)
        fail_msg("byte %ld was taken from the caller's buffer after send returned", bad);
    assert_int_equal(sdp_stats(c).src_avail_sent, 0);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

static void test_msg_zerocopy_notifications(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair(&c, &a);
    uint8_t buf[100000];
    fill_pattern(buf, sizeof(buf), 32, 0);
    struct sock_extended_err ee;
    /* without SO_ZEROCOPY the flag is ignored: no notification */
    assert_int_equal(rs_sdp_send(c, buf, 1000, MSG_ZEROCOPY), 1000);
    assert_int_equal(rs_sdp_recv_errqueue(c, &ee), -EAGAIN);
    set_int(c, SOL_SOCKET, SO_ZEROCOPY, 1);
    assert_int_equal(get_int(c, SOL_SOCKET, SO_ZEROCOPY), 1);
    assert_false(rs_sdp_poll(c) & POLLERR);
    /* three sends: ids 0, 1, 2 in one range, marked copied; POLLERR while pending */
    for (int i = 0; i < 3; i++)
        assert_int_equal(rs_sdp_send(c, buf + 1000 + i * 33000, 33000, MSG_ZEROCOPY), 33000);
    assert_true(rs_sdp_poll(c) & POLLERR);
    assert_int_equal(get_int(c, SOL_SOCKET, SO_ERROR), 0);
    assert_int_equal(rs_sdp_recv_errqueue(c, &ee), 0);
    assert_int_equal(ee.ee_origin, SO_EE_ORIGIN_ZEROCOPY);
    assert_int_equal(ee.ee_errno, 0);
    assert_int_equal(ee.ee_code, SO_EE_CODE_ZEROCOPY_COPIED);
    assert_int_equal(ee.ee_info, 0);
    assert_int_equal(ee.ee_data, 2);
    assert_false(rs_sdp_poll(c) & POLLERR);
    assert_int_equal(rs_sdp_recv_errqueue(c, &ee), -EAGAIN);
    /* the buffers may be reused at once: the data was taken when send returned */
    memset(buf + 1000, 0, 99000);
    uint8_t got[100000];
    recv_all(a, got, sizeof(got));
    assert_true(check_pattern(got, sizeof(got), 32, 0) < 0);
    assert_int_equal(rs_sdp_send(c, buf, 10, MSG_ZEROCOPY), 10);
    assert_int_equal(rs_sdp_recv_errqueue(c, &ee), 0);
    assert_int_equal(ee.ee_info, 3);
    assert_int_equal(ee.ee_data, 3);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

/* A receiver blocked with its buffer offered as a sink when the peer half-closes: the DisConn kills the sink
 * (no data will come), and the recv must come back with end of stream. The sink's wait processes the DisConn
 * on the receiving thread itself, whose wake-up went to the waiters of that moment; a recv that then slept
 * without looking at the socket again never woke (the echo server of sockcheck, stalled for good). */
struct eof_reader {
    struct rs_sdp_sock *s;
    size_t len;
    ssize_t result;
    atomic_bool done;
};

static void *eof_reader_main(void *p)
{
    struct eof_reader *r = p;
    uint8_t *buf = malloc(r->len);
    r->result = rs_sdp_recv(r->s, buf, r->len, 0);
    free(buf);
    atomic_store(&r->done, true);
    return NULL;
}

static void test_sink_killed_by_disconn_reports_eof(void **state)
{
    (void)state;
    for (int round = 0; round < 5; round++) {
        struct rs_sdp_sock *c, *a;
        sdp_pair_opts(&c, &a, zcopy_64k_fixed);
        struct eof_reader r = { .s = a, .len = 256u * 1024u, .result = -1 };
        atomic_init(&r.done, false);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, eof_reader_main, &r), 0);
        /* Long enough for the reader to advertise its sink and for the SinkAvail to reach the peer. */
        uint64_t until = now_ms() + WAIT_MS;
        while (sdp_stats(a).sink_avail_sent == 0 && now_ms() < until)
            usleep(1000);
        assert_int_equal(sdp_stats(a).sink_avail_sent, 1);
        usleep(20000);
        assert_int_equal(rs_sdp_shutdown(c, SHUT_WR), 0);
        until = now_ms() + WAIT_MS;
        while (!atomic_load(&r.done) && now_ms() < until)
            usleep(1000);
        bool returned = atomic_load(&r.done);
        if (!returned)
            rs_sdp_shutdown(a, SHUT_RD);    /* unstick the reader so the failure is reported, not hung */
        pthread_join(t, NULL);
        assert_true(returned);
        assert_int_equal(r.result, 0);
        rs_sdp_close(c);
        rs_sdp_close(a);
    }
}

#define ADAPT_ROUNDS 64
#define ADAPT_LEN (256u * 1024u)

static void *adapt_reader(void *p)
{
    struct rs_sdp_sock *a = p;
    uint8_t *buf = malloc(ADAPT_LEN);
    for (int i = 0; i < ADAPT_ROUNDS; i++) {
        size_t got = 0;
        while (got < ADAPT_LEN) {
            ssize_t n = rs_sdp_recv(a, buf + got, ADAPT_LEN - got, 0);
            if (n <= 0 || check_pattern(buf + got, (size_t)n, 40 + (uint32_t)i, got) != -1) {
                free(buf);
                return (void *)1;
            }
            got += (size_t)n;
        }
        if (rs_sdp_send(a, "k", 1, MSG_NOSIGNAL) != 1) {
            free(buf);
            return (void *)1;
        }
    }
    free(buf);
    return NULL;
}

/*
 * The adaptive receiver (threshold asked for, so on either RNIC) measures both ways of taking a read into an empty
 * queue, a SinkAvail the sender writes into and Data messages copied out of the ring, and uses the faster: so it
 * neither offers a sink for every read nor never. Each of the 64 reads here starts with the queue empty (the sender waits for an answer to each).
 */
static void test_sink_choice_is_measured(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, adaptive_64k);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, adapt_reader, a), 0);
    uint8_t *data = malloc(ADAPT_LEN);
    for (int i = 0; i < ADAPT_ROUNDS; i++) {
        fill_pattern(data, ADAPT_LEN, 40 + (uint32_t)i, 0);
        usleep(2000);       /* the reader is waiting on an empty queue by now */
        assert_int_equal(rs_sdp_send(c, data, ADAPT_LEN, MSG_NOSIGNAL), (ssize_t)ADAPT_LEN);
        char k;
        assert_int_equal(rs_sdp_recv(c, &k, 1, 0), 1);
    }
    void *ret;
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_null(ret);
    struct rs_sdp_stats sa = sdp_stats(a);
    print_message("# %d reads of %u KiB: %llu sinks offered, %llu KiB written into them\n", ADAPT_ROUNDS,
                  ADAPT_LEN >> 10, (unsigned long long)sa.sink_avail_sent,
                  (unsigned long long)(sa.zcopy_written_bytes >> 10));
    assert_true(sa.sink_avail_sent >= 1);
    assert_true(sa.sink_avail_sent < ADAPT_ROUNDS);
    free(data);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

/* ---- lending the send ring ---- */

struct lend_writer {
    struct rs_sdp_sock *s;
    size_t total;
    uint32_t seed;
    ssize_t error;
};

/* Random writes of 1 B..600 KiB of the pattern stream, some nonblocking, each buffer scribbled over once send()
 * returned (the bytes sent must be the ones it had then). */
static void *lend_writer_main(void *p)
{
    struct lend_writer *w = p;
    uint8_t *buf = malloc(600u << 10);
    unsigned rnd = w->seed;
    size_t done = 0;
    while (done < w->total) {
        size_t n = 1 + (size_t)rand_r(&rnd) % (600u << 10);
        if (rand_r(&rnd) % 4 == 0)
            n = 1 + (size_t)rand_r(&rnd) % 2000;
        if (n > w->total - done)
            n = w->total - done;
        fill_pattern(buf, n, w->seed, done);
        int flags = rand_r(&rnd) % 3 == 0 ? MSG_DONTWAIT : 0;
        ssize_t r = rs_sdp_send(w->s, buf, n, flags);
        if (r == -EAGAIN) {
            wait_mask(w->s, POLLOUT, 1000);
            continue;
        }
        if (r <= 0) {
            w->error = r ? r : -EIO;
            break;
        }
        memset(buf, 0xee, (size_t)r);
        done += (size_t)r;
    }
    free(buf);
    return NULL;
}

static void test_lend_ring_stream(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, lend_ring_on);
    size_t total = sdp_kind() == RS_RNIC_KIND_VERBS ? (24u << 20) : (256u << 20);
    struct lend_writer w = { c, total, 41, 0 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, lend_writer_main, &w), 0);
    /* The reader: random sizes, small reads (copied: SendSm), peeks that must see the stream without taking it,
     * and now and then a pause long enough for the idle cancel. */
    uint8_t *buf = malloc(1u << 20);
    unsigned rnd = 7;
    size_t got = 0;
    while (got < total) {
        size_t want = 1 + (size_t)rand_r(&rnd) % (1u << 20);
        int kind = rand_r(&rnd) % 16;
        if (kind < 2)
            want = 1 + (size_t)rand_r(&rnd) % 3000;
        if (kind == 15 && sdp_kind() != RS_RNIC_KIND_VERBS)
            usleep(250000);
        int flags = kind == 2 ? MSG_PEEK : 0;
        if (want > total - got)
            want = total - got;
        ssize_t n = rs_sdp_recv(a, buf, want, flags);
        if (n <= 0)
            fail_msg("recv at %zu: %zd", got, n);
        long bad = check_pattern(buf, (size_t)n, 41, got);
        if (bad >= 0)
            fail_msg("stream differs at %zu (%s)", got + (size_t)bad, flags ? "peek" : "read");
        if (!flags)
            got += (size_t)n;
    }
    pthread_join(t, NULL);
    assert_int_equal(w.error, 0);
    struct rs_sdp_stats sc = sdp_stats(c), sa = sdp_stats(a);
    print_message("# %zu MiB: %llu lends, %llu MiB read from the ring, %llu SendSm, %llu cancels\n", total >> 20,
                  (unsigned long long)sc.ring_lends, (unsigned long long)(sc.ring_lent_bytes >> 20),
                  (unsigned long long)sc.send_sm_received, (unsigned long long)sc.src_cancels);
    assert_true(sc.ring_lends > 0);
    assert_true(sc.ring_lent_bytes > 0);
    assert_true(sa.zcopy_read_bytes >= sc.ring_lent_bytes);
    assert_int_equal(sc.send_sm_received, sa.send_sm_sent);
    /* Everything sent was acknowledged: the ring is empty again. */
    int outq = -1;
    for (int i = 0; i < 100 && outq != 0; i++) {
        outq = rs_sdp_outq(c);
        if (outq)
            usleep(10000);
    }
    assert_int_equal(outq, 0);
    free(buf);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

static void test_lend_ring_send_returns(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, lend_ring_on);
    size_t len = 512u << 10;
    uint8_t *data = malloc(len), *got = malloc(len + 1);
    fill_pattern(data, len, 42, 0);
    /* Nobody reads for a second. A nonblocking send() (which cannot lend its own buffer) copies into the ring and
     * returns; the ring's bytes are lent, taken back after SDP_SRCAVAIL_IDLE_MS and sent by copy; the half-close
     * comes after every byte. */
    assert_int_equal(rs_sdp_send(c, data, len, MSG_DONTWAIT), (ssize_t)len);
    memset(data, 0xee, len);
    assert_int_equal(rs_sdp_shutdown(c, SHUT_WR), 0);
    usleep(1000000);
    struct rs_sdp_stats sc = sdp_stats(c);
    assert_true(sc.ring_lends >= 1);
    assert_true(sc.src_cancels >= 1);
    recv_all(a, got, len);
    long bad = check_pattern(got, len, 42, 0);
    if (bad >= 0)
        fail_msg("stream differs at %ld", bad);
    assert_int_equal(rs_sdp_recv(a, got, 1, 0), 0);
    free(data);
    free(got);
    rs_sdp_close(c);
    rs_sdp_close(a);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_srcavail_read),
        cmocka_unit_test(test_sinkavail_write),
        cmocka_unit_test(test_switch_over),
        cmocka_unit_test(test_threshold_option),
        cmocka_unit_test(test_peek_and_small_reads_get_sendsm),
        cmocka_unit_test(test_src_idle_cancel),
        cmocka_unit_test(test_sink_cancels),
        cmocka_unit_test(test_cancel_race_stress),
        cmocka_unit_test(test_regcache_unmapped),
        cmocka_unit_test(test_nonblocking_send_copies),
        cmocka_unit_test(test_msg_zerocopy_notifications),
        cmocka_unit_test(test_sink_killed_by_disconn_reports_eof),
        cmocka_unit_test(test_sink_choice_is_measured),
        cmocka_unit_test(test_default_follows_rnic),
        cmocka_unit_test(test_lend_ring_stream),
        cmocka_unit_test(test_lend_ring_send_returns),
    };
    /* SDP_TEST_FILTER / SDP_TEST_SKIP: glob patterns on test names, to run a subset by hand */
    if (getenv("SDP_TEST_FILTER"))
        cmocka_set_test_filter(getenv("SDP_TEST_FILTER"));
    if (getenv("SDP_TEST_SKIP"))
        cmocka_set_skip_filter(getenv("SDP_TEST_SKIP"));
    return cmocka_run_group_tests_name("sdp_zcopy", tests, NULL, NULL);
}
