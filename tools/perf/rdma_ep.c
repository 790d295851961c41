/*
 * rdma_ep.c: rdmasock-perf's RNIC side: the device, UD and RC endpoints (one QP each, set up once and reused by
 * every point), posting, and waiting for completions.
 *
 * Waiting: by default blocking, the race-free way rnic.h describes (poll the CQ; if empty arm it, poll once more,
 * then sleep in poll(2) on the CQ fd and drain it with rs_rnic_cq_ack_events). With --poll the CQ is polled in a
 * loop. The control connection's fd can be waited on at the same time, so a receiver notices the client's DONE.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdma.h"
#include "sys.h"

#define SETUP_TIMEOUT_MS 10000

static int wait_cm_event(struct perf_ep *ep, enum rs_rnic_cm_event_type want, struct rs_rnic_cm_event *ev)
{
    uint64_t deadline = perf_now_ns() + (uint64_t)SETUP_TIMEOUT_MS * 1000000u;
    for (;;) {
        int rc = rs_rnic_cm_get_event(ep->cm, ev);
        if (rc == 0) {
            if (ev->type == want)
                return 0;
            perf_log("connection manager: event %d (error %d) while waiting for %d", (int)ev->type, ev->error,
                     (int)want);
            return ev->error ? ev->error : -EPROTO;
        }
        if (rc != -EAGAIN)
            return rc;
        int64_t left_ms = (int64_t)(deadline - perf_now_ns()) / 1000000;
        if (left_ms <= 0)
            return -ETIMEDOUT;
        struct pollfd p = { .fd = rs_rnic_cm_fd(ep->cm), .events = POLLIN };
        perf_sys_poll(&p, 1, (int)left_ms);
    }
}

int perf_rdma_open(int kind, const struct sockaddr_storage *local, bool poll, struct perf_rdma **out)
{
    struct perf_rdma *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->kind = kind;
    r->poll = poll;
    int rc = rs_rnic_open(kind, (const struct sockaddr *)local, &r->rnic);
    if (rc == 0)
        rc = rs_rnic_alloc_pd(r->rnic, &r->pd);
    if (rc) {
        if (r->rnic)
            rs_rnic_close(r->rnic);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

static void ep_destroy(struct perf_ep *ep)
{
    if (ep->qp && ep->group == PERF_GROUP_RC && rs_rnic_qp_state(ep->qp) == RS_QPS_RTS)
        rs_rnic_disconnect(ep->qp);
    if (ep->peer)
        rs_rnic_ud_peer_free(ep->peer);
    if (ep->qp)
        rs_rnic_destroy_qp(ep->qp);
    if (ep->listener)
        rs_rnic_listener_close(ep->listener);
    if (ep->mr)
        rs_rnic_dereg_mr(ep->mr);
    if (ep->cm)
        rs_rnic_cm_destroy(ep->cm);
    if (ep->cq)
        rs_rnic_destroy_cq(ep->cq);
    free(ep->buf);
    memset(ep, 0, sizeof(*ep));
}

void perf_rdma_close(struct perf_rdma *r)
{
    if (!r)
        return;
    for (int i = 0; i < 2; i++)
        ep_destroy(&r->ep[i]);
    rs_rnic_dealloc_pd(r->pd);
    rs_rnic_close(r->rnic);
    free(r);
}

const struct rs_rnic_caps *perf_rdma_caps(const struct perf_rdma *r) { return rs_rnic_caps(r->rnic); }

size_t perf_rdma_max_size(const struct perf_rdma *r, const struct perf_case *c)
{
    const struct rs_rnic_caps *caps = rs_rnic_caps(r->rnic);
    if (c->transport == PERF_RC)
        return caps->max_rc_msg;
    /* A UD SEND or READ is segmented like a Write-Record: the same limit. */
    return caps->max_record_msg;
}

/* CQ, CM, QP and the registered buffer of one endpoint. */
static int ep_create(struct perf_rdma *r, enum perf_group g, size_t buf_len)
{
    struct perf_ep *ep = &r->ep[g];
    if (ep->up)
        ep_destroy(ep);
    memset(ep, 0, sizeof(*ep));
    ep->group = g;
    const struct rs_rnic_caps *caps = rs_rnic_caps(r->rnic);
    ep->rq_depth = PERF_RQ_DEPTH < caps->max_qp_wr ? PERF_RQ_DEPTH : caps->max_qp_wr;
    ep->sq_depth = 2 * PERF_DEFAULT_WINDOW + 16;
    if (ep->sq_depth < 1024 && caps->max_qp_wr >= 1024)
        ep->sq_depth = 1024;        /* room for a larger --window */
    if (ep->sq_depth > caps->max_qp_wr)
        ep->sq_depth = caps->max_qp_wr;
    ep->ord = caps->max_ord ? caps->max_ord : 1;
    ep->buf_len = buf_len < 4096 ? 4096 : buf_len;
    ep->buf = aligned_alloc(4096, (ep->buf_len + 4095) & ~(size_t)4095);
    if (!ep->buf)
        return -ENOMEM;
    memset(ep->buf, 0x5a, ep->buf_len);
    uint32_t cq_depth = ep->sq_depth + ep->rq_depth + 64;
    if (cq_depth > caps->max_cqe)
        cq_depth = caps->max_cqe;
    int rc = rs_rnic_reg_mr(r->pd, ep->buf, ep->buf_len,
                            RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ, &ep->mr);
    if (rc == 0)
        rc = rs_rnic_create_cq(r->rnic, cq_depth, &ep->cq);
    if (rc == 0)
        rc = rs_rnic_cm_create(r->rnic, &ep->cm);
    if (rc == 0) {
        struct rs_rnic_qp_attr attr = {
            .type = g == PERF_GROUP_UD ? RS_QPT_UD : RS_QPT_RC,
            .send_cq = ep->cq,
            .recv_cq = ep->cq,
            .max_send_wr = ep->sq_depth,
            .max_recv_wr = ep->rq_depth,
            .max_send_sge = 1,
            .max_recv_sge = 1,
            .ud_read_timeout_ms = PERF_UD_READ_TIMEOUT_MS,
        };
        rc = rs_rnic_create_qp(r->pd, &attr, &ep->qp);
    }
    for (uint32_t i = 0; i < PERF_REPOST_BATCH; i++) {
        ep->recv_sge[i] = (struct rs_rnic_sge){ (uint64_t)(uintptr_t)ep->buf, (uint32_t)ep->buf_len,
                                                ep->mr ? ep->mr->lkey : 0 };
        ep->recv_wr[i].sg_list = &ep->recv_sge[i];
        ep->recv_wr[i].num_sge = 1;
        ep->recv_wr[i].wr_id = 0;
    }
    if (rc == 0) {
        /* Every receive is posted now and kept posted: a peer's SEND must never find the queue empty (RC fails
         * the connection when it does, UD drops the datagram). */
        ep->rq_missing = ep->rq_depth;
        rc = perf_ep_repost(ep, true);
    }
    if (rc)
        ep_destroy(ep);
    else
        ep->up = true;
    return rc;
}

static void describe(const struct perf_ep *ep, struct perf_msg *m)
{
    m->rkey = ep->mr->rkey;
    m->addr = (uint64_t)(uintptr_t)ep->buf;
    m->len = ep->buf_len;
}

static void learn_peer(struct perf_ep *ep, const struct perf_msg *m)
{
    ep->remote_rkey = (uint32_t)m->rkey;
    ep->remote_addr = m->addr;
    ep->remote_len = m->len;
}

static int ud_bind(struct perf_ep *ep, const struct sockaddr_storage *local, struct perf_msg *m)
{
    struct sockaddr_storage a = *local;
    perf_addr_set_port(&a, 0);
    int rc = rs_rnic_ud_bind(ep->qp, (const struct sockaddr *)&a, perf_addr_len(&a));
    if (rc)
        return rc;
    struct sockaddr_storage bound;
    rc = rs_rnic_ud_local_addr(ep->qp, &bound);
    if (rc)
        return rc;
    m->port = perf_addr_port(&bound);
    describe(ep, m);
    return 0;
}

static int ud_resolve(struct perf_ep *ep, const struct sockaddr_storage *addr, uint16_t port)
{
    struct sockaddr_storage a = *addr;
    perf_addr_set_port(&a, port);
    int rc = rs_rnic_ud_resolve_peer(ep->qp, ep->cm, (const struct sockaddr *)&a, NULL, SETUP_TIMEOUT_MS, NULL,
                                     &ep->peer);
    if (rc)
        return rc;
    struct rs_rnic_cm_event ev;
    return wait_cm_event(ep, RS_RNIC_CM_EV_UD_PEER_RESOLVED, &ev);
}

int perf_rdma_server_setup(struct perf_rdma *r, enum perf_group g, const struct sockaddr_storage *local,
                           size_t buf_len, struct perf_msg *reply)
{
    int rc = ep_create(r, g, buf_len);
    if (rc)
        return rc;
    struct perf_ep *ep = &r->ep[g];
    if (g == PERF_GROUP_UD)
        return ud_bind(ep, local, reply);
    struct sockaddr_storage a = *local, bound;
    perf_addr_set_port(&a, 0);
    rc = rs_rnic_listen(ep->cm, (const struct sockaddr *)&a, perf_addr_len(&a), 1, &ep->listener);
    if (rc == 0)
        rc = rs_rnic_listener_addr(ep->listener, &bound);
    if (rc)
        return rc;
    reply->port = perf_addr_port(&bound);
    describe(ep, reply);
    return 0;
}

int perf_rdma_server_peer(struct perf_rdma *r, enum perf_group g, const struct sockaddr_storage *client_addr,
                          const struct perf_msg *peer)
{
    struct perf_ep *ep = &r->ep[g];
    learn_peer(ep, peer);
    if (g == PERF_GROUP_UD)
        return ud_resolve(ep, client_addr, (uint16_t)peer->port);
    struct rs_rnic_cm_event ev;
    int rc = wait_cm_event(ep, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    if (rc == 0)
        rc = rs_rnic_accept(ev.request, ep->qp, ep->cm, NULL, 0);
    if (rc == 0)
        rc = wait_cm_event(ep, RS_RNIC_CM_EV_ESTABLISHED, &ev);
    return rc;
}

int perf_rdma_client_setup(struct perf_rdma *r, enum perf_group g, const struct sockaddr_storage *local,
                           const struct sockaddr_storage *server, const struct perf_msg *server_ep, size_t buf_len,
                           struct perf_msg *mine)
{
    int rc = ep_create(r, g, buf_len);
    if (rc)
        return rc;
    struct perf_ep *ep = &r->ep[g];
    learn_peer(ep, server_ep);
    if (g == PERF_GROUP_UD) {
        rc = ud_bind(ep, local, mine);
        return rc ? rc : ud_resolve(ep, server, (uint16_t)server_ep->port);
    }
    struct sockaddr_storage a = *server;
    perf_addr_set_port(&a, (uint16_t)server_ep->port);
    rc = rs_rnic_connect(ep->qp, ep->cm, (const struct sockaddr *)&a, perf_addr_len(&a), NULL, 0, SETUP_TIMEOUT_MS);
    if (rc)
        return rc;
    describe(ep, mine);
    return 0;
}

int perf_rdma_client_ready(struct perf_rdma *r, enum perf_group g)
{
    if (g == PERF_GROUP_UD)
        return 0;
    struct rs_rnic_cm_event ev;
    return wait_cm_event(&r->ep[g], RS_RNIC_CM_EV_ESTABLISHED, &ev);
}

/* ---- posting ---- */

static int post_chain(struct perf_ep *ep, struct rs_rnic_send_wr *wr, uint32_t requests)
{
    struct rs_rnic_send_wr *bad = NULL;
    int rc = rs_rnic_post_send(ep->qp, wr, &bad);
    if (rc) {
        perf_log("post_send: %s", strerror(-rc));
        return rc;
    }
    ep->sq_outstanding += requests;
    return 0;
}

/* Sets the signaling of the last request of a chain of `requests` and its wr_id (requests it retires). */
static void decide_signal(struct perf_ep *ep, struct rs_rnic_send_wr *last, uint32_t requests, bool signal)
{
    ep->unsignaled += requests;
    if (signal || ep->unsignaled >= ep->sig_every) {
        last->flags |= RS_SEND_SIGNALED;
        last->wr_id = ep->unsignaled;
        ep->unsignaled = 0;
    }
}

int perf_ep_post(struct perf_ep *ep, enum rs_rnic_wr_opcode op, size_t size, bool signal)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)ep->buf, (uint32_t)size, ep->mr->lkey };
    struct rs_rnic_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = op;
    wr.sg_list = size ? &sge : NULL;
    wr.num_sge = size ? 1 : 0;
    wr.rdma.remote_addr = ep->remote_addr;
    wr.rdma.rkey = ep->remote_rkey;
    wr.ud_peer = ep->peer;
    /* A UD READ can be lost, so every one is signaled and counted; RC completes READs in order, so one signaled
     * READ retires the unsignaled ones before it (its wr_id says how many), as perftest's cq_mod does. */
    decide_signal(ep, &wr, 1, signal || (op == RS_WR_RDMA_READ && ep->group != PERF_GROUP_RC));
    return post_chain(ep, &wr, 1);
}

int perf_ep_post_write_notice(struct perf_ep *ep, size_t size)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)ep->buf, (uint32_t)size, ep->mr->lkey };
    struct rs_rnic_send_wr wr[2];
    memset(wr, 0, sizeof(wr));
    wr[0].opcode = RS_WR_RDMA_WRITE;
    wr[0].sg_list = &sge;
    wr[0].num_sge = 1;
    wr[0].rdma.remote_addr = ep->remote_addr;
    wr[0].rdma.rkey = ep->remote_rkey;
    wr[0].next = &wr[1];
    wr[1].opcode = RS_WR_SEND;
    decide_signal(ep, &wr[1], 2, false);
    return post_chain(ep, wr, 2);
}

int perf_ep_repost(struct perf_ep *ep, bool force)
{
    while (ep->rq_missing >= PERF_REPOST_BATCH || (force && ep->rq_missing > 0)) {
        uint32_t n = ep->rq_missing < PERF_REPOST_BATCH ? ep->rq_missing : PERF_REPOST_BATCH;
        for (uint32_t i = 0; i < n; i++)
            ep->recv_wr[i].next = i + 1 < n ? &ep->recv_wr[i + 1] : NULL;
        struct rs_rnic_recv_wr *bad = NULL;
        int rc = rs_rnic_post_recv(ep->qp, ep->recv_wr, &bad);
        if (rc) {
            perf_log("post_recv: %s", strerror(-rc));
            return rc;
        }
        ep->rq_missing -= n;
    }
    return 0;
}

/* ---- completions ---- */

static const char *status_name(enum rs_rnic_wc_status s)
{
    static const char *const names[] = { "success", "local length error", "local protection error",
                                         "remote access error", "remote invalid request", "retry exceeded",
                                         "flushed", "timeout", "record partial", "general error" };
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

/* Accounts one completion; -EIO for a failure that ends the measurement. */
static int account(struct perf_ep *ep, const struct rs_rnic_wc *wc)
{
    switch (wc->opcode) {
    case RS_WC_SEND:
    case RS_WC_RDMA_WRITE:
    case RS_WC_WRITE_RECORD:
    case RS_WC_RDMA_READ: {
        uint32_t retired = wc->status == RS_WC_SUCCESS || wc->opcode == RS_WC_RDMA_READ ? (uint32_t)wc->wr_id : 1;
        if (retired == 0 || retired > ep->sq_outstanding)
            retired = ep->sq_outstanding;
        ep->sq_outstanding -= retired;
        break;
    }
    case RS_WC_RECV:
    case RS_WC_RECV_RDMA_WITH_IMM:
        ep->rq_missing++;
        break;
    default:
        break;              /* RECV_WRITE_RECORD consumes no receive; nothing else is posted here */
    }
    if (wc->status == RS_WC_SUCCESS)
        return 0;
    /* Datagram losses are part of what UD measures: a READ or a segmented SEND that timed out, a partial
     * record. Everything else is a failure of the run. */
    if (ep->group == PERF_GROUP_UD && (wc->status == RS_WC_TIMEOUT || wc->status == RS_WC_RECORD_PARTIAL))
        return 0;
    perf_log("completion failed: opcode %d, %s", (int)wc->opcode, status_name(wc->status));
    return -EIO;
}

static int account_all(struct perf_ep *ep, struct rs_rnic_wc *wc, int n)
{
    for (int i = 0; i < n; i++) {
        int rc = account(ep, &wc[i]);
        if (rc)
            return rc;
    }
    return n;
}

static bool ctrl_readable(int ctrl_fd)
{
    struct pollfd p = { .fd = ctrl_fd, .events = POLLIN };
    return perf_sys_poll(&p, 1, 0) > 0;
}

int perf_ep_wait(struct perf_rdma *r, struct perf_ep *ep, struct rs_rnic_wc *wc, int max, int ctrl_fd,
                 int timeout_ms)
{
    uint64_t deadline = timeout_ms >= 0 ? perf_now_ns() + (uint64_t)timeout_ms * 1000000u : UINT64_MAX;
    if (r->poll) {
        for (unsigned spins = 1;; spins++) {
            int n = rs_rnic_poll_cq(ep->cq, max, wc);
            if (n != 0)
                return n < 0 ? n : account_all(ep, wc, n);
            /* Reading the clock and the control fd costs more than a CQ poll: only now and then. */
            if (spins % 1024 == 0) {
                if (ctrl_fd >= 0 && ctrl_readable(ctrl_fd))
                    return PERF_WAIT_CTRL;
                if (perf_now_ns() >= deadline)
                    return 0;
            }
        }
    }
    for (;;) {
        int n = rs_rnic_poll_cq(ep->cq, max, wc);
        if (n == 0) {
            int rc = rs_rnic_cq_arm(ep->cq, false);
            if (rc)
                return rc;
            n = rs_rnic_poll_cq(ep->cq, max, wc);       /* what arrived before the arm took effect */
        }
        if (n != 0)
            return n < 0 ? n : account_all(ep, wc, n);
        uint64_t now = perf_now_ns();
        if (now >= deadline)
            return 0;
        int wait_ms = deadline == UINT64_MAX ? -1 : (int)((deadline - now + 999999) / 1000000);
        struct pollfd p[2] = { { .fd = rs_rnic_cq_fd(ep->cq), .events = POLLIN }, { .fd = ctrl_fd, .events = POLLIN } };
        int k = perf_sys_poll(p, ctrl_fd >= 0 ? 2 : 1, wait_ms);
        if (k < 0 && k != -EINTR)
            return k;
        if (k > 0 && (p[0].revents & POLLIN))
            rs_rnic_cq_ack_events(ep->cq);
        if (k > 0 && ctrl_fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)))
            return PERF_WAIT_CTRL;
    }
}

int perf_ep_drain(struct perf_rdma *r, struct perf_ep *ep, uint64_t *recvs)
{
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    /* Unsignaled requests complete silently; they stay counted and the next signaled completion (in this run or
     * the next) retires them with its own. */
    while (ep->sq_outstanding > ep->unsignaled) {
        int n = perf_ep_wait(r, ep, wc, PERF_WC_BATCH, -1, PERF_RELIABLE_TIMEOUT_MS);
        if (n < 0)
            return n;
        if (n == 0) {
            perf_log("send completions missing after %d ms (%u outstanding)", PERF_RELIABLE_TIMEOUT_MS,
                     ep->sq_outstanding);
            return -ETIMEDOUT;
        }
        for (int i = 0; i < n; i++)
            if (recvs && wc[i].opcode == RS_WC_RECV)
                (*recvs)++;
        int rc = perf_ep_repost(ep, false);
        if (rc)
            return rc;
    }
    return perf_ep_repost(ep, true);
}
