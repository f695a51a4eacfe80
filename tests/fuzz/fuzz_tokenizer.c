/*
 * fuzz_tokenizer.c - libFuzzer target for the tokenizer.json loader (runtime/text/
 * tokenizer_load.c): each input is a tokenizer.json document, loaded from memory with
 * flexdiag__tok_load_json (flexdiag__tok_load reads the file and calls the same function), then
 * used. tests/tokenizer/fuzz_tokenizer.c is the other half: fuzzed text on a fixed tokenizer.
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - a failed load leaves *out NULL and a message naming the document;
 *   - a loaded tokenizer encodes fixed strings (plain, Unicode, the Janus template markers, the
 *     empty string) and a string cut from the input bytes: valid UTF-8 always encodes, to a
 *     non-NULL array of ids each below 1 + the largest id and standing for a token string, and
 *     the same text encodes to the same ids again (a loaded tokenizer is immutable);
 *   - invalid UTF-8 is FLEXDIAG_ERR_INVALID_ARG with no ids;
 *   - every added token matched before normalization encodes, alone, to exactly its own id, and
 *     flexdiag__tok_id finds that id;
 *   - the Janus prompt is [BOS] ... [<begin_of_image>] when the three special tokens resolve, and
 *     FLEXDIAG_ERR_NOT_FOUND with no ids when one does not.
 * Warnings (re-derived added-token ids, missing byte symbols) are silenced.
 *
 * The same entry point is replayed over tests/fuzz/corpus/tokenizer by replay.c in the
 * 'format' suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "runtime/text/tokenizer_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "fuzz-tokenizer.json" /* label of the document in messages */
#define CUT_MAX 200                /* bytes of the input-derived text */

static const char *const texts[] = {
    "Hello world! 123 it's",
    "  a red apple\n\n<|User|>: h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8d\x8e\t end\r\n",
    (FLEXDIAG_TOK_BOS "<|User|>: a cat" FLEXDIAG_TOK_BOI "x" FLEXDIAG_TOK_PAD),
    "",
};

/* Encode text[0..len) (valid UTF-8) and check the ids; returns them (caller frees). */
static int32_t *encode_checked(const flexdiag_tokenizer *t, const char *text, size_t len,
                               int64_t *n) {
    int32_t *ids = NULL;
    flexdiag__err_clear();
    FUZZ_CHECK(flexdiag__tok_encode(t, text, len, &ids, n) == FLEXDIAG_OK, flexdiag__err_msg());
    FUZZ_CHECK(ids != NULL && *n >= 0 && (len > 0 || *n == 0), "encode result");
    for (int64_t i = 0; i < *n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < t->n_ids && t->id_str[ids[i]] != NULL, "id range");
    return ids;
}

/* Encode twice: same ids both times. */
static void check_encode(const flexdiag_tokenizer *t, const char *text, size_t len) {
    int64_t n1, n2;
    int32_t *a = encode_checked(t, text, len, &n1), *b = encode_checked(t, text, len, &n2);
    FUZZ_CHECK(n1 == n2 && memcmp(a, b, (size_t)n1 * sizeof *a) == 0, "encode is deterministic");
    free(a);
    free(b);
}

static void check_invalid_utf8(const flexdiag_tokenizer *t) {
    int32_t *ids = (int32_t *)&ids;
    int64_t n = -1;
    flexdiag_status st = flexdiag__tok_encode(t, "ab\xff", 3, &ids, &n);
    FUZZ_CHECK(st == FLEXDIAG_ERR_INVALID_ARG && ids == NULL && n == 0, "invalid UTF-8 accepted");
}

/* An added token of the first (normalized=false) pass, alone, is exactly its id. */
static void check_added(const flexdiag_tokenizer *t) {
    for (size_t i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        if (a->normalized) continue;
        int64_t n;
        int32_t *ids = encode_checked(t, a->s, a->len, &n);
        FUZZ_CHECK(n == 1 && ids[0] == a->id, a->s);
        free(ids);
        FUZZ_CHECK(flexdiag__tok_id(t, a->s) == a->id, a->s);
    }
}

static void check_janus(const flexdiag_tokenizer *t) {
    flexdiag_janus_tokens sp;
    int32_t *ids = NULL;
    int64_t n = 0;
    flexdiag_status have = flexdiag__janus_tokens(t, &sp);
    flexdiag_status st = flexdiag__janus_prompt_ids(t, " a red apple ", &ids, &n);
    FUZZ_CHECK(st == have, flexdiag__err_msg());
    if (st != FLEXDIAG_OK) {
        FUZZ_CHECK(st == FLEXDIAG_ERR_NOT_FOUND && ids == NULL && n == 0, flexdiag__err_msg());
        return;
    }
    FUZZ_CHECK(n >= 2 && ids[0] == sp.bos && ids[n - 1] == sp.boi, "Janus template");
    free(ids);
}

/* Up to CUT_MAX bytes from the middle of the input, cut to whole UTF-8 characters. */
static void check_cut(const flexdiag_tokenizer *t, const uint8_t *data, size_t size) {
    size_t at = size / 2;
    while (at < size && (data[at] & 0xc0) == 0x80) at++;
    size_t n = size - at < CUT_MAX ? size - at : CUT_MAX;
    check_encode(t, (const char *)data + at, utf8_valid_prefix(data + at, n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet++) flexdiag_log_set(NULL, FLEXDIAG_LOG_ERROR, NULL);
    flexdiag_tokenizer *t = (flexdiag_tokenizer *)&t;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__tok_load_json((const char *)data, size, NAME, &t);
    if (st != FLEXDIAG_OK) {
        FUZZ_CHECK(t == NULL, "failed load left a tokenizer");
        FUZZ_CHECK(st == FLEXDIAG_ERR_OOM_HOST || strstr(flexdiag__err_msg(), NAME), "message");
        return 0;
    }
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        check_encode(t, texts[i], strlen(texts[i]));
    check_cut(t, data, size);
    check_invalid_utf8(t);
    check_added(t);
    check_janus(t);
    flexdiag__tok_destroy(t);
    return 0;
}
