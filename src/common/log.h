/*
 * Diagnostics for rdmasock.
 *
 * Configured by a spec string, normally the RDMASOCK_LOG environment
 * variable:  LEVEL[,DEST]
 *   LEVEL  off | error | warn | info | debug | trace   (case-insensitive;
 *          "warning" is accepted for warn).  Default: warn.
 *   DEST   stderr (default) | syslog | file:PATH
 *          file:PATH is opened O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, mode 0600.
 *          syslog sends "<PRI>rdmasock[PID]: message" datagrams straight to
 *          /dev/log (facility user) instead of calling syslog(3), because
 *          syslog(3) takes a lock and may allocate, so it is not safe from a
 *          signal handler.  If /dev/log cannot be reached when configuring,
 *          lines go to stderr.  If the syslog daemon goes away later, each
 *          line reconnects once and otherwise falls back to stderr.
 *
 * Line format (stderr and files):
 *   rdmasock[PID]: LEVEL: message\n
 * When the configured level is debug or trace every line also carries the
 * CLOCK_MONOTONIC time, so lines of different levels can be ordered:
 *   rdmasock[PID]: DEBUG: [  1234.567890] message\n
 *
 * Guarantees: one write(2) per line (lines from threads and processes never
 * interleave; lines are capped at RS_LOG_LINE_MAX bytes, below PIPE_BUF, and
 * long messages end in "..."); no allocation and no lock, so rs_log is safe
 * in a signal handler and inside malloc; errno is preserved.  Formats accept
 * the subset documented in common/format.h (no floating point).
 *
 * The logger talks to the kernel with raw system calls, so it never re-enters
 * rdmasock's own interposed socket/write functions.
 */
#ifndef RS_COMMON_LOG_H
#define RS_COMMON_LOG_H

#include <stddef.h>

#include "common/compiler.h"

enum rs_log_level {
    RS_LOG_OFF = -1,
    RS_LOG_ERROR = 0,
    RS_LOG_WARN = 1,
    RS_LOG_INFO = 2,
    RS_LOG_DEBUG = 3,
    RS_LOG_TRACE = 4,
};

enum rs_log_dest {
    RS_LOG_DEST_STDERR = 0,
    RS_LOG_DEST_SYSLOG = 1,
    RS_LOG_DEST_FILE = 2,
};

#define RS_LOG_DEFAULT_LEVEL RS_LOG_WARN
#define RS_LOG_ENV "RDMASOCK_LOG"
/* Maximum bytes of one line, newline included. */
#define RS_LOG_LINE_MAX 1024

/* Most verbose level currently printed. Read it through RS_LOG_ENABLED. */
extern int rs_log_threshold;

#define RS_LOG_ENABLED(level) \
    RS_UNLIKELY((int)(level) <= __atomic_load_n(&rs_log_threshold, __ATOMIC_RELAXED))

/*
 * Applies a spec (see above). NULL or "" restores the defaults (warn,
 * stderr). On error returns -1, writes a precise message to err (if errlen >
 * 0) and keeps the previous configuration; returns 0 on success.
 * Not async-signal-safe (opens files); call it from initialisation.
 */
int rs_log_configure(const char *spec, char *err, size_t errlen);

/* Configures from $RDMASOCK_LOG; a bad value is reported once on stderr and
 * leaves the defaults. Returns what rs_log_configure returned. */
int rs_log_configure_from_env(void);

/* Current settings, for diagnostics and tests. */
enum rs_log_level rs_log_get_level(void);
enum rs_log_dest rs_log_get_dest(void);

/* Name ("ERROR", ...) of a level; "?" for out-of-range values. */
const char *rs_log_level_name(enum rs_log_level level);

/* Emits one line if level is enabled. Prefer the macros below, which skip
 * argument evaluation when the level is off. */
void rs_log(enum rs_log_level level, const char *fmt, ...) RS_PRINTF(2, 3);

/* Socket path used for the syslog destination (default /dev/log). Takes
 * effect at the next rs_log_configure; lets tests stand in for syslogd. */
void rs_log_set_syslog_path(const char *path);

/*
 * True for the descriptors the logger keeps open (log file, syslog socket).
 * The close()/dup2() interposers should refuse to let the host program close
 * or replace these (daemons often close every descriptor): a reused number
 * would make log lines land in one of the program's own files.
 */
int rs_log_owns_fd(int fd);

#define RS_LOG_AT(level, fmt, ...) \
    do { \
        if (RS_LOG_ENABLED(level)) \
            rs_log((level), fmt, ##__VA_ARGS__); \
    } while (0)

#define RS_ERROR(fmt, ...) RS_LOG_AT(RS_LOG_ERROR, fmt, ##__VA_ARGS__)
#define RS_WARN(fmt, ...)  RS_LOG_AT(RS_LOG_WARN, fmt, ##__VA_ARGS__)
#define RS_INFO(fmt, ...)  RS_LOG_AT(RS_LOG_INFO, fmt, ##__VA_ARGS__)
#define RS_DEBUG(fmt, ...) RS_LOG_AT(RS_LOG_DEBUG, fmt, ##__VA_ARGS__)
#define RS_TRACE(fmt, ...) RS_LOG_AT(RS_LOG_TRACE, fmt, ##__VA_ARGS__)

/*
 * Prints at most once per call site per process, e.g. "config error, all
 * sockets stay on the kernel". The flag is claimed only when the level is
 * enabled, so raising the level later still lets the message through once.
 * A forked child inherits the flag state of its parent.
 */
#define RS_LOG_ONCE(level, fmt, ...) \
    do { \
        static int rs_log_once_done_; \
        if (RS_LOG_ENABLED(level) && \
            !__atomic_exchange_n(&rs_log_once_done_, 1, __ATOMIC_RELAXED)) \
            rs_log((level), fmt, ##__VA_ARGS__); \
    } while (0)

#endif /* RS_COMMON_LOG_H */
