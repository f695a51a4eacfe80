/*
 * bench.h - the commands of `flexdiag-bench`, the analysis tool (bench/main.c dispatches them;
 * `flexdiag bench` and `flexdiag policy-trace` exec the tool with their arguments). Each takes
 * argv[0] = its own name and returns the process exit code.
 */
#ifndef FLEXDIAG_BENCH_H
#define FLEXDIAG_BENCH_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_BENCH)
#error "bench/bench.h is private to bench/ (docs/architecture.md)"
#endif

#include "flexdiag.h"

/* `bench [throughput]`: throughput rows against the roofline, policy search. */
int flexdiag_cmd_bench(int argc, char **argv);
/* `bench fidelity` (argv[0] = "fidelity"): each policy's drift from dense. */
int flexdiag_cmd_bench_fidelity(int argc, char **argv);
/* `policy-trace`: a policy's attended / resident / evicted sets, step by step, as JSON lines. */
int flexdiag_cmd_policy_trace(int argc, char **argv);
/* `profile`: measure this machine's rates for the policy search (cmd_profile.c). */
int flexdiag_cmd_profile(int argc, char **argv);
/* `search`: rank batch, placement and policy configurations by predicted img/s (cmd_search.c). */
int flexdiag_cmd_search(int argc, char **argv);
/* `requests`: a mix of requests through a context's request queue, per batching mode
 * (cmd_requests.c). */
int flexdiag_cmd_requests(int argc, char **argv);
/* `calibrate`: a model's calibration table for ssd and hack (cmd_calibrate.c). */
int flexdiag_cmd_calibrate(int argc, char **argv);
/* Synthetic prompt g of len ids for context c's model (malloc'ed; NULL when out of memory):
 * BOS, random ids (stream g), then <begin_of_image> (Janus), or the end of turn, the image start
 * and the size token twice (Lumina-mGPT images). */
int32_t *bench_synthetic_prompt(const flexdiag_context *c, int32_t len, int32_t g);
/* The runtime's device name ("NVIDIA H200", the CPU's model name) into out (n bytes). */
void bench_device_name(const flexdiag_runtime *rt, char *out, size_t n);

/* ---- comma lists (lists.c) ---- */
#define BENCH_MAX_LIST 64 /* entries per list */
/* Split s into at most BENCH_MAX_LIST policy kinds; prints the valid names and returns 2 on an
 * unknown or missing name (cmd names the command in messages). */
int bench_parse_policies(const char *cmd, const char *s, flexdiag_policy_kind *out, int *n);
/* Split s into at most BENCH_MAX_LIST numbers in [0, 1]; prints the error and returns 2. */
int bench_parse_sparsities(const char *cmd, const char *s, double *out, int *n);
/* Split s into at most BENCH_MAX_LIST Diagonal ring sizes in [0, 32767] (0: the default ring);
 * prints the error and returns 2. */
int bench_parse_rings(const char *cmd, const char *s, int32_t *out, int *n);
/* Whether a policy kind has a ring (--n-r): the Diagonal kinds. */
int bench_has_ring(flexdiag_policy_kind kind);

#endif /* FLEXDIAG_BENCH_H */
