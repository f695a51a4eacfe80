/*
 * main.c - entry of the `flexdiag` command-line tool: dispatches the subcommand.
 *
 *   flexdiag generate      text prompts -> image tokens (+ PNGs) on the builtin or a real model
 *   flexdiag score         teacher-forced CFG logits of given image tokens (.npy)
 *   flexdiag decode        image-token grids (.npy) -> PNGs through the VQ decoder
 *   flexdiag policy-trace  step-by-step attended/resident/evicted sets of a KV policy
 *   flexdiag bench         throughput and fidelity benchmarks
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"


typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"generate", flexdiag_cmd_generate, "generate images (builtin model without --model)"},
    {"score", flexdiag_cmd_score, "teacher-forced CFG logits of image tokens -> .npy"},
    {"decode", flexdiag_cmd_decode, "image-token grids (.npy) -> PNG files"},
    {"policy-trace", flexdiag_cmd_policy_trace, "trace a KV policy's attended sets as JSON"},
    {"bench", flexdiag_cmd_bench, "benchmarks: throughput (default) and fidelity"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: flexdiag <command> [flags]   (flexdiag <command> --help for flags)\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "flexdiag: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
