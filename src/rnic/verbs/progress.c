/*
 * progress.c: one thread per device, started the first time a CQ, a CM or a UD QP needs it.
 *
 * It sleeps in epoll_wait on: the device's async event fd (CQ overflow, drained send queues), the completion
 * channel of every UD QP's internal CQ (datagrams in and out), the rdma_cm channel of UD binds (SIDR requests
 * from peers resolving us, and the steps of their multicast joins), and an eventfd to be woken. Its timeout is
 * the earliest UD deadline (READ responses, Write-Record and segmented SEND reassembly).
 *
 * Why a thread for UD at all: one-sided operations (Write-Record, the emulated RDMA READ) must make progress at
 * the target even while its application is not polling; with real hardware the HCA would. RC traffic never
 * goes through this thread: its completions are polled straight from the device CQ by the application.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "rnic/verbs/verbs.h"

#define TAG_ASYNC 1
#define TAG_COMP 2
#define TAG_SIDR 3
#define TAG_WAKE 4
#define TAG_CM 5

struct rs_v_progress {
    struct rs_v_dev *dev;
    pthread_t thread;
    int epoll_fd, wake_fd;
    struct ibv_comp_channel *channel;
    struct rdma_event_channel *cm_channel;
    atomic_bool running;
    struct rs_v_watch fixed[4];
    /* Held while the thread works on QPs or CMs, and to change the lists. */
    pthread_mutex_t lock;
    struct rs_v_qp **qps;
    uint32_t nqps, cap;
    struct rs_v_cm **cms;
    uint32_t ncms, cms_cap;
    /* When the thread will look at its timers next: 0 while it is looking, UINT64_MAX when nothing is due. A
     * deadline set by another thread earlier than this kicks it (rs_v_progress_note_deadline). */
    _Atomic uint64_t wake_at;
};

static bool cm_watched(struct rs_v_progress *p, const struct rs_v_cm *cm)
{
    for (uint32_t i = 0; i < p->ncms; i++) {
        if (p->cms[i] == cm)
            return true;
    }
    return false;
}

static bool watched(struct rs_v_progress *p, const struct rs_v_qp *qp)
{
    for (uint32_t i = 0; i < p->nqps; i++) {
        if (p->qps[i] == qp)
            return true;
    }
    return false;
}

#define RS_V_PROGRESS_EVENT_BATCH 64
#define RS_V_PROGRESS_EVENT_SLICE_MS 8

static void handle_comp(struct rs_v_dev *dev, struct rs_v_progress *p)
{
    struct ibv_cq *cq;
    void *context;
    /* A bounded batch: under a steady stream the events never stop coming, and the timers (record and READ
     * deadlines, CM timeouts) run only between batches. The channel stays readable for the next one. */
    uint64_t until = rs_v_now_ms() + RS_V_PROGRESS_EVENT_SLICE_MS;
    for (int n = 0; n < RS_V_PROGRESS_EVENT_BATCH && (n == 0 || rs_v_now_ms() < until) &&
                    ibv_get_cq_event(p->channel, &cq, &context) == 0;
         n++) {
        pthread_mutex_lock(&p->lock);
        struct rs_v_qp *qp = context;
        /* An event of a QP already unwatched is only acknowledged: its destroy waits for that. */
        if (watched(p, qp))
            rs_v_ud_on_event(qp);
        ibv_ack_cq_events(cq, 1);
        pthread_mutex_unlock(&p->lock);
    }
    (void)dev;
}

static void handle_cm(struct rs_v_dev *dev, struct rs_v_progress *p)
{
    struct rdma_cm_event *e;
    (void)dev;
    while (rdma_get_cm_event(p->cm_channel, &e) == 0) {
        struct rdma_cm_id *owner = e->event == RDMA_CM_EVENT_CONNECT_REQUEST ? e->listen_id : e->id;
        struct rs_v_idref *ref = owner ? owner->context : NULL;
        pthread_mutex_lock(&p->lock);
        if (ref && ref->kind == RS_V_ID_UDBIND && watched(p, ref->obj))
            rs_v_ud_cm_event(ref->obj, e);
        pthread_mutex_unlock(&p->lock);
        struct rdma_cm_id *child = e->event == RDMA_CM_EVENT_CONNECT_REQUEST ? e->id : NULL;
        rdma_ack_cm_event(e);
        /* A SIDR request needs no state once answered. */
        if (child)
            rdma_destroy_id(child);
    }
}

static void handle_overflows(struct rs_v_dev *dev)
{
    for (;;) {
        pthread_mutex_lock(&dev->overflow_lock);
        struct rs_v_cq *cq = dev->noverflowed ? dev->overflowed[--dev->noverflowed] : NULL;
        pthread_mutex_unlock(&dev->overflow_lock);
        if (!cq)
            return;
        rs_v_cq_overflowed(cq);
    }
}

static int run_timers(struct rs_v_progress *p)
{
    atomic_store(&p->wake_at, 0);
    uint64_t now = rs_v_now_ms(), next = 0;
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < p->nqps; i++) {
        uint64_t t = rs_v_ud_timers(p->qps[i], now);
        if (t && (!next || t < next))
            next = t;
        t = rs_v_ud_duty_tick(p->qps[i], now);
        if (t && (!next || t < next))
            next = t;
    }
    for (uint32_t i = 0; i < p->ncms; i++) {
        uint64_t t = rs_v_cm_deadlines(p->cms[i], now);
        if (t && (!next || t < next))
            next = t;
    }
    pthread_mutex_unlock(&p->lock);
    atomic_store(&p->wake_at, next ? next : UINT64_MAX);
    if (!next)
        return -1;
    return next <= now ? 0 : (int)(next - now);
}

static void *progress_main(void *arg)
{
    /* Not dev->progress: a stop may already have cleared it when the thread first runs. */
    struct rs_v_progress *p = arg;
    struct rs_v_dev *dev = p->dev;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    while (atomic_load(&p->running)) {
        int timeout = run_timers(p);
        struct epoll_event evs[8];
        int n = epoll_wait(p->epoll_fd, evs, 8, timeout);
        for (int i = 0; i < n; i++) {
            struct rs_v_watch *w = evs[i].data.ptr;
            switch (w->tag) {
            case TAG_ASYNC:
                rs_v_async_drain(dev);
                break;
            case TAG_COMP:
                handle_comp(dev, p);
                break;
            case TAG_SIDR:
                handle_cm(dev, p);
                break;
            case TAG_CM:
                pthread_mutex_lock(&p->lock);
                if (cm_watched(p, w->obj))
                    rs_v_cm_process(w->obj);
                pthread_mutex_unlock(&p->lock);
                break;
            case TAG_WAKE: {
                uint64_t count;
                ssize_t r = read(p->wake_fd, &count, sizeof(count));
                (void)r;
                break;
            }
            default:
                break;
            }
        }
        handle_overflows(dev);
    }
    return NULL;
}

static int add_fd(int epoll_fd, int fd, struct rs_v_watch *w)
{
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = w };
    return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
}

int rs_v_progress_start(struct rs_v_dev *dev)
{
    pthread_mutex_lock(&dev->lock);
    if (dev->progress) {
        pthread_mutex_unlock(&dev->lock);
        return 0;
    }
    struct rs_v_progress *p = calloc(1, sizeof(*p));
    int r = -ENOMEM;
    if (!p)
        goto out;
    p->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->channel = ibv_create_comp_channel(dev->ctx);
    p->cm_channel = rdma_create_event_channel();
    if (p->epoll_fd < 0 || p->wake_fd < 0 || !p->channel || !p->cm_channel) {
        r = errno ? -errno : -ENOMEM;
        goto fail;
    }
    fcntl(p->channel->fd, F_SETFL, fcntl(p->channel->fd, F_GETFL) | O_NONBLOCK);
    fcntl(p->cm_channel->fd, F_SETFL, fcntl(p->cm_channel->fd, F_GETFL) | O_NONBLOCK);
    for (int i = 0; i < 4; i++)
        p->fixed[i].tag = TAG_ASYNC + i;
    if (add_fd(p->epoll_fd, dev->ctx->async_fd, &p->fixed[0]) || add_fd(p->epoll_fd, p->channel->fd, &p->fixed[1]) ||
        add_fd(p->epoll_fd, p->cm_channel->fd, &p->fixed[2]) || add_fd(p->epoll_fd, p->wake_fd, &p->fixed[3])) {
        r = -errno;
        goto fail;
    }
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->running, true);
    p->dev = dev;
    dev->progress = p;
    r = pthread_create(&p->thread, NULL, progress_main, p);
    if (r) {
        dev->progress = NULL;
        pthread_mutex_destroy(&p->lock);
        r = -r;
        goto fail;
    }
    pthread_mutex_unlock(&dev->lock);
    return 0;
fail:
    if (p->cm_channel)
        rdma_destroy_event_channel(p->cm_channel);
    if (p->channel)
        ibv_destroy_comp_channel(p->channel);
    if (p->wake_fd >= 0)
        close(p->wake_fd);
    if (p->epoll_fd >= 0)
        close(p->epoll_fd);
    free(p);
out:
    pthread_mutex_unlock(&dev->lock);
    return r;
}

void rs_v_progress_note_deadline(struct rs_v_dev *dev, uint64_t deadline_ms)
{
    struct rs_v_progress *p = dev->progress;
    if (!p)
        return;
    uint64_t wake_at = atomic_load(&p->wake_at);
    /* 0: the thread is looking now and may have passed this QP already; a kick costs it one more look. */
    if (wake_at == 0 || deadline_ms < wake_at)
        rs_v_progress_kick(dev);
}

void rs_v_progress_kick(struct rs_v_dev *dev)
{
    struct rs_v_progress *p = dev->progress;
    if (!p)
        return;
    uint64_t one = 1;
    ssize_t w = write(p->wake_fd, &one, sizeof(one));
    (void)w;
}

void rs_v_progress_stop(struct rs_v_dev *dev)
{
    pthread_mutex_lock(&dev->lock);
    struct rs_v_progress *p = dev->progress;
    dev->progress = NULL;
    pthread_mutex_unlock(&dev->lock);
    if (!p)
        return;
    atomic_store(&p->running, false);
    uint64_t one = 1;
    ssize_t w = write(p->wake_fd, &one, sizeof(one));
    (void)w;
    if (!pthread_equal(pthread_self(), p->thread))
        pthread_join(p->thread, NULL);
    rdma_destroy_event_channel(p->cm_channel);
    ibv_destroy_comp_channel(p->channel);
    close(p->wake_fd);
    close(p->epoll_fd);
    pthread_mutex_destroy(&p->lock);
    free(p->qps);
    free(p->cms);
    free(p);
}

struct ibv_comp_channel *rs_v_progress_channel(struct rs_v_dev *dev)
{
    return dev->progress ? dev->progress->channel : NULL;
}

struct rdma_event_channel *rs_v_progress_cm_channel(struct rs_v_dev *dev)
{
    return dev->progress ? dev->progress->cm_channel : NULL;
}

bool rs_v_on_progress_thread(const struct rs_v_dev *dev)
{
    return dev->progress && pthread_equal(pthread_self(), dev->progress->thread);
}

int rs_v_progress_watch_qp(struct rs_v_dev *dev, struct rs_v_qp *qp)
{
    struct rs_v_progress *p = dev->progress;
    if (!p)
        return -ENODEV;
    pthread_mutex_lock(&p->lock);
    int r = 0;
    if (!watched(p, qp)) {
        if (p->nqps == p->cap) {
            uint32_t cap = p->cap ? p->cap * 2 : 16;
            struct rs_v_qp **qps = realloc(p->qps, cap * sizeof(*qps));
            if (!qps)
                r = -ENOMEM;
            else {
                p->qps = qps;
                p->cap = cap;
            }
        }
        if (r == 0)
            p->qps[p->nqps++] = qp;
    }
    pthread_mutex_unlock(&p->lock);
    rs_v_progress_kick(dev);
    return r;
}

void rs_v_progress_unwatch_qp(struct rs_v_dev *dev, struct rs_v_qp *qp)
{
    struct rs_v_progress *p = dev->progress;
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < p->nqps; i++) {
        if (p->qps[i] == qp) {
            p->qps[i] = p->qps[--p->nqps];
            break;
        }
    }
    pthread_mutex_unlock(&p->lock);
}

void rs_v_progress_overflow(struct rs_v_dev *dev, struct rs_v_cq *cq)
{
    pthread_mutex_lock(&dev->overflow_lock);
    bool known = false;
    for (uint32_t i = 0; i < dev->noverflowed; i++)
        known |= dev->overflowed[i] == cq;
    if (!known && dev->noverflowed < sizeof(dev->overflowed) / sizeof(dev->overflowed[0]))
        dev->overflowed[dev->noverflowed++] = cq;
    pthread_mutex_unlock(&dev->overflow_lock);
    rs_v_progress_kick(dev);
}

void rs_v_progress_forget_cq(struct rs_v_dev *dev, struct rs_v_cq *cq)
{
    pthread_mutex_lock(&dev->overflow_lock);
    for (uint32_t i = 0; i < dev->noverflowed; i++) {
        if (dev->overflowed[i] == cq)
            dev->overflowed[i--] = dev->overflowed[--dev->noverflowed];
    }
    pthread_mutex_unlock(&dev->overflow_lock);
}

int rs_v_progress_watch_cm(struct rs_v_dev *dev, struct rs_v_cm *cm)
{
    struct rs_v_progress *p = dev->progress;
    if (!p)
        return -ENODEV;
    pthread_mutex_lock(&p->lock);
    int r = 0;
    if (p->ncms == p->cms_cap) {
        uint32_t cap = p->cms_cap ? p->cms_cap * 2 : 8;
        struct rs_v_cm **cms = realloc(p->cms, cap * sizeof(*cms));
        if (!cms)
            r = -ENOMEM;
        else {
            p->cms = cms;
            p->cms_cap = cap;
        }
    }
    if (r == 0) {
        cm->watch.tag = TAG_CM;
        cm->watch.obj = cm;
        if (add_fd(p->epoll_fd, cm->channel->fd, &cm->watch))
            r = -errno;
        else
            p->cms[p->ncms++] = cm;
    }
    pthread_mutex_unlock(&p->lock);
    return r;
}

void rs_v_progress_unwatch_cm(struct rs_v_dev *dev, struct rs_v_cm *cm)
{
    struct rs_v_progress *p = dev->progress;
    if (!p)
        return;
    /* The thread itself drops CMs (the last reference may go while it handles an event): it holds the lock. */
    bool mine = pthread_equal(pthread_self(), p->thread);
    if (!mine)
        pthread_mutex_lock(&p->lock);
    epoll_ctl(p->epoll_fd, EPOLL_CTL_DEL, cm->channel->fd, NULL);
    for (uint32_t i = 0; i < p->ncms; i++) {
        if (p->cms[i] == cm) {
            p->cms[i] = p->cms[--p->ncms];
            break;
        }
    }
    if (!mine)
        pthread_mutex_unlock(&p->lock);
}
