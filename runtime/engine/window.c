/*
 * window.c - decode passes of several rows a sequence (speculative Jacobi decoding, sjd.h;
 * docs/decoding.md):
 *
 *   rows:   each live sequence runs win rows: its last committed token, its drafts, then
 *           padding rows (a job's shorter window, its last tokens) that nothing reads;
 *   plan:   row i of a sequence at step t is position lp + t + i, writes its K/V where
 *           sequential decoding writes step t + i and attends what step t + i attends (the
 *           position-only policies' list of that step, kv_policy.h flexdiag__kvp_list_at;
 *           dense: ring rows 0..t+i), so row i computes exactly the logits sequential
 *           decoding computes at step t + i whenever rows 0..i hold its tokens. The ring
 *           policies (window, streaming) keep draft_len - 1 rows of slack, so no row's write
 *           lands on a row an earlier row attends. Dense's padding rows write the ring's last
 *           row, which no step attends before it is written for real; a ring policy's padding
 *           row k plans step t + k as a real row would (inside the slack: nothing it
 *           overwrites is read before step t + k rewrites it);
 *   body:   run.c's step body over the rows (kernels.h attn_args win);
 *   verify: the heads' logits to the host, CFG and the request's sampling settings give
 *           each row's distribution (the sampler's own definition, kernels.h
 *           flexdiag__sample_probs), sjd.c commits 1..nv tokens and draws the next drafts.
 * A slot whose job decodes sequentially (draft_len 1) runs one valid row and draws with
 * sequential sampling's key, so its tokens equal a sequential pass's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/engine/run_state.h"
#include "runtime/engine/sjd.h"

/* Host state of window passes (geo.win = W rows a sequence at most). */
typedef struct flexdiag_window {
    int32_t *n_draft;  /* (n_img) drafts each slot holds */
    int32_t *draft;    /* (n_img, W - 1) their ids */
    float *q;          /* (n_img, W - 1, V) the distribution each was drawn from */
    float *logits;     /* (n_seq·W, V) the pass's logits on the host */
    int32_t *ids, *pos, *rows, *slots, *nslots; /* uploads: ids, pos (n_seq·W); rows
                                                   (n_seq·W, h_kv); slots, nslots (geo.win_lists
                                                   lists a row: engine.h win_slots) */
    int32_t *live;     /* (n_img) the slots a verification visits */
    flexdiag_pool *pool; /* host workers of the verification, one task a slot */
} flexdiag_window;

/* A verification task's scratch (one a worker, carved by scratch_of): the distribution of each
 * row (W, V), a row's guided logits, the residual, the sampler's candidates (V·8 bytes), a
 * slot's forced and committed columns (W each), and one step's plan of a sequence (h_kv write
 * slots, h_kv · max_slots slots, h_kv counts) for advancing a stateful policy. */
typedef struct verify_scratch {
    float *p, *g, *res;
    void *cand;
    int32_t *forced, *out, *plan;
} verify_scratch;

static size_t scratch_bytes(const flexdiag_context *c) {
    size_t W = (size_t)c->geo.win, V = (size_t)c->geo.vocab_out;
    size_t plan = (size_t)c->m->cfg.lm.kv_heads * (2 + (size_t)c->pd.max_slots);
    return (W * V + 2 * V) * sizeof(float) + V * 8 + (2 * W + plan) * sizeof(int32_t);
}

static verify_scratch scratch_of(const flexdiag_context *c, void *buf) {
    size_t W = (size_t)c->geo.win, V = (size_t)c->geo.vocab_out;
    verify_scratch v = {.p = buf};
    v.g = v.p + W * V;
    v.res = v.g + V;
    v.cand = v.res + V;
    v.forced = (int32_t *)((char *)v.cand + V * 8);
    v.out = v.forced + W;
    v.plan = v.out + W;
    return v;
}

void flexdiag__window_free(run_state *r) {
    flexdiag_window *w = r->w;
    if (!w) return;
    flexdiag__pool_destroy(w->pool);
    free(w->n_draft);
    free(w->q);
    free(w->logits);
    free(w->ids);
    free(w);
    r->w = NULL;
}

flexdiag_status flexdiag__window_alloc(run_state *r) {
    const flexdiag_context *c = r->c;
    size_t W = (size_t)c->geo.win, V = (size_t)c->geo.vocab_out, I = (size_t)c->geo.n_img;
    size_t SW = (size_t)c->geo.n_seq * W, hkv = (size_t)c->m->cfg.lm.kv_heads;
    size_t ms = (size_t)c->pd.max_slots, WL = (size_t)c->geo.win_lists;
    flexdiag_window *w = calloc(1, sizeof *w);
    r->w = w;
    if (!w) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "window passes: no host memory");
    w->n_draft = calloc(I + I * (W - 1) + I, 4);
    w->q = malloc(I * (W - 1) * V * sizeof(float));
    w->logits = malloc(SW * V * sizeof(float));
    w->ids = malloc(SW * (2 + hkv + WL * (1 + ms)) * 4);
    if (!w->n_draft || !w->q || !w->logits || !w->ids) {
        flexdiag__window_free(r);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "window passes of %zu rows: no host memory "
                             "for %zu slots' drafts", W, I);
    }
    if (c->m->rt->p.threads != 1) /* 1: the caller alone (the runtime's thread count) */
        FLEXDIAG_TRY(flexdiag__pool_create(c->m->rt->p.threads, &w->pool));
    w->draft = w->n_draft + I;
    w->live = w->draft + I * (W - 1);
    w->pos = w->ids + SW;
    w->nslots = w->pos + SW;
    w->rows = w->nslots + SW * WL;
    w->slots = w->rows + SW * hkv;
    return FLEXDIAG_OK;
}

void flexdiag__window_admit(run_state *r, int32_t i) {
    if (r->w) r->w->n_draft[i] = 0;
}

void flexdiag__window_sequential(run_state *r) {
    flexdiag_window *w = r->w;
    size_t V = (size_t)r->c->geo.vocab_out, D = (size_t)(r->c->geo.win - 1);
    for (int32_t i = 0; w && i < r->n_img; i++) {
        int32_t n = w->n_draft[i];
        if (!r->slot[i].live || n == 0) continue;
        int32_t *d = w->draft + (size_t)i * D;
        float *q = w->q + (size_t)i * D * V;
        memmove(d, d + 1, (size_t)(n - 1) * sizeof *d);
        memmove(q, q + V, (size_t)(n - 1) * V * sizeof *q);
        w->n_draft[i] = n - 1;
    }
}

/* The window of slot i's job (1: sequential). */
static int32_t job_window(const run_slot *sl) {
    return sl->job.draft_len > 1 ? sl->job.draft_len : 1;
}

int32_t flexdiag__window_rows(const run_state *r) {
    const flexdiag_context *c = r->c;
    int32_t win = 1;
    for (int32_t i = 0; r->w && i < c->geo.n_img; i++) {
        if (!r->slot[i].live) continue;
        int32_t jw = job_window(&r->slot[i]), s = i * c->geo.rows_per_img;
        if (r->t[s] >= 0 && !flexdiag__kvp_window_ok(c->pd.kvp, r->t[s], jw))
            return 1; /* a policy update falls inside its window (Diagonal's build-up) */
        if (jw > win) win = jw;
    }
    return win;
}

/* Rows of slot i that carry its tokens this pass: its last token and the drafts it holds, no
 * further than the token before its last. */
static int32_t valid_rows(const run_state *r, int32_t i) {
    const run_slot *sl = &r->slot[i];
    int32_t nv = 1 + r->w->n_draft[i], left = sl->job.n_steps - sl->made;
    if (nv > job_window(sl)) nv = job_window(sl);
    return nv < left ? nv : left;
}

/* ---- the plan of a window pass ---- */

/* Row q = s·win + k of sequence s: its input id, position, cache row (after the block's prompt
 * rows) and attended ring rows. */
static void plan_row(run_state *r, int32_t s, int32_t k, int32_t nv) {
    flexdiag_window *w = r->w;
    const flexdiag_context *c = r->c;
    int32_t i = s / c->geo.rows_per_img, hkv = c->m->cfg.lm.kv_heads;
    size_t q = (size_t)s * (size_t)r->win + (size_t)k, ms = (size_t)c->pd.max_slots;
    const run_slot *sl = &r->slot[i];
    int32_t t = r->t[s] < 0 ? 0 : r->t[s], real = r->t[s] >= 0 && k < nv;
    int32_t ahead = r->t[s] >= 0 && (real || c->pd.kp.slack > 0); /* plans step t + k */
    int32_t step = ahead ? t + k : t, ws = c->pd.ring - 1;
    w->ids[q] = r->t[s] < 0       ? 0
                : k == 0 || !real ? sl->job.tokens[sl->made - 1]
                                  : w->draft[(size_t)i * (size_t)(c->geo.win - 1) + (size_t)k - 1];
    w->pos[q] = r->lp[s] + (real ? step : t);
    if (c->geo.win_lists > 1) return; /* plan_row_heads plans its lists */
    w->nslots[q] = 0;
    if (ahead) w->nslots[q] = flexdiag__kvp_list_at(c->pd.kvp, step, &ws, w->slots + q * ms);
    else if (r->t[s] >= 0) /* dense padding: attend rows 0..t, write the ring's last row */
        w->nslots[q] = flexdiag__kvp_list_at(c->pd.kvp, t, &(int32_t){0}, w->slots + q * ms);
    for (int32_t h = 0; h < hkv; h++) w->rows[q * (size_t)hkv + (size_t)h] = c->geo.blk_p + ws;
}

/* Row q = s·win + k of a policy with per-(layer, KV head) lists (geo.win_lists > 1): every
 * layer's lists of step t + k planned ahead from the host state machine (window_rows made sure
 * no update falls between); a padding row (k >= nv) attends no ring row and writes the ring
 * row of step t + k, inside the slack. */
static void plan_row_heads(run_state *r, int32_t s, int32_t k, int32_t nv) {
    flexdiag_window *w = r->w;
    const flexdiag_context *c = r->c;
    int32_t hkv = c->m->cfg.lm.kv_heads, L = c->m->cfg.lm.layers, t = r->t[s];
    size_t q = (size_t)s * (size_t)r->win + (size_t)k, ms = (size_t)c->pd.max_slots;
    size_t SW = (size_t)r->n_seq * (size_t)r->win;
    int32_t *ws = w->rows + q * (size_t)hkv;
    for (int32_t j = 0; j < L; j++) {
        size_t l0 = ((size_t)j * SW + q) * (size_t)hkv;
        if (t >= 0 && k < nv) {
            flexdiag__kvp_plan_ahead(c->pd.kvp, j, t, k, s, ws, w->slots + l0 * ms,
                                     w->nslots + l0);
            continue;
        }
        memset(w->nslots + l0, 0, (size_t)hkv * 4);
        for (int32_t h = 0; h < hkv; h++)
            ws[h] = t < 0 ? c->pd.ring - 1 : flexdiag__kvp_write_slot(&c->pd.kp, t + k);
    }
    for (int32_t h = 0; h < hkv; h++) ws[h] += c->geo.blk_p; /* the same for every layer */
}

/* Every row of the pass, then their uploads. */
static flexdiag_status plan_window(run_state *r) {
    flexdiag_context *c = r->c;
    size_t SW = (size_t)r->n_seq * (size_t)r->win, hkv = (size_t)c->m->cfg.lm.kv_heads;
    size_t lists = SW * (size_t)c->geo.win_lists;
    flexdiag_window *w = r->w;
    for (int32_t s = 0; s < r->n_seq; s++) {
        int32_t i = s / c->geo.rows_per_img, nv = r->slot[i].live ? valid_rows(r, i) : 0;
        for (int32_t k = 0; k < r->win; k++) {
            plan_row(r, s, k, nv); /* ids and positions; the lists of one-list policies */
            if (c->geo.win_lists > 1) plan_row_heads(r, s, k, nv);
        }
    }
    /* the lists' stride is max_slots; only their first nslots entries are read */
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.ids, w->ids, SW * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.pos, w->pos, SW * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.win_rows, w->rows, SW * hkv * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.win_nslots, w->nslots, lists * 4, r->s));
    return r->k->copy_h2d(c->b.win_slots, w->slots, lists * (size_t)c->pd.max_slots * 4, r->s);
}

/* ---- verification ---- */

/* Row k's distribution of slot i into v->p + k·V: CFG-guided logits (u + w·(c - u), as
 * cfg_combine), then the job's sampling settings; the guided (or plain) logits go to *dist. */
static flexdiag_status row_dist(const run_state *r, const verify_scratch *v, int32_t i, int32_t k,
                                const float **dist) {
    const flexdiag_context *c = r->c;
    const flexdiag_window *w = r->w;
    const run_slot *sl = &r->slot[i];
    size_t V = (size_t)c->geo.vocab_out, W = (size_t)r->win;
    size_t s = (size_t)i * (size_t)c->geo.rows_per_img;
    const float *l = w->logits + (s * W + (size_t)k) * V;
    if (c->geo.rows_per_img == 2) {
        const float *u = w->logits + ((s + 1) * W + (size_t)k) * V;
        for (size_t j = 0; j < V; j++) v->g[j] = u[j] + sl->job.cfg_weight * (l[j] - u[j]);
        l = v->g;
    }
    *dist = l;
    const flexdiag_sample_params *sp = &sl->job.sp;
    flexdiag_sample_row row = {.seed = sp->seed, .req = sl->job.img, .step = sl->made + k,
                               .temperature = sp->temperature, .top_k = sp->top_k,
                               .top_p = sp->top_p};
    return flexdiag__sample_probs(v->p + (size_t)k * V, l, (int64_t)V, &row, v->cand);
}

/* Slot i's next drafts (tokens made.. after its commit of n), each from this pass's
 * distribution of the row that predicted it, else from its last row's. */
static void redraft(const run_state *r, const verify_scratch *v, int32_t i, int32_t n, int32_t nv) {
    const flexdiag_context *c = r->c;
    flexdiag_window *w = r->w;
    const run_slot *sl = &r->slot[i];
    size_t V = (size_t)c->geo.vocab_out, D = (size_t)(c->geo.win - 1);
    flexdiag_sjd_key key = {sl->job.sp.seed, sl->job.img};
    int32_t want = job_window(sl) - 1, left = sl->job.n_steps - sl->made - 1;
    w->n_draft[i] = want < left ? want : left > 0 ? left : 0;
    for (int32_t j = 0; j < w->n_draft[i]; j++) {
        int32_t k = n + j < nv ? n + j : nv - 1, col, id;
        float *q = w->q + ((size_t)i * D + (size_t)j) * V;
        memcpy(q, v->p + (size_t)k * V, V * sizeof *q);
        if (flexdiag__forced_at(r, sl, sl->made + j, &id)) col = id - c->geo.id0;
        else col = flexdiag__sjd_draw_draft(&key, sl->made + j, q, (int64_t)V);
        w->draft[(size_t)i * D + (size_t)j] = c->geo.id0 + col;
    }
}

/* Sequence s committed the rows of steps t .. t+n-1: the policy's state and eviction counts
 * advance by those steps (a per-head policy's host state machine plans each of them; no update
 * falls between, window_rows saw to it). */
static void advance(const run_state *r, const verify_scratch *v, int32_t s, int32_t n) {
    const flexdiag_context *c = r->c;
    int32_t t = r->t[s], hkv = c->m->cfg.lm.kv_heads;
    if (c->geo.win_lists == 1) {
        flexdiag__kvp_count_steps(c->pd.kvp, s, t, n);
        return;
    }
    int32_t *ws = v->plan, *ns = ws + hkv, *sl = ns + hkv;
    for (int32_t j = 0; j < c->m->cfg.lm.layers; j++)
        for (int32_t k = 0; k < n; k++) flexdiag__kvp_plan(c->pd.kvp, j, t + k, s, 1, ws, sl, ns);
}

/* Slot i: its rows' distributions, the verification, the committed tokens (and logits) into its
 * job, its next drafts. A row without finite logits fails the slot (made -1). */
static void verify_slot(const run_state *r, const verify_scratch *v, int32_t i) {
    const flexdiag_context *c = r->c;
    const flexdiag_window *w = r->w;
    run_slot *sl = &r->slot[i]; /* this task's own slot */
    size_t V = (size_t)c->geo.vocab_out, D = (size_t)(c->geo.win - 1);
    int32_t nv = valid_rows(r, i), drafts[FLEXDIAG_MAX_DRAFT];
    for (int32_t k = 0; k < nv; k++) {
        const float *dist;
        int32_t id;
        if (row_dist(r, v, i, k, &dist) != FLEXDIAG_OK) {
            snprintf(sl->msg, sizeof sl->msg, "step %d: image %lld: %s", sl->made + k,
                     (long long)sl->job.img, flexdiag__err_msg());
            flexdiag__err_clear();
            sl->made = -1;
            return;
        }
        if (sl->job.logits) memcpy(sl->job.logits + (size_t)(sl->made + k) * V, dist, V * 4);
        v->forced[k] = flexdiag__forced_at(r, sl, sl->made + k, &id) ? id - c->geo.id0 : -1;
        if (k + 1 < nv) drafts[k] = w->draft[(size_t)i * D + (size_t)k] - c->geo.id0;
    }
    flexdiag_sjd_key key = {sl->job.sp.seed, sl->job.img};
    flexdiag_sjd_accept acc = {c->groups, sl->job.sjd_group};
    int32_t n = flexdiag__sjd_verify(&key, sl->made, v->p, nv, drafts, w->q + (size_t)i * D * V,
                                     v->forced, (int64_t)V, &acc, v->out, v->res);
    for (int32_t k = 0; k < n; k++) sl->job.tokens[sl->made + k] = c->geo.id0 + v->out[k];
    for (int32_t s = i * c->geo.rows_per_img; s < (i + 1) * c->geo.rows_per_img; s++)
        advance(r, v, s, n); /* the steps whose rows stay */
    for (int32_t k = 0; k + 1 < n; k++) sl->job.accepted[k]++; /* drafts 0..n-2 were kept */
    sl->made += n;
    redraft(r, v, i, n, nv);
}

/* Pool task t: the t-th live slot's verification on the worker's scratch. */
static void verify_task(void *ctx, int64_t t, void *scratch) {
    const run_state *r = ctx;
    verify_scratch v = scratch_of(r->c, scratch);
    verify_slot(r, &v, r->w->live[t]);
}

/* The pass's logits to the host, then every live slot's verification. */
static flexdiag_status verify(run_state *r) {
    const flexdiag_context *c = r->c;
    size_t rows = (size_t)r->n_seq * (size_t)r->win;
    FLEXDIAG_TRY(r->k->copy_d2h(r->w->logits, c->b.logits, rows * (size_t)c->geo.vocab_out * 4, r->s));
    FLEXDIAG_TRY(r->k->stream_sync(r->s));
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_img; i++)
        if (r->slot[i].live && r->slot[i].made >= 0) r->w->live[n++] = i;
    return flexdiag__pool_parallel_for(r->w->pool, n, scratch_bytes(c), verify_task, r);
}

flexdiag_status flexdiag__pass_window(run_state *r) {
    flexdiag_context *c = r->c;
    FLEXDIAG_TRY(plan_window(r));
    flexdiag__plan_decode(r);
    FLEXDIAG_TRY(flexdiag__sched_begin(c->sched, &r->plan));
    FLEXDIAG_TRY(flexdiag__step_body(r));
    return verify(r);
}
