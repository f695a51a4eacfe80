/*
 * ref_policy.c - the device-resident policies on the CPU, shared by both CPU tables: the
 * diag_slots op (plain loops over lag lists), the H2O / TOVA evict_plan and evict_update ops,
 * the ALISA alisa_plan (the host's own per-list code) and alisa_update ops, and the
 * post-attention epilogue of attn_decode (probs_out and the fused Diagonal build-up
 * update of kernels.h), which the reference and the fast decode both call once per (sequence,
 * KV head) group with that group's ring logits.
 *
 * They are the op-table form the CUDA backend implements, built from the per-list rules that
 * policy/ writes once (kv_policy.h: flexdiag__diag_list_plan / _pick, flexdiag__evict_list_plan,
 * flexdiag__h2o_list_update, flexdiag__tova_list_update, flexdiag__alisa_plan_list /
 * _list_update), so the engine's device-policy path runs (and is tested) on the CPU with the
 * host state machine's own code; the CUDA kernels are checked against them. Each list runs at
 * its own sequence's step (kernels.h flexdiag_list_steps): the per-list code is the host's for
 * that step, and a list whose step is negative (or, for ALISA's plan, past the decode length)
 * is skipped whole.
 * Keeping the epilogue in one function (rather than one copy per decode) makes the two CPU
 * decodes agree whenever their logits agree.
 */
#include <math.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "policy/kv_policy.h"

/* The step arguments of a policy op: the step array (when there are lists to read it for), at
 * least one sequence, at least one list per sequence. */
static flexdiag_status check_steps(const char *op, const flexdiag_list_steps *st,
                                   int64_t n_lists) {
    if ((n_lists > 0 && !st->t) || st->n_seq < 1 || st->per_seq < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: steps t %s, n_seq = %d, per_seq = %d: need the step array "
                             "(n_seq >= 1 entries, one per sequence) and per_seq >= 1",
                             op, st->t ? "set" : "NULL", st->n_seq, st->per_seq);
    return FLEXDIAG_OK;
}

/* ---- Diagonal (kernels.h diag_slots; policy_diagonal.c's rules) ---- */

flexdiag_status flexdiag__cpu_diag_slots(int32_t *slots, int32_t *n_slots, int16_t *lag,
                                         int16_t *cnt, int64_t n_lists, int32_t max_slots,
                                         int32_t a, flexdiag_list_steps steps, int32_t n_r,
                                         int32_t base, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_steps("diag_slots", &steps, n_lists));
    for (int64_t i = 0; i < n_lists; i++) {
        int32_t t = flexdiag__list_step(&steps, i);
        if (t < 0) continue; /* a free slot */
        n_slots[i] = flexdiag__diag_list_plan(lag + i * a, cnt + i, a, base, n_r, t,
                                              slots + i * max_slots);
    }
    return FLEXDIAG_OK;
}

/* ---- H2O / TOVA (kernels.h evict_plan, evict_update; policy_score.c's rules) ---- */

flexdiag_status flexdiag__cpu_evict_plan(int32_t *rows, int32_t *pos, float *acc,
                                         const int32_t *free_slot, int64_t n_lists,
                                         int32_t rows_per_list, int32_t n_att,
                                         flexdiag_list_steps steps, int32_t p_cap,
                                         flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_steps("evict_plan", &steps, n_lists));
    for (int64_t i = 0; i < n_lists; i++) {
        int32_t t = flexdiag__list_step(&steps, i);
        if (t < 0) continue;
        int evicted;
        int32_t f = flexdiag__evict_list_plan(pos + i * n_att, acc ? acc + i * n_att : NULL,
                                              free_slot + i, n_att, t, &evicted);
        for (int32_t r = 0; r < rows_per_list; r++) rows[i * rows_per_list + r] = p_cap + f;
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_evict_update(int32_t *free_slot, float *acc, const int32_t *pos,
                                           const float *probs, int64_t n_lists, int32_t heads,
                                           int32_t max_slots, int32_t n_att,
                                           flexdiag_list_steps steps, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_steps("evict_update", &steps, n_lists));
    for (int64_t i = 0; i < n_lists; i++) {
        int32_t t = flexdiag__list_step(&steps, i);
        if (t < 0) continue;
        flexdiag__kvp_scores sc = {NULL, NULL, probs + i * heads * max_slots, max_slots};
        if (acc)
            flexdiag__h2o_list_update(free_slot + i, acc + i * n_att, pos + i * n_att, &sc, 0,
                                      heads, n_att, t);
        else
            flexdiag__tova_list_update(free_slot + i, pos + i * n_att, &sc, heads, n_att, t);
    }
    return FLEXDIAG_OK;
}

/* ---- ALISA (kernels.h alisa_plan, alisa_update; policy_alisa.c's rules) ---- */

flexdiag_status flexdiag__cpu_alisa_plan(int32_t *slots, int32_t *n_slots, int32_t *rec_pos,
                                         float *rec_p, int32_t *rec_n, float *score,
                                         uint64_t *keys, int64_t n_lists, int32_t copies,
                                         int32_t max_slots, int32_t n_att, int32_t l_dec,
                                         flexdiag_list_steps steps, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_steps("alisa_plan", &steps, n_lists));
    size_t w = (size_t)(n_att - n_att / 2), na = (size_t)n_att;
    for (int64_t i = 0; i < n_lists; i++) {
        int32_t t = flexdiag__list_step(&steps, i);
        if (t < 0 || t >= l_dec) continue; /* a free slot, or past the scratch's l_dec steps */
        int32_t *sl = slots + i * copies * max_slots;
        int32_t n = flexdiag__alisa_plan_list(rec_pos + (size_t)i * w * na,
                                              rec_p + (size_t)i * w * na, rec_n + (size_t)i * w,
                                              n_att, t, score + i * l_dec, keys + i * l_dec, sl);
        for (int32_t h = 0; h < copies; h++) {
            if (h > 0) memcpy(sl + (size_t)h * (size_t)max_slots, sl, (size_t)n * 4);
            n_slots[i * copies + h] = n;
        }
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_alisa_update(float *rec_p, const int32_t *rec_n, const float *probs,
                                           int64_t n_lists, int32_t heads, int32_t max_slots,
                                           int32_t n_att, flexdiag_list_steps steps,
                                           flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_steps("alisa_update", &steps, n_lists));
    size_t w = (size_t)(n_att - n_att / 2);
    for (int64_t i = 0; i < n_lists; i++) {
        int32_t t = flexdiag__list_step(&steps, i);
        if (t < 0) continue;
        flexdiag__kvp_scores sc = {NULL, NULL, probs + i * heads * max_slots, max_slots};
        flexdiag__alisa_list_update(rec_p + (size_t)i * w * (size_t)n_att, rec_n + (size_t)i * w,
                                    &sc, heads, n_att, t);
    }
    return FLEXDIAG_OK;
}

/* ---- decode epilogue ---- */

/* probs_out rows of the group: p = expf(z - lse) of its n ring columns. kernels.h's "0 when
 * lse = -inf" needs no branch: both decodes give lse = -inf only to a head with no keys at all,
 * whose list has no column to write. */
static void decode_probs(const flexdiag_attn_args *a, int64_t hq0, int32_t g, int32_t n,
                         const float *z, int64_t z_stride, const float *lse) {
    for (int32_t q = 0; q < g; q++) {
        float *p = a->probs_out + (hq0 + q) * a->max_slots;
        FLEXDIAG_DASSERT(n == 0 || lse[q] != -INFINITY);
        for (int32_t c = 0; c < n; c++) p[c] = expf(z[q * z_stride + c] - lse[q]);
    }
}

/* The fused build-up update of list li of sequence s: the entry policy/ picks
 * (flexdiag__diag_list_pick over the entries e < n_slots - diag_base) gets lag diag_next[s];
 * nothing when that is negative (s is not at a build-up step). */
static void diag_update(const flexdiag_attn_args *a, int64_t s, int64_t li, int32_t g,
                        const float *z, int64_t z_stride) {
    int32_t next = a->diag_next[s], ns = a->n_slots[li], n = ns - a->diag_base;
    if (next < 0 || n <= 0) return; /* no build-up step, or no candidate (only sinks) */
    int16_t *lag = a->diag_lag + li * a->diag_a;
    lag[flexdiag__diag_list_pick(lag, n, ns, z, z_stride, g)] = (int16_t)next;
}

void flexdiag__cpu_decode_scores(const flexdiag_attn_args *a, int64_t s, int32_t h, const float *z,
                                 int64_t z_stride, const float *lse) {
    int32_t g = a->h_q / a->h_kv;
    int64_t li = flexdiag__slot_list(a, s, h);
    if (a->probs_out)
        decode_probs(a, s * a->h_q + (int64_t)h * g, g, a->n_slots[li], z, z_stride, lse);
    if (a->diag_lag) diag_update(a, s, li, g, z, z_stride);
}
