/*
 * cfg.cu - classifier-free guidance on fp32 logits: out[i] = u + w·(c − u) with c = logits row
 * 2i (conditional) and u = row 2i+1 (unconditional), as Janus / Lumina combine them.
 *
 * One grid-stride loop over the n_pairs·V outputs; the row pair is found by division, which is
 * cheap next to the three memory accesses per element. fp32 throughout, evaluated as
 * u + w*(c - u) like the reference (nvcc may contract it into one fma: within fp32 tolerance).
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __global__ void cfg_kernel(float *__restrict__ out, const float *__restrict__ logits,
                                  int64_t n_pairs, int64_t V, float w) {
    const int64_t total = n_pairs * V, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t pair = i / V, j = i - pair * V;
        const float c = logits[2 * pair * V + j], u = logits[(2 * pair + 1) * V + j];
        out[i] = u + w * (c - u);
    }
}

/* out (n_pairs, V) f32, logits (2·n_pairs, V) f32 */
extern "C" flexdiag_status flexdiag__cuda_cfg_combine(float *out, const float *logits,
                                                      int64_t n_pairs, int64_t V, float w,
                                                      flexdiag_stream *s) {
    if (n_pairs < 0 || V < 0 || (n_pairs > 0 && V > 0 && (!out || !logits)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda cfg_combine: n_pairs = %lld, V = %lld, out %p, logits %p: "
                             "need sizes >= 0 and device buffers",
                             (long long)n_pairs, (long long)V, (void *)out, (const void *)logits);
    if (n_pairs == 0 || V == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    cfg_kernel<<<flexdiag__cuda_blocks(n_pairs * V, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0,
                 st>>>(out, logits, n_pairs, V, w);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
