/*
 * sched_tiered.c - the zig-zag scheduler for layer weights split over device, pinned host and
 * disk (sched.h, weight_homes.h).
 *
 * The engine walks layers in a fixed cycle (0 .. L-1, step after step, prefill chunks and
 * micro-batches inside a layer), so the scheduler loads layers in that cycle into a ring of
 * device slots, one window ahead:
 *
 *   copy stream:  wait slot.free -> H2D the host part -> H2D the disk part from its staging
 *                 buffer -> record slot.ready
 *   compute:      wait slot.ready and copy the split tensor's resident rows next to its
 *                 streamed ones (first micro-batch of the layer) ... record slot.free (each
 *                 release; the last one is what the next load into the slot waits for)
 *   disk:         reads of the next layers' disk parts kept in flight into pinned staging
 *                 buffers, each reused once the event after its H2D has completed
 *
 * Under --compress-disk zstd (weight_homes.h) a layer's disk part is read as its compressed
 * record into the staging buffer's own host buffer, and decoded when the load takes it: the
 * layer's chunks spread over a pool of host threads, straight into the pinned staging buffer the
 * H2D copies from. The reads of the next layers stay in flight meanwhile, as without zstd. A
 * corrupt chunk fails the load with the store file's name and the byte offset.
 *
 * Under compression (weight_homes.h) a slot also holds the layer's packed streamed bytes after
 * its unpacked ones: the copy stream loads the packed bytes, and the compute stream unpacks them
 * (wq4_unpack, plain copies for the rest) right after the resident rows, once per layer per
 * step, before the layer's first micro-batch.
 *
 * Streams order each other only through events; the host blocks only where data must exist on
 * the host first (a disk read the next H2D needs, a staging buffer still being copied), never on
 * the device as a whole. Every pass walks the layers in the cycle (begin() checks its plan: the
 * layers 0 .. L-1, each layer's visits together), so the layers after the last one loaded are
 * the ones the plan, and the pass after it, ask for next. A pass abandoned part-way (a cancel,
 * a failure) leaves loads for layers nobody will ask for: the next begin() drains the copy
 * stream and the reads, and the ring starts again at the plan's first layer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/sched.h"
#include "offload/weight_homes.h"

#define MAX_SLOTS 8
#define MAX_STAGE 8

typedef struct slot {
    char *dev;               /* slot_bytes of device memory */
    int32_t layer;           /* layer loaded or loading, -1 none */
    flexdiag_event *ready;   /* recorded on the copy stream after the load */
    flexdiag_event *free;    /* recorded on the compute stream after each use */
} slot;

typedef struct stage {
    char *buf;                    /* disk_stride bytes of the pinned pool */
    char *zin;                    /* zstd: disk_stride bytes of host memory the record is read
                                     into (4096-aligned), NULL otherwise */
    int32_t layer;                /* layer read or being read, -1 none */
    flexdiag_store_ticket ticket; /* its read batch, 0 when waited for */
    flexdiag_event *done;         /* recorded on the copy stream after the H2D out of buf */
} stage;

typedef struct tiered {
    flexdiag_sched base;
    const flexdiag_weight_homes *h;
    const flexdiag_kernels *k;
    flexdiag_stream *compute, *copy;
    flexdiag_host_pool *pool;
    size_t slot_bytes;
    int32_t n_layers;
    int32_t n_slots, head, count; /* ring: slots head .. head+count-1 hold consecutive layers */
    int32_t n_stage, dhead, dcount; /* ring: staging buffers with reads of consecutive layers */
    int32_t cur;                  /* layer of the micro-batches being acquired, -1 none */
    int32_t left;                 /* acquires the current pass's plan still has to make */
    slot slots[MAX_SLOTS];
    stage stages[MAX_STAGE];
    flexdiag_store_req *reqs;     /* one layer's read requests */
    int32_t n_reqs;
    flexdiag_pz_many *zdec;       /* zstd: the decoders of the disk parts */
    size_t packed_at;             /* q4: offset of the packed bytes in a slot */
    int n_pieces;                 /* q4: the streamed bytes' pieces */
    flexdiag_wpiece pieces[FLEXDIAG_WPIECES_MAX];
    flexdiag_sched_stats st;
} tiered;

static size_t disk_bytes(const tiered *t) {
    return flexdiag__wcut_bytes(&t->h->cut, FLEXDIAG_TIER_DISK);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Where a slot's packed bytes start: after its unpacked ones, congruent to pk[0] modulo 64 so
 * that packed rows keep the alignment they have in the block's packed form. */
static size_t packed_offset(const flexdiag_wcut *c) {
    return align64(c->layer_bytes - c->split_start) + c->pk[0] % 64;
}

/* ---- disk reads into staging ---- */

/* Submit the read of layer j's disk part into stage i (whose previous H2D has completed): into
 * its pinned buffer, or its record buffer under zstd. */
static flexdiag_status read_submit(tiered *t, int32_t i, int32_t j) {
    stage *g = &t->stages[i];
    uint64_t off = flexdiag__whomes_disk_off(t->h, j);
    size_t left = flexdiag__whomes_disk_read(t->h, j);
    char *dst = g->zin ? g->zin : g->buf;
    int32_t n = 0;
    for (size_t at = 0; left > 0; n++) {
        size_t len = left < FLEXDIAG_SCHED_READ_CHUNK ? left : FLEXDIAG_SCHED_READ_CHUNK;
        t->reqs[n] = (flexdiag_store_req){FLEXDIAG_STORE_READ, off + at, len, dst + at};
        at += len, left -= len;
    }
    FLEXDIAG_TRY(flexdiag__store_submit(t->h->store, t->reqs, n, &g->ticket));
    g->layer = j;
    return FLEXDIAG_OK;
}

/* Keep reads in flight for the layers after the last one queued; with block = 0 stop at the
 * first staging buffer still being copied out, with block = 1 wait for it (at least one read
 * is then queued). */
static flexdiag_status read_ahead(tiered *t, int32_t first, int block) {
    while (t->dcount < t->n_stage) {
        int32_t i = (t->dhead + t->dcount) % t->n_stage;
        int32_t j = t->dcount ? (t->stages[(i + t->n_stage - 1) % t->n_stage].layer + 1) %
                                    t->n_layers
                              : first;
        int done = 1;
        FLEXDIAG_TRY(t->k->event_query(t->stages[i].done, &done));
        if (!done && !block) break;
        if (!done) {
            double t0 = flexdiag__now();
            FLEXDIAG_TRY(t->k->event_sync(t->stages[i].done));
            t->st.slot_wait_s += flexdiag__now() - t0;
        }
        FLEXDIAG_TRY(read_submit(t, i, j));
        t->dcount++;
        block = 0;
    }
    return FLEXDIAG_OK;
}

/* zstd: layer j's record in g->zin decoded into g->buf. */
static flexdiag_status decode(tiered *t, stage *g, int32_t j) {
    char what[64];
    snprintf(what, sizeof what, "the disk part of layer %d's weights", j);
    double t0 = flexdiag__now();
    flexdiag_status st = flexdiag__pz_many_decode(
        t->zdec, g->zin, flexdiag__whomes_zoffs(t->h, j), g->buf, disk_bytes(t),
        flexdiag__wcut_disk_elem(&t->h->cut), flexdiag__store_path(t->h->store),
        flexdiag__whomes_disk_off(t->h, j), what);
    t->st.decode_s += flexdiag__now() - t0;
    return st;
}

/* The staging buffer holding layer j's disk part, its read complete (and decoded). */
static flexdiag_status read_take(tiered *t, int32_t j, stage **out) {
    if (t->dcount == 0) FLEXDIAG_TRY(read_ahead(t, j, 1));
    stage *g = &t->stages[t->dhead];
    FLEXDIAG_ASSERT(g->layer == j);
    double t0 = flexdiag__now();
    flexdiag_store_ticket tk = g->ticket;
    g->ticket = 0;
    FLEXDIAG_TRY(flexdiag__store_wait(t->h->store, tk));
    t->st.disk_wait_s += flexdiag__now() - t0;
    t->st.disk_bytes += flexdiag__whomes_disk_read(t->h, j);
    t->dhead = (t->dhead + 1) % t->n_stage;
    t->dcount--;
    if (g->zin) FLEXDIAG_TRY(decode(t, g, j));
    *out = g;
    return FLEXDIAG_OK;
}

/* ---- slot loads on the copy stream ---- */

/* Queue the load of layer j into the next slot of the ring. */
static flexdiag_status load(tiered *t, int32_t j) {
    const flexdiag_wcut *c = &t->h->cut;
    slot *s = &t->slots[(t->head + t->count) % t->n_slots];
    size_t res = c->q4 ? t->packed_at : c->cut[0] - c->split_start;
    size_t cb = flexdiag__wcut_bytes(c, FLEXDIAG_TIER_CPU);
    s->layer = -1;
    FLEXDIAG_TRY(t->k->stream_wait_event(t->copy, s->free));
    if (cb) {
        FLEXDIAG_TRY(t->k->copy_h2d_async(s->dev + res, flexdiag__whomes_host(t->h, j), cb,
                                          t->copy));
        t->st.h2d_bytes += cb;
    }
    if (disk_bytes(t)) {
        stage *g;
        FLEXDIAG_TRY(read_take(t, j, &g));
        FLEXDIAG_TRY(t->k->copy_h2d_async(s->dev + res + cb, g->buf, disk_bytes(t), t->copy));
        FLEXDIAG_TRY(t->k->event_record(g->done, t->copy));
        t->st.h2d_bytes += disk_bytes(t);
        FLEXDIAG_TRY(read_ahead(t, (j + 1) % t->n_layers, 0));
    }
    FLEXDIAG_TRY(t->k->event_record(s->ready, t->copy));
    s->layer = j;
    t->count++;
    t->st.loads++;
    return FLEXDIAG_OK;
}

/* Fill the ring: the layers after the last one loaded (j first when empty). */
static flexdiag_status fill(tiered *t, int32_t j) {
    while (t->count < t->n_slots) {
        int32_t next = t->count ? (t->slots[(t->head + t->count - 1) % t->n_slots].layer + 1) %
                                      t->n_layers
                                : j;
        FLEXDIAG_TRY(load(t, next));
    }
    return FLEXDIAG_OK;
}

/* Forget every load and read: wait for the copy stream and the reads in flight. */
static flexdiag_status drain(tiered *t) {
    flexdiag_status st = t->k->stream_sync(t->copy);
    for (int32_t i = 0; i < t->n_stage; i++) {
        stage *g = &t->stages[i];
        if (g->ticket) {
            flexdiag_status r = flexdiag__store_wait(t->h->store, g->ticket);
            if (st == FLEXDIAG_OK) st = r;
        }
        g->ticket = 0;
        g->layer = -1;
    }
    for (int32_t i = 0; i < t->n_slots; i++) t->slots[i].layer = -1;
    t->head = t->count = t->dhead = t->dcount = 0;
    t->cur = -1;
    return st;
}

/* ---- the scheduler calls ---- */

/* The packed streamed bytes of slot dev unpacked in place, on the compute stream. */
static flexdiag_status unpack(tiered *t, char *dev) {
    const flexdiag_wcut *c = &t->h->cut;
    for (int i = 0; i < t->n_pieces; i++) {
        const flexdiag_wpiece *p = &t->pieces[i];
        char *dst = dev + (p->off - c->split_start);
        const char *src = dev + t->packed_at + (p->poff - c->pk[0]);
        if (p->pack)
            FLEXDIAG_TRY(t->k->wq4_unpack((uint16_t *)dst, (const uint8_t *)src, p->rows, p->cols,
                                          t->compute));
        else
            FLEXDIAG_TRY(t->k->copy_d2d(dst, src, p->bytes, t->compute));
    }
    t->st.d2d_bytes += c->layer_bytes - c->cut[0];
    return FLEXDIAG_OK;
}

static flexdiag_status begin_layer(tiered *t, int32_t j) {
    if (t->cur >= 0) { /* every micro-batch of the previous layer has been released */
        t->head = (t->head + 1) % t->n_slots;
        t->count--;
    }
    t->cur = -1;
    if (t->count && t->slots[t->head].layer != j) /* begin() checked the plan's cycle */
        return flexdiag__err(FLEXDIAG_ERR_INTERNAL,
                             "weight scheduler: layer %d asked for, layer %d loaded next", j,
                             t->slots[t->head].layer);
    FLEXDIAG_TRY(fill(t, j));
    FLEXDIAG_TRY(t->k->stream_wait_event(t->compute, t->slots[t->head].ready));
    /* the split tensor's resident rows go next to its streamed rows on the compute stream, off
     * the copy stream: a device copy there would delay the next layer's H2D (measured: 89 % of
     * the pinned rate at 50,50,0 with it on the copy stream, 100 % at 0,100,0 without one) */
    const flexdiag_wcut *c = &t->h->cut;
    size_t res = c->cut[0] - c->split_start;
    if (res) {
        FLEXDIAG_TRY(t->k->copy_d2d(t->slots[t->head].dev,
                                    flexdiag__whomes_dev(t->h, j) + c->split_start, res,
                                    t->compute));
        t->st.d2d_bytes += res;
    }
    if (c->q4) FLEXDIAG_TRY(unpack(t, t->slots[t->head].dev));
    t->cur = j;
    return FLEXDIAG_OK;
}

/* Whether plan walks the layer cycle: layers 0 .. L-1 in order, each one's visits together
 * (or no visit at all). */
static int plan_in_cycle(const tiered *t, const flexdiag_pass_plan *plan) {
    if (plan->n_visits == 0) return 1;
    int32_t prev = plan->v[0].layer;
    for (int32_t i = 1; i < plan->n_visits; i++) {
        int32_t j = plan->v[i].layer;
        if (j != prev && j != prev + 1) return 0;
        prev = j;
    }
    return plan->v[0].layer == 0 && prev == t->n_layers - 1;
}

static flexdiag_status tiered_begin(flexdiag_sched *s, const flexdiag_pass_plan *plan) {
    tiered *t = (tiered *)s;
    if (!plan_in_cycle(t, plan))
        return flexdiag__err(FLEXDIAG_ERR_INTERNAL,
                             "weight scheduler: a pass that does not walk layers 0..%d in order",
                             t->n_layers - 1);
    if (t->left) FLEXDIAG_TRY(drain(t)); /* the last pass was abandoned part-way */
    t->left = 0;
    for (int32_t i = 0; i < plan->n_visits; i++) t->left += plan->v[i].op != FLEXDIAG_VISIT_FINISH;
    return FLEXDIAG_OK;
}

static flexdiag_status tiered_acquire(flexdiag_sched *s, flexdiag_sched_io *io) {
    tiered *t = (tiered *)s;
    if (io->layer != t->cur) FLEXDIAG_TRY(begin_layer(t, io->layer));
    t->left--;
    flexdiag__sched_locate(&s->lay, io);
    const flexdiag_wcut *c = &t->h->cut;
    /* the slot holds bytes [split_start, layer_bytes) of the block at its offset 0 */
    io->weights = (const char *)((uintptr_t)t->slots[t->head].dev - c->split_start);
    io->weights_res = t->h->dev ? flexdiag__whomes_dev(t->h, io->layer) : io->weights;
    io->res_bytes = c->split_start;
    return FLEXDIAG_OK;
}

static flexdiag_status tiered_release(flexdiag_sched *s, const flexdiag_sched_io *io) {
    tiered *t = (tiered *)s;
    (void)io;
    return t->k->event_record(t->slots[t->head].free, t->compute);
}

static void tiered_stats(const flexdiag_sched *s, flexdiag_sched_stats *out) {
    *out = ((const tiered *)s)->st;
}

static void tiered_destroy(flexdiag_sched *s) {
    tiered *t = (tiered *)s;
    if (t->copy) {
        drain(t);
        t->k->stream_destroy(t->copy);
    }
    for (int32_t i = 0; i < MAX_SLOTS; i++) {
        t->k->event_destroy(t->slots[i].ready);
        t->k->event_destroy(t->slots[i].free);
    }
    for (int32_t i = 0; i < MAX_STAGE; i++) {
        t->k->event_destroy(t->stages[i].done);
        if (t->stages[i].buf) flexdiag__host_pool_free(t->pool, t->stages[i].buf, t->h->disk_stride);
        free(t->stages[i].zin);
    }
    flexdiag__pz_many_destroy(t->zdec);
    free(t->reqs);
    free(t);
}

static const flexdiag_sched_ops tiered_ops = {
    .name = "tiered",
    .graph_safe = 0,
    .begin = tiered_begin,
    .acquire = tiered_acquire,
    .release = tiered_release,
    .destroy = tiered_destroy,
    .stats = tiered_stats,
};

size_t flexdiag__sched_tiered_slot_bytes(const flexdiag_weight_homes *h) {
    const flexdiag_wcut *c = &h->cut;
    if (!c->q4) return c->layer_bytes - c->split_start;
    return align64(packed_offset(c) + (c->pk[2] - c->pk[0]));
}

static flexdiag_status tiered_open(tiered *t, const flexdiag_sched_tiered_params *p) {
    const flexdiag_kernels *k = p->k;
    if (!k->copy_stream_create)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "backend %s has no copy stream: weights cannot be streamed", k->name);
    FLEXDIAG_TRY(k->copy_stream_create(p->device, &t->copy));
    for (int32_t i = 0; i < t->n_slots; i++) {
        t->slots[i] = (slot){.dev = (char *)p->slots + (size_t)i * t->slot_bytes, .layer = -1};
        FLEXDIAG_TRY(k->event_create(t->copy, &t->slots[i].ready));
        FLEXDIAG_TRY(k->event_create(t->copy, &t->slots[i].free));
    }
    if (!disk_bytes(t)) return FLEXDIAG_OK;
    size_t per = (t->h->disk_stride + FLEXDIAG_SCHED_READ_CHUNK - 1) / FLEXDIAG_SCHED_READ_CHUNK;
    t->reqs = calloc(per, sizeof *t->reqs);
    if (!t->reqs) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "scheduler: out of host memory");
    for (int32_t i = 0; i < t->n_stage; i++) {
        stage *g = &t->stages[i];
        g->layer = -1;
        FLEXDIAG_TRY(flexdiag__host_pool_alloc(p->pool, t->h->disk_stride,
                                               "a disk staging buffer of the weight scheduler",
                                               (void **)&g->buf));
        FLEXDIAG_TRY(k->event_create(t->copy, &g->done));
        if (t->h->cut.zstd && posix_memalign((void **)&g->zin, FLEXDIAG_STORE_ALIGN,
                                             t->h->disk_stride) != 0) {
            g->zin = NULL;
            return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                                 "scheduler: no host memory for a compressed disk read");
        }
    }
    if (t->h->cut.zstd)
        FLEXDIAG_TRY(flexdiag__pz_many_create(t->h->threads, FLEXDIAG_PZ_CHUNK, 0, &t->zdec));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__sched_tiered_create(const flexdiag_sched_tiered_params *p,
                                              flexdiag_sched **out) {
    *out = NULL;
    const flexdiag_weight_homes *h = p->homes;
    if (flexdiag__wcut_bytes(&h->cut, FLEXDIAG_TIER_DISK) && (!p->pool || !h->store))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "tiered scheduler: disk-homed weights need a pinned pool for staging");
    tiered *t = calloc(1, sizeof *t);
    if (!t) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "scheduler: out of host memory");
    t->base.ops = &tiered_ops;
    t->base.lay = p->lay;
    t->h = h;
    t->k = p->k;
    t->compute = p->compute;
    t->pool = p->pool;
    t->slot_bytes = flexdiag__sched_tiered_slot_bytes(h);
    t->n_layers = p->lay.n_layers;
    t->n_slots = p->n_slots < 2 ? 2 : p->n_slots > MAX_SLOTS ? MAX_SLOTS : p->n_slots;
    if (t->n_slots > t->n_layers) t->n_slots = t->n_layers;
    t->n_stage = p->n_stage < 2 ? 2 : p->n_stage > MAX_STAGE ? MAX_STAGE : p->n_stage;
    t->cur = -1;
    if (h->cut.q4) {
        t->packed_at = packed_offset(&h->cut);
        t->n_pieces = flexdiag__wcut_pieces(&h->cut, t->pieces);
    }
    if (h->cut.q4 && !p->k->wq4_unpack) {
        free(t);
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "model_params.compress_weights: backend %s cannot unpack 4-bit "
                             "weights",
                             p->k->name);
    }
    flexdiag_status st = tiered_open(t, p);
    if (st != FLEXDIAG_OK) {
        tiered_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return FLEXDIAG_OK;
}
