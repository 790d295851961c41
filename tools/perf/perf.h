/*
 * perf.h: rdmasock-perf, verbs-level latency and bandwidth of the rnic.h providers next to plain kernel TCP/UDP.
 *
 * Two processes: a client that drives every measurement and prints the CSV, and a server that answers (echoes in
 * ping-pong, receives and counts in streaming). They talk over a kernel TCP control connection (ctrl.c); the data
 * goes over the RNIC (rdma_*.c) or over plain kernel sockets (kernel.c). --loopback forks the server on 127.0.0.1.
 *
 * Measurement rules (docs/perf.md says the same for readers of the CSV):
 *   lat   ping-pong, one message in flight. avg/median are one-way times (half the round trip) for send, write,
 *         wrecord, tcp, udp; the whole operation for read (a READ is a round trip by nature, as perftest reports).
 *   bw    back-to-back with a window of outstanding requests. The rate is taken where the data arrives: the
 *         server counts arrivals from the moment it said READY to the last one (send, wrecord, tcp, udp); for RC
 *         write, to the SEND notice that follows the last write (a SEND after a WRITE arrives after its data);
 *         for read the client is the receiver. UD and UDP may lose datagrams: the rate counts what arrived, and
 *         `lost` says how many did not.
 */
#ifndef RS_PERF_PERF_H
#define RS_PERF_PERF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#include "rnic/rnic.h"

#define PERF_DEFAULT_PORT 18515             /* the control port (perftest's, so firewall notes carry over) */
#define PERF_MAX_SIZES 64
#define PERF_DEFAULT_WINDOW 128u
#define PERF_UDP_MAX 65507u                 /* largest IPv4 UDP payload: bigger udp points are skipped */
#define PERF_LOSS_TIMEOUT_MS 1000           /* ping-pong over UD/UDP: a reply not back by then was lost */
#define PERF_IDLE_MS 200                    /* streaming over UD/UDP: the receiver stops this long after DONE */
#define PERF_RELIABLE_TIMEOUT_MS 30000      /* RC/TCP: a run that makes no progress this long is a failure */

enum perf_test { PERF_SEND, PERF_WRITE, PERF_WRECORD, PERF_READ, PERF_TCP, PERF_UDP };
enum perf_transport { PERF_UD, PERF_RC, PERF_KERNEL };
enum perf_mode { PERF_LAT, PERF_BW };

/* One selectable test: what the CSV calls test,transport. */
struct perf_case {
    enum perf_test test;
    enum perf_transport transport;
    const char *name;                       /* as --tests spells it: "ud:send", "tcp", ... */
};
extern const struct perf_case perf_cases[];
extern const size_t perf_case_count;

const char *perf_test_name(enum perf_test t);
const char *perf_transport_name(enum perf_transport t);
const char *perf_mode_name(enum perf_mode m);

/* Endpoint groups a server sets up once and reuses for every point. */
enum perf_group { PERF_GROUP_UD, PERF_GROUP_RC, PERF_GROUP_TCP, PERF_GROUP_UDP, PERF_GROUP_COUNT };
enum perf_group perf_case_group(const struct perf_case *c);

enum perf_role { PERF_ROLE_LOOPBACK, PERF_ROLE_SERVER, PERF_ROLE_CLIENT };

struct perf_opts {
    enum perf_role role;
    const char *host;                       /* --client HOST */
    const char *bind;                       /* --bind ADDR (server side) */
    uint16_t port;
    int kind;                               /* RS_RNIC_KIND_SOFT or _VERBS */
    bool poll;                              /* busy-poll CQs and sockets instead of blocking */
    uint64_t iters;                         /* --iters N (0: time-based) */
    double seconds;                         /* --seconds S per point */
    int64_t warmup;                         /* --warmup N iterations (-1: the calibration run warms up) */
    uint32_t window;
    size_t sizes[PERF_MAX_SIZES];
    size_t size_count;
    bool case_on[16];                       /* indexed like perf_cases */
    bool mode_on[2];
    const char *csv_path;
    bool quiet;
    int cpu_client, cpu_server;             /* --cpus: pin each side (all its threads) to a CPU; -1: not pinned */
};

/* ---- time and statistics (stats.c) ----------------------------------------------------------------------- */

uint64_t perf_now_ns(void);
/* Median of n values (sorts them). 0 when n is 0. */
uint64_t perf_median_u64(uint64_t *v, size_t n);

/* What a measurement produced, before it becomes a CSV row. */
struct perf_result {
    uint64_t iterations;                    /* round trips (lat) or messages sent (bw) */
    uint64_t delivered;                     /* messages that arrived (bw) */
    uint64_t lost;
    double avg_us, median_us;               /* bw: avg_us = 1 / msg_rate; median_us < 0 (not measured) */
    double msg_rate, mb_per_s;
    double client_elapsed_s;                /* for calibration */
};

void perf_csv_header(FILE *out, const struct perf_opts *o, const char *provider_name);
void perf_csv_row(FILE *out, const struct perf_case *c, enum perf_mode mode, size_t size, const struct perf_result *r,
                  const struct perf_opts *o, const char *provider_name);

/* ---- control channel (ctrl.c) ---------------------------------------------------------------------------- */

enum perf_msg_type {
    PERF_MSG_HELLO = 1,     /* client -> server: kind, flags; server -> client: status, provider caps */
    PERF_MSG_SETUP,         /* client -> server: group; reply SETUP with the server's endpoint */
    PERF_MSG_PEER,          /* client -> server: the client's endpoint; reply PEER when both ends are ready */
    PERF_MSG_RUN,           /* client -> server: one run; reply READY */
    PERF_MSG_READY,
    PERF_MSG_DONE,          /* client -> server: the client finished (count = messages it sent); reply RESULT */
    PERF_MSG_RESULT,
    PERF_MSG_QUIT,
    PERF_MSG_ERROR,         /* either way: status = -errno, text in stderr of the side that failed */
};

#define PERF_FLAG_POLL 1u           /* HELLO: both sides busy-poll */
#define PERF_FLAG_RDMA 2u           /* HELLO: the client will ask for UD or RC endpoints: open the RNIC */

/* Every field is a 64-bit word, sent big-endian. */
struct perf_msg {
    uint64_t type;
    uint64_t group, test, transport, mode;
    uint64_t size, count, window, flags;
    uint64_t port, rkey, addr, len;         /* an endpoint: UDP/TCP port, and the region a peer may access */
    uint64_t received, lost, elapsed_ns, credits;
    uint64_t kind;
    int64_t status;
};

/* Send/receive one message: 0, or -errno (-ECONNRESET when the peer closed). */
int perf_msg_send(int fd, const struct perf_msg *m);
int perf_msg_recv(int fd, struct perf_msg *m);
/* Non-blocking: 1 if a whole message was read, 0 if none is waiting, -errno. */
int perf_msg_try_recv(int fd, struct perf_msg *m);
/* Receive a message of the expected type (an ERROR message or anything else fails with its status). */
int perf_msg_expect(int fd, uint64_t type, struct perf_msg *m);
/* Client: RUN for one point, then the server's READY. */
int perf_run_begin(int fd, const struct perf_case *c, enum perf_mode mode, size_t size, uint64_t count,
                   uint32_t window, struct perf_msg *ready);
/* Client: DONE (sent messages), then the server's RESULT. */
int perf_run_end(int fd, uint64_t sent, struct perf_msg *result);
/* Server: the reply to RUN, and RESULT. */
int perf_reply(int fd, uint64_t type, const struct perf_msg *fields);

/* Resolves host (numeric or name) and port into an IPv4/IPv6 address. 0 or -errno. */
int perf_resolve(const char *host, uint16_t port, struct sockaddr_storage *out, socklen_t *len);
socklen_t perf_addr_len(const struct sockaddr_storage *a);
uint16_t perf_addr_port(const struct sockaddr_storage *a);
void perf_addr_set_port(struct sockaddr_storage *a, uint16_t port);
const char *perf_addr_str(const struct sockaddr_storage *a, char *buf, size_t len);
/* TCP listener on addr (port 0: any); returns the fd or -errno. */
int perf_tcp_listen(const struct sockaddr_storage *addr, int backlog);
int perf_tcp_connect(const struct sockaddr_storage *addr, int timeout_ms);

/* ---- the server (server.c) ------------------------------------------------------------------------------- */

/* Serves control connections on listen_fd: one client at a time, until a client says QUIT (loopback: once). */
int perf_server(const struct perf_opts *o, int listen_fd, bool once);

/* ---- RDMA side (rdma_ep.c, rdma_run.c) ------------------------------------------------------------------- */

struct perf_rdma;           /* one RNIC device of this process, with its endpoints */

int perf_rdma_open(int kind, const struct sockaddr_storage *local, bool poll, struct perf_rdma **out);
void perf_rdma_close(struct perf_rdma *r);
const struct rs_rnic_caps *perf_rdma_caps(const struct perf_rdma *r);
/* Largest message a case may use on this device (0: the case cannot run here). */
size_t perf_rdma_max_size(const struct perf_rdma *r, const struct perf_case *c);

/* Server side of SETUP/PEER for UD or RC: fills reply (port, rkey, addr, len). */
int perf_rdma_server_setup(struct perf_rdma *r, enum perf_group g, const struct sockaddr_storage *local,
                           size_t buf_len, struct perf_msg *reply);
int perf_rdma_server_peer(struct perf_rdma *r, enum perf_group g, const struct sockaddr_storage *client_addr,
                          const struct perf_msg *peer);
/* Client side: connects to / resolves the server described by its SETUP reply; fills mine for PEER. */
int perf_rdma_client_setup(struct perf_rdma *r, enum perf_group g, const struct sockaddr_storage *local,
                           const struct sockaddr_storage *server, const struct perf_msg *server_ep, size_t buf_len,
                           struct perf_msg *mine);
/* After the server acknowledged PEER (RC: the connection is up on both sides). */
int perf_rdma_client_ready(struct perf_rdma *r, enum perf_group g);

/* One run. The client exchanges RUN/READY and DONE/RESULT with the server over ctrl_fd itself and returns its
 * measurements in res; the server gets the RUN message, answers READY, runs, and replies RESULT. */
int perf_rdma_client_run(struct perf_rdma *r, int ctrl_fd, const struct perf_case *c, enum perf_mode mode,
                         size_t size, uint64_t count, uint32_t window, struct perf_result *res);
int perf_rdma_server_run(struct perf_rdma *r, int ctrl_fd, const struct perf_msg *run);

/* ---- kernel sockets (kernel.c) --------------------------------------------------------------------------- */

struct perf_kernel;

int perf_kernel_open(bool poll, struct perf_kernel **out);
void perf_kernel_close(struct perf_kernel *k);
int perf_kernel_server_setup(struct perf_kernel *k, enum perf_group g, const struct sockaddr_storage *local,
                             size_t buf_len, struct perf_msg *reply);
int perf_kernel_server_peer(struct perf_kernel *k, enum perf_group g, const struct perf_msg *peer,
                            const struct sockaddr_storage *client_addr);
int perf_kernel_client_setup(struct perf_kernel *k, enum perf_group g, const struct sockaddr_storage *local,
                             const struct sockaddr_storage *server, const struct perf_msg *server_ep, size_t buf_len,
                             struct perf_msg *mine);
int perf_kernel_client_run(struct perf_kernel *k, int ctrl_fd, const struct perf_case *c, enum perf_mode mode,
                           size_t size, uint64_t count, uint32_t window, struct perf_result *res);
int perf_kernel_server_run(struct perf_kernel *k, int ctrl_fd, const struct perf_msg *run);

/* ---- shared by the run loops ------------------------------------------------------------------------------ */

/* Fills res from round-trip samples (ns). one_way: halve them (all but READ). Sorts samples. */
void perf_result_from_rtts(struct perf_result *res, uint64_t *rtt_ns, uint64_t n, bool one_way, size_t size,
                           uint64_t lost, uint64_t elapsed_ns);
/* Fills res from what a receiver counted: span_msgs messages arrived within span_ns (from the moment the receiver
 * said READY to the last arrival), delivered of sent in all. */
void perf_result_from_stream(struct perf_result *res, uint64_t sent, uint64_t delivered, uint64_t span_msgs,
                             uint64_t span_ns, size_t size, uint64_t client_elapsed_ns);

/* Prints a diagnostic on stderr with the process's role. */
void perf_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern const char *perf_role_tag;

#endif /* RS_PERF_PERF_H */
