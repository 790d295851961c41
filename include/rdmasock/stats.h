/*
 * rdmasock per-process statistics area: shared-memory layout.
 *
 * Every process running with rdmasock publishes one POSIX shared-memory
 * object named "/rdmasock.<euid>.<pid>" (i.e. /dev/shm/rdmasock.<euid>.<pid>
 * on Linux), mode 0600, of fixed size RS_STATS_AREA_SIZE. Any process of the
 * same user may map it read-only and decode it with this header alone; the
 * `rdmasock stat` command is one such reader.
 *
 * Reading rules
 *  - Check magic == RS_STATS_MAGIC and layout_version == RS_STATS_LAYOUT_VERSION
 *    and that the object is at least total_size bytes. The writer fills the
 *    header first and stores the magic last, so a missing magic means "still
 *    initialising" if the pid is alive.
 *  - Later versions only append: fields keep their offsets, and the offsets
 *    and sizes recorded in the header are authoritative.
 *  - Global counters are independent 64-bit values updated with relaxed
 *    atomic adds; read each with an atomic 64-bit load (any aligned 64-bit
 *    load on x86-64/aarch64).
 *  - The text fields of the header and each socket slot are guarded by a
 *    sequence counter (seqlock). To read a consistent copy:
 *        do { s1 = load_acquire(&x->seq); if (s1 & 1) retry;
 *             copy = *x; acquire_fence(); s2 = load(&x->seq); }
 *        while (s1 != s2);
 *    Bound the number of retries: a writer that died in the middle of an
 *    update leaves the counter odd forever.
 *  - A process that is gone leaves its object behind if it did not exit
 *    normally. It is stale when the pid no longer exists, or when the pid's
 *    start time (field 22 of /proc/PID/stat) differs from proc_start_ticks.
 *
 * All integers are in host byte order; addresses are struct sockaddr_in6
 * (IPv4 peers as v4-mapped addresses, port in network byte order).
 */
#ifndef RDMASOCK_STATS_H
#define RDMASOCK_STATS_H

#include <netinet/in.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RS_STATS_MAGIC "RDMASOCK"           /* 8 bytes, no NUL stored */
#define RS_STATS_MAGIC_LEN 8
#define RS_STATS_LAYOUT_VERSION 1
#define RS_STATS_SHM_PREFIX "rdmasock."     /* object name: "/" prefix uid "." pid */

#define RS_STATS_MAX_SOCKETS 1024
#define RS_STATS_PROGRAM_LEN 64
#define RS_STATS_TRANSPORT_LEN 32
#define RS_STATS_PATH_LEN 256
#define RS_STATS_ERROR_LEN 256
#define RS_STATS_PROTO_SLOTS 4              /* counters per protocol */
#define RS_STATS_REASON_SLOTS 64            /* counters per reason */

/* Protocol of an intercepted socket. */
enum rs_stats_proto {
    RS_STATS_PROTO_TCP = 0,                 /* AF_INET/AF_INET6 SOCK_STREAM */
    RS_STATS_PROTO_UDP = 1,                 /* AF_INET/AF_INET6 SOCK_DGRAM */
    RS_STATS_PROTO_OTHER = 2,
    RS_STATS_PROTO_COUNT = 3,
};

/* Where a socket's traffic goes. */
enum rs_stats_path {
    RS_STATS_PATH_UNDECIDED = 0,            /* not connected/bound yet */
    RS_STATS_PATH_KERNEL = 1,               /* kernel TCP/UDP by decision */
    RS_STATS_PATH_RDMA = 2,
    RS_STATS_PATH_FALLBACK = 3,             /* RDMA was tried, kernel is used */
    RS_STATS_PATH_COUNT = 4,
};

enum rs_stats_role {
    RS_STATS_ROLE_UNKNOWN = 0,
    RS_STATS_ROLE_CLIENT = 1,               /* connect() */
    RS_STATS_ROLE_LISTENER = 2,             /* listen() */
    RS_STATS_ROLE_ACCEPTED = 3,             /* returned by accept() */
    RS_STATS_ROLE_DATAGRAM = 4,             /* unconnected datagram socket */
    RS_STATS_ROLE_COUNT = 5,
};

enum rs_stats_state {
    RS_STATS_STATE_CREATED = 0,
    RS_STATS_STATE_BOUND = 1,
    RS_STATS_STATE_LISTENING = 2,
    RS_STATS_STATE_CONNECTING = 3,
    RS_STATS_STATE_CONNECTED = 4,
    RS_STATS_STATE_CLOSING = 5,
    RS_STATS_STATE_CLOSED = 6,
    RS_STATS_STATE_ERROR = 7,
    RS_STATS_STATE_COUNT = 8,
};

/*
 * Why a socket took its path. The numbers are part of the layout and never
 * change meaning; new reasons take the next free number (< RS_STATS_REASON_SLOTS).
 */
enum rs_reason {
    RS_REASON_NONE = 0,                     /* no decision yet */
    RS_REASON_RULE_KERNEL = 1,              /* a config rule says kernel */
    RS_REASON_RULE_RDMA = 2,                /* a config rule says rdma */
    RS_REASON_DEFAULT_BOTH = 3,             /* no rule matched: try RDMA, else kernel */
    RS_REASON_NO_DEVICE = 4,                /* no usable RDMA device/port */
    RS_REASON_PEER_REJECTED = 5,            /* peer refused the RDMA connection */
    RS_REASON_PEER_UNREACHABLE = 6,         /* no route / address resolution failed */
    RS_REASON_TIMEOUT = 7,                  /* RDMA connection setup timed out */
    RS_REASON_CONFIG_ERROR = 8,             /* bad configuration: all on kernel */
    RS_REASON_TRANSPORT_OFF = 9,            /* RDMA transport disabled */
    RS_REASON_UNSUPPORTED_OPTION = 10,      /* socket option RDMA cannot honour */
    RS_REASON_UNSUPPORTED_FAMILY = 11,      /* address family not handled */
    RS_REASON_UNSUPPORTED_TYPE = 12,        /* socket type/protocol not handled */
    RS_REASON_RESOURCE_EXHAUSTED = 13,      /* out of QPs, memory registrations, ... */
    RS_REASON_PEER_NOT_RDMASOCK = 14,       /* peer does not speak the rdmasock handshake */
    RS_REASON_LOOPBACK = 15,                /* loopback/local peer kept on the kernel */
    RS_REASON_INTERNAL_ERROR = 16,          /* bug or unexpected failure in rdmasock */
    RS_REASON_HANDED_BACK = 17,             /* began on RDMA, continues on kernel TCP (crossed fork/exec) */
    RS_REASON_COUNT = 18,                   /* first unassigned number */
};

enum rs_stats_config_status {
    RS_STATS_CONFIG_NONE = 0,               /* no configuration file used */
    RS_STATS_CONFIG_OK = 1,
    RS_STATS_CONFIG_ERROR = 2,              /* see config_error */
    RS_STATS_CONFIG_LOADING = 3,            /* the library has not finished reading it yet */
};

struct rs_stats_header {
    char magic[RS_STATS_MAGIC_LEN];         /* RS_STATS_MAGIC, written last */
    uint32_t layout_version;
    uint32_t header_size;                   /* sizeof(struct rs_stats_header) */
    uint64_t total_size;                    /* bytes of the whole object */
    uint32_t counters_offset;
    uint32_t counters_size;
    uint32_t sockets_offset;
    uint32_t socket_slot_size;
    uint32_t socket_slot_count;
    int32_t pid;
    uint32_t uid;
    uint32_t seq;                           /* seqlock for the fields below it */
    uint64_t start_time_ns;                 /* process start, CLOCK_REALTIME ns */
    uint64_t proc_start_ticks;              /* /proc/PID/stat field 22; 0 if unknown */
    uint64_t created_time_ns;               /* this area's creation, CLOCK_REALTIME ns */
    uint32_t config_status;                 /* enum rs_stats_config_status */
    uint32_t reserved0;
    char program[RS_STATS_PROGRAM_LEN];     /* NUL-terminated */
    char transport[RS_STATS_TRANSPORT_LEN]; /* e.g. "verbs:mlx5_0", "soft", "" */
    char config_path[RS_STATS_PATH_LEN];
    char config_error[RS_STATS_ERROR_LEN];
    uint8_t reserved[1024 - 88 - RS_STATS_PROGRAM_LEN - RS_STATS_TRANSPORT_LEN -
                     RS_STATS_PATH_LEN - RS_STATS_ERROR_LEN];
};

/* Global counters; arrays are indexed by enum rs_stats_proto / rs_reason. */
struct rs_stats_counters {
    uint64_t sockets_seen[RS_STATS_PROTO_SLOTS];      /* socket() calls intercepted */
    uint64_t sockets_rdma[RS_STATS_PROTO_SLOTS];      /* converted to RDMA */
    uint64_t sockets_kernel[RS_STATS_PROTO_SLOTS];    /* left on (or returned to) the kernel */
    uint64_t fallbacks[RS_STATS_REASON_SLOTS];        /* RDMA tried, kernel used, by reason */
    uint64_t decisions[RS_STATS_REASON_SLOTS];        /* every path decision, by reason */
    uint64_t rdma_bytes_tx[RS_STATS_PROTO_SLOTS];
    uint64_t rdma_bytes_rx[RS_STATS_PROTO_SLOTS];
    uint64_t rdma_msgs_tx[RS_STATS_PROTO_SLOTS];
    uint64_t rdma_msgs_rx[RS_STATS_PROTO_SLOTS];
    uint64_t errors;                                  /* internal errors of any kind */
    uint64_t slot_table_full;                         /* sockets without a table slot */
    uint64_t slot_updates_dropped;                    /* writes skipped on contention */
    uint64_t reserved[97];
};

/* One socket; all fields after seq are guarded by it, except the four I/O counters (bytes_tx to msgs_rx), which the
 * data path adds to atomically without it. */
struct rs_stats_socket {
    uint32_t seq;                           /* seqlock; odd while being written */
    uint32_t in_use;                        /* 0 = free slot */
    int32_t fd;
    uint8_t proto;                          /* enum rs_stats_proto */
    uint8_t role;                           /* enum rs_stats_role */
    uint8_t state;                          /* enum rs_stats_state */
    uint8_t path;                           /* enum rs_stats_path */
    uint16_t reason;                        /* enum rs_reason */
    uint16_t qos_class;                     /* index into the QoS class table */
    uint32_t reserved0;
    struct sockaddr_in6 local;              /* sin6_family 0 when unknown */
    struct sockaddr_in6 peer;
    uint64_t bytes_tx;
    uint64_t bytes_rx;
    uint64_t msgs_tx;
    uint64_t msgs_rx;
    uint64_t opened_time_ns;                /* CLOCK_REALTIME ns when the slot was taken */
    uint64_t reserved1;
};

struct rs_stats_area {
    struct rs_stats_header header;
    struct rs_stats_counters counters;
    struct rs_stats_socket sockets[RS_STATS_MAX_SOCKETS];
};

#define RS_STATS_AREA_SIZE sizeof(struct rs_stats_area)

#ifdef __cplusplus
}
#endif

#endif /* RDMASOCK_STATS_H */
