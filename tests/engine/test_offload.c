/*
 * test_offload.c - weight placement on the CPU backend: the tiered scheduler over an emulated
 * device (the CPU arena) with a copy worker thread, the pinned pool and the NVMe store in a
 * temporary folder. Every placement gives the resident run's tokens and logits bit for bit
 * (offload_runs.h), also with every copy delayed (FLEXDIAG_COPY_DELAY_US: a missing event
 * dependency shows up as wrong tokens) and on the thread-pool disk backend; budgets too small
 * are refused naming the flag and the bytes. Compressed weights (--compress-weights 4bit) give the
 * tokens and logits of the resident model whose streamed matrices were packed and unpacked in
 * place by the plain C reference. The disk part as zstd chunks (--compress-disk zstd) gives the
 * raw disk tier's tokens and logits, and a corrupt chunk fails naming the file and byte offset.
 * KV homes: test_kv_homes.c.
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

static char g_dir[] = "/tmp/flexdiag-offload-XXXXXX";

static void test_placements(void **state) {
    (void)state;
    to_run_placements(-1, "micro-janus", 6, 2, g_dir);
}

/* OPT's block (LayerNorm and bias tensors between the matrices) split the same ways. */
static void test_placements_opt(void **state) {
    (void)state;
    to_run_placements(-1, "micro-opt", 6, 2, g_dir);
}

/* Chameleon's block (the QK-norm tables after the fused QKV matrix) split the same ways. */
static void test_placements_chameleon(void **state) {
    (void)state;
    to_run_placements(-1, "micro-lumina", 6, 2, g_dir);
}







static void test_compressed(void **state) {
    (void)state;
    to_run_compressed(-1, "micro-janus", 6, 2, g_dir);
    to_run_compressed(-1, "micro-opt", 6, 2, g_dir);
}

/* The disk part as zstd chunks (--compress-disk zstd): the raw disk tier's and the resident
 * run's tokens and logits; a corrupt chunk named with its file and byte offset. */
static void test_zstd_disk(void **state) {
    (void)state;
    to_run_zstd_disk(-1, "micro-janus", 6, 2, g_dir);
    to_run_zstd_disk(-1, "micro-opt", 6, 2, g_dir);
    to_run_zstd_corrupt(-1, "micro-janus", g_dir);
}

static void test_placements_delayed_copies(void **state) {
    (void)state;
    setenv("FLEXDIAG_COPY_DELAY_US", "200", 1);
    setenv("FLEXDIAG_IO", "threads", 1);
    to_run_placements(-1, "micro-janus", 3, 0, g_dir);
    unsetenv("FLEXDIAG_COPY_DELAY_US");
    unsetenv("FLEXDIAG_IO");
}

/* Load micro-janus placed pct under the given tier flags; the status and message. */
static flexdiag_status load(const uint32_t pct[3], uint64_t cpu_mem, uint64_t disk_mem,
                            const char *dir, char *msg, size_t n) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.cpu_mem = cpu_mem;
    rp.disk_mem = disk_mem;
    rp.offload_dir = dir;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    memcpy(mp.weights_pct, pct, sizeof mp.weights_pct);
    flexdiag_model *m = NULL;
    flexdiag_status st = flexdiag_model_load(rt, NULL, &mp, &m);
    snprintf(msg, n, "%s", flexdiag_last_error(NULL));
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return st;
}

static void test_budgets_refused(void **state) {
    (void)state;
    char msg[512];
    const uint32_t cpu[3] = {0, 100, 0}, disk[3] = {0, 0, 100}, bad[3] = {50, 40, 5};
    assert_int_equal(load(cpu, 8192, 0, NULL, msg, sizeof msg), FLEXDIAG_ERR_OOM_PINNED);
    assert_non_null(strstr(msg, "runtime_params.cpu_mem 8.0 KiB is too small"));
    assert_non_null(strstr(msg, "KiB of pinned host memory"));
    assert_int_equal(load(disk, 0, 8192, g_dir, msg, sizeof msg), FLEXDIAG_ERR_NO_SPACE);
    assert_non_null(strstr(msg, "runtime_params.disk_mem 8.0 KiB is too small"));
    assert_int_equal(load(disk, 0, 0, NULL, msg, sizeof msg), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(msg, "no runtime_params.offload_dir"));
    assert_int_equal(load(bad, 0, 0, NULL, msg, sizeof msg), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(msg, "50,40,5"));
    assert_int_equal(load(cpu, 64u << 20, 0, NULL, msg, sizeof msg), FLEXDIAG_OK);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_placements_opt),
        cmocka_unit_test(test_placements_chameleon),
        cmocka_unit_test(test_placements_delayed_copies),
        cmocka_unit_test(test_compressed),
        cmocka_unit_test(test_zstd_disk),
        cmocka_unit_test(test_budgets_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir); /* the stores unlink their files at once: the folder is empty */
    return rc;
}
