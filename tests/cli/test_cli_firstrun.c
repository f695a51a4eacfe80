/*
 * test_cli_firstrun.c - what a first run of the command-line tools meets (issue 40), end to end
 * through $FLEXDIAG_BIN and $FLEXDIAG_BENCH_BIN on the builtin micro models on the CPU.
 *
 * version: every subcommand of both tools prints the version with --version, and --help lists
 * it.
 * ranges: every range a command's --help advertises ("a whole number in [lo, hi]", "a number in
 * (lo, hi]") is the one its parser checks: both bounds pass the parser (the run stops at an
 * unknown flag after them instead), a value just outside is refused naming the flag. --arch's
 * list is the library's table of builtin shapes, and the library accepts each.
 * overflow: int flags at the int32 limit whose products overflowed (bench --images-per-prompt
 * 2147483647: UBSan's signed overflow, then a crash) are refused naming the flag; the largest
 * accepted --images-per-prompt runs.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "flexdiag.h"
#include "runtime/model/model.h"
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

/* ---- advertised ranges are the parser's ---- */

#define SENTINEL "--zz-not-a-flag" /* the parser's last word when every value before passed */

/* `cmd flag value SENTINEL` with bin: the parser took value (the unknown sentinel stopped the
 * run) or refused it naming flag; returns 1 when taken. */
static int parser_takes(const char *bin, const char *cmd, const char *flag, const char *value) {
    int rc = run(bin, "%s %s %s " SENTINEL, cmd, flag, value);
    char *err = read_in_dir("err.txt");
    assert_non_null(err);
    int taken = strstr(err, "unknown flag '" SENTINEL "'") != NULL;
    char named[96];
    snprintf(named, sizeof named, ": %s", flag);
    if (rc != 2 || (!taken && !strstr(err, named)))
        fail_msg("%s %s %s: exit %d, stderr '%s'", cmd, flag, value, rc, err);
    free(err);
    return taken;
}

/* The value strings just outside an int range [lo, hi] ("" when the bound is the type's). */
static void int_outside(int64_t lo, int64_t hi, char out[2][32]) {
    snprintf(out[0], 32, "%" PRId64, lo - 1);
    if (lo == INT64_MIN) out[0][0] = 0;
    if (hi == INT64_MAX) snprintf(out[1], 32, "9223372036854775808"); /* strtoll: ERANGE */
    else snprintf(out[1], 32, "%" PRId64, hi + 1);
}

/* One help line's range, checked against the parser: bounds taken, just outside refused. */
static int check_range(const char *bin, const char *cmd, const char *line) {
    char flag[64];
    if (sscanf(line, " %63s", flag) != 1 || strncmp(flag, "--", 2)) return 0;
    const char *at = strstr(line, "; a whole number in [");
    const char *num = strstr(line, "; a number in ");
    char in[2][32], out[2][32];
    if (at) {
        long long lo, hi;
        assert_int_equal(sscanf(at, "; a whole number in [%lld, %lld]", &lo, &hi), 2);
        snprintf(in[0], 32, "%lld", lo), snprintf(in[1], 32, "%lld", hi);
        int_outside(lo, hi, out);
    } else if (num) {
        char open;
        double lo, hi;
        assert_int_equal(sscanf(num, "; a number in %c%lf, %lf]", &open, &lo, &hi), 3);
        double step = 1e-3 * fmax(1.0, fmax(fabs(lo), fabs(hi)));
        snprintf(in[0], 32, "%.17g", open == '(' ? lo + step : lo);
        snprintf(in[1], 32, "%.17g", hi);
        snprintf(out[0], 32, "%.17g", open == '(' ? lo : lo - step);
        snprintf(out[1], 32, "%.17g", hi + step);
    } else {
        return 0;
    }
    for (int b = 0; b < 2; b++) {
        if (!parser_takes(bin, cmd, flag, in[b]))
            fail_msg("%s: help says '%s' takes %s; the parser refused it", cmd, flag, in[b]);
        if (out[b][0] && parser_takes(bin, cmd, flag, out[b]))
            fail_msg("%s: help's range of %s excludes %s; the parser took it", cmd, flag,
                     out[b]);
    }
    return 1;
}

/* Every ranged flag of `bin cmd --help`; the number checked. */
static int check_command_ranges(const char *bin, const char *cmd) {
    assert_int_equal(run(bin, "%s --help", cmd), 0);
    char *help = read_in_dir("out.txt");
    assert_non_null(help);
    int n = 0;
    for (char *line = help; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", line);
        n += check_range(bin, cmd, copy);
        line = nl ? nl + 1 : NULL;
    }
    free(help);
    return n;
}

static void test_ranges(void **state) {
    (void)state;
    static const char *cmds[] = {"generate", "score", "decode", "policy-trace", "bench",
                                 "bench fidelity", "profile", "search"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (check_command_ranges(g_bin, cmds[i]) == 0)
            fail_msg("flexdiag %s --help advertises no range", cmds[i]);
    assert_true(check_command_ranges(g_bench, "requests") > 0);
}

/* --arch's help lists the library's builtin shapes, and the library builds each. */
static void test_archs(void **state) {
    (void)state;
    assert_int_equal(run(g_bin, "generate --help"), 0);
    char *help = read_in_dir("out.txt"), *line = strstr(help, "  --arch ");
    assert_non_null(line);
    line[strcspn(line, "\n")] = 0;
    int32_t n = 0;
    for (; flexdiag_builtin_arch(n); n++) {
        const char *name = flexdiag_builtin_arch(n);
        char listed[80];
        snprintf(listed, sizeof listed, " %s%s", name, n ? "" : " (default)");
        if (!strstr(line, listed)) fail_msg("--arch help '%s' lacks '%s'", line, listed);
        flexdiag_model_config c;
        if (flexdiag__config_builtin(name, &c) != FLEXDIAG_OK)
            fail_msg("--arch %s is listed but refused: %s", name, flexdiag_last_error(NULL));
    }
    assert_true(n >= 11);
    assert_string_equal(flexdiag_builtin_arch(0), "tiny-janus");
    flexdiag_model_config c;
    assert_int_equal(flexdiag__config_builtin("no-such-shape", &c), FLEXDIAG_ERR_INVALID_ARG);
    free(help);
}

/* ---- int flags whose products overflowed ---- */

static void test_overflow(void **state) {
    (void)state;
    static const struct {
        const char *args, *flag;
    } cases[] = {
        {"bench --cpu --arch micro-janus --random-weights --images-per-prompt 2147483647",
         "--images-per-prompt 2147483647"},
        {"bench --cpu --arch micro-janus --random-weights --prompt-len 2147483647",
         "--prompt-len 2147483647"},
        {"generate --cpu --arch micro-janus --max-prompt-len 2147483647 --out o",
         "--max-prompt-len 2147483647"},
        {"search --cpu --arch micro-janus --random-weights --images-per-prompt 2147483647",
         "--images-per-prompt 2147483647"},
        {"bench fidelity --synthetic grid:4 --d-head 2147483647", "--d-head 2147483647"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run(g_bin, "%s", cases[i].args);
        char *err = read_in_dir("err.txt");
        if (rc != 2 || !err || !strstr(err, cases[i].flag) || !strstr(err, "out of range"))
            fail_msg("flexdiag %s: exit %d, stderr '%s'", cases[i].args, rc, err ? err : "");
        free(err);
    }
    /* one distinct prompt for a batch of 2 at the largest --images-per-prompt */
    assert_int_equal(run(g_bin, "bench --cpu --arch micro-janus --random-weights --batch 2 "
                                "--images-per-prompt 65536 --steps 2 --profile-steps 1"),
                     0);
    assert_file_has("out.txt", "| dense |");
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
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_archs),
        cmocka_unit_test(test_overflow),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
