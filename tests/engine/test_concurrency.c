/*
 * test_concurrency.c - contexts are independent on the CPU engine: three contexts of one runtime
 * (dense, Diagonal, H2O; different batches and micro-batches), each driven by its own thread
 * with 4 CPU workers, give the tokens of the sequential runs (concurrency.h). Before contexts
 * owned their streams this gave wrong tokens, ERR_NUMERIC, or a deadlock in the shared pool.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/concurrency.h"

static void test_contexts_cpu(void **state) {
    (void)state;
    tc_run_concurrency(-1, 4, 4, NULL, NULL);
}

/* The same with the weights split over device, pinned pool and disk: three tiered schedulers
 * (their copy threads, disk reads and staging) on one shared pool and store. */
static void test_contexts_split_weights(void **state) {
    (void)state;
    char dir[] = "/tmp/flexdiag-conc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    static const uint32_t pct[3] = {30, 40, 30};
    tc_run_concurrency(-1, 2, 3, pct, dir);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_contexts_cpu),
                                       cmocka_unit_test(test_contexts_split_weights)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
