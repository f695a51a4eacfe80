/*
 * slot_rows.cu - copies the device reads straight out of pinned host memory: copy_h2d_slots_async
 * (the ring rows a decode attention reads, kernels.h flexdiag_slot_rows) and the strided rows of
 * copy_h2d_2d_async (flexdiag__cuda_gather_2d, called by mem.cu).
 *
 * The KV home of a host-homed micro-batch has the device layout, and the slot lists the policy
 * planned are already in device memory, so no host thread has to read them back and gather:
 * one kernel reads each listed row of src over the bus (mapped pinned memory) and writes it to
 * the same offset of dst. A CTA takes one (sequence, KV head) block at a time (grid-stride);
 * its threads stride over the block's listed rows in 16-byte vectors, each thread issuing
 * UNROLL loads before its stores so that enough reads are in flight to cover the bus latency
 * (a 256-byte row is 16 vectors; 128 threads × 4 cover 32 rows per pass).
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#define SLOT_ROWS_THREADS 128
#define SLOT_ROWS_UNROLL 4
#define GATHER_CTAS 32     /* see flexdiag__cuda_gather_2d */
#define GATHER_THREADS 256
#define GATHER_UNROLL 8

/* dst/src in 16-byte vectors: block b starts at b·pitch, its ring at off, row r at off + r·rv. */
static __global__ void slot_rows_kernel(uint4 *__restrict__ dst, const uint4 *__restrict__ src,
                                        size_t pitch, size_t off, int32_t rv,
                                        const int32_t *__restrict__ slots,
                                        const int32_t *__restrict__ n_slots, int32_t max_slots,
                                        int32_t n_blk) {
    for (int32_t b = blockIdx.x; b < n_blk; b += gridDim.x) {
        const int32_t *sl = slots + (size_t)b * (size_t)max_slots;
        const size_t base = (size_t)b * pitch + off;
        const int32_t total = n_slots[b] * rv;
        for (int32_t f0 = threadIdx.x; f0 < total; f0 += blockDim.x * SLOT_ROWS_UNROLL) {
            uint4 v[SLOT_ROWS_UNROLL];
            size_t o[SLOT_ROWS_UNROLL];
#pragma unroll
            for (int u = 0; u < SLOT_ROWS_UNROLL; u++) {
                const int32_t f = f0 + u * (int32_t)blockDim.x;
                if (f < total) {
                    o[u] = base + (size_t)sl[f / rv] * (size_t)rv + (size_t)(f % rv);
                    v[u] = src[o[u]];
                }
            }
#pragma unroll
            for (int u = 0; u < SLOT_ROWS_UNROLL; u++)
                if (f0 + u * (int32_t)blockDim.x < total) dst[o[u]] = v[u];
        }
    }
}

extern "C" flexdiag_status flexdiag__cuda_copy_slots(const flexdiag_slot_rows *r,
                                                     flexdiag_stream *s) {
    if (r->n_seq <= 0 || r->h_kv <= 0) return FLEXDIAG_OK;
    if (!r->dst || !r->src || !r->slots || !r->n_slots || r->max_slots <= 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda slot-row copy: a pointer is NULL or max_slots is 0");
    if (r->row_bytes == 0 || r->row_bytes % 16 || r->pitch % 16 || r->ring_off % 16 ||
        !flexdiag__aligned16(r->dst) || !flexdiag__aligned16(r->src))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "cuda slot-row copy: rows of %zu bytes, pitch %zu, ring offset %zu: "
                             "needs multiples of 16 bytes and 16-byte aligned buffers",
                             r->row_bytes, r->pitch, r->ring_off);
    void *dsrc = NULL;
    if (cudaHostGetDevicePointer(&dsrc, const_cast<void *>(r->src), 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "cuda slot-row copy: the source is not mapped pinned host memory "
                             "(host_alloc or host_register it)");
    }
    const int32_t n_blk = r->n_seq * r->h_kv;
    const unsigned blocks = flexdiag__cuda_blocks(n_blk, 1);
    cudaStream_t st = flexdiag__cuda_st(s);
    slot_rows_kernel<<<blocks, SLOT_ROWS_THREADS, 0, st>>>(
        (uint4 *)r->dst, (const uint4 *)dsrc, r->pitch / 16, r->ring_off / 16,
        (int32_t)(r->row_bytes / 16), r->slots, r->n_slots, r->max_slots, n_blk);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* ---- strided rows ----
 * A KV home's load is `rows` rows of `width` bytes every `pitch` bytes (one per (sequence, KV
 * head) block). The copy engine moves such a 2-D copy at the link's rate on an idle device but
 * at about 60 % of it while the decode's GEMMs stream the weights from HBM (H200: a 1024-row
 * copy of 17 KB rows beside a forward reading 467 MB went from 50.7 to 34.5 GB/s; a 1-D copy of
 * the same bytes kept 51.0; cudaMemcpy3DBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute
 * was the 2-D figure again). A few CTAs reading the mapped pinned source themselves kept
 * 46.4 GB/s beside that forward (32 CTAs; 132 gave 42.7), so the device gathers. Every thread
 * strides over the copy's 16-byte vectors, GATHER_UNROLL loads in flight before its stores. */
static __global__ void gather_2d_kernel(uint4 *__restrict__ dst, const uint4 *__restrict__ src,
                                        size_t dpitch, size_t spitch, int64_t rv, int64_t total) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t f0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f0 < total;
         f0 += stride * GATHER_UNROLL) {
        uint4 v[GATHER_UNROLL];
#pragma unroll
        for (int u = 0; u < GATHER_UNROLL; u++) {
            const int64_t f = f0 + u * stride;
            if (f < total) v[u] = src[(size_t)(f / rv) * spitch + (size_t)(f % rv)];
        }
#pragma unroll
        for (int u = 0; u < GATHER_UNROLL; u++) {
            const int64_t f = f0 + u * stride;
            if (f < total) dst[(size_t)(f / rv) * dpitch + (size_t)(f % rv)] = v[u];
        }
    }
}

extern "C" int flexdiag__cuda_gather_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t rows, flexdiag_stream *s) {
    if (width % 16 || dpitch % 16 || spitch % 16 || !flexdiag__aligned16(dst) ||
        !flexdiag__aligned16(src))
        return 0;
    void *dsrc = NULL;
    if (cudaHostGetDevicePointer(&dsrc, const_cast<void *>(src), 0) != cudaSuccess) {
        (void)cudaGetLastError(); /* not mapped pinned memory: the copy engine's turn */
        return 0;
    }
    const int64_t rv = (int64_t)(width / 16), total = rv * (int64_t)rows;
    const unsigned blocks = flexdiag__cuda_blocks(total, GATHER_THREADS) < GATHER_CTAS
                                ? flexdiag__cuda_blocks(total, GATHER_THREADS)
                                : GATHER_CTAS;
    gather_2d_kernel<<<blocks, GATHER_THREADS, 0, flexdiag__cuda_st(s)>>>((uint4 *)dst, (const uint4 *)dsrc,
                                                        dpitch / 16, spitch / 16, rv, total);
    return 1;
}
