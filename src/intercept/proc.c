/*
 * proc.c: fork and exec as rdmasock sees them (docs/interception-proc.md).
 *
 * Fork. The work is done by pthread_atfork handlers, registered once: from the library constructor, and again
 * (idempotently) from the fork, vfork and daemon interposers in case a fork comes before the constructor ran
 * (another library's constructor). Handlers, rather than code around the interposed fork, because glibc also
 * forks internally through __fork (forkpty, and daemon in programs that reach glibc's own daemon), which no
 * interposer sees but which runs the atfork handlers like any fork. Order: prepare takes the signal installation
 * lock (with every signal blocked in the forking thread), closes the memory-hook gate, then asks the socket layer
 * to prepare; parent and child undo that in the opposite order.
 *
 * vfork runs as fork. A vfork child borrows the parent's memory and stack until it execs or exits, and until then
 * it runs the application's code, which reaches rdmasock's interposers: a close() or dup2() of a converted socket,
 * or the execve hook, would change the PARENT's socket state, fd table and statistics area in place, with no
 * fork handler having run. An interposer cannot even wrap the real vfork: returning from the wrapper in the child
 * would unwind the stack frame the suspended parent is about to return through. fork gives the child its own
 * copy; the cost is copying page tables, which vfork exists to avoid, and nothing else changes for a program that
 * uses vfork correctly (exec or _exit only).
 *
 * daemon is reimplemented (fork, setsid, chdir, /dev/null on 0-2) rather than passed to glibc, whose version
 * redirects the standard fds with its internal __dup2: had one of them been an intercepted socket, the fd table
 * would still call it a socket. Here the redirection goes through the interposed dup2, and the parent closes its
 * statistics area before its _exit (which skips the atexit handler that normally does it).
 *
 * Exec. glibc 2.36 implements execv, execl and execle on its internal __execve, execvp, execlp and execvpe on
 * __execvpe, fexecve on the execveat system call (then __execve of /proc/self/fd/N), and execveat as the system
 * call: none of them goes through the interposable execve, so each is interposed. All call rs_isock_before_exec
 * first and, when the exec returns (it failed), rs_isock_exec_failed, with errno preserved. The variadic ones
 * build their argv on the stack, as glibc does: an exec may run in a vfork-like child or a signal handler, where
 * malloc is not safe.
 *
 * Not interposed: posix_spawn, posix_spawnp, system and popen (glibc runs them on clone(CLONE_VM | CLONE_VFORK)
 * and execs from glibc code only, with handlers reset to SIG_DFL: no rdmasock code runs in that child, and the new
 * image has a new pid, so the parent's statistics area stays the parent's); _Fork (no fork handlers by design, for
 * async-signal-safe use before an exec) and clone, and the raw fork/vfork/clone3 system calls.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <paths.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/stats.h"
#include "intercept/isock.h"
#include "intercept/libc.h"
#include "intercept/signals.h"

/* memhooks.c (no header of its own) */
void rs_memhooks_fork_prepare(void);
void rs_memhooks_fork_parent(void);
void rs_memhooks_fork_child(void);

/* ---- fork handlers ---- */

static void fork_prepare(void)
{
    rs_signals_fork_prepare();
    rs_memhooks_fork_prepare();
    rs_isock_fork_prepare();
}

static void fork_parent(void)
{
    rs_isock_fork_parent();
    rs_memhooks_fork_parent();
    rs_signals_fork_done();
}

static void fork_child(void)
{
    rs_isock_fork_child();
    rs_memhooks_fork_child();
    rs_signals_fork_done();
}

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
typedef int (*execvpe_fn)(const char *, char *const[], char *const[]);
static execvpe_fn real_execvpe;

static void setup(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    /* Resolved now rather than at the exec: a child forked from a threaded parent must not run dlsym, which
     * takes the loader's lock another parent thread may have held at the fork. */
    real_execvpe = (execvpe_fn)dlsym(RTLD_NEXT, "execvpe");
}

static void ensure_setup(void) { pthread_once(&setup_once, setup); }

__attribute__((constructor)) static void proc_init(void) { ensure_setup(); }

static pid_t do_fork(void)
{
    ensure_setup();
    pid_t (*real)(void) = RS_REAL(fork);
    if (!real) {
        errno = ENOSYS;         /* only while dlsym itself is running on this thread */
        return -1;
    }
    pid_t pid = real();
    if (pid > 0) {
        /* Before the application can close anything: the child holds every connection it inherited. */
        int saved_errno = errno;
        rs_isock_fork_returned(pid);
        errno = saved_errno;
    }
    return pid;
}

RS_EXPORT pid_t fork(void) { return do_fork(); }

/* _exit skips atexit, where exit() lets rdmasock finish what the kernel would finish for TCP: data written and
 * closed but not yet delivered (forked children commonly leave with _exit). */
RS_EXPORT void _exit(int status)
{
    rs_isock_before_exit();
    for (;;)
        syscall(SYS_exit_group, status);
}

RS_EXPORT void _Exit(int status)
{
    rs_isock_before_exit();
    for (;;)
        syscall(SYS_exit_group, status);
}

RS_EXPORT pid_t vfork(void) { return do_fork(); }

RS_EXPORT int daemon(int nochdir, int noclose)
{
    pid_t pid = do_fork();
    if (pid < 0)
        return -1;
    if (pid > 0) {
        rs_stats_close();
        _exit(0);
    }
    if (setsid() < 0)
        return -1;
    if (!nochdir)
        (void)chdir("/");
    if (noclose)
        return 0;
    int fd = open(_PATH_DEVNULL, O_RDWR);
    if (fd < 0)
        return -1;
    struct stat st;
    int stat_result = fstat(fd, &st);
    int stat_errno = errno;
    if (stat_result != 0 || !S_ISCHR(st.st_mode) || st.st_rdev != makedev(1, 3)) {
        /* Not the null device (a broken chroot): redirecting there could send output anywhere. */
        RS_REAL(close)(fd);
        errno = stat_result != 0 ? stat_errno : ENODEV;
        return -1;
    }
    /* The interposed dup2 and close, so the fd table forgets whatever 0-2 were. */
    (void)dup2(fd, STDIN_FILENO);
    (void)dup2(fd, STDOUT_FILENO);
    (void)dup2(fd, STDERR_FILENO);
    if (fd > STDERR_FILENO)
        (void)close(fd);
    return 0;
}

/* ---- exec ---- */

/* Reached only when the exec returned, i.e. failed. */
static int exec_returned(int result)
{
    int saved_errno = errno;
    rs_isock_exec_failed();
    errno = saved_errno;
    return result;
}

static int exec_with_env(const char *path, char *const argv[], char *const envp[])
{
    rs_isock_before_exec();
    return exec_returned(RS_REAL(execve)(path, argv, envp));
}

static int exec_searching_path(const char *file, char *const argv[], char *const envp[])
{
    ensure_setup();
    execvpe_fn real = real_execvpe;
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    rs_isock_before_exec();
    return exec_returned(real(file, argv, envp));
}

RS_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    return exec_with_env(path, argv, envp);
}

RS_EXPORT int execv(const char *path, char *const argv[]) { return exec_with_env(path, argv, environ); }

RS_EXPORT int execvp(const char *file, char *const argv[]) { return exec_searching_path(file, argv, environ); }

RS_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    return exec_searching_path(file, argv, envp);
}

RS_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags)
{
    rs_isock_before_exec();
    return exec_returned(RS_REAL(execveat)(dirfd, path, argv, envp, flags));
}

RS_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    rs_isock_before_exec();
    return exec_returned(RS_REAL(fexecve)(fd, argv, envp));
}

/* Arguments after `first` up to the terminating NULL, plus one for `first`; -1 beyond INT_MAX (E2BIG). */
static ptrdiff_t count_list(va_list *ap)
{
    ptrdiff_t argc = 1;
    while (va_arg(*ap, const char *) != NULL) {
        if (argc == INT_MAX)
            return -1;
        argc++;
    }
    return argc;
}

/* argv[0..argc]: `first`, the listed arguments and their terminating NULL. */
static void fill_argv(char **argv, const char *first, ptrdiff_t argc, va_list *ap)
{
    argv[0] = (char *)first;
    for (ptrdiff_t i = 1; i <= argc; i++)
        argv[i] = va_arg(*ap, char *);
}

/* The variadic forms keep argv on the stack (a variable-length array, as glibc does). */
RS_EXPORT int execl(const char *path, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    ptrdiff_t argc = count_list(&ap);
    va_end(ap);
    if (argc < 0) {
        errno = E2BIG;
        return -1;
    }
    char *argv[argc + 1];
    va_start(ap, arg);
    fill_argv(argv, arg, argc, &ap);
    va_end(ap);
    return exec_with_env(path, argv, environ);
}

RS_EXPORT int execle(const char *path, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    ptrdiff_t argc = count_list(&ap);
    va_end(ap);
    if (argc < 0) {
        errno = E2BIG;
        return -1;
    }
    char *argv[argc + 1];
    va_start(ap, arg);
    fill_argv(argv, arg, argc, &ap);
    char *const *envp = va_arg(ap, char *const *);     /* the argument after the terminating NULL */
    va_end(ap);
    return exec_with_env(path, argv, envp);
}

RS_EXPORT int execlp(const char *file, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    ptrdiff_t argc = count_list(&ap);
    va_end(ap);
    if (argc < 0) {
        errno = E2BIG;
        return -1;
    }
    char *argv[argc + 1];
    va_start(ap, arg);
    fill_argv(argv, arg, argc, &ap);
    va_end(ap);
    return exec_searching_path(file, argv, environ);
}
