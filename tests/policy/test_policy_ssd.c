/*
 * test_policy_ssd.c - SSD (docs/policies.md §9) against the literal references of §9.6: the
 * label of each KV head (spatial iff lambda(N_att) = the group mean of sum_{l < N_att} P(l) is at
 * least tau, summed here in double by lag then head), a spatial head attending the window, a
 * semantic head the H2O rule with K = 2 in positions (calib_util.c); random tables, budgets,
 * GQA groups and probabilities; tau = 0 plans every head as the window policy, tau > 1 every
 * head as H2O with K = 2; a worked example; the refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "calib_util.h"

/* lambda of (layer, KV head) written out: the mean over the group of each head's sum. */
static double ref_lambda(const flexdiag_kvp_calib *t, int32_t l, int32_t h, int32_t w) {
    int32_t g = t->h_q / t->h_kv;
    double sum = 0;
    for (int32_t q = h * g; q < (h + 1) * g; q++) {
        double m = 0;
        for (int32_t k = 0; k < w; k++) m += t->P[((size_t)l * t->h_q + q) * t->l_dec + k];
        sum += m;
    }
    return sum / g;
}

/* The median lambda of a table: a tau that types about half the heads each way. */
static double median_lambda(const flexdiag_kvp_calib *t, int32_t n_att) {
    int32_t n = t->n_layers * t->h_kv;
    double v[64];
    for (int32_t i = 0; i < n; i++) v[i] = ref_lambda(t, i / t->h_kv, i % t->h_kv, n_att);
    for (int32_t i = 1; i < n; i++) /* insertion sort */
        for (int32_t j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1], v[j - 1] = x;
        }
    return v[n / 2];
}

static void check_labels(const flexdiag_kvp_calib *t, const flexdiag_kvp_heads *hd,
                         int32_t n_att, double tau) {
    int32_t n[3] = {0, 0, 0};
    for (int32_t l = 0; l < t->n_layers; l++)
        for (int32_t h = 0; h < t->h_kv; h++) {
            int want = ref_lambda(t, l, h, n_att) >= tau ? FLEXDIAG_HEAD_WINDOW
                                                          : FLEXDIAG_HEAD_SEMANTIC;
            assert_int_equal(flexdiag__kvp_head_type(hd, l, h), want);
            n[want]++;
        }
    assert_memory_equal(n, hd->n_heads, sizeof n);
    assert_int_equal(hd->ring, n_att);
    assert_int_equal(hd->b_c, n_att);
}

static void test_random_against_reference(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 29);
    uint64_t ev = 0;
    int mixed = 0;
    for (int it = 0; it < 80; it++) {
        int32_t w = (int32_t)tu_rng_int(&r, 2, 8), l_dec = w * (int32_t)tu_rng_int(&r, 2, 10);
        int32_t g = (int32_t)tu_rng_int(&r, 1, 3), h_kv = (int32_t)tu_rng_int(&r, 1, 3);
        int32_t n_att = (int32_t)tu_rng_int(&r, 2, l_dec);
        flexdiag_kvp_calib *t = cu_table(&r, 2, g * h_kv, h_kv, w, l_dec);
        double tau = it % 4 == 3 ? tu_rng_uniform(&r) : median_lambda(t, n_att);
        flexdiag_kvp_heads *hd = NULL;
        assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_SSD, n_att, tau, &hd),
                         FLEXDIAG_OK);
        check_labels(t, hd, n_att, tau);
        mixed += hd->n_heads[FLEXDIAG_HEAD_WINDOW] && hd->n_heads[FLEXDIAG_HEAD_SEMANTIC];
        ev += cu_run(hd, 2, g * h_kv, tu_rng_u64(&r));
        flexdiag__kvp_heads_free(hd);
        flexdiag__kvp_calib_free(t);
    }
    assert_true(mixed >= 30 && ev > 1000); /* both types met, the victims were chosen */
}

/* tau = 0: every head is spatial and plans exactly as the window policy; tau = 2: every head
 * semantic (the reference H2O with K = 2). */
static void test_tau_extremes(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 31);
    flexdiag_kvp_calib *t = cu_table(&r, 2, 4, 2, 6, 60);
    flexdiag_kvp_heads *hd = NULL;
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_SSD, 13, 0.0, &hd), FLEXDIAG_OK);
    assert_int_equal(hd->n_heads[FLEXDIAG_HEAD_WINDOW], 4);
    flexdiag_kvp_params ps = {.kind = FLEXDIAG_POLICY_SSD, .n_att = 13, .l_dec = 60, .n_seq = 2,
                              .n_layers = 2, .h_q = 4, .h_kv = 2, .w_s = 6, .heads = hd};
    flexdiag_kvp_params pw = ps;
    pw.kind = FLEXDIAG_POLICY_WINDOW, pw.heads = NULL;
    flexdiag_kvp *ks = NULL, *kw = NULL;
    assert_int_equal(flexdiag__kvp_create(&ps, &ks), FLEXDIAG_OK);
    assert_int_equal(flexdiag__kvp_create(&pw, &kw), FLEXDIAG_OK);
    int32_t ws[2][4], ns[2][4], sl[2][4 * 13];
    for (int32_t step = 0; step < 60; step++)
        for (int32_t l = 0; l < 2; l++) {
            flexdiag__kvp_plan(ks, l, step, 0, 2, ws[0], sl[0], ns[0]);
            flexdiag__kvp_plan(kw, l, step, 0, 2, ws[1], sl[1], ns[1]);
            assert_memory_equal(ws[0], ws[1], sizeof ws[0]);
            assert_memory_equal(ns[0], ns[1], sizeof ns[0]);
            for (int32_t i = 0; i < 4; i++)
                assert_memory_equal(sl[0] + i * 13, sl[1] + i * 13, (size_t)ns[0][i] * 4);
            assert_false(flexdiag__kvp_needs_scores(ks, step));
            assert_int_equal(flexdiag__kvp_write_slot(&ps, step), step % 13);
        }
    assert_int_equal(flexdiag__kvp_evictions(ks), flexdiag__kvp_evictions(kw));
    flexdiag__kvp_destroy(ks), flexdiag__kvp_destroy(kw), flexdiag__kvp_heads_free(hd);
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_SSD, 13, 2.0, &hd), FLEXDIAG_OK);
    assert_int_equal(hd->n_heads[FLEXDIAG_HEAD_SEMANTIC], 4);
    assert_true(cu_run(hd, 2, 4, 7) > 0);
    flexdiag__kvp_heads_free(hd);
    flexdiag__kvp_calib_free(t);
}

/* One layer, two KV heads, 8 tokens in lines of 4, N_att = 3, tau = 0.5: head 0 puts 0.9 of
 * its mass on lags 0..2 (spatial), head 1 0.3 (semantic). Position 0 draws 0.5 of every
 * step's probability, the others 0.1: the semantic head keeps 0 and the two newest. */
static void test_worked_example(void **state) {
    (void)state;
    flexdiag_kvp_calib *t = NULL;
    assert_int_equal(flexdiag__kvp_calib_alloc(1, 2, 2, 8, &t), FLEXDIAG_OK);
    t->w_s = 4;
    for (int32_t l = 0; l < 8; l++) {
        t->P[l] = l < 3 ? 0.3f : 0.02f;
        t->P[8 + l] = l < 3 ? 0.1f : 0.14f;
    }
    flexdiag_kvp_heads *hd = NULL;
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_SSD, 3, 0.5, &hd), FLEXDIAG_OK);
    assert_int_equal(flexdiag__kvp_head_type(hd, 0, 0), FLEXDIAG_HEAD_WINDOW);
    assert_int_equal(flexdiag__kvp_head_type(hd, 0, 1), FLEXDIAG_HEAD_SEMANTIC);
    flexdiag_kvp_params p = {.kind = FLEXDIAG_POLICY_SSD, .n_att = 3, .l_dec = 8, .n_seq = 1,
                             .n_layers = 1, .h_q = 2, .h_kv = 2, .w_s = 4, .heads = hd};
    flexdiag_kvp *k = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    static const int32_t want[8][3] = {{0}, {0, 1}, {0, 1, 2}, {0, 2, 3}, {0, 3, 4},
                                       {0, 4, 5}, {0, 5, 6}, {0, 6, 7}};
    int32_t ws[2], ns[2], sl[6];
    float pr[6];
    for (int32_t step = 0; step < 8; step++) {
        flexdiag__kvp_plan(k, 0, step, 0, 1, ws, sl, ns);
        for (int32_t c = 0; c < ns[1]; c++)
            pr[3 + c] = flexdiag__kvp_slot_pos(k, 0, 0, 1, sl[3 + c]) == 0 ? 0.5f : 0.1f;
        assert_int_equal(ns[0], step < 3 ? step + 1 : 3); /* the window: step-2 .. step */
        assert_int_equal(flexdiag__kvp_slot_pos(k, 0, 0, 0, sl[0]), step < 3 ? 0 : step - 2);
        assert_int_equal(ns[1], step < 3 ? step + 1 : 3);
        for (int32_t c = 0; c < ns[1]; c++) {
            int32_t pos = flexdiag__kvp_slot_pos(k, 0, 0, 1, sl[3 + c]), hit = 0;
            for (int32_t j = 0; j < ns[1]; j++) hit += want[step][j] == pos;
            assert_int_equal(hit, 1);
        }
        flexdiag__kvp_update(k, 0, step, 0, 1, NULL, NULL, pr);
    }
    assert_int_equal(flexdiag__kvp_evictions(k), 5 + 5); /* each head from step 3 on */
    flexdiag__kvp_destroy(k);
    flexdiag__kvp_heads_free(hd);
    flexdiag__kvp_calib_free(t);
}

static void test_refusals(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 37);
    flexdiag_kvp_calib *t = cu_table(&r, 1, 2, 2, 4, 16);
    flexdiag_kvp_params p = {.kind = FLEXDIAG_POLICY_SSD, .n_att = 5, .l_dec = 16, .n_seq = 1,
                             .n_layers = 1, .h_q = 2, .h_kv = 2, .w_s = 4};
    flexdiag_kvp *k = NULL;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "needs a calibration table"));
    flexdiag_kvp_heads *hd = NULL;
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_SSD, 6, 0.5, &hd), FLEXDIAG_OK);
    p.heads = hd; /* made for N_att 6 */
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "made for ssd, N_att 6"));
    flexdiag__kvp_heads_free(hd);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_SSD, 1, 0.5, &hd),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "n_att >= 2"));
    assert_int_equal(flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_WINDOW, 4, 0.5, &hd),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_true(flexdiag__kvp_needs_calib(FLEXDIAG_POLICY_SSD));
    assert_false(flexdiag__kvp_needs_calib(FLEXDIAG_POLICY_H2O));
    assert_string_equal(flexdiag__kvp_name(FLEXDIAG_POLICY_SSD), "ssd");
    assert_int_equal(flexdiag__kvp_traits(FLEXDIAG_POLICY_SSD)->device, FLEXDIAG_KVP_DEV_NONE);
    flexdiag__kvp_calib_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_tau_extremes),
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
