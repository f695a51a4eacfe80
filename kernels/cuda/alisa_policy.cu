/*
 * alisa_policy.cu - ALISA kept on the device (kernels.h alisa_plan / alisa_update): each
 * (layer, sequence) list's records of the last w steps live in device memory, so a decode step
 * needs no host round trip for the selection. Each list runs at its sequence's own step, read
 * from the device steps (kernels.h flexdiag_list_steps): a negative step leaves the list as it
 * is, and so does a plan step >= l_dec.
 *
 * The rules are policy/policy_alisa.c's exactly (the CPU backend runs that code itself).
 * Plan: one CTA per list. S_t is summed into the list's score scratch one record at a time in
 * ascending step order (a record's positions are distinct, so its adds never collide and every
 * S(p) gets the host's fp32 order), then keys (flexdiag__alisa_key(S) << 32 | p) go to the
 * keys scratch and a position is selected when fewer than k_g keys exceed its own (keys are
 * distinct: the same top k_g as the host's sort); the selected positions are compacted in
 * ascending order by warp ballots. The ranking reads the list's keys once per candidate (early
 * exit at k_g), from L1. Update: one thread per (list, entry) sums the h_q probabilities in
 * head order.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#define ALISA_THREADS 256

/* policy_alisa.c's flexdiag__alisa_key: unsigned order = float order (NaN by bits). */
static __device__ __forceinline__ uint32_t alisa_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* One list's outputs of step t: its slot list in each KV head's copy and record t mod w. */
struct alisa_out {
    int32_t *sl;     /* slot list of copy 0; copy h at + h·ms */
    int32_t copies, ms;
    int32_t *rp;     /* record t mod w: positions */
    float *rv;       /* ... and probabilities (zero until the update) */
};

static __device__ __forceinline__ void alisa_put(const alisa_out &o, int32_t idx, int32_t p) {
    for (int32_t h = 0; h < o.copies; h++) o.sl[(int64_t)h * o.ms + idx] = p;
    o.rp[idx] = p;
    o.rv[idx] = 0.0f;
}

/* Top k_g of candidates 0..ncand-1 into o at 0..k_g-1, ascending (ncand > k_g). */
static __device__ void alisa_select(const alisa_out &o, const int32_t *rp_all, const float *rv_all,
                                    const int32_t *rn, float *S, uint64_t *K, int32_t na,
                                    int32_t w, int32_t k_g, int32_t t, int32_t ncand) {
    __shared__ int32_t sm_warp[ALISA_THREADS / 32];
    __shared__ int32_t sm_base;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int32_t p = tid; p < ncand; p += ALISA_THREADS) S[p] = 0.0f;
    __syncthreads();
    for (int32_t tau = t - w < 0 ? 0 : t - w; tau < t; tau++) { /* ascending, as the host */
        const int32_t r = tau % w;
        for (int32_t j = tid; j < rn[r]; j += ALISA_THREADS) {
            const int32_t p = rp_all[(int64_t)r * na + j];
            if (p < ncand) S[p] += rv_all[(int64_t)r * na + j];
        }
        __syncthreads();
    }
    for (int32_t p = tid; p < ncand; p += ALISA_THREADS)
        K[p] = ((uint64_t)alisa_key(S[p]) << 32) | (uint32_t)p;
    if (tid == 0) sm_base = 0;
    __syncthreads();
    for (int32_t b = 0; b < ncand; b += ALISA_THREADS) {
        const int32_t p = b + tid;
        bool sel = false;
        if (p < ncand) {
            const uint64_t kp = K[p];
            int32_t above = 0;
            for (int32_t q = 0; q < ncand && above < k_g; q++) above += K[q] > kp;
            sel = above < k_g;
        }
        const unsigned m = __ballot_sync(0xffffffffu, sel);
        if (lane == 0) sm_warp[warp] = __popc(m);
        __syncthreads();
        int32_t off = sm_base + __popc(m & ((1u << lane) - 1u));
        for (int wi = 0; wi < warp; wi++) off += sm_warp[wi];
        if (sel) alisa_put(o, off, p);
        __syncthreads();
        if (tid == 0)
            for (int wi = 0; wi < ALISA_THREADS / 32; wi++) sm_base += sm_warp[wi];
        __syncthreads();
    }
}

static __global__ void __launch_bounds__(ALISA_THREADS)
alisa_plan_kernel(int32_t *__restrict__ slots, int32_t *__restrict__ n_slots,
                  int32_t *__restrict__ rec_pos, float *__restrict__ rec_p,
                  int32_t *__restrict__ rec_n, float *__restrict__ score,
                  uint64_t *__restrict__ keys, int32_t copies, int32_t ms, int32_t na,
                  int32_t l_dec, flexdiag_list_steps st) {
    const int64_t i = blockIdx.x;
    const int tid = (int)threadIdx.x;
    const int32_t t = flexdiag__cuda_list_step(st, i); /* the same for the whole CTA */
    if (t < 0 || t >= l_dec) return;                   /* a free slot or past the run */
    const int32_t w = na - na / 2, k_g = na - w, ncand = t - w + 1, rt = t % w;
    int32_t *rp_all = rec_pos + i * w * na, *rn = rec_n + i * w;
    float *rv_all = rec_p + i * w * na;
    const alisa_out o = {slots + i * copies * ms, copies, ms, rp_all + (int64_t)rt * na,
                         rv_all + (int64_t)rt * na};
    int32_t ng = 0; /* global tokens */
    if (ncand > 0 && k_g > 0) {
        ng = ncand <= k_g ? ncand : k_g;
        if (ncand <= k_g) /* fewer candidates than the budget: take all */
            for (int32_t p = tid; p < ncand; p += ALISA_THREADS) alisa_put(o, p, p);
        else
            alisa_select(o, rp_all, rv_all, rn, score + i * l_dec, keys + i * l_dec, na, w, k_g, t,
                         ncand);
    }
    const int32_t r0 = ncand > 0 ? ncand : 0, n = ng + t + 1 - r0; /* then the recent lags */
    for (int32_t j = tid; j < t + 1 - r0; j += ALISA_THREADS) alisa_put(o, ng + j, r0 + j);
    for (int32_t h = tid; h < copies; h += ALISA_THREADS) n_slots[i * copies + h] = n;
    if (tid == 0) rn[rt] = n;
}

static __global__ void alisa_update_kernel(float *__restrict__ rec_p,
                                           const int32_t *__restrict__ rec_n,
                                           const float *__restrict__ probs, int64_t n_lists,
                                           int32_t heads, int32_t ms, int32_t na,
                                           flexdiag_list_steps st) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t i = e / na;
    if (i >= n_lists) return;
    const int32_t t = flexdiag__cuda_list_step(st, i);
    if (t < 0) return; /* a free slot: nothing to update */
    const int32_t w = na - na / 2, r = t % w, j = (int32_t)(e - i * na);
    if (j >= rec_n[i * w + r]) return;
    const float *p = probs + i * heads * (int64_t)ms + j;
    float sc = 0.0f;
    for (int32_t q = 0; q < heads; q++) sc += p[(int64_t)q * ms];
    rec_p[(i * w + r) * na + j] = sc;
}

extern "C" flexdiag_status flexdiag__cuda_alisa_plan(int32_t *slots, int32_t *n_slots,
                                                     int32_t *rec_pos, float *rec_p,
                                                     int32_t *rec_n, float *score, uint64_t *keys,
                                                     int64_t n_lists, int32_t copies,
                                                     int32_t max_slots, int32_t n_att,
                                                     int32_t l_dec, flexdiag_list_steps t,
                                                     flexdiag_stream *s) {
    if (n_lists < 0 || n_lists > INT32_MAX || copies < 1 || n_att < 1 || max_slots < n_att ||
        l_dec < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda alisa_plan: n_lists %lld, copies %d, max_slots %d, n_att %d, "
                             "l_dec %d out of range (max_slots >= n_att >= 1, l_dec >= 1)",
                             (long long)n_lists, copies, max_slots, n_att, l_dec);
    FLEXDIAG_TRY(flexdiag__cuda_steps_check("alisa_plan", t, n_lists));
    if (n_lists == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    alisa_plan_kernel<<<(unsigned)n_lists, ALISA_THREADS, 0, st>>>(
        slots, n_slots, rec_pos, rec_p, rec_n, score, keys, copies, max_slots, n_att, l_dec, t);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_alisa_update(float *rec_p, const int32_t *rec_n,
                                                       const float *probs, int64_t n_lists,
                                                       int32_t heads, int32_t max_slots,
                                                       int32_t n_att, flexdiag_list_steps t,
                                                       flexdiag_stream *s) {
    if (n_lists < 0 || heads < 1 || n_att < 1 || max_slots < n_att)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda alisa_update: n_lists %lld, heads %d, max_slots %d, n_att %d "
                             "out of range (max_slots >= n_att >= 1)", (long long)n_lists, heads,
                             max_slots, n_att);
    FLEXDIAG_TRY(flexdiag__cuda_steps_check("alisa_update", t, n_lists));
    if (n_lists == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    const int64_t work = n_lists * n_att;
    alisa_update_kernel<<<flexdiag__cuda_blocks(work, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK, 0,
                          st>>>(rec_p, rec_n, probs, n_lists, heads, max_slots, n_att, t);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
