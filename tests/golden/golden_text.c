/*
 * golden_text.c - the text decoders against transformers: Llama (GQA; tests/golden/data/llama)
 * and OPT (pre-LayerNorm, biases, ReLU MLP, learned positions with offset 2, tied head;
 * tests/golden/data/opt). Teacher-forced logits and per-layer hidden states, OPT's left-padded
 * batch, and OPT text generation: the prompt ids ([</s>] + encode(prompt), transformers' own
 * tokenizer agreeing), the tokenizer's GPT-2 byte-level encode/decode cases, the teacher-forced
 * logits of transformers' greedy continuation, and `flexdiag generate --top-k 1` as a process
 * giving generate()'s ids (up to its EOS), their decoded text in results.jsonl and on stdout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "golden.h"
#include "runtime/text/prompt.h"
#include "runtime/text/tokenizer.h"
#include "util.h"

/* ---- Llama (GQA) ---- */

void test_llama(void **state) {
    (void)state;
    char *dir = gd_fixture("llama", "");
    flexdiag_npy ids = gd_npy("llama", "input_ids.npy"), ref = gd_npy("llama", "logits.npy");
    flexdiag_npy href = gd_npy("llama", "hidden.npy");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    int32_t T = (int32_t)ids.numel, np = T / 2, V = m->cfg.lm.vocab, *all = gd_npy_ids(&ids);
    float *logits = malloc((size_t)(T - np) * (size_t)V * 4);
    float *hidden = calloc((size_t)href.numel, 4);
    gd_teacher_forced(m, false, all, T, np, logits, hidden, (int32_t)href.shape[1]);
    /* row i predicts token np + i: transformers' logits at position np - 1 + i */
    gd_expect_close("llama logits", logits, (const float *)ref.data + (size_t)(np - 1) * (size_t)V,
                    (int64_t)(T - np) * V);
    gd_expect_close("llama hidden", hidden, href.data, href.numel);
    gd_close_model(rt, m);
    flexdiag__npy_free(&ids);
    flexdiag__npy_free(&ref);
    flexdiag__npy_free(&href);
    free(all);
    free(logits);
    free(hidden);
    free(dir);
}

/* ---- OPT: logits, hidden states, the left-padded batch ---- */

void test_opt(void **state) {
    (void)state;
    char *dir = gd_fixture("opt", "");
    flexdiag_npy ids = gd_npy("opt", "input_ids.npy"), ref = gd_npy("opt", "logits.npy");
    flexdiag_npy href = gd_npy("opt", "hidden.npy"), pref = gd_npy("opt", "padded_logits.npy");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    int32_t T = (int32_t)ids.numel, V = m->cfg.lm.vocab, n_pad = (int32_t)(pref.shape[0] - T);
    assert_int_equal(n_pad, 3);
    assert_int_equal(ref.shape[1], V);
    int32_t *all = gd_npy_ids(&ids);
    float *logits = malloc((size_t)T * (size_t)V * 4), *hidden = calloc((size_t)href.numel, 4);
    /* half the tokens as the prompt: row i predicts token np + i, transformers' position
     * np - 1 + i; the layer outputs of the first positions */
    int32_t np = T / 2;
    gd_teacher_forced(m, false, all, T, np, logits, hidden, (int32_t)href.shape[1]);
    gd_expect_close("opt logits", logits, (const float *)ref.data + (size_t)(np - 1) * (size_t)V,
                    (int64_t)(T - np) * V);
    gd_expect_close("opt hidden", hidden, href.data, href.numel);
    /* the same tokens left-padded with pad id 1 under an attention mask: transformers' logits
     * of the real positions (positions count real tokens only) are what the unpadded run gives */
    for (int32_t cut = 1; cut <= T - 1; cut += 7) {
        gd_teacher_forced(m, false, all, T, cut, logits, NULL, 0);
        const float *pr = (const float *)pref.data + (size_t)(n_pad + cut - 1) * (size_t)V;
        gd_expect_close("opt logits vs the left-padded batch", logits, pr, (int64_t)(T - cut) * V);
    }
    gd_close_model(rt, m);
    flexdiag__npy_free(&ids);
    flexdiag__npy_free(&ref);
    flexdiag__npy_free(&href);
    flexdiag__npy_free(&pref);
    free(all);
    free(logits);
    free(hidden);
    free(dir);
}

/* ---- OPT: text generation (greedy.json) ---- */

typedef struct greedy_case {
    json_t *root;                 /* greedy.json */
    const char *prompt, *text;    /* borrowed from root */
    const char *stop;             /* "eos" or "length" */
    int32_t *prompt_ids, np;      /* [</s>] + encode(prompt) */
    int32_t *generated, ng;       /* generate()'s new ids, through its EOS */
    int32_t *ids, n;              /* the new ids before the EOS */
    int32_t max_new;              /* generate()'s max_new_tokens */
} greedy_case;

static greedy_case greedy_load(void) {
    greedy_case g = {.root = gd_json("opt", "greedy.json")};
    g.prompt = json_string_value(json_object_get(g.root, "prompt"));
    g.text = json_string_value(json_object_get(g.root, "text"));
    g.stop = json_string_value(json_object_get(g.root, "stop"));
    assert_true(g.prompt && g.text && g.stop);
    g.prompt_ids = gd_json_ids(json_object_get(g.root, "prompt_ids"), &g.np);
    g.generated = gd_json_ids(json_object_get(g.root, "generated"), &g.ng);
    g.ids = gd_json_ids(json_object_get(g.root, "ids"), &g.n);
    g.max_new = (int32_t)json_integer_value(json_object_get(g.root, "max_new_tokens"));
    assert_true(g.ng >= 1 && g.n <= g.ng && g.ng <= g.max_new);
    return g;
}

static void greedy_free(greedy_case *g) {
    free(g->prompt_ids);
    free(g->generated);
    free(g->ids);
    json_decref(g->root);
}

/* The logits of every generated id, teacher-forced on prompt + generate()'s ids. */
void test_opt_greedy_logits(void **state) {
    (void)state;
    greedy_case g = greedy_load();
    char *dir = gd_fixture("opt", "");
    flexdiag_npy ref = gd_npy("opt", "greedy_logits.npy"); /* (ng, V) */
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    int32_t T = g.np + g.ng, V = m->cfg.lm.vocab, *all = malloc((size_t)T * 4);
    assert_int_equal(ref.numel, (int64_t)g.ng * V);
    memcpy(all, g.prompt_ids, (size_t)g.np * 4);
    memcpy(all + g.np, g.generated, (size_t)g.ng * 4);
    float *logits = malloc((size_t)ref.numel * 4);
    gd_teacher_forced(m, false, all, T, g.np, logits, NULL, 0);
    gd_expect_close("opt logits of the greedy continuation", logits, ref.data, ref.numel);
    gd_close_model(rt, m);
    flexdiag__npy_free(&ref);
    free(all);
    free(logits);
    free(dir);
    greedy_free(&g);
}

/* 1 when the id lists are equal; else both are printed under what and the result is 0. */
static int same_ids(const char *what, const int32_t *got, int64_t n_got, const int32_t *want,
                    int64_t n_want) {
    if (n_got == n_want && (n_got == 0 || !memcmp(got, want, (size_t)n_got * 4))) return 1;
    fprintf(stderr, "  %s: got", what);
    for (int64_t i = 0; i < n_got; i++) fprintf(stderr, " %d", got[i]);
    fprintf(stderr, "\n  %s: want", what);
    for (int64_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
    fputc('\n', stderr);
    return 0;
}

/* The prompt a text prompt becomes in flexdiag: [</s>] + encode(prompt). */
void test_opt_prompt_ids(void **state) {
    (void)state;
    greedy_case g = greedy_load();
    char *dir = gd_fixture("opt", "");
    flexdiag_runtime *rt;
    flexdiag_model *m;
    gd_open_model(dir, &rt, &m);
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(flexdiag__prompt_ids(m, g.prompt, 0, &ids, &n), FLEXDIAG_OK);
    assert_true(same_ids("opt prompt ids", ids, n, g.prompt_ids, g.np));
    fprintf(stderr, "  opt prompt \"%s\": %lld ids as transformers\n", g.prompt, (long long)n);
    free(ids);
    gd_close_model(rt, m);
    free(dir);
    greedy_free(&g);
}

/* One tokenizer_cases.json case: encode, decode with and without the special tokens; 1 when
 * all three agree with the tokenizers library (mismatches printed). */
static int tokenizer_case(const flexdiag_tokenizer *t, const json_t *cs) {
    const json_t *text = json_object_get(cs, "text");
    int32_t nw = 0, *want = gd_json_ids(json_object_get(cs, "ids"), &nw), *ids = NULL;
    int64_t n = 0;
    assert_int_equal(flexdiag__tok_encode(t, json_string_value(text), json_string_length(text),
                                          &ids, &n), FLEXDIAG_OK);
    int ok = same_ids(json_string_value(text), ids, n, want, nw);
    static const char *keys[2] = {"decoded_all", "decoded"};
    for (int skip = 0; skip < 2; skip++) {
        char *s = NULL;
        size_t len = 0;
        const json_t *ref = json_object_get(cs, keys[skip]);
        assert_int_equal(flexdiag__tok_decode(t, want, nw, skip, &s, &len), FLEXDIAG_OK);
        if (len != json_string_length(ref) || memcmp(s, json_string_value(ref), len)) {
            fprintf(stderr, "  decode (skip_special %d) of \"%s\": got \"%s\", want \"%s\"\n",
                    skip, json_string_value(text), s, json_string_value(ref));
            ok = 0;
        }
        free(s);
    }
    free(ids);
    free(want);
    return ok;
}

/* The GPT-2 byte-level tokenizer (ByteLevel pre-tokenizer with the GPT-2 regex, no prefix
 * space; ByteLevel decoder): every case as the tokenizers library encodes and decodes it. */
void test_opt_tokenizer(void **state) {
    (void)state;
    json_t *doc = gd_json("opt", "tokenizer_cases.json");
    char *path = gd_fixture("opt", "tokenizer.json");
    flexdiag_tokenizer *t = NULL;
    flexdiag_status st = flexdiag__tok_load(path, &t);
    if (st != FLEXDIAG_OK) fprintf(stderr, "%s: %s\n", path, flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    const json_t *cases = json_object_get(doc, "cases");
    size_t n = json_array_size(cases), good = 0;
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) good += (size_t)tokenizer_case(t, json_array_get(cases, i));
    fprintf(stderr, "  opt tokenizer: %zu / %zu cases as the tokenizers library\n", good, n);
    assert_int_equal(good, n);
    flexdiag__tok_destroy(t);
    free(path);
    json_decref(doc);
}

/* tmp/out/results.jsonl of a one-prompt generate run: its single record (parsed). */
static json_t *single_record(const char *tmp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/out/results.jsonl", tmp);
    size_t n = 0;
    char *text = tu_read_file(path, &n);
    assert_non_null(text);
    assert_true(n > 0 && text[n - 1] == '\n' && strchr(text, '\n') == text + n - 1);
    json_error_t je;
    json_t *r = json_loads(text, 0, &je);
    if (!r) fprintf(stderr, "%s: %s\n", path, je.text);
    assert_non_null(r);
    free(text);
    return r;
}

/* `flexdiag generate` on the CPU, greedy: the ids of transformers' generate() up to its EOS,
 * their text in the record and on stdout after the prompt. */
void test_opt_generate_cli(void **state) {
    (void)state;
    greedy_case g = greedy_load();
    const char *bin = getenv("FLEXDIAG_BIN");
    char *dir = gd_fixture("opt", ""), *tmp = tu_tempdir("generate");
    assert_null(strchr(g.prompt, '\'')); /* quoted for the shell below */
    assert_int_equal(tu_system("'%s' generate --cpu --quiet --model '%s' --prompt '%s' "
                               "--max-new-tokens %d --top-k 1 --images-per-prompt 1 --batch 1 "
                               "--out '%s/out' >'%s/stdout'",
                               bin, dir, g.prompt, g.max_new, tmp, tmp), 0);
    json_t *r = single_record(tmp);
    int32_t n = 0, *ids = gd_json_ids(json_object_get(r, "ids"), &n);
    assert_true(same_ids("flexdiag generate ids", ids, n, g.ids, g.n));
    assert_string_equal(json_string_value(json_object_get(r, "text")), g.text);
    assert_string_equal(json_string_value(json_object_get(r, "stop")), g.stop);
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/stdout", tmp);
    char *out = tu_read_file(path, NULL);
    snprintf(line, sizeof line, "[0] %s%s\n", g.prompt, g.text);
    assert_non_null(out);
    if (!strstr(out, line)) fprintf(stderr, "  stdout:\n%s  want the line: %s", out, line);
    assert_non_null(strstr(out, line));
    fprintf(stderr, "  flexdiag generate: %d ids as transformers' generate() (stop: %s), text "
                    "\"%s\"\n", n, g.stop, g.text);
    free(out);
    free(ids);
    json_decref(r);
    tu_rmtree(tmp);
    free(tmp);
    free(dir);
    greedy_free(&g);
}
