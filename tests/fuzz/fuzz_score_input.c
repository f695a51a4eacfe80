/*
 * fuzz_score_input.c - libFuzzer target for the JSON input of `flexdiag score`
 * (cli/score_input.c cli_score_input_read). Each input is written into a private temp folder as
 * in.json and read through the same call the command makes.
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - a failure returns exit code 2 (1 only when out of memory), leaves the input zeroed and
 *     prints a message "flexdiag fuzz: ..." naming the file (captured, not shown);
 *   - a success prints nothing and agrees with an independent reading of the same bytes by
 *     jansson: both arrays non-empty, at most CLI_SCORE_MAX_IDS long, equal element by element,
 *     and cfg equal to cfg_weight (5.0 when absent).
 *
 * The same entry point is replayed over tests/fuzz/corpus/score_input by replay.c in the
 * 'format' suite.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/score_input.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dir, *path; /* temp folder and in.json */

/* ids[0..n) equal the integers of root[key]. */
static void check_ids(const json_t *root, const char *key, const int32_t *ids, int32_t n) {
    const json_t *a = json_object_get(root, key);
    FUZZ_CHECK(json_is_array(a) && n >= 1 && n <= CLI_SCORE_MAX_IDS, key);
    FUZZ_CHECK(json_array_size(a) == (size_t)n && ids != NULL, key);
    for (int32_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && json_integer_value(json_array_get(a, (size_t)i)) == ids[i], key);
}

static void check_success(const uint8_t *data, size_t size, const cli_score_input *in,
                          const char *out) {
    FUZZ_CHECK(out[0] == 0, out);
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    FUZZ_CHECK(root != NULL, "accepted input that jansson rejects from memory");
    check_ids(root, "prompt_ids", in->prompt, in->np);
    check_ids(root, "image_ids", in->ids, in->n);
    const json_t *w = json_object_get(root, "cfg_weight");
    FUZZ_CHECK(in->cfg == (w ? json_number_value(w) : 5.0), "cfg_weight");
    json_decref(root);
}

static void check_failure(int rc, const cli_score_input *in, const char *out) {
    static const cli_score_input zero;
    FUZZ_CHECK(rc == 1 || rc == 2, out);
    FUZZ_CHECK(memcmp(in, &zero, sizeof zero) == 0, "failed read left input behind");
    FUZZ_CHECK(strncmp(out, "flexdiag fuzz: ", 15) == 0 && strstr(out, path) != NULL, out);
    FUZZ_CHECK(strchr(out, '\n') == out + strlen(out) - 1, out); /* one line */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) {
        dir = fuzz_tempdir("fuzz-score");
        path = fuzz_path(dir, "in.json");
    }
    fuzz_write(path, data, size);
    cli_score_input in;
    fuzz_stderr_begin();
    int rc = cli_score_input_read("fuzz", path, &in);
    const char *out = fuzz_stderr_end();
    if (rc != 0) {
        check_failure(rc, &in, out);
        return 0;
    }
    check_success(data, size, &in, out);
    cli_score_input_free(&in);
    return 0;
}
