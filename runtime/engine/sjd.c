/*
 * sjd.c - the acceptance rule and the drafts of speculative Jacobi decoding (sjd.h).
 */
#include "runtime/engine/sjd.h"

#include <math.h>

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

int32_t flexdiag__sjd_verify(const flexdiag_sjd_key *key, int64_t m0, const float *p, int32_t nv,
                             const int32_t *draft, const float *q, const int32_t *forced,
                             int64_t V, int32_t *out, float *res) {
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
        if (qi[d] > 0.0f && u * (double)qi[d] < (double)pi[d]) { /* u < p/q: accepted */
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
