/* The `rdmasock` command: one binary, one file per subcommand. */
#ifndef RS_TOOLS_CLI_H
#define RS_TOOLS_CLI_H

int rs_cmd_check_conf(int argc, char **argv);
int rs_cmd_run(int argc, char **argv);
int rs_cmd_stat(int argc, char **argv);

/* Exit statuses shared by the subcommands; 0 is success. */
enum { RS_EXIT_FAILURE = 1, RS_EXIT_USAGE = 2 };

#endif
