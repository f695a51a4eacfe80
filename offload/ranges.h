/*
 * ranges.h - first-fit carving of one linear span (a file, a host region) into aligned ranges.
 *
 * The NVMe store carves its preallocated file into extents and the pinned host pool carves its
 * one region into blocks; both need the same thing: take `bytes` rounded up to the granule
 * (4096, so O_DIRECT may use every range), first fit over a free list kept sorted by offset,
 * coalesce on free, and count exactly: `used` is what is carved (granule multiples, what the
 * budget loses), `requested` the bytes asked for (no power-of-two rounding anywhere, FlexGen
 * issue #4). Allocation happens at setup, not per token, so the free list is a plain sorted
 * array with O(n) insert; a buddy or size-class allocator would round and fragment more.
 * The free list is grown at alloc time (one slot per live range + 1 bounds it), so a free never
 * allocates and never fails. Not thread-safe: the owner (store, pool) holds its lock.
 */
#ifndef FLEXDIAG_RANGES_H
#define FLEXDIAG_RANGES_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/ranges.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

typedef struct flexdiag_range_free {
    uint64_t off; /* bytes from the start of the span, multiple of the granule */
    uint64_t len; /* bytes, multiple of the granule, > 0 */
} flexdiag_range_free;

typedef struct flexdiag_ranges {
    uint64_t size;             /* bytes managed, multiple of granule */
    uint64_t granule;          /* alignment and rounding unit, power of two */
    uint64_t used;             /* bytes carved (sum of rounded sizes of live ranges) */
    uint64_t peak;             /* high-water mark of used */
    uint64_t requested;        /* exact bytes asked for by the live ranges */
    int64_t live;              /* live ranges */
    flexdiag_range_free *free; /* (n_free) free runs, sorted by off, never adjacent */
    int64_t n_free, cap_free;  /* entries used / allocated */
} flexdiag_ranges;

/* Manage [0, size) in granule units (size is rounded down to the granule). OOM_HOST if the free
 * list cannot be allocated. */
flexdiag_status flexdiag__ranges_init(flexdiag_ranges *r, uint64_t size, uint64_t granule);
/* Release the free list; r may be zeroed. */
void flexdiag__ranges_fini(flexdiag_ranges *r);
/* Carve bytes (> 0) rounded up to the granule, first fit: *off on success (return 1), 0 when no
 * free run is large enough, -1 when the free list could not grow (host OOM). */
int flexdiag__ranges_alloc(flexdiag_ranges *r, uint64_t bytes, uint64_t *off);
/* Return the range of a previous alloc (off, bytes as asked). A range that is not live (double
 * free, wrong size) is a programmer error and aborts. */
void flexdiag__ranges_free(flexdiag_ranges *r, uint64_t off, uint64_t bytes);
/* Bytes of the largest free run (what one alloc can still get). */
uint64_t flexdiag__ranges_largest(const flexdiag_ranges *r);
/* bytes rounded up to the granule g (a power of two); UINT64_MAX on overflow. */
uint64_t flexdiag__ranges_round(uint64_t bytes, uint64_t g);
/* bytes for messages, "512 B", "4.0 KiB", "1.50 MiB", "3.000 GiB", into buf (n bytes);
 * returns buf. */
const char *flexdiag__fmt_bytes(uint64_t bytes, char *buf, size_t n);

#endif /* FLEXDIAG_RANGES_H */
