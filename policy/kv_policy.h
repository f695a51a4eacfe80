/*
 * kv_policy.h - KV-cache policies as plain-C state machines (docs/policies.md), host only.
 *
 * One flexdiag_kvp instance holds the state of every (sequence, layer, KV head) of a batch. The
 * engine drives it per (layer, step) for a contiguous range of sequences (a micro-batch):
 *   plan()   -> ring slot that receives the new token's K/V (the overwrite is the eviction)
 *               and the attended ring slots, in the order the kernel must report logits;
 *   kernel   -> attention over prompt rows + those slots, emitting fp32 logits of the
 *               attended slots and the row log-sum-exp (kernels.h flexdiag_attn_args);
 *   update() -> the policy's post-attention rule (Diagonal argmin during build-up, H2O/TOVA/
 *               ALISA probability bookkeeping).
 * The CPU engine and the CUDA path consume the same slot lists; CUDA kernels that fuse a policy
 * reproduce these rules exactly and are tested against this file.
 * Conditional and unconditional CFG rows are just different sequences.
 * Each policy is one class (policy/kvp_internal.h flexdiag_kvp_class) in its own file; this
 * header's functions run the protocol around the classes and answer from their traits, so
 * callers never switch on the kind for what a policy is (flexdiag__kvp_traits).
 *
 * Ring layout (decode rows per (sequence, KV head); slot = ring row 0..R-1). The engine writes
 * token t's K/V at write_slot BEFORE attention, so the overwrite of a live row is the eviction.
 *   policy          R            slot of decode token p
 *   dense           l_dec        p
 *   window          n_att        p mod n_att
 *   streaming       n_att        p for p = 0..3 (sinks); 4 + (p-4) mod (n_att-4) for p >= 4
 *   h2o             n_att        free slot f of the KV head (slot order != age order)
 *   tova            n_att        free slot f of the layer (all KV heads share one slot map)
 *   alisa           l_dec        p
 *   diagonal        n_r          p mod n_r
 *   diagonal-sink4  4 + n_r      p for p = 0..3 (sinks); 4 + (p-4) mod n_r for p >= 4
 *   line-ar         n_att        p while the ring fills, then the lowest slot a line end freed
 *   ssd             n_att        spatial heads as window, semantic heads a free slot (policy_ssd.c)
 *   hack            4 + max lag  the head plan's one ring (calibrated lag lists; policy_hack.c)
 * With params slack > 0 (a context's SJD window passes) the window, streaming and Diagonal rings
 * grow by slack rows and every "mod" above is taken over the grown ring (n_att + slack, n_att -
 * 4 + slack, n_r + slack); what a step attends does not change.
 * Slot lists: dense/window/streaming/alisa/h2o/tova ascending slot or position order; diagonal:
 * attended-lag list reversed (entry j at column cnt-1-j, oldest first while nothing is skipped,
 * docs/policies.md §2.3), sink4: the 4 sinks first, then the list the same way.
 *
 * Numerics of update(): probabilities p = expf(logit - lse) in fp32 (full-row normalisation,
 * computed here or taken from the attention kernel's probability epilogue,
 * docs/policies.md §0.3); GQA group/head sums in fp32 in ascending head order (H2O: the group sum
 * is added to acc; TOVA: the sum over all h_q heads divided by h_q; ALISA: the sum over all h_q
 * heads). Diagonal uses the fp32 logits only (group max), never probabilities.
 *
 * Threading: plan()/update() calls on disjoint (layer, sequence) ranges may run concurrently;
 * every piece of state, eviction counters included, is per (sequence, layer).
 */
#ifndef FLEXDIAG_KV_POLICY_H
#define FLEXDIAG_KV_POLICY_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_POLICY
#error "policy/kv_policy.h: a lower layer may not use policy/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "flexdiag.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flexdiag_kvp_params {
    flexdiag_policy_kind kind; /* which policy */
    int32_t n_att;             /* attended decode tokens per step (resolved, >= 1) */
    int32_t n_r;               /* Diagonal ring size (resolved; ignored by others) */
    int32_t l_dec;             /* decode tokens per sequence (Janus 576) */
    int32_t n_seq;             /* sequences (CFG rows counted) */
    int32_t n_layers;          /* layers */
    int32_t h_q, h_kv;         /* query and KV heads */
    int32_t w_s;               /* decode tokens per image line (the grid's row stride, a row
                                  end included; 0 = no grid: text); the grid policies need it */
    int32_t slack;             /* extra ring rows for window passes of up to slack + 1 rows
                                  (draft_len - 1; 0 = sequential): the ring policies (window,
                                  streaming, the Diagonals) keep their attended tokens while a
                                  pass writes the rows ahead (flexdiag__kvp_plan_ahead) */
    const struct flexdiag_kvp_heads *heads; /* ssd, hack: the per-(layer, KV head) plan made
                                  from a calibration table for this budget (kvp_calib.h),
                                  shared and read-only; NULL for the other policies */
} flexdiag_kvp_params;

typedef struct flexdiag_kvp flexdiag_kvp;

/* The policy-parameter validation of docs/policies.md §0.6 that needs no decode length: kind,
 * a budget (n_att > 0, or n_att == 0 and sparsity in [0, 1]; NaN = none given), n_r range, the
 * sink minimums and N_att <= N_r of the values given. FLEXDIAG_ERR_INVALID_ARG with a message
 * naming the command-line flag and the fix. Tools call it before they know L_dec. */
flexdiag_status flexdiag__kvp_check(const flexdiag_policy_params *pub);
/* THE validation and resolution of public params for a decode length l_dec, used by context
 * creation and every tool: flexdiag__kvp_check, then n_att <= l_dec, n_att from sparsity
 * (lround((1-s)·l_dec), clamped to [1, l_dec]) when pub->n_att == 0, n_r default
 * max(lround(0.5·l_dec), n_att), and the §0.6 rules again on the resolved values. Fills kind,
 * n_att, n_r, l_dec only. */
flexdiag_status flexdiag__kvp_resolve(const flexdiag_policy_params *pub, int32_t l_dec,
                                      flexdiag_kvp_params *out);
/* Decode ring rows R per (sequence, KV head) this policy needs (sinks included). */
int32_t flexdiag__kvp_ring_rows(const flexdiag_kvp_params *p);
/* Largest number of attended ring slots in any step (stride of slot lists). */
int32_t flexdiag__kvp_max_slots(const flexdiag_kvp_params *p);
/* Allocate and reset state for p (copied). */
flexdiag_status flexdiag__kvp_create(const flexdiag_kvp_params *p, flexdiag_kvp **out);
void flexdiag__kvp_destroy(flexdiag_kvp *kvp);
/* Back to step 0 for a new generation. */
void flexdiag__kvp_reset(flexdiag_kvp *kvp);
/* Back to step 0 for sequence seq alone (a slot that takes a new sequence): its state in every
 * layer, its eviction counts kept (they count the run's evictions). The other sequences are
 * untouched, so sequences may sit at different steps. */
void flexdiag__kvp_reset_seq(flexdiag_kvp *kvp, int32_t seq);
/* Step t of layer `layer` for sequences [s0, s0+n): write_slot (n, h_kv) ring slot of token
 * t; slots (n, h_kv, max_slots) attended ring slots; n_slots (n, h_kv). Must be called for
 * t = 0, 1, ... in order for each (layer, sequence). */
void flexdiag__kvp_plan(flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t s0, int32_t n,
                        int32_t *write_slot, int32_t *slots, int32_t *n_slots);
/* Position-only policies (dense, window, streaming) attend the same ring slots for every
 * (layer, KV head) of a sequence at its step, and the same for all sequences at one step. For
 * them this plans step t for the sequences [s0, s0 + n) and every layer at once: *write_slot,
 * slots (max_slots) and *n_slots get their one common plan, evictions are counted for those
 * sequences, and per-(layer, sequence) plan() must not be used in the same run. Returns 1;
 * returns 0 (and does nothing) for every other policy. */
int flexdiag__kvp_plan_shared(flexdiag_kvp *kvp, int32_t t, int32_t s0, int32_t n,
                              int32_t *write_slot, int32_t *slots, int32_t *n_slots);
/* Window passes (speculative Jacobi decoding): whether a sequence whose next step is t may run
 * steps t .. t+n-1 in one pass exactly: its policy plans ahead and no update is needed after
 * any of those steps (Diagonal: past its build-up; position-only policies: always). */
int flexdiag__kvp_window_ok(const flexdiag_kvp *kvp, int32_t t, int32_t n);
/* Whether policies of kind can plan ahead at all (window_ok can hold for n > 1). */
int flexdiag__kvp_plans_ahead(flexdiag_policy_kind kind);
/* The plan step t + i of (layer, seq) will make, next step t, changing nothing: write_slot
 * (h_kv), slots (h_kv, max_slots), n_slots (h_kv), as flexdiag__kvp_plan gives them at t + i
 * when window_ok(t, i + 1). The ring holds what steps t .. t+i attend while the pass writes
 * them when i <= params slack. */
void flexdiag__kvp_plan_ahead(const flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t i,
                              int32_t seq, int32_t *write_slot, int32_t *slots, int32_t *n_slots);
/* Position-only policies (dense, window, streaming): the list of step t (any t >= 0, past the
 * decode length too: the ring arithmetic of a window pass's padding rows) into slots and its
 * write slot into *write_slot, nothing counted; returns its length, or -1 for the other
 * policies. */
int32_t flexdiag__kvp_list_at(const flexdiag_kvp *kvp, int32_t t, int32_t *write_slot,
                              int32_t *slots);
/* Count the evictions of steps t .. t+n-1 of sequence seq in every layer, as plan_shared does
 * (position-only policies: a step evicts when the ring no longer grows). */
void flexdiag__kvp_count_steps(flexdiag_kvp *kvp, int32_t seq, int32_t t, int32_t n);
/* After attention of the same (layer, t, s0, n): logits (n, h_q, max_slots) fp32 scaled logits
 * of the planned slots in plan order; lse (n, h_q) log-sum-exp of the full attended row;
 * probs (n, h_q, max_slots) the kernels' probability epilogue expf(logit - lse) (kernels.h
 * probs_out). Diagonal reads logits; H2O/TOVA/ALISA read probs when given (logits and lse may
 * then be NULL), else compute expf(logit - lse) themselves. Required only when
 * flexdiag__kvp_needs_scores(kvp, t) is true (plan() asserts it was called); otherwise it may be
 * skipped or called with NULL pointers and does nothing. */
void flexdiag__kvp_update(flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t s0, int32_t n,
                          const float *logits, const float *lse, const float *probs);
/* Whether update() needs logits/lse at step t (false lets the engine skip the readback). */
int flexdiag__kvp_needs_scores(const flexdiag_kvp *kvp, int32_t t);
/* Whether kind types its heads from a calibration table (ssd, hack: params heads, made by
 * flexdiag__kvp_heads_make, kvp_calib.h). */
int flexdiag__kvp_needs_calib(flexdiag_policy_kind kind);
/* Decode rows evicted so far (overwrites of a live row), summed over all heads. */
uint64_t flexdiag__kvp_evictions(const flexdiag_kvp *kvp);
/* Decode position held in ring slot `slot` of (layer, seq, KV head), -1 if empty. */
int32_t flexdiag__kvp_slot_pos(const flexdiag_kvp *kvp, int32_t layer, int32_t seq, int32_t h,
                               int32_t slot);
/* Policy name as on the command line ("diagonal-sink4"), and the reverse (-1 if unknown). */
const char *flexdiag__kvp_name(flexdiag_policy_kind kind);
int flexdiag__kvp_parse(const char *name, flexdiag_policy_kind *out);
/* Comma-separated list of every valid policy name, for error messages. */
const char *flexdiag__kvp_names(void);
/* Resident decode rows per (sequence, KV head) at step t, after token t was written (sinks
 * included): dense/alisa t+1, window/streaming/h2o/tova min(t+1, n_att), diagonal
 * min(t+1, n_r), diagonal-sink4 t+1 for t <= 3 else 4 + min(t-3, n_r). */
int64_t flexdiag__kvp_resident_rows(const flexdiag_kvp_params *p, int32_t t);
/* Every policy fills its ring in slot order before it reuses a slot, so the resident rows at
 * step t are the ring slots [0, resident_rows(t)) (what a KV home must bring to the device).
 * The slot token t is written to when it is the same for every (sequence, layer, KV head):
 * dense/alisa t, window t mod n_att, streaming and the Diagonals by their ring rule; h2o/tova
 * t while slots are free, else -1 (each head's evicted slot). */
int32_t flexdiag__kvp_write_slot(const flexdiag_kvp_params *p, int32_t t);
/* Reported sparsity 1 - n_att / l_dec (0 for dense), docs/policies.md §0.2. */
double flexdiag__kvp_reported_sparsity(const flexdiag_kvp_params *p);

/* Where a policy's state can live on a device: the backend op family that runs it there
 * (runtime/engine/policy_driver.c picks its mode from this), or none. */
typedef enum flexdiag_kvp_device {
    FLEXDIAG_KVP_DEV_POSITION, /* no state: one list per sequence from its step (plan_shared) */
    FLEXDIAG_KVP_DEV_LAGS,     /* Diagonal lag lists: diag_slots + the update fused into
                                  attention */
    FLEXDIAG_KVP_DEV_SLOT_MAP, /* H2O / TOVA slot maps: evict_plan / evict_update */
    FLEXDIAG_KVP_DEV_RECORDS,  /* ALISA records: alisa_plan / alisa_update */
    FLEXDIAG_KVP_DEV_NONE,     /* the host state machine only */
} flexdiag_kvp_device;

/* What a policy is: the docs/policies.md §6 reporting columns (static strings) and the facts
 * the engine and the tools act on, so nothing outside policy/ switches on the kind. */
typedef struct flexdiag_kvp_traits {
    const char *score_source;  /* "position", "accumulated p", "current p", "windowed p",
                                  "logits", "-" */
    const char *granularity;   /* "global", "layer", "KV head", "-" */
    const char *gqa_reduction; /* "max", "sum", "mean", "n/a" */
    const char *eviction;      /* "permanent", "selection only", "none" */
    const char *resident_kv;   /* "N_att", "N_r", "4+N_r", "full" */
    const char *extra_work;    /* per-step selection work */
    int needs_probabilities;   /* 1 when update() reads p = exp(logit - lse) */
    flexdiag_kvp_device device; /* where its state can live on a device */
    int32_t sinks;             /* decode tokens kept as sinks (the budget must exceed them) */
    int has_ring;              /* 1 when it takes a ring N_r (policy params n_r) */
    int per_kv_head;           /* 1 when its state (and slot map) is per KV head */
} flexdiag_kvp_traits;
/* Traits of kind (an all-"-" entry, device NONE, for an unknown kind); never NULL. */
const flexdiag_kvp_traits *flexdiag__kvp_traits(flexdiag_policy_kind kind);

/* ---- The per-list rules, shared by the host state machines (the classes) and the CPU
 * backend's policy ops (kernels/cpu/ref_policy.c), so each rule is written once on the host;
 * the CUDA kernels restate them and are tested against these. ---- */

/* Scores of one list's query heads for an update: probs (h_q, ms) when given, else
 * expf(logit - lse) from logits (h_q, ms) and lse (h_q) (the kernels' epilogue formula). */
typedef struct flexdiag__kvp_scores {
    const float *logits; /* (h_q, ms) or NULL */
    const float *lse;    /* (h_q) or NULL */
    const float *probs;  /* (h_q, ms) or NULL */
    int32_t ms;          /* row stride */
} flexdiag__kvp_scores;

/* Diagonal (policy_diagonal.c): advance one list (lag (a), *cnt) to step t and write its slots
 * (base sinks first, then list entry j at column base + cnt-1-j, ring slot base + (t - base -
 * lag) mod m, m the rows behind the sinks: N_r + slack); returns the slot count. For t < base
 * (sink4's first steps) the sinks 0..t, the list untouched. */
int32_t flexdiag__diag_list_plan(int16_t *lag, int16_t *cnt, int32_t a, int32_t base, int32_t m,
                                 int32_t t, int32_t *slots);
/* Diagonal's build-up pick: the list entry e < n (entry e at ring column ns - 1 - e) with the
 * lexicographically smallest (score, -lag), score = max over g query-head rows of z (row
 * stride z_stride) at that column. */
int32_t flexdiag__diag_list_pick(const int16_t *lag, int32_t n, int32_t ns, const float *z,
                                 int64_t z_stride, int32_t g);

/* H2O / TOVA (policy_score.c): write token t into one slot map pos (n_att) (slot t while
 * free, else *free_slot), clearing its acc (H2O; NULL for TOVA); a list at t == 0 starts
 * empty. Returns the slot; *evicted 1 when it held a live token. */
int32_t flexdiag__evict_list_plan(int32_t *pos, float *acc, const int32_t *free_slot,
                                  int32_t n_att, int32_t t, int *evicted);
/* H2O after step t: acc += the group sum of the probabilities of query heads q0..q0+g-1 of
 * sc; once all slots are full, *free_slot = argmin (acc, pos) over the slots outside the
 * recent N_att - floor(N_att/2) lags. */
void flexdiag__h2o_list_update(int32_t *free_slot, float *acc, const int32_t *pos,
                               const flexdiag__kvp_scores *sc, int32_t q0, int32_t g,
                               int32_t n_att, int32_t t);
/* The same rule with the recent window as a parameter: the candidates are the slots with pos
 * <= t - recent + 1 (H2O: recent = N_att - floor(N_att/2); the semantic lists of SSD and HACK:
 * 2, every token but the newest). */
void flexdiag__hh_list_update(int32_t *free_slot, float *acc, const int32_t *pos,
                              const flexdiag__kvp_scores *sc, int32_t q0, int32_t g,
                              int32_t n_att, int32_t recent, int32_t t);
/* TOVA after step t: once all slots are full, *free_slot = argmin (mean over the h_q heads
 * of sc, pos) over all slots. */
void flexdiag__tova_list_update(int32_t *free_slot, const int32_t *pos,
                                const flexdiag__kvp_scores *sc, int32_t h_q, int32_t n_att,
                                int32_t t);

/* ALISA (policy_alisa.c). One list's records: rec_pos / rec_p (w, n_att), rec_n (w), w = k_l =
 * n_att - n_att / 2. */
/* Unsigned key that orders like the float (NaN by bits): the selection's score order. */
uint32_t flexdiag__alisa_key(float f);
/* Plan step t: the attended positions into slots (top k_g older tokens by (S desc, position
 * desc), ascending, then the recent lags' positions ascending), record r_t = those positions
 * with zero probabilities; returns their count min(t+1, n_att). score and keys: t + 1
 * entries of scratch. */
int32_t flexdiag__alisa_plan_list(int32_t *rec_pos, float *rec_p, int32_t *rec_n, int32_t n_att,
                                  int32_t t, float *score, uint64_t *keys, int32_t *slots);
/* ALISA after step t: record r_t's probabilities, each the sum over the h_q heads of sc. */
void flexdiag__alisa_list_update(float *rec_p, const int32_t *rec_n, const flexdiag__kvp_scores *sc,
                                 int32_t h_q, int32_t n_att, int32_t t);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_KV_POLICY_H */
