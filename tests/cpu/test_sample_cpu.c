/*
 * test_sample_cpu.c - the CPU sampler (ref_sample.c): draws keyed by (seed, request, step) do
 * not depend on batch composition or thread count; every row of a call uses its own settings
 * and key (a batch of rows with different seeds, requests, steps, temperatures, top-k, top-p
 * and id offsets draws what one-row calls draw) and rows with req < 0 are skipped (ids left as
 * they are, NaN logits not even looked at, their settings not checked); top_k = 1 is the argmax
 * (ties to the lower id); 20000 draws from a 4-way distribution match it (each frequency within
 * 0.02 and a chi-square statistic below the 0.1 % critical value); top-k and top-p restrict the
 * support to exactly the expected ids; NaN/Inf logits give FLEXDIAG_ERR_NUMERIC naming the row
 * and bad settings FLEXDIAG_ERR_INVALID_ARG naming the row and the field, before any row is
 * drawn.
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
#include "cpu/cpu_harness.h"
#include "kernels/kernels.h"
#include "util.h"

static const flexdiag_kernels *ref(void) { return flexdiag__kernels_cpu_ref(); }

/* Settings with request 0 at step 3 and no id offset. */
static flexdiag_sample_row params(float t, int32_t top_k, float top_p, uint64_t seed) {
    flexdiag_sample_row p = {.seed = seed, .req = 0, .step = 3, .temperature = t, .top_k = top_k,
                             .top_p = top_p, .id0 = 0};
    return p;
}

/* rows (n) = p with requests req0 + i. */
static void rows_of(flexdiag_sample_row *rows, int64_t n, const flexdiag_sample_row *p,
                    int64_t req0) {
    for (int64_t i = 0; i < n; i++) {
        rows[i] = *p;
        rows[i].req = req0 + i;
    }
}

/* One-row call of K: the id drawn from logits (V) with settings and key r. */
static int32_t draw_one(const flexdiag_kernels *K, const float *logits, int64_t V,
                        const flexdiag_sample_row *r) {
    int32_t id = -1;
    assert_int_equal(K->sample(&id, logits, 1, V, r, NULL), FLEXDIAG_OK);
    return id;
}

/* Draw n rows of the same logits (V) with p's settings, requests 0.. at p's step;
 * counts[id] += 1 per draw. */
static void draw_counts(int64_t *counts, const float *row, int64_t V, int64_t n,
                        const flexdiag_sample_row *p) {
    float *logits = malloc((size_t)(n * V) * 4);
    flexdiag_sample_row *rows = malloc((size_t)n * sizeof *rows);
    int32_t *ids = (int32_t *)ch_guarded(n, 0.0f);
    for (int64_t i = 0; i < n; i++) memcpy(logits + i * V, row, (size_t)V * 4);
    rows_of(rows, n, p, 0);
    assert_int_equal(ref()->sample(ids, logits, n, V, rows, NULL), FLEXDIAG_OK);
    ch_guard_check((float *)ids, n, "sample ids");
    for (int64_t i = 0; i < n; i++) {
        assert_true(ids[i] >= 0 && ids[i] < V);
        counts[ids[i]]++;
    }
    ch_guarded_free((float *)ids);
    free(rows);
    free(logits);
}

static void test_deterministic(void **state) {
    (void)state;
    enum { N = 7, V = 50 };
    tu_rng r;
    tu_rng_seed(&r, 21);
    float logits[N * V];
    tu_fill_f32(&r, logits, N * V, 2.0f);
    flexdiag_sample_row ps[] = {params(1.0f, 0, 1.0f, 1), params(0.7f, 10, 0.9f, 99),
                                params(1.3f, 0, 0.5f, 7), params(0.9f, 3, 1.0f, 5)};
    const flexdiag_kernels *F = flexdiag__kernels_cpu();
    for (int pi = 0; pi < 4; pi++) {
        ps[pi].step = 5;
        flexdiag_sample_row rows[N];
        rows_of(rows, N, &ps[pi], 100);
        int32_t batch[N], again[N];
        assert_int_equal(ref()->sample(batch, logits, N, V, rows, NULL), FLEXDIAG_OK);
        for (int i = 0; i < N; i++)
            assert_int_equal(draw_one(ref(), logits + i * V, V, &rows[i]), batch[i]);
        const int threads[] = {1, 3};
        for (int t = 0; t < 2; t++) {
            flexdiag_stream *s = ch_stream(F, threads[t]);
            assert_int_equal(F->sample(again, logits, N, V, rows, s), FLEXDIAG_OK);
            assert_memory_equal(again, batch, sizeof batch);
            F->stream_destroy(s);
        }
    }
    /* an id offset shifts every draw and changes nothing else */
    flexdiag_sample_row base_rows[N], shifted_rows[N];
    rows_of(base_rows, N, &ps[1], 100);
    rows_of(shifted_rows, N, &ps[1], 100);
    for (int i = 0; i < N; i++) shifted_rows[i].id0 = 4;
    int32_t base[N], shifted[N];
    assert_int_equal(ref()->sample(base, logits, N, V, base_rows, NULL), FLEXDIAG_OK);
    assert_int_equal(ref()->sample(shifted, logits, N, V, shifted_rows, NULL), FLEXDIAG_OK);
    for (int i = 0; i < N; i++) assert_int_equal(shifted[i], base[i] + 4);
    /* the draw changes with the step and the request: over 64 steps row 0 is not constant */
    int differs = 0;
    flexdiag_sample_row p = params(1.0f, 0, 1.0f, 1);
    p.step = 0;
    int32_t first = draw_one(ref(), logits, V, &p);
    for (p.step = 1; p.step < 64; p.step++) differs |= draw_one(ref(), logits, V, &p) != first;
    assert_true(differs);
}

/* A batch whose rows each have their own seed, request, step, temperature, top-k, top-p and id
 * offset draws, row for row, what one-row calls draw, on both tables and any thread count;
 * rows with req < 0 are skipped: ids untouched, their NaN logits and bad settings ignored. */
static void test_per_row(void **state) {
    (void)state;
    enum { N = 9, V = 40 };
    tu_rng r;
    tu_rng_seed(&r, 23);
    float logits[N * V];
    tu_fill_f32(&r, logits, N * V, 2.0f);
    const flexdiag_sample_row rows[N] = {
        {.seed = 1, .req = 0, .step = 0, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f},
        {.seed = 99, .req = 7, .step = 12, .temperature = 0.7f, .top_k = 10, .top_p = 0.9f},
        {.seed = 5, .req = -1, .step = 3, .temperature = 0.0f, .top_k = -4, .top_p = NAN},
        {.seed = 7, .req = 3, .step = 575, .temperature = 1.3f, .top_p = 0.5f, .id0 = 100},
        {.seed = 7, .req = 3, .step = 574, .temperature = 1.3f, .top_p = 0.5f, .id0 = 100},
        {.seed = 11, .req = 2, .step = 9, .temperature = 0.5f, .top_k = 1, .top_p = 1.0f,
         .id0 = 16384},
        {.seed = 2, .req = -5, .step = 1, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f},
        {.seed = 3, .req = 40, .step = 1, .temperature = 2.0f, .top_k = 3, .top_p = 1.0f},
        {.seed = 3, .req = 41, .step = 1, .temperature = 2.0f, .top_k = 3, .top_p = 0.6f},
    };
    for (int j = 0; j < V; j++) logits[2 * V + j] = logits[6 * V + j] = NAN; /* skipped rows */
    int32_t want[N];
    for (int i = 0; i < N; i++)
        want[i] = rows[i].req < 0 ? -77 : draw_one(ref(), logits + i * V, V, &rows[i]);
    /* row 5 (top_k 1) is the argmax of its own logits, offset by its own id0 */
    int32_t am = 0;
    for (int j = 1; j < V; j++) am = logits[5 * V + j] > logits[5 * V + am] ? j : am;
    assert_int_equal(want[5], 16384 + am);
    assert_true(want[3] >= 100 && want[3] < 100 + V && want[7] >= 0 && want[7] < V);
    const flexdiag_kernels *tabs[] = {ref(), flexdiag__kernels_cpu()};
    const int threads[] = {-1, 1, 3};
    for (int t = 0; t < 2; t++)
        for (int ti = 0; ti < 3; ti++) {
            flexdiag_stream *s = ch_stream(tabs[t], threads[ti]);
            int32_t ids[N];
            for (int i = 0; i < N; i++) ids[i] = -77;
            assert_int_equal(tabs[t]->sample(ids, logits, N, V, rows, s), FLEXDIAG_OK);
            assert_memory_equal(ids, want, sizeof want);
            if (s) tabs[t]->stream_destroy(s);
        }
    /* each part of the key counts: another seed, request or step draws another id somewhere */
    int differs[3] = {0};
    for (int it = 1; it <= 16; it++) {
        flexdiag_sample_row o[3] = {rows[0], rows[0], rows[0]};
        o[0].seed += (uint64_t)it;
        o[1].req += it;
        o[2].step += it;
        for (int k = 0; k < 3; k++) differs[k] |= draw_one(ref(), logits, V, &o[k]) != want[0];
    }
    assert_true(differs[0] && differs[1] && differs[2]);
    /* only skipped rows: nothing read, nothing written */
    int32_t id = -77;
    assert_int_equal(ref()->sample(&id, logits + 2 * V, 1, V, &rows[2], NULL), FLEXDIAG_OK);
    assert_int_equal(id, -77);
}

static void test_argmax(void **state) {
    (void)state;
    enum { V = 37 };
    tu_rng r;
    tu_rng_seed(&r, 22);
    float row[V];
    for (int it = 0; it < 20; it++) {
        tu_fill_f32(&r, row, V, 3.0f);
        int want = 0;
        if (it % 4 == 0) { /* a tie for the maximum: the lower id wins */
            row[30] = row[11] = 50.0f;
        }
        for (int j = 1; j < V; j++)
            if (row[j] > row[want]) want = j;
        flexdiag_sample_row p = params(it % 2 ? 0.5f : 2.0f, 1, 1.0f, (uint64_t)it);
        p.req = p.step = it;
        int32_t id = draw_one(ref(), row, V, &p);
        assert_int_equal(id, want);
        if (it % 4 == 0) assert_int_equal(id, 11);
    }
}

static void test_frequencies(void **state) {
    (void)state;
    const double prob[4] = {0.1, 0.2, 0.3, 0.4};
    float row[4];
    for (int j = 0; j < 4; j++) row[j] = (float)log(prob[j]) + 1.5f; /* softmax is shift-free */
    int64_t counts[4] = {0};
    flexdiag_sample_row p = params(1.0f, 0, 1.0f, 12345);
    const int64_t n = 20000;
    draw_counts(counts, row, 4, n, &p);
    double chi2 = 0;
    for (int j = 0; j < 4; j++) {
        double freq = (double)counts[j] / n, e = prob[j] * n;
        if (fabs(freq - prob[j]) > 0.02)
            fail_msg("id %d: frequency %.4f vs probability %.2f", j, freq, prob[j]);
        chi2 += (counts[j] - e) * (counts[j] - e) / e;
    }
    if (chi2 > 16.27) fail_msg("chi-square %.2f > 16.27 (3 dof, p = 0.001)", chi2);
    /* temperature 2 flattens: p ∝ prob^(1/2) */
    double q[4], qs = 0;
    for (int j = 0; j < 4; j++) qs += q[j] = sqrt(prob[j]);
    memset(counts, 0, sizeof counts);
    p.temperature = 2.0f;
    draw_counts(counts, row, 4, n, &p);
    for (int j = 0; j < 4; j++) assert_true(fabs((double)counts[j] / n - q[j] / qs) < 0.02);
}

static void test_top_k_top_p(void **state) {
    (void)state;
    const double prob[4] = {0.05, 0.5, 0.15, 0.3};
    float row[4];
    for (int j = 0; j < 4; j++) row[j] = (float)log(prob[j]);
    const int64_t n = 4000;
    /* top_p 0.75: by probability 0.5 (id 1), 0.3 (id 3): cumulative 0.8 >= 0.75 keeps {1, 3} */
    int64_t c[4] = {0};
    flexdiag_sample_row p = params(1.0f, 0, 0.75f, 3);
    draw_counts(c, row, 4, n, &p);
    assert_true(c[0] == 0 && c[2] == 0 && c[1] > 0 && c[3] > 0);
    assert_true(fabs((double)c[1] / n - 0.5 / 0.8) < 0.03);
    /* top_p below the largest probability keeps only the argmax */
    memset(c, 0, sizeof c);
    p.top_p = 0.4f;
    draw_counts(c, row, 4, n, &p);
    assert_int_equal(c[1], n);
    /* top_k 3 renormalises {1, 3, 2} to .526, .316, .158; top_p 0.8 then keeps {1, 3} */
    memset(c, 0, sizeof c);
    p = params(1.0f, 3, 0.8f, 4);
    draw_counts(c, row, 4, n, &p);
    assert_true(c[0] == 0 && c[2] == 0 && c[1] > 0 && c[3] > 0);
    /* top_k 3 alone: support {1, 2, 3} with the renormalised probabilities */
    memset(c, 0, sizeof c);
    p = params(1.0f, 3, 1.0f, 5);
    draw_counts(c, row, 4, n, &p);
    assert_int_equal(c[0], 0);
    assert_true(fabs((double)c[2] / n - 0.15 / 0.95) < 0.03);
    /* ties at the top-k boundary keep the lower ids: [1, 3, 3, 0, 3] with top_k 2 -> {1, 2} */
    const float tied[5] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f};
    int64_t t[5] = {0};
    p = params(1.0f, 2, 1.0f, 6);
    draw_counts(t, tied, 5, n, &p);
    assert_true(t[0] == 0 && t[3] == 0 && t[4] == 0 && t[1] > 0 && t[2] > 0);
}

/* Assert st is code and the error message names row and what. */
static void expect_err(flexdiag_status st, flexdiag_status code, const char *row,
                       const char *what) {
    assert_int_equal(st, code);
    if (!strstr(flexdiag__err_msg(), row) || !strstr(flexdiag__err_msg(), what))
        fail_msg("message \"%s\" does not name \"%s\" and \"%s\"", flexdiag__err_msg(), row,
                 what);
    flexdiag__err_clear();
}

static void test_errors(void **state) {
    (void)state;
    enum { V = 6 };
    float logits[4 * V] = {0};
    int32_t ids[4];
    flexdiag_sample_row rows[4];
    flexdiag_sample_row p = params(1.0f, 0, 1.0f, 1);
    rows_of(rows, 4, &p, 0);
    flexdiag__err_clear();
    logits[2 * V + 3] = NAN;
    expect_err(ref()->sample(ids, logits, 4, V, rows, NULL), FLEXDIAG_ERR_NUMERIC, "row 2",
               "not finite");
    logits[2 * V + 3] = -INFINITY;
    assert_int_equal(ref()->sample(ids, logits, 4, V, rows, NULL), FLEXDIAG_ERR_NUMERIC);
    flexdiag__err_clear();
    logits[2 * V + 3] = 3e38f; /* finite, but / 0.01 overflows */
    rows[2].temperature = 0.01f;
    expect_err(ref()->sample(ids, logits, 4, V, rows, NULL), FLEXDIAG_ERR_NUMERIC, "row 2",
               "temperature");
    /* the row with the overflow skipped: the others draw */
    rows[2].req = -1;
    assert_int_equal(ref()->sample(ids, logits, 4, V, rows, NULL), FLEXDIAG_OK);
    logits[2 * V + 3] = 0.0f;
    rows_of(rows, 4, &p, 0);
    /* bad settings of one row: INVALID_ARG naming the row and the field, no row drawn */
    const struct {
        flexdiag_sample_row r;
        const char *field;
    } bad[] = {
        {params(0.0f, 0, 1.0f, 1), "temperature"},  {params(NAN, 0, 1.0f, 1), "temperature"},
        {params(-1.0f, 0, 1.0f, 1), "temperature"}, {params(INFINITY, 0, 1.0f, 1), "temperature"},
        {params(1.0f, -1, 1.0f, 1), "top_k"},       {params(1.0f, 0, 0.0f, 1), "top_p"},
        {params(1.0f, 0, NAN, 1), "top_p"},         {params(1.0f, 0, -0.5f, 1), "top_p"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rows[3] = bad[i].r;
        rows[3].req = 3;
        for (int j = 0; j < 4; j++) ids[j] = -9;
        expect_err(ref()->sample(ids, logits, 4, V, rows, NULL), FLEXDIAG_ERR_INVALID_ARG,
                   "row 3", bad[i].field);
        for (int j = 0; j < 4; j++) assert_int_equal(ids[j], -9);
    }
    rows_of(rows, 4, &p, 0);
    expect_err(ref()->sample(ids, logits, 4, 0, rows, NULL), FLEXDIAG_ERR_INVALID_ARG,
               "cpu sample", "V = 0");
    expect_err(ref()->sample(ids, logits, 4, V, NULL, NULL), FLEXDIAG_ERR_INVALID_ARG,
               "cpu sample", "rows is NULL");
    assert_int_equal(ref()->sample(ids, logits, 0, V, NULL, NULL), FLEXDIAG_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic), cmocka_unit_test(test_per_row),
        cmocka_unit_test(test_argmax),        cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_top_k_top_p),   cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
