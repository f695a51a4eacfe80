/*
 * test_policy_hack.c - HACK (docs/policies.md §10) against literal references: the plan
 * restated here (KV heads sorted by log V, the largest gap inside the 10 %-90 % quantile range,
 * kappa = 1/4 budgets, each structural list lags 0..W_s+1 plus the best of (W_s+1, cap] by P,
 * picked one at a time), then the attended sets of §10.6 in positions for every step
 * (calib_util.c: structural {0..min(t,3)} u {t - l : t - l >= 4}, contextual the H2O rule with
 * K = 2 at B_C); a Janus-shaped table whose structural lists must hold the lags of the lines
 * above; the mean budget; the refusals.
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

#define MAXH 64

typedef struct ref_plan {
    unsigned char type[MAXH];
    int32_t n_c, b_s, b_c, n_lags, top;
    unsigned char lag[MAXH][CU_MAXR > 600 ? CU_MAXR : 600]; /* lag[i][l]: l in head i's list */
} ref_plan;

static double ref_log_v(const flexdiag_kvp_calib *t, int32_t i) {
    int32_t g = t->h_q / t->h_kv, l = i / t->h_kv, h = i % t->h_kv;
    double s = 0;
    for (int32_t q = h * g; q < (h + 1) * g; q++) s += t->V[l * t->h_q + q];
    s /= g;
    return log(s > 1e-300 ? s : 1e-300);
}

static double ref_p(const flexdiag_kvp_calib *t, int32_t i, int32_t lag) {
    int32_t g = t->h_q / t->h_kv, l = i / t->h_kv, h = i % t->h_kv;
    double s = 0;
    for (int32_t q = h * g; q < (h + 1) * g; q++) s += t->P[((size_t)l * t->h_q + q) * t->l_dec + lag];
    return s / g;
}

static void ref_make(const flexdiag_kvp_calib *t, int32_t n_att, ref_plan *r) {
    int32_t n = t->n_layers * t->h_kv, order[MAXH], w = t->w_s;
    double x[MAXH];
    memset(r, 0, sizeof *r);
    for (int32_t i = 0; i < n; i++) x[i] = ref_log_v(t, i), order[i] = i;
    for (int32_t i = 1; i < n; i++) /* by (log V, index) */
        for (int32_t j = i; j > 0 && x[order[j]] < x[order[j - 1]]; j--) {
            int32_t tmp = order[j];
            order[j] = order[j - 1], order[j - 1] = tmp;
        }
    if (n >= 2) {
        int32_t lo = (int32_t)floor(0.1 * (n - 1)), hi = (int32_t)ceil(0.9 * (n - 1)), best = lo;
        for (int32_t i = lo; i < hi; i++)
            if (x[order[i + 1]] - x[order[i]] > x[order[best + 1]] - x[order[best]]) best = i;
        r->n_c = best + 1;
    }
    int64_t bs = 4 * (int64_t)n * n_att / (4 * (int64_t)n - 3 * r->n_c);
    r->b_s = (int32_t)(bs < t->l_dec ? bs : t->l_dec);
    if (r->n_c) {
        int64_t bc = ((int64_t)n * n_att - (int64_t)(n - r->n_c) * r->b_s) / r->n_c;
        r->b_c = (int32_t)(bc < 2 ? 2 : bc > t->l_dec ? t->l_dec : bc);
    }
    r->n_lags = r->b_s - 4;
    int32_t cap = 4 * w > r->b_s - 5 ? 4 * w : r->b_s - 5;
    cap = cap < t->l_dec - 5 ? cap : t->l_dec - 5;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = order[k];
        r->type[i] = k < r->n_c ? FLEXDIAG_HEAD_SEMANTIC : FLEXDIAG_HEAD_LAGS;
        if (k < r->n_c) continue;
        for (int32_t l = 0; l <= w + 1; l++) r->lag[i][l] = 1;
        for (int32_t m = w + 2; m < r->n_lags; m++) { /* the best lag not yet taken */
            int32_t b = -1;
            for (int32_t l = w + 2; l <= cap; l++)
                if (!r->lag[i][l] && (b < 0 || ref_p(t, i, l) > ref_p(t, i, b))) b = l;
            r->lag[i][b] = 1;
            r->top = b > r->top ? b : r->top;
        }
        r->top = w + 1 > r->top ? w + 1 : r->top;
    }
}

static void check_plan(const flexdiag_kvp_calib *t, const flexdiag_kvp_heads *hd,
                       const ref_plan *r) {
    int32_t n = t->n_layers * t->h_kv;
    assert_int_equal(hd->n_heads[FLEXDIAG_HEAD_SEMANTIC], r->n_c);
    assert_int_equal(hd->n_heads[FLEXDIAG_HEAD_LAGS], n - r->n_c);
    assert_int_equal(hd->b_c, r->b_c);
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(flexdiag__kvp_head_type(hd, i / t->h_kv, i % t->h_kv), r->type[i]);
        if (r->type[i] != FLEXDIAG_HEAD_LAGS) continue;
        assert_int_equal(hd->b_s, r->b_s);
        assert_int_equal(hd->n_lags, r->n_lags);
        const int16_t *lags = flexdiag__kvp_head_lags(hd, i / t->h_kv, i % t->h_kv);
        for (int32_t j = 0; j < hd->n_lags; j++) {
            assert_true(r->lag[i][lags[j]]);
            if (j > 0) assert_true(lags[j] > lags[j - 1]);
        }
    }
    int32_t rs = r->n_c < n ? 4 + r->top + 1 : 0;
    assert_int_equal(hd->ring, rs > r->b_c ? rs : r->b_c);
    if (r->b_c > 2) /* the mean budget */
        assert_true((int64_t)(n - r->n_c) * r->b_s + (int64_t)r->n_c * r->b_c <=
                    (int64_t)n * hd->n_att);
}

static void test_random_against_reference(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 41);
    ref_plan *ref = malloc(sizeof *ref);
    uint64_t ev = 0;
    int mixed = 0;
    for (int it = 0; it < 70; it++) {
        int32_t w = (int32_t)tu_rng_int(&r, 2, 7), l_dec = w * (int32_t)tu_rng_int(&r, 3, 12);
        int32_t g = (int32_t)tu_rng_int(&r, 1, 2), h_kv = (int32_t)tu_rng_int(&r, 1, 4);
        if (l_dec < 4 + w + 2) continue;
        int32_t n_att = (int32_t)tu_rng_int(&r, 4 + w + 2, l_dec);
        flexdiag_kvp_calib *t = cu_table(&r, 2, g * h_kv, h_kv, w, l_dec);
        flexdiag_kvp_heads *hd = NULL;
        assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_HACK, n_att, 0, &hd),
                         FLEXDIAG_OK);
        ref_make(t, n_att, ref);
        check_plan(t, hd, ref);
        mixed += hd->n_heads[FLEXDIAG_HEAD_LAGS] && hd->n_heads[FLEXDIAG_HEAD_SEMANTIC];
        ev += cu_run(hd, 2, g * h_kv, tu_rng_u64(&r));
        flexdiag__kvp_heads_free(hd);
        flexdiag__kvp_calib_free(t);
    }
    free(ref);
    assert_true(mixed >= 30 && ev > 1000);
}

/* Janus's grid (24 x 24) at sparsity 0.9 (N_att 58), 2 layers x 4 heads: four heads of small
 * variance (contextual, alpha 1/2) give B_S = 92, B_C = 24 (§10.2: 4 x 92 + 4 x 24 = 8 x 58);
 * a structural head whose profile peaks at the lags of the lines above (48, 72, 96, 47, 49)
 * holds them, besides 0..25 (the row, the token above and its neighbours 23..25). */
static void test_janus_lists(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 43);
    flexdiag_kvp_calib *t = cu_table(&r, 2, 4, 4, 24, 576);
    for (int32_t i = 0; i < 8; i++) {
        t->V[i] = i % 2 ? 1e-2 * (1 + 0.1 * i) : 1e-8 * (1 + 0.1 * i);
        float *P = t->P + (size_t)i * 576;
        for (int32_t l = 0; l < 576; l++) P[l] = 0.5f / 576;
        P[48] += 0.2f, P[72] += 0.1f, P[96] += 0.1f, P[47] += 0.05f, P[49] += 0.05f;
    }
    flexdiag_kvp_heads *hd = NULL;
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_HACK, 58, 0, &hd), FLEXDIAG_OK);
    assert_int_equal(hd->n_heads[FLEXDIAG_HEAD_SEMANTIC], 4);
    assert_int_equal(hd->b_s, 92);
    assert_int_equal(hd->b_c, 24);
    assert_int_equal(hd->n_lags, 88);
    for (int32_t i = 1; i < 8; i += 2) {
        assert_int_equal(flexdiag__kvp_head_type(hd, i / 4, i % 4), FLEXDIAG_HEAD_LAGS);
        const int16_t *lags = flexdiag__kvp_head_lags(hd, i / 4, i % 4);
        unsigned char in[97] = {0};
        for (int32_t j = 0; j < 88; j++) {
            assert_true(lags[j] <= 96); /* cap max(4 W_s, B_S - 5) = 96 */
            in[lags[j]] = 1;
        }
        for (int32_t l = 0; l <= 25; l++) assert_true(in[l]);
        assert_true(in[47] && in[48] && in[49] && in[72] && in[96]);
    }
    assert_int_equal(hd->max_slots, 92);
    flexdiag__kvp_heads_free(hd);
    flexdiag__err_clear(); /* 18: B_S = 28 < 4 + 26 */
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_HACK, 18, 0, &hd),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "use context_params.policy.n_att >= 19"));
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_HACK, 19, 0, &hd), FLEXDIAG_OK);
    assert_int_equal(hd->b_s, 30);
    flexdiag__kvp_heads_free(hd);
    flexdiag__kvp_calib_free(t);
}

/* At N_att = L_dec a structural list is every useful lag (dense) and B_C = L_dec. */
static void test_full_budget_is_dense(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 47);
    flexdiag_kvp_calib *t = cu_table(&r, 2, 2, 2, 4, 32);
    flexdiag_kvp_heads *hd = NULL;
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_HACK, 32, 0, &hd), FLEXDIAG_OK);
    assert_int_equal(hd->b_s, 32);
    assert_int_equal(hd->b_c, 32);
    for (int32_t i = 0; i < 4; i++) {
        if (flexdiag__kvp_head_type(hd, i / 2, i % 2) != FLEXDIAG_HEAD_LAGS) continue;
        const int16_t *lags = flexdiag__kvp_head_lags(hd, i / 2, i % 2);
        for (int32_t j = 0; j < 28; j++) assert_int_equal(lags[j], j);
    }
    assert_int_equal(cu_run(hd, 1, 2, 3), 0);
    flexdiag__kvp_heads_free(hd);
    flexdiag__kvp_calib_free(t);
}

static void test_refusals(void **state) {
    (void)state;
    flexdiag_kvp_params p = {.kind = FLEXDIAG_POLICY_HACK, .n_att = 12, .l_dec = 32, .n_seq = 1,
                             .n_layers = 1, .h_q = 1, .h_kv = 1, .w_s = 4};
    flexdiag_kvp *k = NULL;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "hack needs a calibration table"));
    p.n_att = 4; /* 4 sinks */
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "4 sink tokens"));
    assert_string_equal(flexdiag__kvp_name(FLEXDIAG_POLICY_HACK), "hack");
    assert_true(flexdiag__kvp_needs_calib(FLEXDIAG_POLICY_HACK));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_janus_lists),
        cmocka_unit_test(test_full_budget_is_dense),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
