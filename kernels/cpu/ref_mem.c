/*
 * ref_mem.c - streams, "device" memory and copies of the CPU backends: a stream owns a thread
 * pool or, for a copy queue, a ring and worker (cpu_stream.h, cpu_queue.c); the device is host
 * memory, so allocation is posix_memalign (64 bytes: one cache line, and the alignment kernels.h
 * promises) and every copy direction, the async ones included, is a memcpy that has finished
 * when it returns on an ordinary stream, and is queued (after the same argument checks) on a
 * copy queue. There is no device to pin host memory for: host_register and host_unregister
 * only check their arguments.
 *
 * device_name reports the CPU's model name from /proc/cpuinfo (Linux), else "cpu".
 *
 * Overlapping copies are a caller bug on every backend (cudaMemcpyAsync does not allow them
 * either); they are rejected here instead of silently working with memmove and then failing on
 * the GPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_stream.h"

/* Alignment of every allocation: one cache line (also enough for any SIMD width in use). */
#define CPU_MEM_ALIGN 64

/* ---- streams ---- */

flexdiag_status flexdiag__cpu_stream_create(int device, int threads, flexdiag_stream **out) {
    (void)device; /* one host: the CPU backend has no device ordinal */
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu stream_create: out is NULL");
    *out = NULL;
    flexdiag_stream *s = calloc(1, sizeof *s);
    if (!s) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cpu stream_create: out of host memory");
    flexdiag_status st = flexdiag__pool_create(threads, &s->pool);
    if (st != FLEXDIAG_OK) {
        free(s);
        return st;
    }
    *out = s;
    return FLEXDIAG_OK;
}

void flexdiag__cpu_stream_destroy(flexdiag_stream *s) {
    if (!s) return;
    flexdiag__cpu_queue_destroy(s->queue);
    flexdiag__pool_destroy(s->pool);
    free(s);
}

flexdiag_status flexdiag__cpu_stream_sync(flexdiag_stream *s) {
    if (s && s->queue) return flexdiag__cpu_queue_sync(s->queue);
    return FLEXDIAG_OK; /* every op has finished when it returns */
}

/* ---- memory and copies ---- */

flexdiag_status flexdiag__cpu_mem_alloc(size_t bytes, void **out) {
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu mem_alloc: out is NULL");
    *out = NULL;
    if (bytes == 0) return FLEXDIAG_OK;
    if (posix_memalign(out, CPU_MEM_ALIGN, bytes) != 0) {
        *out = NULL;
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "cpu mem_alloc: cannot allocate %zu bytes (%.2f GiB) of host memory: "
                             "lower the memory budget or free host memory",
                             bytes, (double)bytes / (1024.0 * 1024.0 * 1024.0));
    }
    return FLEXDIAG_OK;
}

void flexdiag__cpu_mem_free(void *p) { free(p); }

/* True when [a, a+n) and [b, b+n) overlap. */
static int ranges_overlap(const void *a, const void *b, size_t n) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + n && y < x + n;
}

flexdiag_status flexdiag__cpu_copy(void *dst, const void *src, size_t bytes, flexdiag_stream *s) {
    if (bytes == 0) return FLEXDIAG_OK;
    if (!dst || !src)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu copy of %zu bytes: %s is NULL", bytes,
                             dst ? "src" : "dst");
    if (ranges_overlap(dst, src, bytes))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu copy of %zu bytes: source and destination overlap", bytes);
    if (s && s->queue) return flexdiag__cpu_queue_copy(s->queue, dst, src, bytes);
    memcpy(dst, src, bytes);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                                      size_t width, size_t rows, flexdiag_stream *s) {
    if (width == 0 || rows == 0) return FLEXDIAG_OK;
    if (!dst || !src || dpitch < width || spitch < width)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu 2-D copy of %zu rows of %zu bytes: %s", rows, width,
                             !dst || !src ? "a pointer is NULL" : "a pitch is below the width");
    if (s && s->queue)
        return flexdiag__cpu_queue_copy_2d(s->queue, dst, dpitch, src, spitch, width, rows);
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return FLEXDIAG_OK;
}

void flexdiag__cpu_slot_rows_run(const flexdiag_slot_rows *r) {
    for (int32_t b = 0; b < r->n_seq * r->h_kv; b++) {
        size_t base = (size_t)b * r->pitch + r->ring_off;
        const int32_t *sl = r->slots + (size_t)b * (size_t)r->max_slots;
        for (int32_t i = 0; i < r->n_slots[b]; i++) {
            size_t off = base + (size_t)sl[i] * r->row_bytes;
            memcpy((char *)r->dst + off, (const char *)r->src + off, r->row_bytes);
        }
    }
}

flexdiag_status flexdiag__cpu_copy_slots(const flexdiag_slot_rows *r, flexdiag_stream *s) {
    if (r->n_seq <= 0 || r->h_kv <= 0) return FLEXDIAG_OK;
    if (!r->dst || !r->src || !r->slots || !r->n_slots || r->row_bytes == 0 ||
        r->max_slots <= 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu slot-row copy: a pointer is NULL or a row/list size is 0");
    if (s && s->queue) return flexdiag__cpu_queue_slots(s->queue, r);
    flexdiag__cpu_slot_rows_run(r);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_copy_d2h(void *dst, const void *src, size_t bytes,
                                       flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cpu_copy(dst, src, bytes, s));
    return flexdiag__cpu_stream_sync(s);
}

flexdiag_status flexdiag__cpu_memset0(void *dst, size_t bytes, flexdiag_stream *s) {
    if (bytes == 0) return FLEXDIAG_OK;
    if (!dst)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu memset0 of %zu bytes: dst is NULL",
                             bytes);
    if (s && s->queue) return flexdiag__cpu_queue_zero(s->queue, dst, bytes);
    memset(dst, 0, bytes);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_host_fn(flexdiag_stream *s, flexdiag_host_fn *fn, void *arg) {
    if (!fn) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu host_fn: fn is NULL");
    if (s && s->queue) return flexdiag__cpu_queue_fn(s->queue, fn, arg);
    fn(arg);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_host_register(void *p, size_t bytes) {
    if (!p && bytes)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu host_register of %zu bytes: p is NULL",
                             bytes);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_host_unregister(void *p) {
    (void)p; /* nothing was pinned */
    return FLEXDIAG_OK;
}

void flexdiag__cpu_device_name(const flexdiag_stream *s, char *out, size_t n) {
    (void)s;
    if (n == 0) return;
    snprintf(out, n, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        colon += strspn(colon + 1, " \t") + 1;
        snprintf(out, n, "%.*s", (int)strcspn(colon, "\n"), colon);
        break;
    }
    if (f) fclose(f);
}
