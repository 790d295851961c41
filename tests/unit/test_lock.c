/* common/lock.h: the futex mutex and its condition under contention (mutual exclusion, no lost wake-up, trylock,
 * the state it leaves). The data path's SDP socket, interposer socket and verbs CQ locks are this lock. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/lock.h"

#define THREADS 4
#define ROUNDS 200000

static struct rs_lock counter_lock = RS_LOCK_INITIALIZER;
static uint64_t counter;            /* plain: only the lock makes the increments add up */
static volatile bool inside;
static int collisions;             /* a thread found another inside (cmocka asserts only on the main thread) */

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        if (i % 7 == 0) {
            while (!rs_trylock(&counter_lock))
                ;
        } else {
            rs_lock(&counter_lock);
        }
        if (inside)
            __atomic_add_fetch(&collisions, 1, __ATOMIC_RELAXED);
        inside = true;
        uint64_t v = counter;
        if (i % 1024 == 0)
            sched_yield();      /* hold it across a reschedule now and then: the others must sleep, then wake */
        counter = v + 1;
        inside = false;
        rs_unlock(&counter_lock);
    }
    return NULL;
}

static void test_mutual_exclusion(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    counter = 0;
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(collisions, 0);
    assert_int_equal(counter, (uint64_t)THREADS * ROUNDS);
    assert_int_equal(counter_lock.state, 0);         /* free, and nobody marked as waiting */
}

static void test_trylock(void **state)
{
    (void)state;
    struct rs_lock l;
    rs_lock_init(&l);
    assert_true(rs_trylock(&l));
    assert_false(rs_trylock(&l));
    rs_unlock(&l);
    assert_true(rs_trylock(&l));
    rs_unlock(&l);
    assert_int_equal(l.state, 0);
}

/* Waiters sleep on a condition until a flag is set; one broadcast must wake them all, including one that read the
 * flag just before the broadcast (the sequence number closes that window). */
static struct rs_lock gate_lock = RS_LOCK_INITIALIZER;
static struct rs_cond gate_cond;
static bool gate_open;
static int woken;

static void *waiter(void *arg)
{
    (void)arg;
    rs_lock(&gate_lock);
    while (!gate_open)
        rs_cond_wait(&gate_cond, &gate_lock);
    woken++;
    rs_unlock(&gate_lock);
    return NULL;
}

static void test_cond_broadcast(void **state)
{
    (void)state;
    for (int round = 0; round < 50; round++) {
        pthread_t t[THREADS];
        rs_cond_init(&gate_cond);
        gate_open = false;
        woken = 0;
        for (int i = 0; i < THREADS; i++)
            assert_int_equal(pthread_create(&t[i], NULL, waiter, NULL), 0);
        if (round % 2)
            usleep(1000);       /* half the rounds: the waiters are asleep; the others: some are still arriving */
        rs_lock(&gate_lock);
        gate_open = true;
        rs_cond_broadcast(&gate_cond);
        rs_unlock(&gate_lock);
        for (int i = 0; i < THREADS; i++)
            assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(woken, THREADS);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutual_exclusion),
        cmocka_unit_test(test_trylock),
        cmocka_unit_test(test_cond_broadcast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
