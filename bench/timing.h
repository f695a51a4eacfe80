/*
 * timing.h - timed repeats of an operation on a stream, for the ceilings and rates that
 * `flexdiag-bench profile` and `bench` measure: a warm-up call, then a few timed calls, fewer
 * where one call is slow (a CPU build, a sanitizer build) so that a sample stays within
 * BENCH_SAMPLE_BUDGET_S.
 */
#ifndef FLEXDIAG_BENCH_TIMING_H
#define FLEXDIAG_BENCH_TIMING_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_BENCH)
#error "bench/timing.h is private to bench/ (docs/architecture.md)"
#endif

#include <stddef.h>

#include "kernels/kernels.h"

#define BENCH_SAMPLE_BUDGET_S 2.0 /* timed seconds per sample beyond which repeats are cut */

/* One call of the timed operation (queued on the stream the caller times); FLEXDIAG_OK or the
 * op's status. */
typedef flexdiag_status bench_call_fn(void *ctx);

/* Seconds per call of fn(ctx) on stream s of backend k, -1 on failure: one warm-up call timed
 * to the stream's end, then `reps` calls timed together, or as many (at least one) as fit
 * BENCH_SAMPLE_BUDGET_S at the warm-up's pace. */
double bench_time_calls(const flexdiag_kernels *k, flexdiag_stream *s, int reps, bench_call_fn *fn,
                        void *ctx);

/* Seconds per copy of n bytes on s (dir 0: host to device, 1: device to host, 2: device dev to
 * device dev2) through bench_time_calls, -1 on failure. */
double bench_time_copy(const flexdiag_kernels *k, flexdiag_stream *s, void *dev, void *dev2,
                       void *host, size_t n, int dir, int reps);

#endif /* FLEXDIAG_BENCH_TIMING_H */
