/*
 * vq.c - the VQ image decoders (docs/architecture.md §4.4): weight loading and the decode
 * pipeline, all device work through the op table so one code path serves CPU and CUDA. The shape
 * comes from vq_config.c; mid is always ResBlock, AttnBlock, ResBlock, and levels with attention
 * have an AttnBlock after every ResBlock. Janus-Pro's VQ-16 and the taming / Chameleon VQGAN
 * are the same computation: a layout (vq_names) only says how tensors are named and numbered,
 * so both run through one table builder, one matcher and one run_pass (no second decoder).
 *
 * Loading (size first, allocate once): a table of every needed tensor (canonical name, shape,
 * offset in one device block) is built from the config alone; checkpoint names are rewritten
 * with flexdiag__name_canonical (Janus; taming names are used as stored) and matched against
 * it; presence, dtype and shape of every entry are checked before a byte is read. The codebook
 * is kept fp32, L2-normalised at load when the config says so (Janus: v / max(‖v‖₂, 1e-12), as
 * F.normalize); every other weight stays bf16.
 *
 * Decode: ids -> vq_lookup -> post_quant_conv (1×1) -> conv_in -> mid -> levels from the
 * lowest resolution (ResBlocks [+ AttnBlocks], then nearest ×2 + 3×3 conv) -> GroupNorm +
 * swish -> conv_out -> NHWC f32 pixels. Activations are fp32 on every backend (kernels.h).
 * Scratch is three activation buffers (A holds the running tensor, T1/T2 temporaries) sized for
 * the largest tensor of the pass, plus K and V buffers sized for the attention levels;
 * residuals are added by the convs' ACCUM flag, so a ResBlock needs no copy of its input.
 * Batches larger than max_batch run in several passes.
 */
#include "runtime/image/vq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/model/model.h"

#define VQ_ALIGN 256           /* byte alignment of every carved tensor and buffer */
#define VQ_NAME_MAX 192        /* longest canonical tensor name we build */

/* How a layout names the decoder's tensors (flexdiag_vq_layout, docs/formats.md §2.3). */
typedef struct vq_names {
    const char *prefix;      /* before every table name */
    const char *mid[3];      /* mid ResBlock, AttnBlock, ResBlock */
    const char *level;       /* "<level>.<index>" names a level */
    const char *res;         /* "<level>.<index>.<res>.<r>" names its ResBlock r */
    int by_level;            /* index = level (0 full resolution); else run order (0 lowest) */
    int canonical;           /* checkpoint names go through flexdiag__name_canonical first */
    const char *hint;        /* added to a missing tensor's name in messages */
    const char *ours[4];     /* name prefixes of decoder tensors (for the unused check) */
    const char *skip[4];     /* ... of those, parts never read (encoder, quant_conv, ...) */
    int unused_fatal;        /* unused decoder tensors: an error (shape came from the file) */
} vq_names;

static const vq_names names_janus = {
    "gen_vision_model.", {"decoder.mid.0", "decoder.mid.1", "decoder.mid.2"},
    "decoder.conv_blocks", "res", 0, 1, " (transformers: under model.vqmodel.)",
    {"gen_vision_model."},
    {"gen_vision_model.encoder.", "gen_vision_model.quant_conv.",
     "gen_vision_model.quantize.codebook_used"},
    0,
};

static const vq_names names_taming = {
    "", {"decoder.mid.block_1", "decoder.mid.attn_1", "decoder.mid.block_2"},
    "decoder.up", "block", 1, 0, " (taming / Chameleon VQGAN name, no prefix)",
    {"decoder.", "post_quant_conv.", "quantize."}, {NULL}, 1,
};

static const vq_names *names_of(const flexdiag_vq_config *c) {
    return c->layout == FLEXDIAG_VQ_LAYOUT_TAMING ? &names_taming : &names_janus;
}

/* ---- weights as the decoder sees them (bf16 device pointers) ---- */

typedef struct vq_conv {
    const uint16_t *w; /* (cout, cin, k, k) */
    const uint16_t *b; /* (cout) */
    int32_t cin, cout, k;
} vq_conv;

typedef struct vq_norm {
    const uint16_t *w, *b; /* gamma, beta (c) */
    int32_t c;
} vq_norm;

typedef struct vq_resblock {
    vq_norm norm1, norm2;
    vq_conv conv1, conv2;
    vq_conv nin;      /* 1×1 shortcut; w == NULL when cin == cout */
} vq_resblock;

typedef struct vq_attnblock {
    vq_norm norm;
    vq_conv q, k, v, proj;
} vq_attnblock;

typedef struct vq_level {            /* run order b: 0 = lowest resolution */
    vq_resblock res[FLEXDIAG_VQ_MAX_RES];
    vq_attnblock attn[FLEXDIAG_VQ_MAX_RES];
    int32_t has_attn;
    vq_conv up;                      /* 3×3 conv after the ×2 upsample; w == NULL on the last */
} vq_level;

struct flexdiag_vq {
    const flexdiag_kernels *k;       /* backend (borrowed) */
    flexdiag_vq_config cfg;          /* validated shape */
    int64_t max_batch;               /* images per pass */
    void *wblock;                    /* device: codebook f32, then bf16 weights */
    size_t wbytes;                   /* bytes of wblock */
    void *sblock;                    /* device scratch */
    size_t sbytes;                   /* bytes of sblock */
    const float *codebook;           /* (V, e) fp32, rows unit L2 norm when cfg.l2_codebook */
    vq_conv post_quant, conv_in, conv_out;
    vq_resblock mid_res[2];
    vq_attnblock mid_attn;
    vq_level level[FLEXDIAG_VQ_MAX_LEVELS]; /* in run order b (level n_levels-1-b) */
    vq_norm norm_out;
    void *buf[3];                    /* A, T1, T2: max_batch · act_elems f32 each */
    void *kbuf, *vbuf;               /* max_batch · attn_elems f32 each */
    int32_t *ids;                    /* (max_batch, grid_h·grid_w) device ids */
    int64_t act_elems, attn_elems;   /* per image */
};

/* Channels of level l (0 = full resolution). */
static int32_t level_ch(const flexdiag_vq_config *c, int32_t l) { return c->ch * c->ch_mult[l]; }

/* ---- tensor table ---- */

typedef struct vq_entry {
    char name[VQ_NAME_MAX];           /* canonical checkpoint name */
    int32_t ndim;                     /* 1, 2 or 4 */
    int64_t shape[4];                 /* expected shape */
    size_t offset;                    /* bytes into the weight block */
    const uint16_t **dst;             /* device pointer slot; NULL for the fp32 codebook */
    const flexdiag_st_tensor *t;      /* matched checkpoint tensor */
} vq_entry;

typedef struct vq_table {
    const vq_names *nm;               /* the layout's names */
    vq_entry *e;                      /* entries, codebook first */
    int32_t n, cap;                   /* count, capacity */
    size_t bytes;                     /* weight block size so far */
} vq_table;

static size_t round_up(size_t x) { return (x + VQ_ALIGN - 1) / VQ_ALIGN * VQ_ALIGN; }

/* Append "<prefix><base><suffix>" with its shape; 4 bytes per element for the codebook. */
static flexdiag_status table_add(vq_table *t, const uint16_t **dst, const char *base,
                                 const char *suffix, int32_t ndim, const int64_t *shape) {
    if (t->n == t->cap) {
        int32_t cap = t->cap ? 2 * t->cap : 256;
        vq_entry *e = realloc(t->e, (size_t)cap * sizeof *e);
        if (!e) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "VQ decoder: no memory for the table");
        t->e = e;
        t->cap = cap;
    }
    vq_entry *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    int w = snprintf(e->name, sizeof e->name, "%s%s%s", t->nm->prefix, base, suffix);
    FLEXDIAG_ASSERT(w > 0 && (size_t)w < sizeof e->name);
    e->ndim = ndim;
    int64_t numel = 1;
    for (int32_t i = 0; i < ndim; i++) numel *= (e->shape[i] = shape[i]);
    e->dst = dst;
    e->offset = t->bytes;
    t->bytes = round_up(t->bytes + (size_t)numel * (dst ? 2 : 4));
    return FLEXDIAG_OK;
}

static flexdiag_status add_conv(vq_table *t, vq_conv *c, const char *base, int32_t cin,
                                int32_t cout, int32_t k) {
    int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
    c->cin = cin;
    c->cout = cout;
    c->k = k;
    FLEXDIAG_TRY(table_add(t, &c->w, base, ".weight", 4, ws));
    return table_add(t, &c->b, base, ".bias", 1, bs);
}

static flexdiag_status add_norm(vq_table *t, vq_norm *nm, const char *base, int32_t c) {
    int64_t s[1] = {c};
    nm->c = c;
    FLEXDIAG_TRY(table_add(t, &nm->w, base, ".weight", 1, s));
    return table_add(t, &nm->b, base, ".bias", 1, s);
}

static flexdiag_status add_res(vq_table *t, vq_resblock *r, const char *base, int32_t cin,
                               int32_t cout) {
    char n[VQ_NAME_MAX];
    snprintf(n, sizeof n, "%s.norm1", base);
    FLEXDIAG_TRY(add_norm(t, &r->norm1, n, cin));
    snprintf(n, sizeof n, "%s.conv1", base);
    FLEXDIAG_TRY(add_conv(t, &r->conv1, n, cin, cout, 3));
    snprintf(n, sizeof n, "%s.norm2", base);
    FLEXDIAG_TRY(add_norm(t, &r->norm2, n, cout));
    snprintf(n, sizeof n, "%s.conv2", base);
    FLEXDIAG_TRY(add_conv(t, &r->conv2, n, cout, cout, 3));
    if (cin == cout) return FLEXDIAG_OK;
    snprintf(n, sizeof n, "%s.nin_shortcut", base);
    return add_conv(t, &r->nin, n, cin, cout, 1);
}

static flexdiag_status add_attn(vq_table *t, vq_attnblock *a, const char *base, int32_t c) {
    static const char *proj[4] = {"q", "k", "v", "proj_out"};
    vq_conv *dst[4] = {&a->q, &a->k, &a->v, &a->proj};
    char n[VQ_NAME_MAX];
    snprintf(n, sizeof n, "%s.norm", base);
    FLEXDIAG_TRY(add_norm(t, &a->norm, n, c));
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "%s.%s", base, proj[i]);
        FLEXDIAG_TRY(add_conv(t, dst[i], n, c, c, 1));
    }
    return FLEXDIAG_OK;
}

/* Level lvl = n_levels-1-b, run b-th (Janus conv_blocks.b, taming up.lvl); cin is the previous
 * block's width. */
static flexdiag_status add_level(vq_table *t, flexdiag_vq *vq, int32_t b, int32_t cin) {
    const flexdiag_vq_config *c = &vq->cfg;
    const vq_names *nm = t->nm;
    int32_t lvl = c->n_levels - 1 - b, cout = level_ch(c, lvl), idx = nm->by_level ? lvl : b;
    vq_level *L = &vq->level[b];
    char n[VQ_NAME_MAX];
    L->has_attn = c->attn[lvl];
    for (int32_t r = 0; r < c->res_blocks; r++) {
        snprintf(n, sizeof n, "%s.%d.%s.%d", nm->level, idx, nm->res, r);
        FLEXDIAG_TRY(add_res(t, &L->res[r], n, r ? cout : cin, cout));
        if (!L->has_attn) continue;
        snprintf(n, sizeof n, "%s.%d.attn.%d", nm->level, idx, r);
        FLEXDIAG_TRY(add_attn(t, &L->attn[r], n, cout));
    }
    if (lvl == 0) return FLEXDIAG_OK;
    snprintf(n, sizeof n, "%s.%d.upsample.conv", nm->level, idx);
    return add_conv(t, &L->up, n, cout, cout, 3);
}

/* Every tensor the config needs, in execution order, codebook first. */
static flexdiag_status build_table(flexdiag_vq *vq, vq_table *t) {
    const flexdiag_vq_config *c = &vq->cfg;
    const vq_names *nm = t->nm = names_of(c);
    int32_t top = level_ch(c, c->n_levels - 1);
    int64_t cb[2] = {c->codebook_size, c->embed_dim};
    FLEXDIAG_TRY(table_add(t, NULL, "quantize.embedding", ".weight", 2, cb));
    FLEXDIAG_TRY(add_conv(t, &vq->post_quant, "post_quant_conv", c->embed_dim, c->z_channels, 1));
    FLEXDIAG_TRY(add_conv(t, &vq->conv_in, "decoder.conv_in", c->z_channels, top, 3));
    FLEXDIAG_TRY(add_res(t, &vq->mid_res[0], nm->mid[0], top, top));
    FLEXDIAG_TRY(add_attn(t, &vq->mid_attn, nm->mid[1], top));
    FLEXDIAG_TRY(add_res(t, &vq->mid_res[1], nm->mid[2], top, top));
    for (int32_t b = 0; b < c->n_levels; b++)
        FLEXDIAG_TRY(add_level(t, vq, b, b ? level_ch(c, c->n_levels - b) : top));
    FLEXDIAG_TRY(add_norm(t, &vq->norm_out, "decoder.norm_out", level_ch(c, 0)));
    return add_conv(t, &vq->conv_out, "decoder.conv_out", level_ch(c, 0), c->out_channels, 3);
}

/* ---- matching checkpoint tensors ---- */

/* "[a, b, c]" of n dims into buf. */
static const char *shape_str(const int64_t *shape, int32_t n, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int32_t i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

/* Canonical names of all checkpoint tensors (NULL entries when a name does not fit); the
 * stored names when the layout has no canonical form. */
static flexdiag_status canonical_names(const flexdiag_safetensors *st, const vq_names *nm,
                                       char ***out) {
    int64_t n = flexdiag__st_count(st);
    char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    if (!names) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "VQ decoder: no memory for names");
    for (int64_t i = 0; i < n; i++) {
        char buf[512];
        const char *name = flexdiag__st_at(st, i)->name;
        if (!nm->canonical) {
            if (snprintf(buf, sizeof buf, "%s", name) >= (int)sizeof buf) continue;
        } else if (flexdiag__name_canonical(FLEXDIAG_ARCH_JANUS, name, buf, sizeof buf) < 0) {
            continue; /* longer than any tensor of ours: cannot match */
        }
        names[i] = strdup(buf);
        if (!names[i]) {
            for (int64_t j = 0; j < i; j++) free(names[j]);
            free(names);
            return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "VQ decoder: no memory for names");
        }
    }
    *out = names;
    return FLEXDIAG_OK;
}

static void free_names(char **names, int64_t n) {
    if (!names) return;
    for (int64_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Find e in the checkpoint; check uniqueness, dtype and shape. used[i] marks tensor i. */
static flexdiag_status match_entry(const flexdiag_safetensors *st, const vq_names *nm,
                                   char **canon, vq_entry *e, char *used) {
    int64_t n = flexdiag__st_count(st);
    char want[96], got[96];
    for (int64_t i = 0; i < n; i++) {
        if (!canon[i] || strcmp(canon[i], e->name)) continue;
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        if (e->t)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensors '%s' and '%s' both name %s: keep one naming scheme",
                                 flexdiag__st_file_path(st, t->file), e->t->name, t->name,
                                 e->name);
        e->t = t;
        used[i] = 1;
    }
    shape_str(e->shape, e->ndim, want, sizeof want);
    if (!e->t)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s'%s is missing; the VQ config needs shape %s",
                             n ? flexdiag__st_file_path(st, 0) : "checkpoint", e->name, nm->hint,
                             want);
    const flexdiag_st_tensor *t = e->t;
    const char *file = flexdiag__st_file_path(st, t->file);
    if (t->dtype != FLEXDIAG_DTYPE_BF16 && t->dtype != FLEXDIAG_DTYPE_F16 &&
        t->dtype != FLEXDIAG_DTYPE_F32)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: tensor '%s' has dtype %s; the VQ decoder reads BF16, F16 or F32",
                             file, t->name, flexdiag__dtype_name(t->dtype));
    int ok = t->ndim == e->ndim;
    for (int32_t d = 0; ok && d < e->ndim; d++) ok = t->shape[d] == e->shape[d];
    if (!ok)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s' has shape %s, the VQ config needs %s", file,
                             t->name, shape_str(t->shape, t->ndim, got, sizeof got), want);
    return FLEXDIAG_OK;
}

/* A decoder tensor of the layout (under one of its prefixes, not on its skip list). */
static int decoder_tensor(const vq_names *nm, const char *canon) {
    int ours = 0;
    for (int i = 0; canon && !ours && i < 4 && nm->ours[i]; i++)
        ours = !strncmp(canon, nm->ours[i], strlen(nm->ours[i]));
    for (int i = 0; ours && i < 4 && nm->skip[i]; i++)
        if (!strncmp(canon, nm->skip[i], strlen(nm->skip[i]))) return 0;
    return ours;
}

/* Decoder tensors the config does not use (docs/formats.md §2.6), up to 10 then a count. Janus:
 * one warning (usually config.json has fewer levels or blocks than the checkpoint). Taming: an
 * error, since the shape came from the file itself and the file has a structure it missed. */
static flexdiag_status check_unused(const flexdiag_safetensors *st, const vq_names *nm,
                                    char **canon, const char *used) {
    int64_t n = flexdiag__st_count(st), extra = 0;
    char list[1024] = "";
    size_t len = 0;
    for (int64_t i = 0; i < n; i++) {
        if (used[i] || !decoder_tensor(nm, canon[i])) continue;
        if (extra++ < 10 && len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", extra > 1 ? ", " : "",
                                    flexdiag__st_at(st, i)->name);
    }
    if (!extra) return FLEXDIAG_OK;
    if (nm->unused_fatal)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: %lld decoder tensor(s) outside the VQGAN layout its shapes "
                             "describe (up.0's ResBlocks set the count per level): %s%s",
                             flexdiag__st_file_path(st, 0), (long long)extra, list,
                             extra > 10 ? ", ..." : "");
    FLEXDIAG_WARN("%s: %lld image-decoder tensor(s) not used by the VQ config, ignored "
                  "(check config.json): %s%s",
                  flexdiag__st_file_path(st, 0), (long long)extra, list,
                  extra > 10 ? ", ..." : "");
    return FLEXDIAG_OK;
}

static flexdiag_status match_table(const flexdiag_safetensors *st, vq_table *t) {
    int64_t n = flexdiag__st_count(st);
    char **canon = NULL, *used = calloc((size_t)(n ? n : 1), 1);
    if (!used) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "VQ decoder: no memory");
    flexdiag_status s = canonical_names(st, t->nm, &canon);
    for (int32_t i = 0; s == FLEXDIAG_OK && i < t->n; i++)
        s = match_entry(st, t->nm, canon, &t->e[i], used);
    if (s == FLEXDIAG_OK) s = check_unused(st, t->nm, canon, used);
    free_names(canon, n);
    free(used);
    return s;
}

/* ---- reading weights ---- */

/* Codebook rows to unit L2 norm in fp32: v / max(‖v‖₂, 1e-12), as F.normalize. */
static void normalise_rows(float *cb, int64_t rows, int32_t dim) {
    for (int64_t r = 0; r < rows; r++) {
        float *v = cb + r * dim;
        double ss = 0;
        for (int32_t j = 0; j < dim; j++) ss += (double)v[j] * v[j];
        float nrm = (float)sqrt(ss), d = nrm > 1e-12f ? nrm : 1e-12f;
        for (int32_t j = 0; j < dim; j++) v[j] /= d;
    }
}

/* Seeded random entry i (no checkpoint): convolutions N(0, 1/fan_in) (Irwin-Hall(4)
 * approximation), GroupNorm gammas 1, biases 0, a Gaussian codebook. Keyed by (seed, i, j). */
static void random_entry(const vq_entry *e, int32_t i, uint64_t seed, char *dst) {
    int64_t numel = 1, fan_in = 1;
    for (int32_t d = 0; d < e->ndim; d++) numel *= e->shape[d];
    for (int32_t d = 1; d < e->ndim; d++) fan_in *= e->shape[d];
    size_t len = strlen(e->name);
    int bias = len > 5 && !strcmp(e->name + len - 5, ".bias");
    float scale = (float)(1.7320508 / sqrt((double)fan_in)); /* Irwin-Hall(4) has var 1/3 */
    for (int64_t j = 0; j < numel; j++) {
        uint64_t r = flexdiag__rng64(seed, (uint64_t)i, (uint64_t)j);
        float u = (float)((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48)) /
                      65536.0f - 2.0f;
        float v = e->ndim == 1 ? (bias ? 0.0f : 1.0f) : u * (e->dst ? scale : 1.7320508f);
        if (e->dst) ((uint16_t *)dst)[j] = flexdiag__f32_to_bf16(v);
        else ((float *)dst)[j] = v;
    }
}

/* Read every entry (or draw it when st is NULL) into one host image of the weight block, then
 * copy it to the device. */
static flexdiag_status load_weights(flexdiag_vq *vq, flexdiag_stream *s,
                                    const flexdiag_safetensors *st, const vq_table *t,
                                    uint64_t seed) {
    const flexdiag_kernels *k = vq->k;
    char *host = calloc(1, t->bytes);
    if (!host)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "VQ decoder: no host memory to stage %zu bytes of weights", t->bytes);
    flexdiag_status st_ = FLEXDIAG_OK;
    for (int32_t i = 0; st_ == FLEXDIAG_OK && i < t->n; i++) {
        const vq_entry *e = &t->e[i];
        if (!st) random_entry(e, i, seed, host + e->offset);
        else if (e->dst) st_ = flexdiag__st_read_bf16(st, e->t, (uint16_t *)(host + e->offset));
        else st_ = flexdiag__st_read_f32(st, e->t, (float *)(host + e->offset));
        if (st_ == FLEXDIAG_OK && !e->dst && vq->cfg.l2_codebook)
            normalise_rows((float *)(host + e->offset), e->shape[0], (int32_t)e->shape[1]);
    }
    if (st_ == FLEXDIAG_OK) st_ = k->mem_alloc(t->bytes, &vq->wblock);
    if (st_ == FLEXDIAG_OK) {
        vq->wbytes = t->bytes;
        st_ = k->copy_h2d(vq->wblock, host, t->bytes, s);
    }
    if (st_ == FLEXDIAG_OK) st_ = k->stream_sync(s);
    free(host);
    if (st_ != FLEXDIAG_OK) return st_;
    for (int32_t i = 0; i < t->n; i++) {
        const vq_entry *e = &t->e[i];
        if (e->dst) *e->dst = (const uint16_t *)((char *)vq->wblock + e->offset);
        else vq->codebook = (const float *)((char *)vq->wblock + e->offset);
    }
    return FLEXDIAG_OK;
}

/* ---- scratch ---- */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Largest activation (f32 elements per image) written to A/T1/T2 by one pass, and the largest
 * attention tensor (K, V buffers); walks the same stages as run_pass. */
static void plan_scratch(const flexdiag_vq_config *c, int64_t *act, int64_t *attn) {
    int64_t h = c->grid_h, w = c->grid_w, top = level_ch(c, c->n_levels - 1), cin = top;
    int64_t m = max64(max64(c->embed_dim, c->z_channels), top) * h * w, a = top * h * w;
    for (int32_t b = 0; b < c->n_levels; b++) {
        int32_t lvl = c->n_levels - 1 - b;
        int64_t cout = level_ch(c, lvl);
        m = max64(m, max64(cin, cout) * h * w);
        if (c->attn[lvl]) a = max64(a, cout * h * w);
        if (lvl > 0) {
            h *= 2;
            w *= 2;
            m = max64(m, cout * h * w);
        }
        cin = cout;
    }
    /* conv_out output, and the NHWC pixels of the same size that reuse buffer A */
    *act = max64(m, c->out_channels * h * w);
    *attn = a;
}

/* Byte offsets of A, T1, T2, K, V and the id buffer inside one scratch block for max_batch
 * images, and its total size. */
static flexdiag_status scratch_layout(const flexdiag_vq_config *c, int64_t max_batch,
                                      size_t off[6], size_t *total) {
    int64_t act, attn, hw = (int64_t)c->grid_h * c->grid_w;
    plan_scratch(c, &act, &attn);
    uint64_t act_b, attn_b, ids_b;
    if (!flexdiag__mul_ok((uint64_t)max_batch, (uint64_t)act * sizeof(float), &act_b) ||
        !flexdiag__mul_ok((uint64_t)max_batch, (uint64_t)attn * sizeof(float), &attn_b) ||
        !flexdiag__mul_ok((uint64_t)max_batch, (uint64_t)hw * 4, &ids_b) ||
        act_b > ((uint64_t)1 << 50))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "VQ decoder: scratch for %lld images overflows: decode fewer images "
                             "at once",
                             (long long)max_batch);
    uint64_t sizes[6] = {act_b, act_b, act_b, attn_b, attn_b, ids_b};
    *total = 0;
    for (int i = 0; i < 6; i++) {
        off[i] = *total;
        *total += round_up((size_t)sizes[i]);
    }
    return FLEXDIAG_OK;
}

/* One backend allocation carved into A, T1, T2, K, V and the id buffer. */
static flexdiag_status alloc_scratch(flexdiag_vq *vq) {
    size_t off[6], total = 0;
    plan_scratch(&vq->cfg, &vq->act_elems, &vq->attn_elems);
    FLEXDIAG_TRY(scratch_layout(&vq->cfg, vq->max_batch, off, &total));
    flexdiag_status st = vq->k->mem_alloc(total, &vq->sblock);
    if (st != FLEXDIAG_OK)
        return flexdiag__err_prefix(st, "VQ decoder scratch (%zu bytes for %lld images)", total,
                                    (long long)vq->max_batch);
    vq->sbytes = total;
    for (int i = 0; i < 3; i++) vq->buf[i] = (char *)vq->sblock + off[i];
    vq->kbuf = (char *)vq->sblock + off[3];
    vq->vbuf = (char *)vq->sblock + off[4];
    vq->ids = (int32_t *)((char *)vq->sblock + off[5]);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vq_plan(const flexdiag_vq_config *cfg, int64_t max_batch,
                                  size_t *weight_bytes, size_t *scratch_bytes) {
    if (!cfg || max_batch < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ plan: need a config and max_batch >= 1");
    FLEXDIAG_TRY(flexdiag__vq_config_validate(cfg));
    flexdiag_vq *vq = calloc(1, sizeof *vq);
    if (!vq) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "VQ plan: no host memory");
    vq->cfg = *cfg;
    vq_table t = {0};
    size_t off[6];
    flexdiag_status st = build_table(vq, &t);
    if (st == FLEXDIAG_OK) st = scratch_layout(cfg, max_batch, off, scratch_bytes);
    if (st == FLEXDIAG_OK) *weight_bytes = t.bytes;
    free(t.e);
    free(vq);
    return st;
}

/* ---- create / load / destroy ---- */

/* The backend must provide memory, copies and all six image-decoder ops. */
static flexdiag_status check_backend(const flexdiag_kernels *k) {
    const struct {
        const char *name;
        int present;
    } ops[] = {
        {"mem_alloc", k->mem_alloc != NULL},     {"mem_free", k->mem_free != NULL},
        {"copy_h2d", k->copy_h2d != NULL},       {"copy_d2h", k->copy_d2h != NULL},
        {"stream_sync", k->stream_sync != NULL}, {"vq_lookup", k->vq_lookup != NULL},
        {"conv2d", k->conv2d != NULL},           {"groupnorm", k->groupnorm != NULL},
        {"upsample2x", k->upsample2x != NULL},   {"attn_spatial", k->attn_spatial != NULL},
        {"to_nhwc", k->to_nhwc != NULL},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!ops[i].present)
            return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                                 "backend '%s' has no %s op, needed by the VQ image decoder: use "
                                 "the CPU backend",
                                 k->name, ops[i].name);
    return FLEXDIAG_OK;
}

/* Shared by create (st != NULL) and create_random (st == NULL, weights drawn from seed). */
static flexdiag_status vq_build(const flexdiag_kernels *k, flexdiag_stream *s,
                                const flexdiag_safetensors *st, uint64_t seed,
                                const flexdiag_vq_config *cfg, int64_t max_batch,
                                flexdiag_vq **out) {
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ decoder: out is NULL");
    *out = NULL;
    if (!k || !cfg)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ decoder: backend, reader and config "
                                                       "are required");
    if (max_batch < 1 || max_batch > (1 << 20))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "VQ decoder: max_batch = %lld: give 1 .. 1048576 images per pass",
                             (long long)max_batch);
    FLEXDIAG_TRY(check_backend(k));
    FLEXDIAG_TRY(flexdiag__vq_config_validate(cfg));
    flexdiag_vq *vq = calloc(1, sizeof *vq);
    if (!vq) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "VQ decoder: no host memory");
    vq->k = k;
    vq->cfg = *cfg;
    vq->max_batch = max_batch;
    vq_table t = {0};
    flexdiag_status st_ = build_table(vq, &t);
    if (st_ == FLEXDIAG_OK && st) st_ = match_table(st, &t);
    if (st_ == FLEXDIAG_OK) st_ = load_weights(vq, s, st, &t, seed);
    if (st_ == FLEXDIAG_OK) st_ = alloc_scratch(vq);
    free(t.e);
    if (st_ != FLEXDIAG_OK) {
        flexdiag__vq_destroy(vq);
        return st_;
    }
    *out = vq;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vq_create(const flexdiag_kernels *k, flexdiag_stream *s,
                                    const flexdiag_safetensors *st, const flexdiag_vq_config *cfg,
                                    int64_t max_batch, flexdiag_vq **out) {
    if (!st) {
        if (out) *out = NULL;
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ decoder: no checkpoint reader");
    }
    return vq_build(k, s, st, 0, cfg, max_batch, out);
}

flexdiag_status flexdiag__vq_create_random(const flexdiag_kernels *k, flexdiag_stream *s,
                                           const flexdiag_vq_config *cfg, uint64_t seed,
                                           int64_t max_batch, flexdiag_vq **out) {
    return vq_build(k, s, NULL, seed, cfg, max_batch, out);
}

flexdiag_status flexdiag__vq_load(const flexdiag_kernels *k, flexdiag_stream *s,
                                  const char *model_dir, int64_t max_batch, flexdiag_vq **out) {
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ decoder: out is NULL");
    *out = NULL;
    if (!model_dir) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ decoder: no model folder");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", model_dir) >= (int)sizeof path)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ decoder: model path too long");
    flexdiag_vq_config cfg;
    FLEXDIAG_TRY(flexdiag__vq_config_read(path, &cfg));
    flexdiag_safetensors *st = NULL;
    FLEXDIAG_TRY(flexdiag__st_open(model_dir, &st));
    flexdiag_status r = flexdiag__vq_create(k, s, st, &cfg, max_batch, out);
    flexdiag__st_close(st);
    return r;
}

flexdiag_status flexdiag__vq_open_vqgan(const flexdiag_kernels *k, flexdiag_stream *s,
                                        const char *path, int32_t grid_h, int32_t grid_w,
                                        int32_t groups, int64_t max_batch, flexdiag_vq **out) {
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQGAN decoder: out is NULL");
    *out = NULL;
    if (!path) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQGAN decoder: no file");
    flexdiag_safetensors *st = NULL;
    FLEXDIAG_TRY(flexdiag__st_open(path, &st));
    flexdiag_vq_config cfg;
    flexdiag_status r = flexdiag__vq_config_vqgan(st, grid_h, grid_w, groups, &cfg);
    if (r == FLEXDIAG_OK) r = flexdiag__vq_create(k, s, st, &cfg, max_batch, out);
    flexdiag__st_close(st);
    return r;
}

flexdiag_status flexdiag__vq_codebook(const flexdiag_vq *vq, flexdiag_stream *s, float *out) {
    size_t bytes = (size_t)vq->cfg.codebook_size * (size_t)vq->cfg.embed_dim * sizeof *out;
    FLEXDIAG_TRY(vq->k->copy_d2h(out, vq->codebook, bytes, s));
    return vq->k->stream_sync(s);
}

const flexdiag_vq_config *flexdiag__vq_get_config(const flexdiag_vq *vq) { return &vq->cfg; }

void flexdiag__vq_bytes(const flexdiag_vq *vq, size_t *weight_bytes, size_t *scratch_bytes) {
    if (weight_bytes) *weight_bytes = vq->wbytes;
    if (scratch_bytes) *scratch_bytes = vq->sbytes;
}

void flexdiag__vq_destroy(flexdiag_vq *vq) {
    if (!vq) return;
    if (vq->wblock) vq->k->mem_free(vq->wblock);
    if (vq->sblock) vq->k->mem_free(vq->sblock);
    free(vq);
}

/* ---- decode ---- */

/* State of one pass: the running tensor lives in a, t1/t2 are temporaries; h, w current size. */
typedef struct vq_run {
    const flexdiag_vq *vq;
    const flexdiag_kernels *k;
    flexdiag_stream *s;
    int64_t n;                 /* images in this pass */
    void *a, *t1, *t2;         /* f32 buffers (swapped by ResBlocks with a shortcut conv) */
    int32_t h, w;              /* current spatial size */
} vq_run;

static flexdiag_status run_conv(vq_run *r, void *out, const void *x, const vq_conv *c,
                                unsigned flags) {
    return r->k->conv2d(out, x, c->w, c->b, r->n, c->cin, c->cout, r->h, r->w, c->k, flags, r->s);
}

static flexdiag_status run_norm(vq_run *r, void *out, const void *x, const vq_norm *nm,
                                int32_t swish) {
    return r->k->groupnorm(out, x, nm->w, nm->b, r->n, nm->c, r->h * r->w, r->vq->cfg.groups,
                           r->vq->cfg.eps, swish, r->s);
}

/* out = shortcut(x) + conv2(swish(norm2(conv1(swish(norm1(x)))))), x and out in a. */
static flexdiag_status run_res(vq_run *r, const vq_resblock *b) {
    FLEXDIAG_TRY(run_norm(r, r->t1, r->a, &b->norm1, 1));
    FLEXDIAG_TRY(run_conv(r, r->t2, r->t1, &b->conv1, 0));
    FLEXDIAG_TRY(run_norm(r, r->t1, r->t2, &b->norm2, 1));
    if (!b->nin.w) return run_conv(r, r->a, r->t1, &b->conv2, FLEXDIAG_MM_ACCUM);
    FLEXDIAG_TRY(run_conv(r, r->t2, r->a, &b->nin, 0));
    FLEXDIAG_TRY(run_conv(r, r->t2, r->t1, &b->conv2, FLEXDIAG_MM_ACCUM));
    void *tmp = r->a;
    r->a = r->t2;
    r->t2 = tmp;
    return FLEXDIAG_OK;
}

/* a += proj_out(attention(q, k, v of norm(a))). */
static flexdiag_status run_attn(vq_run *r, const vq_attnblock *b) {
    FLEXDIAG_TRY(run_norm(r, r->t1, r->a, &b->norm, 0));
    FLEXDIAG_TRY(run_conv(r, r->t2, r->t1, &b->q, 0));
    FLEXDIAG_TRY(run_conv(r, r->vq->kbuf, r->t1, &b->k, 0));
    FLEXDIAG_TRY(run_conv(r, r->vq->vbuf, r->t1, &b->v, 0));
    FLEXDIAG_TRY(r->k->attn_spatial(r->t1, r->t2, r->vq->kbuf, r->vq->vbuf, r->n, b->norm.c,
                                    r->h * r->w, r->s));
    return run_conv(r, r->a, r->t1, &b->proj, FLEXDIAG_MM_ACCUM);
}

static flexdiag_status run_upsample(vq_run *r, const vq_conv *up) {
    FLEXDIAG_TRY(r->k->upsample2x(r->t1, r->a, r->n, up->cin, r->h, r->w, r->s));
    r->h *= 2;
    r->w *= 2;
    return run_conv(r, r->a, r->t1, up, 0);
}

/* Decode n <= max_batch images: ids (host) -> pixels (host, queued on s). */
static flexdiag_status run_pass(const flexdiag_vq *vq, flexdiag_stream *s, const int32_t *ids,
                                int64_t n, float *pixels) {
    const flexdiag_vq_config *c = &vq->cfg;
    const flexdiag_kernels *k = vq->k;
    int32_t hw = c->grid_h * c->grid_w;
    vq_run r = {vq, k, s, n, vq->buf[0], vq->buf[1], vq->buf[2], c->grid_h, c->grid_w};
    FLEXDIAG_TRY(k->copy_h2d(vq->ids, ids, (size_t)(n * hw) * sizeof *ids, s));
    FLEXDIAG_TRY(k->vq_lookup(r.t1, vq->codebook, vq->ids, n, c->embed_dim, hw, s));
    FLEXDIAG_TRY(run_conv(&r, r.t2, r.t1, &vq->post_quant, 0));
    FLEXDIAG_TRY(run_conv(&r, r.a, r.t2, &vq->conv_in, 0));
    FLEXDIAG_TRY(run_res(&r, &vq->mid_res[0]));
    FLEXDIAG_TRY(run_attn(&r, &vq->mid_attn));
    FLEXDIAG_TRY(run_res(&r, &vq->mid_res[1]));
    for (int32_t b = 0; b < c->n_levels; b++) {
        const vq_level *L = &vq->level[b];
        for (int32_t i = 0; i < c->res_blocks; i++) {
            FLEXDIAG_TRY(run_res(&r, &L->res[i]));
            if (L->has_attn) FLEXDIAG_TRY(run_attn(&r, &L->attn[i]));
        }
        if (L->up.w) FLEXDIAG_TRY(run_upsample(&r, &L->up));
    }
    FLEXDIAG_TRY(run_norm(&r, r.t1, r.a, &vq->norm_out, 1));
    FLEXDIAG_TRY(run_conv(&r, r.t2, r.t1, &vq->conv_out, 0));
    int64_t px = (int64_t)r.h * r.w;
    FLEXDIAG_TRY(k->to_nhwc((float *)r.a, r.t2, n, c->out_channels, (int32_t)px, s));
    return k->copy_d2h(pixels, r.a, (size_t)(n * px * c->out_channels) * sizeof *pixels, s);
}

/* Every id in [0, V): the ops index the codebook without checks. */
static flexdiag_status check_ids(const flexdiag_vq_config *c, const int32_t *ids, int64_t n) {
    int64_t hw = (int64_t)c->grid_h * c->grid_w;
    for (int64_t i = 0; i < n * hw; i++)
        if (ids[i] < 0 || ids[i] >= c->codebook_size)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "image token id %d at index %lld (image %lld, position %lld) is "
                                 "outside the codebook [0, %d)",
                                 ids[i], (long long)i, (long long)(i / hw), (long long)(i % hw),
                                 c->codebook_size);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vq_decode(flexdiag_vq *vq, flexdiag_stream *s, const int32_t *ids,
                                    int64_t n, float *pixels_out) {
    if (!vq || n < 0 || (n > 0 && (!ids || !pixels_out)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "VQ decode: need a decoder, n >= 0, ids and an output buffer");
    const flexdiag_vq_config *c = &vq->cfg;
    FLEXDIAG_TRY(check_ids(c, ids, n));
    int32_t h, w;
    flexdiag__vq_image_size(c, &h, &w);
    int64_t hw = (int64_t)c->grid_h * c->grid_w, px = (int64_t)h * w * c->out_channels;
    for (int64_t i0 = 0; i0 < n; i0 += vq->max_batch) {
        int64_t m = n - i0 < vq->max_batch ? n - i0 : vq->max_batch;
        flexdiag_status st = run_pass(vq, s, ids + i0 * hw, m, pixels_out + i0 * px);
        if (st != FLEXDIAG_OK)
            return flexdiag__err_prefix(st, "VQ decode of images %lld..%lld", (long long)i0,
                                        (long long)(i0 + m - 1));
    }
    return vq->k->stream_sync(s);
}
