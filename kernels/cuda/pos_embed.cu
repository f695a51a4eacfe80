/*
 * pos_embed.cu - learned position embeddings (OPT): x (n, d) bf16 += table[pos[i] + offset] for
 * row i, table (rows, d) bf16, pos (n) int32 on the device. The sum is fp32, rounded once to
 * bf16.
 *
 * Elementwise grid-stride loop over the n·d elements (n·d may exceed any grid limit); the row
 * of element e is e / d. Positions are trusted: the caller guarantees
 * 0 <= pos[i] + offset < rows (kernels.h), and the row index is formed in 64 bits.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __global__ void pos_embed_add_kernel(__nv_bfloat16 *__restrict__ x,
                                            const __nv_bfloat16 *__restrict__ table,
                                            const int32_t *__restrict__ pos, int64_t n, int64_t d,
                                            int32_t offset) {
    const int64_t total = n * d, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t row = i / d, c = i - row * d;
        const int64_t t = (int64_t)pos[row] + offset;
        x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + __bfloat162float(table[t * d + c]));
    }
}

/* x (n, d) bf16 in place, table (rows, d) bf16, pos (n) int32 */
extern "C" flexdiag_status flexdiag__cuda_pos_embed_add(void *x, const uint16_t *table,
                                                        const int32_t *pos, int64_t n, int64_t d,
                                                        int32_t offset, flexdiag_stream *s) {
    if (n < 0 || d < 0 || (n > 0 && d > 0 && (!x || !table || !pos)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda pos_embed_add: n = %lld, d = %lld: need sizes >= 0 and device "
                             "buffers",
                             (long long)n, (long long)d);
    if (n == 0 || d == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    pos_embed_add_kernel<<<flexdiag__cuda_blocks(n * d, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK,
                           0, st>>>((__nv_bfloat16 *)x, (const __nv_bfloat16 *)table, pos, n, d,
                                    offset);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
