/*
 * record.c: Write-Record and RDMA READ over UD datagrams (no verbs device implements either for datagrams).
 *
 * Write-Record (Grant et al., "RDMA Capable iWARP over Datagrams"): the initiator names a region of the target by
 * STag and address; the target places each datagram's payload there and, once the last datagram arrived or the
 * record timeout passed, reports one RECV_WRITE_RECORD completion saying which segments are valid. No receive is
 * consumed. The message is cut into at most 64 segments of whole datagrams (the validity map is 64 bits), so a
 * lost datagram only invalidates its segment. A segment of several datagrams is put together in a staging buffer
 * and placed only when whole, so the bytes of an invalid segment stay untouched. The record timeout counts from
 * the latest datagram. The target checks STag, PD, access and bounds in software against the provider's key
 * table, with the table locked while it copies, so a region deregistered or invalidated is never written.
 *
 * Why UD and not UC RDMA WRITE with immediate: docs/verbs.md has the comparison and the measurements. In short,
 * UC needs one connected QP per peer (set up out of band), and a UC message that loses a packet is dropped
 * silently by the responder while its earlier packets may already have been placed, so the target could neither
 * report "valid" exactly nor leave invalid bytes untouched; with datagrams the target sees every piece.
 *
 * RDMA READ over UD: a request datagram names the source; the responder's progress thread checks it and sends the
 * bytes back as datagrams gathered straight from the registered region (the region stays registered in the
 * device while they are in flight). A refused request is answered with a "refused" datagram so the initiator
 * fails fast (REM_ACCESS_ERR); a lost one times out (RS_WC_TIMEOUT).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rnic/verbs/ud.h"

uint32_t rs_v_record_seg_len(uint32_t chunk, uint64_t len)
{
    uint64_t datagrams = len == 0 ? 1 : (len + chunk - 1) / chunk;
    uint64_t per_segment = (datagrams + RS_V_RECORD_SEGMENTS - 1) / RS_V_RECORD_SEGMENTS;
    return (uint32_t)(per_segment * chunk);
}

static uint32_t segments(uint32_t msg_len, uint32_t seg_len)
{
    return msg_len == 0 ? 1 : (msg_len + seg_len - 1) / seg_len;
}

static uint32_t segment_size(uint32_t msg_len, uint32_t seg_len, uint32_t i)
{
    uint64_t start = (uint64_t)i * seg_len;
    if (start >= msg_len)
        return 0;
    return msg_len - start < seg_len ? (uint32_t)(msg_len - start) : seg_len;
}

/* The region's checks; dev->mr_lock held. Returns the region, or NULL when the STag may not be written there. */
static struct rs_v_mr *writable(struct rs_v_ud *ud, uint32_t rkey, uint64_t addr, uint64_t len)
{
    struct rs_v_mr *mr = rs_v_mr_find_rkey_locked(ud->qp->dev, rkey);
    if (!mr || rs_v_pd(mr->pub.pd) != ud->qp->pd || !(mr->pub.access & RS_ACCESS_REMOTE_WRITE))
        return NULL;
    return rs_v_mr_covers(mr, addr, len) ? mr : NULL;
}

/* ---- staging: a segment of several datagrams is placed only when whole ------------------------------------ */

static uint8_t *stage_alloc(struct rs_v_ud *ud, uint32_t need, uint32_t *cap)
{
    for (unsigned i = 0; i < RS_V_RECORD_STAGES; i++) {
        struct rs_v_stage *spare = &ud->stage_spare[i];
        if (spare->buf && spare->cap >= need) {
            uint8_t *buf = spare->buf;
            *cap = spare->cap;
            spare->buf = NULL;
            return buf;
        }
    }
    if (ud->staged_bytes + need > RS_V_RECORD_STAGE_BUDGET)
        return NULL;
    uint8_t *buf = malloc(need);
    if (buf) {
        *cap = need;
        ud->staged_bytes += need;
    }
    return buf;
}

/* Keeps the buffer for the next segment if a spare slot is free, else frees it. */
static void stage_release(struct rs_v_ud *ud, struct rs_v_stage *st)
{
    if (!st->buf)
        return;
    for (unsigned i = 0; i < RS_V_RECORD_STAGES; i++) {
        if (!ud->stage_spare[i].buf) {
            ud->stage_spare[i].buf = st->buf;
            ud->stage_spare[i].cap = st->cap;
            st->buf = NULL;
            return;
        }
    }
    ud->staged_bytes -= st->cap;
    free(st->buf);
    st->buf = NULL;
}

void rs_v_record_unstage(struct rs_v_ud *ud, struct rs_v_msg *m)
{
    for (unsigned i = 0; i < RS_V_RECORD_STAGES; i++)
        stage_release(ud, &m->stage[i]);
}

void rs_v_record_stage_cleanup(struct rs_v_ud *ud)
{
    for (unsigned i = 0; i < RS_V_RECORD_STAGES; i++) {
        struct rs_v_stage *spare = &ud->stage_spare[i];
        if (spare->buf) {
            ud->staged_bytes -= spare->cap;
            free(spare->buf);
            spare->buf = NULL;
        }
    }
}

/* The stage collecting segment seg, or a new one. When every slot is taken the lowest segment (the oldest: the
 * device delivers in order) is given up, since it was overtaken by RS_V_RECORD_STAGES later ones and so lost a
 * datagram. NULL when the segment was given up already or no memory is left: the datagram is dropped and the
 * segment stays invalid. */
static struct rs_v_stage *stage_for(struct rs_v_ud *ud, struct rs_v_msg *m, uint32_t seg, uint32_t size)
{
    if (m->lost & (1ull << seg))
        return NULL;
    struct rs_v_stage *free_slot = NULL, *oldest = NULL;
    for (unsigned i = 0; i < RS_V_RECORD_STAGES; i++) {
        struct rs_v_stage *st = &m->stage[i];
        if (!st->buf) {
            if (!free_slot)
                free_slot = st;
        } else if (st->seg == seg) {
            return st;
        } else if (!oldest || st->seg < oldest->seg) {
            oldest = st;
        }
    }
    struct rs_v_stage *st = free_slot;
    if (!st) {
        m->lost |= 1ull << oldest->seg;
        stage_release(ud, oldest);
        st = oldest;
    }
    st->buf = stage_alloc(ud, size, &st->cap);
    if (!st->buf) {
        m->lost |= 1ull << seg;
        return NULL;
    }
    st->seg = seg;
    st->next_off = 0;
    return st;
}

void rs_v_record_rx(struct rs_v_ud *ud, const struct rs_vud_hdr *h, const uint8_t *payload, uint32_t len,
                    const struct rs_v_src *src)
{
    if (h->msg_len > RS_V_RECORD_MAX_MSG || h->seg_len == 0 || h->offset > h->msg_len ||
        len > h->msg_len - h->offset || segments(h->msg_len, h->seg_len) > RS_V_RECORD_SEGMENTS) {
        ud->refused++;
        return;
    }
    uint32_t seg = h->msg_len ? h->offset / h->seg_len : 0;
    /* A datagram never straddles segments: the sender cuts segments of whole datagrams. */
    if (len && (h->offset + len - 1) / h->seg_len != seg) {
        ud->refused++;
        return;
    }
    struct rs_v_dev *dev = ud->qp->dev;
    uint64_t now = rs_v_now_ms();
    bool single = h->offset == 0 && len == h->msg_len;
    struct rs_v_msg *m = single ? NULL : rs_v_msg_find(ud, src, h->msg_id);
    struct rs_v_msg one;
    if (m && (m->state != RS_V_MSG_ACTIVE || m->opcode != RS_VUD_RECORD || m->rkey != h->rkey ||
              m->addr != h->addr || m->msg_len != h->msg_len || m->seg_len != h->seg_len)) {
        ud->refused++;  /* a straggler of a finished message, or a datagram that contradicts its message */
        return;
    }
    if (!m && !rs_v_cq_room(ud->qp->recv_cq, ud->records_active + 1)) {
        /* A remote sender must never overflow the CQ (that would put the QP in ERROR): a Write-Record needs no
         * posted receive, so nothing else bounds them. No room, no record, counted, as on the soft RNIC. */
        ud->no_room++;
        return;
    }
    pthread_rwlock_rdlock(&dev->mr_lock);
    struct rs_v_mr *mr = writable(ud, h->rkey, h->addr, h->msg_len);
    if (!mr) {
        pthread_rwlock_unlock(&dev->mr_lock);
        ud->refused++;
        if (m)
            rs_v_msg_done(ud, m, now);   /* invalidated meanwhile: the rest is refused too, nothing reported */
        else if (!single && (m = rs_v_msg_new(ud, src, h->msg_id, RS_VUD_RECORD, now)))
            rs_v_msg_done(ud, m, now);
        return;
    }
    bool fresh = !m && !single;
    if (!m) {
        if (single) {
            m = &one;
            memset(m, 0, sizeof(*m));
            m->src = *src;
        } else {
            m = rs_v_msg_new(ud, src, h->msg_id, RS_VUD_RECORD, 0);
            if (!m) {
                pthread_rwlock_unlock(&dev->mr_lock);
                return;
            }
        }
        m->opcode = RS_VUD_RECORD;
        m->rkey = h->rkey;
        m->addr = h->addr;
        m->msg_len = h->msg_len;
        m->seg_len = h->seg_len;
        /* Remember where the region starts: the completion reports the offset in it. */
        m->region_base = (uint64_t)(uintptr_t)mr->pub.addr;
    }
    /* The deadline counts from the latest datagram: a long record on a slow host is not a lost one. */
    m->deadline_ms = now + ud->qp->record_timeout_ms;
    if (fresh)
        rs_v_progress_note_deadline(dev, m->deadline_ms);   /* later datagrams only move it further out */
    uint32_t size = segment_size(h->msg_len, h->seg_len, seg);
    uint64_t seg_start = (uint64_t)seg * h->seg_len;
    bool placed = false;
    if (len == size) {
        /* The whole segment in one datagram: straight into the region. */
        if (len)
            memcpy((void *)(uintptr_t)(h->addr + h->offset), payload, len);
        m->seg_bytes[seg] = len;
        placed = true;
    } else if (!(m->map & (1ull << seg))) {
        struct rs_v_stage *st = stage_for(ud, m, seg, size);
        uint32_t rel = (uint32_t)(h->offset - seg_start);
        /* Only bytes after those taken count: a duplicate (or a datagram out of order, which leaves a gap) can
         * never make a segment look whole while part of its stage still holds an earlier segment's bytes. */
        if (!st || rel < st->next_off) {
            ud->refused++;
        } else {
            memcpy(st->buf + rel, payload, len);
            st->next_off = rel + len;
            m->seg_bytes[seg] += len;
            if (m->seg_bytes[seg] >= size) {
                memcpy((void *)(uintptr_t)(h->addr + seg_start), st->buf, size);
                stage_release(ud, st);
                placed = true;
            }
        }
    }
    pthread_rwlock_unlock(&dev->mr_lock);
    if (placed && !(m->map & (1ull << seg))) {
        m->map |= 1ull << seg;
        m->valid += size;
    }
    m->solicited |= (h->flags & RS_VUD_F_SOLICITED) != 0;
    bool complete = m->map == (segments(h->msg_len, h->seg_len) == 64 ? ~0ull
                                                                        : (1ull << segments(h->msg_len, h->seg_len)) - 1);
    /* The last datagram closes the message with the map it has; a missing earlier one stays invalid. */
    if (complete || (h->flags & RS_VUD_F_LAST)) {
        rs_v_record_report(ud, m, false);
        if (m != &one)
            rs_v_msg_done(ud, m, now);
    }
}

void rs_v_record_report(struct rs_v_ud *ud, struct rs_v_msg *m, bool timed_out)
{
    uint32_t n = segments(m->msg_len, m->seg_len);
    uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
    struct rs_rnic_wc wc;
    memset(&wc, 0, sizeof(wc));
    /* Closed by its last datagram: SUCCESS with whatever map it has; by the clock: PARTIAL unless complete. */
    wc.status = timed_out && m->map != all ? RS_WC_RECORD_PARTIAL : RS_WC_SUCCESS;
    wc.opcode = RS_WC_RECV_WRITE_RECORD;
    wc.byte_len = m->valid;
    wc.qp = &ud->qp->base;
    wc.src = m->src.addr;
    wc.src_qpn = m->src.qpn;
    if (m->solicited)
        wc.flags |= RS_WC_SOLICITED;
    wc.record.rkey = m->rkey;
    wc.record.offset = m->addr - m->region_base;
    wc.record.msg_len = m->msg_len;
    wc.record.seg_len = m->seg_len;
    wc.record.valid_map = m->map;
    rs_v_cq_push(ud->qp->recv_cq, &wc);
}

/* ---- RDMA READ ------------------------------------------------------------------------------------------- */

void rs_v_read_request(struct rs_v_ud *ud, const struct rs_vud_hdr *h, const struct ibv_wc *wc, const uint8_t *grh,
                       const struct rs_v_src *src)
{
    (void)src;
    struct rs_v_qp *qp = ud->qp;
    struct rs_v_dev *dev = qp->dev;
    struct ibv_ah *ah = ibv_create_ah_from_wc(qp->pd->pd, (struct ibv_wc *)wc, (struct ibv_grh *)grh, dev->port);
    if (!ah)
        return;
    struct rs_v_job *job = rs_v_job_new(1, 0);
    if (!job) {
        ibv_destroy_ah(ah);
        return;
    }
    job->kind = RS_V_JOB_READ_RESP;
    job->ah = ah;
    job->remote_qpn = wc->src_qp;
    job->msg_id = h->msg_id;
    job->status = RS_WC_SUCCESS;
    pthread_rwlock_rdlock(&dev->mr_lock);
    struct rs_v_mr *mr = rs_v_mr_find_rkey_locked(dev, h->rkey);
    bool ok = h->msg_len <= RS_V_RECORD_MAX_MSG && mr && rs_v_pd(mr->pub.pd) == qp->pd &&
              (mr->pub.access & RS_ACCESS_REMOTE_READ) && rs_v_mr_covers(mr, h->addr, h->msg_len);
    if (ok) {
        /* The device reads the bytes from the region itself; keep its registration until they are sent. */
        rs_v_mr_get(mr);
        job->mrs[0] = mr;
        job->sge[0].addr = h->addr;
        job->sge[0].length = h->msg_len;
        job->sge[0].lkey = mr->pub.lkey;
        job->num_sge = 1;
        job->len = h->msg_len;
        job->ndgrams = h->msg_len == 0 ? 1 : (uint32_t)((h->msg_len + ud->chunk - 1) / ud->chunk);
    } else {
        job->status = RS_WC_REM_ACCESS_ERR;     /* answered with one "refused" datagram */
        job->len = 0;
        job->ndgrams = 1;
    }
    pthread_rwlock_unlock(&dev->mr_lock);
    pthread_mutex_lock(&ud->tx_lock);
    if (ud->resp_tail)
        ud->resp_tail->next = job;
    else
        ud->resp_head = job;
    ud->resp_tail = job;
    rs_v_ud_tx_pump(ud);
    pthread_mutex_unlock(&ud->tx_lock);
}

void rs_v_read_response(struct rs_v_ud *ud, const struct rs_vud_hdr *h, const uint8_t *payload, uint32_t len,
                        const struct rs_v_src *src)
{
    struct rs_v_dev *dev = ud->qp->dev;
    pthread_mutex_lock(&ud->tx_lock);
    struct rs_v_job *job = ud->app_head;
    while (job && !(job->kind == RS_V_JOB_READ && job->msg_id == h->msg_id))
        job = job->next;
    /* Only the peer the request went to may answer it. */
    if (!job || job->done || job->peer->remote_qpn != src->qpn) {
        pthread_mutex_unlock(&ud->tx_lock);
        return;
    }
    if (h->flags & RS_VUD_F_REFUSED) {
        job->status = RS_WC_REM_ACCESS_ERR;
        job->done = true;
    } else if (h->msg_len != job->len || h->offset > job->len || len > job->len - h->offset) {
        job->status = RS_WC_GENERAL_ERR;
        job->done = true;
    } else {
        pthread_rwlock_rdlock(&dev->mr_lock);
        enum rs_rnic_wc_status status = rs_v_scatter(ud->qp, job->sge, job->num_sge, h->offset, payload, len);
        pthread_rwlock_unlock(&dev->mr_lock);
        job->received += len;
        if (status != RS_WC_SUCCESS) {
            job->status = status;
            job->done = true;
        } else if (job->received >= job->len) {
            job->done = true;
        }
    }
    rs_v_ud_release(ud);
    pthread_mutex_unlock(&ud->tx_lock);
}
