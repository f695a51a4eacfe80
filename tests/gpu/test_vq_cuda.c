/*
 * test_vq_cuda.c - the CUDA image-decoder ops (vq_lookup, conv2d, groupnorm, upsample2x,
 * attn_spatial, to_nhwc) against the scalar CPU reference flexdiag__kernels_cpu_ref(), then the
 * whole VQ-16 decoder on CUDA (docs/architecture.md §10.2):
 *   - activations are fp32 on both backends (kernels.h); weights bf16, as in the decoder;
 *   - data movement (lookup, upsample, transpose) is exact; groupnorm and attn_spatial use fp32
 *     tolerances; conv2d rounds its input to bf16 for the tensor cores, so its reference gets x
 *     already rounded while the GPU gets the raw x: a correct op then differs only by fp32
 *     summation order (see CONV_ATOL); attn_spatial also meets flash-attention's rule in fp32
 *     against an fp64 reference (error ≤ 2x that of the scalar fp32 reference, see ATTN_FLOOR);
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

#include "base/core.h"
#include "kernels/kernels.h"
#include "cli/npy.h"
#include "gpu_buf.h"
#include "util.h"
#include "runtime/image/vq.h"


/* docs/architecture.md §10.2 default for fp32 outputs. */
#define F32_NMSE 1e-7
/* conv2d: every product of a bf16-rounded x and a bf16 weight is exact in fp32 (8 + 8
 * significant bits) and the bias enters as b·1, so GPU and reference differ only in the order
 * the cin·k² + 1 ≤ 2305 terms are summed in fp32. With x ~ N(0, 1), w ~ N(0, 1/(cin·k²)) and
 * bias and ACCUM input O(1), partial sums stay below ~6 (ulp ≤ 4.8e-7): as a random walk each
 * side is off by ≈ sqrt(2305)·ulp/2 ≈ 1e-5, and a CPU emulation of a pessimistic tensor-core
 * model (16-term steps truncated into the accumulator) stays ≤ 2.1e-5 on these shapes. 1e-4
 * both ways leaves ≥ 5x margin, while a bf16 rounding of the output or of an accumulation
 * (≈ 2^-9 relative) still fails. */
#define CONV_ATOL 1e-4
#define CONV_RTOL 1e-4
/* groupnorm: fp32 slice sums merged in double vs all-double statistics in the reference put
 * ≈ |mean|·2^-24·sqrt(terms summed per thread) on the mean, and the fp32 affine and swish
 * (device expf ≤ 2 ulp) a few ulps more: an emulation of the slices, the merge and the affine
 * gives ≤ 1.5e-6 on these cases (mean 4 the worst), so 1e-5 both ways leaves ≥ 20x margin. */
#define GN_ATOL 1e-5
#define GN_RTOL 1e-5
/* attn_spatial vs the scalar reference: fp32 logits over c ≤ 512 terms and an fp32 output sum
 * over hw ≤ 3000 terms in another order (emulated: ≤ 1.6e-6 on outputs of size ≤ 2.2); atol
 * covers outputs near 0 (averages over many keys shrink like hw^-1/2). */
#define ATTN_ATOL 1e-5
#define ATTN_RTOL 1e-4
/* Floor of the flash-attention rule: absolute error vs fp64 the rule always accepts (≈ 8 fp32
 * ulps of an O(1) output), so a reference that happens to round luckily on a small case does
 * not make the rule flaky. */
#define ATTN_FLOOR 1e-6

static const flexdiag_kernels *G; /* CUDA table under test */
static const flexdiag_kernels *R; /* scalar reference (fp32 act) */
static flexdiag_stream *S;        /* CUDA stream */

/* ---- host data ---- */

/* n fp32 values N(mean, scale²) (malloc'ed). */
static float *f32_rand(tu_rng *r, int64_t n, float mean, float scale) {
    float *x = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = mean + scale * (float)tu_rng_normal(r);
    return x;
}

/* n bf16 values N(mean, scale²) (weights, malloc'ed). */
static uint16_t *bf16_rand(tu_rng *r, int64_t n, float mean, float scale) {
    uint16_t *x = xmalloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        x[i] = flexdiag__f32_to_bf16(mean + scale * (float)tu_rng_normal(r));
    return x;
}

/* A host array of n elements of elem bytes as a new guarded device buffer. */
static dbuf dev_put(const void *x, int64_t n, size_t elem, size_t off) {
    dbuf b = dbuf_make((size_t)n, elem, off);
    dbuf_put(&b, x);
    return b;
}

/* Download an fp32 device output (guards checked into *ok). */
static float *get_f32(const dbuf *b, const char *label, int *ok) {
    float *f = xmalloc(b->n * 4);
    *ok = dbuf_get(b, f, label) && *ok;
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
        dbuf dout = dbuf_make((size_t)(n * c * hw), 4, t);
        dbuf_put(&dcb, cb);
        dbuf_put(&did, ids);
        OK(G->vq_lookup(dptr(&dout), dptr(&dcb), dptr(&did), n, c, hw, S));
        int ok = 1;
        float *got = get_f32(&dout, "vq_lookup", &ok);
        ok = memcmp(got, ref, (size_t)(n * c * hw) * 4) == 0 && ok;
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
    float *x = f32_rand(r, nx, 0.0f, 1.0f), *xr = xmalloc((size_t)nx * 4);
    for (int64_t i = 0; i < nx; i++) xr[i] = flexdiag__bf16_to_f32(flexdiag__f32_to_bf16(x[i]));
    uint16_t *w = bf16_rand(r, nw, 0.0f, 1.0f / sqrtf((float)(cc->cin * cc->k * cc->k)));
    uint16_t *b = bf16_rand(r, cc->cout, 0.0f, 0.5f);
    float *ref = f32_rand(r, no, 0.0f, 1.0f); /* the ACCUM input, then the reference output */
    const unsigned flags = cc->accum ? FLEXDIAG_MM_ACCUM : 0u;
    dbuf dx = dev_put(x, nx, 4, 0), dw = dev_put(w, nw, 2, 0), db = dev_put(b, cc->cout, 2, 0);
    dbuf dout = dbuf_make((size_t)no, 4, off);
    if (cc->accum) dbuf_put(&dout, ref);
    OK(R->conv2d(ref, xr, w, cc->bias ? b : NULL, cc->n, cc->cin, cc->cout, cc->h, cc->w, cc->k,
                 flags, NULL));
    OK(G->conv2d(dptr(&dout), dptr(&dx), dptr(&dw), cc->bias ? dptr(&db) : NULL, cc->n, cc->cin,
                 cc->cout, cc->h, cc->w, cc->k, flags, S));
    char label[128];
    snprintf(label, sizeof label, "conv2d n=%d cin=%d cout=%d %dx%d k=%d bias=%d accum=%d off=%zu",
             cc->n, cc->cin, cc->cout, cc->h, cc->w, cc->k, cc->bias, cc->accum, off);
    int ok = 1;
    float *got = get_f32(&dout, label, &ok);
    ok = tu_allclose(label, got, ref, no, CONV_ATOL, CONV_RTOL, F32_NMSE) && ok;
    if (!ok) fprintf(stderr, "FAILED: %s\n", label);
    dbuf_free(&dx), dbuf_free(&dw), dbuf_free(&db), dbuf_free(&dout);
    free(x), free(xr), free(w), free(b), free(ref), free(got);
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
        float *x = f32_rand(&r, nx, cases[t].mean, 1.0f), *ref = xmalloc((size_t)nx * 4);
        uint16_t *g = bf16_rand(&r, cases[t].c, 1.0f, 0.2f);
        uint16_t *b = bf16_rand(&r, cases[t].c, 0.0f, 0.2f);
        OK(R->groupnorm(ref, x, g, b, cases[t].n, cases[t].c, cases[t].hw, cases[t].groups,
                        1e-6f, cases[t].swish, NULL));
        dbuf dx = dev_put(x, nx, 4, t % 2), dg = dev_put(g, cases[t].c, 2, 0);
        dbuf db = dev_put(b, cases[t].c, 2, 0), dout = dbuf_make((size_t)nx, 4, t % 2);
        OK(G->groupnorm(dptr(&dout), dptr(&dx), dptr(&dg), dptr(&db), cases[t].n, cases[t].c,
                        cases[t].hw, cases[t].groups, 1e-6f, cases[t].swish, S));
        char label[96];
        snprintf(label, sizeof label, "groupnorm n=%d c=%d hw=%d groups=%d swish=%d",
                 cases[t].n, cases[t].c, cases[t].hw, cases[t].groups, cases[t].swish);
        int ok = 1;
        float *got = get_f32(&dout, label, &ok);
        ok = tu_allclose(label, got, ref, nx, GN_ATOL, GN_RTOL, F32_NMSE) && ok;
        fails += !ok;
        dbuf_free(&dx), dbuf_free(&dg), dbuf_free(&db), dbuf_free(&dout);
        free(x), free(g), free(b), free(ref), free(got);
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
        float *x = f32_rand(&r, nx, 0.0f, 1.0f), *ref = xmalloc((size_t)no * 4);
        float *nref = xmalloc((size_t)nx * 4), *ngot = xmalloc((size_t)nx * 4);
        OK(R->upsample2x(ref, x, n, c, h, w, NULL));
        OK(R->to_nhwc(nref, x, n, c, h * w, NULL));
        dbuf dx = dev_put(x, nx, 4, 0), dout = dbuf_make((size_t)no, 4, (size_t)cases[t][4]);
        dbuf dn = dbuf_make((size_t)nx, 4, (size_t)cases[t][4]);
        OK(G->upsample2x(dptr(&dout), dptr(&dx), n, c, h, w, S));
        OK(G->to_nhwc(dptr(&dn), dptr(&dx), n, c, h * w, S));
        int ok = 1;
        float *got = get_f32(&dout, "upsample2x", &ok);
        ok = memcmp(got, ref, (size_t)no * 4) == 0 && ok;
        ok = dbuf_get(&dn, ngot, "to_nhwc") && memcmp(ngot, nref, (size_t)nx * 4) == 0 && ok;
        if (!ok) fail_msg("upsample2x / to_nhwc n=%d c=%d %dx%d: output differs", n, c, h, w);
        dbuf_free(&dx), dbuf_free(&dout), dbuf_free(&dn);
        free(x), free(ref), free(nref), free(ngot), free(got);
    }
}

/* ---- attn_spatial ---- */

/* Image 0 of attention in double: out (c, hw). */
static void attn_exact(double *out, const float *q, const float *k, const float *v, int32_t c,
                       int32_t hw) {
    double *p = xmalloc((size_t)hw * sizeof *p), scale = 1.0 / sqrt((double)c);
    for (int32_t i = 0; i < hw; i++) {
        double m = -INFINITY, sum = 0;
        for (int32_t j = 0; j < hw; j++) {
            double d = 0;
            for (int32_t ch = 0; ch < c; ch++) d += (double)q[ch * hw + i] * k[ch * hw + j];
            p[j] = d * scale;
            m = p[j] > m ? p[j] : m;
        }
        for (int32_t j = 0; j < hw; j++) sum += (p[j] = exp(p[j] - m));
        for (int32_t ch = 0; ch < c; ch++) {
            double o = 0;
            for (int32_t j = 0; j < hw; j++) o += p[j] / sum * v[ch * hw + j];
            out[ch * hw + i] = o;
        }
    }
    free(p);
}

/* flash-attention's rule with fp32 as the working precision, on image 0: the GPU's max error
 * vs fp64 is at most twice the scalar fp32 reference's (plus ATTN_FLOOR). */
static int attn_rule(const char *label, const float *got, const float *ref, const float *q,
                     const float *k, const float *v, int32_t c, int32_t hw) {
    const int64_t img = (int64_t)c * hw;
    double *ex = xmalloc((size_t)img * sizeof *ex), e_gpu = 0, e_ref = 0;
    attn_exact(ex, q, k, v, c, hw);
    for (int64_t i = 0; i < img; i++) {
        e_gpu = fmax(e_gpu, fabs(got[i] - ex[i]));
        e_ref = fmax(e_ref, fabs(ref[i] - ex[i]));
    }
    free(ex);
    if (e_gpu <= 2 * e_ref + ATTN_FLOOR) return 1;
    fprintf(stderr, "%s: max error vs fp64 %.3g > 2 x the fp32 reference's %.3g + %g\n", label,
            e_gpu, e_ref, ATTN_FLOOR);
    return 0;
}

static int attn_one(tu_rng *r, int32_t n, int32_t c, int32_t hw, float qscale) {
    const int64_t nx = (int64_t)n * c * hw;
    float *q = f32_rand(r, nx, 0.0f, qscale), *k = f32_rand(r, nx, 0.0f, 1.0f);
    float *v = f32_rand(r, nx, 0.0f, 1.0f), *ref = xmalloc((size_t)nx * 4);
    OK(R->attn_spatial(ref, q, k, v, n, c, hw, NULL));
    dbuf dq = dev_put(q, nx, 4, 0), dk = dev_put(k, nx, 4, 0), dv = dev_put(v, nx, 4, 0);
    dbuf dout = dbuf_make((size_t)nx, 4, (size_t)(hw % 2));
    OK(G->attn_spatial(dptr(&dout), dptr(&dq), dptr(&dk), dptr(&dv), n, c, hw, S));
    char label[96];
    snprintf(label, sizeof label, "attn_spatial n=%d c=%d hw=%d qscale=%g", n, c, hw, qscale);
    int ok = 1;
    float *got = get_f32(&dout, label, &ok);
    ok = tu_allclose(label, got, ref, nx, ATTN_ATOL, ATTN_RTOL, F32_NMSE) && ok;
    ok = attn_rule(label, got, ref, q, k, v, c, hw) && ok;
    if (!ok) fprintf(stderr, "FAILED: %s\n", label);
    dbuf_free(&dq), dbuf_free(&dk), dbuf_free(&dv), dbuf_free(&dout);
    free(q), free(k), free(v), free(ref), free(got);
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
        {1, 32, 3000, 1.0f}, /* 36 MB of scores > the workspace head: query-row chunks */
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

/* The taming / Chameleon VQGAN fixture (tools/golden/make_vqgan.py: 4 x 4 grid, GroupNorm 8)
 * decoded on CUDA against the PyTorch reference. */
static void test_vqgan_decode(void **state) {
    (void)state;
    char *cpath = tu_data_path("image/data/vqgan/codes.npy");
    char *ppath = tu_data_path("image/data/vqgan/pixels.npy");
    char *wpath = tu_data_path("image/data/vqgan/vqgan.safetensors");
    if (access(cpath, R_OK) || access(ppath, R_OK) || access(wpath, R_OK)) {
        fprintf(stderr, "VQGAN fixture missing (tools/golden/make_vqgan.py): check skipped\n");
        free(cpath), free(ppath), free(wpath);
        return;
    }
    flexdiag_npy codes, ref;
    OK(flexdiag__npy_read(cpath, &codes));
    OK(flexdiag__npy_read(ppath, &ref));
    flexdiag_vq *vq = NULL;
    OK(flexdiag__vq_open_vqgan(G, S, wpath, 4, 4, 8, codes.shape[0], &vq));
    int32_t *ids = xmalloc((size_t)codes.numel * 4);
    for (int64_t i = 0; i < codes.numel; i++) ids[i] = (int32_t)((const int64_t *)codes.data)[i];
    float *px = xmalloc((size_t)ref.numel * 4);
    OK(flexdiag__vq_decode(vq, S, ids, codes.shape[0], px));
    const double err = tu_rel_l2(px, ref.data, ref.numel);
    printf("CUDA VQGAN decode vs PyTorch: relative L2 %.3g over %lld values (limit 2e-2)\n", err,
           (long long)ref.numel);
    assert_true(err <= 2e-2);
    flexdiag__vq_destroy(vq);
    flexdiag__npy_free(&codes);
    flexdiag__npy_free(&ref);
    free(ids), free(px), free(cpath), free(ppath), free(wpath);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Full VQ-16 with random weights: 16 images, per pass batch 2 (the runtime's) and 16. */
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
    static const int64_t batches[] = {2, 16};
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
        cmocka_unit_test(test_golden_decode), cmocka_unit_test(test_vqgan_decode),
        cmocka_unit_test(test_timing),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    G->stream_destroy(S);
    return rc;
}
