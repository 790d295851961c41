/*
 * sdp_dev.c: the RNICs SDP sockets run on, opened once per process and shared.
 *
 * Why share: each soft RNIC device runs its own progress thread and each verbs device holds a context, a PD and
 * registration state; one per socket would multiply threads and registrations. A device is found again by kind and
 * device name. Devices stay open until the process exits (sockets come and go far more often than devices).
 *
 * fork(): the child inherits the memory but not the threads, and a verbs context is not usable there. The child
 * handler forgets every device and bumps the epoch, so sockets created before the fork answer -EBADF in the child
 * and new sockets open fresh devices.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

unsigned rs_sdp_epoch;

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sdp_dev *devices;

/* Which device an address (IP only; none or a wildcard: "any") was served by. Opening a verbs device to find out
 * costs a context, an rdma_cm lookup and a progress thread started and stopped: per connection that dominated a
 * short-connection server's accept rate. Addresses rarely move between devices; a process that sees one move keeps
 * using the old device for it until it restarts. */
#define DEV_ROUTES 16
struct dev_route {
    int kind;
    bool any;
    struct sockaddr_storage addr;
    struct sdp_dev *dev;
};
static struct dev_route routes[DEV_ROUTES];
static unsigned n_routes, next_route;

static bool addr_is_any(const struct sockaddr *a)
{
    if (!a)
        return true;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->sa_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return false;
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (b->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

/* dev_lock held. */
static struct sdp_dev *route_find(int kind, const struct sockaddr *local)
{
    bool any = addr_is_any(local);
    for (unsigned i = 0; i < n_routes; i++) {
        if (routes[i].kind == kind && routes[i].any == any && (any || same_ip(&routes[i].addr, local)))
            return routes[i].dev;
    }
    return NULL;
}

/* dev_lock held. */
static void route_add(int kind, const struct sockaddr *local, struct sdp_dev *dev)
{
    if (local && local->sa_family != AF_INET && local->sa_family != AF_INET6)
        return;
    struct dev_route *r = &routes[n_routes < DEV_ROUTES ? n_routes++ : next_route++ % DEV_ROUTES];
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->any = addr_is_any(local);
    if (!r->any)
        memcpy(&r->addr, local, local->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
    r->dev = dev;
}
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void after_fork_child(void)
{
    /* The parent's objects stay allocated in the child: freeing them would touch provider state that belongs to
     * threads which do not exist here. */
    pthread_mutex_init(&dev_lock, NULL);
    devices = NULL;
    n_routes = next_route = 0;
    rs_sdp_epoch++;
}

static void at_exit(void)
{
    rs_sdp_progress_exit_flush(SDP_EXIT_FLUSH_MS);
}

static void do_init(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
    atexit(at_exit);
}

void rs_sdp_global_init(void)
{
    pthread_once(&init_once, do_init);
}

int rs_sdp_kind_from_env(void)
{
    const char *k = getenv("RS_RNIC_KIND");
    if (!k || !*k)
        return 0;
    if (strcmp(k, "soft") == 0)
        return RS_RNIC_KIND_SOFT;
    if (strcmp(k, "verbs") == 0)
        return RS_RNIC_KIND_VERBS;
    return 0;
}

static int dev_prepare(struct sdp_dev *d)
{
    int r = rs_rnic_alloc_pd(d->rnic, &d->pd);
    if (r != 0)
        return r;
    /* The keepalive target: peers READ a few bytes of it to prove this process still answers. It holds nothing. */
    d->ka_target = calloc(1, 64);
    if (!d->ka_target)
        return -ENOMEM;
    r = rs_rnic_reg_mr(d->pd, d->ka_target, 64, RS_ACCESS_REMOTE_READ | RS_ACCESS_LOCAL_WRITE, &d->ka_mr);
    if (r != 0)
        return r;
    d->cache = rs_sdp_regcache_new(d->pd, d->caps->mr_pins_pages);
    if (!d->cache)
        return -ENOMEM;
    return 0;
}

int rs_sdp_dev_get(int kind, const struct sockaddr *local, struct sdp_dev **out)
{
    rs_sdp_global_init();
    if (kind == 0)
        kind = rs_sdp_kind_from_env();
    struct rs_rnic *rnic = NULL;
    pthread_mutex_lock(&dev_lock);
    /* The soft RNIC serves every address: one device for the whole process. */
    if (kind == RS_RNIC_KIND_SOFT) {
        for (struct sdp_dev *d = devices; d; d = d->next) {
            if (d->kind == RS_RNIC_KIND_SOFT) {
                *out = d;
                pthread_mutex_unlock(&dev_lock);
                return 0;
            }
        }
    }
    struct sdp_dev *known = route_find(kind, local);
    if (known) {
        pthread_mutex_unlock(&dev_lock);
        *out = known;
        return 0;
    }
    int r = rs_rnic_open(kind, local, &rnic);
    if (r != 0) {
        pthread_mutex_unlock(&dev_lock);
        return r;
    }
    const struct rs_rnic_caps *caps = rs_rnic_caps(rnic);
    for (struct sdp_dev *d = devices; d; d = d->next) {
        if ((int)d->caps->kind == (int)caps->kind && strcmp(d->caps->name, caps->name) == 0) {
            route_add(kind, local, d);
            pthread_mutex_unlock(&dev_lock);
            rs_rnic_close(rnic);
            *out = d;
            return 0;
        }
    }
    struct sdp_dev *d = calloc(1, sizeof(*d));
    if (!d) {
        pthread_mutex_unlock(&dev_lock);
        rs_rnic_close(rnic);
        return -ENOMEM;
    }
    d->rnic = rnic;
    d->caps = caps;
    d->kind = (int)caps->kind;
    r = dev_prepare(d);
    if (r != 0) {
        /* Half-built devices are leaked rather than unwound: this only happens when the RNIC is out of
         * resources at start-up, and the objects are small. */
        pthread_mutex_unlock(&dev_lock);
        RS_WARN("sdp: preparing RNIC %s failed: %d", caps->name, r);
        return r;
    }
    d->next = devices;
    devices = d;
    route_add(kind, local, d);
    pthread_mutex_unlock(&dev_lock);
    RS_DEBUG("sdp: using RNIC %s (kind %d)", caps->name, d->kind);
    *out = d;
    return 0;
}
