/*
 * thread_pool.c - a persistent pthread pool with per-worker scratch: the workers of the CPU
 * backend's streams and of the host-side policy work.
 *
 * A job is (fn, ctx, n_tasks). The submitting thread publishes it, bumps the generation, then
 * the futex word, and wakes the threads asleep on that word; each pool thread that sees the
 * generation joins the job (busy + 1), and unless the job is already closed, all workers (the
 * submitter included, as worker 0) claim task indices from one atomic counter until none are
 * left. The submitter then closes the job and waits until every thread that joined has left,
 * so the job's ctx may live on its stack; a thread that wakes after the close leaves without
 * reading the job. (Join-then-check against close-then-wait, all sequentially consistent:
 * either the submitter sees the joiner or the joiner sees the close.) A job therefore never
 * waits for a sleeping thread to wake up, only for tasks that have started.
 * Between jobs a pool thread polls the generation for the poll time (POOL_POLL_US, or
 * FLEXDIAG_POOL_POLL_US) before it sleeps on the futex word, and the submitter polls the count
 * of threads still inside the job as long before it sleeps: ops that follow each other closely
 * (a decode step's ops, CPU attention jobs) then pay no wake-up at all. One FUTEX_WAKE wakes
 * every sleeper at once; a condition variable's broadcast made each woken thread retake the
 * mutex, one after the other, each hand-off a wake-up of its own (on a 16-core virtual machine
 * the last thread joined a job about a millisecond late).
 * Dynamic claiming balances uneven tasks (attention heads with different slot counts); results
 * never depend on which worker ran a task because each task owns disjoint outputs and computes
 * them in a fixed order.
 *
 * Rejected: spawning threads per op (tens of microseconds per decode op and layer) and OpenMP
 * (a second runtime to configure, and no control over who owns the threads).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/thread_pool.h"

#include "base/core.h"

/* Upper bound on the worker count: far above any host we target, low enough to catch a
 * negative or garbage value passed as threads. */
#define POOL_MAX_THREADS 1024
/* Microseconds a waiting thread polls before it sleeps: longer than the gap between two ops of
 * a step, short enough that an idle pool gives its cores back at once. FLEXDIAG_POOL_POLL_US
 * (0 to 100000) replaces it for a process; another value makes pool_create fail naming it. */
#define POOL_POLL_US 50
#define POOL_POLL_US_MAX 100000

typedef struct pool_thread_arg {
    flexdiag_pool *s;
    int worker; /* 1..n_workers-1 */
} pool_thread_arg;

/* ---- job execution ---- */

/* Claim and run tasks of the current job until none are left. */
static void run_tasks(flexdiag_pool *s, flexdiag__pool_task_fn fn, void *ctx, int64_t n_tasks,
                      void *scratch) {
    for (;;) {
        int64_t t = atomic_fetch_add(&s->next, 1);
        if (t >= n_tasks) return;
        fn(ctx, t, scratch);
    }
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* A job after generation seen, or stop. */
static int new_job(flexdiag_pool *s, uint64_t seen) {
    return atomic_load_explicit(&s->gen, memory_order_acquire) != seen ||
           atomic_load_explicit(&s->stop, memory_order_acquire);
}

/* Every pool thread that joined the current job has left it (the argument is poll_for's,
 * unused). Sequentially consistent: this load follows the store that closes the job. */
static int job_left(flexdiag_pool *s, uint64_t unused) {
    (void)unused;
    return atomic_load(&s->busy) == 0;
}

/* Poll cond(s, arg) for up to the pool's poll time; 1 when it became true. */
static int poll_for(flexdiag_pool *s, int (*cond)(flexdiag_pool *, uint64_t), uint64_t arg) {
    double until = flexdiag__now() + s->poll_s;
    do {
        for (int i = 0; i < 64; i++) {
            if (cond(s, arg)) return 1;
            cpu_relax();
        }
    } while (flexdiag__now() < until);
    return cond(s, arg);
}

/* Sleep until the futex word moves from w (or a signal: the caller checks again). */
static void futex_wait(_Atomic uint32_t *word, uint32_t w) {
    (void)syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, w, NULL, NULL, 0);
}

/* Wake every thread sleeping on the futex word. */
static void futex_wake_all(_Atomic uint32_t *word) {
    (void)syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Sleep until a job after generation seen, or stop. The word is read before the check: a
 * submitter that bumps gen after the check has also bumped the word, so the wait returns. */
static void sleep_for_job(flexdiag_pool *s, uint64_t seen) {
    atomic_fetch_add(&s->sleepers, 1);
    for (;;) {
        uint32_t w = atomic_load(&s->wake);
        if (new_job(s, seen)) break;
        futex_wait(&s->wake, w);
    }
    atomic_fetch_sub(&s->sleepers, 1);
}

/* Tell the pool threads that gen or stop changed: bump the word, wake the sleepers if any (a
 * thread counted after this load reads the new word or the new gen before it sleeps). */
static void wake_pool(flexdiag_pool *s) {
    atomic_fetch_add(&s->wake, 1);
    if (atomic_load(&s->sleepers) > 0) futex_wake_all(&s->wake);
}

static void *pool_main(void *p) {
    pool_thread_arg arg = *(pool_thread_arg *)p;
    free(p);
    flexdiag_pool *s = arg.s;
    uint64_t seen = 0;
    for (;;) {
        if (!poll_for(s, new_job, seen)) sleep_for_job(s, seen);
        if (atomic_load_explicit(&s->stop, memory_order_acquire)) return NULL;
        seen = atomic_load(&s->gen);
        atomic_fetch_add(&s->busy, 1);
        /* the job's fields were written before gen and stay until the joined threads have left */
        if (atomic_load(&s->closed) < seen)
            run_tasks(s, s->fn, s->ctx, s->n_tasks, s->scratch[arg.worker]);
        if (atomic_fetch_sub_explicit(&s->busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&s->mu);
            pthread_cond_signal(&s->done);
            pthread_mutex_unlock(&s->mu);
        }
    }
}

/* Grow every worker's scratch to at least bytes (64-byte aligned). */
static flexdiag_status scratch_reserve(flexdiag_pool *s, size_t bytes) {
    if (bytes <= s->scratch_bytes) return FLEXDIAG_OK;
    for (int i = 0; i < s->n_workers; i++) {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) != 0)
            return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                                 "thread pool: cannot allocate %zu bytes of scratch for worker %d "
                                 "of %d: free host memory or use fewer threads",
                                 bytes, i, s->n_workers);
        free(s->scratch[i]);
        s->scratch[i] = p;
    }
    s->scratch_bytes = bytes;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__pool_scratch(flexdiag_pool *s, size_t bytes, void **out, void **tmp) {
    *out = NULL;
    *tmp = NULL;
    if (s) {
        FLEXDIAG_TRY(scratch_reserve(s, bytes));
        *out = s->scratch[0];
        return FLEXDIAG_OK;
    }
    if (posix_memalign(tmp, 64, bytes ? bytes : 64) != 0) {
        *tmp = NULL;
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "thread pool: cannot allocate %zu bytes of scratch: free host memory", bytes);
    }
    *out = *tmp;
    return FLEXDIAG_OK;
}

/* One job on the pool; the caller holds s->submit. */
static flexdiag_status pool_run(flexdiag_pool *s, int64_t n_tasks, size_t scratch_bytes,
                                flexdiag__pool_task_fn fn, void *ctx) {
    FLEXDIAG_TRY(scratch_reserve(s, scratch_bytes));
    if (s->n_workers == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, s->scratch[0]);
        return FLEXDIAG_OK;
    }
    s->fn = fn;
    s->ctx = ctx;
    s->n_tasks = n_tasks;
    atomic_store(&s->next, 0);
    const uint64_t g = atomic_fetch_add(&s->gen, 1) + 1;
    wake_pool(s);

    run_tasks(s, fn, ctx, n_tasks, s->scratch[0]);

    /* every task is claimed: close the job to late joiners, then wait for those inside (ctx
     * lives on the caller's stack) */
    atomic_store(&s->closed, g);
    if (!poll_for(s, job_left, 0)) {
        pthread_mutex_lock(&s->mu);
        while (!job_left(s, 0)) pthread_cond_wait(&s->done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__pool_parallel_for(flexdiag_pool *s, int64_t n_tasks,
                                            size_t scratch_bytes, flexdiag__pool_task_fn fn,
                                            void *ctx) {
    if (n_tasks <= 0) return FLEXDIAG_OK;
    if (!s) {
        void *scratch, *tmp;
        FLEXDIAG_TRY(flexdiag__pool_scratch(NULL, scratch_bytes, &scratch, &tmp));
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, scratch);
        free(tmp);
        return FLEXDIAG_OK;
    }
    pthread_mutex_lock(&s->submit); /* a second submitter waits instead of clobbering the job */
    flexdiag_status st = pool_run(s, n_tasks, scratch_bytes, fn, ctx);
    pthread_mutex_unlock(&s->submit);
    return st;
}

/* ---- pool lifetime ---- */

/* Cores this process may run on (affinity mask first, so taskset/cgroup limits count). */
static int online_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The poll time into *out: FLEXDIAG_POOL_POLL_US (microseconds, 0..POOL_POLL_US_MAX) when
 * set, else POOL_POLL_US; any other value is an error naming the variable. */
static flexdiag_status poll_seconds(double *out) {
    const char *env = getenv("FLEXDIAG_POOL_POLL_US");
    *out = POOL_POLL_US * 1e-6;
    if (!env || !*env) return FLEXDIAG_OK;
    char *end = NULL;
    errno = 0;
    long us = strtol(env, &end, 10);
    if (end == env || *end || errno || us < 0 || us > POOL_POLL_US_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "FLEXDIAG_POOL_POLL_US=%s: give whole microseconds, 0..%d, or unset "
                             "it (default %d)",
                             env, POOL_POLL_US_MAX, POOL_POLL_US);
    *out = (double)us * 1e-6;
    return FLEXDIAG_OK;
}

/* Stop and join the first n_started pool threads, free everything. */
static void pool_free(flexdiag_pool *s, int n_started) {
    atomic_store(&s->stop, 1);
    wake_pool(s);
    for (int i = 0; i < n_started; i++) pthread_join(s->threads[i], NULL);
    if (s->scratch)
        for (int i = 0; i < s->n_workers; i++) free(s->scratch[i]);
    free(s->scratch);
    free(s->threads);
    pthread_cond_destroy(&s->done);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->submit);
    free(s);
}

/* Start the n_workers - 1 pool threads; on failure the started ones are joined. */
static flexdiag_status pool_start(flexdiag_pool *s) {
    for (int i = 0; i + 1 < s->n_workers; i++) {
        pool_thread_arg *arg = malloc(sizeof *arg);
        int rc = arg ? 0 : ENOMEM;
        if (arg) {
            arg->s = s;
            arg->worker = i + 1;
            rc = pthread_create(&s->threads[i], NULL, pool_main, arg);
            if (rc != 0) free(arg);
        }
        if (rc != 0) {
            int want = s->n_workers;
            pool_free(s, i);
            return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                                 "thread pool: cannot start pool thread %d of %d (%s): ask for "
                                 "fewer threads",
                                 i + 1, want - 1, strerror(rc));
        }
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__pool_create(int threads, flexdiag_pool **out) {
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "thread pool: out is NULL");
    *out = NULL;
    double poll_s;
    FLEXDIAG_TRY(poll_seconds(&poll_s));
    if (threads < 0 || threads > POOL_MAX_THREADS)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "thread pool: threads = %d: give 0 (all cores) or 1..%d", threads,
                             POOL_MAX_THREADS);
    flexdiag_pool *s = calloc(1, sizeof *s);
    if (!s) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "thread pool: out of host memory");
    s->n_workers = threads ? threads : online_cores();
    if (s->n_workers > POOL_MAX_THREADS) s->n_workers = POOL_MAX_THREADS;
    pthread_mutex_init(&s->submit, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->done, NULL);
    atomic_init(&s->next, 0);
    atomic_init(&s->gen, 0);
    atomic_init(&s->closed, 0);
    atomic_init(&s->stop, 0);
    atomic_init(&s->busy, 0);
    atomic_init(&s->wake, 0);
    atomic_init(&s->sleepers, 0);
    s->poll_s = poll_s;
    s->threads = calloc((size_t)s->n_workers, sizeof *s->threads);
    s->scratch = calloc((size_t)s->n_workers, sizeof *s->scratch);
    if (!s->threads || !s->scratch) {
        pool_free(s, 0);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "thread pool: out of host memory");
    }
    FLEXDIAG_TRY(pool_start(s));
    *out = s;
    return FLEXDIAG_OK;
}

void flexdiag__pool_destroy(flexdiag_pool *s) {
    if (s) pool_free(s, s->n_workers - 1);
}

int flexdiag__pool_workers(const flexdiag_pool *s) { return s ? s->n_workers : 1; }
