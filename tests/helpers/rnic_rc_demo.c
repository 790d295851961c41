/*
 * rnic_rc_demo: connects two soft-RNIC RC QPs over 127.0.0.1 (one process, both ends) and runs one of each
 * RDMAP operation, ending with an access the target refuses, so a capture of its traffic shows the whole iWARP
 * vocabulary: MPA Request/Reply with private data, Send, Send with Solicited Event, RDMA Write (several FPDUs),
 * RDMA Read Request and Read Response (several FPDUs), Send with Invalidate, and a Terminate (DDP tagged buffer
 * error, invalid STag) after an RDMA Write to the invalidated STag. Used by tests/suites/iwarp_tshark.sh.
 *
 *   usage: rnic_rc_demo [--port N] [--mpa-rev 1|2]
 *   --mpa-rev 1 sets RDMASOCK_SOFT_MPA_REV=1 before the RNIC opens: MPA rev 1 (no IRD/ORD block), which tshark 4.0
 *   decodes without warnings. Exit status 0 when every step behaved as expected; each step prints one line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rnic/rnic.h"

#define WAIT_MS 5000

static int failures;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok:  " : "FAIL:", what);
    if (!ok)
        failures++;
}

static int die(const char *what, int rc)
{
    fprintf(stderr, "rnic_rc_demo: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(2);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int next_event(struct rs_rnic_cm *cm, struct rs_rnic_cm_event *ev)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    for (;;) {
        int r = rs_rnic_cm_get_event(cm, ev);
        if (r != -EAGAIN)
            return r;
        if (now_ms() > deadline)
            return -ETIMEDOUT;
        struct pollfd p = { .fd = rs_rnic_cm_fd(cm), .events = POLLIN };
        poll(&p, 1, 50);
    }
}

static int next_wc(struct rs_rnic_cq *cq, struct rs_rnic_wc *wc)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    for (;;) {
        int r = rs_rnic_poll_cq(cq, 1, wc);
        if (r != 0)
            return r;
        if (now_ms() > deadline)
            return -ETIMEDOUT;
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
}

struct end {
    struct rs_rnic_cq *cq;
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
};

static void make_end(struct rs_rnic *rnic, struct rs_rnic_pd *pd, struct end *e)
{
    int r;
    if ((r = rs_rnic_create_cq(rnic, 256, &e->cq)) || (r = rs_rnic_cm_create(rnic, &e->cm)))
        die("cq/cm", r);
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = e->cq, .recv_cq = e->cq, .max_send_wr = 64, .max_recv_wr = 64,
        .max_send_sge = 1, .max_recv_sge = 1,
    };
    if ((r = rs_rnic_create_qp(pd, &attr, &e->qp)))
        die("create_qp", r);
}

static void post(struct rs_rnic_qp *qp, uint64_t id, enum rs_rnic_wr_opcode op, unsigned flags, void *buf,
                 uint32_t len, struct rs_rnic_mr *mr, uint64_t raddr, uint32_t rkey)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, len, mr->lkey };
    struct rs_rnic_send_wr wr = { .wr_id = id, .opcode = op, .flags = flags | RS_SEND_SIGNALED, .sg_list = &sge,
                                  .num_sge = 1 };
    wr.rdma.remote_addr = raddr;
    wr.rdma.rkey = rkey;
    wr.invalidate_rkey = rkey;
    int r = rs_rnic_post_send(qp, &wr, NULL);
    if (r)
        die("post_send", r);
}

static void post_recv(struct rs_rnic_qp *qp, uint64_t id, void *buf, uint32_t len, struct rs_rnic_mr *mr)
{
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, len, mr->lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 };
    int r = rs_rnic_post_recv(qp, &wr, NULL);
    if (r)
        die("post_recv", r);
}

int main(int argc, char **argv)
{
    unsigned port = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) {
            port = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--mpa-rev") == 0 && i + 1 < argc) {
            setenv("RDMASOCK_SOFT_MPA_REV", argv[++i], 1);
        } else {
            fprintf(stderr, "usage: %s [--port N] [--mpa-rev 1|2]\n", argv[0]);
            return 2;
        }
    }
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);

    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    int r;
    if ((r = rs_rnic_open(RS_RNIC_KIND_SOFT, (struct sockaddr *)&addr, &rnic)))
        die("rs_rnic_open", r);
    if ((r = rs_rnic_alloc_pd(rnic, &pd)))
        die("alloc_pd", r);
    struct end act, pas;
    make_end(rnic, pd, &act);
    make_end(rnic, pd, &pas);
    struct rs_rnic_listener *listener;
    if ((r = rs_rnic_listen(pas.cm, (struct sockaddr *)&addr, sizeof(addr), 4, &listener)))
        die("listen", r);
    struct sockaddr_storage laddr;
    rs_rnic_listener_addr(listener, &laddr);
    printf("listening on 127.0.0.1:%u\n", ntohs(((struct sockaddr_in *)&laddr)->sin_port));

    /* Buffers: the passive side's target region, a region it lets the peer invalidate, receive buffers. */
    enum { REGION = 65536, XFER = 40000 };
    static uint8_t region[REGION], inval_region[4096], rbuf[8][256], lbuf[REGION], rback[REGION];
    struct rs_rnic_mr *region_mr, *inval_mr, *rbuf_mr, *lbuf_mr, *rback_mr;
    if ((r = rs_rnic_reg_mr(pd, region, REGION, RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ, &region_mr)) ||
        (r = rs_rnic_reg_mr(pd, inval_region, sizeof(inval_region), RS_ACCESS_REMOTE_WRITE, &inval_mr)) ||
        (r = rs_rnic_reg_mr(pd, rbuf, sizeof(rbuf), RS_ACCESS_LOCAL_WRITE, &rbuf_mr)) ||
        (r = rs_rnic_reg_mr(pd, lbuf, sizeof(lbuf), RS_ACCESS_LOCAL_WRITE, &lbuf_mr)) ||
        (r = rs_rnic_reg_mr(pd, rback, sizeof(rback), RS_ACCESS_LOCAL_WRITE, &rback_mr)))
        die("reg_mr", r);
    for (int i = 0; i < 8; i++)
        post_recv(pas.qp, (uint64_t)i, rbuf[i], sizeof(rbuf[i]), rbuf_mr);

    /* Connection with private data both ways. */
    static const char req_pd[] = "rdmasock demo: request";
    static const char rep_pd[] = "rdmasock demo: reply";
    if ((r = rs_rnic_connect(act.qp, act.cm, (struct sockaddr *)&laddr, sizeof(struct sockaddr_in), req_pd,
                             sizeof(req_pd), WAIT_MS)))
        die("connect", r);
    struct rs_rnic_cm_event ev;
    if (next_event(pas.cm, &ev) || ev.type != RS_RNIC_CM_EV_CONNECT_REQUEST)
        die("no connect request", -EPROTO);
    check(ev.private_data_len == sizeof(req_pd) && memcmp(ev.private_data, req_pd, sizeof(req_pd)) == 0,
          "MPA Request private data arrived");
    if ((r = rs_rnic_accept(ev.request, pas.qp, pas.cm, rep_pd, sizeof(rep_pd))))
        die("accept", r);
    r = next_event(act.cm, &ev);
    check(r == 0 && ev.type == RS_RNIC_CM_EV_ESTABLISHED && ev.private_data_len == sizeof(rep_pd) &&
              memcmp(ev.private_data, rep_pd, sizeof(rep_pd)) == 0,
          "ESTABLISHED with the MPA Reply private data");
    r = next_event(pas.cm, &ev);
    check(r == 0 && ev.type == RS_RNIC_CM_EV_ESTABLISHED, "passive side ESTABLISHED");

    struct rs_rnic_wc wc;
    /* Send */
    memcpy(lbuf, "hello, iWARP", 12);
    post(act.qp, 1, RS_WR_SEND, 0, lbuf, 12, lbuf_mr, 0, 0);
    check(next_wc(act.cq, &wc) == 1 && wc.status == RS_WC_SUCCESS && wc.wr_id == 1, "Send completed");
    check(next_wc(pas.cq, &wc) == 1 && wc.status == RS_WC_SUCCESS && wc.byte_len == 12 &&
              memcmp(rbuf[0], "hello, iWARP", 12) == 0,
          "Send received");
    /* Send with Solicited Event */
    post(act.qp, 2, RS_WR_SEND, RS_SEND_SOLICITED, lbuf, 5, lbuf_mr, 0, 0);
    check(next_wc(act.cq, &wc) == 1 && wc.status == RS_WC_SUCCESS, "Send with SE completed");
    check(next_wc(pas.cq, &wc) == 1 && wc.status == RS_WC_SUCCESS && (wc.flags & RS_WC_SOLICITED),
          "Send with SE received as solicited");
    /* RDMA Write of several FPDUs, then a Send that tells the target it is there */
    for (int i = 0; i < XFER; i++)
        lbuf[i] = (uint8_t)(i * 31 + 7);
    post(act.qp, 3, RS_WR_RDMA_WRITE, 0, lbuf, XFER, lbuf_mr, (uint64_t)(uintptr_t)region, region_mr->rkey);
    post(act.qp, 4, RS_WR_SEND, 0, lbuf, 4, lbuf_mr, 0, 0);
    check(next_wc(act.cq, &wc) == 1 && wc.wr_id == 3 && wc.status == RS_WC_SUCCESS, "RDMA Write completed");
    check(next_wc(act.cq, &wc) == 1 && wc.wr_id == 4 && wc.status == RS_WC_SUCCESS, "notice Send completed");
    check(next_wc(pas.cq, &wc) == 1 && wc.status == RS_WC_SUCCESS && memcmp(region, lbuf, XFER) == 0,
          "RDMA Write data placed before the notice arrived");
    /* RDMA Read back */
    post(act.qp, 5, RS_WR_RDMA_READ, 0, rback, XFER, rback_mr, (uint64_t)(uintptr_t)region, region_mr->rkey);
    check(next_wc(act.cq, &wc) == 1 && wc.wr_id == 5 && wc.status == RS_WC_SUCCESS &&
              memcmp(rback, region, XFER) == 0,
          "RDMA Read returned the region's bytes");
    /* Send with Invalidate */
    uint32_t inval_rkey = inval_mr->rkey;
    post(act.qp, 6, RS_WR_SEND_WITH_INVALIDATE, 0, lbuf, 8, lbuf_mr, 0, inval_rkey);
    check(next_wc(act.cq, &wc) == 1 && wc.status == RS_WC_SUCCESS, "Send with Invalidate completed");
    check(next_wc(pas.cq, &wc) == 1 && wc.status == RS_WC_SUCCESS && (wc.flags & RS_WC_WITH_INVALIDATE) &&
              wc.invalidated_rkey == inval_rkey,
          "Send with Invalidate received, STag invalidated");
    /* RDMA Write to the invalidated STag: the target refuses it with a Terminate and both QPs fail. */
    post(act.qp, 7, RS_WR_RDMA_WRITE, 0, lbuf, 100, lbuf_mr, (uint64_t)(uintptr_t)inval_region, inval_rkey);
    r = next_event(pas.cm, &ev);
    check(r == 0 && ev.type == RS_RNIC_CM_EV_ERROR, "target reported ERROR after refusing the Write");
    r = next_event(act.cm, &ev);
    check(r == 0 && ev.type == RS_RNIC_CM_EV_ERROR, "initiator reported ERROR after the Terminate");
    int untouched = 1;
    for (size_t i = 0; i < sizeof(inval_region); i++)
        untouched &= inval_region[i] == 0;
    check(untouched, "nothing was written to the invalidated region");
    check(rs_rnic_qp_state(act.qp) == RS_QPS_ERROR && rs_rnic_qp_state(pas.qp) == RS_QPS_ERROR,
          "both QPs in ERROR");

    rs_rnic_destroy_qp(act.qp);
    rs_rnic_destroy_qp(pas.qp);
    rs_rnic_listener_close(listener);
    rs_rnic_dereg_mr(region_mr);
    rs_rnic_dereg_mr(inval_mr);
    rs_rnic_dereg_mr(rbuf_mr);
    rs_rnic_dereg_mr(lbuf_mr);
    rs_rnic_dereg_mr(rback_mr);
    rs_rnic_cm_destroy(act.cm);
    rs_rnic_cm_destroy(pas.cm);
    rs_rnic_destroy_cq(act.cq);
    rs_rnic_destroy_cq(pas.cq);
    rs_rnic_dealloc_pd(pd);
    rs_rnic_close(rnic);
    printf("%s\n", failures ? "demo FAILED" : "demo ok");
    return failures ? 1 : 0;
}
