/* Statistics area: creation, counters, cross-process reading, seqlock,
 * stale detection, fork behaviour and the private fallback. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/stats.h"

static void shm_path_for(pid_t pid, char *out, size_t len)
{
    snprintf(out, len, "/dev/shm/rdmasock.%u.%d", (unsigned)geteuid(), (int)pid);
}

static bool shm_exists(pid_t pid)
{
    char path[96];
    struct stat st;
    shm_path_for(pid, path, sizeof(path));
    return stat(path, &st) == 0;
}

static int wait_child(pid_t child)
{
    int status;
    if (waitpid(child, &status, 0) != child)
        return -1;
    if (!WIFEXITED(status))
        return 1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return WEXITSTATUS(status);
}

/* For children that end with _exit (skipping the unlink at exit): remove
 * the area the fork handler gave them so the tests leave nothing behind. */
static int wait_child_and_clean(pid_t child)
{
    int rc = wait_child(child);
    char name[64];
    snprintf(name, sizeof(name), "/rdmasock.%u.%d", (unsigned)geteuid(), (int)child);
    shm_unlink(name);
    return rc;
}

static int setup(void **state)
{
    (void)state;
    return rs_stats_init("test_stats") == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    rs_stats_close();
    return shm_exists(getpid()) ? -1 : 0;
}

static void test_area_created(void **state)
{
    (void)state;
    assert_true(rs_stats_is_shared());
    char expected_name[64];
    snprintf(expected_name, sizeof(expected_name), "/rdmasock.%u.%d", (unsigned)geteuid(),
             (int)getpid());
    assert_string_equal(rs_stats_shm_name(), expected_name);

    char path[96];
    shm_path_for(getpid(), path, sizeof(path));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    assert_int_equal((size_t)st.st_size, sizeof(struct rs_stats_area));

    const struct rs_stats_area *area = rs_stats_get();
    assert_memory_equal(area->header.magic, "RDMASOCK", 8);
    assert_int_equal(area->header.layout_version, RS_STATS_LAYOUT_VERSION);
    assert_int_equal(area->header.total_size, sizeof(struct rs_stats_area));
    assert_int_equal(area->header.pid, getpid());
    assert_int_equal(area->header.uid, geteuid());
    assert_string_equal(area->header.program, "test_stats");
    uint64_t ticks = rs_stats_proc_start_ticks(getpid());
    assert_true(ticks > 0);
    assert_int_equal(area->header.proc_start_ticks, ticks);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    /* The process started before the area was created, both in the past
     * few minutes (allowing one clock tick of rounding). */
    assert_true(area->header.start_time_ns <= area->header.created_time_ns + 20000000u);
    assert_true(area->header.created_time_ns <= now_ns);
    assert_true(now_ns - area->header.start_time_ns < 600ull * 1000000000u);
    /* Calling init again keeps the same area. */
    assert_int_equal(rs_stats_init("renamed"), 0);
    assert_ptr_equal(rs_stats_get(), area);
    assert_string_equal(area->header.program, "renamed");
    rs_stats_set_program("test_stats");
}

/* ---- counters and slots from two threads ---- */

enum { THREAD_ROUNDS = 200000 };
static int shared_slot = -1;

static void *counter_thread(void *arg)
{
    int own_slot = *(int *)arg;
    for (int i = 0; i < THREAD_ROUNDS; i++) {
        RS_STATS_ADD(sockets_seen[RS_STATS_PROTO_TCP], 1);
        RS_STATS_ADD(rdma_bytes_tx[RS_STATS_PROTO_UDP], 3);
        rs_stats_slot_add_io(shared_slot, 2, 1, 1, 0);
        rs_stats_slot_add_io(own_slot, 5, 0, 0, 1);
    }
    return NULL;
}

static void test_updates_from_two_threads(void **state)
{
    (void)state;
    struct rs_stats_area *area = rs_stats_get();
    uint64_t seen_before = rs_stats_counter_read(&area->counters.sockets_seen[RS_STATS_PROTO_TCP]);
    uint64_t bytes_before = rs_stats_counter_read(&area->counters.rdma_bytes_tx[RS_STATS_PROTO_UDP]);
    uint64_t dropped_before = rs_stats_counter_read(&area->counters.slot_updates_dropped);

    shared_slot = rs_stats_slot_acquire(100, RS_STATS_PROTO_TCP);
    int own[2] = { rs_stats_slot_acquire(101, RS_STATS_PROTO_TCP),
                   rs_stats_slot_acquire(102, RS_STATS_PROTO_UDP) };
    assert_int_equal(shared_slot, 100);
    assert_int_equal(own[0], 101);
    assert_int_equal(own[1], 102);

    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, counter_thread, &own[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);

    assert_int_equal(rs_stats_counter_read(&area->counters.sockets_seen[RS_STATS_PROTO_TCP]) -
                     seen_before, 2 * THREAD_ROUNDS);
    assert_int_equal(rs_stats_counter_read(&area->counters.rdma_bytes_tx[RS_STATS_PROTO_UDP]) -
                     bytes_before, 3 * 2 * THREAD_ROUNDS);

    /* A contended slot write may be dropped (and counted), never lost
     * silently or half-applied. */
    uint64_t dropped = rs_stats_counter_read(&area->counters.slot_updates_dropped) - dropped_before;
    struct rs_stats_socket s;
    assert_int_equal(rs_stats_snapshot_slot(area, (unsigned)shared_slot, &s), 1);
    uint64_t applied = s.msgs_tx;
    assert_int_equal(s.bytes_tx, 2 * applied);
    assert_int_equal(s.bytes_rx, applied);
    uint64_t own_applied = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rs_stats_snapshot_slot(area, (unsigned)own[i], &s), 1);
        assert_int_equal(s.bytes_tx, 5 * s.msgs_rx);
        assert_int_equal(s.fd, 101 + i);
        own_applied += s.msgs_rx;
    }
    assert_int_equal(applied + own_applied + dropped, 4 * THREAD_ROUNDS);
    assert_true(dropped < THREAD_ROUNDS / 100);

    rs_stats_slot_release(shared_slot);
    rs_stats_slot_release(own[0]);
    rs_stats_slot_release(own[1]);
    assert_int_equal(rs_stats_snapshot_slot(area, (unsigned)shared_slot, &s), 0);
}

/* ---- reading from another process ---- */

static void fill_v4(struct sockaddr_in *sa, const char *ip, unsigned port)
{
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &sa->sin_addr);
}

static void fill_v6(struct sockaddr_in6 *sa, const char *ip, unsigned port)
{
    memset(sa, 0, sizeof(*sa));
    sa->sin6_family = AF_INET6;
    sa->sin6_port = htons((uint16_t)port);
    inet_pton(AF_INET6, ip, &sa->sin6_addr);
}

/* What the forked reader expects to find. */
static int expect_slots[2];
static struct rs_stats_counters expect_counters;

/* Returns 0 when the parent's area reads back as expected, else the number
 * of the first failed check. */
static int verify_parent_area(void)
{
    struct rs_stats_map map;
    if (rs_stats_open_pid(getppid(), &map) != 0)
        return 1;
    const struct rs_stats_area *area = map.area;
    struct rs_stats_header h;
    if (rs_stats_snapshot_header(area, &h) != 0)
        return 2;
    if (h.pid != getppid() || strcmp(h.program, "test_stats") != 0)
        return 3;
    if (strcmp(h.transport, "soft") != 0 || h.config_status != RS_STATS_CONFIG_ERROR ||
        strcmp(h.config_path, "/etc/rdmasock.conf") != 0 ||
        strcmp(h.config_error, "line 3: unknown key \"foo\"") != 0)
        return 4;
    if (memcmp(&area->counters, &expect_counters, sizeof(expect_counters)) != 0)
        return 5;

    struct rs_stats_socket s;
    if (rs_stats_snapshot_slot(area, (unsigned)expect_slots[0], &s) != 1)
        return 6;
    struct sockaddr_in6 local;
    fill_v6(&local, "::ffff:10.0.0.1", 5000);
    if (s.fd != 7 || s.proto != RS_STATS_PROTO_TCP || s.role != RS_STATS_ROLE_CLIENT ||
        s.state != RS_STATS_STATE_CONNECTED || s.path != RS_STATS_PATH_RDMA ||
        s.reason != RS_REASON_RULE_RDMA || s.qos_class != 2 || s.bytes_tx != 1000 ||
        s.bytes_rx != 2000 || s.msgs_tx != 3 || s.msgs_rx != 4 ||
        memcmp(&s.local, &local, sizeof(local)) != 0)
        return 7;
    if (rs_stats_snapshot_slot(area, (unsigned)expect_slots[1], &s) != 1)
        return 8;
    struct sockaddr_in6 peer;
    fill_v6(&peer, "fe80::1", 443);
    if (s.fd != 9 || s.proto != RS_STATS_PROTO_UDP || s.path != RS_STATS_PATH_FALLBACK ||
        s.reason != RS_REASON_PEER_REJECTED || memcmp(&s.peer, &peer, sizeof(peer)) != 0 ||
        s.local.sin6_family != 0)
        return 9;
    unsigned in_use = 0;
    for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++)
        in_use += rs_stats_snapshot_slot(area, i, &s) == 1;
    if (in_use != 2)
        return 10;

    char *text = NULL;
    size_t text_len = 0;
    FILE *out = open_memstream(&text, &text_len);
    rs_stats_print(out, &map);
    fclose(out);
    if (strstr(text, "program test_stats") == NULL ||
        strstr(text, "10.0.0.1:5000") == NULL || strstr(text, "[fe80::1]:443") == NULL ||
        strstr(text, "PEER_REJECTED") == NULL || strstr(text, "line 3: unknown key") == NULL)
        return 11;
    free(text);

    out = open_memstream(&text, &text_len);
    rs_stats_print_json(out, &map);
    fclose(out);
    if (strstr(text, "\"program\":\"test_stats\"") == NULL ||
        strstr(text, "\"error\":\"line 3: unknown key \\\"foo\\\"\"") == NULL ||
        strstr(text, "\"reason\":\"RULE_RDMA\"") == NULL ||
        strstr(text, "\"fallbacks\":{\"PEER_REJECTED\":1}") == NULL ||
        strstr(text, "\"sockets_seen\":{\"tcp\":") == NULL ||
        strstr(text, "\"local\":\"10.0.0.1:5000\"") == NULL || text[text_len - 1] != '\n')
        return 12;
    free(text);
    rs_stats_unmap(&map);
    return 0;
}

static void test_forked_reader_sees_parent(void **state)
{
    (void)state;
    rs_stats_set_transport("soft");
    rs_stats_set_config("/etc/rdmasock.conf", RS_STATS_CONFIG_ERROR, "line 3: unknown key \"foo\"");
    RS_STATS_ADD(sockets_rdma[RS_STATS_PROTO_TCP], 1);
    RS_STATS_ADD(fallbacks[RS_REASON_PEER_REJECTED], 1);
    RS_STATS_ADD(decisions[RS_REASON_RULE_RDMA], 1);
    RS_STATS_ADD(rdma_msgs_rx[RS_STATS_PROTO_TCP], 12);
    RS_STATS_ADD(errors, 1);

    int a = rs_stats_slot_acquire(7, RS_STATS_PROTO_TCP);
    int b = rs_stats_slot_acquire(9, RS_STATS_PROTO_UDP);
    assert_true(a >= 0 && b >= 0);
    struct sockaddr_in local4;
    fill_v4(&local4, "10.0.0.1", 5000);
    struct sockaddr_in6 peer6;
    fill_v6(&peer6, "fe80::1", 443);
    rs_stats_slot_set_role(a, RS_STATS_ROLE_CLIENT);
    rs_stats_slot_set_state(a, RS_STATS_STATE_CONNECTED);
    rs_stats_slot_set_path(a, RS_STATS_PATH_RDMA, RS_REASON_RULE_RDMA);
    rs_stats_slot_set_qos(a, 2);
    rs_stats_slot_set_addresses(a, (struct sockaddr *)&local4, sizeof(local4), NULL, 0);
    rs_stats_slot_add_io(a, 1000, 2000, 3, 4);
    rs_stats_slot_set_path(b, RS_STATS_PATH_FALLBACK, RS_REASON_PEER_REJECTED);
    rs_stats_slot_set_addresses(b, NULL, 0, (struct sockaddr *)&peer6, sizeof(peer6));

    expect_slots[0] = a;
    expect_slots[1] = b;
    memcpy(&expect_counters, &rs_stats_get()->counters, sizeof(expect_counters));

    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(verify_parent_area());
    assert_int_equal(wait_child_and_clean(child), 0);

    /* The same reader API works on our own area. */
    struct rs_stats_map map;
    assert_int_equal(rs_stats_open_pid(getpid(), &map), 0);
    struct rs_stats_socket s;
    assert_int_equal(rs_stats_snapshot_slot(map.area, (unsigned)a, &s), 1);
    assert_int_equal(s.bytes_rx, 2000);
    rs_stats_unmap(&map);
    assert_null(map.area);

    rs_stats_slot_release(a);
    rs_stats_slot_release(b);
}

/* ---- seqlock under a hammering writer ---- */

struct hammer_arg {
    uint64_t value;
};

/* Writes many fields that are only consistent as a group. */
static void write_hammer(struct rs_stats_socket *s, void *arg)
{
    uint64_t v = ((struct hammer_arg *)arg)->value;
    s->bytes_rx = v;
    s->peer.sin6_port = (uint16_t)v;
    memset(&s->local.sin6_addr, (int)(v & 0xff), sizeof(s->local.sin6_addr));
    s->msgs_tx = v ^ 0x5555555555555555ull;
    s->qos_class = (uint16_t)(v * 3);
    s->msgs_rx = v + 7;
    s->bytes_tx = v * 2;
}

static void write_done(struct rs_stats_socket *s, void *arg)
{
    (void)arg;
    s->state = RS_STATS_STATE_CLOSED;
}

static bool hammer_consistent(const struct rs_stats_socket *s)
{
    uint64_t v = s->bytes_rx;
    uint8_t expected_addr[16];
    memset(expected_addr, (int)(v & 0xff), sizeof(expected_addr));
    return s->bytes_tx == v * 2 && s->msgs_rx == v + 7 &&
           s->msgs_tx == (v ^ 0x5555555555555555ull) && s->peer.sin6_port == (uint16_t)v &&
           s->qos_class == (uint16_t)(v * 3) &&
           memcmp(&s->local.sin6_addr, expected_addr, sizeof(expected_addr)) == 0;
}

enum { SEQLOCK_WANTED_CHANGES = 2000 };

/*
 * Reader process: 0 = every snapshot consistent and the values moved;
 * 1 = torn snapshot; 3 = setup failed. It reports on progress_fd once it
 * has watched SEQLOCK_WANTED_CHANGES different values go by, so the writer
 * keeps going however the scheduler interleaves the two processes.
 */
static int seqlock_reader(pid_t writer, unsigned slot, int progress_fd)
{
    struct rs_stats_map map;
    if (rs_stats_open_pid(writer, &map) != 0)
        return 3;
    if (write(progress_fd, "r", 1) != 1)
        return 3;
    uint64_t snapshots = 0, changes = 0, last = UINT64_MAX;
    struct rs_stats_socket s;
    for (;;) {
        if (rs_stats_snapshot_slot(map.area, slot, &s) != 1)
            continue;
        snapshots++;
        if (!hammer_consistent(&s)) {
            fprintf(stderr, "torn snapshot: bytes_rx %" PRIu64 " bytes_tx %" PRIu64
                    " msgs_rx %" PRIu64 "\n", s.bytes_rx, s.bytes_tx, s.msgs_rx);
            return 1;
        }
        if (s.bytes_rx != last) {
            changes++;
            if (changes == SEQLOCK_WANTED_CHANGES && write(progress_fd, "d", 1) != 1)
                return 3;
        }
        last = s.bytes_rx;
        if (s.state == RS_STATS_STATE_CLOSED)
            break;
    }
    fprintf(stderr, "# seqlock reader: %" PRIu64 " snapshots, %" PRIu64 " distinct values\n",
            snapshots, changes);
    return 0;
}

static long elapsed_ms(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) * 1000L + (now.tv_nsec - start->tv_nsec) / 1000000L;
}

static void test_seqlock_reader_never_sees_torn_slot(void **state)
{
    (void)state;
    int slot = rs_stats_slot_acquire(500, RS_STATS_PROTO_TCP);
    assert_true(slot >= 0);
    struct hammer_arg arg = { 0 };
    assert_int_equal(rs_stats_slot_update(slot, write_hammer, &arg), 0);

    int progress[2];
    assert_int_equal(pipe(progress), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(progress[0]);
        _exit(seqlock_reader(getppid(), (unsigned)slot, progress[1]));
    }
    close(progress[1]);
    char byte;
    assert_int_equal(read(progress[0], &byte, 1), 1);
    assert_int_equal(byte, 'r');
    fcntl(progress[0], F_SETFL, O_NONBLOCK);

    /* Write for at least 1.5 s and until the reader has seen enough
     * distinct values (bounded at 30 s). */
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uint64_t writes = 0;
    bool reader_satisfied = false;
    long ms;
    do {
        for (int i = 0; i < 1000; i++) {
            arg.value++;
            writes += rs_stats_slot_update(slot, write_hammer, &arg) == 0;
        }
        if (!reader_satisfied && read(progress[0], &byte, 1) == 1)
            reader_satisfied = byte == 'd';
        ms = elapsed_ms(&start);
    } while ((ms < 1500 || !reader_satisfied) && ms < 30000);
    assert_int_equal(rs_stats_slot_update(slot, write_done, NULL), 0);
    close(progress[0]);
    int reader_status = wait_child_and_clean(child);
    rs_stats_slot_release(slot);
    assert_int_equal(reader_status, 0);
    assert_true(reader_satisfied);
    /* The reader never blocks the writer: every write went through. */
    assert_int_equal(writes, arg.value);
}

/* ---- stale detection ---- */

struct list_result {
    pid_t wanted;
    bool found;
    struct rs_stats_entry entry;
    bool saw_self_live;
};

static int collect_entry(const struct rs_stats_entry *entry, void *arg)
{
    struct list_result *result = arg;
    if (entry->pid == result->wanted) {
        result->found = true;
        result->entry = *entry;
    }
    if (entry->pid == getpid() && entry->liveness == RS_STATS_LIVE)
        result->saw_self_live = true;
    return 0;
}

static struct list_result list_for(pid_t pid, unsigned flags)
{
    struct list_result result = { .wanted = pid };
    assert_true(rs_stats_list(flags, collect_entry, &result) >= 1);
    return result;
}

static void test_stale_dead_process(void **state)
{
    (void)state;
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* The child has its own area now; _exit skips the atexit cleanup,
         * as a crash would. */
        _exit(rs_stats_is_shared() ? 0 : 1);
    }
    assert_int_equal(wait_child(child), 0);
    assert_true(shm_exists(child));

    struct list_result result = list_for(child, 0);
    assert_true(result.found);
    assert_true(result.saw_self_live);
    assert_int_equal(result.entry.liveness, RS_STATS_STALE_DEAD);
    assert_false(result.entry.removed);
    assert_true(shm_exists(child));

    struct rs_stats_map map;
    assert_int_equal(rs_stats_open_pid(child, &map), 0); /* still readable */
    assert_int_equal(map.area->header.pid, child);
    rs_stats_unmap(&map);

    result = list_for(child, RS_STATS_LIST_REMOVE_STALE);
    assert_true(result.found);
    assert_true(result.entry.removed);
    assert_false(shm_exists(child));
    /* Live areas are never removed. */
    assert_true(shm_exists(getpid()));
    assert_true(result.saw_self_live);
}

static void test_stale_reused_pid(void **state)
{
    (void)state;
    int hold[2], ready[2];
    assert_int_equal(pipe(hold), 0);
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(hold[1]);
        close(ready[0]);
        char byte = 'r';
        if (write(ready[1], &byte, 1) != 1)
            _exit(1);
        ssize_t got = read(hold[0], &byte, 1); /* until the parent closes */
        (void)got;
        _exit(0);
    }
    close(hold[0]);
    close(ready[1]);
    char byte;
    /* Once the child runs, its fork handler has created its area. */
    assert_int_equal(read(ready[0], &byte, 1), 1);
    close(ready[0]);
    assert_true(shm_exists(child));
    assert_int_equal(list_for(child, 0).entry.liveness, RS_STATS_LIVE);

    /* Pretend the area was left by an earlier process with this pid. */
    char name[64];
    snprintf(name, sizeof(name), "/rdmasock.%u.%d", (unsigned)geteuid(), (int)child);
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    struct rs_stats_area *area = mmap(NULL, sizeof(*area), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(area != MAP_FAILED);
    area->header.proc_start_ticks += 12345;
    struct list_result result = list_for(child, 0);
    assert_int_equal(result.entry.liveness, RS_STATS_STALE_REUSED);
    assert_false(result.entry.removed);
    assert_int_equal(rs_stats_check_pid(child, area->header.proc_start_ticks), RS_STATS_STALE_REUSED);
    assert_int_equal(rs_stats_check_pid(child, area->header.proc_start_ticks - 12345), RS_STATS_LIVE);

    /* A live pid whose object has no magic yet is being initialised. */
    area->header.proc_start_ticks -= 12345;
    memset(area->header.magic, 0, sizeof(area->header.magic));
    result = list_for(child, RS_STATS_LIST_REMOVE_STALE);
    assert_int_equal(result.entry.liveness, RS_STATS_INITIALIZING);
    assert_false(result.entry.removed);
    struct rs_stats_map map;
    assert_int_equal(rs_stats_open_pid(child, &map), -EAGAIN);
    munmap(area, sizeof(*area));

    /* A truncated object of a live pid: also not complete yet. */
    assert_int_equal(ftruncate(fd, 0), 0);
    close(fd);
    assert_int_equal(list_for(child, 0).entry.liveness, RS_STATS_INITIALIZING);

    close(hold[1]);
    assert_int_equal(wait_child(child), 0);
    result = list_for(child, RS_STATS_LIST_REMOVE_STALE);
    assert_int_equal(result.entry.liveness, RS_STATS_STALE_DEAD);
    assert_true(result.entry.removed);
    assert_false(shm_exists(child));
}

static void test_open_errors(void **state)
{
    (void)state;
    struct rs_stats_map map;
    assert_int_equal(rs_stats_open_pid(2147483000, &map), -ENOENT);
    assert_int_equal(rs_stats_open_name("not-ours.1.2", &map), -EINVAL);
    assert_int_equal(rs_stats_open_name("rdmasock.1.x", &map), -EINVAL);

    /* A same-named object with another layout version is refused. */
    pid_t fake_pid = 2147483001;
    char name[64];
    snprintf(name, sizeof(name), "/rdmasock.%u.%d", (unsigned)geteuid(), (int)fake_pid);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, sizeof(struct rs_stats_area)), 0);
    struct rs_stats_header h = { .layout_version = 99, .pid = fake_pid };
    memcpy(h.magic, RS_STATS_MAGIC, RS_STATS_MAGIC_LEN);
    assert_int_equal(pwrite(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(rs_stats_open_pid(fake_pid, &map), -EPROTO);
    /* Too small to hold the layout: refused before mapping. */
    assert_int_equal(ftruncate(fd, 100), 0);
    assert_int_equal(rs_stats_open_pid(fake_pid, &map), -EPROTO);
    close(fd);
    /* Such a leftover of a pid that cannot exist is stale. */
    struct list_result result = list_for(fake_pid, RS_STATS_LIST_REMOVE_STALE);
    assert_true(result.found);
    assert_int_equal(result.entry.liveness, RS_STATS_STALE_DEAD);
    assert_true(result.entry.removed);
    assert_false(shm_exists(fake_pid));
}

/* ---- fork ---- */

static int check_child_area(const struct rs_stats_area *parent_area, int inherited_slot)
{
    struct rs_stats_area *mine = rs_stats_get();
    if (mine->header.pid != getpid())
        return 1;
    if (!rs_stats_is_shared() || !shm_exists(getpid()))
        return 2;
    char expected[64];
    snprintf(expected, sizeof(expected), "/rdmasock.%u.%d", (unsigned)geteuid(), (int)getpid());
    if (strcmp(rs_stats_shm_name(), expected) != 0)
        return 3;
    if (strcmp(mine->header.program, "test_stats") != 0 || strcmp(mine->header.transport, "soft") != 0)
        return 4;
    if (mine->counters.errors != 0 || mine->counters.sockets_seen[RS_STATS_PROTO_TCP] != 0)
        return 5;
    struct rs_stats_socket s;
    if (rs_stats_snapshot_slot(mine, (unsigned)inherited_slot, &s) != 1 || s.fd != 42 ||
        s.bytes_tx != 77 || s.seq != 0)
        return 6;
    /* The child's writes go to its own area only. */
    RS_STATS_ADD(errors, 5);
    rs_stats_slot_add_io(inherited_slot, 1, 0, 0, 0);
    if (mine->counters.errors != 5)
        return 7;
    (void)parent_area;
    return 0;
}

static void test_fork_child_gets_own_area(void **state)
{
    (void)state;
    struct rs_stats_area *area = rs_stats_get();
    int slot = rs_stats_slot_acquire(42, RS_STATS_PROTO_TCP);
    assert_true(slot >= 0);
    rs_stats_slot_add_io(slot, 77, 0, 0, 0);
    uint64_t errors_before = rs_stats_counter_read(&area->counters.errors);
    assert_true(errors_before > 0);

    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        exit(check_child_area(area, slot)); /* exit(): runs the unlink-at-exit */
    assert_int_equal(wait_child(child), 0);

    /* Parent unaffected; child's object removed at its exit. */
    assert_ptr_equal(rs_stats_get(), area);
    assert_int_equal(area->header.pid, getpid());
    assert_int_equal(rs_stats_counter_read(&area->counters.errors), errors_before);
    struct rs_stats_socket s;
    assert_int_equal(rs_stats_snapshot_slot(area, (unsigned)slot, &s), 1);
    assert_int_equal(s.bytes_tx, 77);
    assert_false(shm_exists(child));
    assert_true(shm_exists(getpid()));
    rs_stats_slot_release(slot);
}

static int check_private_fallback(int inherited_slot, rlim_t restore)
{
    struct rlimit limit;
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = restore;
    setrlimit(RLIMIT_NOFILE, &limit);

    struct rs_stats_area *mine = rs_stats_get();
    if (rs_stats_is_shared() || rs_stats_shm_name()[0] != '\0')
        return 1;
    if (shm_exists(getpid()))
        return 2;
    if (mine->header.pid != getpid() || memcmp(mine->header.magic, RS_STATS_MAGIC, 8) != 0)
        return 3;
    struct rs_stats_socket s;
    if (rs_stats_snapshot_slot(mine, (unsigned)inherited_slot, &s) != 1 || s.fd != 43)
        return 4;
    RS_STATS_ADD(sockets_seen[RS_STATS_PROTO_UDP], 3);
    rs_stats_slot_add_io(inherited_slot, 10, 20, 1, 2);
    if (mine->counters.sockets_seen[RS_STATS_PROTO_UDP] != 3)
        return 5;
    if (rs_stats_snapshot_slot(mine, (unsigned)inherited_slot, &s) != 1 || s.bytes_rx != 20)
        return 6;
    int other = rs_stats_slot_acquire(44, RS_STATS_PROTO_TCP);
    if (other < 0 || other == inherited_slot)
        return 7;
    /* A grandchild of a private-area process gets a fresh area too (a
     * shared one again, now that the descriptor limit is back). */
    pid_t grandchild = fork();
    if (grandchild == 0)
        _exit(rs_stats_get()->header.pid == getpid() &&
              rs_stats_get()->counters.sockets_seen[RS_STATS_PROTO_UDP] == 0 ? 0 : 1);
    if (wait_child_and_clean(grandchild) != 0)
        return 8;
    return 0;
}

static void test_private_fallback_when_shm_fails(void **state)
{
    (void)state;
    int slot = rs_stats_slot_acquire(43, RS_STATS_PROTO_UDP);
    assert_true(slot >= 0);

    /* Lower the descriptor limit to the lowest free descriptor so the
     * child's shm_open fails with EMFILE, then fork. */
    int lowest_free = dup(0);
    assert_true(lowest_free >= 0);
    close(lowest_free);
    struct rlimit limit, saved;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
    limit = saved;
    limit.rlim_cur = (rlim_t)lowest_free;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &limit), 0);
    pid_t child = fork();
    setrlimit(RLIMIT_NOFILE, &saved);
    assert_true(child >= 0);
    if (child == 0)
        _exit(check_private_fallback(slot, saved.rlim_cur));
    assert_int_equal(wait_child(child), 0);
    assert_false(shm_exists(child));
    rs_stats_slot_release(slot);
}

/* ---- slot table and names ---- */

static void test_slot_table_full(void **state)
{
    (void)state;
    struct rs_stats_area *area = rs_stats_get();
    uint64_t full_before = rs_stats_counter_read(&area->counters.slot_table_full);
    struct rs_stats_socket s;
    int free_slots = 0;
    for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++)
        free_slots += rs_stats_snapshot_slot(area, i, &s) == 0;
    /* Earlier tests release their slots; anything else is a leak. */
    assert_int_equal(free_slots, RS_STATS_MAX_SOCKETS);
    static int slots[RS_STATS_MAX_SOCKETS];
    for (int i = 0; i < RS_STATS_MAX_SOCKETS; i++) {
        slots[i] = rs_stats_slot_acquire(3000 + i, RS_STATS_PROTO_TCP);
        assert_true(slots[i] >= 0);
    }
    assert_int_equal(rs_stats_slot_acquire(9999, RS_STATS_PROTO_TCP), -1);
    assert_int_equal(rs_stats_counter_read(&area->counters.slot_table_full) - full_before, 1);
    /* -1 from a full table is accepted everywhere and changes nothing. */
    rs_stats_slot_add_io(-1, 1, 1, 1, 1);
    rs_stats_slot_set_state(-1, RS_STATS_STATE_ERROR);
    rs_stats_slot_release(-1);
    assert_int_equal(rs_stats_slot_update(RS_STATS_MAX_SOCKETS, NULL, NULL), -1);

    rs_stats_slot_release(slots[17]);
    assert_int_equal(rs_stats_slot_update(slots[17], NULL, NULL), -1); /* not in use */
    assert_int_equal(rs_stats_slot_acquire(12345, RS_STATS_PROTO_UDP), slots[17]);
    for (int i = 0; i < RS_STATS_MAX_SOCKETS; i++)
        rs_stats_slot_release(slots[i]);
    for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++)
        assert_int_equal(rs_stats_snapshot_slot(area, i, &s), 0);
}

static void test_reason_names_are_stable(void **state)
{
    (void)state;
    static const struct {
        int number;
        const char *name;
    } stable[] = {
        { 1, "RULE_KERNEL" },      { 2, "RULE_RDMA" },         { 3, "DEFAULT_BOTH" },
        { 4, "NO_DEVICE" },        { 5, "PEER_REJECTED" },     { 6, "PEER_UNREACHABLE" },
        { 7, "TIMEOUT" },          { 8, "CONFIG_ERROR" },      { 9, "TRANSPORT_OFF" },
        { 10, "UNSUPPORTED_OPTION" },
    };
    for (size_t i = 0; i < sizeof(stable) / sizeof(stable[0]); i++) {
        assert_string_equal(rs_reason_name((enum rs_reason)stable[i].number), stable[i].name);
        assert_int_equal(rs_reason_from_name(stable[i].name), stable[i].number);
    }
    for (int r = 0; r < RS_REASON_COUNT; r++)
        assert_int_equal(rs_reason_from_name(rs_reason_name((enum rs_reason)r)), r);
    assert_string_equal(rs_reason_name((enum rs_reason)63), "UNKNOWN");
    assert_int_equal(rs_reason_from_name("NOPE"), -1);
    assert_string_equal(rs_stats_path_name(RS_STATS_PATH_FALLBACK), "fallback");
    assert_string_equal(rs_stats_proto_name(RS_STATS_PROTO_UDP), "udp");
    assert_string_equal(rs_stats_state_name(200), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_area_created),
        cmocka_unit_test(test_updates_from_two_threads),
        cmocka_unit_test(test_forked_reader_sees_parent),
        cmocka_unit_test(test_seqlock_reader_never_sees_torn_slot),
        cmocka_unit_test(test_stale_dead_process),
        cmocka_unit_test(test_stale_reused_pid),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_fork_child_gets_own_area),
        cmocka_unit_test(test_private_fallback_when_shm_fails),
        cmocka_unit_test(test_slot_table_full),
        cmocka_unit_test(test_reason_names_are_stable),
    };
    return cmocka_run_group_tests_name("stats", tests, setup, teardown);
}
