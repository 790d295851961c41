/*
 * wait_epoll.c: epoll over intercepted sockets and kernel fds together (design in wait.h).
 *
 * For each application epoll fd E that gets an intercepted socket: a struct wait_epoll (the RS_FD_EPOLL object at
 * E) and a private epoll fd P (RS_FD_INTERNAL). P holds the wait fds of E's socket registrations and sits in E,
 * level-triggered, under data.u64 == marker. Kernel fds stay in E with the application's own data.
 *
 * epoll_wait(E) waits on E for real; a marker event means "P has something": a zero-timeout wait on P gives the
 * registrations whose wait fds fired, rs_isock_poll says what each socket really has, and that becomes the
 * application's event. The readiness of E as seen from outside (E in poll(), E nested in another epoll) is the
 * kernel's readiness of P, so nesting needs nothing special.
 *
 * How registrations map into P:
 *   EPOLLET        edge-triggered in P; every change that adds readiness writes the wait fd (isock.h rule 5).
 *   EPOLLONESHOT   edge-triggered in P, with the one-shot done here: after one report the registration is
 *                  disarmed (its interest withdrawn, later edges ignored) until EPOLL_CTL_MOD re-arms it; MOD
 *                  re-checks readiness in the kernel, so readiness present at re-arm is reported.
 *   level          level-triggered in P, so E stays readable while the socket is. A wait fd can be readable for
 *                  another waiter's sake (rule 3); a level registration that fires without its socket having
 *                  anything for it is "parked" edge-triggered until its next report, else P would stay readable
 *                  and every epoll_wait on E would spin. Parked registrations miss nothing: readiness that
 *                  appears later writes the wait fd, which is a new edge.
 *
 * Data of a wait fd in P: registration id << 25 | slot << 24 | fd (low 24 bits). Ids are never reused, so an event
 * from a registration P still holds for a wait fd that is gone from our tables (the socket layer moved to new
 * wait fds) is recognised, and the fd bits let us delete it.
 *
 * Locks: live_lock (the list of live wait_epoll objects) is taken before any object's lock; an object's lock is
 * never held across a blocking call and never while putting a reference to an object.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"
#include "intercept/fdtable.h"
#include "intercept/isock.h"
#include "intercept/libc.h"
#include "intercept/wait.h"

/* uthash must not exit() the host program on allocation failure: additions report it through this flag. */
static __thread bool hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = true)
#include <uthash.h>

/* fs/eventpoll.c: what may accompany EPOLLEXCLUSIVE. */
#define EXCLUSIVE_OK_BITS (EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP | EPOLLWAKEUP | EPOLLET | EPOLLEXCLUSIVE)

#define DATA_FD_BITS 24
#define DATA_FD_MASK ((1ULL << DATA_FD_BITS) - 1)
#define DATA_ID_SHIFT (DATA_FD_BITS + 1)

/* Events taken from P per expansion; each yields at most one application event. */
#define EXPAND_BATCH 64

struct registration;

/* One wait fd of a registration, as registered in P. */
struct wait_slot {
    int fd;                         /* the fd in P: the socket's wait fd, or a private dup of it */
    int source_fd;                  /* the socket's wait fd */
    short events;
    bool is_dup;
    struct registration *reg;
    UT_hash_handle hh;              /* wait_epoll.by_wait_fd, key fd */
};

/* One application registration of an intercepted socket in E (the kernel's key: file and fd number). */
struct registration {
    uint64_t id;
    struct rs_isock *sock;          /* held */
    int fd;                         /* the application's fd */
    uint32_t events;                /* as the application gave them, flags included */
    epoll_data_t data;
    uint32_t generation;            /* of the wait fds in P */
    unsigned interest;              /* added to the socket with rs_isock_interest, 0 when none */
    bool armed;                     /* false: EPOLLONESHOT registration that reported, until MOD */
    bool parked;                    /* level registration held edge-triggered in P (see the top of file) */
    bool listener;                  /* a listening socket: its POLLIN interest counts only during waits */
    struct registration *listen_next;   /* wait_epoll.listeners */
    uint64_t reported_in;           /* expansion batch of the last report: two wait fds, one event */
    int nwait;
    struct wait_slot wait[RS_ISOCK_WAIT_FDS];
    struct registration *same_sock_next;
    UT_hash_handle hh_id;           /* wait_epoll.by_id */
    UT_hash_handle hh_sock;         /* wait_epoll.by_sock: the first registration of each socket */
};

struct wait_epoll {
    struct rs_fd_obj obj;           /* RS_FD_EPOLL at the application's epoll fd (and its dups) */
    pthread_mutex_t lock;
    int private_fd;                 /* P */
    uint64_t marker;                /* data.u64 of P in E; atomic */
    uint64_t next_id;
    uint64_t batch;
    uint32_t fork_generation;
    struct registration *by_id;
    struct registration *by_sock;
    struct wait_slot *by_wait_fd;
    struct registration *listeners; /* registrations of listening sockets */
    int n_listeners;                /* atomic reads: no lock for E without listeners */
    struct wait_epoll *live_prev, *live_next;
    bool live;                      /* on the live list (not when creation failed half-way) */
};

static void register_fork_handlers(void);

static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct wait_epoll *live_head;

/* ---- the real calls ---- */

static int real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    if (RS_LIKELY(rs_real_epoll_ctl != NULL) || (rs_libc_init(), rs_real_epoll_ctl != NULL))
        return rs_real_epoll_ctl(epfd, op, fd, ev);
    return (int)syscall(SYS_epoll_ctl, epfd, op, fd, ev);
}

static int real_epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout_ms)
{
    if (RS_LIKELY(rs_real_epoll_wait != NULL) || (rs_libc_init(), rs_real_epoll_wait != NULL))
        return rs_real_epoll_wait(epfd, events, maxevents, timeout_ms);
    return (int)syscall(SYS_epoll_pwait, epfd, events, maxevents, timeout_ms, NULL, (size_t)0);
}

static int real_epoll_pwait(int epfd, struct epoll_event *events, int maxevents, int timeout_ms,
                            const sigset_t *sigmask)
{
    if (RS_LIKELY(rs_real_epoll_pwait != NULL) || (rs_libc_init(), rs_real_epoll_pwait != NULL))
        return rs_real_epoll_pwait(epfd, events, maxevents, timeout_ms, sigmask);
    return (int)syscall(SYS_epoll_pwait, epfd, events, maxevents, timeout_ms, sigmask, (size_t)(_NSIG / 8));
}

static int real_epoll_pwait2(int epfd, struct epoll_event *events, int maxevents, const struct timespec *timeout,
                             const sigset_t *sigmask)
{
    if (RS_LIKELY(rs_real_epoll_pwait2 != NULL) || (rs_libc_init(), rs_real_epoll_pwait2 != NULL))
        return rs_real_epoll_pwait2(epfd, events, maxevents, timeout, sigmask);
#ifdef SYS_epoll_pwait2
    return (int)syscall(SYS_epoll_pwait2, epfd, events, maxevents, timeout, sigmask, (size_t)(_NSIG / 8));
#else
    errno = ENOSYS;
    return -1;
#endif
}

static void close_internal(int fd)
{
    rs_fd_unmark_internal(fd);
    RS_REAL(close)(fd);
}

/* ---- tables ---- */

static struct registration *find_by_id(struct wait_epoll *ep, uint64_t id)
{
    struct registration *reg;
    HASH_FIND(hh_id, ep->by_id, &id, sizeof(id), reg);
    return reg;
}

static struct registration *find_registration(struct wait_epoll *ep, struct rs_isock *sock, int fd)
{
    struct registration *reg;
    HASH_FIND(hh_sock, ep->by_sock, &sock, sizeof(sock), reg);
    while (reg && reg->fd != fd)
        reg = reg->same_sock_next;
    return reg;
}

static struct wait_slot *find_slot(struct wait_epoll *ep, int fd)
{
    struct wait_slot *slot;
    HASH_FIND_INT(ep->by_wait_fd, &fd, slot);
    return slot;
}

static bool link_registration(struct wait_epoll *ep, struct registration *reg)
{
    hash_oom = false;
    HASH_ADD(hh_id, ep->by_id, id, sizeof(reg->id), reg);
    if (hash_oom)
        return false;
    struct registration *head;
    HASH_FIND(hh_sock, ep->by_sock, &reg->sock, sizeof(reg->sock), head);
    if (head) {
        reg->same_sock_next = head->same_sock_next;
        head->same_sock_next = reg;
        return true;
    }
    reg->same_sock_next = NULL;
    HASH_ADD(hh_sock, ep->by_sock, sock, sizeof(reg->sock), reg);
    if (hash_oom) {
        HASH_DELETE(hh_id, ep->by_id, reg);
        return false;
    }
    return true;
}

static void unlink_registration(struct wait_epoll *ep, struct registration *reg)
{
    HASH_DELETE(hh_id, ep->by_id, reg);
    struct registration *head;
    HASH_FIND(hh_sock, ep->by_sock, &reg->sock, sizeof(reg->sock), head);
    if (head == reg) {
        HASH_DELETE(hh_sock, ep->by_sock, reg);
        struct registration *next = reg->same_sock_next;
        if (next) {
            hash_oom = false;
            HASH_ADD(hh_sock, ep->by_sock, sock, sizeof(next->sock), next);
            if (hash_oom)
                RS_WARN("epoll: out of memory; a socket registered twice in one epoll set lost its index");
        }
    } else {
        for (struct registration *prev = head; prev; prev = prev->same_sock_next) {
            if (prev->same_sock_next == reg) {
                prev->same_sock_next = reg->same_sock_next;
                break;
            }
        }
    }
    reg->same_sock_next = NULL;
}

/* ---- registrations in P ---- */

static uint32_t private_flags(const struct registration *reg)
{
    return (reg->events & (EPOLLET | EPOLLONESHOT)) || reg->parked ? EPOLLET : 0;
}

static uint64_t slot_data(const struct registration *reg, int index, int fd)
{
    uint64_t fd_bits = (uint64_t)fd <= DATA_FD_MASK ? (uint64_t)fd : DATA_FD_MASK;
    return reg->id << DATA_ID_SHIFT | (uint64_t)index << DATA_FD_BITS | fd_bits;
}

static void set_interest(struct registration *reg, bool on)
{
    unsigned want = on ? rs_wait_interest_of(reg->events) : 0;
    if (reg->listener)
        want &= ~(unsigned)POLLIN;      /* added by each wait instead (listeners_wait_begin) */
    if (want == reg->interest)
        return;
    /* Add before removing: a bit wanted by both never drops to zero in between. */
    if (want)
        rs_isock_interest(reg->sock, want, +1);
    if (reg->interest)
        rs_isock_interest(reg->sock, reg->interest, -1);
    reg->interest = want;
}

/* Registers a private dup of slot->source_fd: the socket's wait fd itself is in P for another registration
 * (the same socket under two of the application's fds, both in E). */
static int add_dup(struct wait_epoll *ep, struct registration *reg, int index, struct epoll_event *ev)
{
    struct wait_slot *slot = &reg->wait[index];
    int dup_fd = RS_REAL(fcntl)(slot->source_fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0)
        return -1;
    rs_fd_mark_internal(dup_fd);
    ev->data.u64 = slot_data(reg, index, dup_fd);
    if (real_epoll_ctl(ep->private_fd, EPOLL_CTL_ADD, dup_fd, ev) < 0) {
        int saved_errno = errno;
        close_internal(dup_fd);
        errno = saved_errno;
        return -1;
    }
    slot->fd = dup_fd;
    slot->is_dup = true;
    return 0;
}

/*
 * Takes the registration's wait fds out of P. Its own dups always go. A wait fd of the socket is deleted only
 * while it is certainly still the socket's (same generation) and no other registration uses that number; a
 * wait fd the socket already dropped may have been closed and its number reused, and the kernel forgets it when
 * its file closes anyway (or expand() deletes it at its first event).
 */
static void unregister_wait_fds(struct wait_epoll *ep, struct registration *reg)
{
    bool current = reg->nwait > 0 && rs_isock_generation(reg->sock) == reg->generation;
    for (int j = 0; j < reg->nwait; j++) {
        struct wait_slot *slot = &reg->wait[j];
        HASH_DEL(ep->by_wait_fd, slot);
        if (slot->is_dup) {
            real_epoll_ctl(ep->private_fd, EPOLL_CTL_DEL, slot->fd, NULL);
            close_internal(slot->fd);
        } else if (current && find_slot(ep, slot->fd) == NULL) {
            real_epoll_ctl(ep->private_fd, EPOLL_CTL_DEL, slot->fd, NULL);
        }
    }
    reg->nwait = 0;
}

/* Puts the socket's current wait fds in P. On failure nothing of the registration is left in P. */
static int register_wait_fds(struct wait_epoll *ep, struct registration *reg)
{
    struct pollfd wait[RS_ISOCK_WAIT_FDS];
    reg->generation = rs_isock_generation(reg->sock);
    int n = rs_isock_wait_fds(reg->sock, reg->fd, rs_wait_interest_of(reg->events), wait);
    reg->nwait = 0;
    for (int j = 0; j < n; j++) {
        struct wait_slot *slot = &reg->wait[j];
        *slot = (struct wait_slot){ .fd = wait[j].fd, .source_fd = wait[j].fd, .events = wait[j].events, .reg = reg };
        struct epoll_event ev = {
            .events = (uint32_t)(unsigned short)wait[j].events | private_flags(reg),
            .data.u64 = slot_data(reg, j, wait[j].fd),
        };
        int rc = real_epoll_ctl(ep->private_fd, EPOLL_CTL_ADD, slot->fd, &ev);
        if (rc < 0 && errno == EEXIST) {
            /* Nobody of ours has the number: what P holds is a leftover of an earlier generation, take it
             * over. Otherwise another registration has it, and a dup gives this one its own key. */
            if (find_slot(ep, slot->fd) == NULL)
                rc = real_epoll_ctl(ep->private_fd, EPOLL_CTL_MOD, slot->fd, &ev);
            else
                rc = add_dup(ep, reg, j, &ev);
        }
        if (rc == 0) {
            hash_oom = false;
            HASH_ADD_INT(ep->by_wait_fd, fd, slot);
            if (hash_oom) {
                real_epoll_ctl(ep->private_fd, EPOLL_CTL_DEL, slot->fd, NULL);
                if (slot->is_dup)
                    close_internal(slot->fd);
                errno = ENOMEM;
                rc = -1;
            }
        }
        if (rc < 0) {
            int saved_errno = errno;
            unregister_wait_fds(ep, reg);
            errno = saved_errno;
            return -1;
        }
        reg->nwait = j + 1;
    }
    return 0;
}

/* Rewrites the P registrations of the wait fds (flags changed); the kernel re-checks readiness on MOD. */
static void modify_wait_fds(struct wait_epoll *ep, struct registration *reg)
{
    for (int j = 0; j < reg->nwait; j++) {
        struct wait_slot *slot = &reg->wait[j];
        struct epoll_event ev = {
            .events = (uint32_t)(unsigned short)slot->events | private_flags(reg),
            .data.u64 = slot_data(reg, j, slot->fd),
        };
        real_epoll_ctl(ep->private_fd, EPOLL_CTL_MOD, slot->fd, &ev);
    }
}

/* The socket moved to other wait fds (rule 4) or the process forked: register afresh under a new id, so that
 * events still queued for the old registrations are recognised as stale. */
static void reregister(struct wait_epoll *ep, struct registration *reg)
{
    unregister_wait_fds(ep, reg);
    HASH_DELETE(hh_id, ep->by_id, reg);
    reg->id = ep->next_id++;
    hash_oom = false;
    HASH_ADD(hh_id, ep->by_id, id, sizeof(reg->id), reg);
    if (hash_oom || register_wait_fds(ep, reg) < 0)
        RS_WARN("epoll: fd %d could not follow its socket to new wait fds (%s); it will not be reported",
                reg->fd, hash_oom ? "out of memory" : strerror(errno));
}

/* Removes a registration from every table and from P; the caller puts reg->sock and frees reg. */
static void drop_registration(struct wait_epoll *ep, struct registration *reg)
{
    if (reg->listener) {
        for (struct registration **pp = &ep->listeners; *pp; pp = &(*pp)->listen_next) {
            if (*pp == reg) {
                *pp = reg->listen_next;
                __atomic_store_n(&ep->n_listeners, ep->n_listeners - 1, __ATOMIC_RELAXED);
                break;
            }
        }
    }
    unlink_registration(ep, reg);
    unregister_wait_fds(ep, reg);
    set_interest(reg, false);
}

/* ---- the per-E object ---- */

static void destroy_epoll(struct rs_fd_obj *obj)
{
    struct wait_epoll *ep = (struct wait_epoll *)obj;
    pthread_mutex_lock(&live_lock);
    if (ep->live) {
        if (ep->live_prev)
            ep->live_prev->live_next = ep->live_next;
        else
            live_head = ep->live_next;
        if (ep->live_next)
            ep->live_next->live_prev = ep->live_prev;
    }
    pthread_mutex_unlock(&live_lock);

    /* Unreachable now: no table entry, no reference, not on the live list. Closing P empties it. */
    struct registration *reg, *tmp;
    HASH_ITER(hh_id, ep->by_id, reg, tmp) {
        HASH_DELETE(hh_id, ep->by_id, reg);
        for (int j = 0; j < reg->nwait; j++)
            if (reg->wait[j].is_dup)
                close_internal(reg->wait[j].fd);
        set_interest(reg, false);
        rs_isock_put(reg->sock);
        free(reg);
    }
    HASH_CLEAR(hh_sock, ep->by_sock);
    HASH_CLEAR(hh, ep->by_wait_fd);
    close_internal(ep->private_fd);
    pthread_mutex_destroy(&ep->lock);
    free(ep);
}

static struct wait_epoll *get_epoll(int epfd)
{
    if (RS_LIKELY(!rs_fd_any(RS_FD_EPOLL)))
        return NULL;
    return (struct wait_epoll *)rs_fd_get_type(epfd, RS_FD_EPOLL);
}

/* The object of epfd, created on the first intercepted socket E receives. NULL with errno when epfd is not an
 * epoll fd (EBADF, EINVAL: the kernel's answers, obtained by registering P in it). */
static struct wait_epoll *get_or_create_epoll(int epfd)
{
    static pthread_once_t fork_handlers_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_handlers_once, register_fork_handlers);
    pthread_mutex_lock(&create_lock);
    struct wait_epoll *ep = get_epoll(epfd);
    if (ep) {
        pthread_mutex_unlock(&create_lock);
        return ep;
    }
    /* P must not take the number of an epfd that is not open (it would then be asked to hold itself). */
    int saved_errno = EBADF;
    if (RS_REAL(fcntl)(epfd, F_GETFD) < 0)
        goto fail;
    saved_errno = ENOMEM;
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        goto fail;
    ep->private_fd = RS_REAL(epoll_create1)(EPOLL_CLOEXEC);
    if (ep->private_fd < 0) {
        saved_errno = errno;
        goto fail;
    }
    rs_fd_mark_internal(ep->private_fd);
    /* A live heap address: no application registration made before we came can carry it as a pointer. */
    ep->marker = (uint64_t)(uintptr_t)ep;
    ep->next_id = 1;
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = ep->marker };
    if (real_epoll_ctl(epfd, EPOLL_CTL_ADD, ep->private_fd, &ev) < 0) {
        saved_errno = errno;
        close_internal(ep->private_fd);
        goto fail;
    }
    pthread_mutex_init(&ep->lock, NULL);
    ep->fork_generation = rs_isock_fork_generation();
    rs_fd_obj_init(&ep->obj, RS_FD_EPOLL, destroy_epoll);
    int err = 0;
    struct rs_fd_obj *old = rs_fd_set(epfd, &ep->obj, &err);
    if (err) {
        /* An fd beyond the table: the socket cannot be followed there. The creator's reference destroys ep. */
        pthread_mutex_unlock(&create_lock);
        real_epoll_ctl(epfd, EPOLL_CTL_DEL, ep->private_fd, NULL);
        rs_fd_obj_put(&ep->obj);
        errno = -err;
        return NULL;
    }
    if (old)
        rs_fd_obj_put(old);
    pthread_mutex_lock(&live_lock);
    ep->live_next = live_head;
    if (live_head)
        live_head->live_prev = ep;
    live_head = ep;
    ep->live = true;
    pthread_mutex_unlock(&live_lock);
    pthread_mutex_unlock(&create_lock);
    return ep;                      /* with the creator's reference */

fail:
    pthread_mutex_unlock(&create_lock);
    free(ep);
    errno = saved_errno;
    return NULL;
}

/* An application registration of a kernel fd carries our marker: move P to another one. */
static void change_marker(struct wait_epoll *ep, int epfd, uint64_t taken)
{
    pthread_mutex_lock(&ep->lock);
    uint64_t marker = __atomic_load_n(&ep->marker, __ATOMIC_RELAXED);
    if (marker == taken) {
        marker += 0x9e3779b97f4a7c15ULL;
        struct epoll_event ev = { .events = EPOLLIN, .data.u64 = marker };
        if (real_epoll_ctl(epfd, EPOLL_CTL_MOD, ep->private_fd, &ev) == 0)
            __atomic_store_n(&ep->marker, marker, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&ep->lock);
}

/* ---- epoll_ctl on an intercepted socket ---- */

static int ctl_add(struct wait_epoll *ep, struct rs_isock *sock, int fd, const struct epoll_event *event)
{
    if (find_registration(ep, sock, fd)) {
        errno = EEXIST;
        return -1;
    }
    struct registration *reg = calloc(1, sizeof(*reg));
    if (reg == NULL) {
        errno = ENOMEM;
        return -1;
    }
    reg->id = ep->next_id++;
    reg->sock = sock;
    reg->fd = fd;
    reg->events = event->events & ~(uint32_t)EPOLLWAKEUP;
    reg->data = event->data;
    reg->armed = true;
    reg->listener = rs_isock_listener(sock);
    set_interest(reg, true);
    int rc = register_wait_fds(ep, reg);
    if (rc == 0 && !link_registration(ep, reg)) {
        unregister_wait_fds(ep, reg);
        errno = ENOMEM;
        rc = -1;
    }
    if (rc < 0) {
        int saved_errno = errno;
        set_interest(reg, false);
        free(reg);
        errno = saved_errno;
        return -1;
    }
    rs_fd_obj_hold(rs_isock_obj(sock));     /* the registration's own reference */
    if (reg->listener) {
        reg->listen_next = ep->listeners;
        ep->listeners = reg;
        __atomic_store_n(&ep->n_listeners, ep->n_listeners + 1, __ATOMIC_RELAXED);
    }
    return 0;
}

static bool same_wait_fds(const struct registration *reg, const struct pollfd *wait, int n)
{
    if (n != reg->nwait)
        return false;
    for (int j = 0; j < n; j++)
        if (wait[j].fd != reg->wait[j].source_fd || wait[j].events != reg->wait[j].events)
            return false;
    return true;
}

static int ctl_mod(struct wait_epoll *ep, struct registration *reg, const struct epoll_event *event)
{
    if ((reg->events & EPOLLEXCLUSIVE) || (event->events & EPOLLEXCLUSIVE)) {
        errno = EINVAL;
        return -1;
    }
    reg->events = event->events & ~(uint32_t)EPOLLWAKEUP;
    reg->data = event->data;
    reg->armed = true;
    reg->parked = false;
    set_interest(reg, true);

    struct pollfd wait[RS_ISOCK_WAIT_FDS];
    int n = rs_isock_wait_fds(reg->sock, reg->fd, rs_wait_interest_of(reg->events), wait);
    if (rs_isock_generation(reg->sock) == reg->generation && same_wait_fds(reg, wait, n)) {
        modify_wait_fds(ep, reg);       /* the usual MOD: same fds, new flags; one syscall per wait fd */
        return 0;
    }
    reregister(ep, reg);
    return 0;
}

static bool check_exclusive(int op, const struct epoll_event *event)
{
    if (op == EPOLL_CTL_DEL || !(event->events & EPOLLEXCLUSIVE))
        return true;
    return op == EPOLL_CTL_ADD && !(event->events & ~(uint32_t)EXCLUSIVE_OK_BITS);
}

static int ctl_socket(int epfd, int op, int fd, struct epoll_event *event, struct rs_isock *sock)
{
    /* The kernel's order: the event is copied in first (every op but DEL has one), the op is judged last. */
    if (op != EPOLL_CTL_DEL && event == NULL) {
        errno = EFAULT;
        return -1;
    }
    if (op != EPOLL_CTL_ADD && op != EPOLL_CTL_DEL && op != EPOLL_CTL_MOD) {
        if (RS_REAL(fcntl)(epfd, F_GETFD) < 0)
            errno = EBADF;
        else
            errno = EINVAL;
        return -1;
    }
    struct wait_epoll *ep = get_epoll(epfd);
    if (ep == NULL && op != EPOLL_CTL_ADD) {
        /* Never registered here through us: the kernel gives ENOENT, or EBADF/EINVAL for a bad epfd. */
        return real_epoll_ctl(epfd, op, fd, event);
    }
    if (!check_exclusive(op, event)) {
        if (ep)
            rs_fd_obj_put(&ep->obj);
        /* The kernel reports a bad epfd before a bad flag combination. */
        if (RS_REAL(fcntl)(epfd, F_GETFD) < 0)
            errno = EBADF;
        else
            errno = EINVAL;
        return -1;
    }
    if (ep == NULL) {
        ep = get_or_create_epoll(epfd);
        if (ep == NULL)
            return -1;
    }

    int rc = 0;
    struct registration *dropped = NULL;
    pthread_mutex_lock(&ep->lock);
    struct registration *reg = find_registration(ep, sock, fd);
    if (op == EPOLL_CTL_ADD) {
        rc = ctl_add(ep, sock, fd, event);
    } else if (reg == NULL) {
        errno = ENOENT;
        rc = -1;
    } else if (op == EPOLL_CTL_MOD) {
        rc = ctl_mod(ep, reg, event);
    } else {
        drop_registration(ep, reg);
        dropped = reg;
    }
    pthread_mutex_unlock(&ep->lock);

    int saved_errno = errno;
    if (dropped) {
        rs_isock_put(dropped->sock);
        free(dropped);
    }
    rs_fd_obj_put(&ep->obj);
    errno = saved_errno;
    return rc;
}

/* ---- epoll_wait and friends ---- */

enum wait_variant { WAIT, PWAIT, PWAIT2 };

struct wait_args {
    enum wait_variant variant;
    int timeout_ms;                 /* WAIT, PWAIT */
    const struct timespec *timeout; /* PWAIT2 */
    const sigset_t *sigmask;
};

static int call_real_wait(int epfd, struct epoll_event *events, int maxevents, const struct wait_args *args)
{
    switch (args->variant) {
    case WAIT:
        return real_epoll_wait(epfd, events, maxevents, args->timeout_ms);
    case PWAIT:
        return real_epoll_pwait(epfd, events, maxevents, args->timeout_ms, args->sigmask);
    case PWAIT2:
    default:
        return real_epoll_pwait2(epfd, events, maxevents, args->timeout, args->sigmask);
    }
}

/* After fork the socket layer may have given sockets new wait fds: check every registration once. */
static void revalidate_after_fork(struct wait_epoll *ep, uint32_t fork_generation)
{
    pthread_mutex_lock(&ep->lock);
    if (ep->fork_generation != fork_generation) {
        __atomic_store_n(&ep->fork_generation, fork_generation, __ATOMIC_RELAXED);
        struct registration *reg, *tmp;
        HASH_ITER(hh_id, ep->by_id, reg, tmp) {
            if (rs_isock_generation(reg->sock) != reg->generation)
                reregister(ep, reg);
        }
    }
    pthread_mutex_unlock(&ep->lock);
}

/* An event from P whose registration is gone: delete it from P by its fd, unless that number now belongs to
 * a live registration (then the event came from an older file under the same number, which the kernel drops
 * when that file closes). */
static void forget_stale(struct wait_epoll *ep, uint64_t data)
{
    int fd = (int)(data & DATA_FD_MASK);
    if ((uint64_t)fd != DATA_FD_MASK && find_slot(ep, fd) == NULL)
        real_epoll_ctl(ep->private_fd, EPOLL_CTL_DEL, fd, NULL);
}

/* Turns what P has into at most `room` application events. Called with ep->lock held. */
static int expand(struct wait_epoll *ep, struct epoll_event *out, int room)
{
    struct epoll_event fired[EXPAND_BATCH];
    int n = real_epoll_wait(ep->private_fd, fired, room < EXPAND_BATCH ? room : EXPAND_BATCH, 0);
    uint64_t batch = ++ep->batch;
    int count = 0;
    for (int i = 0; i < n; i++) {
        struct registration *reg = find_by_id(ep, fired[i].data.u64 >> DATA_ID_SHIFT);
        if (reg == NULL) {
            forget_stale(ep, fired[i].data.u64);
            continue;
        }
        if (reg->reported_in == batch || !reg->armed)
            continue;
        unsigned mask = rs_isock_poll(reg->sock, reg->fd);
        uint32_t report = rs_wait_report(mask, reg->events);
        if (rs_isock_generation(reg->sock) != reg->generation)
            reregister(ep, reg);
        if (report) {
            out[count].events = report;
            out[count].data = reg->data;
            count++;
            reg->reported_in = batch;
            if (reg->events & EPOLLONESHOT) {
                reg->armed = false;
                set_interest(reg, false);
            } else if (reg->parked) {
                reg->parked = false;    /* level-triggered again while it has something */
                modify_wait_fds(ep, reg);
            }
        } else if (!(reg->events & (EPOLLET | EPOLLONESHOT)) && !reg->parked) {
            reg->parked = true;
            modify_wait_fds(ep, reg);
        }
    }
    return count;
}

/* Turns one batch from the real wait into application events: P's marker is replaced by what P has. */
static int filter_events(struct wait_epoll *ep, struct epoll_event *events, int n, int maxevents)
{
    uint64_t marker = __atomic_load_n(&ep->marker, __ATOMIC_RELAXED);
    int count = 0;
    bool from_private = false;
    for (int i = 0; i < n; i++) {
        if (events[i].data.u64 == marker)
            from_private = true;
        else
            events[count++] = events[i];
    }
    if (from_private) {
        pthread_mutex_lock(&ep->lock);
        count += expand(ep, events + count, maxevents - count);
        pthread_mutex_unlock(&ep->lock);
    }
    return count;
}

static int64_t deadline_of(const struct wait_args *args)
{
    if (args->variant == PWAIT2)
        return rs_wait_deadline(args->timeout);
    struct timespec ts = { args->timeout_ms / 1000, (long)(args->timeout_ms % 1000) * 1000000 };
    return rs_wait_deadline(args->timeout_ms < 0 ? NULL : &ts);
}

/*
 * A listener in E is waited for (POLLIN interest on its socket) only while a thread sleeps in epoll_wait on E, as a
 * thread in accept or poll waits for it only during the call. A prefork family's shared backlog gives connections to
 * the processes that wait (docs/interception.md, "Processes"): a process busy with a connection, whose listener
 * merely sits in its set, must not take one it may exit without accepting.
 */
#define LISTEN_WAIT_MAX 8

static int listeners_wait_begin(struct wait_epoll *ep, struct rs_isock **socks)
{
    int n = 0;
    pthread_mutex_lock(&ep->lock);
    for (struct registration *r = ep->listeners; r && n < LISTEN_WAIT_MAX; r = r->listen_next) {
        if (!r->armed || !(r->events & EPOLLIN))
            continue;
        rs_fd_obj_hold(rs_isock_obj(r->sock));
        socks[n++] = r->sock;
    }
    pthread_mutex_unlock(&ep->lock);
    for (int i = 0; i < n; i++)
        rs_isock_interest(socks[i], POLLIN, +1);
    return n;
}

static void listeners_wait_end(struct rs_isock **socks, int n)
{
    int saved_errno = errno;
    for (int i = 0; i < n; i++) {
        rs_isock_interest(socks[i], POLLIN, -1);
        rs_isock_put(socks[i]);
    }
    errno = saved_errno;
}

/*
 * The wait proper on an E that holds intercepted sockets. `pending` events already came back from a first real
 * wait (the caller's pass-through, when E got its first socket while it slept); 0 makes the first wait here.
 */
static int wait_sockets(struct wait_epoll *ep, int epfd, struct epoll_event *events, int maxevents,
                        const struct wait_args *args, int64_t deadline, int pending)
{
    struct wait_args again = *args;
    struct timespec left;
    for (bool first = pending == 0;; first = false) {
        int n = pending;
        pending = 0;
        /* Held until the events are read: dropping the interest takes back the listener's notification. */
        struct rs_isock *waited[LISTEN_WAIT_MAX];
        int nw = 0;
        if (n == 0) {
            uint32_t fork_generation = rs_isock_fork_generation();
            if (RS_UNLIKELY(__atomic_load_n(&ep->fork_generation, __ATOMIC_RELAXED) != fork_generation))
                revalidate_after_fork(ep, fork_generation);
            if (!first) {
                again.timeout_ms = rs_wait_remaining_ms(deadline);
                if (deadline != RS_WAIT_FOREVER) {
                    rs_wait_remaining_ts(deadline, &left);
                    again.timeout = &left;
                }
            }
            if (__atomic_load_n(&ep->n_listeners, __ATOMIC_RELAXED))
                nw = listeners_wait_begin(ep, waited);
            n = call_real_wait(epfd, events, maxevents, &again);
            if (n <= 0) {
                listeners_wait_end(waited, nw);
                return n;
            }
        }
        int count = filter_events(ep, events, n, maxevents);
        listeners_wait_end(waited, nw);
        if (count > 0)
            return count;
        /* Everything was for nothing (another waiter's readiness, a disarmed one-shot): wait out the rest. */
        if (rs_wait_remaining_ms(deadline) == 0)
            return 0;
    }
}

/* After a real wait that found no object for E: another thread may have given E its first socket (and so P's
 * marker) while this one slept. */
static int after_plain_wait(int epfd, struct epoll_event *events, int maxevents, const struct wait_args *args,
                            int n)
{
    struct wait_epoll *ep;
    if (n <= 0 || (ep = get_epoll(epfd)) == NULL)
        return n;
    int64_t deadline = deadline_of(args);  /* from now: this rare case may wait a little longer */
    int result = wait_sockets(ep, epfd, events, maxevents, args, deadline, n);
    int saved_errno = errno;
    rs_fd_obj_put(&ep->obj);
    errno = saved_errno;
    return result;
}

static int epoll_wait_common(int epfd, struct epoll_event *events, int maxevents, const struct wait_args *args)
{
    struct wait_epoll *ep = get_epoll(epfd);
    if (RS_LIKELY(ep == NULL))
        return after_plain_wait(epfd, events, maxevents, args, call_real_wait(epfd, events, maxevents, args));
    if (maxevents <= 0 || (size_t)maxevents > INT_MAX / sizeof(struct epoll_event)) {
        rs_fd_obj_put(&ep->obj);
        return call_real_wait(epfd, events, maxevents, args);   /* the kernel's EINVAL */
    }
    int result = wait_sockets(ep, epfd, events, maxevents, args, deadline_of(args), 0);
    int saved_errno = errno;
    rs_fd_obj_put(&ep->obj);
    errno = saved_errno;
    return result;
}

/* ---- the interposers ---- */

RS_EXPORT int epoll_create(int size)
{
    if (RS_LIKELY(rs_real_epoll_create != NULL) || (rs_libc_init(), rs_real_epoll_create != NULL))
        return rs_real_epoll_create(size);
    if (size <= 0) {
        errno = EINVAL;
        return -1;
    }
    return (int)syscall(SYS_epoll_create1, 0);
}

RS_EXPORT int epoll_create1(int flags)
{
    if (RS_LIKELY(rs_real_epoll_create1 != NULL) || (rs_libc_init(), rs_real_epoll_create1 != NULL))
        return rs_real_epoll_create1(flags);
    return (int)syscall(SYS_epoll_create1, flags);
}

RS_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)
{
    struct rs_isock *sock = rs_fd_any(RS_FD_SOCK) ? rs_isock_get(fd) : NULL;
    if (sock) {
        int rc = ctl_socket(epfd, op, fd, event, sock);
        /* A registration took its own reference (ctl_add); ours goes either way. */
        int saved_errno = errno;
        rs_isock_put(sock);
        errno = saved_errno;
        return rc;
    }
    struct wait_epoll *ep = get_epoll(epfd);
    int rc = real_epoll_ctl(epfd, op, fd, event);
    if (ep) {
        int saved_errno = errno;
        if (rc == 0 && op != EPOLL_CTL_DEL && event &&
            event->data.u64 == __atomic_load_n(&ep->marker, __ATOMIC_RELAXED))
            change_marker(ep, epfd, event->data.u64);
        rs_fd_obj_put(&ep->obj);
        errno = saved_errno;
    }
    return rc;
}

RS_EXPORT int epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout)
{
    /* The common case, a process without epoll sets holding rdmasock sockets, kept to two flag tests. */
    if (RS_LIKELY(!rs_fd_any(RS_FD_EPOLL))) {
        int n = real_epoll_wait(epfd, events, maxevents, timeout);
        if (RS_LIKELY(!rs_fd_any(RS_FD_EPOLL)))
            return n;
        struct wait_args args = { .variant = WAIT, .timeout_ms = timeout };
        return after_plain_wait(epfd, events, maxevents, &args, n);
    }
    struct wait_args args = { .variant = WAIT, .timeout_ms = timeout };
    return epoll_wait_common(epfd, events, maxevents, &args);
}

RS_EXPORT int epoll_pwait(int epfd, struct epoll_event *events, int maxevents, int timeout, const sigset_t *sigmask)
{
    struct wait_args args = { .variant = PWAIT, .timeout_ms = timeout, .sigmask = sigmask };
    return epoll_wait_common(epfd, events, maxevents, &args);
}

RS_EXPORT int epoll_pwait2(int epfd, struct epoll_event *events, int maxevents, const struct timespec *timeout,
                           const sigset_t *sigmask)
{
    struct wait_args args = { .variant = PWAIT2, .timeout = timeout, .sigmask = sigmask };
    return epoll_wait_common(epfd, events, maxevents, &args);
}

/* ---- hooks ---- */

void rs_wait_isock_closed(struct rs_isock *sock)
{
    if (__atomic_load_n(&live_head, __ATOMIC_RELAXED) == NULL)
        return;
    struct registration *dropped = NULL;
    pthread_mutex_lock(&live_lock);
    for (struct wait_epoll *ep = live_head; ep; ep = ep->live_next) {
        pthread_mutex_lock(&ep->lock);
        struct registration *reg;
        HASH_FIND(hh_sock, ep->by_sock, &sock, sizeof(sock), reg);
        while (reg) {
            struct registration *next = reg->same_sock_next;
            drop_registration(ep, reg);
            reg->same_sock_next = dropped;
            dropped = reg;
            reg = next;
        }
        pthread_mutex_unlock(&ep->lock);
    }
    pthread_mutex_unlock(&live_lock);
    /* The caller holds sock, so none of these puts is the last. */
    while (dropped) {
        struct registration *next = dropped->same_sock_next;
        rs_isock_put(dropped->sock);
        free(dropped);
        dropped = next;
    }
}

/* Every lock of this file is taken around fork so that none is held by a thread that does not exist in the
 * child. No lock is held across a blocking call, so prepare waits only for short critical sections. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&create_lock);
    pthread_mutex_lock(&live_lock);
    for (struct wait_epoll *ep = live_head; ep; ep = ep->live_next)
        pthread_mutex_lock(&ep->lock);
}

static void fork_release(void)
{
    for (struct wait_epoll *ep = live_head; ep; ep = ep->live_next)
        pthread_mutex_unlock(&ep->lock);
    pthread_mutex_unlock(&live_lock);
    pthread_mutex_unlock(&create_lock);
}

static void register_fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_release, fork_release);
}
