/*
 * dgram_tx.c: the sending side of a datagram socket (docs/dgram.md §5).
 *
 * Per datagram: the destination's state decides the path (dgram_peer.c). Over RDMA the method is, in order:
 *   - a sink the peer advertised (wrecord, large datagram, fits, fresh): Write-Record straight into the buffer
 *     its recv is waiting with;
 *   - the lane the peer reserved for us (wrecord), while the window it reported leaves room: Write-Record of
 *     [position | sequence | length | datagram] at the next lane position;
 *   - otherwise an untagged SEND into the peer's posted receives (sendrecv, groups, lane full).
 * UDP completes a send when the kernel took the datagram, and the application may reuse its buffer at once, so
 * the bytes are copied at post time: inline into the work request for small datagrams, else into the socket's
 * registered staging ring, which completions free in order. When the ring is full a blocking send waits and a
 * nonblocking one fails with -EAGAIN, as a full UDP send buffer does.
 */
#include <string.h>

#include "common/log.h"
#include "dgram_wr/dgram_int.h"

#define STAGE_ALIGN 64u
#define POS_MASK ((1ull << 62) - 1)

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}

/* ---- staging ring ---- */

bool rs_dg_tx_space(const struct rs_dgram_sock *s, uint32_t len)
{
    if (!s->stage_mem)
        return true;
    if (s->sends_out >= RS_DG_SEND_DEPTH)
        return false;
    uint64_t used = s->stage_head - s->stage_tail;
    /* Room for len plus the worst padding at the ring's end. */
    return used + 2ull * (len + STAGE_ALIGN) <= s->stage_size;
}

/* Reserves len bytes; their ring position, or -1 when full. */
static int64_t stage_alloc(struct rs_dgram_sock *s, uint32_t len)
{
    uint64_t need = (len + STAGE_ALIGN - 1) & ~(uint64_t)(STAGE_ALIGN - 1);
    uint64_t off = s->stage_head % s->stage_size;
    uint64_t pos = s->stage_head;
    if (off + need > s->stage_size)
        pos += s->stage_size - off;         /* a region never wraps: skip to the ring's start */
    if (pos + need - s->stage_tail > s->stage_size)
        return -1;
    s->stage_head = pos + need;
    return (int64_t)pos;
}

bool rs_dg_tx_reap(struct rs_dgram_sock *s)
{
    bool any = false;
    struct rs_rnic_wc wc[16];
    int n;
    /* Only a sender waiting for room arms the send CQ, so reaping normally makes no system call. */
    while ((n = rs_rnic_poll_cq(s->scq, 16, wc)) > 0) {
        if (s->scq_armed) {
            rs_rnic_cq_ack_events(s->scq);
            s->scq_armed = false;
        }
        any = true;
        for (int i = 0; i < n; i++) {
            if (s->sends_out)
                s->sends_out--;
            if ((wc[i].wr_id & ~POS_MASK) == RS_DG_WR_STAGE) {
                uint64_t end = wc[i].wr_id & POS_MASK;
                /* Completions come in posting order: everything before this end is free. */
                if (end > s->stage_tail)
                    s->stage_tail = end;
            }
            if (wc[i].status != RS_WC_SUCCESS && wc[i].status != RS_WC_WR_FLUSH_ERR) {
                RS_DEBUG("dgram: fd %d: a datagram failed (status %d)", s->fd, (int)wc[i].status);
                /* Like ICMP errors on a connected UDP socket: the application hears of it at its next call. */
                if (s->connected && wc[i].status == RS_WC_RETRY_EXC_ERR)
                    s->so_error = -ECONNREFUSED;
            }
        }
        if (n < 16)
            break;
    }
    if (s->sends_out == 0)
        s->stage_tail = s->stage_head;
    return any;
}

void rs_dg_tx_watch(struct rs_dgram_sock *s)
{
    if (!s->rdma_ready || s->scq_armed || rs_dg_tx_space(s, RS_DG_MAX_V6 + RS_DG_LANE_HDR))
        return;
    /* Short of room: let the send CQ's fd (in the readiness epoll) announce the completions that free it. */
    (void)rs_rnic_cq_arm(s->scq, false);
    s->scq_armed = true;
    rs_dg_tx_reap(s);
}

/* One step of waiting for send completions (lock held): arm the send CQ and reap once more if it was not armed (a
 * completion in between would not write the fd), else sleep until one comes or the deadline. 0 or -errno. */
static int await_send_completion(struct rs_dgram_sock *s, uint64_t deadline_ns)
{
    if (!s->scq_armed) {
        (void)rs_rnic_cq_arm(s->scq, false);
        s->scq_armed = true;
    } else {
        int rc = rs_dg_wait(s, deadline_ns, true, false);
        if (rc)
            return rc;
    }
    rs_dg_tx_reap(s);
    return 0;
}

void rs_dg_tx_drain(struct rs_dgram_sock *s, uint64_t deadline_ns)
{
    if (s->rdma_ready)
        rs_dg_tx_reap(s);
    while (s->rdma_ready && s->sends_out) {
        int rc = await_send_completion(s, deadline_ns);
        if (rc && rc != -EINTR)
            break;
    }
}

/* ---- posting ---- */

enum method { M_SEND, M_LANE, M_SINK };

static void gather(uint8_t *dst, const struct msghdr *msg)
{
    for (size_t i = 0; i < msg->msg_iovlen; i++) {
        memcpy(dst, msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
        dst += msg->msg_iov[i].iov_len;
    }
}

/* Waits for staging space (blocking sockets). 0 or -errno. */
static int wait_space(struct rs_dgram_sock *s, uint32_t len, bool nonblock)
{
    uint64_t deadline = s->sndtimeo_ns ? rs_dg_now_ns() + s->sndtimeo_ns : 0;
    while (!rs_dg_tx_space(s, len)) {
        if (nonblock) {
            rs_dg_tx_watch(s);
            rs_dg_changed(s);
            return -EAGAIN;
        }
        int rc = await_send_completion(s, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

/* Posts one datagram; the caller made sure there is room (rs_dg_tx_space), so nothing here waits. */
static ssize_t post(struct rs_dgram_sock *s, struct rs_dg_peer *p, const struct msghdr *msg, uint32_t total,
                    enum method how)
{
    uint32_t hdr = how == M_LANE ? RS_DG_LANE_HDR : 0;
    uint32_t len = total + hdr;
    uint8_t header[RS_DG_LANE_HDR];
    uint64_t lane_pos = 0;
    if (how == M_LANE) {
        uint64_t rec = (len + RS_DG_LANE_ALIGN - 1) & ~(uint64_t)(RS_DG_LANE_ALIGN - 1);
        uint64_t off = p->lane_head % p->lane_size;
        lane_pos = p->lane_head + (off + rec > p->lane_size ? p->lane_size - off : 0);
        put64(header, lane_pos);
        put32(header + 8, p->lane_written);
        put32(header + 12, total);
    }
    struct rs_rnic_sge sge[4];
    int nsge = 0;
    unsigned flags = 0;
    uint64_t wr_id;
    if (len <= s->max_inline && msg->msg_iovlen + (hdr ? 1 : 0) <= 4) {
        /* Small: the RNIC copies it into the work request at post time. */
        if (hdr)
            sge[nsge++] = (struct rs_rnic_sge){ .addr = (uintptr_t)header, .length = hdr };
        for (size_t i = 0; i < msg->msg_iovlen; i++)
            if (msg->msg_iov[i].iov_len)
                sge[nsge++] = (struct rs_rnic_sge){ .addr = (uintptr_t)msg->msg_iov[i].iov_base,
                                                    .length = (uint32_t)msg->msg_iov[i].iov_len };
        flags = RS_SEND_INLINE;
        wr_id = RS_DG_WR_STAGE | (s->stage_head & POS_MASK);
    } else {
        int64_t pos = stage_alloc(s, len);
        if (pos < 0)
            return -EAGAIN;
        uint8_t *dst = s->stage_mem + (uint64_t)pos % s->stage_size;
        if (hdr)
            memcpy(dst, header, hdr);
        gather(dst + hdr, msg);
        sge[nsge++] = (struct rs_rnic_sge){ .addr = (uintptr_t)dst, .length = len, .lkey = s->stage_mr->lkey };
        wr_id = RS_DG_WR_STAGE | (s->stage_head & POS_MASK);
    }
    struct rs_rnic_send_wr wr = {
        .wr_id = wr_id, .opcode = how == M_SEND ? RS_WR_SEND : RS_WR_WRITE_RECORD, .flags = flags,
        .sg_list = sge, .num_sge = nsge, .ud_peer = p->ah,
    };
    if (how == M_LANE) {
        wr.rdma.remote_addr = p->lane_to + lane_pos % p->lane_size;
        wr.rdma.rkey = p->lane_rkey;
    } else if (how == M_SINK) {
        wr.rdma.remote_addr = p->sink_to;
        wr.rdma.rkey = p->sink_rkey;
    }
    struct rs_rnic_send_wr *bad;
    int rc = rs_rnic_post_send(s->qp, &wr, &bad);
    if (rc)
        return rc;
    s->sends_out++;
    if (how == M_LANE) {
        uint64_t rec = (len + RS_DG_LANE_ALIGN - 1) & ~(uint64_t)(RS_DG_LANE_ALIGN - 1);
        p->lane_head = lane_pos + rec;
        p->lane_written++;
        s->st.tx_record++;
    } else if (how == M_SINK) {
        p->sink_ok = false;             /* one datagram per advertisement */
        s->st.tx_sink++;
    } else {
        s->st.tx_send++;
    }
    s->st.tx_bytes_rdma += total;
    rs_dg_stats_rdma_tx(s, total);
    rs_dg_tx_reap(s);
    return total;
}

static enum method choose(struct rs_dgram_sock *s, struct rs_dg_peer *p, uint32_t total)
{
    if (p->group || p->tx_pol.dgram != RS_DGRAM_WRECORD)
        return M_SEND;
    uint64_t now = rs_dg_now_ns();
    if (p->sink_ok && now - p->sink_ns < (uint64_t)RS_DG_SINK_TTL_MS * 1000000u && total >= s->opts.zcopy_threshold &&
        total <= p->sink_len && total <= s->max_ud_msg)
        return M_SINK;
    if (p->lane_ok) {
        uint64_t len = total + RS_DG_LANE_HDR;
        uint64_t rec = (len + RS_DG_LANE_ALIGN - 1) & ~(uint64_t)(RS_DG_LANE_ALIGN - 1);
        uint64_t off = p->lane_head % p->lane_size;
        uint64_t pos = p->lane_head + (off + rec > p->lane_size ? p->lane_size - off : 0);
        if (rec <= p->lane_size && pos + rec <= p->lane_consumed + p->lane_size &&
            (uint32_t)(p->lane_written - p->lane_consumed_records) < p->lane_records)
            return M_LANE;
        s->st.lane_full++;
    }
    return M_SEND;
}

/* ---- sendmsg ---- */

static ssize_t kernel_send(struct rs_dgram_sock *s, const struct msghdr *msg, int flags)
{
    ssize_t n = rs_dg_sys_sendmsg(s->fd, msg, flags);
    if (n >= 0)
        s->st.tx_kernel++;
    return n;
}

static int autobind(struct rs_dgram_sock *s)
{
    struct sockaddr_storage any;
    memset(&any, 0, sizeof(any));
    any.ss_family = (sa_family_t)s->family;
    socklen_t len = s->family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    int rc = rs_dg_sys_bind(s->fd, (struct sockaddr *)&any, len);
    if (rc)
        return rc;
    len = sizeof(s->local);
    rc = rs_dg_sys_getsockname(s->fd, (struct sockaddr *)&s->local, &len);
    if (rc)
        return rc;
    s->local_len = len;
    s->bound = true;
    rs_dg_stats_addresses(s);
    rs_dg_setup_rdma(s);
    return 0;
}

/* Max payload to this destination: IPv4 (or v4-mapped) 65,507, IPv6 65,527. */
static uint32_t max_payload(const struct sockaddr *dst)
{
    if (dst->sa_family == AF_INET6 && !IN6_IS_ADDR_V4MAPPED(&((const struct sockaddr_in6 *)dst)->sin6_addr))
        return RS_DG_MAX_V6;
    return RS_DG_MAX_V4;
}

ssize_t rs_dg_sendmsg(struct rs_dgram_sock *s, const struct msghdr *msg, int flags)
{
    if (flags & MSG_OOB)
        return -EOPNOTSUPP;
    size_t total = 0;
    for (size_t i = 0; i < msg->msg_iovlen; i++) {
        if (msg->msg_iov[i].iov_len > SIZE_MAX - total)
            return -EINVAL;
        total += msg->msg_iov[i].iov_len;
    }
    const struct sockaddr *dst = msg->msg_name;
    socklen_t dstlen = msg->msg_namelen;
    if (!dst || !dstlen) {
        if (!s->connected)
            return -EDESTADDRREQ;
        dst = (const struct sockaddr *)&s->peer_addr;
        dstlen = s->peer_len;
    }
    if (dstlen < sizeof(sa_family_t) || (dst->sa_family != AF_INET && dst->sa_family != AF_INET6))
        return kernel_send(s, msg, flags);      /* the kernel has the right error for it */
    if (total > max_payload(dst))
        return -EMSGSIZE;
    if (!s->bound) {
        int rc = autobind(s);
        if (rc)
            return rc;
    }
    rs_dg_progress(s);
    if (s->so_error && s->connected) {
        int e = s->so_error;
        s->so_error = 0;
        return e;
    }
    bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
    struct rs_dg_peer *p = rs_dg_peer_get(s, dst, dstlen);
    if (!p)
        return kernel_send(s, msg, flags);
    enum rs_dg_peer_state st = rs_dg_peer_tx_state(s, p);
    /* What datagram-iWARP cannot express goes through the kernel: the peer reads plain UDP on the same port. */
    bool plain_only = msg->msg_controllen || (flags & MSG_MORE);
    if (st == RS_DG_PEER_KERNEL || plain_only) {
        if (p->tx_pol.mode == RS_MODE_RDMA && st == RS_DG_PEER_KERNEL && p->tx_pol_valid)
            return p->refused ? p->refused : -EHOSTUNREACH;
        return kernel_send(s, msg, flags);
    }
    if (st != RS_DG_PEER_RDMA) {
        if (p->tx_pol.mode == RS_MODE_BOTH)
            return kernel_send(s, msg, flags);
        /* rdma only: the first datagram to a peer waits for its discovery (bounded by the probe attempts). */
        while ((st = rs_dg_peer_tx_state(s, p)) == RS_DG_PEER_PROBING || st == RS_DG_PEER_RESOLVING) {
            /* Probing: until the next probe is due. Resolving (verbs): the CM channel wakes us. */
            uint64_t deadline = st == RS_DG_PEER_PROBING
                                    ? p->probe_deadline_ns
                                    : rs_dg_now_ns() + (uint64_t)s->opts.probe_timeout_ms * 1000000u;
            int rc = rs_dg_wait(s, deadline, false, false);
            if (rc && rc != -EAGAIN)
                return rc;
            rs_dg_progress(s);
        }
        if (st != RS_DG_PEER_RDMA)
            return p->refused ? p->refused : -EHOSTUNREACH;
    }
    if (p->broadcast) {
        /* Kernel UDP refuses broadcast without SO_BROADCAST; so do we. */
        int on = 0;
        socklen_t l = sizeof(on);
        if (rs_dg_sys_getsockopt(s->fd, SOL_SOCKET, SO_BROADCAST, &on, &l) == 0 && !on)
            return -EACCES;
    }
    if (!rs_dg_tx_space(s, (uint32_t)total + RS_DG_LANE_HDR)) {
        /* The send ring is full (the kernel below the RNIC is slow): wait like a full UDP send buffer, then
         * look at the peer again, since the lock was dropped meanwhile. */
        int rc = wait_space(s, (uint32_t)total + RS_DG_LANE_HDR, nonblock);
        if (rc)
            return rc;
        if (rs_dg_peer_tx_state(s, p) != RS_DG_PEER_RDMA)
            return p->tx_pol.mode == RS_MODE_RDMA ? (p->refused ? p->refused : -EHOSTUNREACH)
                                                  : kernel_send(s, msg, flags);
    }
    ssize_t n = post(s, p, msg, (uint32_t)total, choose(s, p, (uint32_t)total));
    if (n == -ENOMEM || n == -EINVAL) {
        RS_DEBUG("dgram: fd %d: post failed (%d), datagram sent through the kernel", s->fd, (int)n);
        return kernel_send(s, msg, flags);
    }
    return n;
}
