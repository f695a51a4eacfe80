/*
 * weight_homes.h - where each decoder layer's weight bytes live when they do not all fit the
 * device: a device prefix, a pinned-host middle and a disk tail (placement `--weights G,C,D`).
 *
 * Every layer is one block of row-major tensors with the same offsets in every layer (the
 * runtime's weight layout). A placement cuts that block twice, each cut on a row boundary of the
 * tensor it falls in (a row range of a row-major tensor is one contiguous byte range), so every
 * layer's bytes [0, cut0) stay on the device, [cut0, cut1) live in the pinned host pool and
 * [cut1, layer_bytes) in the NVMe store. The cut nearest the requested percentage is at most half
 * a row away, which keeps the realised split within a fraction of a percent of the request
 * (FlexGen's per-tensor midpoint rule misses by up to a third).
 *
 * Homes are filled once, at load, through put (a byte range of one layer, any tier mix) and
 * finish; the tiered scheduler (sched_tiered.c) then copies each layer's host and disk parts into
 * a device slot ahead of the compute that reads them.
 *
 * With compression (--compress-weights 4bit) the streamed bytes [cut0, layer_bytes) are kept
 * packed below the device: the rows of the matrices (spans marked pack) in 4-bit groups
 * (kernels.h flexdiag_op_wq4_unpack), everything else (norms, biases, padding) as it is, in block
 * order. A cut falls on a row boundary, so each tier holds whole packed rows; pk[] gives the
 * packed offsets of the cuts, and the pieces (flexdiag__wcut_pieces) map packed bytes back to the
 * block. The device prefix stays unpacked.
 *
 * With --compress-disk zstd the disk part of every layer is stored as byte-plane zstd chunks
 * (planes_zstd.h; elements of 2 bytes, 1 under q4) of FLEXDIAG_PZ_CHUNK raw bytes each, one
 * record per layer at a fixed stride (the record's bound, so the store is sized before any layer
 * is compressed); the index zoffs holds where each chunk of each layer starts. The pinned and
 * device parts are not compressed. Lossless: the decoded bytes are the bytes put.
 */
#ifndef FLEXDIAG_WEIGHT_HOMES_H
#define FLEXDIAG_WEIGHT_HOMES_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/weight_homes.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "offload/arena.h"
#include "offload/host_pool.h"
#include "offload/planes_zstd.h"
#include "offload/store.h"

#define FLEXDIAG_WSPANS_MAX 16

/* One tensor of a layer block: bytes [off, off + bytes), rows of row_bytes each (a vector is
 * one row) of bf16 values. Spans are in block order and do not overlap; gaps between them are
 * padding. pack: a matrix whose rows may be stored in 4-bit groups under compression. */
typedef struct flexdiag_wspan {
    size_t off, bytes, row_bytes;
    int pack;
} flexdiag_wspan;

/* A run of the streamed bytes: block bytes [off, off + bytes) stored at packed offset poff
 * (from the start of the block's packed form); pack: rows x cols values in 4-bit groups,
 * otherwise the bytes as they are. */
typedef struct flexdiag_wpiece {
    size_t off, bytes, poff;
    int64_t rows, cols;
    int pack;
} flexdiag_wpiece;
#define FLEXDIAG_WPIECES_MAX (2 * FLEXDIAG_WSPANS_MAX + 1)

/* The tiers of a placement, in cut order. */
enum { FLEXDIAG_TIER_GPU = 0, FLEXDIAG_TIER_CPU = 1, FLEXDIAG_TIER_DISK = 2 };

/* A placement of one layer block: the request and where the cuts fell. */
typedef struct flexdiag_wcut {
    uint32_t pct[3];     /* requested percent per tier (sum 100) */
    size_t layer_bytes;  /* bytes of one layer block */
    size_t cut[2];       /* [0, cut[0]) device, [cut[0], cut[1]) host, [cut[1], layer_bytes) disk */
    size_t split_start;  /* start of the tensor cut[0] falls inside (cut[0] when it falls on a
                            tensor boundary or in padding): a scheduler copies [split_start,
                            cut[0]) of the device prefix next to the streamed rows */
    int q4;              /* streamed bytes packed (some span packs) */
    int zstd;            /* the disk part stored as byte-plane zstd chunks (it holds bytes) */
    size_t pk[3];        /* packed offsets of cut[0], cut[1], layer_bytes (q4) */
    int n_spans;
    flexdiag_wspan spans[FLEXDIAG_WSPANS_MAX];
} flexdiag_wcut;

/* What a placement compresses below the device (flags of wcut_make's compress). */
enum {
    FLEXDIAG_WCOMPRESS_Q4 = 1,   /* the streamed bytes in 4-bit groups (--compress-weights 4bit) */
    FLEXDIAG_WCOMPRESS_ZSTD = 2, /* the disk part as zstd chunks (--compress-disk zstd) */
};

/* Cut a layer of n spans (layer_bytes in all) for pct (G, C, D summing to 100): each cut on the
 * row boundary nearest its target; compress: FLEXDIAG_WCOMPRESS_* flags (Q4: spans marked pack
 * whose rows are whole groups are packed). INVALID_ARG naming the placement when pct does not
 * sum to 100. */
flexdiag_status flexdiag__wcut_make(const flexdiag_wspan *spans, int n, size_t layer_bytes,
                                    const uint32_t pct[3], int compress, flexdiag_wcut *out);
/* The pieces of the streamed bytes [cut[0], layer_bytes) in block order (at most
 * FLEXDIAG_WPIECES_MAX); returns their count. */
int flexdiag__wcut_pieces(const flexdiag_wcut *c, flexdiag_wpiece *out);
/* Bytes of tier t in one layer, as stored (packed below the device under q4). */
size_t flexdiag__wcut_bytes(const flexdiag_wcut *c, int tier);
/* Bytes of one layer's disk part in the store: rounded up to the store's 4096 alignment (under
 * zstd, the bound of its chunks: every disk part fits, whatever it compresses to). */
size_t flexdiag__wcut_disk_stride(const flexdiag_wcut *c);
/* Bytes of the elements the disk part's byte planes split (2: bf16; 1 when packed). */
static inline int flexdiag__wcut_disk_elem(const flexdiag_wcut *c) { return c->q4 ? 1 : 2; }

typedef struct flexdiag_weight_homes {
    flexdiag_wcut cut;          /* the placement of every layer */
    int32_t n_layers;
    const flexdiag_kernels *k;  /* backend of the device prefix */
    flexdiag_arena *arena;      /* borrowed: the device prefix's budget */
    flexdiag_host_pool *pool;   /* borrowed; NULL when no bytes live on the host */
    flexdiag_store *store;      /* borrowed; NULL when no bytes live on disk */
    void *dev;                  /* (n_layers, cut[0]) device bytes, NULL when cut[0] == 0 */
    void *host;                 /* (n_layers, cut[1] - cut[0]) pinned bytes, NULL when none */
    flexdiag_store_extent ext;  /* (n_layers, disk_stride) bytes of the store */
    size_t disk_stride;         /* flexdiag__wcut_disk_stride */
    int threads;                /* zstd: workers that compress and decompress (0: all cores) */
    size_t zchunks;             /* zstd: chunks of a layer's disk part */
    uint64_t *zoffs;            /* zstd: (n_layers, zchunks + 1) chunk offsets in each record,
                                   the last one the record's bytes */
    /* loading only: one layer's disk part assembled in aligned memory before it is written */
    void *stage;                /* disk_stride bytes, 4096-aligned; NULL after finish */
    int32_t stage_layer;        /* layer held by stage, -1 when none */
    /* loading under q4: one layer's streamed bytes assembled, then packed */
    void *raw;                  /* layer_bytes - cut[0] bytes; NULL after finish */
    uint8_t *packed;            /* pk[2] - pk[0] bytes */
    int32_t raw_layer;          /* layer held by raw, -1 when none */
    /* loading under zstd: the encoders and one layer's record */
    flexdiag_pz_many *zenc;     /* NULL after finish */
    void *zrec;                 /* disk_stride bytes, 4096-aligned; NULL after finish */
} flexdiag_weight_homes;

/* Carve the homes of n_layers layers cut by *cut: the device prefix from arena, the host part
 * from pool, the disk part from store (each NULL allowed when its tier holds nothing; a tier
 * that holds bytes without its home is INVALID_ARG naming the flag that provides it). Over a
 * budget the status is the tier's own (OOM_DEVICE, OOM_PINNED, NO_SPACE). threads: the zstd
 * workers (0: all cores; unused without zstd). *out owned by the caller (destroy). */
flexdiag_status flexdiag__whomes_create(const flexdiag_wcut *cut, int32_t n_layers,
                                        flexdiag_arena *arena, flexdiag_host_pool *pool,
                                        flexdiag_store *store, int threads,
                                        flexdiag_weight_homes **out);
/* Store bytes [off, off + bytes) of layer j's block from host memory src (copies done when it
 * returns; device parts go through stream s). Layers are written in order: a disk part is
 * assembled until a put for another layer (or finish) writes it out. */
flexdiag_status flexdiag__whomes_put(flexdiag_weight_homes *h, int32_t j, size_t off,
                                     const void *src, size_t bytes, flexdiag_stream *s);
/* Write the last assembled disk part and drop the loading stage. */
flexdiag_status flexdiag__whomes_finish(flexdiag_weight_homes *h);
/* Return every home to its tier; NULL is a no-op. */
void flexdiag__whomes_destroy(flexdiag_weight_homes *h);

/* Addresses of layer j's parts. */
static inline const char *flexdiag__whomes_dev(const flexdiag_weight_homes *h, int32_t j) {
    return (const char *)h->dev + (size_t)j * h->cut.cut[0];
}
static inline const char *flexdiag__whomes_host(const flexdiag_weight_homes *h, int32_t j) {
    return (const char *)h->host + (size_t)j * flexdiag__wcut_bytes(&h->cut, FLEXDIAG_TIER_CPU);
}
static inline uint64_t flexdiag__whomes_disk_off(const flexdiag_weight_homes *h, int32_t j) {
    return h->ext.off + (uint64_t)j * h->disk_stride;
}
/* zstd: the chunk offsets of layer j's record (zchunks + 1 entries). */
static inline const uint64_t *flexdiag__whomes_zoffs(const flexdiag_weight_homes *h, int32_t j) {
    return h->zoffs + (size_t)j * (h->zchunks + 1);
}
/* Bytes of layer j's disk part in the store as read: the record rounded up to 4096 under zstd,
 * the stride otherwise. */
static inline size_t flexdiag__whomes_disk_read(const flexdiag_weight_homes *h, int32_t j) {
    if (!h->cut.zstd) return h->disk_stride;
    return (flexdiag__whomes_zoffs(h, j)[h->zchunks] + FLEXDIAG_STORE_ALIGN - 1) &
           ~(size_t)(FLEXDIAG_STORE_ALIGN - 1);
}

#endif /* FLEXDIAG_WEIGHT_HOMES_H */
