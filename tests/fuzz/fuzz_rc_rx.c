/*
 * Fuzz target: arbitrary byte streams into the RC receive machine of a soft-RNIC QP in RTS (rs_soft_rc_rx_buffer:
 * the socket is bypassed, none of the checks are). Registered regions sit between PROT_NONE guard pages and the
 * posted receive buffers between canaries, so a byte placed outside what the checks allow crashes or fails here.
 *
 * Input: the first byte selects how the rest is used.
 *   bit 0 clear  the rest is the raw TCP byte stream (framing, CRC and all, as a peer could send it).
 *   bit 0 set    the rest is a list of ULPDUs, each [u16 big-endian length][bytes]; the harness frames each one
 *                as an FPDU with a correct CRC, so the fuzzer gets past MPA into DDP/RDMAP validation.
 *   bit 1 set    (with bit 0) small STag values (< 0x100) in tagged headers, Read Requests and Send with Invalidate
 *                are replaced by the STags of the test buffers (value % 5 picks one: four regions with different
 *                access and PD, and the posted READ's sink), and small tagged offsets (< 2^32) become that
 *                buffer's address plus the offset read as a signed 32-bit number.
 *   bit 2 set    (with bit 0) the last FPDU's CRC is wrong.
 *   bit 3 set    an RDMA READ of 3000 bytes is posted first, so Read Responses have something to match.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rnic/rnic.h"
#include "rnic/soft/mpa.h"
#include "rnic/soft/rc.h"

#define PAGE 4096
#define REGION_PAGES 2
#define RECV_SLOTS 4
#define RECV_LEN 1000
#define CANARY 0xc3

struct region {
    uint8_t *map;               /* guard | region | guard */
    uint8_t *data;
    size_t len;
    struct rs_rnic_mr *mr;
};

static struct {
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd, *other_pd;
    struct rs_rnic_cq *cq;
    struct region r[4];         /* rw, read-only, write-only, other PD */
    uint8_t *recv_raw;          /* canary | slot | canary ... */
    struct rs_rnic_mr *recv_mr;
    uint8_t *read_sink;         /* guard | page | guard: the posted READ's target */
    struct rs_rnic_mr *sink_mr;
} G;

static void region_init(struct region *r, struct rs_rnic_pd *pd, unsigned access)
{
    r->len = REGION_PAGES * PAGE;
    r->map = mmap(NULL, (REGION_PAGES + 2) * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->map == MAP_FAILED)
        abort();
    r->data = r->map + PAGE;
    if (mprotect(r->data, r->len, PROT_READ | PROT_WRITE) != 0)
        abort();
    memset(r->data, 0x5a, r->len);
    if (rs_rnic_reg_mr(pd, r->data, r->len, access, &r->mr) != 0)
        abort();
}

static void init_once(void)
{
    if (G.rnic)
        return;
    if (rs_rnic_open(RS_RNIC_KIND_SOFT, NULL, &G.rnic) != 0 || rs_rnic_alloc_pd(G.rnic, &G.pd) != 0 ||
        rs_rnic_alloc_pd(G.rnic, &G.other_pd) != 0 || rs_rnic_create_cq(G.rnic, 4096, &G.cq) != 0)
        abort();
    region_init(&G.r[0], G.pd, RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ);
    region_init(&G.r[1], G.pd, RS_ACCESS_REMOTE_READ);
    region_init(&G.r[2], G.pd, RS_ACCESS_REMOTE_WRITE);
    region_init(&G.r[3], G.other_pd, RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ);
    size_t raw = RECV_SLOTS * (RECV_LEN + 64) + 64;
    G.recv_raw = malloc(raw);
    if (!G.recv_raw)
        abort();
    memset(G.recv_raw, CANARY, raw);
    if (rs_rnic_reg_mr(G.pd, G.recv_raw, raw, RS_ACCESS_LOCAL_WRITE, &G.recv_mr) != 0)
        abort();
    G.read_sink = mmap(NULL, 3 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (G.read_sink == MAP_FAILED || mprotect(G.read_sink + PAGE, PAGE, PROT_READ | PROT_WRITE) != 0)
        abort();
    if (rs_rnic_reg_mr(G.pd, G.read_sink + PAGE, PAGE, RS_ACCESS_LOCAL_WRITE, &G.sink_mr) != 0)
        abort();
}

static uint8_t *recv_slot(int i)
{
    return G.recv_raw + 64 + (size_t)i * (RECV_LEN + 64);
}

/* Canaries between the receive slots never change: a receive is only written inside its SGE. */
static void check_canaries(void)
{
    for (size_t i = 0; i < 64; i++)
        if (G.recv_raw[i] != CANARY)
            abort();
    for (int s = 0; s < RECV_SLOTS; s++)
        for (size_t i = 0; i < 64; i++)
            if (recv_slot(s)[RECV_LEN + i] != CANARY)
                abort();
}

/* Small STag values name the test buffers: 0-3 the regions, 4 the posted READ's sink (its lkey is the sink STag
 * the Read Request advertised). */
static uint32_t stag_of(uint32_t v)
{
    return v % 5 == 4 ? G.sink_mr->lkey : G.r[v % 5].mr->rkey;
}

static uint64_t to_of(uint32_t v, uint64_t to)
{
    uint8_t *base = v % 5 == 4 ? G.read_sink + PAGE : G.r[v % 5].data;
    return (uint64_t)(uintptr_t)base + (uint64_t)(int64_t)(int32_t)(uint32_t)to;
}

/* Rewrites small STags/TOs of one ULPDU to the test regions (bit 1). */
static void fix_stags(uint8_t *u, size_t len)
{
    if (len < 2)
        return;
    bool tagged = (u[0] & RS_DDP_FLAG_TAGGED) != 0;
    uint8_t op = u[1] & 0x0f;
    if (tagged && len >= RS_DDP_TAGGED_HDR_LEN) {
        uint32_t s = rs_get_be32(u + 2);
        if (s < 0x100) {
            rs_put_be32(u + 2, stag_of(s));
            uint64_t to = rs_get_be64(u + 6);
            if (to >> 32 == 0)
                rs_put_be64(u + 6, to_of(s, to));
        }
    } else if (!tagged && op == RS_RDMAP_READ_REQUEST && len >= RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN) {
        uint8_t *rr = u + RS_DDP_UNTAGGED_HDR_LEN;
        uint32_t s = rs_get_be32(rr + 16);
        if (s < 0x100) {
            rs_put_be32(rr + 16, stag_of(s));
            uint64_t to = rs_get_be64(rr + 20);
            if (to >> 32 == 0)
                rs_put_be64(rr + 20, to_of(s, to));
        }
    } else if (!tagged && (op == RS_RDMAP_SEND_INVALIDATE || op == RS_RDMAP_SEND_SE_INVALIDATE) &&
               len >= RS_DDP_UNTAGGED_HDR_LEN) {
        uint32_t s = rs_get_be32(u + 2);
        if (s < 0x100)
            rs_put_be32(u + 2, stag_of(s));
    }
}

/* Frames the ULPDU list as FPDUs. Returns the stream length. */
static size_t frame_stream(const uint8_t *in, size_t len, uint8_t *out, size_t cap, uint8_t mode)
{
    size_t o = 0, last = 0;
    uint8_t ulpdu[65536];
    while (len >= 2) {
        size_t l = rs_get_be16(in);
        in += 2;
        len -= 2;
        if (l > len)
            l = len;
        memcpy(ulpdu, in, l);
        in += l;
        len -= l;
        if (mode & 2)
            fix_stags(ulpdu, l);
        int n = rs_mpa_fpdu_build(out + o, cap - o, ulpdu, l);
        if (n < 0)
            break;
        last = o;
        o += (size_t)n;
    }
    if ((mode & 4) && o > last + 4)
        out[o - 1] ^= 0x01;
    return o;
}

static void drain_fd(int fd)
{
    uint8_t buf[65536];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
}

static void drain_cq(void)
{
    struct rs_rnic_wc wc[64];
    while (rs_rnic_poll_cq(G.cq, 64, wc) > 0)
        ;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init_once();
    if (size < 1 || size > 200000)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    /* A Send with Invalidate of an earlier input must not leave a region unusable for the next ones. */
    for (int i = 0; i < 4; i++)
        if (rs_rnic_mr_rekey(G.r[i].mr) != 0)
            abort();

    struct rs_rnic_qp_attr attr = {
        .type = RS_QPT_RC, .send_cq = G.cq, .recv_cq = G.cq, .max_send_wr = 16, .max_recv_wr = 16,
        .max_send_sge = 2, .max_recv_sge = 2,
    };
    struct rs_rnic_qp *qp;
    if (rs_rnic_create_qp(G.pd, &attr, &qp) != 0)
        abort();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        abort();
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    if (rs_soft_rc_test_attach(qp, sv[0], 4, 4) != 0)
        abort();
    for (int i = 0; i < RECV_SLOTS; i++) {
        struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)recv_slot(i), RECV_LEN, G.recv_mr->lkey };
        struct rs_rnic_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
        if (rs_rnic_post_recv(qp, &wr, NULL) != 0)
            abort();
    }
    if (mode & 8) {
        struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)(G.read_sink + PAGE), 3000, G.sink_mr->lkey };
        struct rs_rnic_send_wr wr = {
            .wr_id = 99, .opcode = RS_WR_RDMA_READ, .flags = RS_SEND_SIGNALED, .sg_list = &sge, .num_sge = 1,
        };
        wr.rdma.remote_addr = 0x1000;
        wr.rdma.rkey = 0x4242;
        if (rs_rnic_post_send(qp, &wr, NULL) != 0)
            abort();
    }

    if (mode & 1) {
        static uint8_t stream[1 << 20];
        size_t n = frame_stream(data, size, stream, sizeof(stream), mode);
        rs_soft_rc_rx_buffer(qp, stream, n);
    } else {
        rs_soft_rc_rx_buffer(qp, data, size);
    }
    drain_fd(sv[1]);
    if (rs_rnic_destroy_qp(qp) != 0)
        abort();
    close(sv[1]);
    drain_cq();
    check_canaries();
    return 0;
}
