/*
 * test_synthetic.c - the synthetic grid locality model and the synthetic fidelity runner.
 *
 * 1. Diagonal stripes (paper Fig. 9): over many queries, the lags with the highest median logit
 *    are 1 and W, then W - 1 and W + 1, on grid:8 and grid:24.
 * 2. Values are a pure function of (seed, head, t, key): filling twice, or asking one entry,
 *    gives the same numbers; another seed differs; prompt keys carry the constant logit.
 * 3. "grid:W" parsing and its error message.
 * 4. The fidelity runner on grid:8 at sparsity 0.9: every error finite, dense exactly 0, every
 *    sparse policy > 0; resident rows/bytes and eviction counts as the ring sizes imply.
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
#include "policy/kv_policy.h"
#include "policy/synthetic.h"

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median logit of each lag 1..max_lag over heads and queries t >= 2W. */
static void lag_medians(const flexdiag_synth_params *p, int32_t max_lag, float *med) {
    int32_t n = 0, w = p->grid_w;
    float *v = malloc(sizeof(float) * (size_t)(p->heads * p->steps));
    for (int32_t lag = 1; lag <= max_lag; lag++) {
        n = 0;
        for (int32_t h = 0; h < p->heads; h++)
            for (int32_t t = 2 * w; t < p->steps; t++)
                v[n++] = flexdiag__synth_logit(p, h, t, p->prompt_len + t - lag);
        qsort(v, (size_t)n, sizeof(float), cmp_float);
        med[lag] = v[n / 2];
    }
    free(v);
}

static void check_stripes(int32_t w) {
    flexdiag_synth_params p;
    flexdiag__synth_params_init(&p, w);
    p.heads = 2;
    float med[3 * 64 + 1];
    int32_t max_lag = 3 * w, top[4];
    lag_medians(&p, max_lag, med);
    for (int k = 0; k < 4; k++) { /* the four best lags, best first */
        top[k] = 0;
        for (int32_t lag = 1; lag <= max_lag; lag++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= top[j] == lag;
            if (!taken && (top[k] == 0 || med[lag] > med[top[k]])) top[k] = lag;
        }
    }
    /* {1, W} first (distance 1), then {W-1, W+1} (distance sqrt 2) */
    assert_true((top[0] == 1 && top[1] == w) || (top[0] == w && top[1] == 1));
    assert_true((top[2] == w - 1 && top[3] == w + 1) || (top[2] == w + 1 && top[3] == w - 1));
    assert_true(med[w] > med[w / 2] + 2.0f * (float)p.alpha); /* a clear stripe, not noise */
}

static void test_stripes(void **state) {
    (void)state;
    check_stripes(8);
    check_stripes(24);
}

static void test_determinism(void **state) {
    (void)state;
    flexdiag_synth_params p;
    flexdiag__synth_params_init(&p, 5);
    p.heads = 3;
    p.prompt_len = 4;
    p.prompt_logit = 1.25;
    size_t n = (size_t)p.heads * (size_t)p.steps * (size_t)(p.prompt_len + p.steps);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    assert_int_equal(flexdiag__synth_fill(&p, a), FLEXDIAG_OK);
    assert_int_equal(flexdiag__synth_fill(&p, b), FLEXDIAG_OK);
    assert_memory_equal(a, b, n * sizeof(float));
    size_t keys = (size_t)(p.prompt_len + p.steps);
    for (int32_t h = p.heads - 1; h >= 0; h--) /* reverse order: same values */
        for (int32_t t = p.steps - 1; t >= 0; t -= 3)
            for (int32_t k = (int32_t)keys - 1; k >= 0; k -= 2)
                assert_true(flexdiag__synth_logit(&p, h, t, k) ==
                            a[((size_t)h * (size_t)p.steps + (size_t)t) * keys + (size_t)k]);
    for (int32_t k = 0; k < p.prompt_len; k++) assert_true(a[k] == 1.25f);
    p.seed = 2;
    assert_int_equal(flexdiag__synth_fill(&p, b), FLEXDIAG_OK);
    assert_true(memcmp(a, b, n * sizeof(float)) != 0);
    p.sigma = -1.0;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__synth_fill(&p, b), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    free(a);
    free(b);
}

static void test_parse(void **state) {
    (void)state;
    int32_t w = 0;
    assert_int_equal(flexdiag__synth_parse("grid:24", &w), FLEXDIAG_OK);
    assert_int_equal(w, 24);
    static const char *bad[] = {"grid:0", "grid:65", "grid:x", "grid:", "grid", "24", "grid:8x"};
    for (int i = 0; i < 7; i++) {
        flexdiag__err_clear();
        assert_int_equal(flexdiag__synth_parse(bad[i], &w), FLEXDIAG_ERR_INVALID_ARG);
        assert_non_null(strstr(flexdiag_last_error(NULL), "expected grid:W"));
    }
    flexdiag__err_clear();
}

static void test_fidelity_grid8(void **state) {
    (void)state;
    flexdiag_synth_params sp;
    flexdiag__synth_params_init(&sp, 8);
    sp.heads = 4;
    const int32_t d = 16;
    flexdiag_synth_ctx *ctx = NULL;
    assert_int_equal(flexdiag__synth_ctx_create(&sp, d, &ctx), FLEXDIAG_OK);
    for (int kind = 0; kind < 8; kind++) {
        flexdiag_policy_params pub = {sizeof pub, (flexdiag_policy_kind)kind, 0, 0, 0.9};
        flexdiag_kvp_params kp;
        assert_int_equal(flexdiag__kvp_resolve(&pub, sp.steps, &kp), FLEXDIAG_OK);
        flexdiag_synth_fidelity f;
        assert_int_equal(flexdiag__synth_run(ctx, &kp, &f), FLEXDIAG_OK);
        assert_true(isfinite(f.attn_err) && isfinite(f.attn_err_max));
        assert_true(f.attn_err <= f.attn_err_max);
        if (kind == FLEXDIAG_POLICY_DENSE) {
            assert_true(f.attn_err == 0.0 && f.attn_err_max == 0.0);
        } else {
            assert_int_equal(kp.n_att, 6); /* lround(0.1 * 64) */
            assert_true(f.attn_err > 0.0);
        }
        int64_t rows = sp.prompt_len + flexdiag__kvp_resident_rows(&kp, sp.steps - 1);
        assert_int_equal(f.resident_rows, rows);
        assert_int_equal(f.resident_bytes, (uint64_t)rows * (uint64_t)sp.heads * 2u * d * 2u);
        int32_t over = sp.steps - flexdiag__kvp_ring_rows(&kp);
        if (kind == FLEXDIAG_POLICY_DENSE || kind == FLEXDIAG_POLICY_ALISA)
            assert_int_equal(f.evictions, 0);
        else /* one overwrite per head and step once the ring is full (sinks included in R) */
            assert_int_equal(f.evictions, (uint64_t)over * (uint64_t)sp.heads);
    }
    flexdiag_kvp_params bad = {FLEXDIAG_POLICY_WINDOW, 4, 0, 63, 1, 1, 1, 1, 0, 0, NULL};
    flexdiag__err_clear();
    assert_int_equal(flexdiag__synth_run(ctx, &bad, &(flexdiag_synth_fidelity){0}),
                     FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    flexdiag__synth_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stripes),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_fidelity_grid8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
