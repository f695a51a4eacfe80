/*
 * kv_disk.h - the disk KV home of the KV scheduler (sched_kv.c): the micro-batches whose KV
 * exceeds pinned memory keep it in an extent of the NVMe store, and each (layer, micro-batch)
 * passes through a pinned staging region on its way to and from the device.
 *
 * File layout: (n_layers, 2 (K, V), n_mb, region) where a region is one micro-batch's spans of
 * one layer in the device layout ((sequence, KV head) blocks of span_rows rows), padded to 4 KiB,
 * so no page is shared between two regions. A staging region mirrors one (layer, micro-batch):
 * its K region, then its V region, so the scheduler's strided copies see the same layout as in
 * the pinned home.
 *
 * get() takes the staging region a prefetch() of the same rows started, or reads into a free
 * one the pages holding rows [lo, hi) of every block of the asked sequences (one request per run of adjacent pages: a dense step reads its blocks'
 * prompts and ring prefixes, not the empty rest of each ring), after writing back any earlier
 * staging of the same (layer, micro-batch), and waits for the read. put() marks rows [lo, hi) of
 * a staging region as written by the device-to-host copies queued on the down stream; the write
 * to the file is submitted when that region is next needed (its pages are whole, since get() read
 * them: a page the device did not write goes back unchanged). The host waits only for a disk
 * request or for the copies that fill or drain a staging region it is about to reuse.
 */
#ifndef FLEXDIAG_KV_DISK_H
#define FLEXDIAG_KV_DISK_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/kv_disk.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "offload/store.h"

/* Staging regions of the disk home: one the device reads, one being prefetched, two draining
 * (copied back, then written). */
#define FLEXDIAG_KV_DISK_STAGES 4

typedef struct flexdiag_kv_disk_params {
    const flexdiag_kernels *k;
    flexdiag_store *store;   /* borrowed */
    uint64_t off;            /* start of the extent (4096-aligned) */
    int32_t n_layers, n_mb;  /* layers; disk-homed micro-batches */
    int32_t mb_seq;          /* sequences per micro-batch */
    size_t seq_bytes;        /* bytes of one sequence's K (or V) in one layer */
    int32_t heads;           /* KV heads: blocks per sequence span */
    size_t block_bytes;      /* bytes of one (sequence, KV head) block */
    size_t row_bytes;        /* bytes of one row of a block */
    char *stage;             /* FLEXDIAG_KV_DISK_STAGES × 2 regions of pinned memory (borrowed) */
    flexdiag_stream *up;     /* the stream the copies out of a staging region run on */
    flexdiag_stream *down;   /* the stream the copies back into it run on */
} flexdiag_kv_disk_params;

typedef struct flexdiag_kv_disk flexdiag_kv_disk;

/* Bytes of one region (a micro-batch's K or V spans of one layer, padded to 4 KiB). */
size_t flexdiag__kv_disk_region(int32_t mb_seq, size_t seq_bytes);
/* Bytes of the store extent for n_mb micro-batches. */
uint64_t flexdiag__kv_disk_bytes(int32_t n_layers, int32_t n_mb, int32_t mb_seq, size_t seq_bytes);
/* Pinned bytes of the staging regions. */
size_t flexdiag__kv_disk_stage_bytes(int32_t mb_seq, size_t seq_bytes);

flexdiag_status flexdiag__kv_disk_create(const flexdiag_kv_disk_params *p, flexdiag_kv_disk **out);
/* Free d (NULL: no-op) once the copies into and out of its staging regions are done; rows not
 * yet written to the file are dropped with the context that owned them. */
flexdiag_status flexdiag__kv_disk_destroy(flexdiag_kv_disk *d);

/* Rows [lo, hi) of every block of sequences [s, s + n) of disk micro-batch mb (s counted from
 * the micro-batch's first sequence) in layer j, read into a staging region: *k and *v point at
 * sequence s's K and V spans there; *stage identifies the region for put(). */
flexdiag_status flexdiag__kv_disk_get(flexdiag_kv_disk *d, int32_t j, int32_t mb, int32_t s,
                                      int32_t n, int32_t lo, int32_t hi, char **k, char **v,
                                      int *stage);
/* Start reading rows [lo, hi) of the blocks of (j, mb, s, n) into a staging region without
 * waiting: the get() of those rows (or of a subset) that follows takes it. */
flexdiag_status flexdiag__kv_disk_prefetch(flexdiag_kv_disk *d, int32_t j, int32_t mb, int32_t s,
                                           int32_t n, int32_t lo, int32_t hi);
/* Record on the up stream that the copies out of the staging region are queued (it is not
 * reused before they are done). */
flexdiag_status flexdiag__kv_disk_loaded(flexdiag_kv_disk *d, int stage);
/* The copies of rows [lo, hi) of the region's blocks back into it are queued on the down
 * stream; once they are done the pages holding those rows go to the file. */
flexdiag_status flexdiag__kv_disk_put(flexdiag_kv_disk *d, int stage, int32_t lo, int32_t hi);

typedef struct flexdiag_kv_disk_stats {
    uint64_t read_bytes, write_bytes; /* file bytes read and written */
    uint64_t gets;                    /* get()s */
    uint64_t prefetch_hits;           /* of them, the ones that found their rows prefetched */
    double wait_s;                    /* host seconds waiting for the disk or a staging region */
} flexdiag_kv_disk_stats;

void flexdiag__kv_disk_stats(const flexdiag_kv_disk *d, flexdiag_kv_disk_stats *out);

#endif /* FLEXDIAG_KV_DISK_H */
