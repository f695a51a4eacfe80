/*
 * policy_diagonal.c - the Diagonal policy (paper Algorithm 1 as docs/policies.md §2.3 restates it)
 * and Diagonal+sink4 (§2.8), per (sequence, layer, KV head).
 *
 * State is the attended-lag list lag[0..A-1] (int16) and its fill cnt; the skip set is implicit
 * (the lags 0..min(t, N_r-1) missing from the list). Token t lives in ring slot t mod N_r, so the
 * write of token t overwrites token t - N_r, the token Algorithm 1 evicts. Per step:
 *   plan(t)   append lag t to the list while t <= A-1 (the end-of-step append of step t-1, done
 *             here so that update() is needed only in build-up steps), then attend slot
 *             (t - lag[j]) mod N_r for every list entry;
 *   update(t) only in build-up steps A-1 <= t <= N_r-2: j* = argmin (score, -lag) over the list,
 *             score = max over the group's query heads of the fp32 logit; lag[j*] = t + 1.
 * The absolute-index transcription (skip positions shifted +1 per step) was rejected as the
 * state: it needs a scan of the window per step; the lag list gives exactly A gathers.
 * Diagonal+sink4 runs the same machine on the inner step t - 4 with A - 4 entries behind 4 sink
 * slots that are always attended and never lag candidates.
 * Slot lists carry list entry j at column base + cnt-1-j: while the list is [0, 1, .., cnt-1]
 * (no skip yet) the slots come out oldest first, the order Dense uses, so with N_att >= L_dec
 * the attention sums in the same order and Diagonal's output equals Dense's bit for bit.
 */
#include <string.h>

#include "base/core.h"
#include "policy/kvp_internal.h"

/* The family's state (k->fam): the lag lists and their fill, per (seq, layer, KV head). */
typedef struct diag_state {
    int16_t *lag;  /* (n_seq, n_layers, h_kv, a) attended-lag list */
    int16_t *cnt;  /* (n_seq, n_layers, h_kv) valid list entries */
    int32_t a;     /* list length A (sink4: A - 4) */
    int32_t base;  /* sink rows in front of the ring (0 or 4) */
} diag_state;

static diag_state *dst(flexdiag_kvp *k) { return (diag_state *)(void *)k->fam; }
static const diag_state *cdst(const flexdiag_kvp *k) {
    return (const diag_state *)(const void *)k->fam;
}

static void diag_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    diag_state *d = dst(k);
    uint64_t nh = (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers * (uint64_t)k->p.h_kv;
    d->base = k->cls->traits.sinks;
    d->a = k->max_slots - d->base;
    d->lag = flexdiag__kvp_take(c, nh * (uint64_t)d->a, sizeof(int16_t));
    d->cnt = flexdiag__kvp_take(c, nh, sizeof(int16_t));
}

static void diag_reset_seq(flexdiag_kvp *k, int32_t seq) {
    diag_state *d = dst(k);
    size_t h0 = flexdiag__kvp_hi(k, seq, 0, 0), hn = (size_t)k->p.n_layers * (size_t)k->p.h_kv;
    memset(d->lag + h0 * (size_t)d->a, 0, hn * (size_t)d->a * sizeof(int16_t));
    memset(d->cnt + h0, 0, hn * sizeof(int16_t));
}

const int16_t *flexdiag__kvp_diag_lag(const flexdiag_kvp *k, int32_t seq, int32_t layer,
                                      int32_t h, int32_t *cnt) {
    const diag_state *d = cdst(k);
    size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
    *cnt = d->cnt[hi];
    return d->lag + hi * (size_t)d->a;
}

/* The slots of inner step ti >= 0 of a list of cnt entries whose first `now` are lag[] and the
 * rest phase 1's appends still to come (entry j is lag j): the base sinks, then entry j at
 * column base + cnt-1-j (see top), ring slot base + (ti - lag) mod m. Returns base + cnt. */
static int32_t diag_fill(const int16_t *lag, int32_t now, int32_t cnt, int32_t ti, int32_t base,
                         int32_t m, int32_t *s) {
    for (int32_t j = 0; j < base; j++) s[j] = j;
    for (int32_t j = 0; j < cnt; j++) {
        int32_t l = j < now ? lag[j] : j;
        FLEXDIAG_DASSERT(l >= 0 && l <= ti && l <= m - 1);
        s[base + cnt - 1 - j] = base + (ti - l) % m;
    }
    return base + cnt;
}

/* Sink4's steps t <= 3: sink t is written, decode tokens 0..t attended. */
static int32_t diag_sinks(int32_t t, int32_t *s) {
    for (int32_t j = 0; j <= t; j++) s[j] = j;
    return t + 1;
}

int32_t flexdiag__diag_list_plan(int16_t *lag, int16_t *cnt, int32_t a, int32_t base,
                                 int32_t m, int32_t t, int32_t *s) {
    int32_t ti = t - base;
    if (ti < 0) return diag_sinks(t, s);
    if (ti == 0) {
        lag[0] = 0;
        *cnt = 1;
    } else if (ti <= a - 1) {
        lag[(*cnt)++] = (int16_t)ti; /* phase 1: the newly available lag joins the list */
    }
    FLEXDIAG_DASSERT(*cnt == (ti + 1 < a ? ti + 1 : a));
    return diag_fill(lag, *cnt, *cnt, ti, base, m, s);
}

/* Group score of ring column c: max over the g query-head rows of z (fp32 logits). */
static float diag_score(const float *z, int64_t z_stride, int32_t g, int32_t c) {
    float best = z[c];
    for (int32_t q = 1; q < g; q++)
        if (z[q * z_stride + c] > best) best = z[q * z_stride + c];
    return best;
}

int32_t flexdiag__diag_list_pick(const int16_t *lag, int32_t n, int32_t ns, const float *z,
                                 int64_t z_stride, int32_t g) {
    int32_t best = 0;
    float best_s = diag_score(z, z_stride, g, ns - 1);
    for (int32_t e = 1; e < n; e++) { /* lexicographic min of (score, -lag) */
        float sc = diag_score(z, z_stride, g, ns - 1 - e);
        if (sc < best_s || (sc == best_s && lag[e] > lag[best])) {
            best = e;
            best_s = sc;
        }
    }
    return best;
}

static void diag_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                      int32_t *slots, int32_t *ns) {
    diag_state *d = dst(k);
    int32_t base = d->base, ti = t - base;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        ns[h] = flexdiag__diag_list_plan(d->lag + hi * (size_t)d->a, d->cnt + hi, d->a, base,
                                         k->ring - base, t,
                                         slots + (size_t)h * (size_t)k->max_slots);
        ws[h] = flexdiag__kvp_write_slot(&k->p, t);
    }
    if (ti >= k->ring - base) k->evictions[flexdiag__kvp_li(k, seq, layer)] += (uint64_t)k->p.h_kv;
}

/* Plan ahead: the list of step t from the list now, with the lags the steps between append
 * (phase 1: inner step j appends lag j); no argmin can fall between (window_ok). */
static void diag_ahead(const flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                       int32_t *slots, int32_t *ns) {
    const diag_state *d = cdst(k);
    int32_t base = d->base, ti = t - base, cnt = ti + 1 < d->a ? ti + 1 : d->a;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        int32_t *s = slots + (size_t)h * (size_t)k->max_slots;
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        ns[h] = ti < 0 ? diag_sinks(t, s)
                       : diag_fill(d->lag + hi * (size_t)d->a, d->cnt[hi], cnt, ti, base,
                                   k->ring - base, s);
        ws[h] = flexdiag__kvp_write_slot(&k->p, t);
    }
}

static int diag_needs(const flexdiag_kvp *k, int32_t t) {
    int32_t ti = t - cdst(k)->base;
    return ti >= cdst(k)->a - 1 && ti >= 0 && ti <= k->p.n_r - 2;
}

/* The build-up step's pick per KV head: its entry is skipped from step t+1 on. */
static void diag_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                        const flexdiag__kvp_scores *sc) {
    diag_state *d = dst(k);
    int32_t a = d->a, ns = d->base + a;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        int16_t *lag = d->lag + hi * (size_t)a;
        FLEXDIAG_DASSERT(d->cnt[hi] == a);
        const float *z = sc->logits + (size_t)h * (size_t)k->g * (size_t)k->max_slots;
        lag[flexdiag__diag_list_pick(lag, a, ns, z, k->max_slots, k->g)] =
            (int16_t)(t - d->base + 1);
    }
}

static int32_t diag_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                        int32_t slot) {
    (void)layer, (void)seq, (void)h;
    int32_t base = cdst(k)->base;
    if (slot < base) return t >= slot ? slot : -1;
    int32_t p = flexdiag__kvp_ring_pos(t - base, k->ring - base, slot - base);
    return p < 0 ? -1 : p + base;
}

/* ---- geometry: ring N_r (sink4: 4 + N_r), lists of min(N_att, N_r) ---- */

static int32_t diag_max_slots(const flexdiag_kvp_params *p) {
    return p->n_att < p->n_r ? p->n_att : p->n_r;
}

/* The ring behind the sinks: N_r rows plus the window passes' slack. */
static int32_t diag_mod(const flexdiag_kvp_params *p) { return p->n_r + p->slack; }

static int32_t diag_rows(const flexdiag_kvp_params *p) { return diag_mod(p); }

static int64_t diag_resident(const flexdiag_kvp_params *p, int32_t t) {
    return (int64_t)t + 1 < diag_mod(p) ? (int64_t)t + 1 : diag_mod(p);
}

static int32_t diag_write(const flexdiag_kvp_params *p, int32_t t) { return t % diag_mod(p); }

static int32_t sink4_rows(const flexdiag_kvp_params *p) { return 4 + diag_mod(p); }

static int64_t sink4_resident(const flexdiag_kvp_params *p, int32_t t) {
    int64_t n = (int64_t)t + 1;
    return n <= 4 ? n : 4 + (n - 4 < diag_mod(p) ? n - 4 : diag_mod(p));
}

static int32_t sink4_write(const flexdiag_kvp_params *p, int32_t t) {
    return t < 4 ? t : 4 + (t - 4) % diag_mod(p);
}

const flexdiag_kvp_class flexdiag__kvp_diagonal = {
    .name = "diagonal",
    .traits = {"logits", "KV head", "max", "permanent", "N_r",
               "argmin over A, build-up steps only", 0, FLEXDIAG_KVP_DEV_LAGS, 0, 1, 1},
    .ring_rows = diag_rows,
    .max_slots = diag_max_slots,
    .resident_rows = diag_resident,
    .write_slot = diag_write,
    .state_size = sizeof(diag_state),
    .layout = diag_layout,
    .reset_seq = diag_reset_seq,
    .plan = diag_plan,
    .plan_ahead = diag_ahead,
    .needs_scores = diag_needs,
    .update = diag_update,
    .slot_pos = diag_pos,
};

const flexdiag_kvp_class flexdiag__kvp_diagonal_sink4 = {
    .name = "diagonal-sink4",
    .traits = {"logits", "KV head", "max", "permanent", "4+N_r",
               "argmin over A-4, build-up steps only", 0, FLEXDIAG_KVP_DEV_LAGS, 4, 1, 1},
    .ring_rows = sink4_rows,
    .max_slots = diag_max_slots,
    .resident_rows = sink4_resident,
    .write_slot = sink4_write,
    .state_size = sizeof(diag_state),
    .layout = diag_layout,
    .reset_seq = diag_reset_seq,
    .plan = diag_plan,
    .plan_ahead = diag_ahead,
    .needs_scores = diag_needs,
    .update = diag_update,
    .slot_pos = diag_pos,
};
