/*
 * soft_qp.c: the queue-pair base of the soft RNIC: creation and destruction, the send queue ring shared by both
 * halves, work-request validation, the ERROR state, and dispatch to the datagram half (ud_*.c) or the RC half
 * (rs_soft_rc_ops).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rnic/soft/soft.h"

/* ---- send queue ---- */

static int sq_init(struct rs_soft_sq *sq, uint32_t capacity, uint32_t max_sge, uint32_t max_inline)
{
    memset(sq, 0, sizeof(*sq));
    if (max_sge == 0)
        max_sge = 1;
    sq->ring = calloc(capacity, sizeof(*sq->ring));
    sq->sges = calloc((size_t)capacity * max_sge, sizeof(*sq->sges));
    if (max_inline)
        sq->inline_buf = malloc((size_t)capacity * max_inline);
    if (!sq->ring || !sq->sges || (max_inline && !sq->inline_buf)) {
        free(sq->ring);
        free(sq->sges);
        free(sq->inline_buf);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < capacity; i++)
        sq->ring[i].sge = &sq->sges[(size_t)i * max_sge];
    sq->capacity = capacity;
    sq->max_sge = max_sge;
    sq->max_inline = max_inline;
    return 0;
}

static void sq_fini(struct rs_soft_sq *sq)
{
    free(sq->ring);
    free(sq->sges);
    free(sq->inline_buf);
    memset(sq, 0, sizeof(*sq));
}

struct rs_soft_send_wqe *rs_soft_sq_head(struct rs_soft_qp *qp)
{
    struct rs_soft_sq *sq = &qp->sq;
    return sq->head < sq->next ? &sq->ring[sq->head % sq->capacity] : NULL;
}

struct rs_soft_send_wqe *rs_soft_sq_next(struct rs_soft_qp *qp)
{
    struct rs_soft_sq *sq = &qp->sq;
    return sq->next < sq->tail ? &sq->ring[sq->next % sq->capacity] : NULL;
}

void rs_soft_sq_started(struct rs_soft_qp *qp)
{
    if (qp->sq.next < qp->sq.tail)
        qp->sq.next++;
}

enum rs_rnic_wc_opcode rs_soft_wc_opcode(enum rs_rnic_wr_opcode op)
{
    switch (op) {
    case RS_WR_SEND:
    case RS_WR_SEND_WITH_INVALIDATE:
    case RS_WR_SEND_WITH_IMM:
        return RS_WC_SEND;
    case RS_WR_RDMA_WRITE:
    case RS_WR_RDMA_WRITE_WITH_IMM:
        return RS_WC_RDMA_WRITE;
    case RS_WR_RDMA_READ:
        return RS_WC_RDMA_READ;
    case RS_WR_WRITE_RECORD:
        return RS_WC_WRITE_RECORD;
    }
    return RS_WC_SEND;
}

void rs_soft_send_wc(struct rs_soft_qp *qp, uint64_t wr_id, enum rs_rnic_wr_opcode opcode, bool signaled,
                     enum rs_rnic_wc_status status, uint32_t byte_len)
{
    if (status == RS_WC_SUCCESS && !signaled)
        return;
    struct rs_rnic_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = rs_soft_wc_opcode(opcode);
    wc.byte_len = byte_len;
    wc.qp = &qp->base;
    rs_soft_cq_push(qp->send_cq, &wc);
}

void rs_soft_sq_complete_head(struct rs_soft_qp *qp, enum rs_rnic_wc_status status)
{
    struct rs_soft_sq *sq = &qp->sq;
    if (sq->head >= sq->next)
        return;
    struct rs_soft_send_wqe *e = &sq->ring[sq->head % sq->capacity];
    rs_soft_send_wc(qp, e->wr_id, e->opcode, (e->flags & RS_SEND_SIGNALED) != 0, status,
                    (uint32_t)(e->length > UINT32_MAX ? UINT32_MAX : e->length));
    sq->head++;
}

void rs_soft_sq_retire_head(struct rs_soft_qp *qp)
{
    if (qp->sq.head < qp->sq.next)
        qp->sq.head++;
}

void rs_soft_sq_flush(struct rs_soft_qp *qp)
{
    pthread_mutex_lock(&qp->sq_lock);
    struct rs_soft_sq *sq = &qp->sq;
    for (uint64_t i = sq->head; i < sq->tail; i++) {
        struct rs_soft_send_wqe *e = &sq->ring[i % sq->capacity];
        rs_soft_send_wc(qp, e->wr_id, e->opcode, true, RS_WC_WR_FLUSH_ERR, 0);
    }
    sq->head = sq->next = sq->tail;
    pthread_mutex_unlock(&qp->sq_lock);
}

/* ---- create / destroy ---- */

static bool opcode_allowed(enum rs_rnic_qp_type type, enum rs_rnic_wr_opcode op)
{
    switch (op) {
    case RS_WR_SEND:
    case RS_WR_RDMA_READ:
        return true;
    case RS_WR_SEND_WITH_INVALIDATE:
    case RS_WR_RDMA_WRITE:
    case RS_WR_RDMA_WRITE_WITH_IMM:
        return type == RS_QPT_RC;
    case RS_WR_WRITE_RECORD:
        return type == RS_QPT_UD;
    case RS_WR_SEND_WITH_IMM:
        return false;           /* caps.has_send_with_imm is false: iWARP has no immediate data on a SEND */
    }
    return false;
}

int rs_soft_create_qp(struct rs_rnic_pd *ppd, const struct rs_rnic_qp_attr *attr, struct rs_rnic_qp **out)
{
    struct rs_soft_pd *pd = rs_soft_pd(ppd);
    struct rs_soft_device *dev = pd->dev;
    if (!attr || !attr->send_cq || !attr->recv_cq)
        return -EINVAL;
    if (attr->type != RS_QPT_RC && attr->type != RS_QPT_UD)
        return -EINVAL;
    if (attr->imm_data)
        return -EINVAL;         /* caps.has_send_with_imm is false */
    if (attr->send_cq->rnic != ppd->rnic || attr->recv_cq->rnic != ppd->rnic)
        return -EINVAL;
    if (attr->max_send_wr == 0 || attr->max_send_wr > RS_SOFT_MAX_QP_WR || attr->max_send_sge > RS_SOFT_MAX_SGE ||
        attr->max_recv_sge > RS_SOFT_MAX_SGE || attr->max_inline > RS_SOFT_MAX_INLINE)
        return -EINVAL;
    if (!attr->srq && (attr->max_recv_wr == 0 || attr->max_recv_wr > RS_SOFT_MAX_QP_WR))
        return -EINVAL;
    struct rs_soft_srq *srq = attr->srq ? rs_soft_srq(attr->srq) : NULL;
    if (srq && srq->pd != pd)
        return -EINVAL;

    struct rs_soft_qp *qp = calloc(1, sizeof(*qp));
    if (!qp)
        return -ENOMEM;
    qp->base.rnic = ppd->rnic;
    qp->base.context = attr->context;
    qp->dev = dev;
    qp->pd = pd;
    qp->type = attr->type;
    qp->attr = *attr;
    if (!qp->attr.ud_read_timeout_ms)
        qp->attr.ud_read_timeout_ms = RS_SOFT_DEFAULT_READ_TIMEOUT_MS;
    if (!qp->attr.record_timeout_ms)
        qp->attr.record_timeout_ms = RS_SOFT_DEFAULT_RECORD_TIMEOUT_MS;
    qp->qos = attr->qos;
    qp->send_cq = rs_soft_cq(attr->send_cq);
    qp->recv_cq = rs_soft_cq(attr->recv_cq);
    qp->srq = srq;
    pthread_mutex_init(&qp->sq_lock, NULL);
    rs_soft_qp_set_state(qp, RS_QPS_INIT);

    int rc = sq_init(&qp->sq, attr->max_send_wr, attr->max_send_sge, attr->max_inline);
    if (rc)
        goto fail_sq;
    if (srq) {
        qp->rq = &srq->rq;
    } else {
        rc = rs_soft_rq_init(&qp->own_rq, pd, attr->max_recv_wr, attr->max_recv_sge, false);
        if (rc)
            goto fail_rq;
        qp->rq = &qp->own_rq;
    }
    pthread_mutex_lock(&dev->lock);
    qp->qpn = dev->next_qpn++;
    if (dev->next_qpn > 0xffffff)
        dev->next_qpn = 1;
    pthread_mutex_unlock(&dev->lock);

    rc = rs_soft_cq_attach(qp->send_cq, qp);
    if (rc)
        goto fail_attach_send;
    if (qp->recv_cq != qp->send_cq) {
        rc = rs_soft_cq_attach(qp->recv_cq, qp);
        if (rc)
            goto fail_attach_recv;
    }
    rc = qp->type == RS_QPT_UD ? rs_soft_ud_qp_create(qp) : rs_soft_rc_ops.qp_create(qp);
    if (rc)
        goto fail_half;
    __atomic_add_fetch(&pd->users, 1, __ATOMIC_ACQ_REL);
    if (srq)
        __atomic_add_fetch(&srq->users, 1, __ATOMIC_ACQ_REL);
    *out = &qp->base;
    return 0;

fail_half:
    if (qp->recv_cq != qp->send_cq)
        rs_soft_cq_detach(qp->recv_cq, qp);
fail_attach_recv:
    rs_soft_cq_detach(qp->send_cq, qp);
fail_attach_send:
    if (!srq)
        rs_soft_rq_fini(&qp->own_rq);
fail_rq:
    sq_fini(&qp->sq);
fail_sq:
    pthread_mutex_destroy(&qp->sq_lock);
    free(qp);
    return rc;
}

int rs_soft_destroy_qp(struct rs_rnic_qp *pqp)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    /* An RC QP leaves its CQs first: a thread polling them receives inline on its socket (consumer progress), and
     * that must be over before the RC half goes. It has no lazy timeouts, and an overflow cannot matter any more. */
    bool detached = qp->type == RS_QPT_RC;
    if (detached) {
        if (qp->recv_cq != qp->send_cq)
            rs_soft_cq_detach(qp->recv_cq, qp);
        rs_soft_cq_detach(qp->send_cq, qp);
    }
    /* The half stops its sockets and watches first, so nothing touches the queues while they are flushed. */
    if (qp->type == RS_QPT_UD)
        rs_soft_ud_qp_destroy(qp);
    else
        rs_soft_rc_ops.qp_destroy(qp);
    rs_soft_qp_set_state(qp, RS_QPS_ERROR);
    rs_soft_sq_flush(qp);
    rs_soft_rq_flush(qp);
    /* After detaching, no overflow handler or lazy timeout run can reach this QP. */
    if (!detached) {
        if (qp->recv_cq != qp->send_cq)
            rs_soft_cq_detach(qp->recv_cq, qp);
        rs_soft_cq_detach(qp->send_cq, qp);
    }
    if (qp->srq)
        __atomic_sub_fetch(&qp->srq->users, 1, __ATOMIC_ACQ_REL);
    else
        rs_soft_rq_fini(&qp->own_rq);
    __atomic_sub_fetch(&qp->pd->users, 1, __ATOMIC_ACQ_REL);
    sq_fini(&qp->sq);
    pthread_mutex_destroy(&qp->sq_lock);
    free(qp);
    return 0;
}

enum rs_rnic_qp_state rs_soft_qp_state(const struct rs_rnic_qp *pqp)
{
    return rs_soft_qp_get_state((const struct rs_soft_qp *)pqp);
}

uint32_t rs_soft_qp_num(const struct rs_rnic_qp *pqp)
{
    return ((const struct rs_soft_qp *)pqp)->qpn;
}

int rs_soft_qp_set_qos(struct rs_rnic_qp *pqp, const struct rs_rnic_qos *qos)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (!qos || qos->sl > 15)
        return -EINVAL;
    pthread_mutex_lock(&qp->sq_lock);
    qp->qos = *qos;
    pthread_mutex_unlock(&qp->sq_lock);
    if (qp->type == RS_QPT_UD)
        return rs_soft_ud_set_qos(qp, qos);
    return rs_soft_rc_ops.set_qos ? rs_soft_rc_ops.set_qos(qp, qos) : 0;
}

void rs_soft_qp_enter_error(struct rs_soft_qp *qp)
{
    int old = __atomic_exchange_n(&qp->state, (int)RS_QPS_ERROR, __ATOMIC_ACQ_REL);
    if (old == RS_QPS_ERROR)
        return;
    if (qp->type == RS_QPT_UD)
        rs_soft_ud_set_error(qp);
    else if (rs_soft_rc_ops.set_error)
        rs_soft_rc_ops.set_error(qp);
    rs_soft_sq_flush(qp);
    rs_soft_rq_flush(qp);
}

int rs_soft_qp_set_error(struct rs_rnic_qp *pqp)
{
    rs_soft_qp_enter_error(rs_soft_qp(pqp));
    return 0;
}

void rs_soft_qp_expire(struct rs_soft_qp *qp, uint64_t now_ns)
{
    /* Cleared first: the half re-notes whatever is still pending while it holds its own lock. */
    __atomic_store_n(&qp->next_deadline_ns, 0, __ATOMIC_RELEASE);
    if (qp->type == RS_QPT_UD)
        rs_soft_ud_expire(qp, now_ns);
    else if (rs_soft_rc_ops.expire)
        rs_soft_rc_ops.expire(qp, now_ns);
}

/* ---- posting ---- */

/* Checks one request's shape; 0 or -errno. */
static int validate_send(const struct rs_soft_qp *qp, const struct rs_rnic_send_wr *wr)
{
    if (!opcode_allowed(qp->type, wr->opcode))
        return -EINVAL;
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->sq.max_sge || (wr->num_sge > 0 && !wr->sg_list))
        return -EINVAL;
    if (qp->type == RS_QPT_UD && (!wr->ud_peer || wr->ud_peer->rnic != qp->base.rnic))
        return -EINVAL;
    if (wr->flags & RS_SEND_INLINE) {
        uint64_t len = 0;
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        if (len > qp->sq.max_inline || wr->opcode == RS_WR_RDMA_READ)
            return -EINVAL;
    }
    return 0;
}

int rs_soft_post_send(struct rs_rnic_qp *pqp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    enum rs_rnic_qp_state state = rs_soft_qp_get_state(qp);
    if (state == RS_QPS_ERROR) {
        /* Accepted and flushed at once, as rnic.h promises for a QP in ERROR. */
        for (; wr; wr = wr->next)
            rs_soft_send_wc(qp, wr->wr_id, wr->opcode, true, RS_WC_WR_FLUSH_ERR, 0);
        return 0;
    }
    if (qp->type == RS_QPT_UD && state != RS_QPS_RTS) {
        if (bad_wr)
            *bad_wr = wr;
        return -EINVAL;         /* not bound yet */
    }
    int rc = 0;
    bool queued = false;
    pthread_mutex_lock(&qp->sq_lock);
    struct rs_soft_sq *sq = &qp->sq;
    for (; wr; wr = wr->next) {
        rc = validate_send(qp, wr);
        if (rc)
            break;
        if (sq->tail - sq->head >= sq->capacity) {
            rc = -ENOMEM;
            break;
        }
        uint64_t slot = sq->tail % sq->capacity;
        struct rs_soft_send_wqe *e = &sq->ring[slot];
        struct rs_rnic_sge *sge = e->sge;
        memset(e, 0, sizeof(*e));
        e->sge = sge;
        e->wr_id = wr->wr_id;
        e->opcode = wr->opcode;
        e->flags = wr->flags | (qp->attr.sq_sig_all ? RS_SEND_SIGNALED : 0);
        e->num_sge = (uint32_t)wr->num_sge;
        for (int i = 0; i < wr->num_sge; i++) {
            e->sge[i] = wr->sg_list[i];
            e->length += wr->sg_list[i].length;
        }
        if (wr->flags & RS_SEND_INLINE) {
            uint8_t *dst = sq->inline_buf + slot * sq->max_inline;
            size_t off = 0;
            for (int i = 0; i < wr->num_sge; i++) {
                memcpy(dst + off, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
                off += wr->sg_list[i].length;
            }
            e->inline_data = dst;
        }
        e->imm_data = wr->imm_data;
        e->invalidate_rkey = wr->invalidate_rkey;
        e->remote_addr = wr->rdma.remote_addr;
        e->rkey = wr->rdma.rkey;
        if (qp->type == RS_QPT_UD)
            rs_soft_ud_fill_peer(e, wr->ud_peer);
        sq->tail++;
        queued = true;
    }
    pthread_mutex_unlock(&qp->sq_lock);
    if (rc && bad_wr)
        *bad_wr = wr;
    if (queued) {
        int kick = qp->type == RS_QPT_UD ? rs_soft_ud_post_send(qp) : rs_soft_rc_ops.post_send(qp);
        if (kick && !rc)
            RS_DEBUG("soft rnic: qp %u transmit start failed: %d", qp->qpn, kick);
    }
    return rc;
}

int rs_soft_post_recv(struct rs_rnic_qp *pqp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (qp->srq) {
        if (bad_wr)
            *bad_wr = wr;
        return -EINVAL;
    }
    int rc = rs_soft_rq_post(&qp->own_rq, wr, bad_wr);
    if (rs_soft_qp_get_state(qp) == RS_QPS_ERROR)
        rs_soft_rq_flush(qp);
    else if (qp->type == RS_QPT_RC && rs_soft_rc_ops.post_recv)
        rs_soft_rc_ops.post_recv(qp);
    return rc;
}

/* ---- RC connection calls: the RC half's ---- */

int rs_soft_connect(struct rs_rnic_qp *pqp, struct rs_rnic_cm *cm, const struct sockaddr *dst, socklen_t len,
                    const void *private_data, uint32_t private_data_len, uint32_t timeout_ms)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (qp->type != RS_QPT_RC)
        return -EINVAL;
    return rs_soft_rc_ops.connect(qp, rs_soft_cm(cm), dst, len, private_data, private_data_len, timeout_ms);
}

int rs_soft_disconnect(struct rs_rnic_qp *pqp)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (qp->type != RS_QPT_RC)
        return -EINVAL;
    return rs_soft_rc_ops.disconnect(qp);
}

bool rs_soft_qp_reads_placed_directly(const struct rs_rnic_qp *pqp)
{
    const struct rs_soft_qp *qp = rs_soft_qp((struct rs_rnic_qp *)pqp);
    return qp->type == RS_QPT_RC && rs_soft_rc_ops.reads_placed_directly(qp);
}

int rs_soft_qp_local_addr(const struct rs_rnic_qp *pqp, struct sockaddr_storage *out)
{
    const struct rs_soft_qp *qp = rs_soft_qp((struct rs_rnic_qp *)pqp);
    if (qp->type != RS_QPT_RC)
        return -EINVAL;
    return rs_soft_rc_ops.local_addr(qp, out);
}
