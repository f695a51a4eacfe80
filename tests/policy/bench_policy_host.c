/*
 * bench_policy_host.c - manual timing of the host KV-policy state machines as the engine drives
 * them (not a test; run by hand: <build>/tests/policy/bench_policy_host [threads]).
 *
 * Shape: Janus-Pro-7B at 32 images (64 sequences with CFG rows), 30 layers, 32 KV heads, 576
 * decode steps, 95% sparsity (N_att 29). Per policy (h2o, tova, alisa, and Diagonal on the host,
 * as the engine runs it for groups above the backend's diag_max_group)
 * every step plans all layers and, when the policy needs scores, updates them from fixed random
 * probabilities (Diagonal: logits), one layer per task on a CPU pool of the given size (default
 * all cores), as runtime/engine.c does. Prints plan and update milliseconds per step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/thread_pool.h"
#include "policy/kv_policy.h"

#define L_DEC 576

typedef struct job {
    flexdiag_kvp *kvp;
    const flexdiag_kvp_params *p;
    int32_t t, ms, diag;
    int32_t *ws, *slots, *ns;
    const float *scores;
} job;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void plan_task(void *ctx, int64_t j, void *scratch) {
    const job *b = ctx;
    (void)scratch;
    size_t li = (size_t)j * (size_t)b->p->n_seq * (size_t)b->p->h_kv;
    flexdiag__kvp_plan(b->kvp, (int32_t)j, b->t, 0, b->p->n_seq, b->ws + li,
                       b->slots + li * (size_t)b->ms, b->ns + li);
}

static void update_task(void *ctx, int64_t j, void *scratch) {
    const job *b = ctx;
    (void)scratch;
    const float *sc = b->scores + (size_t)j * (size_t)b->p->n_seq * (size_t)b->p->h_q *
                                      (size_t)b->ms;
    flexdiag__kvp_update(b->kvp, (int32_t)j, b->t, 0, b->p->n_seq, b->diag ? sc : NULL, NULL,
                         b->diag ? NULL : sc);
}

/* Time one policy over L_DEC steps on pool s; returns 0 on success. */
static int bench(flexdiag_policy_kind kind, const char *name, flexdiag_pool *s) {
    flexdiag_policy_params pub = {.struct_size = sizeof pub, .kind = kind, .sparsity = 0.95};
    flexdiag_kvp_params p;
    flexdiag_kvp *kvp = NULL;
    if (flexdiag__kvp_resolve(&pub, L_DEC, &p) != FLEXDIAG_OK) return 1;
    p.n_seq = 64, p.n_layers = 30, p.h_q = 32, p.h_kv = 32;
    if (flexdiag__kvp_create(&p, &kvp) != FLEXDIAG_OK) return 1;
    int32_t ms = flexdiag__kvp_max_slots(&p);
    size_t lists = (size_t)p.n_layers * (size_t)p.n_seq * (size_t)p.h_kv;
    size_t rows = (size_t)p.n_layers * (size_t)p.n_seq * (size_t)p.h_q * (size_t)ms;
    job b = {kvp, &p, 0, ms, kind == FLEXDIAG_POLICY_DIAGONAL, malloc(lists * 4),
             malloc(lists * (size_t)ms * 4), malloc(lists * 4), NULL};
    float *sc = malloc(rows * 4);
    if (!b.ws || !b.slots || !b.ns || !sc) return 1;
    srand(1);
    for (size_t i = 0; i < rows; i++) sc[i] = 0.01f * (float)rand() / (float)RAND_MAX;
    b.scores = sc;
    double tp = 0, tu = 0;
    for (int32_t t = 0; t < L_DEC; t++) {
        b.t = t;
        double t0 = now();
        if (flexdiag__pool_parallel_for(s, p.n_layers, 0, plan_task, &b) != FLEXDIAG_OK) return 1;
        double t1 = now();
        if (flexdiag__kvp_needs_scores(kvp, t) &&
            flexdiag__pool_parallel_for(s, p.n_layers, 0, update_task, &b) != FLEXDIAG_OK)
            return 1;
        tp += t1 - t0;
        tu += now() - t1;
    }
    printf("| %-8s | %8.3f | %8.3f |\n", name, 1e3 * tp / L_DEC, 1e3 * tu / L_DEC);
    free(b.ws), free(b.slots), free(b.ns), free(sc);
    flexdiag__kvp_destroy(kvp);
    return 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    flexdiag_pool *s = NULL;
    if (threads < 0 || flexdiag__pool_create(threads, &s) != FLEXDIAG_OK) {
        fprintf(stderr, "usage: bench_policy_host [threads >= 0 (0 = all cores)]\n");
        return 2;
    }
    printf("%d worker thread(s); 64 sequences x 30 layers x 32 KV heads, N_att 29, %d steps\n\n",
           flexdiag__pool_workers(s), L_DEC);
    printf("| policy   | plan ms  | update ms |\n|---|---|---|\n");
    static const struct { flexdiag_policy_kind k; const char *n; } pol[] = {
        {FLEXDIAG_POLICY_H2O, "h2o"},
        {FLEXDIAG_POLICY_TOVA, "tova"},
        {FLEXDIAG_POLICY_ALISA, "alisa"},
        {FLEXDIAG_POLICY_DIAGONAL, "diagonal"}};
    int rc = 0;
    for (size_t i = 0; i < sizeof pol / sizeof pol[0] && !rc; i++)
        rc = bench(pol[i].k, pol[i].n, s);
    flexdiag__pool_destroy(s);
    return rc;
}
