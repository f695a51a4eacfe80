/*
 * heads.c - what happens after the last layer and before the first: the output head (a text
 * model's lm_head, Chameleon's image-code slice of it, or Janus's gen_head MLP), CFG combine,
 * sampling, the forced token (teacher forcing, Chameleon's row ends) or the teacher-forced
 * id, the copy of the ids to the host (the one host sync of a decode step), and the next step's
 * input embedding (text and Chameleon: embed_tokens, plus OPT's learned positions; Janus:
 * gen_embed -> gen_aligner MLP).
 */
#include <stdio.h>

#include "base/core.h"
#include "runtime/engine/run_state.h"

flexdiag_status flexdiag__head(const run_state *r, const void *xin, int32_t s0, int32_t nb) {
    const flexdiag_context *c = r->c;
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_weights *w = &c->m->w;
    float *out = c->b.logits + (size_t)s0 * (size_t)c->geo.vocab_out;
    int32_t d = m->lm.hidden;
    if (m->lm.layer_norm)
        TIMED(r, PROF_REST, r->k->layernorm(c->b.h, xin, w->final_norm, w->final_norm_b, nb, d,
                                            m->lm.rms_eps, r->s));
    else
        TIMED(r, PROF_REST,
              r->k->rmsnorm(c->b.h, xin, w->final_norm, nb, d, m->lm.rms_eps, r->s));
    if (m->arch != FLEXDIAG_ARCH_JANUS) { /* rows id0 .. id0 + vocab_out - 1 of lm_head */
        const uint16_t *head = w->lm_head + (size_t)c->geo.id0 * (size_t)d;
        TIMED(r, PROF_GEMM, r->k->matmul(out, c->b.h, head, NULL, nb, d, c->geo.vocab_out,
                                         FLEXDIAG_MM_OUT_F32, r->s));
        return FLEXDIAG_OK;
    }
    TIMED(r, PROF_GEMM, r->k->matmul(c->b.hm, c->b.h, w->head_w1, w->head_b1, nb, d,
                                     m->head_dim_mid, 0, r->s));
    TIMED(r, PROF_REST, r->k->gelu(c->b.hm, (int64_t)nb * m->head_dim_mid, r->s));
    TIMED(r, PROF_GEMM, r->k->matmul(out, c->b.hm, w->head_w2, w->head_b2, nb, m->head_dim_mid,
                                     c->geo.vocab_out, FLEXDIAG_MM_OUT_F32, r->s));
    return FLEXDIAG_OK;
}

/* Whether slot i takes part in this output: live, and fresh (just prefilled) when asked. */
static int taking(const run_state *r, int32_t i, int fresh) {
    return r->slot[i].live && (!fresh || r->slot[i].fresh);
}

int flexdiag__forced_at(const run_state *r, const run_slot *sl, int32_t step, int32_t *id) {
    const flexdiag_context *c = r->c;
    if (sl->job.forced) *id = sl->job.forced[step];
    else if (c->geo.row_len && step % c->geo.row_len == c->geo.row_len - 1) *id = c->m->cfg.row_end_id;
    else return 0;
    return 1;
}

/* CFG: the guided distribution of every taking image, one call per run of consecutive taking
 * images with the same weight. */
static flexdiag_status combine(const run_state *r, int fresh) {
    const flexdiag_context *c = r->c;
    size_t V = (size_t)c->geo.vocab_out;
    for (int32_t i = 0, e; i < r->n_img; i = e) {
        float w = r->slot[i].job.cfg_weight;
        int in = taking(r, i, fresh);
        for (e = i + 1; e < r->n_img && taking(r, e, fresh) == in &&
                        (!in || r->slot[e].job.cfg_weight == w);
             e++) {}
        if (in)
            FLEXDIAG_TRY(r->k->cfg_combine(c->b.cfg + (size_t)i * V,
                                           c->b.logits + (size_t)i * 2 * V, e - i, (int64_t)V,
                                           w, r->s));
    }
    return FLEXDIAG_OK;
}

/* The draw of each taking image that does not take a forced id into c->up.srows (req -1: no
 * draw); returns how many draw. A forced id goes to the slot's `forced` (-1: none). */
static int32_t plan_draws(const run_state *r, int fresh) {
    flexdiag_context *c = r->c;
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_img; i++) {
        run_slot *sl = &r->slot[i];
        sl->forced = -1;
        c->up.srows[i] = (flexdiag_sample_row){.req = -1};
        if (!taking(r, i, fresh) || flexdiag__forced_at(r, sl, sl->made, &sl->forced)) continue;
        const flexdiag_sample_params *sp = &sl->job.sp;
        c->up.srows[i] = (flexdiag_sample_row){.seed = sp->seed, .req = sl->job.img,
                                              .step = sl->made, .temperature = sp->temperature,
                                              .top_k = sp->top_k, .top_p = sp->top_p,
                                              .id0 = c->geo.id0};
        n++;
    }
    return n;
}

/* The ids of the taking images' next tokens into c->b.ids and c->up.ids: drawn from dist, or
 * forced. A drawn id outside the vocabulary (logits not finite) fails its slot: made = -1. */
static flexdiag_status step_ids(const run_state *r, int fresh, const float *dist) {
    flexdiag_context *c = r->c;
    int32_t n_draw = plan_draws(r, fresh), n_forced = 0;
    size_t n = (size_t)r->n_img;
    if (n_draw) {
        FLEXDIAG_TRY(r->k->copy_h2d(c->b.srows, c->up.srows, n * sizeof *c->up.srows, r->s));
        FLEXDIAG_TRY(r->k->sample(c->b.ids, dist, r->n_img, c->geo.vocab_out, c->b.srows, r->s));
        FLEXDIAG_TRY(r->k->copy_d2h(c->up.ids, c->b.ids, n * 4, r->s));
    }
    for (int32_t i = 0; i < r->n_img; i++) {
        if (r->slot[i].forced >= 0) {
            c->up.ids[i] = r->slot[i].forced;
            n_forced++;
        } else if (c->up.srows[i].req >= 0 &&
                   (c->up.ids[i] < c->geo.id0 || c->up.ids[i] >= c->geo.id0 + c->geo.vocab_out)) {
            run_slot *sl = &r->slot[i];
            snprintf(sl->msg, sizeof sl->msg,
                     "step %d: image %lld: logits are not finite (sampled id %d)", sl->made,
                     (long long)sl->job.img, c->up.ids[i]);
            sl->made = -1;
        }
    }
    if (!n_forced) return FLEXDIAG_OK;
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.ids, c->up.ids, n * 4, r->s));
    /* without a draw nothing waits for the stream before the host writes up.ids again */
    return n_draw ? FLEXDIAG_OK : r->k->stream_sync(r->s);
}

/* The lock-step captures of a block (engine.h flexdiag_block): the guided and per-row logits
 * of token `step` of every image. */
static flexdiag_status capture_logits(const run_state *r, const float *dist, int32_t step) {
    const flexdiag_context *c = r->c;
    const flexdiag_block *b = r->b;
    size_t V = (size_t)c->geo.vocab_out;
    for (int32_t i = 0; b->logits && i < b->n_img; i++)
        FLEXDIAG_TRY(r->k->copy_d2h(b->logits + ((size_t)i * b->n_steps + step) * V,
                                    dist + (size_t)i * V, V * 4, r->s));
    for (int32_t i = 0; b->raw_logits && i < b->n_img * c->geo.rows_per_img; i++)
        FLEXDIAG_TRY(r->k->copy_d2h(b->raw_logits + ((size_t)i * b->n_steps + step) * V,
                                    c->b.logits + (size_t)i * V, V * 4, r->s));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__take_step_output(run_state *r, int fresh) {
    flexdiag_context *c = r->c;
    const float *dist = c->b.logits;
    if (c->geo.rows_per_img == 2) {
        FLEXDIAG_TRY(combine(r, fresh));
        dist = c->b.cfg;
    }
    FLEXDIAG_TRY(step_ids(r, fresh, dist));
    if (r->b->logits || r->b->raw_logits) FLEXDIAG_TRY(capture_logits(r, dist, r->slot[0].made));
    size_t V = (size_t)c->geo.vocab_out;
    for (int32_t i = 0; i < r->n_img; i++) {
        run_slot *sl = &r->slot[i];
        if (!taking(r, i, fresh) || sl->made < 0) continue;
        if (sl->job.logits)
            FLEXDIAG_TRY(r->k->copy_d2h(sl->job.logits + (size_t)sl->made * V,
                                        dist + (size_t)i * V, V * 4, r->s));
        sl->job.tokens[sl->made++] = c->up.ids[i];
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__add_positions(const run_state *r, void *x, const int32_t *pos,
                                        int64_t n) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    if (!l->pos_rows) return FLEXDIAG_OK;
    return r->k->pos_embed_add(x, r->c->m->w.pos_embed, pos, n, l->hidden, l->pos_offset, r->s);
}

flexdiag_status flexdiag__feedback(const run_state *r) {
    const flexdiag_context *c = r->c;
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_weights *w = &c->m->w;
    int32_t n = r->n_seq * r->win, d = m->lm.hidden;
    int32_t rep = r->win > 1 ? 1 : c->geo.rows_per_img; /* a window pass: an id every row */
    if (m->arch != FLEXDIAG_ARCH_JANUS) { /* both CFG rows of an image take its id */
        FLEXDIAG_TRY(r->k->embed(c->b.x, w->embed, c->b.ids, n, d, rep, r->s));
        return flexdiag__add_positions(r, c->b.x, c->b.pos, n);
    }
    FLEXDIAG_TRY(r->k->embed(c->b.emb, w->gen_embed, c->b.ids, n, m->image_embed, rep, r->s));
    const void *in = c->b.emb;
    int32_t in_dim = m->image_embed;
    for (int32_t i = 0; i < m->aligner_depth; i++) { /* Linear, GELU between layers */
        void *out = i == m->aligner_depth - 1 ? c->b.x : (i % 2 ? c->b.xl : c->b.hm);
        FLEXDIAG_TRY(r->k->matmul(out, in, w->align_w[i], w->align_b[i], n, in_dim, d, 0, r->s));
        if (i < m->aligner_depth - 1) FLEXDIAG_TRY(r->k->gelu(out, (int64_t)n * d, r->s));
        in = out;
        in_dim = d;
    }
    return FLEXDIAG_OK;
}
