/* rdmasock stat [--json] [--gc] [--all-users] [PID]: reads the statistics areas that preloaded processes publish
 * in shared memory (see include/rdmasock/stats.h). Without PID it lists every live process using rdmasock. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/stats.h"

struct list_state {
    bool json;
    int shown;
};

static int show_one(pid_t pid, bool json)
{
    struct rs_stats_map map;
    int rc = rs_stats_open_pid(pid, &map);
    if (rc != 0) {
        fprintf(stderr, "rdmasock stat: process %d: %s\n", (int)pid,
                rc == -ENOENT ? "no rdmasock statistics (not running with rdmasock?)" : strerror(-rc));
        return RS_EXIT_FAILURE;
    }
    if (json)
        rs_stats_print_json(stdout, &map);
    else
        rs_stats_print(stdout, &map);
    rs_stats_unmap(&map);
    return 0;
}

static int list_entry(const struct rs_stats_entry *entry, void *arg)
{
    struct list_state *state = arg;
    if (entry->removed) {
        fprintf(stderr, "removed stale %s (%s)\n", entry->name, rs_stats_liveness_name(entry->liveness));
        return 0;
    }
    if (entry->liveness != RS_STATS_LIVE)
        return 0;
    if (state->json && state->shown > 0)
        fputs(",\n", stdout);
    if (show_one(entry->pid, state->json) == 0)
        state->shown++;
    return 0;
}

int rs_cmd_stat(int argc, char **argv)
{
    static const struct option options[] = {
        { "json", no_argument, NULL, 'j' },
        { "gc", no_argument, NULL, 'g' },
        { "all-users", no_argument, NULL, 'a' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    bool json = false;
    unsigned flags = 0;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "jgah", options, NULL)) != -1) {
        switch (opt) {
        case 'j': json = true; break;
        case 'g': flags |= RS_STATS_LIST_REMOVE_STALE; break;
        case 'a': flags |= RS_STATS_LIST_ALL_USERS; break;
        case 'h':
            puts("usage: rdmasock stat [--json] [--gc] [--all-users] [PID]");
            return 0;
        default:
            return RS_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        char *end;
        long pid = strtol(argv[optind], &end, 10);
        if (*end || pid <= 0) {
            fprintf(stderr, "rdmasock stat: '%s' is not a process id\n", argv[optind]);
            return RS_EXIT_USAGE;
        }
        return show_one((pid_t)pid, json);
    }
    struct list_state state = { .json = json, .shown = 0 };
    if (json)
        fputs("[\n", stdout);
    int rc = rs_stats_list(flags, list_entry, &state);
    if (json)
        fputs("\n]\n", stdout);
    if (rc < 0) {
        fprintf(stderr, "rdmasock stat: cannot read /dev/shm: %s\n", strerror(-rc));
        return RS_EXIT_FAILURE;
    }
    if (!json && state.shown == 0)
        puts("no process is using rdmasock");
    return 0;
}
