/*
 * cuda_ops.cuh - host launchers of the CUDA op table except attention (attn.cuh has those).
 *
 * Each launcher implements one kernels.h entry and is declared with that entry's op type
 * (flexdiag_op_<op>: outputs first, then inputs, sizes, the flexdiag_stream last) so
 * kernels_cuda.cu can point the table straight at it. Activations are bf16 (__nv_bfloat16 on
 * the device, uint16_t bit patterns on the host), except the image decoder's, which are fp32
 * (kernels.h); math is fp32; bf16 results are rounded to nearest even. Launchers validate sizes
 * on the host (FLEXDIAG_ERR_INVALID_ARG naming the op and the value), enqueue on the stream,
 * never synchronise the host (copy_d2h excepted) and end with a launch check.
 *
 * Files: mem.cu (streams, memory, copies, graphs, page-locked staging, host registration),
 * event.cu (events), convert.cu, gather.cu (embed + gather_rows: both are row gathers),
 * pos_embed.cu, rmsnorm.cu, layernorm.cu, qk_norm.cu, swiglu.cu, gelu.cu, relu.cu, matmul.cu
 * (cuBLASLt / cuBLAS), cfg.cu, sample.cu,
 * diag_policy.cu (device Diagonal policy), slot_rows.cu (copies the device reads out of pinned
 * host memory), conv2d.cu and vq_ops.cu (VQ image decoder). RoPE is
 * fused into kv_append (attn.cuh).
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
flexdiag_op_stream_create flexdiag__cuda_stream_create;
/* Wait for s, then free its handles and workspace; NULL is a no-op. */
flexdiag_op_stream_destroy flexdiag__cuda_stream_destroy;
/* cudaStreamSynchronize. */
flexdiag_op_stream_sync flexdiag__cuda_stream_sync;
/* A non-blocking stream on device (made current) without cuBLAS handles or workspace: copies,
 * memset0 and events only; errors as stream_create. */
flexdiag_op_copy_stream_create flexdiag__cuda_copy_stream_create;
/* cudaMalloc (256-byte aligned); bytes == 0 gives NULL; OOM_DEVICE names asked and free bytes. */
flexdiag_op_mem_alloc flexdiag__cuda_mem_alloc;
/* cudaFree; NULL is a no-op; a failure is logged (nothing to return it to). */
flexdiag_op_mem_free flexdiag__cuda_mem_free;
/* CUDA graph capture of one stream's work (stream capture, instantiate, replay, destroy). */
flexdiag_op_graph_begin flexdiag__cuda_graph_begin;
flexdiag_op_graph_end flexdiag__cuda_graph_end;
flexdiag_op_graph_launch flexdiag__cuda_graph_launch;
flexdiag_op_graph_destroy flexdiag__cuda_graph_destroy;
/* Page-locked host memory (cudaHostAlloc) and its release. */
flexdiag_op_host_alloc flexdiag__cuda_host_alloc;
flexdiag_op_host_free flexdiag__cuda_host_free;
/* cudaHostRegister (cudaHostRegisterDefault) of caller memory: OOM_PINNED naming the bytes when
 * the driver or the locked-memory limit refuses, INVALID_ARG when p is already registered. */
flexdiag_op_host_register flexdiag__cuda_host_register;
/* cudaHostUnregister. */
flexdiag_op_host_unregister flexdiag__cuda_host_unregister;
/* cudaMemGetInfo of the current device. */
flexdiag_op_mem_info flexdiag__cuda_mem_info;
flexdiag_op_device_name flexdiag__cuda_device_name;
/* cudaDeviceGetPCIBusId of device ("0000:41:00.0"); INVALID_ARG when out cannot hold it. */
flexdiag_op_pci_bus_id flexdiag__cuda_pci_bus_id;
/* cudaGetDeviceCount, 0 on any error (no driver, none visible). */
flexdiag_op_device_count flexdiag__cuda_device_count;
/* Host (pageable or pinned) to device, ordered on s: cudaMemcpyAsync, which never waits for a
 * pinned source, so it is both copy_h2d and copy_h2d_async. */
flexdiag_op_copy flexdiag__cuda_copy_h2d;
/* Device to host, ordered on s; dst holds the data when the call returns (syncs s). */
flexdiag_op_copy flexdiag__cuda_copy_d2h;
/* Device to host, ordered on s, no host sync (copy_d2h_async). */
flexdiag_op_copy flexdiag__cuda_copy_d2h_async;
flexdiag_op_copy_2d flexdiag__cuda_copy_h2d_2d;
/* The strided rows of a host -> device 2-D copy gathered by a kernel reading mapped pinned src
 * (slot_rows.cu); 0 when src is not mapped pinned memory or a size is not a multiple of 16
 * bytes (the caller then uses the copy engine), 1 once queued on s. */
int flexdiag__cuda_gather_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                             size_t width, size_t rows, flexdiag_stream *s);
flexdiag_op_copy_2d flexdiag__cuda_copy_d2h_2d;
/* Attended ring rows out of mapped pinned host memory (slot_rows.cu). */
flexdiag_op_copy_h2d_slots flexdiag__cuda_copy_slots;
/* Device to device, ordered on s. */
flexdiag_op_copy flexdiag__cuda_copy_d2d;
/* Zero bytes of device memory, ordered on s. */
flexdiag_op_memset0 flexdiag__cuda_memset0;
/* fn(arg) on a driver thread when s gets there (cudaLaunchHostFunc). */
flexdiag_op_host_fn flexdiag__cuda_host_fn;

/* ---- events (event.cu): cudaEvent_t without timing; contracts in kernels.h ---- */

/* cudaEventCreateWithFlags(cudaEventDisableTiming) on s's device (the current one for NULL s);
 * the calling thread's current device is left as it was. */
flexdiag_op_event_create flexdiag__cuda_event_create;
flexdiag_op_event_destroy flexdiag__cuda_event_destroy;
/* cudaEventRecord on s (captured when s is being captured into a graph). */
flexdiag_op_event_record flexdiag__cuda_event_record;
/* cudaStreamWaitEvent; while s is being captured, an event last recorded outside the capture
 * is waited on as an external event node (cudaEventWaitExternal). */
flexdiag_op_stream_wait_event flexdiag__cuda_stream_wait_event;
/* cudaEventSynchronize. */
flexdiag_op_event_sync flexdiag__cuda_event_sync;
/* cudaEventQuery: cudaSuccess is done, cudaErrorNotReady not done, anything else an error. */
flexdiag_op_event_query flexdiag__cuda_event_query;

/* ---- conversions (convert.cu) ---- */

/* out (n) f32 <- in (n) bf16. */
flexdiag_op_act_to_f32 flexdiag__cuda_act_to_f32;
/* out (n) bf16 <- in (n) f32, round to nearest even. */
flexdiag_op_act_from_f32 flexdiag__cuda_act_from_f32;

/* ---- row and elementwise ops ---- */

/* embed (gather.cu): out (n, d) bf16 row i = table[ids[i / rep]]; ids are trusted (the
 * runtime validates them against V). */
flexdiag_op_embed flexdiag__cuda_embed;
/* gather_rows (gather.cu): out (n, d) = in rows idx (n); idx trusted. */
flexdiag_op_gather_rows flexdiag__cuda_gather_rows;
/* pos_embed.cu: x (n, d) bf16 += table[pos[i] + offset], fp32 sum, one rounding; positions
 * trusted (kernels.h). */
flexdiag_op_pos_embed_add flexdiag__cuda_pos_embed_add;
/* rmsnorm.cu: out (n, d) = bf16(bf16(x / sqrt(mean(x²) + eps)) · w), statistic fp32. */
flexdiag_op_rmsnorm flexdiag__cuda_rmsnorm;
/* layernorm.cu: out (n, d) = bf16((x − mean) / sqrt(var + eps) · w + b), two-pass fp32
 * statistics, one rounding; out may be x. */
flexdiag_op_layernorm flexdiag__cuda_layernorm;
/* qk_norm.cu: each q and k head of qkv (n, (h_q + 2·h_kv)·d_h) in place = bf16((x − mean) /
 * sqrt(var + eps) · w[r] + b[r]), two-pass fp32 statistics, one rounding; one warp per head, so
 * d_h <= 256 (INVALID_ARG beyond). */
flexdiag_op_qk_norm flexdiag__cuda_qk_norm;
/* swiglu.cu: out (n, f) = silu(gu[:, :f]) ⊙ gu[:, f:], fp32 math, one rounding. */
flexdiag_op_swiglu flexdiag__cuda_swiglu;
/* wq4.cu: 4-bit group weights to bf16 (kernels/cpu/wq4.c is the reference). */
flexdiag_op_wq4_unpack flexdiag__cuda_wq4_unpack;
/* gelu.cu: x (n) in place, 0.5·x·(1 + erf(x/√2)). */
flexdiag_op_gelu flexdiag__cuda_gelu;
/* relu.cu: x (n) in place, negative values to +0 (±0 and NaN untouched). */
flexdiag_op_relu flexdiag__cuda_relu;

/* ---- GEMM (matmul.cu) ---- */

/* out (n, m) (+)= x (n, k) · W (m, k)ᵀ + b (m); bf16 or fp32 out per flags; s required. */
flexdiag_op_matmul flexdiag__cuda_matmul;

/* ---- heads and sampling ---- */

/* cfg.cu: out (n_pairs, V) = u + w·(c − u), c = row 2i, u = row 2i+1 of logits. */
flexdiag_op_cfg_combine flexdiag__cuda_cfg_combine;
/* sample.cu: one id per row with the row's own settings (see the file comment); a row holding
 * a non-finite value after the temperature, or with settings out of range, gets id -1, which
 * the runtime detects when it copies the ids back; a row with req < 0 is left as it is. */
flexdiag_op_sample flexdiag__cuda_sample;
/* Device-resident Diagonal policy (diag_policy.cu); contracts in kernels.h. */
flexdiag_op_diag_slots flexdiag__cuda_diag_slots;
/* Device-resident H2O / TOVA (evict_policy.cu); contracts in kernels.h. */
flexdiag_op_evict_plan flexdiag__cuda_evict_plan;
flexdiag_op_evict_update flexdiag__cuda_evict_update;
/* Device-resident ALISA (alisa_policy.cu); contracts in kernels.h. */
flexdiag_op_alisa_plan flexdiag__cuda_alisa_plan;
flexdiag_op_alisa_update flexdiag__cuda_alisa_update;
/* ---- image decoder, VQ-16 (conv2d.cu, vq_ops.cu); contracts in kernels.h; activations
 * f32 ---- */

/* conv2d.cu: k×k conv (stride 1, zero padding) as cuBLAS GEMMs over bf16 im2col chunks in the
 * stream workspace, fp32 out; bias inside the fp32 sum; s required. */
flexdiag_op_conv2d flexdiag__cuda_conv2d;
/* conv2d.cu: point s's cuBLAS handle at the workspace bytes from offset on (offset 0: all of
 * it, the state stream_create leaves), so an op can keep the head for its own scratch. */
flexdiag_status flexdiag__cuda_blas_ws_tail(flexdiag_stream *s, size_t offset);
/* vq_ops.cu: out (n, c, hw) f32 = codebook (V, c) f32 rows ids (n·hw, trusted). */
flexdiag_op_vq_lookup flexdiag__cuda_vq_lookup;
/* vq_ops.cu: GroupNorm (+ swish), sliced fp32 statistics merged in double; s required. */
flexdiag_op_groupnorm flexdiag__cuda_groupnorm;
/* vq_ops.cu: nearest-neighbour ×2 of x (n, c, h, wd). */
flexdiag_op_upsample2x flexdiag__cuda_upsample2x;
/* vq_ops.cu: single-head attention over hw positions, fp32 GEMMs and softmax; s required. */
flexdiag_op_attn_spatial flexdiag__cuda_attn_spatial;
/* vq_ops.cu: out (n, hw, c) f32 = x (n, c, hw) f32. */
flexdiag_op_to_nhwc flexdiag__cuda_to_nhwc;

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_CUDA_OPS_CUH */
