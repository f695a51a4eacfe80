/*
 * policy_calib.c - the calibration collector (internal kind FLEXDIAG__POLICY_CALIBRATE,
 * docs/policies.md §7.2): attends like dense (token t in slot t, every step attends slots
 * 0..t in ascending order) and, at the recorded steps t0 = floor(L_dec / 2) <= t (the engine
 * reads scores up to L_dec - 2: the last step's are never read back), sums per (sequence slot,
 * layer, query head) the decode-normalised probabilities p^(t, k) = p(t, k) / sum_{k' <= t}
 * p(t, k'):
 *   lag[l] += p^(t, t - l)            the lag profile, l = 0 .. t
 *   s1[k] += p^(t, k), s2[k] += p^2   the column sums of the keys k < t0 (seen by every
 *                                      recorded query)
 * in double, in step order, and counts the recorded steps per (sequence slot, layer). The sums
 * live for the instance's life: they are zeroed once when it is made (init), never by a reset,
 * so a slot accumulates every sequence it serves. flexdiag__kvp_calib_export folds them into a
 * table. Each (sequence, layer) is written only by its own plan/update calls (kv_policy.h
 * threading).
 */
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "policy/kvp_calib.h"
#include "policy/kvp_internal.h"

typedef struct calib_state {
    double *lag;     /* (n_seq, n_layers, h_q, l_dec) sums of p^ by lag */
    double *s1, *s2; /* (n_seq, n_layers, h_q, t0) column sums of p^ and p^2 */
    uint64_t *steps; /* (n_seq, n_layers) recorded steps */
    int32_t t0;      /* first recorded step */
} calib_state;

static calib_state *cst(flexdiag_kvp *k) { return (calib_state *)(void *)k->fam; }
static const calib_state *ccst(const flexdiag_kvp *k) {
    return (const calib_state *)(const void *)k->fam;
}

static int32_t calib_rows(const flexdiag_kvp_params *p) { return p->l_dec; }

static int64_t calib_resident(const flexdiag_kvp_params *p, int32_t t) {
    (void)p;
    return (int64_t)t + 1;
}

static int32_t calib_write(const flexdiag_kvp_params *p, int32_t t) {
    (void)p;
    return t;
}

static void calib_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    calib_state *s = cst(k);
    uint64_t rows = (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers * (uint64_t)k->p.h_q;
    s->t0 = k->p.l_dec / 2;
    s->lag = flexdiag__kvp_take(c, rows * (uint64_t)k->p.l_dec, sizeof(double));
    s->s1 = flexdiag__kvp_take(c, rows * (uint64_t)s->t0, sizeof(double));
    s->s2 = flexdiag__kvp_take(c, rows * (uint64_t)s->t0, sizeof(double));
    s->steps = flexdiag__kvp_take(c, (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers,
                                  sizeof(uint64_t));
}

static void calib_init(flexdiag_kvp *k) {
    calib_state *s = cst(k);
    size_t rows = (size_t)k->p.n_seq * (size_t)k->p.n_layers * (size_t)k->p.h_q;
    memset(s->lag, 0, rows * (size_t)k->p.l_dec * sizeof(double));
    memset(s->s1, 0, rows * (size_t)s->t0 * sizeof(double));
    memset(s->s2, 0, rows * (size_t)s->t0 * sizeof(double));
    memset(s->steps, 0, (size_t)k->p.n_seq * (size_t)k->p.n_layers * sizeof(uint64_t));
}

static void calib_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                       int32_t *slots, int32_t *ns) {
    (void)layer, (void)seq;
    for (int32_t j = 0; j <= t; j++) slots[j] = j;
    flexdiag__kvp_fill_heads(k, t, t + 1, ws, slots, ns);
}

static int calib_needs(const flexdiag_kvp *k, int32_t t) { return t >= ccst(k)->t0; }

/* One query head's row at step t: normalise over the decode keys 0..t and add. */
static void record_row(const flexdiag__kvp_scores *sc, int32_t q, int32_t t, int32_t t0,
                       double *lag, double *s1, double *s2) {
    double den = 0;
    for (int32_t j = 0; j <= t; j++) den += flexdiag__kvp_prob(sc, q, j);
    if (!(den > 0)) return; /* nothing on the decode keys: export normalises P by its total */
    for (int32_t j = 0; j <= t; j++) {
        double p = flexdiag__kvp_prob(sc, q, j) / den;
        lag[t - j] += p;
        if (j < t0) s1[j] += p, s2[j] += p * p;
    }
}

static void calib_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                         const flexdiag__kvp_scores *sc) {
    calib_state *s = cst(k);
    size_t li = flexdiag__kvp_li(k, seq, layer), L = (size_t)k->p.l_dec, t0 = (size_t)s->t0;
    for (int32_t q = 0; q < k->p.h_q; q++) {
        size_t r = li * (size_t)k->p.h_q + (size_t)q;
        record_row(sc, q, t, s->t0, s->lag + r * L, s->s1 + r * t0, s->s2 + r * t0);
    }
    s->steps[li]++;
}

static int32_t calib_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h,
                         int32_t t, int32_t slot) {
    (void)k, (void)layer, (void)seq, (void)h;
    return slot <= t ? slot : -1;
}

const flexdiag_kvp_class flexdiag__kvp_calibrate = {
    .name = "calibrate",
    .traits = {"-", "-", "n/a", "none", "full", "profile sums of the calibration run", 1,
               FLEXDIAG_KVP_DEV_NONE, 0, 0, 1},
    .ring_rows = calib_rows,
    .max_slots = calib_rows,
    .resident_rows = calib_resident,
    .write_slot = calib_write,
    .state_size = sizeof(calib_state),
    .layout = calib_layout,
    .init = calib_init,
    .plan = calib_plan,
    .needs_scores = calib_needs,
    .update = calib_update,
    .slot_pos = calib_pos,
};

/* ---- export ---- */

/* Sum over the sequence slots of (layer, q)'s arrays, then P and V of the table. */
static void export_head(const flexdiag_kvp *k, int32_t layer, int32_t q, double n, double *acc,
                        flexdiag_kvp_calib *tab) {
    const calib_state *s = ccst(k);
    size_t L = (size_t)k->p.l_dec, t0 = (size_t)s->t0;
    double *lag = acc, *s1 = acc + L, *s2 = s1 + t0, tot = 0, var = 0;
    memset(acc, 0, (L + 2 * t0) * sizeof(double));
    for (int32_t seq = 0; seq < k->p.n_seq; seq++) {
        size_t r = flexdiag__kvp_li(k, seq, layer) * (size_t)k->p.h_q + (size_t)q;
        for (size_t l = 0; l < L; l++) lag[l] += s->lag[r * L + l];
        for (size_t j = 0; j < t0; j++) s1[j] += s->s1[r * t0 + j], s2[j] += s->s2[r * t0 + j];
    }
    for (size_t l = 0; l < L; l++) tot += lag[l];
    float *P = tab->P + ((size_t)layer * (size_t)k->p.h_q + (size_t)q) * L;
    for (size_t l = 0; l < L; l++) P[l] = tot > 0 ? (float)(lag[l] / tot) : 0.0f;
    for (size_t j = 0; j < t0; j++) {
        double m = s1[j] / n, v = s2[j] / n - m * m;
        var += v > 0 ? v : 0;
    }
    tab->V[(size_t)layer * (size_t)k->p.h_q + (size_t)q] = var / (double)t0;
}

flexdiag_status flexdiag__kvp_calib_export(const flexdiag_kvp *k, flexdiag_kvp_calib **out) {
    *out = NULL;
    if (k->cls != &flexdiag__kvp_calibrate)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "calibration export: the context runs "
                             "policy %s, not the calibration collector", k->cls->name);
    const calib_state *s = ccst(k);
    uint64_t n = 0; /* recorded pairs: every layer records each (step, sequence) once */
    for (int32_t seq = 0; seq < k->p.n_seq; seq++) n += s->steps[flexdiag__kvp_li(k, seq, 0)];
    if (n == 0 || s->t0 < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "calibration export: no step was recorded "
                             "(decode length %d: steps %d .. %d)", (int)k->p.l_dec, (int)s->t0,
                             (int)k->p.l_dec - 2);
    flexdiag_kvp_calib *tab;
    FLEXDIAG_TRY(flexdiag__kvp_calib_alloc(k->p.n_layers, k->p.h_q, k->p.h_kv, k->p.l_dec, &tab));
    double *acc = malloc(((size_t)k->p.l_dec + 2 * (size_t)s->t0) * sizeof(double));
    if (!acc) {
        flexdiag__kvp_calib_free(tab);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "calibration export: no host memory");
    }
    for (int32_t l = 0; l < k->p.n_layers; l++)
        for (int32_t q = 0; q < k->p.h_q; q++) export_head(k, l, q, (double)n, acc, tab);
    free(acc);
    tab->w_s = k->p.w_s, tab->t0 = s->t0, tab->t_end = k->p.l_dec - 1, tab->pairs = n;
    *out = tab;
    return FLEXDIAG_OK;
}
