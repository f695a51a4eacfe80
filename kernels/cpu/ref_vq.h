/*
 * ref_vq.h - the CPU ops of the image decoder (VQ-16), shared between ref_vq.c, which
 * implements them, and kernels_cpu.c, which puts them into the two CPU op tables: the scalar
 * reference ops for "cpu-ref", and for "cpu" the same with conv2d and attn_spatial spread over
 * the stream's thread pool (bit-identical results). Activations are fp32 (act_bytes 4), weights
 * bf16; each function is declared with the kernels.h op type of its slot (flexdiag_op_<op>), so
 * it has exactly that slot's signature and contract.
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
flexdiag_op_vq_lookup flexdiag__cpu_ref_vq_lookup;
/* out (n, cout, h, wd) (+)= conv k×k (stride 1, zero padding (k-1)/2) of x + b. */
flexdiag_op_conv2d flexdiag__cpu_ref_conv2d;
/* out (n, c, hw) = GroupNorm(x)·gamma + beta, optional swish; statistics in double. */
flexdiag_op_groupnorm flexdiag__cpu_ref_groupnorm;
/* out (n, c, 2h, 2wd) = nearest-neighbour ×2 of x (n, c, h, wd). */
flexdiag_op_upsample2x flexdiag__cpu_ref_upsample2x;
/* out (n, c, hw) = v · softmax_keys(qᵀk · c^-0.5)ᵀ, one head over hw positions. */
flexdiag_op_attn_spatial flexdiag__cpu_ref_attn_spatial;
/* out (n, hw, c) f32 = x (n, c, hw): NCHW -> NHWC. */
flexdiag_op_to_nhwc flexdiag__cpu_ref_to_nhwc;

/* ---- parallel variants ("cpu" table) ---- */

/* flexdiag__cpu_ref_conv2d with one pool task per (image, output channel) plane. */
flexdiag_op_conv2d flexdiag__cpu_fast_conv2d;
/* flexdiag__cpu_ref_attn_spatial with one pool task per (image, query position). */
flexdiag_op_attn_spatial flexdiag__cpu_fast_attn_spatial;

#endif /* FLEXDIAG_REF_VQ_H */
