/*
 * test_api_shared.c - the public C API as an embedding program sees it: only <flexdiag.h>,
 * linked against the shared library (libflexdiag.so), so every function used here must be
 * exported. One throughput-backend session on the builtin micro-janus model on the CPU under
 * a 32 MiB budget: API version, the largest batch that fits (flexdiag_context_max_images) and
 * a context of that size, one more image refused with a message, a Diagonal generation of two
 * prompts (ids inside the image vocabulary), stats, and the decoded pixels finite.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "flexdiag.h"

static void test_session(void **state) {
    (void)state;
    assert_int_equal(flexdiag_api_version(), FLEXDIAG_API_VERSION);
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.gpu_mem = 32ull << 20;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);

    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_prompt_len = 32;
    cp.policy.kind = FLEXDIAG_POLICY_DIAGONAL;
    cp.policy.sparsity = 0.5;
    int32_t fit = 0;
    assert_int_equal(flexdiag_context_max_images(m, &cp, &fit), FLEXDIAG_OK);
    assert_true(fit >= 2);
    flexdiag_context *c = NULL;
    cp.max_images = fit + 1;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_OOM_DEVICE);
    assert_null(c);
    assert_non_null(strstr(flexdiag_last_error(NULL), "largest batch that fits"));
    cp.max_images = fit;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);

    const char *prompts[2] = {"a red apple", "a blue car"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 2;
    rq.prompts = prompts;
    rq.seed = 7;
    flexdiag_output out = {0};
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_OK); /* sizes only */
    assert_int_equal(out.n_images, 2);
    assert_int_equal(out.tokens_per_image, 64);
    out.tokens = malloc((size_t)out.n_images * (size_t)out.tokens_per_image * 4);
    assert_non_null(out.tokens);
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_OK);
    for (int32_t i = 0; i < out.n_images * out.tokens_per_image; i++)
        assert_true(out.tokens[i] >= 0 && out.tokens[i] < 1024); /* micro-janus image codes */
    flexdiag_stats st;
    assert_int_equal(flexdiag_context_stats(c, &st), FLEXDIAG_OK);
    assert_true(st.tokens_generated > 0 && st.peak_device_bytes > 0 && st.kv_bytes_per_seq > 0);

    int32_t h = 0, w = 0;
    assert_int_equal(flexdiag_model_image_size(m, &h, &w), FLEXDIAG_OK);
    assert_true(h > 0 && w > 0);
    float *px = malloc((size_t)out.n_images * (size_t)h * (size_t)w * 3 * sizeof *px);
    assert_non_null(px);
    assert_int_equal(flexdiag_decode_images(m, out.tokens, out.n_images, px), FLEXDIAG_OK);
    for (size_t i = 0; i < (size_t)out.n_images * (size_t)h * (size_t)w * 3; i++)
        assert_true(isfinite(px[i]));
    free(px);
    free(out.tokens);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_session)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
