/*
 * kv_append.cu - the CUDA kv_append op: copy the K and V heads of n_tok qkv rows into their
 * KV-cache rows, with RoPE on the q and k heads fused in front when the args carry positions,
 * plus the host-side argument checks every attention launcher shares.
 *
 * Data flow: qkv row i = [q (h_q·d_h) | k (h_kv·d_h) | v (h_kv·d_h)] bf16; token i belongs to
 * sequence i / tok_per_seq and its KV head h goes to cache row rows[i·h_kv + h] of the block of
 * (sequence, h) (kernels.h layout). The copy is exact (bf16 in, bf16 out) and moves 16-byte
 * vectors. The row indices live on the device and cannot be checked without a host
 * synchronisation; a row outside [0, p_cap + ring) is skipped (nothing written) so a bad index
 * never corrupts another sequence's cache.
 *
 * Plain copy (a->pos NULL): one thread per 16-byte chunk of a (token, KV head) row, so a warp
 * writes whole rows of K and of V with coalesced stores.
 * RoPE + copy (a->pos set, d_h % 16 == 0): one CTA per (token, chunk of KVR_HEADS heads of
 * the qkv row), so a decode step's 64 tokens still fill the GPU. A CTA computes inv_freq[i] =
 * theta^(-2i/d_h) once into shared memory and per token the d_h/2 cos/sin pairs (double sincos
 * of pos·inv_freq rounded to fp32, as the CPU reference: fp32 angles would be off by up to
 * 2^-10 rad at position 16384, a large share of a bf16 ulp; H200 has full-rate fp64 and there
 * are only d_h/2 per token). A thread takes 8 pairs (i, i + d_h/2) of one head as two 16-byte
 * vectors, rotates them (rotate-half, fp32 with explicit round-to-nearest operations: no fma
 * contraction, as on the CPU; one rounding to bf16) and stores them back; for a k head it also
 * writes them to the cache row, for a v head it only copies. One launch and one pass over the
 * row replace RoPE's own launch.
 * Rejected: one CTA per token for the plain copy (too little work per CTA at decode, n_tok =
 * batch); one CTA per token for the fused path (64 CTAs on 132 SMs and 16 dependent 2-byte
 * loads per thread: 9 us per layer on the H200 where this takes about 3).
 */
#include "kernels/cuda/attn.cuh"
#include "kernels/cuda/cuda_common.cuh"

/* Threads per CTA of the copy kernel. */
#define KV_APPEND_BLOCK 256

/* Largest d_h the kernels handle: 256 chunks of 8 elements fill one CTA, and the RoPE tables
 * (8·d_h bytes of shared memory) stay at 16 KiB, under the 48 KiB default. */
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

/* ---- copy kernel ---- */

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

/* ---- RoPE + copy kernel ---- */

/* Threads per CTA and heads (q, k or v, in qkv order) per CTA of the fused kernel. */
#define KVR_THREADS 128
#define KVR_HEADS 16

/* Geometry of one fused launch (passed by value). */
typedef struct kvr_geom {
    int64_t n_tok;
    int32_t tok_per_seq, h_q, h_kv, d_h, rows_cap;
    float theta;
} kvr_geom;

/* a' = a·c − b·s, b' = b·c + a·s for 8 pairs (lo[e], hi[e]) with angles i0 + e, fp32 with
 * explicit round-to-nearest operations, one rounding to bf16 each. */
static __device__ __forceinline__ void rope8(uint4 &lo, uint4 &hi, const float *cs, int i0,
                                             int half) {
    __nv_bfloat162 *l2 = (__nv_bfloat162 *)&lo, *h2 = (__nv_bfloat162 *)&hi;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 a = __bfloat1622float2(l2[e]), b = __bfloat1622float2(h2[e]);
        const int i = i0 + 2 * e;
        const float c0 = cs[i], s0 = cs[half + i], c1 = cs[i + 1], s1 = cs[half + i + 1];
        l2[e] = __floats2bfloat162_rn(__fsub_rn(__fmul_rn(a.x, c0), __fmul_rn(b.x, s0)),
                                      __fsub_rn(__fmul_rn(a.y, c1), __fmul_rn(b.y, s1)));
        h2[e] = __floats2bfloat162_rn(__fadd_rn(__fmul_rn(b.x, c0), __fmul_rn(a.x, s0)),
                                      __fadd_rn(__fmul_rn(b.y, c1), __fmul_rn(a.y, s1)));
    }
}

/* CTA (token, head chunk y): heads y·KVR_HEADS.. of the token's qkv row. q heads are rotated
 * in place, k heads rotated in place and written to their cache rows from registers, v heads
 * copied; 16-byte vectors throughout (d_h % 16 == 0). Dynamic shared memory: inv_freq (d_h/2)
 * double, then cos and sin (d_h/2 each) fp32 of the current token. */
static __global__ void __launch_bounds__(KVR_THREADS)
kv_append_rope_kernel(uint4 *__restrict__ k, uint4 *__restrict__ v, uint4 *__restrict__ qkv,
                      const int32_t *__restrict__ rows, const int32_t *__restrict__ pos,
                      kvr_geom g) {
    extern __shared__ double smem[];
    const int half = g.d_h / 2, vpr = g.d_h / 8, hv = vpr / 2; /* vectors per row, per half */
    double *inv_freq = smem;
    float *cs = (float *)(smem + half);
    const int rot_heads = g.h_q + g.h_kv, all_heads = rot_heads + g.h_kv;
    const int h0 = (int)blockIdx.y * KVR_HEADS, h1 = min(h0 + KVR_HEADS, all_heads);
    const int r1 = min(h1, rot_heads); /* rotated heads of this CTA: h0 .. r1-1 */
    const int64_t qkv_w = (int64_t)all_heads * vpr;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        inv_freq[i] = pow((double)g.theta, -2.0 * i / g.d_h);
    for (int64_t tok = blockIdx.x; tok < g.n_tok; tok += gridDim.x) {
        uint4 *xr = qkv + tok * qkv_w;
        const int64_t seq = tok / g.tok_per_seq;
        if (h0 < r1) {
            __syncthreads(); /* inv_freq written / previous token's cs consumed */
            const double p = (double)__ldg(pos + tok);
            for (int i = threadIdx.x; i < half; i += blockDim.x) {
                double sn, cn;
                sincos(p * inv_freq[i], &sn, &cn);
                cs[i] = (float)cn;
                cs[half + i] = (float)sn;
            }
            __syncthreads();
        }
        for (int e = threadIdx.x; e < (r1 - h0) * hv; e += blockDim.x) {
            const int h = h0 + e / hv, c = e % hv;
            uint4 lo = xr[h * vpr + c], hi = xr[h * vpr + hv + c];
            rope8(lo, hi, cs, 8 * c, half);
            xr[h * vpr + c] = lo;
            xr[h * vpr + hv + c] = hi;
            if (h < g.h_q) continue;
            const int32_t row = __ldg(rows + tok * g.h_kv + (h - g.h_q));
            if (row < 0 || row >= g.rows_cap) continue; /* bad device index: skip */
            uint4 *dst = k + ((seq * g.h_kv + (h - g.h_q)) * g.rows_cap + row) * vpr;
            dst[c] = lo;
            dst[hv + c] = hi;
        }
        const int v0 = max(h0, rot_heads);
        for (int e = threadIdx.x; e < (h1 - v0) * vpr; e += blockDim.x) {
            const int h = v0 + e / vpr - rot_heads, c = e % vpr;
            const int32_t row = __ldg(rows + tok * g.h_kv + h);
            if (row < 0 || row >= g.rows_cap) continue;
            v[((seq * g.h_kv + h) * g.rows_cap + row) * vpr + c] = xr[(rot_heads + h) * vpr + c];
        }
    }
}

/* ---- launcher ---- */

/* Launch the fused kernel for n_tok >= 1 tokens: a CTA per (token, chunk of KVR_HEADS heads),
 * grid-stride over tokens. */
static flexdiag_status launch_rope(void *k, void *v, void *qkv, const int32_t *rows,
                                   int64_t n_tok, int32_t tok_per_seq,
                                   const flexdiag_attn_args *a, cudaStream_t st) {
    const size_t smem = (size_t)(a->d_h / 2) * (sizeof(double) + 2 * sizeof(float));
    const int chunks = (a->h_q + 2 * a->h_kv + KVR_HEADS - 1) / KVR_HEADS;
    const kvr_geom g = {n_tok, tok_per_seq, a->h_q, a->h_kv, a->d_h, a->p_cap + a->ring,
                        a->rope_theta};
    const dim3 grid(flexdiag__cuda_blocks(n_tok, 1), (unsigned)chunks);
    kv_append_rope_kernel<<<grid, KVR_THREADS, smem, st>>>((uint4 *)k, (uint4 *)v, (uint4 *)qkv,
                                                           rows, a->pos, g);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* Launch the plain copy kernel for n_tok >= 1 tokens. */
static flexdiag_status launch_copy(void *k, void *v, const void *qkv, const int32_t *rows,
                                   int64_t n_tok, int32_t tok_per_seq,
                                   const flexdiag_attn_args *a, cudaStream_t st) {
    const int32_t vpr = a->d_h / 8;
    const int64_t n_rows = n_tok * a->h_kv;
    const unsigned grid = flexdiag__cuda_blocks(n_rows, KV_APPEND_BLOCK / vpr);
    kv_append_kernel<<<grid, KV_APPEND_BLOCK, 0, st>>>(
        (uint4 *)k, (uint4 *)v, (const uint4 *)qkv, rows, n_rows, tok_per_seq, a->h_q, a->h_kv,
        vpr, a->p_cap + a->ring);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* k, v (n_seq·h_kv·(p_cap + ring), d_h) bf16 caches; qkv (n_tok, (h_q + 2·h_kv)·d_h) bf16;
 * rows (n_tok, h_kv) int32; a->pos (optional) (n_tok) int32 */
extern "C" flexdiag_status flexdiag__cuda_kv_append(void *k, void *v, void *qkv,
                                                    const int32_t *rows, int64_t n_tok,
                                                    int32_t tok_per_seq,
                                                    const flexdiag_attn_args *a,
                                                    flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cuda_attn_check("kv_append", a, s, 0, k, v, qkv, NULL));
    if (a->pos && !(a->rope_theta > 0.0f))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "kv_append: pos is set but rope_theta = %g (need > 0)",
                             (double)a->rope_theta);
    if (a->pos && a->d_h % 16 != 0)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "kv_append: RoPE on CUDA needs d_h a multiple of 16 (8 pairs per "
                             "16-byte vector), got %d: use the CPU backend", (int)a->d_h);
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
    if (a->pos) return launch_rope(k, v, qkv, rows, n_tok, tok_per_seq, a, s->stream);
    return launch_copy(k, v, qkv, rows, n_tok, tok_per_seq, a, s->stream);
}
