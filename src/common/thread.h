/*
 * thread.h: rdmasock's own threads (progress loops, hand-back workers).
 */
#ifndef RS_COMMON_THREAD_H
#define RS_COMMON_THREAD_H

#include <pthread.h>
#include <stdbool.h>

/*
 * Starts fn(arg) on a new thread that has every signal blocked from its first instruction: the host program's
 * signal handlers must run on the program's own threads only (a handler interrupting rdmasock could re-enter it, and
 * a program that directs a signal at "some thread" expects one of its own). detached: nobody joins it (out may then
 * be NULL). Returns 0 or a positive errno, as pthread_create does.
 */
int rs_thread_start(pthread_t *out, void *(*fn)(void *), void *arg, bool detached);

#endif /* RS_COMMON_THREAD_H */
