/*
 * calib_util.c - random tables, the probability source and the reference driver of
 * calib_util.h.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "calib_util.h"

flexdiag_kvp_calib *cu_table(tu_rng *r, int32_t n_layers, int32_t h_q, int32_t h_kv,
                             int32_t w_s, int32_t l_dec) {
    flexdiag_kvp_calib *t = NULL;
    assert_int_equal(flexdiag__kvp_calib_alloc(n_layers, h_q, h_kv, l_dec, &t), FLEXDIAG_OK);
    t->w_s = w_s, t->t0 = l_dec / 2, t->t_end = l_dec - 1, t->pairs = 1, t->n_cal = 1;
    double *w = malloc((size_t)l_dec * sizeof *w);
    for (int32_t row = 0; row < n_layers * h_q; row++) {
        double sum = 0, a = 1.0 + 6.0 * tu_rng_uniform(r); /* how peaked the row is */
        for (int32_t l = 0; l < l_dec; l++) sum += w[l] = pow(tu_rng_uniform(r), a);
        for (int32_t l = 0; l < l_dec; l++)
            t->P[(size_t)row * (size_t)l_dec + (size_t)l] = (float)(w[l] / sum);
        t->V[row] = exp(-12.0 * tu_rng_uniform(r));
    }
    free(w);
    return t;
}

float cu_prob(uint64_t seed, int32_t t, int32_t p, int32_t q) {
    uint64_t x = seed ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)p << 20) ^
                 ((uint64_t)q << 40);
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    return (float)(x % 8) / 64.0f;
}

/* A semantic reference list: in[p] when p is attended, acc[p] its score. */
typedef struct cu_ref {
    unsigned char in[CU_MAXR];
    float acc[CU_MAXR];
    int32_t n;
} cu_ref;

/* Step t of a semantic list of b slots: the victim of A_{t-1} when full (1 returned), then t. */
static int sem_step(cu_ref *r, int32_t t, int32_t b) {
    int evicted = 0;
    if (r->n == b) {
        int32_t v = -1;
        for (int32_t p = 0; p < t - 1; p++)
            if (r->in[p] && (v < 0 || r->acc[p] < r->acc[v])) v = p;
        r->in[v] = 0, r->n--, evicted = 1;
    }
    r->in[t] = 1, r->acc[t] = 0.0f, r->n++;
    return evicted;
}

/* The reference set of (type, list) at step t into exp (ascending); evictions into *ev. */
static int32_t ref_set(const flexdiag_kvp_heads *hd, int type, const int16_t *lags, cu_ref *r,
                       int32_t t, int32_t *exp, uint64_t *ev) {
    int32_t n = 0;
    if (type == FLEXDIAG_HEAD_WINDOW) {
        for (int32_t p = t - hd->n_att + 1 > 0 ? t - hd->n_att + 1 : 0; p <= t; p++) exp[n++] = p;
        *ev += t >= hd->n_att;
    } else if (type == FLEXDIAG_HEAD_LAGS) {
        unsigned char in[CU_MAXR] = {0};
        for (int32_t p = 0; p <= t && p < 4; p++) in[p] = 1;
        for (int32_t j = 0; j < hd->n_lags; j++)
            if (t - lags[j] >= 4) in[t - lags[j]] = 1;
        for (int32_t p = 0; p <= t; p++)
            if (in[p]) exp[n++] = p;
        *ev += t >= 4 + hd->lag_ring;
    } else {
        *ev += (uint64_t)sem_step(r, t, hd->b_c);
        for (int32_t p = 0; p <= t; p++)
            if (r->in[p]) exp[n++] = p;
    }
    return n;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

typedef struct cu_run_state {
    const flexdiag_kvp_heads *hd;
    flexdiag_kvp_params p;
    flexdiag_kvp *k;
    int32_t ms, g;
    int32_t *ws, *ns, *sl;
    float *pr;
    cu_ref *refs;
    uint64_t seed, ev;
} cu_run_state;

/* One list after plan(t): its set against the reference, its write slot, its probabilities. */
static void check_list(cu_run_state *st, int32_t l, int32_t s, int32_t h, int32_t t) {
    const flexdiag_kvp_heads *hd = st->hd;
    int32_t li = s * hd->h_kv + h, exp[CU_MAXR], got[CU_MAXR];
    int type = flexdiag__kvp_head_type(hd, l, h);
    cu_ref *r = &st->refs[((size_t)s * (size_t)hd->n_layers + (size_t)l) * (size_t)hd->h_kv + h];
    int32_t n = ref_set(hd, type, type == FLEXDIAG_HEAD_LAGS ? flexdiag__kvp_head_lags(hd, l, h)
                                                           : NULL, r, t, exp, &st->ev);
    assert_int_equal(st->ns[li], n);
    for (int32_t c = 0; c < n; c++) {
        int32_t slot = st->sl[(size_t)li * (size_t)st->ms + (size_t)c];
        got[c] = flexdiag__kvp_slot_pos(st->k, l, s, h, slot);
        assert_true(got[c] >= 0 && got[c] <= t);
        if (c > 0 && type != FLEXDIAG_HEAD_SEMANTIC) assert_true(got[c] > got[c - 1]);
        for (int32_t q = 0; q < st->g; q++)
            st->pr[((size_t)s * (size_t)st->p.h_q + (size_t)(h * st->g + q)) * (size_t)st->ms +
                   (size_t)c] = cu_prob(st->seed + (uint64_t)(s * 7 + l), t, got[c], h * st->g + q);
    }
    qsort(got, (size_t)n, sizeof *got, cmp_i32);
    assert_memory_equal(got, exp, (size_t)n * sizeof *got);
    int32_t ws = st->ws[li], common = flexdiag__kvp_write_slot(&st->p, t);
    assert_int_equal(flexdiag__kvp_slot_pos(st->k, l, s, h, ws), t);
    if (common >= 0) assert_int_equal(ws, common);
    assert_true(ws < flexdiag__kvp_resident_rows(&st->p, t));
}

/* The semantic references' scores after step t of layer l. */
static void score_refs(cu_run_state *st, int32_t l, int32_t t) {
    const flexdiag_kvp_heads *hd = st->hd;
    for (int32_t s = 0; s < st->p.n_seq; s++)
        for (int32_t h = 0; h < hd->h_kv; h++) {
            if (flexdiag__kvp_head_type(hd, l, h) != FLEXDIAG_HEAD_SEMANTIC) continue;
            cu_ref *r = &st->refs[((size_t)s * (size_t)hd->n_layers + (size_t)l) *
                                      (size_t)hd->h_kv + h];
            for (int32_t p = 0; p <= t; p++) {
                if (!r->in[p]) continue;
                float gs = 0.0f;
                for (int32_t q = 0; q < st->g; q++)
                    gs += cu_prob(st->seed + (uint64_t)(s * 7 + l), t, p, h * st->g + q);
                r->acc[p] += gs;
            }
        }
}

uint64_t cu_run(const flexdiag_kvp_heads *hd, int32_t n_seq, int32_t h_q, uint64_t seed) {
    cu_run_state st = {.hd = hd, .seed = seed, .g = h_q / hd->h_kv};
    st.p = (flexdiag_kvp_params){.kind = hd->kind, .n_att = hd->n_att, .l_dec = hd->l_dec,
                                 .n_seq = n_seq, .n_layers = hd->n_layers, .h_q = h_q,
                                 .h_kv = hd->h_kv, .w_s = hd->w_s, .heads = hd};
    assert_true(hd->l_dec <= CU_MAXR);
    assert_int_equal(flexdiag__kvp_create(&st.p, &st.k), FLEXDIAG_OK);
    st.ms = flexdiag__kvp_max_slots(&st.p);
    assert_int_equal(st.ms, hd->max_slots);
    assert_int_equal(flexdiag__kvp_ring_rows(&st.p), hd->ring);
    size_t lists = (size_t)n_seq * (size_t)hd->h_kv;
    st.ws = malloc(lists * 4), st.ns = malloc(lists * 4);
    st.sl = malloc(lists * (size_t)st.ms * 4);
    st.pr = malloc((size_t)n_seq * (size_t)h_q * (size_t)st.ms * 4);
    st.refs = calloc((size_t)n_seq * (size_t)hd->n_layers * (size_t)hd->h_kv, sizeof *st.refs);
    for (int32_t t = 0; t < hd->l_dec; t++)
        for (int32_t l = 0; l < hd->n_layers; l++) {
            flexdiag__kvp_plan(st.k, l, t, 0, n_seq, st.ws, st.sl, st.ns);
            for (int32_t s = 0; s < n_seq; s++)
                for (int32_t h = 0; h < hd->h_kv; h++) check_list(&st, l, s, h, t);
            if (flexdiag__kvp_needs_scores(st.k, t))
                flexdiag__kvp_update(st.k, l, t, 0, n_seq, NULL, NULL, st.pr);
            score_refs(&st, l, t);
        }
    assert_int_equal(flexdiag__kvp_evictions(st.k), st.ev);
    free(st.ws), free(st.ns), free(st.sl), free(st.pr), free(st.refs);
    flexdiag__kvp_destroy(st.k);
    return st.ev;
}
