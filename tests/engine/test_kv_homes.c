/*
 * test_kv_homes.c - KV homes on the CPU backend (offload_runs.h): the KV of the last
 * micro-batches in pinned host memory and on disk (the store in a temporary folder), attended
 * by the emulated device over the rows it streams or by the host (CPU attention), for every
 * policy: the resident run's tokens and logits bit for bit, also with every copy delayed
 * (FLEXDIAG_COPY_DELAY_US: a missing event dependency shows up as wrong tokens). CPU attention
 * without a host home, or for a policy with device-side state, is refused with a message; a
 * disk home without an offload folder or beyond --disk-mem too; --batch auto keeps the host KV
 * within --cpu-mem.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/offload_runs.h"
#include "flexdiag.h"

static char g_dir[] = "/tmp/flexdiag-kv-homes-XXXXXX";

/* KV homes on the host (sched_kv.c) for every policy, three micro-batches of two images. */
static void test_kv_homes(void **state) {
    (void)state;
    to_run_kv_homes(-1, "micro-janus", 6, 2, g_dir, 0);
}

/* The same with every copy delayed: a missing event between the copy streams and the compute
 * shows up as wrong tokens. */
static void test_kv_homes_delayed_copies(void **state) {
    (void)state;
    setenv("FLEXDIAG_COPY_DELAY_US", "100", 1);
    to_run_kv_homes(-1, "micro-janus", 3, 1, g_dir, 1); /* odd count: the buffers shift */
    unsetenv("FLEXDIAG_COPY_DELAY_US");
}

/* CPU attention: the host attends the host-homed micro-batches over their KV in place; on the
 * CPU backend its attention is the engine's own, so tokens and logits are bit for bit. */
static void test_cpu_attention(void **state) {
    (void)state;
    to_run_cpu_attention(-1, "micro-janus", 4, 0.0, 3, g_dir);
}

/* Dense with every copy and host job of the queues delayed: a missing event between the
 * compute stream and the host jobs shows up as wrong tokens. */
static void test_cpu_attention_delayed_copies(void **state) {
    (void)state;
    setenv("FLEXDIAG_COPY_DELAY_US", "100", 1);
    to_run_cpu_attention(-1, "micro-janus", 2, 0.0, 1, g_dir);
    unsetenv("FLEXDIAG_COPY_DELAY_US");
}

/* micro-janus on the CPU backend with the runtime's tier budgets gpu_mem, cpu_mem, disk_mem and
 * store folder dir (0 / NULL: none). */
static void open_micro(uint64_t gpu_mem, uint64_t cpu_mem, uint64_t disk_mem, const char *dir,
                       flexdiag_runtime **rt, flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.gpu_mem = gpu_mem;
    rp.cpu_mem = cpu_mem;
    rp.disk_mem = disk_mem;
    rp.offload_dir = dir;
    *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    *m = NULL;
    assert_int_equal(flexdiag_model_load(*rt, NULL, &mp, m), FLEXDIAG_OK);
}

/* CPU attention is refused, naming what to change, without a host KV home, for a policy
 * whose attention updates per-sequence state on the device, and with a share over 100 %. */
static void test_cpu_attention_refused(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_micro(0, 0, 0, NULL, &rt, &m);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.max_prompt_len = 32;
    cp.cpu_attention = true;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "context_params.kv_pct"));
    cp.kv_pct[1] = 100;
    cp.policy.kind = FLEXDIAG_POLICY_DIAGONAL;
    cp.policy.sparsity = 0.75;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_UNSUPPORTED);
    assert_non_null(strstr(flexdiag_last_error(NULL), "diagonal"));
    cp.policy.kind = FLEXDIAG_POLICY_WINDOW;
    cp.cpu_attention_pct = 101;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "context_params.cpu_attention_pct"));
    cp.cpu_attention_pct = 0;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* --batch auto with KV homes: the largest batch whose host KV fits --cpu-mem runs, one more is
 * refused naming --cpu-mem (the same sizing function decides both). */
static void test_kv_budget(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_micro(256u << 20, 2u << 20, 0, NULL, &rt, &m);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_prompt_len = 32;
    cp.micro_batch = 1;
    cp.kv_pct[1] = 100;
    int32_t n = 0;
    assert_int_equal(flexdiag_context_max_images(m, &cp, &n), FLEXDIAG_OK);
    assert_true(n >= 1 && n < 1000); /* bounded by the 2 MiB pool, not the 256 MiB device */
    flexdiag_context *c = NULL;
    cp.max_images = n;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    cp.max_images = n + 1;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_OOM_PINNED);
    assert_non_null(strstr(flexdiag_last_error(NULL), "runtime_params.cpu_mem"));
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* A disk KV home needs an offload folder, and a store with room for it: both refused naming
 * the flag. */
static void test_kv_disk_refused(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        flexdiag_runtime *rt;
        flexdiag_model *m;
        open_micro(0, 0, i ? 8192 : 0, i ? g_dir : NULL, &rt, &m);
        flexdiag_context_params cp;
        flexdiag_context_params_init(&cp);
        cp.max_images = 2;
        cp.micro_batch = 1;
        cp.max_prompt_len = 32;
        cp.kv_pct[1] = 50;
        cp.kv_pct[2] = 50;
        flexdiag_context *c = NULL;
        flexdiag_status st = flexdiag_context_create(m, &cp, &c);
        const char *msg = flexdiag_last_error(NULL);
        printf("  %s\n", msg);
        assert_int_equal(st, i ? FLEXDIAG_ERR_NO_SPACE : FLEXDIAG_ERR_INVALID_ARG);
        assert_non_null(strstr(msg, i ? "runtime_params.disk_mem" : "runtime_params.offload_dir"));
        assert_null(c);
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
    }
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_homes),
        cmocka_unit_test(test_kv_homes_delayed_copies),
        cmocka_unit_test(test_cpu_attention),
        cmocka_unit_test(test_cpu_attention_delayed_copies),
        cmocka_unit_test(test_cpu_attention_refused),
        cmocka_unit_test(test_kv_disk_refused),
        cmocka_unit_test(test_kv_budget),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir); /* the stores unlink their files at once: the folder is empty */
    return rc;
}
