/*
 * synthetic.c - the synthetic W x W grid locality model and the attention-output fidelity
 * runner (see synthetic.h).
 *
 * Noise and value vectors come from the counter RNG flexdiag__rng_uniform (Box-Muller on two
 * draws), keyed by (seed, head, t, key) and (seed, head, key, dim) respectively, so the tensor a
 * trace prints and the one the fidelity bench scores are the same whatever order they are filled
 * in. The runner replays the policy with flexdiag__kvp_replay (the engine's protocol) on the
 * precomputed logits and compares softmax(prompt + attended)·V with the dense output, both in
 * fp64 from the same fp32 logits, so the error is the policy's alone.
 */
#include "policy/synthetic.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "policy/kvp_replay.h"

/* Largest grid side: W = 64 gives 4096 steps and a 0.5 GB logit tensor at 8 heads. */
#define SYNTH_MAX_W 64
#define SYNTH_TWO_PI 6.283185307179586

struct flexdiag_synth_ctx {
    flexdiag_synth_params p; /* copied params */
    int32_t d_head;          /* value vector dims */
    int32_t keys;            /* prompt_len + steps */
    float *logits;           /* (heads, steps, keys) */
    float *v;                /* (heads, keys, d_head) N(0, 1) value vectors */
    double *dense;           /* (heads, steps, d_head) dense attention outputs */
};

void flexdiag__synth_params_init(flexdiag_synth_params *p, int32_t grid_w) {
    memset(p, 0, sizeof *p);
    p->grid_w = grid_w;
    p->heads = 8;
    p->steps = grid_w * grid_w;
    p->prompt_len = 50;
    p->alpha = 0.5;
    p->sigma = 0.5;
    p->prompt_logit = 0.0;
    p->seed = 1;
}

flexdiag_status flexdiag__synth_parse(const char *spec, int32_t *grid_w) {
    char *end = NULL;
    if (spec && !strncmp(spec, "grid:", 5)) {
        errno = 0;
        long w = strtol(spec + 5, &end, 10);
        if (end != spec + 5 && !*end && !errno && w >= 1 && w <= SYNTH_MAX_W) {
            *grid_w = (int32_t)w;
            return FLEXDIAG_OK;
        }
    }
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "--synthetic '%s': expected grid:W with "
                         "1 <= W <= %d (e.g. grid:24)", spec ? spec : "", SYNTH_MAX_W);
}

/* N(0, 1) from two counter draws (Box-Muller); 1 - u keeps the log argument in (0, 1]. */
static double synth_gauss(uint64_t seed, uint64_t a, uint64_t b) {
    double u1 = flexdiag__rng_uniform(seed, a, 2 * b);
    double u2 = flexdiag__rng_uniform(seed, a, 2 * b + 1);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(SYNTH_TWO_PI * u2);
}

float flexdiag__synth_logit(const flexdiag_synth_params *p, int32_t head, int32_t t, int32_t key) {
    if (key < p->prompt_len) return (float)p->prompt_logit;
    int32_t d = key - p->prompt_len, w = p->grid_w;
    double dr = (double)(t / w - d / w), dc = (double)(t % w - d % w);
    uint64_t a = ((uint64_t)(uint32_t)head << 32) | (uint32_t)t;
    double noise = p->sigma * synth_gauss(p->seed, a, (uint64_t)d);
    return (float)(-p->alpha * (dr * dr + dc * dc) + noise);
}

/* INVALID_ARG naming the flag of an int field outside [lo, hi], else OK. */
static flexdiag_status synth_range(const char *flag, int32_t v, int32_t lo, int32_t hi) {
    if (v >= lo && v <= hi) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "synthetic model: %s %d is out of range: "
                         "expected a whole number in [%d, %d]", flag, (int)v, (int)lo, (int)hi);
}

flexdiag_status flexdiag__synth_check(const flexdiag_synth_params *p) {
    if (p->grid_w < 1 || p->grid_w > SYNTH_MAX_W)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "--synthetic grid:%d: expected grid:W "
                             "with 1 <= W <= %d", (int)p->grid_w, SYNTH_MAX_W);
    FLEXDIAG_TRY(synth_range("--heads", p->heads, 1, 1024));
    FLEXDIAG_TRY(synth_range("--steps", p->steps, 1, SYNTH_MAX_W * SYNTH_MAX_W));
    FLEXDIAG_TRY(synth_range("--prompt-len", p->prompt_len, 0, 65536));
    if (!isfinite(p->alpha) || !isfinite(p->prompt_logit) || !isfinite(p->sigma) || p->sigma < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "synthetic model: --alpha %g, --sigma %g "
                             "and --prompt-logit %g must be finite, --sigma >= 0", p->alpha,
                             p->sigma, p->prompt_logit);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__synth_fill(const flexdiag_synth_params *p, float *out) {
    FLEXDIAG_TRY(flexdiag__synth_check(p));
    size_t keys = (size_t)p->prompt_len + (size_t)p->steps;
    for (int32_t h = 0; h < p->heads; h++)
        for (int32_t t = 0; t < p->steps; t++) {
            float *row = out + ((size_t)h * (size_t)p->steps + (size_t)t) * keys;
            for (size_t k = 0; k < keys; k++) row[k] = flexdiag__synth_logit(p, h, t, (int32_t)k);
        }
    return FLEXDIAG_OK;
}

/* ---- fidelity ---- */

/* o (d) = softmax over keys idx (n, indices into row) of row · V rows; fp64. */
static void attend(const flexdiag_synth_ctx *c, const float *row, const float *v,
                   const int32_t *idx, int32_t n, double *o) {
    double m = -INFINITY, sum = 0.0;
    int32_t d = c->d_head;
    for (int32_t i = 0; i < n; i++) m = row[idx[i]] > m ? row[idx[i]] : m;
    for (int32_t j = 0; j < d; j++) o[j] = 0.0;
    for (int32_t i = 0; i < n; i++) {
        double w = exp((double)row[idx[i]] - m);
        const float *vr = v + (size_t)idx[i] * (size_t)d;
        sum += w;
        for (int32_t j = 0; j < d; j++) o[j] += w * vr[j];
    }
    for (int32_t j = 0; j < d; j++) o[j] /= sum;
}

static void synth_values(flexdiag_synth_ctx *c) {
    uint64_t seed = c->p.seed ^ 0x5eed5eed5eed5eedull; /* independent of the logit noise */
    for (int32_t h = 0; h < c->p.heads; h++)
        for (int32_t k = 0; k < c->keys; k++)
            for (int32_t j = 0; j < c->d_head; j++) {
                size_t hk = (size_t)h * (size_t)c->keys + (size_t)k;
                c->v[hk * (size_t)c->d_head + (size_t)j] = (float)synth_gauss(
                    seed, ((uint64_t)(uint32_t)h << 32) | (uint32_t)k, (uint64_t)j);
            }
}

static void synth_dense(flexdiag_synth_ctx *c, int32_t *idx) {
    for (int32_t k = 0; k < c->keys; k++) idx[k] = k;
    for (int32_t h = 0; h < c->p.heads; h++)
        for (int32_t t = 0; t < c->p.steps; t++) {
            size_t ht = (size_t)h * (size_t)c->p.steps + (size_t)t;
            attend(c, c->logits + ht * (size_t)c->keys,
                   c->v + (size_t)h * (size_t)c->keys * (size_t)c->d_head, idx,
                   c->p.prompt_len + t + 1, c->dense + ht * (size_t)c->d_head);
        }
}

flexdiag_status flexdiag__synth_ctx_create(const flexdiag_synth_params *p, int32_t d_head,
                                           flexdiag_synth_ctx **out) {
    *out = NULL;
    FLEXDIAG_TRY(flexdiag__synth_check(p));
    FLEXDIAG_TRY(synth_range("--d-head", d_head, 1, 4096));
    flexdiag_synth_ctx *c = calloc(1, sizeof *c);
    if (!c) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "synthetic model: out of host memory");
    c->p = *p;
    c->d_head = d_head;
    c->keys = p->prompt_len + p->steps;
    size_t hk = (size_t)p->heads * (size_t)c->keys;
    size_t n_logits = (size_t)p->heads * (size_t)p->steps * (size_t)c->keys;
    c->logits = malloc(n_logits * sizeof(float));
    c->v = malloc(hk * (size_t)d_head * sizeof(float));
    c->dense = malloc((size_t)p->heads * (size_t)p->steps * (size_t)d_head * sizeof(double));
    int32_t *idx = malloc((size_t)c->keys * sizeof(int32_t));
    if (!c->logits || !c->v || !c->dense || !idx) {
        free(idx);
        flexdiag__synth_ctx_destroy(c);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "synthetic model: cannot allocate %zu MiB "
                             "for W %d, %d heads", (n_logits * 4 + hk * (size_t)d_head * 4) >> 20,
                             (int)p->grid_w, (int)p->heads);
    }
    flexdiag__synth_fill(p, c->logits);
    synth_values(c);
    synth_dense(c, idx);
    free(idx);
    *out = c;
    return FLEXDIAG_OK;
}

void flexdiag__synth_ctx_destroy(flexdiag_synth_ctx *c) {
    if (!c) return;
    free(c->logits);
    free(c->v);
    free(c->dense);
    free(c);
}

/* Relative L2 distance of o from the dense output ref (absolute when ref is 0). */
static double rel_err(const double *o, const double *ref, int32_t d) {
    double num = 0.0, den = 0.0;
    for (int32_t j = 0; j < d; j++) {
        num += (o[j] - ref[j]) * (o[j] - ref[j]);
        den += ref[j] * ref[j];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Per step: replay, then every head's output over prompt + attended vs dense. */
static void synth_score(const flexdiag_synth_ctx *c, flexdiag_kvp_replay *r, int32_t *idx,
                        double *o, flexdiag_synth_fidelity *out) {
    int32_t lp = c->p.prompt_len;
    double sum = 0.0;
    for (int32_t k = 0; k < lp; k++) idx[k] = k;
    for (int32_t t = 0; t < c->p.steps; t++) {
        flexdiag__kvp_replay_step(r, t, c->logits);
        for (int32_t h = 0; h < c->p.heads; h++) {
            size_t ht = (size_t)h * (size_t)c->p.steps + (size_t)t;
            const int32_t *att = r->att + (size_t)h * (size_t)r->ms;
            for (int32_t j = 0; j < r->ns[h]; j++) idx[lp + j] = lp + att[j];
            attend(c, c->logits + ht * (size_t)c->keys,
                   c->v + (size_t)h * (size_t)c->keys * (size_t)c->d_head, idx, lp + r->ns[h], o);
            double e = rel_err(o, c->dense + ht * (size_t)c->d_head, c->d_head);
            sum += e;
            out->attn_err_max = e > out->attn_err_max ? e : out->attn_err_max;
        }
    }
    out->attn_err = sum / ((double)c->p.steps * (double)c->p.heads);
}

flexdiag_status flexdiag__synth_run(const flexdiag_synth_ctx *c, const flexdiag_kvp_params *kp,
                                    flexdiag_synth_fidelity *out) {
    memset(out, 0, sizeof *out);
    if (kp->l_dec != c->p.steps)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "synthetic fidelity: policy resolved for "
                             "L_dec %d but the grid has %d steps", (int)kp->l_dec,
                             (int)c->p.steps);
    flexdiag_kvp_replay *r = NULL;
    FLEXDIAG_TRY(flexdiag__kvp_replay_create(kp, c->p.heads, c->p.prompt_len, &r));
    int32_t *idx = malloc((size_t)c->keys * sizeof(int32_t));
    double *o = malloc((size_t)c->d_head * sizeof(double));
    if (!idx || !o) {
        free(idx);
        free(o);
        flexdiag__kvp_replay_destroy(r);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "synthetic fidelity: out of host memory");
    }
    synth_score(c, r, idx, o, out);
    /* resident rows never shrink with t: the last step is the peak */
    out->resident_rows = c->p.prompt_len + flexdiag__kvp_resident_rows(&r->p, c->p.steps - 1);
    out->resident_bytes = (uint64_t)out->resident_rows * (uint64_t)c->p.heads * 2u *
                          (uint64_t)c->d_head * 2u;
    out->evictions = flexdiag__kvp_evictions(r->kvp);
    free(idx);
    free(o);
    flexdiag__kvp_replay_destroy(r);
    return FLEXDIAG_OK;
}
