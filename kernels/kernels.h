/*
 * kernels.h - the backend op table: the only way the runtime touches a device.
 *
 * One struct of function pointers, filled with designated initialisers by kernels/cpu
 * (flexdiag__kernels_cpu_ref(): scalar reference ops, fp32 activations; flexdiag__kernels_cpu():
 * the same plus the multi-threaded fast paths) and kernels/cuda (flexdiag__kernels_cuda(): bf16
 * activations, cuBLAS GEMMs). The runtime runs one orchestration path over whichever table the
 * registry hands it; the only #if on CUDA lives in registry.c.
 *
 * Data conventions (all pointers are device pointers of the backend; host memory on the CPU):
 *   weights      bf16 (uint16_t), Linear [out, in] row-major, y = x·Wᵀ + b;
 *   activations  "act": fp32 on the CPU backends (the oracle computes in fp32), bf16 on CUDA;
 *                act_bytes gives the element size, the runtime never reads them directly;
 *                the image decoder's tensors are not act but fp32 on every backend;
 *   logits       fp32; ids and positions int32.
 * A qkv row holds [q heads (h_q·d_h) | k heads (h_kv·d_h) | v heads (h_kv·d_h)].
 * KV cache: per (sequence s, KV head h) a block of p_cap prompt rows then `ring` decode rows,
 * each d_h act elements; row r of (s, h) is at ((s·h_kv + h)·(p_cap + ring) + r)·d_h. Keys are
 * stored after RoPE at absolute positions and never re-rotated.
 * Every op returns flexdiag_status and takes the stream (execution queue) last (stream_wait_event,
 * whose subject is the stream, takes it first). Each op's signature and contract are declared
 * once, as the function type flexdiag_op_<op> below; the table holds pointers to those types.
 *
 * Streams and events: a process may run several streams at once (a compute stream per context,
 * copy streams of an offloading scheduler); work on one stream runs in order, and events order
 * work across streams (event_record on the producer, stream_wait_event on the consumer) without
 * blocking the host.
 */
#ifndef FLEXDIAG_KERNELS_H
#define FLEXDIAG_KERNELS_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_KERNELS
#error "kernels/kernels.h: a lower layer may not use kernels/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An execution queue: CUDA stream + cuBLAS handle + workspace, or a CPU thread pool; a copy
 * queue (copy_stream_create) is a CUDA stream alone, or one CPU worker thread. */
typedef struct flexdiag_stream flexdiag_stream;
/* A completion marker recorded into a stream (cudaEvent_t, or a CPU completion object). */
typedef struct flexdiag_event flexdiag_event;

/* matmul flags */
#define FLEXDIAG_MM_ACCUM 1u   /* out += x·Wᵀ (+ b) instead of out = ... (act output only) */
#define FLEXDIAG_MM_OUT_F32 2u /* out is fp32 whatever act is */

typedef struct flexdiag_sample_params {
    float temperature; /* > 0; softmax(l / T) */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* >= 1 = off; keep the smallest prefix (by prob desc) with mass >= top_p */
    uint64_t seed;     /* draw for row i at step t keyed by (seed, req0 + i, t) */
    int32_t id0;       /* added to every drawn column: the id of column 0 (a head that computes
                          a slice of the vocabulary, e.g. Chameleon's image codes); 0 = none */
} flexdiag_sample_params;

/* How the slot lists of an attention call are shared (flexdiag_attn_args shared_slots). */
enum {
    FLEXDIAG_SLOTS_PER_HEAD = 0, /* one list per (sequence, KV head) */
    FLEXDIAG_SLOTS_ONE = 1,      /* one list for every (sequence, KV head) */
    FLEXDIAG_SLOTS_PER_SEQ = 2,  /* one list per sequence, shared by its KV heads */
};

/* Shapes and per-sequence metadata of one attention call (host struct, device pointers). */
typedef struct flexdiag_attn_args {
    int32_t n_seq;         /* sequences in this call (a micro-batch, CFG rows included) */
    int32_t h_q, h_kv;     /* query heads, KV heads; h_q % h_kv == 0 */
    int32_t d_h;           /* head dim */
    int32_t p_cap;         /* prompt rows reserved per (seq, KV head) */
    int32_t ring;          /* decode ring rows per (seq, KV head) */
    float scale;           /* logit scale, 1/sqrt(d_h) */
    const int32_t *lp;     /* (n_seq) valid prompt rows of each sequence */
    /* decode only */
    const int32_t *slots;  /* (n_seq, h_kv, max_slots) ring rows attended (0..ring-1) */
    const int32_t *n_slots; /* (n_seq, h_kv) valid entries of slots */
    int32_t max_slots;     /* stride of slots / logits_out */
    float *logits_out;     /* (optional) (n_seq, h_q, max_slots) fp32 scaled logits of the
                              attended ring rows, in slot-list order */
    float *lse_out;        /* (optional) (n_seq, h_q) fp32 log-sum-exp over the whole attended row
                              (prompt + ring): p = exp(logit - lse) */
    int32_t shared_slots;  /* how the lists are shared (FLEXDIAG_SLOTS_*): 0 one list per
                              (sequence, KV head) as above; 1 ONE list, slots (max_slots) and
                              n_slots (1), that every (sequence, KV head) attends; 2 one list
                              per sequence, slots (n_seq, max_slots) and n_slots (n_seq), that
                              all its KV heads attend (position-only policies with sequences at
                              their own steps) */
    /* kv_append only (the attention ops ignore them) */
    const int32_t *pos;    /* (optional) (n_tok) absolute positions of the appended tokens:
                              RoPE is applied before the append; NULL = plain copy */
    float rope_theta;      /* RoPE base (> 0) when pos is set */
    /* decode only: policy scores */
    float *probs_out;      /* (optional) (n_seq, h_q, max_slots) fp32 p = expf(logit - lse) of the
                              attended ring rows, slot-list order (0 when lse = -inf): the
                              probability epilogue of H2O/TOVA/ALISA (docs/policies.md §4.3) */
    /* (optional) Diagonal's build-up update fused into decode attention (docs/policies.md §2.3
     * step 4, §4.3). diag_lag holds one lag list of diag_a entries per (sequence, KV head)
     * (n_seq, h_kv, diag_a), in the order kernels.h diag_slots keeps it: the slot list of
     * (s, h) is diag_base sink slots, then ring column c (diag_base <= c < n_slots) holding
     * list entry e = n_slots - 1 - c. After attention, the entry e < n_slots - diag_base
     * minimising (score, -lag[e]), score = max over the g query heads of the group of the fp32
     * logit of column c, is replaced: lag[e] = diag_next[s]. diag_next (n_seq) is backend
     * memory, one int32 per sequence of the call (sequences sit at their own steps): the new
     * lag of sequence s's lists, or a negative value when s is not at a build-up step (its
     * lists are left as they are). Being device data, a recorded graph replays every step.
     * Needs per-(sequence, KV head) lists (shared_slots 0); backends that fuse it only for
     * small groups say so in diag_max_group. */
    int16_t *diag_lag;
    int32_t diag_a, diag_base;
    const int32_t *diag_next;
    /* decode only: shared prompt KV (optional). With prefix set, sequence s reads its lp[s]
     * prompt rows from prefix block prefix[s] (0 <= prefix[s] < n_pre) of k_pre / v_pre, laid
     * out (n_pre, h_kv, pre_cap, d_h) like a cache of prompt-only blocks, and the op's k / v
     * hold ring-only blocks: p_cap must be 0 and lp[s] <= pre_cap. Sequences with the same
     * prompt row (the CFG rows of every image of one prompt, the unconditional rows of a block)
     * then keep one copy of it. kv_append and attn_prefill ignore these fields (the prompt rows
     * are written and attended through a prompt-only view: k = k_pre, ring 0). */
    const int32_t *prefix;
    const void *k_pre, *v_pre;
    int32_t n_pre, pre_cap;
    /* decode with prefix, optional: the cascade plan (flexdiag__cascade_plan). casc_seq
     * (n_seq) lists the sequences grouped by prefix block, casc_tile (n_casc_tiles, 3) the
     * groups cut into tiles {prefix block, first entry of casc_seq, sequences} of at most
     * FLEXDIAG_CASCADE_ROWS query rows, then padding tiles of 0 sequences. A backend may then
     * attend each prefix block once per tile (CUDA does when the prompts are shared by two
     * sequences or more on average); the CPU backends ignore it. n_casc_tiles depends on the
     * shapes only (flexdiag__cascade_tiles), so a recorded graph replays any block's plan. */
    const int32_t *casc_seq, *casc_tile;
    int32_t n_casc_tiles;
    /* decode only: query rows per sequence (0 or 1: one; a multi-token window pass: several).
     * With win > 1, qkv and out hold n_seq·win rows, row q = s·win + i being the i-th query of
     * sequence s; row q reads sequence s's block (its lp[s] prompt rows, or prefix[s]) and the
     * slot list of virtual sequence q: flexdiag__slot_list(a, q, h), so the lists, n_slots and
     * logits_out / lse_out / probs_out rows are indexed by q as if there were n_seq·win
     * sequences. Causality inside the window is the lists' business (row i's list names the
     * ring rows of the window's rows 0..i, which kv_append wrote before). No Diagonal fusion
     * (diag_lag NULL) and no cascade (n_casc_tiles 0) with win > 1. */
    int32_t win;
} flexdiag_attn_args;

/* Query rows per sequence of a decode call (kernels.h flexdiag_attn_args win). */
static inline int32_t flexdiag__attn_win(const flexdiag_attn_args *a) {
    return a->win > 1 ? a->win : 1;
}

/* The slot list (index into n_slots; times max_slots into slots) of (sequence s of the call,
 * KV head h) under a's sharing. */
static inline int64_t flexdiag__slot_list(const flexdiag_attn_args *a, int64_t s, int32_t h) {
    return a->shared_slots == FLEXDIAG_SLOTS_ONE      ? 0
           : a->shared_slots == FLEXDIAG_SLOTS_PER_SEQ ? s
                                                       : s * a->h_kv + h;
}

/* Query rows (sequences x h_q / h_kv) of one cascade tile. */
#define FLEXDIAG_CASCADE_ROWS 16

/* Tiles a cascade plan of n_seq sequences over n_pre prefix blocks holds (every grouping fits
 * it), with g = h_q / h_kv query heads per KV head; 0 when g > FLEXDIAG_CASCADE_ROWS (no
 * cascade). */
int32_t flexdiag__cascade_tiles(int32_t n_seq, int32_t n_pre, int32_t g);

/* The cascade plan of prefix[0..n_seq) (host memory, values clamped to [0, n_pre)): seq
 * (n_seq) and tile (flexdiag__cascade_tiles(...) x 3), padding included. */
void flexdiag__cascade_plan(const int32_t *prefix, int32_t n_seq, int32_t n_pre, int32_t g,
                            int32_t *seq, int32_t *tile);

/* ======== op types: each op's signature and contract, declared once ========
 * The table below holds pointers to these types, and the backends declare their implementations
 * with them (`flexdiag_op_matmul flexdiag__cpu_ref_matmul;`), so a definition that drifts from
 * its slot fails to compile. */

/* ---- streams, events and memory ---- */

/* Create an execution queue; threads = CPU workers (0 = all cores), device = CUDA ordinal.
 * A process may hold any number of streams, on one device or several; each is driven by one
 * host thread at a time, and different streams run independently (events order them). */
typedef flexdiag_status flexdiag_op_stream_create(int device, int threads, flexdiag_stream **out);
/* Wait for s's work, then free it; NULL is a no-op. */
typedef void flexdiag_op_stream_destroy(flexdiag_stream *s);
/* Wait until all work queued on s is done. */
typedef flexdiag_status flexdiag_op_stream_sync(flexdiag_stream *s);
/* Create a copy queue on device: an execution queue for data movement only, which an
 * offloading scheduler runs beside the compute streams (weights copied in while compute runs).
 * Valid on it: the five copies, memset0, event_record, stream_wait_event, stream_sync and
 * stream_destroy, with their usual contracts; compute ops (everything else that takes a
 * stream) are a programming error. It holds no device bytes (CUDA: a non-blocking stream
 * without cuBLAS handles or workspace), so stream_bytes does not apply to it. CPU: one worker
 * thread runs its items in order, so the async copies overlap the caller's work there too. */
typedef flexdiag_status flexdiag_op_copy_stream_create(int device, flexdiag_stream **out);

/* Events: a completion marker recorded into a stream, the way one stream waits for another
 * without the host. An event that was never recorded is complete. Recording again replaces the
 * event's state; a wait or sync concerns the most recent record at the time of its call. One
 * event may be recorded on one thread and waited on or synchronised on others.
 * Inside a launch graph's capture (graph_begin .. graph_end) event_record and stream_wait_event
 * are captured (CUDA: cudaEventRecord / cudaStreamWaitEvent are capturable): a record and a
 * wait inside the capture order the streams captured into that graph (a stream that waits on an
 * event recorded inside the capture joins it and must be joined back to the capturing stream,
 * by a record there and a wait on the capturing stream, before graph_end); a wait on an event
 * last recorded outside the capture becomes a wait node of the graph, so every replay waits for
 * that event's latest record. An event recorded inside a capture belongs to that capture: no
 * event_sync or event_query on it, and no wait on it from outside the capture or inside
 * another one, until it is recorded again outside. */
/* Create an event on the device of s (a CPU event for the CPU backends; s may be NULL there). */
typedef flexdiag_status flexdiag_op_event_create(flexdiag_stream *s, flexdiag_event **out);
/* Free e; NULL is a no-op. No thread may be waiting on e; records of e and waits on it still
 * queued on a stream (a copy queue, a CUDA stream) run as if e were alive. */
typedef void flexdiag_op_event_destroy(flexdiag_event *e);
/* Record e on s: e completes when all work queued on s before this call is done. Does not
 * block the host. */
typedef flexdiag_status flexdiag_op_event_record(flexdiag_event *e, flexdiag_stream *s);
/* Work queued on s after this call waits until e (its most recent record) completes. Does not
 * block the host on CUDA; a synchronous CPU stream waits on the host (event_sync). */
typedef flexdiag_status flexdiag_op_stream_wait_event(flexdiag_stream *s, flexdiag_event *e);
/* The host waits until e (its most recent record) completes. */
typedef flexdiag_status flexdiag_op_event_sync(flexdiag_event *e);
/* *done = 1 when e (its most recent record) has completed, else 0; never blocks. */
typedef flexdiag_status flexdiag_op_event_query(flexdiag_event *e, int *done);

/* Device memory (64-byte aligned at least); bytes == 0 gives NULL. */
typedef flexdiag_status flexdiag_op_mem_alloc(size_t bytes, void **out);
/* Free memory of mem_alloc; NULL is a no-op. */
typedef void flexdiag_op_mem_free(void *p);
/* Copies of bytes from src to dst, ordered on s (the direction is the slot's: copy_h2d, ...);
 * the ranges must not overlap; bytes == 0 does nothing.
 *   copy_h2d, copy_d2h, copy_d2d: host memory need not be pinned (then the call may block);
 *     copy_d2h synchronises: dst holds the data when it returns.
 *   copy_h2d_async, copy_d2h_async: never synchronise the host; the copy is done when an event
 *     recorded on s after it completes (or stream_sync(s) returns), and until then src must not
 *     change and dst must not be read. On CUDA the host side must be pinned (host_alloc or
 *     host_register) for the copy to overlap anything: from pageable memory CUDA stages it and
 *     the call may block (device to pageable host memory: until the copy is done). */
typedef flexdiag_status flexdiag_op_copy(void *dst, const void *src, size_t bytes,
                                         flexdiag_stream *s);
/* rows copies of width bytes: row r from src + r·spitch to dst + r·dpitch (pitches >= width),
 * asynchronous as copy_h2d_async / copy_d2h_async (one DMA of strided rows on CUDA). */
typedef flexdiag_status flexdiag_op_copy_2d(void *dst, size_t dpitch, const void *src,
                                            size_t spitch, size_t width, size_t rows,
                                            flexdiag_stream *s);
/* The ring rows a decode attention reads (kernels.h slot lists), host -> device, asynchronous
 * as copy_h2d_async. Both sides hold n_seq·h_kv blocks of pitch bytes, block b = s·h_kv + h;
 * for i < n_slots[b] the row_bytes bytes at ring_off + slots[b·max_slots + i]·row_bytes of
 * src's block b go to the same offset of dst's. The slot lists are backend memory, read when
 * the copy runs (so another stream may write them first, ordered by an event); src is pinned
 * host memory (host_alloc or host_register). CUDA gathers with one kernel reading src over the
 * bus (no host work, any row size that is a multiple of 16 bytes); the CPU backends copy. */
typedef struct flexdiag_slot_rows {
    void *dst;
    const void *src;
    size_t pitch, ring_off, row_bytes;
    const int32_t *slots, *n_slots;
    int32_t max_slots, n_seq, h_kv;
} flexdiag_slot_rows;
typedef flexdiag_status flexdiag_op_copy_h2d_slots(const flexdiag_slot_rows *r, flexdiag_stream *s);
/* Run fn(arg) on the host once the work queued on s before this call is done; work queued
 * on s after it waits until fn returns. Valid on copy queues (copy_stream_create). fn runs on a
 * thread of the backend (CUDA: a driver thread, cudaLaunchHostFunc; CPU: the queue's worker), so
 * it must not call ops on any stream of a device backend and reports failures through arg. */
typedef void flexdiag_host_fn(void *arg);
typedef flexdiag_status flexdiag_op_host_fn(flexdiag_stream *s, flexdiag_host_fn *fn, void *arg);
/* Zero bytes of dst, ordered on s. */
typedef flexdiag_status flexdiag_op_memset0(void *dst, size_t bytes, flexdiag_stream *s);
/* (optional) free and total device bytes; default: unknown (CPU) */
typedef flexdiag_status flexdiag_op_mem_info(size_t *free_bytes, size_t *total_bytes);
/* (optional) name of s's device ("NVIDIA H200", the CPU's model name) into out (n bytes,
 * always NUL-terminated), for reports; default: the table's name */
typedef void flexdiag_op_device_name(const flexdiag_stream *s, char *out, size_t n);
/* (optional) PCI address of device, "domain:bus:device.function" ("0000:41:00.0"), into out
 * (n bytes, NUL-terminated; INVALID_ARG when the whole id does not fit), used to place pinned
 * host memory on the NUMA node nearest the GPU; default: no device on a bus (CPU) */
typedef flexdiag_status flexdiag_op_pci_bus_id(int device, char *out, size_t n);
/* (optional) devices visible to this backend (0 when none or no driver); default: none (CPU) */
typedef int flexdiag_op_device_count(void);

/* ---- conversions ---- */

/* out (n) f32 <- in (n) act */
typedef flexdiag_status flexdiag_op_act_to_f32(float *out, const void *in, int64_t n,
                                               flexdiag_stream *s);
/* out (n) act <- in (n) f32 (bf16 act: round to nearest even) */
typedef flexdiag_status flexdiag_op_act_from_f32(void *out, const float *in, int64_t n,
                                                 flexdiag_stream *s);

/* ---- elementwise and row ops ---- */

/* out (n, d) act; table (V, d) bf16; ids (ceil(n/rep)): row i takes table[ids[i / rep]] */
typedef flexdiag_status flexdiag_op_embed(void *out, const uint16_t *table, const int32_t *ids,
                                          int64_t n, int64_t d, int32_t rep, flexdiag_stream *s);
/* x (n, d) act += table[pos[i] + offset] for row i (learned positions; OPT: offset 2); table
 * (rows, d) bf16, pos (n) int32; the sum in fp32, one rounding to act. The caller guarantees
 * 0 <= pos[i] + offset < rows (the op has no rows to check against) */
typedef flexdiag_status flexdiag_op_pos_embed_add(void *x, const uint16_t *table,
                                                  const int32_t *pos, int64_t n, int64_t d,
                                                  int32_t offset, flexdiag_stream *s);
/* out (n, d) act = x / sqrt(mean(x²) + eps) ⊙ w; x (n, d) act; w (d) bf16; stats fp32 */
typedef flexdiag_status flexdiag_op_rmsnorm(void *out, const void *x, const uint16_t *w, int64_t n,
                                            int64_t d, float eps, flexdiag_stream *s);
/* out (n, d) act = (x - mean(x)) / sqrt(var(x) + eps) ⊙ w + b; x (n, d) act; w, b (d) bf16;
 * mean and biased variance over d in fp32 or wider, one rounding to act at the end; out may
 * be x itself (in place), not otherwise overlap it */
typedef flexdiag_status flexdiag_op_layernorm(void *out, const void *x, const uint16_t *w,
                                              const uint16_t *b, int64_t n, int64_t d, float eps,
                                              flexdiag_stream *s);
/* QK-norm (Chameleon / Lumina-mGPT: LayerNorm per head, before RoPE), in place on qkv
 * (n, (h_q + 2·h_kv)·d_h) act: every q and k head of a row (v untouched) becomes
 * (x - mean(x)) / sqrt(var(x) + eps) over its d_h values, mean and biased variance in fp32 or
 * wider, then ⊙ w[r] + b[r], one rounding to act at the end. q_w, q_b (q_rows, d_h) and k_w,
 * k_b (k_rows, d_h) bf16: q_rows == h_q gives q head h row r = h (the upstream converter's
 * per-head rows), q_rows == 1 one row shared by every q head (Lumina-mGPT's [1, d_h]); likewise
 * k_rows with h_kv; any other row count is INVALID_ARG. d_h <= 256 (the config's head_dim
 * limit; CUDA refuses more) */
typedef flexdiag_status flexdiag_op_qk_norm(void *qkv, const uint16_t *q_w, const uint16_t *q_b,
                                            const uint16_t *k_w, const uint16_t *k_b, int64_t n,
                                            int32_t h_q, int32_t h_kv, int32_t d_h, int32_t q_rows,
                                            int32_t k_rows, float eps, flexdiag_stream *s);
/* out (n, m) = x (n, k) act · W (m, k)ᵀ + b (m) (b may be NULL); act or f32 out per flags */
typedef flexdiag_status flexdiag_op_matmul(void *out, const void *x, const uint16_t *w,
                                           const uint16_t *b, int64_t n, int64_t k, int64_t m,
                                           unsigned flags, flexdiag_stream *s);
/* out (n, f) act = silu(gu[:, :f]) ⊙ gu[:, f:]; gu (n, 2f) act */
typedef flexdiag_status flexdiag_op_swiglu(void *out, const void *gu, int64_t n, int64_t f,
                                           flexdiag_stream *s);
/* Layer weights in 4-bit groups (--compress-weights 4bit): a packed row of cols bf16 values
 * (cols a multiple of FLEXDIAG_WQ4_GROUP) is cols/2 code bytes (value 2i in the low nibble of
 * byte i, value 2i+1 in the high one) then, per group of FLEXDIAG_WQ4_GROUP values, two IEEE
 * halves: step and min. A value is bf16(min + code·step) (code·step is exact in fp32, so the
 * sum has one fp32 rounding on every backend). flexdiag__wq4_pack makes the rows on the host.
 * out (rows, cols) bf16 = the packed rows in (rows · flexdiag__wq4_row_bytes(cols) bytes). */
#define FLEXDIAG_WQ4_GROUP 64
typedef flexdiag_status flexdiag_op_wq4_unpack(uint16_t *out, const uint8_t *in, int64_t rows,
                                               int64_t cols, flexdiag_stream *s);
static inline size_t flexdiag__wq4_row_bytes(int64_t cols) {
    return (size_t)cols / 2 + (size_t)cols / FLEXDIAG_WQ4_GROUP * 4;
}
/* x (n) act in place: exact (erf) GELU */
typedef flexdiag_status flexdiag_op_gelu(void *x, int64_t n, flexdiag_stream *s);
/* x (n) act in place: max(x, 0); negative values become +0, ±0 and NaN stay as they are */
typedef flexdiag_status flexdiag_op_relu(void *x, int64_t n, flexdiag_stream *s);
/* out (n, d) act = in rows idx (n) */
typedef flexdiag_status flexdiag_op_gather_rows(void *out, const void *in, const int32_t *idx,
                                                int64_t n, int64_t d, flexdiag_stream *s);

/* ---- KV cache and attention ---- */

/* Write K and V of n_tok tokens into the caches k, v (layout above). qkv (n_tok, qkv width)
 * act; token i belongs to sequence i / tok_per_seq and goes to cache row rows[i·h_kv + h]
 * of KV head h. With a->pos set, the h_q + h_kv q and k heads of qkv row i are first
 * rotated in place by RoPE at position pos[i] (rotate-half, HF layout; inv_freq[j] =
 * rope_theta^(-2j/d_h) and the angle in double, cos/sin rounded to fp32, fp32 rotation
 * without fma contraction, one rounding to act), so the cache gets rotated keys and qkv
 * rotated queries; with a->pos NULL it is a plain copy and qkv is not written. */
typedef flexdiag_status flexdiag_op_kv_append(void *k, void *v, void *qkv, const int32_t *rows,
                                              int64_t n_tok, int32_t tok_per_seq,
                                              const flexdiag_attn_args *a, flexdiag_stream *s);
/* Causal prompt attention. out (n_seq·p_cap, h_q·d_h) act; qkv (n_seq·p_cap, qkv width);
 * query row r < lp[s] of sequence s attends prompt rows 0..r of its cache; rows r >= lp[s]
 * are written as zeros. */
typedef flexdiag_status flexdiag_op_attn_prefill(void *out, const void *qkv, const void *k,
                                                 const void *v, const flexdiag_attn_args *a,
                                                 flexdiag_stream *s);
/* One decode query per sequence. out (n_seq, h_q·d_h) act; qkv (n_seq, qkv width); each
 * query head of KV head h attends prompt rows 0..lp[s]-1, then ring rows slots[s][h][..],
 * with one online softmax; fills logits_out / lse_out / probs_out when given and applies
 * the Diagonal update when diag_lag is set. */
typedef flexdiag_status flexdiag_op_attn_decode(void *out, const void *qkv, const void *k,
                                                const void *v, const flexdiag_attn_args *a,
                                                flexdiag_stream *s);

/* ---- heads and sampling ---- */

/* out (n_pairs, V) f32 = u + w·(c - u) with c = logits row 2i, u = row 2i+1 */
typedef flexdiag_status flexdiag_op_cfg_combine(float *out, const float *logits, int64_t n_pairs,
                                                int64_t V, float w, flexdiag_stream *s);
/* One row of a sample call: its draw's key and its settings (each row its own request's). */
typedef struct flexdiag_sample_row {
    uint64_t seed;     /* the draw is keyed by (seed, req, step) */
    int64_t req;       /* the request (image) index; < 0: skip the row (ids[i] untouched, its
                          logits not read: a free slot, a forced token) */
    int64_t step;      /* the token's step */
    float temperature; /* > 0 */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* (0, 1]; >= 1 = off */
    int32_t id0;       /* added to the drawn column (flexdiag_sample_params id0) */
} flexdiag_sample_row;

/* ids (n) int32 = rows[i].id0 + the column drawn from softmax(logits (n, V) / T) after top-k /
 * top-p with row i's settings; the uniform number for row i is flexdiag__rng_uniform(
 * rows[i].seed, rows[i].req, rows[i].step). rows (n) is backend memory (device memory on
 * CUDA), so the host writes it with copy_h2d. A row without a finite logit, or whose settings
 * are out of range (temperature <= 0 or not finite, top_k < 0, top_p <= 0 or NaN), gets -1
 * (CUDA: the op cannot read the rows without a host sync) or fails the call (CPU:
 * NUMERIC / INVALID_ARG naming the row). Rows with req < 0 are skipped. */
typedef flexdiag_status flexdiag_op_sample(int32_t *ids, const float *logits, int64_t n,
                                           int64_t V, const flexdiag_sample_row *rows,
                                           flexdiag_stream *s);

/* The distribution sample draws row r from, on the host (kernels/cpu/ref_sample.c): p (V)
 * holds the probability of every column sample would keep (steps 1-4 of its definition, the
 * same fp32 values), 0 for the others. scratch: V·8 bytes. INVALID_ARG / NUMERIC as sample's
 * CPU op for the row's settings and logits. */
flexdiag_status flexdiag__sample_probs(float *p, const float *logits, int64_t V,
                                       const flexdiag_sample_row *r, void *scratch);
/* Step 5 of sample over p (flexdiag__sample_probs): the column whose cumulative probability
 * (ascending columns, double) first exceeds u · the total; the same column sample draws for
 * the same uniform u. */
int32_t flexdiag__sample_walk(const float *p, int64_t V, double u);

/* ---- image decoder (VQ-16) ---- */
/* Tensors are NCHW f32 on every backend, not act: bf16 activations put the CUDA decode 0.022
 * relative L2 from transformers' pixels (limit 2e-2). The void * activation pointers point
 * to float; only CUDA conv2d rounds, its input to bf16 for the tensor-core GEMM. */

/* out (n, c, hw) f32: column j of image i = codebook row ids[i·hw + j]; codebook (V, c) f32,
 * L2-normalised by the loader when the layout asks (Janus; the taming VQGAN uses it raw) */
typedef flexdiag_status flexdiag_op_vq_lookup(void *out, const float *codebook, const int32_t *ids,
                                              int64_t n, int32_t c, int32_t hw,
                                              flexdiag_stream *s);
/* out (n, cout, h, w) f32 (+)= conv(x (n, cin, h, w) f32, w (cout, cin, k, k) bf16) + b (cout)
 * bf16 (b may be NULL); stride 1, zero padding (k-1)/2, k odd; fp32 accumulation (CUDA: x
 * rounded to bf16 for the GEMM); flags: FLEXDIAG_MM_ACCUM (adds onto out in fp32) */
typedef flexdiag_status flexdiag_op_conv2d(void *out, const void *x, const uint16_t *w,
                                           const uint16_t *b, int64_t n, int32_t cin,
                                           int32_t cout, int32_t h, int32_t wd, int32_t k,
                                           unsigned flags, flexdiag_stream *s);
/* out (n, c, hw) f32 = GroupNorm(groups, eps)(x (n, c, hw) f32) · gamma + beta (bf16 (c)),
 * stats fp32 or wider; then swish x·sigmoid(x) when swish != 0 */
typedef flexdiag_status flexdiag_op_groupnorm(void *out, const void *x, const uint16_t *gamma,
                                              const uint16_t *beta, int64_t n, int32_t c,
                                              int32_t hw, int32_t groups, float eps,
                                              int32_t swish, flexdiag_stream *s);
/* out (n, c, 2h, 2w) f32 = nearest-neighbour ×2 of x (n, c, h, w) f32 */
typedef flexdiag_status flexdiag_op_upsample2x(void *out, const void *x, int64_t n, int32_t c,
                                               int32_t h, int32_t wd, flexdiag_stream *s);
/* Single-head attention over positions: out (n, c, hw) f32 = v · softmax_keys(qᵀk·c^-0.5)ᵀ,
 * q, k, v (n, c, hw) f32; logits, softmax and both products in fp32 */
typedef flexdiag_status flexdiag_op_attn_spatial(void *out, const void *q, const void *k,
                                                 const void *v, int64_t n, int32_t c, int32_t hw,
                                                 flexdiag_stream *s);
/* out (n, h, w, 3) f32 = x (n, 3, h, w) f32 (NCHW -> NHWC, the float pixels before uint8) */
typedef flexdiag_status flexdiag_op_to_nhwc(float *out, const void *x, int64_t n, int32_t c,
                                            int32_t hw, flexdiag_stream *s);

/* ---- host staging ---- */

/* (optional) page-locked host memory, so copy_h2d / copy_d2h from it are asynchronous;
 * default: the runtime uses malloc/free */
typedef flexdiag_status flexdiag_op_host_alloc(size_t bytes, void **out);
/* Free memory of host_alloc; NULL is a no-op. */
typedef void flexdiag_op_host_free(void *p);
/* Pin bytes of host memory the caller allocated at p (malloc, mmap), so the async copies from
 * and to it overlap other work, until host_unregister(p); bytes == 0 pins nothing, a NULL p
 * with bytes > 0 is INVALID_ARG. Not during a graph capture. CUDA: cudaHostRegister,
 * FLEXDIAG_ERR_OOM_PINNED when the locked-memory limit (ulimit -l) or the driver refuses.
 * CPU: nothing to pin without a device, returns OK. */
typedef flexdiag_status flexdiag_op_host_register(void *p, size_t bytes);
/* Unpin memory of host_register (p as registered); NULL is a no-op. */
typedef flexdiag_status flexdiag_op_host_unregister(void *p);

/* ---- the steps of the device-resident policies: sequences sit at their own decode steps, so
 * each list of a policy op reads its sequence's step t from backend memory. Lists are laid out
 * (layers, n_seq sequences, per_seq lists): list i belongs to sequence (i / per_seq) mod n_seq
 * and its step is t[that sequence]. A negative step (a free slot) leaves the list, and every
 * output the op would write for it, as it is. ---- */
typedef struct flexdiag_list_steps {
    const int32_t *t; /* (n_seq) backend memory: the decode step of each sequence */
    int32_t n_seq;    /* sequences (entries of t) */
    int32_t per_seq;  /* consecutive lists of one sequence in one layer (>= 1) */
} flexdiag_list_steps;

/* The step of list i (i >= 0), for the backends' loops. */
static inline int32_t flexdiag__list_step(const flexdiag_list_steps *st, int64_t i) {
    return st->t[(i / st->per_seq) % st->n_seq];
}

/* ---- device-resident Diagonal policy (docs/policies.md §2.3, §2.8; policy/policy_diagonal.c
 * is the reference these must equal). A lag list i = (layer, seq, KV head) holds cnt[i]
 * lags lag[i·a ..]; base = 4 for diagonal-sink4 (4 sink rows ahead of the ring), else 0;
 * inner step ti = t - base, t the list's step (flexdiag_list_steps). ---- */

/* (optional) Plan each list at its step t: when 0 <= ti <= a-1 first append lag ti
 * (ti == 0 resets the list to {0}); then slots[i] = sinks 0..base-1 followed by list
 * entry j at column base + cnt-1-j: base + (ti - lag[j]) mod n_r; n_slots[i] = base + cnt.
 * n_r is the ring rows behind the sinks: N_r, plus the window passes' slack when a context
 * runs SJD (policy/kv_policy.h flexdiag_kvp_params slack); lags stay below N_r.
 * For ti < 0 (sink4, t <= 3): slots 0..t. slots (n_lists, max_slots), n_slots (n_lists). */
typedef flexdiag_status flexdiag_op_diag_slots(int32_t *slots, int32_t *n_slots, int16_t *lag,
                                               int16_t *cnt, int64_t n_lists, int32_t max_slots,
                                               int32_t a, flexdiag_list_steps t, int32_t n_r,
                                               int32_t base, flexdiag_stream *s);

/* ---- device-resident eviction policies H2O and TOVA (docs/policies.md §3.4, §3.5;
 * policy/policy_score.c is the reference these must equal). List i owns n_att ring slots:
 * H2O one list per (layer, seq, KV head), TOVA one per (layer, seq) whose slot map all its
 * KV heads share. pos (n_lists, n_att): decode position held by each slot; acc (n_lists,
 * n_att): H2O's accumulated scores (NULL for TOVA); free_slot (n_lists): the victim the
 * last update chose. Slots 0..min(t+1, n_att)-1 are the occupied ones, so every list
 * attends the same slot list and only the write slot differs. ---- */

/* (optional) Plan each list at its step t (flexdiag_list_steps): t == 0 resets the list
 * (pos -1, acc 0); f = t < n_att ? t : free_slot[i]; pos[i][f] = t, acc[i][f] = 0;
 * rows[i·rows_per_list + r] = p_cap + f for r < rows_per_list (the cache rows kv_append
 * writes: 1 for H2O, h_kv for TOVA). */
typedef flexdiag_status flexdiag_op_evict_plan(int32_t *rows, int32_t *pos, float *acc,
                                               const int32_t *free_slot, int64_t n_lists,
                                               int32_t rows_per_list, int32_t n_att,
                                               flexdiag_list_steps t, int32_t p_cap,
                                               flexdiag_stream *s);
/* (optional) Update each list after its step t from probs (n_lists·heads, max_slots),
 * attn_decode's probs_out (list i owns rows i·heads ..), n = min(t+1, n_att):
 *   acc != NULL (H2O, heads = the group g): acc[i][j] += the sum over q of
 *     probs[i·heads + q][j] for j < n; when n == n_att, free_slot[i] = the slot minimising
 *     (acc, pos) among those with pos <= t - R + 1, R = n_att - n_att / 2;
 *   acc == NULL (TOVA, heads = h_q): when n == n_att, free_slot[i] = the slot minimising
 *     (sum over q of probs[i·heads + q][j] / heads, pos) over all n_att slots.
 * Sums start at 0 and add q = 0, 1, ... in order (fp32), as the reference does, so every
 * backend picks the same victims. */
typedef flexdiag_status flexdiag_op_evict_update(int32_t *free_slot, float *acc,
                                                 const int32_t *pos, const float *probs,
                                                 int64_t n_lists, int32_t heads,
                                                 int32_t max_slots, int32_t n_att,
                                                 flexdiag_list_steps t, flexdiag_stream *s);

/* ---- device-resident ALISA (docs/policies.md §3.6; policy/policy_alisa.c is the reference).
 * List i = (layer, seq) keeps the records of its last w = n_att - n_att/2 steps: rec_pos,
 * rec_p (n_lists, w, n_att) the positions attended then and their head-summed
 * probabilities, rec_n (n_lists, w) their counts. All KV heads of a list attend the same
 * positions; ALISA never evicts, so ring slot = position. ---- */

/* (optional) Plan each list at its step t (flexdiag_list_steps; a step outside [0, l_dec)
 * leaves the list as it is): the positions attended at t, i.e. the top k_g = n_att/2 of the
 * older tokens 0..t-w by S_t = the sum of the records' probabilities (S descending, then
 * position descending; the order of flexdiag__alisa_key), ascending, followed by t-w+1..t;
 * written as the slot list of each of the list's `copies` KV heads (slots
 * (n_lists·copies, max_slots), n_slots (n_lists·copies)) and as record t mod w with zero
 * probabilities. score (n_lists, l_dec) and keys (n_lists, l_dec) are scratch. */
typedef flexdiag_status flexdiag_op_alisa_plan(int32_t *slots, int32_t *n_slots, int32_t *rec_pos,
                                               float *rec_p, int32_t *rec_n, float *score,
                                               uint64_t *keys, int64_t n_lists, int32_t copies,
                                               int32_t max_slots, int32_t n_att, int32_t l_dec,
                                               flexdiag_list_steps t, flexdiag_stream *s);
/* (optional) Update each list after its step t: entry j < rec_n of record t mod w gets the sum
 * over q = 0, 1, ..., heads-1 (fp32, in order) of probs[i·heads + q][j]: probs is attn_decode's
 * probs_out (n_lists·heads, max_slots), heads = h_q. */
typedef flexdiag_status flexdiag_op_alisa_update(float *rec_p, const int32_t *rec_n,
                                                 const float *probs, int64_t n_lists,
                                                 int32_t heads, int32_t max_slots, int32_t n_att,
                                                 flexdiag_list_steps t, flexdiag_stream *s);

/* ---- launch graphs (optional; NULL: the engine launches op by op) ---- */

/* Start recording the ops queued on s instead of running them (no sync, copy_d2h or
 * allocation may happen until graph_end). */
typedef flexdiag_status flexdiag_op_graph_begin(flexdiag_stream *s);
/* Stop recording; *graph is a replayable instance of what was recorded. */
typedef flexdiag_status flexdiag_op_graph_end(flexdiag_stream *s, void **graph);
/* Replay graph on s (same buffers, their current contents). */
typedef flexdiag_status flexdiag_op_graph_launch(void *graph, flexdiag_stream *s);
/* Free graph; NULL is a no-op. */
typedef void flexdiag_op_graph_destroy(void *graph);

/* ======== the op table ======== */

typedef struct flexdiag_kernels {
    const char *name; /* "cpu-ref", "cpu", "cuda" */
    int act_bytes;    /* 4 (fp32) or 2 (bf16) */
    size_t stream_bytes; /* device bytes each stream holds outside mem_alloc (workspaces); the
                            runtime charges them to its memory budget (copy queues hold none) */

    /* ---- streams, events and memory ---- */
    flexdiag_op_stream_create *stream_create;
    flexdiag_op_stream_destroy *stream_destroy;
    flexdiag_op_stream_sync *stream_sync;
    flexdiag_op_copy_stream_create *copy_stream_create;
    flexdiag_op_event_create *event_create;
    flexdiag_op_event_destroy *event_destroy;
    flexdiag_op_event_record *event_record;
    flexdiag_op_stream_wait_event *stream_wait_event;
    flexdiag_op_event_sync *event_sync;
    flexdiag_op_event_query *event_query;
    flexdiag_op_mem_alloc *mem_alloc;
    flexdiag_op_mem_free *mem_free;
    flexdiag_op_copy *copy_h2d;       /* host -> device; may block on pageable memory */
    flexdiag_op_copy *copy_d2h;       /* device -> host; synchronises s */
    flexdiag_op_copy *copy_d2d;       /* device -> device */
    flexdiag_op_copy *copy_h2d_async; /* host -> device; never synchronises (pinned host) */
    flexdiag_op_copy *copy_d2h_async; /* device -> host; never synchronises (pinned host) */
    flexdiag_op_copy_2d *copy_h2d_2d_async; /* strided rows host -> device, asynchronous */
    flexdiag_op_copy_2d *copy_d2h_2d_async; /* strided rows device -> host, asynchronous */
    flexdiag_op_copy_h2d_slots *copy_h2d_slots_async; /* attended ring rows host -> device */
    flexdiag_op_memset0 *memset0;
    flexdiag_op_host_fn *host_fn;         /* copy queues only */
    flexdiag_op_mem_info *mem_info;       /* optional */
    flexdiag_op_device_name *device_name; /* optional */
    flexdiag_op_pci_bus_id *pci_bus_id;   /* optional */
    flexdiag_op_device_count *device_count; /* optional */

    /* ---- conversions ---- */
    flexdiag_op_act_to_f32 *act_to_f32;
    flexdiag_op_act_from_f32 *act_from_f32;

    /* ---- elementwise and row ops ---- */
    flexdiag_op_embed *embed;
    flexdiag_op_pos_embed_add *pos_embed_add;
    flexdiag_op_rmsnorm *rmsnorm;
    flexdiag_op_layernorm *layernorm;
    flexdiag_op_qk_norm *qk_norm;
    flexdiag_op_matmul *matmul;
    flexdiag_op_swiglu *swiglu;
    flexdiag_op_gelu *gelu;
    flexdiag_op_relu *relu;
    flexdiag_op_gather_rows *gather_rows;
    flexdiag_op_wq4_unpack *wq4_unpack;

    /* ---- KV cache and attention ---- */
    flexdiag_op_kv_append *kv_append;
    flexdiag_op_attn_prefill *attn_prefill;
    flexdiag_op_attn_decode *attn_decode;

    /* ---- heads and sampling ---- */
    flexdiag_op_cfg_combine *cfg_combine;
    flexdiag_op_sample *sample;

    /* ---- image decoder (VQ-16) ---- */
    flexdiag_op_vq_lookup *vq_lookup;
    flexdiag_op_conv2d *conv2d;
    flexdiag_op_groupnorm *groupnorm;
    flexdiag_op_upsample2x *upsample2x;
    flexdiag_op_attn_spatial *attn_spatial;
    flexdiag_op_to_nhwc *to_nhwc;

    /* ---- host staging ---- */
    flexdiag_op_host_alloc *host_alloc; /* optional */
    flexdiag_op_host_free *host_free;   /* optional, with host_alloc */
    flexdiag_op_host_register *host_register;
    flexdiag_op_host_unregister *host_unregister;

    /* ---- device-resident policies (optional) ---- */
    flexdiag_op_diag_slots *diag_slots;
    /* Largest group h_q / h_kv for which attn_decode applies diag_lag (0: never); the engine
     * keeps a larger group's Diagonal policy on the host. */
    int32_t diag_max_group;
    flexdiag_op_evict_plan *evict_plan;
    flexdiag_op_evict_update *evict_update;
    flexdiag_op_alisa_plan *alisa_plan;
    flexdiag_op_alisa_update *alisa_update;

    /* ---- launch graphs (optional; NULL: the engine launches op by op) ---- */
    flexdiag_op_graph_begin *graph_begin;
    flexdiag_op_graph_end *graph_end;
    flexdiag_op_graph_launch *graph_launch;
    flexdiag_op_graph_destroy *graph_destroy;
} flexdiag_kernels;

/* ---- decode attention on the host (kernels/cpu/host_attn.c) ----
 * For sequences whose KV home is host memory (the CPU attention of an offloading run): the
 * new K/V row goes into the host cache and the step's attention is computed there, by the
 * threads of a "cpu" table stream (flexdiag__kernels_cpu()->stream_create), whatever the
 * device backend's activation type. act_bytes 4 (fp32, the CPU backends): exactly the "cpu"
 * table's kv_append and attn_decode. act_bytes 2 (bf16, CUDA): the same contracts on bf16 data,
 * fp32 arithmetic inside (the RoPE of kv_append, rounded to bf16 once as the CUDA op does;
 * dot products, online softmax and sums in fp32, the output rounded to bf16 once). */
typedef struct flexdiag_host_attn {
    void *out;            /* (n_seq, h_q·d_h) act */
    void *qkv;            /* (n_seq, (h_q + 2·h_kv)·d_h) act, the projections before RoPE
                             (rotated in place when a.pos is set) */
    void *k, *v;          /* host caches of the n_seq sequences (layout above) */
    const int32_t *rows;  /* (n_seq, h_kv) cache row of each sequence's new K/V row */
    flexdiag_attn_args a; /* host pointers (lp, slots, n_slots, pos); no score outputs and no
                             Diagonal update (position-only policies) */
    float *cs;            /* (n_seq, d_h) fp32 scratch: the RoPE angles (bf16 with a.pos) */
    int act_bytes;        /* 4 or 2 */
    int cs_ready;         /* bf16: cs already holds the angles of a.pos (computed by an earlier
                             call with the same positions, e.g. the previous layer's) */
} flexdiag_host_attn;
flexdiag_status flexdiag__host_attn_decode(const flexdiag_host_attn *h, flexdiag_stream *cpu);

/* Pack rows (rows, cols) of bf16 weights into out (rows · flexdiag__wq4_row_bytes(cols) bytes)
 * on the host: per group min and max, step (max - min) / 15 and min rounded to halves, each code
 * the nearest of min + k·step. INVALID_ARG when cols is not a multiple of FLEXDIAG_WQ4_GROUP or
 * a group holds a NaN, an Inf or a range beyond the half range (what names the tensor). */
flexdiag_status flexdiag__wq4_pack(uint8_t *out, const uint16_t *in, int64_t rows, int64_t cols,
                                   const char *what);

/* ---- registry (kernels/registry.c) ---- */

/* Scalar reference ops (the oracle). */
const flexdiag_kernels *flexdiag__kernels_cpu_ref(void);
/* Reference ops + multi-threaded fast paths (matmul, attention). */
const flexdiag_kernels *flexdiag__kernels_cpu(void);
/* CUDA ops, or NULL when built without CUDA. */
const flexdiag_kernels *flexdiag__kernels_cuda(void);
/* True when this build has the CUDA backend. */
int flexdiag__have_cuda(void);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_KERNELS_H */
