/*
 * heads.c - what happens after the last layer and before the first: the output head (a text
 * model's lm_head, Chameleon's image-code slice of it, or Janus's gen_head MLP), CFG combine,
 * sampling, the forced token (teacher forcing, Chameleon's row ends) or the teacher-forced
 * id, the copy of the ids to the host (the one host sync of a decode step), and the next step's
 * input embedding (text and Chameleon: embed_tokens, plus OPT's learned positions; Janus:
 * gen_embed -> gen_aligner MLP).
 */
#include "base/core.h"
#include "runtime/engine/run_state.h"

flexdiag_status flexdiag__head(const run_state *r, const void *xin, int32_t s0, int32_t nb) {
    const flexdiag_context *c = r->c;
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_weights *w = &c->m->w;
    float *out = c->b.logits + (size_t)s0 * (size_t)c->vocab_out;
    int32_t d = m->lm.hidden;
    if (m->lm.layer_norm)
        TIMED(r, PROF_REST, r->k->layernorm(c->b.h, xin, w->final_norm, w->final_norm_b, nb, d,
                                            m->lm.rms_eps, r->s));
    else
        TIMED(r, PROF_REST,
              r->k->rmsnorm(c->b.h, xin, w->final_norm, nb, d, m->lm.rms_eps, r->s));
    if (m->arch != FLEXDIAG_ARCH_JANUS) { /* rows id0 .. id0 + vocab_out - 1 of lm_head */
        const uint16_t *head = w->lm_head + (size_t)c->id0 * (size_t)d;
        TIMED(r, PROF_GEMM, r->k->matmul(out, c->b.h, head, NULL, nb, d, c->vocab_out,
                                         FLEXDIAG_MM_OUT_F32, r->s));
        return FLEXDIAG_OK;
    }
    TIMED(r, PROF_GEMM, r->k->matmul(c->b.hm, c->b.h, w->head_w1, w->head_b1, nb, d,
                                     m->head_dim_mid, 0, r->s));
    TIMED(r, PROF_REST, r->k->gelu(c->b.hm, (int64_t)nb * m->head_dim_mid, r->s));
    TIMED(r, PROF_GEMM, r->k->matmul(out, c->b.hm, w->head_w2, w->head_b2, nb, m->head_dim_mid,
                                     c->vocab_out, FLEXDIAG_MM_OUT_F32, r->s));
    return FLEXDIAG_OK;
}

/* The ids of output step `step` into c->b.ids and c->h_ids: teacher-forced, the row end of a
 * Chameleon image (the same step for every image of the block), or drawn from dist. */
static flexdiag_status step_ids(const run_state *r, int32_t step, const float *dist) {
    flexdiag_context *c = r->c;
    const flexdiag_block *b = r->b;
    int row_end = c->row_len && step % c->row_len == c->row_len - 1;
    if (b->forced || row_end) {
        for (int32_t i = 0; i < b->n_img; i++)
            c->h_ids[i] = b->forced ? b->forced[(size_t)i * b->n_steps + step]
                                    : c->m->cfg.row_end_id;
        return r->k->copy_h2d(c->b.ids, c->h_ids, (size_t)b->n_img * 4, r->s);
    }
    flexdiag_sample_params sp = b->sp;
    sp.id0 = c->id0;
    FLEXDIAG_TRY(r->k->sample(c->b.ids, dist, b->n_img, c->vocab_out, &sp, b->img0, step, r->s));
    FLEXDIAG_TRY(r->k->copy_d2h(c->h_ids, c->b.ids, (size_t)b->n_img * 4, r->s));
    for (int32_t i = 0; i < b->n_img; i++)
        if (c->h_ids[i] < c->id0 || c->h_ids[i] >= c->id0 + c->vocab_out)
            return flexdiag__err(FLEXDIAG_ERR_NUMERIC,
                                 "step %d: image %d: logits are not finite (sampled id %d)", step,
                                 i, c->h_ids[i]);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__take_step_output(run_state *r, int32_t step) {
    flexdiag_context *c = r->c;
    const flexdiag_block *b = r->b;
    size_t V = (size_t)c->vocab_out;
    const float *dist = c->b.logits;
    if (c->rows_per_img == 2) {
        FLEXDIAG_TRY(r->k->cfg_combine(c->b.cfg, c->b.logits, b->n_img, (int64_t)V,
                                       b->cfg_weight, r->s));
        dist = c->b.cfg;
    }
    FLEXDIAG_TRY(step_ids(r, step, dist));
    for (int32_t i = 0; i < b->n_img; i++) b->tokens[(size_t)i * b->n_steps + step] = c->h_ids[i];
    for (int32_t i = 0; b->logits && i < b->n_img; i++)
        FLEXDIAG_TRY(r->k->copy_d2h(b->logits + ((size_t)i * b->n_steps + step) * V,
                                    dist + (size_t)i * V, V * 4, r->s));
    for (int32_t i = 0; b->raw_logits && i < r->n_seq; i++)
        FLEXDIAG_TRY(r->k->copy_d2h(b->raw_logits + ((size_t)i * b->n_steps + step) * V,
                                    c->b.logits + (size_t)i * V, V * 4, r->s));
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
    int32_t n = r->n_seq, d = m->lm.hidden;
    if (m->arch != FLEXDIAG_ARCH_JANUS) { /* both CFG rows of an image take its id */
        FLEXDIAG_TRY(r->k->embed(c->b.x, w->embed, c->b.ids, n, d, c->rows_per_img, r->s));
        return flexdiag__add_positions(r, c->b.x, c->b.pos, n);
    }
    FLEXDIAG_TRY(r->k->embed(c->b.emb, w->gen_embed, c->b.ids, n, m->image_embed, 2, r->s));
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
