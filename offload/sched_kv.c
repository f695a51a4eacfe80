/*
 * sched_kv.c - KV homes below the device (sched.h): a scheduler that wraps another one and
 * keeps the KV cache of the last micro-batches of a block in pinned host memory or on disk.
 *
 * Sequences [0, s_host) keep their KV on the device and go through the inner scheduler
 * untouched; the KV of sequences [s_host, n_seq) lives in the host home with the device
 * layout, (layers, 2 (K, V), host sequences, seq_bytes), so a micro-batch moves between homes
 * without re-layout. For such a micro-batch, acquire(j, k) queues on the copy stream the H2D of
 * its layer-j K and V spans into one of two device staging buffers and makes the compute stream
 * wait for them; release(j, k) makes the copy stream wait for the forward and copies the spans
 * back. The two buffers alternate, so the next load (micro-batch k+1, or layer j+1 of a lone
 * host micro-batch) runs while k computes, and a buffer is refilled only after its previous
 * contents are back home. A load of (j, k) waits only for the last write-back of the same
 * (layer, micro-batch), the one whose rows it reads: waiting for the micro-batch's latest
 * write-back of any layer would hold the load of layer j+1 until the forward of layer j is
 * done and serialise copies with compute. Streams order each other through events only; the host never
 * waits. A prefill chunk never straddles the homes (the context makes the prefill chunk divide
 * the micro-batch).
 *
 * What moves is what the caller says the forward touches (sched.h flexdiag_sched_io kv_*): in
 * a decode step the prompt rows and the resident prefix of the ring come in (every policy fills
 * its ring in slot order, policy/kv_policy.h), and only the written row goes back (the whole
 * resident prefix where the policy picks a row per head); a prefill chunk loads nothing and
 * stores its prompt rows. Each range is one strided copy over every (sequence, KV head) block
 * (on CUDA the device gathers the rows out of the mapped pinned home: the copy engine's 2-D
 * copies lose 40 % of their rate beside the decode's GEMMs, kernels/cuda/slot_rows.cu); where
 * the prompt fills its capacity the prompt rows and the ring prefix adjoin and go as one.
 * A sparse policy (Diagonal, ALISA: fewer rows attended than resident, io->kv_slots) brings
 * only the ring rows its slot lists name: the backend's copy_h2d_slots_async gathers them (on
 * CUDA one kernel reading the pinned home over the bus, the lists never leaving the device),
 * so a Diagonal step moves L_p + N_att rows per (sequence, KV head), not L_p + N_r. The lists
 * of a decode pass are planned on the compute stream before its begin(); the scheduler records
 * an event there and the gathers wait for it. Rows that are resident but not attended stay
 * stale in the staging buffer, which no kernel reads.
 *
 * Sequences [s_disk, n_seq) keep their KV on disk (kv_disk.h): their acquire first reads the
 * pages of the rows the forward touches into a pinned staging region, which then plays the
 * pinned home's part for the copies above, and their release hands the rows copied back to the
 * disk home, which writes them when the staging region is needed again. What comes next is the
 * pass plan's (sched.h flexdiag_pass_plan): after a disk visit's read, the next disk visit's
 * rows are read ahead (the plan's exact sequences and rows; after a decode pass's last one, the
 * first of the next decode pass with one ring row more). Its staging regions alternate in visit
 * order, so a scheduler with a disk home takes the layer-major order only (any_order 0).
 *
 * A decode step whose caller attends on the host (io->host_attend: CPU attention) gets the
 * pinned home's own addresses and moves nothing: the host appends and reads the rows in place. The
 * compute stream waits for the last write-back of that (layer, micro-batch) (the prefill's
 * prompt rows), so work the caller orders after the compute stream finds them home.
 */
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/kv_disk.h"
#include "offload/sched.h"

typedef struct kvbuf {
    char *dev;              /* staging: K span then V span, mb_seq sequences each */
    int32_t layer, s0;      /* what it holds or is loading (-1: nothing) */
    char *home[2];          /* where its K and V spans live on the host: the pinned home, or
                               the disk home's staging region `stage` */
    int stage;              /* the disk home's staging region, -1 for the pinned home */
    flexdiag_event *ready;  /* up stream: the H2D into dev is done */
    flexdiag_event *used;   /* compute stream: the forward over dev is done */
    flexdiag_event *stored; /* down stream: dev's contents are back in the host home */
} kvbuf;

typedef struct kvsched {
    flexdiag_sched base;
    flexdiag_sched *inner;
    flexdiag_sched_kv_params p;
    flexdiag_stream *up, *down; /* H2D and D2H copy streams (both directions at once) */
    kvbuf buf[2];
    int32_t next;            /* buffer the next host-homed acquire takes */
    int32_t n_mb;            /* micro-batches homed below the device (pinned, then disk) */
    flexdiag_event **stored; /* (n_layers, n_mb) down stream: the last write-back of each */
    flexdiag_event *planned;    /* compute stream: this step's slot lists are written */
    const flexdiag_pass_plan *plan; /* the pass being run (begin) */
    int32_t at;                 /* its visit being acquired */
    flexdiag_kv_disk *disk;     /* the disk home of sequences [s_disk, n_seq), NULL when none */
    flexdiag_sched_stats st;
} kvsched;

/* Host address of layer j's K (kv 0) or V (kv 1) span of sequence s (s_host <= s < s_disk). */
static char *host_span(const kvsched *t, int32_t j, int kv, int32_t s) {
    const flexdiag_sched_kv_params *p = &t->p;
    size_t n_host = (size_t)(p->s_disk - p->s_host);
    return p->host + (((size_t)j * 2 + (size_t)kv) * n_host + (size_t)(s - p->s_host)) *
                         p->seq_bytes;
}

/* The write-back event of layer j of the host micro-batch starting at s0. */
static flexdiag_event *stored_of(const kvsched *t, int32_t j, int32_t s0) {
    int32_t mb = (s0 - t->p.s_host) / t->p.mb_seq;
    return t->stored[(size_t)j * (size_t)t->n_mb + (size_t)mb];
}

/* Rows [r0, r0 + n) of every (sequence, KV head) block of io's K and V spans, from the host home
 * to b (up) or back (down), one strided copy each; *moved counts the bytes. */
static flexdiag_status rows(kvsched *t, kvbuf *b, const flexdiag_sched_io *io, int up,
                            int32_t r0, int32_t n, uint64_t *moved) {
    const flexdiag_sched_kv_params *p = &t->p;
    if (n <= 0) return FLEXDIAG_OK;
    size_t pitch = (size_t)p->span_rows * p->row_bytes, off = (size_t)r0 * p->row_bytes;
    size_t width = (size_t)n * p->row_bytes, blocks = (size_t)io->n_seq * (size_t)p->heads;
    size_t half = (size_t)p->mb_seq * p->seq_bytes;
    for (int kv = 0; kv < 2; kv++) {
        char *dev = b->dev + (size_t)kv * half + off, *host = b->home[kv] + off;
        FLEXDIAG_TRY(up ? p->k->copy_h2d_2d_async(dev, pitch, host, pitch, width, blocks, t->up)
                        : p->k->copy_d2h_2d_async(host, pitch, dev, pitch, width, blocks, t->down));
    }
    *moved += 2 * width * blocks;
    return FLEXDIAG_OK;
}

/* The ring rows io's slot lists name, from the host home to b, after the step's plan; the bytes
 * are counted at kv_attend rows per block (every list of a Diagonal step has that length). */
static flexdiag_status slot_rows(kvsched *t, kvbuf *b, const flexdiag_sched_io *io) {
    const flexdiag_sched_kv_params *p = &t->p;
    FLEXDIAG_TRY(p->k->stream_wait_event(t->up, t->planned));
    size_t half = (size_t)p->mb_seq * p->seq_bytes, pitch = (size_t)p->span_rows * p->row_bytes;
    for (int kv = 0; kv < 2; kv++) {
        flexdiag_slot_rows r = {.dst = b->dev + (size_t)kv * half,
                                .src = b->home[kv], .pitch = pitch,
                                .ring_off = (size_t)p->p_cap * p->row_bytes,
                                .row_bytes = p->row_bytes, .slots = io->kv_slots,
                                .n_slots = io->kv_n_slots, .max_slots = io->kv_max_slots,
                                .n_seq = io->n_seq, .h_kv = p->heads};
        FLEXDIAG_TRY(p->k->copy_h2d_slots_async(&r, t->up));
    }
    t->st.kv_h2d_bytes += 2 * (uint64_t)io->n_seq * (uint64_t)p->heads *
                          (uint64_t)io->kv_attend * p->row_bytes;
    return FLEXDIAG_OK;
}

/* H2D of the rows io reads into b on the up stream, after b's previous contents and the
 * micro-batch's rows of that layer are back home; the compute stream waits for it. */
static flexdiag_status load(kvsched *t, kvbuf *b, const flexdiag_sched_io *io) {
    const flexdiag_kernels *k = t->p.k;
    FLEXDIAG_TRY(k->stream_wait_event(t->up, b->stored));
    FLEXDIAG_TRY(k->stream_wait_event(t->up, stored_of(t, io->layer, io->s0)));
    if (io->kv_slots && io->kv_attend < io->kv_ring && k->copy_h2d_slots_async) {
        FLEXDIAG_TRY(rows(t, b, io, 1, 0, io->kv_prompt, &t->st.kv_h2d_bytes));
        FLEXDIAG_TRY(slot_rows(t, b, io));
    } else if (io->kv_prompt == t->p.p_cap) { /* prompt and ring prefix adjoin: one copy */
        FLEXDIAG_TRY(rows(t, b, io, 1, 0, t->p.p_cap + io->kv_ring, &t->st.kv_h2d_bytes));
    } else {
        FLEXDIAG_TRY(rows(t, b, io, 1, 0, io->kv_prompt, &t->st.kv_h2d_bytes));
        FLEXDIAG_TRY(rows(t, b, io, 1, t->p.p_cap, io->kv_ring, &t->st.kv_h2d_bytes));
    }
    FLEXDIAG_TRY(k->event_record(b->ready, t->up));
    b->layer = io->layer;
    b->s0 = io->s0;
    return k->stream_wait_event(t->p.compute, b->ready);
}

/* D2H of the rows io wrote, on the down stream once the forward over them is done. */
static flexdiag_status store(kvsched *t, kvbuf *b, const flexdiag_sched_io *io) {
    const flexdiag_kernels *k = t->p.k;
    FLEXDIAG_TRY(k->event_record(b->used, t->p.compute));
    FLEXDIAG_TRY(k->stream_wait_event(t->down, b->used));
    int32_t w0 = io->kv_wn >= 0 ? io->kv_w0 : t->p.p_cap;
    int32_t wn = io->kv_wn >= 0 ? io->kv_wn : io->kv_ring;
    FLEXDIAG_TRY(rows(t, b, io, 0, w0, wn, &t->st.kv_d2h_bytes));
    if (b->stage >= 0 && wn > 0) FLEXDIAG_TRY(flexdiag__kv_disk_put(t->disk, b->stage, w0, w0 + wn));
    FLEXDIAG_TRY(k->event_record(b->stored, t->down));
    return k->event_record(stored_of(t, io->layer, io->s0), t->down);
}

/* The rows of each block a visit reads or writes (its kv_* fields, sched.h), as one interval
 * [*lo, *hi) (0, 0: none). */
static void touched(const kvsched *t, int32_t prompt, int32_t ring, int32_t w0, int32_t wn,
                    int32_t *lo, int32_t *hi) {
    int32_t pc = t->p.p_cap, a = INT32_MAX, e = 0;
    if (wn < 0) w0 = pc, wn = ring;
    if (prompt > 0) a = 0, e = prompt;
    if (ring > 0) a = a < pc ? a : pc, e = e > pc + ring ? e : pc + ring;
    if (wn > 0) a = a < w0 ? a : w0, e = e > w0 + wn ? e : w0 + wn;
    *lo = a < e ? a : 0;
    *hi = a < e ? e : 0;
}

/* The first visit of the plan at or after i that acquires a disk-homed micro-batch, else -1. */
static int32_t next_disk_visit(const kvsched *t, int32_t i) {
    for (; (i = flexdiag__plan_next_acquire(t->plan, i)) >= 0; i++)
        if (t->plan->v[i].s0 >= t->p.s_disk) return i;
    return -1;
}

/* Start reading the rows of the plan's next disk visit after the one being acquired (io's): in
 * this pass, else, after a decode pass, the first of the next one with one ring row more. Not
 * when that is io's own (layer, micro-batch): its pages would be read before io's rows are
 * written back. */
static flexdiag_status prefetch_next(kvsched *t, const flexdiag_sched_io *io) {
    const flexdiag_sched_kv_params *p = &t->p;
    int32_t i = next_disk_visit(t, t->at + 1), more = 0;
    if (i < 0 && t->plan->repeats) i = next_disk_visit(t, 0), more = 1;
    if (i < 0) return FLEXDIAG_OK;
    const flexdiag_visit *v = &t->plan->v[i];
    int32_t mb = (v->s0 - p->s_disk) / p->mb_seq, first = p->s_disk + mb * p->mb_seq;
    if (v->layer == io->layer && mb == (io->s0 - p->s_disk) / p->mb_seq) return FLEXDIAG_OK;
    int32_t lo, hi;
    touched(t, v->kv_prompt, v->kv_ring, v->kv_w0, v->kv_wn, &lo, &hi);
    if (hi <= lo) return FLEXDIAG_OK;
    if (more) hi = hi + 1 < p->span_rows ? hi + 1 : p->span_rows;
    return flexdiag__kv_disk_prefetch(t->disk, v->layer, mb, v->s0 - first, v->n_seq, lo, hi);
}

/* Point b at the host copy of io's spans: the pinned home, or a staging region of the disk
 * home filled with the rows io touches. */
static flexdiag_status locate_home(kvsched *t, kvbuf *b, const flexdiag_sched_io *io) {
    b->stage = -1;
    if (io->s0 < t->p.s_disk) {
        b->home[0] = host_span(t, io->layer, 0, io->s0);
        b->home[1] = host_span(t, io->layer, 1, io->s0);
        return FLEXDIAG_OK;
    }
    int32_t lo, hi, mb = (io->s0 - t->p.s_disk) / t->p.mb_seq;
    int32_t s = io->s0 - t->p.s_disk - mb * t->p.mb_seq;
    touched(t, io->kv_prompt, io->kv_ring, io->kv_w0, io->kv_wn, &lo, &hi);
    if (hi <= lo) lo = 0, hi = 1; /* nothing touched: keep the bookkeeping uniform */
    return flexdiag__kv_disk_get(t->disk, io->layer, mb, s, io->n_seq, lo, hi, &b->home[0],
                                 &b->home[1], &b->stage);
}

static flexdiag_status kv_begin(flexdiag_sched *s, const flexdiag_pass_plan *plan) {
    kvsched *t = (kvsched *)s;
    FLEXDIAG_TRY(flexdiag__sched_begin(t->inner, plan));
    t->plan = plan;
    t->at = -1;
    if (plan->rows_per_seq != 1) return FLEXDIAG_OK;
    return t->p.k->event_record(t->planned, t->p.compute); /* the slot lists are queued */
}

static flexdiag_status kv_acquire(flexdiag_sched *s, flexdiag_sched_io *io) {
    kvsched *t = (kvsched *)s;
    FLEXDIAG_TRY(flexdiag__sched_acquire(t->inner, io));
    t->at = flexdiag__plan_next_acquire(t->plan, t->at + 1);
    FLEXDIAG_DASSERT(t->at >= 0 && t->plan->v[t->at].layer == io->layer &&
                     t->plan->v[t->at].s0 == io->s0);
    if (io->s0 < t->p.s_host) return FLEXDIAG_OK;
    FLEXDIAG_DASSERT(io->n_seq <= t->p.mb_seq && io->s0 + io->n_seq <= t->p.n_seq);
    if (io->host_attend) { /* the host attends: the KV stays home, once the rows are there */
        FLEXDIAG_DASSERT(io->s0 < t->p.s_disk);
        FLEXDIAG_TRY(t->p.k->stream_wait_event(t->p.compute, stored_of(t, io->layer, io->s0)));
        io->k = host_span(t, io->layer, 0, io->s0);
        io->v = host_span(t, io->layer, 1, io->s0);
        io->kv_host = 1;
        return FLEXDIAG_OK;
    }
    kvbuf *b = &t->buf[t->next];
    t->next ^= 1;
    FLEXDIAG_TRY(locate_home(t, b, io));
    FLEXDIAG_TRY(load(t, b, io));
    if (b->stage >= 0) FLEXDIAG_TRY(flexdiag__kv_disk_loaded(t->disk, b->stage));
    if (b->stage >= 0) FLEXDIAG_TRY(prefetch_next(t, io));
    io->k = b->dev;
    io->v = b->dev + (size_t)t->p.mb_seq * t->p.seq_bytes;
    return FLEXDIAG_OK;
}

static flexdiag_status kv_release(flexdiag_sched *s, const flexdiag_sched_io *io) {
    kvsched *t = (kvsched *)s;
    FLEXDIAG_TRY(flexdiag__sched_release(t->inner, io));
    if (io->s0 < t->p.s_host || io->host_attend) return FLEXDIAG_OK;
    int i = t->buf[0].layer == io->layer && t->buf[0].s0 == io->s0 ? 0 : 1;
    FLEXDIAG_DASSERT(t->buf[i].layer == io->layer && t->buf[i].s0 == io->s0);
    return store(t, &t->buf[i], io);
}

static void kv_stats(const flexdiag_sched *s, flexdiag_sched_stats *out) {
    const kvsched *t = (const kvsched *)s;
    memset(out, 0, sizeof *out);
    if (t->inner->ops->stats) t->inner->ops->stats(t->inner, out);
    out->kv_h2d_bytes = t->st.kv_h2d_bytes;
    out->kv_d2h_bytes = t->st.kv_d2h_bytes;
    if (t->disk) {
        flexdiag_kv_disk_stats ds;
        flexdiag__kv_disk_stats(t->disk, &ds);
        out->kv_disk_read_bytes = ds.read_bytes;
        out->kv_disk_write_bytes = ds.write_bytes;
        out->kv_disk_wait_s = ds.wait_s;
        out->kv_disk_gets = ds.gets;
        out->kv_disk_hits = ds.prefetch_hits;
    }
}

static void kv_destroy(flexdiag_sched *s) {
    kvsched *t = (kvsched *)s;
    const flexdiag_kernels *k = t->p.k;
    if (t->down) k->stream_sync(t->down); /* the write-backs land before the home goes */
    if (t->up) k->stream_sync(t->up);
    (void)flexdiag__kv_disk_destroy(t->disk);
    if (t->up) k->stream_destroy(t->up);
    if (t->down) k->stream_destroy(t->down);
    for (int i = 0; i < 2; i++) {
        k->event_destroy(t->buf[i].ready);
        k->event_destroy(t->buf[i].used);
        k->event_destroy(t->buf[i].stored);
    }
    k->event_destroy(t->planned);
    size_t n_ev = (size_t)t->p.n_layers * (size_t)t->n_mb;
    for (size_t i = 0; t->stored && i < n_ev; i++) k->event_destroy(t->stored[i]);
    free(t->stored);
    flexdiag__sched_destroy(t->inner);
    free(t);
}

static const flexdiag_sched_ops kv_ops = {
    .name = "kv-homes",
    .graph_safe = 0,
    .begin = kv_begin,
    .acquire = kv_acquire,
    .release = kv_release,
    .destroy = kv_destroy,
    .stats = kv_stats,
};

static flexdiag_status kv_open(kvsched *t) {
    const flexdiag_sched_kv_params *p = &t->p;
    const flexdiag_kernels *k = p->k;
    if (!k->copy_stream_create || !k->copy_h2d_2d_async || !k->copy_d2h_2d_async)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "backend %s has no copy streams or strided copies: the KV cannot "
                             "live in host memory",
                             k->name);
    FLEXDIAG_TRY(k->copy_stream_create(p->device, &t->up));
    FLEXDIAG_TRY(k->copy_stream_create(p->device, &t->down));
    size_t buf_bytes = 2 * (size_t)p->mb_seq * p->seq_bytes;
    for (int i = 0; i < 2; i++) {
        kvbuf *b = &t->buf[i];
        *b = (kvbuf){.dev = (char *)p->staging + (size_t)i * buf_bytes, .layer = -1, .s0 = -1};
        FLEXDIAG_TRY(k->event_create(t->up, &b->ready));
        FLEXDIAG_TRY(k->event_create(p->compute, &b->used));
        FLEXDIAG_TRY(k->event_create(t->down, &b->stored));
    }
    FLEXDIAG_TRY(k->event_create(p->compute, &t->planned));
    t->n_mb = (p->n_seq - p->s_host + p->mb_seq - 1) / p->mb_seq;
    size_t n_ev = (size_t)p->n_layers * (size_t)t->n_mb;
    t->stored = calloc(n_ev, sizeof *t->stored);
    if (!t->stored) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "scheduler: no host memory");
    for (size_t i = 0; i < n_ev; i++) FLEXDIAG_TRY(k->event_create(t->down, &t->stored[i]));
    if (p->s_disk >= p->n_seq) return FLEXDIAG_OK;
    if (!p->store || !p->disk_stage || !k->event_sync)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "KV scheduler: a disk KV home needs the offload store and staging");
    flexdiag_kv_disk_params dp = {
        .k = k, .store = p->store, .off = p->disk_off, .n_layers = p->n_layers,
        .n_mb = (p->n_seq - p->s_disk + p->mb_seq - 1) / p->mb_seq, .mb_seq = p->mb_seq,
        .seq_bytes = p->seq_bytes, .heads = p->heads,
        .block_bytes = (size_t)p->span_rows * p->row_bytes, .row_bytes = p->row_bytes,
        .stage = p->disk_stage, .up = t->up, .down = t->down};
    return flexdiag__kv_disk_create(&dp, &t->disk);
}

size_t flexdiag__sched_kv_staging_bytes(int32_t mb_seq, size_t seq_bytes) {
    return 2 * 2 * (size_t)mb_seq * seq_bytes;
}

flexdiag_status flexdiag__sched_kv_create(flexdiag_sched *inner, const flexdiag_sched_kv_params *p,
                                          flexdiag_sched **out) {
    *out = NULL;
    kvsched *t = calloc(1, sizeof *t);
    if (!t) {
        flexdiag__sched_destroy(inner);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "scheduler: out of host memory");
    }
    t->base.ops = &kv_ops;
    t->base.lay = inner->lay;
    t->base.any_order = inner->any_order && p->s_disk >= p->n_seq;
    t->inner = inner;
    t->p = *p;
    flexdiag_status st = kv_open(t);
    if (st != FLEXDIAG_OK) {
        kv_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return FLEXDIAG_OK;
}
