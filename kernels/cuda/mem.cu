/*
 * mem.cu - CUDA streams, device memory and copies of the op table, and the slow-path error
 * reporters behind FLEXDIAG_CUDA_TRY / FLEXDIAG_CUBLAS_TRY.
 *
 * stream_create makes the whole execution queue at once: a non-blocking stream, a cuBLAS and a
 * cuBLASLt handle bound to it and one FLEXDIAG_CUDA_WORKSPACE_BYTES (32 MiB) device workspace
 * that both libraries use (the runtime counts it in the GPU arena). copy_stream_create makes
 * the non-blocking stream alone (copies and events only: no handles, no device memory), in the
 * same struct, so stream_destroy, stream_sync, the copies and the events take either. The device
 * ordinal becomes current on the calling thread; ops and allocations run on the current device,
 * so a process that drives several devices must keep the right one current per thread.
 *
 * pci_bus_id reports a device's PCI address (cudaDeviceGetPCIBusId), which the offloading
 * scheduler maps to the NUMA node its pinned host memory should live on.
 *
 * Copies are cudaMemcpyAsync on the stream: host memory may be pageable (the driver then
 * stages it and the call may block). copy_d2h synchronises the stream before it returns because
 * the contract says the host buffer holds the data on return; copy_d2h_async does not, and
 * copy_h2d serves as copy_h2d_async (cudaMemcpyAsync never waits for a pinned source). No other
 * op waits for the device. A NULL stream means the legacy default stream (matmul excepted: it
 * needs the handles). Streams share nothing but the device: a process may create as many as it
 * needs and drive each from its own host thread.
 *
 * Host memory for asynchronous copies is pinned either by host_alloc (cudaHostAlloc) or, for
 * memory the caller already has, by host_register (cudaHostRegister); both count against the
 * locked-memory limit of the process (ulimit -l) where the driver enforces one.
 */
#include <stdio.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#include <stdlib.h>
#include <string.h>

/* ---- error slow paths ---- */

/* Device id for messages (-1 when even that query fails). */
static int current_device(void) {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) d = -1;
    return d;
}

extern "C" flexdiag_status flexdiag__cuda_fail(cudaError_t e, const char *stmt, const char *func,
                                               const char *file, int line) {
    /* Reset the non-sticky "last error" so the next launch check does not report it again. */
    (void)cudaGetLastError();
    flexdiag_status st = FLEXDIAG_ERR_CUDA;
    if (e == cudaErrorMemoryAllocation) st = FLEXDIAG_ERR_OOM_DEVICE;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) st = FLEXDIAG_ERR_UNSUPPORTED;
    return flexdiag__err(st, "cuda device %d: %s failed: %s (%s) in %s at %s:%d", current_device(),
                         stmt, cudaGetErrorString(e), cudaGetErrorName(e), func, file, line);
}

extern "C" flexdiag_status flexdiag__cublas_fail(cublasStatus_t e, const char *stmt,
                                                 const char *func, const char *file, int line) {
    flexdiag_status st = e == CUBLAS_STATUS_ALLOC_FAILED ? FLEXDIAG_ERR_OOM_DEVICE
                                                         : FLEXDIAG_ERR_CUDA;
    return flexdiag__err(st, "cuda device %d: %s failed: %s (status %d) in %s at %s:%d",
                         current_device(), stmt, cublasGetStatusString(e), (int)e, func, file,
                         line);
}

/* ---- streams ---- */

/* Fail unless device names one of the visible devices; UNSUPPORTED when there are none. The
 * message is the short reason the runtime's one-line CPU fallback warning quotes; the driver
 * detail (error name, driver and runtime versions, what to check) is logged at debug level. */
static flexdiag_status check_device(int device) {
    int count = 0, drv = 0, rtv = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaDriverGetVersion(&drv); /* 0 when no driver is loaded */
        (void)cudaRuntimeGetVersion(&rtv);
        FLEXDIAG_LOG(FLEXDIAG_LOG_DEBUG, "cuda: cudaGetDeviceCount failed: %s (%s); driver "
                     "supports CUDA %d.%d, runtime is %d.%d: check the NVIDIA driver and "
                     "CUDA_VISIBLE_DEVICES", cudaGetErrorString(e), cudaGetErrorName(e),
                     drv / 1000, drv % 1000 / 10, rtv / 1000, rtv % 1000 / 10);
        const char *why = e != cudaErrorInsufficientDriver ? cudaGetErrorString(e)
                          : drv ? "the NVIDIA driver is older than this build's CUDA runtime"
                                : "no NVIDIA driver";
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "%s", why);
    }
    if (count == 0)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "no CUDA device visible: check "
                             "CUDA_VISIBLE_DEVICES");
    if (device < 0 || device >= count)
        return flexdiag__err(FLEXDIAG_ERR_CUDA,
                             "cuda: device %d requested but %d device(s) visible: pass a device "
                             "ordinal in 0..%d, or runtime_params.device -1",
                             device, count, count - 1);
    return FLEXDIAG_OK;
}

/* Create the stream of s on the current device, and with blas its handles and workspace. */
static flexdiag_status stream_init(flexdiag_stream *s, int blas) {
    FLEXDIAG_CUDA_TRY(cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount,
                                             s->device));
    FLEXDIAG_CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    if (!blas) return FLEXDIAG_OK;
    FLEXDIAG_CUBLAS_TRY(cublasCreate(&s->blas));
    FLEXDIAG_CUBLAS_TRY(cublasSetStream(s->blas, s->stream));
    /* Split-K partial sums in fp32 only, never in the bf16 output type. */
    const int math = CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    FLEXDIAG_CUBLAS_TRY(cublasSetMathMode(s->blas, (cublasMath_t)math));
    FLEXDIAG_CUBLAS_TRY(cublasLtCreate(&s->lt));
    s->workspace_bytes = FLEXDIAG_CUDA_WORKSPACE_BYTES;
    FLEXDIAG_TRY(flexdiag__cuda_mem_alloc(s->workspace_bytes, &s->workspace));
    FLEXDIAG_CUBLAS_TRY(cublasSetWorkspace(s->blas, s->workspace, s->workspace_bytes));
    return FLEXDIAG_OK;
}

/* How a host thread waits for the current device: FLEXDIAG_CUDA_WAIT=spin, yield or block sets
 * it (cudaSetDeviceFlags); unset, CUDA's default stays (with one context and more cores than
 * contexts: spin). A spinning wait holds a core for as long as the device runs, which host
 * work beside it (CPU attention, the store's threads, PNG writing) then shares; the switch is
 * for measuring that. An unknown value is an error naming the variable. */
static flexdiag_status wait_mode(void) {
    const char *env = getenv("FLEXDIAG_CUDA_WAIT");
    if (!env || !*env) return FLEXDIAG_OK;
    static const struct { const char *name; unsigned flag; } modes[] = {
        {"spin", cudaDeviceScheduleSpin}, {"yield", cudaDeviceScheduleYield},
        {"block", cudaDeviceScheduleBlockingSync}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(env, modes[i].name)) {
            FLEXDIAG_CUDA_TRY(cudaSetDeviceFlags(modes[i].flag));
            return FLEXDIAG_OK;
        }
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                         "FLEXDIAG_CUDA_WAIT=%s: give spin, yield or block, or unset it", env);
}

/* A stream on device (made current); with blas the compute queue, else a copy queue. */
static flexdiag_status stream_new(int device, int blas, flexdiag_stream **out) {
    *out = NULL;
    FLEXDIAG_TRY(check_device(device));
    FLEXDIAG_CUDA_TRY(cudaSetDevice(device));
    FLEXDIAG_TRY(wait_mode());
    flexdiag_stream *s = (flexdiag_stream *)calloc(1, sizeof *s);
    if (!s)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cuda: cannot allocate a stream (%zu bytes)",
                             sizeof *s);
    s->device = device;
    flexdiag_status st = stream_init(s, blas);
    if (st != FLEXDIAG_OK) {
        flexdiag__cuda_stream_destroy(s);
        return st;
    }
    *out = s;
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_stream_create(int device, int threads,
                                                        flexdiag_stream **out) {
    (void)threads; /* CPU workers: nothing to do on a GPU queue */
    return stream_new(device, 1, out);
}

extern "C" flexdiag_status flexdiag__cuda_copy_stream_create(int device, flexdiag_stream **out) {
    if (!out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda copy_stream_create: out is NULL");
    return stream_new(device, 0, out);
}

/* Frees a compute stream or a copy queue (whose blas, lt and workspace are NULL). */
extern "C" void flexdiag__cuda_stream_destroy(flexdiag_stream *s) {
    if (!s) return;
    if (s->stream) (void)cudaStreamSynchronize(s->stream);
    if (s->lt) (void)cublasLtDestroy(s->lt);
    if (s->blas) (void)cublasDestroy(s->blas);
    flexdiag__cuda_mem_free(s->workspace);
    if (s->stream) (void)cudaStreamDestroy(s->stream);
    (void)cudaGetLastError();
    free(s);
}

extern "C" flexdiag_status flexdiag__cuda_stream_sync(flexdiag_stream *s) {
    FLEXDIAG_CUDA_TRY(cudaStreamSynchronize(flexdiag__cuda_st(s)));
    return FLEXDIAG_OK;
}

/* ---- memory ---- */

extern "C" flexdiag_status flexdiag__cuda_mem_alloc(size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return FLEXDIAG_OK;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaSuccess) return FLEXDIAG_OK;
    *out = NULL;
    (void)cudaGetLastError();
    if (e != cudaErrorMemoryAllocation) FLEXDIAG_CUDA_TRY(e);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    return flexdiag__err(FLEXDIAG_ERR_OOM_DEVICE,
                         "cuda device %d: cannot allocate %zu bytes (%.2f MiB): %zu bytes "
                         "(%.2f MiB) free of %zu: lower runtime_params.gpu_mem, the batch size "
                         "or the context",
                         current_device(), bytes, bytes / 1048576.0, free_b, free_b / 1048576.0,
                         total_b);
}

extern "C" void flexdiag__cuda_mem_free(void *p) {
    if (!p) return;
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        FLEXDIAG_WARN("cuda device %d: cudaFree(%p) failed: %s", current_device(), p,
                      cudaGetErrorString(e));
    }
}

extern "C" flexdiag_status flexdiag__cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    FLEXDIAG_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return FLEXDIAG_OK;
}

extern "C" void flexdiag__cuda_device_name(const flexdiag_stream *s, char *out, size_t n) {
    cudaDeviceProp prop;
    if (n == 0) return;
    if (!s || cudaGetDeviceProperties(&prop, s->device) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out, n, "cuda");
        return;
    }
    snprintf(out, n, "%s", prop.name);
}

/* Longest PCI address cudaDeviceGetPCIBusId writes, NUL included (it documents 13 bytes for
 * "dddd:bb:dd.f"; room for a wider domain). */
#define PCI_BUS_ID_MAX 64

extern "C" int flexdiag__cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

extern "C" flexdiag_status flexdiag__cuda_pci_bus_id(int device, char *out, size_t n) {
    if (!out || n == 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda pci_bus_id: out is %s",
                             out ? "0 bytes" : "NULL");
    out[0] = '\0';
    FLEXDIAG_TRY(check_device(device));
    char id[PCI_BUS_ID_MAX] = {0};
    FLEXDIAG_CUDA_TRY(cudaDeviceGetPCIBusId(id, (int)sizeof id - 1, device));
    const size_t len = strlen(id);
    if (len >= n)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda pci_bus_id: device %d's id \"%s\" needs %zu bytes, out has %zu",
                             device, id, len + 1, n);
    memcpy(out, id, len + 1);
    return FLEXDIAG_OK;
}

/* ---- copies ---- */

extern "C" flexdiag_status flexdiag__cuda_copy_h2d(void *dst, const void *src, size_t bytes,
                                                   flexdiag_stream *s) {
    if (bytes == 0) return FLEXDIAG_OK;
    FLEXDIAG_CUDA_TRY(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, flexdiag__cuda_st(s)));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_copy_d2h(void *dst, const void *src, size_t bytes,
                                                   flexdiag_stream *s) {
    if (bytes == 0) return FLEXDIAG_OK;
    cudaStream_t st = flexdiag__cuda_st(s);
    FLEXDIAG_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st));
    FLEXDIAG_CUDA_TRY(cudaStreamSynchronize(st));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_copy_d2h_async(void *dst, const void *src, size_t bytes,
                                                         flexdiag_stream *s) {
    if (bytes == 0) return FLEXDIAG_OK;
    FLEXDIAG_CUDA_TRY(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, flexdiag__cuda_st(s)));
    return FLEXDIAG_OK;
}

static flexdiag_status copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t rows, cudaMemcpyKind kind,
                               flexdiag_stream *s) {
    if (width == 0 || rows == 0) return FLEXDIAG_OK;
    if (!dst || !src || dpitch < width || spitch < width)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda 2-D copy of %zu rows of %zu bytes: %s", rows, width,
                             !dst || !src ? "a pointer is NULL" : "a pitch is below the width");
    if (kind == cudaMemcpyHostToDevice &&
        flexdiag__cuda_gather_2d(dst, dpitch, src, spitch, width, rows, s)) {
        FLEXDIAG_CUDA_LAUNCH_CHECK(flexdiag__cuda_st(s));
        return FLEXDIAG_OK;
    }
    FLEXDIAG_CUDA_TRY(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind,
                                        flexdiag__cuda_st(s)));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_copy_h2d_2d(void *dst, size_t dpitch, const void *src,
                                                      size_t spitch, size_t width, size_t rows,
                                                      flexdiag_stream *s) {
    return copy_2d(dst, dpitch, src, spitch, width, rows, cudaMemcpyHostToDevice, s);
}

extern "C" flexdiag_status flexdiag__cuda_copy_d2h_2d(void *dst, size_t dpitch, const void *src,
                                                      size_t spitch, size_t width, size_t rows,
                                                      flexdiag_stream *s) {
    return copy_2d(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToHost, s);
}

extern "C" flexdiag_status flexdiag__cuda_copy_d2d(void *dst, const void *src, size_t bytes,
                                                   flexdiag_stream *s) {
    if (bytes == 0) return FLEXDIAG_OK;
    FLEXDIAG_CUDA_TRY(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, flexdiag__cuda_st(s)));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_memset0(void *dst, size_t bytes, flexdiag_stream *s) {
    if (bytes == 0) return FLEXDIAG_OK;
    FLEXDIAG_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, flexdiag__cuda_st(s)));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_host_fn(flexdiag_stream *s, flexdiag_host_fn *fn,
                                                 void *arg) {
    FLEXDIAG_CUDA_TRY(cudaLaunchHostFunc(flexdiag__cuda_st(s), fn, arg));
    return FLEXDIAG_OK;
}

/* ---- page-locked host staging ---- */

extern "C" flexdiag_status flexdiag__cuda_host_alloc(size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return FLEXDIAG_OK;
    cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocDefault);
    if (e == cudaSuccess) return FLEXDIAG_OK;
    *out = NULL;
    (void)cudaGetLastError();
    return flexdiag__err(FLEXDIAG_ERR_OOM_PINNED,
                         "cuda: cannot pin %zu bytes of host memory (%s): check ulimit -l",
                         bytes, cudaGetErrorString(e));
}

extern "C" void flexdiag__cuda_host_free(void *p) {
    if (p) (void)cudaFreeHost(p);
}

extern "C" flexdiag_status flexdiag__cuda_host_register(void *p, size_t bytes) {
    if (bytes == 0) return FLEXDIAG_OK;
    if (!p)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda host_register of %zu bytes: p is NULL",
                             bytes);
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) return FLEXDIAG_OK;
    (void)cudaGetLastError();
    if (e == cudaErrorHostMemoryAlreadyRegistered)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda host_register: %zu bytes at %p: (part of) this range is "
                             "already registered: host_unregister it first",
                             bytes, p);
    return flexdiag__err(FLEXDIAG_ERR_OOM_PINNED,
                         "cuda host_register: cannot pin %zu bytes (%.2f MiB) of host memory at "
                         "%p (%s): raise ulimit -l (the locked-memory limit) or pin less",
                         bytes, bytes / 1048576.0, p, cudaGetErrorString(e));
}

extern "C" flexdiag_status flexdiag__cuda_host_unregister(void *p) {
    if (!p) return FLEXDIAG_OK;
    FLEXDIAG_CUDA_TRY(cudaHostUnregister(p));
    return FLEXDIAG_OK;
}

/* ---- CUDA graphs: the engine records one decode step and replays it ---- */

extern "C" flexdiag_status flexdiag__cuda_graph_begin(flexdiag_stream *s) {
    FLEXDIAG_CUDA_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_graph_end(flexdiag_stream *s, void **graph) {
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamEndCapture(s->stream, &g);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
    if (g) (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return flexdiag__err(FLEXDIAG_ERR_CUDA, "cuda: recording a launch graph failed: %s",
                             cudaGetErrorString(e));
    }
    *graph = exec;
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_graph_launch(void *graph, flexdiag_stream *s) {
    FLEXDIAG_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)graph, s->stream));
    return FLEXDIAG_OK;
}

extern "C" void flexdiag__cuda_graph_destroy(void *graph) {
    if (graph) (void)cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
