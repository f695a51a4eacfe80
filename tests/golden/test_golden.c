/*
 * test_golden.c - the CPU engine against transformers (fixtures from tools/golden/make_fixtures.py,
 * tiny random models saved in bf16 and run by transformers in float32).
 *
 * Janus: teacher-forced conditional, unconditional and CFG logits of score_input.json, hidden
 * states after every layer of the first prompt positions, the same logits with the tensors
 * renamed to the original deepseek-ai names and with the original `multi_modality` config
 * layout (both must be bit-identical to the transformers-named run), and `flexdiag score` run as
 * a separate process. Llama (GQA): continuation logits and hidden states. Relative L2 error
 * <= 1e-4 everywhere (the engine computes in fp32 from the same bf16 weights; the remaining
 * difference is summation order). A missing fixture skips (77); a wrong magic/version fails
 * naming the generator script.
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
#include "runtime/model/model.h"
#include "cli/npy.h"
#include "runtime/model/safetensors.h"
#include "st_write.h"
#include "util.h"

#define TOL 1e-4

static char *fixture(const char *model, const char *file) {
    char rel[256];
    snprintf(rel, sizeof rel, "golden/data/%s/%s", model, file);
    return tu_data_path(rel);
}

static flexdiag_npy load_npy(const char *model, const char *file) {
    char *p = fixture(model, file);
    flexdiag_npy a;
    flexdiag_status st = flexdiag__npy_read(p, &a);
    if (st != FLEXDIAG_OK) fprintf(stderr, "%s: %s\n", p, flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    free(p);
    return a;
}

/* Runtime on the CPU engine + model from dir. */
static void open_model(const char *dir, flexdiag_runtime **rt, flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    flexdiag_status st = flexdiag_model_load(*rt, dir, &mp, m);
    if (st != FLEXDIAG_OK) fprintf(stderr, "%s: %s\n", dir, flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
}

static flexdiag_context *open_context(flexdiag_model *m, int32_t np, int32_t n) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = np;
    cp.max_new_tokens = n;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    return c;
}

static void expect_close(const char *what, const float *got, const float *ref, int64_t n) {
    double e = tu_rel_l2(got, ref, n);
    fprintf(stderr, "  %-28s rel L2 %.3g\n", what, e);
    assert_true(e <= TOL);
}

/* ---- Janus ---- */

typedef struct janus_case {
    int32_t *prompt, *ids, np, n;
    float cfg;
} janus_case;

static janus_case janus_input(void) {
    char *p = fixture("janus", "score_input.json");
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    assert_non_null(root);
    janus_case jc = {0};
    json_t *a = json_object_get(root, "prompt_ids"), *b = json_object_get(root, "image_ids");
    jc.np = (int32_t)json_array_size(a);
    jc.n = (int32_t)json_array_size(b);
    jc.prompt = malloc((size_t)jc.np * 4);
    jc.ids = malloc((size_t)jc.n * 4);
    for (int32_t i = 0; i < jc.np; i++) jc.prompt[i] = (int32_t)json_integer_value(json_array_get(a, i));
    for (int32_t i = 0; i < jc.n; i++) jc.ids[i] = (int32_t)json_integer_value(json_array_get(b, i));
    jc.cfg = (float)json_number_value(json_object_get(root, "cfg_weight"));
    json_decref(root);
    free(p);
    return jc;
}

/* CFG (and optionally raw) logits of the Janus case on the model in dir. */
static float *janus_logits(const char *dir, const janus_case *jc, float **raw, int64_t *V) {
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(dir, &rt, &m);
    flexdiag_context *c = open_context(m, jc->np, jc->n);
    *V = c->vocab_out;
    float *out = malloc((size_t)jc->n * (size_t)*V * 4);
    if (raw) *raw = malloc(2 * (size_t)jc->n * (size_t)*V * 4);
    flexdiag_status st = flexdiag__context_score(c, jc->prompt, jc->np, jc->ids, jc->n, jc->cfg, out,
                                                 raw ? *raw : NULL);
    if (st != FLEXDIAG_OK) fprintf(stderr, "score: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return out;
}

static void test_janus_logits(void **state) {
    (void)state;
    janus_case jc = janus_input();
    char *dir = fixture("janus", "");
    float *raw = NULL;
    int64_t V = 0;
    float *cfg = janus_logits(dir, &jc, &raw, &V);
    flexdiag_npy rc = load_npy("janus", "logits_cfg.npy"), ru = load_npy("janus", "logits_uncond.npy");
    flexdiag_npy rk = load_npy("janus", "logits_cond.npy");
    assert_int_equal(rc.numel, (int64_t)jc.n * V);
    expect_close("janus cfg logits", cfg, rc.data, rc.numel);
    expect_close("janus cond logits", raw, rk.data, rk.numel);
    expect_close("janus uncond logits", raw + (size_t)jc.n * (size_t)V, ru.data, ru.numel);
    flexdiag__npy_free(&rc);
    flexdiag__npy_free(&ru);
    flexdiag__npy_free(&rk);
    free(cfg);
    free(raw);
    free(dir);
    free(jc.prompt);
    free(jc.ids);
}

static void test_janus_hidden(void **state) {
    (void)state;
    janus_case jc = janus_input();
    char *dir = fixture("janus", "");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(dir, &rt, &m);
    flexdiag_npy ref = load_npy("janus", "hidden_cond.npy"); /* (layers, pos, d) */
    int32_t npos = (int32_t)ref.shape[1], d = m->cfg.lm.hidden;
    assert_int_equal(ref.shape[0], m->cfg.lm.layers);
    assert_int_equal(ref.shape[2], d);
    flexdiag_context *c = open_context(m, jc.np, jc.n);
    float *hidden = calloc((size_t)ref.numel, 4);
    int32_t *tok = malloc((size_t)jc.n * 4);
    const int32_t *pp = jc.prompt;
    flexdiag_block b = {.n_img = 1, .prompt = &pp, .prompt_len = &jc.np, .n_steps = jc.n,
                        .forced = jc.ids, .cfg_weight = jc.cfg, .tokens = tok,
                        .hidden = hidden, .n_hidden_pos = npos, .sp = {1.0f, 0, 1.0f, 0}};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    expect_close("janus hidden (all layers)", hidden, ref.data, ref.numel);
    flexdiag__npy_free(&ref);
    free(hidden);
    free(tok);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    free(dir);
    free(jc.prompt);
    free(jc.ids);
}

/* Copy the fixture to tmp with every tensor under its original deepseek-ai name; without the VQ
 * decoder when keep_vq is 0 (the original config layout fixes VQ-16's full shape). */
static void write_renamed(const char *src_dir, const char *dst_dir, int keep_vq) {
    flexdiag_safetensors *st = NULL;
    assert_int_equal(flexdiag__st_open(src_dir, &st), FLEXDIAG_OK);
    int64_t n = flexdiag__st_count(st);
    flexdiag_st_entry *e = calloc((size_t)n, sizeof *e);
    char (*names)[256] = calloc((size_t)n, 256);
    for (int64_t i = 0; i < n; i++) {
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        assert_true(flexdiag__name_canonical(FLEXDIAG_ARCH_JANUS, t->name, names[i], 256) >= 0);
        if (!keep_vq && !strncmp(names[i], "gen_vision_model.", 17)) {
            e[i].name = NULL;
            continue;
        }
        float *f32 = malloc((size_t)(t->numel ? t->numel : 1) * 4);
        uint16_t *bf = malloc((size_t)(t->numel ? t->numel : 1) * 2);
        assert_int_equal(flexdiag__st_read_f32(st, t, f32), FLEXDIAG_OK);
        for (int64_t j = 0; j < t->numel; j++) bf[j] = flexdiag__f32_to_bf16(f32[j]);
        free(f32);
        e[i] = (flexdiag_st_entry){.name = names[i], .dtype = FLEXDIAG_DTYPE_BF16, .ndim = t->ndim,
                                   .data = bf};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++)
        if (e[i].name) e[kept++] = e[i];
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
    assert_int_equal(flexdiag__st_write(path, e, kept), FLEXDIAG_OK);
    n = kept;
    for (int64_t i = 0; i < n; i++) free((void *)e[i].data);
    free(e);
    free(names);
    flexdiag__st_close(st);
}

/* The transformers config rewritten in the original multi_modality layout. */
static void write_original_config(const char *src_dir, const char *dst_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    json_t *hf = json_load_file(path, 0, NULL);
    assert_non_null(hf);
    json_t *text = json_object_get(hf, "text_config"), *vq = json_object_get(hf, "vq_config");
    json_int_t emb = json_integer_value(json_object_get(vq, "embed_dim"));
    json_int_t nv = json_integer_value(json_object_get(vq, "num_embeddings"));
    json_int_t pd = json_integer_value(json_object_get(vq, "projection_dim"));
    json_int_t hid = json_integer_value(json_object_get(text, "hidden_size"));
    json_t *o = json_pack("{s:s, s:O, s:{s:{s:I, s:I}}, s:{s:{s:I, s:I, s:I}}, "
                          "s:{s:{s:I, s:I, s:I}}}",
                          "model_type", "multi_modality", "language_config", text,
                          "gen_vision_config", "params", "image_token_size", nv, "n_embed", emb,
                          "gen_aligner_config", "params", "input_dim", emb, "n_embed", pd,
                          "depth", (json_int_t)2, "gen_head_config", "params", "n_embed", pd,
                          "image_token_embed", hid, "image_token_size", nv);
    assert_non_null(o);
    snprintf(path, sizeof path, "%s/config.json", dst_dir);
    assert_int_equal(json_dump_file(o, path, 0), 0);
    json_decref(o);
    json_decref(hf);
    assert_int_equal(tu_system("cp '%s/generation_config.json' '%s/'", src_dir, dst_dir), 0);
}

static void test_janus_original_names(void **state) {
    (void)state;
    janus_case jc = janus_input();
    char *src = fixture("janus", ""), *tmp = tu_tempdir("golden");
    int64_t V = 0;
    float *ref = janus_logits(src, &jc, NULL, &V);
    write_renamed(src, tmp, 1);
    assert_int_equal(tu_system("cp '%s/config.json' '%s/generation_config.json' '%s/'", src, src,
                               tmp), 0);
    float *renamed = janus_logits(tmp, &jc, NULL, &V);
    assert_memory_equal(renamed, ref, (size_t)jc.n * (size_t)V * 4);
    write_renamed(src, tmp, 0);
    write_original_config(src, tmp);
    float *orig_cfg = janus_logits(tmp, &jc, NULL, &V);
    assert_memory_equal(orig_cfg, ref, (size_t)jc.n * (size_t)V * 4);
    fprintf(stderr, "  original names and original config layout: identical logits\n");
    free(ref);
    free(renamed);
    free(orig_cfg);
    tu_rmtree(tmp);
    free(tmp);
    free(src);
    free(jc.prompt);
    free(jc.ids);
}

/* `flexdiag score` as a user runs it, output compared with transformers. */
static void test_janus_score_cli(void **state) {
    (void)state;
    const char *bin = getenv("FLEXDIAG_BIN");
    char *dir = fixture("janus", ""), *input = fixture("janus", "score_input.json");
    char *tmp = tu_tempdir("score");
    assert_int_equal(tu_system("'%s' score --cpu --model '%s' --input '%s' --out '%s/l.npy'", bin,
                               dir, input, tmp), 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/l.npy", tmp);
    flexdiag_npy got, ref = load_npy("janus", "logits_cfg.npy");
    assert_int_equal(flexdiag__npy_read(path, &got), FLEXDIAG_OK);
    assert_int_equal(got.numel, ref.numel);
    expect_close("flexdiag score (CLI)", got.data, ref.data, ref.numel);
    flexdiag__npy_free(&got);
    flexdiag__npy_free(&ref);
    tu_rmtree(tmp);
    free(tmp);
    free(dir);
    free(input);
}

/* ---- Llama (GQA) ---- */

static void test_llama(void **state) {
    (void)state;
    char *dir = fixture("llama", "");
    flexdiag_npy ids = load_npy("llama", "input_ids.npy"), ref = load_npy("llama", "logits.npy");
    flexdiag_npy href = load_npy("llama", "hidden.npy");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(dir, &rt, &m);
    int32_t T = (int32_t)ids.numel, np = T / 2, n = T - np, V = m->cfg.lm.vocab;
    int32_t *all = malloc((size_t)T * 4), *tok = malloc((size_t)n * 4);
    for (int32_t i = 0; i < T; i++) all[i] = (int32_t)((const int64_t *)ids.data)[i];
    flexdiag_context *c = open_context(m, np, n);
    float *logits = malloc((size_t)n * (size_t)V * 4), *hidden = calloc((size_t)href.numel, 4);
    const int32_t *pp = all;
    flexdiag_block b = {.n_img = 1, .prompt = &pp, .prompt_len = &np, .n_steps = n,
                        .forced = all + np, .tokens = tok, .logits = logits,
                        .hidden = hidden, .n_hidden_pos = (int32_t)href.shape[1],
                        .sp = {1.0f, 0, 1.0f, 0}};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    /* row i predicts token np + i: transformers' logits at position np - 1 + i */
    expect_close("llama logits", logits, (const float *)ref.data + (size_t)(np - 1) * (size_t)V,
                 (int64_t)n * V);
    expect_close("llama hidden", hidden, href.data, href.numel);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    flexdiag__npy_free(&ids);
    flexdiag__npy_free(&ref);
    flexdiag__npy_free(&href);
    free(all);
    free(tok);
    free(logits);
    free(hidden);
    free(dir);
}

/* ---- OPT (pre-LayerNorm, biases, ReLU MLP, learned positions with offset 2, tied head) ---- */

/* Teacher-forced logits of all (T tokens: the first np as prompt) into logits (T - np, V), and
 * the per-layer hidden states of the first href positions into hidden when given. */
static void opt_run(flexdiag_model *m, const int32_t *all, int32_t T, int32_t np, float *logits,
                    float *hidden, int32_t n_hidden_pos) {
    int32_t n = T - np, *tok = malloc((size_t)n * 4);
    flexdiag_context *c = open_context(m, np, n);
    const int32_t *pp = all;
    flexdiag_block b = {.n_img = 1, .prompt = &pp, .prompt_len = &np, .n_steps = n,
                        .forced = all + np, .tokens = tok, .logits = logits, .hidden = hidden,
                        .n_hidden_pos = n_hidden_pos, .sp = {1.0f, 0, 1.0f, 0}};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    free(tok);
}

static void test_opt(void **state) {
    (void)state;
    char *dir = fixture("opt", "");
    flexdiag_npy ids = load_npy("opt", "input_ids.npy"), ref = load_npy("opt", "logits.npy");
    flexdiag_npy href = load_npy("opt", "hidden.npy"), pref = load_npy("opt", "padded_logits.npy");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(dir, &rt, &m);
    int32_t T = (int32_t)ids.numel, V = m->cfg.lm.vocab, n_pad = (int32_t)(pref.shape[0] - T);
    assert_int_equal(n_pad, 3);
    int32_t *all = malloc((size_t)T * 4);
    for (int32_t i = 0; i < T; i++) all[i] = (int32_t)((const int64_t *)ids.data)[i];
    float *logits = malloc((size_t)T * (size_t)V * 4), *hidden = calloc((size_t)href.numel, 4);
    /* half the tokens as the prompt: row i predicts token np + i, transformers' position
     * np - 1 + i; the layer outputs of the first positions */
    int32_t np = T / 2;
    opt_run(m, all, T, np, logits, hidden, (int32_t)href.shape[1]);
    expect_close("opt logits", logits, (const float *)ref.data + (size_t)(np - 1) * (size_t)V,
                 (int64_t)(T - np) * V);
    expect_close("opt hidden", hidden, href.data, href.numel);
    /* the same tokens left-padded with pad id 1 under an attention mask: transformers' logits
     * of the real positions (positions count real tokens only) are what the unpadded run gives */
    for (int32_t cut = 1; cut <= T - 1; cut += 7) {
        opt_run(m, all, T, cut, logits, NULL, 0);
        const float *pr = (const float *)pref.data + (size_t)(n_pad + cut - 1) * (size_t)V;
        expect_close("opt logits vs the left-padded batch", logits, pr, (int64_t)(T - cut) * V);
    }
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    flexdiag__npy_free(&ids);
    flexdiag__npy_free(&ref);
    flexdiag__npy_free(&href);
    flexdiag__npy_free(&pref);
    free(all);
    free(logits);
    free(hidden);
    free(dir);
}

/* golden.json must carry our magic and version; returns 0 if present and valid. */
static int check_manifest(const char *model) {
    char *p = fixture(model, "golden.json");
    json_t *g = json_load_file(p, 0, NULL);
    int rc = 77;
    if (!g) {
        fprintf(stderr, "golden fixture %s missing: run tools/golden/make_fixtures.py\n", p);
    } else {
        json_t *magic = json_object_get(g, "magic"), *ver = json_object_get(g, "version");
        rc = json_is_string(magic) && !strcmp(json_string_value(magic), "flexdiag-golden") &&
                     json_integer_value(ver) == 1
                 ? 0
                 : 1;
        if (rc)
            fprintf(stderr, "%s: bad magic/version: regenerate with tools/golden/make_fixtures.py\n",
                    p);
    }
    json_decref(g);
    free(p);
    return rc;
}

int main(void) {
    int a = check_manifest("janus"), b = check_manifest("llama"), o = check_manifest("opt");
    if (a == 1 || b == 1 || o == 1) return 1;
    if (a == 77 || b == 77 || o == 77) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_janus_logits),
        cmocka_unit_test(test_janus_hidden),
        cmocka_unit_test(test_janus_original_names),
        cmocka_unit_test(test_janus_score_cli),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_opt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
