/*
 * test_chameleon_text.c - a Chameleon (Lumina-mGPT architecture) checkpoint whose vocabulary
 * cannot frame images is a text model (issue 40): only image generation needs the image codes
 * and the structural tokens (<racm3:break>, <eoss>, ...; runtime/model/vocab_map.c), so loading
 * and scoring text work without them, through the API and `flexdiag score`.
 *
 * Checkpoints: a one-layer Chameleon (hidden 32, 2 heads, vocabulary 48) written with
 * tests/st_write.c, its config.json in three variants: no vocabulary_map; one that names image
 * codes but no <racm3:break>; one whose image codes are not one range. Each loads, a context of
 * it runs as a text decoder whether context_params.text is set or not (one row, the whole
 * vocabulary: the same logits either way), and the score CLI writes [n, 48] logits.
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

#include "flexdiag.h"
#include "st_write.h"
#include "util.h"

enum { V = 48, D = 32, F = 64, HEADS = 2, DH = 16, L = 1, N_T = 3 + 13 * L };

static char *g_dir; /* the model folder */

/* The checkpoint: seeded bf16 matrices, unit norms, zero norm biases (the QK norms shared by
 * the heads: [1, d_h], as Lumina-mGPT-7B stores them). */
static void write_weights(void) {
    static char names[N_T][64];
    flexdiag_st_entry e[N_T];
    int n = 0;
#define T(nm, nd, a, b)                                                                            \
    e[n] = (flexdiag_st_entry){names[n], FLEXDIAG_DTYPE_BF16, nd, {a, b}, NULL},                   \
    snprintf(names[n++], 64, "%s", nm)
    T("lm_head.weight", 2, V, D);
    T("model.embed_tokens.weight", 2, V, D);
    T("model.norm.weight", 1, D, 0);
    for (int l = 0; l < L; l++) {
        static const char *mats[] = {"mlp.down_proj", "mlp.gate_proj", "mlp.up_proj",
                                     "self_attn.k_proj", "self_attn.o_proj", "self_attn.q_proj",
                                     "self_attn.v_proj"};
        static const int64_t rows[] = {D, F, F, D, D, D, D}, cols[] = {F, D, D, D, D, D, D};
        static const char *norms[] = {"self_attn.q_norm.weight", "self_attn.q_norm.bias",
                                      "self_attn.k_norm.weight", "self_attn.k_norm.bias"};
        char nm[64];
        for (int i = 0; i < 7; i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, mats[i]);
            T(nm, 2, rows[i], cols[i]);
        }
        for (int i = 0; i < 4; i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, norms[i]);
            T(nm, 2, 1, DH);
        }
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        T(nm, 1, D, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        T(nm, 1, D, 0);
    }
#undef T
    assert_int_equal(n, N_T);
    tu_rng r;
    tu_rng_seed(&r, 40);
    for (int i = 0; i < n; i++) {
        int64_t cnt = e[i].shape[0] * (e[i].ndim == 2 ? e[i].shape[1] : 1);
        uint16_t *w = malloc((size_t)cnt * 2);
        assert_non_null(w);
        int bias = strstr(e[i].name, ".bias") != NULL, norm = strstr(e[i].name, "norm") != NULL;
        if (norm) /* LayerNorm / RMSNorm gains 1, biases 0 */
            for (int64_t j = 0; j < cnt; j++) w[j] = bias ? 0 : 0x3f80;
        else
            tu_fill_bf16(&r, w, cnt, 0.1f);
        e[i].data = w;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    assert_int_equal(flexdiag__st_write(path, e, n), FLEXDIAG_OK);
    for (int i = 0; i < n; i++) free((void *)e[i].data);
}

/* config.json with vocab_map (the text of a JSON object, or NULL: none). */
static void write_config(const char *vocab_map) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model_type\": \"chameleon\", \"hidden_size\": %d, \"intermediate_size\": %d,\n"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"num_hidden_layers\": "
             "%d,\n \"vocab_size\": %d, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5,"
             "\n \"bos_token_id\": 0, \"pad_token_id\": 1, \"eos_token_id\": 2, \"swin_norm\": "
             "false%s%s}\n",
             D, F, HEADS, HEADS, L, V, vocab_map ? ",\n \"vocabulary_map\": " : "",
             vocab_map ? vocab_map : "");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* Image codes at ids 20..27 and every structural token but <racm3:break>. */
static const char no_break[] =
    "{\"<s>\": 0, \"<pad>\": 1, \"</s>\": 2, \"<eoss>\": 8, \"<reserved08799>\": 9, "
    "\"<reserved08706>\": 10, \"<reserved08816>\": 11, \"IMGIMGAZ\": 20, \"IMGIMGBZ\": 21, "
    "\"IMGIMGCZ\": 22, \"IMGIMGDZ\": 23, \"IMGIMGEZ\": 24, \"IMGIMGFZ\": 25, \"IMGIMGGZ\": 26, "
    "\"IMGIMGHZ\": 27}";
/* Image codes at ids 20, 21 and 30: not one range. */
static const char gapped[] = "{\"<s>\": 0, \"IMGIMGAZ\": 20, \"IMGIMGBZ\": 21, \"IMGIMGCZ\": 30}";

static const int32_t prompt[] = {0, 5, 6, 7}, ids[] = {12, 13, 14, 15, 16};
enum { NP = 4, N = 5 };

/* Scores of ids after prompt with context_params.text = text: one row, the whole vocabulary,
 * finite; the logits (N, V) into out. */
static void score_api(flexdiag_model *m, bool text, float *out) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = NP;
    cp.max_new_tokens = N;
    cp.text = text;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    flexdiag_score_request rq;
    flexdiag_score_request_init(&rq);
    rq.prompt_ids = prompt;
    rq.prompt_len = NP;
    rq.ids = ids;
    rq.n = N;
    flexdiag_score_output so = {.struct_size = sizeof so};
    assert_int_equal(flexdiag_score(c, &rq, &so), FLEXDIAG_OK); /* the sizes */
    assert_int_equal(so.vocab, V);
    assert_int_equal(so.rows, 1);
    so.logits = out;
    if (flexdiag_score(c, &rq, &so) != FLEXDIAG_OK)
        fail_msg("score: %s", flexdiag_last_error(NULL));
    for (int i = 0; i < N * V; i++) assert_true(isfinite(out[i]));
    flexdiag_context_destroy(c);
}

/* The folder loads, scores text with or without context_params.text (the same logits), and
 * `flexdiag score` on it exits 0 with [N, V] logits. */
static void check_text_model(const char *what) {
    printf("  %s\n", what);
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    flexdiag_model *m = NULL;
    if (flexdiag_model_load(rt, g_dir, &mp, &m) != FLEXDIAG_OK)
        fail_msg("%s: load: %s", what, flexdiag_last_error(NULL));
    static float asked[N * V], implied[N * V];
    score_api(m, true, asked);
    score_api(m, false, implied);
    assert_memory_equal(asked, implied, sizeof asked);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    static const char in[] = "{\"prompt_ids\": [0, 5, 6, 7], \"image_ids\": [12, 13, 14, 15, 16]}";
    char path[4200];
    snprintf(path, sizeof path, "%s/in.json", g_dir);
    assert_int_equal(tu_write_file(path, in, sizeof in - 1), 0);
    int rc = tu_system("cd '%s' && '%s' score --cpu --model . --input in.json --out s.npy "
                       "2>score.err", g_dir, getenv("FLEXDIAG_BIN"));
    snprintf(path, sizeof path, "%s/score.err", g_dir);
    char *err = tu_read_file(path, NULL);
    printf("    flexdiag score: %d: %s", rc, err ? err : "");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(err, "scored 5 token(s)"));
    free(err);
    size_t n = 0;
    snprintf(path, sizeof path, "%s/s.npy", g_dir);
    char *npy = tu_read_file(path, &n);
    assert_non_null(npy);
    assert_non_null(strstr(npy + 10, "(5, 48)")); /* the header's shape */
    assert_true(n > (size_t)N * V * 4);
    assert_memory_equal(npy + n - (size_t)N * V * 4, asked, sizeof asked);
    free(npy);
}

static void test_no_vocabulary_map(void **state) {
    (void)state;
    write_config(NULL);
    check_text_model("no vocabulary_map");
}

static void test_codes_without_break(void **state) {
    (void)state;
    write_config(no_break);
    check_text_model("image codes, no <racm3:break>");
}

static void test_codes_not_one_range(void **state) {
    (void)state;
    write_config(gapped);
    check_text_model("image codes not one range");
}

int main(void) {
    if (!getenv("FLEXDIAG_BIN")) {
        fprintf(stderr, "test_chameleon_text: FLEXDIAG_BIN not set (run through meson test)\n");
        return 77;
    }
    g_dir = tu_tempdir("chameleon-text");
    write_weights();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_vocabulary_map),
        cmocka_unit_test(test_codes_without_break),
        cmocka_unit_test(test_codes_not_one_range),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmtree(g_dir);
    free(g_dir);
    return rc;
}
