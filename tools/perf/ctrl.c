/*
 * ctrl.c: the control connection between rdmasock-perf's client and server (kernel TCP, raw system calls: see
 * sys.h), and the address helpers both sides use.
 *
 * A message is a fixed array of 64-bit words in network order, so two hosts of different byte order agree and no
 * framing is needed beyond reading exactly sizeof(struct perf_msg) bytes.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>

#include "perf.h"
#include "sys.h"

#define WORDS (sizeof(struct perf_msg) / sizeof(uint64_t))
_Static_assert(sizeof(struct perf_msg) % sizeof(uint64_t) == 0, "perf_msg is made of 64-bit words only");

static void to_wire(const struct perf_msg *m, uint64_t *w)
{
    memcpy(w, m, sizeof(*m));
    for (size_t i = 0; i < WORDS; i++)
        w[i] = htobe64(w[i]);
}

static void from_wire(const uint64_t *w, struct perf_msg *m)
{
    uint64_t host[WORDS];
    for (size_t i = 0; i < WORDS; i++)
        host[i] = be64toh(w[i]);
    memcpy(m, host, sizeof(*m));
}

int perf_msg_send(int fd, const struct perf_msg *m)
{
    uint64_t w[WORDS];
    to_wire(m, w);
    size_t off = 0;
    while (off < sizeof(w)) {
        ssize_t n = perf_sys_send(fd, (const uint8_t *)w + off, sizeof(w) - off, 0);
        if (n == -EINTR)
            continue;
        if (n < 0)
            return (int)n;
        off += (size_t)n;
    }
    return 0;
}

static int read_rest(int fd, uint8_t *buf, size_t have, size_t want)
{
    while (have < want) {
        ssize_t n = perf_sys_recv(fd, buf + have, want - have, 0);
        if (n == -EINTR)
            continue;
        if (n < 0)
            return (int)n;
        if (n == 0)
            return -ECONNRESET;
        have += (size_t)n;
    }
    return 0;
}

int perf_msg_recv(int fd, struct perf_msg *m)
{
    uint64_t w[WORDS];
    int rc = read_rest(fd, (uint8_t *)w, 0, sizeof(w));
    if (rc)
        return rc;
    from_wire(w, m);
    return 0;
}

int perf_msg_try_recv(int fd, struct perf_msg *m)
{
    uint64_t w[WORDS];
    ssize_t n = perf_sys_recv(fd, w, sizeof(w), MSG_DONTWAIT);
    if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR)
        return 0;
    if (n < 0)
        return (int)n;
    if (n == 0)
        return -ECONNRESET;
    /* A message is small and sent in one call, but TCP may still cut it: finish it blocking. */
    int rc = read_rest(fd, (uint8_t *)w, (size_t)n, sizeof(w));
    if (rc)
        return rc;
    from_wire(w, m);
    return 1;
}

int perf_msg_expect(int fd, uint64_t type, struct perf_msg *m)
{
    int rc = perf_msg_recv(fd, m);
    if (rc)
        return rc;
    if (m->type == PERF_MSG_ERROR)
        return m->status < 0 ? (int)m->status : -EPROTO;
    if (m->type != type) {
        perf_log("control: got message %llu, expected %llu", (unsigned long long)m->type, (unsigned long long)type);
        return -EPROTO;
    }
    return 0;
}

/* ---- addresses ---- */

int perf_resolve(const char *host, uint16_t port, struct sockaddr_storage *out, socklen_t *len)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return -EHOSTUNREACH;
    memset(out, 0, sizeof(*out));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    perf_addr_set_port(out, port);
    return 0;
}

socklen_t perf_addr_len(const struct sockaddr_storage *a)
{
    return a->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

uint16_t perf_addr_port(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    return ntohs(((const struct sockaddr_in *)a)->sin_port);
}

void perf_addr_set_port(struct sockaddr_storage *a, uint16_t port)
{
    if (a->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)a)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)a)->sin_port = htons(port);
}

const char *perf_addr_str(const struct sockaddr_storage *a, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (a->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, ip, sizeof(ip));
    else
        inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, ip, sizeof(ip));
    snprintf(buf, len, a->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, perf_addr_port(a));
    return buf;
}

int perf_tcp_listen(const struct sockaddr_storage *addr, int backlog)
{
    int fd = perf_sys_socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    int one = 1;
    perf_sys_setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc = perf_sys_bind(fd, (const struct sockaddr *)addr, perf_addr_len(addr));
    if (rc == 0)
        rc = perf_sys_listen(fd, backlog);
    if (rc) {
        perf_sys_close(fd);
        return rc;
    }
    return fd;
}

int perf_tcp_connect(const struct sockaddr_storage *addr, int timeout_ms)
{
    uint64_t deadline = perf_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        int fd = perf_sys_socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return fd;
        int rc = perf_sys_connect(fd, (const struct sockaddr *)addr, perf_addr_len(addr));
        if (rc == 0) {
            int one = 1;
            perf_sys_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            return fd;
        }
        perf_sys_close(fd);
        /* A server started at the same moment may not listen yet: retry until the deadline. */
        if (rc != -ECONNREFUSED || perf_now_ns() > deadline)
            return rc;
        struct timespec ts = { 0, 50000000 };
        nanosleep(&ts, NULL);
    }
}

/* ---- the exchanges around one run ---- */

int perf_run_begin(int fd, const struct perf_case *c, enum perf_mode mode, size_t size, uint64_t count,
                   uint32_t window, struct perf_msg *ready)
{
    struct perf_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PERF_MSG_RUN;
    m.group = perf_case_group(c);
    m.test = c->test;
    m.transport = c->transport;
    m.mode = mode;
    m.size = size;
    m.count = count;
    m.window = window;
    int rc = perf_msg_send(fd, &m);
    return rc ? rc : perf_msg_expect(fd, PERF_MSG_READY, ready);
}

int perf_run_end(int fd, uint64_t sent, struct perf_msg *result)
{
    struct perf_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PERF_MSG_DONE;
    m.count = sent;
    int rc = perf_msg_send(fd, &m);
    return rc ? rc : perf_msg_expect(fd, PERF_MSG_RESULT, result);
}

int perf_reply(int fd, uint64_t type, const struct perf_msg *fields)
{
    struct perf_msg m;
    if (fields)
        m = *fields;
    else
        memset(&m, 0, sizeof(m));
    m.type = type;
    return perf_msg_send(fd, &m);
}
