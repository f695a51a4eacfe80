/*
 * offload_report.h - what `flexdiag bench` adds to a row whose weights are split over device,
 * pinned host and disk (docs/offloading.md §5): the transfer ceilings measured in the same
 * process (pinned H2D and D2H copies on a copy stream, O_DIRECT reads of the store at the
 * scheduler's request size and queue depth), the placement requested and realised, bytes per
 * tier, transfer bytes per decode step, achieved rates, and the overlap efficiency
 * step time / max(compute, H2D bytes / H2D ceiling, disk bytes / disk ceiling); KV homes add
 * their bytes per tier and per step (pinned and disk homes, CPU attention).
 */
#ifndef FLEXDIAG_BENCH_OFFLOAD_REPORT_H
#define FLEXDIAG_BENCH_OFFLOAD_REPORT_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_BENCH)
#error "bench/offload_report.h is private to bench/ (docs/architecture.md)"
#endif

#include <stddef.h>

#include "flexdiag.h"

typedef struct bench_ceilings {
    double h2d, d2h; /* bytes/s, pinned host <-> device on a copy stream, 0: not measured */
    double disk;     /* bytes/s, O_DIRECT reads of the store, 0: no store */
    size_t copy_bytes, disk_req; /* sizes they were measured at */
    int disk_qd;     /* requests in flight */
    double host_read; /* bytes/s, host memory read by all the runtime's threads (a bound of
                         the CPU attention), 0: not measured */
    double home_read; /* bytes/s, the same threads reading the context's pinned KV home itself
                         (tens of GB: its page walks included), 0: not measured */
    double host_read_after; /* bytes/s, host_read measured again right after a row's timed run
                               (a shared host's memory rate moves between runs; the row's bound
                               takes the higher of the two), 0: not measured */
} bench_ceilings;

typedef struct bench_offload_row {
    flexdiag_offload_info oi;          /* after the timed run */
    double h2d_step, disk_step;        /* bytes per decode step */
    double h2d_rate, disk_rate;        /* achieved bytes/s over the decode steps */
    double kv_h2d_step, kv_d2h_step;   /* KV bytes per decode step to and from the host home
                                          or the disk home's staging */
    double kv_disk_step;               /* disk KV home bytes read + written per decode step */
    double compute_ms;                 /* a profiled step's op time (GEMM + attention + rest) */
    double overlap;                    /* step / max(compute, transfers at the ceilings) */
    double ca_kv_step, ca_s_step;      /* CPU attention: host KV bytes read and host seconds
                                          per decode step */
    double ca_rows_step;               /* its q/k/v rows down and outputs up per decode step */
} bench_offload_row;

/* Measure the ceilings for rt's model m (nothing when its weights are all on the device and
 * kv_homes is 0; the host read rate with cpu_attention); buffers go through the runtime's
 * device budget. 0, or 1 after a message. */
int bench_offload_ceilings(flexdiag_runtime *rt, const flexdiag_model *m, int kv_homes,
                           int cpu_attention, bench_ceilings *out);
/* The disk ceiling on context c's disk KV home when none was measured yet (a store made for
 * the KV alone exists only once the context does). 0, or 1 after a message. */
struct flexdiag_context;
int bench_offload_kv_disk_ceiling(const struct flexdiag_context *c, bench_ceilings *out);
/* The rate at which the runtime's threads read context c's pinned KV home (the K and V spans
 * of its host-homed micro-batches) with CPU attention on: the best of two passes. 0, or 1
 * after a message. */
int bench_offload_kv_home_read(const struct flexdiag_context *c, bench_ceilings *out);
/* Bytes/s of KV the CPU attention kernel (kernels.h flexdiag__host_attn_decode, in the
 * runtime's activation type, its --threads) reads at Janus-Pro-7B shapes: 16 sequences x 32
 * heads x 338 rows, micro-batch homes in turn (512 MiB of KV: 12 of bf16, 6 of fp32), the
 * second pass timed. 0, or 1 after a message (*out 0). */
int bench_host_attn_rate(const flexdiag_runtime *rt, double *out);
/* Bytes/s the runtime's --threads read from host memory together: the best of three passes
 * summing 2 GiB (the CPU attention's bound; fewer passes where they are slow, timing.h). 0, or 1 after a message (*out 0). */
int bench_host_read_rate(const flexdiag_runtime *rt, double *out);
/* Bytes/s the same threads read a buffer of `bytes` (rounded up to whole tasks) at: the best of
 * 20 passes, so a buffer that fits a cache is read from it (the CPU roofline's memory ceiling at
 * a decode step's own bytes). 0, or 1 after a message (*out 0). */
int bench_read_rate_at(const flexdiag_runtime *rt, size_t bytes, double *out);
/* The row of context c from its offload counters once the timed run's prefill is queued and
 * after its n_steps decode steps (decode_s seconds) and the profiled compute time per step. */
void bench_offload_row_make(const flexdiag_context *c, const flexdiag_offload_info *before,
                            const flexdiag_offload_info *after, int32_t n_steps, double decode_s,
                            double compute_ms, const bench_ceilings *ce, bench_offload_row *out);
/* The markdown lines of an offloaded row (nothing for a resident one). */
void bench_offload_print(const bench_offload_row *r, const bench_ceilings *ce);
/* JSON fields (",\"sched\":...") for the row into buf (n bytes), "" for a resident row. */
void bench_offload_json(const bench_offload_row *r, const bench_ceilings *ce, char *buf, size_t n);

#endif /* FLEXDIAG_BENCH_OFFLOAD_REPORT_H */
