/*
 * fuzz_tokenizer.c - fuzz entry point for the tokenizer: arbitrary bytes are encoded with the
 * handmade tests/tokenizer/data/mini.json tokenizer and the result is checked, not just run.
 *
 * Properties (any violation aborts, so the fuzzer or the replay test reports it):
 *   - encoding succeeds exactly when the input is valid UTF-8 (checked by an independent
 *     decoder below); otherwise the error is FLEXDIAG_ERR_INVALID_ARG naming the byte offset;
 *   - every id lies in [0, vocab size);
 *   - the ids decode to x again (flexdiag__tok_decode) when x avoids the two tokens that do not
 *     round-trip in mini.json (<mask> strips the spaces around it; ø is an added token whose id
 *     is the byte symbol F8).
 * The tokenizer is loaded once from $FLEXDIAG_TEST_DATA (the tests/ folder; meson test sets it).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/text/tokenizer.h"
#include "tok_bytes.h"

int flexdiag__fuzz_tokenizer(const uint8_t *data, size_t n);

static void fuzz_fail(const char *what) {
    fprintf(stderr, "fuzz_tokenizer: %s (%s)\n", what, flexdiag__err_msg());
    abort();
}

static const flexdiag_tokenizer *mini(void) {
    static flexdiag_tokenizer *tok;
    if (tok) return tok;
    const char *dir = getenv("FLEXDIAG_TEST_DATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/data/mini.json", dir ? dir : "tests");
    if (flexdiag__tok_load(path, &tok) != FLEXDIAG_OK) fuzz_fail("cannot load mini.json");
    return tok;
}

/* Independent UTF-8 check by decoding code points: -1 when valid, else the first bad offset. */
static long first_invalid(const uint8_t *s, size_t n) {
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000}; /* shortest form per length */
    for (size_t i = 0; i < n;) {
        uint32_t cp = s[i];
        size_t k = cp < 0x80             ? 0
                   : (cp & 0xe0) == 0xc0 ? 1
                   : (cp & 0xf0) == 0xe0 ? 2
                   : (cp & 0xf8) == 0xf0 ? 3
                                         : 4;
        if (k == 4) return (long)i; /* continuation byte or F8..FF as a lead */
        if (k) cp &= 0x3fu >> k;
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xc0) != 0x80) return (long)i;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return (long)i;
        i += k + 1;
    }
    return -1;
}

static void check_round_trip(const flexdiag_tokenizer *t, const uint8_t *data, size_t n,
                             const int32_t *ids, int64_t k) {
    if (memmem(data, n, "<mask>", 6) || memmem(data, n, "\xc3\xb8", 2)) return;
    size_t len = 0;
    char *text = NULL;
    if (flexdiag__tok_decode(t, ids, k, false, &text, &len) != FLEXDIAG_OK)
        fuzz_fail("an id has no token");
    if (len != n || memcmp(text, data, n) != 0) fuzz_fail("bytes(encode(x)) != x");
    free(text);
}

int flexdiag__fuzz_tokenizer(const uint8_t *data, size_t n) {
    const flexdiag_tokenizer *t = mini();
    int32_t *ids = NULL;
    int64_t k = 0;
    long bad = first_invalid(data, n);
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__tok_encode(t, (const char *)data, n, &ids, &k);
    if (bad >= 0) {
        char want[64];
        snprintf(want, sizeof want, "not valid UTF-8 at byte %ld ", bad);
        if (st != FLEXDIAG_ERR_INVALID_ARG || ids) fuzz_fail("invalid UTF-8 accepted");
        if (!strstr(flexdiag__err_msg(), want)) fuzz_fail("wrong offset in the UTF-8 error");
        return 0;
    }
    if (st != FLEXDIAG_OK) fuzz_fail("valid UTF-8 rejected");
    for (int64_t i = 0; i < k; i++)
        if (ids[i] < 0 || ids[i] >= tu_tok_ids(t)) fuzz_fail("id out of range");
    check_round_trip(t, data, n, ids, k);
    free(ids);
    return 0;
}
