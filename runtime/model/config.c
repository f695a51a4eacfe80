/*
 * config.c - model configuration from config.json (+ generation_config.json), and the builtin
 * shapes used for random-weight runs.
 *
 * Three layouts (docs/formats.md §2.2):
 *   multi_modality (deepseek-ai original): language_config (LlamaConfig defaults for missing
 *       fields), gen_vision_config / gen_aligner_config / gen_head_config `params`;
 *   janus (transformers): text_config + vq_config (embed_dim, num_embeddings, projection_dim,
 *       num_hidden_layers, image_token_embed_dim, num_patches);
 *   llama: the LlamaConfig fields themselves.
 * Unsupported features (rope_scaling, non-silu activations, biases) fail here with the field
 * named, before any weight is read. Special ids come from generation_config.json when present;
 * the model loader fills the rest from the tokenizer.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/core.h"
#include "runtime/model/model.h"

/* ---- JSON field access ---- */

typedef struct cfg_ctx {
    const char *file;    /* path for messages */
    const char *section; /* "text_config" etc. for messages ("" at top level) */
} cfg_ctx;

static flexdiag_status get_int(const cfg_ctx *c, json_t *o, const char *key, int32_t def,
                               int32_t *out) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (!v || json_is_null(v)) {
        *out = def;
        return FLEXDIAG_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: %s%s%s must be an integer in range",
                             c->file, c->section, *c->section ? "." : "", key);
    *out = (int32_t)json_integer_value(v);
    return FLEXDIAG_OK;
}

static flexdiag_status get_num(const cfg_ctx *c, json_t *o, const char *key, float def,
                               float *out) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (!v || json_is_null(v)) {
        *out = def;
        return FLEXDIAG_OK;
    }
    if (!json_is_number(v))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: %s%s%s must be a number", c->file,
                             c->section, *c->section ? "." : "", key);
    *out = (float)json_number_value(v);
    return FLEXDIAG_OK;
}

static bool get_bool(json_t *o, const char *key, bool def) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static json_t *get_params(json_t *root, const char *key) {
    json_t *o = json_object_get(root, key);
    json_t *p = o ? json_object_get(o, "params") : NULL;
    return json_is_object(p) ? p : NULL;
}

/* ---- Llama decoder fields (docs/formats.md §2.2), with LlamaConfig defaults ---- */

static flexdiag_status reject_unsupported(const cfg_ctx *c, json_t *o) {
    json_t *act = json_object_get(o, "hidden_act");
    if (act && !(json_is_string(act) && !strcmp(json_string_value(act), "silu")))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s: %s.hidden_act must be \"silu\"",
                             c->file, c->section);
    json_t *rs = json_object_get(o, "rope_scaling");
    if (rs && !json_is_null(rs))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: %s.rope_scaling is set; only plain RoPE is supported", c->file,
                             c->section);
    if (get_bool(o, "attention_bias", false) || get_bool(o, "mlp_bias", false))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: %s: attention_bias / mlp_bias are not supported", c->file,
                             c->section);
    return FLEXDIAG_OK;
}

static flexdiag_status parse_lm(const cfg_ctx *c, json_t *o, flexdiag_lm_config *lm) {
    FLEXDIAG_TRY(reject_unsupported(c, o));
    FLEXDIAG_TRY(get_int(c, o, "hidden_size", 4096, &lm->hidden));
    FLEXDIAG_TRY(get_int(c, o, "intermediate_size", 11008, &lm->ffn));
    FLEXDIAG_TRY(get_int(c, o, "num_hidden_layers", 32, &lm->layers));
    FLEXDIAG_TRY(get_int(c, o, "num_attention_heads", 32, &lm->heads));
    FLEXDIAG_TRY(get_int(c, o, "num_key_value_heads", lm->heads, &lm->kv_heads));
    int32_t hd_def = lm->heads > 0 ? lm->hidden / lm->heads : 0;
    FLEXDIAG_TRY(get_int(c, o, "head_dim", hd_def, &lm->head_dim));
    FLEXDIAG_TRY(get_int(c, o, "vocab_size", 32000, &lm->vocab));
    FLEXDIAG_TRY(get_int(c, o, "max_position_embeddings", 2048, &lm->max_pos));
    FLEXDIAG_TRY(get_num(c, o, "rms_norm_eps", 1e-6f, &lm->rms_eps));
    FLEXDIAG_TRY(get_num(c, o, "rope_theta", 10000.0f, &lm->rope_theta));
    json_t *rp = json_object_get(o, "rope_parameters"); /* transformers >= 5 stores theta here */
    if (json_is_object(rp)) {
        json_t *ty = json_object_get(rp, "rope_type");
        if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "default")))
            return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                                 "%s: %s.rope_parameters.rope_type must be \"default\"", c->file,
                                 c->section);
        FLEXDIAG_TRY(get_num(c, rp, "rope_theta", lm->rope_theta, &lm->rope_theta));
    }
    lm->tie_embed = get_bool(o, "tie_word_embeddings", false);
    return FLEXDIAG_OK;
}

/* ---- the three layouts ---- */

static flexdiag_status parse_janus_original(const cfg_ctx *c, json_t *root,
                                            flexdiag_model_config *m) {
    cfg_ctx lc = {c->file, "language_config"};
    FLEXDIAG_TRY(parse_lm(&lc, json_object_get(root, "language_config"), &m->lm));
    m->lm.tie_embed = false;
    cfg_ctx gc = {c->file, "gen_*_config.params"};
    json_t *vis = get_params(root, "gen_vision_config"), *al = get_params(root, "gen_aligner_config");
    json_t *hd = get_params(root, "gen_head_config");
    FLEXDIAG_TRY(get_int(&gc, vis, "image_token_size", 16384, &m->image_vocab));
    FLEXDIAG_TRY(get_int(&gc, vis, "n_embed", 8, &m->image_embed));
    FLEXDIAG_TRY(get_int(&gc, al, "n_embed", m->lm.hidden, &m->aligner_dim));
    FLEXDIAG_TRY(get_int(&gc, al, "depth", 2, &m->aligner_depth));
    FLEXDIAG_TRY(get_int(&gc, hd, "n_embed", m->lm.hidden, &m->head_dim_mid));
    int32_t head_in = 0, head_out = 0, align_in = 0;
    FLEXDIAG_TRY(get_int(&gc, hd, "image_token_embed", m->lm.hidden, &head_in));
    FLEXDIAG_TRY(get_int(&gc, hd, "image_token_size", m->image_vocab, &head_out));
    FLEXDIAG_TRY(get_int(&gc, al, "input_dim", m->image_embed, &align_in));
    if (head_in != m->lm.hidden || head_out != m->image_vocab || align_in != m->image_embed)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: gen_head/gen_aligner sizes disagree with the language model "
                             "(image_token_embed %d vs hidden %d, image_token_size %d vs %d, "
                             "input_dim %d vs n_embed %d)",
                             c->file, head_in, m->lm.hidden, head_out, m->image_vocab, align_in,
                             m->image_embed);
    m->grid = 24; /* VQ-16 at 384 px (docs/architecture.md §4.1 step 7) */
    return FLEXDIAG_OK;
}

static flexdiag_status parse_janus_hf(const cfg_ctx *c, json_t *root, flexdiag_model_config *m) {
    cfg_ctx tc = {c->file, "text_config"}, vc = {c->file, "vq_config"};
    FLEXDIAG_TRY(parse_lm(&tc, json_object_get(root, "text_config"), &m->lm));
    json_t *vq = json_object_get(root, "vq_config");
    int32_t head_in = 0;
    FLEXDIAG_TRY(get_int(&vc, vq, "embed_dim", 8, &m->image_embed));
    FLEXDIAG_TRY(get_int(&vc, vq, "num_embeddings", 16384, &m->image_vocab));
    FLEXDIAG_TRY(get_int(&vc, vq, "projection_dim", 2048, &m->aligner_dim));
    FLEXDIAG_TRY(get_int(&vc, vq, "num_hidden_layers", 2, &m->aligner_depth));
    FLEXDIAG_TRY(get_int(&vc, vq, "image_token_embed_dim", 2048, &head_in));
    m->head_dim_mid = m->aligner_dim;
    json_t *act = json_object_get(vq, "hidden_act");
    if (act && !(json_is_string(act) && !strcmp(json_string_value(act), "gelu")))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s: vq_config.hidden_act must be \"gelu\"",
                             c->file);
    if (head_in != m->lm.hidden)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: vq_config.image_token_embed_dim %d differs from "
                             "text_config.hidden_size %d",
                             c->file, head_in, m->lm.hidden);
    json_t *vis = json_object_get(root, "vision_config");
    int32_t img = 384, patch = 16;
    cfg_ctx sc = {c->file, "vision_config"};
    FLEXDIAG_TRY(get_int(&sc, vis, "image_size", 384, &img));
    FLEXDIAG_TRY(get_int(&sc, vis, "patch_size", 16, &patch));
    FLEXDIAG_TRY(get_int(&vc, vq, "num_patches", patch > 0 ? img / patch : 0, &m->grid));
    return FLEXDIAG_OK;
}

/* generation_config.json as transformers writes it for Janus: bos/pad at top level,
 * boi under generation_kwargs. Missing file or fields leave -1. */
static flexdiag_status read_generation_config(const char *dir, flexdiag_model_config *m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_error_t je;
    json_t *g = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!g) return FLEXDIAG_OK;
    cfg_ctx c = {path, ""};
    flexdiag_status st = get_int(&c, g, "bos_token_id", m->bos_id, &m->bos_id);
    if (st == FLEXDIAG_OK) st = get_int(&c, g, "pad_token_id", m->pad_id, &m->pad_id);
    json_t *kw = json_object_get(g, "generation_kwargs");
    if (st == FLEXDIAG_OK) st = get_int(&c, kw, "boi_token_id", m->boi_id, &m->boi_id);
    json_decref(g);
    return st;
}

static flexdiag_status parse_root(const cfg_ctx *c, json_t *root, flexdiag_model_config *m) {
    json_t *mt = json_object_get(root, "model_type");
    const char *type = json_is_string(mt) ? json_string_value(mt) : "";
    if (json_object_get(root, "language_config") || !strcmp(type, "multi_modality")) {
        m->arch = FLEXDIAG_ARCH_JANUS;
        snprintf(m->name, sizeof m->name, "janus (multi_modality)");
        return parse_janus_original(c, root, m);
    }
    if (json_object_get(root, "text_config") || !strcmp(type, "janus")) {
        m->arch = FLEXDIAG_ARCH_JANUS;
        snprintf(m->name, sizeof m->name, "janus (transformers)");
        return parse_janus_hf(c, root, m);
    }
    if (!strcmp(type, "llama")) {
        m->arch = FLEXDIAG_ARCH_LLAMA;
        snprintf(m->name, sizeof m->name, "llama");
        return parse_lm(c, root, &m->lm);
    }
    return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                         "%s: model_type \"%s\" is not supported (supported: multi_modality and "
                         "janus for Janus-Pro, llama)",
                         c->file, type);
}

flexdiag_status flexdiag__config_load(const char *dir, flexdiag_model_config *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(out, 0, sizeof *out);
    out->bos_id = out->pad_id = out->boi_id = -1;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND, "%s: cannot read model config: %s (line %d)",
                             path, je.text, je.line);
    cfg_ctx c = {path, ""};
    flexdiag_status st = json_is_object(root) ? parse_root(&c, root, out)
                                              : flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                                              "%s: not a JSON object", path);
    json_decref(root);
    if (st == FLEXDIAG_OK && out->arch == FLEXDIAG_ARCH_JANUS) {
        out->image_tokens = out->grid * out->grid;
        st = read_generation_config(dir, out);
    }
    if (st == FLEXDIAG_OK) st = flexdiag__config_validate(out);
    return st;
}

/* ---- builtin shapes ---- */

static void builtin_janus(flexdiag_model_config *m, const char *name, int32_t d, int32_t layers,
                          int32_t heads, int32_t ffn, int32_t vocab, int32_t image_vocab) {
    memset(m, 0, sizeof *m);
    m->arch = FLEXDIAG_ARCH_JANUS;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->lm = (flexdiag_lm_config){.hidden = d, .layers = layers, .heads = heads,
                                 .kv_heads = heads, .head_dim = d / heads, .ffn = ffn,
                                 .vocab = vocab, .max_pos = 16384, .rms_eps = 1e-6f,
                                 .rope_theta = 10000.0f, .tie_embed = false};
    m->image_vocab = image_vocab;
    m->image_embed = 8;
    m->aligner_dim = d;
    m->aligner_depth = 2;
    m->head_dim_mid = d;
    m->grid = 24;
    m->image_tokens = 576;
}

flexdiag_status flexdiag__config_builtin(const char *name, flexdiag_model_config *out) {
    if (!name || !strcmp(name, "tiny-janus")) {
        /* Janus structure at toy size: 4 layers, d 256, 4 heads of 64, 576-token images. The
         * text vocabulary is the builtin byte tokenizer's (256 bytes + specials, see
         * runtime/builtin_tok); 1024 image codes. */
        builtin_janus(out, "tiny-janus", 256, 4, 4, 704, 512, 1024);
        out->bos_id = 256;
        out->pad_id = 258;
        out->boi_id = 261;
    } else if (!strcmp(name, "micro-janus")) {
        /* For tests: 2 layers, d 64, 4 heads of 16, an 8 x 8 image grid; same tokenizer. */
        builtin_janus(out, "micro-janus", 64, 2, 4, 128, 512, 256);
        out->grid = 8;
        out->image_tokens = 64;
        out->bos_id = 256;
        out->pad_id = 258;
        out->boi_id = 261;
    } else if (!strcmp(name, "janus-pro-1b")) {
        builtin_janus(out, "janus-pro-1b", 2048, 24, 16, 5632, 102400, 16384);
        out->bos_id = 100000, out->pad_id = 100002, out->boi_id = 100003;
    } else if (!strcmp(name, "janus-pro-7b")) {
        builtin_janus(out, "janus-pro-7b", 4096, 30, 32, 11008, 102400, 16384);
        out->bos_id = 100000, out->pad_id = 100015, out->boi_id = 100016;
    } else {
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "unknown --arch '%s' (use tiny-janus, micro-janus, janus-pro-1b or janus-pro-7b)",
                             name);
    }
    return flexdiag__config_validate(out);
}

flexdiag_status flexdiag__config_validate(const flexdiag_model_config *c) {
    const flexdiag_lm_config *l = &c->lm;
    if (l->hidden <= 0 || l->layers <= 0 || l->heads <= 0 || l->kv_heads <= 0 ||
        l->head_dim <= 0 || l->ffn <= 0 || l->vocab <= 0)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: hidden/layers/heads/kv_heads/head_dim/ffn/vocab must be positive",
                             c->name);
    if (l->heads % l->kv_heads)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: num_attention_heads %d is not a multiple of "
                             "num_key_value_heads %d",
                             c->name, l->heads, l->kv_heads);
    if (l->head_dim % 2 || l->head_dim > 256)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s: head_dim %d must be even and <= 256",
                             c->name, l->head_dim);
    if (!(l->rms_eps > 0) || !(l->rope_theta > 0))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: rms_norm_eps and rope_theta must be positive", c->name);
    if (c->arch != FLEXDIAG_ARCH_JANUS) return FLEXDIAG_OK;
    if (c->image_vocab <= 0 || c->image_embed <= 0 || c->grid <= 0 || c->head_dim_mid <= 0 ||
        c->aligner_depth < 1 || c->aligner_depth > 4)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: image vocab/embed/grid/head sizes must be positive and the "
                             "aligner depth 1..4",
                             c->name);
    if (c->aligner_dim != l->hidden)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: gen_aligner output %d must equal the hidden size %d", c->name,
                             c->aligner_dim, l->hidden);
    return FLEXDIAG_OK;
}
