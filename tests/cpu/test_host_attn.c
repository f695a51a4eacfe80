/*
 * test_host_attn.c - decode attention on the host (kernels.h flexdiag__host_attn_decode, the
 * CPU attention of host-homed micro-batches) against the "cpu-ref" oracle.
 *
 * bf16 (the CUDA engine's activations): the oracle runs kv_append (RoPE) and attn_decode in fp32
 * on the bf16 values widened, with the rotated queries and the new cache rows rounded to bf16
 * as the CUDA kv_append stores them; the host kernel's rotated queries and cache rows must equal
 * those bit for bit, its output must be within bf16 output rounding (ATOL + RTOL·|ref|) and
 * identical for every thread count, also when the RoPE angles come from the caller's scratch
 * (cs_ready: computed by the first run; zero angles given so rotate the queries to zero). One
 * slot list per sequence (shared_slots 2) equals each sequence's list copied to its KV heads,
 * bit for bit. fp32 (the CPU backends): exactly the "cpu" table's kv_append + attn_decode. Bad
 * arguments are refused with a message.
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
#include "cpu/cpu_harness.h"
#include "kernels/kernels.h"
#include "util.h"

/* bf16 output: one rounding (2^-9 relative) on top of fp32 sums in another order. */
#define ATOL 1e-3
#define RTOL 4e-3

static const ch_attn_case cases[] = {
    {3, 4, 2, 64, 8, 6, 6},
    {2, 8, 2, 128, 40, 37, 33}, /* chunk tails in prompt and ring */
    {5, 4, 4, 32, 5, 9, 9},     /* more tasks than threads */
    {2, 4, 2, 64, 50, 120, 110}, /* up to 160 rows: chunks past the prefetch distance */
    {2, 4, 2, 112, 9, 40, 35},   /* d_h 112: value blocks of 64, 32 and 16 columns */
};
static const int threads[] = {-1, 1, 3};

static void round_bf16(float *x, uint16_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = flexdiag__f32_to_bf16(x[i]);
        if (b) b[i] = h;
        x[i] = flexdiag__bf16_to_f32(h);
    }
}

static void widen_all(const uint16_t *b, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = flexdiag__bf16_to_f32(b[i]);
}

/* Cache rows of the new tokens and positions for fixture f. */
static void new_rows(const ch_attn_fix *f, int32_t *rows, int32_t *pos, tu_rng *r) {
    for (int32_t i = 0; i < f->a.n_seq * f->a.h_kv; i++)
        rows[i] = f->a.p_cap + (int32_t)(tu_rng_uniform(r) * f->a.ring);
    for (int32_t s = 0; s < f->a.n_seq; s++) pos[s] = (int32_t)(tu_rng_uniform(r) * 1000);
}

static void test_bf16_vs_ref(void **state) {
    (void)state;
    const flexdiag_kernels *R = flexdiag__kernels_cpu_ref(), *F = flexdiag__kernels_cpu();
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        ch_attn_fix f;
        ch_attn_fix_init(&f, &cases[ci], 900 + ci);
        tu_rng rng = {77 + ci};
        int64_t nq = (int64_t)f.a.n_seq * f.width, nc = f.cache_n;
        int64_t no = (int64_t)f.a.n_seq * f.a.h_q * f.a.d_h;
        int32_t *rows = malloc((size_t)f.a.n_seq * f.a.h_kv * 4), *pos = malloc((size_t)f.a.n_seq * 4);
        new_rows(&f, rows, &pos[0], &rng);
        uint16_t *qb = malloc((size_t)nq * 2), *kb = malloc((size_t)nc * 2), *vb = malloc((size_t)nc * 2);
        round_bf16(f.qkv_dec, qb, nq);
        round_bf16(f.k, kb, nc);
        round_bf16(f.v, vb, nc);
        /* the oracle: fp32 on the widened values, stores rounded as the CUDA kv_append's */
        flexdiag_attn_args a = f.a;
        a.pos = pos;
        a.rope_theta = 10000.0f;
        assert_int_equal(R->kv_append(f.k, f.v, f.qkv_dec, rows, a.n_seq, 1, &a, NULL), FLEXDIAG_OK);
        round_bf16(f.qkv_dec, NULL, nq);
        round_bf16(f.k, NULL, nc);
        round_bf16(f.v, NULL, nc);
        float *want = malloc((size_t)no * 4), *got = malloc((size_t)no * 4), *kw = malloc((size_t)nc * 4);
        assert_int_equal(R->attn_decode(want, f.qkv_dec, f.k, f.v, &f.a, NULL), FLEXDIAG_OK);
        uint16_t *first = NULL;
        float *cs = malloc((size_t)a.n_seq * a.d_h * 4);
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            uint16_t *q2 = malloc((size_t)nq * 2), *k2 = malloc((size_t)nc * 2),
                     *v2 = malloc((size_t)nc * 2), *ob = malloc((size_t)no * 2);
            memcpy(q2, qb, (size_t)nq * 2);
            memcpy(k2, kb, (size_t)nc * 2);
            memcpy(v2, vb, (size_t)nc * 2);
            /* the first run computes the angles, the later ones take them from cs */
            flexdiag_host_attn h = {ob, q2, k2, v2, rows, a, cs, 2, t > 0};
            flexdiag_stream *s = ch_stream(F, threads[t]);
            assert_int_equal(flexdiag__host_attn_decode(&h, s), FLEXDIAG_OK);
            if (s) F->stream_destroy(s);
            float *qw = malloc((size_t)nq * 4);
            widen_all(q2, qw, nq);
            assert_memory_equal(qw, f.qkv_dec, (size_t)nq * 4); /* rotated queries, keys */
            widen_all(k2, kw, nc);
            assert_memory_equal(kw, f.k, (size_t)nc * 4);
            widen_all(v2, kw, nc);
            assert_memory_equal(kw, f.v, (size_t)nc * 4);
            widen_all(ob, got, no);
            assert_true(tu_allclose("host bf16 decode out", got, want, no, ATOL, RTOL, 1e-5));
            if (!first) first = ob;
            else {
                assert_memory_equal(ob, first, (size_t)no * 2);
                free(ob);
            }
            free(qw);
            free(q2);
            free(k2);
            free(v2);
        }
        /* cs_ready is honoured: zero angles taken as they are rotate the queries to zero */
        uint16_t *q0 = malloc((size_t)nq * 2), *k0 = malloc((size_t)nc * 2),
                 *v0 = malloc((size_t)nc * 2);
        memcpy(q0, qb, (size_t)nq * 2);
        memcpy(k0, kb, (size_t)nc * 2);
        memcpy(v0, vb, (size_t)nc * 2);
        memset(cs, 0, (size_t)a.n_seq * a.d_h * 4);
        flexdiag_host_attn h0 = {first, q0, k0, v0, rows, a, cs, 2, 1};
        assert_int_equal(flexdiag__host_attn_decode(&h0, NULL), FLEXDIAG_OK);
        for (int64_t i = 0; i < (int64_t)a.h_q * a.d_h; i++) assert_int_equal(q0[i] & 0x7fff, 0);
        free(q0);
        free(k0);
        free(v0);
        free(first);
        free(cs);
        free(want);
        free(got);
        free(kw);
        free(qb);
        free(kb);
        free(vb);
        free(rows);
        free(pos);
        ch_attn_fix_free(&f);
    }
}

/* Run the bf16 host kernel on copies of qb, kb, vb (nq, nc elements) with args a; returns
 * out (no) | rotated queries | K | V as bf16, concatenated. */
static uint16_t *run_bf16(const flexdiag_attn_args *a, const uint16_t *qb, const uint16_t *kb,
                          const uint16_t *vb, int32_t *rows, int64_t nq, int64_t nc, int64_t no) {
    uint16_t *res = malloc((size_t)(no + nq + 2 * nc) * 2);
    uint16_t *q2 = res + no, *k2 = q2 + nq, *v2 = k2 + nc;
    memcpy(q2, qb, (size_t)nq * 2);
    memcpy(k2, kb, (size_t)nc * 2);
    memcpy(v2, vb, (size_t)nc * 2);
    float *cs = malloc((size_t)a->n_seq * a->d_h * 4);
    flexdiag_host_attn h = {res, q2, k2, v2, rows, *a, cs, 2, 0};
    flexdiag_stream *s = ch_stream(flexdiag__kernels_cpu(), 3);
    assert_int_equal(flexdiag__host_attn_decode(&h, s), FLEXDIAG_OK);
    flexdiag__kernels_cpu()->stream_destroy(s);
    free(cs);
    return res;
}

/* One list per sequence (shared_slots 2) against the same lists copied to every KV head. */
static void test_bf16_per_seq_lists(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        ch_attn_fix f;
        ch_attn_fix_init(&f, &cases[ci], 600 + ci);
        tu_rng rng = {91 + ci};
        const flexdiag_attn_args *a0 = &f.a;
        int64_t nq = (int64_t)a0->n_seq * f.width, nc = f.cache_n;
        int64_t no = (int64_t)a0->n_seq * a0->h_q * a0->d_h, ms = a0->max_slots;
        int32_t *rows = malloc((size_t)a0->n_seq * a0->h_kv * 4);
        int32_t *pos = malloc((size_t)a0->n_seq * 4);
        new_rows(&f, rows, pos, &rng);
        uint16_t *qb = malloc((size_t)nq * 2), *kb = malloc((size_t)nc * 2);
        uint16_t *vb = malloc((size_t)nc * 2);
        round_bf16(f.qkv_dec, qb, nq);
        round_bf16(f.k, kb, nc);
        round_bf16(f.v, vb, nc);
        /* sequence s's list: the fixture's list of its last KV head (lengths differ) */
        int32_t *sl = malloc((size_t)(a0->n_seq * ms) * 4), *ns = malloc((size_t)a0->n_seq * 4);
        for (int32_t s = 0; s < a0->n_seq; s++) {
            int64_t li = (int64_t)s * a0->h_kv + a0->h_kv - 1;
            ns[s] = f.n_slots[li];
            memcpy(sl + s * ms, f.slots + li * ms, (size_t)ms * 4);
            for (int32_t h = 0; h < a0->h_kv; h++) {
                f.n_slots[(int64_t)s * a0->h_kv + h] = ns[s];
                memcpy(f.slots + ((int64_t)s * a0->h_kv + h) * ms, sl + s * ms, (size_t)ms * 4);
            }
        }
        flexdiag_attn_args a = f.a;
        a.pos = pos;
        a.rope_theta = 10000.0f;
        uint16_t *want = run_bf16(&a, qb, kb, vb, rows, nq, nc, no);
        a.shared_slots = FLEXDIAG_SLOTS_PER_SEQ;
        a.slots = sl;
        a.n_slots = ns;
        uint16_t *got = run_bf16(&a, qb, kb, vb, rows, nq, nc, no);
        assert_memory_equal(got, want, (size_t)(no + nq + 2 * nc) * 2);
        free(want);
        free(got);
        free(sl);
        free(ns);
        free(qb);
        free(kb);
        free(vb);
        free(rows);
        free(pos);
        ch_attn_fix_free(&f);
    }
}

/* fp32: the "cpu" table's own ops, bit for bit. */
static void test_f32_is_cpu_table(void **state) {
    (void)state;
    const flexdiag_kernels *F = flexdiag__kernels_cpu();
    ch_attn_fix f;
    ch_attn_fix_init(&f, &cases[0], 31);
    tu_rng rng = {5};
    int64_t nq = (int64_t)f.a.n_seq * f.width, nc = f.cache_n;
    int64_t no = (int64_t)f.a.n_seq * f.a.h_q * f.a.d_h;
    int32_t rows[64], pos[8];
    new_rows(&f, rows, pos, &rng);
    flexdiag_attn_args a = f.a;
    a.pos = pos;
    a.rope_theta = 10000.0f;
    float *q2 = malloc((size_t)nq * 4), *k2 = malloc((size_t)nc * 4), *v2 = malloc((size_t)nc * 4);
    float *o1 = malloc((size_t)no * 4), *o2 = malloc((size_t)no * 4);
    memcpy(q2, f.qkv_dec, (size_t)nq * 4);
    memcpy(k2, f.k, (size_t)nc * 4);
    memcpy(v2, f.v, (size_t)nc * 4);
    flexdiag_stream *s = ch_stream(F, 2);
    assert_int_equal(F->kv_append(f.k, f.v, f.qkv_dec, rows, a.n_seq, 1, &a, s), FLEXDIAG_OK);
    assert_int_equal(F->attn_decode(o1, f.qkv_dec, f.k, f.v, &a, s), FLEXDIAG_OK);
    flexdiag_host_attn h = {o2, q2, k2, v2, rows, a, NULL, 4, 0};
    assert_int_equal(flexdiag__host_attn_decode(&h, s), FLEXDIAG_OK);
    assert_memory_equal(o1, o2, (size_t)no * 4);
    assert_memory_equal(f.k, k2, (size_t)nc * 4);
    F->stream_destroy(s);
    free(q2);
    free(k2);
    free(v2);
    free(o1);
    free(o2);
    ch_attn_fix_free(&f);
}

static void test_refusals(void **state) {
    (void)state;
    ch_attn_fix f;
    ch_attn_fix_init(&f, &cases[0], 3);
    int32_t rows[64];
    for (int i = 0; i < 64; i++) rows[i] = f.a.p_cap;
    uint16_t buf[1 << 14];
    flexdiag_host_attn h = {buf, buf, buf, buf, rows, f.a, NULL, 3, 0};
    assert_int_equal(flexdiag__host_attn_decode(&h, NULL), FLEXDIAG_ERR_INVALID_ARG);
    h.act_bytes = 2;
    float lse[64];
    h.a.lse_out = lse;
    assert_int_equal(flexdiag__host_attn_decode(&h, NULL), FLEXDIAG_ERR_UNSUPPORTED);
    h.a.lse_out = NULL;
    rows[1] = f.a.p_cap + f.a.ring; /* past the block */
    assert_int_equal(flexdiag__host_attn_decode(&h, NULL), FLEXDIAG_ERR_INVALID_ARG);
    rows[1] = f.a.p_cap;
    int32_t pos[8] = {0};
    h.a.pos = pos; /* positions without the angle scratch */
    h.a.rope_theta = 10000.0f;
    assert_int_equal(flexdiag__host_attn_decode(&h, NULL), FLEXDIAG_ERR_INVALID_ARG);
    ch_attn_fix_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_vs_ref),
        cmocka_unit_test(test_bf16_per_seq_lists),
        cmocka_unit_test(test_f32_is_cpu_table),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
