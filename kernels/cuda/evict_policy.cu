/*
 * evict_policy.cu - H2O and TOVA kept on the device (kernels.h evict_plan / evict_update), so
 * a decode step needs no host round trip for them: slot positions, H2O's accumulated scores
 * and the victims live in device memory, and the update reads attn_decode's probabilities
 * where they were written. Each list runs at its sequence's own step, read from the device
 * steps (kernels.h flexdiag_list_steps); a negative step leaves the list, its rows and its
 * victim as they are.
 *
 * The rules are policy/policy_score.c's exactly (kernels/cpu/ref_policy.c restates them for
 * the CPU backend). Plan: one thread per list. Update: one warp per list; lane l owns slots
 * l, l + 32, ..., sums each slot's query-head probabilities serially in head order (the
 * reference's fp32 order, so the same sums) and keeps its best (score, pos); the warp then
 * reduces by shuffles. Slots hold distinct positions, so (score, pos) is a total order for
 * NaN-free scores and the tree finds the reference's sequential minimum.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#define EVICT_WARPS 4 /* lists per 128-thread CTA of the update */

static __global__ void evict_plan_kernel(int32_t *__restrict__ rows, int32_t *__restrict__ pos,
                                         float *__restrict__ acc,
                                         const int32_t *__restrict__ free_slot, int64_t n_lists,
                                         int32_t rpl, int32_t n_att, flexdiag_list_steps st,
                                         int32_t p_cap) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_lists) return;
    const int32_t t = flexdiag__cuda_list_step(st, i);
    if (t < 0) return; /* a free slot: the list stays as it is */
    int32_t *ps = pos + i * n_att;
    float *ac = acc ? acc + i * n_att : nullptr;
    for (int32_t j = 0; t == 0 && j < n_att; j++) { /* a new run: empty slots */
        ps[j] = -1;
        if (ac) ac[j] = 0.0f;
    }
    const int32_t f = t < n_att ? t : free_slot[i];
    ps[f] = t;
    if (ac) ac[f] = 0.0f;
    for (int32_t r = 0; r < rpl; r++) rows[i * rpl + r] = p_cap + f;
}

/* Whether candidate (s, j) beats the best (bs, bj) so far: lower score, then older token. */
static __device__ __forceinline__ bool evict_beats(float s, int32_t j, float bs, int32_t bj,
                                                   const int32_t *pos) {
    if (j < 0) return false;
    if (bj < 0 || s < bs) return true;
    return s == bs && pos[j] < pos[bj];
}

static __global__ void __launch_bounds__(EVICT_WARPS * 32)
evict_update_kernel(int32_t *__restrict__ free_slot, float *__restrict__ acc,
                    const int32_t *__restrict__ pos, const float *__restrict__ probs,
                    int64_t n_lists, int32_t heads, int32_t ms, int32_t n_att,
                    flexdiag_list_steps st) {
    const int64_t i = (int64_t)blockIdx.x * EVICT_WARPS + (threadIdx.x >> 5);
    const int lane = (int)threadIdx.x & 31;
    if (i >= n_lists) return; /* whole warps leave together */
    const int32_t t = flexdiag__cuda_list_step(st, i); /* the same for the whole warp */
    if (t < 0) return;                                 /* a free slot: nothing to update */
    const int32_t n = t + 1 < n_att ? t + 1 : n_att;
    if (!acc && n < n_att) return; /* TOVA: a free slot remains */
    const float *p = probs + i * heads * (int64_t)ms;
    const int32_t *ps = pos + i * n_att;
    float *ac = acc ? acc + i * n_att : nullptr;
    const int32_t limit = t - (n_att - n_att / 2) + 1; /* H2O: candidates have pos <= limit */
    float bs = 0.0f;
    int32_t bj = -1;
    for (int32_t j = lane; j < n; j += 32) {
        float sc = 0.0f;
        for (int32_t q = 0; q < heads; q++) sc += p[(int64_t)q * ms + j];
        if (ac) {
            sc = ac[j] += sc;
            if (ps[j] > limit) continue; /* protected recent lags */
        } else {
            sc /= (float)heads;
        }
        if (evict_beats(sc, j, bs, bj, ps)) {
            bs = sc;
            bj = j;
        }
    }
    if (n < n_att) return; /* H2O still filling: scores accumulated, nothing to evict */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float os = __shfl_xor_sync(0xffffffffu, bs, o);
        const int32_t oj = __shfl_xor_sync(0xffffffffu, bj, o);
        if (evict_beats(os, oj, bs, bj, ps)) {
            bs = os;
            bj = oj;
        }
    }
    if (lane == 0) free_slot[i] = bj;
}

extern "C" flexdiag_status flexdiag__cuda_evict_plan(int32_t *rows, int32_t *pos, float *acc,
                                                     const int32_t *free_slot, int64_t n_lists,
                                                     int32_t rows_per_list, int32_t n_att,
                                                     flexdiag_list_steps t, int32_t p_cap,
                                                     flexdiag_stream *s) {
    if (n_lists < 0 || rows_per_list < 1 || n_att < 1 || p_cap < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda evict_plan: n_lists %lld, rows_per_list %d, n_att %d, p_cap %d "
                             "out of range", (long long)n_lists, rows_per_list, n_att, p_cap);
    FLEXDIAG_TRY(flexdiag__cuda_steps_check("evict_plan", t, n_lists));
    if (n_lists == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    evict_plan_kernel<<<flexdiag__cuda_blocks(n_lists, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK,
                        0, st>>>(rows, pos, acc, free_slot, n_lists, rows_per_list, n_att, t,
                                 p_cap);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_evict_update(int32_t *free_slot, float *acc,
                                                       const int32_t *pos, const float *probs,
                                                       int64_t n_lists, int32_t heads,
                                                       int32_t max_slots, int32_t n_att,
                                                       flexdiag_list_steps t, flexdiag_stream *s) {
    if (n_lists < 0 || heads < 1 || n_att < 1 || max_slots < n_att)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda evict_update: n_lists %lld, heads %d, max_slots %d, n_att %d "
                             "out of range (max_slots >= n_att >= 1)", (long long)n_lists, heads,
                             max_slots, n_att);
    FLEXDIAG_TRY(flexdiag__cuda_steps_check("evict_update", t, n_lists));
    if (n_lists == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    evict_update_kernel<<<flexdiag__cuda_blocks(n_lists, EVICT_WARPS), EVICT_WARPS * 32, 0, st>>>(
        free_slot, acc, pos, probs, n_lists, heads, max_slots, n_att, t);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
