/*
 * model.h - model configuration, weights and the objects behind the public handles.
 *
 * A model is a Llama-family decoder (the language model) plus, for Janus-Pro, the image
 * generation path: gen_embed (image id -> 8-dim), gen_aligner (8 -> d -> d MLP with GELU),
 * gen_head (d -> d GELU -> image vocab) and the VQ-16 decoder. Config comes from config.json in
 * either the original deepseek-ai `multi_modality` layout or the transformers `janus` layout,
 * or from a plain `llama` config; builtin shapes (tiny-janus, janus-pro-1b/7b) give random-weight
 * models for runs without downloads.
 *
 * Weights live in backend memory (device on CUDA) as bf16. Q/K/V and gate/up are fused at load
 * ([q; k; v] rows and [gate; up] rows) so one GEMM serves each; the per-layer tensor table below
 * says where each checkpoint tensor lands.
 */
#ifndef FLEXDIAG_MODEL_H
#define FLEXDIAG_MODEL_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/model/model.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "flexdiag.h"
#include "offload/arena.h"
#include "offload/weight_homes.h"
#include "kernels/kernels.h"
#include "policy/kv_policy.h"
#include "runtime/model/safetensors.h"

typedef enum flexdiag_arch {
    FLEXDIAG_ARCH_JANUS = 0, /* Janus-Pro image generation */
    FLEXDIAG_ARCH_LLAMA = 1, /* text decoder */
    FLEXDIAG_ARCH_OPT = 2,   /* text decoder, FlexGen's family */
    FLEXDIAG_ARCH_CHAMELEON = 3, /* Lumina-mGPT / Chameleon: one vocabulary of text and image
                                    codes; generates images (CFG, rows of codes), or runs as a
                                    text decoder (context param text) */
} flexdiag_arch;

typedef struct flexdiag_lm_config {
    int32_t hidden;     /* d */
    int32_t layers;     /* decoder layers */
    int32_t heads;      /* query heads */
    int32_t kv_heads;   /* KV heads (GQA when < heads) */
    int32_t head_dim;   /* d_h */
    int32_t ffn;        /* MLP intermediate size (SwiGLU, or OPT's fc1) */
    int32_t vocab;      /* text vocabulary rows of embed_tokens */
    int32_t max_pos;    /* max_position_embeddings */
    float rms_eps;      /* norm epsilon (RMSNorm, or LayerNorm when layer_norm) */
    float rope_theta;   /* RoPE base (unused when pos_rows > 0) */
    bool tie_embed;     /* lm_head = embed_tokens */
    /* the block's variant: Llama/Janus (all false / 0) or OPT (all set) */
    bool layer_norm;    /* LayerNorm with a bias instead of RMSNorm */
    bool bias;          /* q, k, v, o, fc1 and fc2 carry biases */
    bool relu_mlp;      /* x -> fc2(ReLU(fc1 x)) instead of SwiGLU gate/up -> down */
    int32_t pos_rows;   /* learned position table rows (no RoPE); 0: RoPE */
    int32_t pos_offset; /* table row of position 0 (OPT: 2) */
    int32_t qk_rows;    /* Chameleon's per-head LayerNorm of q and k before RoPE: rows of its
                           gamma/beta tables (1: shared by every head, or the head count); 0:
                           none */
} flexdiag_lm_config;

typedef struct flexdiag_model_config {
    flexdiag_arch arch;       /* Janus or Llama */
    char name[64];            /* "janus-pro-7b", "tiny-janus", "llama" */
    char source[4096];        /* config.json path, or "builtin shape 'NAME'"; named in messages */
    const char *lm_keys;      /* static prefix of the decoder fields in source: "text_config.",
                                 "language_config." or "" (messages name "<prefix>head_dim") */
    flexdiag_lm_config lm;    /* language model */
    /* Janus generation path (arch == JANUS); image_vocab, image_tokens and grid also
     * describe Chameleon's image codes */
    int32_t image_vocab;      /* VQ codebook size (16384; Chameleon: image-code ids, 8192, 0
                                 when the vocabulary names none) */
    int32_t image_embed;      /* gen_embed width (8) */
    int32_t aligner_dim;      /* gen_aligner output (must equal hidden) */
    int32_t aligner_depth;    /* Linear layers in gen_aligner (2) */
    int32_t head_dim_mid;     /* gen_head projector output (d) */
    int32_t image_tokens;     /* codes per image (576 = 24 x 24; Chameleon 1024 = 32 x 32) */
    int32_t grid;             /* codes per image side (24; Chameleon 32 at 512 px) */
    /* special ids (-1 = unknown) */
    int32_t bos_id, pad_id, boi_id;
    int32_t eos_id;           /* text models: where a continuation ends (-1 = unknown) */
    /* Chameleon images (runtime/model/vocab_map.c): the codes are the ids img_id0 ..
     * img_id0 + image_vocab - 1; an image is grid rows of grid codes, each row ended by
     * row_end_id, the image by eoi_id; its prompt ends with boi_id (<racm3:break>) and size_id
     * twice (height, width), the text before them with eot_id */
    int32_t img_id0, row_end_id, eoi_id, size_id, eot_id;
    char no_image[192];       /* Chameleon: why a vocabulary that names image codes cannot
                                 frame an image (a missing structural token, codes that are not
                                 one range); "" otherwise. Such a model has image_vocab 0 and
                                 runs as a text decoder */
} flexdiag_model_config;

/* Weights of one decoder layer (bf16): views into the layer's block, which holds the tensors in
 * the order of the enum below, each 256-byte aligned, with the same offsets in every layer. The
 * biases exist only in blocks with lm.layer_norm / lm.bias (OPT), the QK norms only with
 * lm.qk_rows (Chameleon); elsewhere they are NULL. */
typedef struct flexdiag_layer_w {
    uint16_t *attn_norm;   /* (d) */
    uint16_t *attn_norm_b; /* (d) LayerNorm bias */
    uint16_t *wqkv;        /* ((h_q + 2 h_kv) d_h, d): q rows, then k, then v */
    uint16_t *bqkv;        /* ((h_q + 2 h_kv) d_h) */
    uint16_t *q_norm;      /* (qk_rows, d_h) QK LayerNorm gamma of q (Chameleon) */
    uint16_t *q_norm_b;    /* (qk_rows, d_h) its beta */
    uint16_t *k_norm;      /* (qk_rows, d_h) gamma of k */
    uint16_t *k_norm_b;    /* (qk_rows, d_h) beta of k */
    uint16_t *wo;          /* (d, h_q d_h) */
    uint16_t *bo;          /* (d) */
    uint16_t *mlp_norm;    /* (d) */
    uint16_t *mlp_norm_b;  /* (d) */
    uint16_t *wgu;         /* SwiGLU (2 f, d): gate rows then up rows; ReLU MLP: fc1 (f, d) */
    uint16_t *bgu;         /* (f) fc1 bias */
    uint16_t *wdown;       /* (d, f) */
    uint16_t *bdown;       /* (d) */
} flexdiag_layer_w;

/* The tensors of a layer block, in flexdiag_layer_w order. */
enum { FLEXDIAG_LT_ATTN_NORM, FLEXDIAG_LT_ATTN_NORM_B, FLEXDIAG_LT_WQKV, FLEXDIAG_LT_BQKV,
       FLEXDIAG_LT_Q_NORM, FLEXDIAG_LT_Q_NORM_B, FLEXDIAG_LT_K_NORM, FLEXDIAG_LT_K_NORM_B,
       FLEXDIAG_LT_WO, FLEXDIAG_LT_BO, FLEXDIAG_LT_MLP_NORM, FLEXDIAG_LT_MLP_NORM_B,
       FLEXDIAG_LT_WGU, FLEXDIAG_LT_BGU, FLEXDIAG_LT_WDOWN, FLEXDIAG_LT_BDOWN, FLEXDIAG_LT_COUNT };

typedef struct flexdiag_weights {
    uint16_t *embed;        /* (V, d) embed_tokens */
    uint16_t *pos_embed;    /* (pos_rows, d) learned positions (OPT), NULL with RoPE */
    uint16_t *final_norm;   /* (d) */
    uint16_t *final_norm_b; /* (d) LayerNorm bias (OPT), NULL otherwise */
    uint16_t *lm_head;      /* (V, d) Llama; == embed when tied; NULL for Janus */
    uint16_t *gen_embed;    /* (Vi, 8) */
    uint16_t *align_w[4];   /* aligner Linear weights: (d, 8), then (d, d) x (depth-1) */
    uint16_t *align_b[4];   /* aligner biases (d) */
    uint16_t *head_w1, *head_b1; /* gen_head projector (dm, d), (dm) */
    uint16_t *head_w2, *head_b2; /* vision_head (Vi, dm), (Vi) */
    flexdiag_wspan lt[FLEXDIAG_LT_COUNT]; /* the layer tensors inside a layer block */
    size_t layer_bytes;     /* bytes of one layer's block */
    void *layer0;           /* device address of layer 0's block (layer j's at + j ·
                               layer_bytes); NULL when the layers live in homes */
    struct flexdiag_weight_homes *homes; /* where each layer's parts live when they do not all
                                            fit the device (owned); NULL: all on the device */
    void *block;            /* one device allocation holding all of the above but the homes */
    size_t bytes;           /* size of block */
} flexdiag_weights;

/* Named tensors of a layer from a scheduler's addresses (offload/sched.h flexdiag_sched_io): a
 * tensor ending at or before res_bytes reads the resident block, every other one the slot. */
static inline flexdiag_layer_w flexdiag__layer_view(const flexdiag_weights *w, const void *block,
                                                    const void *res, size_t res_bytes) {
    uint16_t *p[FLEXDIAG_LT_COUNT];
    for (int i = 0; i < FLEXDIAG_LT_COUNT; i++) {
        const flexdiag_wspan *t = &w->lt[i];
        const char *b = t->off + t->bytes <= res_bytes ? (const char *)res : (const char *)block;
        p[i] = t->bytes ? (uint16_t *)(uintptr_t)(b + t->off) : NULL;
    }
    return (flexdiag_layer_w){p[0], p[1], p[2],  p[3],  p[4],  p[5],  p[6],  p[7],
                              p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]};
}

/* Read config.json (+ generation_config.json) of a model folder and range-check every field
 * (limits in config.c); a refusal names the file, the field as written, the value and the
 * accepted range. */
flexdiag_status flexdiag__config_load(const char *dir, flexdiag_model_config *out);
/* Builtin shape by name (flexdiag_builtin_arch lists them). */
flexdiag_status flexdiag__config_builtin(const char *name, flexdiag_model_config *out);
/* The checks of config_load on a filled config (ranges and relations between fields); messages
 * name c->source and the field. */
flexdiag_status flexdiag__config_validate(const flexdiag_model_config *c);
/* What backend k adds to the config limits (the CUDA attention's head sizes);
 * FLEXDIAG_ERR_UNSUPPORTED naming the source and field. Called by the weight loaders. */
flexdiag_status flexdiag__config_check_backend(const flexdiag_model_config *c,
                                               const flexdiag_kernels *k);

/* Rewrite a checkpoint tensor name of arch onto the canonical scheme (Janus: the original
 * deepseek-ai names, VQ decoder included; Llama: the HF names) into out. Returns 1 when a rule
 * applied, 0 when the name was copied unchanged, -1 when out is too small. */
int flexdiag__name_canonical(flexdiag_arch arch, const char *name, char *out, size_t out_size);

/* Where the layer weights go: all on the device (pct 100,0,0, pools NULL), or split by
 * --weights over device, pinned host and disk (offload/weight_homes.h). */
typedef struct flexdiag_weights_place {
    uint32_t pct[3];            /* GPU, CPU, disk percent of every layer */
    flexdiag_host_pool *pool;   /* home of the host part (borrowed), NULL when pct[1] == 0 */
    flexdiag_store *store;      /* home of the disk part (borrowed), NULL when pct[2] == 0 */
    int compress;               /* FLEXDIAG_WCOMPRESS_* (weight_homes.h): the host and disk parts
                                   in 4-bit groups, the disk part as zstd chunks */
    int threads;                /* host threads that compress and decompress (0: all cores) */
} flexdiag_weights_place;

/* What the config leaves to the checkpoint: the rows of Chameleon's QK-norm tables ([1, d_h]
 * shared by every head, as Lumina stores them, or [heads, d_h]). Call before planning and
 * loading. */
flexdiag_status flexdiag__weights_adapt(flexdiag_model_config *cfg,
                                        const flexdiag_safetensors *st);
/* Bytes each tier needs for cfg under placement pct, [GPU (all weights but the streamed parts),
 * CPU, disk (4096-aligned per layer)], and the cut itself (either out may be NULL); compress:
 * FLEXDIAG_WCOMPRESS_* flags (the CPU and disk parts in 4-bit groups, the disk part as zstd
 * chunks, sized by their bound). */
flexdiag_status flexdiag__weights_plan(const flexdiag_model_config *cfg, const uint32_t pct[3],
                                       int compress, uint64_t bytes[3], flexdiag_wcut *cut);
/* Load weights from an open checkpoint into memory of arena a's backend, placed by pl. Before
 * any memory proportional to the config is taken, every tensor the config implies must be in
 * the checkpoint with its shape and a readable dtype, and the checkpoint's tensors of the
 * model's parts must add up to what the config implies; refusals name the file and the tensor. */
flexdiag_status flexdiag__weights_load(flexdiag_arena *a, flexdiag_stream *s,
                                       const flexdiag_model_config *cfg,
                                       const flexdiag_safetensors *st,
                                       const flexdiag_weights_place *pl, flexdiag_weights *w);
/* Seeded random weights (N(0, 0.02²) matrices, unit norms, zero biases), placed by pl. */
flexdiag_status flexdiag__weights_random(flexdiag_arena *a, flexdiag_stream *s,
                                         const flexdiag_model_config *cfg, uint64_t seed,
                                         const flexdiag_weights_place *pl, flexdiag_weights *w);
void flexdiag__weights_free(flexdiag_arena *a, flexdiag_weights *w);

#endif /* FLEXDIAG_MODEL_H */
