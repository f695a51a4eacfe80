/*
 * test_policy_check.c - the one policy-parameter validation (docs/policies.md §0.6, issue #12):
 * flexdiag__kvp_check (what needs no decode length) and flexdiag__kvp_resolve (check + the
 * rest), and that context creation runs it.
 *
 * 1. A Diagonal kind attends within its ring: N_att > N_r is refused, given or derived from
 *    the sparsity, with a message naming both fields and the fix; N_att = N_r is fine; the
 *    state machine itself still clamps N_att > N_r for direct callers.
 * 2. A sparse policy needs a budget: n_att 0 with sparsity NaN ("not given") is refused for
 *    every sparse kind, dense ignores it; sparsity outside [0, 1] (inf included) is refused; in
 *    the C API n_att > 0 takes precedence over the sparsity.
 * 3. check is resolve's prefix: over a grid of parameters, whatever check refuses, resolve
 *    refuses with the same message at every decode length, and whatever resolve accepts,
 *    check accepts.
 * 4. Through the public API (micro-janus, CPU): flexdiag_context_create and
 *    flexdiag_context_max_images return INVALID_ARG with the same message, and a created
 *    context reports the parameters it runs.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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
    flexdiag_policy_params_init(&p);
    p.kind = kind;
    p.n_att = n_att;
    p.n_r = n_r;
    p.sparsity = sparsity;
    return p;
}

/* Resolve at l_dec and expect INVALID_ARG with a message holding frag1 and frag2 (or NULL). */
static void expect_refused(flexdiag_policy_params p, int32_t l_dec, const char *frag1,
                           const char *frag2) {
    flexdiag_kvp_params out;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_resolve(&p, l_dec, &out), FLEXDIAG_ERR_INVALID_ARG);
    const char *msg = flexdiag_last_error(NULL);
    if (!strstr(msg, frag1) || (frag2 && !strstr(msg, frag2)))
        fail_msg("message '%s' lacks '%s' / '%s'", msg, frag1, frag2 ? frag2 : "");
    flexdiag__err_clear();
}

static flexdiag_kvp_params expect_resolved(flexdiag_policy_params p, int32_t l_dec) {
    flexdiag_kvp_params out;
    flexdiag__err_clear();
    if (flexdiag__kvp_resolve(&p, l_dec, &out) != FLEXDIAG_OK)
        fail_msg("refused: %s", flexdiag_last_error(NULL));
    return out;
}

/* ---- 1. the ring ---- */

static void test_ring(void **state) {
    (void)state;
    expect_refused(pol(FLEXDIAG_POLICY_DIAGONAL, 8, 2, NAN), 64, NATT " 8 exceeds " NR " 2",
                   "raise " NR " or lower " NATT);
    expect_refused(pol(FLEXDIAG_POLICY_DIAGONAL_SINK4, 9, 5, NAN), 64,
                   NATT " 9 exceeds " NR " 5", "diagonal-sink4");
    expect_refused(pol(FLEXDIAG_POLICY_DIAGONAL, 0, 2, 0.5), 64, SPARSITY " 0.5 gives N_att 32",
                   NR " 2");
    /* the sink minimum of N_r is named first: raising --n-att could never help */
    expect_refused(pol(FLEXDIAG_POLICY_DIAGONAL_SINK4, 10, 4, NAN), 64, NR " 4",
                   NR " >= 5");
    flexdiag_kvp_params k = expect_resolved(pol(FLEXDIAG_POLICY_DIAGONAL, 8, 8, NAN), 64);
    assert_int_equal(k.n_att, 8);
    assert_int_equal(k.n_r, 8);
    k = expect_resolved(pol(FLEXDIAG_POLICY_DIAGONAL_SINK4, 5, 5, NAN), 64);
    assert_int_equal(flexdiag__kvp_max_slots(&k), 5);
    /* the default ring is never smaller than N_att */
    k = expect_resolved(pol(FLEXDIAG_POLICY_DIAGONAL, 60, 0, NAN), 64);
    assert_int_equal(k.n_r, 60);
    k = expect_resolved(pol(FLEXDIAG_POLICY_DIAGONAL, 0, 0, 0.0), 64);
    assert_int_equal(k.n_att, 64);
    assert_int_equal(k.n_r, 64);
    /* non-Diagonal kinds ignore --n-r */
    k = expect_resolved(pol(FLEXDIAG_POLICY_WINDOW, 8, 2, NAN), 64);
    assert_int_equal(k.n_r, 0);
    /* the state machine keeps its clamp for direct callers (test_policy_diagonal drives it) */
    flexdiag_kvp_params direct = {FLEXDIAG_POLICY_DIAGONAL, 8, 2, 64, 1, 1, 1, 1, 0, 0, NULL};
    flexdiag_kvp *kvp = NULL;
    assert_int_equal(flexdiag__kvp_create(&direct, &kvp), FLEXDIAG_OK);
    assert_int_equal(flexdiag__kvp_max_slots(&direct), 2);
    flexdiag__kvp_destroy(kvp);
}

/* ---- 2. the budget ---- */

static void test_budget(void **state) {
    (void)state;
    for (int kind = FLEXDIAG_POLICY_WINDOW; kind <= FLEXDIAG_POLICY_DIAGONAL_SINK4; kind++) {
        flexdiag_policy_kind kd = (flexdiag_policy_kind)kind;
        expect_refused(pol(kd, 0, 0, NAN), 64, "needs a budget", NATT);
        expect_refused(pol(kd, 0, 0, NAN), 64, flexdiag__kvp_name(kd), SPARSITY);
        assert_int_equal(expect_resolved(pol(kd, 8, 0, NAN), 64).n_att, 8);
        assert_int_equal(expect_resolved(pol(kd, 0, 0, 0.875), 64).n_att, 8);
    }
    assert_int_equal(expect_resolved(pol(FLEXDIAG_POLICY_DENSE, 0, 0, NAN), 64).n_att, 64);
    static const double bad[] = {-0.1, 1.01, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_refused(pol(FLEXDIAG_POLICY_H2O, 0, 0, bad[i]), 64, SPARSITY, "[0, 1]");
    assert_int_equal(expect_resolved(pol(FLEXDIAG_POLICY_H2O, 0, 0, 1.0), 64).n_att, 1);
    assert_int_equal(expect_resolved(pol(FLEXDIAG_POLICY_H2O, 0, 0, 0.0), 64).n_att, 64);
    /* C API precedence: n_att > 0 wins, the sparsity is not read (the CLI refuses both) */
    assert_int_equal(expect_resolved(pol(FLEXDIAG_POLICY_WINDOW, 8, 0, 0.5), 64).n_att, 8);
    assert_int_equal(expect_resolved(pol(FLEXDIAG_POLICY_WINDOW, 8, 0, 7.0), 64).n_att, 8);
    expect_refused(pol(FLEXDIAG_POLICY_WINDOW, -1, 0, 0.5), 64, NATT " -1", ">= 1");
}

/* ---- 3. check is resolve's prefix ---- */

static void test_check_prefix(void **state) {
    (void)state;
    static const int32_t n_atts[] = {-1, 0, 1, 3, 4, 5, 8, 16, 64, 65, 40000};
    static const int32_t n_rs[] = {-1, 0, 2, 4, 5, 8, 16, 32767, 32768};
    static const double sps[] = {NAN, -0.5, 0.0, 0.5, 0.9, 1.0, 1.5};
    static const int32_t l_decs[] = {1, 16, 64, 576, 40000};
    char check_msg[1024];
    int refused = 0, total = 0;
    for (int kind = 0; kind < 8; kind++)
        for (size_t a = 0; a < sizeof n_atts / sizeof n_atts[0]; a++)
            for (size_t r = 0; r < sizeof n_rs / sizeof n_rs[0]; r++)
                for (size_t s = 0; s < sizeof sps / sizeof sps[0]; s++) {
                    flexdiag_policy_params p =
                        pol((flexdiag_policy_kind)kind, n_atts[a], n_rs[r], sps[s]);
                    flexdiag__err_clear();
                    flexdiag_status cs = flexdiag__kvp_check(&p);
                    snprintf(check_msg, sizeof check_msg, "%s", flexdiag_last_error(NULL));
                    refused += cs != FLEXDIAG_OK;
                    for (size_t l = 0; l < sizeof l_decs / sizeof l_decs[0]; l++) {
                        flexdiag_kvp_params out;
                        flexdiag__err_clear();
                        flexdiag_status rs = flexdiag__kvp_resolve(&p, l_decs[l], &out);
                        total++;
                        if (cs != FLEXDIAG_OK &&
                            (rs != cs || strcmp(flexdiag_last_error(NULL), check_msg)))
                            fail_msg("kind %d n_att %d n_r %d s %g l_dec %d: check says '%s', "
                                     "resolve %d '%s'", kind, n_atts[a], n_rs[r], sps[s],
                                     l_decs[l], check_msg, rs, flexdiag_last_error(NULL));
                        if (rs == FLEXDIAG_OK && cs != FLEXDIAG_OK)
                            fail_msg("resolve accepts what check refuses");
                        /* what resolve accepts runs as resolved: A = N_att */
                        if (rs == FLEXDIAG_OK && kind >= FLEXDIAG_POLICY_DIAGONAL)
                            assert_int_equal(flexdiag__kvp_max_slots(&out), out.n_att);
                    }
                }
    flexdiag__err_clear();
    fprintf(stderr, "  %d parameter sets, %d refused by check; %d resolves agree\n",
            8 * (int)(sizeof n_atts / sizeof n_atts[0] * sizeof n_rs / sizeof n_rs[0] *
                      sizeof sps / sizeof sps[0]),
            refused, total);
}

/* ---- 4. the public API runs the same validation ---- */

static void test_context_create(void **state) {
    (void)state;
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = 1;
    rp.gpu_mem = 1ull << 30; /* a budget, so max_images has one to fill */
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.policy = pol(FLEXDIAG_POLICY_DIAGONAL, 8, 2, NAN);
    flexdiag_context *c = (flexdiag_context *)&c;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_null(c);
    assert_non_null(strstr(flexdiag_last_error(NULL), NATT " 8 exceeds " NR " 2"));
    int32_t fit = -1; /* before: a bad policy read as "0 images fit" */
    assert_int_equal(flexdiag_context_max_images(m, &cp, &fit), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(fit, 0);
    assert_non_null(strstr(flexdiag_last_error(NULL), NATT " 8 exceeds " NR " 2"));
    cp.policy = pol(FLEXDIAG_POLICY_WINDOW, 0, 0, NAN);
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "needs a budget"));
    cp.policy = pol(FLEXDIAG_POLICY_DIAGONAL, 8, 16, NAN);
    assert_int_equal(flexdiag_context_max_images(m, &cp, &fit), FLEXDIAG_OK);
    assert_true(fit >= 1);
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    flexdiag_policy_info pi = {.struct_size = sizeof pi};
    assert_int_equal(flexdiag_context_policy(c, &pi), FLEXDIAG_OK);
    assert_int_equal(pi.n_att, 8);
    assert_int_equal(pi.n_r, 16);
    assert_int_equal(pi.l_dec, 64);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_check_prefix),
        cmocka_unit_test(test_context_create),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
