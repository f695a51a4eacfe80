/*
 * test_policy_calib.c - the calibration table (docs/policies.md §7.2): the collector kind
 * against a direct computation of P and V over the same probabilities (several sequence slots,
 * one of them reused after a reset, GQA), its dense plan, the steps it records; the file
 * written and read back bit for bit; the reader's refusals, each naming the file and what is
 * wrong.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "calib_util.h"

enum { NS = 3, NL = 2, HQ = 4, HKV = 2, LD = 12, T0 = LD / 2 };

/* Full-row probability fed at (sequence run r, layer, step t, head q, position p): below 1/LD
 * so a row's decode share stays under 1 (the prompt takes the rest). */
static float prob(int32_t r, int32_t l, int32_t t, int32_t q, int32_t p) {
    return cu_prob((uint64_t)(r * 131 + l), t, p, q) / (float)LD + 1e-3f;
}

/* The direct computation: P and V of (layer l, head q) over the runs. */
static void direct(int32_t runs, int32_t l, int32_t q, double *P, double *V) {
    double lag[LD] = {0}, s1[T0] = {0}, s2[T0] = {0}, n = 0, tot = 0;
    for (int32_t r = 0; r < runs; r++)
        for (int32_t t = T0; t < LD - 1; t++, n++) {
            double den = 0;
            for (int32_t p = 0; p <= t; p++) den += prob(r, l, t, q, p);
            for (int32_t p = 0; p <= t; p++) {
                double x = prob(r, l, t, q, p) / den;
                lag[t - p] += x;
                if (p < T0) s1[p] += x, s2[p] += x * x;
            }
        }
    for (int32_t k = 0; k < LD; k++) tot += lag[k];
    for (int32_t k = 0; k < LD; k++) P[k] = lag[k] / tot;
    *V = 0;
    for (int32_t p = 0; p < T0; p++) *V += s2[p] / n - (s1[p] / n) * (s1[p] / n);
    *V /= T0;
}

/* Runs 0..NS-1 on sequence slots 0..NS-1 together, then run NS on slot 1 after a reset. */
static flexdiag_kvp_calib *collect(void) {
    flexdiag_kvp_params p = {.kind = FLEXDIAG__POLICY_CALIBRATE, .n_att = LD, .l_dec = LD,
                             .n_seq = NS, .n_layers = NL, .h_q = HQ, .h_kv = HKV, .w_s = 4};
    flexdiag_kvp *k = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    assert_int_equal(flexdiag__kvp_max_slots(&p), LD);
    int32_t ws[HKV], ns[HKV], sl[HKV * LD];
    float pr[HQ * LD];
    for (int32_t pass = 0; pass < 2; pass++) {
        int32_t s0 = pass ? 1 : 0, n = pass ? 1 : NS;
        if (pass) flexdiag__kvp_reset_seq(k, 1);
        for (int32_t t = 0; t < LD; t++)
            for (int32_t l = 0; l < NL; l++)
                for (int32_t s = s0; s < s0 + n; s++) {
                    int32_t run = pass ? NS : s;
                    flexdiag__kvp_plan(k, l, t, s, 1, ws, sl, ns);
                    for (int32_t h = 0; h < HKV; h++) {
                        assert_int_equal(ws[h], t);
                        assert_int_equal(ns[h], t + 1);
                        for (int32_t j = 0; j <= t; j++) assert_int_equal(sl[h * LD + j], j);
                    }
                    assert_int_equal(flexdiag__kvp_needs_scores(k, t), t >= T0 && t < LD - 1);
                    for (int32_t q = 0; q < HQ; q++)
                        for (int32_t j = 0; j <= t; j++) pr[q * LD + j] = prob(run, l, t, q, j);
                    flexdiag__kvp_update(k, l, t, s, 1, NULL, NULL, pr);
                }
    }
    assert_int_equal(flexdiag__kvp_evictions(k), 0);
    flexdiag_kvp_calib *tab = NULL;
    assert_int_equal(flexdiag__kvp_calib_export(k, &tab), FLEXDIAG_OK);
    flexdiag__kvp_destroy(k);
    return tab;
}

static void test_collector_against_direct(void **state) {
    (void)state;
    flexdiag_kvp_calib *tab = collect();
    assert_int_equal(tab->n_layers, NL);
    assert_int_equal(tab->h_q, HQ);
    assert_int_equal(tab->h_kv, HKV);
    assert_int_equal(tab->w_s, 4);
    assert_int_equal(tab->t0, T0);
    assert_int_equal(tab->t_end, LD - 1);
    assert_int_equal(tab->pairs, (uint64_t)(NS + 1) * (LD - 1 - T0));
    for (int32_t l = 0; l < NL; l++)
        for (int32_t q = 0; q < HQ; q++) {
            double P[LD], V;
            direct(NS + 1, l, q, P, &V);
            const float *got = tab->P + ((size_t)l * HQ + q) * LD;
            for (int32_t k = 0; k < LD; k++) assert_true(fabs(got[k] - P[k]) <= 1e-6 * P[k] + 1e-9);
            assert_true(fabs(tab->V[l * HQ + q] - V) <= 1e-9 * V + 1e-15);
            assert_true(V > 0);
        }
    flexdiag__kvp_calib_free(tab);
    /* the collector is not a public policy: no name to parse, not in the list */
    flexdiag_policy_kind kind;
    assert_int_equal(flexdiag__kvp_parse("calibrate", &kind), -1);
    assert_null(strstr(flexdiag__kvp_names(), "calibrate"));
}

static void test_export_refusals(void **state) {
    (void)state;
    flexdiag_kvp_params p = {.kind = FLEXDIAG__POLICY_CALIBRATE, .n_att = LD, .l_dec = LD,
                             .n_seq = 1, .n_layers = 1, .h_q = 1, .h_kv = 1, .w_s = 4};
    flexdiag_kvp *k = NULL;
    flexdiag_kvp_calib *tab = NULL;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_calib_export(k, &tab), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "no step was recorded"));
    flexdiag__kvp_destroy(k);
    p.kind = FLEXDIAG_POLICY_WINDOW;
    p.n_att = 4;
    assert_int_equal(flexdiag__kvp_create(&p, &k), FLEXDIAG_OK);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_calib_export(k, &tab), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "not the calibration collector"));
    flexdiag__kvp_destroy(k);
}

/* ---- the file ---- */

static char *dir;

static char *path_of(const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static flexdiag_kvp_calib *identity(flexdiag_kvp_calib *t) {
    t->config_hash = 0x0123456789abcdefull, t->prompts_hash = 42, t->seed = 7, t->n_cal = 8;
    snprintf(t->backend, sizeof t->backend, "cpu");
    return t;
}

static void test_round_trip(void **state) {
    (void)state;
    flexdiag_kvp_calib *t = identity(collect()), *back = NULL;
    char *f = path_of("rt.calib");
    assert_int_equal(flexdiag__kvp_calib_write(f, t), FLEXDIAG_OK);
    assert_int_equal(flexdiag__kvp_calib_read(f, &back), FLEXDIAG_OK);
    assert_true(back->config_hash == t->config_hash && back->prompts_hash == 42 &&
                back->seed == 7 && back->pairs == t->pairs);
    assert_true(back->w_s == 4 && back->l_dec == LD && back->n_layers == NL && back->h_q == HQ &&
                back->h_kv == HKV && back->t0 == T0 && back->t_end == LD - 1 && back->n_cal == 8);
    assert_string_equal(back->backend, "cpu");
    assert_memory_equal(back->P, t->P, (size_t)NL * HQ * LD * 4);
    assert_memory_equal(back->V, t->V, (size_t)NL * HQ * 8);
    size_t n = 0;
    unsigned char *bytes = tu_read_file(f, &n);
    assert_int_equal(n, 128 + NL * HQ * LD * 4 + NL * HQ * 8 + 8);
    free(bytes);
    flexdiag__kvp_calib_free(back);
    flexdiag__kvp_calib_free(t);
    free(f);
}

/* Put v at byte off of a copy of the file and fix its checksum (fix 1), then read it: the
 * status and the message naming the file and want. */
static void expect_refused(const unsigned char *good, size_t n, size_t off, const void *v,
                           size_t vn, int fix, flexdiag_status st, const char *want) {
    unsigned char *b = malloc(n + 8);
    memcpy(b, good, n);
    if (v) memcpy(b + off, v, vn);
    if (fix) {
        uint64_t h = flexdiag__fnv1a64(FLEXDIAG_FNV_BASIS, b, n - 8);
        for (int i = 0; i < 8; i++) b[n - 8 + i] = (unsigned char)(h >> (8 * i));
    }
    char *f = path_of("bad.calib");
    assert_int_equal(tu_write_file(f, b, v || fix ? n : off), 0); /* no v: truncated at off */
    flexdiag_kvp_calib *t = (flexdiag_kvp_calib *)&t;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_calib_read(f, &t), st);
    assert_null(t);
    if (!strstr(flexdiag__err_msg(), want) || !strstr(flexdiag__err_msg(), f))
        fail_msg("message '%s' lacks '%s' or the file", flexdiag__err_msg(), want);
    free(f);
    free(b);
}

static void test_refusals(void **state) {
    (void)state;
    flexdiag_kvp_calib *t = identity(collect());
    char *f = path_of("good.calib");
    assert_int_equal(flexdiag__kvp_calib_write(f, t), FLEXDIAG_OK);
    size_t n = 0;
    unsigned char *good = tu_read_file(f, &n);
    const int32_t bad_ver = 2, zero = 0, seven = 7, big = 40000, one = 1;
    const float neg = -0.25f, half = 0.5f;
    const double nan_v = NAN;
    size_t p0 = 128, v0 = 128 + (size_t)NL * HQ * LD * 4;
    expect_refused(good, n, 0, "NOTCALIB", 8, 1, FLEXDIAG_ERR_INVALID_ARG, "FDXCALIB magic");
    expect_refused(good, n, 8, &bad_ver, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "version 2");
    expect_refused(good, n, 64, &seven, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "h_q a multiple of h_kv");
    expect_refused(good, n, 52, &big, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "L_dec 40000");
    expect_refused(good, n, 48, &seven, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "W_s 7 does not divide");
    expect_refused(good, n, 68, &zero, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "recorded steps");
    expect_refused(good, n, 100, &one, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "reserved header byte");
    expect_refused(good, n, p0 + 8, &neg, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "not a probability");
    expect_refused(good, n, p0 + 4, &half, 4, 1, FLEXDIAG_ERR_INVALID_ARG, "sums to");
    expect_refused(good, n, v0 + 8, &nan_v, 8, 1, FLEXDIAG_ERR_INVALID_ARG, "column variance");
    expect_refused(good, n, p0 + 4, &half, 4, 0, FLEXDIAG_ERR_INVALID_ARG, "checksum");
    expect_refused(good, n, n - 9, NULL, 0, 0, FLEXDIAG_ERR_INVALID_ARG, "needs");
    expect_refused(good, n, 20, NULL, 0, 0, FLEXDIAG_ERR_INVALID_ARG, "too short");
    char *missing = path_of("missing.calib");
    flexdiag_kvp_calib *back = NULL;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__kvp_calib_read(missing, &back), FLEXDIAG_ERR_NOT_FOUND);
    assert_non_null(strstr(flexdiag__err_msg(), missing));
    free(missing);
    free(good);
    free(f);
    flexdiag__kvp_calib_free(t);
}

static int setup(void **state) {
    (void)state;
    dir = tu_tempdir("calib");
    return dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(dir);
    free(dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collector_against_direct),
        cmocka_unit_test(test_export_refusals),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
