/*
 * vq.h - the VQ image decoders (docs/architecture.md §4.4): image token ids (codebook indices) ->
 * float pixels, run entirely through the backend op table so the same code serves CPU and CUDA.
 *
 * Two checkpoint layouts share one decoder (the same ops in the same order: conv_in, mid
 * ResBlock / AttnBlock / ResBlock, levels of ResBlocks [+ AttnBlocks] with nearest ×2 + 3×3
 * upsampling, GroupNorm + swish, conv_out); they differ only in tensor names, up-block order,
 * where level attention sits and whether the codebook is L2-normalised:
 *  - Janus-Pro's VQ-16 (LlamaGen), FLEXDIAG_VQ_LAYOUT_JANUS: shape from config.json, either the
 *    transformers `janus` layout (vq_config: embed_dim, num_embeddings, latent_channels,
 *    base_channels, channel_multiplier, num_res_blocks; grid from num_patches or vision_config
 *    image_size / patch_size) or the original deepseek-ai `multi_modality` one
 *    (gen_vision_config.params image_token_size, n_embed; every other shape is the fixed VQ-16
 *    constant). Weights are resolved by their original (canonical) names; transformers names
 *    are rewritten by flexdiag__name_canonical. Codebook L2-normalised; attention in the mid
 *    block and after every ResBlock of the lowest-resolution level.
 *  - Chameleon / Lumina-mGPT's VQGAN (taming-transformers), FLEXDIAG_VQ_LAYOUT_TAMING: one
 *    user-supplied safetensors file whose tensor shapes give every size
 *    (flexdiag__vq_config_vqgan); names as taming writes them, `decoder.up.L` with L = 0 the
 *    full resolution (the reverse of the Janus order); raw codebook; attention in the mid block
 *    only (and after the ResBlocks of any level that has `decoder.up.L.attn.*`, taming's
 *    attn_resolutions).
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
#define FLEXDIAG_VQGAN_GROUPS 32 /* GroupNorm groups of taming's Normalize (Chameleon's VQGAN) */

/* Tensor naming and up-block order of a decoder checkpoint (docs/formats.md §2.3). */
typedef enum flexdiag_vq_layout {
    FLEXDIAG_VQ_LAYOUT_JANUS = 0,  /* gen_vision_model.decoder.{mid.0..2, conv_blocks.B.res.R};
                                      B = 0 lowest resolution; transformers names accepted */
    FLEXDIAG_VQ_LAYOUT_TAMING = 1, /* decoder.{mid.block_1/attn_1/block_2, up.L.block.R};
                                      L = 0 full resolution; names exactly as stored */
} flexdiag_vq_layout;

/* Decoder shape. Level l (0 = full resolution) has ch·ch_mult[l] channels; the decoder runs
 * the levels from n_levels-1 (lowest resolution: Janus `conv_blocks.0`, taming
 * `up.<n_levels-1>`) down to 0. The mid block always has its AttnBlock. */
typedef struct flexdiag_vq_config {
    int32_t codebook_size;                 /* V: valid image ids are 0..V-1 (16384) */
    int32_t embed_dim;                     /* codebook vector length (8) */
    int32_t z_channels;                    /* post_quant_conv output, conv_in input (256) */
    int32_t ch;                            /* base channels (128) */
    int32_t n_levels;                      /* resolution levels, len(ch_mult) (5) */
    int32_t ch_mult[FLEXDIAG_VQ_MAX_LEVELS]; /* channel multiplier per level ((1,1,2,2,4)) */
    int32_t attn[FLEXDIAG_VQ_MAX_LEVELS];  /* 1: an AttnBlock follows each ResBlock (Janus:
                                              level n_levels-1 only; Chameleon: none) */
    int32_t res_blocks;                    /* ResBlocks per decoder level (3) */
    int32_t out_channels;                  /* conv_out channels (3, RGB) */
    int32_t grid_h, grid_w;                /* token grid (24 × 24); ids in raster order */
    int32_t groups;                        /* GroupNorm groups (32) */
    float eps;                             /* GroupNorm epsilon (1e-6) */
    int32_t layout;                        /* flexdiag_vq_layout: tensor names (JANUS) */
    int32_t l2_codebook;                   /* 1: codebook rows L2-normalised at load (Janus);
                                              0: used as stored (taming VQGAN) */
} flexdiag_vq_config;

typedef struct flexdiag_vq flexdiag_vq;

/* ---- config ---- */

/* The VQ-16 constants of Janus-Pro (docs/architecture.md §4.4), Janus layout. */
void flexdiag__vq_config_default(flexdiag_vq_config *c);
/* The VQGAN of Chameleon / Lumina-mGPT-7B-512: codebook 8192 × 256, z 256, ch 128, ch_mult
 * (1,1,2,2,4), 3 ResBlocks per level, mid attention only, GroupNorm(32, 1e-6), 32 × 32 grid
 * (512 × 512 pixels), taming layout, raw codebook; 41.46 M parameters. For builtin models and
 * speed runs with random weights; a checkpoint's shape comes from flexdiag__vq_config_vqgan. */
void flexdiag__vq_config_chameleon(flexdiag_vq_config *c);
/* Parse the VQ part of a config.json text (either layout); path names the file in messages. */
flexdiag_status flexdiag__vq_config_parse(const char *json_text, const char *path,
                                          flexdiag_vq_config *out);
/* Read and parse path (a config.json). */
flexdiag_status flexdiag__vq_config_read(const char *path, flexdiag_vq_config *out);
/* Check sizes are positive, bounded and GroupNorm-compatible; message names the field. */
flexdiag_status flexdiag__vq_config_validate(const flexdiag_vq_config *c);
/* Output image height and width in pixels: grid · 2^(n_levels-1). */
void flexdiag__vq_image_size(const flexdiag_vq_config *c, int32_t *h, int32_t *w);
/* The shape of the taming / Chameleon VQGAN decoder in st (borrowed): codebook rows and dim
 * from quantize.embedding.weight, z_channels from decoder.conv_in, ch from decoder.conv_out,
 * levels from the decoder.up.L indices, ResBlocks per level from up.0's block.R indices,
 * ch_mult from each level's block.0.conv1, level attention from up.L.attn.0; GroupNorm groups
 * (0: FLEXDIAG_VQGAN_GROUPS) and eps 1e-6, the grid and the layout are not in the file. Only
 * the tensors it reads are checked here (message names the file and tensor);
 * flexdiag__vq_create checks all of them. Validated. */
flexdiag_status flexdiag__vq_config_vqgan(const flexdiag_safetensors *st, int32_t grid_h,
                                          int32_t grid_w, int32_t groups,
                                          flexdiag_vq_config *out);

/* A Chameleon (Lumina-mGPT) model folder's user-supplied decoder: dir/vqgan.safetensors opened
 * into *st (close it; NULL when the file is absent: the model writes token grids only) and its
 * shape for grid x grid codes into *vc. */
flexdiag_status flexdiag__vqgan_find(const char *dir, int32_t grid, flexdiag_vq_config *vc,
                                     flexdiag_safetensors **st);

/* ---- which decoder a model gets (vq_choice.c) ---- */

/* Images per decoder pass of a model's decoder. Its fp32 scratch (229 MB per VQ-16 image) is
 * charged to the device budget, where KV memory is worth more than the few percent of decode
 * speed a larger pass gains (H200: 7.2 ms per image at 4 per pass, 6.9 at 16; test_vq_cuda
 * times 2 and 16). */
#define FLEXDIAG__VQ_BATCH 2

struct flexdiag_model_config;
/* The decoder of a builtin Janus shape c (seeded random weights): VQ-16, or for the toy shapes
 * (hidden < 1024) 3 levels of 32/64 channels with a 4x upscale. */
void flexdiag__vq_config_builtin(const struct flexdiag_model_config *c, flexdiag_vq_config *out);
/* The decoder of the model folder at path (config c, checkpoint st borrowed): *found 0 (none:
 * the model writes token grids only) or 1 with its shape in *vc; a Chameleon folder's
 * vqgan.safetensors comes back open in *vqgan (close it), a Janus decoder lives in st (*vqgan
 * NULL). */
flexdiag_status flexdiag__vq_config_of_dir(const struct flexdiag_model_config *c,
                                           const flexdiag_safetensors *st, const char *path,
                                           flexdiag_vq_config *vc, flexdiag_safetensors **vqgan,
                                           int *found);
/* Backend bytes of a decoder of shape vc at FLEXDIAG__VQ_BATCH images per pass (weights and
 * scratch; flexdiag__vq_plan). */
flexdiag_status flexdiag__vq_device_bytes(const flexdiag_vq_config *vc, uint64_t *out);

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
/* flexdiag__vq_create from a model folder: its config.json and safetensors file(s) (Janus). */
flexdiag_status flexdiag__vq_load(const flexdiag_kernels *k, flexdiag_stream *s,
                                  const char *model_dir, int64_t max_batch, flexdiag_vq **out);
/* The taming / Chameleon VQGAN decoder of the safetensors file at path (borrowed): open it,
 * derive the shape (flexdiag__vq_config_vqgan; groups 0: FLEXDIAG_VQGAN_GROUPS), check every
 * tensor's presence and shape (FLEXDIAG_ERR_CORRUPT_MODEL naming the file, the tensor and the
 * expected shape; decoder tensors the shape does not use are an error too), load it as
 * flexdiag__vq_create does and close the file. *out is NULL on failure. */
flexdiag_status flexdiag__vq_open_vqgan(const flexdiag_kernels *k, flexdiag_stream *s,
                                        const char *path, int32_t grid_h, int32_t grid_w,
                                        int32_t groups, int64_t max_batch, flexdiag_vq **out);
/* Decode n images: ids (n, grid_h·grid_w) host int32 codebook indices in raster order (copied)
 * -> pixels_out (n, H, W, 3) host f32 in the model's range (≈ [-1, 1]), NHWC. Ids outside
 * [0, V) give FLEXDIAG_ERR_INVALID_ARG naming the first one. Runs max_batch images per pass;
 * returns after the pixels are on the host. */
flexdiag_status flexdiag__vq_decode(flexdiag_vq *vq, flexdiag_stream *s, const int32_t *ids,
                                    int64_t n, float *pixels_out);
/* The decoder's codebook (codebook_size, embed_dim) f32 into host out, as the decoder looks its
 * rows up (L2-normalised when cfg.l2_codebook); returns after the copy (stream s). */
flexdiag_status flexdiag__vq_codebook(const flexdiag_vq *vq, flexdiag_stream *s, float *out);
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
