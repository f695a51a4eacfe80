/*
 * cli.c - flag parsing and error printing shared by every flexdiag subcommand (see cli.h).
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_size(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0; end++; break;
    case 'M': case 'm': mul = 1024.0 * 1024; end++; break;
    case 'G': case 'g': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': case 't': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end) return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

static void print_help(const char *cmd, const cli_opt *opts, int n) {
    printf("usage: flexdiag %s [flags]\n", cmd);
    for (int i = 0; i < n; i++)
        printf("  %-22s %s\n", opts[i].name, opts[i].help ? opts[i].help : "");
}

static int set_value(const char *cmd, const cli_opt *o, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case CLI_STR: *(const char **)o->dst = v; return 0;
    case CLI_INT: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno) break;
        *(int64_t *)o->dst = x;
        return 0;
    }
    case CLI_F64: {
        double x = strtod(v, &end);
        if (end == v || *end || errno) break;
        *(double *)o->dst = x;
        return 0;
    }
    case CLI_SIZE:
        if (cli_parse_size(v, (uint64_t *)o->dst) == 0) return 0;
        fprintf(stderr, "flexdiag %s: %s: expected a size like 24G or 512M, got '%s'\n", cmd,
                o->name, v);
        return 2;
    case CLI_FLAG: *(int *)o->dst = 1; return 0;
    }
    fprintf(stderr, "flexdiag %s: %s: expected a %s, got '%s'\n", cmd, o->name,
            o->type == CLI_INT ? "whole number" : "number", v);
    return 2;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, int n_opts) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help(cmd, opts, n_opts);
            return 1;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *o = NULL;
        for (int j = 0; j < n_opts && !o; j++)
            if (strlen(opts[j].name) == len && !strncmp(opts[j].name, a, len)) o = &opts[j];
        if (!o) {
            fprintf(stderr, "flexdiag %s: unknown flag '%.*s' (see flexdiag %s --help)\n", cmd,
                    (int)len, a, cmd);
            return 2;
        }
        if (o->type == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "flexdiag %s: %s takes no value\n", cmd, o->name);
                return 2;
            }
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "flexdiag %s: %s needs a value\n", cmd, o->name);
            return 2;
        }
        int rc = set_value(cmd, o, v);
        if (rc) return rc;
    }
    return 0;
}

int cli_fail(const char *cmd, flexdiag_status st) {
    const char *msg = flexdiag_last_error(NULL);
    fprintf(stderr, "flexdiag %s: %s\n", cmd, msg && *msg ? msg : flexdiag_status_str(st));
    return 1;
}
