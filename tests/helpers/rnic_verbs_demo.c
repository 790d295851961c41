/*
 * rnic_verbs_demo: one exchange of every operation the verbs provider puts on the wire, through rnic.h only,
 * between two hosts, for tests/suites/vm_verbs_wire.sh (which captures it and decodes it with tshark).
 *
 *   rnic_verbs_demo server LOCAL_ADDR PORT
 *   rnic_verbs_demo client LOCAL_ADDR SERVER_ADDR PORT
 *   environment: DEMO_COUNT (messages per operation, 4), DEMO_RC_DSCP (46), DEMO_RC_DSCP2 (34),
 *                DEMO_UD_DSCP (26)
 *
 * RC (port PORT, the QPs' traffic class carries DEMO_RC_DSCP): the client SENDs N messages, RDMA WRITEs N blocks
 * into the server's region, RDMA READs N blocks back, then changes its QP's QoS to DEMO_RC_DSCP2 (34) with
 * rs_rnic_qp_set_qos, so its last SEND and its close go out with the new DSCP. UD (the server's UD QP binds PORT+1, traffic class from
 * DEMO_UD_DSCP): the client SENDs N datagrams and one multi-datagram WRITE_RECORD, the server answers each SEND
 * with a UD SEND of its own. Every byte is checked on the receiving side. Prints what it does and "... OK" at
 * the end; exits 0 only if everything arrived intact.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "rnic/rnic.h"

#define WAIT_MS 15000
#define REGION 65536
#define BLOCK 1024
#define RECORD_LEN 3000
#define MSG 256

static const char *role = "demo";
static int count = 4;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: FAILED: ", role);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", role);
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);
    va_end(ap);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void check(int r, const char *what)
{
    if (r)
        die("%s: %s", what, strerror(-r));
}

static struct sockaddr_in addr_of(const char *text, int port)
{
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, text, &sin.sin_addr) != 1)
        die("bad address %s", text);
    return sin;
}

static void event(struct rs_rnic_cm *cm, enum rs_rnic_cm_event_type type, struct rs_rnic_cm_event *ev)
{
    uint64_t end = now_ms() + WAIT_MS;
    for (;;) {
        int r = rs_rnic_cm_get_event(cm, ev);
        if (r == 0) {
            if (ev->type != type)
                die("CM event %d where %d was expected (error %d)", (int)ev->type, (int)type, ev->error);
            return;
        }
        if (r != -EAGAIN)
            check(r, "rs_rnic_cm_get_event");
        if (now_ms() > end)
            die("no CM event %d in %d ms", (int)type, WAIT_MS);
        struct pollfd p = { .fd = rs_rnic_cm_fd(cm), .events = POLLIN };
        poll(&p, 1, 100);
    }
}

static void completion(struct rs_rnic_cq *cq, struct rs_rnic_wc *wc, const char *what)
{
    uint64_t end = now_ms() + WAIT_MS;
    for (;;) {
        int n = rs_rnic_poll_cq(cq, 1, wc);
        if (n < 0)
            check(n, "rs_rnic_poll_cq");
        if (n == 1) {
            if (wc->status != RS_WC_SUCCESS)
                die("%s: completion status %d (wr_id %llu)", what, (int)wc->status, (unsigned long long)wc->wr_id);
            return;
        }
        if (now_ms() > end)
            die("%s: no completion in %d ms", what, WAIT_MS);
        check(rs_rnic_cq_arm(cq, false), "arm");
        if (rs_rnic_poll_cq(cq, 0, wc) < 0)
            die("CQ overflow");
        struct pollfd p = { .fd = rs_rnic_cq_fd(cq), .events = POLLIN };
        poll(&p, 1, 20);
        rs_rnic_cq_ack_events(cq);
    }
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

static bool same(const uint8_t *p, size_t len, uint32_t seed)
{
    uint8_t *want = malloc(len);
    fill(want, len, seed);
    bool ok = memcmp(p, want, len) == 0;
    free(want);
    return ok;
}

static void post_recv(struct rs_rnic_qp *qp, uint8_t *buf, uint32_t len, uint32_t lkey, uint64_t wr_id)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, len, lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
    check(rs_rnic_post_recv(qp, &wr, NULL), "post_recv");
}

static void post(struct rs_rnic_qp *qp, enum rs_rnic_wr_opcode op, void *buf, uint32_t len, uint32_t lkey,
                 uint64_t raddr, uint32_t rkey, struct rs_rnic_ud_peer *peer, uint64_t wr_id)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, len, lkey };
    struct rs_rnic_send_wr wr = { .wr_id = wr_id, .opcode = op, .flags = RS_SEND_SIGNALED, .sg_list = &sge,
                                  .num_sge = 1, .ud_peer = peer };
    wr.rdma.remote_addr = raddr;
    wr.rdma.rkey = rkey;
    check(rs_rnic_post_send(qp, &wr, NULL), "post_send");
}

/* What the server tells the client in its accept: where to WRITE/READ and where to WRITE_RECORD. */
struct offer {
    uint64_t region;
    uint64_t record;
    uint32_t region_rkey, record_rkey;
};

struct node {
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq, *ud_cq, *ud_send_cq;     /* UD sends and receives complete apart */
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *rc, *ud;
    uint8_t *region, *record, *msgs;
    struct rs_rnic_mr *region_mr, *record_mr, *msgs_mr;
    struct rs_rnic_qos rc_qos, ud_qos;
};

static void node_open(struct node *n, const char *local, int ud_port)
{
    struct sockaddr_in a = addr_of(local, 0);
    check(rs_rnic_open(RS_RNIC_KIND_VERBS, (struct sockaddr *)&a, &n->rnic), "rs_rnic_open (verbs)");
    say("device %s", rs_rnic_caps(n->rnic)->name);
    check(rs_rnic_alloc_pd(n->rnic, &n->pd), "alloc_pd");
    check(rs_rnic_create_cq(n->rnic, 256, &n->cq), "create_cq");
    check(rs_rnic_create_cq(n->rnic, 256, &n->ud_cq), "create_cq");
    check(rs_rnic_create_cq(n->rnic, 256, &n->ud_send_cq), "create_cq");
    check(rs_rnic_cm_create(n->rnic, &n->cm), "cm_create");
    n->region = aligned_alloc(4096, REGION);
    n->record = aligned_alloc(4096, 8192);
    n->msgs = aligned_alloc(4096, 64 * MSG);
    memset(n->record, 0, 8192);
    memset(n->msgs, 0, 64 * MSG);
    check(rs_rnic_reg_mr(n->pd, n->region, REGION, RS_ACCESS_REMOTE_READ | RS_ACCESS_REMOTE_WRITE, &n->region_mr),
          "reg_mr");
    check(rs_rnic_reg_mr(n->pd, n->record, 8192, RS_ACCESS_REMOTE_WRITE, &n->record_mr), "reg_mr");
    check(rs_rnic_reg_mr(n->pd, n->msgs, 64 * MSG, RS_ACCESS_LOCAL_WRITE, &n->msgs_mr), "reg_mr");
    struct rs_rnic_qp_attr rc = { .type = RS_QPT_RC, .send_cq = n->cq, .recv_cq = n->cq, .max_send_wr = 32,
                                  .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1, .qos = n->rc_qos };
    check(rs_rnic_create_qp(n->pd, &rc, &n->rc), "create RC QP");
    struct rs_rnic_qp_attr ud = { .type = RS_QPT_UD, .send_cq = n->ud_send_cq, .recv_cq = n->ud_cq, .max_send_wr = 32,
                                  .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1, .qos = n->ud_qos,
                                  .record_timeout_ms = 2000 };
    check(rs_rnic_create_qp(n->pd, &ud, &n->ud), "create UD QP");
    struct sockaddr_in ua = addr_of(local, ud_port);
    check(rs_rnic_ud_bind(n->ud, (struct sockaddr *)&ua, sizeof(ua)), "ud_bind");
    struct sockaddr_storage bound;
    check(rs_rnic_ud_local_addr(n->ud, &bound), "ud_local_addr");
    say("UD QP %u bound to port %u, traffic class %u; RC QP %u, traffic class %u", rs_rnic_qp_num(n->ud),
        ntohs(((struct sockaddr_in *)&bound)->sin_port), n->ud_qos.tclass, rs_rnic_qp_num(n->rc), n->rc_qos.tclass);
}

static struct rs_rnic_ud_peer *resolve(struct node *n, const struct sockaddr *to)
{
    struct rs_rnic_ud_peer *peer;
    check(rs_rnic_ud_resolve_peer(n->ud, n->cm, to, NULL, WAIT_MS, NULL, &peer), "ud_resolve_peer");
    struct rs_rnic_cm_event ev;
    event(n->cm, RS_RNIC_CM_EV_UD_PEER_RESOLVED, &ev);
    return peer;
}

static int server(const char *local, int port)
{
    struct node n;
    memset(&n, 0, sizeof(n));
    n.rc_qos.tclass = (uint8_t)(atoi(getenv("DEMO_RC_DSCP") ? getenv("DEMO_RC_DSCP") : "46") << 2);
    n.ud_qos.tclass = (uint8_t)(atoi(getenv("DEMO_UD_DSCP") ? getenv("DEMO_UD_DSCP") : "26") << 2);
    node_open(&n, local, port + 1);
    fill(n.region, REGION, 1);
    for (int i = 0; i < count + 2; i++)
        post_recv(n.rc, n.msgs + (size_t)i * MSG, MSG, n.msgs_mr->lkey, (uint64_t)i);
    for (int i = 0; i < count; i++)
        post_recv(n.ud, n.msgs + (size_t)(32 + i) * MSG, MSG, n.msgs_mr->lkey, 32 + (uint64_t)i);
    struct sockaddr_in la = addr_of(local, port);
    struct rs_rnic_listener *l;
    check(rs_rnic_listen(n.cm, (struct sockaddr *)&la, sizeof(la), 4, &l), "listen");
    say("listening on %s:%d (RC) and UD port %d", local, port, port + 1);
    struct rs_rnic_cm_event ev;
    event(n.cm, RS_RNIC_CM_EV_CONNECT_REQUEST, &ev);
    say("connect request: %.*s", (int)strnlen((char *)ev.private_data, ev.private_data_len), ev.private_data);
    struct offer offer = {
        .region = (uint64_t)(uintptr_t)n.region, .record = (uint64_t)(uintptr_t)n.record,
        .region_rkey = n.region_mr->rkey, .record_rkey = n.record_mr->rkey,
    };
    check(rs_rnic_accept(ev.request, n.rc, n.cm, &offer, sizeof(offer)), "accept");
    event(n.cm, RS_RNIC_CM_EV_ESTABLISHED, &ev);
    say("RC established");
    struct rs_rnic_wc wc;
    for (int i = 0; i < count; i++) {
        completion(n.cq, &wc, "RC receive");
        if (wc.byte_len != MSG || !same(n.msgs + (size_t)wc.wr_id * MSG, MSG, 100 + (uint32_t)i))
            die("RC SEND %d arrived wrong (%u bytes)", i, wc.byte_len);
    }
    say("%d RC SENDs received intact", count);
    completion(n.cq, &wc, "RC receive (writes done)");
    for (int i = 0; i < count; i++) {
        if (!same(n.region + (size_t)i * 4096, BLOCK, 200 + (uint32_t)i))
            die("RDMA WRITE %d did not land", i);
    }
    say("%d RDMA WRITEs landed intact", count);
    /* UD: each client datagram is answered from our own UD QP, to the address the completion names. */
    struct rs_rnic_ud_peer *back = NULL;
    for (int i = 0; i < count; i++) {
        completion(n.ud_cq, &wc, "UD receive");
        if (wc.opcode != RS_WC_RECV || wc.byte_len != MSG ||
            !same(n.msgs + (size_t)(wc.wr_id) * MSG, MSG, 300 + (uint32_t)i))
            die("UD SEND %d arrived wrong", i);
        if (!back)
            back = resolve(&n, (struct sockaddr *)&wc.src);
        uint8_t *reply = n.msgs + (size_t)(48 + i) * MSG;
        fill(reply, MSG, 400 + (uint32_t)i);
        post(n.ud, RS_WR_SEND, reply, MSG, n.msgs_mr->lkey, 0, 0, back, 500 + (uint64_t)i);
        completion(n.ud_send_cq, &wc, "UD SEND (reply)");
    }
    say("%d UD SENDs received intact and answered", count);
    completion(n.ud_cq, &wc, "WRITE_RECORD");
    if (wc.opcode != RS_WC_RECV_WRITE_RECORD || wc.record.msg_len != RECORD_LEN || wc.byte_len != RECORD_LEN ||
        !same(n.record, RECORD_LEN, 600))
        die("WRITE_RECORD arrived wrong (opcode %d, %u valid bytes, map %llx)", (int)wc.opcode, wc.byte_len,
            (unsigned long long)wc.record.valid_map);
    say("WRITE_RECORD of %d bytes placed, valid map %llx, segment %u bytes", RECORD_LEN,
        (unsigned long long)wc.record.valid_map, wc.record.seg_len);
    completion(n.cq, &wc, "RC receive (bye)");
    event(n.cm, RS_RNIC_CM_EV_DISCONNECTED, &ev);
    say("disconnected");
    if (back)
        rs_rnic_ud_peer_free(back);
    rs_rnic_listener_close(l);
    say("OK");
    return 0;
}

static int client(const char *local, const char *server_addr, int port)
{
    struct node n;
    memset(&n, 0, sizeof(n));
    n.rc_qos.tclass = (uint8_t)(atoi(getenv("DEMO_RC_DSCP") ? getenv("DEMO_RC_DSCP") : "46") << 2);
    n.ud_qos.tclass = (uint8_t)(atoi(getenv("DEMO_UD_DSCP") ? getenv("DEMO_UD_DSCP") : "26") << 2);
    node_open(&n, local, 0);
    for (int i = 0; i < count; i++)
        post_recv(n.ud, n.msgs + (size_t)(32 + i) * MSG, MSG, n.msgs_mr->lkey, 32 + (uint64_t)i);
    struct sockaddr_in sa = addr_of(server_addr, port);
    static const char hello[] = "rdmasock verbs demo";
    check(rs_rnic_connect(n.rc, n.cm, (struct sockaddr *)&sa, sizeof(sa), hello, sizeof(hello), WAIT_MS),
          "connect");
    struct rs_rnic_cm_event ev;
    event(n.cm, RS_RNIC_CM_EV_ESTABLISHED, &ev);
    struct offer offer;
    if (ev.private_data_len < sizeof(offer))
        die("accept carried %u bytes", ev.private_data_len);
    memcpy(&offer, ev.private_data, sizeof(offer));
    say("RC established; server region rkey %#x", offer.region_rkey);
    struct rs_rnic_wc wc;
    for (int i = 0; i < count; i++) {
        uint8_t *m = n.msgs + (size_t)i * MSG;
        fill(m, MSG, 100 + (uint32_t)i);
        post(n.rc, RS_WR_SEND, m, MSG, n.msgs_mr->lkey, 0, 0, NULL, (uint64_t)i);
        completion(n.cq, &wc, "RC SEND");
    }
    say("%d RC SENDs done", count);
    for (int i = 0; i < count; i++) {
        uint8_t *b = n.region + (size_t)i * 4096;
        fill(b, BLOCK, 200 + (uint32_t)i);
        post(n.rc, RS_WR_RDMA_WRITE, b, BLOCK, n.region_mr->lkey, offer.region + (uint64_t)i * 4096,
             offer.region_rkey, NULL, 10 + (uint64_t)i);
        completion(n.cq, &wc, "RDMA WRITE");
    }
    post(n.rc, RS_WR_SEND, n.msgs, 8, n.msgs_mr->lkey, 0, 0, NULL, 20);
    completion(n.cq, &wc, "RC SEND (writes done)");
    say("%d RDMA WRITEs done", count);
    for (int i = 0; i < count; i++) {
        uint8_t *b = n.region + 32768 + (size_t)i * BLOCK;
        memset(b, 0, BLOCK);
        size_t off = 32768 + (size_t)i * BLOCK;
        post(n.rc, RS_WR_RDMA_READ, b, BLOCK, n.region_mr->lkey, offer.region + off, offer.region_rkey, NULL,
             30 + (uint64_t)i);
        completion(n.cq, &wc, "RDMA READ");
        /* The server filled its whole region with pattern 1: compare against that slice. */
        uint8_t *want = malloc(REGION);
        fill(want, REGION, 1);
        if (memcmp(b, want + off, BLOCK) != 0)
            die("RDMA READ %d returned the wrong bytes", i);
        free(want);
    }
    say("%d RDMA READs returned the server's bytes", count);
    struct rs_rnic_qos later = n.rc_qos;
    later.tclass = (uint8_t)(atoi(getenv("DEMO_RC_DSCP2") ? getenv("DEMO_RC_DSCP2") : "34") << 2);
    check(rs_rnic_qp_set_qos(n.rc, &later), "qp_set_qos (connected)");
    say("RC QP traffic class now %u", later.tclass);
    struct sockaddr_in ua = addr_of(server_addr, port + 1);
    struct rs_rnic_ud_peer *peer = resolve(&n, (struct sockaddr *)&ua);
    for (int i = 0; i < count; i++) {
        uint8_t *m = n.msgs + (size_t)(8 + i) * MSG;
        fill(m, MSG, 300 + (uint32_t)i);
        post(n.ud, RS_WR_SEND, m, MSG, n.msgs_mr->lkey, 0, 0, peer, 40 + (uint64_t)i);
        completion(n.ud_send_cq, &wc, "UD SEND");
        if (wc.opcode != RS_WC_SEND)
            die("UD SEND completion opcode %d", (int)wc.opcode);
        completion(n.ud_cq, &wc, "UD receive (reply)");
        if (wc.opcode != RS_WC_RECV || !same(n.msgs + (size_t)wc.wr_id * MSG, MSG, 400 + (uint32_t)i))
            die("UD reply %d arrived wrong", i);
    }
    say("%d UD SENDs answered intact", count);
    uint8_t *rec = n.region + 49152;
    fill(rec, RECORD_LEN, 600);
    post(n.ud, RS_WR_WRITE_RECORD, rec, RECORD_LEN, n.region_mr->lkey, offer.record, offer.record_rkey, peer, 50);
    completion(n.ud_send_cq, &wc, "WRITE_RECORD");
    say("WRITE_RECORD of %d bytes sent", RECORD_LEN);
    post(n.rc, RS_WR_SEND, n.msgs, 8, n.msgs_mr->lkey, 0, 0, NULL, 60);
    completion(n.cq, &wc, "RC SEND (bye)");
    check(rs_rnic_disconnect(n.rc), "disconnect");
    event(n.cm, RS_RNIC_CM_EV_DISCONNECTED, &ev);
    say("disconnected");
    rs_rnic_ud_peer_free(peer);
    say("OK");
    return 0;
}

int main(int argc, char **argv)
{
    rs_log_configure_from_env();
    if (getenv("DEMO_COUNT"))
        count = atoi(getenv("DEMO_COUNT"));
    if (count < 1 || count > 16)
        count = 4;
    if (argc == 4 && strcmp(argv[1], "server") == 0) {
        role = "server";
        return server(argv[2], atoi(argv[3]));
    }
    if (argc == 5 && strcmp(argv[1], "client") == 0) {
        role = "client";
        return client(argv[2], argv[3], atoi(argv[4]));
    }
    fprintf(stderr, "usage: %s server LOCAL_ADDR PORT | client LOCAL_ADDR SERVER_ADDR PORT\n"
                    "env: DEMO_COUNT (4), DEMO_RC_DSCP (46), DEMO_UD_DSCP (26)\n", argv[0]);
    return 2;
}
