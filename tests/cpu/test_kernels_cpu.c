/*
 * test_kernels_cpu.c - every op of the "cpu-ref" table against a naive implementation written
 * here (double precision where natural), over shape tables with odd sizes (n = 1, 3, 17;
 * d = 8, 24, 130; GQA g = 1, 2, 4; varying prompt lengths, ring slot lists in random order,
 * heads with no slots, a sequence with no keys at all). Outputs are compared with the fp32
 * tolerances of docs/architecture.md §10.2 and sit between guard regions that must come back
 * bit-identical. Data movement (embed, gather, KV append, copies) must be exact, and so must ReLU
 * (signed zeros and NaN kept) and the learned position add (one fp32 sum). LayerNorm is checked
 * against a hand-computed row, a double formula, in place and on a constant row; QK-norm against
 * the same formula per head, with shared and per-head weight rows, the v heads bit-identical and a
 * constant head giving exactly b. RoPE (not a table
 * slot: the internal flexdiag__cpu_ref_rope that kv_append runs when its args carry positions) is
 * checked against the closed form, and kv_append with positions must equal RoPE then the plain
 * append bit for bit. The decode epilogue, on both tables: probs_out must be expf(logits_out -
 * lse_out) of the same call bit for bit, and the fused Diagonal update (diag_fixture.h) must equal
 * the literal argmin over the call's own logits, with bitwise ties going to the larger lag; both
 * must come out the same without logits_out / lse_out (the scratch path); a sequence whose
 * diag_next entry is negative keeps its lists while the others update as before. Bad arguments
 * must fail with FLEXDIAG_ERR_INVALID_ARG and a message naming the culprit.
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
#include "kernels/cpu/cpu_ops.h"
#include "cpu/diag_fixture.h"
#include "kernels/kernels.h"
#include "util.h"

static const int64_t n_list[] = {1, 3, 17};
static const int64_t d_list[] = {8, 24, 130};

static const ch_attn_case attn_cases[] = {
    {1, 1, 1, 8, 5, 4, 4},     /* MHA, single sequence */
    {3, 4, 2, 24, 17, 9, 6},   /* g = 2 */
    {2, 8, 2, 130, 9, 12, 12}, /* g = 4, d_h not a multiple of 8 */
    {4, 4, 4, 8, 3, 7, 5},     /* g = 1, short prompts */
    {2, 4, 1, 24, 70, 40, 37}, /* g = 4, longer than one 32-key chunk */
};
#define N_ATTN_CASES (sizeof attn_cases / sizeof attn_cases[0])

static const flexdiag_kernels *ref(void) { return flexdiag__kernels_cpu_ref(); }

/* Assert st is INVALID_ARG and the error message contains what. */
static void expect_invalid(flexdiag_status st, const char *what) {
    assert_int_equal(st, FLEXDIAG_ERR_INVALID_ARG);
    if (!strstr(flexdiag__err_msg(), what))
        fail_msg("message \"%s\" does not mention \"%s\"", flexdiag__err_msg(), what);
    flexdiag__err_clear();
}

/* ---- tables, memory, conversions ---- */

static void test_tables(void **state) {
    (void)state;
    const flexdiag_kernels *tabs[] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    assert_string_equal(tabs[0]->name, "cpu-ref");
    assert_string_equal(tabs[1]->name, "cpu");
    for (int i = 0; i < 2; i++) {
        const flexdiag_kernels *K = tabs[i];
        assert_int_equal(K->act_bytes, 4);
        assert_int_equal(K->diag_max_group, INT32_MAX); /* both fuse Diagonal for any group */
        assert_null(K->mem_info);
        assert_true(K->stream_create && K->stream_destroy && K->stream_sync && K->mem_alloc &&
                    K->mem_free && K->copy_h2d && K->copy_d2h && K->copy_d2d && K->memset0 &&
                    K->act_to_f32 && K->act_from_f32 && K->embed && K->pos_embed_add &&
                    K->rmsnorm && K->layernorm && K->qk_norm && K->matmul && K->swiglu &&
                    K->gelu && K->relu && K->gather_rows && K->kv_append &&
                    K->attn_prefill && K->attn_decode && K->cfg_combine && K->sample);
    }
    assert_ptr_not_equal(tabs[0]->matmul, tabs[1]->matmul);
    assert_ptr_not_equal(tabs[0]->attn_decode, tabs[1]->attn_decode);
    assert_ptr_not_equal(tabs[0]->attn_prefill, tabs[1]->attn_prefill);
}

static void test_memory(void **state) {
    (void)state;
    const flexdiag_kernels *K = ref();
    void *p = (void *)1;
    assert_int_equal(K->mem_alloc(0, &p), FLEXDIAG_OK);
    assert_null(p);
    const size_t sizes[] = {1, 100, 4096, 12345};
    for (size_t i = 0; i < 4; i++) {
        void *a = NULL, *b = NULL;
        assert_int_equal(K->mem_alloc(sizes[i], &a), FLEXDIAG_OK);
        assert_int_equal(K->mem_alloc(sizes[i], &b), FLEXDIAG_OK);
        assert_int_equal((uintptr_t)a % 64, 0);
        unsigned char *host = malloc(sizes[i]), *back = malloc(sizes[i]);
        for (size_t j = 0; j < sizes[i]; j++) host[j] = (unsigned char)(j * 7 + 3);
        assert_int_equal(K->copy_h2d(a, host, sizes[i], NULL), FLEXDIAG_OK);
        assert_int_equal(K->copy_d2d(b, a, sizes[i], NULL), FLEXDIAG_OK);
        assert_int_equal(K->copy_d2h(back, b, sizes[i], NULL), FLEXDIAG_OK);
        assert_memory_equal(back, host, sizes[i]);
        assert_int_equal(K->memset0(b, sizes[i], NULL), FLEXDIAG_OK);
        assert_int_equal(K->copy_d2h(back, b, sizes[i], NULL), FLEXDIAG_OK);
        for (size_t j = 0; j < sizes[i]; j++) assert_int_equal(back[j], 0);
        free(host);
        free(back);
        K->mem_free(a);
        K->mem_free(b);
    }
    K->mem_free(NULL);
    char buf[64] = {0};
    expect_invalid(K->copy_d2d(buf + 8, buf, 16, NULL), "overlap");
    expect_invalid(K->copy_h2d(NULL, buf, 16, NULL), "dst");
    assert_int_equal(K->copy_h2d(NULL, NULL, 0, NULL), FLEXDIAG_OK);
}

static void test_streams(void **state) {
    (void)state;
    const flexdiag_kernels *K = flexdiag__kernels_cpu();
    flexdiag_stream *s = (flexdiag_stream *)1;
    expect_invalid(K->stream_create(0, -1, &s), "threads");
    assert_null(s);
    expect_invalid(K->stream_create(0, 100000, &s), "threads");
    const int threads[] = {0, 1, 4};
    for (int i = 0; i < 3; i++) {
        s = ch_stream(K, threads[i]);
        assert_int_equal(K->stream_sync(s), FLEXDIAG_OK);
        K->stream_destroy(s);
    }
    K->stream_destroy(NULL);
}

static void test_act_conversions(void **state) {
    (void)state;
    const flexdiag_kernels *K = ref();
    tu_rng r;
    tu_rng_seed(&r, 1);
    float x[37];
    tu_fill_f32(&r, x, 37, 3.0f);
    x[5] = NAN;
    x[6] = -INFINITY;
    float *act = ch_guarded(37, 0.0f), *back = ch_guarded(37, 0.0f);
    assert_int_equal(K->act_from_f32(act, x, 37, NULL), FLEXDIAG_OK);
    assert_int_equal(K->act_to_f32(back, act, 37, NULL), FLEXDIAG_OK);
    assert_memory_equal(back, x, sizeof x); /* fp32 act: exact copies, NaN payload included */
    ch_guard_check(act, 37, "act_from_f32");
    ch_guard_check(back, 37, "act_to_f32");
    expect_invalid(K->act_to_f32(back, act, -1, NULL), "n = -1");
    ch_guarded_free(act);
    ch_guarded_free(back);
}

/* ---- embedding and gather (exact) ---- */

static void test_embed(void **state) {
    (void)state;
    const int32_t V = 11, reps[] = {1, 2, 3};
    tu_rng r;
    tu_rng_seed(&r, 2);
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++)
            for (int ri = 0; ri < 3; ri++) {
                int64_t n = n_list[ni], d = d_list[di];
                int32_t rep = reps[ri], ids[17];
                uint16_t *table = malloc((size_t)(V * d) * 2);
                tu_fill_bf16(&r, table, V * d, 1.0f);
                for (int64_t j = 0; j < n; j++) ids[j] = (int32_t)tu_rng_int(&r, 0, V - 1);
                float *out = ch_guarded(n * d, 0.0f);
                assert_int_equal(ref()->embed(out, table, ids, n, d, rep, NULL), FLEXDIAG_OK);
                for (int64_t i = 0; i < n; i++)
                    for (int64_t c = 0; c < d; c++) {
                        float want = flexdiag__bf16_to_f32(table[ids[i / rep] * d + c]);
                        assert_memory_equal(&out[i * d + c], &want, 4);
                    }
                ch_guard_check(out, n * d, "embed");
                ch_guarded_free(out);
                free(table);
            }
    uint16_t table[8] = {0};
    int32_t bad[2] = {0, -3};
    float out[16];
    expect_invalid(ref()->embed(out, table, bad, 2, 8, 1, NULL), "ids[1] = -3");
    expect_invalid(ref()->embed(out, table, bad, 2, 8, 0, NULL), "rep");
}

static void test_gather_rows(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 3);
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++) {
            int64_t n = n_list[ni], d = d_list[di], rows = 23;
            float *in = malloc((size_t)(rows * d) * sizeof(float));
            tu_fill_f32(&r, in, rows * d, 1.0f);
            int32_t idx[17];
            for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)tu_rng_int(&r, 0, rows - 1);
            float *out = ch_guarded(n * d, 0.0f);
            assert_int_equal(ref()->gather_rows(out, in, idx, n, d, NULL), FLEXDIAG_OK);
            for (int64_t i = 0; i < n; i++)
                assert_memory_equal(out + i * d, in + idx[i] * d, (size_t)d * sizeof(float));
            ch_guard_check(out, n * d, "gather_rows");
            ch_guarded_free(out);
            free(in);
        }
    int32_t bad = -1;
    float x[8] = {0}, y[8];
    expect_invalid(ref()->gather_rows(y, x, &bad, 1, 8, NULL), "idx[0] = -1");
}

/* x (n, d) += table rows pos[i] + offset: each sum is one fp32 addition, so exact equality. */
static void test_pos_embed_add(void **state) {
    (void)state;
    const int32_t rows = 23, offsets[] = {2, 0};
    tu_rng r;
    tu_rng_seed(&r, 9);
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++)
            for (int oi = 0; oi < 2; oi++) {
                int64_t n = n_list[ni], d = d_list[di];
                int32_t off = offsets[oi], pos[17];
                /* OPT's pattern: positions 0..n-1, then (on odd d) a repeated, descending one */
                for (int64_t i = 0; i < n; i++)
                    pos[i] = di % 2 ? (int32_t)((n - 1 - i) / 2) : (int32_t)i;
                uint16_t *table = malloc((size_t)(rows * d) * 2);
                float *x0 = malloc((size_t)(n * d) * 4), *x = ch_guarded(n * d, 0.0f);
                tu_fill_bf16(&r, table, rows * d, 0.5f);
                tu_fill_f32(&r, x0, n * d, 1.0f);
                memcpy(x, x0, (size_t)(n * d) * 4);
                assert_int_equal(ref()->pos_embed_add(x, table, pos, n, d, off, NULL),
                                 FLEXDIAG_OK);
                for (int64_t i = 0; i < n; i++)
                    for (int64_t c = 0; c < d; c++) {
                        float want = x0[i * d + c] +
                                     flexdiag__bf16_to_f32(table[(pos[i] + off) * d + c]);
                        assert_memory_equal(&x[i * d + c], &want, 4);
                    }
                ch_guard_check(x, n * d, "pos_embed_add");
                ch_guarded_free(x);
                free(x0);
                free(table);
            }
    uint16_t table[8] = {0};
    int32_t bad[2] = {5, -3};
    float x[16] = {0};
    expect_invalid(ref()->pos_embed_add(x, table, bad, 2, 8, 2, NULL), "pos[1] + offset = -3 + 2");
    expect_invalid(ref()->pos_embed_add(x, table, bad, -1, 8, 2, NULL), "n = -1");
    assert_int_equal(ref()->pos_embed_add(NULL, NULL, NULL, 0, 8, 2, NULL), FLEXDIAG_OK);
}

/* ---- row ops vs double formulas ---- */

static void test_rmsnorm(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 4);
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++) {
            int64_t n = n_list[ni], d = d_list[di];
            float eps = di == 1 ? 1e-5f : 1e-6f;
            float *x = malloc((size_t)(n * d) * sizeof(float));
            double *want_d = malloc((size_t)(n * d) * sizeof(double));
            float *want = malloc((size_t)(n * d) * sizeof(float));
            uint16_t *w = malloc((size_t)d * 2);
            tu_fill_f32(&r, x, n * d, 2.0f);
            tu_fill_bf16(&r, w, d, 1.0f);
            for (int64_t i = 0; i < n; i++) {
                double ss = 0;
                for (int64_t c = 0; c < d; c++) ss += (double)x[i * d + c] * x[i * d + c];
                double inv = 1.0 / sqrt(ss / (double)d + eps);
                for (int64_t c = 0; c < d; c++)
                    want_d[i * d + c] = x[i * d + c] * inv * flexdiag__bf16_to_f32(w[c]);
            }
            for (int64_t i = 0; i < n * d; i++) want[i] = (float)want_d[i];
            float *out = ch_guarded(n * d, 0.0f);
            assert_int_equal(ref()->rmsnorm(out, x, w, n, d, eps, NULL), FLEXDIAG_OK);
            assert_true(tu_allclose("rmsnorm", out, want, n * d, CH_ATOL, CH_RTOL, CH_NMSE));
            ch_guard_check(out, n * d, "rmsnorm");
            ch_guarded_free(out);
            free(x);
            free(want_d);
            free(want);
            free(w);
        }
    float x[8] = {0}, y[8];
    uint16_t w[8] = {0};
    expect_invalid(ref()->rmsnorm(y, x, w, 1, 0, 1e-6f, NULL), "d = 0");
    expect_invalid(ref()->rmsnorm(y, x, w, 1, 8, NAN, NULL), "eps");
}

/* want (n, d) = (x - mean) / sqrt(var + eps) · w + b per row in double (one-pass sums of x and
 * x², written independently of the reference's two-pass statistics). */
static void layernorm_naive(float *want, const float *x, const uint16_t *w, const uint16_t *b,
                            int64_t n, int64_t d, float eps) {
    for (int64_t i = 0; i < n; i++) {
        double s1 = 0, s2 = 0;
        for (int64_t c = 0; c < d; c++) {
            s1 += x[i * d + c];
            s2 += (double)x[i * d + c] * x[i * d + c];
        }
        double mean = s1 / (double)d, var = s2 / (double)d - mean * mean;
        for (int64_t c = 0; c < d; c++)
            want[i * d + c] = (float)((x[i * d + c] - mean) / sqrt(var + eps) *
                                          flexdiag__bf16_to_f32(w[c]) +
                                      flexdiag__bf16_to_f32(b[c]));
    }
}

static void test_layernorm(void **state) {
    (void)state;
    /* hand-computed: x = 1..4, mean 2.5, var 1.25; w = 2, b = 0.5 (eps 0) */
    const float hx[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    const uint16_t hw[4] = {0x4000, 0x4000, 0x4000, 0x4000}; /* bf16 2.0 */
    const uint16_t hb[4] = {0x3F00, 0x3F00, 0x3F00, 0x3F00}; /* bf16 0.5 */
    const double z = 1.0 / sqrt(1.25);
    const float hwant[4] = {(float)(-3 * z + 0.5), (float)(-z + 0.5), (float)(z + 0.5),
                            (float)(3 * z + 0.5)};
    float hy[4];
    assert_int_equal(ref()->layernorm(hy, hx, hw, hb, 1, 4, 0.0f, NULL), FLEXDIAG_OK);
    assert_true(tu_allclose("layernorm 1..4", hy, hwant, 4, CH_ATOL, CH_RTOL, CH_NMSE));

    tu_rng r;
    tu_rng_seed(&r, 10);
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++) {
            int64_t n = n_list[ni], d = d_list[di];
            float eps = di == 1 ? 1e-5f : 1e-6f;
            float *x = malloc((size_t)(n * d) * 4), *want = malloc((size_t)(n * d) * 4);
            uint16_t *w = malloc((size_t)d * 2), *b = malloc((size_t)d * 2);
            tu_fill_f32(&r, x, n * d, 2.0f);
            for (int64_t c = 0; c < d; c++) x[c] += 50.0f; /* row 0 far from zero */
            tu_fill_bf16(&r, w, d, 1.0f);
            tu_fill_bf16(&r, b, d, 0.5f);
            layernorm_naive(want, x, w, b, n, d, eps);
            float *out = ch_guarded(n * d, 0.0f);
            assert_int_equal(ref()->layernorm(out, x, w, b, n, d, eps, NULL), FLEXDIAG_OK);
            assert_true(tu_allclose("layernorm", out, want, n * d, CH_ATOL, CH_RTOL, CH_NMSE));
            ch_guard_check(out, n * d, "layernorm");
            /* in place: the same bits */
            float *xi = ch_guarded(n * d, 0.0f);
            memcpy(xi, x, (size_t)(n * d) * 4);
            assert_int_equal(ref()->layernorm(xi, xi, w, b, n, d, eps, NULL), FLEXDIAG_OK);
            assert_memory_equal(xi, out, (size_t)(n * d) * 4);
            ch_guard_check(xi, n * d, "layernorm in place");
            /* a constant row has variance 0: out = b exactly */
            for (int64_t c = 0; c < d; c++) x[c] = 3.25f;
            assert_int_equal(ref()->layernorm(out, x, w, b, 1, d, eps, NULL), FLEXDIAG_OK);
            for (int64_t c = 0; c < d; c++) assert_true(out[c] == flexdiag__bf16_to_f32(b[c]));
            ch_guarded_free(out);
            ch_guarded_free(xi);
            free(x);
            free(want);
            free(w);
            free(b);
        }
    float x[8] = {0}, y[8];
    uint16_t w[8] = {0};
    expect_invalid(ref()->layernorm(y, x, w, w, 1, 0, 1e-5f, NULL), "d = 0");
    expect_invalid(ref()->layernorm(y, x, w, w, 1, 8, NAN, NULL), "eps");
    expect_invalid(ref()->layernorm(y, x, w, NULL, 1, 8, 1e-5f, NULL), "b is NULL");
}

/* qk_norm shapes: GQA, 2 q heads per KV head. */
#define QK_HQ 4
#define QK_HKV 2
#define QK_DH 16

/* One qk_norm case: n rows of (QK_HQ + 2·QK_HKV)·QK_DH against layernorm_naive per head, table
 * rows q_rows (1 or QK_HQ) and k_rows (1 or QK_HKV). q head 0 of row 0 sits far from zero, q head
 * 1 of row 0 and k head 1 of the last row are constant (out = their b row exactly), and the v
 * heads must come back bit for bit. */
static void qk_norm_case(int64_t n, int32_t q_rows, int32_t k_rows, tu_rng *r) {
    const float eps = 1e-5f;
    const int64_t width = (QK_HQ + 2 * QK_HKV) * QK_DH, total = n * width;
    const int64_t v0 = (QK_HQ + QK_HKV) * QK_DH, last = (n - 1) * width;
    float *x = malloc((size_t)total * 4), *want = malloc((size_t)total * 4);
    const size_t qn = (size_t)(q_rows * QK_DH) * 2, kn = (size_t)(k_rows * QK_DH) * 2;
    uint16_t *q_w = malloc(qn), *q_b = malloc(qn), *k_w = malloc(kn), *k_b = malloc(kn);
    tu_fill_f32(r, x, total, 2.0f);
    for (int64_t c = 0; c < QK_DH; c++) {
        x[c] += 50.0f;
        x[QK_DH + c] = -1.5f;
        x[last + (QK_HQ + 1) * QK_DH + c] = 3.25f;
    }
    tu_fill_bf16(r, q_w, q_rows * QK_DH, 1.0f);
    tu_fill_bf16(r, q_b, q_rows * QK_DH, 0.5f);
    tu_fill_bf16(r, k_w, k_rows * QK_DH, 1.0f);
    tu_fill_bf16(r, k_b, k_rows * QK_DH, 0.5f);
    memcpy(want, x, (size_t)total * 4); /* v heads stay */
    for (int64_t i = 0; i < n; i++)
        for (int32_t h = 0; h < QK_HQ + QK_HKV; h++) {
            const int is_q = h < QK_HQ;
            const int32_t rows = is_q ? q_rows : k_rows, hh = is_q ? h : h - QK_HQ;
            const int64_t off = (rows == 1 ? 0 : hh) * QK_DH, col = i * width + h * QK_DH;
            layernorm_naive(want + col, x + col, (is_q ? q_w : k_w) + off,
                            (is_q ? q_b : k_b) + off, 1, QK_DH, eps);
        }
    float *out = ch_guarded(total, 0.0f);
    memcpy(out, x, (size_t)total * 4);
    assert_int_equal(ref()->qk_norm(out, q_w, q_b, k_w, k_b, n, QK_HQ, QK_HKV, QK_DH, q_rows,
                                    k_rows, eps, NULL),
                     FLEXDIAG_OK);
    assert_true(tu_allclose("qk_norm", out, want, total, CH_ATOL, CH_RTOL, CH_NMSE));
    ch_guard_check(out, total, "qk_norm");
    for (int64_t i = 0; i < n; i++)
        assert_memory_equal(out + i * width + v0, x + i * width + v0, QK_HKV * QK_DH * 4);
    const int64_t qb1 = (q_rows == 1 ? 0 : 1) * QK_DH, kb1 = (k_rows == 1 ? 0 : 1) * QK_DH;
    for (int64_t c = 0; c < QK_DH; c++) {
        assert_true(out[QK_DH + c] == flexdiag__bf16_to_f32(q_b[qb1 + c]));
        assert_true(out[last + (QK_HQ + 1) * QK_DH + c] == flexdiag__bf16_to_f32(k_b[kb1 + c]));
    }
    ch_guarded_free(out);
    free(x), free(want), free(q_w), free(q_b), free(k_w), free(k_b);
}

static void test_qk_norm(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 11);
    for (int ni = 0; ni < 3; ni++) {
        qk_norm_case(n_list[ni], 1, 1, &r);          /* Lumina-mGPT: one row per table */
        qk_norm_case(n_list[ni], QK_HQ, QK_HKV, &r); /* the converter's per-head rows */
        qk_norm_case(n_list[ni], 1, QK_HKV, &r);
        qk_norm_case(n_list[ni], QK_HQ, 1, &r);
    }
    float x[(QK_HQ + 2 * QK_HKV) * QK_DH] = {0};
    uint16_t w[QK_HQ * QK_DH] = {0};
    expect_invalid(ref()->qk_norm(x, w, w, w, w, 1, QK_HQ, QK_HKV, QK_DH, 2, 1, 1e-5f, NULL),
                   "q_rows = 2: must be 1 or h_q = 4");
    expect_invalid(ref()->qk_norm(x, w, w, w, w, 1, QK_HQ, QK_HKV, QK_DH, 1, QK_HQ, 1e-5f, NULL),
                   "k_rows = 4: must be 1 or h_kv = 2");
    expect_invalid(ref()->qk_norm(x, w, w, w, w, 1, QK_HQ, QK_HKV, QK_DH, 0, 1, 1e-5f, NULL),
                   "q_rows = 0");
    expect_invalid(ref()->qk_norm(x, w, w, w, w, 1, QK_HQ, QK_HKV, 0, 1, 1, 1e-5f, NULL),
                   "d_h = 0");
    expect_invalid(ref()->qk_norm(x, w, w, w, w, 1, QK_HQ, QK_HKV, QK_DH, 1, 1, NAN, NULL), "eps");
    expect_invalid(ref()->qk_norm(x, w, w, w, NULL, 1, QK_HQ, QK_HKV, QK_DH, 1, 1, 1e-5f, NULL),
                   "k_b is NULL");
    expect_invalid(ref()->qk_norm(x, w, w, w, w, -1, QK_HQ, QK_HKV, QK_DH, 1, 1, 1e-5f, NULL),
                   "n = -1");
    assert_int_equal(ref()->qk_norm(NULL, NULL, NULL, NULL, NULL, 0, QK_HQ, QK_HKV, QK_DH, 1, 1,
                                    1e-5f, NULL),
                     FLEXDIAG_OK);
}

/* Closed-form rotate-half RoPE of one head in double (docs/architecture.md §9). */
static void rope_closed_form(double *out, const float *x, int32_t pos, int32_t d_h, double theta) {
    int32_t half = d_h / 2;
    for (int32_t i = 0; i < half; i++) {
        double ang = pos * pow(theta, -2.0 * i / d_h);
        out[i] = x[i] * cos(ang) - x[i + half] * sin(ang);
        out[i + half] = x[i + half] * cos(ang) + x[i] * sin(ang);
    }
}

static void test_rope(void **state) {
    (void)state;
    /* (n, n_heads, d_h, col0, stride) */
    static const int64_t cases[][5] = {{1, 1, 8, 0, 8}, {3, 2, 24, 8, 64}, {17, 3, 130, 5, 400}};
    tu_rng r;
    tu_rng_seed(&r, 5);
    for (int ci = 0; ci < 3; ci++) {
        int64_t n = cases[ci][0], stride = cases[ci][4], col0 = cases[ci][3];
        int32_t heads = (int32_t)cases[ci][1], d_h = (int32_t)cases[ci][2];
        float theta = ci == 2 ? 500000.0f : 10000.0f;
        float *x = ch_guarded(n * stride, 0.0f), *x0 = malloc((size_t)(n * stride) * 4);
        float *want = malloc((size_t)(n * stride) * 4);
        double *head = malloc((size_t)d_h * sizeof(double));
        int32_t pos[17];
        tu_fill_f32(&r, x, n * stride, 1.0f);
        memcpy(x0, x, (size_t)(n * stride) * 4);
        memcpy(want, x, (size_t)(n * stride) * 4);
        for (int64_t i = 0; i < n; i++) pos[i] = i == 0 ? 0 : (int32_t)tu_rng_int(&r, 1, 1000);
        for (int64_t i = 0; i < n; i++)
            for (int32_t h = 0; h < heads; h++) {
                int64_t off = i * stride + col0 + (int64_t)h * d_h;
                rope_closed_form(head, x0 + off, pos[i], d_h, theta);
                for (int32_t c = 0; c < d_h; c++) want[off + c] = (float)head[c];
            }
        assert_int_equal(flexdiag__cpu_ref_rope(x, pos, n, stride, col0, heads, d_h, theta, NULL),
                         FLEXDIAG_OK);
        /* columns outside the rotated heads come back unchanged (want holds them as copied) */
        assert_true(tu_allclose("rope", x, want, n * stride, CH_ATOL, CH_RTOL, CH_NMSE));
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < stride; c++)
                if (c < col0 || c >= col0 + (int64_t)heads * d_h)
                    assert_memory_equal(&x[i * stride + c], &x0[i * stride + c], 4);
        ch_guard_check(x, n * stride, "rope");
        ch_guarded_free(x);
        free(x0);
        free(want);
        free(head);
    }
    float x[16] = {0};
    int32_t pos[1] = {0};
    expect_invalid(flexdiag__cpu_ref_rope(x, pos, 1, 16, 0, 2, 7, 10000.0f, NULL), "even d_h");
    expect_invalid(flexdiag__cpu_ref_rope(x, pos, 1, 16, 4, 2, 8, 10000.0f, NULL), "stride");
}

static void test_swiglu_gelu(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 6);
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++) {
            int64_t n = n_list[ni], f = d_list[di];
            float *gu = malloc((size_t)(n * 2 * f) * 4), *want = malloc((size_t)(n * f) * 4);
            tu_fill_f32(&r, gu, n * 2 * f, 3.0f);
            gu[0] = -100.0f; /* silu far left: exp(100) overflows to inf, result -0 */
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < f; j++) {
                    double g = gu[i * 2 * f + j], u = gu[i * 2 * f + f + j];
                    want[i * f + j] = (float)(g / (1.0 + exp(-g)) * u);
                }
            float *out = ch_guarded(n * f, 0.0f);
            assert_int_equal(ref()->swiglu(out, gu, n, f, NULL), FLEXDIAG_OK);
            assert_true(tu_allclose("swiglu", out, want, n * f, CH_ATOL, CH_RTOL, CH_NMSE));
            ch_guard_check(out, n * f, "swiglu");
            ch_guarded_free(out);

            float *x = ch_guarded(n * f, 0.0f);
            tu_fill_f32(&r, x, n * f, 4.0f);
            x[0] = -20.0f;
            for (int64_t i = 0; i < n * f; i++)
                want[i] = (float)(0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0))));
            assert_int_equal(ref()->gelu(x, n * f, NULL), FLEXDIAG_OK);
            assert_true(tu_allclose("gelu", x, want, n * f, CH_ATOL, CH_RTOL, CH_NMSE));
            ch_guard_check(x, n * f, "gelu");
            ch_guarded_free(x);
            free(gu);
            free(want);
        }
}

/* ReLU is exact: x < 0 becomes +0, everything else keeps its bits (-0 and NaN included). */
static void test_relu(void **state) {
    (void)state;
    const float specials[] = {-1.0f, -0.0f, 0.0f, 2.5f, NAN, -INFINITY, INFINITY, -1e-40f};
    const float want_sp[] = {0.0f, -0.0f, 0.0f, 2.5f, NAN, 0.0f, INFINITY, 0.0f};
    tu_rng r;
    tu_rng_seed(&r, 11);
    for (int di = 0; di < 3; di++) {
        int64_t n = d_list[di] * 3;
        float *x = ch_guarded(n, 0.0f), *want = malloc((size_t)n * 4);
        tu_fill_f32(&r, x, n, 2.0f);
        memcpy(x, specials, sizeof specials);
        for (int64_t i = 0; i < n; i++) want[i] = x[i] < 0.0f ? 0.0f : x[i];
        memcpy(want, want_sp, sizeof want_sp);
        assert_int_equal(ref()->relu(x, n, NULL), FLEXDIAG_OK);
        for (int64_t i = 0; i < n; i++)
            if (!(isnan(x[i]) && isnan(want[i]))) assert_memory_equal(&x[i], &want[i], 4);
        assert_true(isnan(x[4]));
        ch_guard_check(x, n, "relu");
        ch_guarded_free(x);
        free(want);
    }
    expect_invalid(ref()->relu(NULL, -1, NULL), "n = -1");
    expect_invalid(ref()->relu(NULL, 4, NULL), "x is NULL");
}

static void test_cfg_combine(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 7);
    const float ws[] = {0.0f, 1.0f, 5.0f};
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++) {
            int64_t np = n_list[ni], V = d_list[di] * 3 + 1;
            float *logits = malloc((size_t)(2 * np * V) * 4), *want = malloc((size_t)(np * V) * 4);
            tu_fill_f32(&r, logits, 2 * np * V, 2.0f);
            float w = ws[di];
            for (int64_t i = 0; i < np; i++)
                for (int64_t j = 0; j < V; j++) {
                    double c = logits[2 * i * V + j], u = logits[(2 * i + 1) * V + j];
                    want[i * V + j] = (float)(u + w * (c - u));
                }
            float *out = ch_guarded(np * V, 0.0f);
            assert_int_equal(ref()->cfg_combine(out, logits, np, V, w, NULL), FLEXDIAG_OK);
            /* w = 5 amplifies the rounding of c - u by 5: up to ~3 ulp of the result, so the
             * relative tolerance is 3× the fp32 default there */
            double rtol = w > 1.0f ? 3 * CH_RTOL : CH_RTOL;
            assert_true(tu_allclose("cfg_combine", out, want, np * V, CH_ATOL, rtol, CH_NMSE));
            ch_guard_check(out, np * V, "cfg_combine");
            ch_guarded_free(out);
            free(logits);
            free(want);
        }
}

/* ---- matmul ---- */

/* want (n, m) = x·Wᵀ + b (+ old) in double, rounded. */
static void matmul_naive(float *want, const float *old, const float *x, const uint16_t *w,
                         const uint16_t *b, int64_t n, int64_t k, int64_t m, int accum) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double acc = b ? flexdiag__bf16_to_f32(b[j]) : 0.0;
            for (int64_t c = 0; c < k; c++)
                acc += (double)x[i * k + c] * flexdiag__bf16_to_f32(w[j * k + c]);
            want[i * m + j] = (float)(accum ? old[i * m + j] + acc : acc);
        }
}

static void test_matmul(void **state) {
    (void)state;
    static const int64_t m_list[] = {1, 3, 17, 33};
    static const unsigned flag_list[] = {0, FLEXDIAG_MM_ACCUM, FLEXDIAG_MM_OUT_F32};
    tu_rng r;
    tu_rng_seed(&r, 8);
    for (int ni = 0; ni < 3; ni++)
        for (int ki = 0; ki < 3; ki++)
            for (int mi = 0; mi < 4; mi++)
                for (int fi = 0; fi < 3; fi++) {
                    int64_t n = n_list[ni], k = d_list[ki], m = m_list[mi];
                    float *x = malloc((size_t)(n * k) * 4), *old = malloc((size_t)(n * m) * 4);
                    float *want = malloc((size_t)(n * m) * 4);
                    uint16_t *w = malloc((size_t)(m * k) * 2), *b = malloc((size_t)m * 2);
                    tu_fill_f32(&r, x, n * k, 1.0f);
                    tu_fill_f32(&r, old, n * m, 1.0f);
                    tu_fill_bf16(&r, w, m * k, 1.0f / sqrtf((float)k)); /* unit-scale outputs */
                    tu_fill_bf16(&r, b, m, 0.1f);
                    const uint16_t *bias = (mi + fi) % 2 ? b : NULL;
                    int accum = flag_list[fi] == FLEXDIAG_MM_ACCUM;
                    matmul_naive(want, old, x, w, bias, n, k, m, accum);
                    float *out = ch_guarded(n * m, 0.0f);
                    memcpy(out, old, (size_t)(n * m) * 4);
                    assert_int_equal(ref()->matmul(out, x, w, bias, n, k, m, flag_list[fi], NULL),
                                     FLEXDIAG_OK);
                    assert_true(tu_allclose("matmul", out, want, n * m, CH_ATOL, CH_RTOL, CH_NMSE));
                    ch_guard_check(out, n * m, "matmul");
                    ch_guarded_free(out);
                    free(x);
                    free(old);
                    free(want);
                    free(w);
                    free(b);
                }
    float o[4], x[4] = {0};
    uint16_t w[4] = {0};
    expect_invalid(
        ref()->matmul(o, x, w, NULL, 1, 4, 1, FLEXDIAG_MM_ACCUM | FLEXDIAG_MM_OUT_F32, NULL),
        "ACCUM");
    expect_invalid(ref()->matmul(o, x, w, NULL, -1, 4, 1, 0, NULL), "n = -1");
    expect_invalid(ref()->matmul(o, x, w, NULL, 1, 4, 1, 8, NULL), "flags");
}

/* ---- KV append (exact) ---- */

static void test_kv_append(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 9);
    for (size_t ci = 0; ci < N_ATTN_CASES; ci++)
        for (int32_t tps = 1; tps <= 3; tps += 2) {
            ch_attn_fix f;
            ch_attn_fix_init(&f, &attn_cases[ci], 100 + ci);
            const flexdiag_attn_args *a = &f.a;
            int64_t n_tok = (int64_t)a->n_seq * tps, block = (int64_t)a->p_cap + a->ring;
            float *qkv = malloc((size_t)(n_tok * f.width) * 4);
            int32_t *rows = malloc((size_t)(n_tok * a->h_kv) * 4);
            tu_fill_f32(&r, qkv, n_tok * f.width, 1.0f);
            /* one token per sequence: a random ring row (decode); three: distinct prompt-side
             * rows t + h of each (sequence, head) (prefill) */
            for (int64_t i = 0; i < n_tok; i++)
                for (int32_t h = 0; h < a->h_kv; h++)
                    rows[i * a->h_kv + h] = tps == 1
                                                ? a->p_cap + (int32_t)tu_rng_int(&r, 0, a->ring - 1)
                                                : (int32_t)((i % tps + h) % block);
            float *k = ch_guarded(f.cache_n, 0.0f), *v = ch_guarded(f.cache_n, 0.0f);
            memcpy(k, f.k, (size_t)f.cache_n * 4);
            memcpy(v, f.v, (size_t)f.cache_n * 4);
            float *wk = malloc((size_t)f.cache_n * 4), *wv = malloc((size_t)f.cache_n * 4);
            memcpy(wk, f.k, (size_t)f.cache_n * 4);
            memcpy(wv, f.v, (size_t)f.cache_n * 4);
            for (int64_t i = 0; i < n_tok; i++)
                for (int32_t h = 0; h < a->h_kv; h++) {
                    int64_t dst =
                        (((i / tps) * a->h_kv + h) * block + rows[i * a->h_kv + h]) * a->d_h;
                    for (int32_t c = 0; c < a->d_h; c++) {
                        wk[dst + c] = qkv[i * f.width + (int64_t)(a->h_q + h) * a->d_h + c];
                        wv[dst + c] =
                            qkv[i * f.width + (int64_t)(a->h_q + a->h_kv + h) * a->d_h + c];
                    }
                }
            float *qkv0 = malloc((size_t)(n_tok * f.width) * 4);
            memcpy(qkv0, qkv, (size_t)(n_tok * f.width) * 4);
            assert_int_equal(ref()->kv_append(k, v, qkv, rows, n_tok, tps, a, NULL), FLEXDIAG_OK);
            /* without positions qkv is only read */
            assert_memory_equal(qkv, qkv0, (size_t)(n_tok * f.width) * 4);
            free(qkv0);
            assert_memory_equal(k, wk, (size_t)f.cache_n * 4);
            assert_memory_equal(v, wv, (size_t)f.cache_n * 4);
            ch_guard_check(k, f.cache_n, "kv_append k");
            ch_guard_check(v, f.cache_n, "kv_append v");
            rows[0] = (int32_t)block;
            expect_invalid(ref()->kv_append(k, v, qkv, rows, n_tok, tps, a, NULL), "rows[token 0]");
            expect_invalid(ref()->kv_append(k, v, qkv, rows, n_tok + 1, tps, a, NULL), "n_tok");
            ch_guarded_free(k);
            ch_guarded_free(v);
            free(wk);
            free(wv);
            free(qkv);
            free(rows);
            ch_attn_fix_free(&f);
        }
}

/* kv_append with positions on (qkv, k, v) equals RoPE on the q and k heads of qkv followed by the
 * plain append, bit for bit; a rejected call leaves qkv unrotated. */
static void kv_append_rope_case(const ch_attn_fix *f, const float *qkv0, const int32_t *rows,
                                const int32_t *pos, int64_t n_tok, int32_t tps, float theta) {
    const flexdiag_attn_args *a = &f->a;
    size_t qkv_bytes = (size_t)(n_tok * f->width) * 4, cache_bytes = (size_t)f->cache_n * 4;
    float *qkv = ch_guarded(n_tok * f->width, 0.0f), *want_qkv = malloc(qkv_bytes);
    float *k = ch_guarded(f->cache_n, 0.0f), *v = ch_guarded(f->cache_n, 0.0f);
    float *wk = malloc(cache_bytes), *wv = malloc(cache_bytes);
    memcpy(qkv, qkv0, qkv_bytes);
    memcpy(want_qkv, qkv0, qkv_bytes);
    memcpy(k, f->k, cache_bytes);
    memcpy(v, f->v, cache_bytes);
    memcpy(wk, f->k, cache_bytes);
    memcpy(wv, f->v, cache_bytes);
    assert_int_equal(flexdiag__cpu_ref_rope(want_qkv, pos, n_tok, f->width, 0, a->h_q + a->h_kv,
                                            a->d_h, theta, NULL),
                     FLEXDIAG_OK);
    assert_int_equal(ref()->kv_append(wk, wv, want_qkv, rows, n_tok, tps, a, NULL), FLEXDIAG_OK);
    flexdiag_attn_args ar = *a;
    ar.pos = pos;
    ar.rope_theta = theta;
    assert_int_equal(ref()->kv_append(k, v, qkv, rows, n_tok, tps, &ar, NULL), FLEXDIAG_OK);
    assert_memory_equal(qkv, want_qkv, qkv_bytes);
    assert_memory_equal(k, wk, cache_bytes);
    assert_memory_equal(v, wv, cache_bytes);
    ch_guard_check(qkv, n_tok * f->width, "kv_append rope qkv");
    ch_guard_check(k, f->cache_n, "kv_append rope k");
    ch_guard_check(v, f->cache_n, "kv_append rope v");
    /* rejected calls: nothing rotated */
    memcpy(qkv, qkv0, qkv_bytes);
    ar.rope_theta = 0.0f;
    expect_invalid(ref()->kv_append(k, v, qkv, rows, n_tok, tps, &ar, NULL), "rope_theta");
    ar.rope_theta = theta;
    expect_invalid(ref()->kv_append(k, v, qkv, rows, n_tok + 1, tps, &ar, NULL), "n_tok");
    assert_memory_equal(qkv, qkv0, qkv_bytes);
    ar.d_h = a->d_h - 1;
    expect_invalid(ref()->kv_append(k, v, qkv, rows, n_tok, tps, &ar, NULL), "odd");
    ch_guarded_free(qkv);
    ch_guarded_free(k);
    ch_guarded_free(v);
    free(want_qkv);
    free(wk);
    free(wv);
}

static void test_kv_append_rope(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 19);
    for (size_t ci = 0; ci < N_ATTN_CASES; ci++)
        for (int32_t tps = 1; tps <= 3; tps += 2) {
            ch_attn_fix f;
            ch_attn_fix_init(&f, &attn_cases[ci], 200 + ci);
            int64_t n_tok = (int64_t)f.a.n_seq * tps, block = (int64_t)f.a.p_cap + f.a.ring;
            float *qkv0 = malloc((size_t)(n_tok * f.width) * 4);
            int32_t *rows = malloc((size_t)(n_tok * f.a.h_kv) * 4);
            int32_t *pos = malloc((size_t)n_tok * 4);
            tu_fill_f32(&r, qkv0, n_tok * f.width, 1.0f);
            for (int64_t i = 0; i < n_tok; i++) {
                pos[i] = i == 0 ? 0 : (int32_t)tu_rng_int(&r, 1, 20000);
                for (int32_t h = 0; h < f.a.h_kv; h++)
                    rows[i * f.a.h_kv + h] = (int32_t)((i % tps + h) % block);
            }
            kv_append_rope_case(&f, qkv0, rows, pos, n_tok, tps, ci % 2 ? 1e6f : 10000.0f);
            free(qkv0);
            free(rows);
            free(pos);
            ch_attn_fix_free(&f);
        }
}

/* ---- attention vs double ---- */

/* Softmax attention of q over the listed rows in double; returns lse, fills out and z. */
static double attend_naive(double *out, double *z, const float *q, const float *kb, const float *vb,
                           const int64_t *rows, int64_t n, int32_t d_h, double scale) {
    double m = -INFINITY, l = 0;
    for (int64_t j = 0; j < n; j++) {
        double dot = 0;
        for (int32_t i = 0; i < d_h; i++) dot += (double)q[i] * kb[rows[j] * d_h + i];
        z[j] = scale * dot;
        m = fmax(m, z[j]);
    }
    for (int64_t j = 0; j < n; j++) l += exp(z[j] - m);
    for (int32_t i = 0; i < d_h; i++) out[i] = 0;
    for (int64_t j = 0; j < n; j++)
        for (int32_t i = 0; i < d_h; i++) out[i] += exp(z[j] - m) / l * vb[rows[j] * d_h + i];
    return n > 0 ? m + log(l) : -INFINITY;
}

static void test_attn_decode(void **state) {
    (void)state;
    for (size_t ci = 0; ci < N_ATTN_CASES; ci++) {
        ch_attn_fix f;
        ch_attn_fix_init(&f, &attn_cases[ci], 200 + ci);
        flexdiag_attn_args a = f.a;
        int32_t g = a.h_q / a.h_kv, d_h = a.d_h;
        int64_t n_out = (int64_t)a.n_seq * a.h_q * d_h, n_hq = (int64_t)a.n_seq * a.h_q;
        int64_t n_log = n_hq * a.max_slots, block = (int64_t)a.p_cap + a.ring;
        float *want = malloc((size_t)n_out * 4), *want_lse = malloc((size_t)n_hq * 4);
        float *want_log = malloc((size_t)(n_log + 1) * 4);
        int64_t *rows = malloc((size_t)(block + 1) * sizeof(int64_t));
        double *o = malloc((size_t)d_h * sizeof(double)), *z = malloc((size_t)(block + 1) * 8);
        for (int64_t i = 0; i < n_log; i++) want_log[i] = 555.0f; /* untouched past n_slots */
        for (int64_t s = 0; s < a.n_seq; s++)
            for (int32_t hq = 0; hq < a.h_q; hq++) {
                int64_t sh = s * a.h_kv + hq / g, shq = s * a.h_q + hq, n = 0;
                for (int32_t j = 0; j < a.lp[s]; j++) rows[n++] = j;
                for (int32_t j = 0; j < a.n_slots[sh]; j++)
                    rows[n++] = a.p_cap + a.slots[sh * a.max_slots + j];
                double lse = attend_naive(o, z, f.qkv_dec + s * f.width + (int64_t)hq * d_h,
                                          f.k + sh * block * d_h, f.v + sh * block * d_h, rows, n,
                                          d_h, a.scale);
                for (int32_t i = 0; i < d_h; i++) want[shq * d_h + i] = (float)o[i];
                want_lse[shq] = (float)lse;
                for (int32_t j = 0; j < a.n_slots[sh]; j++)
                    want_log[shq * a.max_slots + j] = (float)z[a.lp[s] + j];
            }
        float *out = ch_guarded(n_out, 9.0f), *lse = ch_guarded(n_hq, 9.0f);
        float *logits = ch_guarded(n_log, 555.0f);
        a.logits_out = logits;
        a.lse_out = lse;
        assert_int_equal(ref()->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), FLEXDIAG_OK);
        assert_true(tu_allclose("attn_decode out", out, want, n_out, CH_ATOL, CH_RTOL, CH_NMSE));
        assert_true(tu_allclose("attn_decode lse", lse, want_lse, n_hq, CH_ATOL, CH_RTOL, CH_NMSE));
        assert_true(
            tu_allclose("attn_decode logits", logits, want_log, n_log, CH_ATOL, CH_RTOL, CH_NMSE));
        ch_guard_check(out, n_out, "attn_decode out");
        ch_guard_check(lse, n_hq, "attn_decode lse");
        ch_guard_check(logits, n_log, "attn_decode logits");
        /* without the optional outputs */
        a.logits_out = NULL;
        a.lse_out = NULL;
        assert_int_equal(ref()->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), FLEXDIAG_OK);
        assert_true(tu_allclose("attn_decode out", out, want, n_out, CH_ATOL, CH_RTOL, CH_NMSE));
        ch_guarded_free(out);
        ch_guarded_free(lse);
        ch_guarded_free(logits);
        free(want);
        free(want_lse);
        free(want_log);
        free(rows);
        free(o);
        free(z);
        ch_attn_fix_free(&f);
    }
}

static void test_attn_prefill(void **state) {
    (void)state;
    for (size_t ci = 0; ci < N_ATTN_CASES; ci++) {
        ch_attn_fix f;
        ch_attn_fix_init(&f, &attn_cases[ci], 300 + ci);
        const flexdiag_attn_args *a = &f.a;
        int32_t g = a->h_q / a->h_kv, d_h = a->d_h;
        int64_t out_w = (int64_t)a->h_q * d_h, n_out = (int64_t)a->n_seq * a->p_cap * out_w;
        int64_t block = (int64_t)a->p_cap + a->ring;
        float *want = calloc((size_t)n_out + 1, 4);
        int64_t *rows = malloc((size_t)(a->p_cap + 1) * sizeof(int64_t));
        double *o = malloc((size_t)d_h * 8), *z = malloc((size_t)(a->p_cap + 1) * 8);
        for (int64_t j = 0; j < a->p_cap; j++) rows[j] = j;
        for (int64_t s = 0; s < a->n_seq; s++)
            for (int64_t r = 0; r < a->lp[s]; r++)
                for (int32_t hq = 0; hq < a->h_q; hq++) {
                    int64_t sh = s * a->h_kv + hq / g, row = s * a->p_cap + r;
                    attend_naive(o, z, f.qkv_pre + row * f.width + (int64_t)hq * d_h,
                                 f.k + sh * block * d_h, f.v + sh * block * d_h, rows, r + 1, d_h,
                                 a->scale);
                    for (int32_t i = 0; i < d_h; i++)
                        want[row * out_w + hq * d_h + i] = (float)o[i];
                }
        float *out = ch_guarded(n_out, 9.0f); /* rows past lp must be overwritten with zeros */
        assert_int_equal(ref()->attn_prefill(out, f.qkv_pre, f.k, f.v, a, NULL), FLEXDIAG_OK);
        assert_true(tu_allclose("attn_prefill", out, want, n_out, CH_ATOL, CH_RTOL, CH_NMSE));
        ch_guard_check(out, n_out, "attn_prefill");
        ch_guarded_free(out);
        free(want);
        free(rows);
        free(o);
        free(z);
        ch_attn_fix_free(&f);
    }
}

/* Bad attention arguments are rejected by both tables before any cache access. */
static void test_attn_errors(void **state) {
    (void)state;
    ch_attn_fix f;
    ch_attn_fix_init(&f, &attn_cases[1], 400);
    float *out = malloc((size_t)(f.a.n_seq * f.a.p_cap * f.a.h_q * f.a.d_h) * 4);
    const flexdiag_kernels *tabs[] = {flexdiag__kernels_cpu_ref(), flexdiag__kernels_cpu()};
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *K = tabs[t];
        flexdiag_attn_args a = f.a;
        a.h_q = 3;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), "multiple of h_kv");
        expect_invalid(K->attn_prefill(out, f.qkv_pre, f.k, f.v, &a, NULL), "multiple of h_kv");
        a = f.a;
        f.lp[2] = a.p_cap + 1;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), "lp[2]");
        expect_invalid(K->attn_prefill(out, f.qkv_pre, f.k, f.v, &a, NULL), "lp[2]");
        f.lp[2] = 0;
        int32_t keep = f.slots[0];
        f.n_slots[0] = 1;
        f.slots[0] = a.ring;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), "outside the ring");
        f.slots[0] = keep;
        f.n_slots[0] = a.max_slots + 1;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), "n_slots[seq 0]");
        f.n_slots[0] = 1;
        /* which lists are read, and their names, follow shared_slots */
        int32_t keep2 = f.n_slots[2];
        f.n_slots[2] = a.max_slots + 1;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL),
                       "n_slots[seq 1][head 0] =");
        a.shared_slots = FLEXDIAG_SLOTS_PER_SEQ;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), "n_slots[seq 2] =");
        a.shared_slots = FLEXDIAG_SLOTS_ONE; /* list 0 alone */
        assert_int_equal(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), FLEXDIAG_OK);
        a.shared_slots = 3;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), "shared_slots = 3");
        a.shared_slots = FLEXDIAG_SLOTS_PER_HEAD;
        f.n_slots[2] = keep2;
        a.lp = NULL;
        expect_invalid(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, NULL), "lp is NULL");
    }
    free(out);
    ch_attn_fix_free(&f);
}

/* ---- decode epilogue: probabilities and the fused Diagonal update ---- */

/* The two CPU tables: 0 the reference, 1 the fast one (run on a 3-worker stream below). */
static const flexdiag_kernels *epi_table(int t) {
    return t == 0 ? flexdiag__kernels_cpu_ref() : flexdiag__kernels_cpu();
}

/* probs of the call equal expf(logits - lse) computed here from its own outputs, bit for bit;
 * columns past n_slots keep the fill (a head with no keys has n_slots 0: nothing written). */
static void check_probs(const ch_attn_fix *f, const float *probs, const float *logits,
                        const float *lse) {
    const flexdiag_attn_args *a = &f->a;
    int32_t g = a->h_q / a->h_kv;
    for (int64_t s = 0; s < a->n_seq; s++)
        for (int32_t hq = 0; hq < a->h_q; hq++) {
            int64_t shq = s * a->h_q + hq;
            int32_t ns = a->n_slots[s * a->h_kv + hq / g];
            for (int32_t c = 0; c < a->max_slots; c++) {
                float z = logits[shq * a->max_slots + c], want = 555.0f;
                if (c < ns) want = lse[shq] == -INFINITY ? 0.0f : expf(z - lse[shq]);
                if (memcmp(&probs[shq * a->max_slots + c], &want, 4) != 0)
                    fail_msg("probs[seq %lld][head %d][%d] = %.9g, want %.9g", (long long)s, hq,
                             c, (double)probs[shq * a->max_slots + c], (double)want);
            }
        }
}

static void test_attn_decode_probs(void **state) {
    (void)state;
    static const size_t cases[] = {0, 3, 2, 4}; /* MHA (g = 1), then GQA g = 4 */
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const flexdiag_kernels *K = epi_table(t);
            flexdiag_stream *s = ch_stream(K, t == 0 ? -1 : 3);
            ch_attn_fix f;
            ch_attn_fix_init(&f, &attn_cases[cases[i]], 700 + cases[i]);
            flexdiag_attn_args a = f.a;
            int64_t n_hq = (int64_t)a.n_seq * a.h_q, n_log = n_hq * a.max_slots;
            float *out = ch_guarded(n_hq * a.d_h, 9.0f), *lse = ch_guarded(n_hq, 9.0f);
            float *logits = ch_guarded(n_log, 555.0f), *probs = ch_guarded(n_log, 555.0f);
            a.logits_out = logits;
            a.lse_out = lse;
            a.probs_out = probs;
            assert_int_equal(K->attn_decode(out, f.qkv_dec, f.k, f.v, &a, s), FLEXDIAG_OK);
            check_probs(&f, probs, logits, lse);
            ch_guard_check(probs, n_log, "attn_decode probs");
            /* sequence 1 of the fixture: lp 0 and no slots on KV head 0: lse -inf */
            if (a.n_seq > 1) assert_true(lse[a.h_q] == -INFINITY && f.n_slots[a.h_kv] == 0);
            /* probs only: logits and lse go through scratch, results unchanged */
            float *out2 = ch_guarded(n_hq * a.d_h, 9.0f), *probs2 = ch_guarded(n_log, 555.0f);
            a.logits_out = a.lse_out = NULL;
            a.probs_out = probs2;
            assert_int_equal(K->attn_decode(out2, f.qkv_dec, f.k, f.v, &a, s), FLEXDIAG_OK);
            assert_memory_equal(probs2, probs, (size_t)n_log * 4);
            assert_memory_equal(out2, out, (size_t)(n_hq * a.d_h) * 4);
            ch_guard_check(probs2, n_log, "attn_decode probs (scratch)");
            ch_guard_check(out2, n_hq * a.d_h, "attn_decode out (scratch)");
            ch_guarded_free(out);
            ch_guarded_free(lse);
            ch_guarded_free(logits);
            ch_guarded_free(probs);
            ch_guarded_free(out2);
            ch_guarded_free(probs2);
            K->stream_destroy(s);
            ch_attn_fix_free(&f);
        }
}

/* (n_seq, h_q, h_kv, d_h, p_cap, a, base); at least 4 lists: every kind of diag_fixture.h */
static const df_case diag_cases[] = {
    {3, 4, 4, 24, 5, 6, 0},   {3, 4, 4, 24, 5, 6, 4},   /* g = 1 */
    {3, 8, 2, 40, 9, 9, 0},   {3, 8, 2, 40, 9, 9, 4},   /* g = 4 */
    {4, 4, 1, 24, 70, 37, 0}, {4, 4, 1, 24, 70, 37, 4}, /* g = 4, candidates past 32 keys */
};
#define N_DIAG_CASES (sizeof diag_cases / sizeof diag_cases[0])

/* Per list: exactly one entry replaced when it has candidates and its sequence s a new lag
 * (next[s] >= 0), none otherwise; a structured list's two tied entries have bitwise-equal
 * logits and the larger lag is the one replaced, by next[s]. */
static void check_diag_lists(const df_fix *d, const df_out *o) {
    const flexdiag_attn_args *a = &d->f.a;
    int32_t g = a->h_q / a->h_kv;
    for (int64_t li = 0; li < (int64_t)a->n_seq * a->h_kv; li++) {
        const int16_t *got = o->lag + li * a->diag_a, *lag0 = d->lag0 + li * a->diag_a;
        int32_t ns = a->n_slots[li], changed = 0, next = d->next[li / a->h_kv];
        for (int32_t e = 0; e < a->diag_a; e++) changed += got[e] != lag0[e];
        assert_int_equal(changed, ns > a->diag_base && next >= 0 ? 1 : 0);
        int32_t e1 = d->tie[2 * li], e2 = d->tie[2 * li + 1];
        if (e1 < 0 || next < 0) continue;
        const float *z = o->logits + ((li / a->h_kv) * a->h_q + (li % a->h_kv) * g) * a->max_slots;
        for (int32_t q = 0; q < g; q++)
            assert_memory_equal(&z[q * a->max_slots + ns - 1 - e1],
                                &z[q * a->max_slots + ns - 1 - e2], 4);
        int32_t win = lag0[e1] > lag0[e2] ? e1 : e2;
        assert_int_equal(got[win], next);
    }
}

/* diag_next[s] < 0 for the odd sequences s of d (run o had every sequence updated): their
 * lists keep lag0, the even ones' lists and every probability come out as in o. */
static void check_diag_skip(const flexdiag_kernels *K, flexdiag_stream *s, df_fix *d,
                            const df_out *o) {
    const flexdiag_attn_args *a = &d->f.a;
    for (int32_t sq = 1; sq < a->n_seq; sq += 2) d->next[sq] = -1 - sq;
    df_out os = df_run(K, s, d, 1);
    check_diag_lists(d, &os);
    int64_t per_seq = (int64_t)a->h_kv * a->diag_a;
    for (int32_t sq = 0; sq < a->n_seq; sq++) {
        const int16_t *want = (sq % 2 ? d->lag0 : o->lag) + sq * per_seq;
        assert_memory_equal(os.lag + sq * per_seq, want, (size_t)per_seq * sizeof *want);
    }
    assert_memory_equal(os.probs, o->probs, (size_t)(a->n_seq * a->h_q * a->max_slots) * 4);
    for (int32_t sq = 1; sq < a->n_seq; sq += 2) d->next[sq] = DF_NEXT + sq;
    df_out_free(&os);
}

static void test_attn_decode_diag(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t ci = 0; ci < N_DIAG_CASES; ci++)
            for (int structured = 0; structured < 2; structured++) {
                const flexdiag_kernels *K = epi_table(t);
                flexdiag_stream *s = ch_stream(K, t == 0 ? -1 : 3);
                df_fix d;
                df_init(&d, &diag_cases[ci], structured, 800 + 2 * ci + (size_t)structured);
                df_out o = df_run(K, s, &d, 1);
                int16_t *want = malloc((size_t)d.n_lag * sizeof *want);
                assert_non_null(want);
                df_expect(&d, o.logits, want);
                assert_memory_equal(o.lag, want, (size_t)d.n_lag * sizeof *want);
                check_diag_lists(&d, &o);
                check_probs(&d.f, o.probs, o.logits, o.lse);
                /* without logits_out / lse_out: the same update and probabilities */
                df_out o2 = df_run(K, s, &d, 0);
                assert_memory_equal(o2.lag, o.lag, (size_t)d.n_lag * sizeof *want);
                assert_memory_equal(o2.probs, o.probs,
                                    (size_t)(d.f.a.n_seq * d.f.a.h_q * d.f.a.max_slots) * 4);
                check_diag_skip(K, s, &d, &o);
                df_out_free(&o);
                df_out_free(&o2);
                free(want);
                K->stream_destroy(s);
                df_free(&d);
            }
}

/* Bad fused-update arguments are rejected by both tables, with no lag written. */
static void test_attn_diag_errors(void **state) {
    (void)state;
    df_fix d;
    df_init(&d, &diag_cases[1], 0, 900);
    int64_t n_out = (int64_t)d.f.a.n_seq * d.f.a.h_q * d.f.a.d_h;
    float *out = malloc((size_t)n_out * 4);
    int16_t *lag = malloc((size_t)d.n_lag * sizeof *lag);
    memcpy(lag, d.lag0, (size_t)d.n_lag * sizeof *lag);
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *K = epi_table(t);
        flexdiag_attn_args a = d.f.a;
        a.diag_lag = lag;
        for (a.shared_slots = 1; a.shared_slots <= 2; a.shared_slots++)
            expect_invalid(K->attn_decode(out, d.f.qkv_dec, d.f.k, d.f.v, &a, NULL),
                           "shared_slots");
        a = d.f.a;
        a.diag_lag = lag;
        a.diag_a = 0;
        expect_invalid(K->attn_decode(out, d.f.qkv_dec, d.f.k, d.f.v, &a, NULL), "diag_a = 0");
        a.diag_a = d.f.a.diag_a;
        a.diag_base = -1;
        expect_invalid(K->attn_decode(out, d.f.qkv_dec, d.f.k, d.f.v, &a, NULL),
                       "diag_base = -1");
        a.diag_base = d.f.a.diag_base;
        a.diag_a = d.f.a.diag_a - 1; /* list 0 is full: base + a columns */
        expect_invalid(K->attn_decode(out, d.f.qkv_dec, d.f.k, d.f.v, &a, NULL),
                       "exceeds diag_a");
        a.diag_a = d.f.a.diag_a;
        a.diag_next = NULL;
        expect_invalid(K->attn_decode(out, d.f.qkv_dec, d.f.k, d.f.v, &a, NULL), "diag_next");
        int32_t big[] = {5, 40000, -1}; /* diag_cases[1] has 3 sequences */
        a.diag_next = big;
        expect_invalid(K->attn_decode(out, d.f.qkv_dec, d.f.k, d.f.v, &a, NULL), "diag_next[1]");
        assert_memory_equal(lag, d.lag0, (size_t)d.n_lag * sizeof *lag);
    }
    free(out);
    free(lag);
    df_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),      cmocka_unit_test(test_memory),
        cmocka_unit_test(test_streams),     cmocka_unit_test(test_act_conversions),
        cmocka_unit_test(test_embed),       cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_pos_embed_add),
        cmocka_unit_test(test_rmsnorm),     cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_qk_norm),
        cmocka_unit_test(test_rope),        cmocka_unit_test(test_swiglu_gelu),
        cmocka_unit_test(test_relu),        cmocka_unit_test(test_cfg_combine),
        cmocka_unit_test(test_matmul),      cmocka_unit_test(test_kv_append),
        cmocka_unit_test(test_kv_append_rope),
        cmocka_unit_test(test_attn_decode), cmocka_unit_test(test_attn_prefill),
        cmocka_unit_test(test_attn_errors),
        cmocka_unit_test(test_attn_decode_probs),
        cmocka_unit_test(test_attn_decode_diag),
        cmocka_unit_test(test_attn_diag_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
