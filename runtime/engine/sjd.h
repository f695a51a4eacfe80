/*
 * sjd.h - speculative Jacobi decoding (SJD) on the host: the verification of a sequence's
 * drafts against the distributions one window pass computed, and the next drafts
 * (docs/decoding.md). Pure functions of their arguments, no engine state, so the acceptance
 * rule can be tested alone.
 *
 * A window pass runs rows 0..nv-1 of a sequence: row 0 its last committed token, row i >= 1
 * its draft d[i-1]. Row i's output is p[i], the distribution sequential sampling would draw
 * the token after row i's from, exact as long as rows 0..i hold committed or accepted tokens.
 * Verification walks i = 0, 1, ...: draft d[i] (drawn from q[i]) is accepted with probability
 * min(1, p[i](d)/q[i](d)); at the first rejection the token is drawn from the residual
 * norm(max(0, p[i] - q[i])) and the walk stops; a row without a draft (the last) draws from
 * p[i] as sequential sampling does, with its uniform. The committed tokens are then
 * distributed as sequential sampling's (the speculative-sampling argument), and at least one
 * is committed a pass. Draws are keyed by (seed, request, token index, what is drawn), never by
 * a neighbour: the plain draw uses sequential sampling's key, so a sequence without drafts
 * draws what sequential decoding draws, bit for bit.
 *
 * The next drafts come from this pass's p (a Jacobi update) by a Gumbel-max draw whose noise is
 * keyed by the token index (MC-SJD's coupling: a draft stays put while its distribution barely
 * moves), positions past the pass's rows from its last row's p.
 *
 * Grouped acceptance (GSD, So et al. 2025; lossy, docs/decoding.md §7): with a group G > 0 an
 * image draft d is tested against a group C of look-alike codes instead of itself alone,
 * accepted when u · q[i](C) < p[i](C). C is d and those of the G codes the target ranks just
 * above d and the G just below it (in p[i]) whose VQ codebook vectors point nearly the same way
 * as d's (cosine > FLEXDIAG_GSD_COS) and whose probability lies within FLEXDIAG_GSD_DP of d's.
 * Rejection resamples the token-level residual as exact SJD does. G 0 is exact SJD, bit for bit.
 */
#ifndef FLEXDIAG_SJD_H
#define FLEXDIAG_SJD_H

#include <stdint.h>

#include "flexdiag.h"

#define FLEXDIAG_MAX_GROUP 64   /* the largest group G: codes ranked either side of a draft */
#define FLEXDIAG_GSD_COS 0.75f  /* codebook closeness: cosine above it (squared distance of unit
                                   rows below 0.5, the official code's latent threshold) */
#define FLEXDIAG_GSD_DP 0.15f   /* probability closeness: |p(c) - p(d)| below it (ditto) */

/* What keys a sequence's draws. */
typedef struct flexdiag_sjd_key {
    uint64_t seed;
    int64_t req; /* the request (image) index */
} flexdiag_sjd_key;

/* What grouped acceptance compares codes by: the unit codebook vector of each column (one a
 * context, flexdiag__sjd_groups_make). */
typedef struct flexdiag_sjd_groups {
    int64_t V;   /* columns */
    int32_t dim; /* vector length */
    float *unit; /* (V, dim): column j's codebook row, L2-normalised; zeros for a column that is
                    no code (it joins no group) */
} flexdiag_sjd_groups;

/* A sequence's acceptance: exact (groups NULL or group 0) or grouped over group codes either
 * side of each draft. */
typedef struct flexdiag_sjd_accept {
    const flexdiag_sjd_groups *groups;
    int32_t group; /* 0 .. FLEXDIAG_MAX_GROUP */
} flexdiag_sjd_accept;

/* The groups of V columns: column j is codebook row col_code[j] (col_code NULL: row j) of the
 * (n_codes, dim) host codebook; a code outside [0, n_codes) gets zeros. *out is NULL on
 * failure (FLEXDIAG_ERR_OOM_HOST). */
flexdiag_status flexdiag__sjd_groups_make(const float *codebook, int32_t n_codes, int32_t dim,
                                          const int32_t *col_code, int64_t V,
                                          flexdiag_sjd_groups **out);
/* Free; NULL is a no-op. */
void flexdiag__sjd_groups_free(flexdiag_sjd_groups *g);

/* The group of draft d under p (V columns; a->group >= 1) summed: *pc = p(C), *qc = q(C)
 * (doubles). */
void flexdiag__sjd_group_mass(const flexdiag_sjd_accept *a, const float *p, const float *q,
                              int64_t V, int32_t d, double *pc, double *qc);

/* Verify nv rows: p (nv, V) targets; draft (nv - 1) ids as columns 0..V-1 and q (nv - 1, V)
 * their distributions; forced (nv) the column the token after row i must take (-1: drawn;
 * a forced token is committed without a draw and its draft is accepted when it equals it);
 * m0 the index of the token after row 0; acc the acceptance (NULL: exact). Writes the committed
 * columns to out and returns how many (1..nv). res: V floats of scratch. */
int32_t flexdiag__sjd_verify(const flexdiag_sjd_key *key, int64_t m0, const float *p, int32_t nv,
                             const int32_t *draft, const float *q, const int32_t *forced,
                             int64_t V, const flexdiag_sjd_accept *acc, int32_t *out, float *res);

/* The column a draft of token m takes from q: argmax over columns of log q + Gumbel noise keyed
 * by (key, m) (columns with q 0 never; ties: the lower column). */
int32_t flexdiag__sjd_draw_draft(const flexdiag_sjd_key *key, int64_t m, const float *q,
                                 int64_t V);

#endif /* FLEXDIAG_SJD_H */
