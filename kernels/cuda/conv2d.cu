/*
 * conv2d.cu - the image decoder's convolution (kernels.h conv2d): stride 1, zero padding
 * (k-1)/2, NCHW fp32 activations in and out, bf16 weights (cout, cin, k, k), bf16 products with
 * fp32 accumulation on the tensor cores through cuBLAS.
 *
 * Per image the convolution is the GEMM out (cout, hw) = W (cout, cin·k²) · col (cin·k², hw).
 * In column-major BLAS terms an NCHW output plane is D (hw × cout, ld hw): pixels are the M
 * dimension, cout the N dimension, and D is written in place in fp32, images apart by a batch
 * stride; FLEXDIAG_MM_ACCUM is beta = 1 on that fp32 D, so residual sums never round to bf16.
 * Every kernel size takes one path: im2col into the stream workspace, in chunks of pixels of a
 * group of images that fit (a chunk is written by the im2col kernel and read right away by the
 * GEMM, mostly from L2). The im2col pass is where x is rounded to bf16 for the tensor cores, the
 * only rounding of an activation in this op; for k = 1 it is just that conversion. The bias
 * rides along as one extra K row of ones against a weight column holding b, so it enters the
 * fp32 accumulation as in the reference; K is padded with zero rows to a multiple of 8 (16-byte
 * columns for the tensor cores). The padded weights W' (cout, K') are staged at the head of the
 * workspace once per call.
 * Workspace: [W' | im2col chunk | cuBLAS tail (CONV_BLAS_WS)]. The stream's cuBLAS handle is
 * pointed at the tail while the op runs, so split-K partials never overwrite the chunk, and
 * back at the whole workspace afterwards (flexdiag__cuda_blas_ws_tail, also used by
 * attn_spatial in vq_ops.cu).
 * Rejected: nine shifted GEMMs (need an fp32 accumulator as large as the output); a
 * hand-written implicit-GEMM kernel (no im2col traffic, but cuBLAS' Hopper kernels are proven
 * and the im2col pass costs about as much as the GEMM at worst); TF32 GEMMs on the fp32 x (half
 * the bf16 tensor-core rate and twice the column bytes, while a CPU emulation of bf16 columns
 * with everything else fp32 already gave 0.0119 relative L2 on the golden fixture, limit 2e-2).
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#include <limits.h>

/* Workspace tail left to cuBLAS: its non-split algorithms need none, split-K partials for
 * these shapes (M ≥ 576, N ≤ 512) a few MiB at most. */
#define CONV_BLAS_WS ((size_t)4 << 20)

/* Pixels per image below which a chunk takes fewer images rather than shorter rows: keeps the
 * GEMM's M dimension long enough to fill the device with tiles. */
#define CONV_MIN_CHUNK 2048

static __host__ __device__ __forceinline__ int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }
/* ---- kernels ---- */

/* wp (cout, kp) = [w (cout, kw) | b | 0 ...]: the bias column exists when b != NULL. */
static __global__ void pack_weights_kernel(__nv_bfloat16 *__restrict__ wp,
                                           const __nv_bfloat16 *__restrict__ w,
                                           const __nv_bfloat16 *__restrict__ b, int64_t cout,
                                           int64_t kw, int64_t kp) {
    const int64_t total = cout * kp, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t co = i / kp, r = i % kp;
        __nv_bfloat16 v = __ushort_as_bfloat16((unsigned short)0);
        if (r < kw) v = w[co * kw + r];
        else if (r == kw && b) v = b[co];
        wp[i] = v;
    }
}

/* Geometry of one im2col chunk (host struct passed by value). */
typedef struct col_geom {
    int64_t h, wd;    /* plane height and width */
    int32_t k;        /* kernel size (odd) */
    int32_t has_bias; /* row kw is ones (bias row) */
    int64_t kw;       /* cin·k² data rows */
    int64_t kp;       /* rows incl. the bias row and zero padding, multiple of 8 */
    int64_t p0, np;   /* first pixel of the chunk, pixels in it */
    int64_t pcap;     /* columns per row in the buffer (lda), multiple of 8 */
    int64_t x_stride; /* elements between images of x: cin·h·wd */
} col_geom;

/* col (nb, kp, pcap) bf16: col[b][r][q] = bf16(x[b][ci][y + ky - pad][x + kx - pad]) for pixel
 * p0 + q = (y, x) and row r = (ci·k + ky)·k + kx, zero outside the image and past np; row kw is
 * 1 when has_bias, later rows 0. A thread writes 8 consecutive columns with one 16-byte store.
 * Index arithmetic is 32-bit (a chunk's work is bounded by the workspace, h·wd and kp by the
 * launcher's checks): 64-bit divisions would cost more than the memory traffic. */
static __global__ void im2col_kernel(__nv_bfloat16 *__restrict__ col,
                                     const float *__restrict__ x, col_geom g, uint32_t nb) {
    const uint32_t vecs = (uint32_t)(round8(g.np) / 8), kp = (uint32_t)g.kp, wd = (uint32_t)g.wd;
    const uint32_t total = nb * kp * vecs, step = gridDim.x * blockDim.x;
    const uint32_t k = (uint32_t)g.k, kk = k * k, pad = (k - 1) / 2;
    const int32_t h = (int32_t)g.h, w = (int32_t)g.wd;
    for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const uint32_t q0 = (t % vecs) * 8, br = t / vecs, r = br % kp, b = br / kp;
        float v[8];
        if (r < (uint32_t)g.kw) {
            const uint32_t ci = r / kk, tap = r % kk;
            const int32_t dy = (int32_t)(tap / k) - (int32_t)pad;
            const int32_t dx = (int32_t)(tap % k) - (int32_t)pad;
            const float *xp = x + (int64_t)b * g.x_stride + (int64_t)ci * g.h * g.wd;
            const uint32_t p = (uint32_t)g.p0 + q0;
            int32_t y = (int32_t)(p / wd), xx = (int32_t)(p % wd);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int32_t sy = y + dy, sx = xx + dx;
                const bool in = q0 + e < g.np && sy >= 0 && sy < h && sx >= 0 && sx < w;
                v[e] = in ? xp[(int64_t)sy * w + sx] : 0.0f;
                if (++xx == w) {
                    xx = 0;
                    y++;
                }
            }
        } else {
            const float one = (r == g.kw && g.has_bias) ? 1.0f : 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = q0 + e < g.np ? one : 0.0f;
        }
        uint4 u;
        __nv_bfloat162 *u2 = (__nv_bfloat162 *)&u;
#pragma unroll
        for (int e = 0; e < 4; e++) u2[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
        *(uint4 *)(col + ((int64_t)b * kp + r) * g.pcap + q0) = u;
    }
}

/* ---- cuBLAS ---- */

extern "C" flexdiag_status flexdiag__cuda_blas_ws_tail(flexdiag_stream *s, size_t offset) {
    FLEXDIAG_ASSERT(offset < s->workspace_bytes);
    FLEXDIAG_CUBLAS_TRY(cublasSetWorkspace(s->blas, (char *)s->workspace + offset,
                                           s->workspace_bytes - offset));
    return FLEXDIAG_OK;
}

/* Strided-batched GEMM D (m × nn) = A (m × kk) · B (kk × nn) + beta·D, column-major, no
 * transposes: bf16 A and B, fp32 accumulation, fp32 D. */
static flexdiag_status gemm_nn(flexdiag_stream *s, int64_t m, int64_t nn, int64_t kk,
                               const void *a, int64_t lda, int64_t sa, const void *b, int64_t ldb,
                               int64_t sb, float beta, float *d, int64_t ldd, int64_t sd,
                               int64_t batch) {
    const float alpha = 1.0f;
    FLEXDIAG_CUBLAS_TRY(cublasGemmStridedBatchedEx(
        s->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)m, (int)nn, (int)kk, &alpha, a, CUDA_R_16BF,
        (int)lda, (long long)sa, b, CUDA_R_16BF, (int)ldb, (long long)sb, &beta, d, CUDA_R_32F,
        (int)ldd, (long long)sd, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return FLEXDIAG_OK;
}

/* ---- im2col + GEMM ---- */

/* Arguments of one conv2d call. */
typedef struct conv_args {
    float *out;              /* (n, cout, h, wd) */
    const float *x;          /* (n, cin, h, wd) */
    const __nv_bfloat16 *w;  /* (cout, cin, k, k) */
    const __nv_bfloat16 *b;  /* (cout) or NULL */
    int64_t n;               /* images */
    int32_t cin, cout, k;    /* channels, kernel size */
    int64_t h, wd, hw;       /* plane */
    int accum;               /* FLEXDIAG_MM_ACCUM */
} conv_args;

/* Chunking: images per chunk and pixel columns per image in the buffer. */
static void plan_chunks(const conv_args *c, size_t region, int64_t kp, int64_t *nb,
                        int64_t *pcap) {
    const int64_t full = round8(c->hw), cols = (int64_t)(region / ((size_t)kp * 2));
    if (c->n * full <= cols) {
        *nb = c->n;
        *pcap = full;
        return;
    }
    const int64_t per_img = full < CONV_MIN_CHUNK ? full : CONV_MIN_CHUNK;
    int64_t b = cols / per_img;
    b = b < 1 ? 1 : (b > c->n ? c->n : b);
    const int64_t p = cols / b / 8 * 8;
    *nb = b;
    *pcap = p < full ? p : full;
}

/* im2col chunks of the workspace, one strided-batched GEMM per chunk. */
static flexdiag_status conv_run(const conv_args *c, flexdiag_stream *s) {
    const int64_t kw = (int64_t)c->cin * c->k * c->k, kp = round8(kw + (c->b ? 1 : 0));
    const size_t wp_bytes = flexdiag__round256((size_t)(c->cout * kp) * 2);
    if (wp_bytes + CONV_BLAS_WS + (size_t)kp * 16 > s->workspace_bytes || kp > INT_MAX)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "cuda conv2d: cin = %d, cout = %d, k = %d: the padded weights and "
                             "one im2col column block need more than the %zu-byte stream "
                             "workspace: use smaller layers or the CPU backend",
                             c->cin, c->cout, c->k, s->workspace_bytes);
    __nv_bfloat16 *wp = (__nv_bfloat16 *)s->workspace;
    __nv_bfloat16 *col = (__nv_bfloat16 *)((char *)s->workspace + wp_bytes);
    const size_t region = s->workspace_bytes - CONV_BLAS_WS - wp_bytes;
    pack_weights_kernel<<<flexdiag__cuda_blocks(c->cout * kp, FLEXDIAG_CUDA_BLOCK),
                          FLEXDIAG_CUDA_BLOCK, 0, s->stream>>>(wp, c->w, c->b, c->cout, kw, kp);
    FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
    int64_t nb, pcap;
    plan_chunks(c, region, kp, &nb, &pcap);
    const float beta = c->accum ? 1.0f : 0.0f;
    for (int64_t i0 = 0; i0 < c->n; i0 += nb) {
        const int64_t ni = c->n - i0 < nb ? c->n - i0 : nb;
        for (int64_t p0 = 0; p0 < c->hw; p0 += pcap) {
            const int64_t np = c->hw - p0 < pcap ? c->hw - p0 : pcap;
            const col_geom g = {c->h,    c->wd, c->k, c->b != NULL, kw, kp, p0,
                                np,      pcap,  (int64_t)c->cin * c->hw};
            im2col_kernel<<<flexdiag__cuda_blocks(ni * kp * (round8(np) / 8), FLEXDIAG_CUDA_BLOCK),
                            FLEXDIAG_CUDA_BLOCK, 0, s->stream>>>(
                col, c->x + i0 * c->cin * c->hw, g, (uint32_t)ni);
            FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
            FLEXDIAG_TRY(gemm_nn(s, np, c->cout, kp, col, pcap, kp * pcap, wp, kp, 0, beta,
                                 c->out + i0 * c->cout * c->hw + p0, c->hw,
                                 (int64_t)c->cout * c->hw, ni));
        }
    }
    return FLEXDIAG_OK;
}

/* ---- launcher ---- */

static flexdiag_status conv_check(const void *out, const void *x, const uint16_t *w, int64_t n,
                                  int32_t cin, int32_t cout, int32_t h, int32_t wd, int32_t k,
                                  unsigned flags, const flexdiag_stream *s) {
    if (n < 0 || cin <= 0 || cout <= 0 || h <= 0 || wd <= 0 || k <= 0 || k % 2 == 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda conv2d: n = %lld, cin = %d, cout = %d, h = %d, w = %d, k = %d: "
                             "need n >= 0, positive sizes and an odd kernel size",
                             (long long)n, cin, cout, h, wd, k);
    if (flags & ~FLEXDIAG_MM_ACCUM)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda conv2d: flags = 0x%x: only FLEXDIAG_MM_ACCUM is allowed", flags);
    if ((int64_t)h * wd > INT_MAX || n > INT_MAX)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "cuda conv2d: %d x %d pixels, %lld images: cuBLAS takes 32-bit "
                             "sizes: split the batch or the image",
                             h, wd, (long long)n);
    if (!s)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda conv2d: no stream: the GEMMs need the cuBLAS handle and "
                             "workspace of a stream from stream_create");
    if (n > 0 && (!out || !x || !w))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda conv2d: out %p, x %p, w %p: need device buffers", out, x,
                             (const void *)w);
    return FLEXDIAG_OK;
}

/* out (n, cout, h, wd) f32 (+)= conv(x (n, cin, h, wd) f32, w (cout, cin, k, k) bf16) + b (cout)
 * bf16 */
extern "C" flexdiag_status flexdiag__cuda_conv2d(void *out, const void *x, const uint16_t *w,
                                                 const uint16_t *b, int64_t n, int32_t cin,
                                                 int32_t cout, int32_t h, int32_t wd, int32_t k,
                                                 unsigned flags, flexdiag_stream *s) {
    FLEXDIAG_TRY(conv_check(out, x, w, n, cin, cout, h, wd, k, flags, s));
    if (n == 0) return FLEXDIAG_OK;
    const conv_args c = {(float *)out,
                         (const float *)x,
                         (const __nv_bfloat16 *)w,
                         (const __nv_bfloat16 *)b,
                         n,
                         cin,
                         cout,
                         k,
                         h,
                         wd,
                         (int64_t)h * wd,
                         (flags & FLEXDIAG_MM_ACCUM) != 0};
    FLEXDIAG_TRY(flexdiag__cuda_blas_ws_tail(s, s->workspace_bytes - CONV_BLAS_WS));
    const flexdiag_status st = conv_run(&c, s);
    const flexdiag_status back = flexdiag__cuda_blas_ws_tail(s, 0);
    return st != FLEXDIAG_OK ? st : back;
}
