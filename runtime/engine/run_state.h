/*
 * run_state.h - what the files of one run share (private to runtime/engine): the run's state (its
 * slots, each sequence's prompt length and step), the profiling brackets, and the layer I/O
 * object a pass hands each (layer, micro-batch).
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

/* One image slot of the context (rows_per_img sequences): the job it runs. */
typedef struct run_slot {
    flexdiag_job job; /* copy of the feed's job */
    int live;         /* holds a job */
    int fresh;        /* admitted at this boundary: its prefill is pending */
    int32_t made;     /* tokens made so far; -1: its logits failed (NUMERIC) */
    int32_t forced;   /* the id its next token is forced to, -1: drawn (heads.c) */
    int32_t told;     /* tokens handed to the feed's token callback */
    char msg[160];    /* why it failed (made -1) */
} run_slot;

typedef struct run_state {
    flexdiag_context *c;
    const flexdiag_block *b; /* captures, progress and profiling of a lock-step run
                                (flexdiag__engine_run); an empty block otherwise */
    const flexdiag_feed *f;  /* where the jobs come from */
    const atomic_int *abort; /* a lock-step run's cancel flag (the context's), or NULL: jobs
                                are cancelled one by one at step boundaries */
    flexdiag_progress_fn progress; /* after each prefill layer (phase 0) and decode pass
                                      (phase 1); false cancels the run (the block's, or the
                                      context's params') */
    void *progress_user;
    const flexdiag_kernels *k;
    flexdiag_stream *s;      /* the context's stream */
    flexdiag_pd_run pr;      /* the pass as the policy driver sees it */
    int32_t n_img;           /* images the current pass runs: slots [0, n_img) */
    int32_t n_seq;           /* their sequences */
    int32_t n_mb;            /* their micro-batches */
    int32_t *lp;             /* (S) prompt length of each sequence */
    int32_t *t;              /* (S) decode step of each sequence at the next pass: tokens
                                made - 1; -1 for a free slot */
    run_slot *slot;          /* (n_img capacity) */
    int32_t live;            /* slots holding a job */
    int32_t *ids_h;          /* (S, p_cap) host prompt table, by sequence or shared row */
    int32_t *last;           /* (S) gather index of each sequence's last prompt row in x */
    int32_t *prefix;         /* (S) shared prompt row of each sequence (c->geo.n_pre > 0) */
    int32_t *pre_lp;         /* (n_pre) length of each shared prompt row, 0: free */
    int32_t *pre_ref;        /* (n_pre) sequences reading it */
    int32_t *pre_last;       /* (n_pre) gather index of its last row in x */
    int32_t *pf;             /* rows the boundary's prefill runs: sequences, or shared prompt
                                rows (c->geo.n_pre > 0), ascending */
    int32_t n_pf;            /* how many */
    int32_t pf_q;            /* prompt rows each of them runs: their longest prompt rounded up
                                to PF_ROUND (<= p_cap), the stride of x and ids_in in the pass */
    int32_t *row_tmp;        /* (2, p_cap) host scratch of an admission's prompt rows */
    int32_t *ids_pack;       /* (S or n_pre, p_cap) ids_h packed pf_q ids a row (uploaded) */
    int32_t rounds;          /* admissions so far */
    int64_t idle;            /* slot-passes free slots stood idle with jobs waiting since the
                                last admission (serve.c admit_due) */
    int64_t admit_idle;      /* how many of them make an admission due */
    size_t act;              /* act_bytes */
    double *split;           /* profiling accumulators (block's split) or NULL */
    struct flexdiag_layer_io *held; /* (n_mb) I/O of the host-attended micro-batches between
                                       their two halves (CPU attention), else NULL */
    flexdiag_pass_plan plan; /* the pass being run (pass_plan.c), its visits in visits */
    flexdiag_visit *visits;  /* (layers × (max(S, n_pre) + 2 n_mb)) */
    flexdiag_visit *mbv;     /* (n_mb) a decode pass's rows of each micro-batch */
    int32_t win;             /* rows a sequence runs in the current decode pass: 1, or the
                                window of a window pass (window.c) */
    int after_window;        /* the last decode pass was a window pass (b.ids holds rows) */
    struct flexdiag_window *w; /* a window pass's host state (contexts with geo.win > 1) */
} run_state;

/* One (layer, micro-batch) of a prefill chunk or decode step. */
typedef struct flexdiag_layer_io {
    flexdiag_sched_io mem;   /* weights, KV, activations (the scheduler's addresses) */
    flexdiag_layer_w w;      /* named tensors of mem.weights */
    flexdiag_attn_args a;    /* attention: shapes, policy slot lists and score outputs */
    const int32_t *rows;     /* cache rows kv_append writes (n_tok, h_kv) */
    int32_t t;               /* decode step of its first sequence (captures of lock-step
                                runs), -1 in prefill */
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
    int32_t per = r->c->geo.mb_seq, left = r->n_seq - mb * per;
    *s0 = mb * per;
    return left < per ? left : per;
}

/* ---- pass_plan.c ---- */

/* Visits a run's plans may hold: a prefill chunk per admitted row and layer at most, a decode
 * pass two visits per micro-batch and layer. */
static inline size_t flexdiag__plan_cap(const flexdiag_context *c) {
    size_t rows = (size_t)(c->geo.n_seq > c->geo.n_pre ? c->geo.n_seq : c->geo.n_pre);
    return (size_t)c->m->cfg.lm.layers * (rows + 2 * (size_t)c->geo.n_mb);
}
/* Calls fn(r, s0, nb, arg) for every prefill chunk of the rows r->pf (runs of consecutive rows,
 * cut where a chunk would straddle pf_seq). */
flexdiag_status flexdiag__each_chunk(const run_state *r,
                                     flexdiag_status (*fn)(const run_state *, int32_t, int32_t,
                                                           void *),
                                     void *arg);
/* r->plan: the prefill pass of the rows r->pf. */
void flexdiag__plan_prefill(run_state *r);
/* r->plan: a decode pass over sequences [0, r->n_seq) at their steps r->t. */
void flexdiag__plan_decode(run_state *r);

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

/* ---- run.c ---- */

/* The prefill pass of the boundary: the prompt rows r->pf, then the first token of every fresh
 * slot (heads, CFG, sampling). */
flexdiag_status flexdiag__pass_prefill(run_state *r);
/* One decode pass over the sequences [0, r->n_seq), each at its own step r->t: one token more
 * for every live slot. */
flexdiag_status flexdiag__pass_decode(run_state *r);

/* ---- window.c ---- */

/* The window of the next decode pass: the longest SJD window of a live slot (1: a sequential
 * pass). */
int32_t flexdiag__window_rows(const run_state *r);
/* A decode pass of r->win rows a sequence (the live slots' last tokens and drafts): plan,
 * uploads, the step body, then verification: each live slot commits 1 .. win tokens. */
flexdiag_status flexdiag__pass_window(run_state *r);
/* The host state of window passes (r->w), for contexts with geo.win > 1; free with
 * flexdiag__window_free. */
flexdiag_status flexdiag__window_alloc(run_state *r);
void flexdiag__window_free(run_state *r);
/* Slot i took a new job: no drafts yet. */
void flexdiag__window_admit(run_state *r, int32_t i);
/* After a sequential pass of a window context (a Diagonal build-up falls in someone's window):
 * every live slot made one token, so its first draft is spent and the others move up, each
 * with the distribution it was drawn from (a draft stays at its token index). */
void flexdiag__window_sequential(run_state *r);

/* ---- heads.c ---- */

/* Final norm + output head for the rows xin (nb of them) into logits rows s0.. */
flexdiag_status flexdiag__head(const run_state *r, const void *xin, int32_t s0, int32_t nb);
/* CFG, sampling (or the forced id) and outputs of the next token of every live slot of the pass
 * (fresh: only the fresh ones, after their prefill): its made count goes up by one. A slot whose
 * logits are not finite gets made = -1 and its msg (its job fails with NUMERIC). */
flexdiag_status flexdiag__take_step_output(run_state *r, int fresh);
/* Next input embedding: the step's token of every image, fed to all its rows (a window pass:
 * the id of every row, b.ids (n_seq, win)). */
flexdiag_status flexdiag__feedback(const run_state *r);
/* Whether slot sl's token `step` is forced (teacher forcing, a Chameleon row end): its id. */
int flexdiag__forced_at(const run_state *r, const run_slot *sl, int32_t step, int32_t *id);
/* Step body of a decode pass (run.c): feedback, the plan's visits, the heads. */
flexdiag_status flexdiag__step_body(const run_state *r);
/* x (n, d) act += the learned position rows of pos (n) (OPT); nothing for RoPE models. */
flexdiag_status flexdiag__add_positions(const run_state *r, void *x, const int32_t *pos,
                                        int64_t n);

#endif /* FLEXDIAG_RUN_STATE_H */
