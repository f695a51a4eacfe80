/*
 * test_policy_ahead.c - window passes' view of the policies (kv_policy.h flexdiag__kvp_window_ok,
 * flexdiag__kvp_plan_ahead, params slack): for window, streaming, Diagonal and Diagonal+sink4 with
 * random budgets, rings and slack, the plan of step t + i made ahead at step t equals the plan
 * the state machine makes when it reaches t + i (Diagonal's build-up updates driven by random
 * logits), whenever window_ok says the pass is exact; and in a pass of rows t .. t+L-1 (L - 1 <=
 * slack) that writes every row first, no row's attended slot is overwritten by a later row, so
 * each row reads what sequential decoding reads. Score-driven policies refuse windows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "policy/kv_policy.h"
#include "util.h"

#define HKV 2

typedef struct ahead_rec { /* one planned step of one (layer 0, sequence 0): every head */
    int32_t ws[HKV], ns[HKV], *sl;
} ahead_rec;

static void run_config(flexdiag_policy_kind kind, int32_t n_att, int32_t n_r, int32_t l_dec,
                       int32_t slack, tu_rng *r) {
    flexdiag_kvp_params p = {.kind = kind, .n_att = n_att, .n_r = n_r, .l_dec = l_dec,
                             .n_seq = 1, .n_layers = 1, .h_q = 2 * HKV, .h_kv = HKV,
                             .slack = slack};
    flexdiag_kvp *a = NULL, *b = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &a), FLEXDIAG_OK);
    assert_int_equal(flexdiag__kvp_create(&p, &b), FLEXDIAG_OK);
    int32_t ms = flexdiag__kvp_max_slots(&p), L = slack + 1;
    ahead_rec *got = calloc((size_t)l_dec * (size_t)L, sizeof *got); /* [t][i]: ahead at t */
    int *have = calloc((size_t)l_dec * (size_t)L, sizeof *have);
    int32_t ws[HKV], ns[HKV], *sl = malloc((size_t)HKV * ms * 4);
    float *lg = malloc((size_t)2 * HKV * ms * 4);
    int windows = 0;
    for (int32_t t = 0; t < l_dec; t++) {
        int32_t n = L < l_dec - t ? L : l_dec - t;
        if (flexdiag__kvp_window_ok(b, t, n)) {
            windows++;
            for (int32_t i = 0; i < n; i++) {
                ahead_rec *g = &got[(size_t)t * L + i];
                g->sl = malloc((size_t)HKV * ms * 4);
                flexdiag__kvp_plan_ahead(b, 0, t, i, 0, g->ws, g->sl, g->ns);
                have[(size_t)t * L + i] = 1;
            }
            for (int32_t i = 0; i < n; i++) /* no later row's write hits a row's list */
                for (int32_t h = 0; h < HKV; h++) {
                    const ahead_rec *gi = &got[(size_t)t * L + i];
                    for (int32_t c = 0; c < gi->ns[h]; c++)
                        for (int32_t j = i + 1; j < n; j++)
                            assert_int_not_equal(gi->sl[h * ms + c],
                                                 got[(size_t)t * L + j].ws[h]);
                }
        }
        flexdiag__kvp_plan(b, 0, t, 0, 1, ws, sl, ns); /* b walks along sequentially */
        flexdiag__kvp_plan(a, 0, t, 0, 1, ws, sl, ns);
        for (int32_t s0 = t - L + 1 < 0 ? 0 : t - L + 1; s0 <= t; s0++) {
            if (!have[(size_t)s0 * L + (t - s0)]) continue;
            const ahead_rec *g = &got[(size_t)s0 * L + (t - s0)];
            for (int32_t h = 0; h < HKV; h++) {
                assert_int_equal(g->ws[h], ws[h]);
                assert_int_equal(g->ns[h], ns[h]);
                assert_memory_equal(g->sl + h * ms, sl + h * ms, (size_t)ns[h] * 4);
            }
        }
        for (int32_t q = 0; q < 2 * HKV * ms; q++) lg[q] = (float)tu_rng_uniform(r);
        flexdiag__kvp_update(a, 0, t, 0, 1, lg, NULL, NULL);
        flexdiag__kvp_update(b, 0, t, 0, 1, lg, NULL, NULL);
    }
    assert_true(windows > 0);
    for (size_t q = 0; q < (size_t)l_dec * L; q++) free(got[q].sl);
    free(got), free(have), free(sl), free(lg);
    flexdiag__kvp_destroy(a);
    flexdiag__kvp_destroy(b);
}

static void test_ahead_equals_sequential(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 29);
    const flexdiag_policy_kind kinds[4] = {FLEXDIAG_POLICY_WINDOW, FLEXDIAG_POLICY_STREAMING,
                                           FLEXDIAG_POLICY_DIAGONAL,
                                           FLEXDIAG_POLICY_DIAGONAL_SINK4};
    for (int it = 0; it < 200; it++) {
        flexdiag_policy_kind kind = kinds[it % 4];
        int sinks = kind == FLEXDIAG_POLICY_STREAMING || kind == FLEXDIAG_POLICY_DIAGONAL_SINK4;
        int32_t l_dec = (int32_t)tu_rng_int(&r, 8, 80);
        int32_t n_r = (int32_t)tu_rng_int(&r, sinks ? 5 : 1, l_dec);
        int32_t n_att = (int32_t)tu_rng_int(&r, sinks ? 5 : 1, kind >= FLEXDIAG_POLICY_DIAGONAL
                                                                   ? n_r : l_dec);
        run_config(kind, n_att, n_r, l_dec, (int32_t)tu_rng_int(&r, 0, 9), &r);
    }
}

static void test_scores_refuse_windows(void **state) {
    (void)state;
    const flexdiag_policy_kind kinds[3] = {FLEXDIAG_POLICY_H2O, FLEXDIAG_POLICY_TOVA,
                                           FLEXDIAG_POLICY_ALISA};
    for (int i = 0; i < 3; i++) {
        flexdiag_kvp_params p = {.kind = kinds[i], .n_att = 8, .l_dec = 32, .n_seq = 1,
                                 .n_layers = 1, .h_q = 2, .h_kv = 1};
        flexdiag_kvp *k = NULL;
        assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
        assert_int_equal(flexdiag__kvp_window_ok(k, 0, 1), 1); /* one row: sequential */
        assert_int_equal(flexdiag__kvp_window_ok(k, 0, 2), 0);
        flexdiag__kvp_destroy(k);
    }
    /* Diagonal: windows before and after its build-up, none across it */
    flexdiag_kvp_params d = {.kind = FLEXDIAG_POLICY_DIAGONAL, .n_att = 4, .n_r = 10,
                             .l_dec = 40, .n_seq = 1, .n_layers = 1, .h_q = 1, .h_kv = 1,
                             .slack = 3};
    flexdiag_kvp *k = NULL;
    assert_int_equal(flexdiag__kvp_create(&d, &k), FLEXDIAG_OK);
    assert_int_equal(flexdiag__kvp_ring_rows(&d), 13);
    assert_int_equal(flexdiag__kvp_window_ok(k, 0, 3), 1);  /* steps 0..2 append lags */
    assert_int_equal(flexdiag__kvp_window_ok(k, 0, 4), 0);  /* step 3 = A - 1 updates */
    assert_int_equal(flexdiag__kvp_window_ok(k, 9, 4), 1);  /* past N_r - 2 = 8 */
    assert_int_equal(flexdiag__kvp_window_ok(k, 8, 2), 0);
    flexdiag__kvp_destroy(k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ahead_equals_sequential),
        cmocka_unit_test(test_scores_refuse_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
