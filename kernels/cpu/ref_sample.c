/*
 * ref_sample.c - classifier-free guidance mix and token sampling (the definition the CUDA
 * sampler reproduces).
 *
 * sample, per row i of logits (n, V), with row i's own settings and key rows[i] (kernels.h
 * flexdiag_sample_row; every row may belong to another request):
 *   0. req < 0: the row is skipped: ids[i] is left as it is and its logits are not read (nor its
 *      settings checked). Settings out of range (temperature not finite or <= 0, top_k < 0,
 *      top_p not > 0) are FLEXDIAG_ERR_INVALID_ARG naming the row and the field, before any
 *      row is drawn.
 *   1. l = logit / T in fp32 (T > 0). A NaN/Inf logit, or an l that overflows, is
 *      FLEXDIAG_ERR_NUMERIC naming the row.
 *   2. top_k > 0 and < V: keep the top_k largest l; equal l keep the lower id.
 *   3. p = softmax over the kept ids: e = expf(l − max) in fp32, normaliser Σe in double,
 *      p = (float)(e / Σe).
 *   4. top_p < 1: order the kept ids by p descending (equal p: lower id first) and keep the
 *      shortest prefix whose cumulative p (double) reaches top_p; at least one id; all of them
 *      if rounding keeps the sum below top_p.
 *   5. u = flexdiag__rng_uniform(seed, req, step); walk the kept ids in ascending id order
 *      accumulating p in double and return id0 + the first id whose cumulative sum exceeds
 *      u · (Σ p over the kept ids, summed in the same order); if rounding leaves none, the
 *      largest kept id.
 * The draw depends only on the row's (seed, request, step), its settings and its logits, never
 * on the batch or thread count. Ascending-id order for the walk (rather than probability order)
 * makes it independent of how a backend sorts. Sorting here is qsort of (value, id) pairs with
 * a total order, so no step depends on qsort's instability; rows without top-k/top-p never
 * sort.
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

/* Steps 2-5 for one row whose values c hold l, with settings r; u is the row's uniform draw. */
static int32_t sample_row(cand *c, int64_t V, const flexdiag_sample_row *r, double u) {
    int64_t n = V;
    int sorted = 0;
    if (r->top_k > 0 && r->top_k < V) {
        qsort(c, (size_t)V, sizeof *c, cmp_value_desc);
        n = r->top_k;
        sorted = 1;
    }
    softmax_kept(c, n);
    if (r->top_p < 1.0f) {
        n = top_p_prefix(c, n, r->top_p);
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

/* Step 0: INVALID_ARG for the settings of row i (not skipped) that sample cannot use. */
static flexdiag_status check_row(const flexdiag_sample_row *r, int64_t i) {
    if (!isfinite(r->temperature) || !(r->temperature > 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu sample: row %lld: temperature = %g: need a finite value > 0",
                             (long long)i, (double)r->temperature);
    if (r->top_k < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu sample: row %lld: top_k = %d: need >= 0 (0 = off)", (long long)i,
                             r->top_k);
    if (!(r->top_p > 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu sample: row %lld: top_p = %g: need > 0 (>= 1 = off)",
                             (long long)i, (double)r->top_p);
    return FLEXDIAG_OK;
}

/* INVALID_ARG for sizes, pointers or row settings sample cannot use. */
static flexdiag_status check_sample(const int32_t *ids, const float *logits, int64_t n, int64_t V,
                                    const flexdiag_sample_row *rows) {
    if (n < 0 || V < 1 || V > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu sample: n = %lld, V = %lld: need n >= 0 and 1 <= V <= 2^31-1",
                             (long long)n, (long long)V);
    if (n > 0 && (!ids || !logits || !rows))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu sample: %s is NULL",
                             !ids ? "ids" : !logits ? "logits" : "rows");
    for (int64_t i = 0; i < n; i++)
        if (rows[i].req >= 0) FLEXDIAG_TRY(check_row(&rows[i], i));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_sample(int32_t *ids, const float *logits, int64_t n, int64_t V,
                                         const flexdiag_sample_row *rows, flexdiag_stream *s) {
    FLEXDIAG_TRY(check_sample(ids, logits, n, V, rows));
    if (n == 0) return FLEXDIAG_OK;
    void *buf, *tmp;
    FLEXDIAG_TRY(flexdiag__cpu_scratch(s, (size_t)V * sizeof(cand), &buf, &tmp));
    cand *c = buf;
    flexdiag_status st = FLEXDIAG_OK;
    for (int64_t i = 0; i < n && st == FLEXDIAG_OK; i++) {
        const flexdiag_sample_row *r = &rows[i];
        if (r->req < 0) continue; /* a free slot or a forced token */
        st = scale_row(c, logits + i * V, V, r->temperature, i);
        if (st != FLEXDIAG_OK) break;
        double u = flexdiag__rng_uniform(r->seed, (uint64_t)r->req, (uint64_t)r->step);
        ids[i] = r->id0 + sample_row(c, V, r, u);
    }
    free(tmp);
    return st;
}

/* ---- a draw's distribution on the host (speculative decoding, runtime/engine/sjd.c) ---- */

flexdiag_status flexdiag__sample_probs(float *p, const float *logits, int64_t V,
                                       const flexdiag_sample_row *r, void *scratch) {
    cand *c = scratch;
    FLEXDIAG_TRY(check_row(r, r->req));
    FLEXDIAG_TRY(scale_row(c, logits, V, r->temperature, r->req));
    int64_t n = V;
    if (r->top_k > 0 && r->top_k < V) { /* steps 2-4 exactly as sample_row takes them */
        qsort(c, (size_t)V, sizeof *c, cmp_value_desc);
        n = r->top_k;
    }
    softmax_kept(c, n);
    if (r->top_p < 1.0f) n = top_p_prefix(c, n, r->top_p);
    memset(p, 0, (size_t)V * sizeof *p);
    for (int64_t j = 0; j < n; j++) p[c[j].id] = c[j].v;
    return FLEXDIAG_OK;
}

int32_t flexdiag__sample_walk(const float *p, int64_t V, double u) {
    double total = 0.0, cum = 0.0;
    int32_t last = 0;
    for (int64_t j = 0; j < V; j++) total += p[j];
    double target = u * total;
    for (int64_t j = 0; j < V; j++) {
        if (!(p[j] > 0.0f)) continue;
        cum += p[j];
        last = (int32_t)j;
        if (cum > target) return (int32_t)j;
    }
    return last;
}
