/*
 * dgram.h: UDP sockets over datagram RDMA (rnic.h UD QPs), the internal API the interception layer calls.
 * Design, wire formats and the differences from kernel UDP: docs/dgram.md.
 *
 * A struct rs_dgram_sock wraps ONE kernel UDP socket of the application (its fd stays the application's: the
 * interception layer created it with the real socket(2) and keeps it for everything rdmasock does not handle).
 * Per destination, a policy callback (normally the rule file, rs_dgram_config_policy) decides:
 *   - kernel: the datagram goes through the kernel socket, unchanged;
 *   - rdma / both: the peer is discovered over the application's own port (a probe/answer exchange the
 *     application never sees); an rdmasock peer then gets datagram-iWARP (dgram=sendrecv: untagged SEND into
 *     posted receives; dgram=wrecord: RDMA Write-Record into a receive region the peer reserved for us, or
 *     straight into the application buffer a peer's blocked recv advertised). A peer that does not answer gets
 *     kernel UDP under `both`; under `rdma` the send fails (-EHOSTUNREACH, -ECONNREFUSED after a refusal).
 * Datagrams from peers without rdmasock keep arriving on the same port and are received unchanged, in both
 * directions. Multicast and broadcast destinations are never probed: a rule naming them asserts that every member
 * runs rdmasock (datagram-iWARP SEND to the group).
 *
 * Every call returns 0 (or a byte count) or a negative errno, never sets errno. Semantics are UDP's: message
 * boundaries, datagrams of 0 to 65,507 bytes (65,527 on IPv6 sockets), MSG_TRUNC, MSG_PEEK, MSG_DONTWAIT, source
 * addresses, connected UDP, no flow control (a datagram that finds no room is dropped and counted).
 *
 * Blocking: calls block unless the socket is nonblocking (rs_dgram_set_nonblock, initialised from the fd's
 * O_NONBLOCK) or MSG_DONTWAIT is given. A blocking wait sleeps in poll(2) and returns -EINTR when a signal
 * interrupts it, and -EAGAIN when SO_RCVTIMEO / SO_SNDTIMEO expire.
 *
 * Readiness: rs_dgram_poll returns POLLIN / POLLOUT / POLLERR as a kernel UDP socket would. rs_dgram_fd is ONE
 * pollable fd per socket: readable while (mask & (interest | POLLERR)) != 0, and whenever RDMA completions or
 * control traffic arrived that the socket has not processed yet. After a wake-up call rs_dgram_poll (or any
 * I/O call) for the real mask: that also processes what arrived, so the fd never stays readable for nothing.
 *
 * Threads: every call is thread-safe; one socket may be used by several threads at once. Progress (answering
 * probes, moving completions to the receive queue) happens inside calls on the socket; the soft RNIC places
 * data on its own thread meanwhile. rs_dgram_close wakes blocked calls (they return -EBADF); hold a reference
 * (rs_dgram_hold/_release) per thread that may still call after another thread closes.
 */
#ifndef RS_DGRAM_WR_DGRAM_H
#define RS_DGRAM_WR_DGRAM_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "common/config.h"

struct rs_dgram_sock;

/* What the rules say about one peer. */
struct rs_dgram_peer_policy {
    enum rs_mode mode;                  /* RS_MODE_KERNEL, RS_MODE_RDMA, RS_MODE_BOTH */
    enum rs_dgram_mode dgram;           /* RS_DGRAM_SENDRECV or RS_DGRAM_WRECORD */
    enum rs_transport transport;        /* must agree with the socket's RNIC, else the peer stays on the kernel */
    bool has_qos;
    uint8_t sl, tclass;
};

/*
 * Fills *out for peer. role is RS_ROLE_CLIENT when the socket sends to peer, RS_ROLE_SERVER when peer probes the
 * socket (answering it lets the peer send datagram-iWARP here). Called with the socket's lock held: no calls
 * back into this socket.
 */
typedef void (*rs_dgram_policy_fn)(void *arg, enum rs_role role, const struct sockaddr *peer,
                                   struct rs_dgram_peer_policy *out);

struct rs_dgram_opts {
    rs_dgram_policy_fn policy;          /* NULL: every peer stays on the kernel */
    void *policy_arg;
    int rnic_kind;                      /* enum rs_rnic_kind, 0: $RS_RNIC_KIND (soft|verbs) or rs_rnic_open's choice */
    uint32_t probe_timeout_ms;          /* per probe attempt; default 100 */
    uint32_t probe_attempts;            /* default 3 */
    uint32_t cache_ttl_ms;              /* an answered peer is probed again after this; default 10,000 */
    uint32_t negative_ttl_ms;           /* a silent or refusing peer is probed again after this; default 10,000 */
    uint32_t zcopy_threshold;           /* wrecord: smallest datagram placed straight into a waiting buffer;
                                         * default 16,384 */
    bool owns_fd;                       /* the socket closes fd itself when it is freed (see rs_dgram_attach) */
};

void rs_dgram_default_opts(struct rs_dgram_opts *opts);

/* Policy over the rule file: rs_config_match(cfg, udp, role, program, peer). arg: a struct rs_dgram_config_policy
 * that outlives the sockets using it. */
struct rs_dgram_config_policy {
    const struct rs_config *cfg;        /* NULL: built-in defaults (every UDP peer on the kernel) */
    const char *program;
};
void rs_dgram_config_policy(void *arg, enum rs_role role, const struct sockaddr *peer,
                            struct rs_dgram_peer_policy *out);

/*
 * Wraps the application's UDP socket fd (AF_INET or AF_INET6, SOCK_DGRAM). The RDMA side is set up when the
 * socket is bound (now if it already is; else at rs_dgram_bind, or at the first send, which binds to the wildcard
 * address and a free port as the kernel would). The RNIC may read the fd (the soft RNIC adopts it) until the
 * socket is freed, i.e. until the last rs_dgram_release, which can come after rs_dgram_close when another
 * holder keeps a reference: with opts->owns_fd the socket closes the fd itself at that point, after its QP let
 * go of it; otherwise close it only once the last reference is gone. (Closing it earlier leaves the RNIC's
 * thread watching a closed fd number, which the process may already have reused for another file.)
 * Bind and connect go through rs_dgram_bind and rs_dgram_connect so the RDMA side follows the kernel socket.
 */
int rs_dgram_attach(int fd, const struct rs_dgram_opts *opts, struct rs_dgram_sock **out);
int rs_dgram_close(struct rs_dgram_sock *s);
void rs_dgram_hold(struct rs_dgram_sock *s);
void rs_dgram_release(struct rs_dgram_sock *s);

int rs_dgram_bind(struct rs_dgram_sock *s, const struct sockaddr *addr, socklen_t len);
/* Connected UDP; addr->sa_family == AF_UNSPEC dissolves the association. */
int rs_dgram_connect(struct rs_dgram_sock *s, const struct sockaddr *addr, socklen_t len);

/* flags: MSG_DONTWAIT, MSG_NOSIGNAL, MSG_CONFIRM (ignored on RDMA); MSG_MORE and ancillary data go to the kernel. */
ssize_t rs_dgram_sendmsg(struct rs_dgram_sock *s, const struct msghdr *msg, int flags);
/* flags: MSG_DONTWAIT, MSG_PEEK, MSG_TRUNC (return the datagram's real length). msg->msg_flags gets MSG_TRUNC
 * when the datagram was longer than the buffer. msg_controllen is set to 0 (no ancillary data, docs/dgram.md). */
ssize_t rs_dgram_recvmsg(struct rs_dgram_sock *s, struct msghdr *msg, int flags);
ssize_t rs_dgram_sendto(struct rs_dgram_sock *s, const void *buf, size_t len, int flags, const struct sockaddr *to,
                        socklen_t tolen);
ssize_t rs_dgram_recvfrom(struct rs_dgram_sock *s, void *buf, size_t len, int flags, struct sockaddr *from,
                          socklen_t *fromlen);

/* ---- readiness ---- */
unsigned rs_dgram_poll(struct rs_dgram_sock *s);
int rs_dgram_fd(const struct rs_dgram_sock *s);
/* Adds (delta > 0) or removes (delta < 0) interest in POLLIN / POLLOUT, counted per bit. */
void rs_dgram_interest(struct rs_dgram_sock *s, unsigned events, int delta);

/* ---- options ---- */
/*
 * Handled here: SO_RCVBUF (sizes the receive resources: posted receives, lanes, the queue of plain datagrams;
 * doubled and floored as Linux does), SO_SNDBUF (the send staging ring), SO_RCVTIMEO, SO_SNDTIMEO, SO_ERROR
 * (get, clears), SO_TYPE/SO_DOMAIN/SO_PROTOCOL (get). IP_ADD_MEMBERSHIP / IP_DROP_MEMBERSHIP, IPV6_JOIN_GROUP /
 * IPV6_LEAVE_GROUP (on the kernel socket, and on the RNIC when it has its own QP). RS_SOL_DGRAM: RS_DGRAM_STATS
 * (get, struct rs_dgram_stats). Everything else goes to the kernel socket unchanged (SO_BROADCAST, IP_TOS,
 * IP_MULTICAST_*, ...), and the kernel's answer is returned.
 */
#define RS_SOL_DGRAM 0x4447                 /* "DG" */
#define RS_DGRAM_STATS 1

struct rs_dgram_stats {
    uint64_t tx_kernel;                 /* datagrams sent through the kernel socket (rule, fallback, probing) */
    uint64_t tx_send, tx_record, tx_sink;   /* datagram-iWARP: SEND, Write-Record into a lane, into a sink */
    uint64_t tx_bytes_rdma;
    uint64_t rx_kernel;                 /* plain datagrams received (not datagram-iWARP) */
    uint64_t rx_rdma, rx_bytes_rdma;    /* datagram-iWARP datagrams delivered to the application */
    uint64_t rx_copied;                 /* delivered by a copy out of a posted receive, a lane or a raw buffer */
    uint64_t rx_zcopy;                  /* placed by the RNIC straight into the application's buffer */
    uint64_t rx_dropped;                /* no room (like the kernel's receive-buffer errors): every cause below */
    uint64_t rx_drop_no_recv, rx_drop_no_room, rx_drop_queue, rx_drop_lane, rx_drop_partial;
    uint64_t probes_sent, answers_received, probes_received, answers_sent, refusals_sent, refusals_received;
    uint64_t announces_sent, announces_received, peer_restarts;
    uint64_t sinks_advertised, sinks_filled, sinks_revoked, sinks_salvaged;
    uint64_t lane_full;                 /* lane window full: sent as SEND instead */
    uint64_t control_sent, control_received;
};

int rs_dgram_setsockopt(struct rs_dgram_sock *s, int level, int name, const void *val, socklen_t len);
int rs_dgram_getsockopt(struct rs_dgram_sock *s, int level, int name, void *val, socklen_t *len);
int rs_dgram_set_nonblock(struct rs_dgram_sock *s, bool nonblock);
/* FIONREAD: length of the next datagram (0 if none), as Linux UDP answers it. */
int rs_dgram_inq(struct rs_dgram_sock *s);
int rs_dgram_getsockname(struct rs_dgram_sock *s, struct sockaddr *addr, socklen_t *len);
int rs_dgram_getpeername(struct rs_dgram_sock *s, struct sockaddr *addr, socklen_t *len);

/* ---- process statistics (rdmasock stat) ---- */
/*
 * From now on, every datagram the socket moves over RDMA is counted in the process's statistics area (counters
 * rdma_bytes_tx/rx and rdma_msgs_tx/rx of proto udp) and, when slot >= 0, in that socket slot (bytes and messages,
 * local and peer addresses). Datagrams that go through the kernel socket are not counted there: the counters are
 * the evidence that the RDMA path carried the traffic. The caller keeps the slot until after rs_dgram_close.
 */
void rs_dgram_set_stats_slot(struct rs_dgram_sock *s, int slot);

/* ---- registration coherence (munmap/mremap hooks of the interception layer) ---- */
/* Forgets cached registrations of application buffers overlapping [addr, addr+len). */
void rs_dgram_mem_unmapped(const void *addr, size_t len);

/* ---- TEST ONLY ---- */
/* The RNIC of a socket (NULL before it is bound), for tests that turn the soft RNIC's drop knob. */
struct rs_rnic *rs_dgram_test_rnic(struct rs_dgram_sock *s);
/* Closes like a process that dies: no goodbye to the peers. */
int rs_dgram_test_close_silently(struct rs_dgram_sock *s);
/* Runs one datagram through the socket's raw-datagram path as if the RNIC had handed it back (the fuzz target):
 * status RS_WC_SUCCESS for a plain datagram, RS_WC_REM_ACCESS_ERR with the record fields for a refused
 * Write-Record. */
struct rs_rnic_raw_dgram;
int rs_dgram_test_inject(struct rs_dgram_sock *s, const struct rs_rnic_raw_dgram *tmpl, const void *data, size_t len);
/* True when datagrams to peer go over RDMA now (discovery done). */
bool rs_dgram_test_peer_rdma(struct rs_dgram_sock *s, const struct sockaddr *peer);

#endif /* RS_DGRAM_WR_DGRAM_H */
