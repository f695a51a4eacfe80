/*
 * policy_ssd.c - SSD (`ssd`, docs/policies.md §9): spatial and semantic heads. A calibration
 * table types each (layer, KV head) once per context (kvp_heads.c: spatial iff the local mass
 * lambda(N_att) = sum_{l < N_att} P(l) is at least tau), the same for every sequence and both
 * CFG rows; both types attend at most N_att decode tokens a step, so R = max_slots = N_att.
 *   spatial   the window of §3.2 on that head: token t in slot t mod N_att, attends positions
 *             max(0, t - N_att + 1) .. t in ascending order; no scores;
 *   semantic  H2O's slot map with K = 2 at N_att (kvp_mixed.c): keeps the N_att - 2 tokens of
 *             the past with the largest accumulated group-summed probability, plus the two
 *             newest; reads probabilities every step.
 * The plan (types, lambda) lives in flexdiag_kvp_params.heads, read-only and shared; the state
 * is the semantic lists, per (sequence, layer, KV head).
 */
#include "base/core.h"
#include "policy/kvp_mixed.h"

typedef struct ssd_state {
    flexdiag__sem_lists sem; /* the semantic lists */
} ssd_state;

static ssd_state *sst(flexdiag_kvp *k) { return (ssd_state *)(void *)k->fam; }
static const ssd_state *csst(const flexdiag_kvp *k) {
    return (const ssd_state *)(const void *)k->fam;
}

static int32_t ssd_rows(const flexdiag_kvp_params *p) { return p->n_att; }

static int64_t ssd_resident(const flexdiag_kvp_params *p, int32_t t) {
    return (int64_t)t + 1 < p->n_att ? (int64_t)t + 1 : p->n_att;
}

/* Slot t while the ring fills; then the window's t mod N_att when every head is spatial, else
 * each semantic head's own victim (-1). */
static int32_t ssd_write(const flexdiag_kvp_params *p, int32_t t) {
    if (t < p->n_att) return t;
    int all_window = p->heads && p->heads->n_heads[FLEXDIAG_HEAD_SEMANTIC] == 0;
    return all_window ? t % p->n_att : -1;
}

static void ssd_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    flexdiag__sem_layout(k, c, &sst(k)->sem);
}

static void ssd_reset_seq(flexdiag_kvp *k, int32_t seq) {
    flexdiag__sem_reset_seq(k, &sst(k)->sem, seq);
}

/* The window of one spatial head: positions max(0, t - N_att + 1) .. t ascending. */
static int32_t window_list(int32_t n_att, int32_t t, int32_t *slots) {
    int32_t n = t + 1 < n_att ? t + 1 : n_att;
    for (int32_t j = 0; j < n; j++) slots[j] = (t - n + 1 + j) % n_att;
    return n;
}

static void ssd_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                     int32_t *slots, int32_t *ns) {
    const flexdiag_kvp_heads *hd = flexdiag__kvp_plan_of(k);
    int32_t n_att = k->p.n_att;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        int32_t *sl = slots + (size_t)h * (size_t)k->max_slots;
        if (flexdiag__kvp_head_type(hd, layer, h) == FLEXDIAG_HEAD_SEMANTIC) {
            ns[h] = flexdiag__sem_plan(k, &sst(k)->sem, layer, t, seq, h, &ws[h], sl);
            continue;
        }
        ws[h] = t % n_att;
        ns[h] = window_list(n_att, t, sl);
        if (t >= n_att) k->evictions[flexdiag__kvp_li(k, seq, layer)]++;
    }
}

static int ssd_needs(const flexdiag_kvp *k, int32_t t) {
    (void)t;
    return flexdiag__kvp_plan_of(k)->n_heads[FLEXDIAG_HEAD_SEMANTIC] > 0 &&
           k->p.n_att < k->p.l_dec;
}

static void ssd_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                       const flexdiag__kvp_scores *sc) {
    const flexdiag_kvp_heads *hd = flexdiag__kvp_plan_of(k);
    for (int32_t h = 0; h < k->p.h_kv; h++)
        if (flexdiag__kvp_head_type(hd, layer, h) == FLEXDIAG_HEAD_SEMANTIC)
            flexdiag__sem_update(k, &sst(k)->sem, layer, t, seq, h, sc);
}

static int32_t ssd_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                       int32_t slot) {
    if (flexdiag__kvp_head_type(flexdiag__kvp_plan_of(k), layer, h) == FLEXDIAG_HEAD_SEMANTIC)
        return flexdiag__sem_pos(k, &csst(k)->sem, layer, seq, h, slot);
    return flexdiag__kvp_ring_pos(t, k->p.n_att, slot);
}

const flexdiag_kvp_class flexdiag__kvp_ssd = {
    .name = "ssd",
    .traits = {"position / accumulated p", "KV head", "sum", "permanent", "N_att",
               "semantic heads: acc update + argmin over N_att-1", 1, FLEXDIAG_KVP_DEV_NONE, 0,
               0, 1},
    .ring_rows = ssd_rows,
    .max_slots = ssd_rows,
    .resident_rows = ssd_resident,
    .write_slot = ssd_write,
    .state_size = sizeof(ssd_state),
    .check = flexdiag__kvp_plan_check,
    .calibrated = 1,
    .layout = ssd_layout,
    .reset_seq = ssd_reset_seq,
    .plan = ssd_plan,
    .needs_scores = ssd_needs,
    .update = ssd_update,
    .slot_pos = ssd_pos,
};
