/*
 * dgram_peer.c: the peers of a datagram socket and their discovery (docs/dgram.md §3).
 *
 * A peer is a remote address (IP and port) the socket sends to, or that probed it. For sending, the rules decide
 * first (RS_ROLE_CLIENT): a kernel peer is never probed. An rdma/both peer is probed over the application's own
 * port; until it answers, `both` sends through the kernel (the peer receives plain UDP on the same port whether or
 * not it runs rdmasock, so nothing is lost) and `rdma` waits for the answer. An answer is cached for cache_ttl_ms,
 * then refreshed in the background; silence or a refusal is cached for negative_ttl_ms. Every answer carries the
 * answering socket's incarnation number, so a restarted peer (new QP, new regions) is noticed at the next refresh,
 * at once when it probes us itself, and when its RNIC refuses our Write-Records (it announces itself then).
 *
 * Multicast and broadcast destinations are never probed (there is no single answer to wait for): a rule naming a
 * group asserts that its members run rdmasock.
 */
#include <string.h>
#include <stdlib.h>

#include "common/log.h"
#include "dgram_wr/dgram_int.h"

/* ---- the table ---- */

static uint32_t key_hash(const struct rs_dg_key *k)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof(k->addr); i++)
        h = (h ^ k->addr[i]) * 16777619u;
    h = (h ^ (k->port & 0xff)) * 16777619u;
    h = (h ^ (k->port >> 8)) * 16777619u;
    return h;
}

static bool grow(struct rs_dgram_sock *s)
{
    uint32_t n = s->nbuckets ? s->nbuckets * 2 : 64;
    struct rs_dg_peer **b = calloc(n, sizeof(*b));
    if (!b)
        return false;
    for (uint32_t i = 0; i < s->nbuckets; i++) {
        struct rs_dg_peer *p = s->buckets[i];
        while (p) {
            struct rs_dg_peer *next = p->hnext;
            uint32_t j = key_hash(&p->key) & (n - 1);
            p->hnext = b[j];
            b[j] = p;
            p = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
    return true;
}

struct rs_dg_peer *rs_dg_peer_find(struct rs_dgram_sock *s, const struct sockaddr *addr)
{
    if (!s->nbuckets)
        return NULL;
    struct rs_dg_key k;
    rs_dg_key_of(addr, &k);
    for (struct rs_dg_peer *p = s->buckets[key_hash(&k) & (s->nbuckets - 1)]; p; p = p->hnext)
        if (rs_dg_key_equal(&p->key, &k))
            return p;
    return NULL;
}

struct rs_dg_peer *rs_dg_peer_get(struct rs_dgram_sock *s, const struct sockaddr *addr, socklen_t len)
{
    struct rs_dg_peer *p = rs_dg_peer_find(s, addr);
    if (p)
        return p;
    if ((s->npeers + 1 > 2 * s->nbuckets) && !grow(s))
        return NULL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->addr_len = rs_dg_addr_for_family(s->family, addr, len, &p->addr);
    if (!p->addr_len) {
        free(p);
        return NULL;
    }
    rs_dg_key_of((struct sockaddr *)&p->addr, &p->key);
    p->group = rs_dg_is_group((struct sockaddr *)&p->addr, &p->broadcast);
    p->state = RS_DG_PEER_NEW;
    uint32_t j = key_hash(&p->key) & (s->nbuckets - 1);
    p->hnext = s->buckets[j];
    s->buckets[j] = p;
    s->npeers++;
    return p;
}

void rs_dg_peers_free(struct rs_dgram_sock *s)
{
    for (uint32_t i = 0; i < s->nbuckets; i++) {
        struct rs_dg_peer *p = s->buckets[i];
        while (p) {
            struct rs_dg_peer *next = p->hnext;
            if (p->ah)
                rs_rnic_ud_peer_free(p->ah);
            free(p);
            p = next;
        }
    }
    free(s->buckets);
    s->buckets = NULL;
    s->nbuckets = s->npeers = 0;
}

/* ---- policy ---- */

static void policy(struct rs_dgram_sock *s, enum rs_role role, const struct sockaddr *addr,
                   struct rs_dgram_peer_policy *out)
{
    memset(out, 0, sizeof(*out));
    out->mode = RS_MODE_KERNEL;
    if (s->opts.policy)
        s->opts.policy(s->opts.policy_arg, role, addr, out);
    if (out->mode == RS_MODE_KERNEL || !s->dev)
        return;
    /* A rule that insists on a transport this socket's RNIC is not keeps the peer away from RDMA. */
    if ((out->transport == RS_TRANSPORT_SOFT && s->dev->kind != RS_RNIC_KIND_SOFT) ||
        (out->transport == RS_TRANSPORT_VERBS && s->dev->kind != RS_RNIC_KIND_VERBS) ||
        out->transport == RS_TRANSPORT_OFF) {
        out->mode = out->mode == RS_MODE_RDMA ? RS_MODE_RDMA : RS_MODE_KERNEL;
        out->transport = RS_TRANSPORT_OFF;
    }
}

/*
 * Whether to let in a peer that probed us (and keep its lane current). A rule may name the peer, or it may name
 * this socket's own address and port (role server or any): a receiver cannot name senders whose ports are
 * ephemeral (ffmpeg, VLC, sipp clients), and answering a probe is safe whoever sent it, since only rdmasock
 * probes. The peer's own rule, when it names one, wins.
 */
static void rx_policy(struct rs_dgram_sock *s, const struct sockaddr *src, struct rs_dgram_peer_policy *out)
{
    policy(s, RS_ROLE_SERVER, src, out);
    if (out->mode == RS_MODE_KERNEL && s->bound)
        policy(s, RS_ROLE_SERVER, (const struct sockaddr *)&s->local, out);
}

static bool tx_policy_rdma(const struct rs_dg_peer *p)
{
    return p->tx_pol.mode != RS_MODE_KERNEL && p->tx_pol.transport != RS_TRANSPORT_OFF;
}

/* ---- sending control messages ---- */

static void control_to(struct rs_dgram_sock *s, const struct sockaddr *to, socklen_t tolen, struct rs_dgw_msg *m)
{
    uint8_t buf[RS_DGW_MAX_LEN];
    m->instance = s->instance;
    size_t len = rs_dgw_encode(m, buf);
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    struct msghdr msg = { .msg_name = (void *)to, .msg_namelen = tolen, .msg_iov = &iov, .msg_iovlen = 1 };
    ssize_t n = rs_dg_sys_sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0)
        RS_DEBUG("dgram: fd %d: control message %d not sent (%d)", s->fd, (int)m->type, (int)n);
    else
        s->st.control_sent++;
}

void rs_dg_control_tx(struct rs_dgram_sock *s, struct rs_dg_peer *p, struct rs_dgw_msg *m)
{
    control_to(s, (struct sockaddr *)&p->addr, p->addr_len, m);
}

/* ---- discovery ---- */

static uint64_t ms_ns(uint32_t ms) { return (uint64_t)ms * 1000000u; }

static void send_probe(struct rs_dgram_sock *s, struct rs_dg_peer *p)
{
    struct rs_dgw_msg m;
    memset(&m, 0, sizeof(m));
    m.type = RS_DGW_PROBE;
    m.nonce = p->probe_nonce;
    m.u.probe.want = p->tx_pol.dgram == RS_DGRAM_WRECORD ? RS_DGW_WANT_LANE : 0;
    m.u.probe.rnic_kind = (uint8_t)s->dev->kind;
    rs_dg_control_tx(s, p, &m);
    p->probe_tries++;
    p->probe_deadline_ns = rs_dg_now_ns() + ms_ns(s->opts.probe_timeout_ms);
    s->st.probes_sent++;
}

void rs_dg_peer_start_probe(struct rs_dgram_sock *s, struct rs_dg_peer *p)
{
    p->probe_nonce = rs_dg_random64();
    p->probe_tries = 0;
    if (p->state == RS_DG_PEER_RDMA)
        p->refreshing = true;       /* keep sending over RDMA while the refresh is out */
    else
        p->state = RS_DG_PEER_PROBING;
    send_probe(s, p);
}

static void give_up(struct rs_dgram_sock *s, struct rs_dg_peer *p, int why)
{
    p->state = RS_DG_PEER_KERNEL;
    p->refused = why;
    p->refreshing = false;
    p->retry_ns = rs_dg_now_ns() + ms_ns(s->opts.negative_ttl_ms);
    p->lane_ok = false;
    p->sink_ok = false;
}

static void resolve(struct rs_dgram_sock *s, struct rs_dg_peer *p)
{
    if (p->ah) {
        p->state = RS_DG_PEER_RDMA;
        return;
    }
    struct rs_rnic_qos qos = { .sl = p->tx_pol.sl, .tclass = p->tx_pol.tclass };
    p->state = RS_DG_PEER_RESOLVING;
    int rc = rs_rnic_ud_resolve_peer(s->qp, s->cm, (struct sockaddr *)&p->addr, p->tx_pol.has_qos ? &qos : NULL,
                                     s->opts.probe_timeout_ms * s->opts.probe_attempts, p, &p->ah);
    if (rc) {
        RS_DEBUG("dgram: fd %d: cannot resolve a peer (%d)", s->fd, rc);
        p->ah = NULL;
        give_up(s, p, -EHOSTUNREACH);
        return;
    }
    rs_dg_cm_events(s);         /* the soft RNIC resolves at once */
}

void rs_dg_cm_events(struct rs_dgram_sock *s)
{
    if (!s->cm)
        return;
    struct rs_rnic_cm_event ev;
    while (rs_rnic_cm_get_event(s->cm, &ev) == 0) {
        struct rs_dg_peer *p = ev.context;
        if (!p || ev.ud_peer != p->ah)
            continue;
        if (ev.type == RS_RNIC_CM_EV_UD_PEER_RESOLVED && p->state == RS_DG_PEER_RESOLVING)
            p->state = RS_DG_PEER_RDMA;
        else if (ev.type == RS_RNIC_CM_EV_UD_PEER_UNREACHABLE) {
            rs_rnic_ud_peer_free(p->ah);
            p->ah = NULL;
            give_up(s, p, -EHOSTUNREACH);
        }
    }
}

static void load_tx_policy(struct rs_dgram_sock *s, struct rs_dg_peer *p)
{
    if (p->tx_pol_valid)
        return;
    policy(s, RS_ROLE_CLIENT, (struct sockaddr *)&p->addr, &p->tx_pol);
    p->tx_pol_valid = true;
}

enum rs_dg_peer_state rs_dg_peer_tx_state(struct rs_dgram_sock *s, struct rs_dg_peer *p)
{
    load_tx_policy(s, p);
    if (!tx_policy_rdma(p)) {
        p->refused = p->tx_pol.mode == RS_MODE_RDMA ? -EHOSTUNREACH : 0;
        return RS_DG_PEER_KERNEL;
    }
    if (!s->rdma_ready) {
        p->refused = s->rdma_err ? s->rdma_err : -ENODEV;
        return RS_DG_PEER_KERNEL;
    }
    uint64_t now = rs_dg_now_ns();
    if (p->group) {
        /* Every member is asserted to be an rdmasock peer: no discovery, datagram-iWARP SEND to the group. */
        if (p->state != RS_DG_PEER_RDMA && p->state != RS_DG_PEER_RESOLVING)
            resolve(s, p);
        return p->state;
    }
    switch (p->state) {
    case RS_DG_PEER_NEW:
        rs_dg_peer_start_probe(s, p);
        break;
    case RS_DG_PEER_KERNEL:
        if (now >= p->retry_ns)
            rs_dg_peer_start_probe(s, p);
        break;
    case RS_DG_PEER_PROBING:
        if (now >= p->probe_deadline_ns) {
            if (p->probe_tries < s->opts.probe_attempts)
                send_probe(s, p);
            else
                give_up(s, p, -EHOSTUNREACH);
        }
        break;
    case RS_DG_PEER_RESOLVING:
        rs_dg_cm_events(s);
        break;
    case RS_DG_PEER_RDMA:
        if (p->refreshing && now >= p->probe_deadline_ns) {
            if (p->probe_tries < s->opts.probe_attempts) {
                send_probe(s, p);
            } else if (p->tx_pol.mode == RS_MODE_BOTH) {
                give_up(s, p, -EHOSTUNREACH);       /* gone quiet: the kernel path reaches it whatever it runs */
            } else {
                p->refreshing = false;              /* rdma only: keep trying RDMA, refresh again later */
                p->refresh_ns = now + ms_ns(s->opts.cache_ttl_ms);
            }
        } else if (!p->refreshing && now >= p->refresh_ns) {
            rs_dg_peer_start_probe(s, p);
        }
        break;
    }
    return p->state;
}

/* ---- answering ---- */

/* Our answer to p (ACCEPT, with a lane when wanted and available), as ANSWER to a probe or as ANNOUNCE. */
static void answer(struct rs_dgram_sock *s, struct rs_dg_peer *p, enum rs_dgw_type type, uint64_t nonce, bool lane)
{
    struct rs_dgw_msg m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.nonce = nonce;
    m.u.answer.flags = RS_DGW_ACCEPT;
    m.u.answer.rnic_kind = (uint8_t)s->dev->kind;
    m.u.answer.qpn = rs_rnic_qp_num(s->qp);
    if (lane && !p->rx_lane)
        p->rx_lane = rs_dg_lane_new(s, p);
    if (lane && p->rx_lane) {
        m.u.answer.flags |= RS_DGW_HAS_LANE;
        m.u.answer.lane_rkey = p->rx_lane->mr->rkey;
        m.u.answer.lane_size = p->rx_lane->size;
        m.u.answer.lane_to = (uintptr_t)p->rx_lane->mem;
        m.u.answer.lane_records = RS_DG_LANE_RECORDS;
    }
    rs_dg_control_tx(s, p, &m);
    if (type == RS_DGW_ANSWER)
        s->st.answers_sent++;
    else
        s->st.announces_sent++;
}

static void refuse(struct rs_dgram_sock *s, const struct sockaddr *to, socklen_t tolen, uint64_t nonce)
{
    struct rs_dgw_msg m;
    memset(&m, 0, sizeof(m));
    m.type = RS_DGW_ANSWER;
    m.nonce = nonce;
    m.u.answer.rnic_kind = s->dev ? (uint8_t)s->dev->kind : 0;
    control_to(s, to, tolen, &m);
    s->st.refusals_sent++;
}

/* The peer's socket is a new incarnation: what we knew about its regions, and the lane we kept for the old one,
 * are void. */
static void peer_restarted(struct rs_dgram_sock *s, struct rs_dg_peer *p, uint64_t instance)
{
    if (p->instance && p->instance != instance) {
        s->st.peer_restarts++;
        RS_DEBUG("dgram: fd %d: a peer restarted; its state is re-discovered", s->fd);
        p->lane_ok = false;
        p->sink_ok = false;
        if (p->rx_lane) {
            rs_dg_lane_retire(s, p->rx_lane);
            p->rx_lane = NULL;
        }
        if (p->state == RS_DG_PEER_RDMA && !p->refreshing)
            p->refresh_ns = 0;      /* refresh at the next send: the new incarnation may want a lane again */
    }
    p->instance = instance;
}

static void take_lane(struct rs_dg_peer *p, const struct rs_dgw_msg *m)
{
    if (!(m->u.answer.flags & RS_DGW_HAS_LANE)) {
        p->lane_ok = false;
        return;
    }
    if (!p->lane_ok || p->lane_rkey != m->u.answer.lane_rkey || p->lane_to != m->u.answer.lane_to ||
        p->lane_size != m->u.answer.lane_size) {
        /* A new lane (or a new incarnation of it) starts empty at position 0. */
        p->lane_head = p->lane_consumed = 0;
        p->lane_written = p->lane_consumed_records = 0;
    }
    p->lane_ok = true;
    p->lane_rkey = m->u.answer.lane_rkey;
    p->lane_to = m->u.answer.lane_to;
    p->lane_size = m->u.answer.lane_size;
    p->lane_records = m->u.answer.lane_records;
}

static void on_answer(struct rs_dgram_sock *s, const struct rs_dgw_msg *m, const struct sockaddr *src)
{
    struct rs_dg_peer *p = rs_dg_peer_find(s, src);
    bool announce = m->type == RS_DGW_ANNOUNCE;
    if (announce)
        s->st.announces_received++;
    if (!p || !s->rdma_ready)
        return;
    if (!announce && (m->nonce != p->probe_nonce || (p->state != RS_DG_PEER_PROBING && !p->refreshing)))
        return;     /* a late answer to an older probe */
    load_tx_policy(s, p);
    if (!tx_policy_rdma(p) || p->group)
        return;
    if (!announce)
        s->st.answers_received++;
    if (!(m->u.answer.flags & RS_DGW_ACCEPT) || m->u.answer.rnic_kind != (uint8_t)s->dev->kind) {
        s->st.refusals_received++;
        give_up(s, p, -ECONNREFUSED);
        return;
    }
    peer_restarted(s, p, m->instance);
    take_lane(p, m);
    p->refreshing = false;
    p->probe_tries = 0;
    p->refresh_ns = rs_dg_now_ns() + ms_ns(s->opts.cache_ttl_ms);
    if (p->state != RS_DG_PEER_RDMA)
        resolve(s, p);
}

static void on_probe(struct rs_dgram_sock *s, const struct rs_dgw_msg *m, const struct sockaddr *src,
                     socklen_t src_len)
{
    s->st.probes_received++;
    struct rs_dgram_peer_policy pol;
    rx_policy(s, src, &pol);
    bool ok = s->rdma_ready && pol.mode != RS_MODE_KERNEL && pol.transport != RS_TRANSPORT_OFF &&
              m->u.probe.rnic_kind == (uint8_t)s->dev->kind;
    struct rs_dg_peer *p = ok ? rs_dg_peer_get(s, src, src_len) : NULL;
    if (!p) {
        refuse(s, src, src_len, m->nonce);
        return;
    }
    peer_restarted(s, p, m->instance);
    answer(s, p, RS_DGW_ANSWER, m->nonce, (m->u.probe.want & RS_DGW_WANT_LANE) != 0);
}

void rs_dg_peer_stale(struct rs_dgram_sock *s, struct rs_dg_peer *p)
{
    uint64_t now = rs_dg_now_ns();
    if (!s->rdma_ready || (p->announce_ns && now - p->announce_ns < ms_ns(RS_DG_ANNOUNCE_GAP_MS)))
        return;
    struct rs_dgram_peer_policy pol;
    rx_policy(s, (struct sockaddr *)&p->addr, &pol);
    if (pol.mode == RS_MODE_KERNEL || pol.transport == RS_TRANSPORT_OFF)
        return;
    p->announce_ns = now;
    /* It Write-Records to us, so it wants a lane: give it a current one. */
    answer(s, p, RS_DGW_ANNOUNCE, 0, true);
}

static void on_sink(struct rs_dgram_sock *s, const struct rs_dgw_msg *m, const struct sockaddr *src)
{
    struct rs_dg_peer *p = rs_dg_peer_find(s, src);
    if (!p || p->state != RS_DG_PEER_RDMA || p->instance != m->instance)
        return;
    p->sink_ok = true;
    p->sink_id = m->u.sink.sink_id;
    p->sink_rkey = m->u.sink.rkey;
    p->sink_to = m->u.sink.to;
    p->sink_len = m->u.sink.len;
    p->sink_ns = rs_dg_now_ns();
}

static void on_consumed(struct rs_dgram_sock *s, const struct rs_dgw_msg *m, const struct sockaddr *src)
{
    struct rs_dg_peer *p = rs_dg_peer_find(s, src);
    if (!p || !p->lane_ok || p->lane_rkey != m->u.consumed.lane_rkey || p->instance != m->instance)
        return;
    /* Reports may arrive out of order or not at all: only a report further on moves the window. */
    if (m->u.consumed.consumed > p->lane_consumed && m->u.consumed.consumed <= p->lane_head)
        p->lane_consumed = m->u.consumed.consumed;
    if ((int32_t)(m->u.consumed.records - p->lane_consumed_records) > 0 &&
        (int32_t)(p->lane_written - m->u.consumed.records) >= 0)
        p->lane_consumed_records = m->u.consumed.records;
}

static void on_bye(struct rs_dgram_sock *s, const struct rs_dgw_msg *m, const struct sockaddr *src)
{
    struct rs_dg_peer *p = rs_dg_peer_find(s, src);
    if (!p || (p->instance && p->instance != m->instance))
        return;
    p->instance = 0;
    p->lane_ok = false;
    p->sink_ok = false;
    p->refreshing = false;
    if (p->state == RS_DG_PEER_RDMA || p->state == RS_DG_PEER_PROBING || p->state == RS_DG_PEER_KERNEL)
        p->state = RS_DG_PEER_NEW;      /* probe again at the next send; meanwhile `both` uses the kernel */
    if (p->rx_lane) {
        /* The goodbye came through the kernel socket, which is read before the CQ: the peer's last
         * Write-Records, sent before it, may still wait there. Take them in before the lane stops accepting
         * (over verbs every record of a burst sent just before close was dropped). */
        rs_dg_rx_poll_cq(s);
        if (p->rx_lane) {
            rs_dg_lane_retire(s, p->rx_lane);
            p->rx_lane = NULL;
        }
    }
}

void rs_dg_control_rx(struct rs_dgram_sock *s, const struct rs_dgw_msg *m, const struct sockaddr *src,
                      socklen_t src_len)
{
    s->st.control_received++;
    switch (m->type) {
    case RS_DGW_PROBE:
        on_probe(s, m, src, src_len);
        break;
    case RS_DGW_ANSWER:
    case RS_DGW_ANNOUNCE:
        on_answer(s, m, src);
        break;
    case RS_DGW_SINK:
        on_sink(s, m, src);
        break;
    case RS_DGW_CONSUMED:
        on_consumed(s, m, src);
        break;
    case RS_DGW_BYE:
        on_bye(s, m, src);
        break;
    }
}

void rs_dg_peers_bye(struct rs_dgram_sock *s)
{
    if (!s->rdma_ready)
        return;
    for (uint32_t i = 0; i < s->nbuckets; i++) {
        for (struct rs_dg_peer *p = s->buckets[i]; p; p = p->hnext) {
            if (p->group || (p->state != RS_DG_PEER_RDMA && !p->rx_lane && !p->instance))
                continue;
            struct rs_dgw_msg m;
            memset(&m, 0, sizeof(m));
            m.type = RS_DGW_BYE;
            rs_dg_control_tx(s, p, &m);
        }
    }
}

bool rs_dgram_test_peer_rdma(struct rs_dgram_sock *s, const struct sockaddr *peer)
{
    pthread_mutex_lock(&s->lock);
    rs_dg_progress(s);
    struct rs_dg_peer *p = rs_dg_peer_find(s, peer);
    bool rdma = p && p->state == RS_DG_PEER_RDMA;
    pthread_mutex_unlock(&s->lock);
    return rdma;
}
