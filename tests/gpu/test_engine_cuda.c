/*
 * test_engine_cuda.c - the whole engine on CUDA against the CPU engine, on the transformers
 * golden fixture: teacher-forced CFG logits within relative L2 2e-2 (bf16 compute on the GPU vs
 * fp32 on the CPU; the measured value is printed), and for every KV policy the attended ring
 * slots of every (step, layer, sequence, KV head) identical on both backends (the policy state
 * machines are shared; this checks the GPU logits never flip a selection), plus the fixture's
 * transformers logits within the same bound. Exits 77 without a CUDA device or fixture.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "runtime/engine/engine.h"
#include "cli/npy.h"
#include "util.h"

#define TOL_GPU 2e-2

typedef struct fixture {
    char *dir;
    int32_t *prompt, *ids, np, n;
    float cfg;
} fixture;

static fixture g_fx;

static int load_fixture(fixture *fx) {
    fx->dir = tu_data_path("golden/data/janus");
    char path[4096];
    snprintf(path, sizeof path, "%s/score_input.json", fx->dir);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return -1;
    json_t *a = json_object_get(root, "prompt_ids"), *b = json_object_get(root, "image_ids");
    fx->np = (int32_t)json_array_size(a);
    fx->n = (int32_t)json_array_size(b);
    fx->prompt = malloc((size_t)fx->np * 4);
    fx->ids = malloc((size_t)fx->n * 4);
    for (int32_t i = 0; i < fx->np; i++) fx->prompt[i] = (int32_t)json_integer_value(json_array_get(a, i));
    for (int32_t i = 0; i < fx->n; i++) fx->ids[i] = (int32_t)json_integer_value(json_array_get(b, i));
    fx->cfg = (float)json_number_value(json_object_get(root, "cfg_weight"));
    json_decref(root);
    return 0;
}

typedef struct run_out {
    float *logits;   /* (n, V) */
    int32_t *plan;   /* plan_out */
    size_t plan_len; /* entries */
    int64_t V;
} run_out;

static run_out score(int device, const flexdiag_policy_params *pol) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = device;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    assert_string_equal(rt->k->name, device >= 0 ? "cuda" : "cpu");
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, g_fx.dir, &mp, &m), FLEXDIAG_OK);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = g_fx.np;
    cp.policy = *pol;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    run_out o = {.V = c->geo.vocab_out};
    o.plan_len = (size_t)(g_fx.n - 1) * (size_t)m->cfg.lm.layers * 2 * (size_t)m->cfg.lm.kv_heads *
                 (size_t)(1 + c->pd.max_slots);
    o.plan = calloc(o.plan_len, 4);
    o.logits = malloc((size_t)g_fx.n * (size_t)o.V * 4);
    int32_t *tok = malloc((size_t)g_fx.n * 4);
    const int32_t *pp = g_fx.prompt;
    flexdiag_block b = {.n_img = 1, .prompt = &pp, .prompt_len = &g_fx.np, .n_steps = g_fx.n,
                        .forced = g_fx.ids, .cfg_weight = g_fx.cfg, .tokens = tok,
                        .logits = o.logits, .plan_out = o.plan, .sp = {1.0f, 0, 1.0f, 0}};
    flexdiag_status st = flexdiag__engine_run(c, &b);
    if (st != FLEXDIAG_OK) fprintf(stderr, "engine: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    free(tok);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return o;
}

static void check_policy(flexdiag_policy_kind kind) {
    flexdiag_policy_params pol;
    flexdiag_policy_params_init(&pol);
    pol.kind = kind;
    pol.n_att = kind == FLEXDIAG_POLICY_DENSE ? 0 : 5; /* evicts within the fixture's tokens */
    pol.n_r = kind >= FLEXDIAG_POLICY_DIAGONAL ? 7 : 0;
    run_out cpu = score(-1, &pol), gpu = score(0, &pol);
    double e = tu_rel_l2(gpu.logits, cpu.logits, (int64_t)g_fx.n * cpu.V);
    size_t diff = 0;
    for (size_t i = 0; i < cpu.plan_len; i++) diff += cpu.plan[i] != gpu.plan[i];
    fprintf(stderr, "  %-15s GPU vs CPU logits rel L2 %.3g, plan entries differing %zu / %zu\n",
            flexdiag__kvp_name(kind), e, diff, cpu.plan_len);
    assert_true(e <= TOL_GPU);
    assert_int_equal(diff, 0);
    if (kind == FLEXDIAG_POLICY_DENSE) {
        char *p = tu_data_path("golden/data/janus/logits_cfg.npy");
        flexdiag_npy ref;
        assert_int_equal(flexdiag__npy_read(p, &ref), FLEXDIAG_OK);
        double et = tu_rel_l2(gpu.logits, ref.data, ref.numel);
        fprintf(stderr, "  GPU vs transformers fp32 logits rel L2 %.3g\n", et);
        assert_true(et <= TOL_GPU);
        flexdiag__npy_free(&ref);
        free(p);
    }
    free(cpu.logits);
    free(cpu.plan);
    free(gpu.logits);
    free(gpu.plan);
}

static void test_all_policies(void **state) {
    (void)state;
    for (int k = FLEXDIAG_POLICY_DENSE; k <= FLEXDIAG_POLICY_DIAGONAL_SINK4; k++)
        check_policy((flexdiag_policy_kind)k);
}

int main(void) {
    if (!flexdiag__have_cuda()) {
        fprintf(stderr, "test_engine_cuda: built without CUDA\n");
        return 77;
    }
    size_t fb = 0, tb = 0;
    if (flexdiag__kernels_cuda()->mem_info(&fb, &tb) != FLEXDIAG_OK || tb == 0) {
        fprintf(stderr, "test_engine_cuda: no usable CUDA device\n");
        return 77;
    }
    if (load_fixture(&g_fx) != 0) {
        fprintf(stderr, "test_engine_cuda: golden fixture missing (tools/golden/make_fixtures.py)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_policies)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
