/*
 * policy_position.c - the position-only policies (docs/policies.md §3.1-§3.3): Dense, SlidingWindow
 * and StreamingLLM. They keep no per-head state: the write slot and the attended slots follow
 * from the step t alone, so plan() computes one list and copies it to every KV head, and the
 * slot -> position map is a closed formula (also used for ALISA, whose ring is slot = position).
 *
 * StreamingLLM keeps decode tokens 0..3 as sinks in slots 0..3 and tokens p >= 4 in a ring of
 * n_att - 4 slots at 4 + (p - 4) mod (n_att - 4); keys are never re-rotated (§3.3 deviation).
 */
#include <string.h>

#include "base/core.h"
#include "policy/kvp_internal.h"

/* Slot of decode token p under streaming with n_att budget. */
static int32_t streaming_slot(int32_t p, int32_t n_att) {
    return p < 4 ? p : 4 + (p - 4) % (n_att - 4);
}

/* Head-0 list of the attended slots at step t; returns its length; *ws the write slot;
 * *evict 1 when the write overwrites a live row. */
static int32_t position_list(const flexdiag_kvp *k, int32_t t, int32_t *s, int32_t *ws,
                             int *evict) {
    int32_t n = 0, na = k->p.n_att;
    *evict = 0;
    switch (k->p.kind) {
    case FLEXDIAG_POLICY_WINDOW:
        *ws = t % na;
        *evict = t >= na;
        for (int32_t p = t - na + 1 < 0 ? 0 : t - na + 1; p <= t; p++) s[n++] = p % na;
        return n;
    case FLEXDIAG_POLICY_STREAMING:
        *ws = streaming_slot(t, na);
        *evict = t >= na;
        if (t >= na) { /* sinks, then the recent lags 0..n_att-5 */
            for (int32_t p = 0; p < 4; p++) s[n++] = p;
            for (int32_t p = t - na + 5; p <= t; p++) s[n++] = streaming_slot(p, na);
        } else {
            for (int32_t p = 0; p <= t; p++) s[n++] = streaming_slot(p, na);
        }
        return n;
    default: /* dense */
        *ws = t;
        for (int32_t p = 0; p <= t; p++) s[n++] = p;
        return n;
    }
}

void flexdiag__kvp_plan_position(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                 int32_t *ws, int32_t *slots, int32_t *ns) {
    int evict;
    int32_t w, n = position_list(k, t, slots, &w, &evict);
    FLEXDIAG_DASSERT(n == (t + 1 < k->max_slots ? t + 1 : k->max_slots));
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        ws[h] = w;
        ns[h] = n;
        if (h > 0) memcpy(slots + (size_t)h * (size_t)k->max_slots, slots, (size_t)n * 4);
    }
    if (evict) k->evictions[flexdiag__kvp_li(k, seq, layer)] += (uint64_t)k->p.h_kv;
}

int32_t flexdiag__kvp_pos_position(const flexdiag_kvp *k, int32_t t, int32_t slot) {
    switch (k->p.kind) {
    case FLEXDIAG_POLICY_WINDOW: return flexdiag__kvp_ring_pos(t, k->p.n_att, slot);
    case FLEXDIAG_POLICY_STREAMING: {
        if (slot < 4) return t >= slot ? slot : -1;
        int32_t p = flexdiag__kvp_ring_pos(t - 4, k->p.n_att - 4, slot - 4);
        return p < 0 ? -1 : p + 4;
    }
    default: return t >= slot ? slot : -1; /* dense, alisa: slot = position */
    }
}

int flexdiag__kvp_plan_shared(flexdiag_kvp *k, int32_t t, int32_t s0, int32_t n, int32_t *ws,
                              int32_t *slots, int32_t *ns) {
    if (k->p.kind != FLEXDIAG_POLICY_DENSE && k->p.kind != FLEXDIAG_POLICY_WINDOW &&
        k->p.kind != FLEXDIAG_POLICY_STREAMING)
        return 0;
    FLEXDIAG_ASSERT(t >= 0 && t < k->p.l_dec && s0 >= 0 && n >= 0 && s0 + n <= k->p.n_seq);
    int evict;
    *ns = position_list(k, t, slots, ws, &evict);
    for (int32_t s = s0; evict && s < s0 + n; s++)
        for (int32_t l = 0; l < k->p.n_layers; l++)
            k->evictions[flexdiag__kvp_li(k, s, l)] += (uint64_t)k->p.h_kv;
    return 1;
}
