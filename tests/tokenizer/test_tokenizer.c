/*
 * test_tokenizer.c - the tokenizer.json BPE tokenizer on the handmade data/mini.json: every
 * stage with ids derived by hand (and confirmed against the `tokenizers` library), the Janus
 * template, every load-time error, and a replay of the fuzz entry point.
 *
 * mini.json: ids 0..255 are the 256 GPT-2 byte symbols in byte order (so a lone byte b is id b),
 * 256.. the results of its merges in order (he, ll, hell, hello, Ġw, or, Ġwor, ld, Ġworld, ĠĠ,
 * ĊĊ, 12, 123, bc, ab, ä½, ä½ł (你), ca, cat, Ġcat, Ġa, !!), then <begin_of_image> 278,
 * <end_of_image> 279, xyz 280; added tokens BOS 281, EOS 282, pad 283, <|User|> 284,
 * <|Assistant|> 285, QR 286, RST 287, <tag> 288, <tag>+ 289, XY 290 (normalized false),
 * WXYZ 291, <mask> 292 (lstrip + rstrip), ø 248 (content already in the vocab). The
 * pre-tokenizer is DeepSeek-LLM's Split sequence followed by ByteLevel without regex.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "runtime/text/tokenizer.h"
#include "tok_bytes.h"
#include "util.h"

int flexdiag__fuzz_tokenizer(const uint8_t *data, size_t n);

static flexdiag_tokenizer *load_mini(void) {
    char *p = tu_data_path("tokenizer/data/mini.json");
    flexdiag_tokenizer *t = NULL;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__tok_load(p, &t);
    if (st) fprintf(stderr, "load %s: %s\n", p, flexdiag__err_msg());
    free(p);
    assert_int_equal(st, FLEXDIAG_OK);
    return t;
}

static json_t *mini_json(void) {
    char *p = tu_data_path("tokenizer/data/mini.json");
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    free(p);
    assert_non_null(j);
    return j;
}

/* Load a modified copy of mini.json; returns the status, *out set on success. */
static flexdiag_status load_doc(json_t *doc, flexdiag_tokenizer **out) {
    char *s = json_dumps(doc, JSON_COMPACT);
    assert_non_null(s);
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__tok_load_json(s, strlen(s), "variant.json", out);
    free(s);
    json_decref(doc);
    return st;
}

static void expect_ids(const flexdiag_tokenizer *t, const char *text, const int32_t *want,
                       int64_t n_want) {
    int32_t *ids = NULL;
    int64_t n = -1;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__tok_encode(t, text, strlen(text), &ids, &n);
    if (st) fprintf(stderr, "encode \"%s\": %s\n", text, flexdiag__err_msg());
    assert_int_equal(st, FLEXDIAG_OK);
    int same = n == n_want && (n == 0 || !memcmp(ids, want, (size_t)n * sizeof *ids));
    if (!same) {
        fprintf(stderr, "encode \"%s\": got", text);
        for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    assert_true(same);
}

#define EXPECT(t, text, ...)                                                                       \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids((t), (text), want_, (int64_t)(sizeof want_ / sizeof want_[0]));                 \
    } while (0)

static void assert_msg_has(const char *needle) {
    if (!strstr(flexdiag__err_msg(), needle))
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", flexdiag__err_msg(), needle);
    assert_non_null(strstr(flexdiag__err_msg(), needle));
}

/* ---- BPE and pre-tokenizer ---- */

static void test_bpe_merges(void **state) {
    (void)state;
    flexdiag_tokenizer *t = load_mini();
    EXPECT(t, "hello world", 259, 264); /* merge chains; " world" keeps its space (\s?[A-Za-z]+) */
    EXPECT(t, "abc", 97, 269);          /* "b c" has rank 13 < "a b" 14: a + bc, not ab + c */
    EXPECT(t, "xyz", 120, 121, 122);    /* in the vocab, but no merge builds it */
    EXPECT(t, "!!!", 277, 33);          /* leftmost pair first among equal ranks */
    EXPECT(t, "\xe4\xbd\xa0", 272);     /* 你 = three byte symbols merged twice */
    EXPECT(t, "hello\xc2\xa0world", 259, 194, 160, 119, 261, 263); /* NBSP: no space merge */
    flexdiag__tok_destroy(t);
}

static void test_pretokenizer(void **state) {
    (void)state;
    flexdiag_tokenizer *t = load_mini();
    EXPECT(t, "a\n\nb", 97, 10, 10, 98); /* each \n alone: the ĊĊ merge never applies */
    EXPECT(t, "\r\n", 13, 10);
    EXPECT(t, "12345", 268, 52, 53); /* one \p{N}+ piece */
    EXPECT(t, "x12y", 120, 267, 121);
    EXPECT(t, "  ", 265);              /* trailing whitespace piece merges to ĠĠ */
    EXPECT(t, "a  b", 97, 32, 32, 98); /* inner spaces: " b" then a lone " " */
    EXPECT(t, " hello  world ", 32, 259, 32, 264, 32);
    EXPECT(t, "na\xc3\xafve caf\xc3\xa9", 110, 97, 195, 175, 118, 101, 32, 273, 102, 195, 169);
    EXPECT(t, "<begin_of_image>", 60, 98, 101, 103, 105, 110, 95, 111, 102, 95, 105, 109, 97, 103,
           101, 62); /* a vocab entry, not an added token: encoded as text */
    int32_t *ids = NULL;
    int64_t n = -1;
    assert_int_equal(flexdiag__tok_encode(t, "", 0, &ids, &n), FLEXDIAG_OK);
    assert_int_equal(n, 0);
    assert_non_null(ids);
    free(ids);
    flexdiag__tok_destroy(t);
}

static void test_added_tokens(void **state) {
    (void)state;
    flexdiag_tokenizer *t = load_mini();
    EXPECT(t, "QRST", 286, 83, 84);              /* leftmost wins over the longer RST */
    EXPECT(t, "x<tag>+<tag>", 120, 289, 288);    /* longest at the same position */
    EXPECT(t, "WXYZ", 87, 290, 90);              /* normalized=false XY is split out first */
    EXPECT(t, "a  <mask>  b", 97, 292, 98);      /* lstrip / rstrip swallow the spaces */
    EXPECT(t, "\xc3\xb8\xe4\xbd\xa0", 248, 272); /* ø is an added token with the vocab's id */
    EXPECT(t,
           "<\xef\xbd\x9c"
           "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>hi",
           281, 104, 105);
    flexdiag__tok_destroy(t);
}

static void test_lookup(void **state) {
    (void)state;
    flexdiag_tokenizer *t = load_mini();
    assert_int_equal(flexdiag__tok_id(t, FLEXDIAG_TOK_BOS), 281);
    assert_int_equal(flexdiag__tok_id(t, FLEXDIAG_TOK_EOS), 282);
    assert_int_equal(flexdiag__tok_id(t, FLEXDIAG_TOK_PAD), 283);
    assert_int_equal(flexdiag__tok_id(t, FLEXDIAG_TOK_BOI), 278); /* from model.vocab */
    assert_int_equal(flexdiag__tok_id(t, "hello"), 259);
    assert_int_equal(flexdiag__tok_id(t, "nope"), -1);
    assert_int_equal(tu_tok_ids(t), 293);
    flexdiag_janus_tokens sp;
    assert_int_equal(flexdiag__janus_tokens(t, &sp), FLEXDIAG_OK);
    assert_int_equal(sp.bos, 281);
    assert_int_equal(sp.pad, 283);
    assert_int_equal(sp.boi, 278);
    int32_t id;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__tok_require_id(t, "<nope>", &id), FLEXDIAG_ERR_NOT_FOUND);
    assert_msg_has("<nope>");
    assert_msg_has("mini.json");
    flexdiag__tok_destroy(t);
}

/* ---- Janus template ---- */

static void expect_janus(const flexdiag_tokenizer *t, const char *prompt, const int32_t *want,
                         int64_t n_want) {
    int32_t *ids = NULL;
    int64_t n = -1;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__janus_prompt_ids(t, prompt, &ids, &n), FLEXDIAG_OK);
    assert_int_equal(n, n_want);
    assert_memory_equal(ids, want, (size_t)n * sizeof *ids);
    free(ids);
}

static void test_janus_template(void **state) {
    (void)state;
    flexdiag_tokenizer *t = load_mini();
    /* BOS, <|User|>, ":", " a", " cat", "\n", "\n", <|Assistant|>, ":", <begin_of_image> */
    const int32_t cat[] = {281, 284, 58, 276, 275, 10, 10, 285, 58, 278};
    expect_janus(t, "a cat", cat, 10);
    expect_janus(t, " \t a cat \n\xe3\x80\x80", cat, 10); /* Python strip(), U+3000 included */
    const int32_t empty[] = {281, 284, 58, 32, 10, 10, 285, 58, 278};
    expect_janus(t, "", empty, 9);
    expect_janus(t, "\x1c \x1f", empty, 9); /* str.isspace() also covers U+001C..U+001F */
    int32_t *ids = NULL;
    int64_t n;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__janus_prompt_ids(t, "caf\xc3", &ids, &n), FLEXDIAG_ERR_INVALID_ARG);
    assert_msg_has("prompt is not valid UTF-8 at byte 3");
    assert_null(ids);
    flexdiag__tok_destroy(t);
}

static void test_janus_missing_special(void **state) {
    (void)state;
    json_t *doc = mini_json();
    json_object_set_new(json_array_get(json_object_get(doc, "added_tokens"), 2), "content",
                        json_string("<pad>")); /* the pad token under another name */
    flexdiag_tokenizer *t = NULL;
    assert_int_equal(load_doc(doc, &t), FLEXDIAG_OK);
    int32_t *ids = NULL;
    int64_t n;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__janus_prompt_ids(t, "a cat", &ids, &n), FLEXDIAG_ERR_NOT_FOUND);
    assert_msg_has(FLEXDIAG_TOK_PAD);
    assert_msg_has("variant.json");
    flexdiag__tok_destroy(t);
}

/* ---- invalid text and decoding ---- */

static void expect_bad_utf8(const flexdiag_tokenizer *t, const char *s, size_t len,
                            const char *where) {
    int32_t *ids = (int32_t *)1;
    int64_t n = 5;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__tok_encode(t, s, len, &ids, &n), FLEXDIAG_ERR_INVALID_ARG);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_msg_has(where);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    flexdiag_tokenizer *t = load_mini();
    expect_bad_utf8(t, "ab\xff", 3, "at byte 2");
    expect_bad_utf8(t, "\xc0\xaf", 2, "at byte 0");         /* overlong '/' */
    expect_bad_utf8(t, "x\xed\xa0\x80", 4, "at byte 1");    /* UTF-16 surrogate */
    expect_bad_utf8(t, "xy\xe4\xbd", 4, "at byte 2");       /* truncated 你 */
    expect_bad_utf8(t, "\xf4\x90\x80\x80", 4, "at byte 0"); /* above U+10FFFF */
    EXPECT(t, "a\0b", 97); /* strlen stops at the NUL; with an explicit length it is a byte: */
    int32_t *ids;
    int64_t n;
    assert_int_equal(flexdiag__tok_encode(t, "a\0b", 3, &ids, &n), FLEXDIAG_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 0);
    free(ids);
    flexdiag__tok_destroy(t);
}

/* ---- variants of the model and pre-tokenizer ---- */

static void test_merges_as_pairs(void **state) {
    (void)state;
    json_t *doc = mini_json();
    json_t *merges = json_object_get(json_object_get(doc, "model"), "merges");
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const char *m = json_string_value(json_array_get(merges, i));
        const char *sp = strchr(m, ' ');
        json_t *pair = json_pack("[s%s]", m, (size_t)(sp - m), sp + 1);
        json_array_set_new(merges, i, pair);
    }
    flexdiag_tokenizer *t = NULL;
    assert_int_equal(load_doc(doc, &t), FLEXDIAG_OK);
    EXPECT(t, "hello world", 259, 264);
    EXPECT(t, "abc", 97, 269);
    flexdiag__tok_destroy(t);
}

static void test_ignore_merges(void **state) {
    (void)state;
    json_t *doc = mini_json();
    json_object_set_new(json_object_get(doc, "model"), "ignore_merges", json_true());
    flexdiag_tokenizer *t = NULL;
    assert_int_equal(load_doc(doc, &t), FLEXDIAG_OK);
    EXPECT(t, "xyz", 280); /* whole piece found in the vocab */
    EXPECT(t, "hello world", 259, 264);
    flexdiag__tok_destroy(t);
}

static json_t *with_pretok(json_t *pre) {
    json_t *doc = mini_json();
    json_object_set_new(doc, "pre_tokenizer", pre);
    return doc;
}

static json_t *split(const char *kind, const char *pattern, const char *behavior, int invert) {
    return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", kind, pattern,
                     "behavior", behavior, "invert", invert);
}

static json_t *byte_level(int prefix, int regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", prefix,
                     "trim_offsets", 1, "use_regex", regex);
}

static json_t *sequence(json_t *a, json_t *b, json_t *c) {
    json_t *l = json_array();
    json_array_append_new(l, a);
    json_array_append_new(l, b);
    if (c) json_array_append_new(l, c);
    return json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", l);
}

static void test_gpt2_byte_level(void **state) {
    (void)state;
    flexdiag_tokenizer *t = NULL;
    assert_int_equal(load_doc(with_pretok(byte_level(1, 1)), &t), FLEXDIAG_OK);
    EXPECT(t, "hello world", 32, 259, 264); /* prefix space, then " hello" " world" */
    EXPECT(t, "a b", 276, 32, 98);
    EXPECT(t, "\r\n", 32, 13, 10);
    EXPECT(t, "<|User|>: a cat\n\n<|Assistant|>:", 284, 32, 58, 276, 275, 266, 285, 32, 58);
    flexdiag__tok_destroy(t);
}

/* decode: encode's inverse on plain, multi-byte and added-token text; special tokens dropped
 * on request; a character cut between tokens is U+FFFD; an id without a token adds nothing. */
static void expect_decode(const flexdiag_tokenizer *t, const int32_t *ids, int64_t n, bool skip,
                          const char *want) {
    char *s = NULL;
    size_t len = 0;
    assert_int_equal(flexdiag__tok_decode(t, ids, n, skip, &s, &len), FLEXDIAG_OK);
    if (strcmp(s, want)) fprintf(stderr, "decode: \"%s\" != \"%s\"\n", s, want);
    assert_string_equal(s, want);
    assert_int_equal(len, strlen(want));
    free(s);
}

static void test_decode(void **state) {
    (void)state;
    flexdiag_tokenizer *t = NULL;
    assert_int_equal(load_doc(with_pretok(byte_level(0, 1)), &t), FLEXDIAG_OK);
    const char *texts[] = {"hello world", "a b\r\n", "caf\xc3\xa9 \xe2\x82\xac" "5",
                           "<|User|>: a cat\n\n<|Assistant|>:", "QRST <tag>+ XY"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        assert_int_equal(flexdiag__tok_encode(t, texts[i], strlen(texts[i]), &ids, &n),
                         FLEXDIAG_OK);
        expect_decode(t, ids, n, false, texts[i]);
        free(ids);
    }
    const int32_t special[] = {281, 104, 105, 282}; /* BOS "h" "i" EOS: special ones dropped */
    expect_decode(t, special, 4, true, "hi");
    expect_decode(t, special, 4, false, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence"
                                        "\xef\xbd\x9c>hi<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81"
                                        "sentence\xef\xbd\x9c>");
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(flexdiag__tok_encode(t, "\xe2\x82\xac", 3, &ids, &n), FLEXDIAG_OK);
    if (n > 1) expect_decode(t, ids, n - 1, false, "\xef\xbf\xbd"); /* a cut euro sign */
    free(ids);
    const int32_t unknown[] = {104, 1 << 20, -1, 105}; /* ids without a token add nothing */
    expect_decode(t, unknown, 4, false, "hi");
    flexdiag__tok_destroy(t);
}

static void test_split_behaviors(void **state) {
    (void)state;
    flexdiag_tokenizer *t = NULL;
    /* Removed: whitespace (Oniguruma's \s includes U+0085 and U+3000) disappears */
    json_t *pre = sequence(split("Regex", "\\s+", "Removed", 0), byte_level(1, 0), NULL);
    assert_int_equal(load_doc(with_pretok(pre), &t), FLEXDIAG_OK);
    EXPECT(t, "a  b", 276, 32, 98);
    EXPECT(t, "ab\xc2\x85", 32, 270);
    EXPECT(t,
           "a\xe3\x80\x80"
           "b",
           276, 32, 98);
    flexdiag__tok_destroy(t);
    /* MergedWithPrevious on spaces, then MergedWithNext on digits */
    pre = sequence(split("Regex", "\\s+", "MergedWithPrevious", 0),
                   split("Regex", "\\p{N}", "MergedWithNext", 0), byte_level(0, 0));
    assert_int_equal(load_doc(with_pretok(pre), &t), FLEXDIAG_OK);
    EXPECT(t, "a  b", 97, 265, 98);
    EXPECT(t, "x12y", 120, 49, 50, 121);
    EXPECT(t, "hello world", 259, 32, 119, 261, 263);
    flexdiag__tok_destroy(t);
    /* Contiguous runs of letters; an inverted literal "l" */
    pre = sequence(split("Regex", "[a-z]", "Contiguous", 0), split("String", "l", "Isolated", 1),
                   byte_level(0, 0));
    assert_int_equal(load_doc(with_pretok(pre), &t), FLEXDIAG_OK);
    EXPECT(t, "hello world", 256, 108, 108, 111, 32, 119, 261, 108, 100);
    flexdiag__tok_destroy(t);
}

/* ---- load errors ---- */

static void expect_load_error(json_t *doc, flexdiag_status want, const char *needle) {
    flexdiag_tokenizer *t = (flexdiag_tokenizer *)1;
    flexdiag_status st = load_doc(doc, &t);
    if (st != want) fprintf(stderr, "status %d, message: %s\n", st, flexdiag__err_msg());
    assert_int_equal(st, want);
    assert_null(t);
    assert_msg_has(needle);
    assert_msg_has("variant.json");
}

static json_t *model_of(json_t *doc) { return json_object_get(doc, "model"); }

static void test_load_errors_model(void **state) {
    (void)state;
    json_t *d = mini_json();
    json_object_set_new(model_of(d), "type", json_string("WordPiece"));
    expect_load_error(d, FLEXDIAG_ERR_UNSUPPORTED, "\"WordPiece\" is not supported");
    d = mini_json();
    json_array_append_new(json_object_get(model_of(d), "merges"), json_string("q zz"));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "token \"zz\" is not in model.vocab");
    d = mini_json();
    json_array_append_new(json_object_get(model_of(d), "merges"), json_string("x y"));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "token \"xy\" is not in model.vocab");
    d = mini_json();
    json_array_set_new(json_object_get(model_of(d), "merges"), 0, json_string("he"));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "model.merges[0]");
    d = mini_json();
    json_object_set_new(json_object_get(model_of(d), "vocab"), "bad", json_integer(-4));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "model.vocab[\"bad\"]");
    d = mini_json();
    json_object_set_new(model_of(d), "dropout", json_real(0.1));
    expect_load_error(d, FLEXDIAG_ERR_UNSUPPORTED, "dropout");
    d = mini_json();
    json_object_set_new(model_of(d), "unk_token", json_string("<unk>"));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "unk_token \"<unk>\"");
    d = mini_json();
    json_object_del(d, "model");
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "model");
}

static void test_load_errors_pipeline(void **state) {
    (void)state;
    json_t *d = mini_json();
    json_object_set_new(d, "normalizer", json_pack("{s:s}", "type", "NFC"));
    expect_load_error(d, FLEXDIAG_ERR_UNSUPPORTED, "normalizer \"NFC\"");
    d = with_pretok(json_pack("{s:s}", "type", "Whitespace"));
    expect_load_error(d, FLEXDIAG_ERR_UNSUPPORTED, "pre_tokenizer \"Whitespace\"");
    d = with_pretok(split("Regex", "[a-", "Isolated", 0));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "missing terminating ]");
    d = with_pretok(split("Regex", "a\\hb", "Isolated", 0));
    expect_load_error(d, FLEXDIAG_ERR_UNSUPPORTED, "\\h");
    d = with_pretok(split("Regex", "a", "Sideways", 0));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "behavior");
    d = mini_json();
    json_object_set_new(json_array_get(json_object_get(d, "added_tokens"), 5), "single_word",
                        json_true());
    expect_load_error(d, FLEXDIAG_ERR_UNSUPPORTED, "added token \"QR\" uses single_word");
    d = mini_json();
    json_object_set_new(json_array_get(json_object_get(d, "added_tokens"), 0), "lstrip",
                        json_string("yes"));
    expect_load_error(d, FLEXDIAG_ERR_CORRUPT_MODEL, "added_tokens[0].lstrip");
}

static void test_load_errors_file(void **state) {
    (void)state;
    flexdiag_tokenizer *t = (flexdiag_tokenizer *)1;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__tok_load("/nonexistent/tokenizer.json", &t), FLEXDIAG_ERR_IO);
    assert_null(t);
    assert_msg_has("/nonexistent/tokenizer.json");
    flexdiag__err_clear();
    const char broken[] = "{\"model\": {\"type\": \"BPE\",";
    assert_int_equal(flexdiag__tok_load_json(broken, sizeof broken - 1, "broken.json", &t),
                     FLEXDIAG_ERR_CORRUPT_MODEL);
    assert_msg_has("broken.json: invalid JSON at line 1");
    flexdiag__tok_destroy(NULL);
}

/* ---- fuzz entry replay ---- */

static void test_fuzz_replay(void **state) {
    (void)state;
    static const char *seeds[] = {
        "",          "hello world",  "<tag>+<mask> \xc3\xb8",        "\xff\xfe",
        "a\xe4\xbd", "\n\n\r\n  \t", "<|User|>: x\n\n<|Assistant|>:"};
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++)
        assert_int_equal(flexdiag__fuzz_tokenizer((const uint8_t *)seeds[i], strlen(seeds[i])), 0);
    tu_rng r;
    tu_rng_seed(&r, 42);
    uint8_t buf[64];
    for (int it = 0; it < 3000; it++) { /* random bytes, mostly printable + UTF-8 lead bytes */
        size_t n = (size_t)tu_rng_int(&r, 0, sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)(tu_rng_uniform(&r) < 0.7 ? tu_rng_int(&r, 0x20, 0x7e)
                                                        : tu_rng_int(&r, 0, 255));
        assert_int_equal(flexdiag__fuzz_tokenizer(buf, n), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_merges),        cmocka_unit_test(test_pretokenizer),
        cmocka_unit_test(test_added_tokens),      cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_janus_template),    cmocka_unit_test(test_janus_missing_special),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_merges_as_pairs),   cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_gpt2_byte_level),   cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_load_errors_model), cmocka_unit_test(test_load_errors_pipeline),
        cmocka_unit_test(test_load_errors_file),  cmocka_unit_test(test_fuzz_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
