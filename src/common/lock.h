/*
 * lock.h: a mutex whose uncontended lock and unlock are one atomic instruction each, written inline.
 *
 * Why not pthread_mutex_t everywhere: the busy-polled data path takes the SDP socket's lock and the verbs CQ's lock
 * on every call, and glibc's pthread_mutex_lock/unlock are calls into libc that dispatch on the mutex type (about
 * 60 instructions and four calls and returns per pair). Under an emulated CPU (the rxe VM, TCG) every call and
 * return on that path costs, and slows the kernel work that follows (docs/results/sdp-verbs.md). Contended, it
 * sleeps in futex(2) as glibc does: the three-state mutex of Drepper's "Futexes Are Tricky" (0 free, 1 locked,
 * 2 locked and somebody may be waiting). No spinning, as glibc's default mutex.
 *
 * Process-private (FUTEX_*_PRIVATE), not recursive, no owner checks; struct rs_cond below is its condition
 * variable (broadcast only). After fork the child's copy keeps the parent's state, as a pthread mutex does.
 */
#ifndef RS_COMMON_LOCK_H
#define RS_COMMON_LOCK_H

#include <stdbool.h>
#include <stdint.h>

struct rs_lock {
    uint32_t state;
};

#define RS_LOCK_INITIALIZER { 0 }

void rs_lock_contended(struct rs_lock *l);     /* lock.c: wait until it is ours */
void rs_lock_wake(struct rs_lock *l);          /* lock.c: wake one waiter */

static inline void rs_lock_init(struct rs_lock *l) { __atomic_store_n(&l->state, 0, __ATOMIC_RELAXED); }

static inline void rs_lock(struct rs_lock *l)
{
    uint32_t free_state = 0;
    if (__builtin_expect(!__atomic_compare_exchange_n(&l->state, &free_state, 1, false, __ATOMIC_ACQUIRE,
                                                      __ATOMIC_RELAXED), 0))
        rs_lock_contended(l);
}

/* True when it took the lock. */
static inline bool rs_trylock(struct rs_lock *l)
{
    uint32_t free_state = 0;
    return __atomic_compare_exchange_n(&l->state, &free_state, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static inline void rs_unlock(struct rs_lock *l)
{
    if (__builtin_expect(__atomic_exchange_n(&l->state, 0, __ATOMIC_RELEASE) == 2, 0))
        rs_lock_wake(l);
}

/*
 * A condition to wait on under an rs_lock: a counter bumped by every broadcast. A waiter reads it under the lock,
 * lets go and sleeps in futex(2) only while it is unchanged, so a broadcast between the two is never missed.
 * Spurious wake-ups happen: wait in a loop that tests the predicate, as with pthread_cond_wait.
 */
struct rs_cond {
    uint32_t seq;
};

void rs_cond_wait(struct rs_cond *c, struct rs_lock *l);       /* lock.c; l held, and held again on return */
void rs_cond_broadcast(struct rs_cond *c);                      /* lock.c; l held or not */

static inline void rs_cond_init(struct rs_cond *c) { __atomic_store_n(&c->seq, 0, __ATOMIC_RELAXED); }

#endif /* RS_COMMON_LOCK_H */
