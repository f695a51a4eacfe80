/*
 * test_vqgan_golden.c - the taming / Chameleon VQGAN decoder against PyTorch:
 * tests/image/data/vqgan holds a tiny random VQGAN decoder written by tools/golden/make_vqgan.py
 * (taming names, bf16, vqgan.safetensors), random codebook indices (codes.npy, int64 [n, h·w],
 * raster order) and the float32 pixels its PyTorch decoder returned for them in float64 from the
 * same bf16 weights (pixels.npy, [n, H, W, 3], NHWC, not clamped). flexdiag__vq_open_vqgan with
 * the fixture's grid and GroupNorm groups (golden.json) must match within relative L2 1e-4 on
 * both CPU tables. Then modified copies of the file (one tensor left out, one with another
 * shape) must fail to load with FLEXDIAG_ERR_CORRUPT_MODEL naming the file, the tensor and the
 * expected shape. Exit 77 when the fixture is absent.
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
#include "util.h"
#include "runtime/image/vq.h"

#define GENERATOR "tools/golden/make_vqgan.py"

static const char *files[] = {"vqgan.safetensors", "codes.npy", "pixels.npy", "golden.json"};

static int32_t grid_h, grid_w, groups; /* from golden.json */

static char *fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "image/data/vqgan/%s", name);
    return tu_data_path(rel);
}

/* Open path as a VQGAN with the fixture's grid and groups on k; status, *out on success. */
static flexdiag_status open_vqgan(const flexdiag_kernels *k, flexdiag_stream *s, const char *path,
                                  int64_t batch, flexdiag_vq **out) {
    flexdiag__err_clear();
    return flexdiag__vq_open_vqgan(k, s, path, grid_h, grid_w, groups, batch, out);
}

/* ---- pixels ---- */

static void decode_on(const flexdiag_kernels *k, const flexdiag_npy *codes,
                      const flexdiag_npy *ref) {
    char *path = fixture("vqgan.safetensors");
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    assert_int_equal(k->stream_create(-1, 2, &s), FLEXDIAG_OK);
    if (open_vqgan(k, s, path, codes->shape[0], &vq) != FLEXDIAG_OK)
        fail_msg("open %s: %s", path, flexdiag__err_msg());
    const flexdiag_vq_config *c = flexdiag__vq_get_config(vq);
    int32_t h = 0, w = 0;
    flexdiag__vq_image_size(c, &h, &w);
    assert_int_equal(codes->shape[1], (int64_t)c->grid_h * c->grid_w);
    assert_int_equal(ref->shape[0], codes->shape[0]);
    assert_int_equal(ref->shape[1], h);
    assert_int_equal(ref->shape[2], w);
    assert_int_equal(ref->shape[3], 3);
    int32_t *ids = malloc((size_t)codes->numel * sizeof *ids);
    for (int64_t i = 0; i < codes->numel; i++) ids[i] = (int32_t)((const int64_t *)codes->data)[i];
    float *px = malloc((size_t)ref->numel * sizeof *px);
    if (flexdiag__vq_decode(vq, s, ids, codes->shape[0], px) != FLEXDIAG_OK)
        fail_msg("decode: %s", flexdiag__err_msg());
    const double err = tu_rel_l2(px, ref->data, ref->numel);
    fprintf(stderr, "VQGAN decode (%s, %d levels, %d x %d codes) vs PyTorch: relative L2 %.3g "
                    "over %lld values\n",
            k->name, (int)c->n_levels, (int)c->grid_h, (int)c->grid_w, err,
            (long long)ref->numel);
    /* the same bf16 weights, fp32 activations vs a float64 reference ~30 layers deep (observed
     * ~1e-6); a wrong name, level order or an L2-normalised codebook gives order 0.1 */
    assert_true(err <= 1e-4);
    free(ids), free(px), free(path);
    flexdiag__vq_destroy(vq);
    k->stream_destroy(s);
}

static void test_golden_pixels(void **state) {
    (void)state;
    char *cpath = fixture("codes.npy"), *ppath = fixture("pixels.npy");
    flexdiag_npy codes, ref;
    assert_int_equal(flexdiag__npy_read(cpath, &codes), FLEXDIAG_OK);
    assert_int_equal(flexdiag__npy_read(ppath, &ref), FLEXDIAG_OK);
    assert_int_equal(codes.dtype, FLEXDIAG_DTYPE_I64);
    assert_int_equal(codes.ndim, 2);
    assert_int_equal(ref.dtype, FLEXDIAG_DTYPE_F32);
    assert_int_equal(ref.ndim, 4);
    decode_on(flexdiag__kernels_cpu_ref(), &codes, &ref);
    decode_on(flexdiag__kernels_cpu(), &codes, &ref);
    flexdiag__npy_free(&codes);
    flexdiag__npy_free(&ref);
    free(cpath), free(ppath);
}

/* ---- modified copies ---- */

/* Copy the fixture to path without tensor drop (or NULL), with tensor reshape (or NULL) given
 * the shape new_shape of ndim dims and a prefix of its data (new_shape must not be larger). */
static void write_copy(const char *path, const char *drop, const char *reshape, int32_t ndim,
                       const int64_t *new_shape) {
    char *src = fixture("vqgan.safetensors");
    flexdiag_safetensors *st = NULL;
    assert_int_equal(flexdiag__st_open(src, &st), FLEXDIAG_OK);
    int64_t n = flexdiag__st_count(st), k = 0;
    flexdiag_st_entry *e = calloc((size_t)n, sizeof *e);
    int dropped = 0, reshaped = 0;
    for (int64_t i = 0; i < n; i++) {
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        if (drop && !strcmp(t->name, drop)) {
            dropped = 1;
            continue;
        }
        void *data = malloc(t->nbytes ? t->nbytes : 1);
        assert_int_equal(flexdiag__st_read_raw(st, t, data), FLEXDIAG_OK);
        e[k] = (flexdiag_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                   .data = data};
        memcpy(e[k].shape, t->shape, sizeof t->shape);
        if (reshape && !strcmp(t->name, reshape)) {
            int64_t numel = 1;
            for (int32_t d = 0; d < ndim; d++) numel *= new_shape[d];
            assert_true(numel <= t->numel);
            e[k].ndim = ndim;
            memcpy(e[k].shape, new_shape, (size_t)ndim * sizeof *new_shape);
            reshaped = 1;
        }
        k++;
    }
    assert_int_equal(dropped, drop != NULL); /* the names below are the fixture's */
    assert_int_equal(reshaped, reshape != NULL);
    assert_int_equal(flexdiag__st_write(path, e, k), FLEXDIAG_OK);
    for (int64_t i = 0; i < k; i++) free((void *)e[i].data);
    free(e);
    flexdiag__st_close(st);
    free(src);
}

/* Open path on the CPU: want, and a message naming path and each NULL-terminated string. */
static void expect_error(const char *path, flexdiag_status want, ...) {
    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    assert_int_equal(k->stream_create(-1, 1, &s), FLEXDIAG_OK);
    flexdiag_status st = open_vqgan(k, s, path, 1, &vq);
    const char *msg = flexdiag__err_msg();
    if (st != want) fail_msg("%s: status %d, want %d (%s)", path, (int)st, (int)want, msg);
    assert_null(vq);
    if (!strstr(msg, path)) fail_msg("message '%s' does not name the file %s", msg, path);
    va_list ap;
    va_start(ap, want);
    for (const char *x = va_arg(ap, const char *); x; x = va_arg(ap, const char *))
        if (!strstr(msg, x)) fail_msg("message '%s' lacks '%s'", msg, x);
    va_end(ap);
    fprintf(stderr, "expected error: %s\n", msg);
    k->stream_destroy(s);
}

static void test_missing_tensor(void **state) {
    (void)state;
    char *dir = tu_tempdir("vqgan_gold"), path[4096];
    snprintf(path, sizeof path, "%s/vqgan.safetensors", dir);
    /* the last ResBlock of the middle level: block.2 exists because the decoder has
     * num_res_blocks + 1 = 3 per level */
    write_copy(path, "decoder.up.1.block.2.conv2.weight", NULL, 0, NULL);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.up.1.block.2.conv2.weight",
                 "is missing", "[32, 32, 3, 3]", NULL);
    /* the shortcut where the channels drop to the base 16 */
    write_copy(path, "decoder.up.0.block.0.nin_shortcut.bias", NULL, 0, NULL);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.up.0.block.0.nin_shortcut.bias",
                 "[16]", NULL);
    tu_rmtree(dir);
    free(dir);
}

static void test_wrong_shape(void **state) {
    (void)state;
    char *dir = tu_tempdir("vqgan_gold"), path[4096];
    snprintf(path, sizeof path, "%s/vqgan.safetensors", dir);
    static const int64_t half_q[4] = {32, 16, 1, 1};
    write_copy(path, NULL, "decoder.mid.attn_1.q.weight", 4, half_q);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.mid.attn_1.q.weight",
                 "has shape [32, 16, 1, 1], the VQ config needs [32, 32, 1, 1]", NULL);
    static const int64_t bias[1] = {8};
    write_copy(path, NULL, "decoder.norm_out.bias", 1, bias);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.norm_out.bias",
                 "has shape [8], the VQ config needs [16]", NULL);
    tu_rmtree(dir);
    free(dir);
}

/* ---- fixture header ---- */

/* Read grid and groups from golden.json; 0 on success, else a message naming the generator. */
static int read_header(void) {
    char *p = fixture("golden.json");
    json_error_t je;
    json_t *g = json_load_file(p, 0, &je);
    json_t *magic = json_object_get(g, "magic"), *ver = json_object_get(g, "version");
    json_t *model = json_object_get(g, "model");
    json_t *grid = json_object_get(model, "grid"), *gr = json_object_get(model, "groups");
    int bad = !json_is_string(magic) || strcmp(json_string_value(magic), "flexdiag-golden") ||
              json_integer_value(ver) != 1 || json_array_size(grid) != 2 ||
              !json_is_integer(gr);
    if (bad) {
        fprintf(stderr, "%s: not a version-1 flexdiag-golden VQGAN header (model.grid, "
                        "model.groups): regenerate the fixture with %s\n", p, GENERATOR);
    } else {
        grid_h = (int32_t)json_integer_value(json_array_get(grid, 0));
        grid_w = (int32_t)json_integer_value(json_array_get(grid, 1));
        groups = (int32_t)json_integer_value(gr);
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
            fprintf(stderr, "VQGAN fixture %s is missing (made by `python3 %s --out "
                            "tests/image/data/vqgan` where torch exists): skipped\n", p, GENERATOR);
        free(p);
        if (!ok) return 77;
    }
    if (read_header()) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_pixels),
        cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_wrong_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
