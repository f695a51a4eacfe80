/*
 * fast_attn.c - multi-threaded CPU attention for the "cpu" table: decode over prompt + ring
 * slots (the policies' sparse decode, docs/policies.md §4.3 on a CPU), and causal prompt attention.
 *
 * Decode runs one task per (sequence, KV head) that serves all g query heads of the group, so
 * each K/V row is read from memory once and used g times, like the CUDA kernel's one CTA per
 * (sequence, KV head). Keys are visited in CHUNK-row chunks with one online-softmax state
 * (m, l, acc) per query head: the chunk's logits are computed first (flexdiag__cpu_dot), then
 * the state is rescaled once per chunk and each V row is added to all g accumulators while it
 * is in L1. Prefill runs one task per (sequence, query head) over its query rows with the same
 * routine (g = 1, keys 0..r).
 * A decode task ends with the epilogue shared with the reference (flexdiag__cpu_decode_scores,
 * ref_policy.c: probs_out and the fused Diagonal update of its own lag list), fed the group's
 * ring logits and lse from logits_out / lse_out or, when those are NULL, from the task's
 * scratch, which then grows by g·max_slots + g floats.
 *
 * Results equal ref_attn.c within fp32 rounding (different summation order), including the
 * ring-slot logits and the log-sum-exp the policies consume; the Diagonal choice equals the
 * reference's unless two candidates' scores lie within that rounding. Every task owns disjoint
 * outputs (its lag list included) and computes them in a fixed order, so outputs do not depend
 * on the thread count. Plain C loops, no intrinsics; the decode and prefill tasks are also
 * compiled for AVX2 (cpu_ops.h FLEXDIAG_CPU_CLONES: the same bits).
 */
#include <math.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"

#define CHUNK 32 /* keys per online-softmax update: 32 K/V rows of d_h 128 fp32 = 32 KiB */

/* The keys of one (sequence, KV head) in attention order: prompt rows, then ring slots. */
typedef struct key_list {
    const float *k, *v;   /* cache block: (p_cap + ring, d_h) */
    const float *kp, *vp; /* where its prompt rows start: the block, or its shared prefix block */
    int64_t n_prompt;     /* prompt rows 0..n_prompt-1 first */
    const int32_t *slots; /* then ring rows p_cap + slots[j] */
    int64_t n_slots;      /* entries of slots */
    int32_t p_cap, d_h;   /* prompt rows per block; head dim */
} key_list;

/* Outputs of one group of query heads. */
typedef struct group_out {
    float *out;      /* (nq, d_h) rows, stride d_h */
    float *lse;      /* (nq) or NULL */
    float *logits;   /* (nq, lstride) ring-key logits or NULL */
    int64_t lstride; /* row stride of logits */
} group_out;

/* Arguments of one attention job, shared by its tasks. */
typedef struct attn_job {
    const flexdiag_attn_args *a;
    float *out;         /* act output */
    const float *qkv;   /* (rows, width) */
    const float *k, *v; /* caches */
    int64_t width;      /* qkv row width: (h_q + 2·h_kv)·d_h */
} attn_job;

/* ---- inner loops ---- */

/* K (kv 0) or V (kv 1) row of the j-th key of r. */
static const float *key_row(const key_list *r, int64_t j, int kv) {
    if (j < r->n_prompt) return (kv ? r->vp : r->kp) + j * r->d_h;
    return (kv ? r->v : r->k) + ((int64_t)r->p_cap + r->slots[j - r->n_prompt]) * r->d_h;
}

/*
 * Online softmax of nq queries (q, rows of d_h) over all keys of r. Scratch layout:
 * acc (nq, d_h) | z (nq, CHUNK) | m (nq) | l (nq).
 */
FLEXDIAG_CPU_INLINE void attend_group(const float *q, int32_t nq, const key_list *r, float scale,
                                      const group_out *go, float *scratch) {
    int32_t d_h = r->d_h;
    float *acc = scratch, *z = acc + (int64_t)nq * d_h, *m = z + (int64_t)nq * CHUNK, *l = m + nq;
    memset(acc, 0, (size_t)nq * d_h * sizeof(float));
    for (int32_t h = 0; h < nq; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    int64_t n = r->n_prompt + r->n_slots;
    for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
        int64_t nc = n - j0 < CHUNK ? n - j0 : CHUNK;
        /* logits of the chunk for every query head */
        for (int64_t c = 0; c < nc; c++) {
            const float *kr = key_row(r, j0 + c, 0);
            for (int32_t h = 0; h < nq; h++)
                z[h * CHUNK + c] = scale * flexdiag__cpu_dot(q + (int64_t)h * d_h, kr, d_h);
        }
        if (go->logits)
            for (int64_t c = 0; c < nc; c++)
                if (j0 + c >= r->n_prompt)
                    for (int32_t h = 0; h < nq; h++)
                        go->logits[h * go->lstride + j0 + c - r->n_prompt] = z[h * CHUNK + c];
        flexdiag__cpu_softmax_chunk(z, CHUNK, nc, m, l, acc, nq, d_h);
        /* each V row once, into all accumulators */
        for (int64_t c = 0; c < nc; c++) {
            const float *vr = key_row(r, j0 + c, 1);
            for (int32_t h = 0; h < nq; h++) {
                float p = z[h * CHUNK + c], *ah = acc + (int64_t)h * d_h;
                for (int32_t i = 0; i < d_h; i++) ah[i] += p * vr[i];
            }
        }
    }
    for (int32_t h = 0; h < nq; h++) {
        float inv = n > 0 ? 1.0f / l[h] : 0.0f;
        for (int32_t i = 0; i < d_h; i++)
            go->out[(int64_t)h * d_h + i] = acc[(int64_t)h * d_h + i] * inv;
        if (go->lse) go->lse[h] = n > 0 ? m[h] + logf(l[h]) : -INFINITY;
    }
}

/* Scratch bytes of attend_group for nq query heads. */
static size_t group_scratch(int32_t nq, int32_t d_h) {
    return ((size_t)nq * d_h + (size_t)nq * CHUNK + 2 * (size_t)nq) * sizeof(float);
}

/* The key list of (sequence s, KV head h) with no keys selected yet; its prompt rows in its
 * block, or with a->prefix (decode) in its shared prefix block. */
static key_list block_keys(const attn_job *jb, int64_t s, int32_t h, int decode) {
    const flexdiag_attn_args *a = jb->a;
    int64_t off = (s * a->h_kv + h) * ((int64_t)a->p_cap + a->ring) * a->d_h;
    key_list r = {jb->k + off, jb->v + off, jb->k + off, jb->v + off, 0, NULL, 0, a->p_cap, a->d_h};
    if (decode && a->prefix) {
        int64_t po = ((int64_t)a->prefix[s] * a->h_kv + h) * a->pre_cap * a->d_h;
        r.kp = (const float *)a->k_pre + po, r.vp = (const float *)a->v_pre + po;
    }
    return r;
}

/* ---- decode ---- */

/* Floats a decode task keeps for the epilogue: the group's ring logits (g, max_slots) and its
 * lse (g); none when neither probs_out nor diag_lag is set. */
static size_t epilogue_floats(const flexdiag_attn_args *a) {
    size_t g = (size_t)(a->h_q / a->h_kv);
    return a->probs_out || a->diag_lag ? g * (size_t)a->max_slots + g : 0;
}

/* Task t: query row s = t / h_kv (query s % win of sequence s / win, kernels.h win), KV head
 * t % h_kv, all g query heads of its group. */
FLEXDIAG_CPU_CLONES static void decode_task(void *ctx, int64_t t, void *scratch) {
    const attn_job *jb = ctx;
    const flexdiag_attn_args *a = jb->a;
    int64_t s = t / a->h_kv, seq = s / flexdiag__attn_win(a);
    int32_t h = (int32_t)(t % a->h_kv), g = a->h_q / a->h_kv;
    int64_t hq0 = s * a->h_q + (int64_t)h * g; /* first (row, query head) of the group */
    key_list r = block_keys(jb, seq, h, 1);
    r.n_prompt = a->lp[seq];
    int64_t li = flexdiag__slot_list(a, s, h); /* this (sequence, KV head)'s slot list */
    r.slots = a->slots ? a->slots + li * a->max_slots : NULL;
    r.n_slots = a->n_slots[li];
    /* the epilogue's buffer follows attend_group's scratch; logits and lse go to the optional
     * outputs when given, else there */
    float *zbuf = NULL;
    if (epilogue_floats(a)) zbuf = (float *)scratch + group_scratch(g, a->d_h) / sizeof(float);
    float *lse = a->lse_out ? a->lse_out + hq0 : zbuf ? zbuf + (int64_t)g * a->max_slots : NULL;
    group_out go = {jb->out + hq0 * a->d_h, lse,
                    a->logits_out ? a->logits_out + hq0 * a->max_slots : zbuf, a->max_slots};
    const float *q = jb->qkv + s * jb->width + (int64_t)h * g * a->d_h;
    attend_group(q, g, &r, a->scale, &go, scratch);
    if (zbuf) flexdiag__cpu_decode_scores(a, s, h, go.logits, a->max_slots, go.lse);
}

flexdiag_status flexdiag__cpu_fast_attn_decode(void *out, const void *qkv, const void *k,
                                               const void *v, const flexdiag_attn_args *a,
                                               flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cpu_attn_check("attn_decode", out, qkv, k, v, a, 1));
    attn_job jb = {a, out, qkv, k, v, ((int64_t)a->h_q + 2 * a->h_kv) * a->d_h};
    size_t scratch = group_scratch(a->h_q / a->h_kv, a->d_h) + epilogue_floats(a) * sizeof(float);
    return flexdiag__cpu_parallel_for(s, (int64_t)a->n_seq * flexdiag__attn_win(a) * a->h_kv,
                                      scratch, decode_task, &jb);
}

/* ---- prefill ---- */

/* Task t: sequence t / h_q, query head t % h_q, every query row of the prompt block. */
FLEXDIAG_CPU_CLONES static void prefill_task(void *ctx, int64_t t, void *scratch) {
    const attn_job *jb = ctx;
    const flexdiag_attn_args *a = jb->a;
    int64_t s = t / a->h_q, out_w = (int64_t)a->h_q * a->d_h;
    int32_t hq = (int32_t)(t % a->h_q);
    key_list r = block_keys(jb, s, hq / (a->h_q / a->h_kv), 0);
    for (int64_t row = 0; row < a->p_cap; row++) {
        float *o = jb->out + (s * a->p_cap + row) * out_w + (int64_t)hq * a->d_h;
        if (row >= a->lp[s]) {
            memset(o, 0, (size_t)a->d_h * sizeof(float));
            continue;
        }
        r.n_prompt = row + 1;
        group_out go = {o, NULL, NULL, 0};
        const float *q = jb->qkv + (s * a->p_cap + row) * jb->width + (int64_t)hq * a->d_h;
        attend_group(q, 1, &r, a->scale, &go, scratch);
    }
}

flexdiag_status flexdiag__cpu_fast_attn_prefill(void *out, const void *qkv, const void *k,
                                                const void *v, const flexdiag_attn_args *a,
                                                flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cpu_attn_check("attn_prefill", out, qkv, k, v, a, 0));
    attn_job jb = {a, out, qkv, k, v, ((int64_t)a->h_q + 2 * a->h_kv) * a->d_h};
    return flexdiag__cpu_parallel_for(s, (int64_t)a->n_seq * a->h_q, group_scratch(1, a->d_h),
                                      prefill_task, &jb);
}
