/*
 * stats.c: rdmasock-perf's clock, medians, receiver timestamps, the results and their CSV form.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"

const struct perf_case perf_cases[] = {
    { PERF_SEND, PERF_UD, "ud:send" },
    { PERF_WRECORD, PERF_UD, "ud:wrecord" },
    { PERF_READ, PERF_UD, "ud:read" },
    { PERF_SEND, PERF_RC, "rc:send" },
    { PERF_WRITE, PERF_RC, "rc:write" },
    { PERF_READ, PERF_RC, "rc:read" },
    { PERF_TCP, PERF_KERNEL, "tcp" },
    { PERF_UDP, PERF_KERNEL, "udp" },
};
const size_t perf_case_count = sizeof(perf_cases) / sizeof(perf_cases[0]);

const char *perf_role_tag = "rdmasock-perf";

const char *perf_test_name(enum perf_test t)
{
    static const char *const names[] = { "send", "write", "wrecord", "read", "tcp", "udp" };
    return names[t];
}

const char *perf_transport_name(enum perf_transport t)
{
    static const char *const names[] = { "ud", "rc", "kernel" };
    return names[t];
}

const char *perf_mode_name(enum perf_mode m) { return m == PERF_LAT ? "lat" : "bw"; }

enum perf_group perf_case_group(const struct perf_case *c)
{
    if (c->test == PERF_TCP)
        return PERF_GROUP_TCP;
    if (c->test == PERF_UDP)
        return PERF_GROUP_UDP;
    return c->transport == PERF_UD ? PERF_GROUP_UD : PERF_GROUP_RC;
}

void perf_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    fprintf(stderr, "%s: %s\n", perf_role_tag, line);
}

uint64_t perf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t perf_median_u64(uint64_t *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_u64);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void perf_result_from_rtts(struct perf_result *res, uint64_t *rtt_ns, uint64_t n, bool one_way, size_t size,
                           uint64_t lost, uint64_t elapsed_ns)
{
    memset(res, 0, sizeof(*res));
    res->iterations = n;
    res->delivered = n;
    res->lost = lost;
    res->client_elapsed_s = elapsed_ns / 1e9;
    if (n == 0) {
        res->median_us = -1;
        return;
    }
    double sum = 0;
    for (uint64_t i = 0; i < n; i++)
        sum += (double)rtt_ns[i];
    double div = one_way ? 2.0 : 1.0;
    res->avg_us = sum / (double)n / 1000.0 / div;
    res->median_us = (double)perf_median_u64(rtt_ns, n) / 1000.0 / div;
    /* Each half of a round trip delivers one message, so one message is delivered per one-way time. */
    res->msg_rate = res->avg_us > 0 ? 1e6 / res->avg_us : 0;
    res->mb_per_s = res->msg_rate * (double)size / 1e6;
}

void perf_result_from_stream(struct perf_result *res, uint64_t sent, uint64_t delivered, uint64_t span_msgs,
                             uint64_t span_ns, size_t size, uint64_t client_elapsed_ns)
{
    memset(res, 0, sizeof(*res));
    res->iterations = sent;
    res->delivered = delivered;
    res->lost = sent > delivered ? sent - delivered : 0;
    res->client_elapsed_s = client_elapsed_ns / 1e9;
    if (span_msgs && span_ns) {
        res->msg_rate = (double)span_msgs * 1e9 / (double)span_ns;
        res->avg_us = 1e6 / res->msg_rate;
    }
    /* Arrivals come in bursts (a socket buffer drained at memory speed, then a wait): a median of per-message
     * times would describe the bursts, not the stream, so none is given. */
    res->median_us = -1;
    res->mb_per_s = res->msg_rate * (double)size / 1e6;
}

void perf_csv_header(FILE *out, const struct perf_opts *o, const char *provider_name)
{
    char host[128] = "?";
    gethostname(host, sizeof(host) - 1);
    double load[3] = { 0, 0, 0 };
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = load[1] = load[2] = 0;
        fclose(f);
    }
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
    fprintf(out, "# rdmasock-perf %s; host %s; %ld cpus; load %.2f %.2f %.2f at start; %s\n", RS_VERSION, host,
            sysconf(_SC_NPROCESSORS_ONLN), load[0], load[1], load[2], when);
    fprintf(out, "# provider %s; wait %s; ", provider_name, o->poll ? "poll" : "block");
    if (o->iters)
        fprintf(out, "%llu iterations per point", (unsigned long long)o->iters);
    else
        fprintf(out, "%.2f s per point", o->seconds);
    fprintf(out, "; window %u", o->window);
    if (o->cpu_client >= 0)
        fprintf(out, "; client on cpu %d, server on cpu %d", o->cpu_client, o->cpu_server);
    fprintf(out, "\n# wait block: CQ fd armed then poll(2), kernel sockets block in the call; wait poll: busy polling\n");
    fprintf(out, "test,transport,mode,size,iterations,avg_us,median_us,msg_rate,mb_per_s,lost,wait,provider\n");
    fflush(out);
}

void perf_csv_row(FILE *out, const struct perf_case *c, enum perf_mode mode, size_t size, const struct perf_result *r,
                  const struct perf_opts *o, const char *provider_name)
{
    char median[32] = "";
    if (r->median_us >= 0)
        snprintf(median, sizeof(median), "%.3f", r->median_us);
    fprintf(out, "%s,%s,%s,%zu,%llu,%.3f,%s,%.0f,%.2f,%llu,%s,%s\n", perf_test_name(c->test),
            perf_transport_name(c->transport), perf_mode_name(mode), size, (unsigned long long)r->iterations,
            r->avg_us, median, r->msg_rate, r->mb_per_s, (unsigned long long)r->lost, o->poll ? "poll" : "block",
            c->transport == PERF_KERNEL ? "kernel" : provider_name);
    fflush(out);
}
