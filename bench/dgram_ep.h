/* bench/dgram_ep.h: one endpoint of the datagram benchmarks (dgram_bench, dgram_sweep), either a kernel UDP socket
 * or the same fd adopted by the datagram socket layer (s != NULL), so each measurement runs the same code on both. */
#ifndef RS_BENCH_DGRAM_EP_H
#define RS_BENCH_DGRAM_EP_H

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "dgram_wr/dgram.h"

struct ep {
    int fd;
    struct rs_dgram_sock *s;        /* NULL: kernel UDP */
    struct sockaddr_in addr, peer;
};

static inline void ep_close(struct ep *e)
{
    if (e->s)
        rs_dgram_close(e->s);
    close(e->fd);
}

/* Both return the byte count or -errno. */
static inline ssize_t ep_send(struct ep *e, const void *buf, size_t len)
{
    if (e->s)
        return rs_dgram_sendto(e->s, buf, len, 0, (struct sockaddr *)&e->peer, sizeof(e->peer));
    ssize_t n = sendto(e->fd, buf, len, 0, (struct sockaddr *)&e->peer, sizeof(e->peer));
    return n < 0 ? -errno : n;
}

static inline ssize_t ep_recv(struct ep *e, void *buf, size_t len)
{
    if (e->s)
        return rs_dgram_recvfrom(e->s, buf, len, 0, NULL, NULL);
    ssize_t n = recvfrom(e->fd, buf, len, 0, NULL, NULL);
    return n < 0 ? -errno : n;
}

static inline void ep_set_timeout(struct ep *e, int ms)
{
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    if (e->s)
        (void)rs_dgram_setsockopt(e->s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    else
        (void)setsockopt(e->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

#endif
