/*
 * arena.h - device memory under a hard byte budget.
 *
 * Every device allocation of the runtime (weights, KV, scratch) goes through one arena so that
 * `--gpu-mem 24G` on a 141 GB H200 honestly emulates a 24 GB card: a request that would cross
 * the budget fails with FLEXDIAG_ERR_OOM_DEVICE naming who asked, how much, and what is left,
 * before the backend is even called. Fixed backend overheads (cuBLAS workspace, CUDA context
 * reserve) are charged up front with flexdiag__arena_charge.
 */
#ifndef FLEXDIAG_ARENA_H
#define FLEXDIAG_ARENA_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/arena.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

typedef struct flexdiag_arena {
    const flexdiag_kernels *k; /* backend that owns the memory */
    uint64_t budget;           /* bytes; UINT64_MAX = unlimited */
    _Atomic uint64_t used;     /* bytes currently charged */
    _Atomic uint64_t peak;     /* high-water mark of used */
} flexdiag_arena;

/* Set up an arena over backend k with a budget (0 = unlimited). */
void flexdiag__arena_init(flexdiag_arena *a, const flexdiag_kernels *k, uint64_t budget);
/* Allocate bytes for `what` (a name for messages); fails cleanly over budget. */
flexdiag_status flexdiag__arena_alloc(flexdiag_arena *a, size_t bytes, const char *what,
                                      void **out);
/* Free p of bytes (the size given at allocation). NULL is a no-op. */
void flexdiag__arena_free(flexdiag_arena *a, void *p, size_t bytes);
/* Charge (or with a negative delta, release) bytes the backend holds outside the arena. */
flexdiag_status flexdiag__arena_charge(flexdiag_arena *a, int64_t delta, const char *what);
/* Bytes still available under the budget. */
uint64_t flexdiag__arena_available(const flexdiag_arena *a);

#endif /* FLEXDIAG_ARENA_H */
