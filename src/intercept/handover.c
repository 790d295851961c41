/*
 * handover.c: records, the owner's server and the holders' claims (design in handover.h).
 *
 * Who runs what:
 *   - the forking thread, in the fork handlers: makes records (prepare), enters the child in them (fork returned);
 *   - the child, in its fork handler: enters itself, forgets the parent's server and parked sockets;
 *   - the owner's server thread: answers claims, has what the application closed while holders remained handed
 *     back, watches holders die, and closes a parked socket, frees a record, once no holder is left; the
 *     hand-backs themselves (rs_isock_handback, never on the progress thread) run on worker threads;
 *   - any application thread of a holder: claims (rs_ho_claim), leaves (rs_ho_holder_leave).
 *
 * Locks: ho_lock (this process's registry) is taken after an isock's lock, never before: the server thread takes
 * no isock lock while holding it. The arena needs no lock (atomics only).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/fdutil.h"
#include "common/log.h"
#include "common/thread.h"
#include "intercept/handover.h"
#include "intercept/isock_int.h"
#include "intercept/libc.h"

#define HO_RECORDS 1024
#define HO_HOLDERS 16
#define HO_MSG_MAGIC 0x52534f48u        /* "RSOH" */
#define HO_BATCH 64

/* ---- the arena (shared by the family) ---- */

enum ho_state {
    HO_FREE = 0,
    HO_INIT,            /* being filled by its owner */
    HO_LIVE,            /* the owner has the connection on RDMA */
    HO_PARKED,          /* handed back: the owner keeps the kernel socket for holders */
    HO_DEAD,            /* the hand-back failed: claims are answered with a reset */
};

struct ho_record {
    uint32_t state;
    int32_t owner;
    uint64_t token;
    uint32_t overflow;              /* more holders than fit: unknown ones may remain until the owner ends */
    int32_t holders[HO_HOLDERS];    /* pids that inherited the connection and have not claimed it (0: free) */
};

struct ho_arena {
    uint32_t next;                  /* where the next allocation starts looking (a hint) */
    struct ho_record rec[HO_RECORDS];
};

static struct ho_arena *arena;
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static struct ho_arena *arena_get(bool create)
{
    struct ho_arena *a = __atomic_load_n(&arena, __ATOMIC_ACQUIRE);
    if (a || !create)
        return a;
    pthread_mutex_lock(&arena_lock);
    a = arena;
    if (!a) {
        void *m = mmap(NULL, sizeof(*a), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) {
            a = m;
            __atomic_store_n(&arena, a, __ATOMIC_RELEASE);
        } else {
            RS_LOG_ONCE(RS_LOG_WARN, "hand-over arena not created (%s): connections will not follow fork",
                        strerror(errno));
        }
    }
    pthread_mutex_unlock(&arena_lock);
    return a;
}

static struct ho_record *record_of(int slot, uint64_t token)
{
    struct ho_arena *a = arena_get(false);
    if (!a || slot < 0 || slot >= HO_RECORDS)
        return NULL;
    struct ho_record *r = &a->rec[slot];
    uint32_t st = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
    if (st == HO_FREE || st == HO_INIT || __atomic_load_n(&r->token, __ATOMIC_ACQUIRE) != token)
        return NULL;
    return r;
}

/* Alive for our purpose: exists and is not a zombie (a child its parent has not reaped holds nothing). EPERM means
 * alive (a child that changed user). */
static bool pid_alive(pid_t pid)
{
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0)
        return errno == EPERM;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true;
    ssize_t n = RS_REAL(read)(fd, buf, sizeof(buf) - 1);
    RS_REAL(close)(fd);
    if (n <= 0)
        return true;
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');     /* the command name may hold anything, even ')' */
    if (!paren || paren[1] != ' ')
        return true;
    return paren[2] != 'Z' && paren[2] != 'X';
}

/* A free record for a connection of this process; reclaims records of owners that died. */
static int record_alloc(uint64_t token)
{
    struct ho_arena *a = arena_get(true);
    if (!a)
        return -1;
    uint32_t start = __atomic_load_n(&a->next, __ATOMIC_RELAXED) % HO_RECORDS;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t k = 0; k < HO_RECORDS; k++) {
            uint32_t i = (start + k) % HO_RECORDS;
            struct ho_record *r = &a->rec[i];
            uint32_t st = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
            bool take = st == HO_FREE;
            if (!take && pass == 1 && st != HO_INIT)
                take = !pid_alive(__atomic_load_n(&r->owner, __ATOMIC_ACQUIRE));
            if (!take || !__atomic_compare_exchange_n(&r->state, &st, HO_INIT, false, __ATOMIC_ACQ_REL,
                                                      __ATOMIC_ACQUIRE))
                continue;
            __atomic_store_n(&r->owner, (int32_t)getpid(), __ATOMIC_RELAXED);
            __atomic_store_n(&r->overflow, 0, __ATOMIC_RELAXED);
            for (int h = 0; h < HO_HOLDERS; h++)
                __atomic_store_n(&r->holders[h], 0, __ATOMIC_RELAXED);
            __atomic_store_n(&r->token, token, __ATOMIC_RELEASE);
            __atomic_store_n(&r->state, HO_LIVE, __ATOMIC_RELEASE);
            __atomic_store_n(&a->next, i + 1, __ATOMIC_RELAXED);
            return (int)i;
        }
    }
    return -1;
}

static void record_free(struct ho_record *r)
{
    __atomic_store_n(&r->token, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&r->state, HO_FREE, __ATOMIC_RELEASE);
}

static void holder_add(struct ho_record *r, pid_t pid)
{
    for (int h = 0; h < HO_HOLDERS; h++)
        if (__atomic_load_n(&r->holders[h], __ATOMIC_ACQUIRE) == pid)
            return;
    for (int h = 0; h < HO_HOLDERS; h++) {
        int32_t expected = 0;
        if (__atomic_compare_exchange_n(&r->holders[h], &expected, (int32_t)pid, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return;
    }
    __atomic_store_n(&r->overflow, 1, __ATOMIC_RELEASE);
}

/* Every entry of pid (the parent and the child may both have entered it). */
static void holder_remove(struct ho_record *r, pid_t pid)
{
    for (int h = 0; h < HO_HOLDERS; h++) {
        int32_t expected = (int32_t)pid;
        __atomic_compare_exchange_n(&r->holders[h], &expected, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
}

static bool holder_listed(struct ho_record *r, pid_t pid)
{
    for (int h = 0; h < HO_HOLDERS; h++)
        if (__atomic_load_n(&r->holders[h], __ATOMIC_ACQUIRE) == pid)
            return true;
    return false;
}

/* Drops holders that died; true when some holder (or an unknown one, after overflow) remains. */
static bool holders_remain(struct ho_record *r)
{
    bool any = __atomic_load_n(&r->overflow, __ATOMIC_ACQUIRE) != 0;
    for (int h = 0; h < HO_HOLDERS; h++) {
        int32_t pid = __atomic_load_n(&r->holders[h], __ATOMIC_ACQUIRE);
        if (pid == 0)
            continue;
        if (pid_alive(pid)) {
            any = true;
            continue;
        }
        __atomic_compare_exchange_n(&r->holders[h], &pid, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    return any;
}

/* ---- messages between a holder and the owner's server ---- */

enum ho_op { HO_OP_CLAIM = 1, HO_OP_LEAVE = 2 };

struct ho_msg {
    uint32_t magic;
    uint32_t op;                    /* request: enum ho_op; reply: 0 */
    int32_t slot;
    int32_t status;                 /* reply: 0 (an fd comes with it) or an errno */
    uint64_t token;
};

static socklen_t server_name(pid_t owner, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    /* Abstract: nothing in the filesystem to clean up, gone with the socket. */
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "rdmasock-handover-%d", (int)owner);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd p = { .fd = fd, .events = events };
        int r = RS_REAL(poll)(&p, 1, (int)(deadline - now));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r > 0)
            return 0;
    }
}

/* A connected SEQPACKET socket to the owner's server, or -errno. */
static int connect_owner(pid_t owner, uint64_t deadline)
{
    struct sockaddr_un a;
    socklen_t alen = server_name(owner, &a);
    for (;;) {
        int fd = RS_REAL(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return -errno;
        if (RS_REAL(connect)(fd, (struct sockaddr *)&a, alen) == 0)
            return fd;
        int e = errno;
        RS_REAL(close)(fd);
        /* A full backlog (the server is busy with another claim) answers EAGAIN: try again a little later. */
        if (e != EAGAIN && e != EINTR)
            return -e;
        if (now_ms() >= deadline)
            return -ETIMEDOUT;
        struct timespec ts = { 0, 5 * 1000000L };
        nanosleep(&ts, NULL);
    }
}

/* ---- the owner's registry (this process) ---- */

struct ho_entry {
    int slot;
    uint64_t token;
    struct rs_isock *s;             /* held */
    int parked;                     /* the kernel socket kept for holders (internal fd), -1 */
    bool app_closed;                /* closed by the application while holders remained: to hand back here */
    bool failed;                    /* the hand-back failed */
    bool working;                   /* a worker hands it back now */
    uint64_t grace_until;           /* ms: a child of a fork no interposer saw may still enter itself */
};

static pthread_mutex_t ho_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ho_entry *entries;
static int n_entries, cap_entries;
static int server_fd = -1;          /* listening, named after server_pid */
static int wake_fd = -1;            /* eventfd: something for the server to look at */
static pid_t server_pid;
static bool server_running;
static int workers_running;         /* hand-back workers alive (HO_WORKERS at most) */

#define HO_WORKERS 8

/* The forking thread's records of the fork under way: the child is entered in them when fork() returns. */
static __thread struct {
    int n;
    bool overflow;
    int slot[HO_BATCH];
    uint64_t token[HO_BATCH];
} batch;

static struct ho_entry *entry_find(int slot, uint64_t token)
{
    for (int i = 0; i < n_entries; i++)
        if (entries[i].slot == slot && entries[i].token == token)
            return &entries[i];
    return NULL;
}

static void close_internal(int fd)
{
    if (fd < 0)
        return;
    rs_fd_unmark_internal(fd);
    RS_REAL(close)(fd);
}

static void wake_server(void)
{
    if (wake_fd >= 0) {
        uint64_t one = 1;
        (void)!RS_REAL(write)(wake_fd, &one, sizeof(one));
    }
}

static void batch_add(int slot, uint64_t token)
{
    for (int i = 0; i < batch.n; i++)
        if (batch.slot[i] == slot && batch.token[i] == token)
            return;
    if (batch.n == HO_BATCH) {
        batch.overflow = true;
        return;
    }
    batch.slot[batch.n] = slot;
    batch.token[batch.n++] = token;
}

/* ho_lock held: the listening socket named after this process, made once per process. */
static bool ensure_server_socket(void)
{
    pid_t me = getpid();
    if (server_fd >= 0 && server_pid == me)
        return true;
    int fd = RS_REAL(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        goto fail;
    struct sockaddr_un a;
    socklen_t alen = server_name(me, &a);
    if (RS_REAL(bind)(fd, (struct sockaddr *)&a, alen) != 0 || RS_REAL(listen)(fd, 128) != 0) {
        int e = errno;
        RS_REAL(close)(fd);
        errno = e;
        goto fail;
    }
    int ev = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ev < 0) {
        int e = errno;
        RS_REAL(close)(fd);
        errno = e;
        goto fail;
    }
    server_fd = rs_fd_move_high(fd);
    wake_fd = rs_fd_move_high(ev);
    rs_fd_mark_internal(server_fd);
    rs_fd_mark_internal(wake_fd);
    server_pid = me;
    return true;
fail:
    RS_LOG_ONCE(RS_LOG_WARN, "hand-over server socket not created (%s): connections will not follow fork",
                strerror(errno));
    return false;
}

static void *server_main(void *arg);

/* ho_lock held. */
static void ensure_server_thread(void)
{
    if (server_running || server_fd < 0 || server_pid != getpid())
        return;
    int r = rs_thread_start(NULL, server_main, NULL, true);
    if (r != 0)
        RS_LOG_ONCE(RS_LOG_WARN, "hand-over server thread not started (%s)", strerror(r));
    else
        server_running = true;
}

/* ---- fork ---- */

void rs_ho_fork_prepare_begin(void)
{
    batch.n = 0;
    batch.overflow = false;
}

bool rs_ho_prepare_owned(struct rs_isock *s)
{
    pthread_mutex_lock(&ho_lock);
    struct ho_entry *e = s->ho_slot >= 0 ? entry_find(s->ho_slot, s->ho_token) : NULL;
    if (!e) {
        s->ho_slot = -1;
        uint64_t token = 0;
        if (getrandom(&token, sizeof(token), GRND_NONBLOCK) != (ssize_t)sizeof(token))
            token = now_ms() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)s;
        token |= 1;                 /* never 0, which marks a free record */
        if (!ensure_server_socket())
            goto none;
        if (n_entries == cap_entries) {
            int cap = cap_entries ? cap_entries * 2 : 16;
            struct ho_entry *grown = realloc(entries, (size_t)cap * sizeof(*grown));
            if (!grown)
                goto none;
            entries = grown;
            cap_entries = cap;
        }
        int slot = record_alloc(token);
        if (slot < 0) {
            RS_LOG_ONCE(RS_LOG_WARN, "hand-over arena full: a connection inherited across fork cannot be used "
                                     "by the child");
            goto none;
        }
        e = &entries[n_entries++];
        *e = (struct ho_entry){ .slot = slot, .token = token, .s = s, .parked = -1 };
        rs_fd_obj_hold(rs_isock_obj(s));
        s->ho_slot = slot;
        s->ho_token = token;
    }
    e->grace_until = now_ms() + RS_HO_GRACE_MS;
    batch_add(e->slot, e->token);
    pthread_mutex_unlock(&ho_lock);
    return true;
none:
    pthread_mutex_unlock(&ho_lock);
    return false;
}

void rs_ho_prepare_held(struct rs_isock *s)
{
    if (s->ho_slot >= 0)
        batch_add(s->ho_slot, s->ho_token);
}

void rs_ho_fork_returned(pid_t child)
{
    if (batch.n == 0)
        return;
    for (int i = 0; i < batch.n; i++) {
        struct ho_record *r = record_of(batch.slot[i], batch.token[i]);
        if (r)
            holder_add(r, child);
    }
    /* The child is entered: the grace for a child that enters itself is not needed (unless some record of this
     * fork did not fit in the batch). */
    if (!batch.overflow) {
        pthread_mutex_lock(&ho_lock);
        for (int i = 0; i < batch.n; i++) {
            struct ho_entry *e = entry_find(batch.slot[i], batch.token[i]);
            if (e)
                e->grace_until = 0;
        }
        pthread_mutex_unlock(&ho_lock);
    }
    batch.n = 0;
}

void rs_ho_fork_parent(void)
{
    pthread_mutex_lock(&ho_lock);
    if (n_entries > 0)
        ensure_server_thread();
    pthread_mutex_unlock(&ho_lock);
}

void rs_ho_fork_child(void)
{
    /* Only the forking thread exists here; whatever held the lock in the parent is gone. */
    pthread_mutex_init(&ho_lock, NULL);
    pthread_mutex_init(&arena_lock, NULL);
    batch.n = 0;
    batch.overflow = false;
    /* The parent's server and parked sockets are the parent's: our copies would keep connections open that the
     * parent closes. The records stay in the arena (the parent serves them). */
    close_internal(server_fd);
    close_internal(wake_fd);
    server_fd = wake_fd = -1;
    server_pid = 0;
    server_running = false;
    workers_running = 0;
    /* The entries' objects are left alone (a small leak in the child): dropping the last reference here would
     * destroy one in a fork handler, which may run before the statistics layer has moved the child to its own
     * area, and release the parent's slot. */
    for (int i = 0; i < n_entries; i++)
        close_internal(entries[i].parked);
    free(entries);
    entries = NULL;
    n_entries = cap_entries = 0;
}

void rs_ho_holder_enter(const struct rs_isock *s)
{
    struct ho_record *r = record_of(s->ho_slot, s->ho_token);
    if (r)
        holder_add(r, getpid());
}

/* ---- the owner ---- */

bool rs_ho_owner_closing(struct rs_isock *s)
{
    pthread_mutex_lock(&ho_lock);
    struct ho_entry *e = entry_find(s->ho_slot, s->ho_token);
    bool deferred = false;
    if (e && e->parked < 0 && !e->failed) {
        struct ho_record *r = record_of(e->slot, e->token);
        if (r && (holders_remain(r) || now_ms() < e->grace_until)) {
            e->app_closed = true;
            deferred = true;
            ensure_server_thread();
            wake_server();
        }
    }
    pthread_mutex_unlock(&ho_lock);
    return deferred;
}

void rs_ho_park(struct rs_isock *s, int kfd)
{
    if (s->ho_slot < 0)
        return;
    pthread_mutex_lock(&ho_lock);
    struct ho_entry *e = entry_find(s->ho_slot, s->ho_token);
    if (e && e->parked < 0) {
        int d = RS_REAL(fcntl)(kfd, F_DUPFD_CLOEXEC, 0);
        if (d >= 0) {
            e->parked = rs_fd_move_high(d);
            rs_fd_mark_internal(e->parked);
            struct ho_record *r = record_of(e->slot, e->token);
            if (r)
                __atomic_store_n(&r->state, HO_PARKED, __ATOMIC_RELEASE);
        } else {
            RS_WARN("hand-over: no fd to keep a handed-back connection for forked processes (%s)",
                    strerror(errno));
        }
    }
    pthread_mutex_unlock(&ho_lock);
}

/* Sends the reply (and fd when >= 0). */
static int reply(int cfd, int status, int fd)
{
    struct ho_msg m = { .magic = HO_MSG_MAGIC, .status = status };
    struct iovec iov = { &m, sizeof(m) };
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    return RS_REAL(sendmsg)(cfd, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(m) ? 0 : -errno;
}

/*
 * Hand-backs run on worker threads (at most HO_WORKERS, else on the server thread itself): one can take a while
 * (the peer finishes a zero-copy transfer first), and independent connections must not queue behind it.
 */
struct ho_job {
    struct rs_isock *s;             /* held */
    int slot;
    uint64_t token;
    int cfd;                        /* a claim waiting for the answer (the job's), or -1 */
    pid_t claimer;
};

/* ho_lock held: answers a claim with the parked socket, or a reset. */
static void answer_claim(int cfd, struct ho_entry *e, pid_t claimer)
{
    if (e && e->parked >= 0 && reply(cfd, 0, e->parked) == 0) {
        /* It holds the kernel socket itself now: no longer a reason to keep ours. */
        struct ho_record *r = record_of(e->slot, e->token);
        if (r)
            holder_remove(r, claimer);
        RS_DEBUG("hand-over: connection handed to pid %d", (int)claimer);
        return;
    }
    (void)reply(cfd, ECONNRESET, -1);
}

static void run_job(struct ho_job *job)
{
    int hr = rs_isock_handback(job->s, RS_HO_HANDBACK_MS, false);
    rs_isock_put(job->s);
    pthread_mutex_lock(&ho_lock);
    struct ho_entry *e = entry_find(job->slot, job->token);
    if (e) {
        e->working = false;
        if (hr == 0 && e->parked < 0)
            hr = -ENOENT;               /* nothing kept for the holders: never try again */
        if (hr < 0) {
            RS_WARN("hand-over: a connection forked processes hold was not handed back (%s): they will see a "
                    "reset", strerror(-hr));
            e->failed = true;
            struct ho_record *r = record_of(e->slot, e->token);
            if (r)
                __atomic_store_n(&r->state, HO_DEAD, __ATOMIC_RELEASE);
        }
    }
    if (job->cfd >= 0)
        answer_claim(job->cfd, e, job->claimer);
    pthread_mutex_unlock(&ho_lock);
    if (job->cfd >= 0)
        RS_REAL(close)(job->cfd);
    wake_server();                      /* the sweep looks at the entry again */
}

static void *worker_main(void *arg)
{
    run_job(arg);
    free(arg);
    pthread_mutex_lock(&ho_lock);
    workers_running--;
    pthread_mutex_unlock(&ho_lock);
    return NULL;
}

/* ho_lock held, e not working: hands e's connection back on a worker (the job owns cfd from here). */
static void start_job(struct ho_entry *e, int cfd, pid_t claimer)
{
    struct ho_job *job = malloc(sizeof(*job));
    if (!job) {
        if (cfd >= 0) {
            (void)reply(cfd, ECONNRESET, -1);
            RS_REAL(close)(cfd);
        }
        return;
    }
    *job = (struct ho_job){ .s = e->s, .slot = e->slot, .token = e->token, .cfd = cfd, .claimer = claimer };
    rs_fd_obj_hold(rs_isock_obj(e->s));
    e->working = true;
    if (workers_running < HO_WORKERS) {
        int r = rs_thread_start(NULL, worker_main, job, true);
        if (r == 0) {
            workers_running++;
            return;
        }
    }
    /* No worker to spare: here, on the server thread. */
    pthread_mutex_unlock(&ho_lock);
    run_job(job);
    free(job);
    pthread_mutex_lock(&ho_lock);
}

/* Server thread: one request on an accepted connection. Returns true when a job took cfd over. */
static bool serve(int cfd)
{
    struct ucred cred = { 0 };
    socklen_t clen = sizeof(cred);
    struct ho_msg m;
    if (RS_REAL(getsockopt)(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
        wait_fd(cfd, POLLIN, now_ms() + RS_HO_CONNECT_MS) != 0 ||
        RS_REAL(recv)(cfd, &m, sizeof(m), 0) != (ssize_t)sizeof(m) || m.magic != HO_MSG_MAGIC)
        return false;
    if (m.op == HO_OP_LEAVE)
        return false;               /* the holder left its record already; the sweep after this looks */
    if (m.op != HO_OP_CLAIM) {
        (void)reply(cfd, EINVAL, -1);
        return false;
    }
    bool taken = false;
    pthread_mutex_lock(&ho_lock);
    struct ho_entry *e = entry_find(m.slot, m.token);
    struct ho_record *r = e ? record_of(e->slot, e->token) : NULL;
    if (!e || !r) {
        (void)reply(cfd, ECONNRESET, -1);
    } else if (!holder_listed(r, cred.pid) && !__atomic_load_n(&r->overflow, __ATOMIC_ACQUIRE)) {
        (void)reply(cfd, EPERM, -1);    /* only a process that inherited the connection takes it */
    } else if (e->parked < 0 && !e->failed) {
        /* A hand-back first (a worker already on it makes this one wait for it in rs_isock_handback). */
        start_job(e, cfd, cred.pid);
        taken = true;
    } else {
        answer_claim(cfd, e, cred.pid);
    }
    pthread_mutex_unlock(&ho_lock);
    return taken;
}

static void sweep(void)
{
    uint64_t now = now_ms();
    struct rs_isock *to_put[16];
    int n_put;
    do {
        n_put = 0;
        pthread_mutex_lock(&ho_lock);
        for (int i = 0; i < n_entries && n_put < (int)RS_ARRAY_SIZE(to_put); i++) {
            struct ho_entry *e = &entries[i];
            if (e->working)
                continue;
            struct ho_record *r = record_of(e->slot, e->token);
            bool holders = r && (holders_remain(r) || now < e->grace_until);
            if (e->app_closed && e->parked < 0 && !e->failed) {
                if (holders) {
                    start_job(e, -1, 0);    /* closed here while held elsewhere: hand back and park */
                    continue;
                }
                /* The holders went away before the hand-back: the application's close goes through now. */
                struct rs_isock *s = e->s;
                e->failed = true;
                pthread_mutex_unlock(&ho_lock);
                rs_lock(&s->lock);
                if (s->sdp && s->path == RS_IPATH_SDP && __atomic_load_n(&s->nfds, __ATOMIC_ACQUIRE) == 0 &&
                    !s->hb_busy) {
                    rs_fd_unmark_internal(rs_sdp_fd(s->sdp));
                    rs_sdp_close(s->sdp);
                }
                rs_unlock(&s->lock);
                pthread_mutex_lock(&ho_lock);
                i = -1;                     /* the table may have changed meanwhile: from the top */
                continue;
            }
            if (holders)
                continue;
            /* Nobody else can take it: close what we kept, give the record back. */
            close_internal(e->parked);
            if (r)
                record_free(r);
            to_put[n_put++] = e->s;
            entries[i--] = entries[--n_entries];
        }
        pthread_mutex_unlock(&ho_lock);
        for (int k = 0; k < n_put; k++) {
            struct rs_isock *s = to_put[k];
            rs_lock(&s->lock);
            if (s->ho_slot >= 0 && !record_of(s->ho_slot, s->ho_token))
                s->ho_slot = -1;            /* a later fork makes a new record */
            rs_unlock(&s->lock);
            rs_isock_put(s);
        }
    } while (n_put == (int)RS_ARRAY_SIZE(to_put));
}

static void *server_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&ho_lock);
        int lfd = server_fd, wfd = wake_fd;
        bool busy = n_entries > 0;
        pthread_mutex_unlock(&ho_lock);
        struct pollfd p[2] = { { .fd = lfd, .events = POLLIN }, { .fd = wfd, .events = POLLIN } };
        int r = RS_REAL(poll)(p, 2, busy ? RS_HO_TICK_MS : -1);
        if (r < 0 && errno != EINTR) {
            RS_WARN("hand-over server: poll failed (%s); stopping", strerror(errno));
            pthread_mutex_lock(&ho_lock);
            server_running = false;
            pthread_mutex_unlock(&ho_lock);
            return NULL;
        }
        if (r > 0 && (p[1].revents & POLLIN)) {
            uint64_t v;
            (void)!RS_REAL(read)(wfd, &v, sizeof(v));
        }
        if (r > 0 && (p[0].revents & POLLIN)) {
            for (int n = 0; n < 64; n++) {
                int cfd = RS_REAL(accept4)(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (cfd < 0)
                    break;
                if (!serve(cfd))
                    RS_REAL(close)(cfd);
            }
        }
        sweep();
    }
    return NULL;
}

/* ---- a holder ---- */

int rs_ho_claim(const struct rs_isock *s)
{
    int slot = s->ho_slot;
    uint64_t token = s->ho_token;
    pid_t owner = s->owner;
    struct ho_record *r = record_of(slot, token);
    if (!r || __atomic_load_n(&r->state, __ATOMIC_ACQUIRE) == HO_DEAD) {
        RS_WARN("hand-over: the connection inherited from pid %d is gone (%s)", (int)owner,
                r ? "its hand-back failed" : "no record");
        return -ECONNRESET;
    }
    uint64_t deadline = now_ms() + RS_HO_CLAIM_MS;
    int fd = connect_owner(owner, now_ms() + RS_HO_CONNECT_MS);
    if (fd < 0) {
        RS_WARN("hand-over: pid %d, which holds the connection, does not answer (%s)", (int)owner, strerror(-fd));
        return -ECONNRESET;
    }
    struct ho_msg m = { .magic = HO_MSG_MAGIC, .op = HO_OP_CLAIM, .slot = slot, .token = token };
    int kfd = -ECONNRESET;
    if (RS_REAL(send)(fd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m) || wait_fd(fd, POLLIN, deadline) != 0) {
        RS_WARN("hand-over: no answer from pid %d for the connection", (int)owner);
        goto out;
    }
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = { &m, sizeof(m) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
    ssize_t n = RS_REAL(recvmsg)(fd, &mh, MSG_CMSG_CLOEXEC);
    int got = -1;
    for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int)))
            memcpy(&got, CMSG_DATA(c), sizeof(int));
    if (n == (ssize_t)sizeof(m) && m.magic == HO_MSG_MAGIC && m.status == 0 && got >= 0) {
        kfd = got;
        holder_remove(r, getpid());
    } else {
        if (got >= 0)
            RS_REAL(close)(got);
        RS_WARN("hand-over: pid %d refused the connection (%s)", (int)owner,
                n == (ssize_t)sizeof(m) && m.status ? strerror(m.status) : "bad answer");
    }
out:
    RS_REAL(close)(fd);
    return kfd;
}

void rs_ho_holder_leave(const struct rs_isock *s)
{
    struct ho_record *r = record_of(s->ho_slot, s->ho_token);
    if (!r)
        return;
    holder_remove(r, getpid());
    /* Tell the owner, so it closes a parked socket now rather than at its next sweep; never wait for it. */
    struct sockaddr_un a;
    socklen_t alen = server_name(s->owner, &a);
    int fd = RS_REAL(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return;
    if (RS_REAL(connect)(fd, (struct sockaddr *)&a, alen) == 0) {
        struct ho_msg m = { .magic = HO_MSG_MAGIC, .op = HO_OP_LEAVE, .slot = s->ho_slot, .token = s->ho_token };
        (void)!RS_REAL(send)(fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    RS_REAL(close)(fd);
}

/* Records this process left for an exec (an exec that fails enters it again). */
static struct {
    int n;
    int slot[HO_BATCH];
    uint64_t token[HO_BATCH];
} exec_left;

void rs_ho_holder_leave_for_exec(const struct rs_isock *s)
{
    if (!record_of(s->ho_slot, s->ho_token))
        return;
    if (exec_left.n < HO_BATCH) {
        exec_left.slot[exec_left.n] = s->ho_slot;
        exec_left.token[exec_left.n++] = s->ho_token;
    }
    rs_ho_holder_leave(s);
}

void rs_ho_exec_failed(void)
{
    for (int i = 0; i < exec_left.n; i++) {
        struct ho_record *r = record_of(exec_left.slot[i], exec_left.token[i]);
        if (r)
            holder_add(r, getpid());
    }
    exec_left.n = 0;
}
