/* Micro-benchmarks of the common pieces every packet touches: CRC32c (software slicing-by-8 vs the fastest
 * hardware path rs_crc32c selects) and rule matching (first match over N rules). Prints CSV; ratios matter,
 * not absolute numbers. */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/config.h"
#include "common/crc32c.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_crc(void)
{
    static uint8_t buf[65536];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 131u + 7u);
    const size_t sizes[] = { 64, 1024, 65536 };
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t len = sizes[s];
        size_t iters = (256u << 20) / len;
        uint32_t sink = 0;
        double t0 = now_seconds();
        for (size_t i = 0; i < iters; i++)
            sink += rs_crc32c_sw(0, buf, len);
        double sw = now_seconds() - t0;
        double hw = 0;
        if (rs_crc32c_hw_available()) {
            t0 = now_seconds();
            for (size_t i = 0; i < iters; i++)
                sink += rs_crc32c(0, buf, len);
            hw = now_seconds() - t0;
        }
        double bytes = (double)iters * len;
        printf("crc32c,%zu,%.2f,%.2f,%.2f,%08x\n", len, bytes / sw / 1e9, hw > 0 ? bytes / hw / 1e9 : 0.0,
               hw > 0 ? sw / hw : 0.0, sink);
    }
}

static void bench_match(void)
{
    const unsigned counts[] = { 1, 16, 256, 4096 };
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        unsigned n = counts[c];
        size_t cap = (size_t)n * 64 + 64;
        char *text = malloc(cap);
        size_t off = 0;
        /* Rules that never match the query, so every lookup walks all of them: the worst case. */
        for (unsigned i = 0; i < n; i++)
            off += (size_t)snprintf(text + off, cap - off, "use rdma tcp client 10.%u.%u.0/24:%u\n",
                                    (i >> 8) & 255, i & 255, 1000 + i % 5000);
        struct rs_config *cfg;
        struct rs_config_error err;
        if (rs_config_parse_buffer("bench", text, off, &cfg, &err) != 0) {
            fprintf(stderr, "bench: %s\n", err.message);
            exit(1);
        }
        struct sockaddr_in peer = { .sin_family = AF_INET, .sin_port = htons(80) };
        inet_pton(AF_INET, "192.168.1.1", &peer.sin_addr);
        size_t iters = 20000000u / n + 1000;
        double t0 = now_seconds();
        unsigned defaults = 0;
        for (size_t i = 0; i < iters; i++)
            defaults += rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "bench", (struct sockaddr *)&peer)
                            ->is_default;
        double ns = (now_seconds() - t0) / iters * 1e9;
        printf("match,%u,%.1f,%u\n", n, ns, defaults == iters);
        rs_config_free(cfg);
        free(text);
    }
}

int main(void)
{
    puts("# kind,size,sw_GBps,selected_GBps (what rs_crc32c uses: folding, lanes or one chain),selected_over_sw,checksum");
    bench_crc();
    puts("# kind,rules,ns_per_lookup,all_fell_through");
    bench_match();
    return 0;
}
