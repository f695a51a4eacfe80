/*
 * cpu_stream.h - the CPU execution queues (private to kernels/cpu): a thread pool
 * (base/thread_pool.h) or a copy queue behind the opaque flexdiag_stream, and the CPU event.
 * The CPU ops are declared in cpu_ops.h; streams, memory and copies live in ref_mem.c, the copy
 * queue in cpu_queue.c, events in cpu_event.c.
 *
 * An ordinary CPU stream is synchronous: an op runs to completion before it returns, so
 * stream_sync has nothing to wait for. What the stream adds is parallelism: ops that can split
 * their work (fast matmul and attention, the image decoder's conv and attention) hand
 * independent tasks to flexdiag__cpu_parallel_for. A NULL stream means "run serially on the
 * caller". A stream is driven by one host thread at a time; different streams are independent.
 *
 * A copy queue (kernels.h copy_stream_create) is asynchronous: a fixed ring of
 * FLEXDIAG_CPU_QUEUE_ITEMS items (allocated at creation; a full ring blocks the enqueuer) and
 * one worker thread that runs them in order. Items are copies, slot-row gathers, memset0 and
 * host functions (arguments checked when queued, so errors return from the enqueuing call),
 * event records and waits on events.
 * copy_d2h queues its copy and then drains the queue; stream_sync waits until the ring is empty
 * and the worker idle; stream_destroy drains, then joins the worker. Compute ops on a copy
 * queue are a programming error (a debug assertion in flexdiag__cpu_parallel_for and
 * flexdiag__cpu_scratch). Should the worker fail (a pthread error), it still drains the ring,
 * reaching every record and skipping the rest, and every later call on the queue returns the
 * error: nothing hangs on it.
 *
 * Test hook: FLEXDIAG_COPY_DELAY_US=N (0..1000000, read once by copy_stream_create) makes the
 * worker sleep N microseconds before each copy, memset0 and host function, so tests of an offloading
 * scheduler see a missing event dependency as wrong data instead of a lucky race.
 */
#ifndef FLEXDIAG_CPU_STREAM_H
#define FLEXDIAG_CPU_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_KERNELS_CPU)
#error "kernels/cpu/cpu_stream.h is private to kernels/cpu (docs/architecture.md)"
#endif

#include "base/core.h"
#include "base/thread_pool.h"
#include "kernels/kernels.h"

/* Items a copy queue's ring holds. */
#define FLEXDIAG_CPU_QUEUE_ITEMS 1024

/* A copy queue: its ring and worker (cpu_queue.c). */
typedef struct flexdiag__cpu_queue flexdiag__cpu_queue;

struct flexdiag_stream {
    flexdiag_pool *pool;        /* workers of an ordinary stream (owned); NULL on a copy queue */
    flexdiag__cpu_queue *queue; /* ring and worker of a copy queue (owned); NULL: ordinary */
};

/* One task of a parallel op (see base/thread_pool.h). */
typedef flexdiag__pool_task_fn flexdiag__cpu_task_fn;

/* Run fn over n_tasks on s's workers (serially when s is NULL); see flexdiag__pool_parallel_for. */
static inline flexdiag_status flexdiag__cpu_parallel_for(flexdiag_stream *s, int64_t n_tasks,
                                                         size_t scratch_bytes,
                                                         flexdiag__cpu_task_fn fn, void *ctx) {
    FLEXDIAG_DASSERT(!s || !s->queue); /* no compute ops on a copy queue */
    return flexdiag__pool_parallel_for(s ? s->pool : NULL, n_tasks, scratch_bytes, fn, ctx);
}

/* Scratch for a serial op; see flexdiag__pool_scratch. */
static inline flexdiag_status flexdiag__cpu_scratch(flexdiag_stream *s, size_t bytes, void **out,
                                                    void **tmp) {
    FLEXDIAG_DASSERT(!s || !s->queue); /* no compute ops on a copy queue */
    return flexdiag__pool_scratch(s ? s->pool : NULL, bytes, out, tmp);
}

/* ---- streams, memory and copies (ref_mem.c); declared with their kernels.h op types ---- */

/* Create a queue of threads workers (0 = the cores this process may run on); device is ignored. */
flexdiag_op_stream_create flexdiag__cpu_stream_create;
/* Join the workers (a copy queue: drain it first) and free s; NULL is a no-op. */
flexdiag_op_stream_destroy flexdiag__cpu_stream_destroy;
/* Nothing is ever pending on an ordinary CPU stream: returns FLEXDIAG_OK; a copy queue:
 * flexdiag__cpu_queue_sync. */
flexdiag_op_stream_sync flexdiag__cpu_stream_sync;
/* 64-byte aligned host memory; bytes == 0 gives NULL. */
flexdiag_op_mem_alloc flexdiag__cpu_mem_alloc;
/* Free memory of flexdiag__cpu_mem_alloc; NULL is a no-op. */
flexdiag_op_mem_free flexdiag__cpu_mem_free;
/* The CPU's model name from /proc/cpuinfo (Linux), else "cpu" (kernels.h device_name). */
flexdiag_op_device_name flexdiag__cpu_device_name;
/* memcpy for four copy slots (host memory on both sides). On an ordinary stream it has
 * finished on return, so the async copies are trivially complete by the time an event is
 * recorded after them; on a copy queue it is queued after its arguments are checked. */
flexdiag_op_copy flexdiag__cpu_copy;
/* The same for strided rows (copy_h2d_2d_async and copy_d2h_2d_async). */
flexdiag_op_copy_2d flexdiag__cpu_copy_2d;
/* The rows the slot lists name (copy_h2d_slots_async): run now on an ordinary stream, queued on a
 * copy queue (the lists are read when the worker gets there). */
flexdiag_op_copy_h2d_slots flexdiag__cpu_copy_slots;
/* Copy the rows r names (the plain C loop both paths run). */
void flexdiag__cpu_slot_rows_run(const flexdiag_slot_rows *r);
/* flexdiag__cpu_copy, then stream_sync: dst holds the data on return (copy_d2h). */
flexdiag_op_copy flexdiag__cpu_copy_d2h;
/* Zero bytes of dst (queued on a copy queue). */
flexdiag_op_memset0 flexdiag__cpu_memset0;
/* fn(arg) by the queue's worker when it gets there; on an ordinary stream now. */
flexdiag_op_host_fn flexdiag__cpu_host_fn;
/* Nothing to pin without a device: returns OK (INVALID_ARG for a NULL p with bytes > 0). */
flexdiag_op_host_register flexdiag__cpu_host_register;
/* Nothing was pinned: returns FLEXDIAG_OK. */
flexdiag_op_host_unregister flexdiag__cpu_host_unregister;

/* ---- the copy queue (cpu_queue.c) ---- */

/* A stream whose queue is a ring of FLEXDIAG_CPU_QUEUE_ITEMS and one worker; device is ignored.
 * INVALID_ARG when FLEXDIAG_COPY_DELAY_US is set but not an integer in 0..1000000. */
flexdiag_op_copy_stream_create flexdiag__cpu_copy_stream_create;
/* Queue a copy of bytes from src to dst (checked by the caller: bytes > 0, no NULL, no
 * overlap); blocks while the ring is full. */
flexdiag_status flexdiag__cpu_queue_copy(flexdiag__cpu_queue *q, void *dst, const void *src,
                                         size_t bytes);
/* Queue zeroing bytes (> 0) of dst (non-NULL). */
flexdiag_status flexdiag__cpu_queue_zero(flexdiag__cpu_queue *q, void *dst, size_t bytes);
/* Queue rows copies of width bytes, row r from src + r·spitch to dst + r·dpitch. */
flexdiag_status flexdiag__cpu_queue_copy_2d(flexdiag__cpu_queue *q, void *dst, size_t dpitch,
                                            const void *src, size_t spitch, size_t width,
                                            size_t rows);
/* Queue the copy of the rows r names (checked by the caller); r is copied. */
flexdiag_status flexdiag__cpu_queue_slots(flexdiag__cpu_queue *q, const flexdiag_slot_rows *r);
/* Queue a call of fn(arg) (kernels.h host_fn). */
flexdiag_status flexdiag__cpu_queue_fn(flexdiag__cpu_queue *q, flexdiag_host_fn *fn, void *arg);
/* Queue a record of e: marks it now, reaches it when the worker gets there. */
flexdiag_status flexdiag__cpu_queue_record(flexdiag__cpu_queue *q, flexdiag_event *e);
/* Queue a wait for e's most recent record at the time of the call: the worker blocks there
 * until that generation is reached. */
flexdiag_status flexdiag__cpu_queue_wait(flexdiag__cpu_queue *q, flexdiag_event *e);
/* Wait until the ring is empty and the worker idle; the worker's error, if it had one. */
flexdiag_status flexdiag__cpu_queue_sync(flexdiag__cpu_queue *q);
/* Drain the ring, join the worker and free q; NULL is a no-op. */
void flexdiag__cpu_queue_destroy(flexdiag__cpu_queue *q);

/* ---- events (cpu_event.c) ----
 * A CPU event is a completion object: a generation counter under a mutex and a condition
 * variable. A record takes the next generation (mark) and completes it when the stream reaches
 * it (reach); a wait takes the most recent generation at the time of its call and blocks until
 * a generation at least as recent is complete, which on an in-order queue means its own is.
 * On an ordinary (synchronous) stream a record marks and reaches at once; on a copy queue it
 * marks when the record is queued and reaches when the worker gets there, and a wait queued
 * there blocks the worker, not the host, until the generation it took is reached. */

/* Events with the kernels.h contracts; s is not needed (may be NULL). event_record and
 * stream_wait_event on a copy queue go to flexdiag__cpu_queue_record / _wait. */
flexdiag_op_event_create flexdiag__cpu_event_create;
flexdiag_op_event_destroy flexdiag__cpu_event_destroy;
/* Ordinary stream: mark + reach: everything queued on the synchronous s before the call has
 * finished. */
flexdiag_op_event_record flexdiag__cpu_event_record;
/* An ordinary stream has nothing queued to hold back: the host waits (event_sync). */
flexdiag_op_stream_wait_event flexdiag__cpu_stream_wait_event;
flexdiag_op_event_sync flexdiag__cpu_event_sync;
flexdiag_op_event_query flexdiag__cpu_event_query;
/* A record of e was queued: returns its generation (1, 2, ...); e is pending until reached. */
uint64_t flexdiag__cpu_event_mark(flexdiag_event *e);
/* The generation of e's most recent record (0: never recorded). */
uint64_t flexdiag__cpu_event_marked(flexdiag_event *e);
/* The queue reached the record of generation gen: it and every earlier generation of e are
 * complete; wakes the waiters. */
void flexdiag__cpu_event_reach(flexdiag_event *e, uint64_t gen);
/* Block until generation gen of e is complete (at once for gen 0); 0, or the pthread error. */
int flexdiag__cpu_event_wait(flexdiag_event *e, uint64_t gen);
/* A queued item names e: e stays allocated until the matching release, even when
 * event_destroy comes first. */
void flexdiag__cpu_event_hold(flexdiag_event *e);
/* Drop a reference (event_destroy drops the creator's); the last one frees e. */
void flexdiag__cpu_event_release(flexdiag_event *e);

#endif /* FLEXDIAG_CPU_STREAM_H */
