/*
 * bench_attn.cu - manual timing of the CUDA attn_decode op at the decode-bench shape (not a
 * test; run by hand on a GPU host: build-dir/tests/gpu/bench_attn).
 *
 * Shape: B = 64 / 128 / 222 sequences × 32 heads (MHA, Janus-Pro-7B), d_h 128, 50 prompt rows, a ring of
 * 576 rows attended densely (576 slots, ring order) and at 95 % sparsity (29 random slots), plus
 * the sparse case with logits_out / lse_out and a GQA (g = 4) row. Each row: 3 warm-up calls,
 * then 20 timed calls with CUDA events on the op's own stream, L2 flushed before each (memset
 * of twice the L2 size); the median is reported with the bytes the op must move (K/V rows, q,
 * out, slot lists, optional logits), GB/s and the fraction of 4.3 TB/s (device-to-device copy
 * rate measured on the H200). Inputs are random bf16, never zeros. A .cu file because it needs
 * the op's cudaStream_t (struct flexdiag_stream) for the events.
 */
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "core.h"
#include "cuda/cuda_common.cuh"
#include "kernels.h"

/* HBM bandwidth the fractions refer to: D2D copy rate measured on the H200 (bytes/s). */
#define BENCH_HBM_BPS 4.3e12
#define BENCH_WARMUP 3
#define BENCH_REPS 20

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
};

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* n random bf16 values, roughly N(0, 1)-sized (sum of uniforms), uploaded to a new buffer. */
static void *random_bf16(size_t n) {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; i++) {
        float f = 0;
        for (int k = 0; k < 4; k++) f += (float)(rng_next() >> 40) / (float)(1 << 24) - 0.5f;
        h[i] = flexdiag__f32_to_bf16(f * 1.7f);
    }
    void *d = NULL;
    BENCH_CHECK(cudaMalloc(&d, n * 2));
    BENCH_CHECK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
    return d;
}

static int32_t *upload_i32(const std::vector<int32_t> &h) {
    int32_t *d = NULL;
    BENCH_CHECK(cudaMalloc(&d, h.size() * 4));
    BENCH_CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
}

/* Time one row; prints a markdown table line. */
static void bench_one(const flexdiag_kernels *k, flexdiag_stream *s, const bench_row &r,
                      void *flush, size_t flush_bytes) {
    /* max_slots = the list length, as the engine passes its policy's longest list */
    const int B = r.B, d_h = 128, lp = 50, ring = 576, max_slots = r.n_slots;
    const size_t cache_n = (size_t)B * r.h_kv * (lp + ring) * d_h;
    const size_t qkv_n = (size_t)B * (r.h_q + 2 * r.h_kv) * d_h;
    void *kc = random_bf16(cache_n), *vc = random_bf16(cache_n), *qkv = random_bf16(qkv_n);
    void *out = NULL;
    BENCH_CHECK(cudaMalloc(&out, (size_t)B * r.h_q * d_h * 2));

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
    flexdiag_attn_args a = {B, r.h_q, r.h_kv, d_h, lp, ring, 1.0f / sqrtf((float)d_h), d_lp,
                            d_slots, d_ns, max_slots, logits, lse, 0, NULL, 0.0f, NULL, NULL, 0, 0,
                            NULL};

    cudaEvent_t e0, e1;
    BENCH_CHECK(cudaEventCreate(&e0));
    BENCH_CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int it = 0; it < BENCH_WARMUP + BENCH_REPS; it++) {
        BENCH_CHECK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, s->stream));
        BENCH_CHECK(cudaEventRecord(e0, s->stream));
        BENCH_OK(k->attn_decode(out, qkv, kc, vc, &a, s));
        BENCH_CHECK(cudaEventRecord(e1, s->stream));
        BENCH_CHECK(cudaEventSynchronize(e1));
        float t = 0;
        BENCH_CHECK(cudaEventElapsedTime(&t, e0, e1));
        if (it >= BENCH_WARMUP) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2] * 1e-3;
    /* bytes the op must move: K and V rows, q, out, slot lists (+ logits, lse) */
    const double keys = (double)B * r.h_kv * (lp + r.n_slots);
    double bytes = keys * 2 * d_h * 2 + 2.0 * B * r.h_q * d_h * 2;
    bytes += (double)B * r.h_kv * r.n_slots * 4;
    if (r.extras) bytes += (double)B * r.h_q * (r.n_slots + 1) * 4;
    printf("| %-28s | %8.1f | %8.2f | %8.1f | %5.1f %% | %8.2f | %8.2f |\n", r.name, bytes / 1e6,
           med * 1e6, bytes / med / 1e9, 100.0 * bytes / med / BENCH_HBM_BPS, ms.front() * 1e3,
           ms.back() * 1e3);

    BENCH_CHECK(cudaEventDestroy(e0));
    BENCH_CHECK(cudaEventDestroy(e1));
    void *bufs[] = {kc, vc, qkv, out, d_slots, d_ns, d_lp, logits, lse};
    for (void *p : bufs) BENCH_CHECK(cudaFree(p));
}

int main(void) {
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    flexdiag_stream *s = NULL;
    if (!k || k->stream_create(0, 0, &s) != FLEXDIAG_OK) {
        fprintf(stderr, "bench_attn: no usable CUDA device: %s\n", flexdiag_last_error(NULL));
        return 77;
    }
    cudaDeviceProp prop;
    BENCH_CHECK(cudaGetDeviceProperties(&prop, s->device));
    const size_t flush_bytes = 2 * (size_t)prop.l2CacheSize;
    void *flush = NULL;
    BENCH_CHECK(cudaMalloc(&flush, flush_bytes));
    printf("attn_decode on %s (%d SMs, L2 %d MiB): B sequences, d_h 128, lp 50, ring 576, median of "
           "%d (L2 flushed)\n\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
           BENCH_REPS);
    printf("| %-28s | %8s | %8s | %8s | %7s | %8s | %8s |\n", "case", "MB", "us", "GB/s",
           "of 4.3T", "min us", "max us");
    printf("|------------------------------|----------|----------|----------|---------|----------"
           "|----------|\n");
    const bench_row rows[] = {
        {"B64 MHA 32/32 dense (576)", 32, 32, 576, 0, 64},
        {"B64 MHA 32/32 sparse 95% (29)", 32, 32, 29, 0, 64},
        {"B64 MHA sparse + logits, lse", 32, 32, 29, 1, 64},
        {"B64 GQA 32/8 dense (576)", 32, 8, 576, 0, 64},
        {"B128 MHA 32/32 dense (576)", 32, 32, 576, 0, 128},
        {"B128 MHA 32/32 sparse (29)", 32, 32, 29, 0, 128},
        {"B222 MHA 32/32 dense (576)", 32, 32, 576, 0, 222},
        {"B222 MHA 32/32 sparse (29)", 32, 32, 29, 0, 222},
    };
    for (const bench_row &r : rows) bench_one(k, s, r, flush, flush_bytes);
    BENCH_CHECK(cudaFree(flush));
    k->stream_destroy(s);
    return 0;
}
