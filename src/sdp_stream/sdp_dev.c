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
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

unsigned rs_sdp_epoch;

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sdp_dev *devices;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void after_fork_child(void)
{
    /* The parent's objects stay allocated in the child: freeing them would touch provider state that belongs to
     * threads which do not exist here. */
    pthread_mutex_init(&dev_lock, NULL);
    devices = NULL;
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
    d->cache = rs_sdp_regcache_new(d->pd);
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
    int r = rs_rnic_open(kind, local, &rnic);
    if (r != 0) {
        pthread_mutex_unlock(&dev_lock);
        return r;
    }
    const struct rs_rnic_caps *caps = rs_rnic_caps(rnic);
    for (struct sdp_dev *d = devices; d; d = d->next) {
        if ((int)d->caps->kind == (int)caps->kind && strcmp(d->caps->name, caps->name) == 0) {
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
    pthread_mutex_unlock(&dev_lock);
    RS_DEBUG("sdp: using RNIC %s (kind %d)", caps->name, d->kind);
    *out = d;
    return 0;
}
