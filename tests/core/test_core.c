/*
 * test_core.c - core helpers: bf16/f16 conversion, error message stacking, the counter-based
 * RNG's independence from call order.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/core.h"

static void test_bf16_round_trip(void **state) {
    (void)state;
    assert_int_equal(flexdiag__f32_to_bf16(1.0f), 0x3f80);
    assert_true(flexdiag__bf16_to_f32(0x3f80) == 1.0f);
    /* 1 + 2^-8 is exactly halfway between bf16 neighbours: ties to even -> 1.0 */
    assert_int_equal(flexdiag__f32_to_bf16(1.00390625f), 0x3f80);
    assert_int_equal(flexdiag__f32_to_bf16(1.01171875f), 0x3f82); /* halfway, odd lower -> up */
    assert_true(isnan(flexdiag__bf16_to_f32(flexdiag__f32_to_bf16(NAN))));
    assert_true(isinf(flexdiag__bf16_to_f32(flexdiag__f32_to_bf16(INFINITY))));
}

static void test_f16(void **state) {
    (void)state;
    assert_true(flexdiag__f16_to_f32(0x3c00) == 1.0f);
    assert_true(flexdiag__f16_to_f32(0xc000) == -2.0f);
    assert_true(flexdiag__f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(isinf(flexdiag__f16_to_f32(0x7c00)));
    assert_true(isnan(flexdiag__f16_to_f32(0x7e00)));
}

/* Every finite half goes through float and back unchanged; the float halfway between two
 * neighbouring halves rounds to the even one; beyond 65504 + half an ulp is Inf. */
static void test_f32_to_f16(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7c00u) == 0x7c00u) continue; /* Inf, NaN */
        assert_int_equal(flexdiag__f32_to_f16(flexdiag__f16_to_f32((uint16_t)h)), h);
        uint32_t next = h + 1;
        if ((h & 0x7fffu) == 0x7bffu || (next & 0x7fffu) == 0) continue;
        float lo = flexdiag__f16_to_f32((uint16_t)h), hi = flexdiag__f16_to_f32((uint16_t)next);
        float mid = lo + (hi - lo) / 2; /* exact: halves have 11 significant bits */
        assert_int_equal(flexdiag__f32_to_f16(mid), (h & 1u) ? next : h);
    }
    assert_int_equal(flexdiag__f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(flexdiag__f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(flexdiag__f32_to_f16(-1e9f), 0xfc00);
    assert_int_equal(flexdiag__f32_to_f16(ldexpf(1.0f, -25)), 0); /* halfway to 2^-24: even */
    assert_int_equal(flexdiag__f32_to_f16(ldexpf(1.5f, -25)), 1);
    assert_true(isnan(flexdiag__f16_to_f32(flexdiag__f32_to_f16(NAN))));
}

static void test_errors(void **state) {
    (void)state;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__err(FLEXDIAG_ERR_IO, "read %s", "x"), FLEXDIAG_ERR_IO);
    flexdiag__err(FLEXDIAG_ERR_IO, "second message is ignored");
    flexdiag__err_prefix(FLEXDIAG_ERR_IO, "file %s", "a.safetensors");
    assert_string_equal(flexdiag_last_error(NULL), "file a.safetensors: read x");
    flexdiag__err_clear();
    assert_string_equal(flexdiag_last_error(NULL), "");
    assert_string_equal(flexdiag_status_str(FLEXDIAG_ERR_CORRUPT_MODEL), "corrupt model file");
}

static void test_rng(void **state) {
    (void)state;
    double a = flexdiag__rng_uniform(7, 3, 11), b = flexdiag__rng_uniform(7, 3, 11);
    assert_true(a == b && a >= 0 && a < 1);
    assert_true(flexdiag__rng_uniform(7, 3, 12) != a);
    assert_true(flexdiag__rng_uniform(7, 4, 11) != a);
    double mean = 0;
    for (int i = 0; i < 100000; i++) mean += flexdiag__rng_uniform(1, (uint64_t)i, 0);
    assert_true(fabs(mean / 100000 - 0.5) < 0.01);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_round_trip),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_f32_to_f16),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_rng),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
