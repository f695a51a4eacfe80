/*
 * kv_disk.c - the disk KV home (kv_disk.h): staging regions in pinned memory, page runs read
 * and written through the NVMe store in batches.
 */
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/kv_disk.h"

#define PAGE ((uint64_t)FLEXDIAG_STORE_ALIGN)

typedef struct stage {
    char *buf;              /* K region, then V region */
    int32_t layer, mb;      /* what it holds (-1: nothing) */
    int32_t s, n;           /* its sequences, from the micro-batch's first */
    int32_t lo, hi;         /* rows read into it (or being read: rd) */
    flexdiag_store_ticket rd; /* a prefetch read in flight, 0 when none */
    int32_t w_lo, w_hi;     /* rows copied back into it and not yet written (w_lo == w_hi: none) */
    int loaded, stored;     /* events recorded and not yet waited for */
    flexdiag_event *out;    /* up stream: the copies out of it are done */
    flexdiag_event *in;     /* down stream: the copies back into it are done */
} stage;

struct flexdiag_kv_disk {
    flexdiag_kv_disk_params p;
    size_t region;
    int next;                  /* the staging region get() takes next */
    int held;                  /* the region the last get() handed out, until its put() (-1:
                                  none): a prefetch never takes it, whatever the order of the
                                  gets (a prefill of a few micro-batches between decode steps
                                  breaks the round robin) */
    stage st[FLEXDIAG_KV_DISK_STAGES];
    flexdiag_store_req *reqs;  /* one region pair's requests */
    int32_t max_reqs;
    flexdiag_kv_disk_stats stats;
};

size_t flexdiag__kv_disk_region(int32_t mb_seq, size_t seq_bytes) {
    return (size_t)(((uint64_t)mb_seq * seq_bytes + PAGE - 1) / PAGE * PAGE);
}

uint64_t flexdiag__kv_disk_bytes(int32_t n_layers, int32_t n_mb, int32_t mb_seq,
                                 size_t seq_bytes) {
    return (uint64_t)n_layers * 2 * (uint64_t)n_mb * flexdiag__kv_disk_region(mb_seq, seq_bytes);
}

size_t flexdiag__kv_disk_stage_bytes(int32_t mb_seq, size_t seq_bytes) {
    return (size_t)FLEXDIAG_KV_DISK_STAGES * 2 * flexdiag__kv_disk_region(mb_seq, seq_bytes);
}

/* File offset of region (layer j, K or V, micro-batch mb). */
static uint64_t region_off(const flexdiag_kv_disk *d, int32_t j, int kv, int32_t mb) {
    return d->p.off + (((uint64_t)j * 2 + (uint64_t)kv) * (uint64_t)d->p.n_mb + (uint64_t)mb) *
                          d->region;
}

/* Bytes per request at most: large, and several in flight for one region. */
#define CHUNK ((uint64_t)4 << 20)

/* Append the file range [off, off + len) (buffer buf) to the requests from `first` on: merged
 * into the last one where it adjoins or overlaps it, cut into CHUNK-sized pieces. */
static void add_run(flexdiag_kv_disk *d, int32_t *m, int32_t first, flexdiag_store_op op,
                    uint64_t off, uint64_t len, char *buf) {
    flexdiag_store_req *r = *m > first ? &d->reqs[*m - 1] : NULL;
    if (r && off <= r->off + r->len) { /* continue the last run */
        uint64_t end = off + len, at = r->off + r->len;
        if (end <= at) return;
        uint64_t grow = CHUNK - r->len < end - at ? CHUNK - r->len : end - at;
        r->len += (size_t)grow;
        if (at + grow == end) return;
        buf += at + grow - off, len = end - (at + grow), off = at + grow;
    }
    for (uint64_t done = 0; done < len; done += CHUNK) {
        uint64_t n = len - done < CHUNK ? len - done : CHUNK;
        d->reqs[(*m)++] = (flexdiag_store_req){op, off + done, (size_t)n, buf + done};
    }
}

/* The page runs holding rows [lo, hi) of the blocks of sequences [s, s + n) of g's micro-batch,
 * for K and V, as requests of op into d->reqs; returns how many. */
static int32_t page_runs(flexdiag_kv_disk *d, const stage *g, flexdiag_store_op op, int32_t s,
                         int32_t n, int32_t lo, int32_t hi) {
    const flexdiag_kv_disk_params *p = &d->p;
    int32_t m = 0;
    int64_t blocks = (int64_t)n * p->heads, b0 = (int64_t)s * p->heads;
    for (int kv = 0; kv < 2; kv++) {
        uint64_t base = region_off(d, g->layer, kv, g->mb);
        char *buf = g->buf + (size_t)kv * d->region;
        int32_t first = m;
        for (int64_t b = b0; b < b0 + blocks; b++) {
            uint64_t a = (uint64_t)b * p->block_bytes + (uint64_t)lo * p->row_bytes;
            uint64_t e = (uint64_t)b * p->block_bytes + (uint64_t)hi * p->row_bytes;
            a = a / PAGE * PAGE;
            e = (e + PAGE - 1) / PAGE * PAGE;
            if (e > d->region) e = d->region;
            add_run(d, &m, first, op, base + a, e - a, buf + a);
        }
    }
    FLEXDIAG_DASSERT(m <= d->max_reqs);
    return m;
}

/* Requests per batch: within the store's limits (max_requests 4096 in flight). */
#define BATCH 1024

/* Submit the requests; the last batch's ticket goes to *tk (the earlier ones are waited for),
 * or, tk NULL, every batch is waited for. */
static flexdiag_status run_reqs(flexdiag_kv_disk *d, int32_t m, uint64_t *count,
                                flexdiag_store_ticket *tk) {
    for (int32_t i = 0; i < m; i++) *count += d->reqs[i].len;
    double t0 = flexdiag__now();
    for (int32_t at = 0; at < m;) {
        int32_t nb = m - at < BATCH ? m - at : BATCH;
        flexdiag_store_ticket t;
        FLEXDIAG_TRY(flexdiag__store_submit(d->p.store, d->reqs + at, nb, &t));
        at += nb;
        if (tk && at == m) *tk = t;
        else FLEXDIAG_TRY(flexdiag__store_wait(d->p.store, t));
    }
    d->stats.wait_s += flexdiag__now() - t0;
    return FLEXDIAG_OK;
}

/* Wait for g's prefetch read, if one is in flight. */
static flexdiag_status read_wait(flexdiag_kv_disk *d, stage *g) {
    if (!g->rd) return FLEXDIAG_OK;
    double t0 = flexdiag__now();
    flexdiag_status st = flexdiag__store_wait(d->p.store, g->rd);
    d->stats.wait_s += flexdiag__now() - t0;
    g->rd = 0;
    if (st != FLEXDIAG_OK) g->layer = g->mb = -1;
    return st;
}

/* Write g's pending rows to the file, once the copies into g are done. */
static flexdiag_status flush(flexdiag_kv_disk *d, stage *g) {
    if (g->stored) {
        double t0 = flexdiag__now();
        FLEXDIAG_TRY(d->p.k->event_sync(g->in));
        d->stats.wait_s += flexdiag__now() - t0;
        g->stored = 0;
    }
    if (g->w_lo >= g->w_hi) return FLEXDIAG_OK;
    int32_t m = page_runs(d, g, FLEXDIAG_STORE_WRITE, g->s, g->n, g->w_lo, g->w_hi);
    g->w_lo = g->w_hi = 0;
    return run_reqs(d, m, &d->stats.write_bytes, NULL);
}

/* g may be refilled: its read is done, the copies out of it are done and its rows are in the
 * file. */
static flexdiag_status drain(flexdiag_kv_disk *d, stage *g) {
    FLEXDIAG_TRY(read_wait(d, g));
    if (g->loaded) {
        double t0 = flexdiag__now();
        FLEXDIAG_TRY(d->p.k->event_sync(g->out));
        d->stats.wait_s += flexdiag__now() - t0;
        g->loaded = 0;
    }
    return flush(d, g);
}

/* Take the next staging region for (j, mb, s, n) rows [lo, hi), after writing back what an
 * earlier staging of the same region holds, and submit its read (*tk NULL: and wait). */
static flexdiag_status fill(flexdiag_kv_disk *d, int32_t j, int32_t mb, int32_t s, int32_t n,
                            int32_t lo, int32_t hi, flexdiag_store_ticket *tk, int *out) {
    for (int i = 0; i < FLEXDIAG_KV_DISK_STAGES; i++) /* earlier rows of these pages go first */
        if (d->st[i].layer == j && d->st[i].mb == mb) FLEXDIAG_TRY(drain(d, &d->st[i]));
    int i = d->next;
    if (i == d->held) i = (i + 1) % FLEXDIAG_KV_DISK_STAGES;
    d->next = (i + 1) % FLEXDIAG_KV_DISK_STAGES;
    stage *g = &d->st[i];
    FLEXDIAG_TRY(drain(d, g));
    *g = (stage){.buf = g->buf, .layer = j, .mb = mb, .s = s, .n = n, .lo = lo, .hi = hi,
                 .out = g->out, .in = g->in};
    int32_t m = page_runs(d, g, FLEXDIAG_STORE_READ, s, n, lo, hi);
    flexdiag_status st = run_reqs(d, m, &d->stats.read_bytes, tk);
    if (st != FLEXDIAG_OK) g->layer = g->mb = -1;
    *out = i;
    return st;
}

flexdiag_status flexdiag__kv_disk_get(flexdiag_kv_disk *d, int32_t j, int32_t mb, int32_t s,
                                      int32_t n, int32_t lo, int32_t hi, char **k, char **v,
                                      int *stage_out) {
    FLEXDIAG_DASSERT(mb >= 0 && mb < d->p.n_mb && s >= 0 && s + n <= d->p.mb_seq && lo < hi);
    int i = -1;
    d->stats.gets++;
    for (int q = 0; q < FLEXDIAG_KV_DISK_STAGES && i < 0; q++) { /* a prefetch of these rows */
        const stage *g = &d->st[q];
        if (g->rd && g->layer == j && g->mb == mb && g->s == s && g->n == n && g->lo <= lo &&
            hi <= g->hi)
            i = q;
    }
    if (i >= 0) {
        FLEXDIAG_TRY(read_wait(d, &d->st[i]));
        d->stats.prefetch_hits++;
    } else {
        FLEXDIAG_TRY(fill(d, j, mb, s, n, lo, hi, NULL, &i));
    }
    stage *g = &d->st[i];
    d->held = i;
    *k = g->buf + (size_t)s * d->p.seq_bytes;
    *v = g->buf + d->region + (size_t)s * d->p.seq_bytes;
    *stage_out = i;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__kv_disk_prefetch(flexdiag_kv_disk *d, int32_t j, int32_t mb, int32_t s,
                                           int32_t n, int32_t lo, int32_t hi) {
    FLEXDIAG_DASSERT(mb >= 0 && mb < d->p.n_mb && s >= 0 && s + n <= d->p.mb_seq && lo < hi);
    for (int q = 0; q < FLEXDIAG_KV_DISK_STAGES; q++) {
        const stage *g = &d->st[q];
        if (g->rd && g->layer == j && g->mb == mb) return FLEXDIAG_OK; /* already on its way */
    }
    flexdiag_store_ticket tk = 0;
    int i;
    FLEXDIAG_TRY(fill(d, j, mb, s, n, lo, hi, &tk, &i));
    d->st[i].rd = tk;
    if (!tk) d->st[i].layer = d->st[i].mb = -1; /* nothing to read: not a prefetch */
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__kv_disk_loaded(flexdiag_kv_disk *d, int i) {
    FLEXDIAG_TRY(d->p.k->event_record(d->st[i].out, d->p.up));
    d->st[i].loaded = 1;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__kv_disk_put(flexdiag_kv_disk *d, int i, int32_t lo, int32_t hi) {
    stage *g = &d->st[i];
    d->held = -1;
    FLEXDIAG_TRY(d->p.k->event_record(g->in, d->p.down));
    g->stored = 1;
    if (g->w_lo >= g->w_hi) {
        g->w_lo = lo, g->w_hi = hi;
    } else {
        if (lo < g->w_lo) g->w_lo = lo;
        if (hi > g->w_hi) g->w_hi = hi;
    }
    return FLEXDIAG_OK;
}

void flexdiag__kv_disk_stats(const flexdiag_kv_disk *d, flexdiag_kv_disk_stats *out) {
    *out = d->stats;
}

flexdiag_status flexdiag__kv_disk_create(const flexdiag_kv_disk_params *p, flexdiag_kv_disk **out) {
    *out = NULL;
    flexdiag_kv_disk *d = calloc(1, sizeof *d);
    if (!d) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "disk KV home: no host memory");
    d->p = *p;
    d->held = -1;
    d->region = flexdiag__kv_disk_region(p->mb_seq, p->seq_bytes);
    /* a run per block, or pieces of CHUNK bytes, per region */
    d->max_reqs = 2 * (p->mb_seq * p->heads + (int32_t)(d->region / CHUNK) + 1);
    d->reqs = malloc((size_t)d->max_reqs * sizeof *d->reqs);
    flexdiag_status st = d->reqs ? FLEXDIAG_OK
                                 : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "disk KV home: no memory");
    for (int i = 0; i < FLEXDIAG_KV_DISK_STAGES; i++) {
        stage *g = &d->st[i];
        *g = (stage){.buf = p->stage + (size_t)i * 2 * d->region, .layer = -1, .mb = -1};
        if (st == FLEXDIAG_OK) st = p->k->event_create(p->up, &g->out);
        if (st == FLEXDIAG_OK) st = p->k->event_create(p->down, &g->in);
    }
    if (st != FLEXDIAG_OK) {
        (void)flexdiag__kv_disk_destroy(d);
        return st;
    }
    *out = d;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__kv_disk_destroy(flexdiag_kv_disk *d) {
    if (!d) return FLEXDIAG_OK;
    flexdiag_status st = FLEXDIAG_OK;
    for (int i = 0; i < FLEXDIAG_KV_DISK_STAGES; i++) { /* the copies end; the KV goes unwritten */
        stage *g = &d->st[i];
        if (g->rd && st == FLEXDIAG_OK) st = read_wait(d, g);
        if (g->loaded && st == FLEXDIAG_OK) st = d->p.k->event_sync(g->out);
        if (g->stored && st == FLEXDIAG_OK) st = d->p.k->event_sync(g->in);
        d->p.k->event_destroy(d->st[i].out);
        d->p.k->event_destroy(d->st[i].in);
    }
    free(d->reqs);
    free(d);
    return st;
}
