/*
 * cq.c: completion queues.
 *
 * RC completions come straight from the device CQ (kernel bypass: ibv_poll_cq, no system call). What the
 * provider completes itself (UD datagrams, which the progress thread turns into SEND/RECV/WRITE_RECORD/READ
 * completions, and completions saved from a QP being destroyed) waits in a software ring in front of it.
 *
 * The notification fd is an epoll set of the device's completion channel and an eventfd for the ring, so one
 * fd wakes for both. Arming arms both: ibv_req_notify_cq for the device, a flag for the ring.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rnic/verbs/verbs.h"
#include "common/compiler.h"
#include "common/fdutil.h"

#define POLL_BATCH 16

/* What a completion asks the provider to do once the CQ lock is released. */
struct cq_action {
    struct rs_v_qp *qp;
    enum rs_rnic_wc_status status;  /* not SUCCESS: the QP failed (or flushed) */
    bool invalidate;
    uint32_t rkey;
};

enum rs_rnic_wc_status rs_v_wc_status(enum ibv_wc_status status, bool receive)
{
    switch (status) {
    case IBV_WC_SUCCESS: return RS_WC_SUCCESS;
    case IBV_WC_LOC_LEN_ERR: return RS_WC_LOC_LEN_ERR;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
    case IBV_WC_MW_BIND_ERR: return RS_WC_LOC_PROT_ERR;
    case IBV_WC_REM_ACCESS_ERR: return RS_WC_REM_ACCESS_ERR;
    /* rxe completes a receive that was too small with "remote invalid request" (the NAK it sent); for the
     * receiver that is a local length error. */
    case IBV_WC_REM_INV_REQ_ERR: return receive ? RS_WC_LOC_LEN_ERR : RS_WC_REM_INV_REQ_ERR;
    /* rxe 6.1 reports a SEND longer than the receive as a malformed receive WQE (copy_data says -EINVAL, not
     * -ENOSPC); our receive WQEs are checked before posting, so on a receive this can only be the length. */
    case IBV_WC_LOC_QP_OP_ERR: return receive ? RS_WC_LOC_LEN_ERR : RS_WC_GENERAL_ERR;
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_OP_ERR: return RS_WC_REM_INV_REQ_ERR;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR: return RS_WC_RETRY_EXC_ERR;
    case IBV_WC_WR_FLUSH_ERR: return RS_WC_WR_FLUSH_ERR;
    default: return RS_WC_GENERAL_ERR;
    }
}

int rs_v_create_cq(struct rs_rnic *rnic, uint32_t depth, struct rs_rnic_cq **out)
{
    struct rs_v_dev *dev = rs_v_dev(rnic);
    if (depth == 0 || depth > rnic->caps.max_cqe)
        return -EINVAL;
    int r = rs_v_progress_start(dev);
    if (r)
        return r;
    struct rs_v_cq *cq = calloc(1, sizeof(*cq));
    if (!cq)
        return -ENOMEM;
    cq->event_fd = cq->poll_fd = -1;
    cq->ring = calloc(depth, sizeof(*cq->ring));
    if (!cq->ring)
        goto nomem;
    cq->depth = depth;
    cq->channel = ibv_create_comp_channel(dev->ctx);
    if (!cq->channel)
        goto fail;
    /* Before the CQ names the channel: the kernel finds the channel's file through whichever fd refers to it. */
    cq->channel->fd = rs_fd_move_high(cq->channel->fd);
    fcntl(cq->channel->fd, F_SETFL, fcntl(cq->channel->fd, F_GETFL) | O_NONBLOCK);
    cq->cq = ibv_create_cq(dev->ctx, (int)depth, cq, cq->channel, 0);
    if (!cq->cq)
        goto fail;
    cq->event_fd = rs_fd_move_high(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    cq->poll_fd = rs_fd_move_high(epoll_create1(EPOLL_CLOEXEC));
    if (cq->event_fd < 0 || cq->poll_fd < 0)
        goto fail;
    struct epoll_event ev = { .events = EPOLLIN };
    ev.data.fd = cq->channel->fd;
    if (epoll_ctl(cq->poll_fd, EPOLL_CTL_ADD, cq->channel->fd, &ev))
        goto fail;
    ev.data.fd = cq->event_fd;
    if (epoll_ctl(cq->poll_fd, EPOLL_CTL_ADD, cq->event_fd, &ev))
        goto fail;
    rs_lock_init(&cq->lock);
    pthread_mutex_init(&cq->ud_lock, NULL);
    atomic_init(&cq->overflow, false);
    cq->base.rnic = rnic;
    rs_v_dev_get(dev);
    *out = &cq->base;
    return 0;
fail:
    r = errno ? -errno : -ENOMEM;
    if (cq->poll_fd >= 0)
        close(cq->poll_fd);
    if (cq->event_fd >= 0)
        close(cq->event_fd);
    if (cq->cq)
        ibv_destroy_cq(cq->cq);
    if (cq->channel)
        ibv_destroy_comp_channel(cq->channel);
    free(cq->ring);
    free(cq);
    return r;
nomem:
    free(cq);
    return -ENOMEM;
}

int rs_v_destroy_cq(struct rs_rnic_cq *base)
{
    struct rs_v_cq *cq = rs_v_cq(base);
    struct rs_v_dev *dev = rs_v_dev(base->rnic);
    pthread_mutex_lock(&dev->lock);
    bool busy = cq->nqps > 0;
    pthread_mutex_unlock(&dev->lock);
    if (busy)
        return -EBUSY;
    rs_v_progress_forget_cq(dev, cq);
    rs_v_cq_ack_events(base);
    if (cq->unacked_events)
        ibv_ack_cq_events(cq->cq, cq->unacked_events);
    if (ibv_destroy_cq(cq->cq))
        return -EBUSY;
    ibv_destroy_comp_channel(cq->channel);
    close(cq->poll_fd);
    close(cq->event_fd);
    pthread_mutex_destroy(&cq->ud_lock);
    free(cq->ud_qps);
    free(cq->qps);
    free(cq->ring);
    free(cq);
    rs_v_dev_put(dev);
    return 0;
}

int rs_v_cq_fd(const struct rs_rnic_cq *base)
{
    return ((const struct rs_v_cq *)base)->poll_fd;
}

static void wake(struct rs_v_cq *cq)
{
    /* Announced before the write: an ack in between finds nothing to read and leaves the count for the next one,
     * and a readable fd is always announced, so an ack never leaves it readable. */
    atomic_fetch_add(&cq->event_fd_pending, 1);
    uint64_t one = 1;
    ssize_t w = write(cq->event_fd, &one, sizeof(one));
    (void)w;
}

int rs_v_cq_arm(struct rs_rnic_cq *base, bool solicited_only)
{
    struct rs_v_cq *cq = rs_v_cq(base);
    rs_lock(&cq->lock);
    int want = solicited_only ? 2 : 1;
    /* Each arm of the device CQ is a system call on rxe (and on most devices), and every waiter arms before it
     * sleeps: skip it while the device is armed at least as widely. An arm that already fired, its event not yet
     * read, leaves the fd readable, so a waiter relying on it is woken all the same. */
    if (cq->armed != 1)
        cq->armed = want;
    int r = 0;
    if (cq->hw_armed != 1 && cq->hw_armed != want) {
        r = ibv_req_notify_cq(cq->cq, solicited_only ? 1 : 0);
        if (r == 0)
            cq->hw_armed = want;
    }
    rs_unlock(&cq->lock);
    /* The UD QPs completing here may have been left to polling callers; this one is about to sleep. */
    if (__atomic_load_n(&cq->nud, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&cq->ud_lock);
        for (uint32_t i = 0; i < cq->nud; i++)
            rs_v_ud_app_waits(cq->ud_qps[i]);
        pthread_mutex_unlock(&cq->ud_lock);
    }
    return r ? -r : 0;
}

void rs_v_cq_ack_events(struct rs_rnic_cq *base)
{
    struct rs_v_cq *cq = rs_v_cq(base);
    rs_lock(&cq->lock);
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    /* One event per arm: none to read while the device is not armed (each attempt is a system call). */
    if (cq->hw_armed && ibv_get_cq_event(cq->channel, &ev_cq, &ev_ctx) == 0) {
        cq->unacked_events++;
        cq->hw_armed = 0;
    }
    /* Acknowledging is a system call with a lock in the kernel; batch it. */
    if (cq->unacked_events) {
        ibv_ack_cq_events(cq->cq, cq->unacked_events);
        cq->unacked_events = 0;
    }
    if (atomic_load(&cq->event_fd_pending) > 0) {
        uint64_t count;
        if (read(cq->event_fd, &count, sizeof(count)) == (ssize_t)sizeof(count))
            atomic_fetch_sub(&cq->event_fd_pending, (unsigned)count);
    }
    rs_unlock(&cq->lock);
}

bool rs_v_cq_room(struct rs_v_cq *cq, uint32_t reserved)
{
    rs_lock(&cq->lock);
    bool room = !atomic_load(&cq->overflow) && cq->depth - cq->count > reserved;
    rs_unlock(&cq->lock);
    return room;
}

bool rs_v_cq_push(struct rs_v_cq *cq, const struct rs_rnic_wc *wc)
{
    rs_lock(&cq->lock);
    if (atomic_load(&cq->overflow)) {
        rs_unlock(&cq->lock);
        return false;
    }
    if (cq->count == cq->depth) {
        atomic_store(&cq->overflow, true);
        rs_unlock(&cq->lock);
        wake(cq);
        /* The QPs attached go to ERROR on the progress thread: the caller may hold a QP's locks. */
        rs_v_progress_overflow(rs_v_dev(cq->base.rnic), cq);
        return false;
    }
    cq->ring[(cq->head + cq->count) % cq->depth] = *wc;
    cq->count++;
    bool notify = cq->armed == 1 ||
                  (cq->armed == 2 && ((wc->flags & RS_WC_SOLICITED) || wc->status != RS_WC_SUCCESS));
    if (notify)
        cq->armed = 0;
    rs_unlock(&cq->lock);
    if (notify)
        wake(cq);
    return true;
}

void rs_v_cq_attach(struct rs_v_cq *cq, struct rs_v_qp *qp)
{
    /* dev->lock held by the caller */
    for (uint32_t i = 0; i < cq->nqps; i++) {
        if (cq->qps[i] == qp)
            return;
    }
    if (cq->nqps == cq->qps_cap) {
        uint32_t cap = cq->qps_cap ? cq->qps_cap * 2 : 8;
        struct rs_v_qp **qps = realloc(cq->qps, cap * sizeof(*qps));
        if (!qps)
            return;     /* only overflow handling uses the list; creation already succeeded */
        cq->qps = qps;
        cq->qps_cap = cap;
    }
    cq->qps[cq->nqps++] = qp;
}

void rs_v_cq_detach(struct rs_v_cq *cq, struct rs_v_qp *qp)
{
    for (uint32_t i = 0; i < cq->nqps; i++) {
        if (cq->qps[i] == qp) {
            cq->qps[i] = cq->qps[--cq->nqps];
            return;
        }
    }
}

int rs_v_cq_add_ud(struct rs_v_cq *cq, struct rs_v_qp *qp)
{
    pthread_mutex_lock(&cq->ud_lock);
    int r = 0;
    if (cq->nud == cq->ud_cap) {
        uint32_t cap = cq->ud_cap ? cq->ud_cap * 2 : 4;
        struct rs_v_qp **qps = realloc(cq->ud_qps, cap * sizeof(*qps));
        if (qps) {
            cq->ud_qps = qps;
            cq->ud_cap = cap;
        } else {
            r = -ENOMEM;
        }
    }
    if (r == 0)
        cq->ud_qps[cq->nud++] = qp;
    pthread_mutex_unlock(&cq->ud_lock);
    return r;
}

void rs_v_cq_remove_ud(struct rs_v_cq *cq, struct rs_v_qp *qp)
{
    /* Waits for a poller that is running this QP's progress right now. */
    pthread_mutex_lock(&cq->ud_lock);
    for (uint32_t i = 0; i < cq->nud; i++) {
        if (cq->ud_qps[i] == qp) {
            cq->ud_qps[i] = cq->ud_qps[--cq->nud];
            break;
        }
    }
    pthread_mutex_unlock(&cq->ud_lock);
}

/* Runs the progress of the UD QPs completing here; true if any is attached. */
static bool inline_progress(struct rs_v_cq *cq)
{
    if (!__atomic_load_n(&cq->nud, __ATOMIC_RELAXED))
        return false;
    pthread_mutex_lock(&cq->ud_lock);
    for (uint32_t i = 0; i < cq->nud; i++)
        rs_v_ud_try_progress(cq->ud_qps[i]);
    pthread_mutex_unlock(&cq->ud_lock);
    return true;
}

void rs_v_cq_overflowed(struct rs_v_cq *cq)
{
    struct rs_v_dev *dev = rs_v_dev(cq->base.rnic);
    atomic_store(&cq->overflow, true);
    wake(cq);
    pthread_mutex_lock(&dev->lock);
    if (cq->overflow_handled) {
        pthread_mutex_unlock(&dev->lock);
        return;
    }
    cq->overflow_handled = true;
    for (uint32_t i = 0; i < cq->nqps; i++) {
        struct rs_v_qp *qp = cq->qps[i];
        if (rs_v_connected(qp))
            rs_v_qp_fail(qp, -EOVERFLOW);
        else
            rs_v_ud_set_error(qp);
    }
    pthread_mutex_unlock(&dev->lock);
}

/* The slot's sequence number, from its index and the queue's tail (at most mask + 1 outstanding). */
static uint32_t slot_seq(const struct rs_v_wq *wq, uint32_t index, uint32_t tail)
{
    return tail + ((index - tail) & wq->mask);
}

/* A receive through an SRQ: its QP, found by number, and its slot back to the SRQ. Out of line: the table lookup's
 * lock and calls would otherwise crowd every poll's registers. */
static RS_NOINLINE struct rs_v_qp *srq_slot_retire(struct rs_v_cq *cq, const struct ibv_wc *w, struct rs_v_slot *slot)
{
    struct rs_v_qp *qp = rs_v_find_qpn(rs_v_dev(cq->base.rnic), w->qp_num);
    rs_v_srq_slot_free(slot->srq, slot);
    return qp;
}

/*
 * Turns one device completion into an rnic.h completion. Returns false when it is the provider's own and must
 * not be shown. Receive completions through an SRQ find their QP by number.
 */
static RS_ALWAYS_INLINE bool convert(struct rs_v_cq *cq, const struct ibv_wc *w, struct rs_rnic_wc *out, struct cq_action *act)
{
    struct rs_v_slot *slot = (struct rs_v_slot *)(uintptr_t)w->wr_id;
    struct rs_v_qp *qp = slot->qp;
    bool receive = slot->opcode == RS_WC_RECV;
    bool shown = !slot->internal;
    /* Field by field rather than a memset of the whole completion (about 200 bytes, most of them the source
     * address and record of datagram completions, which never come this way): this runs for every completion. */
    out->flags = 0;
    out->byte_len = 0;
    out->imm_data = 0;
    out->invalidated_rkey = 0;
    out->src.ss_family = AF_UNSPEC;
    out->src_qpn = 0;
    act->invalidate = false;
    act->rkey = 0;
    out->wr_id = slot->wr_id;
    if (RS_UNLIKELY(slot->srq)) {
        qp = srq_slot_retire(cq, w, slot);
    } else {
        /* Retire the slot and, on the send queue, every unsignaled request before it. */
        struct rs_v_wq *wq = receive ? &qp->rq : &qp->sq;
        uint32_t tail = atomic_load_explicit(&wq->tail, memory_order_relaxed);
        atomic_store_explicit(&wq->tail, slot_seq(wq, slot->index, tail) + 1, memory_order_release);
    }
    out->status = w->status == IBV_WC_SUCCESS ? RS_WC_SUCCESS : rs_v_wc_status(w->status, receive);
    out->qp = qp ? &qp->base : NULL;
    if (receive) {
        out->opcode = RS_WC_RECV;
        out->byte_len = w->byte_len;
        if (w->status == IBV_WC_SUCCESS) {
            if (w->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                out->opcode = RS_WC_RECV_RDMA_WITH_IMM;
                out->flags |= RS_WC_WITH_IMM;
                out->imm_data = ntohl(w->imm_data);
            } else if ((w->wc_flags & IBV_WC_WITH_IMM) && qp && qp->imm_data) {
                out->flags |= RS_WC_WITH_IMM;
                out->imm_data = ntohl(w->imm_data);
            } else if (w->wc_flags & IBV_WC_WITH_IMM) {
                /* Our SEND_WITH_INVALIDATE: the rkey travels as immediate data (see qp.c). */
                out->flags |= RS_WC_WITH_INVALIDATE;
                out->invalidated_rkey = ntohl(w->imm_data);
                act->invalidate = true;
                act->rkey = out->invalidated_rkey;
            } else if (w->wc_flags & IBV_WC_WITH_INV) {
                out->flags |= RS_WC_WITH_INVALIDATE;
                out->invalidated_rkey = w->invalidated_rkey;
            }
        }
    } else {
        out->opcode = slot->opcode;
    }
    act->qp = qp;
    act->status = out->status;
    return shown;
}

/*
 * Converts m device completions into consecutive slots from out (the caller's array, or a contiguous run of the
 * ring) and returns how many are shown; what must run once the lock is released is appended to acts. Inline into
 * each caller, so the common poll keeps its state in registers.
 */
static RS_ALWAYS_INLINE int convert_batch(struct rs_v_cq *cq, const struct ibv_wc *w, int m, struct rs_rnic_wc *out,
                                          struct cq_action *acts, int *nacts)
{
    int shown = 0;
    for (int i = 0; i < m; i++) {
        struct cq_action act;
        if (convert(cq, &w[i], &out[shown], &act))
            shown++;
        if (RS_UNLIKELY(act.status != RS_WC_SUCCESS || act.invalidate))
            acts[(*nacts)++] = act;
    }
    return shown;
}

static void run_actions(struct rs_v_dev *dev, struct cq_action *acts, int n)
{
    for (int i = 0; i < n; i++) {
        struct cq_action *a = &acts[i];
        if (!a->qp)
            continue;
        if (a->invalidate)
            rs_v_mr_invalidate_rkey(dev, a->qp->pd, a->rkey);
        if (a->status != RS_WC_SUCCESS)
            rs_v_qp_completion_error(a->qp, a->status);
    }
}

/* Everything rs_v_poll_cq's common case leaves out: the ring of completions pumped for an armed CQ, the datagram
 * progress, bad arguments, an overflowed CQ, more than one batch. */
static RS_NOINLINE int poll_general(struct rs_rnic_cq *base, int n, struct rs_rnic_wc *wc)
{
    struct rs_v_cq *cq = rs_v_cq(base);
    if (n < 0)
        return -EINVAL;
    if (atomic_load_explicit(&cq->overflow, memory_order_relaxed))
        return -EOVERFLOW;
    if (n == 0)
        return 0;
    /* Nothing waiting in the ring: the datagrams may be waiting for their progress, which we can run. */
    if (!__atomic_load_n(&cq->count, __ATOMIC_RELAXED) && inline_progress(cq) &&
        atomic_load_explicit(&cq->overflow, memory_order_relaxed))
        return -EOVERFLOW;
    struct cq_action acts[POLL_BATCH];
    int nacts = 0, got = 0;
    rs_lock(&cq->lock);
    while (got < n && cq->count) {
        wc[got++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->depth;
        cq->count--;
    }
    while (got < n && nacts == 0) {
        struct ibv_wc w[POLL_BATCH];
        int want = n - got < POLL_BATCH ? n - got : POLL_BATCH;
        int m = ibv_poll_cq(cq->cq, want, w);
        if (m <= 0)
            break;
        got += convert_batch(cq, w, m, &wc[got], acts, &nacts);
        if (m < want)
            break;
    }
    rs_unlock(&cq->lock);
    if (nacts)
        run_actions(rs_v_dev(base->rnic), acts, nacts);
    return got;
}

/*
 * The common case, a busy poller's every call: nothing pumped into the ring, no datagram QP to progress, at most one
 * batch wanted. One look at the device under the lock, as the general path's first, in a function small enough to
 * keep most of its state in registers: the general one's loops spilled theirs to the stack on every poll, hit or
 * miss (a busy-polled 64 B ping-pong over rxe: 176 instructions a round trip in this function before, 143 after).
 */
int rs_v_poll_cq(struct rs_rnic_cq *base, int n, struct rs_rnic_wc *wc)
{
    struct rs_v_cq *cq = rs_v_cq(base);
    if (RS_UNLIKELY(n <= 0 || n > POLL_BATCH || atomic_load_explicit(&cq->overflow, memory_order_relaxed) ||
                    __atomic_load_n(&cq->nud, __ATOMIC_RELAXED)))
        return poll_general(base, n, wc);
    rs_lock(&cq->lock);
    if (RS_UNLIKELY(cq->count)) {
        /* Pumped completions come first: the general path takes them in order. */
        rs_unlock(&cq->lock);
        return poll_general(base, n, wc);
    }
    struct ibv_wc w[POLL_BATCH];
    int m = ibv_poll_cq(cq->cq, n, w);
    int nacts = 0;
    struct cq_action acts[POLL_BATCH];
    int got = convert_batch(cq, w, m, wc, acts, &nacts);
    rs_unlock(&cq->lock);
    if (RS_UNLIKELY(nacts))
        run_actions(rs_v_dev(base->rnic), acts, nacts);
    return got;
}

void rs_v_cq_pump(struct rs_v_cq *cq)
{
    struct cq_action acts[POLL_BATCH];
    for (;;) {
        int nacts = 0;
        rs_lock(&cq->lock);
        struct ibv_wc w[POLL_BATCH];
        /* At most the free run up to the ring's end, so the completions land in consecutive slots. */
        uint32_t tail = (cq->head + cq->count) % cq->depth;
        uint32_t room = cq->depth - cq->count;
        if (room > cq->depth - tail)
            room = cq->depth - tail;
        int want = room < POLL_BATCH ? (int)room : POLL_BATCH;
        int m = want > 0 ? ibv_poll_cq(cq->cq, want, w) : 0;
        if (m > 0)
            cq->count += (uint32_t)convert_batch(cq, w, m, &cq->ring[tail], acts, &nacts);
        rs_unlock(&cq->lock);
        run_actions(rs_v_dev(cq->base.rnic), acts, nacts);
        if (m < want || want == 0)
            return;
    }
}
