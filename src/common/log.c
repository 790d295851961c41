/*
 * Logger: level filter, destinations and line assembly. See log.h for the
 * contract; the points that shape this file are
 *  - rs_log must be async-signal-safe and allocation-free, so it formats with
 *    common/format.c into a stack buffer and emits the line with one raw
 *    write/sendto system call;
 *  - rs_log_configure may run while other threads log, so the destination is
 *    published as one atomic word (kind + fd), and descriptors that a logging
 *    thread may still be using are never closed: a new log file is dup3'ed
 *    over the existing file descriptor instead.
 */
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/format.h"

int rs_log_threshold = RS_LOG_DEFAULT_LEVEL;

/* Destination word: kind in the high 32 bits, descriptor in the low 32. */
static uint64_t log_destination = ((uint64_t)RS_LOG_DEST_STDERR << 32) | STDERR_FILENO;

/* Descriptors owned by the logger; -1 until first needed. Written only by
 * rs_log_configure, read by rs_log_owns_fd. */
static int log_file_fd = -1;
static int log_syslog_fd = -1;

#define DEFAULT_SYSLOG_PATH "/dev/log"
static char syslog_path[sizeof(((struct sockaddr_un *)0)->sun_path)] = DEFAULT_SYSLOG_PATH;
/* Address the syslog socket is connected to; kept for reconnecting after the
 * syslog daemon restarts. */
static struct sockaddr_un syslog_addr;

static const char *const level_names[] = {
    [RS_LOG_ERROR] = "ERROR",
    [RS_LOG_WARN] = "WARN",
    [RS_LOG_INFO] = "INFO",
    [RS_LOG_DEBUG] = "DEBUG",
    [RS_LOG_TRACE] = "TRACE",
};

/* syslog severities (RFC 5424) for each level; trace has no own severity. */
static const int level_syslog_severity[] = {
    [RS_LOG_ERROR] = 3,
    [RS_LOG_WARN] = 4,
    [RS_LOG_INFO] = 6,
    [RS_LOG_DEBUG] = 7,
    [RS_LOG_TRACE] = 7,
};
#define SYSLOG_FACILITY_USER (1 << 3)

static uint64_t pack_destination(enum rs_log_dest kind, int fd)
{
    return ((uint64_t)kind << 32) | (uint32_t)fd;
}

const char *rs_log_level_name(enum rs_log_level level)
{
    if (level == RS_LOG_OFF)
        return "OFF";
    if ((int)level < 0 || (size_t)level >= RS_ARRAY_SIZE(level_names))
        return "?";
    return level_names[level];
}

enum rs_log_level rs_log_get_level(void)
{
    return (enum rs_log_level)__atomic_load_n(&rs_log_threshold, __ATOMIC_RELAXED);
}

enum rs_log_dest rs_log_get_dest(void)
{
    return (enum rs_log_dest)(__atomic_load_n(&log_destination, __ATOMIC_ACQUIRE) >> 32);
}

void rs_log_set_syslog_path(const char *path)
{
    if (path == NULL)
        path = DEFAULT_SYSLOG_PATH;
    size_t len = strnlen(path, sizeof(syslog_path) - 1);
    memcpy(syslog_path, path, len);
    syslog_path[len] = '\0';
}

/* ---- raw system calls: bypass rdmasock's own interposed wrappers ---- */

static void raw_write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        long written = syscall(SYS_write, fd, buf, len);
        if (written < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        buf += written;
        len -= (size_t)written;
    }
}

static int raw_connect_syslog(int fd)
{
    return (int)syscall(SYS_connect, fd, (const struct sockaddr *)&syslog_addr,
                        (socklen_t)sizeof(syslog_addr));
}

/* Returns 0 if the datagram went out, -1 if the caller should fall back. */
static int send_syslog(int fd, const char *msg, size_t len)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        long sent = syscall(SYS_sendto, fd, msg, len, MSG_NOSIGNAL, NULL, 0);
        if (sent >= 0)
            return 0;
        if (errno == EINTR) {
            attempt--;
            continue;
        }
        if (errno != ECONNREFUSED && errno != ENOTCONN && errno != ECONNRESET)
            return -1;
        /* syslogd restarted and re-created its socket: reconnect once. */
        if (raw_connect_syslog(fd) != 0)
            return -1;
    }
    return -1;
}

/* ---- emitting ---- */

/*
 * Syslog unreachable: re-emit in the stderr format so the line is still
 * attributable. Kept out of line so its buffer only occupies stack when
 * needed; rs_log may run on a small signal stack.
 */
__attribute__((noinline))
static void write_syslog_fallback(int pid, enum rs_log_level level, const char *message,
                                  size_t message_len)
{
    char fallback[RS_LOG_LINE_MAX];
    size_t fallback_len = (size_t)rs_format(fallback, sizeof(fallback) - 1,
                                            "rdmasock[%d]: %s: %.*s", pid, level_names[level],
                                            (int)message_len, message);
    if (fallback_len > sizeof(fallback) - 2)
        fallback_len = sizeof(fallback) - 2;
    fallback[fallback_len++] = '\n';
    raw_write_all(STDERR_FILENO, fallback, fallback_len);
}

void rs_log(enum rs_log_level level, const char *fmt, ...)
{
    int saved_errno = errno;
    if (!RS_LOG_ENABLED(level) || (int)level < 0 ||
        (size_t)level >= RS_ARRAY_SIZE(level_names)) {
        errno = saved_errno;
        return;
    }

    uint64_t destination = __atomic_load_n(&log_destination, __ATOMIC_ACQUIRE);
    enum rs_log_dest kind = (enum rs_log_dest)(destination >> 32);
    int fd = (int)(uint32_t)destination;
    int pid = (int)getpid();

    char line[RS_LOG_LINE_MAX];
    size_t used;
    if (kind == RS_LOG_DEST_SYSLOG) {
        used = (size_t)rs_format(line, sizeof(line), "<%d>rdmasock[%d]: ",
                                 SYSLOG_FACILITY_USER | level_syslog_severity[level], pid);
    } else if (__atomic_load_n(&rs_log_threshold, __ATOMIC_RELAXED) >= RS_LOG_DEBUG) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        used = (size_t)rs_format(line, sizeof(line), "rdmasock[%d]: %s: [%5lld.%06ld] ",
                                 pid, level_names[level], (long long)now.tv_sec,
                                 now.tv_nsec / 1000);
    } else {
        used = (size_t)rs_format(line, sizeof(line), "rdmasock[%d]: %s: ",
                                 pid, level_names[level]);
    }

    /* The formatter's terminating NUL lands where the newline goes, so a
     * full line uses all RS_LOG_LINE_MAX bytes. */
    size_t prefix_len = used;
    size_t room = sizeof(line) - used;
    va_list ap;
    va_start(ap, fmt);
    size_t message_len = (size_t)rs_vformat_errno(line + used, room, saved_errno, fmt, ap);
    va_end(ap);
    if (message_len >= room)
        message_len = room - 1;
    used += message_len;

    if (kind == RS_LOG_DEST_SYSLOG) {
        if (send_syslog(fd, line, used) == 0) {
            errno = saved_errno;
            return;
        }
        write_syslog_fallback(pid, level, line + prefix_len, message_len);
        errno = saved_errno;
        return;
    }

    line[used++] = '\n';
    raw_write_all(fd, line, used);
    errno = saved_errno;
}

/* ---- configuration ---- */

static bool ascii_equal_nocase(const char *text, size_t len, const char *word)
{
    size_t i = 0;
    for (; i < len && word[i] != '\0'; i++) {
        char c = text[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != word[i])
            return false;
    }
    return i == len && word[i] == '\0';
}

static int parse_level(const char *text, size_t len, enum rs_log_level *level)
{
    static const struct {
        const char *name;
        enum rs_log_level level;
    } names[] = {
        { "off", RS_LOG_OFF },     { "error", RS_LOG_ERROR }, { "warn", RS_LOG_WARN },
        { "warning", RS_LOG_WARN }, { "info", RS_LOG_INFO },  { "debug", RS_LOG_DEBUG },
        { "trace", RS_LOG_TRACE },
    };
    for (size_t i = 0; i < RS_ARRAY_SIZE(names); i++) {
        if (ascii_equal_nocase(text, len, names[i].name)) {
            *level = names[i].level;
            return 0;
        }
    }
    return -1;
}

static int open_syslog_socket(void)
{
    if (log_syslog_fd < 0) {
        int fd = (int)syscall(SYS_socket, AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        __atomic_store_n(&log_syslog_fd, fd, __ATOMIC_RELAXED);
    }
    memset(&syslog_addr, 0, sizeof(syslog_addr));
    syslog_addr.sun_family = AF_UNIX;
    memcpy(syslog_addr.sun_path, syslog_path, sizeof(syslog_path));
    /* Connecting a datagram socket again simply retargets it, so the same
     * descriptor serves every reconfiguration. */
    if (raw_connect_syslog(log_syslog_fd) != 0)
        return -1;
    return log_syslog_fd;
}

static int open_log_file(const char *path, char *err, size_t errlen)
{
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path,
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd < 0) {
        if (errlen > 0)
            rs_format(err, errlen, "cannot open log file \"%s\": %m", path);
        return -1;
    }
    if (log_file_fd < 0) {
        __atomic_store_n(&log_file_fd, fd, __ATOMIC_RELAXED);
        return fd;
    }
    /* Another thread may be writing to log_file_fd right now: replace the
     * file behind that number atomically rather than closing it. */
    int replaced = (int)syscall(SYS_dup3, fd, log_file_fd, O_CLOEXEC);
    int dup_errno = errno;
    syscall(SYS_close, fd);
    if (replaced < 0) {
        if (errlen > 0) {
            errno = dup_errno;
            rs_format(err, errlen, "cannot switch log file to \"%s\": %m", path);
        }
        return -1;
    }
    return log_file_fd;
}

int rs_log_configure(const char *spec, char *err, size_t errlen)
{
    int saved_errno = errno;
    if (errlen > 0)
        err[0] = '\0';

    enum rs_log_level level = RS_LOG_DEFAULT_LEVEL;
    enum rs_log_dest kind = RS_LOG_DEST_STDERR;
    const char *file_path = NULL;

    if (spec != NULL && spec[0] != '\0') {
        const char *comma = strchr(spec, ',');
        size_t level_len = comma ? (size_t)(comma - spec) : strlen(spec);
        if (level_len == 0) {
            if (errlen > 0)
                rs_format(err, errlen, "bad log spec \"%s\": missing level before ',' "
                          "(expected LEVEL[,DEST])", spec);
            errno = saved_errno;
            return -1;
        }
        if (parse_level(spec, level_len, &level) != 0) {
            if (errlen > 0)
                rs_format(err, errlen, "bad log spec \"%s\": unknown level \"%.*s\" "
                          "(expected off, error, warn, info, debug or trace)",
                          spec, (int)level_len, spec);
            errno = saved_errno;
            return -1;
        }
        if (comma != NULL) {
            const char *dest = comma + 1;
            if (strcmp(dest, "stderr") == 0) {
                kind = RS_LOG_DEST_STDERR;
            } else if (strcmp(dest, "syslog") == 0) {
                kind = RS_LOG_DEST_SYSLOG;
            } else if (strncmp(dest, "file:", 5) == 0) {
                kind = RS_LOG_DEST_FILE;
                file_path = dest + 5;
                if (file_path[0] == '\0') {
                    if (errlen > 0)
                        rs_format(err, errlen, "bad log spec \"%s\": destination \"file:\" "
                                  "needs a path (file:PATH)", spec);
                    errno = saved_errno;
                    return -1;
                }
            } else if (dest[0] == '\0') {
                if (errlen > 0)
                    rs_format(err, errlen, "bad log spec \"%s\": empty destination after ',' "
                              "(expected stderr, syslog or file:PATH)", spec);
                errno = saved_errno;
                return -1;
            } else {
                if (errlen > 0)
                    rs_format(err, errlen, "bad log spec \"%s\": unknown destination \"%s\" "
                              "(expected stderr, syslog or file:PATH)", spec, dest);
                errno = saved_errno;
                return -1;
            }
        }
    }

    int fd = STDERR_FILENO;
    if (kind == RS_LOG_DEST_FILE) {
        fd = open_log_file(file_path, err, errlen);
        if (fd < 0) {
            errno = saved_errno;
            return -1;
        }
    } else if (kind == RS_LOG_DEST_SYSLOG) {
        fd = open_syslog_socket();
        if (fd < 0) {
            /* No syslog daemon (typical in containers): documented fallback. */
            kind = RS_LOG_DEST_STDERR;
            fd = STDERR_FILENO;
        }
    }

    __atomic_store_n(&log_destination, pack_destination(kind, fd), __ATOMIC_RELEASE);
    __atomic_store_n(&rs_log_threshold, (int)level, __ATOMIC_RELAXED);
    errno = saved_errno;
    return 0;
}

int rs_log_configure_from_env(void)
{
    char err[256];
    int rc = rs_log_configure(getenv(RS_LOG_ENV), err, sizeof(err));
    if (rc != 0)
        RS_LOG_ONCE(RS_LOG_ERROR, "%s: %s; using defaults (warn,stderr)", RS_LOG_ENV, err);
    return rc;
}

int rs_log_owns_fd(int fd)
{
    return fd >= 0 && (fd == __atomic_load_n(&log_file_fd, __ATOMIC_RELAXED) ||
                       fd == __atomic_load_n(&log_syslog_fd, __ATOMIC_RELAXED));
}
