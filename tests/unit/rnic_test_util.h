/*
 * Helpers shared by the rnic conformance tests (test_rnic_*.c): the provider and address under test come from the
 * environment, so one binary runs against the soft RNIC on the host and against the verbs provider in the VM.
 *   RS_RNIC_KIND  soft (default) | verbs
 *   RS_TEST_ADDR  local IPv4 address to use (default 127.0.0.1)
 * Include after <cmocka.h>: test_addr asserts.
 */
#ifndef RS_TESTS_RNIC_TEST_UTIL_H
#define RS_TESTS_RNIC_TEST_UTIL_H

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rnic/rnic.h"

static inline int test_kind(void)
{
    const char *k = getenv("RS_RNIC_KIND");
    return k && strcmp(k, "verbs") == 0 ? RS_RNIC_KIND_VERBS : RS_RNIC_KIND_SOFT;
}

static inline bool is_soft(void) { return test_kind() == RS_RNIC_KIND_SOFT; }

static inline struct sockaddr_in test_addr(uint16_t port)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    const char *s = getenv("RS_TEST_ADDR");
    assert_int_equal(inet_pton(AF_INET, s && *s ? s : "127.0.0.1", &a.sin_addr), 1);
    return a;
}

static inline uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Polls until one completion arrives or timeout_ms passes; returns 1, 0, or the poll error. */
static inline int wait_wc(struct rs_rnic_cq *cq, unsigned timeout_ms, struct rs_rnic_wc *wc)
{
    uint64_t end = now_ms() + timeout_ms;
    for (;;) {
        int n = rs_rnic_poll_cq(cq, 1, wc);
        if (n != 0 || now_ms() >= end)
            return n;
        sleep_ms(1);
    }
}

/* A reproducible byte pattern per seed, so a receiver can check data without a copy of what was sent. */
static inline void fill_pattern(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

#endif /* RS_TESTS_RNIC_TEST_UTIL_H */
