/*
 * cuda_common.cuh - what every CUDA op file shares: the stream struct behind the opaque
 * flexdiag_stream, the error-check macros of docs/architecture.md §8 and small device helpers.
 *
 * One flexdiag_stream = one cudaStream_t (non-blocking) + one cuBLAS and one cuBLASLt handle
 * bound to it + one device workspace for the GEMM heuristics (FLEXDIAG_CUDA_WORKSPACE_BYTES,
 * allocated by stream_create; the runtime counts it in the GPU arena). A copy queue
 * (copy_stream_create) is the same struct with only the cudaStream_t: blas, lt and workspace
 * are NULL, so it holds no device memory and takes no compute op. Ops get the stream as
 * their last argument and never synchronise the host, except copy_d2h (the contract says the
 * host buffer is filled on return). A process may hold many streams (one per context, copy
 * streams); nothing here is per process except matmul.cu's GEMM plan cache, which every stream
 * of a device shares under a lock.
 *
 * Errors: FLEXDIAG_CUDA_TRY / FLEXDIAG_CUBLAS_TRY evaluate the expression once and, on failure,
 * go to one slow-path function that records "cuda device D: <statement> failed: <error>" with the
 * function and file:line and returns FLEXDIAG_ERR_CUDA. Debug builds (NDEBUG unset) also
 * synchronise after every launch (FLEXDIAG_CUDA_SYNC_CHECK) so an asynchronous fault is blamed
 * on the kernel that caused it.
 */
#ifndef FLEXDIAG_CUDA_COMMON_CUH
#define FLEXDIAG_CUDA_COMMON_CUH

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CUDA)
#error "kernels/cuda/cuda_common.cuh is private to kernels/cuda/ (docs/architecture.md)"
#endif

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "base/core.h"
#include "kernels/kernels.h"

/* Device workspace per stream for cuBLAS / cuBLASLt: 32 MiB, enough for every Hopper GEMM
 * algorithm the heuristic returns at our shapes (cuBLAS recommends 32 MiB on sm_90). */
#define FLEXDIAG_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)

/* Threads per CTA for the elementwise / row kernels. */
#define FLEXDIAG_CUDA_BLOCK 256

/* Cap on the blocks we launch in x (about 2M, far below maxGridSize.x = 2^31-1): work beyond it
 * is covered by the kernels' grid-stride loops, so no launch depends on the size limit. */
#define FLEXDIAG_CUDA_MAX_GRID (65535u * 32u)

struct flexdiag_stream {
    cudaStream_t stream;    /* non-blocking stream all ops of this queue run on */
    cublasHandle_t blas;    /* cuBLAS handle bound to stream, workspace set (NULL: copy queue) */
    cublasLtHandle_t lt;    /* cuBLASLt handle (GEMMs with epilogues) (NULL: copy queue) */
    void *workspace;        /* device, workspace_bytes, shared by blas and lt (NULL: copy queue) */
    size_t workspace_bytes; /* FLEXDIAG_CUDA_WORKSPACE_BYTES (0: copy queue) */
    int device;             /* CUDA ordinal; ops run with this device current */
    int sm_count;           /* multiprocessors of device (grid sizing) */
};

#ifdef __cplusplus
extern "C" {
#endif

/* Record "cuda device D: stmt failed: <cudaGetErrorString(e)> (func file:line)", clear the
 * non-sticky last error and return FLEXDIAG_ERR_CUDA (OOM_DEVICE for cudaErrorMemoryAllocation,
 * UNSUPPORTED for no device / an old driver). */
flexdiag_status flexdiag__cuda_fail(cudaError_t e, const char *stmt, const char *func,
                                    const char *file, int line);
/* Same for a cuBLAS / cuBLASLt status (cublasGetStatusString). */
flexdiag_status flexdiag__cublas_fail(cublasStatus_t e, const char *stmt, const char *func,
                                      const char *file, int line);

#ifdef __cplusplus
}
#endif

#define FLEXDIAG_CUDA_TRY(expr)                                                                    \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return flexdiag__cuda_fail(e_, #expr, __func__, __FILE__, __LINE__);                   \
    } while (0)

#define FLEXDIAG_CUBLAS_TRY(expr)                                                                  \
    do {                                                                                           \
        cublasStatus_t e_ = (expr);                                                                \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return flexdiag__cublas_fail(e_, #expr, __func__, __FILE__, __LINE__);                 \
    } while (0)

/* Launch check for the end of every launcher; in debug builds also waits for the stream so a
 * fault is reported by the kernel that caused it. */
#ifndef NDEBUG
#define FLEXDIAG_CUDA_SYNC_CHECK(st) FLEXDIAG_CUDA_TRY(cudaStreamSynchronize(st))
#else
#define FLEXDIAG_CUDA_SYNC_CHECK(st) ((void)0)
#endif
#define FLEXDIAG_CUDA_LAUNCH_CHECK(st)                                                             \
    do {                                                                                           \
        FLEXDIAG_CUDA_TRY(cudaGetLastError());                                                     \
        FLEXDIAG_CUDA_SYNC_CHECK(st);                                                              \
    } while (0)

/* The CUDA stream of s; NULL means the legacy default stream. */
static inline cudaStream_t flexdiag__cuda_st(const flexdiag_stream *s) {
    return s ? s->stream : (cudaStream_t)0;
}

/* ---- device helpers ---- */

/* x rounded up to a multiple of 256 bytes (carving aligned regions out of a workspace). */
static inline size_t flexdiag__round256(size_t x) { return (x + 255) / 256 * 256; }

/* p allows 16-byte vector accesses. */
static __host__ __device__ __forceinline__ bool flexdiag__aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

/* Threads of a one-block-per-row kernel over d bf16 values read four at a time (rmsnorm,
 * layernorm): whole warps, at least one, at most FLEXDIAG_CUDA_BLOCK. */
static inline int64_t flexdiag__cuda_row_threads(int64_t d) {
    int64_t t = (d / 4 + 31) / 32 * 32;
    return t < 32 ? 32 : t > FLEXDIAG_CUDA_BLOCK ? FLEXDIAG_CUDA_BLOCK : t;
}

/* Blocks for `work` items at `per_block` items each, capped (kernels use grid-stride loops). */
static inline unsigned flexdiag__cuda_blocks(int64_t work, int64_t per_block) {
    int64_t b = (work + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > (int64_t)FLEXDIAG_CUDA_MAX_GRID) b = (int64_t)FLEXDIAG_CUDA_MAX_GRID;
    return (unsigned)b;
}

/* The step of list i of a device-resident policy op (kernels.h flexdiag_list_steps): its
 * sequence's entry of st.t, in device memory. */
static __device__ __forceinline__ int32_t flexdiag__cuda_list_step(const flexdiag_list_steps &st,
                                                                  int64_t i) {
    return __ldg(st.t + (i / st.per_seq) % st.n_seq);
}

/* Host-side check of the steps of a policy op (op names it in the message) over n_lists lists:
 * with lists to plan, st must point at the steps, n_seq >= 1 and per_seq >= 1. */
static inline flexdiag_status flexdiag__cuda_steps_check(const char *op,
                                                         const flexdiag_list_steps &st,
                                                         int64_t n_lists) {
    if (n_lists > 0 && (!st.t || st.n_seq < 1 || st.per_seq < 1))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda %s: steps t %s, n_seq %d, per_seq %d: need the device steps, "
                             "n_seq >= 1 and per_seq >= 1", op, st.t ? "set" : "NULL",
                             (int)st.n_seq, (int)st.per_seq);
    return FLEXDIAG_OK;
}

/* Sum of v over the CTA (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * red must hold 32 floats; the call contains __syncthreads() and may be repeated. */
static __device__ __forceinline__ float flexdiag__block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif /* FLEXDIAG_CUDA_COMMON_CUH */
