/*
 * RDMASOCK_SPIN_US: a blocking call on a connected SDP socket polls for that long before it sleeps. This binary
 * runs with the spin on (set in main, before the library reads it) and checks what the option must never change:
 * every byte of a ping-pong arrives intact and in order, a message that comes during the spin and one that comes
 * after it (the caller asleep) are both delivered, and the spin is bounded: a reader blocked for half a second
 * uses a small fraction of that in CPU time. Both ends run in this process, on the soft RNIC (or RS_RNIC_KIND).
 */
#include "test_sdp_util.h"

#include <sys/resource.h>

#define SPIN_US 200

struct pong_arg {
    struct rs_sdp_sock *s;
    int rounds;
    size_t size;
};

/* Echoes `rounds` messages of `size` bytes. */
static void *echo_thread(void *p)
{
    struct pong_arg *a = p;
    uint8_t *buf = malloc(a->size);
    for (int i = 0; i < a->rounds; i++) {
        size_t off = 0;
        while (off < a->size) {
            ssize_t n = rs_sdp_recv(a->s, buf + off, a->size - off, 0);
            if (n <= 0) {
                free(buf);
                return (void *)1;
            }
            off += (size_t)n;
        }
        if (rs_sdp_send(a->s, buf, a->size, MSG_NOSIGNAL) != (ssize_t)a->size) {
            free(buf);
            return (void *)1;
        }
    }
    free(buf);
    return NULL;
}

/* Runs the ping-pong on a fresh pair and returns the client's statistics. */
static struct rs_sdp_stats ping_pong(size_t size, int rounds)
{
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    struct pong_arg arg = { .s = s, .rounds = rounds, .size = size };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, echo_thread, &arg), 0);
    uint8_t *out = malloc(size), *in = malloc(size);
    for (int i = 0; i < rounds; i++) {
        fill_pattern(out, size, (uint32_t)i + 1, 0);
        send_all(c, out, size);
        memset(in, 0, size);
        recv_all(c, in, size);
        assert_int_equal(check_pattern(in, size, (uint32_t)i + 1, 0), -1);
    }
    void *ret;
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_null(ret);
    free(out);
    free(in);
    struct rs_sdp_stats st = sdp_stats(c);
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
    return st;
}

/* The spin must catch the replies, not just be harmless: the echo answers within a few tens of microseconds, far
 * inside a 200 us spin. On the soft RNIC a spin caught 15-32 of 2000 before each round asked it to read the
 * sockets again (rs_rnic_cq_wait_recheck); a quarter leaves room for a loaded machine. */
static void test_ping_pong_small(void **state)
{
    (void)state;
    int rounds = 2000;
    struct rs_sdp_stats st = ping_pong(64, rounds);
    print_message("# 64 B: %llu of %d waits spun, %llu caught, %llu slept\n", (unsigned long long)st.spins, rounds,
                  (unsigned long long)st.spin_catches, (unsigned long long)st.app_sleeps);
    assert_true(st.spins > 0);
    assert_true(st.spin_catches * 4 >= (uint64_t)rounds);
}

static void test_ping_pong_large(void **state)
{
    (void)state;
    ping_pong(256 * 1024, 40);
}

struct late_arg {
    struct rs_sdp_sock *s;
    useconds_t delay_us;
};

static void *late_sender(void *p)
{
    struct late_arg *a = p;
    usleep(a->delay_us);
    return rs_sdp_send(a->s, "late", 4, MSG_NOSIGNAL) == 4 ? NULL : (void *)1;
}

/* One message while the reader still spins, one long after it went to sleep. */
static void test_during_and_after_spin(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    useconds_t delays[] = { SPIN_US / 4, 300 * 1000 };
    for (size_t i = 0; i < sizeof(delays) / sizeof(delays[0]); i++) {
        struct late_arg arg = { .s = s, .delay_us = delays[i] };
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, late_sender, &arg), 0);
        char buf[8] = { 0 };
        recv_all(c, buf, 4);
        assert_memory_equal(buf, "late", 4);
        void *ret;
        assert_int_equal(pthread_join(t, &ret), 0);
        assert_null(ret);
    }
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
}

static double thread_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec / 1e6;
}

/* A reader that waits 500 ms for data spins once (200 us) and then sleeps: far below 50 ms of CPU. */
static void test_spin_is_bounded(void **state)
{
    (void)state;
    struct rs_sdp_sock *c, *s;
    sdp_pair(&c, &s);
    struct late_arg arg = { .s = s, .delay_us = 500 * 1000 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, late_sender, &arg), 0);
    double cpu0 = thread_cpu_s();
    char buf[8] = { 0 };
    recv_all(c, buf, 4);
    double used = thread_cpu_s() - cpu0;
    assert_memory_equal(buf, "late", 4);
    void *ret;
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_null(ret);
    print_message("# a 500 ms blocking recv used %.1f ms of CPU (spin %d us)\n", used * 1e3, SPIN_US);
    assert_true(used < 0.05);
    assert_int_equal(rs_sdp_close(c), 0);
    assert_int_equal(rs_sdp_close(s), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    char v[16];
    snprintf(v, sizeof(v), "%d", SPIN_US);
    setenv("RDMASOCK_SPIN_US", v, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping_pong_small),
        cmocka_unit_test(test_ping_pong_large),
        cmocka_unit_test(test_during_and_after_spin),
        cmocka_unit_test(test_spin_is_bounded),
    };
    return cmocka_run_group_tests_name("sdp_spin", tests, NULL, NULL);
}
