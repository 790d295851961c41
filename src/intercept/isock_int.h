/*
 * isock_int.h: the intercepted socket's insides, shared by isock.c (object, paths, waiting, fork) and the call
 * files (sock_calls.c, io_calls.c). Nothing outside src/intercept includes this.
 */
#ifndef RS_INTERCEPT_ISOCK_INT_H
#define RS_INTERCEPT_ISOCK_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "common/config.h"
#include "dgram_wr/dgram.h"
#include "intercept/isock.h"
#include "intercept/policy.h"
#include "sdp_stream/sdp.h"

/* Where the application's traffic on this socket goes now. */
enum rs_isock_path {
    RS_IPATH_UNDECIDED,     /* stream socket before listen/connect: the kernel socket answers everything */
    RS_IPATH_KERNEL,        /* the rules (or a fallback) put it on the kernel: every call goes to the kernel fd */
    RS_IPATH_SDP,           /* SDP connection (connected, or connecting over RDMA) */
    RS_IPATH_LISTEN,        /* listener with an SDP side (and a kernel side when both_kernel) */
    RS_IPATH_DGRAM,         /* UDP socket adopted by the datagram layer */
};

#define RS_ISOCK_SAVED_OPTS 16

/* A socket option the application set before the socket had an SDP side: replayed onto it when it gets one. */
struct rs_saved_opt {
    int level, name;
    socklen_t len;
    unsigned char val[16];
};

struct rs_isock {
    struct rs_fd_obj obj;                   /* first: the fd table points here */
    pthread_mutex_t lock;                   /* state changes only; the data path reads the fields below it
                                             * published with release stores */
    int family, type, protocol;
    int nfds;                               /* application fds naming this socket (atomic) */
    pid_t owner;                            /* process whose RNIC state sdp/listener belong to */

    enum rs_isock_path path;                /* atomic load on the data path */
    struct rs_sdp_sock *sdp;                /* SDP connection or listener (isock holds one rs_sdp_hold) */
    struct rs_dgram_sock *dg;               /* datagram side (isock holds one rs_dgram_hold) */
    int dg_fd;                              /* private dup of the UDP socket the datagram layer reads */

    /* stream state */
    enum rs_mode mode;                      /* of the rule that decided */
    enum rs_reason reason;                  /* why (statistics area) */
    const struct rs_rule *rule;
    bool connecting;                        /* nonblocking SDP connect under way; may still fall back */
    bool kernel_listening;                  /* both-mode listener: the kernel socket listens too */
    bool dormant;                           /* listener whose SDP side must be (re)created in this process */
    int backlog;
    int pending_error;                      /* SO_ERROR to report (a fallback connect that failed at once) */
    struct sockaddr_storage dst;            /* connect destination as the application gave it */
    socklen_t dst_len;
    struct sockaddr_storage local;          /* for getsockname of converted sockets (application's family) */
    socklen_t local_len;
    struct rs_saved_opt saved[RS_ISOCK_SAVED_OPTS];
    int n_saved;

    bool seen_by_waiter;                    /* a poll/epoll has looked at it (its registrations name it) */
    unsigned interest[4];                   /* waiters per event: POLLIN, POLLOUT, POLLRDHUP, POLLPRI */
    uint32_t generation;                    /* atomic */
    int stats_slot;
};

/* Creates an isock for a fresh kernel socket fd and installs it at fd. NULL when the socket is not one rdmasock
 * may ever convert (the caller then leaves the fd untracked). */
struct rs_isock *rs_isock_create(int fd, int family, int type, int protocol);
/* Installs s at another fd naming the same open file (dup, accept of a converted connection). */
int rs_isock_install(struct rs_isock *s, int fd);

/*
 * A socket the rules put on the kernel needs nothing from rdmasock: stop tracking fd so every later call goes
 * straight to libc (the 1% budget of issue 6). Only when fd is its only name and no waiter registered it, so no
 * registration is lost. Returns true when untracked.
 */
bool rs_isock_untrack_if_kernel(struct rs_isock *s, int fd);

/* Closes the application's last name of s: the SDP/datagram side closes as a kernel socket would. */
int rs_isock_last_close(struct rs_isock *s);

/* Stream path changes (isock.c) */
int rs_isock_listen(struct rs_isock *s, int fd, int backlog);
int rs_isock_connect(struct rs_isock *s, int fd, const struct sockaddr *dst, socklen_t len);
int rs_isock_accept(struct rs_isock *s, int fd, struct sockaddr *addr, socklen_t *len, int flags);
/* Finishes a nonblocking SDP connect if its outcome is known: success, or fallback to the kernel. */
void rs_isock_settle_connect(struct rs_isock *s, int fd);
/* Recreates a dormant listener's SDP side in this process. */
void rs_isock_revive(struct rs_isock *s, int fd);

/* Data-path accessors: the current path with a reference on its object, so a concurrent close cannot free it. */
static inline enum rs_isock_path rs_isock_path_now(struct rs_isock *s)
{
    return __atomic_load_n(&s->path, __ATOMIC_ACQUIRE);
}

void rs_isock_save_opt(struct rs_isock *s, int level, int name, const void *val, socklen_t len);
void rs_isock_set_stats_io(struct rs_isock *s, size_t tx, size_t rx);

/* Converts a v4-mapped IPv6 address to IPv4 (for the RNIC), and an IPv4 address to the application's family. */
socklen_t rs_addr_unmap(const struct sockaddr *in, socklen_t len, struct sockaddr_storage *out);
socklen_t rs_addr_to_family(int family, const struct sockaddr *in, socklen_t len, struct sockaddr_storage *out);
/* Copies a sockaddr out as the kernel does (truncated to *len, *len set to the full size). */
void rs_addr_copy_out(const struct sockaddr_storage *a, socklen_t alen, struct sockaddr *out, socklen_t *len);

/* errno convention: -errno from the lower layers to -1/errno for the application. */
static inline long rs_ret(long r)
{
    if (r < 0) {
        errno = (int)-r;
        return -1;
    }
    return r;
}

#endif /* RS_INTERCEPT_ISOCK_INT_H */
