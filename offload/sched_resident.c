/*
 * sched_resident.c - the all-device scheduler (sched.h): weights, KV cache and activations
 * live on the device for the whole run, so acquire is address arithmetic over the layout and
 * release has nothing to do. Neither call touches a stream, which keeps a decode step
 * recordable as one CUDA graph, and any visit order will do (no begin: it needs no plan).
 */
#include <stdlib.h>

#include "base/core.h"
#include "offload/sched.h"

void flexdiag__sched_locate(const flexdiag_sched_layout *l, flexdiag_sched_io *io) {
    FLEXDIAG_DASSERT(io->layer >= 0 && io->layer < l->n_layers);
    FLEXDIAG_DASSERT(io->s0 >= 0 && io->n_seq >= 1 &&
                     (io->s0 >= l->n_seq || io->s0 + io->n_seq <= l->n_seq));
    size_t j = (size_t)io->layer, s0 = (size_t)io->s0;
    io->x = (char *)l->act + s0 * (size_t)io->rows_per_seq * l->row_bytes;
    io->k = io->v = NULL; /* sequences past the device cache: their KV home is elsewhere */
    if (io->s0 >= l->n_seq) return;
    io->k = (char *)l->kv + ((j * 2 + 0) * (size_t)l->n_seq + s0) * l->seq_bytes;
    io->v = (char *)l->kv + ((j * 2 + 1) * (size_t)l->n_seq + s0) * l->seq_bytes;
}

static flexdiag_status resident_acquire(flexdiag_sched *s, flexdiag_sched_io *io) {
    const flexdiag_sched_layout *l = &s->lay;
    flexdiag__sched_locate(l, io);
    io->weights = (const char *)l->weights + (size_t)io->layer * l->layer_bytes;
    io->weights_res = io->weights;
    io->res_bytes = l->layer_bytes;
    return FLEXDIAG_OK;
}

static flexdiag_status resident_release(flexdiag_sched *s, const flexdiag_sched_io *io) {
    (void)s; /* nothing was staged */
    (void)io;
    return FLEXDIAG_OK;
}

static void resident_destroy(flexdiag_sched *s) { free(s); }

static const flexdiag_sched_ops resident_ops = {
    .name = "resident",
    .graph_safe = 1,
    .acquire = resident_acquire,
    .release = resident_release,
    .destroy = resident_destroy,
};

flexdiag_status flexdiag__sched_resident_create(const flexdiag_sched_layout *lay,
                                                flexdiag_sched **out) {
    *out = NULL;
    flexdiag_sched *s = calloc(1, sizeof *s);
    if (!s) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "scheduler: out of host memory");
    s->ops = &resident_ops;
    s->lay = *lay;
    s->any_order = 1;
    *out = s;
    return FLEXDIAG_OK;
}
