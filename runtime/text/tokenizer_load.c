/*
 * tokenizer_load.c - reading tokenizer.json into a flexdiag_tokenizer: the BPE model (vocab,
 * merges in both "a b" and [a, b] forms), added tokens (ids re-derived as the library does),
 * normalizer and pre-tokenizer steps (Split regexes translated from Oniguruma to PCRE2,
 * ByteLevel), with every unsupported option or malformed field reported by file and field.
 * Everything that reads a loaded tokenizer (queries, encoding, the Janus template) lives in
 * tokenizer.c and the shared struct in tokenizer_impl.h; neither file calls the other.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/json_where.h"
#include "runtime/text/tokenizer_impl.h"

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
    a.special = special;
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
    char where[48];
    t->root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    flexdiag_status st = t->root ? load_root(t)
                                 : flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                                 "%s: invalid JSON%s: %s", t->name,
                                                 flexdiag__json_where(&je, where, sizeof where),
                                                 je.text);
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
