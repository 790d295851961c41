/*
 * thread.c: rdmasock's own threads (thread.h).
 */
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/thread.h"

int rs_thread_start(pthread_t *out, void *(*fn)(void *), void *arg, bool detached)
{
    pthread_attr_t attr;
    int r = pthread_attr_init(&attr);
    if (r != 0)
        return r;
    if (detached)
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* The new thread inherits the creator's mask: block everything around the creation, then restore ours. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* Straight into *out, as pthread_create would: the new thread may look at it (am I the loop thread?). */
    pthread_t th;
    r = pthread_create(out ? out : &th, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return r;
}

pid_t rs_cached_pid_;
static pthread_once_t pid_handlers_once = PTHREAD_ONCE_INIT;

/* Before fork (another thread may fill the cache again before the fork itself: the child forgets once more). */
static void forget_pid(void)
{
    __atomic_store_n(&rs_cached_pid_, 0, __ATOMIC_RELAXED);
}

static void register_pid_handlers(void)
{
    pthread_atfork(forget_pid, NULL, forget_pid);
}

pid_t rs_self_pid_slow(void)
{
    pid_t pid = __atomic_load_n(&rs_cached_pid_, __ATOMIC_RELAXED);
    if (pid > 0)
        return pid;
    pthread_once(&pid_handlers_once, register_pid_handlers);
    pid = (pid_t)syscall(SYS_getpid);
    __atomic_store_n(&rs_cached_pid_, pid, __ATOMIC_RELAXED);
    return pid;
}
