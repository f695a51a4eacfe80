/*
 * eta.h - what is left of a long bench run, from its progress samples. A dense step reads the
 * whole history, so it grows with the step number: an estimate from the run's mean pace (which
 * also holds the prefill) is several times short early on. bench_eta keeps the last two
 * intervals between samples and projects the per-step time of the latest one forward, growing
 * by the change between the two (never shrinking: a sparse step stops growing once its window
 * is full, and a falling rate is the prefill leaving the first interval).
 */
#ifndef FLEXDIAG_BENCH_ETA_H
#define FLEXDIAG_BENCH_ETA_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_BENCH)
#error "bench/eta.h is private to bench/ (docs/architecture.md)"
#endif

#include <stdint.h>

typedef struct bench_eta {
    double t;         /* seconds since the start at the last sample */
    uint64_t done;    /* steps done at the last sample */
    double rate, mid; /* seconds per step over the last interval, its mean step; rate 0: none */
} bench_eta;

/* A sample: `done` of `total` steps after `t` seconds since the start (the start is a sample of
 * 0 steps at 0 s in a zeroed bench_eta). Returns the projected seconds left, -1 when `done` or
 * `t` has not moved past the last sample (which is then kept). */
double bench_eta_sample(bench_eta *e, double t, uint64_t done, uint64_t total);

#endif
