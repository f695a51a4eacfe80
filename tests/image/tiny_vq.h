/*
 * tiny_vq.h - test helpers for the VQ decoder: a small random decoder (host bf16 tensors under
 * the original names), writing it as a model folder under either naming scheme, the
 * transformers <-> original name maps written independently of runtime/names.c, the same
 * weights under taming / Chameleon VQGAN names (one safetensors file), and a naive
 * double-precision decoder built from naive_vq.c that serves as the oracle of the pipeline.
 */
#ifndef FLEXDIAG_TEST_TINY_VQ_H
#define FLEXDIAG_TEST_TINY_VQ_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/image/vq.h"
#include "st_write.h"

typedef struct tv_tensor {
    char name[192];   /* original (canonical) name */
    int ndim;         /* rank */
    int64_t shape[4]; /* dims */
    uint16_t *data;   /* bf16 values */
} tv_tensor;

typedef struct tv_model {
    flexdiag_vq_config cfg; /* shape it was built for */
    tv_tensor *t;           /* tensors in execution order */
    int n, cap;             /* count, capacity */
} tv_model;

/* Random weights for cfg: conv weights N(0, 1/fan_in), norm gammas near 1, so activations stay
 * of order 1 through the whole decoder. */
/* The small decoder the tests share: 3 levels (64, 32, 32 channels), 2 ResBlocks per level,
 * 3x3 grid -> 12x12 pixels, so every kind of block (attention, nin_shortcut, two upsamples, a
 * level without either) appears. */
flexdiag_vq_config tv_tiny_config(void);
void tv_build(tv_model *m, const flexdiag_vq_config *cfg, uint64_t seed);
void tv_free(tv_model *m);
/* Tensor by original name, or NULL. */
tv_tensor *tv_get(const tv_model *m, const char *name);
/* config.json text (transformers janus layout) for cfg; malloc'ed. */
char *tv_config_json(const flexdiag_vq_config *cfg);
/* Write dir/config.json and dir/model.safetensors (transformers names when hf != 0); skip names
 * the tensor to leave out (or NULL). Returns 0 on success. */
int tv_write(const tv_model *m, const char *dir, int hf, const char *skip);
/* Name maps between the original and the transformers scheme; 0 on success. */
int tv_name_to_hf(const char *orig, char *out, size_t n);
int tv_name_from_hf(const char *hf, char *out, size_t n);
/* The taming VQGAN name of an original name (gen_vision_model. dropped, conv_blocks.B ->
 * up.<n_levels-1-B> with res -> block, mid.0/1/2 -> mid.block_1/attn_1/block_2); 0 on success. */
int tv_name_to_taming(const char *orig, int n_levels, char *out, size_t n);
/* Write path (one safetensors file) with taming names; skip names (taming) a tensor to leave
 * out or is NULL; extra is one more tensor to add or NULL. Returns 0 on success. */
int tv_write_vqgan(const tv_model *m, const char *path, const char *skip,
                   const flexdiag_st_entry *extra);
/* Naive decode: ids (n, grid) -> pixels (n, H, W, 3) in double; the codebook rows are
 * L2-normalised when m->cfg.l2_codebook. */
void tv_naive_decode(const tv_model *m, const int32_t *ids, int64_t n, double *pixels);

#endif /* FLEXDIAG_TEST_TINY_VQ_H */
