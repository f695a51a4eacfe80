/*
 * vq_config.c - the image decoder's shape: Janus VQ-16 from config.json (docs/formats.md §2.3),
 * for both of its checkpoint layouts; the taming / Chameleon VQGAN from the tensor shapes of
 * its safetensors file (no config file exists for it); and the validation of either.
 *
 * transformers `janus`: vq_config, absent fields taking the JanusVQVAEConfig defaults (the
 * VQ-16 shape); the decoder has num_res_blocks + 1 ResBlocks per level; the grid is
 * vq_config.num_patches, which JanusConfig sets to the vision config's image_size //
 * patch_size. deepseek-ai `multi_modality`: gen_vision_config.params gives the codebook
 * (image_token_size, n_embed); everything else is fixed by the VQ-16 class.
 * In both, only the lowest-resolution level has attention blocks (LlamaGen's Decoder and
 * transformers' JanusVQVAEDecoder: `if i_level == num_resolutions - 1`).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/core.h"
#include "runtime/image/vq.h"
#include "runtime/json_where.h"

void flexdiag__vq_config_default(flexdiag_vq_config *c) {
    static const int32_t mult[5] = {1, 1, 2, 2, 4};
    memset(c, 0, sizeof *c);
    c->codebook_size = 16384;
    c->embed_dim = 8;
    c->z_channels = 256;
    c->ch = 128;
    c->n_levels = 5;
    memcpy(c->ch_mult, mult, sizeof mult);
    c->attn[4] = 1;
    c->res_blocks = 3;
    c->out_channels = 3;
    c->grid_h = c->grid_w = 24;
    c->groups = 32;
    c->eps = 1e-6f;
    c->layout = FLEXDIAG_VQ_LAYOUT_JANUS;
    c->l2_codebook = 1; /* LlamaGen's VectorQuantizer(l2_norm=True) */
}

void flexdiag__vq_config_chameleon(flexdiag_vq_config *c) {
    flexdiag__vq_config_default(c); /* ch, z, ch_mult, res blocks, groups, eps are VQ-16's too */
    c->codebook_size = 8192;
    c->embed_dim = 256;
    memset(c->attn, 0, sizeof c->attn); /* taming attn_resolutions = [] */
    c->grid_h = c->grid_w = 32;
    c->layout = FLEXDIAG_VQ_LAYOUT_TAMING;
    c->l2_codebook = 0;
}

/* Integer field key of o (default def when absent or null), checked against [lo, hi]. */
static flexdiag_status json_int(json_t *o, const char *key, int32_t def, int32_t lo, int32_t hi,
                                const char *path, const char *section, int32_t *out) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (!v || json_is_null(v)) {
        *out = def;
        return FLEXDIAG_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: %s.%s must be an integer in [%d, %d]", path, section, key, lo,
                             hi);
    *out = (int32_t)json_integer_value(v);
    return FLEXDIAG_OK;
}

static flexdiag_status parse_ch_mult(json_t *vq, const char *path, flexdiag_vq_config *c) {
    json_t *a = json_object_get(vq, "channel_multiplier");
    if (!a || json_is_null(a)) return FLEXDIAG_OK; /* keep the (1,1,2,2,4) default */
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > FLEXDIAG_VQ_MAX_LEVELS)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: vq_config.channel_multiplier must be a list of 1 to %d "
                             "integers",
                             path, FLEXDIAG_VQ_MAX_LEVELS);
    c->n_levels = (int32_t)json_array_size(a);
    for (int32_t l = 0; l < c->n_levels; l++) {
        json_t *v = json_array_get(a, (size_t)l);
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 64)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: vq_config.channel_multiplier[%d] must be an integer in "
                                 "[1, 64]",
                                 path, l);
        c->ch_mult[l] = (int32_t)json_integer_value(v);
    }
    return FLEXDIAG_OK;
}

/* transformers `janus`: vq_config with JanusVQVAEConfig defaults for absent fields; the grid
 * is vq_config.num_patches, which JanusConfig sets to vision image_size // patch_size. */
static flexdiag_status parse_janus_hf(json_t *root, const char *path, flexdiag_vq_config *c) {
    json_t *vq = json_object_get(root, "vq_config"), *vis = json_object_get(root, "vision_config");
    const char *s = "vq_config";
    int32_t nrb = 0, img = 0, patch = 0;
    if (!json_is_object(vq))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: vq_config must be an object", path);
    FLEXDIAG_TRY(json_int(vq, "num_embeddings", 16384, 1, 1 << 30, path, s, &c->codebook_size));
    FLEXDIAG_TRY(json_int(vq, "embed_dim", 8, 1, 4096, path, s, &c->embed_dim));
    FLEXDIAG_TRY(json_int(vq, "latent_channels", 256, 1, 65536, path, s, &c->z_channels));
    FLEXDIAG_TRY(json_int(vq, "base_channels", 128, 1, 65536, path, s, &c->ch));
    FLEXDIAG_TRY(json_int(vq, "num_res_blocks", 2, 0, FLEXDIAG_VQ_MAX_RES - 1, path, s, &nrb));
    FLEXDIAG_TRY(json_int(vq, "out_channels", 3, 1, 64, path, s, &c->out_channels));
    FLEXDIAG_TRY(parse_ch_mult(vq, path, c));
    FLEXDIAG_TRY(json_int(vis, "image_size", 384, 1, 1 << 20, path, "vision_config", &img));
    FLEXDIAG_TRY(json_int(vis, "patch_size", 16, 1, 1 << 20, path, "vision_config", &patch));
    FLEXDIAG_TRY(json_int(vq, "num_patches", img / patch, 1, 4096, path, s, &c->grid_h));
    c->grid_w = c->grid_h;
    c->res_blocks = nrb + 1; /* the decoder has one more ResBlock per level than the encoder */
    memset(c->attn, 0, sizeof c->attn);
    c->attn[c->n_levels - 1] = 1;
    return FLEXDIAG_OK;
}

/* deepseek-ai `multi_modality`: gen_vision_config {cls: "VQ-16", params: {image_token_size,
 * n_embed}}; the rest of the shape is fixed by the VQ-16 class. */
static flexdiag_status parse_janus_original(json_t *root, const char *path,
                                            flexdiag_vq_config *c) {
    json_t *gv = json_object_get(root, "gen_vision_config");
    json_t *cls = json_object_get(gv, "cls"), *params = json_object_get(gv, "params");
    if (cls && !(json_is_string(cls) && !strcmp(json_string_value(cls), "VQ-16")))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: gen_vision_config.cls is %s; only the VQ-16 image decoder is "
                             "supported",
                             path, json_is_string(cls) ? json_string_value(cls) : "not a string");
    const char *s = "gen_vision_config.params";
    FLEXDIAG_TRY(json_int(params, "image_token_size", 16384, 1, 1 << 30, path, s,
                          &c->codebook_size));
    return json_int(params, "n_embed", 8, 1, 4096, path, s, &c->embed_dim);
}

static flexdiag_status parse_root(json_t *root, const char *path, flexdiag_vq_config *out) {
    flexdiag_vq_config c;
    flexdiag__vq_config_default(&c);
    if (!json_is_object(root))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: not a JSON object", path);
    /* Chameleon's config.json also has a vq_config (transformers' ChameleonVQVAEConfig), but its
     * taming VQGAN is another layout whose shape comes from the decoder file itself */
    json_t *mt = json_object_get(root, "model_type");
    if (json_is_string(mt) && !strcmp(json_string_value(mt), "chameleon"))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: a Chameleon model's image decoder is the taming VQGAN read "
                             "from its vqgan.safetensors (flexdiag__vq_open_vqgan), not from "
                             "config.json's vq_config",
                             path);
    if (json_object_get(root, "vq_config")) FLEXDIAG_TRY(parse_janus_hf(root, path, &c));
    else if (json_object_get(root, "gen_vision_config"))
        FLEXDIAG_TRY(parse_janus_original(root, path, &c));
    else
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: no vq_config (transformers janus) or gen_vision_config "
                             "(deepseek-ai multi_modality): the model has no VQ-16 image decoder",
                             path);
    FLEXDIAG_TRY(flexdiag__vq_config_validate(&c));
    *out = c;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vq_config_parse(const char *json_text, const char *path,
                                          flexdiag_vq_config *out) {
    json_error_t je;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &je);
    char where[48];
    if (!root)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: invalid JSON%s: %s", path,
                             flexdiag__json_where(&je, where, sizeof where), je.text);
    flexdiag_status st = parse_root(root, path, out);
    json_decref(root);
    return st;
}

flexdiag_status flexdiag__vq_config_read(const char *path, flexdiag_vq_config *out) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        FILE *f = fopen(path, "rb");
        if (!f)
            return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND,
                                 "%s: cannot open the model config (%s): pass the model folder "
                                 "that holds config.json",
                                 path, strerror(errno));
        fclose(f);
        char where[48];
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: invalid JSON%s: %s", path,
                             flexdiag__json_where(&je, where, sizeof where), je.text);
    }
    flexdiag_status st = parse_root(root, path, out);
    json_decref(root);
    return st;
}

static flexdiag_status bad_cfg(const char *field, int64_t v, const char *need) {
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "VQ config: %s = %lld: %s", field,
                         (long long)v, need);
}

flexdiag_status flexdiag__vq_config_validate(const flexdiag_vq_config *c) {
    if (c->codebook_size < 1) return bad_cfg("codebook_size", c->codebook_size, "must be >= 1");
    if (c->embed_dim < 1 || c->embed_dim > 4096)
        return bad_cfg("embed_dim", c->embed_dim, "must be in [1, 4096]");
    if (c->z_channels < 1 || c->z_channels > 65536)
        return bad_cfg("z_channels", c->z_channels, "must be in [1, 65536]");
    if (c->n_levels < 1 || c->n_levels > FLEXDIAG_VQ_MAX_LEVELS)
        return bad_cfg("n_levels", c->n_levels, "must be in [1, 8]");
    if (c->res_blocks < 1 || c->res_blocks > FLEXDIAG_VQ_MAX_RES)
        return bad_cfg("res_blocks", c->res_blocks, "must be in [1, 8]");
    if (c->out_channels != 3)
        return bad_cfg("out_channels", c->out_channels, "the decoder must output RGB (3)");
    if (c->groups < 1) return bad_cfg("groups", c->groups, "must be >= 1");
    if (c->layout != FLEXDIAG_VQ_LAYOUT_JANUS && c->layout != FLEXDIAG_VQ_LAYOUT_TAMING)
        return bad_cfg("layout", c->layout, "must be 0 (Janus) or 1 (taming VQGAN)");
    if (c->l2_codebook != 0 && c->l2_codebook != 1)
        return bad_cfg("l2_codebook", c->l2_codebook, "must be 0 or 1");
    if (!(c->eps > 0.0f) || !isfinite(c->eps)) return bad_cfg("eps", 0, "must be > 0");
    for (int32_t l = 0; l < c->n_levels; l++) {
        int64_t ch = (int64_t)c->ch * c->ch_mult[l];
        if (c->ch < 1 || c->ch_mult[l] < 1 || ch > 65536)
            return bad_cfg("ch * ch_mult[level]", ch, "must be in [1, 65536]");
        if (ch % c->groups) {
            char need[96];
            snprintf(need, sizeof need, "GroupNorm needs a multiple of the group count (%d)",
                     c->groups);
            return bad_cfg("ch * ch_mult[level]", ch, need);
        }
    }
    int64_t scale = (int64_t)1 << (c->n_levels - 1);
    if (c->grid_h < 1 || c->grid_w < 1 || c->grid_h * scale > 32768 || c->grid_w * scale > 32768)
        return bad_cfg("grid", c->grid_h, "image side (grid · 2^(levels-1)) must be <= 32768");
    if ((int64_t)c->grid_h * scale * c->grid_w * scale > INT32_MAX)
        return bad_cfg("grid", c->grid_h, "image must have fewer than 2^31 pixels");
    return FLEXDIAG_OK;
}

void flexdiag__vq_image_size(const flexdiag_vq_config *c, int32_t *h, int32_t *w) {
    *h = c->grid_h << (c->n_levels - 1);
    *w = c->grid_w << (c->n_levels - 1);
}

/* ---- taming / Chameleon VQGAN: the shape from the tensor shapes ---- */

/* Tensor name of st, or an error naming the file and what the VQGAN decoder reads it for;
 * ndim checked. */
static flexdiag_status vqgan_need(const flexdiag_safetensors *st, const char *file,
                                  const char *name, int32_t ndim, const char *what,
                                  const flexdiag_st_tensor **out) {
    const flexdiag_st_tensor *t = flexdiag__st_find(st, name);
    if (!t)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s' is missing; a taming / Chameleon VQGAN decoder "
                             "file needs it (%s; names without a prefix)",
                             file, name, what);
    if (t->ndim != ndim)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s' has %d dimensions, the VQGAN decoder needs %d (%s)",
                             file, name, (int)t->ndim, (int)ndim, what);
    *out = t;
    return FLEXDIAG_OK;
}

/* Dimension d of a tensor as a size the config holds: in [1, hi]. */
static flexdiag_status vqgan_dim(const char *file, const flexdiag_st_tensor *t, int32_t d,
                                 int32_t hi, int32_t *out) {
    if (t->shape[d] < 1 || t->shape[d] > hi)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%s' has dimension %d = %lld, outside [1, %d]", file,
                             t->name, (int)d, (long long)t->shape[d], (int)hi);
    *out = (int32_t)t->shape[d];
    return FLEXDIAG_OK;
}

/* Count of consecutive indices i = 0, 1, ... for which fmt (with i, or with a then i) names a
 * tensor of st; stops after limit + 1 so that an oversize layout is seen. */
static int32_t vqgan_count(const flexdiag_safetensors *st, const char *fmt, int32_t a,
                           int32_t limit) {
    char name[160];
    int32_t i = 0;
    for (; i <= limit; i++) {
        if (a < 0) snprintf(name, sizeof name, fmt, (int)i);
        else snprintf(name, sizeof name, fmt, (int)a, (int)i);
        if (!flexdiag__st_find(st, name)) break;
    }
    return i;
}

/* Levels (decoder.up.L) and ResBlocks per level (up.0.block.R), each within the limits. */
static flexdiag_status vqgan_depth(const flexdiag_safetensors *st, const char *file,
                                   flexdiag_vq_config *c) {
    c->n_levels = vqgan_count(st, "decoder.up.%d.block.0.conv1.weight", -1, FLEXDIAG_VQ_MAX_LEVELS);
    if (c->n_levels == 0)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor 'decoder.up.0.block.0.conv1.weight' is missing; a taming "
                             "/ Chameleon VQGAN decoder file needs it (the full-resolution level; "
                             "names without a prefix)",
                             file);
    if (c->n_levels > FLEXDIAG_VQ_MAX_LEVELS)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: the decoder has more than %d levels (decoder.up.%d exists)",
                             file, FLEXDIAG_VQ_MAX_LEVELS, FLEXDIAG_VQ_MAX_LEVELS);
    c->res_blocks = vqgan_count(st, "decoder.up.%d.block.%d.conv1.weight", 0, FLEXDIAG_VQ_MAX_RES);
    if (c->res_blocks > FLEXDIAG_VQ_MAX_RES)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: the decoder has more than %d ResBlocks per level "
                             "(decoder.up.0.block.%d exists)",
                             file, FLEXDIAG_VQ_MAX_RES, FLEXDIAG_VQ_MAX_RES);
    return FLEXDIAG_OK;
}

/* ch_mult[l] = channels of level l (its block.0.conv1 output) / ch, and the level attention. */
static flexdiag_status vqgan_levels(const flexdiag_safetensors *st, const char *file,
                                    flexdiag_vq_config *c) {
    char name[160];
    for (int32_t l = 0; l < c->n_levels; l++) {
        const flexdiag_st_tensor *t = NULL;
        int32_t co = 0;
        snprintf(name, sizeof name, "decoder.up.%d.block.0.conv1.weight", (int)l);
        FLEXDIAG_TRY(vqgan_need(st, file, name, 4, "the channels of its level", &t));
        FLEXDIAG_TRY(vqgan_dim(file, t, 0, 65536, &co));
        if (co % c->ch)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%s' has %d output channels, not a multiple of the "
                                 "%d base channels of decoder.conv_out.weight",
                                 file, name, (int)co, (int)c->ch);
        c->ch_mult[l] = co / c->ch;
        snprintf(name, sizeof name, "decoder.up.%d.attn.0.norm.weight", (int)l);
        c->attn[l] = flexdiag__st_find(st, name) != NULL;
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vq_config_vqgan(const flexdiag_safetensors *st, int32_t grid_h,
                                          int32_t grid_w, int32_t groups,
                                          flexdiag_vq_config *out) {
    if (!st || !out || groups < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "VQGAN config: need a checkpoint, an output and groups >= 0");
    const char *file = flexdiag__st_count(st) ? flexdiag__st_file_path(st, 0) : "checkpoint";
    const flexdiag_st_tensor *cb = NULL, *cin = NULL, *cout = NULL;
    flexdiag_vq_config c;
    flexdiag__vq_config_default(&c);
    memset(c.attn, 0, sizeof c.attn);
    memset(c.ch_mult, 0, sizeof c.ch_mult);
    c.layout = FLEXDIAG_VQ_LAYOUT_TAMING;
    c.l2_codebook = 0; /* taming's VectorQuantizer2 looks rows up as stored */
    c.groups = groups ? groups : FLEXDIAG_VQGAN_GROUPS;
    c.grid_h = grid_h;
    c.grid_w = grid_w;
    FLEXDIAG_TRY(vqgan_need(st, file, "quantize.embedding.weight", 2, "the codebook", &cb));
    if (flexdiag__st_find(st, "quantize.used")) /* VectorQuantizer2(remap=...) */
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: tensor 'quantize.used' means the codes are remapped (taming's "
                             "remap); flexdiag decodes plain codebook indices only",
                             file);
    FLEXDIAG_TRY(vqgan_dim(file, cb, 0, 1 << 30, &c.codebook_size));
    FLEXDIAG_TRY(vqgan_dim(file, cb, 1, 4096, &c.embed_dim));
    FLEXDIAG_TRY(vqgan_need(st, file, "decoder.conv_in.weight", 4, "z_channels", &cin));
    FLEXDIAG_TRY(vqgan_dim(file, cin, 1, 65536, &c.z_channels));
    FLEXDIAG_TRY(vqgan_need(st, file, "decoder.conv_out.weight", 4, "the base channels", &cout));
    FLEXDIAG_TRY(vqgan_dim(file, cout, 1, 65536, &c.ch));
    FLEXDIAG_TRY(vqgan_dim(file, cout, 0, 64, &c.out_channels));
    FLEXDIAG_TRY(vqgan_depth(st, file, &c));
    FLEXDIAG_TRY(vqgan_levels(st, file, &c));
    flexdiag_status s = flexdiag__vq_config_validate(&c);
    if (s != FLEXDIAG_OK) return flexdiag__err_prefix(s, "%s (VQGAN shape from the file)", file);
    *out = c;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vqgan_find(const char *dir, int32_t grid, flexdiag_vq_config *vc,
                                     flexdiag_safetensors **st) {
    *st = NULL;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/vqgan.safetensors", dir) >= (int)sizeof path)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: model path too long", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return FLEXDIAG_OK; /* no decoder supplied: token grids only */
    fclose(f);
    FLEXDIAG_TRY(flexdiag__st_open(path, st));
    flexdiag_status r = flexdiag__vq_config_vqgan(*st, grid, grid, 0, vc);
    if (r != FLEXDIAG_OK) {
        flexdiag__st_close(*st);
        *st = NULL;
    }
    return r;
}
