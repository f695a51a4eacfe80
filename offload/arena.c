/*
 * arena.c - budgeted device allocation (see arena.h). The accounting is atomic so contexts on
 * different threads can allocate from one runtime; the backend call happens only after the
 * budget check succeeded, and is rolled back if the backend itself fails.
 */
#include "offload/arena.h"

#include "base/core.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

void flexdiag__arena_init(flexdiag_arena *a, const flexdiag_kernels *k, uint64_t budget) {
    a->k = k;
    a->budget = budget ? budget : UINT64_MAX;
    atomic_store(&a->used, 0);
    atomic_store(&a->peak, 0);
}

static void bump_peak(flexdiag_arena *a, uint64_t now) {
    uint64_t p = atomic_load(&a->peak);
    while (now > p && !atomic_compare_exchange_weak(&a->peak, &p, now)) {
    }
}

flexdiag_status flexdiag__arena_charge(flexdiag_arena *a, int64_t delta, const char *what) {
    if (delta < 0) {
        atomic_fetch_sub(&a->used, (uint64_t)-delta);
        return FLEXDIAG_OK;
    }
    uint64_t before = atomic_fetch_add(&a->used, (uint64_t)delta);
    if (before + (uint64_t)delta > a->budget) {
        atomic_fetch_sub(&a->used, (uint64_t)delta);
        return flexdiag__err(FLEXDIAG_ERR_OOM_DEVICE,
                             "%s needs %.3f GiB of device memory but only %.3f GiB of the "
                             "%.3f GiB budget is left (raise runtime_params.gpu_mem, or lower "
                             "context_params.max_images or context_params.max_prompt_len)",
                             what, (double)delta / GIB,
                             (double)(a->budget - (before < a->budget ? before : a->budget)) / GIB,
                             (double)a->budget / GIB);
    }
    bump_peak(a, before + (uint64_t)delta);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__arena_alloc(flexdiag_arena *a, size_t bytes, const char *what,
                                      void **out) {
    *out = NULL;
    if (bytes == 0) return FLEXDIAG_OK;
    FLEXDIAG_TRY(flexdiag__arena_charge(a, (int64_t)bytes, what));
    flexdiag_status st = a->k->mem_alloc(bytes, out);
    if (st != FLEXDIAG_OK) {
        flexdiag__arena_charge(a, -(int64_t)bytes, what);
        return flexdiag__err_prefix(st, "allocating %.3f GiB for %s", (double)bytes / GIB, what);
    }
    return FLEXDIAG_OK;
}

void flexdiag__arena_free(flexdiag_arena *a, void *p, size_t bytes) {
    if (!p) return;
    a->k->mem_free(p);
    flexdiag__arena_charge(a, -(int64_t)bytes, "free");
}

uint64_t flexdiag__arena_available(const flexdiag_arena *a) {
    uint64_t u = atomic_load(&a->used);
    return u >= a->budget ? 0 : a->budget - u;
}
