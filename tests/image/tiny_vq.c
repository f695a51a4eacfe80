/*
 * tiny_vq.c - small random VQ decoders as model folders, name maps and a naive decoder for the
 * image-decoder tests (see tiny_vq.h). The architecture is spelled out again here from
 * docs/architecture.md §4.4 / transformers' JanusVQVAEDecoder, on purpose apart from runtime/vq.c.
 */
#include "tiny_vq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "naive_vq.h"
#include "runtime/model/safetensors.h"
#include "st_write.h"
#include "util.h"

/* ---- building ---- */

static void add(tv_model *m, tu_rng *r, const char *base, const char *suffix, int ndim,
                const int64_t *shape, double scale, double offset) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->t = realloc(m->t, (size_t)m->cap * sizeof *m->t);
    }
    tv_tensor *t = &m->t[m->n++];
    snprintf(t->name, sizeof t->name, "gen_vision_model.%s%s", base, suffix);
    t->ndim = ndim;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (t->shape[i] = shape[i]);
    t->data = malloc((size_t)numel * sizeof *t->data);
    for (int64_t i = 0; i < numel; i++)
        t->data[i] = flexdiag__f32_to_bf16((float)(offset + scale * tu_rng_normal(r)));
}

static void add_conv(tv_model *m, tu_rng *r, const char *base, int cin, int cout, int k) {
    int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
    add(m, r, base, ".weight", 4, ws, 1.0 / sqrt((double)cin * k * k), 0.0);
    add(m, r, base, ".bias", 1, bs, 0.1, 0.0);
}

static void add_norm(tv_model *m, tu_rng *r, const char *base, int c) {
    int64_t s[1] = {c};
    add(m, r, base, ".weight", 1, s, 0.1, 1.0);
    add(m, r, base, ".bias", 1, s, 0.1, 0.0);
}

static void add_res(tv_model *m, tu_rng *r, const char *base, int cin, int cout) {
    char n[192];
    snprintf(n, sizeof n, "%s.norm1", base), add_norm(m, r, n, cin);
    snprintf(n, sizeof n, "%s.conv1", base), add_conv(m, r, n, cin, cout, 3);
    snprintf(n, sizeof n, "%s.norm2", base), add_norm(m, r, n, cout);
    snprintf(n, sizeof n, "%s.conv2", base), add_conv(m, r, n, cout, cout, 3);
    if (cin != cout)
        snprintf(n, sizeof n, "%s.nin_shortcut", base), add_conv(m, r, n, cin, cout, 1);
}

static void add_attn(tv_model *m, tu_rng *r, const char *base, int c) {
    static const char *p[4] = {"q", "k", "v", "proj_out"};
    char n[192];
    snprintf(n, sizeof n, "%s.norm", base), add_norm(m, r, n, c);
    for (int i = 0; i < 4; i++)
        snprintf(n, sizeof n, "%s.%s", base, p[i]), add_conv(m, r, n, c, c, 1);
}

static int lch(const flexdiag_vq_config *c, int l) { return c->ch * c->ch_mult[l]; }

void tv_build(tv_model *m, const flexdiag_vq_config *c, uint64_t seed) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    int top = lch(c, c->n_levels - 1), cin = top;
    int64_t cb[2] = {c->codebook_size, c->embed_dim};
    add(m, &r, "quantize.embedding", ".weight", 2, cb, 1.0, 0.0);
    add_conv(m, &r, "post_quant_conv", c->embed_dim, c->z_channels, 1);
    add_conv(m, &r, "decoder.conv_in", c->z_channels, top, 3);
    add_res(m, &r, "decoder.mid.0", top, top);
    add_attn(m, &r, "decoder.mid.1", top);
    add_res(m, &r, "decoder.mid.2", top, top);
    for (int b = 0; b < c->n_levels; b++) {
        int lvl = c->n_levels - 1 - b, cout = lch(c, lvl);
        char n[128];
        for (int i = 0; i < c->res_blocks; i++) {
            snprintf(n, sizeof n, "decoder.conv_blocks.%d.res.%d", b, i);
            add_res(m, &r, n, cin, cout);
            cin = cout;
            if (!c->attn[lvl]) continue;
            snprintf(n, sizeof n, "decoder.conv_blocks.%d.attn.%d", b, i);
            add_attn(m, &r, n, cout);
        }
        if (lvl == 0) continue;
        snprintf(n, sizeof n, "decoder.conv_blocks.%d.upsample.conv", b);
        add_conv(m, &r, n, cout, cout, 3);
    }
    add_norm(m, &r, "decoder.norm_out", lch(c, 0));
    add_conv(m, &r, "decoder.conv_out", lch(c, 0), 3, 3);
}

void tv_free(tv_model *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
    free(m->t);
    memset(m, 0, sizeof *m);
}

tv_tensor *tv_get(const tv_model *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

/* ---- files ---- */

char *tv_config_json(const flexdiag_vq_config *c) {
    char mult[128] = "", *p = mult;
    for (int l = 0; l < c->n_levels; l++) p += sprintf(p, "%s%d", l ? ", " : "", c->ch_mult[l]);
    char *s = NULL;
    int w = asprintf(&s,
                     "{\"model_type\": \"janus\",\n \"vq_config\": {\"embed_dim\": %d, "
                     "\"num_embeddings\": %d, \"latent_channels\": %d, \"base_channels\": %d, "
                     "\"channel_multiplier\": [%s], \"num_res_blocks\": %d, \"num_patches\": %d},\n"
                     " \"vision_config\": {\"image_size\": %d, \"patch_size\": 16}}\n",
                     c->embed_dim, c->codebook_size, c->z_channels, c->ch, mult, c->res_blocks - 1,
                     c->grid_h, c->grid_h * 16);
    return w < 0 ? NULL : s;
}

/* Replace the first "from" in buf by "to" (buf has room for n bytes); 1 when replaced. */
static int replace(char *buf, size_t n, const char *from, const char *to) {
    char *at = strstr(buf, from), tmp[512];
    if (!at) return 0;
    snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    snprintf(buf, n, "%s", tmp);
    return 1;
}

int tv_name_to_hf(const char *orig, char *out, size_t n) {
    if (snprintf(out, n, "%s", orig) >= (int)n) return -1;
    replace(out, n, "gen_vision_model.", "model.vqmodel.");
    if (replace(out, n, "decoder.conv_blocks.", "decoder.up.")) replace(out, n, ".res.", ".block.");
    replace(out, n, "decoder.mid.0.", "decoder.mid.block_1.");
    replace(out, n, "decoder.mid.1.", "decoder.mid.attn_1.");
    replace(out, n, "decoder.mid.2.", "decoder.mid.block_2.");
    return 0;
}

int tv_name_from_hf(const char *hf, char *out, size_t n) {
    if (snprintf(out, n, "%s", hf) >= (int)n) return -1;
    if (!replace(out, n, "model.vqmodel.", "gen_vision_model.")) return 0;
    if (replace(out, n, "decoder.up.", "decoder.conv_blocks.")) replace(out, n, ".block.", ".res.");
    replace(out, n, "decoder.mid.block_1.", "decoder.mid.0.");
    replace(out, n, "decoder.mid.attn_1.", "decoder.mid.1.");
    replace(out, n, "decoder.mid.block_2.", "decoder.mid.2.");
    return 0;
}

int tv_name_to_taming(const char *orig, int n_levels, char *out, size_t n) {
    static const char pre[] = "gen_vision_model.";
    if (strncmp(orig, pre, sizeof pre - 1)) return -1;
    const char *rest = orig + sizeof pre - 1;
    int b = 0, used = 0;
    if (sscanf(rest, "decoder.conv_blocks.%d.%n", &b, &used) == 1 && used > 0) {
        const char *tail = rest + used;
        int lvl = n_levels - 1 - b;
        if (!strncmp(tail, "res.", 4))
            return snprintf(out, n, "decoder.up.%d.block.%s", lvl, tail + 4) < (int)n ? 0 : -1;
        return snprintf(out, n, "decoder.up.%d.%s", lvl, tail) < (int)n ? 0 : -1;
    }
    if (snprintf(out, n, "%s", rest) >= (int)n) return -1;
    replace(out, n, "decoder.mid.0.", "decoder.mid.block_1.");
    replace(out, n, "decoder.mid.1.", "decoder.mid.attn_1.");
    replace(out, n, "decoder.mid.2.", "decoder.mid.block_2.");
    return 0;
}

int tv_write_vqgan(const tv_model *m, const char *path, const char *skip,
                   const flexdiag_st_entry *extra) {
    flexdiag_st_entry *e = calloc((size_t)m->n + 1, sizeof *e);
    char(*names)[192] = calloc((size_t)m->n, sizeof *names);
    int64_t k = 0;
    int rc = 0;
    for (int i = 0; i < m->n && rc == 0; i++) {
        rc = tv_name_to_taming(m->t[i].name, m->cfg.n_levels, names[k], sizeof names[k]);
        if (rc || (skip && !strcmp(names[k], skip))) continue;
        e[k] = (flexdiag_st_entry){.name = names[k], .dtype = FLEXDIAG_DTYPE_BF16,
                                   .ndim = m->t[i].ndim, .data = m->t[i].data};
        memcpy(e[k].shape, m->t[i].shape, sizeof m->t[i].shape);
        k++;
    }
    if (extra) e[k++] = *extra;
    if (rc == 0 && flexdiag__st_write(path, e, k) != FLEXDIAG_OK) rc = -1;
    free(e);
    free(names);
    return rc;
}

int tv_write(const tv_model *m, const char *dir, int hf, const char *skip) {
    char path[4096];
    char *cfg = tv_config_json(&m->cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = tu_write_file(path, cfg, strlen(cfg));
    free(cfg);
    flexdiag_st_entry *e = calloc((size_t)m->n, sizeof *e);
    char(*names)[192] = calloc((size_t)m->n, sizeof *names);
    int64_t k = 0;
    for (int i = 0; i < m->n; i++) {
        if (skip && !strcmp(m->t[i].name, skip)) continue;
        if (hf)
            tv_name_to_hf(m->t[i].name, names[k], sizeof names[k]);
        else
            snprintf(names[k], sizeof names[k], "%s", m->t[i].name);
        e[k].name = names[k];
        e[k].dtype = FLEXDIAG_DTYPE_BF16;
        e[k].ndim = m->t[i].ndim;
        memcpy(e[k].shape, m->t[i].shape, sizeof m->t[i].shape);
        e[k].data = m->t[i].data;
        k++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == 0 && flexdiag__st_write(path, e, k) != FLEXDIAG_OK) rc = -1;
    free(e);
    free(names);
    return rc;
}

/* ---- naive decoder ---- */

typedef struct nv {
    const tv_model *m;
    int64_t n;
    int h, w;
} nv;

static const uint16_t *W(const nv *v, const char *base, const char *suffix) {
    char name[256];
    snprintf(name, sizeof name, "gen_vision_model.%s%s", base, suffix);
    tv_tensor *t = tv_get(v->m, name);
    if (!t) {
        fprintf(stderr, "naive decoder: no tensor %s\n", name);
        abort();
    }
    return t->data;
}

static double *alloc_act(const nv *v, int c) {
    return malloc((size_t)(v->n * c * v->h * v->w) * sizeof(double));
}

static double *conv(const nv *v, const char *base, const double *x, int cin, int cout, int k) {
    double *o = alloc_act(v, cout);
    naive_conv2d(o, x, W(v, base, ".weight"), W(v, base, ".bias"), v->n, cin, cout, v->h, v->w, k);
    return o;
}

static double *norm(const nv *v, const char *base, const double *x, int c, int swish) {
    double *o = alloc_act(v, c);
    naive_groupnorm(o, x, W(v, base, ".weight"), W(v, base, ".bias"), v->n, c, v->h * v->w,
                    v->m->cfg.groups, (double)v->m->cfg.eps, swish);
    return o;
}

/* x (consumed) -> ResBlock(x) */
static double *res(const nv *v, const char *base, double *x, int cin, int cout) {
    char n[192];
    snprintf(n, sizeof n, "%s.norm1", base);
    double *h1 = norm(v, n, x, cin, 1);
    snprintf(n, sizeof n, "%s.conv1", base);
    double *h2 = conv(v, n, h1, cin, cout, 3);
    snprintf(n, sizeof n, "%s.norm2", base);
    double *h3 = norm(v, n, h2, cout, 1);
    snprintf(n, sizeof n, "%s.conv2", base);
    double *h4 = conv(v, n, h3, cout, cout, 3);
    double *sc = x;
    if (cin != cout)
        snprintf(n, sizeof n, "%s.nin_shortcut", base), sc = conv(v, n, x, cin, cout, 1);
    for (int64_t i = 0; i < v->n * cout * v->h * v->w; i++) h4[i] += sc[i];
    if (sc != x) free(sc);
    free(x), free(h1), free(h2), free(h3);
    return h4;
}

/* x (consumed) -> x + proj_out(attention(norm(x))) */
static double *attn(const nv *v, const char *base, double *x, int c) {
    char n[192];
    snprintf(n, sizeof n, "%s.norm", base);
    double *hn = norm(v, n, x, c, 0);
    snprintf(n, sizeof n, "%s.q", base);
    double *q = conv(v, n, hn, c, c, 1);
    snprintf(n, sizeof n, "%s.k", base);
    double *k = conv(v, n, hn, c, c, 1);
    snprintf(n, sizeof n, "%s.v", base);
    double *vv = conv(v, n, hn, c, c, 1), *a = alloc_act(v, c);
    naive_attn_spatial(a, q, k, vv, v->n, c, v->h * v->w);
    snprintf(n, sizeof n, "%s.proj_out", base);
    double *p = conv(v, n, a, c, c, 1);
    for (int64_t i = 0; i < v->n * c * v->h * v->w; i++) p[i] += x[i];
    free(x), free(hn), free(q), free(k), free(vv), free(a);
    return p;
}

/* Codebook rows of ids as (n, e, hw), L2-normalised when the config says so. */
static double *lookup(const nv *v, const int32_t *ids) {
    const flexdiag_vq_config *c = &v->m->cfg;
    const uint16_t *cb = W(v, "quantize.embedding", ".weight");
    int hw = c->grid_h * c->grid_w, e = c->embed_dim;
    double *z = malloc((size_t)(v->n * e * hw) * sizeof *z);
    for (int64_t i = 0; i < v->n; i++)
        for (int j = 0; j < hw; j++) {
            const uint16_t *row = cb + (int64_t)ids[i * hw + j] * e;
            double ss = 0;
            for (int d = 0; d < e; d++) ss += pow(flexdiag__bf16_to_f32(row[d]), 2);
            double nrm = c->l2_codebook ? fmax(sqrt(ss), 1e-12) : 1.0;
            for (int d = 0; d < e; d++)
                z[(i * e + d) * hw + j] = flexdiag__bf16_to_f32(row[d]) / nrm;
        }
    return z;
}

void tv_naive_decode(const tv_model *m, const int32_t *ids, int64_t n, double *pixels) {
    const flexdiag_vq_config *c = &m->cfg;
    nv v = {m, n, c->grid_h, c->grid_w};
    int top = lch(c, c->n_levels - 1), cin = top;
    double *z = lookup(&v, ids),
           *x = conv(&v, "post_quant_conv", z, c->embed_dim, c->z_channels, 1);
    free(z);
    double *y = conv(&v, "decoder.conv_in", x, c->z_channels, top, 3);
    free(x);
    y = res(&v, "decoder.mid.0", y, top, top);
    y = attn(&v, "decoder.mid.1", y, top);
    y = res(&v, "decoder.mid.2", y, top, top);
    for (int b = 0; b < c->n_levels; b++) {
        int lvl = c->n_levels - 1 - b, cout = lch(c, lvl);
        char name[128];
        for (int i = 0; i < c->res_blocks; i++) {
            snprintf(name, sizeof name, "decoder.conv_blocks.%d.res.%d", b, i);
            y = res(&v, name, y, cin, cout);
            cin = cout;
            if (!c->attn[lvl]) continue;
            snprintf(name, sizeof name, "decoder.conv_blocks.%d.attn.%d", b, i);
            y = attn(&v, name, y, cout);
        }
        if (lvl == 0) continue;
        double *u = malloc((size_t)(n * cout * v.h * v.w * 4) * sizeof *u);
        naive_upsample2x(u, y, n, cout, v.h, v.w);
        free(y);
        v.h *= 2, v.w *= 2;
        snprintf(name, sizeof name, "decoder.conv_blocks.%d.upsample.conv", b);
        y = conv(&v, name, u, cout, cout, 3);
        free(u);
    }
    double *o = norm(&v, "decoder.norm_out", y, lch(c, 0), 1);
    double *rgb = conv(&v, "decoder.conv_out", o, lch(c, 0), 3, 3);
    int64_t hw = (int64_t)v.h * v.w;
    for (int64_t i = 0; i < n; i++)
        for (int ch = 0; ch < 3; ch++)
            for (int64_t j = 0; j < hw; j++)
                pixels[(i * hw + j) * 3 + ch] = rgb[(i * 3 + ch) * hw + j];
    free(y), free(o), free(rgb);
}

flexdiag_vq_config tv_tiny_config(void) {
    flexdiag_vq_config c;
    flexdiag__vq_config_default(&c);
    c.codebook_size = 40;
    c.z_channels = 32;
    c.ch = 32;
    c.n_levels = 3;
    c.ch_mult[0] = 1, c.ch_mult[1] = 1, c.ch_mult[2] = 2;
    memset(c.attn, 0, sizeof c.attn);
    c.attn[2] = 1;
    c.res_blocks = 2;
    c.grid_h = c.grid_w = 3;
    return c;
}
