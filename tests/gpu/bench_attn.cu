/*
 * bench_attn.cu - manual timing of the CUDA attn_decode op at the decode-bench shape (not a
 * test; run by hand on a GPU host: build-dir/tests/gpu/bench_attn).
 *
 * Shape: B = 64 / 128 / 222 sequences × 32 heads (MHA, Janus-Pro-7B), d_h 128, 50 prompt rows, a ring of
 * 576 rows attended densely (576 slots, ring order) and at 95 % sparsity (29 random slots), plus
 * the sparse case with logits_out / lse_out and a GQA (g = 4) row; then the engine's shape with
 * shared prompt KV (CFG: every odd sequence reads one unconditional prompt block, the even ones
 * one of 4 prompts' blocks; ring-only caches) at 254 and 872 sequences (Janus-Pro-7B's largest
 * Diagonal batches at 48G and on a whole H200), sequence-major (FLEXDIAG_DEC_HEAD_MAJOR=0),
 * with the cascade (FLEXDIAG_CASCADE=1: each prompt block read once per tile of query rows) and
 * head-major (the default: the CTAs in flight read the prompt blocks of one head). Each row is timed three
 * ways, all with CUDA events on the op's own stream, median reported:
 *  - "wflush": one launch after an L2 flush by a memset of twice the L2 size (the usual flush),
 *    3 warm-up calls then 20 timed. The time includes the launch latency and the write-back of
 *    the dirty lines the memset leaves in L2 (up to the L2 size, ~14 us of HBM time on an
 *    H200, shared with the op): a fixed cost that weighs on short kernels.
 *  - "rflush": the same, but the flush reads twice the L2 size (a kernel), so L2 holds clean
 *    lines: one cold launch, launch latency included, no write-back.
 *  - "graph": how the engine runs it. One CUDA graph of BENCH_GRAPH_LAUNCHES back-to-back calls
 *    rotating over the input sets (caches, q, out; BENCH_SETS, or argv[2]), so no call finds
 *    its data in L2 (inputs rotated rather than L2 flushed between calls); 2 warm-up replays,
 *    10 timed; time per call = replay time / launches.
 *  - "gather us": the access pattern's ceiling, gather_rows over the same rows, timed as "graph"
 *    (the cascade rows: the rows of its layout, each list's ring rows and each prompt block
 *    once); "x gth" = graph / gather.
 * Bytes are what the op must move (K/V rows, q, out, slot lists, optional logits; a shared
 * prompt block once); GB/s and the
 * fraction of 4.3 TB/s (device-to-device copy rate measured on the H200) use the graph time.
 * Inputs are random bf16, never zeros. A .cu file because it needs the op's cudaStream_t
 * (struct flexdiag_stream) for the events and the capture.
 */
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "base/core.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/kernels.h"

/* HBM bandwidth the fractions refer to: D2D copy rate measured on the H200 (bytes/s). */
#define BENCH_HBM_BPS 4.3e12
#define BENCH_WARMUP 3
#define BENCH_REPS 20
/* Graph timing: input sets rotated (>= 3, so every call's data was evicted by two others of at
 * least 80 MB: the smallest row moves 84 MB, the H200's L2 is 60 MB), calls per graph, replays. */
#define BENCH_SETS 4
#define BENCH_MAX_SETS 16
#define BENCH_GRAPH_LAUNCHES 32
#define BENCH_GRAPH_REPS 10

#define BENCH_CHECK(x)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define BENCH_OK(x)                                                                                \
    do {                                                                                           \
        if ((x) != FLEXDIAG_OK) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, flexdiag_last_error(NULL)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One benchmark row. */
struct bench_row {
    const char *name;
    int h_q, h_kv; /* heads */
    int n_slots;   /* attended ring rows per (sequence, KV head) */
    int extras;    /* 1: logits_out and lse_out */
    int B;         /* sequences (CFG rows counted) */
    int n_pre;     /* 0: each sequence's prompt rows in its block; else shared prompt blocks */
    int cascade;   /* with n_pre: 1 = the cascade (FLEXDIAG_CASCADE=1), 0 = the plain kernel */
    int head_major; /* with n_pre: 1 = head-major CTAs (the default: one head of consecutive
                       sequences after another), 0 = FLEXDIAG_DEC_HEAD_MAJOR=0 */
};

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Fill x (n bf16) with values of about N(0, 1) size (a sum of 4 hashed uniforms, × 1.7) from
 * seed: on the device, since the 872-sequence rows hold billions of values. */
static __global__ void fill_random(uint16_t *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9e3779b1u ^ (uint32_t)(i >> 32) ^ seed;
        float f = 0;
        for (int k = 0; k < 4; k++) {
            h ^= h >> 16;
            h *= 0x7feb352du;
            h ^= h >> 15;
            h *= 0x846ca68bu;
            h ^= h >> 16;
            f += (float)(h >> 8) / (float)(1 << 24) - 0.5f;
        }
        x[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f * 1.7f));
    }
}

/* A new device buffer of n random bf16 (fill_random with seed). */
static void *random_bf16(size_t n, uint32_t seed) {
    void *d = NULL;
    BENCH_CHECK(cudaMalloc(&d, (n ? n : 1) * 2));
    fill_random<<<1024, 256>>>((uint16_t *)d, n, seed);
    BENCH_CHECK(cudaGetLastError());
    return d;
}

static int32_t *upload_i32(const std::vector<int32_t> &h) {
    int32_t *d = NULL;
    BENCH_CHECK(cudaMalloc(&d, h.size() * 4));
    BENCH_CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
}

/* L2 flush that leaves clean lines: read n 16-byte words, fold them into a value that is
 * stored only if it matches an impossible pattern (so the loads are not dropped). */
static __global__ void read_flush(const uint4 *__restrict__ x, size_t n, uint4 *sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 w = x[i];
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
    if (acc == 0x9e3779b9u && threadIdx.x == 1023) sink[0] = make_uint4(acc, 0, 0, 0);
}

/* The access pattern's ceiling: every 16-byte word of every K and V row a row's op call reads
 * (its prompt rows, from the shared prompt block when prefix is set, then its listed ring rows),
 * one word per thread of a flat grid, so nothing waits but the slot index and every word can be
 * in flight at once; folded into a value stored only if it matches an impossible pattern. The
 * op cannot beat this kernel's time on the same rows: "gather us" in the table. */
static __global__ void gather_rows(const uint4 *__restrict__ kc, const uint4 *__restrict__ vc,
                                   const uint4 *__restrict__ kp, const uint4 *__restrict__ vp,
                                   const int32_t *__restrict__ slots,
                                   const int32_t *__restrict__ prefix, int h_kv, int lp, int p_cap,
                                   int ring, int n_slots, int n_seq, int head_major,
                                   int64_t n_words, uint4 *sink) {
    constexpr int L = 16; /* words of a 128-wide bf16 row */
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n_words) return;
    const int64_t per = (int64_t)(lp + n_slots) * L, x = i / per;
    const int r = (int)(i - x * per), j = r / L, c = r - j * L;
    /* lists in the op's CTA order: sequence-major, or head-major (bench_row.head_major) */
    const int64_t sh = head_major ? (x % n_seq) * h_kv + x / n_seq : x;
    const int64_t blk = sh * (p_cap + ring) * L;
    uint4 kw, vw;
    if (j < lp && prefix) {
        const int64_t s = sh / h_kv, h = sh - s * h_kv;
        const int64_t o = ((__ldg(prefix + s) * h_kv + h) * lp + j) * L + c;
        kw = kp[o];
        vw = vp[o];
    } else {
        const int row = j < lp ? j : p_cap + __ldg(slots + sh * n_slots + (j - lp));
        kw = kc[blk + (int64_t)row * L + c];
        vw = vc[blk + (int64_t)row * L + c];
    }
    const uint32_t acc = kw.x ^ kw.y ^ kw.z ^ kw.w ^ vw.x ^ vw.y ^ vw.z ^ vw.w;
    if (acc == 0x9e3779b9u && threadIdx.x == 1023) sink[0] = make_uint4(acc, 0, 0, 0);
}

/* The L2 flush buffer and the device's multiprocessor count. */
struct bench_flush {
    void *buf;
    size_t bytes;
    int sms;
};

/* One input set of a row: caches, q (in qkv), out, and the prompt-only stores. */
struct bench_set {
    void *kc, *vc, *qkv, *out, *kp, *vp;
};

/* The shared prompt block of sequence s: odd sequences (unconditional CFG rows) block 0, even
 * ones the block of one of n_pre - 1 prompts. */
static int32_t bench_prefix(int s, int n_pre) { return s % 2 ? 0 : 1 + (s / 2) % (n_pre - 1); }

/* Median of the event time of fn() over reps runs after warm runs (ms). */
template <class F>
static double median_ms(cudaStream_t st, int warm, int reps, F fn) {
    cudaEvent_t e0, e1;
    BENCH_CHECK(cudaEventCreate(&e0));
    BENCH_CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int it = 0; it < warm + reps; it++) {
        fn(it, 0);
        BENCH_CHECK(cudaEventRecord(e0, st));
        fn(it, 1);
        BENCH_CHECK(cudaEventRecord(e1, st));
        BENCH_CHECK(cudaEventSynchronize(e1));
        float t = 0;
        BENCH_CHECK(cudaEventElapsedTime(&t, e0, e1));
        if (it >= warm) ms.push_back(t);
    }
    BENCH_CHECK(cudaEventDestroy(e0));
    BENCH_CHECK(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

/* One CUDA graph of BENCH_GRAPH_LAUNCHES back-to-back fn(set) calls rotating over n_sets
 * input sets, replayed (2 warm, BENCH_GRAPH_REPS timed): median ms per call. */
template <class F>
static double graph_call_ms(cudaStream_t st, int n_sets, F fn) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    BENCH_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < BENCH_GRAPH_LAUNCHES; i++) fn(i % n_sets);
    BENCH_CHECK(cudaStreamEndCapture(st, &graph));
    BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms = median_ms(st, 2, BENCH_GRAPH_REPS, [&](int, int timed) {
        if (timed) BENCH_CHECK(cudaGraphLaunch(exec, st));
    }) / BENCH_GRAPH_LAUNCHES;
    BENCH_CHECK(cudaGraphExecDestroy(exec));
    BENCH_CHECK(cudaGraphDestroy(graph));
    return ms;
}

/* Time one row both ways (file comment); prints a markdown table line and returns the times
 * (us per call: wflush, rflush, graph). */
struct bench_time {
    double wflush_us, rflush_us, graph_us;
};

static bench_time bench_one(const flexdiag_kernels *k, flexdiag_stream *s, const bench_row &r,
                            const bench_flush &fl, int n_sets) {
    /* max_slots = the list length, as the engine passes its policy's longest list */
    const int B = r.B, d_h = 128, lp = 50, ring = 576, max_slots = r.n_slots;
    const int p_cap = r.n_pre ? 0 : lp; /* shared prompt KV: ring-only blocks */
    const size_t cache_n = (size_t)B * r.h_kv * (p_cap + ring) * d_h;
    const size_t pre_n = (size_t)r.n_pre * r.h_kv * lp * d_h;
    const size_t qkv_n = (size_t)B * (r.h_q + 2 * r.h_kv) * d_h;
    /* the same random values in every set (timing does not depend on the values; the sets
     * differ in address, which is what keeps them out of each other's L2 lines) */
    bench_set sets[BENCH_MAX_SETS];
    for (int i = 0; i < n_sets; i++) {
        bench_set &b = sets[i];
        b.kc = random_bf16(cache_n, 1);
        b.vc = random_bf16(cache_n, 2);
        b.qkv = random_bf16(qkv_n, 3);
        BENCH_CHECK(cudaMalloc(&b.out, (size_t)B * r.h_q * d_h * 2));
        b.kp = r.n_pre ? random_bf16(pre_n, 4) : NULL;
        b.vp = r.n_pre ? random_bf16(pre_n, 5) : NULL;
    }
    BENCH_CHECK(cudaDeviceSynchronize()); /* the fills ran on the legacy stream */

    /* slot lists: dense = the ring in order; sparse = distinct random rows */
    std::vector<int32_t> slots((size_t)B * r.h_kv * max_slots), ns((size_t)B * r.h_kv, r.n_slots);
    std::vector<int32_t> perm(ring), lps(B, lp);
    for (size_t sh = 0; sh < ns.size(); sh++) {
        for (int i = 0; i < ring; i++) perm[i] = i;
        if (r.n_slots < ring)
            for (int i = ring - 1; i > 0; i--) std::swap(perm[i], perm[rng_next() % (i + 1)]);
        std::copy(perm.begin(), perm.begin() + max_slots, slots.begin() + sh * max_slots);
    }
    int32_t *d_slots = upload_i32(slots), *d_ns = upload_i32(ns), *d_lp = upload_i32(lps);
    float *logits = NULL, *lse = NULL;
    if (r.extras) {
        BENCH_CHECK(cudaMalloc(&logits, (size_t)B * r.h_q * max_slots * 4));
        BENCH_CHECK(cudaMalloc(&lse, (size_t)B * r.h_q * 4));
    }
    flexdiag_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_seq = B;
    a.h_q = r.h_q;
    a.h_kv = r.h_kv;
    a.d_h = d_h;
    a.p_cap = p_cap;
    a.ring = ring;
    a.scale = 1.0f / sqrtf((float)d_h);
    a.lp = d_lp;
    a.slots = d_slots;
    a.n_slots = d_ns;
    a.max_slots = max_slots;
    a.logits_out = logits;
    a.lse_out = lse;
    /* shared prompt KV: the prefix of each sequence and the cascade plan */
    std::vector<int32_t> pre(B), cseq(B);
    for (int i = 0; i < B; i++) pre[i] = r.n_pre ? bench_prefix(i, r.n_pre) : 0;
    const int32_t n_tiles = r.n_pre ? flexdiag__cascade_tiles(B, r.n_pre, r.h_q / r.h_kv) : 0;
    std::vector<int32_t> ctile((size_t)n_tiles * 3 + 1);
    int32_t *d_pre = NULL, *d_cseq = NULL, *d_ctile = NULL;
    if (r.n_pre) {
        flexdiag__cascade_plan(pre.data(), B, r.n_pre, r.h_q / r.h_kv, cseq.data(), ctile.data());
        d_pre = upload_i32(pre);
        d_cseq = upload_i32(cseq);
        d_ctile = upload_i32(ctile);
        a.prefix = d_pre;
        a.n_pre = r.n_pre;
        a.pre_cap = lp;
        a.casc_seq = d_cseq;
        a.casc_tile = d_ctile;
        a.n_casc_tiles = n_tiles;
    }
    setenv("FLEXDIAG_CASCADE", r.cascade ? "1" : "0", 1); /* read at each call */
    setenv("FLEXDIAG_DEC_HEAD_MAJOR", r.head_major ? "1" : "0", 1);
    auto call = [&](const bench_set &b) {
        a.k_pre = b.kp;
        a.v_pre = b.vp;
        BENCH_OK(k->attn_decode(b.out, b.qkv, b.kc, b.vc, &a, s));
    };

    /* wflush / rflush: one launch after an L2 flush by writes / by reads */
    const double wflush_ms = median_ms(s->stream, BENCH_WARMUP, BENCH_REPS, [&](int it, int timed) {
        if (!timed) BENCH_CHECK(cudaMemsetAsync(fl.buf, it & 0xff, fl.bytes, s->stream));
        else call(sets[0]);
    });
    const double rflush_ms = median_ms(s->stream, BENCH_WARMUP, BENCH_REPS, [&](int, int timed) {
        if (!timed) {
            read_flush<<<4 * fl.sms, 1024, 0, s->stream>>>((const uint4 *)fl.buf, fl.bytes / 16,
                                                          (uint4 *)fl.buf);
            BENCH_CHECK(cudaGetLastError());
        } else {
            call(sets[0]);
        }
    });

    /* graph: back-to-back calls over the rotating sets; the gather ceiling the same way */
    const double graph_ms = graph_call_ms(s->stream, n_sets, [&](int i) { call(sets[i]); });
    /* the cascade's layout: each list's ring rows, and each prompt block once */
    const int glp = r.cascade ? 0 : lp;
    const int64_t n_words = (int64_t)B * r.h_kv * (glp + r.n_slots) * 16;
    const int64_t n_pre_words = r.cascade ? (int64_t)r.n_pre * r.h_kv * lp * 16 : 0;
    const double gather_ms = graph_call_ms(s->stream, n_sets, [&](int i) {
        const bench_set &b = sets[i];
        gather_rows<<<(unsigned)((n_words + 255) / 256), 256, 0, s->stream>>>(
            (const uint4 *)b.kc, (const uint4 *)b.vc, (const uint4 *)b.kp, (const uint4 *)b.vp,
            d_slots, r.n_pre && !r.cascade ? d_pre : NULL, r.h_kv, glp, p_cap, ring, max_slots,
            B, r.head_major, n_words, (uint4 *)b.out);
        if (n_pre_words) /* the prompt-only store as lists of lp rows and no slots */
            gather_rows<<<(unsigned)((n_pre_words + 255) / 256), 256, 0, s->stream>>>(
                (const uint4 *)b.kp, (const uint4 *)b.vp, NULL, NULL, NULL, NULL, r.h_kv, lp, lp,
                0, 0, 1, 0, n_pre_words, (uint4 *)b.out);
        BENCH_CHECK(cudaGetLastError());
    });

    /* bytes the op must move: K and V rows (a shared prompt block once), q, out, slot lists
     * (+ logits, lse) */
    const double keys = (double)B * r.h_kv * (r.n_pre ? r.n_slots : lp + r.n_slots) +
                        (double)r.n_pre * r.h_kv * lp;
    double bytes = keys * 2 * d_h * 2 + 2.0 * B * r.h_q * d_h * 2;
    bytes += (double)B * r.h_kv * r.n_slots * 4;
    if (r.extras) bytes += (double)B * r.h_q * (r.n_slots + 1) * 4;
    const double sec = graph_ms * 1e-3;
    printf("| %-29s | %8.1f | %8.2f | %8.2f | %8.2f | %8.1f | %5.1f %% | %8.2f | %5.2f |\n",
           r.name, bytes / 1e6, wflush_ms * 1e3, rflush_ms * 1e3, graph_ms * 1e3,
           bytes / sec / 1e9, 100.0 * bytes / sec / BENCH_HBM_BPS, gather_ms * 1e3,
           graph_ms / gather_ms);

    for (int i = 0; i < n_sets; i++) {
        void *bufs[] = {sets[i].kc, sets[i].vc, sets[i].qkv, sets[i].out, sets[i].kp, sets[i].vp};
        for (void *p : bufs) BENCH_CHECK(cudaFree(p));
    }
    void *bufs[] = {d_slots, d_ns, d_lp, logits, lse, d_pre, d_cseq, d_ctile};
    for (void *p : bufs) BENCH_CHECK(cudaFree(p));
    return {wflush_ms * 1e3, rflush_ms * 1e3, graph_ms * 1e3};
}

int main(int argc, char **argv) {
    /* optional argument: run only the rows of at most this many sequences */
    const int max_b = argc > 1 ? atoi(argv[1]) : 1 << 30;
    const int n_sets = argc > 2 ? atoi(argv[2]) : BENCH_SETS;
    if (max_b < 1 || n_sets < 3 || n_sets > BENCH_MAX_SETS) {
        fprintf(stderr, "usage: bench_attn [MAX_B [SETS]]: MAX_B >= 1, SETS in 3..%d\n",
                BENCH_MAX_SETS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* rows appear as they finish */
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    flexdiag_stream *s = NULL;
    if (!k || k->stream_create(0, 0, &s) != FLEXDIAG_OK) {
        fprintf(stderr, "bench_attn: no usable CUDA device: %s\n", flexdiag_last_error(NULL));
        return 77;
    }
    cudaDeviceProp prop;
    BENCH_CHECK(cudaGetDeviceProperties(&prop, s->device));
    bench_flush fl = {NULL, 2 * (size_t)prop.l2CacheSize, prop.multiProcessorCount};
    BENCH_CHECK(cudaMalloc(&fl.buf, fl.bytes));
    BENCH_CHECK(cudaMemset(fl.buf, 0x5a, fl.bytes));
    printf("attn_decode on %s (%d SMs, L2 %d MiB): B sequences, d_h 128, lp 50, ring 576; us per "
           "call, medians: wflush / rflush = one launch after an L2 flush by writes / by reads "
           "(%d runs), graph = %d calls per graph over %d rotating input sets (%d replays); GB/s "
           "from graph\n\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
           BENCH_REPS, BENCH_GRAPH_LAUNCHES, n_sets, BENCH_GRAPH_REPS);
    printf("| %-29s | %8s | %8s | %8s | %8s | %8s | %7s | %8s | %5s |\n", "case", "MB",
           "wflush us", "rflush us", "graph us", "GB/s", "of 4.3T", "gather us", "x gth");
    printf("|-------------------------------|----------|----------|----------|----------|----------"
           "|---------|----------|-------|\n");
    const bench_row rows[] = {
        {"B64 MHA 32/32 dense (576)", 32, 32, 576, 0, 64, 0, 0, 0},
        {"B64 MHA 32/32 sparse 95% (29)", 32, 32, 29, 0, 64, 0, 0, 0},
        {"B64 MHA sparse + logits, lse", 32, 32, 29, 1, 64, 0, 0, 0},
        {"B64 GQA 32/8 dense (576)", 32, 8, 576, 0, 64, 0, 0, 0},
        {"B128 MHA 32/32 dense (576)", 32, 32, 576, 0, 128, 0, 0, 0},
        {"B128 MHA 32/32 sparse (29)", 32, 32, 29, 0, 128, 0, 0, 0},
        {"B222 MHA 32/32 dense (576)", 32, 32, 576, 0, 222, 0, 0, 0},
        {"B222 MHA 32/32 sparse (29)", 32, 32, 29, 0, 222, 0, 0, 0},
        {"B254 shared prompt, sparse", 32, 32, 29, 0, 254, 5, 0, 0},
        {"B254 shared prompt, cascade", 32, 32, 29, 0, 254, 5, 1, 0},
        {"B254 shared prompt, head-major", 32, 32, 29, 0, 254, 5, 0, 1},
        {"B872 shared prompt, sparse", 32, 32, 29, 0, 872, 5, 0, 0},
        {"B872 shared prompt, cascade", 32, 32, 29, 0, 872, 5, 1, 0},
        {"B872 shared prompt, head-major", 32, 32, 29, 0, 872, 5, 0, 1},
    };
    const int n_rows = (int)(sizeof rows / sizeof rows[0]);
    bench_time t[sizeof rows / sizeof rows[0]];
    for (int i = 0; i < n_rows; i++)
        t[i] = rows[i].B <= max_b ? bench_one(k, s, rows[i], fl, n_sets) : bench_time{0, 0, 0};
    /* sparse vs dense at the same batch: the MHA pairs (dense row, sparse row) */
    const int pairs[][2] = {{0, 1}, {4, 5}, {6, 7}};
    printf("\nsparse 95%% vs dense, time ratio (wflush / rflush / graph):");
    for (const auto &pr : pairs)
        if (rows[pr[0]].B <= max_b)
            printf("  B%d %.2fx / %.2fx / %.2fx", rows[pr[0]].B,
                   t[pr[0]].wflush_us / t[pr[1]].wflush_us, t[pr[0]].rflush_us / t[pr[1]].rflush_us,
                   t[pr[0]].graph_us / t[pr[1]].graph_us);
    printf("\n");
    BENCH_CHECK(cudaFree(fl.buf));
    k->stream_destroy(s);
    return 0;
}
