/*
 * SDP data integrity under load: both directions at once, random write and read sizes from 1 byte to 16 MiB
 * (log-uniform, so small and large are both frequent), every byte checked against its stream position, and a
 * CRC32c of each whole stream compared end to end.
 *
 * Volume: RS_SDP_STRESS_BYTES (both directions together), default 4 GiB; the VM runs use 256 MiB. With the default
 * configuration (zero copy threshold 64 KiB, adaptive) the writes above the threshold go through SrcAvail or the
 * peer's SinkAvail and the rest by copy, so the switch-over and the advertisement races are exercised all along;
 * a second run forces buffered copy only.
 *
 * Every write is made from a scratch buffer that is scribbled over as soon as send() returns: if the library kept
 * using the caller's memory after returning, the receiver would see the scribble.
 */
#include <sys/socket.h>

#include "common/crc32c.h"
#include "test_sdp_util.h"

#define MAX_IO (16u << 20)
#define TABLE_LEN ((16u << 20) + 8191u)     /* odd length: slices never line up with their previous positions */

static uint8_t *table;                      /* TABLE_LEN + MAX_IO bytes: any slice of MAX_IO is contiguous */

static uint64_t total_bytes(void)
{
    const char *e = getenv("RS_SDP_STRESS_BYTES");
    if (e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 0);
        if (*end == 'M' || *end == 'm')
            v <<= 20;
        else if (*end == 'G' || *end == 'g')
            v <<= 30;
        if (v > 0)
            return v;
    }
    return 4ull << 30;
}

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Log-uniform in [1, max]. */
static size_t random_size(uint64_t *x, size_t max)
{
    unsigned bits = (unsigned)(rng_next(x) % 25);      /* 2^0 .. 2^24 */
    size_t hi = (size_t)1 << bits;
    size_t v = hi + (size_t)(rng_next(x) % hi);
    if (v > max)
        v = max;
    return v ? v : 1;
}

static int setup_table(void **state)
{
    (void)state;
    table = malloc((size_t)TABLE_LEN + MAX_IO);
    if (!table)
        return -1;
    uint64_t x = 0x243f6a8885a308d3ull;
    uint64_t *w = (uint64_t *)table;
    for (size_t i = 0; i < TABLE_LEN / 8 + 1; i++)
        w[i] = rng_next(&x);
    memcpy(table + TABLE_LEN, table, MAX_IO);
    return 0;
}

static int teardown_table(void **state)
{
    (void)state;
    free(table);
    return 0;
}

struct dir {
    struct rs_sdp_sock *s;
    uint64_t bytes;         /* to send / expected */
    uint64_t seed;
    uint32_t crc;
    uint64_t done;
    long bad_at;            /* stream position of the first wrong byte, or -1 */
    ssize_t error;
    uint64_t calls;
};

static void *sender(void *p)
{
    struct dir *d = p;
    uint8_t *scratch = malloc(MAX_IO);
    uint64_t x = d->seed;
    d->crc = 0;
    d->error = 0;
    while (d->done < d->bytes) {
        size_t n = random_size(&x, MAX_IO);
        if (n > d->bytes - d->done)
            n = (size_t)(d->bytes - d->done);
        const uint8_t *src = table + d->done % TABLE_LEN;
        memcpy(scratch, src, n);
        size_t off = 0;
        while (off < n) {
            ssize_t r = rs_sdp_send(d->s, scratch + off, n - off, MSG_NOSIGNAL);
            if (r <= 0) {
                d->error = r;
                goto out;
            }
            off += (size_t)r;
            d->calls++;
        }
        memset(scratch, 0xee, n);       /* the library must be done with it */
        d->crc = rs_crc32c(d->crc, src, n);
        d->done += n;
    }
    d->error = rs_sdp_shutdown(d->s, SHUT_WR);
out:
    free(scratch);
    return NULL;
}

static void *receiver(void *p)
{
    struct dir *d = p;
    uint8_t *buf = malloc(MAX_IO);
    uint64_t x = d->seed ^ 0x9e3779b97f4a7c15ull;
    d->crc = 0;
    d->bad_at = -1;
    d->error = 0;
    for (;;) {
        size_t want = random_size(&x, MAX_IO);
        ssize_t r = rs_sdp_recv(d->s, buf, want, (rng_next(&x) & 3) == 0 ? MSG_WAITALL : 0);
        if (r < 0) {
            d->error = r;
            break;
        }
        if (r == 0)
            break;
        d->calls++;
        if (d->bad_at < 0 && memcmp(buf, table + d->done % TABLE_LEN, (size_t)r) != 0) {
            const uint8_t *want_p = table + d->done % TABLE_LEN;
            for (ssize_t i = 0; i < r; i++) {
                if (buf[i] != want_p[i]) {
                    d->bad_at = (long)(d->done + (uint64_t)i);
                    break;
                }
            }
        }
        d->crc = rs_crc32c(d->crc, buf, (size_t)r);
        d->done += (size_t)r;
        if (d->done > d->bytes)
            break;
    }
    free(buf);
    return NULL;
}

static void run_bidirectional(uint64_t total, sdp_opts_fn opts, const char *what)
{
    struct rs_sdp_sock *c, *a;
    sdp_pair_opts(&c, &a, opts);
    uint64_t half = total / 2;
    struct dir cs = { .s = c, .bytes = half, .seed = 0x1234567 }, ar = { .s = a, .bytes = half, .seed = 0x1234567 };
    struct dir as = { .s = a, .bytes = total - half, .seed = 0x7654321 },
               cr = { .s = c, .bytes = total - half, .seed = 0x7654321 };
    pthread_t t[4];
    uint64_t t0 = now_ms();
    assert_int_equal(pthread_create(&t[0], NULL, sender, &cs), 0);
    assert_int_equal(pthread_create(&t[1], NULL, receiver, &ar), 0);
    assert_int_equal(pthread_create(&t[2], NULL, sender, &as), 0);
    assert_int_equal(pthread_create(&t[3], NULL, receiver, &cr), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    uint64_t ms = now_ms() - t0;
    struct rs_sdp_stats sc, sa;
    stats_settled(c, a, &sc, &sa);
    print_message("# %s: %llu MiB in %llu ms (%.0f MB/s both ways), %llu+%llu send calls, %llu+%llu recv calls\n",
                  what, (unsigned long long)(total >> 20), (unsigned long long)ms,
                  ms ? (double)total / 1000.0 / (double)ms : 0.0, (unsigned long long)cs.calls,
                  (unsigned long long)as.calls, (unsigned long long)ar.calls, (unsigned long long)cr.calls);
    print_message("# zero copy: src %llu MiB, sink %llu MiB (c->a), src %llu MiB, sink %llu MiB (a->c); "
                  "SrcAvail %llu/%llu SinkAvail %llu/%llu SendSm %llu/%llu crossed %llu/%llu credit stalls %llu/%llu\n",
                  (unsigned long long)(sc.zcopy_src_bytes >> 20), (unsigned long long)(sc.zcopy_sink_bytes >> 20),
                  (unsigned long long)(sa.zcopy_src_bytes >> 20), (unsigned long long)(sa.zcopy_sink_bytes >> 20),
                  (unsigned long long)sc.src_avail_sent, (unsigned long long)sa.src_avail_sent,
                  (unsigned long long)sc.sink_avail_sent, (unsigned long long)sa.sink_avail_sent,
                  (unsigned long long)sc.send_sm_sent, (unsigned long long)sa.send_sm_sent,
                  (unsigned long long)sc.sinks_crossed, (unsigned long long)sa.sinks_crossed,
                  (unsigned long long)sc.credit_stalls, (unsigned long long)sa.credit_stalls);
    assert_int_equal(cs.error, 0);
    assert_int_equal(as.error, 0);
    assert_int_equal(ar.error, 0);
    assert_int_equal(cr.error, 0);
    if (ar.bad_at >= 0)
        fail_msg("client->server stream differs at byte %ld", ar.bad_at);
    if (cr.bad_at >= 0)
        fail_msg("server->client stream differs at byte %ld", cr.bad_at);
    assert_true(ar.done == half);
    assert_true(cr.done == total - half);
    assert_int_equal(ar.crc, cs.crc);
    assert_int_equal(cr.crc, as.crc);
    /* Race rule 2: each side decides alone, from sequence numbers, that a SinkAvail crossed data; every crossing
     * is counted once by its sender and once by its receiver, so the totals agree exactly. */
    assert_true(sc.sinks_crossed == sa.sinks_crossed);
    assert_int_equal(get_int(c, SOL_SOCKET, SO_ERROR), 0);
    assert_int_equal(get_int(a, SOL_SOCKET, SO_ERROR), 0);
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(a), 0);
}

/* The default threshold, adaptive, asked for explicitly: on the soft RNIC zero copy is off unless asked for
 * (rs_sdp_zthresh), and this run is where copying and lending alternate on one stream under the adaptivity. */
static void adaptive_zcopy(struct rs_sdp_sock *s)
{
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, (int)RS_SDP_ZCOPY_DEFAULT_THRESHOLD);
}

static void test_bidirectional_default(void **state)
{
    (void)state;
    run_bidirectional(total_bytes(), adaptive_zcopy, "adaptive (bcopy + zero copy from 64 KiB)");
}

static void bcopy_only(struct rs_sdp_sock *s)
{
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 0);
}

static void test_bidirectional_bcopy(void **state)
{
    (void)state;
    uint64_t total = total_bytes() / 4;
    run_bidirectional(total < (64u << 20) ? total_bytes() : total, bcopy_only, "buffered copy only");
}

static void small_rings_zcopy_4k(struct rs_sdp_sock *s)
{
    set_int(s, SOL_SOCKET, SO_RCVBUF, 16384);
    set_int(s, SOL_SOCKET, SO_SNDBUF, 16384);
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, 4096);
    set_int(s, RS_SOL_SDP, RS_SDP_ZCOPY_ADAPTIVE, 0);
}

static void test_bidirectional_small_rings(void **state)
{
    (void)state;
    /* tiny rings (credits run out all the time) and a 4 KiB threshold (most writes race their peer's sinks) */
    uint64_t total = total_bytes() / 8;
    run_bidirectional(total < (32u << 20) ? total_bytes() : total, small_rings_zcopy_4k,
                      "small rings, zero copy from 4 KiB");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bidirectional_default),
        cmocka_unit_test(test_bidirectional_bcopy),
        cmocka_unit_test(test_bidirectional_small_rings),
    };
    /* SDP_TEST_FILTER / SDP_TEST_SKIP: glob patterns on test names, to run a subset by hand */
    if (getenv("SDP_TEST_FILTER"))
        cmocka_set_test_filter(getenv("SDP_TEST_FILTER"));
    if (getenv("SDP_TEST_SKIP"))
        cmocka_set_skip_filter(getenv("SDP_TEST_SKIP"));
    return cmocka_run_group_tests_name("sdp_stress", tests, setup_table, teardown_table);
}
