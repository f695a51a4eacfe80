/*
 * gather.cu - row gathers: embed (token embedding lookup, row i = table[ids[i / rep]], rep > 1
 * repeats each id for the CFG row pairs) and gather_rows (out row i = in row idx[i]). Both are
 * the same exact copy of bf16 rows, so one kernel serves both ops.
 *
 * A CTA copies whole rows (grid-stride over rows, so n may exceed the grid limit); its threads
 * stride over the columns. When the row width is a multiple of 8 elements and both buffers are
 * 16-byte aligned the copy moves 16-byte vectors (16-byte accesses coalesce across
 * the warp), otherwise single bf16 elements. Indices are trusted: the runtime validates ids
 * against the vocabulary before calling (the op has no V to check against).
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

template <typename T>
static __global__ void gather_kernel(T *__restrict__ out, const T *__restrict__ in,
                                     const int32_t *__restrict__ idx, int64_t n, int64_t dv,
                                     int32_t rep) {
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *src = in + (int64_t)idx[row / rep] * dv;
        T *dst = out + row * dv;
        for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) dst[c] = src[c];
    }
}

/* Copy n rows of d bf16 elements: out row i = in row idx[i / rep]. */
static flexdiag_status gather_launch(void *out, const void *in, const int32_t *idx, int64_t n,
                                     int64_t d, int32_t rep, cudaStream_t st) {
    const int vec = d % 8 == 0 && flexdiag__aligned16(out) && flexdiag__aligned16(in);
    const int64_t dv = vec ? d / 8 : d;
    int64_t threads = (dv + 31) / 32 * 32;
    if (threads > FLEXDIAG_CUDA_BLOCK) threads = FLEXDIAG_CUDA_BLOCK;
    const unsigned blocks = flexdiag__cuda_blocks(n, 1);
    if (vec)
        gather_kernel<uint4><<<blocks, (unsigned)threads, 0, st>>>(
            (uint4 *)out, (const uint4 *)in, idx, n, dv, rep);
    else
        gather_kernel<uint16_t><<<blocks, (unsigned)threads, 0, st>>>(
            (uint16_t *)out, (const uint16_t *)in, idx, n, dv, rep);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* out (n, d) bf16, table (V, d) bf16, ids (ceil(n / rep)) int32 */
extern "C" flexdiag_status flexdiag__cuda_embed(void *out, const uint16_t *table,
                                                const int32_t *ids, int64_t n, int64_t d,
                                                int32_t rep, flexdiag_stream *s) {
    if (n < 0 || d < 0 || rep < 1 || (n > 0 && d > 0 && (!out || !table || !ids)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda embed: n = %lld, d = %lld, rep = %d: need n, d >= 0, rep >= 1 "
                             "and device buffers",
                             (long long)n, (long long)d, rep);
    if (n == 0 || d == 0) return FLEXDIAG_OK;
    return gather_launch(out, table, ids, n, d, rep, flexdiag__cuda_st(s));
}

/* out (n, d) bf16, in (*, d) bf16, idx (n) int32 */
extern "C" flexdiag_status flexdiag__cuda_gather_rows(void *out, const void *in,
                                                      const int32_t *idx, int64_t n, int64_t d,
                                                      flexdiag_stream *s) {
    if (n < 0 || d < 0 || (n > 0 && d > 0 && (!out || !in || !idx)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda gather_rows: n = %lld, d = %lld: need sizes >= 0 and device "
                             "buffers",
                             (long long)n, (long long)d);
    if (n == 0 || d == 0) return FLEXDIAG_OK;
    return gather_launch(out, in, idx, n, d, 1, flexdiag__cuda_st(s));
}
