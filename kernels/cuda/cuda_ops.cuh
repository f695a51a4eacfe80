/*
 * cuda_ops.cuh - host launchers of the CUDA op table except attention (attn.cuh has those).
 *
 * Each launcher implements one kernels.h entry with the same signature (outputs first, then
 * inputs, sizes, the flexdiag_stream last) so kernels_cuda.cu can point the table straight at
 * it. Activations are bf16 (__nv_bfloat16 on the device, uint16_t bit patterns on the host),
 * except the image decoder's, which are fp32 (kernels.h); math is fp32; bf16 results are
 * rounded to nearest even. Launchers validate sizes on the host
 * (FLEXDIAG_ERR_INVALID_ARG naming the op and the value), enqueue on the stream, never
 * synchronise the host (copy_d2h excepted) and end with a launch check.
 *
 * Files: mem.cu (streams, memory, copies, graphs, page-locked staging), convert.cu, gather.cu
 * (embed + gather_rows: both are row gathers), rmsnorm.cu, swiglu.cu, gelu.cu, matmul.cu
 * (cuBLASLt / cuBLAS), cfg.cu, sample.cu, diag_policy.cu (device Diagonal policy), conv2d.cu
 * and vq_ops.cu (VQ image decoder). RoPE is fused into kv_append (attn.cuh).
 */
#ifndef FLEXDIAG_CUDA_OPS_CUH
#define FLEXDIAG_CUDA_OPS_CUH

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CUDA)
#error "kernels/cuda/cuda_ops.cuh is private to kernels/cuda/ (docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- streams and memory (mem.cu) ---- */

/* Stream + cuBLAS/cuBLASLt handles + 32 MiB workspace on device (made current); threads is
 * ignored. UNSUPPORTED without a usable device, ERR_CUDA for a bad ordinal. */
flexdiag_status flexdiag__cuda_stream_create(int device, int threads, flexdiag_stream **out);
/* Wait for s, then free its handles, workspace and GEMM plans; NULL is a no-op. */
void flexdiag__cuda_stream_destroy(flexdiag_stream *s);
/* cudaStreamSynchronize. */
flexdiag_status flexdiag__cuda_stream_sync(flexdiag_stream *s);
/* cudaMalloc (256-byte aligned); bytes == 0 gives NULL; OOM_DEVICE names asked and free bytes. */
flexdiag_status flexdiag__cuda_mem_alloc(size_t bytes, void **out);
/* cudaFree; NULL is a no-op; a failure is logged (nothing to return it to). */
void flexdiag__cuda_mem_free(void *p);
/* CUDA graph capture of one stream's work (stream capture, instantiate, replay, destroy). */
flexdiag_status flexdiag__cuda_graph_begin(flexdiag_stream *s);
flexdiag_status flexdiag__cuda_graph_end(flexdiag_stream *s, void **graph);
flexdiag_status flexdiag__cuda_graph_launch(void *graph, flexdiag_stream *s);
void flexdiag__cuda_graph_destroy(void *graph);
/* Page-locked host memory (cudaHostAlloc) and its release. */
flexdiag_status flexdiag__cuda_host_alloc(size_t bytes, void **out);
void flexdiag__cuda_host_free(void *p);
/* cudaMemGetInfo of the current device. */
flexdiag_status flexdiag__cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
void flexdiag__cuda_device_name(const flexdiag_stream *s, char *out, size_t n);
/* Host (pageable or pinned) to device, ordered on s. */
flexdiag_status flexdiag__cuda_copy_h2d(void *dst, const void *src, size_t bytes,
                                        flexdiag_stream *s);
/* Device to host, ordered on s; dst holds the data when the call returns (syncs s). */
flexdiag_status flexdiag__cuda_copy_d2h(void *dst, const void *src, size_t bytes,
                                        flexdiag_stream *s);
/* Device to device, ordered on s. */
flexdiag_status flexdiag__cuda_copy_d2d(void *dst, const void *src, size_t bytes,
                                        flexdiag_stream *s);
/* Zero bytes of device memory, ordered on s. */
flexdiag_status flexdiag__cuda_memset0(void *dst, size_t bytes, flexdiag_stream *s);

/* ---- conversions (convert.cu) ---- */

/* out (n) f32 <- in (n) bf16. */
flexdiag_status flexdiag__cuda_act_to_f32(float *out, const void *in, int64_t n,
                                          flexdiag_stream *s);
/* out (n) bf16 <- in (n) f32, round to nearest even. */
flexdiag_status flexdiag__cuda_act_from_f32(void *out, const float *in, int64_t n,
                                            flexdiag_stream *s);

/* ---- row and elementwise ops ---- */

/* embed (gather.cu): out (n, d) bf16 row i = table[ids[i / rep]]; ids are trusted (the
 * runtime validates them against V). */
flexdiag_status flexdiag__cuda_embed(void *out, const uint16_t *table, const int32_t *ids,
                                     int64_t n, int64_t d, int32_t rep, flexdiag_stream *s);
/* gather_rows (gather.cu): out (n, d) = in rows idx (n); idx trusted. */
flexdiag_status flexdiag__cuda_gather_rows(void *out, const void *in, const int32_t *idx,
                                           int64_t n, int64_t d, flexdiag_stream *s);
/* rmsnorm.cu: out (n, d) = bf16(bf16(x / sqrt(mean(x²) + eps)) · w), statistic fp32. */
flexdiag_status flexdiag__cuda_rmsnorm(void *out, const void *x, const uint16_t *w, int64_t n,
                                       int64_t d, float eps, flexdiag_stream *s);
/* swiglu.cu: out (n, f) = silu(gu[:, :f]) ⊙ gu[:, f:], fp32 math, one rounding. */
flexdiag_status flexdiag__cuda_swiglu(void *out, const void *gu, int64_t n, int64_t f,
                                      flexdiag_stream *s);
/* gelu.cu: x (n) in place, 0.5·x·(1 + erf(x/√2)). */
flexdiag_status flexdiag__cuda_gelu(void *x, int64_t n, flexdiag_stream *s);

/* ---- GEMM (matmul.cu) ---- */

/* out (n, m) (+)= x (n, k) · W (m, k)ᵀ + b (m); bf16 or fp32 out per flags; s required. */
flexdiag_status flexdiag__cuda_matmul(void *out, const void *x, const uint16_t *w,
                                      const uint16_t *b, int64_t n, int64_t k, int64_t m,
                                      unsigned flags, flexdiag_stream *s);
/* Destroy the GEMM plans cached on s (stream_destroy calls it). */
void flexdiag__cuda_matmul_cache_free(flexdiag_stream *s);

/* ---- heads and sampling ---- */

/* cfg.cu: out (n_pairs, V) = u + w·(c − u), c = row 2i, u = row 2i+1 of logits. */
flexdiag_status flexdiag__cuda_cfg_combine(float *out, const float *logits, int64_t n_pairs,
                                           int64_t V, float w, flexdiag_stream *s);
/* sample.cu: one id per row (see the file comment); a row holding a non-finite value after
 * the temperature gets id -1, which the runtime detects when it copies the ids back. */
flexdiag_status flexdiag__cuda_sample(int32_t *ids, const float *logits, int64_t n, int64_t V,
                                      const flexdiag_sample_params *p, int64_t req0,
                                      int64_t step, flexdiag_stream *s);
/* Device-resident Diagonal policy (diag_policy.cu); contracts in kernels.h. */
flexdiag_status flexdiag__cuda_diag_slots(int32_t *slots, int32_t *n_slots, int16_t *lag,
                                          int16_t *cnt, int64_t n_lists, int32_t max_slots,
                                          int32_t a, int32_t t, int32_t n_r, int32_t base,
                                          flexdiag_stream *s);
/* Device-resident H2O / TOVA (evict_policy.cu); contracts in kernels.h. */
flexdiag_status flexdiag__cuda_evict_plan(int32_t *rows, int32_t *pos, float *acc,
                                          const int32_t *free_slot, int64_t n_lists,
                                          int32_t rows_per_list, int32_t n_att, int32_t t,
                                          int32_t p_cap, flexdiag_stream *s);
flexdiag_status flexdiag__cuda_evict_update(int32_t *free_slot, float *acc, const int32_t *pos,
                                            const float *probs, int64_t n_lists, int32_t heads,
                                            int32_t max_slots, int32_t n_att, int32_t t,
                                            flexdiag_stream *s);
/* Device-resident ALISA (alisa_policy.cu); contracts in kernels.h. */
flexdiag_status flexdiag__cuda_alisa_plan(int32_t *slots, int32_t *n_slots, int32_t *rec_pos,
                                          float *rec_p, int32_t *rec_n, float *score,
                                          uint64_t *keys, int64_t n_lists, int32_t copies,
                                          int32_t max_slots, int32_t n_att, int32_t l_dec,
                                          int32_t t, flexdiag_stream *s);
flexdiag_status flexdiag__cuda_alisa_update(float *rec_p, const int32_t *rec_n,
                                            const float *probs, int64_t n_lists, int32_t heads,
                                            int32_t max_slots, int32_t n_att, int32_t t,
                                            flexdiag_stream *s);
/* ---- image decoder, VQ-16 (conv2d.cu, vq_ops.cu); contracts in kernels.h; activations
 * f32 ---- */

/* conv2d.cu: k×k conv (stride 1, zero padding) as cuBLAS GEMMs over bf16 im2col chunks in the
 * stream workspace, fp32 out; bias inside the fp32 sum; s required. */
flexdiag_status flexdiag__cuda_conv2d(void *out, const void *x, const uint16_t *w,
                                      const uint16_t *b, int64_t n, int32_t cin, int32_t cout,
                                      int32_t h, int32_t wd, int32_t k, unsigned flags,
                                      flexdiag_stream *s);
/* conv2d.cu: point s's cuBLAS handle at the workspace bytes from offset on (offset 0: all of
 * it, the state stream_create leaves), so an op can keep the head for its own scratch. */
flexdiag_status flexdiag__cuda_blas_ws_tail(flexdiag_stream *s, size_t offset);
/* vq_ops.cu: out (n, c, hw) f32 = codebook (V, c) f32 rows ids (n·hw, trusted). */
flexdiag_status flexdiag__cuda_vq_lookup(void *out, const float *codebook, const int32_t *ids,
                                         int64_t n, int32_t c, int32_t hw, flexdiag_stream *s);
/* vq_ops.cu: GroupNorm (+ swish), sliced fp32 statistics merged in double; s required. */
flexdiag_status flexdiag__cuda_groupnorm(void *out, const void *x, const uint16_t *gamma,
                                         const uint16_t *beta, int64_t n, int32_t c, int32_t hw,
                                         int32_t groups, float eps, int32_t swish,
                                         flexdiag_stream *s);
/* vq_ops.cu: nearest-neighbour ×2 of x (n, c, h, wd). */
flexdiag_status flexdiag__cuda_upsample2x(void *out, const void *x, int64_t n, int32_t c,
                                          int32_t h, int32_t wd, flexdiag_stream *s);
/* vq_ops.cu: single-head attention over hw positions, fp32 GEMMs and softmax; s required. */
flexdiag_status flexdiag__cuda_attn_spatial(void *out, const void *q, const void *k,
                                            const void *v, int64_t n, int32_t c, int32_t hw,
                                            flexdiag_stream *s);
/* vq_ops.cu: out (n, hw, c) f32 = x (n, c, hw) f32. */
flexdiag_status flexdiag__cuda_to_nhwc(float *out, const void *x, int64_t n, int32_t c,
                                       int32_t hw, flexdiag_stream *s);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_CUDA_OPS_CUH */
