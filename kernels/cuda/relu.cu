/*
 * relu.cu - ReLU in place on bf16 activations (OPT's MLP): x = max(x, 0).
 *
 * Negative values become +0; ±0 and NaN (whose comparison with 0 is false) are not written at
 * all, so they keep their exact bits, as in the reference. The result is either x or 0, so
 * nothing is rounded. Elementwise grid-stride loop over n (n may exceed any grid limit).
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __global__ void relu_kernel(__nv_bfloat16 *__restrict__ x, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        if (__bfloat162float(x[i]) < 0.0f) x[i] = __float2bfloat16_rn(0.0f);
}

/* x (n) bf16, in place */
extern "C" flexdiag_status flexdiag__cuda_relu(void *x, int64_t n, flexdiag_stream *s) {
    if (n < 0 || (n > 0 && !x))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda relu: n = %lld, x %p: need n >= 0 and a device buffer",
                             (long long)n, x);
    if (n == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    relu_kernel<<<flexdiag__cuda_blocks(n, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0, st>>>(
        (__nv_bfloat16 *)x, n);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
