/*
 * test_weight_cut.c - the cuts of a weight placement (offload/weight_homes.h) on the full
 * Janus-Pro-7B, Llama-2-7B and OPT layer layouts: every requested G,C,D in steps of 1 % is realised
 * within 1 % per tier (a row is at most 22 KiB of a 405 MB layer), each cut falls on a row
 * boundary of the tensor it lands in (or in padding), the tiers add up to the layer, and a
 * placement that does not add up to 100 is refused naming it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "runtime/model/model.h"

/* The cut is on a row boundary of the span it falls strictly inside, if any. */
static void on_row(const flexdiag_wspan *lt, size_t cut) {
    for (int i = 0; i < FLEXDIAG_LT_COUNT; i++)
        if (cut > lt[i].off && cut < lt[i].off + lt[i].bytes)
            assert_int_equal((cut - lt[i].off) % lt[i].row_bytes, 0);
}

static void check_arch(const char *arch) {
    flexdiag_model_config cfg;
    assert_int_equal(flexdiag__config_builtin(arch, &cfg), FLEXDIAG_OK);
    double worst = 0;
    for (uint32_t g = 0; g <= 100; g += 1)
        for (uint32_t c = 0; g + c <= 100; c += 7) {
            uint32_t pct[3] = {g, c, 100 - g - c};
            flexdiag_wcut cut;
            uint64_t bytes[3];
            assert_int_equal(flexdiag__weights_plan(&cfg, pct, 0, bytes, &cut), FLEXDIAG_OK);
            size_t sum = 0;
            for (int t = 0; t < 3; t++) {
                size_t b = flexdiag__wcut_bytes(&cut, t);
                double got = 100.0 * (double)b / (double)cut.layer_bytes;
                double err = got > pct[t] ? got - pct[t] : pct[t] - got;
                if (err > worst) worst = err;
                assert_true(err <= 1.0);
                sum += b;
            }
            assert_int_equal(sum, cut.layer_bytes);
            assert_true(cut.split_start <= cut.cut[0]);
        }
    printf("  %s: worst realised error %.4f %% over every G and C in steps of 1 and 7\n", arch,
           worst);
}

static void test_realised_within_one_percent(void **state) {
    (void)state;
    check_arch("janus-pro-7b");
    check_arch("llama-2-7b");
    check_arch("micro-janus");
    check_arch("opt-6.7b"); /* biases and LayerNorm biases: twelve tensors per block */
    check_arch("micro-opt");
}

static void test_row_boundaries(void **state) {
    (void)state;
    flexdiag_model_config cfg;
    assert_int_equal(flexdiag__config_builtin("janus-pro-7b", &cfg), FLEXDIAG_OK);
    /* the spans as the weight layout gives them, through a plan at 100 % (no cut) */
    const int64_t d = 4096, f = 11008;
    for (uint32_t g = 1; g < 100; g += 3) {
        uint32_t pct[3] = {g, 100 - g, 0};
        flexdiag_wcut cut;
        assert_int_equal(flexdiag__weights_plan(&cfg, pct, 0, NULL, &cut), FLEXDIAG_OK);
        flexdiag_wspan lt[FLEXDIAG_LT_COUNT] = {
            {0, 0, 1, 0}, {0, 0, 1, 0}, {0, 0, 1, 0}, {0, 0, 1, 0}, {0, 0, 1, 0}, {0, 0, 1, 0}};
        /* rebuild the spans from the layout rule: 256-byte aligned tensors in block order */
        size_t off = 0, sz[6] = {(size_t)d * 2, (size_t)(3 * d) * d * 2, (size_t)d * d * 2,
                                 (size_t)d * 2, (size_t)(2 * f) * d * 2, (size_t)d * f * 2};
        size_t row[6] = {(size_t)d * 2, (size_t)d * 2, (size_t)d * 2, (size_t)d * 2,
                         (size_t)d * 2, (size_t)f * 2};
        for (int i = 0; i < 6; i++) {
            off = (off + 255) / 256 * 256;
            lt[i] = (flexdiag_wspan){off, sz[i], row[i], 0};
            off += sz[i];
        }
        assert_int_equal((off + 255) / 256 * 256, cut.layer_bytes);
        on_row(lt, cut.cut[0]);
    }
}

/* Under compression the pieces of the streamed bytes cover [cut0, layer_bytes) in order, each
 * packed where its predecessors end, the matrices at 9/32 of their bytes (4.5 bits a value),
 * packed offsets congruent to block offsets modulo 4 (the device reads codes 4 bytes at a
 * time), and the tiers' bytes are the packed ones. */
static void check_packed(const char *arch) {
    flexdiag_model_config cfg;
    assert_int_equal(flexdiag__config_builtin(arch, &cfg), FLEXDIAG_OK);
    for (uint32_t g = 0; g < 100; g += 9) {
        uint32_t pct[3] = {g, (100 - g) / 2, 100 - g - (100 - g) / 2};
        flexdiag_wcut cut;
        uint64_t bytes[3];
        assert_int_equal(flexdiag__weights_plan(&cfg, pct, 1, bytes, &cut), FLEXDIAG_OK);
        assert_true(cut.q4);
        flexdiag_wpiece pc[FLEXDIAG_WPIECES_MAX];
        int n = flexdiag__wcut_pieces(&cut, pc);
        size_t x = cut.cut[0], px = cut.pk[0], matrices = 0;
        for (int i = 0; i < n; i++) {
            assert_int_equal(pc[i].off, x);
            assert_int_equal(pc[i].poff, px);
            assert_int_equal(pc[i].poff % 4, pc[i].off % 4);
            size_t pb = pc[i].bytes;
            if (pc[i].pack) {
                assert_int_equal(pc[i].bytes, (size_t)(pc[i].rows * pc[i].cols * 2));
                pb = (size_t)pc[i].rows * flexdiag__wq4_row_bytes(pc[i].cols);
                assert_int_equal(pb * 32, pc[i].bytes * 9);
                matrices += pc[i].bytes;
            }
            x += pc[i].bytes;
            px += pb;
        }
        assert_int_equal(x, cut.layer_bytes);
        assert_int_equal(px, cut.pk[2]);
        assert_int_equal(flexdiag__wcut_bytes(&cut, 1) + flexdiag__wcut_bytes(&cut, 2),
                         cut.pk[2] - cut.pk[0]);
        assert_int_equal(bytes[1], (uint64_t)cfg.lm.layers * (cut.pk[1] - cut.pk[0]));
        assert_true(matrices > (cut.layer_bytes - cut.cut[0]) * 9 / 10); /* norms are small */
    }
}

static void test_packed(void **state) {
    (void)state;
    check_packed("janus-pro-7b");
    check_packed("opt-6.7b");
    check_packed("llama-2-7b");
}

static void test_refused(void **state) {
    (void)state;
    flexdiag_wspan lt[1] = {{0, 4096, 64, 0}};
    flexdiag_wcut cut;
    const uint32_t bad[3] = {50, 40, 5};
    assert_int_equal(flexdiag__wcut_make(lt, 1, 4096, bad, 0, &cut), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "50,40,5"));
    const uint32_t ok[3] = {50, 25, 25};
    assert_int_equal(flexdiag__wcut_make(lt, 1, 4096, ok, 0, &cut), FLEXDIAG_OK);
    assert_int_equal(cut.cut[0], 2048);
    assert_int_equal(cut.cut[1], 3072);
    assert_int_equal(flexdiag__wcut_disk_stride(&cut), 4096);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_realised_within_one_percent),
        cmocka_unit_test(test_row_boundaries),
        cmocka_unit_test(test_packed),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
