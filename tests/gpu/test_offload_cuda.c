/*
 * test_offload_cuda.c - weight placement on the GPU: every --weights split over the device,
 * pinned host memory and the NVMe store (a temporary folder) gives the all-device run's tokens
 * and logits bit for bit at the same batch and micro-batch (tests/engine/offload_runs.h), with
 * the GEMM autotuner off (FLEXDIAG_GEMM_TUNE=0) so every run picks the same GEMM algorithms.
 * Exit 77 without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/offload_runs.h"
#include "kernels/kernels.h"

static char g_dir[] = "/tmp/flexdiag-offload-cuda-XXXXXX";

static void test_placements_cuda(void **state) {
    (void)state;
    to_run_placements(0, "tiny-janus", 6, 2, g_dir);
}

int main(void) {
    size_t fb = 0, tb = 0;
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    if (!k || k->mem_info(&fb, &tb) != FLEXDIAG_OK || tb == 0) {
        fprintf(stderr, "test_offload_cuda: no CUDA backend or device: skipped\n");
        return 77;
    }
    setenv("FLEXDIAG_GEMM_TUNE", "0", 1);
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_placements_cuda)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir);
    return rc;
}
