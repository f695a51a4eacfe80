/*
 * gelu.cu - exact GELU in place on bf16 activations: x = 0.5·x·(1 + erf(x/√2)), fp32 math
 * (erff), one rounding to bf16. Used by the VQ decoder's and OPT-style MLPs.
 *
 * Elementwise grid-stride loop over n (n may exceed any grid limit). The tanh approximation is
 * rejected: the reference and transformers' default use erf.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __global__ void gelu_kernel(__nv_bfloat16 *__restrict__ x, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = __bfloat162float(x[i]);
        x[i] = __float2bfloat16_rn(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
    }
}

/* x (n) bf16, in place */
extern "C" flexdiag_status flexdiag__cuda_gelu(void *x, int64_t n, flexdiag_stream *s) {
    if (n < 0 || (n > 0 && !x))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda gelu: n = %lld, x %p: need n >= 0 and a device buffer",
                             (long long)n, x);
    if (n == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    gelu_kernel<<<flexdiag__cuda_blocks(n, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0, st>>>(
        (__nv_bfloat16 *)x, n);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
