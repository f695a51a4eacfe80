/*
 * golden_shapes.c - the trained model models/shapes-janus against its own PyTorch definition
 * (tests/golden/data/shapes, tools/train/make_golden.py): teacher-forced conditional,
 * unconditional and CFG logits of one sampled 576-token image, compared at the first and last
 * 64 image positions (the fixture keeps those two windows).
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
#include "util.h"

/* Rows pos[i] of all (n, V) into out (npos, V). */
static void pick_rows(float *out, const float *all, const json_t *pos, int64_t V) {
    for (size_t i = 0; i < json_array_size(pos); i++) {
        int64_t p = json_integer_value(json_array_get(pos, i));
        memcpy(out + (size_t)i * (size_t)V, all + (size_t)p * (size_t)V, (size_t)V * 4);
    }
}

void test_shapes_logits(void **state) {
    (void)state;
    json_t *in = gd_json("shapes", "score_input.json"), *g = gd_json("shapes", "golden.json");
    int32_t np = 0, n = 0;
    int32_t *prompt = gd_json_ids(json_object_get(in, "prompt_ids"), &np);
    int32_t *ids = gd_json_ids(json_object_get(in, "image_ids"), &n);
    float cfg_w = (float)json_number_value(json_object_get(in, "cfg_weight"));
    char *dir = tu_data_path("../models/shapes-janus");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    flexdiag_context *c = gd_context(m, 1, np, n, false);
    int64_t V = c->geo.vocab_out;
    float *cfg = malloc((size_t)n * (size_t)V * 4), *raw = malloc(2 * (size_t)n * (size_t)V * 4);
    flexdiag_status st = flexdiag__context_score(c, prompt, np, ids, n, cfg_w, cfg, raw);
    if (st != FLEXDIAG_OK) fprintf(stderr, "score: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    const json_t *pos = json_object_get(g, "positions");
    size_t npos = json_array_size(pos);
    float *got = malloc(npos * (size_t)V * 4);
    static const char *const files[3] = {"logits_cfg.npy", "logits_cond.npy", "logits_uncond.npy"};
    const float *src[3] = {cfg, raw, raw + (size_t)n * (size_t)V};
    for (int i = 0; i < 3; i++) {
        flexdiag_npy ref = gd_npy("shapes", files[i]);
        assert_int_equal(ref.numel, (int64_t)npos * V);
        pick_rows(got, src[i], pos, V);
        char what[64];
        snprintf(what, sizeof what, "shapes-janus %s", files[i]);
        gd_expect_close(what, got, ref.data, ref.numel);
        flexdiag__npy_free(&ref);
    }
    free(got);
    free(cfg);
    free(raw);
    flexdiag_context_destroy(c);
    gd_close_model(rt, m);
    free(dir);
    free(prompt);
    free(ids);
    json_decref(in);
    json_decref(g);
}
