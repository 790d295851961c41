/* rnic.c: the provider-independent side of rnic.h. Choosing a device, then one indirect call per operation
 * into the provider that made the object (see provider.h). */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "rnic/provider.h"

int rs_rnic_open(int kind, const struct sockaddr *local_addr, struct rs_rnic **out)
{
    /* Auto prefers a kernel-bypass device that serves the address, then the software RNIC. */
    const struct rs_rnic_provider *order[] = { &rs_rnic_verbs_provider, &rs_rnic_soft_provider };
    int result = -ENODEV;
    *out = NULL;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        const struct rs_rnic_provider *provider = order[i];
        if (!provider || (kind != 0 && (int)provider->kind != kind))
            continue;
        result = provider->open(local_addr, out);
        if (result == 0)
            return 0;
    }
    return result;
}

const struct rs_rnic_caps *rs_rnic_caps(const struct rs_rnic *rnic)
{
    return &rnic->caps;
}

void *rs_rnic_qp_context(const struct rs_rnic_qp *qp)
{
    return qp->context;
}

void rs_rnic_close(struct rs_rnic *rnic)
{
    rnic->ops->close(rnic);
}

int rs_rnic_alloc_pd(struct rs_rnic *rnic, struct rs_rnic_pd **out)
{
    return rnic->ops->alloc_pd(rnic, out);
}

int rs_rnic_dealloc_pd(struct rs_rnic_pd *pd)
{
    return pd->rnic->ops->dealloc_pd(pd);
}

int rs_rnic_reg_mr(struct rs_rnic_pd *pd, void *addr, size_t length, unsigned access, struct rs_rnic_mr **out)
{
    return pd->rnic->ops->reg_mr(pd, addr, length, access, out);
}

int rs_rnic_dereg_mr(struct rs_rnic_mr *mr)
{
    return mr->pd->rnic->ops->dereg_mr(mr);
}

int rs_rnic_mr_invalidate(struct rs_rnic_mr *mr)
{
    return mr->pd->rnic->ops->mr_invalidate(mr);
}

int rs_rnic_mr_rekey(struct rs_rnic_mr *mr)
{
    return mr->pd->rnic->ops->mr_rekey(mr);
}

int rs_rnic_create_cq(struct rs_rnic *rnic, uint32_t depth, struct rs_rnic_cq **out)
{
    return rnic->ops->create_cq(rnic, depth, out);
}

int rs_rnic_destroy_cq(struct rs_rnic_cq *cq)
{
    return cq->rnic->ops->destroy_cq(cq);
}

int rs_rnic_cq_fd(const struct rs_rnic_cq *cq)
{
    return cq->rnic->ops->cq_fd(cq);
}

int rs_rnic_cq_arm(struct rs_rnic_cq *cq, bool solicited_only)
{
    return cq->rnic->ops->cq_arm(cq, solicited_only);
}

void rs_rnic_cq_ack_events(struct rs_rnic_cq *cq)
{
    cq->rnic->ops->cq_ack_events(cq);
}

int rs_rnic_poll_cq(struct rs_rnic_cq *cq, int n, struct rs_rnic_wc *wc)
{
    return cq->rnic->ops->poll_cq(cq, n, wc);
}

int rs_rnic_cq_wait_begin(struct rs_rnic_cq *cq, int *fds, int max)
{
    if (!cq->rnic->ops->cq_wait_begin)
        return 0;
    return cq->rnic->ops->cq_wait_begin(cq, fds, max);
}

void rs_rnic_cq_wait_recheck(struct rs_rnic_cq *cq)
{
    if (cq->rnic->ops->cq_wait_recheck)
        cq->rnic->ops->cq_wait_recheck(cq);
}

void rs_rnic_cq_wait_end(struct rs_rnic_cq *cq)
{
    if (cq->rnic->ops->cq_wait_end)
        cq->rnic->ops->cq_wait_end(cq);
}

int rs_rnic_create_srq(struct rs_rnic_pd *pd, uint32_t max_wr, uint32_t max_sge, struct rs_rnic_srq **out)
{
    return pd->rnic->ops->create_srq(pd, max_wr, max_sge, out);
}

int rs_rnic_destroy_srq(struct rs_rnic_srq *srq)
{
    return srq->rnic->ops->destroy_srq(srq);
}

int rs_rnic_create_qp(struct rs_rnic_pd *pd, const struct rs_rnic_qp_attr *attr, struct rs_rnic_qp **out)
{
    return pd->rnic->ops->create_qp(pd, attr, out);
}

int rs_rnic_destroy_qp(struct rs_rnic_qp *qp)
{
    return qp->rnic->ops->destroy_qp(qp);
}

enum rs_rnic_qp_state rs_rnic_qp_state(const struct rs_rnic_qp *qp)
{
    return qp->rnic->ops->qp_state(qp);
}

uint32_t rs_rnic_qp_num(const struct rs_rnic_qp *qp)
{
    return qp->rnic->ops->qp_num(qp);
}

int rs_rnic_qp_set_qos(struct rs_rnic_qp *qp, const struct rs_rnic_qos *qos)
{
    return qp->rnic->ops->qp_set_qos(qp, qos);
}

int rs_rnic_qp_set_error(struct rs_rnic_qp *qp)
{
    return qp->rnic->ops->qp_set_error(qp);
}

int rs_rnic_post_send(struct rs_rnic_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr)
{
    return qp->rnic->ops->post_send(qp, wr, bad_wr);
}

int rs_rnic_post_send_inline(struct rs_rnic_qp *qp, uint64_t wr_id, const struct rs_rnic_sge *sge, unsigned flags,
                             bool with_imm, uint32_t imm_data)
{
    if (qp->rnic->ops->post_send_inline)
        return qp->rnic->ops->post_send_inline(qp, wr_id, sge, flags, with_imm, imm_data);
    return rs_rnic_post_send_inline_by_wr(qp, wr_id, sge, flags, with_imm, imm_data);
}

int rs_rnic_post_send_inline_by_wr(struct rs_rnic_qp *qp, uint64_t wr_id, const struct rs_rnic_sge *sge,
                                   unsigned flags, bool with_imm, uint32_t imm_data)
{
    struct rs_rnic_send_wr wr = {
        .wr_id = wr_id, .opcode = with_imm ? RS_WR_SEND_WITH_IMM : RS_WR_SEND, .flags = flags | RS_SEND_INLINE,
        .sg_list = (struct rs_rnic_sge *)sge, .num_sge = 1, .imm_data = imm_data,
    };
    return qp->rnic->ops->post_send(qp, &wr, NULL);
}

int rs_rnic_post_recv(struct rs_rnic_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    return qp->rnic->ops->post_recv(qp, wr, bad_wr);
}

int rs_rnic_post_srq_recv(struct rs_rnic_srq *srq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr)
{
    return srq->rnic->ops->post_srq_recv(srq, wr, bad_wr);
}

int rs_rnic_ud_bind(struct rs_rnic_qp *qp, const struct sockaddr *local, socklen_t len)
{
    return qp->rnic->ops->ud_bind(qp, local, len);
}

int rs_rnic_ud_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out)
{
    return qp->rnic->ops->ud_local_addr(qp, out);
}

int rs_rnic_ud_resolve_peer(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *peer, const struct rs_rnic_qos *qos, uint32_t timeout_ms, void *context, struct rs_rnic_ud_peer **out)
{
    return qp->rnic->ops->ud_resolve_peer(qp, cm, peer, qos, timeout_ms, context, out);
}

void rs_rnic_ud_peer_free(struct rs_rnic_ud_peer *peer)
{
    peer->rnic->ops->ud_peer_free(peer);
}

int rs_rnic_ud_join_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group, const struct sockaddr *iface)
{
    return qp->rnic->ops->ud_join_multicast(qp, group, iface);
}

int rs_rnic_ud_leave_multicast(struct rs_rnic_qp *qp, const struct sockaddr *group)
{
    return qp->rnic->ops->ud_leave_multicast(qp, group);
}

int rs_rnic_ud_adopt_fd(struct rs_rnic_qp *qp, const struct rs_rnic_ud_adopt *how)
{
    return qp->rnic->ops->ud_adopt_fd ? qp->rnic->ops->ud_adopt_fd(qp, how) : -EOPNOTSUPP;
}

int rs_rnic_ud_set_raw_limits(struct rs_rnic_qp *qp, uint32_t raw_max_bytes, uint32_t raw_max_count)
{
    return qp->rnic->ops->ud_set_raw_limits ? qp->rnic->ops->ud_set_raw_limits(qp, raw_max_bytes, raw_max_count)
                                            : -EOPNOTSUPP;
}

int rs_rnic_ud_take_raw(struct rs_rnic_qp *qp, struct rs_rnic_raw_dgram **out)
{
    *out = NULL;
    return qp->rnic->ops->ud_take_raw ? qp->rnic->ops->ud_take_raw(qp, out) : -EAGAIN;
}

int rs_rnic_ud_counters(const struct rs_rnic_qp *qp, struct rs_rnic_ud_counters *out)
{
    return qp->rnic->ops->ud_counters ? qp->rnic->ops->ud_counters(qp, out) : -EOPNOTSUPP;
}

int rs_rnic_xrcd_open(struct rs_rnic *rnic, int fd, struct rs_rnic_xrcd **out)
{
    *out = NULL;
    return rnic->ops->xrcd_open ? rnic->ops->xrcd_open(rnic, fd, out) : -EOPNOTSUPP;
}

int rs_rnic_xrcd_close(struct rs_rnic_xrcd *xrcd)
{
    return xrcd->rnic->ops->xrcd_close ? xrcd->rnic->ops->xrcd_close(xrcd) : -EOPNOTSUPP;
}

int rs_rnic_create_xsrq(struct rs_rnic_pd *pd, struct rs_rnic_xrcd *xrcd, struct rs_rnic_cq *cq, uint32_t max_wr,
                        uint32_t max_sge, struct rs_rnic_srq **out)
{
    *out = NULL;
    return pd->rnic->ops->create_xsrq ? pd->rnic->ops->create_xsrq(pd, xrcd, cq, max_wr, max_sge, out)
                                      : -EOPNOTSUPP;
}

uint32_t rs_rnic_srq_num(const struct rs_rnic_srq *srq)
{
    return srq->rnic->ops->srq_num ? srq->rnic->ops->srq_num(srq) : 0;
}

int rs_rnic_cm_create(struct rs_rnic *rnic, struct rs_rnic_cm **out)
{
    return rnic->ops->cm_create(rnic, out);
}

void rs_rnic_cm_destroy(struct rs_rnic_cm *cm)
{
    cm->rnic->ops->cm_destroy(cm);
}

int rs_rnic_cm_fd(const struct rs_rnic_cm *cm)
{
    return cm->rnic->ops->cm_fd(cm);
}

int rs_rnic_cm_get_event(struct rs_rnic_cm *cm, struct rs_rnic_cm_event *ev)
{
    return cm->rnic->ops->cm_get_event(cm, ev);
}

int rs_rnic_listen(struct rs_rnic_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog, struct rs_rnic_listener **out)
{
    return cm->rnic->ops->listen(cm, addr, len, backlog, out);
}

int rs_rnic_listener_addr(const struct rs_rnic_listener *listener, struct sockaddr_storage *out)
{
    return listener->rnic->ops->listener_addr(listener, out);
}

void rs_rnic_listener_park(struct rs_rnic_listener *listener)
{
    if (listener->rnic->ops->listener_park)
        listener->rnic->ops->listener_park(listener);
    else
        listener->rnic->ops->listener_close(listener);
}

int rs_rnic_listener_intake(struct rs_rnic_listener *listener, unsigned want, uint32_t seen)
{
    if (!listener->rnic->ops->listener_intake)
        return -EOPNOTSUPP;
    return listener->rnic->ops->listener_intake(listener, want, seen);
}

void rs_rnic_listener_close(struct rs_rnic_listener *listener)
{
    listener->rnic->ops->listener_close(listener);
}

int rs_rnic_connect(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *dst, socklen_t len, const void *private_data, uint32_t private_data_len, uint32_t timeout_ms)
{
    return qp->rnic->ops->connect(qp, cm, dst, len, private_data, private_data_len, timeout_ms);
}

int rs_rnic_accept(struct rs_rnic_conn_request *request, struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const void *private_data, uint32_t private_data_len)
{
    return request->rnic->ops->accept(request, qp, cm, private_data, private_data_len);
}

int rs_rnic_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len)
{
    return request->rnic->ops->reject(request, private_data, private_data_len);
}

int rs_rnic_disconnect(struct rs_rnic_qp *qp)
{
    return qp->rnic->ops->disconnect(qp);
}

bool rs_rnic_qp_reads_placed_directly(const struct rs_rnic_qp *qp)
{
    return qp->rnic->ops->qp_reads_placed_directly && qp->rnic->ops->qp_reads_placed_directly(qp);
}

int rs_rnic_qp_local_addr(const struct rs_rnic_qp *qp, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (!qp->rnic->ops->qp_local_addr)
        return -EOPNOTSUPP;
    return qp->rnic->ops->qp_local_addr(qp, out);
}
