/*
 * cmd_requests.c - `flexdiag-bench requests`: a stream of requests through a context's request
 * queue (the continuous engine), once per --batching mode, on one model in one process.
 *
 * The requests are a seeded mix: text models draw each request's prompt length and output
 * length uniformly from --prompt-len LO:HI and --gen-len LO:HI (the same list for every mode);
 * image models send one image per request with prompts of --prompt-len tokens. They arrive all
 * at once (--arrival-rate 0, an offline job) or as a Poisson stream of R requests per second,
 * each submitted at its arrival time. An untimed warm-up request first (GEMM plans, step
 * graphs). A row reports tokens/s (text) or images/s over the run (first submit to last end),
 * the steady-state rate (images finished after the first one ends and before the last request
 * is admitted, over that window: the rate with refill and without the ramp and the tail), and
 * per request the latency (submit to end), the queue time (submit to its first slot) and the
 * first-token time, each as p50 / p99. --batching blocks admits only into an empty engine (the
 * lock step: a wave runs until its longest sequence is done).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "bench/bench.h"
#include "cli/cli.h"
#include "cli/fileio.h"
#include "runtime/engine/engine.h"

#define CMD "requests"

typedef struct rq_opts {
    cli_model_opts mo;
    cli_policy_opts po;
    const char *batch, *batching, *prompt_len, *gen_len, *json;
    int64_t n_requests, mix_seed, micro;
    double rate;
} rq_opts;

/* One request of the mix and what came back. */
typedef struct rq_item {
    int32_t lp, gen;       /* prompt and output length */
    double arrive;         /* seconds after the start */
    flexdiag_handle *h;
    double done_at;        /* seconds after the start when it ended (its last image) */
    flexdiag_handle_stats st;
} rq_item;

typedef struct rq_run {
    rq_item *items;
    int32_t n;
    double t0;             /* the run's start (monotonic seconds) */
    double first_done;     /* the first image's end, seconds after t0 (-1: none yet) */
    int64_t images_done;   /* finished images */
    double *img_done_at;   /* (n) each finished image's time, in order of finishing */
} rq_run;

/* "LO:HI" or "N" (LO = HI) into lo, hi within [1, max]; 2 after a message. */
static int parse_range(const char *flag, const char *s, int32_t max, int32_t *lo, int32_t *hi) {
    char *end;
    long a = strtol(s, &end, 10), b = a;
    if (*end == ':') b = strtol(end + 1, &end, 10);
    if (*end || a < 1 || b < a || b > max)
        return cli_errorf(CMD, 2, "%s %s: expected N or LO:HI with 1 <= LO <= HI <= %d", flag, s,
                          max);
    *lo = (int32_t)a;
    *hi = (int32_t)b;
    return 0;
}

/* The mix: lengths uniform in the ranges, arrivals a Poisson stream (rate 0: all at 0). */
static void make_mix(rq_item *it, int32_t n, const int32_t lp[2], const int32_t gen[2],
                     double rate, uint64_t seed) {
    double t = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t a = flexdiag__rng64(seed, (uint64_t)i, 0), b = flexdiag__rng64(seed, (uint64_t)i, 1);
        it[i] = (rq_item){.lp = lp[0] + (int32_t)(a % (uint64_t)(lp[1] - lp[0] + 1)),
                          .gen = gen[0] + (int32_t)(b % (uint64_t)(gen[1] - gen[0] + 1))};
        if (rate > 0) t += -log(1.0 - flexdiag__rng_uniform(seed, (uint64_t)i, 2)) / rate;
        it[i].arrive = t;
    }
}

static void on_image(flexdiag_handle *h, int32_t index, const int32_t *tokens, int32_t n,
                     void *user) {
    rq_run *r = user;
    double now = flexdiag__now() - r->t0;
    (void)h, (void)index, (void)tokens, (void)n;
    if (r->first_done < 0) r->first_done = now;
    r->img_done_at[r->images_done++] = now;
}

/* Submit request i of the run (waiting for its arrival time); 0 or an exit code. */
static int submit_one(flexdiag_context *c, rq_run *r, int32_t i, int image) {
    rq_item *it = &r->items[i];
    double wait = it->arrive - (flexdiag__now() - r->t0);
    if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - floor(wait)) * 1e9)};
        nanosleep(&ts, NULL);
    }
    int32_t *p = bench_synthetic_prompt(c, it->lp, i);
    if (!p) return cli_errorf(CMD, 1, "out of host memory");
    const int32_t *pp[1] = {p};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompt_ids = pp;
    rq.prompt_lens = &it->lp;
    rq.seed = 5;
    rq.first_image = i;
    flexdiag_submit_params sp;
    flexdiag_submit_params_init(&sp);
    sp.on_image = on_image;
    sp.user = r;
    sp.wait_for_room = true;
    sp.max_new_tokens = image ? 0 : it->gen;
    flexdiag_status st = flexdiag_submit(c, &rq, &sp, &it->h);
    free(p);
    return st == FLEXDIAG_OK ? 0 : cli_fail(CMD, st);
}

/* The whole stream on c: submit each request at its time, then wait for all; 0 or an exit
 * code. */
static int run_stream(flexdiag_context *c, rq_run *r, int image) {
    r->t0 = flexdiag__now();
    r->first_done = -1;
    r->images_done = 0;
    for (int32_t i = 0; i < r->n; i++) {
        int rc = submit_one(c, r, i, image);
        if (rc) return rc;
    }
    int rc = 0;
    for (int32_t i = 0; i < r->n; i++) {
        rq_item *it = &r->items[i];
        flexdiag_status st;
        (void)flexdiag_handle_wait(it->h, -1);
        it->st.struct_size = sizeof it->st;
        (void)flexdiag_handle_status(it->h, &st, &it->st);
        if (st != FLEXDIAG_OK && !rc)
            rc = cli_errorf(CMD, 1, "request %d: %s", i, flexdiag_handle_error(it->h));
        it->done_at = it->arrive + it->st.total_s;
        flexdiag_handle_release(it->h);
        it->h = NULL;
    }
    return rc;
}

static int cmp_f64(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of n values at v, with field f of each item. */
static double quantile(const rq_item *it, int32_t n, size_t off, double q, double *tmp) {
    for (int32_t i = 0; i < n; i++) tmp[i] = *(const double *)((const char *)&it[i] + off);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_f64);
    int32_t k = (int32_t)ceil(q * n) - 1;
    return tmp[k < 0 ? 0 : k];
}

typedef struct rq_row {
    const char *mode;
    int32_t slots;
    double wall, tok_s, img_s, steady_img_s;
    double lat[2], queue[2], first[2]; /* p50, p99 */
    uint64_t tokens;
} rq_row;

/* The row of a finished run. */
static void summarize(const rq_run *r, rq_row *row, double *tmp) {
    double end = 0, last_admit = 0;
    row->tokens = 0;
    for (int32_t i = 0; i < r->n; i++) {
        const rq_item *it = &r->items[i];
        end = fmax(end, it->done_at);
        last_admit = fmax(last_admit, it->arrive + it->st.queue_s);
        row->tokens += it->st.tokens;
    }
    row->wall = end;
    row->tok_s = end > 0 ? (double)row->tokens / end : 0;
    row->img_s = end > 0 ? (double)r->images_done / end : 0;
    int64_t k = 0; /* images finished in the steady window (first end, last admission] */
    for (int64_t i = 0; i < r->images_done; i++)
        k += r->img_done_at[i] > r->first_done && r->img_done_at[i] <= last_admit;
    row->steady_img_s = last_admit > r->first_done ? (double)k / (last_admit - r->first_done) : 0;
    size_t fields[3] = {offsetof(rq_item, st.total_s), offsetof(rq_item, st.queue_s),
                        offsetof(rq_item, st.first_token_s)};
    double *dst[3] = {row->lat, row->queue, row->first};
    for (int f = 0; f < 3; f++) {
        dst[f][0] = quantile(r->items, r->n, fields[f], 0.50, tmp);
        dst[f][1] = quantile(r->items, r->n, fields[f], 0.99, tmp);
    }
}

static void print_row(const rq_row *w) {
    printf("| %s | %d | %.2f | %.1f | %.3f | %.3f | %.3f / %.3f | %.3f / %.3f | %.3f / %.3f |\n",
           w->mode, w->slots, w->wall, w->tok_s, w->img_s, w->steady_img_s, w->lat[0], w->lat[1],
           w->queue[0], w->queue[1], w->first[0], w->first[1]);
    fflush(stdout);
}

static int append_json(cli_jsonl *j, const rq_opts *o, const flexdiag_model *m, const rq_row *w,
                       int32_t n) {
    if (!j) return 0;
    char dev[128];
    bench_device_name(m->rt, dev, sizeof dev);
    for (char *q = dev; *q; q++)
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20) *q = ' ';
    char line[2048];
    int len = snprintf(line, sizeof line,
                       "{\"command\":\"requests\",\"device\":\"%s\",\"arch\":\"%s\","
                       "\"batching\":\"%s\",\"slots\":%d,\"requests\":%d,\"prompt_len\":\"%s\","
                       "\"gen_len\":\"%s\",\"arrival_rate\":%.4f,\"mix_seed\":%lld,"
                       "\"wall_s\":%.4f,\"tokens\":%llu,\"tok_per_s\":%.2f,\"img_per_s\":%.4f,"
                       "\"steady_img_per_s\":%.4f,\"latency_p50_s\":%.4f,\"latency_p99_s\":%.4f,"
                       "\"queue_p50_s\":%.4f,\"queue_p99_s\":%.4f,\"first_token_p50_s\":%.4f,"
                       "\"first_token_p99_s\":%.4f}\n",
                       dev, m->cfg.name, w->mode, w->slots, n, o->prompt_len, o->gen_len,
                       o->rate, (long long)o->mix_seed, w->wall, (unsigned long long)w->tokens,
                       w->tok_s, w->img_s, w->steady_img_s, w->lat[0], w->lat[1], w->queue[0],
                       w->queue[1], w->first[0], w->first[1]);
    if (len > 0 && (size_t)len < sizeof line && cli_jsonl_append(j, line, (size_t)len) == FLEXDIAG_OK)
        return 0;
    return cli_errorf(CMD, 1, "--json: %s", cli_io_error());
}

/* One mode's context: the largest batch (--batch) for the longest request, every request in the
 * queue. */
static int open_context(const rq_opts *o, flexdiag_model *m, int blocks, int32_t max_lp,
                        int32_t max_gen, int image, flexdiag_context **c, int32_t *slots) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_prompt_len = max_lp;
    if (!image) cp.max_new_tokens = max_gen;
    cp.micro_batch = (int32_t)o->micro;
    cp.batching = blocks;
    cp.queue_images = (int32_t)o->n_requests + 1;
    cli_kv_homes(CMD, &o->mo, &cp);
    if (cli_policy_params(CMD, &o->po, &cp.policy)) return 2;
    cli_policy_calib(&o->po, &cp);
    uint64_t budget = 0; /* without --batch: auto where there is a budget, else 16 (generate's) */
    const char *batch = o->batch ? o->batch
                        : flexdiag_runtime_budget(m->rt, &budget) == FLEXDIAG_OK && budget ? "auto"
                                                                                          : "16";
    int32_t b = cli_batch(CMD, batch, m, &cp);
    if (b < 1) return 2;
    cp.max_images = *slots = b;
    flexdiag_status st = flexdiag_context_create(m, &cp, c);
    return st == FLEXDIAG_OK ? 0 : cli_fail(CMD, st);
}

/* One row: the warm-up request, then the stream, on a context in the given mode. */
static int run_mode(const rq_opts *o, flexdiag_model *m, int blocks, rq_run *r, int32_t max_lp,
                    int32_t max_gen, int image, cli_jsonl *json, double *tmp) {
    flexdiag_context *c = NULL;
    rq_row row = {.mode = blocks ? "blocks" : "continuous"};
    int rc = open_context(o, m, blocks, max_lp, max_gen, image, &c, &row.slots);
    rq_item warm = {.lp = max_lp, .gen = max_gen < 4 ? max_gen : 4};
    rq_run w = {.items = &warm, .n = 1, .img_done_at = r->img_done_at};
    if (!rc) rc = run_stream(c, &w, image); /* untimed */
    if (!rc) rc = run_stream(c, r, image);
    flexdiag_context_destroy(c);
    if (rc) return rc;
    summarize(r, &row, tmp);
    print_row(&row);
    return append_json(json, o, m, &row, r->n);
}

static int run_all(const rq_opts *o, flexdiag_model *m, cli_jsonl *json) {
    int image = m->cfg.arch == FLEXDIAG_ARCH_JANUS || m->cfg.arch == FLEXDIAG_ARCH_CHAMELEON;
    int32_t lp[2] = {0, 0}, gen[2] = {0, 0};
    if (parse_range("--prompt-len", o->prompt_len, 1 << 16, &lp[0], &lp[1]) ||
        parse_range("--gen-len", o->gen_len, 1 << 16, &gen[0], &gen[1]))
        return 2;
    int32_t n = (int32_t)o->n_requests;
    rq_run r = {.items = calloc((size_t)n, sizeof *r.items), .n = n,
                .img_done_at = calloc((size_t)n + 1, sizeof(double))};
    double *tmp = calloc((size_t)n, sizeof *tmp);
    if (!r.items || !r.img_done_at || !tmp) return cli_errorf(CMD, 1, "out of host memory");
    make_mix(r.items, n, lp, gen, o->rate, (uint64_t)o->mix_seed);
    char dev[128];
    bench_device_name(m->rt, dev, sizeof dev);
    printf("flexdiag-bench requests: %s (%s), model %s (random weights), %d requests, prompt %s, "
           "%s %s, arrivals %s\n\n",
           m->rt->k->name, dev, m->cfg.name, n, o->prompt_len, image ? "images, 1 per request"
                                                                     : "output",
           image ? "" : o->gen_len, o->rate > 0 ? "Poisson" : "all at once");
    const char *per = image ? "img/s" : "req/s"; /* a text request is one sequence */
    printf("| batching | slots | wall s | tok/s | %s | steady %s | latency p50/p99 s | "
           "queue p50/p99 s | first token p50/p99 s |\n|---|---|---|---|---|---|---|---|---|\n",
           per, per);
    int rc = 0;
    const char *modes = o->batching;
    for (int blocks = 0; !rc && blocks < 2; blocks++)
        if (strstr(modes, blocks ? "blocks" : "continuous"))
            rc = run_mode(o, m, blocks, &r, lp[1], gen[1], image, json, tmp);
    free(r.items);
    free(r.img_done_at);
    free(tmp);
    return rc;
}

int flexdiag_cmd_requests(int argc, char **argv) {
    rq_opts o = {.mo.seed = 1, .po = CLI_POLICY_OPTS_INIT,
                 .batching = "continuous,blocks", .prompt_len = "16:512", .gen_len = "8:256",
                 .n_requests = 200, .mix_seed = 1};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&o.mo),
        CLI_POLICY_FLAGS(&o.po),
        {.name = "--batch", CLI_STR, &o.batch,
         "slots: a number, or auto (the most that fit; the default on a GPU, 16 on the CPU "
         "engine without --gpu-mem)"},
        {.name = "--micro-batch", CLI_INT, &o.micro, "images per micro-batch (default: the batch)",
         CLI_INTS(0, INT32_MAX, "0 = the batch")},
        {.name = "--batching", CLI_STR, &o.batching,
         "comma list of continuous, blocks (default both: one row each)"},
        {.name = "--requests", CLI_INT, &o.n_requests, "requests in the mix (default 200)",
         CLI_INTS(1, 1 << 20, NULL)},
        {.name = "--prompt-len", CLI_STR, &o.prompt_len,
         "prompt tokens of a request: N or LO:HI, drawn uniformly (default 16:512)"},
        {.name = "--gen-len", CLI_STR, &o.gen_len,
         "text: tokens a request makes, N or LO:HI, drawn uniformly (default 8:256)"},
        {.name = "--mix-seed", CLI_INT, &o.mix_seed, "seed of the mix (default 1)"},
        {.name = "--arrival-rate", CLI_F64, &o.rate,
         "requests per second of a Poisson stream (default 0: all at once)",
         CLI_NUMS(0, 1e9, 0, "0 = all at once")},
        {.name = "--json", CLI_STR, &o.json, "append one JSON line per row to FILE"},
    };
    int rc = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if (cli_check_model(CMD, &o.mo)) return 2;
    if (!strstr(o.batching, "continuous") && !strstr(o.batching, "blocks"))
        return cli_errorf(CMD, 2, "--batching %s: give continuous, blocks or both", o.batching);
    cli_jsonl json = {0}; /* opened before the model loads: a bad path fails at once */
    if (o.json && cli_jsonl_open(&json, o.json, 0) != FLEXDIAG_OK)
        return cli_errorf(CMD, 1, "--json: %s", cli_io_error());
    flexdiag_runtime *rt = NULL;
    flexdiag_model *m = NULL;
    rc = cli_open_model(CMD, &o.mo, &rt, &m);
    if (!rc) rc = run_all(&o, m, o.json ? &json : NULL);
    if (o.json) (void)cli_jsonl_close(&json);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return rc;
}
