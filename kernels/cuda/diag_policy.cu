/*
 * diag_policy.cu - the planning half of the Diagonal policy kept on the device (kernels.h
 * diag_slots), so a decode step needs no host round trip: the lag lists live in device memory
 * and one thread plans one (layer, sequence, KV head) list at that sequence's own step, read
 * from the device steps (kernels.h flexdiag_list_steps; a negative step leaves the list and its
 * slot list as they are).
 *
 * The rules are policy/policy_diagonal.c's exactly (kernels/cpu/ref_policy.c restates them for
 * the CPU backend): plan appends lag ti while ti <= a-1 and maps lag -> slot (ti - lag) mod n_r
 * behind the sink rows. A list has at most a <= 32767 entries, so a thread walks it serially;
 * the lists are independent and there are tens of thousands per step. The build-up update (the
 * argmin over the group-max logits) is fused into decode attention (attn_decode.cu).
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

static __global__ void diag_slots_kernel(int32_t *__restrict__ slots, int32_t *__restrict__ ns,
                                         int16_t *__restrict__ lag, int16_t *__restrict__ cnt,
                                         int64_t n_lists, int32_t ms, int32_t a,
                                         flexdiag_list_steps st, int32_t n_r, int32_t base) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_lists) return;
    const int32_t t = flexdiag__cuda_list_step(st, i);
    if (t < 0) return; /* a free slot: the list stays as it is */
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

extern "C" flexdiag_status flexdiag__cuda_diag_slots(int32_t *slots, int32_t *n_slots,
                                                     int16_t *lag, int16_t *cnt, int64_t n_lists,
                                                     int32_t max_slots, int32_t a,
                                                     flexdiag_list_steps t, int32_t n_r,
                                                     int32_t base, flexdiag_stream *s) {
    if (n_lists < 0 || a < 1 || n_r < 1 || base < 0 || max_slots < base + a)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda diag_slots: n_lists %lld, a %d, n_r %d, base %d, max_slots %d "
                             "out of range", (long long)n_lists, a, n_r, base, max_slots);
    FLEXDIAG_TRY(flexdiag__cuda_steps_check("diag_slots", t, n_lists));
    if (n_lists == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    diag_slots_kernel<<<flexdiag__cuda_blocks(n_lists, FLEXDIAG_CUDA_BLOCK), FLEXDIAG_CUDA_BLOCK,
                        0, st>>>(slots, n_slots, lag, cnt, n_lists, max_slots, a, t, n_r, base);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}
