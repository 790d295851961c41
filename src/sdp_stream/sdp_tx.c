/*
 * sdp_tx.c: the sending half. Credits, one function that posts every SDP message, the push that turns buffered
 * bytes into Data messages under Nagle / TCP_CORK / MSG_MORE, credit updates, and send().
 *
 * Credits (docs/sdp.md, "Credits"): the peer's BSDH says how many receive buffers it has posted (bufs) and which of
 * our messages it has processed (mseq_ack); every message we send after mseq_ack will take one of those buffers,
 * so credits = mseq_ack + bufs - (last mseq we sent). Each side posts one receive buffer more than it advertises:
 * the overdraft buffer, which lets a side with no credit left send one control message (a credit update or a
 * zero-copy answer) so the two sides can never both be waiting for the other's credit update. Data-bearing
 * messages keep one credit in reserve (Annex A4 CA4-82: with one credit left only messages that give credits and
 * carry no payload may go).
 *
 * The send ring: the application's bytes are copied into a registered ring (SO_SNDBUF bytes) and leave from there
 * as the payload of Data messages (gathered with the BSDH from a per-slot header area), or by RDMA WRITE into a
 * sink the peer advertised. Ring space is released when the work request completes.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

int32_t rs_sdp_credits(const struct rs_sdp_sock *s)
{
    return (int32_t)(s->peer_ack + s->peer_bufs - (s->tx_mseq_next - 1));
}

bool rs_sdp_sq_has_room(const struct rs_sdp_sock *s, uint32_t n)
{
    return s->slots && s->sq_used + n <= s->sq_depth;
}

bool rs_sdp_can_send_data(const struct rs_sdp_sock *s)
{
    /* One send queue slot stays free for control messages as well. */
    return rs_sdp_credits(s) >= 2 && rs_sdp_sq_has_room(s, 2);
}

bool rs_sdp_can_send_ctrl(const struct rs_sdp_sock *s)
{
    int32_t c = rs_sdp_credits(s);
    return (c >= 1 || (c == 0 && !s->overdraft_out)) && rs_sdp_sq_has_room(s, 1);
}

uint32_t rs_sdp_slot_alloc(struct rs_sdp_sock *s, enum sdp_slot_kind kind)
{
    uint32_t idx = s->sq_head;
    s->sq_head = sdp_next(idx, s->sq_depth);
    s->sq_used++;
    s->slots[idx].kind = (uint8_t)kind;
    s->slots[idx].done = false;
    s->slots[idx].quiet = false;
    s->slots[idx].mid = 0;
    s->slots[idx].ring_bytes = 0;
    return idx;
}

static bool data_bearing(uint8_t mid, uint32_t payload)
{
    return (mid == RS_SDP_MID_DATA && payload > 0) || mid == RS_SDP_MID_SRC_AVAIL ||
           mid == RS_SDP_MID_RDMA_WR_COMPL || mid == RS_SDP_MID_DISCONN;
}

/* The credits a message we send now advertises: our posted receive buffers, less the overdraft buffer. */
static uint32_t bufs_to_advertise(const struct rs_sdp_sock *s)
{
    uint32_t bufs = s->rx_posted > 0 ? s->rx_posted - 1 : 0;
    return bufs > 0xffff ? 0xffff : bufs;
}

/* Takes the next send slot for a message of total length len and fills in its header (h). Returns the slot. */
static uint32_t start_msg(struct rs_sdp_sock *s, uint8_t mid, uint32_t len, struct rs_sdp_bsdh *h)
{
    *h = (struct rs_sdp_bsdh){
        .mid = mid, .flags = 0, .bufs = (uint16_t)bufs_to_advertise(s), .len = len, .mseq = s->tx_mseq_next,
        .mseq_ack = s->rx_mseq_last,
    };
    return rs_sdp_slot_alloc(s, SDP_SLOT_MSG);
}

/*
 * A small Data message asks for no completion (as rsockets and perftest do): RC completes the send queue in
 * order, so the next signaled one retires it (rs_sdp_on_send_complete). Every SDP_QUIET_RUN-th message is
 * signaled, and so is one that would leave half the send queue or an eighth of the ring waiting: a writer
 * short of slots or space always has a completion coming. Control messages stay signaled: a DisConn's
 * completion retires everything before it, which the orderly close waits for. So is anything after our
 * DisConn (the acknowledgement of the peer's DisConn when both closed at once): no signaled send may follow
 * it, and the close waits for an empty send queue (rs_sdp_maybe_finish).
 */
static bool may_go_quiet(const struct rs_sdp_sock *s, uint32_t ring_len)
{
    return !s->disconn_sent && s->quiet_run + 1 < SDP_QUIET_RUN && s->sq_used * 2 < s->sq_depth &&
           (uint64_t)(s->quiet_bytes + ring_len) * 8 < s->sbuf_size;
}

/*
 * The time of the last Data sent or received (TCP_INFO's last_data_sent/recv; the keepalive idle time). A clock
 * read costs a busy poller about 100 ns under TCG (two per round trip and side: as much as 200 instructions), so
 * while the progress thread has left the CQ to the application (cq_lazy) the time is not read here: the message
 * is marked and the next timer run stamps it. The progress thread looks at such a socket every SDP_LAZY_TICK_MS
 * to SDP_LAZY_TICK_MAX_MS and runs the timers (rs_sdp_on_timer); a socket with keepalive runs them after every
 * batch of completions (timers_quiet), so its idle time is as exact as before. TCP_INFO settles them too.
 */
void rs_sdp_stamp(struct rs_sdp_sock *s, bool rx)
{
    if (s->cq_lazy) {
        if (rx)
            s->rx_stamp_due = true;
        else
            s->tx_stamp_due = true;
        return;
    }
    uint64_t now = rs_sdp_now_ms();
    if (rx)
        s->last_rx_ms = now;
    else
        s->last_tx_ms = now;
}

void rs_sdp_stamps_settle(struct rs_sdp_sock *s, uint64_t now)
{
    if (s->rx_stamp_due)
        s->last_rx_ms = now;
    if (s->tx_stamp_due)
        s->last_tx_ms = now;
    s->rx_stamp_due = false;
    s->tx_stamp_due = false;
}

/* The bookkeeping of a message the RNIC took: its slot, the quiet run, the overdraft, sequence and credits. */
static RS_ALWAYS_INLINE void account_posted(struct rs_sdp_sock *s, uint32_t slot, const struct rs_sdp_bsdh *h, uint32_t ring_len,
                           bool quiet, int32_t credits_before, bool data_bearing)
{
    s->slots[slot].mid = h->mid;
    s->slots[slot].ring_bytes = ring_len;
    s->slots[slot].quiet = quiet;
    if (quiet) {
        s->quiet_run++;
        s->quiet_bytes += ring_len;
        s->stats.quiet_sends++;
    } else {
        s->quiet_run = 0;
    }
    if (credits_before <= 0) {
        s->overdraft_out = true;
        s->overdraft_mseq = h->mseq;
    }
    s->tx_mseq_next++;
    s->adv_bufs = h->bufs;
    s->adv_ack = h->mseq_ack;
    if (data_bearing) {
        s->last_data_mseq = h->mseq;
        rs_sdp_stamp(s, false);
    }
    s->stats.msgs_sent++;
}

int rs_sdp_post_msg(struct rs_sdp_sock *s, uint8_t mid, const struct rs_sdp_avail *avail, uint32_t compl_len,
                    uint64_t ring_off, uint32_t ring_len)
{
    if (!s->qp || s->cm_gone || !rs_sdp_sq_has_room(s, 1))
        return -ENOTCONN;
    uint32_t hdr_len = rs_sdp_hdr_len(mid);
    int32_t credits = rs_sdp_credits(s);
    struct rs_sdp_bsdh h;
    uint32_t slot = start_msg(s, mid, hdr_len + ring_len, &h);
    uint8_t *hdr = s->hdr_mem + (size_t)slot * SDP_HDR_SLOT;
    bool inlined = hdr_len + ring_len <= s->inline_max;
    uint32_t imm = 0;
    /* Small Data goes compact (the BSDH in the immediate) when the peer takes it: sdp_wire.h. */
    bool compact = inlined && s->peer_imm && rs_sdp_imm_encode(&h, &imm);
    if (!compact) {
        if (mid == RS_SDP_MID_SRC_AVAIL || mid == RS_SDP_MID_SINK_AVAIL)
            rs_sdp_avail_encode(&h, avail, hdr);
        else if (mid == RS_SDP_MID_RDMA_WR_COMPL || mid == RS_SDP_MID_RDMA_RD_COMPL)
            rs_sdp_compl_encode(&h, compl_len, hdr);
        else if (mid == RS_SDP_MID_SUSPEND)
            rs_sdp_suspend_encode(&h, s->hb.service_id, hdr);
        else
            rs_sdp_bsdh_encode(&h, hdr);
    }
    struct rs_rnic_sge sge[3];
    int nsge = 0;
    if (!compact)
        sge[nsge++] = (struct rs_rnic_sge){ (uint64_t)(uintptr_t)hdr, hdr_len, s->hdr_mr->lkey };
    if (ring_len) {
        uint32_t off = (uint32_t)(ring_off % s->sbuf_size);
        uint32_t first = s->sbuf_size - off < ring_len ? s->sbuf_size - off : ring_len;
        sge[nsge++] = (struct rs_rnic_sge){ (uint64_t)(uintptr_t)(s->sbuf_mem + off), first, s->sbuf_mr->lkey };
        if (first < ring_len)
            sge[nsge++] = (struct rs_rnic_sge){ (uint64_t)(uintptr_t)s->sbuf_mem, ring_len - first, s->sbuf_mr->lkey };
    }
    struct rs_rnic_send_wr wr = {
        .wr_id = SDP_WR_SEND | slot, .opcode = compact ? RS_WR_SEND_WITH_IMM : RS_WR_SEND,
        .flags = RS_SEND_SOLICITED, .sg_list = sge, .num_sge = nsge, .imm_data = imm,
    };
    if (inlined)
        wr.flags |= RS_SEND_INLINE;
    bool quiet = inlined && mid == RS_SDP_MID_DATA && may_go_quiet(s, ring_len);
    if (!quiet)
        wr.flags |= RS_SEND_SIGNALED;
    struct rs_rnic_send_wr *bad = NULL;
    int r = rs_rnic_post_send(s->qp, &wr, &bad);
    if (r != 0) {
        s->slots[slot].done = true;
        RS_DEBUG("sdp: post_send of %s failed: %d", rs_sdp_mid_name(mid), r);
        return r;
    }
    account_posted(s, slot, &h, ring_len, quiet, credits, data_bearing(mid, ring_len));
    s->stats.compact_sent += compact;
    RS_TRACE("sdp: sent %s mseq %u ack %u bufs %u len %u (credits were %d)", rs_sdp_mid_name(mid), h.mseq,
             h.mseq_ack, h.bufs, h.len, credits);
    return 0;
}

/* The short path's send (sdp_fast.c): a Data message of the application's bytes, inline, with credit in hand. */
int rs_sdp_post_data_inline(struct rs_sdp_sock *s, const void *buf, uint32_t len)
{
    if (!s->qp || !rs_sdp_sq_has_room(s, 1) || RS_SDP_BSDH_LEN + len > s->inline_max)
        return -EINVAL;
    int32_t credits = rs_sdp_credits(s);
    struct rs_sdp_bsdh h;
    uint32_t slot = start_msg(s, RS_SDP_MID_DATA, RS_SDP_BSDH_LEN + len, &h);
    uint8_t *hdr = s->hdr_mem + (size_t)slot * SDP_HDR_SLOT;
    bool quiet = may_go_quiet(s, 0);
    unsigned flags = RS_SEND_SOLICITED | (quiet ? 0 : RS_SEND_SIGNALED);
    uint32_t imm;
    bool compact = s->peer_imm && rs_sdp_imm_encode(&h, &imm);
    int r;
    if (compact) {
        /* The payload alone, its header in the immediate data: the RNIC's one-buffer SEND, nothing to build. */
        struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, len, s->sbuf_mr->lkey };
        r = rs_rnic_post_send_inline(s->qp, SDP_WR_SEND | slot, &sge, flags, true, imm);
    } else {
        rs_sdp_bsdh_encode(&h, hdr);
        struct rs_rnic_sge sge[2] = {
            { (uint64_t)(uintptr_t)hdr, RS_SDP_BSDH_LEN, s->hdr_mr->lkey },
            { (uint64_t)(uintptr_t)buf, len, s->sbuf_mr->lkey },
        };
        struct rs_rnic_send_wr wr = {
            .wr_id = SDP_WR_SEND | slot, .opcode = RS_WR_SEND, .flags = flags | RS_SEND_INLINE, .sg_list = sge,
            .num_sge = 2,
        };
        struct rs_rnic_send_wr *bad = NULL;
        r = rs_rnic_post_send(s->qp, &wr, &bad);
    }
    if (r != 0) {
        s->slots[slot].done = true;
        return r;
    }
    account_posted(s, slot, &h, 0, quiet, credits, true);
    s->stats.compact_sent += compact;
    return 0;
}

void rs_sdp_on_send_complete(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc)
{
    uint32_t idx = (uint32_t)(wc->wr_id & ~SDP_WR_SEND);
    if (!s->slots || idx >= s->sq_depth)
        return;
    struct sdp_slot *slot = &s->slots[idx];
    bool ok = wc->status == RS_WC_SUCCESS;
    switch (slot->kind) {
    case SDP_SLOT_KA_READ:
        if (ok) {
            uint64_t now = rs_sdp_now_ms();
            uint32_t rtt = (uint32_t)((now - s->ka_probe_ms) * 1000u);
            s->rtt_us = s->rtt_us ? (s->rtt_us * 7 + rtt) / 8 : rtt;
            s->last_rx_ms = now;
        }
        s->ka_read_out = false;
        break;
    case SDP_SLOT_READ:
        rs_sdp_z_on_read_complete(s, wc);
        break;
    case SDP_SLOT_ZWRITE:
        rs_sdp_z_on_write_complete(s, wc);
        break;
    default:
        break;
    }
    slot->done = true;
    /* In order: the unsignaled sends posted before this one (between the tail and it) have completed too. */
    if (sdp_ring_dist(s->sq_tail, idx, s->sq_depth) < s->sq_used)
        for (uint32_t i = s->sq_tail; i != idx; i = sdp_next(i, s->sq_depth))
            s->slots[i].done = true;
    if (!ok && wc->status != RS_WC_WR_FLUSH_ERR && s->state != SDP_ST_CLOSED) {
        RS_DEBUG("sdp: work request failed with status %d", (int)wc->status);
        rs_sdp_fail(s, ECONNRESET, false);
    }
    while (s->sq_used > 0 && s->slots[s->sq_tail].done) {
        struct sdp_slot *t = &s->slots[s->sq_tail];
        if (s->rsrc.slot_open && s->sq_tail == s->rsrc.slot)
            rs_sdp_z_ring_slot_retired(s);
        if (t->kind == SDP_SLOT_MSG || t->kind == SDP_SLOT_WRITE) {
            if (t->ring_bytes) {
                s->tx_done += t->ring_bytes;
                s->dirty = true;
            }
        }
        if (t->quiet)
            s->quiet_bytes -= t->ring_bytes;
        t->kind = SDP_SLOT_FREE;
        t->done = false;
        t->quiet = false;
        s->sq_tail = sdp_next(s->sq_tail, s->sq_depth);
        s->sq_used--;
    }
}

uint64_t rs_sdp_tx_hold_deadline(const struct rs_sdp_sock *s)
{
    if (!s->hold_since_ms || s->tx_tail == s->tx_posted)
        return 0;
    return s->hold_since_ms + ((s->cork || s->more_hold) ? SDP_CORK_MS : SDP_NAGLE_MS);
}

uint64_t rs_sdp_tx_unacked(const struct rs_sdp_sock *s)
{
    /* Unsignaled inline sends left with their work requests (the RNIC holds the bytes) and no completion will say
     * more about them until the next signaled one: counting them would keep SIOCOUTQ above zero on a quiet
     * connection. */
    return s->tx_tail - s->tx_done - s->quiet_bytes;
}

void rs_sdp_tx_push(struct rs_sdp_sock *s, bool force)
{
    if ((s->state != SDP_ST_CONNECTED && s->state != SDP_ST_ACCEPTING) || s->broken || s->cm_gone ||
        !s->peer_rbuf_size)
        return;
    rs_sdp_z_flush_owed(s);
    if (s->hb.phase >= SDP_HB_SUSPENDED)
        return;     /* handed back: what is still in the ring continues over TCP (sdp_handback.c) */
    bool stalled = false;
    for (;;) {
        if (s->psink.active) {
            rs_sdp_z_push_sink(s, force);
            if (s->psink.active)
                break;
            continue;
        }
        if (s->zsrc.active || s->rsrc.active)
            break;      /* nothing follows an outstanding SrcAvail */
        uint64_t pending = s->tx_tail - s->tx_posted;
        if (pending == 0)
            break;
        if (rs_sdp_z_lend_ring(s)) {
            if (s->broken)
                return;
            break;
        }
        uint32_t goal = s->peer_rbuf_size - RS_SDP_BSDH_LEN;
        uint32_t n = pending < goal ? (uint32_t)pending : goal;
        if (n < goal && !force && !s->wr_shut) {
            bool hold = s->cork || s->more_hold || (!s->nodelay && s->nagle_wait);
            if (hold) {
                uint64_t now = rs_sdp_now_ms();
                if (!s->hold_since_ms)
                    s->hold_since_ms = now;
                if (now < rs_sdp_tx_hold_deadline(s))
                    break;
            }
        }
        if (!rs_sdp_can_send_data(s)) {
            stalled = true;
            break;
        }
        if (rs_sdp_post_msg(s, RS_SDP_MID_DATA, NULL, 0, s->tx_posted, n) != 0) {
            rs_sdp_fail(s, ECONNRESET, false);
            return;
        }
        s->tx_posted += n;
        s->hold_since_ms = 0;
        s->stats.data_msgs_sent++;
        if (n < goal) {
            s->nagle_mseq = s->tx_mseq_next - 1;
            s->nagle_wait = true;
        }
    }
    /* Count stalls, not the pushes that found the sender still stalled. */
    if (stalled && !s->tx_stalled)
        s->stats.credit_stalls++;
    s->tx_stalled = stalled;
    if (s->wr_shut && !s->disconn_sent && s->tx_tail == s->tx_posted && !s->zsrc.active && !s->rsrc.active &&
        rs_sdp_can_send_data(s)) {
        if (rs_sdp_post_msg(s, RS_SDP_MID_DISCONN, NULL, 0, 0, 0) != 0) {
            rs_sdp_fail(s, ECONNRESET, false);
            return;
        }
        /* A sink the peer is still waiting on ends with the stream: it takes DisConn as "no more data". */
        s->psink.active = false;
        s->disconn_sent = true;
        s->disconn_mseq = s->tx_mseq_next - 1;
        s->dirty = true;
    }
}

void rs_sdp_credit_update_check(struct rs_sdp_sock *s)
{
    if ((s->state != SDP_ST_CONNECTED && s->state != SDP_ST_ACCEPTING) || s->broken || s->cm_gone ||
        !s->peer_rbuf_size)
        return;
    int32_t view = rs_sdp_peer_credit_view(s);
    /* Emptied buffers wait to be reposted together, unless the peer is getting short of credits. */
    if (s->rx_repost_n > 0 && view < (int32_t)(s->nbufs / 2))
        rs_sdp_rx_repost_flush(s);
    int32_t posted = s->rx_posted > 0 ? (int32_t)s->rx_posted - 1 : 0;
    int32_t reveal = posted - view;
    int32_t low = posted / 2 > 2 ? posted / 2 : 2;
    if (s->ack_owed && rs_sdp_seq_diff(s->adv_ack, s->rx_mseq_last) >= 0)
        s->ack_owed = false;                    /* something we sent since already acknowledged it */
    bool need = false;
    if (reveal >= 2 && view < low) {
        need = true;                            /* an ordinary window update */
    } else if (view < 0 && rs_sdp_credits(s) >= 1) {
        need = true;                            /* the peer used its overdraft: give it back at once */
    } else if (view <= 0 && reveal >= 1 && !s->last_rx_pure) {
        need = true;                            /* the peer may be waiting for one credit to answer us */
    } else if (s->ack_owed) {
        need = true;                            /* the peer lingers until its DisConn is acknowledged */
    }
    if (!need || !rs_sdp_can_send_ctrl(s))
        return;
    s->ack_owed = false;
    if (rs_sdp_post_msg(s, RS_SDP_MID_DATA, NULL, 0, 0, 0) != 0) {
        rs_sdp_fail(s, ECONNRESET, false);
        return;
    }
    s->stats.credit_updates_sent++;
}

/* ---- send() ---- */

static size_t iov_total(const struct iovec *iov, int iovcnt)
{
    size_t t = 0;
    for (int i = 0; i < iovcnt; i++)
        t += iov[i].iov_len;
    return t;
}

/* Copies len bytes from the iovec position (*vi, *vo) into the ring at ring_pos. */
static void copy_in(struct rs_sdp_sock *s, const struct iovec *iov, int iovcnt, int *vi, size_t *vo,
                    uint64_t ring_pos, size_t len)
{
    while (len > 0 && *vi < iovcnt) {
        size_t avail = iov[*vi].iov_len - *vo;
        if (avail == 0) {
            (*vi)++;
            *vo = 0;
            continue;
        }
        size_t n = avail < len ? avail : len;
        uint32_t off = (uint32_t)(ring_pos % s->sbuf_size);
        size_t first = s->sbuf_size - off < n ? s->sbuf_size - off : n;
        const uint8_t *src = (const uint8_t *)iov[*vi].iov_base + *vo;
        memcpy(s->sbuf_mem + off, src, first);
        if (first < n)
            memcpy(s->sbuf_mem, src + first, n - first);
        ring_pos += n;
        len -= n;
        *vo += n;
    }
}

static void raise_sigpipe(void)
{
    /* The kernel sends SIGPIPE to the thread that wrote. */
    syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), SIGPIPE);
}

ssize_t rs_sdp_sendmsg(struct rs_sdp_sock *s, const struct iovec *iov, int iovcnt, int flags)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    if (iovcnt < 0 || (iovcnt > 0 && !iov))
        return -EINVAL;
    if (flags & MSG_OOB)
        return -EOPNOTSUPP;
    size_t total = iov_total(iov, iovcnt);
    rs_lock(&s->lock);
    bool dontwait = s->nonblock || (flags & MSG_DONTWAIT);
    uint64_t deadline = !dontwait && s->sndtimeo_ms > 0 ? rs_sdp_now_ms() + (uint64_t)s->sndtimeo_ms : 0;
    size_t sent = 0;
    int vi = 0;
    size_t vo = 0;
    ssize_t result = 0;
    bool epipe = false;
    bool zfallback = (flags & MSG_ZEROCOPY) != 0;   /* see docs/sdp.md: MSG_ZEROCOPY completes as "copied" */
    /* A blocking write large enough for zero copy that goes by copy is timed: the adaptivity compares. */
    size_t copy_measured = 0;
    uint64_t copy_started_us = 0;
    /* A send that has the credits, send slots and ring space it needs learns nothing from the CQ first: the
     * completions wait for the next receive or the next send that runs short (per message, a busy
     * ping-pong's send skips a poll and the timers). */
    bool look = !(s->state == SDP_ST_CONNECTED && !s->broken && !s->so_error && !s->tx_busy &&
                  s->hb.phase == SDP_HB_NONE && rs_sdp_can_send_data(s) &&
                  total <= s->sbuf_size - (uint32_t)(s->tx_tail - s->tx_done));
    for (;;) {
        if (look)
            rs_sdp_progress_poll(s);
        look = true;
        if (s->app_closed) {
            result = -EBADF;
            break;
        }
        int gate = rs_sdp_hb_gate(s, dontwait || sent > 0);
        if (gate != 0) {
            if (sent > 0)
                break;      /* what was taken is in the ring: it continues over TCP */
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
        if (s->so_error && sent == 0) {
            result = -s->so_error;
            s->so_error = 0;
            if (result == -ECONNRESET || result == -EPIPE)
                epipe = result == -EPIPE;
            break;
        }
        if (s->state == SDP_ST_CLOSED || s->wr_shut || s->broken) {
            result = -EPIPE;
            epipe = true;
            break;
        }
        if (s->state == SDP_ST_CONNECTING || s->state == SDP_ST_ACCEPTING || s->tx_busy) {
            r = rs_sdp_wait_io(s, dontwait, deadline);
            if (r != 0) {
                result = r;
                break;
            }
            continue;
        }
        if (sent == total)
            break;
        s->more_hold = (flags & MSG_MORE) != 0;
        /* Zero copy: a blocking send of a large contiguous piece lends the buffer to the peer (SrcAvail) or
         * writes it straight into the peer's waiting buffer (SinkAvail). */
        while (vi < iovcnt && vo == iov[vi].iov_len) {
            vi++;
            vo = 0;
        }
        uint32_t zt = zfallback ? 0 : rs_sdp_zthresh(s);
        if (!dontwait && (zt || s->psink.active) && vi < iovcnt && iov[vi].iov_len - vo >= (zt ? zt : 1) &&
            !(s->psink.active && s->tx_tail != s->tx_posted)) {
            s->tx_busy = true;
            bool interrupted = false;
            ssize_t z = rs_sdp_z_send(s, (const uint8_t *)iov[vi].iov_base + vo, iov[vi].iov_len - vo, deadline,
                                      &interrupted);
            s->tx_busy = false;
            s->dirty = true;
            if (z > 0) {
                sent += (size_t)z;
                vo += (size_t)z;
                s->stats.bytes_sent += (uint64_t)z;
            }
            if (z < 0 && sent == 0) {
                result = z;
                if (z == -EPIPE)
                    epipe = true;
                break;
            }
            if (interrupted || z < 0)
                break;
            if (z == 0 || (size_t)z < iov[vi].iov_len - (vo - (size_t)z)) {
                zfallback = true;   /* the rest of this call goes by copy */
                if (z == 0 && !copy_started_us) {
                    copy_started_us = rs_sdp_now_us();
                    copy_measured = sent;
                }
            }
            continue;
        }
        uint32_t space = s->sbuf_size - (uint32_t)(s->tx_tail - s->tx_done);
        if (space == 0) {
            rs_sdp_tx_push(s, false);
            r = rs_sdp_wait_io(s, dontwait, deadline);
            if (r != 0) {
                if (sent == 0)
                    result = r;
                break;
            }
            continue;
        }
        size_t n = total - sent < space ? total - sent : space;
        uint64_t pos = s->tx_tail;
        if (n > SDP_COPY_LOCKED_MAX) {
            /* A large copy lets the progress thread in meanwhile; tx_busy keeps other senders out. A small one
             * costs less than the unlock and lock around it (two atomic operations, far dearer under an emulated
             * CPU than copying a few kilobytes). */
            s->tx_busy = true;
            rs_unlock(&s->lock);
            copy_in(s, iov, iovcnt, &vi, &vo, pos, n);
            rs_lock(&s->lock);
            s->tx_busy = false;
        } else {
            copy_in(s, iov, iovcnt, &vi, &vo, pos, n);
        }
        s->tx_tail += n;
        sent += n;
        s->stats.bytes_sent += n;
        s->dirty = true;       /* other senders may be waiting for tx_busy */
        rs_sdp_tx_push(s, false);
        if (sent == total)
            break;
    }
    if (sent > 0)
        result = (ssize_t)sent;
    if ((flags & MSG_ZEROCOPY) && s->zerocopy_opt && result > 0) {
        uint32_t id = s->zc_next_id++;
        if (s->zc_pending) {
            s->zc_hi = id;          /* ids are consecutive: one range covers them all */
        } else {
            s->zc_pending = true;
            s->zc_lo = s->zc_hi = id;
        }
        s->dirty = true;
    }
    if (copy_started_us && sent > copy_measured && result > 0)
        rs_sdp_z_record(s, sent - copy_measured, false, sent - copy_measured, rs_sdp_now_us() - copy_started_us);
    rs_sdp_call_done(s);
    rs_unlock(&s->lock);
    if (epipe && !(flags & MSG_NOSIGNAL))
        raise_sigpipe();
    return result;
}

ssize_t rs_sdp_send(struct rs_sdp_sock *s, const void *buf, size_t len, int flags)
{
    struct iovec iov = { (void *)(uintptr_t)buf, len };
    return rs_sdp_sendmsg(s, &iov, 1, flags);
}

int rs_sdp_outq(struct rs_sdp_sock *s)
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
    uint64_t q = rs_sdp_tx_unacked(s);
    rs_unlock(&s->lock);
    return q > INT32_MAX ? INT32_MAX : (int)q;
}
