/*
 * ref_sample.c - classifier-free guidance mix and token sampling (the definition the CUDA
 * sampler reproduces).
 *
 * sample, per row i of logits (n, V):
 *   1. l = logit / T in fp32 (T > 0). A NaN/Inf logit, or an l that overflows, is
 *      FLEXDIAG_ERR_NUMERIC naming the row.
 *   2. top_k > 0 and < V: keep the top_k largest l; equal l keep the lower id.
 *   3. p = softmax over the kept ids: e = expf(l − max) in fp32, normaliser Σe in double,
 *      p = (float)(e / Σe).
 *   4. top_p < 1: order the kept ids by p descending (equal p: lower id first) and keep the
 *      shortest prefix whose cumulative p (double) reaches top_p; at least one id; all of them
 *      if rounding keeps the sum below top_p.
 *   5. u = flexdiag__rng_uniform(seed, req0 + i, step); walk the kept ids in ascending id order
 *      accumulating p in double and return the first id whose cumulative sum exceeds
 *      u · (Σ p over the kept ids, summed in the same order); if rounding leaves none, the
 *      largest kept id.
 * The draw depends only on (seed, request, step) and the row's logits, never on the batch or
 * thread count. Ascending-id order for the walk (rather than probability order) makes it
 * independent of how a backend sorts. Sorting here is qsort of (value, id) pairs with a total
 * order, so no step depends on qsort's instability; rows without top-k/top-p never sort.
 */
#include <math.h>
#include <stdlib.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"

/* One candidate token: a value (scaled logit, then probability) and its id. */
typedef struct cand {
    float v;    /* l before the softmax, p after */
    int32_t id; /* token id */
} cand;

/* ---- CFG ---- */

flexdiag_status flexdiag__cpu_ref_cfg_combine(float *out, const float *logits, int64_t n_pairs,
                                              int64_t V, float w, flexdiag_stream *s) {
    (void)s;
    if (n_pairs < 0 || V < 0 || !isfinite(w))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu cfg_combine: n_pairs = %lld, V = %lld, w = %g: need sizes >= 0 "
                             "and a finite guidance weight",
                             (long long)n_pairs, (long long)V, (double)w);
    if (n_pairs == 0 || V == 0) return FLEXDIAG_OK;
    if (!out || !logits)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu cfg_combine: %s is NULL",
                             out ? "logits" : "out");
    for (int64_t i = 0; i < n_pairs; i++)
        for (int64_t j = 0; j < V; j++) {
            float c = logits[2 * i * V + j], u = logits[(2 * i + 1) * V + j];
            out[i * V + j] = u + w * (c - u);
        }
    return FLEXDIAG_OK;
}

/* ---- sampling ---- */

/* qsort orders: by value descending then id ascending; by id ascending. */
static int cmp_value_desc(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int cmp_id(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

/* Step 1: c[j] = (logit_j / T, j); NUMERIC when a value is not finite. */
static flexdiag_status scale_row(cand *c, const float *logits, int64_t V, float T, int64_t row) {
    for (int64_t j = 0; j < V; j++) {
        c[j].v = logits[j] / T;
        c[j].id = (int32_t)j;
        if (!isfinite(c[j].v))
            return flexdiag__err(FLEXDIAG_ERR_NUMERIC,
                                 "cpu sample: row %lld: logit[%lld] = %g%s is not finite: the "
                                 "model produced NaN/Inf",
                                 (long long)row, (long long)j, (double)logits[j],
                                 isfinite(logits[j]) ? " / temperature" : "");
    }
    return FLEXDIAG_OK;
}

/* Step 3: replace the values of c[0..n) by their softmax probabilities. */
static void softmax_kept(cand *c, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = fmaxf(m, c[j].v);
    double z = 0.0;
    for (int64_t j = 0; j < n; j++) {
        c[j].v = expf(c[j].v - m);
        z += c[j].v;
    }
    for (int64_t j = 0; j < n; j++) c[j].v = (float)(c[j].v / z);
}

/* Step 4: sort c[0..n) by p descending and return the length of the top_p prefix. */
static int64_t top_p_prefix(cand *c, int64_t n, float top_p) {
    qsort(c, (size_t)n, sizeof *c, cmp_value_desc);
    double cum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        cum += c[j].v;
        if (cum >= top_p) return j + 1;
    }
    return n;
}

/* Steps 2-5 for one row whose values c hold l; u is the row's uniform draw. */
static int32_t sample_row(cand *c, int64_t V, const flexdiag_sample_params *p, double u) {
    int64_t n = V;
    int sorted = 0;
    if (p->top_k > 0 && p->top_k < V) {
        qsort(c, (size_t)V, sizeof *c, cmp_value_desc);
        n = p->top_k;
        sorted = 1;
    }
    softmax_kept(c, n);
    if (p->top_p < 1.0f) {
        n = top_p_prefix(c, n, p->top_p);
        sorted = 1;
    }
    if (sorted) qsort(c, (size_t)n, sizeof *c, cmp_id);
    double total = 0.0, cum = 0.0;
    for (int64_t j = 0; j < n; j++) total += c[j].v;
    double target = u * total;
    for (int64_t j = 0; j < n; j++) {
        cum += c[j].v;
        if (cum > target) return c[j].id;
    }
    return c[n - 1].id;
}

/* INVALID_ARG for sizes or parameters sample cannot use. */
static flexdiag_status check_sample(const int32_t *ids, const float *logits, int64_t n, int64_t V,
                                    const flexdiag_sample_params *p) {
    if (!p) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu sample: params are NULL");
    if (n < 0 || V < 1 || V > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu sample: n = %lld, V = %lld: need n >= 0 and 1 <= V <= 2^31-1",
                             (long long)n, (long long)V);
    if (!(p->temperature > 0.0f) || p->top_k < 0 || !(p->top_p > 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu sample: temperature = %g, top_k = %d, top_p = %g: need "
                             "temperature > 0, top_k >= 0 (0 = off), top_p > 0 (>= 1 = off)",
                             (double)p->temperature, p->top_k, (double)p->top_p);
    if (n > 0 && (!ids || !logits))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu sample: %s is NULL",
                             ids ? "logits" : "ids");
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_sample(int32_t *ids, const float *logits, int64_t n, int64_t V,
                                         const flexdiag_sample_params *p, int64_t req0,
                                         int64_t step, flexdiag_stream *s) {
    FLEXDIAG_TRY(check_sample(ids, logits, n, V, p));
    if (n == 0) return FLEXDIAG_OK;
    void *buf, *tmp;
    FLEXDIAG_TRY(flexdiag__cpu_scratch(s, (size_t)V * sizeof(cand), &buf, &tmp));
    cand *c = buf;
    flexdiag_status st = FLEXDIAG_OK;
    for (int64_t i = 0; i < n && st == FLEXDIAG_OK; i++) {
        st = scale_row(c, logits + i * V, V, p->temperature, i);
        if (st != FLEXDIAG_OK) break;
        double u = flexdiag__rng_uniform(p->seed, (uint64_t)(req0 + i), (uint64_t)step);
        ids[i] = p->id0 + sample_row(c, V, p, u);
    }
    free(tmp);
    return st;
}
