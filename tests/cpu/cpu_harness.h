/*
 * cpu_harness.h - helpers shared by the CPU kernel tests: guarded output buffers
 * (docs/architecture.md §10.2: 1024 known floats on each side must come back bit-identical), stream
 * creation, and a random attention fixture (caches, per-sequence prompt lengths, slot lists in
 * random order, some heads with no ring slots, one sequence with an empty prompt) built from a
 * shape table entry.
 */
#ifndef FLEXDIAG_TEST_CPU_HARNESS_H
#define FLEXDIAG_TEST_CPU_HARNESS_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "util.h"

#define CH_GUARD 1024 /* guard floats on each side of an output */
#define CH_ATOL 1e-5  /* docs/architecture.md §10.2 fp32 tolerances */
#define CH_RTOL 1.3e-6
#define CH_NMSE 1e-7

/* ---- guarded buffers ---- */

/* n floats (4-byte elements) with CH_GUARD known floats on each side; the n are set to fill. */
float *ch_guarded(int64_t n, float fill);
/* Assert both guards of p (from ch_guarded) are intact, naming label on failure. */
void ch_guard_check(const float *p, int64_t n, const char *label);
/* Free a ch_guarded buffer (NULL is a no-op). */
void ch_guarded_free(float *p);

/* ---- streams ---- */

/* A stream of K with threads workers (asserting success); threads < 0 gives NULL (no stream). */
flexdiag_stream *ch_stream(const flexdiag_kernels *K, int threads);

/* ---- attention fixture ---- */

typedef struct ch_attn_case {
    int32_t n_seq, h_q, h_kv, d_h, p_cap, ring, max_slots;
} ch_attn_case;

typedef struct ch_attn_fix {
    flexdiag_attn_args a; /* lp, slots, n_slots point into this fixture */
    int64_t width;        /* qkv row width: (h_q + 2·h_kv)·d_h */
    int64_t cache_n;      /* floats per cache: n_seq·h_kv·(p_cap + ring)·d_h */
    float *qkv_dec;       /* (n_seq, width) decode queries */
    float *qkv_pre;       /* (n_seq·p_cap, width) prompt queries */
    float *k, *v;         /* (cache_n) random caches */
    int32_t *lp;          /* (n_seq) */
    int32_t *slots;       /* (n_seq, h_kv, max_slots), distinct ring rows in random order */
    int32_t *n_slots;     /* (n_seq, h_kv) */
} ch_attn_fix;

/* Random fixture for shape c: lp[0] = p_cap, lp[1] = 0, others random; n_slots 0 for head 0 of
 * odd sequences, others random in [0, max_slots]. */
void ch_attn_fix_init(ch_attn_fix *f, const ch_attn_case *c, uint64_t seed);
void ch_attn_fix_free(ch_attn_fix *f);

#endif /* FLEXDIAG_TEST_CPU_HARNESS_H */
