/*
 * attn.cuh - launchers of the CUDA attention ops: KV-cache append, causal prompt attention
 * (prefill) and single-query decode attention over the policy's slot lists.
 *
 * The op table (kernels_cuda.cu) points its kv_append / attn_prefill / attn_decode entries at
 * these functions, declared with those entries' kernels.h op types; the kernels live in
 * kv_append.cu, attn_prefill.cu and attn_decode.cu. All tensors are bf16 device buffers laid
 * out as kernels.h describes (qkv rows, KV-cache blocks of p_cap prompt rows then `ring` decode
 * rows per (sequence, KV head)); math is fp32. The launchers check shapes on the host, enqueue
 * on s->stream and never synchronise.
 */
#ifndef FLEXDIAG_CUDA_ATTN_CUH
#define FLEXDIAG_CUDA_ATTN_CUH

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CUDA)
#error "kernels/cuda/attn.cuh is private to kernels/cuda/ (docs/architecture.md)"
#endif

#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kernels.h kv_append: copy K and V of n_tok tokens (bf16, exact) into cache rows
 * rows[i·h_kv + h]; token i belongs to sequence i / tok_per_seq. With a->pos set, RoPE first
 * rotates the q and k heads of qkv in place (one fused kernel, one CTA per token). */
flexdiag_op_kv_append flexdiag__cuda_kv_append;

/* kernels.h attn_prefill: causal attention of every prompt row over the cached prompt rows
 * 0..r; rows r >= lp[s] of out are zeros. Tiled, online softmax in fp32. */
flexdiag_op_attn_prefill flexdiag__cuda_attn_prefill;

/* Query heads one decode CTA serves at most; the fused Diagonal update needs the whole group in
 * one CTA, so it is the table's diag_max_group. */
#define FLEXDIAG__CUDA_DEC_MAX_G 8

/* kernels.h attn_decode: one query per sequence (win of them in a window pass, kernels.h win)
 * over prompt rows 0..lp-1 and the ring rows of the slot lists; one CTA per (query row, KV head)
 * serves all its query heads. Fills logits_out / lse_out / probs_out when given; applies the
 * Diagonal update (diag_lag, win 1 only). */
flexdiag_op_attn_decode flexdiag__cuda_attn_decode;

/* ---- shared by the attention .cu files ---- */

/* Host-side checks of a, s and the 16-byte alignment of the given device pointers (NULL entries
 * skipped) for op (a name used in messages). attn != 0 also requires a d_h the attention kernels
 * are built for. Returns FLEXDIAG_OK or FLEXDIAG_ERR_INVALID_ARG / _UNSUPPORTED with a message. */
flexdiag_status flexdiag__cuda_attn_check(const char *op, const flexdiag_attn_args *a,
                                          const flexdiag_stream *s, int attn, const void *p0,
                                          const void *p1, const void *p2, const void *p3);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_CUDA_ATTN_CUH */
