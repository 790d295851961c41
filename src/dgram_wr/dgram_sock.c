/*
 * dgram_sock.c: a datagram socket's life (attach, bind, connect, close), its RDMA resources, its options, and how
 * callers wait on it (the readiness fd for poll/select/epoll, and blocking calls).
 *
 * The RDMA side exists once the socket is bound, because the UD QP is named by the application's port: on the
 * soft RNIC the QP adopts the application's own socket (rs_rnic_ud_adopt_fd) so RDMA datagrams and plain UDP
 * share it; on a provider that cannot adopt, the QP binds the same address in its own port space and this layer
 * reads the kernel socket itself (plain UDP and discovery). Either way a failure leaves the socket working on the
 * kernel alone.
 *
 * Readiness without a thread of our own: the fd handed to poll/epoll is an epoll fd holding (a) an eventfd that
 * is readable while the socket's mask meets the registered interest, (b) the fds that announce new work: the
 * receive and send CQs' notification fds (kept armed), the CM channel, and (when not adopted) the kernel socket.
 * The kernel wakes a poller when any of them fires; the next call on the socket processes what arrived.
 */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>

#include "common/log.h"
#include "dgram_wr/dgram_int.h"
#include "common/fdutil.h"

void rs_dgram_default_opts(struct rs_dgram_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->probe_timeout_ms = 100;
    o->probe_attempts = 3;
    o->cache_ttl_ms = 10000;
    o->negative_ttl_ms = 10000;
    o->zcopy_threshold = 16384;
}

/* ---- sizing ---- */

uint32_t rs_dg_slots_for(int rcvbuf)
{
    uint32_t n = (uint32_t)(rcvbuf > 0 ? rcvbuf : 0) / RS_DG_SLOT_CHARGE;
    if (n < RS_DG_MIN_SLOTS)
        n = RS_DG_MIN_SLOTS;
    if (n > RS_DG_MAX_SLOTS)
        n = RS_DG_MAX_SLOTS;
    return n;
}

uint32_t rs_dg_lane_size_for(int rcvbuf)
{
    uint64_t v = rcvbuf > 0 ? (uint64_t)rcvbuf : 0;
    v = (v + 65535) & ~(uint64_t)65535;
    if (v < RS_DG_LANE_MIN)
        v = RS_DG_LANE_MIN;
    if (v > RS_DG_LANE_MAX)
        v = RS_DG_LANE_MAX;
    return (uint32_t)v;
}

static int read_sysctl(const char *path, int fallback)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return fallback;
    int v = fallback;
    if (fscanf(f, "%d", &v) != 1)
        v = fallback;
    fclose(f);
    return v;
}

/* What Linux stores for setsockopt(SO_RCVBUF/SO_SNDBUF, val): capped by the sysctl, doubled, floored. */
static int linux_buf(int val, bool force, const char *max_path, int floor)
{
    if (val < 0)
        val = 0;
    if (!force) {
        int max = read_sysctl(max_path, RS_DG_DEFAULT_BUF);
        if (val > max)
            val = max;
    }
    int64_t v = (int64_t)val * 2;
    if (v > INT32_MAX)
        v = INT32_MAX;
    return v < floor ? floor : (int)v;
}

/* ---- references ---- */

static void sock_free(struct rs_dgram_sock *s);

void rs_dgram_hold(struct rs_dgram_sock *s)
{
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_ACQ_REL);
}

void rs_dgram_release(struct rs_dgram_sock *s)
{
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0)
        sock_free(s);
}

/* ---- attach ---- */

int rs_dgram_attach(int fd, const struct rs_dgram_opts *opts, struct rs_dgram_sock **out)
{
    *out = NULL;
    int type = 0, domain = 0;
    socklen_t l = sizeof(type);
    int rc = rs_dg_sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l);
    if (rc)
        return rc;
    l = sizeof(domain);
    rc = rs_dg_sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l);
    if (rc)
        return rc;
    if (type != SOCK_DGRAM || (domain != AF_INET && domain != AF_INET6))
        return -EINVAL;
    struct rs_dgram_sock *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    s->refs = 1;
    s->fd = fd;
    s->family = domain;
    if (opts)
        s->opts = *opts;
    else
        rs_dgram_default_opts(&s->opts);
    struct rs_dgram_opts def;
    rs_dgram_default_opts(&def);
    if (!s->opts.probe_timeout_ms)
        s->opts.probe_timeout_ms = def.probe_timeout_ms;
    if (!s->opts.probe_attempts)
        s->opts.probe_attempts = def.probe_attempts;
    if (!s->opts.cache_ttl_ms)
        s->opts.cache_ttl_ms = def.cache_ttl_ms;
    if (!s->opts.negative_ttl_ms)
        s->opts.negative_ttl_ms = def.negative_ttl_ms;
    if (!s->opts.zcopy_threshold)
        s->opts.zcopy_threshold = def.zcopy_threshold;
    s->instance = rs_dg_random64();
    int fl = (int)rs_dg_sys(syscall(SYS_fcntl, fd, F_GETFL, 0));
    s->nonblock = fl > 0 && (fl & O_NONBLOCK);
    l = sizeof(s->rcvbuf);
    if (rs_dg_sys_getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &s->rcvbuf, &l) != 0)
        s->rcvbuf = RS_DG_DEFAULT_BUF;
    l = sizeof(s->sndbuf);
    if (rs_dg_sys_getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &s->sndbuf, &l) != 0)
        s->sndbuf = RS_DG_DEFAULT_BUF;
    s->notify_fd = rs_fd_move_high(epoll_create1(EPOLL_CLOEXEC));
    s->pending_efd = rs_fd_move_high(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (s->notify_fd < 0 || s->pending_efd < 0) {
        rc = -errno;
        if (s->notify_fd >= 0)
            syscall(SYS_close, s->notify_fd);
        if (s->pending_efd >= 0)
            syscall(SYS_close, s->pending_efd);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return rc;
    }
    struct epoll_event ev = { .events = EPOLLIN, .data.u32 = 0 };
    (void)epoll_ctl(s->notify_fd, EPOLL_CTL_ADD, s->pending_efd, &ev);
    /* Until a QP adopts it, the kernel socket is ours to read: its datagrams wake pollers too. */
    ev.data.fd = fd;
    (void)epoll_ctl(s->notify_fd, EPOLL_CTL_ADD, fd, &ev);
    s->rdma_err = -ENOTCONN;
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    memset(&local, 0, sizeof(local));
    if (rs_dg_sys_getsockname(fd, (struct sockaddr *)&local, &llen) == 0 &&
        ((local.ss_family == AF_INET && ((struct sockaddr_in *)&local)->sin_port) ||
         (local.ss_family == AF_INET6 && ((struct sockaddr_in6 *)&local)->sin6_port))) {
        pthread_mutex_lock(&s->lock);
        s->bound = true;
        s->local = local;
        s->local_len = llen;
        rs_dg_setup_rdma(s);
        /* Attached after connect(): keep the association. */
        struct sockaddr_storage peer;
        socklen_t plen = sizeof(peer);
        if (rs_dg_sys_getpeername(fd, (struct sockaddr *)&peer, &plen) == 0) {
            s->connected = true;
            s->peer_len = rs_dg_addr_for_family(s->family, (struct sockaddr *)&peer, plen, &s->peer_addr);
            s->conn_peer = rs_dg_peer_get(s, (struct sockaddr *)&s->peer_addr, s->peer_len);
        }
        pthread_mutex_unlock(&s->lock);
    }
    *out = s;
    return 0;
}

/* ---- RDMA resources ---- */

static void epoll_watch(struct rs_dgram_sock *s, int fd)
{
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
    if (fd >= 0)
        (void)epoll_ctl(s->notify_fd, EPOLL_CTL_ADD, fd, &ev);
}

static void teardown_rdma(struct rs_dgram_sock *s)
{
    if (s->qp) {
        (void)rs_rnic_destroy_qp(s->qp);
        s->qp = NULL;
    }
    if (s->adopted) {
        s->adopted = false;
        epoll_watch(s, s->fd);      /* ours to read again */
    }
    /* The QP is gone: nothing can place into the regions any more, so they may go. */
    rs_dg_lanes_free(s);
    rs_dg_regs_free(s);
    for (uint32_t k = 0; k < s->nslot_mrs; k++)
        (void)rs_rnic_dereg_mr(s->slot_mrs[k]);
    s->nslot_mrs = 0;
    if (s->stage_mr)
        (void)rs_rnic_dereg_mr(s->stage_mr);
    s->stage_mr = NULL;
    if (s->slot_mem)
        munmap(s->slot_mem, (size_t)s->slots_cap * RS_DG_SLOT_SIZE);
    if (s->stage_mem)
        munmap(s->stage_mem, s->stage_size);
    s->slot_mem = s->stage_mem = NULL;
    if (s->rcq)
        (void)rs_rnic_destroy_cq(s->rcq);
    if (s->scq)
        (void)rs_rnic_destroy_cq(s->scq);
    s->rcq = s->scq = NULL;
    if (s->cm)
        rs_rnic_cm_destroy(s->cm);
    s->cm = NULL;
    rs_dg_dev_put(s->dev);
    s->dev = NULL;
    s->rdma_ready = false;
}

static int post_slot(struct rs_dgram_sock *s, uint32_t i)
{
    uint32_t k = 0;
    while (k + 1 < s->nslot_mrs && i >= s->slot_mr_end[k])
        k++;
    if (k >= s->nslot_mrs || i >= s->slot_mr_end[k])
        return -EINVAL;
    struct rs_rnic_sge sge = { .addr = (uintptr_t)(s->slot_mem + (size_t)i * RS_DG_SLOT_SIZE),
                               .length = RS_DG_SLOT_SIZE, .lkey = s->slot_mrs[k]->lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = RS_DG_WR_SLOT | i, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *bad;
    int rc = rs_rnic_post_recv(s->qp, &wr, &bad);
    if (rc == 0)
        s->slots_posted++;
    return rc;
}

int rs_dg_repost_slot(struct rs_dgram_sock *s, uint32_t i)
{
    return post_slot(s, i);
}

/* Registers slots [nslots, upto) as one more region and posts them. */
static int add_slots(struct rs_dgram_sock *s, uint32_t upto)
{
    if (upto <= s->nslots || s->nslot_mrs >= RS_DG_SLOT_MRS)
        return 0;
    struct rs_rnic_mr *mr;
    int rc = rs_rnic_reg_mr(s->dev->pd, s->slot_mem + (size_t)s->nslots * RS_DG_SLOT_SIZE,
                            (size_t)(upto - s->nslots) * RS_DG_SLOT_SIZE, RS_ACCESS_LOCAL_WRITE, &mr);
    if (rc)
        return rc;
    s->slot_mrs[s->nslot_mrs] = mr;
    s->slot_mr_end[s->nslot_mrs] = upto;
    s->nslot_mrs++;
    uint32_t first = s->nslots;
    s->nslots = upto;
    for (uint32_t i = first; i < upto && rc == 0; i++)
        rc = post_slot(s, i);
    return rc;
}

/*
 * Applications often size SO_RCVBUF after bind (iperf3 -w, ffmpeg's buffer_size): the kernel honours that at
 * once, so we do too. The QP and CQ were made deep enough for the most the sysctl lets SO_RCVBUF reach; only the
 * registration and the posting happen now. A smaller value later does not take receives back.
 */
void rs_dg_grow_slots(struct rs_dgram_sock *s)
{
    if (!s->rdma_ready)
        return;
    uint32_t want = rs_dg_slots_for(s->rcvbuf);
    if (want > s->slots_cap)
        want = s->slots_cap;
    int rc = add_slots(s, want);
    if (rc)
        RS_DEBUG("dgram: fd %d: more receives for SO_RCVBUF %d: %d (%u posted)", s->fd, s->rcvbuf, rc,
                 s->slots_posted);
}

void rs_dg_unmap_region(void *p, size_t len)
{
    if (p)
        munmap(p, len);
}

void *rs_dg_map_region(size_t len)
{
    /* Anonymous and lazily backed: posted receives a small datagram only touches cost one page each. */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void rs_dg_setup_rdma(struct rs_dgram_sock *s)
{
    if (s->rdma_ready || s->closed || !s->bound)
        return;
    if (!s->opts.policy) {
        s->rdma_err = -ENODEV;      /* no rule can ever send a peer to RDMA */
        return;
    }
    int kind = rs_dg_kind_from_env(s->opts.rnic_kind);
    int rc = rs_dg_dev_get(kind, (struct sockaddr *)&s->local, &s->dev);
    if (rc)
        goto fail;
    const struct rs_rnic_caps *caps = rs_rnic_caps(s->dev->rnic);
    s->max_inline = caps->max_inline < 256 ? caps->max_inline : 256;
    s->max_ud_msg = caps->max_ud_msg;
    uint32_t first_slots = rs_dg_slots_for(s->rcvbuf);
    /* Room for what SO_RCVBUF may grow to later without FORCE (the sysctl's cap, doubled as Linux stores it). */
    s->slots_cap = rs_dg_slots_for(linux_buf(INT32_MAX / 2, false, "/proc/sys/net/core/rmem_max", 0));
    if (s->slots_cap < first_slots)
        s->slots_cap = first_slots;
    if (s->slots_cap > caps->max_qp_wr)
        s->slots_cap = caps->max_qp_wr;
    if (first_slots > s->slots_cap)
        first_slots = s->slots_cap;
    s->nslots = 0;
    s->rcq_depth = s->slots_cap + RS_DG_RAW_MAX_COUNT + RS_DG_LANE_RECORDS;
    if (s->rcq_depth > caps->max_cqe)
        s->rcq_depth = caps->max_cqe;
    rc = rs_rnic_create_cq(s->dev->rnic, s->rcq_depth, &s->rcq);
    if (rc == 0)
        rc = rs_rnic_create_cq(s->dev->rnic, RS_DG_SEND_DEPTH, &s->scq);
    if (rc == 0)
        rc = rs_rnic_cm_create(s->dev->rnic, &s->cm);
    if (rc)
        goto fail;
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_UD, .send_cq = s->scq, .recv_cq = s->rcq,
        .max_send_wr = RS_DG_SEND_DEPTH, .max_recv_wr = s->slots_cap,
        .max_send_sge = 4, .max_recv_sge = 1, .max_inline = s->max_inline,
        .sq_sig_all = true, .context = s,
    };
    rc = rs_rnic_create_qp(s->dev->pd, &attr, &s->qp);
    if (rc)
        goto fail;
    s->slot_mem = rs_dg_map_region((size_t)s->slots_cap * RS_DG_SLOT_SIZE);
    s->stage_size = 1u << 18;
    while (s->stage_size < (uint32_t)s->sndbuf && s->stage_size < (16u << 20))
        s->stage_size <<= 1;
    s->stage_mem = rs_dg_map_region(s->stage_size);
    if (!s->slot_mem || !s->stage_mem) {
        rc = -ENOMEM;
        goto fail;
    }
    rc = rs_rnic_reg_mr(s->dev->pd, s->stage_mem, s->stage_size, RS_ACCESS_LOCAL_WRITE, &s->stage_mr);
    if (rc == 0)
        rc = add_slots(s, first_slots);
    if (rc)
        goto fail;
    /* Receives first, then the socket: a datagram-iWARP SEND arriving at once already finds room. */
    uint32_t raw_bytes = (uint32_t)(s->rcvbuf > (int)RS_DG_SLOT_SIZE ? s->rcvbuf : (int)RS_DG_SLOT_SIZE);
    struct rs_rnic_ud_adopt how = { .fd = s->fd, .raw_max_bytes = raw_bytes, .raw_max_count = RS_DG_RAW_MAX_COUNT };
    rc = rs_rnic_ud_adopt_fd(s->qp, &how);
    if (rc == 0) {
        s->adopted = true;
    } else if (rc == -EOPNOTSUPP) {
        /* Same address in the RNIC's own port space; the kernel socket stays ours to read. */
        rc = rs_rnic_ud_bind(s->qp, (struct sockaddr *)&s->local, s->local_len);
        s->adopted = false;
    }
    if (rc)
        goto fail;
    epoll_watch(s, rs_rnic_cq_fd(s->rcq));
    epoll_watch(s, rs_rnic_cq_fd(s->scq));
    epoll_watch(s, rs_rnic_cm_fd(s->cm));
    if (s->adopted)
        (void)epoll_ctl(s->notify_fd, EPOLL_CTL_DEL, s->fd, NULL);
    (void)rs_rnic_cq_arm(s->rcq, false);
    s->rcq_armed = true;
    s->rdma_ready = true;
    s->rdma_err = 0;
    RS_DEBUG("dgram: fd %d on %s (%s), %u receives", s->fd, caps->name, s->adopted ? "adopted" : "own QP",
             s->nslots);
    return;
fail:
    RS_DEBUG("dgram: fd %d stays on the kernel: RDMA set-up failed (%d)", s->fd, rc);
    teardown_rdma(s);
    s->rdma_err = rc;
}

/* ---- bind / connect ---- */

static void note_local(struct rs_dgram_sock *s)
{
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    memset(&local, 0, sizeof(local));
    if (rs_dg_sys_getsockname(s->fd, (struct sockaddr *)&local, &llen) != 0)
        return;
    uint16_t port = local.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&local)->sin6_port
                                                : ((struct sockaddr_in *)&local)->sin_port;
    if (!port)
        return;
    s->bound = true;
    s->local = local;
    s->local_len = llen;
    rs_dg_stats_addresses(s);
    rs_dg_setup_rdma(s);
}

int rs_dgram_bind(struct rs_dgram_sock *s, const struct sockaddr *addr, socklen_t len)
{
    pthread_mutex_lock(&s->lock);
    int rc = s->closed ? -EBADF : rs_dg_sys_bind(s->fd, addr, len);
    if (rc == 0)
        note_local(s);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int rs_dgram_connect(struct rs_dgram_sock *s, const struct sockaddr *addr, socklen_t len)
{
    if (!addr || len < sizeof(sa_family_t))
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    if (s->closed) {
        pthread_mutex_unlock(&s->lock);
        return -EBADF;
    }
    int rc = rs_dg_sys_connect(s->fd, addr, len);
    if (rc == 0) {
        if (addr->sa_family == AF_UNSPEC) {
            s->connected = false;
            s->conn_peer = NULL;
        } else {
            s->connected = true;
            s->peer_len = rs_dg_addr_for_family(s->family, addr, len, &s->peer_addr);
        }
        if (!s->bound)
            note_local(s);
        if (s->connected) {
            /* Discovery starts now, so the first datagram already finds the peer's answer. */
            s->conn_peer = rs_dg_peer_get(s, (struct sockaddr *)&s->peer_addr, s->peer_len);
            if (s->conn_peer && s->rdma_ready)
                (void)rs_dg_peer_tx_state(s, s->conn_peer);
        }
        rs_dg_stats_addresses(s);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int rs_dgram_getsockname(struct rs_dgram_sock *s, struct sockaddr *addr, socklen_t *len)
{
    return rs_dg_sys_getsockname(s->fd, addr, len);
}

int rs_dgram_getpeername(struct rs_dgram_sock *s, struct sockaddr *addr, socklen_t *len)
{
    return rs_dg_sys_getpeername(s->fd, addr, len);
}

/* ---- close ---- */

static void stats_snapshot(struct rs_dgram_sock *s, struct rs_dgram_stats *st);

/* One line per socket that carried traffic: where its datagrams went and what was dropped, so a test that lost
 * datagrams (or saw them on the kernel) can tell why from the log alone. */
static void log_summary(struct rs_dgram_sock *s)
{
    struct rs_dgram_stats st;
    stats_snapshot(s, &st);
    if (!st.tx_kernel && !st.tx_send && !st.tx_record && !st.tx_sink && !st.rx_kernel && !st.rx_rdma &&
        !st.rx_dropped)
        return;
    RS_INFO("dgram: fd %d closed: sent %llu over RDMA (send %llu, lane %llu, sink %llu, %llu bytes), %llu through "
            "the kernel; received %llu over RDMA (%llu bytes, %llu zero copy), %llu plain; dropped %llu (no receive "
            "%llu, no room %llu, queue %llu, lane %llu, partial %llu); lane full %llu",
            s->fd, (unsigned long long)(st.tx_send + st.tx_record + st.tx_sink), (unsigned long long)st.tx_send,
            (unsigned long long)st.tx_record, (unsigned long long)st.tx_sink, (unsigned long long)st.tx_bytes_rdma,
            (unsigned long long)st.tx_kernel, (unsigned long long)st.rx_rdma, (unsigned long long)st.rx_bytes_rdma,
            (unsigned long long)st.rx_zcopy, (unsigned long long)st.rx_kernel, (unsigned long long)st.rx_dropped,
            (unsigned long long)st.rx_drop_no_recv, (unsigned long long)st.rx_drop_no_room,
            (unsigned long long)st.rx_drop_queue, (unsigned long long)st.rx_drop_lane,
            (unsigned long long)st.rx_drop_partial, (unsigned long long)st.lane_full);
}

static int close_sock(struct rs_dgram_sock *s, bool bye)
{
    pthread_mutex_lock(&s->lock);
    if (s->closed) {
        pthread_mutex_unlock(&s->lock);
        return -EBADF;
    }
    /* What the RNIC took still goes out, as a kernel UDP socket's queue does after close: the QP may not be
     * destroyed (flushing it) before its send queue finished, and the goodbye, which goes through the kernel,
     * must not overtake the datagrams (the peer would refuse those of a sender it forgot). On rxe a post
     * transmits at once; on an adapter the queue drains in microseconds. Bounded, in case the device stalls. */
    if (s->rdma_ready && s->sends_out) {
        uint64_t t0 = rs_dg_now_ns();
        rs_dg_tx_drain(s, t0 + RS_DG_CLOSE_DRAIN_NS);
        if (s->sends_out)
            RS_WARN("dgram: fd %d: closing with %u datagram(s) still in the send queue after %llu ms", s->fd,
                    s->sends_out, (unsigned long long)((rs_dg_now_ns() - t0) / 1000000u));
    }
    if (bye)
        rs_dg_peers_bye(s);
    log_summary(s);
    s->closed = true;
    for (struct rs_dg_waiter *w = s->waiters; w; w = w->next)
        rs_dg_efd_signal(w->efd);
    pthread_mutex_unlock(&s->lock);
    rs_dgram_release(s);
    return 0;
}

int rs_dgram_close(struct rs_dgram_sock *s)
{
    return close_sock(s, true);
}

int rs_dgram_test_close_silently(struct rs_dgram_sock *s)
{
    return close_sock(s, false);
}

static void sock_free(struct rs_dgram_sock *s)
{
    pthread_mutex_lock(&s->lock);
    /* Address handles first: they belong to the RNIC, which the last socket's teardown closes. */
    rs_dg_peers_free(s);
    teardown_rdma(s);
    rs_dg_rxq_free_all(s);
    pthread_mutex_unlock(&s->lock);
    syscall(SYS_close, s->notify_fd);
    syscall(SYS_close, s->pending_efd);
    /* Only now: the QP that read the socket is destroyed, so no RNIC thread names this fd number any more. */
    if (s->opts.owns_fd)
        syscall(SYS_close, s->fd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---- readiness ---- */

unsigned rs_dg_mask(struct rs_dgram_sock *s)
{
    unsigned m = 0;
    if (s->rxq_head)
        m |= POLLIN | POLLRDNORM;
    if (!s->rdma_ready || rs_dg_tx_space(s, RS_DG_MAX_V6 + RS_DG_LANE_HDR))
        m |= POLLOUT | POLLWRNORM;
    if (s->so_error)
        m |= POLLERR;
    return m;
}

void rs_dg_changed(struct rs_dgram_sock *s)
{
    if (s->interest_out)
        rs_dg_tx_watch(s);
    unsigned interest = (s->interest_in ? (POLLIN | POLLRDNORM) : 0) | (s->interest_out ? (POLLOUT | POLLWRNORM) : 0);
    unsigned want = rs_dg_mask(s) & (interest | POLLERR);
    if (want && !s->pending_set) {
        rs_dg_efd_signal(s->pending_efd);
        s->pending_set = true;
    } else if (!want && s->pending_set) {
        rs_dg_efd_drain(s->pending_efd);
        s->pending_set = false;
    }
    for (struct rs_dg_waiter *w = s->waiters; w; w = w->next)
        rs_dg_efd_signal(w->efd);
}

unsigned rs_dgram_poll(struct rs_dgram_sock *s)
{
    pthread_mutex_lock(&s->lock);
    if (s->closed) {
        pthread_mutex_unlock(&s->lock);
        return POLLNVAL;
    }
    rs_dg_progress_woken(s);
    unsigned m = rs_dg_mask(s);
    rs_dg_changed(s);
    pthread_mutex_unlock(&s->lock);
    return m;
}

int rs_dgram_fd(const struct rs_dgram_sock *s)
{
    return s->notify_fd;
}

void rs_dgram_interest(struct rs_dgram_sock *s, unsigned events, int delta)
{
    pthread_mutex_lock(&s->lock);
    if (events & (POLLIN | POLLRDNORM)) {
        if (delta > 0)
            s->interest_in++;
        else if (s->interest_in)
            s->interest_in--;
    }
    if (events & (POLLOUT | POLLWRNORM)) {
        if (delta > 0)
            s->interest_out++;
        else if (s->interest_out)
            s->interest_out--;
    }
    if (!s->closed) {
        rs_dg_progress(s);
        rs_dg_changed(s);
    }
    pthread_mutex_unlock(&s->lock);
}

/* ---- blocking ---- */

struct wait_cancel {
    struct rs_dgram_sock *s;
    struct rs_dg_waiter *w;
    bool sink_mine;
};

static void unlink_waiter(struct rs_dgram_sock *s, struct rs_dg_waiter *w)
{
    struct rs_dg_waiter **link = &s->waiters;
    while (*link && *link != w)
        link = &(*link)->next;
    if (*link)
        *link = w->next;
}

/* The thread was cancelled while rs_dg_wait slept (the lock is not held there): leave the socket as if the call
 * had returned, and unlocked. A datagram already placed into the sink is lost with the buffer, as the thread that
 * asked for it is gone. */
static void wait_cancelled(void *arg)
{
    struct wait_cancel *c = arg;
    struct rs_dgram_sock *s = c->s;
    pthread_mutex_lock(&s->lock);
    unlink_waiter(s, c->w);
    rs_dg_efd_drain(c->w->efd);
    if (c->sink_mine && s->sink_active && !s->closed)
        rs_dg_sink_revoke(s);
    pthread_mutex_unlock(&s->lock);
}

int rs_dg_wait(struct rs_dgram_sock *s, uint64_t deadline_ns, bool want_send_space, bool sink_mine)
{
    int efd = rs_dg_thread_efd();
    if (efd < 0)
        return efd;
    struct rs_dg_waiter w = { .next = s->waiters, .efd = efd };
    s->waiters = &w;
    struct pollfd pfd[5];
    int n = 0;
    pfd[n++] = (struct pollfd){ .fd = efd, .events = POLLIN };
    if (s->rdma_ready) {
        pfd[n++] = (struct pollfd){ .fd = rs_rnic_cq_fd(s->rcq), .events = POLLIN };
        pfd[n++] = (struct pollfd){ .fd = rs_rnic_cm_fd(s->cm), .events = POLLIN };
        if (want_send_space)
            pfd[n++] = (struct pollfd){ .fd = rs_rnic_cq_fd(s->scq), .events = POLLIN };
    }
    if (!s->rdma_ready || !s->adopted)
        pfd[n++] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
    struct timespec ts, *tsp = NULL;
    if (deadline_ns) {
        uint64_t now = rs_dg_now_ns();
        uint64_t left = deadline_ns > now ? deadline_ns - now : 0;
        ts.tv_sec = (time_t)(left / 1000000000u);
        ts.tv_nsec = (long)(left % 1000000000u);
        tsp = &ts;
    }
    pthread_mutex_unlock(&s->lock);
    long r;
    struct wait_cancel cancel = { .s = s, .w = &w, .sink_mine = sink_mine };
    int cancel_type = PTHREAD_CANCEL_DEFERRED;
    /* What glibc does around its own blocking system calls: asynchronous cancellation only while asleep, so a
     * request acts at once (or when it arrives) and nowhere else. */
    pthread_cleanup_push(wait_cancelled, &cancel);
    (void)pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, &cancel_type);
    r = rs_dg_sys(syscall(SYS_ppoll, pfd, (unsigned long)n, tsp, NULL, 0));
    (void)pthread_setcanceltype(cancel_type, NULL);
    pthread_cleanup_pop(0);
    pthread_mutex_lock(&s->lock);
    if (r > 0 && s->rdma_ready && (pfd[1].revents & POLLIN))
        s->rcq_hot = true;      /* pfd[1] is the receive CQ's fd */
    if (r > 0 && s->rdma_ready && want_send_space && (pfd[3].revents & POLLIN)) {
        rs_rnic_cq_ack_events(s->scq);      /* pfd[3] is the send CQ's fd; a later completion re-arms it */
        s->scq_armed = false;
    }
    unlink_waiter(s, &w);
    rs_dg_efd_drain(efd);
    if (s->closed)
        return -EBADF;
    if (r == -EINTR)
        return -EINTR;
    if (r < 0)
        return (int)r;
    if (r == 0 && deadline_ns && rs_dg_now_ns() >= deadline_ns)
        return -EAGAIN;
    return 0;
}

/* ---- options ---- */

int rs_dgram_set_nonblock(struct rs_dgram_sock *s, bool nonblock)
{
    pthread_mutex_lock(&s->lock);
    s->nonblock = nonblock;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static uint64_t timeval_ns(const void *val, socklen_t len, int *err)
{
    struct timeval tv;
    if (len < sizeof(tv)) {
        *err = -EINVAL;
        return 0;
    }
    memcpy(&tv, val, sizeof(tv));
    if (tv.tv_sec < 0 || tv.tv_usec < 0 || tv.tv_usec >= 1000000) {
        *err = tv.tv_sec < 0 ? 0 : -EDOM;       /* Linux: a negative time means "never time out" */
        return 0;
    }
    return (uint64_t)tv.tv_sec * 1000000000ull + (uint64_t)tv.tv_usec * 1000u;
}

static int get_timeval(uint64_t ns, void *val, socklen_t *len)
{
    struct timeval tv = { .tv_sec = (time_t)(ns / 1000000000u), .tv_usec = (suseconds_t)(ns % 1000000000u / 1000) };
    if (*len < sizeof(tv))
        return -EINVAL;
    memcpy(val, &tv, sizeof(tv));
    *len = sizeof(tv);
    return 0;
}

static int membership(struct rs_dgram_sock *s, int level, int name, const void *val, socklen_t len)
{
    int rc = rs_dg_sys_setsockopt(s->fd, level, name, val, len);
    if (rc || !s->rdma_ready || s->adopted)
        return rc;      /* an adopting QP reads the socket that just joined */
    /* Our own QP joins too (rdma_join_multicast on verbs), best effort: plain multicast already works. */
    struct sockaddr_storage group, iface;
    memset(&group, 0, sizeof(group));
    memset(&iface, 0, sizeof(iface));
    bool join = name == IP_ADD_MEMBERSHIP || name == IPV6_JOIN_GROUP;
    if (level == IPPROTO_IP && len >= sizeof(struct ip_mreq)) {
        struct ip_mreq m;
        memcpy(&m, val, sizeof(m));
        struct sockaddr_in *g = (struct sockaddr_in *)&group, *i = (struct sockaddr_in *)&iface;
        g->sin_family = i->sin_family = AF_INET;
        g->sin_addr = m.imr_multiaddr;
        i->sin_addr = m.imr_interface;
    } else if (level == IPPROTO_IPV6 && len >= sizeof(struct ipv6_mreq)) {
        struct ipv6_mreq m;
        memcpy(&m, val, sizeof(m));
        struct sockaddr_in6 *g = (struct sockaddr_in6 *)&group;
        g->sin6_family = AF_INET6;
        g->sin6_addr = m.ipv6mr_multiaddr;
    } else {
        return 0;
    }
    int r = join ? rs_rnic_ud_join_multicast(s->qp, (struct sockaddr *)&group,
                                             iface.ss_family ? (struct sockaddr *)&iface : NULL)
                 : rs_rnic_ud_leave_multicast(s->qp, (struct sockaddr *)&group);
    if (r)
        RS_DEBUG("dgram: fd %d: RNIC multicast %s failed (%d); plain multicast unaffected", s->fd,
                 join ? "join" : "leave", r);
    return 0;
}

int rs_dgram_setsockopt(struct rs_dgram_sock *s, int level, int name, const void *val, socklen_t len)
{
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    if (level == SOL_SOCKET && (name == SO_RCVBUF || name == SO_RCVBUFFORCE || name == SO_SNDBUF ||
                                name == SO_SNDBUFFORCE)) {
        int v;
        if (len < sizeof(int)) {
            rc = -EINVAL;
            goto out;
        }
        memcpy(&v, val, sizeof(v));
        bool rcv = name == SO_RCVBUF || name == SO_RCVBUFFORCE;
        bool force = name == SO_RCVBUFFORCE || name == SO_SNDBUFFORCE;
        /* Once the QP reads the socket its kernel buffers stay large (rnic.h); the application's value sizes
         * our own resources instead. Before that, the kernel gets it too, so errors (EPERM on FORCE) are its. */
        if (!s->adopted)
            rc = rs_dg_sys_setsockopt(s->fd, level, name, val, len);
        if (rc == 0) {
            if (rcv) {
                s->rcvbuf = linux_buf(v, force, "/proc/sys/net/core/rmem_max", RS_DG_LINUX_MIN_RCVBUF);
                rs_dg_grow_slots(s);
                if (s->rdma_ready && s->adopted) {
                    uint32_t raw = (uint32_t)(s->rcvbuf > (int)RS_DG_SLOT_SIZE ? s->rcvbuf : (int)RS_DG_SLOT_SIZE);
                    (void)rs_rnic_ud_set_raw_limits(s->qp, raw, RS_DG_RAW_MAX_COUNT);
                }
            } else {
                s->sndbuf = linux_buf(v, force, "/proc/sys/net/core/wmem_max", RS_DG_LINUX_MIN_SNDBUF);
            }
        }
        goto out;
    }
    if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
        uint64_t ns = timeval_ns(val, len, &rc);
        if (rc == 0)
            rc = rs_dg_sys_setsockopt(s->fd, level, name, val, len);
        if (rc == 0) {
            if (name == SO_RCVTIMEO)
                s->rcvtimeo_ns = ns;
            else
                s->sndtimeo_ns = ns;
        }
        goto out;
    }
    if ((level == IPPROTO_IP && (name == IP_ADD_MEMBERSHIP || name == IP_DROP_MEMBERSHIP)) ||
        (level == IPPROTO_IPV6 && (name == IPV6_JOIN_GROUP || name == IPV6_LEAVE_GROUP))) {
        rc = membership(s, level, name, val, len);
        goto out;
    }
    if (level == RS_SOL_DGRAM) {
        rc = -ENOPROTOOPT;
        goto out;
    }
    rc = rs_dg_sys_setsockopt(s->fd, level, name, val, len);
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void stats_snapshot(struct rs_dgram_sock *s, struct rs_dgram_stats *st)
{
    *st = s->st;
    struct rs_rnic_ud_counters c;
    if (s->rdma_ready && rs_rnic_ud_counters(s->qp, &c) == 0) {
        st->rx_drop_no_recv += c.rx_no_recv;
        st->rx_drop_no_room += c.rx_no_room + c.rx_raw_dropped;
        st->rx_dropped += c.rx_no_recv + c.rx_no_room + c.rx_raw_dropped;
    }
}

int rs_dgram_getsockopt(struct rs_dgram_sock *s, int level, int name, void *val, socklen_t *len)
{
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    if (level == SOL_SOCKET && (name == SO_RCVBUF || name == SO_SNDBUF)) {
        int v = name == SO_RCVBUF ? s->rcvbuf : s->sndbuf;
        if (*len < sizeof(int)) {
            rc = -EINVAL;
        } else {
            memcpy(val, &v, sizeof(v));
            *len = sizeof(v);
        }
    } else if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
        rc = get_timeval(name == SO_RCVTIMEO ? s->rcvtimeo_ns : s->sndtimeo_ns, val, len);
    } else if (level == SOL_SOCKET && name == SO_ERROR && s->so_error) {
        int v = -s->so_error;
        if (*len < sizeof(int)) {
            rc = -EINVAL;
        } else {
            memcpy(val, &v, sizeof(v));
            *len = sizeof(v);
            s->so_error = 0;
            rs_dg_changed(s);
        }
    } else if (level == RS_SOL_DGRAM && name == RS_DGRAM_STATS) {
        if (*len < sizeof(struct rs_dgram_stats)) {
            rc = -EINVAL;
        } else {
            rs_dg_progress(s);
            struct rs_dgram_stats st;
            stats_snapshot(s, &st);
            memcpy(val, &st, sizeof(st));
            *len = sizeof(st);
        }
    } else if (level == RS_SOL_DGRAM) {
        rc = -ENOPROTOOPT;
    } else {
        rc = rs_dg_sys_getsockopt(s->fd, level, name, val, len);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int rs_dgram_inq(struct rs_dgram_sock *s)
{
    pthread_mutex_lock(&s->lock);
    rs_dg_progress(s);
    int v = s->rxq_head ? (int)s->rxq_head->len : 0;
    pthread_mutex_unlock(&s->lock);
    return v;
}

struct rs_rnic *rs_dgram_test_rnic(struct rs_dgram_sock *s)
{
    return s->dev ? s->dev->rnic : NULL;
}

/* ---- byte-buffer wrappers ---- */

ssize_t rs_dgram_sendto(struct rs_dgram_sock *s, const void *buf, size_t len, int flags, const struct sockaddr *to,
                        socklen_t tolen)
{
    struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
    struct msghdr msg = { .msg_name = (void *)to, .msg_namelen = to ? tolen : 0, .msg_iov = &iov, .msg_iovlen = 1 };
    return rs_dgram_sendmsg(s, &msg, flags);
}

ssize_t rs_dgram_recvfrom(struct rs_dgram_sock *s, void *buf, size_t len, int flags, struct sockaddr *from,
                          socklen_t *fromlen)
{
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    struct msghdr msg = { .msg_name = from, .msg_namelen = from && fromlen ? *fromlen : 0, .msg_iov = &iov,
                          .msg_iovlen = 1 };
    ssize_t n = rs_dgram_recvmsg(s, &msg, flags);
    if (n >= 0 && from && fromlen)
        *fromlen = msg.msg_namelen;
    return n;
}

ssize_t rs_dgram_sendmsg(struct rs_dgram_sock *s, const struct msghdr *msg, int flags)
{
    pthread_mutex_lock(&s->lock);
    ssize_t n = s->closed ? -EBADF : rs_dg_sendmsg(s, msg, flags);
    pthread_mutex_unlock(&s->lock);
    return n;
}

ssize_t rs_dgram_recvmsg(struct rs_dgram_sock *s, struct msghdr *msg, int flags)
{
    pthread_mutex_lock(&s->lock);
    ssize_t n = s->closed ? -EBADF : rs_dg_recvmsg(s, msg, flags);
    pthread_mutex_unlock(&s->lock);
    return n;
}
