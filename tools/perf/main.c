/*
 * rdmasock-perf: latency and bandwidth of the rnic.h providers (soft RNIC, verbs) over RC and UD, with plain
 * kernel TCP and UDP measured in the same run. See docs/perf.md and `rdmasock-perf --help`.
 *
 * main.c: options, the three ways to run (--loopback forks its own server; --server; --client HOST), and the
 * client's driver: set up every endpoint group once, then for each mode and size run every selected test back to
 * back (so the RNIC and kernel numbers of one size are measured within a second of each other), calibrating the
 * iteration count of each point to --seconds.
 */
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "perf.h"
#include "sys.h"

#define CALIBRATION_MIN_S 0.04      /* a calibration run this long gives a usable time per iteration */

static void usage(FILE *out)
{
    fputs("usage: rdmasock-perf [--loopback | --server | --client HOST] [OPTIONS]\n"
          "  --loopback          fork a server on 127.0.0.1 and measure against it (default)\n"
          "  --server            wait for clients on --bind ADDR (default: any) and --port\n"
          "  --client HOST       measure against a server on HOST\n"
          "  --port N            control port (default 18515; --loopback: any free port)\n"
          "  --bind ADDR         server: address to listen on\n"
          "  --kind soft|verbs   RNIC provider (default soft)\n"
          "  --tests LIST        ud:send,ud:wrecord,ud:read,rc:send,rc:write,rc:read,tcp,udp (default: all)\n"
          "  --modes LIST        lat,bw (default: both)\n"
          "  --sizes LIST        message sizes, suffixes K and M (default: 1,2,4,...,1M)\n"
          "  --iters N           iterations per point (default: time-based, see --seconds)\n"
          "  --seconds S         time per point, the iteration count calibrated to it (default 0.5)\n"
          "  --warmup N          iterations run and discarded before each point (default: the calibration runs)\n"
          "  --window N          bw: requests in flight (default 128; READs: at most the ORD)\n"
          "  --poll              busy-poll CQs and sockets (default: block on the CQ fd / in the socket call)\n"
          "  --cpus A[,B]        pin the client (and its RNIC thread) to CPU A, the server to B (default: A)\n"
          "  --csv FILE          write the CSV there (default: stdout)\n"
          "  --quiet             no progress lines on stderr\n", out);
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 1)
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= 1024, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0' || v > (double)(1u << 30))
        return -1;
    *out = (size_t)v;
    return 0;
}

/* Splits a comma list in place, calling fn for each item; -1 on the first item fn refuses. */
static int for_each_item(char *list, int (*fn)(const char *item, struct perf_opts *o), struct perf_opts *o)
{
    char *save = NULL;
    for (char *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save))
        if (fn(item, o) != 0) {
            fprintf(stderr, "rdmasock-perf: '%s' not understood\n", item);
            return -1;
        }
    return 0;
}

static int add_size(const char *item, struct perf_opts *o)
{
    if (o->size_count == PERF_MAX_SIZES)
        return -1;
    return parse_size(item, &o->sizes[o->size_count++]);
}

static int add_test(const char *item, struct perf_opts *o)
{
    for (size_t i = 0; i < perf_case_count; i++) {
        if (strcmp(item, "all") == 0 || strcmp(item, perf_cases[i].name) == 0 ||
            (strcmp(item, "ud") == 0 && perf_cases[i].transport == PERF_UD) ||
            (strcmp(item, "rc") == 0 && perf_cases[i].transport == PERF_RC)) {
            o->case_on[i] = true;
            if (strcmp(item, "all") && strcmp(item, "ud") && strcmp(item, "rc"))
                return 0;
        }
    }
    return strcmp(item, "all") == 0 || strcmp(item, "ud") == 0 || strcmp(item, "rc") == 0 ? 0 : -1;
}

static int add_mode(const char *item, struct perf_opts *o)
{
    if (strcmp(item, "lat") == 0)
        o->mode_on[PERF_LAT] = true;
    else if (strcmp(item, "bw") == 0)
        o->mode_on[PERF_BW] = true;
    else
        return -1;
    return 0;
}

enum { OPT_LOOPBACK = 256, OPT_SERVER, OPT_CLIENT, OPT_PORT, OPT_BIND, OPT_KIND, OPT_TESTS, OPT_MODES, OPT_SIZES,
       OPT_ITERS, OPT_SECONDS, OPT_WARMUP, OPT_WINDOW, OPT_POLL, OPT_CPUS, OPT_CSV, OPT_QUIET, OPT_HELP };

static int parse_options(int argc, char **argv, struct perf_opts *o)
{
    static const struct option longs[] = {
        { "loopback", no_argument, NULL, OPT_LOOPBACK }, { "server", no_argument, NULL, OPT_SERVER },
        { "client", required_argument, NULL, OPT_CLIENT }, { "port", required_argument, NULL, OPT_PORT },
        { "bind", required_argument, NULL, OPT_BIND }, { "kind", required_argument, NULL, OPT_KIND },
        { "tests", required_argument, NULL, OPT_TESTS }, { "modes", required_argument, NULL, OPT_MODES },
        { "sizes", required_argument, NULL, OPT_SIZES }, { "iters", required_argument, NULL, OPT_ITERS },
        { "seconds", required_argument, NULL, OPT_SECONDS }, { "warmup", required_argument, NULL, OPT_WARMUP },
        { "window", required_argument, NULL, OPT_WINDOW }, { "poll", no_argument, NULL, OPT_POLL },
        { "cpus", required_argument, NULL, OPT_CPUS },
        { "csv", required_argument, NULL, OPT_CSV }, { "quiet", no_argument, NULL, OPT_QUIET },
        { "help", no_argument, NULL, OPT_HELP }, { NULL, 0, NULL, 0 },
    };
    memset(o, 0, sizeof(*o));
    o->role = PERF_ROLE_LOOPBACK;
    o->kind = RS_RNIC_KIND_SOFT;
    o->seconds = 0.5;
    o->warmup = -1;
    o->window = PERF_DEFAULT_WINDOW;
    o->cpu_client = o->cpu_server = -1;
    bool port_given = false, tests_given = false, modes_given = false;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case OPT_LOOPBACK:
            o->role = PERF_ROLE_LOOPBACK;
            break;
        case OPT_SERVER:
            o->role = PERF_ROLE_SERVER;
            break;
        case OPT_CLIENT:
            o->role = PERF_ROLE_CLIENT;
            o->host = optarg;
            break;
        case OPT_PORT: {
            unsigned long p = strtoul(optarg, &end, 10);
            if (*end || p > 65535)
                goto bad;
            o->port = (uint16_t)p;
            port_given = true;
            break;
        }
        case OPT_BIND:
            o->bind = optarg;
            break;
        case OPT_KIND:
            if (strcmp(optarg, "soft") == 0)
                o->kind = RS_RNIC_KIND_SOFT;
            else if (strcmp(optarg, "verbs") == 0)
                o->kind = RS_RNIC_KIND_VERBS;
            else
                goto bad;
            break;
        case OPT_TESTS:
            tests_given = true;
            if (for_each_item(optarg, add_test, o))
                return -1;
            break;
        case OPT_MODES:
            modes_given = true;
            if (for_each_item(optarg, add_mode, o))
                return -1;
            break;
        case OPT_SIZES:
            o->size_count = 0;
            if (for_each_item(optarg, add_size, o))
                return -1;
            break;
        case OPT_ITERS:
            o->iters = strtoull(optarg, &end, 10);
            if (*end || o->iters == 0)
                goto bad;
            break;
        case OPT_SECONDS:
            o->seconds = strtod(optarg, &end);
            if (*end || !(o->seconds > 0))
                goto bad;
            break;
        case OPT_WARMUP:
            o->warmup = strtoll(optarg, &end, 10);
            if (*end || o->warmup < 0)
                goto bad;
            break;
        case OPT_WINDOW: {
            unsigned long w = strtoul(optarg, &end, 10);
            if (*end || w == 0 || w > 4096)
                goto bad;
            o->window = (uint32_t)w;
            break;
        }
        case OPT_POLL:
            o->poll = true;
            break;
        case OPT_CPUS: {
            long a = strtol(optarg, &end, 10), b = a;
            if (end == optarg || a < 0 || a >= CPU_SETSIZE)
                goto bad;
            if (*end == ',') {
                const char *second = end + 1;
                b = strtol(second, &end, 10);
                if (end == second || b < 0 || b >= CPU_SETSIZE)
                    goto bad;
            }
            if (*end)
                goto bad;
            o->cpu_client = (int)a;
            o->cpu_server = (int)b;
            break;
        }
        case OPT_CSV:
            o->csv_path = optarg;
            break;
        case OPT_QUIET:
            o->quiet = true;
            break;
        case OPT_HELP:
        case 'h':
            usage(stdout);
            exit(0);
        default:
            return -1;
        }
        continue;
bad:
        fprintf(stderr, "rdmasock-perf: bad value '%s'\n", optarg);
        return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "rdmasock-perf: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!port_given && o->role != PERF_ROLE_LOOPBACK)
        o->port = PERF_DEFAULT_PORT;
    if (!tests_given)
        for (size_t i = 0; i < perf_case_count; i++)
            o->case_on[i] = true;
    if (!modes_given)
        o->mode_on[PERF_LAT] = o->mode_on[PERF_BW] = true;
    if (o->size_count == 0)
        for (size_t s = 1; s <= (1u << 20); s *= 2)
            o->sizes[o->size_count++] = s;
    return 0;
}

/* ---- the client's driver ---- */

struct client {
    const struct perf_opts *o;
    FILE *csv;
    int fd;
    struct sockaddr_storage local, server;
    struct perf_rdma *rdma;
    struct perf_kernel *kernel;
    bool group_up[PERF_GROUP_COUNT];
    const char *provider;
};

static bool group_wanted(const struct perf_opts *o, enum perf_group g)
{
    for (size_t i = 0; i < perf_case_count; i++)
        if (o->case_on[i] && perf_case_group(&perf_cases[i]) == g)
            return true;
    return false;
}

static size_t largest_size(const struct perf_opts *o)
{
    size_t m = 64;
    for (size_t i = 0; i < o->size_count; i++)
        if (o->sizes[i] > m)
            m = o->sizes[i];
    return m;
}

static int hello(struct client *cl)
{
    bool rdma = group_wanted(cl->o, PERF_GROUP_UD) || group_wanted(cl->o, PERF_GROUP_RC);
    struct perf_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PERF_MSG_HELLO;
    m.kind = (uint64_t)cl->o->kind;
    m.flags = (cl->o->poll ? PERF_FLAG_POLL : 0) | (rdma ? PERF_FLAG_RDMA : 0);
    int rc = perf_msg_send(cl->fd, &m);
    if (rc == 0)
        rc = perf_msg_expect(cl->fd, PERF_MSG_HELLO, &m);
    if (rc) {
        perf_log("the server could not open its %s RNIC: %s", cl->provider, strerror(-rc));
        return rc;
    }
    rc = perf_kernel_open(cl->o->poll, &cl->kernel);
    if (rc == 0 && rdma) {
        rc = perf_rdma_open(cl->o->kind, &cl->local, cl->o->poll, &cl->rdma);
        if (rc)
            perf_log("cannot open a %s RNIC for the local address: %s", cl->provider, strerror(-rc));
    }
    return rc;
}

static int setup_group(struct client *cl, enum perf_group g)
{
    size_t len = largest_size(cl->o);
    struct perf_msg m, reply, mine;
    memset(&m, 0, sizeof(m));
    memset(&mine, 0, sizeof(mine));
    m.type = PERF_MSG_SETUP;
    m.group = g;
    m.len = len;
    int rc = perf_msg_send(cl->fd, &m);
    if (rc == 0)
        rc = perf_msg_expect(cl->fd, PERF_MSG_SETUP, &reply);
    if (rc)
        return rc;
    bool rdma = g == PERF_GROUP_UD || g == PERF_GROUP_RC;
    rc = rdma ? perf_rdma_client_setup(cl->rdma, g, &cl->local, &cl->server, &reply, len, &mine)
              : perf_kernel_client_setup(cl->kernel, g, &cl->local, &cl->server, &reply, len, &mine);
    if (rc)
        return rc;
    mine.type = PERF_MSG_PEER;
    mine.group = g;
    rc = perf_msg_send(cl->fd, &mine);
    if (rc == 0)
        rc = perf_msg_expect(cl->fd, PERF_MSG_PEER, &reply);
    if (rc == 0 && rdma)
        rc = perf_rdma_client_ready(cl->rdma, g);
    return rc;
}

static int run_once(struct client *cl, const struct perf_case *c, enum perf_mode mode, size_t size, uint64_t count,
                    struct perf_result *res)
{
    if (c->transport == PERF_KERNEL)
        return perf_kernel_client_run(cl->kernel, cl->fd, c, mode, size, count, cl->o->window, res);
    return perf_rdma_client_run(cl->rdma, cl->fd, c, mode, size, count, cl->o->window, res);
}

/* Why a point cannot run, or NULL. */
static const char *unsupported(const struct client *cl, const struct perf_case *c, size_t size)
{
    if (c->test == PERF_UDP && size > PERF_UDP_MAX)
        return "larger than a UDP datagram";
    if (c->transport != PERF_KERNEL && size > perf_rdma_max_size(cl->rdma, c))
        return "larger than the provider's largest message";
    return NULL;
}

static int measure(struct client *cl, const struct perf_case *c, enum perf_mode mode, size_t size,
                   struct perf_result *res)
{
    const struct perf_opts *o = cl->o;
    int rc;
    uint64_t count;
    if (o->iters) {
        uint64_t warm = o->warmup >= 0 ? (uint64_t)o->warmup : (mode == PERF_LAT ? 100 : 2ull * o->window);
        if (warm && (rc = run_once(cl, c, mode, size, warm, res)) != 0)
            return rc;
        count = o->iters;
    } else {
        if (o->warmup > 0 && (rc = run_once(cl, c, mode, size, (uint64_t)o->warmup, res)) != 0)
            return rc;
        /* Start small (a 1 MiB stream of 2 windows is already 256 MiB) and grow until a run is long enough. */
        uint64_t trial = mode == PERF_LAT ? 8 : (64u << 20) / size;
        if (trial < 4)
            trial = 4;
        if (mode == PERF_BW && trial > 2ull * o->window)
            trial = 2ull * o->window;
        double target = o->seconds / 8 < CALIBRATION_MIN_S ? o->seconds / 8 : CALIBRATION_MIN_S;
        for (;;) {
            if ((rc = run_once(cl, c, mode, size, trial, res)) != 0)
                return rc;
            double t = res->client_elapsed_s;
            if (t >= target || trial >= 100000000ull)
                break;
            double grow = t > 0 ? 1.5 * target / t : 16;
            trial = (uint64_t)((double)trial * (grow < 2 ? 2 : grow > 16 ? 16 : grow));
        }
        double per_iter = res->client_elapsed_s / (double)trial;
        count = per_iter > 0 ? (uint64_t)(o->seconds / per_iter) + 1 : trial;
        if (count < 4)
            count = 4;
    }
    return run_once(cl, c, mode, size, count, res);
}

static void progress(const struct client *cl, const struct perf_case *c, enum perf_mode mode, size_t size,
                     const struct perf_result *r)
{
    if (cl->o->quiet)
        return;
    if (mode == PERF_LAT)
        fprintf(stderr, "  %-10s lat %8zu B  %9.2f us (median %.2f)%s\n", c->name, size, r->avg_us, r->median_us,
                r->lost ? "  (lost some)" : "");
    else
        fprintf(stderr, "  %-10s bw  %8zu B  %10.0f msg/s %9.1f MB/s%s\n", c->name, size, r->msg_rate, r->mb_per_s,
                r->lost ? "  (lost some)" : "");
}

static int drive(struct client *cl)
{
    const struct perf_opts *o = cl->o;
    int rc = hello(cl);
    if (rc)
        return rc;
    for (int g = 0; g < PERF_GROUP_COUNT; g++) {
        if (!group_wanted(o, (enum perf_group)g))
            continue;
        rc = setup_group(cl, (enum perf_group)g);
        if (rc) {
            static const char *const names[] = { "UD", "RC", "TCP", "UDP" };
            perf_log("setting up %s failed: %s", names[g], strerror(-rc));
            return rc;
        }
        cl->group_up[g] = true;
    }
    perf_csv_header(cl->csv, o, cl->provider);
    for (int mode = PERF_LAT; mode <= PERF_BW; mode++) {
        if (!o->mode_on[mode])
            continue;
        for (size_t s = 0; s < o->size_count; s++) {
            for (size_t i = 0; i < perf_case_count; i++) {
                const struct perf_case *c = &perf_cases[i];
                if (!o->case_on[i])
                    continue;
                const char *why = unsupported(cl, c, o->sizes[s]);
                if (why) {
                    if (!o->quiet)
                        fprintf(stderr, "  %-10s %s %8zu B  skipped: %s\n", c->name, perf_mode_name(mode),
                                o->sizes[s], why);
                    continue;
                }
                struct perf_result res;
                rc = measure(cl, c, (enum perf_mode)mode, o->sizes[s], &res);
                if (rc) {
                    perf_log("%s %s %zu B failed: %s", c->name, perf_mode_name(mode), o->sizes[s], strerror(-rc));
                    return rc;
                }
                perf_csv_row(cl->csv, c, (enum perf_mode)mode, o->sizes[s], &res, o, cl->provider);
                progress(cl, c, (enum perf_mode)mode, o->sizes[s], &res);
            }
        }
    }
    struct perf_msg quit;
    memset(&quit, 0, sizeof(quit));
    quit.type = PERF_MSG_QUIT;
    perf_msg_send(cl->fd, &quit);
    return 0;
}

static int client_main(const struct perf_opts *o, const struct sockaddr_storage *server)
{
    struct client cl;
    memset(&cl, 0, sizeof(cl));
    cl.o = o;
    cl.provider = o->kind == RS_RNIC_KIND_VERBS ? "verbs" : "soft";
    cl.csv = stdout;
    if (o->csv_path && !(cl.csv = fopen(o->csv_path, "w"))) {
        perf_log("%s: %s", o->csv_path, strerror(errno));
        return 1;
    }
    cl.server = *server;
    cl.fd = perf_tcp_connect(server, 10000);
    if (cl.fd < 0) {
        char a[80];
        perf_log("cannot reach the server at %s: %s", perf_addr_str(server, a, sizeof(a)), strerror(-cl.fd));
        return 1;
    }
    socklen_t len = sizeof(cl.local);
    perf_sys_getsockname(cl.fd, (struct sockaddr *)&cl.local, &len);
    int rc = drive(&cl);
    perf_rdma_close(cl.rdma);
    perf_kernel_close(cl.kernel);
    perf_sys_close(cl.fd);
    if (cl.csv != stdout)
        fclose(cl.csv);
    return rc ? 1 : 0;
}

/* Pins the calling thread, and so every thread it creates later (the RNIC's progress thread), to one CPU. */
static int pin(int cpu)
{
    if (cpu < 0)
        return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
        perf_log("cannot pin to CPU %d: %s", cpu, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct perf_opts o;
    if (parse_options(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    /* A peer that vanishes must show up as an error from send(), not kill us. */
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_storage addr;
    socklen_t alen;
    if (o.role == PERF_ROLE_CLIENT) {
        if (pin(o.cpu_client) != 0)
            return 2;
        if (perf_resolve(o.host, o.port, &addr, &alen) != 0) {
            perf_log("cannot resolve %s", o.host);
            return 2;
        }
        return client_main(&o, &addr);
    }
    const char *bind_host = o.bind ? o.bind : o.role == PERF_ROLE_LOOPBACK ? "127.0.0.1" : "0.0.0.0";
    if (perf_resolve(bind_host, o.port, &addr, &alen) != 0) {
        perf_log("cannot resolve %s", bind_host);
        return 2;
    }
    int lfd = perf_tcp_listen(&addr, 4);
    if (lfd < 0) {
        perf_log("cannot listen on %s port %u: %s", bind_host, o.port, strerror(-lfd));
        return 1;
    }
    if (o.role == PERF_ROLE_SERVER) {
        perf_role_tag = "rdmasock-perf server";
        if (pin(o.cpu_server) != 0)
            return 2;
        perf_log("listening on %s port %u", bind_host, o.port);
        int rc = perf_server(&o, lfd, false);
        perf_sys_close(lfd);
        return rc ? 1 : 0;
    }
    /* Loopback: the server is a child listening on the socket made above, so the client can never race it. The
     * fork happens before either side opens an RNIC (its progress thread would not survive a fork). */
    alen = sizeof(addr);
    perf_sys_getsockname(lfd, (struct sockaddr *)&addr, &alen);
    fflush(NULL);
    pid_t child = fork();
    if (child < 0) {
        perf_log("fork: %s", strerror(errno));
        return 1;
    }
    if (child == 0) {
        perf_role_tag = "rdmasock-perf server";
        int rc = pin(o.cpu_server) != 0 ? -EINVAL : perf_server(&o, lfd, true);
        _exit(rc ? 1 : 0);
    }
    perf_sys_close(lfd);
    int rc = pin(o.cpu_client) != 0 ? 2 : client_main(&o, &addr);
    int status = 0;
    if (rc != 0)
        kill(child, SIGTERM);
    waitpid(child, &status, 0);
    if (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        perf_log("the server process failed");
        rc = 1;
    }
    return rc;
}
