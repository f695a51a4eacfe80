/*
 * rmsnorm.cu - RMSNorm of bf16 rows: y = w ⊙ x / sqrt(mean(x²) + eps).
 *
 * Rounding follows docs/architecture.md §9 (transformers' LlamaRMSNorm in bf16): the statistic is
 * fp32, the normalised value x·r is rounded to bf16, then multiplied by the bf16 weight in fp32 and
 * rounded again. The fp32 reference rounds nothing; the two differ by at most two bf16
 * roundings, inside the bf16 test tolerance, and this way the GPU matches the bf16 model.
 *
 * One CTA per row (grid-stride over rows for n beyond the grid limit). Rows of d % 8 == 0 with
 * at most RMS_VEC_MAX 16-byte vectors per thread (d <= 16384 at 256 threads) take the vector
 * path: each thread loads all its vectors of the row at once (one memory round trip, where a
 * scalar loop waits for every load: 11 us instead of ~3 us for 64 rows of 4096 on the H200),
 * keeps them in registers for the write pass, and the CTA reduces the sum of squares in a fixed
 * order (deterministic for a given d). Other rows take the scalar path (pass 2 re-reads the row
 * from L1/L2). The CTA size follows d (32..256 threads) so short rows do not idle a 256-thread
 * block. r = 1 / sqrtf(..) rather than the approximate rsqrtf.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

/* 16-byte vectors one thread keeps in registers on the vector path. */
#define RMS_VEC_MAX 8

/* y = bf16(bf16(x·r) · w) for one element, the rounding of docs/architecture.md §9. */
static __device__ __forceinline__ float rms_apply(float x, float r, float w) {
    return __bfloat162float(__float2bfloat16_rn(x * r)) * w;
}

/* Scalar path: any d. */
static __global__ void rmsnorm_kernel(__nv_bfloat16 *__restrict__ out,
                                      const __nv_bfloat16 *__restrict__ x,
                                      const __nv_bfloat16 *__restrict__ w, int64_t n, int64_t d,
                                      float eps) {
    __shared__ float red[32];
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const __nv_bfloat16 *xr = x + row * d;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
            const float v = __bfloat162float(xr[c]);
            ss += v * v;
        }
        ss = flexdiag__block_sum(ss, red);
        const float r = 1.0f / sqrtf(ss / (float)d + eps);
        __nv_bfloat16 *yr = out + row * d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
            yr[c] = __float2bfloat16_rn(rms_apply(__bfloat162float(xr[c]), r,
                                                  __bfloat162float(w[c])));
    }
}

/* Vector path: d = 8·nv, thread t owns vectors t, t + blockDim.x, ... (< RMS_VEC_MAX of them). */
static __global__ void rmsnorm_vec_kernel(uint4 *__restrict__ out, const uint4 *__restrict__ x,
                                          const uint4 *__restrict__ w, int64_t n, int32_t nv,
                                          float eps) {
    __shared__ float red[32];
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        uint4 v[RMS_VEC_MAX];
#pragma unroll
        for (int i = 0; i < RMS_VEC_MAX; i++) {
            const int c = (int)threadIdx.x + i * (int)blockDim.x;
            v[i] = c < nv ? __ldg(x + row * nv + c) : make_uint4(0, 0, 0, 0);
        }
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < RMS_VEC_MAX; i++) {
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[i];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(h[e]);
                ss += f.x * f.x + f.y * f.y;
            }
        }
        ss = flexdiag__block_sum(ss, red);
        const float r = 1.0f / sqrtf(ss / (float)(8 * (int64_t)nv) + eps);
#pragma unroll
        for (int i = 0; i < RMS_VEC_MAX; i++) {
            const int c = (int)threadIdx.x + i * (int)blockDim.x;
            if (c >= nv) continue;
            uint4 wv = __ldg(w + c);
            __nv_bfloat162 *h = (__nv_bfloat162 *)&v[i];
            const __nv_bfloat162 *wh = (const __nv_bfloat162 *)&wv;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(h[e]), g = __bfloat1622float2(wh[e]);
                h[e] = __floats2bfloat162_rn(rms_apply(f.x, r, g.x), rms_apply(f.y, r, g.y));
            }
            out[row * nv + c] = v[i];
        }
    }
}

/* out (n, d) bf16, x (n, d) bf16, w (d) bf16 */
extern "C" flexdiag_status flexdiag__cuda_rmsnorm(void *out, const void *x, const uint16_t *w,
                                                  int64_t n, int64_t d, float eps,
                                                  flexdiag_stream *s) {
    if (n < 0 || d <= 0 || !(eps >= 0.0f) || (n > 0 && (!out || !x || !w)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda rmsnorm: n = %lld, d = %lld, eps = %g: need n >= 0, d > 0, "
                             "eps >= 0 and device buffers",
                             (long long)n, (long long)d, (double)eps);
    if (n == 0) return FLEXDIAG_OK;
    const int64_t threads = flexdiag__cuda_row_threads(d);
    cudaStream_t st = flexdiag__cuda_st(s);
    const bool aligned =
        flexdiag__aligned16(out) && flexdiag__aligned16(x) && flexdiag__aligned16(w);
    if (aligned && d % 8 == 0 && d / 8 <= (int64_t)RMS_VEC_MAX * threads)
        rmsnorm_vec_kernel<<<flexdiag__cuda_blocks(n, 1), (unsigned)threads, 0, st>>>(
            (uint4 *)out, (const uint4 *)x, (const uint4 *)w, n, (int32_t)(d / 8), eps);
    else
        rmsnorm_kernel<<<flexdiag__cuda_blocks(n, 1), (unsigned)threads, 0, st>>>(
            (__nv_bfloat16 *)out, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, n, d,
            eps);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
