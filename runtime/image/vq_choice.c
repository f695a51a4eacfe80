/*
 * vq_choice.c - which image decoder a model gets and what it costs on the device (vq.h): the
 * seeded random decoder of a builtin Janus shape, the decoder a model folder carries (Janus-Pro's
 * VQ-16 in its checkpoint, a Chameleon folder's vqgan.safetensors beside it), and the backend
 * bytes of one at the runtime's images per pass. Model loading (runtime/api.c) and the search's
 * cost model (bench/cost_model.c) both ask here, so they cannot disagree.
 */
#include <stdio.h>
#include <string.h>

#include "base/core.h"
#include "runtime/image/vq.h"
#include "runtime/model/model.h"

void flexdiag__vq_config_builtin(const flexdiag_model_config *c, flexdiag_vq_config *out) {
    flexdiag__vq_config_default(out);
    out->codebook_size = c->image_vocab;
    out->grid_h = out->grid_w = c->grid;
    if (c->lm.hidden < 1024) { /* tiny/micro-janus: 3 levels of 32/64 channels, 4x upscale */
        out->ch = 32;
        out->z_channels = 64;
        out->n_levels = 3;
        out->ch_mult[0] = 1, out->ch_mult[1] = 2, out->ch_mult[2] = 2;
        memset(out->attn, 0, sizeof out->attn);
        out->attn[2] = 1;
        out->res_blocks = 1;
    }
}

flexdiag_status flexdiag__vq_config_of_dir(const flexdiag_model_config *c,
                                           const flexdiag_safetensors *st, const char *path,
                                           flexdiag_vq_config *vc, flexdiag_safetensors **vqgan,
                                           int *found) {
    *found = 0;
    *vqgan = NULL;
    if (c->arch == FLEXDIAG_ARCH_CHAMELEON && c->image_vocab > 0) {
        FLEXDIAG_TRY(flexdiag__vqgan_find(path, c->grid, vc, vqgan));
        *found = *vqgan != NULL;
        return FLEXDIAG_OK;
    }
    if (c->arch != FLEXDIAG_ARCH_JANUS ||
        (!flexdiag__st_find(st, "gen_vision_model.quantize.embedding.weight") &&
         !flexdiag__st_find(st, "model.vqmodel.quantize.embedding.weight")))
        return FLEXDIAG_OK;
    char cj[4096];
    snprintf(cj, sizeof cj, "%s/config.json", path);
    FLEXDIAG_TRY(flexdiag__vq_config_read(cj, vc));
    *found = 1;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vq_device_bytes(const flexdiag_vq_config *vc, uint64_t *out) {
    size_t wb = 0, sb = 0;
    FLEXDIAG_TRY(flexdiag__vq_plan(vc, FLEXDIAG__VQ_BATCH, &wb, &sb));
    *out = (uint64_t)(wb + sb);
    return FLEXDIAG_OK;
}
