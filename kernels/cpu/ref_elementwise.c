/*
 * ref_elementwise.c - scalar reference row and elementwise ops: act conversions, embedding
 * lookup, learned position embeddings, RMSNorm, LayerNorm, QK-norm (LayerNorm per q and k head
 * of a qkv row), rotate-half RoPE (not a table slot: the RoPE step of kv_append), SwiGLU, exact
 * GELU, ReLU and row gather.
 *
 * Written for obviousness: one loop nest per op, fp32 arithmetic in the order the formula in
 * kernels.h reads, bf16 weights widened with flexdiag__bf16_to_f32. These are the oracle the
 * CUDA and fast CPU paths are tested against, so they favour exactness over speed (RoPE's
 * angles are computed in double; see rope_cos_sin; LayerNorm and QK-norm run in double and round
 * once).
 * Index arguments that cannot be bounded here (token ids against the vocabulary, gather indices
 * against the source rows, positions against the position table) are the caller's to validate;
 * negative ones are rejected.
 */
#include <math.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"

/* ---- argument checks ---- */

/* INVALID_ARG unless the count v (called name) is >= 0. */
static flexdiag_status check_count(const char *op, int64_t v, const char *name) {
    if (v < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: %s = %lld: must be >= 0", op, name,
                             (long long)v);
    return FLEXDIAG_OK;
}

/* INVALID_ARG when a buffer needed for non-empty work is NULL. */
static flexdiag_status check_ptr(const char *op, const void *p, const char *name) {
    if (!p) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: %s is NULL", op, name);
    return FLEXDIAG_OK;
}

/* ---- conversions (act is fp32 on the CPU) ---- */

flexdiag_status flexdiag__cpu_act_to_f32(float *out, const void *in, int64_t n,
                                         flexdiag_stream *s) {
    FLEXDIAG_TRY(check_count("act_to_f32", n, "n"));
    return flexdiag__cpu_copy(out, in, (size_t)n * sizeof(float), s);
}

flexdiag_status flexdiag__cpu_act_from_f32(void *out, const float *in, int64_t n,
                                           flexdiag_stream *s) {
    FLEXDIAG_TRY(check_count("act_from_f32", n, "n"));
    return flexdiag__cpu_copy(out, in, (size_t)n * sizeof(float), s);
}

/* ---- embedding and gather ---- */

flexdiag_status flexdiag__cpu_ref_embed(void *out, const uint16_t *table, const int32_t *ids,
                                        int64_t n, int64_t d, int32_t rep, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("embed", n, "n"));
    FLEXDIAG_TRY(check_count("embed", d, "d"));
    if (rep < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu embed: rep = %d: must be >= 1", rep);
    if (n == 0 || d == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("embed", out, "out"));
    FLEXDIAG_TRY(check_ptr("embed", table, "table"));
    FLEXDIAG_TRY(check_ptr("embed", ids, "ids"));
    for (int64_t j = 0; j < (n + rep - 1) / rep; j++)
        if (ids[j] < 0)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu embed: ids[%lld] = %d is negative",
                                 (long long)j, ids[j]);
    float *y = out;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *row = table + (int64_t)ids[i / rep] * d;
        for (int64_t c = 0; c < d; c++) y[i * d + c] = flexdiag__bf16_to_f32(row[c]);
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_pos_embed_add(void *x, const uint16_t *table,
                                                const int32_t *pos, int64_t n, int64_t d,
                                                int32_t offset, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("pos_embed_add", n, "n"));
    FLEXDIAG_TRY(check_count("pos_embed_add", d, "d"));
    if (n == 0 || d == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("pos_embed_add", x, "x"));
    FLEXDIAG_TRY(check_ptr("pos_embed_add", table, "table"));
    FLEXDIAG_TRY(check_ptr("pos_embed_add", pos, "pos"));
    for (int64_t i = 0; i < n; i++)
        if ((int64_t)pos[i] + offset < 0)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "cpu pos_embed_add: pos[%lld] + offset = %d + %d is negative",
                                 (long long)i, pos[i], offset);
    float *y = x;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *row = table + ((int64_t)pos[i] + offset) * d;
        for (int64_t c = 0; c < d; c++) y[i * d + c] += flexdiag__bf16_to_f32(row[c]);
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_gather_rows(void *out, const void *in, const int32_t *idx,
                                              int64_t n, int64_t d, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("gather_rows", n, "n"));
    FLEXDIAG_TRY(check_count("gather_rows", d, "d"));
    if (n == 0 || d == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("gather_rows", out, "out"));
    FLEXDIAG_TRY(check_ptr("gather_rows", in, "in"));
    FLEXDIAG_TRY(check_ptr("gather_rows", idx, "idx"));
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "cpu gather_rows: idx[%lld] = %d is negative", (long long)i,
                                 idx[i]);
    const float *x = in;
    float *y = out;
    for (int64_t i = 0; i < n; i++) memcpy(y + i * d, x + (int64_t)idx[i] * d, (size_t)d * 4);
    return FLEXDIAG_OK;
}

/* ---- normalisation and activations ---- */

flexdiag_status flexdiag__cpu_ref_rmsnorm(void *out, const void *x, const uint16_t *w, int64_t n,
                                          int64_t d, float eps, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("rmsnorm", n, "n"));
    FLEXDIAG_TRY(check_count("rmsnorm", d, "d"));
    if (d == 0 || !(eps >= 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu rmsnorm: d = %lld, eps = %g: need d > 0 and eps >= 0",
                             (long long)d, (double)eps);
    if (n == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("rmsnorm", out, "out"));
    FLEXDIAG_TRY(check_ptr("rmsnorm", x, "x"));
    FLEXDIAG_TRY(check_ptr("rmsnorm", w, "w"));
    const float *xs = x;
    float *y = out;
    for (int64_t i = 0; i < n; i++) {
        const float *xr = xs + i * d;
        float ss = 0.0f;
        for (int64_t c = 0; c < d; c++) ss += xr[c] * xr[c];
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int64_t c = 0; c < d; c++) y[i * d + c] = xr[c] * inv * flexdiag__bf16_to_f32(w[c]);
    }
    return FLEXDIAG_OK;
}

/* Two-pass mean and biased variance of the d floats of x, in double. */
static void row_stats(const float *x, int64_t d, double *mean, double *var) {
    double sum = 0, sq = 0;
    for (int64_t c = 0; c < d; c++) sum += x[c];
    const double m = sum / (double)d;
    for (int64_t c = 0; c < d; c++) sq += ((double)x[c] - m) * ((double)x[c] - m);
    *mean = m;
    *var = sq / (double)d;
}

flexdiag_status flexdiag__cpu_ref_layernorm(void *out, const void *x, const uint16_t *w,
                                            const uint16_t *b, int64_t n, int64_t d, float eps,
                                            flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("layernorm", n, "n"));
    FLEXDIAG_TRY(check_count("layernorm", d, "d"));
    if (d == 0 || !(eps >= 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu layernorm: d = %lld, eps = %g: need d > 0 and eps >= 0",
                             (long long)d, (double)eps);
    if (n == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("layernorm", out, "out"));
    FLEXDIAG_TRY(check_ptr("layernorm", x, "x"));
    FLEXDIAG_TRY(check_ptr("layernorm", w, "w"));
    FLEXDIAG_TRY(check_ptr("layernorm", b, "b"));
    const float *xs = x;
    float *y = out;
    for (int64_t i = 0; i < n; i++) {
        const float *xr = xs + i * d;
        double mean, var;
        row_stats(xr, d, &mean, &var);
        const double rstd = 1.0 / sqrt(var + (double)eps);
        for (int64_t c = 0; c < d; c++) /* reads xr[c] before writing it: out may be x */
            y[i * d + c] = (float)(((double)xr[c] - mean) * rstd * flexdiag__bf16_to_f32(w[c]) +
                                   flexdiag__bf16_to_f32(b[c]));
    }
    return FLEXDIAG_OK;
}

/* INVALID_ARG unless a norm table's row count rows (called name) is 1 or heads (heads_name). */
static flexdiag_status check_norm_rows(const char *op, int32_t rows, const char *name,
                                       int32_t heads, const char *heads_name) {
    if (rows != 1 && rows != heads)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu %s: %s = %d: must be 1 or %s = %d", op,
                             name, rows, heads_name, heads);
    return FLEXDIAG_OK;
}

/* LayerNorm in place of the `heads` consecutive heads of d_h floats at x: head h takes row
 * r = h of w, b (rows == heads) or row 0 (rows == 1); statistics and formula in double as
 * in layernorm. */
static void norm_heads(float *x, const uint16_t *w, const uint16_t *b, int32_t heads,
                       int32_t rows, int32_t d_h, float eps) {
    for (int32_t h = 0; h < heads; h++) {
        float *xh = x + (int64_t)h * d_h;
        const int64_t r = rows == 1 ? 0 : h;
        double mean, var;
        row_stats(xh, d_h, &mean, &var);
        const double rstd = 1.0 / sqrt(var + (double)eps);
        for (int32_t c = 0; c < d_h; c++)
            xh[c] = (float)(((double)xh[c] - mean) * rstd * flexdiag__bf16_to_f32(w[r * d_h + c]) +
                            flexdiag__bf16_to_f32(b[r * d_h + c]));
    }
}

flexdiag_status flexdiag__cpu_ref_qk_norm(void *qkv, const uint16_t *q_w, const uint16_t *q_b,
                                          const uint16_t *k_w, const uint16_t *k_b, int64_t n,
                                          int32_t h_q, int32_t h_kv, int32_t d_h, int32_t q_rows,
                                          int32_t k_rows, float eps, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("qk_norm", n, "n"));
    if (h_q <= 0 || h_kv <= 0 || d_h <= 0 || !(eps >= 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu qk_norm: h_q = %d, h_kv = %d, d_h = %d, eps = %g: need h_q, "
                             "h_kv, d_h > 0 and eps >= 0",
                             h_q, h_kv, d_h, (double)eps);
    FLEXDIAG_TRY(check_norm_rows("qk_norm", q_rows, "q_rows", h_q, "h_q"));
    FLEXDIAG_TRY(check_norm_rows("qk_norm", k_rows, "k_rows", h_kv, "h_kv"));
    if (n == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("qk_norm", qkv, "qkv"));
    FLEXDIAG_TRY(check_ptr("qk_norm", q_w, "q_w"));
    FLEXDIAG_TRY(check_ptr("qk_norm", q_b, "q_b"));
    FLEXDIAG_TRY(check_ptr("qk_norm", k_w, "k_w"));
    FLEXDIAG_TRY(check_ptr("qk_norm", k_b, "k_b"));
    const int64_t width = ((int64_t)h_q + 2 * (int64_t)h_kv) * d_h;
    for (int64_t i = 0; i < n; i++) {
        float *row = (float *)qkv + i * width;
        norm_heads(row, q_w, q_b, h_q, q_rows, d_h, eps);
        norm_heads(row + (int64_t)h_q * d_h, k_w, k_b, h_kv, k_rows, d_h, eps);
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_swiglu(void *out, const void *gu, int64_t n, int64_t f,
                                         flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("swiglu", n, "n"));
    FLEXDIAG_TRY(check_count("swiglu", f, "f"));
    if (n == 0 || f == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("swiglu", out, "out"));
    FLEXDIAG_TRY(check_ptr("swiglu", gu, "gu"));
    const float *x = gu;
    float *y = out;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < f; j++) {
            float g = x[i * 2 * f + j], u = x[i * 2 * f + f + j];
            y[i * f + j] = g / (1.0f + expf(-g)) * u;
        }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_gelu(void *x, int64_t n, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("gelu", n, "n"));
    if (n == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("gelu", x, "x"));
    const float rsqrt2 = 0.70710678118654752f; /* 1/√2 */
    float *v = x;
    for (int64_t i = 0; i < n; i++) v[i] = v[i] * 0.5f * (1.0f + erff(v[i] * rsqrt2));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_ref_relu(void *x, int64_t n, flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("relu", n, "n"));
    if (n == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("relu", x, "x"));
    float *v = x;
    for (int64_t i = 0; i < n; i++)
        if (v[i] < 0.0f) v[i] = 0.0f; /* false for ±0 and NaN: those stay */
    return FLEXDIAG_OK;
}

/* ---- RoPE ---- */

/*
 * cos/sin of pos·inv_freq[j], inv_freq[j] = theta^(-2j/d_h). Computed in double and rounded to
 * float once: the angle is then exact to double precision for any position, and the fp32 values
 * equal the correctly rounded ones. transformers builds inv_freq and the angle in fp32, which
 * differs from this by at most about pos·2^-24 rad (≈ 4e-5 rad at position 700); the CUDA
 * kv_append computes inv_freq, the angle and its cos/sin in double too, then rounds to float.
 */
void flexdiag__cpu_rope_cos_sin(int32_t pos, int32_t j, int32_t d_h, float theta, float *c,
                                float *sn) {
    double inv_freq = pow((double)theta, -2.0 * j / d_h);
    double angle = (double)pos * inv_freq;
    *c = (float)cos(angle);
    *sn = (float)sin(angle);
}

flexdiag_status flexdiag__cpu_ref_rope(void *x, const int32_t *pos, int64_t n, int64_t stride,
                                       int64_t col0, int32_t n_heads, int32_t d_h, float theta,
                                       flexdiag_stream *s) {
    (void)s;
    FLEXDIAG_TRY(check_count("rope", n, "n"));
    FLEXDIAG_TRY(check_count("rope", col0, "col0"));
    if (n_heads < 0 || d_h <= 0 || d_h % 2 != 0 || !(theta > 0.0f) ||
        col0 + (int64_t)n_heads * d_h > stride)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu rope: n_heads = %d, d_h = %d, col0 = %lld, stride = %lld, "
                             "theta = %g: need even d_h > 0, theta > 0 and col0 + n_heads·d_h <= "
                             "stride",
                             n_heads, d_h, (long long)col0, (long long)stride, (double)theta);
    if (n == 0 || n_heads == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_ptr("rope", x, "x"));
    FLEXDIAG_TRY(check_ptr("rope", pos, "pos"));
    int32_t half = d_h / 2;
    for (int64_t i = 0; i < n; i++)
        for (int32_t j = 0; j < half; j++) {
            float c, sn;
            flexdiag__cpu_rope_cos_sin(pos[i], j, d_h, theta, &c, &sn);
            for (int32_t h = 0; h < n_heads; h++) {
                float *p = (float *)x + i * stride + col0 + (int64_t)h * d_h;
                float a = p[j], b = p[j + half];
                p[j] = a * c - b * sn;
                p[j + half] = b * c + a * sn;
            }
        }
    return FLEXDIAG_OK;
}
