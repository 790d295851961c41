/*
 * sdp_family.c: one RDMA listener for a whole family of forked processes (prefork servers on verbs).
 *
 * On verbs an rdma_cm listener belongs to one process, and only one process can listen on a port. So the process
 * that holds the listener of port P when it forks (the prefork parent, which never accepts) keeps it and becomes
 * the family's dispatcher ("holder"). Every other process of the family that waits on its copy of the listening
 * socket listens on an ephemeral port Q of the same address ("member") and says so in a table of shared memory that
 * the holder created before the fork (MAP_SHARED, inherited). The holder answers a connection request on P itself
 * when its own application waits for one; otherwise it rejects it with private data that says "redirect to Q" for a
 * member that waits, and the client's SDP connect follows (sdp_conn.c). No member waiting: the request is held
 * briefly, then given to the members round-robin (or, with no member at all, accepted by the holder).
 *
 * The table holds no locks: entries are claimed with a compare-and-swap on the pid and every field is read and
 * written atomically, so a process that dies at any instant leaves nothing locked. A dead member's entry is
 * reclaimed by the holder when it would have picked it (its pid no longer exists), so it never swallows connections.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sockaddr.h"
#include "sdp_stream/sdp_int.h"

#define FAMILY_MAGIC 0x52534641u    /* "RSFA" */

struct family_slot {
    int32_t pid;                    /* 0: free */
    uint16_t port;                  /* the member's listening port (host order); 0 while it sets up */
    uint8_t state;                  /* enum rs_sdp_member_state */
    uint8_t holder;                 /* the holder's own entry (its port is P) */
    uint64_t assigned_ms;           /* when the holder last sent this member a connection */
};

struct sdp_family {
    uint32_t magic;
    int32_t holder_pid;             /* 0 once the holder closed its listener: the family is over */
    uint32_t rr;                    /* round-robin cursor */
    uint32_t pad;
    struct family_slot slot[RS_SDP_FAMILY_SLOTS];
};

/* Process-local: which families this process knows, by listening address. A forked child inherits the array
 * (and the mappings it points to), which is how its listener finds the family of its address. */
#define REGISTRY_MAX 16
static struct {
    struct sockaddr_storage addr;
    struct sdp_family *fam;
    pid_t creator;
} registry[REGISTRY_MAX];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

bool rs_sdp_family_pid_alive(pid_t pid)
{
    /* EPERM: it exists under other credentials (a child that dropped root). */
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

struct sdp_family *rs_sdp_family_create(const struct sockaddr_storage *addr, int *holder_slot)
{
    struct sdp_family *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (f == MAP_FAILED)
        return NULL;
    memset(f, 0, sizeof(*f));
    f->magic = FAMILY_MAGIC;
    f->holder_pid = (int32_t)getpid();
    f->slot[0].pid = (int32_t)getpid();
    f->slot[0].holder = 1;
    f->slot[0].port = (uint16_t)(addr->ss_family == AF_INET6 ? ntohs(((const struct sockaddr_in6 *)addr)->sin6_port)
                                                             : ntohs(((const struct sockaddr_in *)addr)->sin_port));
    f->slot[0].state = RS_SDP_MEMBER_IDLE;
    *holder_slot = 0;
    pthread_mutex_lock(&registry_lock);
    bool stored = false;
    for (int i = 0; i < REGISTRY_MAX && !stored; i++) {
        /* A family whose holder is gone (or that another process created) is forgotten first. */
        if (registry[i].fam && (LOAD(&registry[i].fam->holder_pid) == 0 || rs_sockaddr_equal(&registry[i].addr, addr)))
            registry[i].fam = NULL;
        if (!registry[i].fam) {
            registry[i].addr = *addr;
            registry[i].fam = f;
            registry[i].creator = getpid();
            stored = true;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (!stored) {
        munmap(f, sizeof(*f));
        return NULL;
    }
    return f;
}

struct sdp_family *rs_sdp_family_find(const struct sockaddr_storage *addr)
{
    struct sdp_family *found = NULL;
    pid_t self = getpid();
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < REGISTRY_MAX && !found; i++) {
        struct sdp_family *f = registry[i].fam;
        if (!f || !rs_sockaddr_equal(&registry[i].addr, addr))
            continue;
        int32_t holder = LOAD(&f->holder_pid);
        /* Only a descendant joins: the holder itself listens on the port. */
        if (holder != 0 && holder != self && rs_sdp_family_pid_alive(holder))
            found = f;
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

int rs_sdp_family_join(struct sdp_family *f, uint16_t port)
{
    int32_t self = (int32_t)getpid();
    for (int i = 0; i < RS_SDP_FAMILY_SLOTS; i++) {
        struct family_slot *sl = &f->slot[i];
        int32_t pid = LOAD(&sl->pid);
        if (pid != 0 && !(pid != self && !sl->holder && !rs_sdp_family_pid_alive(pid)))
            continue;
        /* Free, or left behind by a member that died: claim it. */
        if (!__atomic_compare_exchange_n(&sl->pid, &pid, self, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        STORE(&sl->holder, 0);
        STORE(&sl->state, (uint8_t)RS_SDP_MEMBER_WAITING);
        STORE(&sl->assigned_ms, 0);
        STORE(&sl->port, port);
        return i;
    }
    return -ENOSPC;
}

void rs_sdp_family_leave(struct sdp_family *f, int slot, bool holder)
{
    if (!f || slot < 0 || slot >= RS_SDP_FAMILY_SLOTS)
        return;
    struct family_slot *sl = &f->slot[slot];
    int32_t self = (int32_t)getpid();
    if (LOAD(&sl->pid) != self)
        return;
    STORE(&sl->port, 0);
    STORE(&sl->state, (uint8_t)RS_SDP_MEMBER_IDLE);
    STORE(&sl->pid, 0);
    if (holder) {
        int32_t h = self;
        __atomic_compare_exchange_n(&f->holder_pid, &h, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        pthread_mutex_lock(&registry_lock);
        for (int i = 0; i < REGISTRY_MAX; i++) {
            if (registry[i].fam == f)
                registry[i].fam = NULL;
        }
        pthread_mutex_unlock(&registry_lock);
        /* Members still map it (their own copy of the mapping); this process's goes. */
        munmap(f, sizeof(*f));
    }
}

void rs_sdp_family_set_state(struct sdp_family *f, int slot, enum rs_sdp_member_state st, uint64_t now)
{
    if (!f || slot < 0 || slot >= RS_SDP_FAMILY_SLOTS)
        return;
    struct family_slot *sl = &f->slot[slot];
    if (LOAD(&sl->pid) != (int32_t)getpid())
        return;
    /* A member the holder just sent a connection to stays out of the choice until that connection arrived (or
     * the hand-over is clearly lost): otherwise an accept that finds nothing yet would call for a second one. */
    if (st == RS_SDP_MEMBER_WAITING && LOAD(&sl->state) == RS_SDP_MEMBER_ASSIGNED &&
        now < LOAD(&sl->assigned_ms) + RS_SDP_ASSIGN_GRACE_MS)
        return;
    STORE(&sl->state, (uint8_t)st);
}

enum rs_sdp_member_state rs_sdp_family_state(const struct sdp_family *f, int slot)
{
    if (!f || slot < 0 || slot >= RS_SDP_FAMILY_SLOTS)
        return RS_SDP_MEMBER_IDLE;
    return (enum rs_sdp_member_state)LOAD(&f->slot[slot].state);
}

/* A live member's entry, checked at the moment of choice; a dead one's is freed. */
static bool member_usable(struct sdp_family *f, int i, uint16_t *port)
{
    struct family_slot *sl = &f->slot[i];
    int32_t pid = LOAD(&sl->pid);
    uint16_t p = LOAD(&sl->port);
    if (pid == 0 || LOAD(&sl->holder) || p == 0)
        return false;
    if (!rs_sdp_family_pid_alive(pid)) {
        RS_DEBUG("sdp: family member %d (port %u) is gone: entry freed", (int)pid, p);
        STORE(&sl->port, 0);
        __atomic_compare_exchange_n(&sl->pid, &pid, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return false;
    }
    *port = p;
    return true;
}

static bool assign(struct family_slot *sl, uint8_t from, uint64_t now)
{
    if (!__atomic_compare_exchange_n(&sl->state, &from, (uint8_t)RS_SDP_MEMBER_ASSIGNED, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return false;   /* it changed its mind in between */
    STORE(&sl->assigned_ms, now);
    return true;
}

int rs_sdp_family_pick(struct sdp_family *f, enum rs_sdp_pick how, uint64_t now, uint16_t *port)
{
    uint32_t start = __atomic_fetch_add(&f->rr, 1, __ATOMIC_ACQ_REL);
    for (uint32_t k = 0; k < RS_SDP_FAMILY_SLOTS; k++) {
        int i = (int)((start + k) % RS_SDP_FAMILY_SLOTS);
        struct family_slot *sl = &f->slot[i];
        if (LOAD(&sl->pid) == 0)
            continue;
        uint8_t st = LOAD(&sl->state);
        if (how == RS_SDP_PICK_WAITING && st != RS_SDP_MEMBER_WAITING)
            continue;
        if (!member_usable(f, i, port))
            continue;
        if (how == RS_SDP_PICK_ANY) {
            STORE(&sl->state, (uint8_t)RS_SDP_MEMBER_ASSIGNED);
            STORE(&sl->assigned_ms, now);
            return i;
        }
        if (assign(sl, st, now))
            return i;
    }
    return -ENOENT;
}

bool rs_sdp_family_holder_alive(const struct sdp_family *f)
{
    int32_t holder = LOAD(&f->holder_pid);
    return holder != 0 && rs_sdp_family_pid_alive(holder);
}

int rs_sdp_family_members(struct sdp_family *f, bool waiting_only)
{
    int n = 0;
    uint16_t port;
    for (int i = 0; i < RS_SDP_FAMILY_SLOTS; i++) {
        if (LOAD(&f->slot[i].pid) == 0 || (waiting_only && LOAD(&f->slot[i].state) != RS_SDP_MEMBER_WAITING))
            continue;
        if (member_usable(f, i, &port))
            n++;
    }
    return n;
}

/* ---- the redirect, in a REJECT's private data ---- */

/* Magic "RSrd", version, a reserved byte, the port to dial instead (network order). Consumer-defined reject data
 * reaches the client unchanged on both providers (IB CM pads it with zeros to its 148 bytes: the length is not
 * checked beyond the 8 bytes that matter). */
static const uint8_t redirect_magic[4] = { 'R', 'S', 'r', 'd' };

size_t rs_sdp_redirect_encode(uint16_t port, uint8_t *buf, size_t len)
{
    if (len < RS_SDP_REDIRECT_LEN)
        return 0;
    memcpy(buf, redirect_magic, 4);
    buf[4] = RS_SDP_REDIRECT_VERSION;
    buf[5] = 0;
    buf[6] = (uint8_t)(port >> 8);
    buf[7] = (uint8_t)port;
    return RS_SDP_REDIRECT_LEN;
}

int rs_sdp_redirect_decode(const uint8_t *buf, size_t len, uint16_t *port)
{
    if (!buf || len < RS_SDP_REDIRECT_LEN || memcmp(buf, redirect_magic, 4) != 0 || buf[4] != RS_SDP_REDIRECT_VERSION)
        return -EINVAL;
    uint16_t p = (uint16_t)(buf[6] << 8 | buf[7]);
    if (p == 0)
        return -EINVAL;
    *port = p;
    return 0;
}
