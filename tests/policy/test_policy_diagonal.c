/*
 * test_policy_diagonal.c - the Diagonal and Diagonal+sink4 state machines (docs/policies.md §2).
 *
 * 1. The §2.7 worked example (N_r 7, N_att 4, the tie at t = 4): attended positions, lag list,
 *    resident range, evicted position and slot, skip set and D after every step.
 * 2. The lag-list machine vs a literal transcription of the paper's Algorithm 1 in absolute
 *    indices (skip positions shifted +1 per step, evict K[t - N_r], clamp A = min(N_att, N_r),
 *    argmin with ties to the older position), written separately below: >= 10,000 random
 *    configurations with forced ties, GQA groups, several sequences and layers, plus the
 *    exhaustive §5.1 grid; with the §2.4 invariants checked at every step.
 * 3. Diagonal+sink4 vs the literal reference run on the inner tokens behind 4 sinks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "policy/kvp_internal.h"
#include "policy_harness.h"
#include "util.h"

#define MAXT 80 /* longest decode length of these tests */

/* ---- literal Algorithm 1 (absolute indices), one head ---- */

typedef struct alg1 {
    int32_t skip[MAXT]; /* skip_idx: absolute positions */
    int32_t n;          /* |skip_idx| */
} alg1;

static int in_list(const int32_t *a, int32_t n, int32_t v) {
    for (int32_t i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

/* Step t of Algorithm 1 with window [max(0, t-N_r) .. t]; score[p] is the selection score of
 * position p at this step. Writes idx ascending and returns its length. */
static int32_t alg1_step(alg1 *st, int32_t t, int32_t n_r, int32_t n_att, const float *score,
                         int32_t *idx) {
    int32_t a = n_att < n_r ? n_att : n_r; /* the mandatory clamp */
    int32_t lo = t - n_r > 0 ? t - n_r : 0, evicted = -1, n = 0;
    if (t < a - 1) { /* phase 1: full attention */
        for (int32_t p = lo; p <= t; p++) idx[n++] = p;
        return n;
    }
    if (t >= n_r) evicted = t - n_r; /* phase 3: K[t - N_r] <- empty */
    for (int32_t i = 0; i < st->n; i++) st->skip[i] += 1;
    for (int32_t p = lo; p <= t; p++)
        if (p != evicted && !in_list(st->skip, st->n, p)) idx[n++] = p;
    if (t < n_r && st->n < n_r - a) { /* phase 2: select a newly skipped key */
        int32_t best = 0;
        for (int32_t j = 1; j < n; j++) /* strict <: ties keep the first (older) position */
            if (score[idx[j]] < score[idx[best]]) best = j;
        st->skip[st->n++] = idx[best];
    }
    return n;
}

/* ---- 1. the worked example of §2.7 ---- */

typedef struct ex_row {
    int32_t res_lo, res_hi;  /* resident positions */
    int32_t evicted, slot;   /* evicted position and its slot (-1: none) */
    int32_t skip[3], n_skip; /* skip in effect (absolute) */
    int32_t att[4], n_att;   /* attended positions, ascending */
    int16_t lag[4];          /* lag list of the step, list order */
    int need;                /* argmin runs (build-up step) */
} ex_row;

static const ex_row ex_table[11] = {
    {0, 0, -1, -1, {0}, 0, {0}, 1, {0}, 0},
    {0, 1, -1, -1, {0}, 0, {0, 1}, 2, {0, 1}, 0},
    {0, 2, -1, -1, {0}, 0, {0, 1, 2}, 3, {0, 1, 2}, 0},
    {0, 3, -1, -1, {0}, 0, {0, 1, 2, 3}, 4, {0, 1, 2, 3}, 1},
    {0, 4, -1, -1, {2}, 1, {0, 1, 3, 4}, 4, {0, 1, 4, 3}, 1},
    {0, 5, -1, -1, {1, 3}, 2, {0, 2, 4, 5}, 4, {0, 1, 5, 3}, 1},
    {0, 6, -1, -1, {1, 2, 4}, 3, {0, 3, 5, 6}, 4, {0, 1, 6, 3}, 0},
    {1, 7, 0, 0, {2, 3, 5}, 3, {1, 4, 6, 7}, 4, {0, 1, 6, 3}, 0},
    {2, 8, 1, 1, {3, 4, 6}, 3, {2, 5, 7, 8}, 4, {0, 1, 6, 3}, 0},
    {3, 9, 2, 2, {4, 5, 7}, 3, {3, 6, 8, 9}, 4, {0, 1, 6, 3}, 0},
    {4, 10, 3, 3, {5, 6, 8}, 3, {4, 7, 9, 10}, 4, {0, 1, 6, 3}, 0},
};

static void test_worked_example(void **state) {
    (void)state;
    static const float g[7] = {3.0f, 2.5f, 0.1f, 0.5f, 0.5f, 0.2f, 0.8f}; /* logit by lag */
    flexdiag_kvp_params p = {FLEXDIAG_POLICY_DIAGONAL, 4, 7, 11, 1, 1, 1, 1, 0, 0, NULL};
    flexdiag_kvp *k = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    int32_t ws, slots[4], ns, before[7], nb = 0;
    for (int32_t t = 0; t < 11; t++) {
        const ex_row *e = &ex_table[t];
        flexdiag__kvp_plan(k, 0, t, 0, 1, &ws, slots, &ns);
        assert_int_equal(ns, e->n_att);
        assert_int_equal(ws, t % 7);
        /* lag list of this step, attended positions from the ring */
        int32_t att[4];
        float logits[4], lse = 5.0f;
        int32_t cnt;
        const int16_t *lag = flexdiag__kvp_diag_lag(k, 0, 0, 0, &cnt);
        assert_int_equal(cnt, ns);
        for (int32_t j = 0; j < ns; j++) { /* list entry j sits at column ns-1-j */
            assert_int_equal(lag[j], e->lag[j]);
            att[j] = flexdiag__kvp_slot_pos(k, 0, 0, 0, slots[ns - 1 - j]);
            assert_int_equal(att[j], t - e->lag[j]);
            logits[ns - 1 - j] = g[t - att[j]];
        }
        for (int32_t j = 0; j < ns; j++) assert_true(in_list(att, ns, e->att[j]));
        /* resident range, evicted token, skip set in effect */
        int32_t after[7], na = 0, evicted = -1;
        for (int32_t s = 0; s < 7; s++) {
            int32_t pos = flexdiag__kvp_slot_pos(k, 0, 0, 0, s);
            if (pos >= 0) after[na++] = pos;
        }
        assert_int_equal(na, e->res_hi - e->res_lo + 1);
        for (int32_t pos = e->res_lo; pos <= e->res_hi; pos++) assert_true(in_list(after, na, pos));
        for (int32_t i = 0; i < nb; i++)
            if (!in_list(after, na, before[i])) evicted = before[i];
        assert_int_equal(evicted, e->evicted);
        if (e->slot >= 0) assert_int_equal(ws, e->slot);
        int32_t n_skip = 0;
        for (int32_t i = 0; i < na; i++)
            if (!in_list(att, ns, after[i])) {
                assert_true(in_list(e->skip, e->n_skip, after[i]));
                n_skip++;
            }
        assert_int_equal(n_skip, e->n_skip);
        assert_int_equal(flexdiag__kvp_needs_scores(k, t), e->need);
        flexdiag__kvp_update(k, 0, t, 0, 1, logits, &lse, NULL);
        memcpy(before, after, sizeof after);
        nb = na;
    }
    /* ring check at t = 10: lags {0,1,3,6} -> slots {3,2,0,4} -> positions {10,9,7,4} */
    static const int32_t slot_of[4] = {3, 2, 4, 0}; /* by list entry; entry j at column 3-j */
    for (int32_t j = 0; j < 4; j++) assert_int_equal(slots[3 - j], slot_of[j]);
    assert_int_equal(flexdiag__kvp_evictions(k), 4);
    flexdiag__kvp_destroy(k);
}

/* ---- 2, 3. random configurations vs the literal reference ---- */

typedef struct diag_cfg {
    flexdiag_kvp_params p;
    ph_logits lg;
} diag_cfg;

/* Selection score of every position at step t for KV head h: max over the group. */
static void group_scores(const diag_cfg *c, int32_t s, int32_t layer, int32_t t, int32_t h,
                         float *score) {
    int32_t g = c->p.h_q / c->p.h_kv;
    for (int32_t pos = 0; pos <= t; pos++) {
        float best = ph_logit(&c->lg, s, layer, t, h * g, pos);
        for (int32_t q = 1; q < g; q++) {
            float v = ph_logit(&c->lg, s, layer, t, h * g + q, pos);
            if (v > best) best = v;
        }
        score[pos] = best;
    }
}

/* Reference attended set of one head: Algorithm 1, behind 4 sinks for sink4. */
static int32_t ref_step(const diag_cfg *c, alg1 *st, int32_t s, int32_t layer, int32_t t,
                        int32_t h, int32_t *out) {
    float score[MAXT];
    int32_t a = c->p.n_att < c->p.n_r ? c->p.n_att : c->p.n_r;
    int32_t base = c->p.kind == FLEXDIAG_POLICY_DIAGONAL ? 0 : 4, ti = t - base;
    if (ti >= a - base - 1 && ti < c->p.n_r) /* Algorithm 1 reads scores only in phase 2 */
        group_scores(c, s, layer, t, h, score);
    if (c->p.kind == FLEXDIAG_POLICY_DIAGONAL)
        return alg1_step(st, t, c->p.n_r, c->p.n_att, score, out);
    if (t <= 3) {
        for (int32_t p = 0; p <= t; p++) out[p] = p;
        return t + 1;
    }
    int32_t idx[MAXT];
    int32_t n = alg1_step(st, t - 4, c->p.n_r, a - 4, score + 4, idx);
    for (int32_t p = 0; p < 4; p++) out[p] = p;
    for (int32_t i = 0; i < n; i++) out[4 + i] = idx[i] + 4;
    return n + 4;
}

/* §2.4 invariants of one head at step t (resident range, count, oldest lag in phase 3). */
static void check_invariants(const diag_cfg *c, const ph_state *st, int32_t layer, int32_t s,
                             int32_t h, int32_t t) {
    int32_t base = c->p.kind == FLEXDIAG_POLICY_DIAGONAL_SINK4 ? 4 : 0, n_r = c->p.n_r;
    int32_t a = c->p.n_att < n_r ? c->p.n_att : n_r, n_att, res[MAXT];
    const int32_t *att = ph_att(st, s, h, &n_att);
    assert_int_equal(n_att, t + 1 < a ? t + 1 : a);
    int32_t nres = ph_resident(st, layer, s, h, res);
    assert_true(nres <= flexdiag__kvp_ring_rows(&c->p));
    assert_int_equal(nres, flexdiag__kvp_resident_rows(&c->p, t));
    int32_t ti = t - base, lo = ti - n_r + 1 > 0 ? ti - n_r + 1 : 0;
    int32_t want = ti < 0 ? t + 1 : base + ti - lo + 1;
    assert_int_equal(nres, want);
    for (int32_t i = 0; i < nres; i++) /* resident: sinks, then inner tokens [lo, ti] */
        assert_int_equal(res[i], ti < 0 || i < base ? i : lo + base + i - base);
    for (int32_t i = 0; i < n_att; i++) /* attended tokens are resident */
        assert_true(att[i] <= t && (att[i] < base || att[i] >= lo + base));
    if (ti < 0) return;
    int32_t ai = a - base, sk = n_r - ai, d = ti - ai + 1; /* |D_t| = clamp(t-A+1, 0, S) */
    d = d < 0 ? 0 : d > sk ? sk : d;
    assert_int_equal((ti + 1 < n_r ? ti + 1 : n_r) - (n_att - base), d);
    if (ti >= n_r) assert_true(in_list(att, n_att, ti - n_r + 1 + base)); /* lag N_r-1 */
}

static void run_config(const diag_cfg *c) {
    ph_state st;
    assert_int_equal(ph_init(&st, &c->p, &c->lg), 0);
    int32_t nh = c->p.n_seq * c->p.n_layers * c->p.h_kv, base = 0;
    alg1 *ref = calloc((size_t)nh, sizeof *ref);
    int32_t a = c->p.n_att < c->p.n_r ? c->p.n_att : c->p.n_r;
    if (c->p.kind == FLEXDIAG_POLICY_DIAGONAL_SINK4) {
        base = 4;
        a -= 4;
    }
    for (int32_t t = 0; t < c->p.l_dec; t++) {
        int32_t ti = t - base;
        assert_int_equal(flexdiag__kvp_needs_scores(st.kvp, t),
                         ti >= 0 && ti >= a - 1 && ti <= c->p.n_r - 2 && t + 1 < c->p.l_dec);
        for (int32_t l = 0; l < c->p.n_layers; l++) {
            ph_step(&st, l, t);
            for (int32_t s = 0; s < c->p.n_seq; s++)
                for (int32_t h = 0; h < c->p.h_kv; h++) {
                    int32_t want[MAXT], n_want, n_got;
                    alg1 *r = &ref[(s * c->p.n_layers + l) * c->p.h_kv + h];
                    n_want = ref_step(c, r, s, l, t, h, want);
                    const int32_t *got = ph_att(&st, s, h, &n_got);
                    assert_int_equal(n_got, n_want);
                    assert_memory_equal(got, want, (size_t)n_got * sizeof(int32_t));
                    check_invariants(c, &st, l, s, h, t);
                }
        }
    }
    int32_t ev = c->p.l_dec - base - c->p.n_r;
    assert_int_equal(flexdiag__kvp_evictions(st.kvp), (uint64_t)(ev > 0 ? ev * nh : 0));
    free(ref);
    ph_free(&st);
}

static diag_cfg random_cfg(tu_rng *r, flexdiag_policy_kind kind) {
    diag_cfg c;
    memset(&c, 0, sizeof c);
    int32_t min_a = kind == FLEXDIAG_POLICY_DIAGONAL_SINK4 ? 5 : 1;
    c.p.kind = kind;
    c.p.l_dec = (int32_t)tu_rng_int(r, min_a, 64);
    c.p.n_r = (int32_t)tu_rng_int(r, min_a, 40);
    int32_t hi = c.p.l_dec < 40 ? c.p.l_dec : 40;
    if (tu_rng_int(r, 0, 9) == 0) /* one in ten: N_att > N_r exercises the clamp */
        c.p.n_att = (int32_t)tu_rng_int(r, min_a, hi);
    else
        c.p.n_att = (int32_t)tu_rng_int(r, min_a, hi < c.p.n_r ? hi : c.p.n_r);
    c.p.n_seq = (int32_t)tu_rng_int(r, 1, 2);
    c.p.n_layers = tu_rng_int(r, 0, 3) == 0 ? 2 : 1;
    c.p.h_kv = (int32_t)tu_rng_int(r, 1, 3);
    c.p.h_q = c.p.h_kv * (int32_t)tu_rng_int(r, 1, 4);
    c.lg.seed = tu_rng_u64(r);
    c.lg.levels = (int32_t)tu_rng_int(r, 1, 5);
    c.lg.step = 0.75f;
    c.lg.dead = (int32_t)tu_rng_int(r, 0, 1) * 20;
    return c;
}

static void test_random_vs_algorithm1(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 20240611);
    for (int i = 0; i < 10000; i++) {
        diag_cfg c = random_cfg(&r, FLEXDIAG_POLICY_DIAGONAL);
        run_config(&c);
    }
}

static void test_exhaustive_grid(void **state) {
    (void)state;
    for (int32_t n_r = 1; n_r <= 19; n_r++)
        for (int32_t n_att = 1; n_att <= 19; n_att++) {
            diag_cfg c;
            memset(&c, 0, sizeof c);
            c.p = (flexdiag_kvp_params){FLEXDIAG_POLICY_DIAGONAL, n_att, n_r, 33, 1, 1, 2, 1, 0, 0, NULL};
            c.lg = (ph_logits){(uint64_t)(n_r * 100 + n_att), 3, 1.0f, 0};
            run_config(&c);
        }
}

static void test_sink4_vs_reference(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 4);
    for (int i = 0; i < 2000; i++) {
        diag_cfg c = random_cfg(&r, FLEXDIAG_POLICY_DIAGONAL_SINK4);
        run_config(&c);
    }
}

/* Edge cases of §2.5: A = 1 attends only the oldest resident token; N_att >= N_r is a window. */
static void test_edge_cases(void **state) {
    (void)state;
    diag_cfg c;
    memset(&c, 0, sizeof c);
    c.p = (flexdiag_kvp_params){FLEXDIAG_POLICY_DIAGONAL, 1, 6, 20, 1, 1, 1, 1, 0, 0, NULL};
    c.lg = (ph_logits){9, 2, 1.0f, 0};
    ph_state st;
    assert_int_equal(ph_init(&st, &c.p, &c.lg), 0);
    for (int32_t t = 0; t < 20; t++) {
        ph_step(&st, 0, t);
        int32_t n;
        const int32_t *att = ph_att(&st, 0, 0, &n);
        assert_int_equal(n, 1);
        assert_int_equal(att[0], t < 6 ? 0 : t - 5);
    }
    ph_free(&st);
    c.p = (flexdiag_kvp_params){FLEXDIAG_POLICY_DIAGONAL, 9, 5, 20, 1, 1, 1, 1, 0, 0, NULL};
    assert_int_equal(ph_init(&st, &c.p, &c.lg), 0);
    for (int32_t t = 0; t < 20; t++) {
        assert_false(flexdiag__kvp_needs_scores(st.kvp, t));
        ph_step(&st, 0, t);
        int32_t n;
        const int32_t *att = ph_att(&st, 0, 0, &n);
        assert_int_equal(n, t + 1 < 5 ? t + 1 : 5);
        assert_int_equal(att[0], t < 5 ? 0 : t - 4);
    }
    ph_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_exhaustive_grid),
        cmocka_unit_test(test_random_vs_algorithm1),
        cmocka_unit_test(test_sink4_vs_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
