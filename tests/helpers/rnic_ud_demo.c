/*
 * rnic_ud_demo PORT_A PORT_B: two datagram-iWARP QPs of the software RNIC on 127.0.0.1 exchange one of each
 * datagram operation, so that tests/suites/dgram_tshark.sh can check with tshark what went on the wire:
 *   A -> B  SEND (100 B), SEND with solicited event, a segmented SEND (100,000 B = 2 segments),
 *   A -> B  RDMA Write-Record (3,000 B) into a region B registered,
 *   A -> B  RDMA Read Request of 2,000 B; B answers with a Read Response,
 *   A -> B  RDMA Read Request with a wrong STag; B answers with a Terminate.
 * Every payload is checked on arrival; the exit status is 0 only when every operation completed as expected.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rnic/rnic.h"

#define FAIL(...) do { fprintf(stderr, "rnic_ud_demo: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define CHECK(expr) do { int rc_ = (expr); if (rc_ != 0) FAIL("%s failed: %s", #expr, strerror(-rc_)); } while (0)

struct end {
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq;
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct sockaddr_in loopback(uint16_t port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static void end_open(struct rs_rnic *rnic, uint16_t port, struct end *e)
{
    CHECK(rs_rnic_alloc_pd(rnic, &e->pd));
    CHECK(rs_rnic_create_cq(rnic, 256, &e->cq));
    CHECK(rs_rnic_cm_create(rnic, &e->cm));
    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_UD, .send_cq = e->cq, .recv_cq = e->cq, .max_send_wr = 64, .max_recv_wr = 64,
        .max_send_sge = 1, .max_recv_sge = 1, .sq_sig_all = true, .ud_read_timeout_ms = 2000,
        .record_timeout_ms = 2000,
    };
    CHECK(rs_rnic_create_qp(e->pd, &attr, &e->qp));
    struct sockaddr_in local = loopback(port);
    CHECK(rs_rnic_ud_bind(e->qp, (struct sockaddr *)&local, sizeof(local)));
}

static struct rs_rnic_ud_peer *resolve(struct end *from, uint16_t port)
{
    struct sockaddr_in to = loopback(port);
    struct rs_rnic_ud_peer *peer = NULL;
    CHECK(rs_rnic_ud_resolve_peer(from->qp, from->cm, (struct sockaddr *)&to, NULL, 1000, NULL, &peer));
    struct rs_rnic_cm_event ev;
    uint64_t end = now_ms() + 2000;
    int rc;
    while ((rc = rs_rnic_cm_get_event(from->cm, &ev)) == -EAGAIN && now_ms() < end)
        ;
    if (rc != 0 || ev.type != RS_RNIC_CM_EV_UD_PEER_RESOLVED)
        FAIL("peer 127.0.0.1:%u not resolved", port);
    return peer;
}

/* Waits for the next completion on cq with the expected opcode and status. */
static struct rs_rnic_wc expect(struct rs_rnic_cq *cq, enum rs_rnic_wc_opcode opcode, enum rs_rnic_wc_status status)
{
    struct rs_rnic_wc wc;
    uint64_t end = now_ms() + 5000;
    for (;;) {
        int n = rs_rnic_poll_cq(cq, 1, &wc);
        if (n < 0)
            FAIL("poll_cq: %s", strerror(-n));
        if (n == 1)
            break;
        if (now_ms() > end)
            FAIL("no completion (expected opcode %d)", opcode);
    }
    if (wc.opcode != opcode || wc.status != status)
        FAIL("completion opcode %d status %d, expected %d/%d", wc.opcode, wc.status, opcode, status);
    return wc;
}

static struct rs_rnic_mr *reg(struct end *e, size_t len, unsigned access, uint8_t fill)
{
    uint8_t *p = malloc(len);
    if (!p)
        FAIL("out of memory");
    memset(p, fill, len);
    struct rs_rnic_mr *mr;
    CHECK(rs_rnic_reg_mr(e->pd, p, len, access, &mr));
    return mr;
}

static void post_recv(struct end *e, struct rs_rnic_mr *mr)
{
    struct rs_rnic_sge sge = { (uintptr_t)mr->addr, (uint32_t)mr->length, mr->lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
    CHECK(rs_rnic_post_recv(e->qp, &wr, &bad));
}

static void post(struct end *e, struct rs_rnic_ud_peer *peer, enum rs_rnic_wr_opcode op, unsigned flags,
                 struct rs_rnic_mr *mr, uint32_t len, uint64_t remote_addr, uint32_t rkey)
{
    struct rs_rnic_sge sge = { (uintptr_t)mr->addr, len, mr->lkey };
    struct rs_rnic_send_wr wr = {
        .wr_id = 2, .opcode = op, .flags = flags, .sg_list = &sge, .num_sge = 1, .ud_peer = peer,
        .rdma = { .remote_addr = remote_addr, .rkey = rkey },
    }, *bad;
    CHECK(rs_rnic_post_send(e->qp, &wr, &bad));
}

int main(int argc, char **argv)
{
    if (argc != 3)
        FAIL("usage: rnic_ud_demo PORT_A PORT_B");
    uint16_t port_a = (uint16_t)atoi(argv[1]), port_b = (uint16_t)atoi(argv[2]);
    struct rs_rnic *rnic;
    CHECK(rs_rnic_open(RS_RNIC_KIND_SOFT, NULL, &rnic));
    struct end a, b;
    end_open(rnic, port_a, &a);
    end_open(rnic, port_b, &b);
    struct rs_rnic_ud_peer *to_b = resolve(&a, port_b);

    const unsigned rw = RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ;
    struct rs_rnic_mr *src = reg(&a, 100000, RS_ACCESS_LOCAL_WRITE, 0);
    for (size_t i = 0; i < src->length; i++)
        ((uint8_t *)src->addr)[i] = (uint8_t)(i * 7 + 3);
    struct rs_rnic_mr *sink = reg(&b, 100000, RS_ACCESS_LOCAL_WRITE, 0);

    /* SEND, SEND with SE, segmented SEND. */
    const uint32_t send_sizes[] = { 100, 64, 100000 };
    for (int i = 0; i < 3; i++) {
        memset(sink->addr, 0, sink->length);
        post_recv(&b, sink);
        post(&a, to_b, RS_WR_SEND, i == 1 ? RS_SEND_SOLICITED : 0, src, send_sizes[i], 0, 0);
        expect(a.cq, RS_WC_SEND, RS_WC_SUCCESS);
        struct rs_rnic_wc wc = expect(b.cq, RS_WC_RECV, RS_WC_SUCCESS);
        if (wc.byte_len != send_sizes[i] || memcmp(sink->addr, src->addr, send_sizes[i]) != 0)
            FAIL("SEND of %u bytes arrived damaged", send_sizes[i]);
    }

    /* Write-Record into a region B exposes; B posts nothing. */
    struct rs_rnic_mr *region = reg(&b, 8192, rw, 0);
    post(&a, to_b, RS_WR_WRITE_RECORD, 0, src, 3000, (uintptr_t)region->addr + 1000, region->rkey);
    expect(a.cq, RS_WC_WRITE_RECORD, RS_WC_SUCCESS);
    struct rs_rnic_wc rec = expect(b.cq, RS_WC_RECV_WRITE_RECORD, RS_WC_SUCCESS);
    if (rec.record.offset != 1000 || rec.record.msg_len != 3000 || rec.record.valid_map != 1 ||
        memcmp((uint8_t *)region->addr + 1000, src->addr, 3000) != 0)
        FAIL("Write-Record placed wrongly");

    /* RDMA Read of B's region into A, then one with a wrong STag (answered by a Terminate). */
    struct rs_rnic_mr *landing = reg(&a, 4096, RS_ACCESS_LOCAL_WRITE, 0);
    post(&a, to_b, RS_WR_RDMA_READ, 0, landing, 2000, (uintptr_t)region->addr + 1000, region->rkey);
    expect(a.cq, RS_WC_RDMA_READ, RS_WC_SUCCESS);
    if (memcmp(landing->addr, src->addr, 2000) != 0)
        FAIL("RDMA Read returned wrong data");
    post(&a, to_b, RS_WR_RDMA_READ, 0, landing, 100, (uintptr_t)region->addr, region->rkey ^ 0x5a);
    expect(a.cq, RS_WC_RDMA_READ, RS_WC_REM_ACCESS_ERR);

    puts("rnic_ud_demo: SEND, SEND+SE, segmented SEND, Write-Record, Read, refused Read: all as expected");
    return 0;
}
