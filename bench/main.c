/*
 * main.c - entry of `flexdiag-bench`, the analysis tool:
 *
 *   flexdiag-bench bench [throughput|fidelity] ...   benchmarks (bench/RESULTS.md)
 *   flexdiag-bench policy-trace ...                   a KV policy's sets, step by step
 *   flexdiag-bench profile ...                        this machine's rates for search
 *   flexdiag-bench search ...                         best batch / placement / policy (predicted)
 *   flexdiag-bench requests ...                       a request mix through the request queue
 *   flexdiag-bench calibrate ...                      a model's calibration table (ssd, hack)
 *
 * These commands need the library's internals (profiling splits and the op table for the
 * roofline, the host policy state machines and the synthetic locality model), so the tool links
 * the internal static libraries and is compiled at the BENCH layer, while `flexdiag` links only
 * the public shared library and execs this tool for `bench` and `policy-trace` (its arguments
 * unchanged). It reuses the CLI's flag parser and its model and policy flags (cli/cli.h): bench
 * sits above cli.
 */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "flexdiag.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"bench", flexdiag_cmd_bench, "benchmarks: throughput (default) and fidelity"},
    {"policy-trace", flexdiag_cmd_policy_trace, "trace a KV policy's attended sets as JSON"},
    {"profile", flexdiag_cmd_profile, "measure this machine's rates for search"},
    {"search", flexdiag_cmd_search, "rank batch, placement and policy by predicted img/s"},
    {"requests", flexdiag_cmd_requests,
     "a mix of requests through the continuous engine: tok/s, img/s, latency"},
    {"calibrate", flexdiag_cmd_calibrate,
     "dense images of a prompt file -> the model's calibration table for ssd and hack"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: flexdiag-bench <command> [flags]   (flexdiag-bench <command> --help for "
               "flags)\n       flexdiag-bench --version\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("flexdiag-bench %s\n", flexdiag_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "flexdiag-bench: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
