/*
 * api_decode.c - the image decoder on its own in the public API (include/flexdiag.h, API
 * version 3): `flexdiag decode` turns token grids into images without loading the language
 * model, and an embedder can do the same.
 *
 * A decoder owns its stream (a runtime's contexts and models each drive their own) and, on the
 * runtime's backend, charges its weights, scratch and stream to the runtime's memory budget up
 * front, as a model's decoder does. A backend without the image ops decodes on the CPU. One
 * decode call at a time: the scratch is sized for one pass of max_batch images.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/api_check.h"
#include "runtime/engine/engine.h"
#include "runtime/image/vq.h"
#include "runtime/model/safetensors.h"

/* Bytes of flexdiag_decoder_info in API version 3: the least a caller may pass. */
#define DECODER_INFO_V3 (offsetof(flexdiag_decoder_info, backend) + sizeof(const char *))

struct flexdiag_decoder {
    flexdiag_runtime *rt;       /* borrowed */
    const flexdiag_kernels *k;  /* backend it decodes on */
    flexdiag_stream *s;         /* its stream (owned) */
    flexdiag_vq *vq;            /* the decoder */
    size_t charge;              /* bytes charged to rt's arena */
    pthread_mutex_t mu;         /* one decode at a time */
};

/* Backend and stream for a decoder of shape vc; charges the runtime's budget when on its
 * backend. */
static flexdiag_status decoder_backend(flexdiag_decoder *d, const flexdiag_vq_config *vc,
                                       int32_t max_batch) {
    flexdiag_runtime *rt = d->rt;
    if (!rt->k->conv2d) {
        d->k = flexdiag__kernels_cpu();
        FLEXDIAG_INFO("backend %s has no image-decoder ops: the decoder runs on the CPU",
                      rt->k->name);
        return d->k->stream_create(-1, rt->p.threads, &d->s);
    }
    size_t wb = 0, sb = 0;
    FLEXDIAG_TRY(flexdiag__vq_plan(vc, max_batch, &wb, &sb));
    size_t bytes = wb + sb + rt->k->stream_bytes;
    FLEXDIAG_TRY(flexdiag__arena_charge(&rt->arena, (int64_t)bytes, "the image decoder"));
    d->charge = bytes;
    d->k = rt->k;
    return d->k->stream_create(rt->p.device, rt->p.threads, &d->s);
}

/* Shape and weights of path's decoder: a Chameleon folder's vqgan.safetensors (grid from its
 * config), else the Janus decoder of config.json and the checkpoint. */
static flexdiag_status decoder_source(const char *path, flexdiag_vq_config *vc,
                                      flexdiag_safetensors **st) {
    flexdiag_model_config mc;
    if (flexdiag__config_load(path, &mc) == FLEXDIAG_OK && mc.arch == FLEXDIAG_ARCH_CHAMELEON) {
        FLEXDIAG_TRY(flexdiag__vqgan_find(path, mc.grid, vc, st));
        if (!*st)
            return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND,
                                 "%s/vqgan.safetensors: no such file; Lumina-mGPT checkpoints "
                                 "carry no image decoder: put the Chameleon VQGAN there "
                                 "(docs/formats.md)",
                                 path);
        return FLEXDIAG_OK;
    }
    flexdiag__err_clear();
    char cj[4096];
    if (snprintf(cj, sizeof cj, "%s/config.json", path) >= (int)sizeof cj)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "decoder: model path too long");
    FLEXDIAG_TRY(flexdiag__vq_config_read(cj, vc));
    return flexdiag__st_open(path, st);
}

static flexdiag_status decoder_open(flexdiag_decoder *d, const char *path, int32_t max_batch) {
    flexdiag_vq_config vc;
    flexdiag_safetensors *st = NULL;
    FLEXDIAG_TRY(decoder_source(path, &vc, &st));
    flexdiag_status r = decoder_backend(d, &vc, max_batch);
    if (r == FLEXDIAG_OK) r = flexdiag__vq_create(d->k, d->s, st, &vc, max_batch, &d->vq);
    flexdiag__st_close(st);
    return r;
}

flexdiag_status flexdiag_decoder_load(flexdiag_runtime *rt, const char *path, int32_t max_batch,
                                      flexdiag_decoder **out) {
    flexdiag__err_clear();
    if (!rt || !path || !out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "decoder_load: NULL argument");
    *out = NULL;
    if (max_batch < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "decoder_load: max_batch %d must be >= 1",
                             (int)max_batch);
    flexdiag_decoder *d = calloc(1, sizeof *d);
    if (!d) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "decoder: no memory");
    d->rt = rt;
    pthread_mutex_init(&d->mu, NULL);
    flexdiag_status st = decoder_open(d, path, max_batch);
    if (st != FLEXDIAG_OK) {
        flexdiag_decoder_destroy(d);
        return st;
    }
    *out = d;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_decoder_get_info(const flexdiag_decoder *d, flexdiag_decoder_info *out) {
    flexdiag__err_clear();
    if (!d || !out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "decoder_get_info: NULL argument");
    FLEXDIAG_TRY(flexdiag__check_output(out->struct_size, DECODER_INFO_V3, sizeof *out,
                                        "flexdiag_decoder_info"));
    const flexdiag_vq_config *c = flexdiag__vq_get_config(d->vq);
    flexdiag_decoder_info info = {.struct_size = out->struct_size, .grid_h = c->grid_h,
                                  .grid_w = c->grid_w, .codebook_size = c->codebook_size,
                                  .backend = d->k->name};
    flexdiag__vq_image_size(c, &info.image_h, &info.image_w);
    memcpy(out, &info, out->struct_size);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_decoder_decode(flexdiag_decoder *d, const int32_t *tokens, int32_t n,
                                        float *pixels) {
    flexdiag__err_clear();
    if (!d || !tokens || !pixels || n < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "decoder_decode: NULL argument or n < 0");
    pthread_mutex_lock(&d->mu);
    flexdiag_status st = flexdiag__vq_decode(d->vq, d->s, tokens, n, pixels);
    pthread_mutex_unlock(&d->mu);
    return st;
}

void flexdiag_decoder_destroy(flexdiag_decoder *d) {
    if (!d) return;
    flexdiag__vq_destroy(d->vq);
    if (d->s) d->k->stream_destroy(d->s);
    flexdiag__arena_charge(&d->rt->arena, -(int64_t)d->charge, "the image decoder");
    pthread_mutex_destroy(&d->mu);
    free(d);
}
