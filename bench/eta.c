/*
 * eta.c - what is left of a long bench run (eta.h).
 */
#include "bench/eta.h"

double bench_eta_sample(bench_eta *e, double t, uint64_t done, uint64_t total) {
    if (done <= e->done || t <= e->t) return -1;
    const double rate = (t - e->t) / (double)(done - e->done);
    const double mid = 0.5 * (double)(done + e->done - 1); /* the mean step of the interval */
    double grow = 0; /* seconds per step per step */
    if (e->rate > 0 && rate > e->rate) grow = (rate - e->rate) / (mid - e->mid);
    *e = (bench_eta){.t = t, .done = done, .rate = rate, .mid = mid};
    if (done >= total) return 0;
    /* sum over steps done .. total - 1 of rate + grow * (step - mid) */
    const double n = (double)(total - done);
    return n * rate + grow * n * (0.5 * (double)(done + total - 1) - mid);
}
