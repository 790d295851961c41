/*
 * thread.c: rdmasock's own threads (thread.h).
 */
#include <signal.h>

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
