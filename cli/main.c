/*
 * main.c - entry of the `flexdiag` command-line tool: dispatches the subcommand.
 *
 *   flexdiag generate      text prompts -> image tokens (+ PNGs) on the builtin or a real model
 *   flexdiag score         teacher-forced CFG logits of given image tokens (.npy)
 *   flexdiag decode        image-token grids (.npy) -> PNGs through the VQ decoder
 *   flexdiag serve         an OpenAI-shaped HTTP API on the model (cmd_serve.c)
 *   flexdiag policy-trace  step-by-step attended/resident/evicted sets of a KV policy
 *   flexdiag bench         throughput and fidelity benchmarks
 *
 * The first four run here, on the public API of the shared library. policy-trace and bench
 * replay the library's internals (host policy state machines, profiling splits, the op table),
 * so they live in the analysis tool `flexdiag-bench`, built and installed next to this
 * executable: they are handed to it with their arguments unchanged (exec, so its exit status,
 * output and signals are the command's own).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

#define BENCH_EXE "flexdiag-bench"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv); /* NULL: run by flexdiag-bench */
    const char *help;
} command;

static const command commands[] = {
    {"generate", flexdiag_cmd_generate, "generate images (builtin model without --model)"},
    {"score", flexdiag_cmd_score, "teacher-forced CFG logits of image tokens -> .npy"},
    {"decode", flexdiag_cmd_decode, "image-token grids (.npy) -> PNG files"},
    {"serve", flexdiag_cmd_serve, "HTTP server: OpenAI-shaped images and completions API"},
    {"policy-trace", NULL, "trace a KV policy's attended sets as JSON"},
    {"bench", NULL, "benchmarks: throughput (default) and fidelity"},
    {"profile", NULL, "measure this machine's transfer, copy and GEMM rates -> JSON profile"},
    {"search", NULL, "predict and rank batch, placement and policy configurations"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: flexdiag <command> [flags]   (flexdiag <command> --help for flags)\n"
               "       flexdiag --version\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
}

/* Replace this process by flexdiag-bench from this executable's folder with argv[1..]; returns
 * only after printing why that failed. */
static int run_bench_tool(char **argv) {
    char self[PATH_MAX], path[PATH_MAX + sizeof BENCH_EXE];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "flexdiag %s: cannot locate this executable (/proc/self/exe: %s) to run "
                "%s next to it\n", argv[1], strerror(errno), BENCH_EXE);
        return 1;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    snprintf(path, sizeof path, "%.*s/%s", slash ? (int)(slash - self) : 1,
             slash ? self : ".", BENCH_EXE);
    argv[0] = path;
    execv(path, argv);
    fprintf(stderr, "flexdiag %s: cannot run the analysis tool %s: %s (it is built and installed "
            "next to flexdiag)\n", argv[1], path, strerror(errno));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("flexdiag %s\n", flexdiag_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        return commands[i].fn ? commands[i].fn(argc - 1, argv + 1) : run_bench_tool(argv);
    }
    fprintf(stderr, "flexdiag: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
