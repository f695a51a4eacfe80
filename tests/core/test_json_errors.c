/*
 * test_json_errors.c - messages about JSON inputs say where the fault is (issue 40): the line
 * and column of a syntax error, the key path and what was expected of a value of the wrong
 * type, and no position at all when there is none (a file that cannot be opened: jansson's
 * line -1 is never printed). config.json and tokenizer.json through flexdiag_model_load,
 * the input of `flexdiag score --input` through the CLI ($FLEXDIAG_BIN).
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
#include "util.h"

static char *g_dir;            /* temp folder: one model folder, score inputs */
static flexdiag_runtime *g_rt; /* CPU runtime */

/* A Llama config.json the loader takes (the model folder's tokenizer.json is read next). */
static const char llama_cfg[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 64,\n"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"num_hidden_layers\": 1,\n"
    " \"vocab_size\": 64, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5}\n";

static void write_in_dir(const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* Loading the model folder fails; its message has every fragment and no "line -1". */
static void expect_load(const char *frag1, const char *frag2) {
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    flexdiag_model *m = NULL;
    flexdiag_status st = flexdiag_model_load(g_rt, g_dir, &mp, &m);
    const char *msg = flexdiag_last_error(NULL);
    printf("  %s\n", msg);
    assert_int_not_equal(st, FLEXDIAG_OK);
    assert_null(m);
    if (!strstr(msg, frag1) || (frag2 && !strstr(msg, frag2)) || strstr(msg, "line -1"))
        fail_msg("message '%s': want '%s'%s%s and no line -1", msg, frag1, frag2 ? ", " : "",
                 frag2 ? frag2 : "");
}

static void test_config_json(void **state) {
    (void)state;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    remove(path);
    expect_load("config.json: cannot read model config: unable to open", NULL);
    write_in_dir("config.json", "{\"model_type\": \"llama\",\n \"hidden_size\": \"x\"}\n");
    expect_load("config.json: hidden_size", "an integer");
    write_in_dir("config.json", "{\"model_type\": \"llama\",\n \"hidden_size\": 32,,}\n");
    expect_load("config.json: cannot read model config at line 2 column", NULL);
    write_in_dir("config.json", "[1, 2]\n");
    expect_load("config.json: not a JSON object", NULL);
}

static void test_tokenizer_json(void **state) {
    (void)state;
    write_in_dir("config.json", llama_cfg);
    write_in_dir("tokenizer.json",
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": 5, \"merges\": []}}");
    expect_load("tokenizer.json: model.vocab", NULL);
    write_in_dir("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}}}");
    expect_load("tokenizer.json: model.vocab", NULL);
    write_in_dir("tokenizer.json", "{\"model\":\n {\"type\": \"BPE\",}}");
    expect_load("tokenizer.json: invalid JSON at line 2 column", NULL);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    remove(path);
}

/* `flexdiag score --input in.json` on the builtin model: exit 2 and one line with every
 * fragment, no "line -1". */
static void expect_score(const char *input, const char *frag1, const char *frag2) {
    if (input) write_in_dir("in.json", input);
    else {
        char path[4200];
        snprintf(path, sizeof path, "%s/in.json", g_dir);
        remove(path);
    }
    int rc = tu_system("cd '%s' && '%s' score --cpu --arch micro-janus --input in.json --out "
                       "s.npy 2>score.err", g_dir, getenv("FLEXDIAG_BIN"));
    char path[4200];
    snprintf(path, sizeof path, "%s/score.err", g_dir);
    char *msg = tu_read_file(path, NULL);
    assert_non_null(msg);
    printf("  score: %d: %s", rc, msg);
    if (rc != 2 || !strstr(msg, frag1) || (frag2 && !strstr(msg, frag2)) || strstr(msg, "line -1"))
        fail_msg("flexdiag score: exit %d, '%s': want exit 2, '%s'%s%s and no line -1", rc, msg,
                 frag1, frag2 ? ", " : "", frag2 ? frag2 : "");
    free(msg);
}

static void test_score_input(void **state) {
    (void)state;
    expect_score(NULL, "--input in.json: unable to open in.json", NULL);
    expect_score("{\"prompt_ids\": \"a\", \"image_ids\": [1]}", "prompt_ids", "array");
    expect_score("{\"prompt_ids\": [1, 2], \"image_ids\": [1.5]}", "image_ids[0]", NULL);
    expect_score("{\"prompt_ids\": [1, 2],\n \"image_ids\": [1,]}", "(line 2, column", NULL);
}

int main(void) {
    if (!getenv("FLEXDIAG_BIN")) {
        fprintf(stderr, "test_json_errors: FLEXDIAG_BIN not set (run through meson test)\n");
        return 77;
    }
    g_dir = tu_tempdir("json-errors");
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    if (flexdiag_runtime_create(&rp, &g_rt) != FLEXDIAG_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_tokenizer_json),
        cmocka_unit_test(test_score_input),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    flexdiag_runtime_destroy(g_rt);
    tu_rmtree(g_dir);
    free(g_dir);
    return rc;
}
