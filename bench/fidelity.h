/*
 * fidelity.h - `flexdiag bench fidelity`: how far each KV policy's attention (and, with a model,
 * its logits) drifts from dense decoding, with the memory it keeps resident.
 *
 * A row is filled by a runner and written by the printers (fidelity_report.c); the runners are
 * separate so the model-backed mode (fidelity_model.c, `--model DIR`, driving the engine) can
 * fill the KL / top-1 columns that the synthetic mode (cmd_fidelity.c) leaves as NaN ("n/a").
 * Calls go one way: cmd_fidelity.c -> fidelity_model.c -> fidelity_report.c. Markdown goes to
 * stdout, JSONL rows to --json FILE, appended and flushed per row (docs/formats.md §1).
 */
#ifndef FLEXDIAG_BENCH_FIDELITY_H
#define FLEXDIAG_BENCH_FIDELITY_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_BENCH)
#error "bench/fidelity.h is private to bench/ (docs/architecture.md)"
#endif

#include <stdint.h>
#include <stdio.h>

#include "flexdiag.h"

typedef struct flexdiag_fidelity_row {
    const char *mode;         /* "synthetic" or "model" */
    const char *source;       /* "grid:24" or the model folder */
    flexdiag_policy_kind kind; /* policy */
    double sparsity;          /* requested sparsity (0 for dense) */
    double reported_sparsity; /* 1 - N_att / L_dec */
    int32_t n_att, n_r;       /* resolved budget; n_r 0 = not a Diagonal policy */
    int32_t l_dec;            /* decode steps */
    int32_t prompt_len;       /* prompt keys */
    int32_t heads, d_head;    /* heads (MHA in synthetic mode), head dim */
    uint64_t seed;            /* seed of the run */
    double attn_err;          /* mean relative L2 error of the attention output vs dense */
    double attn_err_max;      /* largest per (step, head) error */
    double kl;                /* mean KL(dense || policy) of next-token logits; NaN = n/a */
    double top1;              /* top-1 agreement with dense; NaN = n/a */
    int64_t resident_rows;    /* prompt + peak decode KV rows per (sequence, KV head) */
    uint64_t resident_bytes;  /* resident K+V bytes per sequence (bf16, all heads, per layer) */
    uint64_t evictions;       /* KV rows evicted over the run */
    int32_t prompts;          /* model mode: prompts the row averages over (the error max is
                                 the largest; counts are rounded means); 0 in synthetic mode */
} flexdiag_fidelity_row;

/* ---- printers (fidelity_report.c) ---- */

/* Markdown table header / one row (columns: policy, sparsity, N_att, N_r, attn_err, KL, top-1,
 * resident rows, resident KB, evictions). */
void flexdiag_fidelity_md_header(FILE *f);
void flexdiag_fidelity_md_row(FILE *f, const flexdiag_fidelity_row *r);
/* One JSON object per line (policy traits of docs/policies.md §6 included), flushed; returns 0 or
 * -1 when the write failed. */
int flexdiag_fidelity_jsonl_row(FILE *f, const flexdiag_fidelity_row *r);

/* Rows of a policy kind over ns sparsities and n_rings rings: dense 1, a Diagonal kind ns per
 * ring (row r: sparsity r % ns, ring r / ns), the others ns. */
int flexdiag_fidelity_rows_of(flexdiag_policy_kind kind, int ns, int n_rings);

/* Model-backed mode (fidelity_model.c): kinds x sparsities (x rings[n_rings] for the Diagonal
 * kinds, 0 = the default ring) on the model of mo, each row the mean over the n_prompts
 * prompts (a dense reference image each); rows to stdout and json (may be NULL). A (sparsity,
 * ring) whose N_att exceeds the ring is skipped with a message. */
struct cli_model_opts;
struct cli_policy_opts;
/* po: --calib and --ssd-tau, given to every context (ssd, hack read them). */
int flexdiag_fidelity_model(const struct cli_model_opts *mo, const struct cli_policy_opts *po,
                            const char *const *prompts,
                            int n_prompts, const flexdiag_policy_kind *kinds, int nk,
                            const double *sps, int ns,
                            const int32_t *rings, int n_rings, uint64_t seed, FILE *json);

#endif /* FLEXDIAG_BENCH_FIDELITY_H */
