/*
 * search_fixture.c - the search tests' shared set-up: the bench binary, a temporary folder with
 * a CPU profile, and reading a file the run wrote there (search_fixture.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "search_fixture.h"
#include "util.h"

int search_fixture_open(const char *test, const char *tag, const char **bench, char **dir) {
    *bench = getenv("FLEXDIAG_BENCH_BIN");
    if (!*bench) {
        fprintf(stderr, "%s: FLEXDIAG_BENCH_BIN not set (run through meson test)\n", test);
        return 77;
    }
    *dir = tu_tempdir(tag);
    if (tu_system("cd '%s' && '%s' profile --cpu --threads 2 --out p.json >/dev/null 2>prof.err",
                  *dir, *bench)) {
        fprintf(stderr, "%s: flexdiag-bench profile failed (see %s/prof.err)\n", test, *dir);
        return 1;
    }
    return 0;
}

char *search_fixture_read(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = tu_read_file(path, NULL);
    if (!text) fail_msg("%s: cannot read it", path);
    return text;
}
