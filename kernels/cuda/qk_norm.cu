/*
 * qk_norm.cu - QK-norm of Chameleon / Lumina-mGPT (kernels.h qk_norm): LayerNorm of every q and
 * k head of bf16 qkv rows, in place, before RoPE; the v heads are not touched.
 *
 * Rounding as layernorm.cu: two-pass fp32 statistics (the mean, then the sum of squared
 * deviations from it, so heads far from zero lose nothing to cancellation), the affine w, b in
 * fp32, one rounding to bf16. The reference computes in double; the two differ by the final
 * bf16 rounding and fp32 noise far below it.
 *
 * One warp per (row, head), QKN_WARPS per CTA, grid-stride over the n·(h_q + h_kv) heads. Lane l
 * keeps elements l, l + 32, ... of its head in registers (QKN_PER_LANE of them: d_h <= 256, the
 * config's head_dim limit), so a head is read once and written once, with coalesced bf16 accesses
 * and any d_h; the statistics are warp-shuffle sums in a fixed order. Each element is read by the
 * lane that writes it, before the write.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#define QKN_WARPS 8    /* (row, head) pairs per 256-thread CTA */
#define QKN_PER_LANE 8 /* head elements one lane keeps in registers */
#define QKN_MAX_DH (32 * QKN_PER_LANE)

/* One table (q or k): bf16 w, b rows of d_h; rows is 1 (shared by every head) or the heads. */
struct qkn_table {
    const __nv_bfloat16 *w, *b;
    int32_t rows;
};

/* Sum of v over the warp; every lane gets it. */
static __device__ __forceinline__ float qkn_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* LayerNorm in place of the d_h values at x with the bf16 rows w, b (whole warp). */
static __device__ __forceinline__ void qkn_head(__nv_bfloat16 *x, const __nv_bfloat16 *w,
                                                const __nv_bfloat16 *b, int32_t d_h, float eps) {
    const int lane = (int)threadIdx.x & 31;
    float v[QKN_PER_LANE];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < QKN_PER_LANE; i++) {
        const int c = lane + 32 * i;
        v[i] = c < d_h ? __bfloat162float(x[c]) : 0.0f;
        sum += v[i];
    }
    const float mean = qkn_warp_sum(sum) / (float)d_h;
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < QKN_PER_LANE; i++)
        if (lane + 32 * i < d_h) sq += (v[i] - mean) * (v[i] - mean);
    const float rstd = 1.0f / sqrtf(qkn_warp_sum(sq) / (float)d_h + eps);
#pragma unroll
    for (int i = 0; i < QKN_PER_LANE; i++) {
        const int c = lane + 32 * i;
        if (c < d_h)
            x[c] = __float2bfloat16_rn((v[i] - mean) * rstd * __bfloat162float(w[c]) +
                                       __bfloat162float(b[c]));
    }
}

/* qkv (n, (h_q + 2·h_kv)·d_h): heads 0..h_q-1 of a row normalised with q, h_q..h_q+h_kv-1 with k.
 * The loop bound is uniform across a warp, so whole warps run qkn_head's shuffles. */
static __global__ void __launch_bounds__(QKN_WARPS * 32)
qk_norm_kernel(__nv_bfloat16 *qkv, qkn_table q, qkn_table k, int64_t n, int32_t h_q,
               int32_t h_kv, int32_t d_h, float eps) {
    const int32_t heads = h_q + h_kv;
    const int64_t width = ((int64_t)heads + h_kv) * d_h, total = n * heads;
    for (int64_t p = (int64_t)blockIdx.x * QKN_WARPS + (threadIdx.x >> 5); p < total;
         p += (int64_t)gridDim.x * QKN_WARPS) {
        const int64_t row = p / heads;
        const int32_t h = (int32_t)(p % heads);
        const bool is_q = h < h_q;
        const int64_t r = (is_q ? q.rows : k.rows) == 1 ? 0 : (is_q ? h : h - h_q);
        qkn_head(qkv + row * width + (int64_t)h * d_h, (is_q ? q.w : k.w) + r * d_h,
                 (is_q ? q.b : k.b) + r * d_h, d_h, eps);
    }
}

/* INVALID_ARG unless a table's row count rows (called name) is 1 or heads (heads_name). */
static flexdiag_status qkn_check_rows(int32_t rows, const char *name, int32_t heads,
                                      const char *heads_name) {
    if (rows != 1 && rows != heads)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda qk_norm: %s = %d: must be 1 or %s = %d", name, rows,
                             heads_name, heads);
    return FLEXDIAG_OK;
}

/* qkv (n, (h_q + 2·h_kv)·d_h) bf16 in place; q_w, q_b (q_rows, d_h) and k_w, k_b (k_rows, d_h)
 * bf16 */
extern "C" flexdiag_status flexdiag__cuda_qk_norm(void *qkv, const uint16_t *q_w,
                                                  const uint16_t *q_b, const uint16_t *k_w,
                                                  const uint16_t *k_b, int64_t n, int32_t h_q,
                                                  int32_t h_kv, int32_t d_h, int32_t q_rows,
                                                  int32_t k_rows, float eps, flexdiag_stream *s) {
    if (n < 0 || h_q <= 0 || h_kv <= 0 || d_h <= 0 || d_h > QKN_MAX_DH || !(eps >= 0.0f) ||
        (n > 0 && (!qkv || !q_w || !q_b || !k_w || !k_b)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda qk_norm: n = %lld, h_q = %d, h_kv = %d, d_h = %d, eps = %g: "
                             "need n >= 0, h_q, h_kv > 0, 0 < d_h <= %d, eps >= 0 and device "
                             "buffers",
                             (long long)n, h_q, h_kv, d_h, (double)eps, QKN_MAX_DH);
    FLEXDIAG_TRY(qkn_check_rows(q_rows, "q_rows", h_q, "h_q"));
    FLEXDIAG_TRY(qkn_check_rows(k_rows, "k_rows", h_kv, "h_kv"));
    if (n == 0) return FLEXDIAG_OK;
    const qkn_table q = {(const __nv_bfloat16 *)q_w, (const __nv_bfloat16 *)q_b, q_rows};
    const qkn_table k = {(const __nv_bfloat16 *)k_w, (const __nv_bfloat16 *)k_b, k_rows};
    cudaStream_t st = flexdiag__cuda_st(s);
    const int64_t heads = n * ((int64_t)h_q + h_kv);
    qk_norm_kernel<<<flexdiag__cuda_blocks(heads, QKN_WARPS), QKN_WARPS * 32, 0, st>>>(
        (__nv_bfloat16 *)qkv, q, k, n, h_q, h_kv, d_h, eps);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
