/*
 * soft_cq.c: completion queues of the soft RNIC: a ring of work completions under a mutex, an eventfd for
 * notification, and the list of QPs using the CQ (to fail them on overflow and to run their timeouts lazily when
 * the CQ is polled: a UD READ or a Write-Record whose data never comes is reported on the next poll even if the
 * progress thread's timer has not fired yet, so polling never waits forever).
 *
 * Consumer progress (soft.h v6, docs/rnic-rc.md): a thread about to block gets the sockets of the RC QPs that receive
 * into this CQ to wait on (rs_soft_cq_wait_begin), and its polls until rs_soft_cq_wait_end read them on that thread
 * when the ring is empty. Without it every inbound message costs two wake-ups in a row, the progress thread's (socket
 * readable) and then the waiter's (CQ fd written), which on a loaded host is most of a small message's latency. What
 * the polling thread adds and takes back in the same call does not fire the armed notification: nobody else needs to
 * hear about it, and firing it would wake whoever else watches the CQ fd for nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>

#include "common/log.h"
#include "rnic/soft/soft.h"
#include "common/fdutil.h"

int rs_soft_create_cq(struct rs_rnic *rnic, uint32_t depth, struct rs_rnic_cq **out)
{
    if (depth == 0 || depth > RS_SOFT_MAX_CQE)
        return -EINVAL;
    struct rs_soft_cq *cq = calloc(1, sizeof(*cq));
    if (!cq)
        return -ENOMEM;
    cq->ring = calloc(depth, sizeof(*cq->ring));
    if (!cq->ring) {
        free(cq);
        return -ENOMEM;
    }
    cq->event_fd = rs_fd_move_high(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (cq->event_fd < 0) {
        int err = -errno;
        free(cq->ring);
        free(cq);
        return err;
    }
    cq->base.rnic = rnic;
    cq->dev = rs_soft_dev(rnic);
    cq->depth = depth;
    cq->delay_fd = -1;
    pthread_mutex_init(&cq->lock, NULL);
    pthread_mutex_init(&cq->attach_lock, NULL);
    *out = &cq->base;
    return 0;
}

static void barrier_fn(void *arg) { (void)arg; }

int rs_soft_destroy_cq(struct rs_rnic_cq *pcq)
{
    struct rs_soft_cq *cq = rs_soft_cq(pcq);
    pthread_mutex_lock(&cq->attach_lock);
    uint32_t users = cq->attached_count;
    pthread_mutex_unlock(&cq->attach_lock);
    if (users)
        return -EBUSY;
    /* An overflow handler queued on the progress thread may still name this CQ: let it run first. */
    rs_soft_progress_call_sync(cq->dev, barrier_fn, NULL);
    rs_soft_watch_del(cq->delay_watch);
    if (cq->delay_fd >= 0)
        rs_soft_sys_close(cq->delay_fd);
    rs_soft_sys_close(cq->event_fd);
    pthread_mutex_destroy(&cq->lock);
    pthread_mutex_destroy(&cq->attach_lock);
    free(cq->attached);
    free(cq->ring);
    free(cq);
    return 0;
}

int rs_soft_cq_fd(const struct rs_rnic_cq *pcq)
{
    return ((const struct rs_soft_cq *)pcq)->event_fd;
}

static void signal_fd(struct rs_soft_cq *cq)
{
    uint64_t one = 1;
    /* EAGAIN only when the counter is saturated, i.e. already readable. */
    (void)rs_soft_sys_write(cq->event_fd, &one, sizeof(one));
}

int rs_soft_cq_arm(struct rs_rnic_cq *pcq, bool solicited_only)
{
    struct rs_soft_cq *cq = rs_soft_cq(pcq);
    pthread_mutex_lock(&cq->lock);
    if (cq->armed)
        cq->armed_solicited_only = cq->armed_solicited_only && solicited_only;
    else
        cq->armed_solicited_only = solicited_only;
    cq->armed = true;
    pthread_mutex_unlock(&cq->lock);
    return 0;
}

void rs_soft_cq_ack_events(struct rs_rnic_cq *pcq)
{
    struct rs_soft_cq *cq = rs_soft_cq(pcq);
    uint64_t value;
    (void)rs_soft_sys_read(cq->event_fd, &value, sizeof(value));
}

/* ---- attachment, overflow ---- */

int rs_soft_cq_attach(struct rs_soft_cq *cq, struct rs_soft_qp *qp)
{
    pthread_mutex_lock(&cq->attach_lock);
    if (cq->attached_count == cq->attached_capacity) {
        uint32_t cap = cq->attached_capacity ? cq->attached_capacity * 2 : 4;
        struct rs_soft_qp **list = realloc(cq->attached, cap * sizeof(*list));
        if (!list) {
            pthread_mutex_unlock(&cq->attach_lock);
            return -ENOMEM;
        }
        cq->attached = list;
        cq->attached_capacity = cap;
    }
    cq->attached[cq->attached_count++] = qp;
    pthread_mutex_unlock(&cq->attach_lock);
    return 0;
}

void rs_soft_cq_detach(struct rs_soft_cq *cq, struct rs_soft_qp *qp)
{
    pthread_mutex_lock(&cq->attach_lock);
    for (uint32_t i = 0; i < cq->attached_count; i++) {
        if (cq->attached[i] == qp) {
            cq->attached[i] = cq->attached[--cq->attached_count];
            break;
        }
    }
    pthread_mutex_unlock(&cq->attach_lock);
}

/* Progress thread: fail every QP of an overflowed CQ. attach_lock keeps them alive (destroy detaches first). */
static void overflow_fn(void *arg)
{
    struct rs_soft_cq *cq = arg;
    pthread_mutex_lock(&cq->attach_lock);
    for (uint32_t i = 0; i < cq->attached_count; i++)
        rs_soft_qp_enter_error(cq->attached[i]);
    pthread_mutex_unlock(&cq->attach_lock);
}

/* ---- notification deferred to the end of a progress callback (soft.h) ---- */

#define DEFER_MAX 16                /* distinct CQs one callback can notify late; more are notified at once */

/* Thread-local: only the progress thread ever turns deferral on, and only around one callback, so the list is
 * empty whenever anything else (a CQ being destroyed, an overflow handler) runs on that thread. */
static __thread bool defer_on;
static __thread unsigned defer_count;
static __thread struct rs_soft_cq *defer_list[DEFER_MAX];

void rs_soft_cq_defer_begin(void)
{
    defer_on = true;
}

void rs_soft_cq_defer_end(void)
{
    defer_on = false;
    for (unsigned i = 0; i < defer_count; i++)
        signal_fd(defer_list[i]);
    defer_count = 0;
}

/* The armed notification of cq fired: write its fd now, or at the end of the current progress callback. */
static void notify(struct rs_soft_cq *cq)
{
    if (defer_on) {
        for (unsigned i = 0; i < defer_count; i++)
            if (defer_list[i] == cq)
                return;
        if (defer_count < DEFER_MAX) {
            defer_list[defer_count++] = cq;
            return;
        }
    }
    signal_fd(cq);
}

/* ---- late notification (soft.h, rs_soft_cq_push) ---- */

/* Takes a pending late notification: true (and the arm consumed) if one is due, i.e. what was added is still in
 * the CQ and the CQ is armed. timer: called because the delay expired (its timer is no longer armed). */
static bool take_late_notification(struct rs_soft_cq *cq, bool timer)
{
    pthread_mutex_lock(&cq->lock);
    if (timer)
        cq->delay_armed = false;
    bool wake = cq->notify_pending && cq->count > 0 && cq->armed;
    cq->notify_pending = false;
    if (wake)
        cq->armed = false;
    pthread_mutex_unlock(&cq->lock);
    return wake;
}

/* Progress thread: the delay expired. Fires the arm if what was added is still there. */
static void delay_cb(struct rs_soft_watch *w, int fd, unsigned revents, void *arg)
{
    (void)w;
    (void)revents;
    struct rs_soft_cq *cq = arg;
    uint64_t expirations;
    (void)rs_soft_sys_read(fd, &expirations, sizeof(expirations));
    if (take_late_notification(cq, true))
        notify(cq);
}

/* First wait bracket: the timer that bounds late notifications. Without it (false) notifications stay immediate. */
static bool delay_setup(struct rs_soft_cq *cq)
{
    pthread_mutex_lock(&cq->lock);
    bool ready = cq->consumer_waits;
    pthread_mutex_unlock(&cq->lock);
    if (ready)
        return true;
    int fd = rs_fd_move_high(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (fd < 0)
        return false;
    struct rs_soft_watch *w = rs_soft_watch_add(cq->dev, fd, RS_SOFT_EV_READ, delay_cb, cq);
    if (!w) {
        rs_soft_sys_close(fd);
        return false;
    }
    pthread_mutex_lock(&cq->lock);
    bool lost = cq->consumer_waits;       /* another waiter set it up meanwhile */
    if (!lost) {
        cq->delay_fd = fd;
        cq->delay_watch = w;
        cq->consumer_waits = true;
    }
    pthread_mutex_unlock(&cq->lock);
    if (lost) {
        rs_soft_watch_del(w);
        rs_soft_sys_close(fd);
    }
    return true;
}

static void delay_start(struct rs_soft_cq *cq)
{
    struct itimerspec its = { .it_value = { .tv_sec = 0, .tv_nsec = (long)RS_SOFT_LATE_NOTIFY_US * 1000L } };
    if (timerfd_settime(cq->delay_fd, 0, &its, NULL) != 0) {
        /* Cannot be late then: notify now. */
        pthread_mutex_lock(&cq->lock);
        cq->delay_armed = false;
        bool wake = cq->notify_pending && cq->armed;
        cq->notify_pending = false;
        if (wake)
            cq->armed = false;
        pthread_mutex_unlock(&cq->lock);
        if (wake)
            signal_fd(cq);
    }
}

/* The CQ whose poll is running consumer progress on this thread (see rs_soft_poll_cq), or NULL. */
static __thread struct rs_soft_cq *inline_cq;
/* The CQ this thread is blocked on or just woke from (between rs_soft_cq_wait_begin and _end), or NULL, and
 * whether this bracket already read every socket dry: the consumer polls on until the CQ is empty, and a second
 * read would only find nothing (what arrives later wakes the next wait at once: the socket stays parked). */
static __thread struct rs_soft_cq *waiting_cq;
static __thread bool waiting_drained;

int rs_soft_cq_push(struct rs_soft_cq *cq, const struct rs_rnic_wc *wc)
{
    pthread_mutex_lock(&cq->lock);
    if (cq->overflowed) {
        pthread_mutex_unlock(&cq->lock);
        return -EOVERFLOW;
    }
    if (cq->count == cq->depth) {
        cq->overflowed = true;
        pthread_mutex_unlock(&cq->lock);
        RS_SOFT_STAT(cq->dev, cq_overflows, 1);
        RS_WARN("soft rnic: completion queue of depth %u overflowed; its QPs go to ERROR", cq->depth);
        signal_fd(cq);      /* a waiter must learn about it even if not armed */
        if (rs_soft_progress_call(cq->dev, overflow_fn, cq) != 0)
            RS_ERROR("soft rnic: cannot queue the overflow handling (out of memory)");
        return -EOVERFLOW;
    }
    cq->ring[(cq->head + cq->count) % cq->depth] = *wc;
    cq->count++;
    if (cq == inline_cq) {
        /* The poll that runs this progress takes it next; it fires the arm itself for whatever it leaves. */
        cq->inline_pushed = true;
        pthread_mutex_unlock(&cq->lock);
        return 0;
    }
    bool wake = cq->armed &&
                (!cq->armed_solicited_only || (wc->flags & RS_WC_SOLICITED) || wc->status != RS_WC_SUCCESS);
    bool start_delay = false;
    if (wake && cq->consumer_waits && wc->status == RS_WC_SUCCESS && !defer_on &&
        !rs_soft_progress_on_loop(cq->dev)) {
        /* An application thread's own completion: late (soft.h). The arm stays until then. */
        wake = false;
        cq->notify_pending = true;
        start_delay = !cq->delay_armed;
        cq->delay_armed = true;
    }
    if (wake)
        cq->armed = false;
    pthread_mutex_unlock(&cq->lock);
    if (wake)
        notify(cq);
    if (start_delay)
        delay_start(cq);
    return 0;
}

/* ---- lazy timeouts ---- */

static void lower_deadline(uint64_t *slot, uint64_t deadline_ns)
{
    uint64_t cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    while (cur == 0 || deadline_ns < cur) {
        if (__atomic_compare_exchange_n(slot, &cur, deadline_ns, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return;
    }
}

void rs_soft_cq_note_deadline(struct rs_soft_cq *cq, uint64_t deadline_ns)
{
    if (deadline_ns)
        lower_deadline(&cq->next_deadline_ns, deadline_ns);
}

void rs_soft_qp_note_deadline(struct rs_soft_qp *qp, uint64_t deadline_ns)
{
    if (!deadline_ns)
        return;
    lower_deadline(&qp->next_deadline_ns, deadline_ns);
    if (qp->send_cq)
        rs_soft_cq_note_deadline(qp->send_cq, deadline_ns);
    if (qp->recv_cq && qp->recv_cq != qp->send_cq)
        rs_soft_cq_note_deadline(qp->recv_cq, deadline_ns);
}

/* Runs the due timeouts of the CQ's QPs, then recomputes the CQ's earliest deadline. */
static void run_due_timeouts(struct rs_soft_cq *cq)
{
    uint64_t due = __atomic_load_n(&cq->next_deadline_ns, __ATOMIC_ACQUIRE);
    if (!due)
        return;
    uint64_t now = rs_soft_now_ns();
    if (now < due)
        return;
    pthread_mutex_lock(&cq->attach_lock);
    __atomic_store_n(&cq->next_deadline_ns, 0, __ATOMIC_RELEASE);
    for (uint32_t i = 0; i < cq->attached_count; i++) {
        struct rs_soft_qp *qp = cq->attached[i];
        uint64_t qd = __atomic_load_n(&qp->next_deadline_ns, __ATOMIC_ACQUIRE);
        if (qd && qd <= now)
            rs_soft_qp_expire(qp, now);     /* re-notes what is still pending */
        else if (qd)
            rs_soft_cq_note_deadline(cq, qd);
    }
    pthread_mutex_unlock(&cq->attach_lock);
}

/* cq->lock held: moves up to n completions out of the ring. */
static int take_locked(struct rs_soft_cq *cq, int n, struct rs_rnic_wc *wc)
{
    int got = 0;
    while (got < n && cq->count > 0) {
        wc[got++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->depth;
        cq->count--;
    }
    return got;
}

/*
 * Receives inline for the RC QPs whose receive CQ this is. attach_lock keeps them attached and alive (RC QPs
 * detach before their half is destroyed). Returns true when some QP may have added completions.
 *
 * Only a thread inside a wait bracket (rs_soft_cq_wait_begin .. _end) does it: that thread watched the sockets,
 * so it is the one the bytes woke, and the progress thread leaves them to it (rs_rc_rx_event). Any other poll of an
 * empty CQ would mostly cost a read that finds nothing (consumers poll until the CQ is empty, several times per
 * message) while the progress thread serves the socket anyway. The progress thread never waits in a bracket, so
 * inline_cq never shadows its deferred notifications.
 */
static bool consumer_progress(struct rs_soft_cq *cq)
{
    if (!rs_soft_rc_ops.rx_inline || cq != waiting_cq || waiting_drained)
        return false;
    bool any = false, all_drained = true;
    pthread_mutex_lock(&cq->attach_lock);
    inline_cq = cq;
    for (uint32_t i = 0; i < cq->attached_count; i++) {
        struct rs_soft_qp *qp = cq->attached[i];
        bool drained = true;
        if (qp->type == RS_QPT_RC && qp->recv_cq == cq && rs_soft_rc_ops.rx_inline(qp, &drained))
            any = true;
        all_drained = all_drained && drained;
    }
    inline_cq = NULL;
    waiting_drained = all_drained;
    pthread_mutex_unlock(&cq->attach_lock);
    return any;
}

int rs_soft_poll_cq(struct rs_rnic_cq *pcq, int n, struct rs_rnic_wc *wc)
{
    struct rs_soft_cq *cq = rs_soft_cq(pcq);
    if (n < 0)
        return -EINVAL;
    run_due_timeouts(cq);
    pthread_mutex_lock(&cq->lock);
    if (cq->overflowed) {
        pthread_mutex_unlock(&cq->lock);
        return -EOVERFLOW;
    }
    int got = take_locked(cq, n, wc);
    if (cq->count == 0)
        cq->notify_pending = false;     /* a late notification has nothing left to announce */
    pthread_mutex_unlock(&cq->lock);
    if (got == n || n == 0 || !consumer_progress(cq))
        return got;
    pthread_mutex_lock(&cq->lock);
    if (cq->overflowed) {
        pthread_mutex_unlock(&cq->lock);
        return got ? got : -EOVERFLOW;
    }
    got += take_locked(cq, n - got, wc + got);
    /* What this thread added and left behind (n too small) is news for the armed waiter after all. The
     * solicited-only filter is not replayed: a spurious wake-up is harmless, a lost one is not. */
    bool wake = cq->inline_pushed && cq->count > 0 && cq->armed;
    cq->inline_pushed = false;
    if (cq->count == 0)
        cq->notify_pending = false;
    if (wake)
        cq->armed = false;
    pthread_mutex_unlock(&cq->lock);
    if (wake)
        signal_fd(cq);
    return got;
}

/* ---- blocking waits with consumer progress ---- */

int rs_soft_cq_wait_begin(struct rs_rnic_cq *pcq, int *fds, int max)
{
    struct rs_soft_cq *cq = rs_soft_cq(pcq);
    if (!rs_soft_rc_ops.wait_fd || rs_soft_progress_on_loop(cq->dev) || waiting_cq)
        return 0;
    /* A late notification is due at once for someone about to sleep on the CQ (whatever this call returns). */
    if (take_late_notification(cq, false))
        signal_fd(cq);
    int n = 0;
    bool all = true;
    pthread_mutex_lock(&cq->attach_lock);
    for (uint32_t i = 0; i < cq->attached_count; i++) {
        struct rs_soft_qp *qp = cq->attached[i];
        if (qp->type != RS_QPT_RC || qp->recv_cq != cq)
            continue;
        int fd = rs_soft_rc_ops.wait_fd(qp);
        if (fd < 0)
            continue;
        if (n == max) {
            all = false;
            break;
        }
        fds[n++] = fd;
    }
    /* The count makes the progress thread leave every socket of the CQ to the waiters, so it is only taken when
     * this waiter watches them all; otherwise the waiter sleeps on the CQ fd alone and nothing changes. */
    if (!all)
        n = 0;
    if (n > 0) {
        __atomic_add_fetch(&cq->blocked_waiters, 1, __ATOMIC_ACQ_REL);
        waiting_cq = cq;
        waiting_drained = false;
    }
    pthread_mutex_unlock(&cq->attach_lock);
    /* From the first bracket that watches sockets on, this CQ's consumer polls after posting: late notification. */
    if (n > 0)
        (void)delay_setup(cq);
    return n;
}

void rs_soft_cq_wait_recheck(struct rs_rnic_cq *pcq)
{
    /* Time has passed since the poll that found every socket dry: read them again on the next poll. Without this
     * a spinning waiter polled an empty CQ until its budget ran out while the progress thread, which leaves a
     * bracket's sockets to the waiter, read nothing either: the reply waited for the sleep that followed. */
    if (waiting_cq == rs_soft_cq(pcq))
        waiting_drained = false;
}

void rs_soft_cq_wait_end(struct rs_rnic_cq *pcq)
{
    struct rs_soft_cq *cq = rs_soft_cq(pcq);
    if (waiting_cq != cq)
        return;
    waiting_cq = NULL;
    __atomic_sub_fetch(&cq->blocked_waiters, 1, __ATOMIC_ACQ_REL);
}
