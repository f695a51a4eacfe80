/*
 * ref_vq.h - the CPU ops of the image decoder (VQ-16), shared between ref_vq.c, which
 * implements them, and kernels_cpu.c, which puts them into the two CPU op tables: the scalar
 * reference ops for "cpu-ref", and for "cpu" the same with conv2d and attn_spatial spread over
 * the stream's thread pool (bit-identical results). Activations are fp32 (act_bytes 4), weights
 * bf16; each function has exactly the signature and contract of its slot in kernels.h.
 */
#ifndef FLEXDIAG_REF_VQ_H
#define FLEXDIAG_REF_VQ_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CPU)
#error "kernels/cpu/ref_vq.h is private to kernels/cpu/ (docs/architecture.md)"
#endif

#include <stdint.h>

#include "kernels/kernels.h"

/* ---- reference ops ---- */

/* out (n, c, hw) = codebook rows ids (n·hw), channel-major; ids validated by the caller. */
flexdiag_status flexdiag__cpu_ref_vq_lookup(void *out, const float *codebook, const int32_t *ids,
                                            int64_t n, int32_t c, int32_t hw, flexdiag_stream *s);
/* out (n, cout, h, wd) (+)= conv k×k (stride 1, zero padding (k-1)/2) of x + b. */
flexdiag_status flexdiag__cpu_ref_conv2d(void *out, const void *x, const uint16_t *w,
                                         const uint16_t *b, int64_t n, int32_t cin, int32_t cout,
                                         int32_t h, int32_t wd, int32_t k, unsigned flags,
                                         flexdiag_stream *s);
/* out (n, c, hw) = GroupNorm(x)·gamma + beta, optional swish; statistics in double. */
flexdiag_status flexdiag__cpu_ref_groupnorm(void *out, const void *x, const uint16_t *gamma,
                                            const uint16_t *beta, int64_t n, int32_t c, int32_t hw,
                                            int32_t groups, float eps, int32_t swish,
                                            flexdiag_stream *s);
/* out (n, c, 2h, 2wd) = nearest-neighbour ×2 of x (n, c, h, wd). */
flexdiag_status flexdiag__cpu_ref_upsample2x(void *out, const void *x, int64_t n, int32_t c,
                                             int32_t h, int32_t wd, flexdiag_stream *s);
/* out (n, c, hw) = v · softmax_keys(qᵀk · c^-0.5)ᵀ, one head over hw positions. */
flexdiag_status flexdiag__cpu_ref_attn_spatial(void *out, const void *q, const void *k,
                                               const void *v, int64_t n, int32_t c, int32_t hw,
                                               flexdiag_stream *s);
/* out (n, hw, c) f32 = x (n, c, hw): NCHW -> NHWC. */
flexdiag_status flexdiag__cpu_ref_to_nhwc(float *out, const void *x, int64_t n, int32_t c,
                                          int32_t hw, flexdiag_stream *s);

/* ---- parallel variants ("cpu" table) ---- */

/* flexdiag__cpu_ref_conv2d with one pool task per (image, output channel) plane. */
flexdiag_status flexdiag__cpu_fast_conv2d(void *out, const void *x, const uint16_t *w,
                                          const uint16_t *b, int64_t n, int32_t cin, int32_t cout,
                                          int32_t h, int32_t wd, int32_t k, unsigned flags,
                                          flexdiag_stream *s);
/* flexdiag__cpu_ref_attn_spatial with one pool task per (image, query position). */
flexdiag_status flexdiag__cpu_fast_attn_spatial(void *out, const void *q, const void *k,
                                                const void *v, int64_t n, int32_t c, int32_t hw,
                                                flexdiag_stream *s);

#endif /* FLEXDIAG_REF_VQ_H */
