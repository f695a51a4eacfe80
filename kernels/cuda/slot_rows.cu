/*
 * slot_rows.cu - copy_h2d_slots_async: the ring rows a decode attention reads, gathered by the
 * device straight out of pinned host memory (kernels.h flexdiag_slot_rows).
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
