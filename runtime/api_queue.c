/*
 * api_queue.c - the request queue of the public API (flexdiag.h "the request queue"): handles
 * (submit, wait, cancel, status, tokens, release), the bounded FIFO of waiting images, the
 * context's engine thread that serves it (engine.h flexdiag__engine_serve over a feed of the
 * queue), and flexdiag_generate as submit + wait.
 *
 * Locks: the queue's mutex guards the FIFO and the thread's life; each handle's own mutex guards
 * its state, so a handle outlives its context (wait, status, tokens and release touch only the
 * handle). A handle has two references, the caller's and the engine's (dropped when its last
 * image ended); the last one frees it. Callbacks run on the engine thread with no lock held.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "runtime/api_check.h"
#include "runtime/api_queue.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sjd.h"
#include "runtime/model/vocab_map.h"
#include "runtime/text/prompt.h"

typedef struct flexdiag_queue flexdiag_queue;

struct flexdiag_handle {
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* it ended */
    int refs;                    /* the caller's and the engine's */
    const flexdiag_model *m;     /* its model (outlives the contexts, so the handle too while
                                    the caller holds it: flexdiag.h) */
    int32_t rows_per_img;        /* the context's: 2 for images with CFG, 1 for text */
    flexdiag_submit_params p;    /* copy */
    int32_t n_img;               /* images (sequences) */
    int32_t per;                 /* tokens per image as the caller sees them */
    int32_t l_tok;               /* tokens each image's job makes */
    int32_t n_prompts;
    int32_t **ids;               /* (n_prompts) tokenized prompts */
    int32_t *lens;               /* (n_prompts) */
    int32_t *raw;                /* (n_img, l_tok) the engine's tokens */
    int32_t *made;               /* (n_img) tokens each finished image made */
    int32_t *grid;               /* (per) scratch of an image's code grid (Chameleon) */
    flexdiag_job *jobs;          /* (n_img) */
    int32_t queued;              /* jobs handed to the engine so far (under the queue's mutex) */
    int32_t ended;               /* images ended */
    uint64_t tokens;             /* tokens made */
    uint64_t passes;             /* decode passes of its finished images, summed */
    uint64_t accepted[FLEXDIAG_MAX_DRAFT - 1]; /* their drafts accepted by window row, summed */
    flexdiag_status st;          /* BUSY while it runs, then its status */
    flexdiag_status fail;        /* the first failure of its images */
    char msg[256];               /* its message */
    atomic_int cancel;           /* its jobs' cancel flag */
    double t0, t_admit, t_tok, t_img, t_end; /* submit time, then seconds after it (-1: not
                                                yet) */
    flexdiag_handle *next;       /* FIFO link */
    flexdiag_handle *lprev, *lnext; /* the queue's list of handles not ended */
    flexdiag_queue *q;           /* its queue (alive while the handle has not ended) */
};

struct flexdiag_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* images queued, room freed, stop */
    flexdiag_handle *head, *tail; /* handles with images not yet handed to the engine */
    flexdiag_handle *live;       /* every handle not ended (for a context-wide cancel) */
    int32_t waiting;             /* those images */
    int32_t cap;                 /* queue_images */
    int started, stop;
    pthread_t thread;
    flexdiag_context *c;
};

/* ---- handles ---- */

static double secs_since(double t0) { return flexdiag__now() - t0; }

static void handle_free(flexdiag_handle *h) {
    for (int32_t i = 0; h->ids && i < h->n_prompts; i++) free(h->ids[i]);
    free(h->ids);
    free(h->lens);
    free(h->raw);
    free(h->made);
    free(h->grid);
    free(h->jobs);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

/* Drop one reference; the last frees h. */
static void handle_unref(flexdiag_handle *h) {
    pthread_mutex_lock(&h->mu);
    int last = --h->refs == 0;
    pthread_mutex_unlock(&h->mu);
    if (last) handle_free(h);
}

/* Image i's tokens as the caller sees them into out (per of them): the code grid of a Chameleon
 * image, else the ids. */
static void image_tokens(const flexdiag_handle *h, int32_t i, int32_t *out) {
    const int32_t *raw = h->raw + (size_t)i * (size_t)h->l_tok;
    const flexdiag_model *m = h->m;
    if (h->rows_per_img == 2 && m->cfg.arch == FLEXDIAG_ARCH_CHAMELEON)
        flexdiag__image_codes(&m->cfg, m->img_codes, raw, out);
    else
        memcpy(out, raw, (size_t)h->per * 4);
}

/* ---- the engine's feed over the queue (engine thread) ---- */

static const flexdiag_job *feed_peek(void *user) {
    flexdiag_queue *q = user;
    pthread_mutex_lock(&q->mu);
    flexdiag_handle *h = q->head;
    const flexdiag_job *j = h ? &h->jobs[h->queued] : NULL;
    pthread_mutex_unlock(&q->mu);
    return j;
}

static void feed_take(void *user) {
    flexdiag_queue *q = user;
    pthread_mutex_lock(&q->mu);
    flexdiag_handle *h = q->head;
    if (h->queued == 0) h->t_admit = secs_since(h->t0);
    q->waiting--;
    if (++h->queued == h->n_img) {
        q->head = h->next;
        if (!q->head) q->tail = NULL;
    }
    pthread_cond_broadcast(&q->cv); /* room */
    pthread_mutex_unlock(&q->mu);
}

static int feed_wait(void *user) {
    flexdiag_queue *q = user;
    pthread_mutex_lock(&q->mu);
    int more = q->head != NULL;
    pthread_mutex_unlock(&q->mu);
    return more;
}

static void feed_token(void *user, const flexdiag_job *job, int32_t step) {
    flexdiag_handle *h = job->tag;
    (void)user;
    pthread_mutex_lock(&h->mu);
    if (h->t_tok < 0) h->t_tok = secs_since(h->t0);
    h->tokens++;
    pthread_mutex_unlock(&h->mu);
    if (h->p.on_token)
        h->p.on_token(h, job->idx, step, job->tokens[step], h->p.user);
}

/* h ended: out of its queue's list of live handles. */
static void unlist(flexdiag_handle *h) {
    flexdiag_queue *q = h->q;
    pthread_mutex_lock(&q->mu);
    if (h->lprev) h->lprev->lnext = h->lnext;
    else q->live = h->lnext;
    if (h->lnext) h->lnext->lprev = h->lprev;
    pthread_mutex_unlock(&q->mu);
}

/* Image `job` of its handle ended: its callback; the handle's end once it was the last. */
static void job_ended(const flexdiag_job *job, int32_t n, flexdiag_status st, const char *msg) {
    flexdiag_handle *h = job->tag;
    int32_t i = job->idx;
    h->made[i] = n;
    if (st == FLEXDIAG_OK) h->passes += (uint64_t)job->passes;
    for (int32_t k = 0; st == FLEXDIAG_OK && k < FLEXDIAG_MAX_DRAFT - 1; k++)
        h->accepted[k] += (uint64_t)job->accepted[k];
    if (st == FLEXDIAG_OK) {
        if (h->t_img < 0) h->t_img = secs_since(h->t0);
        image_tokens(h, i, h->grid);
        if (h->p.on_image)
            h->p.on_image(h, i, h->rows_per_img == 2 ? h->grid : h->raw + (size_t)i * h->l_tok,
                          h->rows_per_img == 2 ? h->per : n, h->p.user);
    } else if (h->fail == FLEXDIAG_OK) {
        h->fail = st;
        snprintf(h->msg, sizeof h->msg, "%s",
                 st == FLEXDIAG_ERR_CANCELLED ? "generation cancelled" : msg);
    }
    if (++h->ended < h->n_img) return;
    h->t_end = secs_since(h->t0);
    unlist(h);
    if (h->p.on_done) h->p.on_done(h, h->fail, h->p.user);
    pthread_mutex_lock(&h->mu);
    h->st = h->fail;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    handle_unref(h); /* the engine's reference */
}

static void feed_done(void *user, const flexdiag_job *job, int32_t n, flexdiag_status st,
                      const char *msg) {
    (void)user;
    job_ended(job, n, st, msg);
}

/* Cancel every handle not ended (queued images end CANCELLED when the engine takes them, live
 * ones at their next step boundary). */
static void cancel_live(flexdiag_queue *q) {
    for (flexdiag_handle *h = q->live; h; h = h->lnext) atomic_store(&h->cancel, 1);
}

static void feed_abort(void *user) {
    flexdiag_queue *q = user;
    pthread_mutex_lock(&q->mu);
    cancel_live(q);
    pthread_mutex_unlock(&q->mu);
}

/* The engine thread: serve the queue whenever it holds images, with the context taken (busy)
 * for the run; between runs the context is free for scoring. */
static void *engine_main(void *arg) {
    flexdiag_queue *q = arg;
    flexdiag_context *c = q->c;
    flexdiag_feed f = {.peek = feed_peek, .take = feed_take, .wait = feed_wait,
                       .token = feed_token, .done = feed_done, .abort = feed_abort, .user = q,
                       .lockstep = c->p.batching == 1};
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && !q->head) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head) break; /* stopping, nothing left */
        pthread_mutex_unlock(&q->mu);
        flexdiag__context_take(c); /* a scoring call may hold it */
        flexdiag__err_clear();     /* this thread's messages are the run's failures */
        memset(&c->stats, 0, sizeof c->stats);
        (void)flexdiag__engine_serve(c, &f); /* its failures end the requests it served */
        atomic_store(&c->busy, 0);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ---- the queue's life (context.c) ---- */

flexdiag_status flexdiag__queue_create(flexdiag_context *c) {
    flexdiag_queue *q = calloc(1, sizeof *q);
    if (!q) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "request queue: no host memory");
    int32_t cap = c->p.queue_images > 0 ? c->p.queue_images : 4 * c->geo.n_img;
    q->cap = c->p.queue_images > 0 ? cap : cap < 64 ? 64 : cap;
    q->c = c;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    c->queue = q;
    return FLEXDIAG_OK;
}

void flexdiag__queue_destroy(flexdiag_context *c) {
    flexdiag_queue *q = c->queue;
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    cancel_live(q);
    pthread_cond_broadcast(&q->cv);
    int started = q->started;
    pthread_mutex_unlock(&q->mu);
    if (started) pthread_join(q->thread, NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
    c->queue = NULL;
}

void flexdiag__queue_cancel_all(flexdiag_context *c) {
    flexdiag_queue *q = c->queue;
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    cancel_live(q);
    pthread_mutex_unlock(&q->mu);
}

/* ---- submit ---- */

void flexdiag_submit_params_init_size(flexdiag_submit_params *p, size_t size) {
    flexdiag_submit_params d = {.struct_size = sizeof d};
    flexdiag__params_fill(p, size, &d, sizeof d);
}

/* a program built before API version 14 (the struct of API version 13) */
void(flexdiag_submit_params_init)(flexdiag_submit_params *p) {
    flexdiag_submit_params_init_size(p, FLEXDIAG_FIRST_SIZE(flexdiag_submit_params, stop_at_eos));
}

flexdiag_status flexdiag__read_request(const flexdiag_request *req, flexdiag_request *copy) {
    FLEXDIAG_TRY(flexdiag__check_params(req, FLEXDIAG_FIRST_SIZE(flexdiag_request, first_image),
                                        sizeof *req, "flexdiag_request"));
    flexdiag_request_init(copy);
    flexdiag__params_copy(copy, req, sizeof *copy);
    const flexdiag_request *r = copy;
    if (r->n_prompts < 1 || (!r->prompts && !(r->prompt_ids && r->prompt_lens)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "request.n_prompts is %d: it needs n_prompts >= 1 and "
                             "request.prompts or request.prompt_ids + request.prompt_lens",
                             r->n_prompts);
    if (r->images_per_prompt < 1 || r->first_image < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "request.images_per_prompt %d must be >= 1 and request.first_image "
                             "%lld >= 0", r->images_per_prompt, (long long)r->first_image);
    if ((int64_t)r->n_prompts * r->images_per_prompt > INT32_MAX / 2)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "request.n_prompts %d x request.images_per_prompt %d images: too "
                             "many for one request",
                             r->n_prompts, r->images_per_prompt);
    /* sampling: one message per field, naming it */
    if (!(r->temperature > 0) || !isfinite(r->temperature))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "request.temperature is %g: it must be "
                             "finite and > 0 (greedy decoding is request.top_k 1)",
                             (double)r->temperature);
    if (r->top_k < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "request.top_k is %d: it must be >= 0 "
                             "(0 = off)", (int)r->top_k);
    if (!(r->top_p > 0 && r->top_p <= 1))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "request.top_p is %g: it must be in "
                             "(0, 1] (1 = off)", (double)r->top_p);
    if (!isfinite(r->cfg_weight))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "request.cfg_weight is %g: it must be "
                             "finite", (double)r->cfg_weight);
    return FLEXDIAG_OK;
}

/* Token ids of every prompt of r into h (tokenised or copied). */
static flexdiag_status prompt_table(const flexdiag_context *c, const flexdiag_request *r,
                                    flexdiag_handle *h) {
    h->n_prompts = r->n_prompts;
    h->ids = calloc((size_t)r->n_prompts, sizeof *h->ids);
    h->lens = calloc((size_t)r->n_prompts, 4);
    if (!h->ids || !h->lens) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompts: no memory");
    for (int32_t i = 0; i < r->n_prompts; i++) {
        int64_t n = 0;
        if (r->prompts ? !r->prompts[i] : !r->prompt_ids[i] && r->prompt_lens[i] > 0)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "request: prompt %d of %d is NULL (prompts[] needs n_prompts "
                                 "texts, prompt_ids[] n_prompts arrays)",
                                 i, r->n_prompts);
        if (r->prompts) {
            FLEXDIAG_TRY(flexdiag__prompt_ids(c->m, r->prompts[i], c->geo.rows_per_img == 2,
                                              &h->ids[i], &n));
        } else {
            n = r->prompt_lens[i];
            h->ids[i] = malloc((size_t)(n > 0 ? n : 1) * 4);
            if (!h->ids[i]) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompts: no memory");
            memcpy(h->ids[i], r->prompt_ids[i], (size_t)(n > 0 ? n : 0) * 4);
        }
        h->lens[i] = (int32_t)n;
    }
    return FLEXDIAG_OK;
}

/* Tokens each image's job makes: the context's decode length, or a text request's own. */
static flexdiag_status job_tokens(const flexdiag_context *c, const flexdiag_submit_params *p,
                                  int32_t *out) {
    *out = c->geo.l_dec;
    if (c->geo.rows_per_img == 2 || p->max_new_tokens == 0) return FLEXDIAG_OK;
    if (p->max_new_tokens < 0 || p->max_new_tokens > c->geo.l_dec)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "submit_params.max_new_tokens %d must be in 1..%d (the "
                             "context's context_params.max_new_tokens)",
                             p->max_new_tokens, c->geo.l_dec);
    *out = p->max_new_tokens;
    return FLEXDIAG_OK;
}

/* The handle of r on c with its jobs (not queued yet). */
static flexdiag_status handle_make(flexdiag_context *c, const flexdiag_request *r,
                                   const flexdiag_submit_params *p, flexdiag_handle **out) {
    flexdiag_handle *h = calloc(1, sizeof *h);
    if (!h) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "submit: no host memory");
    *h = (flexdiag_handle){.refs = 2, .m = c->m, .p = *p, .rows_per_img = c->geo.rows_per_img,
                           .st = FLEXDIAG_ERR_BUSY, .t_admit = -1, .t_tok = -1, .t_img = -1,
                           .t_end = -1};
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    atomic_init(&h->cancel, 0);
    *out = h;
    FLEXDIAG_TRY(job_tokens(c, p, &h->l_tok));
    h->n_img = r->n_prompts * r->images_per_prompt;
    h->per = c->geo.rows_per_img == 2 ? c->m->cfg.image_tokens : h->l_tok;
    FLEXDIAG_TRY(prompt_table(c, r, h));
    h->raw = calloc((size_t)h->n_img * (size_t)h->l_tok, 4);
    h->made = calloc((size_t)h->n_img, 4);
    h->grid = calloc((size_t)h->per > (size_t)h->l_tok ? (size_t)h->per : (size_t)h->l_tok, 4);
    h->jobs = calloc((size_t)h->n_img, sizeof *h->jobs);
    if (!h->raw || !h->made || !h->grid || !h->jobs)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "submit: no host memory for %d images",
                             h->n_img);
    int32_t top_k = r->top_k == 0 && c->geo.row_len ? FLEXDIAG_LUMINA_TOP_K : r->top_k;
    int32_t eos = c->geo.rows_per_img == 1 && p->stop_at_eos ? c->m->cfg.eos_id : -1;
    if (r->draft_len < 0 || r->draft_len > c->geo.win)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "request.draft_len %d: give 0 (the context's), 1 (sequential) or up "
                             "to context_params.draft_len (%d)", r->draft_len, c->geo.win);
    int32_t draft = r->draft_len ? r->draft_len : c->geo.win;
    if (r->sjd_group < -1 || r->sjd_group > FLEXDIAG_MAX_GROUP || (r->sjd_group > 0 && !c->groups))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "request.sjd_group %d: give 0 (the context's, %d), -1 (exact SJD) or "
                             "1 .. 64 in a context made with context_params.sjd_group > 0",
                             r->sjd_group, c->p.sjd_group);
    int32_t group = r->sjd_group < 0 ? 0 : r->sjd_group ? r->sjd_group : c->p.sjd_group;
    for (int32_t i = 0; i < h->n_img; i++) {
        int32_t prompt = i / r->images_per_prompt;
        h->jobs[i] = (flexdiag_job){.prompt = h->ids[prompt], .prompt_len = h->lens[prompt],
                                    .n_steps = h->l_tok, .eos = eos,
                                    .img = r->first_image + i,
                                    .sp = {r->temperature, top_k, r->top_p, r->seed, 0},
                                    .cfg_weight = r->cfg_weight, .draft_len = draft,
                                    .sjd_group = group,
                                    .tokens = h->raw + (size_t)i * (size_t)h->l_tok,
                                    .cancel = &h->cancel, .tag = h, .idx = i};
    }
    return FLEXDIAG_OK;
}

/* Put h's images at the end of c's queue (room permitting, or waiting for it), starting the
 * engine thread on the first call. */
static flexdiag_status enqueue(flexdiag_context *c, flexdiag_handle *h) {
    flexdiag_queue *q = c->queue;
    pthread_mutex_lock(&q->mu);
    while (!q->stop && q->waiting > 0 && (int64_t)q->waiting + h->n_img > q->cap) {
        if (!h->p.wait_for_room) {
            pthread_mutex_unlock(&q->mu);
            return flexdiag__err(FLEXDIAG_ERR_BUSY,
                                 "submit: the queue holds %d waiting image(s) of %d "
                                 "(context_params.queue_images); the request has %d",
                                 q->waiting, q->cap, h->n_img);
        }
        pthread_cond_wait(&q->cv, &q->mu);
    }
    flexdiag_status st = FLEXDIAG_OK;
    if (q->stop) st = flexdiag__err(FLEXDIAG_ERR_CANCELLED, "submit: the context is closing");
    if (st == FLEXDIAG_OK && !q->started) {
        if (pthread_create(&q->thread, NULL, engine_main, q) != 0)
            st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "submit: cannot start the engine thread");
        q->started = st == FLEXDIAG_OK;
    }
    if (st == FLEXDIAG_OK) {
        h->t0 = flexdiag__now();
        h->q = q;
        if (q->tail) q->tail->next = h;
        else q->head = h;
        q->tail = h;
        h->lnext = q->live;
        if (q->live) q->live->lprev = h;
        q->live = h;
        q->waiting += h->n_img;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

flexdiag_status flexdiag_submit(flexdiag_context *c, const flexdiag_request *req,
                                const flexdiag_submit_params *p, flexdiag_handle **out) {
    flexdiag__err_clear();
    if (!c || !req || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "submit: NULL argument");
    *out = NULL;
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    if (p) {
        FLEXDIAG_TRY(flexdiag__check_params(p, sizeof *p, sizeof *p, "flexdiag_submit_params"));
        flexdiag__params_copy(&sp, p, sizeof sp);
    }
    flexdiag_request rq;
    FLEXDIAG_TRY(flexdiag__read_request(req, &rq));
    flexdiag_handle *h = NULL;
    flexdiag_status st = handle_make(c, &rq, &sp, &h);
    if (st == FLEXDIAG_OK) st = enqueue(c, h);
    if (st != FLEXDIAG_OK) {
        if (h) handle_free(h);
        return st;
    }
    *out = h;
    return FLEXDIAG_OK;
}

/* ---- waiting on handles ---- */

flexdiag_status flexdiag_handle_wait(flexdiag_handle *h, double timeout_s) {
    if (!h) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "handle_wait: NULL handle");
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_s >= 0) {
        double s = (double)until.tv_sec + until.tv_nsec * 1e-9 + timeout_s;
        until.tv_sec = (time_t)s;
        until.tv_nsec = (long)((s - (double)until.tv_sec) * 1e9);
    }
    pthread_mutex_lock(&h->mu);
    int timed_out = 0;
    while (h->st == FLEXDIAG_ERR_BUSY && !timed_out)
        timed_out = timeout_s < 0 ? pthread_cond_wait(&h->cv, &h->mu) != 0
                                  : pthread_cond_timedwait(&h->cv, &h->mu, &until) != 0;
    int ended = h->st != FLEXDIAG_ERR_BUSY;
    pthread_mutex_unlock(&h->mu);
    return ended ? FLEXDIAG_OK : FLEXDIAG_ERR_TIMEOUT;
}

flexdiag_status flexdiag_handle_cancel(flexdiag_handle *h) {
    if (!h) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "handle_cancel: NULL handle");
    atomic_store(&h->cancel, 1);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_handle_status(const flexdiag_handle *h, flexdiag_status *st,
                                       flexdiag_handle_stats *stats) {
    if (!h || !st) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "handle_status: NULL argument");
    uint32_t size = stats ? stats->struct_size : 0; /* a caller of API 12..14 lacks passes */
    if (stats)
        FLEXDIAG_TRY(flexdiag__check_output(size, FLEXDIAG_FIRST_SIZE(flexdiag_handle_stats, total_s),
                                            sizeof *stats, "flexdiag_handle_stats"));
    flexdiag_handle *w = (flexdiag_handle *)h;
    pthread_mutex_lock(&w->mu);
    *st = h->st;
    flexdiag_handle_stats hs = {.struct_size = size, .n_images = h->n_img,
                                .done_images = h->ended, .tokens = h->tokens,
                                .queue_s = h->t_admit, .first_token_s = h->t_tok,
                                .first_image_s = h->t_img, .total_s = h->t_end,
                                .passes = h->passes};
    memcpy(hs.accepted, h->accepted, sizeof hs.accepted);
    pthread_mutex_unlock(&w->mu);
    if (stats) memcpy(stats, &hs, size);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_handle_tokens(const flexdiag_handle *h, flexdiag_output *out) {
    if (!h || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "handle_tokens: NULL argument");
    out->n_images = h->n_img;
    out->tokens_per_image = h->per;
    if (!out->tokens) return FLEXDIAG_OK;
    flexdiag_handle *w = (flexdiag_handle *)h;
    pthread_mutex_lock(&w->mu);
    int ended = h->st != FLEXDIAG_ERR_BUSY;
    pthread_mutex_unlock(&w->mu);
    if (!ended)
        return flexdiag__err(FLEXDIAG_ERR_BUSY, "handle_tokens: the request is still running "
                             "(flexdiag_handle_wait first)");
    for (int32_t i = 0; i < h->n_img; i++) {
        int32_t *dst = out->tokens + (size_t)i * (size_t)h->per;
        if (h->made[i] > 0) image_tokens(h, i, dst);
        else memset(dst, 0, (size_t)h->per * 4);
    }
    return FLEXDIAG_OK;
}

const char *flexdiag_handle_error(const flexdiag_handle *h) {
    if (!h) return "handle_error: NULL handle";
    flexdiag_handle *w = (flexdiag_handle *)h;
    pthread_mutex_lock(&w->mu);
    int ended = h->st != FLEXDIAG_ERR_BUSY;
    pthread_mutex_unlock(&w->mu);
    return ended ? h->msg : "";
}

void flexdiag_handle_release(flexdiag_handle *h) {
    if (h) handle_unref(h);
}

/* ---- generate: submit + wait (the context's progress callback runs on the engine thread,
 * engine.h) ---- */

flexdiag_status flexdiag_generate(flexdiag_context *c, const flexdiag_request *req,
                                  flexdiag_output *out) {
    flexdiag__err_clear();
    if (!c || !req || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "generate: NULL argument");
    flexdiag_request rq;
    FLEXDIAG_TRY(flexdiag__read_request(req, &rq));
    out->n_images = req->n_prompts * req->images_per_prompt;
    out->tokens_per_image = c->geo.rows_per_img == 2 ? c->m->cfg.image_tokens : c->geo.l_dec;
    if (!out->tokens) return FLEXDIAG_OK; /* size query */
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    sp.wait_for_room = true;
    flexdiag_handle *h;
    FLEXDIAG_TRY(flexdiag_submit(c, req, &sp, &h));
    flexdiag_handle_wait(h, -1.0);
    flexdiag_status st = h->st;
    if (st == FLEXDIAG_OK) st = flexdiag_handle_tokens(h, out);
    else flexdiag__err(st, "%s", h->msg);
    flexdiag_handle_release(h);
    return st;
}
