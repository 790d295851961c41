/*
 * rulecheck: does a config rule's stream options reach the SDP connections it converts? One process, a listener on
 * 127.0.0.1:PORT and a writer thread that connects to it; run under LD_PRELOAD=librdmasock.so with a rule for the
 * port (tests/suites/config_runtime.sh). The writer sends SIZE MiB of a counting pattern in nonblocking 256 KiB
 * writes (so the bytes wait in its send ring, where lending the ring applies), the reader takes them in 1 MiB reads
 * and checks every byte. Then the writer's socket is asked, at rdmasock's option level, for its lend-ring option,
 * its zero-copy threshold and its statistics.
 *
 *   usage: rulecheck PORT SIZE_MIB
 *   Output, one line: "intact=yes|no bytes=N lend_ring=V threshold=T ring_lends=L ring_lent_bytes=B"; exit 0 when
 *   every byte arrived intact and the socket answered at rdmasock's level (an SDP connection), 1 otherwise.
 *
 * The Makefile links helpers with librdmasock.a, which leaves the interposers out; the interposed calls are
 * referenced weakly as well (see waitcheck.c), so this stays a plain program that binds to the preloaded library.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sdp_stream/sdp.h"         /* RS_SOL_SDP, RS_SDP_LEND_RING, RS_SDP_ZCOPY_THRESHOLD, RS_SDP_STATS */

#pragma weak socket
#pragma weak bind
#pragma weak listen
#pragma weak accept
#pragma weak connect
#pragma weak close
#pragma weak recv
#pragma weak send
#pragma weak poll
#pragma weak getsockopt
#pragma weak setsockopt

#define CHUNK (256u * 1024u)
#define READ_SIZE (1024u * 1024u)

struct writer {
    int port;
    size_t total;
    int fd;             /* the connected socket, left open for the questions asked after the transfer */
    int error;
};

static uint8_t pattern_at(size_t i) { return (uint8_t)(i * 7 + (i >> 13)); }

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)w->port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    w->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (w->fd < 0 || connect(w->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        w->error = errno;
        return NULL;
    }
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        w->error = ENOMEM;
        return NULL;
    }
    size_t sent = 0;
    while (sent < w->total) {
        size_t n = w->total - sent < CHUNK ? w->total - sent : CHUNK;
        for (size_t i = 0; i < n; i++)
            buf[i] = pattern_at(sent + i);
        size_t off = 0;
        while (off < n) {
            ssize_t r = send(w->fd, buf + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (r > 0) {
                off += (size_t)r;
            } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                struct pollfd p = { .fd = w->fd, .events = POLLOUT };
                if (poll(&p, 1, 10000) <= 0) {
                    w->error = ETIMEDOUT;
                    free(buf);
                    return NULL;
                }
            } else {
                w->error = r < 0 ? errno : EPIPE;
                free(buf);
                return NULL;
            }
        }
        sent += n;
    }
    free(buf);
    return NULL;
}

static int get_opt(int fd, int name, void *val, socklen_t len)
{
    socklen_t got = len;
    return getsockopt(fd, RS_SOL_SDP, name, val, &got) == 0 && got == len ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: rulecheck PORT SIZE_MIB\n");
        return 2;
    }
    struct writer w = { .port = atoi(argv[1]), .total = (size_t)atoi(argv[2]) << 20, .fd = -1 };
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)w.port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 4) < 0) {
        perror("rulecheck: listener");
        return 1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, writer_main, &w) != 0)
        return 1;
    int s = accept(l, NULL, NULL);
    uint8_t *buf = malloc(READ_SIZE);
    size_t got = 0;
    bool intact = s >= 0 && buf;
    while (intact && got < w.total) {
        ssize_t r = recv(s, buf, READ_SIZE, 0);
        if (r <= 0) {
            fprintf(stderr, "rulecheck: recv after %zu bytes: %s\n", got, r < 0 ? strerror(errno) : "end of stream");
            intact = false;
            break;
        }
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] != pattern_at(got + (size_t)i)) {
                fprintf(stderr, "rulecheck: byte %zu differs\n", got + (size_t)i);
                intact = false;
                break;
            }
        }
        got += (size_t)r;
    }
    pthread_join(t, NULL);
    if (w.error)
        fprintf(stderr, "rulecheck: writer: %s\n", strerror(w.error));
    int lend = -2, threshold = -2;
    struct rs_sdp_stats st;
    memset(&st, 0, sizeof(st));
    bool sdp = w.fd >= 0 && get_opt(w.fd, RS_SDP_LEND_RING, &lend, sizeof(lend)) == 0 &&
               get_opt(w.fd, RS_SDP_ZCOPY_THRESHOLD, &threshold, sizeof(threshold)) == 0 &&
               get_opt(w.fd, RS_SDP_STATS, &st, sizeof(st)) == 0;
    printf("intact=%s bytes=%zu lend_ring=%d threshold=%d ring_lends=%llu ring_lent_bytes=%llu\n",
           intact && !w.error ? "yes" : "no", got, lend, threshold, (unsigned long long)st.ring_lends,
           (unsigned long long)st.ring_lent_bytes);
    free(buf);
    close(s);
    close(w.fd);
    close(l);
    return intact && !w.error && sdp ? 0 : 1;
}
