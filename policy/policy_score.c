/*
 * policy_score.c - the probability-driven eviction policies H2O (docs/policies.md §3.4, per KV
 * head, HF real-drop semantics) and TOVA (§3.5, per layer, one slot map shared by all KV heads).
 *
 * Both keep an N_att-slot array with the decode position of each slot. While t < N_att token t
 * goes to slot t; afterwards update(t-1) has chosen a victim slot, and plan(t) writes token t
 * over it (the overwrite is the eviction). update() reads full-row probabilities
 * p = expf(logit - lse) in fp32 (the attention kernel's probability epilogue, or computed here):
 *   H2O   acc[s] += sum over the group's query heads of p; once all slots are occupied the
 *         victim is argmin (acc, pos) over slots with pos <= t - R + 1 (H heavy + the token
 *         leaving the recent window of R = N_att - floor(N_att/2) lags);
 *   TOVA  score[s] = (sum over all h_q heads of p) / h_q, victim = argmin (score, pos) over all
 *         N_att slots, the new token included; nothing persists between steps.
 * Ties evict the older token. Slot lists are the occupied slots in ascending slot order.
 */
#include <math.h>

#include "base/core.h"
#include "policy/kvp_internal.h"

/* Occupied slots 0..n-1 into s; returns n = min(t+1, n_att). */
static int32_t occupied_slots(const flexdiag_kvp *k, int32_t t, int32_t *s) {
    int32_t n = t + 1 < k->p.n_att ? t + 1 : k->p.n_att;
    for (int32_t j = 0; j < n; j++) s[j] = j;
    return n;
}

/* ---- H2O ---- */

void flexdiag__kvp_plan_h2o(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                            int32_t *slots, int32_t *ns) {
    size_t na = (size_t)k->p.n_att;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        int32_t *pos = k->pos + hi * na;
        int32_t f = t < k->p.n_att ? t : k->free_slot[hi];
        if (pos[f] >= 0) k->evictions[flexdiag__kvp_li(k, seq, layer)]++;
        pos[f] = t;
        k->acc[hi * na + (size_t)f] = 0.0f;
        ws[h] = f;
        ns[h] = occupied_slots(k, t, slots + (size_t)h * (size_t)k->max_slots);
    }
}

void flexdiag__kvp_update_h2o(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                              const flexdiag__kvp_scores *sc) {
    int32_t na = k->p.n_att, g = k->g;
    int32_t n = t + 1 < na ? t + 1 : na, recent = na - na / 2;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        const int32_t *pos = k->pos + hi * (size_t)na;
        float *acc = k->acc + hi * (size_t)na;
        for (int32_t j = 0; j < n; j++) { /* group sum of full-row probabilities */
            float gs = 0.0f;
            for (int32_t q = 0; q < g; q++) gs += flexdiag__kvp_prob(sc, h * g + q, j);
            acc[j] += gs;
        }
        if (n < na) continue;
        int32_t victim = -1, ncand = 0;
        for (int32_t j = 0; j < na; j++) {
            if (pos[j] > t - recent + 1) continue; /* protected recent lags */
            ncand++;
            if (victim < 0 || acc[j] < acc[victim] ||
                (acc[j] == acc[victim] && pos[j] < pos[victim]))
                victim = j;
        }
        FLEXDIAG_DASSERT(ncand == na / 2 + 1);
        (void)ncand;
        k->free_slot[hi] = victim;
    }
}

/* ---- TOVA ---- */

void flexdiag__kvp_plan_tova(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                             int32_t *ws, int32_t *slots, int32_t *ns) {
    size_t li = flexdiag__kvp_li(k, seq, layer);
    int32_t *pos = k->pos + li * (size_t)k->p.n_att;
    int32_t f = t < k->p.n_att ? t : k->free_slot[li];
    if (pos[f] >= 0) k->evictions[li] += (uint64_t)k->p.h_kv; /* one row per KV head */
    pos[f] = t;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        ws[h] = f;
        ns[h] = occupied_slots(k, t, slots + (size_t)h * (size_t)k->max_slots);
    }
}

void flexdiag__kvp_update_tova(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                               const flexdiag__kvp_scores *sc) {
    int32_t na = k->p.n_att, hq_n = k->p.h_q;
    if (t + 1 < na) return; /* a free slot remains: nothing to evict yet */
    size_t li = flexdiag__kvp_li(k, seq, layer);
    const int32_t *pos = k->pos + li * (size_t)na;
    int32_t victim = -1;
    float best = 0.0f;
    for (int32_t j = 0; j < na; j++) {
        float s = 0.0f;
        for (int32_t hq = 0; hq < hq_n; hq++) s += flexdiag__kvp_prob(sc, hq, j);
        s /= (float)hq_n; /* head mean */
        if (victim < 0 || s < best || (s == best && pos[j] < pos[victim])) {
            victim = j;
            best = s;
        }
    }
    k->free_slot[li] = victim;
}
