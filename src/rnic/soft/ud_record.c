/*
 * ud_record.c: the target side of RDMA Write-Record (opcode 0xD, docs/wire-formats.md).
 *
 * One-sided: no receive is posted. Each segment names the region (STag) and its place in it (TO); the target
 * checks the whole message range [base_to, base_to + msg_len) and the segment against the STag, the QP's PD and
 * REMOTE_WRITE access on every segment (the region may be invalidated between two segments), places the payload
 * straight into the region and records which segments are valid. The record completes on the QP's receive CQ as
 * RS_WC_RECV_WRITE_RECORD once every segment is valid or the last segment (L bit) arrived, whichever is first, with
 * the validity map; if the last segment never comes it completes as RS_WC_RECORD_PARTIAL record_timeout_ms after
 * the latest segment. After completion the message's id stays known for one more timeout (a tombstone) so a late
 * duplicate cannot change bytes the application was told about.
 *
 * A segment refused by a check is a counted drop and nothing else: the initiator already completed, and there is
 * no receive to report an error on. Except on a QP that adopted an application's socket (rnic.h): there the
 * refused payload goes back to the socket layer on the raw queue, a record that would need a CQ slot the CQ may
 * not have is dropped instead of overflowing it, and a record's completion is added before the region's read lock
 * is released, so that rs_rnic_mr_invalidate is a fence for the socket layer's buffer revocation.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rnic/soft/ud.h"

static struct rs_ud_record *find_record(struct rs_soft_ud *ud, const struct sockaddr_storage *src, uint32_t msg_id)
{
    for (unsigned i = 0; i < RS_UD_MAX_RECORDS; i++) {
        struct rs_ud_record *r = &ud->records[i];
        if (r->used && r->msg_id == msg_id && rs_sockaddr_equal(&r->src, src))
            return r;
    }
    return NULL;
}

static uint64_t timeout_from_now(const struct rs_soft_ud *ud)
{
    return rs_soft_now_ns() + (uint64_t)ud->qp->attr.record_timeout_ms * 1000000u;
}

static void complete(struct rs_soft_ud *ud, struct rs_ud_record *r, enum rs_rnic_wc_status status)
{
    struct rs_soft_qp *qp = ud->qp;
    struct rs_rnic_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.status = status;
    wc.opcode = RS_WC_RECV_WRITE_RECORD;
    wc.byte_len = r->valid_bytes;
    wc.qp = &qp->base;
    memcpy(&wc.src, &r->src, sizeof(wc.src));
    wc.src_qpn = 0;
    wc.record.rkey = r->stag;
    wc.record.offset = r->region_offset;
    wc.record.msg_len = r->msg_len;
    wc.record.seg_len = r->seg_len;
    wc.record.valid_map = r->valid_map;
    rs_soft_cq_push(qp->recv_cq, &wc);
    if (status == RS_WC_SUCCESS)
        RS_SOFT_STAT(qp->dev, record_complete, 1);
    else
        RS_SOFT_STAT(qp->dev, record_partial, 1);
    r->active = false;
    r->deadline_ns = timeout_from_now(ud);
    rs_ud_note_deadline(ud, r->deadline_ns);
}

static struct rs_ud_record *alloc_record(struct rs_soft_ud *ud)
{
    struct rs_ud_record *oldest_dead = NULL, *oldest_live = NULL;
    for (unsigned i = 0; i < RS_UD_MAX_RECORDS; i++) {
        struct rs_ud_record *r = &ud->records[i];
        if (!r->used)
            return r;
        if (!r->active && (!oldest_dead || r->deadline_ns < oldest_dead->deadline_ns))
            oldest_dead = r;
        if (r->active && (!oldest_live || r->deadline_ns < oldest_live->deadline_ns))
            oldest_live = r;
    }
    if (oldest_dead)
        return oldest_dead;
    /* Every slot holds a message in progress: the oldest is reported with what it has now. */
    complete(ud, oldest_live, RS_WC_RECORD_PARTIAL);
    return oldest_live;
}

/*
 * An adopted socket's QP hands a refused segment's payload back (rnic.h): the socket layer may salvage a datagram
 * that raced the revocation of a buffer it advertised, or tell the sender its cached region is stale. The payload
 * is read with its CRC checked; one that fails the CRC goes back whole as a plain datagram instead.
 */
static void hand_back_refused(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    const struct rs_ud_hdr *h = &rx->h;
    if (!rs_ud_raw_room(ud, h->payload_len))
        return;
    struct rs_rnic_raw_dgram *d = rs_ud_raw_alloc(rx, h->payload_len, RS_WC_REM_ACCESS_ERR);
    if (!d)
        return;
    d->record.rkey = h->stag;
    d->record.to = h->to;
    d->record.base_to = h->base_to;
    d->record.msg_len = h->msg_len;
    struct iovec iov = { .iov_base = d->data, .iov_len = h->payload_len };
    if (rs_ud_rx_consume(rx, &iov, h->payload_len ? 1 : 0) != 0) {
        free(d);
        return;
    }
    rs_ud_raw_push(ud, d);
}

void rs_ud_record_rx(struct rs_ud_rx *rx)
{
    struct rs_soft_ud *ud = rx->ud;
    struct rs_soft_qp *qp = ud->qp;
    struct rs_soft_device *dev = qp->dev;
    const struct rs_ud_hdr *h = &rx->h;
    struct rs_ud_record *r = find_record(ud, &rx->src, h->msg_id);
    if (r && !r->active) {
        RS_SOFT_STAT(dev, rx_drop_late, 1);
        RS_UD_COUNT(ud, rx_refused, 1);
        return;
    }
    if (r && (r->stag != h->stag || r->msg_len != h->msg_len || r->base_to != h->base_to ||
              r->seg_len != h->seg_len)) {
        RS_SOFT_STAT(dev, rx_drop_header, 1);
        RS_UD_COUNT(ud, rx_refused, 1);
        return;
    }
    if (r && (r->valid_map & (1ull << h->seg_index))) {
        RS_SOFT_STAT(dev, rx_drop_late, 1);
        RS_UD_COUNT(ud, rx_refused, 1);
        return;
    }
    if (!r && !rs_ud_cq_room(ud)) {
        /* A remote sender must never overflow a UD QP's CQ (which would put the QP in ERROR): Write-Records need
         * no posted receive, so nothing else bounds them. No room, no record, counted; UD may lose datagrams. */
        RS_UD_COUNT(ud, rx_no_room, 1);
        return;
    }

    rs_soft_mr_read_lock(dev);
    struct rs_soft_mr *mr = NULL;
    uint8_t *where = NULL;
    enum rs_soft_prot prot = rs_soft_mr_check_remote(dev, qp->pd, h->stag, h->base_to, h->msg_len,
                                                     RS_ACCESS_REMOTE_WRITE, NULL, &mr);
    if (prot == RS_SOFT_PROT_OK)
        prot = rs_soft_mr_check_remote(dev, qp->pd, h->stag, h->to, h->payload_len, RS_ACCESS_REMOTE_WRITE, &where,
                                       NULL);
    if (prot != RS_SOFT_PROT_OK) {
        rs_soft_mr_read_unlock(dev);
        RS_SOFT_STAT(dev, rx_drop_protection, 1);
        RS_DEBUG("soft rnic: qp %u Write-Record segment refused: %s (stag 0x%x)", qp->qpn, rs_soft_prot_name(prot),
                 h->stag);
        if (ud->adopted)
            hand_back_refused(rx);
        else
            RS_UD_COUNT(ud, rx_refused, 1);
        return;
    }
    uint64_t region_offset = h->base_to - (uintptr_t)mr->pub.addr;
    struct iovec iov = { .iov_base = where, .iov_len = h->payload_len };
    int rc = rs_ud_rx_consume(rx, &iov, h->payload_len ? 1 : 0);
    if (rc != 0) {
        rs_soft_mr_read_unlock(dev);
        return;             /* counted; a segment that fails its CRC is never marked valid */
    }
    /* The completion is added before the region's lock is released: once rs_rnic_mr_invalidate (write lock)
     * returns, every record placed under the old STag is on the CQ (rnic.h, adopted sockets). */

    if (!r) {
        r = alloc_record(ud);
        memset(r, 0, sizeof(*r));
        r->used = r->active = true;
        memcpy(&r->src, &rx->src, sizeof(r->src));
        r->src_len = rx->src_len;
        r->msg_id = h->msg_id;
        r->stag = h->stag;
        r->msg_len = h->msg_len;
        r->seg_len = h->seg_len;
        r->seg_count = h->seg_count;
        r->base_to = h->base_to;
        r->region_offset = region_offset;
    }
    r->valid_map |= 1ull << h->seg_index;
    r->valid_bytes += h->payload_len;
    uint64_t full = r->seg_count == 64 ? ~0ull : (1ull << r->seg_count) - 1;
    if (r->valid_map == full || h->last) {
        complete(ud, r, RS_WC_SUCCESS);
        rs_soft_mr_read_unlock(dev);
        return;
    }
    rs_soft_mr_read_unlock(dev);
    r->deadline_ns = timeout_from_now(ud);
    rs_ud_note_deadline(ud, r->deadline_ns);
}

uint64_t rs_ud_record_expire(struct rs_soft_ud *ud, uint64_t now_ns)
{
    uint64_t next = 0;
    for (unsigned i = 0; i < RS_UD_MAX_RECORDS; i++) {
        struct rs_ud_record *r = &ud->records[i];
        if (!r->used)
            continue;
        if (r->deadline_ns <= now_ns) {
            if (r->active)
                complete(ud, r, RS_WC_RECORD_PARTIAL);     /* now a tombstone */
            else
                r->used = false;
        }
        if (r->used && (!next || r->deadline_ns < next))
            next = r->deadline_ns;
    }
    return next;
}

void rs_ud_record_reset(struct rs_soft_ud *ud)
{
    memset(ud->records, 0, sizeof(ud->records));
}
