/*
 * sdp_handback.c: a connection continues over kernel TCP (docs/sdp.md, "Hand-back"). Interface: sdp.h.
 *
 * Why: an RDMA connection belongs to the process that set it up. When another process must use the connection
 * (a forked child serves it, a new image after exec reads it), the stream moves to a kernel TCP connection, which
 * any process can share. SDP has the messages for this (SuspComm / SuspCommAck, "socket duplication"); rdmasock
 * uses them to agree on the point where the stream leaves the QP.
 *
 * The exchange. The initiator I quiesces (its application's calls wait, its zero-copy transfers end), listens on
 * a TCP port Q and sends SuspComm with service ID token << 16 | Q. The responder R quiesces the same way and sends
 * SuspCommAck: after it, neither side posts anything but control messages, and everything R sent is in I's ring
 * (a QP delivers in order). Each side's stream state is now two pieces: the *residue* (received, not read by its
 * application) and the *unsent* bytes (in its send ring, never posted). R connects to Q and sends a 24-byte
 * header (magic, token, residue length) and its residue; I answers with its header and residue, then R's residue
 * and its own unsent bytes; R sends back I's residue and its own unsent bytes. So each kernel socket's receive
 * queue starts with exactly what its application had not read, followed by what the peer's application had
 * written and not delivered, and from then on everything is plain TCP: a shared socket after fork, an fd that
 * survives exec. A side whose application shut down writing shuts down the TCP socket after its bytes.
 *
 * The residues travel twice rather than being kept in rdmasock: the kernel socket is then the only state, and no
 * process needs rdmasock to read the connection correctly. The cost is a bounded limit: the echo and the unsent
 * bytes of both sides must fit in the two kernel sockets' buffers at once (each side writes them before its
 * application can read), which is why the sockets ask for SDP_HB_BUF_FORCE when the process may (CAP_NET_ADMIN).
 *
 * If both sides start at once, the SuspComm of the active (connecting) side wins; the passive side answers it.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/thread.h"
#include "sdp_stream/sdp_int.h"


/* ---- raw system calls: the interception layer interposes the libc ones ---- */

static long sys_ret(long r) { return r < 0 ? -errno : r; }

static int hb_poll(int fd, short events, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = rs_sdp_now_ms();
        if (now >= deadline_ms)
            return -ETIMEDOUT;
        uint64_t left = deadline_ms - now;
        struct timespec ts = { (time_t)(left / 1000u), (long)(left % 1000u) * 1000000L };
        struct pollfd p = { .fd = fd, .events = events };
        long r = syscall(SYS_ppoll, &p, 1, &ts, NULL, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r > 0)
            return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events) ? -ECONNRESET : 0;
    }
}

/* Moves exactly len bytes: writes them all, or reads them and not one more (what follows belongs to the
 * application). */
static int transfer(int fd, uint8_t *buf, size_t len, bool sending, uint64_t deadline_ms)
{
    while (len > 0) {
        long n = sending ? syscall(SYS_sendto, fd, buf, len, MSG_NOSIGNAL, NULL, 0)
                         : syscall(SYS_recvfrom, fd, buf, len, 0, NULL, NULL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int r = hb_poll(fd, sending ? POLLOUT : POLLIN, deadline_ms);
            if (r < 0)
                return r;
            continue;
        }
        if (n < 0)
            return -errno;
        if (n == 0)
            return -ECONNRESET;     /* (recv only) the peer went away in the middle */
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int write_all(int fd, const uint8_t *buf, size_t len, uint64_t deadline_ms)
{
    return transfer(fd, (uint8_t *)(uintptr_t)buf, len, true, deadline_ms);
}

static int read_exact(int fd, uint8_t *buf, size_t len, uint64_t deadline_ms)
{
    return transfer(fd, buf, len, false, deadline_ms);
}

static void hb_close(int fd)
{
    if (fd >= 0)
        syscall(SYS_close, fd);
}

/* A TCP socket for the exchange, nonblocking while it lasts, with buffers large enough for both tails where the
 * process may set them. */
static int tcp_socket(int family)
{
    int fd = (int)sys_ret(syscall(SYS_socket, family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd < 0)
        return fd;
    int big = (int)SDP_HB_BUF_FORCE;
    (void)syscall(SYS_setsockopt, fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, (socklen_t)sizeof(big));
    (void)syscall(SYS_setsockopt, fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, (socklen_t)sizeof(big));
    int one = 1;
    (void)syscall(SYS_setsockopt, fd, IPPROTO_TCP, TCP_NODELAY, &one, (socklen_t)sizeof(one));
    return fd;
}

static void set_port(struct sockaddr_storage *a, uint16_t port)
{
    if (a->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)a)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)a)->sin_port = htons(port);
}

static socklen_t addr_len(const struct sockaddr_storage *a)
{
    return a->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* Listens on our side's address (any port): where the responder connects. */
static int listen_tcp(const struct sockaddr_storage *local, uint16_t *port)
{
    struct sockaddr_storage a = *local;
    set_port(&a, 0);
    int fd = tcp_socket(a.ss_family);
    if (fd < 0)
        return fd;
    long r = syscall(SYS_bind, fd, &a, addr_len(&a));
    if (r == 0)
        r = syscall(SYS_listen, fd, 1);
    socklen_t len = sizeof(a);
    if (r == 0)
        r = syscall(SYS_getsockname, fd, &a, &len);
    if (r != 0) {
        r = -errno;
        hb_close(fd);
        return (int)r;
    }
    *port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                          : ((struct sockaddr_in *)&a)->sin_port);
    return fd;
}

static int connect_tcp(const struct sockaddr_storage *peer, uint16_t port, uint64_t deadline_ms)
{
    struct sockaddr_storage a = *peer;
    set_port(&a, port);
    int fd = tcp_socket(a.ss_family);
    if (fd < 0)
        return fd;
    long r = syscall(SYS_connect, fd, &a, addr_len(&a));
    int err = r == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
        err = -hb_poll(fd, POLLOUT, deadline_ms);
        if (err == 0) {
            socklen_t len = sizeof(err);
            if (syscall(SYS_getsockopt, fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        }
    }
    if (err) {
        hb_close(fd);
        return -err;
    }
    return fd;
}

/* Hands the socket over blocking, as rs_sdp_handback promises. */
static void set_blocking(int fd)
{
    long fl = syscall(SYS_fcntl, fd, F_GETFL);
    if (fl >= 0)
        (void)syscall(SYS_fcntl, fd, F_SETFL, fl & ~(long)O_NONBLOCK);
}

/* ---- the stream state at the suspension point ---- */

struct hb_tail {
    uint8_t *data;              /* residue, then unsent */
    size_t residue, unsent;
    bool shut_wr;
};

/* Lock held, after the suspension point: copies what the application has not read and what it wrote that never
 * went on the QP. Zero-copy advertisements are over by then (quiet()), so the receive queue holds Data only. */
static int capture(struct rs_sdp_sock *s, struct hb_tail *t)
{
    memset(t, 0, sizeof(*t));
    size_t residue = 0;
    for (uint32_t i = 0; i < s->rxq_count; i++) {
        const struct sdp_rx_entry *e = &s->rxq[(s->rxq_head + i) % s->rxq_cap];
        if (e->kind != SDP_RX_DATA)
            return -EPROTO;
        residue += e->len;
    }
    size_t unsent = (size_t)(s->tx_tail - s->tx_posted);
    t->data = malloc(residue + unsent + 1);
    if (!t->data)
        return -ENOMEM;
    size_t at = 0;
    for (uint32_t i = 0; i < s->rxq_count; i++) {
        const struct sdp_rx_entry *e = &s->rxq[(s->rxq_head + i) % s->rxq_cap];
        memcpy(t->data + at, s->rbuf_mem + (size_t)e->buf * s->rbuf_size + e->off, e->len);
        at += e->len;
    }
    for (size_t k = 0; k < unsent;) {
        uint32_t off = (uint32_t)((s->tx_posted + k) % s->sbuf_size);
        size_t n = s->sbuf_size - off < unsent - k ? s->sbuf_size - off : unsent - k;
        memcpy(t->data + at, s->sbuf_mem + off, n);
        at += n;
        k += n;
    }
    t->residue = residue;
    t->unsent = unsent;
    t->shut_wr = s->wr_shut;
    /* What moved to the kernel socket is no longer SDP's to deliver or acknowledge. */
    s->stats.bytes_received += residue;
    return 0;
}

/* Nothing of ours in flight that the peer must still answer, and no application thread inside a transfer. */
static bool quiet(const struct rs_sdp_sock *s)
{
    return s->state == SDP_ST_CONNECTED && !s->tx_busy && !s->rx_busy && !s->zsrc.active && !s->rsrc.active &&
           !s->sink.active && !s->psrc.active && !s->psrc.read_out && !s->zwrite_out && s->late_cancel_acks == 0 &&
           s->owed_rd_compl == 0 && s->owed_sink_cancel_acks == 0 && !s->owed_send_sm;
}

/* Alive: connected, or (responder) still waiting for its own ESTABLISHED while the peer's SuspComm is already here:
 * a fork server can accept, fork and hand back before our CM event arrives. */
static bool usable(const struct rs_sdp_sock *s)
{
    return (s->state == SDP_ST_CONNECTED || s->state == SDP_ST_CONNECTING || s->state == SDP_ST_ACCEPTING) &&
           !s->broken && !s->cm_gone;
}

/* Lock held: waits (uninterruptibly, the protocol must finish) until cond or the deadline; drives progress. */
static int wait_until(struct rs_sdp_sock *s, bool (*cond)(const struct rs_sdp_sock *), uint64_t deadline_ms)
{
    for (;;) {
        rs_sdp_progress(s);
        if (cond(s))
            return 0;
        if (!usable(s) && s->hb.phase < SDP_HB_SUSPENDED)
            return -ECONNRESET;
        if (rs_sdp_now_ms() >= deadline_ms)
            return -ETIMEDOUT;
        int r = rs_sdp_wait_uninterruptible(s, deadline_ms);
        if (r != 0 && r != -ETIMEDOUT)
            return r;
    }
}

static bool can_ctrl(const struct rs_sdp_sock *s) { return rs_sdp_can_send_ctrl(s); }
static bool acked(const struct rs_sdp_sock *s) { return s->hb.ack_rcvd || !s->hb.initiator; }
static bool finished(const struct rs_sdp_sock *s) { return s->hb.phase == SDP_HB_DONE || s->hb.phase == SDP_HB_NONE; }

/* Lock held: posts SuspComm (initiator) or SuspCommAck (responder) once a credit allows; from then on nothing but
 * control messages leaves this side. */
static int post_suspend(struct rs_sdp_sock *s, uint8_t mid, uint64_t deadline_ms)
{
    int r = wait_until(s, can_ctrl, deadline_ms);
    if (r != 0)
        return r;
    /* While it waited for a credit the peer's SuspComm may have come and won (rs_sdp_hb_on_suspend): this side
     * answers it now, and a SuspComm of its own would make the peer yield too, leaving two responders that wait
     * for each other until both time out (seen in the VM: both ends of test_handback_both_start got ETIMEDOUT). */
    if (mid == RS_SDP_MID_SUSPEND && !s->hb.initiator)
        return 0;
    s->hb.phase = SDP_HB_SUSPENDED;
    r = rs_sdp_post_msg(s, mid, NULL, 0, 0, 0);
    if (r != 0)
        return -ECONNRESET;
    s->hb.suspend_sent = true;
    return 0;
}

/* Lock held: the hand-back is over; the RDMA connection ends without a word to the application or the peer (the
 * peer ends its own). */
static void finish(struct rs_sdp_sock *s, int fd, bool taken)
{
    s->hb.phase = SDP_HB_DONE;
    s->hb.fd = taken ? -1 : fd;
    s->hb.fd_taken = taken;
    int saved = s->so_error;
    rs_sdp_fail(s, 0, false);
    s->so_error = saved;
    if (s->app_closed && s->hb.fd >= 0) {
        /* Nobody will take it: closing it is what the application's close would have done. */
        hb_close(s->hb.fd);
        s->hb.fd = -1;
    }
    s->dirty = true;
    rs_sdp_signal(s);
    RS_DEBUG("sdp: connection handed back to kernel TCP (fd %d)", fd);
}

/* Lock held: the hand-back failed; the connection is reset, as a kernel connection that broke. */
static void hb_failed(struct rs_sdp_sock *s, int err)
{
    RS_WARN("sdp: hand-back to kernel TCP failed (%s): resetting the connection", strerror(-err));
    s->hb.phase = SDP_HB_NONE;
    if (s->state != SDP_ST_CLOSED)
        rs_sdp_fail(s, ECONNRESET, true);
    else if (!s->so_error)
        s->so_error = ECONNRESET;
    s->dirty = true;
    rs_sdp_signal(s);
}

/* ---- the TCP exchange (the order is the protocol: docs/sdp.md, "Hand-back") ---- */

/* Our header and residue: what the peer reads and sends back. */
static int send_residue(int fd, uint64_t token, const struct hb_tail *t, uint64_t deadline_ms)
{
    uint8_t hdr[RS_SDP_HB_HDR_LEN];
    rs_sdp_hb_hdr_encode(hdr, token, t->residue);
    int r = write_all(fd, hdr, sizeof(hdr), deadline_ms);
    return r < 0 ? r : write_all(fd, t->data, t->residue, deadline_ms);
}

/* The peer's residue (its header already read): exactly len bytes, nothing of what follows. */
static int recv_residue(int fd, uint64_t len, uint8_t **out, uint64_t deadline_ms)
{
    *out = malloc(len + 1);
    if (!*out)
        return -ENOMEM;
    return read_exact(fd, *out, len, deadline_ms);
}

/* The peer's residue goes back to it, then what our application wrote and never sent; the write side then closes
 * if our application had shut it. */
static int send_tail(int fd, const uint8_t *echo, uint64_t echo_len, const struct hb_tail *t, uint64_t deadline_ms)
{
    int r = write_all(fd, echo, echo_len, deadline_ms);
    if (r >= 0)
        r = write_all(fd, t->data + t->residue, t->unsent, deadline_ms);
    if (r >= 0 && t->shut_wr)
        (void)syscall(SYS_shutdown, fd, SHUT_WR);
    return r;
}

/* ---- the responder ---- */

static void *responder_main(void *arg)
{
    struct rs_sdp_sock *s = arg;
    struct hb_tail t = { 0 };
    int fd = -1;
    uint8_t hdr[RS_SDP_HB_HDR_LEN];
    uint8_t *peer_residue = NULL;
    uint64_t deadline = rs_sdp_now_ms() + SDP_HB_RESPONDER_TIMEOUT_MS;
    rs_lock(&s->lock);
    int r = wait_until(s, quiet, deadline);
    /* No more data from us from here (what is unsent becomes the tail); nothing more arrives from the peer (it
     * sent SuspComm after its last byte): the state to capture is fixed. */
    if (r == 0)
        s->hb.phase = SDP_HB_SUSPENDED;
    if (r == 0)
        r = wait_until(s, can_ctrl, deadline);
    if (r == 0)
        r = capture(s, &t);
    if (r == 0)
        r = post_suspend(s, RS_SDP_MID_SUSPEND_ACK, deadline);
    uint64_t token = s->hb.service_id >> 16;
    uint16_t port = (uint16_t)s->hb.service_id;
    struct sockaddr_storage peer = s->peer;
    rs_unlock(&s->lock);

    if (r == 0)
        fd = r = connect_tcp(&peer, port, deadline);
    if (r >= 0)
        r = send_residue(fd, token, &t, deadline);
    uint64_t peer_len = 0;
    if (r >= 0)
        r = read_exact(fd, hdr, sizeof(hdr), deadline);
    if (r >= 0)
        r = rs_sdp_hb_hdr_decode(hdr, sizeof(hdr), token, &peer_len);
    if (r >= 0)
        r = recv_residue(fd, peer_len, &peer_residue, deadline);
    if (r >= 0)
        r = send_tail(fd, peer_residue, peer_len, &t, deadline);
    free(peer_residue);
    free(t.data);

    rs_lock(&s->lock);
    if (r >= 0) {
        set_blocking(fd);
        finish(s, fd, false);
    } else {
        hb_close(fd);
        hb_failed(s, r);
    }
    rs_unlock(&s->lock);
    rs_sdp_put(s);
    return NULL;
}

static int start_responder(struct rs_sdp_sock *s)
{
    rs_sdp_get(s);
    int r = rs_thread_start(NULL, responder_main, s, true);
    if (r != 0) {
        rs_sdp_put(s);
        return -r;
    }
    return 0;
}

void rs_sdp_hb_on_suspend(struct rs_sdp_sock *s, uint64_t service_id)
{
    if (s->hb.phase == SDP_HB_DONE || (s->hb.phase != SDP_HB_NONE && !s->hb.initiator))
        return;                 /* already answering one */
    if (s->hb.phase != SDP_HB_NONE && s->hb.suspend_sent && !s->passive)
        return;                 /* both started: ours wins, the peer answers it */
    /* Answer the peer's. An initiator of ours that yields waits for this answer and returns its fd. */
    if (s->hb.phase == SDP_HB_NONE)
        s->hb.phase = SDP_HB_QUIESCE;
    s->hb.initiator = false;
    s->hb.suspend_sent = false;
    s->hb.service_id = service_id;
    s->dirty = true;
    int r = start_responder(s);
    if (r != 0)
        hb_failed(s, r);
}

void rs_sdp_hb_on_suspend_ack(struct rs_sdp_sock *s)
{
    if (s->hb.initiator && s->hb.suspend_sent)
        s->hb.ack_rcvd = true;
    s->dirty = true;
}

/* ---- the initiator ---- */

/* The responder's connection, told by its header; anyone else who connects to the port meanwhile is dropped. */
static int accept_peer(int lfd, uint64_t token, uint64_t *peer_len, uint64_t deadline_ms)
{
    for (;;) {
        int r = hb_poll(lfd, POLLIN, deadline_ms);
        if (r < 0)
            return r;
        int fd = (int)sys_ret(syscall(SYS_accept4, lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (fd == -EAGAIN || fd == -ECONNABORTED || fd == -EINTR)
            continue;
        if (fd < 0)
            return fd;
        uint8_t hdr[RS_SDP_HB_HDR_LEN];
        r = read_exact(fd, hdr, sizeof(hdr), deadline_ms);
        if (r == 0)
            r = rs_sdp_hb_hdr_decode(hdr, sizeof(hdr), token, peer_len);
        if (r == 0)
            return fd;
        hb_close(fd);
        if (r == -ETIMEDOUT)
            return r;
        RS_DEBUG("sdp: hand-back port: dropped a connection that is not the peer's (%d)", r);
    }
}

int rs_sdp_handback(struct rs_sdp_sock *s, int timeout_ms)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    if (rs_sdp_progress_on_loop())
        return -EDEADLK;
    uint64_t deadline = rs_sdp_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
    rs_sdp_get(s);
    rs_lock(&s->lock);
    rs_sdp_progress(s);
    int lfd = -1;
    struct hb_tail t = { 0 };
    if (s->hb.phase != SDP_HB_NONE)
        goto follow;            /* the peer started one: its answer gives us the fd */
    if (s->state == SDP_ST_CLOSED || s->broken) {
        r = rs_sdp_take_error(s, -EPIPE);
        goto out;
    }
    if (s->state != SDP_ST_CONNECTED || !s->peer_handback) {
        r = -EOPNOTSUPP;
        goto out;
    }
    s->hb.phase = SDP_HB_QUIESCE;
    s->hb.initiator = true;
    s->dirty = true;
    rs_sdp_signal(s);           /* blocked calls see the gate; zero-copy waits end their advertisements */
    uint16_t port = 0;
    rs_unlock(&s->lock);
    lfd = listen_tcp(&s->local, &port);
    uint64_t token = 0;
    if (getrandom(&token, sizeof(token), 0) != (ssize_t)sizeof(token))
        token = rs_sdp_now_us() ^ ((uint64_t)(uintptr_t)s << 16);
    token &= 0xffffffffffffull;
    rs_lock(&s->lock);
    if (lfd < 0) {
        r = lfd;
        goto failed;
    }
    r = wait_until(s, quiet, deadline);
    if (r == 0 && s->hb.initiator) {
        s->hb.service_id = token << 16 | port;
        r = post_suspend(s, RS_SDP_MID_SUSPEND, deadline);
    }
    if (r == 0)
        r = wait_until(s, acked, deadline);
    if (r != 0)
        goto failed;
    if (!s->hb.initiator)
        goto follow;            /* the peer's SuspComm crossed ours and won */
    /* Zero-copy answers the peer's cancels asked for before its SuspCommAck must be out before we look. */
    r = wait_until(s, quiet, deadline);
    if (r == 0)
        r = capture(s, &t);
    if (r != 0)
        goto failed;
    rs_unlock(&s->lock);

    uint64_t peer_len = 0;
    uint8_t *peer_residue = NULL;
    int fd = accept_peer(lfd, token, &peer_len, deadline);
    r = fd;
    if (r >= 0)
        r = recv_residue(fd, peer_len, &peer_residue, deadline);
    if (r >= 0)
        r = send_residue(fd, token, &t, deadline);
    if (r >= 0)
        r = send_tail(fd, peer_residue, peer_len, &t, deadline);
    free(peer_residue);
    free(t.data);
    hb_close(lfd);
    lfd = -1;
    rs_lock(&s->lock);
    if (r < 0) {
        hb_close(fd);
        goto failed;
    }
    set_blocking(fd);
    finish(s, fd, true);
    r = fd;
    goto out;

follow:
    /* Someone else's hand-back (the peer's, or one that overtook ours): wait for it and take its fd. */
    r = wait_until(s, finished, deadline);
    if (r == 0 && s->hb.phase == SDP_HB_DONE) {
        r = s->hb.fd >= 0 ? s->hb.fd : -ENOENT;
        s->hb.fd = -1;
        s->hb.fd_taken = true;
    } else if (r == 0) {
        r = rs_sdp_take_error(s, -ECONNRESET);
    }
    goto out;

failed:
    if (s->hb.phase != SDP_HB_DONE && s->hb.initiator)
        hb_failed(s, r);
    else if (s->hb.phase != SDP_HB_DONE && !s->hb.initiator)
        goto follow;
    r = r == -ETIMEDOUT ? -ETIMEDOUT : -ECONNRESET;
out:
    if (lfd >= 0)
        hb_close(lfd);
    rs_unlock(&s->lock);
    rs_sdp_put(s);
    return r;
}

/* ---- what the application's calls see ---- */

int rs_sdp_hb_gate(struct rs_sdp_sock *s, bool dontwait)
{
    switch (s->hb.phase) {
    case SDP_HB_NONE:
        return 0;
    case SDP_HB_DONE:
        return -EREMCHG;
    default:
        return dontwait ? -EAGAIN : 1;
    }
}

int rs_sdp_hb_settle(struct rs_sdp_sock *s)
{
    uint64_t deadline = rs_sdp_now_ms() + SDP_HB_RESPONDER_TIMEOUT_MS;
    while (s->hb.phase == SDP_HB_QUIESCE || s->hb.phase == SDP_HB_SUSPENDED) {
        rs_sdp_progress(s);
        if (s->hb.phase != SDP_HB_QUIESCE && s->hb.phase != SDP_HB_SUSPENDED)
            break;
        if (rs_sdp_wait_uninterruptible(s, deadline) == -ETIMEDOUT)
            break;
    }
    return s->hb.phase == SDP_HB_DONE ? -EREMCHG : 0;
}

bool rs_sdp_handed_back(struct rs_sdp_sock *s)
{
    if (rs_sdp_check_epoch(s) != 0)
        return false;
    rs_lock(&s->lock);
    bool done = s->hb.phase == SDP_HB_DONE;
    rs_unlock(&s->lock);
    return done;
}

int rs_sdp_take_handback_fd(struct rs_sdp_sock *s)
{
    int r = rs_sdp_check_epoch(s);
    if (r != 0)
        return r;
    rs_lock(&s->lock);
    if (s->hb.phase == SDP_HB_DONE && s->hb.fd >= 0) {
        r = s->hb.fd;
        s->hb.fd = -1;
        s->hb.fd_taken = true;
    } else {
        r = s->hb.phase == SDP_HB_QUIESCE || s->hb.phase == SDP_HB_SUSPENDED ? -EAGAIN : -ENOENT;
    }
    rs_unlock(&s->lock);
    return r;
}
