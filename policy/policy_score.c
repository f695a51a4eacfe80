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
#include <string.h>

#include "base/core.h"
#include "policy/kvp_internal.h"

/* The family's state (k->fam): a slot map per list (H2O: per (seq, layer, KV head); TOVA: per
 * (seq, layer)) and H2O's accumulated probabilities. */
typedef struct evict_state {
    int32_t *pos;       /* (lists, n_att) decode position held by each slot, -1 = empty */
    float *acc;         /* H2O (lists, n_att) accumulated probability; NULL for TOVA */
    int32_t *free_slot; /* (lists) victim slot that receives the next token once all slots are
                           occupied */
    int32_t per_seq;    /* lists per (seq, layer): h_kv for H2O, 1 for TOVA */
} evict_state;

static evict_state *est(flexdiag_kvp *k) { return (evict_state *)(void *)k->fam; }

/* Index of the list of (seq, layer, KV head h) (TOVA: h ignored). */
static size_t list_of(const flexdiag_kvp *k, int32_t seq, int32_t layer, int32_t h) {
    const evict_state *e = (const evict_state *)(const void *)k->fam;
    return flexdiag__kvp_li(k, seq, layer) * (size_t)e->per_seq + (size_t)(e->per_seq > 1 ? h : 0);
}

static void evict_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    evict_state *e = est(k);
    e->per_seq = k->cls->traits.per_kv_head ? k->p.h_kv : 1;
    uint64_t lists = (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers * (uint64_t)e->per_seq;
    uint64_t na = (uint64_t)k->p.n_att;
    e->pos = flexdiag__kvp_take(c, lists * na, sizeof(int32_t));
    e->acc = k->cls->traits.per_kv_head ? flexdiag__kvp_take(c, lists * na, sizeof(float)) : NULL;
    e->free_slot = flexdiag__kvp_take(c, lists, sizeof(int32_t));
}

static void evict_reset_seq(flexdiag_kvp *k, int32_t seq) {
    evict_state *e = est(k);
    size_t l0 = list_of(k, seq, 0, 0), ln = (size_t)k->p.n_layers * (size_t)e->per_seq;
    size_t na = (size_t)k->p.n_att;
    for (size_t i = l0 * na; i < (l0 + ln) * na; i++) e->pos[i] = -1;
    if (e->acc) memset(e->acc + l0 * na, 0, ln * na * sizeof(float));
    memset(e->free_slot + l0, 0, ln * sizeof(int32_t));
}

static int32_t evict_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                         int32_t slot) {
    (void)t;
    const evict_state *e = (const evict_state *)(const void *)k->fam;
    return e->pos[list_of(k, seq, layer, h) * (size_t)k->p.n_att + (size_t)slot];
}

/* Occupied slots 0..n-1 into s; returns n = min(t+1, n_att). */
static int32_t occupied_slots(const flexdiag_kvp *k, int32_t t, int32_t *s) {
    int32_t n = t + 1 < k->p.n_att ? t + 1 : k->p.n_att;
    for (int32_t j = 0; j < n; j++) s[j] = j;
    return n;
}

static int32_t budget_rows(const flexdiag_kvp_params *p) { return p->n_att; }

static int64_t budget_resident(const flexdiag_kvp_params *p, int32_t t) {
    return (int64_t)t + 1 < p->n_att ? (int64_t)t + 1 : p->n_att;
}

/* Token t goes to slot t while slots are free; afterwards each head's own victim (-1). */
static int32_t budget_write(const flexdiag_kvp_params *p, int32_t t) {
    return t < p->n_att ? t : -1;
}

/* ---- the per-list rules (kv_policy.h) ---- */

int32_t flexdiag__evict_list_plan(int32_t *pos, float *acc, const int32_t *free_slot,
                                  int32_t n_att, int32_t t, int *evicted) {
    for (int32_t j = 0; t == 0 && j < n_att; j++) { /* a new run: empty slots */
        pos[j] = -1;
        if (acc) acc[j] = 0.0f;
    }
    int32_t f = t < n_att ? t : *free_slot;
    *evicted = pos[f] >= 0;
    pos[f] = t;
    if (acc) acc[f] = 0.0f;
    return f;
}

void flexdiag__hh_list_update(int32_t *free_slot, float *acc, const int32_t *pos,
                              const flexdiag__kvp_scores *sc, int32_t q0, int32_t g,
                              int32_t n_att, int32_t recent, int32_t t) {
    int32_t n = t + 1 < n_att ? t + 1 : n_att, victim = -1;
    for (int32_t j = 0; j < n; j++) { /* group sum of full-row probabilities */
        float gs = 0.0f;
        for (int32_t q = 0; q < g; q++) gs += flexdiag__kvp_prob(sc, q0 + q, j);
        acc[j] += gs;
    }
    if (n < n_att) return;
    for (int32_t j = 0; j < n_att; j++) {
        if (pos[j] > t - recent + 1) continue; /* protected recent lags */
        if (victim < 0 || acc[j] < acc[victim] || (acc[j] == acc[victim] && pos[j] < pos[victim]))
            victim = j;
    }
    *free_slot = victim;
}

void flexdiag__h2o_list_update(int32_t *free_slot, float *acc, const int32_t *pos,
                               const flexdiag__kvp_scores *sc, int32_t q0, int32_t g,
                               int32_t n_att, int32_t t) {
    flexdiag__hh_list_update(free_slot, acc, pos, sc, q0, g, n_att, n_att - n_att / 2, t);
}

void flexdiag__tova_list_update(int32_t *free_slot, const int32_t *pos,
                                const flexdiag__kvp_scores *sc, int32_t h_q, int32_t n_att,
                                int32_t t) {
    if (t + 1 < n_att) return; /* a free slot remains: nothing to evict yet */
    int32_t victim = -1;
    float best = 0.0f;
    for (int32_t j = 0; j < n_att; j++) {
        float m = 0.0f;
        for (int32_t q = 0; q < h_q; q++) m += flexdiag__kvp_prob(sc, q, j);
        m /= (float)h_q; /* head mean */
        if (victim < 0 || m < best || (m == best && pos[j] < pos[victim])) {
            victim = j;
            best = m;
        }
    }
    *free_slot = victim;
}

/* ---- H2O ---- */

static void h2o_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                     int32_t *slots, int32_t *ns) {
    evict_state *e = est(k);
    size_t na = (size_t)k->p.n_att;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = list_of(k, seq, layer, h);
        int evicted;
        ws[h] = flexdiag__evict_list_plan(e->pos + hi * na, e->acc + hi * na, e->free_slot + hi,
                                          k->p.n_att, t, &evicted);
        if (evicted) k->evictions[flexdiag__kvp_li(k, seq, layer)]++;
        ns[h] = occupied_slots(k, t, slots + (size_t)h * (size_t)k->max_slots);
    }
}

static int h2o_needs(const flexdiag_kvp *k, int32_t t) {
    (void)t;
    return k->p.n_att < k->p.l_dec;
}

static void h2o_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                       const flexdiag__kvp_scores *sc) {
    evict_state *e = est(k);
    size_t na = (size_t)k->p.n_att;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = list_of(k, seq, layer, h);
        flexdiag__h2o_list_update(e->free_slot + hi, e->acc + hi * na, e->pos + hi * na, sc,
                                  h * k->g, k->g, k->p.n_att, t);
    }
}

const flexdiag_kvp_class flexdiag__kvp_h2o = {
    .name = "h2o",
    .traits = {"accumulated p", "KV head", "sum", "permanent", "N_att",
               "acc update + argmin over H+1", 1, FLEXDIAG_KVP_DEV_SLOT_MAP, 0, 0, 1},
    .ring_rows = budget_rows,
    .max_slots = budget_rows,
    .resident_rows = budget_resident,
    .write_slot = budget_write,
    .state_size = sizeof(evict_state),
    .layout = evict_layout,
    .reset_seq = evict_reset_seq,
    .plan = h2o_plan,
    .needs_scores = h2o_needs,
    .update = h2o_update,
    .slot_pos = evict_pos,
};

/* ---- TOVA ---- */

static void tova_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                      int32_t *slots, int32_t *ns) {
    evict_state *e = est(k);
    size_t li = list_of(k, seq, layer, 0);
    int evicted;
    int32_t f = flexdiag__evict_list_plan(e->pos + li * (size_t)k->p.n_att, NULL,
                                          e->free_slot + li, k->p.n_att, t, &evicted);
    if (evicted) /* one row per KV head */
        k->evictions[flexdiag__kvp_li(k, seq, layer)] += (uint64_t)k->p.h_kv;
    int32_t n = occupied_slots(k, t, slots);
    flexdiag__kvp_fill_heads(k, f, n, ws, slots, ns);
}

static int tova_needs(const flexdiag_kvp *k, int32_t t) { return t >= k->p.n_att - 1; }

static void tova_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                        const flexdiag__kvp_scores *sc) {
    evict_state *e = est(k);
    size_t li = list_of(k, seq, layer, 0);
    flexdiag__tova_list_update(e->free_slot + li, e->pos + li * (size_t)k->p.n_att, sc, k->p.h_q,
                               k->p.n_att, t);
}

const flexdiag_kvp_class flexdiag__kvp_tova = {
    .name = "tova",
    .traits = {"current p", "layer", "mean", "permanent", "N_att",
               "head mean + argmin over N_att", 1, FLEXDIAG_KVP_DEV_SLOT_MAP, 0, 0, 0},
    .ring_rows = budget_rows,
    .max_slots = budget_rows,
    .resident_rows = budget_resident,
    .write_slot = budget_write,
    .state_size = sizeof(evict_state),
    .layout = evict_layout,
    .reset_seq = evict_reset_seq,
    .plan = tova_plan,
    .needs_scores = tova_needs,
    .update = tova_update,
    .slot_pos = evict_pos,
};
