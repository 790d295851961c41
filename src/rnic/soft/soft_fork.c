/*
 * soft_fork.c: the soft RNIC's sockets in a forked child.
 *
 * The RNIC state (QPs, the progress thread) stays with the process that created it; a child gets copies of its
 * sockets' fds but nothing that serves them. Those copies are harmful, not just idle: a listening socket shares
 * its port with the parent's under SO_REUSEPORT and the kernel hands it connections nobody accepts, and a
 * connected socket keeps the TCP connection open after the parent closes it, so the peer never sees the FIN.
 * So every socket the soft RNIC created is recorded here, and the child closes its copies in an atfork handler,
 * before any code of the child can run. Fds of the application (a UDP socket a UD QP adopted) are never recorded.
 */
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rnic/soft/soft.h"

#define OWNED_MAX_FD (1u << 20)                 /* the kernel's default nr_open */
static uint64_t owned[OWNED_MAX_FD / 64];        /* bit per fd; atomic updates */

void rs_soft_fd_owned(int fd)
{
    if (fd >= 0 && (unsigned)fd < OWNED_MAX_FD)
        __atomic_or_fetch(&owned[(unsigned)fd / 64], 1ull << ((unsigned)fd % 64), __ATOMIC_RELAXED);
}

void rs_soft_fd_released(int fd)
{
    if (fd >= 0 && (unsigned)fd < OWNED_MAX_FD)
        __atomic_and_fetch(&owned[(unsigned)fd / 64], ~(1ull << ((unsigned)fd % 64)), __ATOMIC_RELAXED);
}

static void close_owned_in_child(void)
{
    for (unsigned w = 0; w < OWNED_MAX_FD / 64; w++) {
        uint64_t bits = owned[w];
        if (!bits)
            continue;
        owned[w] = 0;
        while (bits) {
            unsigned b = (unsigned)__builtin_ctzll(bits);
            bits &= bits - 1;
            syscall(SYS_close, (long)(w * 64 + b));
        }
    }
}

__attribute__((constructor)) static void soft_fork_init(void)
{
    pthread_atfork(NULL, NULL, close_owned_in_child);
}
