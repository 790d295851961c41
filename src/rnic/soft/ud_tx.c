/*
 * ud_tx.c: transmitting a UD QP's send queue: SEND and WRITE_RECORD messages cut into datagrams, READ requests.
 *
 * Each datagram leaves with one sendmsg() whose iovec is [header | payload straight from the registered buffer |
 * CRC trailer]: the payload is never copied (except what RS_SEND_INLINE copied at post time). Transmission runs on
 * the posting thread while the socket accepts datagrams; when it answers EAGAIN the QP asks the progress thread to
 * watch for writability and continue from the same byte. A send completes once its last datagram was accepted by
 * UDP (datagram-iWARP semantics: no delivery guarantee).
 */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "rnic/soft/ud.h"

ssize_t rs_ud_send_datagram(struct rs_soft_ud *ud, const struct sockaddr_storage *dst, socklen_t dst_len,
                            const uint8_t *hdr, size_t hdr_len, const struct iovec *payload, int iovcnt,
                            const struct rs_rnic_qos *tclass)
{
    struct iovec iov[RS_SOFT_MAX_SGE + 2];
    if (iovcnt < 0 || iovcnt > (int)RS_SOFT_MAX_SGE || ud->fd < 0)
        return -EINVAL;
    uint8_t trailer[RS_UD_CRC_LEN];
    rs_crc32c_wire_put(trailer, rs_ud_crc(hdr, hdr_len, payload, iovcnt));
    iov[0].iov_base = (void *)hdr;
    iov[0].iov_len = hdr_len;
    for (int i = 0; i < iovcnt; i++)
        iov[1 + i] = payload[i];
    iov[1 + iovcnt].iov_base = trailer;
    iov[1 + iovcnt].iov_len = sizeof(trailer);

    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_name = (void *)dst;
    msg.msg_namelen = dst_len;
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)iovcnt + 2;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    if (tclass) {
        /* A peer resolved with its own traffic class: per-datagram ToS / IPv6 traffic class. */
        memset(&control, 0, sizeof(control));
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = ud->family == AF_INET ? IPPROTO_IP : IPPROTO_IPV6;
        cm->cmsg_type = ud->family == AF_INET ? IP_TOS : IPV6_TCLASS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        int v = tclass->tclass;
        memcpy(CMSG_DATA(cm), &v, sizeof(v));
    }
    ssize_t n = rs_soft_sys_sendmsg(ud->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
        RS_SOFT_STAT(ud->qp->dev, tx_datagrams, 1);
        RS_SOFT_STAT(ud->qp->dev, tx_bytes, (uint64_t)n - hdr_len - RS_UD_CRC_LEN);
    }
    return n;
}

/* Completion status for a sendmsg failure that is not "try again". */
static enum rs_rnic_wc_status tx_errno_status(ssize_t err)
{
    switch (-err) {
    case EMSGSIZE:
        return RS_WC_LOC_LEN_ERR;
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ECONNREFUSED:
    case ENETDOWN:
    case EHOSTDOWN:
    case EACCES:
    case EPERM:
        return RS_WC_RETRY_EXC_ERR;
    default:
        return RS_WC_GENERAL_ERR;
    }
}

static bool try_again(ssize_t err) { return err == -EAGAIN || err == -EWOULDBLOCK || err == -ENOBUFS; }

static uint32_t next_id(uint32_t *counter)
{
    uint32_t id = (*counter)++;
    if (*counter == 0)
        *counter = 1;       /* 0 means "not assigned yet" in a WQE */
    return id;
}

/*
 * Sends what is left of a SEND or WRITE_RECORD (sq_lock held): 0 when every datagram went out, -EAGAIN when the
 * socket is full (e->sent says where to continue), or a positive completion status to fail the WQE with.
 */
static int tx_message(struct rs_soft_ud *ud, struct rs_soft_send_wqe *e)
{
    struct rs_soft_qp *qp = ud->qp;
    struct rs_soft_device *dev = qp->dev;
    bool record = e->opcode == RS_WR_WRITE_RECORD;
    uint32_t seg = record ? dev->ud_segment_len : RS_UD_SEG_LEN;
    if (e->length > (uint64_t)seg * RS_UD_MAX_SEGMENTS)
        return RS_WC_LOC_LEN_ERR;
    uint32_t total = (uint32_t)e->length;
    if (e->msg_id == 0)
        e->msg_id = record ? next_id(&ud->next_record_id) : next_id(&ud->next_msn);
    const struct rs_rnic_qos *tclass = e->peer_qos_set ? &e->peer_qos : NULL;

    int result = 0;
    rs_soft_mr_read_lock(dev);
    do {
        uint32_t off = (uint32_t)e->sent;
        uint32_t len = total - off < seg ? total - off : seg;
        bool last = off + len == total;
        struct iovec iov[RS_SOFT_MAX_SGE];
        int n = 0;
        if (len && e->inline_data) {
            iov[0].iov_base = e->inline_data + off;
            iov[0].iov_len = len;
            n = 1;
        } else if (len) {
            enum rs_soft_prot prot;
            n = rs_soft_sge_iov(dev, qp->pd, e->sge, e->num_sge, off, len, 0, iov, RS_SOFT_MAX_SGE, &prot);
            if (n < 0) {
                RS_DEBUG("soft rnic: qp %u send refused: %s", qp->qpn, rs_soft_prot_name(prot));
                result = n == -EFAULT ? RS_WC_LOC_PROT_ERR : RS_WC_LOC_LEN_ERR;
                break;
            }
        }
        uint8_t hdr[RS_UD_MAX_HDR_LEN];
        size_t hlen = record ? rs_ud_put_write_record(hdr, last, e->rkey, e->remote_addr + off, e->msg_id, total,
                                                      e->remote_addr, seg)
                             : rs_ud_put_send(hdr, last, (e->flags & RS_SEND_SOLICITED) != 0, total, e->msg_id, off);
        ssize_t sent = rs_ud_send_datagram(ud, &e->peer, e->peer_len, hdr, hlen, iov, n, tclass);
        if (sent < 0) {
            if (try_again(sent)) {
                result = -EAGAIN;
            } else {
                RS_SOFT_STAT(dev, tx_errors, 1);
                RS_DEBUG("soft rnic: qp %u sendmsg failed: %d", qp->qpn, (int)sent);
                result = tx_errno_status(sent);
            }
            break;
        }
        e->sent = off + len;
    } while (e->sent < total);
    rs_soft_mr_read_unlock(dev);
    return result;
}

void rs_ud_tx_kick(struct rs_soft_ud *ud)
{
    struct rs_soft_qp *qp = ud->qp;
    pthread_mutex_lock(&qp->sq_lock);
    bool want_write = false;
    struct rs_soft_send_wqe *e;
    while (rs_soft_qp_get_state(qp) == RS_QPS_RTS && (e = rs_soft_sq_next(qp)) != NULL) {
        int r = e->opcode == RS_WR_RDMA_READ ? rs_ud_read_start(ud, e) : tx_message(ud, e);
        if (r == -EAGAIN) {
            want_write = true;
            break;
        }
        if (r == -EBUSY) {
            /* Every ORD slot is taken: a finishing READ kicks the queue again. */
            __atomic_store_n(&ud->tx_stalled, true, __ATOMIC_RELEASE);
            break;
        }
        rs_soft_sq_started(qp);
        if (e->opcode == RS_WR_RDMA_READ && r == 0)
            rs_soft_sq_retire_head(qp);     /* completes when its response is placed or it times out */
        else
            rs_soft_sq_complete_head(qp, r == 0 ? RS_WC_SUCCESS : (enum rs_rnic_wc_status)r);
    }
    if (want_write != ud->want_write && ud->watch) {
        ud->want_write = want_write;
        rs_soft_watch_set(ud->watch, RS_SOFT_EV_READ | (want_write ? RS_SOFT_EV_WRITE : 0));
    }
    pthread_mutex_unlock(&qp->sq_lock);
}

int rs_soft_ud_post_send(struct rs_soft_qp *qp)
{
    if (qp->ud)
        rs_ud_tx_kick(qp->ud);
    return 0;
}
