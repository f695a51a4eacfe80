/*
 * sched.h - the scheduler: who hands each (layer, micro-batch) of a step its memory.
 *
 * The engine runs every prefill chunk and decode step layer-major (docs/architecture.md §4):
 *
 *     for layer j: for micro-batch k: acquire(j, k) -> layer forward -> release(j, k)
 *
 * and says so before each pass: begin(plan) hands the scheduler the pass's visits in the order
 * they will come (flexdiag_pass_plan: which layer, which sequences, which KV rows each touches),
 * so a scheduler that moves data prefetches what the plan says comes next instead of guessing.
 * A scheduler states whether it takes visits in any order (any_order: address arithmetic) or
 * needs the layer-major cycle (a ring of weight slots, staging regions that alternate).
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
 *   sched_tiered.c    layer weights split over device, pinned host and disk
 *                     (offload/weight_homes.h): a ring of device weight slots filled ahead on a
 *                     copy stream, disk reads kept in flight further ahead into pinned staging,
 *                     events between the streams and no device-wide synchronisation; KV and
 *                     activations are located as in the resident scheduler.
 *   sched_kv.c        wraps either of them when the last micro-batches keep their KV in pinned
 *                     host memory or on disk (kv_disk.c): their layer's K/V spans are loaded
 *                     into two device staging buffers and written back, on copy streams
 *                     ordered by events; disk-homed ones pass through pinned staging.
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
#include "offload/host_pool.h"

/* Where a context's data lives when everything is on the device (the resident placement). */
typedef struct flexdiag_sched_layout {
    int32_t n_layers;     /* decoder layers */
    const void *weights;  /* device address of layer 0's weight block */
    size_t layer_bytes;   /* bytes from one layer's weight block to the next */
    void *kv;             /* device KV cache: (n_layers, 2 (K, V), n_seq, seq_bytes) bytes */
    int32_t n_seq;        /* sequences the device cache holds: the first n_seq of the block
                             (the rest have their KV home elsewhere: sched_kv.c) */
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
    const void *weights;  /* out: layer j's weight block, for the tensors that end after
                             res_bytes */
    const void *weights_res; /* out: the block the tensors ending at or before res_bytes read
                                (the device-resident prefix of a split layer; == weights when
                                the whole layer is in one place) */
    size_t res_bytes;     /* out: see weights_res */
    /* the caller also says which rows of each (sequence, KV head) block of a K/V span the
     * forward touches (rows 0 .. p_cap-1 the prompt, then the ring), for schedulers that move
     * the KV: it reads rows [0, kv_prompt) and [p_cap, p_cap + kv_ring), and writes rows
     * [kv_w0, kv_w0 + kv_wn); kv_wn < 0: some row of [p_cap, p_cap + kv_ring) that differs by
     * head */
    int32_t kv_prompt, kv_ring, kv_w0, kv_wn;
    /* in a decode step of a sparse policy the forward reads only the ring rows its slot lists
     * name (kernels.h flexdiag_attn_args: (n_seq, KV heads, kv_max_slots) lists, kv_n_slots
     * valid entries each, at most kv_attend < kv_ring), in backend memory and written on the
     * compute stream before the pass's begin(); NULL: every
     * resident row [p_cap, p_cap + kv_ring) is read */
    const int32_t *kv_slots, *kv_n_slots;
    int32_t kv_max_slots, kv_attend;
    /* in a decode step: the caller computes this micro-batch's attention on the host (CPU
     * attention), so a scheduler whose KV home for it is host memory moves none of its KV and
     * hands the home's own addresses in k and v (kv_host set), valid for work ordered after
     * what is queued on the compute stream after the call; 0: the device attends */
    int32_t host_attend;
    int32_t kv_host;      /* out: k and v are host addresses (see host_attend) */
    void *k, *v;          /* out: K and V of layer j for sequence s0 (n_seq consecutive spans) */
    void *x;              /* out: activation rows of sequence s0 (n_seq · rows_per_seq rows) */
} flexdiag_sched_io;

/* What one visit of a pass does with its (layer, sequences). */
typedef enum flexdiag_visit_op {
    FLEXDIAG_VISIT_FORWARD = 0, /* acquire -> the layer forward -> release */
    FLEXDIAG_VISIT_SEND = 1,    /* acquire -> the first half of a decode forward whose attention
                                   the host computes (CPU attention) */
    FLEXDIAG_VISIT_FINISH = 2,  /* its second half -> release (after the SEND of the same layer
                                   and sequences) */
} flexdiag_visit_op;

/* One visit: the fields of the flexdiag_sched_io its acquire will carry. */
typedef struct flexdiag_visit {
    int32_t op;                             /* flexdiag_visit_op */
    int32_t layer, s0, n_seq;               /* as in flexdiag_sched_io */
    int32_t kv_prompt, kv_ring, kv_w0, kv_wn; /* the KV rows it touches (flexdiag_sched_io) */
    int32_t host_attend;                    /* flexdiag_sched_io host_attend */
} flexdiag_visit;

/* A pass as the engine will run it: its visits in order (every acquire and release the pass
 * makes, nothing else). Prefill passes and decode passes both walk the layers 0 .. L-1, each
 * layer's visits together, unless every acquire is address arithmetic (any_order). */
typedef struct flexdiag_pass_plan {
    int32_t rows_per_seq;    /* activation rows per sequence: the pass's prompt stride in a
                                prefill, 1 in a decode pass */
    int32_t n_visits;
    const flexdiag_visit *v; /* (n_visits) */
    int32_t repeats;         /* a decode pass: the next pass is likely another one with the same
                                visits, each sequence one ring row further (a scheduler may read
                                ahead for it; an admission's prefill may come first instead) */
} flexdiag_pass_plan;

typedef struct flexdiag_sched flexdiag_sched;

/* What a scheduler moved since it was created (all zero for the resident one). */
typedef struct flexdiag_sched_stats {
    uint64_t loads;        /* layer loads into a device slot */
    uint64_t h2d_bytes;    /* host -> device bytes (pinned home and disk staging) */
    uint64_t d2d_bytes;    /* device-prefix rows copied next to the streamed rows of a slot */
    uint64_t disk_bytes;   /* bytes read from the store */
    double disk_wait_s;    /* host seconds spent waiting for disk reads */
    double decode_s;       /* host seconds decoding zstd disk parts (--compress-disk zstd) */
    double slot_wait_s;    /* host seconds spent waiting for a staging buffer to drain */
    uint64_t kv_h2d_bytes; /* KV bytes loaded from the host home (sched_kv.c) */
    uint64_t kv_d2h_bytes; /* KV bytes written back to it */
    uint64_t kv_disk_read_bytes;  /* KV bytes read from the disk home (whole pages) */
    uint64_t kv_disk_write_bytes; /* KV bytes written to it */
    double kv_disk_wait_s;        /* host seconds waiting for it */
    uint64_t kv_disk_gets;        /* disk visits acquired */
    uint64_t kv_disk_hits;        /* of them, the ones whose rows a read ahead had started */
} flexdiag_sched_stats;

typedef struct flexdiag_sched_ops {
    const char *name; /* "resident", "tiered" (bench rows, messages) */
    int graph_safe;   /* acquire and release only do address arithmetic: a step may be
                         recorded as a launch graph */
    /* (optional) The pass of plan comes next: the acquires and releases that follow are its
     * visits, in order. plan stays valid until the next begin. A pass abandoned part-way (a
     * failure, a cancel) is found here and its loads drained. */
    flexdiag_status (*begin)(flexdiag_sched *s, const flexdiag_pass_plan *plan);
    /* Fill io's addresses for layer io->layer and sequences io->s0.. (see above). */
    flexdiag_status (*acquire)(flexdiag_sched *s, flexdiag_sched_io *io);
    /* The forward over io has been queued on the compute stream. */
    flexdiag_status (*release)(flexdiag_sched *s, const flexdiag_sched_io *io);
    void (*destroy)(flexdiag_sched *s);
    /* (optional) counters since creation */
    void (*stats)(const flexdiag_sched *s, flexdiag_sched_stats *out);
} flexdiag_sched_ops;

struct flexdiag_sched {
    const flexdiag_sched_ops *ops; /* implementation */
    flexdiag_sched_layout lay;     /* copy of the layout it was created with */
    int any_order;                 /* visits may come in any order (acquire is address
                                      arithmetic over device memory); 0: layer-major cycles */
};

/* The all-device scheduler over lay (copied); *out is owned by the caller (destroy). */
flexdiag_status flexdiag__sched_resident_create(const flexdiag_sched_layout *lay,
                                                flexdiag_sched **out);
/* The KV and activation addresses of io in layout l (weights left alone): shared by every
 * scheduler while KV and activations live on the device. */
void flexdiag__sched_locate(const flexdiag_sched_layout *l, flexdiag_sched_io *io);

struct flexdiag_weight_homes;

/* Bytes per disk request of the tiered scheduler: large and aligned, many in flight. */
#define FLEXDIAG_SCHED_READ_CHUNK (4u << 20)

typedef struct flexdiag_sched_tiered_params {
    flexdiag_sched_layout lay;                  /* KV and activations (weights unused) */
    const struct flexdiag_weight_homes *homes;  /* where each layer's parts live (borrowed) */
    const flexdiag_kernels *k;                  /* backend */
    int device;                                 /* its device ordinal (the copy stream's) */
    flexdiag_stream *compute;                   /* the stream acquire's users run on (borrowed) */
    void *slots;                                /* n_slots × slot_bytes device bytes (borrowed) */
    int32_t n_slots;                            /* weight slots, >= 2 (capped at the layers) */
    flexdiag_host_pool *pool;                   /* disk staging comes from here (borrowed) */
    int32_t n_stage;                            /* disk staging buffers, >= 2 */
} flexdiag_sched_tiered_params;

/* Device bytes of one weight slot for homes: the streamed part of a layer plus the resident
 * rows of the tensor the device cut splits. */
size_t flexdiag__sched_tiered_slot_bytes(const struct flexdiag_weight_homes *homes);
/* The tiered scheduler (sched_tiered.c); *out is owned by the caller (destroy). */
flexdiag_status flexdiag__sched_tiered_create(const flexdiag_sched_tiered_params *p,
                                              flexdiag_sched **out);

static inline flexdiag_status flexdiag__sched_begin(flexdiag_sched *s,
                                                    const flexdiag_pass_plan *plan) {
    return s->ops->begin ? s->ops->begin(s, plan) : FLEXDIAG_OK;
}

/* The first visit of plan at or after i that acquires (not a FINISH), else -1. */
static inline int32_t flexdiag__plan_next_acquire(const flexdiag_pass_plan *plan, int32_t i) {
    for (; i < plan->n_visits; i++)
        if (plan->v[i].op != FLEXDIAG_VISIT_FINISH) return i;
    return -1;
}

static inline flexdiag_status flexdiag__sched_acquire(flexdiag_sched *s, flexdiag_sched_io *io) {
    return s->ops->acquire(s, io);
}

static inline flexdiag_status flexdiag__sched_release(flexdiag_sched *s,
                                                      const flexdiag_sched_io *io) {
    return s->ops->release(s, io);
}

struct flexdiag_store;

/* KV homes (sched_kv.c): sequences [s_host, s_disk) keep their KV in pinned host memory,
 * [s_disk, n_seq) on disk (kv_disk.h). */
typedef struct flexdiag_sched_kv_params {
    const flexdiag_kernels *k;  /* backend */
    int device;                 /* its device ordinal (the copy streams') */
    flexdiag_stream *compute;   /* the stream acquire's users run on (borrowed) */
    int32_t n_layers;           /* layers of the model (spans in the home) */
    int32_t n_seq;              /* sequences of the block */
    int32_t s_host;             /* first host-homed sequence (a micro-batch boundary) */
    int32_t s_disk;             /* first disk-homed sequence (a micro-batch boundary; n_seq:
                                   none) */
    int32_t mb_seq;             /* sequences per micro-batch (the most one acquire asks for) */
    size_t seq_bytes;           /* bytes of one sequence's K (or V) in one layer: heads blocks */
    int32_t heads;              /* KV heads: blocks per sequence span */
    int32_t p_cap, span_rows;   /* rows of a block: the prompt capacity, then the ring */
    size_t row_bytes;           /* bytes of one row (head_dim × element size) */
    char *host;                 /* (n_layers, 2, s_disk - s_host, seq_bytes) pinned (borrowed) */
    struct flexdiag_store *store; /* the disk home's store (borrowed; NULL without one) */
    uint64_t disk_off;          /* its extent (flexdiag__kv_disk_bytes) */
    char *disk_stage;           /* pinned, flexdiag__kv_disk_stage_bytes (borrowed) */
    void *staging;              /* flexdiag__sched_kv_staging_bytes device bytes (borrowed) */
} flexdiag_sched_kv_params;

/* Device bytes of the two staging buffers. */
size_t flexdiag__sched_kv_staging_bytes(int32_t mb_seq, size_t seq_bytes);
/* A scheduler that hands inner's addresses, except the K/V of host-homed micro-batches, which
 * it stages (see sched_kv.c). Takes inner (destroyed with it, or on failure); *out is owned by
 * the caller. */
flexdiag_status flexdiag__sched_kv_create(flexdiag_sched *inner, const flexdiag_sched_kv_params *p,
                                          flexdiag_sched **out);

/* Free s; NULL is a no-op. */
static inline void flexdiag__sched_destroy(flexdiag_sched *s) {
    if (s) s->ops->destroy(s);
}

#endif /* FLEXDIAG_SCHED_H */
