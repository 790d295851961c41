/*
 * memhooks.c: keeps the registration caches coherent with the address space (docs/sdp.md "Coherence with
 * free/munmap", docs/interception-proc.md "Memory hooks").
 *
 * A cached registration names virtual addresses and, on a verbs device, pins the physical pages that were there
 * when it was made. Once the range is unmapped or its pages replaced, a new mapping at the same address would be
 * other pages while the registration still reaches the old ones. Every interposed call below that releases or
 * replaces a range reports it to rs_sdp_mem_unmapped and rs_dgram_mem_unmapped:
 *
 *   munmap                     the range
 *   mremap                     with MREMAP_MAYMOVE the whole old range (it may move; MREMAP_DONTUNMAP empties
 *                              it), without it only the tail a shrink gives back; with MREMAP_FIXED also the
 *                              target range, which the kernel unmaps first
 *   madvise                    MADV_DONTNEED, MADV_DONTNEED_LOCKED, MADV_FREE, MADV_REMOVE (the pages are dropped
 *                              and the next touch maps fresh ones); not MADV_DONTFORK, MADV_COLD, MADV_PAGEOUT...,
 *                              which keep the contents at the same address
 *   mmap, mmap64 (MAP_FIXED)   the range it replaces
 *   shmdt                      the attached segment (its extent read from /proc/self/maps)
 *   brk, sbrk                  the part of the heap a shrink gives back
 *
 * Order: BEFORE the real call, because after it another thread may map new pages at the same address and start a
 * transfer that would find the old registration (silent corruption on verbs). And AGAIN after a successful call,
 * which costs one more lookup and removes a registration another thread made from the range while the call was
 * in progress (a program racing its own munmap, which without rdmasock would only have read or written the old
 * pages, would otherwise leave a stale entry behind for the next mapping at that address).
 *
 * What no interposer sees: glibc's malloc, free, realloc and malloc_trim release memory through internal aliases
 * (__munmap, __mremap, __madvise, __sbrk), so free() of a chunk glibc had mmapped, a heap trim or a thread arena
 * shrinking never reaches these hooks. The consequences and what covers them are in docs/interception-proc.md.
 *
 * Fork: a hook runs inside the caches' locks. A fork while another thread is in there would leave the child with
 * a lock nobody releases, and the child's first munmap would hang; the gate below lets proc.c's fork handlers wait
 * until no hook is running and keep other threads' hooks out until the fork is done. The forking thread itself
 * passes: fork handlers registered before ours run before ours reopen the gate (the statistics area's child
 * handler unmaps the parent's area), and no other thread can be inside the caches then.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/compiler.h"
#include "dgram_wr/dgram.h"
#include "intercept/libc.h"
#include "sdp_stream/sdp.h"

/* Called by proc.c's fork handlers (memhooks has no header of its own). */
void rs_memhooks_fork_prepare(void);
void rs_memhooks_fork_parent(void);
void rs_memhooks_fork_child(void);

/* ---- reporting a released range ---- */

static int gate_inflight;       /* hooks running now (atomic) */
static int gate_closed;         /* a fork is in progress (atomic) */
/* initial-exec: these are read on every hook, possibly from inside an allocator, where the general-dynamic
 * model's first access per thread could itself allocate. */
#define RS_TLS __thread __attribute__((tls_model("initial-exec")))
static RS_TLS int tls_in_hook;
static RS_TLS int tls_gate_owner;       /* this thread is the forking one: the gate does not stop it */

/* False when the caller passes without being counted (the forking thread, whose own fork handlers and those of
 * other libraries, running after ours in the child, may unmap memory while the gate is closed). */
static bool gate_enter(void)
{
    if (tls_gate_owner)
        return false;
    for (;;) {
        __atomic_add_fetch(&gate_inflight, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&gate_closed, __ATOMIC_SEQ_CST))
            return true;
        __atomic_sub_fetch(&gate_inflight, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&gate_closed, __ATOMIC_ACQUIRE))
            sched_yield();
    }
}

static void gate_leave(void) { __atomic_sub_fetch(&gate_inflight, 1, __ATOMIC_SEQ_CST); }

void rs_memhooks_fork_prepare(void)
{
    __atomic_store_n(&gate_closed, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&gate_inflight, __ATOMIC_SEQ_CST) != 0)
        sched_yield();
    tls_gate_owner = 1;
}

void rs_memhooks_fork_parent(void)
{
    tls_gate_owner = 0;
    __atomic_store_n(&gate_closed, 0, __ATOMIC_SEQ_CST);
}

void rs_memhooks_fork_child(void)
{
    tls_gate_owner = 0;
    __atomic_store_n(&gate_inflight, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gate_closed, 0, __ATOMIC_SEQ_CST);
}

static void report_released(const void *addr, size_t len)
{
    /* The caches' own teardown (deregistration in a provider library) may unmap memory: it runs inside their
     * locks, so re-entering would deadlock, and it releases nothing the caches still hold. */
    if (len == 0 || tls_in_hook)
        return;
    tls_in_hook = 1;
    bool counted = gate_enter();
    rs_sdp_mem_unmapped(addr, len);
    rs_dgram_mem_unmapped(addr, len);
    if (counted)
        gate_leave();
    tls_in_hook = 0;
}

/* ---- resolution of what libc.h does not list ---- */

/* Resolves lazily; while a dlsym of ours is running on this thread (an allocator may call mmap from inside it)
 * the callers fall back to the system call. */
static RS_TLS int tls_resolving;

static void *next_symbol(void **slot, const char *name)
{
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (fn || tls_resolving || rs_libc_resolving())
        return fn;
    tls_resolving = 1;
    fn = dlsym(RTLD_NEXT, name);
    tls_resolving = 0;
    __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    return fn;
}

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*shmdt_fn)(const void *);
static void *real_mmap_ptr, *real_mmap64_ptr, *real_shmdt_ptr;

/* ---- munmap, mremap, madvise ---- */

RS_EXPORT int munmap(void *addr, size_t len)
{
    report_released(addr, len);
    int r = RS_REAL(munmap)(addr, len);    /* libc.c has a system-call fallback for the resolution window */
    if (r == 0) {
        int saved_errno = errno;
        report_released(addr, len);
        errno = saved_errno;
    }
    return r;
}

/* What an mremap may release, known before the call (see the top of the file). */
static void mremap_released(void *old, size_t old_size, size_t new_size, int flags, void *target)
{
    if (flags & MREMAP_MAYMOVE)
        report_released(old, old_size);
    else if (new_size < old_size)
        report_released((char *)old + new_size, old_size - new_size);
    if (flags & MREMAP_FIXED)
        report_released(target, new_size);
}

RS_EXPORT void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
    void *target = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        target = va_arg(ap, void *);
        va_end(ap);
    }
    mremap_released(old, old_size, new_size, flags, target);
    void *r;
    if (RS_REAL(mremap))
        r = RS_REAL(mremap)(old, old_size, new_size, flags, target);
    else
        r = (void *)syscall(SYS_mremap, old, old_size, new_size, flags, target);
    if (r != MAP_FAILED) {
        int saved_errno = errno;
        mremap_released(old, old_size, new_size, flags, target);
        errno = saved_errno;
    }
    return r;
}

static bool advice_releases(int advice)
{
    switch (advice) {
    case MADV_DONTNEED:
    case MADV_FREE:
    case MADV_REMOVE:
#ifdef MADV_DONTNEED_LOCKED
    case MADV_DONTNEED_LOCKED:
#endif
        return true;
    default:
        return false;
    }
}

RS_EXPORT int madvise(void *addr, size_t len, int advice)
{
    bool releases = advice_releases(advice);
    if (releases)
        report_released(addr, len);
    int r = RS_REAL(madvise)(addr, len, advice);
    if (r == 0 && releases) {
        int saved_errno = errno;
        report_released(addr, len);
        errno = saved_errno;
    }
    return r;
}

/* ---- mmap over an existing range ---- */

static void *mmap_common(void **slot, const char *name, void *addr, size_t len, int prot, int flags, int fd,
                         off_t offset)
{
    /* MAP_FIXED replaces whatever was there; MAP_FIXED_NOREPLACE fails instead, and a hint replaces nothing. */
    bool replaces = (flags & MAP_FIXED) != 0;
    if (replaces)
        report_released(addr, len);
    mmap_fn fn = (mmap_fn)next_symbol(slot, name);
    void *r = fn ? fn(addr, len, prot, flags, fd, offset)
                 : (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, offset);
    if (replaces && r != MAP_FAILED) {
        int saved_errno = errno;
        report_released(addr, len);
        errno = saved_errno;
    }
    return r;
}

RS_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
{
    return mmap_common(&real_mmap_ptr, "mmap", addr, len, prot, flags, fd, offset);
}

RS_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t offset)
{
    return mmap_common(&real_mmap64_ptr, "mmap64", addr, len, prot, flags, fd, (off_t)offset);
}

/* ---- shmdt ---- */

/*
 * The extent of the SysV segment attached at addr: the mapping that starts there and the adjacent ones of the
 * same object (mprotect may have split it). 0 when not found. Reads /proc/self/maps with plain system calls, since
 * this may run where stdio's locks are not safe to take.
 */
static size_t attached_extent(const void *addr)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[4096];
    char line[512];
    size_t line_len = 0;
    uintptr_t want = (uintptr_t)addr, end = 0;
    unsigned long inode = 0;
    bool found = false, done = false;
    ssize_t n;
    while (!done && (n = RS_REAL(read)(fd, buf, sizeof(buf))) > 0) {
        for (ssize_t i = 0; i < n && !done; i++) {
            if (buf[i] != '\n') {
                if (line_len < sizeof(line) - 1)
                    line[line_len++] = buf[i];
                continue;
            }
            line[line_len] = '\0';
            line_len = 0;
            /* start-end perms offset dev inode [path] */
            char *p = line;
            uintptr_t lo = (uintptr_t)strtoull(p, &p, 16);
            uintptr_t hi = (uintptr_t)strtoull(p + 1, &p, 16);
            for (int field = 0; field < 3 && *p; field++) {     /* skip perms, offset, dev */
                while (*p == ' ')
                    p++;
                while (*p && *p != ' ')
                    p++;
            }
            unsigned long ino = strtoul(p, NULL, 10);
            if (!found) {
                if (lo == want) {
                    found = true;
                    end = hi;
                    inode = ino;
                }
            } else if (lo == end && ino == inode && inode != 0) {
                end = hi;
            } else {
                done = true;
            }
        }
    }
    RS_REAL(close)(fd);
    return found ? end - want : 0;
}

RS_EXPORT int shmdt(const void *addr)
{
    size_t len = attached_extent(addr);
    report_released(addr, len);
    shmdt_fn fn = (shmdt_fn)next_symbol(&real_shmdt_ptr, "shmdt");
    int r = fn ? fn(addr) : (int)syscall(SYS_shmdt, addr);
    if (r == 0) {
        int saved_errno = errno;
        report_released(addr, len);
        errno = saved_errno;
    }
    return r;
}

/* ---- brk, sbrk ---- */

/*
 * Only a shrink releases anything. Both need the current break, which glibc keeps in __curbrk (sbrk(0) reads it):
 * a raw brk system call would leave that stale and make glibc's next sbrk move the break wrongly, so while the
 * real functions are not resolved yet (dlsym running on this thread) these fail with ENOMEM, which every
 * allocator handles (glibc's malloc falls back to mmap).
 */
RS_EXPORT void *sbrk(intptr_t delta)
{
    void *(*real)(intptr_t) = RS_REAL(sbrk);
    if (!real) {
        errno = ENOMEM;
        return (void *)-1;
    }
    if (delta >= 0)
        return real(delta);
    char *current = real(0);
    if (current == (void *)-1)
        return current;
    size_t released = (size_t)0 - (size_t)delta;
    report_released(current - released, released);
    void *r = real(delta);
    if (r != (void *)-1) {
        int saved_errno = errno;
        report_released(current - released, released);
        errno = saved_errno;
    }
    return r;
}

RS_EXPORT int brk(void *addr)
{
    int (*real)(void *) = RS_REAL(brk);
    void *(*real_sbrk)(intptr_t) = RS_REAL(sbrk);
    if (!real || !real_sbrk) {
        errno = ENOMEM;
        return -1;
    }
    char *current = real_sbrk(0);
    bool shrinks = current != (void *)-1 && (char *)addr < current;
    if (shrinks)
        report_released(addr, (size_t)(current - (char *)addr));
    int r = real(addr);
    if (r == 0 && shrinks) {
        int saved_errno = errno;
        report_released(addr, (size_t)(current - (char *)addr));
        errno = saved_errno;
    }
    return r;
}
