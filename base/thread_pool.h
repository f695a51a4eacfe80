/*
 * thread_pool.h - a persistent pthread pool with per-worker scratch (thread_pool.c).
 *
 * Work is a job of n independent tasks: flexdiag__pool_parallel_for runs them on the pool's
 * workers with the calling thread as worker 0 and returns when all are done. Each task owns
 * disjoint outputs and computes them in a fixed order, so results never depend on which worker
 * ran a task. Scratch buffers are grow-only, so steady-state decode steps do not allocate.
 *
 * Ownership rule: a pool has one owner (a CPU stream, a context's policy workers) and is
 * driven by one thread at a time. parallel_for additionally serialises concurrent submitters
 * (a second caller waits for the first job), so misuse costs time, never wrong results or a
 * deadlock; flexdiag__pool_scratch hands out worker 0's buffer and is for the owner only.
 * Tasks never fail and must not submit to the pool they run on.
 */
#ifndef FLEXDIAG_THREAD_POOL_H
#define FLEXDIAG_THREAD_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/layer.h"
#include "flexdiag.h"

/* One task of a parallel job; scratch is the worker's buffer (64-byte aligned). */
typedef void (*flexdiag__pool_task_fn)(void *ctx, int64_t task, void *scratch);

typedef struct flexdiag_pool {
    int n_workers;            /* threads running tasks, the caller included; >= 1 */
    pthread_t *threads;       /* (n_workers - 1) pool threads */
    pthread_mutex_t submit;   /* held for a whole job: one submitter at a time */
    pthread_mutex_t mu;       /* the submitter's sleep on done */
    pthread_cond_t done;      /* signalled when busy drops to 0 */
    _Atomic uint32_t wake;    /* futex word: bumped whenever gen changes or stop is set */
    atomic_int sleepers;      /* pool threads asleep on wake or about to be */
    double poll_s;            /* seconds a waiting thread polls before it sleeps */
    _Atomic uint64_t gen;     /* job generation; pool threads run each generation once */
    _Atomic uint64_t closed;  /* last generation whose tasks are all done: no one joins it */
    atomic_int stop;          /* set by destroy: pool threads exit */
    atomic_int busy;          /* pool threads that joined the current job and not left it */
    flexdiag__pool_task_fn fn; /* current job: written before gen is bumped, read after */
    void *ctx;                /* current job's argument block */
    int64_t n_tasks;          /* tasks of the current job */
    _Atomic int64_t next;     /* next unclaimed task index */
    void **scratch;           /* (n_workers) per-worker buffers, grow-only */
    size_t scratch_bytes;     /* size of each scratch buffer */
} flexdiag_pool;

/* Create a pool of threads workers (0 = the cores this process may run on, affinity mask
 * first); *out is owned by the caller. */
flexdiag_status flexdiag__pool_create(int threads, flexdiag_pool **out);
/* Join the pool threads and free s; NULL is a no-op. */
void flexdiag__pool_destroy(flexdiag_pool *s);
/* Workers of s, the caller included (1 for NULL). */
int flexdiag__pool_workers(const flexdiag_pool *s);
/* Run fn(ctx, t, scratch) for every t in [0, n_tasks) on the workers of s (serially on the
 * caller when s is NULL or has one worker); each worker's scratch holds at least scratch_bytes.
 * Returns when all tasks are done; FLEXDIAG_ERR_OOM_HOST if scratch cannot be allocated. */
flexdiag_status flexdiag__pool_parallel_for(flexdiag_pool *s, int64_t n_tasks,
                                            size_t scratch_bytes, flexdiag__pool_task_fn fn,
                                            void *ctx);
/* Scratch of at least bytes for a serial job: worker 0's buffer of s, or, when s is NULL, a new
 * buffer also stored in *tmp that the caller frees (free(*tmp) is always valid afterwards). */
flexdiag_status flexdiag__pool_scratch(flexdiag_pool *s, size_t bytes, void **out, void **tmp);

#endif /* FLEXDIAG_THREAD_POOL_H */
