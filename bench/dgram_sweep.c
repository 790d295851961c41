/*
 * dgram_sweep: the datagram socket layer (src/dgram_wr) by message size, next to kernel UDP, for the thesis's
 * figures (Grant 2012, figures 6.4-6.7). Both ends live in this process (one thread each) on loopback; every
 * point is measured for every path back to back, so a ratio compares one machine state.
 *
 *   paths    kernel    plain sockets (this program links librdmasock.a, which has no interposers)
 *            sendrecv  rs_dgram_* over datagram-iWARP SEND into posted receives
 *            wrecord   rs_dgram_* over RDMA Write-Record into a lane, or into the buffer a blocked recv advertised
 *   modes    lat       ping-pong, blocking recv, half the round trip; median of the samples (figure 6.4)
 *            bw        unidirectional stream, goodput where the data arrives (figure 6.5); with --loss, under the
 *                      soft RNIC's TEST ONLY drop knob (figures 6.6 and 6.7)
 *
 * Bandwidth needs a window, or the sender overruns the receiver on two CPUs and the loss the knob injects is lost
 * in the loss of overrun. The window is fed back through memory (the receiving thread publishes its count), not
 * through datagrams: feedback over the lossy path would itself be dropped and would measure the ack timeout, not
 * the data path. Each datagram carries the low bytes of its sequence number; the sender keeps at most --window
 * datagrams (and 2 MiB) beyond the highest that arrived, so a lost datagram does not hold a slot; when nothing
 * arrives for 20 ms (the whole tail of the window lost) it writes off what is outstanding and goes on ("stalls",
 * reported in the samples column of bw rows). The rate is bytes that arrived divided by the
 * time from the sender's start to the last arrival.
 *
 * The drop knob drops inbound datagrams of the process's shared soft RNIC before any byte is placed: data,
 * and the few control messages (CONSUMED lane reports, SINK advertisements). It is turned on after discovery,
 * and off before the sockets close. Kernel sockets never see it, so with --loss the kernel path is skipped.
 *
 * Output: CSV on stdout, one row per point:
 *   mode,path,size,loss_ppm,rep,samples,median_us,mb_per_s,msg_rate,sent,received,lost_pct,cpu_ms_per_mb,
 *   tx_send,tx_record,tx_sink,tx_kernel,rx_zcopy,rx_dropped
 * Usage: dgram_sweep [--modes lat,bw] [--paths kernel,sendrecv,wrecord] [--sizes 1,64,1K,...] [--seconds S]
 *                    [--reps N] [--loss PPM[,PPM...]] [--window N]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "dgram_wr/dgram.h"
#include "dgram_ep.h"
#include "rnic/soft/soft.h"     /* rs_soft_test_set_drop: the TEST ONLY loss knob */

enum path { P_KERNEL, P_SENDRECV, P_WRECORD, P_COUNT };
static const char *const path_name[P_COUNT] = { "kernel", "sendrecv", "wrecord" };

#define MAX_DGRAM 65507u
#define RX_BUF 65536u
#define SOCK_BUF (8 << 20)
#define BW_MAX_INFLIGHT_BYTES (2u << 20)
#define BW_STALL_MS 20

static struct rs_config *cfgs[P_COUNT];
static struct rs_dgram_config_policy pols[P_COUNT];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, int err)
{
    fprintf(stderr, "dgram_sweep: %s: %s\n", what, strerror(err < 0 ? -err : err));
    exit(1);
}

/* Root may exceed net.core.rmem_max; otherwise the plain option (capped by the kernel, as for any program). */
static void set_bufs(struct ep *e)
{
    int big = SOCK_BUF;
    static const int names[2][2] = { { SO_RCVBUFFORCE, SO_RCVBUF }, { SO_SNDBUFFORCE, SO_SNDBUF } };
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 2; j++) {
            int rc = e->s ? rs_dgram_setsockopt(e->s, SOL_SOCKET, names[i][j], &big, sizeof(big))
                          : setsockopt(e->fd, SOL_SOCKET, names[i][j], &big, sizeof(big));
            if (rc == 0)
                break;
        }
    }
}

static void ep_open(struct ep *e, enum path p)
{
    memset(e, 0, sizeof(*e));
    e->fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (e->fd < 0)
        die("socket", errno);
    struct sockaddr_in lo = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (p != P_KERNEL) {
        struct rs_dgram_opts o;
        rs_dgram_default_opts(&o);
        o.policy = rs_dgram_config_policy;
        o.policy_arg = &pols[p];
        int rc = rs_dgram_attach(e->fd, &o, &e->s);
        if (rc != 0)
            die("rs_dgram_attach", rc);
        set_bufs(e);
        rc = rs_dgram_bind(e->s, (struct sockaddr *)&lo, sizeof(lo));
        if (rc != 0)
            die("rs_dgram_bind", rc);
    } else {
        set_bufs(e);
        if (bind(e->fd, (struct sockaddr *)&lo, sizeof(lo)) != 0)
            die("bind", errno);
    }
    socklen_t l = sizeof(e->addr);
    if (getsockname(e->fd, (struct sockaddr *)&e->addr, &l) != 0)
        die("getsockname", errno);
}

static struct rs_dgram_stats ep_stats(struct ep *e)
{
    struct rs_dgram_stats st;
    memset(&st, 0, sizeof(st));
    socklen_t l = sizeof(st);
    if (e->s)
        (void)rs_dgram_getsockopt(e->s, RS_SOL_DGRAM, RS_DGRAM_STATS, &st, &l);
    return st;
}

/* Both directions discovered (RDMA in use) before anything is measured; a path that never gets there is a
 * failure of the bench, not a data point. */
static void pair_open(struct ep *a, struct ep *b, enum path p)
{
    static uint8_t buf[RX_BUF];
    ep_open(a, p);
    ep_open(b, p);
    a->peer = b->addr;
    b->peer = a->addr;
    ep_set_timeout(a, 20);
    ep_set_timeout(b, 20);
    bool ready = p == P_KERNEL;
    for (int i = 0; i < 300 && !ready; i++) {
        ep_send(a, "w", 1);
        ep_send(b, "w", 1);
        ep_recv(a, buf, sizeof(buf));
        ep_recv(b, buf, sizeof(buf));
        ready = rs_dgram_test_peer_rdma(a->s, (struct sockaddr *)&b->addr) &&
                rs_dgram_test_peer_rdma(b->s, (struct sockaddr *)&a->addr);
    }
    if (!ready) {
        fprintf(stderr, "dgram_sweep: %s: the pair never reached RDMA (discovery failed)\n", path_name[p]);
        exit(1);
    }
    while (ep_recv(a, buf, sizeof(buf)) >= 0) {
    }
    while (ep_recv(b, buf, sizeof(buf)) >= 0) {
    }
}

static void set_loss(struct ep *e, uint32_t ppm, uint64_t seed)
{
    if (!e->s)
        return;
    struct rs_rnic *rnic = rs_dgram_test_rnic(e->s);
    if (!rnic) {
        fprintf(stderr, "dgram_sweep: no RNIC behind the socket, cannot inject loss\n");
        exit(1);
    }
    rs_soft_test_set_drop(rnic, ppm, seed);
}

struct result {
    unsigned samples;
    double median_us, mb_per_s, msg_rate, lost_pct, cpu_ms_per_mb;
    uint64_t sent, received;
    struct rs_dgram_stats tx, rx;
};

static struct rs_dgram_stats stats_diff(struct rs_dgram_stats after, struct rs_dgram_stats before)
{
    uint64_t *x = (uint64_t *)&after;
    const uint64_t *y = (const uint64_t *)&before;
    for (size_t i = 0; i < sizeof(after) / sizeof(uint64_t); i++)
        x[i] -= y[i];
    return after;
}

/* ---- latency ---------------------------------------------------------------------------------------------- */

struct ponger_arg {
    struct ep *e;
    volatile int stop;
};

static void *ponger(void *arg)
{
    struct ponger_arg *pa = arg;
    uint8_t *buf = malloc(RX_BUF);
    if (!buf)
        die("malloc", ENOMEM);
    while (!pa->stop) {
        ssize_t n = ep_recv(pa->e, buf, RX_BUF);
        if (n >= 0 && !pa->stop)
            ep_send(pa->e, buf, (size_t)n);
    }
    free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void latency(enum path p, size_t len, double seconds, struct result *r)
{
    struct ep a, b;
    pair_open(&a, &b, p);
    ep_set_timeout(&a, 1000);
    ep_set_timeout(&b, 50);
    struct ponger_arg pa = { .e = &b };
    pthread_t t;
    pthread_create(&t, NULL, ponger, &pa);
    uint8_t *buf = calloc(1, RX_BUF);
    enum { MAX_SAMPLES = 400000 };
    double *samples = malloc(sizeof(double) * MAX_SAMPLES);
    if (!buf || !samples)
        die("malloc", ENOMEM);
    struct rs_dgram_stats a0 = ep_stats(&a), b0 = ep_stats(&b);
    unsigned n = 0;
    uint64_t sent = 0;
    /* A few round trips first: the lane and any sink are in steady state when the samples start. */
    for (int i = 0; i < 50; i++)
        if (ep_send(&a, buf, len) == (ssize_t)len)
            (void)ep_recv(&a, buf, RX_BUF);
    double c0 = cpu_s(), end = now_s() + seconds;
    while (n < MAX_SAMPLES && now_s() < end) {
        double t0 = now_s();
        ssize_t rc = ep_send(&a, buf, len);
        if (rc != (ssize_t)len)
            die("latency send", rc < 0 ? (int)rc : EIO);
        sent++;
        if (ep_recv(&a, buf, RX_BUF) != (ssize_t)len)
            continue;           /* lost (timeout): not a sample */
        samples[n++] = (now_s() - t0) / 2;
    }
    double c1 = cpu_s();
    pa.stop = 1;
    pthread_join(t, NULL);
    qsort(samples, n, sizeof(double), cmp_double);
    memset(r, 0, sizeof(*r));
    r->samples = n;
    r->median_us = n ? samples[n / 2] * 1e6 : 0;
    r->msg_rate = r->median_us > 0 ? 1e6 / r->median_us : 0;
    r->mb_per_s = r->msg_rate * (double)len / 1e6;
    r->sent = sent;
    r->received = n;
    r->lost_pct = sent ? 100.0 * (double)(sent - n) / (double)sent : 0;
    double mb = (double)n * (double)len * 2 / 1e6;
    r->cpu_ms_per_mb = mb > 0 ? (c1 - c0) * 1e3 / mb : 0;
    r->tx = stats_diff(ep_stats(&a), a0);
    r->rx = stats_diff(ep_stats(&b), b0);
    free(samples);
    free(buf);
    ep_close(&a);
    ep_close(&b);
}

/* ---- bandwidth -------------------------------------------------------------------------------------------- */

struct bw_shared {
    struct ep *e;
    size_t seq_bytes;               /* low bytes of the sequence number each datagram carries (1..8) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t received, bytes;
    uint64_t next_expected;         /* one past the highest sequence number that arrived */
    double last;
    bool sender_waiting;
    volatile int stop;
};

static void *bw_receiver(void *arg)
{
    struct bw_shared *sh = arg;
    uint8_t *buf = malloc(RX_BUF);
    if (!buf)
        die("malloc", ENOMEM);
    for (;;) {
        ssize_t n = ep_recv(sh->e, buf, RX_BUF);
        if (n < 0) {
            if (sh->stop)
                break;
            continue;
        }
        double t = now_s();
        uint64_t low = 0;
        memcpy(&low, buf, (size_t)n < sh->seq_bytes ? (size_t)n : sh->seq_bytes);
        pthread_mutex_lock(&sh->mu);
        /* Only the low bytes travel: the forward distance from what was expected, modulo their range. A datagram
         * of the past (reordered) is far "ahead" in that arithmetic and does not move the window. */
        uint64_t mask = sh->seq_bytes >= 8 ? UINT64_MAX : (1ull << (8 * sh->seq_bytes)) - 1;
        uint64_t ahead = (low - sh->next_expected) & mask;
        if (ahead < mask / 2)
            sh->next_expected += ahead + 1;
        sh->received++;
        sh->bytes += (uint64_t)n;
        sh->last = t;
        if (sh->sender_waiting)
            pthread_cond_signal(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    }
    free(buf);
    return NULL;
}

static void bw(enum path p, size_t len, double seconds, uint32_t loss_ppm, unsigned window, uint64_t seed,
               struct result *r)
{
    struct ep a, b;
    pair_open(&a, &b, p);
    ep_set_timeout(&b, 50);
    struct bw_shared sh = { .e = &b, .seq_bytes = len < 8 ? len : 8 };
    pthread_mutex_init(&sh.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sh.cv, &ca);
    pthread_condattr_destroy(&ca);
    unsigned w = window;
    if ((uint64_t)w * len > BW_MAX_INFLIGHT_BYTES)
        w = (unsigned)(BW_MAX_INFLIGHT_BYTES / len);
    if (w < 4)
        w = 4;
    if (len == 1 && w > 64)
        w = 64;     /* a one-byte sequence number tells the window's 2 x 64 apart */
    uint8_t *buf = calloc(1, MAX_DGRAM);
    if (!buf)
        die("malloc", ENOMEM);
    struct rs_dgram_stats a0 = ep_stats(&a), b0 = ep_stats(&b);
    set_loss(&b, loss_ppm, seed);
    pthread_t t;
    pthread_create(&t, NULL, bw_receiver, &sh);
    uint64_t sent = 0, written_off = 0, stalls = 0;
    double c0 = cpu_s(), t0 = now_s(), end = t0 + seconds;
    while (now_s() < end) {
        pthread_mutex_lock(&sh.mu);
        for (;;) {
            uint64_t base = sh.next_expected > written_off ? sh.next_expected : written_off;
            if (sent - base < w)
                break;
            uint64_t before = sh.received;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += BW_STALL_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            sh.sender_waiting = true;
            int rc = pthread_cond_timedwait(&sh.cv, &sh.mu, &ts);
            sh.sender_waiting = false;
            if (rc == ETIMEDOUT && sh.received == before) {
                written_off = sent;         /* the tail of the window was lost */
                stalls++;
            }
        }
        pthread_mutex_unlock(&sh.mu);
        memcpy(buf, &sent, sh.seq_bytes);
        ssize_t rc = ep_send(&a, buf, len);
        if (rc == (ssize_t)len)
            sent++;
        else if (rc != -EAGAIN && rc != -ENOBUFS)
            die("bw send", (int)rc);
    }
    /* Drain: wait until everything arrived or nothing moved for 100 ms. */
    uint64_t seen = UINT64_MAX;
    double quiet_since = now_s();
    for (;;) {
        pthread_mutex_lock(&sh.mu);
        uint64_t got = sh.received;
        pthread_mutex_unlock(&sh.mu);
        if (got >= sent)
            break;
        if (got != seen) {
            seen = got;
            quiet_since = now_s();
        } else if (now_s() - quiet_since > 0.1) {
            break;
        }
        struct timespec ts = { 0, 2000000 };
        nanosleep(&ts, NULL);
    }
    double c1 = cpu_s();
    set_loss(&b, 0, 0);
    sh.stop = 1;
    pthread_join(t, NULL);
    memset(r, 0, sizeof(*r));
    r->samples = (unsigned)stalls;     /* bw: how often the window stalled for BW_STALL_MS */
    r->sent = sent;
    r->received = sh.received;
    double span = sh.last > t0 ? sh.last - t0 : 0;
    r->mb_per_s = span > 0 ? (double)sh.bytes / 1e6 / span : 0;
    r->msg_rate = span > 0 ? (double)sh.received / span : 0;
    r->lost_pct = sent ? 100.0 * (double)(sent - (sh.received > sent ? sent : sh.received)) / (double)sent : 0;
    double mb = (double)sh.bytes / 1e6;
    r->cpu_ms_per_mb = mb > 0 ? (c1 - c0) * 1e3 / mb : 0;
    r->tx = stats_diff(ep_stats(&a), a0);
    r->rx = stats_diff(ep_stats(&b), b0);
    pthread_cond_destroy(&sh.cv);
    pthread_mutex_destroy(&sh.mu);
    free(buf);
    ep_close(&a);
    ep_close(&b);
}

/* ---- command line ----------------------------------------------------------------------------------------- */

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10;
    else if (*end == 'M' || *end == 'm')
        v <<= 20;
    return v > MAX_DGRAM ? MAX_DGRAM : (size_t)v;
}

static unsigned split_list(char *s, char **items, unsigned max)
{
    unsigned n = 0;
    for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok && n < max; tok = strtok_r(NULL, ",", &save))
        items[n++] = tok;
    return n;
}

static void usage(void)
{
    fputs("usage: dgram_sweep [--modes lat,bw] [--paths kernel,sendrecv,wrecord] [--sizes 1,64,1K,...]\n"
          "                   [--seconds S] [--reps N] [--loss PPM[,PPM...]] [--window N]\n", stderr);
    exit(2);
}

int main(int argc, char **argv)
{
    rs_log_configure_from_env();
    static const struct option options[] = {
        { "modes", required_argument, NULL, 'm' },   { "paths", required_argument, NULL, 'p' },
        { "sizes", required_argument, NULL, 's' },   { "seconds", required_argument, NULL, 't' },
        { "reps", required_argument, NULL, 'r' },    { "loss", required_argument, NULL, 'l' },
        { "window", required_argument, NULL, 'w' },  { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    bool want_mode[2] = { true, true }, want_path[P_COUNT] = { true, true, true };
    size_t sizes[32];
    unsigned nsizes = 0;
    for (size_t v = 1; v <= 32768; v *= 4)
        sizes[nsizes++] = v;
    sizes[nsizes++] = MAX_DGRAM;
    uint32_t losses[16] = { 0 };
    unsigned nlosses = 1, reps = 1, window = 64;
    double seconds = 0.3;
    char *items[32];
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        unsigned n;
        switch (opt) {
        case 'm':
            want_mode[0] = strstr(optarg, "lat") != NULL;
            want_mode[1] = strstr(optarg, "bw") != NULL;
            break;
        case 'p':
            for (int p = 0; p < P_COUNT; p++)
                want_path[p] = strstr(optarg, path_name[p]) != NULL;
            break;
        case 's':
            n = split_list(optarg, items, 32);
            nsizes = 0;
            for (unsigned i = 0; i < n; i++)
                sizes[nsizes++] = parse_size(items[i]);
            break;
        case 'l':
            n = split_list(optarg, items, 16);
            nlosses = 0;
            for (unsigned i = 0; i < n; i++)
                losses[nlosses++] = (uint32_t)strtoul(items[i], NULL, 10);
            break;
        case 't': seconds = atof(optarg); break;
        case 'r': reps = (unsigned)atoi(optarg); break;
        case 'w': window = (unsigned)atoi(optarg); break;
        default: usage();
        }
    }
    if (seconds <= 0 || reps == 0 || window == 0 || nsizes == 0)
        usage();
    static const char *rules[P_COUNT] = { "use kernel udp any *\n", "use both udp any 127.0.0.1 dgram=sendrecv\n",
                                          "use both udp any 127.0.0.1 dgram=wrecord\n" };
    for (int p = 0; p < P_COUNT; p++) {
        if (rs_config_parse_buffer("dgram_sweep", rules[p], strlen(rules[p]), &cfgs[p], NULL) != 0)
            return 1;
        pols[p].cfg = cfgs[p];
        pols[p].program = "dgram_sweep";
    }
    printf("mode,path,size,loss_ppm,rep,samples,median_us,mb_per_s,msg_rate,sent,received,lost_pct,cpu_ms_per_mb,"
           "tx_send,tx_record,tx_sink,tx_kernel,rx_zcopy,rx_dropped\n");
    fflush(stdout);
    for (int m = 0; m < 2; m++) {
        if (!want_mode[m])
            continue;
        for (unsigned li = 0; li < (m == 1 ? nlosses : 1); li++) {
            uint32_t loss = m == 1 ? losses[li] : 0;
            for (unsigned rep = 1; rep <= reps; rep++) {
                for (unsigned si = 0; si < nsizes; si++) {
                    for (int p = 0; p < P_COUNT; p++) {
                        if (!want_path[p] || (loss && p == P_KERNEL))
                            continue;
                        struct result r;
                        if (m == 0)
                            latency((enum path)p, sizes[si], seconds, &r);
                        else
                            bw((enum path)p, sizes[si], seconds, loss, window, 0x5eed + rep * 131 + si, &r);
                        printf("%s,%s,%zu,%u,%u,%u,%.3f,%.3f,%.1f,%llu,%llu,%.3f,%.3f,%llu,%llu,%llu,%llu,%llu,%llu\n",
                               m == 0 ? "lat" : "bw", path_name[p], sizes[si], loss, rep, r.samples, r.median_us,
                               r.mb_per_s, r.msg_rate, (unsigned long long)r.sent, (unsigned long long)r.received,
                               r.lost_pct, r.cpu_ms_per_mb, (unsigned long long)r.tx.tx_send,
                               (unsigned long long)r.tx.tx_record, (unsigned long long)r.tx.tx_sink,
                               (unsigned long long)r.tx.tx_kernel, (unsigned long long)r.rx.rx_zcopy,
                               (unsigned long long)r.rx.rx_dropped);
                        fflush(stdout);
                    }
                }
            }
        }
    }
    for (int p = 0; p < P_COUNT; p++)
        rs_config_free(cfgs[p]);
    return 0;
}
