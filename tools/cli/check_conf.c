/* rdmasock check-conf FILE: the same parser the library runs at start-up, so a file that passes here is the
 * file the library will use; on error it prints file:line:column and what was expected. */
#include <stdio.h>

#include "cli.h"
#include "common/config.h"

int rs_cmd_check_conf(int argc, char **argv)
{
    if (argc != 2) {
        fputs("usage: rdmasock check-conf FILE\n", stderr);
        return RS_EXIT_USAGE;
    }
    struct rs_config *cfg = NULL;
    struct rs_config_error err;
    if (rs_config_load_file(argv[1], &cfg, &err) != 0) {
        char msg[600];
        rs_config_format_error(&err, msg, sizeof(msg));
        fprintf(stderr, "%s\n", msg);
        return RS_EXIT_FAILURE;
    }
    printf("# %s: %zu rule(s), %zu qos class(es); first match wins, then the built-in defaults\n",
           argv[1], cfg->n_rules, cfg->n_qos);
    rs_config_dump(cfg, stdout);
    rs_config_free(cfg);
    return 0;
}
