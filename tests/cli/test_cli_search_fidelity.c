/*
 * test_cli_search_fidelity.c - `flexdiag-bench search --min-fidelity` (issue #17), apart from
 * test_cli_search.c because its fidelity run is the slowest part of the search tests (about
 * 100 s under the sanitizer build on 2 cores). On the trained models/shapes-janus a floor no
 * sparse policy reaches leaves dense alone, each pair's figure printed; the flag without
 * --model, and --fidelity-prompts without --min-fidelity, are refused (exit 2).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "search_fixture.h"
#include "util.h"

static const char *g_bench; /* $FLEXDIAG_BENCH_BIN */
static char *g_dir;         /* temporary folder of this run, with the profile p.json */

static char *read_in_dir(const char *name) { return search_fixture_read(g_dir, name); }

static void test_min_fidelity(void **state) {
    (void)state;
    char *model = tu_data_path("../models/shapes-janus");
    /* window at 50 % agrees with dense on ~86 % of the top-1 tokens there: below 0.999 */
    int rc = tu_system("cd '%s' && '%s' search --cpu --threads 2 --model '%s' --gpu-mem 256M "
                       "--profile p.json --policies dense,window --max-sparsity 0.5 "
                       "--min-fidelity 0.999 --top 3 --json >f.out 2>f.err", g_dir, g_bench,
                       model, NULL);
    assert_int_equal(rc, 0);
    char *out = read_in_dir("f.out"), *err = read_in_dir("f.err");
    assert_non_null(strstr(out, "\"policy\":\"dense\""));
    assert_null(strstr(out, "\"policy\":\"window\""));
    assert_non_null(strstr(err, "window at 0.5: top-1"));
    assert_non_null(strstr(err, "below the floor, dropped"));
    free(out);
    free(err);
    free(model);
}

static void test_refusals(void **state) {
    (void)state;
    int rc = tu_system("cd '%s' && '%s' search --cpu --arch micro-janus --random-weights "
                       "--gpu-mem 64M --profile p.json --min-fidelity 0.5 >g.out 2>g.err", g_dir,
                       g_bench, NULL);
    assert_int_equal(rc, 2); /* no checkpoint to measure on */
    rc = tu_system("cd '%s' && '%s' search --cpu --arch micro-janus --random-weights "
                   "--gpu-mem 64M --profile p.json --fidelity-prompts x.txt >g.out 2>g.err",
                   g_dir, g_bench, NULL);
    assert_int_equal(rc, 2); /* without --min-fidelity it would measure nothing */
}

int main(void) {
    int set = search_fixture_open("test_cli_search_fidelity", "search-fid", &g_bench, &g_dir);
    if (set) return set;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_min_fidelity),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmtree(g_dir);
    free(g_dir);
    return rc;
}
