/*
 * swiglu.cu - the SwiGLU gate of Llama MLPs: out (n, f) = silu(g) ⊙ u, where each row of gu
 * (n, 2f) holds the gate projection g in columns 0..f-1 and the up projection u in f..2f-1 (one
 * fused gate|up GEMM produced it).
 *
 * silu(g) = g / (1 + exp(−g)) in fp32 (expf), product in fp32, one rounding to bf16. The fp32
 * reference rounds nothing; transformers in bf16 rounds silu(g) before the product: both stay
 * within one or two bf16 roundings of each other. Grid-stride over the n·f outputs.
 */
#include "cuda_common.cuh"
#include "cuda_ops.cuh"

static __global__ void swiglu_kernel(__nv_bfloat16 *__restrict__ out,
                                     const __nv_bfloat16 *__restrict__ gu, int64_t n, int64_t f) {
    const int64_t total = n * f, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t row = i / f, c = i - row * f;
        const float g = __bfloat162float(gu[row * 2 * f + c]);
        const float u = __bfloat162float(gu[row * 2 * f + f + c]);
        out[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
}

/* out (n, f) bf16, gu (n, 2f) bf16 */
extern "C" flexdiag_status flexdiag__cuda_swiglu(void *out, const void *gu, int64_t n, int64_t f,
                                                 flexdiag_stream *s) {
    if (n < 0 || f < 0 || (n > 0 && f > 0 && (!out || !gu)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda swiglu: n = %lld, f = %lld: need sizes >= 0 and device buffers",
                             (long long)n, (long long)f);
    if (n == 0 || f == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    swiglu_kernel<<<flexdiag__cuda_blocks(n * f, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0,
                    st>>>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)gu, n, f);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
