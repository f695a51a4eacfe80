/*
 * config.c - model configuration from config.json (+ generation_config.json), the builtin
 * shapes used for random-weight runs, and the limits every configuration must meet.
 *
 * Three layouts (docs/formats.md §2.2):
 *   multi_modality (deepseek-ai original): language_config (LlamaConfig defaults for missing
 *       fields), gen_vision_config / gen_aligner_config / gen_head_config `params`;
 *   janus (transformers): text_config + vq_config (embed_dim, num_embeddings, projection_dim,
 *       num_hidden_layers, image_token_embed_dim, num_patches);
 *   llama: the LlamaConfig fields themselves.
 * Reading type-checks each field; then one check per part (check_lm, check_janus) range-checks
 * every shape field against the limits below and the relations between fields, naming the file
 * and the field as the file spells it (cfg_keys), before anything is sized from the config.
 * Builtin shapes go through the same checks. Unsupported features (rope_scaling, non-silu
 * activations, biases) fail here too. Special ids come from generation_config.json when present;
 * the model loader fills the rest from the tokenizer. What a backend adds (the CUDA attention's
 * head sizes) is checked at weight load, when the backend is known (config_check_backend).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/core.h"
#include "runtime/json_where.h"
#include "runtime/model/model.h"
#include "runtime/model/vocab_map.h"

/* ---- limits ----
 * Ceilings are generous, 2-16x the largest released Llama-family model (Llama-3.1-405B: 126
 * layers, hidden 16384, 128 heads, FFN 53248, vocab 128256; Janus-Pro-7B: 30 layers, hidden
 * 4096, 16384 image codes, 24 x 24 tokens), yet keep everything the loader derives from a config
 * small and exact: at most 9 tensors x 1024 layers in the walk, every element count and byte
 * offset far inside 64 bits, every kernel dimension inside int32. Lower bounds are 1 (an empty
 * dimension is never meant). */
#define CFG_MAX_LAYERS 1024        /* num_hidden_layers */
#define CFG_MAX_HIDDEN 65536       /* hidden_size, gen_head projector width */
#define CFG_MAX_HEADS 1024         /* num_attention_heads (KV heads: 1..heads, dividing it) */
#define CFG_MAX_HEAD_DIM 256       /* even: RoPE rotates (i, i + head_dim/2) on every backend */
#define CFG_MAX_FFN 262144         /* intermediate_size: 4 x CFG_MAX_HIDDEN */
#define CFG_MAX_VOCAB 4194304      /* text and image vocabularies: 2^22, 16 x Gemma's 256000 */
#define CFG_MAX_POS 16777216       /* max_position_embeddings: 2^24, 16 x 1M-context fine-tunes */
#define CFG_MAX_IMAGE_EMBED 4096   /* gen_embed width: the VQ codebook width limit (vq_config.c) */
#define CFG_MAX_ALIGNER_DEPTH 4    /* gen_aligner Linear layers: flexdiag_weights.align_w[4] */
#define CFG_MAX_GRID 4096          /* tokens per image side: vq_config.num_patches' limit */
#define CFG_MAX_EPS 1.0            /* rms_norm_eps in (0, 1]; released models use 1e-6..1e-5 */
#define CFG_MAX_THETA 1e12         /* rope_theta in (0, 1e12]; the largest released is ~3.6e9 */

/* Head sizes the CUDA attention kernels are instantiated for: the d_h switch of
 * kernels/cuda/attn_decode.cu and attn_prefill.cu, refused by flexdiag__cuda_attn_check
 * (kv_append.cu). The CPU tables take any even size (kernels/cpu/ref_attn.c). */
static const int32_t cuda_head_dims[] = {16, 32, 64, 128};

/* ---- JSON field access (types only; ranges are checked per part below) ---- */

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
    if (!json_is_integer(v))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: %s%s%s must be an integer",
                             c->file, c->section, *c->section ? "." : "", key);
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: %s%s%s = %lld is out of range: no size or id in a model "
                             "config exceeds 32 bits",
                             c->file, c->section, *c->section ? "." : "", key, (long long)x);
    *out = (int32_t)x;
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

static bool has(json_t *o, const char *key) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    return v && !json_is_null(v);
}

static json_t *get_params(json_t *root, const char *key) {
    json_t *o = json_object_get(root, key);
    json_t *p = o ? json_object_get(o, "params") : NULL;
    return json_is_object(p) ? p : NULL;
}

/* ---- range checks ---- */

/* How the file being checked spells each field, for messages (derived values say so). */
typedef struct cfg_keys {
    const char *file;          /* config.json path, or "builtin shape 'NAME'" */
    const char *lm;            /* prefix of the language-model fields ("text_config.", "") */
    const char *head_dim;      /* "head_dim", or its derivation when the file has none */
    const char *theta;         /* "rope_theta" or "rope_parameters.rope_theta" */
    const char *image_vocab, *image_embed, *aligner_dim, *aligner_depth, *head_mid, *grid;
} cfg_keys;

static flexdiag_status int_range(const cfg_keys *k, const char *pre, const char *key, int64_t v,
                                 int64_t lo, int64_t hi) {
    if (v >= lo && v <= hi) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                         "%s: %s%s = %lld is out of range: accepted %lld..%lld", k->file, pre, key,
                         (long long)v, (long long)lo, (long long)hi);
}

static flexdiag_status num_range(const cfg_keys *k, const char *key, float v, double hi) {
    if (isfinite(v) && v > 0.0f && v <= hi) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                         "%s: %s%s = %g is out of range: accepted a finite number in (0, %g]",
                         k->file, k->lm, key, (double)v, hi);
}

static flexdiag_status check_heads(const cfg_keys *k, const flexdiag_lm_config *l) {
    FLEXDIAG_TRY(int_range(k, k->lm, "num_attention_heads", l->heads, 1, CFG_MAX_HEADS));
    FLEXDIAG_TRY(int_range(k, k->lm, "num_key_value_heads", l->kv_heads, 1, l->heads));
    if (l->heads % l->kv_heads)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: %snum_attention_heads = %d is not a multiple of "
                             "%snum_key_value_heads = %d: accepted KV head counts divide it",
                             k->file, k->lm, l->heads, k->lm, l->kv_heads);
    if (l->head_dim < 2 || l->head_dim > CFG_MAX_HEAD_DIM || l->head_dim % 2)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: %s%s = %d is not supported: accepted even sizes 2..%d (on CUDA "
                             "16, 32, 64 or 128)",
                             k->file, k->lm, k->head_dim, l->head_dim, CFG_MAX_HEAD_DIM);
    return FLEXDIAG_OK;
}

static flexdiag_status check_lm(const cfg_keys *k, const flexdiag_lm_config *l) {
    FLEXDIAG_TRY(int_range(k, k->lm, "num_hidden_layers", l->layers, 1, CFG_MAX_LAYERS));
    FLEXDIAG_TRY(int_range(k, k->lm, "hidden_size", l->hidden, 1, CFG_MAX_HIDDEN));
    FLEXDIAG_TRY(int_range(k, k->lm, "intermediate_size", l->ffn, 1, CFG_MAX_FFN));
    FLEXDIAG_TRY(check_heads(k, l));
    FLEXDIAG_TRY(int_range(k, k->lm, "vocab_size", l->vocab, 1, CFG_MAX_VOCAB));
    FLEXDIAG_TRY(int_range(k, k->lm, "max_position_embeddings", l->max_pos, 1, CFG_MAX_POS));
    FLEXDIAG_TRY(num_range(k, "rms_norm_eps", l->rms_eps, CFG_MAX_EPS));
    return num_range(k, k->theta, l->rope_theta, CFG_MAX_THETA);
}

/* The Janus generation path; image_tokens is derived from grid afterwards. */
static flexdiag_status check_janus(const cfg_keys *k, const flexdiag_model_config *m) {
    FLEXDIAG_TRY(int_range(k, "", k->image_vocab, m->image_vocab, 1, CFG_MAX_VOCAB));
    FLEXDIAG_TRY(int_range(k, "", k->image_embed, m->image_embed, 1, CFG_MAX_IMAGE_EMBED));
    FLEXDIAG_TRY(int_range(k, "", k->aligner_depth, m->aligner_depth, 1, CFG_MAX_ALIGNER_DEPTH));
    FLEXDIAG_TRY(int_range(k, "", k->head_mid, m->head_dim_mid, 1, CFG_MAX_HIDDEN));
    FLEXDIAG_TRY(int_range(k, "", k->grid, m->grid, 1, CFG_MAX_GRID));
    if (m->aligner_dim != m->lm.hidden)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: %s = %d must equal %shidden_size = %d (the aligner's output "
                             "feeds the decoder)",
                             k->file, k->aligner_dim, m->aligner_dim, k->lm, m->lm.hidden);
    return FLEXDIAG_OK;
}

/* Special ids: -1 (unknown) or a row of the text vocabulary. */
static flexdiag_status check_ids(const char *file, const char *const key[3],
                                 const flexdiag_model_config *m) {
    const int32_t id[3] = {m->bos_id, m->pad_id, m->boi_id};
    for (int i = 0; i < 3; i++)
        if (id[i] < -1 || id[i] >= m->lm.vocab)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: %s = %d is out of range: accepted -1 (unknown) or "
                                 "0..%d (below the text vocabulary size)",
                                 file, key[i], id[i], m->lm.vocab - 1);
    return FLEXDIAG_OK;
}

/* The end-of-sequence id: -1 (unknown) or a row of the vocabulary. */
static flexdiag_status check_eos(const char *file, const flexdiag_model_config *m) {
    if (m->eos_id >= -1 && m->eos_id < m->lm.vocab) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                         "%s: eos_token_id = %d is out of range: accepted -1 (unknown) or 0..%d",
                         file, m->eos_id, m->lm.vocab - 1);
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

/* RoPE base: rope_theta, or rope_parameters.rope_theta (transformers >= 5) when present. */
static flexdiag_status parse_rope(const cfg_ctx *c, json_t *o, flexdiag_lm_config *lm,
                                  cfg_keys *k) {
    FLEXDIAG_TRY(get_num(c, o, "rope_theta", 10000.0f, &lm->rope_theta));
    k->theta = "rope_theta";
    json_t *rp = json_object_get(o, "rope_parameters");
    if (!json_is_object(rp)) return FLEXDIAG_OK;
    json_t *ty = json_object_get(rp, "rope_type");
    if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "default")))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: %s.rope_parameters.rope_type must be \"default\"", c->file,
                             c->section);
    if (has(rp, "rope_theta")) k->theta = "rope_parameters.rope_theta";
    return get_num(c, rp, "rope_theta", lm->rope_theta, &lm->rope_theta);
}

/* Read the decoder fields of object o and check them (k->file and k->lm already set). */
static flexdiag_status parse_lm(const cfg_ctx *c, json_t *o, flexdiag_lm_config *lm,
                                cfg_keys *k) {
    FLEXDIAG_TRY(reject_unsupported(c, o));
    FLEXDIAG_TRY(get_int(c, o, "hidden_size", 4096, &lm->hidden));
    FLEXDIAG_TRY(get_int(c, o, "intermediate_size", 11008, &lm->ffn));
    FLEXDIAG_TRY(get_int(c, o, "num_hidden_layers", 32, &lm->layers));
    FLEXDIAG_TRY(get_int(c, o, "num_attention_heads", 32, &lm->heads));
    FLEXDIAG_TRY(get_int(c, o, "num_key_value_heads", lm->heads, &lm->kv_heads));
    int32_t hd_def = lm->heads > 0 ? lm->hidden / lm->heads : 0;
    FLEXDIAG_TRY(get_int(c, o, "head_dim", hd_def, &lm->head_dim));
    k->head_dim = has(o, "head_dim") ? "head_dim"
                                     : "head_dim (not set: hidden_size / num_attention_heads)";
    FLEXDIAG_TRY(get_int(c, o, "vocab_size", 32000, &lm->vocab));
    FLEXDIAG_TRY(get_int(c, o, "max_position_embeddings", 2048, &lm->max_pos));
    FLEXDIAG_TRY(get_num(c, o, "rms_norm_eps", 1e-6f, &lm->rms_eps));
    FLEXDIAG_TRY(parse_rope(c, o, lm, k));
    lm->tie_embed = get_bool(o, "tie_word_embeddings", false);
    return check_lm(k, lm);
}

/* ---- OPT (FlexGen's family): pre-LayerNorm blocks with biases, ReLU MLP, learned positions
 * with offset 2, tied head; the post-LayerNorm OPT-350M layout is refused ---- */

static flexdiag_status parse_opt(const cfg_ctx *c, json_t *o, flexdiag_model_config *m,
                                 cfg_keys *k) {
    flexdiag_lm_config *lm = &m->lm;
    json_t *act = json_object_get(o, "activation_function");
    if (act && !(json_is_string(act) && !strcmp(json_string_value(act), "relu")))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s: activation_function must be \"relu\"",
                             c->file);
    FLEXDIAG_TRY(get_int(c, o, "hidden_size", 768, &lm->hidden));
    FLEXDIAG_TRY(get_int(c, o, "ffn_dim", 3072, &lm->ffn));
    FLEXDIAG_TRY(get_int(c, o, "num_hidden_layers", 12, &lm->layers));
    FLEXDIAG_TRY(get_int(c, o, "num_attention_heads", 12, &lm->heads));
    FLEXDIAG_TRY(get_int(c, o, "vocab_size", 50272, &lm->vocab));
    FLEXDIAG_TRY(get_int(c, o, "max_position_embeddings", 2048, &lm->max_pos));
    int32_t proj = 0;
    FLEXDIAG_TRY(get_int(c, o, "word_embed_proj_dim", lm->hidden, &proj));
    if (!get_bool(o, "do_layer_norm_before", true) || proj != lm->hidden)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: this OPT layout (post-LayerNorm blocks or word_embed_proj_dim "
                             "%d != hidden_size %d, as in OPT-350M) is not supported; OPT-125M "
                             "and 1.3B..175B are",
                             c->file, proj, lm->hidden);
    if (!get_bool(o, "enable_bias", true) || !get_bool(o, "layer_norm_elementwise_affine", true))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: enable_bias and layer_norm_elementwise_affine must be true",
                             c->file);
    lm->kv_heads = lm->heads;
    lm->head_dim = lm->heads > 0 ? lm->hidden / lm->heads : 0;
    k->head_dim = "head_dim (hidden_size / num_attention_heads)";
    lm->rms_eps = 1e-5f;
    lm->rope_theta = 10000.0f; /* unused: learned positions */
    lm->tie_embed = get_bool(o, "tie_word_embeddings", true);
    lm->layer_norm = lm->bias = lm->relu_mlp = true;
    lm->pos_offset = 2;
    lm->pos_rows = lm->max_pos + 2;
    m->bos_id = 2, m->pad_id = 1, m->boi_id = -1;
    FLEXDIAG_TRY(get_int(c, o, "eos_token_id", 2, &m->eos_id));
    FLEXDIAG_TRY(check_lm(k, lm));
    static const char *const keys[3] = {"bos id", "pad id", "begin-of-image id"};
    FLEXDIAG_TRY(check_ids(c->file, keys, m));
    return check_eos(c->file, m);
}

/* ---- Chameleon (Lumina-mGPT): a Llama block with a per-head LayerNorm of q and k before RoPE,
 * one vocabulary of text and image codes, untied head ---- */

static flexdiag_status parse_chameleon(const cfg_ctx *c, json_t *o, flexdiag_model_config *m,
                                       cfg_keys *k) {
    if (get_bool(o, "swin_norm", false))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: swin_norm = true (norms after attention and MLP) is not "
                             "supported; Lumina-mGPT-7B and Chameleon-7B use false",
                             c->file);
    json_t *rms = json_object_get(o, "rms_norm_eps");
    FLEXDIAG_TRY(parse_lm(c, o, &m->lm, k));
    if (!rms) m->lm.rms_eps = 1e-5f; /* ChameleonConfig's default */
    m->lm.qk_rows = m->lm.heads; /* [heads, d_h] unless the checkpoint stores [1, d_h] */
    FLEXDIAG_TRY(get_int(c, o, "bos_token_id", 0, &m->bos_id));
    FLEXDIAG_TRY(get_int(c, o, "pad_token_id", 1, &m->pad_id));
    FLEXDIAG_TRY(get_int(c, o, "eos_token_id", 2, &m->eos_id));
    FLEXDIAG_TRY(flexdiag__vocab_map_ids(c->file, o, m));
    static const char *const keys[3] = {"bos_token_id", "pad_token_id",
                                        "vocabulary_map[\"<racm3:break>\"]"};
    FLEXDIAG_TRY(check_ids(c->file, keys, m));
    return check_eos(c->file, m);
}

/* ---- the three layouts ---- */

static flexdiag_status parse_janus_original(const cfg_ctx *c, json_t *root,
                                            flexdiag_model_config *m, cfg_keys *k) {
    cfg_ctx lc = {c->file, "language_config"};
    k->lm = m->lm_keys = "language_config.";
    FLEXDIAG_TRY(parse_lm(&lc, json_object_get(root, "language_config"), &m->lm, k));
    m->lm.tie_embed = false;
    cfg_ctx vc = {c->file, "gen_vision_config.params"}, ac = {c->file, "gen_aligner_config.params"};
    cfg_ctx hc = {c->file, "gen_head_config.params"};
    json_t *vis = get_params(root, "gen_vision_config");
    json_t *al = get_params(root, "gen_aligner_config"), *hd = get_params(root, "gen_head_config");
    FLEXDIAG_TRY(get_int(&vc, vis, "image_token_size", 16384, &m->image_vocab));
    FLEXDIAG_TRY(get_int(&vc, vis, "n_embed", 8, &m->image_embed));
    FLEXDIAG_TRY(get_int(&ac, al, "n_embed", m->lm.hidden, &m->aligner_dim));
    FLEXDIAG_TRY(get_int(&ac, al, "depth", 2, &m->aligner_depth));
    FLEXDIAG_TRY(get_int(&hc, hd, "n_embed", m->lm.hidden, &m->head_dim_mid));
    m->grid = 24; /* VQ-16 at 384 px (docs/architecture.md §4.1 step 7) */
    k->image_vocab = "gen_vision_config.params.image_token_size";
    k->image_embed = "gen_vision_config.params.n_embed";
    k->aligner_dim = "gen_aligner_config.params.n_embed";
    k->aligner_depth = "gen_aligner_config.params.depth";
    k->head_mid = "gen_head_config.params.n_embed";
    k->grid = "grid (24 in this layout)";
    FLEXDIAG_TRY(check_janus(k, m));
    int32_t head_in = 0, head_out = 0, align_in = 0;
    FLEXDIAG_TRY(get_int(&hc, hd, "image_token_embed", m->lm.hidden, &head_in));
    FLEXDIAG_TRY(get_int(&hc, hd, "image_token_size", m->image_vocab, &head_out));
    FLEXDIAG_TRY(get_int(&ac, al, "input_dim", m->image_embed, &align_in));
    if (head_in != m->lm.hidden || head_out != m->image_vocab || align_in != m->image_embed)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: gen_head/gen_aligner sizes disagree with the language model "
                             "(gen_head_config.params.image_token_embed %d vs "
                             "language_config.hidden_size %d, gen_head_config.params."
                             "image_token_size %d vs gen_vision_config.params.image_token_size "
                             "%d, gen_aligner_config.params.input_dim %d vs "
                             "gen_vision_config.params.n_embed %d)",
                             c->file, head_in, m->lm.hidden, head_out, m->image_vocab, align_in,
                             m->image_embed);
    return FLEXDIAG_OK;
}

/* Tokens per image side: vq_config.num_patches, else vision_config.image_size / patch_size. */
static flexdiag_status parse_grid(const cfg_ctx *c, json_t *root, json_t *vq,
                                  flexdiag_model_config *m, cfg_keys *k) {
    cfg_ctx vc = {c->file, "vq_config"}, sc = {c->file, "vision_config"};
    json_t *vis = json_object_get(root, "vision_config");
    int32_t img = 384, patch = 16;
    FLEXDIAG_TRY(get_int(&sc, vis, "image_size", 384, &img));
    FLEXDIAG_TRY(get_int(&sc, vis, "patch_size", 16, &patch));
    k->grid = has(vq, "num_patches") ? "vq_config.num_patches"
                                     : "vq_config.num_patches (not set: vision_config.image_size "
                                       "/ vision_config.patch_size)";
    return get_int(&vc, vq, "num_patches", patch > 0 ? img / patch : 0, &m->grid);
}

static flexdiag_status parse_janus_hf(const cfg_ctx *c, json_t *root, flexdiag_model_config *m,
                                      cfg_keys *k) {
    cfg_ctx tc = {c->file, "text_config"}, vc = {c->file, "vq_config"};
    k->lm = m->lm_keys = "text_config.";
    FLEXDIAG_TRY(parse_lm(&tc, json_object_get(root, "text_config"), &m->lm, k));
    json_t *vq = json_object_get(root, "vq_config");
    FLEXDIAG_TRY(get_int(&vc, vq, "embed_dim", 8, &m->image_embed));
    FLEXDIAG_TRY(get_int(&vc, vq, "num_embeddings", 16384, &m->image_vocab));
    FLEXDIAG_TRY(get_int(&vc, vq, "projection_dim", 2048, &m->aligner_dim));
    FLEXDIAG_TRY(get_int(&vc, vq, "num_hidden_layers", 2, &m->aligner_depth));
    m->head_dim_mid = m->aligner_dim;
    json_t *act = json_object_get(vq, "hidden_act");
    if (act && !(json_is_string(act) && !strcmp(json_string_value(act), "gelu")))
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s: vq_config.hidden_act must be \"gelu\"",
                             c->file);
    FLEXDIAG_TRY(parse_grid(c, root, vq, m, k));
    k->image_vocab = "vq_config.num_embeddings";
    k->image_embed = "vq_config.embed_dim";
    k->aligner_dim = k->head_mid = "vq_config.projection_dim";
    k->aligner_depth = "vq_config.num_hidden_layers";
    FLEXDIAG_TRY(check_janus(k, m));
    int32_t head_in = 0;
    FLEXDIAG_TRY(get_int(&vc, vq, "image_token_embed_dim", 2048, &head_in));
    if (head_in != m->lm.hidden)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: vq_config.image_token_embed_dim %d differs from "
                             "text_config.hidden_size %d",
                             c->file, head_in, m->lm.hidden);
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
    static const char *const keys[3] = {"bos_token_id", "pad_token_id",
                                        "generation_kwargs.boi_token_id"};
    return st == FLEXDIAG_OK ? check_ids(path, keys, m) : st;
}

static flexdiag_status parse_root(const cfg_ctx *c, json_t *root, flexdiag_model_config *m) {
    cfg_keys k = {.file = c->file, .lm = ""};
    json_t *mt = json_object_get(root, "model_type");
    const char *type = json_is_string(mt) ? json_string_value(mt) : "";
    if (json_object_get(root, "language_config") || !strcmp(type, "multi_modality")) {
        m->arch = FLEXDIAG_ARCH_JANUS;
        snprintf(m->name, sizeof m->name, "janus (multi_modality)");
        return parse_janus_original(c, root, m, &k);
    }
    if (json_object_get(root, "text_config") || !strcmp(type, "janus")) {
        m->arch = FLEXDIAG_ARCH_JANUS;
        snprintf(m->name, sizeof m->name, "janus (transformers)");
        return parse_janus_hf(c, root, m, &k);
    }
    if (!strcmp(type, "chameleon")) {
        m->arch = FLEXDIAG_ARCH_CHAMELEON;
        snprintf(m->name, sizeof m->name, "chameleon");
        return parse_chameleon(c, root, m, &k);
    }
    if (!strcmp(type, "opt")) {
        m->arch = FLEXDIAG_ARCH_OPT;
        snprintf(m->name, sizeof m->name, "opt");
        return parse_opt(c, root, m, &k);
    }
    if (!strcmp(type, "llama")) {
        m->arch = FLEXDIAG_ARCH_LLAMA;
        snprintf(m->name, sizeof m->name, "llama");
        FLEXDIAG_TRY(parse_lm(c, root, &m->lm, &k));
        FLEXDIAG_TRY(get_int(c, root, "bos_token_id", -1, &m->bos_id)); /* text prompts' BOS */
        FLEXDIAG_TRY(get_int(c, root, "eos_token_id", -1, &m->eos_id));
        static const char *const keys[3] = {"bos_token_id", "pad id", "begin-of-image id"};
        FLEXDIAG_TRY(check_ids(c->file, keys, m));
        return check_eos(c->file, m);
    }
    return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                         "%s: model_type \"%s\" is not supported (supported: multi_modality and "
                         "janus for Janus-Pro, llama, opt, chameleon)",
                         c->file, type);
}

flexdiag_status flexdiag__config_load(const char *dir, flexdiag_model_config *out) {
    memset(out, 0, sizeof *out);
    out->bos_id = out->pad_id = out->boi_id = out->eos_id = -1;
    out->lm_keys = "";
    snprintf(out->source, sizeof out->source, "%s/config.json", dir);
    const char *path = out->source;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    char where[48];
    if (!root)
        return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND, "%s: cannot read model config%s: %s", path,
                             flexdiag__json_where(&je, where, sizeof where), je.text);
    cfg_ctx c = {path, ""};
    flexdiag_status st = json_is_object(root) ? parse_root(&c, root, out)
                                              : flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                                              "%s: not a JSON object", path);
    json_decref(root);
    if (st == FLEXDIAG_OK && out->arch == FLEXDIAG_ARCH_JANUS) {
        out->image_tokens = out->grid * out->grid; /* grid <= CFG_MAX_GRID: no overflow */
        st = read_generation_config(dir, out);
    }
    return st;
}

/* ---- builtin shapes ---- */

static void builtin_janus(flexdiag_model_config *m, const char *name, int32_t d, int32_t layers,
                          int32_t heads, int32_t ffn, int32_t vocab, int32_t image_vocab) {
    memset(m, 0, sizeof *m);
    m->arch = FLEXDIAG_ARCH_JANUS;
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->source, sizeof m->source, "builtin shape '%s'", name);
    m->lm_keys = "";
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
    m->eos_id = -1;
}

/* An OPT shape by name (micro-opt for tests; FlexGen's 6.7B, 30B, 175B); 0 when unknown. */
static int builtin_opt(flexdiag_model_config *m, const char *name) {
    static const struct { const char *name; int32_t d, layers, heads, ffn, vocab, max_pos; } t[] = {
        {"micro-opt", 64, 2, 4, 256, 512, 256}, /* the builtin byte tokenizer's 512 ids */
        {"opt-6.7b", 4096, 32, 32, 16384, 50272, 2048},
        {"opt-30b", 7168, 48, 56, 28672, 50272, 2048},
        {"opt-175b", 12288, 96, 96, 49152, 50272, 2048},
    };
    size_t i = 0;
    while (i < sizeof t / sizeof t[0] && strcmp(name, t[i].name)) i++;
    if (i == sizeof t / sizeof t[0]) return 0;
    builtin_janus(m, t[i].name, t[i].d, t[i].layers, t[i].heads, t[i].ffn, t[i].vocab, 0);
    m->arch = FLEXDIAG_ARCH_OPT;
    m->image_embed = m->aligner_dim = m->aligner_depth = m->head_dim_mid = 0;
    m->grid = m->image_tokens = 0;
    flexdiag_lm_config *l = &m->lm;
    l->max_pos = t[i].max_pos;
    l->rms_eps = 1e-5f;
    l->tie_embed = l->layer_norm = l->bias = l->relu_mlp = true;
    l->pos_offset = 2;
    l->pos_rows = l->max_pos + 2;
    m->bos_id = 2, m->pad_id = 1, m->boi_id = -1, m->eos_id = 2;
    return 1;
}

/* Every name flexdiag__config_builtin accepts, in the order --help lists them (tiny-janus, the
 * default, first); test_cli_firstrun loads each. */
static const char *const builtin_names[] = {
    "tiny-janus",     "micro-janus", "janus-pro-1b", "janus-pro-7b", "llama-2-7b", "lumina-mgpt-7b",
    "micro-lumina",   "micro-opt",   "opt-6.7b",     "opt-30b",      "opt-175b",
};

const char *flexdiag_builtin_arch(int32_t i) {
    return i >= 0 && i < (int32_t)(sizeof builtin_names / sizeof builtin_names[0])
               ? builtin_names[i]
               : NULL;
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
    } else if (!strcmp(name, "llama-2-7b")) {
        /* Llama-2-7B's shapes (text only, untied head): for speed runs with random weights */
        builtin_janus(out, "llama-2-7b", 4096, 32, 32, 11008, 32000, 0);
        out->arch = FLEXDIAG_ARCH_LLAMA;
        out->lm.max_pos = 4096;
        out->lm.rms_eps = 1e-5f;
        out->image_embed = out->aligner_dim = out->aligner_depth = out->head_dim_mid = 0;
        out->grid = out->image_tokens = 0;
        out->bos_id = 1, out->pad_id = 0, out->boi_id = -1, out->eos_id = 2;
    } else if (!strcmp(name, "lumina-mgpt-7b") || !strcmp(name, "micro-lumina")) {
        /* Lumina-mGPT-7B-512 (Chameleon-7B): Llama-7B block + QK norms shared across heads,
         * one 65536-entry vocabulary (8192 image codes at ids 4.., 32 x 32 codes per image),
         * untied head; micro-lumina: the same block at test size, 64 codes in an 8 x 8 grid
         * (the layout of the golden Chameleon fixture) */
        int micro = name[0] == 'm';
        builtin_janus(out, micro ? "micro-lumina" : "lumina-mgpt-7b", micro ? 64 : 4096,
                      micro ? 2 : 32, micro ? 4 : 32, micro ? 128 : 11008, micro ? 512 : 65536,
                      micro ? 64 : 8192);
        out->arch = FLEXDIAG_ARCH_CHAMELEON;
        out->lm.max_pos = 4096;
        out->lm.rms_eps = 1e-5f;
        out->lm.qk_rows = 1;
        out->image_embed = out->aligner_dim = out->aligner_depth = out->head_dim_mid = 0;
        out->grid = micro ? 8 : 32;
        out->image_tokens = out->grid * out->grid;
        out->bos_id = 0, out->pad_id = 1, out->eos_id = 2, out->img_id0 = 4;
        if (micro)
            out->eoi_id = 68, out->boi_id = 69, out->eot_id = 70, out->row_end_id = 71,
            out->size_id = 72;
        else /* <eoss>, <racm3:break>, <reserved08706>, <reserved08799>, <reserved08820> */
            out->eoi_id = 8196, out->boi_id = 8197, out->eot_id = 8710, out->row_end_id = 8803,
            out->size_id = 8820;
    } else if (builtin_opt(out, name)) {
        /* OPT shapes: FlexGen's table for speed runs with random weights, micro-opt for tests */
    } else {
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "model_params.arch '%s' is unknown (use tiny-janus, micro-janus, janus-pro-1b, "
                             "janus-pro-7b, llama-2-7b, lumina-mgpt-7b, micro-lumina, micro-opt, "
                             "opt-6.7b, opt-30b or opt-175b)",
                             name);
    }
    return flexdiag__config_validate(out);
}

flexdiag_status flexdiag__config_validate(const flexdiag_model_config *c) {
    cfg_keys k = {.file = c->source[0] ? c->source : c->name,
                  .lm = c->lm_keys ? c->lm_keys : "",
                  .head_dim = "head_dim",
                  .theta = "rope_theta",
                  .image_vocab = "image vocabulary",
                  .image_embed = "gen_embed width",
                  .aligner_dim = "gen_aligner width",
                  .aligner_depth = "gen_aligner depth",
                  .head_mid = "gen_head width",
                  .grid = "image grid"};
    FLEXDIAG_TRY(check_lm(&k, &c->lm));
    if (c->arch != FLEXDIAG_ARCH_JANUS) return FLEXDIAG_OK;
    FLEXDIAG_TRY(check_janus(&k, c));
    if (c->image_tokens != c->grid * c->grid)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: %d image tokens, but a %d x %d grid has %d", k.file,
                             c->image_tokens, c->grid, c->grid, c->grid * c->grid);
    static const char *const keys[3] = {"bos id", "pad id", "begin-of-image id"};
    return check_ids(k.file, keys, c);
}

/* ---- backend limits ---- */

flexdiag_status flexdiag__config_check_backend(const flexdiag_model_config *c,
                                               const flexdiag_kernels *k) {
    if (strcmp(k->name, "cuda") != 0) return FLEXDIAG_OK;
    for (size_t i = 0; i < sizeof cuda_head_dims / sizeof cuda_head_dims[0]; i++)
        if (c->lm.head_dim == cuda_head_dims[i]) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                         "%s: %shead_dim = %d is not supported by the cuda backend, whose "
                         "attention kernels are built for head_dim 16, 32, 64 and 128: run this "
                         "model on the CPU (runtime_params.device -1)",
                         c->source[0] ? c->source : c->name, c->lm_keys ? c->lm_keys : "",
                         c->lm.head_dim);
}
