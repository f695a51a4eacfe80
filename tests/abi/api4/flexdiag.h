/* tests/abi/api4/flexdiag.h - include/flexdiag.h as commit cd0956a left it (API version 4), kept
 * verbatim below for tests/abi/old_header.c: a program built against it must run against
 * today's library. */
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
 * are filled by their _params_init() and only ever grow at the end; handles are opaque.
 *
 * Threads. Each context owns its execution stream (a CUDA stream with its own cuBLAS handles
 * and workspace, or a pool of `threads` CPU workers), its buffers and its KV-policy state, so:
 *   - calls on different contexts may run at the same time from different threads, also on
 *     contexts of one runtime and one model (flexdiag_generate, flexdiag_score,
 *     flexdiag_context_stats, flexdiag_context_create and _destroy of other contexts);
 *   - one context runs one call at a time: a second call while one is in flight returns
 *     FLEXDIAG_ERR_BUSY; flexdiag_context_cancel may come from any thread at any time;
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

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FLEXDIAG_API __attribute__((visibility("default")))
#else
#define FLEXDIAG_API
#endif

/* 2: flexdiag_context_max_images. 3: flexdiag_version, flexdiag_policy_name,
 * flexdiag_policy_from_name, flexdiag_context_policy, flexdiag_score, flexdiag_decoder_*.
 * 4: offloading: runtime_params cpu_mem, disk_mem, offload_dir; model_params weights_pct;
 * flexdiag_context_offload; flexdiag_detokenize, flexdiag_model_eos (text models). */
#define FLEXDIAG_API_VERSION 4u

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
    int device;           /* CUDA device ordinal; -1 = CPU engine; default 0 if built with CUDA */
    uint64_t gpu_mem;     /* bytes of GPU memory the runtime may use; 0 = free memory - margin */
    int threads;          /* CPU worker threads; 0 = all online cores */
    /* since API version 4: the tiers below the device (used when a model's weights_pct puts
     * bytes there) */
    uint64_t cpu_mem;        /* pinned host pool bytes; 0 = what the first split model needs
                                plus disk staging for four contexts */
    uint64_t disk_mem;       /* NVMe store bytes; 0 = what the first split model needs */
    const char *offload_dir; /* folder of the NVMe store file (created there, unlinked at once);
                                copied; NULL = no disk tier */
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
                                      and each decode step (phase 1); false cancels */
    void *progress_user;           /* passed to progress */
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
    int32_t top_k;               /* 0 = off (Janus default) */
    float top_p;                 /* 1.0 = off */
    uint64_t seed;               /* sampling seed; draws keyed by (seed, image index, step) */
    int64_t first_image;         /* image index of this request's first image (default 0): lets
                                    a job split into several requests draw the same images */
} flexdiag_request;

typedef struct flexdiag_output {
    int32_t n_images;     /* n_prompts * images_per_prompt */
    int32_t tokens_per_image; /* 576 for Janus-Pro */
    int32_t *tokens;      /* caller-owned [n_images][tokens_per_image]; NULL = query sizes only */
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
/* Generate image tokens for req into out->tokens (caller-owned). Returns FLEXDIAG_ERR_BUSY if a
 * call is in flight on c, FLEXDIAG_ERR_CANCELLED after flexdiag_context_cancel. */
FLEXDIAG_API flexdiag_status flexdiag_generate(flexdiag_context *c, const flexdiag_request *req,
                                               flexdiag_output *out);
/* Ask the call in flight to stop before its next prefill layer or decode step; callable from
 * any thread. */
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

/* Version of the loaded library ("0.1.0"; flexdiag_version.h has the version of the headers a
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
                                  unconditional row follows the Janus rule */
    int32_t prompt_len;        /* ids in prompt_ids, <= the context's max_prompt_len */
    const int32_t *ids;        /* the n tokens to score, borrowed */
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
 * FLEXDIAG_ERR_BUSY if a call is in flight on c. */
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

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_FLEXDIAG_H */
