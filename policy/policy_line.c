/*
 * policy_line.c - LineAR (`line-ar`, docs/policies.md §8): the image is decoded line by line
 * (a line = W_s decode tokens, the grid's row stride, Lumina's row end included) under a
 * budget of R = N_att resident decode tokens per (sequence, layer, KV head). The first A = 4
 * decode tokens (anchors) and the L_r = 1 most recent complete lines are always kept; at the
 * end of a line that would leave no room for the next one, the tokens between them (the
 * middle) are ranked by the attention the line just finished paid them, and only the top
 * M = R - A - (L_r + 1)·W_s stay. The others are freed at once (the eviction) and the next
 * line is written into the freed slots.
 *
 * State per list: pos[R] (decode position of each slot, -1 = free) and acc[R] (the group sum of
 * full-row probabilities, kv_policy.h §0.5's H2O sum, accumulated over the current line only:
 * zeroed at a line's first step). plan(t) writes token t into the lowest free slot and attends
 * every occupied slot in ascending slot order; update(t) runs on every step of the lines that
 * select (needs_scores) and selects at their last step. Ties keep the newer position.
 */
#include <string.h>

#include "base/core.h"
#include "policy/kvp_internal.h"

#define LINE_ANCHORS 4 /* decode tokens 0..3, never candidates */
#define LINE_RECENT 1  /* complete lines kept before the selection's line end */

typedef struct line_state {
    int32_t *pos; /* (n_seq, n_layers, h_kv, R) decode position of each slot, -1 = free */
    float *acc;   /* (n_seq, n_layers, h_kv, R) this line's group-summed probability */
    int32_t *cand; /* (n_seq, n_layers, R) selection scratch: calls on one (layer, sequence)
                      never overlap (kv_policy.h threading) */
} line_state;

static line_state *lst(flexdiag_kvp *k) { return (line_state *)(void *)k->fam; }

/* Middle capacity M (may be negative for a budget that cannot hold the lines). */
static int32_t line_middle(const flexdiag_kvp_params *p) {
    return p->n_att - LINE_ANCHORS - (LINE_RECENT + 1) * p->w_s;
}

static int32_t line_rows(const flexdiag_kvp_params *p) { return p->n_att; }

static int64_t line_resident(const flexdiag_kvp_params *p, int32_t t) {
    return (int64_t)t + 1 < p->n_att ? (int64_t)t + 1 : p->n_att;
}

/* Token t goes to slot t until the first selection (the end of line i0 = floor(R / W_s) - 1);
 * afterwards to each list's own lowest free slot (-1). */
static int32_t line_write(const flexdiag_kvp_params *p, int32_t t) {
    return p->w_s > 0 && t < p->n_att / p->w_s * p->w_s ? t : -1;
}

static void line_layout(flexdiag_kvp *k, flexdiag__kvp_carve *c) {
    line_state *s = lst(k);
    uint64_t lists = (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers * (uint64_t)k->p.h_kv;
    uint64_t r = (uint64_t)k->p.n_att;
    s->pos = flexdiag__kvp_take(c, lists * r, sizeof(int32_t));
    s->acc = flexdiag__kvp_take(c, lists * r, sizeof(float));
    s->cand = flexdiag__kvp_take(c, (uint64_t)k->p.n_seq * (uint64_t)k->p.n_layers * r,
                                 sizeof(int32_t));
}

static void line_reset_seq(flexdiag_kvp *k, int32_t seq) {
    line_state *s = lst(k);
    size_t r = (size_t)k->p.n_att, h0 = flexdiag__kvp_hi(k, seq, 0, 0);
    size_t hn = (size_t)k->p.n_layers * (size_t)k->p.h_kv;
    for (size_t i = h0 * r; i < (h0 + hn) * r; i++) s->pos[i] = -1;
    memset(s->acc + h0 * r, 0, hn * r * sizeof(float));
}

/* Occupied slots of one list in ascending slot order into sl; returns their count. */
static int32_t line_occupied(const int32_t *pos, int32_t r, int32_t *sl) {
    int32_t n = 0;
    for (int32_t j = 0; j < r; j++)
        if (pos[j] >= 0) sl[n++] = j;
    return n;
}

static void line_plan(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq, int32_t *ws,
                      int32_t *slots, int32_t *ns) {
    line_state *s = lst(k);
    int32_t r = k->p.n_att;
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        int32_t *pos = s->pos + hi * (size_t)r, f = 0;
        while (f < r && pos[f] >= 0) f++;
        FLEXDIAG_ASSERT(f < r); /* each selection leaves a whole line free */
        pos[f] = t;
        s->acc[hi * (size_t)r + (size_t)f] = 0.0f;
        ws[h] = f;
        ns[h] = line_occupied(pos, r, slots + (size_t)h * (size_t)k->max_slots);
    }
}

/* Lines 0 .. i0-1 fill the ring; line i0 = floor(R / W_s) - 1 is the first whose end
 * selects, the last line (n_ln - 1) never does: scores of every step of lines i0 .. n_ln-2. */
static int line_needs(const flexdiag_kvp *k, int32_t t) {
    int32_t w = k->p.w_s, i0 = k->p.n_att / w - 1, n_ln = k->p.l_dec / w;
    return t >= i0 * w && t < (n_ln - 1) * w;
}

/* Keep the m middle candidates with the largest acc (ties: the newer position), free the rest;
 * returns how many were freed. cand (n entries) is overwritten. */
static int32_t line_select(int32_t *pos, const float *acc, int32_t *cand, int32_t n, int32_t m) {
    for (int32_t i = 1; i < n; i++) { /* insertion sort: best first */
        int32_t c = cand[i], j = i;
        for (; j > 0; j--) {
            int32_t b = cand[j - 1];
            if (acc[c] > acc[b] || (acc[c] == acc[b] && pos[c] > pos[b])) cand[j] = b;
            else break;
        }
        cand[j] = c;
    }
    for (int32_t i = m; i < n; i++) pos[cand[i]] = -1;
    return n > m ? n - m : 0;
}

static void line_update(flexdiag_kvp *k, int32_t layer, int32_t t, int32_t seq,
                        const flexdiag__kvp_scores *sc) {
    line_state *s = lst(k);
    int32_t r = k->p.n_att, w = k->p.w_s, g = k->g, col = t % w, line = t / w;
    int32_t cut = (line + 1 - LINE_RECENT) * w; /* candidates: A <= pos < cut */
    for (int32_t h = 0; h < k->p.h_kv; h++) {
        size_t hi = flexdiag__kvp_hi(k, seq, layer, h);
        int32_t *pos = s->pos + hi * (size_t)r, n = 0, occ = 0;
        float *acc = s->acc + hi * (size_t)r;
        if (col == 0) memset(acc, 0, (size_t)r * sizeof(float)); /* a new line's score */
        for (int32_t j = 0; j < r; j++) { /* column occ of the plan is the occ-th occupied slot */
            if (pos[j] < 0) continue;
            float gs = 0.0f;
            for (int32_t q = 0; q < g; q++) gs += flexdiag__kvp_prob(sc, h * g + q, occ);
            acc[j] += gs;
            occ++;
        }
        if (col != w - 1 || occ <= r - w) continue; /* not a line end, or the next line fits */
        int32_t *cand = s->cand + flexdiag__kvp_li(k, seq, layer) * (size_t)r;
        for (int32_t j = 0; j < r; j++)
            if (pos[j] >= LINE_ANCHORS && pos[j] < cut) cand[n++] = j;
        uint64_t freed = (uint64_t)line_select(pos, acc, cand, n, line_middle(&k->p));
        k->evictions[flexdiag__kvp_li(k, seq, layer)] += freed;
    }
}

static int32_t line_pos(const flexdiag_kvp *k, int32_t layer, int32_t seq, int32_t h, int32_t t,
                        int32_t slot) {
    (void)t;
    const line_state *s = (const line_state *)(const void *)k->fam;
    return s->pos[flexdiag__kvp_hi(k, seq, layer, h) * (size_t)k->p.n_att + (size_t)slot];
}

/* A grid (W_s > 0, whole lines) and room for the anchors, the recent lines and a new line. */
static flexdiag_status line_check(const flexdiag_kvp_params *p) {
    if (p->w_s < 1 || p->l_dec % p->w_s != 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy line-ar needs an image grid: "
                             "decode length %d is not a whole number of lines of %d tokens "
                             "(text models have no grid; use another policy)",
                             (int)p->l_dec, (int)p->w_s);
    if (line_middle(p) < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_params.policy.n_att %d is too "
                             "small for line-ar on lines of %d tokens: it keeps %d anchors, "
                             "%d recent line(s) and room for a new line; use n_att >= %d (or "
                             "a lower context_params.policy.sparsity)",
                             (int)p->n_att, (int)p->w_s, LINE_ANCHORS, LINE_RECENT,
                             LINE_ANCHORS + (LINE_RECENT + 1) * (int)p->w_s);
    return FLEXDIAG_OK;
}

const flexdiag_kvp_class flexdiag__kvp_line_ar = {
    .name = "line-ar",
    .traits = {"line p", "KV head", "sum", "permanent", "N_att",
               "acc update; top-M over the middle at line ends", 1, FLEXDIAG_KVP_DEV_NONE, 0, 0,
               1},
    .ring_rows = line_rows,
    .max_slots = line_rows,
    .resident_rows = line_resident,
    .write_slot = line_write,
    .state_size = sizeof(line_state),
    .check = line_check,
    .layout = line_layout,
    .reset_seq = line_reset_seq,
    .plan = line_plan,
    .needs_scores = line_needs,
    .update = line_update,
    .slot_pos = line_pos,
};
