/*
 * provider.h: what an RNIC provider (soft, verbs) implements behind rnic.h. Protocol layers never include this.
 *
 * Every object a provider hands out starts with the base struct below (embed it as the first member and cast),
 * so rnic.c can reach the provider's operations from any object with one indirect call.
 */
#ifndef RS_RNIC_PROVIDER_H
#define RS_RNIC_PROVIDER_H

#include "rnic/rnic.h"

struct rs_rnic_ops;

struct rs_rnic {
    const struct rs_rnic_ops *ops;
    struct rs_rnic_caps caps;
};
struct rs_rnic_pd { struct rs_rnic *rnic; };
struct rs_rnic_cq { struct rs_rnic *rnic; };
struct rs_rnic_srq { struct rs_rnic *rnic; };
struct rs_rnic_qp { struct rs_rnic *rnic; void *context; };
struct rs_rnic_cm { struct rs_rnic *rnic; };
struct rs_rnic_listener { struct rs_rnic *rnic; };
struct rs_rnic_conn_request { struct rs_rnic *rnic; };
struct rs_rnic_ud_peer { struct rs_rnic *rnic; };
struct rs_rnic_xrcd { struct rs_rnic *rnic; };

/* The request rs_rnic_post_send_inline stands for (one inline SEND), posted by the provider's post_send: what
 * rnic.c does for a provider without post_send_inline, and what one with it does for a request it does not take
 * itself (a QP in ERROR flushes it, another type refuses it). */
int rs_rnic_post_send_inline_by_wr(struct rs_rnic_qp *qp, uint64_t wr_id, const struct rs_rnic_sge *sge,
                                   unsigned flags, bool with_imm, uint32_t imm_data);

/* One entry per rnic.h call, same arguments and meaning (see rnic.h). */
struct rs_rnic_ops {
    void (*close)(struct rs_rnic *rnic);
    int (*alloc_pd)(struct rs_rnic *rnic, struct rs_rnic_pd **out);
    int (*dealloc_pd)(struct rs_rnic_pd *pd);
    int (*reg_mr)(struct rs_rnic_pd *pd, void *addr, size_t length, unsigned access, struct rs_rnic_mr **out);
    int (*dereg_mr)(struct rs_rnic_mr *mr);
    int (*mr_invalidate)(struct rs_rnic_mr *mr);
    int (*mr_rekey)(struct rs_rnic_mr *mr);
    int (*create_cq)(struct rs_rnic *rnic, uint32_t depth, struct rs_rnic_cq **out);
    int (*destroy_cq)(struct rs_rnic_cq *cq);
    int (*cq_fd)(const struct rs_rnic_cq *cq);
    int (*cq_arm)(struct rs_rnic_cq *cq, bool solicited_only);
    void (*cq_ack_events)(struct rs_rnic_cq *cq);
    int (*poll_cq)(struct rs_rnic_cq *cq, int n, struct rs_rnic_wc *wc);
    /* Optional (NULL: no fds, nothing to end): progress on the waiting thread (rnic.h). */
    int (*cq_wait_begin)(struct rs_rnic_cq *cq, int *fds, int max);
    void (*cq_wait_recheck)(struct rs_rnic_cq *cq);
    void (*cq_wait_end)(struct rs_rnic_cq *cq);
    int (*create_srq)(struct rs_rnic_pd *pd, uint32_t max_wr, uint32_t max_sge, struct rs_rnic_srq **out);
    int (*destroy_srq)(struct rs_rnic_srq *srq);
    int (*create_qp)(struct rs_rnic_pd *pd, const struct rs_rnic_qp_attr *attr, struct rs_rnic_qp **out);
    int (*destroy_qp)(struct rs_rnic_qp *qp);
    enum rs_rnic_qp_state (*qp_state)(const struct rs_rnic_qp *qp);
    uint32_t (*qp_num)(const struct rs_rnic_qp *qp);
    int (*qp_set_qos)(struct rs_rnic_qp *qp, const struct rs_rnic_qos *qos);
    int (*qp_set_error)(struct rs_rnic_qp *qp);
    int (*post_send)(struct rs_rnic_qp *qp, struct rs_rnic_send_wr *wr, struct rs_rnic_send_wr **bad_wr);
    /* Optional (NULL: rnic.c makes the request and calls post_send): rs_rnic_post_send_inline. */
    int (*post_send_inline)(struct rs_rnic_qp *qp, uint64_t wr_id, const struct rs_rnic_sge *sge, unsigned flags,
                            bool with_imm, uint32_t imm_data);
    int (*post_recv)(struct rs_rnic_qp *qp, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
    int (*post_srq_recv)(struct rs_rnic_srq *srq, struct rs_rnic_recv_wr *wr, struct rs_rnic_recv_wr **bad_wr);
    int (*ud_bind)(struct rs_rnic_qp *qp, const struct sockaddr *local, socklen_t len);
    int (*ud_local_addr)(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);
    int (*ud_resolve_peer)(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *peer,
                           const struct rs_rnic_qos *qos, uint32_t timeout_ms, void *context,
                           struct rs_rnic_ud_peer **out);
    void (*ud_peer_free)(struct rs_rnic_ud_peer *peer);
    int (*ud_join_multicast)(struct rs_rnic_qp *qp, const struct sockaddr *group, const struct sockaddr *iface);
    int (*ud_leave_multicast)(struct rs_rnic_qp *qp, const struct sockaddr *group);
    /* Optional (NULL: -EOPNOTSUPP from rnic.c): a socket layer copes without them (docs/dgram.md). */
    int (*ud_adopt_fd)(struct rs_rnic_qp *qp, const struct rs_rnic_ud_adopt *how);
    int (*ud_set_raw_limits)(struct rs_rnic_qp *qp, uint32_t raw_max_bytes, uint32_t raw_max_count);
    int (*ud_take_raw)(struct rs_rnic_qp *qp, struct rs_rnic_raw_dgram **out);
    int (*ud_counters)(const struct rs_rnic_qp *qp, struct rs_rnic_ud_counters *out);
    /* Optional (NULL: -EOPNOTSUPP from rnic.c): XRC, for devices that have it. */
    int (*xrcd_open)(struct rs_rnic *rnic, int fd, struct rs_rnic_xrcd **out);
    int (*xrcd_close)(struct rs_rnic_xrcd *xrcd);
    int (*create_xsrq)(struct rs_rnic_pd *pd, struct rs_rnic_xrcd *xrcd, struct rs_rnic_cq *cq, uint32_t max_wr,
                       uint32_t max_sge, struct rs_rnic_srq **out);
    uint32_t (*srq_num)(const struct rs_rnic_srq *srq);
    int (*cm_create)(struct rs_rnic *rnic, struct rs_rnic_cm **out);
    void (*cm_destroy)(struct rs_rnic_cm *cm);
    int (*cm_fd)(const struct rs_rnic_cm *cm);
    int (*cm_get_event)(struct rs_rnic_cm *cm, struct rs_rnic_cm_event *ev);
    int (*listen)(struct rs_rnic_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                  struct rs_rnic_listener **out);
    int (*listener_addr)(const struct rs_rnic_listener *listener, struct sockaddr_storage *out);
    void (*listener_close)(struct rs_rnic_listener *listener);
    void (*listener_park)(struct rs_rnic_listener *listener);     /* optional: NULL closes */
    int (*listener_intake)(struct rs_rnic_listener *listener, unsigned want, uint32_t seen);  /* optional */
    int (*connect)(struct rs_rnic_qp *qp, struct rs_rnic_cm *cm, const struct sockaddr *dst, socklen_t len,
                   const void *private_data, uint32_t private_data_len, uint32_t timeout_ms);
    int (*accept)(struct rs_rnic_conn_request *request, struct rs_rnic_qp *qp, struct rs_rnic_cm *cm,
                  const void *private_data, uint32_t private_data_len);
    int (*reject)(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len);
    int (*disconnect)(struct rs_rnic_qp *qp);
    int (*qp_local_addr)(const struct rs_rnic_qp *qp, struct sockaddr_storage *out);
    bool (*qp_reads_placed_directly)(const struct rs_rnic_qp *qp);  /* optional: NULL answers false */
};

/* A provider: how rs_rnic_open finds it. */
struct rs_rnic_provider {
    enum rs_rnic_kind kind;
    const char *name;
    /* -ENODEV when it has no device that serves local_addr (NULL: any). */
    int (*open)(const struct sockaddr *local_addr, struct rs_rnic **out);
};

/* Defined by each provider's device file. The references are strong on purpose: a weak reference does not pull
 * a member out of a static archive, so a program linked with librdmasock.a would silently lack a provider. */
extern const struct rs_rnic_provider rs_rnic_soft_provider;
extern const struct rs_rnic_provider rs_rnic_verbs_provider;

#endif /* RS_RNIC_PROVIDER_H */
