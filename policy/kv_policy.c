/*
 * kv_policy.c - the KV-policy front end: the table kind -> policy class (kvp_internal.h; one
 * class per policy, defined in policy_position.c, policy_diagonal.c, policy_score.c and
 * policy_alisa.c), parameter resolution and validation (docs/policies.md §0.2, §0.6) from the
 * classes' traits, the one allocation of all state, and the call protocol around the classes'
 * plan / update hooks. Nothing here knows what a policy's state holds.
 *
 * plan() and update() check the call protocol (steps in order per (layer, sequence), update()
 * ran whenever needs_scores() said it was needed) with FLEXDIAG_ASSERT: a violation is an engine
 * bug, not bad user input. Bad user parameters come back as FLEXDIAG_ERR_INVALID_ARG with a
 * message naming the field of flexdiag_context_params it came from (the CLI names its flag
 * instead: cli/cli.c) and the fix.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "policy/kvp_calib.h"
#include "policy/kvp_internal.h"

/* ---- the classes ---- */

static const flexdiag_kvp_class *const kvp_classes[] = {
    [FLEXDIAG_POLICY_DENSE] = &flexdiag__kvp_dense,
    [FLEXDIAG_POLICY_WINDOW] = &flexdiag__kvp_window,
    [FLEXDIAG_POLICY_STREAMING] = &flexdiag__kvp_streaming,
    [FLEXDIAG_POLICY_H2O] = &flexdiag__kvp_h2o,
    [FLEXDIAG_POLICY_TOVA] = &flexdiag__kvp_tova,
    [FLEXDIAG_POLICY_ALISA] = &flexdiag__kvp_alisa,
    [FLEXDIAG_POLICY_DIAGONAL] = &flexdiag__kvp_diagonal,
    [FLEXDIAG_POLICY_DIAGONAL_SINK4] = &flexdiag__kvp_diagonal_sink4,
    [FLEXDIAG_POLICY_LINE_AR] = &flexdiag__kvp_line_ar,
    [FLEXDIAG_POLICY_SSD] = &flexdiag__kvp_ssd,
    [FLEXDIAG_POLICY_HACK] = &flexdiag__kvp_hack,
};
#define KVP_N_KINDS ((int)(sizeof kvp_classes / sizeof kvp_classes[0]))

/* The class of kind, NULL when unknown; the calibration collector has an internal kind, outside
 * the table (no name to parse, not listed). */
static const flexdiag_kvp_class *class_of(flexdiag_policy_kind kind) {
    if (kind == FLEXDIAG__POLICY_CALIBRATE) return &flexdiag__kvp_calibrate;
    return (int)kind < 0 || (int)kind >= KVP_N_KINDS ? NULL : kvp_classes[kind];
}

int flexdiag__kvp_needs_calib(flexdiag_policy_kind kind) {
    const flexdiag_kvp_class *c = class_of(kind);
    return c && c->calibrated;
}

const char *flexdiag__kvp_name(flexdiag_policy_kind kind) {
    const flexdiag_kvp_class *c = class_of(kind);
    return c ? c->name : "unknown";
}

int flexdiag__kvp_parse(const char *name, flexdiag_policy_kind *out) {
    for (int i = 0; name && i < KVP_N_KINDS; i++) {
        if (!strcmp(name, kvp_classes[i]->name)) {
            *out = (flexdiag_policy_kind)i;
            return 0;
        }
    }
    return -1;
}

static char kvp_name_list[256];

static void build_name_list(void) {
    size_t n = 0;
    for (int i = 0; i < KVP_N_KINDS; i++)
        n += (size_t)snprintf(kvp_name_list + n, sizeof kvp_name_list - n, "%s%s", i ? ", " : "",
                              kvp_classes[i]->name);
}

const char *flexdiag__kvp_names(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_name_list);
    return kvp_name_list;
}

const flexdiag_kvp_traits *flexdiag__kvp_traits(flexdiag_policy_kind kind) {
    static const flexdiag_kvp_traits unknown = {"-", "-", "-", "-", "-", "-", 0,
                                                FLEXDIAG_KVP_DEV_NONE, 0, 0, 0};
    const flexdiag_kvp_class *c = class_of(kind);
    return c ? &c->traits : &unknown;
}

static int has_ring(flexdiag_policy_kind k) { return flexdiag__kvp_traits(k)->has_ring; }

/* ---- resolve and validate ---- */

/* Largest ring a lag list can index: lags are int16 (docs/policies.md §2.3). */
#define KVP_MAX_NR 32767

/* The fields messages name: a caller sets them in flexdiag_context_params.policy. */
#define F_NATT "context_params.policy.n_att"
#define F_NR "context_params.policy.n_r"
#define F_SPARSITY "context_params.policy.sparsity"

/* Sinks (docs/policies.md §0.6): a policy that keeps sinks (streaming, diagonal-sink4) needs a
 * budget and a ring larger than them. n_att and n_r are given or resolved values; 0 = not known
 * yet, not checked. */
static flexdiag_status validate_sinks(flexdiag_policy_kind kind, int32_t n_att, int32_t n_r) {
    int32_t sinks = flexdiag__kvp_traits(kind)->sinks;
    if (sinks == 0) return FLEXDIAG_OK;
    if (has_ring(kind) && n_r > 0 && n_r <= sinks)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NR " %d is too small for %s: it keeps "
                             "%d sink tokens, use " F_NR " >= %d",
                             (int)n_r, flexdiag__kvp_name(kind), (int)sinks, (int)sinks + 1);
    if (n_att > 0 && n_att <= sinks)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d is too small for %s: it "
                             "keeps %d sink tokens, use " F_NATT " >= %d (or a lower "
                             F_SPARSITY ")",
                             (int)n_att, flexdiag__kvp_name(kind), (int)sinks, (int)sinks + 1);
    return FLEXDIAG_OK;
}

/* §0.6: a policy with a ring attends within it, N_att <= N_r (the lag list would otherwise
 * clamp to N_r and the run attend fewer tokens than it reports). s is the sparsity N_att came
 * from, NaN when N_att was given; 0 = not known yet, not checked. */
static flexdiag_status validate_ring(flexdiag_policy_kind kind, int32_t n_att, int32_t n_r,
                                     double s) {
    if (!has_ring(kind) || n_att == 0 || n_r == 0 || n_att <= n_r) return FLEXDIAG_OK;
    if (isnan(s))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d exceeds " F_NR " %d: the %s "
                             "policy attends within its ring; raise " F_NR " or lower " F_NATT,
                             (int)n_att, (int)n_r, flexdiag__kvp_name(kind));
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_SPARSITY " %g gives N_att %d, which exceeds "
                         F_NR " %d: the %s policy attends within its ring; raise " F_NR " or "
                         F_SPARSITY, s, (int)n_att, (int)n_r, flexdiag__kvp_name(kind));
}

flexdiag_status flexdiag__kvp_check(const flexdiag_policy_params *pub) {
    if (!pub || pub->struct_size == 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy params: struct_size is 0: call "
                             "flexdiag_policy_params_init() first");
    if (!class_of(pub->kind))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy kind %d is unknown: valid "
                             "policies are %s", (int)pub->kind, flexdiag__kvp_names());
    if (pub->kind == FLEXDIAG_POLICY_DENSE) return FLEXDIAG_OK; /* budget fields do not apply */
    if (pub->n_att < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d must be >= 1 (or 0 to derive "
                             "it from " F_SPARSITY ")", (int)pub->n_att);
    if (pub->n_att == 0 && isnan(pub->sparsity))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s needs a budget: give " F_NATT " N "
                             "(attended decode tokens, >= 1) or " F_SPARSITY " S in [0, 1]",
                             flexdiag__kvp_name(pub->kind));
    if (pub->n_att == 0 && !(pub->sparsity >= 0.0 && pub->sparsity <= 1.0))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_SPARSITY " %g must be in [0, 1] (the "
                             "fraction of decode tokens not attended)", pub->sparsity);
    int32_t n_r = has_ring(pub->kind) ? pub->n_r : 0;
    if (n_r < 0 || n_r > KVP_MAX_NR)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NR " %d must be in [1, %d] (lag lists "
                             "are int16), or 0 for the default max(round(0.5 L_dec), N_att)",
                             (int)n_r, KVP_MAX_NR);
    FLEXDIAG_TRY(validate_sinks(pub->kind, pub->n_att, n_r));
    return validate_ring(pub->kind, pub->n_att, n_r, NAN);
}

flexdiag_status flexdiag__kvp_resolve(const flexdiag_policy_params *pub, int32_t l_dec,
                                      flexdiag_kvp_params *out) {
    memset(out, 0, sizeof *out);
    FLEXDIAG_TRY(flexdiag__kvp_check(pub));
    if (l_dec < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "decode length %d must be >= 1",
                             (int)l_dec);
    out->kind = pub->kind;
    out->l_dec = l_dec;
    if (pub->kind == FLEXDIAG_POLICY_DENSE) {
        out->n_att = l_dec; /* dense attends everything */
        return FLEXDIAG_OK;
    }
    if (pub->n_att > l_dec)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d exceeds the decode length %d: "
                             "use " F_NATT " <= %d", (int)pub->n_att, (int)l_dec, (int)l_dec);
    long n = pub->n_att > 0 ? pub->n_att : lround((1.0 - pub->sparsity) * (double)l_dec);
    out->n_att = (int32_t)(n < 1 ? 1 : n > l_dec ? l_dec : n);
    if (has_ring(pub->kind)) {
        long def = lround(0.5 * (double)l_dec);
        out->n_r = pub->n_r > 0 ? pub->n_r : (int32_t)(def > out->n_att ? def : out->n_att);
        if (out->n_r > KVP_MAX_NR) /* a default from a long decode */
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "N_r %d (the default for decode "
                                 "length %d) exceeds %d (lag lists are int16): give " F_NR,
                                 (int)out->n_r, (int)l_dec, KVP_MAX_NR);
    }
    FLEXDIAG_TRY(validate_sinks(out->kind, out->n_att, out->n_r));
    return validate_ring(out->kind, out->n_att, out->n_r, pub->n_att > 0 ? NAN : pub->sparsity);
}

/* ---- sizes: the class's geometry ---- */

int32_t flexdiag__kvp_ring_rows(const flexdiag_kvp_params *p) {
    return class_of(p->kind)->ring_rows(p);
}

int32_t flexdiag__kvp_max_slots(const flexdiag_kvp_params *p) {
    return class_of(p->kind)->max_slots(p);
}

int64_t flexdiag__kvp_resident_rows(const flexdiag_kvp_params *p, int32_t t) {
    return class_of(p->kind)->resident_rows(p, t);
}

int32_t flexdiag__kvp_write_slot(const flexdiag_kvp_params *p, int32_t t) {
    return class_of(p->kind)->write_slot(p, t);
}

double flexdiag__kvp_reported_sparsity(const flexdiag_kvp_params *p) {
    if (p->kind == FLEXDIAG_POLICY_DENSE || p->l_dec <= 0) return 0.0;
    return 1.0 - (double)p->n_att / (double)p->l_dec;
}

/* ---- create: size every array, allocate once, carve ---- */

void *flexdiag__kvp_take(flexdiag__kvp_carve *c, uint64_t n, size_t elem) {
    uint64_t bytes;
    if (!flexdiag__mul_ok(n, elem, &bytes) || bytes > (uint64_t)1 << 48) {
        c->ok = 0;
        return NULL;
    }
    size_t o = (c->off + 63) & ~(size_t)63;
    c->off = o + (size_t)bytes;
    return (c->base && n) ? c->base + o : NULL;
}

/* The protocol arrays every policy has, then the class's own. */
static void kvp_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    uint64_t nsl = (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers;
    k->next_t = flexdiag__kvp_take(c, nsl, sizeof(int32_t));
    k->scored_t = flexdiag__kvp_take(c, nsl, sizeof(int32_t));
    k->evictions = flexdiag__kvp_take(c, nsl, sizeof(uint64_t));
    if (k->cls->layout) k->cls->layout(k, c);
}

static flexdiag_status validate_params(const flexdiag_kvp_params *p) {
    if (!class_of(p->kind))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "kv policy: kind %d is unknown (valid: "
                             "%s)", (int)p->kind, flexdiag__kvp_names());
    if (p->l_dec < 1 || p->n_att < 1 || p->n_att > p->l_dec)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "kv policy: n_att %d must be in [1, "
                             "l_dec %d]: resolve params with flexdiag__kvp_resolve()",
                             (int)p->n_att, (int)p->l_dec);
    if (p->n_seq < 1 || p->n_layers < 1 || p->h_kv < 1 || p->h_q < p->h_kv ||
        p->h_q % p->h_kv != 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "kv policy: need n_seq, n_layers >= 1 "
                             "and h_q a multiple of h_kv, got n_seq %d n_layers %d h_q %d h_kv %d",
                             (int)p->n_seq, (int)p->n_layers, (int)p->h_q, (int)p->h_kv);
    if (has_ring(p->kind) && (p->n_r < 1 || p->n_r > KVP_MAX_NR))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "kv policy: n_r %d must be in [1, %d]",
                             (int)p->n_r, KVP_MAX_NR);
    /* no validate_ring: the state machine clamps N_att > N_r (the tests drive that clamp);
     * flexdiag__kvp_resolve refuses it for every caller of the API and the tools */
    FLEXDIAG_TRY(validate_sinks(p->kind, p->n_att, has_ring(p->kind) ? p->n_r : 0));
    const flexdiag_kvp_class *cls = class_of(p->kind);
    return cls->check ? cls->check(p) : FLEXDIAG_OK;
}

flexdiag_status flexdiag__kvp_create(const flexdiag_kvp_params *p, flexdiag_kvp **out) {
    *out = NULL;
    FLEXDIAG_TRY(validate_params(p));
    const flexdiag_kvp_class *cls = class_of(p->kind);
    flexdiag_kvp *k = calloc(1, sizeof *k + cls->state_size);
    if (!k) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "kv policy: out of host memory");
    k->p = *p;
    k->cls = cls;
    k->g = p->h_q / p->h_kv;
    k->ring = cls->ring_rows(p);
    k->max_slots = cls->max_slots(p);
    flexdiag__kvp_carve c = {NULL, 0, 1};
    kvp_layout(k, &c);
    if (!c.ok) {
        free(k);
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "kv policy: state size overflows for "
                             "n_seq %d n_layers %d h_kv %d l_dec %d", (int)p->n_seq,
                             (int)p->n_layers, (int)p->h_kv, (int)p->l_dec);
    }
    k->mem = aligned_alloc(64, (c.off + 63) & ~(size_t)63);
    if (!k->mem) {
        free(k);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "kv policy: cannot allocate %zu bytes of "
                             "policy state", c.off);
    }
    c = (flexdiag__kvp_carve){k->mem, 0, 1};
    kvp_layout(k, &c);
    if (cls->init) cls->init(k);
    flexdiag__kvp_reset(k);
    *out = k;
    return FLEXDIAG_OK;
}

void flexdiag__kvp_destroy(flexdiag_kvp *kvp) {
    if (!kvp) return;
    free(kvp->mem);
    free(kvp);
}

void flexdiag__kvp_reset(flexdiag_kvp *kvp) {
    for (int32_t s = 0; s < kvp->p.n_seq; s++) flexdiag__kvp_reset_seq(kvp, s);
    size_t nsl = (size_t)kvp->p.n_seq * (size_t)kvp->p.n_layers;
    memset(kvp->evictions, 0, nsl * sizeof(uint64_t));
}

void flexdiag__kvp_reset_seq(flexdiag_kvp *kvp, int32_t seq) {
    FLEXDIAG_ASSERT(seq >= 0 && seq < kvp->p.n_seq);
    size_t l0 = flexdiag__kvp_li(kvp, seq, 0);
    for (size_t l = l0; l < l0 + (size_t)kvp->p.n_layers; l++) {
        kvp->next_t[l] = 0;
        kvp->scored_t[l] = -1;
    }
    if (kvp->cls->reset_seq) kvp->cls->reset_seq(kvp, seq);
}

void flexdiag__kvp_fill_heads(const flexdiag_kvp *k, int32_t ws, int32_t n, int32_t *w,
                              int32_t *slots, int32_t *ns) {
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        w[h] = ws;
        ns[h] = n;
        if (h > 0) memcpy(slots + (size_t)h * (size_t)k->max_slots, slots, (size_t)n * 4);
    }
}

/* ---- per-step protocol ---- */

int flexdiag__kvp_needs_scores(const flexdiag_kvp *kvp, int32_t t) {
    if (t < 0 || t + 1 >= kvp->p.l_dec) return 0; /* the last step's bookkeeping is never read */
    return kvp->cls->needs_scores && kvp->cls->needs_scores(kvp, t);
}

void flexdiag__kvp_plan(flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t s0, int32_t n,
                        int32_t *write_slot, int32_t *slots, int32_t *n_slots) {
    const flexdiag_kvp_params *p = &kvp->p;
    FLEXDIAG_ASSERT(layer >= 0 && layer < p->n_layers && t >= 0 && t < p->l_dec);
    FLEXDIAG_ASSERT(s0 >= 0 && n >= 0 && s0 + n <= p->n_seq);
    int need_prev = t > 0 && flexdiag__kvp_needs_scores(kvp, t - 1);
    for (int32_t i = 0; i < n; i++) {
        size_t li = flexdiag__kvp_li(kvp, s0 + i, layer);
        FLEXDIAG_ASSERT(kvp->next_t[li] == t); /* steps in order, once each */
        FLEXDIAG_ASSERT(!need_prev || kvp->scored_t[li] == t - 1); /* update() was required */
        size_t hs = (size_t)i * (size_t)p->h_kv;
        kvp->cls->plan(kvp, layer, t, s0 + i, write_slot + hs,
                       slots + hs * (size_t)kvp->max_slots, n_slots + hs);
        kvp->next_t[li] = t + 1;
    }
}

int flexdiag__kvp_plan_shared(flexdiag_kvp *k, int32_t t, int32_t s0, int32_t n, int32_t *ws,
                              int32_t *slots, int32_t *ns) {
    if (!k->cls->shared_list) return 0;
    FLEXDIAG_ASSERT(t >= 0 && t < k->p.l_dec && s0 >= 0 && n >= 0 && s0 + n <= k->p.n_seq);
    int evict;
    *ns = k->cls->shared_list(k, t, slots, ws, &evict);
    for (int32_t s = s0; evict && s < s0 + n; s++)
        for (int32_t l = 0; l < k->p.n_layers; l++)
            k->evictions[flexdiag__kvp_li(k, s, l)] += (uint64_t)k->p.h_kv;
    return 1;
}

int flexdiag__kvp_plans_ahead(flexdiag_policy_kind kind) {
    const flexdiag_kvp_class *c = class_of(kind);
    return c && c->plan_ahead;
}

int flexdiag__kvp_window_ok(const flexdiag_kvp *kvp, int32_t t, int32_t n) {
    if (!kvp->cls->plan_ahead) return n <= 1;
    for (int32_t s = t; s < t + n; s++)
        if (flexdiag__kvp_needs_scores(kvp, s)) return 0;
    return 1;
}

void flexdiag__kvp_plan_ahead(const flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t i,
                              int32_t seq, int32_t *write_slot, int32_t *slots,
                              int32_t *n_slots) {
    FLEXDIAG_ASSERT(layer >= 0 && layer < kvp->p.n_layers && seq >= 0 && seq < kvp->p.n_seq);
    FLEXDIAG_ASSERT(kvp->next_t[flexdiag__kvp_li(kvp, seq, layer)] == t && i >= 0);
    FLEXDIAG_ASSERT(t + i < kvp->p.l_dec && flexdiag__kvp_window_ok(kvp, t, i + 1));
    kvp->cls->plan_ahead(kvp, layer, t + i, seq, write_slot, slots, n_slots);
}

int32_t flexdiag__kvp_list_at(const flexdiag_kvp *kvp, int32_t t, int32_t *write_slot,
                              int32_t *slots) {
    int evict;
    if (!kvp->cls->shared_list) return -1;
    FLEXDIAG_ASSERT(t >= 0);
    return kvp->cls->shared_list(kvp, t, slots, write_slot, &evict);
}

void flexdiag__kvp_count_steps(flexdiag_kvp *kvp, int32_t seq, int32_t t, int32_t n) {
    FLEXDIAG_ASSERT(kvp->cls->shared_list && seq >= 0 && seq < kvp->p.n_seq);
    for (int32_t s = t; s < t + n; s++) {
        if (s < 1 || flexdiag__kvp_resident_rows(&kvp->p, s) !=
                         flexdiag__kvp_resident_rows(&kvp->p, s - 1))
            continue;
        for (int32_t l = 0; l < kvp->p.n_layers; l++)
            kvp->evictions[flexdiag__kvp_li(kvp, seq, l)] += (uint64_t)kvp->p.h_kv;
    }
}

void flexdiag__kvp_update(flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t s0, int32_t n,
                          const float *logits, const float *lse, const float *probs) {
    const flexdiag_kvp_params *p = &kvp->p;
    if (!flexdiag__kvp_needs_scores(kvp, t)) return;
    FLEXDIAG_ASSERT(kvp->cls->traits.needs_probabilities ? probs || (logits && lse)
                                                         : logits != NULL);
    FLEXDIAG_ASSERT(layer >= 0 && layer < p->n_layers);
    FLEXDIAG_ASSERT(s0 >= 0 && n >= 0 && s0 + n <= p->n_seq);
    for (int32_t i = 0; i < n; i++) {
        int32_t seq = s0 + i;
        size_t li = flexdiag__kvp_li(kvp, seq, layer);
        FLEXDIAG_ASSERT(kvp->next_t[li] == t + 1 && kvp->scored_t[li] < t); /* after plan(t) */
        size_t row = (size_t)i * (size_t)p->h_q * (size_t)kvp->max_slots;
        flexdiag__kvp_scores sc = {logits ? logits + row : NULL,
                                   lse ? lse + (size_t)i * (size_t)p->h_q : NULL,
                                   probs ? probs + row : NULL, kvp->max_slots};
        kvp->cls->update(kvp, layer, t, seq, &sc);
        kvp->scored_t[li] = t;
    }
}

/* ---- queries ---- */

uint64_t flexdiag__kvp_evictions(const flexdiag_kvp *kvp) {
    uint64_t sum = 0;
    size_t nsl = (size_t)kvp->p.n_seq * (size_t)kvp->p.n_layers;
    for (size_t i = 0; i < nsl; i++) sum += kvp->evictions[i];
    return sum;
}

int32_t flexdiag__kvp_slot_pos(const flexdiag_kvp *kvp, int32_t layer, int32_t seq, int32_t h,
                               int32_t slot) {
    const flexdiag_kvp_params *p = &kvp->p;
    FLEXDIAG_ASSERT(layer >= 0 && layer < p->n_layers && seq >= 0 && seq < p->n_seq);
    FLEXDIAG_ASSERT(h >= 0 && h < p->h_kv && slot >= 0 && slot < kvp->ring);
    int32_t t = kvp->next_t[flexdiag__kvp_li(kvp, seq, layer)] - 1; /* last planned step */
    return kvp->cls->slot_pos(kvp, layer, seq, h, t, slot);
}
