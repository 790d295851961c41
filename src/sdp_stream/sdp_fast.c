/*
 * sdp_fast.c: the short path for send and receive on a connected socket in steady state.
 *
 * A busy-polling application (a nonblocking ping-pong, an event loop that reads until EAGAIN) calls recv far more
 * often than messages arrive, and each call that takes the general path runs the whole state machine: hand-back
 * gate, shutdown and error checks, zero-copy offers, PEEK and WAITALL handling, the full progress step. Under an
 * emulated CPU (the rxe VM, TCG) the number of distinct code blocks a call runs slows the kernel work that follows
 * it as well (docs/results/sdp-verbs.md, "The header is not what makes SDP slower"), so rsockets' short
 * rrecv/rsend beat our long ones by 1.5x there at equal packets.
 *
 * So the calls try this path first, in the shape of rsockets': a receive with data queued copies it and leaves the
 * emptied buffer for the next miss to repost; one with nothing queued looks at the CQ once (rs_sdp_progress_fast),
 * reposts what the hits emptied and returns; a small send with
 * credit and nothing queued before it goes out inline straight from the application's buffer. Anything else (a
 * state that is not steady, flags, large transfers, a blocking call that would wait) returns false and the
 * general path does the call, with the same results: this path only leaves out what the steady state rules out.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "sdp_stream/sdp_int.h"

/* A short receive's copy, without memcpy for a small one: a call through the PLT is an indirect jump and a return,
 * each looked up at run time under TCG. In general-purpose registers, 32 bytes a round: under TCG an SSE load or
 * store costs as much as fifteen plain moves (docs/results/sdp-verbs.md). The empty asm keeps the compiler from
 * turning the loops back into memcpy or SSE. */
static RS_ALWAYS_INLINE void copy_small(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n > 256) {
        memcpy(dst, src, n);
        return;
    }
    for (; n >= 32; n -= 32, dst += 32, src += 32) {
        uint64_t a, b, c, d;
        __builtin_memcpy(&a, src, 8);
        __builtin_memcpy(&b, src + 8, 8);
        __builtin_memcpy(&c, src + 16, 8);
        __builtin_memcpy(&d, src + 24, 8);
        __asm__("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d));
        __builtin_memcpy(dst, &a, 8);
        __builtin_memcpy(dst + 8, &b, 8);
        __builtin_memcpy(dst + 16, &c, 8);
        __builtin_memcpy(dst + 24, &d, 8);
    }
    for (; n >= 8; n -= 8, dst += 8, src += 8) {
        uint64_t a;
        __builtin_memcpy(&a, src, 8);
        __asm__("" : "+r"(a));
        __builtin_memcpy(dst, &a, 8);
    }
    for (; n > 0; n--) {
        *dst++ = *src++;
        __asm__("" : "+r"(dst));
    }
}

/* Copies queued Data bytes into buf (lock held; the head is Data). Returns the bytes copied. */
static size_t copy_queued(struct rs_sdp_sock *s, uint8_t *buf, size_t len)
{
    size_t done = 0;
    while (done < len && s->rxq_count > 0) {
        struct sdp_rx_entry *e = &s->rxq[s->rxq_head];
        if (e->kind != SDP_RX_DATA)
            break;
        uint32_t n = e->len < len - done ? e->len : (uint32_t)(len - done);
        copy_small(buf + done, s->rbuf_mem + (size_t)e->buf * s->rbuf_size + e->off, n);
        done += n;
        rs_sdp_rx_consume(s, n, true);
    }
    return done;
}

/*
 * The end of a call that moved n bytes, as rs_sdp_call_done ends the general path's: a receive's emptied buffers
 * may owe the peer a credit update (a send just carried our credits); timers and readiness only when the socket
 * has some or somebody listens (each call and return on this path costs a busy poller under TCG). Unlocks.
 */
static RS_ALWAYS_INLINE bool moved(struct rs_sdp_sock *s, size_t n, ssize_t *result, bool received)
{
    if (received && !rs_sdp_credit_view_roomy(s))
        rs_sdp_credit_update_check(s);
    if (!rs_sdp_steady_quiet(s)) {
        s->dirty = true;
        rs_sdp_call_done(s);
    } else {
        s->dirty = false;
    }
    rs_unlock(&s->lock);
    *result = (ssize_t)n;
    return true;
}

/*
 * The end of a short recv whose look at the CQ handed a message over directly: its bytes go first, then whatever
 * the same look queued behind it. When the look left the socket needing the full step (found < 0), the bytes are
 * still this call's to return; the step runs here, as the general path would have run it, before the lock goes.
 */
static bool take_direct(struct rs_sdp_sock *s, uint8_t *buf, size_t len, int found, ssize_t *result)
{
    uint32_t n = s->rx_direct_len;
    s->rx_direct_len = 0;
    copy_small(buf, s->rbuf_mem + (size_t)s->rx_direct_buf * s->rbuf_size, n);
    s->stats.bytes_received += n;
    rs_sdp_rx_release_buf(s, s->rx_direct_buf, true);
    if (found < 0) {
        rs_sdp_progress_poll(s);
        s->dirty = true;
        rs_sdp_call_done(s);
        rs_unlock(&s->lock);
        *result = (ssize_t)n;
        return true;
    }
    size_t done = n;
    if (s->rxq_count > 0 && done < len)
        done += copy_queued(s, buf + done, len - done);
    return moved(s, done, result, true);
}

bool rs_sdp_recv_fast(struct rs_sdp_sock *s, void *buf, size_t len, int flags, ssize_t *result)
{
    /* Large copies drop the lock in the general path; PEEK, WAITALL, TRUNC, OOB and the error queue are its own. */
    if ((flags & ~(MSG_DONTWAIT | MSG_NOSIGNAL)) || len == 0 || len > RS_SDP_SHORT_RECV_MAX ||
        s->epoch != rs_sdp_epoch)
        return false;
    rs_lock(&s->lock);
    if (!rs_sdp_steady(s) || s->rx_busy || s->rcvlowat > 1)
        goto slow;
    if (s->rxq_count == 0) {
        /* The first compact Data this look finds and that fits is handed over directly (on_compact_data): no
         * queue entry to make and consume for the common message of a ping-pong. */
        s->rx_direct_max = (uint32_t)len;      /* at most RS_SDP_SHORT_RECV_MAX */
        int found = rs_sdp_progress_fast(s);
        s->rx_direct_max = 0;
        if (s->rx_direct_len)
            return take_direct(s, buf, len, found, result);
        if (found < 0)
            goto slow;
        if (s->rxq_count == 0) {
            if (!s->nonblock && !(flags & MSG_DONTWAIT))
                goto slow;      /* a blocking call waits, which is the general path's business */
            rs_sdp_note_poll_miss(s);
            /* The buffers the hits emptied go back now, while the peer's answer is on its way (a deferred
             * repost, see rs_sdp_rx_release_buf). */
            if (s->rx_repost_n > 0)
                rs_sdp_rx_repost_flush(s);
            /* As the general path's miss: readiness is refreshed only if something changed or the notification
             * fd may still say readable. */
            if (s->dirty || s->notify_on) {
                s->dirty = false;
                rs_sdp_signal(s);
            }
            rs_unlock(&s->lock);
            *result = -EAGAIN;
            return true;
        }
    }
    size_t n = copy_queued(s, buf, len);
    if (n == 0)
        goto slow;              /* a SrcAvail at the head */
    return moved(s, n, result, true);
slow:
    rs_unlock(&s->lock);
    return false;
}

bool rs_sdp_send_fast(struct rs_sdp_sock *s, const void *buf, size_t len, int flags, ssize_t *result)
{
    if ((flags & ~(MSG_DONTWAIT | MSG_NOSIGNAL)) || len == 0 || len > RS_SDP_SHORT_SEND_MAX ||
        s->epoch != rs_sdp_epoch)
        return false;
    rs_lock(&s->lock);
    /* Nothing queued before it (it would go first), Nagle not holding it back, credit and a send slot: the
     * general path would post it at once as well, from the ring. */
    if (!rs_sdp_steady(s) || s->tx_busy || s->tx_tail != s->tx_posted || s->cork ||
        (s->nagle_wait && !s->nodelay) || len + RS_SDP_BSDH_LEN > s->inline_max ||
        len > s->peer_rbuf_size - RS_SDP_BSDH_LEN || !rs_sdp_can_send_data(s))
        goto slow;
    if (rs_sdp_post_data_inline(s, buf, (uint32_t)len) != 0)
        goto slow;              /* the general path posts it again and handles the failure */
    /* The stream positions count these bytes too, as if they had passed through the ring and their work request
     * had completed (the RNIC took them inline): the ring keeps the phase the general path would give it. Bulk
     * transfers are sensitive to it (a 16-byte exchange before a 64 KiB stream: 10% of its bandwidth over rxe). */
    s->tx_tail += len;
    s->tx_posted += len;
    s->tx_done += len;
    s->more_hold = false;
    s->hold_since_ms = 0;
    s->stats.data_msgs_sent++;
    s->stats.bytes_sent += len;
    if (len < s->peer_rbuf_size - RS_SDP_BSDH_LEN) {
        s->nagle_mseq = s->tx_mseq_next - 1;
        s->nagle_wait = true;
    }
    return moved(s, len, result, false);
slow:
    rs_unlock(&s->lock);
    return false;
}
