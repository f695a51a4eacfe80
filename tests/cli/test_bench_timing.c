/*
 * test_bench_timing.c - bench/timing.c, the timed repeats behind `flexdiag-bench profile` and
 * bench's ceilings: a fast call gets its warm-up and all its repeats; a call slow enough that
 * the repeats would pass BENCH_SAMPLE_BUDGET_S gets fewer (as many as fit at the warm-up's
 * pace, at least one), and the seconds per call returned are the timed calls' own; a failing
 * call gives -1. On the CPU backend's stream, the call a counted sleep.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "bench/timing.h"
#include "kernels/kernels.h"

typedef struct counted {
    int calls, fail_at; /* calls so far; the call (1-based) that fails, 0: none */
    double sleep_s;     /* each call sleeps this long */
} counted;

static flexdiag_status counted_call(void *ctx) {
    counted *c = ctx;
    c->calls++;
    time_t whole = (time_t)c->sleep_s;
    struct timespec ts = {whole, (long)((c->sleep_s - (double)whole) * 1e9)};
    nanosleep(&ts, NULL);
    return c->calls == c->fail_at ? FLEXDIAG_ERR_IO : FLEXDIAG_OK;
}

static flexdiag_stream *cpu_stream(void) {
    flexdiag_stream *s = NULL;
    assert_int_equal(flexdiag__kernels_cpu()->stream_create(-1, 1, &s), FLEXDIAG_OK);
    return s;
}

static void test_fast_call_all_repeats(void **state) {
    (void)state;
    flexdiag_stream *s = cpu_stream();
    counted c = {0, 0, 0.001};
    double t = bench_time_calls(flexdiag__kernels_cpu(), s, 4, counted_call, &c);
    assert_int_equal(c.calls, 5); /* warm-up + 4 */
    assert_true(t >= 0.001 && t < 0.5);
    flexdiag__kernels_cpu()->stream_destroy(s);
}

static void test_slow_call_cut(void **state) {
    (void)state;
    flexdiag_stream *s = cpu_stream();
    /* 0.7 s a call: 4 repeats would take 2.8 s, so 2 (2.0 / 0.7) are timed */
    counted c = {0, 0, 0.7};
    double t = bench_time_calls(flexdiag__kernels_cpu(), s, 4, counted_call, &c);
    assert_int_equal(c.calls, 3);
    assert_true(t >= 0.69 && t < 2.0);
    /* slower than the whole budget: one timed call after the warm-up */
    counted d = {0, 0, BENCH_SAMPLE_BUDGET_S + 0.1};
    t = bench_time_calls(flexdiag__kernels_cpu(), s, 8, counted_call, &d);
    assert_int_equal(d.calls, 2);
    assert_true(t >= BENCH_SAMPLE_BUDGET_S);
    flexdiag__kernels_cpu()->stream_destroy(s);
}

static void test_failing_call(void **state) {
    (void)state;
    flexdiag_stream *s = cpu_stream();
    counted warm = {0, 1, 0}, timed = {0, 3, 0};
    assert_true(bench_time_calls(flexdiag__kernels_cpu(), s, 4, counted_call, &warm) < 0);
    assert_int_equal(warm.calls, 1);
    assert_true(bench_time_calls(flexdiag__kernels_cpu(), s, 4, counted_call, &timed) < 0);
    assert_int_equal(timed.calls, 3);
    flexdiag__kernels_cpu()->stream_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_call_all_repeats),
        cmocka_unit_test(test_slow_call_cut),
        cmocka_unit_test(test_failing_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
