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
 * (with CPU attention the host-attended micro-batches of a layer run in two halves around
 * their host jobs, the next layer's first half queued after each second half where the
 * scheduler allows: decode_layer)
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

/* The KV rows the forward over sequences [s0, s0 + nb) touches (prefill: a prompt chunk), for
 * a scheduler that moves the KV (offload/sched.h): prefill writes the prompt rows; a decode
 * pass reads the prompt rows and the ring rows a's slot lists name (at most min(t + 1,
 * max_slots) of the resident prefix: fewer than resident for Diagonal and ALISA) and writes one
 * ring row (the policy's, or one per head within the prefix). Sequences at different steps
 * touch the union: the resident prefix of the furthest one, and its whole resident prefix
 * written back when their write rows differ. */
static void kv_rows(const run_state *r, int32_t s0, int32_t nb, int prefill,
                    const flexdiag_attn_args *a, flexdiag_sched_io *m) {
    const flexdiag_context *c = r->c;
    int32_t lp = 0, t = -1, w = -2; /* w: the common write slot, -1 when they differ */
    for (int32_t s = s0; s < s0 + nb; s++) lp = r->lp[s] > lp ? r->lp[s] : lp;
    if (prefill) {
        *m = (flexdiag_sched_io){.kv_prompt = 0, .kv_ring = 0, .kv_w0 = 0, .kv_wn = lp};
        return;
    }
    for (int32_t s = s0; s < s0 + nb; s++) {
        if (r->t[s] < 0) continue;
        int32_t ws = flexdiag__kvp_write_slot(&c->pd.kp, r->t[s]);
        t = r->t[s] > t ? r->t[s] : t;
        w = w == -2 || w == ws ? ws : -1;
    }
    if (t < 0) t = 0, w = -1; /* no live sequence: any consistent rows */
    int32_t res = (int32_t)flexdiag__kvp_resident_rows(&c->pd.kp, t);
    int32_t att = t + 1 < a->max_slots ? t + 1 : a->max_slots;
    *m = (flexdiag_sched_io){.kv_prompt = lp, .kv_ring = res, .kv_w0 = c->blk_p + w,
                             .kv_wn = w >= 0 ? 1 : -1};
    if (att >= res || a->shared_slots) return;
    m->kv_slots = a->slots;
    m->kv_n_slots = a->n_slots;
    m->kv_max_slots = a->max_slots;
    m->kv_attend = att;
}

/* Layer j's K (kv 0) or V (kv 1) store of the shared prompt rows. */
static void *shared_rows(const flexdiag_context *c, int32_t j, int kv) {
    return (char *)c->b.kv_pre + ((size_t)j * 2 + (size_t)kv) * (size_t)c->n_pre * c->pre_bytes;
}

/* Decode attention of sequences s0.. of layer j over the shared prompt rows. */
static void shared_args(const flexdiag_context *c, int32_t j, int32_t s0, flexdiag_attn_args *a) {
    a->prefix = c->b.prefix + s0;
    a->k_pre = shared_rows(c, j, 0);
    a->v_pre = shared_rows(c, j, 1);
    a->n_pre = c->n_pre;
    a->pre_cap = c->p_cap;
    a->casc_seq = c->b.casc_seq + s0;
    a->casc_tile =
        c->b.casc_tile + (size_t)(s0 / c->mb_seq) * 3 * flexdiag__casc_tiles(c, c->mb_seq);
    a->n_casc_tiles = flexdiag__casc_tiles(c, a->n_seq);
}

/* The I/O object of layer j for sequences [s0, s0 + nb): the layer's attention arguments
 * (decode passes add the policy driver's rows and slot lists, prefill the prompt rows and
 * positions), then the scheduler's addresses for rows_per_seq activation rows per sequence and
 * the layer's tensors. */
static flexdiag_status io_acquire(const run_state *r, int32_t j, int32_t s0, int32_t nb,
                                  int prefill, flexdiag_layer_io *io) {
    const flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    memset(io, 0, sizeof *io);
    io->t = prefill ? -1 : r->t[s0];
    io->a = (flexdiag_attn_args){.n_seq = nb, .h_q = l->heads, .h_kv = l->kv_heads,
                                 .d_h = l->head_dim, .p_cap = c->p_cap, .ring = c->pd.ring,
                                 .scale = 1.0f / sqrtf((float)l->head_dim), .lp = c->b.lp + s0,
                                 .rope_theta = l->rope_theta};
    int rope = l->pos_rows == 0; /* learned positions were added at the embedding */
    if (prefill) { /* r->pf_q rows a sequence: its block seen as pf_q prompt rows + the rest */
        io->a.pos = rope ? c->b.pos_pf : NULL;
        io->rows = c->b.rows_pf;
        if (c->n_pre) io->a.ring = 0, io->a.lp = c->b.lp_pre + s0; /* prompt-only blocks */
        io->a.ring += c->p_cap - r->pf_q;
        io->a.p_cap = r->pf_q;
    } else {
        io->a.pos = rope ? c->b.pos + s0 : NULL;
        io->a.p_cap = c->blk_p;
        io->rows = flexdiag__pd_attn(&c->pd, j, s0, flexdiag__pd_scores(&c->pd), &io->a);
        if (c->n_pre) shared_args(c, j, s0, &io->a);
    }
    kv_rows(r, s0, nb, prefill, &io->a, &io->mem);
    io->mem.layer = j;
    io->mem.s0 = s0;
    io->mem.n_seq = nb;
    io->mem.rows_per_seq = prefill ? r->pf_q : 1;
    io->mem.host_attend = !prefill && c->ca && s0 >= c->s_host && s0 < c->s_ca;
    FLEXDIAG_TRY(flexdiag__sched_acquire(c->sched, &io->mem));
    if (prefill && c->n_pre) { /* the prefill of shared prompt rows s0.. writes their store */
        io->mem.k = (char *)shared_rows(c, j, 0) + (size_t)s0 * c->pre_bytes;
        io->mem.v = (char *)shared_rows(c, j, 1) + (size_t)s0 * c->pre_bytes;
    }
    io->w = flexdiag__layer_view(&c->m->w, io->mem.weights, io->mem.weights_res,
                                 io->mem.res_bytes);
    return FLEXDIAG_OK;
}

static flexdiag_status io_release(const run_state *r, const flexdiag_layer_io *io) {
    return flexdiag__sched_release(r->c->sched, &io->mem);
}

/* ---- prefill ---- */

/* The chunk of prompt rows starting at s0 within the run [s0, end): up to the next multiple of
 * pf_seq (so a chunk never straddles a micro-batch where the KV homes need that, context.c). */
static int32_t chunk_len(const flexdiag_context *c, int32_t s0, int32_t end) {
    int32_t stop = (s0 / c->pf_seq + 1) * c->pf_seq;
    return (stop < end ? stop : end) - s0;
}

/* Calls fn(r, s0, nb, arg) for every chunk of the rows r->pf (runs of consecutive rows). */
static flexdiag_status each_chunk(const run_state *r,
                                  flexdiag_status (*fn)(const run_state *, int32_t, int32_t,
                                                        void *),
                                  void *arg) {
    for (int32_t i = 0, e; i < r->n_pf; i = e) {
        for (e = i + 1; e < r->n_pf && r->pf[e] == r->pf[e - 1] + 1; e++) {}
        int32_t end = r->pf[e - 1] + 1;
        for (int32_t s0 = r->pf[i], nb; s0 < end; s0 += nb) {
            nb = chunk_len(r->c, s0, end);
            FLEXDIAG_TRY(fn(r, s0, nb, arg));
        }
    }
    return FLEXDIAG_OK;
}

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

/* Layer *j of prompt rows [s0, s0 + nb). */
static flexdiag_status prefill_chunk(const run_state *r, int32_t s0, int32_t nb, void *arg) {
    flexdiag_layer_io io;
    FLEXDIAG_TRY(io_acquire(r, *(const int32_t *)arg, s0, nb, 1, &io));
    FLEXDIAG_TRY(flexdiag__layer_prefill(r, &io));
    return io_release(r, &io);
}

/* Each fresh slot's sequences [s0, s0 + nb) in runs, fn(r, s0, nb) on each run. */
static flexdiag_status each_fresh_run(const run_state *r,
                                      flexdiag_status (*fn)(const run_state *, int32_t,
                                                            int32_t)) {
    int32_t rows = r->c->rows_per_img;
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
    if (c->n_pre) return r->k->gather_rows(xl, c->b.xl_pre, c->b.prefix + s0, nb, (int64_t)d, r->s);
    return r->k->gather_rows(xl, c->b.x, c->b.last + s0, nb, (int64_t)d, r->s);
}

/* The heads of fresh sequences [s0, s0 + nb), a micro-batch of rows at a time. */
static flexdiag_status head_run(const run_state *r, int32_t s0, int32_t nb) {
    const flexdiag_context *c = r->c;
    size_t d = (size_t)c->m->cfg.lm.hidden;
    for (int32_t q = s0, n; q < s0 + nb; q += n) {
        n = s0 + nb - q < c->mb_seq ? s0 + nb - q : c->mb_seq;
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
    FLEXDIAG_TRY(each_chunk(r, embed_chunk, NULL));
    for (int32_t j = 0; r->n_pf > 0 && j < l->layers; j++) {
        FLEXDIAG_TRY(cancelled(r));
        FLEXDIAG_TRY(each_chunk(r, prefill_chunk, &j));
        FLEXDIAG_TRY(progress(r, 0, (uint64_t)j + 1, (uint64_t)l->layers));
    }
    if (r->c->n_pre) FLEXDIAG_TRY(each_chunk(r, keep_pre_last, NULL));
    FLEXDIAG_TRY(each_fresh_run(r, gather_last));
    FLEXDIAG_TRY(each_fresh_run(r, head_run));
    return flexdiag__take_step_output(r, 1);
}

/* ---- decode steps ---- */

/* Layer j of micro-batch mb in a decode pass. */
static flexdiag_status decode_mb(const run_state *r, int32_t j, int32_t mb) {
    int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
    flexdiag_layer_io io;
    FLEXDIAG_TRY(io_acquire(r, j, s0, nb, 0, &io));
    FLEXDIAG_TRY(flexdiag__layer_decode(r, &io));
    return io_release(r, &io);
}

/* The micro-batches [*lo, *hi) whose attention the host runs (CPU attention: the
 * pinned-homed ones of its share); empty without it. */
static void host_mbs(const run_state *r, int32_t *lo, int32_t *hi) {
    const flexdiag_context *c = r->c;
    *lo = *hi = r->n_mb;
    if (!c->ca) return;
    *lo = c->s_host / c->mb_seq;
    *hi = *lo + (c->s_ca - c->s_host + c->mb_seq - 1) / c->mb_seq;
    if (*hi > r->n_mb) *hi = r->n_mb;
}

/* Whether a host-attended micro-batch's layer j + 1 may be queued right after its layer j,
 * before the other micro-batches finish layer j: the host then goes from the layer's last job
 * to the next layer's first without waiting for the device to run that micro-batch's second
 * half and the next projection. Only where acquires are address arithmetic in any order: the
 * weights resident (the tiered scheduler's slot ring takes a layer's micro-batches together)
 * and no disk-homed KV (its staging buffers alternate in layer order). */
static int host_ahead(const run_state *r) {
    const flexdiag_context *c = r->c;
    return c->ca && !c->m->w.homes && c->s_disk >= r->n_seq;
}

/* First half of host-attended micro-batch mb's layer j: projection, rows down, host job. */
static flexdiag_status host_send(const run_state *r, int32_t j, int32_t mb) {
    int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
    FLEXDIAG_TRY(io_acquire(r, j, s0, nb, 0, &r->held[mb]));
    return flexdiag__layer_decode_send(r, &r->held[mb]);
}

/* Second half: wait for its job, output up, the rest of the layer. */
static flexdiag_status host_finish(const run_state *r, int32_t mb) {
    FLEXDIAG_TRY(flexdiag__layer_decode_finish(r, &r->held[mb]));
    return io_release(r, &r->held[mb]);
}

/* Layer j of every micro-batch of a decode pass. Where the host attends, the first halves of
 * its micro-batches are queued first, so the host starts on them while the device runs the
 * others; then their second halves, in order, each waiting for its job while the host works on
 * the next. With host_ahead, each second half is followed by the same micro-batch's first half
 * of layer j + 1 (queued here, so layer j + 1 skips them). */
static flexdiag_status decode_layer(const run_state *r, int32_t j, int ahead) {
    int32_t lo, hi;
    host_mbs(r, &lo, &hi);
    if (!ahead || j == 0)
        for (int32_t mb = lo; mb < hi; mb++) FLEXDIAG_TRY(host_send(r, j, mb));
    for (int32_t mb = 0; mb < r->n_mb; mb++)
        if (mb < lo || mb >= hi) FLEXDIAG_TRY(decode_mb(r, j, mb));
    for (int32_t mb = lo; mb < hi; mb++) {
        FLEXDIAG_TRY(host_finish(r, mb));
        if (ahead && j + 1 < r->c->m->cfg.lm.layers) FLEXDIAG_TRY(host_send(r, j + 1, mb));
    }
    return FLEXDIAG_OK;
}

/* The device work of a decode pass that reads only device buffers (ids, positions, plans):
 * feedback embedding, every layer of every micro-batch, the heads. Recordable as a graph. */
static flexdiag_status step_body(const run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    FLEXDIAG_TRY(flexdiag__feedback(r));
    int ahead = host_ahead(r);
    for (int32_t j = 0; j < l->layers; j++) FLEXDIAG_TRY(decode_layer(r, j, ahead));
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
        FLEXDIAG_TRY(flexdiag__head(r, (char *)c->b.x + (size_t)s0 * (size_t)l->hidden * r->act,
                                    s0, nb));
    }
    return FLEXDIAG_OK;
}

/* Graphs need the backend's support, a step without host-side captures or profiling, and a
 * scheduler whose calls are address arithmetic (the tiered one queues copies and may wait). */
static int use_graph(const run_state *r) {
    return r->k->graph_begin && !r->c->graphs_off && !r->split && !r->b->hidden &&
           !r->b->attn_out && r->c->sched->ops->graph_safe;
}

/* Replay the recorded step body (recording it first, for this variant and sequence count);
 * a failed recording turns graphs off for the context and runs the step op by op. The first
 * step at a new sequence count runs op by op, outside capture, so the backend builds (and
 * autotunes) its GEMM plans there; nothing may synchronise the host while recording. */
static flexdiag_status step_body_graph(const run_state *r, int scores) {
    flexdiag_context *c = r->c;
    void **g = &c->graph[scores];
    if (*g && c->graph_seq[scores] != r->n_seq) {
        r->k->graph_destroy(*g);
        *g = NULL;
    }
    if (!*g && c->eager_seq != r->n_seq) {
        c->eager_seq = r->n_seq;
        return step_body(r);
    }
    if (!*g) {
        FLEXDIAG_TRY(r->k->graph_begin(r->s));
        flexdiag_status st = step_body(r);
        void *ng = NULL;
        flexdiag_status st2 = r->k->graph_end(r->s, &ng);
        if (st != FLEXDIAG_OK || st2 != FLEXDIAG_OK) {
            if (ng) r->k->graph_destroy(ng);
            FLEXDIAG_WARN("decode-step graph not recorded (%s): launching op by op",
                          flexdiag__err_msg());
            flexdiag__err_clear();
            c->graphs_off = 1;
            return step_body(r);
        }
        *g = ng;
        c->graph_seq[scores] = r->n_seq;
    }
    return r->k->graph_launch(*g, r->s);
}

/* The positions of the pass's live sequences (prompt length + step) to the device. */
static flexdiag_status upload_positions(run_state *r) {
    flexdiag_context *c = r->c;
    for (int32_t s = 0; s < r->n_seq; s++)
        if (r->t[s] >= 0) c->h_pos[s] = r->lp[s] + r->t[s];
    return r->k->copy_h2d(c->b.pos, c->h_pos, (size_t)r->n_seq * 4, r->s);
}

static flexdiag_status decode_pass(run_state *r) {
    flexdiag_context *c = r->c;
    FLEXDIAG_TRY(cancelled(r));
    FLEXDIAG_TRY(upload_positions(r));
    r->pr = (flexdiag_pd_run){.n_seq = r->n_seq, .mb_seq = c->mb_seq, .n_mb = r->n_mb,
                              .t = r->t, .plan_out = r->b->plan_out, .plan_t = r->t[0]};
    double t0 = flexdiag__prof_begin(r);
    FLEXDIAG_TRY(flexdiag__pd_plan(&c->pd, &r->pr, r->s));
    FLEXDIAG_TRY(flexdiag__prof_end(r, PROF_ATTN, t0));
    if (use_graph(r))
        FLEXDIAG_TRY(step_body_graph(r, flexdiag__pd_scores(&c->pd)));
    else
        FLEXDIAG_TRY(step_body(r));
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
