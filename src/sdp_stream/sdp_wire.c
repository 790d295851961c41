/* sdp_wire.c: SDP message layouts (see sdp_wire.h). Byte-by-byte big-endian so unaligned buffers are fine. */
#include <errno.h>
#include <string.h>

#include "sdp_stream/sdp_wire.h"

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) << 32 | get32(p + 4);
}

void rs_sdp_bsdh_encode(const struct rs_sdp_bsdh *h, uint8_t out[RS_SDP_BSDH_LEN])
{
    out[0] = h->mid;
    out[1] = h->flags;
    put16(out + 2, h->bufs);
    put32(out + 4, h->len);
    put32(out + 8, h->mseq);
    put32(out + 12, h->mseq_ack);
}

int rs_sdp_bsdh_decode(const uint8_t *buf, size_t len, struct rs_sdp_bsdh *out)
{
    if (len < RS_SDP_BSDH_LEN)
        return -EBADMSG;
    out->mid = buf[0];
    out->flags = buf[1];
    out->bufs = get16(buf + 2);
    out->len = get32(buf + 4);
    out->mseq = get32(buf + 8);
    out->mseq_ack = get32(buf + 12);
    return 0;
}

uint32_t rs_sdp_hdr_len(uint8_t mid)
{
    switch (mid) {
    case RS_SDP_MID_DATA:
    case RS_SDP_MID_DISCONN:
    case RS_SDP_MID_ABORT:
    case RS_SDP_MID_SEND_SM:
    case RS_SDP_MID_SRC_CANCEL:
    case RS_SDP_MID_SINK_CANCEL:
    case RS_SDP_MID_SINK_CANCEL_ACK:
    case RS_SDP_MID_SUSPEND_ACK:
        return RS_SDP_BSDH_LEN;
    case RS_SDP_MID_RDMA_WR_COMPL:
    case RS_SDP_MID_RDMA_RD_COMPL:
    case RS_SDP_MID_MODE_CHANGE:
    case RS_SDP_MID_CH_RCVBUF:
    case RS_SDP_MID_CH_RCVBUF_ACK:
        return RS_SDP_BSDH_LEN + 4;
    case RS_SDP_MID_SUSPEND:
        return RS_SDP_BSDH_LEN + 8;
    case RS_SDP_MID_SRC_AVAIL:
        return RS_SDP_BSDH_LEN + RS_SDP_SRCAH_LEN;
    case RS_SDP_MID_SINK_AVAIL:
        return RS_SDP_BSDH_LEN + RS_SDP_SINKAH_LEN;
    case RS_SDP_MID_HELLO:
    case RS_SDP_MID_HELLO_ACK:
        return 0;       /* never on the QP */
    default:
        return 0;
    }
}

int rs_sdp_msg_check(const uint8_t *buf, uint32_t byte_len, struct rs_sdp_bsdh *h, struct rs_sdp_avail *avail,
                     uint32_t *compl_len)
{
    if (rs_sdp_bsdh_decode(buf, byte_len, h) != 0)
        return -EBADMSG;
    if (h->len != byte_len)
        return -EBADMSG;
    uint32_t hdr = rs_sdp_hdr_len(h->mid);
    if (hdr == 0)
        return -EPROTO;
    /* The messages of the mode-change and buffer-resize families are legal SDP that rdmasock never negotiates (it
     * always runs the combined mode with fixed buffers), so a peer sending them is not ours. SuspComm and
     * SuspCommAck carry the hand-back (docs/sdp.md): the receiver checks that it was announced. */
    switch (h->mid) {
    case RS_SDP_MID_MODE_CHANGE:
    case RS_SDP_MID_CH_RCVBUF:
    case RS_SDP_MID_CH_RCVBUF_ACK:
        return -EPROTO;
    default:
        break;
    }
    if (byte_len < hdr)
        return -EBADMSG;
    /* Only Data carries payload here: SrcAvail's optional inline data is not used by rdmasock peers, and a
     * SinkAvail never carries any. */
    if (h->mid != RS_SDP_MID_DATA && byte_len != hdr)
        return -EPROTO;
    if (h->flags & (RS_SDP_FLAG_OOB_PRES | RS_SDP_FLAG_OOB_PEND))
        return -EPROTO;     /* urgent data is never sent by rdmasock */
    const uint8_t *ext = buf + RS_SDP_BSDH_LEN;
    if (h->mid == RS_SDP_MID_SRC_AVAIL || h->mid == RS_SDP_MID_SINK_AVAIL) {
        if (avail) {
            avail->len = get32(ext);
            avail->rkey = get32(ext + 4);
            avail->vaddr = get64(ext + 8);
            avail->non_disc = h->mid == RS_SDP_MID_SINK_AVAIL ? get32(ext + 16) : 0;
        }
        if (get32(ext) == 0)
            return -EPROTO;
    }
    if ((h->mid == RS_SDP_MID_RDMA_WR_COMPL || h->mid == RS_SDP_MID_RDMA_RD_COMPL) && compl_len)
        *compl_len = get32(ext);
    return 0;
}

void rs_sdp_avail_encode(const struct rs_sdp_bsdh *h, const struct rs_sdp_avail *a, uint8_t *out)
{
    rs_sdp_bsdh_encode(h, out);
    uint8_t *ext = out + RS_SDP_BSDH_LEN;
    put32(ext, a->len);
    put32(ext + 4, a->rkey);
    put64(ext + 8, a->vaddr);
    if (h->mid == RS_SDP_MID_SINK_AVAIL)
        put32(ext + 16, a->non_disc);
}

void rs_sdp_compl_encode(const struct rs_sdp_bsdh *h, uint32_t len, uint8_t *out)
{
    rs_sdp_bsdh_encode(h, out);
    put32(out + RS_SDP_BSDH_LEN, len);
}

static void ext_encode(const struct rs_sdp_hello *h, uint8_t *p)
{
    put16(p, RS_SDP_EXT_MAGIC);
    put16(p + 2, h->ext_flags);
    put32(p + 4, h->ka_rkey);
    put64(p + 8, h->ka_addr);
}

static void ext_decode(const uint8_t *p, size_t avail, struct rs_sdp_hello *h)
{
    h->has_ext = false;
    h->ext_flags = 0;
    h->ka_rkey = 0;
    h->ka_addr = 0;
    if (avail < RS_SDP_EXT_LEN || get16(p) != RS_SDP_EXT_MAGIC)
        return;
    h->has_ext = true;
    h->ext_flags = get16(p + 2);
    h->ka_rkey = get32(p + 4);
    h->ka_addr = get64(p + 8);
}

size_t rs_sdp_hello_encode(const struct rs_sdp_hello *h, uint8_t *out, size_t cap)
{
    if (cap < RS_SDP_HELLO_LEN)
        return 0;
    struct rs_sdp_bsdh b = h->bsdh;
    b.mid = RS_SDP_MID_HELLO;
    b.len = RS_SDP_HELLO_LEN;
    rs_sdp_bsdh_encode(&b, out);
    uint8_t *hh = out + RS_SDP_BSDH_LEN;
    hh[0] = h->version;
    hh[1] = (uint8_t)(h->ip_version << 4 | (h->caps & 0x0f));
    hh[2] = 0;
    hh[3] = h->max_adverts;
    put32(hh + 4, h->desired_remote_rcv_size);
    put32(hh + 8, h->rcv_size);
    put16(hh + 12, h->port);
    put16(hh + 14, 0);
    ext_encode(h, out + RS_SDP_BSDH_LEN + RS_SDP_HH_LEN);
    return RS_SDP_HELLO_LEN;
}

/* Common acceptance rules: our major version, a BSDH whose len covers what we read. */
static int hello_common(const uint8_t *buf, size_t len, uint8_t want_mid, size_t min_len, struct rs_sdp_hello *out)
{
    memset(out, 0, sizeof(*out));
    if (len < min_len)
        return -EBADMSG;
    rs_sdp_bsdh_decode(buf, len, &out->bsdh);
    if (out->bsdh.mid != want_mid)
        return -EPROTO;
    if (out->bsdh.len < min_len || out->bsdh.len > len)
        return -EBADMSG;
    const uint8_t *hh = buf + RS_SDP_BSDH_LEN;
    out->version = hh[0];
    if ((out->version >> 4) != (RS_SDP_VERSION >> 4))
        return -EPROTO;
    out->ip_version = hh[1] >> 4;
    out->caps = hh[1] & 0x0f;
    out->max_adverts = hh[3];
    return 0;
}

int rs_sdp_hello_decode(const uint8_t *buf, size_t len, struct rs_sdp_hello *out)
{
    int r = hello_common(buf, len, RS_SDP_MID_HELLO, RS_SDP_BSDH_LEN + RS_SDP_HH_LEN, out);
    if (r != 0)
        return r;
    const uint8_t *hh = buf + RS_SDP_BSDH_LEN;
    out->desired_remote_rcv_size = get32(hh + 4);
    out->rcv_size = get32(hh + 8);
    out->port = get16(hh + 12);
    size_t ext_off = RS_SDP_BSDH_LEN + RS_SDP_HH_LEN;
    ext_decode(buf + ext_off, out->bsdh.len > ext_off ? out->bsdh.len - ext_off : 0, out);
    return 0;
}

size_t rs_sdp_hello_ack_encode(const struct rs_sdp_hello *h, uint8_t *out, size_t cap)
{
    if (cap < RS_SDP_HELLO_ACK_LEN)
        return 0;
    struct rs_sdp_bsdh b = h->bsdh;
    b.mid = RS_SDP_MID_HELLO_ACK;
    b.len = RS_SDP_HELLO_ACK_LEN;
    rs_sdp_bsdh_encode(&b, out);
    uint8_t *hah = out + RS_SDP_BSDH_LEN;
    hah[0] = h->version;
    hah[1] = (uint8_t)(h->ip_version << 4 | (h->caps & 0x0f));
    hah[2] = 0;
    hah[3] = h->max_adverts;
    put32(hah + 4, h->rcv_size);
    ext_encode(h, out + RS_SDP_BSDH_LEN + RS_SDP_HAH_LEN);
    return RS_SDP_HELLO_ACK_LEN;
}

int rs_sdp_hello_ack_decode(const uint8_t *buf, size_t len, struct rs_sdp_hello *out)
{
    int r = hello_common(buf, len, RS_SDP_MID_HELLO_ACK, RS_SDP_BSDH_LEN + RS_SDP_HAH_LEN, out);
    if (r != 0)
        return r;
    out->rcv_size = get32(buf + RS_SDP_BSDH_LEN + 4);
    size_t ext_off = RS_SDP_BSDH_LEN + RS_SDP_HAH_LEN;
    ext_decode(buf + ext_off, out->bsdh.len > ext_off ? out->bsdh.len - ext_off : 0, out);
    return 0;
}

void rs_sdp_suspend_encode(const struct rs_sdp_bsdh *h, uint64_t service_id, uint8_t *out)
{
    rs_sdp_bsdh_encode(h, out);
    put32(out + RS_SDP_BSDH_LEN, (uint32_t)(service_id >> 32));
    put32(out + RS_SDP_BSDH_LEN + 4, (uint32_t)service_id);
}

uint64_t rs_sdp_suspend_decode(const uint8_t *msg)
{
    return (uint64_t)get32(msg + RS_SDP_BSDH_LEN) << 32 | get32(msg + RS_SDP_BSDH_LEN + 4);
}

void rs_sdp_hb_hdr_encode(uint8_t out[RS_SDP_HB_HDR_LEN], uint64_t token, uint64_t residue)
{
    memset(out, 0, RS_SDP_HB_HDR_LEN);
    put32(out, RS_SDP_HB_MAGIC);
    out[4] = RS_SDP_HB_VERSION;
    put32(out + 8, (uint32_t)(token >> 32));
    put32(out + 12, (uint32_t)token);
    put32(out + 16, (uint32_t)(residue >> 32));
    put32(out + 20, (uint32_t)residue);
}

int rs_sdp_hb_hdr_decode(const uint8_t *in, size_t len, uint64_t token, uint64_t *residue)
{
    if (len < RS_SDP_HB_HDR_LEN)
        return -EBADMSG;
    uint64_t t = (uint64_t)get32(in + 8) << 32 | get32(in + 12);
    uint64_t r = (uint64_t)get32(in + 16) << 32 | get32(in + 20);
    if (get32(in) != RS_SDP_HB_MAGIC || in[4] != RS_SDP_HB_VERSION || t != token || r > RS_SDP_HB_MAX_RESIDUE)
        return -EPROTO;
    *residue = r;
    return 0;
}

const char *rs_sdp_mid_name(uint8_t mid)
{
    switch (mid) {
    case RS_SDP_MID_HELLO: return "Hello";
    case RS_SDP_MID_HELLO_ACK: return "HelloAck";
    case RS_SDP_MID_DISCONN: return "DisConn";
    case RS_SDP_MID_ABORT: return "AbortConn";
    case RS_SDP_MID_SEND_SM: return "SendSm";
    case RS_SDP_MID_RDMA_WR_COMPL: return "RdmaWrCompl";
    case RS_SDP_MID_RDMA_RD_COMPL: return "RdmaRdCompl";
    case RS_SDP_MID_MODE_CHANGE: return "ModeChange";
    case RS_SDP_MID_SRC_CANCEL: return "SrcAvailCancel";
    case RS_SDP_MID_SINK_CANCEL: return "SinkAvailCancel";
    case RS_SDP_MID_SINK_CANCEL_ACK: return "SinkCancelAck";
    case RS_SDP_MID_CH_RCVBUF: return "ChRcvBuf";
    case RS_SDP_MID_CH_RCVBUF_ACK: return "ChRcvBufAck";
    case RS_SDP_MID_SUSPEND: return "SuspComm";
    case RS_SDP_MID_SUSPEND_ACK: return "SuspCommAck";
    case RS_SDP_MID_SINK_AVAIL: return "SinkAvail";
    case RS_SDP_MID_SRC_AVAIL: return "SrcAvail";
    case RS_SDP_MID_DATA: return "Data";
    default: return "Unknown";
    }
}

bool rs_sdp_imm_encode(const struct rs_sdp_bsdh *h, uint32_t *imm)
{
    if (h->mid != RS_SDP_MID_DATA || h->flags != 0 || h->len <= RS_SDP_BSDH_LEN || h->bufs > RS_SDP_IMM_BUFS_MAX)
        return false;
    *imm = (uint32_t)h->bufs << 20 | (h->mseq_ack & RS_SDP_IMM_ACK_MASK);
    return true;
}

void rs_sdp_imm_decode(uint32_t imm, uint32_t payload_len, uint32_t next_mseq, uint32_t last_sent_mseq,
                       struct rs_sdp_bsdh *out)
{
    *out = (struct rs_sdp_bsdh){
        .mid = RS_SDP_MID_DATA, .flags = 0, .bufs = (uint16_t)(imm >> 20), .len = RS_SDP_BSDH_LEN + payload_len,
        .mseq = next_mseq, .mseq_ack = last_sent_mseq - ((last_sent_mseq - imm) & RS_SDP_IMM_ACK_MASK),
    };
}
