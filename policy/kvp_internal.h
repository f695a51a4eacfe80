/*
 * kvp_internal.h - the state layout shared by the KV-policy files (kv_policy.c dispatch and
 * validation, policy_position.c dense/window/streaming, policy_diagonal.c diagonal and
 * diagonal-sink4, policy_score.c h2o/tova, policy_alisa.c alisa).
 *
 * All state lives in one allocation carved at create into flat arrays indexed
 * [seq][layer][head][...] (per-layer policies drop the head index). Nothing is allocated in
 * plan/update. Each family exposes three hooks per sequence: plan (writes the write slot and the
 * slot list of every KV head and counts evictions), update (post-attention rule) and slot_pos
 * (which decode position a ring slot holds now).
 */
#ifndef FLEXDIAG_KVP_INTERNAL_H
#define FLEXDIAG_KVP_INTERNAL_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_POLICY)
#error "policy/kvp_internal.h is private to policy/ (docs/architecture.md)"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/kv_policy.h"

struct flexdiag_kvp {
    flexdiag_kvp_params p; /* resolved params (copied) */
    int32_t g;             /* group size h_q / h_kv */
    int32_t ring;          /* decode ring rows R per (seq, KV head) */
    int32_t max_slots;     /* stride of slot lists and logits */
    int32_t a;             /* diagonal list length A (sink4: A - 4); 0 for others */
    int32_t k_l, k_g, w;   /* alisa: recent lags, global tokens, score window (= k_l) */
    int32_t *next_t;       /* (n_seq, n_layers) next step plan() expects */
    int32_t *scored_t;     /* (n_seq, n_layers) last step whose update ran, -1 = none */
    uint64_t *evictions;   /* (n_seq, n_layers) overwrites of live rows, summed over heads */
    int16_t *lag;          /* diagonal (n_seq, n_layers, h_kv, a) attended-lag list */
    int16_t *cnt;          /* diagonal (n_seq, n_layers, h_kv) valid list entries */
    int32_t *pos;          /* h2o (n_seq, n_layers, h_kv, n_att) / tova (n_seq, n_layers, n_att)
                              decode position held by each slot, -1 = empty */
    float *acc;            /* h2o (n_seq, n_layers, h_kv, n_att) accumulated probability */
    int32_t *free_slot;    /* h2o (n_seq, n_layers, h_kv) / tova (n_seq, n_layers) victim slot
                              that receives the next token once all slots are occupied */
    float *score;          /* alisa (n_seq, n_layers, l_dec) S_t, recomputed each step */
    uint64_t *keys;        /* alisa (n_seq, n_layers, l_dec) top-k sort scratch */
    int32_t *rec_pos;      /* alisa (n_seq, n_layers, w, n_att) attended positions of step tau */
    float *rec_p;          /* alisa (n_seq, n_layers, w, n_att) head-summed probabilities */
    int32_t *rec_n;        /* alisa (n_seq, n_layers, w) valid entries of each record */
    void *mem;             /* the one allocation everything above is carved from */
};

/* Flat index of (seq, layer) and (seq, layer, KV head). */
static inline size_t flexdiag__kvp_li(const flexdiag_kvp *k, int32_t seq, int32_t layer) {
    return (size_t)seq * (size_t)k->p.n_layers + (size_t)layer;
}
static inline size_t flexdiag__kvp_hi(const flexdiag_kvp *k, int32_t seq, int32_t layer,
                                      int32_t h) {
    return flexdiag__kvp_li(k, seq, layer) * (size_t)k->p.h_kv + (size_t)h;
}

/* Position held by slot `slot` of a ring of r rows where token p >= 0 goes to slot p mod r,
 * after token t was written (t < 0: nothing written): -1 if empty. */
static inline int32_t flexdiag__kvp_ring_pos(int32_t t, int32_t r, int32_t slot) {
    if (t < slot) return -1;
    return t - (t - slot) % r;
}

/* One sequence's scores for update(): the kernel's probabilities (probs), or logits and lse. */
typedef struct flexdiag__kvp_scores {
    const float *logits; /* (h_q, ms) or NULL */
    const float *lse;    /* (h_q) or NULL */
    const float *probs;  /* (h_q, ms) or NULL */
    int32_t ms;          /* row stride */
} flexdiag__kvp_scores;

/* Full-row probability of ring column j for query head hq: probs when given, else
 * expf(logit - lse) (the same formula the kernels' epilogue uses). */
static inline float flexdiag__kvp_prob(const flexdiag__kvp_scores *sc, int32_t hq, int32_t j) {
    size_t o = (size_t)hq * (size_t)sc->ms + (size_t)j;
    return sc->probs ? sc->probs[o] : expf(sc->logits[o] - sc->lse[hq]);
}

/* ---- per-family hooks: plan one sequence (ws (h_kv), slots (h_kv, max_slots), ns (h_kv)),
 * update one sequence (Diagonal: logits (h_q, max_slots); the others: its scores), slot
 * position after step t ---- */

void flexdiag__kvp_plan_position(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                 int32_t *ws, int32_t *slots, int32_t *ns);
int32_t flexdiag__kvp_pos_position(const flexdiag_kvp *k, int32_t t, int32_t slot);

void flexdiag__kvp_plan_diagonal(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                 int32_t *ws, int32_t *slots, int32_t *ns);
void flexdiag__kvp_update_diagonal(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                   const float *logits);
int flexdiag__kvp_needs_diagonal(const flexdiag_kvp *k, int32_t t);
int32_t flexdiag__kvp_pos_diagonal(const flexdiag_kvp *k, int32_t t, int32_t slot);

void flexdiag__kvp_plan_h2o(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                            int32_t *slots, int32_t *ns);
void flexdiag__kvp_update_h2o(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                              const flexdiag__kvp_scores *sc);
void flexdiag__kvp_plan_tova(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                             int32_t *ws, int32_t *slots, int32_t *ns);
void flexdiag__kvp_update_tova(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                               const flexdiag__kvp_scores *sc);

void flexdiag__kvp_plan_alisa(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                              int32_t *ws, int32_t *slots, int32_t *ns);
void flexdiag__kvp_update_alisa(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                const flexdiag__kvp_scores *sc);

#endif /* FLEXDIAG_KVP_INTERNAL_H */
