/*
 * wq4.cu - layer weights in 4-bit groups back to bf16 (kernels.h flexdiag_op_wq4_unpack; the
 * format and the plain C reference are in kernels/cpu/wq4.c). Runs once per streamed layer per
 * step, on the compute stream before the layer's first GEMM: it reads 9/32 of the bytes it
 * writes, so at the device's copy rate a 7B layer's 400 MB take about 0.1 ms.
 *
 * One thread per 8 values of a row: one 4-byte load of their codes, the group's two halves, one
 * 16-byte store when the output is 16-byte aligned (the slot's offsets of a tensor are only
 * 2-byte aligned in general), else eight 2-byte stores. Grid-stride over rows · cols / 8.
 */
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __global__ void wq4_unpack_kernel(__nv_bfloat16 *__restrict__ out,
                                         const uint8_t *__restrict__ in, int64_t rows,
                                         int64_t cols, size_t row_bytes, int vec) {
    const int64_t per_row = cols / 8, total = rows * per_row;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t r = i / per_row, c = (i - r * per_row) * 8;
        const uint8_t *row = in + (size_t)r * row_bytes;
        const uint32_t codes = *(const uint32_t *)(row + c / 2);
        const __half *par = (const __half *)(row + cols / 2 + c / FLEXDIAG_WQ4_GROUP * 4);
        const float st = __half2float(par[0]), mn = __half2float(par[1]);
        __nv_bfloat16 v[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = __float2bfloat16_rn(mn + (float)((codes >> (4 * e)) & 15u) * st);
        __nv_bfloat16 *o = out + r * cols + c;
        if (vec) {
            *(uint4 *)o = *(const uint4 *)v;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = v[e];
        }
    }
}

extern "C" flexdiag_status flexdiag__cuda_wq4_unpack(uint16_t *out, const uint8_t *in,
                                                     int64_t rows, int64_t cols,
                                                     flexdiag_stream *s) {
    if (rows < 0 || cols <= 0 || cols % FLEXDIAG_WQ4_GROUP || (rows && (!out || !in)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda wq4_unpack: rows = %lld, cols = %lld: need rows >= 0, cols a "
                             "multiple of %d and device buffers",
                             (long long)rows, (long long)cols, FLEXDIAG_WQ4_GROUP);
    if (rows == 0) return FLEXDIAG_OK;
    if ((uintptr_t)in % 4)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda wq4_unpack: packed rows must be 4-byte aligned");
    cudaStream_t st = flexdiag__cuda_st(s);
    int vec = flexdiag__aligned16(out) && cols % 8 == 0;
    wq4_unpack_kernel<<<flexdiag__cuda_blocks(rows * cols / 8, FLEXDIAG_CUDA_BLOCK),
                        FLEXDIAG_CUDA_BLOCK, 0, st>>>((__nv_bfloat16 *)out, in, rows, cols,
                                                      flexdiag__wq4_row_bytes(cols), vec);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
