/*
 * golden.c - the helpers of golden.h: fixture files, opening a model and a context on the
 * backend under test, teacher-forced text runs, the relative-L2 check and the per-fixture
 * groups. A group runs only when its fixture folder has a valid golden.json (and the file the
 * group needs, so that a fixture made by an older make_fixtures.py skips the new checks with a
 * message instead of failing them); a wrong magic or version fails, naming the script.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/core.h"
#include "golden.h"
#include "util.h"

gd_backend gd_be = {-1, 1e-4, "cpu"};

/* ---- fixtures ---- */

char *gd_fixture(const char *model, const char *file) {
    char rel[256];
    snprintf(rel, sizeof rel, "golden/data/%s/%s", model, file);
    return tu_data_path(rel);
}

flexdiag_npy gd_npy(const char *model, const char *file) {
    char *p = gd_fixture(model, file);
    flexdiag_npy a;
    flexdiag_status st = flexdiag__npy_read(p, &a);
    if (st != FLEXDIAG_OK) fprintf(stderr, "%s: %s\n", p, flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    free(p);
    return a;
}

json_t *gd_json(const char *model, const char *file) {
    char *p = gd_fixture(model, file);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root) fprintf(stderr, "%s: %s\n", p, je.text);
    assert_non_null(root);
    free(p);
    return root;
}

int32_t *gd_json_ids(const json_t *arr, int32_t *n) {
    assert_true(json_is_array(arr));
    *n = (int32_t)json_array_size(arr);
    int32_t *ids = malloc((size_t)(*n ? *n : 1) * 4);
    assert_non_null(ids);
    for (int32_t i = 0; i < *n; i++) {
        const json_t *v = json_array_get(arr, (size_t)i);
        assert_true(json_is_integer(v));
        ids[i] = (int32_t)json_integer_value(v);
    }
    return ids;
}

int32_t *gd_npy_ids(const flexdiag_npy *a) {
    int32_t *ids = malloc((size_t)(a->numel ? a->numel : 1) * 4);
    assert_non_null(ids);
    for (int64_t i = 0; i < a->numel; i++) ids[i] = (int32_t)((const int64_t *)a->data)[i];
    return ids;
}

/* ---- runs ---- */

void gd_open_model(const char *dir, flexdiag_runtime **rt, flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = gd_be.device;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    assert_string_equal((*rt)->k->name, gd_be.tag);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    flexdiag_status st = flexdiag_model_load(*rt, dir, &mp, m);
    if (st != FLEXDIAG_OK) fprintf(stderr, "%s: %s\n", dir, flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
}

void gd_close_model(flexdiag_runtime *rt, flexdiag_model *m) {
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

flexdiag_context *gd_context(flexdiag_model *m, int32_t images, int32_t np, int32_t n,
                             bool text) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = images;
    cp.max_prompt_len = np;
    cp.max_new_tokens = n;
    cp.text = text;
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) fprintf(stderr, "context: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    return c;
}

void gd_teacher_forced(flexdiag_model *m, bool text, const int32_t *all, int32_t T, int32_t np,
                       float *logits, float *hidden, int32_t n_hidden_pos) {
    int32_t n = T - np, V = m->cfg.lm.vocab, d = m->cfg.lm.hidden;
    /* the hidden-state capture shares the logits scratch (sequences x V floats): enough
     * (idle) sequences of capacity for the positions asked */
    int32_t images = 1 + (n_hidden_pos * d - 1) / V;
    flexdiag_context *c = gd_context(m, images > 1 ? images : 1, np, n, text);
    int32_t *tok = malloc((size_t)n * 4);
    const int32_t *pp = all;
    flexdiag_block b = {.n_img = 1, .prompt = &pp, .prompt_len = &np, .n_steps = n,
                        .forced = all + np, .tokens = tok, .logits = logits, .hidden = hidden,
                        .n_hidden_pos = n_hidden_pos, .sp = {1.0f, 0, 1.0f, 0}};
    flexdiag_status st = flexdiag__engine_run(c, &b);
    if (st != FLEXDIAG_OK) fprintf(stderr, "engine: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    free(tok);
}

void gd_expect_close(const char *what, const float *got, const float *ref, int64_t n) {
    double e = tu_rel_l2(got, ref, n);
    fprintf(stderr, "  %-4s %-46s rel L2 %.3g\n", gd_be.tag, what, e);
    assert_true(e <= gd_be.tol);
}

/* ---- groups ---- */

/* 0 when fixture model has a valid golden.json and need (if any), 77 when either is missing,
 * 1 when the manifest is wrong. */
static int manifest(const char *model, const char *need) {
    char *p = gd_fixture(model, "golden.json");
    json_t *g = json_load_file(p, 0, NULL);
    int rc = 77;
    if (!g) {
        fprintf(stderr, "golden fixture %s missing: run tools/golden/make_fixtures.py --only %s\n",
                p, model);
    } else {
        json_t *magic = json_object_get(g, "magic"), *ver = json_object_get(g, "version");
        rc = json_is_string(magic) && !strcmp(json_string_value(magic), "flexdiag-golden") &&
                     json_integer_value(ver) == 1
                 ? 0
                 : 1;
        if (rc)
            fprintf(stderr,
                    "%s: bad magic/version: regenerate with tools/golden/make_fixtures.py\n", p);
    }
    json_decref(g);
    free(p);
    if (rc || !need) return rc;
    p = gd_fixture(model, need);
    if (access(p, R_OK) != 0) {
        fprintf(stderr, "%s missing (a fixture from an older generator): regenerate with "
                        "tools/golden/make_fixtures.py --only %s\n", p, model);
        rc = 77;
    }
    free(p);
    return rc;
}

int gd_group(const char *name, const char *model, const char *need,
             const struct CMUnitTest *tests, size_t n, int *ran) {
    int rc = manifest(model, need);
    if (rc == 77) fprintf(stderr, "group %s skipped\n", name);
    if (rc) return rc == 1;
    (*ran)++;
    return _cmocka_run_group_tests(name, tests, n, NULL, NULL);
}
