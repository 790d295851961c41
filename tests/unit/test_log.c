/*
 * Logger and async-signal-safe formatter.
 *
 * This binary replaces malloc/calloc/realloc/free with counting wrappers
 * around glibc's allocator so it can prove that logging allocates nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <locale.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/format.h"
#include "common/log.h"

/* ---- counting allocator ---- */

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void __libc_free(void *ptr);

static int count_allocations;          /* counting switched on */
static unsigned long allocation_count;
static volatile sig_atomic_t inside_malloc;

void *malloc(size_t size)
{
    inside_malloc++;
    if (__atomic_load_n(&count_allocations, __ATOMIC_RELAXED))
        __atomic_fetch_add(&allocation_count, 1, __ATOMIC_RELAXED);
    void *p = __libc_malloc(size);
    inside_malloc--;
    return p;
}

void *calloc(size_t count, size_t size)
{
    inside_malloc++;
    if (__atomic_load_n(&count_allocations, __ATOMIC_RELAXED))
        __atomic_fetch_add(&allocation_count, 1, __ATOMIC_RELAXED);
    void *p = __libc_calloc(count, size);
    inside_malloc--;
    return p;
}

void *realloc(void *ptr, size_t size)
{
    inside_malloc++;
    if (__atomic_load_n(&count_allocations, __ATOMIC_RELAXED))
        __atomic_fetch_add(&allocation_count, 1, __ATOMIC_RELAXED);
    void *p = __libc_realloc(ptr, size);
    inside_malloc--;
    return p;
}

void free(void *ptr)
{
    inside_malloc++;
    __libc_free(ptr);
    inside_malloc--;
}

/* ---- helpers ---- */

static char scratch_dir[64];

static void make_path(char *out, size_t len, const char *leaf)
{
    snprintf(out, len, "%s/%s", scratch_dir, leaf);
}

/* Reads a whole file into a heap buffer (NUL-terminated). */
static char *slurp(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t cap = 4096, len = 0;
    char *data = malloc(cap);
    assert_non_null(data);
    size_t got;
    while ((got = fread(data + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            cap *= 2;
            data = realloc(data, cap);
            assert_non_null(data);
        }
    }
    fclose(f);
    data[len] = '\0';
    if (len_out)
        *len_out = len;
    return data;
}

static size_t count_lines_containing(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static void configure_ok(const char *spec)
{
    char err[256];
    int rc = rs_log_configure(spec, err, sizeof(err));
    if (rc != 0)
        fail_msg("configure(%s) failed: %s", spec ? spec : "NULL", err);
}

static void log_to_fresh_file(const char *leaf, const char *level, char *path, size_t path_len)
{
    make_path(path, path_len, leaf);
    unlink(path);
    char spec[256];
    snprintf(spec, sizeof(spec), "%s,file:%s", level, path);
    configure_ok(spec);
}

static int setup_dir(void **state)
{
    (void)state;
    setlocale(LC_ALL, "C");
    snprintf(scratch_dir, sizeof(scratch_dir), "/tmp/rs_test_log.XXXXXX");
    return mkdtemp(scratch_dir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    rs_log_configure(NULL, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- formatter vs snprintf ---- */

static unsigned formats_compared;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

static void compare_one(const char *fmt, ...)
{
    char ours[512], libc[512];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int ours_len = rs_vformat(ours, sizeof(ours), fmt, ap);
    int libc_len = vsnprintf(libc, sizeof(libc), fmt, ap2);
    va_end(ap2);
    va_end(ap);
    if (ours_len != libc_len || strcmp(ours, libc) != 0)
        fail_msg("format \"%s\": rs_format gave [%s] (%d), snprintf gave [%s] (%d)", fmt, ours,
                 ours_len, libc, libc_len);
    formats_compared++;
}

/* Every flag set x width x precision x length for each integer conversion. */
static void test_format_integers_match_snprintf(void **state)
{
    (void)state;
    static const char *const flag_sets[] = {
        "", "-", "0", "+", " ", "#", "-0", "+0", "- ", "-+", "#0", "-#", "+ ", "0 #",
    };
    static const char *const widths[] = { "", "1", "5", "12", "25" };
    static const char *const precisions[] = { "", ".", ".0", ".1", ".3", ".20" };
    static const long long signed_values[] = {
        0, 1, -1, 7, -42, 255, 256, 32767, -32768, 65536, INT_MAX, INT_MIN,
        LLONG_MAX, LLONG_MIN, 1234567890123LL,
    };
    static const unsigned long long unsigned_values[] = {
        0, 1, 9, 10, 15, 16, 255, 256, 0xdeadbeef, UINT_MAX, 0x100000000ULL, ULLONG_MAX,
    };
    char fmt[64];
    formats_compared = 0;
    for (size_t f = 0; f < sizeof(flag_sets) / sizeof(flag_sets[0]); f++)
        for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++)
            for (size_t p = 0; p < sizeof(precisions) / sizeof(precisions[0]); p++) {
                const char *prefix_fmt = "%%%s%s%s";
                char spec[32];
                snprintf(spec, sizeof(spec), prefix_fmt, flag_sets[f], widths[w], precisions[p]);
                for (size_t v = 0; v < sizeof(signed_values) / sizeof(signed_values[0]); v++) {
                    long long value = signed_values[v];
                    snprintf(fmt, sizeof(fmt), "<%sd>", spec);
                    compare_one(fmt, (int)value);
                    snprintf(fmt, sizeof(fmt), "<%si>", spec);
                    compare_one(fmt, (int)value);
                    snprintf(fmt, sizeof(fmt), "<%shhd>", spec);
                    compare_one(fmt, (int)value);
                    snprintf(fmt, sizeof(fmt), "<%shd>", spec);
                    compare_one(fmt, (int)value);
                    snprintf(fmt, sizeof(fmt), "<%sld>", spec);
                    compare_one(fmt, (long)value);
                    snprintf(fmt, sizeof(fmt), "<%slld>", spec);
                    compare_one(fmt, value);
                    snprintf(fmt, sizeof(fmt), "<%szd>", spec);
                    compare_one(fmt, (ssize_t)value);
                    snprintf(fmt, sizeof(fmt), "<%std>", spec);
                    compare_one(fmt, (ptrdiff_t)value);
                    snprintf(fmt, sizeof(fmt), "<%sjd>", spec);
                    compare_one(fmt, (intmax_t)value);
                }
                for (size_t v = 0; v < sizeof(unsigned_values) / sizeof(unsigned_values[0]); v++) {
                    unsigned long long value = unsigned_values[v];
                    static const char convs[] = "uxX";
                    for (const char *c = convs; *c; c++) {
                        snprintf(fmt, sizeof(fmt), "[%s%c]", spec, *c);
                        compare_one(fmt, (unsigned)value);
                        snprintf(fmt, sizeof(fmt), "[%shh%c]", spec, *c);
                        compare_one(fmt, (unsigned)value);
                        snprintf(fmt, sizeof(fmt), "[%sh%c]", spec, *c);
                        compare_one(fmt, (unsigned)value);
                        snprintf(fmt, sizeof(fmt), "[%sl%c]", spec, *c);
                        compare_one(fmt, (unsigned long)value);
                        snprintf(fmt, sizeof(fmt), "[%sll%c]", spec, *c);
                        compare_one(fmt, value);
                        snprintf(fmt, sizeof(fmt), "[%sz%c]", spec, *c);
                        compare_one(fmt, (size_t)value);
                        snprintf(fmt, sizeof(fmt), "[%st%c]", spec, *c);
                        compare_one(fmt, (ptrdiff_t)value);
                        snprintf(fmt, sizeof(fmt), "[%sj%c]", spec, *c);
                        compare_one(fmt, (uintmax_t)value);
                    }
                }
            }
    /* 14 flag sets x 5 widths x 6 precisions x (15 x 9 + 12 x 24) */
    assert_int_equal(formats_compared, 14 * 5 * 6 * (15 * 9 + 12 * 24));
}

static void test_format_strings_chars_pointers(void **state)
{
    (void)state;
    static const char *const specs[] = {
        "%s", "%10s", "%-10s", "%.2s", "%.0s", "%10.3s", "%-10.3s", "%05s", "%.*s", "%*s", "%-*s",
    };
    static const char *const strings[] = { "", "a", "hello", "hello, world of rdma", NULL };
    char fmt[64];
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
        for (size_t v = 0; v < sizeof(strings) / sizeof(strings[0]); v++) {
            snprintf(fmt, sizeof(fmt), "|%s|", specs[s]);
            if (strchr(specs[s], '*')) {
                compare_one(fmt, 7, strings[v]);
                compare_one(fmt, -7, strings[v]);
                compare_one(fmt, 0, strings[v]);
            } else {
                compare_one(fmt, strings[v]);
            }
        }
    }
    static const char *const char_specs[] = { "%c", "%3c", "%-3c", "%03c" };
    for (size_t s = 0; s < sizeof(char_specs) / sizeof(char_specs[0]); s++) {
        snprintf(fmt, sizeof(fmt), "<%s>", char_specs[s]);
        compare_one(fmt, 'x');
        compare_one(fmt, '%');
        compare_one(fmt, 0x1ff); /* converted to unsigned char */
    }
    static const char *const ptr_specs[] = {
        "%p", "%20p", "%-20p", "%020p", "%.12p", "%+p", "% p", "%5p",
    };
    void *pointers[] = { NULL, (void *)0x1, (void *)0x7fffdeadbeef, (void *)UINTPTR_MAX, &fmt };
    for (size_t s = 0; s < sizeof(ptr_specs) / sizeof(ptr_specs[0]); s++) {
        for (size_t v = 0; v < sizeof(pointers) / sizeof(pointers[0]); v++) {
            if (pointers[v] == NULL && strchr(ptr_specs[s], '.'))
                continue; /* glibc 2.36 ignores precision for (nil); both agree below */
            snprintf(fmt, sizeof(fmt), "<%s>", ptr_specs[s]);
            compare_one(fmt, pointers[v]);
        }
    }
    compare_one("%%|%5%|%-5%|100%%");
    compare_one("no conversions at all");
    compare_one("%s=%d %s=%u %s=%#x %c%c", "a", -1, "b", 2u, "c", 255u, 'o', 'k');
    /* Star width and precision, including negative and huge. */
    compare_one("[%*d]", 6, 42);
    compare_one("[%*d]", -6, 42);
    compare_one("[%.*d]", 4, 42);
    compare_one("[%.*d]", -4, 42);
    compare_one("[%*.*x]", 10, 6, 0xabcu);
    compare_one("[%-*.*x]", 10, 6, 0xabcu);
}

static void test_format_errno_text(void **state)
{
    (void)state;
    static const int errnos[] = { 0, EPERM, ENOENT, EAGAIN, ECONNREFUSED, ETIMEDOUT, EHWPOISON,
                                  200, 4095, 99999, -1, -12345, INT_MAX, INT_MIN + 1 };
    for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++) {
        errno = errnos[i];
        compare_one("[%m]");
        errno = errnos[i];
        compare_one("[%30m] [%-30.7m]");
    }
    /* rs_format must leave errno as it found it. */
    errno = EXDEV;
    char buf[64];
    rs_format(buf, sizeof(buf), "%m %d", 5);
    assert_int_equal(errno, EXDEV);
    assert_string_equal(buf, "Invalid cross-device link 5");
    /* The errno-taking variant prints what it is given, not errno. */
    char scratch[32];
    assert_string_equal(rs_errno_text(123456, scratch, sizeof(scratch)), "Unknown error 123456");
    assert_string_equal(rs_errno_text(ENOENT, scratch, sizeof(scratch)),
                        "No such file or directory");
}

static void test_format_unsupported_is_verbatim(void **state)
{
    (void)state;
    char buf[64];
    const char *fmt = "a%fb%5.2oc%nd";
    int len = rs_format(buf, sizeof(buf), fmt, 1);
    assert_string_equal(buf, "a%fb%5.2oc%nd");
    assert_int_equal(len, 13);
    const char *dangling = "tail%-5";
    rs_format(buf, sizeof(buf), dangling, 1);
    assert_string_equal(buf, "tail%-5");
}

#pragma GCC diagnostic pop

static void test_format_truncation(void **state)
{
    (void)state;
    char buf[16];
    memset(buf, 'Z', sizeof(buf));
    assert_int_equal(rs_format(buf, 0, "%s", "abcdef"), 6);
    assert_int_equal(buf[0], 'Z'); /* size 0 writes nothing */

    assert_int_equal(rs_format(buf, 1, "%s", "abcdef"), 6);
    assert_string_equal(buf, "");
    assert_int_equal(rs_format(buf, 2, "%s", "abcdef"), 6);
    assert_string_equal(buf, ".");
    assert_int_equal(rs_format(buf, 4, "%s", "abcdef"), 6);
    assert_string_equal(buf, "...");
    assert_int_equal(rs_format(buf, 6, "%s", "abcdef"), 6);
    assert_string_equal(buf, "ab...");
    assert_int_equal(rs_format(buf, 7, "%s", "abcdef"), 6);
    assert_string_equal(buf, "abcdef"); /* exact fit: no marker */
    assert_int_equal(rs_format(buf, 10, "%d-%d-%d", 1000, 2000, 3000), 14);
    assert_string_equal(buf, "1000-2...");
    /* Huge width: the return value reports it, the buffer stays bounded. */
    assert_int_equal(rs_format(buf, sizeof(buf), "%*d", 100000, 1), 100000);
    assert_int_equal(strlen(buf), sizeof(buf) - 1);
    assert_string_equal(buf + sizeof(buf) - 4, "...");
}

/* ---- logger ---- */

static void test_default_config(void **state)
{
    (void)state;
    configure_ok(NULL);
    assert_int_equal(rs_log_get_level(), RS_LOG_WARN);
    assert_int_equal(rs_log_get_dest(), RS_LOG_DEST_STDERR);
    configure_ok("DEBUG");
    assert_int_equal(rs_log_get_level(), RS_LOG_DEBUG);
    configure_ok("");
    assert_int_equal(rs_log_get_level(), RS_LOG_WARN);
    configure_ok("trace,stderr");
    assert_int_equal(rs_log_get_level(), RS_LOG_TRACE);
    configure_ok("off");
    assert_false(RS_LOG_ENABLED(RS_LOG_ERROR));
    configure_ok("warning");
    assert_int_equal(rs_log_get_level(), RS_LOG_WARN);
}

static void test_levels_filter(void **state)
{
    (void)state;
    char path[128];
    log_to_fresh_file("levels.log", "info", path, sizeof(path));
    static int evaluated;
    evaluated = 0;
    RS_TRACE("trace %d", ++evaluated);
    RS_DEBUG("debug %d", ++evaluated);
    RS_INFO("info %d", 1);
    RS_WARN("warn %d", 2);
    RS_ERROR("error %d", 3);
    rs_log(RS_LOG_DEBUG, "direct debug call");
    /* Disabled levels must not even evaluate their arguments. */
    assert_int_equal(evaluated, 0);

    char *text = slurp(path, NULL);
    char expected[256];
    snprintf(expected, sizeof(expected),
             "rdmasock[%d]: INFO: info 1\nrdmasock[%d]: WARN: warn 2\nrdmasock[%d]: ERROR: error 3\n",
             (int)getpid(), (int)getpid(), (int)getpid());
    assert_string_equal(text, expected);
    free(text);

    /* At debug every line carries a monotonic timestamp. */
    log_to_fresh_file("debug.log", "debug", path, sizeof(path));
    struct timespec before;
    clock_gettime(CLOCK_MONOTONIC, &before);
    RS_DEBUG("with time");
    RS_WARN("warn with time");
    RS_TRACE("not shown");
    text = slurp(path, NULL);
    int pid = 0;
    long long seconds = 0;
    long micros = 0;
    char level[8], message[64];
    int fields = sscanf(text, "rdmasock[%d]: %7[A-Z]: [%lld.%6ld] %63[^\n]", &pid, level,
                        &seconds, &micros, message);
    assert_int_equal(fields, 5);
    assert_int_equal(pid, getpid());
    assert_string_equal(level, "DEBUG");
    assert_string_equal(message, "with time");
    assert_true(seconds == before.tv_sec || seconds == before.tv_sec + 1);
    assert_int_equal(count_lines_containing(text, "\n"), 2);
    assert_non_null(strstr(text, ": WARN: ["));
    assert_null(strstr(text, "not shown"));
    free(text);
}

static void log_once_site(void)
{
    RS_LOG_ONCE(RS_LOG_WARN, "config error, all sockets stay on the kernel (%d)", 7);
}

static void *once_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        log_once_site();
    return NULL;
}

static void test_log_once(void **state)
{
    (void)state;
    char path[128];
    log_to_fresh_file("once.log", "warn", path, sizeof(path));
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, once_thread, NULL), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    log_once_site();
    /* A different call site has its own flag. */
    RS_LOG_ONCE(RS_LOG_WARN, "second site");
    RS_LOG_ONCE(RS_LOG_WARN, "third site");
    char *text = slurp(path, NULL);
    assert_int_equal(count_lines_containing(text, "config error, all sockets stay on the kernel (7)\n"), 1);
    assert_int_equal(count_lines_containing(text, "second site\n"), 1);
    assert_int_equal(count_lines_containing(text, "\n"), 3);
    free(text);
}

static void test_file_destination(void **state)
{
    (void)state;
    char path[128];
    make_path(path, sizeof(path), "append.log");
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "existing line\n", 14), 14);
    close(fd);
    char spec[256];
    snprintf(spec, sizeof(spec), "info,file:%s", path);
    configure_ok(spec);
    assert_int_equal(rs_log_get_dest(), RS_LOG_DEST_FILE);
    RS_INFO("appended %s", "ok");
    char *text = slurp(path, NULL);
    assert_true(strncmp(text, "existing line\nrdmasock[", 23) == 0);
    assert_non_null(strstr(text, ": INFO: appended ok\n"));
    free(text);

    /* A new file is created 0600 regardless of a permissive umask. */
    make_path(path, sizeof(path), "new.log");
    unlink(path);
    mode_t old_umask = umask(0);
    snprintf(spec, sizeof(spec), "info,file:%s", path);
    configure_ok(spec);
    umask(old_umask);
    RS_INFO("x");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    /* The descriptor is close-on-exec and owned by the logger. */
    int owned = 0;
    for (int candidate = 3; candidate < 1024; candidate++) {
        if (rs_log_owns_fd(candidate)) {
            owned++;
            assert_true(fcntl(candidate, F_GETFD) & FD_CLOEXEC);
        }
    }
    assert_true(owned >= 1);
    assert_false(rs_log_owns_fd(STDERR_FILENO));
}

static void test_bad_specs_keep_previous_config(void **state)
{
    (void)state;
    char path[128];
    log_to_fresh_file("keep.log", "info", path, sizeof(path));

    static const struct {
        const char *spec;
        const char *expected_text;
    } bad[] = {
        { "loud", "unknown level \"loud\"" },
        { "debug,file:", "destination \"file:\" needs a path" },
        { "debug,ftp:x", "unknown destination \"ftp:x\"" },
        { ",stderr", "missing level" },
        { "debug,", "empty destination" },
        { "info,file:/nonexistent-dir/x.log", "cannot open log file \"/nonexistent-dir/x.log\": "
                                              "No such file or directory" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "untouched";
        errno = 1234;
        assert_int_equal(rs_log_configure(bad[i].spec, err, sizeof(err)), -1);
        assert_int_equal(errno, 1234);
        if (strstr(err, bad[i].expected_text) == NULL)
            fail_msg("spec \"%s\": message \"%s\" lacks \"%s\"", bad[i].spec, err,
                     bad[i].expected_text);
        assert_int_equal(rs_log_get_level(), RS_LOG_INFO);
        assert_int_equal(rs_log_get_dest(), RS_LOG_DEST_FILE);
    }
    RS_INFO("still here");
    char *text = slurp(path, NULL);
    assert_non_null(strstr(text, ": INFO: still here\n"));
    free(text);

    /* A tiny error buffer is truncated, terminated, and not overrun. */
    char small[8] = "xxxxxxx";
    assert_int_equal(rs_log_configure("loud", small, 6), -1);
    assert_int_equal(strlen(small), 5);
    assert_string_equal(small + 2, "...");
    assert_int_equal(small[6], 'x');
}

/* Redirects fd 2 into a file for the duration of a test step. */
struct stderr_capture {
    int saved_fd;
    char path[128];
};

static void capture_stderr_begin(struct stderr_capture *cap, const char *leaf)
{
    make_path(cap->path, sizeof(cap->path), leaf);
    int fd = open(cap->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    fflush(stderr);
    cap->saved_fd = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
}

static char *capture_stderr_end(struct stderr_capture *cap)
{
    fflush(stderr);
    dup2(cap->saved_fd, STDERR_FILENO);
    close(cap->saved_fd);
    return slurp(cap->path, NULL);
}

static void test_stderr_and_errno(void **state)
{
    (void)state;
    struct stderr_capture cap;
    capture_stderr_begin(&cap, "stderr.txt");
    configure_ok("warn");
    errno = ECONNREFUSED;
    RS_WARN("connect failed: %m (fd %d)", 5);
    int after = errno;
    char *text = capture_stderr_end(&cap);
    assert_int_equal(after, ECONNREFUSED);
    char expected[128];
    snprintf(expected, sizeof(expected), "rdmasock[%d]: WARN: connect failed: Connection refused (fd 5)\n",
             (int)getpid());
    assert_string_equal(text, expected);
    free(text);
}

static void test_long_line_truncated(void **state)
{
    (void)state;
    char path[128];
    log_to_fresh_file("long.log", "info", path, sizeof(path));
    char *big = malloc(5000);
    assert_non_null(big);
    memset(big, 'q', 4999);
    big[4999] = '\0';
    RS_INFO("%s", big);
    RS_INFO("short");
    free(big);
    size_t len;
    char *text = slurp(path, &len);
    char *newline = strchr(text, '\n');
    assert_non_null(newline);
    assert_int_equal((size_t)(newline - text) + 1, RS_LOG_LINE_MAX);
    assert_memory_equal(newline - 3, "...", 3);
    assert_non_null(strstr(newline + 1, ": INFO: short\n"));
    free(text);
}

static void test_syslog_destination(void **state)
{
    (void)state;
    char sock_path[128];
    make_path(sock_path, sizeof(sock_path), "fake-dev-log");
    unlink(sock_path);
    int receiver = socket(AF_UNIX, SOCK_DGRAM, 0);
    assert_true(receiver >= 0);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    assert_true(strlen(sock_path) < sizeof(addr.sun_path));
    memcpy(addr.sun_path, sock_path, strlen(sock_path) + 1);
    assert_int_equal(bind(receiver, (struct sockaddr *)&addr, sizeof(addr)), 0);

    rs_log_set_syslog_path(sock_path);
    configure_ok("info,syslog");
    assert_int_equal(rs_log_get_dest(), RS_LOG_DEST_SYSLOG);
    errno = ENOENT;
    RS_WARN("disk %s: %m", "sda");
    RS_INFO("info line %d", 3);
    RS_DEBUG("filtered");

    char msg[512];
    char expected[256];
    ssize_t got = recv(receiver, msg, sizeof(msg) - 1, MSG_DONTWAIT);
    assert_true(got > 0);
    msg[got] = '\0';
    /* <PRI> = facility user (8) + severity warning (4) */
    snprintf(expected, sizeof(expected), "<12>rdmasock[%d]: disk sda: No such file or directory",
             (int)getpid());
    assert_string_equal(msg, expected);
    got = recv(receiver, msg, sizeof(msg) - 1, MSG_DONTWAIT);
    assert_true(got > 0);
    msg[got] = '\0';
    snprintf(expected, sizeof(expected), "<14>rdmasock[%d]: info line 3", (int)getpid());
    assert_string_equal(msg, expected);
    assert_true(recv(receiver, msg, sizeof(msg), MSG_DONTWAIT) < 0);

    /* The daemon goes away: lines fall back to stderr in the usual format. */
    close(receiver);
    unlink(sock_path);
    struct stderr_capture cap;
    capture_stderr_begin(&cap, "syslog-fallback.txt");
    RS_ERROR("after syslogd died");
    char *text = capture_stderr_end(&cap);
    snprintf(expected, sizeof(expected), "rdmasock[%d]: ERROR: after syslogd died\n", (int)getpid());
    assert_string_equal(text, expected);
    free(text);

    /* No syslog socket at all when configuring: stderr, as documented. */
    configure_ok("info,syslog");
    assert_int_equal(rs_log_get_dest(), RS_LOG_DEST_STDERR);
    rs_log_set_syslog_path(NULL);
}

/* Several threads and a second process append to one file: every line
 * must come out whole. */
static void *line_writer(void *arg)
{
    long id = (long)arg;
    for (int i = 0; i < 2000; i++)
        RS_INFO("writer %ld line %04d %s", id, i, "payload-payload-payload-payload-payload");
    return NULL;
}

static void test_lines_never_interleave(void **state)
{
    (void)state;
    char path[128];
    log_to_fresh_file("parallel.log", "info", path, sizeof(path));
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        line_writer((void *)9L);
        _exit(0);
    }
    pthread_t threads[3];
    for (long i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, line_writer, (void *)i), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(threads[i], NULL);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    char *text = slurp(path, NULL);
    unsigned per_writer[10] = { 0 };
    unsigned lines = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        int pid, number;
        long id;
        char tail[64];
        int n = sscanf(line, "rdmasock[%d]: INFO: writer %ld line %d %63s", &pid, &id, &number, tail);
        if (n != 4 || strcmp(tail, "payload-payload-payload-payload-payload") != 0 || id < 0 || id > 9)
            fail_msg("mangled line %u: \"%s\"", lines, line);
        per_writer[id]++;
        lines++;
    }
    assert_int_equal(lines, 4 * 2000);
    assert_int_equal(per_writer[0], 2000);
    assert_int_equal(per_writer[9], 2000);
    free(text);
}

/* ---- signal safety ---- */

static volatile sig_atomic_t signals_handled;
static volatile sig_atomic_t signals_inside_malloc;

static void logging_handler(int signo)
{
    if (inside_malloc)
        signals_inside_malloc++;
    errno = 77777;
    RS_INFO("signal %d in handler: %s %5d %-4u %#x %p %m", signo, "text", -3, 4u, 255u,
            (void *)&signals_handled);
    signals_handled++;
}

struct kicker_arg {
    pthread_t target;
    volatile int stop;
};

static void *signal_kicker(void *arg)
{
    struct kicker_arg *kicker = arg;
    while (!kicker->stop) {
        pthread_kill(kicker->target, SIGUSR1);
        usleep(50);
    }
    return NULL;
}

/* Runs in a child so a deadlock shows up as a timeout, not a hung suite. */
static int signal_during_malloc_child(const char *log_path)
{
    char spec[256];
    snprintf(spec, sizeof(spec), "info,file:%s", log_path);
    if (rs_log_configure(spec, NULL, 0) != 0)
        return 10;
    struct sigaction sa = { .sa_handler = logging_handler };
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);

    struct kicker_arg kicker = { .target = pthread_self() };
    pthread_t thread;
    if (pthread_create(&thread, NULL, signal_kicker, &kicker) != 0)
        return 11;
    void *held[64] = { 0 };
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned long rounds = 0;
    /* Sizes above the tcache limit and below the mmap threshold make glibc
     * take its arena lock, the lock a non-signal-safe logger would need. */
    do {
        for (int i = 0; i < 64; i++) {
            free(held[i]);
            held[i] = malloc(2048 + (size_t)((rounds * 7919 + (unsigned long)i * 104729) % 60000));
        }
        rounds++;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) < 2 || signals_handled < 2000);
    kicker.stop = 1;
    pthread_join(thread, NULL);
    for (int i = 0; i < 64; i++)
        free(held[i]);
    if (signals_inside_malloc == 0)
        return 12; /* the test did not exercise what it claims */
    return 0;
}

static void test_signal_handler_during_malloc(void **state)
{
    (void)state;
    char path[128];
    make_path(path, sizeof(path), "signal.log");
    unlink(path);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(signal_during_malloc_child(path));

    int status = 0;
    pid_t done = 0;
    for (int waited_ms = 0; waited_ms < 60000 && done == 0; waited_ms += 10) {
        done = waitpid(child, &status, WNOHANG);
        if (done == 0)
            usleep(10000);
    }
    if (done == 0) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        fail_msg("logging from a signal handler during malloc deadlocked");
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    char *text = slurp(path, NULL);
    size_t lines = count_lines_containing(text, "in handler: text    -3 4    0xff 0x");
    assert_true(lines >= 2000);
    assert_true(count_lines_containing(text, "Unknown error 77777\n") == lines);
    free(text);
}

/* volatile so the compiler cannot elide the probe malloc/free pair */
static void *volatile allocation_probe;

static void test_no_allocation_while_logging(void **state)
{
    (void)state;
    char path[128];
    log_to_fresh_file("noalloc.log", "trace", path, sizeof(path));

    /* The counter must see allocations, or a zero below proves nothing. */
    __atomic_store_n(&allocation_count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&count_allocations, 1, __ATOMIC_RELAXED);
    allocation_probe = malloc(100);
    __atomic_store_n(&count_allocations, 0, __ATOMIC_RELAXED);
    free(allocation_probe);
    assert_int_equal(allocation_count, 1);

    char long_text[2000];
    memset(long_text, 'L', sizeof(long_text) - 1);
    long_text[sizeof(long_text) - 1] = '\0';
    __atomic_store_n(&allocation_count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&count_allocations, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 1000; i++) {
        errno = i % 2 ? 99999 + i : ENOMEM;
        rs_log((enum rs_log_level)(i % 5),
               "%s %c %d %i %u %x %X %p %% %m |%hhd %hd %ld %lld %zd %td %jd|%hhu %hu %lu %llu "
               "%zu %tu %ju|%-8s|%08d|%+d|% d|%#x|%*d|%.*s|%5.2s|%.*d|%s", "str", 'c', -i, i, (unsigned)i,
               (unsigned)i, (unsigned)i, (void *)&i, (signed char)i, (short)i, (long)i,
               (long long)i, (ssize_t)i, (ptrdiff_t)i, (intmax_t)i, (unsigned char)i,
               (unsigned short)i, (unsigned long)i, (unsigned long long)i, (size_t)i, (size_t)i,
               (uintmax_t)i, "left", i, i, i, (unsigned)i, 6, i, 3, "precision", "ab",
               /* big precision: printf implementations often allocate for it */
               i % 100 == 0 ? 3000 : 1, i, i % 10 == 0 ? long_text : "");
    }
    __atomic_store_n(&count_allocations, 0, __ATOMIC_RELAXED);
    assert_int_equal(allocation_count, 0);

    char *text = slurp(path, NULL);
    assert_int_equal(count_lines_containing(text, "\n"), 1000);
    assert_int_equal(count_lines_containing(text, "Cannot allocate memory"), 500);
    assert_non_null(strstr(text, "Unknown error 100000"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_integers_match_snprintf),
        cmocka_unit_test(test_format_strings_chars_pointers),
        cmocka_unit_test(test_format_errno_text),
        cmocka_unit_test(test_format_unsupported_is_verbatim),
        cmocka_unit_test(test_format_truncation),
        cmocka_unit_test(test_default_config),
        cmocka_unit_test(test_levels_filter),
        cmocka_unit_test(test_log_once),
        cmocka_unit_test(test_file_destination),
        cmocka_unit_test(test_bad_specs_keep_previous_config),
        cmocka_unit_test(test_stderr_and_errno),
        cmocka_unit_test(test_long_line_truncated),
        cmocka_unit_test(test_syslog_destination),
        cmocka_unit_test(test_lines_never_interleave),
        cmocka_unit_test(test_signal_handler_during_malloc),
        cmocka_unit_test(test_no_allocation_while_logging),
    };
    return cmocka_run_group_tests_name("log", tests, setup_dir, teardown_dir);
}
