/*
 * sdp_opt.c: socket options, TCP_INFO, nonblocking mode, and the MSG_ZEROCOPY completion queue.
 *
 * Values are validated as Linux validates them (EINVAL for short option lengths, negative timeouts...) and read
 * back as Linux reports them (SO_RCVBUF/SO_SNDBUF doubled, timeouts as struct timeval).
 */
#include <errno.h>
#include <time.h>           /* before linux/errqueue.h, which uses struct timespec */
#include <linux/errqueue.h>
#include <linux/tcp.h>      /* the kernel's full struct tcp_info (glibc's copy is older) */
#include <netinet/in.h>
#include <string.h>
#include <sys/time.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif

static int get_int(const void *val, socklen_t len, int *out)
{
    if (!val || len < (socklen_t)sizeof(int))
        return -EINVAL;
    memcpy(out, val, sizeof(int));
    return 0;
}

static int put_int(void *val, socklen_t *len, int v)
{
    if (!val || !len || *len < (socklen_t)sizeof(int))
        return -EINVAL;
    memcpy(val, &v, sizeof(int));
    *len = sizeof(int);
    return 0;
}

static int get_timeout(const void *val, socklen_t len, int64_t *ms)
{
    struct timeval tv;
    if (!val || len < (socklen_t)sizeof(tv))
        return -EINVAL;
    memcpy(&tv, val, sizeof(tv));
    if (tv.tv_usec < 0 || tv.tv_usec >= 1000000)
        return -EDOM;
    if (tv.tv_sec < 0) {
        *ms = 0;    /* Linux: a negative timeout means "do not time out" */
        return 0;
    }
    *ms = (int64_t)tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000;
    return 0;
}

static int put_timeout(void *val, socklen_t *len, int64_t ms)
{
    struct timeval tv = { .tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)((ms % 1000) * 1000) };
    if (!val || !len || *len < (socklen_t)sizeof(tv))
        return -EINVAL;
    memcpy(val, &tv, sizeof(tv));
    *len = sizeof(tv);
    return 0;
}

/* Ring sizes are fixed once the queue pair exists. */
static bool rings_fixed(const struct rs_sdp_sock *s)
{
    return s->rbuf_mem != NULL;
}

int rs_sdp_setsockopt(struct rs_sdp_sock *s, int level, int name, const void *val, socklen_t len)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    int v = 0;
    rs_lock(&s->lock);
    if (rs_sdp_hb_settle(s) != 0) {
        rs_unlock(&s->lock);
        return -EREMCHG;     /* the kernel socket takes options now */
    }
    r = 0;
    if (level == SOL_SOCKET) {
        switch (name) {
        case SO_RCVBUF:
        case SO_SNDBUF:
            if ((r = get_int(val, len, &v)) != 0)
                break;
            if (v < 0)
                v = 0;
            {
                /* Linux doubles the value (bookkeeping overhead) and reports the doubled value. */
                uint64_t d = (uint64_t)v * 2;
                uint32_t b = d < SDP_MIN_BUFSPACE ? SDP_MIN_BUFSPACE : d > SDP_MAX_BUFSPACE ? SDP_MAX_BUFSPACE
                                                                                          : (uint32_t)d;
                if (rings_fixed(s))
                    break;      /* accepted and ignored after connect, as for a kernel socket past its window */
                if (name == SO_RCVBUF)
                    s->rcvbuf = b;
                else
                    s->sndbuf = b;
            }
            break;
        case SO_RCVLOWAT:
            if ((r = get_int(val, len, &v)) != 0)
                break;
            s->rcvlowat = v < 1 ? 1 : v;
            s->dirty = true;
            break;
        case SO_RCVTIMEO:
            r = get_timeout(val, len, &s->rcvtimeo_ms);
            break;
        case SO_SNDTIMEO:
            r = get_timeout(val, len, &s->sndtimeo_ms);
            break;
        case SO_LINGER: {
            struct linger l;
            if (!val || len < (socklen_t)sizeof(l)) {
                r = -EINVAL;
                break;
            }
            memcpy(&l, val, sizeof(l));
            s->linger_on = l.l_onoff != 0;
            s->linger_s = l.l_linger < 0 ? 0 : l.l_linger;
            break;
        }
        case SO_KEEPALIVE:
            if ((r = get_int(val, len, &v)) == 0)
                s->keepalive = v != 0;
            break;
        case SO_REUSEADDR:
        case SO_REUSEPORT:
            if ((r = get_int(val, len, &v)) == 0)
                s->reuseaddr = v != 0;
            break;
        case SO_ZEROCOPY:
            if ((r = get_int(val, len, &v)) == 0)
                s->zerocopy_opt = v != 0;
            break;
        default:
            r = -ENOPROTOOPT;
        }
    } else if (level == IPPROTO_TCP) {
        switch (name) {
        case TCP_NODELAY:
            if ((r = get_int(val, len, &v)) != 0)
                break;
            s->nodelay = v != 0;
            if (s->nodelay)
                rs_sdp_tx_push(s, false);
            break;
        case TCP_CORK:
            if ((r = get_int(val, len, &v)) != 0)
                break;
            s->cork = v != 0;
            if (!s->cork) {
                /* Uncorking sends what waited at once, Nagle or not. */
                s->hold_since_ms = 0;
                rs_sdp_tx_push(s, true);
            }
            break;
        case TCP_KEEPIDLE:
        case TCP_KEEPINTVL:
        case TCP_KEEPCNT:
            if ((r = get_int(val, len, &v)) != 0)
                break;
            if (v < 1 || (name == TCP_KEEPCNT ? v > 127 : v > 32767)) {
                r = -EINVAL;
                break;
            }
            if (name == TCP_KEEPIDLE)
                s->ka_idle = v;
            else if (name == TCP_KEEPINTVL)
                s->ka_intvl = v;
            else
                s->ka_cnt = v;
            break;
        case TCP_QUICKACK:
        case TCP_USER_TIMEOUT:
        case TCP_DEFER_ACCEPT:
            r = get_int(val, len, &v);      /* accepted: nothing in SDP corresponds */
            break;
        default:
            r = -ENOPROTOOPT;
        }
    } else if (level == RS_SOL_SDP) {
        switch (name) {
        case RS_SDP_ZCOPY_THRESHOLD:
            if ((r = get_int(val, len, &v)) != 0)
                break;
            if (v < -1 || (v > 0 && (uint32_t)v < SDP_ZCOPY_MIN_THRESHOLD)) {
                r = -EINVAL;
                break;
            }
            s->zcopy_opt = v;
            s->zthresh = v > 0 ? (uint32_t)v : v < 0 ? RS_SDP_ZCOPY_DEFAULT_THRESHOLD : 0;
            s->stats.zcopy_threshold_now = s->zthresh;
            break;
        case RS_SDP_ZCOPY_ADAPTIVE:
            if ((r = get_int(val, len, &v)) == 0)
                s->zcopy_adaptive = v != 0;
            break;
        case RS_SDP_LEND_RING:
            if ((r = get_int(val, len, &v)) == 0)
                s->lend_ring_opt = v < 0 ? -1 : v != 0;
            break;
        default:
            r = -ENOPROTOOPT;
        }
    } else {
        r = -ENOPROTOOPT;
    }
    if (r == 0)
        rs_sdp_progress(s);
    if (s->dirty) {
        s->dirty = false;
        rs_sdp_signal(s);
    }
    rs_unlock(&s->lock);
    return r;
}

/* TCP states as the kernel numbers them in tcpi_state (include/net/tcp_states.h). */
enum {
    ST_ESTABLISHED = 1, ST_SYN_SENT, ST_SYN_RECV, ST_FIN_WAIT1, ST_FIN_WAIT2, ST_TIME_WAIT, ST_CLOSE,
    ST_CLOSE_WAIT, ST_LAST_ACK, ST_LISTEN, ST_CLOSING,
};

static uint8_t tcp_state(const struct rs_sdp_sock *s)
{
    switch (s->state) {
    case SDP_ST_IDLE:
        return ST_CLOSE;
    case SDP_ST_LISTEN:
        return ST_LISTEN;
    case SDP_ST_CONNECTING:
        return ST_SYN_SENT;
    case SDP_ST_ACCEPTING:
        return ST_SYN_RECV;
    case SDP_ST_CONNECTED:
        if (s->disconn_sent && s->disconn_rcvd)
            return ST_LAST_ACK;
        if (s->disconn_sent)
            return rs_sdp_seq_diff(s->peer_ack, s->disconn_mseq) >= 0 ? ST_FIN_WAIT2 : ST_FIN_WAIT1;
        if (s->disconn_rcvd)
            return ST_CLOSE_WAIT;
        return ST_ESTABLISHED;
    case SDP_ST_CLOSED:
        return ST_CLOSE;
    }
    return ST_CLOSE;
}

static void fill_tcp_info(struct rs_sdp_sock *s, struct tcp_info *ti)
{
    memset(ti, 0, sizeof(*ti));
    uint64_t now = rs_sdp_now_ms();
    rs_sdp_stamps_settle(s, now);
    int32_t credits = rs_sdp_credits(s);
    ti->tcpi_state = tcp_state(s);
    ti->tcpi_ca_state = 0;
    ti->tcpi_probes = (uint8_t)(s->ka_read_out ? s->ka_missed + 1 : 0);
    ti->tcpi_rto = 0;
    ti->tcpi_snd_mss = s->peer_rbuf_size > RS_SDP_BSDH_LEN ? s->peer_rbuf_size - RS_SDP_BSDH_LEN : 0;
    ti->tcpi_rcv_mss = s->rbuf_size > RS_SDP_BSDH_LEN ? s->rbuf_size - RS_SDP_BSDH_LEN : 0;
    /* Messages sent and not yet acknowledged by mseq_ack. */
    ti->tcpi_unacked = (uint32_t)(s->tx_mseq_next - 1 - s->peer_ack);
    ti->tcpi_last_data_sent = s->last_tx_ms ? (uint32_t)(now - s->last_tx_ms) : 0;
    ti->tcpi_last_data_recv = s->last_rx_ms ? (uint32_t)(now - s->last_rx_ms) : 0;
    ti->tcpi_last_ack_recv = ti->tcpi_last_data_recv;
    ti->tcpi_rtt = s->rtt_us;
    ti->tcpi_rttvar = s->rtt_us / 2;
    /* The send window is the peer's credits: messages of up to snd_mss bytes. */
    ti->tcpi_snd_cwnd = credits > 0 ? (uint32_t)credits : 0;
    ti->tcpi_snd_ssthresh = 0x7fffffff;
    ti->tcpi_rcv_space = s->rbuf_size * s->nbufs;
    ti->tcpi_advmss = ti->tcpi_rcv_mss;
    ti->tcpi_reordering = 0;
    ti->tcpi_total_retrans = 0;
    ti->tcpi_pmtu = ti->tcpi_snd_mss;
    ti->tcpi_rcv_ssthresh = ti->tcpi_rcv_space;
    ti->tcpi_bytes_acked = s->stats.bytes_sent - rs_sdp_tx_unacked(s);
    ti->tcpi_bytes_received = s->stats.bytes_received;
    ti->tcpi_segs_out = (uint32_t)s->stats.msgs_sent;
    ti->tcpi_segs_in = (uint32_t)s->stats.msgs_received;
    ti->tcpi_data_segs_out = (uint32_t)s->stats.data_msgs_sent;
    ti->tcpi_data_segs_in = (uint32_t)s->stats.data_msgs_received;
    ti->tcpi_notsent_bytes = (uint32_t)(s->tx_tail - s->tx_posted);
    ti->tcpi_snd_wnd = (uint32_t)(credits > 0 ? credits : 0) * ti->tcpi_snd_mss;
    ti->tcpi_bytes_sent = s->stats.bytes_sent;
}

int rs_sdp_getsockopt(struct rs_sdp_sock *s, int level, int name, void *val, socklen_t *len)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    if (!val || !len)
        return -EFAULT;
    rs_lock(&s->lock);
    rs_sdp_progress(s);
    r = -ENOPROTOOPT;
    if (level == SOL_SOCKET) {
        switch (name) {
        case SO_RCVBUF:
            r = put_int(val, len, (int)(s->rbuf_mem ? s->rbuf_size * s->nbufs : s->rcvbuf));
            break;
        case SO_SNDBUF:
            r = put_int(val, len, (int)(s->sbuf_mem ? s->sbuf_size : s->sndbuf));
            break;
        case SO_RCVLOWAT:
            r = put_int(val, len, s->rcvlowat);
            break;
        case SO_SNDLOWAT:
            r = put_int(val, len, 1);
            break;
        case SO_RCVTIMEO:
            r = put_timeout(val, len, s->rcvtimeo_ms);
            break;
        case SO_SNDTIMEO:
            r = put_timeout(val, len, s->sndtimeo_ms);
            break;
        case SO_LINGER: {
            struct linger l = { .l_onoff = s->linger_on, .l_linger = s->linger_s };
            if (*len < (socklen_t)sizeof(l)) {
                r = -EINVAL;
                break;
            }
            memcpy(val, &l, sizeof(l));
            *len = sizeof(l);
            r = 0;
            break;
        }
        case SO_KEEPALIVE:
            r = put_int(val, len, s->keepalive);
            break;
        case SO_REUSEADDR:
        case SO_REUSEPORT:
            r = put_int(val, len, s->reuseaddr);
            break;
        case SO_ZEROCOPY:
            r = put_int(val, len, s->zerocopy_opt);
            break;
        case SO_ERROR:
            r = put_int(val, len, s->so_error);
            if (r == 0) {
                s->so_error = 0;
                s->dirty = true;
            }
            break;
        case SO_TYPE:
            r = put_int(val, len, SOCK_STREAM);
            break;
        case SO_PROTOCOL:
            r = put_int(val, len, IPPROTO_TCP);
            break;
        case SO_DOMAIN:
            r = put_int(val, len, s->family);
            break;
        case SO_ACCEPTCONN:
            r = put_int(val, len, s->state == SDP_ST_LISTEN);
            break;
        default:
            break;
        }
    } else if (level == IPPROTO_TCP) {
        switch (name) {
        case TCP_NODELAY:
            r = put_int(val, len, s->nodelay);
            break;
        case TCP_CORK:
            r = put_int(val, len, s->cork);
            break;
        case TCP_KEEPIDLE:
            r = put_int(val, len, s->ka_idle);
            break;
        case TCP_KEEPINTVL:
            r = put_int(val, len, s->ka_intvl);
            break;
        case TCP_KEEPCNT:
            r = put_int(val, len, s->ka_cnt);
            break;
        case TCP_MAXSEG:
            r = put_int(val, len, (int)(s->peer_rbuf_size > RS_SDP_BSDH_LEN ? s->peer_rbuf_size - RS_SDP_BSDH_LEN
                                                                              : 536));
            break;
        case TCP_INFO: {
            struct tcp_info ti;
            fill_tcp_info(s, &ti);
            socklen_t n = *len < (socklen_t)sizeof(ti) ? *len : (socklen_t)sizeof(ti);
            memcpy(val, &ti, n);
            *len = n;
            r = 0;
            break;
        }
        default:
            break;
        }
    } else if (level == RS_SOL_SDP) {
        switch (name) {
        case RS_SDP_ZCOPY_THRESHOLD:
            r = put_int(val, len, s->zcopy_opt);
            break;
        case RS_SDP_ZCOPY_ADAPTIVE:
            r = put_int(val, len, s->zcopy_adaptive);
            break;
        case RS_SDP_LEND_RING:
            r = put_int(val, len, s->lend_ring_opt);
            break;
        case RS_SDP_STATS: {
            struct rs_sdp_stats st = s->stats;
            int32_t c = rs_sdp_credits(s);
            st.credits_now = c > 0 ? (uint32_t)c : 0;
            st.zcopy_threshold_now = rs_sdp_zthresh(s);
            st.cq_left_to_app = s->cq_lazy;
            socklen_t n = *len < (socklen_t)sizeof(st) ? *len : (socklen_t)sizeof(st);
            memcpy(val, &st, n);
            *len = n;
            r = 0;
            break;
        }
        default:
            break;
        }
    }
    if (s->dirty) {
        s->dirty = false;
        rs_sdp_signal(s);
    }
    rs_unlock(&s->lock);
    return r;
}

int rs_sdp_set_nonblock(struct rs_sdp_sock *s, bool nonblock)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    s->nonblock = nonblock;
    rs_unlock(&s->lock);
    return 0;
}

bool rs_sdp_get_nonblock(struct rs_sdp_sock *s)
{
    rs_lock(&s->lock);
    bool v = s->nonblock;
    rs_unlock(&s->lock);
    return v;
}

int rs_sdp_recv_errqueue(struct rs_sdp_sock *s, struct sock_extended_err *ee)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    if (!s->zc_pending) {
        rs_unlock(&s->lock);
        return -EAGAIN;
    }
    memset(ee, 0, sizeof(*ee));
    ee->ee_errno = 0;
    ee->ee_origin = SO_EE_ORIGIN_ZEROCOPY;
    ee->ee_code = SO_EE_CODE_ZEROCOPY_COPIED;
    ee->ee_info = s->zc_lo;
    ee->ee_data = s->zc_hi;
    s->zc_pending = false;
    rs_sdp_signal(s);
    rs_unlock(&s->lock);
    return 0;
}
