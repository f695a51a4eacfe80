/*
 * naive_vq.h - independent double-precision implementations of the image-decoder ops, written
 * in the most literal way (bounds checks inside the innermost loops, no shared code with
 * kernels/cpu/ref_vq.c). test_vq_ops compares each CPU op with them; test_vq_load builds a
 * whole naive VQ decoder from them.
 */
#ifndef FLEXDIAG_TEST_NAIVE_VQ_H
#define FLEXDIAG_TEST_NAIVE_VQ_H

#include <stdint.h>

/* out (n, cout, h, w) = conv(x (n, cin, h, w), w (cout, cin, k, k) bf16, zero padding) + b. */
void naive_conv2d(double *out, const double *x, const uint16_t *w, const uint16_t *b, int64_t n,
                  int cin, int cout, int h, int wd, int k);
/* out (n, c, hw) = GroupNorm(groups, eps)(x) · gamma + beta, then x·sigmoid(x) if swish. */
void naive_groupnorm(double *out, const double *x, const uint16_t *gamma, const uint16_t *beta,
                     int64_t n, int c, int hw, int groups, double eps, int swish);
/* out (n, c, 2h, 2w) = nearest ×2 of x (n, c, h, w). */
void naive_upsample2x(double *out, const double *x, int64_t n, int c, int h, int wd);
/* out (n, c, hw)[ch][i] = Σ_j softmax_j(Σ_c q[c][i] k[c][j] / sqrt(c)) v[ch][j]. */
void naive_attn_spatial(double *out, const double *q, const double *k, const double *v,
                        int64_t n, int c, int hw);

/* float <-> double array copies. */
void naive_to_double(double *out, const float *in, int64_t n);
void naive_to_float(float *out, const double *in, int64_t n);

#endif /* FLEXDIAG_TEST_NAIVE_VQ_H */
