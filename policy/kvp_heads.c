/*
 * kvp_heads.c - the per-(layer, KV head) plan SSD and HACK derive from a calibration table for
 * one budget (docs/policies.md §9.3, §10.2, §10.3; kvp_calib.h flexdiag__kvp_heads_make states
 * the rules). Every statistic is reduced from query heads to KV heads as the mean over the
 * group, summed in double in ascending order (lags, then query heads), so a reference that
 * sums the same way gets the same types. The plan is one allocation, read-only once made.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "policy/kvp_calib.h"

#define F_NATT "context_params.policy.n_att"
#define HACK_KAPPA_NUM 1 /* kappa = B_C / B_S = 1/4 */
#define HACK_KAPPA_DEN 4
#define V_FLOOR 1e-300 /* log V of a zero variance */

/* Mean over the g query heads of KV head h of sum_{l < w} P(l) (w = 1: P(0) alone, etc.). */
static double group_mass(const flexdiag_kvp_calib *t, int32_t layer, int32_t h, int32_t w) {
    int32_t g = t->h_q / t->h_kv;
    double sum = 0;
    for (int32_t q = h * g; q < (h + 1) * g; q++) {
        const float *P = t->P + ((size_t)layer * (size_t)t->h_q + (size_t)q) * (size_t)t->l_dec;
        double m = 0;
        for (int32_t l = 0; l < w; l++) m += P[l];
        sum += m;
    }
    return sum / g;
}

/* Mean over the group of P at lag l. */
static double group_p(const flexdiag_kvp_calib *t, int32_t layer, int32_t h, int32_t l) {
    int32_t g = t->h_q / t->h_kv;
    double sum = 0;
    for (int32_t q = h * g; q < (h + 1) * g; q++)
        sum += t->P[((size_t)layer * (size_t)t->h_q + (size_t)q) * (size_t)t->l_dec + (size_t)l];
    return sum / g;
}

/* log of the mean over the group of V (floored so a zero variance sorts first). */
static double group_log_v(const flexdiag_kvp_calib *t, int32_t layer, int32_t h) {
    int32_t g = t->h_q / t->h_kv;
    double sum = 0;
    for (int32_t q = h * g; q < (h + 1) * g; q++) sum += t->V[(size_t)layer * (size_t)t->h_q + q];
    double v = sum / g;
    return log(v > V_FLOOR ? v : V_FLOOR);
}

/* One allocation for n heads' types and statistics and n_lags lags each. */
static flexdiag_kvp_heads *heads_alloc(size_t n, int32_t n_lags) {
    size_t head = (sizeof(flexdiag_kvp_heads) + 7) & ~(size_t)7;
    size_t bytes = head + n * 8 + n * (size_t)n_lags * 2 + n;
    flexdiag_kvp_heads *hd = calloc(1, bytes);
    if (!hd) return NULL;
    hd->lambda = (double *)(void *)((char *)hd + head);
    hd->lags = (int16_t *)(void *)(hd->lambda + n);
    hd->type = (uint8_t *)(hd->lags + n * (size_t)n_lags);
    hd->n_lags = n_lags;
    return hd;
}

/* ---- SSD: spatial iff lambda(N_att) >= tau ---- */

static flexdiag_status ssd_make(const flexdiag_kvp_calib *t, int32_t n_att, double tau,
                                flexdiag_kvp_heads **out) {
    if (n_att < 2)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d is too small for ssd: its "
                             "semantic heads keep the 2 newest tokens; use " F_NATT " >= 2",
                             (int)n_att);
    size_t n = (size_t)t->n_layers * (size_t)t->h_kv;
    flexdiag_kvp_heads *hd = heads_alloc(n, 0);
    if (!hd) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "ssd: no host memory for the plan");
    for (int32_t l = 0; l < t->n_layers; l++)
        for (int32_t h = 0; h < t->h_kv; h++) {
            size_t i = (size_t)l * (size_t)t->h_kv + (size_t)h;
            hd->lambda[i] = group_mass(t, l, h, n_att);
            hd->type[i] = hd->lambda[i] >= tau ? FLEXDIAG_HEAD_WINDOW : FLEXDIAG_HEAD_SEMANTIC;
            hd->n_heads[hd->type[i]]++;
        }
    hd->b_c = hd->ring = hd->max_slots = n_att;
    *out = hd;
    return FLEXDIAG_OK;
}

/* ---- HACK: contextual below the natural break of log V, structural lag lists ---- */

/* Sort idx (n) by (key[idx] ascending, idx ascending), tmp (n) scratch: a bottom-up merge sort
 * (no qsort: its comparator would need the keys in a global, and contexts are made on several
 * threads). */
static void sort_by_key(int32_t *idx, int32_t *tmp, int32_t n, const double *key) {
    for (int32_t w = 1; w < n; w *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * w) {
            int32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int32_t a = idx[i], b = idx[j];
                int take_b = key[b] < key[a] || (key[b] == key[a] && b < a);
                tmp[k++] = take_b ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

/* Contextual count: heads sorted by log V (order, n), the largest gap between neighbours
 * i, i + 1 with lo <= i < hi (the 10 %-90 % quantile range; ties: the first), heads 0..i. */
static int32_t natural_break(const double *x, const int32_t *order, int32_t n) {
    if (n < 2) return 0;
    int32_t lo = (int32_t)floor(0.1 * (n - 1)), hi = (int32_t)ceil(0.9 * (n - 1)), best = lo;
    for (int32_t i = lo + 1; i < hi; i++)
        if (x[order[i + 1]] - x[order[i]] > x[order[best + 1]] - x[order[best]]) best = i;
    return best + 1;
}

/* HACK's scratch: per KV head log V and the sort order; per lag a score, candidates, flags. */
typedef struct hack_scratch {
    double *x;      /* (n) log V of each KV head */
    double *score;  /* (l_dec) -P of each lag */
    int32_t *order; /* (n) KV heads by log V */
    int32_t *tmp;   /* (max(n, l_dec)) merge scratch */
    int32_t *cand;  /* (l_dec) candidate lags */
    unsigned char *take; /* (l_dec) lags of the list being built */
} hack_scratch;

static int hack_scratch_alloc(hack_scratch *s, int32_t n, int32_t l_dec) {
    size_t nn = (size_t)n, L = (size_t)l_dec, m = nn > L ? nn : L;
    s->x = calloc(1, (nn + L) * sizeof(double) + (nn + m + L) * sizeof(int32_t) + L);
    if (!s->x) return 0;
    s->score = s->x + nn;
    s->order = (int32_t *)(void *)(s->score + L);
    s->tmp = s->order + nn;
    s->cand = s->tmp + m;
    s->take = (unsigned char *)(s->cand + L);
    return 1;
}

/* The structural list of (layer, h): lags 0..W_s+1, then the rest of (W_s+1, cap] by P desc,
 * ties to the smaller lag; written ascending into lags (n_lags); returns its largest lag. */
static int32_t pick_lags(const flexdiag_kvp_calib *t, int32_t layer, int32_t h, int32_t n_lags,
                         int32_t cap, hack_scratch *s, int16_t *lags) {
    int32_t base = t->w_s + 2, nc = 0;
    for (int32_t l = base; l <= cap; l++) {
        s->score[l] = -group_p(t, layer, h, l); /* ascending order = P descending */
        s->cand[nc++] = l;
    }
    sort_by_key(s->cand, s->tmp, nc, s->score);
    memset(s->take, 0, (size_t)cap + 1);
    for (int32_t l = 0; l < base; l++) s->take[l] = 1;
    for (int32_t i = 0; i < n_lags - base; i++) s->take[s->cand[i]] = 1;
    int32_t k = 0, top = 0;
    for (int32_t l = 0; l <= cap; l++)
        if (s->take[l]) lags[k++] = (int16_t)l, top = l;
    FLEXDIAG_DASSERT(k == n_lags);
    return top;
}

/* b_s, b_c of n heads with n_c contextual at n_att (kvp_calib.h). */
static void hack_budgets(int64_t n, int64_t n_c, int32_t n_att, int32_t l_dec, int32_t *b_s,
                         int32_t *b_c) {
    int64_t den = HACK_KAPPA_DEN * n - (HACK_KAPPA_DEN - HACK_KAPPA_NUM) * n_c;
    int64_t bs = HACK_KAPPA_DEN * n * n_att / den;
    *b_s = (int32_t)(bs < l_dec ? bs : l_dec);
    int64_t bc = n_c ? (n * n_att - (n - n_c) * *b_s) / n_c : 0;
    *b_c = n_c ? (int32_t)(bc < 2 ? 2 : bc > l_dec ? l_dec : bc) : 0;
}

static flexdiag_status hack_too_small(const flexdiag_kvp_calib *t, int32_t n_att, int32_t b_s,
                                      int64_t n, int64_t n_c) {
    int64_t need = FLEXDIAG_HACK_SINKS + t->w_s + 2;
    int64_t den = HACK_KAPPA_DEN * n - (HACK_KAPPA_DEN - HACK_KAPPA_NUM) * n_c;
    int64_t min = (need * den + HACK_KAPPA_DEN * n - 1) / (HACK_KAPPA_DEN * n);
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d is too small for hack on lines "
                         "of %d tokens: a structural head keeps %d sinks and lags 0..%d (%lld "
                         "tokens) but its budget B_S is %d (%lld of %lld KV heads contextual, "
                         "kappa 1/4); use " F_NATT " >= %lld (or a lower "
                         "context_params.policy.sparsity)", (int)n_att, (int)t->w_s,
                         FLEXDIAG_HACK_SINKS, (int)t->w_s + 1, (long long)need, (int)b_s,
                         (long long)n_c, (long long)n, (long long)min);
}

/* Types from the sorted log V; the lists of the structural heads; ring and slots. */
static void hack_fill(const flexdiag_kvp_calib *t, int32_t n_c, int32_t cap, hack_scratch *s,
                      flexdiag_kvp_heads *hd) {
    int32_t n = t->n_layers * t->h_kv, top = 0;
    for (int32_t i = 0; i < n; i++)
        hd->type[s->order[i]] = i < n_c ? FLEXDIAG_HEAD_SEMANTIC : FLEXDIAG_HEAD_LAGS;
    for (int32_t i = 0; i < n; i++) {
        hd->lambda[i] = s->x[i];
        hd->n_heads[hd->type[i]]++;
        if (hd->type[i] != FLEXDIAG_HEAD_LAGS) continue;
        int32_t m = pick_lags(t, i / t->h_kv, i % t->h_kv, hd->n_lags, cap, s,
                              hd->lags + (size_t)i * (size_t)hd->n_lags);
        top = m > top ? m : top;
    }
    hd->lag_ring = hd->n_heads[FLEXDIAG_HEAD_LAGS] ? top + 1 : 0;
    int32_t rs = hd->lag_ring ? FLEXDIAG_HACK_SINKS + hd->lag_ring : 0;
    hd->ring = rs > hd->b_c ? rs : hd->b_c;
    hd->max_slots = hd->lag_ring && hd->b_s > hd->b_c ? hd->b_s : hd->b_c;
}

static flexdiag_status hack_make(const flexdiag_kvp_calib *t, int32_t n_att,
                                 flexdiag_kvp_heads **out) {
    int32_t n = t->n_layers * t->h_kv, a = FLEXDIAG_HACK_SINKS;
    hack_scratch s = {0};
    if (!hack_scratch_alloc(&s, n, t->l_dec))
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "hack: no host memory for the plan");
    for (int32_t i = 0; i < n; i++)
        s.x[i] = group_log_v(t, i / t->h_kv, i % t->h_kv), s.order[i] = i;
    sort_by_key(s.order, s.tmp, n, s.x);
    int32_t n_c = natural_break(s.x, s.order, n), b_s, b_c;
    hack_budgets(n, n_c, n_att, t->l_dec, &b_s, &b_c);
    int32_t n_lags = n_c < n ? b_s - a : 0;
    flexdiag_status st = FLEXDIAG_OK;
    flexdiag_kvp_heads *hd = NULL;
    if (n_c < n && b_s < a + t->w_s + 2) st = hack_too_small(t, n_att, b_s, n, n_c);
    else if (!(hd = heads_alloc((size_t)n, n_lags)))
        st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "hack: no host memory for the plan");
    if (hd) {
        int32_t want = 4 * t->w_s > b_s - a - 1 ? 4 * t->w_s : b_s - a - 1;
        hd->b_s = n_lags ? b_s : 0;
        hd->b_c = b_c;
        hack_fill(t, n_c, want < t->l_dec - 1 - a ? want : t->l_dec - 1 - a, &s, hd);
    }
    free(s.x);
    *out = hd;
    return st;
}

flexdiag_status flexdiag__kvp_heads_make(const flexdiag_kvp_calib *tab, flexdiag_policy_kind kind,
                                         int32_t n_att, double tau, flexdiag_kvp_heads **out) {
    *out = NULL;
    if (n_att < 1 || n_att > tab->l_dec)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_NATT " %d must be in [1, L_dec %d]",
                             (int)n_att, (int)tab->l_dec);
    flexdiag_kvp_heads *hd = NULL;
    if (kind == FLEXDIAG_POLICY_SSD) FLEXDIAG_TRY(ssd_make(tab, n_att, tau, &hd));
    else if (kind == FLEXDIAG_POLICY_HACK) FLEXDIAG_TRY(hack_make(tab, n_att, &hd));
    else
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy %s takes no calibration table",
                             flexdiag__kvp_name(kind));
    hd->kind = kind;
    hd->n_att = n_att, hd->l_dec = tab->l_dec, hd->w_s = tab->w_s;
    hd->n_layers = tab->n_layers, hd->h_kv = tab->h_kv, hd->tau = tau;
    *out = hd;
    return FLEXDIAG_OK;
}

void flexdiag__kvp_heads_free(flexdiag_kvp_heads *h) { free(h); }
