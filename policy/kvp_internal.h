/*
 * kvp_internal.h - the policy interface inside policy/: the class a policy file defines
 * (flexdiag_kvp_class: its geometry, its state and its per-step rules), the state every policy
 * shares (struct flexdiag_kvp: resolved params, call-protocol counters, eviction counts) and the
 * helpers the policy files use.
 *
 * A policy is one file: a static state header of its own (k->fam, state_size bytes), the arrays
 * it carves from the one allocation (layout), and the hooks below. kv_policy.c holds the table
 * kind -> class and runs the protocol; it never looks inside a policy's state. Nothing is
 * allocated in plan/update.
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

/* Bump allocator over the one allocation: a sizing pass (base NULL) then a carving pass. */
typedef struct flexdiag__kvp_carve {
    unsigned char *base; /* NULL in the sizing pass */
    size_t off;          /* bytes used so far */
    int ok;              /* 0 after an overflow */
} flexdiag__kvp_carve;

/* Reserve n elements of elem bytes, 64-byte aligned; NULL when n == 0 or sizing. */
void *flexdiag__kvp_take(flexdiag__kvp_carve *c, uint64_t n, size_t elem);

typedef struct flexdiag_kvp_class {
    const char *name;           /* command-line name */
    flexdiag_kvp_traits traits; /* reporting columns and the engine's hints (kv_policy.h) */
    /* geometry of resolved params (kv_policy.h flexdiag__kvp_ring_rows etc.) */
    int32_t (*ring_rows)(const flexdiag_kvp_params *p);
    int32_t (*max_slots)(const flexdiag_kvp_params *p);
    int64_t (*resident_rows)(const flexdiag_kvp_params *p, int32_t t);
    int32_t (*write_slot)(const flexdiag_kvp_params *p, int32_t t);
    /* state: the family header in k->fam (state_size bytes, zeroed at create), the arrays it
     * carves (NULL: none) and the reset of one sequence in every layer (NULL: no state) */
    size_t state_size;
    flexdiag_status (*check)(const flexdiag_kvp_params *p); /* what create refuses (NULL: none
                                                                 beyond kv_policy.c's) */
    void (*layout)(flexdiag_kvp *k, flexdiag__kvp_carve *c);
    void (*reset_seq)(flexdiag_kvp *k, int32_t seq);
    /* once after carving, before the first reset: what lasts the instance's life, never reset
     * (the calibration collector's sums; NULL: nothing) */
    void (*init)(flexdiag_kvp *k);
    int calibrated; /* 1: types its heads from a calibration table (params heads; ssd, hack) */
    /* per step, for one (layer, sequence): plan writes the write slot ws (h_kv), the slot lists
     * slots (h_kv, max_slots) and their counts ns (h_kv) and counts evictions; needs_scores
     * says whether update() must run after step t (NULL: never; t is already checked against
     * the last step); update applies the post-attention rule (NULL: none); slot_pos is the
     * decode position ring slot `slot` of KV head h holds after step t (-1: empty) */
    void (*plan)(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                 int32_t *slots, int32_t *ns);
    int (*needs_scores)(const flexdiag_kvp *k, int32_t t);
    void (*update)(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                   const flexdiag__kvp_scores *sc);
    int32_t (*slot_pos)(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                        int32_t slot);
    /* position-only policies: the one list of step t for every (layer, sequence, KV head),
     * its length returned, *ws its write slot, *evict 1 when the write overwrites a live row
     * (NULL for every other policy: flexdiag__kvp_plan_shared returns 0) */
    int32_t (*shared_list)(const flexdiag_kvp *k, int32_t t, int32_t *s, int32_t *ws, int *evict);
    /* the plan of a later step t of one (layer, sequence) from its state now, no state changed
     * (kv_policy.h flexdiag__kvp_plan_ahead); NULL: the policy cannot plan ahead (its lists
     * depend on scores of the steps between) */
    void (*plan_ahead)(const flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                       int32_t *slots, int32_t *ns);
} flexdiag_kvp_class;

struct flexdiag_kvp {
    flexdiag_kvp_params p;         /* resolved params (copied) */
    const flexdiag_kvp_class *cls; /* the policy */
    int32_t g;                     /* group size h_q / h_kv */
    int32_t ring;                  /* decode ring rows R per (seq, KV head) */
    int32_t max_slots;             /* stride of slot lists and logits */
    int32_t *next_t;               /* (n_seq, n_layers) next step plan() expects */
    int32_t *scored_t;             /* (n_seq, n_layers) last step whose update ran, -1 = none */
    uint64_t *evictions;           /* (n_seq, n_layers) overwrites of live rows, summed over
                                      heads */
    void *mem;                     /* the one allocation the arrays are carved from */
    _Alignas(16) unsigned char fam[]; /* the policy's own state header (cls->state_size) */
};

/* The classes (one per policy file section; kv_policy.c maps kinds to them). */
extern const flexdiag_kvp_class flexdiag__kvp_dense, flexdiag__kvp_window,
    flexdiag__kvp_streaming, flexdiag__kvp_h2o, flexdiag__kvp_tova, flexdiag__kvp_alisa,
    flexdiag__kvp_diagonal, flexdiag__kvp_diagonal_sink4, flexdiag__kvp_line_ar,
    flexdiag__kvp_ssd, flexdiag__kvp_hack,
    flexdiag__kvp_calibrate; /* the internal kind FLEXDIAG__POLICY_CALIBRATE (kvp_calib.h) */

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

/* Full-row probability of ring column j for query head hq: probs when given, else
 * expf(logit - lse) (the same formula the kernels' epilogue uses). */
static inline float flexdiag__kvp_prob(const flexdiag__kvp_scores *sc, int32_t hq, int32_t j) {
    size_t o = (size_t)hq * (size_t)sc->ms + (size_t)j;
    return sc->probs ? sc->probs[o] : expf(sc->logits[o] - sc->lse[hq]);
}

/* Copy head 0's list (n entries) to every other KV head of one sequence's plan and set every
 * head's write slot and count: the policies whose heads share one list. */
void flexdiag__kvp_fill_heads(const flexdiag_kvp *k, int32_t ws, int32_t n, int32_t *w,
                              int32_t *slots, int32_t *ns);

/* Diagonal's attended-lag list of (seq, layer, KV head) and its fill (tests read it). */
const int16_t *flexdiag__kvp_diag_lag(const flexdiag_kvp *k, int32_t seq, int32_t layer,
                                      int32_t h, int32_t *cnt);

#endif /* FLEXDIAG_KVP_INTERNAL_H */
