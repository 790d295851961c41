/*
 * calltime.so: where a ping-pong's time goes, per call, in wall-clock time. Preloaded in front of rdmasock (or of
 * librdmacm for rsockets' rsend/rrecv), it times every send/recv (rsend/rrecv) and, inside a send, the provider's
 * doorbell write (on rxe the write(2) to /dev/infiniband/uverbsN that runs the request, the peer's responder and
 * the ACK inline). At exit each process prints one line: calls and mean microseconds of sends, of receives that
 * found data (hits) and of those that found none (misses), of the doorbell writes, of a send's work before and
 * after its write, and the mean number of misses before each hit.
 *
 * Used by tools/vm/jobs/sdp_calltime.sh (bench/sdp_calltime.sh); docs/results/sdp-verbs.md shows what it found.
 * Measurement only: it costs two rdtsc per call and is never part of the library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

enum { K_SEND, K_HIT, K_MISS, K_WRITE, K_PRE, K_POST, K_N };
static const char *const names[K_N] = { "send", "recv_hit", "recv_miss", "doorbell_write", "send_before_write",
                                        "send_after_write" };
static uint64_t sum[K_N], cnt[K_N];
static uint64_t misses_total, hits_total;
static uint64_t t0_tsc;
static struct timespec t0_ts;
static __thread int depth;                 /* inside a timed call: nested calls are not timed again */
static __thread int in_send;
static __thread uint64_t send_start, write_end;

static void __attribute__((constructor)) calltime_init(void)
{
    t0_tsc = __rdtsc();
    clock_gettime(CLOCK_MONOTONIC, &t0_ts);
}

static void __attribute__((destructor)) calltime_fini(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double ns = (double)(ts.tv_sec - t0_ts.tv_sec) * 1e9 + (double)(ts.tv_nsec - t0_ts.tv_nsec);
    double ticks_per_us = (double)(__rdtsc() - t0_tsc) / ns * 1000.0;
    if (!cnt[K_SEND] && !cnt[K_HIT])
        return;
    char line[1024];
    int n = snprintf(line, sizeof(line), "calltime pid %d:", (int)getpid());
    for (int k = 0; k < K_N && n < (int)sizeof(line); k++)
        if (cnt[k])
            n += snprintf(line + n, sizeof(line) - (size_t)n, " %s %llu x %.2f us;", names[k],
                          (unsigned long long)cnt[k], (double)sum[k] / (double)cnt[k] / ticks_per_us);
    if (hits_total && n < (int)sizeof(line))
        snprintf(line + n, sizeof(line) - (size_t)n, " misses per hit %.2f\n",
                 (double)misses_total / (double)hits_total);
    const char *path = getenv("CALLTIME_OUT");
    FILE *out = path ? fopen(path, "a") : NULL;
    fputs(line, out ? out : stderr);
    if (out)
        fclose(out);
}

static void count(int k, uint64_t ticks)
{
    sum[k] += ticks;
    cnt[k]++;
}

#define TIMED(ret, name, is_send)                                                                       \
    ret name(int fd, void *buf, size_t len, int flags)                                                  \
    {                                                                                                   \
        static ret (*real)(int, void *, size_t, int);                                                   \
        if (!real)                                                                                      \
            real = (ret (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, #name);                          \
        if (depth)                                                                                      \
            return real(fd, buf, len, flags);                                                           \
        depth++;                                                                                        \
        uint64_t a = __rdtsc();                                                                         \
        send_start = a;                                                                                 \
        in_send = is_send;                                                                              \
        write_end = 0;                                                                                  \
        ret r = real(fd, buf, len, flags);                                                              \
        uint64_t b = __rdtsc();                                                                         \
        depth--;                                                                                        \
        if (is_send) {                                                                                  \
            count(K_SEND, b - a);                                                                       \
            if (write_end)                                                                              \
                count(K_POST, b - write_end);                                                           \
        } else if (r > 0) {                                                                             \
            count(K_HIT, b - a);                                                                        \
            hits_total++;                                                                               \
        } else {                                                                                        \
            count(K_MISS, b - a);                                                                       \
            misses_total++;                                                                             \
        }                                                                                               \
        in_send = 0;                                                                                    \
        return r;                                                                                       \
    }

TIMED(ssize_t, send, 1)
TIMED(ssize_t, recv, 0)
TIMED(ssize_t, rsend, 1)
TIMED(ssize_t, rrecv, 0)

/* The doorbell: rdma-core's rxe provider posts by writing a 32-byte command to the uverbs fd. */
ssize_t write(int fd, const void *buf, size_t len)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real)
        real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    uint64_t a = __rdtsc();
    ssize_t r = real(fd, buf, len);
    uint64_t b = __rdtsc();
    if (len == 32) {
        count(K_WRITE, b - a);
        if (in_send && !write_end) {
            count(K_PRE, a - send_start);
            write_end = b;
        }
    }
    return r;
}
