/*
 * test_cli_mpi.c - `mpirun -n 2 --oversubscribe flexdiag generate` against one process
 * (issue #19), micro-janus on the CPU; exit 77 without mpirun on the PATH.
 *
 * With MPI in the build (cli/test_mpi_build.h, from meson):
 *  - plain layout, --batch 2 (chunks of 2 images handed out to 2 ranks) and DPG, --batch 3
 *    (chunks rounded up to whole prompts): PNGs byte-identical to one process's, the merged
 *    results.jsonl with the same records in the same order except the timing fields block_s and
 *    images_in_block (outdir.h), tokens.json byte-identical, no part file left; rank 0's job
 *    summary (img/s per rank and overall, the straggler) on stderr;
 *  - a job whose ranks are killed (SIGKILL, so their part files stay) after the first PNG, then
 *    `mpirun ... --resume`: the folder one uninterrupted process makes.
 * Without MPI in the build: `mpirun -n 2 flexdiag generate` refuses (exit 2) in one line naming
 * the missing MPI, instead of two processes writing the same images.
 * mpirun runs as root in CI (OMPI_ALLOW_RUN_AS_ROOT*), with shared-memory copies that need no
 * ptrace rights (containers); under the sanitizers MPI's own allocations at exit are not
 * counted as leaks (mpi_lsan.supp; MPI's components stay loaded so that their frames have names).
 */
#include <dirent.h>
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
#include "cli/test_mpi_build.h"
#include "util.h"

#define MPIRUN "mpirun -n 2 --oversubscribe"
#define PLAIN "--quiet --prompts p.txt --images-per-prompt 2 "
#define DPG "--quiet --layout dpg --prompts d.tsv --images-per-prompt 2 "

static char *g_dir; /* temporary folder: prompts, one process's ref/ and dref/, MPI outputs */

static const char *in_dir(const char *name) {
    static char path[4400];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return path;
}

/* mpirun into mpi_out: what one process made in ref_out, and the job summary. */
static void compare_runs(const char *args, const char *ref_out, const char *mpi_out) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --out %s", args, mpi_out);
    assert_int_equal(od_generate(g_dir, MPIRUN, cmd), 0);
    od_assert_err_has(g_dir, "by 2 ranks");
    od_assert_err_has(g_dir, "img/s overall");
    od_assert_err_has(g_dir, "  rank 1 on ");
    od_assert_err_has(g_dir, "straggler: rank ");
    od_assert_same_outputs(g_dir, ref_out, mpi_out);
}

static void test_mpi_plain(void **state) {
    (void)state;
    compare_runs(PLAIN "--batch 2", "ref", "m");
}

static void test_mpi_dpg(void **state) {
    (void)state;
    compare_runs(DPG "--batch 3", "dref", "dm");
}

/* SIGKILL every flexdiag process whose parent is pid (the ranks mpirun started); how many. */
static int kill_ranks(pid_t pid) {
    DIR *d = opendir("/proc");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], stat[512] = "";
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t got = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[got] = 0;
        char *name = strchr(stat, '('), *end = strrchr(stat, ')');
        int ppid = 0;
        if (!name || !end || sscanf(end + 1, " %*c %d", &ppid) != 1 || ppid != pid) continue;
        if (strncmp(name, "(flexdiag)", 10)) continue;
        n += kill((pid_t)atoi(e->d_name), SIGKILL) == 0;
    }
    closedir(d);
    return n;
}

static void test_mpi_killed_resumed(void **state) {
    (void)state;
    char *cmd = od_generate_cmd(g_dir, MPIRUN, PLAIN "--batch 1 --out k");
    pid_t pid = od_spawn(cmd);
    free(cmd);
    od_wait_for(in_dir("k/0/0.png"), pid);
    if (kill_ranks(pid) != 2) fail_msg("could not find and kill mpirun's 2 ranks");
    assert_true(od_wait(pid) != 0);
    assert_int_equal(od_generate(g_dir, MPIRUN, PLAIN "--batch 2 --resume --out k"), 0);
    od_assert_err_has(g_dir, "image(s) are complete in k; making the other");
    od_assert_same_outputs(g_dir, "ref", "k");
}

static void test_no_mpi_refused(void **state) {
    (void)state;
    assert_int_equal(od_generate(g_dir, MPIRUN, PLAIN "--out n"), 2);
    od_assert_err_has(g_dir, "built without MPI");
    assert_int_equal(access(in_dir("n"), F_OK), -1);
}

/* What mpirun needs here: root (CI), no ptrace rights, the sanitizers' leak report. */
static void mpi_env(void) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
#if defined(__SANITIZE_ADDRESS__)
    char *supp = tu_data_path("cli/mpi_lsan.supp"), *lsan = NULL, *asan = NULL;
    const char *old = getenv("ASAN_OPTIONS");
    assert_true(asprintf(&lsan, "suppressions=%s:print_suppressions=0", supp) > 0);
    /* the slow unwinder reaches MPI's frames beneath its allocations, so the file matches */
    assert_true(asprintf(&asan, "%s%sfast_unwind_on_malloc=0", old ? old : "", old ? ":" : "") >
                0);
    setenv("LSAN_OPTIONS", lsan, 1);
    setenv("ASAN_OPTIONS", asan, 1);
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
    free(supp);
    free(lsan);
    free(asan);
#endif
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tempdir("cli-mpi");
    const char *p = "a red apple\nblue car on a road\nthree cats\n";
    const char *d = "a0\ta zebra next to a tree\na1\ttwo green apples\na2\tone red kite\n";
    int rc = tu_write_file(in_dir("p.txt"), p, strlen(p));
    if (!rc) rc = tu_write_file(in_dir("d.tsv"), d, strlen(d));
    if (!rc && FLEXDIAG_TEST_MPI) /* the references: one process */
        rc = od_generate(g_dir, "", PLAIN "--out ref") || od_generate(g_dir, "", DPG "--out dref");
    return rc ? -1 : 0;
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
    if (tu_system("command -v mpirun >/dev/null") != 0) {
        fprintf(stderr, "mpirun is not on the PATH (apt-get install openmpi-bin): skipped\n");
        return 77;
    }
    mpi_env();
    const struct CMUnitTest with_mpi[] = {
        cmocka_unit_test(test_mpi_plain),
        cmocka_unit_test(test_mpi_dpg),
        cmocka_unit_test(test_mpi_killed_resumed),
    };
    const struct CMUnitTest without_mpi[] = {cmocka_unit_test(test_no_mpi_refused)};
    if (FLEXDIAG_TEST_MPI) return cmocka_run_group_tests(with_mpi, setup, teardown);
    return cmocka_run_group_tests(without_mpi, setup, teardown);
}
