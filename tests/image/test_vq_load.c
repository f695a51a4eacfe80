/*
 * test_vq_load.c - the VQ decoder module (runtime/vq.c) on small random decoders written by the
 * test: config parsing of both layouts, loading under both naming schemes, the whole decode
 * against a naive double-precision decoder, batching, id validation, the load-time checks
 * (missing / misshapen tensors, unused tensors warned about) and the `flexdiag decode` CLI.
 */
#include <math.h>
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
#include "tiny_vq.h"
#include "util.h"
#include "runtime/image/vq.h"


typedef struct fixture {
    tv_model m;
    char *dir; /* temp root */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    flexdiag_vq_config c = tv_tiny_config();
    tv_build(&f->m, &c, 11);
    f->dir = tu_tempdir("vq");
    *state = f;
    return f->dir ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    tv_free(&f->m);
    free(f);
    return 0;
}

/* dir/<name>, created, holding the model (hf names or not, optionally without skip). */
static char *write_model(fixture *f, const char *name, int hf, const char *skip) {
    char *d = NULL;
    assert_true(asprintf(&d, "%s/%s", f->dir, name) > 0);
    assert_int_equal(tu_system("mkdir -p '%s'", d), 0);
    assert_int_equal(tv_write(&f->m, d, hf, skip), 0);
    return d;
}

static void random_ids(int32_t *ids, int64_t n, int32_t V, uint64_t seed) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)tu_rng_int(&r, 0, V - 1);
}

/* Load dir on table k and decode n images of ids into pixels (n, 12, 12, 3). */
static flexdiag_status decode_dir(const flexdiag_kernels *k, const char *dir, int64_t batch,
                                  const int32_t *ids, int64_t n, float *pixels) {
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    flexdiag__err_clear();
    flexdiag_status st = k->stream_create(-1, 2, &s);
    if (st == FLEXDIAG_OK) st = flexdiag__vq_load(k, s, dir, batch, &vq);
    if (st == FLEXDIAG_OK) st = flexdiag__vq_decode(vq, s, ids, n, pixels);
    if (st == FLEXDIAG_OK) { /* the dry run predicts exactly what was allocated */
        size_t wp = 0, sp = 0, wb = 0, sb = 0;
        assert_int_equal(flexdiag__vq_plan(flexdiag__vq_get_config(vq), batch, &wp, &sp),
                         FLEXDIAG_OK);
        flexdiag__vq_bytes(vq, &wb, &sb);
        assert_int_equal(wp, wb);
        assert_int_equal(sp, sb);
    }
    flexdiag__vq_destroy(vq);
    k->stream_destroy(s);
    return st;
}

#define NIMG 3
#define HW 9
#define PIX (12 * 12 * 3)

/* ---- decode correctness ---- */

static void test_decode_vs_naive(void **state) {
    fixture *f = *state;
    char *dir = write_model(f, "hf", 1, NULL);
    int32_t ids[NIMG * HW];
    random_ids(ids, NIMG * HW, 40, 5);
    ids[0] = 0, ids[1] = 39; /* both ends of the codebook */
    float got[NIMG * PIX];
    double ref[NIMG * PIX];
    float reff[NIMG * PIX];
    assert_int_equal(decode_dir(flexdiag__kernels_cpu_ref(), dir, NIMG, ids, NIMG, got),
                     FLEXDIAG_OK);
    tv_naive_decode(&f->m, ids, NIMG, ref);
    for (int i = 0; i < NIMG * PIX; i++) reff[i] = (float)ref[i];
    double err = tu_rel_l2(got, reff, NIMG * PIX);
    fprintf(stderr, "decode vs naive: relative L2 %.3g\n", err);
    /* ~30 fp32 layers deep (observed ~3e-6); any wiring mistake gives errors of order 0.1 */
    assert_true(err <= 1e-5);
    free(dir);
}

static void test_names_and_tables_agree(void **state) {
    fixture *f = *state;
    char *hf = write_model(f, "hf2", 1, NULL), *orig = write_model(f, "orig", 0, NULL);
    int32_t ids[NIMG * HW];
    random_ids(ids, NIMG * HW, 40, 6);
    static float a[NIMG * PIX], b[NIMG * PIX], c[NIMG * PIX], d[NIMG * PIX];
    assert_int_equal(decode_dir(flexdiag__kernels_cpu_ref(), hf, NIMG, ids, NIMG, a), FLEXDIAG_OK);
    assert_int_equal(decode_dir(flexdiag__kernels_cpu_ref(), orig, NIMG, ids, NIMG, b),
                     FLEXDIAG_OK);
    assert_memory_equal(a, b, sizeof a); /* same weights under either naming scheme */
    /* the "cpu" table's parallel ops are bit-identical to the reference */
    assert_int_equal(decode_dir(flexdiag__kernels_cpu(), orig, NIMG, ids, NIMG, c), FLEXDIAG_OK);
    assert_memory_equal(a, c, sizeof a);
    /* passes of 2 images give the same pixels as one pass of 3 */
    assert_int_equal(decode_dir(flexdiag__kernels_cpu(), orig, 2, ids, NIMG, d), FLEXDIAG_OK);
    assert_memory_equal(a, d, sizeof a);
    free(hf);
    free(orig);
}

static void test_bad_ids(void **state) {
    fixture *f = *state;
    char *dir = write_model(f, "ids", 1, NULL);
    int32_t ids[2 * HW];
    float px[2 * PIX];
    random_ids(ids, 2 * HW, 40, 7);
    ids[HW + 4] = 40;
    assert_int_equal(decode_dir(flexdiag__kernels_cpu(), dir, 2, ids, 2, px),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "id 40 at index 13 (image 1, position 4)"));
    ids[HW + 4] = 3;
    ids[2] = -1;
    assert_int_equal(decode_dir(flexdiag__kernels_cpu(), dir, 2, ids, 2, px),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "id -1 at index 2"));
    free(dir);
}

/* ---- load-time checks ---- */

static void test_missing_and_misshapen(void **state) {
    fixture *f = *state;
    const char *gone = "gen_vision_model.decoder.conv_blocks.1.res.0.nin_shortcut.weight";
    char *dir = write_model(f, "missing", 1, gone);
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    assert_int_equal(k->stream_create(-1, 1, &s), FLEXDIAG_OK);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__vq_load(k, s, dir, 1, &vq), FLEXDIAG_ERR_CORRUPT_MODEL);
    assert_null(vq);
    assert_non_null(strstr(flexdiag__err_msg(), gone));
    assert_non_null(strstr(flexdiag__err_msg(), "[32, 64, 1, 1]"));

    /* a config with more channels than the weights: shape mismatch names file and tensor */
    flexdiag_vq_config c = tv_tiny_config();
    c.ch_mult[2] = 3;
    char *cfg = tv_config_json(&c), path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, cfg, strlen(cfg)), 0);
    free(cfg);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__vq_load(k, s, dir, 1, &vq), FLEXDIAG_ERR_CORRUPT_MODEL);
    assert_non_null(strstr(flexdiag__err_msg(), "model.safetensors"));
    assert_non_null(strstr(flexdiag__err_msg(), "has shape [64, 32, 3, 3], the VQ config needs "
                                                "[96, 32, 3, 3]"));
    k->stream_destroy(s);
    free(dir);
}

static char warned[4096];

static void log_capture(flexdiag_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == FLEXDIAG_LOG_WARN) snprintf(warned, sizeof warned, "%s", msg);
}

static void test_unused_tensors_warned(void **state) {
    fixture *f = *state;
    /* the checkpoint has 3 levels, the config only 2 (64 then 32 channels, a 6×6 output):
     * every tensor the config needs is in the file with its shape, block 1's upsample and all
     * of block 2 are unused and must be named in one warning; the load itself succeeds */
    char *dir = write_model(f, "extra", 1, NULL);
    flexdiag_vq_config c = tv_tiny_config();
    c.n_levels = 2;
    c.ch_mult[0] = 1, c.ch_mult[1] = 2;
    memset(c.attn, 0, sizeof c.attn);
    c.attn[1] = 1;
    char *cfg = tv_config_json(&c), path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, cfg, strlen(cfg)), 0);
    free(cfg);
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    assert_int_equal(k->stream_create(-1, 1, &s), FLEXDIAG_OK);
    warned[0] = 0;
    flexdiag_log_set(log_capture, FLEXDIAG_LOG_WARN, NULL);
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__vq_load(k, s, dir, 1, &vq);
    flexdiag_log_set(NULL, FLEXDIAG_LOG_WARN, NULL);
    assert_int_equal(st, FLEXDIAG_OK);
    assert_non_null(strstr(warned, "not used by the VQ config"));
    assert_non_null(strstr(warned, "model.vqmodel.decoder.up.1.upsample.conv.weight"));
    int32_t ids[HW] = {0};
    float px[6 * 6 * 3];
    assert_int_equal(flexdiag__vq_decode(vq, s, ids, 1, px), FLEXDIAG_OK);
    flexdiag__vq_destroy(vq);
    k->stream_destroy(s);
    free(dir);
}

/* ---- config ---- */

static void test_config_layouts(void **state) {
    (void)state;
    flexdiag_vq_config c, d;
    flexdiag__vq_config_default(&d);
    /* original layout: only the codebook comes from the file */
    assert_int_equal(flexdiag__vq_config_parse(
                         "{\"model_type\": \"multi_modality\", \"gen_vision_config\": {\"cls\": "
                         "\"VQ-16\", \"params\": {\"image_token_size\": 1000, \"n_embed\": 4}}}",
                         "a.json", &c),
                     FLEXDIAG_OK);
    assert_int_equal(c.codebook_size, 1000);
    assert_int_equal(c.embed_dim, 4);
    c.codebook_size = d.codebook_size, c.embed_dim = d.embed_dim;
    assert_memory_equal(&c, &d, sizeof c);
    /* transformers layout with every field absent: JanusVQVAEConfig defaults = VQ-16 */
    assert_int_equal(flexdiag__vq_config_parse("{\"vq_config\": {}}", "b.json", &c), FLEXDIAG_OK);
    assert_memory_equal(&c, &d, sizeof c);
    /* grid from the vision config when num_patches is absent */
    assert_int_equal(flexdiag__vq_config_parse("{\"vq_config\": {}, \"vision_config\": "
                                               "{\"image_size\": 256, \"patch_size\": 16}}",
                                               "c.json", &c),
                     FLEXDIAG_OK);
    assert_int_equal(c.grid_h, 16);
    int32_t h, w;
    flexdiag__vq_image_size(&c, &h, &w);
    assert_int_equal(h, 256);
    assert_int_equal(w, 256);
}

/* The full VQ-16 table: 42.58 M parameters (docs/architecture.md §4.4) ≈ 85.2 MB in bf16, plus the
 * fp32 codebook's extra 0.26 MB and alignment padding; scratch grows linearly with the batch. */
static void test_plan_vq16(void **state) {
    (void)state;
    flexdiag_vq_config c;
    flexdiag__vq_config_default(&c);
    size_t w1 = 0, s1 = 0, w2 = 0, s2 = 0;
    assert_int_equal(flexdiag__vq_plan(&c, 1, &w1, &s1), FLEXDIAG_OK);
    assert_int_equal(flexdiag__vq_plan(&c, 4, &w2, &s2), FLEXDIAG_OK);
    fprintf(stderr, "VQ-16: weights %zu bytes, scratch %zu bytes per image (f32)\n", w1, s1);
    assert_true(w1 > 85100000 && w1 < 85600000);
    assert_int_equal(w1, w2);
    /* three buffers of the largest activation, 128 × 384 × 384 f32 = 75.5 MB, plus K and V
     * (2 × 512 × 24 × 24 f32 = 2.4 MB) and the ids */
    assert_true(s1 >= 3 * 75497472 && s1 < 3 * 75497472 + 4000000);
    assert_true(s2 > 4 * s1 - 4096 && s2 < 4 * s1 + 4096);
}

static void test_config_errors(void **state) {
    (void)state;
    flexdiag_vq_config c;
    static const struct {
        const char *json;
        flexdiag_status st;
        const char *msg;
    } cases[] = {
        {"{\"vq_config\": {\"base_channels\": 20}}", FLEXDIAG_ERR_INVALID_ARG, "GroupNorm"},
        {"{\"vq_config\": {\"channel_multiplier\": []}}", FLEXDIAG_ERR_CORRUPT_MODEL,
         "channel_multiplier"},
        {"{\"vq_config\": {\"channel_multiplier\": [1, 0]}}", FLEXDIAG_ERR_CORRUPT_MODEL,
         "channel_multiplier[1]"},
        {"{\"vq_config\": {\"num_embeddings\": \"x\"}}", FLEXDIAG_ERR_CORRUPT_MODEL,
         "vq_config.num_embeddings"},
        {"{\"vq_config\": {\"out_channels\": 4}}", FLEXDIAG_ERR_INVALID_ARG, "RGB"},
        {"{\"text_config\": {}}", FLEXDIAG_ERR_UNSUPPORTED, "no vq_config"},
        {"{\"gen_vision_config\": {\"cls\": \"VQ-32\"}}", FLEXDIAG_ERR_UNSUPPORTED, "VQ-32"},
        {"{\"vq_config\": {}, \"vq_config\": {}}", FLEXDIAG_ERR_CORRUPT_MODEL, "invalid JSON"},
        {"[1]", FLEXDIAG_ERR_CORRUPT_MODEL, "not a JSON object"},
        /* Chameleon's vq_config describes a taming VQGAN, read from vqgan.safetensors instead */
        {"{\"model_type\": \"chameleon\", \"vq_config\": {\"embed_dim\": 256}}",
         FLEXDIAG_ERR_UNSUPPORTED, "vqgan.safetensors"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flexdiag__err_clear();
        assert_int_equal(flexdiag__vq_config_parse(cases[i].json, "cfg.json", &c), cases[i].st);
        if (!strstr(flexdiag__err_msg(), cases[i].msg))
            fail_msg("case %zu: message '%s' lacks '%s'", i, flexdiag__err_msg(), cases[i].msg);
    }
    flexdiag__err_clear();
    assert_int_equal(flexdiag__vq_config_read("/nonexistent/config.json", &c),
                     FLEXDIAG_ERR_NOT_FOUND);
}

/* ---- the CLI ---- */

static void test_cli(void **state) {
    fixture *f = *state;
    const char *bin = getenv("FLEXDIAG_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        fprintf(stderr, "FLEXDIAG_BIN not executable: CLI test skipped\n");
        skip();
    }
    char *dir = write_model(f, "cli", 1, NULL);
    int64_t tok[NIMG * HW], shape[2] = {NIMG, HW};
    int32_t ids[NIMG * HW];
    random_ids(ids, NIMG * HW, 40, 9);
    for (int i = 0; i < NIMG * HW; i++) tok[i] = ids[i];
    char tpath[4096], out[4096], raw[4096];
    snprintf(tpath, sizeof tpath, "%s/tokens.npy", f->dir);
    snprintf(out, sizeof out, "%s/png", f->dir);
    snprintf(raw, sizeof raw, "%s/raw.npy", f->dir);
    assert_int_equal(flexdiag__npy_write(tpath, FLEXDIAG_DTYPE_I64, 2, shape, tok), FLEXDIAG_OK);
    assert_int_equal(tu_system("'%s' decode --model '%s' --tokens '%s' --out '%s' --raw '%s' "
                               "--cpu --batch 2",
                               bin, dir, tpath, out, raw),
                     0);
    for (int i = 0; i < NIMG; i++) {
        char png[4200];
        snprintf(png, sizeof png, "%s/%d.png", out, i);
        assert_int_equal(access(png, R_OK), 0);
    }
    static float want[NIMG * PIX];
    assert_int_equal(decode_dir(flexdiag__kernels_cpu(), dir, NIMG, ids, NIMG, want), FLEXDIAG_OK);
    flexdiag_npy a;
    assert_int_equal(flexdiag__npy_read(raw, &a), FLEXDIAG_OK);
    assert_int_equal(a.ndim, 4);
    assert_int_equal(a.shape[0], NIMG);
    assert_int_equal(a.shape[1], 12);
    assert_int_equal(a.shape[3], 3);
    assert_memory_equal(a.data, want, sizeof want);
    flexdiag__npy_free(&a);
    /* an id outside the codebook is a usage error (exit 2) naming the file */
    tok[5] = 40;
    assert_int_equal(flexdiag__npy_write(tpath, FLEXDIAG_DTYPE_I64, 2, shape, tok), FLEXDIAG_OK);
    assert_int_equal(tu_system("'%s' decode --model '%s' --tokens '%s' --raw '%s' --cpu "
                               "2>/dev/null",
                               bin, dir, tpath, raw),
                     2);
    /* wrong grid size */
    shape[1] = HW - 1;
    assert_int_equal(flexdiag__npy_write(tpath, FLEXDIAG_DTYPE_I64, 2, shape, tok), FLEXDIAG_OK);
    assert_int_equal(tu_system("'%s' decode --model '%s' --tokens '%s' --raw '%s' --cpu "
                               "2>/dev/null",
                               bin, dir, tpath, raw),
                     2);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_layouts),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_plan_vq16),
        cmocka_unit_test(test_decode_vs_naive),
        cmocka_unit_test(test_names_and_tables_agree),
        cmocka_unit_test(test_bad_ids),
        cmocka_unit_test(test_missing_and_misshapen),
        cmocka_unit_test(test_unused_tensors_warned),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
