/*
 * test_policy_baselines.c - Dense, SlidingWindow, StreamingLLM, H2O, TOVA and ALISA
 * (docs/policies.md §3) vs slow literal references written below in terms of sets of decode
 * positions (never slots), on many random configurations with forced logit ties, GQA groups,
 * several sequences and layers. Every step checks: the attended set equals the reference,
 * |ATT_t| = min(t+1, N_att), every attended slot holds a live token, the resident set equals the
 * reference's (count = flexdiag__kvp_resident_rows <= ring rows), and at the end the eviction
 * counter equals the reference's count. The references compute probabilities with the same fp32
 * operations (expf(z - lse), sums in ascending head order) so exact ties resolve identically.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "policy_harness.h"
#include "util.h"

#define MAXT 64 /* longest decode length of these tests */

typedef struct bcfg {
    flexdiag_kvp_params p;
    ph_logits lg;
} bcfg;

/* Reference state of one (seq, layer, KV head) for H2O or one (seq, layer) otherwise. */
typedef struct bref {
    uint8_t res[MAXT];       /* resident positions */
    float acc[MAXT];         /* h2o accumulated group probability */
    float val[MAXT][MAXT];   /* alisa r_tau(p): head-summed probability of p at step tau */
    int32_t pending;         /* victim chosen at the previous step, -1 = none */
    uint64_t evictions;      /* rows evicted (per KV head: tova counts h_kv per eviction) */
} bref;

static int32_t range(int32_t lo, int32_t hi, int32_t *out, int32_t n) {
    for (int32_t p = lo < 0 ? 0 : lo; p <= hi; p++) out[n++] = p;
    return n;
}

static int32_t resident_list(const bref *r, int32_t t, int32_t *out) {
    int32_t n = 0;
    for (int32_t p = 0; p <= t; p++)
        if (r->res[p]) out[n++] = p;
    return n;
}

/* lse of every query head over the attended set att (ascending). */
static void row_lse(const bcfg *c, int32_t s, int32_t l, int32_t t, const int32_t *att,
                    int32_t n, float *lse) {
    for (int32_t hq = 0; hq < c->p.h_q; hq++) lse[hq] = ph_lse(&c->lg, s, l, t, hq, att, n);
}

/* Full-row probability of position pos for query head hq. */
static float prob(const bcfg *c, int32_t s, int32_t l, int32_t t, int32_t hq, const float *lse,
                  int32_t pos) {
    return expf(ph_logit(&c->lg, s, l, t, hq, pos) - lse[hq]);
}

/* Evict last step's victim, then make token t resident. */
static void admit(bref *r, int32_t t, uint64_t rows) {
    if (r->pending >= 0) {
        r->res[r->pending] = 0;
        r->evictions += rows;
        r->pending = -1;
    }
    r->res[t] = 1;
    r->acc[t] = 0.0f;
}

/* H2O real-drop: heavy floor(N/2), recent R = N - heavy; victim argmin (acc, pos). */
static int32_t ref_h2o(const bcfg *c, bref *r, int32_t s, int32_t l, int32_t t, int32_t h,
                       int32_t *out) {
    int32_t g = c->p.h_q / c->p.h_kv, na = c->p.n_att, recent = na - na / 2;
    float lse[16];
    admit(r, t, 1);
    int32_t n = resident_list(r, t, out);
    row_lse(c, s, l, t, out, n, lse);
    for (int32_t i = 0; i < n; i++) {
        float gs = 0.0f;
        for (int32_t q = 0; q < g; q++) gs += prob(c, s, l, t, h * g + q, lse, out[i]);
        r->acc[out[i]] += gs;
    }
    if (n == na)
        for (int32_t i = 0; i < n; i++) {
            int32_t p = out[i], v = r->pending;
            if (p <= t - recent + 1 && (v < 0 || r->acc[p] < r->acc[v])) r->pending = p;
        }
    return n;
}

/* TOVA: victim argmin over all resident of the head-mean probability (tie -> older). */
static int32_t ref_tova(const bcfg *c, bref *r, int32_t s, int32_t l, int32_t t, int32_t *out) {
    admit(r, t, (uint64_t)c->p.h_kv);
    int32_t n = resident_list(r, t, out);
    if (n < c->p.n_att) return n;
    float best = 0.0f, lse[16];
    row_lse(c, s, l, t, out, n, lse);
    for (int32_t i = 0; i < n; i++) {
        float sc = 0.0f;
        for (int32_t hq = 0; hq < c->p.h_q; hq++) sc += prob(c, s, l, t, hq, lse, out[i]);
        sc /= (float)c->p.h_q;
        if (r->pending < 0 || sc < best) {
            r->pending = out[i];
            best = sc;
        }
    }
    return n;
}

/* ALISA: recent k_l lags + top k_g of S over 0..t-k_l (S desc, newer first on ties). */
static int32_t ref_alisa(const bcfg *c, bref *r, int32_t s, int32_t l, int32_t t, int32_t *out) {
    int32_t na = c->p.n_att, kl = (na + 1) / 2, kg = na - kl, ncand = t - kl + 1, n = 0;
    uint8_t chosen[MAXT] = {0};
    if (ncand <= kg) {
        n = range(0, ncand - 1, out, 0);
    } else {
        float sc[MAXT];
        for (int32_t p = 0; p < ncand; p++) {
            sc[p] = 0.0f;
            for (int32_t tau = t - kl < 0 ? 0 : t - kl; tau < t; tau++) sc[p] += r->val[tau][p];
        }
        for (int32_t k = 0; k < kg; k++) {
            int32_t best = -1;
            for (int32_t p = ncand - 1; p >= 0; p--) /* newest first: ties keep the newer */
                if (!chosen[p] && (best < 0 || sc[p] > sc[best])) best = p;
            chosen[best] = 1;
        }
        for (int32_t p = 0; p < ncand; p++)
            if (chosen[p]) out[n++] = p;
    }
    n = range(t - kl + 1, t, out, n);
    float lse[16];
    row_lse(c, s, l, t, out, n, lse);
    for (int32_t i = 0; i < n; i++) {
        float v = 0.0f;
        for (int32_t hq = 0; hq < c->p.h_q; hq++) v += prob(c, s, l, t, hq, lse, out[i]);
        r->val[t][out[i]] = v;
    }
    return n;
}

/* Attended positions of (s, l, h) at step t; res (resident set) filled for checking. */
static int32_t ref_step(const bcfg *c, bref *r, int32_t s, int32_t l, int32_t t, int32_t h,
                        int32_t *out, int32_t *res, int32_t *n_res) {
    int32_t na = c->p.n_att, n;
    switch (c->p.kind) {
    case FLEXDIAG_POLICY_WINDOW:
        n = range(t - na + 1, t, out, 0);
        *n_res = range(t - na + 1, t, res, 0);
        return n;
    case FLEXDIAG_POLICY_STREAMING:
        n = t < na ? range(0, t, out, 0) : range(t - na + 5, t, out, range(0, 3, out, 0));
        *n_res = t < na ? range(0, t, res, 0) : range(t - na + 5, t, res, range(0, 3, res, 0));
        return n;
    case FLEXDIAG_POLICY_H2O: n = ref_h2o(c, r, s, l, t, h, out); break;
    case FLEXDIAG_POLICY_TOVA: n = ref_tova(c, r, s, l, t, out); break;
    case FLEXDIAG_POLICY_ALISA: n = ref_alisa(c, r, s, l, t, out); break;
    default: n = range(0, t, out, 0); break;
    }
    if (c->p.kind == FLEXDIAG_POLICY_H2O || c->p.kind == FLEXDIAG_POLICY_TOVA)
        *n_res = resident_list(r, t, res);
    else
        *n_res = range(0, t, res, 0); /* dense, alisa: everything stays */
    return n;
}

static uint64_t ref_evictions(const bcfg *c, const bref *refs, int32_t n_refs) {
    int32_t over = c->p.l_dec - c->p.n_att;
    uint64_t rows = (uint64_t)c->p.n_seq * (uint64_t)c->p.n_layers * (uint64_t)c->p.h_kv;
    switch (c->p.kind) {
    case FLEXDIAG_POLICY_WINDOW:
    case FLEXDIAG_POLICY_STREAMING: return over > 0 ? (uint64_t)over * rows : 0;
    case FLEXDIAG_POLICY_H2O:
    case FLEXDIAG_POLICY_TOVA: {
        uint64_t sum = 0;
        for (int32_t i = 0; i < n_refs; i++) sum += refs[i].evictions;
        return sum;
    }
    default: return 0;
    }
}

static void run_config(const bcfg *c) {
    ph_state st;
    assert_int_equal(ph_init(&st, &c->p, &c->lg), 0);
    int per_head = c->p.kind == FLEXDIAG_POLICY_H2O;
    int32_t n_refs = c->p.n_seq * c->p.n_layers * (per_head ? c->p.h_kv : 1);
    bref *refs = calloc((size_t)n_refs, sizeof *refs);
    for (int32_t i = 0; i < n_refs; i++) refs[i].pending = -1;
    int32_t want[MAXT], res[MAXT], got_res[MAXT], n_res = 0, n_got_res, n_want = 0;
    int32_t ring = flexdiag__kvp_ring_rows(&c->p);
    for (int32_t t = 0; t < c->p.l_dec; t++)
        for (int32_t l = 0; l < c->p.n_layers; l++) {
            ph_step(&st, l, t);
            for (int32_t s = 0; s < c->p.n_seq; s++)
                for (int32_t h = 0; h < c->p.h_kv; h++) {
                    int32_t li = s * c->p.n_layers + l, n_got;
                    bref *r = &refs[per_head ? li * c->p.h_kv + h : li];
                    if (!per_head && h > 0) r = NULL; /* per-layer state: step once */
                    const int32_t *got = ph_att(&st, s, h, &n_got);
                    if (r) n_want = ref_step(c, r, s, l, t, h, want, res, &n_res);
                    assert_int_equal(n_want, t + 1 < c->p.n_att ? t + 1 : c->p.n_att);
                    assert_int_equal(n_got, n_want);
                    assert_memory_equal(got, want, (size_t)n_got * sizeof(int32_t));
                    n_got_res = ph_resident(&st, l, s, h, got_res);
                    assert_true(n_got_res <= ring);
                    assert_int_equal(n_got_res, flexdiag__kvp_resident_rows(&c->p, t));
                    assert_int_equal(n_got_res, n_res);
                    assert_memory_equal(got_res, res, (size_t)n_res * sizeof(int32_t));
                }
        }
    assert_int_equal(flexdiag__kvp_evictions(st.kvp), ref_evictions(c, refs, n_refs));
    free(refs);
    ph_free(&st);
}

static void run_random(flexdiag_policy_kind kind, uint64_t seed, int n_cfg) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    int32_t min_att = kind == FLEXDIAG_POLICY_STREAMING ? 5 : 1;
    for (int i = 0; i < n_cfg; i++) {
        bcfg c;
        memset(&c, 0, sizeof c);
        c.p.kind = kind;
        c.p.l_dec = (int32_t)tu_rng_int(&r, min_att, MAXT);
        c.p.n_att = (int32_t)tu_rng_int(&r, min_att, c.p.l_dec < 40 ? c.p.l_dec : 40);
        if (kind == FLEXDIAG_POLICY_DENSE) c.p.n_att = c.p.l_dec;
        c.p.n_seq = (int32_t)tu_rng_int(&r, 1, 2);
        c.p.n_layers = tu_rng_int(&r, 0, 3) == 0 ? 2 : 1;
        c.p.h_kv = (int32_t)tu_rng_int(&r, 1, 3);
        c.p.h_q = c.p.h_kv * (int32_t)tu_rng_int(&r, 1, 4);
        c.lg.seed = tu_rng_u64(&r);
        c.lg.levels = (int32_t)tu_rng_int(&r, 1, 4);
        c.lg.step = 0.5f;
        c.lg.dead = (int32_t)tu_rng_int(&r, 0, 2) * 30; /* 0, 30 or 60 % zero probabilities */
        run_config(&c);
    }
}

static void test_dense(void **state) {
    (void)state;
    run_random(FLEXDIAG_POLICY_DENSE, 1, 200);
}

static void test_window(void **state) {
    (void)state;
    run_random(FLEXDIAG_POLICY_WINDOW, 2, 800);
}

static void test_streaming(void **state) {
    (void)state;
    run_random(FLEXDIAG_POLICY_STREAMING, 3, 800);
}

static void test_h2o(void **state) {
    (void)state;
    run_random(FLEXDIAG_POLICY_H2O, 4, 800);
}

static void test_tova(void **state) {
    (void)state;
    run_random(FLEXDIAG_POLICY_TOVA, 5, 800);
}

static void test_alisa(void **state) {
    (void)state;
    run_random(FLEXDIAG_POLICY_ALISA, 6, 800);
}

/* needs_scores is false for the position policies and true exactly where the score policies
 * read probabilities (an update skipped there would change later selections). */
static void test_needs_scores(void **state) {
    (void)state;
    flexdiag_kvp_params p = {FLEXDIAG_POLICY_WINDOW, 6, 0, 20, 1, 1, 2, 1, 0, 0, NULL};
    flexdiag_kvp *k = NULL;
    for (int kind = FLEXDIAG_POLICY_DENSE; kind <= FLEXDIAG_POLICY_ALISA; kind++) {
        p.kind = (flexdiag_policy_kind)kind;
        p.n_att = kind == FLEXDIAG_POLICY_DENSE ? 20 : 6;
        assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
        for (int32_t t = 0; t < 20; t++) {
            int want = 0;
            if (kind == FLEXDIAG_POLICY_H2O) want = t < 19;
            if (kind == FLEXDIAG_POLICY_TOVA) want = t >= 5 && t < 19;
            if (kind == FLEXDIAG_POLICY_ALISA) want = t + 3 >= 6 && t < 19; /* W = k_l = 3 */
            assert_int_equal(flexdiag__kvp_needs_scores(k, t), want);
        }
        flexdiag__kvp_destroy(k);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_needs_scores), cmocka_unit_test(test_dense),
        cmocka_unit_test(test_window),       cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_h2o),          cmocka_unit_test(test_tova),
        cmocka_unit_test(test_alisa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
