/*
 * policy_alisa.c - ALISA, fixed-budget adaptation (docs/policies.md §3.6), per (sequence, layer).
 *
 * All decode KV stays resident (ring slot = position). Each step attends the k_l = ceil(N_att/2)
 * most recent tokens plus the top k_g = N_att - k_l older tokens by the windowed score
 * S_t(p) = sum over the last W = k_l steps tau of r_tau(p), where r_tau(p) is the probability
 * of p summed over all h_q heads at step tau (0 when p was not attended then). S is recomputed
 * from a ring of the last W records in ascending tau every step (W·N_att fp32 adds), never kept
 * as a running add/subtract sum, so CPU and GPU agree bit for bit on the same records.
 *
 * plan(t) selects (top-k_g by S descending, position descending on ties, via one heapsort of
 * 64-bit keys in preallocated scratch: no allocation), stores the attended positions as record
 * r_t with zero probabilities, and update(t) fills the probabilities. When update() is skipped
 * (needs_scores false: no later step within the window selects) the zeros are never read.
 */
#include <math.h>
#include <string.h>

#include "base/core.h"
#include "policy/kvp_internal.h"

uint32_t flexdiag__alisa_key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

static void sift_down(uint64_t *a, int32_t root, int32_t n) {
    for (;;) {
        int32_t c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (a[root] >= a[c]) return;
        uint64_t tmp = a[root];
        a[root] = a[c];
        a[c] = tmp;
        root = c;
    }
}

/* In-place ascending heapsort (no allocation, unlike qsort). */
static void sort_u64(uint64_t *a, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(a, i, n);
    for (int32_t end = n - 1; end > 0; end--) {
        uint64_t tmp = a[0];
        a[0] = a[end];
        a[end] = tmp;
        sift_down(a, 0, end);
    }
}

/* S_t over candidates 0..ncand-1 from the list's records tau = t-w .. t-1 (ascending tau). */
static void alisa_scores(const int32_t *rec_pos, const float *rec_p, const int32_t *rec_n,
                         int32_t w, int32_t na, int32_t t, int32_t ncand, float *s) {
    for (int32_t p = 0; p < ncand; p++) s[p] = 0.0f;
    for (int32_t tau = t - w < 0 ? 0 : t - w; tau < t; tau++) {
        int32_t r = tau % w;
        const int32_t *rp = rec_pos + (size_t)r * (size_t)na;
        const float *rv = rec_p + (size_t)r * (size_t)na;
        for (int32_t i = 0; i < rec_n[r]; i++)
            if (rp[i] < ncand) s[rp[i]] += rv[i];
    }
}

/* Global tokens: top k_g of 0..ncand-1 by (S desc, position desc), written ascending. */
static int32_t alisa_global(const int32_t *rec_pos, const float *rec_p, const int32_t *rec_n,
                            int32_t na, int32_t t, int32_t ncand, float *s, uint64_t *keys,
                            int32_t *sel) {
    int32_t k_l = na - na / 2, k_g = na - k_l;
    if (k_g == 0) return 0; /* n_att = 1: recent lag 0 only */
    if (ncand <= k_g) { /* fewer candidates than the budget: take all */
        for (int32_t p = 0; p < ncand; p++) sel[p] = p;
        return ncand;
    }
    alisa_scores(rec_pos, rec_p, rec_n, k_l, na, t, ncand, s);
    for (int32_t p = 0; p < ncand; p++) /* complement: ascending sort = descending key */
        keys[p] = ~(((uint64_t)flexdiag__alisa_key(s[p]) << 32) | (uint32_t)p);
    sort_u64(keys, ncand);
    for (int32_t i = 0; i < k_g; i++) keys[i] = (uint32_t)~keys[i];
    sort_u64(keys, k_g);
    for (int32_t i = 0; i < k_g; i++) sel[i] = (int32_t)keys[i];
    return k_g;
}

int32_t flexdiag__alisa_plan_list(int32_t *rec_pos, float *rec_p, int32_t *rec_n, int32_t n_att,
                                  int32_t t, float *score, uint64_t *keys, int32_t *slots) {
    int32_t k_l = n_att - n_att / 2, ncand = t - k_l + 1; /* 0..t-k_l: outside the recent lags */
    int32_t n = ncand > 0 ? alisa_global(rec_pos, rec_p, rec_n, n_att, t, ncand, score, keys,
                                         slots)
                          : 0;
    for (int32_t p = ncand > 0 ? ncand : 0; p <= t; p++) slots[n++] = p;
    FLEXDIAG_DASSERT(n == (t + 1 < n_att ? t + 1 : n_att));
    size_t r = (size_t)(t % k_l); /* record r_t replaces r_{t-w} */
    memcpy(rec_pos + r * (size_t)n_att, slots, (size_t)n * 4);
    memset(rec_p + r * (size_t)n_att, 0, (size_t)n * 4);
    rec_n[r] = n;
    return n;
}

/* The family's state (k->fam): per (seq, layer) the score scratch and the ring of the last w
 * records. */
typedef struct alisa_state {
    float *score;     /* (n_seq, n_layers, l_dec) S_t, recomputed each step */
    uint64_t *keys;   /* (n_seq, n_layers, l_dec) top-k sort scratch */
    int32_t *rec_pos; /* (n_seq, n_layers, w, n_att) attended positions of step tau */
    float *rec_p;     /* (n_seq, n_layers, w, n_att) head-summed probabilities */
    int32_t *rec_n;   /* (n_seq, n_layers, w) valid entries of each record */
    int32_t w, k_g;   /* score window (= recent lags k_l) and global tokens */
} alisa_state;

static alisa_state *ast(flexdiag_kvp *k) { return (alisa_state *)(void *)k->fam; }
static const alisa_state *cast(const flexdiag_kvp *k) {
    return (const alisa_state *)(const void *)k->fam;
}

static void alisa_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    alisa_state *a = ast(k);
    uint64_t nsl = (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers, na = (uint64_t)k->p.n_att;
    a->w = (k->p.n_att + 1) / 2;
    a->k_g = k->p.n_att - a->w;
    a->score = flexdiag__kvp_take(c, nsl * (uint64_t)k->p.l_dec, sizeof(float));
    a->keys = flexdiag__kvp_take(c, nsl * (uint64_t)k->p.l_dec, sizeof(uint64_t));
    a->rec_pos = flexdiag__kvp_take(c, nsl * (uint64_t)a->w * na, sizeof(int32_t));
    a->rec_p = flexdiag__kvp_take(c, nsl * (uint64_t)a->w * na, sizeof(float));
    a->rec_n = flexdiag__kvp_take(c, nsl * (uint64_t)a->w, sizeof(int32_t));
}

static void alisa_reset_seq(flexdiag_kvp *k, int32_t seq) {
    alisa_state *a = ast(k);
    size_t l0 = flexdiag__kvp_li(k, seq, 0);
    memset(a->rec_n + l0 * (size_t)a->w, 0, (size_t)k->p.n_layers * (size_t)a->w * 4);
}

static void alisa_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                       int32_t *slots, int32_t *ns) {
    alisa_state *a = ast(k);
    size_t li = flexdiag__kvp_li(k, seq, layer), na = (size_t)k->p.n_att, w = (size_t)a->w;
    int32_t n = flexdiag__alisa_plan_list(a->rec_pos + li * w * na, a->rec_p + li * w * na,
                                          a->rec_n + li * w, k->p.n_att, t,
                                          a->score + li * (size_t)k->p.l_dec,
                                          a->keys + li * (size_t)k->p.l_dec, slots);
    flexdiag__kvp_fill_heads(k, t, n, ws, slots, ns);
}

static int alisa_needs(const flexdiag_kvp *k, int32_t t) {
    return cast(k)->k_g > 0 && t + cast(k)->w >= k->p.n_att;
}

void flexdiag__alisa_list_update(float *rec_p, const int32_t *rec_n, const flexdiag__kvp_scores *sc,
                                 int32_t h_q, int32_t n_att, int32_t t) {
    int32_t w = n_att - n_att / 2, r = t % w;
    float *rv = rec_p + (size_t)r * (size_t)n_att;
    for (int32_t i = 0; i < rec_n[r]; i++) { /* sum over all h_q heads */
        float s = 0.0f;
        for (int32_t q = 0; q < h_q; q++) s += flexdiag__kvp_prob(sc, q, i);
        rv[i] = s;
    }
}

static void alisa_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                         const flexdiag__kvp_scores *sc) {
    alisa_state *a = ast(k);
    size_t li = flexdiag__kvp_li(k, seq, layer), w = (size_t)a->w, na = (size_t)k->p.n_att;
    flexdiag__alisa_list_update(a->rec_p + li * w * na, a->rec_n + li * w, sc, k->p.h_q,
                                k->p.n_att, t);
}

static int32_t alisa_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                         int32_t slot) {
    (void)k, (void)layer, (void)seq, (void)h;
    return t >= slot ? slot : -1; /* slot = position */
}

static int32_t alisa_rows(const flexdiag_kvp_params *p) { return p->l_dec; }
static int32_t alisa_max_slots(const flexdiag_kvp_params *p) { return p->n_att; }

static int64_t alisa_resident(const flexdiag_kvp_params *p, int32_t t) {
    (void)p;
    return (int64_t)t + 1;
}

static int32_t alisa_write(const flexdiag_kvp_params *p, int32_t t) {
    (void)p;
    return t;
}

const flexdiag_kvp_class flexdiag__kvp_alisa = {
    .name = "alisa",
    .traits = {"windowed p", "layer", "sum", "selection only", "full",
               "S update + top-k_g over <= t", 1, FLEXDIAG_KVP_DEV_RECORDS, 0, 0, 0},
    .ring_rows = alisa_rows,
    .max_slots = alisa_max_slots,
    .resident_rows = alisa_resident,
    .write_slot = alisa_write,
    .state_size = sizeof(alisa_state),
    .layout = alisa_layout,
    .reset_seq = alisa_reset_seq,
    .plan = alisa_plan,
    .needs_scores = alisa_needs,
    .update = alisa_update,
    .slot_pos = alisa_pos,
};
