/*
 * tokenizer_decode.c - token ids back to UTF-8 text (tokenizer.h flexdiag__tok_decode), as the
 * `tokenizers` library's decode(ids, skip_special_tokens) does for the files this tokenizer
 * loads: an added token is its content (a special one dropped when asked); a byte-level
 * vocabulary token is its GPT-2 byte symbols mapped back to bytes; otherwise a byte-fallback
 * token <0xXX> is that byte and SentencePiece's U+2581 is a space. Bytes that do not form valid
 * UTF-8 (a character cut between two tokens) become U+FFFD, the library's lossy decode; an id
 * the tokenizer has no token for adds nothing, as in the library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tokenizer_impl.h"

/* The tokenizer has a token for id (a model's vocabulary may be larger: OPT's 50272 rows
 * against 50265 tokens). */
static bool known(const flexdiag_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->id_str[id];
}

/* The added token with this id, or NULL. */
static const added_token *added_of(const flexdiag_tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) return &t->added[i];
    return NULL;
}

/* Append the bytes token s (n bytes) stands for to out (room for 3 n bytes). */
static size_t token_bytes(const flexdiag_tokenizer *t, const char *s, size_t n, char *out) {
    size_t o = 0;
    if (!t->byte_level && n == 6 && !strncmp(s, "<0x", 3) && s[5] == '>') {
        unsigned v;
        if (sscanf(s + 3, "%2x", &v) == 1) {
            out[o++] = (char)v;
            return o;
        }
    }
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        uint32_t cp = utf8_decode((const unsigned char *)s + i, &k);
        int b = t->byte_level ? symbol_to_byte(cp) : -1;
        if (b >= 0) out[o++] = (char)b;
        else if (!t->byte_level && cp == 0x2581) out[o++] = ' ';
        else memcpy(out + o, s + i, k), o += k;
        i += k;
    }
    return o;
}

/* Copy raw (n bytes) to out with every invalid UTF-8 sequence replaced by U+FFFD. */
static size_t lossy_utf8(const char *raw, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t ok = utf8_valid_prefix((const unsigned char *)raw + i, n - i);
        memcpy(out + o, raw + i, ok);
        o += ok, i += ok;
        if (i >= n) break;
        size_t bad = utf8_bad_len((const unsigned char *)raw + i, n - i);
        o += utf8_encode(0xfffd, out + o);
        i += bad ? bad : 1;
    }
    out[o] = '\0';
    return o;
}

flexdiag_status flexdiag__tok_decode(const flexdiag_tokenizer *t, const int32_t *ids, int64_t n,
                                     bool skip_special, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    size_t cap = 1;
    for (int64_t i = 0; i < n; i++)
        if (known(t, ids[i])) cap += 3 * (size_t)t->id_len[ids[i]];
    char *raw = malloc(cap), *txt = malloc(3 * cap + 1);
    if (!raw || !txt) {
        free(raw);
        free(txt);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "decode: out of host memory");
    }
    size_t r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!known(t, ids[i])) continue;
        const added_token *a = added_of(t, ids[i]);
        if (a && a->special && skip_special) continue;
        if (a) memcpy(raw + r, a->s, a->len), r += a->len;
        else r += token_bytes(t, t->id_str[ids[i]], t->id_len[ids[i]], raw + r);
    }
    *len = lossy_utf8(raw, r, txt);
    free(raw);
    *out = txt;
    return FLEXDIAG_OK;
}
