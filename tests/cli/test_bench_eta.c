/*
 * test_bench_eta.c - bench/eta.c, the seconds left that bench prints on long runs: steps of a
 * fixed time project exactly; steps that grow by a fixed amount each (a dense step reading its
 * history) project exactly from the second interval on, where the mean pace is far short; a
 * first interval slowed by the prefill does not turn into a shrinking step; a sample that did
 * not move is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "bench/eta.h"

/* seconds at which step `done` ends when step i takes a + b * i (steps 0 .. done - 1) */
static double at(double a, double b, uint64_t done) {
    return a * (double)done + b * 0.5 * (double)done * (double)(done - 1);
}

static void test_constant(void **state) {
    (void)state;
    bench_eta e = {0};
    assert_float_equal(bench_eta_sample(&e, 10.0, 100, 576), 47.6, 1e-9);
    assert_float_equal(bench_eta_sample(&e, 20.0, 200, 576), 37.6, 1e-9);
    assert_float_equal(bench_eta_sample(&e, 57.6, 576, 576), 0.0, 1e-9);
}

static void test_growing(void **state) {
    (void)state;
    const double a = 0.05, b = 0.0005; /* 50 ms, growing 0.5 ms a step */
    const uint64_t total = 576, marks[] = {138, 213, 271, 320, 404, 556};
    bench_eta e = {0};
    double first = bench_eta_sample(&e, at(a, b, marks[0]), marks[0], total);
    double truth0 = at(a, b, total) - at(a, b, marks[0]);
    assert_true(first < 0.5 * truth0); /* the mean pace: less than half of what is left */
    for (size_t i = 1; i < sizeof marks / sizeof marks[0]; i++) {
        double left = bench_eta_sample(&e, at(a, b, marks[i]), marks[i], total);
        assert_float_equal(left, at(a, b, total) - at(a, b, marks[i]), 1e-4); /* rounding only */
    }
}

static void test_prefill_first(void **state) {
    (void)state;
    bench_eta e = {0};
    /* 5 s of prefill in the first interval, then 0.1 s a step */
    assert_true(bench_eta_sample(&e, 5.0 + 10.0, 100, 576) > 0);
    assert_float_equal(bench_eta_sample(&e, 25.0, 200, 576), 37.6, 1e-9);
}

static void test_no_progress(void **state) {
    (void)state;
    bench_eta e = {0};
    assert_true(bench_eta_sample(&e, 10.0, 100, 576) > 0);
    assert_float_equal(bench_eta_sample(&e, 20.0, 100, 576), -1.0, 0);
    assert_float_equal(bench_eta_sample(&e, 20.0, 200, 576), 37.6, 1e-9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant),
        cmocka_unit_test(test_growing),
        cmocka_unit_test(test_prefill_first),
        cmocka_unit_test(test_no_progress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
