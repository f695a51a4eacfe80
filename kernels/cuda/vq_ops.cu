/*
 * vq_ops.cu - the image decoder's ops other than conv2d (kernels.h, "image decoder"): codebook
 * lookup, GroupNorm (+ swish), nearest ×2 upsampling, single-head spatial attention and the
 * NCHW -> NHWC pixel transpose. Activations fp32 (NCHW) on every backend, weights bf16, codebook
 * fp32, fp32 math: nothing here rounds to bf16 (only conv2d's tensor-core input does).
 *
 * GroupNorm: a group of one image is cg·hw contiguous elements (cg = c / groups adjacent
 * planes). At 384² one group is ~600k elements, so one CTA per group would leave most SMs idle;
 * instead each group is cut into slices, one CTA per slice computes the slice's mean and sum of
 * squared deviations (two passes, the second from L1/L2), a tiny kernel merges the slices in
 * double (Chan's formula: exact for any split, no E[x²] - mean² cancellation) into (mean, rstd),
 * and an elementwise kernel applies the affine and the swish with 16-byte (float4) accesses when
 * rows allow. Partials and statistics live at the head of the stream workspace.
 *
 * attn_spatial: scores S = kᵀ-major GEMM (fp32 in and out, scale as alpha) -> a warp-per-row
 * softmax in fp32 that overwrites S with the probabilities P -> out = v · Pᵀ (fp32 GEMM). Both
 * GEMMs take CUBLAS_COMPUTE_32F on fp32 data, which under the stream's default math mode is
 * true fp32 (no TF32). S rows are padded to a multiple of 4 keys (16-byte rows) and staged in
 * the workspace head; images (or query rows, for planes too large for one image) go in groups
 * that fit, so VQ-16's 24² level (576² scores, 1.3 MB per image) runs as one batched GEMM pair
 * for a whole pass. The cuBLAS handle is pointed at the workspace tail meanwhile
 * (flexdiag__cuda_blas_ws_tail).
 *
 * lookup, upsample and transpose are one-thread-per-element gathers (upsample reads two inputs
 * and writes 2×4 outputs per thread with 16-byte stores when the width allows).
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#include <limits.h>
#include <math.h>

/* Workspace tail kept for cuBLAS during attn_spatial (see conv2d.cu). */
#define ATTN_BLAS_WS ((size_t)4 << 20)

/* GroupNorm: aim for this many slice CTAs per SM, and no slice shorter than GN_MIN_SLICE
 * elements (below that the merge costs more than the parallelism gains). */
#define GN_CTAS_PER_SM 8
#define GN_MIN_SLICE 4096

static flexdiag_status bad_shape(const char *op, const char *need) {
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda %s: %s", op, need);
}

/* ---- vq_lookup ---- */

/* out (n, c, hw) f32: out[i][ch][j] = codebook[ids[i·hw + j]][ch] */
static __global__ void lookup_kernel(float *__restrict__ out,
                                     const float *__restrict__ codebook,
                                     const int32_t *__restrict__ ids, int64_t n, int64_t c,
                                     int64_t hw) {
    const int64_t total = n * c * hw, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const int64_t j = e % hw, ch = (e / hw) % c, i = e / (hw * c);
        out[e] = codebook[(int64_t)ids[i * hw + j] * c + ch];
    }
}

/* out (n, c, hw) f32, codebook (V, c) f32, ids (n·hw) trusted (the runtime checks them) */
extern "C" flexdiag_status flexdiag__cuda_vq_lookup(void *out, const float *codebook,
                                                    const int32_t *ids, int64_t n, int32_t c,
                                                    int32_t hw, flexdiag_stream *s) {
    if (n < 0 || c <= 0 || hw <= 0 || (n > 0 && (!out || !codebook || !ids)))
        return bad_shape("vq_lookup", "need n >= 0, c > 0, hw > 0 and device buffers");
    if (n == 0) return FLEXDIAG_OK;
    const cudaStream_t st = flexdiag__cuda_st(s);
    const int64_t total = n * c * hw;
    lookup_kernel<<<flexdiag__cuda_blocks(total, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0,
                    st>>>((float *)out, codebook, ids, n, c, hw);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* ---- groupnorm ---- */

/* Per-thread sum of (x - shift)^p over p[0..len), p = 1 or 2, strided by the CTA; 16-byte
 * (float4) loads when p is 16-byte aligned. */
static __device__ float slice_acc(const float *__restrict__ p, int64_t len, float shift,
                                  bool square) {
    float acc = 0.0f;
    int64_t tail = 0;
    if (flexdiag__aligned16(p)) {
        const float4 *pv = (const float4 *)p;
        for (int64_t v = threadIdx.x; v < len / 4; v += blockDim.x) {
            const float4 f = pv[v];
            const float a = f.x - shift, b = f.y - shift, c = f.z - shift, d = f.w - shift;
            acc += square ? (a * a + b * b) + (c * c + d * d) : (a + b) + (c + d);
        }
        tail = len / 4 * 4;
    }
    for (int64_t i = tail + threadIdx.x; i < len; i += blockDim.x) {
        const float a = p[i] - shift;
        acc += square ? a * a : a;
    }
    return acc;
}

/* CTA b: slice b % splits of group b / splits (len elements each, the last one shorter):
 * part[b] = (mean, sum of squared deviations) of the slice. */
static __global__ void gn_partial_kernel(float2 *__restrict__ part,
                                         const float *__restrict__ x, int64_t glen,
                                         int64_t slice, int32_t splits) {
    __shared__ float red[32];
    const int64_t g = blockIdx.x / splits, a = (int64_t)(blockIdx.x % splits) * slice;
    const int64_t len = a >= glen ? 0 : (glen - a < slice ? glen - a : slice);
    const float *p = x + g * glen + a;
    const float sum = flexdiag__block_sum(slice_acc(p, len, 0.0f, false), red);
    const float mean = len ? sum / (float)len : 0.0f;
    const float m2 = flexdiag__block_sum(slice_acc(p, len, mean, true), red);
    if (threadIdx.x == 0) part[blockIdx.x] = make_float2(mean, m2);
}

/* stats[g] = (mean, 1/sqrt(var + eps)) of group g from its splits partials (Chan, in double). */
static __global__ void gn_merge_kernel(float2 *__restrict__ stats,
                                       const float2 *__restrict__ part, int64_t n_groups,
                                       int64_t glen, int64_t slice, int32_t splits, float eps) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < n_groups; g += step) {
        const float2 *pg = part + g * splits;
        double mean = 0.0, m2 = 0.0;
        for (int32_t k = 0; k < splits; k++) {
            const int64_t a = (int64_t)k * slice;
            const int64_t cnt = a >= glen ? 0 : (glen - a < slice ? glen - a : slice);
            mean += (double)cnt * pg[k].x;
        }
        mean /= (double)glen;
        for (int32_t k = 0; k < splits; k++) {
            const int64_t a = (int64_t)k * slice;
            const int64_t cnt = a >= glen ? 0 : (glen - a < slice ? glen - a : slice);
            const double d = (double)pg[k].x - mean;
            m2 += (double)pg[k].y + (double)cnt * d * d;
        }
        stats[g] = make_float2((float)mean, (float)(1.0 / sqrt(m2 / (double)glen + (double)eps)));
    }
}

/* Shapes of one GroupNorm apply. */
typedef struct gn_shape {
    int64_t total; /* n·c·hw elements */
    int64_t c, hw; /* channels, plane size */
    int64_t cg;    /* channels per group */
    int32_t swish; /* apply x·sigmoid(x) */
} gn_shape;

static __device__ __forceinline__ float gn_value(float x, float2 st, float gm, float bt,
                                                 int32_t swish) {
    const float y = (x - st.x) * st.y * gm + bt;
    return swish ? y * (1.0f / (1.0f + expf(-y))) : y;
}

/* out = GroupNorm affine (+ swish) of x; VEC elements (4: one float4 access, hw % 4 == 0) or 1
 * per thread step, all in one channel plane. */
template <int VEC>
static __global__ void gn_apply_kernel(float *__restrict__ out, const float *__restrict__ x,
                                       const float2 *__restrict__ stats,
                                       const __nv_bfloat16 *__restrict__ gamma,
                                       const __nv_bfloat16 *__restrict__ beta, gn_shape sh) {
    const int64_t units = sh.total / VEC, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += step) {
        const int64_t e = u * VEC, plane = e / sh.hw, ch = plane % sh.c;
        const float2 st = stats[(plane / sh.c) * (sh.c / sh.cg) + ch / sh.cg];
        const float gm = __bfloat162float(gamma[ch]), bt = __bfloat162float(beta[ch]);
        if constexpr (VEC == 1) {
            out[e] = gn_value(x[e], st, gm, bt, sh.swish);
        } else {
            float4 v = *(const float4 *)(x + e);
            v.x = gn_value(v.x, st, gm, bt, sh.swish);
            v.y = gn_value(v.y, st, gm, bt, sh.swish);
            v.z = gn_value(v.z, st, gm, bt, sh.swish);
            v.w = gn_value(v.w, st, gm, bt, sh.swish);
            *(float4 *)(out + e) = v;
        }
    }
}

/* out, x (n, c, hw) f32; gamma, beta (c) bf16; stats fp32 in the workspace head */
extern "C" flexdiag_status flexdiag__cuda_groupnorm(void *out, const void *x,
                                                    const uint16_t *gamma, const uint16_t *beta,
                                                    int64_t n, int32_t c, int32_t hw,
                                                    int32_t groups, float eps, int32_t swish,
                                                    flexdiag_stream *s) {
    if (n < 0 || c <= 0 || hw <= 0 || groups <= 0 || c % groups || !(eps >= 0.0f))
        return bad_shape("groupnorm", "need n >= 0, positive c, hw, groups with c % groups == 0 "
                                      "and eps >= 0");
    if (!s) return bad_shape("groupnorm", "no stream: the statistics use the stream workspace");
    if (n > 0 && (!out || !x || !gamma || !beta))
        return bad_shape("groupnorm", "need device buffers for out, x, gamma and beta");
    if (n == 0) return FLEXDIAG_OK;
    const int64_t n_groups = n * groups, glen = (int64_t)(c / groups) * hw;
    const int64_t want = ((int64_t)GN_CTAS_PER_SM * s->sm_count + n_groups - 1) / n_groups;
    const int64_t most = (glen + GN_MIN_SLICE - 1) / GN_MIN_SLICE;
    const int32_t splits = (int32_t)(want < 1 ? 1 : (want > most ? most : want));
    const int64_t slice = ((glen + splits - 1) / splits + 3) / 4 * 4; /* 16-byte slice starts */
    const size_t part_b = flexdiag__round256((size_t)(n_groups * splits) * sizeof(float2));
    if (part_b + (size_t)n_groups * sizeof(float2) > s->workspace_bytes ||
        n_groups * splits > INT_MAX)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "cuda groupnorm: %lld images x %d groups: statistics exceed the "
                             "stream workspace: normalise fewer images at once",
                             (long long)n, groups);
    float2 *part = (float2 *)s->workspace, *stats = (float2 *)((char *)s->workspace + part_b);
    const cudaStream_t st = s->stream;
    const float *xf = (const float *)x;
    gn_partial_kernel<<<(unsigned)(n_groups * splits), FLEXDIAG_CUDA_BLOCK, 0, st>>>(
        part, xf, glen, slice, splits);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    gn_merge_kernel<<<flexdiag__cuda_blocks(n_groups, 128), 128, 0, st>>>(stats, part, n_groups,
                                                                         glen, slice, splits, eps);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    const gn_shape sh = {n * c * hw, c, hw, c / groups, swish};
    const __nv_bfloat16 *gm = (const __nv_bfloat16 *)gamma, *bt = (const __nv_bfloat16 *)beta;
    if (hw % 4 == 0 && flexdiag__aligned16(out) && flexdiag__aligned16(x))
        gn_apply_kernel<4><<<flexdiag__cuda_blocks(sh.total / 4, FLEXDIAG_CUDA_BLOCK),
                             FLEXDIAG_CUDA_BLOCK, 0, st>>>((float *)out, xf, stats, gm, bt, sh);
    else
        gn_apply_kernel<1><<<flexdiag__cuda_blocks(sh.total, FLEXDIAG_CUDA_BLOCK),
                             FLEXDIAG_CUDA_BLOCK, 0, st>>>((float *)out, xf, stats, gm, bt, sh);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* ---- upsample2x ---- */

/* One output element per thread step: out[p][y][x] = x[p][y/2][x/2]. */
static __global__ void upsample_kernel(float *__restrict__ out, const float *__restrict__ x,
                                       int64_t planes, int64_t h, int64_t wd) {
    const int64_t ow = 2 * wd, total = planes * 4 * h * wd, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const int64_t xo = e % ow, yo = (e / ow) % (2 * h), p = e / (ow * 2 * h);
        out[e] = x[(p * h + yo / 2) * wd + xo / 2];
    }
}

/* Two input elements (one float2 load) per thread step -> 4 outputs in each of two rows (one
 * float4 store each); needs wd % 2 == 0, x 8-byte and out 16-byte aligned. */
static __global__ void upsample2_kernel(float *__restrict__ out, const float *__restrict__ x,
                                        int64_t planes, int64_t h, int64_t wd) {
    const int64_t q = wd / 2, total = planes * h * q, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const int64_t row = t / q, x0 = (t % q) * 2; /* row = plane·h + y */
        const float2 in = *(const float2 *)(x + row * wd + x0);
        const float4 o = make_float4(in.x, in.x, in.y, in.y);
        float *o0 = out + (2 * row) * 2 * wd + 2 * x0; /* row 2y of the plane */
        *(float4 *)o0 = o;
        *(float4 *)(o0 + 2 * wd) = o;
    }
}

/* out (n, c, 2h, 2wd), x (n, c, h, wd) f32 */
extern "C" flexdiag_status flexdiag__cuda_upsample2x(void *out, const void *x, int64_t n,
                                                     int32_t c, int32_t h, int32_t wd,
                                                     flexdiag_stream *s) {
    if (n < 0 || c <= 0 || h <= 0 || wd <= 0 || (n > 0 && (!out || !x)))
        return bad_shape("upsample2x", "need n >= 0, positive c, h, w and device buffers");
    if (n == 0) return FLEXDIAG_OK;
    const cudaStream_t st = flexdiag__cuda_st(s);
    const int64_t planes = n * c;
    float *o = (float *)out;
    const float *xf = (const float *)x;
    if (wd % 2 == 0 && flexdiag__aligned16(out) && ((uintptr_t)x & 7) == 0)
        upsample2_kernel<<<flexdiag__cuda_blocks(planes * h * (wd / 2), FLEXDIAG_CUDA_BLOCK),
                           FLEXDIAG_CUDA_BLOCK, 0, st>>>(o, xf, planes, h, wd);
    else
        upsample_kernel<<<flexdiag__cuda_blocks(planes * 4 * h * wd, FLEXDIAG_CUDA_BLOCK),
                          FLEXDIAG_CUDA_BLOCK, 0, st>>>(o, xf, planes, h, wd);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* ---- attn_spatial ---- */

/* One warp per score row (rows, hw valid of ld), in place: s = softmax(s), fp32 max / exp /
 * sum. */
static __global__ void softmax_rows_kernel(float *__restrict__ sc, int64_t rows, int64_t hw,
                                           int64_t ld) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        float *sr = sc + r * ld;
        float m = -INFINITY, sum = 0.0f;
        for (int64_t j = lane; j < hw; j += 32) m = fmaxf(m, sr[j]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        for (int64_t j = lane; j < hw; j += 32) sum += expf(sr[j] - m);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float inv = 1.0f / sum;
        for (int64_t j = lane; j < hw; j += 32) sr[j] = expf(sr[j] - m) * inv;
    }
}

/* Arguments of one attn_spatial call. */
typedef struct attn_args {
    float *out;                /* (n, c, hw) */
    const float *q, *k, *v;    /* (n, c, hw) */
    int64_t n, c, hw;          /* images, channels, positions */
    int64_t ld;                /* score row stride: hw rounded up to 4 (16-byte rows) */
    float scale;               /* c^-0.5 rounded to fp32 */
} attn_args;

/* Strided-batched fp32 GEMM D (m × nn) = alpha·op(A) · op(B), column-major, CUBLAS_COMPUTE_32F
 * (true fp32 under the stream's default math mode). */
static flexdiag_status gemm_f32(flexdiag_stream *s, cublasOperation_t ta, cublasOperation_t tb,
                                int64_t m, int64_t nn, int64_t kk, float alpha, const float *a,
                                int64_t lda, int64_t sa, const float *b, int64_t ldb, int64_t sb,
                                float *d, int64_t ldd, int64_t sd, int64_t batch) {
    const float zero = 0.0f;
    FLEXDIAG_CUBLAS_TRY(cublasGemmStridedBatchedEx(
        s->blas, ta, tb, (int)m, (int)nn, (int)kk, &alpha, a, CUDA_R_32F, (int)lda,
        (long long)sa, b, CUDA_R_32F, (int)ldb, (long long)sb, &zero, d, CUDA_R_32F, (int)ldd,
        (long long)sd, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return FLEXDIAG_OK;
}

/* Images i0 .. i0+ni-1, query rows r0 .. r0+nr-1: S (ni, nr, ld) in the workspace, softmax in
 * place, then out columns r0.. of those images. */
static flexdiag_status attn_block(const attn_args *a, flexdiag_stream *s, float *sc, int64_t i0,
                                  int64_t ni, int64_t r0, int64_t nr) {
    const int64_t img = a->c * a->hw, off = i0 * img, sst = nr * a->ld;
    /* S_cm (hw × nr) = K_cm (hw × c) · Q_cm[r0..]ᵀ: row i of S holds the logits of query r0+i */
    FLEXDIAG_TRY(gemm_f32(s, CUBLAS_OP_N, CUBLAS_OP_T, a->hw, nr, a->c, a->scale, a->k + off,
                          a->hw, img, a->q + off + r0, a->hw, img, sc, a->ld, sst, ni));
    const int64_t rows = ni * nr;
    softmax_rows_kernel<<<flexdiag__cuda_blocks(rows, FLEXDIAG_CUDA_BLOCK / 32),
                          FLEXDIAG_CUDA_BLOCK, 0, s->stream>>>(sc, rows, a->hw, a->ld);
    FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
    /* O_cm (nr × c) = P (nr × hw) · V_cm (hw × c), written into out columns r0.. (ld hw) */
    return gemm_f32(s, CUBLAS_OP_T, CUBLAS_OP_N, nr, a->c, a->hw, 1.0f, sc, a->ld, sst,
                    a->v + off, a->hw, img, a->out + off + r0, a->hw, img, ni);
}

/* Walk image groups / query chunks that fit the workspace head. */
static flexdiag_status attn_run(const attn_args *a, flexdiag_stream *s) {
    const size_t head = s->workspace_bytes - ATTN_BLAS_WS;
    const int64_t rows_fit = (int64_t)(head / ((size_t)a->ld * sizeof(float)));
    if (rows_fit < 1)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "cuda attn_spatial: hw = %lld: one row of scores does not fit the "
                             "%zu-byte stream workspace: use the CPU backend",
                             (long long)a->hw, s->workspace_bytes);
    const int64_t nr_max = rows_fit < a->hw ? rows_fit : a->hw;
    int64_t gi = rows_fit >= a->hw ? rows_fit / a->hw : 1;
    gi = gi < a->n ? gi : a->n;
    float *sc = (float *)s->workspace;
    for (int64_t i0 = 0; i0 < a->n; i0 += gi) {
        const int64_t ni = a->n - i0 < gi ? a->n - i0 : gi;
        for (int64_t r0 = 0; r0 < a->hw; r0 += nr_max) {
            const int64_t nr = a->hw - r0 < nr_max ? a->hw - r0 : nr_max;
            FLEXDIAG_TRY(attn_block(a, s, sc, i0, ni, r0, nr));
        }
    }
    return FLEXDIAG_OK;
}

/* out, q, k, v (n, c, hw) f32 */
extern "C" flexdiag_status flexdiag__cuda_attn_spatial(void *out, const void *q, const void *k,
                                                       const void *v, int64_t n, int32_t c,
                                                       int32_t hw, flexdiag_stream *s) {
    if (n < 0 || c <= 0 || hw <= 0 || n > INT_MAX)
        return bad_shape("attn_spatial", "need 0 <= n <= INT_MAX, positive c and hw");
    if (!s)
        return bad_shape("attn_spatial", "no stream: the GEMMs need the cuBLAS handle and "
                                         "workspace of a stream from stream_create");
    if (n > 0 && (!out || !q || !k || !v))
        return bad_shape("attn_spatial", "need device buffers for out, q, k and v");
    if (n == 0) return FLEXDIAG_OK;
    const attn_args a = {(float *)out,        (const float *)q, (const float *)k,
                         (const float *)v,    n,                c,
                         hw,                  ((int64_t)hw + 3) / 4 * 4,
                         (float)(1.0 / sqrt((double)c))};
    FLEXDIAG_TRY(flexdiag__cuda_blas_ws_tail(s, s->workspace_bytes - ATTN_BLAS_WS));
    const flexdiag_status st = attn_run(&a, s);
    const flexdiag_status back = flexdiag__cuda_blas_ws_tail(s, 0);
    return st != FLEXDIAG_OK ? st : back;
}

/* ---- to_nhwc ---- */

/* out[(i·hw + j)·c + ch] = x[(i·c + ch)·hw + j] */
static __global__ void nhwc_kernel(float *__restrict__ out, const float *__restrict__ x,
                                   int64_t n, int64_t c, int64_t hw) {
    const int64_t total = n * c * hw, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const int64_t ch = e % c, j = (e / c) % hw, i = e / (c * hw);
        out[e] = x[(i * c + ch) * hw + j];
    }
}

/* out (n, hw, c) f32, x (n, c, hw) f32 */
extern "C" flexdiag_status flexdiag__cuda_to_nhwc(float *out, const void *x, int64_t n, int32_t c,
                                                  int32_t hw, flexdiag_stream *s) {
    if (n < 0 || c <= 0 || hw <= 0 || (n > 0 && (!out || !x)))
        return bad_shape("to_nhwc", "need n >= 0, positive c, hw and device buffers");
    if (n == 0) return FLEXDIAG_OK;
    const cudaStream_t st = flexdiag__cuda_st(s);
    const int64_t total = n * c * hw;
    nhwc_kernel<<<flexdiag__cuda_blocks(total, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0, st>>>(
        out, (const float *)x, n, c, hw);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
