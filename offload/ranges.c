/*
 * ranges.c - first-fit range carving with exact accounting (see ranges.h). The free list is an
 * array sorted by offset; alloc scans it for the first run that fits and cuts from its front,
 * free inserts the range back and merges it with the runs on either side.
 */
#include "offload/ranges.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"

uint64_t flexdiag__ranges_round(uint64_t bytes, uint64_t g) {
    if (bytes > UINT64_MAX - (g - 1)) return UINT64_MAX;
    return (bytes + g - 1) & ~(g - 1);
}

const char *flexdiag__fmt_bytes(uint64_t bytes, char *buf, size_t n) {
    const double b = (double)bytes;
    if (bytes < 1024)
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else if (bytes < 1024 * 1024)
        snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else if (bytes < 1024ull * 1024 * 1024)
        snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else
        snprintf(buf, n, "%.3f GiB", b / 1073741824.0);
    return buf;
}

/* Make room for at least n free-list entries. */
static int reserve(flexdiag_ranges *r, int64_t n) {
    if (n <= r->cap_free) return 1;
    int64_t cap = r->cap_free ? r->cap_free : 16;
    while (cap < n) cap *= 2;
    flexdiag_range_free *f = realloc(r->free, (size_t)cap * sizeof *f);
    if (!f) return 0;
    r->free = f;
    r->cap_free = cap;
    return 1;
}

flexdiag_status flexdiag__ranges_init(flexdiag_ranges *r, uint64_t size, uint64_t granule) {
    FLEXDIAG_ASSERT(granule && (granule & (granule - 1)) == 0);
    memset(r, 0, sizeof *r);
    r->granule = granule;
    r->size = size & ~(granule - 1);
    if (!reserve(r, 2))
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "range allocator: no memory for its free list");
    if (r->size) r->free[r->n_free++] = (flexdiag_range_free){0, r->size};
    return FLEXDIAG_OK;
}

void flexdiag__ranges_fini(flexdiag_ranges *r) {
    free(r->free);
    memset(r, 0, sizeof *r);
}

int flexdiag__ranges_alloc(flexdiag_ranges *r, uint64_t bytes, uint64_t *off) {
    FLEXDIAG_ASSERT(bytes > 0);
    const uint64_t need = flexdiag__ranges_round(bytes, r->granule);
    if (need > r->size) return 0;
    /* a later free may split nothing but can add one run per live range: keep room for it */
    if (!reserve(r, r->live + 2)) return -1;
    for (int64_t i = 0; i < r->n_free; i++) {
        flexdiag_range_free *f = &r->free[i];
        if (f->len < need) continue;
        *off = f->off;
        f->off += need;
        f->len -= need;
        if (f->len == 0) {
            memmove(f, f + 1, (size_t)(r->n_free - i - 1) * sizeof *f);
            r->n_free--;
        }
        r->used += need;
        r->requested += bytes;
        r->live++;
        if (r->used > r->peak) r->peak = r->used;
        return 1;
    }
    return 0;
}

void flexdiag__ranges_free(flexdiag_ranges *r, uint64_t off, uint64_t bytes) {
    const uint64_t len = flexdiag__ranges_round(bytes, r->granule);
    FLEXDIAG_ASSERT(bytes > 0 && r->live > 0 && off % r->granule == 0);
    FLEXDIAG_ASSERT(len <= r->size && off <= r->size - len);
    /* i = first free run after the range; the range must not overlap its neighbours */
    int64_t i = 0;
    while (i < r->n_free && r->free[i].off < off) i++;
    flexdiag_range_free *prev = i > 0 ? &r->free[i - 1] : NULL;
    flexdiag_range_free *next = i < r->n_free ? &r->free[i] : NULL;
    FLEXDIAG_ASSERT(!prev || prev->off + prev->len <= off); /* double free or wrong size */
    FLEXDIAG_ASSERT(!next || off + len <= next->off);
    r->used -= len;
    r->requested -= bytes;
    r->live--;
    const int join_prev = prev && prev->off + prev->len == off;
    const int join_next = next && off + len == next->off;
    if (join_prev && join_next) {
        prev->len += len + next->len;
        memmove(next, next + 1, (size_t)(r->n_free - i - 1) * sizeof *next);
        r->n_free--;
    } else if (join_prev) {
        prev->len += len;
    } else if (join_next) {
        next->off = off;
        next->len += len;
    } else {
        /* room was reserved by alloc: n_free <= live + 1 before this insert */
        FLEXDIAG_ASSERT(r->n_free < r->cap_free);
        memmove(&r->free[i + 1], &r->free[i], (size_t)(r->n_free - i) * sizeof *r->free);
        r->free[i] = (flexdiag_range_free){off, len};
        r->n_free++;
    }
}

uint64_t flexdiag__ranges_largest(const flexdiag_ranges *r) {
    uint64_t m = 0;
    for (int64_t i = 0; i < r->n_free; i++)
        if (r->free[i].len > m) m = r->free[i].len;
    return m;
}
