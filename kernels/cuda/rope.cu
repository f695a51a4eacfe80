/*
 * rope.cu - rotary position embedding, HF rotate-half layout (models.md §2), in place on n_heads
 * heads of d_h columns starting at col0 of each bf16 row (q and k heads inside a qkv row).
 *
 * Element i pairs with i + d_h/2: x'[i] = x[i]·cos − x[i+h]·sin, x'[i+h] = x[i+h]·cos + x[i]·sin
 * with angle = pos·inv_freq[i], inv_freq[i] = theta^(−2i/d_h). To agree with the CPU reference
 * (which follows the same recipe), inv_freq and the angle are computed in double and cos/sin
 * rounded to fp32: fp32 angles would be off by up to 2^-10 rad at position 16384 and the
 * rotated values by the same relative amount, a large share of a bf16 ulp. The rotation itself
 * is fp32 with explicit round-to-nearest multiplies (no fma contraction, as on the CPU), then
 * one rounding to bf16.
 *
 * One CTA per row (grid-stride): it computes inv_freq once into shared memory, per row the
 * d_h/2 cos/sin pairs (double sincos: H200 has full-rate fp64, and there are only d_h/2 per
 * row), then its 2-D thread block rotates heads (y) × pairs (x).
 */
#include "cuda_common.cuh"
#include "cuda_ops.cuh"

/* Largest head dim: keeps the shared tables (16 bytes per pair) under the 48 KiB default. */
#define ROPE_MAX_DH 4096

static __global__ void rope_kernel(__nv_bfloat16 *__restrict__ x, const int32_t *__restrict__ pos,
                                   int64_t n, int64_t stride, int64_t col0, int n_heads,
                                   int d_h, float theta) {
    extern __shared__ double smem[];
    const int half = d_h / 2;
    double *inv_freq = smem;                   /* (half) */
    float *cs = (float *)(smem + half);        /* (half) cos, then (half) sin */
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    for (int i = tid; i < half; i += nt) inv_freq[i] = pow((double)theta, -2.0 * i / d_h);
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const double p = (double)pos[row];
        __syncthreads(); /* inv_freq written / previous row's cs consumed */
        for (int i = tid; i < half; i += nt) {
            double sn, cn;
            sincos(p * inv_freq[i], &sn, &cn);
            cs[i] = (float)cn;
            cs[half + i] = (float)sn;
        }
        __syncthreads();
        __nv_bfloat16 *xr = x + row * stride + col0;
        for (int h = threadIdx.y; h < n_heads; h += blockDim.y) {
            __nv_bfloat16 *xh = xr + (int64_t)h * d_h;
            for (int i = threadIdx.x; i < half; i += blockDim.x) {
                const float a = __bfloat162float(xh[i]), b = __bfloat162float(xh[i + half]);
                const float c = cs[i], s = cs[half + i];
                xh[i] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
                xh[i + half] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
            }
        }
    }
}

/* x (n, stride) bf16 in place; pos (n) int32 */
extern "C" flexdiag_status flexdiag__cuda_rope(void *x, const int32_t *pos, int64_t n,
                                               int64_t stride, int64_t col0, int32_t n_heads,
                                               int32_t d_h, float theta, flexdiag_stream *s) {
    if (n < 0 || col0 < 0 || n_heads < 0 || d_h < 2 || d_h % 2 || d_h > ROPE_MAX_DH ||
        !(theta > 0.0f) || stride < col0 + (int64_t)n_heads * d_h ||
        (n > 0 && n_heads > 0 && (!x || !pos)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda rope: n = %lld, stride = %lld, col0 = %lld, n_heads = %d, "
                             "d_h = %d, theta = %g: need an even d_h in 2..%d, theta > 0 and "
                             "col0 + n_heads·d_h <= stride",
                             (long long)n, (long long)stride, (long long)col0, n_heads, d_h,
                             (double)theta, ROPE_MAX_DH);
    if (n == 0 || n_heads == 0) return FLEXDIAG_OK;
    const int half = d_h / 2;
    const unsigned bx = half < 128 ? (unsigned)half : 128u;
    unsigned by = 256u / bx;
    if (by > (unsigned)n_heads) by = (unsigned)n_heads;
    const size_t smem = (size_t)half * (sizeof(double) + 2 * sizeof(float));
    cudaStream_t st = flexdiag__cuda_st(s);
    rope_kernel<<<flexdiag__cuda_blocks(n, 1), dim3(bx, by), smem, st>>>(
        (__nv_bfloat16 *)x, pos, n, stride, col0, n_heads, d_h, theta);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
