/*
 * lock.c: the contended halves of struct rs_lock (lock.h).
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/lock.h"

void rs_lock_contended(struct rs_lock *l)
{
    /* Mark the lock as waited on, then sleep while it stays taken. Whoever releases a lock in state 2 wakes one
     * sleeper; the woken thread takes it in state 2 again, since others may still sleep (a spare wake-up at worst). */
    while (__atomic_exchange_n(&l->state, 2, __ATOMIC_ACQUIRE) != 0)
        (void)syscall(SYS_futex, &l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void rs_lock_wake(struct rs_lock *l)
{
    (void)syscall(SYS_futex, &l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void rs_cond_wait(struct rs_cond *c, struct rs_lock *l)
{
    uint32_t seen = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
    rs_unlock(l);
    (void)syscall(SYS_futex, &c->seq, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
    rs_lock(l);
}

void rs_cond_broadcast(struct rs_cond *c)
{
    __atomic_add_fetch(&c->seq, 1, __ATOMIC_RELEASE);
    (void)syscall(SYS_futex, &c->seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
