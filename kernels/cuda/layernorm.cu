/*
 * layernorm.cu - LayerNorm of bf16 rows (OPT's pre-LN blocks and final norm):
 * y = (x − mean) / sqrt(var + eps) ⊙ w + b, mean and biased variance over the row.
 *
 * Rounding: statistics and the whole formula in fp32, one rounding to bf16 at the end, as
 * PyTorch's layer_norm does for bf16 inputs (it computes in fp32 internally). The variance is
 * two-pass (the sum of squared deviations from the mean, not E[x²] − mean²), so rows far from
 * zero lose nothing to cancellation. The reference computes in double; the two differ by the
 * final bf16 rounding and fp32 noise far below it.
 *
 * One CTA per row (grid-stride over rows for n beyond the grid limit), warp-shuffle block sums
 * as in rmsnorm.cu and the same two paths: rows of d % 8 == 0 with at most LN_VEC_MAX 16-byte
 * vectors per thread (d <= 16384 at 256 threads) keep the row in registers through both
 * statistic passes and the write; other rows take the scalar path, which re-reads the row
 * (from L1/L2) for each pass. The CTA size follows d (32..256 threads). out may be x: every
 * element is read by the thread that writes it, before the write, so x is not declared
 * __restrict__ and is read with plain (coherent) loads.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

/* 16-byte vectors one thread keeps in registers on the vector path. */
#define LN_VEC_MAX 8

/* y = (x − mean)·rstd·w + b in fp32 for one element. */
static __device__ __forceinline__ float ln_apply(float x, float mean, float rstd, float w,
                                                 float b) {
    return (x - mean) * rstd * w + b;
}

/* Scalar path: any d. */
static __global__ void layernorm_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x,
                                        const __nv_bfloat16 *__restrict__ w,
                                        const __nv_bfloat16 *__restrict__ b, int64_t n, int64_t d,
                                        float eps) {
    __shared__ float red[32];
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const __nv_bfloat16 *xr = x + row * d;
        float sum = 0.0f;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) sum += __bfloat162float(xr[c]);
        const float mean = flexdiag__block_sum(sum, red) / (float)d;
        float sq = 0.0f;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
            const float v = __bfloat162float(xr[c]) - mean;
            sq += v * v;
        }
        const float rstd = 1.0f / sqrtf(flexdiag__block_sum(sq, red) / (float)d + eps);
        __nv_bfloat16 *yr = out + row * d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
            yr[c] = __float2bfloat16_rn(ln_apply(__bfloat162float(xr[c]), mean, rstd,
                                                 __bfloat162float(w[c]), __bfloat162float(b[c])));
    }
}

/* Vector path: d = 8·nv, thread t owns vectors t, t + blockDim.x, ... (< LN_VEC_MAX of them). */
static __global__ void layernorm_vec_kernel(uint4 *out, const uint4 *x,
                                            const uint4 *__restrict__ w,
                                            const uint4 *__restrict__ b, int64_t n, int32_t nv,
                                            float eps) {
    __shared__ float red[32];
    const float fd = (float)(8 * (int64_t)nv); /* d, divided by as on the scalar path */
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        uint4 v[LN_VEC_MAX];
#pragma unroll
        for (int i = 0; i < LN_VEC_MAX; i++) {
            const int c = (int)threadIdx.x + i * (int)blockDim.x;
            v[i] = c < nv ? x[row * nv + c] : make_uint4(0, 0, 0, 0);
        }
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < LN_VEC_MAX; i++) {
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[i];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(h[e]);
                sum += f.x + f.y;
            }
        }
        const float mean = flexdiag__block_sum(sum, red) / fd;
        float sq = 0.0f;
#pragma unroll
        for (int i = 0; i < LN_VEC_MAX; i++) {
            if ((int)threadIdx.x + i * (int)blockDim.x >= nv) continue; /* padding, not row */
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[i];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(h[e]);
                sq += (f.x - mean) * (f.x - mean) + (f.y - mean) * (f.y - mean);
            }
        }
        const float rstd = 1.0f / sqrtf(flexdiag__block_sum(sq, red) / fd + eps);
#pragma unroll
        for (int i = 0; i < LN_VEC_MAX; i++) {
            const int c = (int)threadIdx.x + i * (int)blockDim.x;
            if (c >= nv) continue;
            const uint4 wv = __ldg(w + c), bv = __ldg(b + c);
            __nv_bfloat162 *h = (__nv_bfloat162 *)&v[i];
            const __nv_bfloat162 *wh = (const __nv_bfloat162 *)&wv;
            const __nv_bfloat162 *bh = (const __nv_bfloat162 *)&bv;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(h[e]), g = __bfloat1622float2(wh[e]),
                             o = __bfloat1622float2(bh[e]);
                h[e] = __floats2bfloat162_rn(ln_apply(f.x, mean, rstd, g.x, o.x),
                                             ln_apply(f.y, mean, rstd, g.y, o.y));
            }
            out[row * nv + c] = v[i];
        }
    }
}

/* out (n, d) bf16 (may be x), x (n, d) bf16, w (d) bf16, b (d) bf16 */
extern "C" flexdiag_status flexdiag__cuda_layernorm(void *out, const void *x, const uint16_t *w,
                                                    const uint16_t *b, int64_t n, int64_t d,
                                                    float eps, flexdiag_stream *s) {
    if (n < 0 || d <= 0 || !(eps >= 0.0f) || (n > 0 && (!out || !x || !w || !b)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda layernorm: n = %lld, d = %lld, eps = %g: need n >= 0, d > 0, "
                             "eps >= 0 and device buffers",
                             (long long)n, (long long)d, (double)eps);
    if (n == 0) return FLEXDIAG_OK;
    const int64_t threads = flexdiag__cuda_row_threads(d);
    cudaStream_t st = flexdiag__cuda_st(s);
    const bool aligned = flexdiag__aligned16(out) && flexdiag__aligned16(x) &&
                         flexdiag__aligned16(w) && flexdiag__aligned16(b);
    if (aligned && d % 8 == 0 && d / 8 <= (int64_t)LN_VEC_MAX * threads)
        layernorm_vec_kernel<<<flexdiag__cuda_blocks(n, 1), (unsigned)threads, 0, st>>>(
            (uint4 *)out, (const uint4 *)x, (const uint4 *)w, (const uint4 *)b, n,
            (int32_t)(d / 8), eps);
    else
        layernorm_kernel<<<flexdiag__cuda_blocks(n, 1), (unsigned)threads, 0, st>>>(
            (__nv_bfloat16 *)out, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w,
            (const __nv_bfloat16 *)b, n, d, eps);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
