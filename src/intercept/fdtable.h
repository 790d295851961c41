/*
 * fdtable.h: what rdmasock knows about a file descriptor of the process.
 *
 * Most fds are plain kernel objects rdmasock never touches: they have no entry, and a lookup costs one or two
 * loads. An entry exists for
 *   RS_FD_SOCK      an intercepted socket (struct rs_isock, isock.h): converted to SDP or datagram-iWARP, a
 *                   both-mode listener, or a socket that fell back to the kernel but is still tracked;
 *   RS_FD_EPOLL     an epoll instance that holds at least one intercepted socket (wait layer, wait.h);
 *   RS_FD_INTERNAL  an fd rdmasock itself owns (log file, notification eventfds, RNIC sockets): the application
 *                   cannot close, dup2 over or otherwise disturb it (close returns EBADF as for an fd it never had).
 *
 * The table is two-level and grows lazily: a top array of RS_FDTABLE_TOP page pointers, pages of
 * RS_FDTABLE_PAGE entries allocated when the first fd in their range gets an entry. A huge RLIMIT_NOFILE costs
 * nothing until fds that high are used.
 *
 * Concurrency: no global lock. Each slot is one atomic word holding the object pointer and a lock bit; lookup
 * takes the bit for the few instructions needed to take a reference, so an object is never freed under a reader.
 * Objects are reference counted; the table holds one reference per slot that points to it.
 */
#ifndef RS_INTERCEPT_FDTABLE_H
#define RS_INTERCEPT_FDTABLE_H

#include <stdbool.h>
#include <stdint.h>

enum rs_fd_type {
    RS_FD_SOCK = 1,
    RS_FD_EPOLL = 2,
    RS_FD_INTERNAL = 3,
};

/* The common head of every object the table points to. */
struct rs_fd_obj {
    enum rs_fd_type type;
    int refs;                                   /* atomic */
    void (*destroy)(struct rs_fd_obj *obj);     /* called when the last reference goes */
};

#define RS_FDTABLE_PAGE 4096
#define RS_FDTABLE_TOP 4096                     /* 16 M fds; beyond that fds are never intercepted */

void rs_fd_obj_init(struct rs_fd_obj *obj, enum rs_fd_type type, void (*destroy)(struct rs_fd_obj *));
void rs_fd_obj_hold(struct rs_fd_obj *obj);
void rs_fd_obj_put(struct rs_fd_obj *obj);

/* The object of fd with a reference the caller must put, or NULL (no entry, fd < 0, fd out of range). */
struct rs_fd_obj *rs_fd_get(int fd);
/* Same, but only when the entry has the given type. */
struct rs_fd_obj *rs_fd_get_type(int fd, enum rs_fd_type type);

/* Puts obj at fd (taking a new reference) and returns the object that was there (with its table reference,
 * which the caller must put), or NULL. -1 cast to pointer is never returned: an fd out of range fails with
 * *err = -EMFILE and returns NULL; pass err NULL to ignore. */
struct rs_fd_obj *rs_fd_set(int fd, struct rs_fd_obj *obj, int *err);
/* Removes the entry of fd and returns its table reference (NULL: there was none). */
struct rs_fd_obj *rs_fd_clear(int fd);

/* The word that holds fd's entry: bit 0 the slot's lock, the rest the object pointer (RS_FD_SLOT_LOCK). NULL when
 * no fd in fd's range ever had an entry, or fd is out of range. Pages are never freed, so the address stays valid
 * for the life of the process and a caller may keep it: the data calls' per-thread cache (io_calls.c) tests that its
 * fd still names its socket with one load, where a lookup was a tenth of the cached call. */
const uintptr_t *rs_fd_slot(int fd);
#define RS_FD_SLOT_LOCK ((uintptr_t)1)

/* The object a slot names right now (NULL: none), for an identity test only: no reference is taken and no slot
 * locked, so the object may go at any moment. The caller compares it with an object it holds a reference on, and
 * uses that one. */
static inline struct rs_fd_obj *rs_fd_slot_peek(const uintptr_t *slot)
{
    return (struct rs_fd_obj *)(__atomic_load_n(slot, __ATOMIC_ACQUIRE) & ~RS_FD_SLOT_LOCK);
}

/* True when the process has ever had an entry of this type: a cheap test for fast paths that skip lookups. */
bool rs_fd_any(enum rs_fd_type type);
/* False when fd certainly has no entry of this type (no reference taken, no slot locked): the test every
 * interposed data call makes first, since most fds it sees are not ours (a verbs device takes a write(2) per
 * doorbell). True may still find another type, or nothing, once rs_fd_get_type looks under the slot lock. */
bool rs_fd_maybe(int fd, enum rs_fd_type type);

/* RS_FD_INTERNAL entries (one shared object per process). */
void rs_fd_mark_internal(int fd);
void rs_fd_unmark_internal(int fd);
bool rs_fd_is_internal(int fd);

/* Visits every entry (for fork handlers and tests). The callback runs with no slot locked; obj is held. */
void rs_fd_for_each(void (*fn)(int fd, struct rs_fd_obj *obj, void *arg), void *arg);

#endif /* RS_INTERCEPT_FDTABLE_H */
