/*
 * kvp_mixed.c - the semantic lists SSD and HACK share (kvp_mixed.h) and the check that a
 * head-typed policy was given the plan made for it. A semantic list is H2O's slot map
 * (flexdiag__evict_list_plan) with the recent window K = 2 (flexdiag__hh_list_update): the
 * candidates of the update at step t are every resident token but t itself, so the list keeps
 * the top b - 2 of the past by accumulated attention, then token t, then token t + 1
 * (docs/policies.md §9.2).
 */
#include <string.h>

#include "base/core.h"
#include "policy/kvp_mixed.h"

static size_t list_at(const flexdiag_kvp *k, int32_t seq, int32_t layer, int32_t h) {
    return flexdiag__kvp_hi(k, seq, layer, h);
}

void flexdiag__sem_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c, flexdiag__sem_lists *s) {
    uint64_t lists = (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers * (uint64_t)k->p.h_kv;
    s->b = flexdiag__kvp_plan_of(k)->b_c;
    s->pos = flexdiag__kvp_take(c, lists * (uint64_t)s->b, sizeof(int32_t));
    s->acc = flexdiag__kvp_take(c, lists * (uint64_t)s->b, sizeof(float));
    s->free_slot = flexdiag__kvp_take(c, lists, sizeof(int32_t));
}

void flexdiag__sem_reset_seq(const flexdiag_kvp *k, flexdiag__sem_lists *s, int32_t seq) {
    if (s->b == 0) return;
    size_t l0 = list_at(k, seq, 0, 0), ln = (size_t)k->p.n_layers * (size_t)k->p.h_kv;
    size_t b = (size_t)s->b;
    for (size_t i = l0 * b; i < (l0 + ln) * b; i++) s->pos[i] = -1;
    memset(s->acc + l0 * b, 0, ln * b * sizeof(float));
    memset(s->free_slot + l0, 0, ln * sizeof(int32_t));
}

int32_t flexdiag__sem_plan(flexdiag_kvp *k, flexdiag__sem_lists *s, int32_t layer, int32_t t,
                           int32_t seq, int32_t h, int32_t *ws, int32_t *slots) {
    size_t li = list_at(k, seq, layer, h), b = (size_t)s->b;
    int evicted;
    *ws = flexdiag__evict_list_plan(s->pos + li * b, s->acc + li * b, s->free_slot + li, s->b, t,
                                    &evicted);
    if (evicted) k->evictions[flexdiag__kvp_li(k, seq, layer)]++;
    int32_t n = t + 1 < s->b ? t + 1 : s->b;
    for (int32_t j = 0; j < n; j++) slots[j] = j;
    return n;
}

void flexdiag__sem_update(const flexdiag_kvp *k, flexdiag__sem_lists *s, int32_t layer,
                          int32_t t, int32_t seq, int32_t h, const flexdiag__kvp_scores *sc) {
    size_t li = list_at(k, seq, layer, h), b = (size_t)s->b;
    flexdiag__hh_list_update(s->free_slot + li, s->acc + li * b, s->pos + li * b, sc, h * k->g,
                             k->g, s->b, FLEXDIAG_SEM_RECENT, t);
}

int32_t flexdiag__sem_pos(const flexdiag_kvp *k, const flexdiag__sem_lists *s, int32_t layer,
                          int32_t seq, int32_t h, int32_t slot) {
    if (slot >= s->b) return -1;
    return s->pos[list_at(k, seq, layer, h) * (size_t)s->b + (size_t)slot];
}

flexdiag_status flexdiag__kvp_plan_check(const flexdiag_kvp_params *p) {
    const flexdiag_kvp_heads *hd = p->heads;
    const char *name = flexdiag__kvp_name(p->kind);
    if (!hd)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy %s needs a calibration table: give "
                             "context_params.policy_calib (a file made by flexdiag-bench "
                             "calibrate for this model)", name);
    if (hd->kind != p->kind || hd->n_att != p->n_att || hd->l_dec != p->l_dec ||
        hd->w_s != p->w_s || hd->n_layers != p->n_layers || hd->h_kv != p->h_kv)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy %s: its head plan was made for "
                             "%s, N_att %d, L_dec %d, W_s %d, %d layers x %d KV heads, not for "
                             "N_att %d, L_dec %d, W_s %d, %d x %d", name,
                             flexdiag__kvp_name(hd->kind), (int)hd->n_att, (int)hd->l_dec,
                             (int)hd->w_s, (int)hd->n_layers, (int)hd->h_kv, (int)p->n_att,
                             (int)p->l_dec, (int)p->w_s, (int)p->n_layers, (int)p->h_kv);
    return FLEXDIAG_OK;
}
