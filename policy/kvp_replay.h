/*
 * kvp_replay.h - drive one KV-policy state machine over precomputed attention logits, exactly as
 * the engine drives it (plan -> logits of the attended slots + row lse -> update), for one
 * sequence and one layer with h_q = h_kv = heads. Used by `flexdiag policy-trace`, the
 * synthetic fidelity bench and tests; host only, no I/O.
 *
 * The logit tensor is float32 [heads, T, Lp + T]: row (h, t) holds query t's pre-softmax logits
 * over the Lp prompt keys, then decode keys 0..T-1 (entries of keys > t are never read).
 */
#ifndef FLEXDIAG_KVP_REPLAY_H
#define FLEXDIAG_KVP_REPLAY_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_POLICY
#error "policy/kvp_replay.h: a lower layer may not use policy/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "policy/kv_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flexdiag_kvp_replay {
    flexdiag_kvp *kvp;     /* the state machine (owned) */
    flexdiag_kvp_params p; /* its params: n_seq = n_layers = 1, h_q = h_kv = heads */
    int32_t lp;            /* prompt keys per row */
    int32_t ms;            /* max_slots */
    int32_t ring;          /* ring rows */
    int32_t *ws;           /* (heads) write slot of the last step */
    int32_t *slots;        /* (heads, ms) attended slots of the last step, plan order */
    int32_t *ns;           /* (heads) attended count of the last step */
    int32_t *att;          /* (heads, ms) attended decode positions, plan order */
    float *logits;         /* (heads, ms) scratch handed to update() */
    float *lse;            /* (heads) scratch handed to update() */
} flexdiag_kvp_replay;

/* Create for kind/n_att/n_r/l_dec of p (already resolved), `heads` heads and lp prompt keys;
 * the other fields of p are ignored. *out is owned by the caller. */
flexdiag_status flexdiag__kvp_replay_create(const flexdiag_kvp_params *p, int32_t heads,
                                            int32_t lp, flexdiag_kvp_replay **out);
/* Destroy; NULL is a no-op. */
void flexdiag__kvp_replay_destroy(flexdiag_kvp_replay *r);
/* Run step t (t = 0, 1, ... in order) on logits [heads, l_dec, lp + l_dec] (borrowed). The lse of
 * each row is taken over the prompt keys plus the attended decode keys (fp64, stored fp32).
 * Afterwards att/ns hold the attended positions of every head. */
void flexdiag__kvp_replay_step(flexdiag_kvp_replay *r, int32_t t, const float *logits);
/* Resident decode positions of head h after the last step into out (ring rows at least),
 * ascending; returns the count. */
int32_t flexdiag__kvp_replay_resident(const flexdiag_kvp_replay *r, int32_t h, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_KVP_REPLAY_H */
