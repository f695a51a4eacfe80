/*
 * matmul.cu - the one GEMM launcher of the CUDA backend: out (n, m) (+)= x (n, k) · W (m, k)ᵀ + b.
 *
 * Mapping to column-major BLAS: a row-major (r, c) matrix is a column-major (c, r) one. So
 * out (n, m) row-major is D = outᵀ (m × n, ld m), x (n, k) row-major is B = xᵀ (k × n, ld k),
 * and W (m, k) row-major is stored as a column-major (k × m, ld k) matrix whose transpose is
 * what we need: D = op(A)·B with A = W, op = T. That is a "TN" GEMM with M = m, N = n, K = k,
 * and the bias (one value per output feature) is one value per row of D — exactly what the
 * cuBLASLt BIAS epilogue broadcasts.
 *
 * Path: cuBLASLt with fp32 compute and fp32 scale, bf16 A/B, bf16 or fp32 C/D, beta = 1 for
 * FLEXDIAG_MM_ACCUM (C = D = out), the BIAS epilogue when out is bf16 (cuBLASLt wants the bias
 * in D's type, so fp32 outputs add the bf16 bias in a small kernel afterwards), the algorithm
 * from the heuristic limited to the stream workspace, to the actual pointer alignments (the
 * default assumes 256-byte alignment, which carved arena views need not have) and to split-K
 * reductions in fp32 (never in bf16). If the heuristic offers nothing (odd leading dimensions,
 * unsupported epilogue) the plan falls back to cublasGemmEx (+ the bias kernel), and k == 0
 * reduces to the bias kernel alone.
 *
 * Autotuning: the heuristic's first choice is often not the fastest for the skinny decode
 * GEMMs (n = a few dozen rows streaming a whole weight matrix), so when a plan is built outside
 * stream capture the heuristic's top MM_TUNE_ALGOS candidates are each timed on the call's own
 * operands and the fastest is kept. The output goes to scratch carved from the stream workspace,
 * so out and an ACCUM input are untouched and no memory outside the budget is taken; shapes whose
 * output does not fit there (the large prefill GEMMs) keep the first choice. The choice is a
 * timing, so two processes may pick different algorithms (and round differently);
 * FLEXDIAG_GEMM_TUNE=0 in the environment keeps the heuristic's first choice for run-to-run
 * reproducible bits. Plans built during graph capture are never timed. Tuning runs on the calling
 * stream and its workspace, so it needs nothing another stream holds.
 *
 * Plan cache: heuristic queries cost tens of microseconds and tuning milliseconds, so plans
 * (descriptors + algorithm) are kept per device, keyed by shape, flags, bias presence and pointer
 * alignments, and shared by every stream of the process; the runtime issues a handful of
 * distinct shapes, reused every layer and step. Streams may call matmul concurrently from
 * different host threads (two contexts, say). One mutex guards the cache and is held only to
 * look a key up and to publish a plan, never while a plan is built or a GEMM runs. A miss builds
 * (and tunes) its plan outside the lock, then publishes it, unless another thread published one
 * for the same key meanwhile: then that plan is used and the new one destroyed, so every stream
 * runs one algorithm per key and gets the same bits for the same inputs. Published plans are
 * immutable and never freed (the cache only grows, up to MM_CACHE_CAP plans per device, for the
 * life of the process), so no thread can lose a plan it is using; past the cap a call builds a
 * temporary plan (the heuristic's first choice, not timed) and destroys it after its GEMM. The
 * bias pointer is the one per-call part of a descriptor: a call with the bias epilogue sets it on
 * its own copy of the plan's matmul descriptor, never on the shared one.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

/* Plans kept per device: a decoder issues < 10 distinct GEMM shapes per phase (qkv, o, gate|up,
 * down, head; prefill and decode), so a few models and batch shapes stay far below 256. */
#define MM_CACHE_CAP 256
/* Autotuning: candidates asked of the heuristic, timed launches of each (the best counts, after
 * one untimed warm-up launch). */
#define MM_TUNE_ALGOS 32
#define MM_TUNE_REPS 3

typedef struct mm_key {
    int64_t n, k, m;  /* GEMM shape */
    unsigned flags;   /* FLEXDIAG_MM_* */
    int has_bias;     /* b != NULL */
    unsigned align;   /* log2 alignments (<= 256 B) of x, w, out, b: 4 bits each */
} mm_key;

typedef struct mm_plan {
    mm_key key;                 /* what this plan was built for */
    int use_lt;                 /* 1: cublasLtMatmul with algo; 0: cublasGemmEx */
    int lt_bias;                /* bias applied by the Lt epilogue (else by bias_kernel) */
    cublasLtMatmulDesc_t op;    /* compute / scale types, transposes, epilogue (bias pointer:
                                   the one of the call that built the plan) */
    cublasLtMatrixLayout_t la;  /* A = W: bf16 k × m, ld k */
    cublasLtMatrixLayout_t lb;  /* B = xᵀ: bf16 k × n, ld k */
    cublasLtMatrixLayout_t lc;  /* C = D = outᵀ: bf16 / fp32 m × n, ld m */
    cublasLtMatmulAlgo_t algo;  /* the heuristic's first choice, or the fastest when tuned */
} mm_plan;

typedef struct mm_cache {
    int device;                  /* CUDA ordinal whose streams share these plans */
    int n;                       /* published plans: plan[0 .. n-1] */
    mm_plan *plan[MM_CACHE_CAP]; /* published plans: immutable, kept for the process's life */
    struct mm_cache *next;       /* the next device's cache */
} mm_cache;

/* Guards mm_caches and every mm_cache's n and plan[] (not the plans: published ones are
 * immutable). */
static pthread_mutex_t mm_lock = PTHREAD_MUTEX_INITIALIZER;
/* One cache per device that has run a GEMM. */
static mm_cache *mm_caches;

/* ---- bias / fill kernel ---- */

static __device__ __forceinline__ float load_f(const float *p) { return *p; }
static __device__ __forceinline__ float load_f(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}
static __device__ __forceinline__ void store_f(float *p, float v) { *p = v; }
static __device__ __forceinline__ void store_f(__nv_bfloat16 *p, float v) {
    *p = __float2bfloat16_rn(v);
}

/* out (n, m) = (keep ? out : 0) + (b ? b : 0), fp32 math. */
template <typename T>
static __global__ void bias_kernel(T *__restrict__ out, const __nv_bfloat16 *__restrict__ b,
                                   int64_t n, int64_t m, int keep) {
    const int64_t total = n * m, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        float v = keep ? load_f(out + i) : 0.0f;
        if (b) v += __bfloat162float(b[i % m]);
        store_f(out + i, v);
    }
}

static flexdiag_status bias_launch(void *out, const uint16_t *b, int64_t n, int64_t m, int keep,
                                   int out_f32, cudaStream_t st) {
    const unsigned blocks = flexdiag__cuda_blocks(n * m, FLEXDIAG_CUDA_BLOCK);
    const __nv_bfloat16 *bb = (const __nv_bfloat16 *)b;
    if (out_f32)
        bias_kernel<float><<<blocks, FLEXDIAG_CUDA_BLOCK, 0, st>>>((float *)out, bb, n, m, keep);
    else
        bias_kernel<__nv_bfloat16><<<blocks, FLEXDIAG_CUDA_BLOCK, 0, st>>>(
            (__nv_bfloat16 *)out, bb, n, m, keep);
    FLEXDIAG_CUDA_LAUNCH_CHECK(st);
    return FLEXDIAG_OK;
}

/* ---- plans ---- */

/* log2 of the largest power of two (<= 256) dividing p's address. */
static unsigned align_log2(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned l = 0;
    while (l < 8 && !(a & ((uintptr_t)1 << l))) l++;
    return l;
}

static int key_eq(const mm_key *a, const mm_key *b) {
    return a->n == b->n && a->k == b->k && a->m == b->m && a->flags == b->flags &&
           a->has_bias == b->has_bias && a->align == b->align;
}

static void plan_release(mm_plan *p) {
    if (p->lc) (void)cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) (void)cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) (void)cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) (void)cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* Release and free a plan that was never published (or a temporary one); NULL is a no-op. */
static void plan_free(mm_plan *p) {
    if (!p) return;
    plan_release(p);
    free(p);
}

/* Set the transposes of the matmul descriptor op and, when lt_bias, the BIAS epilogue with bias
 * pointer b (bf16). */
static flexdiag_status op_configure(cublasLtMatmulDesc_t op, int lt_bias, const uint16_t *b) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FLEXDIAG_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    FLEXDIAG_CUBLAS_TRY(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (lt_bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        const int32_t bias_t = CUDA_R_16BF;
        FLEXDIAG_CUBLAS_TRY(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        FLEXDIAG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
            op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof bias_t));
        FLEXDIAG_CUBLAS_TRY(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
    }
    return FLEXDIAG_OK;
}

/* Create the descriptors of p for its key; epilogue BIAS (with bias b) when lt_bias. */
static flexdiag_status plan_describe(mm_plan *p, const uint16_t *b) {
    const mm_key *key = &p->key;
    const cudaDataType_t out_t = (key->flags & FLEXDIAG_MM_OUT_F32) ? CUDA_R_32F : CUDA_R_16BF;
    FLEXDIAG_CUBLAS_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    FLEXDIAG_TRY(op_configure(p->op, p->lt_bias, b));
    FLEXDIAG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, (uint64_t)key->k,
                                                   (uint64_t)key->m, key->k));
    FLEXDIAG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, (uint64_t)key->k,
                                                   (uint64_t)key->n, key->k));
    FLEXDIAG_CUBLAS_TRY(
        cublasLtMatrixLayoutCreate(&p->lc, out_t, (uint64_t)key->m, (uint64_t)key->n, key->m));
    return FLEXDIAG_OK;
}

/* The operands of the call a plan is built for (what autotuning times). */
typedef struct mm_operands {
    const void *x;     /* B: activations */
    const uint16_t *w; /* A: weights */
    const uint16_t *b; /* bias or NULL */
} mm_operands;

/* Whether plans built now may be timed: not while the stream is being captured into a graph
 * (a host sync there breaks the capture) and not when FLEXDIAG_GEMM_TUNE=0. */
static int tuning_allowed(flexdiag_stream *s) {
    const char *env = getenv("FLEXDIAG_GEMM_TUNE");
    if (env && !strcmp(env, "0")) return 0;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return cap == cudaStreamCaptureStatusNone;
}

/* Milliseconds of the best of MM_TUNE_REPS launches of algo into d (a scratch output), or
 * INFINITY when the algorithm fails to launch. */
static float time_algo(flexdiag_stream *s, mm_plan *p, const cublasLtMatmulAlgo_t *algo,
                       const mm_operands *o, void *d, size_t ws, cudaEvent_t ev[2]) {
    const float alpha = 1.0f, beta = (p->key.flags & FLEXDIAG_MM_ACCUM) ? 1.0f : 0.0f;
    float best = INFINITY;
    for (int r = 0; r <= MM_TUNE_REPS; r++) {
        if (cudaEventRecord(ev[0], s->stream) != cudaSuccess ||
            cublasLtMatmul(s->lt, p->op, &alpha, o->w, p->la, o->x, p->lb, &beta, d, p->lc, d,
                           p->lc, algo, s->workspace, ws, s->stream) != CUBLAS_STATUS_SUCCESS ||
            cudaEventRecord(ev[1], s->stream) != cudaSuccess ||
            cudaEventSynchronize(ev[1]) != cudaSuccess)
            return INFINITY;
        float ms = INFINITY;
        if (r > 0 && cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess && ms < best)
            best = ms;
    }
    return best;
}

/* Index of the fastest of the n candidates on the call's operands. The scratch output lives in
 * the stream workspace behind the largest workspace a timed candidate needs, so tuning stays
 * inside the memory budget: a candidate whose workspace does not fit beside the output is not
 * timed, and when that excludes the heuristic's first choice (large prefill outputs), or events
 * fail, the answer is 0. */
static int tune_pick(flexdiag_stream *s, mm_plan *p, const cublasLtMatmulHeuristicResult_t *res,
                     int n, const mm_operands *o) {
    const size_t elt = (p->key.flags & FLEXDIAG_MM_OUT_F32) ? 4 : 2;
    const size_t dbytes = (size_t)(p->key.n * p->key.m) * elt;
    size_t used = 0; /* workspace bytes the timed candidates may use; the output follows */
    for (int i = 0; i < n; i++)
        if (flexdiag__round256(res[i].workspaceSize) + dbytes <= s->workspace_bytes &&
            flexdiag__round256(res[i].workspaceSize) > used)
            used = flexdiag__round256(res[i].workspaceSize);
    if (flexdiag__round256(res[0].workspaceSize) + dbytes > s->workspace_bytes) return 0;
    void *d = (char *)s->workspace + used;
    cudaEvent_t ev[2] = {NULL, NULL};
    int pick = 0;
    if (cudaMemsetAsync(d, 0, dbytes, s->stream) == cudaSuccess &&
        cudaEventCreate(&ev[0]) == cudaSuccess && cudaEventCreate(&ev[1]) == cudaSuccess) {
        float best = INFINITY;
        for (int i = 0; i < n; i++) {
            if (flexdiag__round256(res[i].workspaceSize) > used) continue; /* cannot be timed */
            const float ms = time_algo(s, p, &res[i].algo, o, d, used, ev);
            if (ms < best) {
                best = ms;
                pick = i;
            }
        }
    }
    (void)cudaStreamSynchronize(s->stream);
    for (int i = 0; i < 2; i++)
        if (ev[i]) (void)cudaEventDestroy(ev[i]);
    (void)cudaGetLastError(); /* a failed candidate only means "not that one" */
    return pick;
}

/* Ask the heuristic for algorithms for p under the stream's workspace and the pointer
 * alignments of the key, and keep the first (or, when tune is set and tuning is allowed, the
 * fastest); *found = 0 when it has none (not an error: the caller falls back). */
static flexdiag_status plan_heuristic(flexdiag_stream *s, mm_plan *p, const mm_operands *o,
                                      int tune, int *found) {
    cublasLtMatmulPreference_t pref = NULL;
    FLEXDIAG_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = s->workspace_bytes;
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; /* fp32 split-K partials only */
    const uint32_t al_x = 1u << (p->key.align & 15), al_w = 1u << (p->key.align >> 4 & 15),
                   al_o = 1u << (p->key.align >> 8 & 15);
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *v;
        size_t size;
    } set[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws},
        {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_w, sizeof al_w},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_x, sizeof al_x},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_o, sizeof al_o},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_o, sizeof al_o},
    };
    cublasStatus_t e = CUBLAS_STATUS_SUCCESS;
    for (size_t i = 0; i < sizeof set / sizeof set[0] && e == CUBLAS_STATUS_SUCCESS; i++)
        e = cublasLtMatmulPreferenceSetAttribute(pref, set[i].attr, set[i].v, set[i].size);
    cublasLtMatmulHeuristicResult_t res[MM_TUNE_ALGOS];
    memset(res, 0, sizeof res);
    int n_res = 0;
    const int want = tune && tuning_allowed(s) ? MM_TUNE_ALGOS : 1;
    if (e == CUBLAS_STATUS_SUCCESS) {
        /* NOT_SUPPORTED (or any refusal) here only means "no Lt algorithm": fall back. */
        if (cublasLtMatmulAlgoGetHeuristic(s->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, want,
                                           res, &n_res) != CUBLAS_STATUS_SUCCESS)
            n_res = 0;
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    FLEXDIAG_CUBLAS_TRY(e);
    int usable = 0; /* candidates that succeeded and fit the workspace, compacted */
    for (int i = 0; i < n_res; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= ws)
            res[usable++] = res[i];
    *found = usable > 0;
    if (*found) p->algo = res[usable > 1 ? tune_pick(s, p, res, usable, o) : 0].algo;
    return FLEXDIAG_OK;
}

/* Build p for key: Lt with the bias epilogue if possible, then Lt without it, else GemmEx;
 * tune: time the candidates (when tuning is allowed). */
static flexdiag_status plan_build(flexdiag_stream *s, mm_plan *p, const mm_key *key,
                                  const mm_operands *o, int tune) {
    const int want_bias = key->has_bias && !(key->flags & FLEXDIAG_MM_OUT_F32);
    for (int attempt = want_bias ? 0 : 1; attempt < 2; attempt++) {
        plan_release(p);
        p->key = *key;
        p->lt_bias = attempt == 0;
        FLEXDIAG_TRY(plan_describe(p, o->b));
        int found = 0;
        FLEXDIAG_TRY(plan_heuristic(s, p, o, tune, &found));
        if (found) {
            p->use_lt = 1;
            return FLEXDIAG_OK;
        }
    }
    p->use_lt = 0;
    p->lt_bias = 0;
    return FLEXDIAG_OK;
}

/* ---- the shared plan cache ---- */

/* Under mm_lock: the cache of device, created on first use; NULL when out of host memory. */
static mm_cache *cache_of(int device) {
    for (mm_cache *c = mm_caches; c; c = c->next)
        if (c->device == device) return c;
    mm_cache *c = (mm_cache *)calloc(1, sizeof *c);
    if (!c) return NULL;
    c->device = device;
    c->next = mm_caches;
    mm_caches = c;
    return c;
}

/* Under mm_lock: the plan of c published for key, or NULL. */
static mm_plan *cache_find(const mm_cache *c, const mm_key *key) {
    for (int i = 0; i < c->n; i++)
        if (key_eq(&c->plan[i]->key, key)) return c->plan[i];
    return NULL;
}

/* The plan for key on s's device: the published one, or one built now (outside the lock) and
 * published unless another thread published one for key first, which is then used instead.
 * *tmp = 1 when the cache is full and the plan is the caller's, to plan_free after its GEMM. */
static flexdiag_status plan_get(flexdiag_stream *s, const mm_key *key, const mm_operands *o,
                                mm_plan **out, int *tmp) {
    *out = NULL;
    *tmp = 0;
    pthread_mutex_lock(&mm_lock);
    mm_cache *c = cache_of(s->device);
    mm_plan *hit = c ? cache_find(c, key) : NULL;
    const int full = c && c->n == MM_CACHE_CAP;
    pthread_mutex_unlock(&mm_lock);
    if (!c)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "cuda matmul: cannot allocate the plan cache (%zu bytes)",
                             sizeof(mm_cache));
    if (hit) {
        *out = hit;
        return FLEXDIAG_OK;
    }
    mm_plan *p = (mm_plan *)calloc(1, sizeof *p);
    if (!p)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "cuda matmul: cannot allocate a GEMM plan (%zu bytes)", sizeof *p);
    const flexdiag_status st = plan_build(s, p, key, o, !full); /* no timing for a temporary */
    if (st != FLEXDIAG_OK) {
        plan_free(p);
        return st;
    }
    int published = 0;
    pthread_mutex_lock(&mm_lock);
    hit = cache_find(c, key);
    if (!hit && c->n < MM_CACHE_CAP) {
        c->plan[c->n++] = p;
        published = 1;
    }
    pthread_mutex_unlock(&mm_lock);
    if (hit) {
        plan_free(p); /* another thread's plan for key won: every stream runs that one */
        *out = hit;
        return FLEXDIAG_OK;
    }
    *out = p;
    *tmp = !published;
    return FLEXDIAG_OK;
}

/* ---- launcher ---- */

/* Run the GEMM of plan p (without the bias unless the Lt epilogue adds it); p is read only. */
static flexdiag_status gemm_run(flexdiag_stream *s, const mm_plan *p, void *out, const void *x,
                                const uint16_t *w, const uint16_t *b) {
    const mm_key *key = &p->key;
    const float alpha = 1.0f, beta = (key->flags & FLEXDIAG_MM_ACCUM) ? 1.0f : 0.0f;
    if (p->use_lt) {
        /* The plan is shared: a call with the bias epilogue describes its own copy of the
         * matmul descriptor (in place, nothing to free) carrying its own bias pointer. */
        cublasLtMatmulDescOpaque_t call_op;
        cublasLtMatmulDesc_t op = p->op;
        if (p->lt_bias) {
            op = &call_op;
            FLEXDIAG_CUBLAS_TRY(cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            FLEXDIAG_TRY(op_configure(op, 1, b));
        }
        FLEXDIAG_CUBLAS_TRY(cublasLtMatmul(s->lt, op, &alpha, w, p->la, x, p->lb, &beta, out,
                                           p->lc, out, p->lc, &p->algo, s->workspace,
                                           s->workspace_bytes, s->stream));
        return FLEXDIAG_OK;
    }
    if (key->n > INT_MAX || key->k > INT_MAX || key->m > INT_MAX)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "cuda matmul: n = %lld, k = %lld, m = %lld: no cuBLASLt algorithm "
                             "and too large for cublasGemmEx (32-bit sizes): split the rows",
                             (long long)key->n, (long long)key->k, (long long)key->m);
    const cudaDataType_t out_t = (key->flags & FLEXDIAG_MM_OUT_F32) ? CUDA_R_32F : CUDA_R_16BF;
    FLEXDIAG_CUBLAS_TRY(cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)key->m, (int)key->n,
                                     (int)key->k, &alpha, w, CUDA_R_16BF, (int)key->k, x,
                                     CUDA_R_16BF, (int)key->k, &beta, out, out_t, (int)key->m,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return FLEXDIAG_OK;
}

/* out (n, m) bf16 or f32, x (n, k) bf16, w (m, k) bf16, b (m) bf16 or NULL */
extern "C" flexdiag_status flexdiag__cuda_matmul(void *out, const void *x, const uint16_t *w,
                                                 const uint16_t *b, int64_t n, int64_t k,
                                                 int64_t m, unsigned flags, flexdiag_stream *s) {
    if (n < 0 || k < 0 || m < 0 || (flags & ~(FLEXDIAG_MM_ACCUM | FLEXDIAG_MM_OUT_F32)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda matmul: n = %lld, k = %lld, m = %lld, flags = 0x%x: need sizes "
                             ">= 0 and only FLEXDIAG_MM_ACCUM | FLEXDIAG_MM_OUT_F32",
                             (long long)n, (long long)k, (long long)m, flags);
    if ((flags & FLEXDIAG_MM_ACCUM) && (flags & FLEXDIAG_MM_OUT_F32))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda matmul: FLEXDIAG_MM_ACCUM is for act outputs only, not with "
                             "FLEXDIAG_MM_OUT_F32");
    if (!s)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda matmul: no stream: the GEMM needs the cuBLAS handles of a "
                             "stream from stream_create");
    if (n == 0 || m == 0) return FLEXDIAG_OK;
    const int out_f32 = (flags & FLEXDIAG_MM_OUT_F32) != 0, keep = (flags & FLEXDIAG_MM_ACCUM) != 0;
    if (!out || (k > 0 && (!x || !w)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "cuda matmul: out %p, x %p, w %p: need device buffers", out, x,
                             (const void *)w);
    if (k == 0) return bias_launch(out, b, n, m, keep, out_f32, s->stream);

    const mm_key key = {n, k, m, flags, b != NULL,
                        align_log2(x) | align_log2(w) << 4 | align_log2(out) << 8 |
                            (b ? align_log2(b) : 0u) << 12};
    const mm_operands ops = {x, w, b};
    mm_plan *p = NULL;
    int tmp = 0;
    FLEXDIAG_TRY(plan_get(s, &key, &ops, &p, &tmp));
    const flexdiag_status st = gemm_run(s, p, out, x, w, b);
    const int bias_after = b && !p->lt_bias;
    if (tmp) plan_free(p); /* cublasLtMatmul has enqueued the GEMM: the descriptors may go */
    FLEXDIAG_TRY(st);
    if (bias_after) return bias_launch(out, b, n, m, 1, out_f32, s->stream);
    FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
    return FLEXDIAG_OK;
}
