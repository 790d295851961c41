/*
 * soft_mem.c: protection domains and the STag table of the soft RNIC.
 *
 * An STag (rkey) is index << 8 | key: the index names a slot of the table, the 8 key bits come from getrandom()
 * for every registration and every rekey, so a peer cannot derive a valid STag from ones it saw before. The lkey
 * uses the same index with its own random key; it is never sent anywhere and is unaffected by invalidation.
 *
 * Every access to registered memory on behalf of the wire (placement, READ source, send gather) happens with the
 * table's read lock held; deregistration takes the write lock, so when rs_rnic_dereg_mr returns no placement into
 * the region is in flight and none can start.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "rnic/soft/iwarp_wire.h"
#include "rnic/soft/soft.h"

#define MR_TABLE_INITIAL 64u

/* ---- protection domains ---- */

int rs_soft_alloc_pd(struct rs_rnic *rnic, struct rs_rnic_pd **out)
{
    struct rs_soft_pd *pd = calloc(1, sizeof(*pd));
    if (!pd)
        return -ENOMEM;
    pd->base.rnic = rnic;
    pd->dev = rs_soft_dev(rnic);
    *out = &pd->base;
    return 0;
}

int rs_soft_dealloc_pd(struct rs_rnic_pd *ppd)
{
    struct rs_soft_pd *pd = rs_soft_pd(ppd);
    if (__atomic_load_n(&pd->users, __ATOMIC_ACQUIRE) != 0)
        return -EBUSY;
    free(pd);
    return 0;
}

/* ---- table ---- */

int rs_soft_mr_table_init(struct rs_soft_device *dev)
{
    pthread_rwlock_init(&dev->mr_lock, NULL);
    dev->mr_entries = calloc(MR_TABLE_INITIAL, sizeof(*dev->mr_entries));
    dev->mr_free_next = calloc(MR_TABLE_INITIAL, sizeof(*dev->mr_free_next));
    if (!dev->mr_entries || !dev->mr_free_next)
        return -ENOMEM;
    dev->mr_capacity = MR_TABLE_INITIAL;
    /* Index 0 is never used: STag 0 is reserved in iWARP. Free list: 1 -> 2 -> ... */
    for (uint32_t i = 1; i < MR_TABLE_INITIAL; i++)
        dev->mr_free_next[i] = i + 1 < MR_TABLE_INITIAL ? i + 1 : 0;
    dev->mr_free_head = 1;
    dev->rand_used = sizeof(dev->rand_pool);
    return 0;
}

void rs_soft_mr_table_fini(struct rs_soft_device *dev)
{
    if (dev->mr_entries) {
        for (uint32_t i = 1; i < dev->mr_capacity; i++)
            if (dev->mr_entries[i]) {
                RS_WARN("soft rnic: closing with a registered region (index %u) still registered", i);
                free(dev->mr_entries[i]);
            }
    }
    free(dev->mr_entries);
    free(dev->mr_free_next);
    dev->mr_entries = NULL;
    dev->mr_free_next = NULL;
    pthread_rwlock_destroy(&dev->mr_lock);
}

/* One random byte; write lock held. Falls back to a time-mixed generator only if getrandom() fails, which on
 * Linux >= 3.17 happens only before the entropy pool is initialised at boot. */
static uint8_t random_byte(struct rs_soft_device *dev)
{
    if (dev->rand_used >= sizeof(dev->rand_pool)) {
        ssize_t got = getrandom(dev->rand_pool, sizeof(dev->rand_pool), GRND_NONBLOCK);
        if (got != (ssize_t)sizeof(dev->rand_pool)) {
            uint64_t x = rs_soft_now_ns() ^ (uintptr_t)dev;
            for (size_t i = 0; i < sizeof(dev->rand_pool); i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                dev->rand_pool[i] = (uint8_t)(x >> 24);
            }
        }
        dev->rand_used = 0;
    }
    return dev->rand_pool[dev->rand_used++];
}

/* A key different from avoid, so a rekeyed STag never equals the one it replaces. */
static uint8_t fresh_key(struct rs_soft_device *dev, int avoid)
{
    for (;;) {
        uint8_t k = random_byte(dev);
        if (k != avoid)
            return k;
    }
}

/* Write lock held. */
static int grow_table(struct rs_soft_device *dev)
{
    uint32_t old = dev->mr_capacity;
    if (old > RS_SOFT_MR_MAX_INDEX)
        return -ENOMEM;
    uint32_t cap = old * 2;
    if (cap > RS_SOFT_MR_MAX_INDEX + 1)
        cap = RS_SOFT_MR_MAX_INDEX + 1;
    struct rs_soft_mr **entries = realloc(dev->mr_entries, cap * sizeof(*entries));
    if (!entries)
        return -ENOMEM;
    dev->mr_entries = entries;
    uint32_t *next = realloc(dev->mr_free_next, cap * sizeof(*next));
    if (!next)
        return -ENOMEM;
    dev->mr_free_next = next;
    for (uint32_t i = old; i < cap; i++) {
        entries[i] = NULL;
        next[i] = i + 1 < cap ? i + 1 : dev->mr_free_head;
    }
    dev->mr_free_head = old;
    dev->mr_capacity = cap;
    return 0;
}

int rs_soft_reg_mr(struct rs_rnic_pd *ppd, void *addr, size_t length, unsigned access, struct rs_rnic_mr **out)
{
    struct rs_soft_pd *pd = rs_soft_pd(ppd);
    struct rs_soft_device *dev = pd->dev;
    const unsigned known = RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE;
    if ((access & ~known) || (!addr && length) || (uintptr_t)addr + length < (uintptr_t)addr)
        return -EINVAL;
    if (access & RS_ACCESS_REMOTE_WRITE)
        access |= RS_ACCESS_LOCAL_WRITE;
    struct rs_soft_mr *mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    mr->pd = pd;
    mr->pub.pd = ppd;
    mr->pub.addr = addr;
    mr->pub.length = length;
    mr->pub.access = access;
    mr->remote_valid = true;

    pthread_rwlock_wrlock(&dev->mr_lock);
    if (dev->mr_free_head == 0 && grow_table(dev) != 0) {
        pthread_rwlock_unlock(&dev->mr_lock);
        free(mr);
        return -ENOMEM;
    }
    uint32_t index = dev->mr_free_head;
    dev->mr_free_head = dev->mr_free_next[index];
    dev->mr_entries[index] = mr;
    mr->index = index;
    mr->pub.lkey = index << 8 | fresh_key(dev, -1);
    mr->pub.rkey = index << 8 | fresh_key(dev, -1);
    pthread_rwlock_unlock(&dev->mr_lock);
    __atomic_add_fetch(&pd->users, 1, __ATOMIC_ACQ_REL);
    *out = &mr->pub;
    return 0;
}

int rs_soft_dereg_mr(struct rs_rnic_mr *pmr)
{
    struct rs_soft_mr *mr = rs_soft_mr(pmr);
    struct rs_soft_pd *pd = mr->pd;
    struct rs_soft_device *dev = pd->dev;
    pthread_rwlock_wrlock(&dev->mr_lock);
    dev->mr_entries[mr->index] = NULL;
    dev->mr_free_next[mr->index] = dev->mr_free_head;
    dev->mr_free_head = mr->index;
    pthread_rwlock_unlock(&dev->mr_lock);
    __atomic_sub_fetch(&pd->users, 1, __ATOMIC_ACQ_REL);
    free(mr);
    return 0;
}

int rs_soft_mr_invalidate(struct rs_rnic_mr *pmr)
{
    struct rs_soft_mr *mr = rs_soft_mr(pmr);
    struct rs_soft_device *dev = mr->pd->dev;
    pthread_rwlock_wrlock(&dev->mr_lock);
    mr->remote_valid = false;
    pthread_rwlock_unlock(&dev->mr_lock);
    return 0;
}

int rs_soft_mr_rekey(struct rs_rnic_mr *pmr)
{
    struct rs_soft_mr *mr = rs_soft_mr(pmr);
    struct rs_soft_device *dev = mr->pd->dev;
    pthread_rwlock_wrlock(&dev->mr_lock);
    mr->pub.rkey = mr->index << 8 | fresh_key(dev, (int)(mr->pub.rkey & 0xff));
    mr->remote_valid = true;
    pthread_rwlock_unlock(&dev->mr_lock);
    return 0;
}

/* ---- checks ---- */

void rs_soft_mr_read_lock(struct rs_soft_device *dev) { pthread_rwlock_rdlock(&dev->mr_lock); }
void rs_soft_mr_read_unlock(struct rs_soft_device *dev) { pthread_rwlock_unlock(&dev->mr_lock); }

const char *rs_soft_prot_name(enum rs_soft_prot p)
{
    switch (p) {
    case RS_SOFT_PROT_OK: return "ok";
    case RS_SOFT_PROT_INVALID_STAG: return "invalid STag";
    case RS_SOFT_PROT_PD_MISMATCH: return "STag of another protection domain";
    case RS_SOFT_PROT_ACCESS: return "access rights";
    case RS_SOFT_PROT_WRAP: return "offset wraps";
    case RS_SOFT_PROT_BOUNDS: return "out of bounds";
    }
    return "?";
}

uint8_t rs_soft_prot_term_ecode(enum rs_soft_prot p)
{
    switch (p) {
    case RS_SOFT_PROT_OK: return RS_TERM_RDMAP_UNSPECIFIED;
    case RS_SOFT_PROT_INVALID_STAG: return RS_TERM_RDMAP_INVALID_STAG;
    case RS_SOFT_PROT_PD_MISMATCH: return RS_TERM_RDMAP_STAG_PD_MISMATCH;
    case RS_SOFT_PROT_ACCESS: return RS_TERM_RDMAP_ACCESS_RIGHTS;
    case RS_SOFT_PROT_WRAP: return RS_TERM_RDMAP_TO_WRAP;
    case RS_SOFT_PROT_BOUNDS: return RS_TERM_RDMAP_BASE_BOUNDS;
    }
    return RS_TERM_RDMAP_UNSPECIFIED;
}

/* [start, start+len) inside [base, base+size)? start is an address; no arithmetic may wrap. */
static enum rs_soft_prot check_range(uint64_t base, uint64_t size, uint64_t start, uint64_t len)
{
    if (start + len < start)
        return RS_SOFT_PROT_WRAP;
    if (start < base || start - base > size || len > size - (start - base))
        return RS_SOFT_PROT_BOUNDS;
    return RS_SOFT_PROT_OK;
}

static struct rs_soft_mr *lookup(struct rs_soft_device *dev, uint32_t key)
{
    uint32_t index = key >> 8;
    if (index == 0 || index >= dev->mr_capacity)
        return NULL;
    return dev->mr_entries[index];
}

enum rs_soft_prot rs_soft_mr_check_remote(struct rs_soft_device *dev, const struct rs_soft_pd *pd, uint32_t stag,
                                          uint64_t to, uint64_t len, unsigned need, uint8_t **where,
                                          struct rs_soft_mr **mr_out)
{
    struct rs_soft_mr *mr = lookup(dev, stag);
    if (!mr || mr->pub.rkey != stag || !mr->remote_valid)
        return RS_SOFT_PROT_INVALID_STAG;
    if (mr->pd != pd)
        return RS_SOFT_PROT_PD_MISMATCH;
    if ((mr->pub.access & need) != need)
        return RS_SOFT_PROT_ACCESS;
    enum rs_soft_prot p = check_range((uintptr_t)mr->pub.addr, mr->pub.length, to, len);
    if (p != RS_SOFT_PROT_OK)
        return p;
    if (where)
        *where = (uint8_t *)mr->pub.addr + (to - (uintptr_t)mr->pub.addr);
    if (mr_out)
        *mr_out = mr;
    return RS_SOFT_PROT_OK;
}

enum rs_soft_prot rs_soft_mr_check_local(struct rs_soft_device *dev, const struct rs_soft_pd *pd,
                                         const struct rs_rnic_sge *sge, unsigned need, uint8_t **where)
{
    struct rs_soft_mr *mr = lookup(dev, sge->lkey);
    if (!mr || mr->pub.lkey != sge->lkey)
        return RS_SOFT_PROT_INVALID_STAG;
    if (mr->pd != pd)
        return RS_SOFT_PROT_PD_MISMATCH;
    if ((mr->pub.access & need) != need)
        return RS_SOFT_PROT_ACCESS;
    enum rs_soft_prot p = check_range((uintptr_t)mr->pub.addr, mr->pub.length, sge->addr, sge->length);
    if (p != RS_SOFT_PROT_OK)
        return p;
    if (where)
        *where = (uint8_t *)mr->pub.addr + (sge->addr - (uintptr_t)mr->pub.addr);
    return RS_SOFT_PROT_OK;
}

int rs_soft_sge_iov(struct rs_soft_device *dev, const struct rs_soft_pd *pd, const struct rs_rnic_sge *sge,
                    uint32_t num_sge, uint64_t offset, uint64_t len, unsigned need, struct iovec *iov, int max_iov,
                    enum rs_soft_prot *prot)
{
    int n = 0;
    if (prot)
        *prot = RS_SOFT_PROT_OK;
    for (uint32_t i = 0; i < num_sge && len > 0; i++) {
        if (offset >= sge[i].length) {
            offset -= sge[i].length;
            continue;
        }
        uint8_t *where;
        enum rs_soft_prot p = rs_soft_mr_check_local(dev, pd, &sge[i], need, &where);
        if (p != RS_SOFT_PROT_OK) {
            if (prot)
                *prot = p;
            return -EFAULT;
        }
        if (n == max_iov)
            return -E2BIG;
        uint64_t take = sge[i].length - offset;
        if (take > len)
            take = len;
        iov[n].iov_base = where + offset;
        iov[n].iov_len = take;
        n++;
        len -= take;
        offset = 0;
    }
    return len > 0 ? -ENOSPC : n;
}

enum rs_soft_prot rs_soft_mr_invalidate_remote(struct rs_soft_device *dev, const struct rs_soft_pd *pd, uint32_t stag)
{
    pthread_rwlock_wrlock(&dev->mr_lock);
    enum rs_soft_prot p = RS_SOFT_PROT_OK;
    struct rs_soft_mr *mr = lookup(dev, stag);
    if (!mr || mr->pub.rkey != stag)
        p = RS_SOFT_PROT_INVALID_STAG;
    else if (mr->pd != pd)
        p = RS_SOFT_PROT_PD_MISMATCH;
    else
        mr->remote_valid = false;
    pthread_rwlock_unlock(&dev->mr_lock);
    return p;
}
