/*
 * test_vq_golden.c - the VQ decoder against transformers: tests/golden/data/janus holds a tiny
 * random JanusForConditionalGeneration saved by tools/golden/make_fixtures.py (transformers
 * names, bf16), random image ids (vq_tokens.npy, int64 [n, h·w]) and the float32 pixels
 * model.decode_image_tokens returned for them (vq_pixels.npy, [n, H, W, 3], computed in fp32 from
 * the same bf16 weights). The CPU decode must match within relative L2 1e-4; then the checkpoint
 * is rewritten under the original deepseek-ai names (name map written in the test, apart from
 * runtime/names.c) and must give bit-identical pixels. Exit 77 when the fixture is absent.
 */
#include <jansson.h>
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
#include "kernels/kernels.h"
#include "cli/npy.h"
#include "runtime/model/safetensors.h"
#include "st_write.h"
#include "tiny_vq.h"
#include "util.h"
#include "runtime/image/vq.h"

static const char *files[] = {"config.json", "model.safetensors", "vq_tokens.npy",
                              "vq_pixels.npy"};

static char *fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "golden/data/janus/%s", name);
    return tu_data_path(rel);
}

/* Decode the fixture's tokens with the model in dir on the "cpu" table. */
static float *decode(const char *dir, const flexdiag_npy *tok, int64_t *n_px) {
    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    assert_int_equal(k->stream_create(-1, 0, &s), FLEXDIAG_OK);
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__vq_load(k, s, dir, tok->shape[0], &vq);
    if (st != FLEXDIAG_OK) fail_msg("load %s: %s", dir, flexdiag__err_msg());
    const flexdiag_vq_config *c = flexdiag__vq_get_config(vq);
    assert_int_equal(tok->shape[1], (int64_t)c->grid_h * c->grid_w);
    int32_t *ids = malloc((size_t)tok->numel * sizeof *ids), h, w;
    for (int64_t i = 0; i < tok->numel; i++) ids[i] = (int32_t)((const int64_t *)tok->data)[i];
    flexdiag__vq_image_size(c, &h, &w);
    *n_px = tok->shape[0] * h * w * 3;
    float *px = malloc((size_t)*n_px * sizeof *px);
    st = flexdiag__vq_decode(vq, s, ids, tok->shape[0], px);
    if (st != FLEXDIAG_OK) fail_msg("decode: %s", flexdiag__err_msg());
    free(ids);
    flexdiag__vq_destroy(vq);
    k->stream_destroy(s);
    return px;
}

/* Copy the fixture checkpoint to dir with every name mapped to the original scheme. */
static void write_original_names(const char *dir) {
    char *src = fixture("model.safetensors"), *cfg = fixture("config.json"), path[4096];
    flexdiag_safetensors *st = NULL;
    assert_int_equal(flexdiag__st_open(src, &st), FLEXDIAG_OK);
    int64_t n = flexdiag__st_count(st);
    flexdiag_st_entry *e = calloc((size_t)n, sizeof *e);
    char (*names)[256] = calloc((size_t)n, sizeof *names);
    int renamed = 0;
    for (int64_t i = 0; i < n; i++) {
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        assert_int_equal(tv_name_from_hf(t->name, names[i], sizeof names[i]), 0);
        renamed += strcmp(t->name, names[i]) != 0;
        void *data = malloc(t->nbytes ? t->nbytes : 1);
        assert_int_equal(flexdiag__st_read_raw(st, t, data), FLEXDIAG_OK);
        e[i] = (flexdiag_st_entry){.name = names[i], .dtype = t->dtype, .ndim = t->ndim,
                                   .data = data};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
    }
    assert_true(renamed > 100); /* the fixture uses transformers names: most VQ names change */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(flexdiag__st_write(path, e, n), FLEXDIAG_OK);
    assert_int_equal(tu_system("cp '%s' '%s/config.json'", cfg, dir), 0);
    for (int64_t i = 0; i < n; i++) free((void *)e[i].data);
    free(e);
    free(names);
    flexdiag__st_close(st);
    free(src);
    free(cfg);
}

static void test_golden_pixels(void **state) {
    (void)state;
    char *tpath = fixture("vq_tokens.npy"), *ppath = fixture("vq_pixels.npy");
    char *dir = fixture("");
    flexdiag_npy tok, ref;
    assert_int_equal(flexdiag__npy_read(tpath, &tok), FLEXDIAG_OK);
    assert_int_equal(flexdiag__npy_read(ppath, &ref), FLEXDIAG_OK);
    assert_int_equal(tok.dtype, FLEXDIAG_DTYPE_I64);
    assert_int_equal(tok.ndim, 2);
    assert_int_equal(ref.dtype, FLEXDIAG_DTYPE_F32);
    int64_t n_px = 0;
    float *px = decode(dir, &tok, &n_px);
    assert_int_equal(n_px, ref.numel);
    double err = tu_rel_l2(px, ref.data, n_px);
    fprintf(stderr, "VQ decode vs transformers: relative L2 %.3g over %lld values\n", err,
            (long long)n_px);
    assert_true(err <= 1e-4);

    char *tmp = tu_tempdir("vqgold");
    write_original_names(tmp);
    int64_t n2 = 0;
    float *px2 = decode(tmp, &tok, &n2);
    assert_int_equal(n2, n_px);
    assert_memory_equal(px, px2, (size_t)n_px * sizeof *px);
    tu_rmtree(tmp);
    free(tmp), free(px), free(px2), free(tpath), free(ppath), free(dir);
    flexdiag__npy_free(&tok);
    flexdiag__npy_free(&ref);
}

/* 0 when golden.json is absent or names the expected generator format. */
static int check_header(void) {
    char *p = fixture("golden.json");
    json_error_t je;
    json_t *g = access(p, R_OK) == 0 ? json_load_file(p, 0, &je) : NULL;
    int bad = 0;
    if (access(p, R_OK) == 0) {
        json_t *magic = json_object_get(g, "magic"), *ver = json_object_get(g, "version");
        bad = !json_is_string(magic) || strcmp(json_string_value(magic), "flexdiag-golden") ||
              json_integer_value(ver) != 1;
        if (bad)
            fprintf(stderr, "%s: not a version-1 flexdiag-golden header: regenerate the fixture "
                            "with tools/golden/make_fixtures.py\n", p);
    }
    json_decref(g);
    free(p);
    return bad;
}

int main(void) {
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *p = fixture(files[i]);
        int ok = access(p, R_OK) == 0;
        if (!ok)
            fprintf(stderr, "golden fixture %s is missing (made by tools/golden/make_fixtures.py "
                            "where torch + transformers exist): skipped\n", p);
        free(p);
        if (!ok) return 77;
    }
    if (check_header()) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_golden_pixels)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
