/*
 * diag_policy.cu - the Diagonal policy kept on the device (kernels.h diag_slots / diag_update),
 * so a decode step needs no host round trip: the lag lists live in device memory, one thread
 * plans one (layer, sequence, KV head) list and one thread runs its build-up argmin.
 *
 * The rules are policy/policy_diagonal.c's exactly (kernels/cpu/ref_policy.c restates them for
 * the CPU backend): plan appends lag ti while ti <= a-1 and maps lag -> slot (ti - lag) mod n_r
 * behind the sink rows; the update, only in build-up steps, replaces the lexicographic minimum
 * of (group-max fp32 logit, -lag) with lag ti + 1. A list has at most a <= 32767 entries, so a
 * thread walks it serially; the lists are independent and there are tens of thousands per step.
 * Rejected: fusing the argmin into the attention kernel's epilogue (policies.md §4.3) - a
 * separate launch per step costs a few microseconds and keeps the attention kernel generic.
 */
#include "cuda_common.cuh"
#include "cuda_ops.cuh"

static __global__ void diag_slots_kernel(int32_t *__restrict__ slots, int32_t *__restrict__ ns,
                                         int16_t *__restrict__ lag, int16_t *__restrict__ cnt,
                                         int64_t n_lists, int32_t ms, int32_t a, int32_t t,
                                         int32_t n_r, int32_t base) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_lists) return;
    int32_t *sl = slots + i * ms;
    int16_t *lg = lag + i * a;
    const int32_t ti = t - base;
    if (ti < 0) { /* sink4, t <= 3 */
        for (int32_t j = 0; j <= t; j++) sl[j] = j;
        ns[i] = t + 1;
        return;
    }
    int32_t c = cnt[i];
    if (ti == 0) {
        lg[0] = 0;
        c = 1;
    } else if (ti <= a - 1) {
        lg[c++] = (int16_t)ti;
    }
    cnt[i] = (int16_t)c;
    for (int32_t j = 0; j < base; j++) sl[j] = j;
    for (int32_t j = 0; j < c; j++) sl[base + c - 1 - j] = base + (ti - lg[j]) % n_r;
    ns[i] = base + c;
}

static __global__ void diag_update_kernel(int16_t *__restrict__ lag,
                                          const float *__restrict__ logits, int64_t n_lists,
                                          int32_t h_kv, int32_t g, int32_t ms, int32_t a,
                                          int32_t t, int32_t base) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_lists) return;
    const int64_t row = i / h_kv;
    const int32_t h = (int32_t)(i % h_kv);
    const float *lg = logits + (row * g * h_kv + (int64_t)h * g) * ms + base;
    int16_t *l = lag + i * a;
    int32_t best = 0;
    float best_s = 0.0f;
    for (int32_t j = 0; j < a; j++) {
        const int32_t col = a - 1 - j; /* entry j's column (the list is full in build-up) */
        float sc = lg[col];
        for (int32_t q = 1; q < g; q++) sc = fmaxf(sc, lg[(int64_t)q * ms + col]);
        if (j == 0 || sc < best_s || (sc == best_s && l[j] > l[best])) {
            best = j;
            best_s = sc;
        }
    }
    l[best] = (int16_t)(t - base + 1);
}

extern "C" flexdiag_status flexdiag__cuda_diag_slots(int32_t *slots, int32_t *n_slots,
                                                     int16_t *lag, int16_t *cnt, int64_t n_lists,
                                                     int32_t max_slots, int32_t a, int32_t t,
                                                     int32_t n_r, int32_t base,
                                                     flexdiag_stream *s) {
    if (n_lists < 0 || a < 1 || n_r < 1 || base < 0 || max_slots < base + a || t < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda diag_slots: n_lists %lld, a %d, n_r %d, base %d, max_slots %d, "
                             "t %d out of range", (long long)n_lists, a, n_r, base, max_slots, t);
    if (n_lists == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    diag_slots_kernel<<<flexdiag__cuda_blocks(n_lists, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK,
                        0, st>>>(slots, n_slots, lag, cnt, n_lists, max_slots, a, t, n_r, base);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_diag_update(int16_t *lag, const float *logits,
                                                      int64_t n_lists, int32_t h_kv, int32_t g,
                                                      int32_t max_slots, int32_t a, int32_t t,
                                                      int32_t base, flexdiag_stream *s) {
    if (n_lists < 0 || h_kv < 1 || g < 1 || a < 1 || max_slots < base + a || n_lists % h_kv)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda diag_update: n_lists %lld, h_kv %d, g %d, a %d, max_slots %d "
                             "out of range", (long long)n_lists, h_kv, g, a, max_slots);
    if (n_lists == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    diag_update_kernel<<<flexdiag__cuda_blocks(n_lists, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK,
                         0, st>>>(lag, logits, n_lists, h_kv, g, max_slots, a, t, base);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
