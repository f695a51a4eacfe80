/*
 * cpu_event.c - events of the CPU backends (kernels.h event_*, stream_wait_event): a
 * completion object per event, a generation counter under a mutex and a condition variable
 * (cpu_stream.h says how records, waits and the generations fit together).
 *
 * CPU streams are synchronous, so a record completes at once and a wait on such a stream is a
 * host wait; the object is a real one all the same, so waits stay right once a CPU stream runs
 * its work on a worker thread (it then marks at enqueue and reaches when the worker gets there).
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
    *out = e;
    return FLEXDIAG_OK;
}

void flexdiag__cpu_event_destroy(flexdiag_event *e) {
    if (!e) return;
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

uint64_t flexdiag__cpu_event_mark(flexdiag_event *e) {
    pthread_mutex_lock(&e->mu);
    const uint64_t gen = ++e->marked;
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

flexdiag_status flexdiag__cpu_event_record(flexdiag_event *e, flexdiag_stream *s) {
    (void)s; /* synchronous: everything queued on s before this call has finished */
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu event_record: event is NULL");
    flexdiag__cpu_event_reach(e, flexdiag__cpu_event_mark(e));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_event_sync(flexdiag_event *e) {
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu event_sync: event is NULL");
    pthread_mutex_lock(&e->mu);
    const uint64_t target = e->marked; /* the most recent record at the time of the call */
    int rc = 0;
    while (!rc && e->reached < target) rc = pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (rc)
        return flexdiag__err(FLEXDIAG_ERR_INTERNAL, "cpu event_sync: pthread_cond_wait: %s",
                             strerror(rc));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_stream_wait_event(flexdiag_stream *s, flexdiag_event *e) {
    (void)s; /* nothing queued on a synchronous stream to hold back: the caller waits */
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cpu stream_wait_event: event is NULL");
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
