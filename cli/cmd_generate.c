/*
 * cmd_generate.c - `flexdiag generate`: prompts in; PNGs, results.jsonl and tokens.json out.
 *
 * Runs through the public API only (runtime -> model -> context -> flexdiag_generate), so the
 * CLI exercises what embedders get. Without --model the builtin tiny-janus model (seeded random
 * weights, noise images) runs anywhere. Image i of the job is sample i % N of prompt i / N.
 * Images are generated block by block: one flexdiag_generate call per --batch images (auto, the
 * default with a device budget: the largest block that fits, evened over the job) with
 * first_image = the block's first index; sampling is keyed by (seed, image index, step), so
 * the images do not depend on --batch. Each block's tokens go to the output thread
 * (gen_writer.h: decode, PNGs, results.jsonl, tokens.json in the layout of --layout) while the
 * next block generates; prompts.c reads --prompt / --prompts.
 * SIGINT/SIGTERM set a flag and cancel the context (an atomic store: async-signal-safe); the
 * block in generation is dropped, the one the output thread holds is completed, completed files
 * stay, exit code 128 + signal (130 for SIGINT). block_s in results.jsonl is the wall time of the
 * block's generate + decode calls.
 * Scale-out and resume: the images to make (all, or those a --resume did not find complete) are
 * cut into chunks that mpi_job.h hands out to the processes of an MPI job one at a time: a
 * chunk is --batch images (the smallest of the ranks'), rounded up to whole prompts for DPG so
 * that a grid's samples stay in one process; one process takes each run of missing images whole.
 * Every rank writes its PNGs to their final paths and its records to part files (gen_out.h), and
 * rank 0 merges them in image order at the end (gen_merge.h), as it gathers an earlier run's
 * records at the start of a --resume. One process without --resume writes results.jsonl and
 * tokens.json directly, as it always did. Each rank asks for the CUDA device of its rank among
 * its host's ranks (one rank per GPU); --cpu ranks share the host's cores.
 */
#include <errno.h>
#include <jansson.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/fileio.h"
#include "cli/gen_merge.h"
#include "cli/gen_out.h"
#include "cli/gen_progress.h"
#include "cli/gen_writer.h"
#include "cli/image_out.h"
#include "cli/mpi_job.h"
#include "cli/prompts.h"

#define CMD "generate"
#define DEFAULT_PROMPT "a red apple on a wooden table"
#define DEFAULT_DRAFT 8 /* --draft-len: bench/RESULTS.md "Speculative Jacobi decoding" */
#define DEFAULT_DRAFT_S "8"
#define DEFAULT_GROUP 7 /* --group: the official GSD code's window, 7 ranks either side */
#define DEFAULT_GROUP_S "7"

typedef struct gen_opts {
    cli_model_opts mo;
    cli_policy_opts po;
    const char *prompt, *prompts_file, *out, *layout_name, *batch, *batching, *decode;
    const char *prompt_ids, *prompt_ids_file; /* prompts as token ids (no tokenizer needed) */
    int blocks;            /* --batching blocks */
    cli_layout layout;
    int64_t per_prompt, micro_batch, max_prompt_len, top_k, sample_seed, max_new_tokens;
    int64_t draft_len;     /* --draft-len: the SJD window with --decode sjd or gsd, else 1 */
    int64_t group;         /* --group: grouped acceptance with --decode gsd (lossy), else 0 */
    double cfg, temperature, top_p;
    int quiet, resume;
} gen_opts;

/* One line "flexdiag generate: ..." on stderr; returns rc. */
#define fail(rc, ...) cli_errorf(CMD, (rc), __VA_ARGS__)

/* ---- signals ---- */

static volatile sig_atomic_t g_signal;    /* signal that asked the run to stop; 0 = none */
static _Atomic(flexdiag_context *) g_ctx; /* context the handler cancels; NULL = none */
static atomic_int g_in_handler;           /* handlers running now: teardown waits for 0 */

/* Async-signal-safe: a flag, an atomic load and flexdiag_context_cancel (an atomic store). */
static void on_signal(int sig) {
    atomic_fetch_add(&g_in_handler, 1);
    g_signal = sig;
    flexdiag_context *c = atomic_load(&g_ctx);
    if (c) flexdiag_context_cancel(c);
    atomic_fetch_sub(&g_in_handler, 1);
}

static void signals_install(struct sigaction old[2]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    g_signal = 0;
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
}

/* Stop cancelling c; returns once no handler (on any thread) can still be using it. */
static void signals_forget_context(void) {
    atomic_store(&g_ctx, NULL);
    while (atomic_load(&g_in_handler)) sched_yield();
}

static void signals_restore(const struct sigaction old[2]) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
}


/* ---- generation ---- */

typedef struct progress_state {
    double t0, last;       /* start and last print (seconds) */
    uint64_t rows;         /* sequences per step: images x rows per image (2 with CFG, 1 without) */
    int quiet;
    const gen_writer *out; /* the output thread: its failure stops the block too */
} progress_state;

/* Per decode step: a rate line at most once a second; false (cancel) once a signal came, which
 * also covers a signal that landed before flexdiag_generate reset the cancel flag, or once the
 * output thread failed. */
static bool on_progress(int phase, uint64_t done, uint64_t total, void *user) {
    progress_state *p = user;
    if (g_signal || gen_writer_failed(p->out)) return false;
    double now = cli_now();
    if (p->quiet || phase != 1 || (now - p->last < 1.0 && done != total)) return true;
    p->last = now;
    fprintf(stderr, "step %llu/%llu  %.1f tok/s\n", (unsigned long long)done,
            (unsigned long long)total, (double)(done * p->rows) / (now - p->t0));
    return true;
}

typedef struct gen_run {
    const gen_opts *o;
    gen_out w;
    flexdiag_model *m;
    flexdiag_context *c;
    flexdiag_request rq;   /* sampling fields fixed; prompts/first_image set per block */
    const char **texts;    /* (batch) prompt of each image of the block */
    const int32_t **ids;   /* (batch) its token ids, with --prompt-ids */
    int32_t *lens;         /* (batch) their counts */
    int32_t *tokens;       /* (batch, per_image) ids of the block */
    gen_writer *out;       /* the output thread (owns w while it runs) */
    int threads;           /* its PNG threads: --threads, or this process's cores */
    int64_t made;          /* images this process generated */
    double t0, end_s;      /* when the job's first block started; when its files were written */
    uint64_t passes;       /* decode passes of the finished images, summed (continuous runs) */
    uint64_t accepted[FLEXDIAG_MAX_DRAFT_LEN - 1]; /* their drafts kept by window row, summed */
    int64_t total;         /* images in the job */
    int64_t per;           /* images per prompt: --images-per-prompt, or 4 (1 for text) */
    int text;              /* the model continues text: one row a sequence, no CFG, no PNG */
    int32_t batch;         /* images per block */
    int32_t rows_per_img;  /* sequences each image runs: 2 with CFG (Janus), 1 without */
    flexdiag_stats sum;    /* counters summed over blocks */
    progress_state prog;
    /* the job's processes (mpi_job.h) */
    const job_world *world;
    int merge;             /* records go to part files that rank 0 merges (MPI, --resume) */
    int quiet;             /* no progress lines from this process (--quiet, or rank > 0) */
    char part[32];         /* ".part-<rank>" when merge */
    uint8_t *done;         /* (total) 1 = complete in --out before this run */
    int64_t *chunk_first, *chunk_len; /* (n_chunks) images to make, in hand-out order */
    int64_t n_chunks;
    gen_progress jp;       /* job accounting */
    gen_rank_end *ends;    /* (world size) every rank's account, gathered on rank 0 */
    double busy_s;         /* seconds this process spent on its chunks */
    double finish_s;       /* seconds from the job's start to running out of chunks */
} gen_run;

/* Add the context's counters of the run just ended to the job's. */
static void add_stats(gen_run *r) {
    flexdiag_stats s;
    flexdiag_context_stats(r->c, &s);
    r->sum.prefill_s += s.prefill_s;
    r->sum.decode_s += s.decode_s;
    r->sum.tokens_generated += s.tokens_generated;
    r->sum.kv_bytes_per_seq = s.kv_bytes_per_seq;
    r->sum.peak_device_bytes = s.peak_device_bytes;
}

/* Image g's prompt: its text, and its token ids with --prompt-ids (else NULL, 0). */
static void prompt_of(const gen_run *r, int64_t g, const char **text, const int32_t **ids,
                      int32_t *len) {
    const cli_prompts *ps = r->w.ps;
    int64_t p = g / r->per;
    *text = ps->p[p].text;
    *ids = ps->ids ? ps->ids[p] : NULL;
    *len = ps->ids ? ps->n_ids[p] : 0;
}

/* A request's prompts: the texts, or with --prompt-ids the ids (the library takes one or the
 * other). */
static void request_prompts(const gen_run *r, flexdiag_request *rq, const char **texts,
                            const int32_t **ids, const int32_t *lens) {
    int by_ids = r->w.ps->ids != NULL;
    rq->prompts = by_ids ? NULL : texts;
    rq->prompt_ids = by_ids ? ids : NULL;
    rq->prompt_lens = by_ids ? lens : NULL;
}

/* A failed run's line (msg: the library's; "" for the status's own): with token-id prompts, a
 * prompt the library refused ("prompt of image 3: token 1 is id 99999, outside the vocabulary")
 * is named by its flag; text prompts for a model without tokenizer.json get the id flags
 * named. Returns 2 for INVALID_ARG and the missing tokenizer, else 1. */
static int run_fail(const gen_run *r, flexdiag_status st, const char *msg) {
    const char *flag = r->o->prompt_ids        ? "--prompt-ids: "
                       : r->o->prompt_ids_file ? "--prompt-ids-file: "
                                               : "";
    if (strncmp(msg, "prompt of image", 15)) flag = "";
    if (strstr(msg, "no tokenizer.json")) /* text prompts, no tokenizer: the flags must change */
        return fail(2, "%s (--prompt-ids 1,2,3 or --prompt-ids-file FILE)", msg);
    return fail(st == FLEXDIAG_ERR_INVALID_ARG ? 2 : 1, "%s%s", flag,
                *msg ? msg : flexdiag_status_str(st));
}

/* Generate images [first, first + n) and hand them to the output thread: 0, 1 after a message
 * (the output thread's failure included), -1 when a signal cancelled the block (nothing of it is
 * written). */
static int run_block(gen_run *r, int64_t first, int32_t n) {
    for (int32_t i = 0; i < n; i++) prompt_of(r, first + i, &r->texts[i], &r->ids[i], &r->lens[i]);
    r->rq.n_prompts = n;
    r->rq.first_image = first;
    r->prog.rows = (uint64_t)n * (uint64_t)r->rows_per_img;
    flexdiag_output out = {.tokens = r->tokens};
    double t0 = cli_now();
    r->prog.t0 = r->prog.last = t0;
    flexdiag_status st = flexdiag_generate(r->c, &r->rq, &out);
    if (st == FLEXDIAG_ERR_CANCELLED && g_signal) return -1;
    if (st == FLEXDIAG_ERR_CANCELLED && gen_writer_failed(r->out)) return gen_writer_wait(r->out);
    if (st != FLEXDIAG_OK) return run_fail(r, st, cli_last_error());
    add_stats(r);
    r->made += n;
    return gen_writer_put(r->out, first, n, r->tokens, cli_now() - t0);
}

/* The images of a continuous range as they finish (the engine thread's callback). */
typedef struct cont_images {
    int32_t *tokens;       /* (n, per_image) */
    atomic_uchar *done;    /* (n) */
    int32_t per;
} cont_images;

static void on_image(flexdiag_handle *h, int32_t i, const int32_t *tokens, int32_t n,
                     void *user) {
    cont_images *ci = user;
    (void)h;
    memcpy(ci->tokens + (size_t)i * (size_t)ci->per, tokens, (size_t)n * 4);
    atomic_store(&ci->done[i], 1);
}

/* The finished images [*next, ...) of the range at first, in order, to the output thread in
 * groups of at most --batch, until a signal came: 0, or the writer's exit code. */
static int flush_done(gen_run *r, const cont_images *ci, int64_t first, int64_t n, int64_t *next,
                      double *t_last) {
    int rc = 0;
    while (!rc && !g_signal && *next < n && atomic_load(&ci->done[*next])) {
        int64_t e = *next;
        while (e < n && e - *next < r->batch && atomic_load(&ci->done[e])) e++;
        double now = cli_now();
        int32_t m = (int32_t)(e - *next);
        rc = gen_writer_put(r->out, first + *next, m, ci->tokens + *next * ci->per, now - *t_last);
        if (!rc && r->world->size == 1) gen_progress_block(&r->jp, r->made + m, m, now - *t_last);
        r->made += m;
        *t_last = now;
        *next = e;
    }
    return rc;
}

/* Images [first, first + n) as one request through the context's queue (--batching
 * continuous): a finished image's slot takes the next image at the next step, and the
 * finished images go to the output thread in order while the others generate. 0, -1 after a
 * signal, or an exit code. */
static int run_continuous(gen_run *r, int64_t first, int64_t n) {
    const char **texts = calloc((size_t)n, sizeof *texts);
    const int32_t **ids = calloc((size_t)n, sizeof *ids);
    int32_t *lens = calloc((size_t)n, sizeof *lens);
    cont_images ci = {.tokens = calloc((size_t)n * (size_t)r->w.per_image, 4),
                      .done = calloc((size_t)n, 1), .per = r->w.per_image};
    if (!texts || !ids || !lens || !ci.tokens || !ci.done) {
        free(texts), free(ids), free(lens), free(ci.tokens), free(ci.done);
        return fail(1, "no host memory for %lld images", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) prompt_of(r, first + i, &texts[i], &ids[i], &lens[i]);
    flexdiag_request rq = r->rq;
    rq.n_prompts = (int32_t)n;
    request_prompts(r, &rq, texts, ids, lens);
    rq.first_image = first;
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    sp.on_image = on_image;
    sp.user = &ci;
    sp.wait_for_room = true;
    r->prog.rows = (uint64_t)r->batch * (uint64_t)r->rows_per_img;
    r->prog.t0 = r->prog.last = cli_now();
    flexdiag_handle *h = NULL;
    flexdiag_status st = flexdiag_submit(r->c, &rq, &sp, &h);
    char msg[512] = ""; /* the failure's message: the submit's own, or the handle's */
    if (st != FLEXDIAG_OK) snprintf(msg, sizeof msg, "%s", cli_last_error());
    int64_t next = 0;
    double t_last = cli_now();
    int rc = 0, ended = st != FLEXDIAG_OK;
    while (!ended) {
        ended = flexdiag_handle_wait(h, 0.05) == FLEXDIAG_OK;
        if (g_signal) rc = -1; /* what is not with the writer yet is dropped (--resume) */
        rc = rc ? rc : flush_done(r, &ci, first, n, &next, &t_last);
        if (rc) flexdiag_handle_cancel(h); /* a signal, or the writer failed: stop */
    }
    flexdiag_handle_stats hs = {.struct_size = sizeof hs};
    if (h && flexdiag_handle_status(h, &st, &hs) == FLEXDIAG_OK) {
        r->passes += hs.passes;
        for (int k = 0; k < FLEXDIAG_MAX_DRAFT_LEN - 1; k++) r->accepted[k] += hs.accepted[k];
    }
    if (h) snprintf(msg, sizeof msg, "%s", flexdiag_handle_error(h));
    flexdiag_handle_release(h);
    free(texts), free(ids), free(lens), free(ci.tokens), free(ci.done);
    add_stats(r);
    if (rc) return rc;
    if (st == FLEXDIAG_ERR_CANCELLED && g_signal) return -1;
    if (st == FLEXDIAG_ERR_CANCELLED && gen_writer_failed(r->out)) return gen_writer_wait(r->out);
    if (st == FLEXDIAG_OK) return 0;
    return run_fail(r, st, msg);
}

/* Images [first, first + n): as one continuous request, or in blocks of --batch (--batching
 * blocks); all written when it returns: 0, -1 after a signal, or an exit code. */
static int run_range(gen_run *r, int64_t first, int64_t n) {
    int rc = 0;
    if (!r->o->blocks) {
        if (!r->t0) r->t0 = cli_now();
        rc = g_signal ? -1 : run_continuous(r, first, n);
        int wrc = gen_writer_wait(r->out);
        return rc ? rc : wrc;
    }
    for (int64_t b = first; !rc && b < first + n; b += r->batch) {
        if (g_signal) {
            rc = -1;
            break;
        }
        int32_t m = (int32_t)(first + n - b < r->batch ? first + n - b : r->batch);
        double t0 = cli_now();
        if (!r->t0) r->t0 = t0;
        rc = run_block(r, b, m);
        if (!rc && r->world->size == 1) gen_progress_block(&r->jp, r->made, m, cli_now() - t0);
    }
    int wrc = gen_writer_wait(r->out);
    return rc ? rc : wrc;
}

/* Take chunks until none is left; a failure or a signal here stops every rank after its
 * current chunk. */
static int run_chunks(gen_run *r) {
    int rc = 0;
    for (;;) {
        if (!rc && g_signal) rc = -1;
        int64_t c = job_dispatch_next(rc != 0, r->w.images_done, r->busy_s);
        if (c < 0) break;
        double t0 = cli_now();
        rc = run_range(r, r->chunk_first[c], r->chunk_len[c]);
        r->busy_s += cli_now() - t0;
    }
    r->finish_s = cli_now() - r->jp.t0;
    return rc;
}

/* Fields every results.jsonl record shares: model, policy (as c's runs resolve it), sampling. */
static int common_fields(gen_out *w, const gen_opts *o, const flexdiag_context *c) {
    flexdiag_policy_info pi = {.struct_size = sizeof pi};
    flexdiag_status st = flexdiag_context_policy(c, &pi);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    const char *model = o->mo.model ? o->mo.model : (o->mo.arch ? o->mo.arch : mp.arch);
    w->common = json_pack("{s:I, s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:I, s:f}",
                          "seed", (json_int_t)o->sample_seed, "model", model,
                          "policy", flexdiag_policy_name(pi.kind), "n_att", (int)pi.n_att,
                          "n_r", (int)pi.n_r, "sparsity", pi.sparsity,
                          "cfg_weight", o->cfg, "temperature", o->temperature,
                          "top_k", (json_int_t)o->top_k, "top_p", o->top_p);
    if (w->common && o->draft_len > 1) /* SJD: lossless, but another draw of each image */
        json_object_set_new(w->common, "draft_len", json_integer((json_int_t)o->draft_len));
    if (w->common && o->group > 0) /* GSD: lossy, another distribution of images */
        json_object_set_new(w->common, "sjd_group", json_integer((json_int_t)o->group));
    return w->common ? 0 : fail(1, "out of host memory");
}

/* Context params of the job (max_images = the block size r->batch). */
static void context_params(const gen_run *r, const flexdiag_policy_params *pp,
                           flexdiag_context_params *cp) {
    flexdiag_context_params_init(cp);
    cp->policy = *pp;
    cli_policy_calib(&r->o->po, cp);
    cp->max_images = r->batch;
    cp->micro_batch = (int32_t)r->o->micro_batch;
    cp->max_prompt_len = (int32_t)r->o->max_prompt_len;
    if (r->o->max_new_tokens > 0) cp->max_new_tokens = (int32_t)r->o->max_new_tokens;
    cp->text = r->o->max_new_tokens > 0; /* Lumina-mGPT continues text instead of drawing */
    cp->images_per_prompt = (int32_t)r->per; /* one copy of each prompt's KV rows */
    cp->batching = r->o->blocks;
    cp->draft_len = (int32_t)r->o->draft_len;
    cp->sjd_group = (int32_t)r->o->group;
    cli_kv_homes(CMD, &r->o->mo, cp);
}

/* Without --batch: the largest block that fits the device budget (auto), or 16 images on the
 * CPU engine, which has no budget unless --gpu-mem gives one. */
static const char *default_batch(flexdiag_runtime *rt) {
    uint64_t budget = 0;
    return flexdiag_runtime_budget(rt, &budget) == FLEXDIAG_OK && budget ? "auto" : "16";
}

/* An auto block of at most b images for a job of total: the job in as few blocks as b allows,
 * of equal size (512 images under a limit of 467 run as 2 x 256, not 467 and a slow 45). */
static int32_t balanced_block(int32_t b, int64_t total) {
    if (b >= total) return (int32_t)total;
    int64_t blocks = (total + b - 1) / b;
    return (int32_t)((total + blocks - 1) / blocks);
}

static int pick_batch(gen_run *r, flexdiag_runtime *rt, const flexdiag_policy_params *pp) {
    flexdiag_context_params cp;
    context_params(r, pp, &cp);
    const char *batch = r->o->batch ? r->o->batch : default_batch(rt);
    int32_t b = cli_batch(CMD, batch, r->m, &cp);
    if (b < 1) return 2;
    r->batch = (int32_t)(b < r->total ? b : r->total);
    if (!strcmp(batch, "auto") && r->o->blocks) r->batch = balanced_block(b, r->total);
    if (!strcmp(batch, "auto") && !r->quiet)
        fprintf(stderr, "flexdiag " CMD ": %s: %d %s fit the budget; %s of %d\n",
                r->o->batch ? "--batch auto" : "no --batch (the largest block that fits)", b,
                r->text ? "sequence(s)" : "image(s)", r->o->blocks ? "blocks" : "slots",
                r->batch);
    return 0;
}

/* Context, request template, buffers and the tokens.json temp file. */
static int prepare(gen_run *r, const flexdiag_policy_params *pp) {
    const gen_opts *o = r->o;
    flexdiag_context_params cp;
    context_params(r, pp, &cp);
    cp.progress = on_progress;
    cp.progress_user = &r->prog;
    flexdiag_status st = flexdiag_context_create(r->m, &cp, &r->c);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    atomic_store(&g_ctx, r->c);
    flexdiag_request_init(&r->rq);
    r->rq.n_prompts = 1;
    request_prompts(r, &r->rq, r->texts, r->ids, r->lens);
    r->rq.images_per_prompt = 1;
    r->rq.cfg_weight = (float)o->cfg;
    r->rq.temperature = (float)o->temperature;
    r->rq.top_k = (int32_t)o->top_k;
    r->rq.top_p = (float)o->top_p;
    r->rq.seed = (uint64_t)o->sample_seed;
    flexdiag_output q = {0};
    if ((st = flexdiag_generate(r->c, &r->rq, &q)) != FLEXDIAG_OK) return cli_fail(CMD, st);
    flexdiag_score_request sq; /* a size query: it reports the rows each image runs */
    flexdiag_score_request_init(&sq);
    flexdiag_score_output so = {.struct_size = sizeof so};
    if ((st = flexdiag_score(r->c, &sq, &so)) != FLEXDIAG_OK) return cli_fail(CMD, st);
    r->rows_per_img = so.rows;
    r->w.per_image = q.tokens_per_image;
    r->w.grid_w = 1;
    while ((r->w.grid_w + 1) * (r->w.grid_w + 1) <= q.tokens_per_image) r->w.grid_w++;
    if (r->w.grid_w * r->w.grid_w != q.tokens_per_image) r->w.grid_w = q.tokens_per_image;
    if ((st = flexdiag_model_image_size(r->m, &r->w.img_h, &r->w.img_w)) != FLEXDIAG_OK)
        return cli_fail(CMD, st);
    size_t tl = 0; /* a text model with a tokenizer: records carry the text */
    if (r->rows_per_img == 1 && flexdiag_detokenize(r->m, NULL, 0, true, NULL, 0, &tl) == FLEXDIAG_OK &&
        flexdiag_model_eos(r->m, &r->w.eos_id) == FLEXDIAG_OK)
        r->w.text_model = r->m;
    if (!r->w.img_h && !r->text && r->world->rank == 0)
        fprintf(stderr, "flexdiag " CMD ": note: the model has no image decoder; writing "
                        "tokens.json and results.jsonl only\n");
    if (r->text && !r->w.text_model && r->world->rank == 0)
        fprintf(stderr, "flexdiag " CMD ": note: the model has no tokenizer.json; tokens.json "
                        "holds the ids of each continuation, not its text\n");
    size_t px = (size_t)r->w.img_h * (size_t)r->w.img_w * 3, b = (size_t)r->batch;
    r->tokens = malloc(b * (size_t)r->w.per_image * sizeof *r->tokens);
    r->w.dpg_cells = malloc(px ? (size_t)r->per * px : 1);
    if (!r->tokens || !r->w.dpg_cells)
        return fail(1, "no host memory for a block of %d images (lower --batch)", r->batch);
    return common_fields(&r->w, r->o, r->c);
}

/* A text job's rates: tokens per second of the generation and end to end (texts are printed
 * and recorded, no PNG). */
static void summary_text(const gen_run *r) {
    const flexdiag_stats *s = &r->sum;
    double total = s->prefill_s + s->decode_s, wall = r->t0 ? r->end_s - r->t0 : 0;
    double toks = (double)s->tokens_generated;
    fprintf(stderr,
            "generated %lld text(s), %.0f token(s) (at most %d each) in %.2f s (prefill %.2f s, "
            "decode %.2f s): %.1f tok/s; KV %.2f MiB/sequence (policy %s); peak device %.2f GiB; "
            "results.jsonl and tokens.json in %s; end to end %.2f s, %.1f tok/s\n",
            (long long)r->w.images_done, toks, r->w.per_image, total, s->prefill_s,
            s->decode_s, total > 0 ? toks / total : 0.0, (double)s->kv_bytes_per_seq / (1 << 20),
            json_string_value(json_object_get(r->w.common, "policy")),
            (double)s->peak_device_bytes / (1 << 30), r->o->out, wall,
            wall > 0 ? toks / wall : 0.0);
}

/* SJD's line: decode passes per image, tokens a pass, and for each draft row the share of passes
 * that kept its draft (and every one before it). */
static void summary_sjd(const gen_run *r) {
    char group[48] = "", rows[FLEXDIAG_MAX_DRAFT_LEN * 8] = "";
    if (r->o->group > 0)
        snprintf(group, sizeof group, ", group %lld: lossy", (long long)r->o->group);
    size_t at = 0;
    for (int64_t k = 0; k + 1 < r->o->draft_len && at + 8 < sizeof rows; k++)
        at += (size_t)snprintf(rows + at, sizeof rows - at, " %.2f",
                               (double)r->accepted[k] / (double)r->passes);
    fprintf(stderr, "sjd: %.1f decode passes per image (%d tokens; window %lld%s), %.2f tokens "
                    "a pass; drafts kept by row:%s\n",
            (double)r->passes / (double)r->w.images_done, r->w.per_image,
            (long long)r->o->draft_len, group,
            (double)r->w.images_done * (r->w.per_image - 1) / (double)r->passes, rows);
}

/* The job's two rates: generation alone (prefill + decode steps) and end to end (from the first
 * block's start until the last file is written, image decoding and PNGs included). */
static void summary(const gen_run *r) {
    if (r->text) {
        summary_text(r);
        return;
    }
    const flexdiag_stats *s = &r->sum;
    double total = s->prefill_s + s->decode_s, wall = r->t0 ? r->end_s - r->t0 : 0;
    fprintf(stderr,
            "generated %lld image(s) x %d tokens in %.2f s (prefill %.2f s, decode %.2f s): "
            "%.1f tok/s, %.3f img/s; KV %.2f MiB/sequence (policy %s); peak device %.2f GiB; "
            "%lld PNG(s), results.jsonl and tokens.json in %s; end to end %.2f s, %.3f img/s\n",
            (long long)r->w.images_done, r->w.per_image, total, s->prefill_s, s->decode_s,
            total > 0 ? (double)s->tokens_generated / total : 0.0,
            total > 0 ? (double)r->w.images_done / total : 0.0,
            (double)s->kv_bytes_per_seq / (1 << 20),
            json_string_value(json_object_get(r->w.common, "policy")),
            (double)s->peak_device_bytes / (1 << 30), (long long)r->w.pngs, r->o->out, wall,
            wall > 0 ? (double)r->w.images_done / wall : 0.0);
    if (r->o->draft_len > 1 && r->passes && r->w.images_done)
        summary_sjd(r);
}

/* ---- the job's processes ---- */

/* results.jsonl and tokens.json in --out are files or absent (rank 0 checks): a folder in
 * their place was found only when the run wrote them, a --resume having replaced tokens.json
 * with an empty list by then. 0, or 1 after a message. */
static int record_paths_free(const gen_run *r) {
    static const char *const names[] = {"results.jsonl", "tokens.json"};
    for (int i = 0; r->world->rank == 0 && i < 2; i++) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", r->o->out, names[i]);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return fail(1, "--out %s: %s is a folder; generate keeps its records in a file of "
                           "that name: move it away (nothing was changed)",
                        r->o->out, path);
    }
    return 0;
}

/* Before the model loads, so that a bad folder fails fast: one process without --resume opens
 * results.jsonl itself; otherwise rank 0 prepares the folder (a --resume leaves it as it is). A
 * fresh run removes the part and temp record files and the PNG temp files an interrupted run
 * left (a resumed one removes the PNG temps when it gathers). */
static int setup_folder(gen_run *r) {
    const gen_opts *o = r->o;
    int rc = record_paths_free(r);
    if (rc) return job_agree(r->world, rc);
    if (!r->merge) {
        rc = gen_out_open(&r->w);
        if (!rc) gen_merge_clear(o->out);
        if (!rc) gen_out_drop_png_temps(o->out);
        return rc;
    }
    if (r->world->rank == 0 && o->resume && cli_mkdirs(o->out))
        rc = fail(1, "--out: cannot create folder '%s': %s", o->out, strerror(errno));
    else if (r->world->rank == 0 && !o->resume && !(rc = gen_out_reset(&r->w))) {
        gen_merge_clear(o->out);
        gen_out_drop_png_temps(o->out);
    }
    return job_agree(r->world, rc);
}

/* Cores for each of n ranks on this host: the online cores / n, at least 1, at most those
 * this process may run on. */
static int64_t cpu_share(int n) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    long mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
    long t = online / n;
    return t < 1 ? 1 : (t > mine ? mine : t);
}

/* This rank's GPU: its rank among the host's ranks, modulo the GPUs the host has (ranks share
 * GPUs when there are more of them). */
static int rank_device(const job_world *w) {
    int n = flexdiag_device_count();
    return w->mpi ? (n > 0 ? w->local_rank % n : w->local_rank) : 0;
}

/* Whether m continues text under the job's flags: a context of one image asked for the rows
 * each image runs (1: text; 2: an image with its unconditional row). The context keeps its KV
 * on the device (a KV split may need whole micro-batches a single image cannot give). 0 with
 * *text set, or an exit code after a message. */
static int model_is_text(const gen_run *r, const flexdiag_policy_params *pp, int *text) {
    flexdiag_context_params cp;
    context_params(r, pp, &cp);
    cp.max_images = 1;
    cp.micro_batch = 0;
    cp.images_per_prompt = 1;
    cp.kv_pct[0] = 100, cp.kv_pct[1] = cp.kv_pct[2] = 0;
    cp.cpu_attention = false;
    cp.cpu_attention_pct = 0;
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(r->m, &cp, &c);
    flexdiag_score_request sq;
    flexdiag_score_request_init(&sq);
    flexdiag_score_output so = {.struct_size = sizeof so};
    if (st == FLEXDIAG_OK) st = flexdiag_score(c, &sq, &so); /* a size query: so.rows */
    flexdiag_context_destroy(c);
    *text = so.rows == 1;
    return st == FLEXDIAG_OK ? 0 : cli_fail(CMD, st);
}

/* The job's images: --images-per-prompt of each prompt, by default 4 of an image and 1 of a
 * text (greedy decoding would repeat one text 4 times). 0, or an exit code after a message. */
static int count_images(gen_run *r, const flexdiag_policy_params *pp) {
    int rc = model_is_text(r, pp, &r->text);
    if (rc) return rc;
    r->per = r->o->per_prompt ? r->o->per_prompt : r->text ? 1 : 4;
    r->w.per_prompt = r->per;
    r->total = (int64_t)r->w.ps->n * r->per;
    if (r->total > INT32_MAX)
        return fail(2, "%d prompts x %lld images exceed %d images per run", r->w.ps->n,
                    (long long)r->per, INT32_MAX);
    return 0;
}

/* Runtime and model on this rank's device (or its share of the cores), the job's images and
 * the block size. */
static int open_model(gen_run *r, const flexdiag_policy_params *pp, flexdiag_runtime **rt) {
    cli_model_opts mo = r->o->mo;
    if (r->world->mpi && !mo.cpu) mo.device = rank_device(r->world);
    if (r->world->local_size > 1 && mo.cpu && mo.threads == 0)
        mo.threads = cpu_share(r->world->local_size);
    r->threads = (int)(mo.threads ? mo.threads
                                  : cpu_share(r->world->local_size > 1 ? r->world->local_size : 1));
    int rc = cli_open_model(CMD, &mo, rt, &r->m);
    if (!rc) rc = count_images(r, pp);
    if (!rc) rc = pick_batch(r, *rt, pp);
    return job_agree(r->world, rc);
}

/* --resume on rank 0: gather what earlier runs left (gen_merge.h) into r->done. */
static int resume_scan(gen_run *r) {
    int64_t n_done = 0;
    gen_out_drop_png_temps(r->o->out);
    int rc = gen_merge_folder(&r->w, r->total, r->done, &n_done);
    if (!rc && n_done == r->total)
        fprintf(stderr, "flexdiag " CMD ": --resume: all %lld image(s) are complete in %s; "
                        "nothing to make\n", (long long)r->total, r->o->out);
    else if (!rc)
        fprintf(stderr, "flexdiag " CMD ": --resume: %lld of %lld image(s) are complete in %s; "
                        "making the other %lld\n", (long long)n_done, (long long)r->total,
                r->o->out, (long long)(r->total - n_done));
    return rc;
}

/* Where this process's records go: a --resume's earlier records gathered first (rank 0, shared
 * with every rank), then its part files; one process without --resume already has
 * results.jsonl open. */
static int open_records(gen_run *r) {
    const job_world *w = r->world;
    r->done = calloc((size_t)(r->total ? r->total : 1), 1);
    int rc = r->done ? 0 : fail(1, "out of host memory");
    if (!rc && r->merge && r->o->resume && w->rank == 0) rc = resume_scan(r);
    if ((rc = job_agree(w, rc))) return rc;
    if (r->o->resume) job_bcast(w, r->done, (size_t)r->total);
    char path[4200];
    snprintf(path, sizeof path, "%s/results.jsonl", r->o->out);
    if (r->merge && w->rank > 0 && access(path, F_OK) != 0)
        rc = fail(1, "--out %s: rank %d on %s does not see the results.jsonl rank 0 made there; "
                     "every rank needs --out on a file system all hosts share (NFS, Lustre)",
                  r->o->out, w->rank, w->host);
    if (!rc && r->merge) rc = gen_out_open(&r->w);
    if (!rc) rc = gen_out_tokens_open(&r->w);
    return job_agree(w, rc);
}

/* The chunks: runs of images not done, cut every c images. */
static int make_chunks(gen_run *r, int64_t c) {
    r->chunk_first = malloc((size_t)(r->total ? r->total : 1) * sizeof *r->chunk_first);
    r->chunk_len = malloc((size_t)(r->total ? r->total : 1) * sizeof *r->chunk_len);
    if (!r->chunk_first || !r->chunk_len) return fail(1, "out of host memory");
    int64_t k = -1;
    for (int64_t g = 0; g < r->total; g++) {
        if (r->done[g]) continue;
        if (k < 0 || r->chunk_first[k] + r->chunk_len[k] != g || r->chunk_len[k] == c) {
            r->chunk_first[++k] = g;
            r->chunk_len[k] = 0;
        }
        r->chunk_len[k]++;
    }
    r->n_chunks = k + 1;
    return 0;
}

/* Chunk size (one process: unbounded; MPI: the smallest --batch, whole DPG prompts), chunks,
 * accounting. */
static int plan_chunks(gen_run *r) {
    const job_world *w = r->world;
    int64_t c = job_min(w, r->batch), per = r->per, kept = 0;
    if (w->size == 1) c = r->total;
    else if (r->o->layout == CLI_LAYOUT_DPG) c = (c + per - 1) / per * per;
    for (int64_t g = 0; g < r->total; g++) kept += r->done[g];
    int rc = make_chunks(r, c);
    if (!rc)
        rc = gen_progress_init(&r->jp, w->size, r->total, kept, r->total - kept, r->quiet,
                               r->text);
    r->ends = rc ? NULL : calloc((size_t)w->size, sizeof *r->ends);
    if (!rc && !r->ends) rc = fail(1, "out of host memory");
    return job_agree(w, rc);
}

/* Every rank at its chunks, from a common start. */
static int run_job(gen_run *r) {
    (void)job_agree(r->world, 0); /* the start line: accounting times count from here */
    r->jp.t0 = cli_now();
    job_dispatch_start(r->world, r->n_chunks, gen_progress_report, &r->jp);
    int rc = run_chunks(r);
    r->end_s = cli_now();
    job_dispatch_end();
    return rc;
}

/* Rank 0 after the ranks' last chunks: the part files merged; after a run that did not stop
 * early, every image must be complete. */
static int end_merge(gen_run *r, int code) {
    int64_t n_done = 0;
    int rc = gen_merge_folder(&r->w, r->total, r->done, &n_done);
    if (!rc && !code && n_done != r->total)
        rc = fail(1, "--out %s: %lld of %lld image(s) are complete after the merge (was a rank's "
                     "--out another folder?); generate --resume makes the rest",
                  r->o->out, (long long)n_done, (long long)r->total);
    return rc;
}

/* The job's end: accounts gathered, part files merged, the exit code every rank agrees on, and
 * rank 0's last lines. code: this process's exit code so far. */
static int finish_job(gen_run *r, int code) {
    const job_world *w = r->world;
    gen_rank_end me = {.images = (double)r->w.images_done, .busy_s = r->busy_s,
                       .finish_s = r->finish_s,
                       .device = r->o->mo.cpu ? -1 : rank_device(w)};
    snprintf(me.host, sizeof me.host, "%.*s", (int)sizeof me.host - 1, w->host);
    job_gather(w, &me, sizeof me, r->ends);
    int job = job_agree(w, code), mrc = r->merge && w->rank == 0 ? end_merge(r, job) : 0;
    job = job_agree(w, job > mrc ? job : mrc);
    double made = 0;
    for (int k = 0; k < w->size; k++) made += r->ends[k].images;
    if (w->rank == 0 && job >= 128)
        fprintf(stderr, "flexdiag " CMD ": interrupted after %.0f image(s); completed outputs "
                        "are in %s (generate --resume with the same flags makes the rest)\n",
                made, r->o->out);
    if (w->rank == 0 && !job && w->size == 1) summary(r);
    if (w->rank == 0 && (!job || job >= 128) && w->size > 1)
        gen_progress_summary(&r->jp, r->ends, r->o->out);
    return job;
}

/* The job, with SIGINT/SIGTERM caught from context creation to the final files. */
static int generate_job(gen_run *r, const flexdiag_policy_params *pp) {
    struct sigaction old[2];
    signals_install(old);
    r->texts = calloc((size_t)r->batch, sizeof *r->texts);
    r->ids = calloc((size_t)r->batch, sizeof *r->ids);
    r->lens = calloc((size_t)r->batch, sizeof *r->lens);
    r->prog.quiet = r->quiet || r->world->size > 1;
    int rc = r->texts && r->ids && r->lens ? prepare(r, pp) : fail(1, "out of host memory");
    if (!rc) rc = gen_writer_open(&r->out, &r->w, r->m, r->batch, r->threads);
    r->prog.out = r->out;
    rc = job_agree(r->world, rc);
    if (!rc) rc = open_records(r);
    if (!rc) rc = plan_chunks(r);
    int started = !rc;
    if (started) rc = run_job(r);
    signals_forget_context();
    gen_writer_close(r->out);
    r->out = NULL;
    r->prog.out = NULL;
    flexdiag_context_destroy(r->c);
    r->c = NULL;
    int rc2 = gen_out_tokens_close(&r->w);
    int code = rc == -1 ? 128 + (int)g_signal : (rc ? rc : rc2);
    if (started) code = finish_job(r, code);
    signals_restore(old);
    return code;
}

/* ---- flags ---- */

static int check_opts(gen_opts *o) {
    if (!o->out) return fail(2, "--out DIR is required");
    o->layout = CLI_LAYOUT_COUNT;
    for (int i = 0; i < CLI_LAYOUT_COUNT; i++)
        if (!strcmp(o->layout_name, cli_layout_names[i])) o->layout = (cli_layout)i;
    if (o->layout == CLI_LAYOUT_COUNT)
        return fail(2, "--layout: unknown layout '%s' (valid: plain, geneval, dpg)",
                    o->layout_name);
    int sources = !!o->prompt + !!o->prompts_file + !!o->prompt_ids + !!o->prompt_ids_file;
    if (sources > 1)
        return fail(2, "give one of --prompt, --prompts, --prompt-ids and --prompt-ids-file");
    if ((o->prompt_ids || o->prompt_ids_file) && strcmp(o->layout_name, "plain"))
        return fail(2, "--prompt-ids%s: token-id prompts take --layout plain (GenEval and DPG "
                       "read their prompt files)", o->prompt_ids ? "" : "-file");
    if (o->layout != CLI_LAYOUT_PLAIN && !o->prompts_file)
        return fail(2, "--layout %s reads its prompts from --prompts (%s)", o->layout_name,
                    o->layout == CLI_LAYOUT_GENEVAL ? "GenEval's evaluation_metadata.jsonl"
                                                : "a folder of <id>.txt, or <id><TAB><prompt>");
    if (o->batch && strcmp(o->batch, "auto") && cli_batch(CMD, o->batch, NULL, NULL) < 1)
        return 2;
    if (strcmp(o->batching, "continuous") && strcmp(o->batching, "blocks"))
        return fail(2, "--batching: unknown mode '%s' (valid: continuous, blocks)", o->batching);
    o->blocks = !strcmp(o->batching, "blocks");
    if (strcmp(o->decode, "sequential") && strcmp(o->decode, "sjd") && strcmp(o->decode, "gsd"))
        return fail(2, "--decode: unknown mode '%s' (valid: sequential, sjd, gsd)", o->decode);
    int gsd = !strcmp(o->decode, "gsd");
    if (o->group && !gsd)
        return fail(2, "--group %lld: grouped acceptance is --decode gsd's (lossy); --decode %s "
                       "takes no --group", (long long)o->group, o->decode);
    if (gsd && !o->group) o->group = DEFAULT_GROUP;
    if (!strcmp(o->decode, "sequential")) o->draft_len = 1;
    return cli_check_model(CMD, &o->mo);
}

int flexdiag_cmd_generate(int argc, char **argv) {
    gen_opts o = {.mo.seed = 1, .po = CLI_POLICY_OPTS_INIT, .batch = NULL,
                  .max_prompt_len = 128, .cfg = 5.0, .temperature = 1.0, .top_p = 1.0,
                  .layout_name = "plain", .batching = "continuous", .decode = "sequential",
                  .draft_len = DEFAULT_DRAFT};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&o.mo),
        CLI_POLICY_FLAGS(&o.po),
        {.name = "--prompt", CLI_STR, &o.prompt, "prompt text (default: \"" DEFAULT_PROMPT "\")"},
        {.name = "--prompts", CLI_STR, &o.prompts_file, "prompt file (one per line; see --layout)"},
        {.name = "--prompt-ids", CLI_STR, &o.prompt_ids,
         "a prompt as token ids, e.g. 1,2,3 (for a model without tokenizer.json): fed as given, "
         "BOS and template included"},
        {.name = "--prompt-ids-file", CLI_STR, &o.prompt_ids_file,
         "a file of token-id prompts, one comma-separated list a line"},
        {.name = "--images-per-prompt", CLI_INT, &o.per_prompt,
         "images (texts of a text model) per prompt (default 4; 1 for a text model)",
         CLI_INTS(1, 65536, NULL)},
        {.name = "--out", CLI_STR, &o.out, "output folder (created if missing)"},
        {.name = "--layout", CLI_STR, &o.layout_name,
         "plain (<prompt>/<sample>.png, default) | geneval (--prompts evaluation_metadata.jsonl)"
         " | dpg (--prompts folder of <id>.txt or <id>\\t<prompt> lines; <id>.png grids)"},
        {.name = "--batch", CLI_STR, &o.batch,
         "images generated together, or 'auto': the most that fit the device (--gpu-mem); "
         "default auto on a GPU, 16 on the CPU engine without --gpu-mem"},
        {.name = "--batching", CLI_STR, &o.batching,
         "continuous (default): a finished image's slot takes the next image at the next step; "
         "blocks: --batch images at a time in lock step, blocks evened over the job"},
        {.name = "--decode", CLI_STR, &o.decode,
         "sequential (default): one token a pass; sjd: speculative Jacobi decoding, up to "
         "--draft-len tokens a pass, lossless (the same distribution of images, other draws; "
         "greedy --top-k 1 gives sequential's tokens); gsd: SJD with grouped acceptance "
         "(--group; LOSSY: another distribution of images, fewer passes; never a default). "
         "Dense policy, KV on the device (docs/decoding.md)"},
        {.name = "--draft-len", CLI_INT, &o.draft_len,
         "with --decode sjd or gsd: tokens a sequence runs per pass, its last and the drafts "
         "(default " DEFAULT_DRAFT_S ")", CLI_INTS(2, 64, NULL)},
        {.name = "--group", CLI_INT, &o.group,
         "with --decode gsd (lossy): a draft is accepted against the probability of itself and "
         "its look-alikes (close VQ codebook vectors) among the codes the target ranks up to G "
         "places either side of it (default " DEFAULT_GROUP_S "; image models with a decoder)",
         CLI_INTS(1, 64, NULL)},
        {.name = "--micro-batch", CLI_INT, &o.micro_batch,
         "images per micro-batch (default: batch)",
         CLI_INTS(0, INT32_MAX, "0 = the whole block")},
        {.name = "--max-prompt-len", CLI_INT, &o.max_prompt_len,
         "prompt capacity in tokens (default 128)",
         CLI_INTS(2, 1 << 20, "BOS .. <begin_of_image>")},
        {.name = "--max-new-tokens", CLI_INT, &o.max_new_tokens,
         "text models (OPT, Llama; Lumina-mGPT as a text model): tokens generated per prompt "
         "(default 128); greedy: --top-k 1", CLI_INTS(0, 1 << 20, "0 = 128")},
        {.name = "--cfg", CLI_F64, &o.cfg,
         "classifier-free guidance weight (default 5.0; Lumina-mGPT's README uses 4.0)",
         CLI_NUMS(0, 100, 0, "0 = unconditional only, 1 = conditional only")},
        {.name = "--temperature", CLI_F64, &o.temperature, "sampling temperature (default 1.0)",
         CLI_NUMS(0, 100, 1, "0 is not greedy decoding: use --top-k 1")},
        {.name = "--top-k", CLI_INT, &o.top_k,
         "top-k sampling (default 0: off, for Lumina-mGPT images 2000; 1: greedy)",
         CLI_INTS(0, INT32_MAX, "0 = off")},
        {.name = "--top-p", CLI_F64, &o.top_p, "top-p sampling (default 1: off)",
         CLI_NUMS(0, 1, 1, "1 = off")},
        {.name = "--sample-seed", CLI_INT, &o.sample_seed, "sampling seed (default 0)",
         CLI_INTS(0, INT64_MAX, NULL)},
        {.name = "--quiet", CLI_FLAG, &o.quiet, "no progress lines"},
        {.name = "--resume", CLI_FLAG, &o.resume,
         "keep the complete images an earlier run of this job left in --out, make the rest "
         "(refused when --out holds another configuration's)"},
    };
    int rc = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_opts(&o))) return rc;
    flexdiag_policy_params pp;
    if (cli_policy_params(CMD, &o.po, &pp)) return 2;
    cli_prompts ps = {0};
    gen_run r = {.o = &o, .w = {.dir = o.out, .layout = o.layout, .ps = &ps}};
    if (o.prompt_ids || o.prompt_ids_file)
        rc = cli_prompts_load_ids(CMD, o.prompt_ids, o.prompt_ids_file, &ps);
    else
        rc = cli_prompts_load(CMD, o.layout, o.prompts_file,
                              o.prompt ? o.prompt : DEFAULT_PROMPT, &ps);
    job_world world = {.size = 1};
    if (!rc) rc = job_world_init(CMD, &world);
    r.world = &world;
    r.merge = o.resume || world.size > 1;
    r.quiet = o.quiet || world.rank > 0;
    snprintf(r.part, sizeof r.part, ".part-%d", world.rank);
    r.w.part = r.merge ? r.part : NULL;
    if (!rc) rc = setup_folder(&r);
    flexdiag_runtime *rt = NULL;
    if (!rc) rc = open_model(&r, &pp, &rt);
    if (!rc) rc = generate_job(&r, &pp);
    gen_out_free(&r.w);
    json_decref(r.w.common);
    free(r.w.dpg_cells);
    free(r.texts);
    free(r.ids);
    free(r.lens);
    free(r.tokens);
    free(r.done);
    free(r.chunk_first);
    free(r.chunk_len);
    free(r.ends);
    gen_progress_fini(&r.jp);
    flexdiag_model_destroy(r.m);
    flexdiag_runtime_destroy(rt);
    cli_prompts_free(&ps);
    job_world_fini(&world);
    return rc;
}
