/*
 * search_fixture.h - what the search tests (test_cli_search.c, test_cli_search_fidelity.c)
 * share: $FLEXDIAG_BENCH_BIN, a temporary folder holding a CPU profile p.json, and reading a
 * file the run wrote there.
 */
#ifndef FLEXDIAG_TESTS_SEARCH_FIXTURE_H
#define FLEXDIAG_TESTS_SEARCH_FIXTURE_H

/* The bench binary into *bench and a new folder (tag) with `profile --cpu --threads 2 --out
 * p.json` into *dir; 0, 77 without $FLEXDIAG_BENCH_BIN (skip), 1 when the profile fails (the
 * message names test and the folder's prof.err). */
int search_fixture_open(const char *test, const char *tag, const char **bench, char **dir);

/* File name of folder dir, read whole (cmocka failure naming the path if it cannot be). */
char *search_fixture_read(const char *dir, const char *name);

#endif
