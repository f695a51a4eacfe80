/*
 * tokenizer.c - tokenizer.json (Hugging Face `tokenizers`) byte-level BPE, bit-exact with the
 * library for the options DeepSeek-LLM / Janus-Pro use, plus token queries and the Janus prompt
 * template: everything that reads a tokenizer tokenizer_load.c built (it calls nothing there).
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
#include <stdio.h>
#include <stdlib.h>

#include "runtime/text/tokenizer_impl.h"

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
