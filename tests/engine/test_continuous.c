/*
 * test_continuous.c - sequences at their own steps (runtime/engine/serve.c): on the CPU backend
 * a job's tokens and logits do not depend on its neighbours or on when it was admitted. Jobs of
 * different lengths, prompts and arrival times (some cancelled mid-run, some refused while the
 * shared prompt rows are taken) run through one continuous engine; each must equal the same job
 * run alone on a one-image context, bit for bit, for every policy, with CFG pairs (micro-janus),
 * odd slot counts and micro-batches, shared prompt rows, KV homes with CPU attention, weights
 * offloaded, and text (micro-opt) with an end id. ssd and hack run with a calibration table of
 * micro-janus made once (calib_table.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "calib_table.h"
#include "runtime/engine/engine.h"
#include "util.h"

#define N_JOBS 7
#define MAX_STEPS 64

/* One job of the test feed: its engine job, when it may be admitted (decode passes run so far),
 * after how many tokens it is cancelled (-1: never), and what came back. */
typedef struct tjob {
    flexdiag_job job;
    int32_t arrive, cancel_at;
    atomic_int cancel;
    int32_t made;
    flexdiag_status st;
    int32_t tokens[MAX_STEPS];
    float *logits;
} tjob;

typedef struct tfeed {
    tjob *jobs;
    int32_t n, next, passes;
    int32_t prefills; /* prefill passes run (their last layer's progress) */
} tfeed;

static const flexdiag_job *t_peek(void *user) {
    tfeed *f = user;
    if (f->next >= f->n || f->jobs[f->next].arrive > f->passes) return NULL;
    return &f->jobs[f->next].job;
}

static void t_take(void *user) { ((tfeed *)user)->next++; }

/* Nothing live: time jumps to the next arrival. */
static int t_wait(void *user) {
    tfeed *f = user;
    if (f->next >= f->n) return 0;
    if (f->jobs[f->next].arrive > f->passes) f->passes = f->jobs[f->next].arrive;
    return 1;
}

static void t_token(void *user, const flexdiag_job *job, int32_t step) {
    tjob *tj = job->tag;
    (void)user;
    if (tj->cancel_at >= 0 && step + 1 >= tj->cancel_at) atomic_store(&tj->cancel, 1);
}

static void t_done(void *user, const flexdiag_job *job, int32_t n, flexdiag_status st,
                   const char *msg) {
    tjob *tj = job->tag;
    (void)user, (void)msg;
    tj->made = n;
    tj->st = st;
}

/* The context's progress callback counts the decode passes (the feed's clock) and the
 * prefill passes. */
static bool t_pass(int phase, uint64_t done, uint64_t total, void *user) {
    if (phase == 1) ((tfeed *)user)->passes++;
    if (phase == 0 && done == total) ((tfeed *)user)->prefills++;
    return true;
}

/* A configuration: model, context shape and placement. */
typedef struct tconf {
    const char *arch;
    int32_t slots, micro, ipp;
    uint32_t kv[3], weights[3];
    int cpu_attention;
} tconf;

/* The model of tc on a CPU runtime; *dir: the store's folder when tc homes KV on disk (the
 * caller removes and frees it), else NULL. */
static void open_model(const tconf *tc, flexdiag_runtime **rt, flexdiag_model **m, char **dir) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = 2;
    *dir = tc->kv[2] ? tu_tempdir("cont") : NULL;
    rp.offload_dir = *dir; /* the disk KV home's store */
    rp.cpu_mem = tc->kv[2] ? 64u << 20 : 0; /* the disk home's pinned staging */
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = tc->arch;
    mp.seed = 3;
    memcpy(mp.weights_pct, tc->weights, sizeof mp.weights_pct);
    assert_int_equal(flexdiag_model_load(*rt, NULL, &mp, m), FLEXDIAG_OK);
}

static char *calib_dir, *calib_path; /* micro-janus's table (ssd, hack), made at the first use */

/* The table of m's builtin shape (every micro-janus of these tests has its config). */
static const char *calib_of(flexdiag_model *m, flexdiag_policy_kind kind) {
    if (!flexdiag__kvp_needs_calib(kind)) return NULL;
    if (!calib_path) {
        calib_dir = tu_tempdir("cont-calib");
        calib_path = ct_calib_file(m, calib_dir, "micro-janus.calib");
    }
    return calib_path;
}

static flexdiag_context *open_context(flexdiag_model *m, const tconf *tc, int32_t slots,
                                      flexdiag_policy_kind kind, tfeed *clock) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = slots;
    cp.micro_batch = slots > 1 ? tc->micro : 0;
    cp.max_prompt_len = 24;
    cp.max_new_tokens = 48;
    cp.images_per_prompt = slots > 1 ? tc->ipp : 0;
    memcpy(cp.kv_pct, tc->kv, sizeof cp.kv_pct);
    cp.cpu_attention = tc->cpu_attention && kind <= FLEXDIAG_POLICY_STREAMING && slots > 1;
    cp.policy.kind = kind;
    cp.policy.sparsity = kind == FLEXDIAG_POLICY_DENSE ? 0.0 : 0.6;
    cp.policy_calib = calib_of(m, kind);
    cp.progress = clock ? t_pass : NULL;
    cp.progress_user = clock;
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) fprintf(stderr, "context: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    return c;
}

/* Prompts of different lengths (ids valid in both builtin vocabularies); a Janus prompt ends
 * with its image start. */
static const int32_t pr0[] = {256, 104, 101, 108, 108, 111, 261},
                     pr1[] = {256, 97, 261},
                     pr2[] = {256, 120, 121, 122, 32, 97, 98, 99, 100, 101, 102, 103, 261},
                     pr3[] = {256, 111, 110, 101, 261},
                     pr4[] = {256, 261}; /* a Janus unconditional row equal to its prompt */
static const int32_t *const prompts[5] = {pr0, pr1, pr2, pr3, pr4};
static const int32_t prompt_lens[5] = {7, 3, 13, 5, 2};

/* The jobs: arrivals, lengths, a cancel, prompts shared by some (l: the context's length). */
static void make_jobs(tjob *j, int32_t l, int32_t V) {
    static const int32_t arrive[N_JOBS] = {0, 0, 0, 3, 5, 5, 20};
    static const int32_t len[N_JOBS] = {64, 40, 64, 17, 64, 30, 64};
    static const int32_t prompt[N_JOBS] = {0, 1, 0, 2, 3, 4, 2};
    for (int32_t i = 0; i < N_JOBS; i++) {
        j[i] = (tjob){.arrive = arrive[i], .cancel_at = i == 2 ? 25 : -1};
        atomic_init(&j[i].cancel, 0);
        j[i].logits = calloc((size_t)MAX_STEPS * (size_t)V, 4);
        assert_non_null(j[i].logits);
        j[i].job = (flexdiag_job){.prompt = prompts[prompt[i]],
                                  .prompt_len = prompt_lens[prompt[i]],
                                  .n_steps = len[i] < l ? len[i] : l, .eos = -1, .img = 10 + i,
                                  .sp = {1.0f + 0.1f * (float)i, i == 4 ? 5 : 0, 1.0f, 99, 0},
                                  .cfg_weight = 3.0f, .tokens = j[i].tokens,
                                  .logits = j[i].logits, .cancel = &j[i].cancel, .tag = &j[i]};
    }
}

/* Job tj run alone on a one-slot context: its tokens and logits for its whole length. */
static void run_alone(flexdiag_model *m, const tconf *tc, flexdiag_policy_kind kind,
                      const tjob *tj, int32_t *tokens, float *logits) {
    flexdiag_context *c = open_context(m, tc, 1, kind, NULL);
    tjob one = *tj;
    atomic_init(&one.cancel, 0);
    one.cancel_at = -1;
    one.job.tokens = tokens;
    one.job.logits = logits;
    one.job.cancel = &one.cancel;
    one.job.tag = &one;
    tfeed f = {.jobs = &one, .n = 1};
    one.arrive = 0;
    flexdiag_feed feed = {.peek = t_peek, .take = t_take, .wait = t_wait, .token = t_token,
                          .done = t_done, .user = &f};
    assert_int_equal(flexdiag__engine_serve(c, &feed), FLEXDIAG_OK);
    assert_int_equal(one.st, FLEXDIAG_OK);
    flexdiag_context_destroy(c);
}

/* Every job of the continuous run against its run alone (a cancelled one up to where it
 * stopped; with an end id, up to and including its first appearance). */
static void check_jobs(flexdiag_model *m, const tconf *tc, flexdiag_policy_kind kind, tjob *j,
                       int32_t V) {
    int32_t ref[MAX_STEPS];
    float *lref = calloc((size_t)MAX_STEPS * (size_t)V, 4);
    assert_non_null(lref);
    for (int32_t i = 0; i < N_JOBS; i++) {
        run_alone(m, tc, kind, &j[i], ref, lref);
        int32_t want = j[i].job.n_steps;
        for (int32_t k = 0; j[i].job.eos >= 0 && k < want; k++)
            if (ref[k] == j[i].job.eos) want = k + 1;
        if (j[i].cancel_at >= 0) {
            assert_int_equal(j[i].st, FLEXDIAG_ERR_CANCELLED);
            assert_true(j[i].made >= j[i].cancel_at && j[i].made < want);
            want = j[i].made;
        } else {
            assert_int_equal(j[i].st, FLEXDIAG_OK);
            assert_int_equal(j[i].made, want);
        }
        if (memcmp(ref, j[i].tokens, (size_t)want * 4) ||
            memcmp(lref, j[i].logits, (size_t)want * (size_t)V * 4))
            fail_msg("%s, %s: job %d differs from its run alone", tc->arch,
                     flexdiag_policy_name(kind), i);
    }
    free(lref);
}

/* A disk KV home reads ahead what the pass plans name next: every disk visit but the first of
 * a pass that follows an admission's prefill finds its rows on their way. */
static void check_read_ahead(const flexdiag_context *c) {
    if (c->homes.s_disk >= c->geo.n_seq) return;
    flexdiag_sched_stats st;
    c->sched->ops->stats(c->sched, &st);
    assert_true(st.kv_disk_gets > 0);
    if (st.kv_disk_hits * 10 < st.kv_disk_gets * 9)
        fail_msg("disk KV: %llu of %llu reads were ahead", (unsigned long long)st.kv_disk_hits,
                 (unsigned long long)st.kv_disk_gets);
}

/* The continuous run of the jobs on tc's context under policy kind, then the comparison; the
 * prefill passes the run took. */
static int32_t run_conf(const tconf *tc, flexdiag_policy_kind kind, int text_eos) {
    flexdiag_runtime *rt;
    flexdiag_model *m;
    char *dir;
    open_model(tc, &rt, &m, &dir);
    tfeed f = {.n = N_JOBS};
    flexdiag_context *c = open_context(m, tc, tc->slots, kind, &f);
    int32_t V = c->geo.vocab_out;
    tjob *j = calloc(N_JOBS, sizeof *j);
    assert_non_null(j);
    make_jobs(j, c->geo.l_dec, V);
    if (text_eos) { /* job 1 ends at the id its run alone makes at step 9 */
        int32_t ref[MAX_STEPS];
        float *lref = calloc((size_t)MAX_STEPS * (size_t)V, 4);
        run_alone(m, tc, kind, &j[1], ref, lref);
        j[1].job.eos = ref[9];
        free(lref);
    }
    f.jobs = j;
    flexdiag_feed feed = {.peek = t_peek, .take = t_take, .wait = t_wait, .token = t_token,
                          .done = t_done, .user = &f};
    flexdiag_status st = flexdiag__engine_serve(c, &feed);
    if (st != FLEXDIAG_OK) fprintf(stderr, "serve: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    assert_int_equal(f.next, N_JOBS);
    check_read_ahead(c);
    flexdiag_context_destroy(c);
    check_jobs(m, tc, kind, j, V);
    for (int32_t i = 0; i < N_JOBS; i++) free(j[i].logits);
    free(j);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    if (dir) tu_rmtree(dir);
    free(dir);
    return f.prefills;
}

static const flexdiag_policy_kind all_kinds[] = {
    FLEXDIAG_POLICY_DENSE, FLEXDIAG_POLICY_WINDOW,   FLEXDIAG_POLICY_STREAMING,
    FLEXDIAG_POLICY_H2O,   FLEXDIAG_POLICY_TOVA,     FLEXDIAG_POLICY_ALISA,
    FLEXDIAG_POLICY_DIAGONAL, FLEXDIAG_POLICY_DIAGONAL_SINK4, FLEXDIAG_POLICY_LINE_AR,
    FLEXDIAG_POLICY_SSD,   FLEXDIAG_POLICY_HACK};
#define N_KINDS (int)(sizeof all_kinds / sizeof all_kinds[0])

/* Three slots (CFG pairs), micro-batches of two: the last one odd. */
static void test_images(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 3, .micro = 2};
    for (int k = 0; k < N_KINDS; k++) run_conf(&tc, all_kinds[k], 0);
}

/* Shared prompt rows: four slots hold at most 6 rows (2 per image x (4 / 2 + 1)), fewer than
 * the jobs' distinct prompts need at once, so admissions wait for rows to free. */
static void test_shared_prompts(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 4, .micro = 4, .ipp = 2};
    for (int k = 0; k < N_KINDS; k++) run_conf(&tc, all_kinds[k], 0);
}

/* Shared prompt rows: an image whose unconditional row equals its prompt (two ids) takes one
 * row for both, so two such images prefill one row. */
static void test_shared_one_row(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 4, .micro = 4, .ipp = 2};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    char *dir;
    open_model(&tc, &rt, &m, &dir);
    flexdiag_context *c = open_context(m, &tc, tc.slots, FLEXDIAG_POLICY_DIAGONAL, NULL);
    const int32_t *pp[2] = {pr4, pr4};
    const int32_t pl[2] = {2, 2};
    int32_t tokens[2 * MAX_STEPS];
    flexdiag_block b = {.n_img = 2, .prompt = pp, .prompt_len = pl, .n_steps = 4,
                        .sp = {1.0f, 0, 1.0f, 1, 0}, .cfg_weight = 3.0f, .tokens = tokens};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    assert_int_equal(c->n_pf, 1);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* KV homes: one micro-batch on the device, two in pinned memory; the position policies with
 * the host attending them. */
static void test_kv_homes(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 3, .micro = 1, .kv = {34, 33, 33},
                .cpu_attention = 1};
    for (int k = 0; k < N_KINDS; k++) run_conf(&tc, all_kinds[k], 0);
}

/* KV homes: one micro-batch on the device, two on disk (pages read into pinned staging); a
 * prefill between decode steps breaks the staging regions' round robin. */
static void test_kv_disk(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 3, .micro = 1, .kv = {34, 0, 66}};
    for (int k = 0; k < N_KINDS; k++) run_conf(&tc, all_kinds[k], 0);
    tconf all = {.arch = "micro-janus", .slots = 3, .micro = 1, .kv = {0, 0, 100}};
    run_conf(&all, FLEXDIAG_POLICY_DIAGONAL, 0);
}

/* Weights half on the device, half in pinned memory (the tiered scheduler). */
static void test_weights_offloaded(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 3, .micro = 2, .weights = {50, 50, 0}};
    run_conf(&tc, FLEXDIAG_POLICY_DIAGONAL, 0);
    run_conf(&tc, FLEXDIAG_POLICY_H2O, 0);
}

/* Text: one row per sequence, an end id that stops a sequence early. */
static void test_text(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-opt", .slots = 3, .micro = 2};
    for (int k = 0; k < N_KINDS; k++) /* the grid policies need a grid */
        if (all_kinds[k] < FLEXDIAG_POLICY_LINE_AR) run_conf(&tc, all_kinds[k], 1);
}

/* Admissions gathered (FLEXDIAG_ADMIT_IDLE, serve.c admit_due): fewer prefill passes, every
 * job still as alone. */
static void test_admissions_gather(void **state) {
    (void)state;
    tconf tc = {.arch = "micro-janus", .slots = 3, .micro = 2};
    int32_t every = run_conf(&tc, FLEXDIAG_POLICY_DIAGONAL, 0);
    setenv("FLEXDIAG_ADMIT_IDLE", "4", 1);
    int32_t gathered = run_conf(&tc, FLEXDIAG_POLICY_DIAGONAL, 0);
    unsetenv("FLEXDIAG_ADMIT_IDLE");
    printf("  prefill passes: %d admitting at every boundary, %d gathered\n", every, gathered);
    assert_true(gathered < every);
}

static int teardown(void **state) {
    (void)state;
    if (calib_dir) tu_rmtree(calib_dir);
    free(calib_dir);
    free(calib_path);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_images),
        cmocka_unit_test(test_shared_prompts),
        cmocka_unit_test(test_shared_one_row),
        cmocka_unit_test(test_kv_homes),
        cmocka_unit_test(test_kv_disk),
        cmocka_unit_test(test_weights_offloaded),
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_admissions_gather),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
