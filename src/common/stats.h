/*
 * Per-process statistics area (layout: include/rdmasock/stats.h).
 *
 * Writer side, used by the preloaded library: the area is a POSIX shm object
 * "/rdmasock.<euid>.<pid>" created on first use (any rs_stats_* writer call).
 * If it cannot be created, a private in-process area is used instead, so
 * statistics never break the host program. Counter updates are relaxed
 * atomic adds; socket slots and the header text use a seqlock so readers in
 * other processes never see torn data and never block the writer.
 *
 * After fork() the child gets its own area for its own pid (pthread_atfork
 * handler): the socket table is copied (the child inherits the descriptors,
 * and slot numbers stay valid), the global counters start at zero. The
 * object is unlinked at normal exit (atexit); processes killed by a signal
 * leave stale objects that rs_stats_list() detects and can remove.
 *
 * Reader side, used by `rdmasock stat`: rs_stats_open_pid / rs_stats_list /
 * rs_stats_snapshot_* / rs_stats_print*. These are exported from
 * librdmasock.so so the CLI may link against either library form.
 */
#ifndef RS_COMMON_STATS_H
#define RS_COMMON_STATS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "common/compiler.h"
#include "rdmasock/stats.h"

/* ---- writer side ---- */

/*
 * Creates the area now (instead of at first use) and records the program
 * name (NULL: the name glibc derived from argv[0]). Returns 0 when the
 * shared object is in use, -1 when the private fallback is in use (the
 * rest of the API works either way).
 */
int rs_stats_init(const char *program_name);

/*
 * The process is about to read its configuration: an area created after
 * this call says "loading" until rs_stats_set_config, so a reader that
 * looks in between is not told "no configuration". Call before
 * rs_stats_init.
 */
void rs_stats_expect_config(void);

/* The current process's area, created if needed; never NULL. */
struct rs_stats_area *rs_stats_get(void);

/* True when the area is the shared-memory object (not the fallback). */
bool rs_stats_is_shared(void);

/* Name of this process's shm object ("/rdmasock.UID.PID"), "" if private. */
const char *rs_stats_shm_name(void);

void rs_stats_set_program(const char *name);
void rs_stats_set_transport(const char *name);
void rs_stats_set_config(const char *path, enum rs_stats_config_status status,
                         const char *error_text);

/* Relaxed atomic add to one counter of the area; NULL is ignored. */
void rs_stats_counter_add(uint64_t *counter, uint64_t delta);

/* RS_STATS_ADD(sockets_seen[RS_STATS_PROTO_TCP], 1) */
#define RS_STATS_ADD(field, delta) \
    rs_stats_counter_add(&rs_stats_get()->counters.field, (delta))

/*
 * Takes a free socket slot for fd (search starts at fd % RS_STATS_MAX_SOCKETS).
 * Returns the slot index, or -1 when the table is full (counted in
 * slot_table_full). Every slot function below accepts -1 and does nothing,
 * so callers need not special-case a full table.
 */
int rs_stats_slot_acquire(int fd, enum rs_stats_proto proto);
void rs_stats_slot_release(int slot);

/*
 * Runs fn on the slot inside the seqlock write section; fn must only store
 * into the slot (no blocking, no logging). Writers of one slot are
 * serialised by the seqlock itself; a writer that cannot get it within a
 * short bounded spin (e.g. a signal handler interrupting a write to the same
 * slot) drops its update and counts it in slot_updates_dropped.
 * Returns 0 if applied, -1 if dropped or the slot is not in use.
 */
typedef void (*rs_stats_slot_writer)(struct rs_stats_socket *slot, void *arg);
int rs_stats_slot_update(int slot, rs_stats_slot_writer fn, void *arg);

void rs_stats_slot_set_role(int slot, enum rs_stats_role role);
void rs_stats_slot_set_state(int slot, enum rs_stats_state state);
void rs_stats_slot_set_path(int slot, enum rs_stats_path path, enum rs_reason reason);
void rs_stats_slot_set_qos(int slot, unsigned qos_class);
/* AF_INET is stored v4-mapped; NULL (or an unknown family) leaves the
 * stored address unchanged. */
void rs_stats_slot_set_addresses(int slot, const struct sockaddr *local, socklen_t local_len,
                                 const struct sockaddr *peer, socklen_t peer_len);
void rs_stats_slot_add_io(int slot, uint64_t bytes_tx, uint64_t bytes_rx,
                          uint64_t msgs_tx, uint64_t msgs_rx);
/* One data call that moved bytes over RDMA, sent or received: the process counters (rdma_bytes_* and
 * rdma_msgs_* of proto) and, when slot >= 0, the socket's slot, in one pass (every data call ends here). */
void rs_stats_add_io(int slot, enum rs_stats_proto proto, uint64_t bytes, bool sent);
/* Several data calls at once (a thread's batch of short calls, io_calls.c): the same counters. */
void rs_stats_add_io_batch(int slot, enum rs_stats_proto proto, uint64_t bytes_tx, uint64_t bytes_rx,
                           uint64_t msgs_tx, uint64_t msgs_rx);

/* Unlinks this process's object (registered with atexit). The mapping
 * stays valid because other threads may still be updating it. */
void rs_stats_close(void);
/* After rs_stats_close, when the process goes on (an exec that failed): publishes the area again under its name,
 * with what it holds. 0, or -1 when it stays private. */
int rs_stats_republish(void);

/* ---- names (stable, for the CLI and logs) ---- */

RS_EXPORT const char *rs_reason_name(enum rs_reason reason);   /* "RULE_KERNEL"; "UNKNOWN" */
RS_EXPORT int rs_reason_from_name(const char *name);           /* -1 if unknown */
RS_EXPORT const char *rs_stats_proto_name(unsigned proto);     /* "tcp" */
RS_EXPORT const char *rs_stats_path_name(unsigned path);       /* "rdma" */
RS_EXPORT const char *rs_stats_role_name(unsigned role);       /* "client" */
RS_EXPORT const char *rs_stats_state_name(unsigned state);     /* "connected" */
RS_EXPORT const char *rs_stats_config_status_name(unsigned status); /* "ok" */

/* ---- reader side ---- */

struct rs_stats_map {
    const struct rs_stats_area *area;
    size_t length;
    pid_t pid;
    uid_t uid;
};

/*
 * Maps /rdmasock.<euid>.<pid> read-only and validates it. Returns 0, or
 * -ENOENT (no such area), -EAGAIN (being initialised), -EPROTO (not a
 * compatible layout), or another -errno.
 */
RS_EXPORT int rs_stats_open_pid(pid_t pid, struct rs_stats_map *map);
/* Same for an explicit object name ("rdmasock.1000.42" or "/rdmasock..."). */
RS_EXPORT int rs_stats_open_name(const char *name, struct rs_stats_map *map);
RS_EXPORT void rs_stats_unmap(struct rs_stats_map *map);

/* Consistent copies under the seqlock; -EAGAIN after bounded retries.
 * snapshot_slot returns 1 for a slot in use, 0 for a free slot. */
RS_EXPORT int rs_stats_snapshot_header(const struct rs_stats_area *area,
                                       struct rs_stats_header *out);
RS_EXPORT int rs_stats_snapshot_slot(const struct rs_stats_area *area, unsigned index,
                                     struct rs_stats_socket *out);
RS_EXPORT uint64_t rs_stats_counter_read(const uint64_t *counter);

enum rs_stats_liveness {
    RS_STATS_LIVE = 0,
    RS_STATS_STALE_DEAD = 1,        /* pid does not exist */
    RS_STATS_STALE_REUSED = 2,      /* pid exists but is another process */
    RS_STATS_INITIALIZING = 3,      /* live pid, header not complete yet */
    RS_STATS_INVALID = 4,           /* not a compatible area */
};
RS_EXPORT const char *rs_stats_liveness_name(enum rs_stats_liveness liveness);

/* Start time of pid in clock ticks since boot (/proc/PID/stat field 22);
 * 0 if it cannot be read. */
RS_EXPORT uint64_t rs_stats_proc_start_ticks(pid_t pid);

/* Liveness of an area claiming to belong to pid with the given start ticks
 * (0 = unknown, only existence is checked). */
RS_EXPORT enum rs_stats_liveness rs_stats_check_pid(pid_t pid, uint64_t start_ticks);

struct rs_stats_entry {
    char name[64];                  /* object name without the leading '/' */
    uid_t uid;
    pid_t pid;
    enum rs_stats_liveness liveness;
    bool removed;                   /* stale object unlinked by this call */
};

#define RS_STATS_LIST_ALL_USERS    0x1u  /* not only the caller's euid */
#define RS_STATS_LIST_REMOVE_STALE 0x2u  /* unlink stale objects */

/* Return nonzero from the callback to stop the walk. */
typedef int (*rs_stats_list_fn)(const struct rs_stats_entry *entry, void *arg);

/* Walks /dev/shm/rdmasock.<uid>.<pid> objects. Returns the number of
 * entries passed to fn, or -errno if the directory cannot be read. */
RS_EXPORT int rs_stats_list(unsigned flags, rs_stats_list_fn fn, void *arg);

RS_EXPORT void rs_stats_print(FILE *out, const struct rs_stats_map *map);
RS_EXPORT void rs_stats_print_json(FILE *out, const struct rs_stats_map *map);

#endif /* RS_COMMON_STATS_H */
