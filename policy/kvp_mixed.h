/*
 * kvp_mixed.h - what the head-typed policies SSD (policy_ssd.c) and HACK (policy_hack.c) share
 * inside policy/: the semantic lists (SSD semantic, HACK contextual heads; docs/policies.md
 * §9.2), each the H2O slot map of §3.4 with the recent window K = 2 at the plan's budget b_c,
 * kept for every (sequence, layer, KV head) so a list is found by index; only the heads the plan
 * (kvp_calib.h flexdiag_kvp_heads) types semantic use theirs.
 */
#ifndef FLEXDIAG_KVP_MIXED_H
#define FLEXDIAG_KVP_MIXED_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_POLICY)
#error "policy/kvp_mixed.h is private to policy/ (docs/architecture.md)"
#endif

#include "policy/kvp_calib.h"
#include "policy/kvp_internal.h"

#define FLEXDIAG_SEM_RECENT 2 /* K: the newest tokens a semantic list never evicts */

typedef struct flexdiag__sem_lists {
    int32_t *pos;       /* (n_seq, n_layers, h_kv, b) decode position of each slot, -1 = empty */
    float *acc;         /* (n_seq, n_layers, h_kv, b) accumulated group-summed probability */
    int32_t *free_slot; /* (n_seq, n_layers, h_kv) the victim of the last update */
    int32_t b;          /* slots per list: the plan's b_c */
} flexdiag__sem_lists;

/* The plan of k (params heads; the classes' check made sure it is there). */
static inline const flexdiag_kvp_heads *flexdiag__kvp_plan_of(const flexdiag_kvp *k) {
    return k->p.heads;
}

void flexdiag__sem_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c, flexdiag__sem_lists *s);
void flexdiag__sem_reset_seq(const flexdiag_kvp *k, flexdiag__sem_lists *s, int32_t seq);
/* Step t of the semantic list (layer, seq, h): token t into slot t while free, else the last
 * update's victim (an eviction counted); its occupied slots 0..n-1 into slots; returns n. */
int32_t flexdiag__sem_plan(flexdiag_kvp *k, flexdiag__sem_lists *s, int32_t layer, int32_t t,
                           int32_t seq, int32_t h, int32_t *ws, int32_t *slots);
/* After step t: acc += the group sums of sc's probabilities (column j = slot j); once full, the
 * victim is argmin (acc, pos) over the slots with pos <= t - 1. */
void flexdiag__sem_update(const flexdiag_kvp *k, flexdiag__sem_lists *s, int32_t layer,
                          int32_t t, int32_t seq, int32_t h, const flexdiag__kvp_scores *sc);
/* Position in slot `slot` of the list (-1: empty or past b). */
int32_t flexdiag__sem_pos(const flexdiag_kvp *k, const flexdiag__sem_lists *s, int32_t layer,
                          int32_t seq, int32_t h, int32_t slot);
/* Whether the plan's check passes for k's params: a plan made for this kind, budget and model
 * (FLEXDIAG_ERR_INVALID_ARG naming the missing table otherwise). */
flexdiag_status flexdiag__kvp_plan_check(const flexdiag_kvp_params *p);

#endif /* FLEXDIAG_KVP_MIXED_H */
