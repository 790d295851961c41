/*
 * device.c: the verbs provider's entry point. Which device serves an address (asked of rdma_cm, like a
 * connect would), RDMASOCK_DEVICE as an override, the caps, the operation table, and the device's async
 * events (CQ overflow, drained send queues, fatal QP errors).
 *
 * "No device" is a normal answer: on a host without RDMA (no /sys/class/infiniband at all) libibverbs finds
 * nothing in a few microseconds and we return -ENODEV before touching rdma_cm.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>

#include "common/log.h"
#include "rnic/verbs/verbs.h"

#define DEVICE_ENV "RDMASOCK_DEVICE"

static void v_close(struct rs_rnic *rnic);

const struct rs_rnic_ops rs_v_ops = {
    .close = v_close,
    .alloc_pd = rs_v_alloc_pd,
    .dealloc_pd = rs_v_dealloc_pd,
    .reg_mr = rs_v_reg_mr,
    .dereg_mr = rs_v_dereg_mr,
    .mr_invalidate = rs_v_mr_invalidate,
    .mr_rekey = rs_v_mr_rekey,
    .create_cq = rs_v_create_cq,
    .destroy_cq = rs_v_destroy_cq,
    .cq_fd = rs_v_cq_fd,
    .cq_arm = rs_v_cq_arm,
    .cq_ack_events = rs_v_cq_ack_events,
    .poll_cq = rs_v_poll_cq,
    .create_srq = rs_v_create_srq,
    .destroy_srq = rs_v_destroy_srq,
    .create_qp = rs_v_create_qp,
    .destroy_qp = rs_v_destroy_qp,
    .qp_state = rs_v_qp_state,
    .qp_num = rs_v_qp_num,
    .qp_set_qos = rs_v_qp_set_qos,
    .qp_set_error = rs_v_qp_set_error,
    .post_send = rs_v_post_send,
    .post_send_inline = rs_v_post_send_inline,
    .post_recv = rs_v_post_recv,
    .post_srq_recv = rs_v_post_srq_recv,
    .ud_bind = rs_v_ud_bind,
    .ud_local_addr = rs_v_ud_local_addr,
    .ud_resolve_peer = rs_v_ud_resolve_peer,
    .ud_peer_free = rs_v_ud_peer_free,
    .ud_join_multicast = rs_v_ud_join_multicast,
    .ud_leave_multicast = rs_v_ud_leave_multicast,
    .ud_counters = rs_v_ud_counters,
    .xrcd_open = rs_v_xrcd_open,
    .xrcd_close = rs_v_xrcd_close,
    .create_xsrq = rs_v_create_xsrq,
    .srq_num = rs_v_srq_num,
    .cm_create = rs_v_cm_create,
    .cm_destroy = rs_v_cm_destroy,
    .cm_fd = rs_v_cm_fd,
    .cm_get_event = rs_v_cm_get_event,
    .listen = rs_v_listen,
    .listener_addr = rs_v_listener_addr,
    .listener_close = rs_v_listener_close,
    .connect = rs_v_connect,
    .accept = rs_v_accept,
    .reject = rs_v_reject,
    .disconnect = rs_v_disconnect,
    .qp_local_addr = rs_v_qp_local_addr,
};

uint64_t rs_v_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int rs_v_errno_from_rdma(int ret)
{
    /* librdmacm returns -1 with errno, or (some paths) a negative errno. */
    if (ret >= 0)
        return 0;
    if (ret != -1)
        return ret;
    return errno ? -errno : -EIO;
}

static uint32_t mtu_bytes(enum ibv_mtu mtu)
{
    switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
    }
    return 1024;
}

static bool is_wildcard(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_UNSPECIFIED(a6);
}

/*
 * Asks rdma_cm which device and port own the address, the way it decides for a bind: a synchronous cm_id
 * bound to the address with port 0 (this never touches the network). Returns the device name, or NULL.
 */
static int device_for_address(const struct sockaddr *addr, char *name, size_t name_len, uint8_t *port)
{
    struct rdma_cm_id *id = NULL;
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
        return errno ? -errno : -ENODEV;
    struct sockaddr_storage local;
    memset(&local, 0, sizeof(local));
    memcpy(&local, addr, rs_v_sockaddr_len(addr));
    if (local.ss_family == AF_INET)
        ((struct sockaddr_in *)&local)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&local)->sin6_port = 0;
    int result = -ENODEV;
    if (rdma_bind_addr(id, (struct sockaddr *)&local) == 0 && id->verbs) {
        snprintf(name, name_len, "%s", ibv_get_device_name(id->verbs->device));
        *port = id->port_num ? id->port_num : 1;
        result = 0;
    }
    rdma_destroy_id(id);
    return result;
}

/* The largest inline size the device grants an RC QP, found by asking (ibv_query_device does not say). */
static uint32_t probe_inline(struct ibv_context *ctx)
{
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
    uint32_t found = 0;
    for (uint32_t want = RS_V_MAX_INLINE; cq && want >= 16; want /= 2) {
        struct ibv_qp_init_attr init = {
            .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
            .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1,
                     .max_inline_data = want },
        };
        struct ibv_qp *qp = ibv_create_qp(pd, &init);
        if (qp) {
            found = init.cap.max_inline_data < want ? init.cap.max_inline_data : want;
            ibv_destroy_qp(qp);
            break;
        }
    }
    if (cq)
        ibv_destroy_cq(cq);
    if (pd)
        ibv_dealloc_pd(pd);
    return found;
}

static void fill_caps(struct rs_v_dev *dev, const struct ibv_port_attr *port_attr, uint32_t max_inline)
{
    struct rs_rnic_caps *caps = &dev->base.caps;
    const struct ibv_device_attr *a = &dev->attr;
    memset(caps, 0, sizeof(*caps));
    caps->kind = RS_RNIC_KIND_VERBS;
    snprintf(caps->name, sizeof(caps->name), "%s", ibv_get_device_name(dev->ctx->device));
    caps->max_qp_wr = (uint32_t)a->max_qp_wr < RS_V_MAX_QP_WR ? (uint32_t)a->max_qp_wr : RS_V_MAX_QP_WR;
    /* One SGE of every UD datagram carries our header. */
    uint32_t sge = (uint32_t)a->max_sge;
    caps->max_sge = sge > 1 ? (sge > 32 ? 31 : sge - 1) : 1;
    caps->max_inline = max_inline;
    caps->max_cqe = (uint32_t)a->max_cqe;
    caps->max_rc_msg = port_attr->max_msg_sz ? port_attr->max_msg_sz : (1u << 31);
    caps->max_ud_msg = dev->mtu - RS_V_UD_HDR_LEN;
    caps->max_record_msg = RS_V_RECORD_MAX_MSG;
    caps->max_connect_private_data = RS_V_CONNECT_PRIVATE;
    caps->max_accept_private_data = RS_V_ACCEPT_PRIVATE;
    caps->max_ird = a->max_qp_rd_atom > 255 ? 255 : (uint32_t)a->max_qp_rd_atom;
    caps->max_ord = a->max_qp_init_rd_atom > 255 ? 255 : (uint32_t)a->max_qp_init_rd_atom;
    caps->has_srq = a->max_srq > 0;
    caps->has_xrc = rs_v_xrc_supported(dev);
    caps->has_write_with_imm = !dev->is_iwarp;
    caps->has_send_with_imm = !dev->is_iwarp;
    caps->has_native_write_record = false;
    caps->mr_pins_pages = true;
    caps->copies_payload = false;
}

static int open_device(struct ibv_device *device, uint8_t port, const struct sockaddr *addr, struct rs_rnic **out)
{
    struct ibv_context *ctx = ibv_open_device(device);
    if (!ctx)
        return -ENODEV;
    struct rs_v_dev *dev = calloc(1, sizeof(*dev));
    if (!dev) {
        ibv_close_device(ctx);
        return -ENOMEM;
    }
    dev->ctx = ctx;
    dev->port = port;
    struct ibv_port_attr port_attr;
    if (ibv_query_device(ctx, &dev->attr) || ibv_query_port(ctx, port, &port_attr)) {
        ibv_close_device(ctx);
        free(dev);
        return -ENODEV;
    }
    if (port_attr.state != IBV_PORT_ACTIVE)
        RS_WARN("verbs: %s port %u is not active", ibv_get_device_name(device), (unsigned)port);
    dev->active_mtu = port_attr.active_mtu;
    dev->mtu = mtu_bytes(port_attr.active_mtu);
    dev->is_iwarp = device->transport_type == IBV_TRANSPORT_IWARP;
    if (addr)
        memcpy(&dev->addr, addr, rs_v_sockaddr_len(addr));
    /* Async events are read by the progress thread; the fd must never block it. */
    int flags = fcntl(ctx->async_fd, F_GETFL);
    fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
    pthread_mutex_init(&dev->lock, NULL);
    pthread_mutex_init(&dev->overflow_lock, NULL);
    pthread_rwlock_init(&dev->mr_lock, NULL);
    pthread_rwlock_init(&dev->qp_lock, NULL);
    atomic_init(&dev->objects, 1);
    dev->base.ops = &rs_v_ops;
    fill_caps(dev, &port_attr, probe_inline(ctx));
    RS_DEBUG("verbs: opened %s port %u, MTU %u", dev->base.caps.name, (unsigned)port, dev->mtu);
    *out = &dev->base;
    return 0;
}

static int v_open(const struct sockaddr *local_addr, struct rs_rnic **out)
{
    *out = NULL;
    if (local_addr && local_addr->sa_family != AF_INET && local_addr->sa_family != AF_INET6)
        return -ENODEV;
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n <= 0) {
        if (list)
            ibv_free_device_list(list);
        return -ENODEV;
    }
    const char *wanted = getenv(DEVICE_ENV);
    char by_addr[64] = "";
    uint8_t port = 1;
    if ((!wanted || !*wanted) && local_addr && !is_wildcard(local_addr)) {
        if (device_for_address(local_addr, by_addr, sizeof(by_addr), &port) != 0) {
            ibv_free_device_list(list);
            return -ENODEV;
        }
        wanted = by_addr;
    }
    struct ibv_device *chosen = NULL;
    for (int i = 0; i < n && !chosen; i++) {
        if (!wanted || !*wanted || strcmp(ibv_get_device_name(list[i]), wanted) == 0)
            chosen = list[i];
    }
    int result = -ENODEV;
    if (chosen)
        result = open_device(chosen, port, local_addr, out);
    else
        RS_DEBUG("verbs: no device %s", wanted ? wanted : "");
    ibv_free_device_list(list);
    return result;
}

const struct rs_rnic_provider rs_rnic_verbs_provider = {
    .kind = RS_RNIC_KIND_VERBS,
    .name = "verbs",
    .open = v_open,
};

void rs_v_dev_get(struct rs_v_dev *dev)
{
    atomic_fetch_add(&dev->objects, 1);
}

void rs_v_dev_put(struct rs_v_dev *dev)
{
    if (atomic_fetch_sub(&dev->objects, 1) != 1)
        return;
    rs_v_progress_stop(dev);
    rs_v_keymap_free(&dev->by_lkey);
    rs_v_keymap_free(&dev->by_rkey);
    rs_v_keymap_free(&dev->by_qpn);
    pthread_mutex_destroy(&dev->lock);
    pthread_mutex_destroy(&dev->overflow_lock);
    pthread_rwlock_destroy(&dev->mr_lock);
    pthread_rwlock_destroy(&dev->qp_lock);
    ibv_close_device(dev->ctx);
    free(dev);
}

static void v_close(struct rs_rnic *rnic)
{
    struct rs_v_dev *dev = rs_v_dev(rnic);
    /* The progress thread holds no reference; stop it now so nothing runs after the application let go. */
    rs_v_progress_stop(dev);
    rs_v_dev_put(dev);
}

void rs_v_register_qpn(struct rs_v_dev *dev, struct rs_v_qp *qp)
{
    pthread_rwlock_wrlock(&dev->qp_lock);
    rs_v_keymap_put(&dev->by_qpn, qp->qp->qp_num, qp);
    pthread_rwlock_unlock(&dev->qp_lock);
}

void rs_v_unregister_qpn(struct rs_v_dev *dev, struct rs_v_qp *qp)
{
    pthread_rwlock_wrlock(&dev->qp_lock);
    rs_v_keymap_del(&dev->by_qpn, qp->qp->qp_num, qp);
    pthread_rwlock_unlock(&dev->qp_lock);
}

struct rs_v_qp *rs_v_find_qpn(struct rs_v_dev *dev, uint32_t qpn)
{
    pthread_rwlock_rdlock(&dev->qp_lock);
    struct rs_v_qp *qp = rs_v_keymap_get(&dev->by_qpn, qpn);
    pthread_rwlock_unlock(&dev->qp_lock);
    return qp;
}

void rs_v_async_drain(struct rs_v_dev *dev)
{
    struct ibv_async_event event;
    while (ibv_get_async_event(dev->ctx, &event) == 0) {
        switch (event.event_type) {
        case IBV_EVENT_CQ_ERR:
            /* Only overflow puts a CQ in error (rxe: the responder could not add a completion). */
            rs_v_cq_overflowed(event.element.cq->cq_context);
            break;
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR: {
            struct rs_v_qp *qp = event.element.qp->qp_context;
            if (qp && rs_v_connected(qp))
                rs_v_qp_fail(qp, event.event_type == IBV_EVENT_QP_ACCESS_ERR ? -EACCES : -EIO);
            else if (qp)
                rs_v_ud_set_error(qp);
            break;
        }
        case IBV_EVENT_SQ_DRAINED: {
            struct rs_v_qp *qp = event.element.qp->qp_context;
            if (qp && rs_v_connected(qp))
                rs_v_rc_drained(qp);
            break;
        }
        case IBV_EVENT_COMM_EST: {
            /* Data arrived before the RTU: tell rdma_cm so the passive side completes. */
            struct rs_v_qp *qp = event.element.qp->qp_context;
            if (qp) {
                pthread_mutex_lock(&qp->lock);
                if (qp->id)
                    rdma_notify(qp->id, IBV_EVENT_COMM_EST);
                pthread_mutex_unlock(&qp->lock);
            }
            break;
        }
        case IBV_EVENT_PORT_ERR:
            RS_WARN("verbs: %s port went down", dev->base.caps.name);
            break;
        default:
            break;
        }
        ibv_ack_async_event(&event);
    }
}
