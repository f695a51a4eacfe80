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

void flexdiag__kvp_plan_alisa(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                              int32_t *ws, int32_t *slots, int32_t *ns) {
    size_t li = flexdiag__kvp_li(k, seq, layer), na = (size_t)k->p.n_att, w = (size_t)k->w;
    int32_t n = flexdiag__alisa_plan_list(k->rec_pos + li * w * na, k->rec_p + li * w * na,
                                          k->rec_n + li * w, k->p.n_att, t,
                                          k->score + li * (size_t)k->p.l_dec,
                                          k->keys + li * (size_t)k->p.l_dec, slots);
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        ws[h] = t;
        ns[h] = n;
        if (h > 0) memcpy(slots + (size_t)h * (size_t)k->max_slots, slots, (size_t)n * 4);
    }
}

void flexdiag__kvp_update_alisa(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                                const flexdiag__kvp_scores *sc) {
    size_t li = flexdiag__kvp_li(k, seq, layer), na = (size_t)k->p.n_att;
    size_t r = li * (size_t)k->w + (size_t)(t % k->w);
    float *rv = k->rec_p + r * na;
    for (int32_t i = 0; i < k->rec_n[r]; i++) { /* sum over all h_q heads */
        float s = 0.0f;
        for (int32_t hq = 0; hq < k->p.h_q; hq++) s += flexdiag__kvp_prob(sc, hq, i);
        rv[i] = s;
    }
}
