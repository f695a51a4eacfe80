/*
 * test_events_cuda.c - the CUDA table's events, asynchronous copies, host registration and
 * concurrent GEMMs on several streams (kernels.h event_*, stream_wait_event, copy_*_async,
 * host_register; matmul.cu's shared plan cache). Exit 77 without CUDA or a device.
 *
 *   - ordering, no kernels: stream A uploads X (copy_h2d_async from pinned memory) and records
 *     an event; stream B waits on it, copies X -> Y and Y back to pinned memory, records and
 *     syncs; the bytes must be exact on every one of many iterations over 64 MiB buffers whose
 *     contents change each time, so a missing dependency would read stale data. The same run
 *     without the wait is reported (not asserted) to show the test can see a missing one.
 *     event_query says done after event_sync and for an event never recorded.
 *   - a copy queue (copy_stream_create: no cuBLAS handles, no workspace) uploads X and records
 *     an event; the compute stream A waits on it and reads X back with copy_d2h, over many
 *     iterations of new data; memset0, copy_d2h and stream_sync on the copy queue itself;
 *     pci_bus_id gives "domain:bus:device.function" and refuses a buffer too small for it.
 *   - launch graphs: a record / wait fork and join between two streams inside one capture, and
 *     a wait inside a capture on an event recorded outside it before each replay (an external
 *     wait node): every replay must see the bytes of its own upload.
 *   - host_register of malloc'd buffers: async copies from and to them round-trip exactly;
 *     registering twice is INVALID_ARG; unregister, NULL and zero bytes.
 *   - matmul from two host threads on two streams at once, on shapes no stream has run yet
 *     (both miss the plan cache together), with and without bias (the bias epilogue's pointer
 *     differs per thread), fp32 out and ACCUM: every call's output bit-identical across
 *     iterations, across the two threads and to one stream run afterwards.
 *   - more distinct shapes than the plan cache holds: every output within bf16 tolerance of a
 *     double-precision host GEMM and identical when repeated (the temporary plans past the cap).
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "kernels/kernels.h"
#include "util.h"

static const flexdiag_kernels *G; /* CUDA table under test */
static flexdiag_stream *A, *B;    /* two CUDA streams on device 0 */

static void ok(flexdiag_status st) {
    if (st != FLEXDIAG_OK) fail_msg("%s: %s", flexdiag_status_str(st), flexdiag__err_msg());
}

/* Words of iteration it's pattern (a different pattern every iteration). */
static void fill_pattern(uint32_t *p, size_t words, uint32_t it) {
    const uint32_t base = it * 0x9E3779B9u + 0x7F4A7C15u;
    for (size_t i = 0; i < words; i++) p[i] = base ^ (uint32_t)(i * 2654435761u);
}

/* ---- ordering between two streams ---- */

#define ORDER_BYTES ((size_t)64 << 20)
#define ORDER_ITERS 40

/* One iteration: upload src on A, record; B waits (when wait), X -> Y, Y -> dst, record, sync. */
static void order_step(void *x, void *y, const void *src, void *dst, flexdiag_event *ea,
                       flexdiag_event *eb, int wait) {
    ok(G->copy_h2d_async(x, src, ORDER_BYTES, A));
    ok(G->event_record(ea, A));
    if (wait) ok(G->stream_wait_event(B, ea));
    ok(G->copy_d2d(y, x, ORDER_BYTES, B));
    ok(G->copy_d2h_async(dst, y, ORDER_BYTES, B));
    ok(G->event_record(eb, B));
    ok(G->event_sync(eb));
    ok(G->stream_sync(A)); /* without the wait, A may still be uploading */
}

static void test_ordering(void **state) {
    (void)state;
    void *src = NULL, *dst = NULL, *x = NULL, *y = NULL;
    ok(G->host_alloc(ORDER_BYTES, &src));
    ok(G->host_alloc(ORDER_BYTES, &dst));
    ok(G->mem_alloc(ORDER_BYTES, &x));
    ok(G->mem_alloc(ORDER_BYTES, &y));
    flexdiag_event *ea = NULL, *eb = NULL;
    ok(G->event_create(A, &ea));
    ok(G->event_create(B, &eb));
    int done = -1;
    ok(G->event_query(eb, &done));
    assert_int_equal(done, 1); /* never recorded */
    int bad = 0, stale = 0;
    for (uint32_t it = 0; it < 2 * ORDER_ITERS; it++) {
        const int wait = it < ORDER_ITERS;
        fill_pattern(src, ORDER_BYTES / 4, it);
        memset(dst, 0, ORDER_BYTES);
        order_step(x, y, src, dst, ea, eb, wait);
        done = -1;
        ok(G->event_query(eb, &done));
        assert_int_equal(done, 1);
        const int same = memcmp(dst, src, ORDER_BYTES) == 0;
        if (wait) bad += !same;
        else stale += !same;
    }
    printf("ordering: %d of %d iterations wrong with the wait; without it %d of %d read stale "
           "data (how well the test sees a missing dependency)\n",
           bad, ORDER_ITERS, stale, ORDER_ITERS);
    assert_int_equal(bad, 0);
    G->event_destroy(ea);
    G->event_destroy(eb);
    G->mem_free(x);
    G->mem_free(y);
    G->host_free(src);
    G->host_free(dst);
}

/* ---- a copy queue feeding a compute stream ---- */

#define COPYQ_ITERS 20

/* Whether the n bytes at p are all zero. */
static int all_zero(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void test_copy_stream(void **state) {
    (void)state;
    flexdiag_stream *c = NULL;
    ok(G->copy_stream_create(0, &c));
    void *src = NULL, *dst = NULL, *x = NULL;
    ok(G->host_alloc(ORDER_BYTES, &src));
    ok(G->host_alloc(ORDER_BYTES, &dst));
    ok(G->mem_alloc(ORDER_BYTES, &x));
    flexdiag_event *up = NULL;
    ok(G->event_create(c, &up));
    int bad = 0;
    for (uint32_t it = 0; it < COPYQ_ITERS; it++) {
        fill_pattern(src, ORDER_BYTES / 4, it + 1000);
        memset(dst, 0, ORDER_BYTES);
        ok(G->copy_h2d_async(x, src, ORDER_BYTES, c));
        ok(G->event_record(up, c));
        ok(G->stream_wait_event(A, up));
        ok(G->copy_d2h(dst, x, ORDER_BYTES, A));
        bad += memcmp(dst, src, ORDER_BYTES) != 0;
    }
    assert_int_equal(bad, 0);

    ok(G->memset0(x, ORDER_BYTES, c));
    ok(G->copy_d2h(dst, x, ORDER_BYTES, c));
    assert_true(all_zero(dst, ORDER_BYTES));
    ok(G->copy_h2d_async(x, src, ORDER_BYTES, c));
    ok(G->stream_sync(c));

    char id[64], tiny[4];
    ok(G->pci_bus_id(0, id, sizeof id));
    printf("copy queue: device 0 is at PCI %s\n", id);
    assert_non_null(strchr(id, ':'));
    assert_non_null(strchr(id, '.'));
    assert_int_equal(G->pci_bus_id(0, tiny, sizeof tiny), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();

    G->event_destroy(up);
    G->mem_free(x);
    G->host_free(src);
    G->host_free(dst);
    G->stream_destroy(c);
}

/* ---- events inside launch graphs ---- */

#define GRAPH_BYTES ((size_t)32 << 20)
#define GRAPH_ITERS 20

static void test_graph_events(void **state) {
    (void)state;
    void *src = NULL, *dst = NULL, *x = NULL, *y = NULL, *z = NULL;
    ok(G->host_alloc(GRAPH_BYTES, &src));
    ok(G->host_alloc(GRAPH_BYTES, &dst));
    ok(G->mem_alloc(GRAPH_BYTES, &x));
    ok(G->mem_alloc(GRAPH_BYTES, &y));
    ok(G->mem_alloc(GRAPH_BYTES, &z));
    flexdiag_event *fork = NULL, *join = NULL, *up = NULL, *fin = NULL;
    ok(G->event_create(A, &fork));
    ok(G->event_create(B, &join));
    ok(G->event_create(B, &up));
    ok(G->event_create(A, &fin));

    /* fork / join: A -> B (X -> Y) -> A (Y -> Z), all in one graph */
    void *g_fork = NULL;
    ok(G->graph_begin(A));
    ok(G->event_record(fork, A));
    ok(G->stream_wait_event(B, fork));
    ok(G->copy_d2d(y, x, GRAPH_BYTES, B));
    ok(G->event_record(join, B));
    ok(G->stream_wait_event(A, join));
    ok(G->copy_d2d(z, y, GRAPH_BYTES, A));
    ok(G->graph_end(A, &g_fork));

    /* external wait: the graph waits for an upload B records outside it before each replay */
    void *g_wait = NULL;
    ok(G->event_record(up, B));
    ok(G->stream_sync(B));
    ok(G->graph_begin(A));
    ok(G->stream_wait_event(A, up));
    ok(G->copy_d2d(y, x, GRAPH_BYTES, A));
    ok(G->graph_end(A, &g_wait));

    int bad_fork = 0, bad_wait = 0;
    for (uint32_t it = 0; it < GRAPH_ITERS; it++) {
        fill_pattern(src, GRAPH_BYTES / 4, 1000 + it);
        memset(dst, 0, GRAPH_BYTES);
        ok(G->copy_h2d_async(x, src, GRAPH_BYTES, A));
        ok(G->graph_launch(g_fork, A));
        ok(G->copy_d2h_async(dst, z, GRAPH_BYTES, A));
        ok(G->event_record(fin, A));
        ok(G->event_sync(fin));
        bad_fork += memcmp(dst, src, GRAPH_BYTES) != 0;

        fill_pattern(src, GRAPH_BYTES / 4, 2000 + it);
        memset(dst, 0, GRAPH_BYTES);
        ok(G->copy_h2d_async(x, src, GRAPH_BYTES, B));
        ok(G->event_record(up, B));
        ok(G->graph_launch(g_wait, A));
        ok(G->copy_d2h_async(dst, y, GRAPH_BYTES, A));
        ok(G->event_record(fin, A));
        ok(G->event_sync(fin));
        bad_wait += memcmp(dst, src, GRAPH_BYTES) != 0;
    }
    printf("graphs: fork/join %d, external wait %d wrong of %d replays\n", bad_fork, bad_wait,
           GRAPH_ITERS);
    assert_int_equal(bad_fork, 0);
    assert_int_equal(bad_wait, 0);
    G->graph_destroy(g_fork);
    G->graph_destroy(g_wait);
    G->event_destroy(fork);
    G->event_destroy(join);
    G->event_destroy(up);
    G->event_destroy(fin);
    G->mem_free(x);
    G->mem_free(y);
    G->mem_free(z);
    G->host_free(src);
    G->host_free(dst);
}

/* ---- host registration ---- */

static void test_host_register(void **state) {
    (void)state;
    const size_t n = ((size_t)32 << 20) + 12; /* not a multiple of the page size */
    uint8_t *host = malloc(n), *back = malloc(n);
    assert_non_null(host);
    assert_non_null(back);
    fill_pattern((uint32_t *)host, n / 4, 77);
    memset(back, 0, n);
    ok(G->host_register(host, n));
    ok(G->host_register(back, n));
    assert_int_equal(G->host_register(host, n), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__err_clear();
    void *x = NULL;
    ok(G->mem_alloc(n, &x));
    flexdiag_event *e = NULL;
    ok(G->event_create(A, &e));
    ok(G->copy_h2d_async(x, host, n, A));
    ok(G->copy_d2h_async(back, x, n, A));
    ok(G->event_record(e, A));
    ok(G->event_sync(e));
    assert_memory_equal(back, host, n);
    ok(G->host_unregister(host));
    ok(G->host_unregister(back));
    ok(G->host_register(NULL, 0));
    ok(G->host_unregister(NULL));
    G->event_destroy(e);
    G->mem_free(x);
    free(host);
    free(back);
}

/* ---- concurrent GEMMs on two streams ---- */

typedef struct mm_shape {
    int64_t n, k, m;
    int bias;       /* 1: with a bias */
    unsigned flags; /* FLEXDIAG_MM_* */
} mm_shape;

/* Shapes no other test of this process runs, so the threads' first calls both miss the cache. */
static const mm_shape mm_shapes[] = {
    {24, 2048, 3072, 1, 0},
    {7, 4096, 1024, 0, FLEXDIAG_MM_OUT_F32},
    {96, 1536, 2560, 1, FLEXDIAG_MM_ACCUM},
    {1, 3072, 8192, 0, 0},
    {40, 1024, 1000, 1, FLEXDIAG_MM_OUT_F32},
};
#define N_MM (sizeof mm_shapes / sizeof mm_shapes[0])
#define MM_ITERS 12

static size_t out_bytes(const mm_shape *c) {
    return (size_t)(c->n * c->m) * ((c->flags & FLEXDIAG_MM_OUT_F32) ? 4 : 2);
}

/* Host inputs of every shape (shared, read only). */
typedef struct mm_inputs {
    uint16_t *x[N_MM], *w[N_MM], *b[N_MM]; /* bf16 (n, k), (m, k), (m) */
    uint8_t *init[N_MM];                    /* out before the call (ACCUM adds onto it) */
} mm_inputs;

typedef struct mm_thread {
    const mm_inputs *in;        /* shared inputs */
    flexdiag_stream *s;         /* this thread's stream */
    pthread_barrier_t *start;   /* all threads call their first matmul together */
    uint8_t *first[N_MM];       /* output of the first call of each shape (owned) */
    int mismatches;             /* later calls whose output differed from the first */
    flexdiag_status st;         /* first failure */
    char msg[256];              /* its message */
} mm_thread;

/* Device copies of one shape's inputs (per thread: each thread has its own bias pointer). */
typedef struct mm_dev {
    void *x, *w, *b, *out;
} mm_dev;

static flexdiag_status mm_upload(const mm_inputs *in, size_t i, flexdiag_stream *s, mm_dev *d) {
    const mm_shape *c = &mm_shapes[i];
    memset(d, 0, sizeof *d);
    FLEXDIAG_TRY(G->mem_alloc((size_t)(c->n * c->k) * 2, &d->x));
    FLEXDIAG_TRY(G->mem_alloc((size_t)(c->m * c->k) * 2, &d->w));
    FLEXDIAG_TRY(G->mem_alloc(out_bytes(c), &d->out));
    FLEXDIAG_TRY(G->copy_h2d(d->x, in->x[i], (size_t)(c->n * c->k) * 2, s));
    FLEXDIAG_TRY(G->copy_h2d(d->w, in->w[i], (size_t)(c->m * c->k) * 2, s));
    if (c->bias) {
        FLEXDIAG_TRY(G->mem_alloc((size_t)c->m * 2, &d->b));
        FLEXDIAG_TRY(G->copy_h2d(d->b, in->b[i], (size_t)c->m * 2, s));
    }
    return G->stream_sync(s);
}

static void mm_dev_free(mm_dev *d) {
    G->mem_free(d->x);
    G->mem_free(d->w);
    G->mem_free(d->b);
    G->mem_free(d->out);
}

/* One call of shape i: reset out, matmul, read out back into host. */
static flexdiag_status mm_call(const mm_inputs *in, size_t i, const mm_dev *d,
                               flexdiag_stream *s, uint8_t *host) {
    const mm_shape *c = &mm_shapes[i];
    FLEXDIAG_TRY(G->copy_h2d(d->out, in->init[i], out_bytes(c), s));
    FLEXDIAG_TRY(G->matmul(d->out, d->x, d->w, d->b, c->n, c->k, c->m, c->flags, s));
    return G->copy_d2h(host, d->out, out_bytes(c), s);
}

static flexdiag_status mm_thread_run(mm_thread *t) {
    mm_dev dev[N_MM];
    memset(dev, 0, sizeof dev);
    flexdiag_status st = FLEXDIAG_OK;
    for (size_t i = 0; i < N_MM && st == FLEXDIAG_OK; i++)
        st = mm_upload(t->in, i, t->s, &dev[i]);
    pthread_barrier_wait(t->start);
    for (int it = 0; it < MM_ITERS && st == FLEXDIAG_OK; it++)
        for (size_t i = 0; i < N_MM && st == FLEXDIAG_OK; i++) {
            uint8_t *host = it == 0 ? t->first[i] : malloc(out_bytes(&mm_shapes[i]));
            if (!host) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "test: out of host memory");
            st = mm_call(t->in, i, &dev[i], t->s, host);
            if (it > 0) {
                t->mismatches += st == FLEXDIAG_OK &&
                                 memcmp(host, t->first[i], out_bytes(&mm_shapes[i])) != 0;
                free(host);
            }
        }
    for (size_t i = 0; i < N_MM; i++) mm_dev_free(&dev[i]);
    return st;
}

static void *mm_thread_main(void *arg) {
    mm_thread *t = arg;
    t->st = mm_thread_run(t);
    if (t->st != FLEXDIAG_OK) snprintf(t->msg, sizeof t->msg, "%s", flexdiag__err_msg());
    return NULL;
}

static void test_matmul_concurrent(void **state) {
    (void)state;
    mm_inputs in;
    tu_rng r;
    tu_rng_seed(&r, 2024);
    for (size_t i = 0; i < N_MM; i++) {
        const mm_shape *c = &mm_shapes[i];
        in.x[i] = malloc((size_t)(c->n * c->k) * 2);
        in.w[i] = malloc((size_t)(c->m * c->k) * 2);
        in.b[i] = malloc((size_t)c->m * 2);
        in.init[i] = malloc(out_bytes(c));
        assert_true(in.x[i] && in.w[i] && in.b[i] && in.init[i]);
        tu_fill_bf16(&r, in.x[i], c->n * c->k, 1.0f);
        tu_fill_bf16(&r, in.w[i], c->m * c->k, 0.05f);
        tu_fill_bf16(&r, in.b[i], c->m, 0.5f);
        if (c->flags & FLEXDIAG_MM_OUT_F32)
            tu_fill_f32(&r, (float *)in.init[i], c->n * c->m, 1.0f);
        else
            tu_fill_bf16(&r, (uint16_t *)in.init[i], c->n * c->m, 1.0f);
    }
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, 2), 0);
    mm_thread t[2];
    pthread_t th[2];
    for (int j = 0; j < 2; j++) {
        memset(&t[j], 0, sizeof t[j]);
        t[j].in = &in;
        t[j].s = j == 0 ? A : B;
        t[j].start = &start;
        for (size_t i = 0; i < N_MM; i++) {
            t[j].first[i] = malloc(out_bytes(&mm_shapes[i]));
            assert_non_null(t[j].first[i]);
        }
    }
    for (int j = 0; j < 2; j++)
        assert_int_equal(pthread_create(&th[j], NULL, mm_thread_main, &t[j]), 0);
    for (int j = 0; j < 2; j++) assert_int_equal(pthread_join(th[j], NULL), 0);
    pthread_barrier_destroy(&start);
    for (int j = 0; j < 2; j++) {
        if (t[j].st != FLEXDIAG_OK)
            fail_msg("thread %d: %s: %s", j, flexdiag_status_str(t[j].st), t[j].msg);
        assert_int_equal(t[j].mismatches, 0);
    }
    /* the same shapes on one stream, afterwards */
    int across = 0, single = 0;
    for (size_t i = 0; i < N_MM; i++) {
        const size_t bytes = out_bytes(&mm_shapes[i]);
        across += memcmp(t[0].first[i], t[1].first[i], bytes) != 0;
        mm_dev d;
        ok(mm_upload(&in, i, A, &d));
        uint8_t *host = malloc(bytes);
        assert_non_null(host);
        ok(mm_call(&in, i, &d, A, host));
        single += memcmp(host, t[0].first[i], bytes) != 0;
        free(host);
        mm_dev_free(&d);
    }
    printf("matmul: %zu shapes x %d calls on 2 threads: %d differ across threads, %d from one "
           "stream\n",
           N_MM, MM_ITERS, across, single);
    assert_int_equal(across, 0);
    assert_int_equal(single, 0);
    for (size_t i = 0; i < N_MM; i++) {
        free(in.x[i]);
        free(in.w[i]);
        free(in.b[i]);
        free(in.init[i]);
        for (int j = 0; j < 2; j++) free(t[j].first[i]);
    }
}

/* ---- more shapes than the plan cache holds ---- */

#define CAP_SHAPES 300 /* > the cache's 256 plans per device */
#define CAP_K 64
#define CAP_M 48

static void test_matmul_past_cap(void **state) {
    (void)state;
    const int64_t max_n = CAP_SHAPES;
    tu_rng r;
    tu_rng_seed(&r, 99);
    const size_t x_bytes = (size_t)(max_n * CAP_K) * 2, w_bytes = (size_t)(CAP_M * CAP_K) * 2;
    const size_t out_max = (size_t)(max_n * CAP_M) * 2;
    uint16_t *x = malloc(x_bytes), *w = malloc(w_bytes), *got = malloc(out_max),
             *again = malloc(out_max);
    assert_true(x && w && got && again);
    tu_fill_bf16(&r, x, max_n * CAP_K, 1.0f);
    tu_fill_bf16(&r, w, CAP_M * CAP_K, 0.1f);
    void *dx = NULL, *dw = NULL, *dout = NULL;
    ok(G->mem_alloc(x_bytes, &dx));
    ok(G->mem_alloc(w_bytes, &dw));
    ok(G->mem_alloc(out_max, &dout));
    ok(G->copy_h2d(dx, x, x_bytes, A));
    ok(G->copy_h2d(dw, w, w_bytes, A));
    int bad = 0, unstable = 0;
    for (int64_t n = 1; n <= max_n; n++) { /* every n is a new key */
        const size_t bytes = (size_t)(n * CAP_M) * 2;
        ok(G->matmul(dout, dx, dw, NULL, n, CAP_K, CAP_M, 0, A));
        ok(G->copy_d2h(got, dout, bytes, A));
        ok(G->matmul(dout, dx, dw, NULL, n, CAP_K, CAP_M, 0, A));
        ok(G->copy_d2h(again, dout, bytes, A));
        unstable += memcmp(got, again, bytes) != 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < CAP_M; j++) {
                double ref = 0.0;
                for (int64_t q = 0; q < CAP_K; q++)
                    ref += (double)flexdiag__bf16_to_f32(x[i * CAP_K + q]) *
                           (double)flexdiag__bf16_to_f32(w[j * CAP_K + q]);
                const double v = flexdiag__bf16_to_f32(got[i * CAP_M + j]);
                if (!(fabs(v - ref) <= 1e-2 + 1e-2 * fabs(ref))) bad++;
            }
    }
    printf("matmul past the cache cap: %d shapes, %d values off, %d shapes unstable\n",
           CAP_SHAPES, bad, unstable);
    assert_int_equal(bad, 0);
    assert_int_equal(unstable, 0);
    G->mem_free(dx);
    G->mem_free(dw);
    G->mem_free(dout);
    free(x);
    free(w);
    free(got);
    free(again);
}

int main(void) {
    int skip = tu_cuda_stream("test_events_cuda", &A);
    if (skip) return skip;
    G = flexdiag__kernels_cuda();
    if (G->stream_create(0, 0, &B) != FLEXDIAG_OK) {
        fprintf(stderr, "test_events_cuda: second stream: %s\n", flexdiag__err_msg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ordering),          cmocka_unit_test(test_copy_stream),
        cmocka_unit_test(test_graph_events),      cmocka_unit_test(test_host_register),
        cmocka_unit_test(test_matmul_concurrent), cmocka_unit_test(test_matmul_past_cap),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    G->stream_destroy(B);
    G->stream_destroy(A);
    return rc;
}
