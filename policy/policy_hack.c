/*
 * policy_hack.c - HACK adapted to raster order (`hack`, docs/policies.md §10): structural and
 * contextual heads. The plan (kvp_heads.c) splits the KV heads by their calibrated column
 * variance (contextual: below the natural break of log V, share alpha) and gives each type its
 * budget (B_S structural, B_C contextual, kappa = B_C / B_S = 1/4, the mean over the heads at
 * most N_att):
 *   structural  decode tokens 0..3 as sinks in slots 0..3, then a static lag list (lags
 *               0 .. W_s + 1 and the calibrated best of the rest, B_S - 4 lags): at step t it
 *               attends the sinks and {t - l : l in the list, t - l >= 4}, oldest first. Tokens
 *               p >= 4 live in a ring of lag_ring = 1 + the largest lag of any list, slot
 *               4 + (p - 4) mod lag_ring; no scores;
 *   contextual  the semantic list of SSD (kvp_mixed.c: H2O with K = 2) at B_C.
 * R = the larger of 4 + lag_ring and B_C; max_slots the larger of B_S and B_C. The plan is in
 * flexdiag_kvp_params.heads; the state is the contextual lists.
 */
#include "base/core.h"
#include "policy/kvp_mixed.h"

#define SINKS FLEXDIAG_HACK_SINKS

typedef struct hack_state {
    flexdiag__sem_lists sem; /* the contextual lists */
} hack_state;

static hack_state *hst(flexdiag_kvp *k) { return (hack_state *)(void *)k->fam; }
static const hack_state *chst(const flexdiag_kvp *k) {
    return (const hack_state *)(const void *)k->fam;
}

static int32_t hack_rows(const flexdiag_kvp_params *p) {
    return p->heads ? p->heads->ring : p->n_att;
}

static int32_t hack_slots(const flexdiag_kvp_params *p) {
    return p->heads ? p->heads->max_slots : p->n_att;
}

static int64_t hack_resident(const flexdiag_kvp_params *p, int32_t t) {
    int32_t r = hack_rows(p);
    return (int64_t)t + 1 < r ? (int64_t)t + 1 : r;
}

/* The ring slot of token t in a structural list. */
static int32_t lags_slot(const flexdiag_kvp_heads *hd, int32_t t) {
    return t < SINKS ? t : SINKS + (t - SINKS) % hd->lag_ring;
}

/* The structural slot when it is every list's: while the contextual lists still fill slot t. */
static int32_t hack_write(const flexdiag_kvp_params *p, int32_t t) {
    const flexdiag_kvp_heads *hd = p->heads;
    if (!hd) return -1;
    int32_t s = hd->lag_ring ? lags_slot(hd, t) : t;
    if (hd->n_heads[FLEXDIAG_HEAD_SEMANTIC] && (t >= hd->b_c || s != t)) return -1;
    return s;
}

static void hack_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    flexdiag__sem_layout(k, c, &hst(k)->sem);
}

static void hack_reset_seq(flexdiag_kvp *k, int32_t seq) {
    flexdiag__sem_reset_seq(k, &hst(k)->sem, seq);
}

/* A structural list at step t: the sinks 0..min(t, 3), then t - l for the lags l of the list
 * with t - l >= 4, largest lag first (ascending positions); returns the count. */
static int32_t lags_list(const flexdiag_kvp_heads *hd, const int16_t *lags, int32_t t,
                         int32_t *slots) {
    int32_t n = t + 1 < SINKS ? t + 1 : SINKS;
    for (int32_t j = 0; j < n; j++) slots[j] = j;
    for (int32_t j = hd->n_lags - 1; j >= 0; j--) {
        int32_t p = t - lags[j];
        if (p >= SINKS) slots[n++] = lags_slot(hd, p);
    }
    return n;
}

static void hack_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                      int32_t *slots, int32_t *ns) {
    const flexdiag_kvp_heads *hd = flexdiag__kvp_plan_of(k);
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        int32_t *sl = slots + (size_t)h * (size_t)k->max_slots;
        if (flexdiag__kvp_head_type(hd, layer, h) == FLEXDIAG_HEAD_SEMANTIC) {
            ns[h] = flexdiag__sem_plan(k, &hst(k)->sem, layer, t, seq, h, &ws[h], sl);
            continue;
        }
        ws[h] = lags_slot(hd, t);
        ns[h] = lags_list(hd, flexdiag__kvp_head_lags(hd, layer, h), t, sl);
        if (t >= SINKS + hd->lag_ring) k->evictions[flexdiag__kvp_li(k, seq, layer)]++;
    }
}

static int hack_needs(const flexdiag_kvp *k, int32_t t) {
    (void)t;
    const flexdiag_kvp_heads *hd = flexdiag__kvp_plan_of(k);
    return hd->n_heads[FLEXDIAG_HEAD_SEMANTIC] > 0 && hd->b_c < k->p.l_dec;
}

static void hack_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                        const flexdiag__kvp_scores *sc) {
    const flexdiag_kvp_heads *hd = flexdiag__kvp_plan_of(k);
    for (int32_t h = 0; h < k->p.h_kv; h++)
        if (flexdiag__kvp_head_type(hd, layer, h) == FLEXDIAG_HEAD_SEMANTIC)
            flexdiag__sem_update(k, &hst(k)->sem, layer, t, seq, h, sc);
}

static int32_t hack_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                        int32_t slot) {
    const flexdiag_kvp_heads *hd = flexdiag__kvp_plan_of(k);
    if (flexdiag__kvp_head_type(hd, layer, h) == FLEXDIAG_HEAD_SEMANTIC)
        return flexdiag__sem_pos(k, &chst(k)->sem, layer, seq, h, slot);
    if (slot < SINKS) return t >= slot ? slot : -1;
    if (slot >= SINKS + hd->lag_ring) return -1;
    int32_t r = flexdiag__kvp_ring_pos(t - SINKS, hd->lag_ring, slot - SINKS);
    return r < 0 ? -1 : SINKS + r;
}

const flexdiag_kvp_class flexdiag__kvp_hack = {
    .name = "hack",
    .traits = {"lags / accumulated p", "KV head", "sum", "permanent", "4+lag ring / B_C",
               "contextual heads: acc update + argmin over B_C-1", 1, FLEXDIAG_KVP_DEV_NONE,
               SINKS, 0, 1},
    .ring_rows = hack_rows,
    .max_slots = hack_slots,
    .resident_rows = hack_resident,
    .write_slot = hack_write,
    .state_size = sizeof(hack_state),
    .check = flexdiag__kvp_plan_check,
    .calibrated = 1,
    .layout = hack_layout,
    .reset_seq = hack_reset_seq,
    .plan = hack_plan,
    .needs_scores = hack_needs,
    .update = hack_update,
    .slot_pos = hack_pos,
};
