/*
 * run_state.h - what the files of one run share (private to runtime/engine): the run's state, the
 * profiling brackets, and the layer I/O object the step hands each (layer, micro-batch).
 *
 * A layer I/O object is everything one layer forward touches, resolved before it runs: the
 * scheduler's addresses (weights, KV, activations: offload/sched.h), the named tensors of the
 * weight block, the attention arguments (shapes from the model, slot lists and score outputs
 * from the policy driver) and the cache rows the new K/V go to. layer.c computes from it and
 * nothing else, so where the memory lives is the scheduler's decision alone.
 */
#ifndef FLEXDIAG_RUN_STATE_H
#define FLEXDIAG_RUN_STATE_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_RUNTIME_ENGINE)
#error "runtime/engine/run_state.h is private to runtime/engine/ (docs/architecture.md)"
#endif

#include "base/core.h"
#include "runtime/engine/engine.h"

typedef struct run_state {
    flexdiag_context *c;
    const flexdiag_block *b;
    const flexdiag_kernels *k;
    flexdiag_stream *s;     /* the context's stream */
    flexdiag_pd_run pr;     /* the run as the policy driver sees it */
    int32_t n_seq;          /* sequences in this run */
    int32_t n_mb;           /* micro-batches in this run */
    int32_t *lp;            /* host copy of prompt lengths (n_seq) */
    int32_t n_pf;           /* sequences the prefill runs: n_seq, or the distinct prompt rows
                               when the context shares them (c->n_pre > 0) */
    size_t act;             /* act_bytes */
    double *split;          /* profiling accumulators (block's split) or NULL */
    struct flexdiag_layer_io *held; /* (n_mb) I/O of the host-attended micro-batches between
                                       their two halves (CPU attention), else NULL */
} run_state;

/* One (layer, micro-batch) of a prefill chunk or decode step. */
typedef struct flexdiag_layer_io {
    flexdiag_sched_io mem;   /* weights, KV, activations (the scheduler's addresses) */
    flexdiag_layer_w w;      /* named tensors of mem.weights */
    flexdiag_attn_args a;    /* attention: shapes, policy slot lists and score outputs */
    const int32_t *rows;     /* cache rows kv_append writes (n_tok, h_kv) */
    int32_t t;               /* decode step, -1 in prefill */
} flexdiag_layer_io;

enum { PROF_GEMM, PROF_ATTN, PROF_REST };

/* Profiling brackets: with a split requested, sync before and after an op group. */
static inline double flexdiag__prof_begin(const run_state *r) {
    if (!r->split || r->k->stream_sync(r->s) != FLEXDIAG_OK) return 0.0;
    return flexdiag__now();
}

static inline flexdiag_status flexdiag__prof_end(const run_state *r, int cat, double t0) {
    if (!r->split) return FLEXDIAG_OK;
    FLEXDIAG_TRY(r->k->stream_sync(r->s));
    r->split[cat] += flexdiag__now() - t0;
    return FLEXDIAG_OK;
}

#define TIMED(r, cat, expr)                                                                        \
    do {                                                                                           \
        double t0_ = flexdiag__prof_begin(r);                                                      \
        FLEXDIAG_TRY(expr);                                                                        \
        FLEXDIAG_TRY(flexdiag__prof_end(r, cat, t0_));                                             \
    } while (0)

/* Sequences of micro-batch mb in this run: first *s0, count returned. */
static inline int32_t flexdiag__mb_range(const run_state *r, int32_t mb, int32_t *s0) {
    int32_t per = r->c->mb_seq, left = r->n_seq - mb * per;
    *s0 = mb * per;
    return left < per ? left : per;
}

/* ---- layer.c ---- */

/* Prompt chunk forward of io (io->mem.n_seq sequences of p_cap rows). */
flexdiag_status flexdiag__layer_prefill(const run_state *r, const flexdiag_layer_io *io);
/* Decode-step forward of io (one row per sequence). */
flexdiag_status flexdiag__layer_decode(const run_state *r, const flexdiag_layer_io *io);
/* The two halves of a decode step whose attention the host computes (io->mem.kv_host): the
 * q/k/v projection and the rows' trip to the host job; then, once the job is done, its output,
 * o_proj and the MLP. */
flexdiag_status flexdiag__layer_decode_send(const run_state *r, const flexdiag_layer_io *io);
flexdiag_status flexdiag__layer_decode_finish(const run_state *r, const flexdiag_layer_io *io);

/* ---- heads.c ---- */

/* Final norm + output head for the rows xin (nb of them) into logits rows s0.. */
flexdiag_status flexdiag__head(const run_state *r, const void *xin, int32_t s0, int32_t nb);
/* CFG, sampling (or the forced id) and outputs for token `step` of every image. */
flexdiag_status flexdiag__take_step_output(run_state *r, int32_t step);
/* Next input embedding: the step's token of every image, fed to all its rows. */
flexdiag_status flexdiag__feedback(const run_state *r);
/* x (n, d) act += the learned position rows of pos (n) (OPT); nothing for RoPE models. */
flexdiag_status flexdiag__add_positions(const run_state *r, void *x, const int32_t *pos,
                                        int64_t n);

#endif /* FLEXDIAG_RUN_STATE_H */
