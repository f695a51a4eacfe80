/*
 * ref_policy.c - the device-resident Diagonal policy ops (kernels.h diag_slots / diag_update) on
 * the CPU: plain loops over lag lists. They restate policy/policy_diagonal.c in the op-table
 * form the CUDA backend implements, so the engine's device-policy path runs (and is tested) on
 * the CPU too; the host state machine stays the reference both are checked against.
 */
#include "cpu_ops.h"

flexdiag_status flexdiag__cpu_diag_slots(int32_t *slots, int32_t *n_slots, int16_t *lag,
                                         int16_t *cnt, int64_t n_lists, int32_t max_slots,
                                         int32_t a, int32_t t, int32_t n_r, int32_t base,
                                         flexdiag_stream *s) {
    (void)s;
    int32_t ti = t - base;
    for (int64_t i = 0; i < n_lists; i++) {
        int32_t *sl = slots + i * max_slots;
        int16_t *lg = lag + i * a;
        if (ti < 0) { /* sink4, t <= 3: decode tokens 0..t are the sinks written so far */
            for (int32_t j = 0; j <= t; j++) sl[j] = j;
            n_slots[i] = t + 1;
            continue;
        }
        if (ti == 0) {
            lg[0] = 0;
            cnt[i] = 1;
        } else if (ti <= a - 1) {
            lg[cnt[i]++] = (int16_t)ti;
        }
        for (int32_t j = 0; j < base; j++) sl[j] = j;
        for (int32_t j = 0; j < cnt[i]; j++) /* entry j at column base + cnt-1-j */
            sl[base + cnt[i] - 1 - j] = base + (ti - lg[j]) % n_r;
        n_slots[i] = base + cnt[i];
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_diag_update(int16_t *lag, const float *logits, int64_t n_lists,
                                          int32_t h_kv, int32_t g, int32_t max_slots, int32_t a,
                                          int32_t t, int32_t base, flexdiag_stream *s) {
    (void)s;
    int32_t h_q = g * h_kv;
    for (int64_t i = 0; i < n_lists; i++) {
        int64_t row = i / h_kv;
        int32_t h = (int32_t)(i % h_kv), best = 0;
        const float *lg = logits + (row * h_q + (int64_t)h * g) * max_slots + base;
        int16_t *l = lag + i * a;
        float best_s = 0;
        for (int32_t j = 0; j < a; j++) {
            int32_t col = a - 1 - j; /* entry j's column (list is full in build-up) */
            float sc = lg[col];
            for (int32_t q = 1; q < g; q++)
                if (lg[(int64_t)q * max_slots + col] > sc) sc = lg[(int64_t)q * max_slots + col];
            if (j == 0 || sc < best_s || (sc == best_s && l[j] > l[best])) {
                best = j;
                best_s = sc;
            }
        }
        l[best] = (int16_t)(t - base + 1);
    }
    return FLEXDIAG_OK;
}
