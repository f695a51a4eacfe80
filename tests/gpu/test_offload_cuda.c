/*
 * test_offload_cuda.c - weight placement on the GPU: every --weights split over the device,
 * pinned host memory and the NVMe store (a temporary folder) gives the all-device run's tokens
 * and logits bit for bit at the same batch and micro-batch (tests/engine/offload_runs.h), with
 * the GEMM autotuner off (FLEXDIAG_GEMM_TUNE=0) so every run picks the same GEMM algorithms;
 * the KV of half or all of the micro-batches homed in pinned host memory, for every policy, the
 * same (offload_runs.h to_run_kv_homes); CPU attention over those homes within a logit
 * tolerance (to_run_cpu_attention); the strided copies those homes use against a host
 * loop; and the slot-row gather of sparse policies against the CPU backend's copy, from both
 * kinds of pinned memory (host_alloc and host_register, what the KV pool uses); compressed
 * weights (--compress-weights 4bit, unpacked by the CUDA kernel) against the resident model
 * whose streamed matrices the plain C reference packed and unpacked. Exit 77 without a GPU.
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
    to_run_kv_homes(0, "tiny-janus", 4, 1, g_dir, 0);
}

static void test_compressed_cuda(void **state) {
    (void)state;
    to_run_compressed(0, "tiny-janus", 6, 2, g_dir);
}

/* CPU attention: the host's bf16 attention (kernels/cpu/host_attn.c) in place of the device's;
 * logits within 2e-2 relative L2 of the all-device run's (bf16 sums in another order). */
static void test_cpu_attention_cuda(void **state) {
    (void)state;
    to_run_cpu_attention(0, "tiny-janus", 4, 2e-2, 3, g_dir);
}

/* copy_h2d_2d_async then copy_d2h_2d_async through a device buffer of another pitch: the rows
 * come back, the bytes between them stay. src 0: host_alloc, 1: malloc + host_register (both
 * mapped pinned memory: the device gathers when the sizes are multiples of 16 bytes), 2: plain
 * malloc (the copy engine). */
static void strided_case(int w, int src_kind) {
    enum { ROWS = 129, HP = 320, DP = 512 };
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    flexdiag_stream *s = NULL;
    assert_int_equal(k->copy_stream_create(0, &s), FLEXDIAG_OK);
    unsigned char *src = NULL, *back = NULL;
    void *dev = NULL;
    if (src_kind == 0) assert_int_equal(k->host_alloc(ROWS * HP, (void **)&src), FLEXDIAG_OK);
    else assert_non_null(src = malloc(ROWS * HP));
    if (src_kind == 1) assert_int_equal(k->host_register(src, ROWS * HP), FLEXDIAG_OK);
    assert_int_equal(k->host_alloc(ROWS * HP, (void **)&back), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(ROWS * DP, &dev), FLEXDIAG_OK);
    for (int i = 0; i < ROWS * HP; i++) src[i] = (unsigned char)(i * 7 + 3), back[i] = 0xCD;
    assert_int_equal(k->copy_h2d_2d_async(dev, DP, src, HP, (size_t)w, ROWS, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h_2d_async(back, HP, dev, DP, (size_t)w, ROWS, s), FLEXDIAG_OK);
    assert_int_equal(k->stream_sync(s), FLEXDIAG_OK);
    for (int r = 0; r < ROWS; r++)
        for (int b = 0; b < HP; b++)
            assert_int_equal(back[r * HP + b], b < w ? src[r * HP + b] : 0xCD);
    k->mem_free(dev);
    if (src_kind == 1) assert_int_equal(k->host_unregister(src), FLEXDIAG_OK);
    if (src_kind == 0) k->host_free(src);
    else free(src);
    k->host_free(back);
    k->stream_destroy(s);
}

static void test_strided_copies(void **state) {
    (void)state;
    for (int src_kind = 0; src_kind < 3; src_kind++) {
        strided_case(256, src_kind);
        strided_case(304, src_kind); /* 19 vectors a row: a tail of the gather's unrolled pass */
        strided_case(100, src_kind); /* not a multiple of 16: the copy engine */
    }
}

/* copy_h2d_slots_async of CUDA and of the CPU reference on the same lists: the same rows land,
 * every other byte keeps the destination's pattern. registered: the source is malloc'd memory
 * pinned with host_register instead of host_alloc. */
static void slot_rows_case(int registered) {
    enum { SEQ = 5, HKV = 3, RING = 40, PCAP = 7, ROW = 256, MAXS = 13 };
    enum { PITCH = (PCAP + RING) * ROW, BYTES = SEQ * HKV * PITCH, NB = SEQ * HKV };
    const flexdiag_kernels *k = flexdiag__kernels_cuda(), *c = flexdiag__kernels_cpu_ref();
    flexdiag_stream *s = NULL;
    assert_int_equal(k->copy_stream_create(0, &s), FLEXDIAG_OK);
    unsigned char *src = NULL, *want = malloc(BYTES), *got = malloc(BYTES);
    if (registered) {
        src = malloc(BYTES);
        assert_int_equal(k->host_register(src, BYTES), FLEXDIAG_OK);
    } else {
        assert_int_equal(k->host_alloc(BYTES, (void **)&src), FLEXDIAG_OK);
    }
    int32_t slots[NB * MAXS], n_slots[NB];
    unsigned x = 12345u;
    for (int b = 0; b < NB; b++) { /* distinct rows of the ring, some lists short or empty */
        n_slots[b] = b % 4 == 3 ? 0 : MAXS - b % 5;
        for (int i = 0; i < MAXS; i++) {
            x = x * 1103515245u + 12345u;
            slots[b * MAXS + i] = (int32_t)((i * 3 + (x >> 16) % 3) % RING);
        }
    }
    for (int i = 0; i < BYTES; i++) src[i] = (unsigned char)(i * 13 + 5), want[i] = 0xA5;
    void *dst = NULL, *dslots = NULL, *dn = NULL;
    assert_int_equal(k->mem_alloc(BYTES, &dst), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(sizeof slots, &dslots), FLEXDIAG_OK);
    assert_int_equal(k->mem_alloc(sizeof n_slots, &dn), FLEXDIAG_OK);
    assert_int_equal(k->copy_h2d(dst, want, BYTES, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_h2d(dslots, slots, sizeof slots, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_h2d(dn, n_slots, sizeof n_slots, s), FLEXDIAG_OK);
    flexdiag_slot_rows r = {.dst = dst, .src = src, .pitch = PITCH, .ring_off = PCAP * ROW,
                            .row_bytes = ROW, .slots = dslots, .n_slots = dn,
                            .max_slots = MAXS, .n_seq = SEQ, .h_kv = HKV};
    assert_int_equal(k->copy_h2d_slots_async(&r, s), FLEXDIAG_OK);
    assert_int_equal(k->copy_d2h(got, dst, BYTES, s), FLEXDIAG_OK);
    flexdiag_slot_rows rc = r;
    rc.dst = want;
    rc.slots = slots;
    rc.n_slots = n_slots;
    assert_int_equal(c->copy_h2d_slots_async(&rc, NULL), FLEXDIAG_OK);
    assert_memory_equal(got, want, BYTES);
    size_t touched = 0;
    for (int i = 0; i < BYTES; i++) touched += want[i] != 0xA5;
    assert_true(touched > BYTES / 8); /* the reference did copy rows */
    k->mem_free(dst);
    k->mem_free(dslots);
    k->mem_free(dn);
    if (registered) {
        k->host_unregister(src);
        free(src);
    } else {
        k->host_free(src);
    }
    free(want);
    free(got);
    k->stream_destroy(s);
}

static void test_slot_rows(void **state) {
    (void)state;
    slot_rows_case(0);
    slot_rows_case(1);
}

/* An argument runs only the tests whose names match it (cmocka's filter, e.g. '*compressed*'). */
int main(int argc, char **argv) {
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_strided_copies), /* quick first */
                                       cmocka_unit_test(test_slot_rows),
                                       cmocka_unit_test(test_placements_cuda),
                                       cmocka_unit_test(test_compressed_cuda),
                                       cmocka_unit_test(test_kv_homes_cuda),
                                       cmocka_unit_test(test_cpu_attention_cuda)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir);
    return rc;
}
