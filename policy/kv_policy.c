/*
 * kv_policy.c - the KV-policy front end: parameter resolution and validation (docs/policies.md
 * §0.2, §0.6), sizing and the one allocation of all state, and the plan/update dispatch to the
 * policy families (policy_position.c, policy_diagonal.c, policy_score.c, policy_alisa.c).
 *
 * plan() and update() check the call protocol (steps in order per (layer, sequence), update()
 * ran whenever needs_scores() said it was needed) with FLEXDIAG_ASSERT: a violation is an engine
 * bug, not bad user input. Bad user parameters come back as FLEXDIAG_ERR_INVALID_ARG with a
 * message naming the field of flexdiag_context_params it came from (the CLI names its flag
 * instead: cli/cli.c) and the fix.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "policy/kvp_internal.h"

/* ---- names ---- */

static const char *const kvp_names[] = {
    [FLEXDIAG_POLICY_DENSE] = "dense",         [FLEXDIAG_POLICY_WINDOW] = "window",
    [FLEXDIAG_POLICY_STREAMING] = "streaming", [FLEXDIAG_POLICY_H2O] = "h2o",
    [FLEXDIAG_POLICY_TOVA] = "tova",           [FLEXDIAG_POLICY_ALISA] = "alisa",
    [FLEXDIAG_POLICY_DIAGONAL] = "diagonal",   [FLEXDIAG_POLICY_DIAGONAL_SINK4] = "diagonal-sink4",
};
#define KVP_N_KINDS ((int)(sizeof kvp_names / sizeof kvp_names[0]))

const char *flexdiag__kvp_name(flexdiag_policy_kind kind) {
    if ((int)kind < 0 || (int)kind >= KVP_N_KINDS) return "unknown";
    return kvp_names[kind];
}

int flexdiag__kvp_parse(const char *name, flexdiag_policy_kind *out) {
    for (int i = 0; name && i < KVP_N_KINDS; i++) {
        if (!strcmp(name, kvp_names[i])) {
            *out = (flexdiag_policy_kind)i;
            return 0;
        }
    }
    return -1;
}

const char *flexdiag__kvp_names(void) {
    return "dense, window, streaming, h2o, tova, alisa, diagonal, diagonal-sink4";
}

static const flexdiag_kvp_traits kvp_traits[] = {
    [FLEXDIAG_POLICY_DENSE] = {"-", "-", "n/a", "none", "full", "none", 0},
    [FLEXDIAG_POLICY_WINDOW] = {"position", "global", "n/a", "permanent", "N_att", "none", 0},
    [FLEXDIAG_POLICY_STREAMING] = {"position", "global", "n/a", "permanent", "N_att", "none", 0},
    [FLEXDIAG_POLICY_H2O] = {"accumulated p", "KV head", "sum", "permanent", "N_att",
                             "acc update + argmin over H+1", 1},
    [FLEXDIAG_POLICY_TOVA] = {"current p", "layer", "mean", "permanent", "N_att",
                              "head mean + argmin over N_att", 1},
    [FLEXDIAG_POLICY_ALISA] = {"windowed p", "layer", "sum", "selection only", "full",
                               "S update + top-k_g over <= t", 1},
    [FLEXDIAG_POLICY_DIAGONAL] = {"logits", "KV head", "max", "permanent", "N_r",
                                  "argmin over A, build-up steps only", 0},
    [FLEXDIAG_POLICY_DIAGONAL_SINK4] = {"logits", "KV head", "max", "permanent", "4+N_r",
                                        "argmin over A-4, build-up steps only", 0},
};

const flexdiag_kvp_traits *flexdiag__kvp_traits(flexdiag_policy_kind kind) {
    static const flexdiag_kvp_traits unknown = {"-", "-", "-", "-", "-", "-", 0};
    if ((int)kind < 0 || (int)kind >= KVP_N_KINDS) return &unknown;
    return &kvp_traits[kind];
}

static int is_diagonal(flexdiag_policy_kind k) {
    return k == FLEXDIAG_POLICY_DIAGONAL || k == FLEXDIAG_POLICY_DIAGONAL_SINK4;
}

/* ---- resolve and validate ---- */

/* Largest ring a lag list can index: lags are int16 (docs/policies.md §2.3). */
#define KVP_MAX_NR 32767

/* The fields messages name: a caller sets them in flexdiag_context_params.policy. */
#define F_NATT "context_params.policy.n_att"
#define F_NR "context_params.policy.n_r"
#define F_SPARSITY "context_params.policy.sparsity"

/* Sinks (docs/policies.md §0.6): streaming and diagonal-sink4 keep 4 sink tokens. n_att and
 * n_r are given or resolved values; 0 = not known yet, not checked. */
static flexdiag_status validate_sinks(flexdiag_policy_kind kind, int32_t n_att, int32_t n_r) {
    if (kind == FLEXDIAG_POLICY_DIAGONAL_SINK4 && n_r > 0 && n_r < 5)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NR " %d is too small for "
                             "diagonal-sink4: it keeps 4 sink tokens, use " F_NR " >= 5",
                             (int)n_r);
    if ((kind == FLEXDIAG_POLICY_STREAMING || kind == FLEXDIAG_POLICY_DIAGONAL_SINK4) &&
        n_att > 0 && n_att < 5)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d is too small for %s: it "
                             "keeps 4 sink tokens, use " F_NATT " >= 5 (or a lower "
                             F_SPARSITY ")",
                             (int)n_att, flexdiag__kvp_name(kind));
    return FLEXDIAG_OK;
}

/* §0.6: a Diagonal kind attends within its ring, N_att <= N_r (the lag list would otherwise
 * clamp to N_r and the run attend fewer tokens than it reports). s is the sparsity N_att came
 * from, NaN when N_att was given; 0 = not known yet, not checked. */
static flexdiag_status validate_ring(flexdiag_policy_kind kind, int32_t n_att, int32_t n_r,
                                     double s) {
    if (!is_diagonal(kind) || n_att == 0 || n_r == 0 || n_att <= n_r) return FLEXDIAG_OK;
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
    if ((int)pub->kind < 0 || (int)pub->kind >= KVP_N_KINDS)
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
    int32_t n_r = is_diagonal(pub->kind) ? pub->n_r : 0;
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
    if (is_diagonal(pub->kind)) {
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

/* ---- sizes ---- */

int32_t flexdiag__kvp_ring_rows(const flexdiag_kvp_params *p) {
    switch (p->kind) {
    case FLEXDIAG_POLICY_DENSE:
    case FLEXDIAG_POLICY_ALISA: return p->l_dec;
    case FLEXDIAG_POLICY_DIAGONAL: return p->n_r;
    case FLEXDIAG_POLICY_DIAGONAL_SINK4: return 4 + p->n_r;
    default: return p->n_att; /* window, streaming (4 sinks + n_att-4), h2o, tova */
    }
}

int32_t flexdiag__kvp_max_slots(const flexdiag_kvp_params *p) {
    if (p->kind == FLEXDIAG_POLICY_DENSE) return p->l_dec;
    if (is_diagonal(p->kind)) return p->n_att < p->n_r ? p->n_att : p->n_r;
    return p->n_att;
}

int64_t flexdiag__kvp_resident_rows(const flexdiag_kvp_params *p, int32_t t) {
    int64_t n = (int64_t)t + 1;
    switch (p->kind) {
    case FLEXDIAG_POLICY_DENSE:
    case FLEXDIAG_POLICY_ALISA: return n;
    case FLEXDIAG_POLICY_DIAGONAL: return n < p->n_r ? n : p->n_r;
    case FLEXDIAG_POLICY_DIAGONAL_SINK4: return n <= 4 ? n : 4 + (n - 4 < p->n_r ? n - 4 : p->n_r);
    default: return n < p->n_att ? n : p->n_att;
    }
}

int32_t flexdiag__kvp_write_slot(const flexdiag_kvp_params *p, int32_t t) {
    switch (p->kind) {
    case FLEXDIAG_POLICY_DENSE:
    case FLEXDIAG_POLICY_ALISA: return t;
    case FLEXDIAG_POLICY_WINDOW: return t % p->n_att;
    case FLEXDIAG_POLICY_STREAMING: return t < 4 ? t : 4 + (t - 4) % (p->n_att - 4);
    case FLEXDIAG_POLICY_DIAGONAL: return t % p->n_r;
    case FLEXDIAG_POLICY_DIAGONAL_SINK4: return t < 4 ? t : 4 + (t - 4) % p->n_r;
    default: return t < p->n_att ? t : -1; /* h2o, tova: the evicted slot of each head */
    }
}

double flexdiag__kvp_reported_sparsity(const flexdiag_kvp_params *p) {
    if (p->kind == FLEXDIAG_POLICY_DENSE || p->l_dec <= 0) return 0.0;
    return 1.0 - (double)p->n_att / (double)p->l_dec;
}

/* ---- create: size every array, allocate once, carve ---- */

typedef struct kvp_carve {
    unsigned char *base; /* NULL in the sizing pass */
    size_t off;          /* bytes used so far */
    int ok;              /* 0 after an overflow */
} kvp_carve;

/* Reserve n elements of elem bytes, 64-byte aligned; NULL when n == 0 or sizing. */
static void *carve_take(kvp_carve *c, uint64_t n, size_t elem) {
    uint64_t bytes;
    if (!flexdiag__mul_ok(n, elem, &bytes) || bytes > (uint64_t)1 << 48) {
        c->ok = 0;
        return NULL;
    }
    size_t o = (c->off + 63) & ~(size_t)63;
    c->off = o + (size_t)bytes;
    return (c->base && n) ? c->base + o : NULL;
}

static void kvp_layout(flexdiag_kvp *k, kvp_carve *c) {
    const flexdiag_kvp_params *p = &k->p;
    uint64_t nsl = (uint64_t)p->n_seq * (uint64_t)p->n_layers, nh = nsl * (uint64_t)p->h_kv;
    uint64_t na = (uint64_t)p->n_att;
    k->next_t = carve_take(c, nsl, sizeof(int32_t));
    k->scored_t = carve_take(c, nsl, sizeof(int32_t));
    k->evictions = carve_take(c, nsl, sizeof(uint64_t));
    switch (p->kind) {
    case FLEXDIAG_POLICY_DIAGONAL:
    case FLEXDIAG_POLICY_DIAGONAL_SINK4:
        k->lag = carve_take(c, nh * (uint64_t)k->a, sizeof(int16_t));
        k->cnt = carve_take(c, nh, sizeof(int16_t));
        break;
    case FLEXDIAG_POLICY_H2O:
        k->pos = carve_take(c, nh * na, sizeof(int32_t));
        k->acc = carve_take(c, nh * na, sizeof(float));
        k->free_slot = carve_take(c, nh, sizeof(int32_t));
        break;
    case FLEXDIAG_POLICY_TOVA:
        k->pos = carve_take(c, nsl * na, sizeof(int32_t));
        k->free_slot = carve_take(c, nsl, sizeof(int32_t));
        break;
    case FLEXDIAG_POLICY_ALISA:
        k->score = carve_take(c, nsl * (uint64_t)p->l_dec, sizeof(float));
        k->keys = carve_take(c, nsl * (uint64_t)p->l_dec, sizeof(uint64_t));
        k->rec_pos = carve_take(c, nsl * (uint64_t)k->w * na, sizeof(int32_t));
        k->rec_p = carve_take(c, nsl * (uint64_t)k->w * na, sizeof(float));
        k->rec_n = carve_take(c, nsl * (uint64_t)k->w, sizeof(int32_t));
        break;
    default: break;
    }
}

static flexdiag_status validate_params(const flexdiag_kvp_params *p) {
    if ((int)p->kind < 0 || (int)p->kind >= KVP_N_KINDS)
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
    if (is_diagonal(p->kind) && (p->n_r < 1 || p->n_r > KVP_MAX_NR))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "kv policy: n_r %d must be in [1, %d]",
                             (int)p->n_r, KVP_MAX_NR);
    /* no validate_ring: the state machine clamps N_att > N_r (the tests drive that clamp);
     * flexdiag__kvp_resolve refuses it for every caller of the API and the tools */
    return validate_sinks(p->kind, p->n_att, is_diagonal(p->kind) ? p->n_r : 0);
}

flexdiag_status flexdiag__kvp_create(const flexdiag_kvp_params *p, flexdiag_kvp **out) {
    *out = NULL;
    FLEXDIAG_TRY(validate_params(p));
    flexdiag_kvp *k = calloc(1, sizeof *k);
    if (!k) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "kv policy: out of host memory");
    k->p = *p;
    k->g = p->h_q / p->h_kv;
    k->ring = flexdiag__kvp_ring_rows(p);
    k->max_slots = flexdiag__kvp_max_slots(p);
    if (is_diagonal(p->kind))
        k->a = k->max_slots - (p->kind == FLEXDIAG_POLICY_DIAGONAL_SINK4 ? 4 : 0);
    k->k_l = (p->n_att + 1) / 2;
    k->k_g = p->n_att - k->k_l;
    k->w = k->k_l;
    kvp_carve c = {NULL, 0, 1};
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
    c = (kvp_carve){k->mem, 0, 1};
    kvp_layout(k, &c);
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
    const flexdiag_kvp_params *p = &kvp->p;
    size_t nsl = (size_t)p->n_seq * (size_t)p->n_layers, nh = nsl * (size_t)p->h_kv;
    size_t na = (size_t)p->n_att;
    for (size_t i = 0; i < nsl; i++) {
        kvp->next_t[i] = 0;
        kvp->scored_t[i] = -1;
        kvp->evictions[i] = 0;
    }
    if (kvp->lag) memset(kvp->lag, 0, nh * (size_t)kvp->a * sizeof(int16_t));
    if (kvp->cnt) memset(kvp->cnt, 0, nh * sizeof(int16_t));
    size_t npos = p->kind == FLEXDIAG_POLICY_H2O ? nh * na : nsl * na;
    for (size_t i = 0; kvp->pos && i < npos; i++) kvp->pos[i] = -1;
    if (kvp->acc) memset(kvp->acc, 0, nh * na * sizeof(float));
    if (kvp->rec_n) memset(kvp->rec_n, 0, nsl * (size_t)kvp->w * sizeof(int32_t));
    if (kvp->free_slot)
        memset(kvp->free_slot, 0, (p->kind == FLEXDIAG_POLICY_H2O ? nh : nsl) * sizeof(int32_t));
}

void flexdiag__kvp_reset_seq(flexdiag_kvp *kvp, int32_t seq) {
    const flexdiag_kvp_params *p = &kvp->p;
    FLEXDIAG_ASSERT(seq >= 0 && seq < p->n_seq);
    size_t L = (size_t)p->n_layers, hkv = (size_t)p->h_kv, na = (size_t)p->n_att;
    size_t l0 = flexdiag__kvp_li(kvp, seq, 0), h0 = l0 * hkv, hn = L * hkv;
    for (size_t l = l0; l < l0 + L; l++) {
        kvp->next_t[l] = 0;
        kvp->scored_t[l] = -1;
    }
    if (kvp->lag) memset(kvp->lag + h0 * (size_t)kvp->a, 0, hn * (size_t)kvp->a * 2);
    if (kvp->cnt) memset(kvp->cnt + h0, 0, hn * 2);
    int h2o = p->kind == FLEXDIAG_POLICY_H2O;
    size_t p0 = (h2o ? h0 : l0) * na, pn = (h2o ? hn : L) * na;
    for (size_t i = 0; kvp->pos && i < pn; i++) kvp->pos[p0 + i] = -1;
    if (kvp->acc) memset(kvp->acc + h0 * na, 0, hn * na * sizeof(float));
    if (kvp->rec_n) memset(kvp->rec_n + l0 * (size_t)kvp->w, 0, L * (size_t)kvp->w * 4);
    if (kvp->free_slot) memset(kvp->free_slot + (h2o ? h0 : l0), 0, (h2o ? hn : L) * 4);
}

/* ---- per-step protocol ---- */

int flexdiag__kvp_needs_scores(const flexdiag_kvp *kvp, int32_t t) {
    const flexdiag_kvp_params *p = &kvp->p;
    if (t < 0 || t + 1 >= p->l_dec) return 0; /* the last step's bookkeeping is never read */
    switch (p->kind) {
    case FLEXDIAG_POLICY_DIAGONAL:
    case FLEXDIAG_POLICY_DIAGONAL_SINK4: return flexdiag__kvp_needs_diagonal(kvp, t);
    case FLEXDIAG_POLICY_H2O: return p->n_att < p->l_dec;
    case FLEXDIAG_POLICY_TOVA: return t >= p->n_att - 1;
    case FLEXDIAG_POLICY_ALISA: return kvp->k_g > 0 && t + kvp->w >= p->n_att;
    default: return 0;
    }
}

static void plan_one(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                     int32_t *slots, int32_t *ns) {
    switch (k->p.kind) {
    case FLEXDIAG_POLICY_DIAGONAL:
    case FLEXDIAG_POLICY_DIAGONAL_SINK4:
        flexdiag__kvp_plan_diagonal(k, layer, t, seq, ws, slots, ns);
        break;
    case FLEXDIAG_POLICY_H2O: flexdiag__kvp_plan_h2o(k, layer, t, seq, ws, slots, ns); break;
    case FLEXDIAG_POLICY_TOVA: flexdiag__kvp_plan_tova(k, layer, t, seq, ws, slots, ns); break;
    case FLEXDIAG_POLICY_ALISA: flexdiag__kvp_plan_alisa(k, layer, t, seq, ws, slots, ns); break;
    default: flexdiag__kvp_plan_position(k, layer, t, seq, ws, slots, ns); break;
    }
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
        plan_one(kvp, layer, t, s0 + i, write_slot + hs, slots + hs * (size_t)kvp->max_slots,
                 n_slots + hs);
        kvp->next_t[li] = t + 1;
    }
}

void flexdiag__kvp_update(flexdiag_kvp *kvp, int32_t layer, int32_t t, int32_t s0, int32_t n,
                          const float *logits, const float *lse, const float *probs) {
    const flexdiag_kvp_params *p = &kvp->p;
    if (!flexdiag__kvp_needs_scores(kvp, t)) return;
    FLEXDIAG_ASSERT(is_diagonal(p->kind) ? logits != NULL : probs || (logits && lse));
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
        switch (p->kind) {
        case FLEXDIAG_POLICY_DIAGONAL:
        case FLEXDIAG_POLICY_DIAGONAL_SINK4:
            flexdiag__kvp_update_diagonal(kvp, layer, t, seq, sc.logits);
            break;
        case FLEXDIAG_POLICY_H2O: flexdiag__kvp_update_h2o(kvp, layer, t, seq, &sc); break;
        case FLEXDIAG_POLICY_TOVA: flexdiag__kvp_update_tova(kvp, layer, t, seq, &sc); break;
        case FLEXDIAG_POLICY_ALISA: flexdiag__kvp_update_alisa(kvp, layer, t, seq, &sc); break;
        default: break;
        }
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
    size_t na = (size_t)p->n_att;
    switch (p->kind) {
    case FLEXDIAG_POLICY_DIAGONAL:
    case FLEXDIAG_POLICY_DIAGONAL_SINK4: return flexdiag__kvp_pos_diagonal(kvp, t, slot);
    case FLEXDIAG_POLICY_H2O: return kvp->pos[flexdiag__kvp_hi(kvp, seq, layer, h) * na + slot];
    case FLEXDIAG_POLICY_TOVA: return kvp->pos[flexdiag__kvp_li(kvp, seq, layer) * na + slot];
    default: return flexdiag__kvp_pos_position(kvp, t, slot);
    }
}
