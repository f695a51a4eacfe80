/*
 * concurrency.c - see concurrency.h. Only the public API (include/flexdiag.h) is used: this is
 * what an embedding program that follows the header's threading rules may do.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/concurrency.h"
#include "flexdiag.h"

#define N_JOBS 3

typedef struct job {
    flexdiag_context *c;     /* the job's own context */
    const char *prompts[2];  /* two prompts, images_per_prompt each */
    int32_t images_per_prompt;
    uint64_t seed;           /* sampling seed */
    int32_t *tokens;         /* out (n_images, tokens_per_image) */
    size_t n_tokens;         /* entries of tokens */
    flexdiag_status st;      /* result of the last run */
    char err[256];           /* its message */
} job;

/* One generate call of j on its context (the calling thread's error buffer is per thread). */
static void *job_run(void *arg) {
    job *j = arg;
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 2;
    rq.prompts = j->prompts;
    rq.images_per_prompt = j->images_per_prompt;
    rq.seed = j->seed;
    flexdiag_output out = {0};
    out.tokens = j->tokens;
    memset(j->tokens, 0xff, j->n_tokens * sizeof *j->tokens);
    j->st = flexdiag_generate(j->c, &rq, &out);
    snprintf(j->err, sizeof j->err, "%s", flexdiag_last_error(NULL));
    return NULL;
}

/* Context i: a different policy, batch and micro-batch for each job. */
static void job_open(flexdiag_model *m, int i, job *j) {
    static const flexdiag_policy_kind kinds[N_JOBS] = {
        FLEXDIAG_POLICY_DENSE, FLEXDIAG_POLICY_DIAGONAL, FLEXDIAG_POLICY_H2O};
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2 + i;
    cp.micro_batch = i == 2 ? 2 : 0;
    cp.max_prompt_len = 32;
    cp.policy.kind = kinds[i];
    cp.policy.sparsity = 0.75;
    assert_int_equal(flexdiag_context_create(m, &cp, &j->c), FLEXDIAG_OK);
    j->prompts[0] = i == 1 ? "a red apple" : "p0";
    j->prompts[1] = i == 2 ? "  two spaces  " : "a longer prompt";
    j->images_per_prompt = 2 + i;
    j->seed = 100 + (uint64_t)i;
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 2;
    rq.prompts = j->prompts;
    rq.images_per_prompt = j->images_per_prompt;
    flexdiag_output out = {0};
    assert_int_equal(flexdiag_generate(j->c, &rq, &out), FLEXDIAG_OK); /* size query */
    j->n_tokens = (size_t)out.n_images * (size_t)out.tokens_per_image;
    j->tokens = malloc(j->n_tokens * sizeof *j->tokens);
    assert_non_null(j->tokens);
}

int tc_run_concurrency(int device, int threads, int rounds, const uint32_t weights_pct[3],
                       const char *offload_dir) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = device;
    rp.threads = threads;
    rp.offload_dir = offload_dir;
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    mp.seed = 5;
    if (weights_pct) memcpy(mp.weights_pct, weights_pct, sizeof mp.weights_pct);
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);
    job jobs[N_JOBS];
    memset(jobs, 0, sizeof jobs);
    int32_t *ref[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) { /* the sequential reference, one job after another */
        job_open(m, i, &jobs[i]);
        job_run(&jobs[i]);
        assert_int_equal(jobs[i].st, FLEXDIAG_OK);
        ref[i] = malloc(jobs[i].n_tokens * sizeof *ref[i]);
        memcpy(ref[i], jobs[i].tokens, jobs[i].n_tokens * sizeof *ref[i]);
    }
    for (int round = 0; round < rounds; round++) {
        pthread_t th[N_JOBS];
        for (int i = 0; i < N_JOBS; i++)
            assert_int_equal(pthread_create(&th[i], NULL, job_run, &jobs[i]), 0);
        for (int i = 0; i < N_JOBS; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < N_JOBS; i++) {
            if (jobs[i].st != FLEXDIAG_OK)
                fail_msg("round %d, context %d: %s (%s)", round, i,
                         flexdiag_status_str(jobs[i].st), jobs[i].err);
            size_t bad = 0;
            for (size_t e = 0; e < jobs[i].n_tokens; e++) bad += jobs[i].tokens[e] != ref[i][e];
            if (bad)
                fail_msg("round %d, context %d: %zu of %zu tokens differ from the sequential run",
                         round, i, bad, jobs[i].n_tokens);
        }
    }
    for (int i = 0; i < N_JOBS; i++) {
        flexdiag_context_destroy(jobs[i].c);
        free(jobs[i].tokens);
        free(ref[i]);
    }
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return 0;
}
