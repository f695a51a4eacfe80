/*
 * layer.c - one decoder layer's forward over its I/O object (run_state.h flexdiag_layer_io):
 *
 *   x += o_proj(attention(rope(qkv(rmsnorm(x)))));  x += down(swiglu(gate_up(rmsnorm(x))))
 *
 * (Chameleon adds a LayerNorm of every q and k head before the RoPE: lm.qk_rows), or, for
 * OPT's block (lm.layer_norm, bias, relu_mlp; learned positions, no RoPE):
 *
 *   x += out_proj(attention(qkv(LN(x)) + b)) + b;    x += fc2(ReLU(fc1(LN(x)) + b1)) + b2
 *
 * with the new K/V appended to the cache rows the policy driver chose before attention reads
 * them. Prefill runs a chunk of whole prompts (causal attention over the prompt rows); a decode
 * step runs one row per sequence (attention over the prompt rows and the planned ring slots),
 * or, where the host attends (CPU attention, cpu_attn.h), two halves around the host's job.
 * Every address comes from the I/O object; this file computes, it never locates.
 */
#include "base/core.h"
#include "runtime/engine/cpu_attn.h"
#include "runtime/engine/run_state.h"

/* The block's norm of n rows: RMSNorm, or LayerNorm with its bias (lm.layer_norm). */
static flexdiag_status norm(const run_state *r, void *out, const void *x, const uint16_t *w,
                            const uint16_t *b, int64_t n) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    if (l->layer_norm) return r->k->layernorm(out, x, w, b, n, l->hidden, l->rms_eps, r->s);
    return r->k->rmsnorm(out, x, w, n, l->hidden, l->rms_eps, r->s);
}

/* norm -> QKV GEMM (+ bias) for n rows starting at x (RoPE on the q and k heads, where the
 * model has it, is part of the kv_append that follows). */
static flexdiag_status qkv_proj(const run_state *r, const flexdiag_layer_w *w, const void *x,
                                int64_t n) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    const flexdiag_ctx_bufs *b = &r->c->b;
    int64_t qkvw = (int64_t)(l->heads + 2 * l->kv_heads) * l->head_dim;
    TIMED(r, PROF_REST, norm(r, b->h, x, w->attn_norm, w->attn_norm_b, n));
    TIMED(r, PROF_GEMM,
          r->k->matmul(b->qkv, b->h, w->wqkv, w->bqkv, n, l->hidden, qkvw, 0, r->s));
    if (l->qk_rows) /* Chameleon: LayerNorm of every q and k head, then RoPE in kv_append */
        TIMED(r, PROF_REST, r->k->qk_norm(b->qkv, w->q_norm, w->q_norm_b, w->k_norm, w->k_norm_b,
                                          n, l->heads, l->kv_heads, l->head_dim, l->qk_rows,
                                          l->qk_rows, l->rms_eps, r->s));
    return FLEXDIAG_OK;
}

/* The MLP of n normed rows in b->h, added onto x: SwiGLU (gate/up -> down) or, with
 * lm.relu_mlp, fc2(ReLU(fc1 h + b1)) + b2. */
static flexdiag_status mlp(const run_state *r, const flexdiag_layer_w *w, void *x, int64_t n) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    const flexdiag_ctx_bufs *b = &r->c->b;
    if (l->relu_mlp) {
        TIMED(r, PROF_GEMM,
              r->k->matmul(b->gu, b->h, w->wgu, w->bgu, n, l->hidden, l->ffn, 0, r->s));
        TIMED(r, PROF_REST, r->k->relu(b->gu, n * l->ffn, r->s));
        TIMED(r, PROF_GEMM, r->k->matmul(x, b->gu, w->wdown, w->bdown, n, l->ffn, l->hidden,
                                         FLEXDIAG_MM_ACCUM, r->s));
        return FLEXDIAG_OK;
    }
    TIMED(r, PROF_GEMM,
          r->k->matmul(b->gu, b->h, w->wgu, NULL, n, l->hidden, 2 * (int64_t)l->ffn, 0, r->s));
    TIMED(r, PROF_REST, r->k->swiglu(b->mlp, b->gu, n, l->ffn, r->s));
    TIMED(r, PROF_GEMM,
          r->k->matmul(x, b->mlp, w->wdown, NULL, n, l->ffn, l->hidden, FLEXDIAG_MM_ACCUM, r->s));
    return FLEXDIAG_OK;
}

/* x += o_proj(att) (+ bias); x += mlp(norm(x)) for n rows. */
static flexdiag_status out_and_mlp(const run_state *r, const flexdiag_layer_w *w, void *x,
                                   int64_t n) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    const flexdiag_ctx_bufs *b = &r->c->b;
    int64_t dq = (int64_t)l->heads * l->head_dim;
    TIMED(r, PROF_GEMM,
          r->k->matmul(x, b->att, w->wo, w->bo, n, dq, l->hidden, FLEXDIAG_MM_ACCUM, r->s));
    TIMED(r, PROF_REST, norm(r, b->h, x, w->mlp_norm, w->mlp_norm_b, n));
    return mlp(r, w, x, n);
}

/* ---- captures for tests and the fidelity bench (sequence 0 only) ---- */

/* Copy hidden rows of sequence 0 (positions pos0.. of n rows at src) into b->hidden[layer]. */
static flexdiag_status capture_hidden(const run_state *r, int32_t layer, const void *src,
                                      int32_t pos0, int32_t n) {
    const flexdiag_block *b = r->b;
    int32_t d = r->c->m->cfg.lm.hidden;
    if (!b->hidden || pos0 >= b->n_hidden_pos) return FLEXDIAG_OK;
    if (pos0 + n > b->n_hidden_pos) n = b->n_hidden_pos - pos0;
    FLEXDIAG_TRY(r->k->act_to_f32(r->c->b.logits, src, (int64_t)n * d, r->s));
    float *dst = b->hidden + ((size_t)layer * (size_t)b->n_hidden_pos + (size_t)pos0) * (size_t)d;
    return r->k->copy_d2h(dst, r->c->b.logits, (size_t)n * (size_t)d * 4, r->s);
}

/* Attention output of sequence 0 at decode step t, layer j -> b->attn_out. */
static flexdiag_status capture_attn(const run_state *r, int32_t j, int32_t t) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    size_t w = (size_t)l->heads * (size_t)l->head_dim;
    FLEXDIAG_TRY(r->k->act_to_f32(r->c->b.logits, r->c->b.att, (int64_t)w, r->s));
    float *dst = r->b->attn_out + ((size_t)t * (size_t)l->layers + (size_t)j) * w;
    return r->k->copy_d2h(dst, r->c->b.logits, w * 4, r->s);
}

/* ---- the two forwards ---- */

flexdiag_status flexdiag__layer_prefill(const run_state *r, const flexdiag_layer_io *io) {
    const flexdiag_context *c = r->c;
    const flexdiag_sched_io *m = &io->mem;
    int64_t ntok = (int64_t)m->n_seq * io->a.p_cap; /* the pass's rows a sequence (pf_q) */
    FLEXDIAG_TRY(qkv_proj(r, &io->w, m->x, ntok));
    FLEXDIAG_TRY(r->k->kv_append(m->k, m->v, c->b.qkv, io->rows, ntok, io->a.p_cap, &io->a, r->s));
    FLEXDIAG_TRY(r->k->attn_prefill(c->b.att, c->b.qkv, m->k, m->v, &io->a, r->s));
    FLEXDIAG_TRY(out_and_mlp(r, &io->w, m->x, ntok));
    return m->s0 == 0 ? capture_hidden(r, m->layer, m->x, 0, r->lp[0]) : FLEXDIAG_OK;
}

/* A decode step after its attention output is in b.att (t0: the attention's profiling start). */
static flexdiag_status decode_tail(const run_state *r, const flexdiag_layer_io *io, double t0) {
    const flexdiag_sched_io *m = &io->mem;
    if (m->s0 == 0 && r->b->attn_out) FLEXDIAG_TRY(capture_attn(r, m->layer, io->t));
    FLEXDIAG_TRY(flexdiag__prof_end(r, PROF_ATTN, t0));
    FLEXDIAG_TRY(out_and_mlp(r, &io->w, m->x, (int64_t)m->n_seq * m->rows_per_seq));
    return m->s0 == 0 ? capture_hidden(r, m->layer, m->x, r->lp[0] + io->t, 1) : FLEXDIAG_OK;
}

flexdiag_status flexdiag__layer_decode(const run_state *r, const flexdiag_layer_io *io) {
    const flexdiag_context *c = r->c;
    const flexdiag_sched_io *m = &io->mem;
    int64_t n = (int64_t)m->n_seq * m->rows_per_seq; /* a window pass: rows_per_seq rows each */
    FLEXDIAG_TRY(qkv_proj(r, &io->w, m->x, n));
    double t0 = flexdiag__prof_begin(r);
    FLEXDIAG_TRY(r->k->kv_append(m->k, m->v, c->b.qkv, io->rows, n, m->rows_per_seq, &io->a, r->s));
    FLEXDIAG_TRY(r->k->attn_decode(c->b.att, c->b.qkv, m->k, m->v, &io->a, r->s));
    return decode_tail(r, io, t0);
}

flexdiag_status flexdiag__layer_decode_send(const run_state *r, const flexdiag_layer_io *io) {
    FLEXDIAG_TRY(qkv_proj(r, &io->w, io->mem.x, io->mem.n_seq));
    return flexdiag__cpu_attn_send(r, io);
}

flexdiag_status flexdiag__layer_decode_finish(const run_state *r, const flexdiag_layer_io *io) {
    double t0 = flexdiag__prof_begin(r);
    FLEXDIAG_TRY(flexdiag__cpu_attn_recv(r, io));
    return decode_tail(r, io, t0);
}
