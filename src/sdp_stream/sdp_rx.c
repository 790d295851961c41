/*
 * sdp_rx.c: the receiving half. Receive completions are checked and turned into a FIFO of received data (whole
 * receive buffers, and the peer's SrcAvail advertisements in stream order); recv() copies out of it, reposts the
 * buffers it emptied and lets the credit logic tell the peer.
 *
 * Control messages are handled as they arrive and their buffers reposted at once, so only Data messages hold
 * buffers for any length of time.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

void rs_sdp_post_recv_buf(struct rs_sdp_sock *s, uint32_t idx)
{
    if (!s->qp || s->cm_gone || s->state == SDP_ST_CLOSED)
        return;
    struct rs_rnic_sge sge = {
        .addr = (uint64_t)(uintptr_t)(s->rbuf_mem + (size_t)idx * s->rbuf_size), .length = s->rbuf_size,
        .lkey = s->rbuf_mr->lkey,
    };
    struct rs_rnic_recv_wr wr = { .wr_id = idx, .sg_list = &sge, .num_sge = 1 };
    struct rs_rnic_recv_wr *bad = NULL;
    if (rs_rnic_post_recv(s->qp, &wr, &bad) == 0)
        s->rx_posted++;
}

void rs_sdp_rx_repost_flush(struct rs_sdp_sock *s)
{
    uint32_t n = s->rx_repost_n;
    s->rx_repost_n = 0;
    if (n == 0 || !s->qp || s->cm_gone || s->state == SDP_ST_CLOSED)
        return;
    struct rs_rnic_sge sge[SDP_REPOST_MAX];
    struct rs_rnic_recv_wr wr[SDP_REPOST_MAX];
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = s->rx_repost[i];
        sge[i] = (struct rs_rnic_sge){
            .addr = (uint64_t)(uintptr_t)(s->rbuf_mem + (size_t)idx * s->rbuf_size), .length = s->rbuf_size,
            .lkey = s->rbuf_mr->lkey,
        };
        wr[i] = (struct rs_rnic_recv_wr){ .next = i + 1 < n ? &wr[i + 1] : NULL, .wr_id = idx, .sg_list = &sge[i],
                                          .num_sge = 1 };
    }
    struct rs_rnic_recv_wr *bad = NULL;
    if (rs_rnic_post_recv(s->qp, wr, &bad) == 0)
        s->rx_posted += n;
    else if (bad)
        s->rx_posted += (uint32_t)(bad - wr);
}

void rs_sdp_protocol_error(struct rs_sdp_sock *s, const char *what, uint32_t v)
{
    RS_WARN("sdp: protocol error from the peer (%s %u): resetting the connection", what, v);
    rs_sdp_fail(s, EPROTO, true);
}

static RS_ALWAYS_INLINE void rxq_push(struct rs_sdp_sock *s, uint8_t kind, uint32_t buf, uint32_t off, uint32_t len)
{
    uint32_t at = s->rxq_head + s->rxq_count;    /* count <= cap: one wrap at most */
    if (at >= s->rxq_cap)
        at -= s->rxq_cap;
    s->rxq[at] = (struct sdp_rx_entry){ .kind = kind, .buf = buf, .off = off, .len = len };
    s->rxq_count++;
    s->rx_bytes_queued += len;
}

void rs_sdp_rx_discard_all(struct rs_sdp_sock *s)
{
    if (s->rx_direct_len) {
        /* A message a short recv was about to take goes with the rest (the recv then finds the reset). */
        rs_sdp_post_recv_buf(s, s->rx_direct_buf);
        s->rx_direct_len = 0;
    }
    if (s->rx_busy) {
        /* A reader is copying from the head entry right now; it notices the reset when it takes the lock
         * again (broken) and stops. Only the bytes count goes now. */
        s->rx_bytes_queued = 0;
        return;
    }
    while (s->rxq_count > 0) {
        struct sdp_rx_entry *e = &s->rxq[s->rxq_head];
        if (e->kind == SDP_RX_DATA)
            rs_sdp_post_recv_buf(s, e->buf);
        s->rxq_head = sdp_next(s->rxq_head, s->rxq_cap);
        s->rxq_count--;
    }
    s->rx_bytes_queued = 0;
}

/* A checked header's sequence, credits and acknowledgement: what every message tells us. A Data message also
 * acknowledges; more credits may let queued data go (dirty). */
static RS_ALWAYS_INLINE void take_header(struct rs_sdp_sock *s, const struct rs_sdp_bsdh *h)
{
    s->rx_mseq_last = h->mseq;
    s->peer_bufs = h->bufs;
    s->peer_ack = h->mseq_ack;
    if (s->overdraft_out && rs_sdp_seq_diff(s->peer_ack, s->overdraft_mseq) >= 0)
        s->overdraft_out = false;
    if (s->nagle_wait && rs_sdp_seq_diff(s->peer_ack, s->nagle_mseq) >= 0) {
        s->nagle_wait = false;
        s->hold_since_ms = 0;
    }
    rs_sdp_stamp(s, true);
    s->stats.msgs_received++;
    s->dirty = true;
}

/*
 * The common message, first and in a straight line: compact Data on a connection in steady state, what a busy
 * ping-pong receives every time. Only the checks that can fail for it are made here; anything else (an error, a
 * state that is not steady, an acknowledgement out of range, a full queue) returns false before changing anything,
 * and rs_sdp_on_recv's full handling takes the same completion from the start.
 */
static RS_ALWAYS_INLINE bool on_compact_data(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc, uint32_t idx,
                                             bool steady_known)
{
    if (wc->status != RS_WC_SUCCESS || !s->imm_rx || wc->opcode != RS_WC_RECV || wc->byte_len == 0 ||
        !(steady_known || rs_sdp_steady(s)) || s->disconn_rcvd || s->rxq_count >= s->rxq_cap)
        return false;
    struct rs_sdp_bsdh h;
    rs_sdp_imm_decode(wc->imm_data, wc->byte_len, s->rx_mseq_last + 1, s->tx_mseq_next - 1, &h);
    /* The rebuilt acknowledgement is never beyond what we sent; it may still be older than the last one. */
    if (rs_sdp_seq_diff(h.mseq_ack, s->peer_ack) < 0)
        return false;
    take_header(s, &h);
    s->stats.compact_received++;
    s->last_rx_pure = false;
    s->stats.data_msgs_received++;
    if (wc->byte_len <= s->rx_direct_max && s->rxq_count == 0) {
        /* A short recv waits for exactly this (sdp_fast.c): it copies the bytes out before the lock goes. */
        s->rx_direct_max = 0;
        s->rx_direct_len = wc->byte_len;
        s->rx_direct_buf = idx;
        return true;
    }
    rxq_push(s, SDP_RX_DATA, idx, 0, wc->byte_len);
    return true;
}

static void on_recv_full(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc, uint32_t idx);

/* A receive completion; true when it was compact Data (steady_known: see rs_sdp_on_recv_steady). */
static RS_ALWAYS_INLINE bool on_recv(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc, bool steady_known)
{
    uint32_t idx = (uint32_t)wc->wr_id;
    if (idx >= s->nbufs)
        return false;
    if (s->rx_posted > 0)
        s->rx_posted--;
    if ((wc->flags & RS_WC_WITH_IMM) && on_compact_data(s, wc, idx, steady_known))
        return true;
    on_recv_full(s, wc, idx);
    return false;
}

void rs_sdp_on_recv(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc)
{
    (void)on_recv(s, wc, false);
}

bool rs_sdp_on_recv_steady(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc)
{
    return on_recv(s, wc, true);
}

/* Everything but compact Data in the steady state: errors, the full header, every message id. */
static void on_recv_full(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc, uint32_t idx)
{
    if (wc->status != RS_WC_SUCCESS) {
        if (wc->status != RS_WC_WR_FLUSH_ERR && s->state != SDP_ST_CLOSED) {
            RS_DEBUG("sdp: receive failed with status %d", (int)wc->status);
            rs_sdp_fail(s, ECONNRESET, false);
        }
        return;
    }
    if (s->broken || s->state == SDP_ST_CLOSED)
        return;
    const uint8_t *buf = s->rbuf_mem + (size_t)idx * s->rbuf_size;
    struct rs_sdp_bsdh h;
    struct rs_sdp_avail avail = { 0 };
    uint32_t compl_len = 0;
    uint32_t data_off = RS_SDP_BSDH_LEN;
    if (wc->flags & RS_WC_WITH_IMM) {
        /* Compact Data (sdp_wire.h): a SEND of payload only, on a QP that announced it. */
        if (!s->imm_rx || wc->opcode != RS_WC_RECV || wc->byte_len == 0) {
            rs_sdp_post_recv_buf(s, idx);
            rs_sdp_protocol_error(s, "compact Data not announced, or empty, len", wc->byte_len);
            return;
        }
        rs_sdp_imm_decode(wc->imm_data, wc->byte_len, s->rx_mseq_last + 1, s->tx_mseq_next - 1, &h);
        data_off = 0;
        s->stats.compact_received++;
    } else if (rs_sdp_msg_check(buf, wc->byte_len, &h, &avail, &compl_len) != 0) {
        rs_sdp_post_recv_buf(s, idx);
        /* An empty SEND is legal RDMA: its buffer still holds an older message, so byte 0 is not its MID. */
        if (wc->byte_len == 0)
            rs_sdp_protocol_error(s, "empty message, len", 0);
        else
            rs_sdp_protocol_error(s, "malformed message, mid", buf[0]);
        return;
    }
    if (h.mseq != s->rx_mseq_last + 1) {
        rs_sdp_post_recv_buf(s, idx);
        rs_sdp_protocol_error(s, "mseq out of order", h.mseq);
        return;
    }
    if (rs_sdp_seq_diff(h.mseq_ack, s->tx_mseq_next - 1) > 0 || rs_sdp_seq_diff(h.mseq_ack, s->peer_ack) < 0) {
        rs_sdp_post_recv_buf(s, idx);
        rs_sdp_protocol_error(s, "mseq_ack beyond what we sent", h.mseq_ack);
        return;
    }
    take_header(s, &h);
    /* Data's header length without the table lookup of rs_sdp_hdr_len (a switch: an indirect jump). */
    uint32_t payload = h.len - (h.mid == RS_SDP_MID_DATA ? RS_SDP_BSDH_LEN : rs_sdp_hdr_len(h.mid));
    s->last_rx_pure = h.mid == RS_SDP_MID_DATA && payload == 0;
    RS_TRACE("sdp: got %s mseq %u ack %u bufs %u len %u", rs_sdp_mid_name(h.mid), h.mseq, h.mseq_ack, h.bufs, h.len);

    /* Data by a plain test: the switch below is a jump table, an indirect jump looked up at run time under TCG. */
    if (h.mid == RS_SDP_MID_DATA) {
        if (payload == 0) {
            rs_sdp_post_recv_buf(s, idx);
            return;
        }
        if (s->disconn_rcvd) {
            rs_sdp_post_recv_buf(s, idx);
            rs_sdp_protocol_error(s, "data after DisConn, len", payload);
            return;
        }
        if (s->psrc.active) {
            /* The source sends nothing more until its SrcAvail is resolved (SendSm or the last RdmaRdCompl).
             * Queued behind it, this data would leave the SrcAvail stuck in the middle of the stream, where a
             * SendSm cannot drop it: recv() would block for ever (or return EAGAIN while poll says readable). */
            rs_sdp_post_recv_buf(s, idx);
            rs_sdp_protocol_error(s, "data while a SrcAvail is pending, len", payload);
            return;
        }
        /* Data matters to the zero-copy state only while our sink is out (the crossing rule). */
        if (s->sink.active)
            rs_sdp_z_on_msg(s, &h, &avail, compl_len);
        if (s->app_closed) {
            /* Data for a socket the application closed: TCP answers with a reset. */
            rs_sdp_post_recv_buf(s, idx);
            rs_sdp_fail(s, ECONNRESET, true);
            return;
        }
        if (s->rxq_count >= s->rxq_cap) {
            rs_sdp_post_recv_buf(s, idx);
            rs_sdp_protocol_error(s, "receive queue overrun, len", payload);
            return;
        }
        rxq_push(s, SDP_RX_DATA, idx, data_off, payload);
        s->stats.data_msgs_received++;
        return;
    }
    switch (h.mid) {
    case RS_SDP_MID_DISCONN:
        rs_sdp_post_recv_buf(s, idx);
        rs_sdp_z_on_msg(s, &h, &avail, compl_len);
        s->disconn_rcvd = true;
        s->rx_eof = true;
        s->ack_owed = true;
        return;
    case RS_SDP_MID_ABORT:
        rs_sdp_fail(s, ECONNRESET, false);
        return;
    case RS_SDP_MID_SUSPEND:
    case RS_SDP_MID_SUSPEND_ACK: {
        uint64_t id = h.mid == RS_SDP_MID_SUSPEND ? rs_sdp_suspend_decode(buf) : 0;
        rs_sdp_post_recv_buf(s, idx);
        if (!s->peer_handback && s->state == SDP_ST_CONNECTING && h.mid == RS_SDP_MID_SUSPEND &&
            !s->hb.early_suspend) {
            /* The peer is connected and may hand back at once (a server that forks and closes), so its SuspComm
             * can complete here before the CM event carrying its HelloAck, which says whether it may: answer it
             * when that comes (on_cm_event). */
            s->hb.early_suspend = true;
            s->hb.early_service_id = id;
            return;
        }
        if (!s->peer_handback) {
            rs_sdp_protocol_error(s, "hand-back never announced, mid", h.mid);
            return;
        }
        if (h.mid == RS_SDP_MID_SUSPEND)
            rs_sdp_hb_on_suspend(s, id);
        else
            rs_sdp_hb_on_suspend_ack(s);
        return;
    }
    case RS_SDP_MID_SRC_AVAIL:
        rs_sdp_post_recv_buf(s, idx);
        if (s->disconn_rcvd) {
            rs_sdp_protocol_error(s, "SrcAvail after DisConn, len", avail.len);
            return;
        }
        rs_sdp_z_on_msg(s, &h, &avail, compl_len);
        if (s->broken)
            return;
        if (s->rxq_count >= s->rxq_cap) {
            rs_sdp_protocol_error(s, "receive queue overrun, len", avail.len);
            return;
        }
        rxq_push(s, SDP_RX_SRC, 0, 0, avail.len);
        return;
    default:
        rs_sdp_post_recv_buf(s, idx);
        rs_sdp_z_on_msg(s, &h, &avail, compl_len);
        return;
    }
}

/* ---- recv() ---- */

static size_t iov_total(const struct iovec *iov, int iovcnt)
{
    size_t t = 0;
    for (int i = 0; i < iovcnt; i++)
        t += iov[i].iov_len;
    return t;
}

/* The next contiguous piece of the destination at (vi, vo), at most max bytes; NULL when the iovec is full. */
static uint8_t *dest_piece(const struct iovec *iov, int iovcnt, int *vi, size_t *vo, size_t *len)
{
    while (*vi < iovcnt && *vo >= iov[*vi].iov_len) {
        (*vi)++;
        *vo = 0;
    }
    if (*vi >= iovcnt) {
        *len = 0;
        return NULL;
    }
    *len = iov[*vi].iov_len - *vo;
    return (uint8_t *)iov[*vi].iov_base + *vo;
}

/*
 * Copies queued data into the iovec (rx_busy owned, lock held on entry and return; dropped around the copies).
 * Returns the bytes placed, or a negative errno if nothing was placed and a zero-copy read failed.
 */
static ssize_t copy_out(struct rs_sdp_sock *s, const struct iovec *iov, int iovcnt, int *vi, size_t *vo,
                        size_t want, int flags)
{
    bool peek = (flags & MSG_PEEK) != 0;
    bool trunc = (flags & MSG_TRUNC) != 0;
    size_t done = 0;
    uint32_t e_idx = 0;             /* entry offset from the head (PEEK walks without consuming) */
    uint32_t peek_off = 0;          /* bytes of that entry already peeked */
    while (done < want && e_idx < s->rxq_count && !s->broken) {
        struct sdp_rx_entry e = s->rxq[(s->rxq_head + e_idx) % s->rxq_cap];
        uint32_t e_off = peek ? peek_off : 0;
        if (e.len <= e_off) {
            e_idx++;
            peek_off = 0;
            continue;
        }
        if (e.kind == SDP_RX_SRC) {
            if (e_idx != 0 || done > 0)
                break;          /* a zero-copy advertisement is read on its own, from the queue head */
            size_t plen;
            uint8_t *dst = dest_piece(iov, iovcnt, vi, vo, &plen);
            if (!dst && !trunc)
                break;
            if (plen > want - done)
                plen = want - done;
            ssize_t z = rs_sdp_z_read_src(s, trunc ? NULL : dst, trunc ? want - done : plen, peek);
            if (z < 0)
                return done > 0 ? (ssize_t)done : z;
            if (z == 0)
                break;          /* it became bcopy (SendSm): the data follows as Data messages */
            done += (size_t)z;
            if (!trunc)
                *vo += (size_t)z;
            break;
        }
        uint32_t avail_bytes = e.len - e_off;
        size_t n = avail_bytes;
        if (n > want - done)
            n = want - done;
        const uint8_t *src = s->rbuf_mem + (size_t)e.buf * s->rbuf_size + e.off + e_off;
        if (!trunc) {
            size_t left = n;
            size_t copied = 0;
            /* A large copy lets the progress thread and senders in meanwhile (rx_busy keeps other readers out). */
            bool unlocked = n > SDP_COPY_LOCKED_MAX;
            if (unlocked)
                rs_unlock(&s->lock);
            while (left > 0) {
                size_t plen;
                uint8_t *dst = dest_piece(iov, iovcnt, vi, vo, &plen);
                if (!dst)
                    break;
                size_t c = plen < left ? plen : left;
                memcpy(dst, src + copied, c);
                copied += c;
                left -= c;
                *vo += c;
            }
            if (unlocked)
                rs_lock(&s->lock);
            n = copied;
        }
        done += n;
        if (peek) {
            peek_off = e_off + (uint32_t)n;
            if (peek_off >= e.len) {
                e_idx++;
                peek_off = 0;
            }
            continue;
        }
        if (s->broken)
            break;      /* the reset already dropped the queue */
        if (rs_sdp_rx_consume(s, (uint32_t)n, false))
            rs_sdp_credit_update_check(s);
    }
    return (ssize_t)done;
}

ssize_t rs_sdp_recvmsg(struct rs_sdp_sock *s, const struct iovec *iov, int iovcnt, int flags)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    if (iovcnt < 0 || (iovcnt > 0 && !iov))
        return -EINVAL;
    if (flags & (MSG_OOB | MSG_ERRQUEUE))
        return flags & MSG_ERRQUEUE ? -EAGAIN : -EINVAL;
    size_t total = iov_total(iov, iovcnt);
    rs_lock(&s->lock);
    bool dontwait = s->nonblock || (flags & MSG_DONTWAIT);
    uint64_t deadline = !dontwait && s->rcvtimeo_ms > 0 ? rs_sdp_now_ms() + (uint64_t)s->rcvtimeo_ms : 0;
    size_t target = 1;
    if (flags & MSG_WAITALL)
        target = total;
    else if (s->rcvlowat > 1)
        target = (size_t)s->rcvlowat < total ? (size_t)s->rcvlowat : total;
    if (flags & MSG_PEEK)
        target = target > 1 && (flags & MSG_WAITALL) ? target : 1;
    size_t copied = 0;
    int vi = 0;
    size_t vo = 0;
    ssize_t result = 0;
    bool own = false;
    /* A read that could have offered a sink and waits for copied data instead: timed for the sink adaptivity. */
    uint64_t copy_wait_us = 0;
    size_t copy_wait_len = 0, copied_before_wait = 0;
    for (;;) {
        rs_sdp_progress_poll(s);
        if (s->app_closed) {
            result = -EBADF;
            break;
        }
        int gate = rs_sdp_hb_gate(s, dontwait || copied > 0);
        if (gate != 0) {
            /* Handed back (or being): the queue is the kernel socket's now. Let go of it and stop here. */
            if (own) {
                s->rx_busy = false;
                own = false;
                s->dirty = true;
            }
            if (copied > 0)
                break;
            if (gate < 0) {
                result = gate;
                break;
            }
            r = rs_sdp_wait_io(s, false, deadline);
            if (r != 0) {
                result = r;
                break;
            }
            continue;
        }
        if (s->state == SDP_ST_IDLE || s->state == SDP_ST_LISTEN) {
            result = -ENOTCONN;
            break;
        }
        if (total == 0)
            break;
        if (!own) {
            if (s->rx_busy) {
                r = rs_sdp_wait_io(s, dontwait, deadline);
                if (r != 0) {
                    result = r;
                    break;
                }
                continue;
            }
            s->rx_busy = true;
            own = true;
        }
        bool stuck = false;
        if (s->rxq_count > 0) {
            /* PEEK looks at everything queued without consuming: copy from the start each time. */
            if (flags & MSG_PEEK) {
                vi = 0;
                vo = 0;
                copied = 0;
            }
            uint32_t head_before = s->rxq_head, count_before = s->rxq_count;
            ssize_t n = copy_out(s, iov, iovcnt, &vi, &vo, total - copied, flags);
            if (n < 0) {
                if (copied == 0)
                    result = n;
                break;
            }
            copied += (size_t)n;
            if (n > 0)
                s->dirty = true;
            else if (s->rxq_head == head_before && s->rxq_count == count_before)
                stuck = true;       /* e.g. a SrcAvail turned into Data messages that are still on the way */
            /* (A head entry dropped without bytes, a SrcAvail given up, is no reason to sleep: what queued
             * behind it is readable now and raises no further wake-up.) */
        }
        if (copied >= target)
            break;
        if (s->so_error) {
            if (copied == 0) {
                result = -s->so_error;
                s->so_error = 0;
            }
            break;
        }
        if ((s->rx_eof || s->rd_shut || s->state == SDP_ST_CLOSED) && s->rxq_count == 0)
            break;
        if (s->rxq_count > 0 && !stuck && copied < total)
            continue;
        if (s->state == SDP_ST_CONNECTED && dontwait) {
            if (copied == 0) {
                result = -EAGAIN;
                rs_sdp_note_poll_miss(s);
            }
            break;
        }
        if ((s->state == SDP_ST_CONNECTING) && dontwait) {
            result = -EAGAIN;
            break;
        }
        /* Zero copy into the application's buffer: advertise it as a sink when nothing is queued. */
        if (s->state == SDP_ST_CONNECTED && !dontwait && !(flags & (MSG_PEEK | MSG_TRUNC)) && s->rxq_count == 0) {
            uint32_t zt = rs_sdp_z_sinks_by_default(s) ? rs_sdp_zthresh(s) : 0;
            size_t plen;
            uint8_t *dst = dest_piece(iov, iovcnt, &vi, &vo, &plen);
            if (zt && dst && plen >= zt && !rs_sdp_z_choose_sink(s, plen)) {
                if (!copy_wait_us) {
                    copy_wait_us = rs_sdp_now_us();
                    copy_wait_len = plen;
                    copied_before_wait = copied;
                }
            } else if (zt && dst && plen >= zt) {
                bool interrupted = false;
                uint64_t sink_started_us = rs_sdp_now_us();
                ssize_t z = rs_sdp_z_sink_recv(s, dst, plen, deadline, &interrupted);
                if (z > 0)
                    rs_sdp_z_record_sink(s, plen, true, (uint64_t)z, rs_sdp_now_us() - sink_started_us);
                /* -EAGAIN: no sink could be offered now (no credit to send it, backoff, ...) and nothing ran
                 * since the checks above, so sleeping below is safe; looping instead would spin with the lock
                 * held. Anything else: the sink's wait ran the protocol on this thread, so what it brought
                 * (the data that crossed the sink, the peer's DisConn) signalled nobody we could hear; look at
                 * the socket again before sleeping, or that wake-up is lost for good. */
                if (z != -EAGAIN) {
                    if (z > 0) {
                        copied += (size_t)z;
                        vo += (size_t)z;
                        s->dirty = true;
                        if (copied >= target)
                            break;
                    }
                    if (z < 0 && copied == 0) {
                        result = z == -ETIMEDOUT ? -EAGAIN : z;
                        break;
                    }
                    if (interrupted || z < 0)
                        break;
                    continue;
                }
            }
        }
        r = rs_sdp_wait_rx(s, deadline);
        if (r != 0) {
            if (copied == 0)
                result = r == -ETIMEDOUT ? -EAGAIN : r;
            break;
        }
    }
    if (own)
        s->rx_busy = false;
    if (copied > 0 && result >= 0)
        result = (ssize_t)copied;
    if (copy_wait_us && copied > copied_before_wait && result > 0)
        rs_sdp_z_record_sink(s, copy_wait_len, false, copied - copied_before_wait, rs_sdp_now_us() - copy_wait_us);
    if (result == -EAGAIN && copied == 0 && (s->rx_eof || s->state == SDP_ST_CLOSED) && s->rxq_count == 0 &&
        s->hb.phase == SDP_HB_NONE)
        result = rs_sdp_take_error(s, 0);
    if (result == -EAGAIN && copied == 0) {
        /* A miss consumed nothing: the look at the CQ above is all it owes. A busy-polling reader makes many per
         * message, and each costs it latency; a second round of the protocol here doubled that. Readiness is
         * refreshed only if the look changed something or the notification fd may still say readable. */
        if (s->dirty || s->notify_on) {
            s->dirty = false;
            rs_sdp_signal(s);
        }
    } else {
        s->dirty = true;
        rs_sdp_call_done(s);
    }
    rs_unlock(&s->lock);
    return result;
}

ssize_t rs_sdp_recv(struct rs_sdp_sock *s, void *buf, size_t len, int flags)
{
    struct iovec iov = { buf, len };
    return rs_sdp_recvmsg(s, &iov, 1, flags);
}

int rs_sdp_inq(struct rs_sdp_sock *s)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    if (rs_sdp_hb_settle(s) != 0) {
        rs_unlock(&s->lock);
        return -EREMCHG;
    }
    rs_sdp_progress(s);
    uint64_t q = s->rx_bytes_queued;
    rs_unlock(&s->lock);
    return q > INT32_MAX ? INT32_MAX : (int)q;
}
