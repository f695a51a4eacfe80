/*
 * kvp_calib.h - the per-model calibration of the head-typed policies SSD and HACK
 * (docs/policies.md §7.2, §9, §10): the table a dense calibration run records, its file, and
 * the per-(layer, KV head) plan the two policies derive from it for one budget.
 *
 *   table  per (layer, query head) the lag profile P(l), l = 0 .. L_dec-1 (the mean over the
 *          recorded (step, sequence) pairs of the decode-normalised probability of the key at
 *          lag l), and the column variance V (the spread, across the recorded queries, of what
 *          each early key receives), with the identity of the run (model config hash, W_s,
 *          shape, prompt-file hash, n_cal, seed, backend). Collected by the internal policy
 *          kind FLEXDIAG__POLICY_CALIBRATE (policy_calib.c), which attends like dense and sums
 *          the profile in its own state; flexdiag__kvp_calib_export folds those sums into a
 *          table. Read and written by kvp_calib.c (format below), checked against a model by
 *          the context (runtime/engine/ctx_calib.c).
 *   heads  the plan of one context: a type per (layer, KV head), the budgets and the
 *          structural lag lists (kvp_heads.c), made once at context creation and read by the
 *          ssd / hack classes through flexdiag_kvp_params.heads; shared by every sequence and
 *          CFG row, never written after it is made.
 *
 * File format, version 1, little-endian: a 128-byte header
 *   0 "FDXCALIB"  8 u32 version (1)  12 u32 header bytes (128)  16 u64 model config hash
 *   24 u64 prompt-file hash (FNV-1a 64 of its bytes)  32 u64 seed  40 u64 recorded pairs
 *   48 i32 W_s  52 i32 L_dec  56 i32 layers  60 i32 h_q  64 i32 h_kv  68 i32 t0 (first
 *   recorded step)  72 i32 t_end (last recorded step + 1)  76 i32 n_cal  80 char backend[16]
 *   (NUL-padded)  96..127 zero
 * then P as f32 (layers, h_q, L_dec), V as f64 (layers, h_q), then a u64 FNV-1a 64 of every
 * byte before it. Janus-Pro-7B (30 x 32 heads, L_dec 576): 2.2 MB.
 */
#ifndef FLEXDIAG_KVP_CALIB_H
#define FLEXDIAG_KVP_CALIB_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_POLICY
#error "policy/kvp_calib.h: a lower layer may not use policy/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "policy/kv_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The collector: an internal policy kind, outside the public enum and the name list (no
 * command-line name): dense attention, the decode-normalised probabilities of the steps
 * t >= floor(L_dec / 2) summed per (sequence, layer, query head). */
#define FLEXDIAG__POLICY_CALIBRATE ((flexdiag_policy_kind)0x100)

#define FLEXDIAG_CALIB_VERSION 1u
#define FLEXDIAG_CALIB_HEADER 128
#define FLEXDIAG_CALIB_BACKEND 16 /* bytes of the backend name, NUL included */

typedef struct flexdiag_kvp_calib {
    uint64_t config_hash;  /* the model's (runtime/engine/ctx_calib.c) */
    uint64_t prompts_hash; /* FNV-1a 64 of the prompt file's bytes */
    uint64_t seed;         /* sampling seed of the run */
    uint64_t pairs;        /* recorded (step, sequence) pairs, the same for every head */
    int32_t w_s, l_dec;    /* image line (row stride) and decode tokens */
    int32_t n_layers, h_q, h_kv;
    int32_t t0, t_end;     /* recorded steps t0 <= t < t_end */
    int32_t n_cal;         /* prompts (images) of the run */
    char backend[FLEXDIAG_CALIB_BACKEND]; /* "cpu", "cuda", ... */
    float *P;              /* (n_layers, h_q, l_dec) lag profile, each row sums to 1 */
    double *V;             /* (n_layers, h_q) column variance */
} flexdiag_kvp_calib;

#define FLEXDIAG_FNV_BASIS 0xcbf29ce484222325ull
/* FNV-1a 64 of n bytes continued from h (FLEXDIAG_FNV_BASIS to start): the file's checksum,
 * the prompt-file hash and the model config hash. */
uint64_t flexdiag__fnv1a64(uint64_t h, const void *data, size_t n);

/* A zeroed table of this shape with P and V allocated (one allocation). */
flexdiag_status flexdiag__kvp_calib_alloc(int32_t n_layers, int32_t h_q, int32_t h_kv,
                                          int32_t l_dec, flexdiag_kvp_calib **out);
void flexdiag__kvp_calib_free(flexdiag_kvp_calib *tab);
/* Write tab to path (replaced). FLEXDIAG_ERR_IO naming the file on failure. */
flexdiag_status flexdiag__kvp_calib_write(const char *path, const flexdiag_kvp_calib *tab);
/* Read and check a table file: FLEXDIAG_ERR_NOT_FOUND / _IO when it cannot be read,
 * FLEXDIAG_ERR_INVALID_ARG for anything malformed, each message naming the file and what is
 * wrong (magic, version, a field out of range, the size, the checksum, a profile that is not a
 * distribution, a negative or non-finite variance). *out NULL on failure. */
flexdiag_status flexdiag__kvp_calib_read(const char *path, flexdiag_kvp_calib **out);
/* The same checks on bytes in memory; name stands for the file in messages. */
flexdiag_status flexdiag__kvp_calib_parse(const void *data, size_t n, const char *name,
                                          flexdiag_kvp_calib **out);
/* The collector's sums (a kvp of kind FLEXDIAG__POLICY_CALIBRATE) as a table: the shape,
 * t0 / t_end, pairs, P (the lag sums over every sequence slot divided by their total) and V
 * (the mean over keys k < t0 of max(0, S2/n - (S1/n)^2)); the identity fields are left for the
 * caller. FLEXDIAG_ERR_INVALID_ARG when no step was recorded. */
flexdiag_status flexdiag__kvp_calib_export(const flexdiag_kvp *kvp, flexdiag_kvp_calib **out);

/* ---- the plan of a context (kvp_heads.c) ---- */

enum {
    FLEXDIAG_HEAD_WINDOW = 0, /* SSD spatial: the last N_att tokens */
    FLEXDIAG_HEAD_SEMANTIC,   /* SSD semantic / HACK contextual: H2O with K = 2 at budget b_c */
    FLEXDIAG_HEAD_LAGS,       /* HACK structural: sinks + a static lag list */
};

#define FLEXDIAG_HACK_SINKS 4 /* HACK's "first scales": decode tokens 0..3 */

typedef struct flexdiag_kvp_heads {
    flexdiag_policy_kind kind; /* ssd or hack */
    int32_t n_att, l_dec, w_s, n_layers, h_kv; /* what it was made for (create checks them) */
    double tau;           /* SSD: a KV head is spatial iff lambda(N_att) >= tau */
    int32_t n_heads[3];   /* KV heads of each type */
    int32_t b_c;          /* budget of a semantic head (SSD: N_att) */
    int32_t b_s;          /* HACK: budget of a structural head (sinks + lags) */
    int32_t n_lags;       /* HACK: lags per structural list, b_s - sinks */
    int32_t lag_ring;     /* HACK: ring rows behind the sinks, 1 + the largest lag of any list */
    int32_t ring;         /* rows R per (sequence, KV head): the largest of the types present */
    int32_t max_slots;    /* the largest attended count of any type */
    uint8_t *type;        /* (n_layers, h_kv) FLEXDIAG_HEAD_* */
    double *lambda;       /* (n_layers, h_kv) SSD: local mass lambda(N_att); HACK: log V */
    int16_t *lags;        /* (n_layers, h_kv, n_lags) HACK structural lists, ascending */
} flexdiag_kvp_heads;

/* The plan of kind (ssd or hack) for a resolved budget n_att on the model the table describes
 * (its w_s, l_dec, layers, heads). SSD: spatial iff lambda(N_att) >= tau (the mean over the
 * group of sum_{l < N_att} P(l)), else semantic at b_c = N_att. HACK: the KV heads sorted by
 * log V (mean over the group), split at the largest gap inside the 10 %-90 % quantile range
 * (contextual below it, share alpha), b_s = floor(4 n N_att / (4 n - 3 n_c)) (kappa = 1/4) at
 * most L_dec, b_c = max(2, floor((n N_att - n_s b_s) / n_c)) at most L_dec; a structural list
 * holds lags 0 .. W_s + 1, then the b_s - 4 - (W_s + 2) lags of (W_s + 1, l_cap] with the largest
 * P (ties: the smaller lag), l_cap = min(max(4 W_s, b_s - 5), L_dec - 5). FLEXDIAG_ERR_INVALID_ARG
 * naming context_params.policy.n_att when the budget cannot hold the rule. */
flexdiag_status flexdiag__kvp_heads_make(const flexdiag_kvp_calib *tab, flexdiag_policy_kind kind,
                                         int32_t n_att, double tau, flexdiag_kvp_heads **out);
void flexdiag__kvp_heads_free(flexdiag_kvp_heads *h);
/* Type of (layer, KV head h). */
static inline int flexdiag__kvp_head_type(const flexdiag_kvp_heads *hd, int32_t layer,
                                          int32_t h) {
    return hd->type[(size_t)layer * (size_t)hd->h_kv + (size_t)h];
}
/* Lag list of a structural (layer, KV head) (n_lags entries, ascending). */
static inline const int16_t *flexdiag__kvp_head_lags(const flexdiag_kvp_heads *hd,
                                                     int32_t layer, int32_t h) {
    return hd->lags + ((size_t)layer * (size_t)hd->h_kv + (size_t)h) * (size_t)hd->n_lags;
}

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_KVP_CALIB_H */
