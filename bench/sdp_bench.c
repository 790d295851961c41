/*
 * sdp_bench: SDP stream sockets (src/sdp_stream over an rnic.h provider) against kernel TCP on loopback, the same
 * harness for both: a forked server process, blocking sockets, TCP_NODELAY.
 *
 *   lat  64-byte ping-pong (or --lat-size), round trip time; the median of --reps runs
 *   bw   one direction, --sizes writes (default 64K,256K,1M), the receiver reads into a 1 MiB buffer
 *
 * Prints one CSV line per point and the SDP/TCP ratios the project targets are stated on (bandwidth at and above
 * 64 KiB >= 0.9x, 64-byte ping-pong latency <= 1.25x).
 *
 * usage: sdp_bench [--kind soft|verbs] [--addr IP] [--seconds S] [--reps N] [--sizes LIST] [--lat-size N]
 *                  [--zcopy BYTES|-1|0] [--fixed] [--only-sdp] [--modes lat,bw]
 * SDP_BENCH_STATS=1 adds, per bandwidth run, SDP's message counters and both ends' CPU seconds per GB.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rnic/rnic.h"
#include "sdp_stream/sdp.h"

static int opt_kind = RS_RNIC_KIND_SOFT;
static const char *opt_addr = "127.0.0.1";
static double opt_seconds = 2.0;
static int opt_reps = 5;
static size_t opt_sizes[16] = { 65536, 262144, 1048576 };
static int opt_nsizes = 3;
static size_t opt_lat_size = 64;
static int opt_zcopy = -1;
static int opt_adaptive = 1;        /* --fixed: zero copy above the threshold always (RS_SDP_ZCOPY_ADAPTIVE 0) */
static bool opt_lat = true, opt_bw = true;
static bool opt_only_sdp;           /* --only-sdp: skip kernel TCP (profiling SDP alone) */
static pid_t server_pid[2];         /* for the CPU report of SDP_BENCH_STATS */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- one interface over both kinds of socket ---- */

struct sock {
    bool sdp;
    int fd;
    struct rs_sdp_sock *s;
};

static ssize_t s_send(struct sock *k, const void *b, size_t n)
{
    return k->sdp ? rs_sdp_send(k->s, b, n, MSG_NOSIGNAL) : send(k->fd, b, n, MSG_NOSIGNAL);
}

static ssize_t s_recv(struct sock *k, void *b, size_t n, int flags)
{
    return k->sdp ? rs_sdp_recv(k->s, b, n, flags) : recv(k->fd, b, n, flags);
}

static void s_close(struct sock *k)
{
    if (k->sdp)
        rs_sdp_close(k->s);
    else
        close(k->fd);
}

static void die(const char *what, long v)
{
    fprintf(stderr, "sdp_bench: %s: %ld\n", what, v);
    exit(1);
}

static void s_nodelay(struct sock *k)
{
    int one = 1;
    if (k->sdp) {
        rs_sdp_setsockopt(k->s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        rs_sdp_setsockopt(k->s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, &opt_zcopy, sizeof(opt_zcopy));
        rs_sdp_setsockopt(k->s, RS_SOL_SDP, RS_SDP_ZCOPY_ADAPTIVE, &opt_adaptive, sizeof(opt_adaptive));
    } else {
        setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
}

/* Listens on an ephemeral port; returns the listener, *port set. */
static struct sock s_listen(bool sdp, uint16_t *port)
{
    struct sock l = { .sdp = sdp, .fd = -1 };
    struct sockaddr_in sin = { .sin_family = AF_INET };
    inet_pton(AF_INET, opt_addr, &sin.sin_addr);
    socklen_t len = sizeof(sin);
    if (sdp) {
        int r = rs_sdp_socket(AF_INET, opt_kind, 0, &l.s);
        if (r == 0)
            r = rs_sdp_bind(l.s, (struct sockaddr *)&sin, sizeof(sin));
        if (r == 0)
            r = rs_sdp_setsockopt(l.s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, &opt_zcopy, sizeof(opt_zcopy));
        if (r == 0)
            r = rs_sdp_listen(l.s, 4);
        if (r == 0)
            r = rs_sdp_getsockname(l.s, (struct sockaddr *)&sin, &len);
        if (r != 0)
            die("sdp listen", r);
    } else {
        l.fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(l.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(l.fd, (struct sockaddr *)&sin, sizeof(sin)) || listen(l.fd, 4) ||
            getsockname(l.fd, (struct sockaddr *)&sin, &len))
            die("tcp listen", errno);
    }
    *port = ntohs(sin.sin_port);
    return l;
}

static struct sock s_accept(struct sock *l)
{
    struct sock a = { .sdp = l->sdp, .fd = -1 };
    if (l->sdp) {
        int r = rs_sdp_accept(l->s, 0, &a.s, NULL, NULL);
        if (r != 0)
            die("sdp accept", r);
    } else {
        a.fd = accept(l->fd, NULL, NULL);
        if (a.fd < 0)
            die("tcp accept", errno);
    }
    s_nodelay(&a);
    return a;
}

static struct sock s_connect(bool sdp, uint16_t port)
{
    struct sock c = { .sdp = sdp, .fd = -1 };
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, opt_addr, &sin.sin_addr);
    if (sdp) {
        int r = rs_sdp_socket(AF_INET, opt_kind, 0, &c.s);
        if (r == 0) {
            rs_sdp_setsockopt(c.s, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, &opt_zcopy, sizeof(opt_zcopy));
            r = rs_sdp_connect(c.s, (struct sockaddr *)&sin, sizeof(sin));
        }
        if (r != 0)
            die("sdp connect", r);
    } else {
        c.fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c.fd, (struct sockaddr *)&sin, sizeof(sin)))
            die("tcp connect", errno);
    }
    s_nodelay(&c);
    return c;
}

static void recv_exact(struct sock *k, void *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = s_recv(k, (char *)b + got, n - got, 0);
        if (r <= 0)
            die("recv", (long)r);
        got += (size_t)r;
    }
}

static void send_exact(struct sock *k, const void *b, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = s_send(k, (const char *)b + off, n - off);
        if (r <= 0)
            die("send", (long)r);
        off += (size_t)r;
    }
}

/* ---- the server: one connection per test, the test named by the first byte ---- */

static void server(bool sdp, int ready_fd)
{
    uint16_t port;
    struct sock l = s_listen(sdp, &port);
    if (write(ready_fd, &port, sizeof(port)) != sizeof(port))
        exit(1);
    char *buf = malloc(1u << 20);
    for (;;) {
        struct sock a = s_accept(&l);
        char mode;
        recv_exact(&a, &mode, 1);
        if (mode == 'q') {
            s_close(&a);
            break;
        }
        if (mode == 'l') {
            for (;;) {
                ssize_t r = s_recv(&a, buf, opt_lat_size, MSG_WAITALL);
                if (r <= 0)
                    break;
                send_exact(&a, buf, (size_t)r);
            }
        } else {
            for (;;) {
                ssize_t r = s_recv(&a, buf, 1u << 20, 0);
                if (r <= 0)
                    break;
            }
            send_exact(&a, "k", 1);     /* all received */
        }
        s_close(&a);
    }
    s_close(&l);
    exit(0);
}

static pid_t start_server(bool sdp, uint16_t *port)
{
    int p[2];
    if (pipe(p))
        die("pipe", errno);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        server(sdp, p[1]);
    }
    close(p[1]);
    if (read(p[0], port, sizeof(*port)) != sizeof(*port))
        die("server start", 0);
    close(p[0]);
    return pid;
}

static void stop_server(bool sdp, uint16_t port, pid_t pid)
{
    struct sock c = s_connect(sdp, port);
    send_exact(&c, "q", 1);
    char b;
    s_recv(&c, &b, 1, 0);
    s_close(&c);
    waitpid(pid, NULL, 0);
}

static double run_lat(bool sdp, uint16_t port)
{
    struct sock c = s_connect(sdp, port);
    send_exact(&c, "l", 1);
    char *b = calloc(1, opt_lat_size);
    for (int i = 0; i < 1000; i++) {       /* warm up */
        send_exact(&c, b, opt_lat_size);
        recv_exact(&c, b, opt_lat_size);
    }
    long iters = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 200; i++) {
            send_exact(&c, b, opt_lat_size);
            recv_exact(&c, b, opt_lat_size);
        }
        iters += 200;
        t = now_s();
    } while (t - t0 < opt_seconds);
    s_close(&c);
    free(b);
    return (t - t0) / (double)iters * 1e6;
}

/* CPU seconds (user, system) of this process, or of process pid from /proc (pid 0: this process). */
static void cpu_of(pid_t pid, double *user, double *sys)
{
    *user = *sys = 0;
    if (!pid) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
        *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        return;
    }
    char path[64], line[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (fgets(line, sizeof(line), f)) {
        const char *p = strrchr(line, ')');
        unsigned long ut = 0, st = 0;
        /* after the command: state and 10 more fields, then utime and stime (proc(5) fields 14 and 15) */
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2) {
            long hz = sysconf(_SC_CLK_TCK);
            *user = (double)ut / (double)hz;
            *sys = (double)st / (double)hz;
        }
    }
    fclose(f);
}

static double run_bw(bool sdp, uint16_t port, size_t size)
{
    double cu0, cs0, su0, ss0;
    cpu_of(0, &cu0, &cs0);
    cpu_of(server_pid[sdp], &su0, &ss0);
    struct sock c = s_connect(sdp, port);
    send_exact(&c, "b", 1);
    char *b = malloc(size);
    memset(b, 0x42, size);
    /* SDP_BENCH_PHASE=N: N more bytes before the timed writes, which then start at offset 1 + N of the send ring
     * (sdp_verbs's rstream starts its bulk at 16; the lent regions are cut where the ring ends). */
    const char *phase = getenv("SDP_BENCH_PHASE");
    for (size_t left = phase ? strtoul(phase, NULL, 0) : 0; left > 0;) {
        size_t n = left < size ? left : size;
        send_exact(&c, b, n);
        left -= n;
    }
    uint64_t bytes = 0;
    double t0 = now_s();
    while (now_s() - t0 < opt_seconds) {
        send_exact(&c, b, size);
        bytes += size;
    }
    if (c.sdp)
        rs_sdp_shutdown(c.s, SHUT_WR);
    else
        shutdown(c.fd, SHUT_WR);
    char k;
    recv_exact(&c, &k, 1);
    double t = now_s() - t0;
    if (getenv("SDP_BENCH_STATS")) {
        double cu, cs, su, ss, gb = (double)bytes / 1e9;
        cpu_of(0, &cu, &cs);
        cpu_of(server_pid[sdp], &su, &ss);
        fprintf(stderr, "# %zu %s: %.1f MB/s, %llu bytes; CPU s per GB: sender user %.2f sys %.2f, receiver user %.2f "
                        "sys %.2f\n",
                size, sdp ? "sdp" : "tcp", (double)bytes / t / 1e6, (unsigned long long)bytes, (cu - cu0) / gb, (cs - cs0) / gb,
                (su - su0) / gb, (ss - ss0) / gb);
    }
    if (c.sdp && getenv("SDP_BENCH_STATS")) {
        struct rs_sdp_stats st = { 0 };
        socklen_t len = sizeof(st);
        rs_sdp_getsockopt(c.s, RS_SOL_SDP, RS_SDP_STATS, &st, &len);
        fprintf(stderr, "# %zu: data msgs %llu, SrcAvail %llu (%llu MiB), into sinks %llu MiB, crossed %llu, "
                        "SendSm %llu, credit stalls %llu, credit updates received as msgs %llu, ring lent %llu MiB "
                        "in %llu\n", size,
                (unsigned long long)st.data_msgs_sent, (unsigned long long)st.src_avail_sent,
                (unsigned long long)(st.zcopy_src_bytes >> 20), (unsigned long long)(st.zcopy_sink_bytes >> 20),
                (unsigned long long)st.sinks_crossed, (unsigned long long)st.send_sm_received,
                (unsigned long long)st.credit_stalls, (unsigned long long)st.msgs_received,
                (unsigned long long)(st.ring_lent_bytes >> 20), (unsigned long long)st.ring_lends);
    }
    s_close(&c);
    free(b);
    return (double)bytes / t / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t parse_size(const char *s)
{
    char *end;
    size_t v = strtoul(s, &end, 0);
    if (*end == 'K' || *end == 'k')
        v <<= 10;
    else if (*end == 'M' || *end == 'm')
        v <<= 20;
    return v;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--kind") && v) {
            opt_kind = !strcmp(v, "verbs") ? RS_RNIC_KIND_VERBS : RS_RNIC_KIND_SOFT;
            i++;
        } else if (!strcmp(a, "--addr") && v) {
            opt_addr = v;
            i++;
        } else if (!strcmp(a, "--seconds") && v) {
            opt_seconds = atof(v);
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            opt_reps = atoi(v) > 0 ? atoi(v) : 1;
            i++;
        } else if (!strcmp(a, "--lat-size") && v) {
            opt_lat_size = parse_size(v);
            i++;
        } else if (!strcmp(a, "--zcopy") && v) {
            opt_zcopy = atoi(v);
            i++;
        } else if (!strcmp(a, "--only-sdp")) {
            opt_only_sdp = true;
        } else if (!strcmp(a, "--fixed")) {
            opt_adaptive = 0;
        } else if (!strcmp(a, "--modes") && v) {
            opt_lat = strstr(v, "lat") != NULL;
            opt_bw = strstr(v, "bw") != NULL;
            i++;
        } else if (!strcmp(a, "--sizes") && v) {
            char *copy = strdup(v), *save = NULL;
            opt_nsizes = 0;
            for (char *t = strtok_r(copy, ",", &save); t && opt_nsizes < 16; t = strtok_r(NULL, ",", &save))
                opt_sizes[opt_nsizes++] = parse_size(t);
            free(copy);
            i++;
        } else {
            fprintf(stderr, "usage: %s [--kind soft|verbs] [--addr IP] [--seconds S] [--reps N] [--sizes LIST] "
                            "[--lat-size N] [--zcopy BYTES] [--fixed] [--only-sdp] [--modes lat,bw]\n", argv[0]);
            return 2;
        }
    }
    uint16_t port[2];
    pid_t pid[2];
    int k0 = opt_only_sdp ? 1 : 0;     /* the first kind measured: 0 kernel TCP, 1 SDP */
    for (int k = k0; k < 2; k++)
        server_pid[k] = pid[k] = start_server(k == 1, &port[k]);
    FILE *load = fopen("/proc/loadavg", "r");
    char la[64] = "";
    if (load) {
        if (!fgets(la, sizeof(la), load))
            la[0] = 0;
        fclose(load);
    }
    printf("# sdp_bench: %s RNIC, %s, zcopy threshold %d, %.1f s per run, median of %d; load %s",
           opt_kind == RS_RNIC_KIND_VERBS ? "verbs" : "soft", opt_addr, opt_zcopy, opt_seconds, opt_reps, la);
    printf("test,size,tcp,sdp,ratio\n");
    if (opt_lat) {
        double v[2][64];
        for (int r = 0; r < opt_reps && r < 64; r++)
            for (int k = 0; k < 2; k++)
                v[k][r] = k >= k0 ? run_lat(k == 1, port[k]) : 1;
        double t = median(v[0], opt_reps), s = median(v[1], opt_reps);
        if (k0)
            printf("lat_rtt_us,%zu,-,%.2f,-\n", opt_lat_size, s);
        else
            printf("lat_rtt_us,%zu,%.2f,%.2f,%.2f\n", opt_lat_size, t, s, s / t);
    }
    if (opt_bw) {
        for (int i = 0; i < opt_nsizes; i++) {
            double v[2][64];
            for (int r = 0; r < opt_reps && r < 64; r++)
                for (int k = 0; k < 2; k++)
                    v[k][r] = k >= k0 ? run_bw(k == 1, port[k], opt_sizes[i]) : 1;
            double t = median(v[0], opt_reps), s = median(v[1], opt_reps);
            if (k0)
                printf("bw_mb_s,%zu,-,%.1f,-\n", opt_sizes[i], s);
            else
                printf("bw_mb_s,%zu,%.1f,%.1f,%.2f\n", opt_sizes[i], t, s, s / t);
        }
    }
    for (int k = k0; k < 2; k++)
        stop_server(k == 1, port[k], pid[k]);
    return 0;
}
