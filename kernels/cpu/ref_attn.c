/*
 * ref_attn.c - scalar reference KV append (with the optional RoPE of its args) and attention
 * (prompt and decode), plus the argument checks the fast attention shares.
 *
 * Attention is written as the textbook three passes per query head: the maximum logit, the
 * softmax normaliser, then the probability-weighted sum of V rows, recomputing each logit
 * (z = scale·(q·k), fp32, sequential over d_h) in every pass so attention needs no scratch. The
 * keys a head attends are described by one key_rows list: prompt rows 0..n_prompt-1 of its cache
 * block, then ring rows p_cap + slots[j]. Decode uses lp prompt rows plus the slot list; prefill
 * query row r uses prompt rows 0..r and no ring. A head with no keys at all gets a zero output
 * and lse = -inf (every backend does the same).
 *
 * Decode walks (sequence, KV head) groups: after the group's g heads, the epilogue shared with
 * the fast decode (flexdiag__cpu_decode_scores, ref_policy.c) turns the group's ring logits and
 * lse into probs_out and the fused Diagonal update. Those come from logits_out / lse_out when
 * given, else from one stream scratch buffer taken once per call (g rows of max_slots + g).
 *
 * Slot indices, lp and n_slots come from the policy state on the host; they are validated
 * before any cache access because a bad one would read outside the cache.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"

/* The keys one query head attends, in attention order. */
typedef struct key_rows {
    const float *k, *v;   /* cache block of (sequence, KV head): (p_cap + ring, d_h) */
    const float *kp, *vp; /* where its prompt rows start: the block, or its shared prefix block */
    int64_t n_prompt;     /* prompt rows 0..n_prompt-1 come first */
    const int32_t *slots; /* then ring rows p_cap + slots[j] */
    int64_t n_slots;      /* entries of slots */
    int32_t p_cap, d_h;   /* prompt rows per block; head dim */
} key_rows;

/* ---- argument checks ---- */

/* Name of the first NULL of the n pointers p (names: NUL-separated), or NULL if none is. */
static const char *first_null(const void *const *p, const char *names, int n) {
    for (int i = 0; i < n; i++, names += strlen(names) + 1)
        if (!p[i]) return names;
    return NULL;
}

/* Shapes every attention-side op needs. */
static flexdiag_status check_shape(const char *op, const flexdiag_attn_args *a) {
    if (!a) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: attention args are NULL", op);
    if (a->n_seq < 0 || a->h_q < 1 || a->h_kv < 1 || a->h_q % a->h_kv != 0 || a->d_h < 1 ||
        a->p_cap < 0 || a->ring < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: n_seq = %d, h_q = %d, h_kv = %d, d_h = %d, p_cap = %d, "
                             "ring = %d: need n_seq, p_cap, ring >= 0, h_q, h_kv, d_h >= 1 and "
                             "h_q a multiple of h_kv",
                             op, a->n_seq, a->h_q, a->h_kv, a->d_h, a->p_cap, a->ring);
    return FLEXDIAG_OK;
}

/* "seq S][head H", "seq S" or "shared": list li of a's sharing, for messages (buf, n bytes). */
static const char *list_name(const flexdiag_attn_args *a, int64_t li, char *buf, size_t n) {
    if (a->shared_slots == FLEXDIAG_SLOTS_ONE) return "shared";
    if (a->shared_slots == FLEXDIAG_SLOTS_PER_SEQ)
        snprintf(buf, n, "seq %lld", (long long)li);
    else
        snprintf(buf, n, "seq %lld][head %lld", (long long)(li / a->h_kv),
                 (long long)(li % a->h_kv));
    return buf;
}

/* Decode slot lists: a known sharing, n_slots within [0, max_slots], every slot a ring row. */
static flexdiag_status check_slots(const char *op, const flexdiag_attn_args *a) {
    if (a->shared_slots < FLEXDIAG_SLOTS_PER_HEAD || a->shared_slots > FLEXDIAG_SLOTS_PER_SEQ)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: shared_slots = %d: need 0 (a list per sequence and KV "
                             "head), 1 (one list) or 2 (a list per sequence)",
                             op, a->shared_slots);
    if (a->max_slots < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: max_slots = %d is negative", op,
                             a->max_slots);
    if (!a->n_slots || (a->max_slots > 0 && !a->slots))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: %s is NULL", op,
                             a->n_slots ? "slots" : "n_slots");
    /* lists: 1, rows or rows·h_kv (rows = n_seq·win), the last group's list being the last */
    int64_t rows = (int64_t)a->n_seq * flexdiag__attn_win(a);
    int64_t lists = rows > 0 ? flexdiag__slot_list(a, rows - 1, a->h_kv - 1) + 1 : 0;
    char name[64];
    for (int64_t li = 0; li < lists; li++) {
        int32_t ns = a->n_slots[li];
        if (ns < 0 || ns > a->max_slots)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "cpu %s: n_slots[%s] = %d outside [0, max_slots = %d]", op,
                                 list_name(a, li, name, sizeof name), ns, a->max_slots);
        for (int32_t j = 0; j < ns; j++) {
            int32_t slot = a->slots[li * a->max_slots + j];
            if (slot < 0 || slot >= a->ring)
                return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                     "cpu %s: slots[%s][%d] = %d outside the ring [0, %d)", op,
                                     list_name(a, li, name, sizeof name), j, slot, a->ring);
        }
    }
    return FLEXDIAG_OK;
}

/* Fused Diagonal update (diag_lag set): per-(sequence, KV head) lists, diag_a >= 1,
 * diag_base >= 0, every diag_next[s] a lag int16 holds or negative (no update), and no list
 * longer than diag_base + diag_a. */
static flexdiag_status check_diag(const char *op, const flexdiag_attn_args *a) {
    if (a->win > 1 && (a->diag_lag || a->n_casc_tiles))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: win = %d with %s: a window pass takes neither the fused "
                             "Diagonal update nor a cascade plan",
                             op, a->win, a->diag_lag ? "diag_lag" : "a cascade plan");
    if (!a->diag_lag) return FLEXDIAG_OK;
    if (a->shared_slots)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: diag_lag is set but shared_slots = %d: the Diagonal update "
                             "needs one slot list per (sequence, KV head) (shared_slots 0)",
                             op, a->shared_slots);
    if (a->diag_a < 1 || a->diag_base < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: diag_a = %d, diag_base = %d: need diag_a >= 1 (lag list "
                             "length) and diag_base >= 0 (sink slots)",
                             op, a->diag_a, a->diag_base);
    if (!a->diag_next)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: diag_lag is set but diag_next (the new lags) is NULL", op);
    /* a CPU op runs before it returns: the values read here are the ones the update writes */
    for (int32_t s = 0; s < a->n_seq; s++)
        if (a->diag_next[s] > INT16_MAX)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "cpu %s: diag_next[%d] = %d above the int16 lag range [0, %d] "
                                 "(negative: no update)",
                                 op, s, a->diag_next[s], INT16_MAX);
    for (int64_t li = 0; li < (int64_t)a->n_seq * a->h_kv; li++)
        if (a->n_slots[li] - a->diag_base > a->diag_a)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "cpu %s: n_slots[seq %lld][head %lld] - diag_base = %d - %d "
                                 "exceeds diag_a = %d: a lag list holds at most diag_a entries",
                                 op, (long long)(li / a->h_kv), (long long)(li % a->h_kv),
                                 a->n_slots[li], a->diag_base, a->diag_a);
    return FLEXDIAG_OK;
}

/* Shared prompt KV (prefix set): the prompt-only store, p_cap 0, every prefix index in range. */
static flexdiag_status check_prefix(const char *op, const flexdiag_attn_args *a) {
    if (!a->prefix) return FLEXDIAG_OK;
    if (!a->k_pre || !a->v_pre || a->p_cap != 0 || a->n_pre < 1 || a->pre_cap < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: prefix is set with k_pre %s, v_pre %s, p_cap = %d, n_pre = "
                             "%d, pre_cap = %d: shared prompt rows need both stores, ring-only "
                             "blocks (p_cap 0), n_pre >= 1 and pre_cap >= 0",
                             op, a->k_pre ? "set" : "NULL", a->v_pre ? "set" : "NULL", a->p_cap,
                             a->n_pre, a->pre_cap);
    for (int32_t s = 0; s < a->n_seq; s++)
        if (a->prefix[s] < 0 || a->prefix[s] >= a->n_pre)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "cpu %s: prefix[%d] = %d outside [0, n_pre = %d)", op, s,
                                 a->prefix[s], a->n_pre);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_attn_check(const char *op, const void *out, const void *qkv,
                                         const void *k, const void *v, const flexdiag_attn_args *a,
                                         int decode) {
    FLEXDIAG_TRY(check_shape(op, a));
    if (a->win < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: win = %d: need 0 or 1 (one query a sequence) or more", op,
                             a->win);
    if (a->n_seq == 0) return FLEXDIAG_OK;
    const void *ptrs[] = {out, qkv, k, v, a->lp};
    const char *null = first_null(ptrs, "out\0qkv\0k\0v\0lp\0", 5);
    if (null) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: %s is NULL", op, null);
    if (!(isfinite(a->scale)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: scale = %g is not finite", op,
                             (double)a->scale);
    int32_t cap = decode && a->prefix ? a->pre_cap : a->p_cap;
    for (int32_t s = 0; s < a->n_seq; s++)
        if (a->lp[s] < 0 || a->lp[s] > cap)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: lp[%d] = %d outside [0, %s = %d]",
                                 op, s, a->lp[s], decode && a->prefix ? "pre_cap" : "p_cap", cap);
    if (!decode) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_prefix(op, a));
    FLEXDIAG_TRY(check_slots(op, a));
    return check_diag(op, a);
}

/* ---- KV append ---- */

/* RoPE parameters of kv_append: with pos set, rope_theta > 0 and an even d_h. */
static flexdiag_status check_rope(const flexdiag_attn_args *a) {
    if (a->pos && !(a->rope_theta > 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu kv_append: pos is set but rope_theta = %g (need > 0)",
                             (double)a->rope_theta);
    if (a->pos && a->d_h % 2 != 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu kv_append: pos is set but d_h = %d is odd (RoPE pairs element "
                             "i with i + d_h/2)", a->d_h);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_kv_append(void *k, void *v, void *qkv, const int32_t *rows,
                                            int64_t n_tok, int32_t tok_per_seq,
                                            const flexdiag_attn_args *a, flexdiag_stream *s) {
    FLEXDIAG_TRY(check_shape("kv_append", a));
    FLEXDIAG_TRY(check_rope(a));
    if (n_tok < 0 || tok_per_seq < 1 || n_tok > (int64_t)a->n_seq * tok_per_seq)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu kv_append: n_tok = %lld, tok_per_seq = %d, n_seq = %d: need "
                             "tok_per_seq >= 1 and 0 <= n_tok <= n_seq·tok_per_seq",
                             (long long)n_tok, tok_per_seq, a->n_seq);
    if (n_tok == 0) return FLEXDIAG_OK;
    const void *ptrs[] = {k, v, qkv, rows};
    const char *null = first_null(ptrs, "k\0v\0qkv\0rows\0", 4);
    if (null) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu kv_append: %s is NULL", null);
    int64_t block = (int64_t)a->p_cap + a->ring, d_h = a->d_h;
    for (int64_t i = 0; i < n_tok * a->h_kv; i++)
        if (rows[i] < 0 || rows[i] >= block)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "cpu kv_append: rows[token %lld][head %lld] = %d outside the "
                                 "cache block [0, p_cap + ring = %lld)",
                                 (long long)(i / a->h_kv), (long long)(i % a->h_kv), rows[i],
                                 (long long)block);
    int64_t width = ((int64_t)a->h_q + 2 * a->h_kv) * d_h;
    /* q and k heads are adjacent from column 0 of a qkv row: one pass rotates both */
    if (a->pos)
        FLEXDIAG_TRY(flexdiag__cpu_ref_rope(qkv, a->pos, n_tok, width, 0, a->h_q + a->h_kv,
                                            a->d_h, a->rope_theta, s));
    for (int64_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < a->h_kv; h++) {
            int64_t dst = (((i / tok_per_seq) * a->h_kv + h) * block + rows[i * a->h_kv + h]) * d_h;
            const float *src = (const float *)qkv + i * width + ((int64_t)a->h_q + h) * d_h;
            memcpy((float *)k + dst, src, (size_t)d_h * 4);
            memcpy((float *)v + dst, src + (int64_t)a->h_kv * d_h, (size_t)d_h * 4);
        }
    return FLEXDIAG_OK;
}

/* ---- attention ---- */

/* K (kv 0) or V (kv 1) row of the j-th attended key. */
static const float *key_row(const key_rows *r, int64_t j, int kv) {
    if (j < r->n_prompt) return (kv ? r->vp : r->kp) + j * r->d_h;
    return (kv ? r->v : r->k) + ((int64_t)r->p_cap + r->slots[j - r->n_prompt]) * r->d_h;
}

/* z = scale·(q·k) of the j-th attended key. */
static float key_logit(const float *q, const key_rows *r, int64_t j, float scale) {
    const float *kr = key_row(r, j, 0);
    float acc = 0.0f;
    for (int32_t i = 0; i < r->d_h; i++) acc += q[i] * kr[i];
    return scale * acc;
}

/* out (d_h) = Σ_j softmax(z)_j · v_j over the rows of r; returns the log-sum-exp of z. When
 * logits is given, logits[j] = z of ring key j (slot-list order). */
static float attend(const float *q, const key_rows *r, float scale, float *out, float *logits) {
    int64_t n = r->n_prompt + r->n_slots;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j < n; j++) m = fmaxf(m, key_logit(q, r, j, scale));
    for (int64_t j = 0; j < n; j++) l += expf(key_logit(q, r, j, scale) - m);
    memset(out, 0, (size_t)r->d_h * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        float p = expf(key_logit(q, r, j, scale) - m) / l;
        const float *vr = key_row(r, j, 1);
        for (int32_t i = 0; i < r->d_h; i++) out[i] += p * vr[i];
    }
    if (logits)
        for (int64_t j = 0; j < r->n_slots; j++)
            logits[j] = key_logit(q, r, r->n_prompt + j, scale);
    return n > 0 ? m + logf(l) : -INFINITY;
}

/* The key_rows of (sequence s, KV head h) with every ring row unset; its prompt rows in its
 * block, or with a->prefix (decode) in its shared prefix block. */
static key_rows block_rows(const flexdiag_attn_args *a, const void *k, const void *v, int64_t s,
                           int32_t h, int decode) {
    int64_t off = (s * a->h_kv + h) * ((int64_t)a->p_cap + a->ring) * a->d_h;
    key_rows r = {(const float *)k + off, (const float *)v + off, NULL, NULL, 0, NULL, 0,
                  a->p_cap, a->d_h};
    r.kp = r.k, r.vp = r.v;
    if (decode && a->prefix) {
        int64_t po = ((int64_t)a->prefix[s] * a->h_kv + h) * a->pre_cap * a->d_h;
        r.kp = (const float *)a->k_pre + po, r.vp = (const float *)a->v_pre + po;
    }
    return r;
}

flexdiag_status flexdiag__cpu_ref_attn_prefill(void *out, const void *qkv, const void *k,
                                               const void *v, const flexdiag_attn_args *a,
                                               flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(flexdiag__cpu_attn_check("attn_prefill", out, qkv, k, v, a, 0));
    int32_t g = a->h_q / a->h_kv, d_h = a->d_h;
    int64_t width = ((int64_t)a->h_q + 2 * a->h_kv) * d_h, out_w = (int64_t)a->h_q * d_h;
    for (int64_t sq = 0; sq < a->n_seq; sq++)
        for (int64_t r = 0; r < a->p_cap; r++) {
            int64_t row = sq * a->p_cap + r;
            float *o = (float *)out + row * out_w;
            if (r >= a->lp[sq]) {
                memset(o, 0, (size_t)out_w * sizeof(float));
                continue;
            }
            for (int32_t hq = 0; hq < a->h_q; hq++) {
                key_rows kr = block_rows(a, k, v, sq, hq / g, 0);
                kr.n_prompt = r + 1;
                const float *q = (const float *)qkv + row * width + (int64_t)hq * d_h;
                attend(q, &kr, a->scale, o + (int64_t)hq * d_h, NULL);
            }
        }
    return FLEXDIAG_OK;
}

/* Decode of the group (query row sq, KV head h): each of its g query heads, then the shared
 * epilogue when zbuf (scratch of g·max_slots + g floats) is given. Row sq is query sq % win of
 * sequence sq / win (kernels.h win). */
static void decode_group(float *out, const float *qkv, const void *k, const void *v,
                         const flexdiag_attn_args *a, int64_t sq, int32_t h, float *zbuf) {
    int32_t g = a->h_q / a->h_kv, d_h = a->d_h;
    int64_t width = ((int64_t)a->h_q + 2 * a->h_kv) * d_h, hq0 = sq * a->h_q + (int64_t)h * g;
    int64_t li = flexdiag__slot_list(a, sq, h), seq = sq / flexdiag__attn_win(a);
    key_rows kr = block_rows(a, k, v, seq, h, 1);
    kr.n_prompt = a->lp[seq];
    kr.slots = a->slots ? a->slots + li * a->max_slots : NULL;
    kr.n_slots = a->n_slots[li];
    /* ring logits and lse: into the optional outputs, else into zbuf when the epilogue runs */
    float *z = a->logits_out ? a->logits_out + hq0 * a->max_slots : zbuf;
    float *lse = a->lse_out ? a->lse_out + hq0 : zbuf ? zbuf + (int64_t)g * a->max_slots : NULL;
    const float *q = qkv + sq * width + (int64_t)h * g * d_h; /* the group's g query heads */
    for (int32_t i = 0; i < g; i++) {
        float l = attend(q + (int64_t)i * d_h, &kr, a->scale, out + (hq0 + i) * d_h,
                         z ? z + (int64_t)i * a->max_slots : NULL);
        if (lse) lse[i] = l;
    }
    if (zbuf) flexdiag__cpu_decode_scores(a, sq, h, z, a->max_slots, lse);
}

flexdiag_status flexdiag__cpu_ref_attn_decode(void *out, const void *qkv, const void *k,
                                              const void *v, const flexdiag_attn_args *a,
                                              flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cpu_attn_check("attn_decode", out, qkv, k, v, a, 1));
    void *zbuf = NULL, *tmp = NULL;
    if (a->n_seq > 0 && (a->probs_out || a->diag_lag)) {
        size_t g = (size_t)(a->h_q / a->h_kv);
        FLEXDIAG_TRY(flexdiag__cpu_scratch(s, (g * (size_t)a->max_slots + g) * sizeof(float),
                                           &zbuf, &tmp));
    }
    for (int64_t sq = 0; sq < (int64_t)a->n_seq * flexdiag__attn_win(a); sq++)
        for (int32_t h = 0; h < a->h_kv; h++) decode_group(out, qkv, k, v, a, sq, h, zbuf);
    free(tmp);
    return FLEXDIAG_OK;
}
