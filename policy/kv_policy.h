/*
 * kv_policy.h - KV-cache policies as plain-C state machines (policies.md), host only.
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
 */
#ifndef FLEXDIAG_KV_POLICY_H
#define FLEXDIAG_KV_POLICY_H

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
} flexdiag_kvp_params;

typedef struct flexdiag_kvp flexdiag_kvp;

/* Resolve public params for a model with decode length l_dec: n_att from sparsity
 * (lround((1-s)·l_dec), clamped to [1, l_dec]) when pub->n_att == 0, n_r default
 * max(lround(0.5·l_dec), n_att); validate (policies.md §0.6). Fills kind, n_att, n_r, l_dec
 * only. */
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
/* Step t of layer `layer` for sequences [s0, s0+n): write_slot (n, h_kv) ring slot of token
 * t; slots (n, h_kv, max_slots) attended ring slots; n_slots (n, h_kv). Must be called for
 * t = 0, 1, ... in order for each (layer, sequence). */
void flexdiag__kvp_plan(flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t s0, int32_t n,
                        int32_t *write_slot, int32_t *slots, int32_t *n_slots);
/* After attention of the same (layer, t, s0, n): logits (n, h_q, max_slots) fp32 scaled logits
 * of the planned slots in plan order; lse (n, h_q) log-sum-exp of the full attended row. */
void flexdiag__kvp_update(flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t s0, int32_t n,
                          const float *logits, const float *lse);
/* Whether update() needs logits/lse at step t (false lets the engine skip the readback). */
int flexdiag__kvp_needs_scores(const flexdiag_kvp *kvp, int32_t t);
/* Decode rows evicted so far (overwrites of a live row), summed over all heads. */
uint64_t flexdiag__kvp_evictions(const flexdiag_kvp *kvp);
/* Decode position held in ring slot `slot` of (layer, seq, KV head), -1 if empty. */
int32_t flexdiag__kvp_slot_pos(const flexdiag_kvp *kvp, int32_t layer, int32_t seq, int32_t h,
                               int32_t slot);
/* Policy name as on the command line ("diagonal-sink4"), and the reverse (-1 if unknown). */
const char *flexdiag__kvp_name(flexdiag_policy_kind kind);
int flexdiag__kvp_parse(const char *name, flexdiag_policy_kind *out);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_KV_POLICY_H */
