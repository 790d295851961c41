/*
 * ud_qp.c: the datagram QP's life: its UDP socket (rs_rnic_ud_bind), peers (address handles), multicast groups,
 * quality of service, the ERROR state, and the timer that runs its timeouts.
 *
 * One UDP socket per QP, as in datagram-iWARP: the QP number is not carried on the wire, the socket's address and
 * port name the QP. The socket is watched by the device's progress thread, which places inbound datagrams.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "rnic/soft/ud.h"

#define UD_RCVBUF (8u << 20)
#define UD_SNDBUF (4u << 20)
#define UD_RX_BUDGET 64u

struct rs_soft_ud_peer {
    struct rs_rnic_ud_peer base;
    struct sockaddr_storage addr;
    socklen_t len;
    struct rs_rnic_qos qos;
    bool qos_set;
};

struct rs_ud_mcast {
    struct rs_ud_mcast *next;
    struct sockaddr_storage group;
    struct sockaddr_storage iface;
    bool has_iface;
};

static void ud_timer_cb(struct rs_soft_timer *t, void *arg)
{
    (void)t;
    struct rs_soft_ud *ud = arg;
    rs_soft_qp_expire(ud->qp, rs_soft_now_ns());
}

int rs_soft_ud_qp_create(struct rs_soft_qp *qp)
{
    struct rs_soft_ud *ud = calloc(1, sizeof(*ud));
    if (!ud)
        return -ENOMEM;
    ud->qp = qp;
    ud->fd = -1;
    ud->next_msn = ud->next_record_id = ud->next_read_msn = 1;
    if (getrandom(&ud->tag_state, sizeof(ud->tag_state), GRND_NONBLOCK) != (ssize_t)sizeof(ud->tag_state))
        ud->tag_state = rs_soft_now_ns() ^ ((uintptr_t)ud << 16);
    ud->tag_state |= 1;
    pthread_mutex_init(&ud->rx_lock, NULL);
    ud->timer = rs_soft_timer_new(qp->dev, ud_timer_cb, ud);
    if (!ud->timer) {
        pthread_mutex_destroy(&ud->rx_lock);
        free(ud);
        return -ENOMEM;
    }
    qp->ud = ud;
    return 0;
}

/* Forgets reassembly and record state (their receives are flushed by the caller) and fails pending READs. */
static void reset_rx_state(struct rs_soft_ud *ud)
{
    pthread_mutex_lock(&ud->rx_lock);
    rs_ud_read_flush(ud);
    memset(ud->partial, 0, sizeof(ud->partial));
    rs_ud_record_reset(ud);
    pthread_mutex_unlock(&ud->rx_lock);
}

void rs_soft_ud_qp_destroy(struct rs_soft_qp *qp)
{
    struct rs_soft_ud *ud = qp->ud;
    if (!ud)
        return;
    rs_soft_qp_set_state(qp, RS_QPS_ERROR);
    /* The send path changes the watch under sq_lock from any thread (and from the loop's timer): take it away under
     * that lock first, so no late change can reach a watch being freed. */
    pthread_mutex_lock(&qp->sq_lock);
    struct rs_soft_watch *watch = ud->watch;
    ud->watch = NULL;
    pthread_mutex_unlock(&qp->sq_lock);
    /* Synchronous: once these return, the progress thread no longer touches this QP. */
    rs_soft_watch_del(watch);
    rs_soft_timer_free(ud->timer);
    ud->timer = NULL;
    reset_rx_state(ud);
    if (ud->fd >= 0 && !ud->adopted)
        rs_soft_sys_close(ud->fd);
    while (ud->raw_head) {
        struct rs_rnic_raw_dgram *d = ud->raw_head;
        ud->raw_head = d->next;
        free(d);
    }
    while (ud->mcast) {
        struct rs_ud_mcast *m = ud->mcast;
        ud->mcast = m->next;
        free(m);
    }
    pthread_mutex_destroy(&ud->rx_lock);
    free(ud->scratch);
    free(ud);
    qp->ud = NULL;
}

void rs_soft_ud_set_error(struct rs_soft_qp *qp)
{
    /* The socket stays open and watched: datagrams that still arrive are read and dropped (the QP is not RTS),
     * so they do not pile up in the kernel. */
    reset_rx_state(qp->ud);
}

void rs_soft_ud_expire(struct rs_soft_qp *qp, uint64_t now_ns)
{
    struct rs_soft_ud *ud = qp->ud;
    if (!ud)
        return;
    pthread_mutex_lock(&ud->rx_lock);
    ud->timer_deadline_ns = 0;
    uint64_t next = 0;
    uint64_t d[3] = { rs_ud_partial_expire(ud, now_ns), rs_ud_record_expire(ud, now_ns),
                      rs_ud_read_expire(ud, now_ns) };
    for (int i = 0; i < 3; i++)
        if (d[i] && (!next || d[i] < next))
            next = d[i];
    if (next)
        rs_ud_note_deadline(ud, next);
    pthread_mutex_unlock(&ud->rx_lock);
    if (__atomic_exchange_n(&ud->tx_stalled, false, __ATOMIC_ACQ_REL))
        rs_ud_tx_kick(ud);
}

void rs_ud_note_deadline(struct rs_soft_ud *ud, uint64_t deadline_ns)
{
    rs_soft_qp_note_deadline(ud->qp, deadline_ns);
    if (ud->timer_deadline_ns && ud->timer_deadline_ns <= deadline_ns)
        return;
    ud->timer_deadline_ns = deadline_ns;
    uint64_t now = rs_soft_now_ns();
    uint64_t ms = deadline_ns > now ? (deadline_ns - now + 999999) / 1000000 : 1;
    if (ms == 0)
        ms = 1;
    if (ms > UINT32_MAX)
        ms = UINT32_MAX;
    if (ud->timer)
        rs_soft_timer_arm(ud->timer, (uint32_t)ms);
}

/* ---- socket ---- */

static void ud_io_cb(struct rs_soft_watch *w, int fd, unsigned revents, void *arg)
{
    (void)w;
    (void)fd;
    struct rs_soft_ud *ud = arg;
    if (revents & RS_SOFT_EV_READ)
        rs_ud_rx_socket(ud, UD_RX_BUDGET);
    if (revents & RS_SOFT_EV_WRITE)
        rs_ud_tx_kick(ud);
}

static void set_buffer(int fd, int force_name, int name, unsigned bytes)
{
    int v = (int)bytes;
    /* FORCE works with CAP_NET_ADMIN and ignores rmem_max/wmem_max; otherwise the kernel caps the plain option. */
    if (rs_soft_sys_setsockopt(fd, SOL_SOCKET, force_name, &v, sizeof(v)) != 0)
        (void)rs_soft_sys_setsockopt(fd, SOL_SOCKET, name, &v, sizeof(v));
}

static int apply_tclass(int fd, int family, uint8_t tclass)
{
    int v = tclass;
    if (family == AF_INET)
        return rs_soft_sys_setsockopt(fd, IPPROTO_IP, IP_TOS, &v, sizeof(v));
    return rs_soft_sys_setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &v, sizeof(v));
}

int rs_soft_ud_bind(struct rs_rnic_qp *pqp, const struct sockaddr *local, socklen_t len)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    struct rs_soft_ud *ud = qp->ud;
    if (qp->type != RS_QPT_UD || !ud)
        return -EINVAL;
    if (!local || (local->sa_family == AF_INET && len < sizeof(struct sockaddr_in)) ||
        (local->sa_family == AF_INET6 && len < sizeof(struct sockaddr_in6)) ||
        (local->sa_family != AF_INET && local->sa_family != AF_INET6))
        return -EINVAL;
    if (rs_soft_qp_get_state(qp) != RS_QPS_INIT || ud->fd >= 0)
        return -EINVAL;
    int fd = rs_soft_sys_socket(local->sa_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_UDP);
    if (fd < 0)
        return fd;
    int one = 1;
    /* Untagged sends may go to a broadcast address. */
    (void)rs_soft_sys_setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one));
    /* A segmented message arrives as a burst of up to 64 datagrams of 63 KiB: room for a few of them keeps the
     * kernel from dropping while the progress thread places the previous ones. */
    set_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, UD_RCVBUF);
    set_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, UD_SNDBUF);
    if (qp->qos.tclass)
        (void)apply_tclass(fd, local->sa_family, qp->qos.tclass);
    int rc = rs_soft_sys_bind(fd, local, len);
    if (rc) {
        rs_soft_sys_close(fd);
        return rc;
    }
    if (local->sa_family == AF_INET) {
        /* Multicast sent from a QP bound to one address leaves through that address's interface (so a QP bound to
         * 127.0.0.1 reaches groups joined on loopback). */
        const struct sockaddr_in *sin = (const struct sockaddr_in *)local;
        if (sin->sin_addr.s_addr != htonl(INADDR_ANY)) {
            struct in_addr ifaddr = sin->sin_addr;
            (void)rs_soft_sys_setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ifaddr, sizeof(ifaddr));
        }
    }
    ud->fd = fd;
    ud->family = local->sa_family;
    ud->watch = rs_soft_watch_add(qp->dev, fd, RS_SOFT_EV_READ, ud_io_cb, ud);
    if (!ud->watch) {
        ud->fd = -1;
        rs_soft_sys_close(fd);
        return -ENOMEM;
    }
    rs_soft_qp_set_state(qp, RS_QPS_RTS);
    return 0;
}

int rs_soft_ud_adopt_fd(struct rs_rnic_qp *pqp, const struct rs_rnic_ud_adopt *how)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    struct rs_soft_ud *ud = qp->ud;
    if (qp->type != RS_QPT_UD || !ud || !how || how->fd < 0)
        return -EINVAL;
    if (rs_soft_qp_get_state(qp) != RS_QPS_INIT || ud->fd >= 0)
        return -EINVAL;
    int type = 0;
    socklen_t tlen = sizeof(type);
    int rc = rs_soft_sys_getsockopt(how->fd, SOL_SOCKET, SO_TYPE, &type, &tlen);
    if (rc)
        return rc;
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    memset(&local, 0, sizeof(local));
    rc = rs_soft_sys_getsockname(how->fd, (struct sockaddr *)&local, &llen);
    if (rc)
        return rc;
    if (type != SOCK_DGRAM || (local.ss_family != AF_INET && local.ss_family != AF_INET6))
        return -EINVAL;
    uint16_t port = local.ss_family == AF_INET ? ((struct sockaddr_in *)&local)->sin_port
                                               : ((struct sockaddr_in6 *)&local)->sin6_port;
    if (port == 0)
        return -EINVAL;         /* the application's port is the QP's name: it must be bound */
    /* Only the kernel buffers change: the RNIC drains the socket on its own thread, and the socket layer keeps
     * the application's SO_RCVBUF for its own accounting. Every other option stays the application's. */
    set_buffer(how->fd, SO_RCVBUFFORCE, SO_RCVBUF, UD_RCVBUF);
    set_buffer(how->fd, SO_SNDBUFFORCE, SO_SNDBUF, UD_SNDBUF);
    pthread_mutex_lock(&ud->rx_lock);
    ud->adopted = true;
    ud->raw_max_bytes = how->raw_max_bytes;
    ud->raw_max_count = how->raw_max_count;
    pthread_mutex_unlock(&ud->rx_lock);
    ud->fd = how->fd;
    ud->family = local.ss_family;
    ud->watch = rs_soft_watch_add(qp->dev, ud->fd, RS_SOFT_EV_READ, ud_io_cb, ud);
    if (!ud->watch) {
        ud->fd = -1;
        ud->adopted = false;
        return -ENOMEM;
    }
    rs_soft_qp_set_state(qp, RS_QPS_RTS);
    return 0;
}

int rs_soft_ud_set_raw_limits(struct rs_rnic_qp *pqp, uint32_t raw_max_bytes, uint32_t raw_max_count)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    struct rs_soft_ud *ud = qp->ud;
    if (qp->type != RS_QPT_UD || !ud || !ud->adopted)
        return -EINVAL;
    pthread_mutex_lock(&ud->rx_lock);
    ud->raw_max_bytes = raw_max_bytes;
    ud->raw_max_count = raw_max_count;
    pthread_mutex_unlock(&ud->rx_lock);
    return 0;
}

int rs_soft_ud_take_raw(struct rs_rnic_qp *pqp, struct rs_rnic_raw_dgram **out)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    struct rs_soft_ud *ud = qp->ud;
    *out = NULL;
    if (qp->type != RS_QPT_UD || !ud)
        return -EINVAL;
    pthread_mutex_lock(&ud->rx_lock);
    struct rs_rnic_raw_dgram *d = ud->raw_head;
    if (d) {
        ud->raw_head = d->next;
        if (!ud->raw_head)
            ud->raw_tail = NULL;
        ud->raw_count--;
        ud->raw_bytes -= d->len;
        d->next = NULL;
    }
    pthread_mutex_unlock(&ud->rx_lock);
    if (!d)
        return -EAGAIN;
    *out = d;
    return 0;
}

int rs_soft_ud_counters(const struct rs_rnic_qp *pqp, struct rs_rnic_ud_counters *out)
{
    const struct rs_soft_qp *qp = (const struct rs_soft_qp *)pqp;
    if (qp->type != RS_QPT_UD || !qp->ud)
        return -EINVAL;
    const uint64_t *src = (const uint64_t *)&qp->ud->counters;
    uint64_t *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    return 0;
}

int rs_soft_ud_local_addr(const struct rs_rnic_qp *pqp, struct sockaddr_storage *out)
{
    const struct rs_soft_qp *qp = (const struct rs_soft_qp *)pqp;
    if (qp->type != RS_QPT_UD || !qp->ud || qp->ud->fd < 0)
        return -EINVAL;
    socklen_t len = sizeof(*out);
    memset(out, 0, sizeof(*out));
    return rs_soft_sys_getsockname(qp->ud->fd, (struct sockaddr *)out, &len);
}

int rs_soft_ud_set_qos(struct rs_soft_qp *qp, const struct rs_rnic_qos *qos)
{
    struct rs_soft_ud *ud = qp->ud;
    if (!ud || ud->fd < 0)
        return 0;           /* applied at bind */
    return apply_tclass(ud->fd, ud->family, qos->tclass);
}

/* ---- peers ---- */

/* Puts peer into the form the QP's socket sends to (IPv4 peers of an IPv6 socket become v4-mapped). */
static int normalise_peer(int family, const struct sockaddr *peer, struct sockaddr_storage *out, socklen_t *len)
{
    memset(out, 0, sizeof(*out));
    if (peer->sa_family == AF_INET && family != AF_INET6) {
        memcpy(out, peer, sizeof(struct sockaddr_in));
        *len = sizeof(struct sockaddr_in);
        return 0;
    }
    if (peer->sa_family == AF_INET6 && family != AF_INET) {
        memcpy(out, peer, sizeof(struct sockaddr_in6));
        *len = sizeof(struct sockaddr_in6);
        return 0;
    }
    if (peer->sa_family == AF_INET && family == AF_INET6) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)peer;
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)out;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = sin->sin_port;
        s6->sin6_addr.s6_addr[10] = 0xff;
        s6->sin6_addr.s6_addr[11] = 0xff;
        memcpy(&s6->sin6_addr.s6_addr[12], &sin->sin_addr, 4);
        *len = sizeof(*s6);
        return 0;
    }
    return -EAFNOSUPPORT;
}

int rs_soft_ud_resolve_peer(struct rs_rnic_qp *pqp, struct rs_rnic_cm *cm, const struct sockaddr *peer,
                            const struct rs_rnic_qos *qos, uint32_t timeout_ms, void *context,
                            struct rs_rnic_ud_peer **out)
{
    (void)timeout_ms;
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    if (qp->type != RS_QPT_UD || !qp->ud || !peer || !out)
        return -EINVAL;
    if (peer->sa_family != AF_INET && peer->sa_family != AF_INET6)
        return -EAFNOSUPPORT;
    struct rs_soft_ud_peer *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    int rc = normalise_peer(qp->ud->fd >= 0 ? qp->ud->family : AF_UNSPEC, peer, &p->addr, &p->len);
    if (rc) {
        free(p);
        return rc;
    }
    p->base.rnic = pqp->rnic;
    if (qos) {
        p->qos = *qos;
        p->qos_set = true;
    }
    *out = &p->base;
    if (cm) {
        struct rs_rnic_cm_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = RS_RNIC_CM_EV_UD_PEER_RESOLVED;
        ev.qp = pqp;
        ev.ud_peer = &p->base;
        ev.context = context;
        memcpy(&ev.peer, &p->addr, p->len);
        rc = rs_soft_cm_push(rs_soft_cm(cm), &ev);
        if (rc) {
            free(p);
            *out = NULL;
            return rc;
        }
    }
    return 0;
}

void rs_soft_ud_peer_free(struct rs_rnic_ud_peer *peer)
{
    free(peer);
}

void rs_soft_ud_fill_peer(struct rs_soft_send_wqe *e, const struct rs_rnic_ud_peer *ppeer)
{
    const struct rs_soft_ud_peer *peer = (const struct rs_soft_ud_peer *)ppeer;
    memcpy(&e->peer, &peer->addr, sizeof(e->peer));
    e->peer_len = peer->len;
    e->peer_qos = peer->qos;
    e->peer_qos_set = peer->qos_set;
}

/* ---- multicast ---- */

static int mcast_op(struct rs_soft_ud *ud, const struct sockaddr *group, const struct sockaddr *iface, bool join)
{
    if (group->sa_family == AF_INET && ud->family == AF_INET) {
        struct ip_mreqn m;
        memset(&m, 0, sizeof(m));
        m.imr_multiaddr = ((const struct sockaddr_in *)group)->sin_addr;
        if (!IN_MULTICAST(ntohl(m.imr_multiaddr.s_addr)))
            return -EINVAL;
        if (iface && iface->sa_family == AF_INET)
            m.imr_address = ((const struct sockaddr_in *)iface)->sin_addr;
        return rs_soft_sys_setsockopt(ud->fd, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m,
                                      sizeof(m));
    }
    if (group->sa_family == AF_INET6 && ud->family == AF_INET6) {
        struct ipv6_mreq m;
        memset(&m, 0, sizeof(m));
        m.ipv6mr_multiaddr = ((const struct sockaddr_in6 *)group)->sin6_addr;
        if (!IN6_IS_ADDR_MULTICAST(&m.ipv6mr_multiaddr))
            return -EINVAL;
        if (iface && iface->sa_family == AF_INET6)
            m.ipv6mr_interface = ((const struct sockaddr_in6 *)iface)->sin6_scope_id;
        return rs_soft_sys_setsockopt(ud->fd, IPPROTO_IPV6, join ? IPV6_JOIN_GROUP : IPV6_LEAVE_GROUP, &m,
                                      sizeof(m));
    }
    return -EAFNOSUPPORT;
}

static socklen_t addr_len(const struct sockaddr *a)
{
    return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int rs_soft_ud_join_multicast(struct rs_rnic_qp *pqp, const struct sockaddr *group, const struct sockaddr *iface)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    struct rs_soft_ud *ud = qp->ud;
    if (qp->type != RS_QPT_UD || !ud || ud->fd < 0 || !group)
        return -EINVAL;
    struct rs_ud_mcast *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    int rc = mcast_op(ud, group, iface, true);
    if (rc) {
        free(m);
        return rc;
    }
    memcpy(&m->group, group, addr_len(group));
    if (iface) {
        memcpy(&m->iface, iface, addr_len(iface));
        m->has_iface = true;
    }
    pthread_mutex_lock(&qp->sq_lock);
    m->next = ud->mcast;
    ud->mcast = m;
    pthread_mutex_unlock(&qp->sq_lock);
    return 0;
}

static bool same_group(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                  sizeof(struct in6_addr)) == 0;
}

int rs_soft_ud_leave_multicast(struct rs_rnic_qp *pqp, const struct sockaddr *group)
{
    struct rs_soft_qp *qp = rs_soft_qp(pqp);
    struct rs_soft_ud *ud = qp->ud;
    if (qp->type != RS_QPT_UD || !ud || ud->fd < 0 || !group)
        return -EINVAL;
    pthread_mutex_lock(&qp->sq_lock);
    struct rs_ud_mcast **link = &ud->mcast;
    while (*link && !same_group(&(*link)->group, group))
        link = &(*link)->next;
    struct rs_ud_mcast *m = *link;
    if (m)
        *link = m->next;
    pthread_mutex_unlock(&qp->sq_lock);
    if (!m)
        return -ENOENT;
    int rc = mcast_op(ud, group, m->has_iface ? (const struct sockaddr *)&m->iface : NULL, false);
    free(m);
    return rc;
}
