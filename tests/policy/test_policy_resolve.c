/*
 * test_policy_resolve.c - parameter resolution and validation of the KV policies (docs/policies.md
 * §0.2, §0.6, §2.2): sparsity -> N_att (lround, clamp), the default N_r, every validation error
 * and its message, names, ring sizes, resident rows, create-time validation, and that reset()
 * replays a generation identically.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "policy/kv_policy.h"

/* The fields the policy layer's messages name (flexdiag_context_params.policy). */
#define NATT "context_params.policy.n_att"
#define NR "context_params.policy.n_r"
#define SPARSITY "context_params.policy.sparsity"

static flexdiag_policy_params pol(flexdiag_policy_kind kind, int32_t n_att, int32_t n_r,
                                  double sparsity) {
    flexdiag_policy_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.kind = kind;
    p.n_att = n_att;
    p.n_r = n_r;
    p.sparsity = sparsity;
    return p;
}

/* Resolve and expect an INVALID_ARG whose message contains each given fragment. */
static void expect_error(flexdiag_policy_params pub, int32_t l_dec, const char *frag1,
                         const char *frag2) {
    flexdiag_kvp_params out;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_resolve(&pub, l_dec, &out), FLEXDIAG_ERR_INVALID_ARG);
    const char *msg = flexdiag_last_error(NULL);
    if (!strstr(msg, frag1) || (frag2 && !strstr(msg, frag2)))
        fail_msg("message '%s' lacks '%s' / '%s'", msg, frag1, frag2 ? frag2 : "");
    flexdiag__err_clear();
}

static void test_sparsity(void **state) {
    (void)state;
    flexdiag_kvp_params out;
    flexdiag_policy_params p = pol(FLEXDIAG_POLICY_DIAGONAL, 0, 0, 0.95);
    assert_int_equal(flexdiag__kvp_resolve(&p, 576, &out), FLEXDIAG_OK);
    assert_int_equal(out.n_att, 29);
    assert_int_equal(out.n_r, 288);
    assert_int_equal(out.l_dec, 576);
    assert_true(fabs(flexdiag__kvp_reported_sparsity(&out) - 0.9497) < 1e-4);
    static const double s[] = {0.5, 0.75, 0.9, 0.0, 1.0};
    static const int32_t want[] = {288, 144, 58, 576, 1}; /* 57.6 -> 58; 0 clamps to 1 */
    for (int i = 0; i < 5; i++) {
        p = pol(FLEXDIAG_POLICY_WINDOW, 0, 0, s[i]);
        assert_int_equal(flexdiag__kvp_resolve(&p, 576, &out), FLEXDIAG_OK);
        assert_int_equal(out.n_att, want[i]);
    }
    p = pol(FLEXDIAG_POLICY_H2O, 0, 0, 0.25); /* 7.5 rounds half away from zero */
    assert_int_equal(flexdiag__kvp_resolve(&p, 10, &out), FLEXDIAG_OK);
    assert_int_equal(out.n_att, 8);
    /* default N_r = max(lround(0.5 L_dec), N_att); explicit values kept */
    p = pol(FLEXDIAG_POLICY_DIAGONAL, 400, 0, 0);
    assert_int_equal(flexdiag__kvp_resolve(&p, 576, &out), FLEXDIAG_OK);
    assert_int_equal(out.n_r, 400);
    p = pol(FLEXDIAG_POLICY_DIAGONAL_SINK4, 29, 700, 0);
    assert_int_equal(flexdiag__kvp_resolve(&p, 576, &out), FLEXDIAG_OK);
    assert_int_equal(out.n_att, 29);
    assert_int_equal(out.n_r, 700); /* N_r >= L_dec is allowed (§2.5) */
    p = pol(FLEXDIAG_POLICY_DIAGONAL, 0, 0, 0.5);
    assert_int_equal(flexdiag__kvp_resolve(&p, 7, &out), FLEXDIAG_OK); /* 3.5 -> 4 */
    assert_int_equal(out.n_att, 4);
    assert_int_equal(out.n_r, 4);
    /* dense attends everything whatever the budget flags say */
    p = pol(FLEXDIAG_POLICY_DENSE, 12, 5, 0.9);
    assert_int_equal(flexdiag__kvp_resolve(&p, 576, &out), FLEXDIAG_OK);
    assert_int_equal(out.n_att, 576);
    assert_true(flexdiag__kvp_reported_sparsity(&out) == 0.0);
}

static void test_validation(void **state) {
    (void)state;
    expect_error(pol(FLEXDIAG_POLICY_STREAMING, 3, 0, 0), 576,
                 NATT " 3 is too small for streaming: it keeps 4 sink tokens", NATT " >= 5");
    expect_error(pol(FLEXDIAG_POLICY_STREAMING, 0, 0, 0.995), 576, NATT " 3", "streaming");
    expect_error(pol(FLEXDIAG_POLICY_DIAGONAL_SINK4, 10, 4, 0), 576, NR " 4", NR " >= 5");
    expect_error(pol(FLEXDIAG_POLICY_DIAGONAL_SINK4, 4, 100, 0), 576, NATT " 4",
                 NATT " >= 5");
    expect_error(pol(FLEXDIAG_POLICY_WINDOW, -2, 0, 0), 576, NATT " -2", ">= 1");
    expect_error(pol(FLEXDIAG_POLICY_WINDOW, 600, 0, 0), 576, NATT " 600 exceeds", "<= 576");
    expect_error(pol(FLEXDIAG_POLICY_DIAGONAL, 10, -1, 0), 576, NR " -1", NULL);
    expect_error(pol(FLEXDIAG_POLICY_DIAGONAL, 10, 40000, 0), 576, NR " 40000", "int16");
    expect_error(pol(FLEXDIAG_POLICY_TOVA, 0, 0, 1.5), 576, SPARSITY " 1.5", "[0, 1]");
    expect_error(pol(FLEXDIAG_POLICY_TOVA, 0, 0, NAN), 576, SPARSITY, NULL);
    expect_error(pol((flexdiag_policy_kind)42, 10, 0, 0), 576, "unknown", "diagonal-sink4");
    expect_error(pol(FLEXDIAG_POLICY_WINDOW, 10, 0, 0), 0, "decode length 0", NULL);
    flexdiag_policy_params p = pol(FLEXDIAG_POLICY_WINDOW, 10, 0, 0);
    p.struct_size = 0;
    expect_error(p, 576, "flexdiag_policy_params_init", NULL);
    /* streaming at exactly 5 and sink4 at N_att = N_r = 5 are fine (N_att > N_r is refused:
     * test_policy_check.c) */
    flexdiag_kvp_params out;
    p = pol(FLEXDIAG_POLICY_STREAMING, 5, 0, 0);
    assert_int_equal(flexdiag__kvp_resolve(&p, 576, &out), FLEXDIAG_OK);
    p = pol(FLEXDIAG_POLICY_DIAGONAL_SINK4, 5, 5, 0);
    assert_int_equal(flexdiag__kvp_resolve(&p, 576, &out), FLEXDIAG_OK);
}

static void test_names_and_sizes(void **state) {
    (void)state;
    static const char *names[] = {"dense", "window", "streaming", "h2o", "tova", "alisa",
                                  "diagonal", "diagonal-sink4"};
    /* kind order as flexdiag.h; ring rows and max slots for n_att 29, n_r 288, l_dec 576 */
    static const int32_t ring[] = {576, 29, 29, 29, 29, 576, 288, 292};
    static const int32_t slots[] = {576, 29, 29, 29, 29, 29, 29, 29};
    for (int k = 0; k < 8; k++) {
        flexdiag_policy_kind kind;
        assert_int_equal(flexdiag__kvp_parse(names[k], &kind), 0);
        assert_int_equal(kind, k);
        assert_string_equal(flexdiag__kvp_name(kind), names[k]);
        assert_non_null(strstr(flexdiag__kvp_names(), names[k]));
        flexdiag_kvp_params p = {kind, k == 0 ? 576 : 29, 288, 576, 1, 1, 1, 1, 0, 0, NULL};
        assert_int_equal(flexdiag__kvp_ring_rows(&p), ring[k]);
        assert_int_equal(flexdiag__kvp_max_slots(&p), slots[k]);
    }
    flexdiag_policy_kind kind;
    assert_int_equal(flexdiag__kvp_parse("diag", &kind), -1);
    /* resident rows: diagonal min(t+1, N_r); sink4 4 + min(t-3, N_r); window min(t+1, N_att) */
    flexdiag_kvp_params d = {FLEXDIAG_POLICY_DIAGONAL, 29, 288, 576, 1, 1, 1, 1, 0, 0, NULL};
    assert_int_equal(flexdiag__kvp_resident_rows(&d, 10), 11);
    assert_int_equal(flexdiag__kvp_resident_rows(&d, 575), 288);
    d.kind = FLEXDIAG_POLICY_DIAGONAL_SINK4;
    assert_int_equal(flexdiag__kvp_resident_rows(&d, 2), 3);
    assert_int_equal(flexdiag__kvp_resident_rows(&d, 575), 292);
    d.kind = FLEXDIAG_POLICY_WINDOW;
    assert_int_equal(flexdiag__kvp_resident_rows(&d, 575), 29);
    d.kind = FLEXDIAG_POLICY_ALISA;
    assert_int_equal(flexdiag__kvp_resident_rows(&d, 575), 576);
}

static void test_create_validation(void **state) {
    (void)state;
    flexdiag_kvp *k = (flexdiag_kvp *)&k;
    flexdiag_kvp_params p = {FLEXDIAG_POLICY_H2O, 8, 0, 32, 2, 2, 6, 4, 0, 0, NULL}; /* 6 % 4 != 0 */
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    assert_null(k);
    assert_non_null(strstr(flexdiag_last_error(NULL), "h_q a multiple of h_kv"));
    flexdiag__err_clear();
    p.h_q = 8;
    p.n_att = 40; /* > l_dec */
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    p.n_att = 8;
    p.kind = FLEXDIAG_POLICY_DIAGONAL; /* n_r 0: unresolved */
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    flexdiag__kvp_destroy(NULL);
}

/* Run every policy for a whole generation, reset, run again: identical plans and counters. */
static void test_reset_replays(void **state) {
    (void)state;
    enum { T = 24, HQ = 4, HKV = 2, MS = T };
    for (int kind = 0; kind < 8; kind++) {
        flexdiag_kvp_params p = {(flexdiag_policy_kind)kind, kind == 0 ? T : 6, 9, T, 2, 2,
                                 HQ, HKV, 0, 0, NULL};
        flexdiag_kvp *k = NULL;
        assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
        int32_t ms = flexdiag__kvp_max_slots(&p);
        static int32_t first[2][T][2][2 * HKV * MS];
        uint64_t ev[2];
        for (int run = 0; run < 2; run++) {
            flexdiag__kvp_reset(k);
            for (int32_t t = 0; t < T; t++)
                for (int32_t l = 0; l < 2; l++) {
                    int32_t ws[2 * HKV], ns[2 * HKV], *sl = first[run][t][l];
                    float logits[2 * HQ * MS], lse[2 * HQ];
                    flexdiag__kvp_plan(k, l, t, 0, 2, ws, sl, ns);
                    for (int i = 0; i < 2 * HQ * ms; i++) logits[i] = (float)((i * 7 + t) % 5);
                    for (int i = 0; i < 2 * HQ; i++) lse[i] = 4.0f;
                    flexdiag__kvp_update(k, l, t, 0, 2, logits, lse, NULL);
                    for (int i = 0; i < 2 * HKV; i++)
                        for (int j = ns[i]; j < ms; j++) sl[i * ms + j] = -1; /* unused tail */
                }
            ev[run] = flexdiag__kvp_evictions(k);
        }
        assert_memory_equal(first[0], first[1], sizeof first[0]);
        assert_true(ev[0] == ev[1]);
        flexdiag__kvp_destroy(k);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sparsity),          cmocka_unit_test(test_validation),
        cmocka_unit_test(test_names_and_sizes),   cmocka_unit_test(test_create_validation),
        cmocka_unit_test(test_reset_replays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
