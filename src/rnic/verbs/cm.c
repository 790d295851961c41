/*
 * cm.c: connection management on rdma_cm, event driven.
 *
 * An rnic.h CM is one rdma_cm event channel (non-blocking) and a queue of rnic.h events behind an eventfd, which
 * is what rs_rnic_cm_fd returns: readable exactly while events are queued. The device's progress thread reads the
 * channel and takes every intermediate step itself (route resolution after address resolution, connect after
 * route resolution, RTR/RTS and RTU after the reply), so a connect makes progress even while the application
 * only waits on the passive side's CM; it also runs the deadlines. Only outcomes reach the queue. Every rdma_cm
 * call returns at once: resolution, connect, accept, reject and disconnect only start work in the kernel.
 *
 * QPs are the application's, not rdma_cm's (rdma_create_qp is not used): the provider moves them through
 * INIT/RTR/RTS with the attributes rdma_init_qp_attr gives, adding its own QoS, ACK timeout and RNR policy.
 *
 * Active connect: resolve address -> resolve route -> (QP to INIT) connect -> CONNECT_RESPONSE -> (QP to
 * RTR/RTS) establish -> ESTABLISHED. Passive: CONNECT_REQUEST -> accept (QP to RTS first) -> ESTABLISHED.
 * Orderly disconnect: QP to SQD, wait for the device to say the send queue drained (all acknowledged), then
 * DREQ and ERROR (flushes receives), DISCONNECTED on both sides.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "rnic/verbs/verbs.h"
#include "common/fdutil.h"

#define DEFAULT_CONNECT_TIMEOUT_MS 10000u
/* IB CM REJ reasons (IBTA vol. 1, 12.6.7.2) that mean "nobody answers there" rather than "refused". */
#define REJ_INVALID_SERVICE_ID 8
#define REJ_CONSUMER_DEFINED 28

size_t rs_v_sockaddr_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

bool rs_v_sockaddr_ok(const struct sockaddr *sa, socklen_t len)
{
    if (!sa)
        return false;
    if (sa->sa_family == AF_INET)
        return len >= sizeof(struct sockaddr_in);
    if (sa->sa_family == AF_INET6)
        return len >= sizeof(struct sockaddr_in6);
    return false;
}

static void copy_addr(struct sockaddr_storage *out, const struct sockaddr *sa)
{
    memset(out, 0, sizeof(*out));
    if (sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6))
        memcpy(out, sa, rs_v_sockaddr_len(sa));
}

static bool same_device(struct rs_v_dev *dev, struct rdma_cm_id *id)
{
    /* rdma_cm uses its own device contexts; the device is the same when the GUIDs are. */
    return !id->verbs || ibv_get_device_guid(id->verbs->device) == ibv_get_device_guid(dev->ctx->device);
}

/* ---- the channel ------------------------------------------------------------------------------------------ */

/*
 * A forked child closes its copies of the channels at once. An rdma_cm id lives as long as the channel's file is
 * open in ANY process: a child's inherited copy (which nothing in the child ever reads: the RNIC state is the
 * parent's) would keep the parent's listener bound to its port after the parent exits or closes it, swallowing
 * every connection request to that port (a prefork family whose dispatcher is gone, sdp_family.c).
 */
#define CHANNEL_MAX_FD (1u << 20)
static uint64_t channel_fds[CHANNEL_MAX_FD / 64];      /* bit per fd; atomic updates */
static pthread_once_t channel_atfork_once = PTHREAD_ONCE_INIT;

static void close_channels_in_child(void)
{
    for (unsigned w = 0; w < CHANNEL_MAX_FD / 64; w++) {
        uint64_t bits = channel_fds[w];
        if (!bits)
            continue;
        channel_fds[w] = 0;
        for (unsigned b = 0; b < 64; b++) {
            if (bits & (1ull << b))
                syscall(SYS_close, (int)(w * 64 + b));
        }
    }
}

static void channel_atfork(void)
{
    pthread_atfork(NULL, NULL, close_channels_in_child);
}

static void channel_track(int fd, bool on)
{
    if (fd < 0 || (unsigned)fd >= CHANNEL_MAX_FD)
        return;
    uint64_t bit = 1ull << ((unsigned)fd % 64);
    if (on)
        __atomic_or_fetch(&channel_fds[(unsigned)fd / 64], bit, __ATOMIC_RELAXED);
    else
        __atomic_and_fetch(&channel_fds[(unsigned)fd / 64], ~bit, __ATOMIC_RELAXED);
}

int rs_v_cm_create(struct rs_rnic *rnic, struct rs_rnic_cm **out)
{
    struct rs_v_dev *dev = rs_v_dev(rnic);
    int r = rs_v_progress_start(dev);
    if (r)
        return r;
    struct rs_v_cm *cm = calloc(1, sizeof(*cm));
    if (!cm)
        return -ENOMEM;
    cm->event_fd = -1;
    cm->channel = rdma_create_event_channel();
    if (!cm->channel)
        goto fail;
    cm->channel->fd = rs_fd_move_high(cm->channel->fd);
    fcntl(cm->channel->fd, F_SETFL, fcntl(cm->channel->fd, F_GETFL) | O_NONBLOCK);
    pthread_once(&channel_atfork_once, channel_atfork);
    channel_track(cm->channel->fd, true);
    cm->event_fd = rs_fd_move_high(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (cm->event_fd < 0)
        goto fail;
    pthread_mutex_init(&cm->lock, NULL);
    atomic_init(&cm->refs, 1);
    cm->dev = dev;
    cm->base.rnic = rnic;
    r = rs_v_progress_watch_cm(dev, cm);
    if (r) {
        pthread_mutex_destroy(&cm->lock);
        close(cm->event_fd);
        channel_track(cm->channel->fd, false);
        rdma_destroy_event_channel(cm->channel);
        free(cm);
        return r;
    }
    rs_v_dev_get(dev);
    *out = &cm->base;
    return 0;
fail:
    r = errno ? -errno : -ENOMEM;
    if (cm->event_fd >= 0)
        close(cm->event_fd);
    if (cm->channel) {
        channel_track(cm->channel->fd, false);
        rdma_destroy_event_channel(cm->channel);
    }
    free(cm);
    return r;
}

void rs_v_cm_get(struct rs_v_cm *cm)
{
    atomic_fetch_add(&cm->refs, 1);
}

/* Listeners, QPs, requests and peers keep their ids on the channel: it goes away with the last of them. */
void rs_v_cm_put(struct rs_v_cm *cm)
{
    if (atomic_fetch_sub(&cm->refs, 1) != 1)
        return;
    struct rs_v_dev *dev = cm->dev;
    rs_v_progress_unwatch_cm(dev, cm);
    while (cm->head) {
        struct rs_v_cm_item *item = cm->head;
        cm->head = item->next;
        free(item);
    }
    while (cm->pending) {
        struct rs_v_pending *p = cm->pending;
        cm->pending = p->next;
        free(p);
    }
    /* Events still queued in the kernel for ids destroyed since are dropped with the channel. */
    channel_track(cm->channel->fd, false);
    rdma_destroy_event_channel(cm->channel);
    close(cm->event_fd);
    pthread_mutex_destroy(&cm->lock);
    free(cm);
    rs_v_dev_put(dev);
}

void rs_v_cm_destroy(struct rs_rnic_cm *base)
{
    rs_v_cm_put(rs_v_cm(base));
}

int rs_v_cm_fd(const struct rs_rnic_cm *base)
{
    return ((const struct rs_v_cm *)base)->event_fd;
}

static void signal_queue(struct rs_v_cm *cm)
{
    uint64_t one = 1;
    ssize_t w = write(cm->event_fd, &one, sizeof(one));
    (void)w;
}

void rs_v_cm_push(struct rs_v_cm *cm, const struct rs_rnic_cm_event *ev)
{
    struct rs_v_cm_item *item = malloc(sizeof(*item));
    if (!item) {
        RS_ERROR("verbs: out of memory: CM event %d lost", (int)ev->type);
        return;
    }
    item->ev = *ev;
    item->next = NULL;
    pthread_mutex_lock(&cm->lock);
    bool was_empty = !cm->head;
    if (cm->tail)
        cm->tail->next = item;
    else
        cm->head = item;
    cm->tail = item;
    if (was_empty)
        signal_queue(cm);
    pthread_mutex_unlock(&cm->lock);
}

void rs_v_cm_forget_qp(struct rs_v_cm *cm, struct rs_v_qp *qp)
{
    pthread_mutex_lock(&cm->lock);
    struct rs_v_cm_item **link = &cm->head, *last = NULL;
    while (*link) {
        struct rs_v_cm_item *item = *link;
        if (item->ev.qp == &qp->base) {
            *link = item->next;
            free(item);
        } else {
            last = item;
            link = &item->next;
        }
    }
    cm->tail = last;
    pthread_mutex_unlock(&cm->lock);
}

/* ---- deadlines -------------------------------------------------------------------------------------------- */

int rs_v_cm_add_pending(struct rs_v_cm *cm, enum rs_v_pending_kind kind, struct rs_v_qp *qp, struct rs_v_peer *peer,
                        uint64_t deadline_ms)
{
    struct rs_v_pending *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->kind = kind;
    p->qp = qp;
    p->peer = peer;
    p->deadline_ms = deadline_ms;
    pthread_mutex_lock(&cm->lock);
    p->next = cm->pending;
    cm->pending = p;
    pthread_mutex_unlock(&cm->lock);
    rs_v_progress_kick(cm->dev);    /* the thread's sleep may end before this deadline */
    return 0;
}

void rs_v_cm_remove_pending(struct rs_v_cm *cm, struct rs_v_qp *qp, struct rs_v_peer *peer)
{
    pthread_mutex_lock(&cm->lock);
    struct rs_v_pending **link = &cm->pending;
    while (*link) {
        struct rs_v_pending *p = *link;
        if ((qp && p->qp == qp) || (peer && p->peer == peer)) {
            *link = p->next;
            free(p);
        } else {
            link = &p->next;
        }
    }
    pthread_mutex_unlock(&cm->lock);
}

/* Back to INIT after a failed or abandoned connect; the id is destroyed by the caller (outside any event). */
static struct rdma_cm_id *connect_failed(struct rs_v_qp *qp)
{
    struct rdma_cm_id *id = qp->id;
    qp->id = NULL;
    qp->conn = RS_V_CONN_NONE;
    atomic_store(&qp->state, RS_QPS_INIT);
    /* A QP that never got past INIT keeps its posted receives; one that did starts over (they flush). */
    struct ibv_qp_attr now;
    struct ibv_qp_init_attr init;
    if (qp->qp && ibv_query_qp(qp->qp, &now, IBV_QP_STATE, &init) == 0 && now.qp_state != IBV_QPS_INIT) {
        rs_v_rc_modify_state(qp, IBV_QPS_ERR);
        rs_v_rc_reset_to_init(qp);
    }
    return id;
}

uint64_t rs_v_cm_deadlines(struct rs_v_cm *cm, uint64_t now)
{
    struct rs_v_pending *due = NULL;
    uint64_t next = 0;
    pthread_mutex_lock(&cm->lock);
    struct rs_v_pending **link = &cm->pending;
    while (*link) {
        struct rs_v_pending *p = *link;
        if (p->deadline_ms <= now) {
            *link = p->next;
            p->next = due;
            due = p;
        } else {
            if (!next || p->deadline_ms < next)
                next = p->deadline_ms;
            link = &p->next;
        }
    }
    pthread_mutex_unlock(&cm->lock);
    while (due) {
        struct rs_v_pending *p = due;
        due = p->next;
        struct rs_rnic_cm_event ev;
        memset(&ev, 0, sizeof(ev));
        if (p->kind == RS_V_PENDING_CONNECT) {
            struct rs_v_qp *qp = p->qp;
            pthread_mutex_lock(&qp->lock);
            struct rdma_cm_id *id = NULL;
            bool report = qp->conn == RS_V_CONN_RESOLVING || qp->conn == RS_V_CONN_CONNECTING;
            if (report) {
                ev.type = RS_RNIC_CM_EV_TIMEOUT;
                ev.qp = &qp->base;
                ev.error = -ETIMEDOUT;
                if (qp->id)
                    copy_addr(&ev.peer, rdma_get_peer_addr(qp->id));
                id = connect_failed(qp);
            }
            pthread_mutex_unlock(&qp->lock);
            if (id)
                rdma_destroy_id(id);
            if (report)
                rs_v_cm_push(cm, &ev);
        } else if (p->kind == RS_V_PENDING_DRAIN) {
            /* The device never said the send queue drained: disconnect anyway. */
            rs_v_rc_drained(p->qp);
        } else if (p->kind == RS_V_PENDING_PEER) {
            rs_v_ud_peer_timeout(p->peer, &ev);
            if (ev.type)
                rs_v_cm_push(cm, &ev);
        }
        free(p);
    }
    return next;
}

/* ---- listening -------------------------------------------------------------------------------------------- */

static int bind_error(int err)
{
    /* An address that is not local, or served by another device, is not available to us. */
    if (err == -ENODEV || err == -EADDRNOTAVAIL || err == -EINVAL)
        return -EADDRNOTAVAIL;
    return err;
}

int rs_v_listen(struct rs_rnic_cm *base, const struct sockaddr *addr, socklen_t len, int backlog,
                struct rs_rnic_listener **out)
{
    struct rs_v_cm *cm = rs_v_cm(base);
    if (!rs_v_sockaddr_ok(addr, len) || !out)
        return -EINVAL;
    struct rs_v_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    l->idref.kind = RS_V_ID_LISTENER;
    l->idref.obj = l;
    if (rdma_create_id(cm->channel, &l->id, &l->idref, RDMA_PS_TCP)) {
        int err = rs_v_errno_from_rdma(-1);
        free(l);
        return err;
    }
    struct sockaddr_storage local;
    copy_addr(&local, addr);
    int r = 0;
    if (rdma_bind_addr(l->id, (struct sockaddr *)&local))
        r = bind_error(rs_v_errno_from_rdma(-1));
    else if (!same_device(cm->dev, l->id))
        r = -EADDRNOTAVAIL;
    else if (rdma_listen(l->id, backlog > 0 ? backlog : 16))
        r = rs_v_errno_from_rdma(-1);
    if (r) {
        rdma_destroy_id(l->id);
        free(l);
        return r;
    }
    l->cm = cm;
    rs_v_cm_get(cm);
    l->base.rnic = base->rnic;
    *out = &l->base;
    return 0;
}

int rs_v_listener_addr(const struct rs_rnic_listener *base, struct sockaddr_storage *out)
{
    const struct rs_v_listener *l = (const struct rs_v_listener *)base;
    copy_addr(out, rdma_get_local_addr(l->id));
    return out->ss_family ? 0 : -ENOTCONN;
}

void rs_v_listener_close(struct rs_rnic_listener *base)
{
    struct rs_v_listener *l = (struct rs_v_listener *)base;
    rdma_destroy_id(l->id);
    rs_v_cm_put(l->cm);
    free(l);
}

/* ---- connecting ------------------------------------------------------------------------------------------- */

static void conn_param(struct rs_v_qp *qp, struct rdma_conn_param *p, const void *data, uint32_t len)
{
    memset(p, 0, sizeof(*p));
    p->private_data = data;
    p->private_data_len = (uint8_t)len;
    p->responder_resources = qp->responder_resources;
    p->initiator_depth = qp->initiator_depth;
    p->retry_count = RS_V_RETRY_COUNT;
    p->rnr_retry_count = RS_V_RNR_RETRY;
    p->flow_control = 1;
    p->srq = qp->srq ? 1 : 0;
    p->qp_num = qp->qp->qp_num;
}

static uint8_t rd_atomic(const struct rs_v_dev *dev, bool responder)
{
    uint32_t max = responder ? dev->base.caps.max_ird : dev->base.caps.max_ord;
    return (uint8_t)(max < RS_V_RD_ATOMIC ? max : RS_V_RD_ATOMIC);
}

int rs_v_connect(struct rs_rnic_qp *base, struct rs_rnic_cm *cm_base, const struct sockaddr *dst, socklen_t len,
                 const void *private_data, uint32_t private_data_len, uint32_t timeout_ms)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    struct rs_v_cm *cm = rs_v_cm(cm_base);
    if ((qp->type != RS_QPT_RC && qp->type != RS_QPT_XRC_INI) || !rs_v_sockaddr_ok(dst, len))
        return -EINVAL;
    if (private_data_len > RS_V_CONNECT_PRIVATE)
        return -EMSGSIZE;
    if (private_data_len && !private_data)
        return -EINVAL;
    pthread_mutex_lock(&qp->lock);
    if (qp->conn != RS_V_CONN_NONE || atomic_load(&qp->state) != RS_QPS_INIT || qp->id) {
        pthread_mutex_unlock(&qp->lock);
        return -EISCONN;
    }
    qp->idref.kind = RS_V_ID_QP;
    qp->idref.obj = qp;
    struct rdma_cm_id *id;
    if (qp->type == RS_QPT_XRC_INI) {
        int xr = rs_v_xrc_create_id(cm->channel, cm->dev->addr.ss_family ? (struct sockaddr *)&cm->dev->addr : NULL,
                                    &qp->idref, &id);
        if (xr) {
            pthread_mutex_unlock(&qp->lock);
            return xr;
        }
    } else if (rdma_create_id(cm->channel, &id, &qp->idref, RDMA_PS_TCP)) {
        pthread_mutex_unlock(&qp->lock);
        return rs_v_errno_from_rdma(-1);
    }
    if (qp->qos.tclass) {
        uint8_t tos = qp->qos.tclass;
        rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos));
    }
    struct sockaddr_storage src, dest;
    copy_addr(&dest, dst);
    copy_addr(&src, (const struct sockaddr *)&cm->dev->addr);
    bool have_src = src.ss_family == dst->sa_family;
    if (have_src) {
        if (src.ss_family == AF_INET)
            ((struct sockaddr_in *)&src)->sin_port = 0;
        else
            ((struct sockaddr_in6 *)&src)->sin6_port = 0;
    }
    uint32_t timeout = timeout_ms ? timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
    if (rdma_resolve_addr(id, have_src ? (struct sockaddr *)&src : NULL, (struct sockaddr *)&dest,
                          (int)timeout)) {
        int err = rs_v_errno_from_rdma(-1);
        pthread_mutex_unlock(&qp->lock);
        rdma_destroy_id(id);
        return err;
    }
    qp->id = id;
    struct rs_v_cm *old = qp->cm != cm ? qp->cm : NULL;
    if (qp->cm != cm) {
        qp->cm = cm;
        rs_v_cm_get(cm);
    }
    memcpy(qp->private_data, private_data, private_data_len);
    qp->private_len = private_data_len;
    qp->passive = false;
    qp->error_reported = false;
    qp->conn = RS_V_CONN_RESOLVING;
    qp->deadline_ms = rs_v_now_ms() + timeout;
    qp->responder_resources = rd_atomic(cm->dev, true);
    qp->initiator_depth = rd_atomic(cm->dev, false);
    atomic_store(&qp->state, RS_QPS_CONNECTING);
    uint64_t deadline = qp->deadline_ms;
    pthread_mutex_unlock(&qp->lock);
    if (old)
        rs_v_cm_put(old);
    rs_v_cm_add_pending(cm, RS_V_PENDING_CONNECT, qp, NULL, deadline);
    return 0;
}

int rs_v_accept(struct rs_rnic_conn_request *request, struct rs_rnic_qp *base, struct rs_rnic_cm *cm_base,
                const void *private_data, uint32_t private_data_len)
{
    struct rs_v_conn_request *req = (struct rs_v_conn_request *)request;
    struct rs_v_qp *qp = rs_v_qp(base);
    struct rs_v_cm *cm = rs_v_cm(cm_base);
    if (qp->type != RS_QPT_RC && qp->type != RS_QPT_XRC_TGT)
        return -EINVAL;
    if (private_data_len > RS_V_ACCEPT_PRIVATE)
        return -EMSGSIZE;
    if (private_data_len && !private_data)
        return -EINVAL;
    pthread_mutex_lock(&qp->lock);
    if (qp->conn != RS_V_CONN_NONE || atomic_load(&qp->state) != RS_QPS_INIT || qp->id) {
        pthread_mutex_unlock(&qp->lock);
        return -EISCONN;
    }
    struct rdma_cm_id *id = req->id;
    int r = 0;
    /* ESTABLISHED must come out of the CM the caller names. */
    if (req->cm != cm && rdma_migrate_id(id, cm->channel))
        r = rs_v_errno_from_rdma(-1);
    qp->idref.kind = RS_V_ID_QP;
    qp->idref.obj = qp;
    id->context = &qp->idref;
    qp->responder_resources = req->initiator_depth < rd_atomic(cm->dev, true) ? req->initiator_depth
                                                                               : rd_atomic(cm->dev, true);
    qp->initiator_depth = req->responder_resources < rd_atomic(cm->dev, false) ? req->responder_resources
                                                                                : rd_atomic(cm->dev, false);
    if (r == 0)
        r = rs_v_rc_to_init(qp, id);
    if (r == 0)
        r = rs_v_rc_to_rtr_rts(qp, id);
    if (r == 0) {
        /* The REP carries the application's data and, at a fixed place behind it, our mailbox. */
        uint8_t rep[RS_V_REP_PRIVATE];
        memset(rep, 0, sizeof(rep));
        memcpy(rep, private_data, private_data_len);
        if (qp->mbox)
            rs_v_mbox_trailer(qp, rep + RS_V_ACCEPT_PRIVATE);
        struct rdma_conn_param param;
        conn_param(qp, &param, rep, sizeof(rep));
        if (rdma_accept(id, &param))
            r = rs_v_errno_from_rdma(-1);
    }
    if (r) {
        id->context = NULL;
        rs_v_rc_modify_state(qp, IBV_QPS_ERR);
        rs_v_rc_reset_to_init(qp);
        pthread_mutex_unlock(&qp->lock);
        return r;
    }
    qp->id = id;
    struct rs_v_cm *old = qp->cm != cm ? qp->cm : NULL;
    if (qp->cm != cm) {
        qp->cm = cm;
        rs_v_cm_get(cm);
    }
    qp->passive = true;
    qp->error_reported = false;
    qp->conn = RS_V_CONN_CONNECTING;
    atomic_store(&qp->state, RS_QPS_CONNECTING);
    pthread_mutex_unlock(&qp->lock);
    if (old)
        rs_v_cm_put(old);
    rs_v_cm_put(req->cm);
    free(req);
    return 0;
}

int rs_v_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len)
{
    struct rs_v_conn_request *req = (struct rs_v_conn_request *)request;
    if (private_data_len > RS_V_REJECT_PRIVATE)
        return -EMSGSIZE;
    int r = 0;
    /* -EINVAL: the peer gave up the attempt already (its CM rejected or timed out); nothing is left to refuse. */
    if (rdma_reject(req->id, private_data, (uint8_t)private_data_len))
        r = rs_v_errno_from_rdma(-1);
    if (r == -EINVAL)
        r = 0;
    rdma_destroy_id(req->id);
    rs_v_cm_put(req->cm);
    free(req);
    return r;
}

/* rdma_cm's view of our end: the address and port its peer's rdma_get_peer_addr gives. */
int rs_v_qp_local_addr(const struct rs_rnic_qp *base, struct sockaddr_storage *out)
{
    struct rs_v_qp *qp = rs_v_qp((struct rs_rnic_qp *)base);
    pthread_mutex_lock(&qp->lock);
    bool up = qp->id && qp->conn >= RS_V_CONN_CONNECTING;
    if (up)
        copy_addr(out, rdma_get_local_addr(qp->id));
    pthread_mutex_unlock(&qp->lock);
    return up && out->ss_family ? 0 : -ENOTCONN;
}

int rs_v_disconnect(struct rs_rnic_qp *base)
{
    struct rs_v_qp *qp = rs_v_qp(base);
    if (!rs_v_connected(qp))
        return -EINVAL;
    pthread_mutex_lock(&qp->lock);
    struct rs_v_cm *cm = qp->cm;
    int r = 0;
    switch (qp->conn) {
    case RS_V_CONN_ESTABLISHED: {
        qp->conn = RS_V_CONN_DRAINING;
        atomic_store(&qp->state, RS_QPS_CLOSING);
        /* Behind everything posted: the flag that tells the peer this close is orderly. */
        rs_v_mbox_say_orderly(qp);
        /* Let what was posted finish first: the device says when the send queue is empty and acknowledged.
         * A QoS change already draining it finishes first (rs_v_rc_drained drains again). */
        struct ibv_qp_attr attr = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
        bool draining = qp->qos_pending ||
                        ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0;
        pthread_mutex_unlock(&qp->lock);
        if (draining)
            rs_v_cm_add_pending(cm, RS_V_PENDING_DRAIN, qp, NULL, rs_v_now_ms() + RS_V_DRAIN_TIMEOUT_MS);
        else
            rs_v_rc_drained(qp);
        return 0;
    }
    case RS_V_CONN_RESOLVING:
    case RS_V_CONN_CONNECTING: {
        /* Not connected yet: give up the attempt; the caller hears DISCONNECTED. */
        struct rdma_cm_id *id = connect_failed(qp);
        qp->error_reported = true;
        pthread_mutex_unlock(&qp->lock);
        rs_v_cm_remove_pending(cm, qp, NULL);
        if (id)
            rdma_destroy_id(id);
        struct rs_rnic_cm_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = RS_RNIC_CM_EV_DISCONNECTED;
        ev.qp = base;
        rs_v_cm_push(cm, &ev);
        return 0;
    }
    case RS_V_CONN_NONE:
        r = -ENOTCONN;
        break;
    default:
        break;      /* already closing */
    }
    pthread_mutex_unlock(&qp->lock);
    return r;
}

void rs_v_rc_drained(struct rs_v_qp *qp)
{
    RS_DEBUG("verbs: QP %u: send queue drained (QoS change %d, connection state %d)", qp->qp->qp_num,
             (int)qp->qos_pending, (int)qp->conn);
    pthread_mutex_lock(&qp->lock);
    struct rs_v_cm *cm = qp->cm;
    if (qp->qos_pending) {
        rs_v_rc_apply_qos(qp);
        if (qp->conn == RS_V_CONN_DRAINING) {
            /* A disconnect came during the QoS change: drain once more, its orderly flag included. */
            struct ibv_qp_attr attr = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
            if (ibv_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0) {
                pthread_mutex_unlock(&qp->lock);
                if (cm) {
                    rs_v_cm_remove_pending(cm, qp, NULL);
                    rs_v_cm_add_pending(cm, RS_V_PENDING_DRAIN, qp, NULL, rs_v_now_ms() + RS_V_DRAIN_TIMEOUT_MS);
                }
                return;
            }
        }
    }
    if (qp->conn == RS_V_CONN_DRAINING) {
        qp->conn = RS_V_CONN_DISCONNECTING;
        atomic_store(&qp->state, RS_QPS_ERROR);
        rs_v_rc_modify_state(qp, IBV_QPS_ERR);
        if (qp->id)
            rdma_disconnect(qp->id);
    }
    pthread_mutex_unlock(&qp->lock);
    if (cm)
        rs_v_cm_remove_pending(cm, qp, NULL);
}

/* ---- events ----------------------------------------------------------------------------------------------- */

struct deferred {
    struct rdma_cm_id *destroy;     /* destroyed once the event is acknowledged */
};

static void copy_private(struct rs_rnic_cm_event *ev, const void *data, uint8_t len)
{
    if (data && len) {
        ev->private_data_len = len;
        memcpy(ev->private_data, data, len);
    }
}

static bool on_connect_request(struct rs_v_cm *cm, struct rdma_cm_event *e, struct rs_rnic_cm_event *ev,
                               struct deferred *later)
{
    struct rs_v_idref *ref = e->listen_id ? e->listen_id->context : NULL;
    if (!ref || ref->kind != RS_V_ID_LISTENER || !same_device(cm->dev, e->id)) {
        rdma_reject(e->id, NULL, 0);
        later->destroy = e->id;
        return false;
    }
    struct rs_v_listener *l = ref->obj;
    struct rs_v_conn_request *req = calloc(1, sizeof(*req));
    if (!req) {
        rdma_reject(e->id, NULL, 0);
        later->destroy = e->id;
        return false;
    }
    req->base.rnic = &cm->dev->base;
    req->cm = l->cm;
    rs_v_cm_get(l->cm);
    req->id = e->id;
    req->responder_resources = e->param.conn.responder_resources;
    req->initiator_depth = e->param.conn.initiator_depth;
    e->id->context = NULL;
    ev->type = RS_RNIC_CM_EV_CONNECT_REQUEST;
    ev->listener = &l->base;
    ev->request = &req->base;
    copy_addr(&ev->peer, rdma_get_peer_addr(e->id));
    copy_private(ev, e->param.conn.private_data, e->param.conn.private_data_len);
    return true;
}

/* Active side: the next step after a resolution, or the failure. */
static bool active_step(struct rs_v_cm *cm, struct rs_v_qp *qp, struct rdma_cm_event *e, struct rs_rnic_cm_event *ev,
                        struct deferred *later)
{
    int r = 0;
    enum rs_rnic_cm_event_type fail_type = RS_RNIC_CM_EV_UNREACHABLE;
    switch (e->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (!same_device(cm->dev, e->id)) {
            r = -ENODEV;
            break;
        }
        if (rdma_resolve_route(e->id, (int)(qp->deadline_ms > rs_v_now_ms() ? qp->deadline_ms - rs_v_now_ms() : 1)))
            r = rs_v_errno_from_rdma(-1);
        else
            return false;
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        r = rs_v_rc_to_init(qp, e->id);
        if (r)
            break;
        struct rdma_conn_param param;
        conn_param(qp, &param, qp->private_data, qp->private_len);
        if (rdma_connect(e->id, &param)) {
            r = rs_v_errno_from_rdma(-1);
            break;
        }
        qp->conn = RS_V_CONN_CONNECTING;
        return false;
    }
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        rs_v_mbox_from_rep(qp, e->param.conn.private_data, e->param.conn.private_data_len);
        r = rs_v_rc_to_rtr_rts(qp, e->id);
        /* Our mailbox goes to the peer before the RTU, so it is there before the peer can close. */
        if (r == 0)
            r = rs_v_mbox_introduce(qp);
        if (r == 0 && rdma_establish(e->id))
            r = rs_v_errno_from_rdma(-1);
        if (r) {
            rdma_reject(e->id, NULL, 0);
            break;
        }
        qp->conn = RS_V_CONN_ESTABLISHED;
        atomic_store(&qp->state, RS_QPS_RTS);
        ev->type = RS_RNIC_CM_EV_ESTABLISHED;
        ev->qp = &qp->base;
        copy_addr(&ev->peer, rdma_get_peer_addr(e->id));
        copy_private(ev, e->param.conn.private_data,
                     e->param.conn.private_data_len < RS_V_ACCEPT_PRIVATE ? e->param.conn.private_data_len
                                                                         : RS_V_ACCEPT_PRIVATE);
        return true;
    case RDMA_CM_EVENT_REJECTED:
        /* status is the IB CM reject reason: only a consumer reject is the peer saying no. */
        if (e->status == REJ_CONSUMER_DEFINED) {
            fail_type = RS_RNIC_CM_EV_REJECTED;
            r = -ECONNREFUSED;
            copy_private(ev, e->param.conn.private_data, e->param.conn.private_data_len);
        } else {
            r = e->status == REJ_INVALID_SERVICE_ID ? -ECONNREFUSED : -EHOSTUNREACH;
        }
        break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
        r = e->status < 0 ? e->status : -EHOSTUNREACH;
        if (r == -ETIMEDOUT)
            fail_type = RS_RNIC_CM_EV_TIMEOUT;
        break;
    default:
        return false;
    }
    if (r == 0)
        return false;
    ev->type = fail_type;
    ev->qp = &qp->base;
    ev->error = r;
    copy_addr(&ev->peer, rdma_get_peer_addr(e->id));
    later->destroy = connect_failed(qp);
    return true;
}

static bool on_disconnected(struct rs_v_qp *qp, struct rdma_cm_event *e, struct rs_rnic_cm_event *ev)
{
    bool report = !qp->error_reported;
    bool we_started = qp->conn == RS_V_CONN_DISCONNECTING;
    if (report) {
        /* The DREQ says nothing of why. The mailbox does: an orderly close flags it first. A peer without one
         * (not this provider) is judged by our QP: a responder error left it in ERROR. */
        int orderly = we_started ? 1 : rs_v_mbox_peer_closed_orderly(qp);
        bool failed = orderly == 0 || (orderly < 0 && rs_v_rc_device_error(qp));
        RS_DEBUG("verbs: QP %u: DISCONNECTED, orderly %d, reported as %s", qp->qp->qp_num, orderly,
                 failed ? "ERROR" : "DISCONNECTED");
        ev->type = failed ? RS_RNIC_CM_EV_ERROR : RS_RNIC_CM_EV_DISCONNECTED;
        ev->error = failed ? -ECONNRESET : 0;
        ev->qp = &qp->base;
        copy_addr(&ev->peer, rdma_get_peer_addr(e->id));
        qp->error_reported = true;
    }
    if (!we_started)
        rdma_disconnect(e->id);     /* answers the DREQ */
    qp->conn = RS_V_CONN_CLOSED;
    atomic_store(&qp->state, RS_QPS_ERROR);
    rs_v_rc_modify_state(qp, IBV_QPS_ERR);
    return report;
}

static bool on_qp_event(struct rs_v_cm *cm, struct rs_v_qp *qp, struct rdma_cm_event *e, struct rs_rnic_cm_event *ev,
                        struct deferred *later)
{
    bool produced = false;
    pthread_mutex_lock(&qp->lock);
    if (qp->id != e->id) {
        pthread_mutex_unlock(&qp->lock);
        return false;       /* a stale event of an attempt given up */
    }
    if (!qp->passive && (qp->conn == RS_V_CONN_RESOLVING || qp->conn == RS_V_CONN_CONNECTING)) {
        produced = active_step(cm, qp, e, ev, later);
        if (qp->conn != RS_V_CONN_RESOLVING && qp->conn != RS_V_CONN_CONNECTING) {
            pthread_mutex_unlock(&qp->lock);
            rs_v_cm_remove_pending(cm, qp, NULL);
            return produced;
        }
        pthread_mutex_unlock(&qp->lock);
        return produced;
    }
    switch (e->event) {
    case RDMA_CM_EVENT_ESTABLISHED:
        if (qp->conn == RS_V_CONN_CONNECTING) {
            qp->conn = RS_V_CONN_ESTABLISHED;
            atomic_store(&qp->state, RS_QPS_RTS);
            ev->type = RS_RNIC_CM_EV_ESTABLISHED;
            ev->qp = &qp->base;
            copy_addr(&ev->peer, rdma_get_peer_addr(e->id));
            produced = true;
        }
        break;
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
        /* Passive side: the RTU never came. */
        if (qp->conn == RS_V_CONN_CONNECTING && !qp->error_reported) {
            qp->error_reported = true;
            qp->conn = RS_V_CONN_CLOSED;
            atomic_store(&qp->state, RS_QPS_ERROR);
            rs_v_rc_modify_state(qp, IBV_QPS_ERR);
            ev->type = RS_RNIC_CM_EV_ERROR;
            ev->qp = &qp->base;
            ev->error = e->status < 0 ? e->status : -ECONNABORTED;
            produced = true;
        }
        break;
    case RDMA_CM_EVENT_DISCONNECTED:
        produced = on_disconnected(qp, e, ev);
        break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        if (!qp->error_reported) {
            qp->error_reported = true;
            ev->type = RS_RNIC_CM_EV_ERROR;
            ev->qp = &qp->base;
            ev->error = -ENODEV;
            produced = true;
        }
        qp->conn = RS_V_CONN_CLOSED;
        atomic_store(&qp->state, RS_QPS_ERROR);
        break;
    default:
        break;
    }
    pthread_mutex_unlock(&qp->lock);
    return produced;
}

static bool handle(struct rs_v_cm *cm, struct rdma_cm_event *e, struct rs_rnic_cm_event *ev, struct deferred *later)
{
    memset(ev, 0, sizeof(*ev));
    RS_DEBUG("verbs: cm %p: %s (status %d)", (void *)cm, rdma_event_str(e->event), e->status);
    if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST)
        return on_connect_request(cm, e, ev, later);
    struct rs_v_idref *ref = e->id ? e->id->context : NULL;
    if (!ref)
        return false;
    switch (ref->kind) {
    case RS_V_ID_QP:
        return on_qp_event(cm, ref->obj, e, ev, later);
    case RS_V_ID_PEER: {
        struct rs_v_peer *peer = ref->obj;
        bool done = rs_v_ud_peer_event(peer, e, ev, &later->destroy);
        if (done)
            rs_v_cm_remove_pending(cm, NULL, peer);
        return ev->type != 0;
    }
    default:
        return false;
    }
}

void rs_v_cm_process(struct rs_v_cm *cm)
{
    struct rdma_cm_event *e;
    while (rdma_get_cm_event(cm->channel, &e) == 0) {
        struct deferred later = { 0 };
        struct rs_rnic_cm_event ev;
        bool produced = handle(cm, e, &ev, &later);
        rdma_ack_cm_event(e);
        if (later.destroy)
            rdma_destroy_id(later.destroy);
        if (produced)
            rs_v_cm_push(cm, &ev);
    }
}

int rs_v_cm_get_event(struct rs_rnic_cm *base, struct rs_rnic_cm_event *out)
{
    struct rs_v_cm *cm = rs_v_cm(base);
    pthread_mutex_lock(&cm->lock);
    struct rs_v_cm_item *item = cm->head;
    if (item) {
        cm->head = item->next;
        if (!cm->head) {
            cm->tail = NULL;
            uint64_t count;
            ssize_t rd = read(cm->event_fd, &count, sizeof(count));
            (void)rd;
        }
    }
    pthread_mutex_unlock(&cm->lock);
    if (!item)
        return -EAGAIN;
    *out = item->ev;
    free(item);
    return 0;
}
