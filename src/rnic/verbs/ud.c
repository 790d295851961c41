/*
 * ud.c: UD QPs on verbs.
 *
 * An rnic.h UD QP is a verbs UD QP plus a thin datagram protocol of our own (header in ud.h), because rnic.h
 * promises more than a UD QP gives: messages longer than the path MTU, the sender's port in every completion,
 * Write-Record and RDMA READ (record.c), and a QP that keeps working after a bad lkey.
 *
 *   addressing  a UD QP binds an rdma_cm RDMA_PS_UDP id to its IP address and port and listens on it, so a peer
 *               resolves (IP, port) into (QP number, Q_Key, address handle) with SIDR, the way rdma_cm's UDP
 *               port space is meant to be used; the progress thread answers SIDR requests.
 *   sending     the application's request becomes a job; its datagrams gather straight from the application's
 *               registered memory (our header is one extra SGE), as many at a time as the device's send queue
 *               has room for; the progress thread posts the rest as completions come back. The job completes
 *               when its last datagram did (handed to the network).
 *   receiving   the device fills a ring of the provider's buffers; the progress thread copies each payload into
 *               the application's posted receive at the datagram's offset (one copy; lkeys checked in software)
 *               and completes the receive, in posting order, when the whole message arrived.
 *   multicast   a join is an rdma_cm id of its own per group (resolve, rdma_join_multicast, ibv_attach_mcast),
 *               moved on by the progress thread while the caller waits with a deadline; a peer that is a group
 *               gets its address handle from a send-only join (remote QPN 0xFFFFFF).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "rnic/verbs/ud.h"

#define RECV_TAG (1ull << 63)
#define CQ_BATCH 32
#define MAX_SEND_SLOTS 1024u
#define MIN_SEND_SLOTS 64u
#define MAX_RECV_SLOTS 8192u
#define MIN_RECV_SLOTS 256u
#define RECV_RING_BYTES (16u << 20)
#define MSG_BUCKETS 1024u
/* One datagram in this many asks the device for a completion (besides those a job needs, see post_datagram):
 * each completion costs the device a CQ entry and us a poll, per datagram that was a third of a 1 KiB stream. */
#define SIGNAL_EVERY 16u
/* Datagrams up to this size (our header included) are posted inline where the device allows. */
#define INLINE_DATAGRAM 256u

/* ---- wire header ------------------------------------------------------------------------------------------ */

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void rs_vud_hdr_encode(const struct rs_vud_hdr *h, uint8_t *out)
{
    out[0] = RS_VUD_MAGIC;
    out[1] = RS_VUD_VERSION;
    out[2] = h->opcode;
    out[3] = h->flags;
    out[4] = (uint8_t)(h->src_port >> 8);
    out[5] = (uint8_t)h->src_port;
    out[6] = (uint8_t)(h->group_port >> 8);
    out[7] = (uint8_t)h->group_port;
    put32(out + 8, h->msg_id);
    put32(out + 12, h->msg_len);
    put32(out + 16, h->offset);
    put32(out + 20, h->rkey);
    put32(out + 24, (uint32_t)(h->addr >> 32));
    put32(out + 28, (uint32_t)h->addr);
    put32(out + 32, h->seg_len);
    put32(out + 36, 0);
}

bool rs_vud_hdr_decode(const uint8_t *in, size_t len, struct rs_vud_hdr *h)
{
    if (len < RS_V_UD_HDR_LEN || in[0] != RS_VUD_MAGIC || in[1] != RS_VUD_VERSION)
        return false;
    h->opcode = in[2];
    h->flags = in[3];
    if (h->opcode < RS_VUD_SEND || h->opcode > RS_VUD_READ_RESP)
        return false;
    h->src_port = (uint16_t)(in[4] << 8 | in[5]);
    h->group_port = (uint16_t)(in[6] << 8 | in[7]);
    h->msg_id = get32(in + 8);
    h->msg_len = get32(in + 12);
    h->offset = get32(in + 16);
    h->rkey = get32(in + 20);
    h->addr = (uint64_t)get32(in + 24) << 32 | get32(in + 28);
    h->seg_len = get32(in + 32);
    return true;
}

/* The sender's address from the 40 bytes in front of a UD payload: a real GRH (IB, RoCEv1, RoCEv2 over IPv6) or,
 * for RoCEv2 over IPv4, 20 unspecified bytes followed by the IPv4 header. */
static void grh_source(const uint8_t *grh, uint16_t port, struct rs_v_src *src)
{
    bool v4 = (grh[20] >> 4) == 4 && (grh[20] & 0x0f) == 5;
    bool v6 = (grh[0] >> 4) == 6;
    if (v4 && v6) {
        uint32_t sum = 0;
        for (int i = 0; i < 20; i += 2)
            sum += (uint32_t)grh[20 + i] << 8 | grh[21 + i];
        while (sum >> 16)
            sum = (sum & 0xffff) + (sum >> 16);
        v6 = sum != 0xffff;
    }
    memset(&src->addr, 0, sizeof(src->addr));
    if (v4 || !v6) {
        memset(src->gid, 0, 10);
        src->gid[10] = src->gid[11] = 0xff;
        memcpy(src->gid + 12, grh + 32, 4);
    } else {
        memcpy(src->gid, grh + 8, 16);
    }
    static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    if (memcmp(src->gid, mapped, 12) == 0) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&src->addr;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        memcpy(&sin->sin_addr, src->gid + 12, 4);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&src->addr;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(port);
        memcpy(&sin6->sin6_addr, src->gid, 16);
    }
}

/* ---- creation --------------------------------------------------------------------------------------------- */

static uint32_t clamp(uint32_t v, uint32_t lo, uint32_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void *alloc_aligned(size_t size)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, (size + 4095) & ~(size_t)4095))
        return NULL;
    memset(p, 0, size);
    return p;
}

int rs_v_ud_create(struct rs_v_qp *qp)
{
    struct rs_v_dev *dev = qp->dev;
    int r = rs_v_progress_start(dev);
    if (r)
        return r;
    struct rs_v_ud *ud = calloc(1, sizeof(*ud));
    if (!ud)
        return -ENOMEM;
    ud->qp = qp;
    ud->mtu = dev->mtu;
    ud->chunk = dev->mtu - RS_V_UD_HDR_LEN;
    ud->scount = clamp(qp->max_send_wr * 4, MIN_SEND_SLOTS, MAX_SEND_SLOTS);
    uint32_t recvs = qp->srq ? qp->srq->max_wr : qp->max_recv_wr;
    ud->rsize = (RS_V_GRH_LEN + dev->mtu + 63) & ~63u;
    ud->rcount = clamp(recvs * 4, MIN_RECV_SLOTS, MAX_RECV_SLOTS);
    if ((uint64_t)ud->rcount * ud->rsize > RECV_RING_BYTES)
        ud->rcount = clamp(RECV_RING_BYTES / ud->rsize, MIN_RECV_SLOTS, MAX_RECV_SLOTS);
    if (ud->rcount > (uint32_t)dev->attr.max_qp_wr)
        ud->rcount = (uint32_t)dev->attr.max_qp_wr;
    if (ud->scount > (uint32_t)dev->attr.max_qp_wr)
        ud->scount = (uint32_t)dev->attr.max_qp_wr;
    ud->ssize = (RS_V_UD_HDR_LEN + qp->max_inline + 63) & ~63u;
    ud->nbuckets = MSG_BUCKETS;
    ud->buckets = calloc(ud->nbuckets, sizeof(*ud->buckets));
    ud->sjob = calloc(ud->scount, sizeof(*ud->sjob));
    ud->nssge = qp->max_send_sge + 1;
    ud->ssge = calloc((size_t)ud->scount * ud->nssge, sizeof(*ud->ssge));
    ud->sfree = calloc(ud->scount, sizeof(*ud->sfree));
    ud->sposted = calloc(ud->scount, sizeof(*ud->sposted));
    ud->rbuf = alloc_aligned((size_t)ud->rcount * ud->rsize);
    ud->sbuf = alloc_aligned((size_t)ud->scount * ud->ssize);
    r = -ENOMEM;
    if (!ud->buckets || !ud->sjob || !ud->sfree || !ud->sposted || !ud->rbuf || !ud->sbuf || !ud->ssge)
        goto fail;
    ud->rmr = ibv_reg_mr(qp->pd->pd, ud->rbuf, (size_t)ud->rcount * ud->rsize, IBV_ACCESS_LOCAL_WRITE);
    ud->smr = ibv_reg_mr(qp->pd->pd, ud->sbuf, (size_t)ud->scount * ud->ssize, 0);
    if (!ud->rmr || !ud->smr)
        goto fail_errno;
    ud->cq = ibv_create_cq(dev->ctx, (int)(ud->scount + ud->rcount), qp, rs_v_progress_channel(dev), 0);
    if (!ud->cq)
        goto fail_errno;
    struct ibv_qp_init_attr init = {
        .qp_context = qp,
        .send_cq = ud->cq,
        .recv_cq = ud->cq,
        .cap = {
            .max_send_wr = ud->scount,
            .max_recv_wr = ud->rcount,
            .max_send_sge = qp->max_send_sge + 1,
            .max_recv_sge = 1,
        },
        .qp_type = IBV_QPT_UD,
        .sq_sig_all = 0,
    };
    /* Small datagrams go inline (the provider copies them at post time; rxe then looks up no memory region for
     * them in the kernel), as perftest sends its small messages. */
    init.cap.max_inline_data = dev->base.caps.max_inline < INLINE_DATAGRAM ? dev->base.caps.max_inline
                                                                           : INLINE_DATAGRAM;
    qp->qp = ibv_create_qp(qp->pd->pd, &init);
    if (!qp->qp && init.cap.max_inline_data) {
        init.cap.max_inline_data = 0;
        qp->qp = ibv_create_qp(qp->pd->pd, &init);
    }
    if (!qp->qp)
        goto fail_errno;
    ud->dev_inline = init.cap.max_inline_data;
    for (uint32_t i = 0; i < ud->scount; i++)
        ud->sfree[i] = ud->scount - 1 - i;
    ud->nsfree = ud->scount;
    pthread_mutex_init(&ud->progress_lock, NULL);
    pthread_mutex_init(&ud->tx_lock, NULL);
    pthread_mutex_init(&ud->rx_lock, NULL);
    pthread_mutex_init(&ud->mc_lock, NULL);
    pthread_condattr_t cattr;
    pthread_condattr_init(&cattr);
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);   /* joins wait with a deadline on rs_v_now_ms's clock */
    pthread_cond_init(&ud->mc_cond, &cattr);
    pthread_condattr_destroy(&cattr);
    atomic_init(&ud->bound, false);
    atomic_init(&ud->error, false);
    atomic_init(&ud->qos_gen, 1);
    ud->bind_ref.kind = RS_V_ID_UDBIND;
    ud->bind_ref.obj = qp;
    qp->ud = ud;
    return 0;
fail_errno:
    r = errno ? -errno : -ENOMEM;
fail:
    if (ud->cq)
        ibv_destroy_cq(ud->cq);
    if (ud->rmr)
        ibv_dereg_mr(ud->rmr);
    if (ud->smr)
        ibv_dereg_mr(ud->smr);
    free(ud->rbuf);
    free(ud->sbuf);
    free(ud->buckets);
    free(ud->sjob);
    free(ud->sfree);
    free(ud->sposted);
    free(ud->ssge);
    free(ud);
    return r;
}

/* ---- jobs ------------------------------------------------------------------------------------------------- */

struct rs_v_job *rs_v_job_new(uint32_t num_sge, size_t inline_len)
{
    size_t size = sizeof(struct rs_v_job) + num_sge * (sizeof(struct rs_rnic_sge) + sizeof(struct rs_v_mr *)) +
                  inline_len;
    struct rs_v_job *job = calloc(1, size);
    if (!job)
        return NULL;
    job->sge = (struct rs_rnic_sge *)(job + 1);
    job->mrs = (struct rs_v_mr **)(job->sge + num_sge);
    if (inline_len)
        job->inline_data = (uint8_t *)(job->mrs + num_sge);
    return job;
}

void rs_v_job_free(struct rs_v_job *job)
{
    for (int i = 0; i < job->num_sge; i++) {
        if (job->mrs[i])
            rs_v_mr_put(job->mrs[i]);
    }
    if (job->peer)
        rs_v_peer_put(job->peer);
    if (job->ah)
        ibv_destroy_ah(job->ah);
    free(job);
}

static uint32_t datagrams_for(const struct rs_v_ud *ud, uint64_t len)
{
    return len == 0 ? 1 : (uint32_t)((len + ud->chunk - 1) / ud->chunk);
}

static enum rs_rnic_wc_opcode job_wc_opcode(const struct rs_v_job *job)
{
    switch (job->kind) {
    case RS_V_JOB_RECORD: return RS_WC_WRITE_RECORD;
    case RS_V_JOB_READ: return RS_WC_RDMA_READ;
    default: return RS_WC_SEND;
    }
}

void rs_v_send_completion(struct rs_v_ud *ud, struct rs_v_job *job)
{
    struct rs_rnic_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = job->wr_id;
    wc.status = job->status;
    wc.opcode = job_wc_opcode(job);
    wc.qp = &ud->qp->base;
    if (job->kind == RS_V_JOB_READ && job->status == RS_WC_SUCCESS)
        wc.byte_len = (uint32_t)job->len;
    rs_v_cq_push(ud->qp->send_cq, &wc);
}

/* Completes application jobs in posting order (tx_lock held). */
void rs_v_ud_release(struct rs_v_ud *ud)
{
    while (ud->app_head && ud->app_head->done && ud->app_head->completed == ud->app_head->posted) {
        struct rs_v_job *job = ud->app_head;
        ud->app_head = job->next;
        if (!ud->app_head)
            ud->app_tail = NULL;
        if (!job->reported && (job->signaled || ud->qp->sq_sig_all || job->status != RS_WC_SUCCESS))
            rs_v_send_completion(ud, job);
        ud->app_outstanding--;
        rs_v_job_free(job);
    }
}

/* ---- sending ---------------------------------------------------------------------------------------------- */

static bool peer_ready_for(struct rs_v_ud *ud, struct rs_v_peer *peer);

/* Hands the prepared datagrams to the device with one doorbell (tx_lock held). A refused chain fails the jobs it
 * belonged to; their datagrams already in flight still come back. */
static void flush_batch(struct rs_v_ud *ud)
{
    if (!ud->nbatch)
        return;
    for (uint32_t i = 0; i + 1 < ud->nbatch; i++)
        ud->batch[i].next = &ud->batch[i + 1];
    ud->batch[ud->nbatch - 1].next = NULL;
    struct ibv_send_wr *bad = NULL;
    int r = ibv_post_send(ud->qp->qp, ud->batch, &bad);
    if (r) {
        for (struct ibv_send_wr *w = bad ? bad : ud->batch; w; w = w->next) {
            uint32_t index = (uint32_t)w->wr_id;
            ud->nsposted--;         /* the refused ones were the last posted */
            struct rs_v_job *job = ud->sjob[index];
            ud->sjob[index] = NULL;
            ud->sfree[ud->nsfree++] = index;
            job->posted--;
            job->ndgrams = job->posted;
            if (job->status == RS_WC_SUCCESS)
                job->status = RS_WC_GENERAL_ERR;
            if (job->kind != RS_V_JOB_READ_RESP)
                job->done = true;
        }
    }
    ud->nbatch = 0;
}

/* Prepares the next datagram of a job (tx_lock held, a slot free). */
static void post_datagram(struct rs_v_ud *ud, struct rs_v_job *job)
{
    uint32_t index = ud->sfree[--ud->nsfree];
    uint8_t *slot = ud->sbuf + (size_t)index * ud->ssize;
    uint32_t i = job->posted;
    bool last = i + 1 == job->ndgrams;
    uint64_t off = job->kind == RS_V_JOB_READ ? 0 : (uint64_t)i * ud->chunk;
    uint32_t plen = 0;
    if (job->kind != RS_V_JOB_READ && job->len > off)
        plen = (uint32_t)(job->len - off < ud->chunk ? job->len - off : ud->chunk);
    uint16_t group_port = 0;
    if (job->kind != RS_V_JOB_READ_RESP && job->peer->multicast)
        group_port = ntohs(((const struct sockaddr_in *)&job->peer->addr)->sin_port);   /* same place in v6 */
    struct rs_vud_hdr h = {
        .opcode = job->kind == RS_V_JOB_SEND ? RS_VUD_SEND
                  : job->kind == RS_V_JOB_RECORD ? RS_VUD_RECORD
                  : job->kind == RS_V_JOB_READ ? RS_VUD_READ_REQ : RS_VUD_READ_RESP,
        .flags = (uint8_t)((last ? RS_VUD_F_LAST : 0) | (last && job->solicited ? RS_VUD_F_SOLICITED : 0) |
                           (job->status != RS_WC_SUCCESS && job->kind == RS_V_JOB_READ_RESP ? RS_VUD_F_REFUSED : 0)),
        .src_port = ud->port,
        .group_port = group_port,
        .msg_id = job->msg_id,
        .msg_len = (uint32_t)job->len,
        .offset = (uint32_t)off,
        .rkey = job->rkey,
        .seg_len = job->seg_len,
        .addr = job->remote_addr,
    };
    rs_vud_hdr_encode(&h, slot);
    struct ibv_sge *sge = ud->ssge + (size_t)index * ud->nssge;
    int n = 1;
    sge[0].addr = (uint64_t)(uintptr_t)slot;
    sge[0].length = RS_V_UD_HDR_LEN;
    sge[0].lkey = ud->smr->lkey;
    if (plen && job->inline_data) {
        memcpy(slot + RS_V_UD_HDR_LEN, job->inline_data + off, plen);
        sge[0].length += plen;
    } else if (plen) {
        /* Gather the slice [off, off+plen) from the job's list; datagrams go out in order, so a cursor does. */
        uint32_t left = plen;
        while (left && job->cur_sge < job->num_sge && (uint32_t)n < ud->nssge) {
            const struct rs_rnic_sge *s = &job->sge[job->cur_sge];
            uint64_t avail = s->length - job->cur_off;
            uint32_t take = avail < left ? (uint32_t)avail : left;
            if (take) {
                sge[n].addr = s->addr + job->cur_off;
                sge[n].length = take;
                sge[n].lkey = s->lkey;
                n++;
            }
            left -= take;
            job->cur_off += take;
            if (job->cur_off == s->length) {
                job->cur_sge++;
                job->cur_off = 0;
            }
        }
    }
    struct ibv_send_wr *wr = &ud->batch[ud->nbatch++];
    memset(wr, 0, sizeof(*wr));
    wr->wr_id = index;
    wr->sg_list = sge;
    wr->num_sge = n;
    wr->opcode = IBV_WR_SEND;
    /* Signaled: every SIGNAL_EVERY-th, the last of a job someone waits for (the application's, a READ answer that
     * holds an address handle), and while slots run short, so every slot is retired before it is needed. */
    bool signal = ++ud->unsignaled >= SIGNAL_EVERY || ud->nsfree < SIGNAL_EVERY ||
                  (last && (job->signaled || ud->qp->sq_sig_all || job->kind == RS_V_JOB_READ ||
                            job->kind == RS_V_JOB_READ_RESP));
    if (signal) {
        wr->send_flags = IBV_SEND_SIGNALED;
        ud->unsignaled = 0;
    }
    if (sge[0].length + (n > 1 ? plen : 0) <= ud->dev_inline)
        wr->send_flags |= IBV_SEND_INLINE;
    if (job->kind == RS_V_JOB_READ_RESP) {
        wr->wr.ud.ah = job->ah;
        wr->wr.ud.remote_qpn = job->remote_qpn;
        wr->wr.ud.remote_qkey = RS_V_UD_QKEY;
    } else {
        wr->wr.ud.ah = job->peer->ah;
        wr->wr.ud.remote_qpn = job->peer->remote_qpn;
        wr->wr.ud.remote_qkey = job->peer->remote_qkey;
    }
    ud->sjob[index] = job;
    ud->sposted[(ud->sposted_head + ud->nsposted++) % ud->scount] = index;
    job->posted++;
    if (ud->nbatch == sizeof(ud->batch) / sizeof(ud->batch[0]))
        flush_batch(ud);
}

/* Answers first (a peer is waiting on them), then the application's jobs in order (tx_lock held). */
void rs_v_ud_tx_pump(struct rs_v_ud *ud)
{
    if (atomic_load_explicit(&ud->error, memory_order_relaxed))
        return;
    for (struct rs_v_job *job = ud->resp_head; job && ud->nsfree; job = job->next) {
        while (job->posted < job->ndgrams && ud->nsfree)
            post_datagram(ud, job);
    }
    for (struct rs_v_job *job = ud->app_head; job && ud->nsfree; job = job->next) {
        while (job->posted < job->ndgrams && ud->nsfree)
            post_datagram(ud, job);
        if (job->posted < job->ndgrams)
            break;
    }
    flush_batch(ud);
}

static void unlink_resp(struct rs_v_ud *ud, struct rs_v_job *job)
{
    struct rs_v_job **link = &ud->resp_head, *prev = NULL;
    while (*link && *link != job) {
        prev = *link;
        link = &(*link)->next;
    }
    if (!*link)
        return;
    *link = job->next;
    if (ud->resp_tail == job)
        ud->resp_tail = prev;
}

/* A datagram left (or failed); tx_lock held. */
static void datagram_sent(struct rs_v_ud *ud, uint32_t index, enum ibv_wc_status status)
{
    if (index >= ud->scount || !ud->sjob[index])
        return;
    struct rs_v_job *job = ud->sjob[index];
    ud->sjob[index] = NULL;
    ud->sfree[ud->nsfree++] = index;
    job->completed++;
    if (status != IBV_WC_SUCCESS && job->status == RS_WC_SUCCESS)
        job->status = rs_v_wc_status(status, false);
    if (job->completed < job->ndgrams)
        return;
    if (job->kind == RS_V_JOB_READ_RESP) {
        if (job->completed == job->posted) {
            unlink_resp(ud, job);
            rs_v_job_free(job);
        }
        return;
    }
    /* A READ is done when its answer came (record.c), unless the request itself failed. */
    if (job->kind != RS_V_JOB_READ || job->status != RS_WC_SUCCESS)
        job->done = true;
}

/* The device completed slot `index`: it and every slot posted before it left (tx_lock held). */
static void datagrams_sent_through(struct rs_v_ud *ud, uint32_t index, enum ibv_wc_status status)
{
    if (index >= ud->scount || !ud->sjob[index])
        return;
    while (ud->nsposted) {
        uint32_t oldest = ud->sposted[ud->sposted_head];
        ud->sposted_head = (ud->sposted_head + 1) % ud->scount;
        ud->nsposted--;
        if (oldest == index) {
            datagram_sent(ud, oldest, status);
            return;
        }
        datagram_sent(ud, oldest, IBV_WC_SUCCESS);  /* a failed one would have completed on its own */
    }
}

static int validate_sges(struct rs_v_ud *ud, const struct rs_rnic_send_wr *wr, struct rs_v_job *job, bool sink)
{
    struct rs_v_dev *dev = ud->qp->dev;
    pthread_rwlock_rdlock(&dev->mr_lock);
    int ok = 1;
    for (int i = 0; i < wr->num_sge; i++) {
        const struct rs_rnic_sge *s = &wr->sg_list[i];
        job->sge[i] = *s;
        struct rs_v_mr *mr = rs_v_mr_find_lkey_locked(dev, s->lkey);
        if (!mr || rs_v_pd(mr->pub.pd) != ud->qp->pd || !rs_v_mr_covers(mr, s->addr, s->length) ||
            (sink && !(mr->pub.access & RS_ACCESS_LOCAL_WRITE))) {
            ok = 0;
            break;
        }
        if (!sink) {
            rs_v_mr_get(mr);
            job->mrs[i] = mr;
        }
    }
    job->num_sge = wr->num_sge;
    pthread_rwlock_unlock(&dev->mr_lock);
    return ok;
}

/* Builds the job for one work request; a bad lkey is not a posting error but a LOC_PROT_ERR completion. */
static int make_job(struct rs_v_ud *ud, const struct rs_rnic_send_wr *wr, struct rs_v_job **out)
{
    struct rs_v_qp *qp = ud->qp;
    enum rs_v_job_kind kind;
    switch (wr->opcode) {
    case RS_WR_SEND: kind = RS_V_JOB_SEND; break;
    case RS_WR_WRITE_RECORD: kind = RS_V_JOB_RECORD; break;
    case RS_WR_RDMA_READ: kind = RS_V_JOB_READ; break;
    default: return -EINVAL;
    }
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > (qp->max_send_sge ? qp->max_send_sge : 1) ||
        (wr->num_sge && !wr->sg_list))
        return -EINVAL;
    struct rs_v_peer *peer = (struct rs_v_peer *)wr->ud_peer;
    if (!peer || !peer_ready_for(ud, peer))
        return -EINVAL;
    if (peer->multicast && kind == RS_V_JOB_READ)
        return -EINVAL;     /* one request, as many answers as members: not a READ */
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge; i++)
        len += wr->sg_list[i].length;
    if ((kind == RS_V_JOB_SEND && len > RS_V_UD_MAX_MSG) || (kind != RS_V_JOB_SEND && len > RS_V_RECORD_MAX_MSG))
        return -EMSGSIZE;
    bool inline_data = (wr->flags & RS_SEND_INLINE) && kind != RS_V_JOB_READ;
    if (inline_data && len > qp->max_inline)
        return -EINVAL;
    struct rs_v_job *job = rs_v_job_new((uint32_t)wr->num_sge, inline_data ? len : 0);
    if (!job)
        return -ENOMEM;
    job->kind = kind;
    job->wr_id = wr->wr_id;
    job->signaled = (wr->flags & RS_SEND_SIGNALED) != 0;
    job->solicited = (wr->flags & RS_SEND_SOLICITED) != 0;
    job->status = RS_WC_SUCCESS;
    job->len = len;
    job->rkey = wr->rdma.rkey;
    job->remote_addr = wr->rdma.remote_addr;
    job->msg_id = ud->next_msg_id++;
    job->ndgrams = kind == RS_V_JOB_READ ? 1 : datagrams_for(ud, len);
    if (kind == RS_V_JOB_RECORD)
        job->seg_len = rs_v_record_seg_len(ud->chunk, len);
    if (kind == RS_V_JOB_READ)
        job->deadline_ms = rs_v_now_ms() + qp->read_timeout_ms;
    if (inline_data) {
        uint64_t at = 0;
        for (int i = 0; i < wr->num_sge; i++) {
            memcpy(job->inline_data + at, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
            at += wr->sg_list[i].length;
        }
    } else if (!validate_sges(ud, wr, job, kind == RS_V_JOB_READ)) {
        job->status = RS_WC_LOC_PROT_ERR;
        job->ndgrams = 0;
        job->done = true;
    }
    atomic_fetch_add(&peer->refs, 1);
    job->peer = peer;
    *out = job;
    return 0;
}

static void flush_job_now(struct rs_v_ud *ud, const struct rs_rnic_send_wr *wr)
{
    struct rs_rnic_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr->wr_id;
    wc.status = RS_WC_WR_FLUSH_ERR;
    wc.opcode = wr->opcode == RS_WR_WRITE_RECORD ? RS_WC_WRITE_RECORD
                : wr->opcode == RS_WR_RDMA_READ ? RS_WC_RDMA_READ : RS_WC_SEND;
    wc.qp = &ud->qp->base;
    rs_v_cq_push(ud->qp->send_cq, &wc);
}

int rs_v_ud_post_send(struct rs_v_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr)
{
    struct rs_v_ud *ud = qp->ud;
    if (!atomic_load(&ud->bound) && !atomic_load(&ud->error)) {
        *bad_wr = wr;
        return -EINVAL;
    }
    int r = 0;
    bool read = false;
    pthread_mutex_lock(&ud->tx_lock);
    for (; wr; wr = wr->next) {
        if (atomic_load(&ud->error)) {
            flush_job_now(ud, wr);
            continue;
        }
        if (ud->app_outstanding >= qp->max_send_wr) {
            r = -ENOMEM;
            break;
        }
        struct rs_v_job *job;
        r = make_job(ud, wr, &job);
        if (r)
            break;
        read |= job->kind == RS_V_JOB_READ;
        if (ud->app_tail)
            ud->app_tail->next = job;
        else
            ud->app_head = job;
        ud->app_tail = job;
        ud->app_outstanding++;
    }
    rs_v_ud_tx_pump(ud);
    rs_v_ud_release(ud);
    pthread_mutex_unlock(&ud->tx_lock);
    /* A caller that posts carries the QP like one that polls (ud_progress.c): the datagrams that went out free
     * their slots for the next posts here, without waking the progress thread for them. */
    rs_v_ud_try_progress(qp);
    if (read)
        rs_v_progress_kick(qp->dev);    /* a new READ deadline */
    if (r)
        *bad_wr = wr;
    return r;
}

/* ---- receiving -------------------------------------------------------------------------------------------- */

static void post_receives(struct rs_v_ud *ud, const uint32_t *index, uint32_t n)
{
    struct ibv_recv_wr wr[CQ_BATCH];
    struct ibv_sge sge[CQ_BATCH];
    while (n) {
        uint32_t m = n < CQ_BATCH ? n : CQ_BATCH;
        for (uint32_t i = 0; i < m; i++) {
            sge[i].addr = (uint64_t)(uintptr_t)(ud->rbuf + (size_t)index[i] * ud->rsize);
            sge[i].length = ud->rsize;
            sge[i].lkey = ud->rmr->lkey;
            wr[i].wr_id = RECV_TAG | index[i];
            wr[i].sg_list = &sge[i];
            wr[i].num_sge = 1;
            wr[i].next = i + 1 < m ? &wr[i + 1] : NULL;
        }
        struct ibv_recv_wr *bad;
        if (ibv_post_recv(ud->qp->qp, wr, &bad))
            RS_WARN("verbs: UD receive ring refill failed");
        index += m;
        n -= m;
    }
}

enum rs_rnic_wc_status rs_v_scatter(struct rs_v_qp *qp, const struct rs_rnic_sge *sge, int num_sge, uint64_t offset,
                                    const uint8_t *data, uint32_t len)
{
    struct rs_v_dev *dev = qp->dev;
    enum rs_rnic_wc_status status = RS_WC_SUCCESS;
    uint64_t pos = 0;
    for (int i = 0; i < num_sge && len; i++) {
        uint64_t start = pos, end = pos + sge[i].length;
        pos = end;
        if (offset >= end)
            continue;
        uint64_t skip = offset > start ? offset - start : 0;
        uint64_t room = sge[i].length - skip;
        uint32_t take = room < len ? (uint32_t)room : len;
        struct rs_v_mr *mr = rs_v_mr_find_lkey_locked(dev, sge[i].lkey);
        uint64_t addr = sge[i].addr + skip;
        if (!mr || rs_v_pd(mr->pub.pd) != qp->pd || !(mr->pub.access & RS_ACCESS_LOCAL_WRITE) ||
            !rs_v_mr_covers(mr, addr, take)) {
            status = RS_WC_LOC_PROT_ERR;
            break;
        }
        memcpy((void *)(uintptr_t)addr, data, take);
        data += take;
        len -= take;
        offset += take;
    }
    if (status == RS_WC_SUCCESS && len)
        status = RS_WC_LOC_LEN_ERR;
    return status;
}

static uint32_t msg_hash(const struct rs_v_ud *ud, const uint8_t *gid, uint32_t qpn, uint32_t msg_id)
{
    uint32_t h = msg_id * 0x9e3779b1u ^ qpn * 0x85ebca6bu;
    for (int i = 12; i < 16; i++)
        h = h * 31 + gid[i];
    return h & (ud->nbuckets - 1);
}

struct rs_v_msg *rs_v_msg_find(struct rs_v_ud *ud, const struct rs_v_src *src, uint32_t msg_id)
{
    for (struct rs_v_msg *m = ud->buckets[msg_hash(ud, src->gid, src->qpn, msg_id)]; m; m = m->hnext) {
        if (m->msg_id == msg_id && m->qpn == src->qpn && memcmp(m->gid, src->gid, 16) == 0)
            return m;
    }
    return NULL;
}

struct rs_v_msg *rs_v_msg_new(struct rs_v_ud *ud, const struct rs_v_src *src, uint32_t msg_id, uint8_t opcode,
                              uint64_t deadline_ms)
{
    struct rs_v_msg *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    memcpy(m->gid, src->gid, 16);
    m->qpn = src->qpn;
    m->msg_id = msg_id;
    m->opcode = opcode;
    m->state = RS_V_MSG_ACTIVE;
    if (opcode == RS_VUD_RECORD)
        ud->records_active++;
    else if (opcode == RS_VUD_SEND)
        ud->sends_active++;
    m->deadline_ms = deadline_ms;
    if (deadline_ms)
        rs_v_progress_note_deadline(ud->qp->dev, deadline_ms);
    m->src = *src;
    uint32_t b = msg_hash(ud, src->gid, src->qpn, msg_id);
    m->hnext = ud->buckets[b];
    ud->buckets[b] = m;
    m->prev = ud->age_tail;
    if (ud->age_tail)
        ud->age_tail->next = m;
    else
        ud->age_head = m;
    ud->age_tail = m;
    return m;
}

void rs_v_msg_done(struct rs_v_ud *ud, struct rs_v_msg *m, uint64_t now_ms)
{
    if (m->opcode == RS_VUD_RECORD) {
        rs_v_record_unstage(ud, m);
        if (m->state == RS_V_MSG_ACTIVE)
            ud->records_active--;
    } else if (m->opcode == RS_VUD_SEND && m->state == RS_V_MSG_ACTIVE) {
        ud->sends_active--;
    }
    m->state = RS_V_MSG_DONE;
    m->done_ms = now_ms;
    m->recv = NULL;
}

static void msg_free(struct rs_v_ud *ud, struct rs_v_msg *m)
{
    if (m->opcode == RS_VUD_RECORD)
        rs_v_record_unstage(ud, m);
    struct rs_v_msg **link = &ud->buckets[msg_hash(ud, m->gid, m->qpn, m->msg_id)];
    while (*link && *link != m)
        link = &(*link)->hnext;
    if (*link)
        *link = m->hnext;
    if (m->prev)
        m->prev->next = m->next;
    else
        ud->age_head = m->next;
    if (m->next)
        m->next->prev = m->prev;
    else
        ud->age_tail = m->prev;
    free(m);
}

/* Fills a taken receive from one datagram; the receive queue's lock is held. */
static void fill_recv(struct rs_v_ud *ud, struct rs_v_recv *r, uint64_t offset, const uint8_t *data, uint32_t len,
                      enum rs_rnic_wc_status *status)
{
    struct rs_v_dev *dev = ud->qp->dev;
    pthread_rwlock_rdlock(&dev->mr_lock);
    *status = rs_v_scatter(ud->qp, r->sge, r->num_sge, offset, data, len);
    pthread_rwlock_unlock(&dev->mr_lock);
}

static void finish_recv(struct rs_v_rq *rq, struct rs_v_recv *r, enum rs_rnic_wc_status status, uint32_t byte_len,
                        const struct rs_v_src *src, bool solicited)
{
    r->status = status;
    r->byte_len = status == RS_WC_SUCCESS ? byte_len : 0;
    r->flags = solicited ? RS_WC_SOLICITED : 0;
    r->src = src->addr;
    r->src_qpn = src->qpn;
    rs_v_rq_finish(rq, r);
}

/*
 * A message from src starts (msg_id): a segmented SEND from the same sender QP still being put together lost a
 * datagram, since one QP's datagrams arrive in the order they were sent. It gives up now (RS_WC_TIMEOUT, as its
 * deadline would, a second later) rather than hold its receive: receives complete in posting order, so it would
 * hold back every later message that long, and those find no receive meanwhile (1% loss once lost 93% of a
 * stream of messages of 1-67 datagrams). Only the newest earlier message of the sender can still be active: each
 * start settles the one before. rx_lock held.
 */
static void give_up_earlier(struct rs_v_ud *ud, const struct rs_v_src *src, uint32_t msg_id)
{
    if (!ud->sends_active)
        return;
    unsigned looked = 0;
    for (struct rs_v_msg *m = ud->age_tail; m && looked < 64; m = m->prev, looked++) {
        if (m->opcode != RS_VUD_SEND || m->msg_id == msg_id || m->qpn != src->qpn || memcmp(m->gid, src->gid, 16))
            continue;
        if (m->state == RS_V_MSG_ACTIVE && (int32_t)(msg_id - m->msg_id) > 0) {
            struct rs_v_rq *rq = rs_v_qp_rq(ud->qp);
            pthread_mutex_lock(&rq->lock);
            finish_recv(rq, m->recv, RS_WC_TIMEOUT, 0, &m->src, false);
            pthread_mutex_unlock(&rq->lock);
            rs_v_msg_done(ud, m, rs_v_now_ms());
        }
        return;
    }
}

static void rx_send(struct rs_v_ud *ud, const struct rs_vud_hdr *h, const uint8_t *payload, uint32_t len,
                    const struct rs_v_src *src)
{
    struct rs_v_qp *qp = ud->qp;
    if (h->msg_len > RS_V_UD_MAX_MSG || h->offset > h->msg_len || len > h->msg_len - h->offset) {
        ud->refused++;
        return;
    }
    struct rs_v_rq *rq = rs_v_qp_rq(qp);
    bool solicited = (h->flags & RS_VUD_F_SOLICITED) != 0;
    if (h->offset == 0 && len == h->msg_len) {
        /* The whole message in one datagram: the common case, no reassembly state. */
        give_up_earlier(ud, src, h->msg_id);
        pthread_mutex_lock(&rq->lock);
        struct rs_v_recv *r = rs_v_rq_take(rq, qp);
        if (!r) {
            pthread_mutex_unlock(&rq->lock);
            ud->dropped++;
            return;
        }
        enum rs_rnic_wc_status status = RS_WC_LOC_LEN_ERR;
        if (r->total >= len)
            fill_recv(ud, r, 0, payload, len, &status);
        finish_recv(rq, r, status, len, src, solicited);
        pthread_mutex_unlock(&rq->lock);
        return;
    }
    struct rs_v_msg *m = rs_v_msg_find(ud, src, h->msg_id);
    if (!m) {
        give_up_earlier(ud, src, h->msg_id);
        m = rs_v_msg_new(ud, src, h->msg_id, RS_VUD_SEND, rs_v_now_ms() + RS_V_DEFAULT_SEND_TIMEOUT_MS);
        if (!m)
            return;
        pthread_mutex_lock(&rq->lock);
        struct rs_v_recv *r = rs_v_rq_take(rq, qp);
        if (!r) {
            ud->dropped++;
            rs_v_msg_done(ud, m, rs_v_now_ms());
        } else if (r->total < h->msg_len) {
            finish_recv(rq, r, RS_WC_LOC_LEN_ERR, 0, src, false);
            rs_v_msg_done(ud, m, rs_v_now_ms());
        } else {
            m->recv = r;
            m->msg_len = h->msg_len;
        }
        pthread_mutex_unlock(&rq->lock);
    }
    if (m->state != RS_V_MSG_ACTIVE || m->opcode != RS_VUD_SEND || h->msg_len != m->msg_len) {
        ud->refused++;      /* a straggler of a finished (or dropped) message */
        return;
    }
    pthread_mutex_lock(&rq->lock);
    enum rs_rnic_wc_status status;
    fill_recv(ud, m->recv, h->offset, payload, len, &status);
    m->received += len;
    m->solicited |= solicited;
    /* The deadline counts from the latest datagram: a long message on a slow host is not a lost one. */
    m->deadline_ms = rs_v_now_ms() + RS_V_DEFAULT_SEND_TIMEOUT_MS;
    if (status != RS_WC_SUCCESS || m->received >= m->msg_len) {
        finish_recv(rq, m->recv, status, m->msg_len, src, m->solicited);
        rs_v_msg_done(ud, m, rs_v_now_ms());
    }
    pthread_mutex_unlock(&rq->lock);
}

void rs_v_test_set_drop(struct rs_rnic *rnic, uint32_t per_million, uint64_t seed)
{
    struct rs_v_dev *dev = rs_v_dev(rnic);
    atomic_store(&dev->test_drop_state, seed ? seed : 0x9e3779b97f4a7c15ull);
    atomic_store(&dev->test_drop_per_million, per_million > 1000000 ? 1000000 : per_million);
    if (per_million)
        RS_WARN("verbs: TEST ONLY drop knob active: %u per million inbound UD datagrams dropped", per_million);
}

void rs_v_test_drop_last(struct rs_rnic *rnic, bool on)
{
    atomic_store(&rs_v_dev(rnic)->test_drop_last, on);
    if (on)
        RS_WARN("verbs: TEST ONLY knob active: the last datagram of every segmented message is dropped");
}

static bool test_drop(struct rs_v_dev *dev)
{
    uint32_t per_million = atomic_load_explicit(&dev->test_drop_per_million, memory_order_relaxed);
    if (!per_million)
        return false;
    uint64_t s = atomic_load(&dev->test_drop_state), n;
    do {
        n = s;
        n ^= n << 13;
        n ^= n >> 7;
        n ^= n << 17;
    } while (!atomic_compare_exchange_weak(&dev->test_drop_state, &s, n));
    return n % 1000000 < per_million;
}

static void rx_datagram(struct rs_v_ud *ud, const struct ibv_wc *wc)
{
    if (test_drop(ud->qp->dev))
        return;
    uint32_t index = (uint32_t)(wc->wr_id & ~RECV_TAG);
    if (index >= ud->rcount || wc->byte_len < RS_V_GRH_LEN + RS_V_UD_HDR_LEN)
        return;
    const uint8_t *grh = ud->rbuf + (size_t)index * ud->rsize;
    struct rs_vud_hdr h;
    if (!rs_vud_hdr_decode(grh + RS_V_GRH_LEN, wc->byte_len - RS_V_GRH_LEN, &h)) {
        ud->refused++;
        return;
    }
    if (h.offset > 0 && (h.flags & RS_VUD_F_LAST) &&
        atomic_load_explicit(&ud->qp->dev->test_drop_last, memory_order_relaxed))
        return;
    /* Group traffic for another port of the group: not ours, as a UDP socket on this port would not see it. */
    if (h.group_port && h.group_port != ud->port)
        return;
    const uint8_t *payload = grh + RS_V_GRH_LEN + RS_V_UD_HDR_LEN;
    uint32_t len = wc->byte_len - RS_V_GRH_LEN - RS_V_UD_HDR_LEN;
    struct rs_v_src src;
    grh_source(grh, h.src_port, &src);
    src.qpn = wc->src_qp;
    pthread_mutex_lock(&ud->rx_lock);
    switch (h.opcode) {
    case RS_VUD_SEND:
        rx_send(ud, &h, payload, len, &src);
        break;
    case RS_VUD_RECORD:
        rs_v_record_rx(ud, &h, payload, len, &src);
        break;
    case RS_VUD_READ_REQ:
        rs_v_read_request(ud, &h, wc, grh, &src);
        break;
    case RS_VUD_READ_RESP:
        rs_v_read_response(ud, &h, payload, len, &src);
        break;
    default:
        break;
    }
    pthread_mutex_unlock(&ud->rx_lock);
}

void rs_v_ud_run_cq(struct rs_v_qp *qp)
{
    rs_v_ud_run_cq_some(qp, 0);
}

bool rs_v_ud_run_cq_some(struct rs_v_qp *qp, uint64_t until_ms)
{
    struct rs_v_ud *ud = qp->ud;
    for (unsigned batch = 0;; batch++) {
        if (until_ms && batch && rs_v_now_ms() >= until_ms)
            return true;
        struct ibv_wc wc[CQ_BATCH];
        int n = ibv_poll_cq(ud->cq, CQ_BATCH, wc);
        if (n <= 0)
            return false;
        uint32_t refill[CQ_BATCH];
        uint32_t nrefill = 0;
        bool sent = false, failed = false;
        /* Receives first, without the send side's lock: a READ request or answer takes it itself. */
        for (int i = 0; i < n; i++) {
            if (!(wc[i].wr_id & RECV_TAG)) {
                sent = true;
                continue;
            }
            if (wc[i].status == IBV_WC_SUCCESS)
                rx_datagram(ud, &wc[i]);
            else if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
                failed = true;
            if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
                refill[nrefill++] = (uint32_t)(wc[i].wr_id & ~RECV_TAG);
        }
        if (sent) {
            pthread_mutex_lock(&ud->tx_lock);
            for (int i = 0; i < n; i++) {
                if (wc[i].wr_id & RECV_TAG)
                    continue;
                datagrams_sent_through(ud, (uint32_t)wc[i].wr_id, wc[i].status);
                if (wc[i].status != IBV_WC_SUCCESS && wc[i].status != IBV_WC_WR_FLUSH_ERR)
                    failed = true;
            }
            rs_v_ud_tx_pump(ud);
            rs_v_ud_release(ud);
            pthread_mutex_unlock(&ud->tx_lock);
        }
        if (nrefill && !atomic_load(&ud->error))
            post_receives(ud, refill, nrefill);
        if (failed && !atomic_load(&ud->error)) {
            /* A device UD QP that failed (it should not: lkeys are checked before posting) is an ERROR QP. */
            RS_WARN("verbs: UD QP %u failed in the device", qp->qp->qp_num);
            rs_v_ud_set_error(qp);
        }
        if (n < CQ_BATCH)
            return false;
    }
}

/* The progress thread's timers must not make a polling application wait for a lock (it would sleep, and on a
 * busy CPU wake up late): a busy lock is tried again 1 ms later, up to RS_V_TIMER_MAX_SKIPS times in a row. */
static bool lock_for_timers(struct rs_v_ud *ud, pthread_mutex_t *lock)
{
    if (pthread_mutex_trylock(lock) == 0)
        return true;
    if (ud->timer_skips < RS_V_TIMER_MAX_SKIPS) {
        ud->timer_skips++;
        return false;
    }
    pthread_mutex_lock(lock);
    return true;
}

/* Whether a message's deadline passed; rx_lock held. */
static bool message_due(const struct rs_v_ud *ud, uint64_t now)
{
    for (const struct rs_v_msg *m = ud->age_head; m; m = m->next) {
        if (m->state == RS_V_MSG_ACTIVE && m->deadline_ms <= now)
            return true;
    }
    return false;
}

uint64_t rs_v_ud_timers(struct rs_v_qp *qp, uint64_t now)
{
    struct rs_v_ud *ud = qp->ud;
    uint64_t next = 0;
    if (!lock_for_timers(ud, &ud->rx_lock))
        return now + 1;
    /* Before giving a message up, take in what the device already received: on a busy host its next datagrams
     * may be waiting in the internal CQ, and they move the deadline (run_cq takes rx_lock itself). */
    if (message_due(ud, now) && pthread_mutex_trylock(&ud->progress_lock) == 0) {
        pthread_mutex_unlock(&ud->rx_lock);
        ud->backlog = rs_v_ud_run_cq_some(qp, rs_v_now_ms() + RS_V_UD_THREAD_SLICE_MS);
        pthread_mutex_unlock(&ud->progress_lock);
        if (!lock_for_timers(ud, &ud->rx_lock))
            return now + 1;
    }
    struct rs_v_msg *m = ud->age_head;
    while (m) {
        struct rs_v_msg *following = m->next;
        uint64_t due;
        if (m->state == RS_V_MSG_ACTIVE) {
            if (m->deadline_ms <= now) {
                if (m->opcode == RS_VUD_SEND) {
                    struct rs_v_rq *rq = rs_v_qp_rq(qp);
                    pthread_mutex_lock(&rq->lock);
                    finish_recv(rq, m->recv, RS_WC_TIMEOUT, 0, &m->src, false);
                    pthread_mutex_unlock(&rq->lock);
                } else {
                    rs_v_record_report(ud, m, true);
                }
                rs_v_msg_done(ud, m, now);
            }
        } else if (m->done_ms + RS_V_DONE_LINGER_MS <= now) {
            msg_free(ud, m);
            m = following;
            continue;
        }
        due = m->state == RS_V_MSG_ACTIVE ? m->deadline_ms : m->done_ms + RS_V_DONE_LINGER_MS;
        if (!next || due < next)
            next = due;
        m = following;
    }
    pthread_mutex_unlock(&ud->rx_lock);
    if (!lock_for_timers(ud, &ud->tx_lock))
        return next && next < now + 1 ? next : now + 1;
    ud->timer_skips = 0;
    for (struct rs_v_job *job = ud->app_head; job; job = job->next) {
        if (job->kind != RS_V_JOB_READ || job->done)
            continue;
        if (job->deadline_ms <= now) {
            job->status = RS_WC_TIMEOUT;
            job->done = true;
        } else if (!next || job->deadline_ms < next) {
            next = job->deadline_ms;
        }
    }
    rs_v_ud_release(ud);
    pthread_mutex_unlock(&ud->tx_lock);
    return next;
}

/* ---- binding and state ------------------------------------------------------------------------------------ */

static int ud_to_rts(struct rs_v_qp *qp)
{
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = qp->dev->port, .qkey = RS_V_UD_QKEY,
    };
    if (ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
        return -errno;
    attr.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE))
        return -errno;
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = 0;
    if (ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN))
        return -errno;
    return 0;
}

int rs_v_ud_bind(struct rs_rnic_qp *base, const struct sockaddr *local, socklen_t len)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    if (qp->type != RS_QPT_UD || !rs_v_sockaddr_ok(local, len))
        return -EINVAL;
    struct rs_v_ud *ud = qp->ud;
    if (atomic_load(&ud->bound) || atomic_load(&ud->error) || ud->bind_id)
        return -EINVAL;
    struct rdma_event_channel *channel = rs_v_progress_cm_channel(qp->dev);
    if (!channel)
        return -ENODEV;
    struct rdma_cm_id *id;
    if (rdma_create_id(channel, &id, &ud->bind_ref, RDMA_PS_UDP))
        return rs_v_errno_from_rdma(-1);
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr, local, rs_v_sockaddr_len(local));
    int r = 0;
    if (rdma_bind_addr(id, (struct sockaddr *)&addr)) {
        r = rs_v_errno_from_rdma(-1);
        if (r == -ENODEV || r == -EINVAL)
            r = -EADDRNOTAVAIL;
    } else if (id->verbs &&
               ibv_get_device_guid(id->verbs->device) != ibv_get_device_guid(qp->dev->ctx->device)) {
        r = -EADDRNOTAVAIL;
    } else if (rdma_listen(id, 128)) {
        r = rs_v_errno_from_rdma(-1);
    }
    if (r == 0)
        r = ud_to_rts(qp);
    if (r) {
        rdma_destroy_id(id);
        rs_v_rc_modify_state(qp, IBV_QPS_RESET);
        return r;
    }
    struct sockaddr *bound = rdma_get_local_addr(id);
    memcpy(&ud->local, bound, rs_v_sockaddr_len(bound));
    ud->port = ntohs(rdma_get_src_port(id));
    ud->bind_id = id;
    ibv_req_notify_cq(ud->cq, 0);
    ud->notify_armed = true;
    r = rs_v_progress_watch_qp(qp->dev, qp);
    if (r == 0) {
        uint32_t *all = malloc(ud->rcount * sizeof(*all));
        if (!all) {
            r = -ENOMEM;
        } else {
            for (uint32_t i = 0; i < ud->rcount; i++)
                all[i] = i;
            post_receives(ud, all, ud->rcount);
            free(all);
        }
    }
    if (r) {
        rs_v_progress_unwatch_qp(qp->dev, qp);
        ud->bind_id = NULL;
        rdma_destroy_id(id);
        rs_v_rc_modify_state(qp, IBV_QPS_RESET);
        return r;
    }
    /* Pollers of its CQs may now run its progress too. */
    rs_v_cq_add_ud(qp->send_cq, qp);
    if (qp->recv_cq != qp->send_cq)
        rs_v_cq_add_ud(qp->recv_cq, qp);
    atomic_store(&ud->bound, true);
    atomic_store(&qp->state, RS_QPS_RTS);
    return 0;
}

int rs_v_ud_local_addr(const struct rs_rnic_qp *base, struct sockaddr_storage *out)
{
    const struct rs_v_qp *qp = (const struct rs_v_qp *)base;
    if (qp->type != RS_QPT_UD || !atomic_load(&qp->ud->bound))
        return -EINVAL;
    *out = qp->ud->local;
    return 0;
}

int rs_v_ud_post_recv(struct rs_v_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    if (qp->srq) {
        *bad_wr = wr;
        return -EINVAL;
    }
    int r = rs_v_rq_post(&qp->own_rq, qp->dev, wr, bad_wr);
    if (atomic_load(&qp->ud->error)) {
        pthread_mutex_lock(&qp->own_rq.lock);
        rs_v_rq_flush(&qp->own_rq, qp, true);
        pthread_mutex_unlock(&qp->own_rq.lock);
    }
    return r;
}

void rs_v_ud_set_error(struct rs_v_qp *qp)
{
    struct rs_v_ud *ud = qp->ud;
    if (atomic_exchange(&ud->error, true))
        return;
    atomic_store(&qp->state, RS_QPS_ERROR);
    rs_v_rc_modify_state(qp, IBV_QPS_ERR);
    pthread_mutex_lock(&ud->tx_lock);
    /* Every outstanding request completes flushed, in order, now; jobs with datagrams still in the device stay
     * until those come back. */
    for (struct rs_v_job *job = ud->app_head; job; job = job->next) {
        if (!job->reported) {
            job->status = RS_WC_WR_FLUSH_ERR;
            rs_v_send_completion(ud, job);
            job->reported = true;
        }
        job->ndgrams = job->posted;
        job->done = true;
    }
    for (struct rs_v_job *job = ud->resp_head; job; job = job->next)
        job->ndgrams = job->posted;
    rs_v_ud_release(ud);
    pthread_mutex_unlock(&ud->tx_lock);
    pthread_mutex_lock(&ud->rx_lock);
    struct rs_v_rq *rq = rs_v_qp_rq(qp);
    pthread_mutex_lock(&rq->lock);
    for (struct rs_v_msg *m = ud->age_head; m; m = m->next) {
        if (m->state == RS_V_MSG_ACTIVE)
            rs_v_msg_done(ud, m, rs_v_now_ms());
    }
    rs_v_rq_flush(rq, qp, !qp->srq);
    pthread_mutex_unlock(&rq->lock);
    pthread_mutex_unlock(&ud->rx_lock);
}

void rs_v_ud_qos_changed(struct rs_v_qp *qp)
{
    atomic_fetch_add(&qp->ud->qos_gen, 1);
}

static void mcast_leave_all(struct rs_v_ud *ud);

void rs_v_ud_destroy(struct rs_v_qp *qp)
{
    struct rs_v_ud *ud = qp->ud;
    rs_v_progress_unwatch_qp(qp->dev, qp);
    if (atomic_load(&ud->bound)) {
        rs_v_cq_remove_ud(qp->send_cq, qp);
        if (qp->recv_cq != qp->send_cq)
            rs_v_cq_remove_ud(qp->recv_cq, qp);
    }
    rs_v_ud_set_error(qp);
    mcast_leave_all(ud);
    if (ud->bind_id)
        rdma_destroy_id(ud->bind_id);
    if (qp->qp) {
        ibv_destroy_qp(qp->qp);
        qp->qp = NULL;
    }
    ibv_destroy_cq(ud->cq);
    ibv_dereg_mr(ud->rmr);
    ibv_dereg_mr(ud->smr);
    for (struct rs_v_job *job = ud->app_head; job;) {
        struct rs_v_job *next = job->next;
        rs_v_job_free(job);
        job = next;
    }
    for (struct rs_v_job *job = ud->resp_head; job;) {
        struct rs_v_job *next = job->next;
        rs_v_job_free(job);
        job = next;
    }
    while (ud->age_head)
        msg_free(ud, ud->age_head);
    rs_v_record_stage_cleanup(ud);
    pthread_mutex_destroy(&ud->progress_lock);
    pthread_mutex_destroy(&ud->tx_lock);
    pthread_mutex_destroy(&ud->rx_lock);
    pthread_mutex_destroy(&ud->mc_lock);
    pthread_cond_destroy(&ud->mc_cond);
    free(ud->rbuf);
    free(ud->sbuf);
    free(ud->buckets);
    free(ud->sjob);
    free(ud->sfree);
    free(ud->sposted);
    free(ud->ssge);
    free(ud);
    qp->ud = NULL;
}

/* ---- SIDR answers (progress thread) ----------------------------------------------------------------------- */

static void mcast_event(struct rs_v_qp *qp, struct rdma_cm_event *e);

void rs_v_ud_cm_event(struct rs_v_qp *qp, struct rdma_cm_event *e)
{
    RS_DEBUG("verbs: UD QP %u: %s (status %d)", qp->qp ? qp->qp->qp_num : 0, rdma_event_str(e->event), e->status);
    if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        mcast_event(qp, e);
        return;
    }
    struct rs_v_ud *ud = qp->ud;
    /* A QP in ERROR still answers: what is sent to it is dropped, as by any UD QP that stopped listening. */
    if (!ud || !atomic_load(&ud->bound)) {
        rdma_reject(e->id, NULL, 0);
        return;
    }
    struct rdma_conn_param param;
    memset(&param, 0, sizeof(param));
    /* The Q_Key in the answer is rdma_cm's own for the UDP port space, RDMA_UDP_QKEY, which our QPs use. */
    param.qp_num = qp->qp->qp_num;
    if (rdma_accept(e->id, &param))
        RS_DEBUG("verbs: SIDR answer failed: %d", errno);
}

/* A specific local address of the group's family to join or send from (port 0); false for none or a wildcard. */
static bool specific_source(const struct sockaddr *cand, int family, struct sockaddr_storage *out)
{
    if (!cand || cand->sa_family != family)
        return false;
    memset(out, 0, sizeof(*out));
    memcpy(out, cand, rs_v_sockaddr_len(cand));
    if (family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)out;
        sin->sin_port = 0;
        return sin->sin_addr.s_addr != htonl(INADDR_ANY);
    }
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)out;
    sin6->sin6_port = 0;
    return !IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr);
}

static bool is_group(const struct sockaddr *addr)
{
    if (addr->sa_family == AF_INET)
        return IN_MULTICAST(ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr));
    if (addr->sa_family == AF_INET6)
        return IN6_IS_ADDR_MULTICAST(&((const struct sockaddr_in6 *)addr)->sin6_addr);
    return false;
}

/* ---- peers ------------------------------------------------------------------------------------------------ */

static void peer_free_now(struct rs_v_peer *peer)
{
    if (peer->ah)
        ibv_destroy_ah(peer->ah);
    if (peer->cm)
        rs_v_cm_put(peer->cm);
    free(peer);
}

void rs_v_peer_put(struct rs_v_peer *peer)
{
    if (atomic_fetch_sub(&peer->refs, 1) == 1)
        peer_free_now(peer);
}

static int make_ah(struct rs_v_peer *peer)
{
    struct rs_v_qp *qp = peer->qp;
    struct ibv_ah_attr attr = peer->ah_attr;
    struct rs_rnic_qos qos = peer->own_qos ? peer->qos : qp->qos;
    attr.sl = qos.sl;
    if (attr.is_global)
        attr.grh.traffic_class = qos.tclass;
    struct ibv_ah *ah = ibv_create_ah(qp->pd->pd, &attr);
    if (!ah)
        return errno ? -errno : -ENOMEM;
    if (peer->ah)
        ibv_destroy_ah(peer->ah);
    peer->ah = ah;
    return 0;
}

/* A peer this QP may send to now (tx_lock held): resolved, same PD, AH current with the QP's QoS. */
static bool peer_ready_for(struct rs_v_ud *ud, struct rs_v_peer *peer)
{
    if (peer->base.rnic != ud->qp->base.rnic || atomic_load(&peer->state) != RS_V_PEER_READY || peer->freed)
        return false;
    if (peer->qp->pd != ud->qp->pd)
        return false;
    uint32_t gen = atomic_load(&ud->qos_gen);
    if (!peer->own_qos && peer->qp == ud->qp && peer->ah_qos_gen != gen) {
        if (make_ah(peer))
            return false;
        peer->ah_qos_gen = gen;
    }
    return true;
}

int rs_v_ud_resolve_peer(struct rs_rnic_qp *base, struct rs_rnic_cm *cm_base, const struct sockaddr *addr,
                         const struct rs_rnic_qos *qos, uint32_t timeout_ms, void *context,
                         struct rs_rnic_ud_peer **out)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    struct rs_v_cm *cm = rs_v_cm(cm_base);
    if (qp->type != RS_QPT_UD || !out || !addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return -EINVAL;
    if (qos && qos->sl > 15)
        return -EINVAL;
    struct rs_v_ud *ud = qp->ud;
    if (!atomic_load(&ud->bound))
        return -EINVAL;
    bool multicast = is_group(addr);
    struct rs_v_peer *peer = calloc(1, sizeof(*peer));
    if (!peer)
        return -ENOMEM;
    peer->base.rnic = base->rnic;
    peer->idref.kind = RS_V_ID_PEER;
    peer->idref.obj = peer;
    peer->qp = qp;
    peer->cm = cm;
    peer->context = context;
    peer->multicast = multicast;
    memcpy(&peer->addr, addr, rs_v_sockaddr_len(addr));
    if (qos) {
        peer->qos = *qos;
        peer->own_qos = true;
    }
    atomic_init(&peer->refs, 1);
    atomic_init(&peer->state, RS_V_PEER_RESOLVING);
    struct rdma_cm_id *id;
    if (rdma_create_id(cm->channel, &id, &peer->idref, RDMA_PS_UDP)) {
        int err = rs_v_errno_from_rdma(-1);
        free(peer);
        return err;
    }
    struct rs_rnic_qos effective = peer->own_qos ? peer->qos : qp->qos;
    if (effective.tclass) {
        uint8_t tos = effective.tclass;
        rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos));
    }
    struct sockaddr_storage src = ud->local, dst;
    memset(&dst, 0, sizeof(dst));
    memcpy(&dst, addr, rs_v_sockaddr_len(addr));
    bool have_src = src.ss_family == addr->sa_family;
    if (have_src) {
        if (src.ss_family == AF_INET) {
            struct sockaddr_in *sin = (struct sockaddr_in *)&src;
            sin->sin_port = 0;
            have_src = sin->sin_addr.s_addr != htonl(INADDR_ANY);
        } else {
            struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&src;
            sin6->sin6_port = 0;
            have_src = !IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr);
        }
    }
    /* A group has no route to follow back to a device: a wildcard QP sends from the device's address. */
    if (!have_src && multicast)
        have_src = specific_source((const struct sockaddr *)&qp->dev->addr, addr->sa_family, &src);
    uint32_t timeout = timeout_ms ? timeout_ms : 2000;
    /* Everything the progress thread looks at is in place before the kernel can answer. */
    peer->id = id;
    peer->deadline_ms = rs_v_now_ms() + timeout;
    rs_v_cm_get(cm);
    rs_v_cm_add_pending(cm, RS_V_PENDING_PEER, NULL, peer, peer->deadline_ms);
    if (rdma_resolve_addr(id, have_src ? (struct sockaddr *)&src : NULL, (struct sockaddr *)&dst, (int)timeout)) {
        int err = rs_v_errno_from_rdma(-1);
        rs_v_cm_remove_pending(cm, NULL, peer);
        peer->id = NULL;
        rdma_destroy_id(id);
        rs_v_cm_put(cm);
        free(peer);
        return err;
    }
    *out = &peer->base;
    return 0;
}

/* A peer that is a group: a send-only join gives the group's address handle without making this host a member
 * (on RoCEv2 no IGMP report); kernels without send-only joins get a full join instead. The id, and with it the
 * membership, goes once the address handle exists: the AH does not depend on it. */
static int join_to_send(struct rs_v_peer *peer, struct rdma_cm_id *id)
{
    struct rdma_cm_join_mc_attr_ex attr;
    memset(&attr, 0, sizeof(attr));
    attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    attr.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
    attr.addr = (struct sockaddr *)&peer->addr;
    if (rdma_join_multicast_ex(id, &attr, peer) == 0)
        return 0;
    int err = rs_v_errno_from_rdma(-1);
    RS_DEBUG("verbs: peer %p: send-only join refused (%d), joining fully", (void *)peer, err);
    if (rdma_join_multicast(id, (struct sockaddr *)&peer->addr, peer) == 0)
        return 0;
    return rs_v_errno_from_rdma(-1);
}

static void peer_event_out(struct rs_v_peer *peer, enum rs_rnic_cm_event_type type, int error,
                           struct rs_rnic_cm_event *out)
{
    memset(out, 0, sizeof(*out));
    out->type = type;
    out->qp = &peer->qp->base;
    out->ud_peer = &peer->base;
    out->context = peer->context;
    out->error = error;
    out->peer = peer->addr;
}

bool rs_v_ud_peer_event(struct rs_v_peer *peer, struct rdma_cm_event *e, struct rs_rnic_cm_event *out,
                        struct rdma_cm_id **destroy)
{
    RS_DEBUG("verbs: peer %p: %s (status %d)", (void *)peer, rdma_event_str(e->event), e->status);
    if (atomic_load(&peer->state) != RS_V_PEER_RESOLVING || e->id != peer->id)
        return false;
    int err = 0;
    uint64_t now = rs_v_now_ms();
    int left = peer->deadline_ms > now ? (int)(peer->deadline_ms - now) : 1;
    switch (e->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (e->id->verbs &&
            ibv_get_device_guid(e->id->verbs->device) != ibv_get_device_guid(peer->qp->dev->ctx->device)) {
            err = -ENODEV;
            break;
        }
        if (peer->multicast) {
            err = join_to_send(peer, e->id);
            if (!err)
                return false;
            break;
        }
        if (rdma_resolve_route(e->id, left))
            err = rs_v_errno_from_rdma(-1);
        else {
            RS_DEBUG("verbs: peer %p: resolving the route (%d ms)", (void *)peer, left);
            return false;
        }
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        struct rdma_conn_param param;
        memset(&param, 0, sizeof(param));
        if (rdma_connect(e->id, &param))
            err = rs_v_errno_from_rdma(-1);
        else
            return false;
        break;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
    case RDMA_CM_EVENT_MULTICAST_JOIN:
        if ((e->event == RDMA_CM_EVENT_MULTICAST_JOIN) != peer->multicast)
            return false;
        peer->ah_attr = e->param.ud.ah_attr;
        /* A group is addressed with the multicast QPN whatever the join said. */
        peer->remote_qpn = peer->multicast ? 0xffffffu : e->param.ud.qp_num;
        peer->remote_qkey = e->param.ud.qkey;
        peer->ah_qos_gen = atomic_load(&peer->qp->ud->qos_gen);
        err = make_ah(peer);
        if (err)
            break;
        atomic_store(&peer->state, RS_V_PEER_READY);
        *destroy = peer->id;
        peer->id = NULL;
        peer_event_out(peer, RS_RNIC_CM_EV_UD_PEER_RESOLVED, 0, out);
        return true;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_MULTICAST_ERROR:
        err = e->status < 0 ? e->status : -EHOSTUNREACH;
        break;
    default:
        return false;
    }
    atomic_store(&peer->state, RS_V_PEER_FAILED);
    *destroy = peer->id;
    peer->id = NULL;
    peer_event_out(peer, RS_RNIC_CM_EV_UD_PEER_UNREACHABLE, err, out);
    return true;
}

void rs_v_ud_peer_timeout(struct rs_v_peer *peer, struct rs_rnic_cm_event *out)
{
    if (atomic_load(&peer->state) != RS_V_PEER_RESOLVING)
        return;
    atomic_store(&peer->state, RS_V_PEER_FAILED);
    if (peer->id) {
        rdma_destroy_id(peer->id);
        peer->id = NULL;
    }
    peer_event_out(peer, RS_RNIC_CM_EV_UD_PEER_UNREACHABLE, -ETIMEDOUT, out);
}

void rs_v_ud_peer_free(struct rs_rnic_ud_peer *base)
{
    struct rs_v_peer *peer = (struct rs_v_peer *)base;
    if (peer->id) {
        rs_v_cm_remove_pending(peer->cm, NULL, peer);
        rdma_destroy_id(peer->id);
        peer->id = NULL;
    }
    peer->freed = true;
    rs_v_peer_put(peer);
}

int rs_v_ud_counters(const struct rs_rnic_qp *base, struct rs_rnic_ud_counters *out)
{
    const struct rs_v_qp *qp = (const struct rs_v_qp *)base;
    if (qp->type != RS_QPT_UD || !qp->ud)
        return -EINVAL;
    memset(out, 0, sizeof(*out));
    /* Read without the receive lock: each is one word the progress path only increments. */
    out->rx_no_recv = __atomic_load_n(&qp->ud->dropped, __ATOMIC_RELAXED);
    out->rx_refused = __atomic_load_n(&qp->ud->refused, __ATOMIC_RELAXED);
    out->rx_no_room = __atomic_load_n(&qp->ud->no_room, __ATOMIC_RELAXED);
    out->thread_wakeups = __atomic_load_n(&qp->ud->wakeups, __ATOMIC_RELAXED);
    return 0;
}

/* ---- multicast -------------------------------------------------------------------------------------------- */

static bool same_group(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                  sizeof(struct in6_addr)) == 0;
}

static struct rs_v_mcast *find_group(struct rs_v_ud *ud, const struct sockaddr *group)
{
    for (struct rs_v_mcast *m = ud->mcast; m; m = m->next) {
        if (same_group(&m->group, group))
            return m;
    }
    return NULL;
}

static void unlink_group(struct rs_v_ud *ud, struct rs_v_mcast *m)
{
    struct rs_v_mcast **link = &ud->mcast;
    while (*link && *link != m)
        link = &(*link)->next;
    if (*link)
        *link = m->next;
}

/* Detaches the QP and leaves; never with mc_lock held: rdma_leave_multicast and rdma_destroy_id wait until the
 * progress thread has acknowledged the id's events, and its handler takes mc_lock. */
static int release_group(struct rs_v_qp *qp, struct rs_v_mcast *m, bool orderly)
{
    int r = 0;
    if (m->attached && qp->qp && ibv_detach_mcast(qp->qp, &m->ah_attr.grh.dgid, m->ah_attr.dlid))
        r = errno ? -errno : -EIO;
    if (orderly && m->join_sent && rdma_leave_multicast(m->id, (struct sockaddr *)&m->group) && !r)
        r = rs_v_errno_from_rdma(-1);
    rdma_destroy_id(m->id);
    free(m);
    return r;
}

static void mcast_leave_all(struct rs_v_ud *ud)
{
    pthread_mutex_lock(&ud->mc_lock);
    struct rs_v_mcast *m = ud->mcast;
    ud->mcast = NULL;
    pthread_mutex_unlock(&ud->mc_lock);
    while (m) {
        struct rs_v_mcast *next = m->next;
        release_group(ud->qp, m, true);
        m = next;
    }
}

/* The join's steps, on the progress thread: address resolved -> rdma_join_multicast -> joined -> attach. */
static void mcast_event(struct rs_v_qp *qp, struct rdma_cm_event *e)
{
    struct rs_v_ud *ud = qp->ud;
    if (!ud)
        return;
    pthread_mutex_lock(&ud->mc_lock);
    struct rs_v_mcast *m = ud->mcast;
    while (m && m->id != e->id)
        m = m->next;
    if (!m) {
        pthread_mutex_unlock(&ud->mc_lock);
        return;
    }
    int err = 0;
    switch (e->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (m->state != RS_V_MC_RESOLVING)
            break;
        if (e->id->verbs && ibv_get_device_guid(e->id->verbs->device) != ibv_get_device_guid(qp->dev->ctx->device))
            err = -ENODEV;      /* the group is reached through another device */
        else if (rdma_join_multicast(e->id, (struct sockaddr *)&m->group, m))
            err = rs_v_errno_from_rdma(-1);
        else {
            m->join_sent = true;
            m->state = RS_V_MC_JOINING;
        }
        break;
    case RDMA_CM_EVENT_MULTICAST_JOIN:
        if (m->state != RS_V_MC_JOINING)
            break;
        m->ah_attr = e->param.ud.ah_attr;
        m->remote_qpn = e->param.ud.qp_num;
        m->qkey = e->param.ud.qkey;
        if (ibv_attach_mcast(qp->qp, &m->ah_attr.grh.dgid, m->ah_attr.dlid)) {
            err = errno ? -errno : -EIO;
            break;
        }
        m->attached = true;
        m->state = RS_V_MC_JOINED;
        if (m->qkey != RS_V_UD_QKEY)
            RS_WARN("verbs: multicast group Q_Key 0x%x is not the UD QPs' 0x%x", m->qkey, RS_V_UD_QKEY);
        RS_DEBUG("verbs: UD QP %u joined a group (MLID 0x%x, Q_Key 0x%x)", qp->qp->qp_num, m->ah_attr.dlid, m->qkey);
        break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_MULTICAST_ERROR:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        if (m->state == RS_V_MC_JOINED) {
            /* Nothing to tell: rnic.h has no event for a lost group; the QP simply stops hearing it. */
            RS_WARN("verbs: UD QP %u: multicast group lost (%s, status %d)", qp->qp->qp_num,
                    rdma_event_str(e->event), e->status);
            break;
        }
        err = e->event == RDMA_CM_EVENT_DEVICE_REMOVAL ? -ENODEV : e->status < 0 ? e->status : -ENETUNREACH;
        break;
    default:
        break;
    }
    if (err && m->state != RS_V_MC_JOINED) {
        m->state = RS_V_MC_FAILED;
        m->error = err;
    }
    pthread_cond_broadcast(&ud->mc_cond);
    pthread_mutex_unlock(&ud->mc_lock);
}

int rs_v_ud_join_multicast(struct rs_rnic_qp *base, const struct sockaddr *group, const struct sockaddr *iface)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    if (qp->type != RS_QPT_UD || !group || !is_group(group))
        return -EINVAL;
    struct rs_v_ud *ud = qp->ud;
    if (!atomic_load(&ud->bound) || atomic_load(&ud->error))
        return -EINVAL;
    /* The join is finished by the progress thread: waiting for it there would wait for ourselves. */
    if (rs_v_on_progress_thread(qp->dev))
        return -EDEADLK;
    struct rdma_event_channel *channel = rs_v_progress_cm_channel(qp->dev);
    if (!channel)
        return -ENODEV;
    struct rs_v_mcast *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->ref.kind = RS_V_ID_UDBIND;
    m->ref.obj = qp;
    memcpy(&m->group, group, rs_v_sockaddr_len(group));
    /* Out of the interface asked for, else the QP's own address, else the device's: a wildcard source leaves the
     * choice to the routing table, which may have no multicast route at all. */
    if (!specific_source(iface, group->sa_family, &m->src) &&
        !specific_source((const struct sockaddr *)&ud->local, group->sa_family, &m->src) &&
        !specific_source((const struct sockaddr *)&qp->dev->addr, group->sa_family, &m->src))
        m->src.ss_family = AF_UNSPEC;
    if (rdma_create_id(channel, &m->id, &m->ref, RDMA_PS_UDP)) {
        int err = rs_v_errno_from_rdma(-1);
        free(m);
        return err;
    }
    m->state = RS_V_MC_RESOLVING;
    pthread_mutex_lock(&ud->mc_lock);
    if (find_group(ud, group)) {
        pthread_mutex_unlock(&ud->mc_lock);
        rdma_destroy_id(m->id);
        free(m);
        return -EADDRINUSE;     /* as IP_ADD_MEMBERSHIP twice */
    }
    /* In the list before the kernel can answer: the progress thread finds the group by its id. */
    m->next = ud->mcast;
    ud->mcast = m;
    pthread_mutex_unlock(&ud->mc_lock);
    uint64_t deadline = rs_v_now_ms() + RS_V_MC_JOIN_TIMEOUT_MS;
    int r = 0;
    struct sockaddr_storage dst;
    memset(&dst, 0, sizeof(dst));
    memcpy(&dst, group, rs_v_sockaddr_len(group));
    if (rdma_resolve_addr(m->id, m->src.ss_family == AF_UNSPEC ? NULL : (struct sockaddr *)&m->src,
                          (struct sockaddr *)&dst, (int)RS_V_MC_JOIN_TIMEOUT_MS)) {
        r = rs_v_errno_from_rdma(-1);
        if (r == -ENODEV || r == -EINVAL)
            r = -EADDRNOTAVAIL;     /* an interface address that is not ours (or not on an RDMA device) */
    }
    struct timespec until = { .tv_sec = (time_t)(deadline / 1000), .tv_nsec = (long)(deadline % 1000) * 1000000 };
    pthread_mutex_lock(&ud->mc_lock);
    while (r == 0 && m->state != RS_V_MC_JOINED && m->state != RS_V_MC_FAILED) {
        if (pthread_cond_timedwait(&ud->mc_cond, &ud->mc_lock, &until) == ETIMEDOUT &&
            m->state != RS_V_MC_JOINED && m->state != RS_V_MC_FAILED)
            r = -ETIMEDOUT;
    }
    if (r == 0 && m->state == RS_V_MC_FAILED)
        r = m->error;
    if (r)
        unlink_group(ud, m);
    pthread_mutex_unlock(&ud->mc_lock);
    if (r) {
        RS_DEBUG("verbs: UD QP %u: multicast join failed: %d", qp->qp->qp_num, r);
        release_group(qp, m, false);
    }
    return r;
}

int rs_v_ud_leave_multicast(struct rs_rnic_qp *base, const struct sockaddr *group)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    if (qp->type != RS_QPT_UD || !group || !qp->ud)
        return -EINVAL;
    struct rs_v_ud *ud = qp->ud;
    pthread_mutex_lock(&ud->mc_lock);
    struct rs_v_mcast *m = ud->mcast;
    /* A join still under way belongs to the thread waiting for it. */
    while (m && !(m->state == RS_V_MC_JOINED && same_group(&m->group, group)))
        m = m->next;
    if (m)
        unlink_group(ud, m);
    pthread_mutex_unlock(&ud->mc_lock);
    if (!m)
        return -ENOENT;
    return release_group(qp, m, true);
}
