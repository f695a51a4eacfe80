/*
 * test_thread_pool.c - the persistent thread pool (base/thread_pool.c): every task of every job
 * runs exactly once whatever the worker count; jobs back to back (the workers still polling),
 * jobs after pauses longer than the poll (the workers asleep), two submitting threads at once;
 * a job whose tasks the submitter finishes before the sleeping workers wake (they must not
 * touch its context once parallel_for has returned); per-worker scratch of the asked size;
 * destroy while the workers poll and while they sleep.
 * A lost wake-up would hang a case: the suite's timeout catches it. A worker reading a closed
 * job's fields races with the next job's publication, which ThreadSanitizer reports; built by
 * hand from a configured build folder B (the CI builds carry no TSan runtime check):
 *   gcc -std=gnu11 -D_GNU_SOURCE -O1 -g -fsanitize=thread -DFLEXDIAG_LAYER=FLEXDIAG_LAYER_BASE
 *       -I. -Iinclude -IB tests/core/test_thread_pool.c base/thread_pool.c base/core.c
 *       -lcmocka -lpthread -lm -o tp_tsan && ./tp_tsan
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
#include "base/thread_pool.h"

#define MAX_TASKS 4096

typedef struct counts {
    atomic_int hits[MAX_TASKS];
    size_t scratch_bytes;
    atomic_int bad_scratch;
} counts;

static void count_task(void *ctx, int64_t t, void *scratch) {
    counts *c = ctx;
    atomic_fetch_add(&c->hits[t], 1);
    if (c->scratch_bytes) {
        if (!scratch || ((uintptr_t)scratch & 63)) atomic_fetch_add(&c->bad_scratch, 1);
        else memset(scratch, (int)(t & 0xff), c->scratch_bytes); /* the whole buffer is ours */
    }
}

/* Run a job of n tasks and check each ran once. */
static void one_job(flexdiag_pool *p, counts *c, int64_t n, size_t scratch) {
    for (int64_t t = 0; t < n; t++) atomic_store(&c->hits[t], 0);
    c->scratch_bytes = scratch;
    assert_int_equal(flexdiag__pool_parallel_for(p, n, scratch, count_task, c), FLEXDIAG_OK);
    for (int64_t t = 0; t < n; t++) assert_int_equal(atomic_load(&c->hits[t]), 1);
    assert_int_equal(atomic_load(&c->bad_scratch), 0);
}

static void pause_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

static void test_every_task_once(void **state) {
    (void)state;
    static counts c;
    const int workers[] = {1, 2, 3, 8};
    const int64_t sizes[] = {0, 1, 2, 7, 64, 1000, MAX_TASKS};
    for (size_t w = 0; w < sizeof workers / sizeof *workers; w++) {
        flexdiag_pool *p = NULL;
        assert_int_equal(flexdiag__pool_create(workers[w], &p), FLEXDIAG_OK);
        assert_int_equal(flexdiag__pool_workers(p), workers[w]);
        for (size_t n = 0; n < sizeof sizes / sizeof *sizes; n++)
            one_job(p, &c, sizes[n], n % 2 ? 256 : 0);
        flexdiag__pool_destroy(p);
    }
}

/* Thousands of small jobs back to back: the workers take them while polling. */
static void test_back_to_back(void **state) {
    (void)state;
    static counts c;
    flexdiag_pool *p = NULL;
    assert_int_equal(flexdiag__pool_create(4, &p), FLEXDIAG_OK);
    for (int i = 0; i < 20000; i++) one_job(p, &c, 1 + i % 13, 0);
    flexdiag__pool_destroy(p); /* right after a job: the workers are still polling */
}

/* Jobs after pauses beyond the poll: the workers sleep and must be woken each time. */
static void test_after_pauses(void **state) {
    (void)state;
    static counts c;
    flexdiag_pool *p = NULL;
    assert_int_equal(flexdiag__pool_create(3, &p), FLEXDIAG_OK);
    for (int i = 0; i < 200; i++) {
        pause_us(i % 2 ? 2000 : 30); /* asleep, or caught mid-poll */
        one_job(p, &c, 16, 64);
    }
    pause_us(5000);
    flexdiag__pool_destroy(p); /* asleep */
}

typedef struct stack_job {
    uint64_t magic; /* STACK_MAGIC while the job is live, poisoned by the submitter after it */
    atomic_int *late; /* set by a task that found the context poisoned */
    atomic_int hits[2];
} stack_job;

#define STACK_MAGIC 0x6a6f62u

static void stack_task(void *ctx, int64_t t, void *scratch) {
    (void)scratch;
    stack_job *j = ctx;
    if (j->magic != STACK_MAGIC) atomic_store(j->late, 1);
    else atomic_fetch_add(&j->hits[t], 1);
}

/* Tiny jobs right after pauses beyond the poll, on more workers than cores: the submitter
 * claims both tasks before most workers are awake, so the job closes with them still asleep;
 * a worker waking afterwards must leave it without running a task on the (poisoned, then
 * reused) stack context, and the next job must still see every task once. */
static void test_late_joiners(void **state) {
    (void)state;
    atomic_int late;
    atomic_init(&late, 0);
    flexdiag_pool *p = NULL;
    assert_int_equal(flexdiag__pool_create(8, &p), FLEXDIAG_OK);
    for (int i = 0; i < 300; i++) {
        if (i % 3 == 0) pause_us(200);
        stack_job j = {.magic = STACK_MAGIC, .late = &late};
        atomic_init(&j.hits[0], 0);
        atomic_init(&j.hits[1], 0);
        assert_int_equal(flexdiag__pool_parallel_for(p, 2, 0, stack_task, &j), FLEXDIAG_OK);
        assert_int_equal(atomic_load(&j.hits[0]), 1);
        assert_int_equal(atomic_load(&j.hits[1]), 1);
        memset(&j, 0xa5, sizeof j); /* what a late worker would now read */
    }
    assert_int_equal(atomic_load(&late), 0);
    flexdiag__pool_destroy(p);
}

typedef struct submitter {
    flexdiag_pool *p;
    counts c;
    int ok;
} submitter;

static void *submit_main(void *arg) {
    submitter *s = arg;
    s->ok = 1;
    for (int i = 0; i < 2000 && s->ok; i++) {
        int64_t n = 1 + i % 50;
        for (int64_t t = 0; t < n; t++) atomic_store(&s->c.hits[t], 0);
        if (flexdiag__pool_parallel_for(s->p, n, 0, count_task, &s->c) != FLEXDIAG_OK) s->ok = 0;
        for (int64_t t = 0; t < n; t++)
            if (atomic_load(&s->c.hits[t]) != 1) s->ok = 0;
    }
    return NULL;
}

/* Two threads submitting to one pool: the jobs are serialised, none is lost or mixed. */
static void test_two_submitters(void **state) {
    (void)state;
    static submitter s[2];
    flexdiag_pool *p = NULL;
    assert_int_equal(flexdiag__pool_create(3, &p), FLEXDIAG_OK);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        s[i].p = p;
        assert_int_equal(pthread_create(&th[i], NULL, submit_main, &s[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_true(s[i].ok);
    }
    flexdiag__pool_destroy(p);
}

static void test_bad_threads(void **state) {
    (void)state;
    flexdiag_pool *p = NULL;
    assert_int_equal(flexdiag__pool_create(-1, &p), FLEXDIAG_ERR_INVALID_ARG);
    assert_null(p);
    assert_int_equal(flexdiag__pool_create(1 << 20, &p), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(flexdiag__pool_workers(NULL), 1);
    static counts c;
    one_job(NULL, &c, 5, 128); /* a NULL pool runs the tasks on the caller */
}

/* FLEXDIAG_POOL_POLL_US sets the poll time: a number of microseconds in range makes a working
 * pool (0 included: threads sleep at once), anything else is refused naming the variable. */
static void test_poll_env(void **state) {
    (void)state;
    static const char *bad[] = {"abc", "-1", "100001", "12us", "99999999999999999999"};
    flexdiag_pool *p = NULL;
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        setenv("FLEXDIAG_POOL_POLL_US", bad[i], 1);
        flexdiag__err_clear(); /* the first error of a call is the one kept */
        assert_int_equal(flexdiag__pool_create(3, &p), FLEXDIAG_ERR_INVALID_ARG);
        assert_null(p);
        assert_non_null(strstr(flexdiag__err_msg(), "FLEXDIAG_POOL_POLL_US"));
    }
    static const char *good[] = {"0", "200"};
    for (int i = 0; i < 2; i++) {
        setenv("FLEXDIAG_POOL_POLL_US", good[i], 1);
        assert_int_equal(flexdiag__pool_create(3, &p), FLEXDIAG_OK);
        static counts c;
        for (int r = 0; r < 50; r++) one_job(p, &c, 7, 64);
        flexdiag__pool_destroy(p);
    }
    unsetenv("FLEXDIAG_POOL_POLL_US");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_task_once), cmocka_unit_test(test_back_to_back),
        cmocka_unit_test(test_after_pauses), cmocka_unit_test(test_late_joiners),
        cmocka_unit_test(test_two_submitters),
        cmocka_unit_test(test_bad_threads), cmocka_unit_test(test_poll_env)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
