/*
 * test_oom_cuda.c - running out of device memory is a status, not a crash, and the runtime stays
 * usable. A test "hog" takes (almost) all free device memory through the kernel table, outside
 * the runtime's budget, so the runtime's own sizing still says everything fits and the failures
 * come from the real allocations:
 *   1. a context created while the device is full fails with FLEXDIAG_ERR_OOM_DEVICE and a message
 *      naming the device and the bytes;
 *   2. a context created before the hog, run for the first time while the device is full (its
 *      decode-step graph is recorded then), either gives the reference tokens or returns a status
 *      with a message - never a crash or a sticky CUDA error;
 *   3. with the hog released, the same runtime and model create a smaller context whose tokens
 *      equal those of a context of that size made before the hog, bit for bit, and the earlier
 *      context runs again and gives the reference tokens.
 * The model is the builtin micro-janus (seeded random weights). Exit 77 without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "flexdiag.h"
#include "kernels/kernels.h"

#define HOG_MAX 4096 /* blocks of the hog: 64 GiB-1 MiB steps cover any device */

typedef struct hog {
    void *p[HOG_MAX];
    int n;
} hog;

/* Take device memory in halving block sizes until even 1 MiB fails: the device is full. */
static void hog_fill(const flexdiag_kernels *k, hog *h) {
    for (size_t block = (size_t)64 << 30; block >= ((size_t)1 << 20) && h->n < HOG_MAX;) {
        void *p = NULL;
        if (k->mem_alloc(block, &p) == FLEXDIAG_OK && p) h->p[h->n++] = p;
        else block /= 2;
    }
}

static void hog_free(const flexdiag_kernels *k, hog *h) {
    for (int i = 0; i < h->n; i++) k->mem_free(h->p[i]);
    h->n = 0;
}

static flexdiag_context *context(flexdiag_model *m, int32_t images, flexdiag_status *st) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = images;
    cp.max_prompt_len = 32;
    cp.policy.kind = FLEXDIAG_POLICY_DIAGONAL;
    cp.policy.sparsity = 0.75;
    flexdiag_context *c = NULL;
    *st = flexdiag_context_create(m, &cp, &c);
    return c;
}

/* images tokens of one prompt; out holds images * per_image ids. */
static flexdiag_status run(flexdiag_context *c, int32_t images, int32_t *out) {
    static const char *prompts[1] = {"a red apple"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = prompts;
    rq.images_per_prompt = images;
    rq.seed = 7;
    flexdiag_output o = {0};
    o.tokens = out;
    return flexdiag_generate(c, &rq, &o);
}

static void test_oom(void **state) {
    (void)state;
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = 0;
    rp.gpu_mem = (uint64_t)2 << 30;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    mp.seed = 5;
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);
    enum { BIG = 8, SMALL = 2, PER = 64 }; /* micro-janus: 8x8 tokens per image */
    int32_t ref[BIG * PER], ref_small[SMALL * PER], got[BIG * PER];
    flexdiag_status st;

    flexdiag_context *c = context(m, SMALL, &st);
    assert_int_equal(st, FLEXDIAG_OK);
    assert_int_equal(run(c, SMALL, ref_small), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    c = context(m, BIG, &st);
    assert_int_equal(st, FLEXDIAG_OK);
    flexdiag_context *pre = context(m, BIG, &st); /* made before the hog, first run under it */
    assert_int_equal(st, FLEXDIAG_OK);
    assert_int_equal(run(c, BIG, ref), FLEXDIAG_OK);
    flexdiag_context_destroy(c);

    hog *h = calloc(1, sizeof *h);
    assert_non_null(h);
    hog_fill(k, h);
    size_t fb = 0, tb = 0;
    assert_int_equal(k->mem_info(&fb, &tb), FLEXDIAG_OK);
    fprintf(stderr, "test_oom_cuda: hog holds %d blocks; %.1f MiB free of %.1f GiB\n", h->n,
            (double)fb / (1 << 20), (double)tb / (1 << 30));

    c = context(m, BIG, &st); /* 1: creation while the device is full */
    fprintf(stderr, "test_oom_cuda: context under a full device: %s (%s)\n",
            flexdiag_status_str(st), flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_ERR_OOM_DEVICE);
    assert_null(c);
    assert_non_null(strstr(flexdiag_last_error(NULL), "bytes"));

    memset(got, 0xff, sizeof got); /* 2: first run of a context while the device is full */
    st = run(pre, BIG, got);
    fprintf(stderr, "test_oom_cuda: first run under a full device: %s%s%s\n",
            flexdiag_status_str(st), st ? ": " : "", st ? flexdiag_last_error(NULL) : "");
    if (st == FLEXDIAG_OK) assert_memory_equal(got, ref, sizeof ref);
    else assert_true(st == FLEXDIAG_ERR_OOM_DEVICE || st == FLEXDIAG_ERR_CUDA);

    hog_free(k, h); /* 3: usable again */
    free(h);
    c = context(m, SMALL, &st);
    assert_int_equal(st, FLEXDIAG_OK);
    memset(got, 0xff, sizeof got);
    assert_int_equal(run(c, SMALL, got), FLEXDIAG_OK);
    assert_memory_equal(got, ref_small, sizeof ref_small);
    flexdiag_context_destroy(c);
    memset(got, 0xff, sizeof got);
    assert_int_equal(run(pre, BIG, got), FLEXDIAG_OK);
    assert_memory_equal(got, ref, sizeof ref);
    flexdiag_context_destroy(pre);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

int main(void) {
    size_t fb = 0, tb = 0;
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    if (!k || k->mem_info(&fb, &tb) != FLEXDIAG_OK || tb == 0) {
        fprintf(stderr, "test_oom_cuda: no CUDA backend or device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_oom)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
