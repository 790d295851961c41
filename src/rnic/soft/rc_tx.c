/*
 * rc_tx.c: the RC transmitter. Work requests and Read Responses are cut into FPDUs sized for the TCP MSS (on
 * loopback-like links, for the receiving CPU: see fpdu_size) and handed to the kernel with sendmsg: each FPDU is
 * [length + DDP/RDMAP header][payload pieces straight from the registered memory][pad + CRC], the CRC computed over
 * those same pieces, so the payload is never copied.
 *
 * A batch of up to RS_RC_TX_BATCH_FPDUS FPDUs and about RS_RC_TX_BATCH_BYTES goes to one sendmsg; a new batch is
 * built only when the previous one is entirely in the socket, so messages interleave at FPDU boundaries only. A
 * SEND or WRITE completes when its last FPDU was accepted by the socket (rnic.h, soft provider); an RDMA READ when
 * its response is placed (rc_rx.c). Completions leave in send-queue order (rs_rc_slot_finish).
 */
#include <errno.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "rnic/soft/rc.h"

/* The FPDU size for a message of msg_len bytes on this connection's link (see RS_RC_FPDU_LOCAL in rc.h). */
static size_t fpdu_size(const struct rs_rc_qp *rc, uint64_t msg_len)
{
    if (rc->fpdu_max < RS_RC_FPDU_LOCAL)
        return rc->fpdu_max;
    return msg_len >= RS_RC_FPDU_MAX ? RS_RC_FPDU_MAX : RS_RC_FPDU_LOCAL;
}

/* Payload bytes an FPDU with a header of hdr_len can carry: a multiple of 4, so full FPDUs need no pad. */
static size_t payload_room(const struct rs_rc_qp *rc, size_t hdr_len, uint64_t msg_len)
{
    size_t room = fpdu_size(rc, msg_len) - RS_MPA_LEN_FIELD - hdr_len - RS_MPA_CRC_LEN;
    return room & ~(size_t)3;
}

static void batch_reset(struct rs_rc_tx *tx)
{
    tx->iov_n = tx->iov_pos = 0;
    tx->iov_off = 0;
    tx->bytes = tx->sent = 0;
    tx->fpdu_n = tx->fpdu_pos = 0;
    tx->src_n = 0;
}

bool rs_rc_tx_idle_locked(const struct rs_rc_qp *rc)
{
    return rc->tx.iov_pos >= rc->tx.iov_n && rc->tx.raw_sent >= rc->tx.raw_len;
}

bool rs_rc_tx_quiescent_locked(struct rs_rc_qp *rc)
{
    return rs_rc_tx_idle_locked(rc) && !rc->tx.cur && !rs_rc_irq_pending(rc);
}

int rs_rc_tx_queue_raw(struct rs_rc_qp *rc, const uint8_t *bytes, size_t len)
{
    struct rs_rc_tx *tx = &rc->tx;
    if (tx->raw_sent >= tx->raw_len)
        tx->raw_len = tx->raw_sent = 0;
    if (len > sizeof(tx->raw) - tx->raw_len)
        return -ENOSPC;
    memcpy(tx->raw + tx->raw_len, bytes, len);
    tx->raw_len += len;
    return 0;
}

/* Completes the work requests whose last FPDU the socket accepted (FPDUs [fpdu_done, fpdu_pos)). tx_lock held,
 * MR lock not held. */
static void ack_sent_fpdus(struct rs_rc_qp *rc, int *fpdu_done)
{
    struct rs_rc_tx *tx = &rc->tx;
    for (; *fpdu_done < tx->fpdu_pos; (*fpdu_done)++) {
        int64_t pos = tx->fpdu[*fpdu_done].done_pos;
        if (pos >= 0)
            rs_rc_slot_finish(rc, (uint64_t)pos, RS_RC_SLOT_DONE, RS_WC_SUCCESS);
    }
}

/* Advances the batch cursor by n sent bytes. */
static void batch_advance(struct rs_rc_tx *tx, size_t n)
{
    tx->sent += n;
    while (n > 0 && tx->iov_pos < tx->iov_n) {
        size_t left = tx->iov[tx->iov_pos].iov_len - tx->iov_off;
        if (n < left) {
            tx->iov_off += n;
            n = 0;
        } else {
            n -= left;
            tx->iov_pos++;
            tx->iov_off = 0;
        }
    }
    while (tx->fpdu_pos < tx->fpdu_n && tx->fpdu[tx->fpdu_pos].end <= tx->sent)
        tx->fpdu_pos++;
}

/* Read Response payload is only sent while its region is still what it was when the FPDU was built (and its
 * CRC computed). MR read lock held. */
static bool sources_still_valid(struct rs_rc_qp *rc)
{
    struct rs_rc_tx *tx = &rc->tx;
    for (int i = 0; i < tx->src_n; i++) {
        uint8_t *where = NULL;
        if (tx->src[i].len == 0)
            continue;
        enum rs_soft_prot p = rs_soft_mr_check_remote(rc->dev, rc->qp->pd, tx->src[i].stag, tx->src[i].to,
                                                      tx->src[i].len, RS_ACCESS_REMOTE_READ, &where, NULL);
        if (p != RS_SOFT_PROT_OK || where != tx->src[i].where)
            return false;
    }
    return true;
}

/*
 * Hands the batch remainder and then the raw bytes to the socket. Returns 0 when everything went, -EAGAIN when
 * the socket is full, -EFAULT when a Read Response source vanished (the stream cannot continue), or the socket
 * error. tx_lock held.
 */
static int tx_push(struct rs_rc_qp *rc)
{
    struct rs_rc_tx *tx = &rc->tx;
    int fpdu_done = tx->fpdu_pos;
    int result = 0;
    if (tx->iov_pos < tx->iov_n) {
        bool locked = tx->src_n > 0;
        if (locked) {
            rs_soft_mr_read_lock(rc->dev);
            if (!sources_still_valid(rc)) {
                rs_soft_mr_read_unlock(rc->dev);
                return -EFAULT;
            }
        }
        while (tx->iov_pos < tx->iov_n) {
            struct iovec saved = tx->iov[tx->iov_pos];
            tx->iov[tx->iov_pos].iov_base = (uint8_t *)saved.iov_base + tx->iov_off;
            tx->iov[tx->iov_pos].iov_len = saved.iov_len - tx->iov_off;
            struct msghdr m = { .msg_iov = &tx->iov[tx->iov_pos], .msg_iovlen = (size_t)(tx->iov_n - tx->iov_pos) };
            ssize_t n = rs_soft_sys_sendmsg(rc->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
            tx->iov[tx->iov_pos] = saved;
            if (n < 0) {
                result = n == -EWOULDBLOCK ? -EAGAIN : (int)n;
                break;
            }
            batch_advance(tx, (size_t)n);
        }
        if (locked)
            rs_soft_mr_read_unlock(rc->dev);
        ack_sent_fpdus(rc, &fpdu_done);
        if (result)
            return result;
        batch_reset(tx);
    }
    while (tx->raw_sent < tx->raw_len) {
        struct iovec iov = { tx->raw + tx->raw_sent, tx->raw_len - tx->raw_sent };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t n = rs_soft_sys_sendmsg(rc->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0)
            return n == -EWOULDBLOCK ? -EAGAIN : (int)n;
        tx->raw_sent += (size_t)n;
    }
    tx->raw_len = tx->raw_sent = 0;
    return 0;
}

bool rs_rc_tx_cut_batch(struct rs_rc_qp *rc)
{
    struct rs_rc_tx *tx = &rc->tx;
    if (tx->iov_pos >= tx->iov_n) {
        batch_reset(tx);
        return true;
    }
    size_t fpdu_start = tx->fpdu_pos > 0 ? tx->fpdu[tx->fpdu_pos - 1].end : 0;
    if (tx->sent == fpdu_start) {
        batch_reset(tx);                    /* at an FPDU boundary: nothing of the rest has left */
        return true;
    }
    /* Mid-FPDU: the peer must get the whole FPDU before anything else, so copy its unsent rest. */
    size_t rest = tx->fpdu[tx->fpdu_pos].end - tx->sent;
    bool ok = true;
    if (tx->src_n > 0) {
        rs_soft_mr_read_lock(rc->dev);
        ok = sources_still_valid(rc);
    }
    size_t copied = 0;
    int i = tx->iov_pos;
    size_t off = tx->iov_off;
    while (ok && copied < rest && i < tx->iov_n) {
        size_t take = tx->iov[i].iov_len - off;
        if (take > rest - copied)
            take = rest - copied;
        memcpy(tx->stage + copied, (const uint8_t *)tx->iov[i].iov_base + off, take);
        copied += take;
        off = 0;
        i++;
    }
    if (tx->src_n > 0)
        rs_soft_mr_read_unlock(rc->dev);
    batch_reset(tx);
    if (!ok || copied != rest)
        return false;           /* cannot finish the FPDU honestly: the caller resets the connection instead */
    tx->iov[0].iov_base = tx->stage;
    tx->iov[0].iov_len = rest;
    tx->iov_n = 1;
    tx->bytes = rest;
    tx->fpdu[0].end = rest;
    tx->fpdu[0].done_pos = -1;
    tx->fpdu_n = 1;
    return true;
}

/* ---- building FPDUs ---- */

/* Finishes the FPDU whose header sits in tx->hdr[n] and payload in iov[first_payload..iov_n): trailer, bookkeeping.
 * crc covers the length field, header and payload. */
static void close_fpdu(struct rs_rc_qp *rc, size_t ulpdu_len, uint32_t crc, int64_t done_pos)
{
    struct rs_rc_tx *tx = &rc->tx;
    int n = tx->fpdu_n;
    size_t t = rs_mpa_fpdu_trailer(tx->trailer[n], ulpdu_len, crc);
    if (!rc->neg.crc)
        memset(tx->trailer[n] + t - RS_MPA_CRC_LEN, 0, RS_MPA_CRC_LEN);    /* not negotiated: zero (as siw) */
    tx->iov[tx->iov_n].iov_base = tx->trailer[n];
    tx->iov[tx->iov_n].iov_len = t;
    tx->iov_n++;
    tx->bytes += RS_MPA_LEN_FIELD + ulpdu_len + t;
    tx->fpdu[n].end = tx->bytes;
    tx->fpdu[n].done_pos = done_pos;
    tx->fpdu_n++;
}

/* Marks the WQE being segmented as failed with status and stops transmission (the QP is going to ERROR). */
static void fail_cur(struct rs_rc_qp *rc, enum rs_rnic_wc_status status, int detail)
{
    struct rs_rc_tx *tx = &rc->tx;
    rs_rc_slot_finish(rc, tx->cur_pos, RS_RC_SLOT_FAILED, status);
    tx->cur = NULL;
    rc->tx_stopped = true;
    rc->tx_failed = true;
    rc->tx_fail_detail = detail;
}

/* Picks the next WQE to segment, honouring the ORD limit and fences. true when tx->cur is set. tx_lock held. */
static bool start_next_wqe(struct rs_rc_qp *rc)
{
    struct rs_rc_tx *tx = &rc->tx;
    struct rs_soft_qp *qp = rc->qp;
    if (rc->disconnect_requested || __atomic_load_n(&rc->peer_fin, __ATOMIC_ACQUIRE))
        return false;                       /* closing: what was not started is flushed */
    pthread_mutex_lock(&qp->sq_lock);
    struct rs_soft_send_wqe *wqe = rs_soft_sq_next(qp);
    if (!wqe) {
        pthread_mutex_unlock(&qp->sq_lock);
        return false;
    }
    uint32_t reads = rs_rc_orq_count(rc);
    if ((wqe->flags & RS_SEND_FENCE) && reads > 0) {
        pthread_mutex_unlock(&qp->sq_lock);
        return false;                       /* resumes when the last outstanding READ completes */
    }
    if (wqe->opcode == RS_WR_RDMA_READ && (reads >= rc->neg.ord || reads >= rc->orq_cap)) {
        pthread_mutex_unlock(&qp->sq_lock);
        return false;                       /* ORD reached: resumes when a READ completes */
    }
    uint64_t pos = qp->sq.next;
    rs_soft_sq_started(qp);
    rc->slot_state[pos % qp->sq.capacity] = RS_RC_SLOT_PENDING;
    pthread_mutex_unlock(&qp->sq_lock);

    wqe->sent = 0;
    tx->cur = wqe;
    tx->cur_pos = pos;
    switch (wqe->opcode) {
    case RS_WR_SEND:
    case RS_WR_SEND_WITH_INVALIDATE:
        tx->cur_msn = ++tx->msn_send;
        break;
    case RS_WR_RDMA_WRITE:
        break;
    case RS_WR_RDMA_READ: {
        if (wqe->length > RS_SOFT_MAX_RC_MSG) {
            fail_cur(rc, RS_WC_LOC_LEN_ERR, -EMSGSIZE);
            return false;
        }
        /* The sink must be writable before we ask for data to be sent into it. */
        struct iovec scratch[RS_SOFT_MAX_SGE];
        enum rs_soft_prot prot;
        rs_soft_mr_read_lock(rc->dev);
        int k = rs_soft_sge_iov(rc->dev, qp->pd, wqe->sge, wqe->num_sge, 0, wqe->length, RS_ACCESS_LOCAL_WRITE,
                                scratch, RS_SOFT_MAX_SGE, &prot);
        rs_soft_mr_read_unlock(rc->dev);
        if (k < 0) {
            fail_cur(rc, k == -EFAULT ? RS_WC_LOC_PROT_ERR : RS_WC_LOC_LEN_ERR, -EFAULT);
            return false;
        }
        break;
    }
    default:
        /* WRITE_WITH_IMM (caps.has_write_with_imm is false) and anything else RC cannot carry. */
        fail_cur(rc, RS_WC_GENERAL_ERR, -EOPNOTSUPP);
        return false;
    }
    return true;
}

/* Room for one more FPDU with up to max_payload_iov payload pieces? The byte bound keeps a batch (the unit of
 * interleaving between the send queue and Read Responses, and of a progress-thread turn) the same whatever the
 * FPDU size. */
static bool batch_has_room(const struct rs_rc_tx *tx, int max_payload_iov)
{
    return tx->fpdu_n < RS_RC_TX_BATCH_FPDUS && tx->bytes < RS_RC_TX_BATCH_BYTES &&
           tx->iov_n + 2 + max_payload_iov <= RS_RC_TX_IOV_MAX;
}

/* Adds one FPDU of the current (or next) send-queue WQE. Returns true if one was added. tx_lock held. */
static bool build_sq_fpdu(struct rs_rc_qp *rc)
{
    struct rs_rc_tx *tx = &rc->tx;
    struct rs_soft_qp *qp = rc->qp;
    if (!tx->cur && !start_next_wqe(rc))
        return false;
    struct rs_soft_send_wqe *wqe = tx->cur;
    int max_pieces = wqe->inline_data ? 1 : (int)(wqe->num_sge ? wqe->num_sge : 1);
    if (!batch_has_room(tx, max_pieces))
        return false;

    uint8_t *hdr = tx->hdr[tx->fpdu_n];
    uint8_t *ddp = hdr + RS_MPA_LEN_FIELD;
    size_t hl, room, chunk = 0;
    bool last;
    uint64_t remaining = wqe->length - wqe->sent;
    int64_t done_pos = (int64_t)tx->cur_pos;
    switch (wqe->opcode) {
    case RS_WR_SEND:
    case RS_WR_SEND_WITH_INVALIDATE: {
        hl = RS_DDP_UNTAGGED_HDR_LEN;
        room = payload_room(rc, hl, wqe->length);
        chunk = remaining < room ? remaining : room;
        last = chunk == remaining;
        bool se = (wqe->flags & RS_SEND_SOLICITED) != 0;
        bool inv = wqe->opcode == RS_WR_SEND_WITH_INVALIDATE;
        uint8_t op = inv ? (se ? RS_RDMAP_SEND_SE_INVALIDATE : RS_RDMAP_SEND_INVALIDATE)
                         : (se ? RS_RDMAP_SEND_SE : RS_RDMAP_SEND);
        rs_ddp_untagged_hdr(ddp, op, last, inv ? wqe->invalidate_rkey : 0, RS_DDP_QN_SEND, tx->cur_msn,
                            (uint32_t)wqe->sent);
        break;
    }
    case RS_WR_RDMA_WRITE:
        hl = RS_DDP_TAGGED_HDR_LEN;
        room = payload_room(rc, hl, wqe->length);
        chunk = remaining < room ? remaining : room;
        last = chunk == remaining;
        rs_ddp_tagged_hdr(ddp, RS_RDMAP_WRITE, last, wqe->rkey, wqe->remote_addr + wqe->sent);
        break;
    case RS_WR_RDMA_READ: {
        rs_rc_local_before_read(rc, wqe->num_sge);
        struct rs_rdmap_read_req rr = {
            .sink_stag = wqe->num_sge ? wqe->sge[0].lkey : 0,
            .sink_to = wqe->num_sge ? wqe->sge[0].addr : 0,
            .size = (uint32_t)wqe->length,
            .src_stag = wqe->rkey,
            .src_to = wqe->remote_addr,
        };
        hl = rs_rdmap_read_req_hdr(ddp, ++tx->msn_rreq, &rr);
        last = true;
        done_pos = -1;                      /* completes when the response is placed */
        uint64_t tail = __atomic_load_n(&rc->orq_tail, __ATOMIC_RELAXED);
        struct rs_rc_orq_entry *e = &rc->orq[tail % rc->orq_cap];
        e->wqe = wqe;
        e->sink_stag = rr.sink_stag;
        e->sink_to = rr.sink_to;
        e->length = wqe->length;
        e->placed = 0;
        e->pos = tx->cur_pos;
        /* Published before the request can leave: the response may arrive right after sendmsg returns. */
        __atomic_store_n(&rc->orq_tail, tail + 1, __ATOMIC_RELEASE);
        break;
    }
    default:
        return false;                       /* refused in start_next_wqe */
    }
    rs_put_be16(hdr, (uint16_t)(hl + chunk));
    int first_iov = tx->iov_n;
    tx->iov[tx->iov_n].iov_base = hdr;
    tx->iov[tx->iov_n].iov_len = RS_MPA_LEN_FIELD + hl;
    tx->iov_n++;
    bool crc_on = rc->neg.crc;
    uint32_t crc = crc_on ? rs_crc32c(0, hdr, RS_MPA_LEN_FIELD + hl) : 0;
    if (chunk) {
        if (wqe->inline_data) {
            tx->iov[tx->iov_n].iov_base = wqe->inline_data + wqe->sent;
            tx->iov[tx->iov_n].iov_len = chunk;
            if (crc_on)
                crc = rs_crc32c(crc, wqe->inline_data + wqe->sent, chunk);
            tx->iov_n++;
        } else {
            enum rs_soft_prot prot;
            rs_soft_mr_read_lock(rc->dev);
            int k = rs_soft_sge_iov(rc->dev, qp->pd, wqe->sge, wqe->num_sge, wqe->sent, chunk, 0,
                                    &tx->iov[tx->iov_n], RS_RC_TX_IOV_MAX - tx->iov_n - 1, &prot);
            if (k > 0 && crc_on)
                crc = rs_mpa_crc_iov(crc, &tx->iov[tx->iov_n], k);
            rs_soft_mr_read_unlock(rc->dev);
            if (k < 0) {
                tx->iov_n = first_iov;
                fail_cur(rc, k == -EFAULT ? RS_WC_LOC_PROT_ERR : RS_WC_LOC_LEN_ERR, -EFAULT);
                return false;
            }
            tx->iov_n += k;
        }
    }
    close_fpdu(rc, hl + chunk, crc, last ? done_pos : -1);
    wqe->sent += chunk;
    if (last)
        tx->cur = NULL;
    return true;
}

/* Adds one FPDU of the oldest pending Read Response. tx_lock held. On the progress thread any FPDU; on another
 * thread (local_only) only a placement mark, when the bytes could be placed locally (rc_local.c): one system call
 * instead of a hop to the progress thread, which stays the only one to send response bytes over TCP. */
static bool build_response_fpdu(struct rs_rc_qp *rc, bool local_only)
{
    struct rs_rc_tx *tx = &rc->tx;
    if (!rs_rc_irq_pending(rc) || !batch_has_room(tx, 1))
        return false;
    struct rs_rc_irq_entry *e = &rc->irq[rc->irq_head % rc->irq_cap];
    size_t hl = RS_DDP_TAGGED_HDR_LEN;
    uint64_t remaining = e->rr.size - e->sent;
    /* A requester on this host gets the bytes copied into its sink; this FPDU then carries none and its offset
     * says how far the sink is filled (rc_local.c). */
    size_t placed = rs_rc_local_place(rc, &e->rr, e->sent, remaining);
    if (!placed && local_only)
        return false;
    if (placed) {
        e->sent += (uint32_t)placed;
        remaining -= placed;
    }
    size_t room = payload_room(rc, hl, e->rr.size);
    size_t chunk = placed ? 0 : remaining < room ? remaining : room;
    bool last = chunk == remaining;
    uint8_t *where = NULL;
    if (chunk) {
        rs_soft_mr_read_lock(rc->dev);
        enum rs_soft_prot p = rs_soft_mr_check_remote(rc->dev, rc->qp->pd, e->rr.src_stag, e->rr.src_to + e->sent,
                                                      chunk, RS_ACCESS_REMOTE_READ, &where, NULL);
        if (p != RS_SOFT_PROT_OK) {
            rs_soft_mr_read_unlock(rc->dev);
            /* Valid when the request arrived, gone now (deregistered or invalidated since). */
            rc->tx_stopped = true;
            rc->tx_failed = true;
            rc->tx_fail_detail = -EACCES;
            rc->tx_fail_cause.layer = RS_TERM_LAYER_RDMAP;
            rc->tx_fail_cause.etype = RS_TERM_RDMAP_ETYPE_REMOTE_PROTECTION;
            rc->tx_fail_cause.ecode = rs_soft_prot_term_ecode(p);
            rc->tx_fail_has_cause = true;
            return false;
        }
    }
    uint8_t *hdr = tx->hdr[tx->fpdu_n];
    rs_ddp_tagged_hdr(hdr + RS_MPA_LEN_FIELD, RS_RDMAP_READ_RESPONSE, last, e->rr.sink_stag, e->rr.sink_to + e->sent);
    rs_put_be16(hdr, (uint16_t)(hl + chunk));
    tx->iov[tx->iov_n].iov_base = hdr;
    tx->iov[tx->iov_n].iov_len = RS_MPA_LEN_FIELD + hl;
    tx->iov_n++;
    bool crc_on = rc->neg.crc;
    uint32_t crc = crc_on ? rs_crc32c(0, hdr, RS_MPA_LEN_FIELD + hl) : 0;
    if (chunk) {
        if (crc_on)
            crc = rs_crc32c(crc, where, chunk);
        rs_soft_mr_read_unlock(rc->dev);
        tx->iov[tx->iov_n].iov_base = where;
        tx->iov[tx->iov_n].iov_len = chunk;
        tx->iov_n++;
        struct rs_rc_tx_src *s = &tx->src[tx->src_n++];
        s->stag = e->rr.src_stag;
        s->to = e->rr.src_to + e->sent;
        s->len = chunk;
        s->where = where;
    }
    close_fpdu(rc, hl + chunk, crc, -1);
    e->sent += (uint32_t)chunk;
    if (last)
        __atomic_store_n(&rc->irq_head, rc->irq_head + 1, __ATOMIC_RELEASE);
    return true;
}

/* Builds a new batch. Returns true if it holds anything. tx_lock held, previous batch fully sent. */
static bool tx_build(struct rs_rc_qp *rc, bool from_loop)
{
    struct rs_rc_tx *tx = &rc->tx;
    batch_reset(tx);
    while (!rc->tx_stopped && tx->fpdu_n < RS_RC_TX_BATCH_FPDUS) {
        bool responses = rs_rc_irq_pending(rc) && (from_loop || rs_rc_local_ready(rc));
        bool built = false;
        /* Alternate between the two sources so neither a long Read Response nor a long SEND starves the other. */
        if (responses && tx->alternate) {
            built = build_response_fpdu(rc, !from_loop);
            tx->alternate = false;
            if (!built && !from_loop && !rc->tx_stopped) {
                built = build_sq_fpdu(rc);     /* a response not placeable here waits for the loop */
                tx->alternate = built;
            }
        } else {
            built = build_sq_fpdu(rc);
            if (built)
                tx->alternate = true;
            else if (responses && !rc->tx_stopped)
                built = build_response_fpdu(rc, !from_loop);
        }
        if (!built)
            break;
    }
    return tx->iov_n > 0;
}

/* A posting thread sent the last bytes of a closing connection: the FIN is the progress thread's to send. */
static void close_progress_call(void *arg)
{
    rs_rc_close_progress(arg);
}

bool rs_rc_tx_run(struct rs_rc_qp *rc, bool from_loop)
{
    bool want_write = false;
    pthread_mutex_lock(&rc->tx_lock);
    enum rs_rc_conn conn = rs_rc_conn(rc);
    if (rc->fd < 0 || (conn != RS_RC_RTS && conn != RS_RC_CLOSING && conn != RS_RC_MPA_WAIT &&
                       conn != RS_RC_DRAINING)) {
        pthread_mutex_unlock(&rc->tx_lock);
        return false;
    }
    bool building = conn == RS_RC_RTS || conn == RS_RC_CLOSING;
    if (!from_loop && building && rc->tx_want_write) {
        /* The progress thread already waits for the socket to take more (or to serve Read Responses) and builds
         * this request on that writable event; a sendmsg here would mostly meet the full socket again. */
        pthread_mutex_unlock(&rc->tx_lock);
        return true;
    }
    /* A batch is at most RS_RC_TX_BATCH_FPDUS FPDUs and about RS_RC_TX_BATCH_BYTES. The progress thread serves every
     * socket in turn, so it stops after two; a posting thread keeps going while the socket takes its data. */
    int rounds = from_loop ? RS_RC_TX_LOOP_BATCHES : RS_RC_TX_POST_BATCHES;
    for (int round = 0;; round++) {
        int r = tx_push(rc);
        if (r == -EAGAIN) {
            want_write = true;
            break;
        }
        if (r < 0) {
            /* The stream is broken (reset by the peer, or a Read Response source vanished mid-batch). */
            if (!rc->tx_failed) {
                rc->tx_failed = true;
                rc->tx_fail_detail = r;
                rc->tx_fail_abort = true;
            }
            rc->tx_stopped = true;
            batch_reset(&rc->tx);
            rc->tx.raw_len = rc->tx.raw_sent = 0;
            break;
        }
        if (!building || rc->tx_stopped)
            break;
        if (round == rounds) {
            want_write = true;          /* budget spent: the writable socket brings us back next turn */
            break;
        }
        if (!tx_build(rc, from_loop))
            break;
    }
    /* Read Responses are the progress thread's to build: a posting thread that leaves some behind keeps the
     * writable event armed so the progress thread comes back for them. */
    if (!from_loop && building && !rc->tx_stopped && rs_rc_irq_pending(rc))
        want_write = true;
    rc->tx_want_write = want_write;
    rs_rc_watch_update_locked(rc);
    bool failed = rc->tx_failed && !rc->tx_fail_reported;
    if (failed)
        rc->tx_fail_reported = true;
    bool closing = !from_loop && !want_write && rs_rc_conn(rc) == RS_RC_CLOSING &&
                   !__atomic_load_n(&rc->fin_sent, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&rc->tx_lock);
    if (failed)
        rs_rc_tx_failed(rc);
    else if (closing && rs_soft_progress_call(rc->dev, close_progress_call, rc) != 0)
        RS_DEBUG("soft rc: qp %u close check not queued; the close timer will finish it", rc->qp->qpn);
    return want_write;
}

bool rs_rc_tx_flush_only(struct rs_rc_qp *rc)
{
    bool left = false;
    pthread_mutex_lock(&rc->tx_lock);
    if (rc->fd >= 0) {
        int r = tx_push(rc);
        if (r == -EAGAIN) {
            left = true;
        } else if (r < 0) {
            batch_reset(&rc->tx);
            rc->tx.raw_len = rc->tx.raw_sent = 0;
        }
    }
    rc->tx_want_write = left;
    rs_rc_watch_update_locked(rc);
    pthread_mutex_unlock(&rc->tx_lock);
    return left;
}
