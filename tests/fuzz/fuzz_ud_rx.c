/*
 * Fuzz target: the soft RNIC's UD receive path, fed arbitrary datagrams through rs_soft_ud_rx_buffer (the same
 * code as the socket path after the read, checks included).
 *
 * Input: byte 0 steers, the rest is the datagram. Random bytes almost never name a live STag or an address inside
 * a region, so the steering byte lets the fuzzer patch them in and reach the placement code:
 *   bit 0      patch the STag field (tagged: STag; Read Request: source STag; Terminate: the echoed sink STag)
 *              with a real one, chosen by
 *   bits 1-2   0 writable region, 1 read-only region, 2 region of another PD, 3 the tag of a pending READ
 *   bit 3      rebase the tagged offsets (TO, Write-Record base TO, Read Request source TO) near the region,
 *              modulo twice its size, so both in- and out-of-bounds offsets are tried
 *   bit 4      recompute the CRC trailer (so the payload reaches placement)
 *   bit 5      claim to come from the peer the pending READ was sent to; bits 6-7 pick other sources
 * Every registered buffer fills whole pages between PROT_NONE guard pages, so a byte placed outside registered
 * memory crashes at once; receive buffers are re-posted as they complete, the READ re-issued when it finishes.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "rnic/rnic.h"
#include "rnic/soft/soft.h"
#include "rnic/soft/ud.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REGION_LEN (64u * 4096u)
#define RECV_LEN (17u * 4096u)      /* a two-segment SEND (64,512 + a little) fits */
#define RECVS 8

struct guarded {
    uint8_t *mem;
    size_t len;
    struct rs_rnic_mr *mr;
};

static struct {
    bool ready;
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd, *pd2;
    struct rs_rnic_cq *cq;
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
    struct guarded rw, ro, other, sink, recv[RECVS];
    int peer_fd;
    struct sockaddr_in peer_addr;
    struct rs_rnic_ud_peer *peer;
    uint32_t read_tag;
    uint8_t dgram[RS_UD_MAX_DATAGRAM + 64];
} F;

static void die(const char *what)
{
    (void)!write(2, what, strlen(what));
    abort();
}

/* len bytes of whole pages with an inaccessible page on each side. */
static void guarded_alloc(struct guarded *g, struct rs_rnic_pd *pd, size_t len, unsigned access)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *map = mmap(NULL, len + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        die("mmap\n");
    if (mprotect(map, page, PROT_NONE) || mprotect(map + page + len, page, PROT_NONE))
        die("mprotect\n");
    g->mem = map + page;
    g->len = len;
    if (rs_rnic_reg_mr(pd, g->mem, len, access, &g->mr))
        die("reg_mr\n");
}

static void post_recv(int i)
{
    struct rs_rnic_sge sge = { (uintptr_t)F.recv[i].mem, (uint32_t)F.recv[i].len, F.recv[i].mr->lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *bad;
    if (rs_rnic_post_recv(F.qp, &wr, &bad))
        die("post_recv\n");
}

/* Issues a READ to the fake peer and learns its tag from the request it receives. */
static void start_read(void)
{
    struct rs_rnic_sge sge = { (uintptr_t)F.sink.mem + 4096, 300, F.sink.mr->lkey };
    struct rs_rnic_send_wr wr = { .wr_id = 1000, .opcode = RS_WR_RDMA_READ, .flags = RS_SEND_SIGNALED,
                                  .sg_list = &sge, .num_sge = 1, .ud_peer = F.peer };
    wr.rdma.remote_addr = 0x10000;
    wr.rdma.rkey = 0x100;
    struct rs_rnic_send_wr *bad;
    if (rs_rnic_post_send(F.qp, &wr, &bad))
        die("post READ\n");
    uint8_t req[128];
    for (int tries = 0; tries < 1000; tries++) {
        ssize_t n = recv(F.peer_fd, req, sizeof(req), MSG_DONTWAIT);
        if (n >= (ssize_t)RS_UD_READ_REQ_HDR_LEN) {
            F.read_tag = rs_get_be32(req + RS_DDP_UNTAGGED_HDR_LEN);
            return;
        }
        usleep(1000);
    }
    die("no READ request\n");
}

static void init(void)
{
    struct sockaddr_in local = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (rs_rnic_open(RS_RNIC_KIND_SOFT, (struct sockaddr *)&local, &F.rnic) || rs_rnic_alloc_pd(F.rnic, &F.pd) ||
        rs_rnic_alloc_pd(F.rnic, &F.pd2) || rs_rnic_create_cq(F.rnic, 65536, &F.cq) ||
        rs_rnic_cm_create(F.rnic, &F.cm))
        die("open\n");
    struct rs_rnic_qp_attr attr = { .type = RS_QPT_UD, .send_cq = F.cq, .recv_cq = F.cq, .max_send_wr = 64,
                                    .max_recv_wr = RECVS, .max_send_sge = 1, .max_recv_sge = 1,
                                    .record_timeout_ms = 20, .ud_read_timeout_ms = 3600u * 1000u };
    if (rs_rnic_create_qp(F.pd, &attr, &F.qp) || rs_rnic_ud_bind(F.qp, (struct sockaddr *)&local, sizeof(local)))
        die("qp\n");
    guarded_alloc(&F.rw, F.pd, REGION_LEN, RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ);
    guarded_alloc(&F.ro, F.pd, REGION_LEN, RS_ACCESS_REMOTE_READ);
    guarded_alloc(&F.other, F.pd2, REGION_LEN, RS_ACCESS_REMOTE_WRITE | RS_ACCESS_REMOTE_READ);
    guarded_alloc(&F.sink, F.pd, 3 * 4096, RS_ACCESS_LOCAL_WRITE);
    for (int i = 0; i < RECVS; i++) {
        guarded_alloc(&F.recv[i], F.pd, RECV_LEN, RS_ACCESS_LOCAL_WRITE);
        post_recv(i);
    }
    F.peer_fd = socket(AF_INET, SOCK_DGRAM, 0);
    socklen_t len = sizeof(F.peer_addr);
    if (F.peer_fd < 0 || bind(F.peer_fd, (struct sockaddr *)&local, sizeof(local)) ||
        getsockname(F.peer_fd, (struct sockaddr *)&F.peer_addr, &len))
        die("peer socket\n");
    if (rs_rnic_ud_resolve_peer(F.qp, F.cm, (struct sockaddr *)&F.peer_addr, NULL, 0, NULL, &F.peer))
        die("resolve\n");
    start_read();
    F.ready = true;
}

static uint64_t rebase(uint64_t to, const struct guarded *g)
{
    return (uintptr_t)g->mem + to % (2 * (uint64_t)g->len);
}

static void patch(uint8_t flags, uint8_t *d, size_t n)
{
    const struct guarded *targets[3] = { &F.rw, &F.ro, &F.other };
    unsigned sel = (flags >> 1) & 3;
    const struct guarded *g = targets[sel == 3 ? 0 : sel];
    uint32_t stag = sel == 3 ? F.read_tag : g->mr->rkey;
    bool tagged = n >= 2 && (d[0] & RS_DDP_FLAG_TAGGED);
    uint8_t opcode = n >= 2 ? d[1] & 0x0f : 0xff;
    if (tagged && n >= RS_DDP_TAGGED_HDR_LEN) {
        if (flags & 1)
            rs_put_be32(d + 2, stag);
        if (flags & 8) {
            uint64_t to = rs_get_be64(d + 6);
            if (opcode == RS_RDMAP_WRITE_RECORD && n >= RS_UD_RECORD_HDR_LEN) {
                /* Keep TO - base_to as the fuzzer chose it, so segment indexes stay meaningful. */
                uint64_t base = rs_get_be64(d + 22);
                uint64_t new_base = rebase(base, g);
                rs_put_be64(d + 22, new_base);
                rs_put_be64(d + 6, new_base + (to - base));
            } else if (opcode != RS_RDMAP_READ_RESPONSE) {
                rs_put_be64(d + 6, rebase(to, g));
            }
        }
    } else if (!tagged && opcode == RS_RDMAP_TERMINATE && n >= RS_UD_TERM_HDR_LEN) {
        if (flags & 1)      /* the echoed Read Request's sink STag names the READ it refuses */
            rs_put_be32(d + RS_DDP_UNTAGGED_HDR_LEN + RS_TERM_HDR_LEN, stag);
    } else if (!tagged && opcode == RS_RDMAP_READ_REQUEST && n >= RS_UD_READ_REQ_HDR_LEN) {
        uint8_t *body = d + RS_DDP_UNTAGGED_HDR_LEN;
        if (flags & 1)
            rs_put_be32(body + 16, stag);
        if (flags & 8)
            rs_put_be64(body + 20, rebase(rs_get_be64(body + 20), g));
    }
    if ((flags & 16) && n >= 4)
        rs_crc32c_wire_put(d + n - 4, rs_crc32c(0, d, n - 4));
}

static void drain(void)
{
    struct rs_rnic_wc wc[64];
    int n;
    while ((n = rs_rnic_poll_cq(F.cq, 64, wc)) > 0) {
        for (int i = 0; i < n; i++) {
            if (wc[i].opcode == RS_WC_RECV && wc[i].wr_id < RECVS)
                post_recv((int)wc[i].wr_id);
            else if (wc[i].opcode == RS_WC_RDMA_READ)
                start_read();
        }
    }
    if (n < 0)
        die("CQ overflow\n");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!F.ready)
        init();
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    size_t n = size - 1;
    if (n > sizeof(F.dgram))
        n = sizeof(F.dgram);
    memcpy(F.dgram, data + 1, n);
    patch(flags, F.dgram, n);
    struct sockaddr_in src = F.peer_addr;
    if (!(flags & 32))
        src.sin_port = htons((uint16_t)(40000 + (flags >> 6)));
    (void)rs_soft_ud_rx_buffer(F.qp, F.dgram, n, (struct sockaddr *)&src, sizeof(src));
    drain();
    return 0;
}
