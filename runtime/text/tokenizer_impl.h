/*
 * tokenizer_impl.h - what the two halves of the tokenizer share (tokenizer_load.c parses and
 * checks tokenizer.json; tokenizer.c answers queries, encodes and applies the Janus template): the
 * loaded-tokenizer struct, the UTF-8 / character-class helpers and the open-addressing hash maps
 * of the vocabulary and the merge ranks. Internal to runtime/.
 */
#ifndef FLEXDIAG_TOKENIZER_IMPL_H
#define FLEXDIAG_TOKENIZER_IMPL_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_RUNTIME_TEXT)
#error "runtime/text/tokenizer_impl.h is private to runtime/text/ (docs/architecture.md)"
#endif

#define PCRE2_CODE_UNIT_WIDTH 8

#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/core.h"
#include "runtime/text/tokenizer.h"

#define MAX_FILE_BYTES ((long)1 << 30) /* real tokenizer.json files are ~5 MB */
#define MAX_ID ((int64_t)1 << 24)      /* ids index arrays; real vocabularies are ~1e5 */
#define NO_ID (-1)

/* The GPT-2 pre-tokenizer regex ByteLevel applies when use_regex is true. */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef enum split_behavior {
    SPLIT_ISOLATED,
    SPLIT_REMOVED,
    SPLIT_MERGED_PREV,
    SPLIT_MERGED_NEXT,
    SPLIT_CONTIGUOUS,
} split_behavior;

typedef enum step_kind { STEP_SPLIT, STEP_BYTE_LEVEL } step_kind;

typedef struct pretok_step {
    step_kind kind;
    pcre2_code *re;          /* Split regex, or ByteLevel's GPT-2 regex (use_regex); else NULL */
    const char *lit;         /* Split literal ("String" pattern), borrowed from the JSON tree */
    size_t lit_len;          /* bytes of lit */
    split_behavior behavior; /* Split only */
    bool invert;             /* Split only: swap match / non-match */
    bool prefix_space;       /* ByteLevel add_prefix_space */
} pretok_step;

typedef struct added_token {
    const char *s;   /* content, borrowed from the JSON tree */
    size_t len;      /* bytes of s */
    int32_t id;      /* as the library derives it (see added_id) */
    bool lstrip;     /* swallow whitespace on the left */
    bool rstrip;     /* swallow whitespace on the right */
    bool normalized; /* matched in the second pass */
    bool special;    /* dropped by a decode that skips special tokens */
} added_token;

typedef struct vocab_slot {
    const char *s; /* token string, borrowed from the JSON tree; NULL = empty slot */
    uint32_t len;  /* bytes */
    int32_t id;
} vocab_slot;

typedef struct merge_slot {
    uint64_t key;   /* (left id << 32) | right id; UINT64_MAX = empty slot */
    uint32_t rank;  /* index in model.merges: lower merges first */
    int32_t new_id; /* id of the merged token */
} merge_slot;

struct flexdiag_tokenizer {
    char *name;         /* path (or caller's label) for messages */
    json_t *root;       /* the parsed file: owns every borrowed string */
    vocab_slot *vocab;  /* open-addressing map token -> id, vocab_cap slots */
    size_t vocab_cap;   /* power of two */
    size_t vocab_count; /* distinct model.vocab entries: the first id added tokens get */
    merge_slot *merges; /* open-addressing map pair -> (rank, new id), merge_cap slots */
    size_t merge_cap;   /* power of two */
    added_token *added; /* added_tokens in file order */
    size_t n_added;
    pretok_step *steps; /* pre-tokenizer, flattened Sequence */
    size_t n_steps;
    const char **id_str; /* id -> token string (added tokens win), n_ids entries, may be NULL */
    uint32_t *id_len;    /* bytes of id_str[i] */
    int64_t n_ids;       /* 1 + largest id */
    int32_t unk_id;      /* model.unk_token id or NO_ID */
    bool fuse_unk;       /* consecutive unknown chars become one unk */
    bool byte_fallback;  /* unknown chars -> <0xXX> tokens */
    bool ignore_merges;  /* a piece already in the vocab is emitted whole */
    bool byte_level;     /* tokens are GPT-2 byte symbols (ByteLevel pre-tokenizer / decoder) */
};

/* ---- UTF-8 and character classes ---- */

/* For lead byte c: number of continuation bytes k and the allowed range of the first one
 * (Rust str rules: no overlongs, no surrogates, nothing above U+10FFFF). False: not a lead. */
static inline bool utf8_lead(unsigned c, size_t *k, unsigned *lo, unsigned *hi) {
    *lo = 0x80, *hi = 0xbf;
    if (c < 0x80)
        *k = 0;
    else if (c >= 0xc2 && c <= 0xdf)
        *k = 1;
    else if (c >= 0xe0 && c <= 0xef)
        *k = 2;
    else if (c >= 0xf0 && c <= 0xf4)
        *k = 3;
    else
        return false;
    if (c == 0xe0) *lo = 0xa0;
    if (c == 0xed) *hi = 0x9f;
    if (c == 0xf0) *lo = 0x90;
    if (c == 0xf4) *hi = 0x8f;
    return true;
}

/* Bytes of the invalid sequence starting at s[0]: the lead byte plus the continuation bytes
 * that still fit a valid sequence (the "maximal subpart" replaced by one U+FFFD). 0: valid. */
static inline size_t utf8_bad_len(const unsigned char *s, size_t n) {
    size_t k, j = 1;
    unsigned lo, hi;
    if (!utf8_lead(s[0], &k, &lo, &hi)) return 1;
    if (k == 0) return 0;
    if (j < n && s[j] >= lo && s[j] <= hi)
        for (j = 2; j <= k && j < n && (s[j] & 0xc0) == 0x80;) j++;
    return j == k + 1 ? 0 : j;
}

/* Length of the longest valid UTF-8 prefix of s[0..n). */
static inline size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (utf8_bad_len(s + i, n - i)) return i;
        i += s[i] < 0x80 ? 1 : s[i] < 0xe0 ? 2 : s[i] < 0xf0 ? 3 : 4;
    }
    return n;
}

/* Byte length of the character starting with lead byte c (text already validated). */
static inline size_t utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

static inline uint32_t utf8_decode(const unsigned char *s, size_t *len) {
    size_t k = utf8_len(s[0]);
    uint32_t cp = k == 1 ? s[0] : s[0] & (0x7f >> k);
    for (size_t j = 1; j < k; j++) cp = (cp << 6) | (s[j] & 0x3f);
    *len = k;
    return cp;
}

static inline size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Unicode White_Space: Rust's char::is_whitespace and regex \s (lstrip / rstrip). */
static inline bool is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

/* Python's str.isspace() (used by str.strip() in the Janus template): White_Space plus the
 * information separators U+001C..U+001F. */
static inline bool is_py_space(uint32_t cp) {
    return is_white_space(cp) || (cp >= 0x1c && cp <= 0x1f);
}

/* Bytes of leading characters of s[0..n) satisfying pred. */
static inline size_t span_leading(const char *s, size_t n, bool (*pred)(uint32_t)) {
    size_t i = 0, k;
    while (i < n && pred(utf8_decode((const unsigned char *)s + i, &k))) i += k;
    return i;
}

/* Offset where the trailing run of characters satisfying pred starts in s[0..n). */
static inline size_t span_trailing(const char *s, size_t n, bool (*pred)(uint32_t)) {
    size_t end = n, k;
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80) b--;
        if (!pred(utf8_decode((const unsigned char *)s + b, &k))) break;
        end = b;
    }
    return end;
}

/* GPT-2 byte -> symbol table: printable Latin-1 bytes map to themselves, the other 68 bytes
 * (controls, space, DEL..NBSP, soft hyphen) to U+0100.. in byte order. */
static inline uint32_t byte_to_symbol(unsigned b) {
    if (b <= 0x20) return 0x100 + b;
    if (b >= 0x7f && b <= 0xa0) return 0x100 + 33 + (b - 0x7f);
    if (b == 0xad) return 0x100 + 67;
    return b;
}

/* The byte a GPT-2 byte symbol stands for (byte_to_symbol's inverse); -1 for any other code
 * point. */
static inline int symbol_to_byte(uint32_t cp) {
    if (cp >= 0x100 && cp <= 0x100 + 0x20) return (int)(cp - 0x100);
    if (cp >= 0x100 + 33 && cp <= 0x100 + 33 + (0xa0 - 0x7f)) return (int)(0x7f + cp - 0x100 - 33);
    if (cp == 0x100 + 67) return 0xad;
    if (cp < 0x100 && byte_to_symbol(cp) == cp) return (int)cp;
    return -1;
}

/* ---- hash maps ---- */

static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
}

/* Slots for n entries at load factor <= 1/2. */
static inline size_t table_cap(size_t n) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

static inline vocab_slot *vocab_find(const flexdiag_tokenizer *t, const char *s, size_t n) {
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        vocab_slot *v = &t->vocab[i];
        if (!v->s || (v->len == n && memcmp(v->s, s, n) == 0)) return v;
    }
}

static inline int32_t vocab_get(const flexdiag_tokenizer *t, const char *s, size_t n) {
    const vocab_slot *v = vocab_find(t, s, n);
    return v->s ? v->id : NO_ID;
}

static inline merge_slot *merge_find(const flexdiag_tokenizer *t, uint64_t key) {
    size_t mask = t->merge_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask)
        if (t->merges[i].key == key || t->merges[i].key == UINT64_MAX) return &t->merges[i];
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

#endif /* FLEXDIAG_TOKENIZER_IMPL_H */
