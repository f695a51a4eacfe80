/*
 * host_pool.h - the pinned host tier: one region of --cpu-mem bytes, carved
 * (docs/offloading.md §1).
 *
 * create maps the whole budget once (anonymous mmap), prefers the NUMA node nearest the GPU
 * where the caller knows the GPU's PCI bus id and hwloc can place it (offload/numa.h; mbind
 * MPOL_PREFERRED before the first touch), then pins it through the backend's host_register op
 * (cudaHostRegister on CUDA). Pinning is best effort: where it fails (RLIMIT_MEMLOCK, the
 * driver) or means nothing (a CPU backend, no backend) the pool is plain memory, and the query
 * says so for the bench row. Blocks are carved first-fit with 4096 alignment (O_DIRECT reads land
 * in them directly) and exact accounting: used counts 4096-rounded blocks, requested the bytes
 * asked for; no power-of-two rounding (FlexGen issue #4). A request over budget is
 * FLEXDIAG_ERR_OOM_PINNED naming the pool, who asked, how much and what is left.
 *
 * Thread-safe: alloc, free and the queries may be called from any thread.
 */
#ifndef FLEXDIAG_HOST_POOL_H
#define FLEXDIAG_HOST_POOL_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/host_pool.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define FLEXDIAG_HOST_POOL_ALIGN 4096u /* block alignment and granule: O_DIRECT, pages */

typedef struct flexdiag_host_pool flexdiag_host_pool;

typedef struct flexdiag_host_pool_params {
    uint64_t budget;            /* bytes (--cpu-mem), rounded down to 4096; >= 4096 */
    const flexdiag_kernels *k;  /* backend whose host_register pins (borrowed for the pool's
                                   life); NULL: plain memory */
    const char *pci_bus_id;     /* GPU's PCI bus id for NUMA placement ("0000:41:00.0");
                                   copied; NULL: no placement */
    int pin;                    /* 1 (default): pin where the backend can; 0: never */
    const char *name;           /* for messages; copied; default "pinned pool" */
} flexdiag_host_pool_params;

typedef struct flexdiag_host_pool_stats {
    uint64_t budget;    /* bytes of the region */
    uint64_t used;      /* bytes carved by live blocks (4096 multiples) */
    uint64_t peak;      /* high-water mark of used */
    uint64_t requested; /* exact bytes asked for by live blocks */
    uint64_t largest_free; /* bytes of the largest free run */
    int pinned;         /* 1: the region is page-locked for the device */
    int numa_node;      /* NUMA node the region prefers, -1: none (kernel default) */
} flexdiag_host_pool_stats;

/* Defaults into p (budget 0: the caller sets it). */
void flexdiag__host_pool_params_init(flexdiag_host_pool_params *p);
/* Map, place and pin the region; *out owned by the caller. OOM_HOST when the mapping fails.
 * Pinning failures are not errors (see flexdiag__host_pool_note). On failure *out is NULL. */
flexdiag_status flexdiag__host_pool_create(const flexdiag_host_pool_params *p,
                                           flexdiag_host_pool **out);
/* Unpin and unmap; every block becomes invalid. NULL is a no-op. */
void flexdiag__host_pool_destroy(flexdiag_host_pool *pool);
/* Carve bytes (> 0) for `what` (a name for messages; borrowed for the call): *out is
 * 4096-aligned. OOM_PINNED over budget or when no free run is large enough. */
flexdiag_status flexdiag__host_pool_alloc(flexdiag_host_pool *pool, size_t bytes,
                                          const char *what, void **out);
/* Return a block (p and the bytes given to alloc). NULL is a no-op; a block that is not live
 * aborts (programmer error). */
void flexdiag__host_pool_free(flexdiag_host_pool *pool, void *p, size_t bytes);
/* The region (for registering it with the store's io_uring) and its length. */
void *flexdiag__host_pool_base(const flexdiag_host_pool *pool);
size_t flexdiag__host_pool_bytes(const flexdiag_host_pool *pool);
/* Accounting and placement. */
void flexdiag__host_pool_stats(const flexdiag_host_pool *pool, flexdiag_host_pool_stats *out);
/* One line for the bench row: "pinned, NUMA node 1" or "not pinned: <why>; NUMA: <why>".
 * Valid for the pool's lifetime. */
const char *flexdiag__host_pool_note(const flexdiag_host_pool *pool);

#endif /* FLEXDIAG_HOST_POOL_H */
