/*
 * cpu_stream.h - the CPU execution queue (private to kernels/cpu): a persistent pthread pool
 * plus per-worker scratch. The CPU ops themselves are declared in cpu_ops.h.
 *
 * On the CPU a stream is synchronous: an op runs to completion before it returns, so
 * stream_sync has nothing to wait for. What the stream adds is parallelism: ops that can split
 * their work (fast matmul and attention) hand independent tasks to flexdiag__cpu_parallel_for,
 * which runs them on the pool with the calling thread as worker 0. A NULL stream means "run
 * serially on the caller". Ops on one stream are issued by one host thread at a time (a stream
 * is a queue); different streams are independent.
 *
 * Tasks never fail: every op validates its arguments before it dispatches, so a task only
 * computes. Scratch buffers are grow-only, so steady-state decode steps do not allocate.
 */
#ifndef FLEXDIAG_CPU_STREAM_H
#define FLEXDIAG_CPU_STREAM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* One task of a parallel job; scratch is the worker's buffer (64-byte aligned). */
typedef void (*flexdiag__cpu_task_fn)(void *ctx, int64_t task, void *scratch);

struct flexdiag_stream {
    int n_workers;            /* threads running tasks, the caller included; >= 1 */
    pthread_t *threads;       /* (n_workers - 1) pool threads */
    pthread_mutex_t mu;       /* guards every field below except next */
    pthread_cond_t wake;      /* signalled when gen changes or stop is set */
    pthread_cond_t done;      /* signalled when busy drops to 0 */
    uint64_t gen;             /* job generation; pool threads run each generation once */
    int stop;                 /* set by destroy: pool threads exit */
    int busy;                 /* pool threads still inside the current job */
    flexdiag__cpu_task_fn fn; /* current job */
    void *ctx;                /* current job's argument block */
    int64_t n_tasks;          /* tasks of the current job */
    _Atomic int64_t next;     /* next unclaimed task index */
    void **scratch;           /* (n_workers) per-worker buffers, grow-only */
    size_t scratch_bytes;     /* size of each scratch buffer */
};

/* ---- pool ---- */

/* Run fn(ctx, t, scratch) for every t in [0, n_tasks) on the workers of s (serially on the
 * caller when s is NULL or has one worker); each worker's scratch holds at least scratch_bytes.
 * Returns when all tasks are done; FLEXDIAG_ERR_OOM_HOST if scratch cannot be allocated. Not
 * re-entrant: a task must not call it on the same stream. */
flexdiag_status flexdiag__cpu_parallel_for(flexdiag_stream *s, int64_t n_tasks,
                                           size_t scratch_bytes, flexdiag__cpu_task_fn fn,
                                           void *ctx);
/* Scratch of at least bytes for a serial op: worker 0's buffer of s, or, when s is NULL, a new
 * buffer also stored in *tmp that the caller frees (free(*tmp) is always valid afterwards). */
flexdiag_status flexdiag__cpu_scratch(flexdiag_stream *s, size_t bytes, void **out, void **tmp);

/* ---- streams and memory (cpu_stream.c, ref_mem.c) ---- */

/* Create a pool of threads workers (0 = the cores this process may run on); device is ignored. */
flexdiag_status flexdiag__cpu_stream_create(int device, int threads, flexdiag_stream **out);
/* Join the pool threads and free s; NULL is a no-op. */
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
