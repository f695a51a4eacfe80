/*
 * test_lumina.c - Lumina-mGPT (Chameleon) image generation on the builtin micro-lumina model
 * (CPU): CFG with an unconditional row of its own length (the image start and the two size
 * tokens at positions 0..2) against two separate text-mode runs, the forced row ends, code
 * grids out of flexdiag_generate that do not depend on the batch (ragged rows together), every
 * KV policy on the 72-token image region, and the prompt checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/engine/engine.h"
#include "util.h"

#define GRID 8
#define ROW (GRID + 1)
#define N_IDS (2 * ROW) /* two rows of codes and their row ends */
#define CFG 4.0f

static flexdiag_runtime *g_rt;
static flexdiag_model *g_m;

static int setup(void **state) {
    (void)state;
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = 2;
    if (flexdiag_runtime_create(&rp, &g_rt) != FLEXDIAG_OK) return 1;
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-lumina";
    mp.seed = 5;
    return flexdiag_model_load(g_rt, NULL, &mp, &g_m) != FLEXDIAG_OK;
}

static int teardown(void **state) {
    (void)state;
    flexdiag_model_destroy(g_m);
    flexdiag_runtime_destroy(g_rt);
    return 0;
}

static flexdiag_context *context(int32_t images, bool text, flexdiag_policy_kind kind,
                                 int32_t new_tokens) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = images;
    cp.max_prompt_len = 128;
    cp.max_new_tokens = new_tokens;
    cp.text = text;
    cp.policy.kind = kind;
    cp.policy.sparsity = kind == FLEXDIAG_POLICY_DENSE ? 0.0 : 0.5;
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(g_m, &cp, &c);
    if (st != FLEXDIAG_OK) fprintf(stderr, "context: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    return c;
}

/* A cond prompt: BOS, text ids, end of turn, image start, size twice; the image-region ids:
 * GRID codes then the row end, twice. */
static int32_t make_case(int32_t *prompt, int32_t *ids) {
    const flexdiag_model_config *m = &g_m->cfg;
    int32_t n = 0;
    prompt[n++] = m->bos_id;
    for (int32_t i = 0; i < 6; i++) prompt[n++] = 300 + 17 * i;
    prompt[n++] = m->eot_id;
    prompt[n++] = m->boi_id;
    prompt[n++] = m->size_id;
    prompt[n++] = m->size_id;
    for (int32_t i = 0; i < N_IDS; i++)
        ids[i] = i % ROW == GRID ? m->row_end_id : m->img_id0 + (7 * i + 3) % m->image_vocab;
    return n;
}

/* Text-mode logits (n, V) of ids after prompt (np). */
static void text_logits(const int32_t *prompt, int32_t np, const int32_t *ids, int32_t n,
                        float *out) {
    flexdiag_context *c = context(1, true, FLEXDIAG_POLICY_DENSE, n);
    assert_int_equal(c->geo.vocab_out, g_m->cfg.lm.vocab);
    assert_int_equal(flexdiag__context_score(c, prompt, np, ids, n, 1.0f, out, NULL), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
}

/* Image-mode scoring equals CFG over two text-mode runs: the cond prompt, and the image start
 * with the size tokens alone (positions from 0), restricted to the image-code columns. */
static void test_cfg_matches_two_text_runs(void **state) {
    (void)state;
    const flexdiag_model_config *m = &g_m->cfg;
    int32_t prompt[32], ids[N_IDS], V = m->lm.vocab, K = m->image_vocab;
    int32_t np = make_case(prompt, ids);
    float *cond = malloc((size_t)N_IDS * V * 4), *unc = malloc((size_t)N_IDS * V * 4);
    text_logits(prompt, np, ids, N_IDS, cond);
    text_logits(prompt + np - 3, 3, ids, N_IDS, unc);
    flexdiag_context *c = context(1, false, FLEXDIAG_POLICY_DENSE, 0);
    assert_int_equal(c->geo.vocab_out, K);
    assert_int_equal(c->geo.l_dec, GRID * ROW);
    float *got = malloc((size_t)N_IDS * K * 4), *raw = malloc(2 * (size_t)N_IDS * K * 4);
    float *want = malloc((size_t)N_IDS * K * 4), *wc = malloc((size_t)N_IDS * K * 4);
    float *wu = malloc((size_t)N_IDS * K * 4);
    assert_int_equal(flexdiag__context_score(c, prompt, np, ids, N_IDS, CFG, got, raw), FLEXDIAG_OK);
    for (int32_t t = 0; t < N_IDS; t++)
        for (int32_t j = 0; j < K; j++) {
            float cv = cond[(size_t)t * V + m->img_id0 + j], uv = unc[(size_t)t * V + m->img_id0 + j];
            wc[(size_t)t * K + j] = cv;
            wu[(size_t)t * K + j] = uv;
            want[(size_t)t * K + j] = uv + CFG * (cv - uv);
        }
    double e = tu_rel_l2(got, want, (int64_t)N_IDS * K);
    double ec = tu_rel_l2(raw, wc, (int64_t)N_IDS * K);
    double eu = tu_rel_l2(raw + (size_t)N_IDS * K, wu, (int64_t)N_IDS * K);
    fprintf(stderr, "  cfg rel L2 %.3g, cond %.3g, uncond %.3g\n", e, ec, eu);
    assert_true(e < 1e-5 && ec < 1e-5 && eu < 1e-5);
    flexdiag_context_destroy(c);
    free(cond);
    free(unc);
    free(got);
    free(raw);
    free(want);
    free(wc);
    free(wu);
}

/* n images of prompts "p0", "a longer prompt", ... through the public API on a context of
 * batch images: code grids (n, GRID * GRID). */
static int32_t *generate(int32_t batch, flexdiag_policy_kind kind, int32_t n) {
    flexdiag_context *c = context(batch, false, kind, 0);
    const char *prompts[3] = {"p0", "a longer prompt of a red cat", "  p2 "};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 3;
    rq.prompts = prompts;
    rq.images_per_prompt = 2;
    rq.seed = 3;
    rq.top_k = 16;
    flexdiag_output out = {0};
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_OK);
    assert_int_equal(out.tokens_per_image, GRID * GRID);
    assert_true(out.n_images >= n);
    out.tokens = malloc((size_t)out.n_images * GRID * GRID * 4);
    flexdiag_status st = flexdiag_generate(c, &rq, &out);
    if (st != FLEXDIAG_OK) fprintf(stderr, "generate: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    for (int32_t i = 0; i < out.n_images * GRID * GRID; i++)
        assert_true(out.tokens[i] >= 0 && out.tokens[i] < g_m->cfg.image_vocab);
    flexdiag_context_destroy(c);
    return out.tokens;
}

/* Images do not depend on the batch they ran in (prompts of different lengths together, each
 * with its 3-token unconditional row), under every policy. */
static void test_codes_batch_independent(void **state) {
    (void)state;
    for (int k = 0; k <= FLEXDIAG_POLICY_LINE_AR; k++) {
        int32_t *a = generate(6, (flexdiag_policy_kind)k, 6), *b = generate(1, (flexdiag_policy_kind)k, 6);
        assert_memory_equal(a, b, 6 * GRID * GRID * 4);
        if (k == FLEXDIAG_POLICY_DENSE) { /* the two samples of a prompt differ */
            assert_true(memcmp(a, a + GRID * GRID, GRID * GRID * 4) != 0);
        }
        free(a);
        free(b);
    }
}

/* The engine's own sequence: a row end after every GRID codes, codes everywhere else. */
static void test_row_ends_forced(void **state) {
    (void)state;
    const flexdiag_model_config *m = &g_m->cfg;
    flexdiag_context *c = context(2, false, FLEXDIAG_POLICY_DIAGONAL, 0);
    int32_t prompt[32], ids[N_IDS], *tok = malloc(2 * (size_t)c->geo.l_dec * 4);
    int32_t np = make_case(prompt, ids), lens[2] = {np, np - 2};
    int32_t p2[32];
    memcpy(p2, prompt, (size_t)np * 4);
    memmove(p2 + 1, p2 + 3, (size_t)(np - 3) * 4); /* a shorter second prompt */
    const int32_t *pp[2] = {prompt, p2};
    flexdiag_block b = {.n_img = 2, .prompt = pp, .prompt_len = lens, .n_steps = c->geo.l_dec,
                        .cfg_weight = CFG, .tokens = tok, .sp = {1.0f, 8, 1.0f, 9, 0}};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    for (int32_t i = 0; i < 2 * c->geo.l_dec; i++) {
        int32_t t = i % c->geo.l_dec;
        if (t % ROW == GRID) assert_int_equal(tok[i], m->row_end_id);
        else assert_true(tok[i] >= m->img_id0 && tok[i] < m->img_id0 + m->image_vocab);
    }
    flexdiag_context_destroy(c);
    free(tok);
}

/* A prompt that does not end with the image start and two size tokens is refused. */
static void test_prompt_checked(void **state) {
    (void)state;
    flexdiag_context *c = context(1, false, FLEXDIAG_POLICY_DENSE, 0);
    int32_t prompt[32], ids[N_IDS];
    int32_t np = make_case(prompt, ids);
    assert_int_equal(flexdiag__context_score(c, prompt, np - 1, ids, N_IDS, CFG, NULL, NULL),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "image start"));
    flexdiag_context_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cfg_matches_two_text_runs),
        cmocka_unit_test(test_codes_batch_independent),
        cmocka_unit_test(test_row_ends_forced),
        cmocka_unit_test(test_prompt_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
