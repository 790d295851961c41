/*
 * sdp_conn.c: socket life cycle on the RNIC: rings and queue pair, Hello/HelloAck, connect, listen and accept, the
 * CM events, the progress step every caller runs, shutdown and close (graceful, lingering, abortive, orphaned),
 * timers and keepalive.
 *
 * Close handshake: DisConn is SDP's FIN. It follows the last byte of data (and needs a credit like data does);
 * once a side has both sent and received DisConn and its own sends completed, it asks the RNIC for an orderly
 * disconnect and the QPs are torn down. A connection that ends in any other way (CM DISCONNECTED without DisConn,
 * CM ERROR, AbortConn, a failed completion) is a reset: ECONNRESET for the application.
 */
#include <errno.h>
#include <limits.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

static socklen_t addr_len(const struct sockaddr_storage *ss)
{
    return ss->ss_family == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6) : (socklen_t)sizeof(struct sockaddr_in);
}

static uint16_t addr_port(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return 0;
}

static void set_port(struct sockaddr_storage *ss, uint16_t port)
{
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons(port);
    else if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
}

static uint32_t clamp_u32(uint64_t v, uint32_t lo, uint32_t hi)
{
    return v < lo ? lo : v > hi ? hi : (uint32_t)v;
}

/* ---- rings and RNIC objects ---- */

/* RDMASOCK_SDP_COMPACT=on|off (default on): announce compact Data where the RNIC has SEND_WITH_IMM (docs/sdp.md
 * "Compact Data"). Off, every message carries its 16-byte BSDH in the payload, as the SDP specification lays out. */
static bool compact_wanted(void)
{
    static int cached = -2;
    return rs_sdp_env_choice("RDMASOCK_SDP_COMPACT", &cached) != 0;
}

/* A fresh QP on the socket's CQ with every receive buffer posted. */
static int create_qp_posted(struct rs_sdp_sock *s)
{
    /* Small messages inline: the RNIC takes the bytes with the work request instead of reading them from the
     * registered rings (on rxe, a memory region lookup and copy less per message, as rsockets does). */
    uint32_t cap = s->dev->caps->max_inline;
    s->inline_max = cap < SDP_INLINE_MAX ? cap : SDP_INLINE_MAX;
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = s->cq, .recv_cq = s->cq, .max_send_wr = s->sq_depth, .max_recv_wr = s->nbufs,
        .max_send_sge = 3, .max_recv_sge = 1, .max_inline = s->inline_max, .sq_sig_all = false, .context = s,
        .imm_data = s->dev->caps->has_send_with_imm && compact_wanted(),
    };
    s->imm_rx = attr.imm_data;
    int r = rs_rnic_create_qp(s->dev->pd, &attr, &s->qp);
    if (r != 0)
        return r;
    s->rx_posted = 0;
    for (uint32_t i = 0; i < s->nbufs; i++)
        rs_sdp_post_recv_buf(s, i);
    return s->rx_posted == s->nbufs ? 0 : -ENOMEM;
}

int rs_sdp_setup_rings(struct rs_sdp_sock *s)
{
    const struct rs_rnic_caps *caps = s->dev->caps;
    uint32_t space = clamp_u32(s->rcvbuf, SDP_MIN_BUFSPACE, SDP_MAX_BUFSPACE);
    /* Each buffer holds a page-multiple payload plus the BSDH, so an application writing 64 KiB at a time
     * fills exactly one message instead of one full and one 16-byte message. */
    uint32_t payload = space / SDP_RING_TARGET_BUFS;
    payload &= ~4095u;
    payload = clamp_u32(payload, SDP_MIN_RBUF, SDP_MAX_RBUF);
    if (caps->max_rc_msg && payload + RS_SDP_BSDH_LEN > caps->max_rc_msg)
        payload = (caps->max_rc_msg - RS_SDP_BSDH_LEN) & ~63u;
    uint32_t rbuf = payload + RS_SDP_BSDH_LEN;
    uint32_t nbufs = clamp_u32(space / payload, SDP_MIN_RX_BUFS, SDP_MAX_RX_BUFS);
    if (nbufs > caps->max_qp_wr)
        nbufs = caps->max_qp_wr;
    uint32_t sq = 2 * nbufs + 64;
    if (sq > caps->max_qp_wr)
        sq = caps->max_qp_wr;
    s->rbuf_size = rbuf;
    s->nbufs = nbufs;
    s->sq_depth = sq;
    s->sbuf_size = clamp_u32(s->sndbuf, SDP_MIN_BUFSPACE, SDP_MAX_BUFSPACE);
    s->cq_depth = sq + nbufs + 16;
    if (caps->max_cqe && s->cq_depth > caps->max_cqe)
        return -ENOMEM;

    s->rbuf_mem = aligned_alloc(4096, ((size_t)nbufs * rbuf + 4095) & ~(size_t)4095);
    s->sbuf_mem = aligned_alloc(4096, ((size_t)s->sbuf_size + 4095) & ~(size_t)4095);
    s->hdr_mem = aligned_alloc(64, (size_t)sq * SDP_HDR_SLOT);
    s->slots = calloc(sq, sizeof(*s->slots));
    s->rxq_cap = nbufs + 4;
    s->rxq = calloc(s->rxq_cap, sizeof(*s->rxq));
    s->rx_repost = calloc(nbufs, sizeof(*s->rx_repost));
    s->rx_repost_n = 0;
    /* A quarter of the ring at a time: one post instead of four, and the credits the peer sees never drop below
     * three quarters of the ring for it (a peer that runs lower gets them at once: rs_sdp_credit_update_check). */
    s->rx_repost_batch = clamp_u32(nbufs / 4, 1, SDP_REPOST_MAX);
    if (!s->rbuf_mem || !s->sbuf_mem || !s->hdr_mem || !s->slots || !s->rxq || !s->rx_repost)
        return -ENOMEM;
    memset(s->hdr_mem, 0, (size_t)sq * SDP_HDR_SLOT);
    /* The peer can read the whole ring (its MR allows remote reads): nothing of the heap's past may be in it. */
    memset(s->sbuf_mem, 0, s->sbuf_size);
    struct rs_rnic_pd *pd = s->dev->pd;
    int r = rs_rnic_reg_mr(pd, s->rbuf_mem, (size_t)nbufs * rbuf, RS_ACCESS_LOCAL_WRITE, &s->rbuf_mr);
    if (r == 0)
        /* Remote read: the peer may RDMA-read the bytes we lend it from the ring (docs/sdp.md "Lending the send
         * ring"); it only ever sees this connection's own stream. */
        r = rs_rnic_reg_mr(pd, s->sbuf_mem, s->sbuf_size, RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_READ,
                           &s->sbuf_mr);
    if (r == 0)
        r = rs_rnic_reg_mr(pd, s->hdr_mem, (size_t)sq * SDP_HDR_SLOT, RS_ACCESS_LOCAL_WRITE, &s->hdr_mr);
    if (r == 0)
        r = rs_rnic_create_cq(s->dev->rnic, s->cq_depth, &s->cq);
    if (r == 0 && !s->cm)
        r = rs_rnic_cm_create(s->dev->rnic, &s->cm);
    if (r == 0)
        r = create_qp_posted(s);
    if (r != 0)
        return r;
    rs_rnic_cq_arm(s->cq, false);
    s->stats.rx_bufs = nbufs;
    s->stats.rx_buf_size = rbuf;
    return 0;
}

void rs_sdp_free_rnic(struct rs_sdp_sock *s)
{
    if (s->listener) {
        rs_rnic_listener_close(s->listener);
        s->listener = NULL;
    }
    if (s->qp) {
        rs_rnic_destroy_qp(s->qp);
        s->qp = NULL;
    }
    if (s->cq) {
        rs_rnic_destroy_cq(s->cq);
        s->cq = NULL;
    }
    if (s->cm) {
        rs_rnic_cm_destroy(s->cm);
        s->cm = NULL;
    }
    if (s->rbuf_mr)
        rs_rnic_dereg_mr(s->rbuf_mr);
    if (s->sbuf_mr)
        rs_rnic_dereg_mr(s->sbuf_mr);
    if (s->hdr_mr)
        rs_rnic_dereg_mr(s->hdr_mr);
    s->rbuf_mr = s->sbuf_mr = s->hdr_mr = NULL;
    if (s->sink.reg && s->dev)
        rs_sdp_reg_put(s->dev->cache, s->sink.reg);
    if (s->zsrc.reg && s->dev)
        rs_sdp_reg_put(s->dev->cache, s->zsrc.reg);
    s->sink.reg = s->zsrc.reg = NULL;
    free(s->rbuf_mem);
    free(s->sbuf_mem);
    free(s->hdr_mem);
    free(s->slots);
    free(s->rxq);
    free(s->rx_repost);
    s->rbuf_mem = s->sbuf_mem = s->hdr_mem = NULL;
    s->slots = NULL;
    s->rxq = NULL;
    s->rx_repost = NULL;
    s->rx_repost_n = 0;
}

/* ---- Hello ---- */

static void hello_fill(struct rs_sdp_sock *s, struct rs_sdp_hello *h)
{
    memset(h, 0, sizeof(*h));
    h->bsdh.bufs = (uint16_t)(s->rx_posted > 0 ? s->rx_posted - 1 : 0);
    h->version = RS_SDP_VERSION;
    h->ip_version = s->family == AF_INET6 ? 6 : 4;
    h->caps = RS_SDP_CAP_INVALIDATE;
    h->max_adverts = 1;
    h->desired_remote_rcv_size = s->rbuf_size;
    h->rcv_size = s->rbuf_size;
    h->port = addr_port(&s->local);
    h->has_ext = true;
    h->ext_flags = RS_SDP_EXT_ZCOPY | RS_SDP_EXT_HANDBACK | RS_SDP_EXT_SOLICITED;
    if (s->imm_rx)
        h->ext_flags |= RS_SDP_EXT_IMM_DATA;
    h->ka_rkey = s->dev->ka_mr->rkey;
    h->ka_addr = (uint64_t)(uintptr_t)s->dev->ka_target;
    s->adv_bufs = h->bsdh.bufs;
    s->adv_ack = 0;
}

/* Takes what the peer's Hello or HelloAck says about itself. */
static int hello_apply(struct rs_sdp_sock *s, const struct rs_sdp_hello *h)
{
    if (h->rcv_size < RS_SDP_BSDH_LEN + 64)
        return -EPROTO;
    uint32_t max = s->dev->caps->max_rc_msg ? s->dev->caps->max_rc_msg : UINT32_MAX;
    s->peer_rbuf_size = h->rcv_size < max ? h->rcv_size : max;
    if (s->rx_mseq_last == 0) {
        /* A message from the peer may already have been processed (completions can overtake the CM event):
         * its credits are newer than the Hello's. */
        s->peer_bufs = h->bsdh.bufs;
        s->peer_ack = 0;
    }
    s->peer_zcopy = h->has_ext && (h->ext_flags & RS_SDP_EXT_ZCOPY) && h->max_adverts > 0;
    s->peer_handback = h->has_ext && (h->ext_flags & RS_SDP_EXT_HANDBACK);
    s->peer_solicits = h->has_ext && (h->ext_flags & RS_SDP_EXT_SOLICITED);
    /* Both ends' QPs must take the immediate as data: ours does when we announced it (imm_rx), the peer's when it
     * did. We send compact when both hold (only such a QP posts SEND_WITH_IMM); we take it whenever we announced. */
    s->peer_imm = s->imm_rx && h->has_ext && (h->ext_flags & RS_SDP_EXT_IMM_DATA);
    s->peer_ka_rkey = h->has_ext ? h->ka_rkey : 0;
    s->peer_ka_addr = h->ka_addr;
    s->stats.peer_buf_size = s->peer_rbuf_size;
    s->zthresh = rs_sdp_zthresh(s);
    return 0;
}

/* ---- creation, bind, listen ---- */

int rs_sdp_socket(int family, int rnic_kind, unsigned flags, struct rs_sdp_sock **out)
{
    *out = NULL;
    if (family != AF_INET && family != AF_INET6)
        return -EAFNOSUPPORT;
    rs_sdp_global_init();
    struct rs_sdp_sock *s = rs_sdp_sock_alloc(family, rnic_kind);
    if (!s)
        return -ENOMEM;
    s->nonblock = (flags & RS_SDP_NONBLOCK) != 0;
    *out = s;
    return 0;
}

int rs_sdp_bind(struct rs_sdp_sock *s, const struct sockaddr *addr, socklen_t len)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    if (!addr || len < (socklen_t)sizeof(struct sockaddr_in) || len > (socklen_t)sizeof(struct sockaddr_storage))
        return -EINVAL;
    if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)
        return -EAFNOSUPPORT;
    if (addr->sa_family == AF_INET6 && len < (socklen_t)sizeof(struct sockaddr_in6))
        return -EINVAL;
    rs_lock(&s->lock);
    if (s->state != SDP_ST_IDLE || s->bound) {
        rs_unlock(&s->lock);
        return -EINVAL;
    }
    memset(&s->local, 0, sizeof(s->local));
    memcpy(&s->local, addr, len);
    s->bound = true;
    rs_unlock(&s->lock);
    return 0;
}

int rs_sdp_listen(struct rs_sdp_sock *s, int backlog)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    if (s->state == SDP_ST_LISTEN) {
        s->backlog = backlog > 0 ? backlog : 1;     /* a second listen() only changes the backlog */
        rs_unlock(&s->lock);
        return 0;
    }
    if (s->state != SDP_ST_IDLE) {
        rs_unlock(&s->lock);
        return -EINVAL;
    }
    if (!s->bound) {
        memset(&s->local, 0, sizeof(s->local));
        s->local.ss_family = (sa_family_t)s->family;
    }
    r = rs_sdp_dev_get(s->kind_wanted, (const struct sockaddr *)&s->local, &s->dev);
    if (r == 0)
        r = rs_rnic_cm_create(s->dev->rnic, &s->cm);
    /* A descendant of a family's holder listens on a port of its own and tells the holder (sdp_family.c). */
    struct sdp_family *fam = r == 0 && addr_port(&s->local) ? rs_sdp_family_find(&s->local) : NULL;
    if (fam) {
        struct sockaddr_storage own = s->local, got;
        set_port(&own, 0);
        r = rs_rnic_listen(s->cm, (const struct sockaddr *)&own, addr_len(&own), backlog > 0 ? backlog : 1,
                           &s->listener);
        if (r == 0)
            r = rs_rnic_listener_addr(s->listener, &got);
        int slot = r == 0 ? rs_sdp_family_join(fam, addr_port(&got)) : -1;
        if (r == 0 && slot < 0)
            r = slot;
        if (r == 0) {
            s->fam = fam;
            s->fam_slot = slot;
            s->public_port = addr_port(&s->local);
            RS_DEBUG("sdp: listener on port %u joins its family as member %d on port %u", s->public_port, slot,
                     addr_port(&got));
        }
    } else if (r == 0) {
        r = rs_rnic_listen(s->cm, (const struct sockaddr *)&s->local, addr_len(&s->local),
                           backlog > 0 ? backlog : 1, &s->listener);
        if (r == 0)
            r = rs_rnic_listener_addr(s->listener, &s->local);
    }
    if (r != 0) {
        if (s->listener) {
            rs_rnic_listener_close(s->listener);
            s->listener = NULL;
        }
        if (s->cm) {
            rs_rnic_cm_destroy(s->cm);
            s->cm = NULL;
        }
        rs_unlock(&s->lock);
        return r;
    }
    rs_sdp_intake_start(s);
    s->bound = true;
    s->backlog = backlog > 0 ? backlog : 1;
    s->state = SDP_ST_LISTEN;
    r = rs_sdp_progress_attach(s);
    rs_unlock(&s->lock);
    return r;
}

/* ---- the passive side ---- */

static void child_inherit(struct rs_sdp_sock *c, const struct rs_sdp_sock *l)
{
    c->rcvbuf = l->rcvbuf;
    c->sndbuf = l->sndbuf;
    c->rcvlowat = l->rcvlowat;
    c->rcvtimeo_ms = l->rcvtimeo_ms;
    c->sndtimeo_ms = l->sndtimeo_ms;
    c->linger_on = l->linger_on;
    c->linger_s = l->linger_s;
    c->keepalive = l->keepalive;
    c->ka_idle = l->ka_idle;
    c->ka_intvl = l->ka_intvl;
    c->ka_cnt = l->ka_cnt;
    c->nodelay = l->nodelay;
    c->cork = l->cork;
    c->zerocopy_opt = l->zerocopy_opt;
    c->zcopy_opt = l->zcopy_opt;
    c->zcopy_adaptive = l->zcopy_adaptive;
    c->lend_ring_opt = l->lend_ring_opt;
    c->local = l->local;
    c->public_port = l->public_port;
    c->bound = true;
    c->passive = true;
}

/* Listener lock held. Consumes the request (accepted or rejected); its Hello was checked. */
static void accept_request(struct rs_sdp_sock *l, struct rs_rnic_cm_event *ev)
{
    struct rs_sdp_hello hello;
    int r = rs_sdp_hello_decode(ev->private_data, ev->private_data_len, &hello);
    if (r != 0) {
        rs_rnic_reject(ev->request, NULL, 0);
        return;
    }
    if (l->app_closed || l->state != SDP_ST_LISTEN || l->children >= l->backlog) {
        rs_rnic_reject(ev->request, NULL, 0);
        return;
    }
    struct rs_sdp_sock *c = rs_sdp_sock_alloc(l->family, l->kind_wanted);
    if (!c) {
        rs_rnic_reject(ev->request, NULL, 0);
        return;
    }
    child_inherit(c, l);
    c->dev = l->dev;
    c->peer = ev->peer;
    c->peer_valid = true;
    r = rs_sdp_setup_rings(c);
    if (r == 0)
        r = hello_apply(c, &hello);
    if (r != 0) {
        RS_WARN("sdp: cannot set up an accepted connection: %d", r);
        rs_rnic_reject(ev->request, NULL, 0);
        rs_sdp_put(c);
        return;
    }
    struct rs_sdp_hello ack;
    hello_fill(c, &ack);
    uint8_t pd[RS_SDP_HELLO_ACK_LEN];
    size_t n = rs_sdp_hello_ack_encode(&ack, pd, sizeof(pd));
    c->state = SDP_ST_ACCEPTING;
    c->parent = l;
    rs_sdp_get(l);
    l->children++;
    c->last_rx_ms = rs_sdp_now_ms();
    /* Watch the child before accepting, so its ESTABLISHED event and first data are seen. */
    r = rs_sdp_progress_attach(c);
    if (r == 0)
        r = rs_rnic_accept(ev->request, c->qp, c->cm, pd, (uint32_t)n);
    else
        rs_rnic_reject(ev->request, NULL, 0);
    if (r != 0) {
        RS_DEBUG("sdp: accept failed: %d", r);
        l->children--;
        rs_lock(&c->lock);
        c->app_closed = true;
        rs_sdp_fail(c, ECONNABORTED, false);
        rs_unlock(&c->lock);
        rs_sdp_put(c);      /* the listener's ownership; the watchers' reference frees it */
    }
}

/* ---- pacing a shared listener (rs_rnic_listener_intake) ---- */

/* Listener lock held, right after its RNIC listener was made. */
void rs_sdp_intake_start(struct rs_sdp_sock *l)
{
    l->requests_seen = 0;
    l->intake_set = 0;
    l->intake_set_seen = 0;
    l->intake_paced = l->listener && rs_rnic_listener_intake(l->listener, 0, 0) == 0;
    rs_sdp_intake_update(l);
}

/* Listener lock held. One connection may come this way while the application asks for one (accept found the
 * queue empty and has not taken a connection since, or a thread waits on the listener in poll, select or
 * epoll_wait: POLLIN interest) and none is already on its way or queued: what the kernel's shared backlog would
 * give a process that accepts, and nothing a busy or exiting process would hold. */
void rs_sdp_intake_update(struct rs_sdp_sock *l)
{
    if (!l->intake_paced || !l->listener)
        return;
    bool want = l->state == SDP_ST_LISTEN && !l->app_closed && l->children == 0 &&
                (l->intake_want || l->interest_count[0] > 0);
    unsigned n = want ? 1u : 0u;
    if (n == l->intake_set && (n == 0 || l->requests_seen == l->intake_set_seen))
        return;
    if (rs_rnic_listener_intake(l->listener, n, l->requests_seen) == 0) {
        l->intake_set = n;
        l->intake_set_seen = l->requests_seen;
    }
}

/* ---- the family's dispatcher (sdp_family.c) ---- */

/* Listener lock held. A member whose application waits for a connection in poll, select or epoll_wait (an event
 * loop: Apache's event MPM, nginx) rather than in accept is waiting too: the dispatcher may send it the next
 * connection. When the wait ends it counts as busy until accept finds the queue empty again (or the next wait):
 * a process that stops polling its listener (all its workers busy) gets nothing. */
static void family_follow_polling(struct rs_sdp_sock *l)
{
    if (!l->fam || l->fam_holder)
        return;
    bool polling = l->state == SDP_ST_LISTEN && !l->app_closed && l->interest_count[0] > 0 && l->children == 0 &&
                   !l->acceptq_head;
    if (polling == l->fam_polling)
        return;
    l->fam_polling = polling;
    if (polling)
        rs_sdp_family_set_state(l->fam, l->fam_slot, RS_SDP_MEMBER_WAITING, rs_sdp_now_ms());
    else if (!l->intake_want)       /* (an accept that found nothing still waits, or loops back soon) */
        rs_sdp_family_set_state(l->fam, l->fam_slot, RS_SDP_MEMBER_BUSY, rs_sdp_now_ms());
}

/* Does the holder's own application wait for a connection? It does while a thread is in accept, or while it has
 * the listener in a poll set (an event loop that accepts when told). */
static bool holder_waits(struct rs_sdp_sock *l)
{
    return l->interest_count[0] > 0 || rs_sdp_family_state(l->fam, l->fam_slot) == RS_SDP_MEMBER_WAITING;
}

static void redirect_request(struct rs_sdp_sock *l, struct rs_rnic_cm_event *ev, uint16_t port)
{
    uint8_t pd[RS_SDP_REDIRECT_LEN];
    size_t n = rs_sdp_redirect_encode(port, pd, sizeof(pd));
    RS_DEBUG("sdp: port %u: connection redirected to the family member on port %u", addr_port(&l->local), port);
    rs_rnic_reject(ev->request, pd, (uint32_t)n);
}

/* Decides where a request that arrived at `since` goes now. True when it was consumed (redirected); false: the
 * holder's application waits (accept it here), or nobody takes it yet (hold it). */
static bool dispatch_now(struct rs_sdp_sock *l, struct rs_rnic_cm_event *ev, uint64_t now, uint64_t since)
{
    if (holder_waits(l))
        return false;
    uint16_t port;
    /* Only a member that waits in accept gets one: a connection queued to a busy member waits behind whatever
     * keeps it busy (a client that never writes), and is reset if the member exits without coming back to accept
     * (Apache retires idle children so: the one that accepts the parent's wake-up connection exits after it). */
    if (rs_sdp_family_pick(l->fam, RS_SDP_PICK_WAITING, now, &port) >= 0) {
        redirect_request(l, ev, port);
        return true;
    }
    if (now >= since + SDP_DISPATCH_HOLD_MS && rs_sdp_family_pick(l->fam, RS_SDP_PICK_ANY, now, &port) >= 0) {
        redirect_request(l, ev, port);
        return true;
    }
    return false;
}

/* Listener lock held, progress thread: what becomes of the held requests now. */
static void dispatch_held(struct rs_sdp_sock *l, uint64_t now)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < l->n_held; i++) {
        struct sdp_held *h = &l->held[i];
        if (l->app_closed || l->state != SDP_ST_LISTEN) {
            rs_rnic_reject(h->ev.request, NULL, 0);
            continue;
        }
        if (dispatch_now(l, &h->ev, now, h->since_ms))
            continue;
        /* The holder's application waits, or nobody else is there to take it (a member would have had it by
         * now: round-robin after SDP_DISPATCH_HOLD_MS). */
        if (holder_waits(l) || now >= h->since_ms + SDP_DISPATCH_HOLD_EMPTY_MS) {
            accept_request(l, &h->ev);
            continue;
        }
        if (kept != i)
            l->held[kept] = *h;
        kept++;
    }
    l->n_held = kept;
}

/* Listener lock held. Consumes the request (accepted, redirected, held or rejected). */
static void on_connect_request(struct rs_sdp_sock *l, struct rs_rnic_cm_event *ev)
{
    struct rs_sdp_hello hello;
    int r = rs_sdp_hello_decode(ev->private_data, ev->private_data_len, &hello);
    if (r != 0) {
        RS_DEBUG("sdp: refusing a connection whose Hello is unusable (%d)", r);
        rs_rnic_reject(ev->request, NULL, 0);
        return;
    }
    if (l->fam && l->fam_holder && !l->app_closed && l->state == SDP_ST_LISTEN) {
        uint64_t now = rs_sdp_now_ms();
        /* Older requests go first. */
        if (l->n_held > 0)
            dispatch_held(l, now);
        if (l->n_held == 0 && dispatch_now(l, ev, now, now))
            return;
        if (!holder_waits(l)) {
            if (!l->held)
                l->held = calloc(SDP_DISPATCH_MAX_HELD, sizeof(*l->held));
            if (l->held && l->n_held < SDP_DISPATCH_MAX_HELD) {
                l->held[l->n_held].ev = *ev;
                l->held[l->n_held].since_ms = now;
                l->n_held++;
                return;
            }
            uint16_t port;
            if (rs_sdp_family_pick(l->fam, RS_SDP_PICK_ANY, now, &port) >= 0) {
                redirect_request(l, ev, port);
                return;
            }
        }
    }
    accept_request(l, ev);
}

/* Listener lock held: the family is left (member) or ended (holder); held requests are refused. */
static void family_leave(struct rs_sdp_sock *s)
{
    for (uint32_t i = 0; i < s->n_held; i++)
        rs_rnic_reject(s->held[i].ev.request, NULL, 0);
    s->n_held = 0;
    free(s->held);
    s->held = NULL;
    if (s->fam) {
        rs_sdp_family_leave(s->fam, s->fam_slot, s->fam_holder);
        s->fam = NULL;
        s->fam_holder = false;
    }
}

/* Listener lock held, a member whose holder is gone (a daemon that forked after listen and let its parent exit):
 * nobody listens on the public port any more, so this process takes it, as it would have without the family. */
static void member_promote(struct rs_sdp_sock *s)
{
    struct rs_rnic_listener *nl = NULL;
    int r = rs_rnic_listen(s->cm, (const struct sockaddr *)&s->local, addr_len(&s->local),
                           s->backlog > 0 ? s->backlog : 1, &nl);
    if (r != 0) {
        RS_DEBUG("sdp: port %u: holder gone, port not taken over yet (%d)", s->public_port, r);
        return;     /* its rdma_cm listener may not be released yet: the next check tries again */
    }
    RS_INFO("sdp: port %u: the process that dispatched it is gone; this one listens on it now", s->public_port);
    if (s->listener)
        rs_rnic_listener_close(s->listener);
    s->listener = nl;
    rs_sdp_intake_start(s);
    rs_sdp_family_leave(s->fam, s->fam_slot, false);
    s->fam = NULL;
    s->public_port = 0;
}

int rs_sdp_dispatch_enable(struct rs_sdp_sock *s, bool force)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    if (s->state != SDP_ST_LISTEN || s->app_closed || !s->dev)
        r = -EINVAL;
    else if (s->fam)
        r = s->fam_holder ? 0 : -EOPNOTSUPP;    /* a member's own children join the same family */
    else if (!force && s->dev->caps->kind != RS_RNIC_KIND_VERBS)
        r = -EOPNOTSUPP;    /* the soft RNIC shares its listening TCP socket: parking serves the family */
    else {
        int slot = 0;
        s->fam = rs_sdp_family_create(&s->local, &slot);
        if (!s->fam) {
            r = -ENOMEM;
        } else {
            s->fam_slot = slot;
            s->fam_holder = true;
            RS_DEBUG("sdp: listener on port %u dispatches for its family", addr_port(&s->local));
        }
    }
    rs_unlock(&s->lock);
    return r;
}

bool rs_sdp_dispatching(struct rs_sdp_sock *s)
{
    if (rs_sdp_check_epoch(s) != 0)
        return false;
    rs_lock(&s->lock);
    bool on = s->fam && s->fam_holder && s->state == SDP_ST_LISTEN && !s->app_closed;
    rs_unlock(&s->lock);
    return on;
}

void rs_sdp_note_busy(struct rs_sdp_sock *s)
{
    if (rs_sdp_check_epoch(s) != 0)
        return;
    rs_lock(&s->lock);
    if (s->fam)
        rs_sdp_family_set_state(s->fam, s->fam_slot, RS_SDP_MEMBER_BUSY, rs_sdp_now_ms());
    s->intake_want = false;     /* it took a kernel client: no RDMA one until it asks again */
    rs_sdp_intake_update(s);
    rs_unlock(&s->lock);
}

/* Child lock held: the connection is established, hand it to the listener's accept queue. Lock order child →
 * listener. */
static void child_established(struct rs_sdp_sock *c)
{
    struct rs_sdp_sock *l = c->parent;
    rs_lock(&l->lock);
    if (l->state == SDP_ST_LISTEN && !l->app_closed) {
        c->q_next = NULL;
        if (l->acceptq_tail)
            l->acceptq_tail->q_next = c;
        else
            l->acceptq_head = c;
        l->acceptq_tail = c;
        l->dirty = true;
        rs_sdp_signal(l);
        rs_unlock(&l->lock);
        return;
    }
    if (l->children > 0)
        l->children--;
    rs_sdp_intake_update(l);
    rs_unlock(&l->lock);
    /* The listener went away while this connection was being set up: nobody will accept it. */
    c->app_closed = true;
    rs_sdp_fail(c, ECONNABORTED, true);
    rs_sdp_put(c);      /* the listener's ownership; the watchers still hold one until teardown */
}

/* Child lock held: failed before it was ever queued; the listener's ownership ends here. */
static void child_failed_early(struct rs_sdp_sock *c)
{
    struct rs_sdp_sock *l = c->parent;
    rs_lock(&l->lock);
    if (l->children > 0)
        l->children--;
    rs_sdp_intake_update(l);
    rs_unlock(&l->lock);
    c->app_closed = true;
    rs_sdp_put(c);      /* the listener's ownership; the watchers still hold one until teardown */
}

int rs_sdp_accept(struct rs_sdp_sock *s, unsigned flags, struct rs_sdp_sock **out, struct sockaddr *peer,
                  socklen_t *peer_len)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    *out = NULL;
    rs_sdp_get(s);
    rs_lock(&s->lock);
    uint64_t deadline = s->rcvtimeo_ms > 0 ? rs_sdp_now_ms() + (uint64_t)s->rcvtimeo_ms : 0;
    struct rs_sdp_sock *c = NULL;
    for (;;) {
        rs_sdp_progress(s);
        if (s->state != SDP_ST_LISTEN || s->app_closed) {
            r = s->app_closed ? -EBADF : -EINVAL;
            break;
        }
        if (s->acceptq_head) {
            c = s->acceptq_head;
            s->acceptq_head = c->q_next;
            if (!s->acceptq_head)
                s->acceptq_tail = NULL;
            s->children--;
            if (s->fam)
                rs_sdp_family_set_state(s->fam, s->fam_slot, RS_SDP_MEMBER_BUSY, rs_sdp_now_ms());
            s->intake_want = false;
            rs_sdp_intake_update(s);
            r = 0;
            break;
        }
        if (!s->intake_want) {
            s->intake_want = true;
            rs_sdp_intake_update(s);
        }
        if (s->fam && s->children == 0) {
            /* Nothing here and nothing on its way: the family's dispatcher may send this process the next one.
             * The holder looks at its held requests again at once. */
            rs_sdp_family_set_state(s->fam, s->fam_slot, RS_SDP_MEMBER_WAITING, rs_sdp_now_ms());
            if (s->fam_holder && s->n_held > 0 && s->pw)
                rs_sdp_progress_retime(s, rs_sdp_now_ms());
        }
        if (s->nonblock) {
            r = -EAGAIN;
            break;
        }
        r = rs_sdp_wait(s, deadline);
        if (r == -ETIMEDOUT) {
            r = -EAGAIN;
            break;
        }
        if (r != 0)
            break;
    }
    rs_sdp_signal(s);
    rs_unlock(&s->lock);
    rs_sdp_put(s);
    if (r != 0)
        return r;
    rs_lock(&c->lock);
    struct rs_sdp_sock *parent = c->parent;
    c->parent = NULL;
    c->q_next = NULL;
    c->nonblock = (flags & RS_SDP_NONBLOCK) != 0;
    if (peer && peer_len) {
        socklen_t n = addr_len(&c->peer);
        memcpy(peer, &c->peer, n < *peer_len ? n : *peer_len);
        *peer_len = n;
    }
    rs_unlock(&c->lock);
    if (parent)
        rs_sdp_put(parent);
    *out = c;
    return 0;
}

/* ---- the active side ---- */

int rs_sdp_connect(struct rs_sdp_sock *s, const struct sockaddr *dst, socklen_t len)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    if (!dst || len < (socklen_t)sizeof(struct sockaddr_in))
        return -EINVAL;
    if (dst->sa_family != AF_INET && dst->sa_family != AF_INET6)
        return -EAFNOSUPPORT;
    rs_sdp_get(s);
    rs_lock(&s->lock);
    switch (s->state) {
    case SDP_ST_IDLE:
        break;
    case SDP_ST_CONNECTING:
        r = s->nonblock ? -EALREADY : 0;
        break;
    case SDP_ST_CONNECTED:
    case SDP_ST_ACCEPTING:
        r = -EISCONN;
        break;
    case SDP_ST_CLOSED:
        r = s->so_error ? -s->so_error : -EISCONN;
        s->so_error = 0;
        break;
    case SDP_ST_LISTEN:
        r = -EISCONN;
        break;
    }
    if (r != 0 || s->state == SDP_ST_CONNECTING)
        goto wait_or_out;
    r = rs_sdp_dev_get(s->kind_wanted, s->bound ? (const struct sockaddr *)&s->local : NULL, &s->dev);
    if (r == 0)
        r = rs_sdp_setup_rings(s);
    if (r != 0) {
        rs_sdp_free_rnic(s);
        goto out;
    }
    memset(&s->peer, 0, sizeof(s->peer));
    memcpy(&s->peer, dst, len < sizeof(s->peer) ? len : sizeof(s->peer));
    s->peer_valid = true;
    s->dial = s->peer;
    s->redirects = 0;
    struct rs_sdp_hello hello;
    hello_fill(s, &hello);
    uint8_t pd[RS_SDP_HELLO_LEN];
    size_t n = rs_sdp_hello_encode(&hello, pd, sizeof(pd));
    s->state = SDP_ST_CONNECTING;
    r = rs_sdp_progress_attach(s);
    if (r == 0)
        r = rs_rnic_connect(s->qp, s->cm, dst, len, pd, (uint32_t)n, SDP_CONNECT_TIMEOUT_MS);
    if (r != 0) {
        s->state = SDP_ST_CLOSED;
        s->cm_gone = true;
        goto out;
    }
    s->last_rx_ms = rs_sdp_now_ms();
    if (s->nonblock) {
        r = -EINPROGRESS;
        goto out;
    }
wait_or_out:
    if (r == 0 && s->state == SDP_ST_CONNECTING) {
        uint64_t deadline = s->sndtimeo_ms > 0 ? rs_sdp_now_ms() + (uint64_t)s->sndtimeo_ms : 0;
        for (;;) {
            rs_sdp_progress(s);
            if (s->state != SDP_ST_CONNECTING)
                break;
            r = rs_sdp_wait(s, deadline);
            if (r == -ETIMEDOUT) {
                r = -EINPROGRESS;   /* as a kernel socket with SO_SNDTIMEO: the attempt continues */
                goto out;
            }
            if (r != 0)
                goto out;
        }
        if (s->state == SDP_ST_CONNECTED || s->hb.phase != SDP_HB_NONE) {
            r = 0;      /* (a hand-back the peer started at once: the connection exists, it continues on TCP) */
        } else {
            r = s->so_error ? -s->so_error : -ECONNREFUSED;
            s->so_error = 0;
        }
    }
out:
    rs_sdp_signal(s);
    rs_unlock(&s->lock);
    rs_sdp_put(s);
    return r;
}

/* ---- CM events ---- */

/*
 * Hands each completion to the send or receive side; true when all succeeded. steady (NULL for the full step): the
 * short path's caller found the socket steady under this hold of the lock; compact Data keeps it so, and while only
 * that came the steady test is not asked again (it reads eleven fields, and a ping-pong asked it four times a round
 * trip). *steady says on return whether that still holds; anything else is dispatched as always, the test made after.
 */
static RS_ALWAYS_INLINE bool dispatch_completions(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc, int n,
                                                  bool *steady)
{
    bool all_ok = true;
    for (int i = 0; i < n; i++) {
        all_ok &= wc[i].status == RS_WC_SUCCESS;
        if (wc[i].qp && wc[i].qp != s->qp)
            continue;   /* flushed work of a QP a redirected connect replaced */
        if (wc[i].wr_id & SDP_WR_SEND) {
            rs_sdp_on_send_complete(s, &wc[i]);
            if (steady)
                *steady = false;
        } else if (steady && *steady) {
            *steady = rs_sdp_on_recv_steady(s, &wc[i]);
        } else {
            rs_sdp_on_recv(s, &wc[i]);
        }
    }
    return all_ok;
}

static bool process_cq(struct rs_sdp_sock *s);

/* Lock held, CONNECTING, the attempt failed: tries again at the same address on port (a family member the
 * listener's dispatcher named, or back to the port the application named). The application sees one connect; the
 * peer address stays the one it gave. 0: the new attempt is under way. */
static int connect_again(struct rs_sdp_sock *s, uint16_t port)
{
    if (s->redirects >= SDP_REDIRECT_MAX_HOPS || s->app_closed)
        return -ELOOP;
    s->redirects++;
    set_port(&s->dial, port);
    /* The QP may be reused where the failed attempt left it in INIT (verbs); otherwise (the soft RNIC puts it in
     * ERROR) a fresh one takes its place on the same CQ. The old one's flushed receives are told apart by their QP. */
    if (rs_rnic_qp_state(s->qp) != RS_QPS_INIT) {
        struct rs_rnic_qp *old = s->qp;
        s->qp = NULL;
        int r = create_qp_posted(s);
        rs_rnic_destroy_qp(old);
        if (r != 0)
            return r;
        process_cq(s);
    }
    struct rs_sdp_hello hello;
    hello_fill(s, &hello);
    uint8_t pd[RS_SDP_HELLO_LEN];
    size_t n = rs_sdp_hello_encode(&hello, pd, sizeof(pd));
    RS_DEBUG("sdp: connect redirected to port %u (hop %u)", port, s->redirects);
    s->last_rx_ms = rs_sdp_now_ms();
    return rs_rnic_connect(s->qp, s->cm, (const struct sockaddr *)&s->dial, addr_len(&s->dial), pd, (uint32_t)n,
                           SDP_CONNECT_TIMEOUT_MS);
}

/* Lock held: a CONNECTING socket's attempt failed with ev. True if it goes on elsewhere. */
static bool follow_redirect(struct rs_sdp_sock *s, const struct rs_rnic_cm_event *ev)
{
    if (s->state != SDP_ST_CONNECTING)
        return false;
    uint16_t port = 0;
    bool redirect = ev->type == RS_RNIC_CM_EV_REJECTED &&
                    rs_sdp_redirect_decode(ev->private_data, ev->private_data_len, &port) == 0;
    /* A member that went away between the redirect and our request: the dispatcher chooses again. */
    bool retry = !redirect && s->redirects > 0 && addr_port(&s->dial) != addr_port(&s->peer) &&
                 (ev->type == RS_RNIC_CM_EV_REJECTED || ev->type == RS_RNIC_CM_EV_UNREACHABLE);
    if (!redirect && !retry)
        return false;
    int r = connect_again(s, redirect ? port : addr_port(&s->peer));
    if (r != 0)
        RS_DEBUG("sdp: redirect to port %u not followed (%d)", redirect ? port : addr_port(&s->peer), r);
    return r == 0;
}

/* Lock held: a CONNECTING socket's request ended unanswered (the connection closed before the reply): the process
 * that had taken it off a shared backlog exited or closed its listener before its application accepted it (a
 * prefork child retired by Apache). Nothing of ours was sent yet, so ask again: another process of the family may
 * take it, as the kernel's shared backlog would have given it to one. */
static bool retry_dropped(struct rs_sdp_sock *s, const struct rs_rnic_cm_event *ev)
{
    if (s->state != SDP_ST_CONNECTING || ev->type != RS_RNIC_CM_EV_UNREACHABLE || ev->error != -ECONNRESET)
        return false;
    int r = connect_again(s, addr_port(&s->dial));
    if (r != 0) {
        RS_DEBUG("sdp: connect request dropped by the listener, not tried again (%d)", r);
        return false;
    }
    RS_DEBUG("sdp: connect request dropped by the listener; trying again (%u)", s->redirects);
    return true;
}

static int cm_error_to_errno(const struct rs_rnic_cm_event *ev)
{
    switch (ev->type) {
    case RS_RNIC_CM_EV_REJECTED:
        return ECONNREFUSED;
    case RS_RNIC_CM_EV_TIMEOUT:
        return ETIMEDOUT;
    case RS_RNIC_CM_EV_UNREACHABLE:
        if (ev->error == -ENETUNREACH || ev->error == -EHOSTUNREACH || ev->error == -ECONNREFUSED)
            return -ev->error;
        return ev->error == -EPROTO ? EPROTO : EHOSTUNREACH;
    default:
        return ECONNRESET;
    }
}

/* Lock held. The connection's true local address (a wildcard listener's child learns which address the peer
 * dialled; an active socket learns its port): what getsockname reports from now on. */
static void learn_local_addr(struct rs_sdp_sock *s)
{
    struct sockaddr_storage a;
    if (rs_rnic_qp_local_addr(s->qp, &a) == 0 && a.ss_family == s->family) {
        /* A family member's connection came in on its own port; the client dialled the public one. */
        if (s->public_port)
            set_port(&a, s->public_port);
        s->local = a;
        s->bound = true;
    }
}

static void on_cm_event(struct rs_sdp_sock *s, struct rs_rnic_cm_event *ev)
{
    if (s->state == SDP_ST_LISTEN || ev->type == RS_RNIC_CM_EV_CONNECT_REQUEST) {
        if (ev->type == RS_RNIC_CM_EV_CONNECT_REQUEST) {
            if (ev->listener && ev->listener == s->listener)
                s->requests_seen++;
            if (s->state == SDP_ST_LISTEN)
                on_connect_request(s, ev);
            else
                rs_rnic_reject(ev->request, NULL, 0);
        }
        return;
    }
    if (ev->qp && ev->qp != s->qp)
        return;
    switch (ev->type) {
    case RS_RNIC_CM_EV_ESTABLISHED:
        if (s->state == SDP_ST_CONNECTING) {
            struct rs_sdp_hello ack;
            int r = rs_sdp_hello_ack_decode(ev->private_data, ev->private_data_len, &ack);
            if (r == 0)
                r = hello_apply(s, &ack);
            if (r != 0) {
                RS_DEBUG("sdp: the peer's HelloAck is unusable (%d)", r);
                rs_sdp_fail(s, EPROTO, false);
                return;
            }
            s->state = SDP_ST_CONNECTED;
            learn_local_addr(s);
            s->last_rx_ms = rs_sdp_now_ms();
            s->dirty = true;
            if (s->hb.early_suspend) {
                s->hb.early_suspend = false;
                if (!s->peer_handback) {
                    rs_sdp_protocol_error(s, "hand-back never announced, mid", RS_SDP_MID_SUSPEND);
                    return;
                }
                rs_sdp_hb_on_suspend(s, s->hb.early_service_id);
            }
        } else if (s->state == SDP_ST_ACCEPTING) {
            s->state = SDP_ST_CONNECTED;
            learn_local_addr(s);
            s->last_rx_ms = rs_sdp_now_ms();
            if (s->parent)
                child_established(s);
            s->dirty = true;
        }
        break;
    case RS_RNIC_CM_EV_REJECTED:
    case RS_RNIC_CM_EV_UNREACHABLE:
    case RS_RNIC_CM_EV_TIMEOUT:
        if (follow_redirect(s, ev) || retry_dropped(s, ev))
            break;
        s->cm_gone = true;
        if (s->state == SDP_ST_ACCEPTING && s->parent)
            child_failed_early(s);
        rs_sdp_fail(s, cm_error_to_errno(ev), false);
        break;
    case RS_RNIC_CM_EV_DISCONNECTED:
    case RS_RNIC_CM_EV_ERROR: {
        /* Completions the peer's last messages produced are older than this event: take them first, so a
         * DisConn that is already in the CQ counts. */
        process_cq(s);
        s->cm_gone = true;
        bool early = s->state == SDP_ST_ACCEPTING && s->parent;
        if (early)
            child_failed_early(s);
        if (s->state == SDP_ST_CLOSED)
            break;
        /* Everything the peer sent before DisConn has been received (the QP delivers in order and the CQ was
         * drained before this event was looked at), so after both DisConns this is the normal end. */
        if (ev->type == RS_RNIC_CM_EV_DISCONNECTED && s->disconn_sent && s->disconn_rcvd) {
            s->graceful = true;
            s->state = SDP_ST_CLOSED;
            s->dirty = true;
            rs_sdp_z_fail(s);
        } else {
            rs_sdp_fail(s, ECONNRESET, false);
        }
        break;
    }
    default:
        break;
    }
}

/* ---- the progress step ---- */

static bool test_hold_established;

void rs_sdp_test_hold_established(bool hold)
{
    __atomic_store_n(&test_hold_established, hold, __ATOMIC_RELEASE);
}

/* Both return whether they found anything. */
static bool process_cm(struct rs_sdp_sock *s)
{
    if (s->state == SDP_ST_CONNECTING && __atomic_load_n(&test_hold_established, __ATOMIC_ACQUIRE))
        return false;
    bool found = false;
    struct rs_rnic_cm_event ev;
    while (s->cm && rs_rnic_cm_get_event(s->cm, &ev) == 0) {
        on_cm_event(s, &ev);
        found = true;
    }
    return found;
}

static bool process_cq(struct rs_sdp_sock *s)
{
    struct rs_rnic_wc wc[32];
    bool found = false;
    while (s->cq) {
        int n = rs_rnic_poll_cq(s->cq, (int)RS_ARRAY_SIZE(wc), wc);
        if (n < 0) {
            /* Overflow means our accounting of outstanding work is wrong: nothing can be trusted any more. */
            RS_ERROR("sdp: completion queue failed (%d)", n);
            s->cm_gone = true;
            rs_sdp_fail(s, EIO, false);
            return true;
        }
        if (n == 0)
            return found;
        found = true;
        bool all_ok = dispatch_completions(s, wc, n, NULL);
        /* A short batch of successes emptied the CQ (a provider stops a batch early only at a failed one): what
         * arrives after it waits for the next look, which saves a busy poller's every message a second, empty
         * poll. Failures (a flushed QP) are drained to the end, as the disconnect handling expects. */
        if (n < (int)RS_ARRAY_SIZE(wc) && all_ok)
            return found;
    }
    return found;
}

/* Returns whether it found completions or CM events. */
static bool progress_step(struct rs_sdp_sock *s, bool with_cm, bool lean)
{
    if (s->epoch != rs_sdp_epoch)
        return false;
    bool found = with_cm && process_cm(s);
    found |= process_cq(s);
    /* Lean (an application thread's look at a connected socket): nothing new means nothing to push, no credit
     * to return and no close to advance, since whatever last changed the socket ran those steps itself. A busy
     * poller's misses stop here. */
    if (lean && !found && !s->dirty && s->state == SDP_ST_CONNECTED)
        return false;
    if ((s->state == SDP_ST_CONNECTED || s->state == SDP_ST_ACCEPTING) && !s->broken) {
        rs_sdp_tx_push(s, false);
        rs_sdp_credit_update_check(s);
    }
    rs_sdp_maybe_finish(s);
    if (s->state == SDP_ST_LISTEN) {
        rs_sdp_intake_update(s);
        family_follow_polling(s);
    }
    if (s->dirty) {
        s->dirty = false;
        rs_sdp_signal(s);
        found = true;
    }
    return found;
}

/*
 * A connected socket with nothing timed under way: no data held back (Nagle, cork), no zero-copy cancel awaiting
 * its answer, no close in progress, no keepalive, no CQ to hand back. Its timers have nothing due and no deadline
 * to bring forward, so a busy caller skips them (in the VM under TCG they were a tenth of a small send's work).
 */
static bool timers_quiet(const struct rs_sdp_sock *s)
{
    return s->state == SDP_ST_CONNECTED && !s->broken && !s->keepalive && !s->close_deadline &&
           rs_sdp_tx_hold_deadline(s) == 0 && rs_sdp_z_deadline(s) == 0 && !(s->duty_wanted && s->cq_lazy);
}

/* An application thread's step: with_cm as rs_sdp_progress says; timers when `timers` or the step found work. */
static void app_progress(struct rs_sdp_sock *s, bool timers)
{
    bool on_loop = rs_sdp_progress_on_loop();
    /* Application threads look at CM events only while they matter to them: on verbs each look is a system
     * call, and a connected socket's events (disconnect, error) are the progress thread's business. A
     * listener's connect requests are handled on the progress thread only: accepting one attaches the new
     * socket to the progress thread, which must not be waited for while holding the listener's lock. */
    bool with_cm = on_loop || (s->state != SDP_ST_CONNECTED && s->state != SDP_ST_LISTEN);
    bool found = progress_step(s, with_cm, !timers);
    if ((timers || (found && !timers_quiet(s))) && !on_loop && !s->teardown_queued && s->pw)
        rs_sdp_progress_retime(s, rs_sdp_timers(s, rs_sdp_now_ms()));
}

void rs_sdp_progress(struct rs_sdp_sock *s)
{
    app_progress(s, true);
}

void rs_sdp_progress_poll(struct rs_sdp_sock *s)
{
    /* A busy loop runs this on every call, and misses far outnumber messages: their step stops at the CQ. (In
     * the VM under TCG, added to each send, a thousand function calls cost about 30 us, a thousand atomic
     * increments 40 us, a thousand mutex lock/unlock pairs 130 us, a thousand plain loop iterations 3 us.) */
    app_progress(s, false);
}

/*
 * The short path's look at the CQ (sdp_fast.c), on a socket the caller found steady under the lock it holds: what
 * progress_step does for an application thread on a connected socket in steady state, without the branches that
 * state rules out (CM events, closing, listening, hand-back, zero copy in flight). Under TCG every distinct block a
 * call runs also slows the kernel work that follows it (docs/results/sdp-verbs.md), so the busy poller's calls go
 * this way. Returns 0 when nothing was found, 1 when completions were handled and followed up, -1 when they left
 * the socket needing the full step (dirty is set, so the caller's slow path runs it).
 */
int rs_sdp_progress_fast(struct rs_sdp_sock *s)
{
    struct rs_rnic_wc wc[SDP_FAST_BATCH];
    int n = rs_rnic_poll_cq(s->cq, SDP_FAST_BATCH, wc);
    if (n <= 0)
        return n;
    bool steady = true;
    dispatch_completions(s, wc, n, &steady);
    s->dirty = true;
    /* A full batch may have more behind it; an unusual message changed the state: the full step takes over. */
    if (n == SDP_FAST_BATCH || !(steady || rs_sdp_steady(s)))
        return -1;
    if (s->tx_tail != s->tx_posted)
        rs_sdp_tx_push(s, false);
    else
        s->tx_stalled = false;
    /* With data queued or handed over the caller copies it out and checks the credits after (sdp_fast.c moved()),
     * with the emptied buffers counted: once is enough. */
    if (s->rxq_count == 0 && s->rx_direct_len == 0 && !rs_sdp_credit_view_roomy(s))
        rs_sdp_credit_update_check(s);
    s->dirty = false;
    if (rs_sdp_steady_quiet(s))
        return 1;
    if (rs_sdp_steady_listened(s))
        rs_sdp_signal(s);
    if (rs_sdp_steady_timed(s) && !timers_quiet(s) && !s->teardown_queued && s->pw && !rs_sdp_progress_on_loop())
        rs_sdp_progress_retime(s, rs_sdp_timers(s, rs_sdp_now_ms()));
    return 1;
}

void rs_sdp_call_done(struct rs_sdp_sock *s)
{
    if ((s->state == SDP_ST_CONNECTED || s->state == SDP_ST_ACCEPTING) && !s->broken)
        rs_sdp_credit_update_check(s);
    if (!timers_quiet(s) && !s->teardown_queued && s->pw && !rs_sdp_progress_on_loop())
        rs_sdp_progress_retime(s, rs_sdp_timers(s, rs_sdp_now_ms()));
    if (s->dirty) {
        s->dirty = false;
        rs_sdp_signal(s);
    }
}

/*
 * CQ duty. The progress thread keeps the CQ armed and runs the protocol on every completion. While an application
 * thread polls the socket itself (a nonblocking loop, or a blocking call asleep on the CQ fd) that wakes two
 * threads per completion for the work of one, and a wake-up costs more than a small message, far more in a VM
 * (64 B ping-pong over rxe under TCG: 230 us per transfer with the progress thread woken each time, 45 us
 * without). So when the progress thread finds an application thread at the CQ it leaves the CQ to it: it stops
 * watching the fd and re-arms only for a thread asleep on it, and looks again every SDP_LAZY_TICK_MS. The second
 * tick in a row that finds no application thread polled or slept since the previous look takes the duty back
 * (watch, arm, poll), so no completion waits longer than about two ticks for somebody. Programs that wait in
 * poll/epoll arm nothing and miss once per readiness at most: they never hand the duty over. rsockets has no
 * progress thread at all, so its peers wait for credits until the application calls in; this keeps the thread
 * and drops its cost.
 *
 * Hysteresis both ways, because a poller is not always running: on a loaded machine (two vCPUs under TCG for two
 * pollers and two progress threads) it may miss a whole tick, or find nothing between two of the thread's looks.
 * Deciding on one look made the duty flap (CI: 1848 wake-ups in 2000 round trips, six hand-overs). Handing over
 * counts misses over a window of up to SDP_BUSY_WINDOW looks: SDP_BUSY_MISSES at once, or two per look on
 * average (an event loop misses about once per message, which is one or two looks); taking back needs
 * SDP_ABSENT_TICKS ticks in a row without the application.
 *
 * The looks themselves back off: each tick that finds the application still at the CQ doubles the time to the next,
 * from SDP_LAZY_TICK_MS up to SDP_LAZY_TICK_MAX_MS, and a tick that misses it starts again at the shortest. A look
 * every millisecond cost a busy poller more than any message: on two vCPUs the woken thread takes one from a poller
 * (64 B ping-pong over rxe under TCG, 4 runs: 149-365 us per transfer with 1 ms looks, 99-144 us with 16 ms). Looks
 * 16 ms apart still cost a few percent: in the steady state each end's thread woke about 86 times a second, took a
 * vCPU from a poller each time and sometimes its lock (so the poller slept in futex), and the busy-polled ping-pong
 * ran 4-7% faster with looks up to 256 ms apart (50 interleaved rounds in each of three boots, median ratio to the
 * 16-ms build 0.935-0.958). The price is how long a poller that stops calling in, without sleeping in a call,
 * leaves its connection to nobody: at most SDP_LAZY_TICK_MAX_MS plus two short ticks. Little waits on that look:
 * the timers (Nagle, cork, keepalive, zero-copy cancels, close) set the thread's timer to their own deadlines
 * whatever the tick; a Data buffer is reposted, and its credit returned, only once the application has read it,
 * which it does by calling in; a thread that sleeps in a call arms the CQ, and one that registers readiness
 * interest takes the CQ back at once. What waits is the stamps of last_data_sent/recv and the send completions of a
 * socket the application no longer touches.
 *
 * A thread waiting for readiness (poll, select, epoll: interest registered on the socket) is woken only by
 * whoever runs the protocol and signals, so while any is registered the duty stays with the progress thread: it
 * is never handed over, and registering interest takes it back at once (rs_sdp_interest, duty_wanted).
 */
#define SDP_BUSY_MISSES 4
#define SDP_BUSY_WINDOW 8
#define SDP_ABSENT_TICKS 2

/* An application thread waits for the socket's readiness through poll, select or epoll (see above). */
static bool readiness_waited(const struct rs_sdp_sock *s)
{
    return s->interest_mask != 0;
}

/* Whether an application thread is at the CQ now or was within the current window of looks (see above). */
static bool app_at_cq(struct rs_sdp_sock *s)
{
    s->app_poll_looks++;
    unsigned need = 2u * s->app_poll_looks;
    bool busy = s->app_poll_misses >= (need > SDP_BUSY_MISSES ? need : SDP_BUSY_MISSES);
    bool at_cq = s->cq_waiters > 0 || s->app_waited || busy;
    s->app_waited = false;
    if (busy || s->app_poll_looks >= SDP_BUSY_WINDOW) {
        s->app_poll_misses = 0;
        s->app_poll_looks = 0;
    }
    return at_cq && s->state == SDP_ST_CONNECTED && !s->broken && !readiness_waited(s);
}

/* A lazy look that found the application at the CQ waits twice as long for the next (see above). */
static void lazy_tick_backoff(struct rs_sdp_sock *s, bool app_present)
{
    unsigned next = app_present && s->lazy_tick_ms ? 2u * s->lazy_tick_ms : SDP_LAZY_TICK_MS;
    s->lazy_tick_ms = (uint16_t)(next < SDP_LAZY_TICK_MAX_MS ? next : SDP_LAZY_TICK_MAX_MS);
}

uint64_t rs_sdp_on_cq(struct rs_sdp_sock *s)
{
    rs_lock(&s->lock);
    if (s->cq)
        rs_rnic_cq_ack_events(s->cq);
    bool found = progress_step(s, false, false);
    s->stats.progress_cq_wakeups++;
    /* Woken for a completion that is gone: an application thread polled it first, which is a poller at the CQ
     * whatever the misses say (a descheduled poller may miss little between looks, and each of these wake-ups
     * takes a vCPU from it). Unless this thread's own look after arming took it, or the wake-up was one it fed
     * itself (taking the CQ back, attaching): those find nothing on an idle connection. */
    if (!found && !s->empty_wake_expected && s->app_poll_misses < UINT_MAX / 2)
        s->app_poll_misses += 2u * SDP_BUSY_WINDOW;
    s->empty_wake_expected = false;
    if (s->cq) {
        bool was_lazy = s->cq_lazy;
        s->cq_lazy = app_at_cq(s);
        s->duty_wanted = false;
        if (s->cq_lazy)
            s->app_absent_ticks = 0;
        if (s->cq_lazy && !was_lazy) {
            s->stats.cq_handovers++;
            s->lazy_tick_ms = SDP_LAZY_TICK_MS;
        }
        /* Lazy, the arm that woke us may have been a sleeping application thread's: renew it for that thread,
         * whose poll may not have seen the fd before we drained it. */
        if (!s->cq_lazy || s->cq_waiters > 0) {
            rs_rnic_cq_arm(s->cq, false);
            s->empty_wake_expected = progress_step(s, false, false);  /* what arrived between the last poll and the arm */
        }
    }
    uint64_t next = rs_sdp_timers(s, rs_sdp_now_ms());
    rs_unlock(&s->lock);
    return next;
}

uint64_t rs_sdp_on_cm(struct rs_sdp_sock *s)
{
    rs_lock(&s->lock);
    progress_step(s, true, false);
    uint64_t next = rs_sdp_timers(s, rs_sdp_now_ms());
    rs_unlock(&s->lock);
    return next;
}

uint64_t rs_sdp_on_timer(struct rs_sdp_sock *s)
{
    /* The lazy tick finds an application thread holding the socket: it is at the CQ right now, running the
     * protocol and the timers itself (rs_sdp_progress). Waiting for its lock would only make it wait for ours
     * next; look again at the next tick (set_timer keeps the tick while cq_lazy, written on this thread only). */
    if (s->cq_lazy) {
        if (!rs_trylock(&s->lock)) {
            s->app_absent_ticks = 0;        /* loop thread only, like cq_lazy */
            lazy_tick_backoff(s, true);
            return 0;
        }
    } else {
        rs_lock(&s->lock);
    }
    progress_step(s, true, false);
    /* Taking the duty back: the loop watches the fd again and looks at once (rs_sdp_on_cq arms). */
    if (s->cq_lazy) {
        s->stats.lazy_looks++;
        bool present = app_at_cq(s);
        if (present)
            s->app_absent_ticks = 0;
        else if (++s->app_absent_ticks >= SDP_ABSENT_TICKS || s->duty_wanted)
            s->cq_lazy = false;
        lazy_tick_backoff(s, present);
    }
    uint64_t next = rs_sdp_timers(s, rs_sdp_now_ms());
    if (s->dirty) {
        s->dirty = false;
        rs_sdp_signal(s);
    }
    rs_unlock(&s->lock);
    return next;
}

/* ---- failure, teardown ---- */

void rs_sdp_fail(struct rs_sdp_sock *s, int err, bool send_abort)
{
    /* Only the first failure is reported: later echoes of it (flushed work, the CM event) must not re-arm an
     * error the application already took. */
    if (s->state == SDP_ST_CLOSED)
        return;
    if (err && !s->so_error)
        s->so_error = err;
    bool was_open = s->state == SDP_ST_CONNECTED || s->state == SDP_ST_ACCEPTING;
    bool abort_sent = false;
    if (send_abort && was_open && s->qp && !s->cm_gone && !s->broken && rs_sdp_can_send_ctrl(s))
        abort_sent = rs_sdp_post_msg(s, RS_SDP_MID_ABORT, NULL, 0, 0, 0) == 0;
    s->broken = true;
    s->rx_eof = true;
    s->state = SDP_ST_CLOSED;
    /* A reset discards what was received and not read, as TCP does. */
    rs_sdp_rx_discard_all(s);
    if (s->qp && !s->cm_gone && !s->rnic_disconnect_done) {
        s->rnic_disconnect_done = true;
        /* After an AbortConn an orderly disconnect lets it reach the peer first; otherwise reset at once. */
        if (abort_sent)
            rs_rnic_disconnect(s->qp);
        else
            rs_rnic_qp_set_error(s->qp);
    }
    rs_sdp_z_fail(s);
    s->dirty = true;
    rs_sdp_maybe_finish(s);
}

void rs_sdp_maybe_finish(struct rs_sdp_sock *s)
{
    if ((s->state == SDP_ST_CONNECTED || s->state == SDP_ST_ACCEPTING) && !s->broken && s->disconn_sent &&
        s->disconn_rcvd && !s->rnic_disconnect_done && !s->cm_gone && s->sq_used == 0) {
        s->rnic_disconnect_done = true;
        s->graceful = true;
        rs_rnic_disconnect(s->qp);
    }
    bool over = s->state == SDP_ST_CLOSED || s->state == SDP_ST_IDLE;
    /* Not tied to app_closed: a connection closed by the process exit is still held by the application. */
    if (over && s->orphan_counted) {
        s->orphan_counted = false;
        rs_sdp_progress_register_orphan(s, -1);
    }
    if (s->app_closed && !s->teardown_queued && over) {
        s->teardown_queued = true;
        if (s->pw)
            rs_sdp_progress_detach(s);
    }
}

/* ---- shutdown and close ---- */

int rs_sdp_shutdown(struct rs_sdp_sock *s, int how)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
        return -EINVAL;
    rs_lock(&s->lock);
    if (rs_sdp_hb_settle(s) != 0) {
        rs_unlock(&s->lock);
        return -EREMCHG;
    }
    rs_sdp_progress(s);
    if (s->state == SDP_ST_LISTEN && how != SHUT_WR) {
        /* Linux lets shutdown(SHUT_RD) stop a listener: blocked accepts return EINVAL. */
        s->state = SDP_ST_CLOSED;
        family_leave(s);
        if (s->listener) {
            rs_rnic_listener_close(s->listener);
            s->listener = NULL;
        }
        s->dirty = true;
    } else if (s->state != SDP_ST_CONNECTED) {
        r = -ENOTCONN;
    } else {
        if (how != SHUT_WR)
            s->rd_shut = true;
        if (how != SHUT_RD && !s->wr_shut) {
            s->wr_shut = true;
            rs_sdp_tx_push(s, true);
        }
        s->dirty = true;
    }
    if (s->dirty) {
        s->dirty = false;
        rs_sdp_signal(s);
    }
    rs_unlock(&s->lock);
    return r;
}

static void close_listener(struct rs_sdp_sock *s)
{
    s->state = SDP_ST_CLOSED;
    family_leave(s);
    if (s->listener) {
        if (s->park_listener)
            rs_rnic_listener_park(s->listener);
        else
            rs_rnic_listener_close(s->listener);
        s->listener = NULL;
    }
    struct rs_sdp_sock *q = s->acceptq_head;
    s->acceptq_head = s->acceptq_tail = NULL;
    s->children = 0;
    rs_unlock(&s->lock);
    /* Connections nobody accepted are reset, as the kernel does for a closed listener's queue. */
    while (q) {
        struct rs_sdp_sock *c = q;
        q = c->q_next;
        rs_lock(&c->lock);
        c->q_next = NULL;
        c->app_closed = true;
        rs_sdp_fail(c, ECONNRESET, true);
        rs_sdp_maybe_finish(c);
        rs_unlock(&c->lock);
        rs_sdp_put(c);      /* the listener's ownership */
    }
    rs_lock(&s->lock);
}

/* Closes a connected socket as the kernel closes a TCP one: a reset when unread data would be lost (or
 * SO_LINGER 0 asks for one), else both directions shut, DisConn after the pending data, and the connection
 * lives on as an orphan the exit flush waits for. Returns false if it reset. Lock held. */
static bool close_connected(struct rs_sdp_sock *s)
{
    bool unread = s->rx_bytes_queued > 0 || s->rxq_count > 0;
    if ((s->linger_on && s->linger_s == 0) || unread) {
        rs_sdp_fail(s, ECONNRESET, true);
        return false;
    }
    s->rd_shut = true;
    s->wr_shut = true;
    if (!s->close_deadline)
        s->close_deadline = rs_sdp_now_ms() + SDP_ORPHAN_TIMEOUT_MS;
    if (!s->orphan_counted) {
        s->orphan_counted = true;
        rs_sdp_progress_register_orphan(s, 1);
    }
    rs_sdp_tx_push(s, true);
    return true;
}

void rs_sdp_exit_close(struct rs_sdp_sock *s)
{
    if (rs_sdp_check_epoch(s) != 0)
        return;
    rs_lock(&s->lock);
    /* A child still in a listener's accept queue was never the application's: the kernel resets those. */
    if (!s->app_closed && !s->orphan_counted && !s->parent && s->state == SDP_ST_CONNECTED) {
        rs_sdp_progress(s);
        if (s->state == SDP_ST_CONNECTED) {
            close_connected(s);
            s->dirty = true;
            rs_sdp_maybe_finish(s);
            if (s->pw)
                rs_sdp_progress_retime(s, rs_sdp_timers(s, rs_sdp_now_ms()));
        }
    }
    if (s->dirty) {
        s->dirty = false;
        rs_sdp_signal(s);
    }
    rs_unlock(&s->lock);
}

int rs_sdp_close_parked(struct rs_sdp_sock *s)
{
    if (rs_sdp_check_epoch(s) != 0)
        return 0;
    rs_lock(&s->lock);
    s->park_listener = s->state == SDP_ST_LISTEN;
    rs_unlock(&s->lock);
    return rs_sdp_close(s);
}

int rs_sdp_close(struct rs_sdp_sock *s)
{
    if (rs_sdp_check_epoch(s) != 0)
        return 0;   /* inherited across fork: the parent still owns the connection; nothing to do here */
    rs_lock(&s->lock);
    if (s->app_closed) {
        rs_unlock(&s->lock);
        return -EBADF;
    }
    int r = 0;
    rs_sdp_progress(s);
    s->app_closed = true;
    if (s->stats.msgs_sent || s->stats.msgs_received)
        RS_DEBUG("sdp: close: %llu/%llu messages out/in (%llu sent unsignaled), %llu/%llu bytes, credit stalls %llu; "
                 "progress thread woken by the CQ %llu times, left it to the application %llu times (then looked %llu "
                 "times); application slept %llu times (%llu on the peer's messages only)",
                 (unsigned long long)s->stats.msgs_sent, (unsigned long long)s->stats.msgs_received,
                 (unsigned long long)s->stats.quiet_sends,
                 (unsigned long long)s->stats.bytes_sent, (unsigned long long)s->stats.bytes_received,
                 (unsigned long long)s->stats.credit_stalls, (unsigned long long)s->stats.progress_cq_wakeups,
                 (unsigned long long)s->stats.cq_handovers, (unsigned long long)s->stats.lazy_looks,
                 (unsigned long long)s->stats.app_sleeps,
                 (unsigned long long)s->stats.app_sleeps_solicited);
    if (s->hb.phase != SDP_HB_NONE) {
        /* Handed back, or being: the kernel socket is the connection. One nobody took closes as the application's
         * close would close it; one under way closes when it is done (sdp_handback.c). */
        if (s->hb.fd >= 0) {
            syscall(SYS_close, s->hb.fd);
            s->hb.fd = -1;
        }
    } else switch (s->state) {
    case SDP_ST_IDLE:
        s->state = SDP_ST_CLOSED;
        break;
    case SDP_ST_LISTEN:
        close_listener(s);
        break;
    case SDP_ST_CONNECTING:
    case SDP_ST_ACCEPTING:
        rs_sdp_fail(s, ECONNABORTED, false);
        break;
    case SDP_ST_CONNECTED: {
        if (!close_connected(s))
            break;
        if (s->linger_on) {
            uint64_t deadline = rs_sdp_now_ms() + (uint64_t)s->linger_s * 1000u;
            for (;;) {
                rs_sdp_progress(s);
                if (s->state == SDP_ST_CLOSED || s->broken)
                    break;
                if (s->disconn_sent && rs_sdp_seq_diff(s->peer_ack, s->disconn_mseq) >= 0)
                    break;
                int w = rs_sdp_wait(s, deadline);
                if (w == -ETIMEDOUT) {
                    r = -EWOULDBLOCK;
                    break;
                }
                if (w == -EINTR) {
                    r = -EINTR;
                    break;
                }
            }
        }
        break;
    }
    case SDP_ST_CLOSED:
        break;
    }
    s->dirty = true;
    rs_sdp_maybe_finish(s);
    if (!s->teardown_queued && s->pw)
        rs_sdp_progress_retime(s, rs_sdp_timers(s, rs_sdp_now_ms()));
    rs_sdp_signal(s);       /* blocked callers see app_closed and return -EBADF */
    s->dirty = false;
    rs_unlock(&s->lock);
    rs_sdp_put(s);
    return r;
}

/* ---- timers and keepalive ---- */

static bool post_ka_read(struct rs_sdp_sock *s)
{
    if (!rs_sdp_sq_has_room(s, 1))
        return false;
    uint32_t slot = rs_sdp_slot_alloc(s, SDP_SLOT_KA_READ);
    struct rs_rnic_sge sge = {
        .addr = (uint64_t)(uintptr_t)(s->hdr_mem + (size_t)slot * SDP_HDR_SLOT + 32), .length = 8,
        .lkey = s->hdr_mr->lkey,
    };
    struct rs_rnic_send_wr wr = {
        .wr_id = SDP_WR_SEND | slot, .opcode = RS_WR_RDMA_READ, .flags = RS_SEND_SIGNALED, .sg_list = &sge,
        .num_sge = 1,
    };
    wr.rdma.remote_addr = s->peer_ka_addr;
    wr.rdma.rkey = s->peer_ka_rkey;
    struct rs_rnic_send_wr *bad = NULL;
    if (rs_rnic_post_send(s->qp, &wr, &bad) != 0) {
        s->slots[slot].done = true;     /* released by the next completion sweep */
        return false;
    }
    return true;
}

#define CONSIDER(next, t) \
    do { \
        uint64_t t_ = (t); \
        if (t_ && ((next) == 0 || t_ < (next))) \
            (next) = t_; \
    } while (0)

uint64_t rs_sdp_timers(struct rs_sdp_sock *s, uint64_t now)
{
    uint64_t next = 0;
    rs_sdp_stamps_settle(s, now);
    bool open = (s->state == SDP_ST_CONNECTED || s->state == SDP_ST_ACCEPTING) && !s->broken;
    if (open) {
        uint64_t hold = rs_sdp_tx_hold_deadline(s);
        if (hold && now >= hold) {
            rs_sdp_tx_push(s, true);
            hold = rs_sdp_tx_hold_deadline(s);
        }
        CONSIDER(next, hold);
        rs_sdp_z_timer(s, now);
        CONSIDER(next, rs_sdp_z_deadline(s));
    }
    if (open && s->keepalive && s->state == SDP_ST_CONNECTED && s->peer_ka_rkey) {
        uint64_t idle = (uint64_t)s->ka_idle * 1000u;
        uint64_t intvl = (uint64_t)(s->ka_intvl > 0 ? s->ka_intvl : 1) * 1000u;
        if (!s->ka_read_out) {
            uint64_t due = s->last_rx_ms + idle;
            if (now >= due) {
                if (post_ka_read(s)) {
                    s->ka_read_out = true;
                    s->ka_probe_ms = now;
                    s->ka_missed = 0;
                } else {
                    CONSIDER(next, now + 100);
                }
            } else {
                CONSIDER(next, due);
            }
        }
        if (s->ka_read_out) {
            uint64_t missed = (now - s->ka_probe_ms) / intvl;
            s->ka_missed = (int)missed;
            if (missed >= (uint64_t)(s->ka_cnt > 0 ? s->ka_cnt : 1)) {
                RS_DEBUG("sdp: keepalive: peer silent for %llu ms, resetting",
                         (unsigned long long)(now - s->ka_probe_ms));
                rs_sdp_fail(s, ETIMEDOUT, false);
            } else {
                CONSIDER(next, s->ka_probe_ms + (missed + 1) * intvl);
            }
        }
    }
    if (s->fam && !s->fam_holder && s->state == SDP_ST_LISTEN) {
        if (now >= s->fam_check_ms && rs_sdp_progress_on_loop()) {
            s->fam_check_ms = now + SDP_FAMILY_CHECK_MS;
            if (!rs_sdp_family_holder_alive(s->fam))
                member_promote(s);
        }
        if (s->fam)
            CONSIDER(next, s->fam_check_ms ? s->fam_check_ms : now + SDP_FAMILY_CHECK_MS);
    }
    if (s->n_held > 0 && s->state == SDP_ST_LISTEN) {
        /* Accepting attaches a socket to the progress thread: only that thread does it under a listener's lock. */
        if (rs_sdp_progress_on_loop())
            dispatch_held(s, now);
        if (s->n_held > 0)
            CONSIDER(next, now + SDP_DISPATCH_TICK_MS);
    }
    if (s->close_deadline && s->state != SDP_ST_CLOSED) {
        if (now >= s->close_deadline)
            rs_sdp_fail(s, ETIMEDOUT, true);
        else
            CONSIDER(next, s->close_deadline);
    }
    if (s->duty_wanted && s->cq_lazy)
        CONSIDER(next, now);        /* the progress thread takes the CQ back at its next look: now (CQ duty) */
    return next;
}

/* ---- names ---- */

int rs_sdp_getsockname(struct rs_sdp_sock *s, struct sockaddr *addr, socklen_t *len)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    struct sockaddr_storage a = s->local;
    if (!s->bound) {
        memset(&a, 0, sizeof(a));
        a.ss_family = (sa_family_t)s->family;
    }
    rs_unlock(&s->lock);
    socklen_t n = addr_len(&a);
    memcpy(addr, &a, n < *len ? n : *len);
    *len = n;
    return 0;
}

int rs_sdp_getpeername(struct rs_sdp_sock *s, struct sockaddr *addr, socklen_t *len)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    bool ok = s->peer_valid && (s->state == SDP_ST_CONNECTED || (s->state == SDP_ST_CLOSED && !s->broken));
    struct sockaddr_storage a = s->peer;
    rs_unlock(&s->lock);
    if (!ok)
        return -ENOTCONN;
    socklen_t n = addr_len(&a);
    memcpy(addr, &a, n < *len ? n : *len);
    *len = n;
    return 0;
}
