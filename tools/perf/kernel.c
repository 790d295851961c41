/*
 * kernel.c: the plain kernel TCP and UDP loops rdmasock-perf measures next to the RNIC, so every ratio comes from
 * one run on one machine state.
 *
 * "Plain" means what an unmodified socket program does: one send() per message, blocking calls (or MSG_DONTWAIT
 * in a spin with --poll), TCP_NODELAY on TCP (the soft RNIC sets it on its own TCP sockets too). Two choices keep
 * the comparison about the data path and not about tuning:
 *   - the UDP sockets get the soft RNIC's UD socket buffers (8 MiB receive, 4 MiB send), so a burst meets the same
 *     room in the kernel on both sides;
 *   - the TCP receiver reads with a buffer of max(size, 64 KiB) and counts bytes, the best a stream reader does
 *     (TCP has no message boundaries; a receiver reading message by message would only look slower).
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "perf.h"
#include "sys.h"

#define UDP_RCVBUF (8 << 20)
#define UDP_SNDBUF (4 << 20)
#define TCP_READ_CHUNK (64u << 10)
#define UDP_SERVER_TICK_MS 50       /* a blocked UDP receiver looks at the control connection this often */

struct perf_kernel {
    bool poll;
    int tcp_listen_fd, tcp_fd, udp_fd;
    struct sockaddr_storage udp_peer;       /* where datagrams go (the socket stays unconnected) */
    uint8_t *buf;
    size_t buf_len;
};

int perf_kernel_open(bool poll, struct perf_kernel **out)
{
    struct perf_kernel *k = calloc(1, sizeof(*k));
    if (!k)
        return -ENOMEM;
    k->poll = poll;
    k->tcp_listen_fd = k->tcp_fd = k->udp_fd = -1;
    *out = k;
    return 0;
}

void perf_kernel_close(struct perf_kernel *k)
{
    if (!k)
        return;
    if (k->tcp_listen_fd >= 0)
        perf_sys_close(k->tcp_listen_fd);
    if (k->tcp_fd >= 0)
        perf_sys_close(k->tcp_fd);
    if (k->udp_fd >= 0)
        perf_sys_close(k->udp_fd);
    free(k->buf);
    free(k);
}

static int ensure_buffer(struct perf_kernel *k, size_t len)
{
    if (len < TCP_READ_CHUNK)
        len = TCP_READ_CHUNK;
    if (k->buf_len >= len)
        return 0;
    uint8_t *b = realloc(k->buf, len);
    if (!b)
        return -ENOMEM;
    memset(b, 0x5a, len);
    k->buf = b;
    k->buf_len = len;
    return 0;
}

static void set_buffer(int fd, int force_name, int name, int bytes)
{
    if (perf_sys_setsockopt(fd, SOL_SOCKET, force_name, &bytes, sizeof(bytes)) != 0)
        perf_sys_setsockopt(fd, SOL_SOCKET, name, &bytes, sizeof(bytes));
}

static int set_rcvtimeo(int fd, int ms)
{
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    return perf_sys_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static int udp_socket(const struct sockaddr_storage *local, uint16_t *port)
{
    int fd = perf_sys_socket(local->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    set_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, UDP_RCVBUF);
    set_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, UDP_SNDBUF);
    struct sockaddr_storage a = *local, bound;
    perf_addr_set_port(&a, 0);
    socklen_t len = sizeof(bound);
    int rc = perf_sys_bind(fd, (const struct sockaddr *)&a, perf_addr_len(&a));
    if (rc == 0)
        rc = perf_sys_getsockname(fd, (struct sockaddr *)&bound, &len);
    if (rc) {
        perf_sys_close(fd);
        return rc;
    }
    *port = perf_addr_port(&bound);
    return fd;
}

static int udp_set_peer(struct perf_kernel *k, const struct sockaddr_storage *addr, uint16_t port)
{
    k->udp_peer = *addr;
    perf_addr_set_port(&k->udp_peer, port);
    return 0;
}

int perf_kernel_server_setup(struct perf_kernel *k, enum perf_group g, const struct sockaddr_storage *local,
                             size_t buf_len, struct perf_msg *reply)
{
    int rc = ensure_buffer(k, buf_len);
    if (rc)
        return rc;
    if (g == PERF_GROUP_UDP) {
        uint16_t port = 0;
        if (k->udp_fd >= 0)
            perf_sys_close(k->udp_fd);
        k->udp_fd = udp_socket(local, &port);
        if (k->udp_fd < 0)
            return k->udp_fd;
        reply->port = port;
        return 0;
    }
    struct sockaddr_storage a = *local, bound;
    perf_addr_set_port(&a, 0);
    if (k->tcp_listen_fd >= 0)
        perf_sys_close(k->tcp_listen_fd);
    k->tcp_listen_fd = perf_tcp_listen(&a, 1);
    if (k->tcp_listen_fd < 0)
        return k->tcp_listen_fd;
    socklen_t len = sizeof(bound);
    rc = perf_sys_getsockname(k->tcp_listen_fd, (struct sockaddr *)&bound, &len);
    if (rc)
        return rc;
    reply->port = perf_addr_port(&bound);
    return 0;
}

int perf_kernel_server_peer(struct perf_kernel *k, enum perf_group g, const struct perf_msg *peer,
                            const struct sockaddr_storage *client_addr)
{
    if (g == PERF_GROUP_UDP)
        return udp_set_peer(k, client_addr, (uint16_t)peer->port);
    struct pollfd p = { .fd = k->tcp_listen_fd, .events = POLLIN };
    if (perf_sys_poll(&p, 1, 10000) <= 0)
        return -ETIMEDOUT;
    if (k->tcp_fd >= 0)
        perf_sys_close(k->tcp_fd);
    k->tcp_fd = perf_sys_accept(k->tcp_listen_fd, NULL, NULL);
    if (k->tcp_fd < 0)
        return k->tcp_fd;
    int one = 1;
    return perf_sys_setsockopt(k->tcp_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int perf_kernel_client_setup(struct perf_kernel *k, enum perf_group g, const struct sockaddr_storage *local,
                             const struct sockaddr_storage *server, const struct perf_msg *server_ep, size_t buf_len,
                             struct perf_msg *mine)
{
    int rc = ensure_buffer(k, buf_len);
    if (rc)
        return rc;
    if (g == PERF_GROUP_UDP) {
        uint16_t port = 0;
        if (k->udp_fd >= 0)
            perf_sys_close(k->udp_fd);
        k->udp_fd = udp_socket(local, &port);
        if (k->udp_fd < 0)
            return k->udp_fd;
        mine->port = port;
        return udp_set_peer(k, server, (uint16_t)server_ep->port);
    }
    struct sockaddr_storage a = *server;
    perf_addr_set_port(&a, (uint16_t)server_ep->port);
    if (k->tcp_fd >= 0)
        perf_sys_close(k->tcp_fd);
    k->tcp_fd = perf_tcp_connect(&a, 5000);
    return k->tcp_fd < 0 ? k->tcp_fd : 0;
}

/* ---- data moves ---- */

/* Sends all len bytes of a TCP stream. Blocking, or spinning on EAGAIN with --poll. */
static int send_full(struct perf_kernel *k, int fd, size_t len)
{
    size_t off = 0;
    int flags = k->poll ? MSG_DONTWAIT : 0;
    do {
        ssize_t n = perf_sys_send(fd, k->buf + off, len - off, flags);
        if (n == -EAGAIN || n == -EINTR || n == -ENOBUFS)
            continue;
        if (n < 0)
            return (int)n;
        off += (size_t)n;
    } while (off < len);
    return 0;
}

/* One datagram to the peer, the way an unconnected UDP socket sends (sendto per datagram, as a UD QP does). */
static int send_datagram(struct perf_kernel *k, size_t len)
{
    int flags = k->poll ? MSG_DONTWAIT : 0;
    for (;;) {
        ssize_t n = perf_sys_sendto(k->udp_fd, k->buf, len, flags, (const struct sockaddr *)&k->udp_peer,
                                    perf_addr_len(&k->udp_peer));
        if (n == -EAGAIN || n == -EINTR || n == -ENOBUFS)
            continue;
        return n < 0 ? (int)n : 0;
    }
}

/* Receives exactly len bytes of a TCP stream. */
static int recv_full(struct perf_kernel *k, int fd, size_t len)
{
    size_t off = 0;
    int flags = k->poll ? MSG_DONTWAIT : MSG_WAITALL;
    while (off < len) {
        ssize_t n = perf_sys_recv(fd, k->buf + off, len - off, flags);
        if (n == -EAGAIN || n == -EINTR)
            continue;
        if (n < 0)
            return (int)n;
        if (n == 0)
            return -ECONNRESET;
        off += (size_t)n;
    }
    return 0;
}

/* One datagram, or -EAGAIN after timeout_ms (blocking mode: the socket's SO_RCVTIMEO; poll mode: spinning). */
static ssize_t recv_datagram(struct perf_kernel *k, int timeout_ms)
{
    /* recvfrom with the source address, as an unconnected UDP receiver does (a UD receive reports it too). */
    struct sockaddr_storage from;
    socklen_t from_len = sizeof(from);
    if (!k->poll) {
        ssize_t n;
        do
            n = perf_sys_recvfrom(k->udp_fd, k->buf, k->buf_len, 0, (struct sockaddr *)&from, &from_len);
        while (n == -EINTR);
        return n == -EWOULDBLOCK ? -EAGAIN : n;
    }
    uint64_t deadline = perf_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (unsigned spins = 1;; spins++) {
        from_len = sizeof(from);
        ssize_t n = perf_sys_recvfrom(k->udp_fd, k->buf, k->buf_len, MSG_DONTWAIT, (struct sockaddr *)&from,
                                      &from_len);
        if (n != -EAGAIN && n != -EWOULDBLOCK && n != -EINTR)
            return n;
        if (spins % 1024 == 0 && perf_now_ns() >= deadline)
            return -EAGAIN;
    }
}

static bool ctrl_readable(int ctrl_fd)
{
    struct pollfd p = { .fd = ctrl_fd, .events = POLLIN };
    return perf_sys_poll(&p, 1, 0) > 0;
}

/* ---- client ---- */

static int client_lat(struct perf_kernel *k, int ctrl_fd, enum perf_test test, size_t size, uint64_t count,
                      struct perf_result *res)
{
    uint64_t *rtt = malloc((count ? count : 1) * sizeof(*rtt));
    if (!rtt)
        return -ENOMEM;
    int fd = test == PERF_TCP ? k->tcp_fd : k->udp_fd;
    if (test == PERF_UDP && !k->poll)
        set_rcvtimeo(fd, PERF_LOSS_TIMEOUT_MS);
    uint64_t done = 0, lost = 0, t_begin = perf_now_ns();
    int rc = 0;
    while (done < count && rc == 0) {
        uint64_t t0 = perf_now_ns();
        rc = test == PERF_TCP ? send_full(k, fd, size) : send_datagram(k, size);
        if (rc)
            break;
        if (test == PERF_TCP) {
            rc = recv_full(k, fd, size);
        } else {
            ssize_t n = recv_datagram(k, PERF_LOSS_TIMEOUT_MS);
            if (n == -EAGAIN) {
                lost++;
                continue;
            }
            rc = n < 0 ? (int)n : 0;
        }
        if (rc == 0)
            rtt[done++] = perf_now_ns() - t0;
    }
    uint64_t elapsed = perf_now_ns() - t_begin;
    struct perf_msg result;
    if (rc == 0)
        rc = perf_run_end(ctrl_fd, done + lost, &result);
    if (rc == 0)
        perf_result_from_rtts(res, rtt, done, true, size, lost, elapsed);
    free(rtt);
    return rc;
}

static int client_bw(struct perf_kernel *k, int ctrl_fd, enum perf_test test, size_t size, uint64_t count,
                     struct perf_result *res)
{
    int fd = test == PERF_TCP ? k->tcp_fd : k->udp_fd;
    uint64_t t_begin = perf_now_ns();
    int rc = 0;
    for (uint64_t i = 0; i < count && rc == 0; i++)
        rc = test == PERF_TCP ? send_full(k, fd, size) : send_datagram(k, size);
    uint64_t elapsed = perf_now_ns() - t_begin;
    struct perf_msg result;
    if (rc == 0)
        rc = perf_run_end(ctrl_fd, count, &result);
    if (rc == 0)
        perf_result_from_stream(res, count, result.received, result.count, result.elapsed_ns, size, elapsed);
    return rc;
}

int perf_kernel_client_run(struct perf_kernel *k, int ctrl_fd, const struct perf_case *c, enum perf_mode mode,
                           size_t size, uint64_t count, uint32_t window, struct perf_result *res)
{
    if ((c->test == PERF_TCP ? k->tcp_fd : k->udp_fd) < 0)
        return -ENOTCONN;
    if (size > k->buf_len)
        return -EMSGSIZE;
    struct perf_msg ready;
    int rc = perf_run_begin(ctrl_fd, c, mode, size, count, window, &ready);
    if (rc)
        return rc;
    return mode == PERF_LAT ? client_lat(k, ctrl_fd, c->test, size, count, res)
                            : client_bw(k, ctrl_fd, c->test, size, count, res);
}

/* ---- server ---- */

static int expect_done(int ctrl_fd, uint64_t *sent)
{
    struct perf_msg m;
    int rc = perf_msg_expect(ctrl_fd, PERF_MSG_DONE, &m);
    if (rc == 0 && sent)
        *sent = m.count;
    return rc;
}

/* Streams: the clock starts at t_ready, when READY went out (see rdma_run.c for why not at the first arrival). */
static int server_tcp(struct perf_kernel *k, int ctrl_fd, const struct perf_msg *m, uint64_t t_ready,
                      struct perf_msg *result)
{
    if (m->mode == PERF_LAT) {
        for (uint64_t i = 0; i < m->count; i++) {
            int rc = recv_full(k, k->tcp_fd, m->size);
            if (rc == 0)
                rc = send_full(k, k->tcp_fd, m->size);
            if (rc)
                return rc;
        }
        result->received = m->count;
        return expect_done(ctrl_fd, NULL);
    }
    uint64_t total = m->count * m->size, got = 0, t_last = t_ready;
    size_t chunk = m->size > TCP_READ_CHUNK ? m->size : TCP_READ_CHUNK;
    int flags = k->poll ? MSG_DONTWAIT : 0;
    while (got < total) {
        size_t want = total - got < chunk ? (size_t)(total - got) : chunk;
        ssize_t n = perf_sys_recv(k->tcp_fd, k->buf, want, flags);
        if (n == -EAGAIN || n == -EINTR)
            continue;
        if (n <= 0)
            return n ? (int)n : -ECONNRESET;
        got += (uint64_t)n;
        t_last = perf_now_ns();
    }
    result->received = m->count;
    result->count = m->count;
    result->elapsed_ns = t_last - t_ready;
    return expect_done(ctrl_fd, NULL);
}

static int server_udp(struct perf_kernel *k, int ctrl_fd, const struct perf_msg *m, uint64_t t_ready,
                      struct perf_msg *result)
{
    if (!k->poll)
        set_rcvtimeo(k->udp_fd, UDP_SERVER_TICK_MS);
    uint64_t received = 0, sent = 0, t_last = t_ready, done_at = 0;
    bool done = false;
    for (;;) {
        ssize_t n = recv_datagram(k, UDP_SERVER_TICK_MS);
        uint64_t now = perf_now_ns();
        if (n >= 0) {
            received++;
            if (m->mode == PERF_LAT) {
                int rc = send_datagram(k, (size_t)n);
                if (rc)
                    return rc;
            } else {
                t_last = now;
            }
            /* Every message arrived: the client's DONE is next (a ping-pong client may still resend one whose
             * answer was lost, so there the control connection decides). */
            if (m->mode == PERF_BW && received == m->count && !done) {
                int rc = expect_done(ctrl_fd, &sent);
                if (rc)
                    return rc;
                break;
            }
            if (!done && (received % 1024 != 0 || !ctrl_readable(ctrl_fd)))
                continue;
        } else if (n != -EAGAIN) {
            return (int)n;
        }
        if (!done && ctrl_readable(ctrl_fd)) {
            int rc = expect_done(ctrl_fd, &sent);
            if (rc)
                return rc;
            done = true;
            done_at = now;
        }
        if (done && (m->mode == PERF_LAT || received >= sent))
            break;
        if (done && n == -EAGAIN && now - (t_last > done_at ? t_last : done_at) >= PERF_IDLE_MS * 1000000ull)
            break;                  /* the rest was lost */
    }
    result->received = received;
    result->count = received;
    result->elapsed_ns = t_last - t_ready;
    return 0;
}

int perf_kernel_server_run(struct perf_kernel *k, int ctrl_fd, const struct perf_msg *m)
{
    if ((m->test == PERF_TCP ? k->tcp_fd : k->udp_fd) < 0)
        return -ENOTCONN;
    if (m->size > k->buf_len)
        return -EMSGSIZE;
    uint64_t t_ready = perf_now_ns();
    int rc = perf_reply(ctrl_fd, PERF_MSG_READY, NULL);
    if (rc)
        return rc;
    struct perf_msg result;
    memset(&result, 0, sizeof(result));
    rc = m->test == PERF_TCP ? server_tcp(k, ctrl_fd, m, t_ready, &result) : server_udp(k, ctrl_fd, m, t_ready, &result);
    return rc ? rc : perf_reply(ctrl_fd, PERF_MSG_RESULT, &result);
}
