/*
 * test_attn_win.c - window passes of attn_decode (kernels.h flexdiag_attn_args win) on the CPU
 * reference and fast tables. A call with win = L over n_seq sequences must equal, row by row and
 * bit for bit, a call with win 1 over n_seq·L sequences whose blocks are copies: virtual
 * sequence q = s·L + i gets a copy of sequence s's blocks, lp[s] and prefix[s], and the win
 * call's slot list, n_slots and output rows of q. The lists are causal inside the window: row i
 * of sequence s attends a random selection of the t_s ring rows written before the window, then
 * the window's rows t_s..t_s+i. Ring rows past the window and prompt rows past lp are NaN, so
 * every output and lse must be finite. Per-(row, KV head) lists, one list per row and one list
 * for all; blocks with their own prompt rows and shared prompt KV (prefix); groups of 1, 3 and 4
 * query heads; outputs, ring logits, lse and probabilities. Also the refusals: win < 0, and
 * win > 1 with the fused Diagonal update or a cascade plan (INVALID_ARG naming win).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "cpu_harness.h"
#include "kernels/kernels.h"
#include "util.h"

/* One case: ns sequences of win query rows, heads, head size, prompt rows (per block, or per
 * prompt-only block when npre > 0: shared prompt KV over npre blocks), ring rows, list sharing
 * (FLEXDIAG_SLOTS_*). */
typedef struct win_shape {
    int32_t ns, win, hq, hkv, dh, pcap, ring, shared, npre;
} win_shape;

/* Windows of 2, 4 and 8; lists longer than the fast table's 32-key chunk (the last case). */
static const win_shape shapes[] = {
    {3, 2, 4, 2, 16, 6, 12, FLEXDIAG_SLOTS_PER_HEAD, 0},
    {2, 4, 4, 4, 8, 5, 16, FLEXDIAG_SLOTS_PER_SEQ, 0},
    {4, 8, 8, 2, 16, 7, 20, FLEXDIAG_SLOTS_PER_HEAD, 2},
    {3, 4, 3, 1, 16, 4, 10, FLEXDIAG_SLOTS_PER_SEQ, 2},
    {2, 2, 2, 2, 8, 3, 6, FLEXDIAG_SLOTS_ONE, 0},
    {2, 4, 8, 2, 64, 20, 50, FLEXDIAG_SLOTS_PER_HEAD, 0},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* Host data of one case: the win call's and the expanded call's. */
typedef struct win_case {
    win_shape sh;
    int64_t rows;             /* query rows ns·win */
    int64_t w;                /* qkv row width (hq + 2·hkv)·dh */
    int64_t blk;              /* floats of one cache block: (p_cap + ring)·dh */
    int64_t pre;              /* floats of one prompt-only block: pcap·dh (npre > 0) */
    int32_t p_cap, ms;        /* prompt rows per cache block (0 with prefix); list stride */
    int64_t n_lists;          /* lists of the sharing mode over rows virtual sequences */
    int32_t *lp, *prefix;     /* (ns) */
    int32_t *lpx, *prefixx;   /* (rows) the expanded call's: lp[q / win], prefix[q / win] */
    int32_t *slots, *n_slots; /* (n_lists, ms), (n_lists): both calls' */
    float *q;                 /* (rows, w) */
    float *k, *v;             /* (ns·hkv) blocks */
    float *kx, *vx;           /* (rows·hkv) blocks: block (q, h) a copy of (q / win, h) */
    float *kpre, *vpre;       /* (npre·hkv) prompt-only blocks, or NULL */
} win_case;

static void *zalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    assert_non_null(p);
    return p;
}

/* The row whose list li is under the sharing mode (list 0 for all rows: row 0's). */
static int64_t list_row(const win_case *c, int64_t li) {
    return c->sh.shared == FLEXDIAG_SLOTS_PER_HEAD ? li / c->sh.hkv
           : c->sh.shared == FLEXDIAG_SLOTS_PER_SEQ ? li
                                                    : 0;
}

/* Ring rows of sequence s written before its window: the window holds rows t..t + win - 1. */
static int32_t history(const win_shape *sh, int32_t s) {
    int32_t t = sh->ring - sh->win - s % 3;
    return t > 0 ? t : 0;
}

/* List li: the history rows of its row's sequence, each kept with probability 3/4, in random
 * order, then the window's rows up to its own (causal inside the window); -1 past the end. */
static void make_list(win_case *c, int64_t li, tu_rng *r) {
    int64_t q = list_row(c, li);
    int32_t s = (int32_t)(q / c->sh.win), i = (int32_t)(q % c->sh.win), t = history(&c->sh, s);
    int32_t *sl = c->slots + li * c->ms, n = 0;
    for (int32_t row = 0; row < t; row++)
        if (tu_rng_int(r, 0, 3) != 0) sl[n++] = row;
    for (int32_t j = n - 1; j > 0; j--) {
        int32_t x = (int32_t)tu_rng_int(r, 0, j), tmp = sl[j];
        sl[j] = sl[x];
        sl[x] = tmp;
    }
    for (int32_t row = t; row <= t + i; row++) sl[n++] = row;
    c->n_slots[li] = n;
    for (int32_t j = n; j < c->ms; j++) sl[j] = -1;
}

/* NaN into rows nobody may read: ring rows past each sequence's window, prompt rows past lp
 * (in the blocks, or in a prompt-only block past the longest prompt of its sequences). */
static void mark_unread(win_case *c) {
    const win_shape *sh = &c->sh;
    for (int32_t s = 0; s < sh->ns; s++)
        for (int32_t h = 0; h < sh->hkv; h++) {
            int64_t b = ((int64_t)s * sh->hkv + h) * c->blk;
            for (int64_t e = (int64_t)c->lp[s] * sh->dh; !sh->npre && e < c->pre; e++)
                c->k[b + e] = c->v[b + e] = NAN;
            int64_t ring0 = (int64_t)c->p_cap * sh->dh;
            for (int64_t e = ring0 + (int64_t)(history(sh, s) + sh->win) * sh->dh; e < c->blk; e++)
                c->k[b + e] = c->v[b + e] = NAN;
        }
    for (int32_t p = 0; p < sh->npre; p++) {
        int32_t lmax = 0;
        for (int32_t s = 0; s < sh->ns; s++)
            if (c->prefix[s] == p && c->lp[s] > lmax) lmax = c->lp[s];
        for (int32_t h = 0; h < sh->hkv; h++)
            for (int64_t e = (int64_t)lmax * sh->dh; e < c->pre; e++) {
                int64_t b = ((int64_t)p * sh->hkv + h) * c->pre;
                c->kpre[b + e] = c->vpre[b + e] = NAN;
            }
    }
}

/* The expanded call's blocks and metadata: virtual sequence q gets sequence q / win's. */
static void expand(win_case *c) {
    const win_shape *sh = &c->sh;
    for (int64_t q = 0; q < c->rows; q++) {
        int64_t s = q / sh->win;
        c->lpx[q] = c->lp[s];
        c->prefixx[q] = c->prefix[s];
        size_t bytes = (size_t)c->blk * sizeof(float) * (size_t)sh->hkv;
        memcpy(c->kx + q * sh->hkv * c->blk, c->k + s * sh->hkv * c->blk, bytes);
        memcpy(c->vx + q * sh->hkv * c->blk, c->v + s * sh->hkv * c->blk, bytes);
    }
}

static void make_case(win_case *c, const win_shape *sh, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->sh = *sh;
    c->rows = (int64_t)sh->ns * sh->win;
    c->w = ((int64_t)sh->hq + 2 * sh->hkv) * sh->dh;
    c->p_cap = sh->npre ? 0 : sh->pcap;
    c->blk = ((int64_t)c->p_cap + sh->ring) * sh->dh;
    c->pre = (int64_t)sh->pcap * sh->dh;
    c->ms = sh->ring + 2; /* a stride that is not a list length */
    c->n_lists = sh->shared == FLEXDIAG_SLOTS_ONE       ? 1
                 : sh->shared == FLEXDIAG_SLOTS_PER_SEQ ? c->rows
                                                        : c->rows * sh->hkv;
    int64_t nb = (int64_t)sh->ns * sh->hkv, np = (int64_t)sh->npre * sh->hkv;
    c->lp = zalloc((size_t)sh->ns * 4);
    c->prefix = zalloc((size_t)sh->ns * 4);
    c->lpx = zalloc((size_t)c->rows * 4);
    c->prefixx = zalloc((size_t)c->rows * 4);
    c->slots = zalloc((size_t)(c->n_lists * c->ms) * 4);
    c->n_slots = zalloc((size_t)c->n_lists * 4);
    c->q = zalloc((size_t)(c->rows * c->w) * 4);
    c->k = zalloc((size_t)(nb * c->blk) * 4), c->v = zalloc((size_t)(nb * c->blk) * 4);
    c->kx = zalloc((size_t)(c->rows * sh->hkv * c->blk) * 4);
    c->vx = zalloc((size_t)(c->rows * sh->hkv * c->blk) * 4);
    const int32_t lps[4] = {sh->pcap, 0, sh->pcap / 2, 1}; /* a sequence without prompt rows */
    for (int32_t s = 0; s < sh->ns; s++) {
        c->lp[s] = lps[s % 4];
        c->prefix[s] = sh->npre ? (7 * s + 1) % sh->npre : 0;
    }
    tu_rng r;
    tu_rng_seed(&r, seed);
    tu_fill_f32(&r, c->q, c->rows * c->w, 1.0f);
    tu_fill_f32(&r, c->k, nb * c->blk, 1.0f);
    tu_fill_f32(&r, c->v, nb * c->blk, 1.0f);
    if (sh->npre) {
        c->kpre = zalloc((size_t)(np * c->pre) * 4), c->vpre = zalloc((size_t)(np * c->pre) * 4);
        tu_fill_f32(&r, c->kpre, np * c->pre, 1.0f);
        tu_fill_f32(&r, c->vpre, np * c->pre, 1.0f);
    }
    for (int64_t li = 0; li < c->n_lists; li++) make_list(c, li, &r);
    mark_unread(c);
    expand(c);
}

static void free_case(win_case *c) {
    void *all[] = {c->lp, c->prefix, c->lpx,  c->prefixx, c->slots, c->n_slots,
                   c->q,  c->k,      c->v,    c->kx,      c->vx,    c->kpre, c->vpre};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* What one call writes (guarded, filled with NaN before the call). */
typedef struct win_out {
    float *out, *lg, *lse, *pr; /* (rows, hq, dh), (rows, hq, ms), (rows, hq), (rows, hq, ms) */
} win_out;

/* attn_decode of the case: the win call over ns sequences, or (expanded) win 1 over the rows
 * copies; every optional output requested. */
static win_out run(const flexdiag_kernels *K, const win_case *c, int expanded) {
    const win_shape *sh = &c->sh;
    int64_t nh = c->rows * sh->hq;
    win_out o = {ch_guarded(nh * sh->dh, NAN), ch_guarded(nh * c->ms, NAN), ch_guarded(nh, NAN),
                 ch_guarded(nh * c->ms, NAN)};
    flexdiag_attn_args a = {.n_seq = expanded ? (int32_t)c->rows : sh->ns, .h_q = sh->hq,
                            .h_kv = sh->hkv, .d_h = sh->dh, .p_cap = c->p_cap, .ring = sh->ring,
                            .scale = 1.0f / sqrtf((float)sh->dh),
                            .lp = expanded ? c->lpx : c->lp, .slots = c->slots,
                            .n_slots = c->n_slots, .max_slots = c->ms, .logits_out = o.lg,
                            .lse_out = o.lse, .shared_slots = sh->shared, .probs_out = o.pr,
                            .win = expanded ? 1 : sh->win};
    if (sh->npre)
        a.prefix = expanded ? c->prefixx : c->prefix, a.k_pre = c->kpre, a.v_pre = c->vpre,
        a.n_pre = sh->npre, a.pre_cap = sh->pcap;
    flexdiag_stream *s = ch_stream(K, 2);
    flexdiag_status st = K->attn_decode(o.out, c->q, expanded ? c->kx : c->k,
                                        expanded ? c->vx : c->v, &a, s);
    if (st != FLEXDIAG_OK) fail_msg("%s attn_decode: %s", K->name, flexdiag__err_msg());
    K->stream_destroy(s);
    const char *lab = expanded ? "expanded call" : "win call";
    ch_guard_check(o.out, nh * sh->dh, lab);
    ch_guard_check(o.lg, nh * c->ms, lab);
    ch_guard_check(o.lse, nh, lab);
    ch_guard_check(o.pr, nh * c->ms, lab);
    return o;
}

static void free_out(win_out *o) {
    ch_guarded_free(o->out);
    ch_guarded_free(o->lg);
    ch_guarded_free(o->lse);
    ch_guarded_free(o->pr);
}

/* Query head row qh (row q = qh / hq) of both calls, bit for bit; out and lse finite, so no
 * NaN row was read (every row attends at least its own window row). */
static void compare_row(const win_case *c, const win_out *a, const win_out *b, int64_t qh,
                        const char *table) {
    const win_shape *sh = &c->sh;
    int64_t q = qh / sh->hq;
    struct {
        const char *name;
        const float *x, *y;
        int64_t n;
    } parts[] = {{"out", a->out + qh * sh->dh, b->out + qh * sh->dh, sh->dh},
                 {"ring logits", a->lg + qh * c->ms, b->lg + qh * c->ms, c->ms},
                 {"lse", a->lse + qh, b->lse + qh, 1},
                 {"probabilities", a->pr + qh * c->ms, b->pr + qh * c->ms, c->ms}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (memcmp(parts[i].x, parts[i].y, (size_t)parts[i].n * 4) != 0)
            fail_msg("%s: row %lld (sequence %lld, query %lld), head %lld: %s differ from the "
                     "expanded call's", table, (long long)q, (long long)(q / sh->win),
                     (long long)(q % sh->win), (long long)(qh % sh->hq), parts[i].name);
    for (int32_t e = 0; e < sh->dh; e++)
        if (!isfinite(a->out[qh * sh->dh + e]))
            fail_msg("%s: row %lld out[%d] is not finite (a NaN row was read)", table,
                     (long long)q, e);
    if (!isfinite(a->lse[qh])) fail_msg("%s: row %lld lse is not finite", table, (long long)q);
}

static void check_shape(const flexdiag_kernels *K, const win_shape *sh, uint64_t seed) {
    win_case c;
    make_case(&c, sh, seed);
    win_out a = run(K, &c, 0), b = run(K, &c, 1);
    char table[160];
    snprintf(table, sizeof table, "%s, win %d over %d sequences (h_q %d, h_kv %d, d_h %d, lists "
             "%s, prefix blocks %d)", K->name, sh->win, sh->ns, sh->hq, sh->hkv, sh->dh,
             sh->shared == FLEXDIAG_SLOTS_PER_HEAD  ? "per (row, KV head)"
             : sh->shared == FLEXDIAG_SLOTS_PER_SEQ ? "per row"
                                                    : "one for all",
             sh->npre);
    for (int64_t qh = 0; qh < c.rows * sh->hq; qh++) compare_row(&c, &a, &b, qh, table);
    free_out(&a);
    free_out(&b);
    free_case(&c);
}

static void check(const flexdiag_kernels *K) {
    for (int i = 0; i < N_SHAPES; i++) check_shape(K, &shapes[i], 100 + (uint64_t)i);
}

static void test_cpu_ref(void **state) {
    (void)state;
    tu_on_table(0, check);
}

static void test_cpu_fast(void **state) {
    (void)state;
    tu_on_table(1, check);
}

/* st is INVALID_ARG and the message holds both needles. */
static void expect_refusal(flexdiag_status st, const char *needle, const char *needle2) {
    const char *msg = flexdiag__err_msg();
    if (st != FLEXDIAG_ERR_INVALID_ARG || !strstr(msg, needle) || !strstr(msg, needle2))
        fail_msg("status %d, message \"%s\": want INVALID_ARG naming \"%s\" and \"%s\"", st, msg,
                 needle, needle2);
    flexdiag__err_clear();
}

/* win < 0; win > 1 with diag_lag or a cascade plan (n_casc_tiles): INVALID_ARG naming win, on
 * both CPU tables; the same call with win 2 alone is fine. */
static void test_refusals(void **state) {
    (void)state;
    const flexdiag_kernels *tabs[] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    enum { DH = 8, PCAP = 2, RING = 4, WIN = 2 };
    float q[WIN * 3 * DH] = {0}, kv[(PCAP + RING) * DH] = {0}, out[WIN * DH];
    int32_t lp = 1, sl[WIN * 2] = {0, -1, 0, 1}, ns[WIN] = {1, 2}, next = 3; /* causal lists */
    int16_t lag[2] = {0, 1};
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *K = tabs[t];
        flexdiag_attn_args ok = {.n_seq = 1, .h_q = 1, .h_kv = 1, .d_h = DH, .p_cap = PCAP,
                                 .ring = RING, .scale = 0.25f, .lp = &lp, .slots = sl,
                                 .n_slots = ns, .max_slots = 2, .win = WIN};
        flexdiag_attn_args a = ok;
        a.win = -1;
        expect_refusal(K->attn_decode(out, q, kv, kv, &a, NULL), "win = -1", "attn_decode");
        a = ok;
        a.diag_lag = lag, a.diag_a = 2, a.diag_next = &next;
        expect_refusal(K->attn_decode(out, q, kv, kv, &a, NULL), "win = 2", "diag_lag");
        a = ok;
        a.n_casc_tiles = 1;
        expect_refusal(K->attn_decode(out, q, kv, kv, &a, NULL), "win = 2", "cascade plan");
        assert_int_equal(K->attn_decode(out, q, kv, kv, &ok, NULL), FLEXDIAG_OK);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_ref),
        cmocka_unit_test(test_cpu_fast),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
