/*
 * weight_homes.c - the cuts of a weight placement and the homes of each layer's parts
 * (weight_homes.h): a device prefix from the arena, a host part from the pinned pool, a disk
 * part from the store, filled once at load (the disk part compressed as zstd chunks under
 * --compress-disk zstd).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/ranges.h"
#include "offload/weight_homes.h"

/* ---- cuts ---- */

/* The row boundary nearest x: inside a tensor, its nearest row start (or end); in padding, x
 * itself (padding holds no data), kept even for bf16. */
static size_t snap(const flexdiag_wspan *sp, int n, size_t x) {
    for (int i = 0; i < n; i++) {
        const flexdiag_wspan *t = &sp[i];
        if (x <= t->off || x >= t->off + t->bytes) continue;
        size_t rows = (x - t->off + t->row_bytes / 2) / t->row_bytes;
        size_t c = t->off + rows * t->row_bytes;
        return c > t->off + t->bytes ? t->off + t->bytes : c;
    }
    return x & ~(size_t)1;
}

/* Whether span t is stored packed under q4: a matrix whose rows are whole groups. */
static int packs(const flexdiag_wcut *c, const flexdiag_wspan *t) {
    return c->q4 && t->pack && t->bytes > 0 && t->row_bytes % (2 * FLEXDIAG_WQ4_GROUP) == 0;
}

/* Packed offset of block offset x (x on a row boundary of every packed span it falls in). */
static size_t packed_at(const flexdiag_wcut *c, size_t x) {
    size_t p = x;
    for (int i = 0; i < c->n_spans; i++) {
        const flexdiag_wspan *t = &c->spans[i];
        if (!packs(c, t) || x <= t->off) continue;
        size_t rows = ((x < t->off + t->bytes ? x : t->off + t->bytes) - t->off) / t->row_bytes;
        p -= rows * (t->row_bytes - flexdiag__wq4_row_bytes((int64_t)t->row_bytes / 2));
    }
    return p;
}

int flexdiag__wcut_pieces(const flexdiag_wcut *c, flexdiag_wpiece *out) {
    int n = 0;
    size_t x = c->cut[0];
    for (int i = 0; i < c->n_spans && x < c->layer_bytes; i++) {
        const flexdiag_wspan *t = &c->spans[i];
        size_t end = t->off + t->bytes;
        if (!packs(c, t) || end <= x) continue;
        size_t a = x > t->off ? x : t->off;
        if (a > x) /* unpacked bytes before the matrix */
            out[n++] = (flexdiag_wpiece){.off = x, .bytes = a - x, .poff = packed_at(c, x)};
        int64_t cols = (int64_t)t->row_bytes / 2;
        out[n++] = (flexdiag_wpiece){.off = a, .bytes = end - a, .poff = packed_at(c, a),
                                     .rows = (int64_t)((end - a) / t->row_bytes), .cols = cols,
                                     .pack = 1};
        x = end;
    }
    if (x < c->layer_bytes)
        out[n++] = (flexdiag_wpiece){.off = x, .bytes = c->layer_bytes - x,
                                     .poff = packed_at(c, x)};
    return n;
}

flexdiag_status flexdiag__wcut_make(const flexdiag_wspan *spans, int n, size_t layer_bytes,
                                    const uint32_t pct[3], int compress, flexdiag_wcut *out) {
    int q4 = (compress & FLEXDIAG_WCOMPRESS_Q4) != 0;
    memset(out, 0, sizeof *out);
    if (n > FLEXDIAG_WSPANS_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "weight placement: %d tensors in a layer, "
                             "at most %d", n, FLEXDIAG_WSPANS_MAX);
    if (pct[0] + pct[1] + pct[2] != 100 || pct[0] > 100 || pct[1] > 100 || pct[2] > 100)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "model_params.weights_pct %u,%u,%u (GPU, CPU, disk percent) must "
                             "add up to 100",
                             pct[0], pct[1], pct[2]);
    memcpy(out->pct, pct, sizeof out->pct);
    out->layer_bytes = layer_bytes;
    size_t t0 = (size_t)((double)layer_bytes * pct[0] / 100.0 + 0.5);
    size_t t1 = (size_t)((double)layer_bytes * (pct[0] + pct[1]) / 100.0 + 0.5);
    out->cut[0] = pct[0] == 100 ? layer_bytes : pct[0] == 0 ? 0 : snap(spans, n, t0);
    out->cut[1] = pct[2] == 0 ? layer_bytes : snap(spans, n, t1);
    if (out->cut[1] < out->cut[0]) out->cut[1] = out->cut[0];
    out->split_start = out->cut[0];
    for (int i = 0; i < n; i++)
        if (spans[i].off < out->cut[0] && out->cut[0] < spans[i].off + spans[i].bytes)
            out->split_start = spans[i].off;
    out->n_spans = n;
    memcpy(out->spans, spans, (size_t)n * sizeof *spans);
    out->q4 = q4 && out->cut[0] < layer_bytes;
    int any = 0;
    for (int i = 0; i < n; i++) any |= packs(out, &spans[i]);
    out->q4 = any;
    for (int k = 0; k < 3; k++)
        out->pk[k] = packed_at(out, k < 2 ? out->cut[k] : layer_bytes);
    out->zstd = (compress & FLEXDIAG_WCOMPRESS_ZSTD) && flexdiag__wcut_bytes(out, FLEXDIAG_TIER_DISK);
    return FLEXDIAG_OK;
}

size_t flexdiag__wcut_bytes(const flexdiag_wcut *c, int tier) {
    switch (tier) {
    case FLEXDIAG_TIER_GPU: return c->cut[0];
    case FLEXDIAG_TIER_CPU: return c->q4 ? c->pk[1] - c->pk[0] : c->cut[1] - c->cut[0];
    default: return c->q4 ? c->pk[2] - c->pk[1] : c->layer_bytes - c->cut[1];
    }
}

size_t flexdiag__wcut_disk_stride(const flexdiag_wcut *c) {
    size_t d = flexdiag__wcut_bytes(c, FLEXDIAG_TIER_DISK);
    if (c->zstd) d = flexdiag__pz_many_bound(d, FLEXDIAG_PZ_CHUNK);
    return (size_t)flexdiag__ranges_round(d, FLEXDIAG_STORE_ALIGN);
}

/* ---- homes ---- */

/* A tier that holds bytes needs its home. */
static flexdiag_status need(const void *home, size_t bytes, const char *what) {
    if (bytes == 0 || home) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "the weight placement puts bytes %s", what);
}

/* zstd: the index, the encoders and the record buffer of a load. */
static flexdiag_status zstd_open(flexdiag_weight_homes *h) {
    size_t d = flexdiag__wcut_bytes(&h->cut, FLEXDIAG_TIER_DISK);
    h->zchunks = flexdiag__pz_chunks(d, FLEXDIAG_PZ_CHUNK);
    h->zoffs = calloc((size_t)h->n_layers * (h->zchunks + 1), sizeof *h->zoffs);
    if (posix_memalign(&h->zrec, FLEXDIAG_STORE_ALIGN, h->disk_stride) != 0) h->zrec = NULL;
    if (!h->zoffs || !h->zrec)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "weight homes: no host memory for the zstd index and record");
    memset(h->zrec, 0, h->disk_stride);
    return flexdiag__pz_many_create(h->threads, FLEXDIAG_PZ_CHUNK, 1, &h->zenc);
}

flexdiag_status flexdiag__whomes_create(const flexdiag_wcut *cut, int32_t n_layers,
                                        flexdiag_arena *arena, flexdiag_host_pool *pool,
                                        flexdiag_store *store, int threads,
                                        flexdiag_weight_homes **out) {
    *out = NULL;
    size_t L = (size_t)n_layers;
    size_t g = flexdiag__wcut_bytes(cut, FLEXDIAG_TIER_GPU);
    size_t c = flexdiag__wcut_bytes(cut, FLEXDIAG_TIER_CPU);
    size_t d = flexdiag__wcut_bytes(cut, FLEXDIAG_TIER_DISK);
    FLEXDIAG_TRY(need(pool, c, "in pinned host memory without a host pool "
                      "(runtime_params.cpu_mem)"));
    FLEXDIAG_TRY(need(store, d, "on disk without a store (runtime_params.offload_dir, "
                      "runtime_params.disk_mem)"));
    flexdiag_weight_homes *h = calloc(1, sizeof *h);
    if (!h) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weight homes: out of host memory");
    *h = (flexdiag_weight_homes){.cut = *cut, .n_layers = n_layers, .k = arena->k, .arena = arena,
                                 .pool = pool, .store = store, .stage_layer = -1,
                                 .raw_layer = -1, .disk_stride = flexdiag__wcut_disk_stride(cut),
                                 .threads = threads};
    flexdiag_status st = FLEXDIAG_OK;
    if (g) st = flexdiag__arena_alloc(arena, L * g, "the device-resident part of the layer weights",
                                      &h->dev);
    if (st == FLEXDIAG_OK && c)
        st = flexdiag__host_pool_alloc(pool, L * c, "the host part of the layer weights", &h->host);
    if (st == FLEXDIAG_OK && d)
        st = flexdiag__store_alloc(store, L * h->disk_stride, "the disk part of the layer weights",
                                   &h->ext);
    if (st == FLEXDIAG_OK && d &&
        posix_memalign(&h->stage, FLEXDIAG_STORE_ALIGN, h->disk_stride) != 0) {
        h->stage = NULL;
        st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "weight homes: no host memory to stage a layer");
    }
    if (st == FLEXDIAG_OK && cut->zstd) st = zstd_open(h);
    if (st == FLEXDIAG_OK && cut->q4) {
        h->raw = malloc(cut->layer_bytes - cut->cut[0]);
        h->packed = malloc(cut->pk[2] - cut->pk[0]);
        if (!h->raw || !h->packed)
            st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                               "weight homes: no host memory to pack a layer (%zu bytes)",
                               cut->layer_bytes - cut->cut[0]);
    }
    if (st != FLEXDIAG_OK) {
        flexdiag__whomes_destroy(h);
        return st;
    }
    if (h->stage) memset(h->stage, 0, h->disk_stride);
    *out = h;
    return FLEXDIAG_OK;
}

/* zstd: compress the staged disk part into the record buffer and index it; *rec, *bytes: what
 * to write (the record rounded up to 4096). */
static flexdiag_status stage_encode(flexdiag_weight_homes *h, void **rec, size_t *bytes) {
    int32_t j = h->stage_layer;
    uint64_t *offs = h->zoffs + (size_t)j * (h->zchunks + 1);
    FLEXDIAG_TRY(flexdiag__pz_many_encode(h->zenc, h->stage,
                                          flexdiag__wcut_bytes(&h->cut, FLEXDIAG_TIER_DISK),
                                          flexdiag__wcut_disk_elem(&h->cut), h->zrec,
                                          h->disk_stride, offs));
    *bytes = flexdiag__whomes_disk_read(h, j);
    memset((char *)h->zrec + offs[h->zchunks], 0, *bytes - offs[h->zchunks]);
    *rec = h->zrec;
    return FLEXDIAG_OK;
}

/* Write the staged disk part of its layer to the store (compressed under zstd). */
static flexdiag_status stage_flush(flexdiag_weight_homes *h) {
    if (h->stage_layer < 0) return FLEXDIAG_OK;
    void *src = h->stage;
    size_t bytes = h->disk_stride;
    if (h->cut.zstd) FLEXDIAG_TRY(stage_encode(h, &src, &bytes));
    flexdiag_store_req rq = {FLEXDIAG_STORE_WRITE, flexdiag__whomes_disk_off(h, h->stage_layer),
                             bytes, src};
    flexdiag_store_ticket t;
    FLEXDIAG_TRY(flexdiag__store_submit(h->store, &rq, 1, &t));
    FLEXDIAG_TRY(flexdiag__store_wait(h->store, t));
    h->stage_layer = -1;
    memset(h->stage, 0, h->disk_stride);
    return FLEXDIAG_OK;
}

/* Pack the assembled streamed bytes of raw_layer and store its host and disk parts. */
static flexdiag_status pack_flush(flexdiag_weight_homes *h) {
    if (h->raw_layer < 0) return FLEXDIAG_OK;
    const flexdiag_wcut *c = &h->cut;
    int32_t j = h->raw_layer;
    flexdiag_wpiece pc[FLEXDIAG_WPIECES_MAX];
    int n = flexdiag__wcut_pieces(c, pc);
    char what[64];
    snprintf(what, sizeof what, "layer %d's weights", j);
    for (int i = 0; i < n; i++) {
        const char *src = (const char *)h->raw + (pc[i].off - c->cut[0]);
        uint8_t *dst = h->packed + (pc[i].poff - c->pk[0]);
        if (pc[i].pack)
            FLEXDIAG_TRY(flexdiag__wq4_pack(dst, (const uint16_t *)src, pc[i].rows, pc[i].cols,
                                            what));
        else
            memcpy(dst, src, pc[i].bytes);
    }
    size_t cb = c->pk[1] - c->pk[0];
    if (cb) memcpy((char *)h->host + (size_t)j * cb, h->packed, cb);
    h->raw_layer = -1;
    if (c->pk[2] == c->pk[1]) return FLEXDIAG_OK;
    memcpy(h->stage, h->packed + cb, c->pk[2] - c->pk[1]);
    h->stage_layer = j;
    return stage_flush(h);
}

flexdiag_status flexdiag__whomes_put(flexdiag_weight_homes *h, int32_t j, size_t off,
                                     const void *src, size_t bytes, flexdiag_stream *s) {
    const flexdiag_wcut *c = &h->cut;
    FLEXDIAG_DASSERT(j >= 0 && j < h->n_layers && off + bytes <= c->layer_bytes);
    const char *p = src;
    size_t end = off + bytes;
    if (off < c->cut[0]) { /* device prefix */
        size_t n = (end < c->cut[0] ? end : c->cut[0]) - off;
        FLEXDIAG_TRY(h->k->copy_h2d((char *)h->dev + (size_t)j * c->cut[0] + off, p, n, s));
        p += n, off += n;
    }
    if (c->q4 && off < end) { /* streamed bytes: assembled per layer, packed when it is done */
        if (h->raw_layer != j) FLEXDIAG_TRY(pack_flush(h));
        h->raw_layer = j;
        memcpy((char *)h->raw + (off - c->cut[0]), p, end - off);
        return FLEXDIAG_OK;
    }
    if (off < end && off < c->cut[1]) { /* pinned host */
        size_t n = (end < c->cut[1] ? end : c->cut[1]) - off;
        size_t cb = c->cut[1] - c->cut[0];
        memcpy((char *)h->host + (size_t)j * cb + (off - c->cut[0]), p, n);
        p += n, off += n;
    }
    if (off < end) { /* disk: assembled per layer */
        if (h->stage_layer != j) FLEXDIAG_TRY(stage_flush(h));
        h->stage_layer = j;
        memcpy((char *)h->stage + (off - c->cut[1]), p, end - off);
    }
    return FLEXDIAG_OK;
}

/* Drop what only loading needs. */
static void load_free(flexdiag_weight_homes *h) {
    free(h->stage);
    free(h->raw);
    free(h->packed);
    free(h->zrec);
    flexdiag__pz_many_destroy(h->zenc);
    h->stage = h->raw = h->zrec = NULL;
    h->packed = NULL;
    h->zenc = NULL;
}

flexdiag_status flexdiag__whomes_finish(flexdiag_weight_homes *h) {
    flexdiag_status st = pack_flush(h);
    if (st == FLEXDIAG_OK && h->stage) st = stage_flush(h);
    load_free(h);
    return st;
}

void flexdiag__whomes_destroy(flexdiag_weight_homes *h) {
    if (!h) return;
    size_t L = (size_t)h->n_layers;
    if (h->dev) flexdiag__arena_free(h->arena, h->dev, L * h->cut.cut[0]);
    if (h->host)
        flexdiag__host_pool_free(h->pool, h->host, L * flexdiag__wcut_bytes(&h->cut, FLEXDIAG_TIER_CPU));
    if (h->ext.span) flexdiag__store_free(h->store, &h->ext);
    load_free(h);
    free(h->zoffs);
    free(h);
}
