/*
 * pass_plan.c - the plan of each pass (offload/sched.h flexdiag_pass_plan): which (layer,
 * sequences) the pass visits, in which order, and which KV rows each visit touches. run.c runs
 * the visits in this order and nothing else; the scheduler reads the same plan to prefetch.
 *
 *   prefill: for layer j: for each chunk of the admitted prompt rows: FORWARD
 *   decode:  for layer j: for micro-batch k: FORWARD
 *
 * With CPU attention a decode pass splits each host-attended micro-batch's layer in two (SEND,
 * FINISH around the host's job): a layer's SENDs come first, so the host starts while the device
 * runs the other micro-batches' FORWARDs; then the FINISHes. Where the scheduler takes any order
 * (any_order), each FINISH of layer j is followed by the same micro-batch's SEND of layer j + 1,
 * so the host goes from one job to the next without waiting for the other micro-batches.
 */
#include <stdlib.h>

#include "base/core.h"
#include "runtime/engine/run_state.h"

/* The chunk of prompt rows starting at s0 within the run [s0, end): up to the next multiple of
 * pf_seq (so a chunk never straddles a micro-batch where the KV homes need that, context.c). */
static int32_t chunk_len(const flexdiag_context *c, int32_t s0, int32_t end) {
    int32_t stop = (s0 / c->geo.pf_seq + 1) * c->geo.pf_seq;
    return (stop < end ? stop : end) - s0;
}

flexdiag_status flexdiag__each_chunk(const run_state *r,
                                     flexdiag_status (*fn)(const run_state *, int32_t, int32_t,
                                                           void *),
                                     void *arg) {
    for (int32_t i = 0, e; i < r->n_pf; i = e) {
        for (e = i + 1; e < r->n_pf && r->pf[e] == r->pf[e - 1] + 1; e++) {}
        int32_t end = r->pf[e - 1] + 1;
        for (int32_t s0 = r->pf[i], nb; s0 < end; s0 += nb) {
            nb = chunk_len(r->c, s0, end);
            FLEXDIAG_TRY(fn(r, s0, nb, arg));
        }
    }
    return FLEXDIAG_OK;
}

/* The KV rows a visit of sequences [s0, s0 + nb) touches (offload/sched.h kv_*): a prefill
 * writes the prompt rows; a decode pass reads the prompt rows and the resident prefix of the
 * ring and writes one ring row (the policy's, or one per head within the prefix). Sequences at
 * different steps touch the union: the resident prefix of the furthest one, and its whole
 * resident prefix written back when their write rows differ. (Which ring rows a sparse policy's
 * lists name is the acquire's: run.c.) */
static void visit_rows(const run_state *r, int32_t s0, int32_t nb, int prefill,
                       flexdiag_visit *v) {
    const flexdiag_context *c = r->c;
    int32_t lp = 0, t = -1, w = -2; /* w: the common write slot, -1 when they differ */
    for (int32_t s = s0; s < s0 + nb; s++) lp = r->lp[s] > lp ? r->lp[s] : lp;
    v->s0 = s0;
    v->n_seq = nb;
    if (prefill) {
        v->kv_prompt = v->kv_ring = v->kv_w0 = 0;
        v->kv_wn = lp;
        return;
    }
    for (int32_t s = s0; s < s0 + nb; s++) {
        if (r->t[s] < 0) continue;
        int32_t ws = flexdiag__kvp_write_slot(&c->pd.kp, r->t[s]);
        int32_t last = r->t[s] + r->win - 1; /* a window pass writes win rows from t */
        t = last > t ? last : t;
        w = r->win == 1 && (w == -2 || w == ws) ? ws : -1;
    }
    if (t < 0) t = 0, w = -1; /* no live sequence: any consistent rows */
    if (t >= c->geo.l_dec) t = c->geo.l_dec - 1;
    v->kv_prompt = lp;
    v->kv_ring = (int32_t)flexdiag__kvp_resident_rows(&c->pd.kp, t);
    v->kv_w0 = c->geo.blk_p + w;
    v->kv_wn = w >= 0 ? 1 : -1;
}

/* Appends a visit to r's plan. */
static flexdiag_visit *add(run_state *r, int32_t op, int32_t j) {
    FLEXDIAG_DASSERT((size_t)r->plan.n_visits < flexdiag__plan_cap(r->c));
    flexdiag_visit *v = &r->visits[r->plan.n_visits++];
    *v = (flexdiag_visit){.op = op, .layer = j};
    return v;
}

/* each_chunk's callback of a prefill plan: a FORWARD of layer *j over the chunk. */
static flexdiag_status add_chunk(const run_state *r, int32_t s0, int32_t nb, void *j) {
    run_state *w = (run_state *)r; /* the plan is the run's own scratch */
    visit_rows(r, s0, nb, 1, add(w, FLEXDIAG_VISIT_FORWARD, *(const int32_t *)j));
    return FLEXDIAG_OK;
}

void flexdiag__plan_prefill(run_state *r) {
    int32_t layers = r->c->m->cfg.lm.layers;
    r->plan = (flexdiag_pass_plan){.rows_per_seq = r->pf_q, .v = r->visits};
    for (int32_t j = 0; r->n_pf > 0 && j < layers; j++) (void)flexdiag__each_chunk(r, add_chunk, &j);
}

/* The micro-batches [*lo, *hi) whose attention the host runs (CPU attention: the pinned-homed
 * ones of its share); empty without it. */
static void host_mbs(const run_state *r, int32_t *lo, int32_t *hi) {
    const flexdiag_context *c = r->c;
    *lo = *hi = r->n_mb;
    if (!c->homes.ca) return;
    *lo = c->homes.s_host / c->geo.mb_seq;
    *hi = *lo + (c->homes.s_ca - c->homes.s_host + c->geo.mb_seq - 1) / c->geo.mb_seq;
    if (*hi > r->n_mb) *hi = r->n_mb;
}

/* A decode visit of micro-batch mb in layer j, its rows from the pass's rows of it (mbv). */
static void add_mb(run_state *r, int32_t op, int32_t j, const flexdiag_visit *mbv) {
    flexdiag_visit *v = add(r, op, j);
    *v = *mbv;
    v->op = op;
    v->layer = j;
}

void flexdiag__plan_decode(run_state *r) {
    const flexdiag_context *c = r->c;
    flexdiag_visit *mbv = r->mbv;
    int32_t layers = c->m->cfg.lm.layers, lo, hi;
    int ahead = c->homes.ca && c->sched->any_order;
    r->plan = (flexdiag_pass_plan){.rows_per_seq = r->win, .v = r->visits, .repeats = 1};
    host_mbs(r, &lo, &hi);
    for (int32_t mb = 0; mb < r->n_mb; mb++) {
        int32_t s0, nb = flexdiag__mb_range(r, mb, &s0);
        visit_rows(r, s0, nb, 0, &mbv[mb]);
        mbv[mb].host_attend = mb >= lo && mb < hi;
    }
    for (int32_t j = 0; j < layers; j++) {
        if (!ahead || j == 0)
            for (int32_t mb = lo; mb < hi; mb++) add_mb(r, FLEXDIAG_VISIT_SEND, j, &mbv[mb]);
        for (int32_t mb = 0; mb < r->n_mb; mb++)
            if (mb < lo || mb >= hi) add_mb(r, FLEXDIAG_VISIT_FORWARD, j, &mbv[mb]);
        for (int32_t mb = lo; mb < hi; mb++) {
            add_mb(r, FLEXDIAG_VISIT_FINISH, j, &mbv[mb]);
            if (ahead && j + 1 < layers) add_mb(r, FLEXDIAG_VISIT_SEND, j + 1, &mbv[mb]);
        }
    }
}
