/*
 * test_kv_append_cuda.c - the CUDA kv_append with positions (RoPE fused in front of the append,
 * kernels.h) against the scalar CPU reference, which rotates with flexdiag__cpu_ref_rope and then
 * copies, on the same bf16 inputs upcast to fp32.
 *
 * Table of shapes: h_q/h_kv 32/32 and 32/8, d_h 64 and 128, theta 1e4 and 1e6, 1..70 tokens, one
 * (decode) or many (prompt) per sequence, positions 0, 16383, 20000 and random up to 20000, and
 * one (token, KV head) with an out-of-range cache row that the GPU must skip. Checks
 * (docs/architecture.md §10.2): the rotated q and k heads of qkv and the K cache equal the
 * reference rounded to bf16 up to rare rounding ties (check_rope_bits), V heads and the V cache
 * exactly; every device buffer sits between guard regions that must come back unchanged
 * (gpu_buf.h). The argument checks of the fused path (theta) are in test_attn_cuda.c with the other
 * kv_append checks. Exits 77 when CUDA is not built or no device is usable.
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
#include "gpu_buf.h"
#include "kernels/kernels.h"
#include "util.h"

/* Prompt rows reserved per (sequence, KV head), as test_attn_cuda.c's layout. */
#define P_CAP 133

/* The backend under test and the oracle. */
static const flexdiag_kernels *gk, *rk;
static flexdiag_stream *gs, *rs;

typedef struct rope_case {
    int32_t n_seq, h_q, h_kv, d_h, tok_per_seq; /* n_tok = n_seq·tok_per_seq */
    float theta;
} rope_case;

/* Decode batches (one token per sequence) and prompts (many), n_tok 1..70. */
static const rope_case rope_cases[] = {
    {1, 32, 32, 128, 1, 1e4f},  {1, 32, 8, 64, 70, 1e6f},  {8, 32, 8, 128, 1, 1e4f},
    {3, 32, 32, 64, 17, 1e6f},  {64, 32, 8, 64, 1, 1e6f},  {2, 32, 8, 128, 33, 1e4f},
    {5, 32, 32, 128, 7, 1e6f},  {7, 32, 32, 64, 1, 1e4f},
};
#define N_ROPE_CASES ((int)(sizeof rope_cases / sizeof rope_cases[0]))
/* Ring rows per (sequence, KV head) of the RoPE cases. */
#define ROPE_RING 16

/* RoPE outputs got (bf16) vs the fp32 reference ref. The GPU computes the same fp32 value and
 * rounds it once, so got must equal ref rounded to bf16. The exception: the two sides' cos/sin
 * come from different double pow / sincos (CUDA's within 2 ulp), which can round to fp32 values
 * one ulp apart; that moves the fp32 result by about one fp32 ulp and flips the bf16 rounding
 * only next to a tie (odds ~2^-16 per affected element). At most max_flips such flips pass
 * (callers allow 1 + n_rot/10000 for n_rot rotated elements, 0 for pure copies), each within
 * half a bf16 ulp (2^-8 relative, rtol 3.95e-3) + 1e-6 (fp32 cancellation in a·c − b·s) of
 * ref: the old rope test's tolerance. Both NaN counts as equal (NaN payloads may differ). */
static int check_rope_bits(const char *label, const uint16_t *got, const float *ref, int64_t n,
                           int64_t max_flips) {
    int64_t flips = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float g = flexdiag__bf16_to_f32(got[i]);
        if (got[i] == flexdiag__f32_to_bf16(ref[i]) || (isnan(g) && isnan(ref[i]))) continue;
        if (fabs((double)g - ref[i]) <= 1e-6 + 3.95e-3 * fabs((double)ref[i])) {
            flips++;
            continue;
        }
        if (bad++ < 5)
            fprintf(stderr, "%s: element %lld is %.9g, reference %.9g\n", label, (long long)i, g,
                    ref[i]);
    }
    int ok = bad == 0 && flips <= max_flips;
    fprintf(ok ? stdout : stderr, "%s: %lld wrong, %lld rounding-tie flips (%lld allowed)%s\n",
            label, (long long)bad, (long long)flips, (long long)max_flips, ok ? "" : " (FAIL)");
    return ok;
}

/* Cache rows of token i, KV head h: tok_per_seq 1 a random ring row but the last, else prompt
 * row i % tok_per_seq (distinct within a sequence). The last token's head 0 gets an
 * out-of-range row (-1, or p_cap + ring when odd): the GPU must skip it. */
static int32_t *rope_rows(const rope_case *c, int64_t n_tok, int odd, tu_rng *r) {
    int32_t *rows = xmalloc((size_t)(n_tok * c->h_kv) * sizeof *rows);
    for (int64_t i = 0; i < n_tok; i++)
        for (int32_t h = 0; h < c->h_kv; h++)
            rows[i * c->h_kv + h] = c->tok_per_seq == 1
                                        ? P_CAP + (int32_t)tu_rng_int(r, 0, ROPE_RING - 2)
                                        : (int32_t)(i % c->tok_per_seq);
    rows[(n_tok - 1) * c->h_kv] = odd ? P_CAP + ROPE_RING : -1;
    return rows;
}

/* The reference's append: the skipped (last token, head 0) entry writes the unused last ring
 * row instead, which is then restored from the original caches k0 / v0. */
static void rope_reference(const rope_case *c, float *kc, float *vc, float *qkv32,
                           const int32_t *rows, const int32_t *pos, int64_t n_tok,
                           const float *k0, const float *v0) {
    const int32_t block = P_CAP + ROPE_RING, last = block - 1;
    int32_t *rr = xmalloc((size_t)(n_tok * c->h_kv) * sizeof *rr);
    memcpy(rr, rows, (size_t)(n_tok * c->h_kv) * sizeof *rr);
    rr[(n_tok - 1) * c->h_kv] = last;
    flexdiag_attn_args a = {.n_seq = c->n_seq, .h_q = c->h_q, .h_kv = c->h_kv, .d_h = c->d_h,
                            .p_cap = P_CAP, .ring = ROPE_RING, .pos = pos,
                            .rope_theta = c->theta};
    OK(rk->kv_append(kc, vc, qkv32, rr, n_tok, c->tok_per_seq, &a, rs));
    int64_t off = ((((n_tok - 1) / c->tok_per_seq) * c->h_kv) * block + last) * c->d_h;
    memcpy(kc + off, k0 + off, (size_t)c->d_h * sizeof *kc);
    memcpy(vc + off, v0 + off, (size_t)c->d_h * sizeof *vc);
    free(rr);
}

/* Download a bf16 device buffer of n elements; its guards are checked into *ok. */
static uint16_t *download_raw(const dbuf *b, int64_t n, const char *label, int *ok) {
    uint16_t *h = xmalloc((size_t)n * 2);
    *ok = dbuf_get(b, h, label) && *ok;
    return h;
}

static void run_rope_case(const rope_case *c, int idx, tu_rng *r) {
    const int64_t n_tok = (int64_t)c->n_seq * c->tok_per_seq, w = (c->h_q + 2 * c->h_kv) * c->d_h;
    const int64_t cache_n = (int64_t)c->n_seq * c->h_kv * (P_CAP + ROPE_RING) * c->d_h;
    uint16_t *qkv = xmalloc((size_t)(n_tok * w) * 2), *kc = xmalloc((size_t)cache_n * 2);
    uint16_t *vc = xmalloc((size_t)cache_n * 2);
    int32_t *pos = xmalloc((size_t)n_tok * sizeof *pos), *rows = rope_rows(c, n_tok, idx % 2, r);
    tu_fill_bf16(r, qkv, n_tok * w, 1.0f);
    tu_fill_bf16(r, kc, cache_n, 1.0f);
    tu_fill_bf16(r, vc, cache_n, 1.0f);
    for (int64_t i = 0; i < n_tok; i++) pos[i] = (int32_t)tu_rng_int(r, 0, 20000);
    pos[0] = 0; /* the identity rotation, and large positions */
    if (n_tok > 2) pos[1] = 16383, pos[2] = 20000;
    dbuf dq = dbuf_make((size_t)(n_tok * w), 2, 0), dk = dbuf_make((size_t)cache_n, 2, 0);
    dbuf dv = dbuf_make((size_t)cache_n, 2, 0), dr = dbuf_make((size_t)(n_tok * c->h_kv), 4, 0);
    dbuf dp = dbuf_make((size_t)n_tok, 4, 0);
    dbuf_put(&dq, qkv);
    dbuf_put(&dk, kc);
    dbuf_put(&dv, vc);
    dbuf_put(&dr, rows);
    dbuf_put(&dp, pos);
    flexdiag_attn_args ga = {.n_seq = c->n_seq, .h_q = c->h_q, .h_kv = c->h_kv, .d_h = c->d_h,
                             .p_cap = P_CAP, .ring = ROPE_RING, .pos = dptr(&dp),
                             .rope_theta = c->theta};
    void *gq_in = dptr(&dq), *gk_c = dptr(&dk), *gv_c = dptr(&dv);
    OK(gk->kv_append(gk_c, gv_c, gq_in, dptr(&dr), n_tok, c->tok_per_seq, &ga, gs));

    float *q32 = tu_bf16_to_f32(qkv, n_tok * w), *k32 = tu_bf16_to_f32(kc, cache_n);
    float *v32 = tu_bf16_to_f32(vc, cache_n), *k0 = tu_bf16_to_f32(kc, cache_n);
    float *v0 = tu_bf16_to_f32(vc, cache_n);
    rope_reference(c, k32, v32, q32, rows, pos, n_tok, k0, v0);
    char lab[128];
    snprintf(lab, sizeof lab, "rope case %d (n_tok %lld, h_q %d, h_kv %d, d_h %d, theta %g)", idx,
             (long long)n_tok, c->h_q, c->h_kv, c->d_h, (double)c->theta);
    int guards = 1;
    uint16_t *gq = download_raw(&dq, n_tok * w, lab, &guards);
    uint16_t *gkc = download_raw(&dk, cache_n, lab, &guards);
    uint16_t *gvc = download_raw(&dv, cache_n, lab, &guards);
    int32_t *back = xmalloc((size_t)(n_tok * (c->h_kv + 1)) * sizeof *back);
    guards = dbuf_get(&dr, back, lab) && dbuf_get(&dp, back + n_tok * c->h_kv, lab) && guards;
    assert_true(guards);
    /* q and k heads are rotated; v heads and the V cache are copies and must match exactly */
    assert_true(check_rope_bits(lab, gq, q32, n_tok * w,
                                1 + n_tok * (c->h_q + c->h_kv) * c->d_h / 10000));
    assert_true(check_rope_bits(lab, gkc, k32, cache_n, 1 + n_tok * c->h_kv * c->d_h / 10000));
    assert_true(check_rope_bits(lab, gvc, v32, cache_n, 0));
    dbuf *all[5] = {&dq, &dk, &dv, &dr, &dp};
    for (int i = 0; i < 5; i++) dbuf_free(all[i]);
    void *host[14] = {qkv, kc, vc, pos, rows, q32, k32, v32, k0, v0, gq, gkc, gvc, back};
    for (int i = 0; i < 14; i++) free(host[i]);
}

static void test_kv_append_rope(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 2000);
    for (int i = 0; i < N_ROPE_CASES; i++) run_rope_case(&rope_cases[i], i, &r);
}

int main(void) {
    int skip = tu_cuda_stream("test_kv_append_cuda", &gs);
    if (skip) return skip;
    gk = flexdiag__kernels_cuda();
    rk = flexdiag__kernels_cpu_ref();
    if (rk->stream_create(-1, 1, &rs) != FLEXDIAG_OK) {
        fprintf(stderr, "test_kv_append_cuda: cpu stream: %s\n", flexdiag_last_error(NULL));
        return 1;
    }
    gpu_buf_use(gk, gs);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kv_append_rope)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gk->stream_destroy(gs);
    rk->stream_destroy(rs);
    return rc;
}
