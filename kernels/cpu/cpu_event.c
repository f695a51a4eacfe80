/*
 * cpu_event.c - events of the CPU backends (kernels.h event_*, stream_wait_event): a
 * completion object per event, a generation counter under a mutex and a condition variable
 * (cpu_stream.h says how records, waits and the generations fit together).
 *
 * On an ordinary CPU stream, which is synchronous, a record completes at once and a wait is a
 * host wait. On a copy queue (cpu_queue.c) a record marks when it is queued and reaches when the
 * worker gets there, and a wait is queued with the generation it waits for. Queued items hold a
 * reference to their event, so event_destroy may come before the queue gets to them (as
 * cudaEventDestroy may); the last reference frees the event.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_stream.h"

struct flexdiag_event {
    pthread_mutex_t mu; /* guards marked and reached */
    pthread_cond_t cv;  /* broadcast whenever reached grows */
    uint64_t marked;    /* generation of the most recent record (0: never recorded) */
    uint64_t reached;   /* every generation <= reached is complete (generations) */
    int refs;           /* the creator's reference + one per queued item naming the event */
};

flexdiag_status flexdiag__cpu_event_create(flexdiag_stream *s, flexdiag_event **out) {
    (void)s; /* one host: the event needs nothing from the stream */
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu event_create: out is NULL");
    *out = NULL;
    flexdiag_event *e = calloc(1, sizeof *e);
    if (!e) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cpu event_create: out of host memory");
    int rc = pthread_mutex_init(&e->mu, NULL);
    if (rc) {
        free(e);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cpu event_create: pthread_mutex_init: %s",
                             strerror(rc));
    }
    rc = pthread_cond_init(&e->cv, NULL);
    if (rc) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cpu event_create: pthread_cond_init: %s",
                             strerror(rc));
    }
    e->refs = 1;
    *out = e;
    return FLEXDIAG_OK;
}

void flexdiag__cpu_event_hold(flexdiag_event *e) {
    pthread_mutex_lock(&e->mu);
    e->refs++;
    pthread_mutex_unlock(&e->mu);
}

void flexdiag__cpu_event_release(flexdiag_event *e) {
    pthread_mutex_lock(&e->mu);
    const int left = --e->refs;
    pthread_mutex_unlock(&e->mu);
    if (left) return;
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void flexdiag__cpu_event_destroy(flexdiag_event *e) {
    if (e) flexdiag__cpu_event_release(e);
}

uint64_t flexdiag__cpu_event_mark(flexdiag_event *e) {
    pthread_mutex_lock(&e->mu);
    const uint64_t gen = ++e->marked;
    pthread_mutex_unlock(&e->mu);
    return gen;
}

uint64_t flexdiag__cpu_event_marked(flexdiag_event *e) {
    pthread_mutex_lock(&e->mu);
    const uint64_t gen = e->marked;
    pthread_mutex_unlock(&e->mu);
    return gen;
}

void flexdiag__cpu_event_reach(flexdiag_event *e, uint64_t gen) {
    pthread_mutex_lock(&e->mu);
    FLEXDIAG_DASSERT(gen <= e->marked);
    if (gen > e->reached) {
        e->reached = gen;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
}

int flexdiag__cpu_event_wait(flexdiag_event *e, uint64_t gen) {
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    while (!rc && e->reached < gen) rc = pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

flexdiag_status flexdiag__cpu_event_record(flexdiag_event *e, flexdiag_stream *s) {
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu event_record: event is NULL");
    if (s && s->queue) return flexdiag__cpu_queue_record(s->queue, e);
    /* synchronous: everything queued on s before this call has finished */
    flexdiag__cpu_event_reach(e, flexdiag__cpu_event_mark(e));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_event_sync(flexdiag_event *e) {
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu event_sync: event is NULL");
    /* the most recent record at the time of the call */
    const int rc = flexdiag__cpu_event_wait(e, flexdiag__cpu_event_marked(e));
    if (rc)
        return flexdiag__err(FLEXDIAG_ERR_INTERNAL, "cpu event_sync: pthread_cond_wait: %s",
                             strerror(rc));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_stream_wait_event(flexdiag_stream *s, flexdiag_event *e) {
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu stream_wait_event: event is NULL");
    if (s && s->queue) return flexdiag__cpu_queue_wait(s->queue, e);
    /* nothing queued on a synchronous stream to hold back: the caller waits */
    return flexdiag__cpu_event_sync(e);
}

flexdiag_status flexdiag__cpu_event_query(flexdiag_event *e, int *done) {
    if (!e || !done)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu event_query: %s is NULL",
                             e ? "done" : "event");
    pthread_mutex_lock(&e->mu);
    *done = e->reached >= e->marked;
    pthread_mutex_unlock(&e->mu);
    return FLEXDIAG_OK;
}
