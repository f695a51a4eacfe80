/*
 * convert.cu - act_to_f32 / act_from_f32: the bf16 activations of the CUDA backend to and from
 * fp32 (logit heads, debugging, golden comparisons).
 *
 * Elementwise grid-stride loops; bf16 -> f32 is exact, f32 -> bf16 rounds to nearest even
 * (__float2bfloat16_rn, NaN stays NaN, like flexdiag__f32_to_bf16 up to the NaN payload).
 * Rejected: vectorised 16-byte variants; these ops sit outside the per-token hot path.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __global__ void act_to_f32_kernel(float *__restrict__ out,
                                         const __nv_bfloat16 *__restrict__ in, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        out[i] = __bfloat162float(in[i]);
}

static __global__ void act_from_f32_kernel(__nv_bfloat16 *__restrict__ out,
                                           const float *__restrict__ in, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        out[i] = __float2bfloat16_rn(in[i]);
}

/* Shared size check of both directions. */
static flexdiag_status check(const char *op, const void *out, const void *in, int64_t n) {
    if (n < 0 || (n > 0 && (!out || !in)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda %s: n = %lld, out %p, in %p: need n >= 0 and device buffers",
                             op, (long long)n, out, in);
    return FLEXDIAG_OK;
}

/* out (n) f32, in (n) bf16 */
extern "C" flexdiag_status flexdiag__cuda_act_to_f32(float *out, const void *in, int64_t n,
                                                     flexdiag_stream *s) {
    FLEXDIAG_TRY(check("act_to_f32", out, in, n));
    if (n == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    act_to_f32_kernel<<<flexdiag__cuda_blocks(n, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0,
                        st>>>(out, (const __nv_bfloat16 *)in, n);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* out (n) bf16, in (n) f32 */
extern "C" flexdiag_status flexdiag__cuda_act_from_f32(void *out, const float *in, int64_t n,
                                                       flexdiag_stream *s) {
    FLEXDIAG_TRY(check("act_from_f32", out, in, n));
    if (n == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    act_from_f32_kernel<<<flexdiag__cuda_blocks(n, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0,
                          st>>>((__nv_bfloat16 *)out, in, n);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
