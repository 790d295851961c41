/*
 * ud_rx.c: the receive path of a UD QP: intake of datagrams (from the socket, or from a buffer for the fuzzer),
 * header validation, and untagged SEND placement with reassembly of segmented messages.
 *
 * Zero copy with UDP: where the payload goes depends on the header (a tagged segment names its region, a SEND
 * segment its offset in a posted receive), and a datagram can only be read once. So the header is PEEKed first
 * (recvmsg(MSG_PEEK|MSG_TRUNC) into a 64-byte buffer, which also yields the datagram's full length), decoded and
 * checked, and then the datagram is read with one recvmsg whose iovec is [header scratch | destination bytes in
 * registered memory | 4-byte trailer]. The alternative, a scatter list [header | posted buffer] without a peek,
 * works only for SENDs with one fixed header length and would still need a bounce buffer for tagged segments;
 * the peek costs one extra system call per datagram and keeps every kind on the same zero-copy path.
 *
 * The CRC covers header and payload and can only be checked after the payload was placed. A segment that fails
 * it is never reported: a SEND's receive goes back to the queue untouched as far as completions go, a
 * Write-Record segment is not marked valid (its bytes, inside the bounds the header was allowed, are undefined).
 *
 * A QP that adopted the application's socket (rs_rnic_ud_adopt_fd) shares the port with plain UDP: a datagram
 * that is not datagram-iWARP (the decoder refuses its header) or that fails the CRC (the kernel already checked
 * UDP's checksum, so it was never ours) is handed back raw, byte for byte, with an RS_WC_RECV_RAW completion.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "rnic/soft/ud.h"

/* ---- raw hand-back (adopted sockets) ---- */

/* Write-Record completions the QP's active records will still produce, without a further room check. */
static uint32_t records_pending(const struct rs_soft_ud *ud)
{
    uint32_t n = 0;
    for (unsigned i = 0; i < RS_UD_MAX_RECORDS; i++)
        n += ud->records[i].used && ud->records[i].active;
    return n;
}

bool rs_ud_cq_room(struct rs_soft_ud *ud)
{
    struct rs_soft_cq *cq = ud->qp->recv_cq;
    uint32_t reserved = records_pending(ud) + 1;
    pthread_mutex_lock(&cq->lock);
    bool room = !cq->overflowed && cq->depth - cq->count > reserved;
    pthread_mutex_unlock(&cq->lock);
    return room;
}

bool rs_ud_raw_room(struct rs_soft_ud *ud, size_t len)
{
    if (ud->raw_count >= ud->raw_max_count || ud->raw_bytes + len > ud->raw_max_bytes) {
        RS_UD_COUNT(ud, rx_raw_dropped, 1);
        return false;
    }
    if (!rs_ud_cq_room(ud)) {
        RS_UD_COUNT(ud, rx_no_room, 1);
        return false;
    }
    return true;
}

struct rs_rnic_raw_dgram *rs_ud_raw_alloc(const struct rs_ud_rx *rx, size_t len, enum rs_rnic_wc_status status)
{
    struct rs_rnic_raw_dgram *d = malloc(sizeof(*d) + (len ? len : 1));
    if (!d)
        return NULL;
    memset(d, 0, sizeof(*d));
    d->status = status;
    d->len = (uint32_t)len;
    memcpy(&d->src, &rx->src, sizeof(d->src));
    d->src_len = rx->src_len;
    return d;
}

void rs_ud_raw_push(struct rs_soft_ud *ud, struct rs_rnic_raw_dgram *d)
{
    struct rs_soft_qp *qp = ud->qp;
    d->next = NULL;
    if (ud->raw_tail)
        ud->raw_tail->next = d;
    else
        ud->raw_head = d;
    ud->raw_tail = d;
    ud->raw_count++;
    ud->raw_bytes += d->len;
    RS_UD_COUNT(ud, rx_raw, 1);
    struct rs_rnic_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.status = d->status;
    wc.opcode = RS_WC_RECV_RAW;
    wc.byte_len = d->len;
    wc.qp = &qp->base;
    memcpy(&wc.src, &d->src, sizeof(wc.src));
    if (d->status != RS_WC_SUCCESS) {
        wc.record.rkey = d->record.rkey;
        wc.record.offset = d->record.to;
        wc.record.msg_len = d->record.msg_len;
    }
    rs_soft_cq_push(qp->recv_cq, &wc);
}

/* Reads a datagram that is not datagram-iWARP whole into a raw entry. */
static void hand_back_raw(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    if (!rs_ud_raw_room(ud, rx->dgram_len))
        return;
    struct rs_rnic_raw_dgram *d = rs_ud_raw_alloc(rx, rx->dgram_len, RS_WC_SUCCESS);
    if (!d)
        return;
    rx->consumed = true;
    if (rx->fd >= 0) {
        struct iovec iov = { .iov_base = d->data, .iov_len = rx->dgram_len };
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        ssize_t n = rs_soft_sys_recvmsg(rx->fd, &msg, MSG_DONTWAIT);
        if (n < 0 || (size_t)n != rx->dgram_len) {
            free(d);
            return;
        }
    } else if (rx->dgram_len) {
        memcpy(d->data, rx->buf, rx->dgram_len);
    }
    rs_ud_raw_push(ud, d);
}

/* A datagram that decoded as ours but failed the CRC was never ours: put its bytes back together, unchanged. */
static void hand_back_failed_crc(struct rs_ud_rx *rx, const uint8_t *hdr, const struct iovec *payload, int iovcnt,
                                 const uint8_t *trailer)
{
    struct rs_soft_ud *ud = rx->ud;
    if (!rs_ud_raw_room(ud, rx->dgram_len))
        return;
    struct rs_rnic_raw_dgram *d = rs_ud_raw_alloc(rx, rx->dgram_len, RS_WC_SUCCESS);
    if (!d)
        return;
    uint8_t *p = d->data;
    memcpy(p, hdr, rx->h.hdr_len);
    p += rx->h.hdr_len;
    for (int i = 0; i < iovcnt; i++) {
        memcpy(p, payload[i].iov_base, payload[i].iov_len);
        p += payload[i].iov_len;
    }
    memcpy(p, trailer, RS_UD_CRC_LEN);
    rs_ud_raw_push(ud, d);
}

/* ---- reading a datagram ---- */

void rs_ud_rx_discard(struct rs_ud_rx *rx)
{
    if (rx->consumed)
        return;
    rx->consumed = true;
    if (rx->fd >= 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        (void)rs_soft_sys_recvmsg(rx->fd, &msg, MSG_DONTWAIT);
    }
}

int rs_ud_rx_consume(struct rs_ud_rx *rx, const struct iovec *payload, int iovcnt)
{
    struct iovec iov[RS_SOFT_MAX_SGE + 2];
    uint8_t hdr[RS_UD_MAX_HDR_LEN];
    uint8_t trailer[RS_UD_CRC_LEN];
    if (rx->consumed || iovcnt < 0 || iovcnt > (int)RS_SOFT_MAX_SGE)
        return -EINVAL;
    iov[0].iov_base = hdr;
    iov[0].iov_len = rx->h.hdr_len;
    size_t total = rx->h.hdr_len;
    for (int i = 0; i < iovcnt; i++) {
        iov[1 + i] = payload[i];
        total += payload[i].iov_len;
    }
    iov[1 + iovcnt].iov_base = trailer;
    iov[1 + iovcnt].iov_len = sizeof(trailer);
    total += sizeof(trailer);
    if (total != rx->dgram_len) {
        rs_ud_rx_discard(rx);
        return -EINVAL;             /* the caller's iovec does not match the header: a bug, never placed */
    }
    rx->consumed = true;
    if (rx->fd >= 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)iovcnt + 2;
        ssize_t n = rs_soft_sys_recvmsg(rx->fd, &msg, MSG_DONTWAIT);
        if (n < 0)
            return (int)n;
        if ((size_t)n != total || (msg.msg_flags & MSG_TRUNC))
            return -EIO;
    } else {
        const uint8_t *src = rx->buf;
        for (int i = 0; i < iovcnt + 2; i++) {
            memcpy(iov[i].iov_base, src, iov[i].iov_len);
            src += iov[i].iov_len;
        }
    }
    uint32_t crc = rs_ud_crc(hdr, rx->h.hdr_len, payload, iovcnt);
    if (crc != rs_crc32c_wire_get(trailer) || memcmp(hdr, rx->hdr_bytes, rx->h.hdr_len) != 0) {
        RS_SOFT_STAT(rx->ud->qp->dev, rx_drop_crc, 1);
        if (rx->ud->adopted)
            hand_back_failed_crc(rx, hdr, payload, iovcnt, trailer);
        return -EBADMSG;
    }
    RS_SOFT_STAT(rx->ud->qp->dev, rx_bytes, rx->h.payload_len);
    return 0;
}

/* Reads the whole datagram into the QP's scratch area, only to learn whether it is intact. */
static int consume_to_scratch(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    if (!ud->scratch) {
        ud->scratch = malloc(RS_UD_MAX_DATAGRAM);
        if (!ud->scratch) {
            rs_ud_rx_discard(rx);
            return -ENOMEM;
        }
    }
    struct iovec iov = { .iov_base = ud->scratch, .iov_len = rx->h.payload_len };
    return rs_ud_rx_consume(rx, &iov, rx->h.payload_len ? 1 : 0);
}

/* ---- SEND ---- */

static void fill_recv_wc(struct rs_rnic_wc *wc, const struct rs_ud_rx *rx, enum rs_rnic_wc_status status,
                         uint32_t byte_len)
{
    memset(wc, 0, sizeof(*wc));
    wc->status = status;
    wc->opcode = RS_WC_RECV;
    wc->byte_len = byte_len;
    wc->flags = rx->h.solicited ? RS_WC_SOLICITED : 0;
    memcpy(&wc->src, &rx->src, sizeof(wc->src));
    wc->src_qpn = RS_DDP_QN_SEND;       /* datagram-iWARP names QPs by address and port; the queue is 0 */
}

/*
 * The message does not fit the receive it took: the receive completes with RS_WC_LOC_LEN_ERR (the UD error
 * completion verbs gives too), but only for an intact datagram; otherwise the receive goes back.
 */
static void too_long(struct rs_ud_rx *rx, struct rs_soft_recv_wqe *wqe)
{
    struct rs_soft_qp *qp = rx->ud->qp;
    if (consume_to_scratch(rx) != 0) {
        rs_soft_rq_untake(qp, wqe);
        return;
    }
    struct rs_rnic_wc wc;
    fill_recv_wc(&wc, rx, RS_WC_LOC_LEN_ERR, 0);
    rs_soft_rq_finish(qp, wqe, &wc);
}

/* Places the payload at offset of a taken receive. 0 if intact; else the reason (the datagram is consumed). */
static int place_into_recv(struct rs_ud_rx *rx, struct rs_soft_recv_wqe *wqe, uint64_t offset,
                           enum rs_soft_prot *prot)
{
    struct rs_soft_qp *qp = rx->ud->qp;
    struct rs_soft_device *dev = qp->dev;
    struct iovec iov[RS_SOFT_MAX_SGE];
    rs_soft_mr_read_lock(dev);
    int n = rs_soft_sge_iov(dev, qp->pd, wqe->sge, wqe->num_sge, offset, rx->h.payload_len, RS_ACCESS_LOCAL_WRITE,
                            iov, RS_SOFT_MAX_SGE, prot);
    int rc = n < 0 ? n : rs_ud_rx_consume(rx, iov, n);
    rs_soft_mr_read_unlock(dev);
    if (n < 0)
        rs_ud_rx_discard(rx);
    return rc;
}

static void send_single(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    struct rs_soft_qp *qp = ud->qp;
    struct rs_soft_recv_wqe *wqe;
    if (rs_soft_rq_take(qp, &wqe) != 0) {
        RS_SOFT_STAT(qp->dev, rx_drop_no_recv, 1);
        RS_UD_COUNT(ud, rx_no_recv, 1);
        return;
    }
    if (rx->h.msg_len > wqe->length) {
        too_long(rx, wqe);
        return;
    }
    enum rs_soft_prot prot = RS_SOFT_PROT_OK;
    int rc = place_into_recv(rx, wqe, 0, &prot);
    struct rs_rnic_wc wc;
    if (rc == 0) {
        fill_recv_wc(&wc, rx, RS_WC_SUCCESS, rx->h.msg_len);
        rs_soft_rq_finish(qp, wqe, &wc);
    } else if (rc == -EFAULT) {
        /* The posted receive names memory it may not write: its own error, reported on it. */
        RS_DEBUG("soft rnic: qp %u receive buffer refused: %s", qp->qpn, rs_soft_prot_name(prot));
        fill_recv_wc(&wc, rx, RS_WC_LOC_PROT_ERR, 0);
        rs_soft_rq_finish(qp, wqe, &wc);
    } else {
        rs_soft_rq_untake(qp, wqe);
    }
}

static struct rs_ud_partial *find_partial(struct rs_soft_ud *ud, const struct sockaddr_storage *src, uint32_t msn)
{
    for (unsigned i = 0; i < RS_UD_MAX_PARTIAL; i++) {
        struct rs_ud_partial *p = &ud->partial[i];
        if (p->used && p->msn == msn && rs_sockaddr_equal(&p->src, src))
            return p;
    }
    return NULL;
}

/* Turns an entry into a tombstone that swallows late segments of its message for one more timeout. */
static void bury(struct rs_soft_ud *ud, struct rs_ud_partial *p)
{
    p->active = false;
    p->wqe = NULL;
    p->deadline_ns = rs_soft_now_ns() + (uint64_t)ud->qp->attr.record_timeout_ms * 1000000u;
    rs_ud_note_deadline(ud, p->deadline_ns);
}

/*
 * Gives up a message with a missing segment. Its receive goes back to the queue when nothing was taken after it
 * (the usual case: the sender's next message superseded it); otherwise it completes with RS_WC_TIMEOUT and
 * byte_len 0, so later receives are not held back. Never reported as a complete message.
 */
static void abandon(struct rs_soft_ud *ud, struct rs_ud_partial *p)
{
    struct rs_soft_qp *qp = ud->qp;
    RS_SOFT_STAT(qp->dev, rx_msg_incomplete, 1);
    if (!rs_soft_rq_try_untake(qp, p->wqe)) {
        struct rs_rnic_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.status = RS_WC_TIMEOUT;
        wc.opcode = RS_WC_RECV;
        memcpy(&wc.src, &p->src, sizeof(wc.src));
        rs_soft_rq_finish(qp, p->wqe, &wc);
    }
    bury(ud, p);
}

static struct rs_ud_partial *alloc_partial(struct rs_soft_ud *ud)
{
    struct rs_ud_partial *oldest_dead = NULL, *oldest_live = NULL;
    for (unsigned i = 0; i < RS_UD_MAX_PARTIAL; i++) {
        struct rs_ud_partial *p = &ud->partial[i];
        if (!p->used)
            return p;
        if (!p->active && (!oldest_dead || p->deadline_ns < oldest_dead->deadline_ns))
            oldest_dead = p;
        if (p->active && (!oldest_live || p->deadline_ns < oldest_live->deadline_ns))
            oldest_live = p;
    }
    if (oldest_dead)
        return oldest_dead;
    abandon(ud, oldest_live);
    return oldest_live;
}

static void send_segment(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    struct rs_soft_qp *qp = ud->qp;
    const struct rs_ud_hdr *h = &rx->h;
    struct rs_ud_partial *p = find_partial(ud, &rx->src, h->msn);
    if (p && !p->active) {
        RS_SOFT_STAT(qp->dev, rx_drop_late, 1);
        RS_UD_COUNT(ud, rx_refused, 1);
        return;
    }
    if (p && p->msg_len != h->msg_len) {
        RS_SOFT_STAT(qp->dev, rx_drop_header, 1);
        RS_UD_COUNT(ud, rx_refused, 1);
        return;
    }
    bool fresh = false;
    if (!p) {
        /* Datagrams of one sender arrive in order unless the network reorders: a new message from it means the
         * missing segments of its older one are lost. */
        for (unsigned i = 0; i < RS_UD_MAX_PARTIAL; i++) {
            struct rs_ud_partial *q = &ud->partial[i];
            if (q->used && q->active && rs_sockaddr_equal(&q->src, &rx->src))
                abandon(ud, q);
        }
        p = alloc_partial(ud);
        memset(p, 0, sizeof(*p));
        p->used = true;
        memcpy(&p->src, &rx->src, sizeof(p->src));
        p->msn = h->msn;
        p->msg_len = h->msg_len;
        p->seg_count = h->seg_count;
        struct rs_soft_recv_wqe *wqe;
        if (rs_soft_rq_take(qp, &wqe) != 0) {
            RS_SOFT_STAT(qp->dev, rx_drop_no_recv, 1);
            RS_UD_COUNT(ud, rx_no_recv, 1);
            bury(ud, p);            /* the rest of this message has nowhere to go either */
            return;
        }
        if (h->msg_len > wqe->length) {
            too_long(rx, wqe);
            bury(ud, p);
            return;
        }
        p->wqe = wqe;
        p->active = true;
        fresh = true;
    }
    if (p->seg_map & (1ull << h->seg_index)) {
        RS_SOFT_STAT(qp->dev, rx_drop_late, 1);
        return;
    }
    enum rs_soft_prot prot = RS_SOFT_PROT_OK;
    int rc = place_into_recv(rx, p->wqe, h->mo, &prot);
    if (rc == -EFAULT) {
        struct rs_rnic_wc wc;
        fill_recv_wc(&wc, rx, RS_WC_LOC_PROT_ERR, 0);
        rs_soft_rq_finish(qp, p->wqe, &wc);
        bury(ud, p);
        return;
    }
    if (rc != 0) {
        if (fresh && rs_soft_rq_try_untake(qp, p->wqe))
            memset(p, 0, sizeof(*p));      /* nothing of this message was accepted: forget it */
        return;
    }
    p->seg_map |= 1ull << h->seg_index;
    uint64_t full = p->seg_count == 64 ? ~0ull : (1ull << p->seg_count) - 1;
    if (p->seg_map == full) {
        struct rs_rnic_wc wc;
        fill_recv_wc(&wc, rx, RS_WC_SUCCESS, p->msg_len);
        rs_soft_rq_finish(qp, p->wqe, &wc);
        bury(ud, p);
        return;
    }
    /* The timeout counts from the latest segment: a long message on a slow path is not cut short. */
    p->deadline_ns = rs_soft_now_ns() + (uint64_t)qp->attr.record_timeout_ms * 1000000u;
    rs_ud_note_deadline(ud, p->deadline_ns);
}

uint64_t rs_ud_partial_expire(struct rs_soft_ud *ud, uint64_t now_ns)
{
    uint64_t next = 0;
    for (unsigned i = 0; i < RS_UD_MAX_PARTIAL; i++) {
        struct rs_ud_partial *p = &ud->partial[i];
        if (!p->used)
            continue;
        if (p->deadline_ns <= now_ns) {
            if (p->active)
                abandon(ud, p);         /* becomes a tombstone with a fresh deadline */
            else
                p->used = false;
        }
        if (p->used && (!next || p->deadline_ns < next))
            next = p->deadline_ns;
    }
    return next;
}

/* ---- intake ---- */

/* Handles one datagram whose first bytes are in rx->hdr_bytes (avail of them). rx_lock not held. */
static int rx_datagram(struct rs_ud_rx *rx, size_t avail)
{
    struct rs_soft_ud *ud = rx->ud;
    struct rs_soft_qp *qp = ud->qp;
    struct rs_soft_device *dev = qp->dev;
    int result = 0;
    pthread_mutex_lock(&ud->rx_lock);
    RS_SOFT_STAT(dev, rx_datagrams, 1);
    if (rs_soft_qp_get_state(qp) != RS_QPS_RTS) {
        result = -ENOTCONN;
    } else if (rs_soft_test_should_drop(dev)) {
        result = -ECANCELED;
    } else if (rs_ud_decode(rx->hdr_bytes, avail, rx->dgram_len, &rx->h) != 0) {
        if (ud->adopted) {
            /* Plain UDP on the application's port: back to the socket layer, byte for byte. */
            hand_back_raw(rx);
            result = rx->consumed ? 0 : -ENOBUFS;
        } else {
            RS_SOFT_STAT(dev, rx_drop_header, 1);
            RS_UD_COUNT(ud, rx_refused, 1);
            result = -EBADMSG;
        }
    } else {
        switch (rx->h.kind) {
        case RS_UD_KIND_SEND:
            if (rx->h.seg_count == 1)
                send_single(rx);
            else
                send_segment(rx);
            break;
        case RS_UD_KIND_WRITE_RECORD:
            rs_ud_record_rx(rx);
            break;
        case RS_UD_KIND_READ_REQ:
            rs_ud_read_req_rx(rx);
            break;
        case RS_UD_KIND_READ_RESP:
            rs_ud_read_resp_rx(rx);
            break;
        case RS_UD_KIND_TERMINATE:
            rs_ud_read_term_rx(rx);
            break;
        }
        if (!rx->consumed)
            result = -EPROTO;       /* refused by a handler (counted there) */
    }
    rs_ud_rx_discard(rx);
    pthread_mutex_unlock(&ud->rx_lock);
    if (__atomic_exchange_n(&ud->tx_stalled, false, __ATOMIC_ACQ_REL))
        rs_ud_tx_kick(ud);
    return result;
}

void rs_ud_rx_socket(struct rs_soft_ud *ud, unsigned budget)
{
    for (unsigned i = 0; i < budget; i++) {
        struct rs_ud_rx rx;
        memset(&rx, 0, sizeof(rx));
        rx.ud = ud;
        rx.fd = ud->fd;
        struct iovec iov = { .iov_base = rx.hdr_bytes, .iov_len = sizeof(rx.hdr_bytes) };
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_name = &rx.src;
        msg.msg_namelen = sizeof(rx.src);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        /* MSG_TRUNC with MSG_PEEK returns the datagram's real length while copying only the header bytes. */
        ssize_t n = rs_soft_sys_recvmsg(ud->fd, &msg, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
        if (n == -EINTR)
            continue;
        if (n < 0) {
            if (n != -EAGAIN && n != -EWOULDBLOCK) {
                /* e.g. an ICMP error queued on the socket: reading it cleared it. */
                RS_DEBUG("soft rnic: qp %u recvmsg: %d", ud->qp->qpn, (int)n);
                continue;
            }
            return;
        }
        rx.src_len = msg.msg_namelen;
        rx.dgram_len = (size_t)n;
        size_t avail = rx.dgram_len < sizeof(rx.hdr_bytes) ? rx.dgram_len : sizeof(rx.hdr_bytes);
        (void)rx_datagram(&rx, avail);
    }
}

int rs_soft_ud_rx_buffer(struct rs_rnic_qp *pqp, const void *buf, size_t len, const struct sockaddr *src,
                         socklen_t src_len)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (qp->type != RS_QPT_UD || !qp->ud || (!buf && len) || !src || src_len > sizeof(struct sockaddr_storage))
        return -EINVAL;
    struct rs_ud_rx rx;
    memset(&rx, 0, sizeof(rx));
    rx.ud = qp->ud;
    rx.fd = -1;
    rx.buf = buf;
    rx.dgram_len = len;
    memcpy(&rx.src, src, src_len);
    rx.src_len = src_len;
    size_t avail = len < sizeof(rx.hdr_bytes) ? len : sizeof(rx.hdr_bytes);
    if (avail)
        memcpy(rx.hdr_bytes, buf, avail);
    return rx_datagram(&rx, avail);
}
