/*
 * naive_vq.c - double-precision oracle ops for the image-decoder tests (see naive_vq.h).
 */
#include "naive_vq.h"

#include <math.h>
#include <stdlib.h>

#include "base/core.h"

void naive_conv2d(double *out, const double *x, const uint16_t *w, const uint16_t *b, int64_t n,
                  int cin, int cout, int h, int wd, int k) {
    int p = (k - 1) / 2;
    for (int64_t i = 0; i < n; i++)
        for (int co = 0; co < cout; co++)
            for (int y = 0; y < h; y++)
                for (int xx = 0; xx < wd; xx++) {
                    double acc = b ? flexdiag__bf16_to_f32(b[co]) : 0.0;
                    for (int ci = 0; ci < cin; ci++)
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                int sy = y + ky - p, sx = xx + kx - p;
                                if (sy < 0 || sy >= h || sx < 0 || sx >= wd) continue;
                                double wv = flexdiag__bf16_to_f32(
                                    w[(((int64_t)co * cin + ci) * k + ky) * k + kx]);
                                acc += wv * x[((i * cin + ci) * h + sy) * wd + sx];
                            }
                    out[((i * cout + co) * h + y) * wd + xx] = acc;
                }
}

void naive_groupnorm(double *out, const double *x, const uint16_t *gamma, const uint16_t *beta,
                     int64_t n, int c, int hw, int groups, double eps, int swish) {
    int cg = c / groups;
    for (int64_t i = 0; i < n; i++)
        for (int g = 0; g < groups; g++) {
            double sum = 0, sq = 0;
            int64_t len = (int64_t)cg * hw;
            const double *xg = x + (i * c + (int64_t)g * cg) * hw;
            for (int64_t j = 0; j < len; j++) sum += xg[j];
            double mean = sum / len;
            for (int64_t j = 0; j < len; j++) sq += (xg[j] - mean) * (xg[j] - mean);
            double inv = 1.0 / sqrt(sq / len + eps);
            for (int64_t j = 0; j < len; j++) {
                int ch = g * cg + (int)(j / hw);
                double y = (xg[j] - mean) * inv * flexdiag__bf16_to_f32(gamma[ch]) +
                           flexdiag__bf16_to_f32(beta[ch]);
                out[(i * c + (int64_t)g * cg) * hw + j] = swish ? y / (1.0 + exp(-y)) : y;
            }
        }
}

void naive_upsample2x(double *out, const double *x, int64_t n, int c, int h, int wd) {
    for (int64_t p = 0; p < n * c; p++)
        for (int y = 0; y < 2 * h; y++)
            for (int xx = 0; xx < 2 * wd; xx++)
                out[(p * 2 * h + y) * 2 * wd + xx] = x[(p * h + y / 2) * wd + xx / 2];
}

void naive_attn_spatial(double *out, const double *q, const double *k, const double *v, int64_t n,
                        int c, int hw) {
    double *p = malloc((size_t)hw * sizeof *p);
    for (int64_t b = 0; b < n; b++) {
        const double *qb = q + b * c * hw, *kb = k + b * c * hw, *vb = v + b * c * hw;
        for (int i = 0; i < hw; i++) {
            double m = -INFINITY, s = 0;
            for (int j = 0; j < hw; j++) {
                double d = 0;
                for (int ch = 0; ch < c; ch++) d += qb[ch * hw + i] * kb[ch * hw + j];
                p[j] = d / sqrt((double)c);
                if (p[j] > m) m = p[j];
            }
            for (int j = 0; j < hw; j++) s += (p[j] = exp(p[j] - m));
            for (int ch = 0; ch < c; ch++) {
                double acc = 0;
                for (int j = 0; j < hw; j++) acc += p[j] / s * vb[ch * hw + j];
                out[(b * c + ch) * hw + i] = acc;
            }
        }
    }
    free(p);
}

void naive_to_double(double *out, const float *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = in[i];
}

void naive_to_float(float *out, const double *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = (float)in[i];
}
