/*
 * sample.cu - token sampling on the GPU, the same definition as kernels/cpu/ref_sample.c, each
 * row with its own key and settings (kernels.h flexdiag_sample_row, device memory):
 *   0. req < 0: the row is skipped (its id untouched, its logits not read); settings out of
 *      range (T not > 0 or not finite, top_k < 0, top_p not > 0) make the id -1 (see below);
 *   1. l = logit / T (fp32); a non-finite l makes the row's id -1 (see below);
 *   2. top_k in (0, V): keep the top_k largest l, equal l keep the lower id;
 *   3. p = (float)(expf(l − max) / Σ e) over the kept ids, Σ in double;
 *   4. top_p < 1: keep the shortest prefix, by p descending (equal p: lower id first), whose
 *      cumulative p (double) reaches top_p; at least one id, all if rounding stays below;
 *   5. u = flexdiag__rng_uniform(seed, req, step); walk the kept ids in ascending id order and
 *      return the first whose cumulative p (double) exceeds u · Σ p(kept); else the largest
 *      kept id; the row's id is that plus id0.
 *
 * No sorting: one CTA per row (grid-stride over rows) reads the row's settings, then turns each
 * "keep" into a threshold plus a tie cut-off. Top-k is a 4-pass radix select (8-bit digits,
 * shared-memory histogram) over an order-preserving integer key of l (−0 folded into +0, since
 * −0 == +0 ties on the CPU); then the needed number of equal keys is taken in ascending id
 * order. Top-p binary-searches the fp32 bit pattern π of the boundary probability: the smallest
 * v whose mass above v, G(v), is < top_p (30 passes over the row, each a deterministic
 * reduction); then ties at π are added one by one as the CPU's sequential sum would until top_p
 * is reached. The walk scans the row in chunks of the CTA size with a block-wide prefix sum.
 * Every reduction runs in a fixed order, so a row's id depends only on its logits and its
 * settings (seed, request, step, T, top_k, top_p, id0). Double sums are associated differently
 * from the CPU's sequential ones; that moves a result only when u·Σ falls within ~1e-15 of a
 * CDF boundary. The logits row (≤ 400 KiB) stays in L2 across the passes; nothing is stored.
 *
 * Non-finite logits and bad settings: the op cannot report FLEXDIAG_ERR_NUMERIC or
 * FLEXDIAG_ERR_INVALID_ARG without a host sync (the settings are device data), so it writes
 * id -1 for that row; the runtime copies the ids to the host every step and must treat -1 as
 * an error of that row.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#include <limits.h>

/* Threads per row: 16 warps give enough loads in flight for one row per SM, and keep the
 * chunked scans (V / 512 chunks) short. */
#define SAMPLE_THREADS 512

/* Bit pattern of 1.0f: no probability exceeds it (each e is one of the summands of Σ e). */
#define P_ONE_BITS 0x3F800000u

/* ---- block-wide reductions and scans (fixed association order: deterministic) ---- */

struct op_sum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};
struct op_min {
    __device__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};

/* op over the CTA; every thread gets the result. red: 32 slots of shared scratch. */
template <typename T, typename Op>
static __device__ T block_reduce(T v, Op op, T *red) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by the previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T r = red[0];
    for (int i = 1; i < nw; i++) r = op(r, red[i]);
    return r;
}

/* Inclusive prefix sum over the CTA in thread order; *total = sum over all threads. */
template <typename T>
static __device__ T block_scan(T v, T *red, T *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    __syncthreads();
    if (lane == 31) red[warp] = v;
    __syncthreads();
    T pre = 0, tot = 0;
    for (int i = 0; i < nw; i++) {
        if (i < warp) pre += red[i];
        tot += red[i];
    }
    *total = tot;
    return pre + v;
}

/* ---- the row being sampled ---- */

typedef struct row_ctx {
    const float *lg;  /* logits row (V) */
    int64_t V;        /* vocabulary */
    float T;          /* temperature */
    float mx;         /* max of l over the row (always kept) */
    double z;         /* Σ expf(l − mx) over the top-k set */
    uint32_t tk_key;  /* top-k: keep key > tk_key, and key == tk_key with id <= tk_cut */
    int64_t tk_cut;
    uint32_t tp_bits; /* top-p: keep bits(p) > tp_bits, and == tp_bits with id <= tp_cut */
    int64_t tp_cut;
} row_ctx;

static __device__ __forceinline__ float scaled(const row_ctx &c, int64_t j) {
    return c.lg[j] / c.T;
}

/* Order-preserving key of l: larger l, larger key; −0 and +0 share one key. */
static __device__ __forceinline__ uint32_t order_key(float l) {
    const uint32_t u = __float_as_uint(l == 0.0f ? 0.0f : l);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ bool kept_k(const row_ctx &c, int64_t j, float l) {
    const uint32_t key = order_key(l);
    return key > c.tk_key || (key == c.tk_key && j <= c.tk_cut);
}

static __device__ __forceinline__ float prob(const row_ctx &c, float l) {
    return (float)((double)expf(l - c.mx) / c.z);
}

static __device__ __forceinline__ bool kept_p(const row_ctx &c, int64_t j, float p) {
    const uint32_t b = __float_as_uint(p);
    return b > c.tp_bits || (b == c.tp_bits && j <= c.tp_cut);
}

/* Shared scratch of one CTA. */
typedef struct sample_smem {
    double red[32];     /* reductions and scans (any type up to 8 bytes) */
    unsigned hist[256]; /* radix histogram */
    int64_t bcast[2];   /* values thread 0 hands to the CTA */
} sample_smem;

/* Id of the r-th (1-based, ascending id) element j with pred(j), or -1 when there are fewer. */
template <typename Pred>
static __device__ int64_t find_nth(Pred pred, int64_t V, int64_t r, sample_smem *sm) {
    if (r <= 0) return -1;
    int64_t *red = (int64_t *)sm->red, base = 0;
    for (int64_t c0 = 0; c0 < V; c0 += blockDim.x) {
        const int64_t j = c0 + threadIdx.x;
        const int64_t f = (j < V && pred(j)) ? 1 : 0;
        int64_t tot;
        const int64_t incl = block_scan<int64_t>(f, red, &tot);
        if (base + tot >= r) { /* uniform: every thread sees the same tot */
            const int64_t hit = (f && base + incl == r) ? j : INT64_MAX;
            return block_reduce<int64_t>(hit, op_min(), red);
        }
        base += tot;
    }
    return -1;
}

/* ---- steps ---- */

/* Step 1: c->mx, and whether any l is not finite (returned, CTA-uniform). */
static __device__ bool row_max(row_ctx *c, sample_smem *sm) {
    float mx = -INFINITY;
    int64_t bad = 0;
    for (int64_t j = threadIdx.x; j < c->V; j += blockDim.x) {
        const float l = scaled(*c, j);
        if (!isfinite(l)) bad = 1;
        else mx = fmaxf(mx, l);
    }
    bad = block_reduce<int64_t>(bad, op_max(), (int64_t *)sm->red);
    c->mx = block_reduce<float>(mx, op_max(), (float *)sm->red);
    return bad != 0;
}

/* Step 2: radix-select the top_k-th largest key, then the cut among equal keys. */
static __device__ void select_top_k(row_ctx *c, int64_t top_k, sample_smem *sm) {
    uint32_t prefix = 0, mask = 0;
    int64_t rem = top_k; /* elements still to take at or below the current prefix */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) sm->hist[b] = 0;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < c->V; j += blockDim.x) {
            const uint32_t key = order_key(scaled(*c, j));
            if ((key & mask) == prefix) atomicAdd(&sm->hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int b = 255;
            for (; b > 0 && (int64_t)sm->hist[b] < rem; b--) rem -= sm->hist[b];
            sm->bcast[0] = b;
            sm->bcast[1] = rem;
        }
        __syncthreads();
        prefix |= (uint32_t)sm->bcast[0] << shift;
        mask |= 255u << shift;
        rem = sm->bcast[1];
    }
    c->tk_key = prefix;
    const row_ctx cc = *c;
    c->tk_cut = find_nth([&](int64_t j) { return order_key(scaled(cc, j)) == cc.tk_key; }, c->V,
                         rem, sm);
}

/* Σ over the top-k set of f(j, l), in double. */
template <typename F>
static __device__ double sum_kept_k(const row_ctx &c, F f, sample_smem *sm) {
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < c.V; j += blockDim.x) {
        const float l = scaled(c, j);
        if (kept_k(c, j, l)) acc += f(j, l);
    }
    return block_reduce<double>(acc, op_sum(), sm->red);
}

/* Step 4: the top-p boundary value and its tie cut. */
static __device__ void select_top_p(row_ctx *c, float top_p, sample_smem *sm) {
    uint32_t lo = 0, hi = P_ONE_BITS;
    double g_hi = 0.0; /* G(hi): mass of kept p with bits > hi */
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        const row_ctx cc = *c;
        const double g = sum_kept_k(
            cc,
            [&](int64_t, float l) {
                const float p = prob(cc, l);
                return __float_as_uint(p) > mid ? (double)p : 0.0;
            },
            sm);
        if (g < (double)top_p) {
            hi = mid;
            g_hi = g;
        } else {
            lo = mid + 1;
        }
    }
    c->tp_bits = hi;
    const row_ctx cc = *c;
    const float pi = __uint_as_float(hi);
    const double n_eq = sum_kept_k(
        cc, [&](int64_t, float l) { return __float_as_uint(prob(cc, l)) == hi ? 1.0 : 0.0; }, sm);
    if (threadIdx.x == 0) { /* ties at π one at a time, as the CPU's running sum adds them */
        int64_t r = (int64_t)n_eq;
        double cum = g_hi;
        for (int64_t t = 1; t <= (int64_t)n_eq; t++) {
            cum += pi;
            if (cum >= (double)top_p) {
                r = t;
                break;
            }
        }
        sm->bcast[0] = r;
    }
    __syncthreads();
    const int64_t r = sm->bcast[0];
    c->tp_cut = find_nth(
        [&](int64_t j) {
            const float l = scaled(cc, j);
            return kept_k(cc, j, l) && __float_as_uint(prob(cc, l)) == hi;
        },
        c->V, r, sm);
}

/* Whether id j survives both filters; *p gets its probability. */
static __device__ __forceinline__ bool kept(const row_ctx &c, int64_t j, float *p) {
    const float l = scaled(c, j);
    if (!kept_k(c, j, l)) return false;
    *p = prob(c, l);
    return kept_p(c, j, *p);
}

/* Step 5: the first id whose cumulative kept p exceeds target; -1 if none. Only ids with
 * p > 0 can be hits (as on the CPU, where a zero p never moves the sum past target); the hit
 * test and the running sum use the same scanned values, so a hit is always a kept id even where
 * the scan's association rounds differently from a sequential sum. */
static __device__ int64_t walk(const row_ctx &c, double target, sample_smem *sm) {
    double run = 0.0;
    for (int64_t c0 = 0; c0 < c.V; c0 += blockDim.x) {
        const int64_t j = c0 + threadIdx.x;
        float p = 0.0f;
        const double v = (j < c.V && kept(c, j, &p)) ? (double)p : 0.0;
        double tot;
        const double incl = block_scan<double>(v, sm->red, &tot);
        const int64_t hit = (v > 0.0 && run + incl > target) ? j : INT64_MAX;
        const int64_t first = block_reduce<int64_t>(hit, op_min(), (int64_t *)sm->red);
        if (first != INT64_MAX) return first; /* uniform */
        run += tot;
    }
    return -1;
}

/* Largest kept id (the walk's fallback when rounding leaves none). */
static __device__ int64_t last_kept(const row_ctx &c, sample_smem *sm) {
    int64_t best = -1;
    float p;
    for (int64_t j = threadIdx.x; j < c.V; j += blockDim.x)
        if (kept(c, j, &p)) best = j;
    return block_reduce<int64_t>(best, op_max(), (int64_t *)sm->red);
}

/* Settings a row can be drawn with (kernels.h flexdiag_sample_row). */
static __device__ __forceinline__ bool row_settings_ok(const flexdiag_sample_row &r) {
    return r.temperature > 0.0f && isfinite(r.temperature) && r.top_k >= 0 && r.top_p > 0.0f;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(int32_t *__restrict__ ids, const float *__restrict__ logits, int64_t n,
                  int64_t V, const flexdiag_sample_row *__restrict__ rows) {
    __shared__ sample_smem sm;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const flexdiag_sample_row rs = rows[row]; /* the same for the whole CTA */
        if (rs.req < 0) continue;                 /* skipped: id untouched, logits not read */
        if (!row_settings_ok(rs)) {
            if (threadIdx.x == 0) ids[row] = -1;
            continue;
        }
        row_ctx c;
        c.lg = logits + row * V;
        c.V = V;
        c.T = rs.temperature;
        c.tk_key = 0; /* every finite l has a key > 0: all kept */
        c.tk_cut = V;
        c.tp_bits = 0; /* p > 0, or p == 0 with any id: all kept */
        c.tp_cut = V;
        if (row_max(&c, &sm)) {
            if (threadIdx.x == 0) ids[row] = -1;
            continue;
        }
        if (rs.top_k > 0 && rs.top_k < V) select_top_k(&c, rs.top_k, &sm);
        c.z = sum_kept_k(c, [&](int64_t, float l) { return (double)expf(l - c.mx); }, &sm);
        if (rs.top_p < 1.0f) select_top_p(&c, rs.top_p, &sm);
        const row_ctx cc = c;
        const double total = sum_kept_k(
            cc,
            [&](int64_t j, float l) {
                const float p = prob(cc, l);
                return kept_p(cc, j, p) ? (double)p : 0.0;
            },
            &sm);
        const double u = flexdiag__rng_uniform(rs.seed, (uint64_t)rs.req, (uint64_t)rs.step);
        int64_t id = walk(c, u * total, &sm);
        if (id < 0) id = last_kept(c, &sm);
        if (threadIdx.x == 0) ids[row] = rs.id0 + (int32_t)id;
    }
}

/* ids (n) int32, logits (n, V) f32, rows (n) device settings (the kernel checks them) */
extern "C" flexdiag_status flexdiag__cuda_sample(int32_t *ids, const float *logits, int64_t n,
                                                 int64_t V, const flexdiag_sample_row *rows,
                                                 flexdiag_stream *s) {
    if (n < 0 || V < 1 || V > INT32_MAX || (n > 0 && (!ids || !logits || !rows)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda sample: n = %lld, V = %lld: need n >= 0, 1 <= V <= 2^31-1 and "
                             "device buffers (ids, logits, rows)",
                             (long long)n, (long long)V);
    if (n == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    sample_kernel<<<flexdiag__cuda_blocks(n, 1), SAMPLE_THREADS, 0, st>>>(ids, logits, n, V,
                                                                         rows);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
