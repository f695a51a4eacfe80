/*
 * policy_diagonal.c - the Diagonal policy (paper Algorithm 1 as docs/policies.md §2.3 restates it)
 * and Diagonal+sink4 (§2.8), per (sequence, layer, KV head).
 *
 * State is the attended-lag list lag[0..A-1] (int16) and its fill cnt; the skip set is implicit
 * (the lags 0..min(t, N_r-1) missing from the list). Token t lives in ring slot t mod N_r, so the
 * write of token t overwrites token t - N_r, the token Algorithm 1 evicts. Per step:
 *   plan(t)   append lag t to the list while t <= A-1 (the end-of-step append of step t-1, done
 *             here so that update() is needed only in build-up steps), then attend slot
 *             (t - lag[j]) mod N_r for every list entry;
 *   update(t) only in build-up steps A-1 <= t <= N_r-2: j* = argmin (score, -lag) over the list,
 *             score = max over the group's query heads of the fp32 logit; lag[j*] = t + 1.
 * The absolute-index transcription (skip positions shifted +1 per step) was rejected as the
 * state: it needs a scan of the window per step; the lag list gives exactly A gathers.
 * Diagonal+sink4 runs the same machine on the inner step t - 4 with A - 4 entries behind 4 sink
 * slots that are always attended and never lag candidates.
 * Slot lists carry list entry j at column base + cnt-1-j: while the list is [0, 1, .., cnt-1]
 * (no skip yet) the slots come out oldest first, the order Dense uses, so with N_att >= L_dec
 * the attention sums in the same order and Diagonal's output equals Dense's bit for bit.
 */
#include "base/core.h"
#include "policy/kvp_internal.h"

/* Sink rows in front of the ring (0 or 4). */
static int32_t diag_base(const flexdiag_kvp *k) {
    return k->p.kind == FLEXDIAG_POLICY_DIAGONAL_SINK4 ? 4 : 0;
}

/* Advance one head's list to inner step ti and write its attended slots after the sinks. */
static int32_t diag_head_slots(const flexdiag_kvp *k, int16_t *lag, int16_t *cnt, int32_t ti,
                               int32_t base, int32_t *s) {
    int32_t r = k->p.n_r;
    if (ti == 0) {
        lag[0] = 0;
        *cnt = 1;
    } else if (ti <= k->a - 1) {
        lag[(*cnt)++] = (int16_t)ti; /* phase 1: the newly available lag joins the list */
    }
    FLEXDIAG_DASSERT(*cnt == (ti + 1 < k->a ? ti + 1 : k->a));
    for (int32_t j = 0; j < base; j++) s[j] = j;
    for (int32_t j = 0; j < *cnt; j++) { /* list entry j at column base + cnt-1-j (see top) */
        FLEXDIAG_DASSERT(lag[j] >= 0 && lag[j] <= ti && lag[j] <= r - 1);
        s[base + *cnt - 1 - j] = base + (ti - lag[j]) % r;
    }
    return base + *cnt;
}

void flexdiag__kvp_plan_diagonal(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                 int32_t *ws, int32_t *slots, int32_t *ns) {
    int32_t base = diag_base(k), ti = t - base;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        int32_t *s = slots + (size_t)h * (size_t)k->max_slots;
        if (ti < 0) { /* sink4, t <= 3: sink t is written, decode tokens 0..t attended */
            for (int32_t j = 0; j <= t; j++) s[j] = j;
            ws[h] = t;
            ns[h] = t + 1;
            continue;
        }
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        ns[h] = diag_head_slots(k, k->lag + hi * (size_t)k->a, k->cnt + hi, ti, base, s);
        ws[h] = base + ti % k->p.n_r;
    }
    if (ti >= k->p.n_r) k->evictions[flexdiag__kvp_li(k, seq, layer)] += (uint64_t)k->p.h_kv;
}

int flexdiag__kvp_needs_diagonal(const flexdiag_kvp *k, int32_t t) {
    int32_t ti = t - diag_base(k);
    return ti >= k->a - 1 && ti >= 0 && ti <= k->p.n_r - 2;
}

/* Group score of list entry j: max over the g query heads of KV head h (fp32 logits). */
static float diag_score(const flexdiag_kvp *k, const float *logits, int32_t h, int32_t col) {
    const float *row = logits + (size_t)h * (size_t)k->g * (size_t)k->max_slots + col;
    float best = row[0];
    for (int32_t q = 1; q < k->g; q++) {
        float v = row[(size_t)q * (size_t)k->max_slots];
        if (v > best) best = v;
    }
    return best;
}

void flexdiag__kvp_update_diagonal(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                   const float *logits) {
    int32_t base = diag_base(k), ti = t - base;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        int16_t *lag = k->lag + hi * (size_t)k->a;
        FLEXDIAG_DASSERT(k->cnt[hi] == k->a);
        int32_t best = 0;
        float best_s = diag_score(k, logits, h, base + k->a - 1);
        for (int32_t j = 1; j < k->a; j++) { /* lexicographic min of (score, -lag) */
            float s = diag_score(k, logits, h, base + k->a - 1 - j);
            if (s < best_s || (s == best_s && lag[j] > lag[best])) {
                best = j;
                best_s = s;
            }
        }
        lag[best] = (int16_t)(ti + 1); /* lag[best] is skipped from step t+1 on */
    }
}

int32_t flexdiag__kvp_pos_diagonal(const flexdiag_kvp *k, int32_t t, int32_t slot) {
    int32_t base = diag_base(k);
    if (slot < base) return t >= slot ? slot : -1;
    int32_t p = flexdiag__kvp_ring_pos(t - base, k->p.n_r, slot - base);
    return p < 0 ? -1 : p + base;
}
