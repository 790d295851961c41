/*
 * Statistics area: creation (shared or private fallback), fork and exit
 * handling, seqlocked writers, and the reader API used by `rdmasock stat`.
 * See stats.h and include/rdmasock/stats.h.
 */
#include "common/stats.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/format.h"

_Static_assert(sizeof(struct rs_stats_header) == 1024, "header layout changed");
_Static_assert(sizeof(struct rs_stats_counters) == 2048, "counter layout changed");
_Static_assert(sizeof(struct rs_stats_socket) == 128, "socket slot layout changed");
_Static_assert(offsetof(struct rs_stats_area, counters) == 1024, "area layout changed");
_Static_assert(offsetof(struct rs_stats_area, sockets) == 3072, "area layout changed");
_Static_assert(RS_STATS_PROTO_COUNT <= RS_STATS_PROTO_SLOTS, "too many protocols");
_Static_assert(RS_REASON_COUNT <= RS_STATS_REASON_SLOTS, "too many reasons");

#define SHM_DIR "/dev/shm"
/* A seqlock writer normally holds a slot for tens of nanoseconds; these
 * bounds only matter when the holder cannot run (it was interrupted by the
 * signal handler now trying to write, or it died). */
#define WRITER_SPIN_LIMIT 2000
#define READER_RETRY_LIMIT 100000

/* ---- process-wide writer state ---- */

enum { AREA_NONE, AREA_CREATING, AREA_READY };
static int area_state = AREA_NONE;
static struct rs_stats_area *current_area;
static bool current_shared;
static char current_name[64];
/* Used when the shared object cannot be created; static so that obtaining
 * it can never fail. Untouched pages of it cost nothing. */
static struct rs_stats_area private_area;

/* ---- small helpers ---- */

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void raw_close(int fd)
{
    /* Bypass rdmasock's own close() interposer. */
    syscall(SYS_close, fd);
}

static void copy_text(char *dst, size_t dst_len, const char *src)
{
    if (src == NULL)
        src = "";
    /* Not strnlen: inlined across files, GCC warns when the bound exceeds a literal's size (it stops at the NUL). */
    size_t len = 0;
    while (len < dst_len - 1 && src[len] != '\0')
        len++;
    memcpy(dst, src, len);
    memset(dst + len, 0, dst_len - len);
}

static void cpu_relax(unsigned spins)
{
    if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

/* ---- seqlock ---- */

static bool seq_write_begin(uint32_t *seq)
{
    for (unsigned spins = 0; spins < WRITER_SPIN_LIMIT; spins++) {
        uint32_t value = __atomic_load_n(seq, __ATOMIC_RELAXED);
        if ((value & 1) == 0 &&
            __atomic_compare_exchange_n(seq, &value, value + 1, false,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            /* Data stores must not become visible before the odd count. */
            __atomic_thread_fence(__ATOMIC_RELEASE);
            return true;
        }
        cpu_relax(spins);
    }
    return false;
}

static void seq_write_end(uint32_t *seq)
{
    uint32_t value = __atomic_load_n(seq, __ATOMIC_RELAXED);
    __atomic_store_n(seq, value + 1, __ATOMIC_RELEASE);
}

/* Copies len bytes starting at the guarded object whose first member is the
 * sequence counter. Returns the even sequence value, or -1 on giving up. */
static int64_t seq_read(const void *object, void *out, size_t len)
{
    const uint32_t *seq = object;
    for (unsigned attempt = 0; attempt < READER_RETRY_LIMIT; attempt++) {
        uint32_t before = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (before & 1) {
            cpu_relax(attempt);
            continue;
        }
        memcpy(out, object, len);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint32_t after = __atomic_load_n(seq, __ATOMIC_RELAXED);
        if (before == after)
            return before;
        cpu_relax(attempt);
    }
    return -1;
}

/* ---- process start time (for stale detection) ---- */

uint64_t rs_stats_proc_start_ticks(pid_t pid)
{
    char path[64];
    rs_format(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[1024];
    long got = syscall(SYS_read, fd, buf, sizeof(buf) - 1);
    raw_close(fd);
    if (got <= 0)
        return 0;
    buf[got] = '\0';
    /* The command name (field 2) may contain spaces and parentheses; the
     * fields after the last ')' are plain numbers. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p++;
    /* After ')' comes field 3; field 22 is 19 separators further on. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (p == NULL)
            return 0;
    }
    uint64_t ticks = 0;
    for (p++; *p >= '0' && *p <= '9'; p++)
        ticks = ticks * 10 + (uint64_t)(*p - '0');
    return ticks;
}

static uint64_t process_start_realtime_ns(uint64_t start_ticks)
{
    long hz = sysconf(_SC_CLK_TCK);
    uint64_t realtime = clock_ns(CLOCK_REALTIME);
    uint64_t boottime = clock_ns(CLOCK_BOOTTIME);
    if (start_ticks == 0 || hz <= 0 || boottime == 0)
        return realtime;
    uint64_t started_since_boot = start_ticks * (1000000000u / (uint64_t)hz);
    if (started_since_boot > boottime)
        return realtime;
    return realtime - (boottime - started_since_boot);
}

/* ---- area creation ---- */

/* Set by rs_stats_expect_config before the area exists; see stats.h. */
static bool config_expected;

void rs_stats_expect_config(void)
{
    config_expected = true;
}

static void fill_header(struct rs_stats_area *area, pid_t pid, const char *program)
{
    struct rs_stats_header *h = &area->header;
    if (config_expected)
        h->config_status = RS_STATS_CONFIG_LOADING;
    h->layout_version = RS_STATS_LAYOUT_VERSION;
    h->header_size = sizeof(struct rs_stats_header);
    h->total_size = sizeof(struct rs_stats_area);
    h->counters_offset = offsetof(struct rs_stats_area, counters);
    h->counters_size = sizeof(struct rs_stats_counters);
    h->sockets_offset = offsetof(struct rs_stats_area, sockets);
    h->socket_slot_size = sizeof(struct rs_stats_socket);
    h->socket_slot_count = RS_STATS_MAX_SOCKETS;
    h->pid = (int32_t)pid;
    h->uid = (uint32_t)geteuid();
    h->proc_start_ticks = rs_stats_proc_start_ticks(pid);
    h->start_time_ns = process_start_realtime_ns(h->proc_start_ticks);
    h->created_time_ns = clock_ns(CLOCK_REALTIME);
    copy_text(h->program, sizeof(h->program), program);
    /* Readers treat the area as valid only once the magic is there. */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(h->magic, RS_STATS_MAGIC, RS_STATS_MAGIC_LEN);
}

static void format_shm_name(char *out, size_t len, uid_t uid, pid_t pid)
{
    rs_format(out, len, "/%s%u.%d", RS_STATS_SHM_PREFIX, (unsigned)uid, (int)pid);
}

/*
 * Maps a fresh, zeroed shared object for pid, or returns NULL. Called from
 * first use and from the atfork child handler, so it sticks to calls that
 * are safe in a forked child of a threaded program (no malloc, no stdio).
 */
static struct rs_stats_area *create_shared_area(pid_t pid, char *name, size_t name_len)
{
    format_shm_name(name, name_len, geteuid(), pid);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* An object named after our own pid is either stale (an earlier
         * process with this pid died) or our pre-exec image's: replace it. */
        shm_unlink(name);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    }
    if (fd < 0)
        return NULL;
    void *mem = MAP_FAILED;
    if (ftruncate(fd, (off_t)sizeof(struct rs_stats_area)) == 0)
        mem = mmap(NULL, sizeof(struct rs_stats_area), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    raw_close(fd);
    if (mem == MAP_FAILED) {
        shm_unlink(name);
        return NULL;
    }
    return mem;
}

static struct rs_stats_area *make_area(pid_t pid, const char *program, bool *shared)
{
    struct rs_stats_area *area = create_shared_area(pid, current_name, sizeof(current_name));
    *shared = area != NULL;
    if (area == NULL) {
        current_name[0] = '\0';
        area = &private_area;
        memset(area, 0, sizeof(*area));
    }
    fill_header(area, pid, program);
    return area;
}

static void stats_atexit(void)
{
    rs_stats_close();
}

/*
 * Child of fork(): the inherited mapping is the parent's area, shared with
 * it. Move the child to an area of its own before it can write anything.
 * Socket slots are carried over (the child inherits the descriptors and the
 * slot numbers the intercept layer holds); counters restart at zero.
 */
static void stats_atfork_child(void)
{
    struct rs_stats_area *parent = __atomic_load_n(&current_area, __ATOMIC_ACQUIRE);
    if (parent == NULL) {
        /* Forked while another thread was creating the area: that thread
         * does not exist here, so let the child create its own later. */
        __atomic_store_n(&area_state, AREA_NONE, __ATOMIC_RELAXED);
        return;
    }
    bool parent_shared = current_shared;
    struct rs_stats_header parent_header;
    if (rs_stats_snapshot_header(parent, &parent_header) != 0)
        memset(&parent_header, 0, sizeof(parent_header));

    pid_t pid = getpid();
    char name[sizeof(current_name)];
    struct rs_stats_area *child = create_shared_area(pid, name, sizeof(name));
    bool child_shared = child != NULL;

    if (child == NULL && parent == &private_area) {
        /* Parent and child both private: the child's copy of the private
         * area already holds the inherited slots; reset it in place. */
        memset(&private_area.header, 0, sizeof(private_area.header));
        memset(&private_area.counters, 0, sizeof(private_area.counters));
        child = &private_area;
    } else {
        if (child == NULL) {
            child = &private_area;
            memset(child, 0, sizeof(*child));
        }
        for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++) {
            struct rs_stats_socket slot;
            if (rs_stats_snapshot_slot(parent, i, &slot) == 1) {
                slot.seq = 0;
                child->sockets[i] = slot;
            } else {
                memset(&child->sockets[i], 0, sizeof(child->sockets[i]));
            }
        }
    }
    for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++)
        child->sockets[i].seq = 0;

    memset(child->header.magic, 0, sizeof(child->header.magic));
    copy_text(child->header.transport, sizeof(child->header.transport), parent_header.transport);
    copy_text(child->header.config_path, sizeof(child->header.config_path),
              parent_header.config_path);
    copy_text(child->header.config_error, sizeof(child->header.config_error),
              parent_header.config_error);
    child->header.config_status = parent_header.config_status;
    child->header.seq = 0;
    fill_header(child, pid, parent_header.program);

    memcpy(current_name, child_shared ? name : "", child_shared ? sizeof(name) : 1);
    current_shared = child_shared;
    __atomic_store_n(&current_area, child, __ATOMIC_RELEASE);
    if (parent_shared)
        munmap(parent, sizeof(struct rs_stats_area));
}

static struct rs_stats_area *create_area_slow(const char *program)
{
    int expected = AREA_NONE;
    if (__atomic_compare_exchange_n(&area_state, &expected, AREA_CREATING, false,
                                    __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE)) {
        if (program == NULL)
            program = program_invocation_short_name;
        bool shared;
        struct rs_stats_area *area = make_area(getpid(), program, &shared);
        current_shared = shared;
        /* Registered once: handlers follow current_area, so they stay
         * right across later forks. */
        pthread_atfork(NULL, NULL, stats_atfork_child);
        atexit(stats_atexit);
        __atomic_store_n(&current_area, area, __ATOMIC_RELEASE);
        __atomic_store_n(&area_state, AREA_READY, __ATOMIC_RELEASE);
        return area;
    }
    /* Another thread is creating it; this is a few system calls long. If
     * it does not finish (we interrupted the creator from a signal handler
     * on its own thread), count into the private area rather than hang. */
    for (unsigned spins = 0; spins < WRITER_SPIN_LIMIT; spins++) {
        struct rs_stats_area *area = __atomic_load_n(&current_area, __ATOMIC_ACQUIRE);
        if (area != NULL)
            return area;
        cpu_relax(spins);
    }
    return &private_area;
}

struct rs_stats_area *rs_stats_get(void)
{
    struct rs_stats_area *area = __atomic_load_n(&current_area, __ATOMIC_ACQUIRE);
    if (RS_LIKELY(area != NULL))
        return area;
    return create_area_slow(NULL);
}

int rs_stats_init(const char *program_name)
{
    struct rs_stats_area *area = __atomic_load_n(&current_area, __ATOMIC_ACQUIRE);
    if (area == NULL)
        area = create_area_slow(program_name);
    if (program_name != NULL)
        rs_stats_set_program(program_name);
    return rs_stats_is_shared() ? 0 : -1;
}

bool rs_stats_is_shared(void)
{
    return __atomic_load_n(&current_area, __ATOMIC_ACQUIRE) != NULL && current_shared;
}

const char *rs_stats_shm_name(void)
{
    return rs_stats_is_shared() ? current_name : "";
}

void rs_stats_close(void)
{
    if (rs_stats_is_shared() && current_area->header.pid == (int32_t)getpid())
        shm_unlink(current_name);
}

int rs_stats_republish(void)
{
    if (!rs_stats_is_shared())
        return -1;
    struct rs_stats_area *area = current_area;
    if (area->header.pid != (int32_t)getpid())
        return -1;
    int fd = shm_open(current_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    /* The unlinked object is still our mapping: copy it into the new one and map that at the same address, so
     * every pointer into the area stays valid. An update landing between the copy and the remap is lost. */
    int r = -1;
    const char *p = (const char *)area;
    size_t left = sizeof(*area);
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n <= 0)
            break;
        p += n;
        left -= (size_t)n;
    }
    if (left == 0 && mmap(area, sizeof(*area), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == area)
        r = 0;
    raw_close(fd);
    if (r != 0)
        shm_unlink(current_name);
    return r;
}

/* ---- header text ---- */

static void header_set_text(size_t offset, size_t len, const char *text)
{
    struct rs_stats_area *area = rs_stats_get();
    if (!seq_write_begin(&area->header.seq)) {
        rs_stats_counter_add(&area->counters.slot_updates_dropped, 1);
        return;
    }
    copy_text((char *)&area->header + offset, len, text);
    seq_write_end(&area->header.seq);
}

void rs_stats_set_program(const char *name)
{
    header_set_text(offsetof(struct rs_stats_header, program), RS_STATS_PROGRAM_LEN, name);
}

void rs_stats_set_transport(const char *name)
{
    header_set_text(offsetof(struct rs_stats_header, transport), RS_STATS_TRANSPORT_LEN, name);
}

void rs_stats_set_config(const char *path, enum rs_stats_config_status status,
                         const char *error_text)
{
    struct rs_stats_area *area = rs_stats_get();
    if (!seq_write_begin(&area->header.seq)) {
        rs_stats_counter_add(&area->counters.slot_updates_dropped, 1);
        return;
    }
    copy_text(area->header.config_path, sizeof(area->header.config_path), path);
    copy_text(area->header.config_error, sizeof(area->header.config_error), error_text);
    area->header.config_status = (uint32_t)status;
    seq_write_end(&area->header.seq);
}

void rs_stats_counter_add(uint64_t *counter, uint64_t delta)
{
    if (counter != NULL)
        __atomic_fetch_add(counter, delta, __ATOMIC_RELAXED);
}

/* ---- socket slots ---- */

static struct rs_stats_socket *slot_at(int slot)
{
    if (slot < 0 || slot >= RS_STATS_MAX_SOCKETS)
        return NULL;
    return &rs_stats_get()->sockets[slot];
}

int rs_stats_slot_acquire(int fd, enum rs_stats_proto proto)
{
    struct rs_stats_area *area = rs_stats_get();
    unsigned start = fd >= 0 ? (unsigned)fd % RS_STATS_MAX_SOCKETS : 0;
    for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++) {
        unsigned index = (start + i) % RS_STATS_MAX_SOCKETS;
        struct rs_stats_socket *s = &area->sockets[index];
        if (__atomic_load_n(&s->in_use, __ATOMIC_RELAXED) != 0)
            continue;
        if (!seq_write_begin(&s->seq))
            continue;
        if (s->in_use != 0) {
            /* Lost the race to another thread taking the same slot. */
            seq_write_end(&s->seq);
            continue;
        }
        size_t body = sizeof(*s) - offsetof(struct rs_stats_socket, in_use);
        memset(&s->in_use, 0, body);
        s->in_use = 1;
        s->fd = fd;
        s->proto = (uint8_t)proto;
        s->role = RS_STATS_ROLE_UNKNOWN;
        s->state = RS_STATS_STATE_CREATED;
        s->path = RS_STATS_PATH_UNDECIDED;
        s->reason = RS_REASON_NONE;
        s->opened_time_ns = clock_ns(CLOCK_REALTIME);
        seq_write_end(&s->seq);
        return (int)index;
    }
    rs_stats_counter_add(&area->counters.slot_table_full, 1);
    return -1;
}

int rs_stats_slot_update(int slot, rs_stats_slot_writer fn, void *arg)
{
    struct rs_stats_socket *s = slot_at(slot);
    if (s == NULL || fn == NULL)
        return -1;
    if (!seq_write_begin(&s->seq)) {
        rs_stats_counter_add(&rs_stats_get()->counters.slot_updates_dropped, 1);
        return -1;
    }
    int rc = -1;
    if (s->in_use != 0) {
        fn(s, arg);
        rc = 0;
    }
    seq_write_end(&s->seq);
    return rc;
}

static void write_release(struct rs_stats_socket *s, void *arg)
{
    (void)arg;
    size_t body = sizeof(*s) - offsetof(struct rs_stats_socket, in_use);
    memset(&s->in_use, 0, body);
}

void rs_stats_slot_release(int slot)
{
    rs_stats_slot_update(slot, write_release, NULL);
}

static void write_role(struct rs_stats_socket *s, void *arg)
{
    s->role = (uint8_t)*(const enum rs_stats_role *)arg;
}

void rs_stats_slot_set_role(int slot, enum rs_stats_role role)
{
    rs_stats_slot_update(slot, write_role, &role);
}

static void write_state(struct rs_stats_socket *s, void *arg)
{
    s->state = (uint8_t)*(const enum rs_stats_state *)arg;
}

void rs_stats_slot_set_state(int slot, enum rs_stats_state state)
{
    rs_stats_slot_update(slot, write_state, &state);
}

struct path_update {
    enum rs_stats_path path;
    enum rs_reason reason;
};

static void write_path(struct rs_stats_socket *s, void *arg)
{
    const struct path_update *update = arg;
    s->path = (uint8_t)update->path;
    s->reason = (uint16_t)update->reason;
}

void rs_stats_slot_set_path(int slot, enum rs_stats_path path, enum rs_reason reason)
{
    struct path_update update = { path, reason };
    rs_stats_slot_update(slot, write_path, &update);
}

static void write_qos(struct rs_stats_socket *s, void *arg)
{
    s->qos_class = (uint16_t)*(const unsigned *)arg;
}

void rs_stats_slot_set_qos(int slot, unsigned qos_class)
{
    rs_stats_slot_update(slot, write_qos, &qos_class);
}

/* Converts to the stored sockaddr_in6 form; false for unknown families. */
static bool to_in6(const struct sockaddr *sa, socklen_t len, struct sockaddr_in6 *out)
{
    memset(out, 0, sizeof(*out));
    if (sa == NULL)
        return false;
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        memcpy(out, sa, sizeof(*out));
        return true;
    }
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in4;
        memcpy(&in4, sa, sizeof(in4));
        out->sin6_family = AF_INET6;
        out->sin6_port = in4.sin_port;
        out->sin6_addr.s6_addr[10] = 0xff;
        out->sin6_addr.s6_addr[11] = 0xff;
        memcpy(&out->sin6_addr.s6_addr[12], &in4.sin_addr, 4);
        return true;
    }
    return false;
}

struct address_update {
    bool set_local, set_peer;
    struct sockaddr_in6 local, peer;
};

static void write_addresses(struct rs_stats_socket *s, void *arg)
{
    const struct address_update *update = arg;
    if (update->set_local)
        s->local = update->local;
    if (update->set_peer)
        s->peer = update->peer;
}

void rs_stats_slot_set_addresses(int slot, const struct sockaddr *local, socklen_t local_len,
                                 const struct sockaddr *peer, socklen_t peer_len)
{
    struct address_update update;
    update.set_local = to_in6(local, local_len, &update.local);
    update.set_peer = to_in6(peer, peer_len, &update.peer);
    if (update.set_local || update.set_peer)
        rs_stats_slot_update(slot, write_addresses, &update);
}

/*
 * A slot's I/O counters are added to atomically, outside its seqlock (include/rdmasock/stats.h): each is a counter
 * of its own, and a data call then pays one locked add per counter instead of the seqlock's compare-and-swap,
 * store and retry loop (a busy poller makes two such calls per round trip). A reader's snapshot may hold one
 * counter of a call and not yet the other. The slot stays the caller's until it releases it, so no add lands in a
 * slot somebody else took since.
 */
static inline __attribute__((always_inline)) void slot_add_io(int slot, uint64_t bytes_tx, uint64_t bytes_rx,
                                                             uint64_t msgs_tx, uint64_t msgs_rx)
{
    struct rs_stats_socket *s = slot_at(slot);
    if (s == NULL || __atomic_load_n(&s->in_use, __ATOMIC_RELAXED) == 0)
        return;
    if (bytes_tx)
        __atomic_fetch_add(&s->bytes_tx, bytes_tx, __ATOMIC_RELAXED);
    if (bytes_rx)
        __atomic_fetch_add(&s->bytes_rx, bytes_rx, __ATOMIC_RELAXED);
    if (msgs_tx)
        __atomic_fetch_add(&s->msgs_tx, msgs_tx, __ATOMIC_RELAXED);
    if (msgs_rx)
        __atomic_fetch_add(&s->msgs_rx, msgs_rx, __ATOMIC_RELAXED);
}

void rs_stats_slot_add_io(int slot, uint64_t bytes_tx, uint64_t bytes_rx,
                          uint64_t msgs_tx, uint64_t msgs_rx)
{
    slot_add_io(slot, bytes_tx, bytes_rx, msgs_tx, msgs_rx);
}

void rs_stats_add_io_batch(int slot, enum rs_stats_proto proto, uint64_t bytes_tx, uint64_t bytes_rx,
                           uint64_t msgs_tx, uint64_t msgs_rx)
{
    struct rs_stats_counters *c = &rs_stats_get()->counters;
    if (msgs_tx) {
        __atomic_fetch_add(&c->rdma_bytes_tx[proto], bytes_tx, __ATOMIC_RELAXED);
        __atomic_fetch_add(&c->rdma_msgs_tx[proto], msgs_tx, __ATOMIC_RELAXED);
    }
    if (msgs_rx) {
        __atomic_fetch_add(&c->rdma_bytes_rx[proto], bytes_rx, __ATOMIC_RELAXED);
        __atomic_fetch_add(&c->rdma_msgs_rx[proto], msgs_rx, __ATOMIC_RELAXED);
    }
    slot_add_io(slot, bytes_tx, bytes_rx, msgs_tx, msgs_rx);
}

void rs_stats_add_io(int slot, enum rs_stats_proto proto, uint64_t bytes, bool sent)
{
    if (sent)
        rs_stats_add_io_batch(slot, proto, bytes, 0, 1, 0);
    else
        rs_stats_add_io_batch(slot, proto, 0, bytes, 0, 1);
}

/* ---- names ---- */

static const char *const reason_names[RS_REASON_COUNT] = {
    [RS_REASON_NONE] = "NONE",
    [RS_REASON_RULE_KERNEL] = "RULE_KERNEL",
    [RS_REASON_RULE_RDMA] = "RULE_RDMA",
    [RS_REASON_DEFAULT_BOTH] = "DEFAULT_BOTH",
    [RS_REASON_NO_DEVICE] = "NO_DEVICE",
    [RS_REASON_PEER_REJECTED] = "PEER_REJECTED",
    [RS_REASON_PEER_UNREACHABLE] = "PEER_UNREACHABLE",
    [RS_REASON_TIMEOUT] = "TIMEOUT",
    [RS_REASON_CONFIG_ERROR] = "CONFIG_ERROR",
    [RS_REASON_TRANSPORT_OFF] = "TRANSPORT_OFF",
    [RS_REASON_UNSUPPORTED_OPTION] = "UNSUPPORTED_OPTION",
    [RS_REASON_UNSUPPORTED_FAMILY] = "UNSUPPORTED_FAMILY",
    [RS_REASON_UNSUPPORTED_TYPE] = "UNSUPPORTED_TYPE",
    [RS_REASON_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
    [RS_REASON_PEER_NOT_RDMASOCK] = "PEER_NOT_RDMASOCK",
    [RS_REASON_LOOPBACK] = "LOOPBACK",
    [RS_REASON_INTERNAL_ERROR] = "INTERNAL_ERROR",
    [RS_REASON_HANDED_BACK] = "HANDED_BACK",
};

static const char *const proto_names[RS_STATS_PROTO_COUNT] = { "tcp", "udp", "other" };
static const char *const path_names[RS_STATS_PATH_COUNT] = {
    "undecided", "kernel", "rdma", "fallback",
};
static const char *const role_names[RS_STATS_ROLE_COUNT] = {
    "unknown", "client", "listener", "accepted", "datagram",
};
static const char *const state_names[RS_STATS_STATE_COUNT] = {
    "created", "bound", "listening", "connecting", "connected", "closing", "closed", "error",
};
static const char *const config_status_names[] = { "none", "ok", "error", "loading" };
static const char *const liveness_names[] = {
    "live", "stale (process gone)", "stale (pid reused)", "initializing", "invalid",
};

static const char *name_or_unknown(const char *const *names, size_t count, unsigned index)
{
    return index < count && names[index] != NULL ? names[index] : "unknown";
}

const char *rs_reason_name(enum rs_reason reason)
{
    if ((unsigned)reason >= RS_REASON_COUNT)
        return "UNKNOWN";
    return reason_names[reason];
}

int rs_reason_from_name(const char *name)
{
    if (name == NULL)
        return -1;
    for (unsigned i = 0; i < RS_REASON_COUNT; i++) {
        if (strcmp(reason_names[i], name) == 0)
            return (int)i;
    }
    return -1;
}

const char *rs_stats_proto_name(unsigned proto)
{
    return name_or_unknown(proto_names, RS_ARRAY_SIZE(proto_names), proto);
}

const char *rs_stats_path_name(unsigned path)
{
    return name_or_unknown(path_names, RS_ARRAY_SIZE(path_names), path);
}

const char *rs_stats_role_name(unsigned role)
{
    return name_or_unknown(role_names, RS_ARRAY_SIZE(role_names), role);
}

const char *rs_stats_state_name(unsigned state)
{
    return name_or_unknown(state_names, RS_ARRAY_SIZE(state_names), state);
}

const char *rs_stats_config_status_name(unsigned status)
{
    return name_or_unknown(config_status_names, RS_ARRAY_SIZE(config_status_names), status);
}

const char *rs_stats_liveness_name(enum rs_stats_liveness liveness)
{
    return name_or_unknown(liveness_names, RS_ARRAY_SIZE(liveness_names), (unsigned)liveness);
}

/* ---- reader side ---- */

int rs_stats_snapshot_header(const struct rs_stats_area *area, struct rs_stats_header *out)
{
    if (seq_read(&area->header.seq, &out->seq,
                 sizeof(*out) - offsetof(struct rs_stats_header, seq)) < 0)
        return -EAGAIN;
    /* Fields before seq are written once, before the magic. */
    memcpy(out, &area->header, offsetof(struct rs_stats_header, seq));
    out->program[sizeof(out->program) - 1] = '\0';
    out->transport[sizeof(out->transport) - 1] = '\0';
    out->config_path[sizeof(out->config_path) - 1] = '\0';
    out->config_error[sizeof(out->config_error) - 1] = '\0';
    return 0;
}

int rs_stats_snapshot_slot(const struct rs_stats_area *area, unsigned index,
                           struct rs_stats_socket *out)
{
    if (index >= RS_STATS_MAX_SOCKETS)
        return -EINVAL;
    if (seq_read(&area->sockets[index], out, sizeof(*out)) < 0)
        return -EAGAIN;
    return out->in_use != 0 ? 1 : 0;
}

uint64_t rs_stats_counter_read(const uint64_t *counter)
{
    return __atomic_load_n(counter, __ATOMIC_RELAXED);
}

static int validate_area(const struct rs_stats_area *area, size_t length)
{
    const struct rs_stats_header *h = &area->header;
    if (memcmp(h->magic, RS_STATS_MAGIC, RS_STATS_MAGIC_LEN) != 0)
        return -EAGAIN;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (h->layout_version != RS_STATS_LAYOUT_VERSION ||
        h->header_size != sizeof(struct rs_stats_header) ||
        h->total_size < sizeof(struct rs_stats_area) || h->total_size > length ||
        h->counters_offset != offsetof(struct rs_stats_area, counters) ||
        h->sockets_offset != offsetof(struct rs_stats_area, sockets) ||
        h->socket_slot_size != sizeof(struct rs_stats_socket) ||
        h->socket_slot_count != RS_STATS_MAX_SOCKETS)
        return -EPROTO;
    return 0;
}

/* Maps an object without validating it; used by open and by list. */
static int map_object(const char *name, const struct rs_stats_area **area, size_t *length,
                      struct stat *st_out)
{
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = -errno;
        raw_close(fd);
        return err;
    }
    /* Only regular objects big enough for the fixed layout: mapping beyond
     * the end would turn reads into SIGBUS. */
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size < sizeof(struct rs_stats_area)) {
        raw_close(fd);
        return st.st_size == 0 ? -EAGAIN : -EPROTO;
    }
    void *mem = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    raw_close(fd);
    if (mem == MAP_FAILED)
        return -err;
    *area = mem;
    *length = (size_t)st.st_size;
    if (st_out != NULL)
        *st_out = st;
    return 0;
}

/* Parses "rdmasock.<uid>.<pid>" (optionally with a leading '/'). */
static bool parse_object_name(const char *name, uid_t *uid, pid_t *pid)
{
    if (name[0] == '/')
        name++;
    size_t prefix_len = strlen(RS_STATS_SHM_PREFIX);
    if (strncmp(name, RS_STATS_SHM_PREFIX, prefix_len) != 0)
        return false;
    const char *p = name + prefix_len;
    unsigned long values[2];
    for (int i = 0; i < 2; i++) {
        if (*p < '0' || *p > '9')
            return false;
        unsigned long value = 0;
        while (*p >= '0' && *p <= '9') {
            value = value * 10 + (unsigned long)(*p - '0');
            if (value > INT_MAX)
                return false;
            p++;
        }
        values[i] = value;
        if (i == 0 && *p++ != '.')
            return false;
    }
    if (*p != '\0' || values[1] == 0)
        return false;
    *uid = (uid_t)values[0];
    *pid = (pid_t)values[1];
    return true;
}

int rs_stats_open_name(const char *name, struct rs_stats_map *map)
{
    memset(map, 0, sizeof(*map));
    char full[96];
    uid_t uid;
    pid_t pid;
    if (name == NULL || !parse_object_name(name, &uid, &pid))
        return -EINVAL;
    rs_format(full, sizeof(full), "%s%s", name[0] == '/' ? "" : "/", name);
    const struct rs_stats_area *area;
    size_t length;
    int rc = map_object(full, &area, &length, NULL);
    if (rc != 0)
        return rc;
    rc = validate_area(area, length);
    if (rc == 0 && area->header.pid != (int32_t)pid)
        rc = -EPROTO;
    if (rc != 0) {
        munmap((void *)area, length);
        return rc;
    }
    map->area = area;
    map->length = length;
    map->pid = pid;
    map->uid = uid;
    return 0;
}

int rs_stats_open_pid(pid_t pid, struct rs_stats_map *map)
{
    char name[64];
    format_shm_name(name, sizeof(name), geteuid(), pid);
    return rs_stats_open_name(name, map);
}

void rs_stats_unmap(struct rs_stats_map *map)
{
    if (map->area != NULL)
        munmap((void *)map->area, map->length);
    memset(map, 0, sizeof(*map));
}

enum rs_stats_liveness rs_stats_check_pid(pid_t pid, uint64_t start_ticks)
{
    if (pid <= 0)
        return RS_STATS_STALE_DEAD;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return RS_STATS_STALE_DEAD;
    if (start_ticks == 0)
        return RS_STATS_LIVE;
    uint64_t now_ticks = rs_stats_proc_start_ticks(pid);
    if (now_ticks == 0) {
        /* Existed a moment ago but /proc has no entry: it just exited, or
         * /proc is not mounted. Only the former is certain to be stale. */
        return kill(pid, 0) != 0 && errno == ESRCH ? RS_STATS_STALE_DEAD : RS_STATS_LIVE;
    }
    return now_ticks == start_ticks ? RS_STATS_LIVE : RS_STATS_STALE_REUSED;
}

static enum rs_stats_liveness classify_object(const char *full_name, pid_t pid,
                                              struct stat *st_out)
{
    const struct rs_stats_area *area;
    size_t length;
    int rc = map_object(full_name, &area, &length, st_out);
    if (rc != 0) {
        enum rs_stats_liveness by_pid = rs_stats_check_pid(pid, 0);
        if (by_pid != RS_STATS_LIVE)
            return by_pid;
        return rc == -EAGAIN ? RS_STATS_INITIALIZING : RS_STATS_INVALID;
    }
    enum rs_stats_liveness liveness;
    rc = validate_area(area, length);
    if (rc == -EAGAIN) {
        liveness = rs_stats_check_pid(pid, 0);
        if (liveness == RS_STATS_LIVE)
            liveness = RS_STATS_INITIALIZING;
    } else if (rc != 0 || area->header.pid != (int32_t)pid) {
        liveness = rs_stats_check_pid(pid, 0);
        if (liveness == RS_STATS_LIVE)
            liveness = RS_STATS_INVALID;
    } else {
        liveness = rs_stats_check_pid(pid, area->header.proc_start_ticks);
    }
    munmap((void *)area, length);
    return liveness;
}

int rs_stats_list(unsigned flags, rs_stats_list_fn fn, void *arg)
{
    DIR *dir = opendir(SHM_DIR);
    if (dir == NULL)
        return -errno;
    uid_t my_uid = geteuid();
    int listed = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        struct rs_stats_entry info;
        memset(&info, 0, sizeof(info));
        if (!parse_object_name(entry->d_name, &info.uid, &info.pid))
            continue;
        if (!(flags & RS_STATS_LIST_ALL_USERS) && info.uid != my_uid)
            continue;
        copy_text(info.name, sizeof(info.name), entry->d_name);

        char full[sizeof(info.name) + 2];
        rs_format(full, sizeof(full), "/%s", info.name);
        struct stat checked = { 0 };
        info.liveness = classify_object(full, info.pid, &checked);

        bool stale = info.liveness == RS_STATS_STALE_DEAD ||
                     info.liveness == RS_STATS_STALE_REUSED;
        if (stale && (flags & RS_STATS_LIST_REMOVE_STALE)) {
            /* Unlink only the object we examined: a new process with the
             * reused pid may have replaced it in the meantime. */
            char path[sizeof(SHM_DIR) + sizeof(info.name) + 2];
            rs_format(path, sizeof(path), "%s/%s", SHM_DIR, info.name);
            struct stat now;
            bool same = checked.st_ino == 0 ||
                        (stat(path, &now) == 0 && now.st_ino == checked.st_ino &&
                         now.st_dev == checked.st_dev);
            if (same && shm_unlink(full) == 0)
                info.removed = true;
        }
        listed++;
        if (fn != NULL && fn(&info, arg) != 0)
            break;
    }
    closedir(dir);
    return listed;
}

/* ---- printing ---- */

static void format_address(const struct sockaddr_in6 *sa, char *out, size_t len)
{
    if (sa->sin6_family != AF_INET6) {
        copy_text(out, len, "-");
        return;
    }
    char host[INET6_ADDRSTRLEN];
    const uint8_t *bytes = sa->sin6_addr.s6_addr;
    static const uint8_t v4_mapped_prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    unsigned port = ntohs(sa->sin6_port);
    if (memcmp(bytes, v4_mapped_prefix, sizeof(v4_mapped_prefix)) == 0) {
        inet_ntop(AF_INET, bytes + 12, host, sizeof(host));
        rs_format(out, len, "%s:%u", host, port);
    } else {
        inet_ntop(AF_INET6, bytes, host, sizeof(host));
        rs_format(out, len, "[%s]:%u", host, port);
    }
}

static void format_time(uint64_t ns, char *out, size_t len)
{
    time_t seconds = (time_t)(ns / 1000000000u);
    struct tm tm;
    if (ns == 0 || localtime_r(&seconds, &tm) == NULL ||
        strftime(out, len, "%Y-%m-%d %H:%M:%S", &tm) == 0)
        copy_text(out, len, "-");
}

static uint64_t sum(const uint64_t *values, size_t count)
{
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += rs_stats_counter_read(&values[i]);
    return total;
}

void rs_stats_print(FILE *out, const struct rs_stats_map *map)
{
    const struct rs_stats_area *area = map->area;
    struct rs_stats_header h;
    if (area == NULL || rs_stats_snapshot_header(area, &h) != 0) {
        fprintf(out, "rdmasock: statistics of pid %d are not readable right now\n", (int)map->pid);
        return;
    }
    const struct rs_stats_counters *c = &area->counters;
    char started[32], created[32];
    format_time(h.start_time_ns, started, sizeof(started));
    format_time(h.created_time_ns, created, sizeof(created));

    fprintf(out, "pid %d  program %s  uid %u\n", (int)h.pid, h.program[0] ? h.program : "?",
            (unsigned)h.uid);
    fprintf(out, "  started %s, statistics since %s\n", started, created);
    fprintf(out, "  transport %s\n", h.transport[0] ? h.transport : "-");
    fprintf(out, "  config %s: %s%s%s\n", rs_stats_config_status_name(h.config_status),
            h.config_path[0] ? h.config_path : "(no file)",
            h.config_error[0] ? ": " : "", h.config_error);

    fprintf(out, "  %-6s %10s %10s %10s %14s %14s %12s %12s\n", "proto", "sockets", "rdma",
            "kernel", "bytes_tx", "bytes_rx", "msgs_tx", "msgs_rx");
    for (unsigned p = 0; p < RS_STATS_PROTO_COUNT; p++) {
        fprintf(out, "  %-6s %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %14" PRIu64 " %14" PRIu64
                " %12" PRIu64 " %12" PRIu64 "\n",
                rs_stats_proto_name(p), rs_stats_counter_read(&c->sockets_seen[p]),
                rs_stats_counter_read(&c->sockets_rdma[p]),
                rs_stats_counter_read(&c->sockets_kernel[p]),
                rs_stats_counter_read(&c->rdma_bytes_tx[p]),
                rs_stats_counter_read(&c->rdma_bytes_rx[p]),
                rs_stats_counter_read(&c->rdma_msgs_tx[p]),
                rs_stats_counter_read(&c->rdma_msgs_rx[p]));
    }
    if (sum(c->decisions, RS_STATS_REASON_SLOTS) + sum(c->fallbacks, RS_STATS_REASON_SLOTS) > 0) {
        fprintf(out, "  %-20s %10s %10s\n", "reason", "decisions", "fallbacks");
        for (unsigned r = 0; r < RS_STATS_REASON_SLOTS; r++) {
            uint64_t decisions = rs_stats_counter_read(&c->decisions[r]);
            uint64_t fallbacks = rs_stats_counter_read(&c->fallbacks[r]);
            if (decisions == 0 && fallbacks == 0)
                continue;
            char unnamed[16];
            rs_format(unnamed, sizeof(unnamed), "REASON_%u", r);
            fprintf(out, "  %-20s %10" PRIu64 " %10" PRIu64 "\n",
                    r < RS_REASON_COUNT ? rs_reason_name((enum rs_reason)r) : unnamed,
                    decisions, fallbacks);
        }
    }
    fprintf(out, "  errors %" PRIu64 "  slot_table_full %" PRIu64 "  slot_updates_dropped %" PRIu64
            "\n", rs_stats_counter_read(&c->errors), rs_stats_counter_read(&c->slot_table_full),
            rs_stats_counter_read(&c->slot_updates_dropped));

    bool printed_heading = false;
    for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++) {
        struct rs_stats_socket s;
        if (rs_stats_snapshot_slot(area, i, &s) != 1)
            continue;
        if (!printed_heading) {
            fprintf(out, "  %5s %-5s %-8s %-10s %-9s %-18s %-22s %-22s %12s %12s %3s\n", "fd",
                    "proto", "role", "state", "path", "reason", "local", "peer", "bytes_tx",
                    "bytes_rx", "qos");
            printed_heading = true;
        }
        char local[64], peer[64];
        format_address(&s.local, local, sizeof(local));
        format_address(&s.peer, peer, sizeof(peer));
        fprintf(out, "  %5d %-5s %-8s %-10s %-9s %-18s %-22s %-22s %12" PRIu64 " %12" PRIu64
                " %3u\n", (int)s.fd, rs_stats_proto_name(s.proto), rs_stats_role_name(s.role),
                rs_stats_state_name(s.state), rs_stats_path_name(s.path),
                rs_reason_name((enum rs_reason)s.reason), local, peer, s.bytes_tx, s.bytes_rx,
                (unsigned)s.qos_class);
    }
    if (!printed_heading)
        fprintf(out, "  no sockets\n");
}

static void json_string(FILE *out, const char *text)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20 || *p >= 0x7f)
                /* Bytes of program names and paths need not be UTF-8;
                 * escaping them keeps the document valid JSON. */
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

static void json_counter_array(FILE *out, const char *key, const uint64_t *values,
                               unsigned count, const char *(*name)(unsigned))
{
    fprintf(out, ",\"%s\":{", key);
    for (unsigned i = 0; i < count; i++)
        fprintf(out, "%s\"%s\":%" PRIu64, i ? "," : "", name(i), rs_stats_counter_read(&values[i]));
    fputc('}', out);
}

static const char *reason_name_by_index(unsigned index)
{
    return rs_reason_name((enum rs_reason)index);
}

static void json_reason_counters(FILE *out, const char *key, const uint64_t *values)
{
    /* Reasons are sparse: list only the nonzero ones, by name. */
    fprintf(out, ",\"%s\":{", key);
    bool first = true;
    for (unsigned r = 0; r < RS_STATS_REASON_SLOTS; r++) {
        uint64_t value = rs_stats_counter_read(&values[r]);
        if (value == 0)
            continue;
        if (r < RS_REASON_COUNT)
            fprintf(out, "%s\"%s\":%" PRIu64, first ? "" : ",", reason_name_by_index(r), value);
        else
            fprintf(out, "%s\"REASON_%u\":%" PRIu64, first ? "" : ",", r, value);
        first = false;
    }
    fputc('}', out);
}

void rs_stats_print_json(FILE *out, const struct rs_stats_map *map)
{
    const struct rs_stats_area *area = map->area;
    struct rs_stats_header h;
    if (area == NULL || rs_stats_snapshot_header(area, &h) != 0) {
        fprintf(out, "{\"pid\":%d,\"error\":\"not readable\"}\n", (int)map->pid);
        return;
    }
    const struct rs_stats_counters *c = &area->counters;
    fprintf(out, "{\"layout_version\":%u,\"pid\":%d,\"uid\":%u,\"program\":",
            (unsigned)h.layout_version, (int)h.pid, (unsigned)h.uid);
    json_string(out, h.program);
    fprintf(out, ",\"start_time_ns\":%" PRIu64 ",\"created_time_ns\":%" PRIu64 ",\"transport\":",
            h.start_time_ns, h.created_time_ns);
    json_string(out, h.transport);
    fprintf(out, ",\"config\":{\"status\":\"%s\",\"path\":",
            rs_stats_config_status_name(h.config_status));
    json_string(out, h.config_path);
    fputs(",\"error\":", out);
    json_string(out, h.config_error);
    fputs("},\"counters\":{\"errors\":", out);
    fprintf(out, "%" PRIu64 ",\"slot_table_full\":%" PRIu64 ",\"slot_updates_dropped\":%" PRIu64,
            rs_stats_counter_read(&c->errors), rs_stats_counter_read(&c->slot_table_full),
            rs_stats_counter_read(&c->slot_updates_dropped));
    json_counter_array(out, "sockets_seen", c->sockets_seen, RS_STATS_PROTO_COUNT,
                       rs_stats_proto_name);
    json_counter_array(out, "sockets_rdma", c->sockets_rdma, RS_STATS_PROTO_COUNT,
                       rs_stats_proto_name);
    json_counter_array(out, "sockets_kernel", c->sockets_kernel, RS_STATS_PROTO_COUNT,
                       rs_stats_proto_name);
    json_counter_array(out, "rdma_bytes_tx", c->rdma_bytes_tx, RS_STATS_PROTO_COUNT,
                       rs_stats_proto_name);
    json_counter_array(out, "rdma_bytes_rx", c->rdma_bytes_rx, RS_STATS_PROTO_COUNT,
                       rs_stats_proto_name);
    json_counter_array(out, "rdma_msgs_tx", c->rdma_msgs_tx, RS_STATS_PROTO_COUNT,
                       rs_stats_proto_name);
    json_counter_array(out, "rdma_msgs_rx", c->rdma_msgs_rx, RS_STATS_PROTO_COUNT,
                       rs_stats_proto_name);
    json_reason_counters(out, "decisions", c->decisions);
    json_reason_counters(out, "fallbacks", c->fallbacks);
    fputs("},\"sockets\":[", out);
    bool first = true;
    for (unsigned i = 0; i < RS_STATS_MAX_SOCKETS; i++) {
        struct rs_stats_socket s;
        if (rs_stats_snapshot_slot(area, i, &s) != 1)
            continue;
        char local[64], peer[64];
        format_address(&s.local, local, sizeof(local));
        format_address(&s.peer, peer, sizeof(peer));
        fprintf(out, "%s{\"slot\":%u,\"fd\":%d,\"proto\":\"%s\",\"role\":\"%s\",\"state\":\"%s\","
                "\"path\":\"%s\",\"reason\":\"%s\",\"local\":",
                first ? "" : ",", i, (int)s.fd, rs_stats_proto_name(s.proto),
                rs_stats_role_name(s.role), rs_stats_state_name(s.state),
                rs_stats_path_name(s.path), rs_reason_name((enum rs_reason)s.reason));
        json_string(out, local);
        fputs(",\"peer\":", out);
        json_string(out, peer);
        fprintf(out, ",\"bytes_tx\":%" PRIu64 ",\"bytes_rx\":%" PRIu64 ",\"msgs_tx\":%" PRIu64
                ",\"msgs_rx\":%" PRIu64 ",\"qos_class\":%u,\"opened_time_ns\":%" PRIu64 "}",
                s.bytes_tx, s.bytes_rx, s.msgs_tx, s.msgs_rx, (unsigned)s.qos_class,
                s.opened_time_ns);
        first = false;
    }
    fputs("]}\n", out);
}
