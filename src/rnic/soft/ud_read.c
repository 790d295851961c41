/*
 * ud_read.c: RDMA Read over datagrams (grant-2012 §6.4).
 *
 * Initiator: a READ leaves the send queue as one Read Request (untagged, QN 1) and waits on the QP's pending list.
 * Its Sink STag is not a memory key but a random 32-bit tag naming this request, and its Sink TO is 0, so the
 * responder's Read Response segments (tagged, opcode 0x2, TO = offset in the read) can only land in the buffers
 * this READ posted, and a stray or forged response without the tag places nothing. Responses are matched by tag
 * and by the responder's UDP port (not its IP address: a multi-homed responder bound to a wildcard may answer from
 * another address). The READ completes when every segment is placed, fails with RS_WC_REM_ACCESS_ERR when the
 * responder refuses (a Terminate echoing the request), and with RS_WC_TIMEOUT when ud_read_timeout_ms passes first.
 * Timeouts are not watched in real time: they are checked when the CQ is polled and when the QP's timer fires.
 *
 * Responder: checks the source STag (REMOTE_READ, PD, bounds) and answers at once from the progress thread with
 * segments sent straight from the region; nothing is queued, so a lost response is the initiator's timeout.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rnic/soft/ud.h"

struct rs_ud_read {
    struct rs_ud_read *next;
    uint64_t wr_id;
    bool signaled;
    uint32_t tag;
    uint32_t length;
    uint32_t seg_count;
    uint64_t seg_map;
    struct sockaddr_storage peer;
    uint32_t num_sge;
    struct rs_rnic_sge sge[RS_SOFT_MAX_SGE];
    uint64_t deadline_ns;
};

static uint16_t port_of(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_port;
    if (a->ss_family == AF_INET6)
        return ((const struct sockaddr_in6 *)a)->sin6_port;
    return 0;
}

static struct rs_ud_read *find_read(struct rs_soft_ud *ud, uint32_t tag, const struct sockaddr_storage *src)
{
    for (struct rs_ud_read *r = ud->reads; r; r = r->next)
        if (r->tag == tag && port_of(&r->peer) == port_of(src))
            return r;
    return NULL;
}

/* Completes and frees r (rx_lock held). */
static void finish_read(struct rs_soft_ud *ud, struct rs_ud_read *r, enum rs_rnic_wc_status status)
{
    struct rs_ud_read **link = &ud->reads;
    while (*link && *link != r)
        link = &(*link)->next;
    if (*link)
        *link = r->next;
    ud->read_count--;
    rs_soft_send_wc(ud->qp, r->wr_id, RS_WR_RDMA_READ, r->signaled, status,
                    status == RS_WC_SUCCESS ? r->length : 0);
    free(r);
}

static uint32_t new_tag(struct rs_soft_ud *ud)
{
    for (;;) {
        uint64_t x = ud->tag_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ud->tag_state = x;
        uint32_t tag = (uint32_t)(x >> 16);
        bool taken = false;
        for (struct rs_ud_read *r = ud->reads; r; r = r->next)
            taken |= r->tag == tag;
        if (tag && !taken)
            return tag;
    }
}

int rs_ud_read_start(struct rs_soft_ud *ud, struct rs_soft_send_wqe *e)
{
    struct rs_soft_qp *qp = ud->qp;
    struct rs_soft_device *dev = qp->dev;
    if (e->length > RS_UD_MAX_MSG)
        return RS_WC_LOC_LEN_ERR;
    /* The sink must be writable by us now; it is checked again when each response segment is placed. */
    struct iovec iov[RS_SOFT_MAX_SGE];
    enum rs_soft_prot prot;
    rs_soft_mr_read_lock(dev);
    int n = rs_soft_sge_iov(dev, qp->pd, e->sge, e->num_sge, 0, e->length, RS_ACCESS_LOCAL_WRITE, iov,
                            RS_SOFT_MAX_SGE, &prot);
    rs_soft_mr_read_unlock(dev);
    if (n < 0)
        return n == -EFAULT ? RS_WC_LOC_PROT_ERR : RS_WC_LOC_LEN_ERR;

    pthread_mutex_lock(&ud->rx_lock);
    if (ud->read_count >= RS_SOFT_MAX_ORD) {
        pthread_mutex_unlock(&ud->rx_lock);
        return -EBUSY;
    }
    struct rs_ud_read *r = calloc(1, sizeof(*r));
    if (!r) {
        pthread_mutex_unlock(&ud->rx_lock);
        return RS_WC_GENERAL_ERR;
    }
    r->wr_id = e->wr_id;
    r->signaled = (e->flags & RS_SEND_SIGNALED) != 0;
    r->tag = new_tag(ud);
    r->length = (uint32_t)e->length;
    r->seg_count = r->length == 0 ? 1 : (r->length + RS_UD_SEG_LEN - 1) / RS_UD_SEG_LEN;
    memcpy(&r->peer, &e->peer, sizeof(r->peer));
    r->num_sge = e->num_sge;
    memcpy(r->sge, e->sge, e->num_sge * sizeof(r->sge[0]));
    r->deadline_ns = rs_soft_now_ns() + (uint64_t)qp->attr.ud_read_timeout_ms * 1000000u;
    /* Listed before the request leaves, so even an immediate response finds it. */
    r->next = ud->reads;
    ud->reads = r;
    ud->read_count++;

    uint8_t hdr[RS_UD_MAX_HDR_LEN];
    uint32_t msn = ud->next_read_msn++;
    size_t hlen = rs_ud_put_read_req(hdr, msn, r->tag, 0, r->length, e->rkey, e->remote_addr);
    ssize_t sent = rs_ud_send_datagram(ud, &e->peer, e->peer_len, hdr, hlen, NULL, 0,
                                       e->peer_qos_set ? &e->peer_qos : NULL);
    if (sent < 0) {
        ud->reads = r->next;
        ud->read_count--;
        free(r);
        pthread_mutex_unlock(&ud->rx_lock);
        if (sent == -EAGAIN || sent == -EWOULDBLOCK || sent == -ENOBUFS)
            return -EAGAIN;
        RS_SOFT_STAT(dev, tx_errors, 1);
        return sent == -EMSGSIZE ? RS_WC_LOC_LEN_ERR : RS_WC_RETRY_EXC_ERR;
    }
    rs_ud_note_deadline(ud, r->deadline_ns);
    pthread_mutex_unlock(&ud->rx_lock);
    return 0;
}

void rs_ud_read_resp_rx(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    struct rs_soft_qp *qp = ud->qp;
    struct rs_soft_device *dev = qp->dev;
    const struct rs_ud_hdr *h = &rx->h;
    struct rs_ud_read *r = find_read(ud, h->stag, &rx->src);
    if (!r) {
        RS_SOFT_STAT(dev, rx_drop_late, 1);     /* timed out already, or not ours */
        return;
    }
    /* Responders cut responses exactly like SENDs: RS_UD_SEG_LEN bytes, the last one shorter. */
    if (h->to % RS_UD_SEG_LEN != 0 || h->to / RS_UD_SEG_LEN >= r->seg_count) {
        RS_SOFT_STAT(dev, rx_drop_header, 1);
        return;
    }
    uint32_t index = (uint32_t)(h->to / RS_UD_SEG_LEN);
    bool last = index + 1 == r->seg_count;
    uint32_t want = last ? r->length - index * RS_UD_SEG_LEN : RS_UD_SEG_LEN;
    if (h->payload_len != want || h->last != last) {
        RS_SOFT_STAT(dev, rx_drop_header, 1);
        return;
    }
    if (r->seg_map & (1ull << index)) {
        RS_SOFT_STAT(dev, rx_drop_late, 1);
        return;
    }
    struct iovec iov[RS_SOFT_MAX_SGE];
    enum rs_soft_prot prot;
    rs_soft_mr_read_lock(dev);
    int n = rs_soft_sge_iov(dev, qp->pd, r->sge, r->num_sge, h->to, h->payload_len, RS_ACCESS_LOCAL_WRITE, iov,
                            RS_SOFT_MAX_SGE, &prot);
    int rc = n < 0 ? n : rs_ud_rx_consume(rx, iov, n);
    rs_soft_mr_read_unlock(dev);
    if (n < 0) {
        /* The sink was deregistered or changed under the READ. */
        rs_ud_rx_discard(rx);
        finish_read(ud, r, RS_WC_LOC_PROT_ERR);
        __atomic_store_n(&ud->tx_stalled, true, __ATOMIC_RELEASE);
        return;
    }
    if (rc != 0)
        return;
    r->seg_map |= 1ull << index;
    uint64_t full = r->seg_count == 64 ? ~0ull : (1ull << r->seg_count) - 1;
    if (r->seg_map == full) {
        finish_read(ud, r, RS_WC_SUCCESS);
        __atomic_store_n(&ud->tx_stalled, true, __ATOMIC_RELEASE);     /* an ORD slot is free: retry the queue */
    }
}

void rs_ud_read_term_rx(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    struct rs_ud_read *r = find_read(ud, rx->h.sink_stag, &rx->src);
    if (!r) {
        RS_SOFT_STAT(ud->qp->dev, rx_drop_late, 1);
        return;
    }
    if (rs_ud_rx_consume(rx, NULL, 0) != 0)
        return;
    unsigned layer = rx->h.term_word >> 28, etype = (rx->h.term_word >> 24) & 0xf;
    bool protection = layer == RS_TERM_LAYER_RDMAP && etype == RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION;
    finish_read(ud, r, protection ? RS_WC_REM_ACCESS_ERR : RS_WC_REM_INV_REQ_ERR);
    __atomic_store_n(&ud->tx_stalled, true, __ATOMIC_RELEASE);
}

void rs_ud_read_req_rx(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    struct rs_soft_qp *qp = ud->qp;
    struct rs_soft_device *dev = qp->dev;
    const struct rs_ud_hdr *h = &rx->h;
    if (rs_ud_rx_consume(rx, NULL, 0) != 0)
        return;
    uint8_t hdr[RS_UD_MAX_HDR_LEN];
    rs_soft_mr_read_lock(dev);
    uint8_t *where = NULL;
    enum rs_soft_prot prot = rs_soft_mr_check_remote(dev, qp->pd, h->src_stag, h->src_to, h->read_len,
                                                     RS_ACCESS_REMOTE_READ, &where, NULL);
    if (prot != RS_SOFT_PROT_OK) {
        rs_soft_mr_read_unlock(dev);
        RS_SOFT_STAT(dev, rx_drop_protection, 1);
        RS_DEBUG("soft rnic: qp %u READ refused: %s (stag 0x%x)", qp->qpn, rs_soft_prot_name(prot), h->src_stag);
        uint32_t word = rs_term_word(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION,
                                     rs_soft_prot_term_ecode(prot), 0);
        size_t hlen = rs_ud_put_terminate(hdr, word, h);
        (void)rs_ud_send_datagram(ud, &rx->src, rx->src_len, hdr, hlen, NULL, 0, NULL);
        return;
    }
    uint32_t off = 0;
    for (;;) {
        uint32_t len = h->read_len - off < RS_UD_SEG_LEN ? h->read_len - off : RS_UD_SEG_LEN;
        bool last = off + len == h->read_len;
        size_t hlen = rs_ud_put_read_resp(hdr, last, h->sink_stag, h->sink_to + off);
        struct iovec iov = { .iov_base = where + off, .iov_len = len };
        ssize_t sent = rs_ud_send_datagram(ud, &rx->src, rx->src_len, hdr, hlen, &iov, len ? 1 : 0, NULL);
        if (sent < 0) {
            RS_SOFT_STAT(dev, tx_errors, 1);
            break;              /* the initiator times out */
        }
        off += len;
        if (last)
            break;
    }
    rs_soft_mr_read_unlock(dev);
    RS_SOFT_STAT(dev, read_responses_sent, 1);
}

uint64_t rs_ud_read_expire(struct rs_soft_ud *ud, uint64_t now_ns)
{
    uint64_t next = 0;
    struct rs_ud_read *r = ud->reads;
    while (r) {
        struct rs_ud_read *following = r->next;
        if (r->deadline_ns <= now_ns) {
            RS_SOFT_STAT(ud->qp->dev, read_timeouts, 1);
            finish_read(ud, r, RS_WC_TIMEOUT);
            __atomic_store_n(&ud->tx_stalled, true, __ATOMIC_RELEASE);
        } else if (!next || r->deadline_ns < next) {
            next = r->deadline_ns;
        }
        r = following;
    }
    return next;
}

void rs_ud_read_flush(struct rs_soft_ud *ud)
{
    while (ud->reads)
        finish_read(ud, ud->reads, RS_WC_WR_FLUSH_ERR);
}
