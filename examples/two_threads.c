/*
 * two_threads.c - two contexts of one model generating at the same time on two threads, and
 * the images they draw equal to the same requests run one after the other on one thread.
 *
 *   cc examples/two_threads.c $(pkg-config --cflags --libs flexdiag) -pthread -o two_threads
 *   ./two_threads [ARCH]      # a built-in shape, tiny-janus by default
 *
 * What may run in parallel (include/flexdiag.h, "Threads"): calls on different contexts, also
 * contexts of one runtime and one model; one context runs one thing at a time. The model is
 * loaded once and shared read-only. Sampling is keyed by (seed, image index, step), so an
 * image depends on its request only, not on which context or thread made it, nor on what ran
 * beside it: the check below is exact, token for token.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flexdiag.h>

#define N_IMAGES 2 /* per request */

static void check(flexdiag_status st, const char *what) {
    if (st == FLEXDIAG_OK) return;
    fprintf(stderr, "%s: %s: %s\n", what, flexdiag_status_str(st), flexdiag_last_error(NULL));
    exit(1);
}

/* One thread's work: a context, the request it runs and the tokens it gets. */
typedef struct job {
    flexdiag_context *ctx;
    uint64_t seed;
    int32_t *tokens; /* (N_IMAGES, tokens per image), malloc'd by run_job */
    size_t bytes;
    flexdiag_status st;
} job;

static void run_job(job *j) {
    static const char *const prompts[] = {"a lighthouse at night"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = prompts;
    rq.images_per_prompt = N_IMAGES;
    rq.seed = j->seed;
    flexdiag_output out = {0}; /* no token buffer: the sizes only */
    j->st = flexdiag_generate(j->ctx, &rq, &out);
    if (j->st != FLEXDIAG_OK) return;
    j->bytes = sizeof(int32_t) * out.n_images * out.tokens_per_image;
    out.tokens = j->tokens = malloc(j->bytes);
    j->st = out.tokens ? flexdiag_generate(j->ctx, &rq, &out) : FLEXDIAG_ERR_OOM_HOST;
}

/* pthread entry: the status comes back in the job (error messages are per thread, so the
 * thread that failed prints its own). */
static void *thread_main(void *arg) {
    job *j = arg;
    run_job(j);
    if (j->st != FLEXDIAG_OK) fprintf(stderr, "seed %llu: %s\n", (unsigned long long)j->seed,
                                      flexdiag_last_error(NULL));
    return NULL;
}

static flexdiag_context *make_context(flexdiag_model *model) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = N_IMAGES;
    flexdiag_context *ctx = NULL;
    check(flexdiag_context_create(model, &cp, &ctx), "flexdiag_context_create");
    return ctx;
}

int main(int argc, char **argv) {
    /* the CPU engine, one worker per context: the two contexts fit two cores */
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = 1;
    flexdiag_runtime *rt = NULL;
    check(flexdiag_runtime_create(&rp, &rt), "flexdiag_runtime_create");
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = argc > 1 ? argv[1] : "tiny-janus";
    flexdiag_model *model = NULL;
    check(flexdiag_model_load(rt, NULL, &mp, &model), "flexdiag_model_load");
    flexdiag_context *a = make_context(model), *b = make_context(model);

    /* the reference: both requests, one after the other, on this thread and context a */
    static job ref[2], par[2];
    for (int i = 0; i < 2; i++) {
        ref[i] = (job){.ctx = a, .seed = 100 + i};
        run_job(&ref[i]);
        check(ref[i].st, "flexdiag_generate (one thread)");
    }

    /* the same requests at once: request 0 on context a, request 1 on context b */
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        par[i] = (job){.ctx = i ? b : a, .seed = 100 + i};
        if (pthread_create(&t[i], NULL, thread_main, &par[i]) != 0) return 1;
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);

    int bad = 0;
    for (int i = 0; i < 2; i++) {
        if (par[i].st != FLEXDIAG_OK) {
            bad = 1;
            continue;
        }
        int same = par[i].bytes == ref[i].bytes &&
                   !memcmp(par[i].tokens, ref[i].tokens, ref[i].bytes);
        printf("seed %d: %d images on thread %d %s the one-thread run\n", 100 + i, N_IMAGES, i,
               same ? "equal" : "DIFFER FROM");
        bad |= !same;
    }
    for (int i = 0; i < 2; i++) {
        free(ref[i].tokens);
        free(par[i].tokens);
    }
    flexdiag_context_destroy(a);
    flexdiag_context_destroy(b);
    flexdiag_model_destroy(model);
    flexdiag_runtime_destroy(rt);
    return bad;
}
