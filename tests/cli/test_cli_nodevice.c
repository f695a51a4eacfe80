/*
 * test_cli_nodevice.c - what a CUDA build prints on a host without a usable GPU (issue #12):
 * one short warning line that names the reason and the --cpu flag (not "device -1"), then the
 * run goes on on the CPU; with --cpu nothing about CUDA at all.
 *
 * Only a CUDA build on a host where device 0 cannot start (no driver, no device) can show it,
 * so main() asks the CUDA backend for a stream on device 0 first: a CPU-only build, a working
 * device or a device failing some other way skips (exit 77) with the reason on stderr.
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

#include "base/core.h"
#include "kernels/kernels.h"
#include "util.h"

#define MAX_LINE 200 /* "one short line": the old message was about 300 characters */

static const char *g_bin; /* $FLEXDIAG_BIN */
static char *g_dir;       /* temporary folder of this run */

/* Run a micro-janus generate in g_dir with extra flags; stderr in err.txt; its exit status. */
static int generate(const char *extra) {
    return tu_system("cd '%s' && rm -rf o && '%s' generate --arch micro-janus --quiet "
                     "--images-per-prompt 1 --out o %s 2>err.txt", g_dir, g_bin, extra);
}

static char *read_err(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/err.txt", g_dir);
    char *err = tu_read_file(path, NULL);
    assert_non_null(err);
    return err;
}

static void test_fallback_line(void **state) {
    (void)state;
    assert_int_equal(generate(""), 0);
    char *err = read_err();
    char *nl = strchr(err, '\n');
    assert_non_null(nl);
    *nl = 0;
    fprintf(stderr, "  first line (%zu chars): %s\n", strlen(err), err);
    if (!strstr(err, "no usable CUDA device (") || !strstr(err, "running on the CPU") ||
        !strstr(err, "--cpu") || strstr(err, "device -1") || strlen(err) > MAX_LINE)
        fail_msg("first stderr line '%s': want one line under %d characters naming the reason "
                 "and --cpu", err, MAX_LINE);
    assert_null(strstr(nl + 1, "CUDA")); /* said once */
    free(err);
}

static void test_cpu_flag_is_quiet(void **state) {
    (void)state;
    assert_int_equal(generate("--cpu"), 0);
    char *err = read_err();
    if (strstr(err, "CUDA") || strstr(err, "cuda")) fail_msg("--cpu still talks CUDA: '%s'", err);
    free(err);
}

int main(void) {
    g_bin = getenv("FLEXDIAG_BIN");
    if (!g_bin || access(g_bin, X_OK) != 0) {
        fprintf(stderr, "test_cli_nodevice: FLEXDIAG_BIN is not executable: skipped\n");
        return 77;
    }
    if (!flexdiag__kernels_cuda()) {
        fprintf(stderr, "test_cli_nodevice: skipped: a CPU-only build has no CUDA to fall back "
                        "from\n");
        return 77;
    }
    flexdiag_stream *s = NULL;
    flexdiag_status st = flexdiag__kernels_cuda()->stream_create(0, 0, &s);
    if (st == FLEXDIAG_OK) flexdiag__kernels_cuda()->stream_destroy(s);
    if (st != FLEXDIAG_ERR_UNSUPPORTED) { /* the case here: no device, or no driver */
        fprintf(stderr, "test_cli_nodevice: skipped: %s\n",
                st == FLEXDIAG_OK ? "a CUDA device works here, so there is no fallback to check"
                                  : flexdiag__err_msg());
        return 77;
    }
    fprintf(stderr, "test_cli_nodevice: device 0: %s\n", flexdiag__err_msg());
    g_dir = tu_tempdir("nodevice");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_line),
        cmocka_unit_test(test_cpu_flag_is_quiet),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmtree(g_dir);
    free(g_dir);
    return rc;
}
