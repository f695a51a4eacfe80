/*
 * test_shared_slots.c - attn_decode with shared slot lists (position-only policies) must equal
 * the same lists expanded to every (sequence, KV head): one list for all (shared_slots 1), and
 * one list per sequence shared by its KV heads (shared_slots 2; the sequences' lists differ in
 * rows and length, one attends nothing at all). Bit-identical on the CPU reference and fast
 * tables (same order of summation), and on CUDA when a device is present (same kernel path, so
 * also bit-identical). Logits, lse and probability outputs included.
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

enum { NS = 3, HQ = 4, HKV = 2, DH = 16, PCAP = 5, RING = 9, MS = 6 };

/* The lists of the sequences (LISTS[0] for every sequence when they share one); the row 8
 * twice in LISTS[0] is attended twice. */
static const int32_t LISTS[NS][MS] = {{3, 0, 8, 8, 5, 1}, {7, 2, 4, 0, 6, 1}, {1, 8, 3, 2, 0, 5}};
static const int32_t LIST_LEN[NS] = {5, 6, 0};

typedef struct bufs {
    void *q, *k, *v, *out;       /* device */
    int32_t *lp, *slots, *nsl;   /* device */
    float *lg, *lse, *pr;        /* device */
} bufs;

static void *dev_put(const flexdiag_kernels *k, flexdiag_stream *s, const void *h, size_t n) {
    void *d = NULL;
    assert_int_equal(k->mem_alloc(n, &d), FLEXDIAG_OK);
    assert_int_equal(k->copy_h2d(d, h, n, s), FLEXDIAG_OK);
    return d;
}

/* Act data from f32 host values, on the backend. */
static void *act_put(const flexdiag_kernels *k, flexdiag_stream *s, const float *h, int64_t n) {
    void *f = dev_put(k, s, h, (size_t)n * 4), *a = NULL;
    assert_int_equal(k->mem_alloc((size_t)n * (size_t)k->act_bytes, &a), FLEXDIAG_OK);
    assert_int_equal(k->act_from_f32(a, f, n, s), FLEXDIAG_OK);
    assert_int_equal(k->stream_sync(s), FLEXDIAG_OK);
    k->mem_free(f);
    return a;
}

/* Run attn_decode with the sequences' lists (per_seq: LISTS[s], else LISTS[0] for every
 * sequence) passed as shared_slots mode says (0: expanded to every KV head); returns host
 * out|logits|lse|probs concatenated. */
static float *run(const flexdiag_kernels *k, int mode, int per_seq) {
    flexdiag_stream *s = NULL;
    assert_int_equal(k->stream_create(k->act_bytes == 2 ? 0 : -1, 2, &s), FLEXDIAG_OK);
    tu_rng r;
    tu_rng_seed(&r, 5);
    int64_t w = (HQ + 2 * HKV) * DH, kvn = (int64_t)NS * HKV * (PCAP + RING) * DH;
    float *q = malloc((size_t)NS * (size_t)w * 4), *kv = malloc((size_t)kvn * 4);
    tu_fill_f32(&r, q, NS * w, 1.0f);
    tu_fill_f32(&r, kv, kvn, 1.0f);
    int32_t lp[NS] = {5, 2, 0}, nsl[NS * HKV], sl[NS * HKV * MS];
    int lists = mode == FLEXDIAG_SLOTS_ONE ? 1 : mode == FLEXDIAG_SLOTS_PER_SEQ ? NS : NS * HKV;
    for (int i = 0; i < lists; i++) { /* list i of the mode: sequence i, or i / HKV expanded */
        int sq = per_seq ? (mode == FLEXDIAG_SLOTS_PER_SEQ ? i : i / HKV) : 0;
        nsl[i] = LIST_LEN[sq];
        memcpy(sl + i * MS, LISTS[sq], sizeof LISTS[sq]);
    }
    bufs b = {.q = act_put(k, s, q, NS * w), .k = act_put(k, s, kv, kvn)};
    tu_fill_f32(&r, kv, kvn, 1.0f);
    b.v = act_put(k, s, kv, kvn);
    b.lp = dev_put(k, s, lp, sizeof lp);
    b.slots = dev_put(k, s, sl, (size_t)lists * MS * 4);
    b.nsl = dev_put(k, s, nsl, (size_t)lists * 4);
    int64_t no = (int64_t)NS * HQ * DH, nl = (int64_t)NS * HQ * MS, ne = NS * HQ;
    assert_int_equal(k->mem_alloc((size_t)no * (size_t)k->act_bytes, &b.out), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc((size_t)nl * 4, (void **)&b.lg), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc((size_t)ne * 4, (void **)&b.lse), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc((size_t)nl * 4, (void **)&b.pr), FLEXDIAG_OK);
    assert_int_equal(k->memset0(b.lg, (size_t)nl * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->memset0(b.pr, (size_t)nl * 4, s), FLEXDIAG_OK);
    flexdiag_attn_args a = {.n_seq = NS, .h_q = HQ, .h_kv = HKV, .d_h = DH, .p_cap = PCAP,
                            .ring = RING, .scale = 0.25f, .lp = b.lp, .slots = b.slots,
                            .n_slots = b.nsl, .max_slots = MS, .logits_out = b.lg,
                            .lse_out = b.lse, .shared_slots = mode, .probs_out = b.pr};
    assert_int_equal(k->attn_decode(b.out, b.q, b.k, b.v, &a, s), FLEXDIAG_OK);
    float *res = malloc((size_t)(no + 2 * nl + ne) * 4), *of = NULL;
    assert_int_equal(k->mem_alloc((size_t)no * 4, (void **)&of), FLEXDIAG_OK);
    assert_int_equal(k->act_to_f32(of, b.out, no, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res, of, (size_t)no * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + no, b.lg, (size_t)nl * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + no + nl, b.lse, (size_t)ne * 4, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(res + no + nl + ne, b.pr, (size_t)nl * 4, s), FLEXDIAG_OK);
    void *all[] = {b.q, b.k, b.v, b.out, b.lp, b.slots, b.nsl, b.lg, b.lse, b.pr, of};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) k->mem_free(all[i]);
    k->stream_destroy(s);
    free(q);
    free(kv);
    return res;
}

/* Shared mode against the expanded lists, bit for bit. */
static void check_mode(const flexdiag_kernels *k, int mode, int per_seq) {
    size_t n = (size_t)NS * HQ * (DH + 2 * MS + 1) * 4;
    float *a = run(k, FLEXDIAG_SLOTS_PER_HEAD, per_seq), *b = run(k, mode, per_seq);
    assert_memory_equal(a, b, n);
    free(a);
    free(b);
}

static void check(const flexdiag_kernels *k) {
    check_mode(k, FLEXDIAG_SLOTS_ONE, 0);
    check_mode(k, FLEXDIAG_SLOTS_PER_SEQ, 0);
    check_mode(k, FLEXDIAG_SLOTS_PER_SEQ, 1);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_ref),
        cmocka_unit_test(test_cpu_fast),
        cmocka_unit_test(test_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
