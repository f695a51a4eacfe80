/*
 * vocab_map.h - Chameleon's image vocabulary (see vocab_map.c): image-code ids, their VQGAN
 * codes, the structural ids of an image.
 */
#ifndef FLEXDIAG_VOCAB_MAP_H
#define FLEXDIAG_VOCAB_MAP_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/model/vocab_map.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "runtime/model/model.h"

/* From config.json's root object (file names it in messages): img_id0, image_vocab, grid,
 * image_tokens and the structural ids of m (m->lm.vocab already parsed). Without a
 * vocabulary_map, or one without image codes, image_vocab stays 0 (text only); with codes that
 * cannot frame an image (a structural token missing, codes not one range) too, the reason in
 * m->no_image. */
struct json_t;
flexdiag_status flexdiag__vocab_map_ids(const char *file, struct json_t *root,
                                        flexdiag_model_config *m);
/* The code of every image id (image_vocab entries, malloc'ed) for a Chameleon model with image
 * codes: read from dir/config.json, or code = id - img_id0 for a builtin shape (dir NULL).
 * *codes stays NULL for other models. */
flexdiag_status flexdiag__vocab_map_codes(const char *dir, const flexdiag_model_config *m,
                                          int32_t **codes);
/* One generated image: ids as the model produced them (Chameleon: grid rows of grid codes +
 * the row end; Janus: the codes) -> out (image_tokens codes in raster order; -1 where an id is
 * not an image code). */
void flexdiag__image_codes(const flexdiag_model_config *m, const int32_t *codes,
                           const int32_t *ids, int32_t *out);

#endif /* FLEXDIAG_VOCAB_MAP_H */
