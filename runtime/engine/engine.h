/*
 * engine.h - the objects behind the public handles and the generation engine that drives them.
 *
 * One engine path serves every backend: the runtime owns the op table (CPU or CUDA), a stream
 * for loading and image decoding, and the device arena; a model owns config + weights (+
 * tokenizer, image decoder); a context owns its own stream, the KV cache, the KV policy (policy
 * driver) and every scratch buffer, all sized at creation and carved out of one device block
 * (no allocation inside a step), and a scheduler that hands each layer its memory.
 *
 * A run ("block" in FlexGen's terms) is a set of images generated together. Its sequences are
 * the CFG rows (conditional, unconditional per image for Janus; one row for Llama), grouped into
 * micro-batches that keep CFG pairs together. Prefill and every decode step run layer-major:
 * for each layer, for each micro-batch: acquire -> layer forward -> release
 * (docs/architecture.md §4). Teacher forcing (score, fidelity, golden tests) is the same run
 * with the sampled ids replaced by given ones.
 *
 * Files: context.c (sizing, carving, creation), run.c (prefill, decode steps, graphs, the
 * acquire/release of layer I/O), layer.c (one layer's forward over its I/O object), heads.c
 * (heads, CFG, sampling, the feedback embedding), policy_driver.c (the KV policy); run_state.h
 * holds what they share.
 */
#ifndef FLEXDIAG_ENGINE_H
#define FLEXDIAG_ENGINE_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/engine/engine.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "offload/arena.h"
#include "offload/sched.h"
#include "offload/store.h"
#include "policy/kv_policy.h"
#include "runtime/engine/policy_driver.h"
#include "runtime/model/model.h"

struct flexdiag_tokenizer;
struct flexdiag_queue;
struct flexdiag_sjd_groups;

struct flexdiag_runtime {
    flexdiag_runtime_params p;   /* copy of the creation params */
    const flexdiag_kernels *k;   /* backend op table */
    flexdiag_stream *s;          /* stream for loading weights and decoding images; each
                                    context runs on its own */
    pthread_mutex_t s_mu;        /* image decodes on s take turns */
    flexdiag_arena arena;        /* device memory under --gpu-mem */
    char *offload_dir;           /* copy of p.offload_dir */
    pthread_mutex_t tier_mu;     /* creation of the tiers below */
    flexdiag_host_pool *pool;    /* pinned host tier, made when a model first needs it */
    flexdiag_store *store;       /* NVMe tier, made when a model first needs it */
};

struct flexdiag_vq;

struct flexdiag_model {
    flexdiag_runtime *rt;            /* borrowed */
    flexdiag_model_config cfg;       /* resolved configuration */
    flexdiag_weights w;              /* device weights */
    struct flexdiag_tokenizer *tok;  /* NULL when the folder has no tokenizer.json */
    char *dir;                       /* model folder, NULL for builtin */
    struct flexdiag_vq *vq;          /* image decoder, NULL when the model has none */
    const flexdiag_kernels *vq_k;    /* backend of the decoder (the runtime's, or the CPU's
                                        when the runtime's backend lacks the image ops) */
    flexdiag_stream *vq_s;           /* its stream: rt->s, or an owned CPU stream */
    size_t vq_charge;                /* bytes charged to the arena for the decoder */
    int32_t *img_codes;              /* Chameleon: the VQGAN code of image id img_id0 + i
                                        (runtime/model/vocab_map.h); NULL otherwise */
};

/* Device buffers of a context, carved from one block (context.c ctx_layout); the KV policy's
 * own buffers follow them in the same block (policy_driver.h flexdiag_pd_bufs). */
typedef struct flexdiag_ctx_bufs {
    void *kv;          /* (layers, 2, s_host, h_kv, blk_p + ring, d_h) act: K then V per layer,
                          the sequences whose KV home is the device */
    void *kv_pre;      /* (layers, 2, n_pre, h_kv, p_cap, d_h) act: the shared prompt rows
                          (n_pre > 0), K then V per layer; NULL otherwise */
    int32_t *lp_pre;   /* (n_pre) prompt length of each shared prompt row */
    int32_t *prefix;   /* (n_seq) the shared prompt row of each sequence */
    int32_t *casc_seq; /* (n_seq) and (n_mb, casc_tiles, 3): each micro-batch's cascade plan */
    int32_t *casc_tile; /* (kernels.h flexdiag__cascade_plan; micro-batch indices) */
    void *kv_stage;    /* staging of the host-homed micro-batches (offload/sched.h
                          flexdiag__sched_kv_staging_bytes); NULL when every KV is here */
    void *wslots;      /* (WEIGHT_SLOTS, slot bytes) device weight slots of a split model */
    void *x;           /* (n_seq, p_cap, d) act: residual stream (decode uses (n_seq, d)) */
    void *xl_pre;      /* (n_pre, d) act: the last prompt row's hidden state of each shared
                          prompt row (n_pre > 0), what a sequence admitted onto it starts from */
    int32_t *last_pre; /* (n_pre) gather index of each shared prompt row's last row in x */
    void *h;           /* (mb_tok, d) normed input */
    void *qkv;         /* (mb_tok, (h_q + 2 h_kv) d_h) */
    void *att;         /* (mb_tok, h_q d_h) attention output */
    void *gu;          /* (mb_tok, 2 f) gate/up */
    void *mlp;         /* (mb_tok, f) swiglu output */
    void *xl;          /* (n_seq, d) last-position hidden / head input */
    void *hm;          /* (n_seq, max(dm, d)) head / aligner intermediate */
    void *emb;         /* (n_seq, max(8, d)) feedback embedding input */
    float *logits;     /* (n_seq, V) */
    float *cfg;        /* (n_img, V) */
    int32_t *ids_in;   /* (n_seq, p_cap) prompt ids */
    int32_t *lp;       /* (n_seq) */
    int32_t *pos_pf;   /* (mb_tok) prefill positions r % q (q: pf_table_q) */
    int32_t *rows_pf;  /* (mb_tok, h_kv) prefill cache rows r % q */
    int32_t *pos;      /* (n_seq) decode positions; a window pass: (n_seq, win) */
    int32_t *last;     /* (n_seq) gather index of each sequence's last prompt row */
    int32_t *ids;      /* (n_img) sampled / forced ids of the current step; a window pass:
                          (n_seq, win) the input id of every row */
    int32_t *win_rows; /* window passes (win > 1): (n_seq, win, h_kv) the cache row of each
                          row's K/V */
    int32_t *win_slots; /* (n_seq, win, max_slots) the ring rows each row attends; a policy
                           with per-(layer, KV head) lists (geo.win_lists > 1): (layers,
                           n_seq, win, h_kv, max_slots) */
    int32_t *win_nslots; /* (n_seq, win) their counts; per-head lists: (layers, n_seq, win,
                            h_kv) */
    flexdiag_sample_row *srows; /* (n_img) each image's draw of the current step (kernels.h) */
} flexdiag_ctx_bufs;

/* The shape of a context, fixed at its creation (context.c): slots, sequences, micro-batches,
 * prompt capacity and the decode length and vocabulary its heads produce. */
typedef struct flexdiag_ctx_geom {
    int32_t rows_per_img;            /* 2 with CFG (images), 1 (text) */
    int32_t n_img, n_seq;            /* capacity in images / sequences */
    int32_t mb_img, mb_seq, n_mb;    /* micro-batch size in images / sequences; count */
    int32_t pf_seq;                  /* sequences per prefill chunk (<= mb_seq): the prefill
                                        scratch holds pf_seq·p_cap tokens, not the batch's */
    int32_t p_cap;                   /* prompt rows per (sequence, KV head) */
    int32_t n_pre;                   /* shared prompt rows the context holds (0: each
                                        sequence keeps its own in its KV block) */
    int32_t blk_p;                   /* prompt rows in each sequence's KV block: p_cap, or 0
                                        when the prompt rows are shared (n_pre > 0) */
    size_t pre_bytes;                /* bytes of one shared prompt row's K (or V) in a layer */
    size_t seq_bytes;                /* bytes of one sequence's K (or V) in one layer */
    int32_t l_dec;                   /* decode tokens per sequence */
    int32_t vocab_out;               /* width of the sampled distribution */
    int32_t id0;                     /* id of its column 0 (Chameleon images: the first image
                                        code; 0 otherwise) */
    int32_t vocab_in;                /* ids the feedback embedding takes (Janus: image codes;
                                        text and Chameleon: the whole vocabulary) */
    int32_t row_len;                 /* Chameleon images: tokens per row of the image (grid
                                        codes + the forced row end); 0 otherwise */
    int32_t win;                     /* rows a sequence may run in one decode pass: the SJD
                                        window (params draft_len), 1 for sequential decoding */
    int32_t win_lists;               /* window passes: slot lists a row has: 1 (the position-
                                        only policies: one list per row) or layers · h_kv (a
                                        policy that plans per (layer, KV head): Diagonal) */
} flexdiag_ctx_geom;

/* Where the KV of the sequences the device does not hold lives (context.c ctx_kv_homes). */
typedef struct flexdiag_ctx_homes {
    int32_t s_host;                  /* first sequence whose KV home is pinned host memory
                                        (n_seq: all on the device) */
    int32_t s_disk;                  /* first sequence whose KV home is disk (n_seq: none);
                                        [s_host, s_disk) are pinned-homed */
    int32_t s_ca;                    /* with CPU attention, the host attends [s_host, s_ca) and
                                        the device [s_ca, s_disk) over streamed rows
                                        (params cpu_attention_pct); s_host without it */
    void *kv_host;                   /* (layers, 2, s_disk - s_host, seq_bytes) in the pinned
                                        pool, NULL when every KV is on the device; the disk
                                        home's staging and the CPU attention's workspaces
                                        follow it */
    flexdiag_store_extent kv_disk;   /* the disk home's extent of the store (bytes 0: none) */
    size_t kv_host_bytes;            /* its size, the workspaces included */
    struct flexdiag_cpu_attn *ca;    /* CPU attention of the host-homed micro-batches
                                        (cpu_attn.h), NULL without p.cpu_attention */
} flexdiag_ctx_homes;

/* The recorded decode-pass bodies (run.c step_body_graph), replayed every pass. */
typedef struct flexdiag_ctx_graphs {
    void *step[2];                   /* without / with policy scores */
    int32_t seq[2];                  /* sequences each was recorded for */
    int32_t eager_seq;               /* sequence count of the last op-by-op warm-up pass */
    int off;                         /* recording failed once: launch op by op */
} flexdiag_ctx_graphs;

/* Host staging of what a pass uploads (page-locked when the backend can). */
typedef struct flexdiag_ctx_upload {
    void *block;                     /* the host block holding the three below */
    int32_t *ids;                    /* (n_seq) sampled or forced ids */
    int32_t *pos;                    /* (n_seq) decode positions of a pass */
    flexdiag_sample_row *srows;      /* (n_img) staging of b.srows */
} flexdiag_ctx_upload;

/* A context: one block of work at a time (busy), independent of every other context of the
 * runtime: its own execution stream (CUDA stream + cuBLAS handles + workspace, or a CPU thread
 * pool), its own buffers, policy state and policy workers. What contexts share is read-only
 * (the model's weights) or thread-safe (the arena's accounting, the GEMM plan cache). It is its
 * shape (geo), the KV homes below the device (homes), the device block of buffers (b), the KV
 * policy (pd), the scheduler, the recorded passes (graphs) and the upload staging (up); the
 * sequences' own states live in the run (run_state.h) while one is in flight. */
struct flexdiag_context {
    flexdiag_model *m;               /* borrowed */
    flexdiag_context_params p;       /* copy, defaults applied */
    flexdiag_stream *s;              /* this context's execution stream (owned) */
    size_t stream_charge;            /* device bytes of s charged to the arena */
    flexdiag_ctx_geom geo;           /* its shape */
    flexdiag_ctx_homes homes;        /* KV below the device */
    flexdiag_policy_driver pd;       /* the KV policy: plans, slot lists, updates */
    flexdiag_sched *sched;           /* hands each (layer, micro-batch) its memory (owned) */
    void *block;                     /* device block holding every buffer */
    size_t block_bytes;              /* its size */
    flexdiag_ctx_bufs b;             /* carved buffers */
    int32_t pf_table_q;              /* the stride b.pos_pf and b.rows_pf hold (0: none yet) */
    int32_t pf_tokens;               /* tests: prefill chunk cap in tokens (0: the default) */
    int host_policy;                 /* tests: force the host state machines (no device policy) */
    flexdiag_ctx_graphs graphs;      /* recorded decode-pass bodies */
    flexdiag_ctx_upload up;          /* host staging of ids, positions, sampling rows */
    int32_t n_pf;                    /* distinct prompt rows of the last run's first
                                        admission (n_pre > 0), the rows its prefill ran; its
                                        sequences otherwise (stats) */
    atomic_int busy;                 /* a run is in flight (the queue's engine thread, or a
                                        scoring call) */
    atomic_int cancel;               /* cancel of a lock-step run (scoring) requested */
    struct flexdiag_queue *queue;    /* the request queue and its engine thread (api_queue.c) */
    flexdiag_stats stats;            /* counters of the last call */
    struct flexdiag_sjd_groups *groups; /* grouped SJD acceptance's codebook table (params
                                        sjd_group > 0; sjd.h), NULL otherwise */
    struct flexdiag_kvp_heads *heads; /* ssd, hack: the head plan from params policy_calib
                                        (ctx_calib.h; the policy reads it), NULL otherwise */
};

/* Lumina-mGPT's top-k inside the image (its README), used when a request leaves top_k at 0. */
#define FLEXDIAG_LUMINA_TOP_K 2000

/* The longest SJD window a context takes (params draft_len). */
#define FLEXDIAG_MAX_DRAFT FLEXDIAG_MAX_DRAFT_LEN

/* One run: n_img images generated (or scored) together. Host pointers. */
typedef struct flexdiag_block {
    int32_t n_img;                 /* images, <= context capacity */
    const int32_t *const *prompt;  /* n_img conditional prompt id arrays */
    const int32_t *prompt_len;     /* n_img lengths */
    int32_t n_steps;               /* tokens per image (<= l_dec) */
    const int32_t *forced;         /* (n_img, n_steps) teacher-forced ids, or NULL to sample */
    int64_t img0;                  /* global index of image 0 (sampling key) */
    flexdiag_sample_params sp;     /* sampling */
    float cfg_weight;              /* Janus CFG weight */
    int32_t *tokens;               /* out (n_img, n_steps) */
    float *logits;                 /* optional out (n_img, n_steps, V): CFG-combined (Janus) */
    float *raw_logits;             /* optional out (n_seq, n_steps, V): per-row logits */
    float *hidden;                 /* optional out (layers, n_hidden_pos, d): sequence 0 */
    float *attn_out;               /* optional out (n_steps - 1, layers, h_q·d_h): decode-step
                                      attention outputs of sequence 0 (fidelity) */
    int32_t *plan_out;             /* optional out (n_steps - 1, layers, n_seq, h_kv, 1 +
                                      max_slots): per decode step the attended ring slots of
                                      every (sequence, KV head), count first (tests) */
    int32_t n_hidden_pos;          /* positions captured in hidden */
    flexdiag_progress_fn progress; /* optional, per decode step */
    void *progress_user;
    double *split;                 /* optional (4): decode seconds in GEMMs, attention (incl. the
                                      policy), everything else, and the profiled steps' whole
                                      wall time; each op group is bracketed by stream syncs, so
                                      use it on a separate profiling run */
    int32_t split_from;            /* first decode step profiled into split (earlier steps run
                                      normally, graphs included) */
} flexdiag_block;

/* One job of the engine: an image (its CFG rows) or a text continuation, which holds one slot
 * of the context from its admission to its retirement, at its own decode step. Pointers are
 * borrowed until the feed's done() for it. */
typedef struct flexdiag_job {
    const int32_t *prompt;     /* conditional prompt ids (prompt_len of them) */
    int32_t prompt_len;
    int32_t n_steps;           /* tokens to generate, 1 .. the context's l_dec */
    int32_t eos;               /* text: the id that ends the job early (kept), -1: none */
    int64_t img;               /* sampling key: the image (request) index */
    flexdiag_sample_params sp; /* temperature, top_k, top_p, seed (id0 is the context's) */
    float cfg_weight;          /* CFG weight (images) */
    const int32_t *forced;     /* (n_steps) teacher-forced ids, or NULL to sample */
    int32_t draft_len;         /* SJD window (window.c), <= the context's geo.win; 0 or 1:
                                  sequential */
    int32_t sjd_group;         /* grouped acceptance over codes either side of a draft (sjd.h;
                                  needs the context's groups); 0: exact */
    int32_t passes;            /* out: decode passes it took part in (serve.c) */
    int32_t accepted[FLEXDIAG_MAX_DRAFT - 1]; /* out: [k] drafts accepted in window row k + 1
                                  (window.c) */
    int32_t *tokens;           /* out (n_steps) */
    float *logits;             /* optional out (n_steps, vocab_out): the distribution each token
                                  was drawn from (CFG-combined for images); tests, fidelity */
    const atomic_int *cancel;  /* nonzero: retire the job at the next step boundary; or NULL */
    void *tag;                 /* the feed's */
    int32_t idx;               /* the feed's */
} flexdiag_job;

/* Where a run of the engine takes its jobs and leaves their results. The engine calls it from
 * its own thread, at step boundaries only. */
typedef struct flexdiag_feed {
    /* The next waiting job, or NULL; it stays first until take() (admission is FIFO: a job the
     * context cannot take yet holds the ones behind it). */
    const flexdiag_job *(*peek)(void *user);
    void (*take)(void *user);
    /* No sequence is live: block until a job waits (return 1) or none will come (0). */
    int (*wait)(void *user);
    /* (optional) token `step` of job is in job->tokens. */
    void (*token)(void *user, const flexdiag_job *job, int32_t step);
    /* job ended: st OK with its n tokens (n_steps, or fewer after its eos), CANCELLED with the n
     * it made, or a failure (NUMERIC: its logits; INVALID_ARG: refused at admission, n = 0;
     * the run's failure) with msg saying what failed ("" for OK). */
    void (*done)(void *user, const flexdiag_job *job, int32_t n, flexdiag_status st,
                 const char *msg);
    /* (optional) The run stops with a failure (a cancel of the whole run included): the feed
     * cancels what it still holds of the requests the run served, before done() of the live
     * jobs; what is submitted after this call is not affected. */
    void (*abort)(void *user);
    void *user;
    int lockstep;  /* admit only when no sequence is live (--batching blocks) */
    int fail_fast; /* a job's failure ends the run with its status (a block: one image fails
                      the block) */
} flexdiag_feed;

/* Run jobs from f on context c until f has no more (wait() returns 0 with nothing live), each
 * admitted into a free slot at a step boundary once the slots and shared prompt rows it needs
 * are free (continuous batching), retired when its tokens are made. A context cancel retires
 * every live job (CANCELLED) and returns CANCELLED; a failure of the engine fails the live jobs
 * with it and returns it. The caller holds c busy. */
flexdiag_status flexdiag__engine_serve(flexdiag_context *c, const flexdiag_feed *f);

/* Device bytes a context with these params needs (for --batch auto and error messages). */
flexdiag_status flexdiag__context_bytes(const flexdiag_model *m, const flexdiag_context_params *p,
                                        size_t *out);
/* The same, and (host may be NULL) the pinned host bytes of its KV home (kv_pct). */
flexdiag_status flexdiag__context_sizes(const flexdiag_model *m, const flexdiag_context_params *p,
                                        size_t *dev, size_t *host);
/* Store bytes of the disk KV home of a context with these params (0: none), what its creation
 * carves from the runtime's store. */
flexdiag_status flexdiag__context_disk_bytes(const flexdiag_model *m,
                                             const flexdiag_context_params *p, uint64_t *out);
/* Micro-batches of n_mb homed on the GPU, in pinned memory and on disk (out[0..2]) for KV homes
 * pct (percent; all 0: on the GPU): the GPU's and the disk's shares rounded down to whole
 * micro-batches, the disk's being the rest when the pinned share is 0. pct sums to 100. */
void flexdiag__kv_home_split(int32_t n_mb, const uint32_t pct[3], int32_t out[3]);
/* Pinned host bytes a new context's KV home may take: the pool's largest free run, --cpu-mem
 * before the pool exists, unlimited without either (the pool is then sized by that need). */
uint64_t flexdiag__context_host_avail(const flexdiag_model *m);
/* Largest max_images (micro_batch scaled along when set) whose context fits in `avail` device
 * bytes and the host bytes its KV home may take; 0 when not even one image fits. */
int32_t flexdiag__context_fit(const flexdiag_model *m, const flexdiag_context_params *p,
                              uint64_t avail);
/* Tiles of the cascade plan of a micro-batch of nb sequences over c's shared prompt rows
 * (kernels.h flexdiag__cascade_tiles; 0 without shared prompt rows). */
int32_t flexdiag__casc_tiles(const flexdiag_context *c, int32_t nb);
/* The CPU attention's counters into the offload report (cpu_attn.c; zero without it). */
void flexdiag__cpu_attn_stats(const flexdiag_context *c, flexdiag_offload_info *out);
/* Size, allocate and carve c's buffers from c->m and c->p (c->host_policy may be preset). */
flexdiag_status flexdiag__context_alloc(flexdiag_context *c);
/* The prefill tables (b.pos_pf, b.rows_pf) for prefill passes of q rows a sequence (q <= p_cap),
 * queued on c's stream when they hold another stride. */
flexdiag_status flexdiag__context_pf_tables(flexdiag_context *c, int32_t q);
/* Free what flexdiag__context_alloc made (not c itself). */
void flexdiag__context_free(flexdiag_context *c);
/* Run one block on context c. */
flexdiag_status flexdiag__engine_run(flexdiag_context *c, const flexdiag_block *b);
/* Take c for a run (busy), waiting for the run in flight to end: the queue's engine thread and
 * scoring calls take turns. Release with atomic_store(&c->busy, 0). Never from inside a run
 * (a callback of it): that waits forever. */
void flexdiag__context_take(flexdiag_context *c);
/* Teacher-forced scoring of one image (or text continuation): prompt (np ids, the conditional
 * row) then ids (n); logits (n, V) CFG-combined for Janus / plain for Llama, raw (rows, n, V)
 * per-row logits; either may be NULL. Takes the context for the call (flexdiag__context_take). */
flexdiag_status flexdiag__context_score(flexdiag_context *c, const int32_t *prompt, int32_t np,
                                        const int32_t *ids, int32_t n, float cfg_weight,
                                        float *logits, float *raw);

#endif /* FLEXDIAG_ENGINE_H */
