/*
 * test_intercept_signals: the signal interposers of src/intercept/signals.c, linked into this binary from the
 * static library (so every sigaction/signal call below reaches them, as in a preloaded program).
 *
 * Two things are checked. Transparency: what the application reads back (oldact, signal()'s and sigset()'s
 * return values) is what it set, the kernel holds the application's flags and mask unchanged (read with the real
 * sigaction), and SA_SIGINFO, SA_RESETHAND and SA_NODEFER behave as without rdmasock. Marks: after a handler ran,
 * rs_signal_restart_allowed says whether the kernel would have restarted a socket call, per thread.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "intercept/libc.h"
#include "intercept/signals.h"

/* glibc exports it; its headers declare it for X/Open before 2008 only. */
sighandler_t bsd_signal(int sig, sighandler_t handler);

/* ---- handlers and what they saw ---- */

static volatile sig_atomic_t plain_calls;
static volatile sig_atomic_t plain_last_sig;
static volatile sig_atomic_t other_calls;
static volatile sig_atomic_t errno_seen;
static volatile sig_atomic_t own_signal_blocked;     /* was the signal in the mask while its handler ran */
static volatile sig_atomic_t depth, max_depth, raised_inside;

static void plain_handler(int sig)
{
    plain_calls++;
    plain_last_sig = sig;
}

static void other_handler(int sig)
{
    (void)sig;
    other_calls++;
}

static void errno_handler(int sig)
{
    (void)sig;
    errno_seen = errno;
    plain_calls++;
}

static void mask_probe_handler(int sig)
{
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    own_signal_blocked = sigismember(&cur, sig);
    depth++;
    if (depth > max_depth)
        max_depth = depth;
    if (!raised_inside) {
        raised_inside = 1;
        raise(sig);     /* with SA_NODEFER this nests at once; without, it runs after we return */
    }
    depth--;
    plain_calls++;
}

static struct {
    int sig, signo, code, value;
    pid_t pid;
    bool had_uc;
} info_seen;

static void info_handler(int sig, siginfo_t *si, void *ucv)
{
    ucontext_t *uc = ucv;
    info_seen.sig = sig;
    info_seen.signo = si->si_signo;
    info_seen.code = si->si_code;
    info_seen.value = si->si_value.sival_int;
    info_seen.pid = si->si_pid;
    info_seen.had_uc = uc != NULL;
    /* The mask restored on return comes from this ucontext: changing it proves it is the kernel's frame. */
    if (uc)
        sigaddset(&uc->uc_sigmask, SIGUSR2);
}

/* ---- helpers ---- */

/* siginterrupt and sigset are deprecated in glibc's headers; testing them is the point. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static int reset_signals(void **state)
{
    (void)state;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGUSR1, &dfl, NULL);
    sigaction(SIGUSR2, &dfl, NULL);
    siginterrupt(SIGUSR1, 0);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    plain_calls = other_calls = 0;
    plain_last_sig = 0;
    depth = max_depth = raised_inside = 0;
    memset(&info_seen, 0, sizeof(info_seen));
    return 0;
}

/* What the kernel holds, read past the interposer. */
static struct sigaction kernel_action(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    assert_int_equal(RS_REAL(sigaction)(sig, NULL, &sa), 0);
    return sa;
}

static void assert_same_mask(const sigset_t *a, const sigset_t *b)
{
    for (int sig = 1; sig < _NSIG; sig++)
        assert_int_equal(sigismember(a, sig), sigismember(b, sig));
}

static void install(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = flags;
    assert_int_equal(sigaction(sig, &sa, NULL), 0);
}

/* ---- transparency ---- */

static void test_oldact_round_trip(void **state)
{
    (void)state;
    struct sigaction sa, got, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = plain_handler;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    sigaddset(&sa.sa_mask, SIGTERM);
    sa.sa_flags = SA_RESTART | SA_ONSTACK;
    assert_int_equal(sigaction(SIGUSR1, &sa, NULL), 0);

    memset(&got, 0, sizeof(got));
    assert_int_equal(sigaction(SIGUSR1, NULL, &got), 0);
    struct sigaction kernel = kernel_action(SIGUSR1);
    assert_ptr_equal(got.sa_handler, plain_handler);
    assert_ptr_not_equal(kernel.sa_handler, plain_handler);     /* a trampoline is what the kernel calls */
    assert_int_equal(got.sa_flags, kernel.sa_flags);            /* flags exactly as the kernel keeps them */
    assert_int_equal(got.sa_flags & (SA_RESTART | SA_ONSTACK | SA_SIGINFO | SA_RESETHAND | SA_NODEFER),
                     SA_RESTART | SA_ONSTACK);
    assert_same_mask(&got.sa_mask, &kernel.sa_mask);
    assert_int_equal(sigismember(&got.sa_mask, SIGUSR2), 1);
    assert_int_equal(sigismember(&got.sa_mask, SIGTERM), 1);
    assert_int_equal(sigismember(&got.sa_mask, SIGINT), 0);

    /* Replacing returns the previous handler with its flags. */
    struct sigaction next, prev;
    memset(&next, 0, sizeof(next));
    next.sa_handler = other_handler;
    sigemptyset(&next.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &next, &prev), 0);
    assert_ptr_equal(prev.sa_handler, plain_handler);
    assert_int_equal(prev.sa_flags & SA_RESTART, SA_RESTART);
    assert_same_mask(&prev.sa_mask, &kernel.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, NULL, &old), 0);
    assert_ptr_equal(old.sa_handler, other_handler);
    assert_int_equal(old.sa_flags & SA_RESTART, 0);

    raise(SIGUSR1);
    assert_int_equal(other_calls, 1);
    assert_int_equal(plain_calls, 0);
}

static void test_ign_dfl_untouched(void **state)
{
    (void)state;
    install(SIGUSR1, plain_handler, SA_RESTART);
    struct sigaction ign, old;
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &ign, &old), 0);
    assert_ptr_equal(old.sa_handler, plain_handler);
    assert_ptr_equal(kernel_action(SIGUSR1).sa_handler, SIG_IGN);
    raise(SIGUSR1);                         /* ignored: nothing runs, nothing dies */
    assert_int_equal(plain_calls, 0);

    ign.sa_handler = SIG_DFL;
    assert_int_equal(sigaction(SIGUSR1, &ign, &old), 0);
    assert_ptr_equal(old.sa_handler, SIG_IGN);
    assert_ptr_equal(kernel_action(SIGUSR1).sa_handler, SIG_DFL);
}

static void test_siginfo_arguments(void **state)
{
    (void)state;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = info_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    assert_int_equal(sigaction(SIGUSR1, &sa, NULL), 0);

    struct sigaction got;
    assert_int_equal(sigaction(SIGUSR1, NULL, &got), 0);
    assert_ptr_equal(got.sa_sigaction, info_handler);
    assert_true(got.sa_flags & SA_SIGINFO);

    union sigval value = {.sival_int = 4242};
    assert_int_equal(pthread_sigqueue(pthread_self(), SIGUSR1, value), 0);
    assert_int_equal(info_seen.sig, SIGUSR1);
    assert_int_equal(info_seen.signo, SIGUSR1);
    assert_int_equal(info_seen.code, SI_QUEUE);
    assert_int_equal(info_seen.value, 4242);
    assert_int_equal(info_seen.pid, getpid());
    assert_true(info_seen.had_uc);

    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    assert_int_equal(sigismember(&now, SIGUSR2), 1);    /* the handler's change to uc_sigmask took effect */
}

static void test_switch_convention(void **state)
{
    (void)state;
    install(SIGUSR1, plain_handler, SA_RESTART);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = info_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
    assert_ptr_equal(old.sa_handler, plain_handler);
    assert_false(old.sa_flags & SA_SIGINFO);
    raise(SIGUSR1);
    assert_int_equal(info_seen.signo, SIGUSR1);
    assert_int_equal(plain_calls, 0);

    /* And back: the plain handler's slot was not disturbed by the SA_SIGINFO one. */
    install(SIGUSR1, plain_handler, 0);
    raise(SIGUSR1);
    assert_int_equal(plain_calls, 1);
    assert_int_equal(plain_last_sig, SIGUSR1);
}

static void test_resethand(void **state)
{
    (void)state;
    install(SIGUSR1, plain_handler, SA_RESETHAND);
    raise(SIGUSR1);
    assert_int_equal(plain_calls, 1);
    struct sigaction got;
    assert_int_equal(sigaction(SIGUSR1, NULL, &got), 0);
    assert_ptr_equal(got.sa_handler, SIG_DFL);
    assert_ptr_equal(kernel_action(SIGUSR1).sa_handler, SIG_DFL);
}

static void test_nodefer(void **state)
{
    (void)state;
    install(SIGUSR1, mask_probe_handler, SA_NODEFER);
    raise(SIGUSR1);
    assert_int_equal(own_signal_blocked, 0);
    assert_int_equal(max_depth, 2);         /* the raise inside the handler nested */
    assert_int_equal(plain_calls, 2);

    depth = max_depth = raised_inside = 0;
    plain_calls = 0;
    install(SIGUSR1, mask_probe_handler, 0);
    raise(SIGUSR1);
    assert_int_equal(own_signal_blocked, 1);
    assert_int_equal(max_depth, 1);         /* deferred until the first handler returned */
    assert_int_equal(plain_calls, 2);
}

static void test_errno_preserved(void **state)
{
    (void)state;
    install(SIGUSR1, errno_handler, SA_RESTART);
    errno = 77;
    raise(SIGUSR1);
    int after = errno;
    assert_int_equal(plain_calls, 1);
    assert_int_equal(errno_seen, 77);       /* the trampoline did not touch errno before the handler */
    assert_int_equal(after, 77);            /* nor after it */
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = plain_handler;
    errno = 0;
    assert_int_equal(sigaction(SIGKILL, &sa, NULL), -1);
    assert_int_equal(errno, EINVAL);
    assert_ptr_equal(kernel_action(SIGKILL).sa_handler, SIG_DFL);
    errno = 0;
    assert_int_equal(sigaction(_NSIG, &sa, NULL), -1);
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_ptr_equal(signal(0, plain_handler), SIG_ERR);
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_ptr_equal(signal(SIGUSR1, SIG_ERR), SIG_ERR);
    assert_int_equal(errno, EINVAL);
}

/* ---- signal, siginterrupt, sysv_signal, sigset ---- */

static void test_signal_is_restartable(void **state)
{
    (void)state;
    assert_ptr_equal(signal(SIGUSR1, plain_handler), SIG_DFL);
    struct sigaction kernel = kernel_action(SIGUSR1);
    assert_true(kernel.sa_flags & SA_RESTART);
    assert_false(kernel.sa_flags & (SA_RESETHAND | SA_NODEFER | SA_SIGINFO));
    assert_int_equal(sigismember(&kernel.sa_mask, SIGUSR1), 1);      /* BSD: blocked while it runs */
    assert_ptr_equal(signal(SIGUSR1, other_handler), plain_handler);
    assert_ptr_equal(bsd_signal(SIGUSR1, plain_handler), other_handler);

    struct rs_signal_mark mark;
    rs_signal_mark(&mark);
    raise(SIGUSR1);
    assert_int_equal(plain_calls, 1);
    assert_true(rs_signal_handled_since(&mark));
    assert_true(rs_signal_restart_allowed(&mark));
}

static void test_siginterrupt(void **state)
{
    (void)state;
    signal(SIGUSR1, plain_handler);
    assert_int_equal(siginterrupt(SIGUSR1, 1), 0);
    assert_false(kernel_action(SIGUSR1).sa_flags & SA_RESTART);
    struct sigaction got;
    assert_int_equal(sigaction(SIGUSR1, NULL, &got), 0);
    assert_ptr_equal(got.sa_handler, plain_handler);

    struct rs_signal_mark mark;
    rs_signal_mark(&mark);
    raise(SIGUSR1);
    assert_int_equal(plain_calls, 1);
    assert_false(rs_signal_restart_allowed(&mark));

    /* BSD semantics: later signal() calls for that signal stay interrupting until siginterrupt(sig, 0). */
    assert_ptr_equal(signal(SIGUSR1, other_handler), plain_handler);
    assert_false(kernel_action(SIGUSR1).sa_flags & SA_RESTART);
    assert_int_equal(siginterrupt(SIGUSR1, 0), 0);
    assert_true(kernel_action(SIGUSR1).sa_flags & SA_RESTART);
    rs_signal_mark(&mark);
    raise(SIGUSR1);
    assert_int_equal(other_calls, 1);
    assert_true(rs_signal_restart_allowed(&mark));
    signal(SIGUSR1, plain_handler);
    assert_true(kernel_action(SIGUSR1).sa_flags & SA_RESTART);

    assert_int_equal(siginterrupt(SIGKILL + 1000, 1), -1);
}

static void test_sysv_signal(void **state)
{
    (void)state;
    assert_ptr_equal(sysv_signal(SIGUSR1, plain_handler), SIG_DFL);
    struct sigaction kernel = kernel_action(SIGUSR1);
    assert_false(kernel.sa_flags & SA_RESTART);
    assert_true(kernel.sa_flags & SA_RESETHAND);
    assert_true(kernel.sa_flags & SA_NODEFER);
    struct rs_signal_mark mark;
    rs_signal_mark(&mark);
    raise(SIGUSR1);
    assert_int_equal(plain_calls, 1);
    assert_false(rs_signal_restart_allowed(&mark));
    assert_ptr_equal(kernel_action(SIGUSR1).sa_handler, SIG_DFL);   /* one-shot */
    assert_ptr_equal(__sysv_signal(SIGUSR1, other_handler), SIG_DFL);
}

static void test_sigset(void **state)
{
    (void)state;
    assert_ptr_equal(sigset(SIGUSR1, plain_handler), SIG_DFL);
    assert_false(kernel_action(SIGUSR1).sa_flags & SA_RESTART);     /* System V: no flags */
    assert_ptr_equal(sigset(SIGUSR1, other_handler), plain_handler);
    assert_ptr_equal(sigset(SIGUSR1, SIG_HOLD), other_handler);     /* was not blocked: the handler */
    assert_ptr_equal(sigset(SIGUSR1, SIG_HOLD), SIG_HOLD);          /* now it is */
    raise(SIGUSR1);
    assert_int_equal(other_calls, 0);                               /* held */
    assert_ptr_equal(sigset(SIGUSR1, plain_handler), SIG_HOLD);     /* installs and releases it */
    assert_int_equal(plain_calls, 1);                               /* the held one, to the new handler */
}

/* ---- marks ---- */

static void test_marks_one_thread(void **state)
{
    (void)state;
    struct rs_signal_mark mark;
    install(SIGUSR1, plain_handler, SA_RESTART);
    install(SIGUSR2, other_handler, 0);

    rs_signal_mark(&mark);
    assert_false(rs_signal_handled_since(&mark));
    assert_true(rs_signal_restart_allowed(&mark));      /* nothing ran: nothing forbids restarting */

    raise(SIGUSR1);
    assert_true(rs_signal_handled_since(&mark));
    assert_true(rs_signal_restart_allowed(&mark));

    rs_signal_mark(&mark);
    raise(SIGUSR2);
    assert_false(rs_signal_restart_allowed(&mark));

    rs_signal_mark(&mark);
    raise(SIGUSR1);
    raise(SIGUSR2);
    raise(SIGUSR1);
    assert_false(rs_signal_restart_allowed(&mark));     /* one non-restartable handler is enough */

    rs_signal_mark(&mark);
    assert_true(rs_signal_restart_allowed(&mark));
    assert_int_equal(plain_calls, 3);
    assert_int_equal(other_calls, 2);
}

struct waiter {
    pthread_t thread;
    int pipe_fds[2];
    int started, done;         /* atomic */
    int poll_result, poll_errno;
    bool restart_allowed, handled;
};

/* A thread blocked in poll, as rdmasock's blocking calls are. */
static void *poll_waiter(void *arg)
{
    struct waiter *w = arg;
    struct rs_signal_mark mark;
    rs_signal_mark(&mark);
    struct pollfd pfd = {.fd = w->pipe_fds[0], .events = POLLIN};
    __atomic_store_n(&w->started, 1, __ATOMIC_RELEASE);
    w->poll_result = poll(&pfd, 1, 10000);
    w->poll_errno = errno;
    w->restart_allowed = rs_signal_restart_allowed(&mark);
    w->handled = rs_signal_handled_since(&mark);
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void run_interrupted_poll(int flags, bool expect_restart)
{
    install(SIGUSR1, plain_handler, flags);
    struct waiter w;
    memset(&w, 0, sizeof(w));
    assert_int_equal(pipe(w.pipe_fds), 0);
    assert_int_equal(pthread_create(&w.thread, NULL, poll_waiter, &w), 0);
    while (!__atomic_load_n(&w.started, __ATOMIC_ACQUIRE))
        sched_yield();
    struct rs_signal_mark main_mark;
    rs_signal_mark(&main_mark);
    /* The waiter may not be asleep yet when the first signal comes: repeat until its poll returns. */
    for (int i = 0; i < 100 && !__atomic_load_n(&w.done, __ATOMIC_ACQUIRE); i++) {
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
        pthread_kill(w.thread, SIGUSR1);
    }
    assert_int_equal(pthread_join(w.thread, NULL), 0);
    close(w.pipe_fds[0]);
    close(w.pipe_fds[1]);
    assert_int_equal(w.poll_result, -1);
    assert_int_equal(w.poll_errno, EINTR);      /* poll is never restarted: that is why the marks exist */
    assert_true(w.handled);
    assert_int_equal(w.restart_allowed, expect_restart);
    /* The handler ran on the waiter, not here. */
    assert_false(rs_signal_handled_since(&main_mark));
    assert_true(rs_signal_restart_allowed(&main_mark));
}

static void test_interrupted_poll_restartable(void **state)
{
    (void)state;
    run_interrupted_poll(SA_RESTART, true);
}

static void test_interrupted_poll_not_restartable(void **state)
{
    (void)state;
    run_interrupted_poll(0, false);
}

/* ---- fork ---- */

/*
 * A library whose fork handlers were registered before rdmasock's (this constructor runs before the library's):
 * its prepare handler runs after rdmasock's and its child handler before, i.e. while rdmasock holds its locks for
 * the fork. Installing a handler and unmapping memory there must not deadlock.
 */
static void *early_page;
static volatile sig_atomic_t early_child_ran;

static void early_prepare(void)
{
    early_page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

static void early_parent(void)
{
    if (early_page != MAP_FAILED)
        munmap(early_page, 4096);
}

static void early_child(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = other_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR2, &sa, NULL) == 0 && (early_page == MAP_FAILED || munmap(early_page, 4096) == 0))
        early_child_ran = 1;
}

__attribute__((constructor(101))) static void register_early_handlers(void)
{
    pthread_atfork(early_prepare, early_parent, early_child);
}

/* Also: the fork handlers of a library registered before rdmasock ran (see early_child) in the child. */
static void test_fork_child_keeps_handlers(void **state)
{
    (void)state;
    install(SIGUSR1, plain_handler, 0);
    alarm(30);          /* a lock held across the fork would hang the parent's handlers too: die instead */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The installation lock was released in the child, and the handler runs behind its trampoline. */
        struct rs_signal_mark mark;
        rs_signal_mark(&mark);
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = other_handler;
        sa.sa_flags = SA_RESTART;
        if (sigaction(SIGUSR2, &sa, NULL) != 0)
            _exit(2);
        raise(SIGUSR1);
        raise(SIGUSR2);
        struct sigaction got;
        sigaction(SIGUSR1, NULL, &got);
        int ok = plain_calls == 1 && other_calls == 1 && !rs_signal_restart_allowed(&mark) &&
                 got.sa_handler == plain_handler && early_child_ran;
        _exit(ok ? 0 : 1);
    }
    /* A deadlocked child (a lock held across the fork) must fail the test, not hang it. */
    int status = 0;
    pid_t done = 0;
    for (int waited_ms = 0; waited_ms < 10000 && done == 0; waited_ms += 10) {
        done = waitpid(pid, &status, WNOHANG);
        if (done == 0) {
            struct timespec pause = {0, 10 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
    }
    alarm(0);
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the child did not finish within 10 s (deadlocked in a fork handler?)");
    }
    assert_int_equal(done, pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_oldact_round_trip, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_ign_dfl_untouched, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_siginfo_arguments, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_switch_convention, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_resethand, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_nodefer, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_errno_preserved, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_invalid_arguments, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_signal_is_restartable, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_siginterrupt, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_sysv_signal, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_sigset, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_marks_one_thread, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_interrupted_poll_restartable, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_interrupted_poll_not_restartable, reset_signals, reset_signals),
        cmocka_unit_test_setup_teardown(test_fork_child_keeps_handlers, reset_signals, reset_signals),
    };
    return cmocka_run_group_tests_name("intercept_signals", tests, NULL, NULL);
}
