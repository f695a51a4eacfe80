/*
 * test_api_messages.c - what the C API says about the values a caller set (issue 40).
 *
 * 1. Every params field a call refuses is named as the caller spells it
 *    ("context_params.kv_pct", "runtime_params.cpu_mem", "request.top_p"), never as a
 *    command-line flag; the CLI given the matching bad flag names the flag instead (cli/cli.c
 *    maps the one to the other), and no params field.
 * 2. Sizes at INT32_MAX (images, prompt and decode lengths) are refused naming the field before
 *    any size is derived from them; the ones that bound nothing (micro_batch, images_per_prompt,
 *    queue_images) are taken.
 * 3. What earlier sessions fixed stays fixed: device 3 on a build without CUDA is refused,
 *    flexdiag_context_cancel(NULL) and flexdiag_context_stats(NULL) say why, and the stats of a
 *    cancelled run count only the tokens it made.
 * The builtin micro shapes on the CPU engine; the CLI through $FLEXDIAG_BIN.
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

#include "flexdiag.h"
#include "util.h"

static char *g_dir; /* temp folder: offload stores, CLI outputs */

/* The last message names field and no flag. */
static void expect_field(flexdiag_status st, flexdiag_status want, const char *field) {
    const char *msg = flexdiag_last_error(NULL);
    printf("  %s: %s\n", field, msg);
    assert_int_equal(st, want);
    if (!strstr(msg, field) || strstr(msg, "--"))
        fail_msg("message '%s': want '%s' named and no flag", msg, field);
}

static flexdiag_runtime *cpu_runtime(uint64_t cpu_mem, uint64_t disk_mem, const char *dir) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.cpu_mem = cpu_mem;
    rp.disk_mem = disk_mem;
    rp.offload_dir = dir;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    return rt;
}

static flexdiag_model *load(flexdiag_runtime *rt, const char *arch) {
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = arch;
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);
    return m;
}

/* Load micro-janus with weights split pct under the runtime's budgets; expect field named. */
static void expect_load_field(uint64_t cpu_mem, uint64_t disk_mem, const char *dir,
                              const uint32_t pct[3], uint32_t compress, flexdiag_status want,
                              const char *field) {
    flexdiag_runtime *rt = cpu_runtime(cpu_mem, disk_mem, dir);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    memcpy(mp.weights_pct, pct, sizeof mp.weights_pct);
    mp.compress_weights = compress;
    flexdiag_model *m = NULL;
    expect_field(flexdiag_model_load(rt, NULL, &mp, &m), want, field);
    assert_null(m);
    flexdiag_runtime_destroy(rt);
}

static flexdiag_context_params ctx_params(void) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.max_prompt_len = 16;
    cp.max_new_tokens = 8;
    return cp;
}

/* A context of m with cp is refused naming field. */
static void expect_ctx_field(flexdiag_model *m, const flexdiag_context_params *cp,
                             flexdiag_status want, const char *field) {
    flexdiag_context *c = (flexdiag_context *)&c;
    expect_field(flexdiag_context_create(m, cp, &c), want, field);
    assert_null(c);
}

/* ---- 1. fields, not flags ---- */

static void test_runtime_and_model_fields(void **state) {
    (void)state;
    const uint32_t cpu[3] = {0, 100, 0}, disk[3] = {0, 0, 100}, bad[3] = {50, 40, 5};
    const uint32_t all[3] = {100, 0, 0};
    expect_load_field(8192, 0, NULL, cpu, 0, FLEXDIAG_ERR_OOM_PINNED, "runtime_params.cpu_mem");
    expect_load_field(0, 0, NULL, disk, 0, FLEXDIAG_ERR_INVALID_ARG, "runtime_params.offload_dir");
    expect_load_field(0, 8192, g_dir, disk, 0, FLEXDIAG_ERR_NO_SPACE, "runtime_params.disk_mem");
    expect_load_field(0, 0, NULL, bad, 0, FLEXDIAG_ERR_INVALID_ARG, "model_params.weights_pct");
    expect_load_field(0, 0, NULL, all, 3, FLEXDIAG_ERR_INVALID_ARG,
                      "model_params.compress_weights");
    flexdiag_runtime *rt = cpu_runtime(0, 0, NULL);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "no-such-shape";
    flexdiag_model *m = NULL;
    expect_field(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_ERR_INVALID_ARG,
                 "model_params.arch");
    m = load(rt, "micro-janus");
    flexdiag_context_params cp = ctx_params();
    int32_t fit = 0; /* the CPU engine without gpu_mem has no budget to fill */
    expect_field(flexdiag_context_max_images(m, &cp, &fit), FLEXDIAG_ERR_INVALID_ARG,
                 "runtime_params.gpu_mem");
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

static void test_context_fields(void **state) {
    (void)state;
    flexdiag_runtime *rt = cpu_runtime(0, 0, NULL);
    flexdiag_model *m = load(rt, "micro-janus"), *text = load(rt, "micro-opt");
    flexdiag_context_params cp = ctx_params();
    cp.kv_pct[0] = 50, cp.kv_pct[1] = 60;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.kv_pct 50,60,0");
    cp = ctx_params();
    cp.cpu_attention = true; /* every micro-batch's KV on the device: nothing to attend */
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.kv_pct");
    cp.kv_pct[1] = 100;
    cp.cpu_attention_pct = 101;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.cpu_attention_pct 101");
    cp = ctx_params();
    cp.kv_pct[2] = 100; /* a disk home without a store */
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "runtime_params.offload_dir");
    cp = ctx_params();
    cp.policy.kind = FLEXDIAG_POLICY_TOVA;
    cp.policy.sparsity = 1.5;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.policy.sparsity 1.5");
    cp.policy.sparsity = NAN;
    cp.policy.n_att = -1;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.policy.n_att -1");
    cp.policy.kind = FLEXDIAG_POLICY_DIAGONAL;
    cp.policy.n_att = 8;
    cp.policy.n_r = 2;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG,
                     "context_params.policy.n_att 8 exceeds context_params.policy.n_r 2");
    cp.policy.n_r = 40000;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.policy.n_r 40000");
    static const char *const names[] = {"max_images", "max_prompt_len", "micro_batch",
                                        "images_per_prompt", "queue_images", "batching"};
    const int32_t bad[] = {0, 0, -1, -2, -1, 2};
    for (int i = 0; i < 6; i++) {
        cp = ctx_params();
        int32_t *f[] = {&cp.max_images, &cp.max_prompt_len, &cp.micro_batch,
                        &cp.images_per_prompt, &cp.queue_images, &cp.batching};
        *f[i] = bad[i];
        char want[96];
        snprintf(want, sizeof want, "context_params.%s is %d", names[i], bad[i]);
        expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, want);
    }
    cp = ctx_params();
    cp.max_new_tokens = -3; /* a text model's decode length */
    expect_ctx_field(text, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.max_new_tokens is -3");
    flexdiag_model_destroy(text);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* request fields: each refused by flexdiag_generate naming it. */
static void test_request_fields(void **state) {
    (void)state;
    flexdiag_runtime *rt = cpu_runtime(0, 0, NULL);
    flexdiag_model *m = load(rt, "micro-janus");
    flexdiag_context_params cp = ctx_params();
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    static const char *const names[] = {"request.temperature", "request.top_k", "request.top_p",
                                        "request.cfg_weight", "request.images_per_prompt"};
    for (int i = 0; i < 5; i++) {
        static const char *const prompts[] = {"a red apple"};
        flexdiag_request rq;
        flexdiag_request_init(&rq);
        rq.n_prompts = 1;
        rq.prompts = prompts;
        if (i == 0) rq.temperature = 0;
        if (i == 1) rq.top_k = -1;
        if (i == 2) rq.top_p = 2;
        if (i == 3) rq.cfg_weight = NAN;
        if (i == 4) rq.images_per_prompt = 0;
        flexdiag_output out = {0};
        expect_field(flexdiag_generate(c, &rq, &out), FLEXDIAG_ERR_INVALID_ARG, names[i]);
    }
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* The CLI given the matching bad flag: exit 2 (or 1 for a budget), the flag named, no field. */
static void expect_cli(const char *args, int want_rc, const char *flag1, const char *flag2) {
    char err[4200];
    snprintf(err, sizeof err, "%s/cli.err", g_dir);
    int rc = tu_system("cd '%s' && '%s' %s >/dev/null 2>'%s'", g_dir, getenv("FLEXDIAG_BIN"), args,
                       err);
    char *msg = tu_read_file(err, NULL);
    assert_non_null(msg);
    printf("  flexdiag %s\n    -> %d: %s", args, rc, msg);
    if (rc != want_rc || !strstr(msg, flag1) || (flag2 && !strstr(msg, flag2)) ||
        strstr(msg, "_params.") || strstr(msg, "request."))
        fail_msg("flexdiag %s: exit %d, '%s': want exit %d naming %s%s%s and no params field",
                 args, rc, msg, want_rc, flag1, flag2 ? " and " : "", flag2 ? flag2 : "");
    free(msg);
}

static void test_cli_names_flags(void **state) {
    (void)state;
    const char *gen = "generate --cpu --arch micro-janus --quiet --prompt 'a' --out o ";
    char a[512];
    snprintf(a, sizeof a, "%s--policy tova --sparsity 1.5", gen);
    expect_cli(a, 2, "--sparsity 1.5", NULL);
    snprintf(a, sizeof a, "%s--policy diagonal --n-att 8 --n-r 2", gen);
    expect_cli(a, 2, "--n-att 8 exceeds --n-r 2", "raise --n-r or lower --n-att");
    snprintf(a, sizeof a, "%s--weights 0,100,0 --cpu-mem 8K", gen);
    expect_cli(a, 1, "--cpu-mem 8.0 KiB is too small", "--weights");
    snprintf(a, sizeof a, "%s--kv 0,100,0 --cpu-attention --policy h2o --sparsity 0.5", gen);
    expect_cli(a, 1, "--cpu-attention", NULL);
    snprintf(a, sizeof a, "%s--weights 0,0,100", gen);
    expect_cli(a, 2, "no --offload-dir", NULL);
    snprintf(a, sizeof a, "%s--batch auto", gen);
    expect_cli(a, 2, "--batch auto", "--gpu-mem");
}

/* ---- 2. sizes at INT32_MAX ---- */

static void test_int32_max_sizes(void **state) {
    (void)state;
    flexdiag_runtime *rt = cpu_runtime(0, 0, NULL);
    flexdiag_model *m = load(rt, "micro-janus"), *text = load(rt, "micro-opt");
    flexdiag_context_params cp = ctx_params();
    cp.max_images = INT32_MAX;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.max_images is 2147483647");
    int32_t fit = -1;
    expect_field(flexdiag_context_max_images(m, &cp, &fit), FLEXDIAG_ERR_INVALID_ARG,
                 "runtime_params.gpu_mem"); /* a batch of one is sized first: no budget here */
    cp = ctx_params();
    cp.max_prompt_len = INT32_MAX;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG,
                     "context_params.max_prompt_len is 2147483647");
    cp = ctx_params();
    cp.max_new_tokens = INT32_MAX;
    expect_ctx_field(text, &cp, FLEXDIAG_ERR_INVALID_ARG,
                     "context_params.max_new_tokens is 2147483647");
    cp = ctx_params();
    cp.max_prompt_len = (1 << 24) - 4; /* + 8 decode tokens: past the positions a sequence has */
    expect_ctx_field(text, &cp, FLEXDIAG_ERR_INVALID_ARG, "context_params.max_prompt_len");
    cp = ctx_params();
    cp.max_images = 1 << 20; /* each in range, the whole beyond any machine */
    cp.max_prompt_len = (1 << 24) - 1024;
    expect_ctx_field(m, &cp, FLEXDIAG_ERR_INVALID_ARG, "PiB of memory");
    cp = ctx_params(); /* fields that bound nothing: taken at INT32_MAX */
    cp.micro_batch = INT32_MAX;
    cp.images_per_prompt = INT32_MAX;
    cp.queue_images = INT32_MAX;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(text);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* ---- 3. fixed before, kept fixed ---- */

static void test_device_without_cuda(void **state) {
    (void)state;
    if (flexdiag_device_count() > 0) skip(); /* a CUDA build with a device takes device 3's error */
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = 3;
    flexdiag_runtime *rt = (flexdiag_runtime *)&rt;
    flexdiag_status st = flexdiag_runtime_create(&rp, &rt);
    printf("  device 3: %s\n", flexdiag_last_error(NULL));
    assert_null(rt);
    assert_int_not_equal(st, FLEXDIAG_OK);
    assert_non_null(strstr(flexdiag_last_error(NULL), "device"));
    assert_non_null(strstr(flexdiag_last_error(NULL), "3"));
}

static void test_null_context(void **state) {
    (void)state;
    assert_int_equal(flexdiag_context_cancel(NULL), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "NULL"));
    flexdiag_stats s;
    assert_int_equal(flexdiag_context_stats(NULL, &s), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "NULL"));
}

/* Cancel from the progress callback once a sequence has made 3 tokens; *user: the tokens the
 * furthest sequence had made when it did. */
static bool stop_at_3(int phase, uint64_t done, uint64_t total, void *user) {
    (void)total;
    if (phase == 1) *(uint64_t *)user = done;
    return !(phase == 1 && done >= 3);
}

static void count_token(flexdiag_handle *h, int32_t index, int32_t step, int32_t id, void *user) {
    (void)h, (void)index, (void)step, (void)id;
    (*(uint64_t *)user)++;
}

static void test_cancelled_stats(void **state) {
    (void)state;
    flexdiag_runtime *rt = cpu_runtime(0, 0, NULL);
    flexdiag_model *m = load(rt, "micro-opt");
    flexdiag_context_params cp = ctx_params();
    cp.max_new_tokens = 40;
    cp.batching = 1; /* both sequences step together */
    uint64_t made = 0;
    cp.progress = stop_at_3;
    cp.progress_user = &made;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    static const int32_t p0[] = {2, 40, 41}, p1[] = {2, 50};
    static const int32_t *const ids[] = {p0, p1};
    static const int32_t lens[] = {3, 2};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 2;
    rq.prompt_ids = ids;
    rq.prompt_lens = lens;
    uint64_t streamed = 0;
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    sp.on_token = count_token;
    sp.user = &streamed;
    flexdiag_handle *h = NULL;
    assert_int_equal(flexdiag_submit(c, &rq, &sp, &h), FLEXDIAG_OK);
    assert_int_equal(flexdiag_handle_wait(h, -1), FLEXDIAG_OK);
    flexdiag_status st = FLEXDIAG_OK;
    flexdiag_handle_stats hs = {.struct_size = sizeof hs};
    assert_int_equal(flexdiag_handle_status(h, &st, &hs), FLEXDIAG_OK);
    assert_int_equal(st, FLEXDIAG_ERR_CANCELLED);
    flexdiag_stats s;
    assert_int_equal(flexdiag_context_stats(c, &s), FLEXDIAG_OK);
    printf("  cancelled at %llu tokens a sequence: %llu tokens streamed, %llu in the handle, "
           "%llu in the stats\n", (unsigned long long)made, (unsigned long long)streamed,
           (unsigned long long)hs.tokens, (unsigned long long)s.tokens_generated);
    assert_int_equal(made, 3);
    assert_int_equal(s.tokens_generated, 2 * made); /* two sequences, one row each; not 2 x 40 */
    assert_int_equal(hs.tokens, streamed);
    assert_int_equal(streamed, s.tokens_generated); /* the cancelling pass's tokens went out */
    flexdiag_handle_release(h);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

int main(void) {
    if (!getenv("FLEXDIAG_BIN")) {
        fprintf(stderr, "test_api_messages: FLEXDIAG_BIN not set (run through meson test)\n");
        return 77;
    }
    g_dir = tu_tempdir("api-messages");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_and_model_fields),
        cmocka_unit_test(test_context_fields),
        cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_cli_names_flags),
        cmocka_unit_test(test_int32_max_sizes),
        cmocka_unit_test(test_device_without_cuda),
        cmocka_unit_test(test_null_context),
        cmocka_unit_test(test_cancelled_stats),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmtree(g_dir);
    free(g_dir);
    return rc;
}
