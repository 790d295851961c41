/*
 * RNIC core tests.
 *
 * Group "conformance" is written against rnic.h only and runs against the provider named by RS_RNIC_KIND
 * (soft | verbs, default soft): devices and caps, PDs, memory registration (random key bits, rekey,
 * invalidation), CQs (notification fd, errors), SRQ ordering across QPs, QP validation, the ERROR state and
 * flushing, the CM event channel.
 *
 * Group "soft internals" tests the software RNIC's own pieces and skips on other providers: the datagram wire
 * decoder (every malformed header refused), the receive path fed from buffers (drops are counted, bad CRCs never
 * complete, out-of-order and duplicate segments, abandoned messages), the STag checks' edge cases, the progress
 * engine (fd watches, timers, calls on the loop thread) and the TEST ONLY drop knob.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/crc32c.h"
#include "rnic/rnic.h"
#include "rnic_test_util.h"
#include "rnic/soft/soft.h"
#include "rnic/soft/ud.h"

static bool fd_readable(int fd, int timeout_ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, timeout_ms) == 1;
}

/* Per-test device: one RNIC, one PD, one CQ, one CM channel. */
struct dev {
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq;
    struct rs_rnic_cm *cm;
};

static int setup_dev(void **state)
{
    struct dev *d = calloc(1, sizeof(*d));
    struct sockaddr_in local = test_addr(0);
    if (rs_rnic_open(test_kind(), (struct sockaddr *)&local, &d->rnic) != 0)
        return -1;
    if (rs_rnic_alloc_pd(d->rnic, &d->pd) || rs_rnic_create_cq(d->rnic, 1024, &d->cq) ||
        rs_rnic_cm_create(d->rnic, &d->cm))
        return -1;
    *state = d;
    return 0;
}

static int teardown_dev(void **state)
{
    struct dev *d = *state;
    rs_rnic_cm_destroy(d->cm);
    if (rs_rnic_destroy_cq(d->cq) || rs_rnic_dealloc_pd(d->pd))
        return -1;
    rs_rnic_close(d->rnic);
    free(d);
    return 0;
}

static struct rs_rnic_qp *ud_qp(struct dev *d, struct rs_rnic_srq *srq, bool bind)
{
    struct rs_rnic_qp_attr attr = { .type = RS_QPT_UD, .send_cq = d->cq, .recv_cq = d->cq, .srq = srq,
                                    .max_send_wr = 64, .max_recv_wr = srq ? 0 : 64, .max_send_sge = 2,
                                    .max_recv_sge = 2, .record_timeout_ms = 100, .ud_read_timeout_ms = 100 };
    struct rs_rnic_qp *qp = NULL;
    assert_int_equal(rs_rnic_create_qp(d->pd, &attr, &qp), 0);
    if (bind) {
        struct sockaddr_in local = test_addr(0);
        assert_int_equal(rs_rnic_ud_bind(qp, (struct sockaddr *)&local, sizeof(local)), 0);
    }
    return qp;
}

static struct rs_rnic_ud_peer *resolve(struct dev *d, struct rs_rnic_qp *from, struct rs_rnic_qp *to)
{
    struct sockaddr_storage addr;
    assert_int_equal(rs_rnic_ud_local_addr(to, &addr), 0);
    struct rs_rnic_ud_peer *peer = NULL;
    /* 1 s: a CI run's 100 ms resolution over verbs timed out (UD_PEER_UNREACHABLE) on a loaded TCG guest. */
    assert_int_equal(rs_rnic_ud_resolve_peer(from, d->cm, (struct sockaddr *)&addr, NULL, 1000, NULL, &peer), 0);
    struct rs_rnic_cm_event ev;
    uint64_t end = now_ms() + 3000;
    int rc;
    while ((rc = rs_rnic_cm_get_event(d->cm, &ev)) == -EAGAIN && now_ms() < end)
        sleep_ms(1);
    assert_int_equal(rc, 0);
    assert_int_equal(ev.type, RS_RNIC_CM_EV_UD_PEER_RESOLVED);
    return peer;
}

/* ================================ conformance (rnic.h only) ================================ */

static void test_open_and_caps(void **state)
{
    (void)state;
    struct rs_rnic *rnic = NULL;
    struct sockaddr_in local = test_addr(0);
    assert_int_equal(rs_rnic_open(test_kind(), (struct sockaddr *)&local, &rnic), 0);
    const struct rs_rnic_caps *caps = rs_rnic_caps(rnic);
    assert_int_equal(caps->kind, test_kind());
    assert_true(caps->name[0] != '\0');
    assert_true(caps->max_qp_wr > 0 && caps->max_sge > 0 && caps->max_cqe > 0);
    assert_true(caps->max_ud_msg > 0 && caps->max_ud_msg <= 65507);
    assert_true(caps->max_record_msg >= caps->max_ud_msg);
    if (is_soft()) {
        assert_string_equal(caps->name, "soft");
        assert_true(caps->has_srq);
        assert_true(caps->has_native_write_record);
        assert_false(caps->has_xrc);
    }
    rs_rnic_close(rnic);
    /* Kind 0 (auto) always finds a device: verbs if one serves the address, else the soft RNIC. */
    assert_int_equal(rs_rnic_open(0, NULL, &rnic), 0);
    assert_non_null(rnic);
    rs_rnic_close(rnic);
    /* An unknown kind is not an error, just no device. */
    assert_int_equal(rs_rnic_open(99, NULL, &rnic), -ENODEV);
    assert_null(rnic);
    struct sockaddr_un un = { .sun_family = AF_UNIX };
    assert_int_equal(rs_rnic_open(test_kind(), (struct sockaddr *)&un, &rnic), -ENODEV);
}

static void test_pd_busy(void **state)
{
    struct dev *d = *state;
    struct rs_rnic_pd *pd;
    assert_int_equal(rs_rnic_alloc_pd(d->rnic, &pd), 0);
    static uint8_t mem[4096];
    struct rs_rnic_mr *mr;
    assert_int_equal(rs_rnic_reg_mr(pd, mem, sizeof(mem), RS_ACCESS_LOCAL_WRITE, &mr), 0);
    assert_int_equal(rs_rnic_dealloc_pd(pd), -EBUSY);
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
    struct rs_rnic_srq *srq;
    assert_int_equal(rs_rnic_create_srq(pd, 16, 1, &srq), 0);
    assert_int_equal(rs_rnic_dealloc_pd(pd), -EBUSY);
    assert_int_equal(rs_rnic_destroy_srq(srq), 0);
    struct rs_rnic_qp_attr attr = { .type = RS_QPT_UD, .send_cq = d->cq, .recv_cq = d->cq, .max_send_wr = 4,
                                    .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 };
    struct rs_rnic_qp *qp;
    assert_int_equal(rs_rnic_create_qp(pd, &attr, &qp), 0);
    assert_int_equal(rs_rnic_dealloc_pd(pd), -EBUSY);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    assert_int_equal(rs_rnic_dealloc_pd(pd), 0);
}

static void test_mr_keys(void **state)
{
    struct dev *d = *state;
    enum { N = 64 };
    static uint8_t mem[N][256];
    struct rs_rnic_mr *mr[N];
    bool key_seen[256] = { false };
    int distinct_keys = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(rs_rnic_reg_mr(d->pd, mem[i], sizeof(mem[i]), RS_ACCESS_REMOTE_WRITE, &mr[i]), 0);
        assert_ptr_equal(mr[i]->addr, mem[i]);
        assert_int_equal(mr[i]->length, sizeof(mem[i]));
        assert_ptr_equal(mr[i]->pd, d->pd);
        assert_true(mr[i]->access & RS_ACCESS_REMOTE_WRITE);
        if (is_soft())
            assert_true(mr[i]->access & RS_ACCESS_LOCAL_WRITE);   /* REMOTE_WRITE implies it */
        for (int j = 0; j < i; j++) {
            assert_int_not_equal(mr[i]->rkey, mr[j]->rkey);
            assert_int_not_equal(mr[i]->lkey, mr[j]->lkey);
        }
        if (!key_seen[mr[i]->rkey & 0xff]) {
            key_seen[mr[i]->rkey & 0xff] = true;
            distinct_keys++;
        }
    }
    /* Random key bits: 64 draws from 256 values give far more than 16 distinct ones (unless not random). */
    assert_true(distinct_keys >= 16);
    /* Rekey: a fresh rkey every time, never the one just replaced; the region (index) stays the same. */
    for (int r = 0; r < 50; r++) {
        uint32_t old = mr[0]->rkey;
        assert_int_equal(rs_rnic_mr_invalidate(mr[0]), 0);
        assert_int_equal(rs_rnic_mr_rekey(mr[0]), 0);
        assert_int_not_equal(mr[0]->rkey, old);
        if (is_soft())
            assert_int_equal(mr[0]->rkey >> 8, old >> 8);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(rs_rnic_dereg_mr(mr[i]), 0);
    struct rs_rnic_mr *bad;
    assert_int_equal(rs_rnic_reg_mr(d->pd, mem[0], 16, 1u << 12, &bad), -EINVAL);
}

static void test_cq_basics(void **state)
{
    struct dev *d = *state;
    struct rs_rnic_cq *cq;
    assert_int_equal(rs_rnic_create_cq(d->rnic, 0, &cq), -EINVAL);
    assert_int_equal(rs_rnic_create_cq(d->rnic, 8, &cq), 0);
    int fd = rs_rnic_cq_fd(cq);
    assert_true(fd >= 0);
    struct rs_rnic_wc wc[4];
    assert_int_equal(rs_rnic_poll_cq(cq, 4, wc), 0);
    assert_int_equal(rs_rnic_poll_cq(cq, 0, wc), 0);
    assert_int_equal(rs_rnic_cq_arm(cq, false), 0);
    assert_false(fd_readable(fd, 0));
    /* A CQ a QP uses cannot go away. */
    struct rs_rnic_qp_attr attr = { .type = RS_QPT_UD, .send_cq = cq, .recv_cq = d->cq, .max_send_wr = 4,
                                    .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 };
    struct rs_rnic_qp *qp;
    assert_int_equal(rs_rnic_create_qp(d->pd, &attr, &qp), 0);
    assert_int_equal(rs_rnic_destroy_cq(cq), -EBUSY);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    assert_int_equal(rs_rnic_destroy_cq(cq), 0);
}

static void test_cq_notify(void **state)
{
    struct dev *d = *state;
    struct rs_rnic_qp *a = ud_qp(d, NULL, true), *b = ud_qp(d, NULL, true);
    struct rs_rnic_ud_peer *peer = resolve(d, a, b);
    static uint8_t mem[64];
    struct rs_rnic_mr *mr;
    assert_int_equal(rs_rnic_reg_mr(d->pd, mem, sizeof(mem), RS_ACCESS_LOCAL_WRITE, &mr), 0);
    int fd = rs_rnic_cq_fd(d->cq);
    struct rs_rnic_wc wc;
    /* The documented sequence: arm, poll once more, then wait on the fd. */
    assert_int_equal(rs_rnic_cq_arm(d->cq, false), 0);
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 0);
    struct rs_rnic_sge sge = { (uintptr_t)mem, 8, mr->lkey };
    struct rs_rnic_send_wr wr = { .wr_id = 1, .opcode = RS_WR_SEND, .flags = RS_SEND_SIGNALED, .sg_list = &sge,
                                  .num_sge = 1, .ud_peer = peer };
    struct rs_rnic_send_wr *bad;
    assert_int_equal(rs_rnic_post_send(a, &wr, &bad), 0);
    assert_true(fd_readable(fd, 5000));
    rs_rnic_cq_ack_events(d->cq);
    assert_false(fd_readable(fd, 0));
    assert_int_equal(wait_wc(d->cq, 1000, &wc), 1);
    assert_int_equal(wc.wr_id, 1);
    assert_int_equal(wc.status, RS_WC_SUCCESS);
    assert_int_equal(wc.opcode, RS_WC_SEND);
    assert_ptr_equal(wc.qp, a);
    rs_rnic_ud_peer_free(peer);
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
    assert_int_equal(rs_rnic_destroy_qp(a), 0);
    assert_int_equal(rs_rnic_destroy_qp(b), 0);
}

static void test_srq_order(void **state)
{
    struct dev *d = *state;
    struct rs_rnic_srq *srq;
    assert_int_equal(rs_rnic_create_srq(d->pd, 0, 1, &srq), -EINVAL);
    assert_int_equal(rs_rnic_create_srq(d->pd, 32, 2, &srq), 0);
    struct rs_rnic_qp *r1 = ud_qp(d, srq, true), *r2 = ud_qp(d, srq, true), *tx = ud_qp(d, NULL, true);
    struct rs_rnic_ud_peer *p1 = resolve(d, tx, r1), *p2 = resolve(d, tx, r2);
    static uint8_t rbuf[6][128], sbuf[64];
    struct rs_rnic_mr *rmr, *smr;
    assert_int_equal(rs_rnic_reg_mr(d->pd, rbuf, sizeof(rbuf), RS_ACCESS_LOCAL_WRITE, &rmr), 0);
    assert_int_equal(rs_rnic_reg_mr(d->pd, sbuf, sizeof(sbuf), 0, &smr), 0);
    for (int i = 0; i < 6; i++) {
        struct rs_rnic_sge sge = { (uintptr_t)rbuf[i], 128, rmr->lkey };
        struct rs_rnic_recv_wr wr = { .wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
        struct rs_rnic_recv_wr *bad;
        assert_int_equal(rs_rnic_post_srq_recv(srq, &wr, &bad), 0);
    }
    /* A QP on an SRQ has no receive queue of its own. */
    struct rs_rnic_sge sge = { (uintptr_t)rbuf[0], 128, rmr->lkey };
    struct rs_rnic_recv_wr rwr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *rbad = NULL;
    assert_int_equal(rs_rnic_post_recv(r1, &rwr, &rbad), -EINVAL);
    assert_ptr_equal(rbad, &rwr);
    assert_int_equal(rs_rnic_destroy_srq(srq), -EBUSY);
    /* Messages to either QP consume the SRQ's receives in posting order, one at a time. */
    struct rs_rnic_qp *dest[6] = { r1, r2, r2, r1, r2, r1 };
    for (int i = 0; i < 6; i++) {
        sbuf[0] = (uint8_t)i;
        struct rs_rnic_sge ssge = { (uintptr_t)sbuf, 1 + (uint32_t)i, smr->lkey };
        struct rs_rnic_send_wr wr = { .wr_id = (uint64_t)i, .opcode = RS_WR_SEND, .sg_list = &ssge, .num_sge = 1,
                                      .ud_peer = dest[i] == r1 ? p1 : p2 };
        struct rs_rnic_send_wr *bad;
        assert_int_equal(rs_rnic_post_send(tx, &wr, &bad), 0);
        struct rs_rnic_wc wc;
        assert_int_equal(wait_wc(d->cq, 5000, &wc), 1);
        assert_int_equal(wc.status, RS_WC_SUCCESS);
        assert_int_equal(wc.opcode, RS_WC_RECV);
        assert_int_equal(wc.wr_id, 100 + (uint64_t)i);
        assert_ptr_equal(wc.qp, dest[i]);
        assert_int_equal(wc.byte_len, 1 + i);
        assert_int_equal(rbuf[i][0], i);
    }
    rs_rnic_ud_peer_free(p1);
    rs_rnic_ud_peer_free(p2);
    assert_int_equal(rs_rnic_destroy_qp(r1), 0);
    assert_int_equal(rs_rnic_destroy_qp(r2), 0);
    assert_int_equal(rs_rnic_destroy_qp(tx), 0);
    assert_int_equal(rs_rnic_destroy_srq(srq), 0);
    assert_int_equal(rs_rnic_dereg_mr(rmr), 0);
    assert_int_equal(rs_rnic_dereg_mr(smr), 0);
}

static void test_qp_validation(void **state)
{
    struct dev *d = *state;
    const struct rs_rnic_caps *caps = rs_rnic_caps(d->rnic);
    struct rs_rnic_qp_attr good = { .type = RS_QPT_UD, .send_cq = d->cq, .recv_cq = d->cq, .max_send_wr = 4,
                                    .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 };
    struct rs_rnic_qp *qp;
    struct rs_rnic_qp_attr a = good;
    a.type = (enum rs_rnic_qp_type)7;
    assert_int_equal(rs_rnic_create_qp(d->pd, &a, &qp), -EINVAL);
    a = good;
    a.send_cq = NULL;
    assert_int_equal(rs_rnic_create_qp(d->pd, &a, &qp), -EINVAL);
    a = good;
    a.max_send_wr = 0;
    assert_int_equal(rs_rnic_create_qp(d->pd, &a, &qp), -EINVAL);
    a = good;
    a.max_send_wr = caps->max_qp_wr + 1;
    assert_int_equal(rs_rnic_create_qp(d->pd, &a, &qp), -EINVAL);
    a = good;
    a.max_recv_sge = caps->max_sge + 1;
    assert_int_equal(rs_rnic_create_qp(d->pd, &a, &qp), -EINVAL);
    a = good;
    a.max_inline = caps->max_inline + 1;
    assert_int_equal(rs_rnic_create_qp(d->pd, &a, &qp), -EINVAL);

    int context;
    a = good;
    a.context = &context;
    struct rs_rnic_qp *q1, *q2;
    assert_int_equal(rs_rnic_create_qp(d->pd, &a, &q1), 0);
    assert_int_equal(rs_rnic_create_qp(d->pd, &good, &q2), 0);
    assert_ptr_equal(rs_rnic_qp_context(q1), &context);
    assert_null(rs_rnic_qp_context(q2));
    assert_int_not_equal(rs_rnic_qp_num(q1), rs_rnic_qp_num(q2));
    assert_int_equal(rs_rnic_qp_state(q1), RS_QPS_INIT);
    /* Not bound yet: a UD QP cannot send. */
    static uint8_t mem[16];
    struct rs_rnic_sge sge = { (uintptr_t)mem, 1, 0 };
    struct rs_rnic_send_wr wr = { .opcode = RS_WR_SEND, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_send_wr *bad = NULL;
    assert_true(rs_rnic_post_send(q1, &wr, &bad) < 0);
    assert_ptr_equal(bad, &wr);
    /* Binding: bad arguments, an address that is not local, then twice. */
    struct sockaddr_un un = { .sun_family = AF_UNIX };
    assert_int_equal(rs_rnic_ud_bind(q1, (struct sockaddr *)&un, sizeof(un)), -EINVAL);
    struct sockaddr_in foreign = test_addr(0);
    inet_pton(AF_INET, "203.0.113.77", &foreign.sin_addr);
    assert_int_equal(rs_rnic_ud_bind(q1, (struct sockaddr *)&foreign, sizeof(foreign)), -EADDRNOTAVAIL);
    assert_int_equal(rs_rnic_qp_state(q1), RS_QPS_INIT);
    struct sockaddr_in local = test_addr(0);
    assert_int_equal(rs_rnic_ud_bind(q1, (struct sockaddr *)&local, sizeof(local)), 0);
    assert_int_equal(rs_rnic_qp_state(q1), RS_QPS_RTS);
    assert_int_equal(rs_rnic_ud_bind(q1, (struct sockaddr *)&local, sizeof(local)), -EINVAL);
    struct sockaddr_storage got;
    assert_int_equal(rs_rnic_ud_local_addr(q1, &got), 0);
    assert_int_equal(got.ss_family, AF_INET);
    assert_int_not_equal(((struct sockaddr_in *)&got)->sin_port, 0);
    /* UD QPs refuse the RC-only operations. */
    struct rs_rnic_ud_peer *peer = resolve(d, q1, q1);
    wr.ud_peer = peer;
    wr.opcode = RS_WR_RDMA_WRITE;
    assert_int_equal(rs_rnic_post_send(q1, &wr, &bad), -EINVAL);
    wr.opcode = RS_WR_SEND_WITH_INVALIDATE;
    assert_int_equal(rs_rnic_post_send(q1, &wr, &bad), -EINVAL);
    wr.opcode = RS_WR_SEND;
    wr.ud_peer = NULL;
    assert_int_equal(rs_rnic_post_send(q1, &wr, &bad), -EINVAL);
    struct rs_rnic_qos qos = { .sl = 0, .tclass = 0x20 };
    assert_int_equal(rs_rnic_qp_set_qos(q1, &qos), 0);
    rs_rnic_ud_peer_free(peer);
    assert_int_equal(rs_rnic_destroy_qp(q1), 0);
    assert_int_equal(rs_rnic_destroy_qp(q2), 0);
}

static void test_qp_error_flushes(void **state)
{
    struct dev *d = *state;
    struct rs_rnic_qp *qp = ud_qp(d, NULL, true);
    static uint8_t mem[3][64];
    struct rs_rnic_mr *mr;
    assert_int_equal(rs_rnic_reg_mr(d->pd, mem, sizeof(mem), RS_ACCESS_LOCAL_WRITE, &mr), 0);
    for (int i = 0; i < 3; i++) {
        struct rs_rnic_sge sge = { (uintptr_t)mem[i], 64, mr->lkey };
        struct rs_rnic_recv_wr wr = { .wr_id = 10 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
        struct rs_rnic_recv_wr *bad;
        assert_int_equal(rs_rnic_post_recv(qp, &wr, &bad), 0);
    }
    assert_int_equal(rs_rnic_qp_set_error(qp), 0);
    assert_int_equal(rs_rnic_qp_state(qp), RS_QPS_ERROR);
    struct rs_rnic_wc wc;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(wait_wc(d->cq, 1000, &wc), 1);
        assert_int_equal(wc.wr_id, 10 + (uint64_t)i);
        assert_int_equal(wc.status, RS_WC_WR_FLUSH_ERR);
        assert_ptr_equal(wc.qp, qp);
    }
    /* Work posted later is flushed too, signaled or not. */
    struct rs_rnic_ud_peer *peer = resolve(d, qp, qp);
    struct rs_rnic_sge sge = { (uintptr_t)mem[0], 8, mr->lkey };
    struct rs_rnic_send_wr swr = { .wr_id = 20, .opcode = RS_WR_SEND, .sg_list = &sge, .num_sge = 1,
                                   .ud_peer = peer };
    struct rs_rnic_send_wr *sbad;
    assert_int_equal(rs_rnic_post_send(qp, &swr, &sbad), 0);
    assert_int_equal(wait_wc(d->cq, 1000, &wc), 1);
    assert_int_equal(wc.wr_id, 20);
    assert_int_equal(wc.status, RS_WC_WR_FLUSH_ERR);
    struct rs_rnic_recv_wr rwr = { .wr_id = 21, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *rbad;
    assert_int_equal(rs_rnic_post_recv(qp, &rwr, &rbad), 0);
    assert_int_equal(wait_wc(d->cq, 1000, &wc), 1);
    assert_int_equal(wc.wr_id, 21);
    assert_int_equal(wc.status, RS_WC_WR_FLUSH_ERR);
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 0);
    rs_rnic_ud_peer_free(peer);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    /* Destroying a QP flushes what it still holds. */
    qp = ud_qp(d, NULL, false);
    for (int i = 0; i < 2; i++) {
        struct rs_rnic_recv_wr wr = { .wr_id = 30 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
        assert_int_equal(rs_rnic_post_recv(qp, &wr, &rbad), 0);
    }
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 1);
        assert_int_equal(wc.wr_id, 30 + (uint64_t)i);
        assert_int_equal(wc.status, RS_WC_WR_FLUSH_ERR);
    }
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
}

static void test_cm_channel(void **state)
{
    struct dev *d = *state;
    int fd = rs_rnic_cm_fd(d->cm);
    assert_true(fd >= 0);
    struct rs_rnic_cm_event ev;
    assert_int_equal(rs_rnic_cm_get_event(d->cm, &ev), -EAGAIN);
    assert_false(fd_readable(fd, 0));
    struct rs_rnic_qp *qp = ud_qp(d, NULL, true);
    /* The soft RNIC resolves without asking the peer, so any port will do and the events are queued before
     * the call returns. verbs asks the peer's UD QP (SIDR): resolve a bound one, and wait for each event. */
    struct rs_rnic_qp *target = is_soft() ? NULL : ud_qp(d, NULL, true);
    struct sockaddr_in dst = test_addr(9);
    if (target) {
        struct sockaddr_storage taddr;
        assert_int_equal(rs_rnic_ud_local_addr(target, &taddr), 0);
        memcpy(&dst, &taddr, sizeof(dst));
    }
    uint32_t timeout = is_soft() ? 100 : 2000;
    struct rs_rnic_ud_peer *peers[3];
    int ctx[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(rs_rnic_ud_resolve_peer(qp, d->cm, (struct sockaddr *)&dst, NULL, timeout, &ctx[i],
                                                 &peers[i]), 0);
    /* Readable exactly while events are queued; the soft RNIC's come out in order, verbs' as each peer
     * answered. */
    assert_true(fd_readable(fd, 1000));
    bool seen[3] = { false, false, false };
    for (int i = 0; i < 3; i++) {
        assert_true(fd_readable(fd, is_soft() ? 0 : (int)timeout));
        assert_int_equal(rs_rnic_cm_get_event(d->cm, &ev), 0);
        assert_int_equal(ev.type, RS_RNIC_CM_EV_UD_PEER_RESOLVED);
        int k = is_soft() ? i : (int)((int *)ev.context - ctx);
        assert_true(k >= 0 && k < 3 && !seen[k]);
        seen[k] = true;
        assert_ptr_equal(ev.context, &ctx[k]);
        assert_ptr_equal(ev.ud_peer, peers[k]);
        assert_int_equal(((struct sockaddr_in *)&ev.peer)->sin_port, dst.sin_port);
    }
    assert_false(fd_readable(fd, 0));
    assert_int_equal(rs_rnic_cm_get_event(d->cm, &ev), -EAGAIN);
    /* A channel destroyed with events still queued. */
    struct rs_rnic_cm *cm2;
    assert_int_equal(rs_rnic_cm_create(d->rnic, &cm2), 0);
    struct rs_rnic_ud_peer *p4;
    assert_int_equal(rs_rnic_ud_resolve_peer(qp, cm2, (struct sockaddr *)&dst, NULL, 100, NULL, &p4), 0);
    rs_rnic_cm_destroy(cm2);
    rs_rnic_ud_peer_free(p4);
    for (int i = 0; i < 3; i++)
        rs_rnic_ud_peer_free(peers[i]);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    if (target)
        assert_int_equal(rs_rnic_destroy_qp(target), 0);
}

/* ================================ soft internals ================================ */

#define SKIP_UNLESS_SOFT() do { if (!is_soft()) skip(); } while (0)

static void test_wire_roundtrip(void **state)
{
    (void)state;
    SKIP_UNLESS_SOFT();
    uint8_t b[RS_UD_MAX_HDR_LEN];
    struct rs_ud_hdr h;
    size_t n = rs_ud_put_send(b, false, true, 200000, 7, RS_UD_SEG_LEN);
    assert_int_equal(n, 18);
    assert_int_equal(rs_ud_decode(b, n, n + RS_UD_SEG_LEN + 4, &h), 0);
    assert_int_equal(h.kind, RS_UD_KIND_SEND);
    assert_true(h.solicited);
    assert_false(h.last);
    assert_int_equal(h.msg_len, 200000);
    assert_int_equal(h.msn, 7);
    assert_int_equal(h.seg_index, 1);
    assert_int_equal(h.seg_count, 4);
    /* Bytes on the wire: untagged, RDMAP v1, Send with SE (0x5), QN 0. */
    assert_int_equal(b[0], 0x01);
    assert_int_equal(b[1], 0x45);

    n = rs_ud_put_write_record(b, true, 0x1234567f, 0x1000 + 2 * 1000, 99, 2500, 0x1000, 1000);
    assert_int_equal(n, 34);
    assert_int_equal(b[0], 0xc1);
    assert_int_equal(b[1], 0x4d);
    assert_int_equal(rs_ud_decode(b, n, n + 500 + 4, &h), 0);
    assert_int_equal(h.kind, RS_UD_KIND_WRITE_RECORD);
    assert_int_equal(h.stag, 0x1234567f);
    assert_int_equal(h.msg_id, 99);
    assert_int_equal(h.seg_index, 2);
    assert_int_equal(h.seg_count, 3);
    assert_int_equal(h.base_to, 0x1000);

    n = rs_ud_put_read_req(b, 3, 0xabcdef01, 0, 5000, 0x300, 0x7000);
    assert_int_equal(n, 46);
    assert_int_equal(rs_ud_decode(b, n, n + 4, &h), 0);
    assert_int_equal(h.kind, RS_UD_KIND_READ_REQ);
    assert_int_equal(h.sink_stag, 0xabcdef01);
    assert_int_equal(h.read_len, 5000);
    assert_int_equal(h.src_stag, 0x300);
    assert_int_equal(h.src_to, 0x7000);

    struct rs_ud_hdr req = h;
    n = rs_ud_put_terminate(b, rs_term_word(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION,
                                            RS_TERM_RDMAP_INVALID_STAG, 0), &req);
    assert_int_equal(n, 50);
    assert_int_equal(rs_ud_decode(b, n, n + 4, &h), 0);
    assert_int_equal(h.kind, RS_UD_KIND_TERMINATE);
    assert_int_equal(h.sink_stag, 0xabcdef01);

    n = rs_ud_put_read_resp(b, true, 0xabcdef01, 64512);
    assert_int_equal(n, 14);
    assert_int_equal(rs_ud_decode(b, n, n + 100 + 4, &h), 0);
    assert_int_equal(h.kind, RS_UD_KIND_READ_RESP);
    assert_int_equal(h.to, 64512);
    assert_int_equal(h.payload_len, 100);
}

/* Every header below is malformed in exactly one way and must be refused before anything is placed. */
static void test_wire_rejects(void **state)
{
    (void)state;
    SKIP_UNLESS_SOFT();
    uint8_t b[RS_UD_MAX_HDR_LEN];
    struct rs_ud_hdr h;
    size_t n;
#define REJECT(len, dgram) assert_int_equal(rs_ud_decode(b, (len), (dgram), &h), -EBADMSG)
    /* Too short, too long. */
    n = rs_ud_put_send(b, true, false, 10, 1, 0);
    REJECT(1, 1);
    REJECT(n, n + 3);                       /* no room for the CRC */
    REJECT(n - 1, n + 10 + 4);              /* header cut short */
    REJECT(n, 70000);
    /* Versions, reserved bits. */
    b[0] ^= 0x03; REJECT(n, n + 10 + 4); b[0] ^= 0x03;
    b[1] ^= 0xc0; REJECT(n, n + 10 + 4); b[1] ^= 0xc0;
    b[0] |= 0x04; REJECT(n, n + 10 + 4); b[0] &= (uint8_t)~0x04;
    b[1] |= 0x10; REJECT(n, n + 10 + 4); b[1] &= (uint8_t)~0x10;
    assert_int_equal(rs_ud_decode(b, n, n + 10 + 4, &h), 0);     /* restored: accepted */
    /* Tagged bit on a SEND; wrong queue; length disagreements; segment geometry. */
    b[0] |= 0x80; REJECT(n, n + 10 + 4); b[0] &= 0x7f;
    rs_put_be32(b + 6, 1); REJECT(n, n + 10 + 4); rs_put_be32(b + 6, 0);
    REJECT(n, n + 9 + 4);                   /* payload shorter than msg_len */
    n = rs_ud_put_send(b, false, false, 10, 1, 0);
    REJECT(n, n + 10 + 4);                  /* last segment without L */
    n = rs_ud_put_send(b, true, false, 100000, 1, 0);
    REJECT(n, n + RS_UD_SEG_LEN + 4);       /* L on the first of two */
    n = rs_ud_put_send(b, false, false, 100000, 1, 1000);
    REJECT(n, n + RS_UD_SEG_LEN + 4);       /* MO not on a segment boundary */
    n = rs_ud_put_send(b, true, false, RS_UD_MAX_MSG + 1, 1, 64u * RS_UD_SEG_LEN);
    REJECT(n, n + 1 + 4);                   /* more than 64 segments */
    n = rs_ud_put_send(b, false, false, 200000, 1, 0);
    REJECT(n, n + 100 + 4);                 /* middle segment of the wrong size */
    /* Opcodes with no meaning on UD. */
    rs_ddp_ctrl_put(b, true, true, RS_RDMAP_WRITE); REJECT(14, 14 + 4);
    rs_ddp_ctrl_put(b, false, true, RS_RDMAP_SEND_INVALIDATE); REJECT(18, 18 + 4);
    rs_ddp_ctrl_put(b, false, true, 0x8); REJECT(18, 18 + 4);
    rs_ddp_ctrl_put(b, false, true, 0xf); REJECT(18, 18 + 4);
    /* Write-Record. */
    n = rs_ud_put_write_record(b, true, 1, 0x1000, 1, 100, 0x1000, 1000);
    assert_int_equal(rs_ud_decode(b, n, n + 100 + 4, &h), 0);
    b[0] &= 0x7f; REJECT(n, n + 100 + 4); b[0] |= 0x80;     /* untagged */
    n = rs_ud_put_write_record(b, true, 1, 0x1000, 1, 100, 0x1000, 0);
    REJECT(n, n + 100 + 4);                 /* seg_len 0 */
    n = rs_ud_put_write_record(b, true, 1, 0x1000, 1, 100, 0x1000, RS_UD_SEG_LEN + 1);
    REJECT(n, n + 100 + 4);                 /* seg_len above the datagram limit */
    n = rs_ud_put_write_record(b, true, 1, 0x0fff, 1, 100, 0x1000, 1000);
    REJECT(n, n + 100 + 4);                 /* TO before the message */
    n = rs_ud_put_write_record(b, true, 1, UINT64_MAX - 50, 1, 100, UINT64_MAX - 50, 1000);
    REJECT(n, n + 100 + 4);                 /* message wraps */
    n = rs_ud_put_write_record(b, true, 1, 0x1000 + 500, 1, 2000, 0x1000, 1000);
    REJECT(n, n + 1000 + 4);                /* TO not on a segment boundary */
    n = rs_ud_put_write_record(b, true, 1, 0x1000 + 3000, 1, 2000, 0x1000, 1000);
    REJECT(n, n + 0 + 4);                   /* segment index past the message */
    n = rs_ud_put_write_record(b, false, 1, 0x1000 + 1000, 1, 2000, 0x1000, 1000);
    REJECT(n, n + 1000 + 4);                /* last segment without L */
    n = rs_ud_put_write_record(b, true, 1, 0x1000, 1, 65u * 10, 0x1000, 10);
    REJECT(n, n + 10 + 4);                  /* 65 segments */
    /* Read Request with payload or with a wrapping source; Terminate without the echoed request. */
    n = rs_ud_put_read_req(b, 1, 5, 0, 100, 6, 0x1000);
    REJECT(n, n + 1 + 4);
    n = rs_ud_put_read_req(b, 1, 5, 0, 100, 6, UINT64_MAX - 10);
    REJECT(n, n + 4);
    struct rs_ud_hdr req;
    memset(&req, 0, sizeof(req));
    n = rs_ud_put_terminate(b, 0, &req);
    rs_put_be32(b + 18, 0);                 /* R flag cleared */
    REJECT(n, n + 4);
    /* Read Response longer than a segment. */
    n = rs_ud_put_read_resp(b, true, 1, 0);
    REJECT(n, n + RS_UD_SEG_LEN + 1 + 4);
#undef REJECT
}

/* Whole datagram with a valid CRC (or a broken one). */
static size_t finish_dgram(uint8_t *d, size_t hlen, const void *payload, size_t plen, bool bad_crc)
{
    memcpy(d + hlen, payload, plen);
    uint32_t crc = rs_crc32c(0, d, hlen + plen) ^ (bad_crc ? 0x100u : 0);
    rs_crc32c_wire_put(d + hlen + plen, crc);
    return hlen + plen + 4;
}

static void test_rx_buffer_path(void **state)
{
    struct dev *d = *state;
    SKIP_UNLESS_SOFT();
    struct rs_rnic_qp *qp = ud_qp(d, NULL, true);
    static uint8_t mem[4096], region[4096];
    struct rs_rnic_mr *mr, *rmr;
    assert_int_equal(rs_rnic_reg_mr(d->pd, mem, sizeof(mem), RS_ACCESS_LOCAL_WRITE, &mr), 0);
    assert_int_equal(rs_rnic_reg_mr(d->pd, region, sizeof(region), RS_ACCESS_REMOTE_WRITE, &rmr), 0);
    struct sockaddr_in src = test_addr(4242);
    struct rs_soft_stats before, after;
    rs_soft_get_stats(d->rnic, &before);
    uint8_t dg[2000], payload[100];
    memset(payload, 0x61, sizeof(payload));
    struct rs_rnic_wc wc;

    /* Garbage: refused and counted, nothing completes. */
    assert_int_equal(rs_soft_ud_rx_buffer(qp, "garbage!", 8, (struct sockaddr *)&src, sizeof(src)), -EBADMSG);
    /* No receive posted. */
    size_t n = finish_dgram(dg, rs_ud_put_send(dg, true, false, 100, 1, 0), payload, 100, false);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), -EPROTO);
    /* A bad CRC never completes the receive; the intact datagram then completes the same (first) receive. */
    struct rs_rnic_sge sge = { (uintptr_t)mem, 1000, mr->lkey };
    struct rs_rnic_recv_wr rwr = { .wr_id = 5, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *rbad;
    assert_int_equal(rs_rnic_post_recv(qp, &rwr, &rbad), 0);
    n = finish_dgram(dg, rs_ud_put_send(dg, true, false, 100, 2, 0), payload, 100, true);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), 0);
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 0);
    n = finish_dgram(dg, rs_ud_put_send(dg, true, false, 100, 2, 0), payload, 100, false);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), 0);
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 1);
    assert_int_equal(wc.wr_id, 5);
    assert_int_equal(wc.status, RS_WC_SUCCESS);
    assert_int_equal(wc.byte_len, 100);
    assert_int_equal(((struct sockaddr_in *)&wc.src)->sin_port, htons(4242));
    assert_memory_equal(mem, payload, 100);
    /* A Write-Record to a bad STag: counted protection drop, the region untouched. */
    n = finish_dgram(dg, rs_ud_put_write_record(dg, true, rmr->rkey ^ 1, (uintptr_t)region, 1, 100,
                                                (uintptr_t)region, 1000), payload, 100, false);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), -EPROTO);
    assert_int_equal(region[0], 0);
    /* The TEST ONLY knob at 100% drops everything before a byte is placed. */
    rs_soft_test_set_drop(d->rnic, 1000000, 1);
    n = finish_dgram(dg, rs_ud_put_write_record(dg, true, rmr->rkey, (uintptr_t)region, 2, 100,
                                                (uintptr_t)region, 1000), payload, 100, false);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), -ECANCELED);
    assert_int_equal(region[0], 0);
    rs_soft_test_set_drop(d->rnic, 0, 0);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), 0);
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 1);
    assert_int_equal(wc.opcode, RS_WC_RECV_WRITE_RECORD);
    assert_memory_equal(region, payload, 100);

    rs_soft_get_stats(d->rnic, &after);
    assert_int_equal(after.rx_drop_header - before.rx_drop_header, 1);
    assert_int_equal(after.rx_drop_no_recv - before.rx_drop_no_recv, 1);
    assert_int_equal(after.rx_drop_crc - before.rx_drop_crc, 1);
    assert_int_equal(after.rx_drop_protection - before.rx_drop_protection, 1);
    assert_int_equal(after.rx_drop_test - before.rx_drop_test, 1);
    assert_int_equal(after.record_complete - before.record_complete, 1);
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
    assert_int_equal(rs_rnic_dereg_mr(rmr), 0);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
}

/* Segment i of a 3-segment SEND of msg_len bytes (all from one sender unless told). */
static size_t send_seg(uint8_t *dg, uint32_t msn, uint32_t msg_len, uint32_t index, const uint8_t *msg)
{
    uint32_t count = (msg_len + RS_UD_SEG_LEN - 1) / RS_UD_SEG_LEN;
    uint32_t off = index * RS_UD_SEG_LEN;
    uint32_t len = index + 1 < count ? RS_UD_SEG_LEN : msg_len - off;
    size_t h = rs_ud_put_send(dg, index + 1 == count, false, msg_len, msn, off);
    return finish_dgram(dg, h, msg + off, len, false);
}

static void test_reassembly(void **state)
{
    struct dev *d = *state;
    SKIP_UNLESS_SOFT();
    struct rs_rnic_qp *qp = ud_qp(d, NULL, true);
    const uint32_t len = 2 * RS_UD_SEG_LEN + 1000;
    uint8_t *msg = malloc(len), *rbuf = malloc(4 * (size_t)len), *dg = malloc(RS_UD_MAX_DATAGRAM);
    for (uint32_t i = 0; i < len; i++)
        msg[i] = (uint8_t)(i * 7 + 3);
    struct rs_rnic_mr *mr;
    assert_int_equal(rs_rnic_reg_mr(d->pd, rbuf, 4 * (size_t)len, RS_ACCESS_LOCAL_WRITE, &mr), 0);
    for (int i = 0; i < 4; i++) {
        struct rs_rnic_sge sge = { (uintptr_t)rbuf + (size_t)i * len, len, mr->lkey };
        struct rs_rnic_recv_wr wr = { .wr_id = 70 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
        struct rs_rnic_recv_wr *bad;
        assert_int_equal(rs_rnic_post_recv(qp, &wr, &bad), 0);
    }
    struct sockaddr_in s1 = test_addr(1111), s2 = test_addr(2222);
    struct rs_rnic_wc wc;
    struct rs_soft_stats before, after;
    rs_soft_get_stats(d->rnic, &before);

    /* Out of order with a duplicate: one complete message in the first receive. */
    const uint32_t order[] = { 2, 0, 0, 1 };
    for (int i = 0; i < 4; i++) {
        size_t n = send_seg(dg, 10, len, order[i], msg);
        rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&s1, sizeof(s1));
        if (i < 3)
            assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 0);     /* never half a message */
    }
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 1);
    assert_int_equal(wc.wr_id, 70);
    assert_int_equal(wc.status, RS_WC_SUCCESS);
    assert_int_equal(wc.byte_len, len);
    assert_memory_equal(rbuf, msg, len);
    /* A late copy of a finished message changes nothing. */
    size_t n = send_seg(dg, 10, len, 1, msg);
    rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&s1, sizeof(s1));
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 0);

    /* A message missing a segment is superseded by the sender's next one, which gets the same receive. */
    n = send_seg(dg, 11, len, 0, msg);
    rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&s1, sizeof(s1));
    for (uint32_t i = 0; i < 3; i++) {
        n = send_seg(dg, 12, len, i, msg);
        rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&s1, sizeof(s1));
    }
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 1);
    assert_int_equal(wc.wr_id, 71);
    assert_int_equal(wc.status, RS_WC_SUCCESS);

    /* Two senders: s2's message completes while s1's (earlier receive) waits for a segment that never comes.
     * Receives still complete in posting order: s1's gives up (TIMEOUT, byte_len 0) after the 100 ms timeout,
     * then s2's is delivered. */
    n = send_seg(dg, 13, len, 0, msg);
    rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&s1, sizeof(s1));
    for (uint32_t i = 0; i < 3; i++) {
        n = send_seg(dg, 1, len, i, msg);
        rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&s2, sizeof(s2));
    }
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 0);
    assert_int_equal(wait_wc(d->cq, 3000, &wc), 1);
    assert_int_equal(wc.wr_id, 72);
    assert_int_equal(wc.status, RS_WC_TIMEOUT);
    assert_int_equal(wc.byte_len, 0);
    assert_int_equal(rs_rnic_poll_cq(d->cq, 1, &wc), 1);
    assert_int_equal(wc.wr_id, 73);
    assert_int_equal(wc.status, RS_WC_SUCCESS);
    assert_int_equal(((struct sockaddr_in *)&wc.src)->sin_port, htons(2222));
    assert_memory_equal(rbuf + 3 * (size_t)len, msg, len);

    rs_soft_get_stats(d->rnic, &after);
    assert_int_equal(after.rx_msg_incomplete - before.rx_msg_incomplete, 2);
    assert_int_equal(after.rx_drop_late - before.rx_drop_late, 2);   /* the duplicate and the late copy */
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    free(msg);
    free(rbuf);
    free(dg);
}

static void test_stag_checks(void **state)
{
    struct dev *d = *state;
    SKIP_UNLESS_SOFT();
    struct rs_soft_device *dev = rs_soft_dev(d->rnic);
    static uint8_t mem[1000];
    struct rs_rnic_mr *mr, *ro;
    assert_int_equal(rs_rnic_reg_mr(d->pd, mem, sizeof(mem), RS_ACCESS_REMOTE_WRITE, &mr), 0);
    assert_int_equal(rs_rnic_reg_mr(d->pd, mem, sizeof(mem), RS_ACCESS_REMOTE_READ, &ro), 0);
    struct rs_rnic_pd *pd2;
    assert_int_equal(rs_rnic_alloc_pd(d->rnic, &pd2), 0);
    const struct rs_soft_pd *pd = rs_soft_pd(d->pd);
    uint64_t base = (uintptr_t)mem;
    uint8_t *where = NULL;
    const unsigned W = RS_ACCESS_REMOTE_WRITE;
    rs_soft_mr_read_lock(dev);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, base, 1000, W, &where, NULL), RS_SOFT_PROT_OK);
    assert_ptr_equal(where, mem);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, base + 1000, 0, W, &where, NULL), RS_SOFT_PROT_OK);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, base + 999, 2, W, NULL, NULL), RS_SOFT_PROT_BOUNDS);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, base - 1, 1, W, NULL, NULL), RS_SOFT_PROT_BOUNDS);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, base + 1001, 0, W, NULL, NULL), RS_SOFT_PROT_BOUNDS);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, UINT64_MAX, 2, W, NULL, NULL), RS_SOFT_PROT_WRAP);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, base, UINT64_MAX, W, NULL, NULL), RS_SOFT_PROT_WRAP);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey ^ 0x80, base, 1, W, NULL, NULL),
                     RS_SOFT_PROT_INVALID_STAG);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, 0xffffff00, base, 1, W, NULL, NULL), RS_SOFT_PROT_INVALID_STAG);
    assert_int_equal(rs_soft_mr_check_remote(dev, rs_soft_pd(pd2), mr->rkey, base, 1, W, NULL, NULL),
                     RS_SOFT_PROT_PD_MISMATCH);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, ro->rkey, base, 1, W, NULL, NULL), RS_SOFT_PROT_ACCESS);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->lkey, base, 1, W, NULL, NULL),
                     mr->lkey == mr->rkey ? RS_SOFT_PROT_OK : RS_SOFT_PROT_INVALID_STAG);
    /* Local checks use the lkey. */
    struct rs_rnic_sge sge = { base + 10, 990, mr->lkey };
    assert_int_equal(rs_soft_mr_check_local(dev, pd, &sge, RS_ACCESS_LOCAL_WRITE, &where), RS_SOFT_PROT_OK);
    sge.length = 991;
    assert_int_equal(rs_soft_mr_check_local(dev, pd, &sge, 0, NULL), RS_SOFT_PROT_BOUNDS);
    sge.length = 1;
    sge.lkey = ro->lkey;
    assert_int_equal(rs_soft_mr_check_local(dev, pd, &sge, RS_ACCESS_LOCAL_WRITE, NULL), RS_SOFT_PROT_ACCESS);
    rs_soft_mr_read_unlock(dev);
    /* Invalidation from the wire (SEND_WITH_INVALIDATE) needs the right PD. */
    assert_int_equal(rs_soft_mr_invalidate_remote(dev, rs_soft_pd(pd2), mr->rkey), RS_SOFT_PROT_PD_MISMATCH);
    assert_int_equal(rs_soft_mr_invalidate_remote(dev, pd, mr->rkey), RS_SOFT_PROT_OK);
    rs_soft_mr_read_lock(dev);
    assert_int_equal(rs_soft_mr_check_remote(dev, pd, mr->rkey, base, 1, W, NULL, NULL), RS_SOFT_PROT_INVALID_STAG);
    rs_soft_mr_read_unlock(dev);
    assert_int_equal(rs_soft_prot_term_ecode(RS_SOFT_PROT_BOUNDS), RS_TERM_RDMAP_BASE_BOUNDS);
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
    assert_int_equal(rs_rnic_dereg_mr(ro), 0);
    assert_int_equal(rs_rnic_dealloc_pd(pd2), 0);
}

/* ---- progress engine ---- */

struct probe {
    int calls;
    bool on_loop;
    int last_fd;
    int order[8];
    int n_order;
};

static void probe_io(struct rs_soft_watch *w, int fd, unsigned revents, void *arg)
{
    (void)w;
    struct probe *p = arg;
    char c;
    if (revents & RS_SOFT_EV_READ)
        (void)read(fd, &c, 1);
    __atomic_add_fetch(&p->calls, 1, __ATOMIC_SEQ_CST);
    p->last_fd = fd;
}

static void probe_timer(struct rs_soft_timer *t, void *arg)
{
    (void)t;
    struct probe *p = arg;
    __atomic_add_fetch(&p->calls, 1, __ATOMIC_SEQ_CST);
}

struct call_arg {
    struct rs_soft_device *dev;
    struct probe *p;
    int id;
};

static void probe_call(void *arg)
{
    struct call_arg *c = arg;
    c->p->on_loop = rs_soft_progress_on_loop(c->dev);
    c->p->order[c->p->n_order++] = c->id;
}

static bool wait_calls(struct probe *p, int want, unsigned ms)
{
    uint64_t end = now_ms() + ms;
    while (__atomic_load_n(&p->calls, __ATOMIC_SEQ_CST) < want && now_ms() < end)
        sleep_ms(1);
    return __atomic_load_n(&p->calls, __ATOMIC_SEQ_CST) >= want;
}

static void test_progress_engine(void **state)
{
    struct dev *d = *state;
    SKIP_UNLESS_SOFT();
    struct rs_soft_device *dev = rs_soft_dev(d->rnic);
    assert_false(rs_soft_progress_on_loop(dev));
    /* Calls run on the loop thread, in the order they were queued. */
    struct probe p;
    memset(&p, 0, sizeof(p));
    struct call_arg c[3] = { { dev, &p, 1 }, { dev, &p, 2 }, { dev, &p, 3 } };
    assert_int_equal(rs_soft_progress_call(dev, probe_call, &c[0]), 0);
    assert_int_equal(rs_soft_progress_call(dev, probe_call, &c[1]), 0);
    rs_soft_progress_call_sync(dev, probe_call, &c[2]);
    assert_int_equal(p.n_order, 3);
    assert_int_equal(p.order[0], 1);
    assert_int_equal(p.order[1], 2);
    assert_int_equal(p.order[2], 3);
    assert_true(p.on_loop);
    /* fd watches: level-triggered, pausable, and gone for good once deleted. */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    memset(&p, 0, sizeof(p));
    struct rs_soft_watch *w = rs_soft_watch_add(dev, fds[0], RS_SOFT_EV_READ, probe_io, &p);
    assert_non_null(w);
    assert_int_equal(write(fds[1], "ab", 2), 2);
    assert_true(wait_calls(&p, 2, 2000));       /* two bytes, one per callback: level-triggered */
    assert_int_equal(p.last_fd, fds[0]);
    rs_soft_watch_set(w, 0);
    rs_soft_progress_call_sync(dev, probe_call, &c[0]);     /* the pause has been applied */
    int seen = __atomic_load_n(&p.calls, __ATOMIC_SEQ_CST);
    assert_int_equal(write(fds[1], "c", 1), 1);
    sleep_ms(50);
    assert_int_equal(__atomic_load_n(&p.calls, __ATOMIC_SEQ_CST), seen);
    rs_soft_watch_set(w, RS_SOFT_EV_READ);
    assert_true(wait_calls(&p, seen + 1, 2000));
    rs_soft_watch_del(w);
    seen = __atomic_load_n(&p.calls, __ATOMIC_SEQ_CST);
    assert_int_equal(write(fds[1], "d", 1), 1);
    sleep_ms(50);
    assert_int_equal(__atomic_load_n(&p.calls, __ATOMIC_SEQ_CST), seen);
    close(fds[0]);
    close(fds[1]);
    /* Timers: fire once after the delay; disarmed ones never fire. */
    memset(&p, 0, sizeof(p));
    struct rs_soft_timer *t = rs_soft_timer_new(dev, probe_timer, &p);
    assert_non_null(t);
    uint64_t t0 = now_ms();
    rs_soft_timer_arm(t, 30);
    assert_true(wait_calls(&p, 1, 2000));
    assert_true(now_ms() - t0 >= 25);
    sleep_ms(60);
    assert_int_equal(p.calls, 1);
    rs_soft_timer_arm(t, 30);
    rs_soft_timer_arm(t, 0);
    sleep_ms(80);
    assert_int_equal(p.calls, 1);
    rs_soft_timer_free(t);
}

static void test_drop_knob_env(void **state)
{
    (void)state;
    SKIP_UNLESS_SOFT();
    setenv("RDMASOCK_SOFT_TEST_DROP", "1000000:9", 1);
    struct dev *d;
    assert_int_equal(setup_dev((void **)&d), 0);
    unsetenv("RDMASOCK_SOFT_TEST_DROP");
    struct rs_rnic_qp *qp = ud_qp(d, NULL, true);
    uint8_t dg[64];
    struct sockaddr_in src = test_addr(1);
    size_t n = finish_dgram(dg, rs_ud_put_send(dg, true, false, 0, 1, 0), "", 0, false);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), -ECANCELED);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    void *s = d;
    assert_int_equal(teardown_dev(&s), 0);
    /* A malformed value is ignored (with a warning): nothing is dropped. */
    setenv("RDMASOCK_SOFT_TEST_DROP", "lots", 1);
    assert_int_equal(setup_dev((void **)&d), 0);
    unsetenv("RDMASOCK_SOFT_TEST_DROP");
    qp = ud_qp(d, NULL, true);
    assert_int_equal(rs_soft_ud_rx_buffer(qp, dg, n, (struct sockaddr *)&src, sizeof(src)), -EPROTO);  /* no recv */
    struct rs_soft_stats st;
    rs_soft_get_stats(d->rnic, &st);
    assert_int_equal(st.rx_drop_test, 0);
    assert_int_equal(st.rx_drop_no_recv, 1);
    assert_int_equal(rs_rnic_destroy_qp(qp), 0);
    s = d;
    assert_int_equal(teardown_dev(&s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_and_caps),
        cmocka_unit_test_setup_teardown(test_pd_busy, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_mr_keys, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_cq_basics, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_cq_notify, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_srq_order, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_qp_validation, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_qp_error_flushes, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_cm_channel, setup_dev, teardown_dev),
        cmocka_unit_test(test_wire_roundtrip),
        cmocka_unit_test(test_wire_rejects),
        cmocka_unit_test_setup_teardown(test_rx_buffer_path, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_reassembly, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_stag_checks, setup_dev, teardown_dev),
        cmocka_unit_test_setup_teardown(test_progress_engine, setup_dev, teardown_dev),
        cmocka_unit_test(test_drop_knob_env),
    };
    return cmocka_run_group_tests_name("rnic_core", tests, NULL, NULL);
}
