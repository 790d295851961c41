/*
 * signals.c: the application's signal handlers run behind trampolines, so a blocking socket call interrupted in
 * poll(2) can tell whether the kernel would have restarted it (signals.h).
 *
 * Transparency. The kernel keeps the application's disposition exactly as the application asked (flags, mask,
 * SA_RESTORER filled in by glibc as always); only the handler address is replaced by a trampoline, and every
 * answer given back (oldact, signal()'s return value, sigset()'s) has the application's handler put back. The
 * kernel itself therefore implements SA_RESETHAND (the disposition it resets to is SIG_DFL, which is returned as
 * is), SA_NODEFER, SA_ONSTACK and the mask; SIG_IGN and SIG_DFL are passed through untouched; an SA_SIGINFO
 * handler receives the kernel's own siginfo and ucontext pointers (changing uc_sigmask in the handler still
 * changes the mask restored on return).
 *
 * Which trampoline. There is one trampoline per (calling convention, SA_RESTART, bank). Encoding SA_RESTART in the
 * trampoline's identity means the restart property counted at delivery is the one of the disposition the kernel
 * actually used, with no table lookup that could race with a concurrent sigaction. The application's function is
 * read from a slot per (signal, convention, bank); a new installation writes the bank the kernel is NOT using and
 * then switches the kernel to that bank's trampoline in one rt_sigaction, so a delivery in flight through the old
 * trampoline still calls the old handler, as the kernel would.
 *
 * Installations are serialised by one spinlock, taken with every signal blocked in the calling thread: sigaction
 * is async-signal-safe, and a handler calling sigaction while its thread holds the lock would otherwise deadlock.
 * Around fork the lock is held (rs_signals_fork_prepare), so the child never inherits a half-done installation.
 *
 * Names interposed: sigaction and __sigaction; signal, bsd_signal and ssignal (one function in glibc: BSD
 * semantics, SA_RESTART unless siginterrupt(sig, 1) was called); sysv_signal and __sysv_signal (what strict ISO C
 * programs get for signal(): SA_RESETHAND | SA_NODEFER, no SA_RESTART); siginterrupt; sigset. glibc implements
 * all of these on its internal __sigaction, which no interposer sees, so each is reimplemented here on top of
 * the interposed sigaction with the same flags glibc uses; otherwise they would install the application's handler
 * without a trampoline (not counted) or hand the application a trampoline's address as its old handler.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>

#include "common/compiler.h"
#include "intercept/libc.h"
#include "intercept/signals.h"

/* Names glibc exports without a prototype in its headers (bsd_signal is declared for X/Open before 2008 only). */
int __sigaction(int sig, const struct sigaction *act, struct sigaction *oldact);
sighandler_t bsd_signal(int sig, sighandler_t handler);

typedef void (*plain_handler_fn)(int);
typedef void (*info_handler_fn)(int, siginfo_t *, void *);

/* ---- per-thread counters (read by rs_signal_mark from the same thread only) ---- */

/* initial-exec: the trampolines touch these from signal context, where a lazily allocated TLS block (the
 * general-dynamic model's __tls_get_addr) could call malloc. */
static __thread unsigned long tls_handled __attribute__((tls_model("initial-exec")));
static __thread unsigned long tls_not_restartable __attribute__((tls_model("initial-exec")));

void rs_signal_mark(struct rs_signal_mark *m)
{
    m->handled = __atomic_load_n(&tls_handled, __ATOMIC_RELAXED);
    m->not_restartable = __atomic_load_n(&tls_not_restartable, __ATOMIC_RELAXED);
}

bool rs_signal_restart_allowed(const struct rs_signal_mark *m)
{
    return __atomic_load_n(&tls_not_restartable, __ATOMIC_RELAXED) == m->not_restartable;
}

bool rs_signal_handled_since(const struct rs_signal_mark *m)
{
    return __atomic_load_n(&tls_handled, __ATOMIC_RELAXED) != m->handled;
}

/* ---- the application's handlers ---- */

#define BANKS 2
static plain_handler_fn plain_slots[BANKS][_NSIG];
static info_handler_fn info_slots[BANKS][_NSIG];
static unsigned char bank_last_installed[_NSIG];        /* under install_lock */

/* Counting comes first, so a handler that never returns (siglongjmp) is still counted. Neither the counting nor
 * the dispatch touches errno: the handler sees, and leaves, errno as it would without rdmasock. */
static inline void count_delivery(bool restartable)
{
    __atomic_add_fetch(&tls_handled, 1, __ATOMIC_RELAXED);
    if (!restartable)
        __atomic_add_fetch(&tls_not_restartable, 1, __ATOMIC_RELAXED);
}

#define DEFINE_TRAMPOLINES(bank)                                                                               \
    static void plain_restart_##bank(int sig)                                                                  \
    {                                                                                                          \
        count_delivery(true);                                                                                  \
        plain_handler_fn fn = __atomic_load_n(&plain_slots[bank][sig], __ATOMIC_ACQUIRE);                      \
        if (fn)                                                                                                \
            fn(sig);                                                                                           \
    }                                                                                                          \
    static void plain_norestart_##bank(int sig)                                                                \
    {                                                                                                          \
        count_delivery(false);                                                                                 \
        plain_handler_fn fn = __atomic_load_n(&plain_slots[bank][sig], __ATOMIC_ACQUIRE);                      \
        if (fn)                                                                                                \
            fn(sig);                                                                                           \
    }                                                                                                          \
    static void info_restart_##bank(int sig, siginfo_t *info, void *uc)                                       \
    {                                                                                                          \
        count_delivery(true);                                                                                  \
        info_handler_fn fn = __atomic_load_n(&info_slots[bank][sig], __ATOMIC_ACQUIRE);                        \
        if (fn)                                                                                                \
            fn(sig, info, uc);                                                                                 \
    }                                                                                                          \
    static void info_norestart_##bank(int sig, siginfo_t *info, void *uc)                                     \
    {                                                                                                          \
        count_delivery(false);                                                                                 \
        info_handler_fn fn = __atomic_load_n(&info_slots[bank][sig], __ATOMIC_ACQUIRE);                        \
        if (fn)                                                                                                \
            fn(sig, info, uc);                                                                                 \
    }

DEFINE_TRAMPOLINES(0)
DEFINE_TRAMPOLINES(1)

static const plain_handler_fn plain_trampolines[BANKS][2] = {
    {plain_norestart_0, plain_restart_0},
    {plain_norestart_1, plain_restart_1},
};
static const info_handler_fn info_trampolines[BANKS][2] = {
    {info_norestart_0, info_restart_0},
    {info_norestart_1, info_restart_1},
};

/* Puts the application's handler back into a disposition the kernel reported. */
static void unwrap(int sig, struct sigaction *sa)
{
    for (int bank = 0; bank < BANKS; bank++) {
        for (int restart = 0; restart < 2; restart++) {
            if (sa->sa_handler == plain_trampolines[bank][restart]) {
                sa->sa_handler = __atomic_load_n(&plain_slots[bank][sig], __ATOMIC_ACQUIRE);
                return;
            }
            if (sa->sa_sigaction == info_trampolines[bank][restart]) {
                sa->sa_sigaction = __atomic_load_n(&info_slots[bank][sig], __ATOMIC_ACQUIRE);
                return;
            }
        }
    }
}

/* ---- serialisation ---- */

static int install_lock;
static __thread int tls_install_depth __attribute__((tls_model("initial-exec")));   /* > 0: holds install_lock */
static sigset_t fork_saved_mask;        /* the forking thread's mask while it holds the lock across fork */

/* Recursive for the holder, which can only be the forking thread between prepare and done (its signals are
 * blocked otherwise): fork handlers of other libraries that run in between may install handlers. */
static void lock_installs(sigset_t *saved)
{
    if (tls_install_depth++ > 0)
        return;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, saved);
    while (__atomic_exchange_n(&install_lock, 1, __ATOMIC_ACQUIRE))
        sched_yield();                  /* another thread is between two instructions of an installation */
}

static void unlock_installs(const sigset_t *saved)
{
    if (--tls_install_depth > 0)
        return;
    __atomic_store_n(&install_lock, 0, __ATOMIC_RELEASE);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

void rs_signals_fork_prepare(void) { lock_installs(&fork_saved_mask); }
void rs_signals_fork_done(void) { unlock_installs(&fork_saved_mask); }

/* ---- sigaction ---- */

static int real_sigaction(int sig, const struct sigaction *act, struct sigaction *oldact)
{
    int (*fn)(int, const struct sigaction *, struct sigaction *) = RS_REAL(sigaction);
    if (!fn) {
        errno = ENOSYS;                 /* only while dlsym itself is running on this thread */
        return -1;
    }
    return fn(sig, act, oldact);
}

static bool is_application_function(const struct sigaction *act)
{
    return act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN;
}

static int install(int sig, const struct sigaction *act, struct sigaction *oldact)
{
    if (sig < 1 || sig >= _NSIG)
        return real_sigaction(sig, act, oldact);        /* glibc's EINVAL, untouched */

    struct sigaction request, previous;
    if (act)
        request = *act;                                 /* act and oldact may be the same object */
    sigset_t saved;
    lock_installs(&saved);
    int bank = bank_last_installed[sig];
    int old_bank = bank;
    if (act && is_application_function(act)) {
        /* The bank the kernel is not using, so deliveries in flight keep calling the previous handler. */
        bank = !bank;
        int restart = (act->sa_flags & SA_RESTART) != 0;
        if (act->sa_flags & SA_SIGINFO) {
            __atomic_store_n(&info_slots[bank][sig], act->sa_sigaction, __ATOMIC_RELEASE);
            request.sa_sigaction = info_trampolines[bank][restart];
        } else {
            __atomic_store_n(&plain_slots[bank][sig], act->sa_handler, __ATOMIC_RELEASE);
            request.sa_handler = plain_trampolines[bank][restart];
        }
    }
    int r = real_sigaction(sig, act ? &request : NULL, oldact ? &previous : NULL);
    int saved_errno = errno;
    if (r == 0) {
        bank_last_installed[sig] = (unsigned char)bank;
        if (oldact)
            unwrap(sig, &previous);     /* its bank (old_bank) was not written above */
    } else {
        bank_last_installed[sig] = (unsigned char)old_bank;
    }
    unlock_installs(&saved);
    if (r == 0 && oldact)
        *oldact = previous;
    errno = saved_errno;
    return r;
}

RS_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *oldact)
{
    return install(sig, act, oldact);
}

RS_EXPORT int __sigaction(int sig, const struct sigaction *act, struct sigaction *oldact)
{
    return install(sig, act, oldact);
}

/* ---- the simplified interfaces ---- */

/* Signals siginterrupt(sig, 1) made interrupting for later signal() calls: bit sig-1 (glibc's _sigintr). */
static unsigned long long interrupting_signals;

static bool valid_signal(int sig) { return sig >= 1 && sig < _NSIG && sig - 1 < 64; }

static sighandler_t install_simple(int sig, sighandler_t handler, int flags, bool mask_itself)
{
    if (handler == SIG_ERR || !valid_signal(sig)) {
        errno = EINVAL;
        return SIG_ERR;
    }
    struct sigaction act, old;
    memset(&act, 0, sizeof(act));
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    if (mask_itself)
        sigaddset(&act.sa_mask, sig);
    act.sa_flags = flags;
    if (install(sig, &act, &old) < 0)
        return SIG_ERR;
    return old.sa_handler;
}

/* BSD semantics, as glibc's signal(): the handler's own signal is blocked while it runs, and calls restart. */
static sighandler_t bsd_semantics(int sig, sighandler_t handler)
{
    bool interrupting = valid_signal(sig) &&
                        (__atomic_load_n(&interrupting_signals, __ATOMIC_RELAXED) >> (sig - 1)) & 1;
    return install_simple(sig, handler, interrupting ? 0 : SA_RESTART, true);
}

RS_EXPORT sighandler_t signal(int sig, sighandler_t handler) { return bsd_semantics(sig, handler); }
RS_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler) { return bsd_semantics(sig, handler); }
RS_EXPORT sighandler_t ssignal(int sig, sighandler_t handler) { return bsd_semantics(sig, handler); }

/* System V semantics: one-shot, not blocked while running, no restart. SA_INTERRUPT is passed as glibc does
 * (a historical no-op), so the kernel holds exactly the flags it holds without rdmasock. */
static sighandler_t sysv_semantics(int sig, sighandler_t handler)
{
    return install_simple(sig, handler, SA_RESETHAND | SA_NODEFER | SA_INTERRUPT, false);
}

RS_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler) { return sysv_semantics(sig, handler); }
RS_EXPORT sighandler_t __sysv_signal(int sig, sighandler_t handler) { return sysv_semantics(sig, handler); }

RS_EXPORT int siginterrupt(int sig, int interrupt)
{
    struct sigaction act;
    if (install(sig, NULL, &act) < 0)
        return -1;
    if (valid_signal(sig)) {
        unsigned long long bit = 1ull << (sig - 1);
        if (interrupt)
            __atomic_or_fetch(&interrupting_signals, bit, __ATOMIC_RELAXED);
        else
            __atomic_and_fetch(&interrupting_signals, ~bit, __ATOMIC_RELAXED);
    }
    if (interrupt)
        act.sa_flags &= ~SA_RESTART;
    else
        act.sa_flags |= SA_RESTART;
    return install(sig, &act, NULL) < 0 ? -1 : 0;
}

/* System V sigset: SIG_HOLD blocks the signal; anything else installs it (no flags) and unblocks it. */
RS_EXPORT sighandler_t sigset(int sig, sighandler_t disp)
{
    sigset_t set, old;
    sigemptyset(&set);
    if (sigaddset(&set, sig) < 0)
        return SIG_ERR;
    if (disp == SIG_HOLD) {
        if (pthread_sigmask(SIG_BLOCK, &set, &old) != 0)
            return SIG_ERR;
        if (sigismember(&old, sig))
            return SIG_HOLD;
        struct sigaction cur;
        if (install(sig, NULL, &cur) < 0)
            return SIG_ERR;
        return cur.sa_handler;
    }
    struct sigaction act, prev;
    memset(&act, 0, sizeof(act));
    act.sa_handler = disp;
    sigemptyset(&act.sa_mask);
    if (install(sig, &act, &prev) < 0)
        return SIG_ERR;
    if (pthread_sigmask(SIG_UNBLOCK, &set, &old) != 0)
        return SIG_ERR;
    return sigismember(&old, sig) ? SIG_HOLD : prev.sa_handler;
}
