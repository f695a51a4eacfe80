/*
 * run.c - one run of a context: prompts in, prefill, then the decode steps, each
 *
 *   plan (policy driver) -> body: feedback embedding, for layer j: for micro-batch k:
 *   acquire (scheduler + policy driver) -> layer forward (layer.c) -> release; heads
 *   -> CFG, sample, ids to the host -> update (policy driver)
 *
 * (with CPU attention the host-attended micro-batches of a layer run in two halves around
 * their host jobs, the next layer's first half queued after each second half where the
 * scheduler allows: decode_layer)
 *
 * The body reads only device buffers whose contents change between steps (ids, positions,
 * slot lists), so on backends with launch graphs it is recorded once per sequence count and
 * policy variant (with or without scores) and replayed every step; the resident scheduler's
 * acquire/release are address arithmetic, safe inside the recording. Prefill runs the same
 * layer-major loop over prompt chunks of at most PREFILL_TOKENS (context.c) and reports its
 * progress per layer (phase 0); decode steps report phase 1.
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
    if (!atomic_load(&r->c->cancel)) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CANCELLED, "generation cancelled");
}

/* The progress callback (phase 0 prefill, 1 decode); false from it cancels. */
static flexdiag_status progress(const run_state *r, int phase, uint64_t done, uint64_t total) {
    const flexdiag_block *b = r->b;
    if (!b->progress || b->progress(phase, done, total, b->progress_user)) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CANCELLED, "cancelled by the progress callback");
}

/* ---- layer I/O: acquire and release ---- */

/* The KV rows the forward over sequences [s0, s0 + nb) touches at decode step t (t < 0: a
 * prefill chunk), for a scheduler that moves the KV (offload/sched.h): prefill writes the prompt
 * rows; a decode step reads the prompt rows and the ring rows a's slot lists name (at most
 * min(t + 1, max_slots) of the resident prefix: fewer than resident for Diagonal and ALISA)
 * and writes one ring row (the policy's, or one per head within the prefix). */
static void kv_rows(const run_state *r, int32_t s0, int32_t nb, int32_t t,
                    const flexdiag_attn_args *a, flexdiag_sched_io *m) {
    const flexdiag_context *c = r->c;
    int32_t lp = 0;
    for (int32_t s = s0; s < s0 + nb; s++) lp = r->lp[s] > lp ? r->lp[s] : lp;
    if (t < 0) {
        *m = (flexdiag_sched_io){.kv_prompt = 0, .kv_ring = 0, .kv_w0 = 0, .kv_wn = lp};
        return;
    }
    int32_t w = flexdiag__kvp_write_slot(&c->pd.kp, t);
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
 * (decode steps (t >= 0) add the policy driver's rows and slot lists, prefill (t < 0) the
 * prompt rows and positions), then the scheduler's addresses for rows_per_seq activation rows
 * per sequence and the layer's tensors. */
static flexdiag_status io_acquire(const run_state *r, int32_t j, int32_t s0, int32_t nb,
                                  int32_t t, flexdiag_layer_io *io) {
    const flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    memset(io, 0, sizeof *io);
    io->t = t;
    io->a = (flexdiag_attn_args){.n_seq = nb, .h_q = l->heads, .h_kv = l->kv_heads,
                                 .d_h = l->head_dim, .p_cap = c->p_cap, .ring = c->pd.ring,
                                 .scale = 1.0f / sqrtf((float)l->head_dim), .lp = c->b.lp + s0,
                                 .rope_theta = l->rope_theta};
    int rope = l->pos_rows == 0; /* learned positions were added at the embedding */
    if (t < 0) {
        io->a.pos = rope ? c->b.pos_pf : NULL;
        io->rows = c->b.rows_pf;
        if (c->n_pre) io->a.ring = 0, io->a.lp = c->b.lp_pre + s0; /* prompt-only blocks */
    } else {
        io->a.pos = rope ? c->b.pos + s0 : NULL;
        io->a.p_cap = c->blk_p;
        io->rows = flexdiag__pd_attn(&c->pd, j, s0, flexdiag__pd_scores(&c->pd, t), &io->a);
        if (c->n_pre) shared_args(c, j, s0, &io->a);
    }
    kv_rows(r, s0, nb, t, &io->a, &io->mem);
    io->mem.layer = j;
    io->mem.s0 = s0;
    io->mem.n_seq = nb;
    io->mem.rows_per_seq = t < 0 ? c->p_cap : 1;
    io->mem.host_attend = t >= 0 && c->ca && s0 >= c->s_host && s0 < c->s_ca;
    FLEXDIAG_TRY(flexdiag__sched_acquire(c->sched, &io->mem));
    if (t < 0 && c->n_pre) { /* the prefill of shared prompt rows s0.. writes their store */
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

/* ---- prompts and prefill ---- */

/* The unconditional row of an image from its conditional prompt (n ids) into uncond; returns
 * its length. Janus (docs/architecture.md §4.1 step 3): BOS and the last id kept, the middle
 * padded. Chameleon: the image start and the two size tokens alone, at positions 0, 1, 2 (the
 * rows differ in length: a ragged batch). */
static int32_t uncond_row(const flexdiag_model_config *m, const int32_t *cond, int32_t n,
                          int32_t *uncond) {
    if (m->arch == FLEXDIAG_ARCH_CHAMELEON) {
        memcpy(uncond, cond + n - 3, 3 * sizeof *uncond);
        return 3;
    }
    int32_t pad = m->pad_id >= 0 ? m->pad_id : 0;
    for (int32_t i = 0; i < n; i++) uncond[i] = (i == 0 || i == n - 1) ? cond[i] : pad;
    return n;
}

/* Shared prompt rows: the distinct rows of ids (n_seq rows of p_cap, lengths r->lp) moved to
 * the front of ids in order of first use, prefix[s] the one sequence s reads, their lengths in
 * lp_pre; returns how many (r->n_pf), or -1 when the context holds fewer (message set). */
static int32_t share_rows(run_state *r, int32_t *ids, int32_t *prefix, int32_t *lp_pre) {
    const flexdiag_context *c = r->c;
    size_t row = (size_t)c->p_cap * 4;
    int32_t n = 0;
    for (int32_t s = 0; s < r->n_seq; s++) {
        int32_t u = 0;
        while (u < n && !(lp_pre[u] == r->lp[s] &&
                          !memcmp(ids + (size_t)u * c->p_cap, ids + (size_t)s * c->p_cap, row)))
            u++;
        if (u == n && n == c->n_pre) {
            flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                          "the block's images have more distinct prompt rows than the %d the "
                          "context shares (images_per_prompt %d): give the images of one prompt "
                          "side by side, or a smaller images_per_prompt",
                          c->n_pre, c->p.images_per_prompt);
            return -1;
        }
        if (u == n) {
            memmove(ids + (size_t)n * c->p_cap, ids + (size_t)s * c->p_cap, row);
            lp_pre[n++] = r->lp[s];
        }
        prefix[s] = u;
    }
    return n;
}

/* Each micro-batch's cascade plan of the shared prompt rows (prefix: the block's). */
static flexdiag_status upload_cascade(run_state *r, const int32_t *prefix) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    int32_t cap = flexdiag__casc_tiles(c, c->mb_seq), g = l->heads / l->kv_heads;
    int32_t *seq = malloc((size_t)r->n_seq * 4), *tile = calloc((size_t)c->n_mb * cap * 3 + 3, 4);
    flexdiag_status st = seq && tile ? FLEXDIAG_OK
                                     : flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                                                     "prompts: no host memory");
    for (int32_t s0 = 0; st == FLEXDIAG_OK && s0 < r->n_seq; s0 += c->mb_seq) {
        int32_t nb = r->n_seq - s0 < c->mb_seq ? r->n_seq - s0 : c->mb_seq;
        flexdiag__cascade_plan(prefix + s0, nb, c->n_pre, g, seq + s0,
                               tile + (size_t)(s0 / c->mb_seq) * 3 * cap);
    }
    if (st == FLEXDIAG_OK) st = r->k->copy_h2d(c->b.casc_seq, seq, (size_t)r->n_seq * 4, r->s);
    if (st == FLEXDIAG_OK && cap > 0)
        st = r->k->copy_h2d(c->b.casc_tile, tile, (size_t)c->n_mb * cap * 12, r->s);
    if (st == FLEXDIAG_OK) st = r->k->stream_sync(r->s); /* the host arrays are freed */
    free(seq);
    free(tile);
    return st;
}

/* Host prompt table (n_seq, p_cap) with the uncond rows, uploaded with lp and gathers (with
 * shared prompt rows: the distinct rows, their lengths and each sequence's). */
static flexdiag_status upload_prompts(run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_block *b = r->b;
    size_t cells = (size_t)r->n_seq * (size_t)c->p_cap, S = (size_t)r->n_seq;
    int32_t *ids = calloc(cells, 4), *last = malloc(S * 4 * 3), *prefix = last + S;
    int32_t *lp_pre = prefix + S;
    if (!ids || !last) {
        free(ids);
        free(last);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompts: no host memory");
    }
    for (int32_t i = 0; i < b->n_img; i++) {
        int32_t n = b->prompt_len[i];
        for (int32_t q = 0; q < c->rows_per_img; q++) {
            int32_t s = i * c->rows_per_img + q, *row = ids + (size_t)s * (size_t)c->p_cap;
            if (q == 0) memcpy(row, b->prompt[i], (size_t)n * 4);
            r->lp[s] = q == 0 ? n : uncond_row(&c->m->cfg, b->prompt[i], n, row);
        }
    }
    r->n_pf = c->n_pre ? share_rows(r, ids, prefix, lp_pre) : r->n_seq;
    flexdiag_status st = r->n_pf < 0 ? FLEXDIAG_ERR_INVALID_ARG : FLEXDIAG_OK;
    for (int32_t s = 0; st == FLEXDIAG_OK && s < r->n_seq; s++) /* prefill row of its last id */
        last[s] = (c->n_pre ? prefix[s] : s) * c->p_cap + r->lp[s] - 1;
    if (st == FLEXDIAG_OK)
        st = r->k->copy_h2d(c->b.ids_in, ids, (size_t)r->n_pf * (size_t)c->p_cap * 4, r->s);
    if (st == FLEXDIAG_OK) st = r->k->copy_h2d(c->b.lp, r->lp, S * 4, r->s);
    if (st == FLEXDIAG_OK) st = r->k->copy_h2d(c->b.last, last, S * 4, r->s);
    if (st == FLEXDIAG_OK && c->n_pre) st = r->k->copy_h2d(c->b.prefix, prefix, S * 4, r->s);
    if (st == FLEXDIAG_OK && c->n_pre) st = upload_cascade(r, prefix);
    if (st == FLEXDIAG_OK && c->n_pre)
        st = r->k->copy_h2d(c->b.lp_pre, lp_pre, (size_t)r->n_pf * 4, r->s);
    if (st == FLEXDIAG_OK) st = r->k->stream_sync(r->s);
    free(ids);
    free(last);
    return st;
}


static flexdiag_status validate_block(const flexdiag_context *c, const flexdiag_block *b) {
    const flexdiag_model_config *m = &c->m->cfg;
    if (b->n_img < 1 || b->n_img > c->n_img)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%d images requested, context holds 1..%d",
                             b->n_img, c->n_img);
    if (b->n_steps < 1 || b->n_steps > c->l_dec)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%d tokens per image requested, 1..%d allowed",
                             b->n_steps, c->l_dec);
    for (int32_t i = 0; i < b->n_img; i++) {
        if (b->prompt_len[i] < 1 || b->prompt_len[i] > c->p_cap)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "prompt %d has %d tokens; the context allows 1..%d (raise the "
                                 "maximum prompt length)",
                                 i, b->prompt_len[i], c->p_cap);
        for (int32_t j = 0; j < b->prompt_len[i]; j++)
            if (b->prompt[i][j] < 0 || b->prompt[i][j] >= m->lm.vocab)
                return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                     "prompt %d: token %d is id %d, outside the vocabulary [0, %d)",
                                     i, j, b->prompt[i][j], m->lm.vocab);
    }
    for (int32_t i = 0; c->row_len && i < b->n_img; i++) {
        const int32_t *p = b->prompt[i], n = b->prompt_len[i];
        if (n < 4 || p[n - 3] != m->boi_id || p[n - 2] != m->size_id || p[n - 1] != m->size_id)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "prompt %d: a Lumina-mGPT image prompt ends with the image "
                                 "start (id %d) and the size token (id %d) twice, after at "
                                 "least one text token (text prompts get them added)",
                                 i, m->boi_id, m->size_id);
    }
    for (int64_t i = 0; b->forced && i < (int64_t)b->n_img * b->n_steps; i++)
        if (b->forced[i] < 0 || b->forced[i] >= c->vocab_in)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "forced token %lld is id %d, outside [0, %d)", (long long)i,
                                 b->forced[i], c->vocab_in);
    if ((b->hidden && (int64_t)b->n_hidden_pos * m->lm.hidden > (int64_t)c->n_seq * c->vocab_out) ||
        (b->attn_out && (int64_t)m->lm.heads * m->lm.head_dim > (int64_t)c->n_seq * c->vocab_out))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "captures do not fit the scratch buffer");
    return FLEXDIAG_OK;
}

/* Layer j of the prompts of prefill chunk ch (sequences ch·pf_seq ..). */
static flexdiag_status prefill_chunk(const run_state *r, int32_t j, int32_t ch) {
    const flexdiag_context *c = r->c;
    int32_t s0 = ch * c->pf_seq, nb = r->n_pf - s0 < c->pf_seq ? r->n_pf - s0 : c->pf_seq;
    flexdiag_layer_io io;
    FLEXDIAG_TRY(io_acquire(r, j, s0, nb, -1, &io));
    FLEXDIAG_TRY(flexdiag__layer_prefill(r, &io));
    return io_release(r, &io);
}

static flexdiag_status run_prefill(run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    FLEXDIAG_TRY(upload_prompts(r));
    FLEXDIAG_TRY(r->k->embed(c->b.x, c->m->w.embed, c->b.ids_in, (int64_t)r->n_pf * c->p_cap,
                             l->hidden, 1, r->s));
    int32_t chunks = (r->n_pf + c->pf_seq - 1) / c->pf_seq;
    for (int32_t ch = 0; l->pos_rows && ch < chunks; ch++) { /* prompt row i: position i */
        int32_t s0 = ch * c->pf_seq, nb = r->n_pf - s0 < c->pf_seq ? r->n_pf - s0 : c->pf_seq;
        FLEXDIAG_TRY(flexdiag__add_positions(
            r, (char *)c->b.x + (size_t)s0 * (size_t)c->p_cap * (size_t)l->hidden * r->act,
            c->b.pos_pf, (int64_t)nb * c->p_cap));
    }
    for (int32_t j = 0; j < l->layers; j++) {
        FLEXDIAG_TRY(cancelled(r));
        for (int32_t ch = 0; ch < chunks; ch++) FLEXDIAG_TRY(prefill_chunk(r, j, ch));
        FLEXDIAG_TRY(progress(r, 0, (uint64_t)j + 1, (uint64_t)l->layers));
    }
    FLEXDIAG_TRY(r->k->gather_rows(c->b.xl, c->b.x, c->b.last, r->n_seq, l->hidden, r->s));
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
        FLEXDIAG_TRY(flexdiag__head(r, (char *)c->b.xl + (size_t)s0 * (size_t)l->hidden * r->act,
                                    s0, nb));
    }
    return flexdiag__take_step_output(r, 0);
}

/* ---- decode steps ---- */

/* Layer j of micro-batch mb at decode step t. */
static flexdiag_status decode_mb(const run_state *r, int32_t j, int32_t mb, int32_t t) {
    int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
    flexdiag_layer_io io;
    FLEXDIAG_TRY(io_acquire(r, j, s0, nb, t, &io));
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
static flexdiag_status host_send(const run_state *r, int32_t j, int32_t mb, int32_t t) {
    int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
    FLEXDIAG_TRY(io_acquire(r, j, s0, nb, t, &r->held[mb]));
    return flexdiag__layer_decode_send(r, &r->held[mb]);
}

/* Second half: wait for its job, output up, the rest of the layer. */
static flexdiag_status host_finish(const run_state *r, int32_t mb) {
    FLEXDIAG_TRY(flexdiag__layer_decode_finish(r, &r->held[mb]));
    return io_release(r, &r->held[mb]);
}

/* Layer j of every micro-batch at decode step t. Where the host attends, the first halves of
 * its micro-batches are queued first, so the host starts on them while the device runs the
 * others; then their second halves, in order, each waiting for its job while the host works on
 * the next. With host_ahead, each second half is followed by the same micro-batch's first half
 * of layer j + 1 (queued here, so layer j + 1 skips them). */
static flexdiag_status decode_layer(const run_state *r, int32_t j, int32_t t, int ahead) {
    int32_t lo, hi;
    host_mbs(r, &lo, &hi);
    if (!ahead || j == 0)
        for (int32_t mb = lo; mb < hi; mb++) FLEXDIAG_TRY(host_send(r, j, mb, t));
    for (int32_t mb = 0; mb < r->n_mb; mb++)
        if (mb < lo || mb >= hi) FLEXDIAG_TRY(decode_mb(r, j, mb, t));
    for (int32_t mb = lo; mb < hi; mb++) {
        FLEXDIAG_TRY(host_finish(r, mb));
        if (ahead && j + 1 < r->c->m->cfg.lm.layers) FLEXDIAG_TRY(host_send(r, j + 1, mb, t));
    }
    return FLEXDIAG_OK;
}

/* The device work of decode step t that reads only device buffers (ids, positions, plans):
 * feedback embedding, every layer of every micro-batch, the heads. Recordable as a graph. */
static flexdiag_status step_body(const run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    FLEXDIAG_TRY(flexdiag__feedback(r));
    int ahead = host_ahead(r);
    for (int32_t j = 0; j < l->layers; j++) FLEXDIAG_TRY(decode_layer(r, j, t, ahead));
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
static flexdiag_status step_body_graph(const run_state *r, int32_t t, int scores) {
    flexdiag_context *c = r->c;
    void **g = &c->graph[scores];
    if (*g && c->graph_seq[scores] != r->n_seq) {
        r->k->graph_destroy(*g);
        *g = NULL;
    }
    if (!*g && c->eager_seq != r->n_seq) {
        c->eager_seq = r->n_seq;
        return step_body(r, t);
    }
    if (!*g) {
        FLEXDIAG_TRY(r->k->graph_begin(r->s));
        flexdiag_status st = step_body(r, t);
        void *ng = NULL;
        flexdiag_status st2 = r->k->graph_end(r->s, &ng);
        if (st != FLEXDIAG_OK || st2 != FLEXDIAG_OK) {
            if (ng) r->k->graph_destroy(ng);
            FLEXDIAG_WARN("decode-step graph not recorded (%s): launching op by op",
                          flexdiag__err_msg());
            flexdiag__err_clear();
            c->graphs_off = 1;
            return step_body(r, t);
        }
        *g = ng;
        c->graph_seq[scores] = r->n_seq;
    }
    return r->k->graph_launch(*g, r->s);
}

static flexdiag_status run_decode_step(run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    FLEXDIAG_TRY(cancelled(r));
    for (int32_t s = 0; s < r->n_seq; s++) c->h_pos[s] = r->lp[s] + t;
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.pos, c->h_pos, (size_t)r->n_seq * 4, r->s));
    double t0 = flexdiag__prof_begin(r);
    FLEXDIAG_TRY(flexdiag__pd_plan(&c->pd, &r->pr, t, r->s));
    FLEXDIAG_TRY(flexdiag__prof_end(r, PROF_ATTN, t0));
    if (use_graph(r))
        FLEXDIAG_TRY(step_body_graph(r, t, flexdiag__pd_scores(&c->pd, t)));
    else
        FLEXDIAG_TRY(step_body(r, t));
    FLEXDIAG_TRY(flexdiag__take_step_output(r, t + 1));
    FLEXDIAG_TRY(flexdiag__cpu_attn_status(c));
    t0 = flexdiag__prof_begin(r);
    FLEXDIAG_TRY(flexdiag__pd_update(&c->pd, &r->pr, t, r->s));
    return flexdiag__prof_end(r, PROF_ATTN, t0);
}

/* One decode step; when profiled, its whole wall time (between stream syncs) goes to
 * split[3]. */
static flexdiag_status profiled_step(run_state *r, int32_t t) {
    if (!r->split) return run_decode_step(r, t);
    FLEXDIAG_TRY(r->k->stream_sync(r->s));
    double t0 = flexdiag__now();
    FLEXDIAG_TRY(run_decode_step(r, t));
    FLEXDIAG_TRY(r->k->stream_sync(r->s));
    r->split[3] += flexdiag__now() - t0;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__engine_run(flexdiag_context *c, const flexdiag_block *b) {
    FLEXDIAG_TRY(validate_block(c, b));
    run_state r = {.c = c, .b = b, .k = c->m->rt->k, .s = c->s,
                   .n_seq = b->n_img * c->rows_per_img, .act = (size_t)c->m->rt->k->act_bytes};
    r.n_mb = (b->n_img + c->mb_img - 1) / c->mb_img;
    r.pr = (flexdiag_pd_run){.n_seq = r.n_seq, .mb_seq = c->mb_seq, .n_mb = r.n_mb,
                             .plan_out = b->plan_out};
    r.lp = malloc((size_t)r.n_seq * 4);
    if (c->ca) r.held = malloc((size_t)r.n_mb * sizeof *r.held);
    if (!r.lp || (c->ca && !r.held)) {
        free(r.lp);
        free(r.held);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "run: no host memory");
    }
    flexdiag__pd_reset(&c->pd);
    double t0 = flexdiag__now();
    flexdiag_status st = run_prefill(&r);
    if (st == FLEXDIAG_OK) st = r.k->stream_sync(r.s);
    double t1 = flexdiag__now();
    for (int32_t t = 0; st == FLEXDIAG_OK && t + 1 < b->n_steps; t++) {
        r.split = b->split && t >= b->split_from ? b->split : NULL; /* decode steps only */
        st = profiled_step(&r, t);
        if (st == FLEXDIAG_OK) st = progress(&r, 1, (uint64_t)t + 2, (uint64_t)b->n_steps);
    }
    if (st == FLEXDIAG_OK) st = r.k->stream_sync(r.s);
    double t2 = flexdiag__now();
    c->stats.prefill_s += t1 - t0;
    c->stats.decode_s += t2 - t1;
    c->stats.tokens_generated += (uint64_t)r.n_seq * (uint64_t)b->n_steps;
    c->stats.evictions = flexdiag__pd_evictions(&c->pd);
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    /* the prompt rows of sequence 0, or with shared prompt rows its share of them */
    double prompt = c->n_pre && r.n_pf > 0 ? (double)r.lp[0] * r.n_pf / r.n_seq : r.lp[0];
    c->n_pf = r.n_pf;
    c->stats.kv_bytes_per_seq =
        (uint64_t)((double)l->layers * 2 * l->kv_heads * l->head_dim * (double)r.act *
                   (prompt + (double)flexdiag__kvp_resident_rows(&c->pd.kp, c->l_dec - 1)));
    free(r.lp);
    free(r.held);
    return st;
}

flexdiag_status flexdiag__context_score(flexdiag_context *c, const int32_t *prompt, int32_t np,
                                        const int32_t *ids, int32_t n, float cfg_weight,
                                        float *logits, float *raw) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&c->busy, &expected, 1))
        return flexdiag__err(FLEXDIAG_ERR_BUSY, "another call is running on this context");
    int32_t *tokens = malloc((size_t)(n > 0 ? n : 1) * 4);
    flexdiag_block b = {.n_img = 1, .prompt = &prompt, .prompt_len = &np, .n_steps = n,
                        .forced = ids, .cfg_weight = cfg_weight, .tokens = tokens,
                        .logits = logits, .raw_logits = raw, .sp = {1.0f, 0, 1.0f, 0}};
    atomic_store(&c->cancel, 0);
    memset(&c->stats, 0, sizeof c->stats);
    flexdiag_status st = tokens ? flexdiag__engine_run(c, &b)
                                : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "score: no memory");
    free(tokens);
    atomic_store(&c->busy, 0);
    return st;
}
