/*
 * rc_rx.c: the RC receive machine, run on the progress thread with a bounded budget per turn.
 *
 *   HDR      read the length field and the DDP/RDMAP header (exact sizes: never a byte of payload), decode and
 *            validate it, including every per-stream check (MSN and MO per queue, a posted receive and its room,
 *            STag, PD, access rights, bounds, wrap): nothing is placed before the header passed them all.
 *   PAYLOAD  readv straight into the target (the registered region of a WRITE, the local buffer of a READ, the
 *            posted receive of a SEND) followed by the pad + CRC trailer and, when the trailer completes, the first
 *            bytes of the next header; the CRC runs over the placed bytes right after each read.
 *   trailer  CRC mismatch -> Terminate (LLP, CRC error) and ERROR. Otherwise the segment takes effect: a SEND
 *            completes its receive on its last segment, a READ completes when its response is placed, a Read
 *            Request is queued for the transmitter.
 *
 * Data of a failing FPDU may already sit in the target when its CRC is found wrong (as with any direct placement):
 * it only ever lands inside a buffer that passed the checks, and the message never completes.
 *
 * Who runs it (rc.h): whoever holds rc->rx_lock. That is the progress thread, or in RTS an application thread
 * waiting on the receive CQ (consumer progress, rs_rc_rx_inline): then the message that wakes the waiter is
 * received on the waiter's own thread, with no hop through the progress thread. An application thread
 * only runs the fast path; what needs the progress thread (the end of the stream, a fatal error, closing) is
 * handed to it with an asynchronous call, because a thread holding rx_lock never waits for the progress thread.
 */
#include <errno.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "rnic/soft/rc.h"

void rs_rc_rx_reset(struct rs_rc_qp *rc)
{
    struct rs_rc_rx *rx = &rc->rx;
    rx->state = RS_RC_RX_HDR;
    rx->hhave = 0;
    rx->cur_hdr_len = 0;
    rx->dest = RS_RC_DEST_NONE;
    rx->recv = NULL;
    rx->msg_bytes = 0;
    rx->stage_off = rx->stage_len = 0;
    /* RFC 5041: the first message of every queue carries MSN 1. */
    rx->msn_send = rx->msn_rreq = rx->msn_term = 1;
}

/* Copies up to len bytes of src into iov; returns how many. */
static size_t copy_to_iov(const struct iovec *iov, int n, const uint8_t *src, size_t len)
{
    size_t done = 0;
    for (int i = 0; i < n && done < len; i++) {
        size_t take = iov[i].iov_len < len - done ? iov[i].iov_len : len - done;
        memcpy(iov[i].iov_base, src + done, take);
        done += take;
    }
    return done;
}

static ssize_t from_stage(struct rs_rc_rx *rx, const struct iovec *iov, int n)
{
    size_t took = copy_to_iov(iov, n, rx->stage + rx->stage_off, rx->stage_len - rx->stage_off);
    rx->stage_off += took;
    if (rx->stage_off == rx->stage_len)
        rx->stage_off = rx->stage_len = 0;
    return (ssize_t)took;
}

/* Reads from the socket (through the stage, RS_RC_RX_STAGE), or from the feed buffer in tests. Bytes, 0 at EOF,
 * -EAGAIN, or -errno. */
static ssize_t rx_readv(struct rs_rc_qp *rc, struct iovec *iov, int n)
{
    struct rs_rc_rx *rx = &rc->rx;
    if (rx->stage_len > rx->stage_off)
        return from_stage(rx, iov, n);
    /* A stream socket returns less than asked only when its queue ran dry: another read in this turn would most
     * likely find nothing and cost a system call to say so. What arrives meanwhile keeps the socket readable, so
     * whoever watches it (the progress thread, or a waiter that parked it) comes back for it. */
    if (rx->short_read)
        return -EAGAIN;
    if (!rx->feed && rx->state == RS_RC_RX_HDR && rx->hhave == 0) {
        struct iovec siov = { rx->stage, sizeof(rx->stage) };
        struct msghdr sm = { .msg_iov = &siov, .msg_iovlen = 1 };
        ssize_t r = rs_soft_sys_recvmsg(rc->fd, &sm, MSG_DONTWAIT);
        if (r <= 0)
            return r == -EWOULDBLOCK ? -EAGAIN : r;
        rx->short_read = (size_t)r < sizeof(rx->stage);
        rx->stage_off = 0;
        rx->stage_len = (size_t)r;
        return from_stage(rx, iov, n);
    }
    if (rx->feed) {
        if (!rx->feed_len)
            return -EAGAIN;
        size_t total = 0;
        for (int i = 0; i < n && rx->feed_len; i++) {
            size_t take = iov[i].iov_len < rx->feed_len ? iov[i].iov_len : rx->feed_len;
            memcpy(iov[i].iov_base, rx->feed, take);
            rx->feed += take;
            rx->feed_len -= take;
            total += take;
        }
        return (ssize_t)total;
    }
    struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
    ssize_t r = rs_soft_sys_recvmsg(rc->fd, &m, MSG_DONTWAIT);
    if (r > 0) {
        size_t want = 0;
        for (int i = 0; i < n; i++)
            want += iov[i].iov_len;
        rx->short_read = (size_t)r < want;
    }
    return r == -EWOULDBLOCK ? -EAGAIN : r;
}

static struct rs_term_cause make_cause(uint8_t layer, uint8_t etype, uint8_t ecode)
{
    struct rs_term_cause c = { layer, etype, ecode };
    return c;
}

/* Terminate for a refused tagged placement (WRITE). DDP has no access-rights code, RDMAP has (RFC 5040 §7.2). */
static struct rs_term_cause tagged_cause(enum rs_soft_prot p)
{
    switch (p) {
    case RS_SOFT_PROT_PD_MISMATCH:
        return make_cause(RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_TAGGED_BUFFER, RS_TERM_DDP_TAGGED_STAG_NOT_ASSOCIATED);
    case RS_SOFT_PROT_ACCESS:
        return make_cause(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION, RS_TERM_RDMAP_ACCESS_RIGHTS);
    case RS_SOFT_PROT_WRAP:
        return make_cause(RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_TAGGED_BUFFER, RS_TERM_DDP_TAGGED_TO_WRAP);
    case RS_SOFT_PROT_BOUNDS:
        return make_cause(RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_TAGGED_BUFFER, RS_TERM_DDP_TAGGED_BASE_BOUNDS);
    case RS_SOFT_PROT_INVALID_STAG:
    default:
        return make_cause(RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_TAGGED_BUFFER, RS_TERM_DDP_TAGGED_INVALID_STAG);
    }
}

static struct rs_term_cause untagged_cause(uint8_t ecode)
{
    return make_cause(RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER, ecode);
}

static const struct rs_term_cause local_catastrophic = {
    RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_LOCAL_CATASTROPHIC, RS_TERM_RDMAP_UNSPECIFIED,
};

/* Fails the stream because of the FPDU whose header is in cur_hdr. */
static void refuse(struct rs_rc_qp *rc, struct rs_term_cause cause, int detail)
{
    struct rs_rc_rx *rx = &rc->rx;
    size_t hdr = rx->cur_hdr_len > RS_MPA_LEN_FIELD ? rx->cur_hdr_len - RS_MPA_LEN_FIELD : 0;
    rs_rc_fatal(rc, &cause, rx->cur_hdr + RS_MPA_LEN_FIELD, hdr, rx->ulpdu_len, detail);
}

static struct rs_rc_orq_entry *orq_head(struct rs_rc_qp *rc)
{
    if (rs_rc_orq_count(rc) == 0)
        return NULL;
    return &rc->orq[__atomic_load_n(&rc->orq_head, __ATOMIC_RELAXED) % rc->orq_cap];
}

/* Local SGE check of a placement range; fills iov. MR read lock held. */
static int local_iov(struct rs_rc_qp *rc, const struct rs_rnic_sge *sge, uint32_t num_sge, uint64_t offset,
                     uint64_t len, struct iovec *iov, int max)
{
    return rs_soft_sge_iov(rc->dev, rc->qp->pd, sge, num_sge, offset, len, RS_ACCESS_LOCAL_WRITE, iov, max, NULL);
}

/* Decodes and validates the header in hbuf. false when the stream failed. */
static bool rx_header(struct rs_rc_qp *rc)
{
    struct rs_rc_rx *rx = &rc->rx;
    struct rs_ddp_seg *seg = &rx->seg;
    uint16_t ulpdu_len = rs_get_be16(rx->hbuf);
    size_t have = rx->hhave < sizeof(rx->cur_hdr) ? rx->hhave : sizeof(rx->cur_hdr);
    memcpy(rx->cur_hdr, rx->hbuf, have);
    rx->cur_hdr_len = have;
    rx->ulpdu_len = ulpdu_len;
    rx->hhave = 0;
    struct rs_term_cause cause;
    if (rs_ddp_seg_parse(rx->cur_hdr + RS_MPA_LEN_FIELD, ulpdu_len, seg, &cause) != 0) {
        refuse(rc, cause, -EPROTO);
        return false;
    }
    rx->crc = rc->neg.crc ? rs_crc32c(0, rx->cur_hdr, RS_MPA_LEN_FIELD + seg->hdr_len) : 0;
    rx->pay_done = 0;
    rx->tr_have = 0;
    rx->tr_len = rs_mpa_pad(ulpdu_len) + RS_MPA_CRC_LEN;
    rx->dest = RS_RC_DEST_NONE;
    struct rs_soft_qp *qp = rc->qp;
    struct iovec scratch[RS_SOFT_MAX_SGE];

    switch (seg->ctrl.opcode) {
    case RS_RDMAP_WRITE: {
        rs_soft_mr_read_lock(rc->dev);
        enum rs_soft_prot p = rs_soft_mr_check_remote(rc->dev, qp->pd, seg->stag, seg->to, seg->payload_len,
                                                      RS_ACCESS_REMOTE_WRITE, NULL, NULL);
        rs_soft_mr_read_unlock(rc->dev);
        if (p != RS_SOFT_PROT_OK) {
            RS_INFO("soft rc: qp %u refuses RDMA WRITE to STag 0x%x TO 0x%llx len %zu: %s", qp->qpn, seg->stag,
                    (unsigned long long)seg->to, seg->payload_len, rs_soft_prot_name(p));
            refuse(rc, tagged_cause(p), -EACCES);
            return false;
        }
        rx->dest = RS_RC_DEST_WRITE;
        break;
    }
    case RS_RDMAP_READ_RESPONSE: {
        struct rs_rc_orq_entry *e = orq_head(rc);
        if (!e) {
            refuse(rc, make_cause(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                                  RS_TERM_RDMAP_UNEXPECTED_OPCODE), -EPROTO);
            return false;
        }
        if (seg->stag != e->sink_stag) {
            refuse(rc, tagged_cause(RS_SOFT_PROT_INVALID_STAG), -EPROTO);
            return false;
        }
        /* A zero-length segment further on is a placement mark from a responder on this host (rc_local.c), only
         * taken when we published the record that lets it write into our memory. */
        bool mark = seg->payload_len == 0 && seg->to > e->sink_to + e->placed &&
                    seg->to - e->sink_to <= e->length && __atomic_load_n(&rc->lread.accept_marks, __ATOMIC_ACQUIRE);
        if (mark)
            e->placed = seg->to - e->sink_to;
        else if (seg->to != e->sink_to + e->placed || seg->payload_len > e->length - e->placed) {
            refuse(rc, tagged_cause(RS_SOFT_PROT_BOUNDS), -EPROTO);
            return false;
        }
        rs_soft_mr_read_lock(rc->dev);
        int k = local_iov(rc, e->wqe->sge, e->wqe->num_sge, e->placed, seg->payload_len, scratch, RS_SOFT_MAX_SGE);
        rs_soft_mr_read_unlock(rc->dev);
        if (k < 0) {
            /* Our own READ buffer became unusable (deregistered since the READ was posted). */
            rs_rc_slot_finish(rc, e->pos, RS_RC_SLOT_FAILED, RS_WC_LOC_PROT_ERR);
            refuse(rc, local_catastrophic, -EFAULT);
            return false;
        }
        rx->dest = RS_RC_DEST_READ_RESP;
        break;
    }
    case RS_RDMAP_SEND:
    case RS_RDMAP_SEND_INVALIDATE:
    case RS_RDMAP_SEND_SE:
    case RS_RDMAP_SEND_SE_INVALIDATE: {
        if (seg->msn != rx->msn_send) {
            refuse(rc, untagged_cause(RS_TERM_DDP_UNTAGGED_INVALID_MSN_RANGE), -EPROTO);
            return false;
        }
        if (seg->mo != rx->msg_bytes) {
            refuse(rc, untagged_cause(RS_TERM_DDP_UNTAGGED_INVALID_MO), -EPROTO);
            return false;
        }
        if (!rx->recv && rs_soft_rq_take(qp, &rx->recv) != 0) {
            rx->recv = NULL;
            RS_INFO("soft rc: qp %u got a SEND (MSN %u) with no receive posted", qp->qpn, seg->msn);
            refuse(rc, untagged_cause(RS_TERM_DDP_UNTAGGED_INVALID_MSN_NO_BUFFER), -ENOBUFS);
            return false;
        }
        struct rs_soft_recv_wqe *recv = rx->recv;
        if ((uint64_t)seg->mo + seg->payload_len > recv->length) {
            struct rs_rnic_wc wc = { .status = RS_WC_LOC_LEN_ERR, .opcode = RS_WC_RECV };
            rs_soft_rq_finish(qp, recv, &wc);
            rx->recv = NULL;
            refuse(rc, untagged_cause(RS_TERM_DDP_UNTAGGED_MSG_TOO_LONG), -EMSGSIZE);
            return false;
        }
        rs_soft_mr_read_lock(rc->dev);
        int k = local_iov(rc, recv->sge, recv->num_sge, seg->mo, seg->payload_len, scratch, RS_SOFT_MAX_SGE);
        rs_soft_mr_read_unlock(rc->dev);
        if (k < 0) {
            struct rs_rnic_wc wc = { .status = RS_WC_LOC_PROT_ERR, .opcode = RS_WC_RECV };
            rs_soft_rq_finish(qp, recv, &wc);
            rx->recv = NULL;
            refuse(rc, local_catastrophic, -EFAULT);
            return false;
        }
        rx->dest = RS_RC_DEST_SEND;
        break;
    }
    case RS_RDMAP_READ_REQUEST: {
        if (seg->msn != rx->msn_rreq) {
            refuse(rc, untagged_cause(RS_TERM_DDP_UNTAGGED_INVALID_MSN_RANGE), -EPROTO);
            return false;
        }
        uint32_t limit = rc->neg.ird < rc->irq_cap ? rc->neg.ird : rc->irq_cap;
        if (rc->irq_tail - __atomic_load_n(&rc->irq_head, __ATOMIC_ACQUIRE) >= limit) {
            refuse(rc, untagged_cause(RS_TERM_DDP_UNTAGGED_INVALID_MSN_NO_BUFFER), -ENOBUFS);
            return false;
        }
        if (seg->rr.size > 0) {
            rs_soft_mr_read_lock(rc->dev);
            enum rs_soft_prot p = rs_soft_mr_check_remote(rc->dev, qp->pd, seg->rr.src_stag, seg->rr.src_to,
                                                          seg->rr.size, RS_ACCESS_REMOTE_READ, NULL, NULL);
            rs_soft_mr_read_unlock(rc->dev);
            if (p != RS_SOFT_PROT_OK) {
                RS_INFO("soft rc: qp %u refuses RDMA READ of STag 0x%x TO 0x%llx len %u: %s", qp->qpn,
                        seg->rr.src_stag, (unsigned long long)seg->rr.src_to, seg->rr.size, rs_soft_prot_name(p));
                refuse(rc, make_cause(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION,
                                      rs_soft_prot_term_ecode(p)), -EACCES);
                return false;
            }
        }
        break;
    }
    case RS_RDMAP_TERMINATE:
        rx->dest = RS_RC_DEST_TERM;
        break;
    default:
        refuse(rc, make_cause(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                              RS_TERM_RDMAP_UNEXPECTED_OPCODE), -EPROTO);
        return false;
    }
    rx->state = RS_RC_RX_PAYLOAD;
    return true;
}

/*
 * Where the rest of the payload goes, as iovecs (MR read lock held). Returns the count, or -1 with *cause set when
 * the target is no longer acceptable (a region deregistered or invalidated since the header was checked).
 */
static int dest_iov(struct rs_rc_qp *rc, struct iovec *iov, int max, struct rs_term_cause *cause)
{
    struct rs_rc_rx *rx = &rc->rx;
    uint64_t remain = rx->seg.payload_len - rx->pay_done;
    if (remain == 0)
        return 0;
    switch (rx->dest) {
    case RS_RC_DEST_WRITE: {
        uint8_t *where = NULL;
        enum rs_soft_prot p = rs_soft_mr_check_remote(rc->dev, rc->qp->pd, rx->seg.stag, rx->seg.to + rx->pay_done,
                                                      remain, RS_ACCESS_REMOTE_WRITE, &where, NULL);
        if (p != RS_SOFT_PROT_OK) {
            *cause = tagged_cause(p);
            return -1;
        }
        iov[0].iov_base = where;
        iov[0].iov_len = remain;
        return 1;
    }
    case RS_RC_DEST_READ_RESP: {
        struct rs_rc_orq_entry *e = orq_head(rc);
        int k = e ? local_iov(rc, e->wqe->sge, e->wqe->num_sge, e->placed + rx->pay_done, remain, iov, max) : -1;
        if (k < 0)
            *cause = local_catastrophic;
        return k < 0 ? -1 : k;
    }
    case RS_RC_DEST_SEND: {
        struct rs_soft_recv_wqe *recv = rx->recv;
        int k = recv ? local_iov(rc, recv->sge, recv->num_sge, rx->seg.mo + rx->pay_done, remain, iov, max) : -1;
        if (k < 0)
            *cause = local_catastrophic;
        return k < 0 ? -1 : k;
    }
    case RS_RC_DEST_TERM: {
        /* The first bytes are kept (terminated headers); anything longer is read and dropped. */
        int n = 0;
        if (rx->pay_done < sizeof(rx->term)) {
            size_t take = sizeof(rx->term) - rx->pay_done;
            if (take > remain)
                take = remain;
            iov[n].iov_base = rx->term + rx->pay_done;
            iov[n].iov_len = take;
            n++;
            remain -= take;
        }
        if (remain) {
            iov[n].iov_base = rx->scratch;
            iov[n].iov_len = remain < sizeof(rx->scratch) ? remain : sizeof(rx->scratch);
            n++;
        }
        return n;
    }
    default:
        *cause = local_catastrophic;
        return -1;
    }
}

/* A Terminate from the peer: the QP fails; an outstanding READ it names gets the remote error. */
static void rx_peer_terminate(struct rs_rc_qp *rc)
{
    struct rs_rc_rx *rx = &rc->rx;
    uint32_t word = rx->seg.term_word;
    struct rs_term_cause cause = rs_term_cause_of(word);
    RS_INFO("soft rc: qp %u received Terminate: %s (layer %u etype %u ecode 0x%02x)", rc->qp->qpn,
            rs_term_cause_str(&cause), cause.layer, cause.etype, cause.ecode);
    size_t kept = rx->seg.payload_len < sizeof(rx->term) ? rx->seg.payload_len : sizeof(rx->term);
    bool names_read = (word & RS_TERM_FLAG_R) != 0;
    if (!names_read && (word & RS_TERM_FLAG_D) && kept >= 2 + RS_DDP_UNTAGGED_HDR_LEN) {
        const uint8_t *ctrl = rx->term + 2;
        names_read = !(ctrl[0] & RS_DDP_FLAG_TAGGED) && (ctrl[1] & 0x0f) == RS_RDMAP_READ_REQUEST;
    }
    struct rs_rc_orq_entry *e = orq_head(rc);
    if (names_read && e) {
        bool protection = (cause.layer == RS_TERM_LAYER_RDMAP && cause.etype == RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION) ||
                          (cause.layer == RS_TERM_LAYER_DDP && cause.etype == RS_TERM_DDP_ETYPE_TAGGED_BUFFER);
        rs_rc_slot_finish(rc, e->pos, RS_RC_SLOT_FAILED, protection ? RS_WC_REM_ACCESS_ERR : RS_WC_REM_INV_REQ_ERR);
    }
    rc->term_sent = true;               /* RFC 5040: a Terminate is never answered with one */
    rs_rc_fatal(rc, NULL, NULL, 0, 0, -EREMOTEIO);
}

/* The trailer is complete: check the CRC, then let the segment take effect. Sets *kick_tx when the transmitter has
 * new work (a Read Request, a freed ORD slot). false when the stream failed. */
static bool rx_finish(struct rs_rc_qp *rc, bool *kick_tx)
{
    struct rs_rc_rx *rx = &rc->rx;
    struct rs_ddp_seg *seg = &rx->seg;
    size_t pad = rx->tr_len - RS_MPA_CRC_LEN;
    uint32_t crc = pad && rc->neg.crc ? rs_crc32c(rx->crc, rx->trailer, pad) : rx->crc;
    if (rc->neg.crc && crc != rs_crc32c_wire_get(rx->trailer + pad)) {
        RS_INFO("soft rc: qp %u FPDU CRC mismatch (ULPDU %u bytes)", rc->qp->qpn, rx->ulpdu_len);
        refuse(rc, make_cause(RS_TERM_LAYER_LLP, RS_TERM_LLP_ETYPE_MPA, RS_TERM_LLP_CRC), -EBADMSG);
        return false;
    }
    rx->state = RS_RC_RX_HDR;
    struct rs_soft_qp *qp = rc->qp;
    switch (seg->ctrl.opcode) {
    case RS_RDMAP_WRITE:
        break;
    case RS_RDMAP_READ_RESPONSE: {
        struct rs_rc_orq_entry *e = orq_head(rc);
        e->placed += seg->payload_len;
        if (!seg->ctrl.last)
            break;
        if (e->placed != e->length) {
            refuse(rc, make_cause(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                                  RS_TERM_RDMAP_CATASTROPHIC_STREAM), -EPROTO);
            return false;
        }
        uint64_t pos = e->pos;
        __atomic_add_fetch(&rc->orq_head, 1, __ATOMIC_ACQ_REL);
        rs_rc_slot_finish(rc, pos, RS_RC_SLOT_DONE, RS_WC_SUCCESS);
        *kick_tx = true;
        break;
    }
    case RS_RDMAP_SEND:
    case RS_RDMAP_SEND_INVALIDATE:
    case RS_RDMAP_SEND_SE:
    case RS_RDMAP_SEND_SE_INVALIDATE: {
        rx->msg_bytes += seg->payload_len;
        if (!seg->ctrl.last)
            break;
        struct rs_rnic_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.status = RS_WC_SUCCESS;
        wc.opcode = RS_WC_RECV;
        wc.byte_len = (uint32_t)rx->msg_bytes;
        if (seg->ctrl.opcode == RS_RDMAP_SEND_SE || seg->ctrl.opcode == RS_RDMAP_SEND_SE_INVALIDATE)
            wc.flags |= RS_WC_SOLICITED;
        if (seg->ctrl.opcode == RS_RDMAP_SEND_INVALIDATE || seg->ctrl.opcode == RS_RDMAP_SEND_SE_INVALIDATE) {
            /* The invalidation takes effect before the receive is reported (RFC 5040 §5.3). */
            enum rs_soft_prot p = rs_soft_mr_invalidate_remote(rc->dev, qp->pd, seg->inval_stag);
            if (p != RS_SOFT_PROT_OK) {
                RS_INFO("soft rc: qp %u cannot invalidate STag 0x%x: %s", qp->qpn, seg->inval_stag,
                        rs_soft_prot_name(p));
                refuse(rc, make_cause(RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION,
                                      p == RS_SOFT_PROT_INVALID_STAG ? RS_TERM_RDMAP_INVALID_STAG
                                                                     : RS_TERM_RDMAP_STAG_NOT_INVALIDATABLE),
                       -EACCES);
                return false;
            }
            wc.flags |= RS_WC_WITH_INVALIDATE;
            wc.invalidated_rkey = seg->inval_stag;
        }
        rs_soft_rq_finish(qp, rx->recv, &wc);
        rx->recv = NULL;
        rx->msg_bytes = 0;
        rx->msn_send++;
        break;
    }
    case RS_RDMAP_READ_REQUEST:
        rx->msn_rreq++;
        if (__atomic_load_n(&rc->fin_sent, __ATOMIC_ACQUIRE))
            break;                      /* we closed our half: the response could not be sent any more */
        rc->irq[rc->irq_tail % rc->irq_cap].rr = seg->rr;
        rc->irq[rc->irq_tail % rc->irq_cap].sent = 0;
        __atomic_store_n(&rc->irq_tail, rc->irq_tail + 1, __ATOMIC_RELEASE);
        *kick_tx = true;
        break;
    case RS_RDMAP_TERMINATE:
        rx_peer_terminate(rc);
        return false;
    default:
        break;
    }
    return true;
}

/* One readv of payload + trailer (+ the next header's first bytes). Returns bytes read or <= 0 as rx_readv. */
static ssize_t rx_payload(struct rs_rc_qp *rc, bool *fpdu_done, bool *failed)
{
    struct rs_rc_rx *rx = &rc->rx;
    struct iovec iov[RS_SOFT_MAX_SGE + 3];
    struct rs_term_cause cause;
    rs_soft_mr_read_lock(rc->dev);
    int n = dest_iov(rc, iov, RS_SOFT_MAX_SGE, &cause);
    if (n < 0) {
        rs_soft_mr_read_unlock(rc->dev);
        refuse(rc, cause, -EACCES);
        *failed = true;
        return -EPROTO;
    }
    int payload_iovs = n;
    iov[n].iov_base = rx->trailer + rx->tr_have;
    iov[n].iov_len = rx->tr_len - rx->tr_have;
    n++;
    iov[n].iov_base = rx->hbuf;
    iov[n].iov_len = RS_RC_RX_LOOKAHEAD;
    n++;
    ssize_t r = rx_readv(rc, iov, n);
    if (r > 0) {
        size_t left = (size_t)r;
        for (int i = 0; i < payload_iovs && left > 0; i++) {
            size_t take = iov[i].iov_len < left ? iov[i].iov_len : left;
            if (rc->neg.crc)
                rx->crc = rs_crc32c(rx->crc, iov[i].iov_base, take);
            rx->pay_done += take;
            left -= take;
        }
        size_t tr = rx->tr_len - rx->tr_have;
        if (tr > left)
            tr = left;
        rx->tr_have += tr;
        left -= tr;
        rx->hhave = left;               /* lookahead: the next FPDU's first bytes */
        *fpdu_done = rx->tr_have == rx->tr_len;
    }
    rs_soft_mr_read_unlock(rc->dev);
    return r;
}

/* Bytes of header to collect before decoding. */
static size_t hdr_target(const struct rs_rc_rx *rx)
{
    if (rx->hhave < RS_MPA_LEN_FIELD + 2)
        return RS_RC_RX_LOOKAHEAD;      /* every valid FPDU is longer than this */
    size_t ulpdu = rs_get_be16(rx->hbuf);
    size_t hl = rs_ddp_hdr_len(rx->hbuf + RS_MPA_LEN_FIELD);
    size_t target = RS_MPA_LEN_FIELD + (ulpdu < hl ? ulpdu : hl);
    return target < rx->hhave ? rx->hhave : target;
}

static void rx_kick_call(void *arg)
{
    rs_rc_rx_run(arg);
}

/* An application thread receiving inline met something only the progress thread may handle: queue it a turn. */
static void rx_hand_over(struct rs_rc_qp *rc)
{
    if (rs_soft_progress_call(rc->dev, rx_kick_call, rc) != 0)
        RS_WARN("soft rc: qp %u cannot hand its receive side to the progress thread (out of memory)", rc->qp->qpn);
}

/* EOF or a socket error while reading. */
static void rx_stream_end(struct rs_rc_qp *rc, ssize_t r)
{
    struct rs_rc_rx *rx = &rc->rx;
    if (rc->rx_inline) {
        /* The read consumed the error (SO_ERROR is reported once): keep it for the progress thread's turn. */
        __atomic_store_n(&rc->rx_end_pending, true, __ATOMIC_RELEASE);
        rc->rx_end_result = (int)r;
        rx_hand_over(rc);
        return;
    }
    __atomic_store_n(&rc->rx_eof, true, __ATOMIC_RELEASE);
    rs_rc_watch_update(rc);
    if (r == 0 && rx->state == RS_RC_RX_HDR && rx->hhave == 0) {
        /* The peer closed at a message boundary: an orderly disconnect (iWARP has no disconnect message). */
        __atomic_store_n(&rc->peer_fin, true, __ATOMIC_RELEASE);
        if (rs_rc_conn(rc) == RS_RC_RTS) {
            pthread_mutex_lock(&rc->tx_lock);
            rs_rc_set_conn(rc, RS_RC_CLOSING);
            pthread_mutex_unlock(&rc->tx_lock);
            rs_soft_qp_set_state(rc->qp, RS_QPS_CLOSING);
            RS_DEBUG("soft rc: qp %u peer closed its half", rc->qp->qpn);
        }
        rs_rc_close_progress(rc);
        return;
    }
    if (r == 0) {
        RS_INFO("soft rc: qp %u connection closed in the middle of an FPDU", rc->qp->qpn);
        rc->abort_close = true;
        rs_rc_fatal(rc, NULL, NULL, 0, 0, -ECONNRESET);
        return;
    }
    RS_INFO("soft rc: qp %u connection lost: %d", rc->qp->qpn, (int)r);
    rc->abort_close = true;
    rs_rc_fatal(rc, NULL, NULL, 0, 0, (int)r);
}

/* One receive turn, rx_lock held. */
static void rx_run_locked(struct rs_rc_qp *rc)
{
    struct rs_rc_rx *rx = &rc->rx;
    size_t bytes = 0;
    int fpdus = 0;
    bool kick_tx = false;
    rx->drained = false;
    rx->short_read = false;
    if (rc->rx_stop && !rc->rx_inline) {
        /* The fatal error an application thread met (rs_rc_fatal): its queued call may not have run yet, or could
         * not be queued. Entering ERROR is idempotent; until then the readable socket would call us in a loop. */
        rs_soft_qp_enter_error(rc->qp);
        return;
    }
    if (rc->rx_end_pending && !rc->rx_inline) {
        __atomic_store_n(&rc->rx_end_pending, false, __ATOMIC_RELEASE);
        rx_stream_end(rc, rc->rx_end_result);
        return;
    }
    while (fpdus < RS_RC_RX_BUDGET_FPDUS && bytes < RS_RC_RX_BUDGET_BYTES && !rc->peer_fin && !rc->rx_stop &&
           !rc->rx_end_pending && (rc->fd >= 0 || rx->feed)) {
        enum rs_rc_conn conn = rs_rc_conn(rc);
        if (conn != RS_RC_RTS && conn != RS_RC_CLOSING)
            break;
        ssize_t r;
        if (rx->state == RS_RC_RX_HDR) {
            size_t target = hdr_target(rx);
            if (rx->hhave < target) {
                struct iovec iov = { rx->hbuf + rx->hhave, target - rx->hhave };
                r = rx_readv(rc, &iov, 1);
                if (r <= 0) {
                    if (r != -EAGAIN)
                        rx_stream_end(rc, r);
                    rx->drained = r == -EAGAIN;
                    break;
                }
                rx->hhave += (size_t)r;
                bytes += (size_t)r;
                continue;
            }
            if (!rx_header(rc))
                break;
            continue;
        }
        bool done = false, failed = false;
        r = rx_payload(rc, &done, &failed);
        if (failed)
            break;
        if (r <= 0) {
            if (r != -EAGAIN)
                rx_stream_end(rc, r);
            rx->drained = r == -EAGAIN;
            break;
        }
        bytes += (size_t)r;
        if (done) {
            fpdus++;
            if (!rx_finish(rc, &kick_tx))
                break;
        }
    }
    enum rs_rc_conn conn = rs_rc_conn(rc);
    /* An application thread sends what the socket takes and leaves Read Responses to the progress thread (the
     * transmitter keeps the writable event armed for them), as a posting thread does. */
    if (kick_tx && (conn == RS_RC_RTS || conn == RS_RC_CLOSING))
        rs_rc_tx_run(rc, !rc->rx_inline);
    if (rs_rc_conn(rc) == RS_RC_CLOSING) {
        if (rc->rx_inline)
            rx_hand_over(rc);
        else
            rs_rc_close_progress(rc);
    }
}

void rs_rc_rx_run(struct rs_rc_qp *rc)
{
    pthread_mutex_lock(&rc->rx_lock);
    rx_run_locked(rc);
    pthread_mutex_unlock(&rc->rx_lock);
}

static void park(struct rs_rc_qp *rc)
{
    pthread_mutex_lock(&rc->tx_lock);
    bool was = rc->rx_parked;
    rc->rx_parked = true;
    rs_rc_watch_update_locked(rc);
    pthread_mutex_unlock(&rc->tx_lock);
    if (!was && rc->park_timer)
        rs_soft_timer_arm(rc->park_timer, RS_RC_RX_PARK_MS);
}

void rs_rc_park_timer_cb(struct rs_soft_timer *t, void *arg)
{
    (void)t;
    struct rs_rc_qp *rc = arg;
    pthread_mutex_lock(&rc->tx_lock);
    rc->rx_parked = false;
    rs_rc_watch_update_locked(rc);
    pthread_mutex_unlock(&rc->tx_lock);
}

void rs_rc_rx_event(struct rs_rc_qp *rc)
{
    /*
     * A thread blocked on the receive CQ watches this socket too (rs_soft_cq_wait_begin) and was woken by the same
     * bytes: receiving them here as well would only race it, and the completion would then wake it (and whoever
     * else watches the CQ fd) a second time. The socket is level-triggered, so stop watching it for a while rather
     * than return and be woken again at once. Same when an application thread is receiving right now.
     */
    bool rts = rs_rc_conn(rc) == RS_RC_RTS;
    if (rts && rs_soft_cq_has_blocked_waiter(rc->qp->recv_cq)) {
        park(rc);
        return;
    }
    if (pthread_mutex_trylock(&rc->rx_lock) != 0) {
        if (rts) {
            park(rc);
            return;
        }
        pthread_mutex_lock(&rc->rx_lock);
    }
    rx_run_locked(rc);
    pthread_mutex_unlock(&rc->rx_lock);
}

static __thread bool tls_rx_inline;

bool rs_rc_rx_inline_here(void)
{
    return tls_rx_inline;
}

bool rs_rc_rx_inline(struct rs_rc_qp *rc, bool *drained)
{
    *drained = true;
    if (rs_rc_conn(rc) != RS_RC_RTS || __atomic_load_n(&rc->rx_eof, __ATOMIC_ACQUIRE))
        return false;
    bool ran = false;
    pthread_mutex_lock(&rc->rx_lock);
    if (rc->fd >= 0 && !rc->rx_stop && !rc->rx_end_pending && !rc->peer_fin && rs_rc_conn(rc) == RS_RC_RTS) {
        rc->rx_inline = true;
        tls_rx_inline = true;
        rx_run_locked(rc);
        tls_rx_inline = false;
        rc->rx_inline = false;
        ran = true;
        *drained = rc->rx.drained;
    }
    pthread_mutex_unlock(&rc->rx_lock);
    return ran;
}

bool rs_rc_rx_discard(struct rs_rc_qp *rc)
{
    rc->rx.short_read = false;      /* read until EAGAIN or EOF: only EOF ends the draining */
    for (int i = 0; i < 64; i++) {
        struct iovec iov = { rc->rx.scratch, sizeof(rc->rx.scratch) };
        ssize_t r = rx_readv(rc, &iov, 1);
        if (r == -EAGAIN)
            return false;
        if (r <= 0) {
            __atomic_store_n(&rc->rx_eof, true, __ATOMIC_RELEASE);
            return true;
        }
    }
    return false;
}
