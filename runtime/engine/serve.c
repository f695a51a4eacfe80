/*
 * serve.c - the engine's run over a feed of jobs (engine.h flexdiag__engine_serve), one step
 * boundary after another:
 *
 *   retire cancelled jobs -> admit waiting jobs into free slots (FIFO, while slots and shared
 *   prompt rows allow) -> prefill pass of the admitted (run.c) -> retire finished ->
 *   decode pass of every live slot, each at its own step (run.c) -> retire finished
 *
 * A slot is an image's CFG rows (or a text sequence): admission resets its policy state, fills
 * its prompt rows (with shared prompt KV: finds the prompt row among the live ones or takes a
 * free one, reference-counted) and marks it fresh; retirement hands the job back to the feed and
 * frees the slot at the same boundary, so a waiting job takes it at the next pass. A pass runs
 * the slots [0, n_img) up to the last live one (in steps of `granule` slots, so a launch graph
 * is recorded for a few widths only). Nothing a sequence computes depends on its neighbours or
 * on when it was admitted: positions, policy steps and sampling keys are its own.
 *
 * A lock-step block (flexdiag__engine_run, teacher-forced scoring) is the same run over a feed
 * that admits all its images at the first boundary: they step together, and the block's
 * captures (logits, hidden states, plans) read slot i as the block's image i.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "runtime/engine/run_state.h"
#include "runtime/engine/sjd.h"

static const flexdiag_block no_block; /* a run without captures, progress or profiling */

/* Idle slot-passes, in context slots, that gather admissions into one prefill (admit_due). */
#define ADMIT_IDLE 0.0

/* ---- run state ---- */

static void run_free(run_state *r) {
    flexdiag__window_free(r);
    free(r->lp);
    free(r->slot);
    free(r->ids_h);
    free(r->held);
    free(r->visits);
}

/* Host state of a run on c: every slot free, every sequence attending one prompt row (so a free
 * slot's rows in a pass compute finite values nobody reads). */
static flexdiag_status run_alloc(run_state *r, flexdiag_context *c, const flexdiag_feed *f,
                                 const flexdiag_block *b) {
    size_t S = (size_t)c->geo.n_seq, P = (size_t)c->geo.n_pre, rows = S > P ? S : P;
    *r = (run_state){.c = c, .b = b, .f = f, .k = c->m->rt->k, .s = c->s,
                     .abort = b == &no_block ? NULL : &c->cancel,
                     .progress = b == &no_block ? c->p.progress : b->progress,
                     .progress_user = b == &no_block ? c->p.progress_user : b->progress_user,
                     .act = (size_t)c->m->rt->k->act_bytes};
    r->lp = malloc((S * 4 + P * 3 + rows) * 4);
    r->slot = calloc((size_t)c->geo.n_img, sizeof *r->slot);
    r->ids_h = calloc((2 * rows + 2) * (size_t)c->geo.p_cap, 4);
    if (c->homes.ca) r->held = malloc((size_t)c->geo.n_mb * sizeof *r->held);
    r->visits = malloc((flexdiag__plan_cap(c) + (size_t)c->geo.n_mb) * sizeof *r->visits);
    if (!r->lp || !r->slot || !r->ids_h || (c->homes.ca && !r->held) || !r->visits) {
        run_free(r);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "run: no host memory");
    }
    r->mbv = r->visits + flexdiag__plan_cap(c);
    r->t = r->lp + S;
    r->last = r->t + S;
    r->prefix = r->last + S;
    r->pre_lp = r->prefix + S;
    r->pre_ref = r->pre_lp + P;
    r->pre_last = r->pre_ref + P;
    r->pf = r->pre_last + P;
    r->row_tmp = r->ids_h + rows * (size_t)c->geo.p_cap;
    r->ids_pack = r->row_tmp + 2 * (size_t)c->geo.p_cap;
    const char *env = getenv("FLEXDIAG_ADMIT_IDLE");
    r->admit_idle = (int64_t)((env ? atof(env) : ADMIT_IDLE) * (double)c->geo.n_img);
    for (size_t s = 0; s < S; s++) r->lp[s] = 1, r->t[s] = -1, r->last[s] = 0, r->prefix[s] = 0;
    for (size_t p = 0; p < P; p++) r->pre_lp[p] = 0, r->pre_ref[p] = 0, r->pre_last[p] = 0;
    memset(c->up.pos, 0, S * 4);
    r->win = 1;
    if (c->geo.win > 1 && flexdiag__window_alloc(r) != FLEXDIAG_OK) {
        run_free(r);
        return FLEXDIAG_ERR_OOM_HOST; /* its message stands */
    }
    return FLEXDIAG_OK;
}

/* ---- jobs ---- */

/* A job the context can run (what a bad request would otherwise break), or INVALID_ARG naming
 * the field. */
static flexdiag_status check_job(const flexdiag_context *c, const flexdiag_job *j) {
    const flexdiag_model_config *m = &c->m->cfg;
    long long img = (long long)j->img;
    if (j->n_steps < 1 || j->n_steps > c->geo.l_dec)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "image %lld: %d tokens requested, 1..%d allowed", img, j->n_steps,
                             c->geo.l_dec);
    if (!j->prompt || j->prompt_len < 1 || j->prompt_len > c->geo.p_cap)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "prompt of image %lld has %d tokens; the context allows 1..%d (raise "
                             "the maximum prompt length)",
                             img, j->prompt_len, c->geo.p_cap);
    for (int32_t i = 0; i < j->prompt_len; i++)
        if (j->prompt[i] < 0 || j->prompt[i] >= m->lm.vocab)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "prompt of image %lld: token %d is id %d, outside the "
                                 "vocabulary [0, %d)",
                                 img, i, j->prompt[i], m->lm.vocab);
    const int32_t *p = j->prompt, n = j->prompt_len;
    if (c->geo.row_len &&
        (n < 4 || p[n - 3] != m->boi_id || p[n - 2] != m->size_id || p[n - 1] != m->size_id))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "prompt of image %lld: a Lumina-mGPT image prompt ends with the image "
                             "start (id %d) and the size token (id %d) twice, after at least one "
                             "text token (text prompts get them added)",
                             img, m->boi_id, m->size_id);
    for (int32_t i = 0; j->forced && i < j->n_steps; i++)
        if (j->forced[i] < 0 || j->forced[i] >= c->geo.vocab_in)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "image %lld: forced token %d is id %d, outside [0, %d)", img, i,
                                 j->forced[i], c->geo.vocab_in);
    if (j->draft_len < 0 || j->draft_len > c->geo.win)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "image %lld: draft_len %d: the context's window is %d tokens a pass "
                             "(context_params.draft_len)", img, j->draft_len, c->geo.win);
    if (j->sjd_group < 0 || j->sjd_group > FLEXDIAG_MAX_GROUP || (j->sjd_group && !c->groups))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "image %lld: sjd_group %d: give 0 (exact) or 1 .. 64 in a context "
                             "made with context_params.sjd_group > 0", img, j->sjd_group);
    const flexdiag_sample_params *sp = &j->sp;
    if (!j->forced && (!(sp->temperature > 0) || !isfinite(sp->temperature) || sp->top_k < 0 ||
                       !(sp->top_p > 0) || !isfinite(j->cfg_weight)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "image %lld: sampling temperature %g, top_k %d, top_p %g, cfg "
                             "weight %g: need a finite temperature > 0, top_k >= 0, top_p > 0 "
                             "and a finite weight",
                             img, (double)sp->temperature, sp->top_k, (double)sp->top_p,
                             (double)j->cfg_weight);
    return FLEXDIAG_OK;
}

/* The unconditional row of an image from its conditional prompt (n ids) into uncond; returns
 * its length. Janus (docs/architecture.md §4.1 step 3): BOS and the last id kept, the middle
 * padded. Chameleon: the image start and the two size tokens alone, at positions 0, 1, 2 (the
 * rows differ in length: a ragged batch). */
static int32_t uncond_row(const flexdiag_model_config *m, const int32_t *cond, int32_t n,
                          int32_t *uncond) {
    if (m->arch == FLEXDIAG_ARCH_CHAMELEON) {
        memcpy(uncond, cond + n - 3, 3 * sizeof *uncond);
        return 3;
    }
    int32_t pad = m->pad_id >= 0 ? m->pad_id : 0;
    for (int32_t i = 0; i < n; i++) uncond[i] = (i == 0 || i == n - 1) ? cond[i] : pad;
    return n;
}

/* Prompt row q (0: conditional, 1: unconditional) of job j into row (p_cap ids, zero padded);
 * returns its length. */
static int32_t prompt_row(const flexdiag_context *c, const flexdiag_job *j, int32_t q,
                          int32_t *row) {
    memset(row, 0, (size_t)c->geo.p_cap * 4);
    if (q == 0) {
        memcpy(row, j->prompt, (size_t)j->prompt_len * 4);
        return j->prompt_len;
    }
    return uncond_row(&c->m->cfg, j->prompt, j->prompt_len, row);
}

/* ---- shared prompt rows ---- */

/* The live shared prompt row holding ids (p_cap, length n), or -1. */
static int32_t find_pre(const run_state *r, const int32_t *ids, int32_t n) {
    const flexdiag_context *c = r->c;
    size_t row = (size_t)c->geo.p_cap * 4;
    for (int32_t p = 0; p < c->geo.n_pre; p++)
        if (r->pre_ref[p] > 0 && r->pre_lp[p] == n &&
            !memcmp(r->ids_h + (size_t)p * (size_t)c->geo.p_cap, ids, row))
            return p;
    return -1;
}

/* A shared prompt row no sequence reads and no admission of this boundary took, or -1. */
static int32_t free_pre(const run_state *r) {
    for (int32_t p = 0; p < r->c->geo.n_pre; p++)
        if (r->pre_ref[p] == 0) return p;
    return -1;
}

/* Shared prompt rows for slot i's rows (prompt rows in rows, lengths in n): found among the live
 * ones or taken free (their ids into the table, queued for the prefill). 0 when too few are
 * free: the job waits, nothing taken. */
static int take_pre(run_state *r, int32_t i, const int32_t *rows, const int32_t *n) {
    flexdiag_context *c = r->c;
    int32_t got[2], fresh_rows = 0, q;
    for (q = 0; q < c->geo.rows_per_img; q++) {
        const int32_t *ids = rows + (size_t)q * (size_t)c->geo.p_cap;
        got[q] = find_pre(r, ids, n[q]);
        if (got[q] < 0 && q == 1 && n[1] == n[0] &&
            !memcmp(ids, rows, (size_t)c->geo.p_cap * 4))
            got[q] = -2; /* the same as row 0 */
        if (got[q] == -1) fresh_rows++;
    }
    int32_t n_free = 0;
    for (int32_t p = 0; p < c->geo.n_pre; p++) n_free += r->pre_ref[p] == 0;
    if (n_free < fresh_rows) return 0;
    for (q = 0; q < c->geo.rows_per_img; q++) {
        int32_t p = got[q] == -2 ? got[0] : got[q], s = i * c->geo.rows_per_img + q;
        if (p < 0) {
            p = free_pre(r);
            memcpy(r->ids_h + (size_t)p * (size_t)c->geo.p_cap, rows + (size_t)q * (size_t)c->geo.p_cap,
                   (size_t)c->geo.p_cap * 4);
            r->pre_lp[p] = n[q];
            r->pf[r->n_pf++] = p;
        }
        got[q] = p; /* row 1 the same as row 0: row 0's, taken just now or found */
        r->pre_ref[p]++;
        r->prefix[s] = p;
    }
    return 1;
}

/* ---- admission and retirement ---- */

/* Job j into free slot i: its rows' prompts and lengths (with shared prompt KV, their shared
 * rows: 0 when too few are free), its policy state reset. */
static int admit_one(run_state *r, int32_t i, const flexdiag_job *j) {
    flexdiag_context *c = r->c;
    int32_t n[2], R = c->geo.rows_per_img;
    int32_t *dst = c->geo.n_pre ? r->row_tmp : r->ids_h + (size_t)i * (size_t)R * (size_t)c->geo.p_cap;
    for (int32_t q = 0; q < R; q++) n[q] = prompt_row(c, j, q, dst + (size_t)q * (size_t)c->geo.p_cap);
    if (c->geo.n_pre && !take_pre(r, i, dst, n)) return 0;
    for (int32_t q = 0; q < R; q++) {
        int32_t s = i * R + q;
        r->lp[s] = n[q];
        if (!c->geo.n_pre) r->pf[r->n_pf++] = s;
    }
    flexdiag__pd_admit(&c->pd, i * R, R);
    r->slot[i] = (run_slot){.job = *j, .live = 1, .fresh = 1};
    flexdiag__window_admit(r, i);
    r->live++;
    return 1;
}

/* Ascending order of the rows the prefill runs (admission appends them as it takes them). */
static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Free slots take waiting jobs, lowest slot first, while the feed has jobs and the context the
 * room (a refused job is handed back failed and skipped). Returns the number admitted. */
static int32_t admit(run_state *r) {
    const flexdiag_feed *f = r->f;
    int32_t n = 0;
    r->n_pf = 0;
    if (f->lockstep && r->live) return 0;
    for (int32_t i = 0; i < r->c->geo.n_img; i++) {
        if (r->slot[i].live) continue;
        const flexdiag_job *j;
        flexdiag_status st;
        while ((j = f->peek(f->user)) &&
               (st = j->cancel && atomic_load(j->cancel) ? FLEXDIAG_ERR_CANCELLED
                                                         : check_job(r->c, j)) != FLEXDIAG_OK) {
            f->take(f->user);
            f->done(f->user, j, 0, st,
                    st == FLEXDIAG_ERR_CANCELLED ? "cancelled" : flexdiag__err_msg());
            if (f->fail_fast) return -1; /* its message stands for the caller */
            flexdiag__err_clear();       /* the next job's failure gets its own */
        }
        if (!j || !admit_one(r, i, j)) break;
        f->take(f->user);
        n++;
    }
    qsort(r->pf, (size_t)r->n_pf, 4, cmp_i32);
    return n;
}

/* Resident KV bytes per sequence at the policy's steady state (stats): its prompt rows (with
 * shared prompt rows its share of them) and the ring. */
static void kv_stats(const run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    double lp = r->lp[0], n = (double)r->c->geo.n_seq;
    double prompt = c->geo.n_pre && c->n_pf > 0 ? lp * c->n_pf / n : lp;
    c->stats.evictions = flexdiag__pd_evictions(&c->pd);
    c->stats.kv_bytes_per_seq =
        (uint64_t)((double)l->layers * 2 * l->kv_heads * l->head_dim * (double)r->act *
                   (prompt + (double)flexdiag__kvp_resident_rows(&c->pd.kp, c->geo.l_dec - 1)));
}

/* Slot i's job ends with st (msg: why, "" for OK): handed back, its rows free (their shared
 * prompt rows released). */
static void retire(run_state *r, int32_t i, flexdiag_status st, const char *msg) {
    flexdiag_context *c = r->c;
    run_slot *sl = &r->slot[i];
    int32_t made = sl->made < 0 ? 0 : sl->made;
    for (int32_t q = 0; q < c->geo.rows_per_img; q++) {
        int32_t s = i * c->geo.rows_per_img + q;
        r->t[s] = -1;
        if (c->geo.n_pre) r->pre_ref[r->prefix[s]]--;
    }
    c->stats.tokens_generated += (uint64_t)made * (uint64_t)c->geo.rows_per_img;
    sl->live = sl->fresh = 0;
    r->live--;
    r->f->done(r->f->user, &sl->job, made, st, msg);
}

/* After a pass: each taking slot's new token to the feed, its step advanced; a finished job
 * (all its tokens, or its eos) retired, a failed one (made -1) retired with NUMERIC. */
static flexdiag_status after_pass(run_state *r, int fresh) {
    const flexdiag_feed *f = r->f;
    kv_stats(r); /* once a pass (the plans count the evictions), final for whoever a
                    retirement below wakes */
    for (int32_t i = 0; i < r->n_img; i++) {
        run_slot *sl = &r->slot[i];
        if (!sl->live || (fresh && !sl->fresh)) continue;
        if (sl->made < 0) {
            if (f->fail_fast) return flexdiag__err(FLEXDIAG_ERR_NUMERIC, "%s", sl->msg);
            retire(r, i, FLEXDIAG_ERR_NUMERIC, sl->msg);
            continue;
        }
        sl->fresh = 0;
        int eos = 0;
        for (; sl->told < sl->made && !eos; sl->told++) { /* a window pass makes several */
            eos = sl->job.eos >= 0 && sl->job.tokens[sl->told] == sl->job.eos;
            if (f->token) f->token(f->user, &sl->job, sl->told);
        }
        sl->made = sl->told; /* tokens after an eos are dropped */
        for (int32_t q = 0; q < r->c->geo.rows_per_img; q++)
            r->t[i * r->c->geo.rows_per_img + q] = sl->made - 1;
        if (sl->made == sl->job.n_steps || eos) retire(r, i, FLEXDIAG_OK, "");
    }
    return FLEXDIAG_OK;
}

/* Jobs whose cancel flag is up retire (CANCELLED) before the next pass. */
static void retire_cancelled(run_state *r) {
    for (int32_t i = 0; i < r->c->geo.n_img; i++)
        if (r->slot[i].live && r->slot[i].job.cancel && atomic_load(r->slot[i].job.cancel))
            retire(r, i, FLEXDIAG_ERR_CANCELLED, "cancelled");
}

/* The pass runs slots [0, n_img): up to the last live one, rounded up to `granule` slots. */
static void pass_width(run_state *r, int32_t granule) {
    const flexdiag_context *c = r->c;
    int32_t end = 0;
    for (int32_t i = 0; i < c->geo.n_img; i++)
        if (r->slot[i].live) end = i + 1;
    end = (end + granule - 1) / granule * granule;
    r->n_img = end < c->geo.n_img ? end : c->geo.n_img;
    r->n_seq = r->n_img * c->geo.rows_per_img;
    r->n_mb = (r->n_img + c->geo.mb_img - 1) / c->geo.mb_img;
}

/* ---- uploads of an admission ---- */

/* Each micro-batch's cascade plan of the shared prompt rows (kernels.h). */
static flexdiag_status upload_cascade(run_state *r) {
    flexdiag_context *c = r->c;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    int32_t cap = flexdiag__casc_tiles(c, c->geo.mb_seq), g = l->heads / l->kv_heads;
    int32_t *seq = malloc((size_t)c->geo.n_seq * 4), *tile = calloc((size_t)c->geo.n_mb * cap * 3 + 3, 4);
    flexdiag_status st = seq && tile ? FLEXDIAG_OK
                                     : flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                                                     "prompts: no host memory");
    for (int32_t s0 = 0; st == FLEXDIAG_OK && s0 < c->geo.n_seq; s0 += c->geo.mb_seq) {
        int32_t nb = c->geo.n_seq - s0 < c->geo.mb_seq ? c->geo.n_seq - s0 : c->geo.mb_seq;
        flexdiag__cascade_plan(r->prefix + s0, nb, c->geo.n_pre, g, seq + s0,
                               tile + (size_t)(s0 / c->geo.mb_seq) * 3 * cap);
    }
    if (st == FLEXDIAG_OK) st = r->k->copy_h2d(c->b.casc_seq, seq, (size_t)c->geo.n_seq * 4, r->s);
    if (st == FLEXDIAG_OK && cap > 0)
        st = r->k->copy_h2d(c->b.casc_tile, tile, (size_t)c->geo.n_mb * cap * 12, r->s);
    if (st == FLEXDIAG_OK) st = r->k->stream_sync(r->s); /* the host arrays are freed */
    free(seq);
    free(tile);
    return st;
}

/* The rows a sequence's prefill runs: the longest prompt of the admission's rows, rounded up
 * to PF_ROUND rows, at most the capacity (prompts are padded to it, not to the capacity). */
#define PF_ROUND 16
static int32_t pass_rows(const run_state *r) {
    const flexdiag_context *c = r->c;
    int32_t q = 1;
    for (int32_t i = 0; i < r->n_pf; i++) {
        int32_t n = c->geo.n_pre ? r->pre_lp[r->pf[i]] : r->lp[r->pf[i]];
        q = n > q ? n : q;
    }
    q = (q + PF_ROUND - 1) / PF_ROUND * PF_ROUND;
    return q < c->geo.p_cap ? q : c->geo.p_cap;
}

/* The prompt table of the prefill rows packed pf_q ids a row (row p at p·pf_q, as x holds them
 * in the pass), and each fresh sequence's (or prompt row's) last row there. */
static void pack_rows(run_state *r) {
    const flexdiag_context *c = r->c;
    size_t q = (size_t)r->pf_q, cap = (size_t)c->geo.p_cap;
    for (int32_t i = 0; i < r->n_pf; i++) {
        size_t p = (size_t)r->pf[i];
        memcpy(r->ids_pack + p * q, r->ids_h + p * cap, q * 4);
        if (c->geo.n_pre) r->pre_last[p] = (int32_t)(p * q) + r->pre_lp[p] - 1;
        else r->last[p] = (int32_t)(p * q) + r->lp[p] - 1;
    }
}

/* The admission's prompt table, lengths and gathers to the device (with shared prompt rows:
 * the rows' ids, lengths and last rows, each sequence's row and the cascade plans). */
static flexdiag_status upload_admission(run_state *r) {
    flexdiag_context *c = r->c;
    size_t S = (size_t)c->geo.n_seq, P = (size_t)c->geo.n_pre, rows = c->geo.n_pre ? P : S;
    r->pf_q = pass_rows(r);
    pack_rows(r);
    FLEXDIAG_TRY(flexdiag__context_pf_tables(c, r->pf_q));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.ids_in, r->ids_pack, rows * (size_t)r->pf_q * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.lp, r->lp, S * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.last, r->last, S * 4, r->s));
    if (!c->geo.n_pre) return FLEXDIAG_OK;
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.prefix, r->prefix, S * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.lp_pre, r->pre_lp, P * 4, r->s));
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.last_pre, r->pre_last, P * 4, r->s));
    return upload_cascade(r);
}

/* ---- the loop ---- */

/* The progress of a decode pass (phase 1): the tokens made by the furthest live slot and its
 * job's length (a lock-step block: its images'), taken before its retirements. */
static void pass_progress(const run_state *r, uint64_t *done, uint64_t *total) {
    *done = *total = 0;
    for (int32_t i = 0; i < r->n_img; i++)
        if (r->slot[i].live && (uint64_t)r->slot[i].made >= *done) {
            *done = (uint64_t)r->slot[i].made;
            *total = (uint64_t)r->slot[i].job.n_steps;
        }
}

/* Whether this boundary admits: always while nothing is live, else once the free slots have
 * stood idle, with jobs waiting, for admit_idle slot-passes since the last admission. A prefill
 * pass reads every weight however few prompts it carries, so gathering a few admissions into
 * one pass trades a little idle slot time for fewer prefill passes (admit_idle 0: admit at every
 * boundary; FLEXDIAG_ADMIT_IDLE=F sets it to F x the context's slots). */
static int admit_due(const run_state *r) {
    return r->live == 0 || r->idle >= r->admit_idle;
}

/* A step boundary: cancelled jobs out, waiting jobs in (their prefill pass and first tokens). */
static flexdiag_status boundary(run_state *r, int32_t granule) {
    flexdiag_context *c = r->c;
    if (r->abort && atomic_load(r->abort))
        return flexdiag__err(FLEXDIAG_ERR_CANCELLED, "generation cancelled");
    retire_cancelled(r);
    if (!admit_due(r)) return FLEXDIAG_OK;
    int32_t n = admit(r);
    if (n < 0) return FLEXDIAG_ERR_INVALID_ARG; /* a block's refused job: its message stands */
    if (n == 0) return FLEXDIAG_OK;
    r->idle = 0;
    if (r->rounds++ == 0) c->n_pf = r->n_pf;
    pass_width(r, granule);
    double t0 = flexdiag__now();
    FLEXDIAG_TRY(upload_admission(r));
    FLEXDIAG_TRY(flexdiag__pass_prefill(r));
    FLEXDIAG_TRY(r->k->stream_sync(r->s));
    c->stats.prefill_s += flexdiag__now() - t0;
    return after_pass(r, 1);
}

/* A sequential pass after a window pass: b.ids back to one id an image (the window pass left
 * one a row there), each live slot's last token. */
static flexdiag_status restore_ids(run_state *r) {
    flexdiag_context *c = r->c;
    for (int32_t i = 0; i < r->n_img; i++)
        c->up.ids[i] = r->slot[i].live ? r->slot[i].job.tokens[r->slot[i].made - 1] : 0;
    FLEXDIAG_TRY(r->k->copy_h2d(c->b.ids, c->up.ids, (size_t)r->n_img * 4, r->s));
    return r->k->stream_sync(r->s); /* the host writes up.ids again before the pass ends */
}

/* One decode pass over the live slots, then their retirement. */
static flexdiag_status decode(run_state *r, int32_t granule) {
    flexdiag_context *c = r->c;
    const flexdiag_block *b = r->b;
    pass_width(r, granule);
    r->split = b->split && r->t[0] >= b->split_from ? b->split : NULL;
    r->win = flexdiag__window_rows(r);
    if (r->win == 1 && r->after_window) FLEXDIAG_TRY(restore_ids(r));
    r->after_window = r->win > 1;
    for (int32_t i = 0; i < r->n_img; i++) r->slot[i].job.passes += r->slot[i].live;
    double t0 = flexdiag__now();
    FLEXDIAG_TRY(r->win > 1 ? flexdiag__pass_window(r) : flexdiag__pass_decode(r));
    if (r->win == 1) flexdiag__window_sequential(r); /* no-op without drafts */
    r->win = 1;
    c->stats.decode_s += flexdiag__now() - t0;
    r->split = NULL;
    uint64_t done, total;
    pass_progress(r, &done, &total);
    FLEXDIAG_TRY(after_pass(r, 0)); /* the pass's tokens go out even if the callback cancels */
    if (r->live < c->geo.n_img && r->f->peek(r->f->user)) r->idle += c->geo.n_img - r->live;
    if (!r->progress || r->progress(1, done, total, r->progress_user)) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_CANCELLED, "cancelled by the progress callback");
}

/* Every live job fails with st and msg (the run is over). */
static void fail_live(run_state *r, flexdiag_status st, const char *msg) {
    for (int32_t i = 0; i < r->c->geo.n_img; i++)
        if (r->slot[i].live) retire(r, i, st, msg);
}

static flexdiag_status serve(flexdiag_context *c, const flexdiag_feed *f, const flexdiag_block *b,
                             int32_t granule) {
    run_state r;
    FLEXDIAG_TRY(run_alloc(&r, c, f, b));
    flexdiag__pd_reset(&c->pd);
    flexdiag_status st = FLEXDIAG_OK;
    for (;;) {
        st = boundary(&r, granule);
        if (st != FLEXDIAG_OK) break;
        if (r.live == 0) {
            if (f->peek(f->user) || f->wait(f->user)) continue;
            break;
        }
        st = decode(&r, granule);
        if (st != FLEXDIAG_OK) break;
    }
    flexdiag_status st2 = r.k->stream_sync(r.s);
    if (st == FLEXDIAG_OK) st = st2;
    if (st != FLEXDIAG_OK && f->abort) f->abort(f->user);
    if (st != FLEXDIAG_OK) fail_live(&r, st, flexdiag__err_msg());
    kv_stats(&r);
    run_free(&r);
    return st;
}

flexdiag_status flexdiag__engine_serve(flexdiag_context *c, const flexdiag_feed *f) {
    return serve(c, f, &no_block, (c->geo.n_img + 7) / 8);
}

void flexdiag__context_take(flexdiag_context *c) {
    int expected = 0;
    while (!atomic_compare_exchange_strong(&c->busy, &expected, 1)) {
        expected = 0;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL); /* the other run (the queue's engine thread, a scoring call) */
    }
}

/* ---- a lock-step block ---- */

typedef struct block_feed {
    const flexdiag_block *b;
    flexdiag_job job;        /* the next one's */
    int32_t next;            /* images taken */
    flexdiag_status st;      /* the first failure */
} block_feed;

static const flexdiag_job *block_peek(void *user) {
    block_feed *bf = user;
    const flexdiag_block *b = bf->b;
    int32_t i = bf->next;
    if (i >= b->n_img) return NULL;
    bf->job = (flexdiag_job){.prompt = b->prompt[i], .prompt_len = b->prompt_len[i],
                             .n_steps = b->n_steps, .eos = -1, .img = b->img0 + i, .sp = b->sp,
                             .cfg_weight = b->cfg_weight,
                             .forced = b->forced ? b->forced + (size_t)i * b->n_steps : NULL,
                             .tokens = b->tokens + (size_t)i * b->n_steps};
    return &bf->job;
}

static void block_take(void *user) { ((block_feed *)user)->next++; }

static int block_wait(void *user) {
    (void)user;
    return 0;
}

static void block_done(void *user, const flexdiag_job *job, int32_t n, flexdiag_status st,
                       const char *msg) {
    block_feed *bf = user;
    (void)job, (void)n, (void)msg; /* a block fails fast: the message stays the thread's */
    if (bf->st == FLEXDIAG_OK) bf->st = st;
}

/* The checks of a block that no job check covers: its size and its captures, and that its
 * distinct prompt rows fit the context's shared ones (all its images run at once). */
static flexdiag_status check_block(const flexdiag_context *c, const flexdiag_block *b) {
    const flexdiag_model_config *m = &c->m->cfg;
    if (b->n_img < 1 || b->n_img > c->geo.n_img)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%d images requested, context holds 1..%d",
                             b->n_img, c->geo.n_img);
    if ((b->hidden && (int64_t)b->n_hidden_pos * m->lm.hidden > (int64_t)c->geo.n_seq * c->geo.vocab_out) ||
        (b->attn_out && (int64_t)m->lm.heads * m->lm.head_dim > (int64_t)c->geo.n_seq * c->geo.vocab_out))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "captures do not fit the scratch buffer");
    if (!c->geo.n_pre) return FLEXDIAG_OK;
    int32_t distinct = 0; /* prompts (each rows_per_img rows; identical unconditional rows of
                             one length counted apart: an upper bound) */
    for (int32_t i = 0; i < b->n_img; i++) {
        int32_t u = 0;
        while (u < i && !(b->prompt_len[u] == b->prompt_len[i] &&
                          !memcmp(b->prompt[u], b->prompt[i], (size_t)b->prompt_len[i] * 4)))
            u++;
        distinct += u == i;
    }
    if ((int64_t)distinct * c->geo.rows_per_img <= c->geo.n_pre) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                         "the block's images have more distinct prompt rows than the %d the "
                         "context shares (context_params.images_per_prompt %d): give the images "
                         "of one prompt side by side, or a smaller "
                         "context_params.images_per_prompt",
                         c->geo.n_pre, c->p.images_per_prompt);
}

flexdiag_status flexdiag__engine_run(flexdiag_context *c, const flexdiag_block *b) {
    FLEXDIAG_TRY(check_block(c, b));
    block_feed bf = {.b = b};
    flexdiag_feed f = {.peek = block_peek, .take = block_take, .wait = block_wait,
                       .done = block_done, .user = &bf, .lockstep = 1, .fail_fast = 1};
    flexdiag_status st = serve(c, &f, b, 1);
    return st != FLEXDIAG_OK ? st : bf.st;
}

flexdiag_status flexdiag__context_score(flexdiag_context *c, const int32_t *prompt, int32_t np,
                                        const int32_t *ids, int32_t n, float cfg_weight,
                                        float *logits, float *raw) {
    flexdiag__context_take(c);
    int32_t *tokens = malloc((size_t)(n > 0 ? n : 1) * 4);
    flexdiag_block b = {.n_img = 1, .prompt = &prompt, .prompt_len = &np, .n_steps = n,
                        .forced = ids, .cfg_weight = cfg_weight, .tokens = tokens,
                        .logits = logits, .raw_logits = raw, .sp = {1.0f, 0, 1.0f, 0}};
    atomic_store(&c->cancel, 0);
    memset(&c->stats, 0, sizeof c->stats);
    flexdiag_status st = tokens ? flexdiag__engine_run(c, &b)
                                : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "score: no memory");
    free(tokens);
    atomic_store(&c->busy, 0);
    return st;
}
