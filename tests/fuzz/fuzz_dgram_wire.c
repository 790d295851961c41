/*
 * Fuzz target: the datagram sockets' control messages (discovery, announcements, sinks, lane reports) and the
 * path every non-RDMA datagram takes on a converted socket.
 *
 * Input: byte 0 steers, the rest is a datagram. Bits 0-1 pick the mode:
 *   0          decoder only: rs_dgw_decode must accept exactly what rs_dgw_encode produces (a decoded message
 *              re-encodes to the same bytes), and never read outside the input.
 *   2          the soft RNIC's hand-back (rnic.h, rs_rnic_ud_adopt_fd): the datagram enters the receive path of a
 *              QP that adopted a socket. Whatever is not datagram-iWARP for it must come back as exactly one raw
 *              datagram, byte for byte (the coexistence promise to plain UDP on the same port); nothing may be
 *              placed outside the posted receives.
 *   1, 3       the datagram is injected into a live socket (soft RNIC, wrecord rules, a warmed-up peer) as if its
 *              RNIC had handed it back: plain UDP is queued, control messages drive the peer state machine.
 *              bits 1-2 pick the claimed source: the live peer, another covered address, an address no rule
 *              covers, the socket itself. bit 3 makes it a refused Write-Record (the datagram's first 12 bytes
 *              give its STag and TO: the salvage and stale-peer paths). bit 5 magic-patches the first
 *              four bytes to "RSDG" so control messages are reached without the fuzzer guessing the magic.
 * After each injected input the socket is drained, and every 64 inputs the peer sends to it over RDMA and the
 * datagram must still arrive: no input may break the socket for its real peer.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/config.h"
#include "dgram_wr/dgram.h"
#include "dgram_wr/dgram_wire.h"
#include "rnic/rnic.h"
#include "rnic/soft/soft.h"     /* rs_soft_ud_rx_buffer: the receive path without a socket */
#include "rnic/soft/ud.h"       /* rs_ud_decode: what the RNIC will take for its own */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct ep {
    int fd;
    struct rs_dgram_sock *s;
    struct sockaddr_in addr;
};

static struct rs_config *cfg;
static struct rs_dgram_config_policy pol;
static struct ep a, b;
static bool ready, broken;
static unsigned runs;

static bool open_ep(struct ep *e)
{
    e->fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct rs_dgram_opts o;
    rs_dgram_default_opts(&o);
    o.policy = rs_dgram_config_policy;
    o.policy_arg = &pol;
    o.rnic_kind = RS_RNIC_KIND_SOFT;
    o.probe_timeout_ms = 20;
    if (e->fd < 0 || rs_dgram_attach(e->fd, &o, &e->s) != 0)
        return false;
    struct sockaddr_in lo = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (rs_dgram_bind(e->s, (struct sockaddr *)&lo, sizeof(lo)) != 0)
        return false;
    socklen_t l = sizeof(e->addr);
    return rs_dgram_getsockname(e->s, (struct sockaddr *)&e->addr, &l) == 0;
}

static void drain(struct ep *e)
{
    uint8_t buf[2048];
    while (rs_dgram_recvfrom(e->s, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL) >= 0) {
    }
}

static bool setup(void)
{
    static const char rules[] = "use both udp any 127.0.0.1 dgram=wrecord\n"
                                "use both udp any 127.0.0.3 dgram=sendrecv\n";
    if (rs_config_parse_buffer("fuzz", rules, sizeof(rules) - 1, &cfg, NULL) != 0)
        return false;
    pol.cfg = cfg;
    pol.program = "fuzz";
    if (!open_ep(&a) || !open_ep(&b))
        return false;
    for (int i = 0; i < 500; i++) {
        (void)rs_dgram_sendto(a.s, "w", 1, 0, (struct sockaddr *)&b.addr, sizeof(b.addr));
        (void)rs_dgram_sendto(b.s, "w", 1, 0, (struct sockaddr *)&a.addr, sizeof(a.addr));
        usleep(1000);
        drain(&a);
        drain(&b);
        if (rs_dgram_test_peer_rdma(a.s, (struct sockaddr *)&b.addr) &&
            rs_dgram_test_peer_rdma(b.s, (struct sockaddr *)&a.addr))
            return true;
    }
    return false;
}

static void decode_only(const uint8_t *p, size_t n)
{
    struct rs_dgw_msg m;
    if (rs_dgw_decode(p, n, &m) != 0)
        return;
    uint8_t again[RS_DGW_MAX_LEN];
    size_t len = rs_dgw_encode(&m, again);
    if (len != n || memcmp(again, p, n) != 0)
        abort();        /* the decoder accepted something the encoder would never produce */
}

/* The peer still reaches the socket over RDMA. */
static void check_alive(void)
{
    for (int tries = 0; tries < 100; tries++) {
        if (rs_dgram_sendto(a.s, "alive", 5, 0, (struct sockaddr *)&b.addr, sizeof(b.addr)) != 5)
            abort();
        for (int spin = 0; spin < 50; spin++) {
            uint8_t buf[64];
            ssize_t n = rs_dgram_recvfrom(b.s, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL);
            if (n == 5 && memcmp(buf, "alive", 5) == 0)
                return;
            if (n < 0)
                usleep(200);
        }
    }
    abort();
}

/* ---- mode 2: the RNIC's hand-back ---- */

#define RAW_RECV_LEN 70000u
#define RAW_RECVS 4

static struct {
    bool tried, ok;
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    struct rs_rnic_cq *cq;
    struct rs_rnic_qp *qp;
    struct rs_rnic_mr *mr;
    uint8_t *mem;
    int fd;
} hb;

static void hb_post(unsigned i)
{
    struct rs_rnic_sge sge = { (uintptr_t)(hb.mem + (size_t)i * RAW_RECV_LEN), RAW_RECV_LEN, hb.mr->lkey };
    struct rs_rnic_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
    if (rs_rnic_post_recv(hb.qp, &wr, &bad) != 0)
        abort();
}

static bool hb_setup(void)
{
    struct sockaddr_in lo = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (rs_rnic_open(RS_RNIC_KIND_SOFT, (struct sockaddr *)&lo, &hb.rnic) || rs_rnic_alloc_pd(hb.rnic, &hb.pd) ||
        rs_rnic_create_cq(hb.rnic, 4096, &hb.cq))
        return false;
    struct rs_rnic_qp_attr attr = { .type = RS_QPT_UD, .send_cq = hb.cq, .recv_cq = hb.cq, .max_send_wr = 4,
                                    .max_recv_wr = RAW_RECVS, .max_send_sge = 1, .max_recv_sge = 1 };
    hb.mem = malloc((size_t)RAW_RECVS * RAW_RECV_LEN);
    hb.fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (!hb.mem || hb.fd < 0 || rs_rnic_create_qp(hb.pd, &attr, &hb.qp) ||
        rs_rnic_reg_mr(hb.pd, hb.mem, (size_t)RAW_RECVS * RAW_RECV_LEN, RS_ACCESS_LOCAL_WRITE, &hb.mr) ||
        bind(hb.fd, (struct sockaddr *)&lo, sizeof(lo)))
        return false;
    struct rs_rnic_ud_adopt how = { .fd = hb.fd, .raw_max_bytes = 1u << 20, .raw_max_count = 64 };
    if (rs_rnic_ud_adopt_fd(hb.qp, &how))
        return false;
    for (unsigned i = 0; i < RAW_RECVS; i++)
        hb_post(i);
    return true;
}

static void hand_back(const uint8_t *p, size_t n)
{
    if (!hb.tried) {
        hb.tried = true;
        hb.ok = hb_setup();
    }
    if (!hb.ok || n > RS_UD_MAX_DATAGRAM)
        return;
    struct sockaddr_in src = { .sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    uint8_t hdr[RS_UD_MAX_HDR_LEN];
    size_t avail = n < sizeof(hdr) ? n : sizeof(hdr);
    memcpy(hdr, p, avail);
    struct rs_ud_hdr h;
    bool ours = rs_ud_decode(hdr, avail, n, &h) == 0;
    (void)rs_soft_ud_rx_buffer(hb.qp, p, n, (struct sockaddr *)&src, sizeof(src));
    struct rs_rnic_wc wc[16];
    int got, raw_plain = 0;
    while ((got = rs_rnic_poll_cq(hb.cq, 16, wc)) > 0) {
        for (int i = 0; i < got; i++) {
            if (wc[i].opcode == RS_WC_RECV) {
                hb_post((unsigned)wc[i].wr_id);
                continue;
            }
            if (wc[i].opcode != RS_WC_RECV_RAW)
                continue;
            struct rs_rnic_raw_dgram *d;
            if (rs_rnic_ud_take_raw(hb.qp, &d) != 0 || d->len != wc[i].byte_len || d->status != wc[i].status)
                abort();        /* a completion without its entry, or a different one */
            if (d->status == RS_WC_SUCCESS) {
                /* Handed back: exactly the bytes that arrived. */
                if (d->len != n || (n && memcmp(d->data, p, n) != 0))
                    abort();
                raw_plain++;
            }
            free(d);
        }
    }
    if (got < 0)
        abort();
    /* Not datagram-iWARP: handed back exactly once. (Ours but failing its CRC: handed back too, also once.) */
    if ((!ours && raw_plain != 1) || raw_plain > 1)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t steer = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if ((steer & 3) == 0) {
        decode_only(p, n);
        return 0;
    }
    if ((steer & 3) == 2) {
        hand_back(p, n);
        return 0;
    }
    if (!ready && !broken) {
        broken = !setup();
        ready = !broken;
    }
    if (!ready)
        return 0;
    uint8_t *copy = malloc(n + 1);
    if (!copy)
        return 0;
    memcpy(copy, p, n);
    if ((steer & 0x20) && n >= 4)
        memcpy(copy, "RSDG", 4);
    struct rs_rnic_raw_dgram tmpl;
    memset(&tmpl, 0, sizeof(tmpl));
    struct sockaddr_in *src = (struct sockaddr_in *)&tmpl.src;
    switch ((steer >> 1) & 3) {
    case 0:
        *src = a.addr;
        break;
    case 1:
        src->sin_family = AF_INET;
        src->sin_port = htons(40000);
        inet_pton(AF_INET, "127.0.0.3", &src->sin_addr);
        break;
    case 2:
        src->sin_family = AF_INET;
        src->sin_port = htons(40001);
        inet_pton(AF_INET, "10.1.2.3", &src->sin_addr);
        break;
    default:
        *src = b.addr;
        break;
    }
    tmpl.src_len = sizeof(*src);
    if ((steer & 0x08) && n >= 12) {
        tmpl.status = RS_WC_REM_ACCESS_ERR;
        memcpy(&tmpl.record.rkey, copy, 4);
        memcpy(&tmpl.record.to, copy + 4, 8);
        tmpl.record.base_to = tmpl.record.to;
        tmpl.record.msg_len = (uint32_t)n;
    } else {
        tmpl.status = RS_WC_SUCCESS;
    }
    (void)rs_dgram_test_inject(b.s, &tmpl, copy, n);
    free(copy);
    drain(&b);
    drain(&a);
    if (++runs % 64 == 0) {
        check_alive();
        drain(&b);
    }
    return 0;
}
