/*
 * soft_srq.c: receive queues (per QP) and shared receive queues.
 *
 * A receive queue is a ring of posted receives. The receive paths take them in posting order and finish them in
 * any order, but completions leave in posting order: a receive finished while an earlier one is still being
 * filled (a segmented UD message waiting for its last segment) waits in the ring. This keeps the rnic.h rule
 * "receives complete in the order they were posted" without copying data out of order.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rnic/soft/soft.h"

int rs_soft_rq_init(struct rs_soft_rq *rq, struct rs_soft_pd *pd, uint32_t capacity, uint32_t max_sge, bool shared)
{
    memset(rq, 0, sizeof(*rq));
    if (capacity == 0)
        capacity = 1;
    if (max_sge == 0)
        max_sge = 1;
    rq->ring = calloc(capacity, sizeof(*rq->ring));
    rq->sges = calloc((size_t)capacity * max_sge, sizeof(*rq->sges));
    if (!rq->ring || !rq->sges) {
        free(rq->ring);
        free(rq->sges);
        rq->ring = NULL;
        rq->sges = NULL;
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < capacity; i++)
        rq->ring[i].sge = &rq->sges[(size_t)i * max_sge];
    rq->pd = pd;
    rq->capacity = capacity;
    rq->max_sge = max_sge;
    rq->shared = shared;
    pthread_mutex_init(&rq->lock, NULL);
    return 0;
}

void rs_soft_rq_fini(struct rs_soft_rq *rq)
{
    if (!rq->ring)
        return;
    pthread_mutex_destroy(&rq->lock);
    free(rq->ring);
    free(rq->sges);
    rq->ring = NULL;
    rq->sges = NULL;
}

int rs_soft_rq_post(struct rs_soft_rq *rq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    int rc = 0;
    pthread_mutex_lock(&rq->lock);
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > rq->max_sge || (wr->num_sge > 0 && !wr->sg_list)) {
            rc = -EINVAL;
            break;
        }
        if (rq->tail - rq->head >= rq->capacity) {
            rc = -ENOMEM;
            break;
        }
        struct rs_soft_recv_wqe *e = &rq->ring[rq->tail % rq->capacity];
        e->wr_id = wr->wr_id;
        e->num_sge = (uint32_t)wr->num_sge;
        e->state = RS_SOFT_RECV_POSTED;
        e->qp = NULL;
        e->length = 0;
        for (int i = 0; i < wr->num_sge; i++) {
            e->sge[i] = wr->sg_list[i];
            e->length += wr->sg_list[i].length;
        }
        rq->tail++;
    }
    pthread_mutex_unlock(&rq->lock);
    if (rc && bad_wr)
        *bad_wr = wr;
    return rc;
}

int rs_soft_rq_take(struct rs_soft_qp *qp, struct rs_soft_recv_wqe **out)
{
    struct rs_soft_rq *rq = qp->rq;
    pthread_mutex_lock(&rq->lock);
    if (rq->taken == rq->tail) {
        pthread_mutex_unlock(&rq->lock);
        return -EAGAIN;
    }
    struct rs_soft_recv_wqe *e = &rq->ring[rq->taken % rq->capacity];
    e->state = RS_SOFT_RECV_TAKEN;
    e->qp = qp;
    rq->taken++;
    pthread_mutex_unlock(&rq->lock);
    *out = e;
    return 0;
}

bool rs_soft_rq_try_untake(struct rs_soft_qp *qp, struct rs_soft_recv_wqe *wqe)
{
    struct rs_soft_rq *rq = qp->rq;
    bool done = false;
    pthread_mutex_lock(&rq->lock);
    if (rq->taken > rq->head && wqe == &rq->ring[(rq->taken - 1) % rq->capacity] &&
        wqe->state == RS_SOFT_RECV_TAKEN) {
        wqe->state = RS_SOFT_RECV_POSTED;
        wqe->qp = NULL;
        rq->taken--;
        done = true;
    }
    pthread_mutex_unlock(&rq->lock);
    return done;
}

void rs_soft_rq_untake(struct rs_soft_qp *qp, struct rs_soft_recv_wqe *wqe)
{
    if (rs_soft_rq_try_untake(qp, wqe))
        return;
    struct rs_rnic_wc wc = { .status = RS_WC_GENERAL_ERR, .opcode = RS_WC_RECV };
    rs_soft_rq_finish(qp, wqe, &wc);
}

/* Emits the finished receives at the front of the ring, oldest first. rq->lock held. */
static void emit_ready(struct rs_soft_rq *rq)
{
    while (rq->head < rq->taken) {
        struct rs_soft_recv_wqe *e = &rq->ring[rq->head % rq->capacity];
        if (e->state == RS_SOFT_RECV_TAKEN)
            break;
        if (e->state == RS_SOFT_RECV_DONE && e->qp && e->qp->recv_cq)
            rs_soft_cq_push(e->qp->recv_cq, &e->wc);
        e->state = RS_SOFT_RECV_POSTED;
        e->qp = NULL;
        rq->head++;
    }
}

static void finish_locked(struct rs_soft_rq *rq, struct rs_soft_qp *qp, struct rs_soft_recv_wqe *wqe,
                          const struct rs_rnic_wc *wc)
{
    wqe->wc = *wc;
    wqe->wc.wr_id = wqe->wr_id;
    wqe->wc.qp = &qp->base;
    wqe->state = RS_SOFT_RECV_DONE;
    emit_ready(rq);
}

void rs_soft_rq_finish(struct rs_soft_qp *qp, struct rs_soft_recv_wqe *wqe, const struct rs_rnic_wc *wc)
{
    struct rs_soft_rq *rq = qp->rq;
    pthread_mutex_lock(&rq->lock);
    finish_locked(rq, qp, wqe, wc);
    pthread_mutex_unlock(&rq->lock);
}

void rs_soft_rq_flush(struct rs_soft_qp *qp)
{
    struct rs_soft_rq *rq = qp->rq;
    if (!rq || !rq->ring)
        return;
    struct rs_rnic_wc wc = { .status = RS_WC_WR_FLUSH_ERR, .opcode = RS_WC_RECV };
    pthread_mutex_lock(&rq->lock);
    /* Receives this QP took and has not finished: flushed now, delivered straight away (an SRQ may hold older
     * receives of other QPs in front of them, and this QP may be about to disappear). */
    for (uint64_t i = rq->head; i < rq->taken; i++) {
        struct rs_soft_recv_wqe *e = &rq->ring[i % rq->capacity];
        if (e->qp == qp && e->state != RS_SOFT_RECV_DONE_EMITTED) {
            if (e->state == RS_SOFT_RECV_TAKEN) {
                e->wc = wc;
                e->wc.wr_id = e->wr_id;
                e->wc.qp = &qp->base;
            }
            if (qp->recv_cq)
                rs_soft_cq_push(qp->recv_cq, &e->wc);
            e->state = RS_SOFT_RECV_DONE_EMITTED;
        }
    }
    /* A QP's own queue: every posted receive is flushed too. An SRQ keeps them for its other QPs. */
    if (!rq->shared) {
        while (rq->taken < rq->tail) {
            struct rs_soft_recv_wqe *e = &rq->ring[rq->taken % rq->capacity];
            e->qp = qp;
            e->state = RS_SOFT_RECV_DONE;
            e->wc = wc;
            e->wc.wr_id = e->wr_id;
            e->wc.qp = &qp->base;
            rq->taken++;
        }
    }
    emit_ready(rq);
    pthread_mutex_unlock(&rq->lock);
}

/* ---- SRQ objects ---- */

int rs_soft_create_srq(struct rs_rnic_pd *ppd, uint32_t max_wr, uint32_t max_sge, struct rs_rnic_srq **out)
{
    struct rs_soft_pd *pd = rs_soft_pd(ppd);
    if (max_wr == 0 || max_wr > RS_SOFT_MAX_QP_WR || max_sge > RS_SOFT_MAX_SGE)
        return -EINVAL;
    struct rs_soft_srq *srq = calloc(1, sizeof(*srq));
    if (!srq)
        return -ENOMEM;
    int rc = rs_soft_rq_init(&srq->rq, pd, max_wr, max_sge, true);
    if (rc) {
        free(srq);
        return rc;
    }
    srq->base.rnic = ppd->rnic;
    srq->pd = pd;
    __atomic_add_fetch(&pd->users, 1, __ATOMIC_ACQ_REL);
    *out = &srq->base;
    return 0;
}

int rs_soft_destroy_srq(struct rs_rnic_srq *psrq)
{
    struct rs_soft_srq *srq = rs_soft_srq(psrq);
    if (__atomic_load_n(&srq->users, __ATOMIC_ACQUIRE))
        return -EBUSY;
    rs_soft_rq_fini(&srq->rq);
    __atomic_sub_fetch(&srq->pd->users, 1, __ATOMIC_ACQ_REL);
    free(srq);
    return 0;
}

int rs_soft_post_srq_recv(struct rs_rnic_srq *psrq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    return rs_soft_rq_post(&rs_soft_srq(psrq)->rq, wr, bad_wr);
}
