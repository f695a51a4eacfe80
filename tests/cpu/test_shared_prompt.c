/*
 * test_shared_prompt.c - attn_decode with shared prompt KV (kernels.h flexdiag_attn_args
 * prefix: prompt rows read from one prompt-only block per distinct prompt, ring-only blocks
 * per sequence) must equal the per-sequence layout holding copies of the same prompt rows:
 * bit-identical on the CPU reference and fast tables and on CUDA when a device is present (the
 * same keys in the same order, only their addresses differ). Sequences of one prefix with
 * different prompt lengths, an empty prompt, an empty slot list, per-(sequence, head) lists;
 * outputs, ring logits, lse and the probability epilogue compared. Bad prefix arguments are
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

enum { NS = 5, NPRE = 2, HQ = 4, HKV = 2, DH = 16, PCAP = 6, RING = 9, MS = 7 };
enum { W = (HQ + 2 * HKV) * DH, BLK = (PCAP + RING) * DH, PRE = PCAP * DH, RB = RING * DH };

static const int32_t prefix[NS] = {0, 1, 0, 1, 0};
static const int32_t lp[NS] = {6, 4, 6, 0, 3}; /* sequence 4: a shorter prompt of prefix 0 */

typedef struct host_case {
    float q[NS * W];
    float kpre[NPRE * HKV * PRE], vpre[NPRE * HKV * PRE];   /* shared prompt rows */
    float kring[NS * HKV * RB], vring[NS * HKV * RB];       /* ring-only blocks */
    float kfull[NS * HKV * BLK], vfull[NS * HKV * BLK];     /* per-sequence prompt copies */
    int32_t slots[NS * HKV * MS], n_slots[NS * HKV];
} host_case;

static void make_case(host_case *c) {
    tu_rng r;
    tu_rng_seed(&r, 11);
    tu_fill_f32(&r, c->q, NS * W, 1.0f);
    tu_fill_f32(&r, c->kpre, NPRE * HKV * PRE, 1.0f);
    tu_fill_f32(&r, c->vpre, NPRE * HKV * PRE, 1.0f);
    tu_fill_f32(&r, c->kring, NS * HKV * RB, 1.0f);
    tu_fill_f32(&r, c->vring, NS * HKV * RB, 1.0f);
    for (int s = 0; s < NS; s++)
        for (int h = 0; h < HKV; h++) {
            int b = s * HKV + h;
            const float *kp = c->kpre + ((size_t)prefix[s] * HKV + h) * PRE;
            const float *vp = c->vpre + ((size_t)prefix[s] * HKV + h) * PRE;
            memcpy(c->kfull + (size_t)b * BLK, kp, sizeof(float) * PRE);
            memcpy(c->vfull + (size_t)b * BLK, vp, sizeof(float) * PRE);
            memcpy(c->kfull + (size_t)b * BLK + PRE, c->kring + (size_t)b * RB, sizeof(float) * RB);
            memcpy(c->vfull + (size_t)b * BLK + PRE, c->vring + (size_t)b * RB, sizeof(float) * RB);
            c->n_slots[b] = b == 3 ? 0 : (int32_t)tu_rng_int(&r, 1, MS);
            for (int j = 0; j < MS; j++) /* distinct ring rows */
                c->slots[b * MS + j] = (int32_t)((j * 4 + b) % RING);
        }
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

/* attn_decode shared (1) or per-sequence (0); returns out | logits | lse | probs (host fp32). */
static float *run(const flexdiag_kernels *k, const host_case *c, int shared) {
    flexdiag_stream *s = NULL;
    assert_int_equal(k->stream_create(k->act_bytes == 2 ? 0 : -1, 2, &s), FLEXDIAG_OK);
    enum { NO = NS * HQ * DH, NL = NS * HQ * MS, NE = NS * HQ };
    void *q = put(k, s, c->q, sizeof c->q, 1);
    void *kk = shared ? put(k, s, c->kring, sizeof c->kring, 1) : put(k, s, c->kfull, sizeof c->kfull, 1);
    void *vv = shared ? put(k, s, c->vring, sizeof c->vring, 1) : put(k, s, c->vfull, sizeof c->vfull, 1);
    void *kp = put(k, s, c->kpre, sizeof c->kpre, 1), *vp = put(k, s, c->vpre, sizeof c->vpre, 1);
    void *dlp = put(k, s, lp, sizeof lp, 0), *dpre = put(k, s, prefix, sizeof prefix, 0);
    void *dsl = put(k, s, c->slots, sizeof c->slots, 0), *dns = put(k, s, c->n_slots, sizeof c->n_slots, 0);
    void *out = NULL, *lg = NULL, *lse = NULL, *pr = NULL, *of = NULL;
    assert_int_equal(k->mem_alloc((size_t)NO * (size_t)k->act_bytes, &out), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(NL * 4, &lg), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(NE * 4, &lse), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(NL * 4, &pr), FLEXDIAG_OK);
    assert_int_equal(k->memset0(lg, NL * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->memset0(pr, NL * 4, s), FLEXDIAG_OK);
    flexdiag_attn_args a = {.n_seq = NS, .h_q = HQ, .h_kv = HKV, .d_h = DH,
                            .p_cap = shared ? 0 : PCAP, .ring = RING, .scale = 0.25f, .lp = dlp,
                            .slots = dsl, .n_slots = dns, .max_slots = MS, .logits_out = lg,
                            .lse_out = lse, .probs_out = pr};
    if (shared)
        a.prefix = dpre, a.k_pre = kp, a.v_pre = vp, a.n_pre = NPRE, a.pre_cap = PCAP;
    assert_int_equal(k->attn_decode(out, q, kk, vv, &a, s), FLEXDIAG_OK);
    float *res = malloc((NO + 2 * NL + NE) * 4);
    assert_int_equal(k->mem_alloc(NO * 4, &of), FLEXDIAG_OK);
    assert_int_equal(k->act_to_f32(of, out, NO, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res, of, NO * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + NO, lg, NL * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + NO + NL, lse, NE * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + NO + NL + NE, pr, NL * 4, s), FLEXDIAG_OK);
    void *all[] = {q, kk, vv, kp, vp, dlp, dpre, dsl, dns, out, lg, lse, pr, of};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) k->mem_free(all[i]);
    k->stream_destroy(s);
    return res;
}

static void check(const flexdiag_kernels *k) {
    host_case *c = calloc(1, sizeof *c);
    make_case(c);
    float *a = run(k, c, 0), *b = run(k, c, 1);
    assert_memory_equal(a, b, (size_t)(NS * HQ * DH + 2 * NS * HQ * MS + NS * HQ) * 4);
    free(a);
    free(b);
    free(c);
}

static void test_cpu_ref(void **state) {
    (void)state;
    tu_on_table(0, check);
}

static void test_cpu_fast(void **state) {
    (void)state;
    tu_on_table(1, check);
}

static void test_cuda(void **state) {
    (void)state;
    tu_on_table(2, check);
}

/* A prefix index outside [0, n_pre), prompt rows left in the ring-only blocks (p_cap != 0) or
 * no prompt store: INVALID_ARG naming the field, on both CPU tables. */
static void test_refusals(void **state) {
    (void)state;
    const flexdiag_kernels *tabs[] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    float q[W] = {0}, kv[RB] = {0}, pre[PRE] = {0}, out[HQ * DH];
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
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
