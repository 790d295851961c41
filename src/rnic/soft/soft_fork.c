/*
 * soft_fork.c: the soft RNIC's sockets in a forked child.
 *
 * The RNIC state (QPs, the progress thread) stays with the process that created it; a child gets copies of its
 * sockets' fds but nothing that serves them. A connected socket's copy is harmful, not just idle: it keeps the TCP
 * connection open after the parent closes it, so the peer never sees the FIN.
 * So every socket the soft RNIC created is recorded here, and the child closes its copies in an atfork handler,
 * before any code of the child can run. Fds of the application (a UDP socket a UD QP adopted) are never recorded.
 *
 * Listening sockets are kept instead, parked: a TCP listener survives fork in every process, with its backlog, and
 * so must the RDMA port image, or a client that connects between the fork and the moment some process listens
 * again would be refused. A parked socket is watched by nobody (connections wait in the kernel's backlog); the
 * next rs_rnic_listen of the same address in this process adopts it. A listener going dormant at fork in the
 * parent is parked the same way (rs_rnic_listener_park).
 */
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rnic/soft/soft.h"
#include "common/sockaddr.h"

#define OWNED_MAX_FD (1u << 20)                 /* the kernel's default nr_open */
static uint64_t owned[OWNED_MAX_FD / 64];        /* bit per fd; atomic updates */
static uint64_t listening[OWNED_MAX_FD / 64];    /* subset of owned: listening sockets */

#define PARKED_MAX 64
static pthread_mutex_t parked_lock = PTHREAD_MUTEX_INITIALIZER;
static int parked[PARKED_MAX];
static unsigned n_parked;

static bool fd_bit(const uint64_t *set, int fd)
{
    return fd >= 0 && (unsigned)fd < OWNED_MAX_FD &&
           (__atomic_load_n(&set[(unsigned)fd / 64], __ATOMIC_RELAXED) >> ((unsigned)fd % 64)) & 1;
}

void rs_soft_fd_listening(int fd)
{
    if (fd >= 0 && (unsigned)fd < OWNED_MAX_FD)
        __atomic_or_fetch(&listening[(unsigned)fd / 64], 1ull << ((unsigned)fd % 64), __ATOMIC_RELAXED);
}

void rs_soft_listener_fd_park(int fd)
{
    pthread_mutex_lock(&parked_lock);
    if (n_parked < PARKED_MAX) {
        parked[n_parked++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&parked_lock);
    if (fd >= 0)
        rs_soft_sys_close(fd);      /* no room: behave as before parking existed */
}

int rs_soft_listener_fd_take(const struct sockaddr_storage *tcp_addr)
{
    int found = -1;
    pthread_mutex_lock(&parked_lock);
    for (unsigned i = 0; i < n_parked && found < 0; i++) {
        struct sockaddr_storage bound;
        socklen_t len = sizeof(bound);
        memset(&bound, 0, sizeof(bound));
        /* The program may have closed the fd behind our back (a daemon closing every fd): then it is no longer our
         * listener, whatever it is now, and is forgotten. */
        bool ours = fd_bit(listening, parked[i]) &&
                    rs_soft_sys_getsockname(parked[i], (struct sockaddr *)&bound, &len) == 0;
        if (ours && !rs_sockaddr_equal(&bound, tcp_addr))
            continue;
        if (ours)
            found = parked[i];
        parked[i--] = parked[--n_parked];
    }
    pthread_mutex_unlock(&parked_lock);
    return found;
}

void rs_soft_fd_owned(int fd)
{
    if (fd >= 0 && (unsigned)fd < OWNED_MAX_FD)
        __atomic_or_fetch(&owned[(unsigned)fd / 64], 1ull << ((unsigned)fd % 64), __ATOMIC_RELAXED);
}

void rs_soft_fd_released(int fd)
{
    if (fd >= 0 && (unsigned)fd < OWNED_MAX_FD) {
        __atomic_and_fetch(&owned[(unsigned)fd / 64], ~(1ull << ((unsigned)fd % 64)), __ATOMIC_RELAXED);
        __atomic_and_fetch(&listening[(unsigned)fd / 64], ~(1ull << ((unsigned)fd % 64)), __ATOMIC_RELAXED);
    }
}

static void close_owned_in_child(void)
{
    /* Single-threaded here: the lock may have been held by a parent thread at the fork. The parked list inherited
     * from the parent names fds the child holds too; the parent's live listeners join it. */
    pthread_mutex_init(&parked_lock, NULL);
    for (unsigned w = 0; w < OWNED_MAX_FD / 64; w++) {
        uint64_t bits = owned[w] & ~listening[w];
        owned[w] &= listening[w];
        while (bits) {
            unsigned b = (unsigned)__builtin_ctzll(bits);
            bits &= bits - 1;
            syscall(SYS_close, (long)(w * 64 + b));
        }
        uint64_t keep = listening[w];
        while (keep) {
            unsigned b = (unsigned)__builtin_ctzll(keep);
            keep &= keep - 1;
            int fd = (int)(w * 64 + b);
            bool known = false;
            for (unsigned i = 0; i < n_parked && !known; i++)
                known = parked[i] == fd;
            if (!known && n_parked < PARKED_MAX)
                parked[n_parked++] = fd;
            else if (!known)
                rs_soft_sys_close(fd);
        }
    }
}

__attribute__((constructor)) static void soft_fork_init(void)
{
    pthread_atfork(NULL, NULL, close_owned_in_child);
}
