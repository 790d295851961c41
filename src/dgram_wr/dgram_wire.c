/*
 * dgram_wire.c: encoder and strict decoder of the datagram control messages (docs/dgram.md §4).
 *
 * Header (24 bytes, big-endian):
 *   0  4  magic "RSDG"
 *   4  1  version (1)
 *   5  1  type
 *   6  2  body length: must equal the fixed length of the type's body
 *   8  8  instance of the sender (non-zero)
 *  16  8  nonce
 * The body layouts are below (body_len_of). Reserved bytes are sent as zero and must be zero.
 */
#include <errno.h>
#include <string.h>

#include "dgram_wr/dgram_wire.h"

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

/* Body length of each type; 0 for an unknown type (BYE has a zero body and is handled apart). */
static int body_len_of(enum rs_dgw_type type)
{
    switch (type) {
    case RS_DGW_PROBE:
        return 8;       /* want(1) rnic_kind(1) reserved(6) */
    case RS_DGW_ANSWER:
    case RS_DGW_ANNOUNCE:
        return 32;      /* flags(1) kind(1) reserved(2) qpn(4) lane_rkey(4) lane_size(4) lane_to(8) records(4) rsvd(4) */
    case RS_DGW_SINK:
        return 24;      /* sink_id(4) rkey(4) to(8) len(4) reserved(4) */
    case RS_DGW_CONSUMED:
        return 16;      /* lane_rkey(4) records(4) consumed(8) */
    case RS_DGW_BYE:
        return 0;
    }
    return -1;
}

bool rs_dgw_has_magic(const uint8_t *buf, size_t len)
{
    return len >= 4 && buf[0] == RS_DGW_MAGIC0 && buf[1] == RS_DGW_MAGIC1 && buf[2] == RS_DGW_MAGIC2 &&
           buf[3] == RS_DGW_MAGIC3;
}

size_t rs_dgw_encode(const struct rs_dgw_msg *m, uint8_t *buf)
{
    int body = body_len_of(m->type);
    if (body < 0)
        return 0;
    memset(buf, 0, RS_DGW_HDR_LEN + (size_t)body);
    buf[0] = RS_DGW_MAGIC0;
    buf[1] = RS_DGW_MAGIC1;
    buf[2] = RS_DGW_MAGIC2;
    buf[3] = RS_DGW_MAGIC3;
    buf[4] = RS_DGW_VERSION;
    buf[5] = (uint8_t)m->type;
    put16(buf + 6, (uint16_t)body);
    put64(buf + 8, m->instance);
    put64(buf + 16, m->nonce);
    uint8_t *b = buf + RS_DGW_HDR_LEN;
    switch (m->type) {
    case RS_DGW_PROBE:
        b[0] = m->u.probe.want;
        b[1] = m->u.probe.rnic_kind;
        break;
    case RS_DGW_ANSWER:
    case RS_DGW_ANNOUNCE:
        b[0] = m->u.answer.flags;
        b[1] = m->u.answer.rnic_kind;
        put32(b + 4, m->u.answer.qpn);
        put32(b + 8, m->u.answer.lane_rkey);
        put32(b + 12, m->u.answer.lane_size);
        put64(b + 16, m->u.answer.lane_to);
        put32(b + 24, m->u.answer.lane_records);
        break;
    case RS_DGW_SINK:
        put32(b, m->u.sink.sink_id);
        put32(b + 4, m->u.sink.rkey);
        put64(b + 8, m->u.sink.to);
        put32(b + 16, m->u.sink.len);
        break;
    case RS_DGW_CONSUMED:
        put32(b, m->u.consumed.lane_rkey);
        put32(b + 4, m->u.consumed.records);
        put64(b + 8, m->u.consumed.consumed);
        break;
    case RS_DGW_BYE:
        break;
    }
    return RS_DGW_HDR_LEN + (size_t)body;
}

static bool zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

int rs_dgw_decode(const uint8_t *buf, size_t len, struct rs_dgw_msg *m)
{
    memset(m, 0, sizeof(*m));
    if (len < RS_DGW_HDR_LEN || !rs_dgw_has_magic(buf, len) || buf[4] != RS_DGW_VERSION)
        return -EBADMSG;
    enum rs_dgw_type type = (enum rs_dgw_type)buf[5];
    int body = body_len_of(type);
    if (body < 0 || get16(buf + 6) != (uint16_t)body || len != RS_DGW_HDR_LEN + (size_t)body)
        return -EBADMSG;
    m->type = type;
    m->instance = get64(buf + 8);
    m->nonce = get64(buf + 16);
    if (m->instance == 0)
        return -EBADMSG;
    const uint8_t *b = buf + RS_DGW_HDR_LEN;
    switch (type) {
    case RS_DGW_PROBE:
        if (!zero(b + 2, 6) || (b[0] & ~RS_DGW_WANT_LANE) || m->nonce == 0)
            return -EBADMSG;
        m->u.probe.want = b[0];
        m->u.probe.rnic_kind = b[1];
        return 0;
    case RS_DGW_ANSWER:
    case RS_DGW_ANNOUNCE:
        if (!zero(b + 2, 2) || !zero(b + 28, 4) || (b[0] & ~(RS_DGW_ACCEPT | RS_DGW_HAS_LANE)))
            return -EBADMSG;
        m->u.answer.flags = b[0];
        m->u.answer.rnic_kind = b[1];
        m->u.answer.qpn = get32(b + 4);
        m->u.answer.lane_rkey = get32(b + 8);
        m->u.answer.lane_size = get32(b + 12);
        m->u.answer.lane_to = get64(b + 16);
        m->u.answer.lane_records = get32(b + 24);
        if (type == RS_DGW_ANSWER && m->nonce == 0)
            return -EBADMSG;
        if (m->u.answer.flags & RS_DGW_HAS_LANE) {
            /* A lane must be usable: accepted, non-empty, room for a record, no wrap of its addresses. */
            if (!(m->u.answer.flags & RS_DGW_ACCEPT) || m->u.answer.lane_size < 4096 ||
                m->u.answer.lane_records == 0 || m->u.answer.lane_to + m->u.answer.lane_size < m->u.answer.lane_to)
                return -EBADMSG;
        } else if (m->u.answer.lane_rkey || m->u.answer.lane_size || m->u.answer.lane_to ||
                   m->u.answer.lane_records) {
            return -EBADMSG;
        }
        return 0;
    case RS_DGW_SINK:
        if (!zero(b + 20, 4))
            return -EBADMSG;
        m->u.sink.sink_id = get32(b);
        m->u.sink.rkey = get32(b + 4);
        m->u.sink.to = get64(b + 8);
        m->u.sink.len = get32(b + 16);
        if (m->u.sink.len == 0 || m->u.sink.to + m->u.sink.len < m->u.sink.to)
            return -EBADMSG;
        return 0;
    case RS_DGW_CONSUMED:
        m->u.consumed.lane_rkey = get32(b);
        m->u.consumed.records = get32(b + 4);
        m->u.consumed.consumed = get64(b + 8);
        return 0;
    case RS_DGW_BYE:
        return 0;
    }
    return -EBADMSG;
}
