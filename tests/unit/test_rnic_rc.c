/*
 * RC conformance of an RNIC provider, written against rnic.h only: the same binary runs against the soft RNIC
 * (iWARP over kernel TCP, the default) and against the verbs provider (RS_RNIC_KIND=verbs, with RS_RNIC_ADDR the
 * device's IP address, in a VM). Every test uses real connections; nothing is mocked.
 *
 * What is checked: connection setup with private data both ways, rejection with private data, connecting to a
 * closed port and to a peer that never answers, the soft RNIC's own port space and listener greeting (a kernel
 * program on the mapped TCP port never receives a byte), SO_REUSEPORT listeners, CLOEXEC sockets,
 * SEND/RECV from 1 byte to 16 MiB with data and order checks, RDMA
 * WRITE and READ with guard canaries around every buffer, SEND_WITH_INVALIDATE followed by a refused WRITE,
 * protection errors (both QPs in ERROR, outstanding work flushed, nothing written outside the region), orderly
 * disconnect, a peer process killed, CQ overflow, many READs in flight, and a READ response interleaved with
 * SENDs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "rnic/rnic.h"
#include "rnic_test_util.h"

#define GUARD 64
#define CANARY 0xa5
#define WAIT_MS 5000

static int rnic_kind(void)
{
    const char *k = getenv("RS_RNIC_KIND");
    return k && strcmp(k, "verbs") == 0 ? RS_RNIC_KIND_VERBS : RS_RNIC_KIND_SOFT;
}

static const char *rnic_addr(void)
{
    const char *a = getenv("RS_RNIC_ADDR");
    return a && *a ? a : "127.0.0.1";
}

static struct sockaddr_in local_sockaddr(uint16_t port)
{
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    assert_int_equal(inet_pton(AF_INET, rnic_addr(), &sin.sin_addr), 1);
    return sin;
}

/*
 * The soft RNIC's port space (docs/rnic-rc.md): RDMA port P is TCP port (P + offset) mod 65536, the offset from
 * RDMASOCK_SOFT_PORT_OFFSET (decimal 0..65535, default 16384, anything else: the default). Mirrored here rather
 * than asked of the library, so the tests check the documented rule.
 */
static uint16_t soft_port_offset(void)
{
    const char *v = getenv("RDMASOCK_SOFT_PORT_OFFSET");
    if (v && *v >= '0' && *v <= '9') {
        char *end;
        unsigned long n = strtoul(v, &end, 10);
        if (*end == '\0' && n <= 65535)
            return (uint16_t)n;
    }
    return 16384;
}

static uint16_t tcp_port_of(uint16_t rdma_port) { return (uint16_t)(rdma_port + soft_port_offset()); }
static uint16_t rdma_port_of(uint16_t tcp_port) { return (uint16_t)(tcp_port - soft_port_offset()); }
static uint16_t sin_port(const void *sa) { return ntohs(((const struct sockaddr_in *)sa)->sin_port); }

/* A plain kernel TCP listener on port (0: any); *port_out gets its TCP port. */
static int kernel_listener(uint16_t port, uint16_t *port_out)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    struct sockaddr_in sin = local_sockaddr(port);
    if (bind(s, (struct sockaddr *)&sin, sizeof(sin)) != 0 || listen(s, 8) != 0) {
        close(s);
        return -1;
    }
    socklen_t len = sizeof(sin);
    assert_int_equal(getsockname(s, (struct sockaddr *)&sin, &len), 0);
    *port_out = ntohs(sin.sin_port);
    return s;
}

/* A kernel TCP listener on the TCP port of some RDMA port: a program that is not an RDMA peer but happens to sit
 * where the soft RNIC's connection goes. Returns its fd; *rdma_port is the RDMA port that leads there. */
static int stranger_listener(uint16_t *rdma_port)
{
    for (;;) {
        uint16_t tcp;
        int s = kernel_listener(0, &tcp);
        assert_true(s >= 0);
        *rdma_port = rdma_port_of(tcp);
        if (*rdma_port != 0)
            return s;
        close(s);       /* the one TCP port that is RDMA port 0: nobody can connect there */
    }
}

/* ---- buffers with guard canaries ---- */

struct gbuf {
    uint8_t *raw;           /* GUARD | data (len) | GUARD */
    uint8_t *data;
    size_t len;
    struct rs_rnic_mr *mr;
};

static void gbuf_init(struct gbuf *b, struct rs_rnic_pd *pd, size_t len, unsigned access, uint8_t fill)
{
    b->len = len;
    b->raw = malloc(len + 2 * GUARD);
    assert_non_null(b->raw);
    memset(b->raw, CANARY, len + 2 * GUARD);
    b->data = b->raw + GUARD;
    memset(b->data, fill, len);
    assert_int_equal(rs_rnic_reg_mr(pd, b->data, len, access, &b->mr), 0);
}

static void gbuf_check_guards(const struct gbuf *b)
{
    for (size_t i = 0; i < GUARD; i++) {
        assert_int_equal(b->raw[i], CANARY);
        assert_int_equal(b->raw[GUARD + b->len + i], CANARY);
    }
}

static void gbuf_fini(struct gbuf *b)
{
    gbuf_check_guards(b);
    if (b->mr)
        assert_int_equal(rs_rnic_dereg_mr(b->mr), 0);
    free(b->raw);
    memset(b, 0, sizeof(*b));
}

/* ---- connection fixture ---- */

struct side {
    struct rs_rnic_cq *cq;
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
};

struct fixture {
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    struct rs_rnic_listener *listener;
    struct sockaddr_storage listen_addr;
    struct side a, p;       /* active, passive */
};

static int wait_fd(int fd, int timeout_ms)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    return poll(&pfd, 1, timeout_ms);
}

/* Next CM event within timeout_ms, or -ETIMEDOUT. */
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
        wait_fd(rs_rnic_cm_fd(cm), (int)left);
    }
}

static void expect_event(struct rs_rnic_cm *cm, enum rs_rnic_cm_event_type type, struct rs_rnic_cm_event *ev)
{
    struct rs_rnic_cm_event local;
    if (!ev)
        ev = &local;
    assert_int_equal(get_event(cm, WAIT_MS, ev), 0);
    if (ev->type != type)
        fail_msg("expected CM event %d, got %d (error %d)", (int)type, (int)ev->type, ev->error);
}

/* Polls until n completions arrived (or timeout); returns how many. */
static int poll_n(struct rs_rnic_cq *cq, struct rs_rnic_wc *wc, int n, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int got = 0;
    while (got < n) {
        int r = rs_rnic_poll_cq(cq, n - got, wc + got);
        if (r < 0)
            return r;
        got += r;
        if (got == n)
            break;
        if (now_ms() > deadline)
            break;
        if (r == 0) {
            assert_int_equal(rs_rnic_cq_arm(cq, false), 0);
            r = rs_rnic_poll_cq(cq, n - got, wc + got);
            if (r < 0)
                return r;
            got += r;
            if (got < n) {
                wait_fd(rs_rnic_cq_fd(cq), 50);
                rs_rnic_cq_ack_events(cq);
            }
        }
    }
    return got;
}

static void wait_qp_state(struct rs_rnic_qp *qp, enum rs_rnic_qp_state want, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    while (rs_rnic_qp_state(qp) != want) {
        if (now_ms() > deadline)
            fail_msg("QP state %d, expected %d", (int)rs_rnic_qp_state(qp), (int)want);
        usleep(1000);
    }
}

static void create_side(struct fixture *f, struct side *s, uint32_t cq_depth, uint32_t wr)
{
    assert_int_equal(rs_rnic_create_cq(f->rnic, cq_depth, &s->cq), 0);
    assert_int_equal(rs_rnic_cm_create(f->rnic, &s->cm), 0);
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = s->cq, .recv_cq = s->cq, .max_send_wr = wr, .max_recv_wr = wr,
        .max_send_sge = 4, .max_recv_sge = 4, .max_inline = 64,
    };
    assert_int_equal(rs_rnic_create_qp(f->pd, &attr, &s->qp), 0);
    assert_int_equal(rs_rnic_qp_state(s->qp), RS_QPS_INIT);
}

static void destroy_side(struct side *s)
{
    if (s->qp)
        assert_int_equal(rs_rnic_destroy_qp(s->qp), 0);
    if (s->cm)
        rs_rnic_cm_destroy(s->cm);
    if (s->cq)
        assert_int_equal(rs_rnic_destroy_cq(s->cq), 0);
    memset(s, 0, sizeof(*s));
}

static int fixture_setup_depth(void **state, uint32_t cq_depth_passive)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    struct sockaddr_in bind_addr = local_sockaddr(0);
    int r = rs_rnic_open(rnic_kind(), (struct sockaddr *)&bind_addr, &f->rnic);
    if (r != 0) {
        free(f);
        fail_msg("rs_rnic_open(kind %d) failed: %d", rnic_kind(), r);
    }
    assert_int_equal(rs_rnic_alloc_pd(f->rnic, &f->pd), 0);
    create_side(f, &f->a, 4096, 512);
    create_side(f, &f->p, cq_depth_passive, 512);
    assert_int_equal(rs_rnic_listen(f->p.cm, (struct sockaddr *)&bind_addr, sizeof(bind_addr), 16, &f->listener), 0);
    assert_int_equal(rs_rnic_listener_addr(f->listener, &f->listen_addr), 0);
    *state = f;
    return 0;
}

static int fixture_setup(void **state)
{
    return fixture_setup_depth(state, 4096);
}

static int fixture_teardown(void **state)
{
    struct fixture *f = *state;
    destroy_side(&f->a);
    destroy_side(&f->p);
    if (f->listener)
        rs_rnic_listener_close(f->listener);
    assert_int_equal(rs_rnic_dealloc_pd(f->pd), 0);
    rs_rnic_close(f->rnic);
    free(f);
    return 0;
}

/* Connects a to p through the listener; checks private data both ways when given. */
static void connect_pair(struct fixture *f, const void *req_pd, uint32_t req_len, const void *rep_pd, uint32_t rep_len)
{
    struct sockaddr_storage a_local, p_local;
    assert_int_equal(rs_rnic_qp_local_addr(f->a.qp, &a_local), -ENOTCONN);
    assert_int_equal(rs_rnic_connect(f->a.qp, f->a.cm, (struct sockaddr *)&f->listen_addr,
                                     sizeof(struct sockaddr_in), req_pd, req_len, WAIT_MS),
                     0);
    struct rs_rnic_cm_event ev;
    expect_event(f->p.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    assert_ptr_equal(ev.listener, f->listener);
    assert_non_null(ev.request);
    /* rdma_cm may pad private data; at least what was sent arrives unchanged. */
    assert_true(ev.private_data_len >= req_len);
    if (req_len)
        assert_memory_equal(ev.private_data, req_pd, req_len);
    struct sockaddr_in req_peer;
    memcpy(&req_peer, &ev.peer, sizeof(req_peer));
    assert_int_equal(rs_rnic_accept(ev.request, f->p.qp, f->p.cm, rep_pd, rep_len), 0);
    expect_event(f->a.cm, RS_RNIC_CM_EV_ESTABLISHED, &ev);
    assert_ptr_equal(ev.qp, f->a.qp);
    assert_true(ev.private_data_len >= rep_len);
    if (rep_len)
        assert_memory_equal(ev.private_data, rep_pd, rep_len);
    expect_event(f->p.cm, RS_RNIC_CM_EV_ESTABLISHED, &ev);
    assert_ptr_equal(ev.qp, f->p.qp);
    assert_int_equal(rs_rnic_qp_state(f->a.qp), RS_QPS_RTS);
    assert_int_equal(rs_rnic_qp_state(f->p.qp), RS_QPS_RTS);
    /* Each end's local address is what the other end calls it: the four-tuple getsockname/getpeername report. */
    assert_int_equal(rs_rnic_qp_local_addr(f->a.qp, &a_local), 0);
    const struct sockaddr_in *a4 = (const struct sockaddr_in *)&a_local;
    assert_int_equal(a4->sin_family, AF_INET);
    assert_int_equal(a4->sin_port, req_peer.sin_port);
    assert_int_equal(a4->sin_addr.s_addr, req_peer.sin_addr.s_addr);
    assert_int_equal(rs_rnic_qp_local_addr(f->p.qp, &p_local), 0);
    const struct sockaddr_in *p4 = (const struct sockaddr_in *)&p_local;
    const struct sockaddr_in *l4 = (const struct sockaddr_in *)&f->listen_addr;
    assert_int_equal(p4->sin_family, AF_INET);
    assert_int_equal(p4->sin_port, l4->sin_port);
    assert_int_not_equal(p4->sin_addr.s_addr, htonl(INADDR_ANY));
}

static void post_recv(struct rs_rnic_qp *qp, uint64_t wr_id, struct gbuf *b, size_t off, size_t len)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)(b->data + off), (uint32_t)len, b->mr->lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_recv(qp, &wr, &bad), 0);
}

static void post_send_op(struct rs_rnic_qp *qp, uint64_t wr_id, enum rs_rnic_wr_opcode op, unsigned flags,
                         struct gbuf *b, size_t off, size_t len, uint64_t raddr, uint32_t rkey)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)(b->data + off), (uint32_t)len, b->mr->lkey };
    struct rs_rnic_send_wr wr = {
        .wr_id = wr_id, .opcode = op, .flags = flags | RS_SEND_SIGNALED, .sg_list = &sge, .num_sge = 1,
    };
    wr.rdma.remote_addr = raddr;
    wr.rdma.rkey = rkey;
    wr.invalidate_rkey = rkey;
    struct rs_rnic_send_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_send(qp, &wr, &bad), 0);
}

static void expect_wc(struct rs_rnic_cq *cq, uint64_t wr_id, enum rs_rnic_wc_opcode op,
                      enum rs_rnic_wc_status status, struct rs_rnic_wc *out)
{
    struct rs_rnic_wc wc;
    int n = poll_n(cq, &wc, 1, WAIT_MS);
    assert_int_equal(n, 1);
    if (wc.wr_id != wr_id || wc.status != status)
        fail_msg("completion wr_id %llu status %d opcode %d, expected wr_id %llu status %d",
                 (unsigned long long)wc.wr_id, (int)wc.status, (int)wc.opcode, (unsigned long long)wr_id,
                 (int)status);
    if (status == RS_WC_SUCCESS)
        assert_int_equal(wc.opcode, op);
    if (out)
        *out = wc;
}

/* ---- connection management ---- */

static void test_connect_private_data(void **state)
{
    struct fixture *f = *state;
    const struct rs_rnic_caps *caps = rs_rnic_caps(f->rnic);
    uint8_t req[256], rep[256];
    uint32_t req_len = caps->max_connect_private_data < 56 ? caps->max_connect_private_data : 56;
    uint32_t rep_len = caps->max_accept_private_data < 196 ? caps->max_accept_private_data : 196;
    fill_pattern(req, req_len, 1);
    fill_pattern(rep, rep_len, 2);
    connect_pair(f, req, req_len, rep, rep_len);
    /* Too much private data is refused up front. */
    struct side extra;
    create_side(f, &extra, 16, 4);
    uint8_t big[1024] = { 0 };
    assert_int_equal(rs_rnic_connect(extra.qp, extra.cm, (struct sockaddr *)&f->listen_addr,
                                     sizeof(struct sockaddr_in), big, caps->max_connect_private_data + 1, WAIT_MS),
                     -EMSGSIZE);
    destroy_side(&extra);
}

static void test_reject_private_data(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(rs_rnic_connect(f->a.qp, f->a.cm, (struct sockaddr *)&f->listen_addr,
                                     sizeof(struct sockaddr_in), "hello?", 6, WAIT_MS),
                     0);
    struct rs_rnic_cm_event ev;
    expect_event(f->p.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    assert_memory_equal(ev.private_data, "hello?", 6);
    assert_int_equal(rs_rnic_reject(ev.request, "go away: busy", 13), 0);
    expect_event(f->a.cm, RS_RNIC_CM_EV_REJECTED, &ev);
    assert_ptr_equal(ev.qp, f->a.qp);
    assert_true(ev.private_data_len >= 13);
    assert_memory_equal(ev.private_data, "go away: busy", 13);
    /* The listener keeps working after a reject. */
    struct side again;
    create_side(f, &again, 16, 4);
    assert_int_equal(rs_rnic_connect(again.qp, again.cm, (struct sockaddr *)&f->listen_addr,
                                     sizeof(struct sockaddr_in), NULL, 0, WAIT_MS),
                     0);
    expect_event(f->p.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    assert_int_equal(rs_rnic_accept(ev.request, f->p.qp, f->p.cm, NULL, 0), 0);
    expect_event(again.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
    expect_event(f->p.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
    destroy_side(&again);
}

/* An RDMA port with nobody listening (on the soft RNIC: one whose TCP port was just free). */
static uint16_t closed_port(void)
{
    for (;;) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(s >= 0);
        struct sockaddr_in sin = local_sockaddr(0);
        assert_int_equal(bind(s, (struct sockaddr *)&sin, sizeof(sin)), 0);
        socklen_t len = sizeof(sin);
        assert_int_equal(getsockname(s, (struct sockaddr *)&sin, &len), 0);
        close(s);
        uint16_t port = ntohs(sin.sin_port);
        if (rnic_kind() != RS_RNIC_KIND_SOFT)
            return port;
        if (rdma_port_of(port) != 0)
            return rdma_port_of(port);
    }
}

static void test_connect_closed_port(void **state)
{
    struct fixture *f = *state;
    struct sockaddr_in dst = local_sockaddr(closed_port());
    uint64_t t0 = now_ms();
    assert_int_equal(rs_rnic_connect(f->a.qp, f->a.cm, (struct sockaddr *)&dst, sizeof(dst), NULL, 0, WAIT_MS), 0);
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(f->a.cm, WAIT_MS, &ev), 0);
    uint64_t took = now_ms() - t0;
    assert_ptr_equal(ev.qp, f->a.qp);
    if (rnic_kind() == RS_RNIC_KIND_SOFT) {
        /* Refused by TCP at once: what rdma_cm reports for iWARP too, and what lets a caller fall back quickly. */
        assert_int_equal(ev.type, RS_RNIC_CM_EV_REJECTED);
        assert_int_equal(ev.error, -ECONNREFUSED);
        assert_int_equal(sin_port(&ev.peer), ntohs(dst.sin_port));
        assert_true(took < 100);
        return;
    }
    assert_true(ev.type == RS_RNIC_CM_EV_REJECTED || ev.type == RS_RNIC_CM_EV_UNREACHABLE);
    assert_true(took < 2000);
}

static void test_connect_timeout(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() == RS_RNIC_KIND_SOFT) {
        /* A soft RNIC listener whose application never answers the request: the Reply never comes. (A kernel
         * listener that says nothing is not an RDMA peer at all: test_connect_not_rdma_peer, UNREACHABLE.) */
        uint64_t t0 = now_ms();
        assert_int_equal(rs_rnic_connect(f->a.qp, f->a.cm, (struct sockaddr *)&f->listen_addr,
                                         sizeof(struct sockaddr_in), NULL, 0, 300),
                         0);
        assert_true(now_ms() - t0 < 200);
        struct rs_rnic_cm_event req, ev;
        expect_event(f->p.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &req);
        assert_int_equal(get_event(f->a.cm, WAIT_MS, &ev), 0);
        uint64_t took = now_ms() - t0;
        assert_int_equal(ev.type, RS_RNIC_CM_EV_TIMEOUT);
        assert_int_equal(ev.error, -ETIMEDOUT);
        assert_true(took >= 250 && took < 2000);
        assert_int_equal(rs_rnic_reject(req.request, NULL, 0), 0);
        return;
    }
    /* A kernel TCP listener that completes the handshake but never says a word. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s >= 0);
    struct sockaddr_in sin = local_sockaddr(0);
    assert_int_equal(bind(s, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(s, 4), 0);
    socklen_t len = sizeof(sin);
    assert_int_equal(getsockname(s, (struct sockaddr *)&sin, &len), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(rs_rnic_connect(f->a.qp, f->a.cm, (struct sockaddr *)&sin, sizeof(sin), NULL, 0, 300), 0);
    /* The call itself never waits for the network. */
    assert_true(now_ms() - t0 < 200);
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(f->a.cm, WAIT_MS, &ev), 0);
    uint64_t took = now_ms() - t0;
    close(s);
    if (ev.type != RS_RNIC_CM_EV_TIMEOUT) {
        /* InfiniBand/RoCE connection managers never reach a kernel TCP port: no RDMA listener, refused at once. */
        assert_true(ev.type == RS_RNIC_CM_EV_REJECTED || ev.type == RS_RNIC_CM_EV_UNREACHABLE);
        return;
    }
    assert_int_equal(ev.type, RS_RNIC_CM_EV_TIMEOUT);
    assert_int_equal(ev.error, -ETIMEDOUT);
    assert_true(took >= 250 && took < 2000);
}

/*
 * A kernel TCP server that is not an RDMA peer, on the TCP port an RDMA connect leads to. It accepts one
 * connection, behaves as told, then reads until EOF and records what it received: the soft RNIC must never send
 * such a program a byte, and must close with a FIN (EOF), not a reset.
 */
enum stranger_mode {
    STRANGER_HTTP,          /* waits for a request (silent), would answer with an HTTP error */
    STRANGER_BANNER,        /* speaks first, like an SMTP or SSH server */
    STRANGER_BAD_VERSION,   /* our greeting with another version byte */
    STRANGER_CLOSE,         /* closes at once (EOF before any greeting) */
    STRANGER_RESET,         /* resets at once */
};

struct stranger {
    int listen_fd;
    enum stranger_mode mode;
    size_t received;        /* bytes it read from us */
    bool eof;               /* its read ended with EOF (not an error, not its timeout) */
    bool accepted;
};

static void *stranger_server(void *arg)
{
    struct stranger *st = arg;
    int c = accept(st->listen_fd, NULL, NULL);
    if (c < 0)
        return NULL;
    st->accepted = true;
    static const char banner[] = "220 mail.example.org ESMTP ready\r\n";
    static const char not_ours[] = "RDMASOCK SOFTRC\x02";
    switch (st->mode) {
    case STRANGER_BANNER:
        if (write(c, banner, sizeof(banner) - 1) < 0)
            perror("stranger banner");
        break;
    case STRANGER_BAD_VERSION:
        if (write(c, not_ours, 16) < 0)
            perror("stranger greeting");
        break;
    case STRANGER_CLOSE:
        close(c);
        return NULL;
    case STRANGER_RESET: {
        struct linger lg = { 1, 0 };
        setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(c);
        return NULL;
    }
    default:
        break;
    }
    char buf[256];
    for (;;) {
        if (wait_fd(c, WAIT_MS) <= 0)
            break;
        ssize_t r = read(c, buf, sizeof(buf));
        if (r <= 0) {
            st->eof = r == 0;
            break;
        }
        st->received += (size_t)r;
        static const char reply[] = "HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        if (st->mode == STRANGER_HTTP && write(c, reply, sizeof(reply) - 1) < 0)
            perror("stranger http");
    }
    close(c);
    return NULL;
}

/* Connects to a stranger in mode; checks the UNREACHABLE event and returns how long it took. */
static uint64_t connect_to_stranger(struct fixture *f, struct side *s, enum stranger_mode mode, uint32_t timeout_ms)
{
    uint16_t rdma_port;
    struct stranger st = { .mode = mode };
    st.listen_fd = stranger_listener(&rdma_port);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stranger_server, &st), 0);
    struct sockaddr_in dst = local_sockaddr(rdma_port);
    uint64_t t0 = now_ms();
    assert_int_equal(rs_rnic_connect(s->qp, s->cm, (struct sockaddr *)&dst, sizeof(dst), "hi", 2, timeout_ms), 0);
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(s->cm, WAIT_MS, &ev), 0);
    uint64_t took = now_ms() - t0;
    if (ev.type != RS_RNIC_CM_EV_UNREACHABLE || ev.error != -EHOSTUNREACH)
        fail_msg("stranger mode %d: event %d error %d, expected UNREACHABLE -EHOSTUNREACH", (int)mode, (int)ev.type,
                 ev.error);
    assert_ptr_equal(ev.qp, s->qp);
    assert_int_equal(sin_port(&ev.peer), rdma_port);
    pthread_join(t, NULL);
    close(st.listen_fd);
    assert_true(st.accepted);
    if (mode != STRANGER_CLOSE && mode != STRANGER_RESET) {
        if (st.received != 0 || !st.eof)
            fail_msg("stranger mode %d received %zu bytes, eof %d", (int)mode, st.received, (int)st.eof);
    }
    wait_qp_state(s->qp, RS_QPS_ERROR, WAIT_MS);
    (void)f;
    return took;
}

static void test_connect_not_rdma_peer(void **state)
{
    struct fixture *f = *state;
    /* rdma_cm never opens a kernel TCP connection: on verbs the server below would wait in accept(2) forever
     * (test_connect_closed_port covers "nobody listens" there). */
    if (rnic_kind() != RS_RNIC_KIND_SOFT)
        skip();
    /* An HTTP server waits for a request: without the greeting we never send one, and give up after about 1 s
     * (the greeting window), well before the 3 s connect timeout. */
    uint64_t took = connect_to_stranger(f, &f->a, STRANGER_HTTP, 3000);
    assert_true(took >= 900 && took < 1500);
    /* A connect timeout shorter than the greeting window bounds it. */
    struct side s;
    create_side(f, &s, 16, 4);
    took = connect_to_stranger(f, &s, STRANGER_HTTP, 300);
    assert_true(took >= 250 && took < 900);
    destroy_side(&s);
}

/* Strangers that answer: a banner, a greeting of another version, EOF, a reset. All end UNREACHABLE at once, and
 * none received a byte. */
static void test_stranger_never_gets_a_byte(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() != RS_RNIC_KIND_SOFT)
        skip();
    static const enum stranger_mode modes[] = { STRANGER_BANNER, STRANGER_BAD_VERSION, STRANGER_CLOSE,
                                                STRANGER_RESET };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        struct side s;
        create_side(f, &s, 16, 4);
        uint64_t took = connect_to_stranger(f, &s, modes[i], WAIT_MS);
        if (took >= 500)
            fail_msg("stranger mode %d: UNREACHABLE took %llu ms", (int)modes[i], (unsigned long long)took);
        destroy_side(&s);
    }
    /* The listener of the fixture saw none of this. */
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(f->p.cm, 50, &ev), -ETIMEDOUT);
}

/* ---- the soft RNIC's port space ---- */

/* An RDMA listener on port P works while a kernel listener holds TCP port P: they are different port spaces. */
static void test_port_space_coexists_with_kernel(void **state)
{
    struct fixture *f = *state;
    /* Offset 0 puts RDMA ports on the TCP ports of the same number: no separate port space to test. */
    if (rnic_kind() != RS_RNIC_KIND_SOFT || soft_port_offset() == 0)
        skip();
    int kfd = -1;
    uint16_t port = 0;
    struct rs_rnic_listener *l = NULL;
    for (int tries = 0; tries < 20 && !l; tries++) {
        kfd = kernel_listener(0, &port);
        assert_true(kfd >= 0);
        struct sockaddr_in sin = local_sockaddr(port);
        int r = rs_rnic_listen(f->p.cm, (struct sockaddr *)&sin, sizeof(sin), 4, &l);
        if (r != 0) {
            /* P + offset taken by someone else, or the port with no TCP port: try another P. */
            assert_true(r == -EADDRINUSE || r == -EADDRNOTAVAIL);
            close(kfd);
            l = NULL;
        }
    }
    assert_non_null(l);
    struct sockaddr_storage la;
    assert_int_equal(rs_rnic_listener_addr(l, &la), 0);
    assert_int_equal(sin_port(&la), port);
    /* The kernel listener really holds TCP port P. */
    uint16_t again;
    assert_int_equal(kernel_listener(port, &again), -1);

    struct sockaddr_in dst = local_sockaddr(port);
    assert_int_equal(rs_rnic_connect(f->a.qp, f->a.cm, (struct sockaddr *)&dst, sizeof(dst), NULL, 0, WAIT_MS), 0);
    struct rs_rnic_cm_event ev;
    expect_event(f->p.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    assert_ptr_equal(ev.listener, l);
    assert_int_equal(rs_rnic_accept(ev.request, f->p.qp, f->p.cm, NULL, 0), 0);
    expect_event(f->a.cm, RS_RNIC_CM_EV_ESTABLISHED, &ev);
    assert_int_equal(sin_port(&ev.peer), port);     /* the peer is named in the RDMA port space */
    expect_event(f->p.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
    /* Nothing reached the kernel listener; a plain TCP client still does. */
    assert_int_equal(wait_fd(kfd, 0), 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c >= 0);
    assert_int_equal(connect(c, (struct sockaddr *)&dst, sizeof(dst)), 0);
    int a = accept(kfd, NULL, NULL);
    assert_true(a >= 0);
    close(a);
    close(c);
    close(kfd);
    rs_rnic_listener_close(l);
}

/* Listen on port 0: the reported port is an RDMA port (its TCP port is P + offset) and connects; the listener
 * greets a raw TCP client with the 16 bytes of docs/wire-formats.md §5. Ports without a TCP port are refused. */
static void test_port_space_listen_any(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() != RS_RNIC_KIND_SOFT)
        skip();
    uint16_t port = sin_port(&f->listen_addr);
    assert_int_not_equal(port, 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c >= 0);
    struct sockaddr_in tcp = local_sockaddr(tcp_port_of(port));
    assert_int_equal(connect(c, (struct sockaddr *)&tcp, sizeof(tcp)), 0);
    uint8_t greeting[32];
    size_t got = 0;
    while (got < 16 && wait_fd(c, WAIT_MS) > 0) {
        ssize_t r = read(c, greeting + got, sizeof(greeting) - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    assert_int_equal(got, 16);
    assert_memory_equal(greeting, "RDMASOCK SOFTRC\x01", 16);
    close(c);
    connect_pair(f, NULL, 0, NULL, 0);

    uint16_t no_tcp_port = rdma_port_of(0);
    struct sockaddr_in bad = local_sockaddr(no_tcp_port);
    struct rs_rnic_listener *l = NULL;
    if (no_tcp_port != 0)
        assert_int_equal(rs_rnic_listen(f->p.cm, (struct sockaddr *)&bad, sizeof(bad), 4, &l), -EADDRNOTAVAIL);
    struct side s;
    create_side(f, &s, 16, 4);
    assert_int_equal(rs_rnic_connect(s.qp, s.cm, (struct sockaddr *)&bad, sizeof(bad), NULL, 0, WAIT_MS),
                     -EADDRNOTAVAIL);
    bad = local_sockaddr(0);
    assert_int_equal(rs_rnic_connect(s.qp, s.cm, (struct sockaddr *)&bad, sizeof(bad), NULL, 0, WAIT_MS),
                     -EADDRNOTAVAIL);
    /* Refused before anything started: the QP can still connect. */
    assert_int_equal(rs_rnic_qp_state(s.qp), RS_QPS_INIT);
    destroy_side(&s);
}

/* Two listeners on one RDMA port (a prefork server's processes): SO_REUSEPORT, both get connections. */
static void test_port_space_reuseport(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() != RS_RNIC_KIND_SOFT)
        skip();
    struct rs_rnic_cm *cm2;
    assert_int_equal(rs_rnic_cm_create(f->rnic, &cm2), 0);
    struct rs_rnic_listener *l2;
    assert_int_equal(rs_rnic_listen(cm2, (struct sockaddr *)&f->listen_addr, sizeof(struct sockaddr_in), 16, &l2), 0);
    struct sockaddr_storage a2;
    assert_int_equal(rs_rnic_listener_addr(l2, &a2), 0);
    assert_int_equal(sin_port(&a2), sin_port(&f->listen_addr));
    int accepted[2] = { 0, 0 };
    for (int i = 0; i < 64 && (!accepted[0] || !accepted[1]); i++) {
        struct side act, pas;
        create_side(f, &act, 16, 4);
        create_side(f, &pas, 16, 4);
        assert_int_equal(rs_rnic_connect(act.qp, act.cm, (struct sockaddr *)&f->listen_addr,
                                         sizeof(struct sockaddr_in), NULL, 0, WAIT_MS),
                         0);
        /* The request arrives on whichever listener the kernel chose. */
        struct rs_rnic_cm_event ev;
        int which = -1;
        uint64_t deadline = now_ms() + WAIT_MS;
        while (which < 0 && now_ms() < deadline) {
            if (rs_rnic_cm_get_event(f->p.cm, &ev) == 0)
                which = 0;
            else if (rs_rnic_cm_get_event(cm2, &ev) == 0)
                which = 1;
            else
                usleep(1000);
        }
        assert_true(which >= 0);
        assert_int_equal(ev.type, RS_RNIC_CM_EV_CONNECT_REQUEST);
        assert_ptr_equal(ev.listener, which == 0 ? f->listener : l2);
        assert_int_equal(rs_rnic_accept(ev.request, pas.qp, pas.cm, NULL, 0), 0);
        expect_event(act.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
        expect_event(pas.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
        accepted[which]++;
        destroy_side(&act);
        destroy_side(&pas);
    }
    assert_true(accepted[0] > 0);
    assert_true(accepted[1] > 0);
    rs_rnic_listener_close(l2);
    rs_rnic_cm_destroy(cm2);
}

/* Connects a new active side to the fixture's address; the caller destroys it. */
static void connect_side(struct fixture *f, struct side *s)
{
    create_side(f, s, 16, 4);
    assert_int_equal(rs_rnic_connect(s->qp, s->cm, (struct sockaddr *)&f->listen_addr, sizeof(struct sockaddr_in),
                                     NULL, 0, WAIT_MS),
                     0);
}

/* A request taken off the backlog: refused, and the initiator told so. */
static void refuse_request(struct side *s, struct rs_rnic_cm_event *ev)
{
    assert_int_equal(ev->type, RS_RNIC_CM_EV_CONNECT_REQUEST);
    assert_int_equal(rs_rnic_reject(ev->request, NULL, 0), 0);
    expect_event(s->cm, RS_RNIC_CM_EV_REJECTED, NULL);
}

/* A listening socket adopted after a fork (here: parked, then listened on again) is shared by a prefork family:
 * it takes a connection off the common backlog only while the application asks for one (rs_rnic_listener_intake),
 * at most `want` at a time, and one that nobody asks for after RS_RC_SHARED_GRACE_MS (100 ms), so that a process
 * that is busy (and may exit before it accepts) leaves connections to the processes that wait. */
static void test_shared_listener_paced(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() != RS_RNIC_KIND_SOFT)
        skip();
    /* A listener of its own takes whatever arrives: no pacing. */
    assert_int_equal(rs_rnic_listener_intake(f->listener, 1, 0), -EOPNOTSUPP);
    rs_rnic_listener_park(f->listener);
    f->listener = NULL;
    assert_int_equal(rs_rnic_listen(f->p.cm, (struct sockaddr *)&f->listen_addr, sizeof(struct sockaddr_in), 16,
                                    &f->listener),
                     0);
    assert_int_equal(rs_rnic_listener_intake(f->listener, 0, 0), 0);

    /* Nobody asks: the connection waits in the backlog for the grace, then is taken anyway. */
    struct side a1, a2, a3;
    uint64_t t0 = now_ms();
    connect_side(f, &a1);
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(f->p.cm, WAIT_MS, &ev), 0);
    uint64_t took = now_ms() - t0;
    if (took < 90)
        fail_msg("a connection nobody asked for was taken after %llu ms (grace 100 ms)", (unsigned long long)took);
    refuse_request(&a1, &ev);

    /* The application asks for one (it has seen 1 request): of two connections, one comes at once, the other
     * only when the grace ran out again. */
    assert_int_equal(rs_rnic_listener_intake(f->listener, 1, 1), 0);
    connect_side(f, &a2);
    connect_side(f, &a3);
    assert_int_equal(get_event(f->p.cm, WAIT_MS, &ev), 0);
    uint64_t first = now_ms();
    struct rs_rnic_cm_event ev2;
    assert_int_equal(get_event(f->p.cm, WAIT_MS, &ev2), 0);
    uint64_t gap = now_ms() - first;
    if (gap < 60)
        fail_msg("the second connection came %llu ms after the first while one was asked for", (unsigned long long)gap);
    struct rs_rnic_cm_event *evs[2] = { &ev, &ev2 };
    for (int i = 0; i < 2; i++) {
        assert_int_equal(evs[i]->type, RS_RNIC_CM_EV_CONNECT_REQUEST);
        assert_int_equal(rs_rnic_reject(evs[i]->request, NULL, 0), 0);
    }
    expect_event(a2.cm, RS_RNIC_CM_EV_REJECTED, NULL);
    expect_event(a3.cm, RS_RNIC_CM_EV_REJECTED, NULL);
    destroy_side(&a1);
    destroy_side(&a2);
    destroy_side(&a3);
}

/* Every socket of a soft RC connection (listener, accepted, active) is close-on-exec: a program that execs keeps
 * none of them. */
static void test_sockets_cloexec(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() != RS_RNIC_KIND_SOFT)
        skip();
    connect_pair(f, NULL, 0, NULL, 0);
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int sockets = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        struct stat st;
        if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
            continue;
        int type = 0;
        socklen_t len = sizeof(type);
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
            continue;
        sockets++;
        if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC))
            fail_msg("stream socket fd %d is not close-on-exec", fd);
    }
    closedir(d);
    assert_true(sockets >= 3);
}

/* The soft RNIC's listener speaks MPA on kernel TCP: a raw client can check how it refuses bad Requests. */
static int raw_mpa_exchange(struct fixture *f, const uint8_t *req, size_t req_len, uint8_t *rep, size_t rep_cap,
                            bool *closed)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c >= 0);
    struct sockaddr_in tcp = local_sockaddr(tcp_port_of(sin_port(&f->listen_addr)));
    assert_int_equal(connect(c, (struct sockaddr *)&tcp, sizeof(tcp)), 0);
    /* The listener greets first; its Reply follows our Request. */
    uint8_t greeting[16];
    assert_true(wait_fd(c, WAIT_MS) > 0);
    assert_int_equal(recv(c, greeting, sizeof(greeting), MSG_WAITALL), 16);
    assert_memory_equal(greeting, "RDMASOCK SOFTRC\x01", 16);
    assert_int_equal(write(c, req, req_len), (ssize_t)req_len);
    size_t got = 0;
    *closed = false;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (now_ms() < deadline) {
        if (wait_fd(c, 100) <= 0)
            continue;
        ssize_t r = read(c, rep + got, rep_cap - got);
        if (r <= 0) {
            *closed = true;
            break;
        }
        got += (size_t)r;
    }
    close(c);
    return (int)got;
}

static void test_listener_refuses_markers(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() != RS_RNIC_KIND_SOFT)
        skip();
    /* "MPA ID Req Frame", M and C set, rev 1, 3 bytes of private data. */
    uint8_t req[23] = "MPA ID Req Frame";
    req[16] = 0xc0;
    req[17] = 1;
    req[18] = 0;
    req[19] = 3;
    memcpy(req + 20, "abc", 3);
    uint8_t rep[600];
    bool closed;
    int n = raw_mpa_exchange(f, req, sizeof(req), rep, sizeof(rep), &closed);
    assert_int_equal(n, 20);
    assert_memory_equal(rep, "MPA ID Rep Frame", 16);
    assert_int_equal(rep[16] & 0xe0, 0x20 | 0x40);      /* R (refused), C, never M */
    assert_true(closed);                                /* and the connection closes */
    /* The application never saw it. */
    struct rs_rnic_cm_event ev;
    assert_int_equal(get_event(f->p.cm, 100, &ev), -ETIMEDOUT);

    /* An unknown revision and private data longer than the channel carries are refused the same way. */
    req[16] = 0x40;
    req[17] = 7;
    n = raw_mpa_exchange(f, req, sizeof(req), rep, sizeof(rep), &closed);
    assert_int_equal(n, 20);
    assert_int_equal(rep[16] & 0x20, 0x20);
    assert_true(closed);
    static uint8_t big[20 + 400];
    memcpy(big, "MPA ID Req Frame", 16);
    big[16] = 0x40;
    big[17] = 1;
    big[18] = 400 >> 8;
    big[19] = 400 & 0xff;
    n = raw_mpa_exchange(f, big, sizeof(big), rep, sizeof(rep), &closed);
    assert_int_equal(n, 20);
    assert_int_equal(rep[16] & 0x20, 0x20);
    assert_true(closed);
    /* Not MPA at all: closed without a reply. */
    n = raw_mpa_exchange(f, (const uint8_t *)"GET / HTTP/1.1\r\n\r\n", 18, rep, sizeof(rep), &closed);
    assert_int_equal(n, 0);
    assert_true(closed);
    assert_int_equal(get_event(f->p.cm, 100, &ev), -ETIMEDOUT);
    /* A proper client still gets through afterwards. */
    connect_pair(f, "ok", 2, NULL, 0);
}

/* ---- data transfer ---- */

static void test_send_recv_sizes(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    static const size_t sizes[] = { 1, 2, 3, 4, 5, 13, 17, 255, 1000, 4095, 4096, 16383, 16384, 16385, 65535,
                                    65536, 100000, (1u << 20) + 7, 16u << 20 };
    size_t max = 16u << 20;
    struct gbuf src, dst;
    gbuf_init(&src, f->pd, max, RS_ACCESS_LOCAL_WRITE, 0);
    gbuf_init(&dst, f->pd, max, RS_ACCESS_LOCAL_WRITE, 0);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        fill_pattern(src.data, n, (uint32_t)i + 7);
        memset(dst.data, 0, n + (n < max ? 1 : 0));
        post_recv(f->p.qp, 1000 + i, &dst, 0, max);
        post_send_op(f->a.qp, 2000 + i, RS_WR_SEND, 0, &src, 0, n, 0, 0);
        struct rs_rnic_wc wc;
        expect_wc(f->a.cq, 2000 + i, RS_WC_SEND, RS_WC_SUCCESS, NULL);
        expect_wc(f->p.cq, 1000 + i, RS_WC_RECV, RS_WC_SUCCESS, &wc);
        assert_int_equal(wc.byte_len, n);
        assert_memory_equal(dst.data, src.data, n);
        if (n < max)
            assert_int_equal(dst.data[n], 0);       /* nothing past the message */
    }
    gbuf_fini(&src);
    gbuf_fini(&dst);
}

static void test_send_ordering_and_sges(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    enum { N = 64, MSG = 3000 };
    struct gbuf src, dst;
    gbuf_init(&src, f->pd, N * MSG, RS_ACCESS_LOCAL_WRITE, 0);
    gbuf_init(&dst, f->pd, N * MSG, RS_ACCESS_LOCAL_WRITE, 0);
    fill_pattern(src.data, N * MSG, 99);
    /* Receives scattered over two SGEs, sends gathered from three; all posted before any completes. */
    for (int i = 0; i < N; i++) {
        uint8_t *base = dst.data + (size_t)i * MSG;
        struct rs_rnic_sge sge[2] = {
            { (uint64_t)(uintptr_t)base, 1000, dst.mr->lkey },
            { (uint64_t)(uintptr_t)(base + 1000), MSG - 1000, dst.mr->lkey },
        };
        struct rs_rnic_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = sge, .num_sge = 2 };
        assert_int_equal(rs_rnic_post_recv(f->p.qp, &wr, NULL), 0);
    }
    for (int i = 0; i < N; i++) {
        uint8_t *base = src.data + (size_t)i * MSG;
        struct rs_rnic_sge sge[3] = {
            { (uint64_t)(uintptr_t)base, 7, src.mr->lkey },
            { (uint64_t)(uintptr_t)(base + 7), 2000, src.mr->lkey },
            { (uint64_t)(uintptr_t)(base + 2007), MSG - 2007, src.mr->lkey },
        };
        struct rs_rnic_send_wr wr = {
            .wr_id = 100 + (uint64_t)i, .opcode = RS_WR_SEND, .flags = RS_SEND_SIGNALED, .sg_list = sge, .num_sge = 3,
        };
        assert_int_equal(rs_rnic_post_send(f->a.qp, &wr, NULL), 0);
    }
    struct rs_rnic_wc wc[N];
    assert_int_equal(poll_n(f->a.cq, wc, N, WAIT_MS), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(wc[i].status, RS_WC_SUCCESS);
        assert_int_equal(wc[i].wr_id, 100 + (uint64_t)i);      /* send completions in posting order */
    }
    assert_int_equal(poll_n(f->p.cq, wc, N, WAIT_MS), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(wc[i].status, RS_WC_SUCCESS);
        assert_int_equal(wc[i].wr_id, (uint64_t)i);            /* receives in posting order */
        assert_int_equal(wc[i].byte_len, MSG);
    }
    assert_memory_equal(dst.data, src.data, N * MSG);
    gbuf_fini(&src);
    gbuf_fini(&dst);
}

static void test_write_read_bounds(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    enum { REGION = 1 << 20 };
    struct gbuf target, local;
    gbuf_init(&target, f->pd, REGION, RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ, 0x11);
    gbuf_init(&local, f->pd, REGION + 16, RS_ACCESS_LOCAL_WRITE, 0);
    uint64_t base = (uint64_t)(uintptr_t)target.data;
    /* Writes covering the first byte, the last byte, and a large middle piece. */
    struct { size_t off, len; } w[] = { { 0, 1 }, { REGION - 1, 1 }, { 5, 70000 }, { REGION - 33333, 33333 },
                                        { 0, REGION } };
    uint8_t *expect = malloc(REGION);
    assert_non_null(expect);
    memset(expect, 0x11, REGION);
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        fill_pattern(local.data, w[i].len, (uint32_t)(i + 50));
        memcpy(expect + w[i].off, local.data, w[i].len);
        post_send_op(f->a.qp, i, RS_WR_RDMA_WRITE, 0, &local, 0, w[i].len, base + w[i].off, target.mr->rkey);
        expect_wc(f->a.cq, i, RS_WC_RDMA_WRITE, RS_WC_SUCCESS, NULL);
        /* Effects are visible in order: a SEND after the WRITE arrives after the data is placed. */
        struct gbuf note;
        gbuf_init(&note, f->pd, 16, RS_ACCESS_LOCAL_WRITE, 0);
        post_recv(f->p.qp, 77, &note, 0, 16);
        post_send_op(f->a.qp, 78, RS_WR_SEND, 0, &local, 0, 1, 0, 0);
        expect_wc(f->a.cq, 78, RS_WC_SEND, RS_WC_SUCCESS, NULL);
        expect_wc(f->p.cq, 77, RS_WC_RECV, RS_WC_SUCCESS, NULL);
        assert_memory_equal(target.data, expect, REGION);
        gbuf_fini(&note);
        gbuf_check_guards(&target);
    }
    /* READs back, into a local buffer with canaries, from the edges and the middle. */
    struct { size_t off, len; } r[] = { { 0, 1 }, { REGION - 1, 1 }, { 1000, 200000 }, { 0, REGION }, { 17, 0 } };
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
        memset(local.data, 0, REGION + 16);
        post_send_op(f->a.qp, 500 + i, RS_WR_RDMA_READ, 0, &local, 3, r[i].len, base + r[i].off, target.mr->rkey);
        struct rs_rnic_wc wc;
        expect_wc(f->a.cq, 500 + i, RS_WC_RDMA_READ, RS_WC_SUCCESS, &wc);
        assert_memory_equal(local.data + 3, expect + r[i].off, r[i].len);
        assert_int_equal(local.data[2], 0);
        assert_int_equal(local.data[3 + r[i].len], 0);
        gbuf_check_guards(&local);
    }
    free(expect);
    gbuf_fini(&target);
    gbuf_fini(&local);
}

static void test_reads_in_flight(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    enum { N = 300, LEN = 4000 };
    struct gbuf src, dst;
    gbuf_init(&src, f->pd, N * LEN, RS_ACCESS_REMOTE_READ, 0);
    gbuf_init(&dst, f->pd, N * LEN, RS_ACCESS_LOCAL_WRITE, 0);
    fill_pattern(src.data, N * LEN, 5);
    /* More READs than any ORD: the initiator queues them and every one completes in order. A SEND with a fence
     * in the middle starts only after the READs before it completed. */
    struct gbuf note;
    gbuf_init(&note, f->pd, 64, RS_ACCESS_LOCAL_WRITE, 0);
    post_recv(f->p.qp, 9, &note, 0, 64);
    for (int i = 0; i < N; i++) {
        post_send_op(f->a.qp, (uint64_t)i, RS_WR_RDMA_READ, 0, &dst, (size_t)i * LEN, LEN,
                     (uint64_t)(uintptr_t)(src.data + (size_t)i * LEN), src.mr->rkey);
        if (i == N / 2)
            post_send_op(f->a.qp, 100000, RS_WR_SEND, RS_SEND_FENCE, &note, 0, 8, 0, 0);
    }
    struct rs_rnic_wc wc[N + 1];
    assert_int_equal(poll_n(f->a.cq, wc, N + 1, 2 * WAIT_MS), N + 1);
    int k = 0;
    for (int i = 0; i <= N; i++) {
        assert_int_equal(wc[i].status, RS_WC_SUCCESS);
        if (i == N / 2 + 1) {
            assert_int_equal(wc[i].wr_id, 100000);
            continue;
        }
        assert_int_equal(wc[i].wr_id, (uint64_t)k);
        k++;
    }
    assert_memory_equal(dst.data, src.data, N * LEN);
    expect_wc(f->p.cq, 9, RS_WC_RECV, RS_WC_SUCCESS, NULL);
    gbuf_fini(&note);
    gbuf_fini(&src);
    gbuf_fini(&dst);
}

static void test_read_response_interleaves(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    /* The passive side serves a 16 MiB READ while it also sends its own messages to the active side: both
     * streams share one connection and both arrive intact. */
    enum { BIG = 16 << 20, MSGS = 32, MSG = 20000 };
    struct gbuf big_src, big_dst, msrc, mdst;
    gbuf_init(&big_src, f->pd, BIG, RS_ACCESS_REMOTE_READ, 0);
    gbuf_init(&big_dst, f->pd, BIG, RS_ACCESS_LOCAL_WRITE, 0);
    gbuf_init(&msrc, f->pd, MSGS * MSG, RS_ACCESS_LOCAL_WRITE, 0);
    gbuf_init(&mdst, f->pd, MSGS * MSG, RS_ACCESS_LOCAL_WRITE, 0);
    fill_pattern(big_src.data, BIG, 11);
    fill_pattern(msrc.data, MSGS * MSG, 12);
    for (int i = 0; i < MSGS; i++)
        post_recv(f->a.qp, (uint64_t)i, &mdst, (size_t)i * MSG, MSG);
    post_send_op(f->a.qp, 7777, RS_WR_RDMA_READ, 0, &big_dst, 0, BIG, (uint64_t)(uintptr_t)big_src.data,
                 big_src.mr->rkey);
    for (int i = 0; i < MSGS; i++)
        post_send_op(f->p.qp, 100 + (uint64_t)i, RS_WR_SEND, 0, &msrc, (size_t)i * MSG, MSG, 0, 0);
    struct rs_rnic_wc wc[MSGS + 1];
    assert_int_equal(poll_n(f->p.cq, wc, MSGS, 2 * WAIT_MS), MSGS);
    assert_int_equal(poll_n(f->a.cq, wc, MSGS + 1, 2 * WAIT_MS), MSGS + 1);
    int recvs = 0, reads = 0;
    for (int i = 0; i < MSGS + 1; i++) {
        assert_int_equal(wc[i].status, RS_WC_SUCCESS);
        if (wc[i].opcode == RS_WC_RECV)
            assert_int_equal(wc[i].wr_id, (uint64_t)recvs++);
        else
            reads++;
    }
    assert_int_equal(recvs, MSGS);
    assert_int_equal(reads, 1);
    assert_memory_equal(big_dst.data, big_src.data, BIG);
    assert_memory_equal(mdst.data, msrc.data, MSGS * MSG);
    gbuf_fini(&big_src);
    gbuf_fini(&big_dst);
    gbuf_fini(&msrc);
    gbuf_fini(&mdst);
}

/* ---- local Read placement (src/rnic/soft/rc_local.c) ---- */

uint64_t rs_rc_local_read_bytes(void);

static int local_records(void)
{
    int n = 0;
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, "rdmasock-soft-read-", 19) == 0;
    if (d)
        closedir(d);
    return n;
}

/* A READ of a [raddr, +len) into dst at off (one SGE, or two halves); returns the bytes placed by local copy. */
static uint64_t local_read(struct fixture *f, struct gbuf *dst, size_t off, size_t len, uint64_t raddr, uint32_t rkey,
                           bool two_sges, uint64_t wr_id)
{
    uint64_t before = rs_rc_local_read_bytes();
    struct rs_rnic_sge sge[2] = {
        { (uint64_t)(uintptr_t)(dst->data + off), (uint32_t)(two_sges ? len / 2 : len), dst->mr->lkey },
        { (uint64_t)(uintptr_t)(dst->data + off + len / 2), (uint32_t)(len - len / 2), dst->mr->lkey },
    };
    struct rs_rnic_send_wr wr = {
        .wr_id = wr_id, .opcode = RS_WR_RDMA_READ, .flags = RS_SEND_SIGNALED, .sg_list = sge,
        .num_sge = two_sges ? 2 : 1,
    };
    wr.rdma.remote_addr = raddr;
    wr.rdma.rkey = rkey;
    struct rs_rnic_send_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_send(f->a.qp, &wr, &bad), 0);
    struct rs_rnic_wc wc;
    expect_wc(f->a.cq, wr_id, RS_WC_RDMA_READ, RS_WC_SUCCESS, &wc);
    return rs_rc_local_read_bytes() - before;
}

/*
 * Over loopback a READ of at least 16 KiB is copied straight into the requester's sink (one process_vm_writev, a
 * zero-length Read Response marks it); a shorter one, and every one after a READ with two SGEs, comes over TCP.
 * The data is the same either way, the requester's record file is gone after the QPs are, and the QP reports
 * direct reads only while they are possible.
 */
static void test_local_read_placement(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() == RS_RNIC_KIND_VERBS)
        skip();     /* a soft RNIC mechanism */
    int records_before = local_records();
    connect_pair(f, NULL, 0, NULL, 0);
    enum { BIG = 4 << 20 };
    struct gbuf src, dst;
    gbuf_init(&src, f->pd, BIG, RS_ACCESS_REMOTE_READ, 0);
    gbuf_init(&dst, f->pd, BIG, RS_ACCESS_LOCAL_WRITE, 0);
    fill_pattern(src.data, BIG, 31);
    uint64_t base = (uint64_t)(uintptr_t)src.data;
    assert_true(rs_rnic_qp_reads_placed_directly(f->p.qp));
    assert_int_equal(local_read(f, &dst, 0, BIG, base, src.mr->rkey, false, 1), BIG);
    assert_memory_equal(dst.data, src.data, BIG);
    assert_int_equal(local_records(), records_before + 1);
    /* Short: TCP. */
    memset(dst.data, 0, BIG);
    assert_int_equal(local_read(f, &dst, 100, 8000, base + 7, src.mr->rkey, false, 2), 0);
    assert_memory_equal(dst.data + 100, src.data + 7, 8000);
    /* Unaligned, not a multiple of anything: local. */
    assert_int_equal(local_read(f, &dst, 3, 100001, base + 5, src.mr->rkey, false, 3), 100001);
    assert_memory_equal(dst.data + 3, src.data + 5, 100001);
    /* Two SGEs: TCP, and from now on for every READ of this connection. */
    memset(dst.data, 0, BIG);
    assert_int_equal(local_read(f, &dst, 0, 1 << 20, base, src.mr->rkey, true, 4), 0);
    assert_memory_equal(dst.data, src.data, 1 << 20);
    assert_int_equal(local_read(f, &dst, 0, BIG, base, src.mr->rkey, false, 5), 0);
    assert_memory_equal(dst.data, src.data, BIG);
    assert_false(rs_rnic_qp_reads_placed_directly(f->a.qp));
    gbuf_fini(&src);
    gbuf_fini(&dst);
    rs_rnic_destroy_qp(f->a.qp);
    f->a.qp = NULL;
    assert_int_equal(local_records(), records_before);
}

/* A READ into a sink the requester may not write (unknown lkey) fails with a local protection error before its
 * Request leaves (rc_tx.c), so a local responder never sees it: nothing is placed and the buffer stays untouched,
 * as over TCP. */
static void test_local_read_bad_sink(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() == RS_RNIC_KIND_VERBS)
        skip();     /* a soft RNIC mechanism */
    connect_pair(f, NULL, 0, NULL, 0);
    enum { LEN = 256 << 10 };
    struct gbuf src, dst;
    gbuf_init(&src, f->pd, LEN, RS_ACCESS_REMOTE_READ, 0);
    gbuf_init(&dst, f->pd, LEN, RS_ACCESS_LOCAL_WRITE, 0);
    fill_pattern(src.data, LEN, 33);
    memset(dst.data, 0, LEN);
    uint64_t before = rs_rc_local_read_bytes();
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)dst.data, LEN, dst.mr->lkey ^ 0x5a5a00u };
    struct rs_rnic_send_wr wr = { .wr_id = 9, .opcode = RS_WR_RDMA_READ, .flags = RS_SEND_SIGNALED, .sg_list = &sge,
                                  .num_sge = 1 };
    wr.rdma.remote_addr = (uint64_t)(uintptr_t)src.data;
    wr.rdma.rkey = src.mr->rkey;
    struct rs_rnic_send_wr *bad = NULL;
    assert_int_equal(rs_rnic_post_send(f->a.qp, &wr, &bad), 0);
    struct rs_rnic_wc wc;
    assert_int_equal(poll_n(f->a.cq, &wc, 1, WAIT_MS), 1);
    assert_int_equal(wc.wr_id, 9);
    assert_int_equal(wc.status, RS_WC_LOC_PROT_ERR);
    assert_int_equal(rs_rc_local_read_bytes() - before, 0);
    for (size_t i = 0; i < LEN; i++)
        if (dst.data[i])
            fail_msg("byte %zu of the refused sink was written", i);
    gbuf_fini(&src);
    gbuf_fini(&dst);
}

/* RDMASOCK_SOFT_LOCAL_READ=off: every response over TCP, no record published. */
static void test_local_read_off(void **state)
{
    struct fixture *f = *state;
    if (rnic_kind() == RS_RNIC_KIND_VERBS)
        skip();     /* a soft RNIC mechanism */
    int records_before = local_records();
    setenv("RDMASOCK_SOFT_LOCAL_READ", "off", 1);
    connect_pair(f, NULL, 0, NULL, 0);
    unsetenv("RDMASOCK_SOFT_LOCAL_READ");
    enum { BIG = 1 << 20 };
    struct gbuf src, dst;
    gbuf_init(&src, f->pd, BIG, RS_ACCESS_REMOTE_READ, 0);
    gbuf_init(&dst, f->pd, BIG, RS_ACCESS_LOCAL_WRITE, 0);
    fill_pattern(src.data, BIG, 32);
    assert_false(rs_rnic_qp_reads_placed_directly(f->p.qp));
    assert_int_equal(local_read(f, &dst, 0, BIG, (uint64_t)(uintptr_t)src.data, src.mr->rkey, false, 1), 0);
    assert_memory_equal(dst.data, src.data, BIG);
    assert_int_equal(local_records(), records_before);
    gbuf_fini(&src);
    gbuf_fini(&dst);
}

/* ---- invalidation and protection errors ---- */

/* Both QPs end in ERROR, both CMs say so, and the receives still posted come back flushed. */
static void expect_both_failed(struct fixture *f, uint64_t a_recv_id, uint64_t p_recv_id)
{
    struct rs_rnic_cm_event ev;
    expect_event(f->a.cm, RS_RNIC_CM_EV_ERROR, &ev);
    assert_ptr_equal(ev.qp, f->a.qp);
    expect_event(f->p.cm, RS_RNIC_CM_EV_ERROR, &ev);
    assert_ptr_equal(ev.qp, f->p.qp);
    wait_qp_state(f->a.qp, RS_QPS_ERROR, WAIT_MS);
    wait_qp_state(f->p.qp, RS_QPS_ERROR, WAIT_MS);
    expect_wc(f->a.cq, a_recv_id, RS_WC_RECV, RS_WC_WR_FLUSH_ERR, NULL);
    expect_wc(f->p.cq, p_recv_id, RS_WC_RECV, RS_WC_WR_FLUSH_ERR, NULL);
}

static void test_send_with_invalidate(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    struct gbuf target, local, rbuf, arecv;
    gbuf_init(&target, f->pd, 4096, RS_ACCESS_REMOTE_WRITE, 0x22);
    gbuf_init(&local, f->pd, 4096, RS_ACCESS_LOCAL_WRITE, 0x33);
    gbuf_init(&rbuf, f->pd, 64, RS_ACCESS_LOCAL_WRITE, 0);
    gbuf_init(&arecv, f->pd, 64, RS_ACCESS_LOCAL_WRITE, 0);
    uint32_t rkey = target.mr->rkey;
    post_recv(f->p.qp, 1, &rbuf, 0, 64);
    post_recv(f->p.qp, 2, &rbuf, 0, 64);
    post_recv(f->a.qp, 3, &arecv, 0, 64);
    /* A WRITE with the STag works before the invalidation. */
    post_send_op(f->a.qp, 10, RS_WR_RDMA_WRITE, 0, &local, 0, 100, (uint64_t)(uintptr_t)target.data, rkey);
    expect_wc(f->a.cq, 10, RS_WC_RDMA_WRITE, RS_WC_SUCCESS, NULL);
    post_send_op(f->a.qp, 11, RS_WR_SEND_WITH_INVALIDATE, 0, &local, 0, 5, 0, rkey);
    expect_wc(f->a.cq, 11, RS_WC_SEND, RS_WC_SUCCESS, NULL);
    struct rs_rnic_wc wc;
    expect_wc(f->p.cq, 1, RS_WC_RECV, RS_WC_SUCCESS, &wc);
    assert_int_equal(wc.byte_len, 5);
    assert_true(wc.flags & RS_WC_WITH_INVALIDATE);
    assert_int_equal(wc.invalidated_rkey, rkey);
    for (int i = 0; i < 100; i++)
        assert_int_equal(target.data[i], 0x33);
    /* The same STag is now refused: nothing lands, both sides fail. */
    memset(local.data, 0x44, 4096);
    post_send_op(f->a.qp, 12, RS_WR_RDMA_WRITE, 0, &local, 0, 4096, (uint64_t)(uintptr_t)target.data, rkey);
    struct rs_rnic_wc w12;
    assert_int_equal(poll_n(f->a.cq, &w12, 1, WAIT_MS), 1);
    assert_int_equal(w12.wr_id, 12);
    /* soft completes a WRITE once TCP has it; verbs reports the remote refusal on the WRITE itself */
    assert_true(w12.status == RS_WC_SUCCESS || w12.status == RS_WC_REM_ACCESS_ERR);
    expect_both_failed(f, 3, 2);
    for (int i = 0; i < 100; i++)
        assert_int_equal(target.data[i], 0x33);
    for (int i = 100; i < 4096; i++)
        assert_int_equal(target.data[i], 0x22);
    gbuf_fini(&target);
    gbuf_fini(&local);
    gbuf_fini(&rbuf);
    gbuf_fini(&arecv);
}

/* SEND_WITH_IMM: only on QPs created with imm_data (caps.has_send_with_imm); the immediate arrives with the
 * receive completion, and such a QP refuses SEND_WITH_INVALIDATE (the verbs provider's emulation needs the
 * immediate). Where the RNIC has none (soft, iWARP), creating such a QP and posting the opcode are refused. */
static void test_send_with_imm(void **state)
{
    struct fixture *f = *state;
    const struct rs_rnic_caps *caps = rs_rnic_caps(f->rnic);
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = f->a.cq, .recv_cq = f->a.cq, .max_send_wr = 64, .max_recv_wr = 64,
        .max_send_sge = 4, .max_recv_sge = 4, .max_inline = 64, .imm_data = true,
    };
    struct gbuf local, rbuf;
    gbuf_init(&local, f->pd, 4096, RS_ACCESS_LOCAL_WRITE, 0x5a);
    gbuf_init(&rbuf, f->pd, 4096, RS_ACCESS_LOCAL_WRITE, 0);
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)local.data, 5, local.mr->lkey };
    struct rs_rnic_send_wr wr = { .wr_id = 20, .opcode = RS_WR_SEND_WITH_IMM, .flags = RS_SEND_SIGNALED,
                                  .sg_list = &sge, .num_sge = 1, .imm_data = 0xdeadbeef };
    struct rs_rnic_send_wr *bad = NULL;
    if (!caps->has_send_with_imm) {
        struct rs_rnic_qp *qp = NULL;
        assert_int_equal(rs_rnic_create_qp(f->pd, &attr, &qp), -EINVAL);
        connect_pair(f, NULL, 0, NULL, 0);
        assert_int_equal(rs_rnic_post_send(f->a.qp, &wr, &bad), -EINVAL);
        assert_ptr_equal(bad, &wr);
        gbuf_fini(&local);
        gbuf_fini(&rbuf);
        return;
    }
    assert_int_equal(rs_rnic_destroy_qp(f->a.qp), 0);
    assert_int_equal(rs_rnic_create_qp(f->pd, &attr, &f->a.qp), 0);
    attr.send_cq = attr.recv_cq = f->p.cq;
    assert_int_equal(rs_rnic_destroy_qp(f->p.qp), 0);
    assert_int_equal(rs_rnic_create_qp(f->pd, &attr, &f->p.qp), 0);
    connect_pair(f, NULL, 0, NULL, 0);
    post_recv(f->p.qp, 1, &rbuf, 0, 2048);
    post_recv(f->p.qp, 2, &rbuf, 2048, 2048);
    /* Inline and from the region, with the immediate either way. */
    wr.flags |= RS_SEND_INLINE;
    assert_int_equal(rs_rnic_post_send(f->a.qp, &wr, &bad), 0);
    expect_wc(f->a.cq, 20, RS_WC_SEND, RS_WC_SUCCESS, NULL);
    wr.wr_id = 21;
    wr.flags = RS_SEND_SIGNALED;
    wr.imm_data = 7;
    sge.length = 1000;
    assert_int_equal(rs_rnic_post_send(f->a.qp, &wr, &bad), 0);
    expect_wc(f->a.cq, 21, RS_WC_SEND, RS_WC_SUCCESS, NULL);
    struct rs_rnic_wc wc;
    expect_wc(f->p.cq, 1, RS_WC_RECV, RS_WC_SUCCESS, &wc);
    assert_int_equal(wc.byte_len, 5);
    assert_int_equal(wc.flags & (RS_WC_WITH_IMM | RS_WC_WITH_INVALIDATE), RS_WC_WITH_IMM);
    assert_int_equal(wc.imm_data, 0xdeadbeef);
    expect_wc(f->p.cq, 2, RS_WC_RECV, RS_WC_SUCCESS, &wc);
    assert_int_equal(wc.byte_len, 1000);
    assert_int_equal(wc.flags & (RS_WC_WITH_IMM | RS_WC_WITH_INVALIDATE), RS_WC_WITH_IMM);
    assert_int_equal(wc.imm_data, 7);
    for (int i = 0; i < 5; i++)
        assert_int_equal(rbuf.data[i], 0x5a);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(rbuf.data[2048 + i], 0x5a);
    assert_int_equal(rbuf.data[5], 0);
    /* The immediate is the caller's here: no emulated invalidation on this QP. */
    wr.wr_id = 22;
    wr.opcode = RS_WR_SEND_WITH_INVALIDATE;
    wr.invalidate_rkey = local.mr->rkey;
    assert_int_equal(rs_rnic_post_send(f->a.qp, &wr, &bad), -EINVAL);
    gbuf_fini(&local);
    gbuf_fini(&rbuf);
}

enum bad_access { BAD_RKEY, BAD_BOUNDS_WRITE, BAD_WRAP_WRITE, BAD_NO_WRITE_ACCESS, BAD_OTHER_PD, BAD_READ_NO_ACCESS,
                  BAD_READ_BOUNDS, BAD_SEND_TOO_LONG, BAD_NO_RECV };

static void run_bad_access(void **state, enum bad_access kind)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    struct rs_rnic_pd *other_pd;
    assert_int_equal(rs_rnic_alloc_pd(f->rnic, &other_pd), 0);
    struct gbuf target, local, arecv, precv;
    unsigned access = kind == BAD_NO_WRITE_ACCESS ? RS_ACCESS_REMOTE_READ
                      : kind == BAD_READ_NO_ACCESS ? RS_ACCESS_REMOTE_WRITE
                                                  : RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ;
    gbuf_init(&target, kind == BAD_OTHER_PD ? other_pd : f->pd, 8192, access, 0x5c);
    gbuf_init(&local, f->pd, 65536, RS_ACCESS_LOCAL_WRITE, 0x77);
    gbuf_init(&arecv, f->pd, 64, RS_ACCESS_LOCAL_WRITE, 0);
    gbuf_init(&precv, f->pd, 64, RS_ACCESS_LOCAL_WRITE, 0);
    uint64_t base = (uint64_t)(uintptr_t)target.data;
    post_recv(f->a.qp, 1, &arecv, 0, 64);
    if (kind != BAD_NO_RECV)
        post_recv(f->p.qp, 2, &precv, 0, 16);
    uint64_t recv_p = 2;
    bool is_read = false;
    switch (kind) {
    case BAD_RKEY:
        post_send_op(f->a.qp, 10, RS_WR_RDMA_WRITE, 0, &local, 0, 100, base, target.mr->rkey ^ 0x5a5a00u);
        break;
    case BAD_BOUNDS_WRITE:
        post_send_op(f->a.qp, 10, RS_WR_RDMA_WRITE, 0, &local, 0, 100, base + 8192 - 99, target.mr->rkey);
        break;
    case BAD_WRAP_WRITE:
        post_send_op(f->a.qp, 10, RS_WR_RDMA_WRITE, 0, &local, 0, 100, UINT64_MAX - 10, target.mr->rkey);
        break;
    case BAD_NO_WRITE_ACCESS:
    case BAD_OTHER_PD:
        post_send_op(f->a.qp, 10, RS_WR_RDMA_WRITE, 0, &local, 0, 100, base, target.mr->rkey);
        break;
    case BAD_READ_NO_ACCESS:
        post_send_op(f->a.qp, 10, RS_WR_RDMA_READ, 0, &local, 0, 100, base, target.mr->rkey);
        is_read = true;
        break;
    case BAD_READ_BOUNDS:
        post_send_op(f->a.qp, 10, RS_WR_RDMA_READ, 0, &local, 0, 8193, base, target.mr->rkey);
        is_read = true;
        break;
    case BAD_SEND_TOO_LONG:
        post_send_op(f->a.qp, 10, RS_WR_SEND, 0, &local, 0, 17, 0, 0);   /* the receive holds 16 */
        recv_p = 0;
        break;
    case BAD_NO_RECV:
        post_send_op(f->a.qp, 10, RS_WR_SEND, 0, &local, 0, 17, 0, 0);
        recv_p = 0;
        break;
    }
    /* Work posted behind the failing request is flushed, never executed. */
    post_send_op(f->a.qp, 11, RS_WR_RDMA_WRITE, 0, &local, 0, 64, base, target.mr->rkey);
    struct rs_rnic_wc wc[2];
    assert_int_equal(poll_n(f->a.cq, wc, 1, WAIT_MS), 1);
    assert_int_equal(wc[0].wr_id, 10);
    if (is_read)
        assert_int_equal(wc[0].status, RS_WC_REM_ACCESS_ERR);
    else if (kind == BAD_SEND_TOO_LONG || kind == BAD_NO_RECV)
        assert_true(wc[0].status == RS_WC_SUCCESS || wc[0].status == RS_WC_REM_INV_REQ_ERR ||
                    wc[0].status == RS_WC_REM_ACCESS_ERR);
    else
        assert_true(wc[0].status == RS_WC_SUCCESS || wc[0].status == RS_WC_REM_ACCESS_ERR);
    struct rs_rnic_cm_event ev;
    expect_event(f->a.cm, RS_RNIC_CM_EV_ERROR, &ev);
    expect_event(f->p.cm, RS_RNIC_CM_EV_ERROR, &ev);
    wait_qp_state(f->a.qp, RS_QPS_ERROR, WAIT_MS);
    wait_qp_state(f->p.qp, RS_QPS_ERROR, WAIT_MS);
    /* The rest of the active side's work: the WRITE behind (soft may already have handed it to TCP, so it may
     * report success, but the failed peer never places it: see the region check below) and the receive. */
    struct rs_rnic_wc w;
    bool saw_write = false, saw_recv = false;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(poll_n(f->a.cq, &w, 1, WAIT_MS), 1);
        if (w.wr_id == 11) {
            assert_true(w.status == RS_WC_WR_FLUSH_ERR || (!is_read && w.status == RS_WC_SUCCESS));
            saw_write = true;
        } else {
            assert_int_equal(w.wr_id, 1);
            assert_int_equal(w.status, RS_WC_WR_FLUSH_ERR);
            saw_recv = true;
        }
    }
    assert_true(saw_write && saw_recv);
    if (kind == BAD_SEND_TOO_LONG) {
        /* The receive that was too small completes with an error (length error, or flushed). */
        assert_int_equal(poll_n(f->p.cq, &w, 1, WAIT_MS), 1);
        assert_int_equal(w.wr_id, 2);
        assert_true(w.status == RS_WC_LOC_LEN_ERR || w.status == RS_WC_WR_FLUSH_ERR);
    } else if (recv_p) {
        expect_wc(f->p.cq, recv_p, RS_WC_RECV, RS_WC_WR_FLUSH_ERR, NULL);
    }
    /* Not a byte outside what was legitimately targeted changed. */
    for (size_t i = 0; i < target.len; i++)
        assert_int_equal(target.data[i], 0x5c);
    gbuf_fini(&target);
    gbuf_fini(&local);
    gbuf_fini(&arecv);
    gbuf_fini(&precv);
    assert_int_equal(rs_rnic_dealloc_pd(other_pd), 0);
}

static void test_bad_rkey(void **state) { run_bad_access(state, BAD_RKEY); }
static void test_bad_bounds_write(void **state) { run_bad_access(state, BAD_BOUNDS_WRITE); }
static void test_bad_wrap_write(void **state) { run_bad_access(state, BAD_WRAP_WRITE); }
static void test_bad_no_write_access(void **state) { run_bad_access(state, BAD_NO_WRITE_ACCESS); }
static void test_bad_other_pd(void **state) { run_bad_access(state, BAD_OTHER_PD); }
static void test_bad_read_no_access(void **state) { run_bad_access(state, BAD_READ_NO_ACCESS); }
static void test_bad_read_bounds(void **state) { run_bad_access(state, BAD_READ_BOUNDS); }
static void test_bad_send_too_long(void **state) { run_bad_access(state, BAD_SEND_TOO_LONG); }
static void test_bad_no_recv(void **state) { run_bad_access(state, BAD_NO_RECV); }

/* ---- closing ---- */

static void test_disconnect(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    struct gbuf b;
    gbuf_init(&b, f->pd, 4096, RS_ACCESS_LOCAL_WRITE, 0);
    post_recv(f->p.qp, 1, &b, 0, 4096);
    post_recv(f->p.qp, 2, &b, 0, 4096);
    post_recv(f->a.qp, 3, &b, 0, 4096);
    /* Work posted before the disconnect still arrives. */
    post_send_op(f->a.qp, 10, RS_WR_SEND, 0, &b, 0, 100, 0, 0);
    assert_int_equal(rs_rnic_disconnect(f->a.qp), 0);
    expect_wc(f->a.cq, 10, RS_WC_SEND, RS_WC_SUCCESS, NULL);
    expect_wc(f->p.cq, 1, RS_WC_RECV, RS_WC_SUCCESS, NULL);
    struct rs_rnic_cm_event ev;
    expect_event(f->a.cm, RS_RNIC_CM_EV_DISCONNECTED, &ev);
    assert_ptr_equal(ev.qp, f->a.qp);
    expect_event(f->p.cm, RS_RNIC_CM_EV_DISCONNECTED, &ev);
    assert_ptr_equal(ev.qp, f->p.qp);
    expect_wc(f->p.cq, 2, RS_WC_RECV, RS_WC_WR_FLUSH_ERR, NULL);
    expect_wc(f->a.cq, 3, RS_WC_RECV, RS_WC_WR_FLUSH_ERR, NULL);
    /* After the disconnect, new work is flushed at once. */
    post_send_op(f->a.qp, 11, RS_WR_SEND, 0, &b, 0, 100, 0, 0);
    expect_wc(f->a.cq, 11, RS_WC_SEND, RS_WC_WR_FLUSH_ERR, NULL);
    /* No stray ERROR event follows the DISCONNECTED. */
    assert_int_equal(get_event(f->a.cm, 200, &ev), -ETIMEDOUT);
    assert_int_equal(get_event(f->p.cm, 200, &ev), -ETIMEDOUT);
    gbuf_fini(&b);
}

/* Child: connects to the listener and waits to be killed. Uses only objects it creates. */
static void child_peer(const struct sockaddr_storage *dst, int ready_fd)
{
    struct rs_rnic *rnic;
    struct sockaddr_in bind_addr = local_sockaddr(0);
    if (rs_rnic_open(rnic_kind(), (struct sockaddr *)&bind_addr, &rnic) != 0)
        _exit(2);
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq;
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
    if (rs_rnic_alloc_pd(rnic, &pd) || rs_rnic_create_cq(rnic, 64, &cq) || rs_rnic_cm_create(rnic, &cm))
        _exit(3);
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = cq, .recv_cq = cq, .max_send_wr = 16, .max_recv_wr = 16,
        .max_send_sge = 1, .max_recv_sge = 1,
    };
    if (rs_rnic_create_qp(pd, &attr, &qp) ||
        rs_rnic_connect(qp, cm, (const struct sockaddr *)dst, sizeof(struct sockaddr_in), NULL, 0, WAIT_MS))
        _exit(4);
    struct rs_rnic_cm_event ev;
    if (get_event(cm, WAIT_MS, &ev) != 0 || ev.type != RS_RNIC_CM_EV_ESTABLISHED)
        _exit(5);
    char c = 'r';
    if (write(ready_fd, &c, 1) != 1)
        _exit(6);
    for (;;)
        pause();
}

static void test_peer_killed(void **state)
{
    struct fixture *f = *state;
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        child_peer(&f->listen_addr, pipefd[1]);
        _exit(0);
    }
    close(pipefd[1]);
    struct rs_rnic_cm_event ev;
    expect_event(f->p.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    assert_int_equal(rs_rnic_accept(ev.request, f->p.qp, f->p.cm, NULL, 0), 0);
    expect_event(f->p.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
    char c;
    assert_true(wait_fd(pipefd[0], WAIT_MS) > 0);
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    close(pipefd[0]);
    struct gbuf b;
    gbuf_init(&b, f->pd, 4096, RS_ACCESS_LOCAL_WRITE, 0);
    post_recv(f->p.qp, 1, &b, 0, 4096);
    uint64_t t0 = now_ms();
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(get_event(f->p.cm, WAIT_MS, &ev), 0);
    assert_true(ev.type == RS_RNIC_CM_EV_ERROR || ev.type == RS_RNIC_CM_EV_DISCONNECTED);
    assert_ptr_equal(ev.qp, f->p.qp);
    assert_true(now_ms() - t0 < 3000);
    expect_wc(f->p.cq, 1, RS_WC_RECV, RS_WC_WR_FLUSH_ERR, NULL);
    wait_qp_state(f->p.qp, RS_QPS_ERROR, WAIT_MS);
    gbuf_fini(&b);
}

static int small_cq_setup(void **state)
{
    return fixture_setup_depth(state, 4);
}

static void test_cq_overflow(void **state)
{
    struct fixture *f = *state;
    connect_pair(f, NULL, 0, NULL, 0);
    struct gbuf b;
    gbuf_init(&b, f->pd, 4096, RS_ACCESS_LOCAL_WRITE, 0);
    enum { N = 8 };
    for (int i = 0; i < N; i++)
        post_recv(f->p.qp, (uint64_t)i, &b, 0, 64);
    for (int i = 0; i < N; i++)
        post_send_op(f->a.qp, 100 + (uint64_t)i, RS_WR_SEND, 0, &b, 0, 8, 0, 0);
    struct rs_rnic_wc wc[N];
    assert_int_equal(poll_n(f->a.cq, wc, N, WAIT_MS), N);
    /* The passive CQ holds 4: the fifth completion overflows it. */
    uint64_t deadline = now_ms() + WAIT_MS;
    int r;
    do {
        usleep(2000);
        r = rs_rnic_poll_cq(f->p.cq, 0, wc);
    } while (r >= 0 && now_ms() < deadline);
    assert_int_equal(r, -EOVERFLOW);
    assert_int_equal(rs_rnic_poll_cq(f->p.cq, N, wc), -EOVERFLOW);
    struct rs_rnic_cm_event ev;
    expect_event(f->p.cm, RS_RNIC_CM_EV_ERROR, &ev);
    assert_ptr_equal(ev.qp, f->p.qp);
    wait_qp_state(f->p.qp, RS_QPS_ERROR, WAIT_MS);
    gbuf_fini(&b);
}

static int cq8_setup(void **state)
{
    return fixture_setup_depth(state, 8);
}

/* Completions still held by the device when their QP is destroyed are kept for the CQ's poller, in order, also
 * when they land across the end of the CQ's software ring: four QPs in turn on one CQ of 8, three unpolled send
 * completions each (the ring's tail at 0, 3, 6 and 1). */
static void test_destroyed_qp_completions_cross_ring_end(void **state)
{
    struct fixture *f = *state;
    struct gbuf b;
    gbuf_init(&b, f->pd, 4096, RS_ACCESS_LOCAL_WRITE, 0x3c);
    assert_int_equal(rs_rnic_destroy_qp(f->p.qp), 0);
    f->p.qp = NULL;
    for (uint64_t round = 0; round < 4; round++) {
        struct rs_rnic_qp_attr attr = {
            .type = RS_QPT_RC, .send_cq = f->p.cq, .recv_cq = f->p.cq, .max_send_wr = 4, .max_recv_wr = 4,
            .max_send_sge = 1, .max_recv_sge = 1,
        };
        struct rs_rnic_qp *qp;
        assert_int_equal(rs_rnic_create_qp(f->pd, &attr, &qp), 0);
        struct side act;
        memset(&act, 0, sizeof(act));
        connect_side(f, &act);
        struct rs_rnic_cm_event ev;
        expect_event(f->p.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
        assert_int_equal(rs_rnic_accept(ev.request, qp, f->p.cm, NULL, 0), 0);
        expect_event(act.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
        expect_event(f->p.cm, RS_RNIC_CM_EV_ESTABLISHED, NULL);
        for (uint64_t i = 0; i < 3; i++)
            post_recv(act.qp, i, &b, 1024 * i, 1024);
        for (uint64_t i = 0; i < 3; i++)
            post_send_op(qp, round * 10 + i, RS_WR_SEND, 0, &b, 1024 * i, 100 + i, 0, 0);
        for (uint64_t i = 0; i < 3; i++)
            expect_wc(act.cq, i, RS_WC_RECV, RS_WC_SUCCESS, NULL);
        assert_int_equal(rs_rnic_destroy_qp(qp), 0);
        for (uint64_t i = 0; i < 3; i++)
            expect_wc(f->p.cq, round * 10 + i, RS_WC_SEND, RS_WC_SUCCESS, NULL);
        destroy_side(&act);
    }
    struct rs_rnic_wc wc;
    assert_int_equal(rs_rnic_poll_cq(f->p.cq, 1, &wc), 0);
    gbuf_fini(&b);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connect_private_data, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_reject_private_data, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_connect_closed_port, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_connect_timeout, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_connect_not_rdma_peer, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_listener_refuses_markers, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_stranger_never_gets_a_byte, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_port_space_coexists_with_kernel, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_port_space_listen_any, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_port_space_reuseport, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_sockets_cloexec, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_send_recv_sizes, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_send_ordering_and_sges, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_write_read_bounds, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_reads_in_flight, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_read_response_interleaves, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_local_read_placement, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_local_read_off, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_local_read_bad_sink, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_send_with_invalidate, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_send_with_imm, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_rkey, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_bounds_write, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_wrap_write, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_no_write_access, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_other_pd, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_read_no_access, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_read_bounds, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_send_too_long, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_no_recv, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_disconnect, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_peer_killed, fixture_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_cq_overflow, small_cq_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_destroyed_qp_completions_cross_ring_end, cq8_setup, fixture_teardown),
        cmocka_unit_test_setup_teardown(test_shared_listener_paced, fixture_setup, fixture_teardown),
    };
    return cmocka_run_group_tests_name("rnic_rc", tests, NULL, NULL);
}
