/*
 * cpu_stream.h - the CPU execution queue (private to kernels/cpu): a thread pool
 * (base/thread_pool.h) behind the opaque flexdiag_stream, and the CPU event. The CPU ops are
 * declared in cpu_ops.h; streams, memory and copies live in ref_mem.c, events in cpu_event.c.
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

/* ---- streams, memory and copies (ref_mem.c); declared with their kernels.h op types ---- */

/* Create a queue of threads workers (0 = the cores this process may run on); device is ignored. */
flexdiag_op_stream_create flexdiag__cpu_stream_create;
/* Join the workers and free s; NULL is a no-op. */
flexdiag_op_stream_destroy flexdiag__cpu_stream_destroy;
/* Nothing is ever pending on a CPU stream: returns FLEXDIAG_OK. */
flexdiag_op_stream_sync flexdiag__cpu_stream_sync;
/* 64-byte aligned host memory; bytes == 0 gives NULL. */
flexdiag_op_mem_alloc flexdiag__cpu_mem_alloc;
/* Free memory of flexdiag__cpu_mem_alloc; NULL is a no-op. */
flexdiag_op_mem_free flexdiag__cpu_mem_free;
/* The CPU's model name from /proc/cpuinfo (Linux), else "cpu" (kernels.h device_name). */
flexdiag_op_device_name flexdiag__cpu_device_name;
/* memcpy for all five copy slots (host memory on both sides; finished on return, so the async
 * copies are trivially complete by the time an event is recorded after them). */
flexdiag_op_copy flexdiag__cpu_copy;
/* Zero bytes of dst. */
flexdiag_op_memset0 flexdiag__cpu_memset0;
/* Nothing to pin without a device: returns OK (INVALID_ARG for a NULL p with bytes > 0). */
flexdiag_op_host_register flexdiag__cpu_host_register;
/* Nothing was pinned: returns FLEXDIAG_OK. */
flexdiag_op_host_unregister flexdiag__cpu_host_unregister;

/* ---- events (cpu_event.c) ----
 * A CPU event is a completion object: a generation counter under a mutex and a condition
 * variable. A record takes the next generation (mark) and completes it when the stream reaches
 * it (reach); a wait takes the most recent generation at the time of its call and blocks until
 * a generation at least as recent is complete, which on an in-order queue means its own is.
 * CPU streams are synchronous today, so a record marks and reaches at once; a stream that runs
 * its work on a worker thread would mark when the record is queued and reach when the worker
 * gets there, and every wait would stay right. */

/* Events with the kernels.h contracts; s is not needed (may be NULL). */
flexdiag_op_event_create flexdiag__cpu_event_create;
flexdiag_op_event_destroy flexdiag__cpu_event_destroy;
/* mark + reach: everything queued on the synchronous s before the call has finished. */
flexdiag_op_event_record flexdiag__cpu_event_record;
/* A synchronous stream has nothing queued to hold back: the host waits (event_sync). */
flexdiag_op_stream_wait_event flexdiag__cpu_stream_wait_event;
flexdiag_op_event_sync flexdiag__cpu_event_sync;
flexdiag_op_event_query flexdiag__cpu_event_query;
/* A record of e was queued: returns its generation (1, 2, ...); e is pending until reached. */
uint64_t flexdiag__cpu_event_mark(flexdiag_event *e);
/* The queue reached the record of generation gen: it and every earlier generation of e are
 * complete; wakes the waiters. */
void flexdiag__cpu_event_reach(flexdiag_event *e, uint64_t gen);

#endif /* FLEXDIAG_CPU_STREAM_H */
