/*
 * ref_vq.c - scalar CPU reference of the image-decoder ops (VQ-16, docs/architecture.md §4.4):
 * codebook lookup, direct convolution, GroupNorm (+ swish), nearest ×2 upsampling, single-head
 * spatial attention and the NCHW -> NHWC pixel transpose. Activations are fp32, weights bf16
 * widened on the fly; these are the oracle for the CUDA versions.
 *
 * Written for obviousness first, but with loop orders that stream contiguous memory so the
 * compiler vectorises the inner loops: conv2d builds each output row of each (image, out
 * channel) plane by adding weight × shifted input row for every (in channel, ky, kx) — no im2col
 * buffer, exact zero padding by skipping rows and clipping column ranges. That runs at about
 * 2 GFLOP/s per core; a full 384×384 Janus decode is ≈ 570 GFLOP, minutes per image on one core,
 * so unit tests use tiny shapes and real decodes run on CUDA.
 *
 * Sums follow the reference models' precision: conv and attention logits accumulate in fp32,
 * GroupNorm statistics and the softmax normaliser in double (cheap, and removes the only
 * cancellation-prone sums). The reference ops ignore the stream and run on the caller's thread.
 *
 * The "cpu" table adds two parallel variants on the stream's thread pool, for the two ops that
 * carry the work: conv2d over (image, output channel) planes and attn_spatial over (image,
 * query) columns. Each task computes its outputs with exactly the reference code, so results are
 * bit-identical to the reference for any thread count.
 */
#include "kernels/cpu/ref_vq.h"

#include <math.h>
#include <stdlib.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"

/* ---- helpers ---- */

static int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }
static int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }

static flexdiag_status bad_shape(const char *op, const char *what) {
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: %s", op, what);
}

/* ---- vq_lookup ---- */

flexdiag_status flexdiag__cpu_ref_vq_lookup(void *out, const float *codebook, const int32_t *ids,
                                            int64_t n, int32_t c, int32_t hw, flexdiag_stream *s) {
    (void)s;
    if (n < 0 || c <= 0 || hw <= 0) return bad_shape("vq_lookup", "n >= 0, c > 0, hw > 0 needed");
    float *o = out;
    for (int64_t i = 0; i < n; i++)
        for (int32_t j = 0; j < hw; j++) {
            const float *row = codebook + (int64_t)ids[i * hw + j] * c;
            for (int32_t ch = 0; ch < c; ch++) o[(i * c + ch) * hw + j] = row[ch];
        }
    return FLEXDIAG_OK;
}

/* ---- conv2d ---- */

/* orow (wd) += w · xrow shifted by dx, columns clipped to stay inside the row. */
FLEXDIAG_CPU_INLINE void conv_tap(float *restrict orow, const float *restrict xrow, float w,
                              int32_t wd, int32_t dx) {
    int32_t x0 = imax(0, -dx), x1 = imin(wd, wd - dx);
    for (int32_t c = x0; c < x1; c++) orow[c] += w * xrow[c + dx];
}

/* One output plane, row by row so the row being summed stays in L1:
 * o[y] (+)= b + Σ_ci Σ_ky Σ_kx w[ci][ky][kx] · x[ci][y + ky - pad] shifted by kx - pad,
 * summed in that order for every element (rows outside the image are the zero padding). */
FLEXDIAG_CPU_INLINE void conv_plane(float *restrict o, const float *restrict x, const uint16_t *w,
                                    float b, int32_t cin, int32_t h, int32_t wd, int32_t k,
                                    int accum) {
    int64_t plane = (int64_t)h * wd;
    int32_t pad = (k - 1) / 2;
    for (int32_t y = 0; y < h; y++) {
        float *orow = o + (int64_t)y * wd;
        for (int32_t c = 0; c < wd; c++) orow[c] = accum ? orow[c] + b : b;
        for (int32_t ci = 0; ci < cin; ci++)
            for (int32_t ky = 0; ky < k; ky++) {
                int32_t sy = y + ky - pad;
                if (sy < 0 || sy >= h) continue;
                const float *xrow = x + ci * plane + (int64_t)sy * wd;
                const uint16_t *wr = w + ((int64_t)ci * k + ky) * k;
                for (int32_t kx = 0; kx < k; kx++)
                    conv_tap(orow, xrow, flexdiag__bf16_to_f32(wr[kx]), wd, kx - pad);
            }
    }
}

/* Arguments of one conv2d call, shared by the serial and the parallel version. */
typedef struct conv_job {
    float *out;
    const float *x;
    const uint16_t *w, *b;
    int32_t cin, cout, h, wd, k;
    int accum;
} conv_job;

/* Task t = output plane (image t / cout, channel t % cout); also compiled for AVX2 (cpu_ops.h
 * FLEXDIAG_CPU_CLONES: the same bits). */
FLEXDIAG_CPU_CLONES static void conv_task(void *ctx, int64_t t, void *scratch) {
    (void)scratch;
    const conv_job *j = ctx;
    int64_t plane = (int64_t)j->h * j->wd, i = t / j->cout;
    int32_t co = (int32_t)(t % j->cout);
    float bv = j->b ? flexdiag__bf16_to_f32(j->b[co]) : 0.0f;
    const uint16_t *w = j->w + (int64_t)co * j->cin * j->k * j->k;
    conv_plane(j->out + t * plane, j->x + i * j->cin * plane, w, bv, j->cin, j->h, j->wd, j->k,
               j->accum);
}

static flexdiag_status conv_check(int64_t n, int32_t cin, int32_t cout, int32_t h, int32_t wd,
                                  int32_t k, unsigned flags) {
    if (n < 0 || cin <= 0 || cout <= 0 || h <= 0 || wd <= 0)
        return bad_shape("conv2d", "n >= 0 and positive cin, cout, h, w needed");
    if (k <= 0 || k % 2 == 0) return bad_shape("conv2d", "kernel size must be odd");
    if (flags & ~FLEXDIAG_MM_ACCUM) return bad_shape("conv2d", "only FLEXDIAG_MM_ACCUM allowed");
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_conv2d(void *out, const void *x, const uint16_t *w,
                                         const uint16_t *b, int64_t n, int32_t cin, int32_t cout,
                                         int32_t h, int32_t wd, int32_t k, unsigned flags,
                                         flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(conv_check(n, cin, cout, h, wd, k, flags));
    conv_job j = {out, x, w, b, cin, cout, h, wd, k, (flags & FLEXDIAG_MM_ACCUM) != 0};
    for (int64_t t = 0; t < n * cout; t++) conv_task(&j, t, NULL);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_fast_conv2d(void *out, const void *x, const uint16_t *w,
                                          const uint16_t *b, int64_t n, int32_t cin, int32_t cout,
                                          int32_t h, int32_t wd, int32_t k, unsigned flags,
                                          flexdiag_stream *s) {
    FLEXDIAG_TRY(conv_check(n, cin, cout, h, wd, k, flags));
    conv_job j = {out, x, w, b, cin, cout, h, wd, k, (flags & FLEXDIAG_MM_ACCUM) != 0};
    return flexdiag__cpu_parallel_for(s, n * cout, 0, conv_task, &j);
}

/* ---- groupnorm ---- */

/* Two-pass mean and biased variance of len floats, in double. */
static void group_stats(const float *x, int64_t len, double *mean, double *var) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < len; i++) sum += x[i];
    double m = sum / (double)len;
    for (int64_t i = 0; i < len; i++) sq += ((double)x[i] - m) * ((double)x[i] - m);
    *mean = m;
    *var = sq / (double)len;
}

flexdiag_status flexdiag__cpu_ref_groupnorm(void *out, const void *x, const uint16_t *gamma,
                                            const uint16_t *beta, int64_t n, int32_t c, int32_t hw,
                                            int32_t groups, float eps, int32_t swish,
                                            flexdiag_stream *s) {
    (void)s;
    if (n < 0 || c <= 0 || hw <= 0 || groups <= 0 || c % groups)
        return bad_shape("groupnorm", "positive c, hw, groups with c % groups == 0 needed");
    int32_t cg = c / groups;
    float *o = out;
    const float *xi = x;
    for (int64_t i = 0; i < n; i++)
        for (int32_t g = 0; g < groups; g++) {
            int64_t base = (i * c + (int64_t)g * cg) * hw;
            double mean, var;
            group_stats(xi + base, (int64_t)cg * hw, &mean, &var);
            double rstd = 1.0 / sqrt(var + (double)eps);
            for (int32_t ch = 0; ch < cg; ch++) {
                int32_t cc = g * cg + ch;
                float gm = flexdiag__bf16_to_f32(gamma[cc]), bt = flexdiag__bf16_to_f32(beta[cc]);
                const float *xr = xi + base + (int64_t)ch * hw;
                float *orow = o + base + (int64_t)ch * hw;
                for (int32_t j = 0; j < hw; j++) {
                    float y = (float)(((double)xr[j] - mean) * rstd) * gm + bt;
                    orow[j] = swish ? y * (1.0f / (1.0f + expf(-y))) : y;
                }
            }
        }
    return FLEXDIAG_OK;
}

/* ---- upsample2x ---- */

flexdiag_status flexdiag__cpu_ref_upsample2x(void *out, const void *x, int64_t n, int32_t c,
                                             int32_t h, int32_t wd, flexdiag_stream *s) {
    (void)s;
    if (n < 0 || c <= 0 || h <= 0 || wd <= 0)
        return bad_shape("upsample2x", "n >= 0 and positive c, h, w needed");
    float *o = out;
    const float *xi = x;
    int64_t planes = n * c, ow = 2 * (int64_t)wd;
    for (int64_t p = 0; p < planes; p++) {
        const float *src = xi + p * h * wd;
        float *dst = o + p * 4 * h * wd;
        for (int32_t y = 0; y < 2 * h; y++) {
            const float *srow = src + (int64_t)(y / 2) * wd;
            float *drow = dst + y * ow;
            for (int64_t c2 = 0; c2 < ow; c2++) drow[c2] = srow[c2 / 2];
        }
    }
    return FLEXDIAG_OK;
}

/* ---- attn_spatial ---- */

/* Output column i of one image: logits over keys, fp32 softmax, weighted sum of values. */
static void attn_query(float *o, const float *q, const float *k, const float *v, int32_t c,
                       int32_t hw, int32_t i, float scale, float *p) {
    for (int32_t j = 0; j < hw; j++) p[j] = 0.0f;
    for (int32_t ch = 0; ch < c; ch++) {
        float qi = q[(int64_t)ch * hw + i];
        const float *krow = k + (int64_t)ch * hw;
        for (int32_t j = 0; j < hw; j++) p[j] += qi * krow[j];
    }
    float m = -INFINITY;
    for (int32_t j = 0; j < hw; j++) {
        p[j] *= scale;
        m = p[j] > m ? p[j] : m;
    }
    double sum = 0;
    for (int32_t j = 0; j < hw; j++) {
        p[j] = expf(p[j] - m);
        sum += p[j];
    }
    float inv = (float)(1.0 / sum);
    for (int32_t j = 0; j < hw; j++) p[j] *= inv;
    for (int32_t ch = 0; ch < c; ch++) {
        const float *vrow = v + (int64_t)ch * hw;
        float acc = 0.0f;
        for (int32_t j = 0; j < hw; j++) acc += p[j] * vrow[j];
        o[(int64_t)ch * hw + i] = acc;
    }
}

/* Arguments of one attn_spatial call; task t = query column t % hw of image t / hw. */
typedef struct attn_job {
    float *out;
    const float *q, *k, *v;
    int32_t c, hw;
    float scale;
} attn_job;

static void attn_task(void *ctx, int64_t t, void *scratch) {
    const attn_job *j = ctx;
    int64_t img = (int64_t)j->c * j->hw, i = t / j->hw;
    attn_query(j->out + i * img, j->q + i * img, j->k + i * img, j->v + i * img, j->c, j->hw,
               (int32_t)(t % j->hw), j->scale, scratch);
}

/* The scale rounds to fp32, as the Python scalar c**-0.5 does when it multiplies fp32. */
static attn_job attn_setup(void *out, const void *q, const void *k, const void *v, int32_t c,
                           int32_t hw) {
    attn_job j = {out, q, k, v, c, hw, (float)(1.0 / sqrt((double)c))};
    return j;
}

flexdiag_status flexdiag__cpu_ref_attn_spatial(void *out, const void *q, const void *k,
                                               const void *v, int64_t n, int32_t c, int32_t hw,
                                               flexdiag_stream *s) {
    (void)s;
    if (n < 0 || c <= 0 || hw <= 0) return bad_shape("attn_spatial", "positive c, hw needed");
    float *p = malloc((size_t)hw * sizeof *p);
    if (!p)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "attn_spatial: no memory for %d logits", hw);
    attn_job j = attn_setup(out, q, k, v, c, hw);
    for (int64_t t = 0; t < n * hw; t++) attn_task(&j, t, p);
    free(p);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_fast_attn_spatial(void *out, const void *q, const void *k,
                                                const void *v, int64_t n, int32_t c, int32_t hw,
                                                flexdiag_stream *s) {
    if (n < 0 || c <= 0 || hw <= 0) return bad_shape("attn_spatial", "positive c, hw needed");
    attn_job j = attn_setup(out, q, k, v, c, hw);
    return flexdiag__cpu_parallel_for(s, n * hw, (size_t)hw * sizeof(float), attn_task, &j);
}

/* ---- to_nhwc ---- */

flexdiag_status flexdiag__cpu_ref_to_nhwc(float *out, const void *x, int64_t n, int32_t c,
                                          int32_t hw, flexdiag_stream *s) {
    (void)s;
    if (n < 0 || c <= 0 || hw <= 0) return bad_shape("to_nhwc", "positive c, hw needed");
    const float *xi = x;
    for (int64_t i = 0; i < n; i++)
        for (int32_t ch = 0; ch < c; ch++)
            for (int32_t j = 0; j < hw; j++) out[(i * hw + j) * c + ch] = xi[(i * c + ch) * hw + j];
    return FLEXDIAG_OK;
}
