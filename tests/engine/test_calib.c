/*
 * test_calib.c - ssd and hack through contexts (docs/policies.md §7.2, §9, §10): a calibration
 * table collected by the engine (micro-janus, dense attention through the collector kind) has
 * the model's shape, distributions for profiles and the steps it says it recorded, and comes
 * out the same twice; with it, ssd and hack at sparsity 0 give dense's teacher-forced logits bit
 * for bit, ssd with tau 0 gives the window policy's, and a sparse run differs from dense; a
 * context refuses them without a table, with a missing or damaged file, with another model's
 * table, on a text model, and with ssd_tau NaN, each naming context_params.policy_calib (or
 * ssd_tau). continuous == alone for both is in test_continuous.c.
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

#include "base/core.h"
#include "calib_table.h"
#include "policy/kvp_calib.h"
#include "runtime/engine/ctx_calib.h"
#include "runtime/engine/engine.h"
#include "util.h"

static char *dir;

static void open_builtin(const char *arch, flexdiag_runtime **rt, flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = 2;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = arch;
    mp.seed = 3;
    assert_int_equal(flexdiag_model_load(*rt, NULL, &mp, m), FLEXDIAG_OK);
}

static flexdiag_status make_ctx(flexdiag_model *m, flexdiag_policy_kind kind, double sparsity,
                                const char *calib, double tau, flexdiag_context **c) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = 6;
    cp.policy.kind = kind;
    cp.policy.sparsity = sparsity;
    cp.policy_calib = calib;
    cp.ssd_tau = tau;
    *c = NULL;
    return flexdiag_context_create(m, &cp, c);
}

/* Teacher-forced CFG logits (64 steps x 256) of kind on micro-janus. */
static float *forced_logits(flexdiag_model *m, flexdiag_policy_kind kind, double sparsity,
                            const char *calib, double tau) {
    flexdiag_context *c = NULL;
    flexdiag_status st = make_ctx(m, kind, sparsity, calib, tau, &c);
    if (st != FLEXDIAG_OK) fail_msg("context: %s", flexdiag_last_error(NULL));
    int32_t prompt[6] = {256, 259, 'h', 'i', 260, 261}, ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (i * 53 + 7) % 256;
    float *l = malloc(64 * 256 * 4);
    assert_int_equal(flexdiag__context_score(c, prompt, 6, ids, 64, 5.0f, l, NULL), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    return l;
}

static void test_collected_table(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin("micro-janus", &rt, &m);
    char *a = ct_calib_file(m, dir, "a.calib"), *b = ct_calib_file(m, dir, "b.calib");
    size_t na = 0, nb = 0;
    char *da = tu_read_file(a, &na), *db = tu_read_file(b, &nb);
    assert_true(na == nb && !memcmp(da, db, na)); /* the same run, the same bytes */
    flexdiag_kvp_calib *t = NULL;
    assert_int_equal(flexdiag__kvp_calib_read(a, &t), FLEXDIAG_OK);
    assert_true(t->w_s == 8 && t->l_dec == 64 && t->n_layers == 2 && t->h_q == 4 && t->h_kv == 4);
    assert_true(t->t0 == 32 && t->t_end == 63);
    assert_int_equal(t->pairs, 2 * 2 * (63 - 32)); /* 2 images x 2 CFG rows x 31 steps */
    assert_true(t->config_hash == flexdiag__model_config_hash(&m->cfg));
    for (int32_t r = 0; r < 8; r++) {
        double s = 0;
        for (int32_t l = 0; l < 64; l++) s += t->P[r * 64 + l];
        assert_true(fabs(s - 1.0) < 1e-4);
        assert_true(t->P[r * 64 + 63] == 0.0f); /* no recorded step reaches lag 63 */
        assert_true(t->V[r] > 0 && isfinite(t->V[r]));
    }
    flexdiag__kvp_calib_free(t);
    free(da), free(db), free(a), free(b);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* Sparsity 0: dense bit for bit; tau 0 (ssd_tau negative): the window policy's logits; at
 * sparsity 0.6 both policies attend less and their logits move. */
static void test_logits(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin("micro-janus", &rt, &m);
    char *f = ct_calib_file(m, dir, "m.calib");
    float *dense = forced_logits(m, FLEXDIAG_POLICY_DENSE, 0.0, NULL, 0);
    for (int k = FLEXDIAG_POLICY_SSD; k <= FLEXDIAG_POLICY_HACK; k++) {
        float *l = forced_logits(m, (flexdiag_policy_kind)k, 0.0, f, 0);
        assert_memory_equal(l, dense, 64 * 256 * 4);
        free(l);
        l = forced_logits(m, (flexdiag_policy_kind)k, 0.6, f, 0);
        assert_true(memcmp(l, dense, 64 * 256 * 4) != 0);
        free(l);
    }
    float *win = forced_logits(m, FLEXDIAG_POLICY_WINDOW, 0.6, NULL, 0);
    float *ssd0 = forced_logits(m, FLEXDIAG_POLICY_SSD, 0.6, f, -1.0);
    assert_memory_equal(win, ssd0, 64 * 256 * 4);
    free(win), free(ssd0), free(dense), free(f);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

static void expect_refused(flexdiag_model *m, flexdiag_policy_kind kind, const char *calib,
                           double tau, flexdiag_status want, const char *a, const char *b) {
    flexdiag_context *c = NULL;
    assert_int_equal(make_ctx(m, kind, 0.6, calib, tau, &c), want);
    assert_null(c);
    const char *msg = flexdiag_last_error(NULL);
    if (!strstr(msg, a) || (b && !strstr(msg, b)))
        fail_msg("message '%s' lacks '%s' / '%s'", msg, a, b ? b : "");
}

/* A copy of table file f claiming another model's config hash. */
static char *other_model(const char *f) {
    flexdiag_kvp_calib *t = NULL;
    assert_int_equal(flexdiag__kvp_calib_read(f, &t), FLEXDIAG_OK);
    t->config_hash ^= 1;
    char *o = malloc(strlen(dir) + 16);
    sprintf(o, "%s/other.calib", dir);
    assert_int_equal(flexdiag__kvp_calib_write(o, t), FLEXDIAG_OK);
    flexdiag__kvp_calib_free(t);
    return o;
}

static void test_refusals(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m, *text;
    open_builtin("micro-janus", &rt, &m);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-opt";
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &text), FLEXDIAG_OK);
    char *f = ct_calib_file(m, dir, "r.calib"), *other = other_model(f);
    char missing[4200], damaged[4200];
    snprintf(missing, sizeof missing, "%s/none.calib", dir);
    snprintf(damaged, sizeof damaged, "%s/damaged.calib", dir);
    size_t n = 0;
    unsigned char *bytes = tu_read_file(f, &n);
    bytes[200] ^= 1;
    assert_int_equal(tu_write_file(damaged, bytes, n), 0);
    free(bytes);
    expect_refused(m, FLEXDIAG_POLICY_SSD, NULL, 0, FLEXDIAG_ERR_INVALID_ARG,
                   "ssd needs a calibration table", "context_params.policy_calib");
    expect_refused(m, FLEXDIAG_POLICY_HACK, missing, 0, FLEXDIAG_ERR_NOT_FOUND,
                   "context_params.policy_calib", missing);
    expect_refused(m, FLEXDIAG_POLICY_HACK, damaged, 0, FLEXDIAG_ERR_INVALID_ARG, "checksum",
                   damaged);
    expect_refused(m, FLEXDIAG_POLICY_SSD, other, 0, FLEXDIAG_ERR_INVALID_ARG,
                   "made for another model", other);
    expect_refused(text, FLEXDIAG_POLICY_SSD, f, 0, FLEXDIAG_ERR_INVALID_ARG,
                   "needs an image grid", NULL);
    expect_refused(m, FLEXDIAG_POLICY_SSD, f, NAN, FLEXDIAG_ERR_INVALID_ARG,
                   "context_params.ssd_tau", NULL);
    int32_t fit = 0; /* the byte estimate reads the table too */
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.policy.kind = FLEXDIAG_POLICY_HACK;
    cp.policy.sparsity = 0.6;
    assert_int_equal(flexdiag_context_max_images(m, &cp, &fit), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "needs a calibration table"));
    flexdiag_context *c = NULL; /* the other policies ignore the field */
    assert_int_equal(make_ctx(m, FLEXDIAG_POLICY_H2O, 0.6, missing, 0, &c), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    free(f), free(other);
    flexdiag_model_destroy(text);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

static int setup(void **state) {
    (void)state;
    dir = tu_tempdir("calib-engine");
    return dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(dir);
    free(dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collected_table),
        cmocka_unit_test(test_logits),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
