/*
 * test_sample_cpu.c - the CPU sampler (ref_sample.c): draws keyed by (seed, request, step) do
 * not depend on batch composition or thread count; top_k = 1 is the argmax (ties to the lower
 * id); 20000 draws from a 4-way distribution match it (each frequency within 0.02 and a
 * chi-square statistic below the 0.1 % critical value); top-k and top-p restrict the support to
 * exactly the expected ids; NaN/Inf logits give FLEXDIAG_ERR_NUMERIC naming the row and bad
 * parameters FLEXDIAG_ERR_INVALID_ARG.
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

static flexdiag_sample_params params(float t, int32_t top_k, float top_p, uint64_t seed) {
    flexdiag_sample_params p = {t, top_k, top_p, seed, 0};
    return p;
}

/* Draw n rows of the same logits (V) with requests req0.. at step; counts[id] += 1 per draw. */
static void draw_counts(int64_t *counts, const float *row, int64_t V, int64_t n,
                        const flexdiag_sample_params *p) {
    float *logits = malloc((size_t)(n * V) * 4);
    int32_t *ids = (int32_t *)ch_guarded(n, 0.0f);
    for (int64_t i = 0; i < n; i++) memcpy(logits + i * V, row, (size_t)V * 4);
    assert_int_equal(ref()->sample(ids, logits, n, V, p, 0, 3, NULL), FLEXDIAG_OK);
    ch_guard_check((float *)ids, n, "sample ids");
    for (int64_t i = 0; i < n; i++) {
        assert_true(ids[i] >= 0 && ids[i] < V);
        counts[ids[i]]++;
    }
    ch_guarded_free((float *)ids);
    free(logits);
}

static void test_deterministic(void **state) {
    (void)state;
    enum { N = 7, V = 50 };
    tu_rng r;
    tu_rng_seed(&r, 21);
    float logits[N * V];
    tu_fill_f32(&r, logits, N * V, 2.0f);
    const flexdiag_sample_params ps[] = {params(1.0f, 0, 1.0f, 1), params(0.7f, 10, 0.9f, 99),
                                         params(1.3f, 0, 0.5f, 7), params(0.9f, 3, 1.0f, 5)};
    const flexdiag_kernels *F = flexdiag__kernels_cpu();
    for (int pi = 0; pi < 4; pi++) {
        int32_t batch[N], again[N], one;
        assert_int_equal(ref()->sample(batch, logits, N, V, &ps[pi], 100, 5, NULL), FLEXDIAG_OK);
        for (int i = 0; i < N; i++) {
            assert_int_equal(ref()->sample(&one, logits + i * V, 1, V, &ps[pi], 100 + i, 5, NULL),
                             FLEXDIAG_OK);
            assert_int_equal(one, batch[i]);
        }
        const int threads[] = {1, 3};
        for (int t = 0; t < 2; t++) {
            flexdiag_stream *s = ch_stream(F, threads[t]);
            assert_int_equal(F->sample(again, logits, N, V, &ps[pi], 100, 5, s), FLEXDIAG_OK);
            assert_memory_equal(again, batch, sizeof batch);
            F->stream_destroy(s);
        }
    }
    /* an id offset shifts every draw and changes nothing else */
    flexdiag_sample_params po = ps[1];
    po.id0 = 4;
    int32_t base[N], shifted[N];
    assert_int_equal(ref()->sample(base, logits, N, V, &ps[1], 100, 5, NULL), FLEXDIAG_OK);
    assert_int_equal(ref()->sample(shifted, logits, N, V, &po, 100, 5, NULL), FLEXDIAG_OK);
    for (int i = 0; i < N; i++) assert_int_equal(shifted[i], base[i] + 4);
    /* the draw changes with the step and the request: over 64 steps row 0 is not constant */
    int32_t first, id, differs = 0;
    flexdiag_sample_params p = params(1.0f, 0, 1.0f, 1);
    assert_int_equal(ref()->sample(&first, logits, 1, V, &p, 0, 0, NULL), FLEXDIAG_OK);
    for (int64_t step = 1; step < 64; step++) {
        assert_int_equal(ref()->sample(&id, logits, 1, V, &p, 0, step, NULL), FLEXDIAG_OK);
        differs |= id != first;
    }
    assert_true(differs);
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
        flexdiag_sample_params p = params(it % 2 ? 0.5f : 2.0f, 1, 1.0f, (uint64_t)it);
        int32_t id;
        assert_int_equal(ref()->sample(&id, row, 1, V, &p, it, it, NULL), FLEXDIAG_OK);
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
    flexdiag_sample_params p = params(1.0f, 0, 1.0f, 12345);
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
    flexdiag_sample_params p = params(1.0f, 0, 0.75f, 3);
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

static void test_errors(void **state) {
    (void)state;
    enum { V = 6 };
    float logits[4 * V] = {0};
    int32_t ids[4];
    flexdiag_sample_params p = params(1.0f, 0, 1.0f, 1);
    logits[2 * V + 3] = NAN;
    flexdiag__err_clear();
    assert_int_equal(ref()->sample(ids, logits, 4, V, &p, 0, 0, NULL), FLEXDIAG_ERR_NUMERIC);
    assert_non_null(strstr(flexdiag__err_msg(), "row 2"));
    flexdiag__err_clear();
    logits[2 * V + 3] = -INFINITY;
    assert_int_equal(ref()->sample(ids, logits, 4, V, &p, 0, 0, NULL), FLEXDIAG_ERR_NUMERIC);
    flexdiag__err_clear();
    logits[2 * V + 3] = 3e38f; /* finite, but / 0.01 overflows */
    p.temperature = 0.01f;
    assert_int_equal(ref()->sample(ids, logits, 4, V, &p, 0, 0, NULL), FLEXDIAG_ERR_NUMERIC);
    assert_non_null(strstr(flexdiag__err_msg(), "temperature"));
    flexdiag__err_clear();
    logits[2 * V + 3] = 0.0f;
    const flexdiag_sample_params bad[] = {params(0.0f, 0, 1.0f, 1),  params(NAN, 0, 1.0f, 1),
                                          params(-1.0f, 0, 1.0f, 1), params(1.0f, -1, 1.0f, 1),
                                          params(1.0f, 0, 0.0f, 1),  params(1.0f, 0, NAN, 1)};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ref()->sample(ids, logits, 4, V, &bad[i], 0, 0, NULL),
                         FLEXDIAG_ERR_INVALID_ARG);
        assert_non_null(strstr(flexdiag__err_msg(), "temperature"));
        flexdiag__err_clear();
    }
    assert_int_equal(ref()->sample(ids, logits, 4, 0, &p, 0, 0, NULL), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    assert_int_equal(ref()->sample(ids, logits, 4, V, NULL, 0, 0, NULL), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    assert_int_equal(ref()->sample(ids, logits, 0, V, &p, 0, 0, NULL), FLEXDIAG_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic), cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_frequencies),   cmocka_unit_test(test_top_k_top_p),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
