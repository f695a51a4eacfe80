/*
 * test_concurrency_cuda.c - contexts are independent on the GPU: three contexts of one CUDA
 * runtime (dense, Diagonal, H2O), each with its own stream and driven by its own thread, give the
 * tokens of the sequential runs bit for bit (tests/engine/concurrency.h). Exit 77 without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "engine/concurrency.h"
#include "kernels/kernels.h"

static void test_contexts_cuda(void **state) {
    (void)state;
    tc_run_concurrency(0, 0, 4, NULL, NULL);
}

int main(void) {
    size_t fb = 0, tb = 0;
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    if (!k || k->mem_info(&fb, &tb) != FLEXDIAG_OK || tb == 0) {
        fprintf(stderr, "test_concurrency_cuda: no CUDA backend or device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_contexts_cuda)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
