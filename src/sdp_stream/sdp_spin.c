/*
 * sdp_spin.c: whether, and how long, a blocking call on a connected socket polls before it sleeps.
 *
 * A sleep and its wake-up cost more than a message on a fast link (two system calls and a reschedule; under an
 * emulated CPU about 120-150 us against 12-20 us for a 64 B transfer over rxe), so a reply that comes soon is
 * cheaper to poll for. Polling for one that comes late only burns CPU. RDMASOCK_SPIN_US chooses:
 *
 *   auto (the default)  a reader waiting for the peer's data spins (no other wait does), and each socket learns
 *                       from those waits: it spins SDP_SPIN_AUTO_US while at least a quarter of its recent spins
 *                       caught their message, and not at all otherwise, except for a probe (longer,
 *                       SDP_SPIN_PROBE_US) once in SDP_SPIN_PROBE_EVERY waits, or on the wait after a sleep that
 *                       ended within SDP_SPIN_NEAR_US (the message came soon: a spin might have caught it). A
 *                       probe that catches starts the socket's learning afresh, spinning.
 *   0 .. 1000           a fixed spin of that many microseconds on every wait (0: never).
 *
 * A catch in the first round teaches nothing: the message was there before the wait began. A catch after twice the
 * budget is a miss: with every CPU busy the yields between rounds slept, and a reply 2 ms late was "caught" by a
 * 50 us spin (test_sdp_spin_auto failed so in a CI run beside a build). A bad value is refused
 * with a warning and auto is used. rsockets spins a fixed 10 us by default.
 */
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

#define SDP_SPIN_MAX_US 1000u
#define SDP_SPIN_AUTO_US 50u            /* auto: the spin while the socket's spins catch */
#define SDP_SPIN_PROBE_US 200u          /* auto: a probe's spin, long enough to outlast a sleeping peer's wake-up */
#define SDP_SPIN_PROBE_EVERY 32u        /* auto, off: one wait in this many probes */
#define SDP_SPIN_NEAR_US 200u           /* auto, off: a sleep this short makes the next wait a probe */
#define SDP_SPIN_WINDOW 16u             /* auto: outcomes remembered */
#define SDP_SPIN_MIN_EVIDENCE 8u        /* auto: outcomes needed before the spin is turned off */
#define SDP_SPIN_CLOCK_ROUNDS 8u        /* rounds between clock reads */

/* -1: not read yet; -2: auto; else the fixed spin in ns */
#define SPIN_UNSET (-1)
#define SPIN_AUTO (-2)

static int64_t spin_setting(void)
{
    static int64_t cached = SPIN_UNSET;
    int64_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v != SPIN_UNSET)
        return v;
    const char *e = getenv("RDMASOCK_SPIN_US");
    v = SPIN_AUTO;
    if (e && *e && strcmp(e, "auto") != 0) {
        char *end = NULL;
        long us = strtol(e, &end, 10);
        if (end == e || *end != '\0' || us < 0 || us > (long)SDP_SPIN_MAX_US)
            RS_WARN("sdp: RDMASOCK_SPIN_US='%s' is not 'auto' or 0-%u microseconds; using auto", e, SDP_SPIN_MAX_US);
        else
            v = (int64_t)us * 1000;
    }
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    return v;
}

static bool auto_on(const struct sdp_spin_state *st)
{
    unsigned n = st->n, hits = (unsigned)__builtin_popcount(st->hist & ((1u << n) - 1u));
    return n < SDP_SPIN_MIN_EVIDENCE || hits * 4u >= n;
}

static void remember(struct sdp_spin_state *st, bool hit)
{
    st->hist = (uint16_t)((st->hist << 1) | (hit ? 1u : 0u));
    if (st->n < SDP_SPIN_WINDOW)
        st->n++;
}

uint64_t rs_sdp_spin_budget(struct rs_sdp_sock *s, bool rx_only)
{
    int64_t v = spin_setting();
    struct sdp_spin_state *st = &s->spin;
    st->probing = false;
    /* Auto spins for a reader waiting for the peer's data only, and learns from it: that is the wait a spin
     * shortens in a request-response exchange. Other waits (send space in a bulk transfer, a busy receive queue,
     * the close handshake) sleep: a sender that never reads would never learn, and its spin would take a CPU from
     * the receiver or, under rxe, from the kernel work that frees its send space. */
    st->learning = v == SPIN_AUTO && rx_only;
    if (v != SPIN_AUTO)
        return (uint64_t)v;
    if (!rx_only)
        return 0;
    if (auto_on(st))
        return (uint64_t)SDP_SPIN_AUTO_US * 1000u;
    if (st->probe_next || ++st->off_waits >= SDP_SPIN_PROBE_EVERY) {
        st->probe_next = false;
        st->off_waits = 0;
        st->probing = true;
        return (uint64_t)SDP_SPIN_PROBE_US * 1000u;
    }
    return 0;
}

void rs_sdp_spin_learn_spin(struct rs_sdp_sock *s, enum sdp_spin_outcome o)
{
    struct sdp_spin_state *st = &s->spin;
    s->stats.spins++;
    if (o == SDP_SPIN_CAUGHT || o == SDP_SPIN_CAUGHT_AT_ONCE)
        s->stats.spin_catches++;
    if (!st->learning)
        return;
    if (o == SDP_SPIN_CAUGHT_AT_ONCE || o == SDP_SPIN_ENDED_OTHERWISE) {
        /* No answer either way (a message that was there before the wait needed no spin); a probe is not used up
         * by it. */
        st->probe_next = st->probe_next || st->probing;
        return;
    }
    if (st->probing && o == SDP_SPIN_CAUGHT) {
        /* The peer answers within a probe: start afresh, spinning (auto_on with no evidence). */
        st->n = 0;
        st->hist = 0;
        return;
    }
    remember(st, o == SDP_SPIN_CAUGHT);     /* a late catch counts as a miss */
}

void rs_sdp_spin_learn_sleep(struct rs_sdp_sock *s, uint64_t slept_us)
{
    struct sdp_spin_state *st = &s->spin;
    if (st->learning && !auto_on(st) && slept_us <= SDP_SPIN_NEAR_US)
        st->probe_next = true;
}

/*
 * Polls (lock held on entry and exit, dropped between rounds so the progress thread and other callers get it)
 * until something signals this waiter or the budget is spent. While it spins a signal only sets w->signalled (no
 * eventfd write, no read to take it back: two system calls per message that a spinning thread does not need), and
 * the clock is read every SDP_SPIN_CLOCK_ROUNDS rounds only: under an emulated CPU whose clocksource is not in the
 * vDSO (hpet under TCG) each read is a system call that costs more than a round. Between rounds the thread yields
 * its CPU: where every CPU is busy the peer that must answer may be waiting for this one, and a spin that only
 * paused there made a 64 B round trip on the soft RNIC 110-118 us against 10-19 us without a spin (the host loaded
 * by a test run); with the yield 8-9 us. On an idle CPU the yield returns at once. Each round after the first asks
 * the RNIC to look at its sources again (rs_rnic_cq_wait_recheck): the soft RNIC otherwise reads a waiter's
 * sockets once per wait, and a spin there caught nothing.
 */
enum sdp_spin_outcome rs_sdp_spin(struct rs_sdp_sock *s, struct sdp_waiter *w, uint64_t budget_ns, bool in_bracket)
{
    uint64_t until = rs_sdp_now_us() + budget_ns / 1000u;
    bool other = false;
    w->spinning = true;
    for (unsigned round = 1;; round++) {
        if (round > 1 && in_bracket && s->cq)
            rs_rnic_cq_wait_recheck(s->cq);
        rs_sdp_progress(s);
        if (w->signalled && w->rx_only && s->state == SDP_ST_CONNECTED &&
            !(rs_sdp_mask_locked(s) & (POLLIN | POLLERR | POLLHUP))) {
            /* A reader's spin goes on through signals that bring it nothing (its own send's completion, a credit
             * update): ended there, it would mostly end before the reply. The caller still hears of them. */
            w->signalled = false;
            other = true;
        }
        if (w->signalled || s->state != SDP_ST_CONNECTED ||
            (round % SDP_SPIN_CLOCK_ROUNDS == 0 && rs_sdp_now_us() >= until)) {
            w->spinning = false;
            if (w->signalled && round == 1)
                return SDP_SPIN_CAUGHT_AT_ONCE;
            /* Learning needs to know whether the budget caught it; the clock costs a read per catch only there. */
            if (w->signalled)
                return s->spin.learning && rs_sdp_now_us() > until + budget_ns / 1000u ? SDP_SPIN_CAUGHT_LATE
                                                                                        : SDP_SPIN_CAUGHT;
            if (s->state != SDP_ST_CONNECTED)
                return SDP_SPIN_ENDED_OTHERWISE;
            w->signalled = other;
            return other ? SDP_SPIN_ENDED_OTHERWISE : SDP_SPIN_MISSED;
        }
        rs_unlock(&s->lock);
        sched_yield();
        rs_lock(&s->lock);
    }
}
