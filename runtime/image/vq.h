/*
 * vq.h - the VQ-16 image decoder of Janus-Pro (docs/architecture.md §4.4): image token ids -> float
 * pixels, run entirely through the backend op table so the same code serves CPU and CUDA.
 *
 * One config struct covers both checkpoint layouts: the transformers `janus` config.json
 * (vq_config: embed_dim, num_embeddings, latent_channels, base_channels, channel_multiplier,
 * num_res_blocks; grid from num_patches or vision_config image_size / patch_size) and the
 * original deepseek-ai `multi_modality` one (gen_vision_config.params image_token_size, n_embed;
 * every other shape is the fixed VQ-16 constant). Weights are resolved by their original
 * (canonical) names; transformers names are rewritten by flexdiag__name_canonical.
 */
#ifndef FLEXDIAG_VQ_H
#define FLEXDIAG_VQ_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/image/vq.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "flexdiag.h"
#include "kernels/kernels.h"
#include "runtime/model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLEXDIAG_VQ_MAX_LEVELS 8 /* resolution levels accepted (VQ-16 has 5) */
#define FLEXDIAG_VQ_MAX_RES 8    /* ResBlocks per level accepted (VQ-16 has 3) */

/* Decoder shape. Level l (0 = full resolution) has ch·ch_mult[l] channels; the decoder runs
 * the levels from n_levels-1 (lowest resolution, checkpoint `conv_blocks.0`) down to 0. */
typedef struct flexdiag_vq_config {
    int32_t codebook_size;                 /* V: valid image ids are 0..V-1 (16384) */
    int32_t embed_dim;                     /* codebook vector length (8) */
    int32_t z_channels;                    /* post_quant_conv output, conv_in input (256) */
    int32_t ch;                            /* base channels (128) */
    int32_t n_levels;                      /* resolution levels, len(ch_mult) (5) */
    int32_t ch_mult[FLEXDIAG_VQ_MAX_LEVELS]; /* channel multiplier per level ((1,1,2,2,4)) */
    int32_t attn[FLEXDIAG_VQ_MAX_LEVELS];  /* 1: an AttnBlock follows each ResBlock (level
                                              n_levels-1 only, in both layouts) */
    int32_t res_blocks;                    /* ResBlocks per decoder level (3) */
    int32_t out_channels;                  /* conv_out channels (3, RGB) */
    int32_t grid_h, grid_w;                /* token grid (24 × 24); ids in raster order */
    int32_t groups;                        /* GroupNorm groups (32) */
    float eps;                             /* GroupNorm epsilon (1e-6) */
} flexdiag_vq_config;

typedef struct flexdiag_vq flexdiag_vq;

/* ---- config ---- */

/* The VQ-16 constants of Janus-Pro (docs/architecture.md §4.4). */
void flexdiag__vq_config_default(flexdiag_vq_config *c);
/* Parse the VQ part of a config.json text (either layout); path names the file in messages. */
flexdiag_status flexdiag__vq_config_parse(const char *json_text, const char *path,
                                          flexdiag_vq_config *out);
/* Read and parse path (a config.json). */
flexdiag_status flexdiag__vq_config_read(const char *path, flexdiag_vq_config *out);
/* Check sizes are positive, bounded and GroupNorm-compatible; message names the field. */
flexdiag_status flexdiag__vq_config_validate(const flexdiag_vq_config *c);
/* Output image height and width in pixels: grid · 2^(n_levels-1). */
void flexdiag__vq_image_size(const flexdiag_vq_config *c, int32_t *h, int32_t *w);

/* ---- decoder ---- */

/* Load the decoder weights of cfg from st (borrowed, may be closed after the call) into
 * backend memory of k and size scratch for max_batch images decoded together. Every needed
 * tensor is checked for presence and shape first. *out is NULL on failure. */
flexdiag_status flexdiag__vq_create(const flexdiag_kernels *k, flexdiag_stream *s,
                                    const flexdiag_safetensors *st, const flexdiag_vq_config *cfg,
                                    int64_t max_batch, flexdiag_vq **out);
/* A decoder of shape cfg with seeded random weights (builtin models, speed runs). */
flexdiag_status flexdiag__vq_create_random(const flexdiag_kernels *k, flexdiag_stream *s,
                                           const flexdiag_vq_config *cfg, uint64_t seed,
                                           int64_t max_batch, flexdiag_vq **out);
/* flexdiag__vq_create from a model folder: its config.json and safetensors file(s). */
flexdiag_status flexdiag__vq_load(const flexdiag_kernels *k, flexdiag_stream *s,
                                  const char *model_dir, int64_t max_batch, flexdiag_vq **out);
/* Decode n images: ids (n, grid_h·grid_w) host int32 (copied) -> pixels_out (n, H, W, 3) host
 * f32 in the model's range (≈ [-1, 1]), NHWC. Ids outside [0, V) give
 * FLEXDIAG_ERR_INVALID_ARG naming the first one. Runs max_batch images per pass; returns
 * after the pixels are on the host. */
flexdiag_status flexdiag__vq_decode(flexdiag_vq *vq, flexdiag_stream *s, const int32_t *ids,
                                    int64_t n, float *pixels_out);
/* The config the decoder was built with (borrowed, lives as long as vq). */
const flexdiag_vq_config *flexdiag__vq_get_config(const flexdiag_vq *vq);
/* Dry run: backend bytes flexdiag__vq_create would allocate for cfg on any backend (weights
 * incl. the fp32 codebook; fp32 scratch for max_batch images). */
flexdiag_status flexdiag__vq_plan(const flexdiag_vq_config *cfg, int64_t max_batch,
                                  size_t *weight_bytes, size_t *scratch_bytes);
/* Backend bytes held: weights and scratch. */
void flexdiag__vq_bytes(const flexdiag_vq *vq, size_t *weight_bytes, size_t *scratch_bytes);
/* Free everything; NULL is a no-op. */
void flexdiag__vq_destroy(flexdiag_vq *vq);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_VQ_H */
