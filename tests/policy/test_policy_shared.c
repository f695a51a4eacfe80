/*
 * test_policy_shared.c - the shared plan of the position-only policies (dense, window,
 * streaming) equals the per-(sequence, layer, KV head) plan at every step, evictions included,
 * and other policies decline it.
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

static flexdiag_kvp *make(flexdiag_policy_kind kind, int32_t n_att, int32_t l_dec) {
    flexdiag_kvp_params p = {.kind = kind, .n_att = n_att, .n_r = n_att, .l_dec = l_dec,
                             .n_seq = 3, .n_layers = 2, .h_q = 4, .h_kv = 2};
    flexdiag_kvp *k = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    return k;
}

static void test_shared_equals_per_head(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 3);
    const flexdiag_policy_kind kinds[3] = {FLEXDIAG_POLICY_DENSE, FLEXDIAG_POLICY_WINDOW,
                                           FLEXDIAG_POLICY_STREAMING};
    for (int it = 0; it < 300; it++) {
        flexdiag_policy_kind kind = kinds[it % 3];
        int32_t l_dec = (int32_t)tu_rng_int(&r, 5, 70);
        int32_t n_att = kind == FLEXDIAG_POLICY_DENSE ? l_dec : (int32_t)tu_rng_int(&r, 5, l_dec);
        flexdiag_kvp *a = make(kind, n_att, l_dec), *b = make(kind, n_att, l_dec);
        flexdiag_kvp_params kp = {.kind = kind, .n_att = n_att, .l_dec = l_dec};
        int32_t ms = flexdiag__kvp_max_slots(&kp);
        int32_t *ws = malloc(6 * 4), *sl = malloc((size_t)6 * (size_t)ms * 4), *ns = malloc(6 * 4);
        int32_t sws, *ssl = malloc((size_t)ms * 4), sns;
        for (int32_t t = 0; t < l_dec; t++) {
            assert_int_equal(flexdiag__kvp_plan_shared(b, t, 0, 3, &sws, ssl, &sns), 1);
            for (int32_t l = 0; l < 2; l++) {
                flexdiag__kvp_plan(a, l, t, 0, 3, ws, sl, ns);
                for (int i = 0; i < 6; i++) {
                    assert_int_equal(ws[i], sws);
                    assert_int_equal(ns[i], sns);
                    assert_memory_equal(sl + (size_t)i * (size_t)ms, ssl, (size_t)sns * 4);
                }
            }
        }
        assert_int_equal(flexdiag__kvp_evictions(a), flexdiag__kvp_evictions(b));
        free(ws), free(sl), free(ns), free(ssl);
        flexdiag__kvp_destroy(a);
        flexdiag__kvp_destroy(b);
    }
    flexdiag_kvp *d = make(FLEXDIAG_POLICY_DIAGONAL, 5, 20);
    int32_t w, s[8], n;
    assert_int_equal(flexdiag__kvp_plan_shared(d, 0, 0, 3, &w, s, &n), 0);
    flexdiag__kvp_destroy(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_shared_equals_per_head)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
