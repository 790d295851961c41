/* fdtable.c: the lazily grown, lock-free-to-read table of fds rdmasock knows about (design in fdtable.h). */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "intercept/fdtable.h"

/* A slot: the object pointer with bit 0 as the slot's lock (objects are at least 8-byte aligned). */
typedef uintptr_t rs_slot;
#define SLOT_LOCK RS_FD_SLOT_LOCK

static rs_slot *pages[RS_FDTABLE_TOP];      /* each entry atomic; a page is never freed */
static unsigned any_types;                  /* atomic bit set of enum rs_fd_type seen */

struct internal_obj {
    struct rs_fd_obj base;
};
static struct internal_obj internal_marker = { { RS_FD_INTERNAL, 1 << 30, NULL } };

void rs_fd_obj_init(struct rs_fd_obj *obj, enum rs_fd_type type, void (*destroy)(struct rs_fd_obj *))
{
    obj->type = type;
    obj->refs = 1;
    obj->destroy = destroy;
}

void rs_fd_obj_hold(struct rs_fd_obj *obj) { __atomic_add_fetch(&obj->refs, 1, __ATOMIC_RELAXED); }

void rs_fd_obj_put(struct rs_fd_obj *obj)
{
    if (obj && __atomic_sub_fetch(&obj->refs, 1, __ATOMIC_ACQ_REL) == 0 && obj->destroy)
        obj->destroy(obj);
}

/* The slot of fd if its page exists, else NULL. Every data call looks up its fd, and most are not ours: inline,
 * as a call and return per lookup were a measurable share of a busy poller's miss under TCG. */
static inline __attribute__((always_inline)) rs_slot *slot_find(int fd)
{
    if (fd < 0 || (unsigned)fd >= (unsigned)RS_FDTABLE_TOP * RS_FDTABLE_PAGE)
        return NULL;
    rs_slot *page = __atomic_load_n(&pages[(unsigned)fd / RS_FDTABLE_PAGE], __ATOMIC_ACQUIRE);
    return page ? &page[(unsigned)fd % RS_FDTABLE_PAGE] : NULL;
}

/* The slot of fd, or NULL; with create, the page is allocated (mmap: this may run where malloc must not). */
static rs_slot *slot_of(int fd, bool create)
{
    rs_slot *found = slot_find(fd);
    if (found || !create || fd < 0 || (unsigned)fd >= (unsigned)RS_FDTABLE_TOP * RS_FDTABLE_PAGE)
        return found;
    unsigned top = (unsigned)fd / RS_FDTABLE_PAGE;
    rs_slot *page = __atomic_load_n(&pages[top], __ATOMIC_ACQUIRE);
    if (!page) {
        void *fresh = mmap(NULL, RS_FDTABLE_PAGE * sizeof(rs_slot), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (fresh == MAP_FAILED)
            return NULL;
        rs_slot *expected = NULL;
        if (__atomic_compare_exchange_n(&pages[top], &expected, (rs_slot *)fresh, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            page = fresh;
        } else {
            munmap(fresh, RS_FDTABLE_PAGE * sizeof(rs_slot));
            page = expected;
        }
    }
    return &page[(unsigned)fd % RS_FDTABLE_PAGE];
}

static uintptr_t slot_lock(rs_slot *slot)
{
    for (unsigned spins = 0;; spins++) {
        uintptr_t v = __atomic_load_n(slot, __ATOMIC_RELAXED);
        if (!(v & SLOT_LOCK) &&
            __atomic_compare_exchange_n(slot, &v, v | SLOT_LOCK, true, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return v;
        if (spins > 64)
            sched_yield();      /* the holder was preempted inside its few instructions */
    }
}

static void slot_unlock(rs_slot *slot, uintptr_t value) { __atomic_store_n(slot, value, __ATOMIC_RELEASE); }

struct rs_fd_obj *rs_fd_get(int fd)
{
    rs_slot *slot = slot_find(fd);
    if (!slot || __atomic_load_n(slot, __ATOMIC_RELAXED) == 0)
        return NULL;
    uintptr_t v = slot_lock(slot);
    struct rs_fd_obj *obj = (struct rs_fd_obj *)v;
    if (obj)
        rs_fd_obj_hold(obj);
    slot_unlock(slot, v);
    return obj;
}

/* The slot of fd when it may hold an object of type (see rs_fd_maybe), else NULL. */
static inline __attribute__((always_inline)) rs_slot *slot_maybe(int fd, enum rs_fd_type type)
{
    if (!((__atomic_load_n(&any_types, __ATOMIC_ACQUIRE) >> type) & 1u))
        return NULL;
    rs_slot *slot = slot_find(fd);
    if (!slot)
        return NULL;
    /* rdmasock's own fds are told apart without locking the slot: the marker is static, so comparing its address
     * needs no reference. */
    uintptr_t v = __atomic_load_n(slot, __ATOMIC_RELAXED) & ~SLOT_LOCK;
    return v != 0 && (type == RS_FD_INTERNAL) == (v == (uintptr_t)&internal_marker.base) ? slot : NULL;
}

bool rs_fd_maybe(int fd, enum rs_fd_type type)
{
    return slot_maybe(fd, type) != NULL;
}

const uintptr_t *rs_fd_slot(int fd)
{
    return slot_find(fd);
}

struct rs_fd_obj *rs_fd_get_type(int fd, enum rs_fd_type type)
{
    rs_slot *slot = slot_maybe(fd, type);
    if (!slot)
        return NULL;
    uintptr_t v = slot_lock(slot);
    struct rs_fd_obj *obj = (struct rs_fd_obj *)v;
    if (obj && obj->type == type)
        __atomic_add_fetch(&obj->refs, 1, __ATOMIC_RELAXED);
    else
        obj = NULL;
    slot_unlock(slot, v);
    return obj;
}

struct rs_fd_obj *rs_fd_set(int fd, struct rs_fd_obj *obj, int *err)
{
    rs_slot *slot = slot_of(fd, true);
    if (!slot) {
        if (err)
            *err = fd < 0 ? -EBADF : -EMFILE;
        return NULL;
    }
    if (err)
        *err = 0;
    __atomic_or_fetch(&any_types, 1u << obj->type, __ATOMIC_RELEASE);
    rs_fd_obj_hold(obj);
    uintptr_t old = slot_lock(slot);
    slot_unlock(slot, (uintptr_t)obj);
    return (struct rs_fd_obj *)old;
}

struct rs_fd_obj *rs_fd_clear(int fd)
{
    rs_slot *slot = slot_find(fd);
    if (!slot || __atomic_load_n(slot, __ATOMIC_RELAXED) == 0)
        return NULL;
    uintptr_t old = slot_lock(slot);
    slot_unlock(slot, 0);
    return (struct rs_fd_obj *)old;
}

bool rs_fd_any(enum rs_fd_type type) { return (__atomic_load_n(&any_types, __ATOMIC_ACQUIRE) >> type) & 1u; }

void rs_fd_mark_internal(int fd)
{
    struct rs_fd_obj *old = rs_fd_set(fd, &internal_marker.base, NULL);
    rs_fd_obj_put(old);
}

void rs_fd_unmark_internal(int fd)
{
    rs_slot *slot = slot_find(fd);
    if (!slot)
        return;
    uintptr_t v = slot_lock(slot);
    if (v == (uintptr_t)&internal_marker.base) {
        slot_unlock(slot, 0);
        rs_fd_obj_put(&internal_marker.base);
        return;
    }
    slot_unlock(slot, v);
}

bool rs_fd_is_internal(int fd)
{
    if (!rs_fd_any(RS_FD_INTERNAL))
        return false;
    rs_slot *slot = slot_find(fd);
    return slot && (__atomic_load_n(slot, __ATOMIC_ACQUIRE) & ~SLOT_LOCK) == (uintptr_t)&internal_marker.base;
}

void rs_fd_for_each(void (*fn)(int fd, struct rs_fd_obj *obj, void *arg), void *arg)
{
    for (unsigned top = 0; top < RS_FDTABLE_TOP; top++) {
        if (!__atomic_load_n(&pages[top], __ATOMIC_ACQUIRE))
            continue;
        for (unsigned i = 0; i < RS_FDTABLE_PAGE; i++) {
            int fd = (int)(top * RS_FDTABLE_PAGE + i);
            struct rs_fd_obj *obj = rs_fd_get(fd);
            if (obj) {
                fn(fd, obj, arg);
                rs_fd_obj_put(obj);
            }
        }
    }
}
