/*
 * kvp_replay.c - one KV-policy state machine replayed over a precomputed logit tensor (see
 * kvp_replay.h). This is the engine's per-step protocol without the kernels: the "kernel" reads
 * the logits of the attended positions from the tensor and computes the full-row lse, so traces
 * and fidelity numbers come from the same code path the engine runs.
 */
#include "policy/kvp_replay.h"

#include <math.h>
#include <stdlib.h>

#include "base/core.h"

flexdiag_status flexdiag__kvp_replay_create(const flexdiag_kvp_params *p, int32_t heads,
                                            int32_t lp, flexdiag_kvp_replay **out) {
    *out = NULL;
    if (heads < 1 || lp < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy replay: need heads >= 1 and "
                             "prompt length >= 0, got %d and %d", (int)heads, (int)lp);
    flexdiag_kvp_replay *r = calloc(1, sizeof *r);
    if (!r) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "policy replay: out of host memory");
    r->p = *p;
    r->p.n_seq = 1;
    r->p.n_layers = 1;
    r->p.h_q = r->p.h_kv = heads;
    r->lp = lp;
    flexdiag_status st = flexdiag__kvp_create(&r->p, &r->kvp);
    if (st != FLEXDIAG_OK) {
        free(r);
        return st;
    }
    r->ms = flexdiag__kvp_max_slots(&r->p);
    r->ring = flexdiag__kvp_ring_rows(&r->p);
    size_t hs = (size_t)heads * (size_t)r->ms;
    r->ws = calloc((size_t)heads, sizeof(int32_t));
    r->ns = calloc((size_t)heads, sizeof(int32_t));
    r->slots = calloc(hs, sizeof(int32_t));
    r->att = calloc(hs, sizeof(int32_t));
    r->logits = calloc(hs, sizeof(float));
    r->lse = calloc((size_t)heads, sizeof(float));
    if (!r->ws || !r->ns || !r->slots || !r->att || !r->logits || !r->lse) {
        flexdiag__kvp_replay_destroy(r);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "policy replay: out of host memory");
    }
    *out = r;
    return FLEXDIAG_OK;
}

void flexdiag__kvp_replay_destroy(flexdiag_kvp_replay *r) {
    if (!r) return;
    flexdiag__kvp_destroy(r->kvp);
    free(r->ws);
    free(r->ns);
    free(r->slots);
    free(r->att);
    free(r->logits);
    free(r->lse);
    free(r);
}

/* log-sum-exp of the prompt part of row and the n gathered decode logits, max-shifted, fp64. */
static float row_lse(const float *row, int32_t lp, const float *dec, int32_t n) {
    double m = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < lp; i++) m = row[i] > m ? row[i] : m;
    for (int32_t j = 0; j < n; j++) m = dec[j] > m ? dec[j] : m;
    for (int32_t i = 0; i < lp; i++) sum += exp((double)row[i] - m);
    for (int32_t j = 0; j < n; j++) sum += exp((double)dec[j] - m);
    return (float)(m + log(sum));
}

void flexdiag__kvp_replay_step(flexdiag_kvp_replay *r, int32_t t, const float *logits) {
    int32_t heads = r->p.h_kv, T = r->p.l_dec;
    size_t stride = (size_t)r->lp + (size_t)T;
    flexdiag__kvp_plan(r->kvp, 0, t, 0, 1, r->ws, r->slots, r->ns);
    for (int32_t h = 0; h < heads; h++) {
        const float *row = logits + ((size_t)h * (size_t)T + (size_t)t) * stride;
        const int32_t *sl = r->slots + (size_t)h * (size_t)r->ms;
        int32_t *att = r->att + (size_t)h * (size_t)r->ms;
        float *lg = r->logits + (size_t)h * (size_t)r->ms;
        for (int32_t j = 0; j < r->ns[h]; j++) {
            att[j] = flexdiag__kvp_slot_pos(r->kvp, 0, 0, h, sl[j]);
            FLEXDIAG_ASSERT(att[j] >= 0 && att[j] <= t); /* attended slots hold live tokens */
            lg[j] = row[(size_t)r->lp + (size_t)att[j]];
        }
        r->lse[h] = row_lse(row, r->lp, lg, r->ns[h]);
    }
    flexdiag__kvp_update(r->kvp, 0, t, 0, 1, r->logits, r->lse, NULL);
}

int32_t flexdiag__kvp_replay_resident(const flexdiag_kvp_replay *r, int32_t h, int32_t *out) {
    int32_t n = 0;
    for (int32_t s = 0; s < r->ring; s++) {
        int32_t p = flexdiag__kvp_slot_pos(r->kvp, 0, 0, h, s);
        if (p >= 0) out[n++] = p;
    }
    for (int32_t i = 1; i < n; i++) { /* insertion sort: rings are nearly ordered */
        int32_t v = out[i], j = i - 1;
        for (; j >= 0 && out[j] > v; j--) out[j + 1] = out[j];
        out[j + 1] = v;
    }
    return n;
}
