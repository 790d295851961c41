/*
 * mpa.c: MPA Request/Reply encoding and negotiation, FPDU framing with CRC32c, DDP/RDMAP header encoding and
 * validation, and Terminate messages. See mpa.h for the rules; everything here is pure computation on buffers.
 */
#include "rnic/soft/mpa.h"

#include <errno.h>
#include <string.h>

#include "common/crc32c.h"

/* ---- MPA Request / Reply ---------------------------------------------------------------------------------- */

static const char *mpa_key(bool reply)
{
    return reply ? RS_MPA_KEY_REP : RS_MPA_KEY_REQ;
}

int rs_mpa_frame_encode(const struct rs_mpa_frame *f, uint8_t *out, size_t cap)
{
    if (f->rev != RS_MPA_REV1 && f->rev != RS_MPA_REV2)
        return -EINVAL;
    if (f->enhanced && f->rev != RS_MPA_REV2)
        return -EINVAL;
    if (f->enhanced && (f->ird > RS_MPA_MAX_IRD_ORD || f->ord > RS_MPA_MAX_IRD_ORD))
        return -EINVAL;
    size_t block = f->enhanced ? RS_MPA_V2_IRD_ORD_LEN : 0;
    size_t pd_total = block + f->pd_len;
    if (pd_total > RS_MPA_MAX_PRIVATE_DATA)
        return -EMSGSIZE;
    size_t total = RS_MPA_REQREP_HDR_LEN + pd_total;
    if (total > cap)
        return -EMSGSIZE;

    memcpy(out, mpa_key(f->reply), RS_MPA_KEY_LEN);
    uint8_t flags = 0;
    if (f->markers)
        flags |= RS_MPA_FLAG_MARKERS;
    if (f->crc)
        flags |= RS_MPA_FLAG_CRC;
    if (f->reply && f->reject)
        flags |= RS_MPA_FLAG_REJECT;
    if (f->enhanced)
        flags |= RS_MPA_FLAG_ENHANCED;
    out[16] = flags;
    out[17] = f->rev;
    rs_put_be16(out + 18, (uint16_t)pd_total);
    uint8_t *p = out + RS_MPA_REQREP_HDR_LEN;
    if (f->enhanced) {
        uint16_t ird = (uint16_t)(f->ird & RS_MPA_V2_IRD_ORD_MASK);
        uint16_t ord = (uint16_t)(f->ord & RS_MPA_V2_IRD_ORD_MASK);
        if (f->p2p)
            ird |= RS_MPA_V2_PEER_TO_PEER;
        if (f->rtr & RS_MPA_RTR_ZERO_SEND)
            ird |= RS_MPA_V2_ZERO_LEN_SEND_RTR;
        if (f->rtr & RS_MPA_RTR_WRITE)
            ord |= RS_MPA_V2_WRITE_RTR;
        if (f->rtr & RS_MPA_RTR_READ)
            ord |= RS_MPA_V2_READ_RTR;
        rs_put_be16(p, ird);
        rs_put_be16(p + 2, ord);
        p += RS_MPA_V2_IRD_ORD_LEN;
    }
    if (f->pd_len)
        memcpy(p, f->pd, f->pd_len);
    return (int)total;
}

int rs_mpa_frame_length(const uint8_t *buf, size_t len, bool reply)
{
    /* Compare the key as soon as its first bytes are in, so a non-MPA peer is refused without waiting. */
    size_t key_have = len < RS_MPA_KEY_LEN ? len : RS_MPA_KEY_LEN;
    if (memcmp(buf, mpa_key(reply), key_have) != 0)
        return -EPROTO;
    if (len < RS_MPA_REQREP_HDR_LEN)
        return -EAGAIN;
    uint16_t pd_len = rs_get_be16(buf + 18);
    if (pd_len > RS_MPA_MAX_PRIVATE_DATA)
        return -EMSGSIZE;
    return RS_MPA_REQREP_HDR_LEN + pd_len;
}

int rs_mpa_frame_parse(const uint8_t *buf, size_t len, bool reply, struct rs_mpa_frame *f)
{
    memset(f, 0, sizeof(*f));
    int total = rs_mpa_frame_length(buf, len, reply);
    if (total < 0)
        return total == -EAGAIN ? -EPROTO : total;
    if ((size_t)total != len)
        return -EPROTO;
    uint8_t flags = buf[16];
    f->reply = reply;
    f->rev = buf[17];
    f->markers = (flags & RS_MPA_FLAG_MARKERS) != 0;
    f->crc = (flags & RS_MPA_FLAG_CRC) != 0;
    f->reject = reply && (flags & RS_MPA_FLAG_REJECT) != 0;
    const uint8_t *pd = buf + RS_MPA_REQREP_HDR_LEN;
    size_t pd_len = len - RS_MPA_REQREP_HDR_LEN;
    if (f->rev == RS_MPA_REV2 && (flags & RS_MPA_FLAG_ENHANCED)) {
        if (pd_len < RS_MPA_V2_IRD_ORD_LEN)
            return -EPROTO;
        uint16_t ird = rs_get_be16(pd), ord = rs_get_be16(pd + 2);
        f->enhanced = true;
        f->p2p = (ird & RS_MPA_V2_PEER_TO_PEER) != 0;
        if (ird & RS_MPA_V2_ZERO_LEN_SEND_RTR)
            f->rtr |= RS_MPA_RTR_ZERO_SEND;
        if (ord & RS_MPA_V2_WRITE_RTR)
            f->rtr |= RS_MPA_RTR_WRITE;
        if (ord & RS_MPA_V2_READ_RTR)
            f->rtr |= RS_MPA_RTR_READ;
        f->ird = ird & RS_MPA_V2_IRD_ORD_MASK;
        f->ord = ord & RS_MPA_V2_IRD_ORD_MASK;
        pd += RS_MPA_V2_IRD_ORD_LEN;
        pd_len -= RS_MPA_V2_IRD_ORD_LEN;
    }
    f->pd = pd_len ? pd : NULL;
    f->pd_len = (uint16_t)pd_len;
    if (f->rev != RS_MPA_REV1 && f->rev != RS_MPA_REV2)
        return -EPROTONOSUPPORT;
    return 0;
}

static uint16_t min_u16(uint16_t a, uint16_t b)
{
    return a < b ? a : b;
}

static uint16_t clamp_ird_ord(uint16_t v)
{
    return v > RS_MPA_MAX_IRD_ORD ? RS_MPA_MAX_IRD_ORD : v;
}

void rs_mpa_request_init(struct rs_mpa_frame *req, const struct rs_mpa_local *local, const void *pd,
                         uint16_t pd_len)
{
    memset(req, 0, sizeof(*req));
    req->rev = local->rev == RS_MPA_REV1 ? RS_MPA_REV1 : RS_MPA_REV2;
    req->crc = local->crc;
    req->enhanced = req->rev == RS_MPA_REV2;
    req->ird = clamp_ird_ord(local->ird);
    req->ord = clamp_ird_ord(local->ord);
    req->pd = pd;
    req->pd_len = pd_len;
}

int rs_mpa_responder_negotiate(const struct rs_mpa_frame *req, const struct rs_mpa_local *local,
                               struct rs_mpa_result *result, uint8_t *term_ecode)
{
    memset(result, 0, sizeof(*result));
    *term_ecode = 0;
    if (req->rev != RS_MPA_REV1 && req->rev != RS_MPA_REV2) {
        *term_ecode = RS_TERM_LLP_BAD_REQ_REP;
        return -EPROTONOSUPPORT;
    }
    if (req->markers) {
        *term_ecode = RS_TERM_LLP_MARKER;
        return -EPROTONOSUPPORT;
    }
    result->rev = req->rev < local->rev ? req->rev : local->rev;
    if (result->rev == 0)
        result->rev = RS_MPA_REV1;
    result->crc = req->crc || local->crc;   /* one side asking is enough (RFC 5044 7.1) */
    result->ird = clamp_ird_ord(local->ird);
    result->ord = clamp_ird_ord(local->ord);
    /* The peer's IRD bounds how many Read Requests it will hold for us; its ORD is only a wish, we serve at
     * most our own IRD and say so in the Reply, which makes the initiator lower its ORD. */
    if (result->rev == RS_MPA_REV2 && req->enhanced)
        result->ord = min_u16(result->ord, req->ird);
    return 0;
}

void rs_mpa_reply_init(struct rs_mpa_frame *rep, const struct rs_mpa_frame *req, const struct rs_mpa_local *local,
                       const struct rs_mpa_result *result, bool reject, const void *pd, uint16_t pd_len)
{
    memset(rep, 0, sizeof(*rep));
    rep->reply = true;
    rep->crc = result ? result->crc : req->crc || local->crc;
    rep->reject = reject;
    uint8_t ours = local->rev == RS_MPA_REV1 ? RS_MPA_REV1 : RS_MPA_REV2;
    if (req->rev == RS_MPA_REV1 || req->rev == RS_MPA_REV2)
        rep->rev = req->rev < ours ? req->rev : ours;
    else
        rep->rev = ours;            /* tells the peer what we would have spoken */
    rep->enhanced = rep->rev == RS_MPA_REV2 && req->enhanced;
    if (rep->enhanced) {
        rep->ird = result ? result->ird : clamp_ird_ord(local->ird);
        rep->ord = result ? result->ord : 0;
    }
    rep->pd = pd;
    rep->pd_len = pd_len;
}

int rs_mpa_initiator_negotiate(const struct rs_mpa_frame *req, const struct rs_mpa_frame *rep,
                               const struct rs_mpa_local *local, struct rs_mpa_result *result)
{
    memset(result, 0, sizeof(*result));
    if (rep->rev == 0 || rep->rev > req->rev)
        return -EPROTO;
    if (rep->enhanced && !req->enhanced)
        return -EPROTO;
    if (rep->reject)
        return -ECONNREFUSED;
    if (rep->markers)
        return -EPROTO;
    result->rev = rep->rev;
    result->crc = req->crc || rep->crc;
    result->ird = clamp_ird_ord(local->ird);
    result->ord = clamp_ird_ord(local->ord);
    if (rep->enhanced)
        result->ord = min_u16(result->ord, rep->ird);
    return 0;
}

/* ---- FPDU framing ----------------------------------------------------------------------------------------- */

uint32_t rs_mpa_crc_iov(uint32_t crc, const struct iovec *iov, int iovcnt)
{
    for (int i = 0; i < iovcnt; i++)
        if (iov[i].iov_len)
            crc = rs_crc32c(crc, iov[i].iov_base, iov[i].iov_len);
    return crc;
}

size_t rs_mpa_fpdu_trailer(uint8_t out[RS_MPA_TRAILER_MAX], size_t ulpdu_len, uint32_t crc)
{
    unsigned pad = rs_mpa_pad(ulpdu_len);
    memset(out, 0, pad);
    if (pad)
        crc = rs_crc32c(crc, out, pad);
    rs_crc32c_wire_put(out + pad, crc);
    return pad + RS_MPA_CRC_LEN;
}

int rs_mpa_fpdu_build(uint8_t *out, size_t cap, const uint8_t *ulpdu, size_t ulpdu_len)
{
    if (ulpdu_len > RS_MPA_MAX_ULPDU || rs_mpa_fpdu_len(ulpdu_len) > cap)
        return -EMSGSIZE;
    rs_put_be16(out, (uint16_t)ulpdu_len);
    memmove(out + RS_MPA_LEN_FIELD, ulpdu, ulpdu_len);
    uint32_t crc = rs_crc32c(0, out, RS_MPA_LEN_FIELD + ulpdu_len);
    size_t trailer = rs_mpa_fpdu_trailer(out + RS_MPA_LEN_FIELD + ulpdu_len, ulpdu_len, crc);
    return (int)(RS_MPA_LEN_FIELD + ulpdu_len + trailer);
}

int rs_mpa_fpdu_check(const uint8_t *buf, size_t len, const uint8_t **ulpdu, size_t *ulpdu_len)
{
    if (len < RS_MPA_LEN_FIELD)
        return -EAGAIN;
    size_t l = rs_get_be16(buf);
    size_t total = rs_mpa_fpdu_len(l);
    if (len < total)
        return -EAGAIN;
    size_t covered = total - RS_MPA_CRC_LEN;
    uint32_t crc = rs_crc32c(0, buf, covered);
    if (crc != rs_crc32c_wire_get(buf + covered))
        return -EBADMSG;
    *ulpdu = buf + RS_MPA_LEN_FIELD;
    *ulpdu_len = l;
    return (int)total;
}

/* ---- DDP / RDMAP segments --------------------------------------------------------------------------------- */

size_t rs_ddp_hdr_len(const uint8_t ctrl[2])
{
    if (ctrl[0] & RS_DDP_FLAG_TAGGED)
        return RS_DDP_TAGGED_HDR_LEN;
    switch (ctrl[1] & 0x0f) {
    case RS_RDMAP_READ_REQUEST:
        return RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN;
    case RS_RDMAP_TERMINATE:
        return RS_DDP_UNTAGGED_HDR_LEN + RS_TERM_HDR_LEN;
    default:
        return RS_DDP_UNTAGGED_HDR_LEN;
    }
}

static int refuse(struct rs_term_cause *cause, uint8_t layer, uint8_t etype, uint8_t ecode)
{
    cause->layer = layer;
    cause->etype = etype;
    cause->ecode = ecode;
    return -EPROTO;
}

/* Whether an RC peer may send this opcode, and with which buffer model and queue. */
static bool rc_opcode_shape(uint8_t opcode, bool *tagged, uint32_t *qn)
{
    switch (opcode) {
    case RS_RDMAP_WRITE:
    case RS_RDMAP_READ_RESPONSE:
        *tagged = true;
        *qn = 0;
        return true;
    case RS_RDMAP_SEND:
    case RS_RDMAP_SEND_INVALIDATE:
    case RS_RDMAP_SEND_SE:
    case RS_RDMAP_SEND_SE_INVALIDATE:
        *tagged = false;
        *qn = RS_DDP_QN_SEND;
        return true;
    case RS_RDMAP_READ_REQUEST:
        *tagged = false;
        *qn = RS_DDP_QN_READ_REQUEST;
        return true;
    case RS_RDMAP_TERMINATE:
        *tagged = false;
        *qn = RS_DDP_QN_TERMINATE;
        return true;
    default:                        /* RFC 7306 opcodes and the datagram-only Write-Record */
        return false;
    }
}

int rs_ddp_seg_parse(const uint8_t *p, size_t ulpdu_len, struct rs_ddp_seg *seg, struct rs_term_cause *cause)
{
    memset(seg, 0, sizeof(*seg));
    memset(cause, 0, sizeof(*cause));
    if (ulpdu_len < 2)
        return refuse(cause, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_CATASTROPHIC, 0);
    seg->ctrl = rs_ddp_ctrl_get(p);
    bool tagged = seg->ctrl.tagged;
    if (seg->ctrl.ddp_version != RS_DDP_VERSION)
        return tagged ? refuse(cause, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_TAGGED_BUFFER,
                               RS_TERM_DDP_TAGGED_INVALID_VERSION)
                      : refuse(cause, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER,
                               RS_TERM_DDP_UNTAGGED_INVALID_VERSION);
    size_t ddp_len = tagged ? RS_DDP_TAGGED_HDR_LEN : RS_DDP_UNTAGGED_HDR_LEN;
    if (ulpdu_len < ddp_len)
        return refuse(cause, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_CATASTROPHIC, 0);
    if (seg->ctrl.rdmap_version != RS_RDMAP_VERSION)
        return refuse(cause, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                      RS_TERM_RDMAP_INVALID_VERSION);
    bool want_tagged;
    uint32_t want_qn;
    if (!rc_opcode_shape(seg->ctrl.opcode, &want_tagged, &want_qn) || want_tagged != tagged)
        return refuse(cause, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                      RS_TERM_RDMAP_UNEXPECTED_OPCODE);
    seg->hdr_len = rs_ddp_hdr_len(p);
    if (tagged) {
        seg->stag = rs_get_be32(p + 2);
        seg->to = rs_get_be64(p + 6);
        seg->payload_len = ulpdu_len - seg->hdr_len;
        return 0;
    }
    seg->inval_stag = rs_get_be32(p + 2);
    seg->qn = rs_get_be32(p + 6);
    seg->msn = rs_get_be32(p + 10);
    seg->mo = rs_get_be32(p + 14);
    if (seg->qn != want_qn)
        return refuse(cause, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER, RS_TERM_DDP_UNTAGGED_INVALID_QN);
    if (seg->ctrl.opcode != RS_RDMAP_SEND_INVALIDATE && seg->ctrl.opcode != RS_RDMAP_SEND_SE_INVALIDATE)
        seg->inval_stag = 0;
    if (ulpdu_len < seg->hdr_len)   /* a Read Request or Terminate cut short inside its RDMAP header */
        return refuse(cause, RS_TERM_LAYER_RDMAP, RS_TERM_RDMAP_ETYPE_REMOTE_OPERATION,
                      RS_TERM_RDMAP_CATASTROPHIC_STREAM);
    seg->payload_len = ulpdu_len - seg->hdr_len;
    if (seg->ctrl.opcode == RS_RDMAP_READ_REQUEST) {
        /* The Read Request queue's buffers are exactly one 28-byte header: a single, whole segment. */
        if (seg->mo != 0)
            return refuse(cause, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER,
                          RS_TERM_DDP_UNTAGGED_INVALID_MO);
        if (!seg->ctrl.last || seg->payload_len != 0)
            return refuse(cause, RS_TERM_LAYER_DDP, RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER,
                          RS_TERM_DDP_UNTAGGED_MSG_TOO_LONG);
        const uint8_t *rr = p + RS_DDP_UNTAGGED_HDR_LEN;
        seg->rr.sink_stag = rs_get_be32(rr);
        seg->rr.sink_to = rs_get_be64(rr + 4);
        seg->rr.size = rs_get_be32(rr + 12);
        seg->rr.src_stag = rs_get_be32(rr + 16);
        seg->rr.src_to = rs_get_be64(rr + 20);
    } else if (seg->ctrl.opcode == RS_RDMAP_TERMINATE) {
        seg->term_word = rs_get_be32(p + RS_DDP_UNTAGGED_HDR_LEN);
    }
    return 0;
}

size_t rs_ddp_tagged_hdr(uint8_t out[RS_DDP_TAGGED_HDR_LEN], uint8_t opcode, bool last, uint32_t stag, uint64_t to)
{
    rs_ddp_ctrl_put(out, true, last, opcode);
    rs_put_be32(out + 2, stag);
    rs_put_be64(out + 6, to);
    return RS_DDP_TAGGED_HDR_LEN;
}

size_t rs_ddp_untagged_hdr(uint8_t out[RS_DDP_UNTAGGED_HDR_LEN], uint8_t opcode, bool last, uint32_t inval_stag,
                           uint32_t qn, uint32_t msn, uint32_t mo)
{
    rs_ddp_ctrl_put(out, false, last, opcode);
    rs_put_be32(out + 2, inval_stag);
    rs_put_be32(out + 6, qn);
    rs_put_be32(out + 10, msn);
    rs_put_be32(out + 14, mo);
    return RS_DDP_UNTAGGED_HDR_LEN;
}

size_t rs_rdmap_read_req_hdr(uint8_t out[RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN], uint32_t msn,
                             const struct rs_rdmap_read_req *rr)
{
    rs_ddp_untagged_hdr(out, RS_RDMAP_READ_REQUEST, true, 0, RS_DDP_QN_READ_REQUEST, msn, 0);
    uint8_t *p = out + RS_DDP_UNTAGGED_HDR_LEN;
    rs_put_be32(p, rr->sink_stag);
    rs_put_be64(p + 4, rr->sink_to);
    rs_put_be32(p + 12, rr->size);
    rs_put_be32(p + 16, rr->src_stag);
    rs_put_be64(p + 20, rr->src_to);
    return RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN;
}

size_t rs_term_build(uint8_t out[RS_TERM_MAX_LEN], uint32_t msn, const struct rs_term_cause *cause,
                     const uint8_t *offending, size_t offending_len, uint16_t offending_ulpdu_len)
{
    size_t n = rs_ddp_untagged_hdr(out, RS_RDMAP_TERMINATE, true, 0, RS_DDP_QN_TERMINATE, msn, 0);
    unsigned flags = 0;
    size_t extra = n + RS_TERM_HDR_LEN;
    if (offending && offending_len >= 2) {
        bool tagged = (offending[0] & RS_DDP_FLAG_TAGGED) != 0;
        size_t ddp_len = tagged ? RS_DDP_TAGGED_HDR_LEN : RS_DDP_UNTAGGED_HDR_LEN;
        if (offending_len >= ddp_len) {
            /* M: the length below is the MPA ULPDU_Length; D: the terminated DDP header follows it. */
            flags |= RS_TERM_FLAG_M | RS_TERM_FLAG_D;
            rs_put_be16(out + extra, offending_ulpdu_len);
            memcpy(out + extra + 2, offending, ddp_len);
            extra += 2 + ddp_len;
            if (!tagged && (offending[1] & 0x0f) == RS_RDMAP_READ_REQUEST &&
                offending_len >= RS_DDP_UNTAGGED_HDR_LEN + RS_RDMAP_READ_REQ_LEN) {
                flags |= RS_TERM_FLAG_R;
                memcpy(out + extra, offending + RS_DDP_UNTAGGED_HDR_LEN, RS_RDMAP_READ_REQ_LEN);
                extra += RS_RDMAP_READ_REQ_LEN;
            }
        }
    }
    rs_put_be32(out + n, rs_term_word((enum rs_term_layer)cause->layer, cause->etype, cause->ecode, flags));
    return extra;
}

const char *rs_term_cause_str(const struct rs_term_cause *c)
{
    switch (c->layer) {
    case RS_TERM_LAYER_RDMAP:
        switch (c->ecode) {
        case RS_TERM_RDMAP_INVALID_STAG: return "RDMAP: invalid STag";
        case RS_TERM_RDMAP_BASE_BOUNDS: return "RDMAP: base or bounds violation";
        case RS_TERM_RDMAP_ACCESS_RIGHTS: return "RDMAP: access rights violation";
        case RS_TERM_RDMAP_STAG_PD_MISMATCH: return "RDMAP: STag not associated with this stream";
        case RS_TERM_RDMAP_TO_WRAP: return "RDMAP: tagged offset wrap";
        case RS_TERM_RDMAP_INVALID_VERSION: return "RDMAP: invalid version";
        case RS_TERM_RDMAP_UNEXPECTED_OPCODE: return "RDMAP: unexpected opcode";
        case RS_TERM_RDMAP_CATASTROPHIC_STREAM: return "RDMAP: catastrophic error in this stream";
        case RS_TERM_RDMAP_CATASTROPHIC_GLOBAL: return "RDMAP: catastrophic global error";
        case RS_TERM_RDMAP_STAG_NOT_INVALIDATABLE: return "RDMAP: STag cannot be invalidated";
        default: return "RDMAP: unspecified error";
        }
    case RS_TERM_LAYER_DDP:
        if (c->etype == RS_TERM_DDP_ETYPE_TAGGED_BUFFER) {
            switch (c->ecode) {
            case RS_TERM_DDP_TAGGED_INVALID_STAG: return "DDP tagged buffer: invalid STag";
            case RS_TERM_DDP_TAGGED_BASE_BOUNDS: return "DDP tagged buffer: base or bounds violation";
            case RS_TERM_DDP_TAGGED_STAG_NOT_ASSOCIATED: return "DDP tagged buffer: STag not associated";
            case RS_TERM_DDP_TAGGED_TO_WRAP: return "DDP tagged buffer: tagged offset wrap";
            case RS_TERM_DDP_TAGGED_INVALID_VERSION: return "DDP tagged buffer: invalid DDP version";
            default: return "DDP tagged buffer: unknown error";
            }
        }
        if (c->etype == RS_TERM_DDP_ETYPE_UNTAGGED_BUFFER) {
            switch (c->ecode) {
            case RS_TERM_DDP_UNTAGGED_INVALID_QN: return "DDP untagged buffer: invalid queue number";
            case RS_TERM_DDP_UNTAGGED_INVALID_MSN_NO_BUFFER: return "DDP untagged buffer: no buffer available";
            case RS_TERM_DDP_UNTAGGED_INVALID_MSN_RANGE: return "DDP untagged buffer: MSN out of range";
            case RS_TERM_DDP_UNTAGGED_INVALID_MO: return "DDP untagged buffer: invalid message offset";
            case RS_TERM_DDP_UNTAGGED_MSG_TOO_LONG: return "DDP untagged buffer: message too long";
            case RS_TERM_DDP_UNTAGGED_INVALID_VERSION: return "DDP untagged buffer: invalid DDP version";
            default: return "DDP untagged buffer: unknown error";
            }
        }
        return "DDP: catastrophic error";
    case RS_TERM_LAYER_LLP:
        switch (c->ecode) {
        case RS_TERM_LLP_TCP_LOST: return "MPA: TCP connection lost";
        case RS_TERM_LLP_CRC: return "MPA: CRC error";
        case RS_TERM_LLP_MARKER: return "MPA: marker error";
        case RS_TERM_LLP_BAD_REQ_REP: return "MPA: bad request or reply";
        case RS_TERM_LLP_LOCAL_CATASTROPHIC: return "MPA: local catastrophic error";
        case RS_TERM_LLP_INSUFFICIENT_IRD: return "MPA: insufficient IRD";
        case RS_TERM_LLP_NO_MATCHING_RTR: return "MPA: no matching RTR";
        default: return "MPA: unknown error";
        }
    default:
        return "unknown layer";
    }
}
