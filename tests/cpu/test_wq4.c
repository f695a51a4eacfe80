/*
 * test_wq4.c - 4-bit group weights (kernels.h flexdiag_op_wq4_unpack, flexdiag__wq4_pack): the
 * packer's error bound (half a step plus the rounding of min, per group), constant and
 * two-valued groups exact, its refusals (NaN, Inf, values beyond the half range, rows that are
 * not whole groups), and every backend's unpack equal to the plain C reference bit for bit:
 * the CPU tables here, CUDA on GPU hosts (odd row counts, an output offset by one value so the
 * 16-byte stores cannot be used, and a 7B-sized row of 11008 values).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/kernels.h"
#include "util.h"

/* rows x cols bf16 values: normal(0, scale) from seed, with group g of row 0 constant and
 * group 1 of row 0 holding two values only (when there are such groups). */
static uint16_t *weights(int64_t rows, int64_t cols, float scale, uint64_t seed) {
    uint16_t *w = malloc((size_t)(rows * cols) * sizeof *w);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < rows * cols; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u1 = ((x >> 11) + 0.5) / 9007199254740992.0;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u2 = ((x >> 11) + 0.5) / 9007199254740992.0;
        w[i] = flexdiag__f32_to_bf16((float)(scale * sqrt(-2 * log(u1)) * cos(6.283185307 * u2)));
    }
    for (int i = 0; i < FLEXDIAG_WQ4_GROUP && cols >= 2 * FLEXDIAG_WQ4_GROUP; i++) {
        w[i] = flexdiag__f32_to_bf16(0.375f);
        w[FLEXDIAG_WQ4_GROUP + i] = flexdiag__f32_to_bf16(i % 2 ? -0.5f : 0.25f);
    }
    return w;
}

static void test_pack_bound(void **state) {
    (void)state;
    const int64_t rows = 5, cols = 256;
    uint16_t *w = weights(rows, cols, 0.02f, 1), *back = malloc((size_t)(rows * cols) * 2);
    uint8_t *p = malloc(rows * flexdiag__wq4_row_bytes(cols));
    assert_int_equal(flexdiag__wq4_row_bytes(cols), 144); /* 4.5 bits a value */
    assert_int_equal(flexdiag__wq4_pack(p, w, rows, cols, "t"), FLEXDIAG_OK);
    assert_int_equal(flexdiag__cpu_wq4_unpack(back, p, rows, cols, NULL), FLEXDIAG_OK);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < cols / FLEXDIAG_WQ4_GROUP; g++) {
            const uint16_t *x = w + r * cols + g * FLEXDIAG_WQ4_GROUP;
            float lo = INFINITY, hi = -INFINITY;
            for (int i = 0; i < FLEXDIAG_WQ4_GROUP; i++) {
                lo = fminf(lo, flexdiag__bf16_to_f32(x[i]));
                hi = fmaxf(hi, flexdiag__bf16_to_f32(x[i]));
            }
            /* half a step, the half rounding of min and step, one bf16 rounding */
            float tol = (hi - lo) / 30 * 1.01f + fabsf(lo) * 1e-3f + 16 * fabsf(hi - lo) * 1e-3f +
                        fmaxf(fabsf(lo), fabsf(hi)) * (1.0f / 128);
            for (int i = 0; i < FLEXDIAG_WQ4_GROUP; i++) {
                float a = flexdiag__bf16_to_f32(x[i]);
                float b = flexdiag__bf16_to_f32(back[r * cols + g * FLEXDIAG_WQ4_GROUP + i]);
                if (fabsf(a - b) > tol)
                    fail_msg("row %lld group %lld value %d: %g back as %g (tolerance %g)",
                             (long long)r, (long long)g, i, a, b, tol);
            }
        }
    for (int i = 0; i < 2 * FLEXDIAG_WQ4_GROUP; i++) /* exact groups */
        assert_int_equal(back[i], w[i]);
    free(w);
    free(back);
    free(p);
}

static void test_pack_refusals(void **state) {
    (void)state;
    uint16_t w[2 * FLEXDIAG_WQ4_GROUP] = {0};
    uint8_t p[2 * 36];
    assert_int_equal(flexdiag__wq4_pack(p, w, 1, 96, "blk.0.w"), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "blk.0.w"));
    w[3] = flexdiag__f32_to_bf16(NAN);
    assert_int_equal(flexdiag__wq4_pack(p, w, 1, 64, "t"), FLEXDIAG_ERR_INVALID_ARG);
    w[3] = flexdiag__f32_to_bf16(INFINITY);
    assert_int_equal(flexdiag__wq4_pack(p, w, 1, 64, "t"), FLEXDIAG_ERR_INVALID_ARG);
    w[3] = flexdiag__f32_to_bf16(1e6f);
    assert_int_equal(flexdiag__wq4_pack(p, w, 1, 64, "t"), FLEXDIAG_ERR_INVALID_ARG);
    w[3] = flexdiag__f32_to_bf16(6e4f); /* in range: the step is 4000 */
    assert_int_equal(flexdiag__wq4_pack(p, w, 1, 64, "t"), FLEXDIAG_OK);
    flexdiag__err_clear();
}

/* The backend's unpack against the reference, for rows x cols at an output offset of off
 * values. */
static void check_shape(const flexdiag_kernels *k, int64_t rows, int64_t cols, int64_t off) {
    uint16_t *w = weights(rows, cols, 0.05f, (uint64_t)(rows * 7 + cols));
    size_t pb = (size_t)rows * flexdiag__wq4_row_bytes(cols), ob = (size_t)(rows * cols + off) * 2;
    uint8_t *p = malloc(pb);
    uint16_t *ref = malloc(ob), *got = malloc(ob);
    assert_int_equal(flexdiag__wq4_pack(p, w, rows, cols, "t"), FLEXDIAG_OK);
    assert_int_equal(flexdiag__cpu_wq4_unpack(ref, p, rows, cols, NULL), FLEXDIAG_OK);
    flexdiag_stream *s = NULL;
    void *dp = NULL, *dout = NULL;
    assert_int_equal(k->stream_create(0, 1, &s), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(pb, &dp), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(ob, &dout), FLEXDIAG_OK);
    assert_int_equal(k->copy_h2d(dp, p, pb, s), FLEXDIAG_OK);
    assert_int_equal(k->wq4_unpack((uint16_t *)dout + off, dp, rows, cols, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(got, dout, ob, s), FLEXDIAG_OK);
    assert_memory_equal(got + off, ref, (size_t)(rows * cols) * 2);
    k->mem_free(dp);
    k->mem_free(dout);
    k->stream_destroy(s);
    free(w);
    free(p);
    free(ref);
    free(got);
}

static void check(const flexdiag_kernels *k) {
    check_shape(k, 1, 64, 0);
    check_shape(k, 7, 192, 0);
    check_shape(k, 33, 128, 1);
    check_shape(k, 3, 11008, 0);
    check_shape(k, 300, 4096, 8);
}

static void test_cpu(void **state) {
    (void)state;
    tu_on_table(0, check);
    tu_on_table(1, check);
}

static void test_cuda(void **state) {
    (void)state;
    tu_on_table(2, check);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_bound),
        cmocka_unit_test(test_pack_refusals),
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
