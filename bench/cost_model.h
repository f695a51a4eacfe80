/*
 * cost_model.h - the policy search's cost model (docs/search.md): memory per tier and predicted
 * time of one configuration (batch, micro-batch, weight placement, KV homes, policy) on a
 * machine described by a measured profile (`flexdiag profile`).
 *
 * Memory verdicts come from the runtime's own sizing: the device bytes of the weights from
 * flexdiag__weights_plan, of a context from flexdiag__context_bytes over a model shell (the
 * config and the placement's cut, no weights loaded), against what a runtime created with the
 * same --gpu-mem has available. Time is an overlap model of the tiered scheduler: per layer
 * max(compute, H2D, D2H, disk, host attention, host memory), weights streamed one layer ahead
 * on a copy stream, the copies and the CPU attention sharing the host's memory bandwidth.
 */
#ifndef FLEXDIAG_BENCH_COST_MODEL_H
#define FLEXDIAG_BENCH_COST_MODEL_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_BENCH)
#error "bench/cost_model.h is private to bench/ (docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"
#include "runtime/engine/engine.h"

#define CM_COPY_SIZES 4 /* transfer sizes a profile measures */
#define CM_GEMM_ROWS 6  /* GEMM row classes a profile measures */
#define CM_RES 6        /* resources of a layer: compute, H2D, D2H, disk, host attention,
                           host memory */

/* A machine's measured rates (bytes/s, FLOP/s); 0 = not measured. */
typedef struct cm_profile {
    char device[128];                    /* device name the rates belong to */
    char backend[16];                    /* "cpu", "cuda" */
    double copy_bytes[CM_COPY_SIZES];    /* bytes per transfer of each H2D / D2H sample */
    double h2d[CM_COPY_SIZES];           /* pinned host -> device on a copy stream */
    double d2h[CM_COPY_SIZES];           /* device -> pinned host on a copy stream */
    double kv_h2d;                       /* a KV home's strided load (copy_h2d_2d_async of
                                            256-byte rows); 0 in older profiles: the H2D rate */
    double hbm;                          /* device copy, bytes read + written per second */
    double gemm_rows[CM_GEMM_ROWS];      /* rows n of each GEMM sample (n, k) x (k, 4k) */
    double gemm[CM_GEMM_ROWS];           /* its FLOP/s */
    int64_t gemm_k;                      /* k of the GEMM samples */
    double disk;                         /* O_DIRECT reads at disk_qd x disk_req */
    int disk_qd;                         /* requests in flight */
    double disk_req;                     /* bytes per request */
    double host_read;                    /* host memory read by all threads (CPU attention's
                                            bound); 0 in profiles written before it was measured */
    double host_attn;                    /* KV bytes/s the CPU attention kernel reads with all
                                            threads (the model's CPU attention term; 0 in older
                                            profiles: host_read is used) */
    double op_eager, op_graph;           /* seconds per small op launched one by one and
                                            replayed from a launch graph (0 in older profiles:
                                            no per-op term) */
} cm_profile;

/* A model without its weights: the config and the placement cut the context sizing reads, on
 * a real runtime (its op table and device budget). */
typedef struct cm_model {
    flexdiag_model m;            /* shell: rt, cfg and w.homes only */
    flexdiag_weight_homes homes; /* cut of the placement being sized (m.w.homes points here) */
    uint64_t avail;              /* device bytes the runtime had available at creation */
    uint64_t vq_bytes;           /* device bytes the image decoder charges */
} cm_model;

/* One candidate configuration. */
typedef struct cm_config {
    uint32_t wpct[3];              /* --weights G,C,D */
    uint32_t kvpct[3];             /* --kv G,C,D */
    int32_t batch, micro;          /* images per block, per micro-batch (0 = batch) */
    int32_t prompt_len;            /* tokens of the conditional prompt */
    int32_t gen_len;               /* text models: new tokens (0: images) */
    flexdiag_policy_params policy; /* the KV policy */
    int cpu_attention;             /* --cpu-attention: the host attends the host-homed KV */
    uint32_t cpu_attn_pct;         /* --cpu-attention-share: the percent of the host-homed
                                      micro-batches it attends (0: 100) */
    int32_t images_per_prompt;     /* --images-per-prompt: images sharing a prompt's KV rows
                                      (0 or 1: none) */
    int32_t steps;                 /* tokens the prediction averages the decode step over, as
                                      `bench --steps` projects (0: the whole image) */
    int compress;                  /* --compress-weights 4bit: the streamed weights packed */
} cm_config;

/* Memory of a configuration per tier, and whether it fits. */
typedef struct cm_memory {
    uint64_t gpu;      /* device bytes: weights on the device + decoder + context */
    uint64_t cpu;      /* pinned bytes: host part of the weights + disk staging + KV home */
    uint64_t disk;     /* store bytes: the weights' disk part and the disk KV home */
    int fits_gpu;      /* gpu <= what the runtime had available */
    int fits_cpu;      /* cpu <= the host limit (1 when none was given) */
} cm_memory;

/* Predicted time of a configuration. */
typedef struct cm_time {
    double prefill_s;      /* the block's prefill */
    double step_s;         /* mean decode step */
    double img_s;          /* images (or sequences) per second over a whole block */
    double tok_s;          /* generated tokens per second over a whole block */
    double layer_ms[CM_RES]; /* mean decode step, one layer: compute, H2D, D2H, disk, host
                              attention, host memory */
    const char *bound;     /* the largest: "compute", "h2d", "d2h", "disk", "cpu",
                              "host memory" */
} cm_time;

/* The shell of model dir (NULL: builtin arch) on rt, with rt's available device bytes and the
 * decoder's charge. Returns a status with the library's message. */
flexdiag_status cm_model_init(cm_model *cm, flexdiag_runtime *rt, const char *dir,
                              const char *arch);
/* The geometry of c as the context would resolve it: decode tokens, CFG rows per image,
 * resolved policy (n_att, n_r) and ring rows. Returns INVALID_ARG with the library's message. */
flexdiag_status cm_resolve(const cm_model *cm, const cm_config *c, int32_t *l_dec,
                           int32_t *rows_per_img, flexdiag_kvp_params *kp, int32_t *ring);
/* Memory of c; cpu_mem is the host limit (search: --cpu-mem or a share of the RAM; 0: none). */
flexdiag_status cm_memory_of(cm_model *cm, const cm_config *c, uint64_t cpu_mem,
                             cm_memory *out);
/* Predicted time of c on profile p. */
flexdiag_status cm_predict(const cm_model *cm, const cm_config *c, const cm_profile *p,
                           cm_time *out);
/* Micro-batches of c whose KV lives in pinned host memory (*host) and, of those, the ones the
 * host attends (*attended: 0 without CPU attention), as the context cuts and rounds them. */
void cm_host_mbs(const cm_config *c, int32_t *host, int32_t *attended);

/* ---- profile file ---- */

/* Default path: $XDG_CACHE_HOME or ~/.cache, /flexdiag/profile-<device>.json (spaces and
 * slashes of the device name as '_'). 0, or 1 when neither variable is set. */
int cm_profile_path(const char *device, char *out, size_t n);
/* Write p as JSON to path (folders made); 0 or 1 after a message. */
int cm_profile_write(const cm_profile *p, const char *path);
/* Read path into p; refuses a profile of another device (device non-NULL) naming the file.
 * 0, 1 (missing or unreadable file), 2 (another device). Messages start with cmd. */
int cm_profile_read(const char *cmd, const char *path, const char *device, cm_profile *p);

#endif /* FLEXDIAG_BENCH_COST_MODEL_H */
