/*
 * test_attn_cuda.c - the CUDA kv_append, attn_prefill and attn_decode ops against the scalar
 * CPU reference (flexdiag__kernels_cpu_ref()) on the same bf16 inputs (upcast to fp32 for the
 * CPU), over a table of shapes: n_seq 1..64, MHA and GQA groups of 2, 3, 4, 8 and 12, d_h 16 to
 * 128, prompt blocks of 40, 50 or 133 rows with lengths 0, 1, 7, 50, 130 (clamped to the block)
 * varying per sequence, rings of 16..1100 rows with random slot lists (random order, some empty,
 * duplicated key rows to force logit ties), one list per (sequence, KV head), one shared list or
 * one per sequence (kernels.h FLEXDIAG_SLOTS_*); small batches exercise decode's split-K path,
 * short single-head lists its U = 2 kernel, a 1100-slot list the slot reads past the
 * shared-memory staging.
 *
 * Per case: the prompt is appended (padding qkv rows are NaN, so the kernels must never read
 * cache rows >= lp), prefill runs, one decode token is appended into a ring slot of each
 * (sequence, KV head) and decode runs with logits_out and lse_out. Checks (docs/architecture.md
 * §10.2): kv_append exact (whole caches bit-identical); outputs within bf16 tolerances of the
 * reference and within 2x the error of a naive bf16 implementation vs an fp64 reference
 * (flash-attention's rule); logits / lse within a bound derived from fp32 dot-product error;
 * identical keys give bit-identical logits; the policy outputs (probs_out, the fused Diagonal
 * update over random lag lists, all-tie lists included, with a diag_next array mixing new lags
 * and negative entries) against the call's own logits, the lags also against the CPU
 * reference's update wherever its logits make the decision clear;
 * 1024-element guard regions around every device buffer come back unchanged; outputs are poisoned
 * before each call so unwritten elements fail. Decode with shared prompt KV (prefix blocks,
 * ring-only caches) in each CTA order (head-major, sequence-major, the cascade), split-K
 * included, against the reference and each other, with the same policy checks. kv_append with
 * positions (fused RoPE) has its own file, test_kv_append_cuda.c. Window passes (kernels.h win:
 * 2, 4 or 8 query rows per sequence, lists causal inside the window, per (row, KV head) or per
 * row, with and without shared prompt KV, split-K included) against the reference's window
 * call, and bit-identical to a win-1 call over copies of the blocks (test_win). Also: the
 * host-side argument checks. Exits 77 when CUDA is not built or no device is usable.
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
#include "kernels/kernels.h"
#include "util.h"

/* Guard elements before and after every device buffer. */
#define GUARD 1024
/* bf16 quiet NaN: the content of padding qkv rows and of ring rows no slot list names. */
#define BF16_NAN 0x7fc0u

/* bf16 output tolerances (docs/architecture.md §10.2). max_nmse: bf16 rounding of the outputs alone
 * gives ~1e-6; 1e-4 (1 % rms) still fails any indexing or masking error, which is O(1). */
#define OUT_ATOL 1e-3
#define OUT_RTOL 1.6e-2
#define OUT_NMSE 1e-4

typedef struct attn_case {
    int32_t n_seq, h_q, h_kv, d_h, ring;
    int32_t shared; /* decode's slot-list sharing (FLEXDIAG_SLOTS_*): per (sequence, KV head),
                       one for all, or one per sequence */
    int32_t p_cap;  /* prompt rows per (sequence, KV head); 133 is not a multiple of the 64-row
                       prefill tile */
    int32_t tie_all; /* every ring key of a list is the same K row: all its logits tie, so
                        Diagonal's update must pick the largest lag */
} attn_case;

/* Shape table: every n_seq / head layout / d_h of the brief at least once, plus odd groups
 * (g = 3, g = 12 > 8 query heads per CTA), shared slot lists (one for all: 1, one per sequence:
 * 2), and the decode bench shape at a small ring. On a 132-SM GPU the cases with n_seq·h_kv <
 * 264 take the split-K path. */
static const attn_case cases[] = {
    {1, 4, 4, 16, 16, 0, 133, 0},    {1, 32, 32, 128, 600, 0, 133, 0},
    {3, 8, 2, 64, 37, 0, 133, 0},    {3, 4, 4, 128, 600, 1, 133, 0},
    {8, 32, 32, 64, 100, 0, 133, 0}, {8, 8, 2, 16, 250, 0, 133, 0},
    {8, 16, 2, 128, 64, 0, 133, 0},  {8, 8, 4, 32, 33, 0, 133, 0},
    {8, 12, 4, 64, 20, 0, 133, 0},   {3, 24, 2, 64, 50, 1, 133, 0},
    {64, 4, 4, 64, 600, 0, 133, 0},  {64, 8, 2, 128, 300, 1, 133, 0},
    {64, 32, 32, 128, 24, 0, 133, 0},
    /* short lists (p_cap + max_slots <= 128 keys, single-head CTAs, no split-K): the U = 2
     * instantiation at 8 CTAs per SM, also at d_h 64 and 32 with few lists; a list longer than
     * the 1024 slots staged in shared memory */
    {64, 32, 32, 128, 29, 0, 50, 0}, {64, 16, 16, 64, 40, 1, 40, 0},
    {3, 5, 5, 64, 29, 0, 50, 0},     {7, 3, 3, 32, 70, 0, 50, 0},
    {64, 8, 8, 16, 1100, 0, 133, 0},
    /* all-tie ring keys for the fused Diagonal update: short lists (also at d_h 16, 16 row
     * groups a warp), and split-K (g = 4) */
    {64, 32, 32, 128, 29, 0, 50, 1}, {2, 8, 2, 64, 300, 0, 133, 1},
    {5, 3, 3, 16, 60, 0, 50, 1},
    /* one list per sequence, shared by its KV heads: split-K (g = 4 and MHA), short lists over
     * 16 heads, odd groups */
    {3, 8, 2, 64, 300, 2, 133, 0},   {2, 4, 4, 128, 600, 2, 133, 0},
    {64, 16, 16, 64, 40, 2, 40, 0},  {8, 12, 4, 32, 70, 2, 133, 0},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* The backends under test and the oracle. */
static const flexdiag_kernels *gk, *rk;
static flexdiag_stream *gs, *rs;

/* ---- device buffers with guard regions ---- */

typedef struct dbuf {
    uint8_t *base;   /* device allocation: guard | payload | guard */
    void *p;         /* device payload */
    size_t bytes;    /* payload bytes */
    size_t gbytes;   /* bytes of one guard (GUARD elements) */
    uint8_t *guard;  /* host copy of both guards (2 · gbytes) */
} dbuf;

static void ck(flexdiag_status st, const char *what) {
    if (st != FLEXDIAG_OK) fprintf(stderr, "%s: %s\n", what, flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* Device buffer of n elements of esz bytes with random guards (uploaded); payload unset. */
static dbuf dbuf_new(int64_t n, size_t esz, tu_rng *r) {
    dbuf b = {NULL, NULL, (size_t)n * esz, GUARD * esz, NULL};
    void *base = NULL;
    ck(gk->mem_alloc(b.bytes + 2 * b.gbytes, &base), "mem_alloc");
    b.base = base;
    b.p = b.base + b.gbytes;
    b.guard = xmalloc(2 * b.gbytes);
    for (size_t i = 0; i < 2 * b.gbytes; i++) b.guard[i] = (uint8_t)tu_rng_u64(r);
    ck(gk->copy_h2d(b.base, b.guard, b.gbytes, gs), "copy_h2d guard");
    ck(gk->copy_h2d(b.base + b.gbytes + b.bytes, b.guard + b.gbytes, b.gbytes, gs),
       "copy_h2d guard");
    return b;
}

static void dbuf_up(dbuf *b, const void *src) {
    if (b->bytes) ck(gk->copy_h2d(b->p, src, b->bytes, gs), "copy_h2d");
}

static void dbuf_down(const dbuf *b, void *dst) {
    if (b->bytes) ck(gk->copy_d2h(dst, b->p, b->bytes, gs), "copy_d2h");
}

/* Fill the payload with 0xff bytes (bf16 / fp32 NaN): unwritten outputs cannot pass. */
static void dbuf_poison(dbuf *b) {
    uint8_t *h = xmalloc(b->bytes);
    memset(h, 0xff, b->bytes);
    dbuf_up(b, h);
    free(h);
}

/* Both guards still hold their random bytes. */
static void dbuf_check_guards(const dbuf *b, const char *label) {
    uint8_t *h = xmalloc(2 * b->gbytes);
    ck(gk->copy_d2h(h, b->base, b->gbytes, gs), "copy_d2h guard");
    ck(gk->copy_d2h(h + b->gbytes, b->base + b->gbytes + b->bytes, b->gbytes, gs),
       "copy_d2h guard");
    int ok = memcmp(h, b->guard, 2 * b->gbytes) == 0;
    if (!ok) fprintf(stderr, "%s: guard region overwritten\n", label);
    free(h);
    assert_true(ok);
}

static void dbuf_free(dbuf *b) {
    gk->mem_free(b->base);
    free(b->guard);
}

/* ---- host data ---- */

/* One case's inputs on the host: bf16 for the device, fp32 upcasts for the CPU reference. */
typedef struct problem {
    attn_case c;
    int32_t w;             /* qkv row width (h_q + 2·h_kv)·d_h */
    int32_t max_slots;     /* slot list stride */
    int64_t cache_n;       /* elements of one cache (K or V) */
    int32_t *lp;           /* (n_seq) prompt rows */
    int64_t n_lists;       /* slot lists: n_seq·h_kv, 1 (one for all) or n_seq (per sequence) */
    int32_t *slots;        /* (n_lists, max_slots) */
    int32_t *n_slots;      /* (n_lists) */
    int32_t *dup;          /* (n_lists): 1 when slot entries 1 and 2 hold identical keys */
    uint16_t *kc, *vc;     /* caches, bf16 */
    float *kc32, *vc32;    /* the same, fp32 (the CPU reference's caches) */
    uint16_t *qkv_p;       /* (n_seq·p_cap, w) prompt qkv; padding rows NaN */
    uint16_t *qkv_d;       /* (n_seq, w) decode qkv */
    flexdiag_attn_args a;  /* host view (pointers into this struct) */
} problem;

/* The slot list (sequence, KV head) block sh attends (kernels.h flexdiag__slot_list). */
static int64_t list_of(const problem *pb, int64_t sh) {
    return flexdiag__slot_list(&pb->a, sh / pb->c.h_kv, (int32_t)(sh % pb->c.h_kv));
}

/* Slot lists of a sharing mode (n_seq sequences, h_kv KV heads): 1 (one for all), n_seq (one
 * per sequence) or n_seq·h_kv. */
static int64_t lists_of(int32_t shared, int32_t n_seq, int32_t h_kv) {
    if (shared == FLEXDIAG_SLOTS_ONE) return 1;
    return shared == FLEXDIAG_SLOTS_PER_SEQ ? n_seq : (int64_t)n_seq * h_kv;
}

/* n_lists random slot lists of stride ms over a ring of `ring` rows (distinct rows in random
 * order, about one in six empty, -1 past the end). */
static void random_lists(int32_t *slots, int32_t *n_slots, int64_t n_lists, int32_t ring,
                         int32_t ms, tu_rng *r) {
    int32_t *perm = xmalloc((size_t)ring * sizeof *perm);
    for (int64_t li = 0; li < n_lists; li++) {
        for (int32_t i = 0; i < ring; i++) perm[i] = i;
        for (int32_t i = ring - 1; i > 0; i--) {
            int32_t j = (int32_t)tu_rng_int(r, 0, i), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        int32_t ns = tu_rng_int(r, 0, 5) == 0 ? 0 : (int32_t)tu_rng_int(r, 1, ring);
        n_slots[li] = ns;
        for (int32_t j = 0; j < ms; j++) slots[li * ms + j] = j < ns ? perm[j] : -1;
    }
    free(perm);
}

/* Random slot lists; lists of 3 slots or more get a duplicated key (mark_ring). */
static void make_slots(problem *pb, tu_rng *r) {
    random_lists(pb->slots, pb->n_slots, pb->n_lists, pb->c.ring, pb->max_slots, r);
    for (int64_t li = 0; li < pb->n_lists; li++) pb->dup[li] = pb->n_slots[li] >= 3;
}

/* Per cache block: ring rows its list does not name become NaN (never read); the key and
 * value of list entry 1 are copied to entry 2 (forced logit ties). */
static void mark_ring(problem *pb) {
    const attn_case *c = &pb->c;
    uint8_t *named = xmalloc((size_t)c->ring);
    for (int64_t sh = 0; sh < (int64_t)c->n_seq * c->h_kv; sh++) {
        const int32_t *sl = pb->slots + list_of(pb, sh) * pb->max_slots;
        int32_t ns = pb->n_slots[list_of(pb, sh)];
        uint16_t *kv[2] = {pb->kc + sh * ((int64_t)pb->c.p_cap + c->ring) * c->d_h,
                           pb->vc + sh * ((int64_t)pb->c.p_cap + c->ring) * c->d_h};
        memset(named, 0, (size_t)c->ring);
        for (int32_t j = 0; j < ns; j++) named[sl[j]] = 1;
        for (int t = 0; t < 2; t++) {
            uint16_t *ring = kv[t] + (int64_t)pb->c.p_cap * c->d_h;
            for (int32_t i = 0; i < c->ring; i++)
                for (int32_t e = 0; e < c->d_h && !named[i]; e++)
                    ring[(int64_t)i * c->d_h + e] = BF16_NAN;
            if (pb->dup[list_of(pb, sh)])
                memcpy(ring + (int64_t)sl[2] * c->d_h, ring + (int64_t)sl[1] * c->d_h,
                       (size_t)c->d_h * 2);
            for (int32_t j = 1; t == 0 && c->tie_all && j < ns; j++)
                memcpy(ring + (int64_t)sl[j] * c->d_h, ring + (int64_t)sl[0] * c->d_h,
                       (size_t)c->d_h * 2);
        }
    }
    free(named);
}

static void problem_init(problem *pb, const attn_case *c, int idx, tu_rng *r) {
    static const int32_t lps[4] = {1, 7, 50, 130};
    memset(pb, 0, sizeof *pb);
    pb->c = *c;
    pb->w = (c->h_q + 2 * c->h_kv) * c->d_h;
    pb->max_slots = c->ring + 3; /* a stride that is not the list length */
    pb->cache_n = (int64_t)c->n_seq * c->h_kv * (pb->c.p_cap + c->ring) * c->d_h;
    pb->lp = xmalloc((size_t)c->n_seq * sizeof *pb->lp);
    for (int32_t s = 0; s < c->n_seq; s++) {
        int32_t lp = lps[(s + idx) % 4];
        pb->lp[s] = lp < pb->c.p_cap ? lp : pb->c.p_cap;
    }
    if (c->n_seq == 8 && c->d_h == 16) pb->lp[2] = 0; /* a sequence without a prompt */
    pb->n_lists = lists_of(c->shared, c->n_seq, c->h_kv);
    pb->slots = xmalloc((size_t)(pb->n_lists * pb->max_slots) * sizeof *pb->slots);
    pb->n_slots = xmalloc((size_t)pb->n_lists * sizeof *pb->n_slots);
    pb->dup = xmalloc((size_t)pb->n_lists * sizeof *pb->dup);
    flexdiag_attn_args a = {c->n_seq, c->h_q, c->h_kv, c->d_h, pb->c.p_cap, c->ring,
                            1.0f / sqrtf((float)c->d_h), pb->lp, pb->slots, pb->n_slots,
                            pb->max_slots, NULL, NULL, c->shared, NULL, 0.0f, NULL, NULL, 0, 0,
                            NULL, NULL, NULL, NULL, 0, 0, NULL, NULL, 0, 0};
    pb->a = a;
    pb->kc = xmalloc((size_t)pb->cache_n * 2);
    pb->vc = xmalloc((size_t)pb->cache_n * 2);
    tu_fill_bf16(r, pb->kc, pb->cache_n, 1.0f);
    tu_fill_bf16(r, pb->vc, pb->cache_n, 1.0f);
    make_slots(pb, r);
    if (c->n_seq == 8 && c->d_h == 16 && !c->shared) { /* its head 0 attends no key at all */
        pb->n_slots[2 * c->h_kv] = 0;
        pb->dup[2 * c->h_kv] = 0;
    }
    mark_ring(pb);
    pb->kc32 = tu_bf16_to_f32(pb->kc, pb->cache_n);
    pb->vc32 = tu_bf16_to_f32(pb->vc, pb->cache_n);
    /* q and k ~ N(0, 1.5²): logits of a few units, softmax neither flat nor one-hot */
    int64_t np = (int64_t)c->n_seq * pb->c.p_cap * pb->w;
    pb->qkv_p = xmalloc((size_t)np * 2);
    tu_fill_bf16(r, pb->qkv_p, np, 1.5f);
    for (int32_t s = 0; s < c->n_seq; s++)
        for (int64_t i = (int64_t)pb->lp[s] * pb->w; i < (int64_t)pb->c.p_cap * pb->w; i++)
            pb->qkv_p[(int64_t)s * pb->c.p_cap * pb->w + i] = BF16_NAN;
    pb->qkv_d = xmalloc((size_t)c->n_seq * pb->w * 2);
    tu_fill_bf16(r, pb->qkv_d, (int64_t)c->n_seq * pb->w, 1.5f);
}

static void problem_free(problem *pb) {
    free(pb->lp);
    free(pb->slots);
    free(pb->n_slots);
    free(pb->dup);
    free(pb->kc);
    free(pb->vc);
    free(pb->kc32);
    free(pb->vc32);
    free(pb->qkv_p);
    free(pb->qkv_d);
}

/* ---- independent references: fp64 and naive bf16 ---- */

/* One query over n keys (fp32 upcasts of bf16 rows): o64 in fp64; onaive as a plain bf16
 * implementation computes it (scores rounded to bf16, softmax in fp32 rounded to bf16, P·V
 * accumulated in fp32 and rounded to bf16, as torch does on bf16 tensors). */
static void attend_ref(const float *q, const float *const *kr, const float *const *vr, int64_t n,
                       int d_h, float scale, double *o64, float *onaive, float *zb) {
    double m = -INFINITY, l = 0;
    float mb = -INFINITY, lb = 0;
    for (int64_t j = 0; j < n; j++) {
        double z = 0;
        float zf = 0;
        for (int e = 0; e < d_h; e++) {
            z += (double)q[e] * kr[j][e];
            zf += q[e] * kr[j][e];
        }
        zb[j] = flexdiag__bf16_to_f32(flexdiag__f32_to_bf16(zf * scale));
        m = fmax(m, z * scale);
        mb = fmaxf(mb, zb[j]);
    }
    for (int e = 0; e < d_h; e++) o64[e] = 0, onaive[e] = 0;
    for (int64_t j = 0; j < n; j++) lb += expf(zb[j] - mb);
    for (int64_t j = 0; j < n; j++) {
        double z = 0;
        for (int e = 0; e < d_h; e++) z += (double)q[e] * kr[j][e];
        double p = exp(z * scale - m);
        l += p;
        float pb = flexdiag__bf16_to_f32(flexdiag__f32_to_bf16(expf(zb[j] - mb) / lb));
        for (int e = 0; e < d_h; e++) {
            o64[e] += p * vr[j][e];
            onaive[e] += pb * vr[j][e];
        }
    }
    for (int e = 0; e < d_h; e++) {
        o64[e] = n ? o64[e] / l : 0;
        onaive[e] = flexdiag__bf16_to_f32(flexdiag__f32_to_bf16(onaive[e]));
    }
}

/* Flash-attention rule state: max |x - fp64| of the kernel and of the naive bf16 version. */
typedef struct fa_err {
    double kernel, naive;
} fa_err;

static void fa_add(fa_err *fe, const float *got, const double *o64, const float *onaive, int n) {
    for (int e = 0; e < n; e++) {
        fe->kernel = fmax(fe->kernel, fabs(got[e] - o64[e]));
        fe->naive = fmax(fe->naive, fabs(onaive[e] - o64[e]));
    }
}

/* kernel error <= 2 x naive error; the 1e-6 floor covers cases where every output is exact in
 * bf16 (single-key rows): a bf16 value >= 1e-3 has an ulp >= 4e-6, so the floor hides nothing. */
static void fa_check(const fa_err *fe, const char *label) {
    int ok = fe->kernel <= 2 * fe->naive + 1e-6;
    fprintf(ok ? stdout : stderr, "%s: max err vs fp64 %.3g, naive bf16 %.3g%s\n", label,
            fe->kernel, fe->naive, ok ? "" : " (> 2x: FAIL)");
    assert_true(ok);
}

/* ---- comparisons ---- */

static float *download_bf16(const dbuf *b, int64_t n) {
    uint16_t *h = xmalloc((size_t)n * 2);
    dbuf_down(b, h);
    float *f = tu_bf16_to_f32(h, n);
    free(h);
    return f;
}

/* Device caches equal the CPU reference's bit for bit (kv_append and nothing else wrote). */
static void check_caches(const problem *pb, const dbuf *k, const dbuf *v, const char *label) {
    uint16_t *h = xmalloc((size_t)pb->cache_n * 2);
    const float *ref[2] = {pb->kc32, pb->vc32};
    const dbuf *d[2] = {k, v};
    for (int t = 0; t < 2; t++) {
        dbuf_down(d[t], h);
        int64_t bad = 0;
        for (int64_t i = 0; i < pb->cache_n; i++)
            if (h[i] != flexdiag__f32_to_bf16(ref[t][i]) && bad++ < 5)
                fprintf(stderr, "%s %s cache: element %lld is 0x%04x, want 0x%04x\n", label,
                        t ? "V" : "K", (long long)i, h[i], flexdiag__f32_to_bf16(ref[t][i]));
        assert_int_equal(bad, 0);
        dbuf_check_guards(d[t], label);
    }
    free(h);
}

/* Cache row r of (sequence s, KV head h), fp32. */
static const float *row32(const problem *pb, const float *c, int64_t s, int32_t h, int64_t r) {
    return c + ((s * pb->c.h_kv + h) * (pb->c.p_cap + pb->c.ring) + r) * pb->c.d_h;
}

/* Cache row of attended key j of (sequence s, KV head block sh) at decode: prompt, then slots. */
static int64_t key_row(const problem *pb, int64_t sh, int64_t s, int64_t j) {
    if (j < pb->lp[s]) return j;
    return pb->c.p_cap + pb->slots[list_of(pb, sh) * pb->max_slots + j - pb->lp[s]];
}

/* ---- the three ops on one case ---- */

/* Append the prompt (every row of the p_cap block, padding rows carry NaN) on both backends. */
static void run_append_prompt(problem *pb, dbuf *dk, dbuf *dv, tu_rng *r) {
    const attn_case *c = &pb->c;
    int64_t n_tok = (int64_t)c->n_seq * pb->c.p_cap, np = n_tok * pb->w;
    int32_t *rows = xmalloc((size_t)(n_tok * c->h_kv) * sizeof *rows);
    for (int64_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < c->h_kv; h++) rows[i * c->h_kv + h] = (int32_t)(i % pb->c.p_cap);
    dbuf drows = dbuf_new(n_tok * c->h_kv, 4, r), dqkv = dbuf_new(np, 2, r);
    dbuf_up(&drows, rows);
    dbuf_up(&dqkv, pb->qkv_p);
    float *qkv32 = tu_bf16_to_f32(pb->qkv_p, np);
    flexdiag_attn_args ga = pb->a;
    const int32_t per = pb->c.p_cap;
    ck(gk->kv_append(dk->p, dv->p, dqkv.p, drows.p, n_tok, per, &ga, gs), "cuda kv_append");
    ck(rk->kv_append(pb->kc32, pb->vc32, qkv32, rows, n_tok, per, &pb->a, rs), "ref kv_append");
    check_caches(pb, dk, dv, "prompt kv_append");
    dbuf_check_guards(&drows, "kv_append rows");
    dbuf_check_guards(&dqkv, "kv_append qkv");
    free(rows);
    free(qkv32);
    dbuf_free(&drows);
    dbuf_free(&dqkv);
}

/* fp64 / naive references of prefill for every valid row, folded into fe. */
static void prefill_fa(const problem *pb, const float *qkv32, const float *got, fa_err *fe) {
    const attn_case *c = &pb->c;
    int g = c->h_q / c->h_kv, d = c->d_h;
    const float **kr = xmalloc(c->p_cap * sizeof *kr), **vr = xmalloc(c->p_cap * sizeof *vr);
    double *o64 = xmalloc((size_t)d * sizeof *o64);
    float *on = xmalloc((size_t)d * sizeof *on), *zb = xmalloc(c->p_cap * sizeof *zb);
    for (int64_t s = 0; s < c->n_seq; s++)
        for (int32_t hq = 0; hq < c->h_q; hq++) {
            for (int64_t j = 0; j < pb->lp[s]; j++) {
                kr[j] = row32(pb, pb->kc32, s, hq / g, j);
                vr[j] = row32(pb, pb->vc32, s, hq / g, j);
            }
            for (int64_t r = 0; r < pb->lp[s]; r++) {
                int64_t row = s * pb->c.p_cap + r;
                attend_ref(qkv32 + row * pb->w + (int64_t)hq * d, kr, vr, r + 1, d, pb->a.scale,
                           o64, on, zb);
                fa_add(fe, got + row * c->h_q * d + (int64_t)hq * d, o64, on, d);
            }
        }
    free(kr);
    free(vr);
    free(o64);
    free(on);
    free(zb);
}

static void run_prefill(problem *pb, const dbuf *dk, const dbuf *dv, const dbuf *dlp, tu_rng *r,
                        const char *label) {
    const attn_case *c = &pb->c;
    int64_t n_out = (int64_t)c->n_seq * pb->c.p_cap * c->h_q * c->d_h;
    int64_t np = (int64_t)c->n_seq * pb->c.p_cap * pb->w;
    dbuf dout = dbuf_new(n_out, 2, r), dqkv = dbuf_new(np, 2, r);
    dbuf_up(&dqkv, pb->qkv_p);
    dbuf_poison(&dout);
    flexdiag_attn_args ga = pb->a;
    ga.lp = dlp->p;
    ck(gk->attn_prefill(dout.p, dqkv.p, dk->p, dv->p, &ga, gs), "cuda attn_prefill");
    float *qkv32 = tu_bf16_to_f32(pb->qkv_p, np), *ref = xmalloc((size_t)n_out * sizeof *ref);
    ck(rk->attn_prefill(ref, qkv32, pb->kc32, pb->vc32, &pb->a, rs), "ref attn_prefill");
    float *got = download_bf16(&dout, n_out);
    char lab[160];
    snprintf(lab, sizeof lab, "%s prefill out", label);
    assert_true(tu_allclose(lab, got, ref, n_out, OUT_ATOL, OUT_RTOL, OUT_NMSE));
    fa_err fe = {0, 0};
    prefill_fa(pb, qkv32, got, &fe);
    fa_check(&fe, lab);
    dbuf_check_guards(&dout, lab);
    dbuf_check_guards(&dqkv, lab);
    free(qkv32);
    free(ref);
    free(got);
    dbuf_free(&dout);
    dbuf_free(&dqkv);
}

/* Append one decode token per sequence into slot entry 0 of each (sequence, KV head) list (a
 * random ring row when the list is empty) on both backends. */
static void run_append_decode(problem *pb, dbuf *dk, dbuf *dv, tu_rng *r) {
    const attn_case *c = &pb->c;
    int64_t nsh = (int64_t)c->n_seq * c->h_kv;
    int32_t *rows = xmalloc((size_t)nsh * sizeof *rows);
    for (int64_t sh = 0; sh < nsh; sh++) {
        int64_t li = list_of(pb, sh);
        rows[sh] = pb->c.p_cap + (pb->n_slots[li] ? pb->slots[li * pb->max_slots]
                                            : (int32_t)tu_rng_int(r, 0, c->ring - 1));
    }
    dbuf drows = dbuf_new(nsh, 4, r), dqkv = dbuf_new((int64_t)c->n_seq * pb->w, 2, r);
    dbuf_up(&drows, rows);
    dbuf_up(&dqkv, pb->qkv_d);
    float *qkv32 = tu_bf16_to_f32(pb->qkv_d, (int64_t)c->n_seq * pb->w);
    flexdiag_attn_args ga = pb->a;
    ck(gk->kv_append(dk->p, dv->p, dqkv.p, drows.p, c->n_seq, 1, &ga, gs), "cuda kv_append");
    ck(rk->kv_append(pb->kc32, pb->vc32, qkv32, rows, c->n_seq, 1, &pb->a, rs), "ref kv_append");
    check_caches(pb, dk, dv, "decode kv_append");
    free(rows);
    free(qkv32);
    dbuf_free(&drows);
    dbuf_free(&dqkv);
}

/* K row (fp32) of attended key j (prompt rows first, then the slot list) of (sequence s, KV
 * head h) of a decode call, from the caller's data ctx. */
typedef const float *key_fn(const void *ctx, int64_t s, int32_t h, int64_t j);

/* Logits and lse of the decode call ha describes (host view) vs the reference. Bound: both sides
 * are fp32 dot products of the same d_h <= 128 products in different orders, each within
 * d_h·2^-24·Σ|q_i k_i| ≈ 7.6e-6·Σ|q_i k_i| of exact; 1e-4·scale·Σ|q_i k_i| leaves 10x headroom
 * and still fails any wrong key (an error of order Σ|q_i k_i|). lse adds 1e-4 for the
 * normaliser: an fp32 sum of <= 700 terms in another order differs by < 700·2^-24 relative
 * (4e-5 after the log). */
static int check_logits(const flexdiag_attn_args *ha, const float *qkv32, key_fn *key,
                        const void *ctx, const float *got_lg, const float *ref_lg,
                        const float *got_lse, const float *ref_lse) {
    int g = ha->h_q / ha->h_kv, d = ha->d_h, bad = 0;
    int64_t w = ((int64_t)ha->h_q + 2 * ha->h_kv) * d;
    for (int64_t s = 0; s < ha->n_seq && bad < 10; s++)
        for (int32_t hq = 0; hq < ha->h_q && bad < 10; hq++) {
            int64_t shq = s * ha->h_q + hq, li = flexdiag__slot_list(ha, s, hq / g);
            const float *q = qkv32 + s * w + (int64_t)hq * d;
            double magmax = 0;
            for (int64_t j = 0; j < ha->lp[s] + ha->n_slots[li]; j++) {
                const float *k = key(ctx, s, hq / g, j);
                double mag = 0;
                for (int e = 0; e < d; e++) mag += fabs((double)q[e] * k[e]);
                mag *= ha->scale;
                magmax = fmax(magmax, mag);
                if (j < ha->lp[s]) continue;
                int64_t at = shq * ha->max_slots + j - ha->lp[s];
                if (!(fabs(got_lg[at] - ref_lg[at]) <= 1e-4 * mag + 1e-30) && bad++ < 5)
                    fprintf(stderr, "logits[seq %lld][head %d][%lld]: got %.9g ref %.9g\n",
                            (long long)s, hq, (long long)(j - ha->lp[s]), got_lg[at], ref_lg[at]);
            }
            double tol = 1e-4 * magmax + 1e-4;
            int same_inf = isinf(ref_lse[shq]) && got_lse[shq] == ref_lse[shq];
            if (!same_inf && !(fabs(got_lse[shq] - ref_lse[shq]) <= tol) && bad++ < 5)
                fprintf(stderr, "lse[seq %lld][head %d]: got %.9g ref %.9g\n", (long long)s, hq,
                        got_lse[shq], ref_lse[shq]);
        }
    return bad == 0;
}

/* key_fn of a problem (ctx): its fp32 K cache. */
static const float *problem_key(const void *ctx, int64_t s, int32_t h, int64_t j) {
    const problem *pb = ctx;
    return row32(pb, pb->kc32, s, h, key_row(pb, s * pb->c.h_kv + h, s, j));
}

/* Identical keys at slot entries 1 and 2 give bit-identical logits (ties stay ties); entries past
 * n_slots are left untouched (still the 0xff poison). */
static int check_ties_and_tail(const problem *pb, const float *got_lg) {
    const attn_case *c = &pb->c;
    int g = c->h_q / c->h_kv, bad = 0;
    for (int64_t shq = 0; shq < (int64_t)c->n_seq * c->h_q; shq++) {
        int64_t sh = (shq / c->h_q) * c->h_kv + (shq % c->h_q) / g;
        const float *lg = got_lg + shq * pb->max_slots;
        if (pb->dup[list_of(pb, sh)] && memcmp(&lg[1], &lg[2], 4) != 0 && bad++ < 5)
            fprintf(stderr, "tie lost at (seq, head) %lld: %.9g vs %.9g\n", (long long)shq, lg[1],
                    lg[2]);
        for (int32_t j = pb->n_slots[list_of(pb, sh)]; j < pb->max_slots; j++) {
            uint32_t u;
            memcpy(&u, &lg[j], 4);
            if (u != 0xffffffffu && bad++ < 5)
                fprintf(stderr, "logits_out[%lld][%d] past n_slots was written\n",
                        (long long)shq, j);
        }
    }
    return bad == 0;
}

/* fp64 / naive references of decode, folded into fe. */
static void decode_fa(const problem *pb, const float *qkv32, const float *got, fa_err *fe) {
    const attn_case *c = &pb->c;
    int g = c->h_q / c->h_kv, d = c->d_h;
    int64_t nmax = pb->c.p_cap + pb->max_slots;
    const float **kr = xmalloc((size_t)nmax * sizeof *kr);
    const float **vr = xmalloc((size_t)nmax * sizeof *vr);
    double *o64 = xmalloc((size_t)d * sizeof *o64);
    float *on = xmalloc((size_t)d * sizeof *on), *zb = xmalloc((size_t)nmax * sizeof *zb);
    for (int64_t s = 0; s < c->n_seq; s++)
        for (int32_t hq = 0; hq < c->h_q; hq++) {
            int64_t sh = s * c->h_kv + hq / g, n = pb->lp[s] + pb->n_slots[list_of(pb, sh)];
            for (int64_t j = 0; j < n; j++) {
                kr[j] = row32(pb, pb->kc32, s, hq / g, key_row(pb, sh, s, j));
                vr[j] = row32(pb, pb->vc32, s, hq / g, key_row(pb, sh, s, j));
            }
            attend_ref(qkv32 + s * pb->w + (int64_t)hq * d, kr, vr, n, d, pb->a.scale, o64, on, zb);
            fa_add(fe, got + (s * c->h_q + hq) * d, o64, on, d);
        }
    free(kr);
    free(vr);
    free(o64);
    free(on);
    free(zb);
}

/* The lag the fused Diagonal update writes for sequence s in these tests (kernels.h: diag_next
 * (n_seq), one per sequence): every third sequence has none (a negative entry: its lists must
 * stay as they are), the others distinct values. */
#define DIAG_NEXT 30000
static int32_t diag_next_of(int64_t s) {
    return s % 3 == 1 ? (int32_t)(-1 - s) : DIAG_NEXT - (int32_t)s;
}

/* Group score of ring column col of (sequence s, KV head h): max over the g query heads of lg. */
static float diag_score(const flexdiag_attn_args *ha, const float *lg, int64_t s, int32_t h,
                        int32_t col) {
    int g = ha->h_q / ha->h_kv;
    float sc = -INFINITY;
    for (int i = 0; i < g; i++)
        sc = fmaxf(sc, lg[(s * ha->h_q + (int64_t)h * g + i) * ha->max_slots + col]);
    return sc;
}

/* Random distinct lags for every (sequence, KV head) list of the call ha describes (a shuffled
 * 0..a-1) and the lists a literal argmin of (group-max logit lg, -lag) over the candidates of
 * kernels.h expects after the update with diag_next_of; tie_all: every candidate ties, so the
 * largest lag goes. */
static void diag_expect(const flexdiag_attn_args *ha, int32_t a, int32_t base, const float *lg,
                        int tie_all, int16_t *lag, int16_t *want, tu_rng *r) {
    for (int64_t li = 0; li < (int64_t)ha->n_seq * ha->h_kv; li++) {
        int16_t *l = lag + li * a;
        for (int32_t e = 0; e < a; e++) l[e] = (int16_t)e;
        for (int32_t e = a - 1; e > 0; e--) {
            int32_t j = (int32_t)tu_rng_int(r, 0, e);
            int16_t t = l[e];
            l[e] = l[j];
            l[j] = t;
        }
        memcpy(want + li * a, l, (size_t)a * 2);
        int64_t s = li / ha->h_kv;
        int32_t h = (int32_t)(li % ha->h_kv), ns = ha->n_slots[li], best = -1, top = -1;
        float bs = 0;
        for (int32_t e = 0; e < ns - base; e++) {
            float sc = diag_score(ha, lg, s, h, ns - 1 - e);
            if (best < 0 || sc < bs || (sc == bs && l[e] > l[best])) best = e, bs = sc;
            if (top < 0 || l[e] > l[top]) top = e;
        }
        if (tie_all) assert_int_equal(best, top); /* all tied: the largest lag goes */
        if (best >= 0 && diag_next_of(s) >= 0) want[li * a + best] = (int16_t)diag_next_of(s);
    }
}

/* Scores closer than this to the winner's (and not equal to it) leave the update's decision to
 * rounding: 10x the logit bound of check_logits at these shapes (scale·Σ|q k| <= 11). */
#define DIAG_CLEAR 1e-3f

/* Diagonal's update against the CPU reference's (ref_lag, run on its own logits ref_lg from the
 * same lags lag0): the lists of the sequences without a new lag unchanged on the CPU too, and
 * every list whose decision the CPU's logits make clear, i.e. each other candidate's score is
 * the winner's exactly (identical keys, which tie on both backends) or above it by more than
 * DIAG_CLEAR, equal to the device's (got) bit for bit. */
static int diag_vs_ref(const flexdiag_attn_args *ha, int32_t a, int32_t base, const float *ref_lg,
                       const int16_t *got, const int16_t *ref_lag, const int16_t *lag0,
                       const char *label) {
    int64_t n = (int64_t)ha->n_seq * ha->h_kv, compared = 0, bad = 0;
    for (int64_t li = 0; li < n; li++) {
        int64_t s = li / ha->h_kv;
        int32_t h = (int32_t)(li % ha->h_kv), ns = ha->n_slots[li];
        size_t off = (size_t)li * (size_t)a, bytes = (size_t)a * 2;
        if (diag_next_of(s) < 0) {
            if (memcmp(ref_lag + off, lag0 + off, bytes) && bad++ < 5)
                fprintf(stderr, "%s: the CPU rewrote list %lld (no new lag)\n", label,
                        (long long)li);
            continue;
        }
        float lo = INFINITY;
        for (int32_t e = 0; e < ns - base; e++)
            lo = fminf(lo, diag_score(ha, ref_lg, s, h, ns - 1 - e));
        int clear = 1;
        for (int32_t e = 0; e < ns - base && clear; e++) {
            float sc = diag_score(ha, ref_lg, s, h, ns - 1 - e);
            clear = sc == lo || sc > lo + DIAG_CLEAR;
        }
        if (!clear) continue;
        compared++;
        if (memcmp(got + off, ref_lag + off, bytes) && bad++ < 5)
            fprintf(stderr, "%s: lag list %lld differs from the CPU reference's\n", label,
                    (long long)li);
    }
    printf("%s: %lld of %lld lag lists compared with the CPU reference\n", label,
           (long long)compared, (long long)n);
    return bad == 0;
}

/* Probabilities of the call ha describes within 4 ulp of expf(lg - lse) (the same formula on the
 * same floats, GPU vs host expf), nothing written past n_slots (0xff poison kept). */
static int check_probs(const flexdiag_attn_args *ha, const float *got, const float *lg,
                       const float *lse) {
    int g = ha->h_q / ha->h_kv, bad = 0;
    for (int64_t shq = 0; shq < (int64_t)ha->n_seq * ha->h_q; shq++) {
        int64_t s = shq / ha->h_q;
        int32_t ns = ha->n_slots[flexdiag__slot_list(ha, s, (int32_t)(shq % ha->h_q) / g)];
        const float *pr = got + shq * ha->max_slots, *z = lg + shq * ha->max_slots;
        for (int32_t j = 0; j < ns; j++) {
            float want = isinf(lse[shq]) ? 0.0f : expf(z[j] - lse[shq]);
            if (!(fabsf(pr[j] - want) <= 4 * 1.1920929e-7f * want + 1e-38f) && bad++ < 5)
                fprintf(stderr, "probs[%lld][%d]: got %.9g want %.9g\n", (long long)shq, j,
                        pr[j], want);
        }
        for (int32_t j = ns; j < ha->max_slots; j++) {
            uint32_t u;
            memcpy(&u, &pr[j], 4);
            if (u != 0xffffffffu && bad++ < 5)
                fprintf(stderr, "probs_out[%lld][%d] past n_slots was written\n",
                        (long long)shq, j);
        }
    }
    return bad == 0;
}

/* Decode again with the policy outputs only (probs_out, and with per-(sequence, KV head) lists
 * the fused Diagonal update with a diag_next array mixing new lags and negative entries; ga has
 * the device metadata): both against this call's own logits / lse (lg, lse from the first call:
 * the kernel computes them identically), the attention output bit-identical to out0, and the
 * lags against the CPU reference's update on the same lags (diag_vs_ref; qkv32, ref_lg: the
 * reference's inputs and logits). */
static void check_policy_scores(const problem *pb, flexdiag_attn_args ga, dbuf *dout,
                                const void *dqkv, const dbuf *dk, const dbuf *dv,
                                const float *lg, const float *lse, const uint16_t *out0,
                                const float *qkv32, const float *ref_lg, tu_rng *r,
                                const char *label) {
    const attn_case *c = &pb->c;
    const int diag = c->shared == FLEXDIAG_SLOTS_PER_HEAD; /* the update needs per-head lists */
    int64_t nq = (int64_t)c->n_seq * c->h_q, n_out = nq * c->d_h, n_lg = nq * pb->max_slots;
    /* all-tie cases keep column 0 (entry 0, where this step's token was appended: another
     * logit) out of the candidates */
    int32_t a = pb->max_slots, base = c->tie_all ? 1 + c->ring % 3 : c->ring % 3;
    int64_t n_lag = diag ? pb->n_lists * a : 1;
    size_t lag_bytes = (size_t)n_lag * 2;
    int16_t *lag0 = xmalloc(lag_bytes), *lag = xmalloc(lag_bytes), *want = xmalloc(lag_bytes);
    int32_t *next = xmalloc((size_t)c->n_seq * 4);
    for (int32_t s = 0; s < c->n_seq; s++) next[s] = diag_next_of(s);
    lag0[0] = 0; /* uploaded even without the update */
    if (diag) diag_expect(&pb->a, a, base, lg, c->tie_all, lag0, want, r);
    dbuf dpr = dbuf_new(n_lg, 4, r), dlag = dbuf_new(n_lag, 2, r), dnx = dbuf_new(c->n_seq, 4, r);
    dbuf_poison(&dpr);
    dbuf_up(&dlag, lag0);
    dbuf_up(&dnx, next);
    ga.probs_out = dpr.p;
    if (diag) {
        ga.diag_lag = dlag.p;
        ga.diag_a = a;
        ga.diag_base = base;
        ga.diag_next = dnx.p;
    }
    dbuf_poison(dout);
    ck(gk->attn_decode(dout->p, dqkv, dk->p, dv->p, &ga, gs), "cuda attn_decode (probs, diag)");
    char lab[200];
    snprintf(lab, sizeof lab, "%s policy scores", label);
    float *pr = xmalloc((size_t)n_lg * 4);
    uint16_t *o = xmalloc((size_t)n_out * 2);
    dbuf_down(&dpr, pr);
    dbuf_down(&dlag, lag);
    dbuf_down(dout, o);
    assert_true(check_probs(&pb->a, pr, lg, lse));
    assert_memory_equal(o, out0, (size_t)n_out * 2);
    if (diag) {
        for (int64_t li = 0, bad = 0; li < pb->n_lists; li++)
            if (memcmp(lag + li * a, want + li * a, (size_t)a * 2) && bad++ < 5)
                fprintf(stderr, "%s: lag list %lld differs from the literal argmin\n", lab,
                        (long long)li);
        assert_memory_equal(lag, want, lag_bytes);
        int16_t *rlag = xmalloc(lag_bytes);
        float *rout = xmalloc((size_t)n_out * 4);
        memcpy(rlag, lag0, lag_bytes);
        flexdiag_attn_args ra = pb->a;
        ra.diag_lag = rlag;
        ra.diag_a = a;
        ra.diag_base = base;
        ra.diag_next = next;
        ck(rk->attn_decode(rout, qkv32, pb->kc32, pb->vc32, &ra, rs), "ref attn_decode (diag)");
        assert_true(diag_vs_ref(&pb->a, a, base, ref_lg, lag, rlag, lag0, lab));
        free(rlag);
        free(rout);
    }
    dbuf *all[3] = {&dpr, &dlag, &dnx};
    for (int i = 0; i < 3; i++) dbuf_check_guards(all[i], lab);
    for (int i = 0; i < 3; i++) dbuf_free(all[i]);
    free(pr);
    free(o);
    free(lag0);
    free(lag);
    free(want);
    free(next);
}

static void run_decode(problem *pb, const dbuf *dk, const dbuf *dv, const dbuf *dlp, tu_rng *r,
                       const char *label) {
    const attn_case *c = &pb->c;
    int64_t nl = pb->n_lists, nq = (int64_t)c->n_seq * c->h_q;
    int64_t n_out = nq * c->d_h, n_lg = nq * pb->max_slots;
    dbuf dout = dbuf_new(n_out, 2, r), dqkv = dbuf_new((int64_t)c->n_seq * pb->w, 2, r);
    dbuf dslots = dbuf_new(nl * pb->max_slots, 4, r), dns = dbuf_new(nl, 4, r);
    dbuf dlg = dbuf_new(n_lg, 4, r), dlse = dbuf_new(nq, 4, r);
    dbuf_up(&dqkv, pb->qkv_d);
    dbuf_up(&dslots, pb->slots);
    dbuf_up(&dns, pb->n_slots);
    dbuf_poison(&dout);
    dbuf_poison(&dlg);
    dbuf_poison(&dlse);
    flexdiag_attn_args ga = pb->a;
    ga.lp = dlp->p;
    ga.slots = dslots.p;
    ga.n_slots = dns.p;
    ga.logits_out = dlg.p;
    ga.lse_out = dlse.p;
    ck(gk->attn_decode(dout.p, dqkv.p, dk->p, dv->p, &ga, gs), "cuda attn_decode");

    float *qkv32 = tu_bf16_to_f32(pb->qkv_d, (int64_t)c->n_seq * pb->w);
    float *ref = xmalloc((size_t)n_out * 4), *ref_lg = xmalloc((size_t)n_lg * 4);
    float *ref_lse = xmalloc((size_t)nq * 4), *got_lg = xmalloc((size_t)n_lg * 4);
    float *got_lse = xmalloc((size_t)nq * 4);
    flexdiag_attn_args ra = pb->a;
    ra.logits_out = ref_lg;
    ra.lse_out = ref_lse;
    ck(rk->attn_decode(ref, qkv32, pb->kc32, pb->vc32, &ra, rs), "ref attn_decode");
    float *got = download_bf16(&dout, n_out);
    dbuf_down(&dlg, got_lg);
    dbuf_down(&dlse, got_lse);
    char lab[160];
    snprintf(lab, sizeof lab, "%s decode out", label);
    assert_true(tu_allclose(lab, got, ref, n_out, OUT_ATOL, OUT_RTOL, OUT_NMSE));
    fa_err fe = {0, 0};
    decode_fa(pb, qkv32, got, &fe);
    fa_check(&fe, lab);
    assert_true(check_logits(&pb->a, qkv32, problem_key, pb, got_lg, ref_lg, got_lse, ref_lse));
    assert_true(check_ties_and_tail(pb, got_lg));

    /* without the optional outputs the attention output is bit-identical */
    uint16_t *o1 = xmalloc((size_t)n_out * 2), *o2 = xmalloc((size_t)n_out * 2);
    dbuf_down(&dout, o1);
    dbuf_poison(&dout);
    ga.logits_out = NULL;
    ga.lse_out = NULL;
    ck(gk->attn_decode(dout.p, dqkv.p, dk->p, dv->p, &ga, gs), "cuda attn_decode (no extras)");
    dbuf_down(&dout, o2);
    assert_memory_equal(o1, o2, (size_t)n_out * 2);
    check_policy_scores(pb, ga, &dout, dqkv.p, dk, dv, got_lg, got_lse, o1, qkv32, ref_lg, r, lab);

    const dbuf *all[6] = {&dout, &dqkv, &dslots, &dns, &dlg, &dlse};
    for (int i = 0; i < 6; i++) dbuf_check_guards(all[i], lab);
    for (int i = 0; i < 6; i++) dbuf_free((dbuf *)all[i]);
    free(o1);
    free(o2);
    free(qkv32);
    free(ref);
    free(ref_lg);
    free(ref_lse);
    free(got_lg);
    free(got_lse);
    free(got);
}

/* One shape: append prompt, prefill, append a decode token, decode. */
static void test_case(void **state) {
    const attn_case *c = *state;
    int idx = (int)(c - cases);
    char label[96];
    snprintf(label, sizeof label, "case %d (n_seq %d, h_q %d, h_kv %d, d_h %d, ring %d)", idx,
             c->n_seq, c->h_q, c->h_kv, c->d_h, c->ring);
    tu_rng r;
    tu_rng_seed(&r, 1000 + (uint64_t)idx);
    problem pb;
    problem_init(&pb, c, idx, &r);
    dbuf dk = dbuf_new(pb.cache_n, 2, &r), dv = dbuf_new(pb.cache_n, 2, &r);
    dbuf dlp = dbuf_new(c->n_seq, 4, &r);
    dbuf_up(&dk, pb.kc);
    dbuf_up(&dv, pb.vc);
    dbuf_up(&dlp, pb.lp);
    run_append_prompt(&pb, &dk, &dv, &r);
    run_prefill(&pb, &dk, &dv, &dlp, &r, label);
    run_append_decode(&pb, &dk, &dv, &r);
    run_decode(&pb, &dk, &dv, &dlp, &r, label);
    dbuf_check_guards(&dlp, label);
    dbuf_free(&dk);
    dbuf_free(&dv);
    dbuf_free(&dlp);
    problem_free(&pb);
}

/* ---- shared prompt KV (prefix): CTA orders, the cascade, per-sequence lags ---- */

typedef struct prefix_case {
    int32_t n_seq, h_q, h_kv, d_h, ring;
    int32_t n_pre, pre_cap; /* prompt-only blocks and their rows */
    int32_t shared;         /* FLEXDIAG_SLOTS_PER_HEAD or FLEXDIAG_SLOTS_PER_SEQ */
} prefix_case;

/* Few sequences (split-K, also with one list per sequence), many CTAs of short lists (g = 1),
 * groups of 4 with the cascade's tiles; on a 132-SM GPU the first, fourth and fifth split. */
static const prefix_case pcases[] = {
    {3, 8, 2, 64, 300, 2, 40, FLEXDIAG_SLOTS_PER_HEAD},
    {64, 8, 8, 64, 40, 5, 50, FLEXDIAG_SLOTS_PER_HEAD},
    {40, 16, 4, 128, 90, 4, 30, FLEXDIAG_SLOTS_PER_HEAD},
    {5, 4, 4, 128, 200, 3, 50, FLEXDIAG_SLOTS_PER_SEQ},
    {7, 3, 3, 16, 120, 2, 20, FLEXDIAG_SLOTS_PER_HEAD},
    {48, 8, 2, 32, 64, 6, 20, FLEXDIAG_SLOTS_PER_SEQ},
};
#define N_PCASES ((int)(sizeof pcases / sizeof pcases[0]))

/* One prefix case on the host: ring-only caches (p_cap 0) and the prompt-only store, bf16 for
 * the device, fp32 upcasts for the CPU reference. */
typedef struct pproblem {
    prefix_case c;
    int32_t w, max_slots;
    int64_t cache_n, pre_n, n_lists;
    int32_t *lp, *prefix, *slots, *n_slots;
    uint16_t *kc, *vc, *kp, *vp, *qkv;
    float *kc32, *vc32, *kp32, *vp32, *qkv32;
    flexdiag_attn_args a; /* host view (pointers into this struct) */
} pproblem;

/* key_fn of a pproblem (ctx): the prompt rows from the sequence's prefix block. */
static const float *pproblem_key(const void *ctx, int64_t s, int32_t h, int64_t j) {
    const pproblem *pp = ctx;
    const prefix_case *c = &pp->c;
    if (j < pp->lp[s])
        return pp->kp32 + (((int64_t)pp->prefix[s] * c->h_kv + h) * c->pre_cap + j) * c->d_h;
    int64_t li = flexdiag__slot_list(&pp->a, s, h);
    int32_t slot = pp->slots[li * pp->max_slots + j - pp->lp[s]];
    return pp->kc32 + ((s * c->h_kv + h) * c->ring + slot) * c->d_h;
}

/* Random data; rows nobody may read are NaN: ring rows no list of their block names, and rows
 * of a prompt block at or past the longest prompt of its sequences. */
static void pproblem_init(pproblem *pp, const prefix_case *c, int idx, tu_rng *r) {
    memset(pp, 0, sizeof *pp);
    pp->c = *c;
    pp->w = (c->h_q + 2 * c->h_kv) * c->d_h;
    pp->max_slots = c->ring + 3;
    pp->cache_n = (int64_t)c->n_seq * c->h_kv * c->ring * c->d_h;
    pp->pre_n = (int64_t)c->n_pre * c->h_kv * c->pre_cap * c->d_h;
    pp->n_lists = lists_of(c->shared, c->n_seq, c->h_kv);
    pp->lp = xmalloc((size_t)c->n_seq * 4);
    pp->prefix = xmalloc((size_t)c->n_seq * 4);
    const int32_t lps[5] = {c->pre_cap, 1, 7, 0, c->pre_cap - 3};
    int32_t *lmax = xmalloc((size_t)c->n_pre * 4);
    memset(lmax, 0, (size_t)c->n_pre * 4);
    for (int32_t s = 0; s < c->n_seq; s++) {
        int32_t lp = lps[(s + idx) % 5];
        pp->lp[s] = lp < 0 ? 0 : lp > c->pre_cap ? c->pre_cap : lp;
        pp->prefix[s] = (7 * s + 1) % c->n_pre;
        if (pp->lp[s] > lmax[pp->prefix[s]]) lmax[pp->prefix[s]] = pp->lp[s];
    }
    pp->slots = xmalloc((size_t)(pp->n_lists * pp->max_slots) * 4);
    pp->n_slots = xmalloc((size_t)pp->n_lists * 4);
    random_lists(pp->slots, pp->n_slots, pp->n_lists, c->ring, pp->max_slots, r);
    flexdiag_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_seq = c->n_seq;
    a.h_q = c->h_q;
    a.h_kv = c->h_kv;
    a.d_h = c->d_h;
    a.ring = c->ring;
    a.scale = 1.0f / sqrtf((float)c->d_h);
    a.lp = pp->lp;
    a.slots = pp->slots;
    a.n_slots = pp->n_slots;
    a.max_slots = pp->max_slots;
    a.shared_slots = c->shared;
    a.prefix = pp->prefix;
    a.n_pre = c->n_pre;
    a.pre_cap = c->pre_cap;
    pp->a = a;
    pp->kc = xmalloc((size_t)pp->cache_n * 2);
    pp->vc = xmalloc((size_t)pp->cache_n * 2);
    pp->kp = xmalloc((size_t)pp->pre_n * 2);
    pp->vp = xmalloc((size_t)pp->pre_n * 2);
    pp->qkv = xmalloc((size_t)c->n_seq * pp->w * 2);
    tu_fill_bf16(r, pp->kc, pp->cache_n, 1.0f);
    tu_fill_bf16(r, pp->vc, pp->cache_n, 1.0f);
    tu_fill_bf16(r, pp->kp, pp->pre_n, 1.0f);
    tu_fill_bf16(r, pp->vp, pp->pre_n, 1.0f);
    tu_fill_bf16(r, pp->qkv, (int64_t)c->n_seq * pp->w, 1.5f);
    uint8_t *named = xmalloc((size_t)c->ring);
    for (int64_t sh = 0; sh < (int64_t)c->n_seq * c->h_kv; sh++) {
        int64_t li = flexdiag__slot_list(&pp->a, sh / c->h_kv, (int32_t)(sh % c->h_kv));
        memset(named, 0, (size_t)c->ring);
        for (int32_t j = 0; j < pp->n_slots[li]; j++) named[pp->slots[li * pp->max_slots + j]] = 1;
        for (int64_t i = 0; i < (int64_t)c->ring * c->d_h; i++)
            if (!named[i / c->d_h]) {
                pp->kc[sh * c->ring * c->d_h + i] = BF16_NAN;
                pp->vc[sh * c->ring * c->d_h + i] = BF16_NAN;
            }
    }
    for (int64_t bh = 0; bh < (int64_t)c->n_pre * c->h_kv; bh++)
        for (int64_t i = (int64_t)lmax[bh / c->h_kv] * c->d_h; i < (int64_t)c->pre_cap * c->d_h;
             i++) {
            pp->kp[bh * c->pre_cap * c->d_h + i] = BF16_NAN;
            pp->vp[bh * c->pre_cap * c->d_h + i] = BF16_NAN;
        }
    free(named);
    free(lmax);
    pp->kc32 = tu_bf16_to_f32(pp->kc, pp->cache_n);
    pp->vc32 = tu_bf16_to_f32(pp->vc, pp->cache_n);
    pp->kp32 = tu_bf16_to_f32(pp->kp, pp->pre_n);
    pp->vp32 = tu_bf16_to_f32(pp->vp, pp->pre_n);
    pp->qkv32 = tu_bf16_to_f32(pp->qkv, (int64_t)c->n_seq * pp->w);
}

static void pproblem_free(pproblem *pp) {
    void *all[] = {pp->lp,  pp->prefix, pp->slots, pp->n_slots, pp->kc,   pp->vc,  pp->kp,
                   pp->vp,  pp->qkv,    pp->kc32,  pp->vc32,    pp->kp32, pp->vp32, pp->qkv32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* What the decode calls of one CTA order of a prefix case give back (host). */
typedef struct pdecode {
    uint16_t *out, *out2; /* the plain call's output; the policy call's */
    float *lg, *lse, *pr; /* the plain call's logits and lse; the policy call's probabilities */
    int16_t *lag;         /* the policy call's lag lists (per-(sequence, KV head) lists) */
} pdecode;

/* Decode in the CTA order FLEXDIAG_DEC_HEAD_MAJOR / FLEXDIAG_CASCADE select (order 0:
 * head-major, the default with shared prompt KV; 1: sequence-major; 2: the cascade, when the
 * prompts are shared enough): lag0 NULL, the plain call with logits_out and lse_out (into out,
 * lg, lse); else the policy call with probs_out and, with per-head lists, the Diagonal update
 * from lag0 with diag_next_of's entries (into out2, pr, lag). ga holds the device metadata. */
static void prefix_decode(const pproblem *pp, flexdiag_attn_args ga, int order, const dbuf *dk,
                          const dbuf *dv, const dbuf *dqkv, const int16_t *lag0, int32_t base,
                          pdecode *d, tu_rng *r) {
    const prefix_case *c = &pp->c;
    const int diag = c->shared == FLEXDIAG_SLOTS_PER_HEAD;
    int64_t nq = (int64_t)c->n_seq * c->h_q, n_out = nq * c->d_h, n_lg = nq * pp->max_slots;
    int64_t n_lag = diag ? (int64_t)c->n_seq * c->h_kv * pp->max_slots : 1;
    int32_t *next = xmalloc((size_t)c->n_seq * 4);
    for (int32_t s = 0; s < c->n_seq; s++) next[s] = diag_next_of(s);
    dbuf dout = dbuf_new(n_out, 2, r), dlg = dbuf_new(n_lg, 4, r), dlse = dbuf_new(nq, 4, r);
    dbuf dpr = dbuf_new(n_lg, 4, r), dlag = dbuf_new(n_lag, 2, r), dnx = dbuf_new(c->n_seq, 4, r);
    dbuf_poison(&dout);
    dbuf_poison(&dlg);
    dbuf_poison(&dlse);
    dbuf_poison(&dpr);
    dbuf_up(&dnx, next);
    if (lag0) {
        dbuf_up(&dlag, lag0);
        ga.probs_out = dpr.p;
        if (diag) {
            ga.diag_lag = dlag.p;
            ga.diag_a = pp->max_slots;
            ga.diag_base = base;
            ga.diag_next = dnx.p;
        }
    } else {
        ga.logits_out = dlg.p;
        ga.lse_out = dlse.p;
    }
    setenv("FLEXDIAG_DEC_HEAD_MAJOR", order == 1 ? "0" : "1", 1);
    setenv("FLEXDIAG_CASCADE", order == 2 ? "1" : "0", 1);
    ck(gk->attn_decode(dout.p, dqkv->p, dk->p, dv->p, &ga, gs), "cuda attn_decode (prefix)");
    unsetenv("FLEXDIAG_DEC_HEAD_MAJOR");
    unsetenv("FLEXDIAG_CASCADE");
    if (lag0) {
        d->out2 = xmalloc((size_t)n_out * 2);
        d->pr = xmalloc((size_t)n_lg * 4);
        d->lag = xmalloc((size_t)n_lag * 2);
        dbuf_down(&dout, d->out2);
        dbuf_down(&dpr, d->pr);
        dbuf_down(&dlag, d->lag);
    } else {
        d->out = xmalloc((size_t)n_out * 2);
        d->lg = xmalloc((size_t)n_lg * 4);
        d->lse = xmalloc((size_t)nq * 4);
        dbuf_down(&dout, d->out);
        dbuf_down(&dlg, d->lg);
        dbuf_down(&dlse, d->lse);
    }
    dbuf *all[6] = {&dout, &dlg, &dlse, &dpr, &dlag, &dnx};
    for (int i = 0; i < 6; i++) dbuf_check_guards(all[i], "prefix decode");
    for (int i = 0; i < 6; i++) dbuf_free(all[i]);
    free(next);
}

static void pdecode_free(pdecode *d) {
    free(d->out);
    free(d->out2);
    free(d->lg);
    free(d->lse);
    free(d->pr);
    free(d->lag);
}

/* One prefix case: each CTA order against the CPU reference (outputs within the bf16
 * tolerances, logits and lse within check_logits' bound, probabilities against the call's own
 * logits, the policy call's output bit-identical to the plain one's), sequence-major and the
 * cascade's ring logits bit-identical to head-major's (sequence-major: every output), and the
 * Diagonal lags of every order equal to the literal argmin over head-major's logits with
 * diag_next_of's mix of new lags and negative entries and, where the decision is clear, to the
 * CPU reference's (diag_vs_ref). */
static void test_prefix(void **state) {
    const prefix_case *c = *state;
    int idx = (int)(c - pcases);
    char label[128];
    snprintf(label, sizeof label, "prefix case %d (n_seq %d, h_q %d, h_kv %d, d_h %d, ring %d, "
             "lists %s)", idx, c->n_seq, c->h_q, c->h_kv, c->d_h, c->ring,
             c->shared == FLEXDIAG_SLOTS_PER_SEQ ? "per sequence" : "per head");
    tu_rng r;
    tu_rng_seed(&r, 5000 + (uint64_t)idx);
    pproblem pp;
    pproblem_init(&pp, c, idx, &r);
    const int diag = c->shared == FLEXDIAG_SLOTS_PER_HEAD;
    const int g = c->h_q / c->h_kv;
    int64_t nq = (int64_t)c->n_seq * c->h_q, n_out = nq * c->d_h, n_lg = nq * pp.max_slots;
    int32_t a = pp.max_slots, base = c->ring % 3;
    int64_t n_lag = diag ? (int64_t)c->n_seq * c->h_kv * a : 1;
    /* the cascade plan (order 2 uses it when the prompts are shared by 2 sequences or more) */
    int32_t n_tiles = flexdiag__cascade_tiles(c->n_seq, c->n_pre, g);
    int32_t *cseq = xmalloc((size_t)c->n_seq * 4), *ctile = xmalloc((size_t)n_tiles * 12 + 12);
    memset(ctile, 0, (size_t)n_tiles * 12 + 12);
    flexdiag__cascade_plan(pp.prefix, c->n_seq, c->n_pre, g, cseq, ctile);
    dbuf dk = dbuf_new(pp.cache_n, 2, &r), dv = dbuf_new(pp.cache_n, 2, &r);
    dbuf dkp = dbuf_new(pp.pre_n, 2, &r), dvp = dbuf_new(pp.pre_n, 2, &r);
    dbuf dqkv = dbuf_new((int64_t)c->n_seq * pp.w, 2, &r), dlp = dbuf_new(c->n_seq, 4, &r);
    dbuf dpre = dbuf_new(c->n_seq, 4, &r), dsl = dbuf_new(pp.n_lists * pp.max_slots, 4, &r);
    dbuf dns = dbuf_new(pp.n_lists, 4, &r), dcs = dbuf_new(c->n_seq, 4, &r);
    dbuf dct = dbuf_new((int64_t)n_tiles * 3 + 3, 4, &r);
    struct {
        dbuf *b;
        const void *h;
    } up[] = {{&dk, pp.kc},     {&dv, pp.vc},   {&dkp, pp.kp},         {&dvp, pp.vp},
              {&dqkv, pp.qkv},  {&dlp, pp.lp},  {&dpre, pp.prefix},    {&dsl, pp.slots},
              {&dns, pp.n_slots}, {&dcs, cseq}, {&dct, ctile}};
    for (size_t i = 0; i < sizeof up / sizeof up[0]; i++) dbuf_up(up[i].b, up[i].h);
    flexdiag_attn_args ga = pp.a;
    ga.lp = dlp.p;
    ga.slots = dsl.p;
    ga.n_slots = dns.p;
    ga.prefix = dpre.p;
    ga.k_pre = dkp.p;
    ga.v_pre = dvp.p;
    ga.casc_seq = dcs.p;
    ga.casc_tile = dct.p;
    ga.n_casc_tiles = n_tiles;

    /* the CPU reference: outputs, logits and lse */
    float *ref = xmalloc((size_t)n_out * 4), *ref_lg = xmalloc((size_t)n_lg * 4);
    float *ref_lse = xmalloc((size_t)nq * 4);
    flexdiag_attn_args ra = pp.a;
    ra.k_pre = pp.kp32;
    ra.v_pre = pp.vp32;
    ra.logits_out = ref_lg;
    ra.lse_out = ref_lse;
    ck(rk->attn_decode(ref, pp.qkv32, pp.kc32, pp.vc32, &ra, rs), "ref attn_decode (prefix)");

    int16_t *lag0 = xmalloc((size_t)n_lag * 2), *want = xmalloc((size_t)n_lag * 2);
    lag0[0] = 0;
    pdecode d[3];
    memset(d, 0, sizeof d);
    for (int order = 0; order < 3; order++) {
        char lab[200];
        snprintf(lab, sizeof lab, "%s order %s", label,
                 order == 0 ? "head-major" : order == 1 ? "sequence-major" : "cascade");
        prefix_decode(&pp, ga, order, &dk, &dv, &dqkv, NULL, base, &d[order], &r);
        if (order == 0 && diag) /* the lags, and their literal argmin over these logits */
            diag_expect(&pp.a, a, base, d[0].lg, 0, lag0, want, &r);
        prefix_decode(&pp, ga, order, &dk, &dv, &dqkv, lag0, base, &d[order], &r);
        float *got = tu_bf16_to_f32(d[order].out, n_out);
        assert_true(tu_allclose(lab, got, ref, n_out, OUT_ATOL, OUT_RTOL, OUT_NMSE));
        free(got);
        assert_true(check_logits(&pp.a, pp.qkv32, pproblem_key, &pp, d[order].lg, ref_lg,
                                 d[order].lse, ref_lse));
        assert_true(check_probs(&pp.a, d[order].pr, d[order].lg, d[order].lse));
        assert_memory_equal(d[order].out2, d[order].out, (size_t)n_out * 2);
        if (order > 0) assert_memory_equal(d[order].lg, d[0].lg, (size_t)n_lg * 4);
        if (order == 1) {
            assert_memory_equal(d[1].out, d[0].out, (size_t)n_out * 2);
            assert_memory_equal(d[1].lse, d[0].lse, (size_t)nq * 4);
            assert_memory_equal(d[1].pr, d[0].pr, (size_t)n_lg * 4);
        }
        if (diag) assert_memory_equal(d[order].lag, want, (size_t)n_lag * 2);
    }
    if (diag) { /* the CPU reference's update from the same lags */
        int16_t *rlag = xmalloc((size_t)n_lag * 2);
        int32_t *next = xmalloc((size_t)c->n_seq * 4);
        for (int32_t s = 0; s < c->n_seq; s++) next[s] = diag_next_of(s);
        memcpy(rlag, lag0, (size_t)n_lag * 2);
        ra.diag_lag = rlag;
        ra.diag_a = a;
        ra.diag_base = base;
        ra.diag_next = next;
        ck(rk->attn_decode(ref, pp.qkv32, pp.kc32, pp.vc32, &ra, rs),
           "ref attn_decode (prefix, diag)");
        assert_true(diag_vs_ref(&pp.a, a, base, ref_lg, d[0].lag, rlag, lag0, label));
        free(rlag);
        free(next);
    }
    for (int order = 0; order < 3; order++) pdecode_free(&d[order]);
    dbuf *all[] = {&dk, &dv, &dkp, &dvp, &dqkv, &dlp, &dpre, &dsl, &dns, &dcs, &dct};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dbuf_check_guards(all[i], label);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dbuf_free(all[i]);
    free(cseq);
    free(ctile);
    free(lag0);
    free(want);
    free(ref);
    free(ref_lg);
    free(ref_lse);
    pproblem_free(&pp);
}

/* ---- window passes: win query rows per sequence (kernels.h win) ---- */

typedef struct win_case {
    int32_t n_seq, win, h_q, h_kv, d_h, ring;
    int32_t p_cap;  /* prompt rows per block, or per prompt-only block when n_pre > 0 */
    int32_t n_pre;  /* shared prompt KV over n_pre prompt-only blocks (ring-only caches); 0: none */
    int32_t shared; /* FLEXDIAG_SLOTS_PER_HEAD or FLEXDIAG_SLOTS_PER_SEQ */
} win_case;

/* Windows of 2, 4 and 8; groups of 1, 3 (4-head CTAs), 4, 8 and 12 (two 8-head chunks); d_h 16
 * to 128. On a 132-SM GPU the cases with n_seq·win·h_kv·chunks < 264 CTAs and p_cap + ring + 3
 * >= 128 keys take the split-K path (0, 1, 5, 6, 8); case 2 and 9 run the short-list U = 2
 * kernel; 3, 4, 7 neither. */
static const win_case wcases[] = {
    {2, 4, 8, 2, 64, 300, 100, 0, FLEXDIAG_SLOTS_PER_HEAD},
    {3, 2, 4, 4, 128, 200, 50, 0, FLEXDIAG_SLOTS_PER_SEQ},
    {16, 8, 32, 32, 128, 60, 40, 0, FLEXDIAG_SLOTS_PER_HEAD},
    {40, 4, 16, 2, 64, 120, 50, 0, FLEXDIAG_SLOTS_PER_SEQ},
    {4, 2, 24, 2, 32, 80, 40, 0, FLEXDIAG_SLOTS_PER_HEAD},
    {2, 8, 32, 8, 128, 300, 50, 0, FLEXDIAG_SLOTS_PER_HEAD},
    /* shared prompt KV (head-major CTA order, and sequence-major) */
    {5, 4, 4, 4, 128, 200, 30, 2, FLEXDIAG_SLOTS_PER_SEQ},
    {24, 8, 8, 2, 32, 64, 20, 3, FLEXDIAG_SLOTS_PER_HEAD},
    {3, 2, 12, 4, 16, 90, 40, 2, FLEXDIAG_SLOTS_PER_HEAD},
    {32, 4, 16, 16, 64, 40, 40, 4, FLEXDIAG_SLOTS_PER_HEAD},
};
#define N_WCASES ((int)(sizeof wcases / sizeof wcases[0]))

/* One window case on the host: bf16 for the device, fp32 upcasts for the CPU reference, and the
 * expanded layout (win 1 over n_seq·win sequences, block (q, h) a copy of (q / win, h)). */
typedef struct wproblem {
    win_case c;
    int32_t w, max_slots;         /* qkv row width; list stride */
    int32_t bcap;                 /* prompt rows of a cache block: p_cap, 0 with prefix */
    int64_t rows, cache_n, pre_n; /* query rows n_seq·win; elements of a cache, of the store */
    int64_t n_lists;
    int32_t *lp, *prefix, *hist;  /* (n_seq) prompt rows, prompt block, ring rows before the
                                     window (the window holds ring rows hist..hist + win - 1) */
    int32_t *lpx, *prefixx;       /* (rows) the expanded call's: lp[q / win], prefix[q / win] */
    int32_t *slots, *n_slots;     /* (n_lists, max_slots), (n_lists): lists of the rows */
    uint16_t *kc, *vc, *kx, *vx, *kp, *vp, *qkv;
    float *kc32, *vc32, *kp32, *vp32, *qkv32;
    flexdiag_attn_args a;         /* the window call, host view */
    flexdiag_attn_args va;        /* the expanded call, host view: rows sequences, win 1 */
} wproblem;

/* fp32 K (v = 0) or V row of attended key j of row q, KV head h: prompt rows of sequence
 * q / win (its block's or its prefix block's), then the slots of q's list. */
static const float *win_row(const wproblem *wp, int v, int64_t q, int32_t h, int64_t j) {
    const win_case *c = &wp->c;
    int64_t s = q / c->win, blk = (s * c->h_kv + h) * (wp->bcap + c->ring);
    const float *cache = v ? wp->vc32 : wp->kc32;
    if (j < wp->lp[s] && c->n_pre)
        return (v ? wp->vp32 : wp->kp32) +
               (((int64_t)wp->prefix[s] * c->h_kv + h) * c->p_cap + j) * c->d_h;
    if (j < wp->lp[s]) return cache + (blk + j) * c->d_h;
    int64_t li = flexdiag__slot_list(&wp->va, q, h);
    return cache + (blk + wp->bcap + wp->slots[li * wp->max_slots + j - wp->lp[s]]) * c->d_h;
}

/* key_fn of a wproblem (ctx) over its expanded view (s: the row). */
static const float *win_key(const void *ctx, int64_t s, int32_t h, int64_t j) {
    return win_row(ctx, 0, s, h, j);
}

/* List li (of row q): the history rows of sequence q / win, each kept with probability 3/4, in
 * random order, then the window's ring rows up to q's own (causal inside the window). */
static void win_list(wproblem *wp, int64_t li, tu_rng *r) {
    const win_case *c = &wp->c;
    int64_t q = c->shared == FLEXDIAG_SLOTS_PER_SEQ ? li : li / c->h_kv;
    int32_t t = wp->hist[q / c->win], i = (int32_t)(q % c->win), n = 0;
    int32_t *sl = wp->slots + li * wp->max_slots;
    for (int32_t row = 0; row < t; row++)
        if (tu_rng_int(r, 0, 3) != 0) sl[n++] = row;
    for (int32_t j = n - 1; j > 0; j--) {
        int32_t x = (int32_t)tu_rng_int(r, 0, j), tmp = sl[j];
        sl[j] = sl[x];
        sl[x] = tmp;
    }
    for (int32_t row = t; row <= t + i; row++) sl[n++] = row;
    wp->n_slots[li] = n;
    for (int32_t j = n; j < wp->max_slots; j++) sl[j] = -1;
}

/* n bf16 NaN from x on. */
static void nan_fill(uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = BF16_NAN;
}

/* Rows nobody may read become NaN: ring rows past each sequence's window, prompt rows past lp
 * (in the blocks, or in a prompt-only block past the longest prompt of its sequences). */
static void win_mark_unread(wproblem *wp) {
    const win_case *c = &wp->c;
    int64_t br = wp->bcap + c->ring;
    for (int64_t sh = 0; sh < (int64_t)c->n_seq * c->h_kv; sh++) {
        int64_t s = sh / c->h_kv, end = wp->bcap + wp->hist[s] + c->win;
        uint16_t *kv[2] = {wp->kc + sh * br * c->d_h, wp->vc + sh * br * c->d_h};
        for (int t = 0; t < 2; t++) {
            if (!c->n_pre) nan_fill(kv[t] + wp->lp[s] * c->d_h, (wp->bcap - wp->lp[s]) * c->d_h);
            nan_fill(kv[t] + end * c->d_h, (br - end) * c->d_h);
        }
    }
    for (int64_t bh = 0; bh < (int64_t)c->n_pre * c->h_kv; bh++) {
        int32_t lmax = 0;
        for (int32_t s = 0; s < c->n_seq; s++)
            if (wp->prefix[s] == bh / c->h_kv && wp->lp[s] > lmax) lmax = wp->lp[s];
        int64_t off = (bh * c->p_cap + lmax) * c->d_h, n = (int64_t)(c->p_cap - lmax) * c->d_h;
        nan_fill(wp->kp + off, n);
        nan_fill(wp->vp + off, n);
    }
}

/* The expanded call's caches and metadata: virtual sequence q gets sequence q / win's. */
static void win_expand(wproblem *wp) {
    const win_case *c = &wp->c;
    int64_t per_seq = (int64_t)c->h_kv * (wp->bcap + c->ring) * c->d_h;
    wp->kx = xmalloc((size_t)(wp->rows * per_seq) * 2);
    wp->vx = xmalloc((size_t)(wp->rows * per_seq) * 2);
    for (int64_t q = 0; q < wp->rows; q++) {
        int64_t s = q / c->win;
        wp->lpx[q] = wp->lp[s];
        wp->prefixx[q] = wp->prefix[s];
        memcpy(wp->kx + q * per_seq, wp->kc + s * per_seq, (size_t)per_seq * 2);
        memcpy(wp->vx + q * per_seq, wp->vc + s * per_seq, (size_t)per_seq * 2);
    }
}

/* The window call's host view and the expanded one's. */
static void win_args(wproblem *wp) {
    const win_case *c = &wp->c;
    flexdiag_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_seq = c->n_seq;
    a.h_q = c->h_q;
    a.h_kv = c->h_kv;
    a.d_h = c->d_h;
    a.p_cap = wp->bcap;
    a.ring = c->ring;
    a.scale = 1.0f / sqrtf((float)c->d_h);
    a.lp = wp->lp;
    a.slots = wp->slots;
    a.n_slots = wp->n_slots;
    a.max_slots = wp->max_slots;
    a.shared_slots = c->shared;
    if (c->n_pre) a.prefix = wp->prefix, a.n_pre = c->n_pre, a.pre_cap = c->p_cap;
    a.win = c->win;
    wp->a = a;
    a.n_seq = (int32_t)wp->rows;
    a.win = 1;
    a.lp = wp->lpx;
    if (c->n_pre) a.prefix = wp->prefixx;
    wp->va = a;
}

/* Prompt lengths vary per sequence (full, 1, 7, none, 3 short of full); the window sits at the
 * end of the ring or up to 3 rows before it. */
static void wproblem_init(wproblem *wp, const win_case *c, tu_rng *r) {
    memset(wp, 0, sizeof *wp);
    wp->c = *c;
    wp->w = (c->h_q + 2 * c->h_kv) * c->d_h;
    wp->max_slots = c->ring + 3; /* a stride that is not a list length */
    wp->bcap = c->n_pre ? 0 : c->p_cap;
    wp->rows = (int64_t)c->n_seq * c->win;
    wp->cache_n = (int64_t)c->n_seq * c->h_kv * (wp->bcap + c->ring) * c->d_h;
    wp->pre_n = (int64_t)c->n_pre * c->h_kv * c->p_cap * c->d_h;
    wp->n_lists = lists_of(c->shared, (int32_t)wp->rows, c->h_kv);
    int32_t *meta[5];
    for (int i = 0; i < 5; i++) meta[i] = xmalloc((size_t)(i < 3 ? c->n_seq : wp->rows) * 4);
    wp->lp = meta[0], wp->prefix = meta[1], wp->hist = meta[2], wp->lpx = meta[3];
    wp->prefixx = meta[4];
    const int32_t lps[5] = {c->p_cap, 1, 7, 0, c->p_cap - 3};
    for (int32_t s = 0; s < c->n_seq; s++) {
        int32_t lp = lps[s % 5];
        wp->lp[s] = lp > c->p_cap ? c->p_cap : lp;
        wp->prefix[s] = c->n_pre ? (7 * s + 1) % c->n_pre : 0;
        wp->hist[s] = c->ring - c->win - s % 4;
    }
    wp->slots = xmalloc((size_t)(wp->n_lists * wp->max_slots) * 4);
    wp->n_slots = xmalloc((size_t)wp->n_lists * 4);
    for (int64_t li = 0; li < wp->n_lists; li++) win_list(wp, li, r);
    struct {
        uint16_t **h;
        int64_t n;
        float scale;
    } fill[] = {{&wp->kc, wp->cache_n, 1.0f}, {&wp->vc, wp->cache_n, 1.0f},
                {&wp->kp, wp->pre_n, 1.0f},   {&wp->vp, wp->pre_n, 1.0f},
                {&wp->qkv, wp->rows * wp->w, 1.5f}};
    for (size_t i = 0; i < sizeof fill / sizeof fill[0]; i++) {
        *fill[i].h = xmalloc((size_t)fill[i].n * 2);
        tu_fill_bf16(r, *fill[i].h, fill[i].n, fill[i].scale);
    }
    win_mark_unread(wp);
    win_expand(wp);
    win_args(wp);
    wp->kc32 = tu_bf16_to_f32(wp->kc, wp->cache_n);
    wp->vc32 = tu_bf16_to_f32(wp->vc, wp->cache_n);
    wp->kp32 = tu_bf16_to_f32(wp->kp, wp->pre_n);
    wp->vp32 = tu_bf16_to_f32(wp->vp, wp->pre_n);
    wp->qkv32 = tu_bf16_to_f32(wp->qkv, wp->rows * wp->w);
}

static void wproblem_free(wproblem *wp) {
    void *all[] = {wp->lp,   wp->prefix, wp->hist, wp->lpx,  wp->prefixx, wp->slots,
                   wp->n_slots, wp->kc,  wp->vc,   wp->kx,   wp->vx,      wp->kp,
                   wp->vp,   wp->qkv,    wp->kc32, wp->vc32, wp->kp32,    wp->vp32,
                   wp->qkv32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* fp64 / naive references of the window call, folded into fe. */
static void win_fa(const wproblem *wp, const float *got, fa_err *fe) {
    const win_case *c = &wp->c;
    int g = c->h_q / c->h_kv, d = c->d_h;
    int64_t nmax = c->p_cap + wp->max_slots;
    const float **kr = xmalloc((size_t)nmax * sizeof *kr);
    const float **vr = xmalloc((size_t)nmax * sizeof *vr);
    double *o64 = xmalloc((size_t)d * sizeof *o64);
    float *on = xmalloc((size_t)d * sizeof *on), *zb = xmalloc((size_t)nmax * sizeof *zb);
    for (int64_t q = 0; q < wp->rows; q++)
        for (int32_t hq = 0; hq < c->h_q; hq++) {
            int32_t h = hq / g;
            int64_t n = wp->lpx[q] + wp->n_slots[flexdiag__slot_list(&wp->va, q, h)];
            for (int64_t j = 0; j < n; j++) {
                kr[j] = win_row(wp, 0, q, h, j);
                vr[j] = win_row(wp, 1, q, h, j);
            }
            attend_ref(wp->qkv32 + q * wp->w + (int64_t)hq * d, kr, vr, n, d, wp->a.scale, o64,
                       on, zb);
            fa_add(fe, got + (q * c->h_q + hq) * d, o64, on, d);
        }
    free(kr);
    free(vr);
    free(o64);
    free(on);
    free(zb);
}

/* The device copies of a window case's data: the window call's caches, the expanded call's,
 * the prompt store, the queries, both calls' lp and prefix, the lists. */
enum { W_K, W_V, W_KX, W_VX, W_KP, W_VP, W_QKV, W_LP, W_LPX, W_PRE, W_PREX, W_SL, W_NS, W_BUFS };
typedef struct wdev {
    dbuf b[W_BUFS];
} wdev;

static void wdev_init(wdev *d, const wproblem *wp, tu_rng *r) {
    const win_case *c = &wp->c;
    int64_t nx = wp->rows * c->h_kv * (wp->bcap + c->ring) * c->d_h;
    const struct {
        const void *h;
        int64_t n;
        size_t esz;
    } up[W_BUFS] = {
        [W_K] = {wp->kc, wp->cache_n, 2},      [W_V] = {wp->vc, wp->cache_n, 2},
        [W_KX] = {wp->kx, nx, 2},              [W_VX] = {wp->vx, nx, 2},
        [W_KP] = {wp->kp, wp->pre_n, 2},       [W_VP] = {wp->vp, wp->pre_n, 2},
        [W_QKV] = {wp->qkv, wp->rows * wp->w, 2},
        [W_LP] = {wp->lp, c->n_seq, 4},        [W_LPX] = {wp->lpx, wp->rows, 4},
        [W_PRE] = {wp->prefix, c->n_seq, 4},   [W_PREX] = {wp->prefixx, wp->rows, 4},
        [W_SL] = {wp->slots, wp->n_lists * wp->max_slots, 4},
        [W_NS] = {wp->n_slots, wp->n_lists, 4},
    };
    for (int i = 0; i < W_BUFS; i++) {
        d->b[i] = dbuf_new(up[i].n, up[i].esz, r);
        dbuf_up(&d->b[i], up[i].h);
    }
}

static void wdev_free(wdev *d, const char *label) {
    for (int i = 0; i < W_BUFS; i++) {
        dbuf_check_guards(&d->b[i], label);
        dbuf_free(&d->b[i]);
    }
}

/* The device view of the window call (expanded 0) or the expanded call (1). */
static flexdiag_attn_args win_dev_args(const wproblem *wp, const wdev *d, int expanded) {
    flexdiag_attn_args ga = expanded ? wp->va : wp->a;
    ga.lp = d->b[expanded ? W_LPX : W_LP].p;
    ga.slots = d->b[W_SL].p;
    ga.n_slots = d->b[W_NS].p;
    if (wp->c.n_pre) {
        ga.prefix = d->b[expanded ? W_PREX : W_PRE].p;
        ga.k_pre = d->b[W_KP].p;
        ga.v_pre = d->b[W_VP].p;
    }
    return ga;
}

/* What one decode call gives back (host); NULL for outputs it was not asked for. */
typedef struct wresult {
    uint16_t *out;
    float *lg, *lse, *pr;
} wresult;

static void wresult_free(wresult *r) {
    free(r->out);
    free(r->lg);
    free(r->lse);
    free(r->pr);
}

/* One CUDA decode of ga (device metadata; expanded: over the copied caches) into poisoned,
 * guarded outputs: with_lg adds logits_out and lse_out, with_pr probs_out. */
static wresult win_decode(const wproblem *wp, const wdev *d, flexdiag_attn_args ga, int expanded,
                          int with_lg, int with_pr, tu_rng *r) {
    int64_t nq = wp->rows * wp->c.h_q, n_out = nq * wp->c.d_h, n_lg = nq * wp->max_slots;
    dbuf dout = dbuf_new(n_out, 2, r), dlg = dbuf_new(n_lg, 4, r), dlse = dbuf_new(nq, 4, r);
    dbuf dpr = dbuf_new(n_lg, 4, r);
    dbuf *all[4] = {&dout, &dlg, &dlse, &dpr};
    for (int i = 0; i < 4; i++) dbuf_poison(all[i]);
    ga.logits_out = with_lg ? dlg.p : NULL;
    ga.lse_out = with_lg ? dlse.p : NULL;
    ga.probs_out = with_pr ? dpr.p : NULL;
    const dbuf *k = &d->b[expanded ? W_KX : W_K], *v = &d->b[expanded ? W_VX : W_V];
    ck(gk->attn_decode(dout.p, d->b[W_QKV].p, k->p, v->p, &ga, gs), "cuda attn_decode (win)");
    wresult res = {xmalloc((size_t)n_out * 2), NULL, NULL, NULL};
    dbuf_down(&dout, res.out);
    if (with_lg) {
        res.lg = xmalloc((size_t)n_lg * 4), res.lse = xmalloc((size_t)nq * 4);
        dbuf_down(&dlg, res.lg);
        dbuf_down(&dlse, res.lse);
    }
    if (with_pr) {
        res.pr = xmalloc((size_t)n_lg * 4);
        dbuf_down(&dpr, res.pr);
    }
    for (int i = 0; i < 4; i++) dbuf_check_guards(all[i], "win decode");
    for (int i = 0; i < 4; i++) dbuf_free(all[i]);
    return res;
}

/* Two calls' outputs bit for bit (those both were asked for; the probabilities of b against
 * those of p, the call that had them). */
static void win_same(const wproblem *wp, const wresult *a, const wresult *b, const wresult *p,
                     const char *what) {
    int64_t nq = wp->rows * wp->c.h_q;
    size_t n_out = (size_t)nq * (size_t)wp->c.d_h * 2, n_lg = (size_t)nq * wp->max_slots * 4;
    if (memcmp(a->out, b->out, n_out) || memcmp(a->lg, b->lg, n_lg) ||
        memcmp(a->lse, b->lse, (size_t)nq * 4) || memcmp(p->pr, b->pr, n_lg))
        fail_msg("%s: outputs differ bit for bit", what);
}

/* One window case: the window call with logits_out and lse_out against the CPU reference's
 * window call (outputs within the bf16 tolerances and the flash-attention rule, logits and lse
 * within check_logits' bound over the expanded view: row q attends sequence q / win's prompt
 * rows and its own list); again with probs_out only (probabilities against the first call's
 * logits and lse, output bit-identical); the expanded call (win 1 over n_seq·win sequences whose
 * blocks are copies) bit-identical to both; with shared prompt KV the sequence-major CTA order
 * bit-identical to the default head-major one. */
static void test_win(void **state) {
    const win_case *c = *state;
    int idx = (int)(c - wcases);
    char label[160];
    snprintf(label, sizeof label, "win case %d (n_seq %d, win %d, h_q %d, h_kv %d, d_h %d, ring "
             "%d, prefix blocks %d, lists %s)", idx, c->n_seq, c->win, c->h_q, c->h_kv, c->d_h,
             c->ring, c->n_pre,
             c->shared == FLEXDIAG_SLOTS_PER_SEQ ? "per row" : "per (row, KV head)");
    tu_rng r;
    tu_rng_seed(&r, 9000 + (uint64_t)idx);
    wproblem wp;
    wproblem_init(&wp, c, &r);
    wdev d;
    wdev_init(&d, &wp, &r);
    int64_t nq = wp.rows * c->h_q, n_out = nq * c->d_h, n_lg = nq * wp.max_slots;
    float *ref = xmalloc((size_t)n_out * 4), *ref_lg = xmalloc((size_t)n_lg * 4);
    float *ref_lse = xmalloc((size_t)nq * 4);
    flexdiag_attn_args ra = wp.a;
    ra.k_pre = wp.kp32;
    ra.v_pre = wp.vp32;
    ra.logits_out = ref_lg;
    ra.lse_out = ref_lse;
    ck(rk->attn_decode(ref, wp.qkv32, wp.kc32, wp.vc32, &ra, rs), "ref attn_decode (win)");

    flexdiag_attn_args ga = win_dev_args(&wp, &d, 0), gx = win_dev_args(&wp, &d, 1);
    wresult plain = win_decode(&wp, &d, ga, 0, 1, 0, &r);
    wresult pol = win_decode(&wp, &d, ga, 0, 0, 1, &r);
    wresult ex = win_decode(&wp, &d, gx, 1, 1, 1, &r);
    float *got = tu_bf16_to_f32(plain.out, n_out);
    assert_true(tu_allclose(label, got, ref, n_out, OUT_ATOL, OUT_RTOL, OUT_NMSE));
    fa_err fe = {0, 0};
    win_fa(&wp, got, &fe);
    fa_check(&fe, label);
    assert_true(check_logits(&wp.va, wp.qkv32, win_key, &wp, plain.lg, ref_lg, plain.lse,
                             ref_lse));
    assert_true(check_probs(&wp.va, pol.pr, plain.lg, plain.lse));
    assert_memory_equal(pol.out, plain.out, (size_t)n_out * 2);
    win_same(&wp, &plain, &ex, &pol, "the expanded call against the window call");
    if (c->n_pre) {
        setenv("FLEXDIAG_DEC_HEAD_MAJOR", "0", 1);
        wresult sm = win_decode(&wp, &d, ga, 0, 1, 1, &r);
        unsetenv("FLEXDIAG_DEC_HEAD_MAJOR");
        win_same(&wp, &plain, &sm, &pol, "sequence-major against head-major");
        wresult_free(&sm);
    }
    wresult_free(&plain);
    wresult_free(&pol);
    wresult_free(&ex);
    wdev_free(&d, label);
    free(got);
    free(ref);
    free(ref_lg);
    free(ref_lse);
    wproblem_free(&wp);
}

/* ---- argument checks ---- */

/* st is the expected status and the message names the op. */
static void expect_err(flexdiag_status got, flexdiag_status want, const char *op) {
    const char *msg = flexdiag_last_error(NULL);
    if (got != want || !strstr(msg, op))
        fprintf(stderr, "%s: status %d (want %d), message \"%s\"\n", op, got, want, msg);
    assert_int_equal(got, want);
    assert_non_null(strstr(msg, op));
    flexdiag__err_clear();
}

static void test_bad_args(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 7);
    dbuf buf = dbuf_new(1 << 16, 2, &r), ints = dbuf_new(64, 4, &r);
    int32_t zeros[64] = {0};
    dbuf_up(&ints, zeros);
    void *p = buf.p;
    flexdiag_attn_args ok = {2, 4, 2, 16, 4, 4, 0.25f, ints.p, ints.p, ints.p, 4, NULL, NULL, 0,
                             NULL, 0.0f, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0, NULL,
                             NULL, 0, 0};
    flexdiag_attn_args a = ok;
    flexdiag__err_clear();

    a.d_h = 80;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_UNSUPPORTED, "attn_decode");
    expect_err(gk->attn_prefill(p, p, p, p, &a, gs), FLEXDIAG_ERR_UNSUPPORTED, "attn_prefill");
    a.d_h = 12;
    expect_err(gk->kv_append(p, p, p, ints.p, 2, 1, &a, gs), FLEXDIAG_ERR_UNSUPPORTED, "kv_append");
    a = ok;
    a.h_q = 5;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    a = ok;
    expect_err(gk->attn_decode(p, (uint16_t *)p + 1, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG,
               "attn_decode");
    expect_err(gk->kv_append(p, p, p, ints.p, 3, 1, &a, gs), FLEXDIAG_ERR_INVALID_ARG,
               "kv_append");
    a.slots = NULL;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    a = ok;
    a.pos = ints.p; /* RoPE needs theta > 0: 0 and NaN are refused before any launch */
    const float bad_theta[2] = {0.0f, NAN};
    for (int i = 0; i < 2; i++) {
        a.rope_theta = bad_theta[i];
        flexdiag_status st = gk->kv_append(p, p, p, ints.p, 2, 1, &a, gs);
        assert_non_null(strstr(flexdiag_last_error(NULL), "rope_theta"));
        expect_err(st, FLEXDIAG_ERR_INVALID_ARG, "kv_append");
    }
    a = ok;
    a.d_h = 8; /* a valid copy width, but RoPE on CUDA needs 8 pairs per 16-byte vector */
    a.pos = ints.p;
    a.rope_theta = 1e4f;
    expect_err(gk->kv_append(p, p, p, ints.p, 2, 1, &a, gs), FLEXDIAG_ERR_UNSUPPORTED, "kv_append");
    a = ok;
    a.scale = NAN;
    expect_err(gk->attn_prefill(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_prefill");
    a = ok;
    a.lp = NULL;
    expect_err(gk->attn_prefill(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_prefill");
    expect_err(gk->attn_decode(p, p, p, p, NULL, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    /* the fused Diagonal update: per-(sequence, KV head) lists, diag_a >= 1, diag_next, and
     * at most diag_max_group query heads per KV head (one CTA must see the whole group) */
    a = ok;
    a.diag_lag = p;
    a.diag_a = 4;
    a.diag_next = ints.p;
    a.shared_slots = FLEXDIAG_SLOTS_ONE;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    a.shared_slots = FLEXDIAG_SLOTS_PER_SEQ;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    a.shared_slots = FLEXDIAG_SLOTS_PER_HEAD;
    a.diag_a = 0;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    a.diag_a = 4;
    a.diag_next = NULL;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    a.diag_next = ints.p;
    a.h_kv = 1;
    a.h_q = gk->diag_max_group + 1;
    expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_UNSUPPORTED, "attn_decode");
    /* win (kernels.h): negative, or a window pass with the fused Diagonal update or a cascade
     * plan, is refused with a message naming win */
    struct {
        int32_t win;
        int diag, casc;
    } bad_win[3] = {{-1, 0, 0}, {2, 1, 0}, {4, 0, 1}};
    for (int i = 0; i < 3; i++) {
        a = ok;
        a.win = bad_win[i].win;
        if (bad_win[i].diag) a.diag_lag = p, a.diag_a = 4, a.diag_next = ints.p;
        if (bad_win[i].casc) a.n_casc_tiles = 1;
        flexdiag_status st = gk->attn_decode(p, p, p, p, &a, gs);
        assert_non_null(strstr(flexdiag_last_error(NULL), "win = "));
        expect_err(st, FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    }
    /* a sharing mode that is none of FLEXDIAG_SLOTS_* */
    const int32_t bad_modes[2] = {-1, 3};
    for (int i = 0; i < 2; i++) {
        a = ok;
        a.shared_slots = bad_modes[i];
        expect_err(gk->attn_decode(p, p, p, p, &a, gs), FLEXDIAG_ERR_INVALID_ARG, "attn_decode");
    }

    /* empty calls are fine and touch nothing */
    a = ok;
    a.n_seq = 0;
    ck(gk->attn_decode(p, p, p, p, &a, gs), "attn_decode n_seq 0");
    ck(gk->attn_prefill(p, p, p, p, &a, gs), "attn_prefill n_seq 0");
    ck(gk->kv_append(p, p, p, ints.p, 0, 1, &a, gs), "kv_append n_tok 0");
    ck(gk->stream_sync(gs), "stream_sync");
    dbuf_check_guards(&buf, "bad args");
    dbuf_free(&buf);
    dbuf_free(&ints);
}

/* Tests of the case tables, in order: shapes, prefix cases, window cases. */
#define N_TABLE (N_CASES + N_PCASES + N_WCASES)

/* Test i of the tables, named into name (n bytes). */
static struct CMUnitTest table_test(int i, char *name, size_t n) {
    struct CMUnitTest t = {name, test_case, NULL, NULL, (void *)&cases[i < N_CASES ? i : 0]};
    if (i < N_CASES) {
        snprintf(name, n, "attn_case_%02d", i);
    } else if (i < N_CASES + N_PCASES) {
        snprintf(name, n, "prefix_case_%02d", i - N_CASES);
        t.test_func = test_prefix;
        t.initial_state = (void *)&pcases[i - N_CASES];
    } else {
        snprintf(name, n, "win_case_%02d", i - N_CASES - N_PCASES);
        t.test_func = test_win;
        t.initial_state = (void *)&wcases[i - N_CASES - N_PCASES];
    }
    return t;
}

/* i appears in the comma-separated list. */
static int case_listed(const char *list, int i) {
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return 0;
        if (v == i) return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

int main(void) {
    if (!flexdiag__have_cuda()) {
        fprintf(stderr, "test_attn_cuda: built without CUDA: skipped\n");
        return 77;
    }
    gk = flexdiag__kernels_cuda();
    rk = flexdiag__kernels_cpu_ref();
    if (!gk || gk->stream_create(0, 0, &gs) != FLEXDIAG_OK) {
        fprintf(stderr, "test_attn_cuda: no usable CUDA device (%s): skipped\n",
                flexdiag_last_error(NULL));
        return 77;
    }
    if (rk->stream_create(-1, 1, &rs) != FLEXDIAG_OK) {
        fprintf(stderr, "test_attn_cuda: cpu stream: %s\n", flexdiag_last_error(NULL));
        return 1;
    }
    /* FLEXDIAG_ATTN_CASES="2,5" runs only those rows of the shape table (debugging); the
     * prefix cases are numbered after it (N_CASES + i), the window cases after those */
    const char *only = getenv("FLEXDIAG_ATTN_CASES");
    struct CMUnitTest tests[N_TABLE + 1];
    static char names[N_TABLE][48];
    size_t n = 0;
    for (int i = 0; i < N_TABLE; i++)
        if (!only || case_listed(only, i)) tests[n++] = table_test(i, names[i], sizeof names[i]);
    struct CMUnitTest tb = cmocka_unit_test(test_bad_args);
    tests[n++] = tb;
    int rc = _cmocka_run_group_tests("attn_cuda", tests, n, NULL, NULL);
    gk->stream_destroy(gs);
    rk->stream_destroy(rs);
    return rc;
}
