/*
 * policy_position.c - the position-only policies (docs/policies.md §3.1-§3.3): Dense, SlidingWindow
 * and StreamingLLM. They keep no state: the write slot and the attended slots follow from the
 * step t alone, so one list serves every (layer, sequence, KV head) at that step
 * (flexdiag__kvp_plan_shared), and the slot -> position map is a closed formula.
 *
 * StreamingLLM keeps decode tokens 0..3 as sinks in slots 0..3 and tokens p >= 4 in a ring of
 * n_att - 4 slots at 4 + (p - 4) mod (n_att - 4); keys are never re-rotated (§3.3 deviation).
 */
#include "base/core.h"
#include "policy/kvp_internal.h"

/* Plan of one (layer, sequence): the shared list copied to every KV head, evictions counted. */
static void position_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                          int32_t *slots, int32_t *ns) {
    int evict;
    int32_t w, n = k->cls->shared_list(k, t, slots, &w, &evict);
    FLEXDIAG_DASSERT(n == (t + 1 < k->max_slots ? t + 1 : k->max_slots));
    flexdiag__kvp_fill_heads(k, w, n, ws, slots, ns);
    if (evict) k->evictions[flexdiag__kvp_li(k, seq, layer)] += (uint64_t)k->p.h_kv;
}

/* Ring rows of window and streaming: the budget plus the window passes' slack. */
static int32_t rows_budget(const flexdiag_kvp_params *p) { return p->n_att + p->slack; }

/* Plan ahead: the step's shared list on every head (nothing is counted). */
static void position_ahead(const flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                           int32_t *ws, int32_t *slots, int32_t *ns) {
    (void)layer, (void)seq;
    int evict;
    int32_t w, n = k->cls->shared_list(k, t, slots, &w, &evict);
    flexdiag__kvp_fill_heads(k, w, n, ws, slots, ns);
}

static int64_t resident_budget(const flexdiag_kvp_params *p, int32_t t) {
    return (int64_t)t + 1 < rows_budget(p) ? (int64_t)t + 1 : rows_budget(p);
}

static int32_t budget_slots(const flexdiag_kvp_params *p) { return p->n_att; }

/* ---- dense: slot = position ---- */

static int32_t dense_rows(const flexdiag_kvp_params *p) { return p->l_dec; }

static int64_t dense_resident(const flexdiag_kvp_params *p, int32_t t) {
    (void)p;
    return (int64_t)t + 1;
}

static int32_t dense_write(const flexdiag_kvp_params *p, int32_t t) {
    (void)p;
    return t;
}

static int32_t dense_list(const flexdiag_kvp *k, int32_t t, int32_t *s, int32_t *ws,
                          int *evict) {
    (void)k;
    *ws = t;
    *evict = 0;
    for (int32_t p = 0; p <= t; p++) s[p] = p;
    return t + 1;
}

static int32_t dense_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                         int32_t slot) {
    (void)k, (void)layer, (void)seq, (void)h;
    return t >= slot ? slot : -1;
}

const flexdiag_kvp_class flexdiag__kvp_dense = {
    .name = "dense",
    .traits = {"-", "-", "n/a", "none", "full", "none", 0, FLEXDIAG_KVP_DEV_POSITION, 0, 0, 0},
    .ring_rows = dense_rows,
    .max_slots = dense_rows,
    .resident_rows = dense_resident,
    .write_slot = dense_write,
    .plan = position_plan,
    .plan_ahead = position_ahead,
    .slot_pos = dense_pos,
    .shared_list = dense_list,
};

/* ---- window: the last n_att tokens, slot = position mod R (R = n_att + slack) ---- */

static int32_t window_write(const flexdiag_kvp_params *p, int32_t t) {
    return t % rows_budget(p);
}

static int32_t window_list(const flexdiag_kvp *k, int32_t t, int32_t *s, int32_t *ws,
                           int *evict) {
    int32_t n = 0, na = k->p.n_att, r = k->ring;
    *ws = t % r;
    *evict = t >= r;
    for (int32_t p = t - na + 1 < 0 ? 0 : t - na + 1; p <= t; p++) s[n++] = p % r;
    return n;
}

static int32_t window_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h,
                          int32_t t, int32_t slot) {
    (void)layer, (void)seq, (void)h;
    return flexdiag__kvp_ring_pos(t, k->ring, slot);
}

const flexdiag_kvp_class flexdiag__kvp_window = {
    .name = "window",
    .traits = {"position", "global", "n/a", "permanent", "N_att", "none", 0,
               FLEXDIAG_KVP_DEV_POSITION, 0, 0, 0},
    .ring_rows = rows_budget,
    .max_slots = budget_slots,
    .resident_rows = resident_budget,
    .write_slot = window_write,
    .plan = position_plan,
    .plan_ahead = position_ahead,
    .slot_pos = window_pos,
    .shared_list = window_list,
};

/* ---- streaming: 4 sinks, then a ring of n_att - 4 (+ slack) ---- */

static int32_t streaming_write(const flexdiag_kvp_params *p, int32_t t) {
    return t < 4 ? t : 4 + (t - 4) % (rows_budget(p) - 4);
}

static int32_t streaming_list(const flexdiag_kvp *k, int32_t t, int32_t *s, int32_t *ws,
                              int *evict) {
    int32_t n = 0, na = k->p.n_att;
    *ws = streaming_write(&k->p, t);
    *evict = t >= k->ring;
    if (t >= na) { /* sinks, then the recent lags 0..n_att-5 */
        for (int32_t p = 0; p < 4; p++) s[n++] = p;
        for (int32_t p = t - na + 5; p <= t; p++) s[n++] = streaming_write(&k->p, p);
    } else {
        for (int32_t p = 0; p <= t; p++) s[n++] = streaming_write(&k->p, p);
    }
    return n;
}

static int32_t streaming_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h,
                             int32_t t, int32_t slot) {
    (void)layer, (void)seq, (void)h;
    if (slot < 4) return t >= slot ? slot : -1;
    int32_t p = flexdiag__kvp_ring_pos(t - 4, k->ring - 4, slot - 4);
    return p < 0 ? -1 : p + 4;
}

const flexdiag_kvp_class flexdiag__kvp_streaming = {
    .name = "streaming",
    .traits = {"position", "global", "n/a", "permanent", "N_att", "none", 0,
               FLEXDIAG_KVP_DEV_POSITION, 4, 0, 0},
    .ring_rows = rows_budget,
    .max_slots = budget_slots,
    .resident_rows = resident_budget,
    .write_slot = streaming_write,
    .plan = position_plan,
    .plan_ahead = position_ahead,
    .slot_pos = streaming_pos,
    .shared_list = streaming_list,
};
