/*
 * rdma_run.c: the measurement loops over an RNIC endpoint, client and server side.
 *
 *   lat  send     client SEND -> server RECV, server SEND back -> client RECV          one-way = round trip / 2
 *        wrecord  client WRITE_RECORD -> server RECV_WRITE_RECORD, the same way back   one-way = round trip / 2
 *        write    client WRITE + zero-byte SEND notice (one chain) -> server RECV, back one-way = round trip / 2
 *                 (an RC WRITE produces nothing at the target; the notice is how a protocol learns of it)
 *        read     client READ of the server's region; the server's RNIC answers alone  whole READ
 *   bw   send/wrecord  the client posts back to back, at most `window` outstanding; the server counts arrivals.
 *                      Its clock starts when it sends READY (the client starts right after) and stops at the last
 *                      arrival it sees: completions that pile up while the server thread is not running cannot
 *                      shrink the span, they can only make it a little longer.
 *                      RC SEND needs a posted receive for every message (iWARP has no receiver-not-ready retry:
 *                      the connection would fail), so the server returns credits, one SEND per 1024 receives
 *                      reposted; UD needs none (a datagram without a receive is dropped and counted lost).
 *        write         `count` WRITEs, then a SEND notice: the server's clock stops when the notice arrives.
 *        read          the client keeps `window` READs in flight (at most the ORD; on UD at most 4 MiB of
 *                      responses) and times them itself; on RC one in window/4 is signaled, as perftest does.
 *
 * UD ping-pong may lose a datagram: after PERF_LOSS_TIMEOUT_MS the iteration is repeated and counted in `lost`.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdma.h"

struct run {
    struct perf_rdma *r;
    struct perf_ep *ep;
    int ctrl_fd;
    enum perf_test test;
    size_t size;
    uint64_t count;
    uint32_t window;
    uint64_t t_ready;                       /* server: when READY went out (a stream's clock starts there) */
};

/* The opcode that ends one ping (at the client) or triggers the reply (at the server). */
static enum rs_rnic_wc_opcode arrival_opcode(enum perf_test t)
{
    switch (t) {
    case PERF_WRECORD:
        return RS_WC_RECV_WRITE_RECORD;
    case PERF_READ:
        return RS_WC_RDMA_READ;
    default:
        return RS_WC_RECV;
    }
}

/* Posts one ping (client) or pong (server). */
static int post_message(struct run *run, bool signal)
{
    switch (run->test) {
    case PERF_SEND:
        return perf_ep_post(run->ep, RS_WR_SEND, run->size, signal);
    case PERF_WRECORD:
        return perf_ep_post(run->ep, RS_WR_WRITE_RECORD, run->size, signal);
    case PERF_WRITE:
        return perf_ep_post_write_notice(run->ep, run->size);
    case PERF_READ:
        return perf_ep_post(run->ep, RS_WR_RDMA_READ, run->size, true);
    default:
        return -EINVAL;
    }
}

static uint32_t bw_sig_every(const struct perf_ep *ep, uint32_t window)
{
    uint32_t w = window < ep->sq_depth / 2 ? window : ep->sq_depth / 2;
    return w / 4 ? w / 4 : 1;
}

/* ---- client ---- */

static int client_lat(struct run *run, struct perf_result *res)
{
    struct perf_ep *ep = run->ep;
    bool lossy = ep->group == PERF_GROUP_UD;
    enum rs_rnic_wc_opcode want = arrival_opcode(run->test);
    uint64_t *rtt = malloc((run->count ? run->count : 1) * sizeof(*rtt));
    if (!rtt)
        return -ENOMEM;
    ep->sig_every = 16;
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    uint64_t done = 0, lost = 0, t_begin = perf_now_ns();
    int rc = 0;
    while (done < run->count && rc == 0) {
        uint64_t t0 = perf_now_ns();
        rc = post_message(run, done + 1 == run->count);
        bool arrived = false, given_up = false;
        while (rc == 0 && !arrived && !given_up) {
            int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, -1,
                                 lossy ? PERF_LOSS_TIMEOUT_MS : PERF_RELIABLE_TIMEOUT_MS);
            if (n < 0) {
                rc = n;
                break;
            }
            if (n == 0) {
                if (!lossy) {
                    perf_log("%s: no answer within %d ms", perf_test_name(run->test), PERF_RELIABLE_TIMEOUT_MS);
                    rc = -ETIMEDOUT;
                }
                lost++;
                given_up = true;
            }
            for (int i = 0; i < n; i++) {
                if (wc[i].opcode != want)
                    continue;
                if (wc[i].status == RS_WC_SUCCESS) {
                    arrived = true;
                } else {
                    lost++;         /* a READ or a record that timed out: ask again */
                    given_up = true;
                }
            }
            if (rc == 0)
                rc = perf_ep_repost(ep, false);
        }
        if (arrived)
            rtt[done++] = perf_now_ns() - t0;
    }
    uint64_t elapsed = perf_now_ns() - t_begin;
    if (rc == 0)
        rc = perf_ep_drain(run->r, ep, NULL);
    struct perf_msg result;
    if (rc == 0)
        rc = perf_run_end(run->ctrl_fd, done + lost, &result);
    if (rc == 0)
        perf_result_from_rtts(res, rtt, done, run->test != PERF_READ, run->size, lost, elapsed);
    free(rtt);
    return rc;
}

static int client_read_bw(struct run *run, struct perf_result *res)
{
    struct perf_ep *ep = run->ep;
    uint32_t window = run->window < ep->ord ? run->window : ep->ord;
    if (window > ep->sq_depth / 2)
        window = ep->sq_depth / 2;
    /* UD READ responses have no flow control: more in flight than the receiving socket holds are simply lost
     * (and each loss costs a timeout). Keep the bytes in flight within what a receiver buffers. */
    if (ep->group == PERF_GROUP_UD && (uint64_t)window * run->size > PERF_UD_READ_INFLIGHT)
        window = run->size >= PERF_UD_READ_INFLIGHT ? 1 : (uint32_t)(PERF_UD_READ_INFLIGHT / run->size);
    /* RC: a signaled READ stands for the unsignaled ones before it; UD: each is signaled (perf_ep_post). */
    bool batched = ep->group == PERF_GROUP_RC;
    ep->sig_every = batched ? bw_sig_every(ep, window) : 1;
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    /* Every READ is inside the span: it starts at the first post. */
    uint64_t posted = 0, ok = 0, lost = 0, t_begin = perf_now_ns(), t_last = t_begin;
    int rc = 0;
    while (rc == 0 && ok + lost < run->count) {
        while (rc == 0 && posted < run->count && posted - ok - lost < window) {
            rc = perf_ep_post(ep, RS_WR_RDMA_READ, run->size, posted + 1 == run->count);
            posted++;
        }
        if (rc)
            break;
        int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, -1, PERF_RELIABLE_TIMEOUT_MS);
        if (n <= 0) {
            rc = n ? n : -ETIMEDOUT;
            break;
        }
        uint64_t now = perf_now_ns();
        for (int i = 0; i < n; i++) {
            if (wc[i].opcode != RS_WC_RDMA_READ)
                continue;
            if (wc[i].status == RS_WC_SUCCESS) {
                ok += batched ? wc[i].wr_id : 1;
                t_last = now;
            } else {
                lost++;
            }
        }
        rc = perf_ep_repost(ep, false);
    }
    uint64_t elapsed = perf_now_ns() - t_begin;
    if (rc == 0)
        rc = perf_ep_drain(run->r, ep, NULL);
    struct perf_msg result;
    if (rc == 0)
        rc = perf_run_end(run->ctrl_fd, run->count, &result);
    if (rc == 0)
        perf_result_from_stream(res, run->count, ok, ok, t_last - t_begin, run->size, elapsed);
    return rc;
}

static int client_stream(struct run *run, const struct perf_msg *ready, struct perf_result *res)
{
    struct perf_ep *ep = run->ep;
    uint32_t window = run->window < ep->sq_depth / 2 ? run->window : ep->sq_depth / 2;
    ep->sig_every = bw_sig_every(ep, window);
    bool credited = run->test == PERF_SEND && ep->group == PERF_GROUP_RC;
    uint64_t credits = credited ? ready->credits : UINT64_MAX, credit_msgs = 0;
    enum rs_rnic_wr_opcode op = run->test == PERF_SEND ? RS_WR_SEND
                                : run->test == PERF_WRECORD ? RS_WR_WRITE_RECORD : RS_WR_RDMA_WRITE;
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    uint64_t t_begin = perf_now_ns();
    int rc = 0;
    for (uint64_t posted = 0; rc == 0 && posted < run->count;) {
        /* The window counts requests a signaled completion is still to retire (sig_every <= window, so a full
         * window always has one to wait for); unsignaled ones left by an earlier run ride along. */
        while (rc == 0 && (ep->sq_outstanding - ep->unsignaled >= window || credits == 0)) {
            int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, -1, PERF_RELIABLE_TIMEOUT_MS);
            if (n <= 0) {
                perf_log("%s bw: stalled (%u outstanding, %llu credits)", perf_test_name(run->test),
                         ep->sq_outstanding, (unsigned long long)credits);
                rc = n ? n : -ETIMEDOUT;
                break;
            }
            for (int i = 0; i < n; i++) {
                if (wc[i].opcode == RS_WC_RECV && credited) {
                    credits += PERF_CREDIT_BATCH;
                    credit_msgs++;
                }
            }
            rc = perf_ep_repost(ep, false);
        }
        if (rc)
            break;
        bool last = posted + 1 == run->count;
        rc = perf_ep_post(ep, op, run->size, last && run->test != PERF_WRITE);
        posted++;
        credits--;
    }
    if (rc == 0 && run->test == PERF_WRITE)
        rc = perf_ep_post(ep, RS_WR_SEND, 0, true);         /* arrives after the last WRITE's data */
    uint64_t recvs = 0;
    if (rc == 0)
        rc = perf_ep_drain(run->r, ep, &recvs);
    credit_msgs += recvs;
    uint64_t elapsed = perf_now_ns() - t_begin;
    struct perf_msg result;
    if (rc == 0)
        rc = perf_run_end(run->ctrl_fd, run->count, &result);
    /* Credits still on their way belong to this run: take them now so the next run starts even. */
    while (rc == 0 && credited && credit_msgs < result.credits) {
        int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, -1, PERF_RELIABLE_TIMEOUT_MS);
        if (n <= 0) {
            rc = n ? n : -ETIMEDOUT;
            break;
        }
        for (int i = 0; i < n; i++)
            credit_msgs += wc[i].opcode == RS_WC_RECV;
        rc = perf_ep_repost(ep, true);
    }
    if (rc == 0)
        perf_result_from_stream(res, run->count, result.received, result.count, result.elapsed_ns, run->size,
                                elapsed);
    return rc;
}

int perf_rdma_client_run(struct perf_rdma *r, int ctrl_fd, const struct perf_case *c, enum perf_mode mode,
                         size_t size, uint64_t count, uint32_t window, struct perf_result *res)
{
    struct perf_ep *ep = &r->ep[perf_case_group(c)];
    if (!ep->up)
        return -ENOTCONN;
    struct run run = { r, ep, ctrl_fd, c->test, size, count, window, 0 };
    struct perf_msg ready;
    int rc = perf_ep_repost(ep, true);
    if (rc == 0)
        rc = perf_run_begin(ctrl_fd, c, mode, size, count, window, &ready);
    if (rc)
        return rc;
    if (mode == PERF_LAT)
        return client_lat(&run, res);
    if (c->test == PERF_READ)
        return client_read_bw(&run, res);
    return client_stream(&run, &ready, res);
}

/* ---- server ---- */

/* Reads the client's DONE (it must be the next control message). */
static int expect_done(int ctrl_fd, uint64_t *sent)
{
    struct perf_msg m;
    int rc = perf_msg_expect(ctrl_fd, PERF_MSG_DONE, &m);
    if (rc == 0 && sent)
        *sent = m.count;
    return rc;
}

static int server_lat(struct run *run, struct perf_msg *result)
{
    struct perf_ep *ep = run->ep;
    if (run->test == PERF_READ)
        return expect_done(run->ctrl_fd, NULL);     /* the RNIC answers READs without us */
    enum rs_rnic_wc_opcode trigger = arrival_opcode(run->test);
    ep->sig_every = 16;
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    for (;;) {
        int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, run->ctrl_fd, -1);
        if (n == PERF_WAIT_CTRL)
            return expect_done(run->ctrl_fd, NULL);
        if (n < 0)
            return n;
        for (int i = 0; i < n; i++) {
            if (wc[i].opcode != trigger || wc[i].status != RS_WC_SUCCESS)
                continue;
            result->received++;
            if (ep->sq_outstanding + 2 > ep->sq_depth) {
                perf_log("server: send queue full while echoing");
                return -ENOSPC;
            }
            int rc = post_message(run, false);
            if (rc)
                return rc;
        }
        int rc = perf_ep_repost(ep, false);
        if (rc)
            return rc;
    }
}

/* UD SEND / WRITE_RECORD streams: count until the client is done and nothing more arrives. */
static int server_ud_stream(struct run *run, struct perf_msg *result)
{
    struct perf_ep *ep = run->ep;
    enum rs_rnic_wc_opcode trigger = arrival_opcode(run->test);
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    uint64_t received = 0, sent = 0, t_last = run->t_ready;
    bool done = false;
    for (;;) {
        int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, done ? -1 : run->ctrl_fd, done ? PERF_IDLE_MS : -1);
        if (n == PERF_WAIT_CTRL) {
            int rc = expect_done(run->ctrl_fd, &sent);
            if (rc)
                return rc;
            done = true;
        } else if (n < 0) {
            return n;
        } else if (n == 0) {
            break;                  /* quiet for PERF_IDLE_MS after DONE: the rest was lost */
        }
        uint64_t now = perf_now_ns();
        for (int i = 0; i < n; i++) {
            if (wc[i].opcode != trigger || wc[i].status != RS_WC_SUCCESS)
                continue;
            received++;
            t_last = now;
        }
        int rc = perf_ep_repost(ep, false);
        if (rc)
            return rc;
        if (done && received >= sent)
            break;
    }
    result->received = received;
    result->count = received;
    result->elapsed_ns = t_last - run->t_ready;
    return 0;
}

/* RC SEND stream: every message arrives; credits go back as receives are reposted. */
static int server_rc_send_stream(struct run *run, struct perf_msg *result)
{
    struct perf_ep *ep = run->ep;
    ep->sig_every = 1;
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    uint64_t received = 0, credited = 0, credit_msgs = 0, t_last = run->t_ready;
    while (received < run->count) {
        int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, -1, PERF_RELIABLE_TIMEOUT_MS);
        if (n <= 0) {
            perf_log("rc send bw: %llu of %llu arrived, then nothing", (unsigned long long)received,
                     (unsigned long long)run->count);
            return n ? n : -ETIMEDOUT;
        }
        uint64_t now = perf_now_ns();
        for (int i = 0; i < n; i++) {
            if (wc[i].opcode != RS_WC_RECV)
                continue;
            received++;
            t_last = now;
        }
        int rc = perf_ep_repost(ep, false);
        if (rc)
            return rc;
        uint64_t reposted = received - ep->rq_missing;
        /* No credit after the last message: it could only arrive during the client's next run. */
        while (received < run->count && reposted - credited >= PERF_CREDIT_BATCH) {
            if (ep->sq_outstanding + 1 > ep->sq_depth)
                break;
            rc = perf_ep_post(ep, RS_WR_SEND, 0, true);
            if (rc)
                return rc;
            credited += PERF_CREDIT_BATCH;
            credit_msgs++;
        }
    }
    int rc = expect_done(run->ctrl_fd, NULL);
    if (rc)
        return rc;
    result->received = received;
    result->count = received;
    result->elapsed_ns = t_last - run->t_ready;
    result->credits = credit_msgs;
    return 0;
}

/* RC WRITE stream: the notice after the last WRITE ends it (a SEND after a WRITE arrives after its data). */
static int server_rc_write_stream(struct run *run, struct perf_msg *result)
{
    struct perf_ep *ep = run->ep;
    struct rs_rnic_wc wc[PERF_WC_BATCH];
    uint64_t t_last = 0;
    for (bool noticed = false; !noticed;) {
        int n = perf_ep_wait(run->r, ep, wc, PERF_WC_BATCH, -1, PERF_RELIABLE_TIMEOUT_MS);
        if (n <= 0)
            return n ? n : -ETIMEDOUT;
        t_last = perf_now_ns();
        for (int i = 0; i < n; i++)
            noticed |= wc[i].opcode == RS_WC_RECV;
    }
    int rc = perf_ep_repost(ep, true);
    if (rc == 0)
        rc = expect_done(run->ctrl_fd, NULL);
    result->received = run->count;
    result->count = run->count;
    result->elapsed_ns = t_last - run->t_ready;
    return rc;
}

int perf_rdma_server_run(struct perf_rdma *r, int ctrl_fd, const struct perf_msg *m)
{
    struct perf_ep *ep = &r->ep[m->group == PERF_GROUP_UD ? PERF_GROUP_UD : PERF_GROUP_RC];
    if (!ep->up)
        return -ENOTCONN;
    struct run run = { r, ep, ctrl_fd, (enum perf_test)m->test, m->size, m->count, (uint32_t)m->window, 0 };
    int rc = perf_ep_repost(ep, true);
    if (rc)
        return rc;
    struct perf_msg ready;
    memset(&ready, 0, sizeof(ready));
    ready.credits = ep->rq_depth;       /* every receive is posted: the client may send that many */
    run.t_ready = perf_now_ns();
    rc = perf_reply(ctrl_fd, PERF_MSG_READY, &ready);
    if (rc)
        return rc;
    struct perf_msg result;
    memset(&result, 0, sizeof(result));
    if (m->mode == PERF_LAT)
        rc = server_lat(&run, &result);
    else if (run.test == PERF_READ)
        rc = expect_done(ctrl_fd, NULL);
    else if (ep->group == PERF_GROUP_UD)
        rc = server_ud_stream(&run, &result);
    else if (run.test == PERF_SEND)
        rc = server_rc_send_stream(&run, &result);
    else
        rc = server_rc_write_stream(&run, &result);
    if (rc == 0)
        rc = perf_ep_drain(r, ep, NULL);
    if (rc)
        return rc;
    return perf_reply(ctrl_fd, PERF_MSG_RESULT, &result);
}
