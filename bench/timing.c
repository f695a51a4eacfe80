/*
 * timing.c - timed repeats of an operation on a stream (timing.h).
 */
#include "bench/timing.h"

#include "base/core.h"

double bench_time_calls(const flexdiag_kernels *k, flexdiag_stream *s, int reps, bench_call_fn *fn,
                        void *ctx) {
    if (k->stream_sync(s) != FLEXDIAG_OK) return -1;
    double t0 = flexdiag__now();
    if (fn(ctx) != FLEXDIAG_OK || k->stream_sync(s) != FLEXDIAG_OK) return -1;
    double warm = flexdiag__now() - t0;
    if (warm * reps > BENCH_SAMPLE_BUDGET_S) {
        int fit = (int)(BENCH_SAMPLE_BUDGET_S / warm);
        reps = fit > 1 ? fit : 1;
    }
    t0 = flexdiag__now();
    for (int i = 0; i < reps; i++)
        if (fn(ctx) != FLEXDIAG_OK) return -1;
    if (k->stream_sync(s) != FLEXDIAG_OK) return -1;
    return (flexdiag__now() - t0) / reps;
}

typedef struct copy_call {
    const flexdiag_kernels *k;
    flexdiag_stream *s;
    void *dev, *dev2, *host;
    size_t n;
    int dir;
} copy_call;

static flexdiag_status copy_once(void *ctx) {
    const copy_call *c = ctx;
    return c->dir == 0   ? c->k->copy_h2d_async(c->dev, c->host, c->n, c->s)
           : c->dir == 1 ? c->k->copy_d2h_async(c->host, c->dev, c->n, c->s)
                         : c->k->copy_d2d(c->dev2, c->dev, c->n, c->s);
}

double bench_time_copy(const flexdiag_kernels *k, flexdiag_stream *s, void *dev, void *dev2,
                       void *host, size_t n, int dir, int reps) {
    copy_call c = {k, s, dev, dev2, host, n, dir};
    return bench_time_calls(k, s, reps, copy_once, &c);
}
