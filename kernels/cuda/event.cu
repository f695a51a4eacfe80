/*
 * event.cu - events of the CUDA op table (kernels.h event_*, stream_wait_event): a cudaEvent_t
 * without timing (cudaEventDisableTiming: the cheapest kind, what cross-stream ordering needs),
 * created on the device of the stream it is made for.
 *
 * record and wait never block the host; event_sync is cudaEventSynchronize and event_query
 * cudaEventQuery. Both record and wait are capturable into a launch graph: a record inside a
 * capture makes a captured event that streams waiting on it join the capture with (CUDA's
 * fork/join across streams), and a wait inside a capture on an event last recorded outside it
 * becomes an external event wait node (cudaEventWaitExternal), which CUDA requires for such an
 * event, so each replay of the graph waits for that event's latest record. The event remembers
 * whether its most recent record was captured to choose between the two.
 */
#include <atomic>
#include <new>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

struct flexdiag_event {
    cudaEvent_t ev;            /* created with cudaEventDisableTiming on device */
    int device;                /* CUDA ordinal of ev */
    std::atomic<int> captured; /* 1: the most recent record was inside a stream capture (flag;
                                  written by the recording thread, read by waiting ones) */
};

/* Whether st is being captured into a graph now. */
static flexdiag_status capturing(cudaStream_t st, int *yes) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    FLEXDIAG_CUDA_TRY(cudaStreamIsCapturing(st, &cap));
    *yes = cap == cudaStreamCaptureStatusActive;
    return FLEXDIAG_OK;
}

/* Create e->ev on e->device, with prev the calling thread's current device, which is current
 * again on return whatever happens. */
static flexdiag_status event_make(flexdiag_event *e, int prev) {
    if (e->device != prev) FLEXDIAG_CUDA_TRY(cudaSetDevice(e->device));
    const cudaError_t made = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (made != cudaSuccess) e->ev = NULL;
    const cudaError_t back = e->device != prev ? cudaSetDevice(prev) : cudaSuccess;
    if (made != cudaSuccess)
        return flexdiag__cuda_fail(made, "cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming)",
                                   __func__, __FILE__, __LINE__);
    FLEXDIAG_CUDA_TRY(back);
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_event_create(flexdiag_stream *s, flexdiag_event **out) {
    if (!out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda event_create: out is NULL");
    *out = NULL;
    int prev = 0;
    FLEXDIAG_CUDA_TRY(cudaGetDevice(&prev));
    flexdiag_event *e = new (std::nothrow) flexdiag_event();
    if (!e)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "cuda event_create: out of host memory");
    e->device = s ? s->device : prev;
    const flexdiag_status st = event_make(e, prev);
    if (st != FLEXDIAG_OK) {
        flexdiag__cuda_event_destroy(e);
        return st;
    }
    *out = e;
    return FLEXDIAG_OK;
}

extern "C" void flexdiag__cuda_event_destroy(flexdiag_event *e) {
    if (!e) return;
    if (e->ev && cudaEventDestroy(e->ev) != cudaSuccess) (void)cudaGetLastError();
    delete e;
}

extern "C" flexdiag_status flexdiag__cuda_event_record(flexdiag_event *e, flexdiag_stream *s) {
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda event_record: event is NULL");
    const cudaStream_t st = flexdiag__cuda_st(s);
    int cap = 0;
    FLEXDIAG_TRY(capturing(st, &cap));
    FLEXDIAG_CUDA_TRY(cudaEventRecord(e->ev, st));
    e->captured.store(cap, std::memory_order_release);
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_stream_wait_event(flexdiag_stream *s,
                                                            flexdiag_event *e) {
    if (!e)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda stream_wait_event: event is NULL");
    const cudaStream_t st = flexdiag__cuda_st(s);
    int cap = 0;
    FLEXDIAG_TRY(capturing(st, &cap));
    const unsigned flags = cap && !e->captured.load(std::memory_order_acquire)
                               ? cudaEventWaitExternal
                               : cudaEventWaitDefault;
    FLEXDIAG_CUDA_TRY(cudaStreamWaitEvent(st, e->ev, flags));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_event_sync(flexdiag_event *e) {
    if (!e) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda event_sync: event is NULL");
    FLEXDIAG_CUDA_TRY(cudaEventSynchronize(e->ev));
    return FLEXDIAG_OK;
}

extern "C" flexdiag_status flexdiag__cuda_event_query(flexdiag_event *e, int *done) {
    if (!e || !done)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "cuda event_query: %s is NULL",
                             e ? "done" : "event");
    const cudaError_t q = cudaEventQuery(e->ev);
    if (q == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* "not yet" is an answer, not an error to report later */
        *done = 0;
        return FLEXDIAG_OK;
    }
    if (q != cudaSuccess)
        return flexdiag__cuda_fail(q, "cudaEventQuery(e->ev)", __func__, __FILE__, __LINE__);
    *done = 1;
    return FLEXDIAG_OK;
}
