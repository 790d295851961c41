/*
 * soft_cm.c: the connection-manager event channel of the soft RNIC (a queue of events and an eventfd that is
 * readable while the queue is not empty), and the dispatch of the RC connection calls to the RC half.
 *
 * Events are pushed by the UD half (peer resolution, at once) and by the RC half (from the progress thread).
 * The channel is reference counted: objects that will push later hold a reference, so destroying the channel
 * while a connection attempt is under way is safe; late events are then discarded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "common/log.h"
#include "rnic/soft/soft.h"
#include "common/fdutil.h"

struct rs_soft_cm_event_node {
    struct rs_soft_cm_event_node *next;
    struct rs_rnic_cm_event ev;
};

int rs_soft_cm_create(struct rs_rnic *rnic, struct rs_rnic_cm **out)
{
    struct rs_soft_cm *cm = calloc(1, sizeof(*cm));
    if (!cm)
        return -ENOMEM;
    cm->event_fd = rs_fd_move_high(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (cm->event_fd < 0) {
        int err = -errno;
        free(cm);
        return err;
    }
    cm->base.rnic = rnic;
    cm->dev = rs_soft_dev(rnic);
    cm->refs = 1;
    pthread_mutex_init(&cm->lock, NULL);
    *out = &cm->base;
    return 0;
}

static void drain_fd(struct rs_soft_cm *cm)
{
    uint64_t value;
    (void)rs_soft_sys_read(cm->event_fd, &value, sizeof(value));
}

/* Frees detached events (no lock held); a CONNECT_REQUEST nobody will answer goes back to the RC half. */
static void discard_events(struct rs_soft_cm_event_node *n)
{
    while (n) {
        struct rs_soft_cm_event_node *next = n->next;
        if (n->ev.request && rs_soft_rc_ops.request_discard)
            rs_soft_rc_ops.request_discard(n->ev.request);
        if (n->ev.ud_peer)
            RS_DEBUG("soft rnic: UD peer event discarded with its channel (the peer stays valid)");
        free(n);
        n = next;
    }
}

void rs_soft_cm_get(struct rs_soft_cm *cm)
{
    __atomic_add_fetch(&cm->refs, 1, __ATOMIC_ACQ_REL);
}

void rs_soft_cm_put(struct rs_soft_cm *cm)
{
    if (__atomic_sub_fetch(&cm->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    discard_events(cm->first);
    rs_soft_sys_close(cm->event_fd);
    pthread_mutex_destroy(&cm->lock);
    free(cm);
}

void rs_soft_cm_destroy(struct rs_rnic_cm *pcm)
{
    struct rs_soft_cm *cm = rs_soft_cm(pcm);
    pthread_mutex_lock(&cm->lock);
    cm->closed = true;
    struct rs_soft_cm_event_node *queued = cm->first;
    cm->first = cm->last = NULL;
    drain_fd(cm);
    pthread_mutex_unlock(&cm->lock);
    discard_events(queued);
    rs_soft_cm_put(cm);
}

int rs_soft_cm_fd(const struct rs_rnic_cm *pcm)
{
    return ((const struct rs_soft_cm *)pcm)->event_fd;
}

int rs_soft_cm_push(struct rs_soft_cm *cm, const struct rs_rnic_cm_event *ev)
{
    struct rs_soft_cm_event_node *n = malloc(sizeof(*n));
    if (!n)
        return -ENOMEM;
    n->next = NULL;
    n->ev = *ev;
    pthread_mutex_lock(&cm->lock);
    if (cm->closed) {
        pthread_mutex_unlock(&cm->lock);
        free(n);
        return -ESHUTDOWN;
    }
    if (cm->last)
        cm->last->next = n;
    else
        cm->first = n;
    cm->last = n;
    uint64_t one = 1;
    (void)rs_soft_sys_write(cm->event_fd, &one, sizeof(one));
    pthread_mutex_unlock(&cm->lock);
    return 0;
}

int rs_soft_cm_get_event(struct rs_rnic_cm *pcm, struct rs_rnic_cm_event *ev)
{
    struct rs_soft_cm *cm = rs_soft_cm(pcm);
    pthread_mutex_lock(&cm->lock);
    struct rs_soft_cm_event_node *n = cm->first;
    if (!n) {
        drain_fd(cm);
        pthread_mutex_unlock(&cm->lock);
        return -EAGAIN;
    }
    cm->first = n->next;
    if (!cm->first) {
        cm->last = NULL;
        drain_fd(cm);       /* the fd stays readable exactly while events are queued */
    }
    pthread_mutex_unlock(&cm->lock);
    *ev = n->ev;
    free(n);
    return 0;
}

/* ---- RC connection calls ---- */

int rs_soft_listen(struct rs_rnic_cm *cm, const struct sockaddr *addr, socklen_t len, int backlog,
                   struct rs_rnic_listener **out)
{
    return rs_soft_rc_ops.listen(rs_soft_cm(cm), addr, len, backlog, out);
}

int rs_soft_listener_addr(const struct rs_rnic_listener *listener, struct sockaddr_storage *out)
{
    return rs_soft_rc_ops.listener_addr(listener, out);
}

void rs_soft_listener_park(struct rs_rnic_listener *listener)
{
    rs_soft_rc_ops.listener_park(listener);
}

int rs_soft_listener_intake(struct rs_rnic_listener *listener, unsigned want, uint32_t seen)
{
    return rs_soft_rc_ops.listener_intake(listener, want, seen);
}

void rs_soft_listener_close(struct rs_rnic_listener *listener)
{
    rs_soft_rc_ops.listener_close(listener);
}

int rs_soft_accept(struct rs_rnic_conn_request *request, struct rs_rnic_qp *qp, struct rs_rnic_cm *cm,
                   const void *private_data, uint32_t private_data_len)
{
    if (rs_soft_qp(qp)->type != RS_QPT_RC)
        return -EINVAL;
    return rs_soft_rc_ops.accept(request, rs_soft_qp(qp), rs_soft_cm(cm), private_data, private_data_len);
}

int rs_soft_reject(struct rs_rnic_conn_request *request, const void *private_data, uint32_t private_data_len)
{
    return rs_soft_rc_ops.reject(request, private_data, private_data_len);
}
