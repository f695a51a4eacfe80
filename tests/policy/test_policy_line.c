/*
 * test_policy_line.c - LineAR (docs/policies.md §8) against a literal reference written in
 * positions: a set of resident decode positions per (sequence, layer, KV head); each step adds
 * its token and attends the whole set; scores add the group's probabilities per position over
 * the current line; at the end of a line that leaves no room for the next (and is not the
 * last), the positions in [4, start of the line just finished) beyond the best M by (score
 * desc, position desc) leave the set. Random grids, budgets, GQA groups and probabilities; a
 * worked example; the refusals (no grid, a budget without room).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "policy/kv_policy.h"
#include "util.h"

#define MAXR 200

/* The reference list: in[p] = 1 when position p is resident, acc[p] its line score. */
typedef struct ref_list {
    unsigned char in[MAXR];
    float acc[MAXR];
} ref_list;

/* Probability of position p for query head q at step t (any deterministic function). */
static float prob_of(uint64_t seed, int32_t t, int32_t p, int32_t q) {
    uint64_t x = seed ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)p << 20) ^
                 ((uint64_t)q << 40);
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    return (float)(x % 8) / 8.0f; /* few distinct values: ties happen */
}

static void ref_step(ref_list *r, int32_t t, int32_t w, int32_t n_att, int32_t l_dec, int32_t g,
                     int32_t h, uint64_t seed, uint64_t *freed) {
    r->in[t] = 1;
    int32_t i0 = n_att / w - 1, n_ln = l_dec / w, line = t / w;
    if (!(t >= i0 * w && t < (n_ln - 1) * w)) return; /* no scores needed */
    if (t % w == 0) memset(r->acc, 0, sizeof r->acc);
    int32_t occ = 0;
    for (int32_t p = 0; p <= t; p++) {
        if (!r->in[p]) continue;
        occ++;
        for (int32_t q = 0; q < g; q++) r->acc[p] += prob_of(seed, t, p, h * g + q);
    }
    if (t % w != w - 1 || occ <= n_att - w) return;
    int32_t m = n_att - 4 - 2 * w, cut = line * w, n = 0, cand[MAXR];
    for (int32_t p = 4; p < cut; p++)
        if (r->in[p]) cand[n++] = p;
    for (int32_t k = 0; k < n; k++) { /* rank of cand[k]: how many beat it */
        int32_t better = 0;
        for (int32_t j = 0; j < n; j++) {
            float a = r->acc[cand[j]], b = r->acc[cand[k]];
            if (a > b || (a == b && cand[j] > cand[k])) better++;
        }
        if (better >= m) r->in[cand[k]] = 0, (*freed)++;
    }
}

static uint64_t g_freed, g_configs; /* totals over the configurations run */

/* One random configuration: every step's attended positions (through slot_pos) and the
 * evictions equal the reference's. */
static void run_config(int32_t w, int32_t n_ln, int32_t n_att, int32_t g, int32_t h_kv,
                       uint64_t seed) {
    int32_t l_dec = w * n_ln, n_seq = 2, n_layers = 2, h_q = g * h_kv;
    flexdiag_kvp_params p = {.kind = FLEXDIAG_POLICY_LINE_AR, .n_att = n_att, .l_dec = l_dec,
                             .n_seq = n_seq, .n_layers = n_layers, .h_q = h_q, .h_kv = h_kv,
                             .w_s = w};
    flexdiag_kvp *k = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    int32_t ms = flexdiag__kvp_max_slots(&p);
    assert_int_equal(ms, n_att);
    assert_int_equal(flexdiag__kvp_ring_rows(&p), n_att);
    ref_list *ref = calloc((size_t)(n_seq * n_layers * h_kv), sizeof *ref);
    int32_t *ws = malloc((size_t)n_seq * h_kv * 4), *ns = malloc((size_t)n_seq * h_kv * 4);
    int32_t *sl = malloc((size_t)n_seq * h_kv * ms * 4);
    float *pr = malloc((size_t)n_seq * h_q * ms * 4);
    uint64_t freed = 0;
    for (int32_t t = 0; t < l_dec; t++) {
        for (int32_t l = 0; l < n_layers; l++) {
            flexdiag__kvp_plan(k, l, t, 0, n_seq, ws, sl, ns);
            for (int32_t s = 0; s < n_seq; s++)
                for (int32_t h = 0; h < h_kv; h++) {
                    int32_t li = s * h_kv + h, n = 0;
                    ref_list *rf = &ref[(s * n_layers + l) * h_kv + h];
                    rf->in[t] = 1; /* the reference's add, checked before its update */
                    for (int32_t q = 0; q <= t; q++) n += rf->in[q];
                    assert_int_equal(ns[li], n);
                    for (int32_t c = 0; c < ns[li]; c++) { /* each column's position */
                        int32_t pos = flexdiag__kvp_slot_pos(k, l, s, h, sl[li * ms + c]);
                        assert_true(pos >= 0 && pos <= t && rf->in[pos]);
                        if (c > 0) assert_true(sl[li * ms + c] > sl[li * ms + c - 1]);
                        for (int32_t q = 0; q < g; q++)
                            pr[((size_t)s * h_q + h * g + q) * ms + c] =
                                prob_of(seed + (uint64_t)(s * 7 + l), t, pos, h * g + q);
                    }
                    assert_true(ws[li] >= 0 && ws[li] < n_att);
                    int32_t common = flexdiag__kvp_write_slot(&p, t); /* what KV homes copy */
                    if (common >= 0) assert_int_equal(ws[li], common);
                    assert_true(ws[li] < flexdiag__kvp_resident_rows(&p, t));
                    assert_int_equal(flexdiag__kvp_slot_pos(k, l, s, h, ws[li]), t);
                }
            if (flexdiag__kvp_needs_scores(k, t))
                flexdiag__kvp_update(k, l, t, 0, n_seq, NULL, NULL, pr);
            for (int32_t s = 0; s < n_seq; s++)
                for (int32_t h = 0; h < h_kv; h++)
                    ref_step(&ref[(s * n_layers + l) * h_kv + h], t, w, n_att, l_dec, g, h,
                             seed + (uint64_t)(s * 7 + l), &freed);
        }
    }
    assert_int_equal(flexdiag__kvp_evictions(k), freed);
    g_freed += freed, g_configs++;
    free(ref), free(ws), free(ns), free(sl), free(pr);
    flexdiag__kvp_destroy(k);
}

static void test_random_against_reference(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 17);
    for (int it = 0; it < 60; it++) {
        int32_t w = (int32_t)tu_rng_int(&r, 2, 9), n_ln = (int32_t)tu_rng_int(&r, 2, 12);
        int32_t lo = 4 + 2 * w, l_dec = w * n_ln;
        if (lo > l_dec || l_dec > MAXR) continue;
        int32_t n_att = (int32_t)tu_rng_int(&r, lo, l_dec);
        run_config(w, n_ln, n_att, (int32_t)tu_rng_int(&r, 1, 3), (int32_t)tu_rng_int(&r, 1, 2),
                   tu_rng_u64(&r));
    }
    run_config(24, 6, 96, 1, 1, 5); /* Janus's line at rho = 1/6 on a shorter image */
    run_config(9, 8, 36, 2, 2, 6);  /* micro-lumina's rows */
    assert_true(g_configs >= 30 && g_freed > 1000); /* the selections did run */
}

/* Lines of 4, 16 tokens, budget 14 (M = 2): line 2 (steps 8..11) ends with 12 resident > 10,
 * so of the middle positions 4..7 (line 1's; line 2 is the recent line) the two that line 2
 * attended most stay. */
static void test_worked_example(void **state) {
    (void)state;
    flexdiag_kvp_params p = {.kind = FLEXDIAG_POLICY_LINE_AR, .n_att = 14, .l_dec = 16,
                             .n_seq = 1, .n_layers = 1, .h_q = 1, .h_kv = 1, .w_s = 4};
    flexdiag_kvp *k = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    int32_t ws, sl[14], ns;
    float pr[14];
    for (int32_t t = 0; t < 12; t++) {
        flexdiag__kvp_plan(k, 0, t, 0, 1, &ws, sl, &ns);
        assert_int_equal(ws, t);
        assert_int_equal(ns, t + 1);
        assert_int_equal(flexdiag__kvp_needs_scores(k, t), t >= 8); /* i0 = 14/4 - 1 = 2 */
        for (int32_t c = 0; c < ns; c++) pr[c] = c == 5 || c == 7 ? 0.3f : 0.01f;
        flexdiag__kvp_update(k, 0, t, 0, 1, NULL, NULL, pr);
    }
    assert_int_equal(flexdiag__kvp_evictions(k), 2); /* positions 4 and 6 */
    assert_int_equal(flexdiag__kvp_slot_pos(k, 0, 0, 0, 4), -1);
    assert_int_equal(flexdiag__kvp_slot_pos(k, 0, 0, 0, 5), 5);
    assert_int_equal(flexdiag__kvp_slot_pos(k, 0, 0, 0, 6), -1);
    assert_int_equal(flexdiag__kvp_slot_pos(k, 0, 0, 0, 7), 7);
    flexdiag__kvp_plan(k, 0, 12, 0, 1, &ws, sl, &ns);
    assert_int_equal(ws, 4); /* the lowest free slot */
    assert_int_equal(ns, 11);
    flexdiag__kvp_destroy(k);
}

static void test_refusals(void **state) {
    (void)state;
    flexdiag_kvp_params p = {.kind = FLEXDIAG_POLICY_LINE_AR, .n_att = 30, .l_dec = 64,
                             .n_seq = 1, .n_layers = 1, .h_q = 1, .h_kv = 1, .w_s = 0};
    flexdiag_kvp *k = NULL;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG); /* text: no grid */
    assert_non_null(strstr(flexdiag__err_msg(), "image grid"));
    p.w_s = 8, p.n_att = 19; /* needs 4 + 2 * 8 = 20 */
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "n_att >= 20"));
    p.n_att = 20;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    flexdiag__kvp_destroy(k);
    assert_string_equal(flexdiag__kvp_name(FLEXDIAG_POLICY_LINE_AR), "line-ar");
    assert_int_equal(flexdiag__kvp_traits(FLEXDIAG_POLICY_LINE_AR)->device, FLEXDIAG_KVP_DEV_NONE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
