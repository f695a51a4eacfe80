/*
 * bench_host_attn.c - the CPU attention's host kernel against the memory it reads, timed on
 * the host it runs on (run by hand: <build>/tests/cpu/bench_host_attn [threads [sequences [homes
 * [spinners [gap_us]]]]]; not a test).
 *
 * Janus-Pro-7B shapes (32 heads of 128, prompt 50, ring 576), one micro-batch of 32 sequences (or as given),
 * each with its own slot list (shared_slots 2, as the engine's position-only policies pass them),
 * its K and V homes mapped as the pinned pool maps them (anonymous mmap), once with 4 KiB
 * pages (MADV_NOHUGEPAGE) and once with transparent huge pages (MADV_HUGEPAGE). For each and
 * for 82, 338 and 626 attended rows per (sequence, head): the GB/s of KV the kernel reads
 * (flexdiag__host_attn_decode, bf16, RoPE on), and a plain 16-lane sum over the same bytes as
 * the memory's own ceiling. Best of 5 after one warm-up. With `homes`, the three cases again
 * over that many micro-batch homes in turn (a step of the engine: layers x micro-batches).
 * `spinners` threads busy-wait for the whole run, as the thread that drives a GPU does inside
 * cudaStreamSynchronize while the host attends (the CUDA runtime's default wait spins).
 * `gap_us` pauses that long before each home of the spread case, as the engine's host waits
 * for the next micro-batch's rows, and times the jobs alone (the engine's "host time"): with a
 * gap beyond the pool's poll the workers are asleep when each job arrives.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/core.h"
#include "kernels/cpu/cpu_stream.h"
#include "kernels/kernels.h"

#define MAX_SEQ 64
#define NSEQ_SPREAD 32
#define HKV 32
#define DH 128
#define PCAP 50
#define RING 576
#define REPS 5

typedef struct sum_job {
    const uint16_t *p;
    size_t per; /* elements per task */
    float *out;
} sum_job;

static void sum_task(void *ctx, int64_t t, void *scratch) {
    (void)scratch;
    const sum_job *j = ctx;
    const uint16_t *p = j->p + (size_t)t * j->per;
    uint32_t part[16] = {0};
    for (size_t i = 0; i + 16 <= j->per; i += 16)
        for (int l = 0; l < 16; l++) part[l] += p[i + l];
    uint32_t s = 0;
    for (int l = 0; l < 16; l++) s += part[l];
    j->out[t] = (float)s;
}

static void *map_home(size_t bytes, int huge) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    (void)madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    uint16_t *h = p;
    for (size_t i = 0; i < bytes / 2; i++) /* bf16 values in 2^-7 .. 2 */
        h[i] = (uint16_t)(0x3c00u + ((uint32_t)i * 2654435761u >> 22));
    return p;
}

static double best_of(flexdiag_status (*fn)(void *), void *arg) {
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = flexdiag__now();
        if (fn(arg) != FLEXDIAG_OK) return -1;
        double s = flexdiag__now() - t0;
        if (r > 0 && s < best) best = s;
    }
    return best;
}

typedef struct run {
    flexdiag_host_attn h;
    flexdiag_stream *cpu;
    sum_job sj;
    int64_t sum_tasks;
} run;

static flexdiag_status attn_once(void *arg) {
    run *r = arg;
    return flexdiag__host_attn_decode(&r->h, r->cpu);
}

static flexdiag_status sum_once(void *arg) {
    run *r = arg;
    FLEXDIAG_TRY(flexdiag__kernels_cpu()->stream_sync(r->cpu));
    return flexdiag__cpu_parallel_for(r->cpu, r->sum_tasks, 0, sum_task, &r->sj);
}

static void pause_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* The same kernel over `homes` micro-batch homes in turn (the engine's (layer, micro-batch)
 * homes of a step), 82, 338 and 626 rows each: GB/s over all of them, the page tables of a
 * large KV home included and nothing left in the caches from the previous home. */
static int spread(run *r, int homes, int32_t *n_slots, long gap_us) {
    size_t cache = (size_t)NSEQ_SPREAD * HKV * (PCAP + RING) * DH * 2, all = cache * (size_t)homes;
    char *kc = mmap(NULL, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *vc = mmap(NULL, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (kc == MAP_FAILED || vc == MAP_FAILED) return 1;
    (void)madvise(kc, all, MADV_HUGEPAGE);
    (void)madvise(vc, all, MADV_HUGEPAGE);
    memset(kc, 0x3c, all); /* bf16 0x3c3c: 0.0115 */
    memset(vc, 0x3c, all);
    int attended[] = {82, 338, PCAP + RING};
    for (int ai = 0; ai < 3; ai++) {
        for (int sq = 0; sq < NSEQ_SPREAD; sq++) /* the lists 0, 1, ... set by main cover it */
            n_slots[sq] = attended[ai] - PCAP;
        double s = 0;
        for (int i = 0; i < 2 * homes; i++) { /* two passes: the second is timed */
            r->h.k = kc + (size_t)(i % homes) * cache;
            r->h.v = vc + (size_t)(i % homes) * cache;
            if (gap_us > 0) pause_us(gap_us);
            double t0 = flexdiag__now();
            if (attn_once(r) != FLEXDIAG_OK) return 1;
            if (i >= homes) s += flexdiag__now() - t0;
        }
        double kv = 2.0 * NSEQ_SPREAD * HKV * attended[ai] * DH * 2 * homes;
        printf("2M    %5d %7.1f  (over %d homes, %.1f GB; %.0f us a home, %ld us apart)\n",
               attended[ai], kv / s / 1e9, homes, 2.0 * all / 1e9, s / homes * 1e6, gap_us);
    }
    munmap(kc, all);
    munmap(vc, all);
    return 0;
}

static atomic_int g_stop;

static void *spin_main(void *arg) {
    (void)arg;
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    }
    return NULL;
}

int main(int argc, char **argv) {
    int spinners = argc > 4 ? atoi(argv[4]) : 0;
    pthread_t spin[64];
    if (spinners < 0 || spinners > 64) return fprintf(stderr, "spinners: 0..64\n"), 2;
    for (int i = 0; i < spinners; i++)
        if (pthread_create(&spin[i], NULL, spin_main, NULL)) return 1;
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    int NSEQ = argc > 2 ? atoi(argv[2]) : 32;
    if (NSEQ < 1 || NSEQ > MAX_SEQ) return fprintf(stderr, "sequences: 1..%d\n", MAX_SEQ), 2;
    const flexdiag_kernels *k = flexdiag__kernels_cpu();
    run r = {0};
    if (k->stream_create(-1, threads, &r.cpu) != FLEXDIAG_OK) return 1;
    size_t block = (size_t)(PCAP + RING) * DH, cache = (size_t)NSEQ * HKV * block * 2;
    int32_t lp[MAX_SEQ], rows[MAX_SEQ * HKV], pos[MAX_SEQ], n_slots[MAX_SEQ];
    static int32_t slots[MAX_SEQ * RING]; /* one list per sequence: ring rows 0, 1, ... */
    for (int i = 0; i < MAX_SEQ * RING; i++) slots[i] = i % RING;
    uint16_t *qkv = calloc((size_t)NSEQ * 3 * HKV * DH, 2), *out = calloc((size_t)NSEQ * HKV * DH, 2);
    float *cs = calloc((size_t)NSEQ * DH, sizeof(float)), *sums = calloc(1 << 16, sizeof(float));
    for (int i = 0; i < NSEQ * 3 * HKV * DH; i++) qkv[i] = (uint16_t)(0x3c00u + (i % 97));
    for (int s = 0; s < NSEQ; s++) lp[s] = PCAP, pos[s] = PCAP + 100;
    printf("host attention, %d sequences x %d heads x %d, bf16; GB/s of KV read\n", NSEQ, HKV, DH);
    printf("pages  rows  kernel  plain-sum\n");
    for (int huge = 0; huge < 2; huge++) {
        uint16_t *kc = map_home(cache, huge), *vc = map_home(cache, huge);
        if (!kc || !vc || !qkv || !out || !cs || !sums) return 1;
        int attended[] = {82 - PCAP, 338 - PCAP, RING};
        for (int ai = 0; ai < 3; ai++) {
            int n = attended[ai];
            for (int sq = 0; sq < NSEQ; sq++) n_slots[sq] = n;
            for (int i = 0; i < NSEQ * HKV; i++) rows[i] = PCAP + (n > 0 ? n - 1 : 0);
            r.h = (flexdiag_host_attn){
                .out = out, .qkv = qkv, .k = kc, .v = vc, .rows = rows, .cs = cs, .act_bytes = 2,
                .a = {.n_seq = NSEQ, .h_q = HKV, .h_kv = HKV, .d_h = DH, .p_cap = PCAP,
                      .ring = RING, .scale = 0.088f, .lp = lp, .slots = slots,
                      .n_slots = n_slots, .max_slots = RING,
                      .shared_slots = FLEXDIAG_SLOTS_PER_SEQ, .pos = pos, .rope_theta = 10000.0f}};
            double kv = 2.0 * NSEQ * HKV * (PCAP + n) * DH * 2;
            double ta = best_of(attn_once, &r);
            /* the plain sum reads the same number of bytes from the start of K and V */
            r.sj = (sum_job){kc, (size_t)1 << 16, sums};
            r.sum_tasks = (int64_t)(kv / 2 / 2) >> 16;
            double tk = best_of(sum_once, &r);
            r.sj.p = vc;
            double tv = best_of(sum_once, &r);
            if (ta < 0 || tk < 0 || tv < 0) {
                fprintf(stderr, "bench_host_attn: %s\n", flexdiag__err_msg());
                return 1;
            }
            printf("%-5s %5d %7.1f %9.1f\n", huge ? "2M" : "4K", PCAP + n, kv / ta / 1e9,
                   kv / (tk + tv) / 1e9);
        }
        munmap(kc, cache);
        munmap(vc, cache);
    }
    int homes = argc > 3 ? atoi(argv[3]) : 0;
    long gap_us = argc > 5 ? atol(argv[5]) : 0;
    if (homes > 0 && NSEQ == NSEQ_SPREAD && spread(&r, homes, n_slots, gap_us)) return 1;
    k->stream_destroy(r.cpu);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < spinners; i++) pthread_join(spin[i], NULL);
    return 0;
}
