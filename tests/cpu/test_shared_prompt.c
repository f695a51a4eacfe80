/*
 * test_shared_prompt.c - attn_decode with shared prompt KV (kernels.h flexdiag_attn_args
 * prefix: prompt rows read from one prompt-only block per distinct prompt, ring-only blocks
 * per sequence) must equal the per-sequence layout holding copies of the same prompt rows:
 * bit-identical on the CPU reference and fast tables (the same keys in the same order, only
 * their addresses differ). Sequences of one prefix with
 * different prompt lengths, an empty prompt, an empty slot list, per-(sequence, head) lists;
 * outputs, ring logits, lse and the probability epilogue compared, bit for bit also on CUDA.
 * CUDA numbers its CTAs head-major with shared prompt KV; with FLEXDIAG_DEC_HEAD_MAJOR=0
 * (sequence-major) the bits must not change.
 * With FLEXDIAG_CASCADE=1 CUDA attends prompts shared by two sequences or more as a cascade (a
 * different summation order): compared within tolerances, on the small case and on
 * Janus-Pro-7B-like shapes. Bad prefix arguments are
 * refused.
 */
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

/* One case's shape: ns sequences, npre prompt blocks, heads, head size, prompt capacity,
 * ring, slot list stride. */
typedef struct shape {
    int ns, npre, hq, hkv, dh, pcap, ring, ms;
} shape;

/* The small case (every table): sequence 4 has a shorter prompt of prefix 0, sequence 3 an
 * empty one; two of its sequences share a prefix, so CUDA runs it as a cascade. */
static const shape small = {5, 2, 4, 2, 16, 6, 9, 7};
static const int32_t small_prefix[5] = {0, 1, 0, 1, 0}, small_lp[5] = {6, 4, 6, 0, 3};

typedef struct host_case {
    shape sh;
    int w, blk, pre, rb; /* qkv row, per-sequence block, prompt block, ring block (floats) */
    int32_t *prefix, *lp;
    float *q, *kpre, *vpre;   /* shared prompt rows */
    float *kring, *vring;     /* ring-only blocks */
    float *kfull, *vfull;     /* per-sequence prompt copies */
    int32_t *slots, *n_slots;
} host_case;

static void *zalloc(size_t n) {
    void *p = calloc(1, n);
    assert_non_null(p);
    return p;
}

/* prefix / lp: given (the small case) or generated: prompts interleaved over the sequences,
 * every fifth sequence of prompt 0 three rows shorter, sequence 1 without prompt rows. */
static void make_case(host_case *c, shape sh, const int32_t *prefix, const int32_t *lp) {
    c->sh = sh;
    c->w = (sh.hq + 2 * sh.hkv) * sh.dh, c->pre = sh.pcap * sh.dh, c->rb = sh.ring * sh.dh;
    c->blk = c->pre + c->rb;
    size_t nb = (size_t)sh.ns * sh.hkv, np = (size_t)sh.npre * sh.hkv;
    c->prefix = zalloc(sizeof(int32_t) * sh.ns);
    c->lp = zalloc(sizeof(int32_t) * sh.ns);
    c->q = zalloc(sizeof(float) * sh.ns * c->w);
    c->kpre = zalloc(sizeof(float) * np * c->pre), c->vpre = zalloc(sizeof(float) * np * c->pre);
    c->kring = zalloc(sizeof(float) * nb * c->rb), c->vring = zalloc(sizeof(float) * nb * c->rb);
    c->kfull = zalloc(sizeof(float) * nb * c->blk), c->vfull = zalloc(sizeof(float) * nb * c->blk);
    c->slots = zalloc(sizeof(int32_t) * nb * sh.ms), c->n_slots = zalloc(sizeof(int32_t) * nb);
    for (int s = 0; s < sh.ns; s++) {
        c->prefix[s] = prefix ? prefix[s] : (s * 7) % sh.npre;
        c->lp[s] = lp ? lp[s] : s == 1 ? 0 : sh.pcap - (c->prefix[s] == 0 && s % 5 == 0 ? 3 : 0);
    }
    tu_rng r;
    tu_rng_seed(&r, 11);
    tu_fill_f32(&r, c->q, (int64_t)sh.ns * c->w, 1.0f);
    tu_fill_f32(&r, c->kpre, (int64_t)np * c->pre, 1.0f);
    tu_fill_f32(&r, c->vpre, (int64_t)np * c->pre, 1.0f);
    tu_fill_f32(&r, c->kring, (int64_t)nb * c->rb, 1.0f);
    tu_fill_f32(&r, c->vring, (int64_t)nb * c->rb, 1.0f);
    for (int s = 0; s < sh.ns; s++)
        for (int h = 0; h < sh.hkv; h++) {
            size_t b = (size_t)s * sh.hkv + h, pb = (size_t)c->prefix[s] * sh.hkv + h;
            memcpy(c->kfull + b * c->blk, c->kpre + pb * c->pre, sizeof(float) * c->pre);
            memcpy(c->vfull + b * c->blk, c->vpre + pb * c->pre, sizeof(float) * c->pre);
            memcpy(c->kfull + b * c->blk + c->pre, c->kring + b * c->rb, sizeof(float) * c->rb);
            memcpy(c->vfull + b * c->blk + c->pre, c->vring + b * c->rb, sizeof(float) * c->rb);
            c->n_slots[b] = b == 3 ? 0 : (int32_t)tu_rng_int(&r, 1, sh.ms);
            for (int j = 0; j < sh.ms; j++) /* distinct ring rows: ms <= ring */
                c->slots[b * sh.ms + j] = (int32_t)((j * 7 + b) % sh.ring); /* 7: prime to rings */
        }
}

static void free_case(host_case *c) {
    void *all[] = {c->prefix, c->lp, c->q, c->kpre, c->vpre, c->kring, c->vring,
                   c->kfull, c->vfull, c->slots, c->n_slots};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Backend copy of n bytes of host data (a float array as act values when act is set). */
static void *put(const flexdiag_kernels *k, flexdiag_stream *s, const void *h, size_t n, int act) {
    void *d = NULL, *a = NULL;
    assert_int_equal(k->mem_alloc(n, &d), FLEXDIAG_OK);
    assert_int_equal(k->copy_h2d(d, h, n, s), FLEXDIAG_OK);
    if (!act) return d;
    int64_t e = (int64_t)(n / 4);
    assert_int_equal(k->mem_alloc((size_t)e * (size_t)k->act_bytes, &a), FLEXDIAG_OK);
    assert_int_equal(k->act_from_f32(a, d, e, s), FLEXDIAG_OK);
    assert_int_equal(k->stream_sync(s), FLEXDIAG_OK);
    k->mem_free(d);
    return a;
}

/* Result sizes (floats): out, ring logits, lse, probabilities (the same count as logits). */
static size_t n_out(const shape *h) { return (size_t)h->ns * h->hq * h->dh; }
static size_t n_lg(const shape *h) { return (size_t)h->ns * h->hq * h->ms; }
static size_t n_lse(const shape *h) { return (size_t)h->ns * h->hq; }

/* attn_decode shared (1) or per-sequence (0); returns out | logits | lse | probs (host fp32). */
static float *run(const flexdiag_kernels *k, const host_case *c, int shared) {
    const shape *h = &c->sh;
    size_t nb = (size_t)h->ns * h->hkv, np = (size_t)h->npre * h->hkv;
    size_t NO = n_out(h), NL = n_lg(h), NE = n_lse(h);
    flexdiag_stream *s = NULL;
    assert_int_equal(k->stream_create(k->act_bytes == 2 ? 0 : -1, 2, &s), FLEXDIAG_OK);
    void *q = put(k, s, c->q, sizeof(float) * h->ns * c->w, 1);
    void *kk = shared ? put(k, s, c->kring, sizeof(float) * nb * c->rb, 1)
                      : put(k, s, c->kfull, sizeof(float) * nb * c->blk, 1);
    void *vv = shared ? put(k, s, c->vring, sizeof(float) * nb * c->rb, 1)
                      : put(k, s, c->vfull, sizeof(float) * nb * c->blk, 1);
    void *kp = put(k, s, c->kpre, sizeof(float) * np * c->pre, 1);
    void *vp = put(k, s, c->vpre, sizeof(float) * np * c->pre, 1);
    void *dlp = put(k, s, c->lp, sizeof(int32_t) * h->ns, 0);
    void *dpre = put(k, s, c->prefix, sizeof(int32_t) * h->ns, 0);
    void *dsl = put(k, s, c->slots, sizeof(int32_t) * nb * h->ms, 0);
    void *dns = put(k, s, c->n_slots, sizeof(int32_t) * nb, 0);
    void *out = NULL, *lg = NULL, *lse = NULL, *pr = NULL, *of = NULL;
    assert_int_equal(k->mem_alloc(NO * (size_t)k->act_bytes, &out), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(NL * 4, &lg), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(NE * 4, &lse), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(NL * 4, &pr), FLEXDIAG_OK);
    assert_int_equal(k->memset0(lg, NL * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->memset0(pr, NL * 4, s), FLEXDIAG_OK);
    flexdiag_attn_args a = {.n_seq = h->ns, .h_q = h->hq, .h_kv = h->hkv, .d_h = h->dh,
                            .p_cap = shared ? 0 : h->pcap, .ring = h->ring, .scale = 0.25f,
                            .lp = dlp, .slots = dsl, .n_slots = dns, .max_slots = h->ms,
                            .logits_out = lg, .lse_out = lse, .probs_out = pr};
    /* the cascade plan, as the runtime makes it */
    int32_t g = h->hq / h->hkv, nt = flexdiag__cascade_tiles(h->ns, h->npre, g);
    int32_t *cseq = malloc(sizeof(int32_t) * h->ns), *ctile = calloc((size_t)nt * 3 + 3, 4);
    flexdiag__cascade_plan(c->prefix, h->ns, h->npre, g, cseq, ctile);
    void *dcs = put(k, s, cseq, sizeof(int32_t) * h->ns, 0);
    void *dct = put(k, s, ctile, sizeof(int32_t) * ((size_t)nt * 3 + 3), 0);
    free(cseq);
    free(ctile);
    if (shared)
        a.prefix = dpre, a.k_pre = kp, a.v_pre = vp, a.n_pre = h->npre, a.pre_cap = h->pcap,
        a.casc_seq = dcs, a.casc_tile = dct, a.n_casc_tiles = nt;
    assert_int_equal(k->attn_decode(out, q, kk, vv, &a, s), FLEXDIAG_OK);
    float *res = malloc((NO + 2 * NL + NE) * 4);
    assert_int_equal(k->mem_alloc(NO * 4, &of), FLEXDIAG_OK);
    assert_int_equal(k->act_to_f32(of, out, (int64_t)NO, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res, of, NO * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + NO, lg, NL * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + NO + NL, lse, NE * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + NO + NL + NE, pr, NL * 4, s), FLEXDIAG_OK);
    void *all[] = {q, kk, vv, kp, vp, dlp, dpre, dsl, dns, dcs, dct, out, lg, lse, pr, of};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) k->mem_free(all[i]);
    k->stream_destroy(s);
    return res;
}

/* CUDA attends shared prompts as a cascade (the prompt part once per group, merged by
 * log-sum-exp), a different summation order: output within the decode test's bf16 tolerance,
 * lse and probabilities within fp32 reassociation, the ring logits (computed as before) equal. */
#define CASCADE_OUT_ATOL 1e-3
#define CASCADE_OUT_RTOL 1.6e-2
#define CASCADE_OUT_NMSE 1e-4
#define CASCADE_LSE_ATOL 1e-4
#define CASCADE_PROB_ATOL 1e-5

static void compare(const flexdiag_kernels *k, const shape *h, const float *a, const float *b) {
    size_t NO = n_out(h), NL = n_lg(h), NE = n_lse(h);
    const char *casc = getenv("FLEXDIAG_CASCADE");
    if (strcmp(k->name, "cuda") != 0 || !casc || strcmp(casc, "1") != 0) {
        /* the same keys in the same order: bit for bit */
        assert_memory_equal(a, b, (NO + 2 * NL + NE) * 4);
        return;
    }
    assert_true(tu_allclose("cascade out", b, a, (int64_t)NO, CASCADE_OUT_ATOL, CASCADE_OUT_RTOL,
                            CASCADE_OUT_NMSE));
    assert_memory_equal(a + NO, b + NO, NL * 4);
    assert_true(tu_allclose("cascade lse", b + NO + NL, a + NO + NL, (int64_t)NE,
                            CASCADE_LSE_ATOL, 1e-5, 1e-8));
    assert_true(tu_allclose("cascade probs", b + NO + NL + NE, a + NO + NL + NE, (int64_t)NL,
                            CASCADE_PROB_ATOL, 1e-4, 1e-8));
}

static void check_shape(const flexdiag_kernels *k, shape sh, const int32_t *prefix,
                        const int32_t *lp) {
    host_case c;
    make_case(&c, sh, prefix, lp);
    float *a = run(k, &c, 0), *b = run(k, &c, 1);
    compare(k, &sh, a, b);
    free(a);
    free(b);
    free_case(&c);
}

static void check(const flexdiag_kernels *k) { check_shape(k, small, small_prefix, small_lp); }

static void test_cpu_ref(void **state) {
    (void)state;
    tu_on_table(0, check);
}

static void test_cpu_fast(void **state) {
    (void)state;
    tu_on_table(1, check);
}

/* CUDA: the plain path (bit for bit, as on the CPU) and the cascade (FLEXDIAG_CASCADE=1). */
static void test_cuda(void **state) {
    (void)state;
    tu_on_table(2, check);
    setenv("FLEXDIAG_CASCADE", "1", 1);
    tu_on_table(2, check);
    unsetenv("FLEXDIAG_CASCADE");
}

/* Janus-Pro-7B-like shapes on CUDA: d_h 128, prompts of up to 50 rows (two shared-memory key
 * chunks), 160 sequences over 3 prompts (no split-K; 4, 2 or 1 query heads per KV head), 12
 * sequences over 2 prompts with a 300-slot list (split-K: the prompt partial joins the splits'
 * merge), and 160 sequences over 100 prompts (no cascade: fewer than two sequences each). */
static void check_large(const flexdiag_kernels *k) {
    check_shape(k, (shape){160, 3, 8, 2, 128, 50, 64, 29}, NULL, NULL);
    check_shape(k, (shape){160, 3, 8, 4, 128, 50, 64, 29}, NULL, NULL);
    check_shape(k, (shape){160, 3, 8, 8, 128, 50, 64, 29}, NULL, NULL);
    check_shape(k, (shape){12, 2, 4, 4, 128, 50, 320, 300}, NULL, NULL);
    check_shape(k, (shape){160, 100, 4, 4, 64, 40, 64, 29}, NULL, NULL);
}

/* Sequence-major CTA order (FLEXDIAG_DEC_HEAD_MAJOR=0; head-major is the default): every CTA
 * computes what it did before, so the shared layout still gives the bits of the per-sequence
 * copies, at every shape. */
static void test_cuda_seq_major(void **state) {
    (void)state;
    setenv("FLEXDIAG_DEC_HEAD_MAJOR", "0", 1);
    tu_on_table(2, check);
    tu_on_table(2, check_large);
    unsetenv("FLEXDIAG_DEC_HEAD_MAJOR");
}

static void test_cuda_cascade(void **state) {
    (void)state;
    setenv("FLEXDIAG_CASCADE", "1", 1);
    tu_on_table(2, check_large);
    unsetenv("FLEXDIAG_CASCADE");
}

/* The plan: every sequence once, grouped by prefix in index order; tiles of at most
 * FLEXDIAG_CASCADE_ROWS / g sequences of one prefix each, then padding; the capacity bounds any
 * grouping; no plan for groups wider than a tile. */
static void test_cascade_plan(void **state) {
    (void)state;
    const int32_t prefix[] = {2, 0, 2, 2, 0, 1, 2, 2, 2, 9}; /* 9: clamped to 2 */
    enum { N = 10, NP = 3, G = 4 };                           /* 4 sequences per tile */
    int32_t nt = flexdiag__cascade_tiles(N, NP, G), seq[N], tile[3 * 8];
    assert_int_equal(nt, 3 + 3);
    flexdiag__cascade_plan(prefix, N, NP, G, seq, tile);
    const int32_t want_seq[N] = {1, 4, 5, 0, 2, 3, 6, 7, 8, 9};
    const int32_t want_tile[3 * 6] = {0, 0, 2, 1, 2, 1, 2, 3, 4, 2, 7, 3, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(seq, want_seq, sizeof want_seq);
    assert_memory_equal(tile, want_tile, sizeof want_tile);
    assert_int_equal(flexdiag__cascade_tiles(N, NP, FLEXDIAG_CASCADE_ROWS + 1), 0);
    assert_int_equal(flexdiag__cascade_tiles(64, 70, 1), 4 + 64); /* groups <= sequences */
}

/* A prefix index outside [0, n_pre), prompt rows left in the ring-only blocks (p_cap != 0) or
 * no prompt store: INVALID_ARG naming the field, on both CPU tables. */
static void test_refusals(void **state) {
    (void)state;
    const flexdiag_kernels *tabs[] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    enum { HQ = 4, HKV = 2, DH = 16, PCAP = 6, RING = 9 };
    float q[(HQ + 2 * HKV) * DH] = {0}, kv[RING * DH] = {0}, pre[PCAP * DH] = {0}, out[HQ * DH];
    int32_t one_lp = 2, sl = 0, ns = 1, bad = 1, good = 0;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tabs[t];
        flexdiag_attn_args a = {.n_seq = 1, .h_q = HQ / HKV, .h_kv = 1, .d_h = DH, .ring = RING,
                                .scale = 0.25f, .lp = &one_lp, .slots = &sl, .n_slots = &ns,
                                .max_slots = 1, .shared_slots = 1, .prefix = &bad,
                                .k_pre = pre, .v_pre = pre, .n_pre = 1, .pre_cap = PCAP};
        assert_int_equal(k->attn_decode(out, q, kv, kv, &a, NULL), FLEXDIAG_ERR_INVALID_ARG);
        assert_non_null(strstr(flexdiag__err_msg(), "prefix[0] = 1"));
        flexdiag__err_clear();
        a.prefix = &good;
        a.p_cap = 2;
        assert_int_equal(k->attn_decode(out, q, kv, kv, &a, NULL), FLEXDIAG_ERR_INVALID_ARG);
        assert_non_null(strstr(flexdiag__err_msg(), "p_cap = 2"));
        flexdiag__err_clear();
        a.p_cap = 0;
        a.v_pre = NULL;
        assert_int_equal(k->attn_decode(out, q, kv, kv, &a, NULL), FLEXDIAG_ERR_INVALID_ARG);
        assert_non_null(strstr(flexdiag__err_msg(), "v_pre NULL"));
        flexdiag__err_clear();
        a.v_pre = pre;
        assert_int_equal(k->attn_decode(out, q, kv, kv, &a, NULL), FLEXDIAG_OK);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_ref),
        cmocka_unit_test(test_cpu_fast),
        cmocka_unit_test(test_cuda),
        cmocka_unit_test(test_cuda_seq_major),
        cmocka_unit_test(test_cuda_cascade),
        cmocka_unit_test(test_cascade_plan),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
