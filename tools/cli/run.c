/* rdmasock run [-c FILE] [--transport T] [--log SPEC] -- CMD [ARG...]
 * Sets up the preload and execs the program; it adds nothing at run time, so `rdmasock run` and a hand-written
 * LD_PRELOAD behave identically. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common/config.h"

#ifndef RS_LIBDIR
#define RS_LIBDIR "/usr/local/lib"
#endif

/* The library that belongs to this binary: beside it in a build tree (build/bin/../librdmasock.so), or in the
 * lib folder it was installed with. RDMASOCK_LIB overrides both. */
static int find_library(char *out, size_t len)
{
    const char *forced = getenv("RDMASOCK_LIB");
    if (forced && *forced) {
        if (access(forced, R_OK) != 0)
            return -1;
        return realpath(forced, out) ? 0 : -1;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            const char *candidates[] = { "../librdmasock.so", "../lib/librdmasock.so.0" };
            for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
                char path[PATH_MAX + 32];
                snprintf(path, sizeof(path), "%s/%s", self, candidates[i]);
                if (access(path, R_OK) == 0 && realpath(path, out))
                    return 0;
            }
        }
    }
    snprintf(out, len, "%s/librdmasock.so.0", RS_LIBDIR);
    return access(out, R_OK) == 0 ? 0 : -1;
}

static void run_usage(void)
{
    fputs("usage: rdmasock run [-c FILE] [--transport auto|verbs|soft|off] [--log SPEC] -- CMD [ARG...]\n", stderr);
}

int rs_cmd_run(int argc, char **argv)
{
    static const struct option options[] = {
        { "config", required_argument, NULL, 'c' },
        { "transport", required_argument, NULL, 't' },
        { "log", required_argument, NULL, 'l' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *conf = NULL, *transport = NULL, *log_spec = NULL;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "+c:t:l:h", options, NULL)) != -1) {
        switch (opt) {
        case 'c': conf = optarg; break;
        case 't': transport = optarg; break;
        case 'l': log_spec = optarg; break;
        case 'h': run_usage(); return 0;
        default: run_usage(); return RS_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        run_usage();
        return RS_EXIT_USAGE;
    }
    if (transport) {
        enum rs_transport parsed;
        if (rs_parse_transport(transport, &parsed) != 0) {
            fprintf(stderr, "rdmasock run: --transport takes auto, verbs, soft or off, not '%s'\n", transport);
            return RS_EXIT_USAGE;
        }
    }
    char lib[PATH_MAX];
    if (find_library(lib, sizeof(lib)) != 0) {
        fprintf(stderr, "rdmasock run: cannot find librdmasock.so (set RDMASOCK_LIB)\n");
        return RS_EXIT_FAILURE;
    }
    if (conf) {
        /* Checked here so a typo fails loudly before the program starts; the library itself would only log it
         * once and keep every socket on the kernel. */
        char resolved[PATH_MAX];
        if (!realpath(conf, resolved)) {
            fprintf(stderr, "rdmasock run: %s: %s\n", conf, strerror(errno));
            return RS_EXIT_FAILURE;
        }
        setenv("RDMASOCK_CONF", resolved, 1);
    }
    if (transport)
        setenv("RDMASOCK_TRANSPORT", transport, 1);
    if (log_spec)
        setenv("RDMASOCK_LOG", log_spec, 1);

    const char *old = getenv("LD_PRELOAD");
    size_t need = strlen(lib) + (old ? strlen(old) + 1 : 0) + 1;
    char *preload = malloc(need);
    if (!preload)
        return RS_EXIT_FAILURE;
    snprintf(preload, need, "%s%s%s", lib, old && *old ? ":" : "", old && *old ? old : "");
    setenv("LD_PRELOAD", preload, 1);
    free(preload);

    execvp(argv[optind], argv + optind);
    int err = errno;
    fprintf(stderr, "rdmasock run: %s: %s\n", argv[optind], strerror(err));
    return err == ENOENT ? 127 : 126;
}
