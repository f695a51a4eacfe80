/*
 * golden_janus.c - Janus-Pro against transformers (tests/golden/data/janus): teacher-forced
 * conditional, unconditional and CFG generation-head logits of score_input.json, the hidden
 * states after every layer of the first prompt positions, the same logits with the tensors
 * renamed to the original deepseek-ai names and with the original `multi_modality` config layout
 * (both bit-identical to the transformers-named run), and `flexdiag score` run as a process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "golden.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"
#include "st_write.h"
#include "util.h"

typedef struct janus_case {
    int32_t *prompt, *ids, np, n; /* score_input.json: prompt_ids (np), image_ids (n) */
    float cfg;                    /* cfg_weight */
} janus_case;

static janus_case janus_input(void) {
    json_t *root = gd_json("janus", "score_input.json");
    janus_case jc = {0};
    jc.prompt = gd_json_ids(json_object_get(root, "prompt_ids"), &jc.np);
    jc.ids = gd_json_ids(json_object_get(root, "image_ids"), &jc.n);
    jc.cfg = (float)json_number_value(json_object_get(root, "cfg_weight"));
    json_decref(root);
    return jc;
}

static void janus_free(janus_case *jc) {
    free(jc->prompt);
    free(jc->ids);
}

/* CFG (and optionally raw) logits of the Janus case on the model in dir. */
static float *janus_logits(const char *dir, const janus_case *jc, float **raw, int64_t *V) {
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    flexdiag_context *c = gd_context(m, 1, jc->np, jc->n, false);
    *V = c->geo.vocab_out;
    float *out = malloc((size_t)jc->n * (size_t)*V * 4);
    if (raw) *raw = malloc(2 * (size_t)jc->n * (size_t)*V * 4);
    flexdiag_status st = flexdiag__context_score(c, jc->prompt, jc->np, jc->ids, jc->n, jc->cfg,
                                                 out, raw ? *raw : NULL);
    if (st != FLEXDIAG_OK) fprintf(stderr, "score: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    gd_close_model(rt, m);
    return out;
}

void test_janus_logits(void **state) {
    (void)state;
    janus_case jc = janus_input();
    char *dir = gd_fixture("janus", "");
    float *raw = NULL;
    int64_t V = 0;
    float *cfg = janus_logits(dir, &jc, &raw, &V);
    flexdiag_npy rc = gd_npy("janus", "logits_cfg.npy"), ru = gd_npy("janus", "logits_uncond.npy");
    flexdiag_npy rk = gd_npy("janus", "logits_cond.npy");
    assert_int_equal(rc.numel, (int64_t)jc.n * V);
    gd_expect_close("janus cfg logits", cfg, rc.data, rc.numel);
    gd_expect_close("janus cond logits", raw, rk.data, rk.numel);
    gd_expect_close("janus uncond logits", raw + (size_t)jc.n * (size_t)V, ru.data, ru.numel);
    flexdiag__npy_free(&rc);
    flexdiag__npy_free(&ru);
    flexdiag__npy_free(&rk);
    free(cfg);
    free(raw);
    free(dir);
    janus_free(&jc);
}

void test_janus_hidden(void **state) {
    (void)state;
    janus_case jc = janus_input();
    char *dir = gd_fixture("janus", "");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    flexdiag_npy ref = gd_npy("janus", "hidden_cond.npy"); /* (layers, pos, d) */
    int32_t npos = (int32_t)ref.shape[1], d = m->cfg.lm.hidden;
    assert_int_equal(ref.shape[0], m->cfg.lm.layers);
    assert_int_equal(ref.shape[2], d);
    flexdiag_context *c = gd_context(m, 1, jc.np, jc.n, false);
    float *hidden = calloc((size_t)ref.numel, 4);
    int32_t *tok = malloc((size_t)jc.n * 4);
    const int32_t *pp = jc.prompt;
    flexdiag_block b = {.n_img = 1, .prompt = &pp, .prompt_len = &jc.np, .n_steps = jc.n,
                        .forced = jc.ids, .cfg_weight = jc.cfg, .tokens = tok,
                        .hidden = hidden, .n_hidden_pos = npos, .sp = {1.0f, 0, 1.0f, 0}};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    gd_expect_close("janus hidden (all layers)", hidden, ref.data, ref.numel);
    flexdiag__npy_free(&ref);
    free(hidden);
    free(tok);
    flexdiag_context_destroy(c);
    gd_close_model(rt, m);
    free(dir);
    janus_free(&jc);
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
    for (int64_t i = 0; i < kept; i++) free((void *)e[i].data);
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

void test_janus_original_names(void **state) {
    (void)state;
    janus_case jc = janus_input();
    char *src = gd_fixture("janus", ""), *tmp = tu_tempdir("golden");
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
    janus_free(&jc);
}

/* `flexdiag score` as a user runs it, output compared with transformers. */
void test_janus_score_cli(void **state) {
    (void)state;
    const char *bin = getenv("FLEXDIAG_BIN");
    char *dir = gd_fixture("janus", ""), *input = gd_fixture("janus", "score_input.json");
    char *tmp = tu_tempdir("score");
    assert_int_equal(tu_system("'%s' score --cpu --model '%s' --input '%s' --out '%s/l.npy'", bin,
                               dir, input, tmp), 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/l.npy", tmp);
    flexdiag_npy got, ref = gd_npy("janus", "logits_cfg.npy");
    assert_int_equal(flexdiag__npy_read(path, &got), FLEXDIAG_OK);
    assert_int_equal(got.numel, ref.numel);
    gd_expect_close("flexdiag score (CLI)", got.data, ref.data, ref.numel);
    flexdiag__npy_free(&got);
    flexdiag__npy_free(&ref);
    tu_rmtree(tmp);
    free(tmp);
    free(dir);
    free(input);
}
