/*
 * kv_append.cu - the CUDA kv_append op: copy the K and V heads of n_tok qkv rows into their
 * KV-cache rows, plus the host-side argument checks every attention launcher shares.
 *
 * Data flow: qkv row i = [q (h_q·d_h) | k (h_kv·d_h) | v (h_kv·d_h)] bf16; token i belongs to
 * sequence i / tok_per_seq and its KV head h goes to cache row rows[i·h_kv + h] of the block of
 * (sequence, h) (kernels.h layout). The copy is exact (bf16 in, bf16 out) and moves 16-byte
 * vectors: one thread per 16-byte chunk of a (token, KV head) row, so a warp writes whole rows
 * of K and of V with coalesced stores. The row indices live on the device and cannot be checked
 * without a host synchronisation; a row outside [0, p_cap + ring) is skipped (nothing written)
 * so a bad index never corrupts another sequence's cache.
 * Rejected: one CTA per token (too little work per CTA at decode, n_tok = batch) and a fused
 * K/V + RoPE kernel (RoPE is its own op in the table; fusing is a later step of the decode path).
 */
#include "attn.cuh"
#include "cuda_common.cuh"

/* Threads per CTA of the copy kernel. */
#define KV_APPEND_BLOCK 256

/* Largest d_h the copy kernel handles: 256 chunks of 8 elements fill one CTA. */
#define KV_APPEND_MAX_DH 2048

/* ---- shared argument checks ---- */

/* Product of the non-negative factors, or -1 when it exceeds INT64_MAX / 4 (byte offsets of
 * bf16 elements must stay representable). */
static int64_t checked_elems(int64_t a, int64_t b, int64_t c, int64_t d) {
    uint64_t x = 1;
    int64_t f[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (!flexdiag__mul_ok(x, (uint64_t)f[i], &x) || x > (uint64_t)(INT64_MAX / 4)) return -1;
    return (int64_t)x;
}

flexdiag_status flexdiag__cuda_attn_check(const char *op, const flexdiag_attn_args *a,
                                          const flexdiag_stream *s, int attn, const void *p0,
                                          const void *p1, const void *p2, const void *p3) {
    if (!a || !s) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: NULL %s", op,
                                       !a ? "attention args" : "stream");
    if (a->n_seq < 0 || a->h_q < 1 || a->h_kv < 1 || a->h_q % a->h_kv != 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s: bad shape n_seq %d, h_q %d, h_kv %d (need n_seq >= 0, h_kv >= 1 "
                             "and h_q a positive multiple of h_kv)", op, (int)a->n_seq,
                             (int)a->h_q, (int)a->h_kv);
    if (a->p_cap < 0 || a->ring < 0 || (int64_t)a->p_cap + a->ring > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s: bad p_cap %d or ring %d (need >= 0, sum < 2^31)", op,
                             (int)a->p_cap, (int)a->ring);
    if (attn) {
        if (a->d_h != 16 && a->d_h != 32 && a->d_h != 64 && a->d_h != 128)
            return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                                 "%s: head dim d_h = %d is not supported by the CUDA attention "
                                 "kernels (built for 16, 32, 64 and 128)", op, (int)a->d_h);
        if (a->n_seq > 0 && !a->lp)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: lp (prompt lengths) is NULL", op);
        if (!isfinite(a->scale))
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: scale = %g is not finite", op,
                                 (double)a->scale);
    } else if (a->d_h < 8 || a->d_h % 8 != 0 || a->d_h > KV_APPEND_MAX_DH) {
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: head dim d_h = %d is not supported (need a multiple of 8 in "
                             "8..%d for 16-byte copies)", op, (int)a->d_h, KV_APPEND_MAX_DH);
    }
    if (checked_elems(a->n_seq, a->h_kv, (int64_t)a->p_cap + a->ring, a->d_h) < 0 ||
        checked_elems(a->n_seq, (int64_t)a->p_cap + 1, a->h_q + 2 * (int64_t)a->h_kv,
                      a->d_h) < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: cache or qkv size overflows (n_seq "
                             "%d, p_cap %d, ring %d, d_h %d)", op, (int)a->n_seq, (int)a->p_cap,
                             (int)a->ring, (int)a->d_h);
    const void *p[4] = {p0, p1, p2, p3};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)p[i] % 16 != 0)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "%s: device pointer %p is not 16-byte aligned (the kernels use "
                                 "16-byte vector accesses; allocate with mem_alloc)", op, p[i]);
    return FLEXDIAG_OK;
}

/* ---- kernel ---- */

/* k, v caches; qkv (n_tok, qkv_w); rows (n_tok, h_kv). vpr = d_h / 8 chunks per row; a CTA
 * handles KV_APPEND_BLOCK / vpr (token, KV head) rows per grid step. */
static __global__ void __launch_bounds__(KV_APPEND_BLOCK)
kv_append_kernel(uint4 *__restrict__ k, uint4 *__restrict__ v, const uint4 *__restrict__ qkv,
                 const int32_t *__restrict__ rows, int64_t n_rows, int32_t tok_per_seq,
                 int32_t h_q, int32_t h_kv, int32_t vpr, int32_t rows_cap) {
    const int per_cta = KV_APPEND_BLOCK / vpr;
    const int sub = (int)threadIdx.x / vpr, c = (int)threadIdx.x % vpr;
    if (sub >= per_cta) return;
    const int64_t qkv_w = (int64_t)(h_q + 2 * h_kv) * vpr; /* qkv row width in chunks */
    for (int64_t th = (int64_t)blockIdx.x * per_cta + sub; th < n_rows;
         th += (int64_t)gridDim.x * per_cta) {
        const int32_t row = __ldg(rows + th);
        if (row < 0 || row >= rows_cap) continue; /* bad device index: skip (file comment) */
        const int64_t tok = th / h_kv;
        const int32_t h = (int32_t)(th - tok * h_kv);
        const int64_t seq = tok / tok_per_seq;
        const int64_t dst = ((seq * h_kv + h) * rows_cap + row) * vpr + c;
        const uint4 *src = qkv + tok * qkv_w + (int64_t)(h_q + h) * vpr + c;
        const uint4 kk = __ldg(src), vv = __ldg(src + (int64_t)h_kv * vpr);
        k[dst] = kk;
        v[dst] = vv;
    }
}

/* ---- launcher ---- */

/* k, v (n_seq·h_kv·(p_cap + ring), d_h) bf16 caches; qkv (n_tok, (h_q + 2·h_kv)·d_h) bf16;
 * rows (n_tok, h_kv) int32 */
extern "C" flexdiag_status flexdiag__cuda_kv_append(void *k, void *v, const void *qkv,
                                                    const int32_t *rows, int64_t n_tok,
                                                    int32_t tok_per_seq,
                                                    const flexdiag_attn_args *a,
                                                    flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cuda_attn_check("kv_append", a, s, 0, k, v, qkv, NULL));
    if (n_tok < 0 || tok_per_seq < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "kv_append: bad n_tok %lld or tok_per_seq %d (need >= 0 and >= 1)",
                             (long long)n_tok, (int)tok_per_seq);
    if (n_tok > (int64_t)a->n_seq * tok_per_seq)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "kv_append: %lld tokens at %d per sequence need more than the "
                             "n_seq = %d sequences of the cache", (long long)n_tok,
                             (int)tok_per_seq, (int)a->n_seq);
    if (n_tok == 0) return FLEXDIAG_OK;
    if (!k || !v || !qkv || !rows)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "kv_append: NULL k, v, qkv or rows");
    const int32_t vpr = a->d_h / 8;
    const int64_t n_rows = n_tok * a->h_kv;
    const unsigned grid = flexdiag__cuda_blocks(n_rows, KV_APPEND_BLOCK / vpr);
    kv_append_kernel<<<grid, KV_APPEND_BLOCK, 0, s->stream>>>(
        (uint4 *)k, (uint4 *)v, (const uint4 *)qkv, rows, n_rows, tok_per_seq, a->h_q, a->h_kv,
        vpr, a->p_cap + a->ring);
    FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
    return FLEXDIAG_OK;
}
