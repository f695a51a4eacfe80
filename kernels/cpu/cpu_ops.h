/*
 * cpu_ops.h - declarations of the CPU ops (private to kernels/cpu) that the two tables in
 * kernels_cpu.c point at. Shapes, layouts and semantics are those of kernels.h; the comments
 * here only add what is specific to the CPU implementations.
 *
 * Files: ref_mem.c (memory, copies), ref_elementwise.c (conversions, embed, rmsnorm, rope,
 * swiglu, gelu, gather), ref_matmul.c, ref_attn.c (KV append with optional RoPE, attention,
 * argument checks), ref_sample.c (CFG, sampling) are the scalar oracle; fast_matmul.c and
 * fast_attn.c are the multi-threaded replacements of the "cpu" table. ref_policy.c (Diagonal
 * slot lists, the decode epilogue) is shared by both tables. act is fp32 throughout.
 */
#ifndef FLEXDIAG_CPU_OPS_H
#define FLEXDIAG_CPU_OPS_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CPU)
#error "kernels/cpu/cpu_ops.h is private to kernels/cpu/ (docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* ---- reference ops (ref_*.c); signatures and shapes as in kernels.h ---- */

/* act is fp32 on the CPU: both conversions are copies. */
flexdiag_status flexdiag__cpu_act_to_f32(float *out, const void *in, int64_t n, flexdiag_stream *s);
/* Copy n fp32 values into the fp32 act buffer out. */
flexdiag_status flexdiag__cpu_act_from_f32(void *out, const float *in, int64_t n,
                                           flexdiag_stream *s);
/* out (n, d) = table rows ids[i / rep]; ids must be < V (checked by the runtime). */
flexdiag_status flexdiag__cpu_ref_embed(void *out, const uint16_t *table, const int32_t *ids,
                                        int64_t n, int64_t d, int32_t rep, flexdiag_stream *s);
/* out (n, d) = w ⊙ x / sqrt(mean(x²) + eps). */
flexdiag_status flexdiag__cpu_ref_rmsnorm(void *out, const void *x, const uint16_t *w, int64_t n,
                                          int64_t d, float eps, flexdiag_stream *s);
/* out (n, m) (+)= x (n, k) · W (m, k)ᵀ + b, one sequential fp32 sum per element. */
flexdiag_status flexdiag__cpu_ref_matmul(void *out, const void *x, const uint16_t *w,
                                         const uint16_t *b, int64_t n, int64_t k, int64_t m,
                                         unsigned flags, flexdiag_stream *s);
/* Rotate-half RoPE in place on n_heads heads of d_h from column col0 of the n rows of x
 * (stride elements apart), row i at position pos[i]; not a table slot: kv_append calls it when
 * its args carry positions. */
flexdiag_status flexdiag__cpu_ref_rope(void *x, const int32_t *pos, int64_t n, int64_t stride,
                                       int64_t col0, int32_t n_heads, int32_t d_h, float theta,
                                       flexdiag_stream *s);
/* out (n, f) = silu(gate) ⊙ up of gu (n, 2f). */
flexdiag_status flexdiag__cpu_ref_swiglu(void *out, const void *gu, int64_t n, int64_t f,
                                         flexdiag_stream *s);
/* Exact (erf) GELU of x (n) in place. */
flexdiag_status flexdiag__cpu_ref_gelu(void *x, int64_t n, flexdiag_stream *s);
/* out (n, d) = in rows idx (n). */
flexdiag_status flexdiag__cpu_ref_gather_rows(void *out, const void *in, const int32_t *idx,
                                              int64_t n, int64_t d, flexdiag_stream *s);
/* Copy K and V of n_tok tokens of qkv into the cache rows given by rows, after rotating the q
 * and k heads of qkv in place when a->pos is set. */
flexdiag_status flexdiag__cpu_ref_kv_append(void *k, void *v, void *qkv, const int32_t *rows,
                                            int64_t n_tok, int32_t tok_per_seq,
                                            const flexdiag_attn_args *a, flexdiag_stream *s);
/* Causal prompt attention, three-pass softmax per query row. */
flexdiag_status flexdiag__cpu_ref_attn_prefill(void *out, const void *qkv, const void *k,
                                               const void *v, const flexdiag_attn_args *a,
                                               flexdiag_stream *s);
/* Decode attention over prompt + slot-listed ring rows, three-pass softmax per query head. */
flexdiag_status flexdiag__cpu_ref_attn_decode(void *out, const void *qkv, const void *k,
                                              const void *v, const flexdiag_attn_args *a,
                                              flexdiag_stream *s);
/* out (n_pairs, V) = u + w·(c − u) of logits rows (2i, 2i+1). */
flexdiag_status flexdiag__cpu_ref_cfg_combine(float *out, const float *logits, int64_t n_pairs,
                                              int64_t V, float w, flexdiag_stream *s);
/* Temperature / top-k / top-p sampling keyed by (seed, req0 + i, step). */
flexdiag_status flexdiag__cpu_ref_sample(int32_t *ids, const float *logits, int64_t n, int64_t V,
                                         const flexdiag_sample_params *p, int64_t req0,
                                         int64_t step, flexdiag_stream *s);

/* ---- device-resident Diagonal policy (ref_policy.c; kernels.h diag_slots and the
 * attn_decode epilogue) ---- */
flexdiag_status flexdiag__cpu_diag_slots(int32_t *slots, int32_t *n_slots, int16_t *lag,
                                         int16_t *cnt, int64_t n_lists, int32_t max_slots,
                                         int32_t a, int32_t t, int32_t n_r, int32_t base,
                                         flexdiag_stream *s);
/* ---- device-resident H2O / TOVA (ref_policy.c; kernels.h evict_plan, evict_update) ---- */
flexdiag_status flexdiag__cpu_evict_plan(int32_t *rows, int32_t *pos, float *acc,
                                         const int32_t *free_slot, int64_t n_lists,
                                         int32_t rows_per_list, int32_t n_att, int32_t t,
                                         int32_t p_cap, flexdiag_stream *s);
flexdiag_status flexdiag__cpu_evict_update(int32_t *free_slot, float *acc, const int32_t *pos,
                                           const float *probs, int64_t n_lists, int32_t heads,
                                           int32_t max_slots, int32_t n_att, int32_t t,
                                           flexdiag_stream *s);
/* ---- device-resident ALISA (ref_policy.c; kernels.h alisa_plan, alisa_update) ---- */
flexdiag_status flexdiag__cpu_alisa_plan(int32_t *slots, int32_t *n_slots, int32_t *rec_pos,
                                         float *rec_p, int32_t *rec_n, float *score,
                                         uint64_t *keys, int64_t n_lists, int32_t copies,
                                         int32_t max_slots, int32_t n_att, int32_t l_dec,
                                         int32_t t, flexdiag_stream *s);
flexdiag_status flexdiag__cpu_alisa_update(float *rec_p, const int32_t *rec_n, const float *probs,
                                           int64_t n_lists, int32_t heads, int32_t max_slots,
                                           int32_t n_att, int32_t t, flexdiag_stream *s);
/* Decode epilogue of the group (sequence s, KV head h), after its attention: z holds the
 * group's g = h_q/h_kv rows of ring logits (z_stride floats apart, column = slot-list index,
 * n_slots of the group's list valid), lse its g log-sum-exps (both borrowed). Writes the
 * group's probs_out rows when a->probs_out is set and applies the Diagonal update to list
 * (s, h) when a->diag_lag is set (kernels.h flexdiag_attn_args); arguments already checked. */
void flexdiag__cpu_decode_scores(const flexdiag_attn_args *a, int64_t s, int32_t h,
                                 const float *z, int64_t z_stride, const float *lse);

/* Validate matmul sizes, flags and pointers for op; INVALID_ARG naming the problem otherwise. */
flexdiag_status flexdiag__cpu_matmul_check(const char *op, const void *out, const void *x,
                                           const uint16_t *w, int64_t n, int64_t k, int64_t m,
                                           unsigned flags);
/* Validate the attention arguments of op (lp, and for decode the slot lists) before any access;
 * INVALID_ARG naming the field otherwise. */
flexdiag_status flexdiag__cpu_attn_check(const char *op, const void *out, const void *qkv,
                                         const void *k, const void *v, const flexdiag_attn_args *a,
                                         int decode);

/* ---- fast multi-threaded ops (fast_matmul.c, fast_attn.c) ---- */

/* Cache-blocked matmul parallel over output tiles; bit-identical for any thread count. */
flexdiag_status flexdiag__cpu_fast_matmul(void *out, const void *x, const uint16_t *w,
                                          const uint16_t *b, int64_t n, int64_t k, int64_t m,
                                          unsigned flags, flexdiag_stream *s);
/* Prompt attention parallel over (sequence, query head), online softmax. */
flexdiag_status flexdiag__cpu_fast_attn_prefill(void *out, const void *qkv, const void *k,
                                                const void *v, const flexdiag_attn_args *a,
                                                flexdiag_stream *s);
/* Decode attention parallel over (sequence, KV head), all g query heads per task. */
flexdiag_status flexdiag__cpu_fast_attn_decode(void *out, const void *qkv, const void *k,
                                               const void *v, const flexdiag_attn_args *a,
                                               flexdiag_stream *s);

#endif /* FLEXDIAG_CPU_OPS_H */
