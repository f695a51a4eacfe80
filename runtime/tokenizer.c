/*
 * tokenizer.c - tokenizer.json (Hugging Face `tokenizers`) byte-level BPE, bit-exact with the
 * library for the options DeepSeek-LLM / Janus-Pro use, plus the Janus prompt template.
 *
 * One encode mirrors the library stage by stage (one different id changes the prompt):
 *   UTF-8 check -> added tokens split out in two passes (normalized=false first, then true;
 *   leftmost-longest like its Aho-Corasick) -> pre-tokenizer steps on every piece (Split: regex
 *   or literal, five delimiter behaviours; ByteLevel: prefix space, GPT-2 regex, bytes -> GPT-2
 *   symbols) -> BPE per piece (its merge loop: a (rank, position) heap over linked symbols).
 * Text lives in one growable arena per call and pieces are (offset, length) spans into it;
 * nothing global is cached, so a loaded tokenizer is read-only and shareable.
 * Regexes are written for Oniguruma (the library's engine) and run on PCRE2: \s \S \w \W are
 * rewritten to Oniguruma's Unicode classes and `$`/`^` are line anchors (MULTILINE), as there.
 * Known limit: \p{..} and \w use PCRE2's Unicode tables (14.0 in PCRE2 10.42), so characters
 * assigned later may classify differently; DeepSeek's letter/CJK classes are explicit ranges.
 * Added-token ids are re-derived like the library does (vocab id, else next free id).
 * Rejected: a hand-written DeepSeek pre-tokenizer (llama.cpp style) - it cannot follow the
 * regexes a file actually ships.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "tokenizer.h"

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
    bool byte_level;     /* decode maps GPT-2 symbols back to bytes */
};

/* ---- UTF-8 and character classes ---- */

/* For lead byte c: number of continuation bytes k and the allowed range of the first one
 * (Rust str rules: no overlongs, no surrogates, nothing above U+10FFFF). False: not a lead. */
static bool utf8_lead(unsigned c, size_t *k, unsigned *lo, unsigned *hi) {
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
static size_t utf8_bad_len(const unsigned char *s, size_t n) {
    size_t k, j = 1;
    unsigned lo, hi;
    if (!utf8_lead(s[0], &k, &lo, &hi)) return 1;
    if (k == 0) return 0;
    if (j < n && s[j] >= lo && s[j] <= hi)
        for (j = 2; j <= k && j < n && (s[j] & 0xc0) == 0x80;) j++;
    return j == k + 1 ? 0 : j;
}

/* Length of the longest valid UTF-8 prefix of s[0..n). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (utf8_bad_len(s + i, n - i)) return i;
        i += s[i] < 0x80 ? 1 : s[i] < 0xe0 ? 2 : s[i] < 0xf0 ? 3 : 4;
    }
    return n;
}

/* Byte length of the character starting with lead byte c (text already validated). */
static size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }

static uint32_t utf8_decode(const unsigned char *s, size_t *len) {
    size_t k = utf8_len(s[0]);
    uint32_t cp = k == 1 ? s[0] : s[0] & (0x7f >> k);
    for (size_t j = 1; j < k; j++) cp = (cp << 6) | (s[j] & 0x3f);
    *len = k;
    return cp;
}

static size_t utf8_encode(uint32_t cp, char *out) {
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
static bool is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

/* Python's str.isspace() (used by str.strip() in the Janus template): White_Space plus the
 * information separators U+001C..U+001F. */
static bool is_py_space(uint32_t cp) { return is_white_space(cp) || (cp >= 0x1c && cp <= 0x1f); }

/* Bytes of leading characters of s[0..n) satisfying pred. */
static size_t span_leading(const char *s, size_t n, bool (*pred)(uint32_t)) {
    size_t i = 0, k;
    while (i < n && pred(utf8_decode((const unsigned char *)s + i, &k))) i += k;
    return i;
}

/* Offset where the trailing run of characters satisfying pred starts in s[0..n). */
static size_t span_trailing(const char *s, size_t n, bool (*pred)(uint32_t)) {
    size_t end = n, k;
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80) b--;
        if (!pred(utf8_decode((const unsigned char *)s + b, &k))) break;
        end = b;
    }
    return end;
}

/* GPT-2 byte <-> symbol table: printable Latin-1 bytes map to themselves, the other 68 bytes
 * (controls, space, DEL..NBSP, soft hyphen) to U+0100.. in byte order. */
static uint32_t byte_to_symbol(unsigned b) {
    if (b <= 0x20) return 0x100 + b;
    if (b >= 0x7f && b <= 0xa0) return 0x100 + 33 + (b - 0x7f);
    if (b == 0xad) return 0x100 + 67;
    return b;
}

static int symbol_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_to_symbol(cp) == cp ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7f + cp - 0x121);
    return cp == 0x143 ? 0xad : -1;
}

/* ---- hash maps ---- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
}

/* Slots for n entries at load factor <= 1/2. */
static size_t table_cap(size_t n) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

static vocab_slot *vocab_find(const flexdiag_tokenizer *t, const char *s, size_t n) {
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        vocab_slot *v = &t->vocab[i];
        if (!v->s || (v->len == n && memcmp(v->s, s, n) == 0)) return v;
    }
}

static int32_t vocab_get(const flexdiag_tokenizer *t, const char *s, size_t n) {
    const vocab_slot *v = vocab_find(t, s, n);
    return v->s ? v->id : NO_ID;
}

static merge_slot *merge_find(const flexdiag_tokenizer *t, uint64_t key) {
    size_t mask = t->merge_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask)
        if (t->merges[i].key == key || t->merges[i].key == UINT64_MAX) return &t->merges[i];
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* ---- loading: JSON helpers ---- */

static flexdiag_status bad(const flexdiag_tokenizer *t, const char *what, const char *detail) {
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: %s: %s", t->name, what, detail);
}

static flexdiag_status unsupported(const flexdiag_tokenizer *t, const char *what,
                                   const char *detail) {
    return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s: %s: %s (not implemented by flexdiag)",
                         t->name, what, detail);
}

/* obj[key] as a bool; absent or null gives dflt. ctx names obj in messages. */
static flexdiag_status get_bool(const flexdiag_tokenizer *t, const json_t *obj, const char *ctx,
                                const char *key, bool dflt, bool *out) {
    const json_t *v = json_object_get(obj, key);
    *out = dflt;
    if (!v || json_is_null(v)) return FLEXDIAG_OK;
    if (!json_is_boolean(v))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: %s.%s: must be true or false",
                             t->name, ctx, key);
    *out = json_is_true(v);
    return FLEXDIAG_OK;
}

/* model[key] as a string, NULL when absent or null. */
static flexdiag_status get_str(const flexdiag_tokenizer *t, const json_t *model, const char *key,
                               const char **out) {
    const json_t *v = json_object_get(model, key);
    *out = NULL;
    if (!v || json_is_null(v)) return FLEXDIAG_OK;
    if (!json_is_string(v))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: model.%s: must be a string or null",
                             t->name, key);
    *out = json_string_value(v);
    return FLEXDIAG_OK;
}

static const char *type_of(const json_t *obj) {
    const json_t *v = json_object_get(obj, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* ---- loading: model ---- */

static flexdiag_status load_vocab(flexdiag_tokenizer *t, const json_t *vocab) {
    if (!json_is_object(vocab)) return bad(t, "model.vocab", "missing or not an object");
    t->vocab_cap = table_cap(json_object_size(vocab));
    t->vocab = calloc(t->vocab_cap, sizeof *t->vocab);
    if (!t->vocab) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no memory for vocab", t->name);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= MAX_ID)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: model.vocab[\"%s\"]: id must be an integer in [0, %lld)",
                                 t->name, key, (long long)MAX_ID);
        vocab_slot *v = vocab_find(t, key, strlen(key));
        if (!v->s) t->vocab_count++;
        *v = (vocab_slot){key, (uint32_t)strlen(key), (int32_t)id};
        if (id >= t->n_ids) t->n_ids = id + 1;
    }
    return FLEXDIAG_OK;
}

/* Split merge entry i ("a b" or ["a", "b"]) into its two token strings. */
static flexdiag_status merge_parts(const flexdiag_tokenizer *t, const json_t *e, size_t i,
                                   const char **a, size_t *na, const char **b, size_t *nb) {
    if (json_is_string(e)) {
        const char *s = json_string_value(e), *sp = strchr(s, ' ');
        if (sp && !strchr(sp + 1, ' ')) {
            *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
            return FLEXDIAG_OK;
        }
    } else if (json_is_array(e) && json_array_size(e) == 2 &&
               json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
        *a = json_string_value(json_array_get(e, 0)), *na = strlen(*a);
        *b = json_string_value(json_array_get(e, 1)), *nb = strlen(*b);
        return FLEXDIAG_OK;
    }
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                         "%s: model.merges[%zu]: expected \"left right\" (one space) or "
                         "[\"left\", \"right\"]",
                         t->name, i);
}

static flexdiag_status merge_missing(const flexdiag_tokenizer *t, size_t i, const char *s,
                                     size_t n) {
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                         "%s: model.merges[%zu]: token \"%.*s\" is not in model.vocab", t->name, i,
                         (int)n, s);
}

static flexdiag_status load_merges(flexdiag_tokenizer *t, const json_t *merges) {
    if (!json_is_array(merges)) return bad(t, "model.merges", "missing or not an array");
    size_t n = json_array_size(merges);
    if (n >= UINT32_MAX) return bad(t, "model.merges", "too many entries");
    t->merge_cap = table_cap(n);
    t->merges = malloc(t->merge_cap * sizeof *t->merges);
    if (!t->merges)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no memory for merges", t->name);
    memset(t->merges, 0xff, t->merge_cap * sizeof *t->merges);
    char *joined = NULL;
    size_t cap = 0;
    flexdiag_status st = FLEXDIAG_OK;
    for (size_t i = 0; i < n && st == FLEXDIAG_OK; i++) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        st = merge_parts(t, json_array_get(merges, i), i, &a, &na, &b, &nb);
        if (st) break;
        int32_t ia = vocab_get(t, a, na), ib = vocab_get(t, b, nb);
        if (ia == NO_ID || ib == NO_ID) {
            st = ia == NO_ID ? merge_missing(t, i, a, na) : merge_missing(t, i, b, nb);
            break;
        }
        if (na + nb > cap) {
            char *p = realloc(joined, na + nb);
            if (!p) {
                st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no memory for merges", t->name);
                break;
            }
            joined = p, cap = na + nb;
        }
        memcpy(joined, a, na);
        memcpy(joined + na, b, nb);
        int32_t id = vocab_get(t, joined, na + nb);
        if (id == NO_ID) {
            st = merge_missing(t, i, joined, na + nb);
            break;
        }
        /* a repeated pair keeps the later rank, as the library's map insertion does */
        merge_slot *m = merge_find(t, pair_key(ia, ib));
        *m = (merge_slot){pair_key(ia, ib), (uint32_t)i, id};
    }
    free(joined);
    return st;
}

static flexdiag_status load_model_options(flexdiag_tokenizer *t, const json_t *model) {
    const json_t *drop = json_object_get(model, "dropout");
    if (drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0))
        return unsupported(t, "model.dropout", "BPE dropout makes encoding random");
    const char *prefix, *suffix, *unk;
    FLEXDIAG_TRY(get_str(t, model, "continuing_subword_prefix", &prefix));
    FLEXDIAG_TRY(get_str(t, model, "end_of_word_suffix", &suffix));
    if ((prefix && *prefix) || (suffix && *suffix))
        return unsupported(t, "model", "continuing_subword_prefix / end_of_word_suffix");
    FLEXDIAG_TRY(get_bool(t, model, "model", "fuse_unk", false, &t->fuse_unk));
    FLEXDIAG_TRY(get_bool(t, model, "model", "byte_fallback", false, &t->byte_fallback));
    FLEXDIAG_TRY(get_bool(t, model, "model", "ignore_merges", false, &t->ignore_merges));
    FLEXDIAG_TRY(get_str(t, model, "unk_token", &unk));
    t->unk_id = NO_ID;
    if (unk) {
        t->unk_id = vocab_get(t, unk, strlen(unk));
        if (t->unk_id == NO_ID)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: model.unk_token \"%s\" is not in model.vocab", t->name, unk);
    }
    return FLEXDIAG_OK;
}

static flexdiag_status load_model(flexdiag_tokenizer *t, const json_t *model) {
    if (!json_is_object(model)) return bad(t, "model", "missing or not an object");
    const char *type = type_of(model);
    if (type ? strcmp(type, "BPE") != 0 : !json_object_get(model, "merges"))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: model.type \"%s\" is not supported (flexdiag reads BPE only)",
                             t->name, type ? type : "(missing)");
    FLEXDIAG_TRY(load_vocab(t, json_object_get(model, "vocab")));
    FLEXDIAG_TRY(load_merges(t, json_object_get(model, "merges")));
    return load_model_options(t, model);
}

/* ---- loading: added tokens ---- */

/* The id the library gives a new added token: its model.vocab id if the content is there, else
 * the next id after the vocabulary and the added tokens so far (the file's "id" is only
 * checked: the library re-derives ids the same way and warns on a difference). */
static int32_t added_id(const flexdiag_tokenizer *t, const added_token *a) {
    int32_t vid = vocab_get(t, a->s, a->len), max = NO_ID;
    if (vid != NO_ID) return vid;
    for (size_t j = 0; j < t->n_added; j++)
        if (t->added[j].id > max) max = t->added[j].id;
    if (max == NO_ID) return (int32_t)t->vocab_count;
    return (max >= (int32_t)t->vocab_count || t->vocab_count == 0) ? max + 1
                                                                   : (int32_t)t->vocab_count;
}

/* Parse added_tokens[i]; *moved = 1 when the library gives it an id other than the file's. */
static flexdiag_status load_added_token(flexdiag_tokenizer *t, const json_t *e, size_t i,
                                        int *moved) {
    char what[64];
    snprintf(what, sizeof what, "added_tokens[%zu]", i);
    const json_t *content = json_object_get(e, "content"), *id = json_object_get(e, "id");
    if (!json_is_object(e) || !json_is_string(content) || !json_string_length(content) ||
        !json_is_integer(id))
        return bad(t, what, "needs a non-empty \"content\" string and an integer \"id\"");
    added_token a = {.s = json_string_value(content), .len = json_string_length(content)};
    if (memchr(a.s, 0, a.len)) return bad(t, what, "content contains a NUL character");
    bool single_word, special;
    FLEXDIAG_TRY(get_bool(t, e, what, "single_word", false, &single_word));
    FLEXDIAG_TRY(get_bool(t, e, what, "lstrip", false, &a.lstrip));
    FLEXDIAG_TRY(get_bool(t, e, what, "rstrip", false, &a.rstrip));
    FLEXDIAG_TRY(get_bool(t, e, what, "normalized", true, &a.normalized));
    FLEXDIAG_TRY(get_bool(t, e, what, "special", false, &special));
    if (single_word)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: added token \"%s\" uses single_word, unsupported", t->name, a.s);
    for (size_t j = 0; j < t->n_added; j++) /* a repeated content only updates the options */
        if (t->added[j].len == a.len && !memcmp(t->added[j].s, a.s, a.len)) {
            a.id = t->added[j].id;
            t->added[j] = a;
            return FLEXDIAG_OK;
        }
    a.id = added_id(t, &a);
    if (a.id >= MAX_ID) return bad(t, what, "id beyond 2^24");
    *moved = a.id != json_integer_value(id);
    if (a.id >= t->n_ids) t->n_ids = a.id + 1;
    t->added[t->n_added++] = a;
    return FLEXDIAG_OK;
}

static flexdiag_status load_added(flexdiag_tokenizer *t, const json_t *list) {
    if (!list || json_is_null(list)) return FLEXDIAG_OK;
    if (!json_is_array(list)) return bad(t, "added_tokens", "must be an array");
    t->added = calloc(json_array_size(list) + 1, sizeof *t->added);
    if (!t->added) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no memory", t->name);
    size_t moved = 0, first = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        int m = 0;
        FLEXDIAG_TRY(load_added_token(t, json_array_get(list, i), i, &m));
        if (m && !moved++) first = i;
    }
    if (moved) /* the tokenizers library does the same re-derivation and also warns */
        FLEXDIAG_WARN("%s: %zu added tokens (first: added_tokens[%zu]) get other ids than the "
                      "file lists, derived like the tokenizers library does",
                      t->name, moved, first);
    return FLEXDIAG_OK;
}

/* ---- loading: normalizer and pre-tokenizer ---- */

static flexdiag_status load_normalizer(flexdiag_tokenizer *t, const json_t *n) {
    if (!n || json_is_null(n)) return FLEXDIAG_OK;
    const char *type = type_of(n);
    const json_t *list = json_object_get(n, "normalizers");
    if (type && !strcmp(type, "Sequence") && json_is_array(list) && json_array_size(list) == 0)
        return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                         "%s: normalizer \"%s\" is not supported (flexdiag implements null only)",
                         t->name, type ? type : "(no type)");
}

/* Oniguruma's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation */
#define WORD_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"

/* PCRE2 text for the Oniguruma escape \c inside or outside a bracket class: NULL keeps it as
 * it is, "" means PCRE2 has no equivalent (\h is a hex digit in Oniguruma). */
static const char *onig_escape(char c, bool in_class) {
    switch (c) {
    case 's': return "\\p{White_Space}";
    case 'S': return "\\P{White_Space}";
    case 'w': return in_class ? WORD_CLASS : "[" WORD_CLASS "]";
    case 'W': return in_class ? "" : "[^" WORD_CLASS "]";
    case 'h':
    case 'H': return "";
    default: return NULL;
    }
}

/* Rewrite an Oniguruma pattern for PCRE2 (escapes above; bracket classes tracked so a rewrite
 * inside one stays a class member). Returns a malloc'ed string, or NULL with *st set. */
static char *translate_regex(const flexdiag_tokenizer *t, const char *src, flexdiag_status *st) {
    size_t n = strlen(src), o = 0;
    char *out = malloc(n * 18 + 1); /* the longest rewrite turns 2 bytes into 34 */
    bool in_class = false;
    if (!out) return *st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no memory", t->name), NULL;
    for (size_t i = 0; i < n; i++) {
        const char c = src[i], *rep = c == '\\' ? onig_escape(src[i + 1], in_class) : NULL;
        if (rep && !*rep) {
            free(out);
            *st = flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                                "%s: pre_tokenizer regex \"%s\": \\%c at offset %zu means "
                                "something else in PCRE2 than in Oniguruma",
                                t->name, src, src[i + 1], i);
            return NULL;
        }
        size_t k = 1; /* source bytes copied verbatim */
        if (rep) {
            o += (size_t)sprintf(out + o, "%s", rep);
            k = 0;
            i++; /* the escape letter */
        } else if (c == '\\' && i + 1 < n) {
            k = 2;
        } else if (c == '[' && !in_class) { /* "[", "[^", "[]" and "[^]" open a class */
            in_class = true;
            k += src[i + k] == '^';
            k += src[i + k] == ']';
        } else if (c == '[' && src[i + 1] == ':') { /* POSIX [:name:] inside a class */
            const char *end = strstr(src + i, ":]");
            k = end ? (size_t)(end - (src + i)) + 2 : 1;
        } else if (c == ']') {
            in_class = false;
        }
        memcpy(out + o, src + i, k);
        o += k;
        i += k ? k - 1 : 0;
    }
    out[o] = 0;
    return out;
}

static flexdiag_status compile_regex(const flexdiag_tokenizer *t, const char *src,
                                     pcre2_code **out) {
    flexdiag_status st;
    char *pat = translate_regex(t, src, &st);
    if (!pat) return st;
    int code;
    PCRE2_SIZE off;
    *out = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &code, &off, NULL);
    free(pat);
    if (*out) return FLEXDIAG_OK;
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                         "%s: pre_tokenizer regex \"%s\" does not compile: %s (near offset %zu of "
                         "the PCRE2 form)",
                         t->name, src, (const char *)msg, (size_t)off);
}

static flexdiag_status parse_behavior(const flexdiag_tokenizer *t, const json_t *v,
                                      split_behavior *out) {
    static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (json_is_string(v) && !strcmp(json_string_value(v), names[i])) {
            *out = (split_behavior)i;
            return FLEXDIAG_OK;
        }
    return bad(t, "pre_tokenizer Split.behavior",
               "must be Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous");
}

static flexdiag_status load_split(flexdiag_tokenizer *t, const json_t *p, pretok_step *s) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    s->kind = STEP_SPLIT;
    FLEXDIAG_TRY(parse_behavior(t, json_object_get(p, "behavior"), &s->behavior));
    FLEXDIAG_TRY(get_bool(t, p, "pre_tokenizer Split", "invert", false, &s->invert));
    if (json_is_string(re)) return compile_regex(t, json_string_value(re), &s->re);
    if (!json_is_string(lit) || json_string_length(lit) == 0)
        return bad(t, "pre_tokenizer Split.pattern",
                   "must be {\"Regex\": \"...\"} or a non-empty {\"String\": \"...\"}");
    s->lit = json_string_value(lit);
    s->lit_len = json_string_length(lit);
    return FLEXDIAG_OK;
}

static flexdiag_status load_pretok(flexdiag_tokenizer *t, const json_t *p, int depth);

static flexdiag_status load_pretok_list(flexdiag_tokenizer *t, const json_t *list, int depth) {
    if (!json_is_array(list))
        return bad(t, "pre_tokenizer Sequence", "needs a pretokenizers array");
    for (size_t i = 0; i < json_array_size(list); i++)
        FLEXDIAG_TRY(load_pretok(t, json_array_get(list, i), depth + 1));
    return FLEXDIAG_OK;
}

static flexdiag_status load_pretok(flexdiag_tokenizer *t, const json_t *p, int depth) {
    if (!p || json_is_null(p)) return FLEXDIAG_OK;
    const char *type = type_of(p);
    if (depth > 8) return bad(t, "pre_tokenizer", "Sequence nested too deeply");
    if (type && !strcmp(type, "Sequence"))
        return load_pretok_list(t, json_object_get(p, "pretokenizers"), depth);
    bool split = type && !strcmp(type, "Split"), byte_level = type && !strcmp(type, "ByteLevel");
    if (!split && !byte_level)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: pre_tokenizer \"%s\" is not supported (flexdiag implements "
                             "Sequence, Split and ByteLevel)",
                             t->name, type ? type : "(no type)");
    pretok_step *s = realloc(t->steps, (t->n_steps + 1) * sizeof *s);
    if (!s) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no memory", t->name);
    t->steps = s;
    s = &t->steps[t->n_steps++];
    memset(s, 0, sizeof *s);
    if (split) return load_split(t, p, s);
    bool use_regex;
    s->kind = STEP_BYTE_LEVEL;
    t->byte_level = true;
    FLEXDIAG_TRY(
        get_bool(t, p, "pre_tokenizer ByteLevel", "add_prefix_space", true, &s->prefix_space));
    FLEXDIAG_TRY(get_bool(t, p, "pre_tokenizer ByteLevel", "use_regex", true, &use_regex));
    return use_regex ? compile_regex(t, GPT2_REGEX, &s->re) : FLEXDIAG_OK;
}

/* ---- loading: top level ---- */

static flexdiag_status build_id_table(flexdiag_tokenizer *t) {
    size_t n = (size_t)t->n_ids;
    t->id_str = calloc(n ? n : 1, sizeof *t->id_str);
    t->id_len = calloc(n ? n : 1, sizeof *t->id_len);
    if (!t->id_str || !t->id_len)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no memory", t->name);
    for (size_t i = 0; i < t->vocab_cap; i++) {
        const vocab_slot *v = &t->vocab[i];
        if (v->s && !t->id_str[v->id]) t->id_str[v->id] = v->s, t->id_len[v->id] = v->len;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        t->id_str[a->id] = a->s;
        t->id_len[a->id] = (uint32_t)a->len;
    }
    return FLEXDIAG_OK;
}

/* A byte-level tokenizer without a symbol for some byte drops that byte (as the library does):
 * say so once at load rather than silently at encode time. */
static void check_byte_symbols(const flexdiag_tokenizer *t) {
    if (!t->byte_level || t->unk_id != NO_ID) return;
    for (unsigned b = 0; b < 0xf5; b++) { /* C0, C1, F5..FF never occur in UTF-8 text */
        char sym[4];
        if (b == 0xc0 || b == 0xc1) continue;
        size_t k = utf8_encode(byte_to_symbol(b), sym);
        if (vocab_get(t, sym, k) == NO_ID) {
            FLEXDIAG_WARN("%s: byte 0x%02x has no symbol in model.vocab and there is no unk_token: "
                          "text containing it loses that byte",
                          t->name, b);
            return;
        }
    }
}

static flexdiag_status load_root(flexdiag_tokenizer *t) {
    const json_t *r = t->root;
    if (!json_is_object(r)) return bad(t, "top level", "not a JSON object");
    FLEXDIAG_TRY(load_model(t, json_object_get(r, "model")));
    FLEXDIAG_TRY(load_added(t, json_object_get(r, "added_tokens")));
    FLEXDIAG_TRY(load_normalizer(t, json_object_get(r, "normalizer")));
    FLEXDIAG_TRY(load_pretok(t, json_object_get(r, "pre_tokenizer"), 0));
    const char *dec = type_of(json_object_get(r, "decoder"));
    if (dec && !strcmp(dec, "ByteLevel")) t->byte_level = true;
    FLEXDIAG_TRY(build_id_table(t));
    check_byte_symbols(t);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__tok_load_json(const char *json, size_t len, const char *name,
                                        flexdiag_tokenizer **out) {
    *out = NULL;
    flexdiag_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name ? name : "tokenizer.json"))) {
        free(t);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "tokenizer: no memory");
    }
    json_error_t je;
    t->root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    flexdiag_status st = t->root ? load_root(t)
                                 : flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                                 "%s: invalid JSON at line %d column %d: %s",
                                                 t->name, je.line, je.column, je.text);
    if (st != FLEXDIAG_OK) {
        flexdiag__tok_destroy(t);
        return st;
    }
    *out = t;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__tok_load(const char *path, flexdiag_tokenizer **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return flexdiag__err(FLEXDIAG_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n > MAX_FILE_BYTES) n = -2;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) != (size_t)n)
        n = -1;
    int saved = errno;
    fclose(f);
    flexdiag_status st;
    if (n == -2)
        st = flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: larger than 1 GiB, not a tokenizer",
                           path);
    else if (n < 0 || !buf)
        st = flexdiag__err(n < 0 ? FLEXDIAG_ERR_IO : FLEXDIAG_ERR_OOM_HOST, "%s: cannot read: %s",
                           path, n < 0 ? strerror(saved) : "no memory");
    else
        st = flexdiag__tok_load_json(buf, (size_t)n, path, out);
    free(buf);
    return st;
}

void flexdiag__tok_destroy(flexdiag_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    free(t->steps);
    free(t->added);
    free(t->vocab);
    free(t->merges);
    free(t->id_str);
    free(t->id_len);
    json_decref(t->root);
    free(t->name);
    free(t);
}

/* ---- queries ---- */

int32_t flexdiag__tok_id(const flexdiag_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].s, token, n)) return t->added[i].id;
    return vocab_get(t, token, n);
}

flexdiag_status flexdiag__tok_require_id(const flexdiag_tokenizer *t, const char *token,
                                         int32_t *id) {
    *id = flexdiag__tok_id(t, token);
    if (*id != NO_ID) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND,
                         "%s: token \"%s\" is in neither added_tokens nor model.vocab", t->name,
                         token);
}

int64_t flexdiag__tok_vocab_size(const flexdiag_tokenizer *t) { return t->n_ids; }

const char *flexdiag__tok_name(const flexdiag_tokenizer *t) { return t->name; }

/* ---- encode: per-call state ---- */

typedef struct span {
    size_t off, len; /* bytes in the arena */
    int32_t id;      /* added-token id, or NO_ID for text still to tokenize */
} span;

typedef struct span_list {
    span *v;
    size_t n, cap;
} span_list;

typedef struct match {
    size_t start, end; /* relative to the piece */
    bool hit;          /* pattern match (true) or the text between matches */
} match;

typedef struct symbol {
    int32_t id;         /* current token id */
    int32_t prev, next; /* neighbours in the linked list, -1 at the ends */
    uint32_t len;       /* bytes covered; 0 once merged into its left neighbour */
} symbol;

typedef struct heap_item {
    uint32_t rank; /* merge rank (lower first) */
    int32_t pos;   /* left symbol (lower first among equal ranks) */
    int32_t new_id;
} heap_item;

typedef struct enc {
    const flexdiag_tokenizer *t;
    char *buf; /* text arena: the input, then byte-level mapped pieces */
    size_t len, cap;
    span_list seg, a, b; /* segments after added tokens; pieces before / after a step */
    match *m;            /* matches of the current piece */
    size_t nm, capm;
    pcre2_match_data *md; /* one ovector pair is all we read */
    symbol *sym;          /* BPE word */
    size_t capsym;
    heap_item *heap; /* BPE merge queue */
    size_t nheap, capheap;
    int32_t *ids; /* output */
    size_t nids, capids;
} enc;

/* Ensure room for need elements of elem bytes; returns the (maybe moved) array or NULL. */
static void *reserve(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return NULL;
        c *= 2;
    }
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

static flexdiag_status oom(void) {
    return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "tokenizer: out of host memory while encoding");
}

#define RESERVE(ptr, cap, need)                                                                    \
    do {                                                                                           \
        void *q_ = reserve((ptr), &(cap), (need), sizeof *(ptr));                                  \
        if (!q_) return oom();                                                                     \
        (ptr) = q_;                                                                                \
    } while (0)

static flexdiag_status push_span(span_list *l, size_t off, size_t len, int32_t id) {
    if (len == 0) return FLEXDIAG_OK; /* the library drops empty pieces after every split */
    RESERVE(l->v, l->cap, l->n + 1);
    l->v[l->n++] = (span){off, len, id};
    return FLEXDIAG_OK;
}

static flexdiag_status push_id(enc *e, int32_t id) {
    RESERVE(e->ids, e->capids, e->nids + 1);
    e->ids[e->nids++] = id;
    return FLEXDIAG_OK;
}

static flexdiag_status push_match(enc *e, size_t s, size_t end, bool hit) {
    RESERVE(e->m, e->capm, e->nm + 1);
    e->m[e->nm++] = (match){s, end, hit};
    return FLEXDIAG_OK;
}

/* Append n bytes to the arena (src may not point into it). */
static flexdiag_status arena_put(enc *e, const char *src, size_t n) {
    RESERVE(e->buf, e->cap, e->len + n + 1);
    memcpy(e->buf + e->len, src, n);
    e->len += n;
    return FLEXDIAG_OK;
}

static void enc_free(enc *e) {
    free(e->buf);
    free(e->seg.v);
    free(e->a.v);
    free(e->b.v);
    free(e->m);
    pcre2_match_data_free(e->md);
    free(e->sym);
    free(e->heap);
    free(e->ids);
}

/* ---- encode: added tokens ---- */

/* Leftmost-longest occurrence at or after pos of an added token of the given pass. */
static const added_token *find_added(const flexdiag_tokenizer *t, const char *s, size_t n,
                                     size_t pos, bool normalized, size_t *at) {
    for (size_t p = pos; p < n; p++) {
        const added_token *best = NULL;
        for (size_t i = 0; i < t->n_added; i++) {
            const added_token *a = &t->added[i];
            if (a->normalized == normalized && a->len <= n - p && (!best || a->len > best->len) &&
                a->s[0] == s[p] && !memcmp(a->s, s + p, a->len))
                best = a;
        }
        if (best) {
            *at = p;
            return best;
        }
    }
    return NULL;
}

/* Split one text segment around the added tokens of one pass (the library's find_matches:
 * lstrip takes whitespace back to the previous split, rstrip swallows whitespace after). */
static flexdiag_status split_added(enc *e, const span *sg, bool normalized, span_list *out) {
    size_t start_off = 0, pos = 0, s;
    const added_token *a;
    while (pos < sg->len &&
           (a = find_added(e->t, e->buf + sg->off, sg->len, pos, normalized, &s)) != NULL) {
        const char *txt = e->buf + sg->off;
        size_t stop = s + a->len;
        pos = stop;
        if (a->lstrip) {
            size_t ns = span_trailing(txt, s, is_white_space);
            s = ns > start_off ? ns : start_off;
        }
        if (a->rstrip) stop += span_leading(txt + stop, sg->len - stop, is_white_space);
        if (start_off < s) FLEXDIAG_TRY(push_span(out, sg->off + start_off, s - start_off, NO_ID));
        FLEXDIAG_TRY(push_span(out, sg->off + s, stop - s, a->id));
        start_off = stop;
    }
    if (start_off < sg->len)
        FLEXDIAG_TRY(push_span(out, sg->off + start_off, sg->len - start_off, NO_ID));
    return FLEXDIAG_OK;
}

static flexdiag_status added_pass(enc *e, bool normalized) {
    e->a.n = 0;
    for (size_t i = 0; i < e->seg.n; i++) {
        const span sg = e->seg.v[i];
        if (sg.id != NO_ID)
            FLEXDIAG_TRY(push_span(&e->a, sg.off, sg.len, sg.id));
        else
            FLEXDIAG_TRY(split_added(e, &sg, normalized, &e->a));
    }
    span_list tmp = e->seg;
    e->seg = e->a;
    e->a = tmp;
    return FLEXDIAG_OK;
}

/* ---- encode: pattern matches (the library's find_matches over Oniguruma's find_iter) ---- */

static flexdiag_status regex_matches(enc *e, const pcre2_code *re, size_t off, size_t n) {
    size_t prev = 0, last_end = 0;
    bool skip_next_empty = false;
    const PCRE2_SPTR subj = (PCRE2_SPTR)(e->buf + off);
    e->nm = 0;
    while (last_end <= n) {
        int rc = pcre2_match(re, subj, n, last_end, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "%s: pre_tokenizer regex failed on the prompt: %s", e->t->name,
                                 (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t s = ov[0], end = ov[1];
        if (s > end)
            return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s: regex uses \\K", e->t->name);
        last_end = end;
        if (s == end) { /* step over one character; drop an empty match right after a match */
            last_end += end < n ? utf8_len(subj[end]) : 1;
            if (skip_next_empty) {
                skip_next_empty = false;
                continue;
            }
        } else {
            skip_next_empty = true;
        }
        if (prev != s) FLEXDIAG_TRY(push_match(e, prev, s, false));
        FLEXDIAG_TRY(push_match(e, s, end, true));
        prev = end;
    }
    if (prev != n) FLEXDIAG_TRY(push_match(e, prev, n, false));
    return FLEXDIAG_OK;
}

static flexdiag_status literal_matches(enc *e, const pretok_step *st, size_t off, size_t n) {
    size_t prev = 0;
    const char *s = e->buf + off;
    e->nm = 0;
    for (size_t p = 0; p + st->lit_len <= n;) {
        const char *hit = memmem(s + p, n - p, st->lit, st->lit_len);
        if (!hit) break;
        size_t at = (size_t)(hit - s);
        if (prev != at) FLEXDIAG_TRY(push_match(e, prev, at, false));
        FLEXDIAG_TRY(push_match(e, at, at + st->lit_len, true));
        prev = p = at + st->lit_len;
    }
    if (prev != n) FLEXDIAG_TRY(push_match(e, prev, n, false));
    return FLEXDIAG_OK;
}

/* Apply a delimiter behaviour to e->m in place; m[i].hit afterwards means "remove". */
static void apply_behavior(enc *e, split_behavior b) {
    size_t k = 0;
    bool prev_hit = false;
    if (b == SPLIT_MERGED_NEXT) { /* mirror image of MergedWithPrevious, built backwards */
        k = e->nm;
        for (size_t i = e->nm; i-- > 0;) {
            match x = e->m[i];
            if (x.hit && !prev_hit && k < e->nm)
                e->m[k].start = x.start;
            else
                e->m[--k] = (match){x.start, x.end, false};
            prev_hit = x.hit;
        }
        memmove(e->m, e->m + k, (e->nm - k) * sizeof *e->m);
        e->nm -= k;
        return;
    }
    for (size_t i = 0; i < e->nm; i++) {
        const match x = e->m[i];
        bool join = (b == SPLIT_CONTIGUOUS && x.hit == prev_hit) ||
                    (b == SPLIT_MERGED_PREV && x.hit && !prev_hit);
        if (join && k > 0)
            e->m[k - 1].end = x.end;
        else
            e->m[k++] = (match){x.start, x.end, b == SPLIT_REMOVED && x.hit};
        prev_hit = x.hit;
    }
    e->nm = k;
}

/* ---- encode: pre-tokenizer steps ---- */

static flexdiag_status step_split(enc *e, const pretok_step *st, const span *p) {
    FLEXDIAG_TRY(st->re ? regex_matches(e, st->re, p->off, p->len)
                        : literal_matches(e, st, p->off, p->len));
    if (st->invert)
        for (size_t i = 0; i < e->nm; i++) e->m[i].hit = !e->m[i].hit;
    apply_behavior(e, st->behavior);
    for (size_t i = 0; i < e->nm; i++)
        if (!e->m[i].hit)
            FLEXDIAG_TRY(
                push_span(&e->b, p->off + e->m[i].start, e->m[i].end - e->m[i].start, NO_ID));
    return FLEXDIAG_OK;
}

/* Append the GPT-2 symbols of arena bytes [off, off + n) as a new piece. */
static flexdiag_status map_bytes(enc *e, size_t off, size_t n) {
    RESERVE(e->buf, e->cap, e->len + 2 * n + 1); /* every symbol is 1 or 2 bytes */
    size_t start = e->len;
    for (size_t i = 0; i < n; i++)
        e->len += utf8_encode(byte_to_symbol((unsigned char)e->buf[off + i]), e->buf + e->len);
    return push_span(&e->b, start, e->len - start, NO_ID);
}

static flexdiag_status step_byte_level(enc *e, const pretok_step *st, const span *p) {
    size_t off = p->off, n = p->len;
    if (st->prefix_space && e->buf[off] != ' ') { /* copy " " + piece to the arena */
        RESERVE(e->buf, e->cap, e->len + n + 2);
        e->buf[e->len] = ' ';
        memcpy(e->buf + e->len + 1, e->buf + off, n);
        off = e->len, n += 1;
        e->len += n;
    }
    if (!st->re) return map_bytes(e, off, n);
    FLEXDIAG_TRY(regex_matches(e, st->re, off, n));
    for (size_t i = 0; i < e->nm; i++) {
        const match x = e->m[i];
        if (x.end > x.start) FLEXDIAG_TRY(map_bytes(e, off + x.start, x.end - x.start));
    }
    return FLEXDIAG_OK;
}

/* Run every pre-tokenizer step over e->a (one text segment to start with). */
static flexdiag_status pretokenize(enc *e) {
    for (size_t s = 0; s < e->t->n_steps; s++) {
        const pretok_step *st = &e->t->steps[s];
        e->b.n = 0;
        for (size_t i = 0; i < e->a.n; i++) {
            const span p = e->a.v[i];
            FLEXDIAG_TRY(st->kind == STEP_SPLIT ? step_split(e, st, &p)
                                                : step_byte_level(e, st, &p));
        }
        span_list tmp = e->a;
        e->a = e->b;
        e->b = tmp;
    }
    return FLEXDIAG_OK;
}

/* ---- encode: BPE ---- */

static bool heap_less(const heap_item *x, const heap_item *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static flexdiag_status heap_push(enc *e, heap_item it) {
    RESERVE(e->heap, e->capheap, e->nheap + 1);
    size_t i = e->nheap++;
    while (i > 0 && heap_less(&it, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = it;
    return FLEXDIAG_OK;
}

static heap_item heap_pop(enc *e) {
    heap_item top = e->heap[0], last = e->heap[--e->nheap];
    size_t i = 0, n = e->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!heap_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* Queue the merge of symbol pos with its right neighbour, if the pair has one. */
static flexdiag_status queue_pair(enc *e, int32_t pos) {
    if (pos < 0 || e->sym[pos].next < 0) return FLEXDIAG_OK;
    const merge_slot *m = merge_find(e->t, pair_key(e->sym[pos].id, e->sym[e->sym[pos].next].id));
    if (m->key == UINT64_MAX) return FLEXDIAG_OK;
    return heap_push(e, (heap_item){m->rank, pos, m->new_id});
}

/* The library's merge loop: lowest (rank, position) first; stale queue entries are skipped. */
static flexdiag_status merge_word(enc *e, size_t n) {
    e->nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) FLEXDIAG_TRY(queue_pair(e, (int32_t)i));
    while (e->nheap) {
        heap_item top = heap_pop(e);
        symbol *s = &e->sym[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        symbol *r = &e->sym[s->next];
        const merge_slot *m = merge_find(e->t, pair_key(s->id, r->id));
        if (m->key == UINT64_MAX || m->new_id != top.new_id) continue;
        s->id = top.new_id;
        s->len += r->len;
        r->len = 0;
        s->next = r->next;
        if (s->next >= 0) e->sym[s->next].prev = top.pos;
        FLEXDIAG_TRY(queue_pair(e, s->prev));
        FLEXDIAG_TRY(queue_pair(e, top.pos));
    }
    return FLEXDIAG_OK;
}

static flexdiag_status add_symbol(enc *e, size_t *n, int32_t id, size_t len) {
    RESERVE(e->sym, e->capsym, *n + 1);
    e->sym[*n] = (symbol){id, (int32_t)*n - 1, (int32_t)*n + 1, (uint32_t)len};
    (*n)++;
    return FLEXDIAG_OK;
}

/* <0xXX> tokens for every byte of an unknown character, if all exist. */
static flexdiag_status fallback_bytes(enc *e, const char *c, size_t k, size_t *n, bool *done) {
    int32_t ids[4];
    *done = false;
    for (size_t j = 0; j < k; j++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", (unsigned char)c[j]);
        if ((ids[j] = vocab_get(e->t, name, 6)) == NO_ID) return FLEXDIAG_OK;
    }
    for (size_t j = 0; j < k; j++) FLEXDIAG_TRY(add_symbol(e, n, ids[j], 1));
    *done = true;
    return FLEXDIAG_OK;
}

/* Characters of a piece -> initial symbols (unknown ones: byte fallback, unk, or dropped). */
static flexdiag_status word_symbols(enc *e, const char *w, size_t len, size_t *n) {
    const flexdiag_tokenizer *t = e->t;
    size_t unk_len = 0;
    *n = 0;
    for (size_t i = 0, k; i < len; i += k) {
        k = utf8_len((unsigned char)w[i]);
        int32_t id = vocab_get(t, w + i, k);
        bool done = false;
        if (id != NO_ID) {
            if (unk_len) FLEXDIAG_TRY(add_symbol(e, n, t->unk_id, unk_len));
            unk_len = 0;
            FLEXDIAG_TRY(add_symbol(e, n, id, k));
            continue;
        }
        if (t->byte_fallback) FLEXDIAG_TRY(fallback_bytes(e, w + i, k, n, &done));
        if (done || t->unk_id == NO_ID) continue;
        if (unk_len && !t->fuse_unk) {
            FLEXDIAG_TRY(add_symbol(e, n, t->unk_id, unk_len));
            unk_len = 0;
        }
        unk_len += k;
    }
    if (unk_len) FLEXDIAG_TRY(add_symbol(e, n, t->unk_id, unk_len));
    if (*n) e->sym[*n - 1].next = -1;
    return FLEXDIAG_OK;
}

static flexdiag_status bpe_piece(enc *e, const span *p) {
    const char *w = e->buf + p->off;
    if (e->t->ignore_merges) {
        int32_t id = vocab_get(e->t, w, p->len);
        if (id != NO_ID) return push_id(e, id);
    }
    size_t n;
    FLEXDIAG_TRY(word_symbols(e, w, p->len, &n));
    FLEXDIAG_TRY(merge_word(e, n));
    for (size_t i = 0; i < n; i++)
        if (e->sym[i].len) FLEXDIAG_TRY(push_id(e, e->sym[i].id));
    return FLEXDIAG_OK;
}

/* ---- encode: driver ---- */

static flexdiag_status encode_segments(enc *e) {
    for (size_t i = 0; i < e->seg.n; i++) {
        const span sg = e->seg.v[i];
        if (sg.id != NO_ID) {
            FLEXDIAG_TRY(push_id(e, sg.id));
            continue;
        }
        e->a.n = 0;
        FLEXDIAG_TRY(push_span(&e->a, sg.off, sg.len, NO_ID));
        FLEXDIAG_TRY(pretokenize(e));
        for (size_t j = 0; j < e->a.n; j++) FLEXDIAG_TRY(bpe_piece(e, &e->a.v[j]));
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__tok_encode(const flexdiag_tokenizer *t, const char *text, size_t len,
                                     int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    if (!text && len) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "tokenizer: text is NULL");
    size_t ok = utf8_valid_prefix((const unsigned char *)text, len);
    if (ok != len)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "prompt is not valid UTF-8 at byte %zu (byte 0x%02x); re-encode the "
                             "text as UTF-8",
                             ok, (unsigned char)text[ok]);
    enc e = {.t = t};
    flexdiag_status st = FLEXDIAG_OK;
    if (!(e.md = pcre2_match_data_create(1, NULL))) st = oom();
    if (!st && len) st = arena_put(&e, text, len);
    if (!st) st = push_span(&e.seg, 0, len, NO_ID);
    if (!st) st = added_pass(&e, false);
    if (!st) st = added_pass(&e, true);
    if (!st) st = encode_segments(&e);
    if (!st && !e.ids) { /* a non-NULL result even when there are no ids */
        st = push_id(&e, 0);
        e.nids = 0;
    }
    if (st == FLEXDIAG_OK) {
        *ids = e.ids;
        *n = (int64_t)e.nids;
        e.ids = NULL;
    }
    enc_free(&e);
    return st;
}

/* ---- decode ---- */

/* Append token bytes: GPT-2 symbols -> bytes when every character is one, else raw text. */
static flexdiag_status decode_token(const flexdiag_tokenizer *t, const char *s, size_t n,
                                    enc *out) {
    size_t start = out->len, i = 0, k;
    RESERVE(out->buf, out->cap, out->len + n + 1);
    if (t->byte_level) {
        int b;
        for (; i < n && (b = symbol_to_byte(utf8_decode((const unsigned char *)s + i, &k))) >= 0;
             i += k)
            out->buf[out->len++] = (char)b;
        if (i == n) return FLEXDIAG_OK;
        out->len = start;
    }
    memcpy(out->buf + out->len, s, n);
    out->len += n;
    return FLEXDIAG_OK;
}

/* Copy bytes as valid UTF-8, each maximal invalid subpart replaced by U+FFFD (Rust's
 * from_utf8_lossy, which the library's ByteLevel decoder uses). */
static flexdiag_status utf8_lossy(const char *s, size_t n, enc *out) {
    for (size_t i = 0; i < n;) {
        size_t ok = utf8_valid_prefix((const unsigned char *)s + i, n - i);
        FLEXDIAG_TRY(arena_put(out, s + i, ok));
        i += ok;
        if (i < n) {
            FLEXDIAG_TRY(arena_put(out, "\xef\xbf\xbd", 3));
            i += utf8_bad_len((const unsigned char *)s + i, n - i);
        }
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__tok_decode(const flexdiag_tokenizer *t, const int32_t *ids, int64_t n,
                                     char **text, size_t *len) {
    enc raw = {0}, out = {0};
    flexdiag_status st = FLEXDIAG_OK;
    *text = NULL;
    *len = 0;
    for (int64_t i = 0; i < n && !st; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->id_str[ids[i]])
            st = flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                               "%s: id %d (position %lld) is not a "
                               "token of this tokenizer",
                               t->name, ids[i], (long long)i);
        else
            st = decode_token(t, t->id_str[ids[i]], t->id_len[ids[i]], &raw);
    }
    if (!st) st = utf8_lossy(raw.buf ? raw.buf : "", raw.len, &out);
    if (!st) st = arena_put(&out, "", 0);
    if (!st) {
        out.buf[out.len] = 0;
        *text = out.buf;
        *len = out.len;
        out.buf = NULL;
    }
    free(raw.buf);
    free(out.buf);
    return st;
}

/* ---- Janus-Pro template ---- */

flexdiag_status flexdiag__janus_tokens(const flexdiag_tokenizer *t, flexdiag_janus_tokens *out) {
    FLEXDIAG_TRY(flexdiag__tok_require_id(t, FLEXDIAG_TOK_BOS, &out->bos));
    FLEXDIAG_TRY(flexdiag__tok_require_id(t, FLEXDIAG_TOK_PAD, &out->pad));
    return flexdiag__tok_require_id(t, FLEXDIAG_TOK_BOI, &out->boi);
}

/* Python str.strip() of s[0..n) as [*a, *b). */
static void py_strip(const char *s, size_t n, size_t *a, size_t *b) {
    *a = span_leading(s, n, is_py_space);
    *b = *a + span_trailing(s + *a, n - *a, is_py_space);
}

flexdiag_status flexdiag__janus_prompt_ids(const flexdiag_tokenizer *t, const char *prompt,
                                           int32_t **ids, int64_t *n) {
    static const char head[] = "<|User|>: ", tail[] = "\n\n<|Assistant|>:";
    flexdiag_janus_tokens sp;
    *ids = NULL;
    *n = 0;
    FLEXDIAG_TRY(flexdiag__janus_tokens(t, &sp));
    size_t plen = strlen(prompt), ok = utf8_valid_prefix((const unsigned char *)prompt, plen);
    if (ok != plen)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "prompt is not valid UTF-8 at byte %zu (byte 0x%02x); re-encode the "
                             "text as UTF-8",
                             ok, (unsigned char)prompt[ok]);
    size_t a, b, ta, tb;
    py_strip(prompt, plen, &a, &b);
    size_t tlen = sizeof head - 1 + (b - a) + sizeof tail - 1;
    char *text = malloc(tlen);
    if (!text) return oom();
    memcpy(text, head, sizeof head - 1);
    memcpy(text + sizeof head - 1, prompt + a, b - a);
    memcpy(text + sizeof head - 1 + (b - a), tail, sizeof tail - 1);
    py_strip(text, tlen, &ta, &tb);
    int32_t *body;
    int64_t nb;
    flexdiag_status st = flexdiag__tok_encode(t, text + ta, tb - ta, &body, &nb);
    free(text);
    if (st) return st;
    int32_t *out = malloc(((size_t)nb + 2) * sizeof *out);
    if (!out) {
        free(body);
        return oom();
    }
    out[0] = sp.bos;
    memcpy(out + 1, body, (size_t)nb * sizeof *out);
    out[nb + 1] = sp.boi;
    free(body);
    *ids = out;
    *n = nb + 2;
    return FLEXDIAG_OK;
}
