/*
 * run.c - the two passes of the engine over a context's slots, each sequence at its own step:
 *
 *   prefill: the prompt rows of the slots admitted at a boundary (runs of consecutive rows in
 *            chunks of at most PREFILL_TOKENS, context.c), layer-major; then their last rows'
 *            heads and first tokens;
 *   decode:  plan (policy driver, every list at its sequence's step) -> body: feedback
 *            embedding, for layer j: for micro-batch k: acquire (scheduler + policy driver) ->
 *            layer forward (layer.c) -> release; heads -> CFG, sample, ids to the host ->
 *            update (policy driver)
 *
 * Each pass runs its plan (pass_plan.c: the visits in order, which the scheduler has seen
 * first, offload/sched.h): a FORWARD visit is acquire -> layer forward -> release; with CPU
 * attention a host-attended micro-batch's layer is a SEND (acquire, first half) and a FINISH
 * (second half, release) around its host job.
 *
 * The decode body reads only device buffers whose contents change between passes (ids,
 * positions, slot lists, steps), so on backends with launch graphs it is recorded once per
 * sequence count and policy variant (with or without scores) and replayed every pass; the
 * resident scheduler's acquire/release are address arithmetic, safe inside the recording.
 * Admission, retirement and the slots' bookkeeping are serve.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/engine/cpu_attn.h"
#include "runtime/engine/run_state.h"

/* ---- cancellation and progress ---- */

static flexdiag_status cancelled(const run_state *r) {
    if (!r->abort || !atomic_load(r->abort)) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CANCELLED, "generation cancelled");
}

/* The progress callback (phase 0 prefill, 1 decode); false from it cancels. */
static flexdiag_status progress(const run_state *r, int phase, uint64_t done, uint64_t total) {
    if (!r->progress || r->progress(phase, done, total, r->progress_user)) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CANCELLED, "cancelled by the progress callback");
}

/* ---- layer I/O: acquire and release ---- */

/* A sparse policy's decode visit reads only the ring rows its slot lists name (at most
 * min(t + 1, max_slots) of its furthest sequence's resident prefix): where that is fewer than the
 * visit's resident rows (Diagonal, ALISA), the scheduler moves those rows only. */
static void slot_lists(const run_state *r, const flexdiag_visit *v, const flexdiag_attn_args *a,
                       flexdiag_sched_io *m) {
    int32_t t = 0;
    for (int32_t s = v->s0; s < v->s0 + v->n_seq; s++) t = r->t[s] > t ? r->t[s] : t;
    int32_t att = t + 1 < a->max_slots ? t + 1 : a->max_slots;
    if (att >= v->kv_ring || a->shared_slots) return;
    m->kv_slots = a->slots;
    m->kv_n_slots = a->n_slots;
    m->kv_max_slots = a->max_slots;
    m->kv_attend = att;
}

/* Layer j's K (kv 0) or V (kv 1) store of the shared prompt rows. */
static void *shared_rows(const flexdiag_context *c, int32_t j, int kv) {
    return (char *)c->b.kv_pre + ((size_t)j * 2 + (size_t)kv) * (size_t)c->geo.n_pre * c->geo.pre_bytes;
}

/* Decode attention of sequences s0.. of layer j over the shared prompt rows. */
static void shared_args(const flexdiag_context *c, int32_t j, int32_t s0, flexdiag_attn_args *a) {
    a->prefix = c->b.prefix + s0;
    a->k_pre = shared_rows(c, j, 0);
    a->v_pre = shared_rows(c, j, 1);
    a->n_pre = c->geo.n_pre;
    a->pre_cap = c->geo.p_cap;
    a->casc_seq = c->b.casc_seq + s0;
    a->casc_tile =
        c->b.casc_tile + (size_t)(s0 / c->geo.mb_seq) * 3 * flexdiag__casc_tiles(c, c->geo.mb_seq);
    a->n_casc_tiles = flexdiag__casc_tiles(c, a->n_seq);
}

/* The I/O object of visit v: the layer's attention arguments (decode passes add the policy
 * driver's rows and slot lists, prefill the prompt rows and positions), then the scheduler's
 * addresses for rows_per_seq activation rows per sequence and the layer's tensors. */
static flexdiag_status io_acquire(const run_state *r, const flexdiag_visit *v, int prefill,
                                  flexdiag_layer_io *io) {
    const flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    int32_t j = v->layer, s0 = v->s0, nb = v->n_seq;
    memset(io, 0, sizeof *io);
    io->t = prefill ? -1 : r->t[s0];
    io->a = (flexdiag_attn_args){.n_seq = nb, .h_q = l->heads, .h_kv = l->kv_heads,
                                 .d_h = l->head_dim, .p_cap = c->geo.p_cap, .ring = c->pd.ring,
                                 .scale = 1.0f / sqrtf((float)l->head_dim), .lp = c->b.lp + s0,
                                 .rope_theta = l->rope_theta};
    int rope = l->pos_rows == 0; /* learned positions were added at the embedding */
    if (prefill) { /* r->pf_q rows a sequence: its block seen as pf_q prompt rows + the rest */
        io->a.pos = rope ? c->b.pos_pf : NULL;
        io->rows = c->b.rows_pf;
        if (c->geo.n_pre) io->a.ring = 0, io->a.lp = c->b.lp_pre + s0; /* prompt-only blocks */
        io->a.ring += c->geo.p_cap - r->pf_q;
        io->a.p_cap = r->pf_q;
    } else if (r->win > 1) { /* a window pass: its own rows and lists (window.c) */
        size_t q0 = (size_t)s0 * (size_t)r->win;
        io->a.pos = rope ? c->b.pos + q0 : NULL;
        io->a.p_cap = c->geo.blk_p;
        io->a.win = r->win;
        size_t l0 = q0; /* list index of row q0 (one list a row, or h_kv a row a layer) */
        if (c->geo.win_lists > 1)
            l0 = ((size_t)j * (size_t)r->n_seq * (size_t)r->win + q0) * (size_t)l->kv_heads;
        io->a.shared_slots = c->geo.win_lists > 1 ? FLEXDIAG_SLOTS_PER_HEAD : FLEXDIAG_SLOTS_PER_SEQ;
        io->a.max_slots = c->pd.max_slots;
        io->a.slots = c->b.win_slots + l0 * (size_t)c->pd.max_slots;
        io->a.n_slots = c->b.win_nslots + l0;
        io->rows = c->b.win_rows + q0 * (size_t)l->kv_heads;
        if (c->geo.n_pre) shared_args(c, j, s0, &io->a);
        io->a.n_casc_tiles = 0; /* no cascade with several rows a sequence (kernels.h win) */
    } else {
        io->a.pos = rope ? c->b.pos + s0 : NULL;
        io->a.p_cap = c->geo.blk_p;
        io->rows = flexdiag__pd_attn(&c->pd, j, s0, flexdiag__pd_scores(&c->pd), &io->a);
        if (c->geo.n_pre) shared_args(c, j, s0, &io->a);
    }
    io->mem = (flexdiag_sched_io){.layer = j, .s0 = s0, .n_seq = nb,
                                  .rows_per_seq = prefill ? r->pf_q : r->win,
                                  .kv_prompt = v->kv_prompt, .kv_ring = v->kv_ring,
                                  .kv_w0 = v->kv_w0, .kv_wn = v->kv_wn,
                                  .host_attend = v->host_attend};
    if (!prefill) slot_lists(r, v, &io->a, &io->mem);
    FLEXDIAG_TRY(flexdiag__sched_acquire(c->sched, &io->mem));
    if (prefill && c->geo.n_pre) { /* the prefill of shared prompt rows s0.. writes their store */
        io->mem.k = (char *)shared_rows(c, j, 0) + (size_t)s0 * c->geo.pre_bytes;
        io->mem.v = (char *)shared_rows(c, j, 1) + (size_t)s0 * c->geo.pre_bytes;
    }
    io->w = flexdiag__layer_view(&c->m->w, io->mem.weights, io->mem.weights_res,
                                 io->mem.res_bytes);
    return FLEXDIAG_OK;
}

static flexdiag_status io_release(const run_state *r, const flexdiag_layer_io *io) {
    return flexdiag__sched_release(r->c->sched, &io->mem);
}

/* One visit of the pass's plan: a FORWARD acquires, runs the layer and releases; a SEND
 * acquires and queues the first half of a host-attended decode forward (its I/O held until the
 * FINISH), a FINISH the second half, then releases. */
static flexdiag_status run_visit(const run_state *r, const flexdiag_visit *v, int prefill) {
    flexdiag_layer_io io, *held = r->held ? &r->held[v->s0 / r->c->geo.mb_seq] : NULL;
    switch (v->op) {
    case FLEXDIAG_VISIT_SEND:
        FLEXDIAG_TRY(io_acquire(r, v, 0, held));
        return flexdiag__layer_decode_send(r, held);
    case FLEXDIAG_VISIT_FINISH:
        FLEXDIAG_TRY(flexdiag__layer_decode_finish(r, held));
        return io_release(r, held);
    default:
        FLEXDIAG_TRY(io_acquire(r, v, prefill, &io));
        FLEXDIAG_TRY(prefill ? flexdiag__layer_prefill(r, &io) : flexdiag__layer_decode(r, &io));
        return io_release(r, &io);
    }
}

/* ---- prefill ---- */

/* The input rows of prompt rows [s0, s0 + nb), pf_q each: embeddings (+ learned positions). */
static flexdiag_status embed_chunk(const run_state *r, int32_t s0, int32_t nb, void *arg) {
    const flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    size_t row = (size_t)s0 * (size_t)r->pf_q;
    void *x = (char *)c->b.x + row * (size_t)l->hidden * r->act;
    (void)arg;
    FLEXDIAG_TRY(r->k->embed(x, c->m->w.embed, c->b.ids_in + row, (int64_t)nb * r->pf_q,
                             l->hidden, 1, r->s));
    return flexdiag__add_positions(r, x, c->b.pos_pf, (int64_t)nb * r->pf_q);
}

/* Each fresh slot's sequences [s0, s0 + nb) in runs, fn(r, s0, nb) on each run. */
static flexdiag_status each_fresh_run(const run_state *r,
                                      flexdiag_status (*fn)(const run_state *, int32_t,
                                                            int32_t)) {
    int32_t rows = r->c->geo.rows_per_img;
    for (int32_t i = 0, e; i < r->n_img; i = e) {
        for (e = i + 1; e < r->n_img && r->slot[e].fresh == r->slot[i].fresh; e++) {}
        if (r->slot[i].fresh) FLEXDIAG_TRY(fn(r, i * rows, (e - i) * rows));
    }
    return FLEXDIAG_OK;
}

/* The last prompt row's hidden state of fresh sequences [s0, s0 + nb) into xl: from x, or from
 * their shared prompt rows' kept copies. */
static flexdiag_status gather_last(const run_state *r, int32_t s0, int32_t nb) {
    const flexdiag_context *c = r->c;
    size_t d = (size_t)c->m->cfg.lm.hidden;
    void *xl = (char *)c->b.xl + (size_t)s0 * d * r->act;
    if (c->geo.n_pre) return r->k->gather_rows(xl, c->b.xl_pre, c->b.prefix + s0, nb, (int64_t)d, r->s);
    return r->k->gather_rows(xl, c->b.x, c->b.last + s0, nb, (int64_t)d, r->s);
}

/* The heads of fresh sequences [s0, s0 + nb), a micro-batch of rows at a time. */
static flexdiag_status head_run(const run_state *r, int32_t s0, int32_t nb) {
    const flexdiag_context *c = r->c;
    size_t d = (size_t)c->m->cfg.lm.hidden;
    for (int32_t q = s0, n; q < s0 + nb; q += n) {
        n = s0 + nb - q < c->geo.mb_seq ? s0 + nb - q : c->geo.mb_seq;
        FLEXDIAG_TRY(flexdiag__head(r, (char *)c->b.xl + (size_t)q * d * r->act, q, n));
    }
    return FLEXDIAG_OK;
}

/* Shared prompt rows: the last row of each prompt row just prefilled into xl_pre. */
static flexdiag_status keep_pre_last(const run_state *r, int32_t s0, int32_t nb, void *arg) {
    const flexdiag_context *c = r->c;
    size_t d = (size_t)c->m->cfg.lm.hidden;
    (void)arg;
    return r->k->gather_rows((char *)c->b.xl_pre + (size_t)s0 * d * r->act, c->b.x,
                             c->b.last_pre + s0, nb, (int64_t)d, r->s);
}

flexdiag_status flexdiag__pass_prefill(run_state *r) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    FLEXDIAG_TRY(flexdiag__each_chunk(r, embed_chunk, NULL));
    flexdiag__plan_prefill(r);
    FLEXDIAG_TRY(flexdiag__sched_begin(r->c->sched, &r->plan));
    const flexdiag_visit *v = r->plan.v;
    for (int32_t i = 0, n = r->plan.n_visits; i < n; i++) { /* cancel and progress per layer */
        if (i == 0 || v[i].layer != v[i - 1].layer) FLEXDIAG_TRY(cancelled(r));
        FLEXDIAG_TRY(run_visit(r, &v[i], 1));
        if (i + 1 == n || v[i + 1].layer != v[i].layer)
            FLEXDIAG_TRY(progress(r, 0, (uint64_t)v[i].layer + 1, (uint64_t)l->layers));
    }
    if (r->c->geo.n_pre) FLEXDIAG_TRY(flexdiag__each_chunk(r, keep_pre_last, NULL));
    FLEXDIAG_TRY(each_fresh_run(r, gather_last));
    FLEXDIAG_TRY(each_fresh_run(r, head_run));
    return flexdiag__take_step_output(r, 1);
}

/* ---- decode steps ---- */

/* The device work of a decode pass that reads only device buffers (ids, positions, plans):
 * feedback embedding, every layer of every micro-batch, the heads (win rows a sequence).
 * Recordable as a graph. */
flexdiag_status flexdiag__step_body(const run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    FLEXDIAG_TRY(flexdiag__feedback(r));
    for (int32_t i = 0; i < r->plan.n_visits; i++) FLEXDIAG_TRY(run_visit(r, &r->plan.v[i], 0));
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
        size_t q0 = (size_t)s0 * (size_t)r->win;
        FLEXDIAG_TRY(flexdiag__head(r, (char *)c->b.x + q0 * (size_t)l->hidden * r->act,
                                    (int32_t)q0, nb * r->win));
    }
    return FLEXDIAG_OK;
}

/* Graphs need the backend's support, a step without host-side captures or profiling, and a
 * scheduler whose calls are address arithmetic (the tiered one queues copies and may wait). */
static int use_graph(const run_state *r) {
    return r->k->graph_begin && !r->c->graphs.off && !r->split && !r->b->hidden &&
           !r->b->attn_out && r->c->sched->ops->graph_safe;
}

/* Replay the recorded step body (recording it first, for this variant and sequence count);
 * a failed recording turns graphs off for the context and runs the step op by op. The first
 * step at a new sequence count runs op by op, outside capture, so the backend builds (and
 * autotunes) its GEMM plans there; nothing may synchronise the host while recording. */
static flexdiag_status step_body_graph(const run_state *r, int scores) {
    flexdiag_context *c = r->c;
    void **g = &c->graphs.step[scores];
    if (*g && c->graphs.seq[scores] != r->n_seq) {
        r->k->graph_destroy(*g);
        *g = NULL;
    }
    if (!*g && c->graphs.eager_seq != r->n_seq) {
        c->graphs.eager_seq = r->n_seq;
        return flexdiag__step_body(r);
    }
    if (!*g) {
        FLEXDIAG_TRY(r->k->graph_begin(r->s));
        flexdiag_status st = flexdiag__step_body(r);
        void *ng = NULL;
        flexdiag_status st2 = r->k->graph_end(r->s, &ng);
        if (st != FLEXDIAG_OK || st2 != FLEXDIAG_OK) {
            if (ng) r->k->graph_destroy(ng);
            FLEXDIAG_WARN("decode-step graph not recorded (%s): launching op by op",
                          flexdiag__err_msg());
            flexdiag__err_clear();
            c->graphs.off = 1;
            return flexdiag__step_body(r);
        }
        *g = ng;
        c->graphs.seq[scores] = r->n_seq;
    }
    return r->k->graph_launch(*g, r->s);
}

/* The positions of the pass's live sequences (prompt length + step) to the device. */
static flexdiag_status upload_positions(run_state *r) {
    flexdiag_context *c = r->c;
    for (int32_t s = 0; s < r->n_seq; s++)
        if (r->t[s] >= 0) c->up.pos[s] = r->lp[s] + r->t[s];
    return r->k->copy_h2d(c->b.pos, c->up.pos, (size_t)r->n_seq * 4, r->s);
}

static flexdiag_status decode_pass(run_state *r) {
    flexdiag_context *c = r->c;
    FLEXDIAG_TRY(cancelled(r));
    FLEXDIAG_TRY(upload_positions(r));
    r->pr = (flexdiag_pd_run){.n_seq = r->n_seq, .mb_seq = c->geo.mb_seq, .n_mb = r->n_mb,
                              .t = r->t, .plan_out = r->b->plan_out, .plan_t = r->t[0]};
    double t0 = flexdiag__prof_begin(r);
    FLEXDIAG_TRY(flexdiag__pd_plan(&c->pd, &r->pr, r->s));
    FLEXDIAG_TRY(flexdiag__prof_end(r, PROF_ATTN, t0));
    flexdiag__plan_decode(r);
    FLEXDIAG_TRY(flexdiag__sched_begin(c->sched, &r->plan));
    if (use_graph(r))
        FLEXDIAG_TRY(step_body_graph(r, flexdiag__pd_scores(&c->pd)));
    else
        FLEXDIAG_TRY(flexdiag__step_body(r));
    FLEXDIAG_TRY(flexdiag__take_step_output(r, 0));
    FLEXDIAG_TRY(flexdiag__cpu_attn_status(c));
    t0 = flexdiag__prof_begin(r);
    FLEXDIAG_TRY(flexdiag__pd_update(&c->pd, &r->pr, r->s));
    return flexdiag__prof_end(r, PROF_ATTN, t0);
}

flexdiag_status flexdiag__pass_decode(run_state *r) {
    if (!r->split) return decode_pass(r);
    FLEXDIAG_TRY(r->k->stream_sync(r->s)); /* profiled: its whole wall time to split[3] */
    double t0 = flexdiag__now();
    FLEXDIAG_TRY(decode_pass(r));
    FLEXDIAG_TRY(r->k->stream_sync(r->s));
    r->split[3] += flexdiag__now() - t0;
    return FLEXDIAG_OK;
}
