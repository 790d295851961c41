/*
 * server.c: rdmasock-perf's passive side. It does what the client's control messages ask: open the RNIC the
 * client names (HELLO), set up an endpoint group and answer with its address (SETUP), finish the connection once it
 * knows the client's endpoint (PEER), and answer runs (RUN ... RESULT), until QUIT or the client goes away.
 *
 * The data plane uses the address the control connection arrived on, so in the two-host topology the server needs
 * no address option: the client's HOST is where everything goes.
 */
#include <stdlib.h>
#include <string.h>

#include "perf.h"
#include "sys.h"

struct session {
    int fd;
    struct sockaddr_storage local, peer;    /* of the control connection */
    struct perf_rdma *rdma;
    struct perf_kernel *kernel;
    bool poll;
};

static int fail(struct session *s, int rc, const char *what)
{
    perf_log("%s: %s", what, strerror(rc < 0 ? -rc : rc));
    struct perf_msg m;
    memset(&m, 0, sizeof(m));
    m.status = rc < 0 ? rc : -rc;
    perf_reply(s->fd, PERF_MSG_ERROR, &m);
    return rc;
}

static int on_hello(struct session *s, const struct perf_msg *m)
{
    s->poll = (m->flags & PERF_FLAG_POLL) != 0;
    int rc = perf_kernel_open(s->poll, &s->kernel);
    if (rc == 0 && (m->flags & PERF_FLAG_RDMA))
        rc = perf_rdma_open((int)m->kind, &s->local, s->poll, &s->rdma);
    if (rc)
        return fail(s, rc, m->kind == RS_RNIC_KIND_VERBS ? "opening the verbs RNIC" : "opening the soft RNIC");
    struct perf_msg reply;
    memset(&reply, 0, sizeof(reply));
    reply.kind = m->kind;
    return perf_reply(s->fd, PERF_MSG_HELLO, &reply);
}

static bool is_rdma(uint64_t group) { return group == PERF_GROUP_UD || group == PERF_GROUP_RC; }

static int on_setup(struct session *s, const struct perf_msg *m)
{
    struct perf_msg reply;
    memset(&reply, 0, sizeof(reply));
    int rc;
    if (m->group >= PERF_GROUP_COUNT)
        rc = -EINVAL;
    else if (is_rdma(m->group))
        rc = s->rdma ? perf_rdma_server_setup(s->rdma, (enum perf_group)m->group, &s->local, m->len, &reply)
                     : -ENODEV;
    else
        rc = perf_kernel_server_setup(s->kernel, (enum perf_group)m->group, &s->local, m->len, &reply);
    if (rc)
        return fail(s, rc, "setting up an endpoint");
    reply.group = m->group;
    return perf_reply(s->fd, PERF_MSG_SETUP, &reply);
}

static int on_peer(struct session *s, const struct perf_msg *m)
{
    int rc;
    if (m->group >= PERF_GROUP_COUNT)
        rc = -EINVAL;
    else if (is_rdma(m->group))
        rc = s->rdma ? perf_rdma_server_peer(s->rdma, (enum perf_group)m->group, &s->peer, m) : -ENODEV;
    else
        rc = perf_kernel_server_peer(s->kernel, (enum perf_group)m->group, m, &s->peer);
    if (rc)
        return fail(s, rc, "connecting to the client");
    return perf_reply(s->fd, PERF_MSG_PEER, NULL);
}

static int on_run(struct session *s, const struct perf_msg *m)
{
    int rc;
    if (is_rdma(m->group))
        rc = s->rdma ? perf_rdma_server_run(s->rdma, s->fd, m) : -ENODEV;
    else
        rc = perf_kernel_server_run(s->kernel, s->fd, m);
    if (rc)
        return fail(s, rc, "run");
    return 0;
}

/* One client, until QUIT (0) or a failure (-errno). */
static int serve(struct session *s)
{
    for (;;) {
        struct perf_msg m;
        int rc = perf_msg_recv(s->fd, &m);
        if (rc)
            return rc == -ECONNRESET ? 0 : rc;      /* a client that just leaves is not an error */
        switch (m.type) {
        case PERF_MSG_HELLO:
            rc = on_hello(s, &m);
            break;
        case PERF_MSG_SETUP:
            rc = on_setup(s, &m);
            break;
        case PERF_MSG_PEER:
            rc = on_peer(s, &m);
            break;
        case PERF_MSG_RUN:
            rc = on_run(s, &m);
            break;
        case PERF_MSG_QUIT:
            return 0;
        default:
            rc = fail(s, -EPROTO, "unexpected control message");
            break;
        }
        if (rc)
            return rc;
    }
}

int perf_server(const struct perf_opts *o, int listen_fd, bool once)
{
    (void)o;
    for (;;) {
        struct session s;
        memset(&s, 0, sizeof(s));
        socklen_t len = sizeof(s.peer);
        s.fd = perf_sys_accept(listen_fd, (struct sockaddr *)&s.peer, &len);
        if (s.fd == -EINTR)
            continue;
        if (s.fd < 0)
            return s.fd;
        len = sizeof(s.local);
        perf_sys_getsockname(s.fd, (struct sockaddr *)&s.local, &len);
        char a[80];
        if (!once)
            perf_log("client %s", perf_addr_str(&s.peer, a, sizeof(a)));
        int rc = serve(&s);
        perf_rdma_close(s.rdma);
        perf_kernel_close(s.kernel);
        perf_sys_close(s.fd);
        if (once)
            return rc;
        if (rc)
            perf_log("client %s: session ended: %s", a, strerror(-rc));
    }
}
