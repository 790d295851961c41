/*
 * signals.h: what the application's signal handlers allow a blocked socket call to do after EINTR.
 *
 * The kernel restarts an interrupted recv, send, accept, connect... when the handler that ran was installed with
 * SA_RESTART (and the socket has no SO_RCVTIMEO/SO_SNDTIMEO), and returns EINTR otherwise. rdmasock's blocking
 * calls sleep in poll(2), which a handler ALWAYS interrupts with EINTR, so they must decide themselves. To know,
 * signals.c interposes sigaction, signal, bsd_signal, ssignal, sysv_signal, sigset and siginterrupt: every
 * handler the application installs runs behind a trampoline that counts, per thread, the handlers that ran and
 * those without SA_RESTART. The application sees nothing of it (oldact, SA_SIGINFO arguments, SA_RESETHAND,
 * SA_NODEFER and the kernel's own flags are all exactly what it set).
 *
 * Use, around every blocking wait of a socket call:
 *
 *     struct rs_signal_mark mark;
 *     for (;;) {
 *         rs_signal_mark(&mark);                  // immediately before each sleep, not once per call
 *         int n = poll(...);
 *         if (n < 0 && errno == EINTR) {
 *             if (!rs_signal_restart_allowed(&mark))
 *                 return -EINTR;                  // as the kernel would
 *             continue;                           // as the kernel's restart would
 *         }
 *         ...
 *     }
 *
 * Signals handled on another thread do not interrupt this thread's poll, and do not count here (the counters are
 * per thread), which is what the kernel does: only the thread that runs the handler has its call interrupted.
 */
#ifndef RS_INTERCEPT_SIGNALS_H
#define RS_INTERCEPT_SIGNALS_H

#include <stdbool.h>

struct rs_signal_mark {
    unsigned long handled;          /* this thread's count of application handlers run, at the mark */
    unsigned long not_restartable;  /* ... of those installed without SA_RESTART */
};

/* Records this thread's counters; async-signal-safe. */
void rs_signal_mark(struct rs_signal_mark *m);

/*
 * After EINTR: true when every application handler that ran on this thread since the mark had SA_RESTART, so the
 * kernel would have restarted the call. Also true when none ran: the EINTR then came from a handler rdmasock did
 * not install (glibc's own SIGSETXID handler, which has SA_RESTART; a handler installed with a raw rt_sigaction
 * system call is treated the same way).
 */
bool rs_signal_restart_allowed(const struct rs_signal_mark *m);

/* True when at least one application handler ran on this thread since the mark. */
bool rs_signal_handled_since(const struct rs_signal_mark *m);

/* For proc.c around fork: no sigaction is half done in the child (see signals.c). */
void rs_signals_fork_prepare(void);
void rs_signals_fork_done(void);

#endif /* RS_INTERCEPT_SIGNALS_H */
