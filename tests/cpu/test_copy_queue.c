/*
 * test_copy_queue.c - the copy queue of both CPU tables (kernels.h copy_stream_create;
 * kernels/cpu/cpu_queue.c): one worker thread running copies, memset0, event records and event
 * waits in order, with FLEXDIAG_COPY_DELAY_US slowing every copy down so that a missing
 * dependency reads stale data instead of winning a race.
 *
 *   - slots: copy_stream_create in both tables, pci_bus_id NULL (no device on a bus).
 *   - ordering: more copies of distinct patterns into one buffer than the ring holds (the
 *     enqueuer blocks on a full ring), then memset0 of half of it; after a record and
 *     event_sync the buffer holds the last writes.
 *   - asynchrony and cross-stream: a queue held back by a wait on a pending record copies
 *     nothing and its record stays pending; once released, an ordinary (compute) stream that
 *     waits on the record sees the copied data.
 *   - a chain of two copy queues: the consumer waits on the producer's record before copying
 *     the producer's output, over rounds of new data.
 *   - stream_sync and copy_d2h drain the queue; stream_destroy with queued work drains it
 *     (even with an event destroyed while its record is still queued).
 *   - strided copies (copy_h2d_2d_async / copy_d2h_2d_async) on a queue and on an ordinary
 *     stream move exactly the rows and bytes asked for, and refuse a pitch below the width.
 *   - bad arguments fail at the enqueuing call with INVALID_ARG, and a bad
 *     FLEXDIAG_COPY_DELAY_US fails copy_stream_create.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "kernels/cpu/cpu_stream.h"
#include "kernels/kernels.h"

static const flexdiag_kernels *tables[2]; /* cpu-ref, cpu */

static void ok(flexdiag_status st) {
    if (st != FLEXDIAG_OK) fail_msg("%s: %s", flexdiag_status_str(st), flexdiag__err_msg());
}

/* A copy queue whose worker sleeps delay_us before each copy (FLEXDIAG_COPY_DELAY_US). */
static flexdiag_stream *queue_new(const flexdiag_kernels *k, const char *delay_us) {
    assert_int_equal(setenv("FLEXDIAG_COPY_DELAY_US", delay_us, 1), 0);
    flexdiag_stream *q = NULL;
    ok(k->copy_stream_create(0, &q));
    assert_int_equal(unsetenv("FLEXDIAG_COPY_DELAY_US"), 0);
    assert_non_null(q);
    return q;
}

/* n bytes of pattern p: every byte differs between patterns and along the buffer. */
static void fill(uint8_t *x, size_t n, unsigned p) {
    for (size_t i = 0; i < n; i++) x[i] = (uint8_t)(p * 31u + i * 7u + 1u);
}

/* A held-back queue: q waits on a record of gate that nothing has reached yet; returns the
 * generation to reach (flexdiag__cpu_event_reach) to release it. */
static uint64_t hold(const flexdiag_kernels *k, flexdiag_stream *q, flexdiag_event *gate) {
    const uint64_t gen = flexdiag__cpu_event_mark(gate);
    ok(k->stream_wait_event(q, gate));
    return gen;
}

static void test_slots(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        assert_non_null(tables[t]->copy_stream_create);
        assert_null(tables[t]->pci_bus_id);
    }
}

/* ---- ordering ---- */

#define ORDER_BYTES 4096
#define ORDER_COPIES (FLEXDIAG_CPU_QUEUE_ITEMS + 100)
#define ORDER_PATTERNS 8

static void test_ordering(void **state) {
    (void)state;
    const flexdiag_kernels *k = tables[1];
    flexdiag_stream *q = queue_new(k, "20");
    flexdiag_event *e = NULL;
    ok(k->event_create(q, &e));
    uint8_t *src[ORDER_PATTERNS], want[ORDER_BYTES];
    for (unsigned p = 0; p < ORDER_PATTERNS; p++) {
        src[p] = malloc(ORDER_BYTES);
        assert_non_null(src[p]);
        fill(src[p], ORDER_BYTES, p);
    }
    void *x = NULL;
    ok(k->mem_alloc(ORDER_BYTES, &x));
    for (int i = 0; i < ORDER_COPIES; i++)
        ok(k->copy_h2d_async(x, src[i % ORDER_PATTERNS], ORDER_BYTES, q));
    ok(k->memset0(x, ORDER_BYTES / 2, q));
    ok(k->event_record(e, q));
    ok(k->event_sync(e));
    memset(want, 0, ORDER_BYTES / 2);
    memcpy(want + ORDER_BYTES / 2, src[(ORDER_COPIES - 1) % ORDER_PATTERNS] + ORDER_BYTES / 2,
           ORDER_BYTES / 2);
    assert_memory_equal(x, want, ORDER_BYTES);
    k->mem_free(x);
    for (unsigned p = 0; p < ORDER_PATTERNS; p++) free(src[p]);
    k->event_destroy(e);
    k->stream_destroy(q);
}

/* ---- a compute stream waits on the copy queue ---- */

#define CROSS_BYTES ((size_t)1 << 16)

static void test_cross_stream(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        flexdiag_stream *q = queue_new(k, "5000"), *c = NULL;
        ok(k->stream_create(-1, 1, &c));
        flexdiag_event *gate = NULL, *e = NULL;
        ok(k->event_create(q, &gate));
        ok(k->event_create(q, &e));
        uint8_t *src = malloc(CROSS_BYTES), *out = malloc(CROSS_BYTES);
        assert_non_null(src);
        assert_non_null(out);
        fill(src, CROSS_BYTES, 3);
        void *x = NULL;
        ok(k->mem_alloc(CROSS_BYTES, &x));
        ok(k->memset0(x, CROSS_BYTES, c));

        const uint64_t gen = hold(k, q, gate);
        ok(k->copy_h2d_async(x, src, CROSS_BYTES, q));
        ok(k->event_record(e, q));
        int done = -1;
        ok(k->event_query(e, &done));
        assert_int_equal(done, 0); /* the queue is held back: nothing ran */
        assert_int_equal(((uint8_t *)x)[0], 0);

        flexdiag__cpu_event_reach(gate, gen);
        ok(k->stream_wait_event(c, e)); /* an ordinary stream: the host waits */
        ok(k->copy_d2h(out, x, CROSS_BYTES, c));
        assert_memory_equal(out, src, CROSS_BYTES);
        ok(k->event_query(e, &done));
        assert_int_equal(done, 1);

        k->mem_free(x);
        free(src);
        free(out);
        k->event_destroy(e);
        k->event_destroy(gate);
        k->stream_destroy(c);
        k->stream_destroy(q);
    }
}

/* ---- producer and consumer queues ---- */

#define CHAIN_BYTES ((size_t)1 << 15)
#define CHAIN_ROUNDS 12

static void test_chain(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        flexdiag_stream *prod = queue_new(k, "1000"), *cons = queue_new(k, "1000");
        flexdiag_event *produced = NULL, *consumed = NULL;
        ok(k->event_create(prod, &produced));
        ok(k->event_create(cons, &consumed));
        uint8_t *src = malloc(CHAIN_BYTES), *out = malloc(CHAIN_BYTES);
        assert_non_null(src);
        assert_non_null(out);
        void *mid = NULL;
        ok(k->mem_alloc(CHAIN_BYTES, &mid));
        for (unsigned r = 0; r < CHAIN_ROUNDS; r++) {
            fill(src, CHAIN_BYTES, r);
            /* two delayed items on the producer, one on the consumer: without the wait the
             * consumer copies while mid is still zero */
            ok(k->memset0(mid, CHAIN_BYTES, prod));
            ok(k->copy_h2d_async(mid, src, CHAIN_BYTES, prod));
            ok(k->event_record(produced, prod));
            ok(k->stream_wait_event(cons, produced));
            ok(k->copy_d2h_async(out, mid, CHAIN_BYTES, cons));
            ok(k->event_record(consumed, cons));
            ok(k->event_sync(consumed));
            assert_memory_equal(out, src, CHAIN_BYTES);
        }
        k->mem_free(mid);
        free(src);
        free(out);
        k->event_destroy(produced);
        k->event_destroy(consumed);
        k->stream_destroy(cons);
        k->stream_destroy(prod);
    }
}

/* ---- draining: stream_sync, copy_d2h, stream_destroy ---- */

#define DRAIN_BUFS 16
#define DRAIN_BYTES 1024

static void test_sync_drains(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        flexdiag_stream *q = queue_new(k, "1000");
        static uint8_t src[DRAIN_BUFS][DRAIN_BYTES], dst[DRAIN_BUFS][DRAIN_BYTES];
        for (unsigned i = 0; i < DRAIN_BUFS; i++) {
            fill(src[i], DRAIN_BYTES, i);
            memset(dst[i], 0, DRAIN_BYTES);
            ok(k->copy_h2d_async(dst[i], src[i], DRAIN_BYTES, q));
        }
        ok(k->stream_sync(q));
        for (unsigned i = 0; i < DRAIN_BUFS; i++) assert_memory_equal(dst[i], src[i], DRAIN_BYTES);

        /* copy_d2h synchronises: its data and everything queued before it are there */
        for (unsigned i = 0; i < DRAIN_BUFS; i++) ok(k->memset0(dst[i], DRAIN_BYTES, q));
        uint8_t back[DRAIN_BYTES];
        ok(k->copy_d2h(back, src[1], DRAIN_BYTES, q));
        assert_memory_equal(back, src[1], DRAIN_BYTES);
        static const uint8_t zero[DRAIN_BYTES];
        for (unsigned i = 0; i < DRAIN_BUFS; i++) assert_memory_equal(dst[i], zero, DRAIN_BYTES);
        ok(k->stream_sync(q)); /* nothing left: returns at once */
        k->stream_destroy(q);
    }
}

static void test_destroy_drains(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        flexdiag_stream *q = queue_new(k, "1000");
        flexdiag_event *e = NULL, *dropped = NULL;
        ok(k->event_create(q, &e));
        ok(k->event_create(q, &dropped));
        static uint8_t src[DRAIN_BUFS][DRAIN_BYTES], dst[DRAIN_BUFS][DRAIN_BYTES];
        for (unsigned i = 0; i < DRAIN_BUFS; i++) {
            fill(src[i], DRAIN_BYTES, i + 100);
            memset(dst[i], 0, DRAIN_BYTES);
            ok(k->copy_h2d_async(dst[i], src[i], DRAIN_BYTES, q));
        }
        ok(k->event_record(e, q));
        ok(k->event_record(dropped, q));
        k->event_destroy(dropped); /* its record is still queued: the queue keeps it alive */
        ok(k->stream_wait_event(q, e));
        k->stream_destroy(q);
        for (unsigned i = 0; i < DRAIN_BUFS; i++) assert_memory_equal(dst[i], src[i], DRAIN_BYTES);
        int done = -1;
        ok(k->event_query(e, &done));
        assert_int_equal(done, 1);
        k->event_destroy(e);
    }
}

/* ---- bad arguments ---- */

static void refused(flexdiag_status st) {
    assert_int_equal(st, FLEXDIAG_ERR_INVALID_ARG);
    assert_true(flexdiag__err_msg()[0] != '\0');
    flexdiag__err_clear();
}

static void test_bad_args(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        const flexdiag_kernels *k = tables[t];
        flexdiag_stream *q = queue_new(k, "0");
        flexdiag_event *gate = NULL;
        ok(k->event_create(q, &gate));
        const uint64_t gen = hold(k, q, gate); /* errors must not wait for the queue */
        uint8_t buf[256] = {0}, other[256] = {0};
        refused(k->copy_h2d_async(NULL, other, sizeof buf, q));
        refused(k->copy_h2d(buf, NULL, sizeof buf, q));
        refused(k->copy_d2d(buf + 1, buf, sizeof buf - 1, q));
        refused(k->copy_d2h_async(buf, buf + 16, 64, q));
        refused(k->copy_d2h(NULL, other, sizeof buf, q));
        refused(k->memset0(NULL, sizeof buf, q));
        refused(k->event_record(NULL, q));
        refused(k->stream_wait_event(q, NULL));
        refused(k->copy_stream_create(0, NULL));
        ok(k->copy_h2d_async(NULL, NULL, 0, q)); /* zero bytes: nothing to check or queue */
        flexdiag__cpu_event_reach(gate, gen);
        ok(k->stream_sync(q));
        k->event_destroy(gate);
        k->stream_destroy(q);

        static const char *const bad_delay[] = {"abc", "-1", "12us", "1000001"};
        for (size_t i = 0; i < sizeof bad_delay / sizeof bad_delay[0]; i++) {
            assert_int_equal(setenv("FLEXDIAG_COPY_DELAY_US", bad_delay[i], 1), 0);
            flexdiag_stream *none = (flexdiag_stream *)(uintptr_t)1; /* must come back NULL */
            refused(k->copy_stream_create(0, &none));
            assert_null(none);
        }
        assert_int_equal(unsetenv("FLEXDIAG_COPY_DELAY_US"), 0);
    }
}

/* Rows of 40 bytes at pitch 64 from src to a buffer of pitch 96 and back, on a delayed queue
 * and on an ordinary stream; bytes outside the rows stay untouched. */
static void test_strided(void **state) {
    (void)state;
    enum { ROWS = 37, W = 40, SP = 64, DP = 96 };
    for (int ti = 0; ti < 2; ti++) {
        const flexdiag_kernels *k = tables[ti];
        flexdiag_stream *streams[2] = {queue_new(k, "50"), NULL};
        ok(k->stream_create(-1, 1, &streams[1]));
        for (int si = 0; si < 2; si++) {
            flexdiag_stream *s = streams[si];
            uint8_t src[ROWS * SP], dev[ROWS * DP], back[ROWS * SP];
            fill(src, sizeof src, 3);
            memset(dev, 0xAB, sizeof dev);
            memset(back, 0xCD, sizeof back);
            ok(k->copy_h2d_2d_async(dev, DP, src, SP, W, ROWS, s));
            ok(k->copy_d2h_2d_async(back, SP, dev, DP, W, ROWS, s));
            ok(k->stream_sync(s));
            for (int r = 0; r < ROWS; r++) {
                for (int b = 0; b < SP; b++)
                    assert_int_equal(back[r * SP + b], b < W ? src[r * SP + b] : 0xCD);
                for (int b = 0; b < DP; b++)
                    assert_int_equal(dev[r * DP + b], b < W ? src[r * SP + b] : 0xAB);
            }
            assert_int_equal(k->copy_h2d_2d_async(dev, W - 1, src, SP, W, ROWS, s),
                             FLEXDIAG_ERR_INVALID_ARG);
            flexdiag__err_clear();
        }
        k->stream_destroy(streams[0]);
        k->stream_destroy(streams[1]);
    }
}

int main(void) {
    tables[0] = flexdiag__kernels_cpu_ref();
    tables[1] = flexdiag__kernels_cpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots),        cmocka_unit_test(test_ordering),
        cmocka_unit_test(test_cross_stream), cmocka_unit_test(test_chain),
        cmocka_unit_test(test_sync_drains),  cmocka_unit_test(test_destroy_drains),
        cmocka_unit_test(test_bad_args),     cmocka_unit_test(test_strided),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
