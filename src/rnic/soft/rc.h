/*
 * rc.h: internal state of the soft RNIC's RC half: iWARP (MPA/DDP/RDMAP) over a nonblocking kernel TCP socket.
 * Only rc_*.c include this; the core reaches the RC half through rs_soft_rc_ops (soft.h).
 *
 * Files: rc_qp.c  QP state, completions in order, ORD/IRQ queues, ERROR handling, the rs_soft_rc_ops table
 *        rc_tx.c  FPDU segmentation and transmission (sendmsg with iovecs, CRC over the pieces)
 *        rc_rx.c  the receive state machine (header -> payload into the target -> pad + CRC)
 *        rc_cm.c  listen / connect / accept / reject / disconnect, MPA Request/Reply exchange, timers
 *        rc_local.c  Read Responses placed by one process_vm_writev when both ends are on this host
 *
 * Threads and locks:
 *   - Everything that changes the connection state (rc->conn) runs on the device's progress thread: application
 *     calls (connect, accept, disconnect, destroy, set_error) hop to it with rs_soft_progress_call_sync.
 *   - The receive machine (rc->rx, the ORQ's consumer side, the IRQ's producer side, rx_eof, peer_fin) runs under
 *     rc->rx_lock, on the progress thread or, in RTS, on an application thread that waits on the receive CQ and polls
 *     it inside its wait bracket (consumer progress, rs_rc_rx_inline; docs/rnic-rc.md). Whoever holds rx_lock never
 *     waits for the progress thread (no _sync call, no watch or timer deletion): an application thread leaves every
 *     slow path (EOF, a fatal error, closing) to the progress thread with an asynchronous call. So the progress thread
 *     may block on rx_lock where it must (errors, closing, destroy), and on its hot path only try-locks it. rx_lock is
 *     recursive because the progress thread's error path re-enters it (rs_rc_fatal -> set_error -> close).
 *   - While an application thread waits on the socket (the receive CQ has a blocked waiter), the progress thread
 *     leaves the socket's READ event alone ("parks" it) for RS_RC_RX_PARK_MS, so one message wakes one thread.
 *   - Transmission runs on whichever thread holds rc->tx_lock: the posting thread sends its own work requests while
 *     the socket accepts them; the progress thread finishes what the socket refused and is the only one that
 *     produces Read Responses and Terminates. FPDUs of different messages interleave only at FPDU boundaries
 *     because a batch is only built when the previous one was completely handed to the socket.
 *   - Lock order: cq->attach_lock -> rc->rx_lock -> rc->tx_lock -> qp->sq_lock -> device MR read lock -> rq->lock ->
 *     cq->lock (soft.h's order with rx_lock and tx_lock in front). tx_lock is never held while calling
 *     rs_soft_qp_enter_error or waiting for the loop.
 *   - The outstanding-Read queue (ORQ) is single-producer (transmitter, under tx_lock) single-consumer (receiver,
 *     under rx_lock), and the inbound Read queue (IRQ) single-producer (receiver) single-consumer (transmitter on
 *     the progress thread), both with atomic indexes.
 */
#ifndef RS_RNIC_SOFT_RC_H
#define RS_RNIC_SOFT_RC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "rnic/soft/mpa.h"
#include "rnic/soft/soft.h"

/* ---- tunables ---- */

/*
 * FPDU sizes (framing included). rs_rc_enter_rts sizes FPDUs to the TCP MSS, capped at RS_RC_FPDU_MAX, so on a
 * real network every FPDU fits one segment (MPA's FPDU alignment: what a hardware peer places without
 * reassembling). MSSes of RS_RC_FPDU_LOCAL and more only exist on loopback and similar host-internal links
 * (Ethernet jumbo frames stop at 9 KiB), where no NIC places segments and Linux reports an MSS of half the peer's
 * first window (32 KiB on loopback) rather than the link's. There the transmitter (rc_tx.c fpdu_size) cuts
 * messages of at least RS_RC_FPDU_MAX bytes into FPDUs of RS_RC_FPDU_MAX, the most a 16-bit ULPDU_Length allows:
 * each FPDU costs the receiving CPU at least two reads (its payload with the next header's first 16 bytes, then
 * the rest of that header), so a 64 KiB SEND takes 4 instead of 10. Shorter messages keep RS_RC_FPDU_LOCAL FPDUs,
 * the segmentation they always had on loopback (and that tests/suites/iwarp_tshark.sh checks with tshark).
 */
#define RS_RC_FPDU_MAX 65536u
#define RS_RC_FPDU_LOCAL 16384u
_Static_assert(RS_RC_FPDU_MAX - RS_MPA_LEN_FIELD - RS_MPA_CRC_LEN <= RS_MPA_MAX_ULPDU,
               "the ULPDU of the largest FPDU must fit ULPDU_Length");
#define RS_RC_FPDU_MIN 256u                 /* floor when the MSS is tiny */
#define RS_RC_TX_BATCH_FPDUS 64             /* FPDUs handed to one sendmsg at most */
#define RS_RC_TX_BATCH_BYTES (1u << 20)     /* a batch takes no new FPDU once it holds this much */
#define RS_RC_TX_IOV_MAX 1024               /* IOV_MAX on Linux */
#define RS_RC_TX_LOOP_BATCHES 2             /* batches one progress-thread turn may send before yielding */
#define RS_RC_TX_POST_BATCHES 16            /* batches a posting thread sends before leaving the rest to the loop */
#define RS_RC_RX_BUDGET_BYTES (1u << 20)    /* bytes one receive turn may consume before yielding */
#define RS_RC_RX_BUDGET_FPDUS 256
#define RS_RC_RX_LOOKAHEAD 16               /* bytes of the next FPDU read with a trailer: the smallest header */
/* An FPDU none of whose bytes were read yet starts with one read of up to this much into rx.stage, which then
 * feeds the exact-size steps: a small message (header, payload, trailer) costs one read instead of three. Bulk
 * transfers rarely get here (the lookahead of each payload read brings the next header) and then copy at most this
 * much of an FPDU; the rest is still placed directly. */
#define RS_RC_RX_STAGE 1024u
/* How long the progress thread leaves a QP's inbound bytes to a waiting application thread once it found one
 * waiting (docs/rnic-rc.md, consumer progress). It bounds the delay of independent progress when the application
 * stops waiting (e.g. starts computing) with the socket parked; under traffic it costs the progress thread at most
 * one timer and one re-park wake-up per period instead of one wake-up per message. */
#define RS_RC_RX_PARK_MS 1u
#define RS_RC_DEFAULT_CONNECT_TIMEOUT_MS 5000u
#define RS_RC_MPA_REQUEST_TIMEOUT_MS 5000u  /* passive side: time a new TCP connection has to send its Request */
#define RS_RC_CLOSE_TIMEOUT_MS 3000u        /* disconnect / error: time the peer has to close its half */
#define RS_RC_SHARED_GRACE_MS 100u          /* a shared listener's connection nobody asks for is taken after this */
#define RS_RC_GREETING_TIMEOUT_MS 1000u     /* active side: time the listener has to greet (capped by the connect
                                             * timeout); a kernel listener that says nothing is not ours */
#define RS_RC_TERM_LEN_FPDU (RS_MPA_LEN_FIELD + RS_TERM_MAX_LEN + RS_MPA_TRAILER_MAX)

/*
 * The soft RNIC's own port space (docs/rnic-rc.md "Port space"): RDMA port P is TCP port (P + offset) mod 65536,
 * offset from RDMASOCK_SOFT_PORT_OFFSET (read once per process). So an RDMA listener on P and the application's
 * own kernel listener on P coexist, as they do in rdma_cm's port space on verbs.
 */
#define RS_RC_PORT_OFFSET_ENV "RDMASOCK_SOFT_PORT_OFFSET"
#define RS_RC_PORT_OFFSET_DEFAULT 16384u

/*
 * The listener greeting (docs/wire-formats.md §5): the passive side writes these 16 bytes as soon as it accepts a
 * TCP connection; the active side reads exactly them before it sends a byte. A kernel program that happens to
 * listen on the TCP port never greets like this, so it never receives anything from us.
 */
#define RS_RC_GREETING "RDMASOCK SOFTRC\x01"    /* 15 ASCII bytes, then the version (1) */
#define RS_RC_GREETING_LEN 16u
_Static_assert(sizeof(RS_RC_GREETING) - 1 == RS_RC_GREETING_LEN, "the greeting is 16 bytes on the wire");

/*
 * Local Read placement (rc_local.c, docs/rnic-rc.md): a Read Response of at least RS_RC_LOCAL_MIN bytes for a
 * requester on this host is copied into its sink directly; shorter ones cost more in system calls than they save.
 * The requester's file lives in RS_RC_LOCAL_DIR (tmpfs on Debian).
 */
#define RS_RC_LOCAL_MIN 16384u
#define RS_RC_LOCAL_DIR "/dev/shm"

/* In the requester's memory, read and written by the responder with process_vm_readv/writev. */
struct rs_rc_local_mark {
    uint64_t token[2];                      /* random, also in the published record */
    uint32_t allow;                         /* requester: 1 while responses may be placed locally */
    uint32_t busy;                          /* responder: 1 while it writes into our memory */
};

struct rs_rc_local {
    bool eligible;                          /* loopback peer and not turned off (set at RTS; cleared for good) */
    /* Requester (tx_lock). */
    struct rs_rc_local_mark *mark;          /* published when not NULL */
    char path[160];
    bool accept_marks;                      /* atomic: the receiver takes zero-length placement marks */
    /* Responder (progress thread, tx_lock). */
    int peer_state;                         /* 0 not looked up, 1 found, -1 TCP only */
    int peer_pid;
    uint64_t peer_mark;
    uint64_t peer_token[2];
};

/* Connection state, written on the progress thread only (read anywhere with rs_rc_conn()). */
enum rs_rc_conn {
    RS_RC_IDLE,             /* no connection (QP in INIT) */
    RS_RC_CONNECTING,       /* active: TCP connect in progress, then (tcp_up) reading the greeting */
    RS_RC_MPA_WAIT,         /* active: Request sent (or being sent), waiting for the Reply */
    RS_RC_RTS,              /* FPDUs flow */
    RS_RC_CLOSING,          /* orderly disconnect: finishing transmission, FINs crossing */
    RS_RC_DRAINING,         /* ERROR: last bytes (Terminate) going out, inbound bytes discarded until EOF */
    RS_RC_CLOSED,           /* socket closed */
};

/* Per send-queue slot, for in-order completion (qp->sq_lock). */
enum rs_rc_slot { RS_RC_SLOT_PENDING = 0, RS_RC_SLOT_DONE, RS_RC_SLOT_FAILED };

/* An RDMA READ we issued and whose response has not been placed completely. */
struct rs_rc_orq_entry {
    struct rs_soft_send_wqe *wqe;
    uint32_t sink_stag;
    uint64_t sink_to;
    uint64_t length;
    uint64_t placed;        /* receiver's cursor */
    uint64_t pos;           /* the WQE's send-queue ring position */
};

/* A Read Request the peer sent us, waiting for its response to be transmitted (progress thread only). */
struct rs_rc_irq_entry {
    struct rs_rdmap_read_req rr;
    uint32_t sent;
};

/* One FPDU of a transmit batch. */
struct rs_rc_tx_fpdu {
    size_t end;             /* batch offset just past this FPDU */
    int64_t done_pos;       /* sq ring position completed (handed to TCP) with this FPDU, or -1 */
};

/* A Read Response piece in the batch: revalidated before any later sendmsg of the same batch (a region may be
 * deregistered between two turns; its bytes must then never be sent). */
struct rs_rc_tx_src {
    uint32_t stag;
    uint64_t to, len;
    const uint8_t *where;
};

struct rs_rc_tx {
    /* The batch being handed to the socket. */
    struct iovec iov[RS_RC_TX_IOV_MAX];
    int iov_n, iov_pos;
    size_t iov_off;
    size_t bytes, sent;
    struct rs_rc_tx_fpdu fpdu[RS_RC_TX_BATCH_FPDUS];
    int fpdu_n, fpdu_pos;
    struct rs_rc_tx_src src[RS_RC_TX_BATCH_FPDUS];
    int src_n;
    uint8_t hdr[RS_RC_TX_BATCH_FPDUS][RS_MPA_LEN_FIELD + RS_DDP_MAX_HDR_LEN];
    uint8_t trailer[RS_RC_TX_BATCH_FPDUS][RS_MPA_TRAILER_MAX];
    /* Raw bytes that go out after the batch: the MPA Request/Reply, or a Terminate FPDU. */
    uint8_t raw[RS_MPA_REQREP_MAX > RS_RC_TERM_LEN_FPDU ? RS_MPA_REQREP_MAX : RS_RC_TERM_LEN_FPDU];
    size_t raw_len, raw_sent;
    /* On a fatal error: the unsent rest of the FPDU being transmitted, copied so the batch can be dropped. */
    uint8_t stage[RS_RC_FPDU_MAX];
    /* Segmentation of the send-queue WQE in progress. */
    struct rs_soft_send_wqe *cur;
    uint64_t cur_pos;       /* its ring position */
    uint32_t cur_msn;
    uint32_t msn_send, msn_rreq;    /* last MSN used per queue */
    bool alternate;         /* progress thread: next FPDU from the Read queue rather than the send queue */
};

enum rs_rc_rx_state { RS_RC_RX_HDR, RS_RC_RX_PAYLOAD };
enum rs_rc_rx_dest { RS_RC_DEST_NONE, RS_RC_DEST_WRITE, RS_RC_DEST_READ_RESP, RS_RC_DEST_SEND, RS_RC_DEST_TERM };

struct rs_rc_rx {
    enum rs_rc_rx_state state;
    uint8_t hbuf[RS_MPA_LEN_FIELD + RS_DDP_MAX_HDR_LEN];    /* header being read (or the next one's first bytes) */
    size_t hhave;
    uint8_t cur_hdr[RS_MPA_LEN_FIELD + RS_DDP_MAX_HDR_LEN]; /* header of the FPDU whose payload is being read */
    size_t cur_hdr_len;
    uint16_t ulpdu_len;
    struct rs_ddp_seg seg;
    enum rs_rc_rx_dest dest;
    uint32_t crc;
    uint64_t pay_done;
    uint8_t trailer[RS_MPA_TRAILER_MAX];
    size_t tr_have, tr_len;
    /* Untagged Send message being received. */
    struct rs_soft_recv_wqe *recv;
    uint64_t msg_bytes;
    uint32_t msn_send, msn_rreq, msn_term;  /* next expected MSN per queue */
    /* Terminate received. */
    uint8_t term[RS_TERM_MAX_LEN - RS_DDP_UNTAGGED_HDR_LEN - RS_TERM_HDR_LEN];
    uint8_t scratch[4096];
    /* Test/fuzz feeding: when set, bytes come from here instead of the socket. */
    const uint8_t *feed;
    size_t feed_len;
    /* Bytes read ahead from the socket (RS_RC_RX_STAGE), consumed before the socket is read again. */
    uint8_t stage[RS_RC_RX_STAGE];
    size_t stage_off, stage_len;
    bool drained;                           /* the last turn ended on a socket with nothing more to read */
    bool short_read;                        /* this turn's last socket read returned less than it asked for */
};

struct rs_rc_qp {
    struct rs_soft_qp *qp;
    struct rs_soft_device *dev;
    int fd;
    int conn;                               /* enum rs_rc_conn */
    bool active;                            /* we sent the Request */
    struct rs_soft_cm *cm;                  /* events for this QP (a reference is held) */
    struct rs_soft_watch *watch;
    unsigned watch_events;
    struct rs_soft_timer *timer;
    struct sockaddr_storage peer;
    socklen_t peer_len;
    /* Our end as the peer names it (its `peer`), recorded before ESTABLISHED: the passive side reports the RDMA port
     * the peer dialled, not the TCP port that carries it. Family 0 until then. */
    struct sockaddr_storage local_addr;
    uint32_t fpdu_max;

    /* Active side before MPA: the TCP connection is up and the listener's greeting is being read; nothing has
     * been sent yet. The connect deadline bounds the greeting wait and the MPA exchange together. */
    bool tcp_up;
    uint8_t greeting_in[RS_RC_GREETING_LEN];
    size_t greeting_have;
    uint64_t connect_deadline_ns;

    /* MPA negotiation. */
    struct rs_mpa_local local;
    struct rs_mpa_result neg;
    struct rs_mpa_frame req;                /* active: our Request (for checking the Reply) */
    uint8_t req_pd[RS_MPA_MAX_ULP_PRIVATE_DATA];
    uint8_t mpa_in[RS_MPA_REQREP_MAX];      /* active: the Reply as it arrives */
    size_t mpa_have;

    /* Receive side exclusion and consumer progress (see the header comment). */
    pthread_mutex_t rx_lock;                /* recursive */
    bool rx_inline;                         /* rx_lock: the holder is an application thread (rs_rc_rx_inline) */
    bool rx_stop;                           /* rx_lock (stores atomic): an application thread met a fatal error; the
                                             * progress thread takes the QP to ERROR, nobody receives meanwhile */
    bool rx_end_pending;                    /* rx_lock (stores atomic): an application thread read EOF or a socket
                                             * error ... */
    int rx_end_result;                      /* ... (this result) and left it to the progress thread */
    bool rx_parked;                         /* tx_lock: READ left out of the watch for a waiting thread */
    struct rs_soft_timer *park_timer;

    /* Closing and errors (progress thread). */
    bool final_event_sent;                  /* REJECTED/UNREACHABLE/TIMEOUT/DISCONNECTED/ERROR pushed */
    bool quiet_error;                       /* entering ERROR without an ERROR event (already reported) */
    int error_detail;                       /* -errno for the ERROR event */
    bool disconnect_requested, fin_sent, peer_fin;
    bool term_sent;                         /* a Terminate was queued, or received (never answer one) */
    bool term_queued;                       /* we queued one: the stream is drained so it arrives whole */
    bool abort_close;                       /* the stream is unusable: reset it rather than drain it */
    bool rx_eof;                            /* the peer's FIN (or a socket error) was read */

    /* Transmission. */
    pthread_mutex_t tx_lock;
    bool tx_stopped;                        /* tx_lock: no new FPDUs (ERROR, CLOSING after FIN) */
    bool tx_want_write;                     /* tx_lock: bytes left that the socket refused */
    bool tx_failed;                         /* tx_lock: the transmitter hit an error, the QP must enter ERROR */
    bool tx_fail_reported;                  /* tx_lock: rs_rc_tx_failed already called */
    bool tx_fail_abort;                     /* tx_lock: the stream is broken mid-FPDU, reset it (no Terminate) */
    bool tx_fail_has_cause;                 /* tx_lock: tx_fail_cause is the Terminate to send */
    struct rs_term_cause tx_fail_cause;
    int tx_fail_detail;
    struct rs_rc_tx tx;

    /* Send-queue slot states (qp->sq_lock). */
    uint8_t *slot_state;
    uint8_t *slot_status;
    bool sq_failed;                         /* a WQE completed in error: the rest is left to the flush */

    /* Outstanding Reads (ORQ) and inbound Reads (IRQ). */
    struct rs_rc_orq_entry *orq;
    uint32_t orq_cap;
    uint64_t orq_head, orq_tail;            /* atomic */
    struct rs_rc_irq_entry *irq;
    uint32_t irq_cap;
    uint64_t irq_head, irq_tail;            /* head: transmitter (progress thread), tail: receiver (rx_lock); atomic
                                             * stores, and loads where the other side reads them */

    struct rs_rc_rx rx;

    struct rs_rc_local lread;               /* local Read placement (rc_local.c) */
};

static inline struct rs_rc_qp *rs_rc(const struct rs_soft_qp *qp) { return (struct rs_rc_qp *)qp->rc; }
static inline enum rs_rc_conn rs_rc_conn(const struct rs_rc_qp *rc)
{
    return (enum rs_rc_conn)__atomic_load_n(&rc->conn, __ATOMIC_ACQUIRE);
}
static inline void rs_rc_set_conn(struct rs_rc_qp *rc, enum rs_rc_conn c)
{
    __atomic_store_n(&rc->conn, (int)c, __ATOMIC_RELEASE);
}
/* Read Responses still to transmit. The head moves on the progress thread, the tail with the receiver; a posting
 * thread reads them to know it must leave the socket's writable event armed for the progress thread. */
static inline bool rs_rc_irq_pending(const struct rs_rc_qp *rc)
{
    return __atomic_load_n(&rc->irq_head, __ATOMIC_ACQUIRE) != __atomic_load_n(&rc->irq_tail, __ATOMIC_ACQUIRE);
}
static inline uint32_t rs_rc_orq_count(const struct rs_rc_qp *rc)
{
    return (uint32_t)(__atomic_load_n(&rc->orq_tail, __ATOMIC_ACQUIRE) -
                      __atomic_load_n(&rc->orq_head, __ATOMIC_ACQUIRE));
}

/* ---- rc_qp.c ---- */

/* Records the outcome of the WQE at ring position pos and completes every finished WQE at the head of the send
 * queue, in ring order. Takes qp->sq_lock. */
void rs_rc_slot_finish(struct rs_rc_qp *rc, uint64_t pos, enum rs_rc_slot state, enum rs_rnic_wc_status status);
/* Completes the finished WQEs at the head (qp->sq_lock held). */
void rs_rc_complete_ready_locked(struct rs_rc_qp *rc);
/* Moves the connection to RTS after MPA: sizes FPDUs for the MSS, resets the stream state, starts transmitting. */
void rs_rc_enter_rts(struct rs_rc_qp *rc);
/*
 * A fatal error detected here (progress thread, no locks held). With cause, a Terminate naming it (and the
 * offending header, if given) is queued behind the FPDU being transmitted. Then the QP enters ERROR: the peer is
 * told by the Terminate and the closing TCP connection, our CM gets RS_RNIC_CM_EV_ERROR with detail.
 */
void rs_rc_fatal(struct rs_rc_qp *rc, const struct rs_term_cause *cause, const uint8_t *offending,
                 size_t offending_len, uint16_t offending_ulpdu_len, int detail);
/* Pushes a CM event for this QP on its channel (progress thread). */
void rs_rc_push_event(struct rs_rc_qp *rc, enum rs_rnic_cm_event_type type, int error, const void *pd,
                      uint32_t pd_len);
/* Applies the QP's traffic class to its socket. */
void rs_rc_apply_qos(struct rs_rc_qp *rc);
/* Sets the socket watch to what the state needs (READ while open, WRITE while bytes wait). tx_lock held. */
void rs_rc_watch_update_locked(struct rs_rc_qp *rc);
void rs_rc_watch_update(struct rs_rc_qp *rc);
/* The transmitter failed (tx_failed set): takes the QP to ERROR on the progress thread. No locks held. */
void rs_rc_tx_failed(struct rs_rc_qp *rc);

/* ---- rc_tx.c ---- */

/*
 * Transmits as much as the socket takes (bounded). from_loop: the progress thread (also serves Read Responses).
 * Returns true when bytes are left over for a later writable event. Takes tx_lock.
 */
bool rs_rc_tx_run(struct rs_rc_qp *rc, bool from_loop);
/* tx_lock held: queues raw bytes (MPA frame, Terminate FPDU) after the current batch. */
int rs_rc_tx_queue_raw(struct rs_rc_qp *rc, const uint8_t *bytes, size_t len);
/* tx_lock held: keeps only the rest of the FPDU being sent (copied) and drops the rest of the batch. false when
 * that rest cannot be produced any more (its source region is gone): the stream must then be reset. */
bool rs_rc_tx_cut_batch(struct rs_rc_qp *rc);
/* tx_lock held: true when nothing is left to send (no batch, no raw bytes). */
bool rs_rc_tx_idle_locked(const struct rs_rc_qp *rc);
/* tx_lock held: true when no work request or Read Response remains to be started either. */
bool rs_rc_tx_quiescent_locked(struct rs_rc_qp *rc);
/* Sends the pending bytes without building more (ERROR draining). Returns true when bytes are left. */
bool rs_rc_tx_flush_only(struct rs_rc_qp *rc);

/* ---- rc_rx.c ---- */

/* Progress-thread receive turn on the socket (or the feed buffer); takes rx_lock. */
void rs_rc_rx_run(struct rs_rc_qp *rc);
/* The progress thread's READ event: a receive turn, unless a blocked application thread waits on this socket or
 * holds rx_lock, in which case the socket is parked (RS_RC_RX_PARK_MS) instead. */
void rs_rc_rx_event(struct rs_rc_qp *rc);
/* Consumer progress on an application thread (rs_soft_rc_ops.rx_inline); true if it may have added completions,
 * *drained false when the turn stopped with bytes left (budget). */
bool rs_rc_rx_inline(struct rs_rc_qp *rc, bool *drained);
/* True on a thread that is inside rs_rc_rx_inline (it holds an rx_lock and must not wait for the loop). */
bool rs_rc_rx_inline_here(void);
/* The park timer fired: the progress thread watches the socket again. */
void rs_rc_park_timer_cb(struct rs_soft_timer *t, void *arg);
/* Resets the receive machine for a new stream (MSNs start at 1). */
void rs_rc_rx_reset(struct rs_rc_qp *rc);
/* ERROR draining: reads and discards until EOF; returns true at EOF or on a socket error. */
bool rs_rc_rx_discard(struct rs_rc_qp *rc);

/* ---- rc_cm.c ---- */

/* The progress-thread callback of a QP's socket. */
void rs_rc_io_cb(struct rs_soft_watch *w, int fd, unsigned revents, void *arg);
/* Closes the socket (after deleting the watch); abortive sends a RST. */
void rs_rc_close_socket(struct rs_rc_qp *rc, bool abortive);
/* The QP's timer fired (connect timeout, close timeout). */
void rs_rc_timer_cb(struct rs_soft_timer *t, void *arg);
/* Checks whether an orderly close can progress (FIN out once idle, both FINs -> DISCONNECTED). Progress thread. */
void rs_rc_close_progress(struct rs_rc_qp *rc);

/* Connection calls, for rs_soft_rc_ops. */
int rs_rc_listen(struct rs_soft_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                 struct rs_rnic_listener **out);
int rs_rc_listener_addr(const struct rs_rnic_listener *listener, struct sockaddr_storage *out);
void rs_rc_listener_close(struct rs_rnic_listener *listener);
void rs_rc_listener_park(struct rs_rnic_listener *listener);
int rs_rc_listener_intake(struct rs_rnic_listener *listener, unsigned want, uint32_t seen);
int rs_rc_connect(struct rs_soft_qp *qp, struct rs_soft_cm *cm, const struct sockaddr *dst, socklen_t len,
                  const void *private_data, uint32_t private_data_len, uint32_t timeout_ms);
int rs_rc_accept(struct rs_rnic_conn_request *request, struct rs_soft_qp *qp, struct rs_soft_cm *cm,
                 const void *private_data, uint32_t private_data_len);
int rs_rc_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len);
int rs_rc_disconnect(struct rs_soft_qp *qp);
int rs_rc_local_addr(const struct rs_soft_qp *qp, struct sockaddr_storage *out);
void rs_rc_request_discard(struct rs_rnic_conn_request *request);
/* A loopback peer (127/8, ::1, v4-mapped 127): the MPA CRC is not asked for, local Read placement is tried. */
bool rs_rc_addr_is_loopback(const struct sockaddr_storage *a);

/* ---- rc_local.c ---- */

/* At RTS: whether this connection may use local Read placement at all. */
void rs_rc_local_init(struct rs_rc_qp *rc);
/* Requester, tx_lock, before a Read Request goes out: publishes on the first one, withdraws for good on one whose
 * sink has several SGEs. */
void rs_rc_local_before_read(struct rs_rc_qp *rc, int num_sge);
/* Requester, when the connection ends (before its buffers can go back to the application): withdraws, unpublishes. */
void rs_rc_local_release(struct rs_rc_qp *rc);
/* Responder, progress thread, tx_lock: copies up to len bytes of the response (from offset sent) into the
 * requester's sink; returns the bytes placed (0: send them over TCP). */
size_t rs_rc_local_place(struct rs_rc_qp *rc, const struct rs_rdmap_read_req *rr, uint32_t sent, uint64_t len);
/* Responder, tx_lock: local placement has not failed on this connection (the next response may go that way). */
static inline bool rs_rc_local_ready(const struct rs_rc_qp *rc)
{
    return rc->lread.eligible && rc->lread.peer_state >= 0;
}
/* Bytes this process placed that way (tests, stats). */
uint64_t rs_rc_local_read_bytes(void);

/* =========================================== TEST ONLY ===================================================== */
/*
 * Puts an RC QP in INIT straight into RTS on an already connected stream socket fd (the QP takes ownership of
 * fd), skipping MPA: negotiated IRD/ORD as given, CRC on. For the fuzz target and unit tests only.
 */
int rs_soft_rc_test_attach(struct rs_rnic_qp *qp, int fd, uint16_t ird, uint16_t ord);
/*
 * Feeds bytes to the RC receive machine of a QP in RTS as if they had arrived on its socket (runs on the progress
 * thread; bypasses the socket, not the checks). Returns 0 while the QP is still in RTS, or -ECONNABORTED once the
 * bytes made it fail (a Terminate was sent, the QP is in ERROR).
 */
int rs_soft_rc_rx_buffer(struct rs_rnic_qp *qp, const void *buf, size_t len);

#endif /* RS_RNIC_SOFT_RC_H */
