/*
 * policy_harness.c - the engine-like driver of the policy tests (see policy_harness.h).
 */
#include "policy_harness.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"

static uint64_t row_key(int32_t seq, int32_t layer, int32_t t, int32_t hq) {
    return ((uint64_t)seq << 48) ^ ((uint64_t)layer << 40) ^ ((uint64_t)t << 16) ^ (uint64_t)hq;
}

float ph_logit(const ph_logits *lg, int32_t seq, int32_t layer, int32_t t, int32_t hq,
               int32_t pos) {
    uint64_t r = flexdiag__rng64(lg->seed, row_key(seq, layer, t, hq), (uint64_t)pos + 1);
    if ((int32_t)((r >> 32) % 100) < lg->dead) return -200.0f;
    return (float)(r % (uint64_t)lg->levels) * lg->step;
}

/* lse of the prompt part and the decode logits z (n, in ascending position order). */
static float lse_of(const ph_logits *lg, int32_t seq, int32_t layer, int32_t t, int32_t hq,
                    const float *z, int32_t n) {
    /* prompt part: a row-dependent log-mass in [1, 2.75] */
    uint64_t r = flexdiag__rng64(lg->seed, row_key(seq, layer, t, hq), 0);
    double sum = exp(1.0 + 0.25 * (double)(r % 8));
    for (int32_t i = 0; i < n; i++) sum += exp((double)z[i]);
    return (float)log(sum);
}

float ph_lse(const ph_logits *lg, int32_t seq, int32_t layer, int32_t t, int32_t hq,
             const int32_t *pos, int32_t n) {
    float z[256];
    for (int32_t i = 0; i < n; i++) z[i] = ph_logit(lg, seq, layer, t, hq, pos[i]);
    return lse_of(lg, seq, layer, t, hq, z, n);
}

static void sort_i32(int32_t *a, int32_t n) {
    for (int32_t i = 1; i < n; i++) {
        int32_t v = a[i], j = i - 1;
        for (; j >= 0 && a[j] > v; j--) a[j + 1] = a[j];
        a[j + 1] = v;
    }
}

int ph_init(ph_state *st, const flexdiag_kvp_params *p, const ph_logits *lg) {
    memset(st, 0, sizeof *st);
    st->p = *p;
    st->lg = *lg;
    if (flexdiag__kvp_create(p, &st->kvp) != FLEXDIAG_OK) {
        fprintf(stderr, "kvp_create: %s\n", flexdiag_last_error(NULL));
        return -1;
    }
    st->ms = flexdiag__kvp_max_slots(p);
    if (st->ms > 256) {
        fprintf(stderr, "harness: max_slots %d > 256\n", (int)st->ms);
        return -1;
    }
    size_t nh = (size_t)p->n_seq * (size_t)p->h_kv, nq = (size_t)p->n_seq * (size_t)p->h_q;
    st->ws = calloc(nh, sizeof(int32_t));
    st->ns = calloc(nh, sizeof(int32_t));
    st->slots = calloc(nh * (size_t)st->ms, sizeof(int32_t));
    st->att = calloc(nh * (size_t)st->ms, sizeof(int32_t));
    st->logits = calloc(nq * (size_t)st->ms, sizeof(float));
    st->lse = calloc(nq, sizeof(float));
    st->tmp = calloc((size_t)st->ms, sizeof(int32_t));
    return 0;
}

void ph_free(ph_state *st) {
    flexdiag__kvp_destroy(st->kvp);
    free(st->ws);
    free(st->ns);
    free(st->slots);
    free(st->att);
    free(st->logits);
    free(st->lse);
    free(st->tmp);
    memset(st, 0, sizeof *st);
}

/* Logits and lse of one sequence after plan: the "kernel" of the harness. The lse sums in
 * ascending position order (tmp holds the plan index of each sorted position). */
static void fill_scores(ph_state *st, int32_t layer, int32_t t, int32_t s) {
    const flexdiag_kvp_params *p = &st->p;
    int32_t g = p->h_q / p->h_kv;
    for (int32_t h = 0; h < p->h_kv; h++) {
        size_t hs = (size_t)s * (size_t)p->h_kv + (size_t)h;
        const int32_t *sl = st->slots + hs * (size_t)st->ms;
        int32_t n = st->ns[hs], *att = st->att + hs * (size_t)st->ms;
        for (int32_t j = 0; j < n; j++) {
            att[j] = flexdiag__kvp_slot_pos(st->kvp, layer, s, h, sl[j]);
            assert_true(att[j] >= 0 && att[j] <= t); /* every attended slot holds a token */
        }
        for (int32_t j = 0; j < n; j++) st->tmp[j] = j;
        for (int32_t i = 1; i < n; i++) { /* plan indices by ascending position */
            int32_t v = st->tmp[i], j = i - 1;
            for (; j >= 0 && att[st->tmp[j]] > att[v]; j--) st->tmp[j + 1] = st->tmp[j];
            st->tmp[j + 1] = v;
        }
        for (int32_t q = 0; q < g; q++) {
            int32_t hq = h * g + q;
            float *row = st->logits + ((size_t)s * (size_t)p->h_q + (size_t)hq) * (size_t)st->ms;
            float z[256];
            for (int32_t j = 0; j < n; j++) row[j] = ph_logit(&st->lg, s, layer, t, hq, att[j]);
            for (int32_t i = 0; i < n; i++) z[i] = row[st->tmp[i]];
            size_t li = (size_t)s * (size_t)p->h_q + (size_t)hq;
            st->lse[li] = lse_of(&st->lg, s, layer, t, hq, z, n);
        }
        sort_i32(att, n);
        for (int32_t j = 1; j < n; j++) assert_true(att[j] > att[j - 1]); /* distinct */
    }
}

/* What a KV home relies on (kv_policy.h flexdiag__kvp_write_slot): the written and attended
 * slots of step t lie in the resident prefix [0, resident_rows(t)), and the write slot is the
 * policy's common one wherever it names one. */
static void check_kv_rows(const ph_state *st, int32_t t) {
    const flexdiag_kvp_params *p = &st->p;
    int64_t live = flexdiag__kvp_resident_rows(p, t);
    int32_t w = flexdiag__kvp_write_slot(p, t);
    for (int32_t i = 0; i < p->n_seq * p->h_kv; i++) {
        if (w >= 0) assert_int_equal(st->ws[i], w);
        assert_true(st->ws[i] >= 0 && st->ws[i] < live);
        for (int32_t j = 0; j < st->ns[i]; j++)
            assert_true(st->slots[(size_t)i * (size_t)st->ms + (size_t)j] < live);
    }
}

void ph_step(ph_state *st, int32_t layer, int32_t t) {
    const flexdiag_kvp_params *p = &st->p;
    int32_t n0 = p->n_seq > 1 ? 1 : p->n_seq, hk = p->h_kv;
    size_t sq = (size_t)p->h_q * (size_t)st->ms;
    flexdiag__kvp_plan(st->kvp, layer, t, 0, n0, st->ws, st->slots, st->ns);
    if (p->n_seq > n0)
        flexdiag__kvp_plan(st->kvp, layer, t, n0, p->n_seq - n0, st->ws + n0 * hk,
                           st->slots + (size_t)n0 * (size_t)hk * (size_t)st->ms,
                           st->ns + n0 * hk);
    check_kv_rows(st, t);
    for (int32_t s = 0; s < p->n_seq; s++) fill_scores(st, layer, t, s);
    if (!flexdiag__kvp_needs_scores(st->kvp, t)) { /* the engine may skip the readback */
        flexdiag__kvp_update(st->kvp, layer, t, 0, p->n_seq, NULL, NULL, NULL);
        return;
    }
    flexdiag__kvp_update(st->kvp, layer, t, 0, n0, st->logits, st->lse, NULL);
    if (p->n_seq > n0) { /* the others as the engine passes them: the kernels' probabilities */
        const float *lg = st->logits + n0 * sq, *ls = st->lse + n0 * p->h_q;
        size_t n = (size_t)(p->n_seq - n0) * sq;
        float *pr = malloc(n * sizeof *pr);
        assert_non_null(pr);
        for (size_t i = 0; i < n; i++) pr[i] = expf(lg[i] - ls[i / (size_t)st->ms]);
        int probs = flexdiag__kvp_traits(p->kind)->needs_probabilities;
        flexdiag__kvp_update(st->kvp, layer, t, n0, p->n_seq - n0, probs ? NULL : lg,
                             probs ? NULL : ls, probs ? pr : NULL);
        free(pr);
    }
}

const int32_t *ph_att(const ph_state *st, int32_t seq, int32_t h, int32_t *n) {
    size_t hs = (size_t)seq * (size_t)st->p.h_kv + (size_t)h;
    *n = st->ns[hs];
    return st->att + hs * (size_t)st->ms;
}

int32_t ph_resident(const ph_state *st, int32_t layer, int32_t seq, int32_t h, int32_t *out) {
    int32_t n = 0, r = flexdiag__kvp_ring_rows(&st->p);
    for (int32_t slot = 0; slot < r; slot++) {
        int32_t pos = flexdiag__kvp_slot_pos(st->kvp, layer, seq, h, slot);
        if (pos >= 0) out[n++] = pos;
    }
    sort_i32(out, n);
    return n;
}
