/*
 * bench_kv_copy.c - the two ways a KV home moves rows to the device, timed apart on a GPU host
 * (run by hand: <build>/tests/gpu/bench_kv_copy; not a test):
 *   - copy_h2d_2d_async: one strided DMA per span, rows of `width` bytes every `pitch` bytes
 *     (the prompt rows of every (sequence, KV head) block: width = L_p x 256 B);
 *   - copy_h2d_slots_async: the gather kernel reading the attended ring rows out of mapped
 *     pinned memory (256-byte rows named by slot lists);
 *   - copy_h2d_async of the same bytes in one piece, the ceiling.
 * Janus-Pro-7B shapes: 32 KV heads, rows of 128 bf16, blocks of 64 prompt + 288 ring rows; the
 * sequence count is the first argument (default 512: 256 images with CFG). Prints GB/s each.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/core.h"
#include "kernels/kernels.h"

#define HKV 32
#define ROW 256
#define PCAP 64
#define RING 288
#define REPS 5

static const flexdiag_kernels *k;

static int ok(flexdiag_status st, const char *what) {
    if (st == FLEXDIAG_OK) return 1;
    fprintf(stderr, "bench_kv_copy: %s: %s\n", what, flexdiag__err_msg());
    return 0;
}

/* Seconds per call of the copy `what` (1 2-D, 2 slots, 0 plain), after one warm-up. */
static double timed(int what, flexdiag_stream *s, void *dev, char *host, size_t width,
                    size_t blocks, const flexdiag_slot_rows *r, size_t bytes) {
    const size_t pitch = (size_t)(PCAP + RING) * ROW;
    double t0 = 0;
    for (int i = 0; i <= REPS; i++) {
        if (i == 1 && !ok(k->stream_sync(s), "sync")) return -1;
        if (i == 1) t0 = flexdiag__now();
        flexdiag_status st = what == 1   ? k->copy_h2d_2d_async(dev, pitch, host, pitch, width, blocks, s)
                             : what == 2 ? k->copy_h2d_slots_async(r, s)
                                         : k->copy_h2d_async(dev, host, bytes, s);
        if (!ok(st, "copy")) return -1;
    }
    if (!ok(k->stream_sync(s), "sync")) return -1;
    return (flexdiag__now() - t0) / REPS;
}

int main(int argc, char **argv) {
    k = flexdiag__kernels_cuda();
    size_t fb = 0, tb = 0;
    if (!k || k->mem_info(&fb, &tb) != FLEXDIAG_OK) {
        fprintf(stderr, "bench_kv_copy: no CUDA device\n");
        return 77;
    }
    const int32_t seqs = argc > 1 ? atoi(argv[1]) : 512;
    const size_t blocks = (size_t)seqs * HKV, pitch = (size_t)(PCAP + RING) * ROW;
    const size_t bytes = blocks * pitch;
    flexdiag_stream *s = NULL;
    char *host = NULL;
    void *dev = NULL, *dslots = NULL, *dn = NULL;
    if (!ok(k->copy_stream_create(0, &s), "stream") ||
        !ok(k->host_alloc(bytes, (void **)&host), "host_alloc") ||
        !ok(k->mem_alloc(bytes, &dev), "mem_alloc"))
        return 1;
    for (size_t i = 0; i < bytes; i += 4096) host[i] = (char)i;
    printf("%d sequences x %d KV heads, blocks of %d + %d rows of %d B (%.2f GB in all)\n", seqs,
           HKV, PCAP, RING, ROW, bytes / 1e9);
    double t = timed(0, s, dev, host, 0, 0, NULL, bytes);
    printf("| one contiguous copy | %.2f GB | %.1f GB/s |\n", bytes / 1e9, bytes / t / 1e9);
    static const int widths[] = {1, 8, 29, 50, 64};
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) {
        size_t w = (size_t)widths[i] * ROW;
        t = timed(1, s, dev, host, w, blocks, NULL, 0);
        printf("| 2-D copy, rows of %zu B (%d KV rows) | %.3f GB | %.1f GB/s |\n", w, widths[i],
               w * blocks / 1e9, w * blocks / t / 1e9);
    }
    static const int attended[] = {29, 58, 144};
    for (size_t a = 0; a < sizeof attended / sizeof *attended; a++) {
        int32_t n = attended[a];
        int32_t *sl = malloc(blocks * (size_t)n * 4), *ns = malloc(blocks * 4);
        for (size_t b = 0; b < blocks; b++) { /* lags spread over the ring as Diagonal's are */
            ns[b] = n;
            for (int32_t j = 0; j < n; j++) sl[b * (size_t)n + (size_t)j] = (int32_t)((b * 7 + (size_t)j * 9) % RING);
        }
        if (!ok(k->mem_alloc(blocks * (size_t)n * 4, &dslots), "slots") ||
            !ok(k->mem_alloc(blocks * 4, &dn), "n_slots") ||
            !ok(k->copy_h2d(dslots, sl, blocks * (size_t)n * 4, s), "upload") ||
            !ok(k->copy_h2d(dn, ns, blocks * 4, s), "upload"))
            return 1;
        flexdiag_slot_rows r = {.dst = dev, .src = host, .pitch = pitch, .ring_off = PCAP * ROW,
                                .row_bytes = ROW, .slots = dslots, .n_slots = dn,
                                .max_slots = n, .n_seq = seqs, .h_kv = HKV};
        size_t moved = blocks * (size_t)n * ROW;
        t = timed(2, s, dev, host, 0, 0, &r, 0);
        printf("| slot gather, %d rows of %d B per block | %.3f GB | %.1f GB/s |\n", n, ROW,
               moved / 1e9, moved / t / 1e9);
        k->mem_free(dslots);
        k->mem_free(dn);
        free(sl);
        free(ns);
    }
    k->mem_free(dev);
    k->host_free(host);
    k->stream_destroy(s);
    return 0;
}
