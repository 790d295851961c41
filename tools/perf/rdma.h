/*
 * rdma.h: rdmasock-perf's RNIC endpoints, shared by rdma_ep.c (set-up, posting, waiting) and rdma_run.c (the
 * measurement loops). Everything goes through rnic.h only, so the same code measures the soft and verbs providers.
 */
#ifndef RS_PERF_RDMA_H
#define RS_PERF_RDMA_H

#include "perf.h"

#define PERF_RQ_DEPTH 4096u         /* posted receives per QP: a burst of small UD datagrams must find one */
#define PERF_CREDIT_BATCH 1024u     /* RC send bw: the receiver returns credits in batches of this many */
#define PERF_WC_BATCH 64
#define PERF_REPOST_BATCH 32u       /* receives are reposted in chains of this many while streaming */
#define PERF_UD_READ_INFLIGHT (4u << 20)    /* UD READ bw: response bytes in flight (half the soft RNIC's rcvbuf) */
#define PERF_UD_READ_TIMEOUT_MS 250 /* a UD READ whose response has not come by then was lost (loopback) */

/* wait result when the control connection has something to read */
#define PERF_WAIT_CTRL (-100000)

struct perf_ep {
    bool up;
    enum perf_group group;
    struct rs_rnic_cq *cq;                  /* send and receive completions of the QP */
    struct rs_rnic_cm *cm;
    struct rs_rnic_qp *qp;
    struct rs_rnic_listener *listener;      /* RC server */
    struct rs_rnic_ud_peer *peer;           /* UD: the other side */
    uint8_t *buf;                           /* one region for everything: data is never checked, only moved */
    size_t buf_len;
    struct rs_rnic_mr *mr;
    uint64_t remote_addr;                   /* the peer's region */
    uint32_t remote_rkey;
    uint64_t remote_len;
    uint32_t sq_depth, rq_depth;
    uint32_t ord;                           /* READs in flight at most */
    /* send queue accounting: a signaled completion's wr_id says how many work requests it retires */
    uint32_t sq_outstanding;
    uint32_t unsignaled;
    uint32_t sig_every;
    uint32_t rq_missing;                    /* receives consumed and not reposted yet */
    struct rs_rnic_recv_wr recv_wr[PERF_REPOST_BATCH];
    struct rs_rnic_sge recv_sge[PERF_REPOST_BATCH];
};

struct perf_rdma {
    int kind;
    bool poll;
    struct rs_rnic *rnic;
    struct rs_rnic_pd *pd;
    struct perf_ep ep[2];                   /* PERF_GROUP_UD, PERF_GROUP_RC */
};

/* Posts a SEND, WRITE_RECORD, WRITE or READ of size bytes from/to the start of the local buffer and the peer's
 * region. signal forces a completion; otherwise one comes every ep->sig_every requests. 0 or -errno. */
int perf_ep_post(struct perf_ep *ep, enum rs_rnic_wr_opcode op, size_t size, bool signal);
/* RC: WRITE of size bytes followed by a zero-byte SEND that tells the peer the data is there, in one chain. */
int perf_ep_post_write_notice(struct perf_ep *ep, size_t size);
/* Reposts the receives consumed so far (all when force, else only a full chain). */
int perf_ep_repost(struct perf_ep *ep, bool force);
/*
 * Waits for completions: returns how many were written to wc (>0), 0 on timeout, PERF_WAIT_CTRL when ctrl_fd
 * (if >= 0) became readable first, or -errno. Send-side completions are accounted here (sq_outstanding) and still
 * returned; a completion with an error status other than the ones UD may legitimately report fails the wait.
 */
int perf_ep_wait(struct perf_rdma *r, struct perf_ep *ep, struct rs_rnic_wc *wc, int max, int ctrl_fd,
                 int timeout_ms);
/* Waits until every signaled send-side request has completed; receives that complete meanwhile are counted in
 * *recvs (may be NULL) and reposted. */
int perf_ep_drain(struct perf_rdma *r, struct perf_ep *ep, uint64_t *recvs);

#endif /* RS_PERF_RDMA_H */
