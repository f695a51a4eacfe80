/*
 * engine.c - the generation engine: context buffers, prefill, decode steps, heads, CFG and
 * sampling, all through the backend op table (engine.h explains the objects).
 *
 * Flow of one run (design.md §2):
 *   prompt rows (cond/uncond per image) -> embed -> for layer: for micro-batch: prefill layer
 *   -> gather last rows -> head -> CFG -> sample (or take the forced id)
 *   for t = 0..n_steps-2: feedback embedding of token t (Janus: gen_embed -> gen_aligner;
 *   Llama: embed_tokens) -> for layer: for micro-batch: decode layer (policy plan -> append
 *   K/V to its ring slot -> attention over prompt + planned slots -> policy update) -> head
 *   -> CFG -> sample token t+1.
 * The KV policy runs on the host (policy/), exchanging small slot lists and, only on steps where
 * the policy needs them, the attended logits. Everything else stays on the device; the host
 * sees one id per image per step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "base/thread_pool.h"
#include "runtime/engine/engine.h"

#define BUF_ALIGN 256
/* Prompt tokens one prefill chunk runs through a layer at most: GEMMs of this many rows are
 * compute-bound (the 7B qkv projection: 412 GFLOP), and the scratch (h, qkv, att, gate/up, mlp:
 * ~107 KB per token at 7B) stays ~0.44 GB however large the batch (a 218-sequence batch of
 * 50-token prompts held 1.17 GB; at 48 GB the difference is about two Diagonal images). */
#define PREFILL_TOKENS 4096

/* ---- sizing and carving (size first, allocate once) ---- */

static size_t al(size_t x) { return (x + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN; }

/* Diagonal lag-list length a (policies.md §2.2: min(N_att, N_r); sink4 keeps 4 of it for the
 * sinks) and the sink rows ahead of the ring. */
static int32_t diag_len(const flexdiag_context *c) {
    return c->max_slots - (c->kp.kind == FLEXDIAG_POLICY_DIAGONAL_SINK4 ? 4 : 0);
}

static int32_t diag_base(const flexdiag_context *c) {
    return c->kp.kind == FLEXDIAG_POLICY_DIAGONAL_SINK4 ? 4 : 0;
}

static int is_h2o(const flexdiag_context *c) { return c->kp.kind == FLEXDIAG_POLICY_H2O; }

/* Eviction lists of the device H2O / TOVA state (kernels.h evict_*): one per (layer,
 * sequence, KV head) for H2O, one per (layer, sequence) for TOVA. */
static size_t evict_lists(const flexdiag_context *c) {
    return (size_t)c->kp.n_layers * (size_t)c->n_seq * (is_h2o(c) ? (size_t)c->kp.h_kv : 1);
}

/* Assign buffer pointers inside base (when non-NULL) and return the total size. */
static size_t ctx_layout(const flexdiag_context *c, size_t act, flexdiag_ctx_bufs *b, char *base) {
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_lm_config *l = &m->lm;
    size_t d = (size_t)l->hidden, dh = (size_t)l->head_dim, hq = (size_t)l->heads;
    size_t hkv = (size_t)l->kv_heads, f = (size_t)l->ffn, S = (size_t)c->n_seq;
    size_t qkvw = (hq + 2 * hkv) * dh, pft = (size_t)c->pf_seq * (size_t)c->p_cap;
    size_t mbt = pft > (size_t)c->mb_seq ? pft : (size_t)c->mb_seq; /* prefill or decode rows */
    size_t V = (size_t)c->vocab_out, ms = (size_t)c->max_slots;
    size_t dm = m->head_dim_mid > l->hidden ? (size_t)m->head_dim_mid : d;
    size_t e8 = m->image_embed > 0 ? (size_t)m->image_embed : 1, off = 0;
#define TAKE(field, bytes)                                                                         \
    do {                                                                                           \
        if (base) b->field = (void *)(base + off);                                                 \
        off += al(bytes);                                                                          \
    } while (0)
    TAKE(kv, (size_t)l->layers * 2 * S * hkv * ((size_t)c->p_cap + (size_t)c->ring) * dh * act);
    TAKE(x, S * (size_t)c->p_cap * d * act);
    TAKE(h, mbt * d * act);
    TAKE(qkv, mbt * qkvw * act);
    TAKE(att, mbt * hq * dh * act);
    TAKE(gu, mbt * 2 * f * act);
    TAKE(mlp, mbt * f * act);
    TAKE(xl, S * d * act);
    TAKE(hm, S * dm * act);
    TAKE(emb, S * e8 * act);
    TAKE(logits, S * V * 4);
    TAKE(cfg, (size_t)c->n_img * V * 4);
    size_t L = (size_t)l->layers, lists = c->shared_slots ? 1 : L * S * hkv;
    size_t scored = c->scored && !c->device_diag ? L * S : 0;
    TAKE(pscore, scored * hq * ms * 4);
    TAKE(ids_in, S * (size_t)c->p_cap * 4);
    TAKE(lp, S * 4);
    TAKE(pos_pf, pft * 4);
    TAKE(rows_pf, pft * hkv * 4);
    TAKE(pos, S * 4);
    TAKE(last, S * 4);
    TAKE(rows, (c->shared_rows ? S * hkv : L * S * hkv) * 4);
    TAKE(slots, lists * ms * 4);
    TAKE(nslots, lists * 4);
    TAKE(ids, S * 4);
    size_t dl = c->device_diag ? L * S * hkv : 0;
    TAKE(lag, dl * (size_t)diag_len(c) * 2);
    TAKE(cnt, dl * 2);
    TAKE(dnext, c->device_diag ? 4 : 0);
    size_t el = c->device_evict ? evict_lists(c) : 0, na = (size_t)c->kp.n_att;
    TAKE(epos, el * na * 4);
    TAKE(eacc, (is_h2o(c) ? el * na : 0) * 4);
    TAKE(efree, el * 4);
    size_t al_ = c->device_alisa ? L * S : 0, aw = (size_t)(c->kp.n_att - c->kp.n_att / 2);
    TAKE(arpos, al_ * aw * na * 4);
    TAKE(arp, al_ * aw * na * 4);
    TAKE(arn, al_ * aw * 4);
    TAKE(ascore, al_ * (size_t)c->l_dec * 4);
    TAKE(akeys, al_ * (size_t)c->l_dec * 8);
#undef TAKE
    return off;
}

/* Fill the geometry fields of c from its params (no allocation). */
static flexdiag_status ctx_geometry(flexdiag_context *c) {
    const flexdiag_model_config *m = &c->m->cfg;
    c->rows_per_img = m->arch == FLEXDIAG_ARCH_JANUS ? 2 : 1;
    c->l_dec = m->arch == FLEXDIAG_ARCH_JANUS ? m->image_tokens : c->p.max_new_tokens;
    c->vocab_out = m->arch == FLEXDIAG_ARCH_JANUS ? m->image_vocab : m->lm.vocab;
    if (c->p.max_images < 1 || c->p.max_prompt_len < 1 || c->l_dec < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "max_images (%d), max_prompt_len (%d) and max_new_tokens (%d) must "
                             "be >= 1",
                             c->p.max_images, c->p.max_prompt_len, c->l_dec);
    c->n_img = c->p.max_images;
    c->n_seq = c->n_img * c->rows_per_img;
    c->mb_img = c->p.micro_batch > 0 && c->p.micro_batch < c->n_img ? c->p.micro_batch : c->n_img;
    c->mb_seq = c->mb_img * c->rows_per_img;
    c->n_mb = (c->n_img + c->mb_img - 1) / c->mb_img;
    c->p_cap = c->p.max_prompt_len;
    int32_t pf_cap = (c->pf_tokens > 0 ? c->pf_tokens : PREFILL_TOKENS) / c->p_cap;
    c->pf_seq = pf_cap < 1 ? 1 : pf_cap < c->mb_seq ? pf_cap : c->mb_seq;
    FLEXDIAG_TRY(flexdiag__kvp_resolve(&c->p.policy, c->l_dec, &c->kp));
    c->kp.n_seq = c->n_seq;
    c->kp.n_layers = m->lm.layers;
    c->kp.h_q = m->lm.heads;
    c->kp.h_kv = m->lm.kv_heads;
    c->ring = flexdiag__kvp_ring_rows(&c->kp);
    c->max_slots = flexdiag__kvp_max_slots(&c->kp);
    flexdiag_policy_kind kind = c->kp.kind;
    const flexdiag_kernels *k = c->m->rt->k;
    c->shared_plan = kind == FLEXDIAG_POLICY_DENSE || kind == FLEXDIAG_POLICY_WINDOW ||
                     kind == FLEXDIAG_POLICY_STREAMING;
    c->scored = !c->shared_plan;
    c->score_probs = flexdiag__kvp_traits(kind)->needs_probabilities;
    c->device_diag = (kind == FLEXDIAG_POLICY_DIAGONAL || kind == FLEXDIAG_POLICY_DIAGONAL_SINK4) &&
                     k->diag_slots && c->kp.h_q / c->kp.h_kv <= k->diag_max_group &&
                     !c->host_policy;
    c->device_evict = (kind == FLEXDIAG_POLICY_H2O || kind == FLEXDIAG_POLICY_TOVA) &&
                      k->evict_plan && k->evict_update && !c->host_policy;
    c->device_alisa = kind == FLEXDIAG_POLICY_ALISA && k->alisa_plan && k->alisa_update &&
                      !c->host_policy;
    c->device_policy = c->device_diag || c->device_evict || c->device_alisa;
    c->shared_rows = c->shared_plan || c->device_diag || c->device_alisa;
    c->shared_slots = c->shared_plan || c->device_evict;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__context_bytes(const flexdiag_model *m, const flexdiag_context_params *p,
                                        size_t *out) {
    flexdiag_context c;
    memset(&c, 0, sizeof c);
    c.m = (flexdiag_model *)m;
    c.p = *p;
    FLEXDIAG_TRY(ctx_geometry(&c));
    flexdiag_ctx_bufs b;
    *out = ctx_layout(&c, (size_t)m->rt->k->act_bytes, &b, NULL);
    return FLEXDIAG_OK;
}

int32_t flexdiag__context_fit(const flexdiag_model *m, const flexdiag_context_params *p,
                              uint64_t avail) {
    flexdiag_context_params q = *p;
    int32_t lo = 0, hi = 1 << 16; /* lo fits (0 = nothing), hi does not */
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        size_t bytes = 0;
        q.max_images = mid;
        if (flexdiag__context_bytes(m, &q, &bytes) == FLEXDIAG_OK && bytes <= avail) lo = mid;
        else hi = mid;
    }
    flexdiag__err_clear();
    return lo;
}

/* Host-side prefill index tables: position r % p_cap and cache row r for every KV head. */
static flexdiag_status upload_prefill_tables(flexdiag_context *c) {
    const flexdiag_kernels *k = c->m->rt->k;
    int32_t hkv = c->m->cfg.lm.kv_heads, mbt = c->pf_seq * c->p_cap;
    int32_t *pos = malloc((size_t)mbt * 4), *rows = malloc((size_t)mbt * (size_t)hkv * 4);
    flexdiag_status st = (pos && rows) ? FLEXDIAG_OK
                                       : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "context: no memory");
    for (int32_t i = 0; st == FLEXDIAG_OK && i < mbt; i++) {
        pos[i] = i % c->p_cap;
        for (int32_t h = 0; h < hkv; h++) rows[i * hkv + h] = i % c->p_cap;
    }
    if (st == FLEXDIAG_OK) st = k->copy_h2d(c->b.pos_pf, pos, (size_t)mbt * 4, c->m->rt->s);
    if (st == FLEXDIAG_OK)
        st = k->copy_h2d(c->b.rows_pf, rows, (size_t)mbt * (size_t)hkv * 4, c->m->rt->s);
    if (st == FLEXDIAG_OK) st = k->stream_sync(c->m->rt->s);
    free(pos);
    free(rows);
    return st;
}

/* Host mirrors of the step plan, policy scores, ids and positions: one block, page-locked when
 * the backend offers it so the per-step copies are asynchronous. */
static flexdiag_status host_alloc(flexdiag_context *c) {
    const flexdiag_kernels *k = c->m->rt->k;
    size_t S = (size_t)c->n_seq, hkv = (size_t)c->kp.h_kv, hq = (size_t)c->kp.h_q;
    size_t ms = (size_t)c->max_slots, L = (size_t)c->kp.n_layers;
    size_t lists = c->shared_slots ? 1 : L * S * hkv;
    size_t scored = c->scored && !c->device_policy ? L * S : 0;
    size_t n_rows = c->shared_rows ? S * hkv : L * S * hkv;
    size_t sz[7] = {n_rows, lists * ms, lists, scored * hq * ms, 1, S, S}, total = 0;
    for (int i = 0; i < 7; i++) total += al(sz[i] * 4);
    flexdiag_status st = k->host_alloc ? k->host_alloc(total, &c->host) : FLEXDIAG_OK;
    if (!k->host_alloc) c->host = malloc(total);
    if (st != FLEXDIAG_OK || !c->host)
        return st != FLEXDIAG_OK ? st : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "context: no host memory");
    c->host_bytes = total;
    char *p = c->host;
    void **dst[7] = {(void **)&c->h_rows, (void **)&c->h_slots, (void **)&c->h_nslots,
                     (void **)&c->h_pscore, (void **)&c->h_dnext, (void **)&c->h_ids,
                     (void **)&c->h_pos};
    for (int i = 0; i < 7; i++) {
        *dst[i] = p;
        p += al(sz[i] * 4);
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__context_alloc(flexdiag_context *c) {
    flexdiag_runtime *rt = c->m->rt;
    FLEXDIAG_TRY(ctx_geometry(c));
    c->block_bytes = ctx_layout(c, (size_t)rt->k->act_bytes, &c->b, NULL);
    char what[96];
    snprintf(what, sizeof what, "the KV cache and scratch of %d image(s)", c->n_img);
    FLEXDIAG_TRY(flexdiag__arena_alloc(&rt->arena, c->block_bytes, what, &c->block));
    ctx_layout(c, (size_t)rt->k->act_bytes, &c->b, c->block);
    FLEXDIAG_TRY(rt->k->memset0(c->block, c->block_bytes, rt->s));
    FLEXDIAG_TRY(host_alloc(c));
    FLEXDIAG_TRY(flexdiag__kvp_create(&c->kp, &c->kvp));
    if (!c->shared_plan && !c->device_policy) /* per-(layer, sequence) host state machines */
        FLEXDIAG_TRY(flexdiag__pool_create(rt->p.threads, &c->pol_pool));
    return upload_prefill_tables(c);
}

void flexdiag__context_free(flexdiag_context *c) {
    for (int i = 0; i < 2; i++)
        if (c->graph[i]) c->m->rt->k->graph_destroy(c->graph[i]);
    flexdiag__arena_free(&c->m->rt->arena, c->block, c->block_bytes);
    flexdiag__kvp_destroy(c->kvp);
    if (c->pol_pool) flexdiag__pool_destroy(c->pol_pool);
    const flexdiag_kernels *k = c->m->rt->k;
    if (k->host_free) k->host_free(c->host);
    else free(c->host);
}

/* ---- one run ---- */

typedef struct run_state {
    flexdiag_context *c;
    const flexdiag_block *b;
    const flexdiag_kernels *k;
    flexdiag_stream *s;
    int32_t n_seq;          /* sequences in this run */
    int32_t n_mb;           /* micro-batches in this run */
    int32_t *lp;            /* host copy of prompt lengths (n_seq) */
    size_t act;             /* act_bytes */
    double *split;          /* profiling accumulators (block's split) or NULL */
} run_state;

enum { PROF_GEMM, PROF_ATTN, PROF_REST };

/* Profiling brackets: with a split requested, sync before and after an op group. */
static double prof_begin(const run_state *r) {
    if (!r->split || r->k->stream_sync(r->s) != FLEXDIAG_OK) return 0.0;
    return flexdiag__now();
}

static flexdiag_status prof_end(const run_state *r, int cat, double t0) {
    if (!r->split) return FLEXDIAG_OK;
    FLEXDIAG_TRY(r->k->stream_sync(r->s));
    r->split[cat] += flexdiag__now() - t0;
    return FLEXDIAG_OK;
}

#define TIMED(r, cat, expr)                                                                        \
    do {                                                                                           \
        double t0_ = prof_begin(r);                                                                \
        FLEXDIAG_TRY(expr);                                                                        \
        FLEXDIAG_TRY(prof_end(r, cat, t0_));                                                       \
    } while (0)

static flexdiag_status cancelled(const run_state *r) {
    if (!atomic_load(&r->c->cancel)) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CANCELLED, "generation cancelled");
}

/* K (kv = 0) or V (kv = 1) cache of layer j starting at sequence s0. */
static void *kv_ptr(const run_state *r, int32_t j, int kv, int32_t s0) {
    const flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    size_t per_seq = (size_t)l->kv_heads * (size_t)(c->p_cap + c->ring) * (size_t)l->head_dim;
    return (char *)c->b.kv + (((size_t)j * 2 + (size_t)kv) * (size_t)c->n_seq + (size_t)s0) *
                                 per_seq * r->act;
}

/* Index of the first (layer j, sequence s0, KV head) entry in per-list arrays. */
static size_t head_index(const flexdiag_context *c, int32_t j, int32_t s0) {
    return ((size_t)j * (size_t)c->n_seq + (size_t)s0) * (size_t)c->kp.h_kv;
}

/* Index of the first slot list of (layer j, sequence s0) in the step plan arrays. */
static size_t list_index(const flexdiag_context *c, int32_t j, int32_t s0) {
    return c->shared_slots ? 0 : head_index(c, j, s0);
}

/* Attention arguments of layer j for sequences s0..s0+nb (decode: the step plan's lists); pos
 * holds the positions of the appended tokens, for the RoPE kv_append applies (the attention ops
 * ignore it). With scores the op also serves the policy: Diagonal on the device gets its
 * build-up update fused (diag_lag), on the host its logits; H2O/TOVA/ALISA get probabilities. */
static flexdiag_attn_args attn_args(const run_state *r, int32_t j, int32_t s0, int32_t nb,
                                    int scores, const int32_t *pos) {
    const flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    size_t li = list_index(c, j, s0), q0 = ((size_t)j * (size_t)c->n_seq + (size_t)s0) *
                                           (size_t)l->heads;
    flexdiag_attn_args a = {
        .n_seq = nb, .h_q = l->heads, .h_kv = l->kv_heads, .d_h = l->head_dim,
        .p_cap = c->p_cap, .ring = c->ring, .scale = 1.0f / sqrtf((float)l->head_dim),
        .lp = c->b.lp + s0, .slots = c->b.slots + li * (size_t)c->max_slots,
        .n_slots = c->b.nslots + li, .max_slots = c->max_slots,
        .shared_slots = c->shared_slots, .pos = pos, .rope_theta = l->rope_theta};
    if (!scores) return a;
    if (c->device_diag) {
        a.diag_lag = c->b.lag + li * (size_t)diag_len(c);
        a.diag_a = diag_len(c);
        a.diag_base = diag_base(c);
        a.diag_next = c->b.dnext;
    } else if (c->score_probs) {
        a.probs_out = c->b.pscore + q0 * (size_t)c->max_slots;
    } else {
        a.logits_out = c->b.pscore + q0 * (size_t)c->max_slots;
    }
    return a;
}

/* rmsnorm -> QKV GEMM for n rows starting at x (RoPE on the q and k heads is part of the
 * kv_append that follows). */
static flexdiag_status qkv_proj(const run_state *r, const flexdiag_layer_w *w, const void *x,
                                int64_t n) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    const flexdiag_ctx_bufs *b = &r->c->b;
    int64_t qkvw = (int64_t)(l->heads + 2 * l->kv_heads) * l->head_dim;
    TIMED(r, PROF_REST, r->k->rmsnorm(b->h, x, w->attn_norm, n, l->hidden, l->rms_eps, r->s));
    TIMED(r, PROF_GEMM, r->k->matmul(b->qkv, b->h, w->wqkv, NULL, n, l->hidden, qkvw, 0, r->s));
    return FLEXDIAG_OK;
}

/* x += o_proj(att); x += down(swiglu(gate_up(rmsnorm(x)))) for n rows. */
static flexdiag_status out_and_mlp(const run_state *r, const flexdiag_layer_w *w, void *x,
                                   int64_t n) {
    const flexdiag_lm_config *l = &r->c->m->cfg.lm;
    const flexdiag_ctx_bufs *b = &r->c->b;
    int64_t dq = (int64_t)l->heads * l->head_dim;
    TIMED(r, PROF_GEMM,
          r->k->matmul(x, b->att, w->wo, NULL, n, dq, l->hidden, FLEXDIAG_MM_ACCUM, r->s));
    TIMED(r, PROF_REST, r->k->rmsnorm(b->h, x, w->mlp_norm, n, l->hidden, l->rms_eps, r->s));
    TIMED(r, PROF_GEMM,
          r->k->matmul(b->gu, b->h, w->wgu, NULL, n, l->hidden, 2 * (int64_t)l->ffn, 0, r->s));
    TIMED(r, PROF_REST, r->k->swiglu(b->mlp, b->gu, n, l->ffn, r->s));
    TIMED(r, PROF_GEMM,
          r->k->matmul(x, b->mlp, w->wdown, NULL, n, l->ffn, l->hidden, FLEXDIAG_MM_ACCUM, r->s));
    return FLEXDIAG_OK;
}

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

/* Layer j of the prompts of prefill chunk ch (sequences ch·pf_seq ..). */
static flexdiag_status prefill_layer(const run_state *r, int32_t j, int32_t ch) {
    const flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    const flexdiag_layer_w *w = &c->m->w.layers[j];
    int32_t s0 = ch * c->pf_seq, nb = r->n_seq - s0 < c->pf_seq ? r->n_seq - s0 : c->pf_seq;
    int64_t ntok = (int64_t)nb * c->p_cap;
    void *x = (char *)c->b.x + (size_t)s0 * (size_t)c->p_cap * (size_t)l->hidden * r->act;
    flexdiag_attn_args a = attn_args(r, j, s0, nb, 0, c->b.pos_pf);
    FLEXDIAG_TRY(qkv_proj(r, w, x, ntok));
    FLEXDIAG_TRY(r->k->kv_append(kv_ptr(r, j, 0, s0), kv_ptr(r, j, 1, s0), c->b.qkv, c->b.rows_pf,
                                 ntok, c->p_cap, &a, r->s));
    FLEXDIAG_TRY(r->k->attn_prefill(c->b.att, c->b.qkv, kv_ptr(r, j, 0, s0), kv_ptr(r, j, 1, s0),
                                    &a, r->s));
    FLEXDIAG_TRY(out_and_mlp(r, w, x, ntok));
    return s0 == 0 ? capture_hidden(r, j, x, 0, r->lp[0]) : FLEXDIAG_OK;
}

/* Copy step t's host plan into b->plan_out (layout in engine.h). */
static void record_plan(const run_state *r, int32_t t) {
    const flexdiag_context *c = r->c;
    size_t hkv = (size_t)c->kp.h_kv, ms = (size_t)c->max_slots, rec = 1 + ms;
    for (int32_t j = 0; j < c->kp.n_layers; j++)
        for (size_t i = 0; i < (size_t)r->n_seq * hkv; i++) {
            size_t li = c->shared_slots ? 0 : list_index(c, j, 0) + i;
            int32_t *dst = r->b->plan_out +
                           (((size_t)t * (size_t)c->kp.n_layers + (size_t)j) * (size_t)r->n_seq *
                                hkv + i) * rec;
            int32_t n = c->h_nslots[li];
            dst[0] = n;
            memcpy(dst + 1, c->h_slots + li * ms, (size_t)n * 4);
            for (size_t q = 1 + (size_t)n; q < rec; q++) dst[q] = -1; /* unused tail */
        }
}

/* Device Diagonal: shared write row, lag lists planned by diag_slots for every list. */
static flexdiag_status plan_device_diag(const run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    size_t hkv = (size_t)c->kp.h_kv, ms = (size_t)c->max_slots, n_rows = (size_t)r->n_seq * hkv;
    size_t lists = (size_t)c->kp.n_layers * (size_t)c->n_seq * hkv;
    int32_t base = diag_base(c), ti = t - base, ws = ti < 0 ? t : base + ti % c->kp.n_r;
    for (size_t i = 0; i < n_rows; i++) c->h_rows[i] = c->p_cap + ws;
    if (ti >= c->kp.n_r) c->dev_evictions += (uint64_t)c->kp.n_layers * n_rows;
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.rows, c->h_rows, n_rows * 4, r->s));
    FLEXDIAG_TRY(r->k->diag_slots(c->b.slots, c->b.nslots, c->b.lag, c->b.cnt, (int64_t)lists,
                                  c->max_slots, diag_len(c), t, c->kp.n_r, base, r->s));
    if (flexdiag__kvp_needs_scores(c->kvp, t)) { /* the lag a build-up step's update writes */
        *c->h_dnext = ti + 1;
        FLEXDIAG_TRY(r->k->copy_h2d(c->b.dnext, c->h_dnext, 4, r->s));
    }
    if (!r->b->plan_out) return FLEXDIAG_OK;
    FLEXDIAG_TRY(r->k->copy_d2h(c->h_slots, c->b.slots, lists * ms * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_d2h(c->h_nslots, c->b.nslots, lists * 4, r->s));
    record_plan(r, t);
    return FLEXDIAG_OK;
}

/* Device H2O / TOVA: every list attends its occupied slots 0..n-1 (one shared list); the
 * write slot of each list (the last update's victim once all are occupied) is planned on the
 * device into b.rows. */
static flexdiag_status plan_device_evict(const run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    int32_t na = c->kp.n_att, n = t + 1 < na ? t + 1 : na, h2o = is_h2o(c);
    for (int32_t j = 0; j < n; j++) c->h_slots[j] = j;
    *c->h_nslots = n;
    if (t >= na) /* every (layer, sequence, KV head) overwrites a victim's row */
        c->dev_evictions += (uint64_t)c->kp.n_layers * (uint64_t)r->n_seq * (uint64_t)c->kp.h_kv;
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.slots, c->h_slots, (size_t)n * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.nslots, c->h_nslots, 4, r->s));
    FLEXDIAG_TRY(r->k->evict_plan(c->b.rows, c->b.epos, h2o ? c->b.eacc : NULL, c->b.efree,
                                  (int64_t)evict_lists(c), h2o ? 1 : c->kp.h_kv, na, t, c->p_cap,
                                  r->s));
    if (r->b->plan_out) record_plan(r, t);
    return FLEXDIAG_OK;
}

/* Device ALISA: every list writes row t (shared rows); alisa_plan selects each (layer,
 * sequence)'s attended positions into the slot lists of its KV heads. */
static flexdiag_status plan_device_alisa(const run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    size_t hkv = (size_t)c->kp.h_kv, ms = (size_t)c->max_slots, n_rows = (size_t)r->n_seq * hkv;
    size_t lists = (size_t)c->kp.n_layers * (size_t)c->n_seq;
    for (size_t i = 0; i < n_rows; i++) c->h_rows[i] = c->p_cap + t;
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.rows, c->h_rows, n_rows * 4, r->s));
    FLEXDIAG_TRY(r->k->alisa_plan(c->b.slots, c->b.nslots, c->b.arpos, c->b.arp, c->b.arn,
                                  c->b.ascore, c->b.akeys, (int64_t)lists, c->kp.h_kv,
                                  c->max_slots, c->kp.n_att, c->l_dec, t, r->s));
    if (!r->b->plan_out) return FLEXDIAG_OK;
    FLEXDIAG_TRY(r->k->copy_d2h(c->h_slots, c->b.slots, lists * hkv * ms * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_d2h(c->h_nslots, c->b.nslots, lists * hkv * 4, r->s));
    record_plan(r, t);
    return FLEXDIAG_OK;
}

/* Host policy work of step t, one task per layer (the state machines allow concurrent calls on
 * disjoint layers, kv_policy.h): the per-(layer, head) plans and updates of H2O, TOVA and ALISA
 * cost tens of milliseconds per step on one core at 64 sequences x 30 layers. */
typedef struct policy_job {
    const run_state *r;
    int32_t t;
} policy_job;

/* Plan step t of layer j for every micro-batch into the host plan arrays. */
static void plan_layer(void *ctx, int64_t j, void *scratch) {
    const policy_job *jb = ctx;
    const run_state *r = jb->r;
    flexdiag_context *c = r->c;
    (void)scratch;
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0 = mb * c->mb_seq, nb = r->n_seq - s0 < c->mb_seq ? r->n_seq - s0 : c->mb_seq;
        size_t li = list_index(c, (int32_t)j, s0);
        flexdiag__kvp_plan(c->kvp, (int32_t)j, jb->t, s0, nb, c->h_rows + li,
                           c->h_slots + li * (size_t)c->max_slots, c->h_nslots + li);
    }
}

/* Update layer j after step t from the read-back scores (probabilities or logits). */
static void update_layer(void *ctx, int64_t j, void *scratch) {
    const policy_job *jb = ctx;
    const run_state *r = jb->r;
    flexdiag_context *c = r->c;
    (void)scratch;
    size_t hq = (size_t)c->kp.h_q, ms = (size_t)c->max_slots;
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0 = mb * c->mb_seq, nb = r->n_seq - s0 < c->mb_seq ? r->n_seq - s0 : c->mb_seq;
        size_t q0 = ((size_t)j * (size_t)c->n_seq + (size_t)s0) * hq;
        const float *sc = c->h_pscore + q0 * ms;
        flexdiag__kvp_update(c->kvp, (int32_t)j, jb->t, s0, nb, c->score_probs ? NULL : sc, NULL,
                             c->score_probs ? sc : NULL);
    }
}

/* Plan step t for every layer and micro-batch on the host, then one upload per array. */
static flexdiag_status plan_step(const run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    if (c->device_diag) return plan_device_diag(r, t);
    if (c->device_evict) return plan_device_evict(r, t);
    if (c->device_alisa) return plan_device_alisa(r, t);
    size_t hkv = (size_t)c->kp.h_kv, ms = (size_t)c->max_slots, S = (size_t)c->n_seq;
    size_t lists = 1, n_rows = (size_t)r->n_seq * hkv;
    if (c->shared_plan) {
        int32_t ws = 0;
        flexdiag__kvp_plan_shared(c->kvp, t, r->n_seq, &ws, c->h_slots, c->h_nslots);
        for (size_t i = 0; i < n_rows; i++) c->h_rows[i] = c->p_cap + ws;
    } else {
        policy_job jb = {r, t};
        FLEXDIAG_TRY(flexdiag__pool_parallel_for(c->pol_pool, c->kp.n_layers, 0, plan_layer, &jb));
        lists = n_rows = (size_t)c->kp.n_layers * S * hkv; /* whole arrays (capacity strides) */
        for (size_t i = 0; i < n_rows; i++) c->h_rows[i] += c->p_cap; /* slot -> cache row */
    }
    if (r->b->plan_out) record_plan(r, t);
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.rows, c->h_rows, n_rows * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.slots, c->h_slots, lists * ms * 4, r->s));
    return r->k->copy_h2d(c->b.nslots, c->h_nslots, lists * 4, r->s);
}

/* After step t: update the policy from every layer's scores when it needs them: device H2O /
 * TOVA / ALISA where attention left the probabilities, host policies after reading them back.
 * (The device Diagonal policy was updated inside attention.) */
static flexdiag_status update_step(const run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    if (!c->scored || c->device_diag || !flexdiag__kvp_needs_scores(c->kvp, t))
        return FLEXDIAG_OK;
    if (c->device_evict)
        return r->k->evict_update(c->b.efree, is_h2o(c) ? c->b.eacc : NULL, c->b.epos,
                                  c->b.pscore, (int64_t)evict_lists(c),
                                  is_h2o(c) ? c->kp.h_q / c->kp.h_kv : c->kp.h_q, c->max_slots,
                                  c->kp.n_att, t, r->s);
    if (c->device_alisa)
        return r->k->alisa_update(c->b.arp, c->b.arn, c->b.pscore,
                                  (int64_t)c->kp.n_layers * c->n_seq, c->kp.h_q, c->max_slots,
                                  c->kp.n_att, t, r->s);
    size_t rows = (size_t)c->kp.n_layers * (size_t)c->n_seq * (size_t)c->kp.h_q;
    FLEXDIAG_TRY(r->k->copy_d2h(c->h_pscore, c->b.pscore, rows * (size_t)c->max_slots * 4, r->s));
    policy_job jb = {r, t};
    return flexdiag__pool_parallel_for(c->pol_pool, c->kp.n_layers, 0, update_layer, &jb);
}

static flexdiag_status decode_layer(const run_state *r, int32_t j, int32_t mb, int32_t t) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    const flexdiag_layer_w *w = &c->m->w.layers[j];
    int32_t s0 = mb * c->mb_seq, nb = r->n_seq - s0 < c->mb_seq ? r->n_seq - s0 : c->mb_seq;
    void *x = (char *)c->b.x + (size_t)s0 * (size_t)l->hidden * r->act;
    int scores = c->scored && flexdiag__kvp_needs_scores(c->kvp, t);
    flexdiag_attn_args a = attn_args(r, j, s0, nb, scores, c->b.pos + s0);
    const int32_t *rows = c->b.rows + (c->shared_rows ? (size_t)s0 * (size_t)l->kv_heads
                                                      : head_index(c, j, s0));
    FLEXDIAG_TRY(qkv_proj(r, w, x, nb));
    double t0 = prof_begin(r);
    FLEXDIAG_TRY(r->k->kv_append(kv_ptr(r, j, 0, s0), kv_ptr(r, j, 1, s0), c->b.qkv, rows, nb, 1,
                                 &a, r->s));
    FLEXDIAG_TRY(r->k->attn_decode(c->b.att, c->b.qkv, kv_ptr(r, j, 0, s0), kv_ptr(r, j, 1, s0),
                                   &a, r->s));
    if (s0 == 0 && r->b->attn_out) FLEXDIAG_TRY(capture_attn(r, j, t));
    FLEXDIAG_TRY(prof_end(r, PROF_ATTN, t0));
    FLEXDIAG_TRY(out_and_mlp(r, w, x, nb));
    return s0 == 0 ? capture_hidden(r, j, x, r->lp[0] + t, 1) : FLEXDIAG_OK;
}

/* Final norm + output head for the rows xin (nb of them) into logits rows s0.. */
static flexdiag_status head(const run_state *r, const void *xin, int32_t s0, int32_t nb) {
    const flexdiag_context *c = r->c;
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_weights *w = &c->m->w;
    float *out = c->b.logits + (size_t)s0 * (size_t)c->vocab_out;
    int32_t d = m->lm.hidden;
    TIMED(r, PROF_REST, r->k->rmsnorm(c->b.h, xin, w->final_norm, nb, d, m->lm.rms_eps, r->s));
    if (m->arch == FLEXDIAG_ARCH_LLAMA) {
        TIMED(r, PROF_GEMM, r->k->matmul(out, c->b.h, w->lm_head, NULL, nb, d, c->vocab_out,
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

/* CFG, sampling (or forced ids) and outputs for token `step` of every image. */
static flexdiag_status take_step_output(run_state *r, int32_t step) {
    flexdiag_context *c = r->c;
    const flexdiag_block *b = r->b;
    size_t V = (size_t)c->vocab_out;
    int janus = c->rows_per_img == 2;
    const float *dist = c->b.logits;
    if (janus) {
        FLEXDIAG_TRY(r->k->cfg_combine(c->b.cfg, c->b.logits, b->n_img, (int64_t)V,
                                       b->cfg_weight, r->s));
        dist = c->b.cfg;
    }
    if (b->forced) {
        for (int32_t i = 0; i < b->n_img; i++) c->h_ids[i] = b->forced[(size_t)i * b->n_steps + step];
        FLEXDIAG_TRY(r->k->copy_h2d(c->b.ids, c->h_ids, (size_t)b->n_img * 4, r->s));
    } else {
        FLEXDIAG_TRY(r->k->sample(c->b.ids, dist, b->n_img, (int64_t)V, &b->sp, b->img0, step,
                                  r->s));
        FLEXDIAG_TRY(r->k->copy_d2h(c->h_ids, c->b.ids, (size_t)b->n_img * 4, r->s));
    }
    for (int32_t i = 0; i < b->n_img; i++) {
        if (c->h_ids[i] < 0 || c->h_ids[i] >= (int32_t)V)
            return flexdiag__err(FLEXDIAG_ERR_NUMERIC,
                                 "step %d: image %d: logits are not finite (sampled id %d)", step,
                                 i, c->h_ids[i]);
        b->tokens[(size_t)i * b->n_steps + step] = c->h_ids[i];
    }
    for (int32_t i = 0; b->logits && i < b->n_img; i++)
        FLEXDIAG_TRY(r->k->copy_d2h(b->logits + ((size_t)i * b->n_steps + step) * V,
                                    dist + (size_t)i * V, V * 4, r->s));
    for (int32_t i = 0; b->raw_logits && i < r->n_seq; i++)
        FLEXDIAG_TRY(r->k->copy_d2h(b->raw_logits + ((size_t)i * b->n_steps + step) * V,
                                    c->b.logits + (size_t)i * V, V * 4, r->s));
    return FLEXDIAG_OK;
}

/* Next input embedding: token `step` of every image, fed to all its rows. */
static flexdiag_status feedback(const run_state *r) {
    const flexdiag_context *c = r->c;
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_weights *w = &c->m->w;
    int32_t n = r->n_seq, d = m->lm.hidden;
    if (m->arch == FLEXDIAG_ARCH_LLAMA)
        return r->k->embed(c->b.x, w->embed, c->b.ids, n, d, 1, r->s);
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

/* Host prompt table (n_seq, p_cap) with the Janus uncond rows, uploaded with lp and gathers. */
static flexdiag_status upload_prompts(run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_block *b = r->b;
    size_t cells = (size_t)r->n_seq * (size_t)c->p_cap;
    int32_t *ids = calloc(cells, 4), *last = malloc((size_t)r->n_seq * 4);
    if (!ids || !last) {
        free(ids);
        free(last);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompts: no host memory");
    }
    int32_t pad = c->m->cfg.pad_id >= 0 ? c->m->cfg.pad_id : 0;
    for (int32_t i = 0; i < b->n_img; i++) {
        int32_t n = b->prompt_len[i];
        for (int32_t q = 0; q < c->rows_per_img; q++) {
            int32_t s = i * c->rows_per_img + q, *row = ids + (size_t)s * (size_t)c->p_cap;
            if (q == 0) memcpy(row, b->prompt[i], (size_t)n * 4);
            else flexdiag__janus_uncond(b->prompt[i], n, pad, row);
            r->lp[s] = n;
            last[s] = s * c->p_cap + n - 1;
        }
    }
    flexdiag_status st = r->k->copy_h2d(c->b.ids_in, ids, cells * 4, r->s);
    if (st == FLEXDIAG_OK) st = r->k->copy_h2d(c->b.lp, r->lp, (size_t)r->n_seq * 4, r->s);
    if (st == FLEXDIAG_OK) st = r->k->copy_h2d(c->b.last, last, (size_t)r->n_seq * 4, r->s);
    if (st == FLEXDIAG_OK) st = r->k->stream_sync(r->s);
    free(ids);
    free(last);
    return st;
}

void flexdiag__janus_uncond(const int32_t *cond, int32_t n, int32_t pad_id, int32_t *uncond) {
    for (int32_t i = 0; i < n; i++) uncond[i] = (i == 0 || i == n - 1) ? cond[i] : pad_id;
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
    for (int64_t i = 0; b->forced && i < (int64_t)b->n_img * b->n_steps; i++)
        if (b->forced[i] < 0 || b->forced[i] >= c->vocab_out)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "forced token %lld is id %d, outside [0, %d)", (long long)i,
                                 b->forced[i], c->vocab_out);
    if ((b->hidden && (int64_t)b->n_hidden_pos * m->lm.hidden > (int64_t)c->n_seq * c->vocab_out) ||
        (b->attn_out && (int64_t)m->lm.heads * m->lm.head_dim > (int64_t)c->n_seq * c->vocab_out))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "captures do not fit the scratch buffer");
    return FLEXDIAG_OK;
}

static flexdiag_status run_prefill(run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    FLEXDIAG_TRY(upload_prompts(r));
    FLEXDIAG_TRY(r->k->embed(c->b.x, c->m->w.embed, c->b.ids_in, (int64_t)r->n_seq * c->p_cap,
                             l->hidden, 1, r->s));
    int32_t chunks = (r->n_seq + c->pf_seq - 1) / c->pf_seq;
    for (int32_t j = 0; j < l->layers; j++) {
        FLEXDIAG_TRY(cancelled(r));
        for (int32_t ch = 0; ch < chunks; ch++) FLEXDIAG_TRY(prefill_layer(r, j, ch));
    }
    FLEXDIAG_TRY(r->k->gather_rows(c->b.xl, c->b.x, c->b.last, r->n_seq, l->hidden, r->s));
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0 = mb * c->mb_seq, nb = r->n_seq - s0 < c->mb_seq ? r->n_seq - s0 : c->mb_seq;
        FLEXDIAG_TRY(head(r, (char *)c->b.xl + (size_t)s0 * (size_t)l->hidden * r->act, s0, nb));
    }
    return take_step_output(r, 0);
}

/* The device work of decode step t that reads only device buffers (ids, positions, plans):
 * feedback embedding, every layer of every micro-batch, the heads. Recordable as a graph. */
static flexdiag_status step_body(const run_state *r, int32_t t) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    FLEXDIAG_TRY(feedback(r));
    for (int32_t j = 0; j < l->layers; j++)
        for (int32_t mb = 0; mb < r->n_mb; mb++) FLEXDIAG_TRY(decode_layer(r, j, mb, t));
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0 = mb * c->mb_seq, nb = r->n_seq - s0 < c->mb_seq ? r->n_seq - s0 : c->mb_seq;
        FLEXDIAG_TRY(head(r, (char *)c->b.x + (size_t)s0 * (size_t)l->hidden * r->act, s0, nb));
    }
    return FLEXDIAG_OK;
}

/* Graphs need the backend's support and a step without host-side captures or profiling. */
static int use_graph(const run_state *r) {
    return r->k->graph_begin && !r->c->graphs_off && !r->split && !r->b->hidden &&
           !r->b->attn_out;
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
    double t0 = prof_begin(r);
    FLEXDIAG_TRY(plan_step(r, t));
    FLEXDIAG_TRY(prof_end(r, PROF_ATTN, t0));
    if (use_graph(r))
        FLEXDIAG_TRY(step_body_graph(r, t, c->scored && flexdiag__kvp_needs_scores(c->kvp, t)));
    else
        FLEXDIAG_TRY(step_body(r, t));
    FLEXDIAG_TRY(take_step_output(r, t + 1));
    t0 = prof_begin(r);
    FLEXDIAG_TRY(update_step(r, t));
    return prof_end(r, PROF_ATTN, t0);
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
    run_state r = {.c = c, .b = b, .k = c->m->rt->k, .s = c->m->rt->s,
                   .n_seq = b->n_img * c->rows_per_img, .act = (size_t)c->m->rt->k->act_bytes};
    r.n_mb = (b->n_img + c->mb_img - 1) / c->mb_img;
    r.lp = malloc((size_t)r.n_seq * 4);
    if (!r.lp) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "run: no host memory");
    flexdiag__kvp_reset(c->kvp);
    c->dev_evictions = 0;
    double t0 = flexdiag__now();
    flexdiag_status st = run_prefill(&r);
    if (st == FLEXDIAG_OK) st = r.k->stream_sync(r.s);
    double t1 = flexdiag__now();
    for (int32_t t = 0; st == FLEXDIAG_OK && t + 1 < b->n_steps; t++) {
        r.split = b->split && t >= b->split_from ? b->split : NULL; /* decode steps only */
        st = profiled_step(&r, t);
        if (st == FLEXDIAG_OK && b->progress &&
            !b->progress(1, (uint64_t)t + 2, (uint64_t)b->n_steps, b->progress_user))
            st = flexdiag__err(FLEXDIAG_ERR_CANCELLED, "cancelled by the progress callback");
    }
    if (st == FLEXDIAG_OK) st = r.k->stream_sync(r.s);
    double t2 = flexdiag__now();
    c->stats.prefill_s += t1 - t0;
    c->stats.decode_s += t2 - t1;
    c->stats.tokens_generated += (uint64_t)r.n_seq * (uint64_t)b->n_steps;
    c->stats.evictions = flexdiag__kvp_evictions(c->kvp) + c->dev_evictions;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    c->stats.kv_bytes_per_seq = (uint64_t)l->layers * 2 * (uint64_t)l->kv_heads *
                                (uint64_t)l->head_dim * r.act *
                                (uint64_t)(r.lp[0] + flexdiag__kvp_resident_rows(&c->kp, c->l_dec - 1));
    free(r.lp);
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
