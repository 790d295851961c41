/*
 * sdp_progress.c: the per-process SDP progress thread, one libev loop watching every SDP socket's CQ fd and CM fd
 * and running its timers.
 *
 * Why a thread: SDP is a protocol between two user-space libraries, so without one a peer blocked in send() waits
 * for credits that only come back when this process next calls into the library; RDMA READs of a SrcAvail, the
 * answers to cancels, keepalive probes, accepting connections on a listener, and the close handshake of a socket
 * the application already closed all need someone to run. Rashti (2010, §3.6) measured what happens otherwise.
 * One thread serves all sockets of the process (not one per socket) so the thread count stays constant.
 *
 * Application threads also run the protocol themselves whenever they call in (rs_sdp_progress under the socket
 * lock), so the thread is only on the critical path when nobody else is.
 *
 * libev objects are touched only on the loop thread; other threads queue commands and wake it with ev_async.
 * Attaching is synchronous (the caller knows callbacks will run); detaching is asynchronous and drops the
 * progress thread's reference to the socket once its watchers are stopped.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ev.h>

#include "common/log.h"
#include "common/thread.h"
#include "sdp_stream/sdp_int.h"

enum pcmd_type { PCMD_ATTACH, PCMD_DETACH, PCMD_RETIME };

struct pcmd {
    struct pcmd *next;
    enum pcmd_type type;
    struct rs_sdp_sock *s;
    bool sync, done;
    int result;
};

struct pw {
    struct rs_sdp_sock *s;
    ev_io cq_w, cm_w;
    ev_timer tm;
    bool cq_on, cm_on, tm_on;
    bool cq_paused;                 /* cq_w stopped while the socket's CQ is left to application threads */
    atomic_bool retime_queued;
    _Atomic uint64_t armed;         /* deadline the timer is set for (0 none); read by other threads */
    struct pw *all_prev, *all_next; /* P.watched, under P.lock */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct ev_loop *loop;
    ev_async wake;
    pthread_t thread;
    bool running;
    unsigned epoch;
    struct pcmd *first, *last;
    int orphans;                    /* closed sockets whose connection is still finishing */
    struct pw *watched;             /* every attached socket: what the exit flush closes */
} P = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, { 0 }, 0, false, 0, NULL, NULL, 0, NULL };

bool rs_sdp_progress_on_loop(void)
{
    return P.running && P.epoch == rs_sdp_epoch && pthread_equal(pthread_self(), P.thread);
}

static void set_timer(struct pw *pw, uint64_t deadline)
{
    if (pw->tm_on) {
        ev_timer_stop(P.loop, &pw->tm);
        pw->tm_on = false;
    }
    uint64_t now = rs_sdp_now_ms();
    /* While the socket's CQ is left to the application (sdp_conn.c "CQ duty") this thread looks at it every tick,
     * whatever else is due: every path that sets the timer keeps that promise, or a CM event or a retime from an
     * application thread would end the looks and leave completions to nobody. */
    uint64_t tick = now + (pw->s->lazy_tick_ms ? pw->s->lazy_tick_ms : SDP_LAZY_TICK_MS);
    if (pw->s->cq_lazy && (deadline == 0 || tick < deadline))
        deadline = tick;
    atomic_store(&pw->armed, deadline);
    if (deadline == 0)
        return;
    double after = deadline > now ? (double)(deadline - now) / 1000.0 : 0.0;
    ev_timer_set(&pw->tm, after, 0.0);
    ev_timer_start(P.loop, &pw->tm);
    pw->tm_on = true;
}

static void cq_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    struct pw *pw = w->data;
    set_timer(pw, rs_sdp_on_cq(pw->s));
    /* cq_lazy is written on this thread only (sdp_conn.c "CQ duty"). */
    if (pw->s->cq_lazy && !pw->cq_paused) {
        ev_io_stop(P.loop, &pw->cq_w);
        pw->cq_paused = true;
    }
}

static void cm_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    struct pw *pw = w->data;
    set_timer(pw, rs_sdp_on_cm(pw->s));
}

static void tm_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    struct pw *pw = w->data;
    pw->tm_on = false;
    atomic_store(&pw->armed, 0);
    set_timer(pw, rs_sdp_on_timer(pw->s));
    if (!pw->s->cq_lazy && pw->cq_paused) {
        ev_io_start(P.loop, &pw->cq_w);
        pw->cq_paused = false;
        pw->s->empty_wake_expected = true;              /* (sdp_conn.c rs_sdp_on_cq) */
        ev_feed_event(P.loop, &pw->cq_w, EV_READ);     /* look now: ack, arm, poll */
    }
}

/* Loop thread. */
static int do_attach(struct rs_sdp_sock *s)
{
    struct pw *pw = s->pw;
    if (!pw) {
        pw = calloc(1, sizeof(*pw));
        if (!pw)
            return -ENOMEM;
        pw->s = s;
        ev_init(&pw->tm, tm_cb);
        pw->tm.data = pw;
        s->pw = pw;
        rs_sdp_get(s);          /* the watchers' reference */
        pthread_mutex_lock(&P.lock);
        pw->all_next = P.watched;
        if (P.watched)
            P.watched->all_prev = pw;
        P.watched = pw;
        pthread_mutex_unlock(&P.lock);
    }
    if (s->cm && !pw->cm_on) {
        ev_io_init(&pw->cm_w, cm_cb, rs_rnic_cm_fd(s->cm), EV_READ);
        pw->cm_w.data = pw;
        ev_io_start(P.loop, &pw->cm_w);
        pw->cm_on = true;
    }
    if (s->cq && !pw->cq_on) {
        ev_io_init(&pw->cq_w, cq_cb, rs_rnic_cq_fd(s->cq), EV_READ);
        pw->cq_w.data = pw;
        ev_io_start(P.loop, &pw->cq_w);
        pw->cq_on = true;
    }
    /* Events may have arrived before the watch existed: look once now. */
    if (pw->cm_on)
        ev_feed_event(P.loop, &pw->cm_w, EV_READ);
    if (pw->cq_on) {
        s->empty_wake_expected = true;
        ev_feed_event(P.loop, &pw->cq_w, EV_READ);
    }
    return 0;
}

static void do_detach(struct rs_sdp_sock *s)
{
    struct pw *pw = s->pw;
    if (!pw)
        return;
    if (pw->cq_on)
        ev_io_stop(P.loop, &pw->cq_w);
    if (pw->cm_on)
        ev_io_stop(P.loop, &pw->cm_w);
    if (pw->tm_on)
        ev_timer_stop(P.loop, &pw->tm);
    /* A fed event may still be pending for these watchers. */
    ev_clear_pending(P.loop, &pw->cq_w);
    ev_clear_pending(P.loop, &pw->cm_w);
    ev_clear_pending(P.loop, &pw->tm);
    pthread_mutex_lock(&P.lock);
    if (pw->all_prev)
        pw->all_prev->all_next = pw->all_next;
    else
        P.watched = pw->all_next;
    if (pw->all_next)
        pw->all_next->all_prev = pw->all_prev;
    pthread_mutex_unlock(&P.lock);
    s->pw = NULL;
    free(pw);
    rs_sdp_put(s);
}

static void do_retime(struct rs_sdp_sock *s)
{
    struct pw *pw = s->pw;
    if (!pw)
        return;
    atomic_store(&pw->retime_queued, false);
    rs_lock(&s->lock);
    uint64_t next = rs_sdp_timers(s, rs_sdp_now_ms());
    rs_unlock(&s->lock);
    set_timer(pw, next);
}

static void run_cmds(void)
{
    for (;;) {
        pthread_mutex_lock(&P.lock);
        struct pcmd *c = P.first;
        if (c) {
            P.first = c->next;
            if (!P.first)
                P.last = NULL;
        }
        pthread_mutex_unlock(&P.lock);
        if (!c)
            return;
        int result = 0;
        switch (c->type) {
        case PCMD_ATTACH:
            result = do_attach(c->s);
            break;
        case PCMD_DETACH:
            do_detach(c->s);
            break;
        case PCMD_RETIME:
            do_retime(c->s);
            rs_sdp_put(c->s);
            break;
        }
        if (c->sync) {
            pthread_mutex_lock(&P.lock);
            c->result = result;
            c->done = true;
            pthread_cond_broadcast(&P.cond);
            pthread_mutex_unlock(&P.lock);
        } else {
            free(c);
        }
    }
}

static void wake_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    run_cmds();
}

static void *loop_main(void *arg)
{
    (void)arg;
    ev_run(P.loop, 0);
    return NULL;
}

/* P.lock held. */
static int start_locked(void)
{
    if (P.running && P.epoch == rs_sdp_epoch)
        return 0;
    /* After fork the parent's loop and thread do not exist here: start afresh (the old loop is leaked). */
    P.first = P.last = NULL;
    P.orphans = 0;
    P.watched = NULL;
    P.loop = ev_loop_new(EVFLAG_NOSIGMASK | EVFLAG_NOENV);
    if (!P.loop)
        return -ENOMEM;
    ev_async_init(&P.wake, wake_cb);
    ev_async_start(P.loop, &P.wake);
    int r = rs_thread_start(&P.thread, loop_main, NULL, true);
    if (r != 0) {
        ev_loop_destroy(P.loop);
        P.loop = NULL;
        return -r;
    }
    P.running = true;
    P.epoch = rs_sdp_epoch;
    return 0;
}

static void enqueue_locked(struct pcmd *c)
{
    c->next = NULL;
    if (P.last)
        P.last->next = c;
    else
        P.first = c;
    P.last = c;
    ev_async_send(P.loop, &P.wake);
}

int rs_sdp_progress_attach(struct rs_sdp_sock *s)
{
    if (rs_sdp_progress_on_loop())
        return do_attach(s);
    pthread_mutex_lock(&P.lock);
    int r = start_locked();
    if (r != 0) {
        pthread_mutex_unlock(&P.lock);
        return r;
    }
    struct pcmd c = { .type = PCMD_ATTACH, .s = s, .sync = true };
    enqueue_locked(&c);
    while (!c.done)
        pthread_cond_wait(&P.cond, &P.lock);
    pthread_mutex_unlock(&P.lock);
    return c.result;
}

void rs_sdp_progress_detach(struct rs_sdp_sock *s)
{
    struct pcmd *c = calloc(1, sizeof(*c));
    pthread_mutex_lock(&P.lock);
    if (!P.running || P.epoch != rs_sdp_epoch || !c) {
        pthread_mutex_unlock(&P.lock);
        free(c);
        return;
    }
    c->type = PCMD_DETACH;
    c->s = s;
    enqueue_locked(c);
    pthread_mutex_unlock(&P.lock);
}

void rs_sdp_progress_retime(struct rs_sdp_sock *s, uint64_t deadline_ms)
{
    struct pw *pw = s->pw;
    if (!pw || deadline_ms == 0)
        return;
    uint64_t armed = atomic_load(&pw->armed);
    if (armed != 0 && armed <= deadline_ms)
        return;
    if (atomic_exchange(&pw->retime_queued, true))
        return;
    struct pcmd *c = calloc(1, sizeof(*c));
    if (!c) {
        atomic_store(&pw->retime_queued, false);
        return;
    }
    c->type = PCMD_RETIME;
    c->s = s;
    rs_sdp_get(s);
    pthread_mutex_lock(&P.lock);
    if (!P.running || P.epoch != rs_sdp_epoch) {
        pthread_mutex_unlock(&P.lock);
        atomic_store(&pw->retime_queued, false);
        free(c);
        rs_sdp_put(s);
        return;
    }
    enqueue_locked(c);
    pthread_mutex_unlock(&P.lock);
}

void rs_sdp_progress_register_orphan(struct rs_sdp_sock *s, int delta)
{
    (void)s;
    pthread_mutex_lock(&P.lock);
    P.orphans += delta;
    if (P.orphans <= 0) {
        P.orphans = 0;
        pthread_cond_broadcast(&P.cond);
    }
    pthread_mutex_unlock(&P.lock);
}

/* The kernel closes a TCP socket the process never closed when it exits, and still delivers what was written
 * (socat, for one, shuts its write side and exits). Without the same here the exit kills the transport under
 * data the peer has not received yet and the peer sees a reset. P.lock held; returns with it held. */
static void close_unclosed_locked(void)
{
    size_t n = 0;
    for (struct pw *pw = P.watched; pw; pw = pw->all_next)
        n++;
    if (n == 0)
        return;
    struct rs_sdp_sock **socks = malloc(n * sizeof(*socks));
    if (!socks)
        return;
    size_t k = 0;
    for (struct pw *pw = P.watched; pw && k < n; pw = pw->all_next) {
        rs_sdp_get(pw->s);      /* the watchers' reference keeps it alive until here */
        socks[k++] = pw->s;
    }
    pthread_mutex_unlock(&P.lock);
    for (size_t i = 0; i < k; i++) {
        rs_sdp_exit_close(socks[i]);
        rs_sdp_put(socks[i]);
    }
    free(socks);
    pthread_mutex_lock(&P.lock);
}

/* P.lock held; returns with it held (released while waiting). */
static void wait_orphans_locked(uint64_t budget_ms)
{
    if (P.orphans > 0)
        RS_DEBUG("sdp: exit waits for %d closing connection(s)", P.orphans);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(budget_ms / 1000);
    until.tv_nsec += (long)(budget_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (P.orphans > 0) {
        if (pthread_cond_timedwait(&P.cond, &P.lock, &until) == ETIMEDOUT)
            break;
    }
    if (P.orphans > 0)
        RS_WARN("sdp: process exits with %d connection(s) still closing; their peers will see a reset", P.orphans);
}

void rs_sdp_progress_exit_flush(uint64_t budget_ms)
{
    pthread_mutex_lock(&P.lock);
    if (!P.running || P.epoch != rs_sdp_epoch || rs_sdp_progress_on_loop()) {
        pthread_mutex_unlock(&P.lock);
        return;
    }
    close_unclosed_locked();
    wait_orphans_locked(budget_ms);
    pthread_mutex_unlock(&P.lock);
}

void rs_sdp_exit_now(void)
{
    /* _exit may be called from a signal handler that interrupted this very code: never wait for the lock, and
     * leave sockets the program did not close alone (closing one takes its lock). */
    if (pthread_mutex_trylock(&P.lock) != 0)
        return;
    if (P.running && P.epoch == rs_sdp_epoch && !rs_sdp_progress_on_loop())
        wait_orphans_locked(SDP_EXIT_FLUSH_MS);
    pthread_mutex_unlock(&P.lock);
}
