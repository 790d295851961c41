/* dgram_stats.c: what a datagram socket tells the process's statistics area (rdmasock stat, common/stats.h).
 * Only datagrams that really moved over RDMA are counted, so a socket whose peers all stayed on the kernel shows
 * zero RDMA bytes even though the datagram layer adopted it. */
#include "common/stats.h"
#include "dgram_wr/dgram_int.h"

void rs_dg_stats_addresses(struct rs_dgram_sock *s)
{
    if (!s->stats_on || s->stats_slot < 0)
        return;
    rs_stats_slot_set_addresses(s->stats_slot, s->bound ? (const struct sockaddr *)&s->local : NULL,
                                s->bound ? s->local_len : 0,
                                s->connected ? (const struct sockaddr *)&s->peer_addr : NULL,
                                s->connected ? s->peer_len : 0);
}

void rs_dg_stats_rdma_tx(struct rs_dgram_sock *s, size_t bytes)
{
    if (!s->stats_on)
        return;
    rs_stats_add_io(s->stats_slot, RS_STATS_PROTO_UDP, bytes, true);
}

void rs_dg_stats_rdma_rx(struct rs_dgram_sock *s, size_t bytes)
{
    if (!s->stats_on)
        return;
    rs_stats_add_io(s->stats_slot, RS_STATS_PROTO_UDP, bytes, false);
}

void rs_dgram_set_stats_slot(struct rs_dgram_sock *s, int slot)
{
    pthread_mutex_lock(&s->lock);
    s->stats_on = true;
    s->stats_slot = slot;
    rs_dg_stats_addresses(s);
    pthread_mutex_unlock(&s->lock);
}
