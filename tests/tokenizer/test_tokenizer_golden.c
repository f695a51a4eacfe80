/*
 * test_tokenizer_golden.c - flexdiag's tokenizer against ids produced by the Hugging Face
 * `tokenizers` library (tools/golden/ writes data/tokenizer.json, a DeepSeek-LLM-style
 * byte-level BPE, and data/cases.json):
 *   cases:         {"text", "ids"}   ids = encode(text, add_special_tokens=False)
 *   janus_prompts: {"prompt", "ids"} ids = [BOS] + encode(template(prompt)) + [<begin_of_image>]
 * Every case must match exactly. Exits 77 (skip) while the generated files are absent.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/core.h"
#include "runtime/text/tokenizer.h"
#include "tok_bytes.h"
#include "util.h"

static flexdiag_tokenizer *tok;
static json_t *cases;

/* ids equal to the JSON array want? Prints both on a mismatch. */
static int same_ids(const char *label, const char *text, const int32_t *ids, int64_t n,
                    const json_t *want) {
    int same = json_is_array(want) && (size_t)n == json_array_size(want);
    for (int64_t i = 0; same && i < n; i++)
        same = json_integer_value(json_array_get(want, (size_t)i)) == ids[i];
    if (!same) {
        char *w = json_dumps(want, JSON_COMPACT);
        fprintf(stderr, "%s mismatch for \"%s\"\n  want %s\n  got  [", label, text, w);
        for (int64_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? "," : "", ids[i]);
        fprintf(stderr, "]\n");
        free(w);
    }
    return same;
}

static void test_cases(void **state) {
    (void)state;
    const json_t *list = json_object_get(cases, "cases");
    assert_true(json_array_size(list) > 0);
    int bad = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *c = json_array_get(list, i), *text = json_object_get(c, "text");
        int32_t *ids;
        int64_t n;
        flexdiag__err_clear();
        flexdiag_status st =
            flexdiag__tok_encode(tok, json_string_value(text), json_string_length(text), &ids, &n);
        if (st) fprintf(stderr, "case %zu: %s\n", i, flexdiag__err_msg());
        assert_int_equal(st, FLEXDIAG_OK);
        bad += !same_ids("case", json_string_value(text), ids, n, json_object_get(c, "ids"));
        free(ids);
    }
    fprintf(stderr, "%zu cases, %d mismatches\n", json_array_size(list), bad);
    assert_int_equal(bad, 0);
}

static void test_janus_prompts(void **state) {
    (void)state;
    const json_t *list = json_object_get(cases, "janus_prompts");
    assert_true(json_array_size(list) > 0);
    int bad = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *c = json_array_get(list, i);
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int32_t *ids;
        int64_t n;
        flexdiag__err_clear();
        flexdiag_status st = flexdiag__janus_prompt_ids(tok, prompt, &ids, &n);
        if (st) fprintf(stderr, "prompt %zu: %s\n", i, flexdiag__err_msg());
        assert_int_equal(st, FLEXDIAG_OK);
        bad += !same_ids("janus prompt", prompt, ids, n, json_object_get(c, "ids"));
        free(ids);
    }
    fprintf(stderr, "%zu Janus prompts, %d mismatches\n", json_array_size(list), bad);
    assert_int_equal(bad, 0);
}

/* The ids of a case decode to its text (byte-level is lossless): flexdiag__tok_decode. */
static void test_round_trip(void **state) {
    (void)state;
    const json_t *list = json_object_get(cases, "cases");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *c = json_array_get(list, i), *want = json_object_get(c, "ids");
        const json_t *text = json_object_get(c, "text");
        int64_t n = (int64_t)json_array_size(want);
        int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
        assert_non_null(ids);
        for (int64_t k = 0; k < n; k++)
            ids[k] = (int32_t)json_integer_value(json_array_get(want, (size_t)k));
        size_t len;
        char *s = NULL;
        assert_int_equal(flexdiag__tok_decode(tok, ids, n, false, &s, &len), FLEXDIAG_OK);
        if (len != json_string_length(text) || memcmp(s, json_string_value(text), len))
            fprintf(stderr, "bytes of case %zu: \"%s\" != \"%s\"\n", i, s,
                    json_string_value(text));
        assert_memory_equal(s, json_string_value(text), len);
        assert_int_equal(len, json_string_length(text));
        free(s);
        free(ids);
    }
}

/* 0 when both generated files are present and loaded; 77 (with a reason) when absent. */
static int setup_data(void) {
    char *tj = tu_data_path("tokenizer/data/tokenizer.json");
    char *cj = tu_data_path("tokenizer/data/cases.json");
    int rc = 0;
    if (access(tj, R_OK) != 0 || access(cj, R_OK) != 0) {
        fprintf(stderr,
                "skip: %s or %s is missing; generate them with tools/golden/ "
                "(the tokenizers library)\n",
                tj, cj);
        rc = 77;
    } else if (flexdiag__tok_load(tj, &tok) != FLEXDIAG_OK) {
        fprintf(stderr, "%s\n", flexdiag__err_msg());
        rc = 1;
    } else {
        json_error_t je;
        cases = json_load_file(cj, 0, &je);
        if (!cases) fprintf(stderr, "%s: line %d: %s\n", cj, je.line, je.text);
        rc = cases ? 0 : 1;
    }
    free(tj);
    free(cj);
    return rc;
}

int main(void) {
    int rc = setup_data();
    if (rc) return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_janus_prompts),
        cmocka_unit_test(test_round_trip),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    flexdiag__tok_destroy(tok);
    json_decref(cases);
    return rc;
}
