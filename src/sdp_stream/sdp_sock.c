/*
 * sdp_sock.c: socket objects, references, readiness (mask, notification fd) and blocking waits.
 *
 * Waiting: a blocked call sleeps in ppoll(2) on an eventfd that belongs to its thread (created on first use),
 * after putting itself on the socket's waiter list; whoever changes the socket's state writes to every listed
 * waiter's fd. A per-thread fd (rather than the socket's public notification fd) is what makes several blocked
 * threads safe: one thread draining a shared fd could hide a wake-up meant for another. Sleeping in ppoll keeps
 * the waits interruptible by signals (EINTR), as blocking socket calls are. The waiter also watches the socket's
 * CQ fd, so a completion wakes it straight from the RNIC without a hop through the progress thread, and the fds
 * the RNIC asks a CQ waiter to watch (rs_rnic_cq_wait_begin: the soft RNIC's TCP socket), so that an inbound
 * message wakes this thread alone and is received on it (no hop through the RNIC's own thread either).
 *
 * System calls go through syscall(2): the interception layer interposes poll, read and write, and the library
 * must not re-enter itself.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/compiler.h"
#include "sdp_stream/sdp_int.h"
#include "common/fdutil.h"

/* The coarse clock (one tick, 1-4 ms): SDP's timers are milliseconds to seconds long, and this is read on every
 * call and every message, where CLOCK_MONOTONIC can be a system call (a VM whose clock source the vDSO cannot read,
 * such as qemu under TCG). Use it for every millisecond stamp and deadline alike: never subtract across clocks. */
uint64_t rs_sdp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t rs_sdp_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- raw system calls ---- */

static int sys_eventfd(void)
{
    return rs_fd_move_high((int)syscall(SYS_eventfd2, 0, EFD_CLOEXEC | EFD_NONBLOCK));
}

static void sys_close(int fd)
{
    if (fd >= 0)
        syscall(SYS_close, fd);
}

static void efd_write(int fd)
{
    uint64_t one = 1;
    (void)!syscall(SYS_write, fd, &one, sizeof(one));
}

static void efd_drain(int fd)
{
    uint64_t v;
    (void)!syscall(SYS_read, fd, &v, sizeof(v));
}

/* ---- per-thread wait fd ---- */

static pthread_key_t wait_key;
static pthread_once_t wait_once = PTHREAD_ONCE_INIT;
static __thread int tls_wait_fd = -1;
static __thread unsigned tls_wait_epoch;

static void wait_fd_destroy(void *p)
{
    sys_close((int)(intptr_t)p - 1);
}

static void wait_key_init(void)
{
    pthread_key_create(&wait_key, wait_fd_destroy);
}

static int thread_wait_fd(void)
{
    if (tls_wait_fd >= 0 && tls_wait_epoch == rs_sdp_epoch)
        return tls_wait_fd;
    pthread_once(&wait_once, wait_key_init);
    int fd = sys_eventfd();
    if (fd < 0)
        return -errno;
    tls_wait_fd = fd;
    tls_wait_epoch = rs_sdp_epoch;
    pthread_setspecific(wait_key, (void *)(intptr_t)(fd + 1));
    return fd;
}

/* ---- objects ---- */

int rs_sdp_env_choice(const char *name, int *cache)
{
    int v = __atomic_load_n(cache, __ATOMIC_RELAXED);
    if (v != -2)
        return v;
    const char *e = getenv(name);
    v = -1;
    if (e && *e && strcmp(e, "auto") != 0) {
        if (strcmp(e, "on") == 0)
            v = 1;
        else if (strcmp(e, "off") == 0)
            v = 0;
        else
            RS_WARN("sdp: %s='%s' is not auto, on or off; using auto", name, e);
    }
    __atomic_store_n(cache, v, __ATOMIC_RELAXED);
    return v;
}

/* RDMASOCK_LEND_RING=auto|on|off: the default of RS_SDP_LEND_RING (docs/sdp.md "Lending the send ring"). */
static int lend_ring_default(void)
{
    static int cached = -2;
    return rs_sdp_env_choice("RDMASOCK_LEND_RING", &cached);
}

struct rs_sdp_sock *rs_sdp_sock_alloc(int family, int kind)
{
    struct rs_sdp_sock *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->notify_fd = sys_eventfd();
    if (s->notify_fd < 0) {
        free(s);
        return NULL;
    }
    rs_lock_init(&s->lock);
    atomic_init(&s->refs, 1);
    s->epoch = rs_sdp_epoch;
    s->family = family;
    s->kind_wanted = kind;
    s->state = SDP_ST_IDLE;
    s->rcvbuf = SDP_DEFAULT_RCVBUF;
    s->sndbuf = SDP_DEFAULT_SNDBUF;
    s->rcvlowat = 1;
    s->ka_idle = SDP_KA_IDLE_DEFAULT;
    s->ka_intvl = SDP_KA_INTVL_DEFAULT;
    s->ka_cnt = SDP_KA_CNT_DEFAULT;
    s->zcopy_opt = -1;
    s->zcopy_adaptive = true;
    s->lend_ring_opt = lend_ring_default();
    s->tx_mseq_next = 1;
    s->hb.fd = -1;
    return s;
}

void rs_sdp_get(struct rs_sdp_sock *s)
{
    atomic_fetch_add(&s->refs, 1);
}

/* The last reference went: out of line, so that dropping one of many stays a few inlined instructions (every
 * data call takes and drops one). */
static RS_NOINLINE void sdp_destroy(struct rs_sdp_sock *s)
{
    rs_sdp_free_rnic(s);
    if (s->parent)
        rs_sdp_put(s->parent);
    sys_close(s->notify_fd);
    if (s->hb.fd >= 0)
        sys_close(s->hb.fd);        /* handed back, never taken */
    free(s);
}

void rs_sdp_put(struct rs_sdp_sock *s)
{
    if (atomic_fetch_sub(&s->refs, 1) == 1)
        sdp_destroy(s);
}

void rs_sdp_hold(struct rs_sdp_sock *s)
{
    rs_sdp_get(s);
}

void rs_sdp_release(struct rs_sdp_sock *s)
{
    rs_sdp_put(s);
}

int rs_sdp_check_epoch(const struct rs_sdp_sock *s)
{
    return s->epoch == rs_sdp_epoch ? 0 : -EBADF;
}

int rs_sdp_take_error(struct rs_sdp_sock *s, int fallback)
{
    if (!s->so_error)
        return fallback;
    int e = -s->so_error;
    s->so_error = 0;
    s->dirty = true;
    return e;
}

/* ---- readiness ---- */

static uint32_t sndbuf_free(const struct rs_sdp_sock *s)
{
    if (!s->sbuf_mem)
        return 0;
    return s->sbuf_size - (uint32_t)(s->tx_tail - s->tx_done);
}

unsigned rs_sdp_mask_locked(struct rs_sdp_sock *s)
{
    unsigned m = 0;
    /* Under way: nothing to report (waiters sleep); done: wake them all, the kernel socket answers now. */
    if (s->hb.phase != SDP_HB_NONE)
        return s->hb.phase == SDP_HB_DONE ? POLLIN | POLLOUT : 0;
    switch (s->state) {
    case SDP_ST_IDLE:
        m = POLLOUT | POLLHUP;
        break;
    case SDP_ST_LISTEN:
        if (s->acceptq_head)
            m |= POLLIN;
        break;
    case SDP_ST_CONNECTING:
    case SDP_ST_ACCEPTING:
        break;
    case SDP_ST_CONNECTED:
    case SDP_ST_CLOSED: {
        bool closed = s->state == SDP_ST_CLOSED;
        bool rcv_shut = closed || s->rx_eof || s->rd_shut;
        bool snd_shut = closed || s->wr_shut || s->broken;
        if (rcv_shut && snd_shut)
            m |= POLLHUP;
        if (rcv_shut)
            m |= POLLIN | POLLRDHUP;
        uint64_t lowat = s->rcvlowat > 0 ? (uint64_t)s->rcvlowat : 1;
        if (s->rx_bytes_queued >= lowat)
            m |= POLLIN;
        if (snd_shut) {
            m |= POLLOUT;
        } else {
            uint32_t free_bytes = sndbuf_free(s);
            if (free_bytes > 0 && free_bytes >= s->sbuf_size / 4 && !s->zsrc.active)
                m |= POLLOUT;
        }
        break;
    }
    }
    if (s->so_error || s->zc_pending)
        m |= POLLERR;
    return m;
}

void rs_sdp_signal(struct rs_sdp_sock *s)
{
    /* Nobody to tell: no interest registered, no thread waiting, the notification fd not raised, and nothing that
     * raises it without interest (an error or a hang-up; see rs_sdp_mask_locked). A busy poller's every call with
     * data ends here. */
    if (!s->interest_mask && !s->waiters && !s->notify_on && s->state == SDP_ST_CONNECTED && !s->so_error &&
        !s->zc_pending && !s->rx_eof && !s->rd_shut && !s->wr_shut && !s->broken)
        return;
    unsigned mask = rs_sdp_mask_locked(s);
    unsigned eff = mask & (POLLERR | POLLHUP | s->interest_mask);
    if (eff) {
        /* Write on every call that finds something of interest ready: that is a state change (the callers only
         * signal after one), and edge-triggered epoll needs a new edge for new data even when the fd was already
         * readable. */
        efd_write(s->notify_fd);
        s->notify_on = true;
    } else if (s->notify_on) {
        efd_drain(s->notify_fd);
        s->notify_on = false;
    }
    for (struct sdp_waiter *w = s->waiters; w; w = w->next) {
        if (!w->signalled) {
            w->signalled = true;
            if (!w->spinning) {
                efd_write(w->fd);
                w->fd_written = true;
            }
        }
    }
}

/* fds a CQ waiter watches for the RNIC (one connection: the soft RNIC asks for its QP's TCP socket, verbs none) */
#define SDP_WAIT_RNIC_FDS 4

static bool deadline_ms_passed(uint64_t deadline_ms)
{
    return deadline_ms && rs_sdp_now_ms() >= deadline_ms;
}

/*
 * Whether the waiter may sleep on solicited completions only (the peer marks each of its messages solicited): not
 * woken by the completion of what this side sent, which in a ping-pong is one wake-up in two. Only when nothing
 * but a message of the peer can end the wait and no local completion is wanted by anyone: no other waiter, no
 * poller of POLLOUT, no ring bytes or control messages waiting for a send slot, no RDMA READ or WRITE of ours in
 * flight, no hand-back under way. A case missed here costs a wake-up, never a lost one: the progress thread still
 * polls at least every tick (sdp_conn.c "CQ duty").
 */
static bool sleep_on_solicited(const struct rs_sdp_sock *s, const struct sdp_waiter *w)
{
    return w->rx_only && s->peer_solicits && s->waiters == w && w->next == NULL && s->state == SDP_ST_CONNECTED &&
           !s->broken && s->interest_count[__builtin_ctz(POLLOUT)] == 0 && s->tx_posted == s->tx_tail &&
           !s->tx_stalled && (!s->wr_shut || s->disconn_sent) && !s->ack_owed && !s->psrc.read_out &&
           !s->zwrite_out && !s->ka_read_out && s->owed_rd_compl == 0 && s->owed_sink_cancel_acks == 0 &&
           !s->owed_send_sm && s->hb.phase == SDP_HB_NONE && rs_sdp_can_send_ctrl(s);
}

static void (*test_before_arm)(void *);
static void *test_before_arm_arg;

void rs_sdp_test_before_arm(void (*fn)(void *), void *arg)
{
    test_before_arm_arg = arg;
    __atomic_store_n(&test_before_arm, fn, __ATOMIC_RELEASE);
}

/* rx_only: a reader waiting for the peer's data (see struct sdp_waiter); reply: a wait for the peer's answer to a
 * zero-copy step (its READ of our buffer and RdmaRdCompl, or our READ's completion), which spins like a reader's. */
static int wait_common(struct rs_sdp_sock *s, uint64_t deadline_ms, bool interruptible, bool rx_only, bool reply)
{
    int fd = thread_wait_fd();
    if (fd < 0)
        return fd;
    struct sdp_waiter w = { .next = s->waiters, .fd = fd, .signalled = false, .rx_only = rx_only };
    s->waiters = &w;
    struct pollfd pfd[2 + SDP_WAIT_RNIC_FDS] = { { .fd = fd, .events = POLLIN }, { .fd = -1, .events = POLLIN } };
    int nfds = 1;
    struct rs_rnic_cq *waited_cq = NULL;
    bool at_cq = false, solicited = false;
    if (s->cq && s->state != SDP_ST_CLOSED) {
        at_cq = true;
        s->cq_waiters++;
        s->app_waited = true;
        /* The CQ is armed below, after the spin if there is one: a spin that catches the message leaves no armed
         * CQ behind, whose event somebody would have to read and acknowledge (two system calls, a wake-up of the
         * progress thread). */
        pfd[1].fd = rs_rnic_cq_fd(s->cq);
        nfds = 2;
        int extra[SDP_WAIT_RNIC_FDS];
        int ne = rs_rnic_cq_wait_begin(s->cq, extra, SDP_WAIT_RNIC_FDS);
        if (ne > 0) {
            waited_cq = s->cq;      /* the socket holds its CQ until the last reference, which we have */
            for (int i = 0; i < ne; i++) {
                pfd[nfds].fd = extra[i];
                pfd[nfds].events = POLLIN;
                nfds++;
            }
        }
    }
    /* Inside the bracket, so on the soft RNIC the polls receive on this thread too (sdp_spin.c). */
    bool spun = false, time_sleep = false;
    if (s->cq && s->state == SDP_ST_CONNECTED && !deadline_ms_passed(deadline_ms)) {
        uint64_t budget = rs_sdp_spin_budget(s, rx_only || reply);
        time_sleep = !budget && s->spin.learning;
        if (budget) {
            enum sdp_spin_outcome o = rs_sdp_spin(s, &w, budget, waited_cq != NULL);
            rs_sdp_spin_learn_spin(s, o);
            spun = w.signalled;
        }
    }
    if (at_cq && !spun) {
        /* Arm, then look once more: what completed between the last poll (the spin's, or the caller's before it
         * came here) and the arm raises no event, and would wait for the progress thread's next look (up to
         * SDP_LAZY_TICK_MAX_MS while the CQ is left to the application). Without this look after the arm, about one
         * wait in thirty did, and a blocking 64 B ping-pong over rxe took 195-263 us per transfer; 139-171 us
         * with it, in one boot. */
        void (*hook)(void *) = __atomic_load_n(&test_before_arm, __ATOMIC_ACQUIRE);
        if (hook)
            hook(test_before_arm_arg);
        solicited = sleep_on_solicited(s, &w);
        rs_rnic_cq_arm(s->cq, solicited);
        if (s->state != SDP_ST_CLOSED) {
            w.spinning = true;
            if (waited_cq)
                rs_rnic_cq_wait_recheck(waited_cq);
            rs_sdp_progress(s);
            w.spinning = false;
            spun = w.signalled;
        }
    }
    /* A sleep is timed only where auto spin learns from it (a clock read is a system call under TCG). */
    uint64_t slept_from = 0;
    if (!spun) {
        s->stats.app_sleeps++;
        s->stats.app_sleeps_solicited += solicited;
        if (time_sleep)
            slept_from = rs_sdp_now_us();
    }
    rs_unlock(&s->lock);
    int result = 0;
    for (; !spun;) {
        struct timespec ts, *tsp = NULL;
        if (deadline_ms) {
            uint64_t now = rs_sdp_now_ms();
            uint64_t left = deadline_ms > now ? deadline_ms - now : 0;
            ts.tv_sec = (time_t)(left / 1000);
            ts.tv_nsec = (long)(left % 1000) * 1000000L;
            tsp = &ts;
        }
        long r = syscall(SYS_ppoll, pfd, (unsigned long)nfds, tsp, NULL, (size_t)(_NSIG / 8));
        if (r > 0)
            break;
        if (r == 0) {
            result = -ETIMEDOUT;
            break;
        }
        if (errno == EINTR && interruptible) {
            result = -EINTR;
            break;
        }
        if (errno != EINTR) {
            result = -errno;
            break;
        }
    }
    bool rnic_ready = false;
    for (int i = 2; i < nfds; i++)
        rnic_ready = rnic_ready || pfd[i].revents != 0;
    rs_lock(&s->lock);
    if (slept_from && result == 0)
        rs_sdp_spin_learn_sleep(s, rs_sdp_now_us() - slept_from);
    if (at_cq)
        s->cq_waiters--;
    for (struct sdp_waiter **pp = &s->waiters; *pp; pp = &(*pp)->next) {
        if (*pp == &w) {
            *pp = w.next;
            break;
        }
    }
    /* Read it only when it was written (a signaller sets fd_written, under the lock) or found readable: an
     * unconditional read costs every wake-up a system call that mostly finds nothing. */
    if (w.fd_written || (pfd[0].revents & POLLIN))
        efd_drain(fd);
    if (nfds >= 2 && (pfd[1].revents & POLLIN) && s->cq) {
        /* Woken by the CQ itself: take the notification over from the progress thread (left readable, every
         * later wait would return at once and a blocked caller would spin), and with it the progress thread's
         * duty, exactly as rs_sdp_on_cq does it: ack, re-arm, then poll. The completions that made the fd
         * readable are already queued and re-arming never fires for them, so if this thread did not poll now
         * they would wait for some unrelated later completion, and a DisConn or the last data with them. Today's
         * callers all loop through progress, but that rule is kept here rather than in every caller. */
        rs_rnic_cq_ack_events(s->cq);
        /* Left to application threads (sdp_conn.c "CQ duty"), nobody watches the fd until the next wait arms it. */
        if (!s->cq_lazy)
            rs_rnic_cq_arm(s->cq, false);
        rs_sdp_progress(s);
    } else if (rnic_ready && s->cq) {
        /* Woken by the RNIC's own fd: the poll in this progress call receives what woke us, on this thread. */
        rs_sdp_progress(s);
    }
    /* Only now: until the end the RNIC leaves those fds to this thread, which has taken what woke it. */
    if (waited_cq)
        rs_rnic_cq_wait_end(waited_cq);
    if (result == -ETIMEDOUT && deadline_ms && rs_sdp_now_ms() < deadline_ms)
        result = 0;
    return result;
}

int rs_sdp_wait(struct rs_sdp_sock *s, uint64_t deadline_ms)
{
    return wait_common(s, deadline_ms, true, false, false);
}

int rs_sdp_wait_rx(struct rs_sdp_sock *s, uint64_t deadline_ms)
{
    return wait_common(s, deadline_ms, true, true, false);
}

int rs_sdp_wait_reply(struct rs_sdp_sock *s, uint64_t deadline_ms, bool interruptible)
{
    return wait_common(s, deadline_ms, interruptible, false, true);
}

int rs_sdp_wait_io(struct rs_sdp_sock *s, bool dontwait, uint64_t deadline_ms)
{
    if (dontwait) {
        if (s->state == SDP_ST_CONNECTED)
            rs_sdp_note_poll_miss(s);
        return -EAGAIN;
    }
    int r = rs_sdp_wait(s, deadline_ms);
    return r == -ETIMEDOUT ? -EAGAIN : r;
}

int rs_sdp_wait_uninterruptible(struct rs_sdp_sock *s, uint64_t deadline_ms)
{
    return wait_common(s, deadline_ms, false, false, false);
}

/* ---- public readiness calls ---- */

unsigned rs_sdp_poll(struct rs_sdp_sock *s)
{
    if (rs_sdp_check_epoch(s) != 0)
        return POLLNVAL;
    rs_lock(&s->lock);
    rs_sdp_progress(s);
    unsigned m = rs_sdp_mask_locked(s);
    rs_unlock(&s->lock);
    return m;
}

int rs_sdp_fd(const struct rs_sdp_sock *s)
{
    return s->notify_fd;
}

void rs_sdp_interest(struct rs_sdp_sock *s, unsigned events, int delta)
{
    rs_lock(&s->lock);
    for (unsigned bit = 0; bit < 16; bit++) {
        if (!(events & (1u << bit)))
            continue;
        int v = (int)s->interest_count[bit] + delta;
        s->interest_count[bit] = (uint16_t)(v < 0 ? 0 : v > 65535 ? 65535 : v);
        if (s->interest_count[bit])
            s->interest_mask |= 1u << bit;
        else
            s->interest_mask &= ~(1u << bit);
    }
    /* A thread about to wait for readiness is woken only by the progress thread's signal: it must look at the CQ
     * again (sdp_conn.c "CQ duty"); the retime in rs_sdp_progress brings its look forward to now. */
    if (delta > 0 && s->cq_lazy)
        s->duty_wanted = true;
    rs_sdp_progress(s);     /* (a listener's intake follows its POLLIN interest) */
    rs_sdp_signal(s);
    rs_unlock(&s->lock);
}
