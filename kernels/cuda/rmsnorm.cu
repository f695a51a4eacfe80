/*
 * rmsnorm.cu - RMSNorm of bf16 rows: y = w ⊙ x / sqrt(mean(x²) + eps).
 *
 * Rounding follows models.md §2 (transformers' LlamaRMSNorm in bf16): the statistic is fp32,
 * the normalised value x·r is rounded to bf16, then multiplied by the bf16 weight in fp32 and
 * rounded again. The fp32 reference rounds nothing; the two differ by at most two bf16
 * roundings, inside the bf16 test tolerance, and this way the GPU matches the bf16 model.
 *
 * One CTA per row (grid-stride over rows for n beyond the grid limit): pass 1 sums x² per
 * thread over a strided column range and reduces across the CTA in a fixed order (deterministic
 * for a given d); pass 2 re-reads the row (L1/L2-resident) and writes y. The CTA size follows d
 * (32..256 threads) so short rows do not idle a 256-thread block. r = 1 / sqrtf(..) rather
 * than the approximate rsqrtf.
 */
#include "cuda_common.cuh"
#include "cuda_ops.cuh"

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
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
            const float t = __bfloat162float(__float2bfloat16_rn(__bfloat162float(xr[c]) * r));
            yr[c] = __float2bfloat16_rn(t * __bfloat162float(w[c]));
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
    int64_t threads = (d / 4 + 31) / 32 * 32;
    if (threads < 32) threads = 32;
    if (threads > FLEXDIAG_CUDA_BLOCK) threads = FLEXDIAG_CUDA_BLOCK;
    cudaStream_t st = flexdiag__cuda_st(s);
    rmsnorm_kernel<<<flexdiag__cuda_blocks(n, 1), (unsigned)threads, 0, st>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, n, d, eps);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
