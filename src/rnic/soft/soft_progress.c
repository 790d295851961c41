/*
 * soft_progress.c: the progress engine of a soft RNIC device, one libev loop on one thread.
 *
 * Why a thread: an RNIC places data and generates completions without the application calling in (independent
 * progress). With a helper thread a receive, a Write-Record segment or a READ response lands while the application
 * computes, and completion fds become readable on their own. Why only one per device: every socket of the device
 * is served by the same thread, so receive-side state needs no locking against other receive paths and lock
 * contention stays limited to application threads posting and polling.
 *
 * Fairness: watches are level-triggered and each callback handles a bounded budget per turn, so every ready
 * socket is served once per loop iteration and a busy QP cannot starve the others.
 *
 * libev objects are only touched on the loop thread. Other threads hand requests over through a FIFO of calls
 * and an ev_async wake-up; because the FIFO preserves order, an add followed by a delete from the same thread can
 * never be reordered.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "common/log.h"
#include "common/thread.h"
#include "rnic/soft/soft.h"

struct rs_soft_call {
    struct rs_soft_call *next;
    rs_soft_call_fn fn;
    void *arg;
    bool sync;                  /* lives on the caller's stack; the caller waits for done */
    bool done;
};

struct rs_soft_progress {
    struct rs_soft_device *dev;
    struct ev_loop *loop;
    pthread_t thread;
    bool thread_running;
    ev_async wake;
    pthread_mutex_t lock;       /* calls FIFO, done flags */
    pthread_cond_t done_cond;
    struct rs_soft_call *first, *last;
};

struct rs_soft_watch {
    ev_io io;
    struct rs_soft_progress *progress;
    int fd;
    unsigned wanted;            /* events asked for (atomic); applied on the loop thread */
    rs_soft_io_cb cb;
    void *arg;
    bool deleted;               /* loop thread only */
};

struct rs_soft_timer {
    ev_timer timer;
    struct rs_soft_progress *progress;
    uint32_t wanted_ms;         /* atomic; applied on the loop thread */
    rs_soft_timer_cb cb;
    void *arg;
    bool deleted;
};

bool rs_soft_progress_on_loop(const struct rs_soft_device *dev)
{
    const struct rs_soft_progress *p = dev->progress;
    return p && p->thread_running && pthread_equal(pthread_self(), p->thread);
}

/* Runs every queued call; the loop thread only. */
static void run_calls(struct rs_soft_progress *p)
{
    for (;;) {
        pthread_mutex_lock(&p->lock);
        struct rs_soft_call *call = p->first;
        if (call) {
            p->first = call->next;
            if (!p->first)
                p->last = NULL;
        }
        pthread_mutex_unlock(&p->lock);
        if (!call)
            return;
        call->fn(call->arg);
        if (call->sync) {
            pthread_mutex_lock(&p->lock);
            call->done = true;
            pthread_cond_broadcast(&p->done_cond);
            pthread_mutex_unlock(&p->lock);
        } else {
            free(call);
        }
    }
}

static void wake_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)revents;
    run_calls((struct rs_soft_progress *)w->data);
}

static void *loop_main(void *arg)
{
    struct rs_soft_progress *p = arg;
    ev_run(p->loop, 0);
    /* Calls queued after the break (there should be none once every object is gone) still run, so no caller of
     * _call_sync waits forever. */
    run_calls(p);
    return NULL;
}

static void enqueue(struct rs_soft_progress *p, struct rs_soft_call *call)
{
    call->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->last)
        p->last->next = call;
    else
        p->first = call;
    p->last = call;
    pthread_mutex_unlock(&p->lock);
    ev_async_send(p->loop, &p->wake);
}

int rs_soft_progress_call(struct rs_soft_device *dev, rs_soft_call_fn fn, void *arg)
{
    struct rs_soft_call *call = calloc(1, sizeof(*call));
    if (!call)
        return -ENOMEM;
    call->fn = fn;
    call->arg = arg;
    enqueue(dev->progress, call);
    return 0;
}

void rs_soft_progress_call_sync(struct rs_soft_device *dev, rs_soft_call_fn fn, void *arg)
{
    struct rs_soft_progress *p = dev->progress;
    if (rs_soft_progress_on_loop(dev)) {
        fn(arg);
        return;
    }
    struct rs_soft_call call = { .fn = fn, .arg = arg, .sync = true };
    enqueue(p, &call);
    pthread_mutex_lock(&p->lock);
    while (!call.done)
        pthread_cond_wait(&p->done_cond, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

static void break_loop(void *arg)
{
    struct rs_soft_progress *p = arg;
    ev_break(p->loop, EVBREAK_ALL);
}

/* Undoes rs_soft_progress_start once no loop thread runs. */
static void progress_free(struct rs_soft_device *dev)
{
    struct rs_soft_progress *p = dev->progress;
    ev_async_stop(p->loop, &p->wake);
    ev_loop_destroy(p->loop);
    pthread_cond_destroy(&p->done_cond);
    pthread_mutex_destroy(&p->lock);
    free(p);
    dev->progress = NULL;
}

int rs_soft_progress_start(struct rs_soft_device *dev)
{
    struct rs_soft_progress *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->dev = dev;
    /* NOSIGMASK: the host program owns signal handling; the loop handles no signals. */
    p->loop = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
    if (!p->loop) {
        free(p);
        return -ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->done_cond, NULL);
    ev_async_init(&p->wake, wake_cb);
    p->wake.data = p;
    ev_async_start(p->loop, &p->wake);
    /* The loop keeps running while only the wake-up watcher is active. */
    dev->progress = p;

    /* Every signal blocked (thread.h): a handler interrupting the loop could otherwise re-enter the library. */
    int rc = rs_thread_start(&p->thread, loop_main, p, false);
    if (rc != 0) {
        progress_free(dev);
        return -rc;
    }
    p->thread_running = true;
    pthread_setname_np(p->thread, "rdmasock-soft");
    return 0;
}

void rs_soft_progress_stop(struct rs_soft_device *dev)
{
    struct rs_soft_progress *p = dev->progress;
    if (!p)
        return;
    if (p->thread_running) {
        rs_soft_progress_call_sync(dev, break_loop, p);
        pthread_join(p->thread, NULL);
        p->thread_running = false;
    }
    progress_free(dev);
}

/* ---- fd watches ---- */

static int ev_events(unsigned events)
{
    return ((events & RS_SOFT_EV_READ) ? EV_READ : 0) | ((events & RS_SOFT_EV_WRITE) ? EV_WRITE : 0);
}

static void io_cb(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)loop;
    struct rs_soft_watch *w = (struct rs_soft_watch *)io;
    unsigned r = ((revents & EV_READ) ? RS_SOFT_EV_READ : 0) | ((revents & EV_WRITE) ? RS_SOFT_EV_WRITE : 0);
    if (!w->deleted) {
        /* Completions this turn produces wake their waiters once, after it (soft.h). */
        rs_soft_cq_defer_begin();
        w->cb(w, w->fd, r, w->arg);
        rs_soft_cq_defer_end();
    }
}

static void watch_apply(void *arg)
{
    struct rs_soft_watch *w = arg;
    if (w->deleted)
        return;
    struct ev_loop *loop = w->progress->loop;
    int want = ev_events(__atomic_load_n(&w->wanted, __ATOMIC_ACQUIRE));
    if (ev_is_active(&w->io)) {
        if ((w->io.events & (EV_READ | EV_WRITE)) == want)
            return;
        ev_io_stop(loop, &w->io);
    }
    if (want) {
        ev_io_set(&w->io, w->fd, want);
        ev_io_start(loop, &w->io);
    }
}

struct rs_soft_watch *rs_soft_watch_add(struct rs_soft_device *dev, int fd, unsigned events, rs_soft_io_cb cb,
                                        void *arg)
{
    struct rs_soft_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->progress = dev->progress;
    w->fd = fd;
    w->wanted = events;
    w->cb = cb;
    w->arg = arg;
    ev_io_init(&w->io, io_cb, fd, ev_events(events));
    if (rs_soft_progress_on_loop(dev)) {
        watch_apply(w);
    } else if (rs_soft_progress_call(dev, watch_apply, w) != 0) {
        free(w);
        return NULL;
    }
    return w;
}

void rs_soft_watch_set(struct rs_soft_watch *w, unsigned events)
{
    unsigned old = __atomic_exchange_n(&w->wanted, events, __ATOMIC_ACQ_REL);
    if (rs_soft_progress_on_loop(w->progress->dev)) {
        watch_apply(w);
        return;
    }
    if (old == events)
        return;             /* a queued apply (or the current state) already matches */
    if (rs_soft_progress_call(w->progress->dev, watch_apply, w) != 0)
        RS_WARN("soft rnic: cannot queue a watch change for fd %d (out of memory)", w->fd);
}

static void free_later(void *arg) { free(arg); }

static void watch_delete(void *arg)
{
    struct rs_soft_watch *w = arg;
    if (ev_is_active(&w->io))
        ev_io_stop(w->progress->loop, &w->io);
    w->deleted = true;
}

/* Stops a watch or timer on the loop thread and frees it once nothing can still name it. */
static void retire_on_loop(struct rs_soft_device *dev, rs_soft_call_fn stop, void *obj, const char *what)
{
    if (rs_soft_progress_on_loop(dev)) {
        stop(obj);
        /* Calls queued before this point may still name obj; free it after them. */
        if (rs_soft_progress_call(dev, free_later, obj) != 0)
            RS_WARN("soft rnic: leaking a %s (out of memory)", what);
        return;
    }
    rs_soft_progress_call_sync(dev, stop, obj);
    free(obj);
}

void rs_soft_watch_del(struct rs_soft_watch *w)
{
    if (!w)
        return;
    retire_on_loop(w->progress->dev, watch_delete, w, "watch");
}

/* ---- timers ---- */

static void timer_cb(struct ev_loop *loop, ev_timer *et, int revents)
{
    (void)loop;
    (void)revents;
    struct rs_soft_timer *t = (struct rs_soft_timer *)et;
    if (!t->deleted)
        t->cb(t, t->arg);
}

static void timer_apply(void *arg)
{
    struct rs_soft_timer *t = arg;
    if (t->deleted)
        return;
    struct ev_loop *loop = t->progress->loop;
    uint32_t ms = __atomic_load_n(&t->wanted_ms, __ATOMIC_ACQUIRE);
    ev_timer_stop(loop, &t->timer);
    if (ms) {
        ev_now_update(loop);
        ev_timer_set(&t->timer, ms / 1000.0, 0.0);
        ev_timer_start(loop, &t->timer);
    }
}

struct rs_soft_timer *rs_soft_timer_new(struct rs_soft_device *dev, rs_soft_timer_cb cb, void *arg)
{
    struct rs_soft_timer *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->progress = dev->progress;
    t->cb = cb;
    t->arg = arg;
    ev_timer_init(&t->timer, timer_cb, 0.0, 0.0);
    return t;
}

void rs_soft_timer_arm(struct rs_soft_timer *t, uint32_t ms)
{
    __atomic_store_n(&t->wanted_ms, ms, __ATOMIC_RELEASE);
    if (rs_soft_progress_on_loop(t->progress->dev))
        timer_apply(t);
    else if (rs_soft_progress_call(t->progress->dev, timer_apply, t) != 0)
        RS_WARN("soft rnic: cannot queue a timer change (out of memory)");
}

static void timer_stop_for_free(void *arg)
{
    struct rs_soft_timer *t = arg;
    ev_timer_stop(t->progress->loop, &t->timer);
    t->deleted = true;
}

void rs_soft_timer_free(struct rs_soft_timer *t)
{
    if (!t)
        return;
    retire_on_loop(t->progress->dev, timer_stop_for_free, t, "timer");
}
