/*
 * ud_wire.c: encoding and validating the datagram-iWARP headers (docs/wire-formats.md, "Datagram iWARP").
 *
 * The decoder is the first line of defence of the receive path: it reads the header field by field from bytes
 * that may be anything, and refuses every header whose fields disagree with each other or with the datagram's
 * length, so the code after it only has to check memory (STag, PD, access, bounds) before placing a byte.
 */
#include <errno.h>
#include <string.h>

#include "common/crc32c.h"
#include "rnic/soft/ud.h"

size_t rs_ud_put_send(uint8_t *buf, bool last, bool solicited, uint32_t msg_len, uint32_t msn, uint32_t mo)
{
    rs_ddp_ctrl_put(buf, false, last, solicited ? RS_RDMAP_SEND_SE : RS_RDMAP_SEND);
    rs_put_be32(buf + 2, msg_len);
    rs_put_be32(buf + 6, RS_DDP_QN_SEND);
    rs_put_be32(buf + 10, msn);
    rs_put_be32(buf + 14, mo);
    return RS_UD_SEND_HDR_LEN;
}

static void put_read_req_body(uint8_t *p, uint32_t sink_stag, uint64_t sink_to, uint32_t read_len,
                              uint32_t src_stag, uint64_t src_to)
{
    rs_put_be32(p, sink_stag);
    rs_put_be64(p + 4, sink_to);
    rs_put_be32(p + 12, read_len);
    rs_put_be32(p + 16, src_stag);
    rs_put_be64(p + 20, src_to);
}

size_t rs_ud_put_read_req(uint8_t *buf, uint32_t msn, uint32_t sink_stag, uint64_t sink_to, uint32_t read_len,
                          uint32_t src_stag, uint64_t src_to)
{
    rs_ddp_ctrl_put(buf, false, true, RS_RDMAP_READ_REQUEST);
    rs_put_be32(buf + 2, 0);
    rs_put_be32(buf + 6, RS_DDP_QN_READ_REQUEST);
    rs_put_be32(buf + 10, msn);
    rs_put_be32(buf + 14, 0);
    put_read_req_body(buf + RS_DDP_UNTAGGED_HDR_LEN, sink_stag, sink_to, read_len, src_stag, src_to);
    return RS_UD_READ_REQ_HDR_LEN;
}

size_t rs_ud_put_read_resp(uint8_t *buf, bool last, uint32_t sink_stag, uint64_t sink_to)
{
    rs_ddp_ctrl_put(buf, true, last, RS_RDMAP_READ_RESPONSE);
    rs_put_be32(buf + 2, sink_stag);
    rs_put_be64(buf + 6, sink_to);
    return RS_UD_READ_RESP_HDR_LEN;
}

size_t rs_ud_put_write_record(uint8_t *buf, bool last, uint32_t stag, uint64_t to, uint32_t msg_id,
                              uint32_t msg_len, uint64_t base_to, uint32_t seg_len)
{
    rs_ddp_ctrl_put(buf, true, last, RS_RDMAP_WRITE_RECORD);
    rs_put_be32(buf + 2, stag);
    rs_put_be64(buf + 6, to);
    uint8_t *ext = buf + RS_DDP_TAGGED_HDR_LEN;
    rs_put_be32(ext, msg_id);
    rs_put_be32(ext + 4, msg_len);
    rs_put_be64(ext + 8, base_to);
    rs_put_be32(ext + 16, seg_len);
    return RS_UD_RECORD_HDR_LEN;
}

size_t rs_ud_put_terminate(uint8_t *buf, uint32_t term_word, const struct rs_ud_hdr *read_req)
{
    rs_ddp_ctrl_put(buf, false, true, RS_RDMAP_TERMINATE);
    rs_put_be32(buf + 2, 0);
    rs_put_be32(buf + 6, RS_DDP_QN_TERMINATE);
    rs_put_be32(buf + 10, read_req->msn);
    rs_put_be32(buf + 14, 0);
    rs_put_be32(buf + RS_DDP_UNTAGGED_HDR_LEN, term_word | RS_TERM_FLAG_R);
    put_read_req_body(buf + RS_DDP_UNTAGGED_HDR_LEN + RS_TERM_HDR_LEN, read_req->sink_stag, read_req->sink_to,
                      read_req->read_len, read_req->src_stag, read_req->src_to);
    return RS_UD_TERM_HDR_LEN;
}

static void get_read_req_body(const uint8_t *p, struct rs_ud_hdr *h)
{
    h->sink_stag = rs_get_be32(p);
    h->sink_to = rs_get_be64(p + 4);
    h->read_len = rs_get_be32(p + 12);
    h->src_stag = rs_get_be32(p + 16);
    h->src_to = rs_get_be64(p + 20);
}

/* Segment geometry of a message of msg_len bytes cut into seg_len pieces; false if it needs too many. */
static bool geometry(uint32_t msg_len, uint32_t seg_len, uint32_t *count)
{
    uint64_t n = msg_len == 0 ? 1 : ((uint64_t)msg_len + seg_len - 1) / seg_len;
    if (n > RS_UD_MAX_SEGMENTS)
        return false;
    *count = (uint32_t)n;
    return true;
}

/* Length the segment at index must carry. */
static uint32_t expected_len(uint32_t msg_len, uint32_t seg_len, uint32_t index, uint32_t count)
{
    return index + 1 < count ? seg_len : msg_len - index * seg_len;
}

static int decode_send(struct rs_ud_hdr *h)
{
    /* RS_UD_SEG_LEN is the only segment length a SEND may use, so the receiver can map every MO to a segment. */
    if (h->msg_len > RS_UD_MAX_MSG || h->mo % RS_UD_SEG_LEN != 0)
        return -EBADMSG;
    if (!geometry(h->msg_len, RS_UD_SEG_LEN, &h->seg_count))
        return -EBADMSG;
    h->seg_index = h->mo / RS_UD_SEG_LEN;
    if (h->seg_index >= h->seg_count)
        return -EBADMSG;
    if (h->payload_len != expected_len(h->msg_len, RS_UD_SEG_LEN, h->seg_index, h->seg_count))
        return -EBADMSG;
    if (h->last != (h->seg_index + 1 == h->seg_count))
        return -EBADMSG;
    return 0;
}

static int decode_record(struct rs_ud_hdr *h)
{
    if (h->seg_len == 0 || h->seg_len > RS_UD_SEG_LEN)
        return -EBADMSG;
    if (h->base_to + h->msg_len < h->base_to || h->to < h->base_to)
        return -EBADMSG;
    if (!geometry(h->msg_len, h->seg_len, &h->seg_count))
        return -EBADMSG;
    uint64_t delta = h->to - h->base_to;
    if (delta % h->seg_len != 0 || delta / h->seg_len >= h->seg_count)
        return -EBADMSG;
    h->seg_index = (uint32_t)(delta / h->seg_len);
    if (h->payload_len != expected_len(h->msg_len, h->seg_len, h->seg_index, h->seg_count))
        return -EBADMSG;
    if (h->last != (h->seg_index + 1 == h->seg_count))
        return -EBADMSG;
    return 0;
}

int rs_ud_decode(const uint8_t *buf, size_t avail, size_t dgram_len, struct rs_ud_hdr *h)
{
    memset(h, 0, sizeof(*h));
    if (avail > dgram_len)
        avail = dgram_len;
    if (avail < 2 || dgram_len > RS_UD_MAX_DATAGRAM)
        return -EBADMSG;
    struct rs_ddp_ctrl c = rs_ddp_ctrl_get(buf);
    if (c.ddp_version != RS_DDP_VERSION || c.rdmap_version != RS_RDMAP_VERSION)
        return -EBADMSG;
    if ((buf[0] & 0x3c) != 0 || (buf[1] & 0x30) != 0)
        return -EBADMSG;            /* reserved bits must be zero */
    h->opcode = c.opcode;
    h->last = c.last;
    switch (c.opcode) {
    case RS_RDMAP_SEND:
    case RS_RDMAP_SEND_SE:
        h->kind = RS_UD_KIND_SEND;
        h->solicited = c.opcode == RS_RDMAP_SEND_SE;
        h->hdr_len = RS_UD_SEND_HDR_LEN;
        break;
    case RS_RDMAP_READ_REQUEST:
        h->kind = RS_UD_KIND_READ_REQ;
        h->hdr_len = RS_UD_READ_REQ_HDR_LEN;
        break;
    case RS_RDMAP_TERMINATE:
        h->kind = RS_UD_KIND_TERMINATE;
        h->hdr_len = RS_UD_TERM_HDR_LEN;
        break;
    case RS_RDMAP_READ_RESPONSE:
        h->kind = RS_UD_KIND_READ_RESP;
        h->hdr_len = RS_UD_READ_RESP_HDR_LEN;
        break;
    case RS_RDMAP_WRITE_RECORD:
        h->kind = RS_UD_KIND_WRITE_RECORD;
        h->hdr_len = RS_UD_RECORD_HDR_LEN;
        break;
    default:
        /* RDMA Write, Send with Invalidate and everything else have no meaning on an unreliable datagram QP. */
        return -EBADMSG;
    }
    bool tagged = h->kind == RS_UD_KIND_READ_RESP || h->kind == RS_UD_KIND_WRITE_RECORD;
    if (c.tagged != tagged)
        return -EBADMSG;
    if (avail < h->hdr_len || dgram_len < (size_t)h->hdr_len + RS_UD_CRC_LEN)
        return -EBADMSG;
    h->payload_len = (uint32_t)(dgram_len - h->hdr_len - RS_UD_CRC_LEN);

    if (tagged) {
        h->stag = rs_get_be32(buf + 2);
        h->to = rs_get_be64(buf + 6);
        if (h->payload_len > RS_UD_SEG_LEN)
            return -EBADMSG;
        if (h->to + h->payload_len < h->to)
            return -EBADMSG;
        if (h->kind == RS_UD_KIND_READ_RESP)
            return 0;           /* matched against the pending READ it answers */
        const uint8_t *ext = buf + RS_DDP_TAGGED_HDR_LEN;
        h->msg_id = rs_get_be32(ext);
        h->msg_len = rs_get_be32(ext + 4);
        h->base_to = rs_get_be64(ext + 8);
        h->seg_len = rs_get_be32(ext + 16);
        return decode_record(h);
    }

    uint32_t rsvd = rs_get_be32(buf + 2);
    h->qn = rs_get_be32(buf + 6);
    h->msn = rs_get_be32(buf + 10);
    h->mo = rs_get_be32(buf + 14);
    switch (h->kind) {
    case RS_UD_KIND_SEND:
        if (h->qn != RS_DDP_QN_SEND)
            return -EBADMSG;
        h->msg_len = rsvd;
        return decode_send(h);
    case RS_UD_KIND_READ_REQ:
        if (h->qn != RS_DDP_QN_READ_REQUEST || rsvd != 0 || h->mo != 0 || !h->last || h->payload_len != 0)
            return -EBADMSG;
        get_read_req_body(buf + RS_DDP_UNTAGGED_HDR_LEN, h);
        if (h->read_len > RS_UD_MAX_MSG || h->src_to + h->read_len < h->src_to)
            return -EBADMSG;
        return 0;
    case RS_UD_KIND_TERMINATE:
        if (h->qn != RS_DDP_QN_TERMINATE || rsvd != 0 || h->mo != 0 || !h->last || h->payload_len != 0)
            return -EBADMSG;
        h->term_word = rs_get_be32(buf + RS_DDP_UNTAGGED_HDR_LEN);
        if (!(h->term_word & RS_TERM_FLAG_R))
            return -EBADMSG;    /* only Terminates that echo a Read Request are defined on UD */
        get_read_req_body(buf + RS_DDP_UNTAGGED_HDR_LEN + RS_TERM_HDR_LEN, h);
        return 0;
    default:
        return -EBADMSG;
    }
}

uint32_t rs_ud_crc(const uint8_t *hdr, size_t hdr_len, const struct iovec *iov, int iovcnt)
{
    uint32_t crc = rs_crc32c(0, hdr, hdr_len);
    for (int i = 0; i < iovcnt; i++)
        crc = rs_crc32c(crc, iov[i].iov_base, iov[i].iov_len);
    return crc;
}
