/*
 * test_offload_cuda.c - weight placement on the GPU: every --weights split over the device,
 * pinned host memory and the NVMe store (a temporary folder) gives the all-device run's tokens
 * and logits bit for bit at the same batch and micro-batch (tests/engine/offload_runs.h), with
 * the GEMM autotuner off (FLEXDIAG_GEMM_TUNE=0) so every run picks the same GEMM algorithms;
 * the KV of half or all of the micro-batches homed in pinned host memory, for every policy, the
 * same (offload_runs.h to_run_kv_homes); and the strided copies those homes use against a
 * host loop. Exit 77 without a GPU.
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

static void test_kv_homes_cuda(void **state) {
    (void)state;
    to_run_kv_homes(0, "tiny-janus", 4, 1, g_dir);
}

/* copy_h2d_2d_async then copy_d2h_2d_async through a device buffer of another pitch: the rows
 * come back, the bytes between them stay. */
static void test_strided_copies(void **state) {
    (void)state;
    enum { ROWS = 129, W = 256, HP = 320, DP = 512 };
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    flexdiag_stream *s = NULL;
    assert_int_equal(k->copy_stream_create(0, &s), FLEXDIAG_OK);
    unsigned char *src = NULL, *back = NULL;
    void *dev = NULL;
    assert_int_equal(k->host_alloc(ROWS * HP, (void **)&src), FLEXDIAG_OK);
    assert_int_equal(k->host_alloc(ROWS * HP, (void **)&back), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(ROWS * DP, &dev), FLEXDIAG_OK);
    for (int i = 0; i < ROWS * HP; i++) src[i] = (unsigned char)(i * 7 + 3), back[i] = 0xCD;
    assert_int_equal(k->copy_h2d_2d_async(dev, DP, src, HP, W, ROWS, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h_2d_async(back, HP, dev, DP, W, ROWS, s), FLEXDIAG_OK);
    assert_int_equal(k->stream_sync(s), FLEXDIAG_OK);
    for (int r = 0; r < ROWS; r++)
        for (int b = 0; b < HP; b++)
            assert_int_equal(back[r * HP + b], b < W ? src[r * HP + b] : 0xCD);
    k->mem_free(dev);
    k->host_free(src);
    k->host_free(back);
    k->stream_destroy(s);
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_placements_cuda),
                                       cmocka_unit_test(test_kv_homes_cuda),
                                       cmocka_unit_test(test_strided_copies)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir);
    return rc;
}
