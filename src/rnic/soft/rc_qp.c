/*
 * rc_qp.c: the RC queue pair of the soft RNIC: its state next to the core's QP, in-order send completions, the
 * ERROR path (Terminate, then closing the TCP connection), and the rs_soft_rc_ops table the core calls.
 *
 * See rc.h for threads and locks. The short version: connection state changes happen on the progress thread;
 * application threads reach it through rs_soft_progress_call_sync, and transmit under rc->tx_lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rnic/soft/rc.h"

/* ---- completions in send-queue order ---- */

void rs_rc_complete_ready_locked(struct rs_rc_qp *rc)
{
    struct rs_soft_qp *qp = rc->qp;
    while (!rc->sq_failed && rs_soft_sq_head(qp)) {
        uint32_t slot = (uint32_t)(qp->sq.head % qp->sq.capacity);
        uint8_t state = rc->slot_state[slot];
        if (state == RS_RC_SLOT_PENDING)
            break;
        enum rs_rnic_wc_status status =
            state == RS_RC_SLOT_DONE ? RS_WC_SUCCESS : (enum rs_rnic_wc_status)rc->slot_status[slot];
        rc->slot_state[slot] = RS_RC_SLOT_PENDING;
        rs_soft_sq_complete_head(qp, status);
        /* rnic.h: after the first failure everything else is flushed (the QP is entering ERROR). */
        if (state == RS_RC_SLOT_FAILED)
            rc->sq_failed = true;
    }
}

void rs_rc_slot_finish(struct rs_rc_qp *rc, uint64_t pos, enum rs_rc_slot state, enum rs_rnic_wc_status status)
{
    struct rs_soft_qp *qp = rc->qp;
    pthread_mutex_lock(&qp->sq_lock);
    /* A WQE already flushed (the QP went to ERROR meanwhile) has left the ring: nothing to record. */
    if (pos >= qp->sq.head && pos < qp->sq.next) {
        uint32_t slot = (uint32_t)(pos % qp->sq.capacity);
        rc->slot_state[slot] = (uint8_t)state;
        rc->slot_status[slot] = (uint8_t)status;
        rs_rc_complete_ready_locked(rc);
    }
    pthread_mutex_unlock(&qp->sq_lock);
}

/* ---- events, watch, qos ---- */

void rs_rc_push_event(struct rs_rc_qp *rc, enum rs_rnic_cm_event_type type, int error, const void *pd,
                      uint32_t pd_len)
{
    if (!rc->cm)
        return;
    struct rs_rnic_cm_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.qp = &rc->qp->base;
    ev.error = error;
    ev.peer = rc->peer;
    if (pd_len > sizeof(ev.private_data))
        pd_len = sizeof(ev.private_data);
    if (pd_len)
        memcpy(ev.private_data, pd, pd_len);
    ev.private_data_len = pd_len;
    int r = rs_soft_cm_push(rc->cm, &ev);
    if (r)
        RS_DEBUG("soft rc: qp %u event %d not delivered: %d", rc->qp->qpn, (int)type, r);
}

void rs_rc_watch_update_locked(struct rs_rc_qp *rc)
{
    if (!rc->watch)
        return;
    unsigned ev = 0;
    switch (rs_rc_conn(rc)) {
    case RS_RC_CONNECTING:
        ev = RS_SOFT_EV_WRITE;
        break;
    case RS_RC_MPA_WAIT:
    case RS_RC_RTS:
    case RS_RC_CLOSING:
    case RS_RC_DRAINING:
        /* After EOF the socket stays readable forever: stop asking, or the loop would spin. A parked socket is a
         * waiting application thread's to read (rs_rc_rx_event), in RTS only. */
        ev = (__atomic_load_n(&rc->rx_eof, __ATOMIC_ACQUIRE) || (rc->rx_parked && rs_rc_conn(rc) == RS_RC_RTS)
                  ? 0
                  : RS_SOFT_EV_READ) |
             (rc->tx_want_write ? RS_SOFT_EV_WRITE : 0);
        break;
    default:
        break;
    }
    if (ev != rc->watch_events) {
        rc->watch_events = ev;
        rs_soft_watch_set(rc->watch, ev);
    }
}

void rs_rc_watch_update(struct rs_rc_qp *rc)
{
    pthread_mutex_lock(&rc->tx_lock);
    rs_rc_watch_update_locked(rc);
    pthread_mutex_unlock(&rc->tx_lock);
}

void rs_rc_apply_qos(struct rs_rc_qp *rc)
{
    if (rc->fd < 0)
        return;
    pthread_mutex_lock(&rc->qp->sq_lock);
    int tos = rc->qp->qos.tclass;
    pthread_mutex_unlock(&rc->qp->sq_lock);
    int r = rc->peer.ss_family == AF_INET6
                ? rs_soft_sys_setsockopt(rc->fd, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos))
                : rs_soft_sys_setsockopt(rc->fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
    if (r)
        RS_DEBUG("soft rc: qp %u cannot set traffic class %d: %d", rc->qp->qpn, tos, r);
}

/* ---- RTS ---- */

void rs_rc_enter_rts(struct rs_rc_qp *rc)
{
    int mss = 0;
    socklen_t len = sizeof(mss);
    if (rs_soft_sys_getsockopt(rc->fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) != 0 || mss <= 0)
        mss = (int)RS_RC_FPDU_MAX;
    /* One FPDU per TCP segment when the MSS is small (what a hardware peer places best), capped at 16 KiB on
     * loopback-like MSSes so a READ response and a SEND can interleave finely. */
    uint32_t fpdu = (uint32_t)mss & ~7u;
    if (fpdu > RS_RC_FPDU_MAX)
        fpdu = RS_RC_FPDU_MAX;
    if (fpdu < RS_RC_FPDU_MIN)
        fpdu = RS_RC_FPDU_MIN;
    rc->fpdu_max = fpdu;
    rs_rc_rx_reset(rc);
    __atomic_store_n(&rc->orq_head, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&rc->orq_tail, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&rc->irq_head, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&rc->irq_tail, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&rc->tx_lock);
    rc->tx.msn_send = rc->tx.msn_rreq = 0;
    rc->tx.cur = NULL;
    rc->tx_stopped = false;
    rs_rc_local_init(rc);
    rs_rc_set_conn(rc, RS_RC_RTS);
    rs_rc_watch_update_locked(rc);
    pthread_mutex_unlock(&rc->tx_lock);
    rs_soft_qp_set_state(rc->qp, RS_QPS_RTS);
    RS_DEBUG("soft rc: qp %u in RTS (MPA rev %u, IRD %u, ORD %u, FPDU %u bytes)", rc->qp->qpn, rc->neg.rev,
             rc->neg.ird, rc->neg.ord, rc->fpdu_max);
}

/* ---- errors ---- */

static const struct rs_term_cause local_catastrophic = {
    RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_LOCAL_CATASTROPHIC, RS_TERM_RDMAP_UNSPECIFIED,
};

/* tx_lock held: queues a Terminate behind the FPDU on the wire. false if the stream cannot carry one. */
static bool queue_terminate_locked(struct rs_rc_qp *rc, const struct rs_term_cause *cause, const uint8_t *offending,
                                   size_t offending_len, uint16_t offending_ulpdu_len)
{
    rc->tx_stopped = true;
    if (!rs_rc_tx_cut_batch(rc))
        return false;
    uint8_t term[RS_TERM_MAX_LEN], fpdu[RS_RC_TERM_LEN_FPDU];
    size_t n = rs_term_build(term, 1, cause, offending, offending_len, offending_ulpdu_len);
    int len = rs_mpa_fpdu_build(fpdu, sizeof(fpdu), term, n);
    if (len > 0 && !rc->neg.crc)
        memset(fpdu + len - RS_MPA_CRC_LEN, 0, RS_MPA_CRC_LEN);     /* CRCs not negotiated: zero, as the rest */
    if (len < 0 || rs_rc_tx_queue_raw(rc, fpdu, (size_t)len) != 0)
        return false;
    rc->term_sent = true;
    rc->term_queued = true;
    return true;
}

static void fatal_loop(void *arg)
{
    struct rs_rc_qp *rc = arg;
    rs_soft_qp_enter_error(rc->qp);
}

void rs_rc_fatal(struct rs_rc_qp *rc, const struct rs_term_cause *cause, const uint8_t *offending,
                 size_t offending_len, uint16_t offending_ulpdu_len, int detail)
{
    enum rs_rc_conn conn = rs_rc_conn(rc);
    if (conn != RS_RC_RTS && conn != RS_RC_CLOSING)
        return;
    if (cause)
        RS_INFO("soft rc: qp %u terminating: %s (layer %u etype %u ecode 0x%02x)", rc->qp->qpn,
                rs_term_cause_str(cause), cause->layer, cause->etype, cause->ecode);
    pthread_mutex_lock(&rc->tx_lock);
    rc->tx_stopped = true;
    if (cause && !rc->term_sent && !rc->abort_close &&
        !queue_terminate_locked(rc, cause, offending, offending_len, offending_ulpdu_len))
        rc->abort_close = true;
    pthread_mutex_unlock(&rc->tx_lock);
    if (!rc->error_detail)
        rc->error_detail = detail ? detail : -ECONNABORTED;
    if (!rs_soft_progress_on_loop(rc->dev)) {
        /* An application thread receiving inline holds rx_lock and must not wait for the progress thread: stop
         * receiving here and let the progress thread take the QP to ERROR. */
        __atomic_store_n(&rc->rx_stop, true, __ATOMIC_RELEASE);
        if (rs_soft_progress_call(rc->dev, fatal_loop, rc) != 0)
            RS_ERROR("soft rc: qp %u cannot queue its error handling (out of memory)", rc->qp->qpn);
        return;
    }
    rs_soft_qp_enter_error(rc->qp);
}

static void tx_failed_loop(void *arg)
{
    struct rs_rc_qp *rc = arg;
    pthread_mutex_lock(&rc->tx_lock);
    bool abort = rc->tx_fail_abort;
    bool has_cause = rc->tx_fail_has_cause;
    struct rs_term_cause cause = has_cause ? rc->tx_fail_cause : local_catastrophic;
    int detail = rc->tx_fail_detail;
    pthread_mutex_unlock(&rc->tx_lock);
    if (abort)
        rc->abort_close = true;
    rs_rc_fatal(rc, abort ? NULL : &cause, NULL, 0, 0, detail);
}

void rs_rc_tx_failed(struct rs_rc_qp *rc)
{
    if (rs_soft_progress_on_loop(rc->dev))
        tx_failed_loop(rc);
    else if (rs_soft_progress_call(rc->dev, tx_failed_loop, rc) != 0) {
        /* Out of memory: wait for the loop instead, unless this thread receives inline (it holds rx_lock, which the
         * loop may be waiting for). Then the next transmission attempt reports the error again. */
        if (rs_rc_rx_inline_here()) {
            RS_ERROR("soft rc: qp %u cannot queue its transmit error (out of memory)", rc->qp->qpn);
            pthread_mutex_lock(&rc->tx_lock);
            rc->tx_fail_reported = false;
            pthread_mutex_unlock(&rc->tx_lock);
        } else {
            rs_soft_progress_call_sync(rc->dev, tx_failed_loop, rc);
        }
    }
}

/* The core's set_error, on the progress thread: report, then close (gracefully behind a Terminate if we can). */
static void set_error_locked(struct rs_rc_qp *rc)
{
    enum rs_rc_conn conn = rs_rc_conn(rc);
    bool live = conn == RS_RC_CONNECTING || conn == RS_RC_MPA_WAIT || conn == RS_RC_RTS || conn == RS_RC_CLOSING;
    if (live && !rc->final_event_sent && !rc->quiet_error)
        rs_rc_push_event(rc, RS_RNIC_CM_EV_ERROR, rc->error_detail ? rc->error_detail : -ECONNABORTED, NULL, 0);
    if (live)
        rc->final_event_sent = true;
    /* Receives and Reads in progress belong to queues the core flushes right after this returns: no local responder
     * may write into their buffers after that. */
    pthread_mutex_lock(&rc->tx_lock);
    rs_rc_local_release(rc);
    pthread_mutex_unlock(&rc->tx_lock);
    rc->rx.recv = NULL;
    __atomic_store_n(&rc->orq_head, __atomic_load_n(&rc->orq_tail, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    __atomic_store_n(&rc->irq_head, rc->irq_tail, __ATOMIC_RELEASE);
    if (conn == RS_RC_CONNECTING || conn == RS_RC_MPA_WAIT) {
        rs_rc_close_socket(rc, true);
        return;
    }
    if (conn != RS_RC_RTS && conn != RS_RC_CLOSING)
        return;
    pthread_mutex_lock(&rc->tx_lock);
    rc->tx_stopped = true;
    rc->tx.cur = NULL;
    /* Entered from outside (rs_rnic_qp_set_error, CQ overflow): tell the peer with a local-catastrophic Terminate. */
    if (!rc->term_sent && !rc->abort_close && !queue_terminate_locked(rc, &local_catastrophic, NULL, 0, 0))
        rc->abort_close = true;
    /* Without a Terminate of ours to deliver, nothing else is worth finishing: the peer failed (or is about to)
     * and discards, and the rest of the batch points into buffers whose work requests are being flushed. */
    if (rc->abort_close || !rc->term_queued) {
        rc->tx.iov_n = rc->tx.iov_pos = 0;
        rc->tx.raw_len = rc->tx.raw_sent = 0;
    }
    rs_rc_set_conn(rc, RS_RC_DRAINING);
    pthread_mutex_unlock(&rc->tx_lock);
    rs_soft_qp_set_state(rc->qp, RS_QPS_ERROR);
    if (rc->abort_close) {
        rs_rc_close_socket(rc, true);
        return;
    }
    if (!rs_rc_tx_flush_only(rc) && !rc->fin_sent) {
        rs_soft_sys_shutdown(rc->fd, SHUT_WR);
        __atomic_store_n(&rc->fin_sent, true, __ATOMIC_RELEASE);
    }
    if (rc->timer)
        rs_soft_timer_arm(rc->timer, RS_RC_CLOSE_TIMEOUT_MS);
    rs_rc_watch_update(rc);
}

/* rx_lock: an application thread may be receiving inline into the receives about to be flushed. */
static void set_error_loop(void *arg)
{
    struct rs_rc_qp *rc = arg;
    pthread_mutex_lock(&rc->rx_lock);
    set_error_locked(rc);
    pthread_mutex_unlock(&rc->rx_lock);
}

/* ---- rs_soft_rc_ops ---- */

static int rc_qp_create(struct rs_soft_qp *qp)
{
    struct rs_rc_qp *rc = calloc(1, sizeof(*rc));
    if (!rc)
        return -ENOMEM;
    rc->qp = qp;
    rc->dev = qp->dev;
    rc->fd = -1;
    rc->fpdu_max = RS_RC_FPDU_MAX;
    rc->orq_cap = RS_SOFT_MAX_ORD;
    rc->irq_cap = RS_SOFT_MAX_IRD;
    rc->slot_state = calloc(qp->sq.capacity, 1);
    rc->slot_status = calloc(qp->sq.capacity, 1);
    rc->orq = calloc(rc->orq_cap, sizeof(*rc->orq));
    rc->irq = calloc(rc->irq_cap, sizeof(*rc->irq));
    rc->timer = rs_soft_timer_new(qp->dev, rs_rc_timer_cb, rc);
    rc->park_timer = rs_soft_timer_new(qp->dev, rs_rc_park_timer_cb, rc);
    if (!rc->slot_state || !rc->slot_status || !rc->orq || !rc->irq || !rc->timer || !rc->park_timer) {
        rs_soft_timer_free(rc->timer);
        rs_soft_timer_free(rc->park_timer);
        free(rc->slot_state);
        free(rc->slot_status);
        free(rc->orq);
        free(rc->irq);
        free(rc);
        return -ENOMEM;
    }
    const struct rs_rnic_caps *caps = &qp->dev->base.caps;
    rc->local.rev = RS_MPA_REV2;
    rc->local.crc = true;                   /* decided per connection (rc_cm.c, want_crc) */
    /* Interoperability/analysis knob: MPA rev 1 (no IRD/ORD exchange), which tshark 4.0 decodes without warnings. */
    const char *rev = getenv("RDMASOCK_SOFT_MPA_REV");
    if (rev && rev[0] == '1' && rev[1] == '\0')
        rc->local.rev = RS_MPA_REV1;
    rc->local.ird = (uint16_t)(caps->max_ird < rc->irq_cap ? caps->max_ird : rc->irq_cap);
    rc->local.ord = (uint16_t)(caps->max_ord < rc->orq_cap ? caps->max_ord : rc->orq_cap);
    pthread_mutex_init(&rc->tx_lock, NULL);
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&rc->rx_lock, &ma);
    pthread_mutexattr_destroy(&ma);
    rs_rc_set_conn(rc, RS_RC_IDLE);
    /* Published for pollers of the QP's CQs (consumer progress), which may look at the QP from now on. */
    __atomic_store_n(&qp->rc, rc, __ATOMIC_RELEASE);
    return 0;
}

static void destroy_loop(void *arg)
{
    struct rs_rc_qp *rc = arg;
    if (rc->timer) {
        rs_soft_timer_free(rc->timer);
        rc->timer = NULL;
    }
    if (rc->park_timer) {
        rs_soft_timer_free(rc->park_timer);
        rc->park_timer = NULL;
    }
    if (rc->fd >= 0) {
        enum rs_rc_conn conn = rs_rc_conn(rc);
        /* rnic.h: a QP destroyed while connected resets its connection. */
        rs_rc_close_socket(rc, conn != RS_RC_DRAINING || !rc->fin_sent);
    }
    rs_rc_set_conn(rc, RS_RC_CLOSED);
    if (rc->cm) {
        rs_soft_cm_put(rc->cm);
        rc->cm = NULL;
    }
}

static void rc_qp_destroy(struct rs_soft_qp *qp)
{
    struct rs_rc_qp *rc = rs_rc(qp);
    if (!rc)
        return;
    rs_soft_progress_call_sync(rc->dev, destroy_loop, rc);
    pthread_mutex_destroy(&rc->tx_lock);
    pthread_mutex_destroy(&rc->rx_lock);
    free(rc->slot_state);
    free(rc->slot_status);
    free(rc->orq);
    free(rc->irq);
    free(rc);
    qp->rc = NULL;
}

static int rc_post_send(struct rs_soft_qp *qp)
{
    struct rs_rc_qp *rc = rs_rc(qp);
    enum rs_rc_conn conn = rs_rc_conn(rc);
    /* Before RTS the requests wait in the queue; rs_rc_enter_rts starts them. */
    if (conn == RS_RC_RTS || conn == RS_RC_CLOSING)
        rs_rc_tx_run(rc, rs_soft_progress_on_loop(rc->dev));
    return 0;
}

static void rc_set_error(struct rs_soft_qp *qp)
{
    struct rs_rc_qp *rc = rs_rc(qp);
    if (rc)
        rs_soft_progress_call_sync(rc->dev, set_error_loop, rc);
}

static void qos_loop(void *arg)
{
    rs_rc_apply_qos(arg);
}

static int rc_set_qos(struct rs_soft_qp *qp, const struct rs_rnic_qos *qos)
{
    (void)qos;
    struct rs_rc_qp *rc = rs_rc(qp);
    rs_soft_progress_call_sync(rc->dev, qos_loop, rc);
    return 0;
}

/* Consumer progress (soft.h v6): the QP has left its CQs before the half is destroyed, so qp->rc is either not
 * published yet (NULL) or alive. */
static bool rc_rx_inline(struct rs_soft_qp *qp, bool *drained)
{
    struct rs_rc_qp *rc = __atomic_load_n(&qp->rc, __ATOMIC_ACQUIRE);
    *drained = true;
    return rc && rs_rc_rx_inline(rc, drained);
}

static int rc_wait_fd(struct rs_soft_qp *qp)
{
    struct rs_rc_qp *rc = __atomic_load_n(&qp->rc, __ATOMIC_ACQUIRE);
    /* A socket whose end (or fatal error) an application thread already met stays readable until the progress
     * thread has finished it: a waiter on it would spin meanwhile. */
    if (!rc || rs_rc_conn(rc) != RS_RC_RTS || __atomic_load_n(&rc->rx_eof, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&rc->rx_end_pending, __ATOMIC_ACQUIRE) || __atomic_load_n(&rc->rx_stop, __ATOMIC_ACQUIRE))
        return -1;
    pthread_mutex_lock(&rc->tx_lock);
    int fd = rc->fd;
    pthread_mutex_unlock(&rc->tx_lock);
    return fd;
}

static bool rc_reads_placed_directly(const struct rs_soft_qp *qp)
{
    const struct rs_rc_qp *rc = rs_rc(qp);
    /* Racy reads of two flags that only ever go to "no": a stale answer costs one choice of the wrong copy mode. */
    return rc && rs_rc_conn(rc) == RS_RC_RTS && __atomic_load_n(&rc->lread.eligible, __ATOMIC_RELAXED) &&
           __atomic_load_n(&rc->lread.peer_state, __ATOMIC_RELAXED) >= 0;
}

const struct rs_soft_rc_ops rs_soft_rc_ops = {
    .qp_create = rc_qp_create,
    .qp_destroy = rc_qp_destroy,
    .post_send = rc_post_send,
    .post_recv = NULL,              /* RC has no receiver-not-ready state: a SEND without a receive is fatal */
    .set_error = rc_set_error,
    .set_qos = rc_set_qos,
    .expire = NULL,                 /* RC has no lazy timeouts: connect and close timers run on the loop */
    .listen = rs_rc_listen,
    .listener_addr = rs_rc_listener_addr,
    .listener_close = rs_rc_listener_close,
    .listener_park = rs_rc_listener_park,
    .listener_intake = rs_rc_listener_intake,
    .connect = rs_rc_connect,
    .accept = rs_rc_accept,
    .reject = rs_rc_reject,
    .disconnect = rs_rc_disconnect,
    .local_addr = rs_rc_local_addr,
    .request_discard = rs_rc_request_discard,
    .rx_inline = rc_rx_inline,
    .wait_fd = rc_wait_fd,
    .reads_placed_directly = rc_reads_placed_directly,
};

/* =========================================== TEST ONLY ===================================================== */

struct attach_args {
    struct rs_rc_qp *rc;
    int fd;
    uint16_t ird, ord;
    int result;
};

static void attach_loop(void *arg)
{
    struct attach_args *a = arg;
    struct rs_rc_qp *rc = a->rc;
    if (rs_rc_conn(rc) != RS_RC_IDLE || rc->fd >= 0) {
        a->result = -EISCONN;
        return;
    }
    int flags = fcntl(a->fd, F_GETFL);
    if (flags < 0 || fcntl(a->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        a->result = -errno;
        return;
    }
    rc->fd = a->fd;
    rc->peer_len = sizeof(rc->peer);
    if (rs_soft_sys_getpeername(a->fd, (struct sockaddr *)&rc->peer, &rc->peer_len) != 0)
        rc->peer_len = 0;
    rc->neg.rev = RS_MPA_REV1;
    rc->neg.crc = true;
    rc->neg.ird = a->ird < rc->irq_cap ? a->ird : (uint16_t)rc->irq_cap;
    rc->neg.ord = a->ord < rc->orq_cap ? a->ord : (uint16_t)rc->orq_cap;
    rc->watch = rs_soft_watch_add(rc->dev, a->fd, RS_SOFT_EV_READ, rs_rc_io_cb, rc);
    rc->watch_events = RS_SOFT_EV_READ;
    rs_rc_enter_rts(rc);
    rc->lread.eligible = false;     /* a test stream: Read Responses stay on it, where the test sees them */
    a->result = 0;
}

int rs_soft_rc_test_attach(struct rs_rnic_qp *pqp, int fd, uint16_t ird, uint16_t ord)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (qp->type != RS_QPT_RC || !rs_rc(qp))
        return -EINVAL;
    struct attach_args a = { .rc = rs_rc(qp), .fd = fd, .ird = ird, .ord = ord };
    rs_soft_progress_call_sync(qp->dev, attach_loop, &a);
    if (a.result == 0)
        rs_rc_tx_run(a.rc, false);
    return a.result;
}

struct feed_args {
    struct rs_rc_qp *rc;
    const uint8_t *buf;
    size_t len;
};

static void feed_loop(void *arg)
{
    struct feed_args *a = arg;
    struct rs_rc_qp *rc = a->rc;
    rc->rx.feed = a->buf;
    rc->rx.feed_len = a->len;
    while (rc->rx.feed_len > 0 && rs_rc_conn(rc) == RS_RC_RTS) {
        size_t before = rc->rx.feed_len;
        rs_rc_rx_run(rc);
        if (rc->rx.feed_len == before)
            break;
    }
    rc->rx.feed = NULL;
    rc->rx.feed_len = 0;
}

int rs_soft_rc_rx_buffer(struct rs_rnic_qp *pqp, const void *buf, size_t len)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (qp->type != RS_QPT_RC || !rs_rc(qp))
        return -EINVAL;
    struct feed_args a = { .rc = rs_rc(qp), .buf = buf, .len = len };
    rs_soft_progress_call_sync(qp->dev, feed_loop, &a);
    enum rs_rc_conn conn = rs_rc_conn(a.rc);
    return conn == RS_RC_RTS || conn == RS_RC_CLOSING ? 0 : -ECONNABORTED;
}
