/*
 * golden_chameleon.c - Chameleon as Lumina-mGPT stores it (QK-norm tables [1, head_dim], no VQ
 * tensors; tests/golden/data/chameleon) against transformers' ChameleonForConditionalGeneration.
 * Text mode (context param text): teacher-forced logits over the whole vocabulary and the
 * hidden states after every layer; the same model with the QK norms stored [heads, head_dim]
 * (repeated rows) gives bit-identical logits. Image mode (the default): flexdiag__context_score
 * of the conditional prompt gives the CFG logits over the image codes (the engine builds
 * Lumina's unconditional row, image start + size twice, from the prompt's last three ids) and
 * both rows' raw logits, checked separately on the rows that predict an image code and on the
 * rows that predict the row-end token (which the engine forces when it samples, but still
 * computes like any other row).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "golden.h"
#include "runtime/model/safetensors.h"
#include "image/tiny_vq.h"
#include "st_write.h"
#include "util.h"

/* ---- text mode ---- */

/* Teacher-forced text logits (T - T/2, V) of the fixture's input_ids on the model in dir, and
 * the hidden states into hidden (n_hidden_pos positions) when given. */
static float *text_logits(const char *dir, const flexdiag_npy *ids, float *hidden,
                          int32_t n_hidden_pos, int32_t *V) {
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    int32_t T = (int32_t)ids->numel, np = T / 2, *all = gd_npy_ids(ids);
    *V = m->cfg.lm.vocab;
    float *logits = malloc((size_t)(T - np) * (size_t)*V * 4);
    gd_teacher_forced(m, true, all, T, np, logits, hidden, n_hidden_pos);
    gd_close_model(rt, m);
    free(all);
    return logits;
}

void test_chameleon_text(void **state) {
    (void)state;
    char *dir = gd_fixture("chameleon", "");
    flexdiag_npy ids = gd_npy("chameleon", "input_ids.npy");
    flexdiag_npy ref = gd_npy("chameleon", "logits.npy"), href = gd_npy("chameleon", "hidden.npy");
    float *hidden = calloc((size_t)href.numel, 4);
    int32_t V = 0, T = (int32_t)ids.numel, np = T / 2;
    float *logits = text_logits(dir, &ids, hidden, (int32_t)href.shape[1], &V);
    assert_int_equal(ref.shape[1], V);
    /* row i predicts token np + i: transformers' logits at position np - 1 + i */
    gd_expect_close("chameleon text logits (whole vocabulary)", logits,
                    (const float *)ref.data + (size_t)(np - 1) * (size_t)V, (int64_t)(T - np) * V);
    gd_expect_close("chameleon hidden", hidden, href.data, href.numel);
    flexdiag__npy_free(&ids);
    flexdiag__npy_free(&ref);
    flexdiag__npy_free(&href);
    free(logits);
    free(hidden);
    free(dir);
}

/* One tensor of the copy: bf16 data (malloc'ed) with the QK-norm tables [1, d_h] repeated to
 * [heads, d_h]; *qk counts the tables repeated. */
static flexdiag_st_entry heads_layout(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                      int64_t heads, int *qk) {
    bool table = strstr(t->name, "self_attn.q_norm.") || strstr(t->name, "self_attn.k_norm.");
    int64_t rows = table && t->ndim == 2 && t->shape[0] == 1 ? heads : 1;
    float *f32 = malloc((size_t)(t->numel ? t->numel : 1) * 4);
    uint16_t *bf = malloc((size_t)(t->numel ? t->numel : 1) * (size_t)rows * 2);
    assert_true(f32 && bf);
    assert_int_equal(flexdiag__st_read_f32(st, t, f32), FLEXDIAG_OK);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < t->numel; j++) bf[r * t->numel + j] = flexdiag__f32_to_bf16(f32[j]);
    free(f32);
    flexdiag_st_entry e = {.name = t->name, .dtype = FLEXDIAG_DTYPE_BF16, .ndim = t->ndim,
                           .data = bf};
    memcpy(e.shape, t->shape, sizeof t->shape);
    e.shape[0] *= rows;
    *qk += rows > 1;
    return e;
}

/* Copy the fixture into dst with every QK-norm table stored [heads, d_h]; returns how many. */
static int write_heads_layout(const char *src, const char *dst, int64_t heads) {
    flexdiag_safetensors *st = NULL;
    assert_int_equal(flexdiag__st_open(src, &st), FLEXDIAG_OK);
    int64_t n = flexdiag__st_count(st);
    flexdiag_st_entry *e = calloc((size_t)n, sizeof *e);
    int qk = 0;
    for (int64_t i = 0; i < n; i++) e[i] = heads_layout(st, flexdiag__st_at(st, i), heads, &qk);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    assert_int_equal(flexdiag__st_write(path, e, n), FLEXDIAG_OK);
    for (int64_t i = 0; i < n; i++) free((void *)e[i].data);
    free(e);
    flexdiag__st_close(st);
    assert_int_equal(tu_system("cp '%s/config.json' '%s/'", src, dst), 0);
    return qk;
}

/* Both QK-norm layouts load and give the same bits: [1, d_h] (the fixture, as Lumina stores
 * them) and [heads, d_h] (as transformers does). */
void test_chameleon_qk_layouts(void **state) {
    (void)state;
    char *src = gd_fixture("chameleon", ""), *tmp = tu_tempdir("chameleon");
    flexdiag_npy ids = gd_npy("chameleon", "input_ids.npy");
    json_t *cfg = gd_json("chameleon", "config.json");
    int64_t heads = json_integer_value(json_object_get(cfg, "num_attention_heads"));
    int64_t layers = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    int32_t V = 0, n = (int32_t)(ids.numel - ids.numel / 2);
    float *ref = text_logits(src, &ids, NULL, 0, &V);
    assert_int_equal(write_heads_layout(src, tmp, heads), 4 * layers); /* q, k x gamma, beta */
    float *got = text_logits(tmp, &ids, NULL, 0, &V);
    assert_memory_equal(got, ref, (size_t)n * (size_t)V * 4);
    fprintf(stderr, "  QK norms [1, d_h] and [%lld, d_h]: identical logits\n", (long long)heads);
    free(ref);
    free(got);
    json_decref(cfg);
    flexdiag__npy_free(&ids);
    tu_rmtree(tmp);
    free(tmp);
    free(src);
}

/* ---- image mode ---- */

/* The rows of x (n, V) whose image id is (code = 1) or is not (code = 0) the row end, packed
 * into a new array; *k = their count. */
static float *pick_rows(const float *x, const int32_t *ids, int32_t n, int32_t V, int32_t row_end,
                        int code, int32_t *k) {
    float *out = malloc((size_t)(n ? n : 1) * (size_t)V * 4);
    *k = 0;
    for (int32_t i = 0; i < n; i++)
        if ((ids[i] != row_end) == code)
            memcpy(out + (size_t)(*k)++ * (size_t)V, x + (size_t)i * (size_t)V, (size_t)V * 4);
    return out;
}

/* Compare got (n, V) with the fixture's ref_file, the code rows and the row-end rows apart. */
static void image_rows_close(const char *what, const float *got, const char *ref_file,
                             const int32_t *ids, int32_t n, int32_t V, int32_t row_end) {
    flexdiag_npy ref = gd_npy("chameleon", ref_file);
    assert_int_equal(ref.numel, (int64_t)n * V);
    for (int code = 1; code >= 0; code--) {
        int32_t k = 0;
        float *g = pick_rows(got, ids, n, V, row_end, code, &k);
        float *r = pick_rows(ref.data, ids, n, V, row_end, code, &k);
        char label[96];
        snprintf(label, sizeof label, "%s, %d rows before %s", what, k,
                 code ? "a code" : "a row end");
        gd_expect_close(label, g, r, (int64_t)k * V);
        free(g);
        free(r);
    }
    flexdiag__npy_free(&ref);
}

void test_chameleon_image(void **state) {
    (void)state;
    json_t *in = gd_json("chameleon", "image_input.json");
    int32_t np = 0, n = 0, *cond = gd_json_ids(json_object_get(in, "cond_prompt"), &np);
    int32_t *ids = gd_json_ids(json_object_get(in, "image_ids"), &n);
    int32_t row_end = (int32_t)json_integer_value(json_object_get(in, "row_end_id"));
    float w = (float)json_number_value(json_object_get(in, "cfg_weight"));
    char *dir = gd_fixture("chameleon", "");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    flexdiag_context *c = gd_context(m, 1, np, n, false);
    int32_t V = c->geo.vocab_out;
    assert_int_equal(V, json_array_size(json_object_get(in, "code_of_id")));
    float *cfg = malloc((size_t)n * (size_t)V * 4), *raw = malloc(2 * (size_t)n * (size_t)V * 4);
    flexdiag_status st = flexdiag__context_score(c, cond, np, ids, n, w, cfg, raw);
    if (st != FLEXDIAG_OK) fprintf(stderr, "score: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    image_rows_close("chameleon image cfg", cfg, "image_logits_cfg.npy", ids, n, V, row_end);
    image_rows_close("chameleon image cond", raw, "image_logits_cond.npy", ids, n, V, row_end);
    image_rows_close("chameleon image uncond", raw + (size_t)n * (size_t)V,
                     "image_logits_uncond.npy", ids, n, V, row_end);
    flexdiag_context_destroy(c);
    gd_close_model(rt, m);
    free(cfg);
    free(raw);
    free(dir);
    free(cond);
    free(ids);
    json_decref(in);
}

/* ---- a user-supplied VQGAN beside the checkpoint ---- */

/* Copy the fixture's config and weights into dir, and a random taming-named VQGAN (tv, 64
 * codes, the fixture's 8 x 8 grid, three levels, no level attention: Chameleon's structure at
 * test size) as dir/vqgan.safetensors. */
static void folder_with_vqgan(const char *dir, tv_model *tv) {
    static const char *files[2] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *src = gd_fixture("chameleon", files[i]), dst[4096];
        size_t n = 0;
        void *data = tu_read_file(src, &n);
        assert_non_null(data);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        assert_int_equal(tu_write_file(dst, data, n), 0);
        free(data);
        free(src);
    }
    flexdiag_vq_config cfg = tv_tiny_config();
    cfg.codebook_size = 64;
    cfg.grid_h = cfg.grid_w = 8;
    memset(cfg.attn, 0, sizeof cfg.attn);
    cfg.layout = FLEXDIAG_VQ_LAYOUT_TAMING;
    cfg.l2_codebook = 0;
    tv_build(tv, &cfg, 17);
    char path[4096];
    snprintf(path, sizeof path, "%s/vqgan.safetensors", dir);
    assert_int_equal(tv_write_vqgan(tv, path, NULL, NULL), 0);
}

/* Images end to end: generate code grids (the vocabulary map's codes), decode them with the
 * model's VQGAN and with the decoder loaded alone (flexdiag decode's path): the same pixels,
 * and the naive decoder's within 1e-4. CPU only. */
void test_chameleon_vqgan(void **state) {
    (void)state;
    char *dir = tu_tempdir("chameleon-vqgan");
    tv_model tv;
    folder_with_vqgan(dir, &tv);
    json_t *in = gd_json("chameleon", "image_input.json");
    int32_t np = 0, *cond = gd_json_ids(json_object_get(in, "cond_prompt"), &np);
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    int32_t h = 0, w = 0;
    assert_int_equal(flexdiag_model_image_size(m, &h, &w), FLEXDIAG_OK);
    assert_true(h == 32 && w == 32);
    flexdiag_context *c = gd_context(m, 2, np, 0, false);
    const int32_t *const prompts[1] = {cond};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompt_ids = prompts;
    rq.prompt_lens = &np;
    rq.images_per_prompt = 2;
    rq.cfg_weight = 4.0f;
    int32_t codes[2 * 64];
    flexdiag_output out = {.tokens = codes};
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_OK);
    assert_int_equal(out.tokens_per_image, 64);
    for (int i = 0; i < 2 * 64; i++) assert_true(codes[i] >= 0 && codes[i] < 64);
    size_t px = 2 * 32 * 32 * 3;
    float *a = malloc(px * 4), *b = malloc(px * 4), *ref = malloc(px * 4);
    double *naive = malloc(px * 8);
    assert_int_equal(flexdiag_decode_images(m, codes, 2, a), FLEXDIAG_OK);
    flexdiag_decoder *d = NULL;
    assert_int_equal(flexdiag_decoder_load(rt, dir, 2, &d), FLEXDIAG_OK);
    assert_int_equal(flexdiag_decoder_decode(d, codes, 2, b), FLEXDIAG_OK);
    assert_memory_equal(a, b, px * 4);
    tv_naive_decode(&tv, codes, 2, naive);
    for (size_t i = 0; i < px; i++) ref[i] = (float)naive[i];
    gd_expect_close("chameleon vqgan pixels vs the naive decoder", a, ref, (int64_t)px);
    flexdiag_decoder_destroy(d);
    flexdiag_context_destroy(c);
    gd_close_model(rt, m);
    tv_free(&tv);
    tu_rmtree(dir);
    free(dir);
    free(cond);
    free(a);
    free(b);
    free(ref);
    free(naive);
    json_decref(in);
}
