/*
 * test_vq_cuda.c - the CUDA image-decoder ops (vq_lookup, conv2d, groupnorm, upsample2x,
 * attn_spatial, to_nhwc) against the scalar CPU reference flexdiag__kernels_cpu_ref(), then the
 * whole VQ-16 decoder on CUDA (style.md §7):
 *   - inputs are bf16 (the CUDA act type); the reference runs on the same values upcast to fp32;
 *   - data movement (lookup, upsample, transpose) is exact; conv2d and groupnorm use bf16
 *     tolerances (see CONV_ATOL); attn_spatial also meets flash-attention's rule against an
 *     fp64 reference (error ≤ 2x that of a naive computation with the same bf16 roundings);
 *   - shapes cover c = 32, 64, 96, odd planes (3 x 5), n = 1 and 3, k = 1, 3 and 5, bias and
 *     ACCUM on and off, and sizes that make conv2d / attn_spatial chunk through the workspace;
 *   - every device output sits between guard regions that must come back unchanged, and starts
 *     poisoned (0xFF bytes: NaN) so unwritten outputs show;
 *   - end to end: the golden fixture (tests/golden/data/janus) decoded on CUDA must match the
 *     transformers pixels within relative L2 2e-2; and a timing print (not an assertion) of the
 *     full VQ-16 config with random weights, 16 images.
 * Exit 77 without CUDA or a device.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "core.h"
#include "kernels.h"
#include "npy.h"
#include "gpu_buf.h"
#include "util.h"
#include "vq.h"


/* style.md §7 bf16 tolerances. */
#define BF16_ATOL 1e-3
#define BF16_RTOL 1.6e-2
#define BF16_NMSE 1e-4
/* conv2d: the CUDA output is bf16 while the reference keeps fp32, and with a bias on a 1×1 conv
 * (or ACCUM) the CUDA path rounds (old + b) to bf16 before the GEMM adds onto it. When the sum
 * then cancels, that intermediate rounding (≈ |old + b|·2^-9 ≈ 4e-3 for values near 2) is not
 * covered by rtol·|result|, so atol is 1e-2 instead of 1e-3. Sums over cin·k² ≤ 2304 products in
 * fp32 differ between the two summation orders by far less than that. */
#define CONV_ATOL 1e-2

static const flexdiag_kernels *G; /* CUDA table under test */
static const flexdiag_kernels *R; /* scalar reference (fp32 act) */
static flexdiag_stream *S;        /* CUDA stream */

#define OK(expr)                                                                                   \
    do {                                                                                           \
        flexdiag_status st_ = (expr);                                                              \
        if (st_ != FLEXDIAG_OK)                                                                    \
            fail_msg("%s: %s: %s", #expr, flexdiag_status_str(st_), flexdiag__err_msg());        \
    } while (0)

/* ---- host data ---- */

/* n bf16 values N(mean, scale²) and their fp32 upcast (*up, malloc'ed). */
static uint16_t *bf16_rand(tu_rng *r, int64_t n, float mean, float scale, float **up) {
    uint16_t *x = xmalloc((size_t)n * 2);
    *up = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        x[i] = flexdiag__f32_to_bf16(mean + scale * (float)tu_rng_normal(r));
        (*up)[i] = flexdiag__bf16_to_f32(x[i]);
    }
    return x;
}

/* A bf16 host array as a new guarded device buffer. */
static dbuf dev_bf16(const uint16_t *x, int64_t n, size_t off) {
    dbuf b = dbuf_make((size_t)n, 2, off);
    dbuf_put(&b, x);
    return b;
}

/* Download a bf16 device output (guards checked into *ok) as fp32. */
static float *get_bf16(const dbuf *b, const char *label, int *ok) {
    uint16_t *h = xmalloc(b->n * 2);
    *ok = dbuf_get(b, h, label) && *ok;
    float *f = xmalloc(b->n * 4);
    for (size_t i = 0; i < b->n; i++) f[i] = flexdiag__bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* ---- vq_lookup ---- */

static void test_lookup(void **state) {
    (void)state;
    static const int32_t cases[][3] = {{1, 8, 15}, {3, 8, 576}, {3, 32, 64}}; /* n, c, hw */
    tu_rng r;
    tu_rng_seed(&r, 1);
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int64_t n = cases[t][0], V = 64;
        const int32_t c = cases[t][1], hw = cases[t][2];
        float *cb = xmalloc((size_t)(V * c) * 4), *ref = xmalloc((size_t)(n * c * hw) * 4);
        int32_t *ids = xmalloc((size_t)(n * hw) * 4);
        tu_fill_f32(&r, cb, V * c, 1.0f);
        for (int64_t i = 0; i < n * hw; i++) ids[i] = (int32_t)tu_rng_int(&r, 0, V - 1);
        OK(R->vq_lookup(ref, cb, ids, n, c, hw, NULL));
        dbuf dcb = dbuf_make((size_t)(V * c), 4, 0), did = dbuf_make((size_t)(n * hw), 4, 0);
        dbuf dout = dbuf_make((size_t)(n * c * hw), 2, t);
        dbuf_put(&dcb, cb);
        dbuf_put(&did, ids);
        OK(G->vq_lookup(dptr(&dout), dptr(&dcb), dptr(&did), n, c, hw, S));
        int ok = 1;
        float *got = get_bf16(&dout, "vq_lookup", &ok);
        for (int64_t i = 0; i < n * c * hw; i++)
            ok = ok && flexdiag__f32_to_bf16(ref[i]) == flexdiag__f32_to_bf16(got[i]);
        if (!ok) fail_msg("vq_lookup n=%lld c=%d hw=%d: output differs", (long long)n, c, hw);
        dbuf_free(&dcb), dbuf_free(&did), dbuf_free(&dout);
        free(cb), free(ref), free(ids), free(got);
    }
}

/* ---- conv2d ---- */

typedef struct conv_case {
    int32_t n, cin, cout, h, w, k;
    int bias, accum;
} conv_case;

static int conv_one(tu_rng *r, const conv_case *cc, size_t off) {
    const int64_t nx = (int64_t)cc->n * cc->cin * cc->h * cc->w;
    const int64_t no = (int64_t)cc->n * cc->cout * cc->h * cc->w;
    const int64_t nw = (int64_t)cc->cout * cc->cin * cc->k * cc->k;
    float *xf, *wf, *bf, *of;
    uint16_t *x = bf16_rand(r, nx, 0.0f, 1.0f, &xf);
    uint16_t *w = bf16_rand(r, nw, 0.0f, 1.0f / sqrtf((float)(cc->cin * cc->k * cc->k)), &wf);
    uint16_t *b = bf16_rand(r, cc->cout, 0.0f, 0.5f, &bf);
    uint16_t *o0 = bf16_rand(r, no, 0.0f, 1.0f, &of); /* the ACCUM input */
    const unsigned flags = cc->accum ? FLEXDIAG_MM_ACCUM : 0u;
    OK(R->conv2d(of, xf, w, cc->bias ? b : NULL, cc->n, cc->cin, cc->cout, cc->h, cc->w, cc->k,
                 flags, NULL));
    dbuf dx = dev_bf16(x, nx, 0), dw = dev_bf16(w, nw, 0), db = dev_bf16(b, cc->cout, 0);
    dbuf dout = dbuf_make((size_t)no, 2, off);
    if (cc->accum) dbuf_put(&dout, o0);
    OK(G->conv2d(dptr(&dout), dptr(&dx), dptr(&dw), cc->bias ? dptr(&db) : NULL, cc->n, cc->cin,
                 cc->cout, cc->h, cc->w, cc->k, flags, S));
    char label[128];
    snprintf(label, sizeof label, "conv2d n=%d cin=%d cout=%d %dx%d k=%d bias=%d accum=%d off=%zu",
             cc->n, cc->cin, cc->cout, cc->h, cc->w, cc->k, cc->bias, cc->accum, off);
    int ok = 1;
    float *got = get_bf16(&dout, label, &ok);
    ok = tu_allclose(label, got, of, no, CONV_ATOL, BF16_RTOL, BF16_NMSE) && ok;
    if (!ok) fprintf(stderr, "FAILED: %s\n", label);
    dbuf_free(&dx), dbuf_free(&dw), dbuf_free(&db), dbuf_free(&dout);
    free(x), free(w), free(b), free(o0), free(xf), free(wf), free(bf), free(of), free(got);
    return ok;
}

static void test_conv(void **state) {
    (void)state;
    static const conv_case cases[] = {
        {1, 32, 32, 3, 5, 3, 1, 0},   {3, 64, 32, 5, 3, 3, 0, 1},   {3, 96, 64, 8, 8, 3, 1, 1},
        {1, 32, 96, 24, 24, 3, 0, 0}, {3, 64, 64, 24, 24, 3, 1, 0}, {1, 8, 32, 3, 5, 1, 1, 0},
        {3, 96, 32, 8, 8, 1, 0, 1},   {3, 64, 64, 24, 24, 1, 1, 1}, {1, 32, 32, 8, 5, 1, 0, 0},
        {1, 3, 7, 8, 8, 3, 1, 0},     {3, 32, 33, 5, 8, 5, 1, 1},   {1, 64, 3, 24, 24, 3, 1, 0},
        /* 3 x 64·9 rows x 96² pixels > the workspace: several images per chunk, then fewer */
        {3, 64, 64, 96, 96, 3, 1, 1},
        /* 256·9 rows x 96² pixels > the workspace for one image: pixel chunks */
        {1, 256, 33, 96, 96, 3, 1, 0},
    };
    tu_rng r;
    tu_rng_seed(&r, 2);
    int fails = 0;
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++)
        fails += !conv_one(&r, &cases[t], t % 3 == 2 ? 1 : 0);
    assert_int_equal(fails, 0);
}

static void test_conv_errors(void **state) {
    (void)state;
    void *p = (void *)16;
    const uint16_t *w = (const uint16_t *)p;
    assert_int_equal(G->conv2d(p, p, w, NULL, 1, 4, 4, 3, 3, 2, 0, S), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(G->conv2d(p, p, w, NULL, 1, 4, 4, 3, 3, 3, FLEXDIAG_MM_OUT_F32, S),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(G->conv2d(p, p, w, NULL, 1, 0, 4, 3, 3, 3, 0, S), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(G->conv2d(p, p, w, NULL, 1, 4, 4, 3, 3, 3, 0, NULL),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "conv2d"));
    assert_int_equal(G->groupnorm(p, p, w, w, 1, 30, 4, 8, 1e-6f, 0, S), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(G->attn_spatial(p, p, p, p, 1, 0, 4, S), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(G->upsample2x(p, p, 1, 4, 0, 4, S), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(G->to_nhwc(p, p, -1, 3, 4, S), FLEXDIAG_ERR_INVALID_ARG);
    /* n = 0 is a no-op that touches nothing */
    OK(G->conv2d(NULL, NULL, NULL, NULL, 0, 4, 4, 3, 3, 3, 0, S));
    OK(G->attn_spatial(NULL, NULL, NULL, NULL, 0, 4, 4, S));
    flexdiag__err_clear();
}

/* ---- groupnorm ---- */

static void test_groupnorm(void **state) {
    (void)state;
    /* n, c, hw, groups, swish, mean of x (an offset tests the variance against cancellation) */
    static const struct {
        int32_t n, c, hw, groups, swish;
        float mean;
    } cases[] = {
        {1, 32, 15, 8, 1, 0.0f},  {3, 64, 9, 32, 0, 3.0f},     {3, 96, 64, 32, 1, 0.5f},
        {1, 32, 576, 32, 0, 0.f}, {3, 128, 9216, 32, 1, 4.0f}, {1, 64, 5, 1, 1, -2.0f},
    };
    tu_rng r;
    tu_rng_seed(&r, 3);
    int fails = 0;
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int64_t nx = (int64_t)cases[t].n * cases[t].c * cases[t].hw;
        float *xf, *gf, *bf, *ref = xmalloc((size_t)nx * 4);
        uint16_t *x = bf16_rand(&r, nx, cases[t].mean, 1.0f, &xf);
        uint16_t *g = bf16_rand(&r, cases[t].c, 1.0f, 0.2f, &gf);
        uint16_t *b = bf16_rand(&r, cases[t].c, 0.0f, 0.2f, &bf);
        OK(R->groupnorm(ref, xf, g, b, cases[t].n, cases[t].c, cases[t].hw, cases[t].groups,
                        1e-6f, cases[t].swish, NULL));
        dbuf dx = dev_bf16(x, nx, t % 2), dg = dev_bf16(g, cases[t].c, 0);
        dbuf db = dev_bf16(b, cases[t].c, 0), dout = dbuf_make((size_t)nx, 2, t % 2);
        OK(G->groupnorm(dptr(&dout), dptr(&dx), dptr(&dg), dptr(&db), cases[t].n, cases[t].c,
                        cases[t].hw, cases[t].groups, 1e-6f, cases[t].swish, S));
        char label[96];
        snprintf(label, sizeof label, "groupnorm n=%d c=%d hw=%d groups=%d swish=%d",
                 cases[t].n, cases[t].c, cases[t].hw, cases[t].groups, cases[t].swish);
        int ok = 1;
        float *got = get_bf16(&dout, label, &ok);
        ok = tu_allclose(label, got, ref, nx, BF16_ATOL, BF16_RTOL, BF16_NMSE) && ok;
        fails += !ok;
        dbuf_free(&dx), dbuf_free(&dg), dbuf_free(&db), dbuf_free(&dout);
        free(x), free(g), free(b), free(xf), free(gf), free(bf), free(ref), free(got);
    }
    assert_int_equal(fails, 0);
}

/* ---- upsample2x and to_nhwc (exact) ---- */

static void test_upsample_nhwc(void **state) {
    (void)state;
    static const int32_t cases[][5] = {/* n, c, h, w, output offset */
                                       {1, 32, 3, 5, 0}, {3, 32, 8, 8, 0}, {3, 64, 8, 8, 1},
                                       {1, 96, 24, 24, 0}, {3, 3, 24, 24, 0}};
    tu_rng r;
    tu_rng_seed(&r, 4);
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int32_t n = cases[t][0], c = cases[t][1], h = cases[t][2], w = cases[t][3];
        const int64_t nx = (int64_t)n * c * h * w, no = 4 * nx;
        float *xf, *ref = xmalloc((size_t)no * 4), *nref = xmalloc((size_t)nx * 4);
        float *ngot = xmalloc((size_t)nx * 4);
        uint16_t *x = bf16_rand(&r, nx, 0.0f, 1.0f, &xf);
        OK(R->upsample2x(ref, xf, n, c, h, w, NULL));
        OK(R->to_nhwc(nref, xf, n, c, h * w, NULL));
        dbuf dx = dev_bf16(x, nx, 0), dout = dbuf_make((size_t)no, 2, (size_t)cases[t][4]);
        dbuf dn = dbuf_make((size_t)nx, 4, (size_t)cases[t][4]);
        OK(G->upsample2x(dptr(&dout), dptr(&dx), n, c, h, w, S));
        OK(G->to_nhwc(dptr(&dn), dptr(&dx), n, c, h * w, S));
        int ok = 1;
        float *got = get_bf16(&dout, "upsample2x", &ok);
        ok = memcmp(got, ref, (size_t)no * 4) == 0 && ok;
        ok = dbuf_get(&dn, ngot, "to_nhwc") && memcmp(ngot, nref, (size_t)nx * 4) == 0 && ok;
        if (!ok) fail_msg("upsample2x / to_nhwc n=%d c=%d %dx%d: output differs", n, c, h, w);
        dbuf_free(&dx), dbuf_free(&dout), dbuf_free(&dn);
        free(x), free(xf), free(ref), free(nref), free(ngot), free(got);
    }
}

/* ---- attn_spatial ---- */

static double bf16_round(double v) {
    return flexdiag__bf16_to_f32(flexdiag__f32_to_bf16((float)v));
}

/* Image i of attention in double (exact = 1) or rounded like a naive bf16 implementation
 * (exact = 0: fp32 logits, P rounded to bf16, output rounded to bf16). */
static void attn_naive(double *out, const float *q, const float *k, const float *v, int32_t c,
                       int32_t hw, int exact) {
    double *p = xmalloc((size_t)hw * sizeof *p), scale = 1.0 / sqrt((double)c);
    if (!exact) scale = (float)scale;
    for (int32_t i = 0; i < hw; i++) {
        double m = -INFINITY, sum = 0;
        for (int32_t j = 0; j < hw; j++) {
            double d = 0;
            for (int32_t ch = 0; ch < c; ch++) d += (double)q[ch * hw + i] * k[ch * hw + j];
            p[j] = exact ? d * scale : (double)(float)((float)d * (float)scale);
            m = p[j] > m ? p[j] : m;
        }
        for (int32_t j = 0; j < hw; j++) sum += (p[j] = exp(p[j] - m));
        for (int32_t j = 0; j < hw; j++) p[j] = exact ? p[j] / sum : bf16_round(p[j] / sum);
        for (int32_t ch = 0; ch < c; ch++) {
            double o = 0;
            for (int32_t j = 0; j < hw; j++) o += p[j] * v[ch * hw + j];
            out[ch * hw + i] = exact ? o : bf16_round(o);
        }
    }
    free(p);
}

static int attn_one(tu_rng *r, int32_t n, int32_t c, int32_t hw, float qscale) {
    const int64_t nx = (int64_t)n * c * hw;
    float *qf, *kf, *vf, *ref = xmalloc((size_t)nx * 4);
    uint16_t *q = bf16_rand(r, nx, 0.0f, qscale, &qf), *k = bf16_rand(r, nx, 0.0f, 1.0f, &kf);
    uint16_t *v = bf16_rand(r, nx, 0.0f, 1.0f, &vf);
    OK(R->attn_spatial(ref, qf, kf, vf, n, c, hw, NULL));
    dbuf dq = dev_bf16(q, nx, 0), dk = dev_bf16(k, nx, 0), dv = dev_bf16(v, nx, 0);
    dbuf dout = dbuf_make((size_t)nx, 2, (size_t)(hw % 2));
    OK(G->attn_spatial(dptr(&dout), dptr(&dq), dptr(&dk), dptr(&dv), n, c, hw, S));
    char label[96];
    snprintf(label, sizeof label, "attn_spatial n=%d c=%d hw=%d qscale=%g", n, c, hw, qscale);
    int ok = 1;
    float *got = get_bf16(&dout, label, &ok);
    ok = tu_allclose(label, got, ref, nx, BF16_ATOL, BF16_RTOL, BF16_NMSE) && ok;
    /* flash-attention's rule on image 0 */
    const int64_t img = (int64_t)c * hw;
    double *ex = xmalloc((size_t)img * sizeof *ex), *nv = xmalloc((size_t)img * sizeof *nv);
    attn_naive(ex, qf, kf, vf, c, hw, 1);
    attn_naive(nv, qf, kf, vf, c, hw, 0);
    double e_gpu = 0, e_naive = 0;
    for (int64_t i = 0; i < img; i++) {
        e_gpu = fmax(e_gpu, fabs(got[i] - ex[i]));
        e_naive = fmax(e_naive, fabs(nv[i] - ex[i]));
    }
    if (e_gpu > 2 * e_naive + 1e-6) {
        fprintf(stderr, "%s: max error vs fp64 %.3g > 2 x naive bf16 %.3g\n", label, e_gpu,
                e_naive);
        ok = 0;
    }
    if (!ok) fprintf(stderr, "FAILED: %s\n", label);
    dbuf_free(&dq), dbuf_free(&dk), dbuf_free(&dv), dbuf_free(&dout);
    free(q), free(k), free(v), free(qf), free(kf), free(vf), free(ref), free(got), free(ex);
    free(nv);
    return ok;
}

static void test_attn(void **state) {
    (void)state;
    static const struct {
        int32_t n, c, hw;
        float qscale; /* larger q: peakier softmax */
    } cases[] = {
        {1, 32, 9, 1.0f},  {3, 64, 15, 1.0f}, {3, 96, 64, 2.0f}, {1, 32, 576, 1.0f},
        {2, 512, 576, 0.5f}, /* VQ-16's attention level */
        {1, 32, 2500, 1.0f}, /* scores larger than the workspace: query-row chunks */
    };
    tu_rng r;
    tu_rng_seed(&r, 5);
    int fails = 0;
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++)
        fails += !attn_one(&r, cases[t].n, cases[t].c, cases[t].hw, cases[t].qscale);
    assert_int_equal(fails, 0);
}

/* ---- whole decoder ---- */

static char *fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "golden/data/janus/%s", name);
    return tu_data_path(rel);
}

static void test_golden_decode(void **state) {
    (void)state;
    char *dir = fixture(""), *tpath = fixture("vq_tokens.npy"), *ppath = fixture("vq_pixels.npy");
    char *mpath = fixture("model.safetensors");
    if (access(tpath, R_OK) || access(ppath, R_OK) || access(mpath, R_OK)) {
        fprintf(stderr, "golden VQ fixture missing under %s (tools/golden/make_fixtures.py): "
                        "end-to-end check skipped\n", dir);
        free(dir), free(tpath), free(ppath), free(mpath);
        return;
    }
    flexdiag_npy tok, ref;
    OK(flexdiag__npy_read(tpath, &tok));
    OK(flexdiag__npy_read(ppath, &ref));
    assert_int_equal(tok.dtype, FLEXDIAG_DTYPE_I64);
    assert_int_equal(tok.ndim, 2);
    flexdiag_vq *vq = NULL;
    OK(flexdiag__vq_load(G, S, dir, tok.shape[0], &vq));
    int32_t *ids = xmalloc((size_t)tok.numel * 4);
    for (int64_t i = 0; i < tok.numel; i++) ids[i] = (int32_t)((const int64_t *)tok.data)[i];
    float *px = xmalloc((size_t)ref.numel * 4);
    OK(flexdiag__vq_decode(vq, S, ids, tok.shape[0], px));
    const double err = tu_rel_l2(px, ref.data, ref.numel);
    printf("CUDA VQ decode vs transformers: relative L2 %.3g over %lld values (limit 2e-2)\n",
           err, (long long)ref.numel);
    assert_true(err <= 2e-2);
    flexdiag__vq_destroy(vq);
    flexdiag__npy_free(&tok);
    flexdiag__npy_free(&ref);
    free(ids), free(px), free(dir), free(tpath), free(ppath), free(mpath);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Full VQ-16 with random weights: 16 images, per pass batch 4 (the runtime's) and 16. */
static void test_timing(void **state) {
    (void)state;
    flexdiag_vq_config cfg;
    flexdiag__vq_config_default(&cfg);
    int32_t h, w;
    flexdiag__vq_image_size(&cfg, &h, &w);
    const int64_t n = 16, hw = (int64_t)cfg.grid_h * cfg.grid_w, npx = n * h * w * 3;
    int32_t *ids = xmalloc((size_t)(n * hw) * 4);
    float *px = xmalloc((size_t)npx * 4);
    tu_rng r;
    tu_rng_seed(&r, 6);
    for (int64_t i = 0; i < n * hw; i++) ids[i] = (int32_t)tu_rng_int(&r, 0, cfg.codebook_size - 1);
    static const int64_t batches[] = {4, 16};
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        flexdiag_vq *vq = NULL;
        OK(flexdiag__vq_create_random(G, S, &cfg, 7, batches[b], &vq));
        OK(flexdiag__vq_decode(vq, S, ids, batches[b], px)); /* warm-up: cuBLAS heuristics */
        double best = INFINITY;
        for (int rep = 0; rep < 3; rep++) {
            const double t0 = now_s();
            OK(flexdiag__vq_decode(vq, S, ids, n, px));
            best = fmin(best, now_s() - t0);
        }
        int finite = 1;
        for (int64_t i = 0; i < npx; i++) finite = finite && isfinite(px[i]);
        printf("VQ-16 decode on CUDA, %dx%d, %lld images, batch %lld: %.2f ms per image "
               "(%.1f ms total, best of 3)\n",
               h, w, (long long)n, (long long)batches[b], 1e3 * best / (double)n, 1e3 * best);
        assert_true(finite);
        flexdiag__vq_destroy(vq);
    }
    free(ids), free(px);
}

int main(void) {
    int skip = tu_cuda_stream("test_vq_cuda", &S);
    if (skip) return skip;
    G = flexdiag__kernels_cuda();
    R = flexdiag__kernels_cpu_ref();
    gpu_buf_use(G, S);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup),    cmocka_unit_test(test_conv),
        cmocka_unit_test(test_conv_errors), cmocka_unit_test(test_groupnorm),
        cmocka_unit_test(test_upsample_nhwc), cmocka_unit_test(test_attn),
        cmocka_unit_test(test_golden_decode), cmocka_unit_test(test_timing),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    G->stream_destroy(S);
    return rc;
}
