/*
 * dgram_rx.c: the receiving side of a datagram socket (docs/dgram.md §5–6).
 *
 * Everything that arrives ends up in ONE first-in first-out receive queue, in arrival order, whatever the way in:
 *   - an untagged SEND completes a posted receive ("slot", sendrecv mode): the datagram stays in the slot until
 *     the application reads it, then the slot is posted again;
 *   - a Write-Record into the lane we reserved for its sender (wrecord mode): the datagram stays in the lane until
 *     read; the sender learns how far we consumed (CONSUMED) and never writes over what is still queued;
 *   - a Write-Record into a sink, i.e. the application's own buffer that a blocked recv advertised: no queue at
 *     all, the datagram is already where the application wants it (zero copy);
 *   - a plain UDP datagram (the RNIC hands it back raw, or we read the kernel socket ourselves when the QP could
 *     not adopt it): it is queued as it is, unless it is one of our control messages, which never reach the
 *     application.
 * A datagram that finds no room (no posted receive, a full lane window, SO_RCVBUF exceeded) is dropped and
 * counted, as kernel UDP counts receive-buffer errors: there is no flow control.
 *
 * Sinks and the race with revocation: a sink is advertised to one peer while one recv waits. When that recv
 * returns something else (or times out), the sink is invalidated; once rs_rnic_mr_invalidate returns, every
 * record placed into it is already on the CQ (rnic.h), and a record that comes later is refused by the RNIC and
 * handed back with its payload (RS_WC_RECV_RAW, RS_WC_REM_ACCESS_ERR): we recognise the revoked STag and queue
 * the payload like any datagram. So revoking never loses a datagram and never writes into a buffer the
 * application got back.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "dgram_wr/dgram_int.h"

#define CQ_BATCH 32
#define KERNEL_BUDGET 64

/* ---- receive queue ---- */

static struct rs_dg_rxq *rxq_alloc(struct rs_dgram_sock *s)
{
    struct rs_dg_rxq *e = s->rxq_free;
    if (e)
        s->rxq_free = e->next;
    else
        e = malloc(sizeof(*e));
    if (e)
        memset(e, 0, sizeof(*e));
    return e;
}

static void rxq_push(struct rs_dgram_sock *s, struct rs_dg_rxq *e)
{
    e->next = NULL;
    if (s->rxq_tail)
        s->rxq_tail->next = e;
    else
        s->rxq_head = e;
    s->rxq_tail = e;
    s->rxq_count++;
}

void rs_dg_rxq_free_all(struct rs_dgram_sock *s)
{
    while (s->rxq_head) {
        struct rs_dg_rxq *e = s->rxq_head;
        s->rxq_head = e->next;
        if (e->kind == RS_DG_RXQ_RAW)
            free(e->raw);
        free(e);
    }
    s->rxq_tail = NULL;
    s->rxq_count = 0;
    while (s->rxq_free) {
        struct rs_dg_rxq *e = s->rxq_free;
        s->rxq_free = e->next;
        free(e);
    }
}

static void count_drop(struct rs_dgram_sock *s, uint64_t *cause)
{
    (*cause)++;
    s->st.rx_dropped++;
}

/* ---- lanes ---- */

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

struct rs_dg_lane *rs_dg_lane_new(struct rs_dgram_sock *s, struct rs_dg_peer *p)
{
    if (s->nlanes >= RS_DG_MAX_LANES || !s->rdma_ready)
        return NULL;
    struct rs_dg_lane *lane = calloc(1, sizeof(*lane));
    if (!lane)
        return NULL;
    lane->size = rs_dg_lane_size_for(s->rcvbuf);
    lane->mem = rs_dg_map_region(lane->size);
    if (!lane->mem || rs_rnic_reg_mr(s->dev->pd, lane->mem, lane->size,
                                     RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_WRITE, &lane->mr) != 0) {
        rs_dg_unmap_region(lane->mem, lane->size);
        free(lane);
        return NULL;
    }
    lane->peer = p;
    lane->next = s->lanes;
    s->lanes = lane;
    s->nlanes++;
    return lane;
}

static void lane_free(struct rs_dgram_sock *s, struct rs_dg_lane *lane)
{
    struct rs_dg_lane **link = &s->lanes;
    while (*link && *link != lane)
        link = &(*link)->next;
    if (*link) {
        *link = lane->next;
        s->nlanes--;
    }
    (void)rs_rnic_dereg_mr(lane->mr);
    rs_dg_unmap_region(lane->mem, lane->size);
    free(lane);
}

void rs_dg_lane_retire(struct rs_dgram_sock *s, struct rs_dg_lane *lane)
{
    /* Nothing may land in it from now on; what is queued is still read from it. */
    (void)rs_rnic_mr_invalidate(lane->mr);
    lane->peer = NULL;
    lane->retired = true;
    if (lane->queued == 0)
        lane_free(s, lane);
}

void rs_dg_lanes_free(struct rs_dgram_sock *s)
{
    while (s->lanes)
        lane_free(s, s->lanes);
}

static struct rs_dg_lane *lane_of(struct rs_dgram_sock *s, uint32_t rkey)
{
    for (struct rs_dg_lane *l = s->lanes; l; l = l->next)
        if (!l->retired && l->mr->rkey == rkey)
            return l;
    return NULL;
}

/* Tells the lane's sender how far it may write now, when that moved enough to matter. */
static void lane_report(struct rs_dgram_sock *s, struct rs_dg_lane *lane)
{
    if (!lane->peer || lane->retired)
        return;
    uint64_t upper = lane->seen_end;
    if (upper - lane->reported < lane->size / 4 && lane->released_since < RS_DG_LANE_RECORDS / 4)
        return;
    /* Nothing still queued may be overwritten: report the start of the oldest queued record of this lane. */
    uint64_t c = lane->seen_end;
    uint32_t seq = lane->seen_seq;
    for (struct rs_dg_rxq *e = s->rxq_head; e; e = e->next) {
        if (e->kind == RS_DG_RXQ_LANE && e->lane == lane && e->lane_pos < c) {
            c = e->lane_pos;
            seq = e->lane_seq;
        }
    }
    if (c <= lane->reported && seq == lane->seq_reported)
        return;
    lane->reported = c;
    lane->seq_reported = seq;
    lane->released_since = 0;
    struct rs_dgw_msg m;
    memset(&m, 0, sizeof(m));
    m.type = RS_DGW_CONSUMED;
    m.u.consumed.lane_rkey = lane->mr->rkey;
    m.u.consumed.records = seq;
    m.u.consumed.consumed = c;
    rs_dg_control_tx(s, lane->peer, &m);
}

/* A Write-Record completed in one of our lanes: validate the record and queue it. */
static void lane_record(struct rs_dgram_sock *s, struct rs_dg_lane *lane, const struct rs_rnic_wc *wc)
{
    uint64_t full = 1;      /* lane records are single segments up to 64,512 bytes, two beyond */
    uint32_t segs = wc->record.seg_len ? (wc->record.msg_len + wc->record.seg_len - 1) / wc->record.seg_len : 1;
    if (segs > 1)
        full = segs >= 64 ? ~0ull : (1ull << segs) - 1;
    if (wc->status != RS_WC_SUCCESS || wc->record.valid_map != full || wc->byte_len != wc->record.msg_len ||
        wc->record.msg_len < RS_DG_LANE_HDR || wc->record.offset + wc->record.msg_len > lane->size) {
        count_drop(s, &s->st.rx_drop_partial);
        return;
    }
    const uint8_t *hdr = lane->mem + wc->record.offset;
    uint64_t pos = be64(hdr);
    uint32_t seq = be32(hdr + 8);
    uint32_t plen = be32(hdr + 12);
    if (plen + RS_DG_LANE_HDR != wc->record.msg_len || pos % lane->size != wc->record.offset ||
        pos < lane->reported || pos + wc->record.msg_len > lane->reported + lane->size) {
        /* Late (behind what we told the sender it may reuse) or not a record of ours: its bytes are not safe. */
        RS_DEBUG("dgram: fd %d: lane record dropped (position %llu, reported %llu, offset %llu, length %u)", s->fd,
                 (unsigned long long)pos, (unsigned long long)lane->reported, (unsigned long long)wc->record.offset,
                 wc->record.msg_len);
        count_drop(s, &s->st.rx_drop_lane);
        return;
    }
    struct rs_dg_rxq *e = rxq_alloc(s);
    if (!e) {
        count_drop(s, &s->st.rx_drop_queue);
        return;
    }
    e->kind = RS_DG_RXQ_LANE;
    e->rdma = true;
    e->len = plen;
    e->data = hdr + RS_DG_LANE_HDR;
    memcpy(&e->src, &wc->src, sizeof(e->src));
    e->src_len = wc->src.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    e->lane = lane;
    e->lane_pos = pos;
    e->lane_end = pos + ((wc->record.msg_len + RS_DG_LANE_ALIGN - 1) & ~(uint64_t)(RS_DG_LANE_ALIGN - 1));
    e->lane_seq = seq;
    lane->queued++;
    if (e->lane_end > lane->seen_end)
        lane->seen_end = e->lane_end;
    if ((int32_t)(seq + 1 - lane->seen_seq) > 0)
        lane->seen_seq = seq + 1;
    if (plen >= s->opts.zcopy_threshold && lane->peer)
        lane->peer->last_large_ns = rs_dg_now_ns();
    rxq_push(s, e);
}

/* ---- sinks (receiving side) ---- */

static struct rs_dg_regcache *reg_get(struct rs_dgram_sock *s, void *addr, size_t len)
{
    struct rs_dg_regcache **link = &s->regs, *r;
    unsigned n = 0;
    for (r = s->regs; r; r = r->next, n++) {
        if (r->addr == addr && r->len == len) {
            /* A fresh STag per advertisement: a record meant for an older one can never land here. */
            if (rs_rnic_mr_rekey(r->mr) != 0)
                return NULL;
            return r;
        }
    }
    if (n >= 8) {
        /* Keep the cache small: drop the oldest (the list's tail). */
        while ((*link)->next)
            link = &(*link)->next;
        r = *link;
        *link = NULL;
        (void)rs_rnic_dereg_mr(r->mr);
        free(r);
    }
    r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    if (rs_rnic_reg_mr(s->dev->pd, addr, len, RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_WRITE, &r->mr) != 0) {
        free(r);
        return NULL;
    }
    r->addr = addr;
    r->len = len;
    r->next = s->regs;
    s->regs = r;
    return r;
}

void rs_dg_regs_free(struct rs_dgram_sock *s)
{
    while (s->regs) {
        struct rs_dg_regcache *r = s->regs;
        s->regs = r->next;
        (void)rs_rnic_dereg_mr(r->mr);
        free(r);
    }
}

void rs_dgram_mem_unmapped(const void *addr, size_t len)
{
    /* Sink registrations are remotely invalid whenever no recv is waiting in them, and the soft RNIC names
     * memory by virtual address, so a cached entry over unmapped memory is harmless there. A provider that pins
     * pages (verbs) needs the entries dropped: see docs/dgram.md §10 (the socket registry this needs is not
     * built yet). */
    (void)addr;
    (void)len;
}

/* The peer a sink goes to: the connected peer, else the latest sender of large datagrams into a lane. */
static struct rs_dg_peer *sink_peer(struct rs_dgram_sock *s)
{
    if (s->connected && s->conn_peer)
        return s->conn_peer->rx_lane && s->conn_peer->instance ? s->conn_peer : NULL;
    struct rs_dg_peer *best = NULL;
    uint64_t now = rs_dg_now_ns();
    for (struct rs_dg_lane *l = s->lanes; l; l = l->next) {
        struct rs_dg_peer *p = l->peer;
        if (p && p->instance && p->last_large_ns && now - p->last_large_ns < 2000000000ull &&
            (!best || p->last_large_ns > best->last_large_ns))
            best = p;
    }
    return best;
}

static bool sink_advertise(struct rs_dgram_sock *s, void *buf, size_t len)
{
    struct rs_dg_peer *p = sink_peer(s);
    if (!p)
        return false;
    if (len > UINT32_MAX)
        len = UINT32_MAX;
    struct rs_dg_regcache *r = reg_get(s, buf, len);
    if (!r)
        return false;
    s->sink_active = true;
    s->sink_filled = s->sink_spent = false;
    s->sink_reg = r;
    s->sink_rkey = r->mr->rkey;
    s->sink_buf = buf;
    s->sink_len = (uint32_t)len;
    s->sink_id++;
    s->sink_peer = p;
    struct rs_dgw_msg m;
    memset(&m, 0, sizeof(m));
    m.type = RS_DGW_SINK;
    m.u.sink.sink_id = s->sink_id;
    m.u.sink.rkey = s->sink_rkey;
    m.u.sink.to = (uintptr_t)buf;
    m.u.sink.len = (uint32_t)len;
    rs_dg_control_tx(s, p, &m);
    s->st.sinks_advertised++;
    RS_TRACE("dgram: fd %d: sink 0x%x advertised (%zu bytes)", s->fd, s->sink_rkey, len);
    return true;
}

/* Takes the sink back. Afterwards sink_filled says whether a datagram landed in it before that. */
static void sink_revoke(struct rs_dgram_sock *s)
{
    (void)rs_rnic_mr_invalidate(s->sink_reg->mr);
    /* Every record placed under the old STag is on the CQ now: collect a last-moment one. */
    rs_dg_progress(s);
    struct rs_dg_revoked *r = &s->revoked[s->revoked_next++ % RS_DG_REVOKED_KEEP];
    r->rkey = s->sink_rkey;
    r->to = (uintptr_t)s->sink_buf;
    r->len = s->sink_len;
    s->sink_active = false;
    if (!s->sink_filled) {
        s->st.sinks_revoked++;
        s->sink_unused_ns = rs_dg_now_ns();
    }
    RS_TRACE("dgram: fd %d: sink 0x%x revoked (%s)", s->fd, s->sink_rkey, s->sink_filled ? "filled" : "unused");
}

static void sink_record(struct rs_dgram_sock *s, const struct rs_rnic_wc *wc)
{
    if (wc->status == RS_WC_SUCCESS && wc->record.valid_map == 1 && wc->byte_len == wc->record.msg_len &&
        wc->record.offset == 0 && !s->sink_filled) {
        s->sink_filled = true;
        s->sink_got_len = wc->record.msg_len;
        memcpy(&s->sink_src, &wc->src, sizeof(s->sink_src));
        s->sink_src_len = wc->src.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        s->st.sinks_filled++;
        return;
    }
    /* Partial, or a second record over the first: the buffer's bytes are not one whole datagram. */
    if (s->sink_filled)
        s->sink_filled = false;
    s->sink_spent = true;
    count_drop(s, &s->st.rx_drop_partial);
}

/* ---- raw datagrams: plain UDP, control messages, refused Write-Records ---- */

static socklen_t sa_len(const struct sockaddr_storage *ss)
{
    return ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static bool queue_raw(struct rs_dgram_sock *s, struct rs_rnic_raw_dgram *d, bool rdma)
{
    uint32_t charge = d->len + RS_DG_RAW_OVERHEAD;
    /* Like the kernel: an empty queue always takes one datagram, a fuller one only within SO_RCVBUF. */
    if (s->raw_queued && s->raw_queued + charge > (uint64_t)s->rcvbuf) {
        count_drop(s, &s->st.rx_drop_queue);
        free(d);
        return false;
    }
    struct rs_dg_rxq *e = rxq_alloc(s);
    if (!e) {
        count_drop(s, &s->st.rx_drop_queue);
        free(d);
        return false;
    }
    e->kind = RS_DG_RXQ_RAW;
    e->rdma = rdma;
    e->len = d->len;
    e->data = d->data;
    e->src = d->src;
    e->src_len = d->src_len ? d->src_len : sa_len(&d->src);
    e->raw = d;
    e->charge = charge;
    s->raw_queued += charge;
    rxq_push(s, e);
    return true;
}

static bool in_range(uint64_t to, uint32_t len, uint64_t start, uint64_t size)
{
    return to >= start && to - start <= size && len <= size - (to - start);
}

/*
 * A refused Write-Record that targeted one of our sinks: queue its payload like any datagram. It may come from an
 * advertisement revoked long ago (the sender used the latest one it had seen, and the receiver advertises and
 * revokes at the rate of its recv calls), so besides the exact STags of the latest revocations, any STag of a
 * registration we advertise sinks from counts: rnic.h makes only the low 8 bits of an rkey the per-registration
 * key, so the rest names the region whatever key it carried then. The payload passed its CRC and came from a peer;
 * only the target was stale.
 */
static bool salvage(struct rs_dgram_sock *s, struct rs_rnic_raw_dgram *d)
{
    if (d->record.to != d->record.base_to || d->len != d->record.msg_len)
        return false;       /* sinks take single-segment records only */
    bool ours = false;
    for (unsigned i = 0; i < RS_DG_REVOKED_KEEP && !ours; i++) {
        const struct rs_dg_revoked *r = &s->revoked[i];
        ours = r->len && r->rkey == d->record.rkey && in_range(d->record.to, d->len, r->to, r->len);
    }
    for (struct rs_dg_regcache *r = s->regs; r && !ours; r = r->next)
        ours = (r->mr->rkey >> 8) == (d->record.rkey >> 8) && in_range(d->record.to, d->len, (uintptr_t)r->addr, r->len);
    if (!ours)
        return false;
    s->st.sinks_salvaged++;
    queue_raw(s, d, true);
    return true;
}

static void handle_raw(struct rs_dgram_sock *s, struct rs_rnic_raw_dgram *d)
{
    if (d->status != RS_WC_SUCCESS) {
        /* A Write-Record our RNIC refused: a datagram that raced a sink's revocation, or a sender whose idea of
         * our lane is stale (we restarted, or retired the lane). */
        if (salvage(s, d))
            return;
        RS_DEBUG("dgram: fd %d: refused Write-Record (stag 0x%x, %u bytes) dropped: stale sender state", s->fd,
                 d->record.rkey, d->len);
        count_drop(s, &s->st.rx_drop_lane);
        struct rs_dg_peer *p = rs_dg_peer_get(s, (struct sockaddr *)&d->src, d->src_len ? d->src_len
                                                                                         : sa_len(&d->src));
        if (p)
            rs_dg_peer_stale(s, p);
        free(d);
        return;
    }
    struct rs_dgw_msg m;
    if (rs_dgw_has_magic(d->data, d->len) && rs_dgw_decode(d->data, d->len, &m) == 0) {
        rs_dg_control_rx(s, &m, (struct sockaddr *)&d->src, d->src_len ? d->src_len : sa_len(&d->src));
        free(d);
        return;
    }
    if (queue_raw(s, d, false))
        s->st.rx_kernel++;
}

/* Reads the kernel socket ourselves (the QP did not adopt it, or there is no QP): plain UDP and control. */
static bool drain_kernel(struct rs_dgram_sock *s)
{
    bool any = false;
    for (unsigned i = 0; i < KERNEL_BUDGET; i++) {
        /* Leave datagrams in the kernel while our queue is full: its own SO_RCVBUF accounting then applies. */
        if (s->raw_queued && s->raw_queued + RS_DG_RAW_OVERHEAD > (uint64_t)s->rcvbuf)
            break;
        uint8_t probe;
        struct iovec iov = { .iov_base = &probe, .iov_len = 1 };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t n = rs_dg_sys_recvmsg(s->fd, &msg, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
        if (n < 0) {
            if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR)
                break;
            /* A pending ICMP error (connected socket): the application gets it, as from the kernel. */
            s->so_error = (int)n;
            any = true;
            break;
        }
        struct rs_rnic_raw_dgram *d = malloc(sizeof(*d) + (size_t)n + 1);
        if (!d)
            break;
        memset(d, 0, sizeof(*d));
        iov.iov_base = d->data;
        iov.iov_len = (size_t)n;
        msg.msg_name = &d->src;
        msg.msg_namelen = sizeof(d->src);
        ssize_t got = rs_dg_sys_recvmsg(s->fd, &msg, MSG_DONTWAIT);
        if (got < 0) {
            free(d);
            break;
        }
        d->len = (uint32_t)got;
        d->src_len = msg.msg_namelen;
        d->status = RS_WC_SUCCESS;
        handle_raw(s, d);
        any = true;
    }
    return any;
}

/* ---- completions ---- */

static void handle_wc(struct rs_dgram_sock *s, const struct rs_rnic_wc *wc)
{
    switch (wc->opcode) {
    case RS_WC_RECV: {
        if ((wc->wr_id & ~((1ull << 62) - 1)) != RS_DG_WR_SLOT)
            return;
        uint32_t i = (uint32_t)(wc->wr_id & 0xffffffffu);
        s->slots_posted--;
        if (wc->status == RS_WC_WR_FLUSH_ERR)
            return;
        if (wc->status != RS_WC_SUCCESS || wc->byte_len > RS_DG_SLOT_SIZE) {
            count_drop(s, &s->st.rx_drop_partial);
            (void)rs_dg_repost_slot(s, i);
            return;
        }
        struct rs_dg_rxq *e = rxq_alloc(s);
        if (!e) {
            count_drop(s, &s->st.rx_drop_queue);
            (void)rs_dg_repost_slot(s, i);
            return;
        }
        e->kind = RS_DG_RXQ_SLOT;
        e->rdma = true;
        e->len = wc->byte_len;
        e->data = s->slot_mem + (size_t)i * RS_DG_SLOT_SIZE;
        memcpy(&e->src, &wc->src, sizeof(e->src));
        e->src_len = sa_len(&wc->src);
        e->slot = i;
        rxq_push(s, e);
        return;
    }
    case RS_WC_RECV_WRITE_RECORD: {
        if (s->sink_active && wc->record.rkey == s->sink_rkey) {
            sink_record(s, wc);
            return;
        }
        struct rs_dg_lane *lane = lane_of(s, wc->record.rkey);
        if (lane) {
            lane_record(s, lane, wc);
        } else {
            RS_DEBUG("dgram: fd %d: Write-Record into an unknown region (stag 0x%x) dropped", s->fd,
                     wc->record.rkey);
            count_drop(s, &s->st.rx_drop_lane);
        }
        return;
    }
    case RS_WC_RECV_RAW: {
        struct rs_rnic_raw_dgram *d = NULL;
        if (rs_rnic_ud_take_raw(s->qp, &d) == 0)
            handle_raw(s, d);
        return;
    }
    default:
        return;
    }
}

void rs_dg_progress(struct rs_dgram_sock *s)
{
    if (s->closed)
        return;
    uint32_t before = s->rxq_count;
    bool changed = false;
    /* The kernel socket before the CQ: on one host a datagram sent through the kernel is in our socket when
     * sendmsg returns, so one the sender posted over RDMA after it cannot be queued ahead of it (the switch from
     * the kernel to RDMA once a peer is found, or a fallback send). Reading the CQ first did that whenever the
     * RDMA datagram was quick: socat over verbs saw its file's datagrams out of order. */
    bool kernel_first = !s->rdma_ready || !s->adopted;
    if (kernel_first)
        changed |= drain_kernel(s);
    if (s->rdma_ready) {
        rs_dg_cm_events(s);
        changed = rs_dg_tx_reap(s) && s->interest_out;
        rs_dg_rx_poll_cq(s);
    }
    if (!kernel_first && !s->rdma_ready)
        changed |= drain_kernel(s);        /* RDMA just ended: the socket is ours to read again */
    if (changed || s->rxq_count != before)
        rs_dg_changed(s);
}

void rs_dg_rx_poll_cq(struct rs_dgram_sock *s)
{
    if (!s->rdma_ready)
        return;
    struct rs_rnic_wc wc[CQ_BATCH];
    if (s->rcq_hot) {
        rs_rnic_cq_ack_events(s->rcq);
        s->rcq_hot = false;
    }
    for (;;) {
        int n = rs_rnic_poll_cq(s->rcq, CQ_BATCH, wc);
        if (n < 0) {
            /* The CQ overflowed (never on an adopting QP, rnic.h): the QP is in ERROR, RDMA is over. */
            RS_WARN("dgram: fd %d: receive CQ failed (%d); the socket continues on the kernel", s->fd, n);
            s->rdma_ready = false;
            s->rdma_err = n;
            break;
        }
        if (n > 0 && s->rcq_armed) {
            /* The armed notification fired (or will, at the end of the RNIC's callback): drain it now and arm
             * again below. */
            rs_rnic_cq_ack_events(s->rcq);
            s->rcq_armed = false;
        }
        for (int i = 0; i < n; i++)
            handle_wc(s, &wc[i]);
        if (n == CQ_BATCH)
            continue;
        if (s->rcq_armed)
            break;
        /* Arm, then look once more: a completion that came in between would not write the fd. */
        (void)rs_rnic_cq_arm(s->rcq, false);
        s->rcq_armed = true;
    }
}

void rs_dg_progress_woken(struct rs_dgram_sock *s)
{
    s->rcq_hot = true;
    rs_dg_progress(s);
}

/* ---- delivering ---- */

static void release(struct rs_dgram_sock *s, struct rs_dg_rxq *e)
{
    switch (e->kind) {
    case RS_DG_RXQ_SLOT:
        if (s->rdma_ready && rs_dg_repost_slot(s, e->slot) != 0)
            RS_DEBUG("dgram: fd %d: a receive could not be posted again", s->fd);
        break;
    case RS_DG_RXQ_LANE: {
        struct rs_dg_lane *lane = e->lane;
        lane->queued--;
        lane->released_since++;
        if (lane->retired) {
            if (lane->queued == 0)
                lane_free(s, lane);
        } else {
            lane_report(s, lane);
        }
        break;
    }
    case RS_DG_RXQ_RAW:
        s->raw_queued -= e->charge;
        free(e->raw);
        break;
    }
    e->next = s->rxq_free;
    s->rxq_free = e;
}

static size_t iov_total(const struct msghdr *msg)
{
    size_t t = 0;
    for (size_t i = 0; i < msg->msg_iovlen; i++)
        t += msg->msg_iov[i].iov_len;
    return t;
}

static void set_name(struct msghdr *msg, const struct sockaddr_storage *src, socklen_t src_len)
{
    if (msg->msg_name) {
        socklen_t n = msg->msg_namelen < src_len ? msg->msg_namelen : src_len;
        memcpy(msg->msg_name, src, n);
    }
    msg->msg_namelen = src_len;
}

static ssize_t deliver(struct rs_dgram_sock *s, struct msghdr *msg, int flags)
{
    struct rs_dg_rxq *e = s->rxq_head;
    size_t cap = iov_total(msg);
    size_t n = e->len < cap ? e->len : cap;
    size_t off = 0;
    for (size_t i = 0; i < msg->msg_iovlen && off < n; i++) {
        size_t k = msg->msg_iov[i].iov_len < n - off ? msg->msg_iov[i].iov_len : n - off;
        memcpy(msg->msg_iov[i].iov_base, e->data + off, k);
        off += k;
    }
    set_name(msg, &e->src, e->src_len);
    msg->msg_controllen = 0;
    msg->msg_flags = e->len > cap ? MSG_TRUNC : 0;
    uint32_t len = e->len;
    if (!(flags & MSG_PEEK)) {
        if (e->rdma) {
            s->st.rx_rdma++;
            s->st.rx_bytes_rdma += len;
            rs_dg_stats_rdma_rx(s, len);
        }
        s->st.rx_copied++;
        s->rxq_head = e->next;
        if (!s->rxq_head)
            s->rxq_tail = NULL;
        s->rxq_count--;
        release(s, e);
        rs_dg_changed(s);
    }
    return (flags & MSG_TRUNC) ? (ssize_t)len : (ssize_t)n;
}

/* The datagram a sink received is already in the application's buffer. */
static ssize_t deliver_sink(struct rs_dgram_sock *s, struct msghdr *msg)
{
    set_name(msg, &s->sink_src, s->sink_src_len);
    msg->msg_controllen = 0;
    msg->msg_flags = 0;
    s->sink_filled = false;
    s->st.rx_zcopy++;
    s->st.rx_rdma++;
    s->st.rx_bytes_rdma += s->sink_got_len;
    rs_dg_stats_rdma_rx(s, s->sink_got_len);
    return (ssize_t)s->sink_got_len;
}

ssize_t rs_dg_recvmsg(struct rs_dgram_sock *s, struct msghdr *msg, int flags)
{
    if (flags & MSG_OOB)
        return -EOPNOTSUPP;
    if (flags & MSG_ERRQUEUE)
        return rs_dg_sys_recvmsg(s->fd, msg, flags);
    bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
    uint64_t deadline = s->rcvtimeo_ns ? rs_dg_now_ns() + s->rcvtimeo_ns : 0;
    bool mine = false;      /* this call advertised the socket's sink */
    for (;;) {
        rs_dg_progress(s);
        if (mine && (s->sink_filled || s->sink_spent || s->rxq_head || s->so_error || !s->sink_active)) {
            if (s->sink_active)
                sink_revoke(s);
            mine = false;
            if (s->sink_filled)
                return deliver_sink(s, msg);
        }
        if (s->rxq_head)
            return deliver(s, msg, flags);
        if (s->so_error) {
            int e = s->so_error;
            s->so_error = 0;
            rs_dg_changed(s);
            return e;
        }
        if (nonblock) {
            /* About to say "nothing": drain a notification that may be pending, so a poller that woke for it
             * does not wake again for nothing. */
            rs_dg_progress_woken(s);
            if (s->rxq_head)
                continue;
            return -EAGAIN;
        }
        /* A sink pays off when the next datagram is still to be sent (request/response, a paced stream); right
         * after one went unused, datagrams are already in flight behind it: skip advertising for a moment. */
        if (!mine && !s->sink_active && s->rdma_ready && !(flags & MSG_PEEK) && msg->msg_iovlen == 1 &&
            msg->msg_iov[0].iov_len >= s->opts.zcopy_threshold &&
            rs_dg_now_ns() - s->sink_unused_ns >= RS_DG_SINK_BACKOFF_NS)
            mine = sink_advertise(s, msg->msg_iov[0].iov_base, msg->msg_iov[0].iov_len);
        int rc = rs_dg_wait(s, deadline, false, mine);
        if (rc) {
            if (mine && rc != -EBADF) {
                sink_revoke(s);
                if (s->sink_filled)
                    return deliver_sink(s, msg);
                rs_dg_progress(s);
                if (s->rxq_head)
                    return deliver(s, msg, flags);
            }
            return rc;
        }
    }
}

void rs_dg_sink_revoke(struct rs_dgram_sock *s)
{
    sink_revoke(s);
}

int rs_dgram_test_inject(struct rs_dgram_sock *s, const struct rs_rnic_raw_dgram *tmpl, const void *data, size_t len)
{
    if (len > RS_DG_MAX_V6)
        return -EMSGSIZE;
    struct rs_rnic_raw_dgram *d = malloc(sizeof(*d) + len + 1);
    if (!d)
        return -ENOMEM;
    *d = *tmpl;
    d->next = NULL;
    d->len = (uint32_t)len;
    if (len)
        memcpy(d->data, data, len);
    pthread_mutex_lock(&s->lock);
    int rc = s->closed ? -EBADF : 0;
    if (rc == 0)
        handle_raw(s, d);
    else
        free(d);
    pthread_mutex_unlock(&s->lock);
    return rc;
}
