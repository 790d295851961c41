/*
 * sdp_zcopy.c: zero copy. Both SDP mechanisms, the cancels, and the rules that settle a race when both sides
 * advertise at once (docs/sdp.md, "Zero copy").
 *
 * SrcAvail (source side advertises): a blocking send() of at least the threshold registers the caller's buffer and
 * sends SrcAvail {len, rkey, vaddr}. The receiver RDMA-READs straight into its application's buffer when recv()
 * reaches that point of the stream, and answers RdmaRdCompl {bytes} after each read. send() returns when every
 * byte was read, or when the receiver answered SendSm ("send it by copy": the rest goes as Data messages), or
 * after a SrcAvailCancel of ours was answered (timeout, signal, or nobody reading for SDP_SRCAVAIL_IDLE_MS).
 *
 * SinkAvail (sink side advertises): a blocking recv() of at least the threshold into a buffer, with nothing queued,
 * registers that buffer and sends SinkAvail {len, rkey, vaddr}. The sender writes the next bytes of the stream into
 * it with RDMA WRITE and retires it with one RdmaWrCompl {bytes}; recv() returns those bytes. A recv() that must
 * give up (timeout, signal) sends SinkAvailCancel and waits for SinkCancelAck before the buffer goes back to the
 * application, so no write can land in it afterwards.
 *
 * Race rules (after the speculative rendezvous protocol of Rashti & Afsahi 2009, where a receiver's RTR may cross
 * the sender's RTS):
 *   1. While the sender holds an accepted sink, every byte of the stream goes into it (no Data, no SrcAvail) until
 *      the RdmaWrCompl that retires it.
 *   2. A SinkAvail S is dead, on both sides, if the sender had sent a data-bearing message (Data with payload,
 *      SrcAvail, RdmaWrCompl, DisConn) that the receiver had not yet seen when it sent S: the sender sees this as
 *      "my last data-bearing mseq > S.mseq_ack" and drops S; the receiver sees it as "a data-bearing message
 *      arrived with mseq_ack < S.mseq" and treats S as never sent. The crossing data (or SrcAvail) is then
 *      received normally, in order. Both sides decide from the sequence numbers alone, so they always agree.
 *   3. The receiver only advertises a sink when nothing is queued and no SrcAvail is pending, so a sender never
 *      sees a sink that the receiver sent after seeing its SrcAvail.
 *   4. A cancel is always answered (SinkCancelAck for every SinkAvailCancel; SendSm or the last RdmaRdCompl for a
 *      SrcAvailCancel), so the canceller knows exactly which bytes moved. An answer that does not come within
 *      SDP_CANCEL_TIMEOUT_MS resets the connection rather than risk a late RDMA access.
 * No side ever waits for the other to advertise, so there is no deadlock; every byte travels exactly once (by
 * RDMA or by copy, decided per byte range by the rules above).
 */
#include <errno.h>
#include <string.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

/* Below this the receiver would rather take a SrcAvail's bytes by copy (SendSm) than RDMA-read tiny pieces. */
#define SDP_ZCOPY_MIN_READ 4096u

/* One RDMA READ or WRITE carries at most the RNIC's largest RC message; longer transfers take several turns. */
static uint32_t rdma_cap(const struct rs_sdp_sock *s, uint64_t n)
{
    uint32_t max = s->dev->caps->max_rc_msg ? s->dev->caps->max_rc_msg : (1u << 30);
    return n < max ? (uint32_t)n : max;
}

/*
 * Zero copy is off by default on an RNIC that copies every payload byte itself (the soft RNIC): lending a buffer
 * saves the two ring copies there, but each blocking write then waits for a SrcAvail / READ / RdmaRdCompl round
 * trip (a sink, for the reader's next advertisement), and copying measured faster at every size (docs/sdp.md,
 * "Measured"). The per-write measurements of the adaptivity could not tell: each write's own time looked alike
 * while the stream ran 10-40% slower. A threshold set by the application or a rule still turns it on.
 * The exception is a peer on this host whose READs the soft RNIC places by one direct copy: a lent buffer then
 * crosses once instead of four times, and SrcAvail is the default again (the reader's sinks stay off: an RDMA
 * WRITE still goes through the socket, rs_sdp_z_sinks_by_default).
 */
uint32_t rs_sdp_zthresh(const struct rs_sdp_sock *s)
{
    if (!s->peer_zcopy || s->zcopy_opt == 0 || s->broken)
        return 0;
    if (s->zcopy_opt < 0 && s->dev->caps->copies_payload && !(s->qp && rs_rnic_qp_reads_placed_directly(s->qp)))
        return 0;
    uint32_t base = s->zcopy_opt > 0 ? (uint32_t)s->zcopy_opt : RS_SDP_ZCOPY_DEFAULT_THRESHOLD;
    if (!s->zcopy_adaptive || s->zthresh == 0)
        return base;
    return s->zthresh > base ? s->zthresh : base;
}

/* Adaptivity: a transfer that had to fall back (SendSm, cancel, crossed sink, a sink filled with a few bytes)
 * doubles the threshold for this connection, a clean one halves it back towards the configured value. */
static void adapt(struct rs_sdp_sock *s, bool good)
{
    uint32_t base = s->zcopy_opt > 0 ? (uint32_t)s->zcopy_opt : RS_SDP_ZCOPY_DEFAULT_THRESHOLD;
    uint32_t cur = s->zthresh ? s->zthresh : base;
    if (good) {
        cur = cur / 2 < base ? base : cur / 2;
    } else {
        cur = cur > SDP_ZCOPY_MAX_THRESHOLD / 2 ? SDP_ZCOPY_MAX_THRESHOLD : cur * 2;
        if (cur < base)
            cur = base;
    }
    s->zthresh = cur;
    s->stats.zcopy_threshold_now = s->zcopy_adaptive ? cur : base;
}

/*
 * Throughput adaptivity. Whether lending a buffer pays depends on the RNIC and the write size: on hardware it
 * saves both CPU copies; on the software RNIC it saves nothing (the RNIC copies through kernel TCP anyway) while
 * every write waits for a SrcAvail/READ/RdmaRdCompl round trip. So each connection measures both methods per
 * write-size class (powers of two) and uses the faster (zero copy only by a margin: zc_wins), trying the slower
 * again every SDP_ZC_PROBE_EVERY writes in case conditions changed. An unmeasured method is tried first.
 */
static unsigned zclass_of(size_t len)
{
    unsigned c = 0;
    for (size_t v = len >> 13; v && c + 1 < SDP_ZC_CLASSES; v >>= 1)
        c++;
    return c;
}

/*
 * Zero copy has to win by an eighth: within that the two are the same speed as far as the measurements can tell
 * (rxe under TCG, one boot, 64 and 256 KiB writes: copying 38-46 MB/s, zero copy 36-44 MB/s, and the choice
 * followed the noise), and copying is the better of two equals: the write
 * returns as soon as the ring holds the bytes, keeps writes in flight back to back, and pins nothing. Where zero
 * copy pays (hardware, large writes: no CPU copy at either end) it wins by far more.
 */
static bool zc_wins(uint32_t zc_rate, uint32_t bc_rate, bool zc_cheaper)
{
    /* Where lending costs the CPU less than copying (a soft RNIC placing our READs by one copy: one pass over the
     * bytes instead of four), zero copy is the better of two equals, and copying has to win by the eighth. */
    if (zc_cheaper)
        return (uint64_t)bc_rate * 8 < (uint64_t)zc_rate * 9;
    return (uint64_t)zc_rate * 8 >= (uint64_t)bc_rate * 9;
}

static bool choose_zcopy(struct sdp_zclass *tab, size_t len, bool zc_cheaper)
{
    struct sdp_zclass *k = &tab[zclass_of(len)];
    if (k->zc_rate == 0)
        return true;
    if (k->bc_rate == 0)
        return false;
    bool zc_better = zc_wins(k->zc_rate, k->bc_rate, zc_cheaper);
    if (++k->since_probe >= (SDP_ZC_PROBE_EVERY << k->probe_level)) {
        k->since_probe = 0;
        k->probing = true;
        return !zc_better;
    }
    return zc_better;
}

static void record_rate(struct sdp_zclass *tab, size_t len, bool zcopy, uint64_t bytes, uint64_t us, bool zc_cheaper)
{
    struct sdp_zclass *k = &tab[zclass_of(len)];
    uint32_t rate = (uint32_t)(bytes / (us ? us : 1));     /* bytes per microsecond = MB/s */
    if (rate == 0)
        rate = 1;
    uint32_t *slot = zcopy ? &k->zc_rate : &k->bc_rate;
    uint32_t other = zcopy ? k->bc_rate : k->zc_rate;
    if (k->probing) {
        /* A probe of the method that was losing: if it still loses, wait longer before the next one. */
        k->probing = false;
        if (zcopy ? !zc_wins(rate, other, zc_cheaper) : zc_wins(other, rate, zc_cheaper)) {
            if (k->probe_level < SDP_ZC_PROBE_MAX_LEVEL)
                k->probe_level++;
        } else {
            k->probe_level = 0;
        }
    }
    *slot = *slot ? (*slot * 3 + rate) / 4 : rate;
}

/* A lent buffer crosses once where a copied one crosses four times (soft RNIC, local Read placement). */
static bool src_cheaper(const struct rs_sdp_sock *s)
{
    return s->dev->caps->copies_payload && s->qp && rs_rnic_qp_reads_placed_directly(s->qp);
}

bool rs_sdp_z_choose_src(struct rs_sdp_sock *s, size_t len)
{
    return !s->zcopy_adaptive || choose_zcopy(s->zclass, len, src_cheaper(s));
}

void rs_sdp_z_record(struct rs_sdp_sock *s, size_t len, bool zcopy, uint64_t bytes, uint64_t us)
{
    record_rate(s->zclass, len, zcopy, bytes, us, src_cheaper(s));
}

/*
 * A reader's sink pays when the sender's RDMA WRITE into it beats its Data messages copied out of the ring: on
 * hardware for large reads; under rxe, where each sink also registers the buffer (docs/verbs.md), copying won at
 * every size measured (64 KiB to 1 MiB). Timed the same way for both: from the moment the reader found the queue
 * empty to the return with what arrived.
 */
bool rs_sdp_z_sinks_by_default(const struct rs_sdp_sock *s)
{
    return s->zcopy_opt > 0 || !s->dev->caps->copies_payload;
}

bool rs_sdp_z_choose_sink(struct rs_sdp_sock *s, size_t len)
{
    return !s->zcopy_adaptive || choose_zcopy(s->zsink_class, len, false);
}

void rs_sdp_z_record_sink(struct rs_sdp_sock *s, size_t len, bool zcopy, uint64_t bytes, uint64_t us)
{
    record_rate(s->zsink_class, len, zcopy, bytes, us, false);
}

static bool post_ctrl(struct rs_sdp_sock *s, uint8_t mid, uint32_t compl_len)
{
    if (!rs_sdp_can_send_ctrl(s))
        return false;
    if (rs_sdp_post_msg(s, mid, NULL, compl_len, 0, 0) != 0) {
        rs_sdp_fail(s, ECONNRESET, false);
        return false;
    }
    return true;
}

void rs_sdp_z_flush_owed(struct rs_sdp_sock *s)
{
    if (s->broken || s->cm_gone)
        return;
    if (s->owed_rd_compl && post_ctrl(s, RS_SDP_MID_RDMA_RD_COMPL, s->owed_rd_compl))
        s->owed_rd_compl = 0;
    if (s->owed_rd_compl)
        return;         /* answers keep their order */
    if (s->owed_send_sm && post_ctrl(s, RS_SDP_MID_SEND_SM, 0)) {
        s->owed_send_sm = false;
        s->stats.send_sm_sent++;
    }
    while (s->owed_sink_cancel_acks && post_ctrl(s, RS_SDP_MID_SINK_CANCEL_ACK, 0))
        s->owed_sink_cancel_acks--;
}

/* Receiver side: remove the SrcAvail entry (always the last in the queue: nothing follows a pending SrcAvail). */
static void drop_src_entry(struct rs_sdp_sock *s)
{
    if (s->rxq_count == 0)
        return;
    uint32_t last = (s->rxq_head + s->rxq_count - 1) % s->rxq_cap;
    if (s->rxq[last].kind != SDP_RX_SRC)
        return;
    s->rx_bytes_queued -= s->rxq[last].len;
    s->rxq_count--;
    s->psrc.active = false;
}

static void send_sm(struct rs_sdp_sock *s)
{
    if (s->psrc.send_sm_sent)
        return;
    s->psrc.send_sm_sent = true;
    s->owed_send_sm = true;
    rs_sdp_z_flush_owed(s);
}

/* ---- sender: lending the send ring ----
 *
 * A send() copies into the ring and returns, as in buffered copy; bytes waiting there from the threshold on are
 * then offered by SrcAvail over the ring itself, and the receiver RDMA-reads them into its application's buffer.
 * The stream stays pipelined (the application fills the ring while the peer reads the previous region), the
 * receiver's copy out of its own ring disappears, and the transfer is driven by the reader's RNIC work request.
 * On rxe that moves the kernel's packet work from the writer's CPU to the reader's (docs/sdp.md "Lending the
 * send ring"). Nothing follows an outstanding SrcAvail, so a SendSm (the reader would rather copy: MSG_PEEK, a
 * small read, our cancel) rewinds the stream to the first unread byte, which then goes as Data from the ring. */

static bool lend_ring_wanted(const struct rs_sdp_sock *s)
{
    if (s->lend_ring_opt == 0)
        return false;
    /* Where the RNIC copies every payload byte itself (soft), a READ saves nothing over a SEND. */
    return s->lend_ring_opt > 0 || !s->dev->caps->copies_payload;
}

bool rs_sdp_z_lend_ring(struct rs_sdp_sock *s)
{
    uint32_t zt = rs_sdp_zthresh(s);
    if (!zt || s->rsrc.active || s->rsrc.slot_open || s->zsrc.active || s->psink.active ||
        s->state != SDP_ST_CONNECTED || s->hb.phase != SDP_HB_NONE || !lend_ring_wanted(s))
        return false;
    uint64_t pending = s->tx_tail - s->tx_posted;
    if (pending < zt)
        return false;
    if (s->rsrc.skip) {
        s->rsrc.skip--;
        return false;
    }
    /* One contiguous piece: at the ring's end the rest goes by copy and the next region starts at its start. */
    uint32_t off = (uint32_t)(s->tx_posted % s->sbuf_size);
    uint32_t n = rdma_cap(s, pending < s->sbuf_size - off ? pending : s->sbuf_size - off);
    /* At most half the ring: the application fills the other half while the reader reads this one. */
    if (n > s->sbuf_size / 2)
        n = s->sbuf_size / 2;
    if (n < zt || !rs_sdp_can_send_data(s))
        return false;
    struct rs_sdp_avail a = { .len = n, .rkey = s->sbuf_mr->rkey, .vaddr = (uint64_t)(uintptr_t)(s->sbuf_mem + off) };
    uint32_t slot = s->sq_head;
    if (rs_sdp_post_msg(s, RS_SDP_MID_SRC_AVAIL, &a, 0, 0, 0) != 0) {
        rs_sdp_fail(s, ECONNRESET, false);
        return true;
    }
    s->rsrc.active = true;
    s->rsrc.cancel_sent = false;
    s->rsrc.slot_open = true;
    s->rsrc.slot = slot;
    s->rsrc.len = n;
    s->rsrc.acked = 0;
    s->rsrc.hold = 0;
    s->rsrc.ring_pos = s->tx_posted;
    s->rsrc.idle_from_ms = rs_sdp_now_ms();
    s->tx_posted += n;
    s->stats.src_avail_sent++;
    s->stats.ring_lends++;
    return true;
}

/* Ring bytes the peer has read are free again, in ring order: after every earlier message's (so after the
 * SrcAvail's own work request retired). */
static void ring_release(struct rs_sdp_sock *s, uint32_t n)
{
    if (s->rsrc.slot_open) {
        s->rsrc.hold += n;
        return;
    }
    s->tx_done += n;
    s->dirty = true;
}

void rs_sdp_z_ring_slot_retired(struct rs_sdp_sock *s)
{
    s->rsrc.slot_open = false;
    if (s->rsrc.hold) {
        s->tx_done += s->rsrc.hold;
        s->rsrc.hold = 0;
        s->dirty = true;
    }
}

static void ring_read(struct rs_sdp_sock *s, uint32_t n)
{
    if (n > s->rsrc.len - s->rsrc.acked) {
        RS_WARN("sdp: RdmaRdCompl of %u bytes for %u lent", n, s->rsrc.len - s->rsrc.acked);
        rs_sdp_fail(s, EPROTO, true);
        return;
    }
    s->rsrc.acked += n;
    s->rsrc.idle_from_ms = rs_sdp_now_ms();
    s->stats.ring_lent_bytes += n;
    s->stats.zcopy_src_bytes += n;
    ring_release(s, n);
    if (s->rsrc.acked == s->rsrc.len) {
        s->rsrc.active = false;
        s->rsrc.backoff = 0;
        s->dirty = true;
    }
}

/* SendSm: what was not read goes as Data from the ring (nothing was sent after the SrcAvail). A reader that keeps
 * declining gets copies for 2, 4, ... up to 1024 regions before the next offer. */
static void ring_by_copy(struct rs_sdp_sock *s)
{
    s->tx_posted = s->rsrc.ring_pos + s->rsrc.acked;
    s->rsrc.active = false;
    s->rsrc.backoff = s->rsrc.backoff ? (s->rsrc.backoff < 1024 ? s->rsrc.backoff * 2 : 1024) : 2;
    s->rsrc.skip = s->rsrc.backoff;
    s->dirty = true;
}

void rs_sdp_z_on_msg(struct rs_sdp_sock *s, const struct rs_sdp_bsdh *h, const struct rs_sdp_avail *avail,
                     uint32_t compl_len)
{
    bool data = (h->mid == RS_SDP_MID_DATA && h->len > RS_SDP_BSDH_LEN) || h->mid == RS_SDP_MID_SRC_AVAIL ||
                h->mid == RS_SDP_MID_DISCONN || h->mid == RS_SDP_MID_RDMA_WR_COMPL;
    /* Rule 2, receiver side: data the sender sent before it saw our sink kills the sink. */
    if (data && h->mid != RS_SDP_MID_RDMA_WR_COMPL && s->sink.active && !s->sink.retired && !s->sink.dead &&
        rs_sdp_seq_diff(h->mseq_ack, s->sink.mseq) < 0) {
        s->sink.dead = true;
        s->stats.sinks_crossed++;
    }
    if (h->mid == RS_SDP_MID_DISCONN && s->sink.active && !s->sink.retired)
        s->sink.dead = true;        /* no more data will come */
    switch (h->mid) {
    case RS_SDP_MID_SRC_AVAIL:
        if (s->psrc.active) {
            RS_WARN("sdp: a second SrcAvail while one is pending");
            rs_sdp_fail(s, EPROTO, true);
            return;
        }
        s->psrc.active = true;
        s->psrc.cancel_pending = false;
        s->psrc.send_sm_sent = false;
        s->psrc.read_out = false;
        s->psrc.read_uncounted = false;
        s->psrc.read_failed = false;
        s->psrc.mseq = h->mseq;
        s->psrc.len = avail->len;
        s->psrc.consumed = 0;
        s->psrc.rkey = avail->rkey;
        s->psrc.vaddr = avail->vaddr;
        return;
    case RS_SDP_MID_SRC_CANCEL:
        if (!s->psrc.active || s->psrc.send_sm_sent)
            return;     /* already answered (crossing SendSm, or every byte read) */
        /* A READ that completed but whose bytes its reader has not yet counted moved them all the same: the
         * answer must be its RdmaRdCompl (then SendSm for the rest), never a SendSm that disowns them. */
        if (s->psrc.read_out || s->psrc.read_uncounted) {
            s->psrc.cancel_pending = true;
            return;
        }
        drop_src_entry(s);
        send_sm(s);
        return;
    case RS_SDP_MID_RDMA_RD_COMPL:
        if (s->rsrc.active) {
            ring_read(s, compl_len);
            return;
        }
        if (!s->zsrc.active || s->zsrc.resolved || compl_len > s->zsrc.len - s->zsrc.acked) {
            RS_WARN("sdp: unexpected RdmaRdCompl of %u bytes", compl_len);
            rs_sdp_fail(s, EPROTO, true);
            return;
        }
        s->zsrc.acked += compl_len;
        if (s->zsrc.acked == s->zsrc.len)
            s->zsrc.resolved = true;
        return;
    case RS_SDP_MID_SEND_SM:
        s->stats.send_sm_received++;
        if (s->rsrc.active) {
            ring_by_copy(s);
            return;
        }
        if (s->zsrc.active && !s->zsrc.resolved) {
            s->zsrc.resolved = true;
            s->zsrc.send_sm = true;
        }
        return;
    case RS_SDP_MID_SINK_AVAIL:
        /* Rule 2, sender side. */
        if (rs_sdp_seq_diff(s->last_data_mseq, h->mseq_ack) > 0 || s->disconn_sent) {
            s->stats.sinks_crossed++;
            return;
        }
        if (s->psink.active || (s->zsrc.active && !s->zsrc.resolved) || s->rsrc.active) {
            RS_WARN("sdp: SinkAvail while the stream has another advertisement outstanding");
            rs_sdp_fail(s, EPROTO, true);
            return;
        }
        s->psink.active = true;
        s->psink.mseq = h->mseq;
        s->psink.len = avail->len;
        s->psink.rkey = avail->rkey;
        s->psink.vaddr = avail->vaddr;
        return;
    case RS_SDP_MID_SINK_CANCEL:
        /* Whatever state the sink is in (accepted, dropped as crossed, retired), the answer is the same. */
        s->psink.active = false;
        s->owed_sink_cancel_acks++;
        rs_sdp_z_flush_owed(s);
        return;
    case RS_SDP_MID_SINK_CANCEL_ACK:
        if (s->sink.active && s->sink.cancel_sent && !s->sink.cancel_acked)
            s->sink.cancel_acked = true;
        else if (s->late_cancel_acks > 0)
            s->late_cancel_acks--;
        return;
    case RS_SDP_MID_RDMA_WR_COMPL:
        if (!s->sink.active || s->sink.dead || s->sink.retired || compl_len > s->sink.len) {
            RS_WARN("sdp: unexpected RdmaWrCompl of %u bytes", compl_len);
            rs_sdp_fail(s, EPROTO, true);
            return;
        }
        s->sink.written = compl_len;
        s->sink.retired = true;
        return;
    default:
        return;
    }
}

void rs_sdp_z_on_read_complete(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc)
{
    s->psrc.read_out = false;
    if (wc->status != RS_WC_SUCCESS)
        s->psrc.read_failed = true;
    s->dirty = true;
}

void rs_sdp_z_on_write_complete(struct rs_sdp_sock *s, const struct rs_rnic_wc *wc)
{
    s->zwrite_out = false;
    if (wc->status != RS_WC_SUCCESS)
        s->zwrite_failed = true;
    s->dirty = true;
}

void rs_sdp_z_fail(struct rs_sdp_sock *s)
{
    s->zsrc.resolved = true;
    s->rsrc.active = false;
    s->sink.dead = true;
    s->psink.active = false;
    s->owed_rd_compl = 0;
    s->owed_send_sm = false;
    s->owed_sink_cancel_acks = 0;
    s->dirty = true;
}

/* When an unanswered cancel resets the connection (0: none). */
static uint64_t cancel_deadline(const struct rs_sdp_sock *s)
{
    uint64_t d = 0;
    if (s->zsrc.active && s->zsrc.cancel_sent && !s->zsrc.resolved)
        d = s->zsrc_cancel_deadline;
    if (s->rsrc.active && s->rsrc.cancel_sent && (d == 0 || s->rsrc.cancel_deadline < d))
        d = s->rsrc.cancel_deadline;
    if (s->sink.active && s->sink.cancel_sent && !s->sink.cancel_acked && s->sink.cancel_deadline &&
        (d == 0 || s->sink.cancel_deadline < d))
        d = s->sink.cancel_deadline;
    return d;
}

/* When a lent ring region nobody reads is taken back (0: none): after SDP_SRCAVAIL_IDLE_MS without a read, at
 * once during a hand-back. */
static uint64_t ring_idle_deadline(const struct rs_sdp_sock *s)
{
    if (!s->rsrc.active || s->rsrc.cancel_sent)
        return 0;
    return s->hb.phase != SDP_HB_NONE ? 1 : s->rsrc.idle_from_ms + SDP_SRCAVAIL_IDLE_MS;
}

uint64_t rs_sdp_z_deadline(const struct rs_sdp_sock *s)
{
    uint64_t d = cancel_deadline(s), idle = ring_idle_deadline(s);
    return idle && (d == 0 || idle < d) ? idle : d;
}

void rs_sdp_z_timer(struct rs_sdp_sock *s, uint64_t now)
{
    uint64_t idle = ring_idle_deadline(s);
    if (idle && now >= idle && post_ctrl(s, RS_SDP_MID_SRC_CANCEL, 0)) {
        /* As for a lent application buffer: the peer finishes a READ in flight, acknowledges it, and answers
         * SendSm for the rest, which goes by copy into its ring (ring_by_copy). */
        s->rsrc.cancel_sent = true;
        s->rsrc.cancel_deadline = now + SDP_CANCEL_TIMEOUT_MS;
        s->stats.src_cancels++;
    }
    uint64_t d = cancel_deadline(s);
    if (d && now >= d) {
        RS_WARN("sdp: the peer did not answer a zero-copy cancel within %u ms: resetting", SDP_CANCEL_TIMEOUT_MS);
        rs_sdp_fail(s, ETIMEDOUT, true);
    }
}

/* ---- sender: into the peer's sink ---- */

bool rs_sdp_z_push_sink(struct rs_sdp_sock *s, bool force)
{
    uint64_t pending = s->tx_tail - s->tx_posted;
    if (pending == 0 || !s->psink.active)
        return false;
    if ((s->cork || s->more_hold) && !force && pending < s->psink.len) {
        uint64_t now = rs_sdp_now_ms();
        if (!s->hold_since_ms)
            s->hold_since_ms = now;
        if (now < rs_sdp_tx_hold_deadline(s))
            return false;
    }
    if (!rs_sdp_can_send_data(s) || !rs_sdp_sq_has_room(s, 3))
        return false;
    uint32_t n = rdma_cap(s, pending < s->psink.len ? pending : s->psink.len);
    uint32_t off = (uint32_t)(s->tx_posted % s->sbuf_size);
    uint32_t first = s->sbuf_size - off < n ? s->sbuf_size - off : n;
    struct rs_rnic_sge sge[2] = {
        { (uint64_t)(uintptr_t)(s->sbuf_mem + off), first, s->sbuf_mr->lkey },
        { (uint64_t)(uintptr_t)s->sbuf_mem, n - first, s->sbuf_mr->lkey },
    };
    uint32_t slot = rs_sdp_slot_alloc(s, SDP_SLOT_WRITE);
    struct rs_rnic_send_wr wr = {
        .wr_id = SDP_WR_SEND | slot, .opcode = RS_WR_RDMA_WRITE, .flags = RS_SEND_SIGNALED, .sg_list = sge,
        .num_sge = first < n ? 2 : 1,
    };
    wr.rdma.remote_addr = s->psink.vaddr;
    wr.rdma.rkey = s->psink.rkey;
    struct rs_rnic_send_wr *bad = NULL;
    if (rs_rnic_post_send(s->qp, &wr, &bad) != 0) {
        s->slots[slot].done = true;
        rs_sdp_fail(s, ECONNRESET, false);
        return false;
    }
    s->slots[slot].ring_bytes = n;
    /* RC ordering: the peer sees the RdmaWrCompl only after the written bytes are placed. */
    if (rs_sdp_post_msg(s, RS_SDP_MID_RDMA_WR_COMPL, NULL, n, 0, 0) != 0) {
        rs_sdp_fail(s, ECONNRESET, false);
        return false;
    }
    s->tx_posted += n;
    s->hold_since_ms = 0;
    s->psink.active = false;
    s->stats.zcopy_sink_bytes += n;
    return true;
}

/* ---- sender: blocking zero-copy send ---- */

static int wait_step(struct rs_sdp_sock *s, uint64_t deadline, bool interruptible)
{
    rs_sdp_signal(s);
    return interruptible ? rs_sdp_wait(s, deadline) : rs_sdp_wait_uninterruptible(s, deadline);
}

/* Writes [buf, len) straight into the accepted peer sink; returns bytes written or a negative errno. */
static ssize_t write_to_sink(struct rs_sdp_sock *s, const uint8_t *buf, size_t len)
{
    /* The WRITE and its RdmaWrCompl need two send slots and a data credit; the sink may be cancelled while we
     * wait for them, and then the bytes go by copy. */
    while (s->psink.active && !rs_sdp_can_send_data(s) && !s->broken) {
        rs_sdp_progress(s);
        if (!s->psink.active || rs_sdp_can_send_data(s) || s->broken)
            break;
        wait_step(s, 0, false);
    }
    if (s->broken)
        return rs_sdp_take_error(s, -EPIPE);
    if (!s->psink.active)
        return 0;
    uint32_t n = rdma_cap(s, len < s->psink.len ? len : s->psink.len);
    struct sdp_reg *reg;
    bool hit;
    if (rs_sdp_reg_get(s->dev->cache, (void *)(uintptr_t)buf, n, RS_ACCESS_REMOTE_READ, &reg, &hit) != 0)
        return 0;       /* cannot register: the caller copies into the ring, which the push writes instead */
    hit ? s->stats.regcache_hits++ : s->stats.regcache_misses++;
    uint32_t slot = rs_sdp_slot_alloc(s, SDP_SLOT_ZWRITE);
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, n, rs_sdp_reg_mr(reg)->lkey };
    struct rs_rnic_send_wr wr = {
        .wr_id = SDP_WR_SEND | slot, .opcode = RS_WR_RDMA_WRITE, .flags = RS_SEND_SIGNALED, .sg_list = &sge,
        .num_sge = 1,
    };
    wr.rdma.remote_addr = s->psink.vaddr;
    wr.rdma.rkey = s->psink.rkey;
    struct rs_rnic_send_wr *bad = NULL;
    s->zwrite_out = true;
    s->zwrite_failed = false;
    if (rs_rnic_post_send(s->qp, &wr, &bad) != 0) {
        s->slots[slot].done = true;
        s->zwrite_out = false;
        rs_sdp_reg_put(s->dev->cache, reg);
        rs_sdp_fail(s, ECONNRESET, false);
        return rs_sdp_take_error(s, -ECONNRESET);
    }
    if (rs_sdp_post_msg(s, RS_SDP_MID_RDMA_WR_COMPL, NULL, n, 0, 0) != 0)
        rs_sdp_fail(s, ECONNRESET, false);
    s->psink.active = false;
    /* The buffer is the caller's: it stays lent until the WRITE completed. */
    while (s->zwrite_out && !s->broken) {
        rs_sdp_progress(s);
        if (!s->zwrite_out || s->broken)
            break;
        wait_step(s, 0, false);
    }
    rs_sdp_reg_put(s->dev->cache, reg);
    if (s->broken || s->zwrite_failed)
        return rs_sdp_take_error(s, -EPIPE);
    s->stats.zcopy_sink_bytes += n;
    adapt(s, true);
    return n;
}

ssize_t rs_sdp_z_send(struct rs_sdp_sock *s, const uint8_t *buf, size_t len, uint64_t deadline, bool *interrupted)
{
    *interrupted = false;
    uint32_t zt = rs_sdp_zthresh(s);
    if (len > UINT32_MAX / 2)
        len = UINT32_MAX / 2;
    /* Decide before touching the stream: a buffer not worth registering, or a size where copying measured
     * faster on this connection, is copied like any other. */
    if (!s->psink.active &&
        (!zt || len < zt || !rs_sdp_z_choose_src(s, len) || !rs_sdp_reg_worth(s->dev->cache, buf, len, zt)))
        return 0;
    /* Stream order: what is already buffered goes first. */
    while (s->tx_posted != s->tx_tail || s->rsrc.active || (!s->psink.active && !rs_sdp_can_send_data(s))) {
        if (s->hb.phase != SDP_HB_NONE)
            return 0;   /* a hand-back waits for this thread: lend nothing */
        rs_sdp_tx_push(s, true);
        rs_sdp_progress(s);
        if (s->broken || s->state != SDP_ST_CONNECTED)
            return -EPIPE;
        if (s->tx_posted == s->tx_tail && !s->rsrc.active && (s->psink.active || rs_sdp_can_send_data(s)))
            break;
        int r = wait_step(s, deadline, true);
        if (r != 0 || s->app_closed) {
            *interrupted = true;
            return r == -ETIMEDOUT ? -EAGAIN : r ? r : -EBADF;
        }
    }
    if (s->psink.active)
        return write_to_sink(s, buf, len);
    if (!zt || len < zt)
        return 0;
    struct sdp_reg *reg;
    bool hit;
    if (rs_sdp_reg_get(s->dev->cache, (void *)(uintptr_t)buf, len, RS_ACCESS_REMOTE_READ, &reg, &hit) != 0)
        return 0;
    hit ? s->stats.regcache_hits++ : s->stats.regcache_misses++;
    memset(&s->zsrc, 0, sizeof(s->zsrc));
    s->zsrc.active = true;
    s->zsrc.len = (uint32_t)len;
    s->zsrc.mseq = s->tx_mseq_next;
    s->zsrc.reg = reg;
    s->zsrc.posted_ms = rs_sdp_now_ms();
    struct rs_sdp_avail a = { .len = (uint32_t)len, .rkey = rs_sdp_reg_mr(reg)->rkey,
                              .vaddr = (uint64_t)(uintptr_t)buf };
    if (rs_sdp_post_msg(s, RS_SDP_MID_SRC_AVAIL, &a, 0, 0, 0) != 0) {
        s->zsrc.active = false;
        s->zsrc.reg = NULL;
        rs_sdp_reg_put(s->dev->cache, reg);
        rs_sdp_fail(s, ECONNRESET, false);
        return -EPIPE;
    }
    s->stats.src_avail_sent++;
    uint64_t started_us = rs_sdp_now_us();
    bool cancelled = false;
    uint32_t last_acked = 0;
    uint64_t idle_from = s->zsrc.posted_ms;
    while (!s->zsrc.resolved && !s->broken) {
        rs_sdp_progress(s);
        if (s->zsrc.resolved || s->broken)
            break;
        uint64_t now = rs_sdp_now_ms();
        if (s->zsrc.acked != last_acked) {
            last_acked = s->zsrc.acked;
            idle_from = now;
        }
        bool want_cancel = false;
        int r = 0;
        if (!s->zsrc.cancel_sent) {
            uint64_t idle_deadline = idle_from + SDP_SRCAVAIL_IDLE_MS;
            uint64_t d = deadline && deadline < idle_deadline ? deadline : idle_deadline;
            if (now >= d || s->app_closed || s->hb.phase != SDP_HB_NONE) {
                /* (A hand-back takes the advertisement back too: the bytes not read go by copy, and so over
                 * TCP.) */
                want_cancel = true;
                if ((deadline && now >= deadline) || s->app_closed)
                    *interrupted = true;
            } else {
                rs_sdp_signal(s);
                r = rs_sdp_wait_reply(s, d, true);
                if (r == -EINTR) {
                    want_cancel = true;
                    *interrupted = true;
                }
            }
        } else {
            wait_step(s, s->zsrc_cancel_deadline, false);
        }
        if (want_cancel && !s->zsrc.cancel_sent) {
            /* The cancel itself may have to wait for a credit (or the overdraft). */
            if (post_ctrl(s, RS_SDP_MID_SRC_CANCEL, 0)) {
                s->zsrc.cancel_sent = true;
                s->zsrc_cancel_deadline = rs_sdp_now_ms() + SDP_CANCEL_TIMEOUT_MS;
                s->stats.src_cancels++;
                cancelled = true;
            } else if (!s->broken) {
                wait_step(s, rs_sdp_now_ms() + 10, false);
            }
        }
    }
    uint32_t acked = s->zsrc.acked;
    bool send_sm_seen = s->zsrc.send_sm;
    s->zsrc.active = false;
    s->zsrc.reg = NULL;
    rs_sdp_reg_put(s->dev->cache, reg);
    s->stats.zcopy_src_bytes += acked;
    adapt(s, !cancelled && !send_sm_seen);
    /* What a fallback cost counts against zero copy: the bytes that moved over the whole wait. */
    rs_sdp_z_record(s, len, true, acked, rs_sdp_now_us() - started_us);
    if (s->broken)
        return acked > 0 ? (ssize_t)acked : rs_sdp_take_error(s, -EPIPE);
    if (*interrupted && acked == 0)
        return s->app_closed ? -EBADF : (deadline && rs_sdp_now_ms() >= deadline ? -EAGAIN : -EINTR);
    return acked;       /* with *interrupted set the caller reports these bytes and stops */
}

/* ---- receiver: reading the peer's SrcAvail ---- */

ssize_t rs_sdp_z_read_src(struct rs_sdp_sock *s, uint8_t *buf, size_t len, bool peek)
{
    struct sdp_rx_entry *e = &s->rxq[s->rxq_head];
    if (!s->psrc.active || e->kind != SDP_RX_SRC)
        return 0;
    uint32_t left = s->psrc.len - s->psrc.consumed;
    if (peek || !buf || len < SDP_ZCOPY_MIN_READ || left == 0 || s->psrc.cancel_pending) {
        /* PEEK must not consume and MSG_TRUNC has nowhere to read into; tiny reads are cheaper by copy. */
        drop_src_entry(s);
        send_sm(s);
        return 0;
    }
    uint32_t n = rdma_cap(s, len < left ? len : left);
    struct sdp_reg *reg;
    bool hit;
    if (rs_sdp_reg_get(s->dev->cache, buf, n, RS_ACCESS_LOCAL_WRITE, &reg, &hit) != 0) {
        drop_src_entry(s);
        send_sm(s);
        return 0;
    }
    hit ? s->stats.regcache_hits++ : s->stats.regcache_misses++;
    while (!rs_sdp_sq_has_room(s, 2) && !s->broken) {
        rs_sdp_progress(s);
        wait_step(s, rs_sdp_now_ms() + 10, false);
    }
    if (s->broken) {
        rs_sdp_reg_put(s->dev->cache, reg);
        return rs_sdp_take_error(s, 0);
    }
    uint32_t slot = rs_sdp_slot_alloc(s, SDP_SLOT_READ);
    struct rs_rnic_sge sge = { (uint64_t)(uintptr_t)buf, n, rs_sdp_reg_mr(reg)->lkey };
    struct rs_rnic_send_wr wr = {
        .wr_id = SDP_WR_SEND | slot, .opcode = RS_WR_RDMA_READ, .flags = RS_SEND_SIGNALED, .sg_list = &sge,
        .num_sge = 1,
    };
    wr.rdma.remote_addr = s->psrc.vaddr + s->psrc.consumed;
    wr.rdma.rkey = s->psrc.rkey;
    struct rs_rnic_send_wr *bad = NULL;
    s->psrc.read_out = true;
    s->psrc.read_uncounted = true;
    s->psrc.read_failed = false;
    if (rs_rnic_post_send(s->qp, &wr, &bad) != 0) {
        s->slots[slot].done = true;
        s->psrc.read_out = false;
        s->psrc.read_uncounted = false;
        rs_sdp_reg_put(s->dev->cache, reg);
        rs_sdp_fail(s, ECONNRESET, false);
        return rs_sdp_take_error(s, -ECONNRESET);
    }
    /* RDMA is writing into the caller's buffer: no return before it is done, signal or not. */
    while (s->psrc.read_out && !s->broken) {
        rs_sdp_progress(s);
        if (!s->psrc.read_out || s->broken)
            break;
        rs_sdp_signal(s);
        rs_sdp_wait_reply(s, 0, false);
    }
    rs_sdp_reg_put(s->dev->cache, reg);
    s->psrc.read_uncounted = false;
    if (s->broken || s->psrc.read_failed) {
        if (!s->broken)
            rs_sdp_fail(s, ECONNRESET, true);
        return rs_sdp_take_error(s, 0);
    }
    s->psrc.consumed += n;
    e = &s->rxq[s->rxq_head];
    e->len -= n;
    s->rx_bytes_queued -= n;
    s->stats.bytes_received += n;
    s->stats.zcopy_read_bytes += n;
    s->owed_rd_compl += n;
    if (s->psrc.consumed == s->psrc.len) {
        s->rxq_head = sdp_next(s->rxq_head, s->rxq_cap);
        s->rxq_count--;
        s->psrc.active = false;
        s->psrc.send_sm_sent = true;    /* nothing left to answer: a crossing cancel is ignored */
    } else if (s->psrc.cancel_pending) {
        drop_src_entry(s);
        s->psrc.send_sm_sent = true;
        s->owed_send_sm = true;
    }
    rs_sdp_z_flush_owed(s);
    return n;
}

/* ---- receiver: advertising a sink ---- */

ssize_t rs_sdp_z_sink_recv(struct rs_sdp_sock *s, uint8_t *buf, size_t len, uint64_t deadline, bool *interrupted)
{
    *interrupted = false;
    if (len > UINT32_MAX / 2)
        len = UINT32_MAX / 2;
    if (!rs_sdp_can_send_data(s) || s->rxq_count > 0 || s->psrc.active || s->rx_eof || s->late_cancel_acks)
        return -EAGAIN;
    if (s->zcopy_adaptive && s->sink_skip > 0) {
        s->sink_skip--;
        return -EAGAIN;
    }
    struct sdp_reg *reg;
    bool hit;
    if (rs_sdp_reg_get(s->dev->cache, buf, len, RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_WRITE, &reg, &hit) != 0)
        return -EAGAIN;
    hit ? s->stats.regcache_hits++ : s->stats.regcache_misses++;
    memset(&s->sink, 0, sizeof(s->sink));
    s->sink.active = true;
    s->sink.len = (uint32_t)len;
    s->sink.mseq = s->tx_mseq_next;
    s->sink.reg = reg;
    struct rs_sdp_avail a = { .len = (uint32_t)len, .rkey = rs_sdp_reg_mr(reg)->rkey,
                              .vaddr = (uint64_t)(uintptr_t)buf, .non_disc = 0 };
    if (rs_sdp_post_msg(s, RS_SDP_MID_SINK_AVAIL, &a, 0, 0, 0) != 0) {
        s->sink.active = false;
        s->sink.reg = NULL;
        rs_sdp_reg_put(s->dev->cache, reg);
        rs_sdp_fail(s, ECONNRESET, false);
        return rs_sdp_take_error(s, -ECONNRESET);
    }
    s->stats.sink_avail_sent++;
    for (;;) {
        rs_sdp_progress(s);
        if (s->broken || s->sink.retired || s->sink.dead)
            break;
        if (s->sink.cancel_sent) {
            if (s->sink.cancel_acked)
                break;
            wait_step(s, s->sink.cancel_deadline, false);
            continue;
        }
        int r = s->hb.phase != SDP_HB_NONE ? 0 : wait_step(s, deadline, true);
        if (s->hb.phase != SDP_HB_NONE && !s->sink.retired && !s->sink.dead) {
            /* A hand-back: the sink is withdrawn like an interrupted one, without interrupting the call. */
            r = -ECANCELED;
        }
        if (r == -EINTR || r == -ETIMEDOUT || r == -ECANCELED || s->app_closed) {
            *interrupted = r != -ECANCELED;
            while (!s->sink.cancel_sent && !s->broken && !s->sink.retired && !s->sink.dead) {
                if (post_ctrl(s, RS_SDP_MID_SINK_CANCEL, 0)) {
                    s->sink.cancel_sent = true;
                    s->sink.cancel_deadline = rs_sdp_now_ms() + SDP_CANCEL_TIMEOUT_MS;
                    s->stats.sink_cancels++;
                } else {
                    rs_sdp_progress(s);
                    wait_step(s, rs_sdp_now_ms() + 10, false);
                }
            }
        }
    }
    /* Rule 4: a cancel we sent is answered even if the sink ended another way; that answer is still to come. */
    if (s->sink.cancel_sent && !s->sink.cancel_acked)
        s->late_cancel_acks++;
    uint32_t written = s->sink.retired ? s->sink.written : 0;
    bool dead = s->sink.dead && !s->sink.retired;
    s->sink.active = false;
    s->sink.reg = NULL;
    rs_sdp_reg_put(s->dev->cache, reg);
    if (s->broken && !s->sink.retired)
        return rs_sdp_take_error(s, 0);
    /* A sink pays off when the sender fills most of it; one that crosses data or comes back mostly empty
     * turned a stream into a round trip per write. Back off exponentially (up to 1024 receives), reset on a
     * good one. */
    bool good = !dead && written >= s->sink.len / 2;
    if (good) {
        s->sink_backoff = 0;
    } else if (dead || written) {
        if (s->sink_backoff < 10)
            s->sink_backoff++;
        s->sink_skip = 1u << s->sink_backoff;
    }
    if (dead)
        adapt(s, false);
    if (written) {
        s->stats.zcopy_written_bytes += written;
        s->stats.bytes_received += written;
        *interrupted = false;
        /* The buffer held the peer's sink traffic only: the ring's credits are unchanged, but the peer may be
         * waiting to hear that we processed its RdmaWrCompl. */
        rs_sdp_credit_update_check(s);
    }
    if (*interrupted && !written)
        return s->app_closed ? -EBADF : (deadline && rs_sdp_now_ms() >= deadline ? -ETIMEDOUT : -EINTR);
    return written;
}
