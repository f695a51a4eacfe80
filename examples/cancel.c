/*
 * cancel.c - three ways to stop a generation that is running, and the context working on
 * afterwards.
 *
 *   cc examples/cancel.c $(pkg-config --cflags --libs flexdiag) -pthread -o cancel
 *   ./cancel [ARCH]      # a built-in shape, tiny-janus by default
 *
 *   1. the progress callback returns false: every request of the context stops;
 *   2. another thread calls flexdiag_context_cancel while flexdiag_generate runs;
 *   3. one request of the queue: flexdiag_handle_cancel on its handle stops it alone, the
 *      request beside it finishes.
 * A stopped request ends with FLEXDIAG_ERR_CANCELLED at its next step boundary (a decode step
 * of a few milliseconds here); the context keeps its memory and takes the next request. The
 * images have more decode steps (tiny-janus: 576) than the STOP_AT and 10 steps waited for.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <flexdiag.h>

#define SLOTS 2    /* images the context generates together */
#define STOP_AT 30 /* decode step at which the callback says stop (part 1) */

static void check(flexdiag_status st, const char *what) {
    if (st == FLEXDIAG_OK) return;
    fprintf(stderr, "%s: %s: %s\n", what, flexdiag_status_str(st), flexdiag_last_error(NULL));
    exit(1);
}

static void expect(flexdiag_status got, flexdiag_status want, const char *what) {
    printf("%-46s %s\n", what, flexdiag_status_str(got));
    if (got == want) return;
    fprintf(stderr, "%s: expected %s\n", what, flexdiag_status_str(want));
    exit(1);
}

/* What the progress callback sees; it runs on the context's engine thread. */
typedef struct progress {
    atomic_int stop;      /* 1: return false at STOP_AT (part 1) */
    atomic_ullong step;   /* the last decode step reported */
} progress;

static bool on_progress(int phase, uint64_t done, uint64_t total, void *user) {
    progress *p = user;
    (void)total;
    if (phase != 1) return true; /* prefill */
    atomic_store(&p->step, done);
    return !(atomic_load(&p->stop) && done >= STOP_AT);
}

/* A request for n images of one prompt (the prompt string must outlive the call). */
static flexdiag_request request(int32_t n, uint64_t seed) {
    static const char *const prompts[] = {"a boat on a lake"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = prompts;
    rq.images_per_prompt = n;
    rq.seed = seed;
    return rq;
}

/* flexdiag_generate of SLOTS images into a buffer sized by a first, size-only call. */
static flexdiag_status generate(flexdiag_context *ctx, uint64_t seed) {
    flexdiag_request rq = request(SLOTS, seed);
    flexdiag_output out = {0};
    check(flexdiag_generate(ctx, &rq, &out), "flexdiag_generate (sizes)");
    out.tokens = malloc(sizeof(int32_t) * out.n_images * out.tokens_per_image);
    if (!out.tokens) return FLEXDIAG_ERR_OOM_HOST;
    flexdiag_status st = flexdiag_generate(ctx, &rq, &out);
    free(out.tokens);
    return st;
}

/* Part 2's other thread: wait until decoding is under way (or the run over), then cancel the
 * context. */
typedef struct canceller {
    flexdiag_context *ctx;
    progress *p;
    atomic_int done; /* the generate call returned */
} canceller;

static void *cancel_soon(void *arg) {
    canceller *c = arg;
    const struct timespec ms = {0, 1000000};
    while (atomic_load(&c->p->step) < 10 && !atomic_load(&c->done)) nanosleep(&ms, NULL);
    check(flexdiag_context_cancel(c->ctx), "flexdiag_context_cancel");
    return NULL;
}

/* Part 3: two queued requests, the second cancelled by its handle. */
static void cancel_one_request(flexdiag_context *ctx) {
    flexdiag_request keep = request(SLOTS, 7), drop = request(SLOTS, 8);
    flexdiag_handle *hk = NULL, *hd = NULL;
    check(flexdiag_submit(ctx, &keep, NULL, &hk), "flexdiag_submit");
    check(flexdiag_submit(ctx, &drop, NULL, &hd), "flexdiag_submit");
    check(flexdiag_handle_cancel(hd), "flexdiag_handle_cancel");
    check(flexdiag_handle_wait(hd, -1), "flexdiag_handle_wait");
    check(flexdiag_handle_wait(hk, -1), "flexdiag_handle_wait");
    flexdiag_status st_keep, st_drop;
    check(flexdiag_handle_status(hk, &st_keep, NULL), "flexdiag_handle_status");
    check(flexdiag_handle_status(hd, &st_drop, NULL), "flexdiag_handle_status");
    printf("(the cancelled request says: \"%s\")\n", flexdiag_handle_error(hd));
    flexdiag_handle_release(hk);
    flexdiag_handle_release(hd);
    expect(st_drop, FLEXDIAG_ERR_CANCELLED, "3. flexdiag_handle_cancel: that request");
    expect(st_keep, FLEXDIAG_OK, "3. flexdiag_handle_cancel: the other request");
}

int main(int argc, char **argv) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1; /* the CPU engine: slow enough to be caught mid-run */
    rp.threads = 2;
    flexdiag_runtime *rt = NULL;
    check(flexdiag_runtime_create(&rp, &rt), "flexdiag_runtime_create");
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = argc > 1 ? argv[1] : "tiny-janus";
    flexdiag_model *model = NULL;
    check(flexdiag_model_load(rt, NULL, &mp, &model), "flexdiag_model_load");

    static progress prog;
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = SLOTS;
    cp.progress = on_progress;
    cp.progress_user = &prog;
    flexdiag_context *ctx = NULL;
    check(flexdiag_context_create(model, &cp, &ctx), "flexdiag_context_create");

    /* 1. the callback stops the run at STOP_AT */
    atomic_store(&prog.stop, 1);
    expect(generate(ctx, 1), FLEXDIAG_ERR_CANCELLED, "1. progress callback returns false");
    atomic_store(&prog.stop, 0);

    /* 2. another thread cancels the context once step 10 is reported */
    atomic_store(&prog.step, 0);
    static canceller c;
    c.ctx = ctx;
    c.p = &prog;
    pthread_t t;
    if (pthread_create(&t, NULL, cancel_soon, &c) != 0) return 1;
    flexdiag_status st = generate(ctx, 2);
    atomic_store(&c.done, 1);
    pthread_join(t, NULL);
    expect(st, FLEXDIAG_ERR_CANCELLED, "2. flexdiag_context_cancel from a thread");

    cancel_one_request(ctx);

    /* the context takes new requests after all that */
    expect(generate(ctx, 3), FLEXDIAG_OK, "afterwards: a whole generation");
    flexdiag_context_destroy(ctx);
    flexdiag_model_destroy(model);
    flexdiag_runtime_destroy(rt);
    return 0;
}
