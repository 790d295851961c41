/*
 * proccheck: what processes and signals do to sockets, checked through whatever socket layer the process has (the
 * kernel, or rdmasock when preloaded). tests/suites/intercept_proc.sh runs every mode twice: on the plain kernel
 * (the control) and under the preload with a rule that puts the ports on SDP over the software RNIC.
 *
 *   proccheck signal recv|accept|recv-timeo restart|interrupt PORT
 *       a thread blocked in recv (or accept) on PORT gets two SIGUSR1 from another thread; the handler was
 *       installed with SA_RESTART (restart) or without (interrupt). Expected as the kernel does it: restart keeps
 *       waiting and then gets the data; interrupt returns EINTR first; recv-timeo (SO_RCVTIMEO set) returns EINTR
 *       even with SA_RESTART.
 *   proccheck prefork PORT CHILDREN CLIENTS BYTES
 *       the parent listens, forks CHILDREN that accept and serve, then runs CLIENTS concurrent clients that check
 *       the data each child sends (pattern and checksum) and that a child, not the parent, served it.
 *       PROCCHECK_PREFORK_SETTLE_MS=N waits N ms between the forks and the first client (diagnostics only).
 *   proccheck exec PORT
 *       with a connected pair (both ends close-on-exec, set two ways) and a listener (inherited), every exec
 *       function runs this program again in a forked child ("exec-child"), which checks its argv, its environment
 *       and which fds survived; then failed execs; the pair must still carry data in the parent after all that
 *       (and, under PROCCHECK_EXPECT=rdma, still be on RDMA: the children never used it).
 *   proccheck daemon PORT STATUS_FILE
 *       listens, calls daemon(0, 0), checks what daemon() promises (new session, cwd /, fds 0-2 on /dev/null),
 *       serves one client on the inherited listener and writes "ok" or the failure into STATUS_FILE (and its pid
 *       into STATUS_FILE.pid).
 *   proccheck client PORT BYTES SEED
 *       one client as in prefork (for the daemon check).
 *   proccheck forkconn PORT CLIENTS BYTES
 *       a fork-per-connection server (socat fork, inetd): the parent accepts, forks a child per connection and
 *       closes its copy at once; the child reads the client's BYTES upload (pattern and checksum) and answers with
 *       BYTES of its own. Odd-numbered connections are served only after their upload arrived at the parent and
 *       the child slept 300 ms, so the connection crosses into the child with unread data.
 *   proccheck shared PORT BYTES
 *       the parent and a forked child both hold one connection: the child reads what the client sent before the
 *       fork, writes and reads a part and exits; then the parent writes and reads the rest. The client checks the
 *       whole stream, the server every part.
 *   proccheck execconn PORT BYTES
 *       a connected socket without close-on-exec crosses an exec of this program ("execconn-image"), which reads
 *       what the client sent before the exec, then more, and answers.
 *
 * In these three the connection must start on RDMA under PROCCHECK_EXPECT=rdma: the accepted socket answers
 * rdmasock's SDP statistics option (and not on the kernel), and no kernel TCP connection uses PORT. After it crossed
 * into another process it goes on over kernel TCP (docs/interception.md, "Processes"), on ports of its own.
 *
 * PROCCHECK_EXPECT=rdma|kernel adds an evidence check to every connection: an established kernel TCP connection
 * with PORT at either end must be absent (rdma: the bytes go through the RNIC, whose own connections use other
 * ports) or present (kernel). Diagnostics go to stderr; the exit status is 0 only when every check passed.
 *
 * The program must not contain rdmasock itself: it is linked with librdmasock.a, which holds no interposer (the
 * Makefile keeps them in librdmasock.so only), so its socket calls reach libc, or the preloaded library.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- reporting ---- */

static bool fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static bool fail(const char *fmt, ...)
{
    int saved_errno = errno;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "proccheck[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (errno %d %s)\n", saved_errno, strerror(saved_errno));
    va_end(ap);
    errno = saved_errno;
    return false;
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "proccheck[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- sockets ---- */

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return fail("socket"), -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 64) != 0) {
        fail("bind/listen 127.0.0.1:%d", port);
        close(fd);
        return -1;
    }
    return fd;
}

/* Connects, retrying for a few seconds while nobody listens yet (a server process still starting). */
static int connect_to(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            return fail("socket"), -1;
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
            return fd;
        int e = errno;
        close(fd);
        if (e != ECONNREFUSED && e != EINTR) {
            errno = e;
            return fail("connect 127.0.0.1:%d", port), -1;
        }
        sleep_ms(50);
    }
    return fail("connect 127.0.0.1:%d: nobody listening after 5 s", port), -1;
}

static bool write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return fail("write fd %d", fd);
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static bool read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0) {
            errno = 0;
            return fail("read fd %d: end of stream with %zu bytes missing", fd, len);
        }
        if (n < 0)
            return fail("read fd %d", fd);
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* ---- evidence ---- */

/* True when /proc/net/tcp{,6} has an established connection with `port` at either end. */
static bool kernel_connection_on(int port)
{
    static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++) {
        FILE *f = fopen(tables[t], "r");
        if (!f)
            continue;
        char line[512];
        bool found = false;
        while (!found && fgets(line, sizeof(line), f)) {
            char local[64], remote[64];
            unsigned state;
            if (sscanf(line, " %*d: %63s %63s %x", local, remote, &state) != 3)
                continue;
            const char *lp = strrchr(local, ':'), *rp = strrchr(remote, ':');
            if (!lp || !rp || state != 1 /* TCP_ESTABLISHED */)
                continue;
            found = strtoul(lp + 1, NULL, 16) == (unsigned long)port || strtoul(rp + 1, NULL, 16) == (unsigned long)port;
        }
        fclose(f);
        if (found)
            return true;
    }
    return false;
}

/* Called while a connection on `port` is open. */
static bool check_path(int port)
{
    const char *expect = getenv("PROCCHECK_EXPECT");
    if (!expect || !*expect)
        return true;
    bool kernel = kernel_connection_on(port);
    if (strcmp(expect, "rdma") == 0 && kernel) {
        errno = 0;
        return fail("evidence: a kernel TCP connection on port %d exists, the data did not go through RDMA", port);
    }
    if (strcmp(expect, "kernel") == 0 && !kernel) {
        errno = 0;
        return fail("evidence: no kernel TCP connection on port %d", port);
    }
    return true;
}

/* ---- checksummed transfers ---- */

static uint64_t next_pattern(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

#define FNV_START 14695981039346656037ull
#define CHUNK 65536

/* Fills buf with the stream of `seed` continuing from *state. */
static void fill_pattern(uint64_t *state, unsigned char *buf, size_t len)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = next_pattern(state);
        memcpy(buf + i, &v, len - i < 8 ? len - i : 8);
    }
}

struct request { uint64_t bytes, seed; };
struct reply_head { uint64_t bytes; int64_t pid; };

/* Server side: one request, then the header, the data and the checksum of the data. */
static bool serve_one(int fd)
{
    struct request req;
    if (!read_all(fd, &req, sizeof(req)))
        return false;
    struct reply_head head = {req.bytes, getpid()};
    if (!write_all(fd, &head, sizeof(head)))
        return false;
    unsigned char *buf = malloc(CHUNK);
    uint64_t state = req.seed | 1, sum = FNV_START;
    bool ok = buf != NULL;
    for (uint64_t sent = 0; ok && sent < req.bytes;) {
        size_t n = req.bytes - sent < CHUNK ? (size_t)(req.bytes - sent) : CHUNK;
        fill_pattern(&state, buf, n);
        sum = fnv1a(sum, buf, n);
        ok = write_all(fd, buf, n);
        sent += n;
    }
    free(buf);
    return ok && write_all(fd, &sum, sizeof(sum));
}

/* Client side: asks for `bytes` of stream `seed`, checks every byte and the checksum; *server_pid: who served. */
static bool fetch(int fd, int port, uint64_t bytes, uint64_t seed, pid_t *server_pid)
{
    struct request req = {bytes, seed};
    struct reply_head head;
    if (!write_all(fd, &req, sizeof(req)) || !read_all(fd, &head, sizeof(head)))
        return false;
    if (head.bytes != bytes) {
        errno = 0;
        return fail("reply announces %llu bytes, asked %llu", (unsigned long long)head.bytes,
                    (unsigned long long)bytes);
    }
    *server_pid = (pid_t)head.pid;
    if (!check_path(port))
        return false;
    unsigned char *got = malloc(CHUNK), *want = malloc(CHUNK);
    uint64_t state = seed | 1, sum = FNV_START, sent_sum = 0;
    bool ok = got && want;
    for (uint64_t done = 0; ok && done < bytes;) {
        size_t n = bytes - done < CHUNK ? (size_t)(bytes - done) : CHUNK;
        ok = read_all(fd, got, n);
        fill_pattern(&state, want, n);
        if (ok && memcmp(got, want, n) != 0) {
            errno = 0;
            ok = fail("data differs within bytes %llu..%llu", (unsigned long long)done,
                      (unsigned long long)(done + n));
        }
        sum = fnv1a(sum, got, n);
        done += n;
    }
    free(got);
    free(want);
    if (ok && !read_all(fd, &sent_sum, sizeof(sent_sum)))
        ok = false;
    if (ok && sent_sum != sum) {
        errno = 0;
        ok = fail("checksum %016llx, the server computed %016llx", (unsigned long long)sum,
                  (unsigned long long)sent_sum);
    }
    return ok;
}

/* ---- signal ---- */

static volatile sig_atomic_t handler_calls;
static volatile sig_atomic_t handler_on_target;
static pthread_t target_thread;

static void count_handler(int sig)
{
    (void)sig;
    handler_calls++;
    if (pthread_equal(pthread_self(), target_thread))
        handler_on_target++;
}

struct blocked_call {
    const char *call;           /* recv | accept */
    int fd;                     /* connection (recv) or listener (accept) */
    int entered;                /* atomic: about to block */
    int first_errno;            /* errno of the first call, 0 when it succeeded */
    int eintr;                  /* EINTR results before success */
    int result_fd;              /* accept: the connection */
    unsigned char data[4096];
    ssize_t got;
};

static void *blocked_thread(void *arg)
{
    struct blocked_call *b = arg;
    __atomic_store_n(&b->entered, 1, __ATOMIC_RELEASE);
    for (bool first = true;; first = false) {
        int r;
        if (strcmp(b->call, "accept") == 0) {
            r = b->result_fd = accept(b->fd, NULL, NULL);
        } else {
            b->got = recv(b->fd, b->data, sizeof(b->data), MSG_WAITALL);
            r = b->got < 0 ? -1 : 0;
        }
        if (first)
            b->first_errno = r < 0 ? errno : 0;
        if (r < 0 && errno == EINTR) {
            b->eintr++;
            continue;
        }
        break;
    }
    return NULL;
}

static int mode_signal(const char *call, const char *disposition, int port)
{
    bool restart = strcmp(disposition, "restart") == 0;
    bool timeo = strcmp(call, "recv-timeo") == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = count_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = restart ? SA_RESTART : 0;
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        return fail("sigaction"), 1;

    int lfd = listen_on(port);
    if (lfd < 0)
        return 1;
    struct blocked_call b;
    memset(&b, 0, sizeof(b));
    b.call = timeo ? "recv" : call;
    b.result_fd = -1;
    int client = -1, server = -1;
    if (strcmp(b.call, "recv") == 0) {
        client = connect_to(port);
        server = client >= 0 ? accept(lfd, NULL, NULL) : -1;
        if (server < 0)
            return fail("accept"), 1;
        if (timeo) {
            struct timeval tv = {30, 0};
            if (setsockopt(server, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0)
                return fail("SO_RCVTIMEO"), 1;
        }
        b.fd = server;
    } else {
        b.fd = lfd;
    }

    if (pthread_create(&target_thread, NULL, blocked_thread, &b) != 0)
        return fail("pthread_create"), 1;
    while (!__atomic_load_n(&b.entered, __ATOMIC_ACQUIRE))
        sleep_ms(1);
    /* Long enough to be asleep in the call; two signals, as a program with a timer would get. */
    sleep_ms(300);
    pthread_kill(target_thread, SIGUSR1);
    sleep_ms(150);
    pthread_kill(target_thread, SIGUSR1);
    sleep_ms(150);

    unsigned char sent[sizeof(b.data)];
    uint64_t state = 0x5eed;
    fill_pattern(&state, sent, sizeof(sent));
    bool ok = true;
    if (strcmp(b.call, "recv") == 0) {
        ok = write_all(client, sent, sizeof(sent));
    } else {
        client = connect_to(port);
        ok = client >= 0;
    }
    pthread_join(target_thread, NULL);

    if (ok && strcmp(b.call, "recv") == 0 && (b.got != (ssize_t)sizeof(sent) || memcmp(b.data, sent, sizeof(sent)))) {
        errno = 0;
        ok = fail("recv got %zd bytes, expected %zu with the pattern", b.got, sizeof(sent));
    }
    if (ok && strcmp(b.call, "accept") == 0 && b.result_fd < 0)
        ok = fail("accept never returned a connection");
    if (handler_on_target != 2) {
        errno = 0;
        ok = fail("the handler ran %d times on the blocked thread (%d in all), expected 2", (int)handler_on_target,
                  (int)handler_calls);
    }
    bool expect_eintr = timeo || !restart;
    if (expect_eintr && b.first_errno != EINTR) {
        errno = b.first_errno;
        ok = fail("%s %s: the first %s did not return EINTR (%d EINTR in all)", call, disposition, b.call, b.eintr);
    }
    if (!expect_eintr && b.eintr != 0) {
        errno = EINTR;
        ok = fail("%s %s: %s returned EINTR %d times, the kernel restarts it", call, disposition, b.call, b.eintr);
    }
    if (ok && !check_path(port))
        ok = false;
    note("signal %s %s: first call errno %d, %d EINTR, handler %d times", call, disposition, b.first_errno, b.eintr,
         (int)handler_on_target);
    return ok ? 0 : 1;
}

/* ---- prefork ---- */

/* A child that crashes says where (its stderr is the check's diagnostics), then dies of the same signal. */
static void crash_report(int sig)
{
    static const char head[] = "proccheck: prefork child crashed; backtrace:\n";
    (void)!write(2, head, sizeof(head) - 1);
    void *frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void report_crashes(void)
{
    static const int sigs[] = { SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL };
    void *warm[1];
    backtrace(warm, 1);     /* loads libgcc now: not in the handler */
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        signal(sigs[i], crash_report);
}

struct client_job {
    int port, index;
    uint64_t bytes;
    pid_t server;
    bool ok;
};

static void *client_thread(void *arg)
{
    struct client_job *job = arg;
    int fd = connect_to(job->port);
    job->ok = fd >= 0 && fetch(fd, job->port, job->bytes, 0x1234567ull * (uint64_t)(job->index + 1), &job->server);
    if (fd >= 0)
        close(fd);
    return NULL;
}

static int mode_prefork(int port, int children, int clients, uint64_t bytes)
{
    if (children < 1 || children > 64 || clients < 1 || clients > 256)
        return fail("bad counts"), 2;
    int lfd = listen_on(port);
    if (lfd < 0)
        return 1;
    pid_t pids[64];
    for (int i = 0; i < children; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            return fail("fork"), 1;
        if (pids[i] == 0) {
            /* A prefork child: accept and serve until the parent ends it with SIGTERM, or dies (a timeout). */
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            report_crashes();
            for (;;) {
                int c = accept(lfd, NULL, NULL);
                if (c < 0 && errno == EINTR)
                    continue;
                if (c < 0) {
                    fail("child accept");
                    _exit(3);
                }
                if (!serve_one(c))
                    _exit(4);
                close(c);
            }
        }
    }

    /* Diagnostic knob, 0 in the suite: the kernel queues connections on a listener from listen() on, so clients
     * start at once; a delay shows whether what fails is that window or the serving itself. */
    const char *settle = getenv("PROCCHECK_PREFORK_SETTLE_MS");
    if (settle)
        sleep_ms(atoi(settle));
    pthread_t threads[256];
    struct client_job jobs[256];
    for (int i = 0; i < clients; i++) {
        jobs[i] = (struct client_job){.port = port, .index = i, .bytes = bytes};
        if (pthread_create(&threads[i], NULL, client_thread, &jobs[i]) != 0)
            return fail("pthread_create"), 1;
    }
    bool ok = true;
    int served_by[64] = {0};
    for (int i = 0; i < clients; i++) {
        pthread_join(threads[i], NULL);
        if (!jobs[i].ok) {
            ok = false;
            continue;
        }
        int which = -1;
        for (int c = 0; c < children; c++)
            if (pids[c] == jobs[i].server)
                which = c;
        if (which < 0) {
            errno = 0;
            ok = fail("client %d was served by pid %d, which is not one of the children", i, (int)jobs[i].server);
        } else {
            served_by[which]++;
        }
    }
    char spread[512] = "";
    size_t used = 0;
    for (int c = 0; c < children && used < sizeof(spread) - 16; c++)
        used += (size_t)snprintf(spread + used, sizeof(spread) - used, "%s%d", c ? " " : "", served_by[c]);
    note("prefork: %d children served %d clients of %llu bytes; per child: %s", children, clients,
         (unsigned long long)bytes, spread);

    for (int i = 0; i < children; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < children; i++) {
        int status = 0;
        if (waitpid(pids[i], &status, 0) != pids[i])
            ok = fail("waitpid");
        else if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)) {
            errno = 0;
            ok = fail("child %d ended with status 0x%x instead of SIGTERM", (int)pids[i], status);
        }
    }
    close(lfd);
    return ok ? 0 : 1;
}

/* ---- exec ---- */

static bool check_started_on(int fd, int port, const char *what);

static const char *const exec_variants[] = {"execve", "execv",   "execl",    "execle",  "execlp",
                                            "execvp", "execvpe", "execveat", "fexecve"};
#define TOKEN_VAR "PROCCHECK_TOKEN"

static char self_path[PATH_MAX];

/* In the forked child: run this program as "exec-child VARIANT CLOEXEC1 CLOEXEC2 INHERITED" with variant. */
static void exec_one(const char *variant, int cloexec_a, int cloexec_b, int inherited)
{
    char a[16], b[16], c[16];
    snprintf(a, sizeof(a), "%d", cloexec_a);
    snprintf(b, sizeof(b), "%d", cloexec_b);
    snprintf(c, sizeof(c), "%d", inherited);
    char token[64];
    snprintf(token, sizeof(token), TOKEN_VAR "=%s", variant);
    char *const argv[] = {"proccheck", "exec-child", (char *)variant, a, b, c, NULL};
    char *const envp[] = {token, NULL};
    /* The variants without an envp argument pass environ: put the token there. The PATH-searching ones find
     * this program by its name in its own directory. */
    setenv(TOKEN_VAR, variant, 1);
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", self_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    setenv("PATH", dir, 1);
    const char *name = strrchr(self_path, '/') ? strrchr(self_path, '/') + 1 : self_path;

    if (strcmp(variant, "execve") == 0)
        execve(self_path, argv, envp);
    else if (strcmp(variant, "execv") == 0)
        execv(self_path, argv);
    else if (strcmp(variant, "execl") == 0)
        execl(self_path, "proccheck", "exec-child", variant, a, b, c, (char *)NULL);
    else if (strcmp(variant, "execle") == 0)
        execle(self_path, "proccheck", "exec-child", variant, a, b, c, (char *)NULL, envp);
    else if (strcmp(variant, "execlp") == 0)
        execlp(name, "proccheck", "exec-child", variant, a, b, c, (char *)NULL);
    else if (strcmp(variant, "execvp") == 0)
        execvp(name, argv);
    else if (strcmp(variant, "execvpe") == 0)
        execvpe(name, argv, envp);
    else if (strcmp(variant, "execveat") == 0)
        execveat(AT_FDCWD, self_path, argv, envp, 0);
    else if (strcmp(variant, "fexecve") == 0) {
        int fd = open(self_path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            fexecve(fd, argv, envp);
    }
    fail("%s returned", variant);
    _exit(10);
}

/* The new image: argv, environment, and which fds crossed the exec. */
static int mode_exec_child(int argc, char **argv)
{
    if (argc != 6) {
        errno = 0;
        return fail("exec-child: %d arguments", argc), 11;
    }
    const char *variant = argv[2];
    bool ok = strcmp(argv[0], "proccheck") == 0;
    if (!ok) {
        errno = 0;
        fail("exec-child (%s): argv[0] is %s", variant, argv[0]);
    }
    const char *token = getenv(TOKEN_VAR);
    if (!token || strcmp(token, variant) != 0) {
        errno = 0;
        ok = fail("exec-child (%s): %s is %s", variant, TOKEN_VAR, token ? token : "unset");
    }
    for (int i = 3; i <= 4; i++) {
        int fd = atoi(argv[i]);
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) {
            errno = 0;
            ok = fail("exec-child (%s): close-on-exec fd %d is still open", variant, fd);
        }
    }
    struct stat st;
    int inherited = atoi(argv[5]);
    if (fstat(inherited, &st) != 0 || !S_ISSOCK(st.st_mode))
        ok = fail("exec-child (%s): inherited fd %d is not a socket", variant, inherited);
    return ok ? 0 : 12;
}

struct serve_job {
    int fd;
    bool ok;
};

static void *serve_thread(void *arg)
{
    struct serve_job *job = arg;
    job->ok = serve_one(job->fd);
    return NULL;
}

/* A checked transfer over the connected pair, b serving and a fetching. A thread, not a child, serves: what a
 * forked child may do with an inherited connection is not what this check is about. */
static bool pair_works(int a, int b, int port, uint64_t seed)
{
    struct serve_job job = {b, false};
    pthread_t thread;
    if (pthread_create(&thread, NULL, serve_thread, &job) != 0)
        return fail("pthread_create");
    pid_t served_by = 0;
    bool ok = fetch(a, port, 256 * 1024, seed, &served_by);
    pthread_join(thread, NULL);
    if (!job.ok) {
        errno = 0;
        ok = fail("pair: serving side failed");
    }
    return ok;
}

static int mode_exec(int port)
{
    int lfd = listen_on(port);
    if (lfd < 0)
        return 1;
    int a = connect_to(port);
    int b = a >= 0 ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
    if (b < 0)
        return fail("connect/accept4"), 1;
    if (fcntl(a, F_SETFD, FD_CLOEXEC) != 0)
        return fail("F_SETFD"), 1;
    bool ok = pair_works(a, b, port, 1);

    for (size_t v = 0; v < sizeof(exec_variants) / sizeof(exec_variants[0]); v++) {
        pid_t pid = fork();
        if (pid < 0)
            return fail("fork"), 1;
        if (pid == 0)
            exec_one(exec_variants[v], a, b, lfd);
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            errno = 0;
            ok = fail("%s: the child ended with status 0x%x", exec_variants[v], status);
        }
    }

    /* Each child inherited the pair and never used it (its copies were close-on-exec): under rdmasock the pair is
     * still the parent's RDMA connection, which a child takes over only when it uses it. */
    if (!check_started_on(a, port, "exec: the pair after the children") ||
        !check_started_on(b, port, "exec: the pair after the children"))
        ok = false;

    /* Failed execs return here with errno set, and nothing of ours is disturbed. */
    char *const argv[] = {"nothing", NULL};
    errno = 0;
    if (execve("/nonexistent/proccheck", argv, environ) != -1 || errno != ENOENT)
        ok = fail("execve of a missing file");
    errno = 0;
    if (execvp("proccheck-no-such-program", argv) != -1 || errno != ENOENT)
        ok = fail("execvp of a missing program");
    errno = 0;
    if (execl("/", "root", (char *)NULL) != -1 || errno != EACCES)
        ok = fail("execl of a directory");
    /* Under rdmasock the statistics area is withdrawn before each exec; the program goes on, so must it. */
    if (getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "rdmasock")) {
        char shm[96];
        snprintf(shm, sizeof(shm), "/dev/shm/rdmasock.%u.%d", (unsigned)geteuid(), (int)getpid());
        if (access(shm, F_OK) != 0)
            ok = fail("statistics area %s is gone after the failed execs", shm);
    }

    if (!pair_works(a, b, port, 2))
        ok = false;
    note("exec: %zu variants checked; the pair carried data before and after", sizeof(exec_variants) / sizeof(exec_variants[0]));
    close(a);
    close(b);
    close(lfd);
    return ok ? 0 : 1;
}

/* ---- daemon ---- */

static int mode_daemon(int port, const char *status_path)
{
    int lfd = listen_on(port);
    if (lfd < 0)
        return 1;
    if (daemon(0, 0) != 0)
        return fail("daemon"), 1;
    /* Only the daemon gets here; stdout and stderr are /dev/null now, so the verdict goes to the file, and its
     * pid next to it (STATUS_FILE.pid) so that the suite can end it by pid if it hangs. */
    char pid_path[PATH_MAX], pid_text[32];
    snprintf(pid_path, sizeof(pid_path), "%s.pid", status_path);
    int pid_fd = open(pid_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (pid_fd >= 0) {
        snprintf(pid_text, sizeof(pid_text), "%d\n", (int)getpid());
        write_all(pid_fd, pid_text, strlen(pid_text));
        close(pid_fd);
    }
    char verdict[512] = "ok";
    struct stat st;
    char cwd[PATH_MAX];
    if (getsid(0) != getpid())
        snprintf(verdict, sizeof(verdict), "not a session leader (sid %d, pid %d)", (int)getsid(0), (int)getpid());
    else if (!getcwd(cwd, sizeof(cwd)) || strcmp(cwd, "/") != 0)
        snprintf(verdict, sizeof(verdict), "cwd is not /");
    for (int fd = 0; fd <= 2 && strcmp(verdict, "ok") == 0; fd++) {
        if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode) || st.st_rdev != makedev(1, 3))
            snprintf(verdict, sizeof(verdict), "fd %d is not /dev/null", fd);
    }
    if (strcmp(verdict, "ok") == 0) {
        struct pollfd pfd = {.fd = lfd, .events = POLLIN};
        int c = -1;
        if (poll(&pfd, 1, 30000) != 1)
            snprintf(verdict, sizeof(verdict), "no client within 30 s (errno %d)", errno);
        else if ((c = accept(lfd, NULL, NULL)) < 0)
            snprintf(verdict, sizeof(verdict), "accept failed (errno %d)", errno);
        else if (!serve_one(c))
            snprintf(verdict, sizeof(verdict), "serving the client failed (errno %d)", errno);
        if (c >= 0)
            close(c);
    }
    int out = open(status_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out >= 0) {
        write_all(out, verdict, strlen(verdict));
        close(out);
    }
    return strcmp(verdict, "ok") == 0 ? 0 : 1;
}

/* ---- connections across fork and exec ---- */

#define RS_SOL_SDP_LEVEL 0x5344         /* rdmasock's option level (src/sdp_stream/sdp.h RS_SOL_SDP) */
#define RS_SDP_STATS_OPT 3              /* RS_SDP_STATS: answered by SDP connections only */

/* True when fd is an rdmasock SDP connection of this process. */
static bool on_sdp(int fd)
{
    unsigned char stats[1024];
    socklen_t len = sizeof(stats);
    return getsockopt(fd, RS_SOL_SDP_LEVEL, RS_SDP_STATS_OPT, stats, &len) == 0;
}

/* The evidence that a connection starts where PROCCHECK_EXPECT says: SDP (rdma) or the kernel. */
static bool check_started_on(int fd, int port, const char *what)
{
    const char *expect = getenv("PROCCHECK_EXPECT");
    if (!expect || !*expect)
        return true;
    bool sdp = on_sdp(fd);
    errno = 0;
    if (strcmp(expect, "rdma") == 0 && !sdp)
        return fail("%s: the connection is not an rdmasock SDP connection", what);
    if (strcmp(expect, "kernel") == 0 && sdp)
        return fail("%s: the connection answers rdmasock's SDP option on the kernel", what);
    return check_path(port);
}

/* Waits until fd has at least `bytes` to read (FIONREAD), at most timeout_ms. */
static bool wait_unread(int fd, int bytes, int timeout_ms)
{
    for (int waited = 0;; waited += 10) {
        int n = 0;
        if (ioctl(fd, FIONREAD, &n) != 0)
            return fail("FIONREAD");
        if (n >= bytes)
            return true;
        if (waited >= timeout_ms) {
            errno = 0;
            return fail("only %d of %d bytes arrived within %d ms", n, bytes, timeout_ms);
        }
        sleep_ms(10);
    }
}

/* Writes `bytes` of stream `seed`; adds them to *sum. */
static bool send_stream(int fd, uint64_t seed, uint64_t bytes, uint64_t *sum)
{
    unsigned char *buf = malloc(CHUNK);
    uint64_t state = seed | 1;
    bool ok = buf != NULL;
    for (uint64_t sent = 0; ok && sent < bytes;) {
        size_t n = bytes - sent < CHUNK ? (size_t)(bytes - sent) : CHUNK;
        fill_pattern(&state, buf, n);
        *sum = fnv1a(*sum, buf, n);
        ok = write_all(fd, buf, n);
        sent += n;
    }
    free(buf);
    return ok;
}

/* Reads `bytes` and checks them against stream `seed`; adds them to *sum. */
static bool recv_stream(int fd, uint64_t seed, uint64_t bytes, uint64_t *sum, const char *what)
{
    unsigned char *got = malloc(CHUNK), *want = malloc(CHUNK);
    uint64_t state = seed | 1;
    bool ok = got && want;
    for (uint64_t done = 0; ok && done < bytes;) {
        size_t n = bytes - done < CHUNK ? (size_t)(bytes - done) : CHUNK;
        ok = read_all(fd, got, n);
        fill_pattern(&state, want, n);
        if (ok && memcmp(got, want, n) != 0) {
            size_t at = 0;
            while (got[at] == want[at])
                at++;
            errno = 0;
            ok = fail("%s: byte %llu of %llu differs", what, (unsigned long long)(done + at),
                      (unsigned long long)bytes);
        }
        if (ok)
            *sum = fnv1a(*sum, got, n);
        done += n;
    }
    free(got);
    free(want);
    return ok;
}

/* Both ends compare their checksums of everything that went one way: the receiver sends its sum, the sender
 * compares. */
static bool sum_matches(int fd, uint64_t mine, const char *what)
{
    uint64_t theirs = 0;
    if (!read_all(fd, &theirs, sizeof(theirs)))
        return false;
    if (theirs != mine) {
        errno = 0;
        return fail("%s: the peer's checksum %016llx, ours %016llx", what, (unsigned long long)theirs,
                    (unsigned long long)mine);
    }
    return true;
}

static bool wait_child(pid_t pid, const char *what)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return fail("waitpid %s", what);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        errno = 0;
        return fail("%s (pid %d) ended with status 0x%x", what, (int)pid, status);
    }
    return true;
}

/* forkconn: the request each client sends first. */
struct fc_request { uint64_t up, down, seed; };
struct fc_reply { int64_t pid; uint64_t up_sum; };

struct fc_client {
    int port, index;
    uint64_t bytes;
    pid_t served_by;
    bool ok;
};

/*
 * Client i connects once client i-1 has its answer header, i.e. once the server forked i-1's child and went back to
 * accept: the transfers overlap, the connects do not meet a fork. (Under rdmasock a fork parks the parent's
 * listener, and a connection that waits in its RDMA accept queue at that moment is reset, where the kernel keeps it
 * in the backlog: a listener matter, docs/interception.md, not what this check is about.)
 */
static pthread_mutex_t fc_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fc_cond = PTHREAD_COND_INITIALIZER;
static int fc_answered;

static void fc_turn_done(void)
{
    pthread_mutex_lock(&fc_lock);
    fc_answered++;
    pthread_cond_broadcast(&fc_cond);
    pthread_mutex_unlock(&fc_lock);
}

static void *fc_client_thread(void *arg)
{
    struct fc_client *c = arg;
    c->ok = false;
    pthread_mutex_lock(&fc_lock);
    while (fc_answered < c->index)
        pthread_cond_wait(&fc_cond, &fc_lock);
    pthread_mutex_unlock(&fc_lock);
    int fd = connect_to(c->port);
    if (fd < 0) {
        fc_turn_done();
        return NULL;
    }
    uint64_t seed = 0xf0c0ull + (uint64_t)c->index * 7919u;
    struct fc_request req = { c->bytes, c->bytes, seed };
    uint64_t up_sum = FNV_START, down_sum = FNV_START;
    struct fc_reply rep;
    char what[64];
    snprintf(what, sizeof(what), "forkconn client %d", c->index);
    /* The whole upload goes out before anything is read: for a slow child it waits in the connection. */
    bool ok = write_all(fd, &req, sizeof(req)) && check_path(c->port) && send_stream(fd, seed, c->bytes, &up_sum) &&
              read_all(fd, &rep, sizeof(rep));
    fc_turn_done();
    if (ok && rep.up_sum != up_sum) {
        errno = 0;
        ok = fail("%s: the server's checksum of the upload %016llx, ours %016llx", what,
                  (unsigned long long)rep.up_sum, (unsigned long long)up_sum);
    }
    ok = ok && recv_stream(fd, ~seed, c->bytes, &down_sum, what) && sum_matches(fd, down_sum, what);
    char end;
    if (ok && read(fd, &end, 1) != 0) {
        errno = 0;
        ok = fail("%s: no end of stream after the answer", what);
    }
    c->served_by = (pid_t)rep.pid;
    close(fd);
    c->ok = ok;
    return NULL;
}

/* The child that serves one forkconn connection. */
static int fc_serve(int fd, bool slow)
{
    if (slow)
        sleep_ms(300);          /* more of the upload piles up in the connection before we read */
    struct fc_request req;
    uint64_t up_sum = FNV_START, down_sum = FNV_START;
    if (!read_all(fd, &req, sizeof(req)) || req.up > (1ull << 32) || req.down > (1ull << 32))
        return fail("forkconn child: request"), 1;
    if (!recv_stream(fd, req.seed, req.up, &up_sum, "forkconn child: upload"))
        return 1;
    struct fc_reply rep = { getpid(), up_sum };
    if (!write_all(fd, &rep, sizeof(rep)) || !send_stream(fd, ~req.seed, req.down, &down_sum) ||
        !write_all(fd, &down_sum, sizeof(down_sum)))
        return 1;
    return close(fd) == 0 ? 0 : 1;
}

static int mode_forkconn(int port, int clients, uint64_t bytes)
{
    if (clients < 1 || clients > 64)
        return fail("bad counts"), 2;
    int lfd = listen_on(port);
    if (lfd < 0)
        return 1;
    pid_t server = getpid();
    pid_t client_proc = fork();
    if (client_proc < 0)
        return fail("fork"), 1;
    if (client_proc == 0) {
        /* The clients, in a process of their own: threads connecting all at once. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        close(lfd);
        pthread_t threads[64];
        struct fc_client jobs[64];
        for (int i = 0; i < clients; i++) {
            jobs[i] = (struct fc_client){ .port = port, .index = i, .bytes = bytes };
            if (pthread_create(&threads[i], NULL, fc_client_thread, &jobs[i]) != 0)
                _exit(3);
        }
        bool ok = true;
        for (int i = 0; i < clients; i++) {
            pthread_join(threads[i], NULL);
            ok &= jobs[i].ok;
            if (jobs[i].ok && (jobs[i].served_by == server || jobs[i].served_by <= 0)) {
                errno = 0;
                ok = fail("forkconn client %d: served by pid %d, not by a child", i, (int)jobs[i].served_by);
            }
        }
        _exit(ok ? 0 : 4);
    }

    report_crashes();
    bool ok = true;
    pid_t children[64];
    int nchildren = 0;
    for (int i = 0; i < clients; i++) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0) {
            ok = fail("accept");
            break;
        }
        bool slow = i % 2 == 1;
        char what[64];
        snprintf(what, sizeof(what), "forkconn connection %d", i);
        /* The connection is on RDMA here; a slow one carries unread data into its child. */
        if (!check_started_on(c, port, what) || (slow && !wait_unread(c, 4096, 10000)))
            ok = false;
        pid_t pid = fork();
        if (pid < 0) {
            ok = fail("fork");
            close(c);
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            close(lfd);
            _exit(fc_serve(c, slow));
        }
        children[nchildren++] = pid;
        close(c);               /* what a fork-per-connection server does at once */
    }
    for (int i = 0; i < nchildren; i++)
        ok &= wait_child(children[i], "a forkconn child");
    ok &= wait_child(client_proc, "the forkconn clients");
    close(lfd);
    if (ok)
        note("forkconn: %d connections of %llu bytes each way served by forked children", clients,
             (unsigned long long)bytes);
    return ok ? 0 : 1;
}

/*
 * The client side of a one-connection mode, in a process of its own: connects, checks the path, runs script
 * (which ends by sending the checksum of what it received), then expects the end of the stream. Returns its pid,
 * or -1 (reported) if it could not be started.
 */
static pid_t start_client(int lfd, int port, bool (*script)(int fd, uint64_t bytes), uint64_t bytes, const char *who)
{
    pid_t pid = fork();
    if (pid < 0) {
        fail("fork");
        return -1;
    }
    if (pid > 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    close(lfd);
    int fd = connect_to(port);
    bool ok = fd >= 0 && check_path(port) && script(fd, bytes);
    char end;
    if (ok && read(fd, &end, 1) != 0) {
        errno = 0;
        ok = fail("%s: no end of stream", who);
    }
    _exit(ok ? 0 : 4);
}

/* shared: the stream, part by part. X: client, before the fork; A: child; B: client; C: parent; D: client. */
#define SH_SEED_X 0x5a11ull
#define SH_SEED_A 0xa11aull
#define SH_SEED_B 0xb22bull
#define SH_SEED_C 0xc33cull
#define SH_SEED_D 0xd44dull

/* Part X, sent before the fork: a quarter of the others. */
static uint64_t shared_prelude(uint64_t bytes)
{
    return bytes / 4 ? bytes / 4 : 1;
}

static bool shared_client(int fd, uint64_t bytes)
{
    uint64_t sent = FNV_START, got = FNV_START;
    return send_stream(fd, SH_SEED_X, shared_prelude(bytes), &sent) &&
           recv_stream(fd, SH_SEED_A, bytes, &got, "shared client: part A (from the child)") &&
           send_stream(fd, SH_SEED_B, bytes, &sent) &&
           recv_stream(fd, SH_SEED_C, bytes, &got, "shared client: part C (from the parent)") &&
           send_stream(fd, SH_SEED_D, bytes, &sent) && sum_matches(fd, sent, "shared client: all it sent") &&
           write_all(fd, &got, sizeof(got));
}

static int mode_shared(int port, uint64_t bytes)
{
    int lfd = listen_on(port);
    if (lfd < 0)
        return 1;
    uint64_t prelude = shared_prelude(bytes);
    pid_t client_proc = start_client(lfd, port, shared_client, bytes, "shared client");
    if (client_proc < 0)
        return 1;
    report_crashes();
    int c = accept(lfd, NULL, NULL);
    if (c < 0)
        return fail("accept"), 1;
    close(lfd);
    bool ok = check_started_on(c, port, "shared connection") && wait_unread(c, 4096, 10000);
    uint64_t got = FNV_START, sent = FNV_START;
    pid_t child = fork();
    if (child < 0)
        return fail("fork"), 1;
    if (child == 0) {
        /* Its copy: reads what arrived before the fork, writes A, reads B, and leaves the rest to the parent. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        bool child_ok = recv_stream(c, SH_SEED_X, prelude, &got, "shared child: prelude X") &&
                        send_stream(c, SH_SEED_A, bytes, &sent) &&
                        recv_stream(c, SH_SEED_B, bytes, &got, "shared child: part B");
        exit(child_ok ? 0 : 5);
    }
    ok &= wait_child(child, "the shared child");
    /* The parent goes on where the child stopped: the sums include the child's parts, computed again here. */
    uint64_t state_sum = FNV_START;
    unsigned char *buf = malloc(CHUNK);
    uint64_t parts[][2] = { { SH_SEED_X, prelude }, { SH_SEED_B, bytes } };
    for (size_t p = 0; p < 2 && buf; p++) {
        uint64_t st = parts[p][0] | 1;
        for (uint64_t done = 0; done < parts[p][1];) {
            size_t n = parts[p][1] - done < CHUNK ? (size_t)(parts[p][1] - done) : CHUNK;
            fill_pattern(&st, buf, n);
            state_sum = fnv1a(state_sum, buf, n);
            done += n;
        }
    }
    uint64_t child_sent = FNV_START, st = SH_SEED_A | 1;
    for (uint64_t done = 0; buf && done < bytes;) {
        size_t n = bytes - done < CHUNK ? (size_t)(bytes - done) : CHUNK;
        fill_pattern(&st, buf, n);
        child_sent = fnv1a(child_sent, buf, n);
        done += n;
    }
    free(buf);
    got = state_sum;
    sent = child_sent;
    ok = ok && send_stream(c, SH_SEED_C, bytes, &sent) &&
         recv_stream(c, SH_SEED_D, bytes, &got, "shared parent: part D") && write_all(c, &got, sizeof(got)) &&
         sum_matches(c, sent, "shared parent: all the server sent");
    close(c);
    ok &= wait_child(client_proc, "the shared client");
    if (ok)
        note("shared: the child and then the parent used one connection, %llu bytes per part",
             (unsigned long long)bytes);
    return ok ? 0 : 1;
}

/* execconn: X (client, before the exec), then the new image acknowledges, Y (client), Z (new image). */
#define EX_SEED_X 0xe1ull
#define EX_SEED_Y 0xe2ull
#define EX_SEED_Z 0xe3ull

static bool execconn_client(int fd, uint64_t bytes)
{
    uint64_t sent = FNV_START, got = FNV_START;
    return send_stream(fd, EX_SEED_X, bytes, &sent) && sum_matches(fd, sent, "execconn client: X") &&
           send_stream(fd, EX_SEED_Y, bytes, &sent) &&
           recv_stream(fd, EX_SEED_Z, bytes, &got, "execconn client: Z (from the new image)") &&
           sum_matches(fd, sent, "execconn client: X and Y") && write_all(fd, &got, sizeof(got));
}

static int mode_execconn(int port, uint64_t bytes)
{
    int lfd = listen_on(port);
    if (lfd < 0)
        return 1;
    pid_t client_proc = start_client(lfd, port, execconn_client, bytes, "execconn client");
    if (client_proc < 0)
        return 1;
    int c = accept4(lfd, NULL, NULL, 0);        /* no close-on-exec: it crosses the exec */
    if (c < 0)
        return fail("accept"), 1;
    fcntl(lfd, F_SETFD, FD_CLOEXEC);
    /* On RDMA, with the client's data waiting unread when the exec comes. */
    if (!check_started_on(c, port, "execconn connection") ||
        !wait_unread(c, bytes < 16384 ? (int)bytes : 16384, 10000))
        return 1;
    char fd_arg[16], port_arg[16], bytes_arg[32], pid_arg[16];
    snprintf(fd_arg, sizeof(fd_arg), "%d", c);
    snprintf(port_arg, sizeof(port_arg), "%d", port);
    snprintf(bytes_arg, sizeof(bytes_arg), "%llu", (unsigned long long)bytes);
    snprintf(pid_arg, sizeof(pid_arg), "%d", (int)client_proc);
    char *const argv[] = { "proccheck", "execconn-image", fd_arg, port_arg, bytes_arg, pid_arg, NULL };
    execv(self_path, argv);
    return fail("execv"), 1;
}

/* The image after the exec: rdmasock (when preloaded) starts afresh and knows nothing of the fd. */
static int mode_execconn_image(int fd, int port, uint64_t bytes, pid_t client_proc)
{
    bool ok = true;
    struct sockaddr_storage peer;
    socklen_t plen = sizeof(peer);
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0)
        ok = fail("execconn image: fd %d is not a connected socket", fd);
    if (ok && on_sdp(fd)) {
        errno = 0;
        ok = fail("execconn image: fd %d is an SDP connection of the new image", fd);
    }
    uint64_t got = FNV_START, sent = FNV_START;
    ok = ok && recv_stream(fd, EX_SEED_X, bytes, &got, "execconn image: X (sent before the exec)") &&
         write_all(fd, &got, sizeof(got)) &&
         recv_stream(fd, EX_SEED_Y, bytes, &got, "execconn image: Y") && send_stream(fd, EX_SEED_Z, bytes, &sent) &&
         write_all(fd, &got, sizeof(got)) && sum_matches(fd, sent, "execconn image: Z");
    close(fd);
    ok &= wait_child(client_proc, "the execconn client");
    (void)port;
    if (ok)
        note("execconn: the connection crossed the exec with %llu bytes unread and carried %llu more each way",
             (unsigned long long)bytes, (unsigned long long)bytes);
    return ok ? 0 : 1;
}

static int mode_client(int port, uint64_t bytes, uint64_t seed)
{
    int fd = connect_to(port);
    if (fd < 0)
        return 1;
    pid_t server = 0;
    bool ok = fetch(fd, port, bytes, seed, &server);
    close(fd);
    if (ok)
        note("client: %llu bytes from pid %d verified", (unsigned long long)bytes, (int)server);
    return ok ? 0 : 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: proccheck signal recv|accept|recv-timeo restart|interrupt PORT\n"
                    "       proccheck prefork PORT CHILDREN CLIENTS BYTES\n"
                    "       proccheck exec PORT\n"
                    "       proccheck daemon PORT STATUS_FILE\n"
                    "       proccheck client PORT BYTES SEED\n"
                    "       proccheck forkconn PORT CLIENTS BYTES\n"
                    "       proccheck shared PORT BYTES\n"
                    "       proccheck execconn PORT BYTES\n");
    return 2;
}

int main(int argc, char **argv)
{
    setvbuf(stderr, NULL, _IONBF, 0);
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
    if (n > 0)
        self_path[n] = '\0';
    if (argc >= 2 && strcmp(argv[1], "exec-child") == 0)
        return mode_exec_child(argc, argv);
    if (argc == 5 && strcmp(argv[1], "signal") == 0)
        return mode_signal(argv[2], argv[3], atoi(argv[4]));
    if (argc == 6 && strcmp(argv[1], "prefork") == 0)
        return mode_prefork(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), strtoull(argv[5], NULL, 0));
    if (argc == 3 && strcmp(argv[1], "exec") == 0)
        return mode_exec(atoi(argv[2]));
    if (argc == 4 && strcmp(argv[1], "daemon") == 0)
        return mode_daemon(atoi(argv[2]), argv[3]);
    if (argc == 5 && strcmp(argv[1], "forkconn") == 0)
        return mode_forkconn(atoi(argv[2]), atoi(argv[3]), strtoull(argv[4], NULL, 0));
    if (argc == 4 && strcmp(argv[1], "shared") == 0)
        return mode_shared(atoi(argv[2]), strtoull(argv[3], NULL, 0));
    if (argc == 4 && strcmp(argv[1], "execconn") == 0)
        return mode_execconn(atoi(argv[2]), strtoull(argv[3], NULL, 0));
    if (argc == 6 && strcmp(argv[1], "execconn-image") == 0)
        return mode_execconn_image(atoi(argv[2]), atoi(argv[3]), strtoull(argv[4], NULL, 0), (pid_t)atoi(argv[5]));
    if (argc == 5 && strcmp(argv[1], "client") == 0)
        return mode_client(atoi(argv[2]), strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
    return usage();
}
