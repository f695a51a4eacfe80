/*
 * ref_matmul.c - scalar reference Linear: out (n, m) (+)= x (n, k) · W (m, k)ᵀ + b (m).
 *
 * Each output element is one fp32 accumulator summed over k in increasing order starting from
 * 0, then the bias is added, then (FLEXDIAG_MM_ACCUM) the previous output. The fast matmul
 * (fast_matmul.c) keeps exactly this per-element order, so on the same machine the two agree
 * bit for bit; tests still compare them within the fp32 tolerance so that a future SIMD path
 * with a different order stays legal. act and FLEXDIAG_MM_OUT_F32 outputs are both fp32 here.
 */
#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"

flexdiag_status flexdiag__cpu_matmul_check(const char *op, const void *out, const void *x,
                                           const uint16_t *w, int64_t n, int64_t k, int64_t m,
                                           unsigned flags) {
    if (n < 0 || k < 0 || m < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: n = %lld, k = %lld, m = %lld: sizes must be >= 0", op,
                             (long long)n, (long long)k, (long long)m);
    if (flags & ~(FLEXDIAG_MM_ACCUM | FLEXDIAG_MM_OUT_F32))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: unknown flags 0x%x", op, flags);
    if ((flags & FLEXDIAG_MM_ACCUM) && (flags & FLEXDIAG_MM_OUT_F32))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu %s: FLEXDIAG_MM_ACCUM is for act outputs only, not with "
                             "FLEXDIAG_MM_OUT_F32",
                             op);
    if (n > 0 && m > 0 && !out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: out is NULL", op);
    if (n > 0 && m > 0 && k > 0 && (!x || !w))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: %s is NULL", op, x ? "w" : "x");
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_matmul(void *out, const void *x, const uint16_t *w,
                                         const uint16_t *b, int64_t n, int64_t k, int64_t m,
                                         unsigned flags, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(flexdiag__cpu_matmul_check("matmul", out, x, w, n, k, m, flags));
    const float *xs = x;
    float *y = out;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < k; c++)
                acc += xs[i * k + c] * flexdiag__bf16_to_f32(w[j * k + c]);
            if (b) acc += flexdiag__bf16_to_f32(b[j]);
            y[i * m + j] = (flags & FLEXDIAG_MM_ACCUM) ? y[i * m + j] + acc : acc;
        }
    return FLEXDIAG_OK;
}
