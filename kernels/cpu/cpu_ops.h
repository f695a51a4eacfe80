/*
 * cpu_ops.h - declarations of the CPU ops (private to kernels/cpu) that the two tables in
 * kernels_cpu.c point at. Each op is declared with its kernels.h op type (flexdiag_op_<op>), so
 * signatures, shapes, layouts and semantics are those of kernels.h; the comments here only add
 * what is specific to the CPU implementations. Streams, events, memory and copies are in
 * cpu_stream.h, the image decoder in ref_vq.h.
 *
 * Files: ref_mem.c (memory, copies), ref_elementwise.c (conversions, embed, pos_embed_add,
 * rmsnorm, layernorm, qk_norm, rope, swiglu, gelu, relu, gather), ref_matmul.c, ref_attn.c (KV
 * append with optional RoPE, attention, argument checks), ref_sample.c (CFG, sampling) are the
 * scalar oracle; fast_matmul.c and fast_attn.c are the multi-threaded replacements of the "cpu"
 * table. ref_policy.c (the device-resident policy ops, the decode epilogue) is shared by both
 * tables. act is fp32 throughout.
 */
#ifndef FLEXDIAG_CPU_OPS_H
#define FLEXDIAG_CPU_OPS_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CPU)
#error "kernels/cpu/cpu_ops.h is private to kernels/cpu/ (docs/architecture.md)"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* ---- target clones of the hot tasks ---- */

/* x86-64: a hot pool task (fast_matmul.c, host_attn.c) is also compiled for AVX2 and picked at
 * load time (an ifunc). Nothing is contracted into FMAs (AVX2 alone brings none), so both
 * versions give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang_analyzer__)
#define FLEXDIAG_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FLEXDIAG_CPU_CLONES
#endif
/* A helper of such a task: always inlined, so it is compiled for each of the task's targets. */
#define FLEXDIAG_CPU_INLINE static inline __attribute__((always_inline))

/* ---- reference ops (ref_*.c) ---- */

/* act is fp32 on the CPU: both conversions are copies. */
flexdiag_op_act_to_f32 flexdiag__cpu_act_to_f32;
/* Copy n fp32 values into the fp32 act buffer out. */
flexdiag_op_act_from_f32 flexdiag__cpu_act_from_f32;
/* out (n, d) = table rows ids[i / rep]; ids must be < V (checked by the runtime). */
flexdiag_op_embed flexdiag__cpu_ref_embed;
/* x (n, d) += table rows pos[i] + offset; negative rows are rejected, the upper bound is the
 * caller's. */
flexdiag_op_pos_embed_add flexdiag__cpu_ref_pos_embed_add;
/* out (n, d) = w ⊙ x / sqrt(mean(x²) + eps). */
flexdiag_op_rmsnorm flexdiag__cpu_ref_rmsnorm;
/* out (n, d) = (x − mean) / sqrt(var + eps) ⊙ w + b: two-pass statistics and the whole formula
 * in double, one rounding to fp32. */
flexdiag_op_layernorm flexdiag__cpu_ref_layernorm;
/* qkv (n, (h_q + 2·h_kv)·d_h): LayerNorm of each q and k head in place with its (or the shared)
 * bf16 w, b row; per head as layernorm: two-pass statistics and formula in double, one rounding
 * to fp32. */
flexdiag_op_qk_norm flexdiag__cpu_ref_qk_norm;
/* out (n, m) (+)= x (n, k) · W (m, k)ᵀ + b, one sequential fp32 sum per element. */
flexdiag_op_matmul flexdiag__cpu_ref_matmul;
/* Rotate-half RoPE in place on n_heads heads of d_h from column col0 of the n rows of x
 * (stride elements apart), row i at position pos[i]; not a table slot: kv_append calls it when
 * its args carry positions. */
flexdiag_status flexdiag__cpu_ref_rope(void *x, const int32_t *pos, int64_t n, int64_t stride,
                                       int64_t col0, int32_t n_heads, int32_t d_h, float theta,
                                       flexdiag_stream *s);
/* cos and sin of RoPE pair j at position pos (inv_freq theta^(-2j/d_h)), computed in double
 * and rounded to fp32 once: the angles every CPU RoPE uses. */
void flexdiag__cpu_rope_cos_sin(int32_t pos, int32_t j, int32_t d_h, float theta, float *c,
                                float *sn);
/* out (n, f) = silu(gate) ⊙ up of gu (n, 2f). */
flexdiag_op_swiglu flexdiag__cpu_ref_swiglu;
flexdiag_op_wq4_unpack flexdiag__cpu_wq4_unpack; /* wq4.c */
/* Exact (erf) GELU of x (n) in place. */
flexdiag_op_gelu flexdiag__cpu_ref_gelu;
/* max(x, 0) of x (n) in place: x < 0 becomes +0, ±0 and NaN are left as they are. */
flexdiag_op_relu flexdiag__cpu_ref_relu;
/* out (n, d) = in rows idx (n). */
flexdiag_op_gather_rows flexdiag__cpu_ref_gather_rows;
/* Copy K and V of n_tok tokens of qkv into the cache rows given by rows, after rotating the q
 * and k heads of qkv in place when a->pos is set. */
flexdiag_op_kv_append flexdiag__cpu_ref_kv_append;
/* Causal prompt attention, three-pass softmax per query row. */
flexdiag_op_attn_prefill flexdiag__cpu_ref_attn_prefill;
/* Decode attention over prompt + slot-listed ring rows, three-pass softmax per query head. */
flexdiag_op_attn_decode flexdiag__cpu_ref_attn_decode;
/* out (n_pairs, V) = u + w·(c − u) of logits rows (2i, 2i+1). */
flexdiag_op_cfg_combine flexdiag__cpu_ref_cfg_combine;
/* Temperature / top-k / top-p sampling, each row with its own settings and (seed, req, step)
 * key; rows are host memory, read by the op. */
flexdiag_op_sample flexdiag__cpu_ref_sample;

/* ---- device-resident Diagonal policy (ref_policy.c; kernels.h diag_slots and the
 * attn_decode epilogue) ---- */
/* The five policy ops refuse (INVALID_ARG naming the op) steps without the step array when
 * there are lists, or with n_seq or per_seq below 1. */
flexdiag_op_diag_slots flexdiag__cpu_diag_slots;
/* ---- device-resident H2O / TOVA (ref_policy.c; kernels.h evict_plan, evict_update) ---- */
flexdiag_op_evict_plan flexdiag__cpu_evict_plan;
flexdiag_op_evict_update flexdiag__cpu_evict_update;
/* ---- device-resident ALISA (ref_policy.c; kernels.h alisa_plan, alisa_update) ---- */
flexdiag_op_alisa_plan flexdiag__cpu_alisa_plan;
flexdiag_op_alisa_update flexdiag__cpu_alisa_update;
/* Decode epilogue of the group (sequence s, KV head h), after its attention: z holds the
 * group's g = h_q/h_kv rows of ring logits (z_stride floats apart, column = slot-list index,
 * n_slots of the group's list valid), lse its g log-sum-exps (both borrowed). Writes the
 * group's probs_out rows when a->probs_out is set and applies the Diagonal update to list
 * (s, h), lag a->diag_next[s], when a->diag_lag is set (kernels.h flexdiag_attn_args);
 * arguments already checked. */
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

/* One chunk of an online softmax for nq query heads: head h's nc logits z[h·zs ..] raise its
 * running maximum m[h] (its sum l[h] and accumulator acc (d_h floats at h·d_h) rescaled once),
 * then become p = exp(z - m) and add to l[h]. Shared by fast_attn.c and host_attn.c. */
static inline void flexdiag__cpu_softmax_chunk(float *z, int64_t zs, int64_t nc, float *m,
                                               float *l, float *acc, int32_t nq, int32_t d_h) {
    for (int32_t h = 0; h < nq; h++) {
        float cm = m[h], *zh = z + h * zs, *ah = acc + (int64_t)h * d_h;
        for (int64_t c = 0; c < nc; c++) cm = fmaxf(cm, zh[c]);
        float corr = expf(m[h] - cm);
        if (corr != 1.0f) {
            l[h] *= corr;
            for (int32_t i = 0; i < d_h; i++) ah[i] *= corr;
        }
        m[h] = cm;
        for (int64_t c = 0; c < nc; c++) {
            zh[c] = expf(zh[c] - cm);
            l[h] += zh[c];
        }
    }
}

/* a·b of n floats with 8 interleaved partial sums (two SSE or one AVX vector): a fixed order
 * the compiler vectorises, shared by the fast attention paths (fast_attn.c, host_attn.c). */
static inline float flexdiag__cpu_dot(const float *a, const float *b, int32_t n) {
    enum { LANES = 8 };
    float part[LANES] = {0};
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) part[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += part[l];
    return s + tail;
}

/* Cache-blocked matmul parallel over output tiles; bit-identical for any thread count. */
flexdiag_op_matmul flexdiag__cpu_fast_matmul;
/* Prompt attention parallel over (sequence, query head), online softmax. */
flexdiag_op_attn_prefill flexdiag__cpu_fast_attn_prefill;
/* Decode attention parallel over (sequence, KV head), all g query heads per task. */
flexdiag_op_attn_decode flexdiag__cpu_fast_attn_decode;

#endif /* FLEXDIAG_CPU_OPS_H */
