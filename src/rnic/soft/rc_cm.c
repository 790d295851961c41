/*
 * rc_cm.c: RC connection management of the soft RNIC over nonblocking kernel TCP, driven by the progress thread.
 *
 *   ports    RDMA port P is TCP port P + offset (RS_RC_PORT_OFFSET_ENV): the soft RNIC's own port space, so an
 *            RDMA listener never collides with the application's kernel listener on P.
 *   active   socket + nonblocking connect -> writable: read exactly the listener's greeting, sending nothing (a
 *            kernel program that is not a soft RNIC listener never gets a byte: wrong bytes, EOF, reset or
 *            silence for RS_RC_GREETING_TIMEOUT_MS -> UNREACHABLE, -EHOSTUNREACH) -> send the MPA Request -> read
 *            exactly the Reply (FPDUs may follow it in the same segment and belong to the receive machine) ->
 *            ESTABLISHED, or REJECTED (R set, or TCP refused), UNREACHABLE (no route, bad Reply), TIMEOUT.
 *   passive  listening socket (SO_REUSEPORT; one adopted after a fork is shared by the family and paced: it
 *            takes a connection off the backlog while the application asks for one, or once one has waited
 *            RS_RC_SHARED_GRACE_MS) -> accept4 -> the
 *            greeting -> read exactly the Request (a silent client is dropped after RS_RC_MPA_REQUEST_TIMEOUT_MS)
 *            -> refused at once if it wants markers or an unknown revision (Reply with R, close), else
 *            CONNECT_REQUEST to the application, which accepts (Reply, ESTABLISHED) or rejects (Reply with R and
 *            its private data, close).
 *   close    iWARP has no disconnect message: the side that disconnects finishes what it transmits and sends its
 *            FIN; the other side sees EOF at an FPDU boundary, does the same; both report DISCONNECTED.
 *
 * Application calls never block on the network: they hand their work to the progress thread with
 * rs_soft_progress_call_sync and return as soon as it is queued there.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rnic/soft/rc.h"

struct rs_rc_listener;

/* A TCP connection accepted by a listener whose MPA Request is still arriving (progress thread only). */
struct rs_rc_pending {
    struct rs_rc_pending *next;
    struct rs_rc_listener *listener;
    int fd;
    struct sockaddr_storage peer;
    struct rs_soft_watch *watch;
    struct rs_soft_timer *timer;
    uint8_t buf[RS_MPA_REQREP_MAX];
    size_t have;
};

struct rs_rc_listener {
    struct rs_rnic_listener base;
    struct rs_soft_device *dev;
    struct rs_soft_cm *cm;
    int fd;
    struct rs_soft_watch *watch;
    struct rs_mpa_local local;
    struct rs_rc_pending *pending;
    bool park;                      /* closing for fork dormancy: the socket stays open, parked (soft_fork.c) */
    /* A listening socket adopted after a fork is shared with the rest of the family: it takes connections off the
     * common backlog only as the application asks for them (rs_rc_listener_intake), see intake_open. */
    bool shared;
    unsigned n_pending;             /* connections taken whose MPA Request is still arriving (progress thread) */
    uint32_t handed;                /* CONNECT_REQUESTs given to the application (progress thread) */
    uint64_t intake;                /* atomic: (requests the application has seen << 32) | connections it wants */
    struct rs_soft_timer *grace;    /* shared: started when the backlog has a connection nobody asks for */
    bool overdue;                   /* shared, in grace_cb: one connection is taken regardless */
};

/* A complete, acceptable MPA Request waiting for the application's accept or reject. */
struct rs_rc_request {
    struct rs_rnic_conn_request base;
    struct rs_soft_device *dev;
    int fd;
    struct sockaddr_storage peer;
    uint8_t buf[RS_MPA_REQREP_MAX];
    size_t len;
    struct rs_mpa_frame req;            /* pd points into buf */
    struct rs_mpa_local local;
    struct rs_mpa_result neg;
};

static void set_nodelay(int fd)
{
    int one = 1;
    (void)rs_soft_sys_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static bool addr_ok(const struct sockaddr *a, socklen_t len)
{
    if (!a)
        return false;
    if (a->sa_family == AF_INET)
        return len >= sizeof(struct sockaddr_in);
    if (a->sa_family == AF_INET6)
        return len >= sizeof(struct sockaddr_in6);
    return false;
}

/* ---- port space ---- */

static uint16_t port_offset_value = RS_RC_PORT_OFFSET_DEFAULT;
static pthread_once_t port_offset_once = PTHREAD_ONCE_INIT;

static void port_offset_init(void)
{
    const char *v = getenv(RS_RC_PORT_OFFSET_ENV);
    if (!v)
        return;
    unsigned long n = 0;
    const char *c = v;
    while (*c >= '0' && *c <= '9' && n <= 65535)
        n = n * 10 + (unsigned long)(*c++ - '0');
    if (c == v || *c || n > 65535) {
        RS_WARN("%s=%s ignored: expected a decimal number 0..65535; using %u", RS_RC_PORT_OFFSET_ENV, v,
                RS_RC_PORT_OFFSET_DEFAULT);
        return;
    }
    port_offset_value = (uint16_t)n;
}

/* Process-wide: both ends of a connection must agree, so it is read once and never changes. */
static uint16_t port_offset(void)
{
    pthread_once(&port_offset_once, port_offset_init);
    return port_offset_value;
}

static uint16_t tcp_port_of(uint16_t rdma_port) { return (uint16_t)(rdma_port + port_offset()); }
static uint16_t rdma_port_of(uint16_t tcp_port) { return (uint16_t)(tcp_port - port_offset()); }

/* Port of an AF_INET / AF_INET6 address (addr_ok checked the family and length). */
static uint16_t sa_port(const struct sockaddr_storage *a)
{
    return ntohs(a->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)a)->sin6_port
                                          : ((const struct sockaddr_in *)a)->sin_port);
}

static void sa_set_port(struct sockaddr_storage *a, uint16_t port)
{
    if (a->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)a)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)a)->sin_port = htons(port);
}

/* Loop thread, just before ESTABLISHED. The active side's TCP port is the one its peer sees in `peer`; the passive
 * side's is the listener's TCP port, P + offset, reported as the RDMA port P the peer connected to. */
static void record_local_addr(struct rs_rc_qp *rc)
{
    socklen_t len = sizeof(rc->local_addr);
    memset(&rc->local_addr, 0, sizeof(rc->local_addr));
    if (rs_soft_sys_getsockname(rc->fd, (struct sockaddr *)&rc->local_addr, &len) != 0) {
        memset(&rc->local_addr, 0, sizeof(rc->local_addr));
        return;
    }
    if (!rc->active)
        sa_set_port(&rc->local_addr, rdma_port_of(sa_port(&rc->local_addr)));
}

int rs_rc_local_addr(const struct rs_soft_qp *qp, struct sockaddr_storage *out)
{
    const struct rs_rc_qp *rc = qp->rc;
    if (rc->local_addr.ss_family == 0)
        return -ENOTCONN;
    *out = rc->local_addr;
    return 0;
}

/* Copies an application (RDMA port space) address and moves it to TCP's; -EADDRNOTAVAIL for an RDMA port that has
 * no TCP port (the one mapping to TCP 0), and for RDMA port 0 unless any_ok (listen: the kernel picks one). */
static int to_tcp_addr(const struct sockaddr *a, socklen_t len, bool any_ok, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    memcpy(out, a, len < sizeof(*out) ? len : sizeof(*out));
    uint16_t rdma_port = sa_port(out);
    if (rdma_port == 0 && any_ok)
        return 0;
    if (rdma_port == 0 || tcp_port_of(rdma_port) == 0)
        return -EADDRNOTAVAIL;
    sa_set_port(out, tcp_port_of(rdma_port));
    return 0;
}

/*
 * Whether this end asks for FPDU CRCs on a connection to peer (RDMASOCK_SOFT_MPA_CRC: on, off, or auto, the
 * default). Auto asks unless the peer is a loopback address, where the bytes never leave the host's memory: the
 * kernel's loopback does not checksum TCP either, and the two CRC32c passes were 7% of the CPU of a 1 MiB SDP
 * stream on loopback. The peer may still ask; one side asking is enough, as in siw.
 */
bool rs_rc_addr_is_loopback(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(x))
            return x->s6_addr[12] == 127;
        return IN6_IS_ADDR_LOOPBACK(x);
    }
    return false;
}

static bool want_crc(const struct sockaddr_storage *peer)
{
    const char *v = getenv("RDMASOCK_SOFT_MPA_CRC");
    if (v && (!strcmp(v, "on") || !strcmp(v, "1")))
        return true;
    if (v && (!strcmp(v, "off") || !strcmp(v, "0")))
        return false;
    if (v && *v && strcmp(v, "auto"))
        RS_LOG_ONCE(RS_LOG_WARN, "RDMASOCK_SOFT_MPA_CRC=%s is not auto, on or off: using auto", v);
    return !rs_rc_addr_is_loopback(peer);
}

static struct rs_mpa_local default_local(const struct rs_soft_device *dev)
{
    struct rs_mpa_local l = { .rev = RS_MPA_REV2 };
    const char *rev = getenv("RDMASOCK_SOFT_MPA_REV");
    if (rev && rev[0] == '1' && rev[1] == '\0')
        l.rev = RS_MPA_REV1;
    l.ird = (uint16_t)(dev->base.caps.max_ird < RS_SOFT_MAX_IRD ? dev->base.caps.max_ird : RS_SOFT_MAX_IRD);
    l.ord = (uint16_t)(dev->base.caps.max_ord < RS_SOFT_MAX_ORD ? dev->base.caps.max_ord : RS_SOFT_MAX_ORD);
    return l;
}

/* Best effort: a Reply (or reject) on a fresh connection always fits the socket buffer. */
static void send_frame(int fd, const struct rs_mpa_frame *f)
{
    uint8_t out[RS_MPA_REQREP_MAX];
    int n = rs_mpa_frame_encode(f, out, sizeof(out));
    if (n <= 0)
        return;
    struct iovec iov = { out, (size_t)n };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
    ssize_t r = rs_soft_sys_sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r != n)
        RS_DEBUG("soft rc: MPA reply not sent whole (%zd of %d)", r, n);
}

/* ---- sockets of a QP ---- */

void rs_rc_close_socket(struct rs_rc_qp *rc, bool abortive)
{
    /* rx_lock: an application thread may be reading the socket inline (consumer progress). */
    pthread_mutex_lock(&rc->rx_lock);
    pthread_mutex_lock(&rc->tx_lock);
    struct rs_soft_watch *w = rc->watch;
    int fd = rc->fd;
    rc->watch = NULL;
    rc->watch_events = 0;
    rc->fd = -1;
    rc->tx_stopped = true;
    rs_rc_local_release(rc);
    pthread_mutex_unlock(&rc->tx_lock);
    if (w)
        rs_soft_watch_del(w);
    if (fd >= 0) {
        if (abortive) {
            /* SO_LINGER with a zero timeout: close sends a RST, so the peer learns at once. */
            struct linger lg = { 1, 0 };
            (void)rs_soft_sys_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        }
        rs_soft_sys_close(fd);
    }
    if (rc->timer)
        rs_soft_timer_arm(rc->timer, 0);
    rs_rc_set_conn(rc, RS_RC_CLOSED);
    pthread_mutex_unlock(&rc->rx_lock);
}

/* The connection attempt ended without a connection: one event, then the QP is in ERROR (its work flushed). */
static void connect_failed(struct rs_rc_qp *rc, enum rs_rnic_cm_event_type type, int error, const void *pd,
                           uint32_t pd_len, bool abortive)
{
    RS_DEBUG("soft rc: qp %u connect failed: event %d error %d", rc->qp->qpn, (int)type, error);
    if (!rc->final_event_sent)
        rs_rc_push_event(rc, type, error, pd, pd_len);
    rc->final_event_sent = true;
    rc->quiet_error = true;
    rs_rc_close_socket(rc, abortive);
    rs_soft_qp_enter_error(rc->qp);
}

static enum rs_rnic_cm_event_type event_for_errno(int err)
{
    switch (err) {
    case -ECONNREFUSED:
        return RS_RNIC_CM_EV_REJECTED;      /* nobody listens: TCP refused (rdma_cm on iWARP says REJECTED too) */
    case -ETIMEDOUT:
        return RS_RNIC_CM_EV_TIMEOUT;
    default:
        return RS_RNIC_CM_EV_UNREACHABLE;
    }
}

/* Both FINs crossed (or the close timer fired): DISCONNECTED, then ERROR without another event. */
static void finish_disconnect(struct rs_rc_qp *rc, bool abortive)
{
    if (!rc->final_event_sent)
        rs_rc_push_event(rc, RS_RNIC_CM_EV_DISCONNECTED, 0, NULL, 0);
    rc->final_event_sent = true;
    rc->quiet_error = true;
    rs_rc_close_socket(rc, abortive);
    rs_soft_qp_enter_error(rc->qp);
}

void rs_rc_close_progress(struct rs_rc_qp *rc)
{
    if (rs_rc_conn(rc) != RS_RC_CLOSING)
        return;
    if (!rc->fin_sent && (rc->disconnect_requested || rc->peer_fin)) {
        pthread_mutex_lock(&rc->tx_lock);
        bool quiet = rs_rc_tx_quiescent_locked(rc);
        if (quiet)
            rc->tx_stopped = true;
        pthread_mutex_unlock(&rc->tx_lock);
        if (quiet) {
            rs_soft_sys_shutdown(rc->fd, SHUT_WR);
            __atomic_store_n(&rc->fin_sent, true, __ATOMIC_RELEASE);
            RS_DEBUG("soft rc: qp %u sent its FIN", rc->qp->qpn);
        }
    }
    if (rc->fin_sent && rc->peer_fin)
        finish_disconnect(rc, false);
}

/* ---- active side ---- */

/* Milliseconds left until the connect deadline, at least 1 (an expired deadline fires the timer at once). */
static uint32_t connect_ms_left(const struct rs_rc_qp *rc)
{
    uint64_t now = rs_soft_now_ns();
    if (now >= rc->connect_deadline_ns)
        return 1;
    uint64_t ms = (rc->connect_deadline_ns - now + 999999u) / 1000000u;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

/*
 * Whatever answered on the TCP port is not a soft RNIC listener. Nothing of ours was sent; close so that the
 * program there reads EOF and nothing else: discard what it sent first, because closing a socket with unread
 * bytes resets the connection instead of sending a FIN.
 */
static void greeting_failed(struct rs_rc_qp *rc, const char *why)
{
    RS_INFO("soft rc: qp %u: no soft RNIC listener at the destination (%s); nothing was sent", rc->qp->qpn, why);
    uint8_t discard[4096];
    for (int i = 0; i < 16; i++) {
        struct iovec iov = { discard, sizeof(discard) };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
        if (rs_soft_sys_recvmsg(rc->fd, &m, MSG_DONTWAIT) <= 0)
            break;
    }
    connect_failed(rc, RS_RNIC_CM_EV_UNREACHABLE, -EHOSTUNREACH, NULL, 0, false);
}

/* The greeting is complete and right: only now do bytes of ours go out, starting with the MPA Request. */
static void send_request(struct rs_rc_qp *rc)
{
    uint8_t frame[RS_MPA_REQREP_MAX];
    int n = rs_mpa_frame_encode(&rc->req, frame, sizeof(frame));
    pthread_mutex_lock(&rc->tx_lock);
    if (n > 0)
        n = rs_rc_tx_queue_raw(rc, frame, (size_t)n) == 0 ? n : -ENOSPC;
    rs_rc_set_conn(rc, RS_RC_MPA_WAIT);
    rs_rc_watch_update_locked(rc);
    pthread_mutex_unlock(&rc->tx_lock);
    if (n < 0) {
        connect_failed(rc, RS_RNIC_CM_EV_UNREACHABLE, n, NULL, 0, true);
        return;
    }
    rs_soft_timer_arm(rc->timer, connect_ms_left(rc));
    rs_rc_tx_run(rc, true);
}

/* Reads exactly the greeting: never a byte past it (nothing should follow, and nothing of a stranger's is ours). */
static void read_greeting(struct rs_rc_qp *rc)
{
    static const uint8_t greeting[RS_RC_GREETING_LEN] = RS_RC_GREETING;
    while (rc->greeting_have < RS_RC_GREETING_LEN) {
        struct iovec iov = { rc->greeting_in + rc->greeting_have, RS_RC_GREETING_LEN - rc->greeting_have };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t r = rs_soft_sys_recvmsg(rc->fd, &m, MSG_DONTWAIT);
        if (r == -EAGAIN || r == -EWOULDBLOCK)
            return;
        if (r == 0) {
            greeting_failed(rc, "connection closed before the greeting");
            return;
        }
        if (r < 0) {
            greeting_failed(rc, r == -ECONNRESET ? "connection reset before the greeting" : "socket error");
            return;
        }
        size_t from = rc->greeting_have;
        rc->greeting_have += (size_t)r;
        if (memcmp(rc->greeting_in + from, greeting + from, (size_t)r) != 0) {
            greeting_failed(rc, "it spoke first, and not our greeting");
            return;
        }
    }
    send_request(rc);
}

/* TCP connect finished: on success wait for the greeting, sending nothing. */
static void connect_done(struct rs_rc_qp *rc)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (rs_soft_sys_getsockopt(rc->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = ECONNABORTED;
    if (err == ECONNRESET || err == EPIPE) {
        /* Connected, then reset before we read anything: a program there that is not a soft RNIC listener. */
        greeting_failed(rc, "connection reset before the greeting");
        return;
    }
    if (err) {
        connect_failed(rc, event_for_errno(-err), -err, NULL, 0, true);
        return;
    }
    rc->tcp_up = true;
    rc->greeting_have = 0;
    uint32_t left = connect_ms_left(rc);
    rs_soft_timer_arm(rc->timer, left < RS_RC_GREETING_TIMEOUT_MS ? left : RS_RC_GREETING_TIMEOUT_MS);
    pthread_mutex_lock(&rc->tx_lock);
    rc->watch_events = RS_SOFT_EV_READ;
    rs_soft_watch_set(rc->watch, RS_SOFT_EV_READ);
    pthread_mutex_unlock(&rc->tx_lock);
    read_greeting(rc);      /* usually already there: the listener greets as it accepts */
}

/* Reads exactly one MPA frame into buf (have bytes already). 1 when complete (*total set), 0 to wait, or -errno
 * (-EPROTO: not the frame we wait for; 0 bytes at EOF is -ECONNRESET). */
static int read_frame(int fd, uint8_t *buf, size_t *have, bool reply, size_t *total)
{
    for (;;) {
        int t = rs_mpa_frame_length(buf, *have, reply);
        if (t < 0 && t != -EAGAIN)
            return t == -EMSGSIZE ? -EPROTO : t;
        size_t want = t == -EAGAIN ? RS_MPA_REQREP_HDR_LEN : (size_t)t;
        if (*have >= want) {
            *total = want;
            return 1;
        }
        struct iovec iov = { buf + *have, want - *have };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t r = rs_soft_sys_recvmsg(fd, &m, MSG_DONTWAIT);
        if (r == -EAGAIN || r == -EWOULDBLOCK)
            return 0;
        if (r == 0)
            return -ECONNRESET;
        if (r < 0)
            return (int)r;
        *have += (size_t)r;
    }
}

static void read_reply(struct rs_rc_qp *rc)
{
    size_t total = 0;
    int r = read_frame(rc->fd, rc->mpa_in, &rc->mpa_have, true, &total);
    if (r == 0)
        return;
    if (r < 0) {
        connect_failed(rc, RS_RNIC_CM_EV_UNREACHABLE, r, NULL, 0, true);
        return;
    }
    struct rs_mpa_frame rep;
    r = rs_mpa_frame_parse(rc->mpa_in, total, true, &rep);
    if (r == 0)
        r = rs_mpa_initiator_negotiate(&rc->req, &rep, &rc->local, &rc->neg);
    if (r == -ECONNREFUSED) {
        /* The responder's application said no: its private data explains why. */
        connect_failed(rc, RS_RNIC_CM_EV_REJECTED, -ECONNREFUSED, rep.pd, rep.pd_len, false);
        return;
    }
    if (r != 0) {
        RS_INFO("soft rc: qp %u unacceptable MPA Reply (rev %u, flags%s%s): %d", rc->qp->qpn, rep.rev,
                rep.markers ? " M" : "", rep.crc ? " C" : "", r);
        connect_failed(rc, RS_RNIC_CM_EV_UNREACHABLE, -EPROTO, NULL, 0, true);
        return;
    }
    if (rc->timer)
        rs_soft_timer_arm(rc->timer, 0);
    record_local_addr(rc);
    rs_rc_enter_rts(rc);
    rs_rc_push_event(rc, RS_RNIC_CM_EV_ESTABLISHED, 0, rep.pd, rep.pd_len);
    rs_rc_tx_run(rc, true);
    rs_rc_rx_run(rc);
}

struct connect_args {
    struct rs_rc_qp *rc;
    struct rs_soft_cm *cm;
    const struct sockaddr *dst;         /* as the application named it (RDMA port) */
    const struct sockaddr_storage *tcp_dst;
    socklen_t len;
    const void *pd;
    uint32_t pd_len;
    uint32_t timeout_ms;
    int result;
};

static void connect_loop(void *arg)
{
    struct connect_args *a = arg;
    struct rs_rc_qp *rc = a->rc;
    if (rs_rc_conn(rc) != RS_RC_IDLE || rs_soft_qp_get_state(rc->qp) != RS_QPS_INIT) {
        a->result = -EISCONN;
        return;
    }
    int fd = rs_soft_sys_socket(a->dst->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        a->result = fd;
        return;
    }
    set_nodelay(fd);
    rc->watch = rs_soft_watch_add(rc->dev, fd, RS_SOFT_EV_WRITE, rs_rc_io_cb, rc);
    if (!rc->watch) {
        rs_soft_sys_close(fd);
        a->result = -ENOMEM;
        return;
    }
    rc->watch_events = RS_SOFT_EV_WRITE;
    rc->fd = fd;
    /* Events name the peer in the RDMA port space, as the application asked for it. */
    memset(&rc->peer, 0, sizeof(rc->peer));
    memcpy(&rc->peer, a->dst, a->len < sizeof(rc->peer) ? a->len : sizeof(rc->peer));
    rc->peer_len = a->len;
    rs_rc_apply_qos(rc);
    if (a->pd_len)
        memcpy(rc->req_pd, a->pd, a->pd_len);
    rc->local.crc = want_crc(&rc->peer);
    rs_mpa_request_init(&rc->req, &rc->local, rc->req_pd, (uint16_t)a->pd_len);
    rs_soft_cm_get(a->cm);
    rc->cm = a->cm;
    rc->active = true;
    rc->mpa_have = 0;
    rc->tcp_up = false;
    rs_rc_set_conn(rc, RS_RC_CONNECTING);
    rs_soft_qp_set_state(rc->qp, RS_QPS_CONNECTING);
    a->result = 0;
    uint32_t timeout_ms = a->timeout_ms ? a->timeout_ms : RS_RC_DEFAULT_CONNECT_TIMEOUT_MS;
    rc->connect_deadline_ns = rs_soft_now_ns() + (uint64_t)timeout_ms * 1000000u;
    rs_soft_timer_arm(rc->timer, timeout_ms);
    int r = rs_soft_sys_connect(fd, (const struct sockaddr *)a->tcp_dst, a->len);
    if (r == 0)
        connect_done(rc);
    else if (r != -EINPROGRESS)
        connect_failed(rc, event_for_errno(r), r, NULL, 0, true);   /* reported as an event, like a late failure */
}

int rs_rc_connect(struct rs_soft_qp *qp, struct rs_soft_cm *cm, const struct sockaddr *dst, socklen_t len,
                  const void *private_data, uint32_t private_data_len, uint32_t timeout_ms)
{
    struct rs_rc_qp *rc = rs_rc(qp);
    if (!rc || !cm || !addr_ok(dst, len) || (private_data_len && !private_data))
        return -EINVAL;
    if (private_data_len > qp->dev->base.caps.max_connect_private_data)
        return -EMSGSIZE;
    struct sockaddr_storage tcp_dst;
    int r = to_tcp_addr(dst, len, false, &tcp_dst);
    if (r != 0)
        return r;
    struct connect_args a = { rc, cm, dst, &tcp_dst, len, private_data, private_data_len, timeout_ms, 0 };
    rs_soft_progress_call_sync(qp->dev, connect_loop, &a);
    return a.result;
}

/* ---- the QP socket callback ---- */

void rs_rc_io_cb(struct rs_soft_watch *w, int fd, unsigned revents, void *arg)
{
    (void)w;
    (void)fd;
    struct rs_rc_qp *rc = arg;
    switch (rs_rc_conn(rc)) {
    case RS_RC_CONNECTING:
        if (!rc->tcp_up && (revents & RS_SOFT_EV_WRITE))
            connect_done(rc);
        else if (rc->tcp_up && (revents & RS_SOFT_EV_READ))
            read_greeting(rc);
        break;
    case RS_RC_MPA_WAIT:
        if (revents & RS_SOFT_EV_WRITE)
            rs_rc_tx_run(rc, true);
        if ((revents & RS_SOFT_EV_READ) && rs_rc_conn(rc) == RS_RC_MPA_WAIT)
            read_reply(rc);
        break;
    case RS_RC_RTS:
    case RS_RC_CLOSING:
        if (revents & RS_SOFT_EV_READ)
            rs_rc_rx_event(rc);
        if (revents & RS_SOFT_EV_WRITE)
            rs_rc_tx_run(rc, true);
        rs_rc_close_progress(rc);
        break;
    case RS_RC_DRAINING: {
        bool left = (revents & RS_SOFT_EV_WRITE) ? rs_rc_tx_flush_only(rc) : rc->tx_want_write;
        if (!left && !rc->fin_sent && rc->fd >= 0) {
            rs_soft_sys_shutdown(rc->fd, SHUT_WR);
            __atomic_store_n(&rc->fin_sent, true, __ATOMIC_RELEASE);
        }
        if ((revents & RS_SOFT_EV_READ) && rs_rc_rx_discard(rc))
            rs_rc_watch_update(rc);
        if (rc->rx_eof && rc->fin_sent)
            rs_rc_close_socket(rc, false);
        break;
    }
    default:
        break;
    }
}

void rs_rc_timer_cb(struct rs_soft_timer *t, void *arg)
{
    (void)t;
    struct rs_rc_qp *rc = arg;
    switch (rs_rc_conn(rc)) {
    case RS_RC_CONNECTING:
        if (rc->tcp_up)
            greeting_failed(rc, "no greeting in time");
        else
            connect_failed(rc, RS_RNIC_CM_EV_TIMEOUT, -ETIMEDOUT, NULL, 0, true);
        break;
    case RS_RC_MPA_WAIT:
        connect_failed(rc, RS_RNIC_CM_EV_TIMEOUT, -ETIMEDOUT, NULL, 0, true);
        break;
    case RS_RC_CLOSING:
        RS_DEBUG("soft rc: qp %u peer did not close in time", rc->qp->qpn);
        finish_disconnect(rc, true);
        break;
    case RS_RC_DRAINING:
        rs_rc_close_socket(rc, true);
        break;
    default:
        break;
    }
}

/* ---- disconnect ---- */

struct simple_args {
    struct rs_rc_qp *rc;
    int result;
};

static void disconnect_loop(void *arg)
{
    struct simple_args *a = arg;
    struct rs_rc_qp *rc = a->rc;
    a->result = 0;
    switch (rs_rc_conn(rc)) {
    case RS_RC_IDLE:
        a->result = -ENOTCONN;
        break;
    case RS_RC_CONNECTING:
    case RS_RC_MPA_WAIT:
        finish_disconnect(rc, true);
        break;
    case RS_RC_RTS:
        pthread_mutex_lock(&rc->tx_lock);
        rs_rc_set_conn(rc, RS_RC_CLOSING);
        pthread_mutex_unlock(&rc->tx_lock);
        rs_soft_qp_set_state(rc->qp, RS_QPS_CLOSING);
        rc->disconnect_requested = true;
        rs_soft_timer_arm(rc->timer, RS_RC_CLOSE_TIMEOUT_MS);
        rs_rc_tx_run(rc, true);
        rs_rc_close_progress(rc);
        break;
    case RS_RC_CLOSING:
        if (!rc->disconnect_requested) {
            rc->disconnect_requested = true;
            rs_soft_timer_arm(rc->timer, RS_RC_CLOSE_TIMEOUT_MS);
        }
        rs_rc_close_progress(rc);
        break;
    default:
        break;                          /* already failed or closed: the final event was reported */
    }
}

int rs_rc_disconnect(struct rs_soft_qp *qp)
{
    struct rs_rc_qp *rc = rs_rc(qp);
    struct simple_args a = { rc, 0 };
    rs_soft_progress_call_sync(qp->dev, disconnect_loop, &a);
    return a.result;
}

/* ---- passive side ---- */

/*
 * Pacing a shared listener. The kernel keeps a TCP connection in the listening socket's backlog until some process
 * accepts it, so when one process of a prefork family exits, the connections it never took go to the others. Ours
 * are bound to a process earlier, as soon as its progress thread takes one off the backlog to greet it; a process
 * that takes them while its application is busy, and then exits (Apache retires children all the time), resets
 * them. So a shared listener takes a connection only while its application wants one: it may have `want` of them
 * on the way (greeting or MPA under way, or handed over and not yet seen by the application), the rest stay in the
 * backlog for the process that asks first. A connection nobody asks for is taken after RS_RC_SHARED_GRACE_MS
 * anyway (by every process of the family that watches the socket: the first one's accept4 wins), because a TCP
 * connect completes without any accept: a program may connect to its own listener and accept only afterwards, or
 * all the processes may be busy. Progress thread.
 */
static bool intake_open(const struct rs_rc_listener *l)
{
    if (!l->shared)
        return true;
    uint64_t v = __atomic_load_n(&l->intake, __ATOMIC_ACQUIRE);
    uint32_t want = (uint32_t)v;
    uint32_t unseen = l->handed - (uint32_t)(v >> 32);
    return unseen <= want && (uint64_t)l->n_pending + unseen < want;
}

/* Watches the backlog again if the intake allows another connection (the callback pauses it when it does not). */
static void intake_rewatch(struct rs_rc_listener *l)
{
    if (l->shared && l->watch && intake_open(l)) {
        rs_soft_timer_arm(l->grace, 0);
        rs_soft_watch_set(l->watch, RS_SOFT_EV_READ);
    }
}

static void listener_cb(struct rs_soft_watch *w, int fd, unsigned revents, void *arg);

/* The grace ran out: one connection of the backlog is taken regardless (if another process has not taken it
 * first), then the socket is watched again for the next one. */
static void grace_cb(struct rs_soft_timer *t, void *arg)
{
    (void)t;
    struct rs_rc_listener *l = arg;
    if (!l->watch)
        return;
    l->overdue = true;
    listener_cb(l->watch, l->fd, RS_SOFT_EV_READ, l);
    l->overdue = false;
    rs_soft_watch_set(l->watch, RS_SOFT_EV_READ);
}

static void intake_loop(void *arg)
{
    intake_rewatch(arg);
}

int rs_rc_listener_intake(struct rs_rnic_listener *listener, unsigned want, uint32_t seen)
{
    struct rs_rc_listener *l = (struct rs_rc_listener *)listener;
    if (!l->shared)
        return -EOPNOTSUPP;
    __atomic_store_n(&l->intake, ((uint64_t)seen << 32) | want, __ATOMIC_RELEASE);
    /* The callback checks the intake again before each accept: watching too much costs one wake-up at most. */
    if (want > 0 && rs_soft_progress_call(l->dev, intake_loop, l) != 0)
        rs_soft_watch_set(l->watch, RS_SOFT_EV_READ);
    return 0;
}

static void pending_close(struct rs_rc_pending *p, bool close_fd)
{
    struct rs_rc_listener *l = p->listener;
    for (struct rs_rc_pending **pp = &l->pending; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    rs_soft_watch_del(p->watch);
    rs_soft_timer_free(p->timer);
    if (close_fd && p->fd >= 0)
        rs_soft_sys_close(p->fd);
    free(p);
    if (l->n_pending > 0)
        l->n_pending--;
}

static void reject_and_close(int fd, const struct rs_mpa_frame *req, const struct rs_mpa_local *local)
{
    struct rs_mpa_frame rep;
    rs_mpa_reply_init(&rep, req, local, NULL, true, NULL, 0);
    send_frame(fd, &rep);
    rs_soft_sys_shutdown(fd, SHUT_WR);
    rs_soft_sys_close(fd);
}

/* A whole Request arrived on p: refuse it here, or hand it to the application. */
static void pending_request_take(struct rs_rc_pending *p, size_t total);

static void pending_request(struct rs_rc_pending *p, size_t total)
{
    struct rs_rc_listener *l = p->listener;
    pending_request_take(p, total);
    intake_rewatch(l);      /* handed over or refused: room for the next one, if the application wants it */
}

static void pending_request_take(struct rs_rc_pending *p, size_t total)
{
    struct rs_rc_listener *l = p->listener;
    struct rs_rc_request *rq = calloc(1, sizeof(*rq));
    if (!rq) {
        pending_close(p, true);
        return;
    }
    memcpy(rq->buf, p->buf, total);
    rq->len = total;
    int r = rs_mpa_frame_parse(rq->buf, total, false, &rq->req);
    if (r != 0 && r != -EPROTONOSUPPORT) {
        free(rq);
        pending_close(p, true);
        return;
    }
    int fd = p->fd;
    p->fd = -1;
    struct sockaddr_storage peer = p->peer;
    pending_close(p, false);
    uint8_t ecode = 0;
    rq->local = l->local;
    rq->local.crc = want_crc(&peer);
    if (r == 0)
        r = rs_mpa_responder_negotiate(&rq->req, &rq->local, &rq->neg, &ecode);
    if (r == 0 && rq->req.pd_len > l->dev->base.caps.max_connect_private_data) {
        RS_INFO("soft rc: MPA Request with %u bytes of private data refused (at most %u)", rq->req.pd_len,
                l->dev->base.caps.max_connect_private_data);
        r = -EMSGSIZE;
    }
    if (r != 0) {
        RS_INFO("soft rc: MPA Request refused (rev %u%s): %d", rq->req.rev, rq->req.markers ? ", markers wanted" : "",
                r);
        reject_and_close(fd, &rq->req, &rq->local);
        free(rq);
        return;
    }
    rq->base.rnic = &l->dev->base;
    rq->dev = l->dev;
    rq->fd = fd;
    rq->peer = peer;
    struct rs_rnic_cm_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = RS_RNIC_CM_EV_CONNECT_REQUEST;
    ev.listener = &l->base;
    ev.request = &rq->base;
    ev.peer = peer;
    ev.private_data_len = rq->req.pd_len;
    if (rq->req.pd_len)
        memcpy(ev.private_data, rq->req.pd, rq->req.pd_len);
    if (rs_soft_cm_push(l->cm, &ev) != 0) {
        rs_soft_sys_close(fd);
        free(rq);
        return;
    }
    l->handed++;
}

static void pending_cb(struct rs_soft_watch *w, int fd, unsigned revents, void *arg)
{
    (void)w;
    (void)fd;
    (void)revents;
    struct rs_rc_pending *p = arg;
    size_t total = 0;
    int r = read_frame(p->fd, p->buf, &p->have, false, &total);
    if (r == 0)
        return;
    if (r < 0) {
        RS_DEBUG("soft rc: incoming connection dropped before its MPA Request: %d", r);
        struct rs_rc_listener *l = p->listener;
        pending_close(p, true);
        intake_rewatch(l);
        return;
    }
    pending_request(p, total);
}

static void pending_timer_cb(struct rs_soft_timer *t, void *arg)
{
    (void)t;
    struct rs_rc_pending *p = arg;
    RS_DEBUG("soft rc: incoming connection sent no MPA Request in time");
    struct rs_rc_listener *l = p->listener;
    pending_close(p, true);
    intake_rewatch(l);
}

static void listener_cb(struct rs_soft_watch *w, int fd, unsigned revents, void *arg)
{
    (void)revents;
    struct rs_rc_listener *l = arg;
    static const uint8_t greeting[RS_RC_GREETING_LEN] = RS_RC_GREETING;
    struct iovec greeting_iov = { (void *)greeting, sizeof(greeting) };
    const struct msghdr greeting_msg = { .msg_iov = &greeting_iov, .msg_iovlen = 1 };
    for (int i = 0; i < 16; i++) {
        bool overdue = false;
        if (!intake_open(l)) {
            if (!l->overdue) {
                /* The rest is for the processes that ask, unless it waits too long. */
                rs_soft_watch_set(w, 0);
                rs_soft_timer_arm(l->grace, RS_RC_SHARED_GRACE_MS);
                return;
            }
            overdue = true;
        }
        struct sockaddr_storage peer;
        socklen_t plen = sizeof(peer);
        int nfd = rs_soft_sys_accept4(fd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (overdue)
            l->overdue = false;     /* one at most (another process may have taken it first) */
        if (nfd < 0)
            return;
        set_nodelay(nfd);
        /* Greet at once: the active side sends nothing until it has read exactly this. A fresh socket's buffer
         * always takes 16 bytes, so a short write means the connection is already gone. */
        if (rs_soft_sys_sendmsg(nfd, &greeting_msg, MSG_DONTWAIT | MSG_NOSIGNAL) != RS_RC_GREETING_LEN) {
            rs_soft_sys_close(nfd);
            continue;
        }
        struct rs_rc_pending *p = calloc(1, sizeof(*p));
        if (!p) {
            rs_soft_sys_close(nfd);
            continue;
        }
        p->listener = l;
        p->fd = nfd;
        p->peer = peer;
        p->watch = rs_soft_watch_add(l->dev, nfd, RS_SOFT_EV_READ, pending_cb, p);
        p->timer = rs_soft_timer_new(l->dev, pending_timer_cb, p);
        if (!p->watch || !p->timer) {
            rs_soft_watch_del(p->watch);
            rs_soft_timer_free(p->timer);
            rs_soft_sys_close(nfd);
            free(p);
            continue;
        }
        rs_soft_timer_arm(p->timer, RS_RC_MPA_REQUEST_TIMEOUT_MS);
        p->next = l->pending;
        l->pending = p;
        l->n_pending++;
    }
}

/* A listening TCP socket on tcp_addr; *bound_port is the TCP port it got. 0 or -errno. */
static int listen_socket(const struct sockaddr_storage *tcp_addr, socklen_t len, int backlog, int *out_fd,
                         uint16_t *bound_port)
{
    int fd = rs_soft_sys_socket(tcp_addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    /* REUSEPORT: processes of a prefork server each listen on the same RDMA port and the kernel spreads the
     * connections over them (only sockets of the same user may join, so nobody else can take a share). */
    int one = 1;
    (void)rs_soft_sys_setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    (void)rs_soft_sys_setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    int r = rs_soft_sys_bind(fd, (const struct sockaddr *)tcp_addr, len);
    if (r == 0)
        r = rs_soft_sys_listen(fd, backlog > 0 ? backlog : 128);
    if (r == 0)
        r = rs_soft_sys_getsockname(fd, (struct sockaddr *)&bound, &blen);
    if (r != 0) {
        rs_soft_sys_close(fd);
        return r;
    }
    *out_fd = fd;
    *bound_port = sa_port(&bound);
    return 0;
}

int rs_rc_listen(struct rs_soft_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                 struct rs_rnic_listener **out)
{
    if (!cm || !addr_ok(addr, len))
        return -EINVAL;
    struct sockaddr_storage tcp_addr;
    int r = to_tcp_addr(addr, len, true, &tcp_addr);
    if (r != 0)
        return r;
    struct rs_rc_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    int fd = -1;
    uint16_t port = 0;
    /* A listener of this address that went dormant at a fork (here or in an ancestor) still holds the port and
     * perhaps connections in its backlog: take it over rather than opening a second one beside it. */
    if (sa_port(&tcp_addr) != 0 && (fd = rs_soft_listener_fd_take(&tcp_addr)) >= 0) {
        (void)rs_soft_sys_listen(fd, backlog > 0 ? backlog : 128);
        port = sa_port(&tcp_addr);
        l->shared = true;       /* paced: it takes nothing until the application asks (intake 0) */
    } else {
        r = listen_socket(&tcp_addr, len, backlog, &fd, &port);
    }
    if (r == 0 && rdma_port_of(port) == 0) {
        /* The kernel picked the one TCP port that is RDMA port 0, which nobody can connect to: take another while
         * still holding that one, so the kernel cannot hand it out again. */
        int unusable = fd;
        r = listen_socket(&tcp_addr, len, backlog, &fd, &port);
        rs_soft_sys_close(unusable);
    }
    if (r != 0) {
        free(l);
        return r;
    }
    l->base.rnic = cm->base.rnic;
    l->dev = cm->dev;
    l->cm = cm;
    l->fd = fd;
    rs_soft_fd_listening(fd);
    l->local = default_local(cm->dev);
    rs_soft_cm_get(cm);
    if (l->shared)
        l->grace = rs_soft_timer_new(cm->dev, grace_cb, l);
    l->watch = rs_soft_watch_add(cm->dev, fd, RS_SOFT_EV_READ, listener_cb, l);
    if (!l->watch || (l->shared && !l->grace)) {
        rs_soft_watch_del(l->watch);
        rs_soft_timer_free(l->grace);
        rs_soft_cm_put(cm);
        rs_soft_sys_close(fd);
        free(l);
        return -ENOMEM;
    }
    *out = &l->base;
    return 0;
}

int rs_rc_listener_addr(const struct rs_rnic_listener *listener, struct sockaddr_storage *out)
{
    const struct rs_rc_listener *l = (const struct rs_rc_listener *)listener;
    socklen_t len = sizeof(*out);
    memset(out, 0, sizeof(*out));
    int r = rs_soft_sys_getsockname(l->fd, (struct sockaddr *)out, &len);
    if (r == 0)
        sa_set_port(out, rdma_port_of(sa_port(out)));
    return r;
}

static void listener_close_loop(void *arg)
{
    struct rs_rc_listener *l = arg;
    rs_soft_watch_del(l->watch);
    l->watch = NULL;
    rs_soft_timer_free(l->grace);
    l->grace = NULL;
    while (l->pending)
        pending_close(l->pending, true);
    if (l->park)
        rs_soft_listener_fd_park(l->fd);
    else
        rs_soft_sys_close(l->fd);
    l->fd = -1;
}

static void listener_end(struct rs_rc_listener *l, bool park)
{
    if (!l)
        return;
    l->park = park;
    rs_soft_progress_call_sync(l->dev, listener_close_loop, l);
    rs_soft_cm_put(l->cm);
    free(l);
}

void rs_rc_listener_close(struct rs_rnic_listener *listener)
{
    listener_end((struct rs_rc_listener *)listener, false);
}

/* Connections already taken off the backlog (greeting or MPA under way) are reset as by a close; the ones still in
 * the kernel's backlog wait there for whichever process adopts the socket next. */
void rs_rc_listener_park(struct rs_rnic_listener *listener)
{
    listener_end((struct rs_rc_listener *)listener, true);
}

/* ---- accept / reject ---- */

struct accept_args {
    struct rs_rc_request *rq;
    struct rs_rc_qp *rc;
    struct rs_soft_cm *cm;
    const void *pd;
    uint32_t pd_len;
    int result;
};

static void accept_loop(void *arg)
{
    struct accept_args *a = arg;
    struct rs_rc_qp *rc = a->rc;
    struct rs_rc_request *rq = a->rq;
    if (rs_rc_conn(rc) != RS_RC_IDLE || rs_soft_qp_get_state(rc->qp) != RS_QPS_INIT) {
        a->result = -EISCONN;
        return;
    }
    rc->watch = rs_soft_watch_add(rc->dev, rq->fd, RS_SOFT_EV_READ, rs_rc_io_cb, rc);
    if (!rc->watch) {
        a->result = -ENOMEM;
        return;
    }
    rc->watch_events = RS_SOFT_EV_READ;
    rc->fd = rq->fd;
    rq->fd = -1;
    rc->peer = rq->peer;
    rc->peer_len = sizeof(rc->peer);
    rc->neg = rq->neg;
    rc->active = false;
    rs_rc_apply_qos(rc);
    struct rs_mpa_frame rep;
    rs_mpa_reply_init(&rep, &rq->req, &rq->local, &rq->neg, false, a->pd, (uint16_t)a->pd_len);
    uint8_t frame[RS_MPA_REQREP_MAX];
    int n = rs_mpa_frame_encode(&rep, frame, sizeof(frame));
    pthread_mutex_lock(&rc->tx_lock);
    /* The Reply is the first thing on the wire: FPDUs are only built after the raw bytes went out. */
    if (n > 0)
        rs_rc_tx_queue_raw(rc, frame, (size_t)n);
    pthread_mutex_unlock(&rc->tx_lock);
    rs_soft_cm_get(a->cm);
    rc->cm = a->cm;
    record_local_addr(rc);
    rs_rc_enter_rts(rc);
    rs_rc_push_event(rc, RS_RNIC_CM_EV_ESTABLISHED, 0, NULL, 0);
    rs_rc_tx_run(rc, true);
    a->result = 0;
}

int rs_rc_accept(struct rs_rnic_conn_request *request, struct rs_soft_qp *qp, struct rs_soft_cm *cm,
                 const void *private_data, uint32_t private_data_len)
{
    struct rs_rc_request *rq = (struct rs_rc_request *)request;
    struct rs_rc_qp *rc = rs_rc(qp);
    if (!rq || !rc || !cm || (private_data_len && !private_data))
        return -EINVAL;
    if (private_data_len > qp->dev->base.caps.max_accept_private_data)
        return -EMSGSIZE;
    struct accept_args a = { rq, rc, cm, private_data, private_data_len, 0 };
    rs_soft_progress_call_sync(qp->dev, accept_loop, &a);
    if (a.result == 0)
        free(rq);
    return a.result;
}

struct reject_args {
    struct rs_rc_request *rq;
    const void *pd;
    uint32_t pd_len;
};

static void reject_loop(void *arg)
{
    struct reject_args *a = arg;
    struct rs_rc_request *rq = a->rq;
    struct rs_mpa_frame rep;
    rs_mpa_reply_init(&rep, &rq->req, &rq->local, NULL, true, a->pd, (uint16_t)a->pd_len);
    send_frame(rq->fd, &rep);
    /* Orderly close: the Request was read whole, so the FIN follows the Reply and nothing is reset. */
    rs_soft_sys_shutdown(rq->fd, SHUT_WR);
    rs_soft_sys_close(rq->fd);
    rq->fd = -1;
}

int rs_rc_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len)
{
    struct rs_rc_request *rq = (struct rs_rc_request *)request;
    if (!rq || (private_data_len && !private_data))
        return -EINVAL;
    if (private_data_len > rq->dev->base.caps.max_accept_private_data)
        return -EMSGSIZE;
    struct reject_args a = { rq, private_data, private_data_len };
    rs_soft_progress_call_sync(rq->dev, reject_loop, &a);
    free(rq);
    return 0;
}

void rs_rc_request_discard(struct rs_rnic_conn_request *request)
{
    struct rs_rc_request *rq = (struct rs_rc_request *)request;
    if (!rq)
        return;
    if (rq->fd >= 0)
        rs_soft_sys_close(rq->fd);
    free(rq);
}
