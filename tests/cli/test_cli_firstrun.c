/*
 * test_cli_firstrun.c - what a first run of the command-line tools meets (issue 40), end to end
 * through $FLEXDIAG_BIN and $FLEXDIAG_BENCH_BIN on the builtin micro models on the CPU.
 *
 * version: every subcommand of both tools prints the version with --version, and --help lists
 * it.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "flexdiag.h"
#include "util.h"

static const char *g_bin;   /* $FLEXDIAG_BIN */
static const char *g_bench; /* $FLEXDIAG_BENCH_BIN */
static char *g_dir;         /* temporary folder of this run */

/* ---- helpers ---- */

/* Run `bin ARGS` in g_dir (stdout to out.txt, stderr to err.txt); its exit status. */
__attribute__((format(printf, 2, 3))) static int run(const char *bin, const char *fmt, ...) {
    char args[3072];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_system("cd '%s' && '%s' %s >out.txt 2>err.txt", g_dir, bin, args);
}

static char *read_in_dir(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return tu_read_file(path, NULL);
}

/* The whole of file name in g_dir holds needle (a cmocka failure quoting it otherwise). */
static void assert_file_has(const char *name, const char *needle) {
    char *text = read_in_dir(name);
    if (!text || !strstr(text, needle))
        fail_msg("%s lacks '%s': '%s'", name, needle, text ? text : "(missing)");
    free(text);
}

/* ---- --version everywhere ---- */

static void test_version(void **state) {
    (void)state;
    static const char *flexdiag_cmds[] = {"generate", "score", "decode", "policy-trace",
                                          "bench", "bench fidelity", "bench throughput",
                                          "profile", "search"};
    static const char *bench_cmds[] = {"bench", "bench fidelity", "policy-trace", "profile",
                                       "search", "requests"};
    char want[64];
    snprintf(want, sizeof want, "flexdiag %s\n", flexdiag_version());
    for (size_t i = 0; i < sizeof flexdiag_cmds / sizeof *flexdiag_cmds; i++) {
        if (run(g_bin, "%s --version", flexdiag_cmds[i]))
            fail_msg("flexdiag %s --version: not exit 0", flexdiag_cmds[i]);
        assert_file_has("out.txt", want);
        assert_int_equal(run(g_bin, "%s --help", flexdiag_cmds[i]), 0);
        assert_file_has("out.txt", "--version");
    }
    for (size_t i = 0; i < sizeof bench_cmds / sizeof *bench_cmds; i++) {
        if (run(g_bench, "%s --version", bench_cmds[i]))
            fail_msg("flexdiag-bench %s --version: not exit 0", bench_cmds[i]);
        assert_file_has("out.txt", want);
    }
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tempdir("firstrun");
    return g_dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void) {
    g_bin = getenv("FLEXDIAG_BIN");
    g_bench = getenv("FLEXDIAG_BENCH_BIN");
    if (!g_bin || !g_bench) {
        fprintf(stderr, "test_cli_firstrun: FLEXDIAG_BIN or FLEXDIAG_BENCH_BIN unset (run "
                        "through meson test): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
