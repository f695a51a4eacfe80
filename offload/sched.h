/*
 * sched.h - the scheduler: who hands each (layer, micro-batch) of a step its memory.
 *
 * The engine runs every prefill chunk and decode step layer-major (docs/architecture.md §4):
 *
 *     for layer j: for micro-batch k: acquire(j, k) -> layer forward -> release(j, k)
 *
 * acquire fills a flexdiag_sched_io with the device addresses of layer j's weight block, the KV
 * cache of the micro-batch's sequences in layer j and the micro-batch's activation rows, valid
 * for work queued on the compute stream after the call. release says the forward that used them
 * has been queued, so an offloading scheduler may recycle a weight slot or write KV back once
 * the compute stream passes that point. The scheduler deals in bytes and geometry only (a
 * layer's weights are one block, a sequence's K or V of one layer one span); the engine maps
 * a weight block to named tensors (runtime/model/model.h flexdiag__layer_view).
 *
 * Implementations behind flexdiag_sched_ops:
 *   sched_resident.c  everything lives on the device: acquire is address arithmetic over the
 *                     layout, release does nothing; both are safe inside CUDA-graph capture,
 *                     so the engine records a whole decode step as one graph.
 * A tiered scheduler (pinned host and NVMe homes, weight slots filled ahead on a copy stream,
 * events between streams) implements the same two calls.
 */
#ifndef FLEXDIAG_SCHED_H
#define FLEXDIAG_SCHED_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/sched.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* Where a context's data lives when everything is on the device (the resident placement). */
typedef struct flexdiag_sched_layout {
    int32_t n_layers;     /* decoder layers */
    const void *weights;  /* device address of layer 0's weight block */
    size_t layer_bytes;   /* bytes from one layer's weight block to the next */
    void *kv;             /* device KV cache: (n_layers, 2 (K, V), n_seq, seq_bytes) bytes */
    int32_t n_seq;        /* sequences the cache holds (capacity) */
    size_t seq_bytes;     /* bytes of one sequence's K (or V) in one layer */
    void *act;            /* device activations: (n_seq, rows_per_seq, row_bytes) bytes */
    size_t row_bytes;     /* bytes of one activation row (hidden size × element size) */
} flexdiag_sched_layout;

/* One (layer, micro-batch) of a step: the caller fills the first four fields, acquire the rest. */
typedef struct flexdiag_sched_io {
    int32_t layer;        /* j, 0 <= j < n_layers */
    int32_t s0, n_seq;    /* the micro-batch's sequences [s0, s0 + n_seq) */
    int32_t rows_per_seq; /* activation rows per sequence: the prompt capacity in prefill, 1 in
                             a decode step */
    const void *weights;  /* out: layer j's weight block */
    void *k, *v;          /* out: K and V of layer j for sequence s0 (n_seq consecutive spans) */
    void *x;              /* out: activation rows of sequence s0 (n_seq · rows_per_seq rows) */
} flexdiag_sched_io;

typedef struct flexdiag_sched flexdiag_sched;

typedef struct flexdiag_sched_ops {
    const char *name; /* "resident", ... (bench rows, messages) */
    /* Fill io's addresses for layer io->layer and sequences io->s0.. (see above). */
    flexdiag_status (*acquire)(flexdiag_sched *s, flexdiag_sched_io *io);
    /* The forward over io has been queued on the compute stream. */
    flexdiag_status (*release)(flexdiag_sched *s, const flexdiag_sched_io *io);
    void (*destroy)(flexdiag_sched *s);
} flexdiag_sched_ops;

struct flexdiag_sched {
    const flexdiag_sched_ops *ops; /* implementation */
    flexdiag_sched_layout lay;     /* copy of the layout it was created with */
};

/* The all-device scheduler over lay (copied); *out is owned by the caller (destroy). */
flexdiag_status flexdiag__sched_resident_create(const flexdiag_sched_layout *lay,
                                                flexdiag_sched **out);

static inline flexdiag_status flexdiag__sched_acquire(flexdiag_sched *s, flexdiag_sched_io *io) {
    return s->ops->acquire(s, io);
}

static inline flexdiag_status flexdiag__sched_release(flexdiag_sched *s,
                                                      const flexdiag_sched_io *io) {
    return s->ops->release(s, io);
}

/* Free s; NULL is a no-op. */
static inline void flexdiag__sched_destroy(flexdiag_sched *s) {
    if (s) s->ops->destroy(s);
}

#endif /* FLEXDIAG_SCHED_H */
