/*
 * test_cli_calib.c - the calibration table on the command line, end to end through the binaries
 * ($FLEXDIAG_BENCH_BIN, $FLEXDIAG_BIN), micro-janus on the CPU: `flexdiag-bench calibrate` writes
 * a table and its summary; generate runs ssd and hack with --calib (results.jsonl names the
 * policy) and --ssd-tau; and the refusals, each exiting 2 (1 for a file that cannot be read)
 * with the first stderr line naming the flag: --calib missing, unreadable or damaged, --ssd-tau
 * out of range, calibrate without --prompts / --out, with fewer prompts than --n-cal or on a text
 * model, bench fidelity's ssd row without --calib, policy-trace with ssd. bench fidelity's rows
 * of ssd and hack with --calib.
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

#include "util.h"

static const char *g_bin, *g_bench; /* $FLEXDIAG_BIN, $FLEXDIAG_BENCH_BIN */
static char *g_dir;

#define GEN "generate --cpu --arch micro-janus --quiet --batch 1 --images-per-prompt 1 " \
            "--prompt 'a red circle' --out o --sparsity 0.6 "
#define CAL "calibrate --cpu --arch micro-janus --prompts p.txt "

/* Run bin ARGS in g_dir (stdout out.txt, stderr err.txt); its exit status. */
__attribute__((format(printf, 2, 3))) static int run(const char *bin, const char *fmt, ...) {
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_system("cd '%s' && rm -rf o && '%s' %s >out.txt 2>err.txt", g_dir, bin, args);
}

/* The first stderr line holds every string of the NULL-terminated list. */
static void first_line_has(const char *a, ...) {
    char *err = tu_read_in(g_dir, "err.txt");
    assert_non_null(err);
    char *nl = strchr(err, '\n');
    if (nl) *nl = '\0';
    va_list ap;
    va_start(ap, a);
    for (const char *s = a; s; s = va_arg(ap, const char *))
        if (!strstr(err, s)) fail_msg("stderr '%s' lacks '%s'", err, s);
    va_end(ap);
    free(err);
}

static int has_in(const char *file, const char *s) {
    char *t = tu_read_in(g_dir, file);
    int ok = t && strstr(t, s);
    free(t);
    return ok;
}

static void test_calibrate_and_generate(void **state) {
    (void)state;
    assert_int_equal(run(g_bench, CAL "--n-cal 2 --out m.calib"), 0);
    assert_true(has_in("out.txt", "wrote m.calib: 2 layers x 4/4 heads, L_dec 64, W_s 8"));
    assert_true(has_in("out.txt", "sparsity 0.80 (N_att 13): ssd"));
    assert_int_equal(run(g_bin, GEN "--policy ssd --calib m.calib"), 0);
    assert_true(has_in("o/results.jsonl", "\"policy\":\"ssd\""));
    assert_int_equal(run(g_bin, GEN "--policy hack --calib m.calib"), 0);
    assert_true(has_in("o/results.jsonl", "\"policy\":\"hack\""));
    assert_int_equal(run(g_bin, GEN "--policy ssd --calib m.calib --ssd-tau 0"), 0);
    assert_int_equal(run(g_bin, GEN "--policy h2o --calib missing.calib"), 0); /* ignored */
    assert_int_equal(run(g_bin, "bench fidelity --cpu --arch micro-janus --random-weights "
                                "--policies dense,ssd,hack --sparsities 0.6 --calib m.calib"),
                     0);
    assert_true(has_in("out.txt", "| ssd | 0.5938 | 26 |") &&
                has_in("out.txt", "| hack | 0.5938 | 26 |"));
    assert_true(has_in("err.txt", "hack at N_att 26:"));
}

static void test_refusals(void **state) {
    (void)state;
    assert_int_equal(run(g_bench, CAL "--n-cal 2 --out r.calib"), 0);
    assert_int_equal(run(g_bin, GEN "--policy hack"), 2);
    first_line_has("flexdiag generate", "hack needs a calibration table", "--calib", NULL);
    assert_int_equal(run(g_bin, GEN "--policy ssd --calib none.calib"), 1);
    first_line_has("--calib", "none.calib", "cannot open", NULL);
    size_t n = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/r.calib", g_dir);
    unsigned char *b = tu_read_file(path, &n);
    b[300] ^= 0x40;
    snprintf(path, sizeof path, "%s/bad.calib", g_dir);
    assert_int_equal(tu_write_file(path, b, n), 0);
    free(b);
    assert_int_equal(run(g_bin, GEN "--policy ssd --calib bad.calib"), 2);
    first_line_has("--calib", "bad.calib", "checksum", NULL);
    assert_int_equal(run(g_bin, GEN "--policy ssd --calib r.calib --ssd-tau -1"), 2);
    first_line_has("--ssd-tau", NULL);
    assert_int_equal(run(g_bench, CAL "--n-cal 2"), 2);
    first_line_has("--prompts FILE and --out FILE are required", NULL);
    assert_int_equal(run(g_bench, CAL "--n-cal 3 --out x.calib"), 2);
    first_line_has("--prompts p.txt has 2 prompts", "--n-cal", NULL);
    assert_int_equal(run(g_bench, "calibrate --cpu --arch micro-opt --prompts p.txt --n-cal 1 "
                                  "--out x.calib"), 2);
    first_line_has("no image grid", NULL);
    assert_int_equal(run(g_bin, "bench fidelity --cpu --arch micro-janus --policies ssd "
                                "--sparsities 0.6"), 2);
    first_line_has("--policies ssd needs --calib FILE", NULL);
    assert_int_equal(run(g_bin, "policy-trace --synthetic grid:8 --heads 1 --policy ssd "
                                "--sparsity 0.5"), 2);
    first_line_has("policy-trace", "ssd and hack", NULL);
}

static int setup(void **state) {
    (void)state;
    g_bin = getenv("FLEXDIAG_BIN");
    g_bench = getenv("FLEXDIAG_BENCH_BIN");
    g_dir = tu_tempdir("cli-calib");
    if (!g_bin || !g_bench || !g_dir) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/p.txt", g_dir);
    const char *p = "a red circle\ntwo blue squares\n";
    return tu_write_file(path, p, strlen(p));
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibrate_and_generate),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
