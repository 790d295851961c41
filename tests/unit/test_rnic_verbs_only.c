/*
 * Verbs-provider-only checks (the shared conformance lives in test_rnic_rc/ud/core): which device an address
 * opens, RDMASOCK_DEVICE, "no device" being a fast -ENODEV, STag key bits, fork safety of registered memory,
 * connect timeouts against a listener that never answers, QoS on connected QPs, inline limits, orderly versus
 * abortive close, and XRC capability gating.
 *
 * On a host without RDMA (no /sys/class/infiniband) only the no-device checks run; the others skip, saying so.
 * tests/suites/vm_verbs.sh runs this binary again in a soft-RoCE VM (RS_TEST_ADDR = rxe0's address).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <infiniband/verbs.h>

#include "rnic/rnic.h"

#define WAIT_MS 5000
#define NO_DEVICE_REASON "no RDMA device on this host (these checks run in the VM: tests/suites/vm_verbs.sh)"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int device_count(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (list)
        ibv_free_device_list(list);
    return list ? n : 0;
}

/* The address the verbs device serves (the VM sets it); NULL on a host without one. */
static const char *device_addr(void)
{
    const char *a = getenv("RS_TEST_ADDR");
    return a && *a ? a : NULL;
}

static struct sockaddr_in inet_addr_of(const char *text, uint16_t port)
{
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    assert_int_equal(inet_pton(AF_INET, text, &sin.sin_addr), 1);
    return sin;
}

static void need_device(void)
{
    if (device_count() == 0 || !device_addr()) {
        print_message("skipped: %s\n", NO_DEVICE_REASON);
        skip();
    }
}

/* ---- no device ------------------------------------------------------------------------------------------- */

static void test_no_device_is_enodev_fast(void **state)
{
    (void)state;
    struct rs_rnic *rnic = (struct rs_rnic *)1;
    struct sockaddr_in lo = inet_addr_of("127.0.0.1", 0);
    struct sockaddr_un un = { .sun_family = AF_UNIX };
    uint64_t t0 = now_ms();
    /* Loopback is never served by an RDMA device (rxe cannot attach to lo), with or without devices. */
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&lo, &rnic), -ENODEV);
    assert_null(rnic);
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&un, &rnic), -ENODEV);
    assert_int_equal(setenv("RDMASOCK_DEVICE", "no_such_rdma_device9", 1), 0);
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, NULL, &rnic), -ENODEV);
    assert_null(rnic);
    unsetenv("RDMASOCK_DEVICE");
    if (device_count() == 0) {
        /* No device at all: every request is a quick no. */
        assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, NULL, &rnic), -ENODEV);
        struct sockaddr_in any = inet_addr_of("0.0.0.0", 0);
        assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&any, &rnic), -ENODEV);
    }
    uint64_t took = now_ms() - t0;
    print_message("no-device answers took %llu ms\n", (unsigned long long)took);
    assert_true(took < (device_count() ? 2000u : 100u));
}

static void test_auto_falls_back_to_soft(void **state)
{
    (void)state;
    struct rs_rnic *rnic = NULL;
    struct sockaddr_in lo = inet_addr_of("127.0.0.1", 0);
    assert_int_equal(rs_rnic_open(0, (struct sockaddr *)&lo, &rnic), 0);
    assert_int_equal(rs_rnic_caps(rnic)->kind, RS_RNIC_KIND_SOFT);
    rs_rnic_close(rnic);
    if (device_count() && device_addr()) {
        /* An address a device serves: auto prefers the device. */
        struct sockaddr_in dev = inet_addr_of(device_addr(), 0);
        assert_int_equal(rs_rnic_open(0, (struct sockaddr *)&dev, &rnic), 0);
        assert_int_equal(rs_rnic_caps(rnic)->kind, RS_RNIC_KIND_VERBS);
        rs_rnic_close(rnic);
    }
}

/* ---- device choice and caps -------------------------------------------------------------------------------- */

static void test_device_follows_address(void **state)
{
    (void)state;
    need_device();
    struct sockaddr_in addr = inet_addr_of(device_addr(), 0);
    struct rs_rnic *rnic;
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&addr, &rnic), 0);
    const struct rs_rnic_caps *caps = rs_rnic_caps(rnic);
    char name[64];
    snprintf(name, sizeof(name), "%s", caps->name);
    const char *expected = getenv("RS_VM_RDMA_DEV");
    if (expected && *expected)
        assert_string_equal(name, expected);
    assert_int_equal(caps->kind, RS_RNIC_KIND_VERBS);
    /* rdma_cm on IP addresses: 92 bytes of REQ private data minus its 36-byte header. */
    assert_int_equal(caps->max_connect_private_data, 56);
    /* 196 bytes of REP private data minus the provider's 16-byte mailbox trailer. */
    assert_int_equal(caps->max_accept_private_data, 180);
    assert_false(caps->has_native_write_record);
    assert_true(caps->max_record_msg >= caps->max_ud_msg);
    /* One datagram: the path MTU (256..4096) minus the 40-byte UD header. */
    assert_true(caps->max_ud_msg >= 216 && caps->max_ud_msg <= 4056);
    assert_true(caps->max_inline > 0 && caps->max_qp_wr > 0 && caps->max_sge > 0);
    rs_rnic_close(rnic);
    /* RDMASOCK_DEVICE names the device when no address does. */
    assert_int_equal(setenv("RDMASOCK_DEVICE", name, 1), 0);
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, NULL, &rnic), 0);
    assert_string_equal(rs_rnic_caps(rnic)->name, name);
    rs_rnic_close(rnic);
    unsetenv("RDMASOCK_DEVICE");
    /* The wildcard address takes the first device. */
    struct sockaddr_in any = inet_addr_of("0.0.0.0", 0);
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&any, &rnic), 0);
    rs_rnic_close(rnic);
}

static void test_stag_key_bits(void **state)
{
    (void)state;
    need_device();
    struct sockaddr_in addr = inet_addr_of(device_addr(), 0);
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&addr, &rnic), 0);
    assert_int_equal(rs_rnic_alloc_pd(rnic, &pd), 0);
    enum { N = 64 };
    static uint8_t mem[N][128];
    struct rs_rnic_mr *mr[N];
    bool seen[256] = { false };
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(rs_rnic_reg_mr(pd, mem[i], sizeof(mem[i]), RS_ACCESS_REMOTE_WRITE, &mr[i]), 0);
        if (!seen[mr[i]->rkey & 0xff]) {
            seen[mr[i]->rkey & 0xff] = true;
            distinct++;
        }
        /* A region with remote access has its own registration for the rkey. */
        assert_int_not_equal(mr[i]->rkey, mr[i]->lkey);
    }
    print_message("%d distinct key bytes in %d registrations\n", distinct, N);
    assert_true(distinct >= 16);
    /* Rekeying re-registers: new index and new key bits, the lkey stays. */
    for (int r = 0; r < 20; r++) {
        uint32_t old = mr[0]->rkey, lkey = mr[0]->lkey;
        assert_int_equal(rs_rnic_mr_invalidate(mr[0]), 0);
        assert_int_equal(rs_rnic_mr_rekey(mr[0]), 0);
        assert_int_not_equal(mr[0]->rkey >> 8, old >> 8);
        assert_int_equal(mr[0]->lkey, lkey);
    }
    /* A region without remote access has no rkey to invalidate. */
    struct rs_rnic_mr *local;
    assert_int_equal(rs_rnic_reg_mr(pd, mem[0], 16, RS_ACCESS_LOCAL_WRITE, &local), 0);
    assert_int_equal(rs_rnic_mr_invalidate(local), -EINVAL);
    assert_int_equal(rs_rnic_dereg_mr(local), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(rs_rnic_dereg_mr(mr[i]), 0);
    assert_int_equal(rs_rnic_dealloc_pd(pd), 0);
    rs_rnic_close(rnic);
}

/* ---- a connected pair on one device ------------------------------------------------------------------------ */

struct pair {
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq[2];
    struct rs_rnic_cm *cm[2];
    struct rs_rnic_qp *qp[2];       /* 0 active, 1 passive */
    struct rs_rnic_listener *listener;
    struct sockaddr_storage listen_addr;
};

static int get_event(struct rs_rnic_cm *cm, int timeout_ms, struct rs_rnic_cm_event *ev)
{
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int r = rs_rnic_cm_get_event(cm, ev);
        if (r != -EAGAIN)
            return r;
        int64_t left = (int64_t)(end - now_ms());
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = { .fd = rs_rnic_cm_fd(cm), .events = POLLIN };
        poll(&p, 1, (int)left);
    }
}

static void expect_event(struct rs_rnic_cm *cm, enum rs_rnic_cm_event_type type, struct rs_rnic_cm_event *out)
{
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(cm, WAIT_MS, &ev), 0);
    if (ev.type != type)
        fail_msg("CM event %d, expected %d (error %d)", (int)ev.type, (int)type, ev.error);
    if (out)
        *out = ev;
}

static struct rs_rnic_qp *make_qp(struct pair *p, int side, const struct rs_rnic_qos *qos, uint32_t max_inline)
{
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = p->cq[side], .recv_cq = p->cq[side], .max_send_wr = 64, .max_recv_wr = 64,
        .max_send_sge = 2, .max_recv_sge = 2, .max_inline = max_inline,
    };
    if (qos)
        attr.qos = *qos;
    struct rs_rnic_qp *qp;
    assert_int_equal(rs_rnic_create_qp(p->pd, &attr, &qp), 0);
    return qp;
}

static void pair_open(struct pair *p, const struct rs_rnic_qos *qos, uint32_t max_inline)
{
    memset(p, 0, sizeof(*p));
    struct sockaddr_in addr = inet_addr_of(device_addr(), 0);
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&addr, &p->rnic), 0);
    assert_int_equal(rs_rnic_alloc_pd(p->rnic, &p->pd), 0);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(rs_rnic_create_cq(p->rnic, 256, &p->cq[s]), 0);
        assert_int_equal(rs_rnic_cm_create(p->rnic, &p->cm[s]), 0);
        p->qp[s] = make_qp(p, s, qos, max_inline);
    }
    assert_int_equal(rs_rnic_listen(p->cm[1], (struct sockaddr *)&addr, sizeof(addr), 8, &p->listener), 0);
    assert_int_equal(rs_rnic_listener_addr(p->listener, &p->listen_addr), 0);
}

static void pair_connect(struct pair *p)
{
    assert_int_equal(rs_rnic_connect(p->qp[0], p->cm[0], (struct sockaddr *)&p->listen_addr,
                                     sizeof(struct sockaddr_in), NULL, 0, WAIT_MS), 0);
    struct rs_rnic_cm_event ev;
    expect_event(p->cm[1], RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    assert_int_equal(rs_rnic_accept(ev.request, p->qp[1], p->cm[1], NULL, 0), 0);
    expect_event(p->cm[0], RS_RNIC_CM_EV_ESTABLISHED, NULL);
    expect_event(p->cm[1], RS_RNIC_CM_EV_ESTABLISHED, NULL);
}

static void pair_close(struct pair *p)
{
    for (int s = 0; s < 2; s++) {
        if (p->qp[s])
            assert_int_equal(rs_rnic_destroy_qp(p->qp[s]), 0);
    }
    if (p->listener)
        rs_rnic_listener_close(p->listener);
    for (int s = 0; s < 2; s++) {
        rs_rnic_cm_destroy(p->cm[s]);
        assert_int_equal(rs_rnic_destroy_cq(p->cq[s]), 0);
    }
    assert_int_equal(rs_rnic_dealloc_pd(p->pd), 0);
    rs_rnic_close(p->rnic);
}

static int poll_one(struct rs_rnic_cq *cq, struct rs_rnic_wc *wc)
{
    uint64_t end = now_ms() + WAIT_MS;
    while (now_ms() < end) {
        int n = rs_rnic_poll_cq(cq, 1, wc);
        if (n)
            return n;
        usleep(200);
    }
    return 0;
}

static void post_one(struct rs_rnic_qp *qp, enum rs_rnic_wr_opcode op, unsigned flags, void *buf, uint32_t len,
                     uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, len, lkey };
    struct rs_rnic_send_wr wr = { .wr_id = wr_id, .opcode = op, .flags = flags | RS_SEND_SIGNALED,
                                  .sg_list = &sge, .num_sge = 1 };
    wr.rdma.remote_addr = raddr;
    wr.rdma.rkey = rkey;
    struct rs_rnic_send_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_send(qp, &wr, &bad), 0);
}

static void expect_ok(struct rs_rnic_cq *cq, uint64_t wr_id)
{
    struct rs_rnic_wc wc;
    assert_int_equal(poll_one(cq, &wc), 1);
    assert_int_equal(wc.wr_id, wr_id);
    assert_int_equal(wc.status, RS_WC_SUCCESS);
}

/* ---- fork --------------------------------------------------------------------------------------------------- */

static void test_fork_safety(void **state)
{
    (void)state;
    need_device();
    /* Kernel >= 5.13 copies pinned pages for the child at fork, so the parent's registrations stay coherent
     * without ibv_fork_init() (libibverbs then reports IBV_FORK_UNNEEDED); older kernels needed
     * RDMAV_FORK_SAFE=1 or ibv_fork_init() before any registration (docs/verbs.md: fork). */
    enum ibv_fork_status fs = ibv_is_fork_initialized();
    print_message("ibv_is_fork_initialized() = %d (0 disabled, 1 enabled, 2 unneeded)\n", (int)fs);
    assert_int_equal(fs, IBV_FORK_UNNEEDED);
    struct pair p;
    pair_open(&p, NULL, 0);
    pair_connect(&p);
    enum { LEN = 3 * 4096 };
    uint8_t *buf = aligned_alloc(4096, LEN), *peer = aligned_alloc(4096, LEN);
    assert_non_null(buf);
    assert_non_null(peer);
    memset(buf, 'A', LEN);
    memset(peer, 0, LEN);
    struct rs_rnic_mr *mr, *pmr;
    assert_int_equal(rs_rnic_reg_mr(p.pd, buf, LEN, RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE, &mr), 0);
    assert_int_equal(rs_rnic_reg_mr(p.pd, peer, LEN, RS_ACCESS_LOCAL_WRITE, &pmr), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child writes its copy of the pages and opens a device of its own; it never touches the parent's
         * RNIC objects. */
        memset(buf, 'C', LEN);
        struct sockaddr_in addr = inet_addr_of(device_addr(), 0);
        struct rs_rnic *mine;
        int r = rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&addr, &mine);
        if (r == 0)
            rs_rnic_close(mine);
        _exit(buf[0] == 'C' && r == 0 ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's own writes after the fork: without copy-on-fork for pinned pages the parent would get fresh
     * copies here while the device kept the old pages. */
    assert_int_equal(buf[0], 'A');
    memset(buf, 'P', LEN);
    post_one(p.qp[1], RS_WR_RDMA_READ, 0, peer, LEN, pmr->lkey, (uint64_t)(uintptr_t)buf, mr->rkey, 1);
    expect_ok(p.cq[1], 1);
    for (int i = 0; i < LEN; i++)
        assert_int_equal(peer[i], 'P');
    memset(peer, 'W', LEN);
    post_one(p.qp[1], RS_WR_RDMA_WRITE, 0, peer, LEN, pmr->lkey, (uint64_t)(uintptr_t)buf, mr->rkey, 2);
    expect_ok(p.cq[1], 2);
    for (int i = 0; i < LEN; i++)
        assert_int_equal(buf[i], 'W');
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
    assert_int_equal(rs_rnic_dereg_mr(pmr), 0);
    free(buf);
    free(peer);
    pair_close(&p);
}

/* ---- connection management ---------------------------------------------------------------------------------- */

static void test_connect_never_blocks_and_times_out(void **state)
{
    (void)state;
    need_device();
    struct pair p;
    pair_open(&p, NULL, 0);
    /* The listener gets the request but nobody answers it: the connect must time out by itself. */
    uint64_t t0 = now_ms();
    assert_int_equal(rs_rnic_connect(p.qp[0], p.cm[0], (struct sockaddr *)&p.listen_addr,
                                     sizeof(struct sockaddr_in), "x", 1, 400), 0);
    assert_true(now_ms() - t0 < 100);
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(p.cm[0], WAIT_MS, &ev), 0);
    uint64_t took = now_ms() - t0;
    print_message("TIMEOUT after %llu ms (asked 400)\n", (unsigned long long)took);
    assert_int_equal(ev.type, RS_RNIC_CM_EV_TIMEOUT);
    assert_ptr_equal(ev.qp, p.qp[0]);
    assert_int_equal(ev.error, -ETIMEDOUT);
    assert_true(took >= 380 && took < 3000);
    assert_int_equal(rs_rnic_qp_state(p.qp[0]), RS_QPS_INIT);
    /* The request the listener saw is still there to refuse. */
    assert_int_equal(get_event(p.cm[1], WAIT_MS, &ev), 0);
    assert_int_equal(ev.type, RS_RNIC_CM_EV_CONNECT_REQUEST);
    assert_int_equal(rs_rnic_reject(ev.request, NULL, 0), 0);
    /* The same QP can try again, and a port without an RDMA listener is refused quickly. */
    struct sockaddr_in nobody = inet_addr_of(device_addr(), 9);
    t0 = now_ms();
    assert_int_equal(rs_rnic_connect(p.qp[0], p.cm[0], (struct sockaddr *)&nobody, sizeof(nobody), NULL, 0,
                                     WAIT_MS), 0);
    assert_int_equal(get_event(p.cm[0], WAIT_MS, &ev), 0);
    assert_true(ev.type == RS_RNIC_CM_EV_UNREACHABLE || ev.type == RS_RNIC_CM_EV_REJECTED);
    assert_true(now_ms() - t0 < 2000);
    /* Private data beyond the 56 bytes rdma_cm leaves is refused up front. */
    uint8_t big[57] = { 0 };
    assert_int_equal(rs_rnic_connect(p.qp[0], p.cm[0], (struct sockaddr *)&p.listen_addr,
                                     sizeof(struct sockaddr_in), big, sizeof(big), WAIT_MS), -EMSGSIZE);
    pair_close(&p);
}

static void test_fds_never_block(void **state)
{
    (void)state;
    need_device();
    struct pair p;
    pair_open(&p, NULL, 0);
    int fl = fcntl(rs_rnic_cm_fd(p.cm[0]), F_GETFL);
    assert_true(fl >= 0 && (fl & O_NONBLOCK));
    uint64_t t0 = now_ms();
    struct rs_rnic_cm_event ev;
    for (int i = 0; i < 100; i++)
        assert_int_equal(rs_rnic_cm_get_event(p.cm[0], &ev), -EAGAIN);
    for (int i = 0; i < 100; i++) {
        rs_rnic_cq_ack_events(p.cq[0]);
        struct rs_rnic_wc wc;
        assert_int_equal(rs_rnic_poll_cq(p.cq[0], 1, &wc), 0);
    }
    assert_true(now_ms() - t0 < 500);
    struct pollfd pfd[2] = { { rs_rnic_cm_fd(p.cm[0]), POLLIN, 0 }, { rs_rnic_cq_fd(p.cq[0]), POLLIN, 0 } };
    assert_int_equal(poll(pfd, 2, 0), 0);
    pair_close(&p);
}

static void test_qos_on_connected_qp(void **state)
{
    (void)state;
    need_device();
    struct rs_rnic_qos qos = { .sl = 0, .tclass = 46 << 2 };
    struct pair p;
    pair_open(&p, &qos, 0);
    struct rs_rnic_qos other = { .sl = 0, .tclass = 10 << 2 };
    assert_int_equal(rs_rnic_qp_set_qos(p.qp[0], &other), 0);
    assert_int_equal(rs_rnic_qp_set_qos(p.qp[0], &qos), 0);
    struct rs_rnic_qos bad = { .sl = 16, .tclass = 0 };
    assert_int_equal(rs_rnic_qp_set_qos(p.qp[0], &bad), -EINVAL);
    pair_connect(&p);
    /* On a connected QP the change drains the send queue and resumes: work posted right after it, and more
     * after that, still completes in order and arrives (the wire suite checks the new DSCP on the frames). */
    static uint8_t buf[2][64];
    struct rs_rnic_mr *mr;
    assert_int_equal(rs_rnic_reg_mr(p.pd, buf, sizeof(buf), RS_ACCESS_LOCAL_WRITE, &mr), 0);
    for (int i = 0; i < 4; i++) {
        struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf[1], 64, mr->lkey };
        struct rs_rnic_recv_wr wr = { .wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
        assert_int_equal(rs_rnic_post_recv(p.qp[1], &wr, NULL), 0);
    }
    post_one(p.qp[0], RS_WR_SEND, 0, buf[0], 8, mr->lkey, 0, 0, 1);
    assert_int_equal(rs_rnic_qp_set_qos(p.qp[0], &other), 0);
    post_one(p.qp[0], RS_WR_SEND, 0, buf[0], 8, mr->lkey, 0, 0, 2);
    assert_int_equal(rs_rnic_qp_set_qos(p.qp[0], &qos), 0);
    post_one(p.qp[0], RS_WR_SEND, 0, buf[0], 8, mr->lkey, 0, 0, 3);
    for (uint64_t i = 1; i <= 3; i++)
        expect_ok(p.cq[0], i);
    for (uint64_t i = 0; i < 3; i++)
        expect_ok(p.cq[1], 100 + i);
    assert_int_equal(rs_rnic_qp_state(p.qp[0]), RS_QPS_RTS);
    /* An orderly close right after a change still reaches the peer as orderly. */
    assert_int_equal(rs_rnic_qp_set_qos(p.qp[0], &other), 0);
    assert_int_equal(rs_rnic_disconnect(p.qp[0]), 0);
    expect_event(p.cm[0], RS_RNIC_CM_EV_DISCONNECTED, NULL);
    expect_event(p.cm[1], RS_RNIC_CM_EV_DISCONNECTED, NULL);
    assert_int_equal(rs_rnic_dereg_mr(mr), 0);
    pair_close(&p);
}

static void test_inline_limits(void **state)
{
    (void)state;
    need_device();
    struct sockaddr_in addr = inet_addr_of(device_addr(), 0);
    struct rs_rnic *rnic;
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&addr, &rnic), 0);
    uint32_t max_inline = rs_rnic_caps(rnic)->max_inline;
    rs_rnic_close(rnic);
    struct pair p;
    pair_open(&p, NULL, max_inline);
    pair_connect(&p);
    static uint8_t src[4096], dst[4096];
    struct rs_rnic_mr *dmr;
    assert_int_equal(rs_rnic_reg_mr(p.pd, dst, sizeof(dst), RS_ACCESS_LOCAL_WRITE, &dmr), 0);
    struct rs_rnic_sge rsge = { (uint64_t)(uintptr_t)dst, sizeof(dst), dmr->lkey };
    struct rs_rnic_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 };
    assert_int_equal(rs_rnic_post_recv(p.qp[1], &rwr, NULL), 0);
    memset(src, 0x5c, max_inline);
    /* Inline needs no registration, and the buffer is free again when the call returns. */
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)src, max_inline, 0 };
    struct rs_rnic_send_wr wr = { .wr_id = 8, .opcode = RS_WR_SEND, .flags = RS_SEND_SIGNALED | RS_SEND_INLINE,
                                  .sg_list = &sge, .num_sge = 1 };
    assert_int_equal(rs_rnic_post_send(p.qp[0], &wr, NULL), 0);
    memset(src, 0, sizeof(src));
    expect_ok(p.cq[0], 8);
    struct rs_rnic_wc wc;
    assert_int_equal(poll_one(p.cq[1], &wc), 1);
    assert_int_equal(wc.status, RS_WC_SUCCESS);
    assert_int_equal(wc.byte_len, max_inline);
    for (uint32_t i = 0; i < max_inline; i++)
        assert_int_equal(dst[i], 0x5c);
    sge.length = max_inline + 1;
    struct rs_rnic_send_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_send(p.qp[0], &wr, &bad), -EINVAL);
    assert_ptr_equal(bad, &wr);
    assert_int_equal(rs_rnic_dereg_mr(dmr), 0);
    pair_close(&p);
}

static void test_orderly_versus_abortive_close(void **state)
{
    (void)state;
    need_device();
    struct pair p;
    pair_open(&p, NULL, 0);
    pair_connect(&p);
    /* Orderly, from the passive side this time: both sides hear DISCONNECTED. */
    assert_int_equal(rs_rnic_disconnect(p.qp[1]), 0);
    struct rs_rnic_cm_event ev;
    expect_event(p.cm[1], RS_RNIC_CM_EV_DISCONNECTED, NULL);
    expect_event(p.cm[0], RS_RNIC_CM_EV_DISCONNECTED, &ev);
    assert_ptr_equal(ev.qp, p.qp[0]);
    /* Abortive: the active side's QP goes away while connected; the peer hears ERROR (a reset), not a close. */
    for (int s = 0; s < 2; s++) {
        assert_int_equal(rs_rnic_destroy_qp(p.qp[s]), 0);
        p.qp[s] = make_qp(&p, s, NULL, 0);
    }
    pair_connect(&p);
    assert_int_equal(rs_rnic_destroy_qp(p.qp[0]), 0);
    p.qp[0] = NULL;
    expect_event(p.cm[1], RS_RNIC_CM_EV_ERROR, &ev);
    assert_ptr_equal(ev.qp, p.qp[1]);
    assert_int_equal(ev.error, -ECONNRESET);
    assert_int_equal(rs_rnic_qp_state(p.qp[1]), RS_QPS_ERROR);
    pair_close(&p);
}

/* ---- XRC --------------------------------------------------------------------------------------------------- */

static void test_xrc_gated(void **state)
{
    (void)state;
    need_device();
    struct sockaddr_in addr = inet_addr_of(device_addr(), 0);
    struct rs_rnic *rnic;
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&addr, &rnic), 0);
    const struct rs_rnic_caps *caps = rs_rnic_caps(rnic);
    struct ibv_device_attr_ex attr;
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_device *dev = NULL;
    for (int i = 0; list && list[i]; i++) {
        if (strcmp(ibv_get_device_name(list[i]), caps->name) == 0)
            dev = list[i];
    }
    assert_non_null(dev);
    struct ibv_context *ctx = ibv_open_device(dev);
    assert_non_null(ctx);
    assert_int_equal(ibv_query_device_ex(ctx, NULL, &attr), 0);
    bool device_xrc = (attr.orig_attr.device_cap_flags & IBV_DEVICE_XRC) != 0;
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    /* The caps say exactly what the device says. */
    assert_int_equal(caps->has_xrc, device_xrc);
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq;
    assert_int_equal(rs_rnic_alloc_pd(rnic, &pd), 0);
    assert_int_equal(rs_rnic_create_cq(rnic, 16, &cq), 0);
    if (!device_xrc) {
        /* Without the capability every XRC call refuses cleanly and nothing is created. */
        struct rs_rnic_xrcd *xrcd = (struct rs_rnic_xrcd *)1;
        assert_int_equal(rs_rnic_xrcd_open(rnic, -1, &xrcd), -EOPNOTSUPP);
        assert_null(xrcd);
        struct rs_rnic_qp_attr qa = { .type = RS_QPT_XRC_INI, .send_cq = cq, .recv_cq = cq, .max_send_wr = 4,
                                      .max_send_sge = 1 };
        struct rs_rnic_qp *qp;
        assert_int_equal(rs_rnic_create_qp(pd, &qa, &qp), -EOPNOTSUPP);
        qa.type = RS_QPT_XRC_TGT;
        assert_int_equal(rs_rnic_create_qp(pd, &qa, &qp), -EOPNOTSUPP);
    }
    assert_int_equal(rs_rnic_destroy_cq(cq), 0);
    assert_int_equal(rs_rnic_dealloc_pd(pd), 0);
    rs_rnic_close(rnic);
}

/* INI QPs on one side send to SRQs of a shared XRC domain through one TGT QP on the other. */
static void test_xrc_end_to_end(void **state)
{
    (void)state;
    need_device();
    struct sockaddr_in addr = inet_addr_of(device_addr(), 0);
    struct rs_rnic *rnic;
    assert_int_equal(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&addr, &rnic), 0);
    bool xrc = rs_rnic_caps(rnic)->has_xrc;
    char name[64];
    snprintf(name, sizeof(name), "%s", rs_rnic_caps(rnic)->name);
    if (!xrc) {
        rs_rnic_close(rnic);
        print_message("skipped: %s has no IBV_DEVICE_XRC (rdma_rxe in Linux 6.1 has none)\n", name);
        skip();
    }
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq[2];
    struct rs_rnic_cm *cm[2];
    struct rs_rnic_xrcd *xrcd;
    assert_int_equal(rs_rnic_alloc_pd(rnic, &pd), 0);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(rs_rnic_create_cq(rnic, 64, &cq[s]), 0);
        assert_int_equal(rs_rnic_cm_create(rnic, &cm[s]), 0);
    }
    assert_int_equal(rs_rnic_xrcd_open(rnic, -1, &xrcd), 0);
    struct rs_rnic_srq *srq[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(rs_rnic_create_xsrq(pd, xrcd, cq[1], 16, 1, &srq[i]), 0);
    assert_int_not_equal(rs_rnic_srq_num(srq[0]), rs_rnic_srq_num(srq[1]));
    struct rs_rnic_qp_attr ia = { .type = RS_QPT_XRC_INI, .send_cq = cq[0], .recv_cq = cq[0], .max_send_wr = 16,
                                  .max_send_sge = 1 };
    struct rs_rnic_qp_attr ta = { .type = RS_QPT_XRC_TGT, .send_cq = cq[1], .recv_cq = cq[1], .xrcd = xrcd };
    struct rs_rnic_qp *ini, *tgt;
    assert_int_equal(rs_rnic_create_qp(pd, &ia, &ini), 0);
    assert_int_equal(rs_rnic_create_qp(pd, &ta, &tgt), 0);
    struct rs_rnic_listener *l;
    assert_int_equal(rs_rnic_listen(cm[1], (struct sockaddr *)&addr, sizeof(addr), 4, &l), 0);
    struct sockaddr_storage la;
    assert_int_equal(rs_rnic_listener_addr(l, &la), 0);
    assert_int_equal(rs_rnic_connect(ini, cm[0], (struct sockaddr *)&la, sizeof(struct sockaddr_in), NULL, 0,
                                     WAIT_MS), 0);
    struct rs_rnic_cm_event ev;
    expect_event(cm[1], RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    assert_int_equal(rs_rnic_accept(ev.request, tgt, cm[1], NULL, 0), 0);
    expect_event(cm[0], RS_RNIC_CM_EV_ESTABLISHED, NULL);
    expect_event(cm[1], RS_RNIC_CM_EV_ESTABLISHED, NULL);
    static uint8_t rbuf[2][64], sbuf[8];
    struct rs_rnic_mr *rmr, *smr;
    assert_int_equal(rs_rnic_reg_mr(pd, rbuf, sizeof(rbuf), RS_ACCESS_LOCAL_WRITE, &rmr), 0);
    assert_int_equal(rs_rnic_reg_mr(pd, sbuf, sizeof(sbuf), 0, &smr), 0);
    for (int i = 0; i < 2; i++) {
        struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)rbuf[i], 64, rmr->lkey };
        struct rs_rnic_recv_wr wr = { .wr_id = 10 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
        assert_int_equal(rs_rnic_post_srq_recv(srq[i], &wr, NULL), 0);
    }
    /* One INI QP reaches either SRQ by number. */
    for (int i = 1; i >= 0; i--) {
        sbuf[0] = (uint8_t)('a' + i);
        struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)sbuf, 1, smr->lkey };
        struct rs_rnic_send_wr wr = { .wr_id = 20 + (uint64_t)i, .opcode = RS_WR_SEND, .flags = RS_SEND_SIGNALED,
                                      .sg_list = &sge, .num_sge = 1, .xrc_remote_srq_num = rs_rnic_srq_num(srq[i]) };
        assert_int_equal(rs_rnic_post_send(ini, &wr, NULL), 0);
        expect_ok(cq[0], 20 + (uint64_t)i);
        struct rs_rnic_wc wc;
        assert_int_equal(poll_one(cq[1], &wc), 1);
        assert_int_equal(wc.status, RS_WC_SUCCESS);
        assert_int_equal(wc.wr_id, 10 + (uint64_t)i);
        assert_int_equal(rbuf[i][0], 'a' + i);
    }
    assert_int_equal(rs_rnic_destroy_qp(ini), 0);
    assert_int_equal(rs_rnic_destroy_qp(tgt), 0);
    rs_rnic_listener_close(l);
    for (int i = 0; i < 2; i++)
        assert_int_equal(rs_rnic_destroy_srq(srq[i]), 0);
    assert_int_equal(rs_rnic_xrcd_close(xrcd), 0);
    assert_int_equal(rs_rnic_dereg_mr(rmr), 0);
    assert_int_equal(rs_rnic_dereg_mr(smr), 0);
    for (int s = 0; s < 2; s++) {
        rs_rnic_cm_destroy(cm[s]);
        assert_int_equal(rs_rnic_destroy_cq(cq[s]), 0);
    }
    assert_int_equal(rs_rnic_dealloc_pd(pd), 0);
    rs_rnic_close(rnic);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_device_is_enodev_fast),
        cmocka_unit_test(test_auto_falls_back_to_soft),
        cmocka_unit_test(test_device_follows_address),
        cmocka_unit_test(test_stag_key_bits),
        cmocka_unit_test(test_fork_safety),
        cmocka_unit_test(test_connect_never_blocks_and_times_out),
        cmocka_unit_test(test_fds_never_block),
        cmocka_unit_test(test_qos_on_connected_qp),
        cmocka_unit_test(test_inline_limits),
        cmocka_unit_test(test_orderly_versus_abortive_close),
        cmocka_unit_test(test_xrc_gated),
        cmocka_unit_test(test_xrc_end_to_end),
    };
    return cmocka_run_group_tests_name("rnic_verbs_only", tests, NULL, NULL);
}
