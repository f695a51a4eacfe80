/*
 * cpu_stream.h - the CPU execution queue (private to kernels/cpu): a thread pool
 * (base/thread_pool.h) behind the opaque flexdiag_stream. The CPU ops are declared in
 * cpu_ops.h; streams, memory and copies live in ref_mem.c.
 *
 * On the CPU a stream is synchronous: an op runs to completion before it returns, so
 * stream_sync has nothing to wait for. What the stream adds is parallelism: ops that can split
 * their work (fast matmul and attention, the image decoder's conv and attention) hand
 * independent tasks to flexdiag__cpu_parallel_for. A NULL stream means "run serially on the
 * caller". A stream is driven by one host thread at a time; different streams are independent.
 */
#ifndef FLEXDIAG_CPU_STREAM_H
#define FLEXDIAG_CPU_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CPU)
#error "kernels/cpu/cpu_stream.h is private to kernels/cpu (docs/architecture.md)"
#endif

#include "base/thread_pool.h"
#include "kernels/kernels.h"

struct flexdiag_stream {
    flexdiag_pool *pool; /* workers of this queue (owned) */
};

/* One task of a parallel op (see base/thread_pool.h). */
typedef flexdiag__pool_task_fn flexdiag__cpu_task_fn;

/* Run fn over n_tasks on s's workers (serially when s is NULL); see flexdiag__pool_parallel_for. */
static inline flexdiag_status flexdiag__cpu_parallel_for(flexdiag_stream *s, int64_t n_tasks,
                                                         size_t scratch_bytes,
                                                         flexdiag__cpu_task_fn fn, void *ctx) {
    return flexdiag__pool_parallel_for(s ? s->pool : NULL, n_tasks, scratch_bytes, fn, ctx);
}

/* Scratch for a serial op; see flexdiag__pool_scratch. */
static inline flexdiag_status flexdiag__cpu_scratch(flexdiag_stream *s, size_t bytes, void **out,
                                                    void **tmp) {
    return flexdiag__pool_scratch(s ? s->pool : NULL, bytes, out, tmp);
}

/* ---- streams and memory (ref_mem.c) ---- */

/* Create a queue of threads workers (0 = the cores this process may run on); device is ignored. */
flexdiag_status flexdiag__cpu_stream_create(int device, int threads, flexdiag_stream **out);
/* Join the workers and free s; NULL is a no-op. */
void flexdiag__cpu_stream_destroy(flexdiag_stream *s);
/* Nothing is ever pending on a CPU stream: returns FLEXDIAG_OK. */
flexdiag_status flexdiag__cpu_stream_sync(flexdiag_stream *s);
/* 64-byte aligned host memory; bytes == 0 gives NULL. */
flexdiag_status flexdiag__cpu_mem_alloc(size_t bytes, void **out);
/* Free memory of flexdiag__cpu_mem_alloc; NULL is a no-op. */
void flexdiag__cpu_mem_free(void *p);
/* The CPU's model name from /proc/cpuinfo (Linux), else "cpu" (kernels.h device_name). */
void flexdiag__cpu_device_name(const flexdiag_stream *s, char *out, size_t n);
/* memcpy for all three directions (host memory on both sides). */
flexdiag_status flexdiag__cpu_copy(void *dst, const void *src, size_t bytes, flexdiag_stream *s);
/* Zero bytes of dst. */
flexdiag_status flexdiag__cpu_memset0(void *dst, size_t bytes, flexdiag_stream *s);

#endif /* FLEXDIAG_CPU_STREAM_H */
