/*
 * dgram_dev.c: what all datagram sockets of a process share: the RNIC and its protection domain (one per kind,
 * and per local address for verbs devices), per-thread wake-up fds for blocked calls, addresses as keys, and the
 * host's broadcast addresses.
 *
 * One RNIC for all sockets: the soft RNIC runs one progress thread per device, so sharing it keeps the thread
 * count constant however many UDP sockets the program opens (docs/rnic.md, "one thread per device").
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>

#include "common/log.h"
#include "dgram_wr/dgram_int.h"

uint64_t rs_dg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t rs_dg_random64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
        static uint64_t fallback;
        v = rs_dg_now_ns() ^ (__atomic_add_fetch(&fallback, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED)) ^
            ((uint64_t)getpid() << 32);
    }
    return v ? v : 1;
}

/* ---- devices ---- */

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rs_dg_dev *devs;

int rs_dg_kind_from_env(int kind)
{
    if (kind)
        return kind;
    const char *k = getenv("RS_RNIC_KIND");
    if (k && strcmp(k, "soft") == 0)
        return RS_RNIC_KIND_SOFT;
    if (k && strcmp(k, "verbs") == 0)
        return RS_RNIC_KIND_VERBS;
    return 0;
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    struct rs_dg_key ka, kb;
    rs_dg_key_of((const struct sockaddr *)a, &ka);
    rs_dg_key_of(b, &kb);
    return memcmp(ka.addr, kb.addr, sizeof(ka.addr)) == 0;
}

static struct rs_dg_dev *dev_find(int kind, const struct sockaddr *local)
{
    for (struct rs_dg_dev *d = devs; d; d = d->next)
        if (d->kind == kind && (kind == RS_RNIC_KIND_SOFT || same_ip(&d->local, local)))
            return d;
    return NULL;
}

static int dev_open(int kind, const struct sockaddr *local, struct rs_dg_dev **out)
{
    struct rs_rnic *rnic = NULL;
    int rc = rs_rnic_open(kind, local, &rnic);
    if (rc)
        return rc;
    struct rs_dg_dev *d = calloc(1, sizeof(*d));
    if (!d) {
        rs_rnic_close(rnic);
        return -ENOMEM;
    }
    rc = rs_rnic_alloc_pd(rnic, &d->pd);
    if (rc) {
        rs_rnic_close(rnic);
        free(d);
        return rc;
    }
    d->rnic = rnic;
    d->kind = (int)rs_rnic_caps(rnic)->kind;
    memcpy(&d->local, local, local->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                          : sizeof(struct sockaddr_in));
    d->next = devs;
    devs = d;
    RS_DEBUG("dgram: opened RNIC %s", rs_rnic_caps(rnic)->name);
    *out = d;
    return 0;
}

/* Auto: a verbs device serving the address if there is one (asked once per process: device lists do not change
 * under a running program often enough to pay for asking per socket), else the soft RNIC. */
static bool verbs_absent;

int rs_dg_dev_get(int kind, const struct sockaddr *local, struct rs_dg_dev **out)
{
    *out = NULL;
    pthread_mutex_lock(&dev_lock);
    struct rs_dg_dev *d = NULL;
    int rc = 0;
    if (kind == 0) {
        d = dev_find(RS_RNIC_KIND_VERBS, local);
        if (!d && !verbs_absent) {
            rc = dev_open(RS_RNIC_KIND_VERBS, local, &d);
            if (rc == -ENODEV)
                verbs_absent = true;
        }
        if (!d)
            kind = RS_RNIC_KIND_SOFT;
    }
    if (!d) {
        d = dev_find(kind, local);
        if (!d)
            rc = dev_open(kind, local, &d);
    }
    if (d) {
        d->refs++;
        *out = d;
        rc = 0;
    }
    pthread_mutex_unlock(&dev_lock);
    return rc;
}

void rs_dg_dev_put(struct rs_dg_dev *dev)
{
    if (!dev)
        return;
    pthread_mutex_lock(&dev_lock);
    if (--dev->refs > 0) {
        pthread_mutex_unlock(&dev_lock);
        return;
    }
    struct rs_dg_dev **link = &devs;
    while (*link && *link != dev)
        link = &(*link)->next;
    if (*link)
        *link = dev->next;
    pthread_mutex_unlock(&dev_lock);
    /* Last socket gone: the soft RNIC's progress thread stops with it. */
    if (rs_rnic_dealloc_pd(dev->pd) != 0)
        RS_WARN("dgram: protection domain still in use at close");
    rs_rnic_close(dev->rnic);
    free(dev);
}

/* ---- per-thread wake-up fds ---- */

static pthread_key_t efd_key;
static pthread_once_t efd_once = PTHREAD_ONCE_INIT;
static __thread int thread_efd = -1;

static void efd_destroy(void *arg)
{
    int fd = (int)(intptr_t)arg - 1;
    if (fd >= 0)
        syscall(SYS_close, fd);
}

static void efd_key_init(void)
{
    (void)pthread_key_create(&efd_key, efd_destroy);
}

int rs_dg_thread_efd(void)
{
    if (thread_efd >= 0)
        return thread_efd;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    pthread_once(&efd_once, efd_key_init);
    (void)pthread_setspecific(efd_key, (void *)(intptr_t)(fd + 1));
    thread_efd = fd;
    return fd;
}

void rs_dg_efd_signal(int efd)
{
    uint64_t one = 1;
    (void)syscall(SYS_write, efd, &one, sizeof(one));
}

void rs_dg_efd_drain(int efd)
{
    uint64_t v;
    (void)syscall(SYS_read, efd, &v, sizeof(v));
}

/* ---- addresses ---- */

void rs_dg_key_of(const struct sockaddr *sa, struct rs_dg_key *k)
{
    memset(k, 0, sizeof(*k));
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
        k->addr[10] = 0xff;
        k->addr[11] = 0xff;
        memcpy(&k->addr[12], &sin->sin_addr, 4);
        k->port = sin->sin_port;
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        memcpy(k->addr, &s6->sin6_addr, 16);
        k->port = s6->sin6_port;
    }
}

bool rs_dg_key_equal(const struct rs_dg_key *a, const struct rs_dg_key *b)
{
    return a->port == b->port && memcmp(a->addr, b->addr, sizeof(a->addr)) == 0;
}

socklen_t rs_dg_addr_for_family(int family, const struct sockaddr *sa, socklen_t salen, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (sa->sa_family == AF_INET && salen >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
        if (family == AF_INET) {
            memcpy(out, sin, sizeof(*sin));
            return sizeof(*sin);
        }
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)out;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = sin->sin_port;
        s6->sin6_addr.s6_addr[10] = 0xff;
        s6->sin6_addr.s6_addr[11] = 0xff;
        memcpy(&s6->sin6_addr.s6_addr[12], &sin->sin_addr, 4);
        return sizeof(*s6);
    }
    if (sa->sa_family == AF_INET6 && salen >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        if (family == AF_INET6) {
            memcpy(out, s6, sizeof(*s6));
            return sizeof(*s6);
        }
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            struct sockaddr_in *sin = (struct sockaddr_in *)out;
            sin->sin_family = AF_INET;
            sin->sin_port = s6->sin6_port;
            memcpy(&sin->sin_addr, &s6->sin6_addr.s6_addr[12], 4);
            return sizeof(*sin);
        }
    }
    return 0;
}

/* The host's IPv4 broadcast addresses (interface broadcast, and the all-ones host part of each prefix, which
 * covers loopback's 127.255.255.255), read once. */
#define MAX_BCAST 32
static pthread_once_t bcast_once = PTHREAD_ONCE_INIT;
static uint32_t bcast_addrs[MAX_BCAST];
static unsigned bcast_count;

static void bcast_add(uint32_t a)
{
    for (unsigned i = 0; i < bcast_count; i++)
        if (bcast_addrs[i] == a)
            return;
    if (bcast_count < MAX_BCAST)
        bcast_addrs[bcast_count++] = a;
}

static void bcast_init(void)
{
    bcast_add(htonl(INADDR_BROADCAST));
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0)
        return;
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_netmask)
            continue;
        uint32_t a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        uint32_t m = ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr;
        if (m != htonl(0xffffffffu) && m != htonl(0xfffffffeu))
            bcast_add(a | ~m);
        /* An address configured without a broadcast address (`ip addr add A/24` without `brd`) comes back from
         * getifaddrs with ifa_broadaddr = the address itself: that is the host, not a broadcast. */
        if ((i->ifa_flags & IFF_BROADCAST) && i->ifa_broadaddr && i->ifa_broadaddr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_broadaddr)->sin_addr.s_addr != a)
            bcast_add(((struct sockaddr_in *)i->ifa_broadaddr)->sin_addr.s_addr);
    }
    freeifaddrs(list);
}

bool rs_dg_is_group(const struct sockaddr *sa, bool *broadcast)
{
    *broadcast = false;
    uint32_t v4;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_MULTICAST(a))
            return true;
        if (!IN6_IS_ADDR_V4MAPPED(a))
            return false;
        memcpy(&v4, &a->s6_addr[12], 4);
    } else if (sa->sa_family == AF_INET) {
        v4 = ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
    } else {
        return false;
    }
    if (IN_MULTICAST(ntohl(v4)))
        return true;
    pthread_once(&bcast_once, bcast_init);
    for (unsigned i = 0; i < bcast_count; i++) {
        if (bcast_addrs[i] == v4) {
            *broadcast = true;
            return true;
        }
    }
    return false;
}
