/*
 * policy_driver.c - the KV policy driver (policy_driver.h): one mode per place the policy's
 * state can live, chosen at setup, behind the same plan / attn / update calls.
 *
 * A "list" is what one attention call attends for one (layer, sequence, KV head). Every mode
 * writes the same three arrays the attention ops read (kernels.h flexdiag_attn_args): the
 * cache row each list's new K/V goes to (rows), the ring slots it attends (slots) and their
 * count (nslots). Position-only policies keep one list per sequence for every layer and KV
 * head (its step alone decides it); the others keep one per (layer, sequence, KV head), H2O /
 * TOVA on the device one list per sequence with per-list write rows. Each sequence is planned
 * at its own step (policy_driver.h).
 *
 * The device modes (diag, evict, alisa) need the backend's optional policy ops and, for
 * Diagonal, a GQA group the fused attention update supports (kernels.h diag_max_group);
 * otherwise the host mode runs the state machines of policy/ and reads the scores back.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/engine/policy_driver.h"

#define PD_ALIGN 256 /* bytes; every carved buffer starts on a 256-byte boundary */

static size_t al(size_t x) { return (x + PD_ALIGN - 1) / PD_ALIGN * PD_ALIGN; }

struct pd_mode {
    const char *name;
    int device;      /* the state lives on the device */
    int fuse_diag;   /* attention applies Diagonal's build-up update (diag_lag) */
    flexdiag_status (*plan)(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                            flexdiag_stream *s);
    flexdiag_status (*update)(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                              flexdiag_stream *s);
};

/* ---- geometry helpers ---- */

static const flexdiag_kvp_traits *traits(const flexdiag_policy_driver *pd) {
    return flexdiag__kvp_traits(pd->kp.kind);
}

/* H2O keeps a slot map per KV head, TOVA one per layer (kv_policy.h per_kv_head). */
static int is_h2o(const flexdiag_policy_driver *pd) { return traits(pd)->per_kv_head; }

/* Lag-list length a (min(N_att, N_r) less the sinks) and the sink rows ahead of the ring
 * (docs/policies.md §2.2, §2.8). */
static int32_t diag_base(const flexdiag_policy_driver *pd) { return traits(pd)->sinks; }

static int32_t diag_len(const flexdiag_policy_driver *pd) {
    return pd->max_slots - diag_base(pd);
}

/* Eviction lists of the device H2O / TOVA state: one per (layer, sequence, KV head) for H2O,
 * one per (layer, sequence) for TOVA. */
static size_t evict_lists(const flexdiag_policy_driver *pd) {
    return (size_t)pd->kp.n_layers * (size_t)pd->kp.n_seq * (is_h2o(pd) ? (size_t)pd->kp.h_kv : 1);
}

/* Index of the first (layer j, sequence s0, KV head) entry in per-list arrays. */
static size_t head_index(const flexdiag_policy_driver *pd, int32_t j, int32_t s0) {
    return ((size_t)j * (size_t)pd->kp.n_seq + (size_t)s0) * (size_t)pd->kp.h_kv;
}

static size_t list_index(const flexdiag_policy_driver *pd, int32_t j, int32_t s0) {
    return pd->shared_slots ? (size_t)s0 : head_index(pd, j, s0);
}

/* Rows of the whole per-list arrays (capacity strides). */
static size_t all_lists(const flexdiag_policy_driver *pd) {
    return (size_t)pd->kp.n_layers * (size_t)pd->kp.n_seq * (size_t)pd->kp.h_kv;
}

/* The steps of the device modes' lists: (layers, sequences, per_seq) (kernels.h). */
static flexdiag_list_steps list_steps(const flexdiag_policy_driver *pd, int32_t per_seq) {
    return (flexdiag_list_steps){pd->b.steps, pd->kp.n_seq, per_seq};
}

/* Step of sequence s at this pass (-1: free, or beyond the pass). */
static int32_t seq_step(const flexdiag_pd_run *run, int32_t s) {
    return s < run->n_seq ? run->t[s] : -1;
}

/* ---- plan recording (tests) ---- */

/* Copy the pass's host plan into run->plan_out at step run->plan_t (layout in engine.h
 * flexdiag_block). */
static void record_plan(const flexdiag_policy_driver *pd, const flexdiag_pd_run *run) {
    size_t hkv = (size_t)pd->kp.h_kv, ms = (size_t)pd->max_slots, rec = 1 + ms;
    size_t n_lists = (size_t)run->n_seq * hkv, t = (size_t)run->plan_t;
    for (int32_t j = 0; j < pd->kp.n_layers; j++)
        for (size_t i = 0; i < n_lists; i++) {
            size_t li = pd->shared_slots ? i / hkv : head_index(pd, j, 0) + i;
            int32_t *dst = run->plan_out +
                           ((t * (size_t)pd->kp.n_layers + (size_t)j) * n_lists + i) * rec;
            int32_t n = pd->h_nslots[li];
            dst[0] = n;
            memcpy(dst + 1, pd->h_slots + li * ms, (size_t)n * 4);
            for (size_t q = 1 + (size_t)n; q < rec; q++) dst[q] = -1; /* unused tail */
        }
}

/* Device modes: read the planned lists back, then record them. */
static flexdiag_status record_device_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                          flexdiag_stream *s) {
    size_t lists = all_lists(pd), ms = (size_t)pd->max_slots;
    FLEXDIAG_TRY(pd->k->copy_d2h(pd->h_slots, pd->b.slots, lists * ms * 4, s));
    FLEXDIAG_TRY(pd->k->copy_d2h(pd->h_nslots, pd->b.nslots, lists * 4, s));
    record_plan(pd, run);
    return FLEXDIAG_OK;
}

/* The steps of every sequence of the context to b.steps (-1 beyond the pass). */
static flexdiag_status upload_steps(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                    flexdiag_stream *s) {
    for (int32_t i = 0; i < pd->kp.n_seq; i++) pd->h_steps[i] = seq_step(run, i);
    return pd->k->copy_h2d(pd->b.steps, pd->h_steps, (size_t)pd->kp.n_seq * 4, s);
}

/* Every live sequence's lists write cache row p_cap + the policy's write slot of its step (shared
 * rows layout: Diagonal and ALISA write one slot for every KV head); the rows of free slots stay
 * as they are. */
static flexdiag_status upload_shared_rows(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                          flexdiag_stream *s) {
    size_t hkv = (size_t)pd->kp.h_kv;
    for (int32_t q = 0; q < run->n_seq; q++) {
        if (run->t[q] < 0) continue;
        int32_t row = pd->p_cap + flexdiag__kvp_write_slot(&pd->kp, run->t[q]);
        for (size_t h = 0; h < hkv; h++) pd->h_rows[(size_t)q * hkv + h] = row;
    }
    return pd->k->copy_h2d(pd->b.rows, pd->h_rows, (size_t)run->n_seq * hkv * 4, s);
}

/* Whether any live sequence of the pass needs scores at its step. */
static int any_scores(const flexdiag_policy_driver *pd, const flexdiag_pd_run *run) {
    for (int32_t q = 0; q < run->n_seq; q++)
        if (run->t[q] >= 0 && flexdiag__kvp_needs_scores(pd->kvp, run->t[q])) return 1;
    return 0;
}

/* Evictions of the device modes: every list of a live sequence whose step overwrites a row
 * (its step reaches the ring: from_t), lists_per_seq lists each. */
static void count_evictions(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                            int32_t from_t) {
    for (int32_t q = 0; q < run->n_seq; q++)
        if (run->t[q] >= from_t)
            pd->dev_evictions += (uint64_t)pd->kp.n_layers * (uint64_t)pd->kp.h_kv;
}

static flexdiag_status no_update(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                 flexdiag_stream *s) {
    (void)pd, (void)run, (void)s;
    return FLEXDIAG_OK;
}

/* The per-sequence slot lists of the pass (shared slots) to the device. */
static flexdiag_status upload_seq_lists(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                        flexdiag_stream *s) {
    size_t n = (size_t)run->n_seq;
    FLEXDIAG_TRY(pd->k->copy_h2d(pd->b.slots, pd->h_slots, n * (size_t)pd->max_slots * 4, s));
    return pd->k->copy_h2d(pd->b.nslots, pd->h_nslots, n * 4, s);
}

/* ---- shared: dense, window, streaming ---- */

/* One plan per run of sequences at the same step, copied to each sequence's list. */
static flexdiag_status shared_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                   flexdiag_stream *s) {
    size_t ms = (size_t)pd->max_slots, hkv = (size_t)pd->kp.h_kv;
    for (int32_t q0 = 0, q1; q0 < run->n_seq; q0 = q1) {
        int32_t t = run->t[q0];
        for (q1 = q0 + 1; q1 < run->n_seq && run->t[q1] == t; q1++) {}
        if (t < 0) continue;
        int32_t ws = 0, *sl = pd->h_slots + (size_t)q0 * ms;
        flexdiag__kvp_plan_shared(pd->kvp, t, q0, q1 - q0, &ws, sl, pd->h_nslots + q0);
        for (int32_t q = q0; q < q1; q++) {
            if (q > q0) memcpy(pd->h_slots + (size_t)q * ms, sl, (size_t)pd->h_nslots[q0] * 4);
            pd->h_nslots[q] = pd->h_nslots[q0];
            for (size_t h = 0; h < hkv; h++) pd->h_rows[(size_t)q * hkv + h] = pd->p_cap + ws;
        }
    }
    if (run->plan_out) record_plan(pd, run);
    FLEXDIAG_TRY(pd->k->copy_h2d(pd->b.rows, pd->h_rows, (size_t)run->n_seq * hkv * 4, s));
    return upload_seq_lists(pd, run, s);
}

static const pd_mode mode_shared = {"shared", 0, 0, shared_plan, no_update};

/* ---- host: the state machines of policy/, one CPU task per layer ---- */

typedef struct host_job {
    flexdiag_policy_driver *pd;
    const flexdiag_pd_run *run;
} host_job;

/* Plan layer j of every live sequence at its step into the host plan arrays, one call per run
 * of sequences at the same step (the state machines allow concurrent calls on disjoint layers,
 * kv_policy.h); slots become cache rows. */
static void host_plan_layer(void *ctx, int64_t j, void *scratch) {
    const host_job *jb = ctx;
    flexdiag_policy_driver *pd = jb->pd;
    const flexdiag_pd_run *run = jb->run;
    size_t hkv = (size_t)pd->kp.h_kv, ms = (size_t)pd->max_slots;
    (void)scratch;
    for (int32_t q0 = 0, q1; q0 < run->n_seq; q0 = q1) {
        int32_t t = run->t[q0];
        for (q1 = q0 + 1; q1 < run->n_seq && run->t[q1] == t; q1++) {}
        if (t < 0) continue;
        size_t li = list_index(pd, (int32_t)j, q0);
        flexdiag__kvp_plan(pd->kvp, (int32_t)j, t, q0, q1 - q0, pd->h_rows + li,
                           pd->h_slots + li * ms, pd->h_nslots + li);
        for (size_t i = li; i < li + (size_t)(q1 - q0) * hkv; i++) pd->h_rows[i] += pd->p_cap;
    }
}

/* Update layer j of every live sequence after its step from the read-back scores
 * (probabilities or logits); the state machine skips steps that need none. */
static void host_update_layer(void *ctx, int64_t j, void *scratch) {
    const host_job *jb = ctx;
    flexdiag_policy_driver *pd = jb->pd;
    const flexdiag_pd_run *run = jb->run;
    size_t hq = (size_t)pd->kp.h_q, ms = (size_t)pd->max_slots;
    (void)scratch;
    for (int32_t q = 0; q < run->n_seq; q++) {
        if (run->t[q] < 0) continue;
        size_t q0 = ((size_t)j * (size_t)pd->kp.n_seq + (size_t)q) * hq;
        const float *sc = pd->h_pscore + q0 * ms;
        flexdiag__kvp_update(pd->kvp, (int32_t)j, run->t[q], q, 1, pd->score_probs ? NULL : sc,
                             NULL, pd->score_probs ? sc : NULL);
    }
}

static flexdiag_status host_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                 flexdiag_stream *s) {
    host_job jb = {pd, run};
    FLEXDIAG_TRY(flexdiag__pool_parallel_for(pd->pool, pd->kp.n_layers, 0, host_plan_layer, &jb));
    size_t lists = all_lists(pd), ms = (size_t)pd->max_slots;
    if (run->plan_out) record_plan(pd, run);
    FLEXDIAG_TRY(pd->k->copy_h2d(pd->b.rows, pd->h_rows, lists * 4, s));
    FLEXDIAG_TRY(pd->k->copy_h2d(pd->b.slots, pd->h_slots, lists * ms * 4, s));
    return pd->k->copy_h2d(pd->b.nslots, pd->h_nslots, lists * 4, s);
}

static flexdiag_status host_update(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                   flexdiag_stream *s) {
    size_t rows = (size_t)pd->kp.n_layers * (size_t)pd->kp.n_seq * (size_t)pd->kp.h_q;
    FLEXDIAG_TRY(pd->k->copy_d2h(pd->h_pscore, pd->b.pscore, rows * (size_t)pd->max_slots * 4, s));
    host_job jb = {pd, run};
    return flexdiag__pool_parallel_for(pd->pool, pd->kp.n_layers, 0, host_update_layer, &jb);
}

static const pd_mode mode_host = {"host", 0, 0, host_plan, host_update};

/* ---- diag: Diagonal lag lists on the device ---- */

/* Shared write rows, lag lists planned by diag_slots for every list at its sequence's step;
 * the sequences at a build-up step get their new lag in b.dnext for the update fused into
 * attention, the others -1. */
static flexdiag_status diag_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                 flexdiag_stream *s) {
    int32_t base = diag_base(pd);
    count_evictions(pd, run, pd->ring); /* every list overwrites its oldest row */
    FLEXDIAG_TRY(upload_steps(pd, run, s));
    FLEXDIAG_TRY(upload_shared_rows(pd, run, s));
    FLEXDIAG_TRY(pd->k->diag_slots(pd->b.slots, pd->b.nslots, pd->b.lag, pd->b.cnt,
                                   (int64_t)all_lists(pd), pd->max_slots, diag_len(pd),
                                   list_steps(pd, pd->kp.h_kv), pd->ring - base, base, s));
    for (int32_t q = 0; q < pd->kp.n_seq; q++) {
        int32_t t = seq_step(run, q);
        pd->h_dnext[q] = t >= 0 && flexdiag__kvp_needs_scores(pd->kvp, t) ? t - base + 1 : -1;
    }
    if (pd->pass_scores)
        FLEXDIAG_TRY(pd->k->copy_h2d(pd->b.dnext, pd->h_dnext, (size_t)pd->kp.n_seq * 4, s));
    return run->plan_out ? record_device_plan(pd, run, s) : FLEXDIAG_OK;
}

static const pd_mode mode_diag = {"diag", 1, 1, diag_plan, no_update};

/* ---- evict: H2O / TOVA slot maps on the device ---- */

/* Each sequence attends its occupied slots 0..n-1 (one list per sequence); the write slot of
 * each list (the last update's victim once all are occupied) is planned on the device. */
static flexdiag_status evict_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                  flexdiag_stream *s) {
    int32_t na = pd->kp.n_att, h2o = is_h2o(pd);
    size_t ms = (size_t)pd->max_slots;
    for (int32_t q = 0; q < run->n_seq; q++) {
        int32_t t = run->t[q], n = t + 1 < na ? t + 1 : na;
        if (t < 0) continue;
        for (int32_t j = 0; j < n; j++) pd->h_slots[(size_t)q * ms + (size_t)j] = j;
        pd->h_nslots[q] = n;
    }
    count_evictions(pd, run, na); /* every (layer, KV head) overwrites a victim's row */
    FLEXDIAG_TRY(upload_steps(pd, run, s));
    FLEXDIAG_TRY(upload_seq_lists(pd, run, s));
    FLEXDIAG_TRY(pd->k->evict_plan(pd->b.rows, pd->b.epos, h2o ? pd->b.eacc : NULL, pd->b.efree,
                                   (int64_t)evict_lists(pd), h2o ? 1 : pd->kp.h_kv, na,
                                   list_steps(pd, h2o ? pd->kp.h_kv : 1), pd->p_cap, s));
    if (run->plan_out) record_plan(pd, run);
    return FLEXDIAG_OK;
}

static flexdiag_status evict_update(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                    flexdiag_stream *s) {
    int h2o = is_h2o(pd);
    (void)run;
    return pd->k->evict_update(pd->b.efree, h2o ? pd->b.eacc : NULL, pd->b.epos, pd->b.pscore,
                               (int64_t)evict_lists(pd),
                               h2o ? pd->kp.h_q / pd->kp.h_kv : pd->kp.h_q, pd->max_slots,
                               pd->kp.n_att, list_steps(pd, h2o ? pd->kp.h_kv : 1), s);
}

static const pd_mode mode_evict = {"evict", 1, 0, evict_plan, evict_update};

/* ---- alisa: ALISA records on the device ---- */

/* Every list writes row t (shared rows); alisa_plan selects each (layer, sequence)'s attended
 * positions into the slot lists of its KV heads. */
static flexdiag_status alisa_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                  flexdiag_stream *s) {
    size_t lists = (size_t)pd->kp.n_layers * (size_t)pd->kp.n_seq;
    FLEXDIAG_TRY(upload_steps(pd, run, s));
    FLEXDIAG_TRY(upload_shared_rows(pd, run, s));
    FLEXDIAG_TRY(pd->k->alisa_plan(pd->b.slots, pd->b.nslots, pd->b.arpos, pd->b.arp, pd->b.arn,
                                   pd->b.ascore, pd->b.akeys, (int64_t)lists, pd->kp.h_kv,
                                   pd->max_slots, pd->kp.n_att, pd->l_dec, list_steps(pd, 1), s));
    return run->plan_out ? record_device_plan(pd, run, s) : FLEXDIAG_OK;
}

static flexdiag_status alisa_update(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                    flexdiag_stream *s) {
    (void)run;
    return pd->k->alisa_update(pd->b.arp, pd->b.arn, pd->b.pscore,
                               (int64_t)pd->kp.n_layers * pd->kp.n_seq, pd->kp.h_q,
                               pd->max_slots, pd->kp.n_att, list_steps(pd, 1), s);
}

static const pd_mode mode_alisa = {"alisa", 1, 0, alisa_plan, alisa_update};

/* ---- setup and memory ---- */

/* The mode for the policy on backend k. */
static const pd_mode *pick_mode(const flexdiag_policy_driver *pd, int force_host) {
    const flexdiag_kernels *k = pd->k;
    switch (traits(pd)->device) {
    case FLEXDIAG_KVP_DEV_POSITION: return &mode_shared;
    case FLEXDIAG_KVP_DEV_LAGS:
        if (!force_host && k->diag_slots && pd->kp.h_q / pd->kp.h_kv <= k->diag_max_group)
            return &mode_diag;
        return &mode_host;
    case FLEXDIAG_KVP_DEV_SLOT_MAP:
        return !force_host && k->evict_plan && k->evict_update ? &mode_evict : &mode_host;
    case FLEXDIAG_KVP_DEV_RECORDS:
        return !force_host && k->alisa_plan && k->alisa_update ? &mode_alisa : &mode_host;
    default: return &mode_host;
    }
}

flexdiag_status flexdiag__pd_setup(flexdiag_policy_driver *pd, const flexdiag_policy_params *pub,
                                   const flexdiag_kernels *k, int32_t n_layers, int32_t h_q,
                                   int32_t h_kv, int32_t n_seq, int32_t p_cap, int32_t l_dec,
                                   int32_t w_s, int32_t slack,
                                   const struct flexdiag_kvp_heads *heads, int force_host) {
    memset(pd, 0, sizeof *pd);
    FLEXDIAG_TRY(flexdiag__kvp_resolve(pub, l_dec, &pd->kp));
    pd->kp.n_seq = n_seq;
    pd->kp.n_layers = n_layers;
    pd->kp.h_q = h_q;
    pd->kp.h_kv = h_kv;
    pd->kp.w_s = w_s;
    pd->kp.slack = slack;
    pd->kp.heads = heads;
    pd->k = k;
    pd->p_cap = p_cap;
    pd->l_dec = l_dec;
    pd->ring = flexdiag__kvp_ring_rows(&pd->kp);
    pd->max_slots = flexdiag__kvp_max_slots(&pd->kp);
    pd->mode = pick_mode(pd, force_host);
    pd->scored = pd->mode != &mode_shared;
    pd->score_probs = traits(pd)->needs_probabilities;
    pd->shared_rows = pd->mode == &mode_shared || pd->mode == &mode_diag ||
                      pd->mode == &mode_alisa;
    pd->shared_slots = pd->mode == &mode_shared || pd->mode == &mode_evict;
    return FLEXDIAG_OK;
}

size_t flexdiag__pd_layout(flexdiag_policy_driver *pd, char *base) {
    size_t L = (size_t)pd->kp.n_layers, S = (size_t)pd->kp.n_seq, hkv = (size_t)pd->kp.h_kv;
    size_t hq = (size_t)pd->kp.h_q, ms = (size_t)pd->max_slots, na = (size_t)pd->kp.n_att;
    size_t lists = pd->shared_slots ? S : L * S * hkv, off = 0;
    int diag = pd->mode == &mode_diag, evict = pd->mode == &mode_evict;
    int alisa = pd->mode == &mode_alisa;
#define TAKE(field, bytes)                                                                         \
    do {                                                                                           \
        if (base) pd->b.field = (void *)(base + off);                                              \
        off += al(bytes);                                                                          \
    } while (0)
    TAKE(pscore, (pd->scored && !diag ? L * S : 0) * hq * ms * 4);
    TAKE(rows, (pd->shared_rows ? S * hkv : L * S * hkv) * 4);
    TAKE(slots, lists * ms * 4);
    TAKE(nslots, lists * 4);
    TAKE(steps, S * 4);
    size_t dl = diag ? L * S * hkv : 0;
    TAKE(lag, dl * (size_t)diag_len(pd) * 2);
    TAKE(cnt, dl * 2);
    TAKE(dnext, diag ? S * 4 : 0);
    size_t el = evict ? evict_lists(pd) : 0;
    TAKE(epos, el * na * 4);
    TAKE(eacc, (is_h2o(pd) ? el * na : 0) * 4);
    TAKE(efree, el * 4);
    size_t al_ = alisa ? L * S : 0, aw = (size_t)(pd->kp.n_att - pd->kp.n_att / 2);
    TAKE(arpos, al_ * aw * na * 4);
    TAKE(arp, al_ * aw * na * 4);
    TAKE(arn, al_ * aw * 4);
    TAKE(ascore, al_ * (size_t)pd->l_dec * 4);
    TAKE(akeys, al_ * (size_t)pd->l_dec * 8);
#undef TAKE
    return off;
}

/* Host mirrors of the plan and scores: one block, page-locked when the backend offers it so the
 * per-step copies are asynchronous. Zeroed, with every write row a ring row: the rows of a
 * free slot are uploaded as they are. */
static flexdiag_status host_mirrors(flexdiag_policy_driver *pd) {
    const flexdiag_kernels *k = pd->k;
    size_t L = (size_t)pd->kp.n_layers, S = (size_t)pd->kp.n_seq, hkv = (size_t)pd->kp.h_kv;
    size_t lists = pd->shared_slots ? S : L * S * hkv, ms = (size_t)pd->max_slots;
    size_t scored = pd->mode == &mode_host ? L * S * (size_t)pd->kp.h_q * ms : 0;
    size_t n_rows = pd->shared_rows ? S * hkv : L * S * hkv;
    size_t sz[6] = {n_rows, lists * ms, lists, scored, S, S}, total = 0;
    for (int i = 0; i < 6; i++) total += al(sz[i] * 4);
    flexdiag_status st = k->host_alloc ? k->host_alloc(total, &pd->host) : FLEXDIAG_OK;
    if (!k->host_alloc) pd->host = malloc(total);
    if (st != FLEXDIAG_OK) return st;
    if (!pd->host) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "policy: no host memory");
    pd->host_bytes = total;
    memset(pd->host, 0, total);
    char *p = pd->host;
    void **dst[6] = {(void **)&pd->h_rows, (void **)&pd->h_slots, (void **)&pd->h_nslots,
                     (void **)&pd->h_pscore, (void **)&pd->h_dnext, (void **)&pd->h_steps};
    for (int i = 0; i < 6; i++) {
        *dst[i] = p;
        p += al(sz[i] * 4);
    }
    for (size_t i = 0; i < n_rows; i++) pd->h_rows[i] = pd->p_cap;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__pd_start(flexdiag_policy_driver *pd, int threads) {
    FLEXDIAG_TRY(host_mirrors(pd));
    FLEXDIAG_TRY(flexdiag__kvp_create(&pd->kp, &pd->kvp));
    if (pd->mode == &mode_host) /* per-(layer, sequence) host state machines */
        FLEXDIAG_TRY(flexdiag__pool_create(threads, &pd->pool));
    return FLEXDIAG_OK;
}

void flexdiag__pd_fini(flexdiag_policy_driver *pd) {
    flexdiag__kvp_destroy(pd->kvp);
    flexdiag__pool_destroy(pd->pool);
    if (pd->k && pd->k->host_free) pd->k->host_free(pd->host);
    else free(pd->host);
    pd->kvp = NULL;
    pd->pool = NULL;
    pd->host = NULL;
}

void flexdiag__pd_reset(flexdiag_policy_driver *pd) {
    flexdiag__kvp_reset(pd->kvp);
    pd->dev_evictions = 0;
}

void flexdiag__pd_admit(flexdiag_policy_driver *pd, int32_t s0, int32_t n) {
    for (int32_t q = s0; q < s0 + n; q++) flexdiag__kvp_reset_seq(pd->kvp, q);
}

/* ---- per pass ---- */

flexdiag_status flexdiag__pd_plan(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                  flexdiag_stream *s) {
    pd->pass_scores = pd->scored && any_scores(pd, run);
    return pd->mode->plan(pd, run, s);
}

int flexdiag__pd_scores(const flexdiag_policy_driver *pd) { return pd->pass_scores; }

const int32_t *flexdiag__pd_attn(const flexdiag_policy_driver *pd, int32_t j, int32_t s0,
                                 int scores, flexdiag_attn_args *a) {
    size_t li = list_index(pd, j, s0), ms = (size_t)pd->max_slots;
    a->slots = pd->b.slots + li * ms;
    a->n_slots = pd->b.nslots + li;
    a->max_slots = pd->max_slots;
    a->shared_slots = pd->shared_slots ? FLEXDIAG_SLOTS_PER_SEQ : FLEXDIAG_SLOTS_PER_HEAD;
    if (scores && pd->mode->fuse_diag) {
        a->diag_lag = pd->b.lag + li * (size_t)diag_len(pd);
        a->diag_a = diag_len(pd);
        a->diag_base = diag_base(pd);
        a->diag_next = pd->b.dnext + s0;
    } else if (scores) {
        size_t q0 = ((size_t)j * (size_t)pd->kp.n_seq + (size_t)s0) * (size_t)pd->kp.h_q;
        float *out = pd->b.pscore + q0 * ms; /* (n_seq, h_q, ms) rows of this micro-batch */
        if (pd->score_probs) a->probs_out = out;
        else a->logits_out = out;
    }
    size_t r0 = pd->shared_rows ? (size_t)s0 * (size_t)pd->kp.h_kv : head_index(pd, j, s0);
    return pd->b.rows + r0;
}

flexdiag_status flexdiag__pd_update(flexdiag_policy_driver *pd, const flexdiag_pd_run *run,
                                    flexdiag_stream *s) {
    if (!pd->pass_scores) return FLEXDIAG_OK;
    return pd->mode->update(pd, run, s);
}

uint64_t flexdiag__pd_evictions(const flexdiag_policy_driver *pd) {
    return flexdiag__kvp_evictions(pd->kvp) + pd->dev_evictions;
}

int flexdiag__pd_on_device(const flexdiag_policy_driver *pd) { return pd->mode->device; }
