/*
 * ud_progress.c: who runs a UD QP's internal CQ, the application or the progress thread.
 *
 * Every datagram of a UD QP lands on the provider's internal CQ first (ud.c turns it into rnic.h completions).
 * Two parties can run that CQ: an application thread polling a CQ the QP completes to (rs_v_poll_cq finds its
 * ring empty and runs the QP's progress inline), and the progress thread, woken by the internal CQ's event.
 *
 * Waking the progress thread costs an interrupt, a context switch and a re-arm system call per event, and on a
 * machine where the polling application already fills the CPUs the woken thread also has to wait for a slot:
 * measured on rxe, a busy-polled 64 B UD ping-pong took 47-197 us with the thread woken for every datagram and
 * 26-39 us without (4 alternating runs in one boot, docs/verbs.md). So while the application polls and nobody waits for a CQ event, the internal CQ is left unarmed and the
 * application's polls carry the QP; the progress thread only looks now and then (2 to 16 ms) whether they still
 * come, and arms the CQ again (and runs it) once they stopped. One-sided work at this end (Write-Record placement,
 * READ answers) therefore waits at most about two looks (32 ms) for a thread when an application stops polling
 * without arming; an application that sleeps on a CQ fd arms it, and that is immediate.
 *
 * The rules, all under progress_lock:
 *   - after an event the thread runs the CQ, then leaves it unarmed when the application polled since its last
 *     look and no CQ this QP completes to is armed by the application (an armed CQ has a waiter that may sleep
 *     on its fd, which only a pushed completion wakes);
 *   - arming a CQ (rs_v_cq_arm: a waiter about to sleep) arms the internal CQ of its UD QPs again and runs them
 *     once, so a datagram that came in before the arm is not left behind;
 *   - at each tick of an unarmed CQ: polls since the last look keep it unarmed, none arm it.
 */
#include "common/log.h"
#include "rnic/verbs/ud.h"

/* How often the progress thread looks whether a polling application is still there: every look costs a wake-up
 * on a CPU the application wants (measured: a 2 ms look alone took a UD ping-pong from 41 to 74 us on average),
 * so the interval doubles while the polls keep coming, from MIN to MAX. */
#define RS_V_UD_DUTY_TICK_MIN_MS 2
#define RS_V_UD_DUTY_TICK_MAX_MS 16

/* Some CQ this QP completes to has a waiter (armed by the application, not yet notified). */
static bool app_waits_on_cq(const struct rs_v_qp *qp)
{
    return __atomic_load_n(&qp->send_cq->armed, __ATOMIC_RELAXED) != 0 ||
           __atomic_load_n(&qp->recv_cq->armed, __ATOMIC_RELAXED) != 0;
}

/* The application polled since the last look (and that look is now). */
static bool app_polled(struct rs_v_ud *ud)
{
    uint32_t polls = atomic_load_explicit(&ud->app_polls, memory_order_relaxed);
    bool polled = polls != ud->polls_seen;
    ud->polls_seen = polls;
    return polled;
}

/* The progress thread runs the CQ a bounded while; the rest is its backlog, taken up at its next round (the
 * duty tick), after its timers. */
static void thread_run(struct rs_v_qp *qp)
{
    qp->ud->backlog = rs_v_ud_run_cq_some(qp, rs_v_now_ms() + RS_V_UD_THREAD_SLICE_MS);
}

/* Arms the internal CQ for the thread, then runs it: what arrived before the arm raises no event. */
static void arm_and_run(struct rs_v_qp *qp, bool by_thread)
{
    struct rs_v_ud *ud = qp->ud;
    if (!ud->notify_armed) {
        if (ibv_req_notify_cq(ud->cq, 0))
            RS_WARN("verbs: arming the internal CQ of UD QP %u failed", qp->qp->qp_num);
        ud->notify_armed = true;
    }
    if (by_thread) {
        thread_run(qp);
    } else {
        rs_v_ud_run_cq(qp);
        ud->backlog = false;
    }
}

void rs_v_ud_on_event(struct rs_v_qp *qp)
{
    struct rs_v_ud *ud = qp->ud;
    pthread_mutex_lock(&ud->progress_lock);
    ud->notify_armed = false;       /* the event consumed the arm */
    __atomic_store_n(&ud->wakeups, ud->wakeups + 1, __ATOMIC_RELAXED);
    thread_run(qp);
    if (app_polled(ud) && !app_waits_on_cq(qp)) {
        ud->duty_tick_ms = RS_V_UD_DUTY_TICK_MIN_MS;
        ud->duty_check_ms = rs_v_now_ms() + ud->duty_tick_ms;
    } else {
        arm_and_run(qp, true);
    }
    pthread_mutex_unlock(&ud->progress_lock);
}

uint64_t rs_v_ud_duty_tick(struct rs_v_qp *qp, uint64_t now_ms)
{
    struct rs_v_ud *ud = qp->ud;
    uint64_t next = 0;
    /* Busy: an application thread is running the CQ right now, so it polls; never wait for it. */
    if (pthread_mutex_trylock(&ud->progress_lock))
        return now_ms + RS_V_UD_DUTY_TICK_MIN_MS;
    if (ud->backlog)
        thread_run(qp);
    if (!ud->notify_armed) {
        if (now_ms < ud->duty_check_ms) {
            next = ud->duty_check_ms;
        } else if (app_polled(ud) && !app_waits_on_cq(qp)) {
            if (ud->duty_tick_ms < RS_V_UD_DUTY_TICK_MAX_MS)
                ud->duty_tick_ms *= 2;
            ud->duty_check_ms = now_ms + ud->duty_tick_ms;
            next = ud->duty_check_ms;
        } else {
            arm_and_run(qp, true);
        }
    }
    if (ud->backlog)
        next = now_ms;      /* no sleep: the rest comes right after the other timers */
    pthread_mutex_unlock(&ud->progress_lock);
    return next;
}

void rs_v_ud_try_progress(struct rs_v_qp *qp)
{
    struct rs_v_ud *ud = qp->ud;
    atomic_fetch_add_explicit(&ud->app_polls, 1, memory_order_relaxed);
    if (pthread_mutex_trylock(&ud->progress_lock))
        return;
    rs_v_ud_run_cq(qp);
    ud->backlog = false;
    pthread_mutex_unlock(&ud->progress_lock);
}

void rs_v_ud_app_waits(struct rs_v_qp *qp)
{
    struct rs_v_ud *ud = qp->ud;
    pthread_mutex_lock(&ud->progress_lock);
    if (!ud->notify_armed)
        arm_and_run(qp, false);
    pthread_mutex_unlock(&ud->progress_lock);
}
