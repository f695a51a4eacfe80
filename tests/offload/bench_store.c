/*
 * bench_store.c - micro-benchmark of the NVMe store (not a test): a store of SIZE GiB (default
 * 1) in DIR (default $TMPDIR or /tmp) is written, then read back, in requests of 1, 2, 4 and 8
 * MiB, all submitted as one batch so queue_depth (64) requests are in flight; once per backend
 * (io_uring where this kernel allows it, then the thread pool with 64 workers, the same depth).
 * Buffers are a registered 512 MiB staging slab (64 slots of 8 MiB, reused round robin: their
 * contents do not matter here). Prints one markdown row per (backend, request size).
 *
 *     bench_store [DIR [SIZE_GIB]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/core.h"
#include "offload/store.h"

#define MIB (1024ull * 1024ull)
#define QD 64

static double run(flexdiag_store *s, flexdiag_store_op op, uint64_t total, uint64_t req,
                  char *stage) {
    const int n = (int)(total / req);
    flexdiag_store_req *q = calloc((size_t)n, sizeof *q);
    for (int i = 0; i < n; i++)
        q[i] = (flexdiag_store_req){op, (uint64_t)i * req, req, stage + (size_t)(i % QD) * 8 * MIB};
    const double t0 = flexdiag__now();
    flexdiag_store_ticket t;
    flexdiag_status st = flexdiag__store_submit(s, q, n, &t);
    if (st == FLEXDIAG_OK) st = flexdiag__store_wait(s, t);
    const double dt = flexdiag__now() - t0;
    free(q);
    if (st != FLEXDIAG_OK) {
        fprintf(stderr, "bench_store: %s\n", flexdiag__err_msg());
        exit(1);
    }
    return (double)total / dt / 1e9;
}

int main(int argc, char **argv) {
    const char *tmp = getenv("TMPDIR");
    const char *dir = argc > 1 ? argv[1] : tmp && *tmp ? tmp : "/tmp";
    const uint64_t total = (uint64_t)((argc > 2 ? atof(argv[2]) : 1.0) * 1024) * MIB;
    char *stage = mmap(NULL, QD * 8 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
    if (stage == MAP_FAILED) return 1;
    memset(stage, 0x5A, QD * 8 * MIB);
    printf("| backend | file | buffers | request | write GB/s | read GB/s |\n");
    printf("|---|---|---|---|---|---|\n");
    const flexdiag_store_io ios[] = {FLEXDIAG_STORE_IO_URING, FLEXDIAG_STORE_IO_THREADS};
    for (int b = 0; b < 2; b++) {
        flexdiag_store_params p;
        flexdiag__store_params_init(&p);
        p.dir = dir;
        p.budget = total;
        p.io = ios[b];
        p.queue_depth = QD;
        p.io_threads = QD;
        p.name = "bench";
        flexdiag_store *s = NULL;
        if (flexdiag__store_create(&p, &s) != FLEXDIAG_OK) {
            fprintf(stderr, "bench_store: %s\n", flexdiag__err_msg());
            flexdiag__err_clear();
            continue;
        }
        flexdiag_store_buf sb = {stage, QD * 8 * MIB};
        (void)flexdiag__store_register_buffers(s, &sb, 1);
        (void)run(s, FLEXDIAG_STORE_WRITE, total, 8 * MIB, stage); /* allocate every block */
        for (uint64_t req = MIB; req <= 8 * MIB; req *= 2) {
            const double w = run(s, FLEXDIAG_STORE_WRITE, total, req, stage);
            const double r = run(s, FLEXDIAG_STORE_READ, total, req, stage);
            printf("| %s | %s | %s | %llu MiB | %.2f | %.2f |\n", flexdiag__store_backend(s),
                   flexdiag__store_direct(s) ? "O_DIRECT" : "buffered",
                   flexdiag__store_registered(s) ? "registered" : "plain",
                   (unsigned long long)(req / MIB), w, r);
        }
        if (flexdiag__store_note(s)[0]) printf("note: %s\n", flexdiag__store_note(s));
        flexdiag__store_destroy(s);
    }
    munmap(stage, QD * 8 * MIB);
    return 0;
}
