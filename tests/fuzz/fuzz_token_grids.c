/*
 * fuzz_token_grids.c - libFuzzer target for the token-grid reader of `flexdiag decode`
 * (cli/token_grids.c cli_token_grids_read): a .npy of ids or the tokens.json of `flexdiag
 * generate`. Each input is written into a private temp folder as t.in and read as grids of
 * HW ids with a codebook of VOCAB, once for every record and once with --index 0.
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - a refusal is exit 1 or 2 after one "flexdiag fuzz: " line naming --tokens or --index;
 *   - a success holds at least one grid, every id in [0, VOCAB), every name >= 0; a .npy's
 *     grids are named 0 .. n-1 (its rows); with --index 0 every grid is named 0 and a .npy is
 *     refused;
 *   - cli_token_grids_free leaves the set zeroed.
 *
 * The same entry point is replayed over tests/fuzz/corpus/token_grids by replay.c in the
 * 'format' suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/token_grids.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HW 4     /* ids per grid */
#define VOCAB 16 /* the codebook */

static char *dir, *path; /* temp folder, the input */

/* Whether the input is read as a tokens.json: its first non-blank byte is '{'. */
static int is_json(const uint8_t *d, size_t n) {
    size_t i = 0;
    while (i < n && (d[i] == ' ' || d[i] == '\n' || d[i] == '\t' || d[i] == '\r')) i++;
    return i < n && d[i] == '{';
}

static void check_read(int64_t index, int json) {
    static const cli_token_grids zero;
    cli_token_grids t;
    fuzz_stderr_begin();
    int rc = cli_token_grids_read("fuzz", path, HW, VOCAB, index, &t);
    const char *out = fuzz_stderr_end();
    if (rc != 0) {
        FUZZ_CHECK((rc == 1 || rc == 2) && strstr(out, "flexdiag fuzz: ") != NULL, out);
        FUZZ_CHECK(strstr(out, "--tokens") != NULL || strstr(out, "--index") != NULL, out);
    } else {
        FUZZ_CHECK(json || index < 0, "a .npy read with --index");
        FUZZ_CHECK(t.n >= 1 && t.ids != NULL && t.name != NULL, "no grids");
        for (int64_t i = 0; i < t.n * HW; i++)
            FUZZ_CHECK(t.ids[i] >= 0 && t.ids[i] < VOCAB, "an id outside the codebook");
        for (int64_t i = 0; i < t.n; i++) {
            FUZZ_CHECK(t.name[i] >= 0, "a negative name");
            FUZZ_CHECK(json || t.name[i] == i, "a .npy grid not named by its row");
            FUZZ_CHECK(index < 0 || t.name[i] == index, "a grid other than --index");
        }
    }
    cli_token_grids_free(&t);
    FUZZ_CHECK(memcmp(&t, &zero, sizeof zero) == 0, "cli_token_grids_free");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) {
        dir = fuzz_tempdir("fuzz-token-grids");
        path = fuzz_path(dir, "t.in");
    }
    fuzz_write(path, data, size);
    int json = is_json(data, size);
    check_read(-1, json);
    check_read(0, json);
    return 0;
}
