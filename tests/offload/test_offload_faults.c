/*
 * test_offload_faults.c - a split model's disk tier under injected faults (fault.h: the calls
 * the store makes are wrapped at link time; no hook in the product), on the CPU backend:
 *   - the disk fills while the weights are written at load: NO_SPACE naming the store file,
 *     the offset and ENOSPC, nothing left behind;
 *   - a read fails (EIO) during generation: the call returns IO naming the file and offset, and
 *     the same context then generates the resident run's tokens (the scheduler starts over);
 *   - every read comes back short, and EINTR / EAGAIN are answered: the resident run's tokens;
 *   - the same for a context whose KV lives on disk, with a failed write as well.
 * Each case runs on io_uring (where the build has it) and on the thread-pool backend.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "flexdiag.h"
#include "offload/fault.h"
#include "util.h"

#define N_IMG 2

static char *g_dir;
static int32_t *g_ref; /* resident tokens */
static int32_t g_per;  /* tokens per image */

static flexdiag_status open_model(const uint32_t pct[3], flexdiag_runtime **rt,
                                  flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = 2;
    rp.offload_dir = g_dir;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    memcpy(mp.weights_pct, pct, sizeof mp.weights_pct);
    *m = NULL;
    return flexdiag_model_load(*rt, NULL, &mp, m);
}

static flexdiag_status gen(flexdiag_context *c, int32_t *tokens) {
    const char *prompts[1] = {"a fault"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = prompts;
    rq.images_per_prompt = N_IMG;
    rq.seed = 5;
    flexdiag_output o = {.tokens = tokens};
    flexdiag_status st = flexdiag_generate(c, &rq, &o);
    g_per = o.tokens_per_image;
    return st;
}

static flexdiag_context *context(flexdiag_model *m) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = N_IMG;
    cp.max_prompt_len = 32;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    return c;
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tempdir("offload-faults");
    const uint32_t all[3] = {100, 0, 0};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    assert_int_equal(open_model(all, &rt, &m), FLEXDIAG_OK);
    flexdiag_context *c = context(m);
    g_ref = malloc(N_IMG * 64 * 4);
    assert_int_equal(gen(c, g_ref), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    free(g_ref);
    return 0;
}

static void disk_fills_at_load(void) {
    const uint32_t pct[3] = {20, 30, 50};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    fi_set(&(fi_rule){.kind = FI_ERR, .err = ENOSPC, .op = 1, .every = 1, .count = 1, .off = -1});
    flexdiag_status st = open_model(pct, &rt, &m);
    fi_clear();
    const char *msg = flexdiag_last_error(NULL);
    printf("  disk full at load: %s\n", msg);
    assert_int_equal(st, FLEXDIAG_ERR_NO_SPACE);
    assert_non_null(strstr(msg, g_dir));
    assert_non_null(strstr(msg, "ENOSPC"));
    assert_null(m);
    flexdiag_runtime_destroy(rt);
}

/* Every transfer of op (0 reads, -1 both) short and EINTR answered: c still generates the
 * resident run's tokens into t; then t, c, m and rt are freed. */
static void short_transfers_then_free(flexdiag_runtime *rt, flexdiag_model *m,
                                      flexdiag_context *c, int32_t *t, int op) {
    fi_set(&(fi_rule){.kind = FI_SHORT, .op = op, .every = 1, .count = -1, .off = -1});
    fi_submit_eintr = 3;
    memset(t, 0, (size_t)N_IMG * 64 * 4);
    assert_int_equal(gen(c, t), FLEXDIAG_OK);
    fi_clear();
    fi_submit_eintr = 0;
    assert_memory_equal(t, g_ref, (size_t)N_IMG * (size_t)g_per * 4);
    free(t);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

static void read_fails_then_recovers(void) {
    const uint32_t pct[3] = {20, 30, 50};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    assert_int_equal(open_model(pct, &rt, &m), FLEXDIAG_OK);
    flexdiag_context *c = context(m);
    int32_t *t = calloc(N_IMG * 64, 4);
    fi_set(&(fi_rule){.kind = FI_ERR, .err = EIO, .op = 0, .every = 3, .count = 1, .off = -1});
    flexdiag_status st = gen(c, t);
    fi_clear();
    const char *msg = flexdiag_last_error(NULL);
    printf("  read error: %s\n", msg);
    assert_int_equal(st, FLEXDIAG_ERR_IO);
    assert_non_null(strstr(msg, "EIO"));
    assert_non_null(strstr(msg, "offset"));
    assert_int_equal(gen(c, t), FLEXDIAG_OK); /* the same context, the disk healthy again */
    assert_memory_equal(t, g_ref, (size_t)N_IMG * (size_t)g_per * 4);
    short_transfers_then_free(rt, m, c, t, 0);
}

/* The KV of both micro-batches on disk (weights on the device): a read error and a write error
 * during generation return IO / NO_SPACE naming the store file, and the same context then
 * generates the resident run's tokens, also with every transfer short and EINTR answered. */
static void kv_disk_faults(void) {
    const uint32_t all[3] = {100, 0, 0};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    assert_int_equal(open_model(all, &rt, &m), FLEXDIAG_OK);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = N_IMG;
    cp.max_prompt_len = 32;
    cp.micro_batch = 1;
    cp.kv_pct[2] = 100;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    int32_t *t = calloc(N_IMG * 64, 4);
    const struct { int op, err; flexdiag_status want; const char *what; } f[] = {
        {0, EIO, FLEXDIAG_ERR_IO, "EIO"}, {1, ENOSPC, FLEXDIAG_ERR_NO_SPACE, "ENOSPC"}};
    for (int i = 0; i < 2; i++) {
        fi_set(&(fi_rule){.kind = FI_ERR, .err = f[i].err, .op = f[i].op, .every = 7, .count = 1,
                          .off = -1});
        flexdiag_status st = gen(c, t);
        int fired = fi_fired();
        fi_clear();
        const char *msg = flexdiag_last_error(NULL);
        printf("  KV on disk, %s: %s\n", f[i].what, msg);
        assert_int_equal(fired, 1);
        assert_int_equal(st, f[i].want);
        assert_non_null(strstr(msg, f[i].what));
        assert_non_null(strstr(msg, g_dir));
        assert_int_equal(gen(c, t), FLEXDIAG_OK); /* the same context, the disk healthy again */
        assert_memory_equal(t, g_ref, (size_t)N_IMG * (size_t)g_per * 4);
    }
    short_transfers_then_free(rt, m, c, t, -1);
}

static void test_faults_default_io(void **state) {
    (void)state;
    disk_fills_at_load();
    read_fails_then_recovers();
    kv_disk_faults();
}

static void test_faults_threads(void **state) {
    (void)state;
    setenv("FLEXDIAG_IO", "threads", 1);
    disk_fills_at_load();
    read_fails_then_recovers();
    kv_disk_faults();
    unsetenv("FLEXDIAG_IO");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_faults_default_io),
        cmocka_unit_test(test_faults_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
