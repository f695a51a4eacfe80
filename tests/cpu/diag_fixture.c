/*
 * diag_fixture.c - the fused-Diagonal fixture, runner and argmin oracle of the CPU kernel tests
 * (see diag_fixture.h).
 */
#include "diag_fixture.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define LAG_GUARD 64 /* known int16 values on each side of a lag buffer */

/* ---- fixture ---- */

/* Fisher-Yates: out[0..n) = a random permutation of 0..n-1. */
static void permute(tu_rng *r, int32_t *out, int32_t n) {
    for (int32_t i = 0; i < n; i++) out[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)tu_rng_int(r, 0, i), t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

/* n_slots of list li by its kind (see diag_fixture.h). */
static int32_t list_len(int64_t li, int32_t a, int32_t base) {
    switch (li % 4) {
    case 0: return base + a;
    case 1: return base + 1 + (a - 1) / 2; /* needs a >= 3 to be partial */
    case 2: return base;
    default: return base + 1;
    }
}

/* Distinct random lags < 30000 for one list. */
static void random_lags(tu_rng *r, int16_t *lag, int32_t a) {
    for (int32_t e = 0; e < a; e++) {
        int dup;
        do {
            lag[e] = (int16_t)tu_rng_int(r, 0, 29999);
            dup = 0;
            for (int32_t j = 0; j < e; j++) dup |= lag[j] == lag[e];
        } while (dup);
    }
}

/* Positive values |N(0,1)|·scale + 0.1·scale into x (n). */
static void fill_positive(tu_rng *r, float *x, int32_t n, float scale) {
    for (int32_t i = 0; i < n; i++) x[i] = (float)((fabs(tu_rng_normal(r)) + 0.1) * scale);
}

/* Structured list li: positive queries, candidate K rows alpha_e·w with distinct alphas in
 * [-0.75, 0.25·(n - 1)] and, for n >= 2, two random entries tied at alpha -2 (the minimum). */
static void structure_list(df_fix *d, tu_rng *r, int64_t li, int32_t *perm, float *w) {
    const flexdiag_attn_args *a = &d->f.a;
    int32_t g = a->h_q / a->h_kv, ns = a->n_slots[li], n = ns - a->diag_base;
    int64_t s = li / a->h_kv, h = li % a->h_kv, block = (int64_t)a->p_cap + a->ring;
    fill_positive(r, d->f.qkv_dec + s * d->f.width + h * g * a->d_h, g * a->d_h, 1.0f);
    fill_positive(r, w, a->d_h, 0.1f); /* keeps |logits| within a few units */
    permute(r, perm, n > 0 ? n : 1);
    int32_t e1 = -1, e2 = -1;
    if (n >= 2) {
        e1 = (int32_t)tu_rng_int(r, 0, n - 1);
        e2 = (e1 + (int32_t)tu_rng_int(r, 1, n - 1)) % n;
    }
    for (int32_t e = 0; e < n; e++) {
        float alpha = e == e1 || e == e2 ? -2.0f : 0.25f * (float)perm[e] - 0.75f;
        int32_t slot = a->slots[li * a->max_slots + ns - 1 - e];
        float *k = d->f.k + (li * block + a->p_cap + slot) * a->d_h;
        for (int32_t i = 0; i < a->d_h; i++) k[i] = alpha * w[i];
    }
    d->tie[2 * li] = e1;
    d->tie[2 * li + 1] = e2;
}

void df_init(df_fix *d, const df_case *c, int structured, uint64_t seed) {
    int32_t max_slots = c->base + c->a, ring = max_slots + 3;
    ch_attn_case cc = {c->n_seq, c->h_q, c->h_kv, c->d_h, c->p_cap, ring, max_slots};
    memset(d, 0, sizeof *d);
    ch_attn_fix_init(&d->f, &cc, seed);
    tu_rng r;
    tu_rng_seed(&r, seed ^ 0xD1A6);
    int64_t n_lists = (int64_t)c->n_seq * c->h_kv;
    d->n_lag = n_lists * c->a;
    d->lag0 = malloc((size_t)d->n_lag * sizeof *d->lag0);
    d->tie = malloc((size_t)(2 * n_lists) * sizeof *d->tie);
    d->next = malloc((size_t)c->n_seq * sizeof *d->next);
    int32_t *perm = malloc((size_t)ring * sizeof *perm);
    float *w = malloc((size_t)c->d_h * sizeof *w);
    assert_true(d->lag0 && d->tie && d->next && perm && w);
    for (int32_t s = 0; s < c->n_seq; s++) d->next[s] = DF_NEXT + s;
    d->f.a.diag_a = c->a;
    d->f.a.diag_base = c->base;
    d->f.a.diag_next = d->next;
    for (int64_t li = 0; li < n_lists; li++) {
        d->f.n_slots[li] = list_len(li, c->a, c->base);
        permute(&r, perm, ring); /* distinct ring rows: sinks and candidates never share one */
        memcpy(d->f.slots + li * max_slots, perm, (size_t)d->f.n_slots[li] * sizeof *perm);
        random_lags(&r, d->lag0 + li * c->a, c->a);
        d->tie[2 * li] = d->tie[2 * li + 1] = -1;
        if (structured) structure_list(d, &r, li, perm, w);
    }
    free(perm);
    free(w);
}

void df_free(df_fix *d) {
    ch_attn_fix_free(&d->f);
    free(d->lag0);
    free(d->tie);
    free(d->next);
    memset(d, 0, sizeof *d);
}

/* ---- runner ---- */

/* The known value of lag guard i. */
static int16_t lag_guard(int64_t i) { return (int16_t)(-1000 - i); }

/* A copy of lag (n) between LAG_GUARD known int16 on each side. */
static int16_t *lag_guarded(const int16_t *lag, int64_t n) {
    int16_t *base = malloc((size_t)(n + 2 * LAG_GUARD) * sizeof *base);
    assert_non_null(base);
    for (int64_t i = 0; i < LAG_GUARD; i++) {
        base[i] = lag_guard(i);
        base[LAG_GUARD + n + i] = lag_guard(LAG_GUARD + i);
    }
    memcpy(base + LAG_GUARD, lag, (size_t)n * sizeof *lag);
    return base + LAG_GUARD;
}

static void lag_guard_check(const int16_t *p, int64_t n) {
    for (int64_t i = 0; i < LAG_GUARD; i++)
        if (p[i - LAG_GUARD] != lag_guard(i) || p[n + i] != lag_guard(LAG_GUARD + i))
            fail_msg("diag_lag: guard region overwritten at offset %lld", (long long)i);
}

df_out df_run(const flexdiag_kernels *K, flexdiag_stream *s, const df_fix *d, int with_logits) {
    flexdiag_attn_args a = d->f.a;
    int64_t n_hq = (int64_t)a.n_seq * a.h_q, n_log = n_hq * a.max_slots;
    df_out o = {ch_guarded(n_hq * a.d_h, 9.0f), with_logits ? ch_guarded(n_hq, 9.0f) : NULL,
                with_logits ? ch_guarded(n_log, 555.0f) : NULL, ch_guarded(n_log, 555.0f),
                lag_guarded(d->lag0, d->n_lag)};
    a.lse_out = o.lse;
    a.logits_out = o.logits;
    a.probs_out = o.probs;
    a.diag_lag = o.lag;
    assert_int_equal(K->attn_decode(o.out, d->f.qkv_dec, d->f.k, d->f.v, &a, s), FLEXDIAG_OK);
    ch_guard_check(o.out, n_hq * a.d_h, "diag decode out");
    if (o.lse) ch_guard_check(o.lse, n_hq, "diag decode lse");
    if (o.logits) ch_guard_check(o.logits, n_log, "diag decode logits");
    ch_guard_check(o.probs, n_log, "diag decode probs");
    lag_guard_check(o.lag, d->n_lag);
    return o;
}

void df_out_free(df_out *o) {
    ch_guarded_free(o->out);
    ch_guarded_free(o->lse);
    ch_guarded_free(o->logits);
    ch_guarded_free(o->probs);
    if (o->lag) free(o->lag - LAG_GUARD);
    memset(o, 0, sizeof *o);
}

/* ---- oracle ---- */

void df_expect(const df_fix *d, const float *logits, int16_t *want) {
    const flexdiag_attn_args *a = &d->f.a;
    int32_t g = a->h_q / a->h_kv;
    memcpy(want, d->lag0, (size_t)d->n_lag * sizeof *want);
    for (int64_t li = 0; li < (int64_t)a->n_seq * a->h_kv; li++) {
        int32_t ns = a->n_slots[li], best = -1, next = d->next[li / a->h_kv];
        const int16_t *lag = d->lag0 + li * a->diag_a;
        const float *z = logits + ((li / a->h_kv) * a->h_q + (li % a->h_kv) * g) * a->max_slots;
        float best_s = 0.0f;
        for (int32_t e = 0; next >= 0 && e < ns - a->diag_base; e++) {
            float sc = -INFINITY;
            for (int32_t q = 0; q < g; q++)
                sc = fmaxf(sc, z[(int64_t)q * a->max_slots + ns - 1 - e]);
            if (best < 0 || sc < best_s || (sc == best_s && lag[e] > lag[best])) {
                best = e;
                best_s = sc;
            }
        }
        if (best >= 0) want[li * a->diag_a + best] = (int16_t)next;
    }
}
