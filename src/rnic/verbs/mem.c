/*
 * mem.c: protection domains and memory regions.
 *
 * An rnic.h MR must be able to lose its rkey (rs_rnic_mr_invalidate, SEND_WITH_INVALIDATE from the peer) and get
 * a fresh one (rs_rnic_mr_rekey) while its lkey keeps working. A region registered with ibv_reg_mr cannot be
 * invalidated remotely (rxe and real HCAs only invalidate fast-register MRs and type 2 memory windows, and type 2
 * windows are bound to one QP, which rnic.h's PD-wide STags do not allow). So a region with remote access owns
 * two registrations of the same pages: `local` gives the lkey, `remote` the rkey. Invalidation deregisters
 * `remote`; rekeying registers it again, which gives a new index and new random key bits (docs/verbs.md).
 *
 * The key tables let the UD emulation (ud.c, record.c) check lkeys and STags in software. Placement into a
 * region happens with mr_lock held for reading; deregistration takes it for writing, so once
 * rs_rnic_dereg_mr returns no emulated access to the region is in flight.
 */
#include <errno.h>
#include <stdlib.h>

#include "rnic/verbs/verbs.h"

int rs_v_alloc_pd(struct rs_rnic *rnic, struct rs_rnic_pd **out)
{
    struct rs_v_dev *dev = rs_v_dev(rnic);
    struct rs_v_pd *pd = calloc(1, sizeof(*pd));
    if (!pd)
        return -ENOMEM;
    pd->pd = ibv_alloc_pd(dev->ctx);
    if (!pd->pd) {
        int err = errno ? -errno : -ENOMEM;
        free(pd);
        return err;
    }
    pd->base.rnic = rnic;
    atomic_init(&pd->users, 0);
    rs_v_dev_get(dev);
    *out = &pd->base;
    return 0;
}

int rs_v_dealloc_pd(struct rs_rnic_pd *base)
{
    struct rs_v_pd *pd = rs_v_pd(base);
    if (atomic_load(&pd->users) > 0)
        return -EBUSY;
    int r = ibv_dealloc_pd(pd->pd);
    if (r)
        return r > 0 ? -r : -EBUSY;
    struct rs_v_dev *dev = rs_v_dev(base->rnic);
    free(pd);
    rs_v_dev_put(dev);
    return 0;
}

static struct ibv_mr *register_remote(struct rs_v_pd *pd, void *addr, size_t length, unsigned access)
{
    int flags = 0;
    if (access & RS_ACCESS_REMOTE_WRITE)
        flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (access & RS_ACCESS_REMOTE_READ)
        flags |= IBV_ACCESS_REMOTE_READ;
    return ibv_reg_mr(pd->pd, addr, length, flags);
}

int rs_v_reg_mr(struct rs_rnic_pd *base, void *addr, size_t length, unsigned access, struct rs_rnic_mr **out)
{
    struct rs_v_pd *pd = rs_v_pd(base);
    struct rs_v_dev *dev = rs_v_dev(base->rnic);
    const unsigned known = RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE;
    if ((access & ~known) || length == 0 || !addr)
        return -EINVAL;
    if (access & RS_ACCESS_REMOTE_WRITE)
        access |= RS_ACCESS_LOCAL_WRITE;
    struct rs_v_mr *mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    mr->local = ibv_reg_mr(pd->pd, addr, length, (access & RS_ACCESS_LOCAL_WRITE) ? IBV_ACCESS_LOCAL_WRITE : 0);
    if (!mr->local) {
        int err = errno ? -errno : -ENOMEM;
        free(mr);
        return err;
    }
    if (access & (RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE)) {
        mr->remote = register_remote(pd, addr, length, access);
        if (!mr->remote) {
            int err = errno ? -errno : -ENOMEM;
            ibv_dereg_mr(mr->local);
            free(mr);
            return err;
        }
    }
    mr->pub.pd = base;
    mr->pub.addr = addr;
    mr->pub.length = length;
    mr->pub.lkey = mr->local->lkey;
    mr->pub.rkey = mr->remote ? mr->remote->rkey : mr->local->rkey;
    mr->pub.access = access;
    atomic_init(&mr->refs, 1);
    pthread_rwlock_wrlock(&dev->mr_lock);
    int r = rs_v_keymap_put(&dev->by_lkey, mr->pub.lkey, mr);
    if (r == 0 && mr->remote)
        r = rs_v_keymap_put(&dev->by_rkey, mr->pub.rkey, mr);
    pthread_rwlock_unlock(&dev->mr_lock);
    if (r) {
        pthread_rwlock_wrlock(&dev->mr_lock);
        rs_v_keymap_del(&dev->by_lkey, mr->pub.lkey, mr);
        pthread_rwlock_unlock(&dev->mr_lock);
        if (mr->remote)
            ibv_dereg_mr(mr->remote);
        ibv_dereg_mr(mr->local);
        free(mr);
        return r;
    }
    atomic_fetch_add(&pd->users, 1);
    *out = &mr->pub;
    return 0;
}

static void mr_free(struct rs_v_mr *mr)
{
    struct rs_v_pd *pd = rs_v_pd(mr->pub.pd);
    if (mr->remote)
        ibv_dereg_mr(mr->remote);
    ibv_dereg_mr(mr->local);
    atomic_fetch_sub(&pd->users, 1);
    free(mr);
}

void rs_v_mr_get(struct rs_v_mr *mr)
{
    atomic_fetch_add(&mr->refs, 1);
}

void rs_v_mr_put(struct rs_v_mr *mr)
{
    if (atomic_fetch_sub(&mr->refs, 1) == 1)
        mr_free(mr);
}

int rs_v_dereg_mr(struct rs_rnic_mr *base)
{
    struct rs_v_mr *mr = rs_v_mr(base);
    struct rs_v_dev *dev = rs_v_dev(base->pd->rnic);
    /* Taking the write lock waits for every emulated placement into the region to finish. */
    pthread_rwlock_wrlock(&dev->mr_lock);
    rs_v_keymap_del(&dev->by_lkey, mr->pub.lkey, mr);
    if (mr->remote)
        rs_v_keymap_del(&dev->by_rkey, mr->remote->rkey, mr);
    mr->dead = true;
    pthread_rwlock_unlock(&dev->mr_lock);
    rs_v_mr_put(mr);
    return 0;
}

/* Called with mr_lock held for writing. */
static void drop_remote(struct rs_v_dev *dev, struct rs_v_mr *mr)
{
    rs_v_keymap_del(&dev->by_rkey, mr->remote->rkey, mr);
    ibv_dereg_mr(mr->remote);
    mr->remote = NULL;
}

int rs_v_mr_invalidate(struct rs_rnic_mr *base)
{
    struct rs_v_mr *mr = rs_v_mr(base);
    struct rs_v_dev *dev = rs_v_dev(base->pd->rnic);
    if (!(mr->pub.access & (RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE)))
        return -EINVAL;
    pthread_rwlock_wrlock(&dev->mr_lock);
    if (mr->remote)
        drop_remote(dev, mr);
    pthread_rwlock_unlock(&dev->mr_lock);
    return 0;
}

int rs_v_mr_rekey(struct rs_rnic_mr *base)
{
    struct rs_v_mr *mr = rs_v_mr(base);
    struct rs_v_dev *dev = rs_v_dev(base->pd->rnic);
    if (!(mr->pub.access & (RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE)))
        return -EINVAL;
    /* The new registration exists before the old one goes, so the device cannot hand back the same key. */
    struct ibv_mr *fresh = register_remote(rs_v_pd(base->pd), mr->pub.addr, mr->pub.length, mr->pub.access);
    if (!fresh)
        return errno ? -errno : -ENOMEM;
    pthread_rwlock_wrlock(&dev->mr_lock);
    if (mr->remote)
        drop_remote(dev, mr);
    int r = rs_v_keymap_put(&dev->by_rkey, fresh->rkey, mr);
    if (r == 0) {
        mr->remote = fresh;
        mr->pub.rkey = fresh->rkey;
    }
    pthread_rwlock_unlock(&dev->mr_lock);
    if (r)
        ibv_dereg_mr(fresh);
    return r;
}

bool rs_v_mr_invalidate_rkey(struct rs_v_dev *dev, struct rs_v_pd *pd, uint32_t rkey)
{
    bool done = false;
    pthread_rwlock_wrlock(&dev->mr_lock);
    struct rs_v_mr *mr = rs_v_keymap_get(&dev->by_rkey, rkey);
    if (mr && mr->remote && rs_v_pd(mr->pub.pd) == pd) {
        drop_remote(dev, mr);
        done = true;
    }
    pthread_rwlock_unlock(&dev->mr_lock);
    return done;
}

struct rs_v_mr *rs_v_mr_find_rkey_locked(struct rs_v_dev *dev, uint32_t rkey)
{
    struct rs_v_mr *mr = rs_v_keymap_get(&dev->by_rkey, rkey);
    return mr && mr->remote && mr->remote->rkey == rkey ? mr : NULL;
}

struct rs_v_mr *rs_v_mr_find_lkey_locked(struct rs_v_dev *dev, uint32_t lkey)
{
    return rs_v_keymap_get(&dev->by_lkey, lkey);
}

bool rs_v_mr_covers(const struct rs_v_mr *mr, uint64_t addr, uint64_t len)
{
    uint64_t start = (uint64_t)(uintptr_t)mr->pub.addr;
    uint64_t end = start + mr->pub.length;
    if (addr < start || addr > end)
        return false;
    return len <= end - addr;
}
