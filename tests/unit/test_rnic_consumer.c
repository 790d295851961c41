/*
 * Consumer progress (rnic.h: rs_rnic_cq_wait_begin/_end; docs/rnic-rc.md "Consumer progress"), against rnic.h only.
 *
 * On the soft RNIC a thread blocked on a CQ also watches the sockets of the RC QPs that receive into it, and the
 * progress thread leaves those sockets to it: the message that wakes the waiter is received by the waiter's own
 * poll, and the CQ's armed notification does not fire for it. What is checked: that (the CQ fd stays quiet while
 * the waiter gets its completions, over many round trips); that without a bracket the progress thread still
 * delivers promptly after the sockets were left to a waiter (parking ends); that the late notification of a
 * completion a posting thread added always comes, and at once for a waiter; that the end of the stream and a fatal
 * error met by a waiter are finished by the progress thread (CM events on both sides); and data integrity and
 * order of a mixed-size stream received through brackets while the sender runs on another thread.
 *
 * On the verbs provider rs_rnic_cq_wait_begin returns 0 (nothing to watch) and the soft-only tests skip.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "rnic/rnic.h"
#include "rnic_test_util.h"

#define WAIT_MS 5000
#define MAX_WAIT_FDS 8

struct side {
    struct rs_rnic_cq *cq;
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
    struct rs_rnic_mr *mr;
    uint8_t *buf;
};

struct fixture {
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    struct rs_rnic_listener *listener;
    struct sockaddr_storage listen_addr;
    struct side a, p;       /* active, passive */
};

#define BUF_LEN (1u << 20)

static int fd_ready(int fd, int timeout_ms)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    return poll(&pfd, 1, timeout_ms);
}

static int get_event(struct rs_rnic_cm *cm, int timeout_ms, struct rs_rnic_cm_event *ev)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int r = rs_rnic_cm_get_event(cm, ev);
        if (r != -EAGAIN)
            return r;
        int64_t left = (int64_t)(deadline - now_ms());
        if (left <= 0)
            return -ETIMEDOUT;
        fd_ready(rs_rnic_cm_fd(cm), (int)left);
    }
}

static void expect_event(struct rs_rnic_cm *cm, enum rs_rnic_cm_event_type type)
{
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(cm, WAIT_MS, &ev), 0);
    if (ev.type != type)
        fail_msg("expected CM event %d, got %d (error %d)", (int)type, (int)ev.type, ev.error);
}

static void create_side(struct fixture *f, struct side *s)
{
    assert_int_equal(rs_rnic_create_cq(f->rnic, 4096, &s->cq), 0);
    assert_int_equal(rs_rnic_cm_create(f->rnic, &s->cm), 0);
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = s->cq, .recv_cq = s->cq, .max_send_wr = 1024, .max_recv_wr = 1024,
        .max_send_sge = 1, .max_recv_sge = 1,
    };
    assert_int_equal(rs_rnic_create_qp(f->pd, &attr, &s->qp), 0);
    s->buf = malloc(BUF_LEN);
    assert_non_null(s->buf);
    memset(s->buf, 0, BUF_LEN);
    assert_int_equal(rs_rnic_reg_mr(f->pd, s->buf, BUF_LEN, RS_ACCESS_LOCAL_WRITE, &s->mr), 0);
}

static void destroy_side(struct side *s)
{
    if (s->qp)
        assert_int_equal(rs_rnic_destroy_qp(s->qp), 0);
    if (s->mr)
        assert_int_equal(rs_rnic_dereg_mr(s->mr), 0);
    free(s->buf);
    if (s->cm)
        rs_rnic_cm_destroy(s->cm);
    if (s->cq)
        assert_int_equal(rs_rnic_destroy_cq(s->cq), 0);
    memset(s, 0, sizeof(*s));
}

static int fixture_setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    struct sockaddr_in bind_addr = test_addr(0);
    assert_int_equal(rs_rnic_open(test_kind(), (struct sockaddr *)&bind_addr, &f->rnic), 0);
    assert_int_equal(rs_rnic_alloc_pd(f->rnic, &f->pd), 0);
    create_side(f, &f->a);
    create_side(f, &f->p);
    assert_int_equal(rs_rnic_listen(f->p.cm, (struct sockaddr *)&bind_addr, sizeof(bind_addr), 4, &f->listener), 0);
    assert_int_equal(rs_rnic_listener_addr(f->listener, &f->listen_addr), 0);
    assert_int_equal(rs_rnic_connect(f->a.qp, f->a.cm, (struct sockaddr *)&f->listen_addr, sizeof(struct sockaddr_in),
                                     NULL, 0, WAIT_MS),
                     0);
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(f->p.cm, WAIT_MS, &ev), 0);
    assert_int_equal(ev.type, RS_RNIC_CM_EV_CONNECT_REQUEST);
    assert_int_equal(rs_rnic_accept(ev.request, f->p.qp, f->p.cm, NULL, 0), 0);
    expect_event(f->a.cm, RS_RNIC_CM_EV_ESTABLISHED);
    expect_event(f->p.cm, RS_RNIC_CM_EV_ESTABLISHED);
    *state = f;
    return 0;
}

static int fixture_teardown(void **state)
{
    struct fixture *f = *state;
    destroy_side(&f->a);
    destroy_side(&f->p);
    rs_rnic_listener_close(f->listener);
    assert_int_equal(rs_rnic_dealloc_pd(f->pd), 0);
    rs_rnic_close(f->rnic);
    free(f);
    return 0;
}

static void post_recv(struct side *s, uint64_t wr_id, size_t off, size_t len)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)(s->buf + off), (uint32_t)len, s->mr->lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_recv(s->qp, &wr, &bad), 0);
}

static void post_send(struct side *s, uint64_t wr_id, size_t off, size_t len)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)(s->buf + off), (uint32_t)len, s->mr->lkey };
    struct rs_rnic_send_wr wr = {
        .wr_id = wr_id, .opcode = RS_WR_SEND, .flags = RS_SEND_SIGNALED, .sg_list = &sge, .num_sge = 1,
    };
    struct rs_rnic_send_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_send(s->qp, &wr, &bad), 0);
}

/* One completion, polled (no waiting) until it comes or the time is up. */
static void expect_wc(struct rs_rnic_cq *cq, uint64_t wr_id, enum rs_rnic_wc_status status, struct rs_rnic_wc *out)
{
    struct rs_rnic_wc wc;
    uint64_t deadline = now_ms() + WAIT_MS;
    int r;
    while ((r = rs_rnic_poll_cq(cq, 1, &wc)) == 0) {
        if (now_ms() > deadline)
            fail_msg("no completion for wr_id %llu", (unsigned long long)wr_id);
        sleep_ms(1);
    }
    assert_int_equal(r, 1);
    if (wc.wr_id != wr_id || wc.status != status)
        fail_msg("completion wr_id %llu status %d, expected wr_id %llu status %d", (unsigned long long)wc.wr_id,
                 (int)wc.status, (unsigned long long)wr_id, (int)status);
    if (out)
        *out = wc;
}

/*
 * One blocking wait the way rnic.h describes it: arm, poll, begin, poll(2) on the CQ fd and the provider's fds,
 * ack if the CQ fd fired, poll, end. Fills wc with up to max completions; returns how many, and in *cq_fired
 * whether the CQ's own fd woke the wait (rather than the provider's fds).
 */
static int bracket_wait(struct rs_rnic_cq *cq, struct rs_rnic_wc *wc, int max, int timeout_ms, bool *cq_fired)
{
    *cq_fired = false;
    assert_int_equal(rs_rnic_cq_arm(cq, false), 0);
    int got = rs_rnic_poll_cq(cq, max, wc);
    assert_true(got >= 0);
    if (got > 0)
        return got;
    int fds[MAX_WAIT_FDS];
    int n = rs_rnic_cq_wait_begin(cq, fds, MAX_WAIT_FDS);
    assert_true(n >= 0);
    struct pollfd pfd[1 + MAX_WAIT_FDS];
    pfd[0] = (struct pollfd){ .fd = rs_rnic_cq_fd(cq), .events = POLLIN };
    for (int i = 0; i < n; i++)
        pfd[1 + i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
    int r = poll(pfd, (nfds_t)(1 + n), timeout_ms);
    assert_true(r >= 0);
    if (pfd[0].revents & POLLIN) {
        *cq_fired = true;
        rs_rnic_cq_ack_events(cq);
    }
    got = rs_rnic_poll_cq(cq, max, wc);
    if (n > 0)
        rs_rnic_cq_wait_end(cq);
    assert_true(got >= 0);
    return got;
}

/* ---- tests ---- */

static void test_verbs_has_nothing_to_watch(void **state)
{
    struct fixture *f = *state;
    int fds[MAX_WAIT_FDS];
    int n = rs_rnic_cq_wait_begin(f->p.cq, fds, MAX_WAIT_FDS);
    if (!is_soft()) {
        assert_int_equal(n, 0);
        return;
    }
    /* Soft: one connected RC QP receives into this CQ, so one socket to watch. */
    assert_int_equal(n, 1);
    assert_true(fds[0] >= 0);
    rs_rnic_cq_wait_end(f->p.cq);
    /* No room for it: nothing handed over (the waiter then sleeps on the CQ fd alone, nothing to end). */
    assert_int_equal(rs_rnic_cq_wait_begin(f->p.cq, fds, 0), 0);
}

/* The waiter is woken by the socket and its own poll receives: the armed CQ fd never fires. */
static void test_waiter_receives_itself(void **state)
{
    if (!is_soft())
        skip();
    struct fixture *f = *state;
    for (int i = 0; i < 200; i++) {
        post_recv(&f->p, 1000 + (uint64_t)i, 0, 4096);
        memset(f->a.buf, (int)(i & 0xff), 64);
        /* The bytes are sent after the waiter began, so they cross the loopback while it sits in poll(2). */
        assert_int_equal(rs_rnic_cq_arm(f->p.cq, false), 0);
        int fds[MAX_WAIT_FDS];
        int n = rs_rnic_cq_wait_begin(f->p.cq, fds, MAX_WAIT_FDS);
        assert_int_equal(n, 1);
        post_send(&f->a, 2000 + (uint64_t)i, 0, 64);
        struct pollfd pfd[2] = { { .fd = rs_rnic_cq_fd(f->p.cq), .events = POLLIN }, { .fd = fds[0], .events = POLLIN } };
        assert_int_equal(poll(pfd, 2, WAIT_MS) > 0, 1);
        /* A 64-byte message crosses loopback in one segment: what woke us is all of it, and one poll takes it. */
        struct rs_rnic_wc wc[4];
        int got = rs_rnic_poll_cq(f->p.cq, 4, wc);
        rs_rnic_cq_wait_end(f->p.cq);
        assert_int_equal(got, 1);
        assert_int_equal(wc[0].wr_id, 1000 + (uint64_t)i);
        assert_int_equal(wc[0].status, RS_WC_SUCCESS);
        assert_int_equal(wc[0].opcode, RS_WC_RECV);
        assert_int_equal(wc[0].byte_len, 64);
        assert_int_equal(f->p.buf[0], i & 0xff);
        assert_int_equal(f->p.buf[63], i & 0xff);
        /* Received by this thread, which took the completion itself: the armed notification did not fire. */
        if (fd_ready(rs_rnic_cq_fd(f->p.cq), 0) != 0)
            fail_msg("round %d: the CQ fd fired for a completion the waiter received itself", i);
        expect_wc(f->a.cq, 2000 + (uint64_t)i, RS_WC_SUCCESS, NULL);
    }
}

/* After the sockets were left to a waiter, a consumer that only sleeps on the CQ fd is still served promptly. */
static void test_progress_thread_takes_over(void **state)
{
    if (!is_soft())
        skip();
    struct fixture *f = *state;
    struct rs_rnic_wc wc[2];
    bool fired;
    /* A bracketed round first, so the progress thread has parked the socket. */
    post_recv(&f->p, 1, 0, 4096);
    post_send(&f->a, 2, 0, 100);
    int got = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (got == 0 && now_ms() < deadline)
        got = bracket_wait(f->p.cq, wc, 2, 100, &fired);
    assert_int_equal(got, 1);
    assert_int_equal(wc[0].wr_id, 1);
    expect_wc(f->a.cq, 2, RS_WC_SUCCESS, NULL);
    for (int i = 0; i < 20; i++) {
        post_recv(&f->p, 10 + (uint64_t)i, 0, 4096);
        assert_int_equal(rs_rnic_cq_arm(f->p.cq, false), 0);
        assert_int_equal(rs_rnic_poll_cq(f->p.cq, 2, wc), 0);
        uint64_t t0 = now_ms();
        post_send(&f->a, 100 + (uint64_t)i, 0, 100);
        /* No bracket: only the progress thread can receive it, and the armed CQ fd must fire. */
        assert_int_equal(fd_ready(rs_rnic_cq_fd(f->p.cq), WAIT_MS), 1);
        uint64_t took = now_ms() - t0;
        rs_rnic_cq_ack_events(f->p.cq);
        expect_wc(f->p.cq, 10 + (uint64_t)i, RS_WC_SUCCESS, &wc[0]);
        assert_int_equal(wc[0].byte_len, 100);
        expect_wc(f->a.cq, 100 + (uint64_t)i, RS_WC_SUCCESS, NULL);
        /* A parked socket is watched again within a millisecond or so; a lost wake-up would take WAIT_MS. */
        if (took > 1000)
            fail_msg("round %d: the progress thread took %llu ms", i, (unsigned long long)took);
    }
}

/* A completion added by the posting thread on a bracketed CQ notifies late, but always, and at once for a waiter. */
static void test_late_notification_comes(void **state)
{
    if (!is_soft())
        skip();
    struct fixture *f = *state;
    struct rs_rnic_wc wc;
    int fds[MAX_WAIT_FDS];
    /* Opt the sender's CQ in (a bracket was used on it). */
    assert_int_equal(rs_rnic_cq_wait_begin(f->a.cq, fds, MAX_WAIT_FDS), 1);
    rs_rnic_cq_wait_end(f->a.cq);
    for (int i = 0; i < 10; i++) {
        post_recv(&f->p, 1, 0, 4096);
        assert_int_equal(rs_rnic_cq_arm(f->a.cq, false), 0);
        post_send(&f->a, 50 + (uint64_t)i, 0, 10);
        /* Nobody polls: the notification comes by itself (after about RS_SOFT_LATE_NOTIFY_US). */
        assert_int_equal(fd_ready(rs_rnic_cq_fd(f->a.cq), WAIT_MS), 1);
        rs_rnic_cq_ack_events(f->a.cq);
        expect_wc(f->a.cq, 50 + (uint64_t)i, RS_WC_SUCCESS, &wc);
        assert_int_equal(wc.opcode, RS_WC_SEND);
        expect_wc(f->p.cq, 1, RS_WC_SUCCESS, NULL);
    }
    for (int i = 0; i < 10; i++) {
        post_recv(&f->p, 1, 0, 4096);
        assert_int_equal(rs_rnic_cq_arm(f->a.cq, false), 0);
        post_send(&f->a, 70 + (uint64_t)i, 0, 10);
        /* Someone about to sleep on the CQ while the completion waits in it: the fd is readable at once. */
        int n = rs_rnic_cq_wait_begin(f->a.cq, fds, MAX_WAIT_FDS);
        assert_int_equal(fd_ready(rs_rnic_cq_fd(f->a.cq), 0), 1);
        if (n > 0)
            rs_rnic_cq_wait_end(f->a.cq);
        rs_rnic_cq_ack_events(f->a.cq);
        expect_wc(f->a.cq, 70 + (uint64_t)i, RS_WC_SUCCESS, NULL);
        expect_wc(f->p.cq, 1, RS_WC_SUCCESS, NULL);
    }
}

/* The peer's orderly disconnect reaches a waiter's socket: the progress thread finishes it on both sides. */
static void test_waiter_meets_end_of_stream(void **state)
{
    if (!is_soft())
        skip();
    struct fixture *f = *state;
    struct rs_rnic_wc wc[2];
    bool fired;
    post_recv(&f->p, 7, 0, 4096);
    assert_int_equal(rs_rnic_disconnect(f->a.qp), 0);
    /* Wake on the FIN and poll: the inline receive meets EOF and hands it over. */
    uint64_t deadline = now_ms() + WAIT_MS;
    int got = 0;
    while (rs_rnic_qp_state(f->p.qp) == RS_QPS_RTS && now_ms() < deadline)
        got += bracket_wait(f->p.cq, wc, 2, 50, &fired);
    expect_event(f->a.cm, RS_RNIC_CM_EV_DISCONNECTED);
    expect_event(f->p.cm, RS_RNIC_CM_EV_DISCONNECTED);
    /* The receive posted before the end is flushed, not lost. */
    if (got == 0)
        expect_wc(f->p.cq, 7, RS_WC_WR_FLUSH_ERR, NULL);
    else
        assert_int_equal(wc[0].status, RS_WC_WR_FLUSH_ERR);
}

/* A SEND with no receive posted, met by a waiter: the QP fails through the progress thread, the peer is told. */
static void test_waiter_meets_fatal_error(void **state)
{
    if (!is_soft())
        skip();
    struct fixture *f = *state;
    struct rs_rnic_wc wc[2];
    bool fired;
    int fds[MAX_WAIT_FDS];
    assert_int_equal(rs_rnic_cq_arm(f->p.cq, false), 0);
    assert_int_equal(rs_rnic_cq_wait_begin(f->p.cq, fds, MAX_WAIT_FDS), 1);
    post_send(&f->a, 9, 0, 32);
    struct pollfd pfd = { .fd = fds[0], .events = POLLIN };
    assert_int_equal(poll(&pfd, 1, WAIT_MS), 1);
    assert_int_equal(rs_rnic_poll_cq(f->p.cq, 2, wc), 0);
    rs_rnic_cq_wait_end(f->p.cq);
    expect_event(f->p.cm, RS_RNIC_CM_EV_ERROR);
    expect_event(f->a.cm, RS_RNIC_CM_EV_ERROR);
    assert_int_equal(rs_rnic_qp_state(f->p.qp), RS_QPS_ERROR);
    /* The waiter's later brackets have nothing to watch and nothing is received any more. */
    assert_int_equal(rs_rnic_cq_wait_begin(f->p.cq, fds, MAX_WAIT_FDS), 0);
    assert_int_equal(bracket_wait(f->p.cq, wc, 2, 10, &fired), 0);
}

/* ---- a mixed stream received through brackets while another thread sends ---- */

#define STREAM_MSGS 1500

static size_t stream_len(int i)
{
    static const size_t sizes[] = { 1, 17, 64, 1000, 1023, 1024, 1025, 4096, 20000, 65535, 65536 };
    return sizes[(size_t)i % (sizeof(sizes) / sizeof(sizes[0]))];
}

/* cmocka's assertions belong to the test's thread: the sender records what went wrong instead. */
struct sender {
    struct side *s;
    int sent;
    int received;               /* atomic: messages the receiver has taken (and reposted a receive for) */
    char error[128];
};

#define STREAM_RECVS 16         /* receives posted at the receiver, 64 KiB each: RC has no receiver-not-ready */

static void *sender_main(void *arg)
{
    struct sender *sd = arg;
    struct side *s = sd->s;
    int done = 0;
    for (int i = 0; i < STREAM_MSGS; i++) {
        /* At most 16 in flight, each in its own 64 KiB slot: a slot is rewritten only after its SEND completed.
         * And never more than the receives posted: a SEND without one fails the connection. */
        while (i - done >= 16 || i - __atomic_load_n(&sd->received, __ATOMIC_ACQUIRE) >= STREAM_RECVS) {
            struct rs_rnic_wc wc[16];
            int n = rs_rnic_poll_cq(s->cq, 16, wc);
            if (n < 0) {
                snprintf(sd->error, sizeof(sd->error), "poll_cq: %d", n);
                return NULL;
            }
            for (int k = 0; k < n; k++) {
                if (wc[k].status != RS_WC_SUCCESS) {
                    snprintf(sd->error, sizeof(sd->error), "SEND %llu status %d",
                             (unsigned long long)wc[k].wr_id, (int)wc[k].status);
                    return NULL;
                }
            }
            done += n;
            if (n == 0)
                sleep_ms(0);
        }
        size_t len = stream_len(i);
        size_t off = ((size_t)i % 16u) * 65536u;
        for (size_t k = 0; k < len; k++)
            s->buf[off + k] = (uint8_t)(i * 7 + (int)k);
        struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)(s->buf + off), (uint32_t)len, s->mr->lkey };
        struct rs_rnic_send_wr wr = {
            .wr_id = (uint64_t)i, .opcode = RS_WR_SEND, .flags = RS_SEND_SIGNALED, .sg_list = &sge, .num_sge = 1,
        };
        struct rs_rnic_send_wr *bad = NULL;
        int r = rs_rnic_post_send(s->qp, &wr, &bad);
        if (r != 0) {
            snprintf(sd->error, sizeof(sd->error), "post_send %d: %d", i, r);
            return NULL;
        }
    }
    sd->sent = STREAM_MSGS;
    return NULL;
}

static void test_stream_through_brackets(void **state)
{
    if (!is_soft())
        skip();
    struct fixture *f = *state;
    const size_t slot = 64 * 1024;
    for (int i = 0; i < STREAM_RECVS; i++)
        post_recv(&f->p, (uint64_t)i, (size_t)i * slot, slot);
    struct sender sd = { .s = &f->a };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sender_main, &sd), 0);
    int next = 0;
    uint64_t deadline = now_ms() + 60000;
    while (next < STREAM_MSGS) {
        if (sd.error[0])
            fail_msg("sender: %s", sd.error);
        if (now_ms() > deadline)
            fail_msg("stream stalled at message %d", next);
        struct rs_rnic_wc wc[8];
        bool fired;
        int got = bracket_wait(f->p.cq, wc, 8, 100, &fired);
        for (int k = 0; k < got; k++) {
            assert_int_equal(wc[k].status, RS_WC_SUCCESS);
            uint64_t slot_no = wc[k].wr_id % STREAM_RECVS;
            assert_int_equal(wc[k].wr_id, (uint64_t)next);
            size_t len = stream_len(next);
            assert_int_equal(wc[k].byte_len, len);
            const uint8_t *b = f->p.buf + slot_no * slot;
            for (size_t x = 0; x < len; x++) {
                if (b[x] != (uint8_t)(next * 7 + (int)x))
                    fail_msg("message %d byte %zu: %u", next, x, b[x]);
            }
            post_recv(&f->p, (uint64_t)next + STREAM_RECVS, slot_no * slot, slot);
            next++;
            __atomic_store_n(&sd.received, next, __ATOMIC_RELEASE);
        }
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    if (sd.error[0])
        fail_msg("sender: %s", sd.error);
    assert_int_equal(sd.sent, STREAM_MSGS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_verbs_has_nothing_to_watch, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_waiter_receives_itself, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_progress_thread_takes_over, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_late_notification_comes, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_waiter_meets_end_of_stream, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_waiter_meets_fatal_error, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_stream_through_brackets, fixture_setup, fixture_teardown),
    };
    return cmocka_run_group_tests_name("rnic_consumer", tests, NULL, NULL);
}
