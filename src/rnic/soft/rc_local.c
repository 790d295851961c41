/*
 * rc_local.c: Read Responses placed by one copy when both ends of a connection are processes on this host.
 *
 * Over loopback every payload byte of a Read Response is copied twice by the kernel (into the TCP socket, out of
 * it) and processed as TCP segments in between, the same cost kernel TCP itself pays. When the requester is a
 * process on this host that agreed to it, the responder instead copies the bytes straight from its registered
 * source into the requester's sink with process_vm_writev(2), one copy, and sends a zero-length Read Response
 * whose tagged offset marks how far the sink is filled (docs/rnic-rc.md "Local Read placement", wire-formats.md).
 * A real RNIC does the same for loopback traffic: it never puts it on the wire.
 *
 * Who the requester is. Before its first READ on a loopback connection the requester publishes a small record
 * (its pid and the address of a "mark" in its memory holding a random token) in a file named after the
 * connection's TCP 4-tuple (RS_RC_LOCAL_DIR). The responder reads that file when it serves a READ and checks the
 * token with process_vm_readv(2): a stale file, a reused pid or another pid namespace fails the check, and the
 * kernel's ptrace access rules decide whether the responder may write at all (other users: no). Anything that
 * fails sends the response over TCP as always, for this READ and the rest of the connection.
 *
 * Per READ the responder sets the mark's busy word, then reads allow and the token, then writes the payload, then
 * clears busy; the requester that withdraws (a READ with several SGEs, whose sink is not one range of its memory)
 * or closes clears allow first and then waits for busy to clear before it lets any buffer go (Dekker: each side
 * writes its own word, then reads the other's). So no byte lands in a buffer the application got back.
 *
 * Threads: the requester publishes and withdraws under tx_lock (the thread building the Read Request); the
 * responder places on the progress thread under tx_lock (build_response_fpdu); the receiver accepts marks under
 * rx_lock once `accept_marks` is set.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/log.h"
#include "rnic/soft/rc.h"

#define LOCAL_ENV "RDMASOCK_SOFT_LOCAL_READ"
#define RECORD_MAGIC 0x52534c31u        /* "RSL1" */
#define WITHDRAW_WAIT_US 50000u         /* a responder stuck mid-write longer than this leaves the mark leaked */

/* What the requester's file holds (host byte order: both ends are on this host). */
struct local_record {
    uint32_t magic;
    int32_t pid;
    uint64_t mark_addr;
    uint64_t token[2];
};

static uint64_t local_read_bytes;       /* placed by process_vm_writev, this process (atomic) */

uint64_t rs_rc_local_read_bytes(void)
{
    return __atomic_load_n(&local_read_bytes, __ATOMIC_RELAXED);
}

static bool env_allows(void)
{
    const char *v = getenv(LOCAL_ENV);
    if (!v || !*v || !strcmp(v, "auto"))
        return true;
    if (!strcmp(v, "off") || !strcmp(v, "0"))
        return false;
    RS_LOG_ONCE(RS_LOG_WARN, "%s=%s is not auto or off: using auto", LOCAL_ENV, v);
    return true;
}

/* "<src>.<sport>-<dst>.<dport>" of the requester's view of the connection. */
static bool tuple_path(const struct sockaddr_storage *src, const struct sockaddr_storage *dst, char *out, size_t cap)
{
    char a[INET6_ADDRSTRLEN], b[INET6_ADDRSTRLEN];
    unsigned pa, pb;
    if (src->ss_family == AF_INET && dst->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)src, *d = (const struct sockaddr_in *)dst;
        inet_ntop(AF_INET, &s->sin_addr, a, sizeof(a));
        inet_ntop(AF_INET, &d->sin_addr, b, sizeof(b));
        pa = ntohs(s->sin_port);
        pb = ntohs(d->sin_port);
    } else if (src->ss_family == AF_INET6 && dst->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)src, *d = (const struct sockaddr_in6 *)dst;
        inet_ntop(AF_INET6, &s->sin6_addr, a, sizeof(a));
        inet_ntop(AF_INET6, &d->sin6_addr, b, sizeof(b));
        pa = ntohs(s->sin6_port);
        pb = ntohs(d->sin6_port);
    } else {
        return false;
    }
    int n = snprintf(out, cap, "%s/rdmasock-soft-read-%s.%u-%s.%u", RS_RC_LOCAL_DIR, a, pa, b, pb);
    return n > 0 && (size_t)n < cap;
}

static bool socket_ends(int fd, struct sockaddr_storage *self, struct sockaddr_storage *peer)
{
    socklen_t l1 = sizeof(*self), l2 = sizeof(*peer);
    return rs_soft_sys_getsockname(fd, (struct sockaddr *)self, &l1) == 0 &&
           rs_soft_sys_getpeername(fd, (struct sockaddr *)peer, &l2) == 0;
}

void rs_rc_local_init(struct rs_rc_qp *rc)
{
    struct rs_rc_local *l = &rc->lread;
    l->eligible = env_allows() && rs_rc_addr_is_loopback(&rc->peer);
    l->peer_state = 0;
}

/* ---- requester ---- */

static bool publish(struct rs_rc_qp *rc)
{
    struct rs_rc_local *l = &rc->lread;
    struct sockaddr_storage self, peer;
    if (!socket_ends(rc->fd, &self, &peer) || !tuple_path(&self, &peer, l->path, sizeof(l->path)))
        return false;
    l->mark = calloc(1, sizeof(*l->mark));
    if (!l->mark)
        return false;
    if (getrandom(l->mark->token, sizeof(l->mark->token), GRND_NONBLOCK) != (ssize_t)sizeof(l->mark->token)) {
        free(l->mark);
        l->mark = NULL;
        return false;
    }
    __atomic_store_n(&l->mark->allow, 1u, __ATOMIC_SEQ_CST);
    struct local_record rec = { .magic = RECORD_MAGIC, .pid = (int32_t)getpid(),
                                .mark_addr = (uint64_t)(uintptr_t)l->mark };
    memcpy(rec.token, l->mark->token, sizeof(rec.token));
    int fd = (int)syscall(SYS_openat, AT_FDCWD, l->path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && syscall(SYS_write, fd, &rec, sizeof(rec)) == (long)sizeof(rec);
    if (fd >= 0)
        syscall(SYS_close, fd);
    if (!ok) {
        if (fd >= 0)
            syscall(SYS_unlinkat, AT_FDCWD, l->path, 0);
        RS_DEBUG("soft rc: qp %u cannot publish %s: Read Responses come over TCP", rc->qp->qpn, l->path);
        free(l->mark);
        l->mark = NULL;
        return false;
    }
    __atomic_store_n(&l->accept_marks, true, __ATOMIC_RELEASE);
    return true;
}

/* Clears allow, then waits until no responder is inside a write. false: one still is (give up the mark). */
static bool withdraw_mark(struct rs_rc_local_mark *m)
{
    __atomic_store_n(&m->allow, 0u, __ATOMIC_SEQ_CST);
    for (unsigned waited = 0; __atomic_load_n(&m->busy, __ATOMIC_SEQ_CST); waited += 100) {
        if (waited >= WITHDRAW_WAIT_US)
            return false;
        usleep(100);
    }
    return true;
}

void rs_rc_local_before_read(struct rs_rc_qp *rc, int num_sge)
{
    struct rs_rc_local *l = &rc->lread;
    if (!l->eligible)
        return;
    if (num_sge != 1) {
        /* Its sink is not one range of our memory: from now on every response comes over TCP. */
        l->eligible = false;
        if (l->mark && !withdraw_mark(l->mark))
            RS_WARN("soft rc: qp %u: a local responder did not finish in %u us", rc->qp->qpn, WITHDRAW_WAIT_US);
        return;
    }
    if (!l->mark && !publish(rc))
        l->eligible = false;
}

void rs_rc_local_release(struct rs_rc_qp *rc)
{
    struct rs_rc_local *l = &rc->lread;
    l->eligible = false;
    if (!l->mark)
        return;
    syscall(SYS_unlinkat, AT_FDCWD, l->path, 0);
    if (withdraw_mark(l->mark)) {
        memset(l->mark->token, 0, sizeof(l->mark->token));
        free(l->mark);
    } else {
        RS_WARN("soft rc: qp %u: a local responder did not finish in %u us; its mark is left allocated", rc->qp->qpn,
                WITHDRAW_WAIT_US);
    }
    l->mark = NULL;
}

/* ---- responder ---- */

static bool find_peer(struct rs_rc_qp *rc)
{
    struct rs_rc_local *l = &rc->lread;
    struct sockaddr_storage self, peer;
    char path[sizeof(l->path)];
    /* The requester named the file from its side: its address first. */
    if (!socket_ends(rc->fd, &self, &peer) || !tuple_path(&peer, &self, path, sizeof(path)))
        return false;
    struct local_record rec;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return false;
    long n = syscall(SYS_read, fd, &rec, sizeof(rec));
    syscall(SYS_close, fd);
    if (n != (long)sizeof(rec) || rec.magic != RECORD_MAGIC || rec.pid <= 0)
        return false;
    l->peer_pid = rec.pid;
    l->peer_mark = rec.mark_addr;
    memcpy(l->peer_token, rec.token, sizeof(rec.token));
    return true;
}

static bool peer_rw(struct rs_rc_local *l, bool write, void *local, uint64_t remote, size_t len)
{
    struct iovec li = { local, len }, ri = { (void *)(uintptr_t)remote, len };
    long r = syscall(write ? SYS_process_vm_writev : SYS_process_vm_readv, l->peer_pid, &li, 1UL, &ri, 1UL, 0UL);
    return r == (long)len;
}

static void set_busy(struct rs_rc_local *l, uint32_t v)
{
    peer_rw(l, true, &v, l->peer_mark + offsetof(struct rs_rc_local_mark, busy), sizeof(v));
}

size_t rs_rc_local_place(struct rs_rc_qp *rc, const struct rs_rdmap_read_req *rr, uint32_t sent, uint64_t len)
{
    struct rs_rc_local *l = &rc->lread;
    if (!l->eligible || l->peer_state < 0 || len < RS_RC_LOCAL_MIN)
        return 0;
    if (l->peer_state == 0) {
        l->peer_state = find_peer(rc) ? 1 : -1;
        if (l->peer_state < 0) {
            RS_DEBUG("soft rc: qp %u: the requester published no record: Read Responses go over TCP", rc->qp->qpn);
            return 0;
        }
    }
    /* The token first: nothing is written into a process that is not the requester. */
    struct rs_rc_local_mark m = { 0 };
    bool ours = peer_rw(l, false, &m, l->peer_mark, sizeof(m)) &&
                !memcmp(m.token, l->peer_token, sizeof(m.token));
    if (ours && m.allow) {
        set_busy(l, 1);
        uint32_t allow = 0;
        if (!peer_rw(l, false, &allow, l->peer_mark + offsetof(struct rs_rc_local_mark, allow), sizeof(allow)) ||
            !allow) {
            set_busy(l, 0);
            ours = false;
        }
    }
    if (!ours || !m.allow) {
        /* Gone, not who it said, or withdrawn: TCP from now on. */
        l->peer_state = -1;
        RS_DEBUG("soft rc: qp %u: the requester's mark no longer allows local placement", rc->qp->qpn);
        return 0;
    }
    size_t done = 0;
    rs_soft_mr_read_lock(rc->dev);
    uint8_t *where = NULL;
    enum rs_soft_prot p = rs_soft_mr_check_remote(rc->dev, rc->qp->pd, rr->src_stag, rr->src_to + sent, len,
                                                  RS_ACCESS_REMOTE_READ, &where, NULL);
    if (p == RS_SOFT_PROT_OK) {
        /* The read lock keeps the source registered while the kernel copies from it. */
        struct iovec li = { where, len }, ri = { (void *)(uintptr_t)(rr->sink_to + sent), len };
        long r = syscall(SYS_process_vm_writev, l->peer_pid, &li, 1UL, &ri, 1UL, 0UL);
        if (r > 0) {
            done = (size_t)r;
        } else if (r < 0 && errno != EFAULT) {
            /* EPERM (not ours to write: another user), ESRCH (gone): TCP from now on. A bad sink (EFAULT) is the
             * requester's error, reported by its receive path when the bytes come over TCP. */
            RS_DEBUG("soft rc: qp %u: process_vm_writev: %s: Read Responses go over TCP", rc->qp->qpn,
                     strerror(errno));
            l->peer_state = -1;
        }
    }
    rs_soft_mr_read_unlock(rc->dev);
    set_busy(l, 0);
    if (done)
        __atomic_add_fetch(&local_read_bytes, done, __ATOMIC_RELAXED);
    return done;
}
