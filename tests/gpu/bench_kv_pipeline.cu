/*
 * bench_kv_pipeline.cu - the KV scheduler's two-buffer load pipeline (offload/sched_kv.c) in
 * isolation, with each way of moving a load, beside a forward that streams a layer's weights
 * from HBM as the decode GEMMs do (run by hand on a GPU host: <build>/tests/bench_kv_pipeline
 * [homes]; not a test).
 *
 * A decode step of Janus-Pro-7B shapes with 4 micro-batches of 32 sequences: 120 loads (30
 * layers x 4) of 66 rows of 256 bytes from each of 1024 (sequence, KV head) blocks of 626 rows,
 * K and V, rotating over `homes` micro-batch homes in one registered mapping (default 120:
 * 39 GB). Each load waits for its buffer's last write-back, the forward waits for the load, the
 * write-back (one row per block, D2H) waits for the forward: sched_kv.c's events. Prints ms per
 * step and the load rate for: a 1-CTA forward of 0.23 ms (the device otherwise idle), and a
 * forward reading 467 MB with every SM with the load as cudaMemcpy2DAsync, as one 1-D
 * cudaMemcpyAsync of the same bytes (what a contiguous layout would allow), as
 * cudaMemcpy3DBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute, as cudaMemcpyBatchAsync of
 * 2048 1-D copies, and as a gather kernel reading the mapped home with 32, 66 or 132 CTAs.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "bench_kv_pipeline: %s at line %d\n", cudaGetErrorString(e_),      \
                    __LINE__);                                                                 \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

enum { NBLK = 1024, SPAN = 626, ROW = 256, ROWS = 66, LOADS = 120 };
enum way { W2D, W1D, W3DBATCH, WBATCH1D, WGATHER, WNONE };

static __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static __global__ void hbm_read(const uint4 *__restrict__ w, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = w[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

static __global__ void gather(uint4 *__restrict__ dst, const uint4 *__restrict__ src,
                              size_t pitch, long rv, long total) {
    const long stride = (long)gridDim.x * blockDim.x;
    for (long f0 = (long)blockIdx.x * blockDim.x + threadIdx.x; f0 < total; f0 += stride * 8) {
        uint4 v[8];
        size_t o[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            long f = f0 + u * stride;
            if (f < total) o[u] = (size_t)(f / rv) * pitch + (size_t)(f % rv), v[u] = src[o[u]];
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (f0 + u * stride < total) dst[o[u]] = v[u];
    }
}

struct rig {
    char *home, *dhome, *dev, *buf;
    size_t half, pitch;
    int homes;
    uint4 *weights;
    unsigned *sink;
    long long spin_cycles;
    cudaStream_t comp, up, down;
    cudaEvent_t ready[2], used[2], stored[2], a, b;
    std::vector<void *> bd, bs;
    std::vector<size_t> bz;
};

static cudaError_t load(rig &r, enum way w, int ctas, char *d, char *h) {
    const size_t wb = (size_t)ROWS * ROW;
    for (int kv = 0; kv < 2 && w != WNONE; kv++) {
        char *dk = d + kv * r.half, *hk = h + kv * r.half;
        if (w == W2D)
            cudaMemcpy2DAsync(dk, r.pitch, hk, r.pitch, wb, NBLK, cudaMemcpyHostToDevice, r.up);
        else if (w == W1D)
            cudaMemcpyAsync(dk, hk, wb * NBLK, cudaMemcpyHostToDevice, r.up);
        else if (w == WGATHER)
            gather<<<ctas, 256, 0, r.up>>>((uint4 *)dk, (const uint4 *)(r.dhome + (hk - r.home)),
                                           r.pitch / 16, (long)(wb / 16), (long)(wb / 16) * NBLK);
    }
    if (w == W3DBATCH) {
        cudaMemcpy3DBatchOp op[2];
        memset(op, 0, sizeof op);
        for (int kv = 0; kv < 2; kv++) {
            op[kv].src.type = op[kv].dst.type = cudaMemcpyOperandTypePointer;
            op[kv].src.op.ptr.ptr = h + kv * r.half;
            op[kv].dst.op.ptr.ptr = d + kv * r.half;
            op[kv].src.op.ptr.rowLength = op[kv].dst.op.ptr.rowLength = r.pitch;
            op[kv].src.op.ptr.layerHeight = op[kv].dst.op.ptr.layerHeight = NBLK;
            op[kv].src.op.ptr.locHint.type = cudaMemLocationTypeHost;
            op[kv].dst.op.ptr.locHint.type = cudaMemLocationTypeDevice;
            op[kv].extent = make_cudaExtent(wb, NBLK, 1);
            op[kv].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            op[kv].flags = cudaMemcpyFlagPreferOverlapWithCompute;
        }
        return cudaMemcpy3DBatchAsync(2, op, 0, r.up);
    }
    if (w == WBATCH1D) {
        int n = 0;
        for (int kv = 0; kv < 2; kv++)
            for (int b = 0; b < NBLK; b++, n++) {
                r.bd[n] = d + kv * r.half + b * r.pitch;
                r.bs[n] = h + kv * r.half + b * r.pitch;
                r.bz[n] = wb;
            }
        cudaMemcpyAttributes at;
        memset(&at, 0, sizeof at);
        at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        at.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t idx = 0;
        return cudaMemcpyBatchAsync(r.bd.data(), r.bs.data(), r.bz.data(), (size_t)n, &at, &idx,
                                    1, r.up);
    }
    return cudaGetLastError();
}

/* Best ms per step of 3 after one warm-up. fwd: 0 none, 1 the 1-CTA spin, 2 HBM-bound. */
static int step_ms(rig &r, enum way w, int ctas, int fwd, float *best) {
    *best = 1e30f;
    for (int step = 0; step < 4; step++) {
        CK(cudaEventRecord(r.a, r.comp));
        for (int i = 0; i < LOADS; i++) {
            int x = i & 1;
            char *d = r.buf + (size_t)x * 2 * r.half, *h = r.home + (size_t)(i % r.homes) * 2 * r.half;
            CK(cudaStreamWaitEvent(r.up, r.stored[x], 0));
            CK(load(r, w, ctas, d, h));
            CK(cudaEventRecord(r.ready[x], r.up));
            CK(cudaStreamWaitEvent(r.comp, r.ready[x], 0));
            if (fwd == 1) spin<<<1, 32, 0, r.comp>>>(r.spin_cycles);
            if (fwd == 2) hbm_read<<<132 * 4, 512, 0, r.comp>>>(r.weights, (467u << 20) / 16, r.sink);
            CK(cudaEventRecord(r.used[x], r.comp));
            CK(cudaStreamWaitEvent(r.down, r.used[x], 0));
            for (int kv = 0; kv < 2; kv++) {
                size_t o = kv * r.half + (size_t)(ROWS - 1) * ROW;
                CK(cudaMemcpy2DAsync(h + o, r.pitch, d + o, r.pitch, ROW, NBLK,
                                     cudaMemcpyDeviceToHost, r.down));
            }
            CK(cudaEventRecord(r.stored[x], r.down));
        }
        CK(cudaStreamWaitEvent(r.comp, r.ready[(LOADS - 1) & 1], 0));
        CK(cudaEventRecord(r.b, r.comp));
        CK(cudaDeviceSynchronize());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, r.a, r.b));
        if (step > 0 && ms < *best) *best = ms;
    }
    return 0;
}

int main(int argc, char **argv) {
    rig r;
    r.homes = argc > 1 ? atoi(argv[1]) : LOADS;
    if (r.homes < 1) r.homes = 1;
    r.pitch = (size_t)SPAN * ROW;
    r.half = r.pitch * NBLK;
    size_t all = (size_t)r.homes * 2 * r.half;
    r.home = (char *)mmap(NULL, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r.home == MAP_FAILED) return fprintf(stderr, "bench_kv_pipeline: no host memory\n"), 1;
    (void)madvise(r.home, all, MADV_HUGEPAGE);
    CK(cudaHostRegister(r.home, all, cudaHostRegisterDefault));
    memset(r.home, 1, all);
    void *dh = NULL;
    CK(cudaHostGetDevicePointer(&dh, r.home, 0));
    r.dhome = (char *)dh;
    CK(cudaMalloc(&r.buf, 4 * r.half));
    CK(cudaMalloc(&r.weights, (size_t)467 << 20));
    CK(cudaMemset(r.weights, 0, (size_t)467 << 20));
    CK(cudaMalloc(&r.sink, 4));
    r.bd.resize(2 * NBLK), r.bs.resize(2 * NBLK), r.bz.resize(2 * NBLK);
    CK(cudaStreamCreateWithFlags(&r.comp, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&r.up, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&r.down, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        CK(cudaEventCreateWithFlags(&r.ready[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&r.used[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&r.stored[i], cudaEventDisableTiming));
        CK(cudaEventRecord(r.stored[i], r.down));
    }
    CK(cudaEventCreate(&r.a));
    CK(cudaEventCreate(&r.b));
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    r.spin_cycles = (long long)(0.23e-3 * khz * 1e3);
    struct { const char *name; enum way w; int ctas, fwd; } rows[] = {
        {"2-D copy, idle forward", W2D, 0, 1},   {"2-D copy, HBM forward", W2D, 0, 2},
        {"1-D copy, HBM forward", W1D, 0, 2},    {"3-D batch, HBM forward", W3DBATCH, 0, 2},
        {"1-D batch, HBM forward", WBATCH1D, 0, 2}, {"gather 32, HBM forward", WGATHER, 32, 2},
        {"gather 66, HBM forward", WGATHER, 66, 2}, {"gather 132, HBM forward", WGATHER, 132, 2},
        {"gather 66, no forward", WGATHER, 66, 0}, {"HBM forward alone", WNONE, 0, 2}};
    double gb = (double)LOADS * 2 * NBLK * ROWS * ROW / 1e9;
    printf("home %.1f GB in %d micro-batch homes; %d loads of %.1f MB a step\n", all / 1e9,
           r.homes, LOADS, gb / LOADS * 1e3);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        float ms = 0;
        if (step_ms(r, rows[i].w, rows[i].ctas, rows[i].fwd, &ms)) return 1;
        printf("%-26s %8.2f ms a step", rows[i].name, ms);
        if (rows[i].w != WNONE) printf("  %5.1f GB/s", gb / ms * 1e3);
        printf("\n");
    }
    return 0;
}
