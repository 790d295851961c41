/*
 * thread.h: rdmasock's own threads (progress loops, hand-back workers).
 */
#ifndef RS_COMMON_THREAD_H
#define RS_COMMON_THREAD_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

/*
 * Starts fn(arg) on a new thread that has every signal blocked from its first instruction: the host program's
 * signal handlers must run on the program's own threads only (a handler interrupting rdmasock could re-enter it, and
 * a program that directs a signal at "some thread" expects one of its own). detached: nobody joins it (out may then
 * be NULL). Returns 0 or a positive errno, as pthread_create does.
 */
int rs_thread_start(pthread_t *out, void *(*fn)(void *), void *arg, bool detached);

/*
 * getpid() without a system call on every use (glibc stopped caching it in 2.25, and the interception layer asks on
 * every socket call whether this process owns the connection; in a VM under TCG a system call costs microseconds).
 * The cache is forgotten around fork (pthread_atfork, registered at first use), so a child never sees its parent's
 * pid. A process created with a raw clone(2) that skips glibc's fork handlers is not supported, as for glibc itself.
 */
pid_t rs_self_pid_slow(void);
extern pid_t rs_cached_pid_;   /* 0 until first asked, and again around fork */
static inline __attribute__((always_inline)) pid_t rs_self_pid(void)
{
    pid_t pid = __atomic_load_n(&rs_cached_pid_, __ATOMIC_RELAXED);
    return pid > 0 ? pid : rs_self_pid_slow();
}

#endif /* RS_COMMON_THREAD_H */
