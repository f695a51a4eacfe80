/*
 * tok_bytes.c - token ids back to bytes for the tokenizer tests (see tok_bytes.h), white-box
 * through tokenizer_impl.h: the id -> token string table the loader builds and the GPT-2 byte
 * <-> symbol map of byte-level tokenizers.
 */
#include "tok_bytes.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer_impl.h"

/* The byte of GPT-2 symbol cp (the inverse of byte_to_symbol), or -1. */
static int symbol_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_to_symbol(cp) == cp ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7f + cp - 0x121);
    return cp == 0x143 ? 0xad : -1;
}

char *tu_tok_bytes(const flexdiag_tokenizer *t, const int32_t *ids, int64_t n, size_t *len) {
    size_t cap = 1, used = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->id_str[ids[i]]) return NULL;
        cap += t->id_len[ids[i]];
    }
    char *out = malloc(cap);
    for (int64_t i = 0; out && i < n; i++) {
        const char *s = t->id_str[ids[i]];
        size_t m = t->id_len[ids[i]], j = 0, k, start = used;
        int b = 0;
        for (; t->byte_level && j < m; j += k) { /* every character a byte symbol, or none */
            if ((b = symbol_to_byte(utf8_decode((const unsigned char *)s + j, &k))) < 0) break;
            out[used++] = (char)b;
        }
        if (t->byte_level && j == m) continue;
        memcpy(out + start, s, m);
        used = start + m;
    }
    if (out) out[used] = 0;
    *len = used;
    return out;
}

int64_t tu_tok_ids(const flexdiag_tokenizer *t) { return t->n_ids; }
