/*
 * cpu_queue.c - the copy queue of the CPU backends (kernels.h copy_stream_create; cpu_stream.h
 * says what runs on it): a ring of FLEXDIAG_CPU_QUEUE_ITEMS items allocated at creation and one
 * worker thread that runs them in order.
 *
 * The enqueuing host thread and the worker share the ring under one mutex: not_empty wakes the
 * worker, not_full an enqueuer blocked on a full ring, idle the threads waiting for a drain
 * (stream_sync, copy_d2h). The worker takes the oldest item out of the ring (freeing its slot)
 * and runs it without the lock; busy says it is running one. A record marks its event under the
 * ring's lock once the item has its slot, so no mark is ever left without the item that
 * reaches it (lock order: ring, then event). Items naming an event hold a reference to it
 * (cpu_event.c), so the event may be destroyed while they are queued.
 *
 * The only way the worker can fail is a pthread error while it waits on an event. It then stops
 * moving data but keeps draining the ring and reaching every record, so no waiter on another
 * stream hangs, and every later enqueue, stream_sync and copy_d2h returns the error.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "kernels/cpu/cpu_stream.h"

/* Largest FLEXDIAG_COPY_DELAY_US accepted: one second per copy. */
#define DELAY_US_MAX 1000000L

typedef enum item_kind { ITEM_COPY, ITEM_ZERO, ITEM_SLOTS, ITEM_FN, ITEM_RECORD, ITEM_WAIT } item_kind;

typedef struct queue_item {
    item_kind kind;
    void *dst;         /* COPY, ZERO */
    const void *src;   /* COPY */
    size_t bytes;      /* COPY (bytes of each row), ZERO */
    size_t rows;       /* COPY: rows of bytes each (1: a plain copy) */
    size_t dpitch, spitch; /* COPY: bytes from one row to the next in dst and src */
    flexdiag_event *e; /* RECORD, WAIT: held while queued */
    uint64_t gen;      /* RECORD: the generation it reaches; WAIT: the one it waits for */
    flexdiag_slot_rows slots; /* SLOTS: the rows to copy */
    flexdiag_host_fn *fn;     /* FN: called with dst as its argument */
} queue_item;

struct flexdiag__cpu_queue {
    pthread_mutex_t mu;       /* guards the ring and every field below but worker, delay_us */
    pthread_cond_t not_empty; /* the worker waits: an item was queued or stop was set */
    pthread_cond_t not_full;  /* enqueuers wait: a slot was freed */
    pthread_cond_t idle;      /* drain waiters: the ring is empty and the worker idle */
    queue_item *ring;         /* FLEXDIAG_CPU_QUEUE_ITEMS slots */
    size_t head;              /* slot of the oldest queued item */
    size_t count;             /* items queued */
    int busy;                 /* the worker is running an item (outside the lock) */
    int stop;                 /* destroy: the worker exits once the ring is empty */
    int failed;               /* the worker's first pthread error (0: none) */
    long delay_us;            /* FLEXDIAG_COPY_DELAY_US: sleep before each copy, memset0 and
                                 host function */
    pthread_t worker;
};

/* ---- the worker ---- */

static void sleep_us(long us) {
    struct timespec t = {us / 1000000, us % 1000000 * 1000};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) continue;
}

/* Run one item; 0 or a pthread error. After a failure only records run (they must reach). */
static int run_item(const flexdiag__cpu_queue *q, const queue_item *it, int failed) {
    if (it->kind == ITEM_RECORD) {
        flexdiag__cpu_event_reach(it->e, it->gen);
        return 0;
    }
    if (failed) return 0;
    if (it->kind == ITEM_WAIT) return flexdiag__cpu_event_wait(it->e, it->gen);
    if (q->delay_us) sleep_us(q->delay_us);
    if (it->kind == ITEM_FN) {
        it->fn(it->dst);
        return 0;
    }
    if (it->kind == ITEM_COPY)
        for (size_t r = 0; r < it->rows; r++)
            memcpy((char *)it->dst + r * it->dpitch, (const char *)it->src + r * it->spitch,
                   it->bytes);
    else if (it->kind == ITEM_SLOTS)
        flexdiag__cpu_slot_rows_run(&it->slots);
    else
        memset(it->dst, 0, it->bytes);
    return 0;
}

static void *worker_main(void *arg) {
    flexdiag__cpu_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->count && !q->stop) pthread_cond_wait(&q->not_empty, &q->mu);
        if (!q->count) break; /* stopped and drained */
        const queue_item it = q->ring[q->head];
        const int failed = q->failed;
        q->head = (q->head + 1) % FLEXDIAG_CPU_QUEUE_ITEMS;
        q->count--;
        q->busy = 1;
        pthread_cond_signal(&q->not_full);
        pthread_mutex_unlock(&q->mu);

        const int rc = run_item(q, &it, failed);
        if (it.e) flexdiag__cpu_event_release(it.e);

        pthread_mutex_lock(&q->mu);
        if (rc && !q->failed) q->failed = rc;
        q->busy = 0;
        if (!q->count) pthread_cond_broadcast(&q->idle);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ---- enqueue and drain ---- */

/* The error of a queue whose worker failed, for the call named what. */
static flexdiag_status failed_err(int failed, const char *what) {
    return flexdiag__err(FLEXDIAG_ERR_INTERNAL,
                         "cpu copy queue: %s: the queue's worker failed waiting on an event "
                         "(%s); it no longer copies",
                         what, strerror(failed));
}

/* Put it into q's ring, blocking while the ring is full; a record takes its generation here. */
static flexdiag_status push(flexdiag__cpu_queue *q, queue_item it, const char *what) {
    pthread_mutex_lock(&q->mu);
    while (!q->failed && q->count == FLEXDIAG_CPU_QUEUE_ITEMS)
        pthread_cond_wait(&q->not_full, &q->mu);
    const int failed = q->failed;
    if (!failed) {
        if (it.e) flexdiag__cpu_event_hold(it.e);
        if (it.kind == ITEM_RECORD) it.gen = flexdiag__cpu_event_mark(it.e);
        q->ring[(q->head + q->count) % FLEXDIAG_CPU_QUEUE_ITEMS] = it;
        q->count++;
        pthread_cond_signal(&q->not_empty);
    }
    pthread_mutex_unlock(&q->mu);
    return failed ? failed_err(failed, what) : FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_queue_copy(flexdiag__cpu_queue *q, void *dst, const void *src,
                                         size_t bytes) {
    return flexdiag__cpu_queue_copy_2d(q, dst, bytes, src, bytes, bytes, 1);
}

flexdiag_status flexdiag__cpu_queue_copy_2d(flexdiag__cpu_queue *q, void *dst, size_t dpitch,
                                            const void *src, size_t spitch, size_t width,
                                            size_t rows) {
    FLEXDIAG_DASSERT(dst && src && width && rows);
    return push(q, (queue_item){.kind = ITEM_COPY, .dst = dst, .src = src, .bytes = width,
                                .rows = rows, .dpitch = dpitch, .spitch = spitch},
                "copy");
}

flexdiag_status flexdiag__cpu_queue_zero(flexdiag__cpu_queue *q, void *dst, size_t bytes) {
    FLEXDIAG_DASSERT(dst && bytes);
    return push(q, (queue_item){.kind = ITEM_ZERO, .dst = dst, .bytes = bytes}, "memset0");
}

flexdiag_status flexdiag__cpu_queue_slots(flexdiag__cpu_queue *q, const flexdiag_slot_rows *r) {
    FLEXDIAG_DASSERT(r->dst && r->src && r->slots && r->n_slots);
    return push(q, (queue_item){.kind = ITEM_SLOTS, .slots = *r}, "copy_h2d_slots");
}

flexdiag_status flexdiag__cpu_queue_fn(flexdiag__cpu_queue *q, flexdiag_host_fn *fn, void *arg) {
    FLEXDIAG_DASSERT(fn);
    return push(q, (queue_item){.kind = ITEM_FN, .fn = fn, .dst = arg}, "host_fn");
}

flexdiag_status flexdiag__cpu_queue_record(flexdiag__cpu_queue *q, flexdiag_event *e) {
    return push(q, (queue_item){.kind = ITEM_RECORD, .e = e}, "event_record");
}

flexdiag_status flexdiag__cpu_queue_wait(flexdiag__cpu_queue *q, flexdiag_event *e) {
    const uint64_t gen = flexdiag__cpu_event_marked(e); /* the most recent record now */
    if (gen == 0) return FLEXDIAG_OK;                   /* never recorded: complete */
    return push(q, (queue_item){.kind = ITEM_WAIT, .e = e, .gen = gen}, "stream_wait_event");
}

flexdiag_status flexdiag__cpu_queue_sync(flexdiag__cpu_queue *q) {
    pthread_mutex_lock(&q->mu);
    while (q->count || q->busy) pthread_cond_wait(&q->idle, &q->mu);
    const int failed = q->failed;
    pthread_mutex_unlock(&q->mu);
    return failed ? failed_err(failed, "stream_sync") : FLEXDIAG_OK;
}

/* ---- lifetime ---- */

/* Free q, whose worker is not running. */
static void queue_free(flexdiag__cpu_queue *q) {
    pthread_cond_destroy(&q->idle);
    pthread_cond_destroy(&q->not_full);
    pthread_cond_destroy(&q->not_empty);
    pthread_mutex_destroy(&q->mu);
    free(q->ring);
    free(q);
}

void flexdiag__cpu_queue_destroy(flexdiag__cpu_queue *q) {
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->worker, NULL); /* the worker drains the ring first */
    if (q->failed)
        FLEXDIAG_WARN("cpu copy queue: destroyed after its worker failed waiting on an event "
                      "(%s): copies queued after that were skipped",
                      strerror(q->failed));
    queue_free(q);
}

/* A queue sleeping delay_us before each copy, its worker started. */
static flexdiag_status queue_create(long delay_us, flexdiag__cpu_queue **out) {
    flexdiag__cpu_queue *q = calloc(1, sizeof *q);
    queue_item *ring = calloc(FLEXDIAG_CPU_QUEUE_ITEMS, sizeof *ring);
    if (!q || !ring) {
        free(q);
        free(ring);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cpu copy_stream_create: out of host memory");
    }
    q->ring = ring;
    q->delay_us = delay_us;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
    pthread_cond_init(&q->idle, NULL);
    const int rc = pthread_create(&q->worker, NULL, worker_main, q);
    if (rc) {
        queue_free(q);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "cpu copy_stream_create: cannot start the worker thread: %s",
                             strerror(rc));
    }
    *out = q;
    return FLEXDIAG_OK;
}

/* FLEXDIAG_COPY_DELAY_US (the test hook of cpu_stream.h) into *us; 0 when unset. */
static flexdiag_status read_delay(long *us) {
    *us = 0;
    const char *v = getenv("FLEXDIAG_COPY_DELAY_US");
    if (!v || !*v) return FLEXDIAG_OK;
    char *end = NULL;
    errno = 0;
    const long n = strtol(v, &end, 10);
    if (errno || *end || n < 0 || n > DELAY_US_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cpu copy_stream_create: FLEXDIAG_COPY_DELAY_US=\"%s\": give "
                             "microseconds in 0..%ld, or unset it (a test hook)",
                             v, DELAY_US_MAX);
    *us = n;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_copy_stream_create(int device, flexdiag_stream **out) {
    (void)device; /* one host: the CPU backend has no device ordinal */
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu copy_stream_create: out is NULL");
    *out = NULL;
    long delay_us = 0;
    FLEXDIAG_TRY(read_delay(&delay_us));
    flexdiag_stream *s = calloc(1, sizeof *s);
    if (!s)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cpu copy_stream_create: out of host memory");
    const flexdiag_status st = queue_create(delay_us, &s->queue);
    if (st != FLEXDIAG_OK) {
        free(s);
        return st;
    }
    *out = s;
    return FLEXDIAG_OK;
}
