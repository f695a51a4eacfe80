/*
 * policy_driver.h - the KV policy as the engine sees it: one object that plans each decode
 * step, hands every (layer, micro-batch) the cache rows to write and the slot lists to attend,
 * and applies the policy's update after attention.
 *
 * Where the policy's state lives is the driver's business, chosen once per context
 * (policy_driver.c, one mode each):
 *   shared  dense / window / streaming: one plan for every list, from the position alone;
 *   host    the host state machines of policy/ (kv_policy.h), one CPU task per layer, with the
 *           attention scores read back when the rule needs them (tests, large GQA groups);
 *   diag    Diagonal lag lists on the device: diag_slots plans, the build-up argmin is fused
 *           into attn_decode (kernels.h diag_lag);
 *   evict   H2O / TOVA slot maps on the device: evict_plan, evict_update on attn_decode's
 *           probabilities;
 *   alisa   ALISA records on the device: alisa_plan, alisa_update.
 * Device modes need one host sync per step at most (the engine's, for the sampled ids).
 *
 * Sequences sit at their own decode steps: a pass plans every list at its sequence's step
 * (flexdiag_pd_run t, negative for a free slot, whose lists stay as they are), the device
 * modes read the steps from b.steps (kernels.h flexdiag_list_steps), and a slot that takes a
 * new sequence is reset alone (flexdiag__pd_admit), so a sequence's plans depend only on its
 * own history, whoever its neighbours are and whenever it was admitted.
 *
 * Lifetime: flexdiag__pd_setup (geometry, no allocation) -> the context sizes and carves the
 * driver's device buffers with flexdiag__pd_layout inside its own block -> flexdiag__pd_start
 * (host state) -> reset, then per admitted sequence admit, per pass plan, attn (per layer and
 * micro-batch), update -> flexdiag__pd_fini. docs/policies.md holds each policy's exact
 * semantics.
 */
#ifndef FLEXDIAG_POLICY_DRIVER_H
#define FLEXDIAG_POLICY_DRIVER_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/engine/policy_driver.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "policy/kv_policy.h"

typedef struct pd_mode pd_mode; /* policy_driver.c */

/* Device buffers of the driver, carved from the context block (shapes use capacities:
 * L layers, S sequences, h_kv / h_q heads, ms = max_slots). */
typedef struct flexdiag_pd_bufs {
    float *pscore;    /* (L, S, h_q, ms) scores read by the policy: logits (host Diagonal) or
                         probabilities (H2O / TOVA / ALISA) */
    int32_t *rows;    /* cache rows kv_append writes: (S, h_kv) when shared, else (L, S, h_kv) */
    int32_t *slots;   /* attended ring slots: (S, ms) one list per sequence when shared, else
                         (L, S, h_kv, ms) */
    int32_t *nslots;  /* valid entries of slots: (S) when shared, else (L, S, h_kv) */
    int32_t *steps;   /* (S) the decode step of each sequence at this pass, -1: a free slot */
    int16_t *lag;     /* diag: (L, S, h_kv, a) attended-lag lists */
    int16_t *cnt;     /* diag: (L, S, h_kv) list fill */
    int32_t *dnext;   /* diag: (S) the lag each sequence's fused build-up update writes, -1:
                         none at this pass */
    int32_t *epos;    /* evict: (lists, n_att) decode position of each slot */
    float *eacc;      /* evict, H2O only: (lists, n_att) accumulated scores */
    int32_t *efree;   /* evict: (lists) the victim of the last update */
    int32_t *arpos;   /* alisa: (L, S, w, n_att) attended positions of the last w steps */
    float *arp;       /* alisa: (L, S, w, n_att) their head-summed probabilities */
    int32_t *arn;     /* alisa: (L, S, w) record counts */
    float *ascore;    /* alisa: (L, S, l_dec) selection scratch */
    uint64_t *akeys;  /* alisa: (L, S, l_dec) selection scratch */
} flexdiag_pd_bufs;

typedef struct flexdiag_policy_driver {
    const pd_mode *mode;         /* where the state lives (see above) */
    const flexdiag_kernels *k;   /* backend */
    flexdiag_kvp_params kp;      /* resolved policy; n_seq = capacity in sequences */
    int32_t p_cap;               /* prompt rows per (sequence, KV head): ring row r is cache
                                    row p_cap + r */
    int32_t ring, max_slots;     /* decode ring rows; stride of slot lists */
    int32_t l_dec;               /* decode tokens per sequence */
    int shared_rows;             /* one write row per (sequence, KV head) for every layer */
    int shared_slots;            /* one attended slot list per sequence for every layer and KV
                                    head (kernels.h FLEXDIAG_SLOTS_PER_SEQ), else one per
                                    (layer, sequence, KV head) */
    int pass_scores;             /* the planned pass needs attention scores */
    int scored;                  /* the policy reads attention scores at some steps */
    int score_probs;             /* ... as probabilities (H2O/TOVA/ALISA), else logits */
    flexdiag_pd_bufs b;          /* device buffers (carved by the context) */
    void *host;                  /* host mirrors, one block (page-locked when possible) */
    size_t host_bytes;           /* its size */
    int32_t *h_rows, *h_slots, *h_nslots; /* host plan of a step (layouts of b.rows/...) */
    float *h_pscore;             /* host copy of a step's scores (host mode) */
    int32_t *h_dnext;            /* staging of b.dnext */
    int32_t *h_steps;            /* staging of b.steps */
    flexdiag_kvp *kvp;           /* host state machines (host and shared modes; the others
                                    use it for the step schedule of score reads) */
    flexdiag_pool *pool;         /* host mode: one CPU task per layer for plan and update */
    uint64_t dev_evictions;      /* evictions counted by the device modes */
} flexdiag_policy_driver;

/* A pass as the driver sees it. */
typedef struct flexdiag_pd_run {
    int32_t n_seq;     /* sequences the pass runs: [0, n_seq), <= capacity */
    int32_t mb_seq;    /* sequences per micro-batch */
    int32_t n_mb;      /* micro-batches */
    const int32_t *t;  /* (n_seq) host: the decode step of each sequence, < 0: a free slot */
    int32_t *plan_out; /* optional (tests): per step the attended slots of every (layer,
                          sequence, KV head), count first (engine.h flexdiag_block) */
    int32_t plan_t;    /* the step plan_out records this pass at (lock-step runs) */
} flexdiag_pd_run;

/* Resolve pub for a model of n_layers layers, h_q / h_kv heads, n_seq sequences, p_cap prompt
 * rows, l_dec decode tokens, image lines of w_s tokens (0: text) and window passes of up to
 * slack + 1 rows (kv_policy.h params slack), with the head plan of a calibrated policy (ssd,
 * hack: kv_policy.h params heads, borrowed; NULL for the others), and pick the mode on backend
 * k (force_host: always the host state machines). No allocation; pd is overwritten. */
flexdiag_status flexdiag__pd_setup(flexdiag_policy_driver *pd, const flexdiag_policy_params *pub,
                                   const flexdiag_kernels *k, int32_t n_layers, int32_t h_q,
                                   int32_t h_kv, int32_t n_seq, int32_t p_cap, int32_t l_dec,
                                   int32_t w_s, int32_t slack,
                                   const struct flexdiag_kvp_heads *heads, int force_host);
/* Device bytes of the driver's buffers; with base non-NULL also carve pd->b from base (256-byte
 * aligned, base itself aligned). */
size_t flexdiag__pd_layout(flexdiag_policy_driver *pd, char *base);
/* Host state: mirrors, state machines, the CPU pool (threads workers, 0 = all cores). */
flexdiag_status flexdiag__pd_start(flexdiag_policy_driver *pd, int threads);
/* Free what pd_start made (the device buffers belong to the context). */
void flexdiag__pd_fini(flexdiag_policy_driver *pd);
/* Back to step 0 for a new run: every sequence, the eviction counts. */
void flexdiag__pd_reset(flexdiag_policy_driver *pd);
/* Sequences [s0, s0 + n) take new sequences: their host state back to step 0 (the device
 * modes reset a list at its step 0). */
void flexdiag__pd_admit(flexdiag_policy_driver *pd, int32_t s0, int32_t n);

/* Plan a pass on stream s: write rows and slot lists of every list of run's live sequences, each
 * at its own step, and whether the pass needs scores (flexdiag__pd_scores). */
flexdiag_status flexdiag__pd_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                  flexdiag_stream *s);
/* Whether the attention of the planned pass must produce the policy's scores. */
int flexdiag__pd_scores(const flexdiag_policy_driver *pd);
/* The policy's part of layer j's attention for sequences [s0, s0 + nb) at a pass with or
 * without scores: slot lists and score outputs into a (shape fields untouched); returns the
 * cache rows kv_append writes for those sequences. */
const int32_t *flexdiag__pd_attn(const flexdiag_policy_driver *pd, int32_t j, int32_t s0,
                                 int scores, flexdiag_attn_args *a);
/* After the planned pass's attention (queued on s): the policy's update. */
flexdiag_status flexdiag__pd_update(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                    flexdiag_stream *s);
/* KV rows evicted since the last reset. */
uint64_t flexdiag__pd_evictions(const flexdiag_policy_driver *pd);
/* Whether the policy state lives on the device (no host state machine runs). */
int flexdiag__pd_on_device(const flexdiag_policy_driver *pd);

#endif /* FLEXDIAG_POLICY_DRIVER_H */
