/*
 * weights.c - the tensor layout of each architecture, checked against a checkpoint and loaded
 * into backend memory from safetensors or from a seeded random generator.
 *
 * One walk is the single source of truth for shapes: walk_model visits every tensor the config
 * implies, in block order, with its canonical name, shape and byte offset inside one device
 * block. Fused tensors (wqkv = [q; k; v], wgu = [gate; up]) are consecutive visits into the same
 * storage; every other tensor starts 256-byte aligned, and every layer has layer 0's layout.
 * Loading walks twice. The first walk checks and sizes, holding nothing proportional to the
 * config: each implied tensor must be in the checkpoint with the implied shape and a readable
 * dtype, and the checkpoint's tensors of the model's parts (model_parts) must add up to what the
 * config implies, so a config with fewer layers than the weights is refused too. Then the block
 * is allocated once and the second walk uploads. Random weights walk to size, then to fill.
 *
 * Checkpoint names go through flexdiag__name_canonical into a sorted index (memory proportional to
 * the checkpoint, whose header the reader already holds). Tensors on the architecture's skip list
 * are never read; any other unknown tensor gets one warning (docs/formats.md §2.6). Random
 * weights use the counter-based RNG keyed by the visit number, so they are identical on every
 * machine and thread count.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"

#define W_ALIGN 256 /* bytes; keeps every tensor 16-byte-vector and cuBLAS friendly */

typedef enum wkind { W_MATRIX, W_NORM, W_BIAS } wkind;

/* One tensor of the walk. */
typedef struct wtensor {
    const char *name; /* canonical checkpoint name */
    int64_t rows;     /* shape[0] */
    int64_t cols;     /* shape[1]; 0 for vectors */
    wkind kind;       /* initialisation for random weights */
    size_t offset;    /* bytes into the weight block */
    int64_t index;    /* visit number: the RNG stream of random weights */
} wtensor;

static int64_t wt_elems(const wtensor *t) { return t->rows * (t->cols > 0 ? t->cols : 1); }

typedef flexdiag_status (*wvisit)(void *user, const wtensor *t);

/* Offsets of layer 0's tensors; layer j's are these plus j · layer_bytes. */
typedef struct layer_off {
    size_t attn_norm, wqkv, wo, mlp_norm, wgu, wdown;
    size_t attn_norm_b, bqkv, bo, mlp_norm_b, bgu, bdown; /* with biases (OPT) */
    size_t q_norm, q_norm_b, k_norm, k_norm_b;            /* QK norms (Chameleon) */
} layer_off;

/* What a walk leaves behind: the offsets carve needs and the sizes. */
typedef struct model_off {
    size_t embed, pos_embed, final_norm, final_norm_b, lm_head, gen_embed, head_w1, head_b1,
        head_w2, head_b2;
    size_t align_w[4], align_b[4];
    layer_off layer0;
    size_t layers_start; /* offset of layer 0's block */
    size_t layer_bytes; /* one layer's block */
    size_t bytes;       /* the whole block, W_ALIGN-aligned */
    int64_t count;      /* tensors visited */
    int64_t max_elems;  /* largest tensor (staging buffer) */
} model_off;

typedef struct walker {
    wvisit visit; /* NULL: layout only */
    void *user;   /* passed to visit */
    model_off o;  /* filled as the walk goes */
    size_t cursor; /* next free byte of the block */
} walker;

/* ---- the walk ---- */

static size_t align_up(size_t x) { return (x + W_ALIGN - 1) / W_ALIGN * W_ALIGN; }

/* Visit one tensor. `fused` continues the storage of the previous visit (k and v after q, up
 * after gate); otherwise the tensor starts aligned. Its offset goes to *slot when given. */
static flexdiag_status emit(walker *w, const char *name, int64_t rows, int64_t cols, wkind kind,
                            int fused, size_t *slot) {
    if (!fused) w->cursor = align_up(w->cursor);
    wtensor t = {name, rows, cols, kind, w->cursor, w->o.count++};
    int64_t n = wt_elems(&t);
    w->cursor += (size_t)n * 2;
    if (n > w->o.max_elems) w->o.max_elems = n;
    if (slot) *slot = t.offset;
    return w->visit ? w->visit(w->user, &t) : FLEXDIAG_OK;
}

static flexdiag_status walk_layer(walker *w, const flexdiag_lm_config *l, const char *pre, int i,
                                  layer_off *o) {
    char n[160];
    int64_t d = l->hidden, dq = (int64_t)l->heads * l->head_dim;
    int64_t dkv = (int64_t)l->kv_heads * l->head_dim, f = l->ffn;
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, pre, i), n)
    FLEXDIAG_TRY(emit(w, NAME("input_layernorm.weight"), d, 0, W_NORM, 0, &o->attn_norm));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.q_proj.weight"), dq, d, W_MATRIX, 0, &o->wqkv));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.k_proj.weight"), dkv, d, W_MATRIX, 1, NULL));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.v_proj.weight"), dkv, d, W_MATRIX, 1, NULL));
    if (l->qk_rows) { /* Chameleon: per-head LayerNorm of q and k, before RoPE */
        int64_t r = l->qk_rows, dh = l->head_dim;
        FLEXDIAG_TRY(emit(w, NAME("self_attn.q_norm.weight"), r, dh, W_NORM, 0, &o->q_norm));
        FLEXDIAG_TRY(emit(w, NAME("self_attn.q_norm.bias"), r, dh, W_BIAS, 0, &o->q_norm_b));
        FLEXDIAG_TRY(emit(w, NAME("self_attn.k_norm.weight"), r, dh, W_NORM, 0, &o->k_norm));
        FLEXDIAG_TRY(emit(w, NAME("self_attn.k_norm.bias"), r, dh, W_BIAS, 0, &o->k_norm_b));
    }
    FLEXDIAG_TRY(emit(w, NAME("self_attn.o_proj.weight"), d, dq, W_MATRIX, 0, &o->wo));
    FLEXDIAG_TRY(emit(w, NAME("post_attention_layernorm.weight"), d, 0, W_NORM, 0, &o->mlp_norm));
    FLEXDIAG_TRY(emit(w, NAME("mlp.gate_proj.weight"), f, d, W_MATRIX, 0, &o->wgu));
    FLEXDIAG_TRY(emit(w, NAME("mlp.up_proj.weight"), f, d, W_MATRIX, 1, NULL));
    FLEXDIAG_TRY(emit(w, NAME("mlp.down_proj.weight"), d, f, W_MATRIX, 0, &o->wdown));
#undef NAME
    return FLEXDIAG_OK;
}

/* An OPT block (pre-LayerNorm, biases everywhere, fc1 -> ReLU -> fc2), in flexdiag_layer_w
 * order: each norm with its bias, q/k/v fused with their biases fused after them. */
static flexdiag_status walk_layer_opt(walker *w, const flexdiag_lm_config *l, const char *pre,
                                      int i, layer_off *o) {
    char n[160];
    int64_t d = l->hidden, f = l->ffn;
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, pre, i), n)
    FLEXDIAG_TRY(emit(w, NAME("self_attn_layer_norm.weight"), d, 0, W_NORM, 0, &o->attn_norm));
    FLEXDIAG_TRY(emit(w, NAME("self_attn_layer_norm.bias"), d, 0, W_BIAS, 0, &o->attn_norm_b));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.q_proj.weight"), d, d, W_MATRIX, 0, &o->wqkv));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.k_proj.weight"), d, d, W_MATRIX, 1, NULL));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.v_proj.weight"), d, d, W_MATRIX, 1, NULL));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.q_proj.bias"), d, 0, W_BIAS, 0, &o->bqkv));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.k_proj.bias"), d, 0, W_BIAS, 1, NULL));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.v_proj.bias"), d, 0, W_BIAS, 1, NULL));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.out_proj.weight"), d, d, W_MATRIX, 0, &o->wo));
    FLEXDIAG_TRY(emit(w, NAME("self_attn.out_proj.bias"), d, 0, W_BIAS, 0, &o->bo));
    FLEXDIAG_TRY(emit(w, NAME("final_layer_norm.weight"), d, 0, W_NORM, 0, &o->mlp_norm));
    FLEXDIAG_TRY(emit(w, NAME("final_layer_norm.bias"), d, 0, W_BIAS, 0, &o->mlp_norm_b));
    FLEXDIAG_TRY(emit(w, NAME("fc1.weight"), f, d, W_MATRIX, 0, &o->wgu));
    FLEXDIAG_TRY(emit(w, NAME("fc1.bias"), f, 0, W_BIAS, 0, &o->bgu));
    FLEXDIAG_TRY(emit(w, NAME("fc2.weight"), d, f, W_MATRIX, 0, &o->wdown));
    FLEXDIAG_TRY(emit(w, NAME("fc2.bias"), d, 0, W_BIAS, 0, &o->bdown));
#undef NAME
    return FLEXDIAG_OK;
}

static flexdiag_status walk_janus_heads(walker *w, const flexdiag_model_config *c) {
    model_off *o = &w->o;
    int64_t d = c->lm.hidden;
    char n[64];
    FLEXDIAG_TRY(emit(w, "gen_embed.weight", c->image_vocab, c->image_embed, W_MATRIX, 0,
                      &o->gen_embed));
    for (int i = 0; i < c->aligner_depth; i++) { /* Linear layers at Sequential index 0, 2, 4.. */
        snprintf(n, sizeof n, "gen_aligner.layers.%d.weight", 2 * i);
        FLEXDIAG_TRY(emit(w, n, c->aligner_dim, i ? c->aligner_dim : c->image_embed, W_MATRIX, 0,
                          &o->align_w[i]));
        snprintf(n, sizeof n, "gen_aligner.layers.%d.bias", 2 * i);
        FLEXDIAG_TRY(emit(w, n, c->aligner_dim, 0, W_BIAS, 0, &o->align_b[i]));
    }
    FLEXDIAG_TRY(emit(w, "gen_head.output_mlp_projector.weight", c->head_dim_mid, d, W_MATRIX, 0,
                      &o->head_w1));
    FLEXDIAG_TRY(emit(w, "gen_head.output_mlp_projector.bias", c->head_dim_mid, 0, W_BIAS, 0,
                      &o->head_b1));
    FLEXDIAG_TRY(emit(w, "gen_head.vision_head.weight", c->image_vocab, c->head_dim_mid,
                      W_MATRIX, 0, &o->head_w2));
    return emit(w, "gen_head.vision_head.bias", c->image_vocab, 0, W_BIAS, 0, &o->head_b2);
}

/* The canonical prefix of the decoder's tensors. */
static const char *decoder_prefix(flexdiag_arch arch) {
    return arch == FLEXDIAG_ARCH_JANUS ? "language_model.model."
           : arch == FLEXDIAG_ARCH_OPT ? "model.decoder."
                                       : "model.";
}

/* Every tensor config c implies, in block order; w->o holds the layout afterwards. */
static flexdiag_status walk_model(const flexdiag_model_config *c, walker *w) {
    const flexdiag_lm_config *l = &c->lm;
    const char *pre = decoder_prefix(c->arch);
    int opt = c->arch == FLEXDIAG_ARCH_OPT;
    model_off *o = &w->o;
    char n[160];
    layer_off scratch; /* offsets of layers past 0 follow from layer 0's */
    snprintf(n, sizeof n, "%sembed_tokens.weight", pre);
    FLEXDIAG_TRY(emit(w, n, l->vocab, l->hidden, W_MATRIX, 0, &o->embed));
    if (l->pos_rows) {
        snprintf(n, sizeof n, "%sembed_positions.weight", pre);
        FLEXDIAG_TRY(emit(w, n, l->pos_rows, l->hidden, W_MATRIX, 0, &o->pos_embed));
    }
    for (int i = 0; i < l->layers; i++) {
        size_t start = align_up(w->cursor);
        layer_off *lo = i == 0 ? &o->layer0 : &scratch;
        FLEXDIAG_TRY(opt ? walk_layer_opt(w, l, pre, i, lo) : walk_layer(w, l, pre, i, lo));
        if (i == 0) o->layers_start = start, o->layer_bytes = align_up(w->cursor) - start;
    }
    snprintf(n, sizeof n, opt ? "%sfinal_layer_norm.weight" : "%snorm.weight", pre);
    FLEXDIAG_TRY(emit(w, n, l->hidden, 0, W_NORM, 0, &o->final_norm));
    if (opt) {
        snprintf(n, sizeof n, "%sfinal_layer_norm.bias", pre);
        FLEXDIAG_TRY(emit(w, n, l->hidden, 0, W_BIAS, 0, &o->final_norm_b));
    }
    if (c->arch == FLEXDIAG_ARCH_JANUS) FLEXDIAG_TRY(walk_janus_heads(w, c));
    else if (l->tie_embed) o->lm_head = o->embed;
    else FLEXDIAG_TRY(emit(w, "lm_head.weight", l->vocab, l->hidden, W_MATRIX, 0, &o->lm_head));
    o->bytes = align_up(w->cursor);
    return FLEXDIAG_OK;
}

/* ---- the block ---- */

/* A tensor of a layer block at walk offset off (bytes 0: the block has no such tensor). */
static flexdiag_wspan span(size_t off, size_t b0, size_t bytes, size_t row) {
    return bytes ? (flexdiag_wspan){off - b0, bytes, row, 0} : (flexdiag_wspan){0, 0, 1, 0};
}

/* The tensors of a layer block (offsets relative to the block) for placement cuts and views;
 * tensors the block does not have get bytes 0. */
static void layer_spans(const flexdiag_lm_config *l, const model_off *o, flexdiag_wspan *lt) {
    size_t d = (size_t)l->hidden, dq = (size_t)l->heads * (size_t)l->head_dim;
    size_t dkv = (size_t)l->kv_heads * (size_t)l->head_dim, f = (size_t)l->ffn, b0 = o->layers_start;
    size_t fg = l->relu_mlp ? f : 2 * f, nb = l->bias ? 1 : 0, nn = l->layer_norm ? 1 : 0;
    size_t qkv = dq + 2 * dkv;
    const layer_off *x = &o->layer0;
    lt[FLEXDIAG_LT_ATTN_NORM] = span(x->attn_norm, b0, d * 2, d * 2);
    lt[FLEXDIAG_LT_ATTN_NORM_B] = span(x->attn_norm_b, b0, nn * d * 2, d * 2);
    lt[FLEXDIAG_LT_WQKV] = span(x->wqkv, b0, qkv * d * 2, d * 2);
    lt[FLEXDIAG_LT_BQKV] = span(x->bqkv, b0, nb * qkv * 2, qkv * 2);
    size_t qk = (size_t)l->qk_rows * (size_t)l->head_dim * 2, qr = (size_t)l->head_dim * 2;
    lt[FLEXDIAG_LT_Q_NORM] = span(x->q_norm, b0, qk, qr);
    lt[FLEXDIAG_LT_Q_NORM_B] = span(x->q_norm_b, b0, qk, qr);
    lt[FLEXDIAG_LT_K_NORM] = span(x->k_norm, b0, qk, qr);
    lt[FLEXDIAG_LT_K_NORM_B] = span(x->k_norm_b, b0, qk, qr);
    lt[FLEXDIAG_LT_WO] = span(x->wo, b0, d * dq * 2, dq * 2);
    lt[FLEXDIAG_LT_BO] = span(x->bo, b0, nb * d * 2, d * 2);
    lt[FLEXDIAG_LT_MLP_NORM] = span(x->mlp_norm, b0, d * 2, d * 2);
    lt[FLEXDIAG_LT_MLP_NORM_B] = span(x->mlp_norm_b, b0, nn * d * 2, d * 2);
    lt[FLEXDIAG_LT_WGU] = span(x->wgu, b0, fg * d * 2, d * 2);
    lt[FLEXDIAG_LT_BGU] = span(x->bgu, b0, nb * f * 2, f * 2);
    lt[FLEXDIAG_LT_WDOWN] = span(x->wdown, b0, d * f * 2, f * 2);
    lt[FLEXDIAG_LT_BDOWN] = span(x->bdown, b0, nb * d * 2, d * 2);
    /* the matrices may be packed in 4-bit groups below the device (norms and biases never) */
    lt[FLEXDIAG_LT_WQKV].pack = lt[FLEXDIAG_LT_WO].pack = 1;
    lt[FLEXDIAG_LT_WGU].pack = lt[FLEXDIAG_LT_WDOWN].pack = 1;
}

/* Bytes of the layers region of the walk's block (all layers' blocks). */
static size_t layers_region(const flexdiag_model_config *c, const model_off *o) {
    return (size_t)c->lm.layers * o->layer_bytes;
}

/* Device offset of walk offset off: with homes the layers region is not in the block. */
static size_t dev_off(const flexdiag_weights *w, const flexdiag_model_config *c,
                      const model_off *o, size_t off) {
    return w->homes && off >= o->layers_start ? off - layers_region(c, o) : off;
}

static void carve(const flexdiag_model_config *c, const model_off *o, flexdiag_weights *w) {
    char *b = w->block;
#define P(off) ((uint16_t *)(b + dev_off(w, c, o, off)))
    w->embed = P(o->embed);
    w->pos_embed = c->lm.pos_rows ? P(o->pos_embed) : NULL;
    w->final_norm = P(o->final_norm);
    w->final_norm_b = c->lm.layer_norm ? P(o->final_norm_b) : NULL;
    w->layer_bytes = o->layer_bytes;
    layer_spans(&c->lm, o, w->lt);
    w->layer0 = w->homes ? NULL : b + o->layers_start;
    if (c->arch != FLEXDIAG_ARCH_JANUS) {
        w->lm_head = P(o->lm_head);
        return;
    }
    w->gen_embed = P(o->gen_embed);
    for (int i = 0; i < c->aligner_depth; i++) {
        w->align_w[i] = P(o->align_w[i]);
        w->align_b[i] = P(o->align_b[i]);
    }
    w->head_w1 = P(o->head_w1);
    w->head_b1 = P(o->head_b1);
    w->head_w2 = P(o->head_w2);
    w->head_b2 = P(o->head_b2);
#undef P
}

static int all_device(const flexdiag_weights_place *pl) {
    return pl->pct[0] == 100 || pl->pct[0] + pl->pct[1] + pl->pct[2] == 0;
}

static flexdiag_status cut_of(const flexdiag_model_config *c, const model_off *o,
                              const uint32_t pct[3], int compress, flexdiag_wcut *cut) {
    flexdiag_wspan lt[FLEXDIAG_LT_COUNT];
    layer_spans(&c->lm, o, lt);
    static const uint32_t all[3] = {100, 0, 0};
    return flexdiag__wcut_make(lt, FLEXDIAG_LT_COUNT, o->layer_bytes,
                               pct[0] + pct[1] + pct[2] ? pct : all, compress, cut);
}

flexdiag_status flexdiag__weights_plan(const flexdiag_model_config *cfg, const uint32_t pct[3],
                                       int compress, uint64_t bytes[3], flexdiag_wcut *cut) {
    walker layout = {0};
    FLEXDIAG_TRY(walk_model(cfg, &layout));
    flexdiag_wcut c;
    FLEXDIAG_TRY(cut_of(cfg, &layout.o, pct, compress, &c));
    uint64_t L = (uint64_t)cfg->lm.layers;
    if (bytes) {
        bytes[0] = layout.o.bytes - L * (c.layer_bytes - c.cut[0]);
        bytes[1] = L * flexdiag__wcut_bytes(&c, FLEXDIAG_TIER_CPU);
        bytes[2] = flexdiag__wcut_bytes(&c, FLEXDIAG_TIER_DISK) ? L * flexdiag__wcut_disk_stride(&c)
                                                                 : 0;
    }
    if (cut) *cut = c;
    return FLEXDIAG_OK;
}

/* Allocate the device block of layout o (and the homes of a split placement) and carve the
 * weight pointers from it. */
static flexdiag_status allocate(flexdiag_arena *a, const flexdiag_model_config *c,
                                const model_off *o, const flexdiag_weights_place *pl,
                                flexdiag_weights *w) {
    memset(w, 0, sizeof *w);
    size_t bytes = o->bytes;
    if (!all_device(pl)) {
        flexdiag_wcut cut;
        FLEXDIAG_TRY(cut_of(c, o, pl->pct, pl->compress, &cut));
        FLEXDIAG_TRY(flexdiag__whomes_create(&cut, c->lm.layers, a, pl->pool, pl->store, pl->threads,
                                             &w->homes));
        bytes -= layers_region(c, o);
    }
    FLEXDIAG_TRY(flexdiag__arena_alloc(a, bytes, "model weights", &w->block));
    w->bytes = bytes;
    carve(c, o, w);
    return FLEXDIAG_OK;
}

void flexdiag__weights_free(flexdiag_arena *a, flexdiag_weights *w) {
    if (!w) return;
    flexdiag__arena_free(a, w->block, w->bytes);
    flexdiag__whomes_destroy(w->homes);
    memset(w, 0, sizeof *w);
}

/* Where walk offsets go: the device block, or for layer bytes under a split placement, the
 * layer's homes. */
typedef struct wsink {
    const flexdiag_kernels *k;      /* backend of the block */
    flexdiag_stream *s;             /* its stream */
    const flexdiag_model_config *c; /* the walk's config */
    const model_off *o;             /* the walk's layout */
    flexdiag_weights *w;            /* destination */
} wsink;

/* Store bytes of host memory src at walk offset off (done when it returns). */
static flexdiag_status sink_put(const wsink *k, size_t off, const void *src, size_t bytes) {
    const model_off *o = k->o;
    if (k->w->homes && off >= o->layers_start && off < o->layers_start + layers_region(k->c, o)) {
        size_t r = off - o->layers_start; /* a tensor never crosses a layer */
        return flexdiag__whomes_put(k->w->homes, (int32_t)(r / o->layer_bytes),
                                    r % o->layer_bytes, src, bytes, k->s);
    }
    FLEXDIAG_TRY(k->k->copy_h2d((char *)k->w->block + dev_off(k->w, k->c, o, off), src, bytes,
                                k->s));
    return k->k->stream_sync(k->s); /* src is reused for the next piece */
}

/* After the last put: the disk parts written, the loading stage dropped. */
static flexdiag_status sink_finish(const wsink *k) {
    return k->w->homes ? flexdiag__whomes_finish(k->w->homes) : FLEXDIAG_OK;
}

/* ---- random weights ---- */

#define CHUNK_ELEMS (1 << 24) /* 32 MiB of bf16 per upload */
#define FILL_THREADS 16       /* host threads drawing one chunk */

typedef struct fill_job {
    const wtensor *t; /* tensor */
    uint64_t seed;    /* model seed */
    int64_t base;     /* first element of the chunk */
    int64_t lo, hi;   /* this thread's range inside the chunk */
    uint16_t *buf;    /* chunk buffer */
} fill_job;

static void *fill_part(void *arg) {
    const fill_job *j = arg;
    for (int64_t i = j->lo; i < j->hi; i++) {
        float v = 0.0f;
        if (j->t->kind == W_NORM) {
            v = 1.0f;
        } else if (j->t->kind == W_MATRIX) { /* Irwin-Hall(4) ~ N(0, 1/3): cheap, bounded */
            uint64_t r = flexdiag__rng64(j->seed, (uint64_t)j->t->index, (uint64_t)(j->base + i));
            float u = (float)((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) +
                              (r >> 48)) / 65536.0f - 2.0f;
            v = u * 0.02f * 1.7320508f;
        }
        j->buf[i] = flexdiag__f32_to_bf16(v);
    }
    return NULL;
}

/* Draw elements [base, base + m) of t into buf; the values depend only on (seed, t->index,
 * element), so the split over threads never changes them. */
static void fill_chunk(const wtensor *t, uint64_t seed, int64_t base, int64_t m, uint16_t *buf) {
    pthread_t th[FILL_THREADS];
    fill_job jobs[FILL_THREADS];
    int nt = m >= (1 << 20) ? FILL_THREADS : 1, started = 0;
    for (int i = 0; i < nt; i++) {
        jobs[i] = (fill_job){t, seed, base, m * i / nt, m * (i + 1) / nt, buf};
        if (i > 0 && pthread_create(&th[i], NULL, fill_part, &jobs[i]) == 0) started |= 1 << i;
        else if (i > 0) fill_part(&jobs[i]);
    }
    fill_part(&jobs[0]);
    for (int i = 1; i < nt; i++)
        if (started & (1 << i)) pthread_join(th[i], NULL);
}

typedef struct fill_ctx {
    wsink sink;     /* destination */
    uint64_t seed;  /* model seed */
    uint16_t *buf;  /* CHUNK_ELEMS staging elements */
} fill_ctx;

static flexdiag_status fill_tensor(void *user, const wtensor *t) {
    const fill_ctx *f = user;
    int64_t n = wt_elems(t);
    for (int64_t base = 0; base < n; base += CHUNK_ELEMS) {
        int64_t m = n - base < CHUNK_ELEMS ? n - base : CHUNK_ELEMS;
        fill_chunk(t, f->seed, base, m, f->buf);
        FLEXDIAG_TRY(sink_put(&f->sink, t->offset + (size_t)base * 2, f->buf, (size_t)m * 2));
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__weights_random(flexdiag_arena *a, flexdiag_stream *s,
                                         const flexdiag_model_config *cfg, uint64_t seed,
                                         const flexdiag_weights_place *pl, flexdiag_weights *w) {
    memset(w, 0, sizeof *w);
    FLEXDIAG_TRY(flexdiag__config_check_backend(cfg, a->k));
    walker layout = {0};
    FLEXDIAG_TRY(walk_model(cfg, &layout));
    flexdiag_status st = allocate(a, cfg, &layout.o, pl, w);
    fill_ctx f = {{a->k, s, cfg, &layout.o, w}, seed, malloc((size_t)CHUNK_ELEMS * 2)};
    if (st == FLEXDIAG_OK && !f.buf) st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weights: no memory");
    walker fill = {.visit = fill_tensor, .user = &f};
    if (st == FLEXDIAG_OK) st = walk_model(cfg, &fill);
    if (st == FLEXDIAG_OK) st = sink_finish(&f.sink);
    free(f.buf);
    if (st != FLEXDIAG_OK) flexdiag__weights_free(a, w);
    return st;
}

/* ---- the checkpoint index ---- */

/* One checkpoint tensor under its canonical name. */
typedef struct ck_entry {
    const char *canon;             /* canonical name (after the entries, same allocation) */
    const flexdiag_st_tensor *t;   /* the tensor as stored */
    int used;                      /* implied by the config (set by the check walk) */
} ck_entry;

typedef struct ckpt_index {
    ck_entry *e;   /* sorted by canon; one allocation with the names */
    int64_t n;     /* entries */
} ckpt_index;

static int cmp_entry(const void *a, const void *b) {
    const ck_entry *x = a, *y = b;
    int r = strcmp(x->canon, y->canon);
    return r ? r : strcmp(x->t->name, y->t->name);
}

/* Canonical names of every tensor of st, sorted (names too long to be canonical are left out:
 * no table name is that long). Sized first, then one allocation. */
static flexdiag_status index_build(flexdiag_arch arch, const flexdiag_safetensors *st,
                                   ckpt_index *ix) {
    char canon[512];
    int64_t n = 0, count = flexdiag__st_count(st);
    size_t chars = 0;
    for (int64_t i = 0; i < count; i++)
        if (flexdiag__name_canonical(arch, flexdiag__st_at(st, i)->name, canon, sizeof canon) >= 0)
            n++, chars += strlen(canon) + 1;
    ix->n = n;
    ix->e = malloc((size_t)n * sizeof *ix->e + chars + 1);
    if (!ix->e) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weights: no memory for the index");
    char *p = (char *)(ix->e + n);
    for (int64_t i = 0, j = 0; i < count; i++) {
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        if (flexdiag__name_canonical(arch, t->name, canon, sizeof canon) < 0) continue;
        size_t len = strlen(canon) + 1;
        ix->e[j++] = (ck_entry){memcpy(p, canon, len), t, 0};
        p += len;
    }
    if (n > 1) qsort(ix->e, (size_t)n, sizeof *ix->e, cmp_entry);
    return FLEXDIAG_OK;
}

/* First entry named canon, or NULL. */
static ck_entry *index_find(const ckpt_index *ix, const char *canon) {
    int64_t lo = 0, hi = ix->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (strcmp(ix->e[mid].canon, canon) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < ix->n && !strcmp(ix->e[lo].canon, canon) ? &ix->e[lo] : NULL;
}

/* Tensors an architecture does not need (docs/formats.md §2.6); never read. */
static int skipped(flexdiag_arch arch, const char *canon) {
    static const char *janus[] = {"language_model.lm_head.", "vision_model.", "aligner.",
                                  "gen_vision_model."};
    if (strstr(canon, "rotary_emb.inv_freq")) return 1;
    if (arch == FLEXDIAG_ARCH_OPT) return !strncmp(canon, "lm_head.", 8); /* tied: a stored copy */
    if (arch != FLEXDIAG_ARCH_JANUS) return 0;
    for (size_t i = 0; i < sizeof janus / sizeof janus[0]; i++)
        if (!strncmp(canon, janus[i], strlen(janus[i]))) return 1;
    return 0;
}

/* The parts of the model the config describes: a tensor under these prefixes that the config
 * does not imply means config and weights disagree. (A Llama lm_head.weight is implied when
 * untied; with tied embeddings a stored copy is merely unknown.) */
static int model_part(flexdiag_arch arch, const char *canon) {
    static const char *janus[] = {"language_model.model.", "gen_embed.", "gen_aligner.",
                                  "gen_head."};
    if (arch == FLEXDIAG_ARCH_OPT) return !strncmp(canon, "model.decoder.", 14);
    if (arch != FLEXDIAG_ARCH_JANUS) return !strncmp(canon, "model.", 6);
    for (size_t i = 0; i < sizeof janus / sizeof janus[0]; i++)
        if (!strncmp(canon, janus[i], strlen(janus[i]))) return 1;
    return 0;
}

/* ---- the check walk ---- */

typedef struct check_ctx {
    const flexdiag_safetensors *st;  /* checkpoint */
    const flexdiag_model_config *c;  /* config */
    ckpt_index *ix;                  /* its index; entries get `used` */
    int64_t implied;                 /* elements of the tensors visited */
} check_ctx;

static void shape_str(char *out, size_t n, int32_t ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(out, n, "[");
    for (int32_t i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(out + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < n) snprintf(out + len, n - len, "]");
}

static void wt_shape_str(char *out, size_t n, const wtensor *t) {
    const int64_t shape[2] = {t->rows, t->cols};
    shape_str(out, n, t->cols > 0 ? 2 : 1, shape);
}

static flexdiag_status check_found(const check_ctx *k, const ck_entry *e, const wtensor *t) {
    const flexdiag_st_tensor *x = e->t;
    const char *file = flexdiag__st_file_path(k->st, x->file);
    if (e + 1 < k->ix->e + k->ix->n && !strcmp(e[1].canon, e->canon))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s' is stored twice, as '%s' and '%s' (%s): keep one "
                             "naming scheme",
                             file, t->name, x->name, e[1].t->name,
                             flexdiag__st_file_path(k->st, e[1].t->file));
    int ndim = t->cols > 0 ? 2 : 1;
    if (x->ndim != ndim || x->shape[0] != t->rows || (ndim == 2 && x->shape[1] != t->cols)) {
        char found[96], want[64];
        shape_str(found, sizeof found, x->ndim, x->shape);
        wt_shape_str(want, sizeof want, t);
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s' has shape %s, but %s implies %s", file, x->name,
                             found, k->c->source, want);
    }
    if (x->dtype != FLEXDIAG_DTYPE_BF16 && x->dtype != FLEXDIAG_DTYPE_F16 &&
        x->dtype != FLEXDIAG_DTYPE_F32)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: tensor '%s' is stored as %s; weights must be BF16, F16 or F32",
                             file, x->name, flexdiag__dtype_name(x->dtype));
    return FLEXDIAG_OK;
}

static flexdiag_status check_tensor(void *user, const wtensor *t) {
    check_ctx *k = user;
    ck_entry *e = index_find(k->ix, t->name);
    if (!e) {
        char want[64];
        wt_shape_str(want, sizeof want, t);
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s' of shape %s, implied by %s, is missing (checked "
                             "original and transformers names)",
                             flexdiag__st_file_path(k->st, 0), t->name, want, k->c->source);
    }
    FLEXDIAG_TRY(check_found(k, e, t));
    e->used = 1;
    k->implied += wt_elems(t);
    return FLEXDIAG_OK;
}

/* After the walk: the model's parts in the checkpoint must hold exactly the implied tensors;
 * anything else not skipped gets one warning. */
static flexdiag_status check_rest(const check_ctx *k) {
    const flexdiag_model_config *c = k->c;
    const ck_entry *extra = NULL;
    int64_t found = 0, n_unknown = 0;
    char unknown[512] = "";
    for (int64_t i = 0; i < k->ix->n; i++) {
        const ck_entry *e = &k->ix->e[i];
        if (e->used) {
            found += e->t->numel;
        } else if (skipped(c->arch, e->canon)) {
            continue;
        } else if (model_part(c->arch, e->canon)) {
            found += e->t->numel;
            if (!extra) extra = e;
        } else if (n_unknown++ < 10) {
            size_t len = strlen(unknown);
            snprintf(unknown + len, sizeof unknown - len, "%s%s", len ? ", " : "", e->t->name);
        }
    }
    if (extra) {
        char shape[96];
        shape_str(shape, sizeof shape, extra->t->ndim, extra->t->shape);
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s' of shape %s is not implied by %s: the model's "
                             "tensors in the checkpoint hold %lld elements, the config implies "
                             "%lld (does %snum_hidden_layers = %d or another size disagree "
                             "with the weights?)",
                             flexdiag__st_file_path(k->st, extra->t->file),
                             FLEXDIAG_ST_NAME_MSG, extra->t->name, shape, c->source,
                             (long long)found, (long long)k->implied, c->lm_keys ? c->lm_keys : "",
                             c->lm.layers);
    }
    if (n_unknown)
        FLEXDIAG_WARN("ignoring %lld tensor(s) this architecture does not use: %s%s",
                      (long long)n_unknown, unknown, n_unknown > 10 ? ", ..." : "");
    return FLEXDIAG_OK;
}

/* The first walk: checks everything and leaves the layout in *o; allocates nothing. */
static flexdiag_status check_all(const flexdiag_safetensors *st, const flexdiag_model_config *c,
                                 ckpt_index *ix, model_off *o) {
    check_ctx k = {st, c, ix, 0};
    walker w = {.visit = check_tensor, .user = &k};
    FLEXDIAG_TRY(walk_model(c, &w));
    FLEXDIAG_TRY(check_rest(&k));
    *o = w.o;
    return FLEXDIAG_OK;
}

/* ---- loading from safetensors ---- */

typedef struct upload_ctx {
    wsink sink;                     /* destination */
    const flexdiag_safetensors *st; /* checkpoint */
    const ckpt_index *ix;           /* its index (every visited tensor is in it: checked) */
    uint16_t *buf;                  /* staging for the largest tensor */
} upload_ctx;

static flexdiag_status upload_tensor(void *user, const wtensor *t) {
    const upload_ctx *u = user;
    const ck_entry *e = index_find(u->ix, t->name);
    FLEXDIAG_ASSERT(e != NULL);
    FLEXDIAG_TRY(flexdiag__st_read_bf16(u->st, e->t, u->buf));
    return sink_put(&u->sink, t->offset, u->buf, (size_t)e->t->numel * 2);
}

static flexdiag_status upload_all(const flexdiag_kernels *k, flexdiag_stream *s,
                                  const flexdiag_safetensors *st, const flexdiag_model_config *c,
                                  const ckpt_index *ix, const model_off *o, flexdiag_weights *dst) {
    upload_ctx u = {{k, s, c, o, dst}, st, ix, malloc((size_t)o->max_elems * 2)};
    if (!u.buf) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weights: no host memory for staging");
    walker w = {.visit = upload_tensor, .user = &u};
    flexdiag_status r = walk_model(c, &w);
    if (r == FLEXDIAG_OK) r = sink_finish(&u.sink);
    free(u.buf);
    return r;
}

flexdiag_status flexdiag__weights_adapt(flexdiag_model_config *cfg,
                                        const flexdiag_safetensors *st) {
    if (!cfg->lm.qk_rows) return FLEXDIAG_OK;
    const flexdiag_st_tensor *t = flexdiag__st_find(st, "model.layers.0.self_attn.q_norm.weight");
    if (!t || t->ndim != 2) return FLEXDIAG_OK; /* the check walk names what is missing */
    if (t->shape[0] == 1 || t->shape[0] == cfg->lm.heads) cfg->lm.qk_rows = (int32_t)t->shape[0];
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__weights_load(flexdiag_arena *a, flexdiag_stream *s,
                                       const flexdiag_model_config *cfg,
                                       const flexdiag_safetensors *st,
                                       const flexdiag_weights_place *pl, flexdiag_weights *w) {
    memset(w, 0, sizeof *w);
    FLEXDIAG_TRY(flexdiag__config_check_backend(cfg, a->k));
    ckpt_index ix = {0};
    model_off o;
    flexdiag_status r = index_build(cfg->arch, st, &ix);
    if (r == FLEXDIAG_OK) r = check_all(st, cfg, &ix, &o); /* all checks before allocating */
    if (r == FLEXDIAG_OK) r = allocate(a, cfg, &o, pl, w);
    if (r == FLEXDIAG_OK) r = upload_all(a->k, s, st, cfg, &ix, &o, w);
    free(ix.e);
    if (r != FLEXDIAG_OK) flexdiag__weights_free(a, w);
    return r;
}
