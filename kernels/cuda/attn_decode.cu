/*
 * attn_decode.cu - the CUDA attn_decode op: one query token per sequence attends its prompt
 * rows and the ring rows its KV policy selected (policies.md §4.3), the hot kernel of decoding.
 *
 * Grid: one CTA per (sequence, KV head) (times ceil(g / 8) chunks when a group has more than 8
 * query heads); the CTA runs all query heads of the group, so every K/V row is read from HBM
 * once and used g times. The attended keys form one list: j < lp are prompt rows 0..lp-1
 * (contiguous), j >= lp are ring rows p_cap + slots[s][h][j - lp] (token-granular gather).
 * A key row of d_h bf16 is split over L = d_h / 8 lanes that each load 16 bytes (K and V); a
 * warp thus holds 32 / L rows per load, and each such "row group" takes every NG-th key of the
 * list, U keys per iteration, so U K rows and U V rows per lane are in flight before any use.
 * Each row group keeps its own online-softmax state (m, l, acc) per query head in fp32
 * registers; at the end the groups of a warp merge through shuffles and the warps through
 * shared memory (the usual (m, l, acc) rescaling merge), and the result is written as bf16.
 * Per key, all g fp32 logits of the group sit in the registers of the row group's lanes: a
 * per-key reduction across the group (Diagonal's fused argmin, policies.md §2.6) plugs in at
 * the "per-key logits" step without changing the data flow.
 * Rejected: a CTA per query head (re-reads K/V g times), staging K/V through shared memory
 * (every row is used by one row group only, registers suffice) and split-K (our batches give
 * B·H_kv >= 800 CTAs; policies.md §4.3 makes it optional for small batches).
 */
#include "attn.cuh"
#include "cuda_common.cuh"

/* Threads per CTA: 4 warps; a (sequence, KV head) of a few hundred keys fills them, and several
 * CTAs per multiprocessor keep enough loads in flight for HBM. */
#define DEC_THREADS 128
#define DEC_WARPS (DEC_THREADS / 32)
/* Query heads one CTA serves at most (register budget: 16 fp32 values per head per lane). */
#define DEC_MAX_G 8
/* CTAs per multiprocessor asked of the register allocator for groups of <= 4 heads: without the
 * hint ptxas spills a few bytes at g = 1 (seen with nvcc 13.0); 4 keeps <= 128 registers and
 * no spills for every instantiation. g = 8 needs ~255 registers and gets no hint. */
#define DEC_MIN_CTAS 4

#define DEC_LOG2E 1.4426950408889634f

/* Launch-time constants of one call (kernels.h flexdiag_attn_args, device pointers). */
typedef struct decode_params {
    int32_t h_q, h_kv, g;         /* heads; g = h_q / h_kv */
    int32_t p_cap, ring;          /* rows per (seq, KV head) block: p_cap prompt + ring */
    int32_t max_slots;            /* stride of slots and logits_out */
    float scale;                  /* logit scale */
    const int32_t *lp;            /* (n_seq) prompt rows */
    const int32_t *slots;         /* (n_seq, h_kv, max_slots) ring rows */
    const int32_t *n_slots;       /* (n_seq, h_kv) valid slots */
    float *logits_out;            /* (n_seq, h_q, max_slots) or NULL */
    float *lse_out;               /* (n_seq, h_q) or NULL */
} decode_params;

/* ---- small device helpers ---- */

/* 8 bf16 of a 16-byte vector to fp32 (element 0 in the low half of word 0). */
static __device__ __forceinline__ void bf16x8_to_f32(uint4 w, float f[8]) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

/* 8 fp32 to 8 bf16 (round to nearest even) in a 16-byte vector. */
static __device__ __forceinline__ uint4 f32_to_bf16x8(const float f[8]) {
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 b = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        memcpy(&u[i], &b, 4);
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}

/* exp(x - m) with the -inf guard: m == -inf (no key seen yet) gives exp(x) of a -inf x = 0. */
static __device__ __forceinline__ float exp_shift(float x, float m) {
    return exp2f((x - (m == -INFINITY ? 0.0f : m)) * DEC_LOG2E);
}

/* ---- kernel ---- */

/* out (n_seq, h_q·D) bf16; qkv (n_seq, (h_q + 2·h_kv)·D) bf16; kc, vc caches; all as 16-byte
 * vectors. G query heads per CTA (ng <= G of them live), U keys per row group per iteration. */
template <int D, int G, int U>
static __global__ void __launch_bounds__(DEC_THREADS, G <= 4 ? DEC_MIN_CTAS : 1)
attn_decode_kernel(uint4 *__restrict__ out, const uint4 *__restrict__ qkv,
                   const uint4 *__restrict__ kc, const uint4 *__restrict__ vc, decode_params p) {
    constexpr int L = D / 8;              /* lanes per key row */
    constexpr int RPW = 32 / L;           /* row groups per warp */
    constexpr int NG = DEC_WARPS * RPW;   /* row groups per CTA */
    __shared__ float sm_acc[DEC_WARPS][G][D];
    __shared__ float sm_m[DEC_WARPS][G], sm_l[DEC_WARPS][G];

    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int sub = lane % L, grp = warp * RPW + lane / L;
    const int bh = (int)blockIdx.x; /* s·h_kv + h: also the index of the (s, h) cache block */
    const int s = bh / p.h_kv, h = bh - s * p.h_kv;
    const int hq0 = h * p.g + (int)blockIdx.y * G;
    const int ng = min(G, p.g - (int)blockIdx.y * G);

    /* this lane's 8 elements of each query head */
    float q[G][8];
    const int64_t qkv_w = (int64_t)(p.h_q + 2 * p.h_kv) * L;
#pragma unroll
    for (int i = 0; i < G; i++) {
        uint4 w = make_uint4(0, 0, 0, 0);
        if (i < ng) w = __ldg(qkv + s * qkv_w + (int64_t)(hq0 + i) * L + sub);
        bf16x8_to_f32(w, q[i]);
    }

    /* key list: lp prompt rows, then ns ring slots (clamped: device data, file comment) */
    const int lp = min(max(__ldg(p.lp + s), 0), p.p_cap);
    const int ns = p.max_slots > 0 ? min(max(__ldg(p.n_slots + bh), 0), p.max_slots) : 0;
    const int n = lp + ns;
    const int64_t blk = (int64_t)bh * (p.p_cap + p.ring) * L + sub;
    const uint4 *kb = kc + blk, *vb = vc + blk;
    const int32_t *sl = p.slots + (int64_t)bh * p.max_slots;
    float *lg = p.logits_out ? p.logits_out + ((int64_t)s * p.h_q + hq0) * p.max_slots : nullptr;

    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int i = 0; i < G; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[i][e] = 0.0f;
    }

    for (int j0 = 0; j0 < n; j0 += NG * U) {
        /* rows of this group's U keys; an invalid slot index masks its key */
        int32_t row[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * NG + grp;
            ok[u] = j < n;
            row[u] = j;
            if (ok[u] && j >= lp) {
                const int32_t slot = __ldg(sl + (j - lp));
                ok[u] = (uint32_t)slot < (uint32_t)p.ring;
                row[u] = p.p_cap + slot;
            }
        }
        /* all loads of the iteration first */
        uint4 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
            if (ok[u]) {
                kr[u] = __ldg(kb + (int64_t)row[u] * L);
                vr[u] = __ldg(vb + (int64_t)row[u] * L);
            }
        }
        /* per-key logits z[u][i] = scale·(q_i·k_u), complete in every lane of the group */
        float z[U][G];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[8];
            bf16x8_to_f32(kr[u], kf);
#pragma unroll
            for (int i = 0; i < G; i++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) d = fmaf(q[i][e], kf[e], d);
                z[u][i] = d;
            }
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int i = 0; i < G; i++) z[u][i] += __shfl_xor_sync(0xffffffffu, z[u][i], o);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < G; i++) z[u][i] = ok[u] ? z[u][i] * p.scale : -INFINITY;
        if (lg && sub == 0) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = j0 + u * NG + grp;
                if (j >= lp && j < n)
#pragma unroll
                    for (int i = 0; i < G; i++)
                        if (i < ng) lg[(int64_t)i * p.max_slots + (j - lp)] = z[u][i];
            }
        }
        /* online softmax: one rescale per iteration and head */
        float vf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) bf16x8_to_f32(vr[u], vf[u]);
#pragma unroll
        for (int i = 0; i < G; i++) {
            float mx = z[0][i];
#pragma unroll
            for (int u = 1; u < U; u++) mx = fmaxf(mx, z[u][i]);
            const float mn = fmaxf(m[i], mx);
            const float corr = exp_shift(m[i], mn);
            float pu[U], sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; u++) {
                pu[u] = exp_shift(z[u][i], mn);
                sum += pu[u];
            }
            l[i] = l[i] * corr + sum;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float a = acc[i][e] * corr;
#pragma unroll
                for (int u = 0; u < U; u++) a = fmaf(pu[u], vf[u][e], a);
                acc[i][e] = a;
            }
            m[i] = mn;
        }
    }

    /* merge the row groups of the warp (lanes L, 2L, ... apart hold the same elements) */
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
#pragma unroll
        for (int i = 0; i < G; i++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[i], o);
            const float lo = __shfl_xor_sync(0xffffffffu, l[i], o);
            const float mn = fmaxf(m[i], mo);
            const float ca = exp_shift(m[i], mn), cb = exp_shift(mo, mn);
            l[i] = l[i] * ca + lo * cb;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[i][e], o);
                acc[i][e] = acc[i][e] * ca + ao * cb;
            }
            m[i] = mn;
        }
    }
    /* merge the warps through shared memory */
    if (lane < L) {
#pragma unroll
        for (int i = 0; i < G; i++) {
#pragma unroll
            for (int e = 0; e < 8; e++) sm_acc[warp][i][sub * 8 + e] = acc[i][e];
            if (sub == 0) {
                sm_m[warp][i] = m[i];
                sm_l[warp][i] = l[i];
            }
        }
    }
    __syncthreads();
    for (int t = (int)threadIdx.x; t < G * L; t += DEC_THREADS) {
        const int i = t / L, c = t % L;
        if (i >= ng) continue;
        float mx = sm_m[0][i];
#pragma unroll
        for (int w = 1; w < DEC_WARPS; w++) mx = fmaxf(mx, sm_m[w][i]);
        float lsum = 0.0f, o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            const float f = exp_shift(sm_m[w][i], mx);
            lsum += sm_l[w][i] * f;
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = fmaf(sm_acc[w][i][c * 8 + e], f, o[e]);
        }
        /* no attended key (lp = 0, no slots): zeros and lse = -inf. __frcp_rn: a correctly
         * rounded reciprocal without the division slow-path call (and its stack frame). */
        const float inv = lsum == 0.0f ? 0.0f : __frcp_rn(lsum);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] *= inv;
        out[((int64_t)s * p.h_q + hq0 + i) * L + c] = f32_to_bf16x8(o);
        if (c == 0 && p.lse_out)
            p.lse_out[(int64_t)s * p.h_q + hq0 + i] = lsum == 0.0f ? -INFINITY : mx + logf(lsum);
    }
}

/* ---- launcher ---- */

/* Launch the instantiation for D and the CTA head count G. */
template <int D, int G>
static void decode_launch(dim3 grid, cudaStream_t st, void *out, const void *qkv, const void *k,
                          const void *v, const decode_params &p) {
    /* keys in flight per row group: fewer for wide groups to stay clear of spills */
    constexpr int U = G <= 2 ? 4 : 2;
    attn_decode_kernel<D, G, U><<<grid, DEC_THREADS, 0, st>>>(
        (uint4 *)out, (const uint4 *)qkv, (const uint4 *)k, (const uint4 *)v, p);
}

template <int D>
static void decode_launch_g(int G, dim3 grid, cudaStream_t st, void *out, const void *qkv,
                            const void *k, const void *v, const decode_params &p) {
    switch (G) {
    case 1: decode_launch<D, 1>(grid, st, out, qkv, k, v, p); break;
    case 2: decode_launch<D, 2>(grid, st, out, qkv, k, v, p); break;
    case 4: decode_launch<D, 4>(grid, st, out, qkv, k, v, p); break;
    default: decode_launch<D, 8>(grid, st, out, qkv, k, v, p); break;
    }
}

/* out (n_seq, h_q·d_h) bf16; qkv (n_seq, (h_q + 2·h_kv)·d_h) bf16; k, v caches (kernels.h);
 * slots (n_seq, h_kv, max_slots), n_slots (n_seq, h_kv) int32; logits_out, lse_out optional */
extern "C" flexdiag_status flexdiag__cuda_attn_decode(void *out, const void *qkv, const void *k,
                                                      const void *v, const flexdiag_attn_args *a,
                                                      flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cuda_attn_check("attn_decode", a, s, 1, out, qkv, k, v));
    if (a->n_seq == 0) return FLEXDIAG_OK;
    if (!out || !qkv || !k || !v)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "attn_decode: NULL out, qkv, k or v");
    if (a->max_slots < 0 || (a->max_slots > 0 && (!a->slots || !a->n_slots)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: max_slots = %d needs >= 0 and, when > 0, the slots "
                             "and n_slots arrays", (int)a->max_slots);
    if ((int64_t)a->n_seq * a->h_kv > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: n_seq·h_kv = %lld exceeds the grid (2^31 - 1)",
                             (long long)a->n_seq * a->h_kv);
    const int g = a->h_q / a->h_kv;
    if (g > 65535 * DEC_MAX_G)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "attn_decode: group size h_q / h_kv = %d exceeds %d", g,
                             65535 * DEC_MAX_G);
    const int G = g > 4 ? DEC_MAX_G : g > 2 ? 4 : g; /* 1, 2, 4 or 8: the smallest >= g */
    decode_params p = {a->h_q, a->h_kv, g, a->p_cap, a->ring, a->max_slots, a->scale,
                       a->lp, a->slots, a->n_slots, a->logits_out, a->lse_out};
    const dim3 grid((unsigned)(a->n_seq * a->h_kv), (unsigned)((g + G - 1) / G));
    switch (a->d_h) {
    case 16: decode_launch_g<16>(G, grid, s->stream, out, qkv, k, v, p); break;
    case 32: decode_launch_g<32>(G, grid, s->stream, out, qkv, k, v, p); break;
    case 64: decode_launch_g<64>(G, grid, s->stream, out, qkv, k, v, p); break;
    default: decode_launch_g<128>(G, grid, s->stream, out, qkv, k, v, p); break;
    }
    FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
    return FLEXDIAG_OK;
}
