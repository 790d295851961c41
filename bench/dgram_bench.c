/*
 * dgram_bench: UDP sockets through rdmasock's datagram layer (src/dgram_wr) against native kernel UDP, on
 * loopback, both ends in this process (one thread each). Three paths:
 *   kernel    plain sockets, the kernel does everything
 *   sendrecv  rdmasock, untagged SEND into posted receives (copy out of the receive at recv)
 *   wrecord   rdmasock, RDMA Write-Record into the receiver's lane, or straight into the buffer a blocked recv
 *             advertised (zero copy) for datagrams of 16 KiB and more
 * Workloads:
 *   latency   ping-pong, blocking recv; half the round trip, median of the samples
 *   stream    the sender streams datagrams in windows of 32 and waits for a 4-byte ack per window (an
 *             application-level window, so no side drops and the socket path is what is measured); goodput and
 *             CPU time (process, all threads: the application's and the soft RNIC's) per megabyte
 *   paced     a media-like stream (1,316-byte datagrams at 40 Mbit/s, as VLC streams MPEG-TS over UDP): the time
 *             until the receiver holds a 2 MB pre-buffer, and the CPU time per MB. This is the measure behind the
 *             thesis's "approximate 2% increase in overall pre-buffering time" (Grant 2012, §6.6.3).
 * Output: CSV lines  workload,path,size,value,unit,vs_kernel (the difference against kernel UDP).
 * Usage: dgram_bench [seconds-per-point (default 1)] [sizes...]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
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

enum path { P_KERNEL, P_SENDRECV, P_WRECORD };
static const char *path_name[] = { "kernel", "sendrecv", "wrecord" };

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

static struct rs_config *cfgs[3];
static struct rs_dgram_config_policy pols[3];

static void ep_open(struct ep *e, enum path p)
{
    memset(e, 0, sizeof(*e));
    e->fd = socket(AF_INET, SOCK_DGRAM, 0);
    int big = 4 << 20;
    struct sockaddr_in lo = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (p != P_KERNEL) {
        struct rs_dgram_opts o;
        rs_dgram_default_opts(&o);
        o.policy = rs_dgram_config_policy;
        o.policy_arg = &pols[p];
        if (rs_dgram_attach(e->fd, &o, &e->s) != 0) {
            fprintf(stderr, "attach failed\n");
            exit(1);
        }
        (void)rs_dgram_setsockopt(e->s, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
        (void)rs_dgram_setsockopt(e->s, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
        if (rs_dgram_bind(e->s, (struct sockaddr *)&lo, sizeof(lo)) != 0) {
            fprintf(stderr, "bind failed\n");
            exit(1);
        }
    } else {
        (void)setsockopt(e->fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
        (void)setsockopt(e->fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
        if (bind(e->fd, (struct sockaddr *)&lo, sizeof(lo)) != 0) {
            perror("bind");
            exit(1);
        }
    }
    socklen_t l = sizeof(e->addr);
    getsockname(e->fd, (struct sockaddr *)&e->addr, &l);
}

/* Both directions discovered before measuring. */
static void warm(struct ep *a, struct ep *b)
{
    static uint8_t buf[70000];
    ep_set_timeout(a, 20);
    ep_set_timeout(b, 20);
    for (int i = 0; i < 200; i++) {
        ep_send(a, "w", 1);
        ep_send(b, "w", 1);
        ep_recv(a, buf, sizeof(buf));
        ep_recv(b, buf, sizeof(buf));
        if (!a->s || (rs_dgram_test_peer_rdma(a->s, (struct sockaddr *)&b->addr) &&
                      rs_dgram_test_peer_rdma(b->s, (struct sockaddr *)&a->addr)))
            break;
    }
    while (ep_recv(a, buf, sizeof(buf)) >= 0) {
    }
    while (ep_recv(b, buf, sizeof(buf)) >= 0) {
    }
    ep_set_timeout(a, 2000);
    ep_set_timeout(b, 2000);
}

/* ---- latency ---- */

struct pong {
    struct ep *e;
    size_t len;
    volatile int stop;
};

static void *ponger(void *arg)
{
    struct pong *p = arg;
    uint8_t *buf = malloc(65536);
    while (!p->stop) {
        ssize_t n = ep_recv(p->e, buf, 65536);
        if (n >= 0)
            ep_send(p->e, buf, (size_t)n);
    }
    free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double latency(enum path p, size_t len, double seconds)
{
    struct ep a, b;
    ep_open(&a, p);
    ep_open(&b, p);
    a.peer = b.addr;
    b.peer = a.addr;
    warm(&a, &b);
    struct pong pg = { .e = &b, .len = len };
    pthread_t t;
    pthread_create(&t, NULL, ponger, &pg);
    uint8_t *buf = calloc(1, 65536);
    enum { MAX = 200000 };
    double *samples = malloc(sizeof(double) * MAX);
    int n = 0;
    double end = now_s() + seconds;
    while (n < MAX && now_s() < end) {
        double t0 = now_s();
        if (ep_send(&a, buf, len) != (ssize_t)len)
            break;
        if (ep_recv(&a, buf, 65536) != (ssize_t)len)
            continue;       /* lost: not a sample */
        samples[n++] = (now_s() - t0) / 2;
    }
    pg.stop = 1;
    ep_send(&a, buf, 1);
    pthread_join(t, NULL);
    qsort(samples, (size_t)n, sizeof(double), cmp_double);
    double median = n ? samples[n / 2] : 0;
    free(samples);
    free(buf);
    ep_close(&a);
    ep_close(&b);
    return median * 1e6;
}

/* ---- streaming ---- */

#define WINDOW 32

struct sink_arg {
    struct ep *e;
    size_t len;
    volatile int stop;
    uint64_t bytes;
};

static void *stream_rx(void *arg)
{
    struct sink_arg *s = arg;
    uint8_t *buf = malloc(65536);
    unsigned in_window = 0;
    while (!s->stop) {
        ssize_t n = ep_recv(s->e, buf, 65536);
        if (n < 0)
            continue;
        if (n == 1 && buf[0] == 'F') {
            ep_send(s->e, "A", 1);      /* the sender's window flush: ack it even if something was lost */
            in_window = 0;
            continue;
        }
        s->bytes += (uint64_t)n;
        if (++in_window == WINDOW) {
            in_window = 0;
            ep_send(s->e, "A", 1);
        }
    }
    free(buf);
    return NULL;
}

static void stream(enum path p, size_t len, double seconds, double *mbps, double *cpu_per_mb)
{
    struct ep a, b;
    ep_open(&a, p);
    ep_open(&b, p);
    a.peer = b.addr;
    b.peer = a.addr;
    warm(&a, &b);
    ep_set_timeout(&a, 200);
    struct sink_arg sk = { .e = &b, .len = len };
    pthread_t t;
    pthread_create(&t, NULL, stream_rx, &sk);
    uint8_t *buf = calloc(1, 65536), ack[8];
    double c0 = cpu_s(), t0 = now_s(), end = t0 + seconds;
    while (now_s() < end) {
        for (int i = 0; i < WINDOW; i++)
            ep_send(&a, buf, len);
        if (ep_recv(&a, ack, sizeof(ack)) < 0) {
            ep_send(&a, "F", 1);        /* a datagram of the window was lost: resynchronise */
            (void)ep_recv(&a, ack, sizeof(ack));
        }
    }
    double t1 = now_s(), c1 = cpu_s();
    sk.stop = 1;
    ep_send(&a, "F", 1);
    pthread_join(t, NULL);
    if (getenv("DGRAM_BENCH_STATS") && b.s) {
        struct rs_dgram_stats sa, sb;
        socklen_t l = sizeof(sa);
        rs_dgram_getsockopt(a.s, RS_SOL_DGRAM, RS_DGRAM_STATS, &sa, &l);
        l = sizeof(sb);
        rs_dgram_getsockopt(b.s, RS_SOL_DGRAM, RS_DGRAM_STATS, &sb, &l);
        fprintf(stderr, "# %s %zu: tx send %llu record %llu sink %llu kernel %llu lane_full %llu; rx rdma %llu "
                "zcopy %llu dropped %llu (partial %llu lane %llu queue %llu no_recv %llu) sinks adv %llu filled %llu "
                "revoked %llu salvaged %llu\n", path_name[p], len, (unsigned long long)sa.tx_send,
                (unsigned long long)sa.tx_record, (unsigned long long)sa.tx_sink, (unsigned long long)sa.tx_kernel,
                (unsigned long long)sa.lane_full, (unsigned long long)sb.rx_rdma, (unsigned long long)sb.rx_zcopy,
                (unsigned long long)sb.rx_dropped, (unsigned long long)sb.rx_drop_partial,
                (unsigned long long)sb.rx_drop_lane, (unsigned long long)sb.rx_drop_queue,
                (unsigned long long)sb.rx_drop_no_recv, (unsigned long long)sb.sinks_advertised,
                (unsigned long long)sb.sinks_filled, (unsigned long long)sb.sinks_revoked,
                (unsigned long long)sb.sinks_salvaged);
    }
    double mb = (double)sk.bytes / 1e6;
    *mbps = mb / (t1 - t0);
    *cpu_per_mb = mb > 0 ? (c1 - c0) * 1e3 / mb : 0;
    free(buf);
    ep_close(&a);
    ep_close(&b);
}

/* ---- paced stream (media-like): the thesis's VLC pre-buffering measure ---- */

#define PACED_DGRAM 1316u           /* 7 MPEG-TS packets, what VLC puts in one UDP datagram */
#define PACED_RATE_BPS 40000000.0   /* 40 Mbit/s */
#define PACED_PREBUFFER 2000000u    /* bytes the player waits for before it starts */

struct paced_rx {
    struct ep *e;
    double first, done;
    uint64_t bytes;
};

static void *paced_receiver(void *arg)
{
    struct paced_rx *r = arg;
    uint8_t buf[2048];
    while (r->bytes < PACED_PREBUFFER) {
        ssize_t n = ep_recv(r->e, buf, sizeof(buf));
        if (n < 0)
            break;
        if (!r->first)
            r->first = now_s();
        r->bytes += (uint64_t)n;
    }
    r->done = now_s();
    return NULL;
}

/* Sends at PACED_RATE_BPS until the receiver has its pre-buffer; returns the pre-buffering time (ms) and the CPU
 * time the whole process spent per MB. */
static void paced(enum path p, double *prebuffer_ms, double *cpu_per_mb)
{
    struct ep a, b;
    ep_open(&a, p);
    ep_open(&b, p);
    a.peer = b.addr;
    b.peer = a.addr;
    warm(&a, &b);
    struct paced_rx r = { .e = &b };
    pthread_t t;
    pthread_create(&t, NULL, paced_receiver, &r);
    uint8_t buf[PACED_DGRAM];
    memset(buf, 0x47, sizeof(buf));
    double gap = PACED_DGRAM * 8.0 / PACED_RATE_BPS, c0 = cpu_s(), start = now_s();
    uint64_t sent = 0;
    while (r.done == 0 && sent < 4 * PACED_PREBUFFER) {
        double due = start + (double)(sent / PACED_DGRAM) * gap;
        double wait = due - now_s();
        if (wait > 0) {
            struct timespec ts = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
            nanosleep(&ts, NULL);
        }
        ep_send(&a, buf, sizeof(buf));
        sent += PACED_DGRAM;
    }
    pthread_join(t, NULL);
    double c1 = cpu_s();
    *prebuffer_ms = (r.done - start) * 1e3;
    *cpu_per_mb = (c1 - c0) * 1e3 / ((double)r.bytes / 1e6);
    ep_close(&a);
    ep_close(&b);
}

int main(int argc, char **argv)
{
    rs_log_configure_from_env();
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    if (seconds <= 0)
        seconds = 1.0;
    size_t sizes[16] = { 64, 1024, 8192, 32768, 65000 };
    int nsizes = 5;
    if (argc > 2) {
        nsizes = 0;
        for (int i = 2; i < argc && nsizes < 16; i++)
            sizes[nsizes++] = (size_t)atol(argv[i]);
    }
    static const char *rules[3] = { "use kernel udp any *\n", "use both udp any 127.0.0.1 dgram=sendrecv\n",
                                    "use both udp any 127.0.0.1 dgram=wrecord\n" };
    for (int p = 0; p < 3; p++) {
        if (rs_config_parse_buffer("bench", rules[p], strlen(rules[p]), &cfgs[p], NULL) != 0)
            return 1;
        pols[p].cfg = cfgs[p];
        pols[p].program = "dgram_bench";
    }
    printf("workload,path,size,value,unit,vs_kernel\n");
    for (int i = 0; i < nsizes; i++) {
        double base = 0;
        for (int p = 0; p < 3; p++) {
            double us = latency((enum path)p, sizes[i], seconds);
            if (p == 0)
                base = us;
            printf("latency,%s,%zu,%.2f,us,%+.1f%%\n", path_name[p], sizes[i], us, base > 0 ? (us / base - 1) * 100 : 0);
            fflush(stdout);
        }
    }
    for (int i = 0; i < nsizes; i++) {
        double base = 0, base_cpu = 0;
        for (int p = 0; p < 3; p++) {
            double mbps, cpu;
            stream((enum path)p, sizes[i], seconds, &mbps, &cpu);
            if (p == 0) {
                base = mbps;
                base_cpu = cpu;
            }
            printf("stream,%s,%zu,%.1f,MB/s,%+.1f%%\n", path_name[p], sizes[i], mbps,
                   base > 0 ? (mbps / base - 1) * 100 : 0);
            printf("stream_cpu,%s,%zu,%.3f,ms/MB,%+.1f%%\n", path_name[p], sizes[i], cpu,
                   base_cpu > 0 ? (cpu / base_cpu - 1) * 100 : 0);
            fflush(stdout);
        }
    }
    double base = 0, base_cpu = 0;
    for (int p = 0; p < 3; p++) {
        double ms, cpu;
        paced((enum path)p, &ms, &cpu);
        if (p == 0) {
            base = ms;
            base_cpu = cpu;
        }
        printf("paced_prebuffer,%s,%u,%.2f,ms,%+.2f%%\n", path_name[p], PACED_DGRAM, ms, base > 0 ? (ms / base - 1) * 100 : 0);
        printf("paced_cpu,%s,%u,%.3f,ms/MB,%+.1f%%\n", path_name[p], PACED_DGRAM, cpu,
               base_cpu > 0 ? (cpu / base_cpu - 1) * 100 : 0);
        fflush(stdout);
    }
    for (int p = 0; p < 3; p++)
        rs_config_free(cfgs[p]);
    return 0;
}
