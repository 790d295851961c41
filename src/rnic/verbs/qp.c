/*
 * qp.c: QPs and SRQs, and the RC data path.
 *
 * RC work requests go to the device as they are (rs_rnic_sge has ibv_sge's layout); only the wr_id is replaced
 * by the address of a shadow slot that remembers the application's wr_id and opcode, so completions need no
 * lookup and the provider knows what is outstanding when a QP goes away. UD QPs are the datagram emulation in
 * ud.c; their receive queues are software queues, defined here because UD-mode SRQs share them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"
#include "rnic/verbs/verbs.h"

#define POST_BATCH 16
/* Device send queue entries beyond the application's: mailbox writes, a flush marker at destroy, one spare. */
#define SQ_RESERVE 4
#define MBOX_SIZE 64
#define MBOX_MAGIC 0x52535631u              /* "RSV1" */
#define MBOX_ORDERLY 0x4f5244455242594eull  /* what an orderly close writes into the peer's mailbox */

_Static_assert(sizeof(struct rs_rnic_sge) == sizeof(struct ibv_sge) &&
               offsetof(struct rs_rnic_sge, addr) == offsetof(struct ibv_sge, addr) &&
               offsetof(struct rs_rnic_sge, length) == offsetof(struct ibv_sge, length) &&
               offsetof(struct rs_rnic_sge, lkey) == offsetof(struct ibv_sge, lkey),
               "rs_rnic_sge must be laid out like ibv_sge");

/* ---- software receive queues ------------------------------------------------------------------------------ */

int rs_v_rq_init(struct rs_v_rq *rq, uint32_t size, uint32_t max_sge)
{
    memset(rq, 0, sizeof(*rq));
    rq->entries = calloc(size, sizeof(*rq->entries));
    rq->sges = calloc((size_t)size * (max_sge ? max_sge : 1), sizeof(*rq->sges));
    if (!rq->entries || !rq->sges) {
        free(rq->entries);
        free(rq->sges);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < size; i++)
        rq->entries[i].sge = rq->sges + (size_t)i * (max_sge ? max_sge : 1);
    rq->size = size;
    rq->max_sge = max_sge;
    pthread_mutex_init(&rq->lock, NULL);
    return 0;
}

void rs_v_rq_fini(struct rs_v_rq *rq)
{
    if (!rq->entries)
        return;
    pthread_mutex_destroy(&rq->lock);
    free(rq->entries);
    free(rq->sges);
    rq->entries = NULL;
}

int rs_v_rq_post(struct rs_v_rq *rq, struct rs_v_dev *dev, struct rs_rnic_recv_wr *wr,
                 struct rs_rnic_recv_wr **bad_wr)
{
    (void)dev;
    int r = 0;
    pthread_mutex_lock(&rq->lock);
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > rq->max_sge || (wr->num_sge && !wr->sg_list)) {
            r = -EINVAL;
            break;
        }
        if (rq->tail - rq->head >= rq->size) {
            r = -ENOMEM;
            break;
        }
        struct rs_v_recv *e = &rq->entries[rq->tail % rq->size];
        struct rs_rnic_sge *sge = e->sge;
        memset(e, 0, sizeof(*e));
        e->sge = sge;
        e->wr_id = wr->wr_id;
        e->num_sge = wr->num_sge;
        for (int i = 0; i < wr->num_sge; i++) {
            e->sge[i] = wr->sg_list[i];
            e->total += wr->sg_list[i].length;
        }
        rq->tail++;
    }
    pthread_mutex_unlock(&rq->lock);
    if (r && bad_wr)
        *bad_wr = wr;
    return r;
}

struct rs_v_recv *rs_v_rq_take(struct rs_v_rq *rq, struct rs_v_qp *qp)
{
    if (rq->taken == rq->tail)
        return NULL;
    struct rs_v_recv *e = &rq->entries[rq->taken % rq->size];
    rq->taken++;
    e->qp = qp;
    e->done = false;
    return e;
}

static void release(struct rs_v_rq *rq)
{
    while (rq->head < rq->taken) {
        struct rs_v_recv *e = &rq->entries[rq->head % rq->size];
        if (!e->done)
            break;
        struct rs_rnic_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = e->wr_id;
        wc.status = e->status;
        wc.opcode = RS_WC_RECV;
        wc.flags = e->flags;
        wc.byte_len = e->byte_len;
        wc.qp = &e->qp->base;
        wc.src = e->src;
        wc.src_qpn = e->src_qpn;
        rq->head++;
        rs_v_cq_push(e->qp->recv_cq, &wc);
    }
}

void rs_v_rq_finish(struct rs_v_rq *rq, struct rs_v_recv *r)
{
    r->done = true;
    release(rq);
}

void rs_v_rq_flush(struct rs_v_rq *rq, struct rs_v_qp *qp, bool all)
{
    for (uint64_t i = rq->head; i < rq->taken; i++) {
        struct rs_v_recv *e = &rq->entries[i % rq->size];
        if (e->qp == qp && !e->done) {
            e->done = true;
            e->status = RS_WC_WR_FLUSH_ERR;
            e->byte_len = 0;
        }
    }
    if (all) {
        while (rs_v_rq_take(rq, qp)) {
            struct rs_v_recv *e = &rq->entries[(rq->taken - 1) % rq->size];
            e->done = true;
            e->status = RS_WC_WR_FLUSH_ERR;
            e->byte_len = 0;
        }
    }
    release(rq);
}

struct rs_v_rq *rs_v_qp_rq(struct rs_v_qp *qp)
{
    return qp->srq ? &qp->srq->rq : &qp->own_rq;
}

/* ---- shared receive queues -------------------------------------------------------------------------------- */

int rs_v_srq_wrap(struct rs_rnic_pd *base, struct ibv_srq *device_srq, uint32_t max_wr, uint32_t max_sge,
                  struct rs_rnic_srq **out)
{
    struct rs_v_pd *pd = rs_v_pd(base);
    struct rs_v_srq *srq = calloc(1, sizeof(*srq));
    if (!srq)
        return -ENOMEM;
    srq->slots = calloc(max_wr, sizeof(*srq->slots));
    srq->free_slots = calloc(max_wr, sizeof(*srq->free_slots));
    if (!srq->slots || !srq->free_slots || rs_v_rq_init(&srq->rq, max_wr, max_sge)) {
        free(srq->slots);
        free(srq->free_slots);
        free(srq);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < max_wr; i++) {
        srq->slots[i].srq = srq;
        srq->slots[i].index = i;
        srq->slots[i].opcode = RS_WC_RECV;
        srq->free_slots[i] = max_wr - 1 - i;
    }
    srq->srq = device_srq;
    srq->srq->srq_context = srq;
    srq->nfree = max_wr;
    srq->max_wr = max_wr;
    srq->max_sge = max_sge;
    srq->pd = pd;
    pthread_mutex_init(&srq->lock, NULL);
    atomic_init(&srq->users, 0);
    srq->base.rnic = base->rnic;
    atomic_fetch_add(&pd->users, 1);
    *out = &srq->base;
    return 0;
}

int rs_v_create_srq(struct rs_rnic_pd *base, uint32_t max_wr, uint32_t max_sge, struct rs_rnic_srq **out)
{
    struct rs_v_pd *pd = rs_v_pd(base);
    struct rs_v_dev *dev = rs_v_dev(base->rnic);
    const struct rs_rnic_caps *caps = &dev->base.caps;
    if (!caps->has_srq)
        return -EOPNOTSUPP;
    if (max_wr == 0 || max_wr > caps->max_qp_wr || max_sge == 0 || max_sge > caps->max_sge)
        return -EINVAL;
    struct ibv_srq_init_attr init = { .attr = { .max_wr = max_wr, .max_sge = max_sge } };
    struct ibv_srq *device_srq = ibv_create_srq(pd->pd, &init);
    if (!device_srq)
        return errno ? -errno : -ENOMEM;
    int r = rs_v_srq_wrap(base, device_srq, max_wr, max_sge, out);
    if (r)
        ibv_destroy_srq(device_srq);
    return r;
}

int rs_v_destroy_srq(struct rs_rnic_srq *base)
{
    struct rs_v_srq *srq = rs_v_srq(base);
    if (atomic_load(&srq->users) > 0)
        return -EBUSY;
    if (ibv_destroy_srq(srq->srq))
        return -EBUSY;
    if (srq->xrcd_users)
        atomic_fetch_sub(srq->xrcd_users, 1);
    atomic_fetch_sub(&srq->pd->users, 1);
    rs_v_rq_fini(&srq->rq);
    pthread_mutex_destroy(&srq->lock);
    free(srq->slots);
    free(srq->free_slots);
    free(srq);
    return 0;
}

void rs_v_srq_slot_free(struct rs_v_srq *srq, struct rs_v_slot *slot)
{
    pthread_mutex_lock(&srq->lock);
    srq->free_slots[srq->nfree++] = slot->index;
    pthread_mutex_unlock(&srq->lock);
}

/* Posts receives to the device SRQ (lock held). */
static int srq_post_device(struct rs_v_srq *srq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > srq->max_sge) {
            *bad_wr = wr;
            return -EINVAL;
        }
        if (srq->nfree == 0) {
            *bad_wr = wr;
            return -ENOMEM;
        }
        struct rs_v_slot *slot = &srq->slots[srq->free_slots[srq->nfree - 1]];
        slot->wr_id = wr->wr_id;
        struct ibv_recv_wr iw = {
            .wr_id = (uint64_t)(uintptr_t)slot, .sg_list = (struct ibv_sge *)wr->sg_list, .num_sge = wr->num_sge,
        };
        struct ibv_recv_wr *ibad;
        int r = ibv_post_srq_recv(srq->srq, &iw, &ibad);
        if (r) {
            *bad_wr = wr;
            return -r;
        }
        srq->nfree--;
    }
    return 0;
}

int rs_v_post_srq_recv(struct rs_rnic_srq *base, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    struct rs_v_srq *srq = rs_v_srq(base);
    struct rs_rnic_recv_wr *dummy;
    if (!bad_wr)
        bad_wr = &dummy;
    pthread_mutex_lock(&srq->lock);
    int r;
    if (srq->mode == 1)
        r = srq_post_device(srq, wr, bad_wr);
    else
        r = rs_v_rq_post(&srq->rq, rs_v_dev(base->rnic), wr, bad_wr);
    pthread_mutex_unlock(&srq->lock);
    return r;
}

/* The first QP to use the SRQ decides where its receives live; RC moves what was posted so far to the device. */
static int srq_claim(struct rs_v_srq *srq, enum rs_rnic_qp_type type)
{
    int want = type == RS_QPT_UD ? 2 : 1;
    pthread_mutex_lock(&srq->lock);
    int r = 0;
    if (srq->mode == 0) {
        srq->mode = want;
        if (want == 1) {
            struct rs_v_rq *rq = &srq->rq;
            pthread_mutex_lock(&rq->lock);
            while (r == 0 && rq->taken < rq->tail) {
                struct rs_v_recv *e = &rq->entries[rq->taken % rq->size];
                struct rs_rnic_recv_wr wr = { .wr_id = e->wr_id, .sg_list = e->sge, .num_sge = e->num_sge };
                struct rs_rnic_recv_wr *bad;
                r = srq_post_device(srq, &wr, &bad);
                rq->taken++;
            }
            rq->head = rq->taken = rq->tail = 0;
            pthread_mutex_unlock(&rq->lock);
        }
    } else if (srq->mode != want) {
        r = -EINVAL;    /* an SRQ serves RC QPs or UD QPs, not both */
    }
    pthread_mutex_unlock(&srq->lock);
    return r;
}

/* ---- queue pairs ------------------------------------------------------------------------------------------ */

static int validate_attr(struct rs_v_dev *dev, const struct rs_rnic_qp_attr *attr)
{
    const struct rs_rnic_caps *caps = &dev->base.caps;
    if (rs_v_is_xrc(attr->type)) {
        if (!caps->has_xrc)
            return -EOPNOTSUPP;
        if (attr->type == RS_QPT_XRC_TGT)
            return attr->xrcd ? 0 : -EINVAL;
        if (!attr->send_cq || attr->send_cq->rnic != &dev->base || attr->max_send_wr == 0 ||
            attr->max_send_wr > caps->max_qp_wr || attr->max_send_sge > caps->max_sge ||
            attr->max_inline > caps->max_inline)
            return -EINVAL;
        return 0;
    }
    if (attr->type != RS_QPT_RC && attr->type != RS_QPT_UD)
        return -EINVAL;
    if (attr->imm_data && (attr->type != RS_QPT_RC || !caps->has_send_with_imm))
        return -EINVAL;
    if (!attr->send_cq || !attr->recv_cq)
        return -EINVAL;
    if (attr->send_cq->rnic != &dev->base || attr->recv_cq->rnic != &dev->base)
        return -EINVAL;
    if (attr->max_send_wr == 0 || attr->max_send_wr > caps->max_qp_wr)
        return -EINVAL;
    if (!attr->srq && (attr->max_recv_wr == 0 || attr->max_recv_wr > caps->max_qp_wr))
        return -EINVAL;
    if (attr->max_send_sge > caps->max_sge || attr->max_recv_sge > caps->max_sge)
        return -EINVAL;
    if (attr->max_inline > caps->max_inline)
        return -EINVAL;
    if (attr->srq && attr->srq->rnic != &dev->base)
        return -EINVAL;
    return 0;
}

static int wq_init(struct rs_v_wq *wq, struct rs_v_qp *qp, uint32_t size, uint8_t opcode)
{
    uint32_t slots = 1;
    while (slots < size)
        slots <<= 1;
    wq->slots = calloc(slots, sizeof(*wq->slots));
    if (!wq->slots)
        return -ENOMEM;
    for (uint32_t i = 0; i < slots; i++) {
        wq->slots[i].qp = qp;
        wq->slots[i].index = i;
        wq->slots[i].opcode = opcode;
    }
    wq->size = size;
    wq->mask = slots - 1;
    atomic_init(&wq->head, 0);
    atomic_init(&wq->tail, 0);
    return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Our mailbox's descriptor: magic, rkey, address (big-endian), as the REP trailer and the peer's [16] carry it. */
static void mbox_descriptor(const struct rs_v_qp *qp, uint8_t *out)
{
    uint64_t addr = (uint64_t)(uintptr_t)qp->mbox;
    put_be32(out, MBOX_MAGIC);
    put_be32(out + 4, qp->mbox_mr->rkey);
    put_be32(out + 8, (uint32_t)(addr >> 32));
    put_be32(out + 12, (uint32_t)addr);
}

static bool parse_descriptor(const uint8_t *in, uint32_t *rkey, uint64_t *addr)
{
    if (get_be32(in) != MBOX_MAGIC)
        return false;
    *rkey = get_be32(in + 4);
    *addr = (uint64_t)get_be32(in + 8) << 32 | get_be32(in + 12);
    return true;
}

static int mbox_create(struct rs_v_qp *qp)
{
    void *mem = NULL;
    if (posix_memalign(&mem, MBOX_SIZE, MBOX_SIZE))
        return -ENOMEM;
    memset(mem, 0, MBOX_SIZE);
    qp->mbox = mem;
    qp->mbox_mr = ibv_reg_mr(qp->pd->pd, mem, MBOX_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!qp->mbox_mr) {
        free(mem);
        qp->mbox = NULL;
        return errno ? -errno : -ENOMEM;
    }
    mbox_descriptor(qp, qp->mbox + 32);
    uint64_t orderly = MBOX_ORDERLY;
    memcpy(qp->mbox + 48, &orderly, sizeof(orderly));
    return 0;
}

void rs_v_mbox_trailer(struct rs_v_qp *qp, uint8_t *rep)
{
    mbox_descriptor(qp, rep);
}

void rs_v_mbox_from_rep(struct rs_v_qp *qp, const uint8_t *rep, uint32_t len)
{
    if (qp->mbox && rep && len >= RS_V_REP_PRIVATE)
        qp->peer_mbox_known = parse_descriptor(rep + RS_V_ACCEPT_PRIVATE, &qp->peer_mbox_rkey, &qp->peer_mbox_addr);
}

/* A passive QP learns the peer's mailbox when the peer writes it into ours. */
static void mbox_learn(struct rs_v_qp *qp)
{
    if (qp->peer_mbox_known || !qp->mbox)
        return;
    uint8_t copy[16];
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(copy, (const void *)(qp->mbox + 16), sizeof(copy));
    qp->peer_mbox_known = parse_descriptor(copy, &qp->peer_mbox_rkey, &qp->peer_mbox_addr);
}

static int post_internal_write(struct rs_v_qp *qp, uint32_t local_off, uint32_t len, uint64_t remote_addr,
                               uint32_t rkey)
{
    uint32_t head = atomic_load_explicit(&qp->sq.head, memory_order_relaxed);
    uint32_t tail = atomic_load_explicit(&qp->sq.tail, memory_order_acquire);
    if (head - tail >= qp->sq.size)
        return -ENOMEM;
    struct rs_v_slot *slot = &qp->sq.slots[head & qp->sq.mask];
    slot->wr_id = 0;
    slot->opcode = RS_WC_RDMA_WRITE;
    slot->internal = 1;
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)(qp->mbox + local_off), .length = len, .lkey = qp->mbox_mr->lkey,
    };
    struct ibv_send_wr wr = {
        .wr_id = (uint64_t)(uintptr_t)slot, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
        .send_flags = IBV_SEND_SIGNALED,
    };
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad;
    int r = ibv_post_send(qp->qp, &wr, &bad);
    if (r)
        return -r;
    atomic_store_explicit(&qp->sq.head, head + 1, memory_order_release);
    return 0;
}

int rs_v_mbox_introduce(struct rs_v_qp *qp)
{
    if (!qp->mbox || !qp->peer_mbox_known)
        return 0;
    return post_internal_write(qp, 32, 16, qp->peer_mbox_addr + 16, qp->peer_mbox_rkey);
}

int rs_v_mbox_say_orderly(struct rs_v_qp *qp)
{
    mbox_learn(qp);
    if (!qp->mbox || !qp->peer_mbox_known)
        return 0;
    return post_internal_write(qp, 48, 8, qp->peer_mbox_addr, qp->peer_mbox_rkey);
}

int rs_v_mbox_peer_closed_orderly(struct rs_v_qp *qp)
{
    if (!qp->mbox)
        return -1;
    uint64_t flag;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(&flag, (const void *)qp->mbox, sizeof(flag));
    if (flag == MBOX_ORDERLY)
        return 1;
    mbox_learn(qp);
    return qp->peer_mbox_known ? 0 : -1;
}

static int rc_create(struct rs_v_qp *qp)
{
    uint32_t send_size = qp->max_send_wr + SQ_RESERVE;
    int r = wq_init(&qp->sq, qp, send_size, RS_WC_SEND);
    if (r == 0 && !qp->srq)
        r = wq_init(&qp->rq, qp, qp->max_recv_wr, RS_WC_RECV);
    if (r)
        return r;
    struct ibv_qp_init_attr init = {
        .qp_context = qp,
        .send_cq = qp->send_cq->cq,
        .recv_cq = qp->recv_cq->cq,
        .srq = qp->srq ? qp->srq->srq : NULL,
        .cap = {
            .max_send_wr = send_size,
            .max_recv_wr = qp->srq ? 0 : qp->max_recv_wr,
            .max_send_sge = qp->max_send_sge ? qp->max_send_sge : 1,
            .max_recv_sge = qp->srq ? 0 : (qp->max_recv_sge ? qp->max_recv_sge : 1),
            .max_inline_data = qp->max_inline,
        },
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = qp->sq_sig_all,
    };
    qp->qp = ibv_create_qp(qp->pd->pd, &init);
    if (!qp->qp)
        return errno ? -errno : -ENOMEM;
    /* INIT at once: receives may be posted before the connection exists (rdma_cm refines the attributes). */
    r = rs_v_rc_reset_to_init(qp);
    return r ? r : mbox_create(qp);
}

int rs_v_rc_reset_to_init(struct rs_v_qp *qp)
{
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = qp->dev->port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
    };
    rs_v_rc_modify_state(qp, IBV_QPS_RESET);
    int r = ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    return r > 0 ? -r : r;
}

int rs_v_create_qp(struct rs_rnic_pd *base, const struct rs_rnic_qp_attr *attr, struct rs_rnic_qp **out)
{
    struct rs_v_pd *pd = rs_v_pd(base);
    struct rs_v_dev *dev = rs_v_dev(base->rnic);
    int r = validate_attr(dev, attr);
    if (r)
        return r;
    struct rs_v_qp *qp = calloc(1, sizeof(*qp));
    if (!qp)
        return -ENOMEM;
    qp->base.rnic = base->rnic;
    qp->base.context = attr->context;
    qp->pd = pd;
    qp->dev = dev;
    qp->type = attr->type;
    qp->send_cq = attr->send_cq ? rs_v_cq(attr->send_cq) : NULL;
    qp->recv_cq = attr->recv_cq ? rs_v_cq(attr->recv_cq) : qp->send_cq;
    qp->srq = attr->srq && !rs_v_is_xrc(attr->type) ? rs_v_srq(attr->srq) : NULL;
    qp->max_send_wr = attr->max_send_wr;
    qp->max_recv_wr = attr->srq ? 0 : attr->max_recv_wr;
    qp->max_send_sge = attr->max_send_sge;
    qp->max_recv_sge = attr->max_recv_sge;
    qp->max_inline = attr->max_inline;
    qp->sq_sig_all = attr->sq_sig_all;
    qp->imm_data = attr->imm_data;
    qp->qos = attr->qos;
    qp->read_timeout_ms = attr->ud_read_timeout_ms ? attr->ud_read_timeout_ms : RS_V_DEFAULT_READ_TIMEOUT_MS;
    qp->record_timeout_ms = attr->record_timeout_ms ? attr->record_timeout_ms : RS_V_DEFAULT_RECORD_TIMEOUT_MS;
    pthread_mutex_init(&qp->lock, NULL);
    atomic_init(&qp->state, RS_QPS_INIT);
    if (qp->srq) {
        r = srq_claim(qp->srq, qp->type);
        if (r) {
            free(qp);
            return r;
        }
    }
    if (qp->type == RS_QPT_RC) {
        r = rc_create(qp);
    } else if (qp->type == RS_QPT_XRC_INI) {
        r = wq_init(&qp->sq, qp, qp->max_send_wr + SQ_RESERVE, RS_WC_SEND);
        if (r == 0)
            r = rs_v_xrc_create_qp(qp, NULL);
    } else if (qp->type == RS_QPT_XRC_TGT) {
        qp->send_cq = qp->recv_cq = NULL;
        r = rs_v_xrc_create_qp(qp, attr->xrcd);
    } else {
        r = qp->srq ? 0 : rs_v_rq_init(&qp->own_rq, qp->max_recv_wr, qp->max_recv_sge);
        if (r == 0)
            r = rs_v_ud_create(qp);
    }
    if (r) {
        if (qp->qp)
            ibv_destroy_qp(qp->qp);
        if (qp->mbox_mr)
            ibv_dereg_mr(qp->mbox_mr);
        free(qp->mbox);
        rs_v_rq_fini(&qp->own_rq);
        free(qp->sq.slots);
        free(qp->rq.slots);
        pthread_mutex_destroy(&qp->lock);
        free(qp);
        return r;
    }
    if (rs_v_connected(qp))
        rs_v_register_qpn(dev, qp);
    pthread_mutex_lock(&dev->lock);
    if (qp->send_cq)
        rs_v_cq_attach(qp->send_cq, qp);
    if (qp->recv_cq && qp->recv_cq != qp->send_cq)
        rs_v_cq_attach(qp->recv_cq, qp);
    pthread_mutex_unlock(&dev->lock);
    atomic_fetch_add(&pd->users, 1);
    if (qp->srq)
        atomic_fetch_add(&qp->srq->users, 1);
    *out = &qp->base;
    return 0;
}

int rs_v_rc_modify_state(struct rs_v_qp *qp, enum ibv_qp_state state)
{
    struct ibv_qp_attr attr = { .qp_state = state };
    int r = ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE);
    return r > 0 ? -r : r;
}

/* Posts a zero-length signaled request the application never sees. On a QP in ERROR it comes back flushed,
 * which retires every unsignaled request before it. */
static int post_internal_marker(struct rs_v_qp *qp)
{
    uint32_t head = atomic_load_explicit(&qp->sq.head, memory_order_relaxed);
    uint32_t tail = atomic_load_explicit(&qp->sq.tail, memory_order_acquire);
    if (head - tail >= qp->sq.size)
        return -ENOMEM;
    struct rs_v_slot *slot = &qp->sq.slots[head & qp->sq.mask];
    slot->wr_id = 0;
    slot->opcode = RS_WC_RDMA_WRITE;
    slot->internal = 1;
    struct ibv_send_wr wr = {
        .wr_id = (uint64_t)(uintptr_t)slot, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
    };
    struct ibv_send_wr *bad;
    int r = ibv_post_send(qp->qp, &wr, &bad);
    if (r)
        return -r;
    atomic_store_explicit(&qp->sq.head, head + 1, memory_order_release);
    return 0;
}

static bool wq_idle(const struct rs_v_wq *wq)
{
    return !wq->slots || atomic_load(&wq->head) == atomic_load(&wq->tail);
}

/* Moves what the device still holds for the QP into the software rings, so no completion outlives it. */
static void rc_collect(struct rs_v_qp *qp)
{
    if (!wq_idle(&qp->sq) && rs_v_rc_device_error(qp))
        post_internal_marker(qp);
    uint64_t deadline = rs_v_now_ms() + 1000;
    if (!qp->send_cq)
        return;     /* an XRC TGT QP: its receives live in the domain's SRQs */
    for (;;) {
        rs_v_cq_pump(qp->send_cq);
        if (qp->recv_cq != qp->send_cq)
            rs_v_cq_pump(qp->recv_cq);
        if (wq_idle(&qp->sq) && wq_idle(&qp->rq))
            break;
        if (atomic_load(&qp->send_cq->overflow) || atomic_load(&qp->recv_cq->overflow) ||
            rs_v_now_ms() > deadline)
            break;
        usleep(500);
    }
}

int rs_v_destroy_qp(struct rs_rnic_qp *base)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    struct rs_v_dev *dev = qp->dev;
    if (rs_v_connected(qp)) {
        pthread_mutex_lock(&qp->lock);
        struct rdma_cm_id *id = qp->id;
        struct rs_v_cm *cm = qp->cm;
        qp->id = NULL;
        qp->cm = NULL;
        atomic_store(&qp->state, RS_QPS_ERROR);
        pthread_mutex_unlock(&qp->lock);
        if (cm) {
            rs_v_cm_remove_pending(cm, qp, NULL);
            rs_v_cm_forget_qp(cm, qp);
        }
        /* Destroying a connected id sends the DREQ: the peer learns at once. */
        if (id)
            rdma_destroy_id(id);
        if (cm)
            rs_v_cm_put(cm);
        rs_v_rc_modify_state(qp, IBV_QPS_ERR);
        rc_collect(qp);
        rs_v_unregister_qpn(dev, qp);
    } else {
        rs_v_ud_destroy(qp);
    }
    pthread_mutex_lock(&dev->lock);
    if (qp->send_cq)
        rs_v_cq_detach(qp->send_cq, qp);
    if (qp->recv_cq && qp->recv_cq != qp->send_cq)
        rs_v_cq_detach(qp->recv_cq, qp);
    pthread_mutex_unlock(&dev->lock);
    if (qp->qp && ibv_destroy_qp(qp->qp))
        RS_WARN("verbs: ibv_destroy_qp failed: %d", errno);
    if (qp->xrcd_users)
        atomic_fetch_sub(qp->xrcd_users, 1);
    if (qp->srq)
        atomic_fetch_sub(&qp->srq->users, 1);
    atomic_fetch_sub(&qp->pd->users, 1);
    if (qp->mbox_mr)
        ibv_dereg_mr(qp->mbox_mr);
    free(qp->mbox);
    rs_v_rq_fini(&qp->own_rq);
    free(qp->sq.slots);
    free(qp->rq.slots);
    pthread_mutex_destroy(&qp->lock);
    free(qp);
    return 0;
}

bool rs_v_rc_device_error(struct rs_v_qp *qp)
{
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    if (ibv_query_qp(qp->qp, &attr, IBV_QP_STATE, &init))
        return false;
    return attr.qp_state == IBV_QPS_ERR;
}

enum rs_rnic_qp_state rs_v_qp_state(const struct rs_rnic_qp *base)
{
    struct rs_v_qp *qp = (struct rs_v_qp *)base;
    enum rs_rnic_qp_state state = atomic_load(&qp->state);
    /* rxe reports no async event when a responder error kills the QP: ask the device. */
    if (rs_v_connected(qp) && (state == RS_QPS_RTS || state == RS_QPS_CLOSING) && rs_v_rc_device_error(qp))
        return RS_QPS_ERROR;
    return state;
}

uint32_t rs_v_qp_num(const struct rs_rnic_qp *base)
{
    const struct rs_v_qp *qp = (const struct rs_v_qp *)base;
    return qp->qp ? qp->qp->qp_num : 0;
}

int rs_v_qp_set_qos(struct rs_rnic_qp *base, const struct rs_rnic_qos *qos)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    if (!qos || qos->sl > 15)
        return -EINVAL;
    if (qp->type == RS_QPT_UD) {
        pthread_mutex_lock(&qp->lock);
        qp->qos = *qos;
        pthread_mutex_unlock(&qp->lock);
        rs_v_ud_qos_changed(qp);
        return 0;
    }
    pthread_mutex_lock(&qp->lock);
    int r = 0;
    bool drain = false;
    switch (qp->conn) {
    case RS_V_CONN_NONE:
    case RS_V_CONN_RESOLVING:
        qp->qos = *qos;     /* RTR takes it */
        break;
    case RS_V_CONN_CONNECTING:
        if (qp->passive)
            r = -EBUSY;     /* already in RTS, not yet established: ask again once ESTABLISHED */
        else
            qp->qos = *qos;
        break;
    case RS_V_CONN_ESTABLISHED:
        /* The address vector only changes in SQD: drain (all posted work acknowledged), change, resume
         * (rs_v_rc_drained). Work posted meanwhile waits in the send queue. */
        qp->qos = *qos;
        if (!qp->qos_pending) {
            struct ibv_qp_attr attr = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
            if (ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY))
                r = -EOPNOTSUPP;
            else
                qp->qos_pending = drain = true;
        }
        break;
    default:
        r = -ENOTCONN;
        break;
    }
    struct rs_v_cm *cm = qp->cm;
    pthread_mutex_unlock(&qp->lock);
    if (drain && cm)
        rs_v_cm_add_pending(cm, RS_V_PENDING_DRAIN, qp, NULL, rs_v_now_ms() + RS_V_DRAIN_TIMEOUT_MS);
    return r;
}

/* In SQD, drained: the new QoS into the address vector, then RTS again (qp->lock held). */
void rs_v_rc_apply_qos(struct rs_v_qp *qp)
{
    qp->qos_pending = false;
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    if (ibv_query_qp(qp->qp, &attr, IBV_QP_AV, &init) == 0) {
        attr.ah_attr.sl = qp->qos.sl;
        if (attr.ah_attr.is_global)
            attr.ah_attr.grh.traffic_class = qp->qos.tclass;
        attr.qp_state = IBV_QPS_SQD;
        if (ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_AV))
            RS_WARN("verbs: QP %u: the new QoS did not apply (%d)", qp->qp->qp_num, errno);
    }
    if (rs_v_rc_modify_state(qp, IBV_QPS_RTS))
        RS_WARN("verbs: QP %u: back to RTS failed", qp->qp->qp_num);
    /* rxe does not look at its send queue again on SQD -> RTS: a zero-length WRITE (no STag needed) makes it
     * send what waited. */
    post_internal_marker(qp);
}

void rs_v_qp_fail(struct rs_v_qp *qp, int error)
{
    RS_DEBUG("verbs: QP %u failed (%d), connection state %d", qp->qp ? qp->qp->qp_num : 0, error, (int)qp->conn);
    pthread_mutex_lock(&qp->lock);
    bool report = !qp->error_reported && qp->cm &&
                  (qp->conn == RS_V_CONN_ESTABLISHED || qp->conn == RS_V_CONN_DRAINING);
    bool tell_peer = qp->id && (qp->conn == RS_V_CONN_ESTABLISHED || qp->conn == RS_V_CONN_DRAINING);
    atomic_store(&qp->state, RS_QPS_ERROR);
    rs_v_rc_modify_state(qp, IBV_QPS_ERR);
    if (report) {
        qp->error_reported = true;
        struct rs_rnic_cm_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = RS_RNIC_CM_EV_ERROR;
        ev.qp = &qp->base;
        ev.error = error;
        rs_v_cm_push(qp->cm, &ev);
    }
    if (tell_peer) {
        /* rxe tells the peer nothing when our QP dies; the DREQ does (its QP state says why). */
        qp->conn = RS_V_CONN_DISCONNECTING;
        rdma_disconnect(qp->id);
    }
    pthread_mutex_unlock(&qp->lock);
}

static int status_errno(enum rs_rnic_wc_status status)
{
    switch (status) {
    case RS_WC_REM_ACCESS_ERR:
    case RS_WC_LOC_PROT_ERR: return -EACCES;
    case RS_WC_RETRY_EXC_ERR: return -ETIMEDOUT;
    case RS_WC_LOC_LEN_ERR: return -EMSGSIZE;
    case RS_WC_REM_INV_REQ_ERR:
    case RS_WC_WR_FLUSH_ERR: return -ECONNRESET;
    default: return -EIO;
    }
}

void rs_v_qp_completion_error(struct rs_v_qp *qp, enum rs_rnic_wc_status status)
{
    if (!rs_v_connected(qp))
        return;
    if (status == RS_WC_WR_FLUSH_ERR) {
        pthread_mutex_lock(&qp->lock);
        bool expected = qp->error_reported || qp->conn == RS_V_CONN_DISCONNECTING ||
                        qp->conn == RS_V_CONN_CLOSED || qp->conn == RS_V_CONN_NONE ||
                        qp->conn == RS_V_CONN_CONNECTING || qp->conn == RS_V_CONN_RESOLVING;
        pthread_mutex_unlock(&qp->lock);
        if (expected)
            return;
    }
    rs_v_qp_fail(qp, status_errno(status));
}

int rs_v_qp_set_error(struct rs_rnic_qp *base)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    if (qp->type == RS_QPT_UD) {
        rs_v_ud_set_error(qp);
        return 0;
    }
    pthread_mutex_lock(&qp->lock);
    /* The application asked: no ERROR event for it, but the peer is told. */
    bool tell_peer = qp->id && (qp->conn == RS_V_CONN_ESTABLISHED || qp->conn == RS_V_CONN_DRAINING);
    qp->error_reported = true;
    atomic_store(&qp->state, RS_QPS_ERROR);
    int r = rs_v_rc_modify_state(qp, IBV_QPS_ERR);
    if (tell_peer) {
        qp->conn = RS_V_CONN_DISCONNECTING;
        rdma_disconnect(qp->id);
    }
    pthread_mutex_unlock(&qp->lock);
    return r;
}

/* ---- RC state changes ------------------------------------------------------------------------------------- */

int rs_v_rc_to_init(struct rs_v_qp *qp, struct rdma_cm_id *id)
{
    struct ibv_qp_attr attr;
    int mask = 0;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_INIT;
    if (rdma_init_qp_attr(id, &attr, &mask))
        return rs_v_errno_from_rdma(-1);
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    mask |= IBV_QP_ACCESS_FLAGS;
    /* Normally INIT already (with receives posted, which INIT -> INIT keeps); after a failed attempt that got
     * further, back through RESET. */
    struct ibv_qp_attr now;
    struct ibv_qp_init_attr init;
    if (ibv_query_qp(qp->qp, &now, IBV_QP_STATE, &init) == 0 && now.qp_state != IBV_QPS_INIT &&
        now.qp_state != IBV_QPS_RESET)
        rs_v_rc_modify_state(qp, IBV_QPS_RESET);
    int r = ibv_modify_qp(qp->qp, &attr, mask);
    return r > 0 ? -r : r;
}

int rs_v_rc_to_rtr_rts(struct rs_v_qp *qp, struct rdma_cm_id *id)
{
    struct ibv_qp_attr attr;
    int mask = 0;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTR;
    if (rdma_init_qp_attr(id, &attr, &mask))
        return rs_v_errno_from_rdma(-1);
    /* Our QoS on top of the path rdma_cm found (docs/verbs.md: QoS). */
    if (qp->qos.sl)
        attr.ah_attr.sl = qp->qos.sl;
    if (attr.ah_attr.is_global && qp->qos.tclass)
        attr.ah_attr.grh.traffic_class = qp->qos.tclass;
    int r = ibv_modify_qp(qp->qp, &attr, mask);
    if (r)
        return r > 0 ? -r : r;
    memset(&attr, 0, sizeof(attr));
    mask = 0;
    attr.qp_state = IBV_QPS_RTS;
    if (rdma_init_qp_attr(id, &attr, &mask))
        return rs_v_errno_from_rdma(-1);
    attr.timeout = RS_V_ACK_TIMEOUT;
    attr.retry_cnt = RS_V_RETRY_COUNT;
    attr.rnr_retry = RS_V_RNR_RETRY;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
    r = ibv_modify_qp(qp->qp, &attr, mask);
    return r > 0 ? -r : r;
}

/* ---- RC data path ----------------------------------------------------------------------------------------- */

static enum rs_rnic_wc_opcode wc_opcode_of(enum rs_rnic_wr_opcode op)
{
    switch (op) {
    case RS_WR_RDMA_WRITE:
    case RS_WR_RDMA_WRITE_WITH_IMM: return RS_WC_RDMA_WRITE;
    case RS_WR_RDMA_READ: return RS_WC_RDMA_READ;
    case RS_WR_WRITE_RECORD: return RS_WC_WRITE_RECORD;
    default: return RS_WC_SEND;
    }
}

/* A QP that is no longer connected completes what is posted with FLUSH at once (rxe would not flush receives
 * posted after the QP went to ERROR until something else wakes its responder). */
static void flush_sends(struct rs_v_qp *qp, struct rs_rnic_send_wr *wr)
{
    rs_v_cq_pump(qp->send_cq);
    for (; wr; wr = wr->next) {
        struct rs_rnic_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = wr->wr_id;
        wc.status = RS_WC_WR_FLUSH_ERR;
        wc.opcode = wc_opcode_of(wr->opcode);
        wc.qp = &qp->base;
        rs_v_cq_push(qp->send_cq, &wc);
    }
}

static void flush_recvs(struct rs_v_qp *qp, struct rs_rnic_recv_wr *wr)
{
    rs_v_cq_pump(qp->recv_cq);
    for (; wr; wr = wr->next) {
        struct rs_rnic_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = wr->wr_id;
        wc.status = RS_WC_WR_FLUSH_ERR;
        wc.opcode = RS_WC_RECV;
        wc.qp = &qp->base;
        rs_v_cq_push(qp->recv_cq, &wc);
    }
}

static bool rc_flushing(struct rs_v_qp *qp)
{
    return atomic_load_explicit(&qp->state, memory_order_acquire) == RS_QPS_ERROR;
}

/* rnic.h's four send flags (bits 0-3) as ibverbs spells them, indexed by value: one load on every post rather
 * than a test per flag. */
#define IBV_FLAGS_OF(f)                                                                                           \
    (((f) & RS_SEND_SIGNALED ? IBV_SEND_SIGNALED : 0) | ((f) & RS_SEND_SOLICITED ? IBV_SEND_SOLICITED : 0) |   \
     ((f) & RS_SEND_INLINE ? IBV_SEND_INLINE : 0) | ((f) & RS_SEND_FENCE ? IBV_SEND_FENCE : 0))
static const uint8_t ibv_flags_of[16] = {
    IBV_FLAGS_OF(0),  IBV_FLAGS_OF(1),  IBV_FLAGS_OF(2),  IBV_FLAGS_OF(3),  IBV_FLAGS_OF(4),  IBV_FLAGS_OF(5),
    IBV_FLAGS_OF(6),  IBV_FLAGS_OF(7),  IBV_FLAGS_OF(8),  IBV_FLAGS_OF(9),  IBV_FLAGS_OF(10), IBV_FLAGS_OF(11),
    IBV_FLAGS_OF(12), IBV_FLAGS_OF(13), IBV_FLAGS_OF(14), IBV_FLAGS_OF(15),
};
#undef IBV_FLAGS_OF
_Static_assert((RS_SEND_SIGNALED | RS_SEND_SOLICITED | RS_SEND_INLINE | RS_SEND_FENCE) == 15u,
               "the send flags index ibv_flags_of");

/* The request's flags as ibverbs spells them; -EINVAL for inline data the QP cannot take (or an inline READ). */
static int send_flags(const struct rs_v_qp *qp, const struct rs_rnic_send_wr *wr, unsigned *out)
{
    if (wr->flags & RS_SEND_INLINE) {
        uint64_t total = 0;
        for (int i = 0; i < wr->num_sge; i++)
            total += wr->sg_list[i].length;
        if (total > qp->max_inline || wr->opcode == RS_WR_RDMA_READ)
            return -EINVAL;
    }
    *out = ibv_flags_of[wr->flags & 15u];
    return 0;
}

static int convert_send(struct rs_v_qp *qp, const struct rs_rnic_send_wr *wr, struct ibv_send_wr *iw)
{
    memset(iw, 0, sizeof(*iw));
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > (qp->max_send_sge ? qp->max_send_sge : 1) ||
        (wr->num_sge && !wr->sg_list))
        return -EINVAL;
    iw->sg_list = (struct ibv_sge *)wr->sg_list;
    iw->num_sge = wr->num_sge;
    switch (wr->opcode) {
    case RS_WR_SEND:
        iw->opcode = IBV_WR_SEND;
        break;
    case RS_WR_SEND_WITH_INVALIDATE:
        /* ibv_reg_mr regions cannot be invalidated by the device: the rkey rides as immediate data and the
         * receiving provider drops it when it sees the completion (docs/verbs.md: STags). */
        if (qp->dev->is_iwarp) {
            iw->opcode = IBV_WR_SEND_WITH_INV;
            iw->invalidate_rkey = wr->invalidate_rkey;
        } else {
            if (qp->imm_data)
                return -EINVAL;     /* the immediate is the caller's on this QP */
            iw->opcode = IBV_WR_SEND_WITH_IMM;
            iw->imm_data = htonl(wr->invalidate_rkey);
        }
        break;
    case RS_WR_SEND_WITH_IMM:
        if (!qp->imm_data)
            return -EINVAL;
        iw->opcode = IBV_WR_SEND_WITH_IMM;
        iw->imm_data = htonl(wr->imm_data);
        break;
    case RS_WR_RDMA_WRITE:
        iw->opcode = IBV_WR_RDMA_WRITE;
        break;
    case RS_WR_RDMA_WRITE_WITH_IMM:
        if (!qp->dev->base.caps.has_write_with_imm)
            return -EINVAL;
        iw->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        iw->imm_data = htonl(wr->imm_data);
        break;
    case RS_WR_RDMA_READ:
        iw->opcode = IBV_WR_RDMA_READ;
        break;
    default:
        return -EINVAL;     /* WRITE_RECORD is UD only */
    }
    iw->wr.rdma.remote_addr = wr->rdma.remote_addr;
    iw->wr.rdma.rkey = wr->rdma.rkey;
    if (qp->type == RS_QPT_XRC_INI)
        iw->qp_type.xrc.remote_srqn = wr->xrc_remote_srq_num;
    return send_flags(qp, wr, &iw->send_flags);
}

/* The provider took the first `posted` requests of a batch (all of them, or those before the one it refused):
 * only their slots may be seen by the CQ poller. */
static void wq_publish(struct rs_v_wq *q, uint32_t head, int posted)
{
    atomic_store_explicit(&q->head, head + (uint32_t)posted, memory_order_release);
}

/* ibv_post_* return a positive errno; a non-positive failure code carries no reason, so call it EINVAL. */
static int post_errno(int pr) { return pr > 0 ? -pr : -EINVAL; }

/*
 * One SEND on an RC QP, what a stream socket posts for every small message: the batching loop and the general
 * conversion left out. Under TCG the code a call runs also slows the kernel's doorbell work that follows it
 * (docs/results/sdp-verbs.md), so the common case gets a path of its own. ibv_flags: the request's, converted;
 * the caller checked the QP's state and type and the sges. Returns 0 or a negative errno.
 */
static RS_ALWAYS_INLINE int rc_post_send_core(struct rs_v_qp *qp, uint64_t wr_id, const struct rs_rnic_sge *sge,
                                              int num_sge, unsigned ibv_flags, bool with_imm, uint32_t imm_data)
{
    uint32_t head = atomic_load_explicit(&qp->sq.head, memory_order_relaxed);
    uint32_t tail = atomic_load_explicit(&qp->sq.tail, memory_order_acquire);
    if (head - tail >= qp->max_send_wr + SQ_RESERVE / 2)
        return -ENOMEM;
    struct rs_v_slot *slot = &qp->sq.slots[head & qp->sq.mask];
    slot->wr_id = wr_id;
    slot->opcode = RS_WC_SEND;
    slot->internal = 0;
    /* Only what a SEND on an RC QP is read for (providers read the union's other members for other opcodes and
     * QP types only): zeroing the whole 128-byte request was a sixth of this function. */
    struct ibv_send_wr iw;
    iw.wr_id = (uint64_t)(uintptr_t)slot;
    iw.next = NULL;
    iw.sg_list = (struct ibv_sge *)sge;
    iw.num_sge = num_sge;
    iw.opcode = IBV_WR_SEND;
    iw.send_flags = ibv_flags;
    iw.imm_data = 0;
    if (with_imm) {
        iw.opcode = IBV_WR_SEND_WITH_IMM;
        iw.imm_data = htonl(imm_data);
    }
    struct ibv_send_wr *ibad = NULL;
    int pr = ibv_post_send(qp->qp, &iw, &ibad);
    wq_publish(&qp->sq, head, pr ? 0 : 1);
    return pr ? post_errno(pr) : 0;
}

static RS_ALWAYS_INLINE int rc_post_one_send(struct rs_v_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr)
{
    uint32_t max_sge = qp->max_send_sge ? qp->max_send_sge : 1;
    int r = 0;
    unsigned flags = 0;
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge || (wr->num_sge && !wr->sg_list))
        r = -EINVAL;
    else if (wr->num_sge == 1 && (wr->flags & RS_SEND_INLINE)) {
        /* A stream's small message: one inline buffer (a SEND: no READ to refuse), send_flags without its loop. */
        r = wr->sg_list[0].length > qp->max_inline ? -EINVAL : 0;
        flags = ibv_flags_of[wr->flags & 15u];
    } else {
        r = send_flags(qp, wr, &flags);
    }
    if (r == 0)
        r = rc_post_send_core(qp, wr->wr_id, wr->sg_list, wr->num_sge, flags, wr->opcode == RS_WR_SEND_WITH_IMM,
                              wr->imm_data);
    if (r)
        *bad_wr = wr;
    return r;
}

static RS_ALWAYS_INLINE int rc_post_send(struct rs_v_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr)
{
    int state = atomic_load_explicit(&qp->state, memory_order_acquire);
    if (state == RS_QPS_ERROR) {        /* rc_flushing */
        flush_sends(qp, wr);
        return 0;
    }
    if (state != RS_QPS_RTS && state != RS_QPS_CLOSING) {
        *bad_wr = wr;
        return -EINVAL;
    }
    if (wr && !wr->next && (wr->opcode == RS_WR_SEND || (wr->opcode == RS_WR_SEND_WITH_IMM && qp->imm_data)) &&
        qp->type == RS_QPT_RC &&
        !(wr->flags & ~(unsigned)(RS_SEND_SIGNALED | RS_SEND_SOLICITED | RS_SEND_INLINE)))
        return rc_post_one_send(qp, wr, bad_wr);
    while (wr) {
        struct ibv_send_wr iw[POST_BATCH];
        struct rs_rnic_send_wr *orig[POST_BATCH];
        uint32_t head = atomic_load_explicit(&qp->sq.head, memory_order_relaxed);
        uint32_t tail = atomic_load_explicit(&qp->sq.tail, memory_order_acquire);
        int n = 0, r = 0;
        for (; wr && n < POST_BATCH; wr = wr->next, n++) {
            /* The application's requests, plus room for the provider's own few. */
            if (head + (uint32_t)n - tail >= qp->max_send_wr + SQ_RESERVE / 2) {
                r = -ENOMEM;
                break;
            }
            r = convert_send(qp, wr, &iw[n]);
            if (r)
                break;
            struct rs_v_slot *slot = &qp->sq.slots[(head + (uint32_t)n) & qp->sq.mask];
            slot->wr_id = wr->wr_id;
            slot->opcode = (uint8_t)wc_opcode_of(wr->opcode);
            slot->internal = 0;
            iw[n].wr_id = (uint64_t)(uintptr_t)slot;
            iw[n].next = NULL;
            if (n)
                iw[n - 1].next = &iw[n];
            orig[n] = wr;
        }
        if (n) {
            struct ibv_send_wr *ibad = NULL;
            int pr = ibv_post_send(qp->qp, iw, &ibad);
            int posted = pr ? (int)(ibad - iw) : n;
            wq_publish(&qp->sq, head, posted);
            if (pr) {
                *bad_wr = orig[posted];
                return post_errno(pr);
            }
        }
        if (r) {
            *bad_wr = wr;
            return r;
        }
    }
    return 0;
}

static int rc_post_recv(struct rs_v_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    if (qp->srq) {
        *bad_wr = wr;
        return -EINVAL;
    }
    if (rc_flushing(qp)) {
        flush_recvs(qp, wr);
        return 0;
    }
    while (wr) {
        struct ibv_recv_wr iw[POST_BATCH];
        struct rs_rnic_recv_wr *orig[POST_BATCH];
        uint32_t head = atomic_load_explicit(&qp->rq.head, memory_order_relaxed);
        uint32_t tail = atomic_load_explicit(&qp->rq.tail, memory_order_acquire);
        int n = 0, r = 0;
        for (; wr && n < POST_BATCH; wr = wr->next, n++) {
            if (head + (uint32_t)n - tail >= qp->rq.size) {
                r = -ENOMEM;
                break;
            }
            if (wr->num_sge < 0 || (uint32_t)wr->num_sge > (qp->max_recv_sge ? qp->max_recv_sge : 1) ||
                (wr->num_sge && !wr->sg_list)) {
                r = -EINVAL;
                break;
            }
            struct rs_v_slot *slot = &qp->rq.slots[(head + (uint32_t)n) & qp->rq.mask];
            slot->wr_id = wr->wr_id;
            iw[n] = (struct ibv_recv_wr){
                .wr_id = (uint64_t)(uintptr_t)slot, .sg_list = (struct ibv_sge *)wr->sg_list,
                .num_sge = wr->num_sge,
            };
            if (n)
                iw[n - 1].next = &iw[n];
            orig[n] = wr;
        }
        if (n) {
            struct ibv_recv_wr *ibad = NULL;
            int pr = ibv_post_recv(qp->qp, iw, &ibad);
            int posted = pr ? (int)(ibad - iw) : n;
            wq_publish(&qp->rq, head, posted);
            if (pr) {
                *bad_wr = orig[posted];
                return post_errno(pr);
            }
        }
        if (r) {
            *bad_wr = wr;
            return r;
        }
    }
    return 0;
}

int rs_v_post_send(struct rs_rnic_qp *base, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    struct rs_rnic_send_wr *dummy;
    if (!bad_wr)
        bad_wr = &dummy;
    *bad_wr = NULL;
    if (qp->type != RS_QPT_RC) {        /* RC first: a stream's every message */
        if (qp->type == RS_QPT_UD)
            return rs_v_ud_post_send(qp, wr, bad_wr);
        if (qp->type == RS_QPT_XRC_TGT) {
            *bad_wr = wr;
            return -EINVAL;     /* a target has no send queue */
        }
    }
    return rc_post_send(qp, wr, bad_wr);
}

int rs_v_post_send_inline(struct rs_rnic_qp *base, uint64_t wr_id, const struct rs_rnic_sge *sge, unsigned flags,
                          bool with_imm, uint32_t imm_data)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    int state = atomic_load_explicit(&qp->state, memory_order_acquire);
    if (RS_LIKELY(qp->type == RS_QPT_RC && (state == RS_QPS_RTS || state == RS_QPS_CLOSING) &&
                  (!with_imm || qp->imm_data) && sge->length <= qp->max_inline &&
                  !(flags & ~(unsigned)(RS_SEND_SIGNALED | RS_SEND_SOLICITED))))
        return rc_post_send_core(qp, wr_id, sge, 1, ibv_flags_of[(flags | RS_SEND_INLINE) & 15u], with_imm,
                                 imm_data);
    /* Anything else (a QP in ERROR flushes, other types, errors): as the request itself. */
    return rs_rnic_post_send_inline_by_wr(base, wr_id, sge, flags, with_imm, imm_data);
}

int rs_v_post_recv(struct rs_rnic_qp *base, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    struct rs_rnic_recv_wr *dummy;
    if (!bad_wr)
        bad_wr = &dummy;
    *bad_wr = NULL;
    if (qp->type == RS_QPT_UD)
        return rs_v_ud_post_recv(qp, wr, bad_wr);
    if (rs_v_is_xrc(qp->type)) {
        *bad_wr = wr;
        return -EINVAL;     /* XRC receives go to the domain's SRQs */
    }
    return rc_post_recv(qp, wr, bad_wr);
}
