/*
 * test_vq_ops.c - the CPU image-decoder ops (vq_lookup, conv2d, groupnorm, upsample2x,
 * attn_spatial, to_nhwc) of both CPU tables against the double-precision naive versions in
 * naive_vq.c, over shape tables with odd sizes (1×1 images, width 1, kernels larger than the
 * image, channel counts that are not multiples of anything). Every output buffer is followed by
 * 1024 guard floats that must come back bit-identical, and is pre-filled with junk so an
 * unwritten element fails. The parallel ops of the "cpu" table must equal the reference bit
 * for bit with a 3-thread stream.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "kernels/kernels.h"
#include "naive_vq.h"
#include "util.h"

#define GUARD 1024
#define GUARD_VAL -7777.25f /* any value no op produces */
#define JUNK 1.0e30f        /* pre-fill of outputs: an unwritten element fails the comparison */

/* fp32 tolerances of docs/architecture.md §10.2 */
#define ATOL 1e-5
#define RTOL 1.3e-6
#define NMSE 1e-7

static flexdiag_stream *pool; /* 3 workers, for the "cpu" table */

/* ---- buffers ---- */

static float *out_alloc(int64_t n) {
    float *p = malloc((size_t)(n + GUARD) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = JUNK;
    for (int64_t i = n; i < n + GUARD; i++) p[i] = GUARD_VAL;
    return p;
}

static void check_guard(const char *label, const float *p, int64_t n) {
    for (int64_t i = n; i < n + GUARD; i++) {
        float g = GUARD_VAL;
        if (memcmp(&p[i], &g, sizeof g)) fail_msg("%s: guard element %lld overwritten", label,
                                                  (long long)(i - n));
    }
}

static float *rand_f32(tu_rng *r, int64_t n, float scale, float offset) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    assert_non_null(p);
    tu_fill_f32(r, p, n, scale);
    for (int64_t i = 0; i < n; i++) p[i] += offset;
    return p;
}

static uint16_t *rand_bf16(tu_rng *r, int64_t n, float scale, float offset) {
    uint16_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = flexdiag__f32_to_bf16((float)(tu_rng_normal(r) * scale) + offset);
    return p;
}

static double *to_double(const float *x, int64_t n) {
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    assert_non_null(d);
    naive_to_double(d, x, n);
    return d;
}

/* got (fp32) vs the double reference ref. */
static void expect_close(const char *label, const float *got, const double *ref, int64_t n,
                         double atol, double rtol) {
    float *rf = malloc((size_t)(n ? n : 1) * sizeof *rf);
    assert_non_null(rf);
    naive_to_float(rf, ref, n);
    int ok = tu_allclose(label, got, rf, n, atol, rtol, NMSE);
    free(rf);
    if (!ok) fail_msg("%s: differs from the naive reference", label);
}

static void expect_same(const char *label, const float *a, const float *b, int64_t n) {
    if (memcmp(a, b, (size_t)n * sizeof *a)) fail_msg("%s: not bit-identical", label);
}

/* ---- vq_lookup ---- */

static void test_vq_lookup(void **state) {
    (void)state;
    const flexdiag_kernels *tabs[2] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    static const int32_t shapes[][4] = {{1, 1, 1, 1}, {3, 8, 7, 13}, {2, 3, 5, 2}}; /* n c hw V */
    tu_rng r;
    tu_rng_seed(&r, 1);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int32_t n = shapes[si][0], c = shapes[si][1], hw = shapes[si][2], V = shapes[si][3];
        float *cb = rand_f32(&r, (int64_t)V * c, 1.0f, 0.0f);
        int32_t *ids = malloc((size_t)n * hw * sizeof *ids);
        for (int64_t i = 0; i < (int64_t)n * hw; i++) ids[i] = (int32_t)tu_rng_int(&r, 0, V - 1);
        for (int t = 0; t < 2; t++) {
            int64_t len = (int64_t)n * c * hw;
            float *out = out_alloc(len);
            assert_int_equal(tabs[t]->vq_lookup(out, cb, ids, n, c, hw, pool), FLEXDIAG_OK);
            for (int64_t i = 0; i < n; i++)
                for (int32_t ch = 0; ch < c; ch++)
                    for (int32_t j = 0; j < hw; j++)
                        assert_true(out[(i * c + ch) * hw + j] ==
                                    cb[(int64_t)ids[i * hw + j] * c + ch]);
            check_guard("vq_lookup", out, len);
            free(out);
        }
        free(ids);
        free(cb);
    }
}

/* ---- conv2d ---- */

typedef struct conv_case {
    int n, cin, cout, h, w, k, accum, bias;
} conv_case;

static const conv_case conv_cases[] = {
    {1, 1, 1, 1, 1, 1, 0, 1},  {2, 3, 5, 7, 9, 3, 0, 1},  {1, 4, 3, 5, 1, 3, 0, 1},
    {3, 2, 4, 1, 6, 3, 1, 1},  {1, 5, 2, 4, 4, 5, 0, 0},  {2, 17, 6, 6, 11, 1, 1, 1},
    {1, 8, 8, 3, 3, 3, 1, 0},  {1, 33, 7, 13, 10, 3, 0, 1}, {2, 1, 3, 2, 2, 7, 0, 1},
};

static void run_conv_case(const conv_case *cc, tu_rng *r) {
    int64_t in_n = (int64_t)cc->n * cc->cin * cc->h * cc->w;
    int64_t out_n = (int64_t)cc->n * cc->cout * cc->h * cc->w;
    float *x = rand_f32(r, in_n, 1.0f, 0.0f), *init = rand_f32(r, out_n, 1.0f, 0.0f);
    uint16_t *w = rand_bf16(r, (int64_t)cc->cout * cc->cin * cc->k * cc->k, 0.3f, 0.0f);
    uint16_t *b = cc->bias ? rand_bf16(r, cc->cout, 0.5f, 0.0f) : NULL;
    double *xd = to_double(x, in_n), *ref = malloc((size_t)out_n * sizeof *ref);
    naive_conv2d(ref, xd, w, b, cc->n, cc->cin, cc->cout, cc->h, cc->w, cc->k);
    if (cc->accum)
        for (int64_t i = 0; i < out_n; i++) ref[i] += init[i];
    float *got[2];
    const flexdiag_kernels *tabs[2] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    for (int t = 0; t < 2; t++) {
        got[t] = out_alloc(out_n);
        if (cc->accum) memcpy(got[t], init, (size_t)out_n * sizeof *init);
        assert_int_equal(tabs[t]->conv2d(got[t], x, w, b, cc->n, cc->cin, cc->cout, cc->h, cc->w,
                                         cc->k, cc->accum ? FLEXDIAG_MM_ACCUM : 0, pool),
                         FLEXDIAG_OK);
        check_guard("conv2d", got[t], out_n);
    }
    expect_close("conv2d", got[0], ref, out_n, ATOL, RTOL);
    expect_same("conv2d cpu vs cpu-ref", got[1], got[0], out_n);
    for (int t = 0; t < 2; t++) free(got[t]);
    free(x), free(init), free(w), free(b), free(xd), free(ref);
}

static void test_conv2d(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 2);
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
        run_conv_case(&conv_cases[i], &r);
}

/* ---- groupnorm ---- */

static void test_groupnorm(void **state) {
    (void)state;
    /* n, c, hw, groups, swish, offset (large offsets test the variance for cancellation) */
    static const struct { int n, c, hw, groups, swish; float offset; } cases[] = {
        {1, 4, 5, 1, 0, 0.0f},  {2, 6, 7, 3, 1, 0.0f},    {3, 64, 9, 32, 1, 0.5f},
        {1, 32, 1, 32, 0, 0.0f}, {2, 96, 13, 32, 1, 100.0f}, {1, 5, 3, 5, 1, -3.0f},
    };
    tu_rng r;
    tu_rng_seed(&r, 3);
    const flexdiag_kernels *tabs[2] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t len = (int64_t)cases[ci].n * cases[ci].c * cases[ci].hw;
        float *x = rand_f32(&r, len, 1.0f, cases[ci].offset);
        uint16_t *g = rand_bf16(&r, cases[ci].c, 0.2f, 1.0f), *b = rand_bf16(&r, cases[ci].c, 0.3f,
                                                                              0.0f);
        double *xd = to_double(x, len), *ref = malloc((size_t)len * sizeof *ref);
        naive_groupnorm(ref, xd, g, b, cases[ci].n, cases[ci].c, cases[ci].hw, cases[ci].groups,
                        (double)1e-6f, cases[ci].swish);
        for (int t = 0; t < 2; t++) {
            float *out = out_alloc(len);
            assert_int_equal(tabs[t]->groupnorm(out, x, g, b, cases[ci].n, cases[ci].c,
                                                cases[ci].hw, cases[ci].groups, 1e-6f,
                                                cases[ci].swish, pool),
                             FLEXDIAG_OK);
            check_guard("groupnorm", out, len);
            expect_close("groupnorm", out, ref, len, ATOL, RTOL);
            free(out);
        }
        free(x), free(g), free(b), free(xd), free(ref);
    }
}

/* ---- upsample2x and to_nhwc (data movement: exact) ---- */

static void test_upsample2x(void **state) {
    (void)state;
    static const int cases[][4] = {{1, 1, 1, 1}, {2, 3, 4, 5}, {1, 2, 7, 1}, {3, 1, 1, 6}};
    tu_rng r;
    tu_rng_seed(&r, 4);
    const flexdiag_kernels *tabs[2] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n = cases[ci][0], c = cases[ci][1], h = cases[ci][2], w = cases[ci][3];
        int64_t in_n = (int64_t)n * c * h * w, out_n = 4 * in_n;
        float *x = rand_f32(&r, in_n, 1.0f, 0.0f);
        double *xd = to_double(x, in_n), *ref = malloc((size_t)out_n * sizeof *ref);
        float *rf = malloc((size_t)out_n * sizeof *rf);
        naive_upsample2x(ref, xd, n, c, h, w);
        naive_to_float(rf, ref, out_n);
        for (int t = 0; t < 2; t++) {
            float *out = out_alloc(out_n);
            assert_int_equal(tabs[t]->upsample2x(out, x, n, c, h, w, pool), FLEXDIAG_OK);
            check_guard("upsample2x", out, out_n);
            expect_same("upsample2x", out, rf, out_n);
            free(out);
        }
        free(x), free(xd), free(ref), free(rf);
    }
}

static void test_to_nhwc(void **state) {
    (void)state;
    static const int cases[][3] = {{1, 3, 5}, {2, 3, 17}, {3, 1, 4}, {1, 5, 1}};
    tu_rng r;
    tu_rng_seed(&r, 5);
    const flexdiag_kernels *tabs[2] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n = cases[ci][0], c = cases[ci][1], hw = cases[ci][2];
        int64_t len = (int64_t)n * c * hw;
        float *x = rand_f32(&r, len, 1.0f, 0.0f);
        for (int t = 0; t < 2; t++) {
            float *out = out_alloc(len);
            assert_int_equal(tabs[t]->to_nhwc(out, x, n, c, hw, pool), FLEXDIAG_OK);
            check_guard("to_nhwc", out, len);
            for (int64_t i = 0; i < n; i++)
                for (int ch = 0; ch < c; ch++)
                    for (int j = 0; j < hw; j++)
                        assert_true(out[(i * hw + j) * c + ch] == x[(i * c + ch) * hw + j]);
            free(out);
        }
        free(x);
    }
}

/* ---- attn_spatial ---- */

static void test_attn_spatial(void **state) {
    (void)state;
    static const int cases[][3] = {{1, 1, 1}, {2, 3, 5}, {1, 32, 17}, {3, 8, 36}, {1, 64, 9}};
    tu_rng r;
    tu_rng_seed(&r, 6);
    const flexdiag_kernels *tabs[2] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n = cases[ci][0], c = cases[ci][1], hw = cases[ci][2];
        int64_t len = (int64_t)n * c * hw;
        /* scale 1.5: logits spread over several units, so the softmax is far from uniform */
        float *q = rand_f32(&r, len, 1.5f, 0.0f), *k = rand_f32(&r, len, 1.5f, 0.0f);
        float *v = rand_f32(&r, len, 1.0f, 0.0f);
        double *qd = to_double(q, len), *kd = to_double(k, len), *vd = to_double(v, len);
        double *ref = malloc((size_t)len * sizeof *ref);
        naive_attn_spatial(ref, qd, kd, vd, n, c, hw);
        float *got[2];
        for (int t = 0; t < 2; t++) {
            got[t] = out_alloc(len);
            assert_int_equal(tabs[t]->attn_spatial(got[t], q, k, v, n, c, hw, pool), FLEXDIAG_OK);
            check_guard("attn_spatial", got[t], len);
        }
        expect_close("attn_spatial", got[0], ref, len, ATOL, RTOL);
        expect_same("attn_spatial cpu vs cpu-ref", got[1], got[0], len);
        free(got[0]), free(got[1]), free(q), free(k), free(v), free(qd), free(kd), free(vd);
        free(ref);
    }
}

/* ---- argument checks ---- */

static void test_bad_args(void **state) {
    (void)state;
    float x[16] = {0}, out[16];
    uint16_t w[16] = {0}, g[4] = {0};
    const flexdiag_kernels *tabs[2] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    for (int t = 0; t < 2; t++) {
        flexdiag__err_clear();
        assert_int_equal(tabs[t]->conv2d(out, x, w, NULL, 1, 1, 1, 2, 2, 2, 0, pool),
                         FLEXDIAG_ERR_INVALID_ARG); /* even kernel */
        assert_non_null(strstr(flexdiag__err_msg(), "odd"));
        flexdiag__err_clear();
        assert_int_equal(tabs[t]->conv2d(out, x, w, NULL, 1, 1, 1, 2, 2, 1, FLEXDIAG_MM_OUT_F32,
                                         pool),
                         FLEXDIAG_ERR_INVALID_ARG);
        flexdiag__err_clear();
        assert_int_equal(tabs[t]->groupnorm(out, x, g, g, 1, 4, 4, 3, 1e-6f, 0, pool),
                         FLEXDIAG_ERR_INVALID_ARG); /* 4 channels in 3 groups */
        flexdiag__err_clear();
        assert_int_equal(tabs[t]->attn_spatial(out, x, x, x, 1, 0, 4, pool),
                         FLEXDIAG_ERR_INVALID_ARG);
        flexdiag__err_clear();
    }
}

static int setup(void **state) {
    (void)state;
    return flexdiag__kernels_cpu()->stream_create(-1, 3, &pool) == FLEXDIAG_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    flexdiag__kernels_cpu()->stream_destroy(pool);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vq_lookup),  cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_groupnorm),  cmocka_unit_test(test_upsample2x),
        cmocka_unit_test(test_to_nhwc),    cmocka_unit_test(test_attn_spatial),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
