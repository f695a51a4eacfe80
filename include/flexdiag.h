/* SPDX-License-Identifier: MIT */
/*
 * flexdiag.h - the public C API of libflexdiag.
 *
 * flexdiag generates images (Janus-Pro) and text (Llama family) with a FlexGen-style schedule and
 * a diagonal-aware sparse KV cache. Embedders create one runtime (devices, memory budgets), load
 * a model once (read-only afterwards, shareable) and create one context per concurrent job; a
 * context owns the KV cache and batch state and runs one call at a time.
 *
 * Conventions: every function returns flexdiag_status (results through out-params, constructor
 * out-param first, *out == NULL after a failed create); params structs start with struct_size,
 * are filled by their _params_init() and only ever grow at the end, so a program built against
 * an older header passes a shorter struct and the library reads (or, for outputs, writes) only
 * the fields it has, and a params struct from a newer header is taken when every field this
 * library lacks is zero; handles are opaque. docs/abi.md states these rules, the structs that
 * never grow (flexdiag_output, flexdiag_stats, flexdiag_policy_params) and the versions: the API
 * version below rises with every addition, the library's minor version with it, the major
 * version and the soname (libflexdiag.so.<major>) only with a break.
 *
 * Threads. Each context owns its execution stream (a CUDA stream with its own cuBLAS handles
 * and workspace, or a pool of `threads` CPU workers), its buffers and its KV-policy state, so:
 *   - calls on different contexts may run at the same time from different threads, also on
 *     contexts of one runtime and one model (flexdiag_generate, flexdiag_score,
 *     flexdiag_context_stats, flexdiag_context_create and _destroy of other contexts);
 *   - one context runs one thing at a time: requests (flexdiag_generate, flexdiag_submit, from
 *     any threads) share its slots on its engine thread, and a scoring call waits its turn
 *     (since API version 12; before, a second call returned FLEXDIAG_ERR_BUSY);
 *     flexdiag_context_cancel may come from any thread at any time;
 *   - flexdiag_decode_images and the decoder calls may run beside generation; decode calls of
 *     models of one runtime take turns, as do calls on one flexdiag_decoder;
 *   - a model must outlive its contexts, a runtime its models; create/destroy of a runtime or
 *     model must not overlap other calls on it; flexdiag_log_set must not overlap logging;
 *   - error messages (flexdiag_last_error) are per thread.
 * The memory budget is shared: the runtime's accounting is atomic, so contexts created from
 * several threads never overshoot it together. On the CPU engine every context starts its own
 * worker pool; give each `threads` so their sum fits the cores.
 */
#ifndef FLEXDIAG_FLEXDIAG_H
#define FLEXDIAG_FLEXDIAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flexdiag_version.h" /* the version of these headers (flexdiag_version(): the library's) */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FLEXDIAG_API __attribute__((visibility("default")))
#else
#define FLEXDIAG_API
#endif

/* API versions (library 0.1.0: 3 to 11, 0.2.0: 12, 0.3.0: 13, 0.4.0: 14, 0.5.0: 15, 0.6.0: 16, 0.7.0: 17, 0.8.0: 18; docs/abi.md) and what each added.
 * 2: flexdiag_context_max_images. 3: flexdiag_version, flexdiag_policy_name,
 * flexdiag_policy_from_name, flexdiag_context_policy, flexdiag_score, flexdiag_decoder_*.
 * 4: offloading: runtime_params cpu_mem, disk_mem, offload_dir; model_params weights_pct;
 * flexdiag_context_offload; flexdiag_detokenize, flexdiag_model_eos (text models).
 * 5: context_params text and kv_pct (KV homes), offload_info kv_pct, kv_bytes, kv_h2d_bytes,
 * kv_d2h_bytes; flexdiag_runtime_budget. 6: flexdiag_device_count. 7: context_params
 * cpu_attention. 8: disk KV homes (kv_pct[2]), offload_info kv_disk_*. 9: context_params
 * images_per_prompt (shared prompt KV). 10: model_params compress_weights. 11: context_params
 * cpu_attention_pct, offload_info cpu_attn_mb and host_mb. 12: the request queue
 * (flexdiag_submit, flexdiag_handle_*), context_params queue_images and batching, status
 * FLEXDIAG_ERR_TIMEOUT; flexdiag_generate runs through the queue. 13: flexdiag_builtin_arch. 14: the _init() macros and
 * flexdiag_*_init_size (params written at the caller's size). 15: context_params and request
 * draft_len (speculative Jacobi decoding). 16: runtime_params
 * compress_disk (zstd on the disk tier). 17: context_params and request sjd_group (grouped
 * acceptance, lossy), handle_stats accepted (SJD drafts accepted by window row). 18: policies
 * FLEXDIAG_POLICY_SSD and FLEXDIAG_POLICY_HACK, context_params policy_calib and ssd_tau (their
 * calibration table). */
#define FLEXDIAG_API_VERSION 18u

/* The longest SJD window (context_params draft_len); handle_stats accepted has a count for each
 * of its draft rows. */
#define FLEXDIAG_MAX_DRAFT_LEN 64

/* ---- enums ---- */

typedef enum flexdiag_status {
    FLEXDIAG_OK = 0,
    FLEXDIAG_ERR_INVALID_ARG = -1,
    FLEXDIAG_ERR_UNSUPPORTED = -2,
    FLEXDIAG_ERR_NOT_FOUND = -3,
    FLEXDIAG_ERR_IO = -4,
    FLEXDIAG_ERR_NO_SPACE = -5,
    FLEXDIAG_ERR_CORRUPT_MODEL = -6,
    FLEXDIAG_ERR_CHECKSUM = -7,
    FLEXDIAG_ERR_OOM_DEVICE = -8,
    FLEXDIAG_ERR_OOM_PINNED = -9,
    FLEXDIAG_ERR_OOM_HOST = -10,
    FLEXDIAG_ERR_CUDA = -11,
    FLEXDIAG_ERR_CANCELLED = -12,
    FLEXDIAG_ERR_BUSY = -13,
    FLEXDIAG_ERR_NUMERIC = -14,
    FLEXDIAG_ERR_INTERNAL = -15,
    FLEXDIAG_ERR_TIMEOUT = -16, /* since API version 12: a wait ran out of time */
} flexdiag_status; /* values never change; new codes are appended */

typedef enum flexdiag_log_level {
    FLEXDIAG_LOG_ERROR = 0,
    FLEXDIAG_LOG_WARN = 1,
    FLEXDIAG_LOG_INFO = 2,
    FLEXDIAG_LOG_DEBUG = 3,
} flexdiag_log_level;

/* KV policies of docs/policies.md; values never change. */
typedef enum flexdiag_policy_kind {
    FLEXDIAG_POLICY_DENSE = 0,
    FLEXDIAG_POLICY_WINDOW = 1,
    FLEXDIAG_POLICY_STREAMING = 2,
    FLEXDIAG_POLICY_H2O = 3,
    FLEXDIAG_POLICY_TOVA = 4,
    FLEXDIAG_POLICY_ALISA = 5,
    FLEXDIAG_POLICY_DIAGONAL = 6,
    FLEXDIAG_POLICY_DIAGONAL_SINK4 = 7,
    FLEXDIAG_POLICY_LINE_AR = 8, /* LineAR: line-wise selection of the middle tokens (API 17) */
    FLEXDIAG_POLICY_SSD = 9,     /* SSD: spatial heads a window, semantic heads H2O; needs a
                                    calibration table, context_params policy_calib (API 18) */
    FLEXDIAG_POLICY_HACK = 10,   /* HACK: structural heads static lag lists, contextual heads
                                    H2O; needs a calibration table (API 18) */
} flexdiag_policy_kind;

/* ---- handles ---- */

typedef struct flexdiag_runtime flexdiag_runtime; /* devices, budgets, kernels; thread-safe */
typedef struct flexdiag_model flexdiag_model;     /* immutable after load; shared by contexts */
typedef struct flexdiag_context flexdiag_context; /* KV + batch state; one call at a time */

/* ---- params ---- */

typedef void (*flexdiag_log_fn)(flexdiag_log_level level, const char *msg, void *user);
/* Progress: phase 0 = prefill, 1 = decode; return false to cancel. */
typedef bool (*flexdiag_progress_fn)(int phase, uint64_t done, uint64_t total, void *user);

typedef struct flexdiag_runtime_params {
    uint32_t struct_size; /* sizeof(flexdiag_runtime_params), set by _params_init */
    int device;           /* CUDA device ordinal; -1 = CPU engine; default 0 if built with CUDA
                             (0 falls back to the CPU engine, with a warning, where CUDA cannot
                             start; a device above 0 that cannot start is refused) */
    uint64_t gpu_mem;     /* bytes of GPU memory the runtime may use; 0 = free memory - margin */
    int threads;          /* CPU worker threads; 0 = all online cores */
    /* since API version 4: the tiers below the device (used when a model's weights_pct puts
     * bytes there) */
    uint64_t cpu_mem;        /* pinned host pool bytes; 0 = what the first split model needs
                                plus disk staging for four contexts */
    uint64_t disk_mem;       /* NVMe store bytes; 0 = what the first split model needs */
    const char *offload_dir; /* folder of the NVMe store file (created there, unlinked at once);
                                copied; NULL = no disk tier */
    /* since API version 16 */
    uint32_t compress_disk;  /* 0: none; 1: zstd: the layer weights homed on disk (weights_pct
                                D) are stored as byte planes compressed with zstd (level 1,
                                1 MiB chunks, each checksummed), read back compressed and
                                decompressed by `threads` host threads (0: all cores) into
                                the pinned staging. Lossless: the same bytes reach the device.
                                A corrupt chunk fails the step with FLEXDIAG_ERR_CHECKSUM
                                naming the store file and the byte offset. The disk KV home
                                (kv_pct D) is not compressed. */
} flexdiag_runtime_params;

typedef struct flexdiag_model_params {
    uint32_t struct_size; /* sizeof(flexdiag_model_params) */
    const char *arch;     /* builtin shape when path is NULL: "tiny-janus" (default),
                             "janus-pro-1b", "janus-pro-7b"; borrowed for the call */
    bool random_weights;  /* with path NULL: seeded random weights (always true today) */
    uint64_t seed;        /* seed of random weights */
    /* since API version 4 */
    uint32_t weights_pct[3]; /* percent of every decoder layer's weights on the GPU, in pinned
                                host memory and on disk (sum 100; cut at row boundaries); all 0
                                = 100,0,0. Embeddings, norms and heads stay on the GPU. */
    /* since API version 10 */
    uint32_t compress_weights; /* 0: none; 4: the layer weights homed below the GPU (weights_pct
                                  C and D) kept in 4-bit groups of 64 values (a half step and
                                  min per group, 4.5 bits a value), moved packed and unpacked on
                                  the device once per layer per step. Lossy. */
} flexdiag_model_params;

typedef struct flexdiag_policy_params {
    uint32_t struct_size;      /* sizeof(flexdiag_policy_params) */
    flexdiag_policy_kind kind; /* default DENSE */
    int32_t n_att;             /* attended decode tokens; 0 = derive from sparsity */
    int32_t n_r;               /* Diagonal ring; 0 = max(round(0.5 L_dec), n_att) */
    double sparsity;           /* used when n_att == 0: n_att = lround((1-s) L_dec) */
} flexdiag_policy_params;

typedef struct flexdiag_context_params {
    uint32_t struct_size;          /* sizeof(flexdiag_context_params) */
    int32_t max_images;            /* images generated together (block size); default 16 */
    int32_t micro_batch;           /* images per micro-batch; 0 = max_images */
    int32_t max_prompt_len;        /* tokens incl. BOS and <begin_of_image>; default 128 */
    flexdiag_policy_params policy; /* KV policy */
    int32_t max_new_tokens;        /* Llama: tokens generated per prompt (default 128);
                                      Janus: fixed by the model (576), this field is ignored */
    flexdiag_progress_fn progress; /* optional, called after each prefill layer (phase 0)
                                      and each decode step (phase 1: the tokens made by the
                                      furthest image and its total); false cancels every
                                      request of the context. Since API version 12 it runs on
                                      the context's engine thread (the request queue) */
    void *progress_user;           /* passed to progress */
    /* since API version 5 */
    bool text;                     /* Chameleon (Lumina-mGPT): run as a text decoder over the
                                      whole vocabulary (text continuation, teacher-forced text
                                      logits) instead of generating images; a Chameleon model
                                      whose vocabulary cannot frame images (no image codes, or
                                      no <racm3:break> etc.: said at load) runs as one either
                                      way; the other models ignore it */
    uint32_t kv_pct[3];            /* percent of the block's micro-batches whose KV lives on the
                                      GPU, in pinned host memory, on disk (sum 100; rounded down
                                      to whole micro-batches on the GPU; all 0 = 100,0,0). The
                                      host-homed ones are staged per (layer, micro-batch);
                                      the disk-homed ones (since API version 8; rounded down
                                      too unless the CPU share is 0) live in the runtime's
                                      store (offload_dir, disk_mem) and pass through pinned
                                      staging. */
    /* since API version 7 */
    bool cpu_attention;            /* decode attention of the host-homed micro-batches on the
                                      CPU, over their KV in place: q/k/v rows go down and the
                                      attention output comes up, the KV never moves. Needs
                                      kv_pct[1] > 0 and a position-only policy (dense, window,
                                      streaming); FLEXDIAG_ERR_UNSUPPORTED otherwise. */
    /* since API version 9 */
    int32_t images_per_prompt;     /* images of one prompt a block holds side by side (a
                                      request's images_per_prompt); > 1 lets sequences with
                                      the same prompt row (the conditional rows of one
                                      prompt's images, identical unconditional rows) share one
                                      copy of its KV and run its prefill once: the context holds
                                      rows-per-image x (ceil(max_images / images_per_prompt) +
                                      1) prompt rows instead of one per sequence. A block with
                                      more distinct prompt rows is refused. 0 or 1: no sharing.
                                      Sharing applies when every micro-batch's KV is on the
                                      device (kv_pct[0] = 100). */
    /* since API version 11 */
    uint32_t cpu_attention_pct;    /* with cpu_attention: percent of the host-homed
                                      micro-batches whose attention the host runs, rounded up
                                      to whole micro-batches (0 = 100); the device attends the
                                      others over the rows they stream from the home, so the
                                      host's memory serves the CPU attention and the bus at
                                      once. */
    /* since API version 12 */
    int32_t queue_images;          /* images (text: sequences) the request queue holds waiting
                                      for a slot; 0 = 4 x max_images, at least 64. A submit
                                      beyond it returns FLEXDIAG_ERR_BUSY (or waits, by its
                                      params) */
    int32_t batching;              /* 0: continuous (a slot freed by a finished image takes
                                      the next waiting one at the next step); 1: blocks (the
                                      waiting images are taken only when every slot is free:
                                      the lock-step of API versions <= 11) */
    /* since API version 15 */
    int32_t draft_len;             /* speculative Jacobi decoding (SJD, lossless): tokens a
                                      sequence runs per decode pass, its last token and
                                      draft_len - 1 drafts, of which the pass keeps the accepted
                                      prefix plus one; the context sizes its buffers for it
                                      and it is the default of its requests. 0 or 1:
                                      sequential decoding (one token a pass). Needs the dense
                                      policy and every KV on the device;
                                      FLEXDIAG_ERR_UNSUPPORTED otherwise (docs/decoding.md) */
    /* since API version 17 */
    int32_t sjd_group;             /* with draft_len >= 2: 0 = exact SJD (lossless); G in
                                      1 .. 64 = grouped acceptance (GSD; LOSSY: another
                                      distribution of images, never a default): a draft is
                                      accepted against the summed probabilities of itself and
                                      those of the codes the target ranks up to G places either
                                      side of it whose VQ codebook vectors lie close to its own
                                      (docs/decoding.md §7); 2G + 1 at most the codebook. Image
                                      models with an image decoder (its codebook) only: a text
                                      context, or a model without one, is refused
                                      (FLEXDIAG_ERR_UNSUPPORTED) */
    /* since API version 18 */
    const char *policy_calib;      /* policies ssd and hack (docs/policies.md §7.2): the file of
                                      this model's calibration table (flexdiag-bench calibrate),
                                      read at context creation and refused when its model config
                                      hash, W_s, decode length, layers or heads are not this
                                      model's; those two policies need it (INVALID_ARG without),
                                      the others ignore it. NULL = none */
    double ssd_tau;                /* ssd: a KV head is spatial (a window) iff its calibrated
                                      local mass lambda(N_att) >= tau, else semantic (H2O);
                                      0 = the default 0.5; negative = tau 0 (lambda >= 0: every
                                      head spatial) */
} flexdiag_context_params;

typedef struct flexdiag_request {
    uint32_t struct_size;        /* sizeof(flexdiag_request) */
    int32_t n_prompts;           /* number of prompts */
    const char *const *prompts;  /* n_prompts UTF-8 texts, or NULL when prompt_ids is given */
    const int32_t *const *prompt_ids; /* n_prompts id arrays (BOS .. <begin_of_image>) or NULL */
    const int32_t *prompt_lens;  /* n_prompts lengths of prompt_ids */
    int32_t images_per_prompt;   /* default 1 */
    float cfg_weight;            /* default 5.0 */
    float temperature;           /* default 1.0 */
    int32_t top_k;               /* 0 = the model's default: off for Janus-Pro and text models,
                                    2000 for Lumina-mGPT images (its README) */
    float top_p;                 /* 1.0 = off */
    uint64_t seed;               /* sampling seed; draws keyed by (seed, image index, step) */
    int64_t first_image;         /* image index of this request's first image (default 0): lets
                                    a job split into several requests draw the same images */
    /* since API version 15 */
    int32_t draft_len;           /* SJD window of this request's images (context_params
                                    draft_len): 0 = the context's, 1 = sequential, else at
                                    most the context's */
    /* since API version 17 */
    int32_t sjd_group;           /* grouped acceptance of this request's images
                                    (context_params sjd_group): 0 = the context's, -1 = exact
                                    SJD, 1 .. 64 (lossy) in a context made with sjd_group > 0 */
} flexdiag_request;

typedef struct flexdiag_output {
    int32_t n_images;     /* n_prompts * images_per_prompt */
    int32_t tokens_per_image; /* 576 for Janus-Pro; 1024 for Lumina-mGPT (its 1056 generated
                                 tokens less the 32 row ends); max_new_tokens for text */
    int32_t *tokens;      /* caller-owned [n_images][tokens_per_image]; NULL = query sizes only.
                             Images: the code grid in raster order (what decode_images takes);
                             text: the generated ids */
} flexdiag_output;

typedef struct flexdiag_stats {
    double prefill_s;          /* wall seconds in prefill */
    double decode_s;           /* wall seconds in decode steps */
    uint64_t tokens_generated; /* image tokens per row summed over rows (CFG rows counted) */
    uint64_t kv_bytes_per_seq; /* resident KV bytes per sequence at the policy's steady state */
    uint64_t evictions;        /* KV rows evicted by the policy */
    uint64_t peak_device_bytes; /* high-water mark of the device arena */
} flexdiag_stats;

/* ---- library ---- */

/* Version of this library's API; compare with FLEXDIAG_API_VERSION. */
FLEXDIAG_API uint32_t flexdiag_api_version(void);
/* CUDA devices this library can run on (0: built without CUDA, no driver or none visible),
 * for picking runtime_params.device, e.g. one per process. Since API version 6. */
FLEXDIAG_API int flexdiag_device_count(void);
/* Static description of a status code; never NULL. */
FLEXDIAG_API const char *flexdiag_status_str(flexdiag_status s);
/* Detail of the last failing call made by this thread (handle is reserved); never NULL. */
FLEXDIAG_API const char *flexdiag_last_error(const void *handle);
/* Route log lines to fn (NULL restores stderr); level filters. Not thread-safe vs. logging. */
FLEXDIAG_API void flexdiag_log_set(flexdiag_log_fn fn, flexdiag_log_level level, void *user);

/* ---- runtime ---- */

/* Fill defaults and struct_size. */
FLEXDIAG_API void flexdiag_runtime_params_init(flexdiag_runtime_params *p);
/* Create a runtime; *out is owned by the caller (destroy). */
FLEXDIAG_API flexdiag_status flexdiag_runtime_create(const flexdiag_runtime_params *p,
                                                     flexdiag_runtime **out);
/* Destroy; NULL is a no-op. Models and contexts must be destroyed first. */
FLEXDIAG_API void flexdiag_runtime_destroy(flexdiag_runtime *rt);
/* The device memory budget rt's contexts are sized against (gpu_mem, or the device's free
 * memory less a margin) into *bytes; 0 when there is none (the CPU engine without gpu_mem), so
 * flexdiag_context_max_images has nothing to fill. Since API version 5. */
FLEXDIAG_API flexdiag_status flexdiag_runtime_budget(const flexdiag_runtime *rt, uint64_t *bytes);

/* ---- model ---- */

/* Fill defaults and struct_size. */
FLEXDIAG_API void flexdiag_model_params_init(flexdiag_model_params *p);
/* Load a model folder (config.json + safetensors), or a builtin random model when path is NULL.
 * rt is borrowed and must outlive the model. */
FLEXDIAG_API flexdiag_status flexdiag_model_load(flexdiag_runtime *rt, const char *path,
                                                 const flexdiag_model_params *p,
                                                 flexdiag_model **out);
/* Destroy; NULL is a no-op. */
FLEXDIAG_API void flexdiag_model_destroy(flexdiag_model *m);
/* Name i (0, 1, ...) of the builtin shapes model_params.arch takes with a NULL path, "tiny-janus"
 * (the default) first; static string, NULL past the last. Since API version 13. */
FLEXDIAG_API const char *flexdiag_builtin_arch(int32_t i);
/* Pixel size of the model's decoded images; *h = *w = 0 when it has no image decoder. */
FLEXDIAG_API flexdiag_status flexdiag_model_image_size(const flexdiag_model *m, int32_t *h,
                                                       int32_t *w);
/* Decode n image-token grids tokens (n, tokens_per_image) into float pixels (n, H, W, 3), the
 * decoder output before the uint8 conversion (about [-1, 1]); pixels is caller-owned.
 * Safe beside generation; decode calls of models of one runtime take turns. */
FLEXDIAG_API flexdiag_status flexdiag_decode_images(flexdiag_model *m, const int32_t *tokens,
                                                    int32_t n, float *pixels);

/* ---- context ---- */

/* Fill defaults and struct_size. */
FLEXDIAG_API void flexdiag_context_params_init(flexdiag_context_params *p);
/* Fill defaults and struct_size. */
FLEXDIAG_API void flexdiag_policy_params_init(flexdiag_policy_params *p);
/* Fill defaults and struct_size. */
FLEXDIAG_API void flexdiag_request_init(flexdiag_request *r);
/* Create a context (allocates KV and scratch once); m is borrowed. */
FLEXDIAG_API flexdiag_status flexdiag_context_create(flexdiag_model *m,
                                                     const flexdiag_context_params *p,
                                                     flexdiag_context **out);
/* Largest max_images for which a context with p's other settings (policy, prompt and decode
 * length, micro_batch) fits the runtime's memory budget next to the model: the batch to pass
 * to maximise throughput. *out = 0 when not even one image fits. FLEXDIAG_ERR_INVALID_ARG when
 * the runtime has no budget (the CPU engine without gpu_mem). Since API version 2. */
FLEXDIAG_API flexdiag_status flexdiag_context_max_images(const flexdiag_model *m,
                                                         const flexdiag_context_params *p,
                                                         int32_t *out);
/* Generate image tokens for req into out->tokens (caller-owned): flexdiag_submit of the whole
 * request, then flexdiag_handle_wait, so it shares the context's slots with other requests
 * (since API version 12; before, it returned FLEXDIAG_ERR_BUSY beside another call). Returns
 * FLEXDIAG_ERR_CANCELLED after flexdiag_context_cancel or a false from the progress callback. */
FLEXDIAG_API flexdiag_status flexdiag_generate(flexdiag_context *c, const flexdiag_request *req,
                                               flexdiag_output *out);
/* Cancel every request submitted to c so far (and the scoring call in flight): each stops at
 * its next step boundary; callable from any thread. */
FLEXDIAG_API flexdiag_status flexdiag_context_cancel(flexdiag_context *c);
/* Counters of the last call. */
FLEXDIAG_API flexdiag_status flexdiag_context_stats(const flexdiag_context *c, flexdiag_stats *out);
/* Destroy; NULL is a no-op. */
FLEXDIAG_API void flexdiag_context_destroy(flexdiag_context *c);

/* ---- since API version 4 ---- */

/* Where a context's model weights live and what its scheduler moved (offloaded runs). */
typedef struct flexdiag_offload_info {
    uint32_t struct_size;         /* sizeof(flexdiag_offload_info), set by the caller */
    const char *scheduler;        /* "resident" (all on the device) or "tiered"; static */
    uint32_t weights_pct[3];      /* requested GPU, CPU, disk percent */
    uint64_t weights_bytes[3];    /* realised layer-weight bytes per tier, all layers */
    uint64_t pinned_budget;       /* bytes of the pinned pool (0: none) */
    uint64_t pinned_used;         /* bytes carved from it */
    int32_t pinned;               /* 1: page-locked; 0: plain memory (see pinned_note) */
    const char *pinned_note;      /* how the pool was placed/pinned; valid with the runtime */
    uint64_t disk_budget;         /* bytes of the store file (0: none) */
    uint64_t disk_used;           /* bytes carved from it */
    const char *disk_io;          /* "io_uring" or "threads"; NULL without a store */
    const char *disk_note;        /* how the store degraded ("" when it did not) */
    uint64_t loads;               /* layer loads into device slots since the context was made */
    uint64_t h2d_bytes;           /* bytes copied host -> device by the scheduler */
    uint64_t disk_read_bytes;     /* bytes read from the store by the scheduler */
    double disk_wait_s;           /* host seconds waiting for disk reads */
    /* since API version 5 */
    uint32_t kv_pct[3];           /* requested KV homes (GPU, CPU, disk percent) */
    uint64_t kv_bytes[3];         /* realised KV bytes per home */
    uint64_t kv_h2d_bytes;        /* KV bytes loaded from the host home since creation */
    uint64_t kv_d2h_bytes;        /* KV bytes written back to it */
    /* since API version 7 */
    bool cpu_attention;           /* the host attends the host-homed micro-batches */
    uint64_t cpu_attn_d2h_bytes;  /* q/k/v rows sent to the host for it since creation */
    uint64_t cpu_attn_h2d_bytes;  /* attention outputs sent back */
    uint64_t cpu_attn_kv_bytes;   /* host KV bytes the CPU attention read */
    double cpu_attn_s;            /* host seconds inside the CPU attention */
    /* since API version 8 */
    uint64_t kv_disk_read_bytes;  /* bytes read from the disk KV home (whole 4 KiB pages) */
    uint64_t kv_disk_write_bytes; /* bytes written to it */
    double kv_disk_wait_s;        /* host seconds waiting for it */
    /* since API version 11 */
    int32_t host_mb;              /* micro-batches whose KV lives in pinned host memory */
    int32_t cpu_attn_mb;          /* of those, the ones the host attends (cpu_attention) */
} flexdiag_offload_info;

/* Fill *out (caller-owned, struct_size set) for context c. */
FLEXDIAG_API flexdiag_status flexdiag_context_offload(const flexdiag_context *c,
                                                      flexdiag_offload_info *out);

/* The id a text model's continuation ends at (its config's eos_token_id: OPT and Chameleon 2 by
 * default), or -1 when the model names none (image models). */
FLEXDIAG_API flexdiag_status flexdiag_model_eos(const flexdiag_model *m, int32_t *eos);

/* The text of n token ids (a text model's generated tokens) under m's tokenizer.json, special
 * tokens dropped when skip_special: NUL-terminated UTF-8 into out (cap bytes, may be NULL with
 * cap 0); *len gets the text's length, so a call with a small buffer says how much to give.
 * An id the tokenizer has no token for adds nothing. FLEXDIAG_ERR_NOT_FOUND when the model has
 * no tokenizer. */
FLEXDIAG_API flexdiag_status flexdiag_detokenize(const flexdiag_model *m, const int32_t *ids,
                                                 int32_t n, bool skip_special, char *out,
                                                 size_t cap, size_t *len);

/* ---- since API version 3 ---- */

/* Version of the loaded library ("0.3.0"; flexdiag_version.h has the version of the headers a
 * program was compiled with). Static string, never NULL. */
FLEXDIAG_API const char *flexdiag_version(void);

/* ---- policies ---- */

/* Command-line name of a policy ("dense", "diagonal-sink4"); static string, NULL for a kind
 * that does not exist. */
FLEXDIAG_API const char *flexdiag_policy_name(flexdiag_policy_kind kind);
/* The policy whose command-line name is name (borrowed) into *out. FLEXDIAG_ERR_INVALID_ARG for
 * an unknown name, with a message that lists the valid names. */
FLEXDIAG_API flexdiag_status flexdiag_policy_from_name(const char *name, flexdiag_policy_kind *out);

/* The KV policy a context's runs use, budget resolved (what results should record). */
typedef struct flexdiag_policy_info {
    uint32_t struct_size;      /* sizeof(flexdiag_policy_info), set by the caller */
    flexdiag_policy_kind kind; /* policy */
    int32_t n_att;             /* attended decode tokens per step (l_dec for dense) */
    int32_t n_r;               /* Diagonal ring size; 0 for the other policies */
    int32_t l_dec;             /* decode tokens per sequence the budget was resolved for */
    double sparsity;           /* reported sparsity 1 - n_att / l_dec (0 for dense) */
} flexdiag_policy_info;

/* Fill *out (caller-owned, struct_size set) with the resolved policy of c's runs. */
FLEXDIAG_API flexdiag_status flexdiag_context_policy(const flexdiag_context *c,
                                                     flexdiag_policy_info *out);

/* ---- teacher-forced scoring ---- */

typedef struct flexdiag_score_request {
    uint32_t struct_size;      /* sizeof(flexdiag_score_request), set by _init */
    const int32_t *prompt_ids; /* conditional prompt (BOS .. <begin_of_image>), borrowed; the
                                  unconditional row follows the Janus rule (Lumina-mGPT: the
                                  prompt ends with the image start and the size token twice, and
                                  those three ids alone are the unconditional row) */
    int32_t prompt_len;        /* ids in prompt_ids, <= the context's max_prompt_len */
    const int32_t *ids;        /* the n tokens to score, borrowed (Lumina-mGPT: vocabulary
                                  ids, row ends included; the logits' columns are the image
                                  codes' ids in order) */
    int32_t n;                 /* <= tokens_per_image (Janus) or max_new_tokens (Llama) */
    float cfg_weight;          /* Janus CFG weight (default 5.0) */
} flexdiag_score_request;

typedef struct flexdiag_score_output {
    uint32_t struct_size; /* sizeof(flexdiag_score_output), set by the caller */
    int32_t vocab;        /* set by the call: logits per position */
    int32_t rows;         /* set by the call: rows of raw (2 with CFG: conditional, then
                             unconditional; 1 for Llama) */
    float *logits;        /* caller-owned (n, vocab): CFG-combined (Janus) or plain (Llama)
                             logits; NULL = not wanted */
    float *raw;           /* caller-owned (rows, n, vocab) per-row logits; NULL = not wanted */
} flexdiag_score_output;

/* Fill defaults and struct_size. */
FLEXDIAG_API void flexdiag_score_request_init(flexdiag_score_request *r);
/* Teacher-forced logits of req on c under c's policy: row i predicts ids[i] from the prompt and
 * ids[0..i). Fills out->vocab and out->rows; with both buffers NULL that is all (size query).
 * Waits while c's engine thread runs requests (since API version 12; FLEXDIAG_ERR_BUSY
 * before). */
FLEXDIAG_API flexdiag_status flexdiag_score(flexdiag_context *c, const flexdiag_score_request *req,
                                            flexdiag_score_output *out);

/* ---- an image decoder on its own ---- */

typedef struct flexdiag_decoder flexdiag_decoder; /* image decoder loaded without the model;
                                                     calls from several threads take turns */

typedef struct flexdiag_decoder_info {
    uint32_t struct_size;     /* sizeof(flexdiag_decoder_info), set by the caller */
    int32_t grid_h, grid_w;   /* token grid; ids per image = grid_h * grid_w, raster order */
    int32_t codebook_size;    /* valid ids are 0 .. codebook_size - 1 */
    int32_t image_h, image_w; /* pixels of a decoded image */
    const char *backend;      /* where it decodes: "cpu" or "cuda" (static string) */
} flexdiag_decoder_info;

/* Load the image decoder (VQ) of a model folder (config.json + safetensors) alone, sized for
 * max_batch images per pass; it runs on rt's backend when that has the image ops, else on the
 * CPU. rt is borrowed and must outlive it; *out is owned by the caller (destroy). */
FLEXDIAG_API flexdiag_status flexdiag_decoder_load(flexdiag_runtime *rt, const char *path,
                                                   int32_t max_batch, flexdiag_decoder **out);
/* Fill *out (caller-owned, struct_size set) with d's token grid, codebook and image size. */
FLEXDIAG_API flexdiag_status flexdiag_decoder_get_info(const flexdiag_decoder *d,
                                                       flexdiag_decoder_info *out);
/* Decode n token grids tokens (n, grid_h * grid_w; borrowed) into float pixels (n, H, W, 3),
 * caller-owned, as flexdiag_decode_images does. Ids outside the codebook: INVALID_ARG. */
FLEXDIAG_API flexdiag_status flexdiag_decoder_decode(flexdiag_decoder *d, const int32_t *tokens,
                                                     int32_t n, float *pixels);
/* Destroy; NULL is a no-op. */
FLEXDIAG_API void flexdiag_decoder_destroy(flexdiag_decoder *d);

/* ---- the request queue (since API version 12) ----
 *
 * A context runs its requests on an engine thread it owns (started by the first submit): each
 * image (or text sequence) of a request takes a slot of the context when one is free, at a
 * step boundary, and frees it when its tokens are made, so requests of any size and arrival
 * time share the batch (continuous batching; context_params batching 1 keeps the lock step).
 * Images are the same whichever slot and neighbours they get: sampling is keyed by (seed, image
 * index, step). Submit, wait, cancel and release are thread-safe; the callbacks run on the
 * engine thread, one at a time, and may submit (without waiting for room) or cancel, but must
 * not wait on a request of the same context (nor score on it). flexdiag_score on the context
 * waits for the engine thread's run in flight, and the engine thread for a scoring call. */

typedef struct flexdiag_handle flexdiag_handle; /* one submitted request */

/* An image (its code grid, as flexdiag_output's tokens) or a text sequence (its ids, up to and
 * including the end id when stop_at_eos ended it) of request h is finished: index is its
 * place in the request (prompt-major), tokens (n of them) valid for the call. */
typedef void (*flexdiag_image_fn)(flexdiag_handle *h, int32_t index, const int32_t *tokens,
                                  int32_t n, void *user);
/* Token `step` of image or sequence `index` of h was made: id (text streaming). */
typedef void (*flexdiag_token_fn)(flexdiag_handle *h, int32_t index, int32_t step, int32_t id,
                                  void *user);
/* Request h ended with st (OK, CANCELLED, or the first failure of its images); no callback of h
 * follows. */
typedef void (*flexdiag_done_fn)(flexdiag_handle *h, flexdiag_status st, void *user);

typedef struct flexdiag_submit_params {
    uint32_t struct_size;      /* sizeof(flexdiag_submit_params), set by _init */
    flexdiag_image_fn on_image; /* optional */
    flexdiag_token_fn on_token; /* optional */
    flexdiag_done_fn on_done;   /* optional */
    void *user;                 /* passed to the callbacks */
    bool wait_for_room;         /* a full queue: wait until the request fits instead of
                                   FLEXDIAG_ERR_BUSY */
    int32_t max_new_tokens;     /* text: tokens per prompt, <= the context's max_new_tokens
                                   (0 = that); images: ignored */
    bool stop_at_eos;           /* text: a sequence ends after the model's end id
                                   (flexdiag_model_eos) */
} flexdiag_submit_params;

/* Per-request timings (seconds from its submit) and counts. */
typedef struct flexdiag_handle_stats {
    uint32_t struct_size;  /* sizeof(flexdiag_handle_stats), set by the caller */
    int32_t n_images;      /* images (sequences) of the request */
    int32_t done_images;   /* finished so far */
    uint64_t tokens;       /* tokens made so far */
    double queue_s;        /* until its first image took a slot (-1: not yet) */
    double first_token_s;  /* until its first token (-1: not yet) */
    double first_image_s;  /* until its first finished image (-1: not yet) */
    double total_s;        /* until it ended (-1: not yet) */
    /* since API version 15 */
    uint64_t passes;       /* decode passes its finished images took, summed (the prefill
                              pass not counted): passes per image = passes / done_images,
                              fewer than its tokens with context_params draft_len > 1 */
    /* since API version 17 */
    uint64_t accepted[FLEXDIAG_MAX_DRAFT_LEN - 1]; /* SJD: [k] drafts accepted in window row
                              k + 1 (its k-th draft) over the passes of its finished images;
                              accepted[k] / passes is the share of passes that kept k + 1
                              drafts or more, tokens a pass 1 + their sum / passes */
} flexdiag_handle_stats;

/* Fill defaults and struct_size. */
FLEXDIAG_API void flexdiag_submit_params_init(flexdiag_submit_params *p);
/* Queue req (copied: its prompts are tokenized now) on c; *out is the caller's reference
 * (flexdiag_handle_release). FLEXDIAG_ERR_BUSY when the queue has no room for its images
 * (context_params queue_images) and p asks not to wait; a request larger than the whole queue
 * waits for an empty one. p may be NULL (defaults). */
FLEXDIAG_API flexdiag_status flexdiag_submit(flexdiag_context *c, const flexdiag_request *req,
                                             const flexdiag_submit_params *p,
                                             flexdiag_handle **out);
/* Wait until h ended (its status then comes from flexdiag_handle_status), at most timeout_s
 * seconds (< 0: no limit): FLEXDIAG_OK once it ended, FLEXDIAG_ERR_TIMEOUT otherwise. */
FLEXDIAG_API flexdiag_status flexdiag_handle_wait(flexdiag_handle *h, double timeout_s);
/* Ask h to stop: waiting images are dropped, live ones stop at their next step boundary. */
FLEXDIAG_API flexdiag_status flexdiag_handle_cancel(flexdiag_handle *h);
/* h's status (FLEXDIAG_ERR_BUSY while it runs; its final status once ended) and, with stats
 * non-NULL (struct_size set), its timings. */
FLEXDIAG_API flexdiag_status flexdiag_handle_status(const flexdiag_handle *h, flexdiag_status *st,
                                                    flexdiag_handle_stats *stats);
/* The tokens of h's finished images into out (as flexdiag_generate fills it; images not
 * finished are zeros). */
FLEXDIAG_API flexdiag_status flexdiag_handle_tokens(const flexdiag_handle *h,
                                                    flexdiag_output *out);
/* The message of h's failure (its first failing image's, "generation cancelled"), "" while it
 * runs or when it succeeded; valid while the caller holds h. */
FLEXDIAG_API const char *flexdiag_handle_error(const flexdiag_handle *h);
/* Drop the caller's reference; an unfinished request keeps running (cancel it first to stop
 * it). NULL is a no-op. */
FLEXDIAG_API void flexdiag_handle_release(flexdiag_handle *h);

/* ---- params filled at the caller's size (since API version 14) ----
 *
 * The _init() calls above are macros from here on that pass the caller's sizeof: the library
 * writes exactly that many bytes (its defaults for the fields both know, zeros past its own
 * struct) and sets struct_size to it, so a program built against this header never has more
 * written than its struct holds, whichever library it meets (docs/abi.md §3). The functions
 * named like the macros stay exported for programs built before API version 14. */

FLEXDIAG_API void flexdiag_runtime_params_init_size(flexdiag_runtime_params *p, size_t size);
FLEXDIAG_API void flexdiag_model_params_init_size(flexdiag_model_params *p, size_t size);
FLEXDIAG_API void flexdiag_policy_params_init_size(flexdiag_policy_params *p, size_t size);
FLEXDIAG_API void flexdiag_context_params_init_size(flexdiag_context_params *p, size_t size);
FLEXDIAG_API void flexdiag_request_init_size(flexdiag_request *r, size_t size);
FLEXDIAG_API void flexdiag_score_request_init_size(flexdiag_score_request *r, size_t size);
FLEXDIAG_API void flexdiag_submit_params_init_size(flexdiag_submit_params *p, size_t size);

#define flexdiag_runtime_params_init(p) flexdiag_runtime_params_init_size((p), sizeof *(p))
#define flexdiag_model_params_init(p) flexdiag_model_params_init_size((p), sizeof *(p))
#define flexdiag_policy_params_init(p) flexdiag_policy_params_init_size((p), sizeof *(p))
#define flexdiag_context_params_init(p) flexdiag_context_params_init_size((p), sizeof *(p))
#define flexdiag_request_init(r) flexdiag_request_init_size((r), sizeof *(r))
#define flexdiag_score_request_init(r) flexdiag_score_request_init_size((r), sizeof *(r))
#define flexdiag_submit_params_init(p) flexdiag_submit_params_init_size((p), sizeof *(p))

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_FLEXDIAG_H */
