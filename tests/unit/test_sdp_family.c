/*
 * Prefork families (src/sdp_stream/sdp_family.c): the shared table, the redirect in a REJECT's private data, and a
 * family on the soft RNIC with the dispatcher forced on (the logic is the one verbs uses; only the decision to
 * dispatch differs): connections go to the child that waits, never behind an idle one, a client that connects
 * before any child listens is served, and the client never sees the redirect.
 */
#include "test_sdp_util.h"

#include <sys/prctl.h>

#include "common/log.h"
#include "sdp_stream/sdp_int.h"

/* ---- the table ---- */

static void test_table_pick_and_dead_members(void **state)
{
    (void)state;
    struct sockaddr_in sin = sdp_sockaddr(4000);
    struct sockaddr_storage a;
    memset(&a, 0, sizeof(a));
    memcpy(&a, &sin, sizeof(sin));
    int hslot = -1;
    struct sdp_family *f = rs_sdp_family_create(&a, &hslot);
    assert_non_null(f);
    assert_int_equal(hslot, 0);
    /* The holder itself never finds its own family (it listens on the port). */
    assert_null(rs_sdp_family_find(&a));
    assert_int_equal(rs_sdp_family_members(f, false), 0);

    /* A member whose process is gone. */
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t dead = fork();
    assert_true(dead >= 0);
    if (dead == 0) {
        /* The child finds the family through the inherited registry and joins. */
        int ok = rs_sdp_family_find(&a) == f && rs_sdp_family_join(f, 5001) > 0;
        char c = ok ? 'y' : 'n';
        assert_int_equal(write(pipefd[1], &c, 1), 1);
        _exit(0);
    }
    char c = 0;
    assert_true(wait_readable(pipefd[0], WAIT_MS) > 0);
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    close(pipefd[0]);
    close(pipefd[1]);

    /* The dead member's entry waits (its state says WAITING) but is never picked, and is freed. */
    uint16_t port = 0;
    assert_int_equal(rs_sdp_family_pick(f, RS_SDP_PICK_WAITING, now_ms(), &port), -ENOENT);
    assert_int_equal(rs_sdp_family_members(f, false), 0);

    /* A live member (this process stands for it; the join claims by pid) takes the freed entry. */
    int slot = rs_sdp_family_join(f, 5002);
    assert_true(slot > 0);
    assert_int_equal(rs_sdp_family_members(f, false), 1);
    uint64_t t = now_ms();
    assert_int_equal(rs_sdp_family_pick(f, RS_SDP_PICK_WAITING, t, &port), slot);
    assert_int_equal(port, 5002);
    /* Assigned: not waiting any more, and an empty accept does not make it wait again within the grace time. */
    assert_int_equal(rs_sdp_family_state(f, slot), RS_SDP_MEMBER_ASSIGNED);
    assert_int_equal(rs_sdp_family_pick(f, RS_SDP_PICK_WAITING, t, &port), -ENOENT);
    rs_sdp_family_set_state(f, slot, RS_SDP_MEMBER_WAITING, t + 1);
    assert_int_equal(rs_sdp_family_state(f, slot), RS_SDP_MEMBER_ASSIGNED);
    rs_sdp_family_set_state(f, slot, RS_SDP_MEMBER_WAITING, t + RS_SDP_ASSIGN_GRACE_MS + 1);
    assert_int_equal(rs_sdp_family_state(f, slot), RS_SDP_MEMBER_WAITING);
    /* Busy: it gets nothing while a request can wait; round-robin reaches it when the request waited its time. */
    rs_sdp_family_set_state(f, slot, RS_SDP_MEMBER_BUSY, t);
    assert_int_equal(rs_sdp_family_pick(f, RS_SDP_PICK_WAITING, t, &port), -ENOENT);
    assert_int_equal(rs_sdp_family_pick(f, RS_SDP_PICK_ANY, t, &port), slot);
    rs_sdp_family_leave(f, slot, false);
    assert_int_equal(rs_sdp_family_members(f, false), 0);

    rs_sdp_family_leave(f, hslot, true);
    assert_null(rs_sdp_family_find(&a));
}

static void test_redirect_wire(void **state)
{
    (void)state;
    uint8_t buf[148];
    memset(buf, 0, sizeof(buf));
    assert_int_equal(rs_sdp_redirect_encode(40123, buf, 4), 0);
    assert_int_equal(rs_sdp_redirect_encode(40123, buf, sizeof(buf)), RS_SDP_REDIRECT_LEN);
    uint16_t port = 0;
    /* IB CM hands the consumer's reject data over padded to 148 bytes: still understood. */
    assert_int_equal(rs_sdp_redirect_decode(buf, sizeof(buf), &port), 0);
    assert_int_equal(port, 40123);
    assert_int_equal(rs_sdp_redirect_decode(buf, RS_SDP_REDIRECT_LEN - 1, &port), -EINVAL);
    assert_int_equal(rs_sdp_redirect_decode(NULL, 0, &port), -EINVAL);
    buf[4] = RS_SDP_REDIRECT_VERSION + 1;
    assert_int_equal(rs_sdp_redirect_decode(buf, sizeof(buf), &port), -EINVAL);
    buf[4] = RS_SDP_REDIRECT_VERSION;
    buf[0] = 'X';
    assert_int_equal(rs_sdp_redirect_decode(buf, sizeof(buf), &port), -EINVAL);
    assert_int_equal(rs_sdp_redirect_encode(0, buf, sizeof(buf)), RS_SDP_REDIRECT_LEN);
    assert_int_equal(rs_sdp_redirect_decode(buf, sizeof(buf), &port), -EINVAL);
}

/* ---- a family on the RNIC ---- */

struct reply {
    int32_t pid;
    uint16_t local_port;            /* the accepted socket's getsockname */
};

/* A member: listens on the holder's address (it joins the family), accepts `conns` connections, answers each with
 * its pid and local port, and keeps it until its peer closes. */
static void member_main(const struct sockaddr_in *addr, int conns, int ready_fd)
{
    struct rs_sdp_sock *l;
    if (rs_sdp_socket(AF_INET, sdp_kind(), 0, &l) != 0 || rs_sdp_bind(l, (const struct sockaddr *)addr,
                                                                       sizeof(*addr)) != 0 || rs_sdp_listen(l, 16) != 0)
        _exit(2);
    struct sockaddr_in name;
    socklen_t nl = sizeof(name);
    /* The application sees the port it listened on, not the member's own. */
    if (rs_sdp_getsockname(l, (struct sockaddr *)&name, &nl) != 0 || name.sin_port != addr->sin_port)
        _exit(3);
    if (ready_fd >= 0) {
        char c = 'r';
        if (write(ready_fd, &c, 1) != 1)
            _exit(4);
    }
    for (int i = 0; i < conns; i++) {
        struct rs_sdp_sock *a;
        if (rs_sdp_accept(l, 0, &a, NULL, NULL) != 0)
            _exit(5);
        struct reply r = { getpid(), 0 };
        nl = sizeof(name);
        if (rs_sdp_getsockname(a, (struct sockaddr *)&name, &nl) == 0)
            r.local_port = ntohs(name.sin_port);
        if (rs_sdp_send(a, &r, sizeof(r), MSG_NOSIGNAL) != (ssize_t)sizeof(r))
            _exit(6);
        /* Closed by the client first (with hold, the first one is never written to: an idle client). */
        char b;
        while (rs_sdp_recv(a, &b, 1, 0) > 0) {
        }
        rs_sdp_close(a);
    }
    rs_sdp_close(l);
    _exit(0);
}

/* A member shaped like an event loop (Apache's event MPM): it waits for its listener in poll, with POLLIN interest
 * as epoll_wait registers it, and accepts once per readiness, never until EAGAIN. */
static void event_member_main(const struct sockaddr_in *addr, int conns, int ready_fd)
{
    struct rs_sdp_sock *l;
    if (rs_sdp_socket(AF_INET, sdp_kind(), RS_SDP_NONBLOCK, &l) != 0 ||
        rs_sdp_bind(l, (const struct sockaddr *)addr, sizeof(*addr)) != 0 || rs_sdp_listen(l, 16) != 0)
        _exit(2);
    char c = 'r';
    if (write(ready_fd, &c, 1) != 1)
        _exit(4);
    for (int i = 0; i < conns;) {
        rs_sdp_interest(l, POLLIN, 1);
        while (!(rs_sdp_poll(l) & POLLIN))
            wait_readable(rs_sdp_fd(l), 100);
        rs_sdp_interest(l, POLLIN, -1);
        struct rs_sdp_sock *a;
        if (rs_sdp_accept(l, 0, &a, NULL, NULL) != 0)
            continue;
        struct reply r = { getpid(), 0 };
        if (rs_sdp_send(a, &r, sizeof(r), MSG_NOSIGNAL) != (ssize_t)sizeof(r))
            _exit(6);
        char b;
        while (rs_sdp_recv(a, &b, 1, 0) > 0) {
        }
        rs_sdp_close(a);
        i++;
    }
    rs_sdp_close(l);
    _exit(0);
}

static pid_t spawn_member(const struct sockaddr_in *addr, int conns, int ready_fd)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        member_main(addr, conns, ready_fd);
    return pid;
}

static struct rs_sdp_sock *client_to(const struct sockaddr_in *addr, struct reply *r)
{
    struct rs_sdp_sock *c;
    assert_int_equal(rs_sdp_socket(AF_INET, sdp_kind(), 0, &c), 0);
    assert_int_equal(rs_sdp_connect(c, (const struct sockaddr *)addr, sizeof(*addr)), 0);
    struct sockaddr_in peer;
    socklen_t pl = sizeof(peer);
    assert_int_equal(rs_sdp_getpeername(c, (struct sockaddr *)&peer, &pl), 0);
    /* The redirect is invisible: the peer is the address the application named. */
    assert_int_equal(peer.sin_port, addr->sin_port);
    struct timeval tv = { 10, 0 };
    assert_int_equal(rs_sdp_setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    recv_all(c, r, sizeof(*r));
    return c;
}

static struct rs_sdp_sock *dispatcher(struct sockaddr_in *addr)
{
    struct rs_sdp_sock *l = sdp_listener(addr);
    assert_false(rs_sdp_dispatching(l));
    /* On the soft RNIC the listener parks instead, unless forced. */
    if (sdp_kind() == RS_RNIC_KIND_SOFT)
        assert_int_equal(rs_sdp_dispatch_enable(l, false), -EOPNOTSUPP);
    assert_int_equal(rs_sdp_dispatch_enable(l, true), 0);
    assert_true(rs_sdp_dispatching(l));
    return l;
}

/* Until n members wait in accept (under load a fixed sleep is not enough). */
static void wait_members_waiting(struct rs_sdp_sock *l, int n)
{
    uint64_t t0 = now_ms();
    while (rs_sdp_family_members(l->fam, true) < n) {
        assert_true(now_ms() - t0 < 10000);
        usleep(5000);
    }
}

static void wait_ready(int fd, int n)
{
    for (int i = 0; i < n; i++) {
        char c;
        assert_true(wait_readable(fd, WAIT_MS) > 0);
        assert_int_equal(read(fd, &c, 1), 1);
    }
}

static void reap(pid_t pid)
{
    int st = -1;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Two members; a client that connects and never writes holds one of them; the next client is served by the other
 * at once (the head-of-line case of the prefork server on verbs). */
static void test_idle_connection_does_not_block_the_next(void **state)
{
    (void)state;
    struct sockaddr_in addr;
    struct rs_sdp_sock *l = dispatcher(&addr);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t a = spawn_member(&addr, 1, pipefd[1]);
    pid_t b = spawn_member(&addr, 1, pipefd[1]);
    wait_ready(pipefd[0], 2);
    wait_members_waiting(l, 2);
    struct reply r1, r2;
    struct rs_sdp_sock *idle = client_to(&addr, &r1);
    assert_true(r1.pid == a || r1.pid == b);
    assert_int_equal(r1.local_port, ntohs(addr.sin_port));
    uint64_t t0 = now_ms();
    struct rs_sdp_sock *next = client_to(&addr, &r2);
    uint64_t took = now_ms() - t0;
    assert_true(r2.pid == a || r2.pid == b);
    assert_int_not_equal(r2.pid, r1.pid);
    /* Redirected to a waiting member, not held for SDP_DISPATCH_HOLD_MS. */
    assert_true(took < SDP_DISPATCH_HOLD_MS);
    rs_sdp_close(next);
    rs_sdp_close(idle);
    reap(a);
    reap(b);
    /* The holder itself never accepted one. */
    struct rs_sdp_sock *none;
    assert_int_equal(rs_sdp_set_nonblock(l, true), 0);
    assert_int_equal(rs_sdp_accept(l, 0, &none, NULL, NULL), -EAGAIN);
    close(pipefd[0]);
    close(pipefd[1]);
    rs_sdp_close(l);
}

/* A member that waits in poll/epoll rather than in accept counts as waiting: each connection goes to it at once
 * (before, it counted as busy after its first accept and every later connection waited SDP_DISPATCH_HOLD_MS:
 * Apache's event MPM over verbs ran out of time so). */
static void test_event_loop_member_served_at_once(void **state)
{
    (void)state;
    struct sockaddr_in addr;
    struct rs_sdp_sock *l = dispatcher(&addr);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t m = fork();
    assert_true(m >= 0);
    if (m == 0)
        event_member_main(&addr, 4, pipefd[1]);
    wait_ready(pipefd[0], 1);
    wait_members_waiting(l, 1);
    for (int i = 0; i < 4; i++) {
        struct reply r;
        uint64_t t0 = now_ms();
        struct rs_sdp_sock *c = client_to(&addr, &r);
        uint64_t took = now_ms() - t0;
        assert_int_equal(r.pid, m);
        if (took >= SDP_DISPATCH_HOLD_MS)
            fail_msg("connection %d waited %llu ms for a member that polls its listener", i,
                     (unsigned long long)took);
        rs_sdp_close(c);
    }
    reap(m);
    close(pipefd[0]);
    close(pipefd[1]);
    rs_sdp_close(l);
}

/* A client that connects right after the fork, before any member listens: held by the dispatcher, then served by
 * the member that comes (not refused, not accepted by the parent that never accepts). */
static void test_connect_before_any_member_listens(void **state)
{
    (void)state;
    struct sockaddr_in addr;
    struct rs_sdp_sock *l = dispatcher(&addr);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        usleep(300 * 1000);     /* the child starts late */
        member_main(&addr, 1, -1);
    }
    struct reply r;
    struct rs_sdp_sock *c = client_to(&addr, &r);
    assert_int_equal(r.pid, pid);
    rs_sdp_close(c);
    reap(pid);
    close(pipefd[0]);
    close(pipefd[1]);
    rs_sdp_close(l);
}

static void *accept_thread(void *arg)
{
    struct rs_sdp_sock *l = arg;
    struct rs_sdp_sock *a = NULL;
    if (rs_sdp_accept(l, 0, &a, NULL, NULL) != 0)
        return NULL;
    struct reply r = { getpid(), 0 };
    rs_sdp_send(a, &r, sizeof(r), MSG_NOSIGNAL);
    return a;
}

/* The dispatcher's own application waits in accept: it takes the connection itself, even with a member waiting
 * (a forking server whose parent accepts). */
static void test_holder_that_waits_accepts_itself(void **state)
{
    (void)state;
    struct sockaddr_in addr;
    struct rs_sdp_sock *l = dispatcher(&addr);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t m = spawn_member(&addr, 1, pipefd[1]);
    wait_ready(pipefd[0], 1);
    wait_members_waiting(l, 1);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, accept_thread, l), 0);
    uint64_t t0 = now_ms();
    while (rs_sdp_family_state(l->fam, l->fam_slot) != RS_SDP_MEMBER_WAITING) {     /* the thread waits in accept */
        assert_true(now_ms() - t0 < 10000);
        usleep(5000);
    }
    struct reply r;
    struct rs_sdp_sock *c = client_to(&addr, &r);
    assert_int_equal(r.pid, getpid());
    void *a = NULL;
    pthread_join(th, &a);
    assert_non_null(a);
    rs_sdp_close(a);
    rs_sdp_close(c);
    /* The member still serves the next one, which the parent no longer waits for. */
    c = client_to(&addr, &r);
    assert_int_equal(r.pid, m);
    rs_sdp_close(c);
    reap(m);
    close(pipefd[0]);
    close(pipefd[1]);
    rs_sdp_close(l);
}

/* A member that dies without closing its listener leaves its entry behind: the dispatcher must not send
 * connections there. */
static void test_dead_member_swallows_nothing(void **state)
{
    (void)state;
    struct sockaddr_in addr;
    struct rs_sdp_sock *l = dispatcher(&addr);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t dead = spawn_member(&addr, 1, pipefd[1]);
    wait_ready(pipefd[0], 1);
    wait_members_waiting(l, 1);
    kill(dead, SIGKILL);
    waitpid(dead, NULL, 0);
    assert_int_equal(rs_sdp_family_members(l->fam, false), 0);     /* its entry no longer counts */
    pid_t m = spawn_member(&addr, 1, pipefd[1]);
    wait_ready(pipefd[0], 1);
    wait_members_waiting(l, 1);
    struct reply r;
    struct rs_sdp_sock *c = client_to(&addr, &r);
    assert_int_equal(r.pid, m);
    rs_sdp_close(c);
    reap(m);
    close(pipefd[0]);
    close(pipefd[1]);
    rs_sdp_close(l);
}

/* The holder exits while a member lives (a daemon that forked after listen): the member takes the port over. */
static void test_member_takes_over_when_holder_exits(void **state)
{
    (void)state;
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);     /* the orphaned member is ours to reap */
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t h = fork();
    assert_true(h >= 0);
    if (h == 0) {
        struct sockaddr_in a;
        struct rs_sdp_sock *l = sdp_listener(&a);
        if (rs_sdp_dispatch_enable(l, true) != 0)
            _exit(2);
        if (write(pipefd[1], &a, sizeof(a)) != (ssize_t)sizeof(a))
            _exit(3);
        spawn_member(&a, 1, pipefd[1]);
        for (int i = 0; i < 2000 && rs_sdp_family_members(l->fam, false) < 1; i++)
            usleep(5000);       /* the member joins */
        _exit(0);               /* without closing anything */
    }
    struct sockaddr_in addr;
    assert_true(wait_readable(pipefd[0], WAIT_MS) > 0);
    assert_int_equal(read(pipefd[0], &addr, sizeof(addr)), (ssize_t)sizeof(addr));
    wait_ready(pipefd[0], 1);
    reap(h);
    uint64_t t0 = now_ms();
    struct rs_sdp_sock *c = NULL;
    for (;;) {
        assert_int_equal(rs_sdp_socket(AF_INET, sdp_kind(), 0, &c), 0);
        int r = rs_sdp_connect(c, (const struct sockaddr *)&addr, sizeof(addr));
        if (r == 0)
            break;
        rs_sdp_close(c);
        assert_true(now_ms() - t0 < 10 * SDP_FAMILY_CHECK_MS);
        usleep(100 * 1000);
    }
    struct reply r;
    struct timeval tv = { 10, 0 };
    assert_int_equal(rs_sdp_setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    recv_all(c, &r, sizeof(r));
    assert_int_not_equal(r.pid, h);
    assert_int_not_equal(r.pid, getpid());
    assert_int_equal(r.local_port, ntohs(addr.sin_port));
    rs_sdp_close(c);
    reap(r.pid);
    close(pipefd[0]);
    close(pipefd[1]);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    (void)rs_log_configure_from_env();     /* RDMASOCK_LOG=debug shows the redirects */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_pick_and_dead_members),
        cmocka_unit_test(test_redirect_wire),
        cmocka_unit_test(test_idle_connection_does_not_block_the_next),
        cmocka_unit_test(test_event_loop_member_served_at_once),
        cmocka_unit_test(test_connect_before_any_member_listens),
        cmocka_unit_test(test_holder_that_waits_accepts_itself),
        cmocka_unit_test(test_dead_member_swallows_nothing),
        cmocka_unit_test(test_member_takes_over_when_holder_exits),
    };
    return cmocka_run_group_tests_name("sdp_family", tests, NULL, NULL);
}
