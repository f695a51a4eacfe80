/*
 * test_version.c - one version everywhere: the generated header's numbers spell its string, the
 * library returns that string (flexdiag_version), and `flexdiag --version` and
 * `flexdiag-bench --version` print it ($FLEXDIAG_BIN, $FLEXDIAG_BENCH_BIN), exiting 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "flexdiag.h"
#include "flexdiag_version.h"
#include "util.h"

static void test_header_and_call(void **state) {
    (void)state;
    char s[64];
    snprintf(s, sizeof s, "%d.%d.%d", FLEXDIAG_VERSION_MAJOR, FLEXDIAG_VERSION_MINOR,
             FLEXDIAG_VERSION_PATCH);
    assert_string_equal(s, FLEXDIAG_VERSION_STRING);
    assert_string_equal(flexdiag_version(), FLEXDIAG_VERSION_STRING);
}

/* `<exe> --version` prints "<name> <version>\n" and exits 0. */
static void expect_version(const char *env, const char *name) {
    const char *bin = getenv(env);
    if (!bin) {
        fprintf(stderr, "%s unset (run through meson test): skipped\n", env);
        skip();
    }
    char *dir = tu_tempdir("version");
    assert_non_null(dir);
    assert_int_equal(tu_system("'%s' --version >'%s/out.txt'", bin, dir), 0);
    char path[4096], want[128];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    snprintf(want, sizeof want, "%s %s\n", name, FLEXDIAG_VERSION_STRING);
    char *got = tu_read_file(path, NULL);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    tu_rmtree(dir);
    free(dir);
}

static void test_cli_flag(void **state) {
    (void)state;
    expect_version("FLEXDIAG_BIN", "flexdiag");
    expect_version("FLEXDIAG_BENCH_BIN", "flexdiag-bench");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_and_call),
        cmocka_unit_test(test_cli_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
