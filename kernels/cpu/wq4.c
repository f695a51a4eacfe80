/*
 * wq4.c - layer weights in 4-bit groups (kernels.h flexdiag_op_wq4_unpack): the host packer a
 * model load runs on the weights it homes below the device, and the CPU backend's unpack op,
 * which is also the plain C reference of the CUDA kernel (kernels/cuda/wq4.cu).
 *
 * A group of FLEXDIAG_WQ4_GROUP values keeps its min and its step (max - min) / 15 as IEEE
 * halves (FlexGen's 4-bit format, except that a constant group gets step 0 instead of a
 * division by zero); each value becomes the nearest code k in 0..15 of min + k·step, computed
 * with the rounded halves, so a value is off by at most half a step plus the rounding of min.
 */
#include <math.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"

#define HALF_MAX 65504.0f

/* One group of values x: codes (G/2 bytes) and the halves step, min at par. */
static flexdiag_status pack_group(const uint16_t *x, uint8_t *codes, uint8_t *par,
                                  const char *what) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < FLEXDIAG_WQ4_GROUP; i++) {
        float v = flexdiag__bf16_to_f32(x[i]);
        if (!isfinite(v))
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "4-bit weights (model_params.compress_weights): %s holds a "
                                 "NaN or an Inf", what);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (fabsf(lo) > HALF_MAX || (hi - lo) / 15.0f > HALF_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "4-bit weights (model_params.compress_weights): %s holds values "
                             "beyond the half range "
                             "(|x| up to %g): load it uncompressed",
                             what, (double)(fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi)));
    uint16_t step_h = flexdiag__f32_to_f16((hi - lo) / 15.0f), min_h = flexdiag__f32_to_f16(lo);
    float step = flexdiag__f16_to_f32(step_h), mn = flexdiag__f16_to_f32(min_h);
    memset(codes, 0, FLEXDIAG_WQ4_GROUP / 2);
    for (int i = 0; i < FLEXDIAG_WQ4_GROUP; i++) {
        float q = step > 0 ? floorf((flexdiag__bf16_to_f32(x[i]) - mn) / step + 0.5f) : 0.0f;
        int k = q < 0 ? 0 : q > 15 ? 15 : (int)q;
        codes[i / 2] |= (uint8_t)(k << (4 * (i & 1)));
    }
    memcpy(par, &step_h, 2);
    memcpy(par + 2, &min_h, 2);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__wq4_pack(uint8_t *out, const uint16_t *in, int64_t rows, int64_t cols,
                                   const char *what) {
    if (rows < 0 || cols <= 0 || cols % FLEXDIAG_WQ4_GROUP)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "4-bit weights (model_params.compress_weights): %s has rows of "
                             "%lld values: need a "
                             "multiple of %d",
                             what, (long long)cols, FLEXDIAG_WQ4_GROUP);
    size_t rb = flexdiag__wq4_row_bytes(cols);
    int64_t groups = cols / FLEXDIAG_WQ4_GROUP;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = out + (size_t)r * rb;
        for (int64_t g = 0; g < groups; g++)
            FLEXDIAG_TRY(pack_group(in + r * cols + g * FLEXDIAG_WQ4_GROUP,
                                    row + g * (FLEXDIAG_WQ4_GROUP / 2),
                                    row + cols / 2 + g * 4, what));
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_wq4_unpack(uint16_t *out, const uint8_t *in, int64_t rows,
                                         int64_t cols, flexdiag_stream *s) {
    (void)s;
    if (rows < 0 || cols <= 0 || cols % FLEXDIAG_WQ4_GROUP || (rows && (!out || !in)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "wq4_unpack: rows = %lld, cols = %lld: need rows >= 0, cols a "
                             "multiple of %d and buffers",
                             (long long)rows, (long long)cols, FLEXDIAG_WQ4_GROUP);
    size_t rb = flexdiag__wq4_row_bytes(cols);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = in + (size_t)r * rb;
        uint16_t *o = out + r * cols;
        for (int64_t g = 0; g < cols / FLEXDIAG_WQ4_GROUP; g++) {
            uint16_t step_h, min_h;
            memcpy(&step_h, row + cols / 2 + g * 4, 2);
            memcpy(&min_h, row + cols / 2 + g * 4 + 2, 2);
            float step = flexdiag__f16_to_f32(step_h), mn = flexdiag__f16_to_f32(min_h);
            const uint8_t *codes = row + g * (FLEXDIAG_WQ4_GROUP / 2);
            for (int i = 0; i < FLEXDIAG_WQ4_GROUP; i++) {
                int k = (codes[i / 2] >> (4 * (i & 1))) & 15;
                o[g * FLEXDIAG_WQ4_GROUP + i] = flexdiag__f32_to_bf16(mn + (float)k * step);
            }
        }
    }
    return FLEXDIAG_OK;
}
