/*
 * test_sjd.c - speculative Jacobi decoding (runtime/engine/window.c, sjd.c) on the CPU backend:
 *   - greedy (top_k 1) SJD is Jacobi iteration: every window gives sequential decoding's tokens
 *     and logits bit for bit, with CFG pairs (micro-janus), shared prompt KV, text (micro-opt, also
 *     with an end id inside a window), Lumina-mGPT images (forced row ends; micro-lumina) and
 *     with the weights offloaded; it takes fewer passes than tokens;
 *   - a sequential job (draft_len 1) in a window context draws what a sequential context draws;
 *   - sampled SJD is exact (argument "exact", the golden suite): on the trained model, the joint
 *     distribution of an image's first three tokens (top_k 3) over 1200 fixed seeds under SJD
 *     and over 1200 others under sequential sampling pass a chi-square homogeneity test at the
 *     99.9 % quantile (rules that accept every draft, or at half the right rate, fail it:
 *     docs/decoding.md);
 *   - the acceptance rule alone (sjd.c): the committed token follows p for any draft q;
 *   - what the window pass does not support is refused with the field named.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sjd.h"
#include "util.h"

#define MAX_STEPS 48

/* ---- a feed of jobs, all waiting at the start ---- */

typedef struct tfeed {
    flexdiag_job *jobs;
    int32_t n, next, passes;
    int32_t *made;
} tfeed;

static const flexdiag_job *t_peek(void *user) {
    tfeed *f = user;
    return f->next < f->n ? &f->jobs[f->next] : NULL;
}
static void t_take(void *user) { ((tfeed *)user)->next++; }
static int t_wait(void *user) { return ((tfeed *)user)->next < ((tfeed *)user)->n; }
static void t_done(void *user, const flexdiag_job *job, int32_t n, flexdiag_status st,
                   const char *msg) {
    tfeed *f = user;
    if (st != FLEXDIAG_OK) fail_msg("job %d: %s", job->idx, msg);
    f->made[job->idx] = n;
}
static bool t_pass(int phase, uint64_t done, uint64_t total, void *user) {
    (void)done, (void)total;
    if (phase == 1) ((tfeed *)user)->passes++;
    return true;
}

typedef struct tconf {
    const char *arch;
    uint32_t weights[3];
    int32_t slots, draft, ipp;
    int eos; /* every job ends at the id sequential decoding made at job 0's step 9 */
} tconf;

/* tc's model (a builtin arch, or a folder under tests/ when it names one) on a CPU runtime. */
static void open_model(const tconf *tc, flexdiag_runtime **rt, flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = 2;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = tc->arch;
    mp.seed = 5;
    memcpy(mp.weights_pct, tc->weights, sizeof mp.weights_pct);
    char *dir = strchr(tc->arch, '/') ? tu_data_path(tc->arch) : NULL;
    if (dir) mp.arch = NULL;
    flexdiag_status st = flexdiag_model_load(*rt, dir, &mp, m);
    if (st != FLEXDIAG_OK) fail_msg("model %s: %s", tc->arch, flexdiag_last_error(NULL));
    free(dir);
}

static int32_t g_ipp; /* images_per_prompt of the contexts open_context makes */

static flexdiag_context *open_context(flexdiag_model *m, int32_t slots, int32_t draft,
                                      tfeed *clock) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = slots;
    cp.max_prompt_len = 16;
    cp.max_new_tokens = MAX_STEPS;
    cp.draft_len = draft;
    cp.images_per_prompt = slots > 1 ? g_ipp : 0;
    cp.progress = t_pass;
    cp.progress_user = clock;
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) fail_msg("context: %s", flexdiag_last_error(NULL));
    return c;
}

static const int32_t pr0[] = {256, 104, 101, 108, 108, 111, 261}, pr1[] = {256, 97, 261},
                     pr2[] = {256, 120, 121, 122, 32, 97, 261};
static const int32_t *const prompts[3] = {pr0, pr1, pr2};
static const int32_t prompt_lens[3] = {7, 3, 6};
static int32_t g_lumina[12], g_lumina_len; /* a Lumina-mGPT image prompt, when set */

/* m's image prompt when it is a Chameleon model: BOS, text, end of turn, image start, size
 * twice (what check_job asks of it). */
static void lumina_prompt(const flexdiag_model *m) {
    const flexdiag_model_config *c = &m->cfg;
    g_lumina_len = 0;
    if (c->arch != FLEXDIAG_ARCH_CHAMELEON) return;
    g_lumina[g_lumina_len++] = c->bos_id;
    for (int32_t i = 0; i < 4; i++) g_lumina[g_lumina_len++] = 300 + 17 * i;
    g_lumina[g_lumina_len++] = c->eot_id;
    g_lumina[g_lumina_len++] = c->boi_id;
    g_lumina[g_lumina_len++] = c->size_id;
    g_lumina[g_lumina_len++] = c->size_id;
}

/* n jobs of n_steps tokens (window draft each; top_k, temperature) writing tokens (n, MAX_STEPS)
 * and logits (n, MAX_STEPS, V) when given. */
static void make_jobs(flexdiag_job *j, int32_t n, int32_t n_steps, int32_t draft, int32_t top_k,
                      float temp, int32_t *tokens, float *logits, int32_t V) {
    for (int32_t i = 0; i < n; i++)
        j[i] = (flexdiag_job){.prompt = g_lumina_len ? g_lumina : prompts[i % 3],
                              .prompt_len = g_lumina_len ? g_lumina_len : prompt_lens[i % 3],
                              .n_steps = n_steps, .eos = -1, .img = i,
                              .sp = {temp, top_k, 1.0f, 7 + (uint64_t)i, 0}, .cfg_weight = 3.0f,
                              .draft_len = draft, .tokens = tokens + (size_t)i * MAX_STEPS,
                              .logits = logits ? logits + (size_t)i * MAX_STEPS * (size_t)V : NULL,
                              .idx = i};
}

/* Runs jobs on c; the decode passes it took. */
static int32_t run_jobs(flexdiag_context *c, tfeed *f, flexdiag_job *jobs, int32_t n,
                        int32_t *made) {
    *f = (tfeed){.jobs = jobs, .n = n, .made = made};
    flexdiag_feed feed = {.peek = t_peek, .take = t_take, .wait = t_wait, .done = t_done, .user = f};
    flexdiag_status st = flexdiag__engine_serve(c, &feed);
    if (st != FLEXDIAG_OK) fail_msg("serve: %s", flexdiag_last_error(NULL));
    return f->passes;
}

/* ---- greedy SJD is Jacobi decoding: sequential's tokens and logits ---- */

#define N_JOBS 5

static void greedy_conf(const tconf *tc) {
    g_ipp = tc->ipp;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(tc, &rt, &m);
    lumina_prompt(m);
    tfeed f;
    flexdiag_context *seq = open_context(m, tc->slots, 0, &f);
    int32_t V = seq->geo.vocab_out, L = seq->geo.l_dec < MAX_STEPS ? seq->geo.l_dec : MAX_STEPS;
    size_t nl = (size_t)N_JOBS * MAX_STEPS * (size_t)V;
    int32_t *tok = calloc(2 * N_JOBS * MAX_STEPS, 4), made[2][N_JOBS];
    float *lg = calloc(2 * nl, 4);
    flexdiag_job jobs[2][N_JOBS];
    assert_true(tok && lg);
    make_jobs(jobs[0], N_JOBS, L, 1, 1, 1.0f, tok, lg, V);
    int32_t p0 = run_jobs(seq, &f, jobs[0], N_JOBS, made[0]);
    flexdiag_context *sjd = open_context(m, tc->slots, tc->draft, &f);
    make_jobs(jobs[1], N_JOBS, L, tc->draft, 1, 1.0f, tok + N_JOBS * MAX_STEPS, lg + nl, V);
    if (tc->eos) { /* a window may commit tokens past the end id: they must be dropped */
        for (int32_t i = 0; i < N_JOBS; i++) jobs[0][i].eos = jobs[1][i].eos = tok[9];
        p0 = run_jobs(seq, &f, jobs[0], N_JOBS, made[0]);
        assert_true(made[0][0] <= 10); /* job 0 ended at (or before) its step 9 */
    }
    flexdiag_context_destroy(seq);
    int32_t p1 = run_jobs(sjd, &f, jobs[1], N_JOBS, made[1]);
    for (int32_t i = 0; i < N_JOBS; i++) {
        assert_int_equal(made[0][i], made[1][i]);
        if (memcmp(jobs[0][i].tokens, jobs[1][i].tokens, (size_t)made[0][i] * 4) ||
            memcmp(jobs[0][i].logits, jobs[1][i].logits, (size_t)made[0][i] * (size_t)V * 4))
            fail_msg("%s, window %d: job %d differs from sequential decoding", tc->arch,
                     tc->draft, i);
    }
    if (p1 > p0) fail_msg("%s, window %d: %d passes, sequential %d", tc->arch, tc->draft, p1, p0);
    print_message("%s window %d: %d decode passes, sequential %d\n", tc->arch, tc->draft, p1, p0);
    flexdiag_context_destroy(sjd);
    free(tok);
    free(lg);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    g_ipp = g_lumina_len = 0;
}

static void test_greedy_images(void **state) {
    (void)state;
    for (int32_t d = 2; d <= 8; d *= 2) {
        tconf tc = {.arch = "micro-janus", .slots = 3, .draft = d};
        greedy_conf(&tc);
    }
}

static void test_greedy_text(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-opt", .slots = 2, .draft = 4};
    greedy_conf(&tc);
    tc.eos = 1;
    greedy_conf(&tc);
}

static void test_greedy_offloaded(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .weights = {50, 50, 0}, .slots = 3, .draft = 4};
    greedy_conf(&tc);
}

/* Lumina-mGPT's images (micro-lumina): each row of codes ends with a forced row-end token,
 * which a window commits without a draw; the ragged unconditional rows of CFG. */
static void test_greedy_lumina(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-lumina", .slots = 2, .draft = 4};
    greedy_conf(&tc);
}

/* Shared prompt KV: four slots, two images a prompt row (the jobs cycle over 3 prompts). */
static void test_greedy_shared_prompts(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 4, .draft = 4, .ipp = 2};
    greedy_conf(&tc);
}

/* ---- sequential jobs in a window context ---- */

static void test_sequential_jobs(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 3};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(&tc, &rt, &m);
    tfeed f;
    int32_t tok[2][N_JOBS * MAX_STEPS], made[2][N_JOBS];
    flexdiag_job jobs[2][N_JOBS];
    flexdiag_context *c = open_context(m, 3, 0, &f);
    int32_t L = c->geo.l_dec < MAX_STEPS ? c->geo.l_dec : MAX_STEPS, V = c->geo.vocab_out;
    size_t nl = (size_t)N_JOBS * MAX_STEPS * (size_t)V;
    float *lg = calloc(2 * nl, 4);
    assert_non_null(lg);
    make_jobs(jobs[0], N_JOBS, L, 1, 0, 1.0f, tok[0], lg, V);
    run_jobs(c, &f, jobs[0], N_JOBS, made[0]);
    flexdiag_context_destroy(c);
    c = open_context(m, 3, 4, &f);
    make_jobs(jobs[1], N_JOBS, L, 1, 0, 1.0f, tok[1], lg + nl, V);
    jobs[1][1].draft_len = 4; /* a neighbour at its own window, done before the others */
    run_jobs(c, &f, jobs[1], N_JOBS, made[1]);
    for (int32_t i = 0; i < N_JOBS; i++)
        if (i != 1 && (memcmp(tok[0] + i * MAX_STEPS, tok[1] + i * MAX_STEPS, (size_t)L * 4) ||
                       memcmp(lg + (size_t)i * MAX_STEPS * (size_t)V,
                              lg + nl + (size_t)i * MAX_STEPS * (size_t)V, (size_t)L * (size_t)V * 4)))
            fail_msg("job %d: tokens or logits differ from the sequential context's", i);
    free(lg);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* ---- sampled SJD is exact ---- */

#define N_SEEDS 1200
#define N_TOK 3 /* counted: the prefill's token and two decoded ones */
#define N_RUN 6 /* made: so the counted ones come from windows with drafts */
#define TOPK 3

/* The prompt of the trained model's golden fixture (tests/golden/data/shapes/score_input.json). */
static const int32_t shapes_prompt[] = {381, 384, 58, 260, 309, 373, 272, 276, 280, 380, 385, 58, 386};

/* Cell counts (TOPK^3) of tokens 0..2 of N_SEEDS images (ranks of their ids among the
 * observed ones). */
static void joint_counts(flexdiag_model *m, int32_t draft, double *count, int32_t *ids_seen) {
    tfeed f;
    flexdiag_context *c = open_context(m, 32, draft, &f);
    flexdiag_job *jobs = calloc(N_SEEDS, sizeof *jobs);
    int32_t *tok = calloc((size_t)N_SEEDS * MAX_STEPS, 4), *made = calloc(N_SEEDS, 4);
    assert_true(jobs && tok && made);
    make_jobs(jobs, N_SEEDS, N_RUN, draft ? draft : 1, TOPK, 1.5f, tok, NULL, 0);
    for (int32_t i = 0; i < N_SEEDS; i++) { /* independent samples: each run its own seeds */
        jobs[i].prompt = shapes_prompt, jobs[i].prompt_len = 13;
        jobs[i].sp.seed += draft ? 1000003u : 0u;
    }
    run_jobs(c, &f, jobs, N_SEEDS, made);
    for (int32_t i = 0; i < N_SEEDS; i++) {
        int32_t cell = 0; /* token 0 (the prefill's, the same draw in both runs) included */
        for (int32_t k = 0; k < N_TOK; k++) {
            int32_t id = tok[i * MAX_STEPS + k], r = 0;
            while (r < 64 && ids_seen[r] >= 0 && ids_seen[r] != id) r++;
            assert_true(r < 64);
            ids_seen[r] = id;
            cell = cell * 64 + r;
        }
        count[cell] += 1.0;
    }
    free(jobs);
    free(tok);
    free(made);
    flexdiag_context_destroy(c);
}

/* Chi-square homogeneity statistic of two count tables (cells with an expected count below 5
 * pooled into one); its degrees of freedom into *df. */
static double chi_square(const double *a, const double *b, int32_t n, int32_t *df) {
    double na = 0, nb = 0, chi = 0, pa = 0, pb = 0;
    for (int32_t i = 0; i < n; i++) na += a[i], nb += b[i];
    *df = -1;
    for (int32_t i = 0; i < n; i++) {
        double t = a[i] + b[i], ea = t * na / (na + nb), eb = t * nb / (na + nb);
        if (t == 0) continue;
        if (ea < 5 || eb < 5) {
            pa += a[i], pb += b[i];
            continue;
        }
        chi += (a[i] - ea) * (a[i] - ea) / ea + (b[i] - eb) * (b[i] - eb) / eb;
        (*df)++;
    }
    if (pa + pb > 0) {
        double ea = (pa + pb) * na / (na + nb), eb = (pa + pb) * nb / (na + nb);
        chi += (pa - ea) * (pa - ea) / ea + (pb - eb) * (pb - eb) / eb;
        (*df)++;
    }
    return chi;
}

/* On the trained model, whose next-token distributions depend on what came before (on a random
 * micro model they barely do, and a rule that accepted every draft would pass unseen). */
static void test_sampling_exact(void **state) {
    (void)state;
    tconf tc = {.arch = "../models/shapes-janus"};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(&tc, &rt, &m);
    size_t cells = 64 * 64 * 64;
    double *seq = calloc(cells, sizeof *seq), *sjd = calloc(cells, sizeof *sjd);
    int32_t seen[64];
    for (int i = 0; i < 64; i++) seen[i] = -1;
    assert_true(seq && sjd);
    joint_counts(m, 0, seq, seen);
    joint_counts(m, 4, sjd, seen);
    int32_t df;
    double chi = chi_square(seq, sjd, (int32_t)cells, &df);
    /* 99.9 % quantile of chi-square(df) by Wilson-Hilferty: a fixed seed list either passes or
     * fails for good */
    double z = 3.09, k = df, q = k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
    print_message("joint of tokens 0..2: chi-square %.1f on %d degrees of freedom (limit %.1f)\n",
                  chi, df, q);
    assert_true(df >= 3);
    assert_true(chi < q);
    free(seq);
    free(sjd);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* The rule alone: p over 4 columns, a draft from a different q; the committed token's frequency
 * over 40000 keys matches p within 4 standard errors. */
static void test_verify_rule(void **state) {
    (void)state;
    const float p[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, 0.25f, 0.25f, 0.25f, 0.25f};
    const float q[4] = {0.6f, 0.1f, 0.1f, 0.2f};
    double n[4] = {0};
    int32_t forced[2] = {-1, -1}, out[2];
    float res[4];
    const int N = 40000;
    for (int i = 0; i < N; i++) {
        flexdiag_sjd_key key = {11, i};
        int32_t d = flexdiag__sjd_draw_draft(&key, 1, q, 4);
        int32_t k = flexdiag__sjd_verify(&key, 0, p, 2, &d, q, forced, 4, out, res);
        assert_true(k >= 1 && k <= 2);
        n[out[0]] += 1;
    }
    for (int j = 0; j < 4; j++) {
        double se = sqrt(p[j] * (1 - p[j]) / N);
        if (fabs(n[j] / N - p[j]) > 4 * se)
            fail_msg("column %d: %.4f committed, p %.2f", j, n[j] / N, (double)p[j]);
    }
}

/* ---- refusals ---- */

static void test_refused(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus"};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model(&tc, &rt, &m);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.draft_len = 4;
    cp.policy.kind = FLEXDIAG_POLICY_DIAGONAL;
    cp.policy.sparsity = 0.5;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_UNSUPPORTED);
    assert_non_null(strstr(flexdiag_last_error(NULL), "draft_len"));
    cp.policy.kind = FLEXDIAG_POLICY_DENSE;
    cp.draft_len = 65;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "draft_len"));
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* No argument: the unit tests; "exact": the statistical test alone (meson.build). */
int main(int argc, char **argv) {
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_verify_rule),     cmocka_unit_test(test_greedy_images),
        cmocka_unit_test(test_greedy_text),     cmocka_unit_test(test_greedy_offloaded),
        cmocka_unit_test(test_greedy_shared_prompts), cmocka_unit_test(test_greedy_lumina),
        cmocka_unit_test(test_sequential_jobs), cmocka_unit_test(test_refused),
    };
    const struct CMUnitTest exact[] = {cmocka_unit_test(test_sampling_exact)};
    if (argc > 1 && !strcmp(argv[1], "exact")) return cmocka_run_group_tests(exact, NULL, NULL);
    return cmocka_run_group_tests(unit, NULL, NULL);
}
