/*
 * cli.h - the flexdiag command-line tool: subcommand entry points and the one flag parser they
 * share, so every command reports bad flags the same way ("flexdiag score: --cfg: expected a
 * number, got 'x'") and exits 2. Library errors are printed with flexdiag_last_error() and exit 1.
 */
#ifndef FLEXDIAG_CLI_H
#define FLEXDIAG_CLI_H

#include <stdint.h>

#include "flexdiag.h"

/* ---- subcommands: argv[0] is the subcommand name; return the process exit code ---- */
int flexdiag_cmd_generate(int argc, char **argv);
int flexdiag_cmd_score(int argc, char **argv);
int flexdiag_cmd_policy_trace(int argc, char **argv);
int flexdiag_cmd_bench(int argc, char **argv);
int flexdiag_cmd_decode(int argc, char **argv);

/* ---- flag parser ---- */

typedef enum cli_type {
    CLI_STR,   /* const char * */
    CLI_INT,   /* int64_t */
    CLI_F64,   /* double */
    CLI_FLAG,  /* int, set to 1, takes no value */
    CLI_SIZE,  /* uint64_t bytes: 24G, 512M, 4096 (K/M/G/T, powers of 1024) */
} cli_type;

typedef struct cli_opt {
    const char *name; /* "--gpu-mem" */
    cli_type type;    /* value type */
    void *dst;        /* where the value goes */
    const char *help; /* one line for --help */
} cli_opt;

/* Parse argv[1..] (argv[0] is the subcommand). Accepts "--x v" and "--x=v". Returns 0 on
 * success, 1 if --help was printed, 2 after printing an error naming the flag. */
int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, int n_opts);
/* Print "flexdiag <cmd>: <library message>" for a failed status and return 1. */
int cli_fail(const char *cmd, flexdiag_status st);
/* Parse a size like "24G"; returns 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);

#endif /* FLEXDIAG_CLI_H */
