/*
 * synthetic.h - a synthetic 2-D locality model of image-token attention and the attention-output
 * fidelity of a KV policy on it (host only, no I/O).
 *
 * Decode tokens are the cells of a W x W grid in raster order (token p at row p / W, column
 * p mod W; tokens past W² continue the raster). The logit of query cell (r, c) for decode key
 * cell (r', c') is -alpha·((r - r')² + (c - c')²) + eps, eps ~ N(0, sigma²) drawn from a
 * counter-based generator keyed by (seed, head, t, key), so a value never depends on evaluation
 * order; prompt keys get the constant logit prompt_logit. High logits therefore sit at lags 0,
 * 1 and W (distance 1) and W ± 1 (distance √2): the diagonal stripes of the paper's Fig. 9.
 * Defaults: alpha 0.5, sigma 0.5, prompt_logit 0.
 *
 * The fidelity runner compares attention outputs softmax(prompt + attended) · V of a policy with
 * dense attention (prompt + decode 0..t) for seeded N(0, 1) value vectors, per step and head.
 */
#ifndef FLEXDIAG_SYNTHETIC_H
#define FLEXDIAG_SYNTHETIC_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_POLICY
#error "policy/synthetic.h: a lower layer may not use policy/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "policy/kv_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flexdiag_synth_params {
    int32_t grid_w;      /* W: grid side (decode tokens are its cells) */
    int32_t heads;       /* attention heads (MHA) */
    int32_t steps;       /* T decode tokens; default W² */
    int32_t prompt_len;  /* Lp prompt keys; default 50 */
    double alpha;        /* locality strength per squared cell distance; default 0.5 */
    double sigma;        /* logit noise standard deviation; default 0.5 */
    double prompt_logit; /* logit of every prompt key; default 0 */
    uint64_t seed;       /* noise and value-vector seed; default 1 */
} flexdiag_synth_params;

typedef struct flexdiag_synth_fidelity {
    double attn_err;         /* mean over steps and heads of |o_policy - o_dense| / |o_dense| */
    double attn_err_max;     /* largest single (step, head) relative error */
    int64_t resident_rows;   /* prompt + peak decode rows per (sequence, KV head) */
    uint64_t resident_bytes; /* resident_rows · heads · 2 (K+V) · d_head · 2 (bf16), one layer */
    uint64_t evictions;      /* rows evicted over the run, all heads */
} flexdiag_synth_fidelity;

/* Precomputed logits, value vectors and dense outputs of one synthetic configuration. */
typedef struct flexdiag_synth_ctx flexdiag_synth_ctx;

/* Defaults for a W x W grid (W² steps, 8 heads, Lp 50, alpha 0.5, sigma 0.5, seed 1). */
void flexdiag__synth_params_init(flexdiag_synth_params *p, int32_t grid_w);
/* Parse "grid:W" (W in [1, 64]: 4096 steps); errors name --synthetic and the expected form. */
flexdiag_status flexdiag__synth_parse(const char *spec, int32_t *grid_w);
/* Logit of query t of head h for key k (k < prompt_len: prompt key; else decode key k - Lp). */
float flexdiag__synth_logit(const flexdiag_synth_params *p, int32_t head, int32_t t, int32_t key);
/* Validate p: INVALID_ARG naming the flag and its range (--synthetic, --heads, --steps,
 * --prompt-len, --alpha, --sigma, --prompt-logit). */
flexdiag_status flexdiag__synth_check(const flexdiag_synth_params *p);
/* Fill out [heads, steps, prompt_len + steps] (the policy-trace layout); validates p first. */
flexdiag_status flexdiag__synth_fill(const flexdiag_synth_params *p, float *out);

/* Build the context (logits, values with d_head dims, dense outputs); *out owned by caller. */
flexdiag_status flexdiag__synth_ctx_create(const flexdiag_synth_params *p, int32_t d_head,
                                           flexdiag_synth_ctx **out);
void flexdiag__synth_ctx_destroy(flexdiag_synth_ctx *c);
/* Run policy kp (resolved with l_dec = steps; n_seq/n_layers/heads are set here) over the whole
 * grid and measure its attention-output error against dense. */
flexdiag_status flexdiag__synth_run(const flexdiag_synth_ctx *c, const flexdiag_kvp_params *kp,
                                    flexdiag_synth_fidelity *out);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_SYNTHETIC_H */
