/*
 * sdp.h: SDP stream sockets over rnic.h, the internal socket-like API the interception layer calls.
 *
 * One struct rs_sdp_sock is one TCP-like endpoint (unbound, listening or connected). Every call returns 0 (or a
 * byte count) on success and a negative errno on failure; none of them sets errno. The byte stream, the error codes
 * and the readiness rules are TCP's; docs/sdp.md lists where they differ.
 *
 * Addresses: the caller gives RDMA addresses explicitly. rs_sdp_listen listens on the address given to
 * rs_sdp_bind (port 0 picks one; rs_sdp_getsockname tells which), rs_sdp_connect connects to the address and port
 * the peer's RNIC listens on. How an application's TCP port maps onto these is the interception layer's business.
 *
 * Blocking: a socket created without RS_SDP_NONBLOCK blocks in accept, connect, send, recv and close (with
 * SO_LINGER) like a kernel socket. Blocking waits sleep in poll(2) on a per-thread eventfd, so a signal interrupts
 * them (-EINTR, or the partial count when bytes already moved), and SO_RCVTIMEO / SO_SNDTIMEO bound them (-EAGAIN
 * when nothing moved). Per call, MSG_DONTWAIT makes one call nonblocking.
 *
 * Readiness: rs_sdp_poll returns the current mask (POLLIN, POLLOUT, POLLRDHUP, POLLHUP, POLLERR with poll(2)'s
 * meanings for a TCP socket). Each socket owns ONE notification fd (an eventfd, rs_sdp_fd) for poll/select/epoll:
 * it is readable exactly while (mask & (interest | POLLERR | POLLHUP)) is non-zero, where interest is the union of
 * the events currently registered with rs_sdp_interest. Each change that adds readiness (new data, new space, a
 * new connection) writes the eventfd again, so an edge-triggered epoll on it sees a new edge; when nothing of
 * interest is ready the eventfd is drained. So a waiter registers interest, puts the fd in its poll set together
 * with kernel fds, and on wake-up calls rs_sdp_poll for the real mask; it never spins and no wake-up is lost. Never
 * read or write the fd yourself.
 *
 * Threads: every call is thread-safe. One thread may be in recv while another sends, polls or closes. Concurrent
 * receivers (or concurrent senders) on one socket are serialised, as on a kernel socket. Progress (credits
 * returned, RDMA reads answered, data received into the ring, connections accepted, keepalives) happens on a
 * per-process progress thread even when the application never calls in.
 *
 * Lifetime: rs_sdp_close releases the caller's handle; the connection lives on (orphaned, as in TCP) until pending
 * data is delivered and the close handshake is done, or until a bounded timeout. Callers that hand the socket to
 * several threads take a reference per thread with rs_sdp_hold and drop it with rs_sdp_release, so a close in one
 * thread never frees the object under another; blocked calls woken by close return -EBADF.
 *
 * fork(): sockets do not survive into a child process (the progress thread and the RNIC context stay with the
 * parent). In the child every call on an inherited socket returns -EBADF; new sockets work. A connection another
 * process must use (fork, exec) is handed back to kernel TCP first: see Hand-back below.
 */
#ifndef RS_SDP_STREAM_SDP_H
#define RS_SDP_STREAM_SDP_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

struct rs_sdp_sock;

/* rs_sdp_socket / rs_sdp_accept flags */
#define RS_SDP_NONBLOCK 0x1u

/*
 * Creates an unconnected stream socket. family: AF_INET or AF_INET6. rnic_kind: enum rs_rnic_kind, or 0 to take the
 * RS_RNIC_KIND environment variable ("soft" / "verbs") and else let rs_rnic_open choose (a verbs device that serves
 * the address, otherwise the software RNIC). The RNIC is opened when the socket listens or connects.
 */
int rs_sdp_socket(int family, int rnic_kind, unsigned flags, struct rs_sdp_sock **out);

/* Records the local RDMA address (port 0: chosen at listen). Before listen or connect only. */
int rs_sdp_bind(struct rs_sdp_sock *s, const struct sockaddr *addr, socklen_t len);

/* Listens on the bound address (or the wildcard address and a free port when unbound). */
int rs_sdp_listen(struct rs_sdp_sock *s, int backlog);

/*
 * Takes the oldest established connection. -EAGAIN when none is ready and the call does not block. peer/peer_len
 * may be NULL. flags: RS_SDP_NONBLOCK for the new socket.
 */
int rs_sdp_accept(struct rs_sdp_sock *s, unsigned flags, struct rs_sdp_sock **out, struct sockaddr *peer,
                  socklen_t *peer_len);

/*
 * Connects to dst. A nonblocking socket returns -EINPROGRESS: POLLOUT (or POLLERR) follows, and SO_ERROR tells the
 * outcome. Errors: -ECONNREFUSED (rejected, nobody listening), -ETIMEDOUT, -EHOSTUNREACH / -ENETUNREACH, -EISCONN,
 * -EALREADY, -EPROTO (the peer is not an SDP peer of a compatible version).
 */
int rs_sdp_connect(struct rs_sdp_sock *s, const struct sockaddr *dst, socklen_t len);

/*
 * Byte stream I/O. flags: MSG_DONTWAIT, MSG_NOSIGNAL, MSG_MORE (send); MSG_DONTWAIT, MSG_PEEK, MSG_WAITALL,
 * MSG_TRUNC (discard instead of copying) (recv). MSG_ZEROCOPY (send, after SO_ZEROCOPY): see docs/sdp.md.
 * send returns the bytes taken (a nonblocking send may take fewer than offered), -EPIPE after shutdown or reset
 * (and raises SIGPIPE unless MSG_NOSIGNAL), or the pending socket error. recv returns the bytes copied, 0 at end
 * of stream, -EAGAIN, or the pending socket error (e.g. -ECONNRESET once, then 0).
 */
ssize_t rs_sdp_sendmsg(struct rs_sdp_sock *s, const struct iovec *iov, int iovcnt, int flags);
ssize_t rs_sdp_recvmsg(struct rs_sdp_sock *s, const struct iovec *iov, int iovcnt, int flags);
/*
 * The short path (sdp_fast.c) for one buffer on a connected socket in steady state: true with *result set as
 * rs_sdp_send / rs_sdp_recv would have set it, or false when the call must take rs_sdp_sendmsg / rs_sdp_recvmsg
 * (nothing was done). Never blocks. Only lengths from 1 to these maxima can take it: callers test the length
 * first, since a bulk transfer's spinning sender or reader calls in far more often than it moves data, and under
 * an emulated CPU even a declined call costs it measurably (5-10% of 64 KiB bandwidth over rxe under TCG).
 */
#define RS_SDP_SHORT_SEND_MAX 240u      /* with its 16-byte BSDH, the largest message posted inline */
#define RS_SDP_SHORT_RECV_MAX 4096u     /* the largest copy made under the socket lock */
bool rs_sdp_send_fast(struct rs_sdp_sock *s, const void *buf, size_t len, int flags, ssize_t *result);
bool rs_sdp_recv_fast(struct rs_sdp_sock *s, void *buf, size_t len, int flags, ssize_t *result);
ssize_t rs_sdp_send(struct rs_sdp_sock *s, const void *buf, size_t len, int flags);
ssize_t rs_sdp_recv(struct rs_sdp_sock *s, void *buf, size_t len, int flags);

/* SHUT_RD, SHUT_WR or SHUT_RDWR. After SHUT_WR the peer reads everything sent before, then end of stream. */
int rs_sdp_shutdown(struct rs_sdp_sock *s, int how);

/*
 * Releases the caller's handle. Unread received data or SO_LINGER with a zero timeout abort the connection (the
 * peer gets ECONNRESET). Otherwise pending data is delivered and the connection closed gracefully; with SO_LINGER
 * on, close blocks until the peer has acknowledged everything (or the linger time passed: then -EWOULDBLOCK, and
 * the connection still closes in the background).
 */
int rs_sdp_close(struct rs_sdp_sock *s);
/* rs_sdp_close for a listener that goes dormant at fork: its RNIC endpoint is parked where the RNIC can share it
 * with the other processes (rs_rnic_listener_park), so connections wait for whichever process listens next. */
int rs_sdp_close_parked(struct rs_sdp_sock *s);
/*
 * Prefork families (sdp_family.c). Called on a listener just before the process forks: where the RNIC cannot share
 * its listening endpoint with other processes (verbs), the listener becomes the family's dispatcher and must stay
 * open in this process (rs_sdp_dispatching says so after the fork); its descendants that listen on the same address
 * then join the family instead of competing for the port, and the dispatcher redirects each connection to one of
 * them that waits. force: on any RNIC (tests). 0, -EOPNOTSUPP (the RNIC shares: park instead), or an error.
 */
int rs_sdp_dispatch_enable(struct rs_sdp_sock *s, bool force);
bool rs_sdp_dispatching(struct rs_sdp_sock *s);
/* The application took a connection from elsewhere (the kernel side of a `both` listener): the family's dispatcher
 * stops counting this process as one that waits. */
void rs_sdp_note_busy(struct rs_sdp_sock *s);
/* The process ends without exit() (_exit, _Exit): connections the program closed are still delivering what was
 * written; give them the time exit() gives them, as the kernel delivers a closed TCP socket's data after the process
 * is gone. */
void rs_sdp_exit_now(void);

/* References for callers that share one socket between threads (see Lifetime above). */
void rs_sdp_hold(struct rs_sdp_sock *s);
void rs_sdp_release(struct rs_sdp_sock *s);

/* ---- hand-back to kernel TCP (docs/sdp.md, "Hand-back") ----
 *
 * A connected SDP socket can continue as a kernel TCP connection between the same two processes, with no byte lost,
 * duplicated or reordered: how a connection reaches a process that has no RDMA state for it (a forked child, a new
 * image after exec). Either side may start it (rs_sdp_handback); the peer's rdmasock answers on its own (SuspComm /
 * SuspCommAck on the QP, then a TCP connection the initiator listens for). When it is done, each side's kernel
 * socket is the stream's continuation: the first bytes read from it are those its SDP socket had received and its
 * application had not read yet, followed by what the peer's application sent and this side had not yet received.
 * Both peers must have announced hand-back in the Hello (every rdmasock that has this call does).
 *
 * While a hand-back is under way, calls on the socket wait (nonblocking ones return -EAGAIN) and the mask is 0.
 * Once it is done (rs_sdp_handed_back true), the mask is POLLIN | POLLOUT so that waiters wake up, and send, recv,
 * shutdown, setsockopt, rs_sdp_inq and rs_sdp_outq return -EREMCHG: the caller takes the kernel fd
 * (rs_sdp_take_handback_fd) and repeats the call on it. getsockopt still answers from the options the socket had,
 * so the caller can copy them onto the kernel socket. A hand-back that fails resets the connection (-ECONNRESET to
 * the application, as the kernel reports a connection that died).
 */

/*
 * Starts a hand-back and waits for it, at most timeout_ms. Returns the kernel TCP socket (connected, blocking,
 * close-on-exec; the caller owns it and sets the flags it wants), or: -EOPNOTSUPP (not a connected socket, or a
 * peer without hand-back: nothing changed), -EPIPE / -ECONNRESET (the connection is over or was reset), -ETIMEDOUT
 * (the peer did not answer: the connection is reset). Must not run on the progress thread (it waits for it).
 * If the peer started a hand-back first, this waits for that one and returns its fd the same way.
 */
int rs_sdp_handback(struct rs_sdp_sock *s, int timeout_ms);
/* True once the connection was handed back (by either side) and its kernel fd is ready. */
bool rs_sdp_handed_back(struct rs_sdp_sock *s);
/* The kernel fd of a handed-back connection, once (the caller owns it); -EAGAIN while a hand-back is under way,
 * -ENOENT when there is none (never handed back, or already taken). */
int rs_sdp_take_handback_fd(struct rs_sdp_sock *s);

/* ---- readiness ---- */

/* Current readiness mask (POLLIN | POLLOUT | POLLRDHUP | POLLHUP | POLLERR bits of <poll.h>). */
unsigned rs_sdp_poll(struct rs_sdp_sock *s);
/* The notification eventfd (see Readiness above). Valid until the socket is closed. */
int rs_sdp_fd(const struct rs_sdp_sock *s);
/* Adds (delta > 0) or removes (delta < 0) interest in events; counted per event bit, so independent waiters
 * (a poll call, an epoll registration) can each add and remove their own. */
void rs_sdp_interest(struct rs_sdp_sock *s, unsigned events, int delta);

/* ---- options and names ---- */

/*
 * SOL_SOCKET: SO_RCVBUF, SO_SNDBUF (doubled as Linux does; they size the receive ring and the send buffer, so they
 * take effect before listen/connect, and accepted sockets inherit the listener's), SO_RCVLOWAT, SO_RCVTIMEO,
 * SO_SNDTIMEO, SO_LINGER, SO_KEEPALIVE, SO_REUSEADDR (stored), SO_ZEROCOPY, SO_ERROR (get, clears), SO_TYPE,
 * SO_ACCEPTCONN, SO_DOMAIN, SO_PROTOCOL.
 * IPPROTO_TCP: TCP_NODELAY, TCP_CORK, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, TCP_MAXSEG (get), TCP_INFO (get).
 * RS_SOL_SDP: RS_SDP_ZCOPY_THRESHOLD (int bytes; 0 turns zero copy off for this socket, -1 restores the default),
 * RS_SDP_ZCOPY_ADAPTIVE (int bool), RS_SDP_STATS (get, struct rs_sdp_stats), RS_SDP_LEND_RING (int: 1 lends the
 * send ring's bytes by SrcAvail from the zero-copy threshold, 0 never, -1 the default: on an RNIC that moves
 * payload itself, docs/sdp.md "Lending the send ring").
 * Anything else: -ENOPROTOOPT.
 */
#define RS_SOL_SDP 0x5344               /* "SD" */
#define RS_SDP_ZCOPY_THRESHOLD 1
#define RS_SDP_ZCOPY_ADAPTIVE 2
#define RS_SDP_STATS 3
#define RS_SDP_LEND_RING 4

#define RS_SDP_ZCOPY_DEFAULT_THRESHOLD (64u * 1024u)

struct rs_sdp_stats {
    uint64_t bytes_sent, bytes_received;            /* application bytes */
    uint64_t msgs_sent, msgs_received;              /* SDP messages of any kind */
    uint64_t data_msgs_sent, data_msgs_received;    /* Data messages with payload */
    uint64_t credit_updates_sent;                   /* Data messages without payload */
    uint64_t credit_stalls;                         /* times a send waited for credits */
    uint64_t zcopy_src_bytes;                       /* sent through SrcAvail (peer RDMA-read them) */
    uint64_t zcopy_sink_bytes;                      /* sent by RDMA WRITE into a peer's SinkAvail */
    uint64_t zcopy_read_bytes;                      /* received by RDMA READ of the peer's SrcAvail */
    uint64_t zcopy_written_bytes;                   /* received through our SinkAvail */
    uint64_t src_avail_sent, sink_avail_sent;
    uint64_t src_cancels, sink_cancels;             /* cancels we sent */
    uint64_t send_sm_sent, send_sm_received;
    uint64_t sinks_crossed;                         /* our SinkAvail crossed data from the peer (dropped) */
    uint64_t regcache_hits, regcache_misses;
    uint32_t zcopy_threshold_now;                   /* adaptive threshold currently in force (0: off) */
    uint32_t credits_now;                           /* messages we may send now */
    uint32_t rx_bufs, rx_buf_size;                  /* our receive ring */
    uint32_t peer_buf_size;                         /* the peer's receive buffers (largest message we send) */
    uint32_t cq_left_to_app;                        /* 1 while the progress thread leaves the CQ to the
                                                     * application's threads (sdp_conn.c "CQ duty") */
    uint64_t progress_cq_wakeups;                   /* CQ notifications the progress thread handled */
    uint64_t cq_handovers;                          /* times it left the CQ to the application's threads */
    uint64_t lazy_looks;                            /* its looks at a CQ it had left to them */
    uint64_t app_sleeps;                            /* times an application thread slept in a call */
    uint64_t app_sleeps_solicited;                  /* ... of which woken by the peer's messages only */
    uint64_t quiet_sends;                           /* small Data messages posted without a completion */
    uint64_t spins;                                 /* blocking waits that polled before sleeping */
    uint64_t spin_catches;                          /* ... whose spin got what it waited for (RDMASOCK_SPIN_US) */
    uint64_t ring_lent_bytes;                       /* sent by SrcAvail over the send ring (peer read them) */
    uint64_t ring_lends;                            /* such SrcAvails */
    uint64_t compact_sent, compact_received;        /* Data messages with their BSDH in the immediate data */
};

int rs_sdp_setsockopt(struct rs_sdp_sock *s, int level, int name, const void *val, socklen_t len);
int rs_sdp_getsockopt(struct rs_sdp_sock *s, int level, int name, void *val, socklen_t *len);

int rs_sdp_set_nonblock(struct rs_sdp_sock *s, bool nonblock);
bool rs_sdp_get_nonblock(struct rs_sdp_sock *s);

/* RDMA-level addresses: the bound/listening address, the connected peer. -ENOTCONN for a peer not connected. */
int rs_sdp_getsockname(struct rs_sdp_sock *s, struct sockaddr *addr, socklen_t *len);
int rs_sdp_getpeername(struct rs_sdp_sock *s, struct sockaddr *addr, socklen_t *len);

/* Bytes that recv can return now without waiting (FIONREAD / SIOCINQ), and bytes not yet acknowledged by the
 * peer (SIOCOUTQ). */
int rs_sdp_inq(struct rs_sdp_sock *s);
int rs_sdp_outq(struct rs_sdp_sock *s);

/*
 * MSG_ZEROCOPY completions (after SO_ZEROCOPY): every send() with MSG_ZEROCOPY that took bytes gets the next
 * 32-bit id, as in Linux. rdmasock copies such data (a nonblocking send cannot lend the buffer past its return), so
 * the notification is ready at once with SO_EE_CODE_ZEROCOPY_COPIED; while one is pending the mask has POLLERR.
 * Fills *ee as Linux puts it in the IP_RECVERR / IPV6_RECVERR control message of recvmsg(MSG_ERRQUEUE)
 * (ee_origin SO_EE_ORIGIN_ZEROCOPY, ee_info..ee_data the id range) and returns 0, or -EAGAIN when none is
 * pending. The interception layer builds the control message.
 */
struct sock_extended_err;
int rs_sdp_recv_errqueue(struct rs_sdp_sock *s, struct sock_extended_err *ee);

/* ---- registration cache coherence (called by the interception layer's munmap/mremap/madvise/brk hooks) ---- */

/*
 * Forgets every cached registration that overlaps [addr, addr+len): the range is being unmapped or remapped, so
 * the next zero-copy transfer from or into it registers afresh. Registrations in use by a transfer are dropped
 * when the transfer ends. Safe from any thread; cheap when nothing is cached.
 */
void rs_sdp_mem_unmapped(const void *addr, size_t len);

/*
 * TEST ONLY: fn(arg) runs in a blocking wait on a connected socket right before the CQ is armed (socket lock held),
 * so a test can make a message complete between the caller's last poll and the arm. NULL clears it.
 */
void rs_sdp_test_before_arm(void (*fn)(void *), void *arg);

/*
 * TEST ONLY: while held, a connecting socket leaves its CM events (the HelloAck's ESTABLISHED) unread, so a test can
 * deliver the peer's first messages before them, as a fast peer can on any device.
 */
void rs_sdp_test_hold_established(bool hold);

#endif /* RS_SDP_STREAM_SDP_H */
