/*
 * attn_prefill.cu - the CUDA attn_prefill op: causal attention of every prompt row over the
 * cached prompt rows 0..r of its sequence (varlen through lp), flash-style.
 *
 * One CTA per (sequence, query head, tile of PF_BM = 64 query rows), 4 warps of 16 rows; the
 * Q tile lives in tensor-core fragments. Per K/V tile of PF_BN = 64 rows staged in shared
 * memory (16-byte loads; rows past the causal limit zero-filled, so cache garbage never reaches
 * the math) a warp computes S = Q·Kᵀ with bf16 WMMA (fp32 accumulate), masks and scales it,
 * updates its rows' fp32 online softmax (m, l) (two lanes per row), rescales its fp32 O rows
 * and accumulates O += P·V with P split as P_hi + P_lo (two bf16 terms): one bf16 P costs
 * 2^-9 relative per weight, enough to break the bf16 output tolerance where a few keys cancel;
 * the split keeps ~2^-17 for one more MMA. Query rows lp..p_cap-1 are written as zeros
 * (kernels.h), whole tiles past lp without any math; heaviest tiles are scheduled first.
 * WMMA rather than inline mma.sync: its accumulator layout is opaque, so O stays in shared
 * memory between tiles; prompts are short and this op runs once per request, so the simpler,
 * layout-independent form wins over register-resident accumulators.
 */
#include <mma.h>

#include "kernels/cuda/attn.cuh"
#include "kernels/cuda/cuda_common.cuh"

#define PF_THREADS 128 /* 4 warps × 16 query rows */
#define PF_BM 64       /* query rows per CTA */
#define PF_BN 64       /* key rows per K/V tile */
#define PF_LOG2E 1.4426950408889634f

using namespace nvcuda;

/* Launch-time constants of one call (kernels.h flexdiag_attn_args, device pointers). */
typedef struct prefill_params {
    int32_t h_q, h_kv, g;  /* heads; g = h_q / h_kv */
    int32_t p_cap, ring;   /* rows per (seq, KV head) cache block: p_cap prompt + ring */
    int32_t n_tiles;       /* query tiles per (seq, head): ceil(p_cap / PF_BM) */
    float scale;           /* logit scale */
    const int32_t *lp;     /* (n_seq) valid prompt rows */
} prefill_params;

/* Shared-memory leading dimensions (elements): rows padded by 16 bytes against bank conflicts;
 * WMMA needs multiples of 8 (bf16) / 4 (fp32) and 32-byte aligned fragment rows. */
template <int D> struct pf_layout {
    static constexpr int LDQ = D + 8;     /* Q, K, V tiles, bf16 */
    static constexpr int LDS = PF_BN + 4; /* S tile, fp32 */
    static constexpr int LDP = PF_BN + 8; /* P_hi and P_lo tiles, bf16 */
    static constexpr int LDO = D + 4;     /* O accumulator, fp32 */
    /* Q is only read (into fragments) before the first S tile is stored: they share one region,
     * which keeps D = 128 at 104 KiB, two CTAs per multiprocessor */
    static constexpr size_t qs_bytes = (size_t)PF_BM * LDQ * 2, s_bytes = (size_t)PF_BM * LDS * 4;
    static constexpr size_t qs_region = qs_bytes > s_bytes ? qs_bytes : s_bytes;
    static constexpr size_t bytes = qs_region + (size_t)2 * PF_BN * LDQ * 2 +
                                    (size_t)PF_BM * LDP * 4 + (size_t)PF_BM * LDO * 4;
};

/* ---- device helpers ---- */

/* exp(x - m) with the -inf guard: m == -inf (no key seen yet) gives exp(x) of a -inf x = 0. */
static __device__ __forceinline__ float pf_exp_shift(float x, float m) {
    return exp2f((x - (m == -INFINITY ? 0.0f : m)) * PF_LOG2E);
}

/* rows x D bf16 tile <- global rows 0..rows-1 at src (stride ld elements); rows >= valid
 * are zero-filled. All threads of the CTA take part. */
template <int D>
static __device__ __forceinline__ void pf_load_tile(__nv_bfloat16 *dst, int ldd,
                                                    const __nv_bfloat16 *src, int64_t ld,
                                                    int rows, int valid) {
    constexpr int VPR = D / 8;
    for (int x = (int)threadIdx.x; x < rows * VPR; x += PF_THREADS) {
        const int r = x / VPR, c = x % VPR;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < valid) val = __ldg(reinterpret_cast<const uint4 *>(src + r * ld) + c);
        *reinterpret_cast<uint4 *>(dst + r * ldd + c * 8) = val;
    }
}

/* The 16 query rows one warp owns: its slices of the shared tiles (pf_layout strides). */
template <int D> struct pf_warp {
    float *sf;              /* S rows, fp32 */
    __nv_bfloat16 *ph, *pl; /* P_hi / P_lo rows, bf16 */
    float *of;              /* O rows, fp32 */
};

/* A 16 x 16 bf16 tile of Q (row-major) in tensor-core fragment form. */
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pf_qfrag;

/* S = Q·Kᵀ of the warp's rows against the PF_BN keys of ks. */
template <int D>
static __device__ __forceinline__ void pf_scores(const pf_warp<D> &w, const __nv_bfloat16 *ks,
                                                 const pf_qfrag (&qf)[D / 16]) {
    typedef pf_layout<D> LY;
#pragma unroll
    for (int nt = 0; nt < PF_BN / 16; nt++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc;
        wmma::fill_fragment(sacc, 0.0f);
#pragma unroll
        for (int kt = 0; kt < D / 16; kt++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
            wmma::load_matrix_sync(kb, ks + nt * 16 * LY::LDQ + kt * 16, LY::LDQ);
            wmma::mma_sync(sacc, qf[kt], kb, sacc);
        }
        wmma::store_matrix_sync(w.sf + nt * 16, sacc, LY::LDS, wmma::mem_row_major);
    }
}

/* Row r of the warp (two lanes, half = column half): scale and causal mask of keys k0.., online
 * softmax update of (m, l), P_hi / P_lo, and the O row rescaled. qr = query position. */
template <int D>
static __device__ __forceinline__ void pf_softmax(const pf_warp<D> &w, int r, int half, int k0,
                                                  int qr, int lp, float scale, float &m,
                                                  float &l) {
    typedef pf_layout<D> LY;
    float *srow = w.sf + r * LY::LDS;
    float mx = -INFINITY;
    for (int c = half * (PF_BN / 2); c < (half + 1) * (PF_BN / 2); c++) {
        const int key = k0 + c;
        const float z = (key <= qr && key < lp) ? srow[c] * scale : -INFINITY;
        srow[c] = z;
        mx = fmaxf(mx, z);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mn = fmaxf(m, mx), corr = pf_exp_shift(m, mn);
    float sum = 0.0f;
    for (int c = half * (PF_BN / 2); c < (half + 1) * (PF_BN / 2); c++) {
        const float pv = pf_exp_shift(srow[c], mn);
        const __nv_bfloat16 hi = __float2bfloat16_rn(pv);
        w.ph[r * LY::LDP + c] = hi;
        w.pl[r * LY::LDP + c] = __float2bfloat16_rn(pv - __bfloat162float(hi));
        sum += pv;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = mn;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) w.of[r * LY::LDO + c] *= corr;
}

/* O += (P_hi + P_lo)·V for the warp's rows. */
template <int D>
static __device__ __forceinline__ void pf_accumulate(const pf_warp<D> &w,
                                                     const __nv_bfloat16 *vs) {
    typedef pf_layout<D> LY;
#pragma unroll
    for (int dt = 0; dt < D / 16; dt++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc;
        wmma::load_matrix_sync(oacc, w.of + dt * 16, LY::LDO, wmma::mem_row_major);
#pragma unroll
        for (int kt = 0; kt < PF_BN / 16; kt++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
            wmma::load_matrix_sync(vb, vs + kt * 16 * LY::LDQ + dt * 16, LY::LDQ);
            wmma::load_matrix_sync(pa, w.ph + kt * 16, LY::LDP);
            wmma::mma_sync(oacc, pa, vb, oacc);
            wmma::load_matrix_sync(pa, w.pl + kt * 16, LY::LDP);
            wmma::mma_sync(oacc, pa, vb, oacc);
        }
        wmma::store_matrix_sync(w.of + dt * 16, oacc, LY::LDO, wmma::mem_row_major);
    }
}

/* Half a row of output (D / 2 values from column half·D/2): O / l in bf16, or literal zeros
 * for a padding row (never 0 · garbage). */
template <int D>
static __device__ __forceinline__ void pf_store(uint4 *dst, const float *orow, int half,
                                                bool live, float l) {
    const float inv = live ? __frcp_rn(l) : 0.0f;
    for (int c = half * (D / 16); c < (half + 1) * (D / 16); c++) {
        uint32_t u[4] = {0, 0, 0, 0};
#pragma unroll
        for (int e = 0; e < 4 && live; e++) {
            __nv_bfloat162 b = __floats2bfloat162_rn(orow[c * 8 + 2 * e] * inv,
                                                     orow[c * 8 + 2 * e + 1] * inv);
            memcpy(&u[e], &b, 4);
        }
        dst[c] = make_uint4(u[0], u[1], u[2], u[3]);
    }
}

/* ---- kernel ---- */

/* out (n_seq·p_cap, h_q·D) bf16; qkv (n_seq·p_cap, (h_q + 2·h_kv)·D) bf16; kc, vc caches.
 * Two CTAs per multiprocessor: the shared-memory limit at D = 128; the hint also keeps ptxas
 * (nvcc 13.0) from spilling at D = 32. */
template <int D>
static __global__ void __launch_bounds__(PF_THREADS, 2)
attn_prefill_kernel(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ qkv,
                    const __nv_bfloat16 *__restrict__ kc, const __nv_bfloat16 *__restrict__ vc,
                    prefill_params p) {
    typedef pf_layout<D> LY;
    extern __shared__ __align__(128) unsigned char pf_smem[];
    __nv_bfloat16 *qs = reinterpret_cast<__nv_bfloat16 *>(pf_smem);
    float *sf = reinterpret_cast<float *>(pf_smem); /* aliases qs (pf_layout) */
    __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(pf_smem + LY::qs_region);
    __nv_bfloat16 *vs = ks + PF_BN * LY::LDQ;
    __nv_bfloat16 *ph = vs + PF_BN * LY::LDQ, *pl = ph + PF_BM * LY::LDP;
    float *of = reinterpret_cast<float *>(pl + PF_BM * LY::LDP);

    /* block -> (sequence, head, tile); tiles of one head adjacent, last (heaviest) first */
    const int bid = (int)blockIdx.x;
    const int tile = p.n_tiles - 1 - bid % p.n_tiles, rest = bid / p.n_tiles;
    const int hq = rest % p.h_q, s = rest / p.h_q, hk = hq / p.g;
    const int q0 = tile * PF_BM;
    const int lp = min(max(__ldg(p.lp + s), 0), p.p_cap);
    const int64_t out_ld = (int64_t)p.h_q * D, qkv_ld = (int64_t)(p.h_q + 2 * p.h_kv) * D;
    __nv_bfloat16 *out_t = out + ((int64_t)s * p.p_cap + q0) * out_ld + (int64_t)hq * D;
    const int rows_out = min(PF_BM, p.p_cap - q0); /* rows of this tile inside the sequence */

    if (q0 >= lp) { /* padding rows only: zeros */
        for (int x = (int)threadIdx.x; x < rows_out * (D / 8); x += PF_THREADS)
            reinterpret_cast<uint4 *>(out_t + (x / (D / 8)) * out_ld)[x % (D / 8)] =
                make_uint4(0, 0, 0, 0);
        return;
    }

    /* Q tile (-> fragments) and zeroed O */
    pf_load_tile<D>(qs, LY::LDQ, qkv + ((int64_t)s * p.p_cap + q0) * qkv_ld + (int64_t)hq * D,
                    qkv_ld, PF_BM, lp - q0);
    for (int x = (int)threadIdx.x; x < PF_BM * D; x += PF_THREADS)
        of[(x / D) * LY::LDO + x % D] = 0.0f;
    __syncthreads();
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int wr = warp * 16;                 /* first tile row of this warp */
    const int r = lane >> 1, half = lane & 1; /* softmax: two lanes per row */
    const int qr = q0 + wr + r;               /* query row (prompt position) */
    pf_qfrag qf[D / 16];
#pragma unroll
    for (int kt = 0; kt < D / 16; kt++)
        wmma::load_matrix_sync(qf[kt], qs + wr * LY::LDQ + kt * 16, LY::LDQ);

    const pf_warp<D> w = {sf + wr * LY::LDS, ph + wr * LY::LDP, pl + wr * LY::LDP,
                          of + wr * LY::LDO};
    float m = -INFINITY, l = 0.0f; /* this row's softmax state (both lanes hold it) */
    const int64_t cache_blk = ((int64_t)s * p.h_kv + hk) * (p.p_cap + p.ring) * D;
    const int kmax = min(lp, q0 + PF_BM); /* keys any row of the tile may see */
    for (int k0 = 0; k0 < kmax; k0 += PF_BN) {
        __syncthreads(); /* all warps are done with the previous K/V tile and with qs (= sf) */
        pf_load_tile<D>(ks, LY::LDQ, kc + cache_blk + (int64_t)k0 * D, D, PF_BN, kmax - k0);
        pf_load_tile<D>(vs, LY::LDQ, vc + cache_blk + (int64_t)k0 * D, D, PF_BN, kmax - k0);
        __syncthreads();
        pf_scores<D>(w, ks, qf);
        __syncwarp();
        pf_softmax<D>(w, r, half, k0, qr, lp, p.scale, m, l);
        __syncwarp();
        pf_accumulate<D>(w, vs);
        __syncwarp();
    }

    /* rows >= lp are zeros; rows past p_cap belong to no sequence */
    if (wr + r < rows_out)
        pf_store<D>(reinterpret_cast<uint4 *>(out_t + (int64_t)(wr + r) * out_ld),
                    w.of + r * LY::LDO, half, qr < lp && l != 0.0f, l);
}

/* ---- launcher ---- */

template <int D>
static flexdiag_status prefill_launch(unsigned grid, cudaStream_t st, void *out, const void *qkv,
                                      const void *k, const void *v, const prefill_params &p) {
    const size_t smem = pf_layout<D>::bytes;
    FLEXDIAG_CUDA_TRY(cudaFuncSetAttribute(attn_prefill_kernel<D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem));
    attn_prefill_kernel<D><<<grid, PF_THREADS, smem, st>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)qkv, (const __nv_bfloat16 *)k,
        (const __nv_bfloat16 *)v, p);
    return FLEXDIAG_OK;
}

/* out (n_seq·p_cap, h_q·d_h) bf16; qkv (n_seq·p_cap, (h_q + 2·h_kv)·d_h) bf16; k, v caches
 * (kernels.h layout), prompt rows 0..lp[s]-1 already appended */
extern "C" flexdiag_status flexdiag__cuda_attn_prefill(void *out, const void *qkv, const void *k,
                                                       const void *v, const flexdiag_attn_args *a,
                                                       flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cuda_attn_check("attn_prefill", a, s, 1, out, qkv, k, v));
    if (a->n_seq == 0 || a->p_cap == 0) return FLEXDIAG_OK;
    if (!out || !qkv || !k || !v)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "attn_prefill: NULL out, qkv, k or v");
    const int32_t n_tiles = (a->p_cap + PF_BM - 1) / PF_BM;
    const int64_t blocks = (int64_t)a->n_seq * a->h_q * n_tiles;
    if (blocks > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_prefill: n_seq·h_q·ceil(p_cap / %d) = %lld exceeds the grid "
                             "(2^31 - 1); split the batch", PF_BM, (long long)blocks);
    const prefill_params p = {a->h_q, a->h_kv, a->h_q / a->h_kv, a->p_cap, a->ring, n_tiles,
                              a->scale, a->lp};
    const unsigned grid = (unsigned)blocks;
    switch (a->d_h) {
    case 16: FLEXDIAG_TRY(prefill_launch<16>(grid, s->stream, out, qkv, k, v, p)); break;
    case 32: FLEXDIAG_TRY(prefill_launch<32>(grid, s->stream, out, qkv, k, v, p)); break;
    case 64: FLEXDIAG_TRY(prefill_launch<64>(grid, s->stream, out, qkv, k, v, p)); break;
    default: FLEXDIAG_TRY(prefill_launch<128>(grid, s->stream, out, qkv, k, v, p)); break;
    }
    FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
    return FLEXDIAG_OK;
}
