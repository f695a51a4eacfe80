/*
 * test_api_shared.c - the public C API as an embedding program sees it: only <flexdiag.h>,
 * linked against the shared library (libflexdiag.so), so every function used here must be
 * exported. One throughput-backend session on the builtin micro-janus model on the CPU under
 * a 32 MiB budget: API version, the largest batch that fits (flexdiag_context_max_images) and
 * a context of that size, one more image refused with a message, a Diagonal generation of two
 * prompts (ids inside the image vocabulary), stats, and the decoded pixels finite. API version 3:
 * policy names both ways, the context's resolved policy, teacher-forced scoring (size query, CFG
 * logits = uncond + w (cond - uncond) of the raw rows) and the library version.
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
#include "flexdiag_version.h"

static void test_session(void **state) {
    (void)state;
    assert_int_equal(flexdiag_api_version(), FLEXDIAG_API_VERSION);
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.gpu_mem = 32ull << 20;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    uint64_t budget = 0;
    assert_int_equal(flexdiag_runtime_budget(rt, &budget), FLEXDIAG_OK);
    assert_true(budget == 32ull << 20); /* gpu_mem; 0 would mean no budget */
    flexdiag_runtime_params none = rp;
    none.gpu_mem = 0;
    flexdiag_runtime *unbounded = NULL;
    assert_int_equal(flexdiag_runtime_create(&none, &unbounded), FLEXDIAG_OK);
    assert_int_equal(flexdiag_runtime_budget(unbounded, &budget), FLEXDIAG_OK);
    assert_true(budget == 0); /* the CPU engine without gpu_mem */
    flexdiag_runtime_destroy(unbounded);
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

static void test_policy_names(void **state) {
    (void)state;
    int k = 0;
    for (; flexdiag_policy_name((flexdiag_policy_kind)k); k++) {
        flexdiag_policy_kind back = FLEXDIAG_POLICY_DENSE;
        assert_int_equal(flexdiag_policy_from_name(flexdiag_policy_name((flexdiag_policy_kind)k),
                                                   &back),
                         FLEXDIAG_OK);
        assert_int_equal(back, k);
    }
    assert_int_equal(k, FLEXDIAG_POLICY_HACK + 1);
    assert_string_equal(flexdiag_policy_name(FLEXDIAG_POLICY_DIAGONAL_SINK4), "diagonal-sink4");
    assert_string_equal(flexdiag_policy_name(FLEXDIAG_POLICY_LINE_AR), "line-ar");
    assert_string_equal(flexdiag_policy_name(FLEXDIAG_POLICY_SSD), "ssd");
    assert_string_equal(flexdiag_policy_name(FLEXDIAG_POLICY_HACK), "hack");
    assert_null(flexdiag_policy_name((flexdiag_policy_kind)-1));
    assert_null(flexdiag_policy_name((flexdiag_policy_kind)0x100)); /* the internal collector */
    flexdiag_policy_kind kind;
    assert_int_equal(flexdiag_policy_from_name("nope", &kind), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "'nope'"));
    assert_non_null(strstr(flexdiag_last_error(NULL), "diagonal-sink4"));
    assert_string_equal(flexdiag_version(), FLEXDIAG_VERSION_STRING);
}

/* A micro-janus context on the CPU with policy pp and room for one image. */
static void open_ctx(const flexdiag_policy_params *pp, flexdiag_runtime **rt, flexdiag_model **m,
                     flexdiag_context **c) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    assert_int_equal(flexdiag_model_load(*rt, NULL, &mp, m), FLEXDIAG_OK);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = 8;
    cp.policy = *pp;
    assert_int_equal(flexdiag_context_create(*m, &cp, c), FLEXDIAG_OK);
}

static void test_context_policy(void **state) {
    (void)state;
    flexdiag_policy_params pp;
    flexdiag_policy_params_init(&pp);
    pp.kind = FLEXDIAG_POLICY_DIAGONAL;
    pp.sparsity = 0.5;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    flexdiag_context *c;
    open_ctx(&pp, &rt, &m, &c);
    flexdiag_policy_info pi = {0};
    assert_int_equal(flexdiag_context_policy(c, &pi), FLEXDIAG_ERR_INVALID_ARG); /* no size */
    pi.struct_size = sizeof pi;
    assert_int_equal(flexdiag_context_policy(c, &pi), FLEXDIAG_OK);
    assert_int_equal(pi.kind, FLEXDIAG_POLICY_DIAGONAL);
    assert_int_equal(pi.l_dec, 64); /* micro-janus: 8x8 tokens */
    assert_int_equal(pi.n_att, 32);
    assert_int_equal(pi.n_r, 32);
    assert_true(fabs(pi.sparsity - 0.5) < 1e-12);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

static void test_score(void **state) {
    (void)state;
    flexdiag_policy_params pp;
    flexdiag_policy_params_init(&pp);
    flexdiag_runtime *rt;
    flexdiag_model *m;
    flexdiag_context *c;
    open_ctx(&pp, &rt, &m, &c);
    const int32_t prompt[4] = {1, 97, 98, 2};
    int32_t ids[64];
    flexdiag_score_request rq;
    flexdiag_score_request_init(&rq);
    assert_true(rq.cfg_weight == 5.0f);
    rq.prompt_ids = prompt;
    rq.prompt_len = 4;
    rq.ids = ids;
    rq.n = 64;
    flexdiag_score_output so = {.struct_size = sizeof so};
    assert_int_equal(flexdiag_score(c, &rq, &so), FLEXDIAG_OK); /* size query */
    assert_int_equal(so.vocab, 256); /* micro-janus image codes */
    assert_int_equal(so.rows, 2);      /* conditional, unconditional */
    for (int i = 0; i < 64; i++) ids[i] = (i * 37) % so.vocab;
    size_t n = (size_t)rq.n * (size_t)so.vocab;
    so.logits = malloc(n * sizeof *so.logits);
    so.raw = malloc(2 * n * sizeof *so.raw);
    assert_true(so.logits && so.raw);
    assert_int_equal(flexdiag_score(c, &rq, &so), FLEXDIAG_OK);
    for (size_t i = 0; i < n; i++) {
        float cond = so.raw[i], uncond = so.raw[n + i];
        float want = uncond + rq.cfg_weight * (cond - uncond);
        assert_true(isfinite(so.logits[i]));
        assert_true(fabsf(so.logits[i] - want) <= 1e-3f * (1.0f + fabsf(want)));
    }
    rq.n = 0;
    assert_int_equal(flexdiag_score(c, &rq, &so), FLEXDIAG_ERR_INVALID_ARG);
    free(so.logits);
    free(so.raw);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* Append-only structs: a program built against an older flexdiag.h passes a shorter struct
 * and gets the fields it knows; a struct shorter than its first version, or longer than this
 * library's with a non-zero byte past it, is refused with a message that says which
 * (tests/abi/test_struct_tail.c: every params struct). */
static void test_struct_sizes(void **state) {
    (void)state;
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.max_prompt_len = 16;
    flexdiag_context *c = NULL;
    cp.struct_size = 3;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "flexdiag_context_params_init() first"));
    struct {
        flexdiag_context_params p;
        unsigned char newer[8]; /* a field of a newer flexdiag.h, set */
    } big = {.p = cp, .newer = {1}};
    big.p.struct_size = sizeof big;
    assert_int_equal(flexdiag_context_create(m, &big.p, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "newer flexdiag.h"));
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.max_prompt_len = 16;
    cp.micro_batch = -1; /* out of range fields are named, not taken */
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "context_params.micro_batch is -1"));
    cp.micro_batch = 0;
    cp.images_per_prompt = -2;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "context_params.images_per_prompt is -2"));
    cp.images_per_prompt = 0;
    cp.struct_size = (uint32_t)(offsetof(flexdiag_context_params, progress_user) + sizeof(void *));
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK); /* API version 1's */
    /* the offload info of API version 4: its fields filled, nothing written past them */
    union {
        flexdiag_offload_info oi;
        unsigned char bytes[sizeof(flexdiag_offload_info)];
    } u;
    memset(&u, 0xab, sizeof u);
    size_t v4 = offsetof(flexdiag_offload_info, disk_wait_s) + sizeof(double);
    u.oi.struct_size = (uint32_t)v4;
    assert_int_equal(flexdiag_context_offload(c, &u.oi), FLEXDIAG_OK);
    assert_int_equal(u.oi.struct_size, v4);
    assert_int_equal(u.oi.weights_pct[0], 100);
    assert_non_null(u.oi.scheduler);
    for (size_t i = v4; i < sizeof u; i++) assert_int_equal(u.bytes[i], 0xab);
    u.oi.struct_size = 8;
    assert_int_equal(flexdiag_context_offload(c, &u.oi), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_session),
                                       cmocka_unit_test(test_policy_names),
                                       cmocka_unit_test(test_context_policy),
                                       cmocka_unit_test(test_score),
                                       cmocka_unit_test(test_struct_sizes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
