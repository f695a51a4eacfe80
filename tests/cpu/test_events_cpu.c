/*
 * test_events_cpu.c - events, asynchronous copies and host registration of both CPU tables
 * (kernels.h event_*, stream_wait_event, copy_*_async, host_register / host_unregister).
 *
 * Events: an event never recorded is complete; record, query, sync and stream_wait_event on a
 * CPU stream and on the NULL stream; argument errors. The completion object itself (cpu_event.c)
 * is driven through its internal mark / reach steps, the way a CPU stream that queues its work
 * on a worker thread would: a second thread blocked in event_sync (or stream_wait_event) on a
 * pending record stays blocked, then is released by a record of the main thread or by the queue
 * reaching the pending record; a wait concerns the most recent record. Copies: h2d_async ->
 * d2d -> d2h_async round trips bytes exactly (odd sizes, zero bytes), overlapping and NULL
 * ranges are refused. host_register / host_unregister are no-ops that check their arguments.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "base/core.h"
#include "kernels/cpu/cpu_stream.h"
#include "kernels/kernels.h"
#include "util.h"

/* How long a thread must stay blocked to count as waiting (a missed wake-up would show as an
 * early return), in milliseconds. */
#define BLOCK_MS 100

static const flexdiag_kernels *tables[2]; /* cpu-ref, cpu */

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) continue;
}

static void ok(flexdiag_status st) {
    if (st != FLEXDIAG_OK) fail_msg("%s: %s", flexdiag_status_str(st), flexdiag__err_msg());
}

/* ---- the table slots ---- */

static void test_slots(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        assert_non_null(k->event_create);
        assert_non_null(k->event_destroy);
        assert_non_null(k->event_record);
        assert_non_null(k->stream_wait_event);
        assert_non_null(k->event_sync);
        assert_non_null(k->event_query);
        assert_non_null(k->copy_h2d_async);
        assert_non_null(k->copy_d2h_async);
        assert_non_null(k->host_register);
        assert_non_null(k->host_unregister);
    }
}

/* ---- record / query / sync ---- */

static void record_sync_query(const flexdiag_kernels *k, flexdiag_stream *s) {
    flexdiag_event *e = NULL;
    ok(k->event_create(s, &e));
    assert_non_null(e);
    int done = -1;
    ok(k->event_query(e, &done));
    assert_int_equal(done, 1); /* never recorded: an empty set of work */
    ok(k->event_sync(e));
    ok(k->stream_wait_event(s, e));
    for (int i = 0; i < 3; i++) {
        ok(k->memset0(NULL, 0, s));
        ok(k->event_record(e, s));
        done = -1;
        ok(k->event_query(e, &done));
        assert_int_equal(done, 1); /* a synchronous stream: complete when recorded */
        ok(k->event_sync(e));
        ok(k->stream_wait_event(s, e));
    }
    assert_int_equal(k->event_record(NULL, s), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    assert_int_equal(k->event_query(e, NULL), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    assert_int_equal(k->event_query(NULL, &done), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    assert_int_equal(k->event_sync(NULL), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    assert_int_equal(k->stream_wait_event(s, NULL), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    assert_int_equal(k->event_create(s, NULL), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    k->event_destroy(e);
    k->event_destroy(NULL);
}

static void test_record_sync_query(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        flexdiag_stream *s = NULL;
        ok(k->stream_create(-1, 2, &s));
        record_sync_query(k, s);
        record_sync_query(k, NULL);
        k->stream_destroy(s);
    }
}

/* ---- a second thread blocked on a pending record ---- */

typedef struct waiter {
    const flexdiag_kernels *k; /* table under test */
    flexdiag_stream *s;        /* stream for stream_wait_event */
    flexdiag_event *e;         /* event waited on */
    int use_stream_wait;       /* 1: stream_wait_event, 0: event_sync */
    flexdiag_status st;        /* what the wait returned */
    atomic_int returned;       /* set once the wait has returned */
} waiter;

static void *waiter_main(void *arg) {
    waiter *w = arg;
    w->st = w->use_stream_wait ? w->k->stream_wait_event(w->s, w->e) : w->k->event_sync(w->e);
    atomic_store(&w->returned, 1);
    return NULL;
}

/* Start a thread waiting on e, which must hold a pending record; check it stays blocked. */
static void waiter_start(waiter *w, pthread_t *th) {
    atomic_init(&w->returned, 0);
    w->st = FLEXDIAG_ERR_INTERNAL;
    assert_int_equal(pthread_create(th, NULL, waiter_main, w), 0);
    sleep_ms(BLOCK_MS);
    assert_int_equal(atomic_load(&w->returned), 0);
    int done = -1;
    ok(w->k->event_query(w->e, &done));
    assert_int_equal(done, 0);
}

/* Join the waiter and check it returned OK. */
static void waiter_join(waiter *w, pthread_t th) {
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(atomic_load(&w->returned), 1);
    ok(w->st);
    int done = -1;
    ok(w->k->event_query(w->e, &done));
    assert_int_equal(done, 1);
}

/* event_sync (then stream_wait_event) blocked on a pending record, released by a record of the
 * main thread: on an in-order queue a later record completing means the earlier one did. */
static void test_sync_released_by_record(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++)
        for (int use_stream_wait = 0; use_stream_wait < 2; use_stream_wait++) {
            const flexdiag_kernels *k = tables[t];
            flexdiag_stream *s = NULL;
            ok(k->stream_create(-1, 1, &s));
            waiter w = {.k = k, .s = s, .use_stream_wait = use_stream_wait};
            ok(k->event_create(s, &w.e));
            (void)flexdiag__cpu_event_mark(w.e); /* a record still queued */
            pthread_t th;
            waiter_start(&w, &th);
            ok(k->event_record(w.e, s));
            waiter_join(&w, th);
            k->event_destroy(w.e);
            k->stream_destroy(s);
        }
}

/* The same waits released by the queue reaching the pending record itself. */
static void test_sync_released_by_reach(void **state) {
    (void)state;
    for (int use_stream_wait = 0; use_stream_wait < 2; use_stream_wait++) {
        const flexdiag_kernels *k = tables[1];
        waiter w = {.k = k, .s = NULL, .use_stream_wait = use_stream_wait};
        ok(k->event_create(NULL, &w.e));
        ok(k->event_record(w.e, NULL)); /* an earlier, complete record */
        const uint64_t gen = flexdiag__cpu_event_mark(w.e);
        assert_int_equal(gen, 2);
        pthread_t th;
        waiter_start(&w, &th);
        flexdiag__cpu_event_reach(w.e, gen);
        waiter_join(&w, th);
        k->event_destroy(w.e);
    }
}

/* Waits and queries concern the most recent record: reaching an older one is not enough. */
static void test_most_recent_record(void **state) {
    (void)state;
    const flexdiag_kernels *k = tables[0];
    waiter w = {.k = k, .s = NULL, .use_stream_wait = 0};
    ok(k->event_create(NULL, &w.e));
    const uint64_t g1 = flexdiag__cpu_event_mark(w.e), g2 = flexdiag__cpu_event_mark(w.e);
    assert_true(g2 > g1);
    pthread_t th;
    waiter_start(&w, &th);
    flexdiag__cpu_event_reach(w.e, g1);
    sleep_ms(BLOCK_MS);
    assert_int_equal(atomic_load(&w.returned), 0); /* g2 still pending */
    int done = -1;
    ok(k->event_query(w.e, &done));
    assert_int_equal(done, 0);
    flexdiag__cpu_event_reach(w.e, g2);
    waiter_join(&w, th);
    k->event_destroy(w.e);
}

/* ---- asynchronous copies ---- */

static void test_copy_async(void **state) {
    (void)state;
    static const size_t sizes[] = {1, 63, 4096, (1u << 20) + 13};
    tu_rng rng;
    tu_rng_seed(&rng, 7);
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        flexdiag_stream *s = NULL;
        ok(k->stream_create(-1, 2, &s));
        flexdiag_event *e = NULL;
        ok(k->event_create(s, &e));
        for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
            const size_t n = sizes[c];
            uint8_t *src = malloc(n), *dst = malloc(n);
            assert_non_null(src);
            assert_non_null(dst);
            for (size_t i = 0; i < n; i++) src[i] = (uint8_t)tu_rng_u64(&rng);
            memset(dst, 0xA5, n);
            void *x = NULL, *y = NULL;
            ok(k->mem_alloc(n, &x));
            ok(k->mem_alloc(n, &y));
            ok(k->copy_h2d_async(x, src, n, s));
            ok(k->copy_d2d(y, x, n, s));
            ok(k->copy_d2h_async(dst, y, n, s));
            ok(k->event_record(e, s));
            ok(k->event_sync(e));
            assert_memory_equal(dst, src, n);
            ok(k->copy_h2d_async(NULL, NULL, 0, s)); /* zero bytes: nothing to do */
            ok(k->copy_d2h_async(NULL, NULL, 0, s));
            if (n > 1) {
                assert_int_equal(k->copy_h2d_async((uint8_t *)x + 1, x, n - 1, s),
                                 FLEXDIAG_ERR_INVALID_ARG);
                flexdiag__err_clear();
                assert_int_equal(k->copy_d2h_async(x, (uint8_t *)x + 1, n - 1, s),
                                 FLEXDIAG_ERR_INVALID_ARG);
                flexdiag__err_clear();
            }
            assert_int_equal(k->copy_d2h_async(NULL, y, n, s), FLEXDIAG_ERR_INVALID_ARG);
            flexdiag__err_clear();
            k->mem_free(x);
            k->mem_free(y);
            free(src);
            free(dst);
        }
        k->event_destroy(e);
        k->stream_destroy(s);
    }
}

/* ---- host registration ---- */

static void test_host_register(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        const size_t n = 3u << 20;
        uint8_t *host = malloc(n), *back = malloc(n);
        assert_non_null(host);
        assert_non_null(back);
        for (size_t i = 0; i < n; i++) host[i] = (uint8_t)(i * 131u + 7u);
        ok(k->host_register(host, n));
        ok(k->host_register(back, n));
        void *x = NULL;
        ok(k->mem_alloc(n, &x));
        ok(k->copy_h2d_async(x, host, n, NULL));
        ok(k->copy_d2h_async(back, x, n, NULL));
        ok(k->stream_sync(NULL));
        assert_memory_equal(back, host, n);
        ok(k->host_unregister(host));
        ok(k->host_unregister(back));
        ok(k->host_register(NULL, 0));
        ok(k->host_unregister(NULL));
        assert_int_equal(k->host_register(NULL, 16), FLEXDIAG_ERR_INVALID_ARG);
        flexdiag__err_clear();
        k->mem_free(x);
        free(host);
        free(back);
    }
}

int main(void) {
    tables[0] = flexdiag__kernels_cpu_ref();
    tables[1] = flexdiag__kernels_cpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_record_sync_query),
        cmocka_unit_test(test_sync_released_by_record),
        cmocka_unit_test(test_sync_released_by_reach),
        cmocka_unit_test(test_most_recent_record),
        cmocka_unit_test(test_copy_async),
        cmocka_unit_test(test_host_register),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
