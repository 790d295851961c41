/* rdmasock: the command-line front of the library (check-conf, run, stat). See rdmasock(1). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *out)
{
    fputs("usage: rdmasock check-conf FILE          validate a rule file and print the parsed rules\n"
          "       rdmasock run [-c FILE] [--transport auto|verbs|soft|off] [--log SPEC] -- CMD [ARG...]\n"
          "                                         run an unmodified program over rdmasock\n"
          "       rdmasock stat [--json] [--gc] [PID] show the statistics of processes using rdmasock\n"
          "       rdmasock version\n", out);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return RS_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "check-conf") == 0)
        return rs_cmd_check_conf(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0)
        return rs_cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "stat") == 0)
        return rs_cmd_stat(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("rdmasock %s\n", RS_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "rdmasock: unknown command '%s'\n", cmd);
    usage(stderr);
    return RS_EXIT_USAGE;
}
