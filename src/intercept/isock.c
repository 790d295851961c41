/*
 * isock.c: the intercepted socket: which path it takes and why, how it falls back, how waiters sleep on it, and
 * what fork and exec do to it. The interposed calls that drive it are in sock_calls.c and io_calls.c.
 *
 * Paths of a TCP socket (decided at listen or connect, never earlier, because the rules match addresses):
 *   connect  kernel rule -> kernel connect. rdma/both -> SDP connect to the same address and port in the RNIC's
 *            port space (rdma_cm's own port space on verbs; the soft RNIC's shifted TCP ports with a listener
 *            greeting, docs/rnic-rc.md), so no byte of ours reaches a peer that does not run rdmasock. If that
 *            fails (refused, unreachable, timed out, not an rdmasock peer, no RNIC) a both rule connects the
 *            kernel socket instead; a nonblocking connect does so when its outcome is learnt (poll, SO_ERROR,
 *            a second connect, I/O), and the wait fds change (generation).
 *   listen   kernel rule -> kernel listen. both -> kernel listen AND an SDP listener on the same port, so plain
 *            TCP clients and rdmasock clients are both served. rdma -> SDP listener only.
 * A UDP socket is adopted by the datagram layer when a rule may send some of its peers to RDMA; the datagram layer
 * then decides per peer.
 *
 * Fork: RNIC state (QPs, the progress thread) stays with the process that created it. A connection the child
 * inherited is claimed from its owner the first time the child uses it and continues on kernel TCP in both
 * (handover.h; the switch itself, for the owner, a claimer, a peer whose partner handed back, and an exec, is
 * "hand-back" below). Listeners go dormant in the child, and whichever process
 * next waits on or accepts from the listener creates a new one. On the soft RNIC the parent's goes dormant too (its
 * kernel listening socket is parked and shared by the family). On verbs, where an rdma_cm listener cannot be
 * shared, the parent keeps its listener and dispatches each connection to a child that waits (sdp_family.c): the
 * children listen on ports of their own, and a pre-forking parent that never accepts holds no connection.
 */
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fdutil.h"
#include "common/log.h"
#include "common/stats.h"
#include "common/thread.h"
#include "intercept/handover.h"
#include "intercept/isock_int.h"
#include "intercept/libc.h"
#include "intercept/signals.h"
#include "rnic/rnic.h"

static uint32_t fork_generation;

uint32_t rs_isock_fork_generation(void) { return __atomic_load_n(&fork_generation, __ATOMIC_ACQUIRE); }

/* ---- addresses ---- */

socklen_t rs_addr_unmap(const struct sockaddr *in, socklen_t len, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (in->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)in;
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
            struct sockaddr_in *a4 = (struct sockaddr_in *)out;
            a4->sin_family = AF_INET;
            a4->sin_port = a6->sin6_port;
            memcpy(&a4->sin_addr, &a6->sin6_addr.s6_addr[12], 4);
            return sizeof(*a4);
        }
        memcpy(out, in, sizeof(struct sockaddr_in6));
        return sizeof(struct sockaddr_in6);
    }
    if (in->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        memcpy(out, in, sizeof(struct sockaddr_in));
        return sizeof(struct sockaddr_in);
    }
    return 0;
}

socklen_t rs_addr_to_family(int family, const struct sockaddr *in, socklen_t len, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (family == AF_INET6 && in->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)in;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = a4->sin_port;
        a6->sin6_addr.s6_addr[10] = 0xff;
        a6->sin6_addr.s6_addr[11] = 0xff;
        memcpy(&a6->sin6_addr.s6_addr[12], &a4->sin_addr, 4);
        return sizeof(*a6);
    }
    socklen_t n = len < sizeof(*out) ? len : (socklen_t)sizeof(*out);
    memcpy(out, in, n);
    return n;
}

void rs_addr_copy_out(const struct sockaddr_storage *a, socklen_t alen, struct sockaddr *out, socklen_t *len)
{
    if (!out || !len)
        return;
    memcpy(out, a, alen < *len ? alen : *len);
    *len = alen;
}

static bool is_wildcard(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->ss_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return true;
}

/* ---- object ---- */

static void isock_destroy(struct rs_fd_obj *obj)
{
    struct rs_isock *s = (struct rs_isock *)obj;
    /* Objects inherited across fork belong to the parent's RNIC state: the child leaves them alone. */
    bool mine = s->owner == rs_self_pid();
    /* The notification fds close when the lower layer frees its socket, which may be later (an orphaned SDP
     * connection finishing its close): stop guarding the numbers now, before they can be reused. */
    if (s->sdp && mine) {
        rs_fd_unmark_internal(rs_sdp_fd(s->sdp));
        rs_sdp_release(s->sdp);
    }
    for (uint32_t i = 0; mine && i < s->n_retired; i++)
        rs_sdp_release(s->retired[i]);
    free(s->retired);
    if (s->dg && mine) {
        rs_fd_unmark_internal(rs_dgram_fd(s->dg));
        rs_fd_unmark_internal(s->dg_fd);
        rs_dgram_release(s->dg);     /* the last reference closes dg_fd (owns_fd) */
    }
    if (s->handed_fd >= 0) {
        rs_fd_unmark_internal(s->handed_fd);
        RS_REAL(close)(s->handed_fd);
    }
    rs_stats_slot_release(s->stats_slot);
    free(s);
}

struct rs_isock *rs_isock_get(int fd)
{
    return (struct rs_isock *)rs_fd_get_type(fd, RS_FD_SOCK);
}

void rs_isock_put(struct rs_isock *s)
{
    if (s)
        rs_fd_obj_put(&s->obj);
}

struct rs_fd_obj *rs_isock_obj(struct rs_isock *s) { return &s->obj; }

uint32_t rs_isock_generation(struct rs_isock *s) { return __atomic_load_n(&s->generation, __ATOMIC_ACQUIRE); }

static void bump_generation(struct rs_isock *s) { __atomic_add_fetch(&s->generation, 1, __ATOMIC_ACQ_REL); }

/* True when some rule may put a UDP socket of this program on RDMA (else UDP sockets are never tracked). */
static bool udp_may_convert(void)
{
    const struct rs_policy *p = rs_policy_get();
    if (p->kernel_only || !p->config)
        return false;
    for (size_t i = 0; i < p->config->n_rules; i++) {
        const struct rs_rule *r = &p->config->rules[i];
        if (r->proto == RS_PROTO_UDP && r->mode != RS_MODE_KERNEL)
            return true;
    }
    return false;
}

static int rnic_kind_for(const struct rs_rule *rule)
{
    enum rs_transport t = rule && rule->transport != RS_TRANSPORT_AUTO ? rule->transport : rs_policy_get()->transport;
    if (t == RS_TRANSPORT_SOFT)
        return RS_RNIC_KIND_SOFT;
    if (t == RS_TRANSPORT_VERBS)
        return RS_RNIC_KIND_VERBS;
    return 0;
}

static void dgram_attach(struct rs_isock *s, int fd)
{
    static struct rs_dgram_config_policy cfg_policy;
    const struct rs_policy *p = rs_policy_get();
    cfg_policy.cfg = p->config;
    cfg_policy.program = p->program;
    struct rs_dgram_opts opts;
    rs_dgram_default_opts(&opts);
    opts.policy = rs_dgram_config_policy;
    opts.policy_arg = &cfg_policy;
    opts.rnic_kind = rnic_kind_for(NULL);
    /* The datagram layer reads the socket from the RNIC's thread until it is freed: give it a name of its own,
     * so the application's close/dup2 on its fd number never pulls the socket from under it, and let the layer
     * close that name itself once its QP is gone (closing it at the application's close raced the RNIC's
     * thread, which could still change its watch on the closed number: libev aborts on EBADF). */
    opts.owns_fd = true;
    int priv = RS_REAL(fcntl)(fd, F_DUPFD_CLOEXEC, 64);
    if (priv < 0)
        return;
    struct rs_dgram_sock *dg;
    int r = rs_dgram_attach(priv, &opts, &dg);
    if (r != 0) {
        RS_LOG_ONCE(RS_LOG_WARN, "UDP socket stays on the kernel: datagram layer: %s", strerror(-r));
        RS_REAL(close)(priv);
        return;
    }
    rs_fd_mark_internal(priv);
    rs_fd_mark_internal(rs_dgram_fd(dg));
    rs_dgram_hold(dg);
    s->dg = dg;
    s->dg_fd = priv;
    RS_STATS_ADD(sockets_rdma[RS_STATS_PROTO_UDP], 1);
    s->stats_slot = rs_stats_slot_acquire(fd, RS_STATS_PROTO_UDP);
    rs_stats_slot_set_role(s->stats_slot, RS_STATS_ROLE_DATAGRAM);
    rs_stats_slot_set_path(s->stats_slot, RS_STATS_PATH_RDMA, RS_REASON_RULE_RDMA);
    /* The datagram layer counts what it moves over RDMA (and the addresses) in the slot and process counters. */
    rs_dgram_set_stats_slot(dg, s->stats_slot);
    __atomic_store_n(&s->path, RS_IPATH_DGRAM, __ATOMIC_RELEASE);
}

struct rs_isock *rs_isock_create(int fd, int family, int type, int protocol)
{
    int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (family != AF_INET && family != AF_INET6)
        return NULL;
    bool stream = base == SOCK_STREAM && (protocol == 0 || protocol == IPPROTO_TCP);
    bool dgram = base == SOCK_DGRAM && (protocol == 0 || protocol == IPPROTO_UDP);
    if (!stream && !dgram)
        return NULL;
    if (rs_policy_get()->kernel_only)
        return NULL;
    if (dgram && !udp_may_convert())
        return NULL;
    struct rs_isock *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    rs_fd_obj_init(&s->obj, RS_FD_SOCK, isock_destroy);
    rs_lock_init(&s->lock);
    rs_cond_init(&s->hb_cond);
    s->ho_slot = -1;
    s->handed_fd = -1;
    s->family = family;
    s->type = base;
    s->protocol = protocol;
    s->nfds = 1;
    s->owner = rs_self_pid();
    s->dg_fd = -1;
    s->stats_slot = -1;
    s->path = RS_IPATH_UNDECIDED;
    RS_STATS_ADD(sockets_seen[dgram ? RS_STATS_PROTO_UDP : RS_STATS_PROTO_TCP], 1);
    if (dgram) {
        dgram_attach(s, fd);
        if (!s->dg) {
            rs_fd_obj_put(&s->obj);
            return NULL;
        }
    }
    int err;
    struct rs_fd_obj *old = rs_fd_set(fd, &s->obj, &err);
    rs_fd_obj_put(old);
    rs_fd_obj_put(&s->obj);         /* the table holds it now */
    if (err != 0)
        return NULL;
    return s;
}

int rs_isock_install(struct rs_isock *s, int fd)
{
    int err;
    __atomic_add_fetch(&s->nfds, 1, __ATOMIC_ACQ_REL);
    struct rs_fd_obj *old = rs_fd_set(fd, &s->obj, &err);
    if (err != 0) {
        __atomic_sub_fetch(&s->nfds, 1, __ATOMIC_ACQ_REL);
        return err;
    }
    if (old && old->type == RS_FD_SOCK && old != &s->obj)
        __atomic_sub_fetch(&((struct rs_isock *)old)->nfds, 1, __ATOMIC_ACQ_REL);
    rs_fd_obj_put(old);
    return 0;
}

int rs_isock_last_close(struct rs_isock *s)
{
    rs_wait_isock_closed(s);
    rs_lock(&s->lock);
    int r = 0;
    if (s->sdp && s->owner == rs_self_pid()) {
        if (s->hb_busy) {
            /* A hand-back is under way (a claim, an exec on another thread): it closes the SDP side when done,
             * seeing no name left. */
        } else if (s->handed_fd < 0 && s->ho_slot >= 0 && rs_ho_owner_closing(s)) {
            /* Forked processes still hold the connection: closing here must not end it. The hand-over server
             * hands it back and keeps the kernel socket for them. */
            RS_DEBUG("isock: connection closed here while forked processes hold it: handing it back");
        } else {
            if (s->handed_fd >= 0) {
                rs_fd_unmark_internal(s->handed_fd);
                RS_REAL(close)(s->handed_fd);
                s->handed_fd = -1;
            }
            r = rs_sdp_close(s->sdp);
        }
    } else if (s->path == RS_IPATH_SDP && s->owner != rs_self_pid() && s->ho_slot >= 0) {
        /* Inherited and never used here: this process no longer holds it. */
        rs_ho_holder_leave(s);
    }
    if (s->dg) {
        rs_dgram_close(s->dg);
        if (s->owner != rs_self_pid()) {
            /* A forked child's copy of the private fd: its RNIC state is the parent's, nothing here reads it. */
            rs_fd_unmark_internal(s->dg_fd);
            RS_REAL(close)(s->dg_fd);
            s->dg_fd = -1;
        }
    }
    rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_CLOSED);
    rs_unlock(&s->lock);
    return r == -EWOULDBLOCK ? 0 : r;
}

bool rs_isock_untrack_if_kernel(struct rs_isock *s, int fd)
{
    if (rs_isock_path_now(s) != RS_IPATH_KERNEL || s->reason != RS_REASON_RULE_KERNEL ||
        __atomic_load_n(&s->nfds, __ATOMIC_ACQUIRE) != 1 || __atomic_load_n(&s->seen_by_waiter, __ATOMIC_ACQUIRE))
        return false;
    struct rs_fd_obj *obj = rs_fd_clear(fd);
    if (obj != &s->obj) {
        /* Someone replaced the entry meanwhile (a racing dup2): put it back as it was. */
        if (obj) {
            struct rs_fd_obj *prev = rs_fd_set(fd, obj, NULL);
            rs_fd_obj_put(prev);
            rs_fd_obj_put(obj);
        }
        return false;
    }
    __atomic_store_n(&s->nfds, 0, __ATOMIC_RELEASE);
    rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_CONNECTED);
    rs_fd_obj_put(obj);
    return true;
}

void rs_isock_save_opt(struct rs_isock *s, int level, int name, const void *val, socklen_t len)
{
    if (len > sizeof(s->saved[0].val) || !val)
        return;
    rs_lock(&s->lock);
    int i;
    for (i = 0; i < s->n_saved; i++)
        if (s->saved[i].level == level && s->saved[i].name == name)
            break;
    if (i < RS_ISOCK_SAVED_OPTS) {
        s->saved[i].level = level;
        s->saved[i].name = name;
        s->saved[i].len = len;
        memcpy(s->saved[i].val, val, len);
        if (i == s->n_saved)
            s->n_saved++;
    }
    rs_unlock(&s->lock);
}

/* ---- the SDP side ---- */

static void apply_interest(struct rs_isock *s, int sign)
{
    static const unsigned bits[4] = { POLLIN, POLLOUT, POLLRDHUP, POLLPRI };
    for (int i = 0; i < 4; i++) {
        if (!s->interest[i])
            continue;
        if (s->sdp)
            rs_sdp_interest(s->sdp, bits[i], sign * (int)s->interest[i]);
        else if (s->dg)
            rs_dgram_interest(s->dg, bits[i], sign * (int)s->interest[i]);
    }
}

/* Creates the SDP socket for s with the application's options and the rule's stream settings. */
static int make_sdp(struct rs_isock *s, int fd, int family, bool nonblock, struct rs_sdp_sock **out)
{
    struct rs_sdp_sock *sdp;
    int r = rs_sdp_socket(family, rnic_kind_for(s->rule), nonblock ? RS_SDP_NONBLOCK : 0, &sdp);
    if (r != 0)
        return r;
    for (int i = 0; i < s->n_saved; i++) {
        r = rs_sdp_setsockopt(sdp, s->saved[i].level, s->saved[i].name, s->saved[i].val, s->saved[i].len);
        if (r != 0 && r != -ENOPROTOOPT)
            RS_DEBUG("fd %d: option %d/%d not applied to the SDP socket: %s", fd, s->saved[i].level,
                     s->saved[i].name, strerror(-r));
    }
    if (s->rule) {
        int threshold = -1;
        if (s->rule->stream == RS_STREAM_BCOPY)
            threshold = 0;
        else if (s->rule->zcopy_threshold_given)
            threshold = (int)s->rule->zcopy_threshold;
        else if (s->rule->stream == RS_STREAM_ZCOPY)
            threshold = RS_SDP_ZCOPY_DEFAULT_THRESHOLD;     /* asked for: on any RNIC, not only where it is the
                                                              * default */
        if (threshold >= 0)
            (void)rs_sdp_setsockopt(sdp, RS_SOL_SDP, RS_SDP_ZCOPY_THRESHOLD, &threshold, sizeof(threshold));
        if (s->rule->lend_ring != RS_LEND_RING_AUTO) {
            int lend = s->rule->lend_ring == RS_LEND_RING_ON;
            (void)rs_sdp_setsockopt(sdp, RS_SOL_SDP, RS_SDP_LEND_RING, &lend, sizeof(lend));
        }
    }
    *out = sdp;
    return 0;
}

/* Publishes sdp as the socket's SDP side (lock held). */
static void attach_sdp(struct rs_isock *s, struct rs_sdp_sock *sdp, enum rs_isock_path path)
{
    rs_sdp_hold(sdp);
    s->owner = rs_self_pid();
    __atomic_store_n(&s->sdp, sdp, __ATOMIC_SEQ_CST);
    rs_fd_mark_internal(rs_sdp_fd(sdp));
    apply_interest(s, +1);
    __atomic_store_n(&s->path, path, __ATOMIC_RELEASE);
    bump_generation(s);
}

/* Lock held: releases the SDP sides detached while data calls ran, if none runs any more (a call that starts now
 * finds sdp NULL or a newer side, never one of these). */
static void release_retired_locked(struct rs_isock *s)
{
    if (__atomic_load_n(&s->io_users, __ATOMIC_SEQ_CST) != 0)
        return;         /* the last of them releases them */
    __atomic_store_n(&s->retired_pending, false, __ATOMIC_SEQ_CST);
    for (uint32_t i = 0; i < s->n_retired; i++)
        rs_sdp_release(s->retired[i]);
    s->n_retired = 0;
}

void rs_isock_io_release_retired(struct rs_isock *s)
{
    rs_lock(&s->lock);
    release_retired_locked(s);
    rs_unlock(&s->lock);
}

/* Lock held: s->sdp is no longer published; its reference goes now, or once the data calls that may have read it
 * are over (rs_isock_io_begin). */
static void retire_sdp(struct rs_isock *s)
{
    struct rs_sdp_sock *old = s->sdp;
    __atomic_store_n(&s->sdp, NULL, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->io_users, __ATOMIC_SEQ_CST) == 0) {
        rs_sdp_release(old);
        return;
    }
    if (s->n_retired == s->retired_cap) {
        uint32_t cap = s->retired_cap ? s->retired_cap * 2 : 2;
        struct rs_sdp_sock **grown = realloc(s->retired, cap * sizeof(*grown));
        if (!grown) {
            /* Keeping the reference for ever is safe; releasing it under a running call is not. */
            RS_LOG_ONCE(RS_LOG_WARN, "out of memory: an SDP socket detached under a running call is never freed");
            return;
        }
        s->retired = grown;
        s->retired_cap = cap;
    }
    s->retired[s->n_retired++] = old;
    __atomic_store_n(&s->retired_pending, true, __ATOMIC_SEQ_CST);
    release_retired_locked(s);
}

/* Drops the SDP side (lock held): the application no longer reaches it. */
static void detach_sdp(struct rs_isock *s, bool close_it)
{
    if (!s->sdp)
        return;
    if (s->owner == rs_self_pid()) {
        apply_interest(s, -1);
        rs_fd_unmark_internal(rs_sdp_fd(s->sdp));
        if (close_it)
            rs_sdp_close(s->sdp);
    }
    retire_sdp(s);
    bump_generation(s);
}

static void stats_decided(struct rs_isock *s, int fd, enum rs_stats_role role, enum rs_stats_path path,
                          enum rs_reason reason)
{
    if (s->stats_slot < 0)
        s->stats_slot = rs_stats_slot_acquire(fd, RS_STATS_PROTO_TCP);
    s->reason = reason;
    RS_STATS_ADD(decisions[reason], 1);
    if (path == RS_STATS_PATH_RDMA)
        RS_STATS_ADD(sockets_rdma[RS_STATS_PROTO_TCP], 1);
    else
        RS_STATS_ADD(sockets_kernel[RS_STATS_PROTO_TCP], 1);
    if (path == RS_STATS_PATH_FALLBACK)
        RS_STATS_ADD(fallbacks[reason], 1);
    rs_stats_slot_set_role(s->stats_slot, role);
    rs_stats_slot_set_path(s->stats_slot, path, reason);
    if (s->rule && s->rule->qos_index >= 0)
        rs_stats_slot_set_qos(s->stats_slot, (unsigned)s->rule->qos_index);
}

static enum rs_reason reason_for_error(int err)
{
    switch (err) {
    case ECONNREFUSED:
        return RS_REASON_PEER_REJECTED;
    case ETIMEDOUT:
        return RS_REASON_TIMEOUT;
    case EHOSTUNREACH:
    case ENETUNREACH:
        return RS_REASON_PEER_UNREACHABLE;
    case EPROTO:
        return RS_REASON_PEER_NOT_RDMASOCK;
    case ENODEV:
    case ENXIO:
    case EADDRNOTAVAIL:
        return RS_REASON_NO_DEVICE;
    case ENOMEM:
    case ENOBUFS:
    case EMFILE:
        return RS_REASON_RESOURCE_EXHAUSTED;
    default:
        return RS_REASON_INTERNAL_ERROR;
    }
}

/* ---- listen / accept ---- */

/* Starts the SDP listener on the kernel socket's address (lock held). */
static int start_sdp_listener(struct rs_isock *s, int fd)
{
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    if (RS_REAL(getsockname)(fd, (struct sockaddr *)&local, &llen) != 0)
        return -errno;
    struct sockaddr_storage rdma;
    socklen_t rlen = rs_addr_unmap((struct sockaddr *)&local, llen, &rdma);
    /* An AF_INET6 socket on :: also serves IPv4 clients (unless IPV6_V6ONLY): the SDP listener follows the socket's
     * family, and the RNIC's IPv6 wildcard listener accepts IPv4 as the kernel's does. */
    struct rs_sdp_sock *sdp;
    int r = make_sdp(s, fd, rdma.ss_family, true, &sdp);
    if (r == 0)
        r = rs_sdp_bind(sdp, (struct sockaddr *)&rdma, rlen);
    if (r == 0)
        r = rs_sdp_listen(sdp, s->backlog);
    if (r != 0) {
        if (sdp)
            rs_sdp_close(sdp);
        return r;
    }
    attach_sdp(s, sdp, RS_IPATH_LISTEN);
    s->dormant = false;
    memcpy(&s->local, &local, llen);
    s->local_len = llen;
    return 0;
}

int rs_isock_listen(struct rs_isock *s, int fd, int backlog)
{
    rs_lock(&s->lock);
    enum rs_isock_path path = s->path;
    if (path == RS_IPATH_LISTEN || path == RS_IPATH_KERNEL || path == RS_IPATH_SDP) {
        /* A second listen() only changes the backlog; on anything but a listener the kernel answers. */
        int r = 0;
        if (path != RS_IPATH_LISTEN || s->kernel_listening)
            r = RS_REAL(listen)(fd, backlog) == 0 ? 0 : -errno;
        if (r == 0 && path == RS_IPATH_LISTEN && s->sdp)
            r = rs_sdp_listen(s->sdp, backlog);
        rs_unlock(&s->lock);
        return r;
    }
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    if (RS_REAL(getsockname)(fd, (struct sockaddr *)&local, &llen) != 0) {
        int e = errno;
        rs_unlock(&s->lock);
        return -e;
    }
    struct rs_decision d = rs_policy_decide(RS_PROTO_TCP, RS_ROLE_SERVER, (struct sockaddr *)&local);
    s->rule = d.rule;
    s->mode = d.mode;
    s->backlog = backlog;
    if (d.mode == RS_MODE_KERNEL) {
        int r = RS_REAL(listen)(fd, backlog) == 0 ? 0 : -errno;
        if (r == 0) {
            __atomic_store_n(&s->path, RS_IPATH_KERNEL, __ATOMIC_RELEASE);
            stats_decided(s, fd, RS_STATS_ROLE_LISTENER, RS_STATS_PATH_KERNEL, d.reason);
        }
        rs_unlock(&s->lock);
        return r;
    }
    /* The kernel socket always gets a port (an explicit bind, or the one listen would pick), so the application's
     * getsockname and the SDP listener agree on it. With a port already bound, the SDP listener starts FIRST: a
     * client that waits for the port to open (as scripts and test harnesses do) must find the RDMA side there
     * too, or its first connection falls back to the kernel. */
    bool port_known = ((struct sockaddr_in *)&local)->sin_port != 0;
    int r = port_known ? start_sdp_listener(s, fd) : 0;
    if (d.mode == RS_MODE_BOTH || !port_known) {
        if (RS_REAL(listen)(fd, backlog) != 0) {
            int e = errno;
            if (s->sdp)
                detach_sdp(s, true);
            __atomic_store_n(&s->path, RS_IPATH_UNDECIDED, __ATOMIC_RELEASE);
            rs_unlock(&s->lock);
            return -e;
        }
        s->kernel_listening = true;
    }
    if (!port_known)
        r = start_sdp_listener(s, fd);
    if (r != 0) {
        if (d.mode == RS_MODE_RDMA) {
            RS_ERROR("fd %d: RDMA listener failed (%s) and the rule allows no kernel listener",
                   fd, strerror(-r));
            rs_unlock(&s->lock);
            return r;
        }
        RS_LOG_ONCE(RS_LOG_WARN, "fd %d: RDMA listener failed (%s): serving kernel TCP clients only", fd,
                    strerror(-r));
        __atomic_store_n(&s->path, RS_IPATH_KERNEL, __ATOMIC_RELEASE);
        stats_decided(s, fd, RS_STATS_ROLE_LISTENER, RS_STATS_PATH_FALLBACK, reason_for_error(-r));
        rs_unlock(&s->lock);
        return 0;
    }
    stats_decided(s, fd, RS_STATS_ROLE_LISTENER, RS_STATS_PATH_RDMA, d.reason);
    rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_LISTENING);
    rs_stats_slot_set_addresses(s->stats_slot, (struct sockaddr *)&local, llen, NULL, 0);
    rs_unlock(&s->lock);
    return 0;
}

void rs_isock_revive(struct rs_isock *s, int fd)
{
    if (!__atomic_load_n(&s->dormant, __ATOMIC_ACQUIRE))
        return;
    rs_lock(&s->lock);
    if (s->dormant) {
        s->dormant = false;
        int r = start_sdp_listener(s, fd);
        if (r != 0) {
            RS_LOG_ONCE(RS_LOG_WARN, "fd %d: RDMA listener not recreated after fork (%s)%s", fd, strerror(-r),
                        s->kernel_listening ? ": serving kernel TCP clients only" : "");
            bump_generation(s);
        }
    }
    rs_unlock(&s->lock);
}

/* The application fd for an accepted SDP connection: a kernel socket that never connects stands for it. It is
 * made before a connection is taken off the SDP accept queue, as Linux takes the fd before it looks at its queue:
 * with no fd to give (EMFILE, ENFILE) accept fails and every connection stays queued. */
static int make_placeholder(const struct rs_isock *l, int flags)
{
    int fd = RS_REAL(socket)(l->family, SOCK_STREAM | (flags & (SOCK_NONBLOCK | SOCK_CLOEXEC)), 0);
    return fd >= 0 ? fd : -errno;
}

/* Gives the placeholder fd the accepted connection. On failure the fd is closed and the connection reset: it is off
 * the queue and nobody would ever read it. */
static int install_accepted(struct rs_isock *l, int fd, struct rs_sdp_sock *sdp, const struct sockaddr_storage *peer,
                            socklen_t peer_len)
{
    struct rs_isock *s = calloc(1, sizeof(*s));
    if (!s) {
        RS_REAL(close)(fd);
        struct linger abort_on_close = { 1, 0 };
        (void)rs_sdp_setsockopt(sdp, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
        rs_sdp_close(sdp);
        return -ENOMEM;
    }
    rs_fd_obj_init(&s->obj, RS_FD_SOCK, isock_destroy);
    rs_lock_init(&s->lock);
    rs_cond_init(&s->hb_cond);
    s->ho_slot = -1;
    s->handed_fd = -1;
    /* Linux: an accepted socket starts with its listener's options. */
    memcpy(s->app_opts, l->app_opts, sizeof(s->app_opts));
    s->n_app_opts = l->n_app_opts;
    s->family = l->family;
    s->type = SOCK_STREAM;
    s->nfds = 1;
    s->dg_fd = -1;
    s->stats_slot = -1;
    s->rule = l->rule;
    s->mode = l->mode;
    s->dst_len = rs_addr_to_family(l->family, (const struct sockaddr *)peer, peer_len, &s->dst);
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    if (rs_sdp_getsockname(sdp, (struct sockaddr *)&local, &llen) == 0 && !is_wildcard(&local))
        s->local_len = rs_addr_to_family(l->family, (struct sockaddr *)&local, llen, &s->local);
    else {
        s->local = l->local;
        s->local_len = l->local_len;
    }
    /* sdp's own reference is the application's handle (rs_sdp_close drops it at the last close); attach_sdp
     * adds the isock's, which keeps the memory until the isock goes. */
    attach_sdp(s, sdp, RS_IPATH_SDP);
    int err;
    struct rs_fd_obj *old = rs_fd_set(fd, &s->obj, &err);
    rs_fd_obj_put(old);
    rs_fd_obj_put(&s->obj);
    if (err != 0) {
        rs_sdp_close(sdp);
        RS_REAL(close)(fd);
        return err;
    }
    stats_decided(s, fd, RS_STATS_ROLE_ACCEPTED, RS_STATS_PATH_RDMA, l->reason);
    rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_CONNECTED);
    rs_stats_slot_set_addresses(s->stats_slot, (struct sockaddr *)&s->local, s->local_len,
                                (struct sockaddr *)&s->dst, s->dst_len);
    return fd;
}

/* One nonblocking attempt on each side. Returns the new fd, -EAGAIN when neither had a connection, or an error. */
static int accept_once(struct rs_isock *s, int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    struct rs_sdp_sock *sdp = NULL;
    rs_lock(&s->lock);
    if (s->sdp && s->path == RS_IPATH_LISTEN) {
        sdp = s->sdp;
        rs_sdp_hold(sdp);
    }
    bool kernel = s->kernel_listening || s->path == RS_IPATH_KERNEL;
    rs_unlock(&s->lock);
    if (sdp) {
        int placeholder = make_placeholder(s, flags);
        if (placeholder < 0) {
            rs_sdp_release(sdp);
            return placeholder;
        }
        struct rs_sdp_sock *ns;
        struct sockaddr_storage peer;
        socklen_t plen = sizeof(peer);
        int r = rs_sdp_accept(sdp, (flags & SOCK_NONBLOCK) ? RS_SDP_NONBLOCK : 0, &ns, (struct sockaddr *)&peer,
                              &plen);
        if (r != 0)
            RS_REAL(close)(placeholder);
        if (r != -EAGAIN)
            rs_sdp_release(sdp);
        if (r == 0) {
            int nfd = install_accepted(s, placeholder, ns, &peer, plen);
            if (nfd >= 0 && addr && len) {
                struct rs_isock *n = rs_isock_get(nfd);
                if (n) {
                    rs_addr_copy_out(&n->dst, n->dst_len, addr, len);
                    rs_isock_put(n);
                }
            }
            return nfd;
        }
        if (r != -EAGAIN)
            return r;
    }
    int nfd = -EAGAIN;
    if (kernel) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (!sdp || RS_REAL(poll)(&p, 1, 0) > 0) {
            nfd = RS_REAL(accept4)(fd, addr, len, flags);
            if (nfd < 0)
                nfd = -errno;
        }
        /* Busy with a kernel client: a prefork family's dispatcher sends RDMA clients to processes that wait. */
        if (nfd >= 0 && sdp)
            rs_sdp_note_busy(sdp);
    }
    if (sdp)
        rs_sdp_release(sdp);
    return nfd;
}

int rs_isock_accept(struct rs_isock *s, int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    rs_isock_revive(s, fd);
    enum rs_isock_path path = rs_isock_path_now(s);
    if (path != RS_IPATH_LISTEN) {
        if (path == RS_IPATH_KERNEL || path == RS_IPATH_UNDECIDED) {
            int nfd = RS_REAL(accept4)(fd, addr, len, flags);
            return nfd >= 0 ? nfd : -errno;
        }
        return -EINVAL;
    }
    int fl = RS_REAL(fcntl)(fd, F_GETFL);
    bool nonblock = fl >= 0 && (fl & O_NONBLOCK);
    int r = accept_once(s, fd, addr, len, flags);
    /* A nonblocking accept is one attempt: no timeout to read (an event loop's last accept of a burst, or one
     * that polls by calling accept, pays only for the attempt). */
    if (r != -EAGAIN || nonblock)
        return r;
    /* SO_RCVTIMEO bounds a blocking accept, as in Linux (the kernel socket holds the application's value). */
    struct timeval tv = { 0, 0 };
    socklen_t tvl = sizeof(tv);
    (void)RS_REAL(getsockopt)(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &tvl);
    bool timed = tv.tv_sec || tv.tv_usec;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t deadline = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + (int64_t)tv.tv_sec * 1000 +
                       tv.tv_usec / 1000;
    for (bool first = true;; first = false) {
        if (!first)
            r = accept_once(s, fd, addr, len, flags);
        if (r != -EAGAIN)
            return r;
        /* Blocking accept: sleep on both sides (rules of isock.h), as a kernel accept sleeps. */
        int timeout = -1;
        if (timed) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            int64_t left = deadline - ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
            if (left <= 0)
                return -EAGAIN;
            timeout = (int)left;
        }
        struct pollfd w[RS_ISOCK_WAIT_FDS];
        struct rs_signal_mark mark;
        rs_isock_interest(s, POLLIN, +1);
        int n = rs_isock_wait_fds(s, fd, POLLIN, w);
        unsigned m = rs_isock_poll(s, fd);
        rs_signal_mark(&mark);
        int pr = (m & (POLLIN | POLLERR)) ? 1 : RS_REAL(poll)(w, (nfds_t)n, timeout);
        int e = errno;
        rs_isock_interest(s, POLLIN, -1);
        if (pr < 0 && e == EINTR && (timed || !rs_signal_restart_allowed(&mark)))
            return -EINTR;
    }
}

/* ---- connect and fallback ---- */

static bool may_fall_back(int err)
{
    return err != EINTR && err != EAGAIN && err != EINPROGRESS && err != EISCONN && err != EALREADY &&
           err != EBADF && err != EFAULT;
}

/* Moves s to the kernel path and starts the kernel connect (lock held). Returns 0, -EINPROGRESS or an error. */
static int fall_back_connect(struct rs_isock *s, int fd, int why)
{
    detach_sdp(s, true);
    s->connecting = false;
    __atomic_store_n(&s->path, RS_IPATH_KERNEL, __ATOMIC_RELEASE);
    stats_decided(s, fd, RS_STATS_ROLE_CLIENT, RS_STATS_PATH_FALLBACK, reason_for_error(why));
    RS_DEBUG("fd %d: RDMA connect failed (%s): kernel TCP", fd, strerror(why));
    int r = RS_REAL(connect)(fd, (struct sockaddr *)&s->dst, s->dst_len) == 0 ? 0 : -errno;
    rs_stats_slot_set_state(s->stats_slot, r == 0 ? RS_STATS_STATE_CONNECTED : RS_STATS_STATE_CONNECTING);
    return r;
}

static void connected(struct rs_isock *s, int fd)
{
    s->connecting = false;
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    if (rs_sdp_getsockname(s->sdp, (struct sockaddr *)&local, &llen) == 0)
        s->local_len = rs_addr_to_family(s->family, (struct sockaddr *)&local, llen, &s->local);
    rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_CONNECTED);
    rs_stats_slot_set_addresses(s->stats_slot, (struct sockaddr *)&s->local, s->local_len,
                                (struct sockaddr *)&s->dst, s->dst_len);
    (void)fd;
}

int rs_isock_connect(struct rs_isock *s, int fd, const struct sockaddr *dst, socklen_t len)
{
    rs_lock(&s->lock);
    enum rs_isock_path path = s->path;
    if (path == RS_IPATH_SDP) {
        int r = s->connecting ? -EALREADY : -EISCONN;
        rs_unlock(&s->lock);
        if (r == -EALREADY) {
            rs_isock_settle_connect(s, fd);
            rs_lock(&s->lock);
            r = s->path != RS_IPATH_SDP ? -EALREADY : s->connecting ? -EALREADY : -EISCONN;
            rs_unlock(&s->lock);
        }
        return r;
    }
    if (path != RS_IPATH_UNDECIDED || !dst || len < sizeof(sa_family_t) ||
        (dst->sa_family != AF_INET && dst->sa_family != AF_INET6)) {
        rs_unlock(&s->lock);
        return RS_REAL(connect)(fd, dst, len) == 0 ? 0 : -errno;
    }
    struct sockaddr_storage rdma;
    socklen_t rlen = rs_addr_unmap(dst, len, &rdma);
    if (rlen == 0) {
        rs_unlock(&s->lock);
        return RS_REAL(connect)(fd, dst, len) == 0 ? 0 : -errno;
    }
    struct rs_decision d = rs_policy_decide(RS_PROTO_TCP, RS_ROLE_CLIENT, (struct sockaddr *)&rdma);
    s->rule = d.rule;
    s->mode = d.mode;
    s->dst_len = len < sizeof(s->dst) ? len : (socklen_t)sizeof(s->dst);
    memcpy(&s->dst, dst, s->dst_len);
    if (d.mode == RS_MODE_KERNEL) {
        __atomic_store_n(&s->path, RS_IPATH_KERNEL, __ATOMIC_RELEASE);
        stats_decided(s, fd, RS_STATS_ROLE_CLIENT, RS_STATS_PATH_KERNEL, d.reason);
        rs_unlock(&s->lock);
        return RS_REAL(connect)(fd, dst, len) == 0 ? 0 : -errno;
    }
    int fl = RS_REAL(fcntl)(fd, F_GETFL);
    bool nonblock = fl >= 0 && (fl & O_NONBLOCK);
    struct rs_sdp_sock *sdp = NULL;
    int r = make_sdp(s, fd, rdma.ss_family, nonblock, &sdp);
    if (r == 0) {
        attach_sdp(s, sdp, RS_IPATH_SDP);
        s->connecting = true;
        stats_decided(s, fd, RS_STATS_ROLE_CLIENT, RS_STATS_PATH_RDMA, d.reason);
        rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_CONNECTING);
        /* A blocking connect may take a while: never hold the lock across it. */
        rs_unlock(&s->lock);
        r = rs_sdp_connect(sdp, (struct sockaddr *)&rdma, rlen);
        /* The peer accepted, forked and handed the connection back before this connect returned (a fork-per-
         * connection server is that quick): it is connected, and continues on kernel TCP from the next call. */
        if (r != 0 && r != -EINPROGRESS && r != -EINTR && rs_sdp_handed_back(sdp))
            r = 0;
        rs_lock(&s->lock);
        if (s->sdp != sdp) {
            /* Another thread settled or closed it meanwhile. */
            rs_unlock(&s->lock);
            return r == 0 ? 0 : r;
        }
    }
    if (r == 0) {
        connected(s, fd);
    } else if (r == -EINPROGRESS || r == -EINTR) {
        /* stays connecting */
    } else if (d.mode == RS_MODE_BOTH && may_fall_back(-r)) {
        r = fall_back_connect(s, fd, -r);
    } else {
        s->connecting = false;
        rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_ERROR);
        RS_DEBUG("fd %d: RDMA connect failed (%s) and the rule allows no kernel fallback", fd, strerror(-r));
    }
    rs_unlock(&s->lock);
    return r;
}

void rs_isock_settle_connect(struct rs_isock *s, int fd)
{
    if (!__atomic_load_n(&s->connecting, __ATOMIC_ACQUIRE))
        return;
    rs_lock(&s->lock);
    if (s->connecting && s->sdp) {
        unsigned m = rs_sdp_poll(s->sdp);
        if (m & POLLERR) {
            int err = 0;
            socklen_t el = sizeof(err);
            rs_sdp_getsockopt(s->sdp, SOL_SOCKET, SO_ERROR, &err, &el);
            if (s->mode == RS_MODE_BOTH && err && may_fall_back(err)) {
                int r = fall_back_connect(s, fd, err);
                if (r != 0 && r != -EINPROGRESS)
                    s->pending_error = -r;
            } else {
                s->connecting = false;
                s->pending_error = err ? err : ECONNREFUSED;
            }
        } else if (m & POLLOUT) {
            connected(s, fd);
        }
    }
    rs_unlock(&s->lock);
}

/* ---- hand-back: the connection continues on kernel TCP (isock_int.h, handover.h) ---- */

void rs_isock_record_opt(struct rs_isock *s, int level, int name, const void *val, socklen_t len)
{
    if (!val || len > sizeof(s->app_opts[0].val) || level == RS_SOL_SDP)
        return;
    rs_lock(&s->lock);
    int i;
    for (i = 0; i < s->n_app_opts; i++)
        if (s->app_opts[i].level == level && s->app_opts[i].name == name)
            break;
    if (i < RS_ISOCK_APP_OPTS) {
        s->app_opts[i] = (struct rs_saved_opt){ .level = level, .name = name, .len = len };
        memcpy(s->app_opts[i].val, val, len);
        if (i == s->n_app_opts)
            s->n_app_opts++;
    }
    rs_unlock(&s->lock);
}

bool rs_isock_handed_back(struct rs_isock *s)
{
    return rs_isock_path_now(s) == RS_IPATH_KERNEL && s->reason == RS_ISOCK_REASON_HANDED_BACK && !s->lost;
}

struct names {
    const struct rs_isock *s;
    int *fds;
    int n, cap;
};

static void collect_name(int fd, struct rs_fd_obj *obj, void *arg)
{
    struct names *names = arg;
    if (obj != &names->s->obj)
        return;
    if (names->n == names->cap) {
        int cap = names->cap ? names->cap * 2 : 8;
        int *grown = realloc(names->fds, (size_t)cap * sizeof(int));
        if (!grown)
            return;
        names->fds = grown;
        names->cap = cap;
    }
    names->fds[names->n++] = fd;
}

/* The kernel socket takes the options the application set; TCP_NODELAY only as the application left it (the
 * hand-back's socket comes with it on). */
static void apply_app_opts(const struct rs_isock *s, int kfd)
{
    bool nodelay_set = false;
    for (int i = 0; i < s->n_app_opts; i++) {
        const struct rs_saved_opt *o = &s->app_opts[i];
        if (RS_REAL(setsockopt)(kfd, o->level, o->name, o->val, o->len) != 0)
            RS_DEBUG("hand-back: option %d/%d not applied to the kernel socket: %s", o->level, o->name,
                     strerror(errno));
        nodelay_set |= o->level == IPPROTO_TCP && o->name == TCP_NODELAY;
    }
    if (!nodelay_set) {
        int off = 0;
        (void)RS_REAL(setsockopt)(kfd, IPPROTO_TCP, TCP_NODELAY, &off, sizeof(off));
    }
}

/* Lock held: every name of s in this process now names kfd's socket (kfd stays the caller's), each keeping its
 * close-on-exec flag; the open file's status flags (O_NONBLOCK above all) are the old one's. Only ever called from
 * the application's own calls on s or at exec, never behind its back: a name it closes meanwhile is its race. */
static void switch_names(struct rs_isock *s, int kfd, bool with_options)
{
    struct names names = { .s = s };
    rs_fd_for_each(collect_name, &names);
    if (with_options)
        apply_app_opts(s, kfd);
    int status = names.n > 0 ? RS_REAL(fcntl)(names.fds[0], F_GETFL) : -1;
    for (int i = 0; i < names.n; i++) {
        int fdflags = RS_REAL(fcntl)(names.fds[i], F_GETFD);
        if (RS_REAL(dup3)(kfd, names.fds[i], fdflags >= 0 && (fdflags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0)
            RS_WARN("hand-back: fd %d not switched to the kernel socket: %s", names.fds[i], strerror(errno));
    }
    if (status >= 0)
        (void)RS_REAL(fcntl)(names.fds[0], F_SETFL, status & (O_NONBLOCK | O_ASYNC | O_APPEND | O_NOATIME));
    free(names.fds);
}

/* Lock held: the SDP side is no longer the application's (owner: closed; inherited: the parent's, forgotten). */
static void drop_sdp_side(struct rs_isock *s)
{
    if (s->owner == rs_self_pid()) {
        detach_sdp(s, true);
    } else if (s->sdp) {
        __atomic_store_n(&s->sdp, NULL, __ATOMIC_SEQ_CST);  /* the parent's object: its memory here is a copy */
        bump_generation(s);
    }
    if (s->handed_fd >= 0) {
        rs_fd_unmark_internal(s->handed_fd);
        RS_REAL(close)(s->handed_fd);
        s->handed_fd = -1;
    }
    s->connecting = false;
}

/* Lock held: s continues on kfd (consumed). The owner keeps a copy for the record's holders first. */
static void adopt_locked(struct rs_isock *s, int kfd)
{
    bool owner = s->owner == rs_self_pid();
    if (owner)
        rs_ho_park(s, kfd);
    switch_names(s, kfd, true);
    RS_REAL(close)(kfd);
    drop_sdp_side(s);
    s->reason = RS_ISOCK_REASON_HANDED_BACK;
    __atomic_store_n(&s->path, RS_IPATH_KERNEL, __ATOMIC_RELEASE);
    RS_STATS_ADD(decisions[RS_ISOCK_REASON_HANDED_BACK], 1);
    rs_stats_slot_set_path(s->stats_slot, RS_STATS_PATH_KERNEL, RS_ISOCK_REASON_HANDED_BACK);
    bump_generation(s);
    RS_DEBUG("isock: connection continues on kernel TCP (%s)", owner ? "handed back" : "claimed from its owner");
}

/* Lock held: the connection could not be taken over. The names get a socket whose peer is gone (reads end, writes
 * fail with EPIPE) and SO_ERROR says ECONNRESET: what a reset kernel connection answers. */
static void lost_locked(struct rs_isock *s)
{
    int sv[2];
    if (RS_REAL(socketpair)(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
        RS_REAL(close)(sv[1]);
        switch_names(s, sv[0], false);
        RS_REAL(close)(sv[0]);
    }
    drop_sdp_side(s);
    s->lost = true;
    s->pending_error = ECONNRESET;
    s->reason = RS_ISOCK_REASON_HANDED_BACK;
    __atomic_store_n(&s->path, RS_IPATH_KERNEL, __ATOMIC_RELEASE);
    rs_stats_slot_set_state(s->stats_slot, RS_STATS_STATE_ERROR);
    bump_generation(s);
}

static void wait_not_busy(struct rs_isock *s)
{
    while (s->hb_busy)
        rs_cond_wait(&s->hb_cond, &s->lock);
}

static void set_busy(struct rs_isock *s, bool busy)
{
    s->hb_busy = busy;
    if (!busy)
        rs_cond_broadcast(&s->hb_cond);
}

int rs_isock_adopt(struct rs_isock *s)
{
    rs_lock(&s->lock);
    wait_not_busy(s);
    int r = 0;
    if (s->path == RS_IPATH_SDP && s->sdp && s->owner == rs_self_pid()) {
        int kfd = s->handed_fd;
        if (kfd >= 0) {
            rs_fd_unmark_internal(kfd);
            s->handed_fd = -1;
        } else {
            kfd = rs_sdp_take_handback_fd(s->sdp);
        }
        if (kfd >= 0) {
            adopt_locked(s, kfd);
        } else {
            RS_WARN("isock: handed-back connection without its kernel socket (%s)", strerror(-kfd));
            lost_locked(s);
            r = -ECONNRESET;
        }
    }
    rs_unlock(&s->lock);
    return r;
}

int rs_isock_follow(struct rs_isock *s)
{
    if (rs_isock_path_now(s) != RS_IPATH_SDP || __atomic_load_n(&s->connecting, __ATOMIC_ACQUIRE))
        return 0;
    rs_lock(&s->lock);
    if (s->owner == rs_self_pid() || s->path != RS_IPATH_SDP) {
        rs_unlock(&s->lock);
        return 0;
    }
    wait_not_busy(s);
    int r = 0;
    if (s->path != RS_IPATH_SDP) {
        r = 0;                  /* another thread claimed it meanwhile */
    } else if (s->ho_slot < 0) {
        r = -EBADF;
    } else {
        set_busy(s, true);
        rs_unlock(&s->lock);
        int kfd = rs_ho_claim(s);
        rs_lock(&s->lock);
        if (kfd >= 0) {
            adopt_locked(s, kfd);
        } else {
            lost_locked(s);
            r = -ECONNRESET;
        }
        set_busy(s, false);
    }
    rs_unlock(&s->lock);
    return r;
}

int rs_isock_handback(struct rs_isock *s, int timeout_ms, bool adopt_now)
{
    rs_lock(&s->lock);
    wait_not_busy(s);
    int r;
    if (s->path != RS_IPATH_SDP) {
        r = s->reason == RS_ISOCK_REASON_HANDED_BACK && !s->lost ? 0 : -EOPNOTSUPP;
        rs_unlock(&s->lock);
        return r;
    }
    if (!s->sdp || s->owner != rs_self_pid() || s->connecting) {
        rs_unlock(&s->lock);
        return -EOPNOTSUPP;
    }
    if (s->handed_fd >= 0) {
        /* Done before (for an earlier claim); the application has not switched over yet. */
        rs_ho_park(s, s->handed_fd);
        if (adopt_now) {
            int kfd = s->handed_fd;
            rs_fd_unmark_internal(kfd);
            s->handed_fd = -1;
            adopt_locked(s, kfd);
        }
        rs_unlock(&s->lock);
        return 0;
    }
    struct rs_sdp_sock *sdp = s->sdp;
    rs_sdp_hold(sdp);
    set_busy(s, true);
    rs_unlock(&s->lock);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int kfd = rs_sdp_handback(sdp, timeout_ms);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    RS_DEBUG("isock: hand-back %s in %ld us", kfd >= 0 ? "done" : strerror(-kfd),
             (long)((t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000));
    rs_lock(&s->lock);
    bool app_gone = __atomic_load_n(&s->nfds, __ATOMIC_ACQUIRE) == 0;
    if (kfd >= 0) {
        r = 0;
        if (adopt_now || app_gone) {
            adopt_locked(s, kfd);
        } else {
            /* The application's names switch at its next call on them (it sees the SDP side handed back). */
            rs_ho_park(s, kfd);
            s->handed_fd = rs_fd_move_high(kfd);
            rs_fd_mark_internal(s->handed_fd);
        }
    } else {
        r = kfd;
        /* A close the application made meanwhile (or before, for holders) was left to us. */
        if (app_gone && s->sdp == sdp)
            detach_sdp(s, true);
    }
    set_busy(s, false);
    rs_unlock(&s->lock);
    rs_sdp_release(sdp);
    return r;
}

/* ---- waiting ---- */

static int interest_index(unsigned bit)
{
    switch (bit) {
    case POLLIN:
        return 0;
    case POLLOUT:
        return 1;
    case POLLRDHUP:
        return 2;
    default:
        return 3;
    }
}

bool rs_isock_listener(struct rs_isock *s)
{
    return __atomic_load_n(&s->path, __ATOMIC_ACQUIRE) == RS_IPATH_LISTEN;
}

void rs_isock_interest(struct rs_isock *s, unsigned events, int delta)
{
    rs_lock(&s->lock);
    static const unsigned bits[4] = { POLLIN, POLLOUT, POLLRDHUP, POLLPRI };
    for (int i = 0; i < 4; i++) {
        if (!(events & bits[i]))
            continue;
        unsigned *c = &s->interest[interest_index(bits[i])];
        if (delta < 0 && *c < (unsigned)-delta)
            continue;       /* unbalanced removal: ignore rather than wrap */
        *c += (unsigned)delta;
        if (s->sdp && s->owner == rs_self_pid())
            rs_sdp_interest(s->sdp, bits[i], delta);
        else if (s->dg)
            rs_dgram_interest(s->dg, bits[i], delta);
    }
    rs_unlock(&s->lock);
}

int rs_isock_wait_fds(struct rs_isock *s, int fd, unsigned events, struct pollfd out[RS_ISOCK_WAIT_FDS])
{
    __atomic_store_n(&s->seen_by_waiter, true, __ATOMIC_RELEASE);
    rs_isock_revive(s, fd);
    rs_isock_settle_connect(s, fd);
    memset(out, 0, sizeof(struct pollfd) * RS_ISOCK_WAIT_FDS);
    int n = 0;
    rs_lock(&s->lock);
    if (s->path == RS_IPATH_SDP && !(s->sdp && s->owner == rs_self_pid()) && s->ho_slot >= 0 && !s->connecting) {
        /* Inherited across fork: waiting for it is using it. Claimed, it is a kernel socket like any other. (A
         * hand-back of our own connection needs nothing here: its mask wakes the waiter, and rs_isock_poll
         * switches over and moves the generation.) */
        rs_unlock(&s->lock);
        (void)rs_isock_follow(s);
        rs_lock(&s->lock);
    }
    switch (s->path) {
    case RS_IPATH_DGRAM:
        out[n].fd = rs_dgram_fd(s->dg);
        out[n++].events = POLLIN;
        break;
    case RS_IPATH_SDP:
        if (s->sdp && s->owner == rs_self_pid()) {
            out[n].fd = rs_sdp_fd(s->sdp);
            out[n++].events = POLLIN;
        } else {
            out[n].fd = fd;                 /* inherited with no record: the kernel answers (POLLHUP) */
            out[n++].events = (short)events;
        }
        break;
    case RS_IPATH_LISTEN:
        if (s->sdp) {
            out[n].fd = rs_sdp_fd(s->sdp);
            out[n++].events = POLLIN;
        }
        if (s->kernel_listening) {
            out[n].fd = fd;
            out[n++].events = POLLIN;
        }
        break;
    default:
        out[n].fd = fd;
        out[n++].events = (short)events;
        break;
    }
    rs_unlock(&s->lock);
    return n;
}

static unsigned kernel_mask(int fd, unsigned events)
{
    struct pollfd p = { .fd = fd, .events = (short)(events | POLLIN | POLLOUT | POLLRDHUP | POLLPRI) };
    return RS_REAL(poll)(&p, 1, 0) > 0 ? (unsigned)(unsigned short)p.revents : 0;
}

unsigned rs_isock_poll(struct rs_isock *s, int fd)
{
    rs_isock_revive(s, fd);
    rs_isock_settle_connect(s, fd);
    enum rs_isock_path path = rs_isock_path_now(s);
    switch (path) {
    case RS_IPATH_DGRAM:
        return rs_dgram_poll(s->dg);
    case RS_IPATH_SDP: {
        rs_lock(&s->lock);
        struct rs_sdp_sock *sdp = s->sdp && s->owner == rs_self_pid() ? s->sdp : NULL;
        if (sdp)
            rs_sdp_hold(sdp);
        bool handed = s->handed_fd >= 0;
        rs_unlock(&s->lock);
        if (!sdp) {
            /* Inherited across fork: claimed now (or it cannot be), the kernel socket answers. */
            (void)rs_isock_follow(s);
            return kernel_mask(fd, 0) | (s->pending_error ? POLLERR : 0);
        }
        unsigned pending = s->pending_error ? POLLERR : 0;
        unsigned m = rs_sdp_poll(sdp);
        /* A finished hand-back shows as POLLIN | POLLOUT: what is true now is the kernel socket's answer (and the
         * generation moves, so waiters go to sleep on it). */
        if (!handed && (m & (POLLIN | POLLOUT)) == (POLLIN | POLLOUT))
            handed = rs_sdp_handed_back(sdp);
        rs_sdp_release(sdp);
        if (handed) {
            (void)rs_isock_adopt(s);
            if (rs_isock_path_now(s) == RS_IPATH_KERNEL)
                return kernel_mask(fd, 0) | (s->pending_error ? POLLERR : 0);
        }
        return (m & ~POLLNVAL) | pending;
    }
    case RS_IPATH_LISTEN: {
        unsigned m = 0;
        rs_lock(&s->lock);
        struct rs_sdp_sock *sdp = s->sdp;
        if (sdp)
            rs_sdp_hold(sdp);
        bool kernel = s->kernel_listening;
        rs_unlock(&s->lock);
        if (sdp) {
            m |= rs_sdp_poll(sdp) & (POLLIN | POLLERR);
            rs_sdp_release(sdp);
        }
        if (kernel)
            m |= kernel_mask(fd, POLLIN) & (POLLIN | POLLERR);
        return m;
    }
    default: {
        unsigned m = kernel_mask(fd, 0);
        if (s->pending_error)
            m |= POLLERR;
        return m;
    }
    }
}

/* ---- fork and exec ---- */

static void fork_visit(int fd, struct rs_fd_obj *obj, void *arg)
{
    bool child = *(bool *)arg;
    if (obj->type != RS_FD_SOCK)
        return;
    struct rs_isock *s = (struct rs_isock *)obj;
    if (child) {
        rs_lock_init(&s->lock);     /* a parent thread may have held it at the fork */
        rs_cond_init(&s->hb_cond);
        /* The parent's calls in flight and the sides they kept alive: not this process's to count or release. */
        s->io_users = 0;
        s->retired_pending = false;
        s->n_retired = 0;
        s->hb_busy = false;                     /* the parent's hand-back, not ours */
        if (s->handed_fd >= 0) {
            /* The parent's kernel socket, kept for its application: our copy would keep the connection open. */
            rs_fd_unmark_internal(s->handed_fd);
            RS_REAL(close)(s->handed_fd);
            s->handed_fd = -1;
        }
        /* An inherited connection: this process holds it now, until it claims, closes or ends. */
        if (s->path == RS_IPATH_SDP && s->ho_slot >= 0)
            rs_ho_holder_enter(s);
    }
    if (s->path != RS_IPATH_LISTEN || !s->sdp)
        return;
    (void)fd;
    /* Listeners go dormant in both processes (see the top of this file). In the child the SDP object belongs to
     * the parent: forget it without touching it. */
    rs_lock(&s->lock);
    if (s->sdp) {
        if (child) {
            __atomic_store_n(&s->sdp, NULL, __ATOMIC_SEQ_CST);  /* the parent's copy, never used here */
            bump_generation(s);
        } else if (rs_sdp_dispatching(s->sdp)) {
            /* Verbs: this process keeps the port's one rdma_cm listener and hands connections to the processes
             * of the family that wait (sdp_family.c); it does not go dormant. */
            rs_unlock(&s->lock);
            return;
        } else {
            /* Parked, not closed: where the RNIC can share it (soft), clients connecting before some process of
             * the family listens again wait in its backlog instead of being refused. */
            struct rs_sdp_sock *sdp = s->sdp;
            rs_sdp_hold(sdp);
            detach_sdp(s, false);
            rs_sdp_close_parked(sdp);
            rs_sdp_release(sdp);
        }
        s->dormant = true;
    }
    rs_unlock(&s->lock);
}

/* Before the fork: a listener the RNIC cannot share across processes (verbs) becomes its family's dispatcher, with
 * a table the children inherit (sdp_family.c); it stays open in the parent. */
static void fork_prepare_visit(int fd, struct rs_fd_obj *obj, void *arg)
{
    (void)fd;
    (void)arg;
    if (obj->type != RS_FD_SOCK)
        return;
    struct rs_isock *s = (struct rs_isock *)obj;
    rs_lock(&s->lock);
    if (s->path == RS_IPATH_LISTEN && s->sdp && s->owner == rs_self_pid()) {
        int r = rs_sdp_dispatch_enable(s->sdp, false);
        if (r != 0 && r != -EOPNOTSUPP)
            RS_LOG_ONCE(RS_LOG_WARN, "fd %d: RDMA listener cannot dispatch for forked processes (%s)", fd,
                        strerror(-r));
    }
    /* A connection the child inherits gets a record, so that the child can claim it should it use it. */
    if (s->path == RS_IPATH_SDP && !s->connecting) {
        if (s->sdp && s->owner == rs_self_pid())
            (void)rs_ho_prepare_owned(s);
        else if (s->owner != rs_self_pid())
            rs_ho_prepare_held(s);
    }
    rs_unlock(&s->lock);
}

void rs_isock_fork_prepare(void)
{
    rs_ho_fork_prepare_begin();
    if (rs_fd_any(RS_FD_SOCK))
        rs_fd_for_each(fork_prepare_visit, NULL);
}

void rs_isock_fork_parent(void)
{
    bool child = false;
    if (rs_fd_any(RS_FD_SOCK))
        rs_fd_for_each(fork_visit, &child);
    rs_ho_fork_parent();
    __atomic_add_fetch(&fork_generation, 1, __ATOMIC_ACQ_REL);
}

void rs_isock_fork_child(void)
{
    bool child = true;
    rs_ho_fork_child();
    if (rs_fd_any(RS_FD_SOCK))
        rs_fd_for_each(fork_visit, &child);
    __atomic_add_fetch(&fork_generation, 1, __ATOMIC_ACQ_REL);
}

void rs_isock_fork_returned(pid_t child)
{
    rs_ho_fork_returned(child);
}

/* ---- exec ---- */

struct exec_sock {
    struct rs_isock *s;             /* held */
    bool survives;                  /* some name has no FD_CLOEXEC */
};

struct exec_list {
    struct exec_sock *socks;
    int n, cap;
};

static void exec_visit(int fd, struct rs_fd_obj *obj, void *arg)
{
    struct exec_list *list = arg;
    if (obj->type != RS_FD_SOCK)
        return;
    struct rs_isock *s = (struct rs_isock *)obj;
    if (rs_isock_path_now(s) != RS_IPATH_SDP || __atomic_load_n(&s->connecting, __ATOMIC_ACQUIRE))
        return;
    int flags = RS_REAL(fcntl)(fd, F_GETFD);
    bool survives = flags >= 0 && !(flags & FD_CLOEXEC);
    for (int i = 0; i < list->n; i++) {
        if (list->socks[i].s == s) {
            list->socks[i].survives |= survives;
            return;
        }
    }
    if (list->n == list->cap) {
        int cap = list->cap ? list->cap * 2 : 8;
        struct exec_sock *grown = realloc(list->socks, (size_t)cap * sizeof(*grown));
        if (!grown)
            return;
        list->socks = grown;
        list->cap = cap;
    }
    rs_fd_obj_hold(obj);
    list->socks[list->n++] = (struct exec_sock){ s, survives };
}

void rs_isock_before_exec(void)
{
    /*
     * A converted connection whose fd crosses the exec (no CLOEXEC on some name) continues there as kernel TCP: the
     * new image has none of rdmasock's state, so the connection is handed back now (claimed, if it was inherited)
     * and its names switched to the kernel socket, with the stream intact. A hand-back that fails (a peer without
     * it, no answer within RS_HO_HANDBACK_MS) leaves what was there before: the unconnected kernel socket that stood
     * for the connection (logged). A connection this process inherited and that does not cross the exec is no
     * longer held here.
     */
    if (rs_fd_any(RS_FD_SOCK)) {
        struct exec_list list = { 0 };
        rs_fd_for_each(exec_visit, &list);
        for (int i = 0; i < list.n; i++) {
            struct rs_isock *s = list.socks[i].s;
            bool inherited = s->owner != rs_self_pid();
            int r = 0;
            if (list.socks[i].survives)
                r = inherited ? rs_isock_follow(s) : rs_isock_handback(s, RS_HO_HANDBACK_MS, true);
            else if (inherited && s->ho_slot >= 0)
                rs_ho_holder_leave_for_exec(s);
            if (r != 0)
                RS_WARN("exec: a connection crossing the exec was not handed back to kernel TCP (%s): the new "
                        "program gets an unconnected socket", strerror(-r));
            rs_isock_put(s);
        }
        free(list.socks);
    }
    /* The new image starts without rdmasock state; its own preload (if any) creates a fresh statistics area
     * under the same pid, so this one must go first. */
    rs_stats_close();
}

void rs_isock_before_exit(void)
{
    /* What exit() does through atexit: closed connections deliver their last bytes (bounded), and the statistics
     * area is withdrawn. */
    rs_sdp_exit_now();
    rs_stats_close();
}

void rs_isock_exec_failed(void)
{
    rs_ho_exec_failed();
    /* The program goes on in this image: so do its statistics (`rdmasock stat` finds them again). */
    if (rs_stats_republish() != 0)
        RS_DEBUG("statistics area not republished after the failed exec");
}
