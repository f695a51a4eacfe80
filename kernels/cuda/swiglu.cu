/*
 * swiglu.cu - the SwiGLU gate of Llama MLPs: out (n, f) = silu(g) ⊙ u, where each row of gu
 * (n, 2f) holds the gate projection g in columns 0..f-1 and the up projection u in f..2f-1 (one
 * fused gate|up GEMM produced it).
 *
 * silu(g) = g / (1 + exp(−g)) in fp32 (expf), product in fp32, one rounding to bf16. The fp32
 * reference rounds nothing; transformers in bf16 rounds silu(g) before the product: both stay
 * within one or two bf16 roundings of each other. Grid-stride over the n·f outputs, 8 per
 * thread step with 16-byte accesses when f % 8 == 0 and the buffers are aligned (one load of g
 * and of u in flight per step instead of a scalar chain), else one.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

static __global__ void swiglu_kernel(__nv_bfloat16 *__restrict__ out,
                                     const __nv_bfloat16 *__restrict__ gu, int64_t n, int64_t f) {
    const int64_t total = n * f, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t row = i / f, c = i - row * f;
        const float g = __bfloat162float(gu[row * 2 * f + c]);
        const float u = __bfloat162float(gu[row * 2 * f + f + c]);
        out[i] = __float2bfloat16_rn(silu_mul(g, u));
    }
}

/* 8 outputs per step: vector i of out row r takes vector i of g and of u (f8 = f / 8). */
static __global__ void swiglu_vec_kernel(uint4 *__restrict__ out, const uint4 *__restrict__ gu,
                                         int64_t n, int64_t f8) {
    const int64_t total = n * f8, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t row = i / f8, c = i - row * f8;
        const uint4 gv = __ldg(gu + row * 2 * f8 + c), uv = __ldg(gu + row * 2 * f8 + f8 + c);
        const __nv_bfloat162 *g2 = (const __nv_bfloat162 *)&gv, *u2 = (const __nv_bfloat162 *)&uv;
        uint4 o;
        __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 g = __bfloat1622float2(g2[e]), u = __bfloat1622float2(u2[e]);
            o2[e] = __floats2bfloat162_rn(silu_mul(g.x, u.x), silu_mul(g.y, u.y));
        }
        out[i] = o;
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
    if (f % 8 == 0 && flexdiag__aligned16(out) && flexdiag__aligned16(gu))
        swiglu_vec_kernel<<<flexdiag__cuda_blocks(n * f / 8, FLEXDIAG_CUDA_BLOCK),
                            FLEXDIAG_CUDA_BLOCK, 0, st>>>((uint4 *)out, (const uint4 *)gu, n,
                                                          f / 8);
    else
        swiglu_kernel<<<flexdiag__cuda_blocks(n * f, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0,
                    st>>>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)gu, n, f);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
