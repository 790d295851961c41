/*
 * sdp_regcache.c: registration cache for zero-copy buffers, with lazy deregistration.
 *
 * Registering an application buffer costs far more than a lookup (Rashti 2010 §3.5.1), and applications reuse
 * their buffers, so a registration outlives the transfer that made it: it is kept (page-aligned, so neighbouring
 * buffers on the same pages share it) until the cache is full, then the least recently used idle one goes.
 *
 * Coherence: a registration describes virtual addresses; on a verbs device it also pins the physical pages that
 * were mapped there when it was made. free() of a heap buffer that stays mapped changes nothing (same pages). What
 * breaks a registration is the range being unmapped or remapped (munmap, mremap, madvise(DONTNEED/FREE/REMOVE),
 * brk shrinking, shmdt): a later mapping at the same address would be other pages, and a verbs transfer would
 * still read or write the old ones. rs_sdp_mem_unmapped() drops every overlapping registration; the interception
 * layer calls it from its hooks of those functions before the real call. A registration in use by a transfer at
 * that moment is marked stale and deregistered when the transfer lets go. The soft RNIC resolves addresses at each
 * access, so it needs no hook, but gets the same treatment.
 * No hook sees glibc's free() of a chunk it had mmapped (it unmaps through an internal alias), and the next malloc
 * of that size commonly returns the same address with other pages: over verbs the peer then read the previous
 * buffer, or wrote into pages the application no longer had, with no error anywhere (test_sdp_zcopy's cancel race
 * over rxe, about one run in six; docs/interception-proc.md "What no interposer sees"). So on a device whose
 * registrations pin pages (caps.mr_pins_pages) nothing is kept idle: a registration lives for its transfers and is
 * deregistered when the last one lets go. The cache keeps its use there: two transfers of one buffer share it.
 *
 * Exposure: a registration's rkey gives the peer access to the application's memory. Each advertisement gets
 * fresh key bits (rs_rnic_mr_rekey) and loses remote access again (rs_rnic_mr_invalidate) as soon as the transfer
 * is over, so a peer can never reach a buffer outside the transfer it was offered.
 *
 * Buffer-reuse detection: a buffer seen for the first time and not much larger than the threshold is not worth
 * registering for one use. rs_sdp_reg_worth tells the sender to copy it this time and remembers it; when the same
 * buffer comes back it is registered (Rashti 2010 §5.3's "frequently used buffers", with a reuse count of two).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

#define REG_MAX_ENTRIES 128
#define REG_MAX_BYTES (512ull << 20)
#define SEEN_SLOTS 32
#define PAGE 4096ull

struct sdp_reg {
    struct sdp_reg *prev, *next;    /* LRU list, most recent first */
    uintptr_t start, end;
    unsigned access;
    struct rs_rnic_mr *mr;
    int refs;
    bool stale;                     /* the range was unmapped while in use: drop at the last put */
    bool exposed;                   /* rkey valid for the peer since the last revoke */
    bool revoked;                   /* rkey invalidated: rekey before the next advertisement */
};

struct sdp_regcache {
    struct sdp_regcache *next_cache;
    pthread_mutex_t lock;
    struct rs_rnic_pd *pd;
    struct sdp_reg *head, *tail;
    int count;
    uint64_t bytes;
    struct { uintptr_t start, end; } seen[SEEN_SLOTS];
    unsigned seen_next;
    bool pins_pages;                /* the device pins: nothing is kept idle (see the top of the file) */
};

static pthread_mutex_t caches_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sdp_regcache *caches;

struct sdp_regcache *rs_sdp_regcache_new(struct rs_rnic_pd *pd, bool pins_pages)
{
    struct sdp_regcache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    c->pd = pd;
    c->pins_pages = pins_pages;
    pthread_mutex_lock(&caches_lock);
    c->next_cache = caches;
    caches = c;
    pthread_mutex_unlock(&caches_lock);
    return c;
}

static void lru_unlink(struct sdp_regcache *c, struct sdp_reg *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        c->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        c->tail = r->prev;
    r->prev = r->next = NULL;
}

static void lru_front(struct sdp_regcache *c, struct sdp_reg *r)
{
    r->prev = NULL;
    r->next = c->head;
    if (c->head)
        c->head->prev = r;
    c->head = r;
    if (!c->tail)
        c->tail = r;
}

static void reg_destroy(struct sdp_regcache *c, struct sdp_reg *r)
{
    lru_unlink(c, r);
    c->count--;
    c->bytes -= r->end - r->start;
    rs_rnic_dereg_mr(r->mr);
    free(r);
}

/* Cache lock held: evicts idle registrations until there is room for one more of len bytes. */
static void make_room(struct sdp_regcache *c, uint64_t len)
{
    struct sdp_reg *r = c->tail;
    while (r && (c->count >= REG_MAX_ENTRIES || c->bytes + len > REG_MAX_BYTES)) {
        struct sdp_reg *prev = r->prev;
        if (r->refs == 0)
            reg_destroy(c, r);
        r = prev;
    }
}

bool rs_sdp_reg_worth(struct sdp_regcache *c, const void *addr, size_t len, size_t threshold)
{
    uintptr_t start = (uintptr_t)addr, end = start + len;
    pthread_mutex_lock(&c->lock);
    for (struct sdp_reg *r = c->head; r; r = r->next) {
        if (!r->stale && r->start <= start && r->end >= end) {
            pthread_mutex_unlock(&c->lock);
            return true;
        }
    }
    if (len >= 2 * threshold) {
        pthread_mutex_unlock(&c->lock);
        return true;
    }
    for (unsigned i = 0; i < SEEN_SLOTS; i++) {
        if (c->seen[i].start == start && c->seen[i].end >= end) {
            pthread_mutex_unlock(&c->lock);
            return true;
        }
    }
    c->seen[c->seen_next].start = start;
    c->seen[c->seen_next].end = end;
    c->seen_next = (c->seen_next + 1) % SEEN_SLOTS;
    pthread_mutex_unlock(&c->lock);
    return false;
}

int rs_sdp_reg_get(struct sdp_regcache *c, void *addr, size_t len, unsigned access, struct sdp_reg **out, bool *hit)
{
    uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(PAGE - 1);
    uintptr_t end = ((uintptr_t)addr + len + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    bool remote = (access & (RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE)) != 0;
    pthread_mutex_lock(&c->lock);
    struct sdp_reg *r;
    for (r = c->head; r; r = r->next) {
        if (!r->stale && r->start <= (uintptr_t)addr && r->end >= (uintptr_t)addr + len &&
            (r->access & access) == access)
            break;
    }
    *hit = r != NULL;
    if (!r) {
        make_room(c, end - start);
        r = calloc(1, sizeof(*r));
        if (!r) {
            pthread_mutex_unlock(&c->lock);
            return -ENOMEM;
        }
        int rc = rs_rnic_reg_mr(c->pd, (void *)start, end - start, access, &r->mr);
        if (rc != 0) {
            free(r);
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
        r->start = start;
        r->end = end;
        r->access = access;
        c->count++;
        c->bytes += end - start;
    } else {
        lru_unlink(c, r);
    }
    lru_front(c, r);
    r->refs++;
    if (remote && r->revoked) {
        /* A peer saw the old key: it gets new key bits before anyone sees this region again. */
        int rc = rs_rnic_mr_rekey(r->mr);
        if (rc != 0) {
            r->refs--;
            reg_destroy(c, r);
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
        r->revoked = false;
    }
    if (remote)
        r->exposed = true;
    pthread_mutex_unlock(&c->lock);
    *out = r;
    return 0;
}

struct rs_rnic_mr *rs_sdp_reg_mr(struct sdp_reg *r)
{
    return r->mr;
}

/* Cache lock held. */
void rs_sdp_reg_revoke(struct sdp_reg *r)
{
    if (r->exposed && !r->revoked) {
        rs_rnic_mr_invalidate(r->mr);
        r->revoked = true;
        r->exposed = false;
    }
}

void rs_sdp_reg_put(struct sdp_regcache *c, struct sdp_reg *r)
{
    pthread_mutex_lock(&c->lock);
    /* Two transfers may share a registration (the same buffer on two sockets): access ends with the last. */
    if (--r->refs == 0) {
        rs_sdp_reg_revoke(r);
        if (r->stale || c->pins_pages)
            reg_destroy(c, r);
    }
    pthread_mutex_unlock(&c->lock);
}

void rs_sdp_regcache_unmapped(struct sdp_regcache *c, uintptr_t start, uintptr_t end)
{
    pthread_mutex_lock(&c->lock);
    struct sdp_reg *r = c->head;
    while (r) {
        struct sdp_reg *next = r->next;
        if (r->start < end && start < r->end) {
            if (r->refs == 0)
                reg_destroy(c, r);
            else
                r->stale = true;
        }
        r = next;
    }
    for (unsigned i = 0; i < SEEN_SLOTS; i++) {
        if (c->seen[i].start < end && start < c->seen[i].end)
            c->seen[i].start = c->seen[i].end = 0;
    }
    pthread_mutex_unlock(&c->lock);
}

void rs_sdp_regcache_all_unmapped(uintptr_t start, uintptr_t end)
{
    pthread_mutex_lock(&caches_lock);
    for (struct sdp_regcache *c = caches; c; c = c->next_cache)
        rs_sdp_regcache_unmapped(c, start, end);
    pthread_mutex_unlock(&caches_lock);
}

void rs_sdp_mem_unmapped(const void *addr, size_t len)
{
    if (len == 0)
        return;
    uintptr_t start = (uintptr_t)addr;
    uintptr_t end = start + len < start ? UINTPTR_MAX : start + len;
    /* Cheap when nothing is cached: one lock per device cache. */
    rs_sdp_regcache_all_unmapped(start, end);
}
