/*
 * weights.c - the tensor table of each architecture, and loading it into backend memory from
 * safetensors or from a seeded random generator.
 *
 * Size first, allocate once: the table is built from the config alone (canonical name, shape,
 * destination offset inside one device block), the block is allocated, then every entry is
 * filled. Fused tensors (wqkv = [q; k; v], wgu = [gate; up]) are several entries pointing into
 * the same destination at different row offsets. Loading matches checkpoint names through
 * flexdiag__name_canonical, checks presence and shape of every entry before reading a byte,
 * ignores the architecture's skip list and warns once about any other unknown tensor
 * (docs/formats.md §2.6). Random weights use the counter-based RNG so they are identical on every
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

typedef enum wkind { W_MATRIX, W_NORM, W_BIAS } wkind;

typedef struct wentry {
    char name[160];   /* canonical checkpoint name */
    int32_t ndim;     /* 1 or 2 */
    int64_t rows;     /* shape[0] */
    int64_t cols;     /* shape[1] (1 for vectors) */
    size_t offset;    /* byte offset of this entry inside the weight block */
    wkind kind;       /* initialisation for random weights */
    int found;        /* loader: matched in the checkpoint */
} wentry;

typedef struct wtable {
    wentry *e;        /* entries */
    int n, cap;       /* count, capacity */
    size_t bytes;     /* block size so far */
} wtable;

#define W_ALIGN 256 /* bytes; keeps every tensor 16-byte-vector and cuBLAS friendly */

/* Append an entry whose data starts at *cursor (fused tensors pass the same cursor). */
static flexdiag_status wt_add(wtable *t, const char *name, int64_t rows, int64_t cols, wkind kind,
                              size_t offset) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        wentry *e = realloc(t->e, (size_t)cap * sizeof *e);
        if (!e) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weight table: out of memory");
        t->e = e;
        t->cap = cap;
    }
    wentry *w = &t->e[t->n++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->ndim = cols > 0 ? 2 : 1;
    w->rows = rows;
    w->cols = cols > 0 ? cols : 1;
    w->kind = kind;
    w->offset = offset;
    return FLEXDIAG_OK;
}

/* Reserve bytes for a tensor of rows x cols and return its offset. */
static size_t wt_reserve(wtable *t, int64_t rows, int64_t cols) {
    size_t off = t->bytes;
    size_t b = (size_t)rows * (size_t)(cols > 0 ? cols : 1) * 2;
    t->bytes += (b + W_ALIGN - 1) / W_ALIGN * W_ALIGN;
    return off;
}

/* One tensor with its own storage. */
static flexdiag_status wt_single(wtable *t, const char *name, int64_t rows, int64_t cols,
                                 wkind kind, size_t *off) {
    *off = wt_reserve(t, rows, cols);
    return wt_add(t, name, rows, cols, kind, *off);
}

/* ---- the tables ---- */

/* Per-layer offsets recorded while building, to carve pointers afterwards. */
typedef struct layer_off {
    size_t attn_norm, wqkv, wo, mlp_norm, wgu, wdown;
} layer_off;

typedef struct model_off {
    size_t embed, final_norm, lm_head, gen_embed, head_w1, head_b1, head_w2, head_b2;
    size_t align_w[4], align_b[4];
    layer_off *layers;
    size_t layer_bytes; /* one layer's block; every layer has the same layout */
} model_off;

static flexdiag_status build_layer(wtable *t, const flexdiag_lm_config *l, const char *pre, int i,
                                   layer_off *o) {
    char n[160];
    int64_t d = l->hidden, dq = (int64_t)l->heads * l->head_dim;
    int64_t dkv = (int64_t)l->kv_heads * l->head_dim, f = l->ffn;
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, pre, i), n)
    FLEXDIAG_TRY(wt_single(t, NAME("input_layernorm.weight"), d, 0, W_NORM, &o->attn_norm));
    o->wqkv = wt_reserve(t, dq + 2 * dkv, d);
    FLEXDIAG_TRY(wt_add(t, NAME("self_attn.q_proj.weight"), dq, d, W_MATRIX, o->wqkv));
    FLEXDIAG_TRY(wt_add(t, NAME("self_attn.k_proj.weight"), dkv, d, W_MATRIX,
                        o->wqkv + (size_t)(dq * d * 2)));
    FLEXDIAG_TRY(wt_add(t, NAME("self_attn.v_proj.weight"), dkv, d, W_MATRIX,
                        o->wqkv + (size_t)((dq + dkv) * d * 2)));
    FLEXDIAG_TRY(wt_single(t, NAME("self_attn.o_proj.weight"), d, dq, W_MATRIX, &o->wo));
    FLEXDIAG_TRY(wt_single(t, NAME("post_attention_layernorm.weight"), d, 0, W_NORM, &o->mlp_norm));
    o->wgu = wt_reserve(t, 2 * f, d);
    FLEXDIAG_TRY(wt_add(t, NAME("mlp.gate_proj.weight"), f, d, W_MATRIX, o->wgu));
    FLEXDIAG_TRY(wt_add(t, NAME("mlp.up_proj.weight"), f, d, W_MATRIX, o->wgu + (size_t)(f * d * 2)));
    FLEXDIAG_TRY(wt_single(t, NAME("mlp.down_proj.weight"), d, f, W_MATRIX, &o->wdown));
#undef NAME
    return FLEXDIAG_OK;
}

static flexdiag_status build_janus_heads(wtable *t, const flexdiag_model_config *c, model_off *o) {
    int64_t d = c->lm.hidden;
    char n[64];
    FLEXDIAG_TRY(wt_single(t, "gen_embed.weight", c->image_vocab, c->image_embed, W_MATRIX,
                           &o->gen_embed));
    for (int i = 0; i < c->aligner_depth; i++) { /* Linear layers at Sequential index 0, 2, 4.. */
        snprintf(n, sizeof n, "gen_aligner.layers.%d.weight", 2 * i);
        FLEXDIAG_TRY(wt_single(t, n, c->aligner_dim, i ? c->aligner_dim : c->image_embed, W_MATRIX,
                               &o->align_w[i]));
        snprintf(n, sizeof n, "gen_aligner.layers.%d.bias", 2 * i);
        FLEXDIAG_TRY(wt_single(t, n, c->aligner_dim, 0, W_BIAS, &o->align_b[i]));
    }
    FLEXDIAG_TRY(wt_single(t, "gen_head.output_mlp_projector.weight", c->head_dim_mid, d, W_MATRIX,
                           &o->head_w1));
    FLEXDIAG_TRY(wt_single(t, "gen_head.output_mlp_projector.bias", c->head_dim_mid, 0, W_BIAS,
                           &o->head_b1));
    FLEXDIAG_TRY(wt_single(t, "gen_head.vision_head.weight", c->image_vocab, c->head_dim_mid,
                           W_MATRIX, &o->head_w2));
    FLEXDIAG_TRY(wt_single(t, "gen_head.vision_head.bias", c->image_vocab, 0, W_BIAS,
                           &o->head_b2));
    return FLEXDIAG_OK;
}

static flexdiag_status build_table(const flexdiag_model_config *c, wtable *t, model_off *o) {
    const flexdiag_lm_config *l = &c->lm;
    const char *pre = c->arch == FLEXDIAG_ARCH_JANUS ? "language_model.model." : "model.";
    char n[160];
    memset(o, 0, sizeof *o);
    o->layers = calloc((size_t)l->layers, sizeof *o->layers);
    if (!o->layers) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weight table: out of memory");
    snprintf(n, sizeof n, "%sembed_tokens.weight", pre);
    FLEXDIAG_TRY(wt_single(t, n, l->vocab, l->hidden, W_MATRIX, &o->embed));
    for (int i = 0; i < l->layers; i++) {
        size_t before = t->bytes;
        FLEXDIAG_TRY(build_layer(t, l, pre, i, &o->layers[i]));
        o->layer_bytes = t->bytes - before;
    }
    snprintf(n, sizeof n, "%snorm.weight", pre);
    FLEXDIAG_TRY(wt_single(t, n, l->hidden, 0, W_NORM, &o->final_norm));
    if (c->arch == FLEXDIAG_ARCH_JANUS) return build_janus_heads(t, c, o);
    if (l->tie_embed) {
        o->lm_head = o->embed;
        return FLEXDIAG_OK;
    }
    return wt_single(t, "lm_head.weight", l->vocab, l->hidden, W_MATRIX, &o->lm_head);
}

static void carve(const flexdiag_model_config *c, const model_off *o, flexdiag_weights *w) {
    char *b = w->block;
#define P(off) ((uint16_t *)(b + (off)))
    w->embed = P(o->embed);
    w->final_norm = P(o->final_norm);
    w->layer_bytes = o->layer_bytes;
    for (int i = 0; i < c->lm.layers; i++) {
        const layer_off *lo = &o->layers[i];
        w->layers[i] = (flexdiag_layer_w){P(lo->attn_norm), P(lo->wqkv), P(lo->wo),
                                          P(lo->mlp_norm), P(lo->wgu), P(lo->wdown)};
    }
    if (c->arch == FLEXDIAG_ARCH_LLAMA) {
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

/* Allocate the device block of a built table t and carve the weight pointers from it. */
static flexdiag_status allocate(flexdiag_arena *a, const flexdiag_model_config *c,
                                const wtable *t, const model_off *o, flexdiag_weights *w) {
    memset(w, 0, sizeof *w);
    w->layers = calloc((size_t)c->lm.layers, sizeof *w->layers);
    if (!w->layers) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weights: out of memory");
    FLEXDIAG_TRY(flexdiag__arena_alloc(a, t->bytes, "model weights", &w->block));
    w->bytes = t->bytes;
    carve(c, o, w);
    return FLEXDIAG_OK;
}

void flexdiag__weights_free(flexdiag_arena *a, flexdiag_weights *w) {
    if (!w) return;
    flexdiag__arena_free(a, w->block, w->bytes);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* ---- random weights ---- */

#define CHUNK_ELEMS (1 << 24) /* 32 MiB of bf16 per upload */
#define FILL_THREADS 16       /* host threads drawing one chunk */

typedef struct fill_job {
    const wentry *e;  /* tensor */
    uint64_t seed;    /* model seed */
    uint64_t id;      /* tensor index (RNG stream) */
    int64_t base;     /* first element of the chunk */
    int64_t lo, hi;   /* this thread's range inside the chunk */
    uint16_t *buf;    /* chunk buffer */
} fill_job;

static void *fill_part(void *arg) {
    const fill_job *j = arg;
    for (int64_t i = j->lo; i < j->hi; i++) {
        float v = 0.0f;
        if (j->e->kind == W_NORM) {
            v = 1.0f;
        } else if (j->e->kind == W_MATRIX) { /* Irwin-Hall(4) ~ N(0, 1/3): cheap, bounded */
            uint64_t r = flexdiag__rng64(j->seed, j->id, (uint64_t)(j->base + i));
            float u = (float)((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) +
                              (r >> 48)) / 65536.0f - 2.0f;
            v = u * 0.02f * 1.7320508f;
        }
        j->buf[i] = flexdiag__f32_to_bf16(v);
    }
    return NULL;
}

/* Draw elements [base, base + m) of e into buf; the values depend only on (seed, id, index), so
 * the split over threads never changes them. */
static void fill_chunk(const wentry *e, uint64_t seed, uint64_t id, int64_t base, int64_t m,
                       uint16_t *buf) {
    pthread_t th[FILL_THREADS];
    fill_job jobs[FILL_THREADS];
    int nt = m >= (1 << 20) ? FILL_THREADS : 1, started = 0;
    for (int i = 0; i < nt; i++) {
        jobs[i] = (fill_job){e, seed, id, base, m * i / nt, m * (i + 1) / nt, buf};
        if (i > 0 && pthread_create(&th[i], NULL, fill_part, &jobs[i]) == 0) started |= 1 << i;
        else if (i > 0) fill_part(&jobs[i]);
    }
    fill_part(&jobs[0]);
    for (int i = 1; i < nt; i++)
        if (started & (1 << i)) pthread_join(th[i], NULL);
}

static flexdiag_status fill_random(const flexdiag_kernels *k, flexdiag_stream *s,
                                   const wentry *e, void *block, uint64_t seed, uint64_t id,
                                   uint16_t *buf) {
    int64_t n = e->rows * e->cols;
    for (int64_t base = 0; base < n; base += CHUNK_ELEMS) {
        int64_t m = n - base < CHUNK_ELEMS ? n - base : CHUNK_ELEMS;
        fill_chunk(e, seed, id, base, m, buf);
        FLEXDIAG_TRY(k->copy_h2d((char *)block + e->offset + (size_t)base * 2, buf,
                                 (size_t)m * 2, s));
        FLEXDIAG_TRY(k->stream_sync(s)); /* buf is reused for the next chunk */
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__weights_random(flexdiag_arena *a, flexdiag_stream *s,
                                         const flexdiag_model_config *cfg, uint64_t seed,
                                         flexdiag_weights *w) {
    const flexdiag_kernels *k = a->k;
    wtable t = {0};
    model_off o;
    memset(w, 0, sizeof *w);
    flexdiag_status st = build_table(cfg, &t, &o);
    if (st == FLEXDIAG_OK) st = allocate(a, cfg, &t, &o, w);
    free(o.layers);
    uint16_t *buf = st == FLEXDIAG_OK ? malloc((size_t)CHUNK_ELEMS * 2) : NULL;
    if (st == FLEXDIAG_OK && !buf) st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weights: no memory");
    for (int i = 0; st == FLEXDIAG_OK && i < t.n; i++)
        st = fill_random(k, s, &t.e[i], w->block, seed, (uint64_t)i, buf);
    free(buf);
    free(t.e);
    if (st != FLEXDIAG_OK) flexdiag__weights_free(a, w);
    return st;
}

/* ---- loading from safetensors ---- */

/* Tensors an architecture does not need (docs/formats.md §2.6); never read. */
static int skipped(flexdiag_arch arch, const char *canon) {
    static const char *janus[] = {"language_model.lm_head.", "vision_model.", "aligner.",
                                  "gen_vision_model."};
    if (strstr(canon, "rotary_emb.inv_freq")) return 1;
    if (arch != FLEXDIAG_ARCH_JANUS) return 0;
    for (size_t i = 0; i < sizeof janus / sizeof janus[0]; i++)
        if (!strncmp(canon, janus[i], strlen(janus[i]))) return 1;
    return 0;
}

static wentry *find_entry(wtable *t, const char *canon) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].name, canon)) return &t->e[i];
    return NULL;
}

static flexdiag_status check_shape(const flexdiag_safetensors *st, const flexdiag_st_tensor *x,
                                   const wentry *e) {
    int ok = x->ndim == e->ndim && x->shape[0] == e->rows && (e->ndim == 1 || x->shape[1] == e->cols);
    if (ok) return FLEXDIAG_OK;
    char found[96] = "[", *p = found + 1;
    for (int i = 0; i < x->ndim && p < found + 80; i++)
        p += snprintf(p, (size_t)(found + sizeof found - p), "%s%lld", i ? ", " : "",
                      (long long)x->shape[i]);
    snprintf(p, (size_t)(found + sizeof found - p), "]");
    char want[64];
    if (e->ndim == 1) snprintf(want, sizeof want, "[%lld]", (long long)e->rows);
    else snprintf(want, sizeof want, "[%lld, %lld]", (long long)e->rows, (long long)e->cols);
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                         "%s: tensor '%s' has shape %s, the config needs %s",
                         flexdiag__st_file_path(st, x->file), x->name, found, want);
}

/* Match every checkpoint tensor; fills tensor pointers per entry (same index). */
static flexdiag_status match_all(const flexdiag_safetensors *st, const flexdiag_model_config *c,
                                 wtable *t, const flexdiag_st_tensor **src) {
    char canon[512], unknown[512] = "";
    int n_unknown = 0;
    for (int64_t i = 0; i < flexdiag__st_count(st); i++) {
        const flexdiag_st_tensor *x = flexdiag__st_at(st, i);
        if (flexdiag__name_canonical(c->arch, x->name, canon, sizeof canon) < 0) continue;
        wentry *e = find_entry(t, canon);
        if (e) {
            FLEXDIAG_TRY(check_shape(st, x, e));
            e->found = 1;
            src[e - t->e] = x;
        } else if (!skipped(c->arch, canon) && n_unknown++ < 10) {
            size_t len = strlen(unknown);
            snprintf(unknown + len, sizeof unknown - len, "%s%s", len ? ", " : "", x->name);
        }
    }
    if (n_unknown)
        FLEXDIAG_WARN("ignoring %d tensor(s) this architecture does not use: %s%s", n_unknown,
                      unknown, n_unknown > 10 ? ", ..." : "");
    for (int i = 0; i < t->n; i++)
        if (!t->e[i].found)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: required tensor '%s' (shape [%lld%s%lld]) is missing "
                                 "(checked original and transformers names)",
                                 flexdiag__st_file_path(st, 0), t->e[i].name,
                                 (long long)t->e[i].rows, t->e[i].ndim == 2 ? ", " : "",
                                 t->e[i].ndim == 2 ? (long long)t->e[i].cols : 0LL);
    return FLEXDIAG_OK;
}

static flexdiag_status upload_all(const flexdiag_kernels *k, flexdiag_stream *s,
                                  const flexdiag_safetensors *st, const wtable *t,
                                  const flexdiag_st_tensor **src, void *block) {
    int64_t most = 0;
    for (int i = 0; i < t->n; i++)
        if (t->e[i].rows * t->e[i].cols > most) most = t->e[i].rows * t->e[i].cols;
    uint16_t *buf = malloc((size_t)most * 2);
    if (!buf) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weights: no host memory for staging");
    flexdiag_status r = FLEXDIAG_OK;
    for (int i = 0; r == FLEXDIAG_OK && i < t->n; i++) {
        r = flexdiag__st_read_bf16(st, src[i], buf);
        if (r == FLEXDIAG_OK)
            r = k->copy_h2d((char *)block + t->e[i].offset, buf, (size_t)src[i]->numel * 2, s);
        if (r == FLEXDIAG_OK) r = k->stream_sync(s);
    }
    free(buf);
    return r;
}

flexdiag_status flexdiag__weights_load(flexdiag_arena *a, flexdiag_stream *s,
                                       const flexdiag_model_config *cfg,
                                       const flexdiag_safetensors *st, flexdiag_weights *w) {
    wtable t = {0};
    model_off o;
    memset(w, 0, sizeof *w);
    flexdiag_status r = build_table(cfg, &t, &o);
    const flexdiag_st_tensor **src = r == FLEXDIAG_OK ? calloc((size_t)t.n, sizeof *src) : NULL;
    if (r == FLEXDIAG_OK && !src) r = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weights: no memory");
    if (r == FLEXDIAG_OK) r = match_all(st, cfg, &t, src); /* all checks before allocating */
    if (r == FLEXDIAG_OK) r = allocate(a, cfg, &t, &o, w);
    if (r == FLEXDIAG_OK) r = upload_all(a->k, s, st, &t, src, w->block);
    free(o.layers);
    if (r != FLEXDIAG_OK) flexdiag__weights_free(a, w);
    free(src);
    free(t.e);
    return r;
}
