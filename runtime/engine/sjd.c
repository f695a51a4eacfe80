/*
 * sjd.c - the acceptance rules (exact, and grouped: GSD, lossy) and the drafts of speculative
 * Jacobi decoding (sjd.h), and the per-context codebook table grouped acceptance reads.
 */
#include "runtime/engine/sjd.h"

#include <math.h>
#include <stdlib.h>

#include "base/core.h"
#include "kernels/kernels.h"

/* What a token index's draws are for (the third key of flexdiag__rng64, above any index). */
enum { DRAW_ACCEPT = 1, DRAW_RESIDUAL = 2, DRAW_GUMBEL = 3 };

static uint64_t tag(int64_t m, int what) { return ((uint64_t)what << 48) | (uint64_t)m; }

/* The residual norm(max(0, p - q)) into res, drawn with u; p itself when it has no mass (p and
 * q equal up to rounding). */
static int32_t draw_residual(const float *p, const float *q, int64_t V, double u, float *res) {
    double mass = 0.0;
    for (int64_t j = 0; j < V; j++) {
        float d = p[j] - q[j];
        res[j] = d > 0.0f ? d : 0.0f;
        mass += res[j];
    }
    return flexdiag__sample_walk(mass > 0.0 ? res : p, V, u);
}

/* ---- grouped acceptance ---- */

flexdiag_status flexdiag__sjd_groups_make(const float *codebook, int32_t n_codes, int32_t dim,
                                          const int32_t *col_code, int64_t V,
                                          flexdiag_sjd_groups **out) {
    *out = NULL;
    flexdiag_sjd_groups *g = calloc(1, sizeof *g);
    float *unit = malloc((size_t)V * (size_t)dim * sizeof *unit);
    if (!g || !unit) {
        free(g);
        free(unit);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "grouped acceptance: no host memory for "
                             "%lld codebook rows of %d", (long long)V, dim);
    }
    for (int64_t j = 0; j < V; j++) {
        int32_t code = col_code ? col_code[j] : (int32_t)j;
        const float *x = code >= 0 && code < n_codes ? codebook + (int64_t)code * dim : NULL;
        double norm = 0.0;
        for (int32_t k = 0; x && k < dim; k++) norm += (double)x[k] * x[k];
        double s = norm > 0.0 ? 1.0 / sqrt(norm) : 0.0; /* 0: no code, or a zero row */
        for (int32_t k = 0; k < dim; k++) unit[j * dim + k] = s > 0.0 ? (float)(x[k] * s) : 0.0f;
    }
    *g = (flexdiag_sjd_groups){.V = V, .dim = dim, .unit = unit};
    *out = g;
    return FLEXDIAG_OK;
}

void flexdiag__sjd_groups_free(flexdiag_sjd_groups *g) {
    if (!g) return;
    free(g->unit);
    free(g);
}

/* Whether column a ranks before column b in p: the higher probability, then the lower column. */
static int ranks_before(const float *p, int32_t a, int32_t b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

/* Whether a lies closer to the draft than b on side `below` (0: both rank before the draft, the
 * later the closer; 1: both after it, the earlier the closer). */
static int closer(const float *p, int below, int32_t a, int32_t b) {
    return below ? ranks_before(p, a, b) : ranks_before(p, b, a);
}

/* Column j into near[0..*n), the (at most G) columns of its side nearest the draft, nearest
 * first. */
static void keep_near(const float *p, int below, int32_t j, int32_t *near, int32_t *n, int32_t G) {
    if (*n == G && !closer(p, below, j, near[G - 1])) return;
    int32_t i = *n < G ? (*n)++ : G - 1; /* full: the farthest drops out */
    for (; i > 0 && closer(p, below, j, near[i - 1]); i--) near[i] = near[i - 1];
    near[i] = j;
}

/* Whether code c joins draft d's group: codebook vectors within FLEXDIAG_GSD_COS, probabilities
 * within FLEXDIAG_GSD_DP. */
static int look_alike(const flexdiag_sjd_groups *g, const float *p, int32_t d, int32_t c) {
    const float *a = g->unit + (int64_t)d * g->dim, *b = g->unit + (int64_t)c * g->dim;
    float dot = 0.0f;
    for (int32_t k = 0; k < g->dim; k++) dot += a[k] * b[k];
    return dot > FLEXDIAG_GSD_COS && fabsf(p[c] - p[d]) < FLEXDIAG_GSD_DP;
}

void flexdiag__sjd_group_mass(const flexdiag_sjd_accept *a, const float *p, const float *q,
                              int64_t V, int32_t d, double *pc, double *qc) {
    int32_t near[2][FLEXDIAG_MAX_GROUP], n[2] = {0, 0}, G = a->group;
    for (int32_t j = 0; j < (int32_t)V; j++) {
        if (j == d) continue;
        int below = ranks_before(p, d, j);
        keep_near(p, below, j, near[below], &n[below], G);
    }
    *pc = (double)p[d];
    *qc = (double)q[d];
    for (int side = 0; side < 2; side++)
        for (int32_t k = 0; k < n[side]; k++)
            if (look_alike(a->groups, p, d, near[side][k]))
                *pc += (double)p[near[side][k]], *qc += (double)q[near[side][k]];
}

/* Whether draft d (drawn from q) is accepted under p with uniform u: u · q(d) < p(d) (exact), or
 * u · q(C) < p(C) over its group C (grouped). */
static int accepted(const flexdiag_sjd_accept *acc, const float *p, const float *q, int64_t V,
                    int32_t d, double u) {
    if (!acc || !acc->groups || acc->group < 1)
        return q[d] > 0.0f && u * (double)q[d] < (double)p[d];
    double pc, qc;
    flexdiag__sjd_group_mass(acc, p, q, V, d, &pc, &qc);
    return qc > 0.0 && u * qc < pc;
}

/* ---- verification ---- */

int32_t flexdiag__sjd_verify(const flexdiag_sjd_key *key, int64_t m0, const float *p, int32_t nv,
                             const int32_t *draft, const float *q, const int32_t *forced,
                             int64_t V, const flexdiag_sjd_accept *acc, int32_t *out, float *res) {
    for (int32_t i = 0; i < nv; i++) {
        const float *pi = p + (int64_t)i * V;
        int64_t m = m0 + i;
        if (forced[i] >= 0) { /* no draw: a draft is accepted when it is the forced token */
            out[i] = forced[i];
            if (i == nv - 1 || draft[i] != forced[i]) return i + 1;
            continue;
        }
        if (i == nv - 1) { /* no draft: the plain draw, sequential sampling's key */
            out[i] = flexdiag__sample_walk(pi, V, flexdiag__rng_uniform(key->seed, (uint64_t)key->req,
                                                                        (uint64_t)m));
            return i + 1;
        }
        const float *qi = q + (int64_t)i * V;
        int32_t d = draft[i];
        double u = flexdiag__rng_uniform(key->seed, (uint64_t)key->req, tag(m, DRAW_ACCEPT));
        if (accepted(acc, pi, qi, V, d, u)) { /* u < p/q (exact), or over d's group */
            out[i] = d;
            continue;
        }
        out[i] = draw_residual(pi, qi, V,
                               flexdiag__rng_uniform(key->seed, (uint64_t)key->req,
                                                     tag(m, DRAW_RESIDUAL)),
                               res);
        return i + 1;
    }
    return nv;
}

int32_t flexdiag__sjd_draw_draft(const flexdiag_sjd_key *key, int64_t m, const float *q,
                                 int64_t V) {
    uint64_t s = flexdiag__rng64(key->seed, (uint64_t)key->req, tag(m, DRAW_GUMBEL));
    int32_t best = 0;
    double best_v = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        if (!(q[j] > 0.0f)) continue;
        /* Gumbel noise -log(-log u), u in (0, 1) */
        double u = ((double)(flexdiag__rng64(s, (uint64_t)j, 0) >> 11) + 0.5) *
                   (1.0 / 9007199254740992.0);
        double v = log((double)q[j]) - log(-log(u));
        if (v > best_v) best_v = v, best = (int32_t)j;
    }
    return best;
}
