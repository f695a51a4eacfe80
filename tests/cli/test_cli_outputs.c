/*
 * test_cli_outputs.c - output files that cannot be written, and a reused --out, through the
 * real binaries ($FLEXDIAG_BIN, $FLEXDIAG_BENCH_BIN) on micro-janus on the CPU; the failures
 * injected into every writer are in tests/fault/.
 *
 * `bench --json` and `bench fidelity --json` into a missing folder fail at once (exit 1, one
 * line naming the file and the error, nothing measured, no folder made); into /dev/full (a
 * real ENOSPC on every write) they fail with the row printed on stdout and the line naming the
 * file; into a folder without write permission (when not root) with "Permission denied". A
 * second `generate` into the same --out warns that the earlier PNGs are kept, keeps them, and
 * results.jsonl and tokens.json describe the new run only, also when it stops before writing.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

static const char *g_bin;   /* $FLEXDIAG_BIN */
static const char *g_bench; /* $FLEXDIAG_BENCH_BIN */
static char *g_dir;         /* temporary folder of this run */

#define BENCH                                                                                      \
    "bench --cpu --arch micro-janus --random-weights --batch 1 --steps 4 --profile-steps 1"
#define FIDELITY "bench fidelity --synthetic grid:4 --policies dense,window --sparsities 0.5"

/* `bin ARGS` run in g_dir (tests/util.h tu_run_in); a file of g_dir read whole. */
#define run(bin, ...) tu_run_in(g_dir, bin, __VA_ARGS__)
#define read_in_dir(name) tu_read_in(g_dir, name)

static int exists_in_dir(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return access(path, F_OK) == 0;
}

/* The first stderr line that is not a progress line ("[1/2] ...") names both needles. */
static void assert_first_line(const char *n1, const char *n2) {
    char *err = read_in_dir("err.txt"), *line = err;
    assert_non_null(err);
    while (*line == '[' && strchr(line, '\n')) line = strchr(line, '\n') + 1;
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    if (!strstr(line, n1) || !strstr(line, n2))
        fail_msg("first stderr line '%s' lacks '%s' or '%s'", line, n1, n2);
    free(err);
}

/* Rows of the markdown table on stdout. */
static int md_rows(void) {
    char *out = read_in_dir("out.txt");
    assert_non_null(out);
    int n = 0;
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        n += !strncmp(l, "| ", 2) && strncmp(l, "| policy", 8);
    free(out);
    return n;
}

static void test_json_missing_folder(void **state) {
    (void)state;
    const char *cmds[] = {BENCH, FIDELITY};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(run(g_bench, "%s --json nodir/rows.jsonl", cmds[i]), 1);
        assert_first_line("nodir/rows.jsonl", "No such file or directory");
        assert_int_equal(md_rows(), 0); /* stopped before measuring: nothing to lose */
        assert_false(exists_in_dir("nodir"));
    }
}

static void test_json_full_disk(void **state) {
    (void)state;
    if (access("/dev/full", W_OK) != 0) {
        fprintf(stderr, "no writable /dev/full: full-disk case skipped (tests/fault covers it)\n");
        skip();
    }
    const char *cmds[] = {BENCH, FIDELITY};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(run(g_bench, "%s --json /dev/full", cmds[i]), 1);
        assert_first_line("/dev/full", "No space left on device");
        assert_int_equal(md_rows(), 1); /* the row measured, on stdout; the run stopped */
    }
}

static void test_json_read_only(void **state) {
    (void)state;
    char ro[4200];
    snprintf(ro, sizeof ro, "%s/ro", g_dir);
    assert_int_equal(mkdir(ro, 0555), 0);
    if (access(ro, W_OK) == 0) { /* root writes anyway; tests/fault injects EROFS instead */
        fprintf(stderr, "running as root: read-only folder case skipped\n");
        skip();
    }
    assert_int_equal(run(g_bench, "%s --json ro/rows.jsonl", BENCH), 1);
    assert_first_line("ro/rows.jsonl", "Permission denied");
    assert_int_equal(md_rows(), 0);
}

/* Lines of a JSON-lines file (each must parse). */
static int jsonl_lines(const char *name) {
    char *text = read_in_dir(name);
    assert_non_null(text);
    int n = 0;
    for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1, n++) {
        *nl = 0;
        json_t *r = json_loads(line, 0, NULL);
        assert_non_null(r);
        json_decref(r);
    }
    free(text);
    return n;
}

static int tokens_images(const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    json_t *t = json_load_file(path, 0, NULL);
    assert_non_null(t);
    int n = (int)json_array_size(json_object_get(t, "images"));
    json_decref(t);
    return n;
}

static void assert_err_has(const char *needle, int want) {
    char *err = read_in_dir("err.txt");
    assert_non_null(err);
    if (!!strstr(err, needle) != want)
        fail_msg("stderr '%s' %s '%s'", err, want ? "lacks" : "has", needle);
    free(err);
}

#define GEN "generate --cpu --arch micro-janus --quiet --prompt x"

static void test_reused_out(void **state) {
    (void)state;
    assert_int_equal(run(g_bin, GEN " --images-per-prompt 4 --out o"), 0);
    assert_err_has("warning", 0); /* a new folder: no warning */
    assert_int_equal(run(g_bin, GEN " --images-per-prompt 2 --out o"), 0);
    assert_err_has("flexdiag generate: warning: --out o already holds 4 PNG(s) from an earlier "
                   "run; they are kept",
                   1);
    for (int k = 0; k < 4; k++) { /* 0, 1 replaced; 2, 3 kept */
        char png[64];
        snprintf(png, sizeof png, "o/0/%d.png", k);
        assert_true(exists_in_dir(png));
    }
    assert_int_equal(jsonl_lines("o/results.jsonl"), 2);
    assert_int_equal(tokens_images("o/tokens.json"), 2);
    /* a run that stops before its first image: results.jsonl and tokens.json of the earlier
     * run do not outlive it (--batch auto needs --gpu-mem on the CPU: exit 2 after --out) */
    assert_int_equal(run(g_bin, GEN " --batch auto --out o"), 2);
    assert_err_has("already holds 4 PNG(s)", 1);
    assert_int_equal(jsonl_lines("o/results.jsonl"), 0);
    assert_false(exists_in_dir("o/tokens.json"));
    /* GenEval's samples sit two folders down: counted too */
    char meta[4200];
    snprintf(meta, sizeof meta, "%s/meta.jsonl", g_dir);
    const char *line = "{\"prompt\": \"a photo of a bench\"}\n";
    assert_int_equal(tu_write_file(meta, line, strlen(line)), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(run(g_bin, "generate --cpu --arch micro-janus --quiet --layout geneval "
                                    "--prompts meta.jsonl --images-per-prompt 2 --out g"),
                         0);
    assert_err_has("--out g already holds 2 PNG(s)", 1);
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tempdir("outputs");
    return g_dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char ro[4200];
    snprintf(ro, sizeof ro, "%s/ro", g_dir);
    chmod(ro, 0755);
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void) {
    g_bin = getenv("FLEXDIAG_BIN");
    g_bench = getenv("FLEXDIAG_BENCH_BIN");
    if (!g_bin || !g_bench || access(g_bin, X_OK) != 0 || access(g_bench, X_OK) != 0) {
        fprintf(stderr, "FLEXDIAG_BIN / FLEXDIAG_BENCH_BIN are not executable: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_missing_folder),
        cmocka_unit_test(test_json_full_disk),
        cmocka_unit_test(test_json_read_only),
        cmocka_unit_test(test_reused_out),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
