/*
 * test_cli_resume.c - `flexdiag generate --resume` through the binary ($FLEXDIAG_BIN), one
 * process, micro-janus on the CPU (issue #19; the MPI side is test_cli_mpi.c).
 *
 * The reference is an uninterrupted run of each job (plain: 4 prompts x 2 images; DPG: 3
 * prompts x 2 samples). "The same folder" is outdir.h's: PNG and tokens.json bytes equal,
 * results.jsonl records equal in the same order except the timing fields block_s and
 * images_in_block, no part or temp record file left.
 *  - a plain run killed with SIGKILL after its first images (tokens.json still in its temp file,
 *    maybe a PNG without its records) and resumed with another --batch;
 *  - a DPG run stopped by SIGTERM (exit 143) after its first grid, then resumed;
 *  - lost files: a copy of the reference without one PNG and without its last results.jsonl
 *    line (plain), and without one grid (DPG: the whole prompt is made again);
 *  - a complete folder: "nothing to make", left equal;
 *  - refusals: --sample-seed, --policy, --images-per-prompt or the prompts differ from the
 *    folder's run: exit 2, one line naming --out, the field and the flag, folder untouched.
 * The whole file makes about 40 images (a few seconds; about a minute under the sanitizers).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/outdir.h"
#include "util.h"

#define PLAIN "--quiet --prompts p.txt --images-per-prompt 2 "
#define DPG "--quiet --layout dpg --prompts d.tsv --images-per-prompt 2 "

static char *g_dir; /* temporary folder: prompts, the references ref/ and dref/ */

static void write_text(const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* g_dir/name, in a static buffer (one at a time). */
static const char *in_dir(const char *name) {
    static char path[4400];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return path;
}

/* Lines of g_dir/name (0 when missing). */
static int line_count(const char *name) {
    size_t n = 0;
    char *text = tu_read_file(in_dir(name), &n);
    int lines = 0;
    for (size_t i = 0; text && i < n; i++) lines += text[i] == '\n';
    free(text);
    return lines;
}

/* A fresh copy of reference folder from as to. */
static void copy_ref(const char *from, const char *to) {
    assert_int_equal(tu_system("cd '%s' && rm -rf '%s' && cp -r '%s' '%s'", g_dir, to, from, to),
                     0);
}

/* Resume args into out; exit 0 and the "--resume" line says how many were complete. */
static void resume(const char *args, const char *out, const char *note) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --resume --out %s", args, out);
    assert_int_equal(od_generate(g_dir, "", cmd), 0);
    od_assert_err_has(g_dir, note);
}

/* ---- killed runs ---- */

static void test_killed_plain(void **state) {
    (void)state;
    char *cmd = od_generate_cmd(g_dir, "", PLAIN "--batch 1 --out k");
    pid_t pid = od_spawn(cmd);
    free(cmd);
    od_wait_for(in_dir("k/1/0.png"), pid);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(od_wait(pid), 128 + SIGKILL);
    if (line_count("k/results.jsonl") >= 8) fail_msg("the run ended before it was killed");
    resume(PLAIN "--batch 3", "k", "image(s) are complete in k; making the other");
    od_assert_same_outputs(g_dir, "ref", "k");
}

static void test_sigterm_dpg(void **state) {
    (void)state;
    char *cmd = od_generate_cmd(g_dir, "", DPG "--batch 1 --out t");
    pid_t pid = od_spawn(cmd);
    free(cmd);
    od_wait_for(in_dir("t/a0.png"), pid);
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_int_equal(od_wait(pid), 128 + SIGTERM);
    od_assert_err_has(g_dir, "--resume");
    if (line_count("t/results.jsonl") >= 6) fail_msg("the run ended before it was stopped");
    resume(DPG "--batch 4", "t", "image(s) are complete in t; making the other");
    od_assert_same_outputs(g_dir, "dref", "t");
}

/* ---- lost files ---- */

static void test_lost_files(void **state) {
    (void)state;
    copy_ref("ref", "l");
    assert_int_equal(unlink(in_dir("l/1/1.png")), 0); /* image 3: its records stay */
    assert_int_equal(tu_system("cd '%s/l' && head -n 7 results.jsonl > r && mv r results.jsonl",
                               g_dir),
                     0); /* image 7: its PNG and tokens record stay */
    resume(PLAIN, "l", "6 of 8 image(s) are complete in l; making the other 2");
    od_assert_same_outputs(g_dir, "ref", "l");
    /* a PNG overwritten with other bytes, another cut short: both made again */
    copy_ref("ref", "b");
    assert_int_equal(tu_system("cd '%s/b' && head -c 2000 /dev/urandom > 0/1.png && "
                               "head -c 60 1/0.png > t && mv t 1/0.png", g_dir),
                     0);
    resume(PLAIN, "b", "6 of 8 image(s) are complete in b; making the other 2");
    od_assert_same_outputs(g_dir, "ref", "b");
    copy_ref("dref", "dl");
    assert_int_equal(unlink(in_dir("dl/a1.png")), 0);
    resume(DPG, "dl", "4 of 6 image(s) are complete in dl; making the other 2");
    od_assert_same_outputs(g_dir, "dref", "dl");
}

static void test_complete(void **state) {
    (void)state;
    copy_ref("ref", "c");
    resume(PLAIN, "c", "all 8 image(s) are complete in c; nothing to make");
    od_assert_same_outputs(g_dir, "ref", "c");
}

/* ---- refusals ---- */

/* --resume with args on a copy of ref: exit 2, the first line names --out, field and flag, and
 * the folder stays as it was. */
static void refused(const char *args, const char *field, const char *flag) {
    copy_ref("ref", "x");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --resume --out x", args);
    assert_int_equal(od_generate(g_dir, "", cmd), 2);
    char *err = tu_read_file(in_dir("err.txt"), NULL);
    assert_non_null(err);
    char *nl = strchr(err, '\n');
    if (nl) *nl = 0;
    if (!strstr(err, "--out x") || !strstr(err, field) || !strstr(err, flag))
        fail_msg("first line '%s' does not name --out x, %s and %s", err, field, flag);
    free(err);
    od_assert_same_outputs(g_dir, "ref", "x");
}

static void test_refused(void **state) {
    (void)state;
    refused(PLAIN "--sample-seed 7", "\"seed\": 0, this run has 7", "--sample-seed");
    refused(PLAIN "--policy window --sparsity 0.5", "\"policy\"", "--policy");
    refused("--quiet --prompts p.txt --images-per-prompt 1", "\"prompt_index\"",
            "--images-per-prompt");
    refused("--quiet --prompts d.tsv --images-per-prompt 2", "\"prompt\"", "--prompts");
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tempdir("cli-resume");
    write_text("p.txt", "a red apple\nblue car on a road\nthree cats\na green house\n");
    write_text("d.tsv", "a0\ta zebra next to a tree\na1\ttwo green apples\na2\tone red kite\n");
    if (od_generate(g_dir, "", PLAIN "--out ref") || od_generate(g_dir, "", DPG "--out dref")) {
        fprintf(stderr, "the reference runs failed\n");
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void) {
    const char *bin = getenv("FLEXDIAG_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        fprintf(stderr, "FLEXDIAG_BIN (the flexdiag binary) is not executable: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_plain), cmocka_unit_test(test_sigterm_dpg),
        cmocka_unit_test(test_lost_files),   cmocka_unit_test(test_complete),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
