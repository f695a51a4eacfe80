/*
 * test_vqgan.c - the taming / Chameleon VQGAN layout of the image decoder (runtime/image) on
 * small random decoders written by the test (tiny_vq.c's weights under taming names, one
 * safetensors file): the shape derived from the tensor shapes, the whole decode through
 * flexdiag__vq_open_vqgan against the naive double-precision decoder with a raw (not
 * L2-normalised) codebook, with attention at the lowest level (taming attn_resolutions) and
 * without (Chameleon), bit-identical pixels from the same weights under the Janus layout (one
 * pipeline, two namings), the load-time errors (missing / misshapen / unexpected tensors name
 * the file, the tensor and the expected shape), the size of Chameleon's decoder and its shape
 * derived from a file of its tensor names and shapes.
 * The PyTorch fixture (tools/golden/make_vqgan.py) is test_vqgan_golden.c.
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
#include "kernels/kernels.h"
#include "st_write.h"
#include "tiny_vq.h"
#include "util.h"
#include "runtime/image/vq.h"

#define NIMG 3
#define HW 9                /* 3 x 3 grid */
#define PIX (12 * 12 * 3)   /* 3 levels: 12 x 12 pixels */

typedef struct fixture {
    char *dir; /* temp root */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->dir = tu_tempdir("vqgan");
    *state = f;
    return f->dir ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

/* tv_tiny_config (64/32/32 channels, 2 ResBlocks, 3x3 grid) as a VQGAN: raw codebook, taming
 * names; attention after the lowest level's ResBlocks when level_attn, else mid only. */
static flexdiag_vq_config vqgan_config(int level_attn) {
    flexdiag_vq_config c = tv_tiny_config();
    c.layout = FLEXDIAG_VQ_LAYOUT_TAMING;
    c.l2_codebook = 0;
    memset(c.attn, 0, sizeof c.attn);
    c.attn[c.n_levels - 1] = level_attn;
    for (int32_t l = c.n_levels; l < FLEXDIAG_VQ_MAX_LEVELS; l++) c.ch_mult[l] = 0; /* unused */
    return c;
}

static char *path_in(const fixture *f, const char *name) {
    char *p = NULL;
    assert_true(asprintf(&p, "%s/%s", f->dir, name) > 0);
    return p;
}

static void random_ids(int32_t *ids, int64_t n, int32_t V, uint64_t seed) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)tu_rng_int(&r, 0, V - 1);
}

/* Open path as a VQGAN on k (3x3 grid, taming's 32 groups) and decode n images; *cfg_out gets
 * the derived shape when not NULL. */
static flexdiag_status open_decode(const flexdiag_kernels *k, const char *path, const int32_t *ids,
                                   int64_t n, float *pixels, flexdiag_vq_config *cfg_out) {
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    flexdiag__err_clear();
    flexdiag_status st = k->stream_create(-1, 2, &s);
    if (st == FLEXDIAG_OK) st = flexdiag__vq_open_vqgan(k, s, path, 3, 3, 0, 2, &vq);
    if (st == FLEXDIAG_OK && cfg_out) *cfg_out = *flexdiag__vq_get_config(vq);
    if (st == FLEXDIAG_OK && n) st = flexdiag__vq_decode(vq, s, ids, n, pixels);
    if (st != FLEXDIAG_OK) assert_null(vq);
    flexdiag__vq_destroy(vq);
    k->stream_destroy(s);
    return st;
}

/* ---- the shape and the decode ---- */

static void test_decode_vs_naive(void **state) {
    fixture *f = *state;
    for (int level_attn = 0; level_attn < 2; level_attn++) {
        flexdiag_vq_config c = vqgan_config(level_attn), got_cfg;
        tv_model m;
        tv_build(&m, &c, 21 + (uint64_t)level_attn);
        char *path = path_in(f, level_attn ? "attn.safetensors" : "chameleon.safetensors");
        assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
        int32_t ids[NIMG * HW];
        random_ids(ids, NIMG * HW, c.codebook_size, 5);
        ids[0] = 0, ids[1] = c.codebook_size - 1; /* both ends of the codebook */
        static float got[NIMG * PIX], fast[NIMG * PIX], reff[NIMG * PIX];
        static double ref[NIMG * PIX];
        flexdiag_status st = open_decode(flexdiag__kernels_cpu_ref(), path, ids, NIMG, got,
                                         &got_cfg);
        if (st != FLEXDIAG_OK) fail_msg("open %s: %s", path, flexdiag__err_msg());
        /* every size comes back from the tensor shapes; groups and eps are taming's */
        assert_memory_equal(&got_cfg, &c, sizeof c);
        tv_naive_decode(&m, ids, NIMG, ref);
        for (int i = 0; i < NIMG * PIX; i++) reff[i] = (float)ref[i];
        double err = tu_rel_l2(got, reff, NIMG * PIX);
        fprintf(stderr, "VQGAN (level attention %d) decode vs naive: relative L2 %.3g\n",
                level_attn, err);
        /* as test_vq_load: ~30 fp32 layers deep (observed ~3e-6); a wiring mistake or an
         * L2-normalised codebook gives errors of order 0.1 */
        assert_true(err <= 1e-5);
        /* the multi-threaded CPU table is bit-identical to the reference */
        assert_int_equal(open_decode(flexdiag__kernels_cpu(), path, ids, NIMG, fast, NULL),
                         FLEXDIAG_OK);
        assert_memory_equal(got, fast, sizeof got);
        free(path);
        tv_free(&m);
    }
}

/* The same weights under the Janus layout (original names, conv_blocks in run order) with the
 * raw codebook give the same pixels bit for bit: one decode pipeline, two name schemes. */
static void test_same_pipeline_as_janus(void **state) {
    fixture *f = *state;
    flexdiag_vq_config c = vqgan_config(1);
    tv_model m;
    tv_build(&m, &c, 31);
    char *path = path_in(f, "same.safetensors"), *dir = path_in(f, "janus");
    assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
    assert_int_equal(tu_system("mkdir -p '%s'", dir), 0);
    assert_int_equal(tv_write(&m, dir, 0, NULL), 0);
    int32_t ids[NIMG * HW];
    random_ids(ids, NIMG * HW, c.codebook_size, 6);
    static float a[NIMG * PIX], b[NIMG * PIX];
    assert_int_equal(open_decode(flexdiag__kernels_cpu(), path, ids, NIMG, a, NULL), FLEXDIAG_OK);

    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    flexdiag_stream *s = NULL;
    flexdiag_safetensors *st = NULL;
    flexdiag_vq *vq = NULL;
    flexdiag_vq_config j = c;
    j.layout = FLEXDIAG_VQ_LAYOUT_JANUS;
    assert_int_equal(k->stream_create(-1, 2, &s), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_open(dir, &st), FLEXDIAG_OK);
    assert_int_equal(flexdiag__vq_create(k, s, st, &j, 2, &vq), FLEXDIAG_OK);
    assert_int_equal(flexdiag__vq_decode(vq, s, ids, NIMG, b), FLEXDIAG_OK);
    assert_memory_equal(a, b, sizeof a);
    /* and the Janus default (L2-normalised codebook) is a different decoder */
    flexdiag__vq_destroy(vq);
    j.l2_codebook = 1;
    assert_int_equal(flexdiag__vq_create(k, s, st, &j, 2, &vq), FLEXDIAG_OK);
    assert_int_equal(flexdiag__vq_decode(vq, s, ids, NIMG, b), FLEXDIAG_OK);
    assert_true(memcmp(a, b, sizeof a) != 0);
    flexdiag__vq_destroy(vq);
    flexdiag__st_close(st);
    k->stream_destroy(s);
    free(path), free(dir);
    tv_free(&m);
}

/* ---- load-time errors ---- */

/* Open path, expect status want and a message holding each of the NULL-terminated strings. */
static void expect_error(const char *path, flexdiag_status want, ...) {
    flexdiag_status st = open_decode(flexdiag__kernels_cpu(), path, NULL, 0, NULL, NULL);
    const char *msg = flexdiag__err_msg();
    if (st != want) fail_msg("%s: status %d, want %d (%s)", path, (int)st, (int)want, msg);
    va_list ap;
    va_start(ap, want);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        if (!strstr(msg, s)) fail_msg("message '%s' lacks '%s'", msg, s);
    va_end(ap);
    fprintf(stderr, "expected error: %s\n", msg);
}

static void test_missing(void **state) {
    fixture *f = *state;
    flexdiag_vq_config c = vqgan_config(0);
    tv_model m;
    tv_build(&m, &c, 41);
    char *path = path_in(f, "missing.safetensors");
    /* the shortcut of the level whose channels drop (64 -> 32): checked by the table */
    const char *gone = "decoder.up.1.block.0.nin_shortcut.weight";
    assert_int_equal(tv_write_vqgan(&m, path, gone, NULL), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, path, gone, "[32, 64, 1, 1]", NULL);
    /* a bias deep in the lowest-resolution level, and the mid attention's q */
    assert_int_equal(tv_write_vqgan(&m, path, "decoder.up.2.block.1.conv2.bias", NULL), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.up.2.block.1.conv2.bias", "[64]",
                 NULL);
    assert_int_equal(tv_write_vqgan(&m, path, "decoder.mid.attn_1.q.weight", NULL), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.mid.attn_1.q.weight",
                 "[64, 64, 1, 1]", NULL);
    /* tensors the shape is read from */
    static const char *const shape_src[] = {"quantize.embedding.weight", "decoder.conv_in.weight",
                                            "decoder.conv_out.weight",
                                            "decoder.up.0.block.0.conv1.weight"};
    for (size_t i = 0; i < sizeof shape_src / sizeof shape_src[0]; i++) {
        assert_int_equal(tv_write_vqgan(&m, path, shape_src[i], NULL), 0);
        expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, path, shape_src[i], "is missing", NULL);
    }
    free(path);
    tv_free(&m);
}

/* The shape of tensor orig (original scheme) of m, to change in place: a smaller shape writes
 * a prefix of its data. */
static int64_t *shape_of(tv_model *m, const char *orig) {
    tv_tensor *t = tv_get(m, orig);
    assert_non_null(t);
    return t->shape;
}

static void test_misshapen(void **state) {
    fixture *f = *state;
    flexdiag_vq_config c = vqgan_config(0);
    tv_model m;
    tv_build(&m, &c, 51);
    char *path = path_in(f, "shape.safetensors");
    /* a 1x1 kernel where the layout has 3x3 (up.2 = run-order block 0) */
    int64_t *sh = shape_of(&m, "gen_vision_model.decoder.conv_blocks.0.res.1.conv1.weight");
    sh[2] = sh[3] = 1;
    assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, path, "decoder.up.2.block.1.conv1.weight",
                 "has shape [64, 64, 1, 1], the VQ config needs [64, 64, 3, 3]", NULL);
    sh[2] = sh[3] = 3;
    /* post_quant_conv reading 4 of the 8 codebook dims */
    sh = shape_of(&m, "gen_vision_model.post_quant_conv.weight");
    sh[1] = 4;
    assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "post_quant_conv.weight",
                 "has shape [32, 4, 1, 1], the VQ config needs [32, 8, 1, 1]", NULL);
    sh[1] = 8;
    /* a codebook of rank 3 */
    sh = shape_of(&m, "gen_vision_model.quantize.embedding.weight");
    tv_tensor *cb = tv_get(&m, "gen_vision_model.quantize.embedding.weight");
    cb->ndim = 3, sh[2] = 1;
    assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "quantize.embedding.weight",
                 "has 3 dimensions, the VQGAN decoder needs 2", NULL);
    cb->ndim = 2;
    /* a level whose channels are not a multiple of conv_out's 32 base channels: up.1 of 16 */
    sh = shape_of(&m, "gen_vision_model.decoder.conv_blocks.1.res.0.conv1.weight");
    sh[0] = 16;
    assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.up.1.block.0.conv1.weight",
                 "not a multiple", NULL);
    sh[0] = 32;
    /* a grid of 0 and GroupNorm groups that do not divide the channels */
    assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    assert_int_equal(k->stream_create(-1, 1, &s), FLEXDIAG_OK);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__vq_open_vqgan(k, s, path, 0, 3, 0, 1, &vq),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "grid"));
    flexdiag__err_clear();
    assert_int_equal(flexdiag__vq_open_vqgan(k, s, path, 3, 3, 24, 1, &vq),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "group count (24)"));
    assert_null(vq);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__vq_open_vqgan(k, s, "/nonexistent/vqgan.safetensors", 3, 3, 0, 1,
                                             &vq),
                     FLEXDIAG_ERR_NOT_FOUND);
    assert_non_null(strstr(flexdiag__err_msg(), "/nonexistent/vqgan.safetensors"));
    k->stream_destroy(s);
    free(path);
    tv_free(&m);
}

/* Decoder tensors outside the derived layout are an error; other parts of a full VQGAN
 * checkpoint (encoder, quant_conv, loss) are ignored. */
static void test_unexpected(void **state) {
    fixture *f = *state;
    flexdiag_vq_config c = vqgan_config(0);
    tv_model m;
    tv_build(&m, &c, 61);
    char *path = path_in(f, "extra.safetensors");
    uint16_t one[64] = {0};
    flexdiag_st_entry extra = {.name = "decoder.up.1.block.2.norm1.weight",
                               .dtype = FLEXDIAG_DTYPE_BF16, .ndim = 1, .shape = {32},
                               .data = one};
    /* a third ResBlock in up.1 while up.0 has two */
    assert_int_equal(tv_write_vqgan(&m, path, NULL, &extra), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, path, "decoder.up.1.block.2.norm1.weight",
                 "outside the VQGAN layout", NULL);
    /* attention in a level other than the first found: up.1.attn without up.1.attn.0.norm */
    extra.name = "decoder.up.1.attn.0.q.bias";
    assert_int_equal(tv_write_vqgan(&m, path, NULL, &extra), 0);
    expect_error(path, FLEXDIAG_ERR_CORRUPT_MODEL, "decoder.up.1.attn.0.q.bias", NULL);
    /* taming's index remapping is refused */
    extra.name = "quantize.used";
    assert_int_equal(tv_write_vqgan(&m, path, NULL, &extra), 0);
    expect_error(path, FLEXDIAG_ERR_UNSUPPORTED, "quantize.used", "remap", NULL);
    /* the rest of a VQGAN checkpoint loads */
    static const char *const ignored[] = {"encoder.conv_in.bias", "quant_conv.bias",
                                          "loss.discriminator.main.0.bias"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        extra.name = ignored[i];
        assert_int_equal(tv_write_vqgan(&m, path, NULL, &extra), 0);
        flexdiag_status st = open_decode(flexdiag__kernels_cpu(), path, NULL, 0, NULL, NULL);
        if (st != FLEXDIAG_OK) fail_msg("%s: %s", ignored[i], flexdiag__err_msg());
    }
    free(path);
    tv_free(&m);
}

/* ---- Chameleon's decoder ---- */

/* Chameleon / Lumina-mGPT: codebook 8192 x 256, ch 128, ch_mult (1,1,2,2,4), 3 ResBlocks per
 * level, z 256, mid attention only; 41.46 M parameters (2,097,152 of them the codebook, kept
 * fp32: 8,388,608 bytes; the other 39,360,643 bf16: 78,721,286 bytes) plus at most 256 bytes
 * of alignment per tensor; 512 x 512 pixels from 32 x 32 codes. */
static void test_plan_chameleon(void **state) {
    (void)state;
    flexdiag_vq_config c;
    flexdiag__vq_config_chameleon(&c);
    assert_int_equal(flexdiag__vq_config_validate(&c), FLEXDIAG_OK);
    size_t w = 0, s = 0;
    assert_int_equal(flexdiag__vq_plan(&c, 1, &w, &s), FLEXDIAG_OK);
    fprintf(stderr, "Chameleon VQGAN: weights %zu bytes, scratch %zu bytes per image (f32)\n", w,
                    s);
    const size_t exact = 8388608 + 78721286;
    assert_true(w >= exact && w < exact + 256 * 400); /* fewer than 400 tensors */
    int32_t h = 0, wd = 0;
    flexdiag__vq_image_size(&c, &h, &wd);
    assert_int_equal(h, 512);
    assert_int_equal(wd, 512);
    /* three buffers of the largest activation, 128 x 512 x 512 f32, plus K and V of the mid
     * attention (512 x 32 x 32 f32 each) and the ids */
    assert_true(s >= 3 * (size_t)134217728 + 2 * 2097152 && s < 3 * (size_t)134217728 + 4400000);
}

/* A file with Chameleon's tensor names and shapes (random weights, 83 MB): the derived shape is
 * flexdiag__vq_config_chameleon, nin_shortcut where the channels drop (up.3.block.0 512 -> 256,
 * up.1.block.0 256 -> 128), and the load allocates what the plan says. Not decoded (minutes on
 * the CPU at 512 x 512). */
static void test_chameleon_shape(void **state) {
    fixture *f = *state;
    flexdiag_vq_config c, got;
    flexdiag__vq_config_chameleon(&c);
    tv_model m;
    tv_build(&m, &c, 71);
    char *path = path_in(f, "chameleon_full.safetensors");
    assert_int_equal(tv_write_vqgan(&m, path, NULL, NULL), 0);
    tv_free(&m);
    flexdiag_safetensors *st = NULL;
    assert_int_equal(flexdiag__st_open(path, &st), FLEXDIAG_OK);
    assert_non_null(flexdiag__st_find(st, "decoder.up.3.block.0.nin_shortcut.weight"));
    assert_non_null(flexdiag__st_find(st, "decoder.up.1.block.0.nin_shortcut.weight"));
    assert_null(flexdiag__st_find(st, "decoder.up.4.block.0.nin_shortcut.weight"));
    assert_null(flexdiag__st_find(st, "decoder.up.0.upsample.conv.weight"));
    flexdiag__st_close(st);
    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    flexdiag_stream *s = NULL;
    flexdiag_vq *vq = NULL;
    assert_int_equal(k->stream_create(-1, 2, &s), FLEXDIAG_OK);
    flexdiag__err_clear();
    if (flexdiag__vq_open_vqgan(k, s, path, 32, 32, 0, 1, &vq) != FLEXDIAG_OK)
        fail_msg("open %s: %s", path, flexdiag__err_msg());
    got = *flexdiag__vq_get_config(vq);
    assert_memory_equal(&got, &c, sizeof c);
    size_t wp = 0, sp = 0, wb = 0, sb = 0;
    assert_int_equal(flexdiag__vq_plan(&c, 1, &wp, &sp), FLEXDIAG_OK);
    flexdiag__vq_bytes(vq, &wb, &sb);
    assert_int_equal(wp, wb);
    assert_int_equal(sp, sb);
    flexdiag__vq_destroy(vq);
    k->stream_destroy(s);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_vs_naive), cmocka_unit_test(test_same_pipeline_as_janus),
        cmocka_unit_test(test_missing),         cmocka_unit_test(test_misshapen),
        cmocka_unit_test(test_unexpected),      cmocka_unit_test(test_plan_chameleon),
        cmocka_unit_test(test_chameleon_shape),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
