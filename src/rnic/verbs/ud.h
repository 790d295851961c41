/*
 * ud.h: the UD emulation's internals, shared by ud.c (framing, send and receive paths, peers) and record.c
 * (Write-Record and RDMA READ over datagrams).
 *
 * Every datagram the provider sends on a UD QP carries a 40-byte header (big-endian) in front of the payload:
 *
 *    0  magic 0xd5 | version 1 | opcode | flags        opcode: 1 SEND, 2 WRITE_RECORD, 3 READ request,
 *    4  source port (16) | group port (16)                     4 READ response
 *    8  message id                                     flags: 1 last datagram, 2 solicited, 4 refused
 *   12  message length
 *   16  offset of this datagram's payload in the message
 *   20  STag (WRITE_RECORD target, READ source)
 *   24  address (64): WRITE_RECORD message start, READ source
 *   32  segment length (WRITE_RECORD validity unit)
 *   36  reserved
 *
 * A message longer than one datagram (path MTU minus the header) is cut into datagrams that the receiver puts
 * back together in the posted receive (SEND) or in the target region (WRITE_RECORD). The source IP comes from
 * the GRH the device hands us, the source port from the header: together they are what wc.src reports.
 *
 * The group port is 0 except in datagrams sent to a multicast group: there it is the port of the group address
 * the sender named, and a QP attached to the group takes only those whose group port is its own (a group reaches
 * every QP attached to it; a UDP socket joined to a group only sees the datagrams sent to its port).
 */
#ifndef RS_RNIC_VERBS_UD_H
#define RS_RNIC_VERBS_UD_H

#include "rnic/verbs/verbs.h"

#define RS_VUD_MAGIC 0xd5
#define RS_VUD_VERSION 1

enum rs_vud_opcode { RS_VUD_SEND = 1, RS_VUD_RECORD = 2, RS_VUD_READ_REQ = 3, RS_VUD_READ_RESP = 4 };
enum rs_vud_flags { RS_VUD_F_LAST = 1, RS_VUD_F_SOLICITED = 2, RS_VUD_F_REFUSED = 4 };

struct rs_vud_hdr {
    uint8_t opcode, flags;
    uint16_t src_port;
    uint16_t group_port;            /* multicast datagrams: the port the sender addressed; otherwise 0 */
    uint32_t msg_id, msg_len, offset, rkey, seg_len;
    uint64_t addr;
};

void rs_vud_hdr_encode(const struct rs_vud_hdr *h, uint8_t *out);
bool rs_vud_hdr_decode(const uint8_t *in, size_t len, struct rs_vud_hdr *h);

/* Where a datagram came from. */
struct rs_v_src {
    uint8_t gid[16];                /* IPv4-mapped for IPv4 */
    uint32_t qpn;
    struct sockaddr_storage addr;   /* IP from the GRH, port from our header */
};

enum rs_v_job_kind { RS_V_JOB_SEND, RS_V_JOB_RECORD, RS_V_JOB_READ, RS_V_JOB_READ_RESP };

/* One work request on its way out as datagrams (or an answer to a peer's READ). */
struct rs_v_job {
    struct rs_v_job *next;
    enum rs_v_job_kind kind;
    uint64_t wr_id;
    bool signaled, solicited;
    bool done;                      /* nothing more will happen; completes when it reaches the head */
    bool reported;                  /* its completion already went out (flush) */
    enum rs_rnic_wc_status status;
    struct rs_v_peer *peer;         /* application jobs: a reference */
    struct ibv_ah *ah;              /* READ responses: an AH made from the request */
    uint32_t remote_qpn;
    uint32_t msg_id;
    uint64_t len;
    uint32_t ndgrams, posted, completed;
    uint32_t seg_len;
    uint64_t remote_addr;
    uint32_t rkey;
    int num_sge;
    struct rs_rnic_sge *sge;
    struct rs_v_mr **mrs;           /* references that keep the ibv_mr alive while the device reads */
    uint8_t *inline_data;
    int cur_sge;                    /* gather cursor for the next datagram */
    uint64_t cur_off;
    uint64_t deadline_ms;           /* READ */
    uint64_t received;              /* READ */
};

enum rs_v_msg_state { RS_V_MSG_ACTIVE, RS_V_MSG_DONE };

/* A Write-Record segment being put together (buf NULL: the slot is free). */
struct rs_v_stage {
    uint8_t *buf;
    uint32_t cap;
    uint32_t seg;
    uint32_t next_off;              /* end of the bytes taken so far, in the segment: datagrams must come in order */
};

/* A message being put back together (segmented SEND or WRITE_RECORD), or a finished one remembered for a while
 * so its stragglers are recognised and dropped. */
struct rs_v_msg {
    struct rs_v_msg *hnext;
    struct rs_v_msg *prev, *next;   /* age list */
    uint8_t gid[16];
    uint32_t qpn, msg_id;
    enum rs_v_msg_state state;
    uint8_t opcode;
    uint64_t deadline_ms, done_ms;
    struct rs_v_src src;
    /* SEND */
    struct rs_v_recv *recv;
    uint64_t received;
    /* WRITE_RECORD */
    uint32_t rkey, msg_len, seg_len;
    uint64_t addr, region_base;
    uint32_t seg_bytes[RS_V_RECORD_SEGMENTS];
    uint64_t map;
    uint64_t lost;                  /* segments given up before they were whole: their datagrams are dropped */
    uint32_t valid;
    bool solicited;
    /* Segments of several datagrams are put together here and placed only when whole, so a segment the map
     * calls invalid leaves the region untouched (record.c). */
    struct rs_v_stage stage[RS_V_RECORD_STAGES];
};

/* A multicast group a UD QP joined (rs_rnic_ud_join_multicast): its own rdma_cm id on the progress thread's
 * channel (a listening id cannot join), resolved towards the group, then joined; the join's answer gives the
 * MGID and MLID the QP is attached with. */
enum rs_v_mc_state { RS_V_MC_RESOLVING, RS_V_MC_JOINING, RS_V_MC_JOINED, RS_V_MC_FAILED };

struct rs_v_mcast {
    struct rs_v_mcast *next;
    struct rs_v_idref ref;          /* RS_V_ID_UDBIND: its events reach rs_v_ud_cm_event with the QP */
    struct rdma_cm_id *id;
    struct sockaddr_storage group;
    struct sockaddr_storage src;    /* the local address the join goes out from (family AF_UNSPEC: any) */
    enum rs_v_mc_state state;
    int error;                      /* RS_V_MC_FAILED */
    bool join_sent;                 /* rdma_join_multicast was called: a leave is owed */
    bool attached;                  /* ibv_attach_mcast done */
    struct ibv_ah_attr ah_attr;     /* from the join: MGID in grh.dgid, MLID in dlid */
    uint32_t remote_qpn, qkey;
};

/* Timer runs in a row the progress thread may postpone because the application holds a lock (ud.c). */
#define RS_V_TIMER_MAX_SKIPS 8

struct rs_v_ud {
    struct rs_v_qp *qp;
    struct ibv_cq *cq;
    struct rdma_cm_id *bind_id;
    struct rs_v_idref bind_ref;
    struct sockaddr_storage local;
    uint16_t port;
    atomic_bool bound;
    atomic_bool error;
    uint32_t mtu, chunk;
    /* receive ring: GRH + one datagram per slot */
    uint8_t *rbuf;
    struct ibv_mr *rmr;
    uint32_t rcount, rsize;
    /* send slots: our header (+ inline data) per datagram in flight */
    uint8_t *sbuf;
    struct ibv_mr *smr;
    uint32_t scount, ssize;
    struct rs_v_job **sjob;
    uint32_t *sfree, nsfree;
    /* slots handed to the device, oldest first: only some datagrams are signaled, and a UD send queue completes
     * in order, so a completion retires every slot posted before it too */
    uint32_t *sposted, sposted_head, nsposted;
    uint32_t unsignaled;            /* datagrams posted since the last signaled one */
    uint32_t dev_inline;            /* largest datagram the device QP takes inline (0: none) */
    struct ibv_sge *ssge;           /* per slot: the datagram's gather list (header + payload pieces) */
    uint32_t nssge;                 /* entries per slot */
    struct ibv_send_wr batch[32];   /* datagrams prepared, posted with one doorbell */
    uint32_t nbatch;
    pthread_mutex_t progress_lock;  /* one at a time runs the internal CQ: the thread or a polling caller */
    /* Who runs the internal CQ (ud_progress.c): the progress thread is woken by it only while nobody polls. */
    atomic_uint app_polls;          /* polls of a CQ this QP completes to, by the application */
    uint32_t polls_seen;            /* app_polls at the progress thread's last look (progress_lock) */
    bool notify_armed;              /* the internal CQ is armed for the progress thread (progress_lock) */
    bool backlog;                   /* the thread stopped running the CQ with work left (progress_lock) */
    uint64_t duty_check_ms;         /* while not armed: when the thread looks again (progress_lock) */
    uint32_t duty_tick_ms;          /* ... and the interval, doubling while the polls go on (progress_lock) */
    uint32_t timer_skips;           /* timer runs in a row that found a lock busy (progress thread) */
    uint64_t wakeups;               /* internal CQ events the thread handled (progress_lock; read relaxed) */
    pthread_mutex_t tx_lock;
    struct rs_v_job *app_head, *app_tail;   /* posted, in order */
    struct rs_v_job *resp_head, *resp_tail; /* READ answers */
    uint32_t app_outstanding;
    uint32_t next_msg_id;
    atomic_uint qos_gen;
    pthread_mutex_t rx_lock;
    struct rs_v_msg **buckets;
    uint32_t nbuckets;
    struct rs_v_msg *age_head, *age_tail;
    /* Write-Record staging (record.c): bytes held in stages, and a few spare buffers kept for the next ones */
    uint64_t staged_bytes;
    struct rs_v_stage stage_spare[RS_V_RECORD_STAGES];
    uint64_t dropped;               /* SEND messages with no receive posted */
    uint64_t refused;               /* datagrams refused: malformed, protection, stragglers */
    uint64_t no_room;               /* Write-Records dropped: the recv CQ had no slot to report them */
    uint32_t records_active;        /* Write-Records being put together, each owed a completion */
    uint32_t sends_active;          /* segmented SENDs being put together (each holds a posted receive) */
    /* multicast groups joined; mc_cond wakes a joining thread when the progress thread moved a join on */
    pthread_mutex_t mc_lock;
    pthread_cond_t mc_cond;
    struct rs_v_mcast *mcast;
};

/* ud.c */
void rs_v_ud_tx_pump(struct rs_v_ud *ud);
void rs_v_ud_release(struct rs_v_ud *ud);
struct rs_v_job *rs_v_job_new(uint32_t num_sge, size_t inline_len);
void rs_v_job_free(struct rs_v_job *job);
struct rs_v_msg *rs_v_msg_find(struct rs_v_ud *ud, const struct rs_v_src *src, uint32_t msg_id);
struct rs_v_msg *rs_v_msg_new(struct rs_v_ud *ud, const struct rs_v_src *src, uint32_t msg_id, uint8_t opcode,
                              uint64_t deadline_ms);
void rs_v_msg_done(struct rs_v_ud *ud, struct rs_v_msg *m, uint64_t now_ms);
void rs_v_send_completion(struct rs_v_ud *ud, struct rs_v_job *job);
/* Runs the internal CQ until it is empty (progress_lock held). */
void rs_v_ud_run_cq(struct rs_v_qp *qp);
/* The same until the clock reaches until_ms (0: no limit; one batch at least); true when it stopped with
 * completions maybe left. The progress thread runs a QP this way, so that a long job (a send queue that refills
 * itself from its own completions: 8 MiB of Write-Record kept it busy for 270 ms in the VM) cannot keep it from
 * its timers. */
bool rs_v_ud_run_cq_some(struct rs_v_qp *qp, uint64_t until_ms);
#define RS_V_UD_THREAD_SLICE_MS 4
/* Copies bytes into a scatter list at a message offset, checking every lkey in software (mr_lock held). */
enum rs_rnic_wc_status rs_v_scatter(struct rs_v_qp *qp, const struct rs_rnic_sge *sge, int num_sge, uint64_t offset,
                                    const uint8_t *data, uint32_t len);

/* record.c */
void rs_v_record_rx(struct rs_v_ud *ud, const struct rs_vud_hdr *h, const uint8_t *payload, uint32_t len,
                    const struct rs_v_src *src);
/* Reports the record: closed by its last datagram, or by its deadline (timed_out). */
void rs_v_record_report(struct rs_v_ud *ud, struct rs_v_msg *m, bool timed_out);
/* Gives back a message's staging buffers (every end of a record: report, refusal, error, destroy). */
void rs_v_record_unstage(struct rs_v_ud *ud, struct rs_v_msg *m);
/* Frees the QP's spare staging buffers (destroy). */
void rs_v_record_stage_cleanup(struct rs_v_ud *ud);
uint32_t rs_v_record_seg_len(uint32_t chunk, uint64_t len);
void rs_v_read_request(struct rs_v_ud *ud, const struct rs_vud_hdr *h, const struct ibv_wc *wc, const uint8_t *grh,
                       const struct rs_v_src *src);
void rs_v_read_response(struct rs_v_ud *ud, const struct rs_vud_hdr *h, const uint8_t *payload, uint32_t len,
                        const struct rs_v_src *src);

#endif /* RS_RNIC_VERBS_UD_H */
