/*
 * test_engine.c - the generation engine and public API on the builtin micro-janus model (CPU):
 * determinism across batch composition, micro-batching and thread count; cancellation and
 * context reuse; input validation; the `flexdiag generate` CLI's outputs and flag errors.
 */
#include <jansson.h>
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
#include "util.h"

#define N_IMG 5

/* micro-janus on the CPU, the store (if any) in offload_dir (NULL: none). */
static void open_builtin_in(int threads, const char *offload_dir, flexdiag_runtime **rt,
                            flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.threads = threads;
    rp.offload_dir = offload_dir;
    assert_int_equal(flexdiag_runtime_create(&rp, rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    mp.seed = 7;
    assert_int_equal(flexdiag_model_load(*rt, NULL, &mp, m), FLEXDIAG_OK);
}

static void open_builtin(int threads, flexdiag_runtime **rt, flexdiag_model **m) {
    open_builtin_in(threads, NULL, rt, m);
}

/* Generate N_IMG images (prompts "p0".."p2", 2 images each -> 6, first N_IMG kept). */
static int32_t *generate(int threads, int32_t batch, int32_t micro, flexdiag_policy_kind kind) {
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin(threads, &rt, &m);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = batch;
    cp.micro_batch = micro;
    cp.max_prompt_len = 32;
    cp.policy.kind = kind;
    cp.policy.sparsity = 0.5;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    const char *prompts[3] = {"p0", "a longer prompt one", "  p2  "};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 3;
    rq.prompts = prompts;
    rq.images_per_prompt = 2;
    rq.seed = 11;
    flexdiag_output out = {0};
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_OK);
    assert_int_equal(out.n_images, 6);
    assert_int_equal(out.tokens_per_image, 64);
    out.tokens = malloc(6 * 64 * 4);
    flexdiag_status st = flexdiag_generate(c, &rq, &out);
    if (st != FLEXDIAG_OK) fprintf(stderr, "%s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return out.tokens;
}

static void test_determinism(void **state) {
    (void)state;
    int32_t *a = generate(1, 6, 0, FLEXDIAG_POLICY_DENSE);
    int32_t *b = generate(3, 4, 1, FLEXDIAG_POLICY_DENSE); /* other blocks, micro-batches, threads */
    int32_t *c = generate(2, 1, 0, FLEXDIAG_POLICY_DENSE);
    assert_memory_equal(a, b, 6 * 64 * 4);
    assert_memory_equal(a, c, 6 * 64 * 4);
    int differs = 0; /* two images of one prompt are different draws */
    for (int i = 0; i < 64; i++) differs |= a[i] != a[64 + i];
    assert_true(differs);
    int32_t *d = generate(1, 6, 0, FLEXDIAG_POLICY_DIAGONAL); /* sparse: same keys, deterministic */
    int32_t *e = generate(2, 2, 1, FLEXDIAG_POLICY_DIAGONAL);
    assert_memory_equal(d, e, 6 * 64 * 4);
    free(a);
    free(b);
    free(c);
    free(d);
    free(e);
}

static bool stop_at_3(int phase, uint64_t done, uint64_t total, void *user) {
    (void)phase;
    (void)total;
    (void)user;
    return done < 3;
}

static void test_cancel_and_reuse(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin(0, &rt, &m);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.max_prompt_len = 32;
    cp.progress = stop_at_3;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    const char *prompts[1] = {"cat"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = prompts;
    int32_t tokens[64];
    flexdiag_output out = {.tokens = tokens};
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_ERR_CANCELLED);
    c->p.progress = NULL; /* the same context runs again after a cancel */
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* Progress calls of one run, in order. */
typedef struct progress_log {
    int n;
    int phase[128];
    uint64_t done[128], total[128];
} progress_log;

static bool log_progress(int phase, uint64_t done, uint64_t total, void *user) {
    progress_log *l = user;
    if (l->n < 128) {
        l->phase[l->n] = phase;
        l->done[l->n] = done;
        l->total[l->n] = total;
    }
    l->n++;
    return true;
}

/* Prefill reports one call per layer (phase 0, done 1..layers), then every decode step
 * (phase 1, done = tokens so far, 2..64). */
static void test_progress(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin(1, &rt, &m);
    progress_log lg = {0};
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = 32;
    cp.progress = log_progress;
    cp.progress_user = &lg;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    const char *prompts[1] = {"cat"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = prompts;
    int32_t tokens[64];
    flexdiag_output out = {.tokens = tokens};
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_OK);
    assert_int_equal(lg.n, 2 + 63);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(lg.phase[i], 0);
        assert_int_equal(lg.done[i], (uint64_t)i + 1);
        assert_int_equal(lg.total[i], 2);
    }
    for (int i = 2; i < lg.n; i++) {
        assert_int_equal(lg.phase[i], 1);
        assert_int_equal(lg.done[i], (uint64_t)i);
        assert_int_equal(lg.total[i], 64);
    }
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

static void test_bad_input(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin(0, &rt, &m);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = 4;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    int32_t prompt[3] = {256, 9999, 261}, ids[2] = {1, 2};
    float logits[2 * 256];
    assert_int_equal(flexdiag__context_score(c, prompt, 3, ids, 2, 5.0f, logits, NULL),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "9999"));
    prompt[1] = 5;
    ids[1] = 256; /* image vocab is 256 */
    assert_int_equal(flexdiag__context_score(c, prompt, 3, ids, 2, 5.0f, logits, NULL),
                     FLEXDIAG_ERR_INVALID_ARG);
    const char *long_prompt[1] = {"this prompt is far longer than four tokens"};
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = long_prompt;
    int32_t tokens[64];
    flexdiag_output out = {.tokens = tokens};
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag_last_error(NULL), "prompt length"));
    rq.temperature = 0;
    assert_int_equal(flexdiag_generate(c, &rq, &out), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag_context_params bad;
    flexdiag_context_params_init(&bad);
    bad.struct_size = 0;
    flexdiag_context *c2 = (flexdiag_context *)1;
    assert_int_equal(flexdiag_context_create(m, &bad, &c2), FLEXDIAG_ERR_INVALID_ARG);
    assert_null(c2);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* An unallocated context of m for n_img images, prompts up to 16 tokens, policy kind with
 * N_att 9 and N_r 20, micro-batches of micro images; the caller adds its own params and
 * allocates it. */
static flexdiag_context *policy_ctx(flexdiag_model *m, flexdiag_policy_kind kind, int32_t n_img,
                                    int micro) {
    flexdiag_context *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->m = m;
    flexdiag_context_params_init(&c->p);
    c->p.max_images = n_img;
    c->p.max_prompt_len = 16;
    c->p.policy.kind = kind;
    c->p.policy.n_att = 9;
    c->p.policy.n_r = 20;
    c->p.micro_batch = micro;
    return c;
}

/* Teacher-forced run of micro-janus under policy kind with the host state machines (host = 1)
 * or the device-policy ops, in micro-batches of micro images (0: one); returns logits and
 * fills *plan (caller frees). */
static float *policy_run(flexdiag_model *m, flexdiag_policy_kind kind, int host, int micro,
                         int32_t **plan) {
    flexdiag_context *c = policy_ctx(m, kind, 2, micro);
    c->host_policy = host;
    assert_int_equal(flexdiag__context_alloc(c), FLEXDIAG_OK);
    assert_int_equal(flexdiag__pd_on_device(&c->pd), !host);
    int32_t p0[6] = {256, 259, 'a', 'b', 260, 261}, p1[4] = {256, 259, 'z', 261}, np[2] = {6, 4};
    const int32_t *pp[2] = {p0, p1};
    int32_t forced[2 * 64], tok[2 * 64];
    for (int i = 0; i < 128; i++) forced[i] = (i * 37 + 11) % 256;
    size_t rec = (size_t)1 + (size_t)c->pd.max_slots;
    *plan = calloc((size_t)63 * 2 * 4 * 4 * rec, 4);
    float *logits = malloc((size_t)2 * 64 * 256 * 4);
    flexdiag_block b = {.n_img = 2, .prompt = pp, .prompt_len = np, .n_steps = 64,
                        .forced = forced, .cfg_weight = 5.0f, .tokens = tok, .logits = logits,
                        .plan_out = *plan, .sp = {1.0f, 0, 1.0f, 0}};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    return logits;
}

/* The device-resident policy paths (Diagonal: diag_slots and the update fused into
 * attn_decode; H2O / TOVA: evict_plan and evict_update; ALISA: alisa_plan and alisa_update)
 * equal the host state machines:
 * identical attended slots at every (step, layer, sequence, KV head) and identical logits
 * (which also pins every H2O / TOVA victim: a different eviction changes the attended keys). */
static void test_device_policy(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin(2, &rt, &m);
    const flexdiag_policy_kind kinds[5] = {FLEXDIAG_POLICY_DIAGONAL,
                                           FLEXDIAG_POLICY_DIAGONAL_SINK4, FLEXDIAG_POLICY_H2O,
                                           FLEXDIAG_POLICY_TOVA, FLEXDIAG_POLICY_ALISA};
    for (int i = 0; i < 5; i++) {
        int32_t *ph, *pd;
        for (int micro = 0; micro <= 1; micro++) { /* one batch; one image per micro-batch */
            float *lh = policy_run(m, kinds[i], 1, micro, &ph);
            float *ld = policy_run(m, kinds[i], 0, micro, &pd);
            size_t rec = (size_t)1 + 9;
            assert_memory_equal(ph, pd, (size_t)63 * 2 * 4 * 4 * rec * 4);
            assert_memory_equal(lh, ld, (size_t)2 * 64 * 256 * 4);
            free(ph), free(pd), free(lh), free(ld);
        }
    }
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* Prefill in chunks (one sequence, three sequences with a remainder) gives the logits of one
 * whole-batch prefill, bit for bit; also with the block's KV on disk, where chunks of one
 * micro-batch share file pages (offload/kv_disk.c). */
static void test_prefill_chunks(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    char *dir = tu_tempdir("prefill-chunks");
    open_builtin_in(2, dir, &rt, &m);
    float *ref = NULL;
    const int32_t caps[5] = {0, 16, 48, 16, 48}; /* p_cap 16: all 4 sequences, 1, 3 per chunk */
    const int32_t want_seq[5] = {4, 1, 3, 1, 2}; /* a home below: chunks divide the micro-batch */
    for (int i = 0; i < 5; i++) {
        flexdiag_context *c = calloc(1, sizeof *c);
        c->m = m;
        flexdiag_context_params_init(&c->p);
        c->p.max_images = 2;
        c->p.max_prompt_len = 16;
        if (i >= 3) c->p.kv_pct[2] = 100; /* one micro-batch, on disk */
        c->pf_tokens = caps[i];
        assert_int_equal(flexdiag__context_alloc(c), FLEXDIAG_OK);
        assert_int_equal(c->geo.pf_seq, want_seq[i]);
        int32_t p0[6] = {256, 259, 'a', 'b', 260, 261}, p1[4] = {256, 259, 'z', 261};
        int32_t np[2] = {6, 4}, forced[2 * 64], tok[2 * 64];
        const int32_t *pp[2] = {p0, p1};
        for (int k = 0; k < 128; k++) forced[k] = (k * 37 + 11) % 256;
        float *logits = malloc((size_t)2 * 64 * 256 * 4);
        flexdiag_block b = {.n_img = 2, .prompt = pp, .prompt_len = np, .n_steps = 64,
                            .forced = forced, .cfg_weight = 5.0f, .tokens = tok,
                            .logits = logits, .sp = {1.0f, 0, 1.0f, 0}};
        assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
        flexdiag_context_destroy(c);
        if (!ref) ref = logits;
        else {
            assert_memory_equal(logits, ref, (size_t)2 * 64 * 256 * 4);
            free(logits);
        }
    }
    free(ref);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    tu_rmtree(dir);
    free(dir);
}

/* Teacher-forced logits of 7 images (prompts A x3, B x3, C x1 side by side, B shorter) with
 * policy kind, micro-batches of micro images, images_per_prompt ipp; *n_pre the context's
 * shared prompt rows. */
static float *shared_run(flexdiag_model *m, flexdiag_policy_kind kind, int micro, int ipp,
                         int32_t *n_pre) {
    flexdiag_context *c = policy_ctx(m, kind, 7, micro);
    c->p.images_per_prompt = ipp;
    assert_int_equal(flexdiag__context_alloc(c), FLEXDIAG_OK);
    *n_pre = c->geo.n_pre;
    int32_t a[6] = {256, 259, 'a', 'b', 260, 261}, bb[4] = {256, 259, 'z', 261};
    int32_t cc[6] = {256, 259, 'q', 'r', 260, 261};
    const int32_t *pp[7] = {a, a, a, bb, bb, bb, cc};
    int32_t np[7] = {6, 6, 6, 4, 4, 4, 6}, forced[7 * 64], tok[7 * 64];
    for (int i = 0; i < 7 * 64; i++) forced[i] = (i * 37 + 11) % 256;
    float *logits = malloc((size_t)7 * 64 * 256 * 4);
    flexdiag_block b = {.n_img = 7, .prompt = pp, .prompt_len = np, .n_steps = 64,
                        .forced = forced, .cfg_weight = 5.0f, .tokens = tok, .logits = logits,
                        .sp = {1.0f, 0, 1.0f, 0}};
    assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_OK);
    /* seven prompts of seven lengths (so seven unconditional rows too): more prompt rows than
     * the context shares */
    if (*n_pre) {
        int32_t d[7][10];
        const int32_t *dp[7];
        int32_t dn[7];
        for (int i = 0; i < 7; i++) {
            for (int k = 0; k < 10; k++) d[i][k] = k == 0 ? 256 : 'a' + k;
            dn[i] = 3 + i;
            d[i][dn[i] - 1] = 261;
            dp[i] = d[i];
        }
        b.prompt = dp, b.prompt_len = dn;
        flexdiag__err_clear();
        assert_int_equal(flexdiag__engine_run(c, &b), FLEXDIAG_ERR_INVALID_ARG);
        assert_non_null(strstr(flexdiag__err_msg(), "images_per_prompt 3"));
        flexdiag__err_clear();
    }
    flexdiag_context_destroy(c);
    return logits;
}

/* Shared prompt KV (images_per_prompt 3: one copy of each distinct prompt row, its prefill run
 * once) gives the logits of every sequence keeping its own prompt rows, bit for bit: dense,
 * window, Diagonal and H2O, in one micro-batch and in micro-batches of 2 images (a prompt's
 * images straddle them), prompts of two lengths and a prompt with one image. A block with
 * more distinct prompt rows than the context shares is refused naming images_per_prompt. */
static void test_shared_prompts(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin(2, &rt, &m);
    const flexdiag_policy_kind kinds[4] = {FLEXDIAG_POLICY_DENSE, FLEXDIAG_POLICY_WINDOW,
                                           FLEXDIAG_POLICY_DIAGONAL, FLEXDIAG_POLICY_H2O};
    for (int i = 0; i < 4; i++)
        for (int micro = 0; micro <= 2; micro += 2) {
            int32_t n0 = -1, n1 = -1;
            float *own = shared_run(m, kinds[i], micro, 0, &n0);
            float *shared = shared_run(m, kinds[i], micro, 3, &n1);
            assert_int_equal(n0, 0);
            assert_int_equal(n1, 8); /* 2 rows x (ceil(7 / 3) + 1) prompts */
            assert_memory_equal(own, shared, (size_t)7 * 64 * 256 * 4);
            free(own);
            free(shared);
        }
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* With sparsity 0 (N_att = L_dec) every policy's teacher-forced logits equal dense bit for bit. */
static void test_sparsity0_is_dense(void **state) {
    (void)state;
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_builtin(2, &rt, &m);
    int32_t prompt[6] = {256, 259, 'h', 'i', 260, 261}, ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (i * 53 + 7) % 256;
    float *ref = NULL;
    for (int k = FLEXDIAG_POLICY_DENSE; k <= FLEXDIAG_POLICY_LINE_AR; k++) {
        flexdiag_context_params cp;
        flexdiag_context_params_init(&cp);
        cp.max_images = 1;
        cp.max_prompt_len = 6;
        cp.policy.kind = (flexdiag_policy_kind)k;
        cp.policy.sparsity = 0.0;
        flexdiag_context *c = NULL;
        assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
        float *l = malloc(64 * 256 * 4);
        assert_int_equal(flexdiag__context_score(c, prompt, 6, ids, 64, 5.0f, l, NULL),
                         FLEXDIAG_OK);
        if (!ref) ref = l;
        else assert_memory_equal(l, ref, 64 * 256 * 4);
        if (l != ref) free(l);
        flexdiag_context_destroy(c);
    }
    free(ref);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

/* An explicit batch over the memory budget fails before any work, naming bytes needed, bytes
 * available and the largest batch that fits; that batch then works. */
static void test_budget(void **state) {
    (void)state;
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    rp.gpu_mem = 24ull << 20; /* 24 MiB: micro-janus weights fit, 1000 images do not */
    flexdiag_runtime *rt = NULL;
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = "micro-janus";
    flexdiag_model *m = NULL;
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1000;
    cp.max_prompt_len = 16;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_OOM_DEVICE);
    const char *msg = flexdiag_last_error(NULL), *p = strstr(msg, "largest batch that fits is ");
    fprintf(stderr, "  %s\n", msg);
    assert_non_null(strstr(msg, "GiB"));
    assert_non_null(p);
    int fit = atoi(p + strlen("largest batch that fits is "));
    assert_true(fit > 0 && fit < 1000);
    assert_int_equal(flexdiag__context_fit(m, &cp, flexdiag__arena_available(&rt->arena)), fit);
    int32_t max_images = -1; /* the public query names the same batch */
    assert_int_equal(flexdiag_context_max_images(m, &cp, &max_images), FLEXDIAG_OK);
    assert_int_equal(max_images, fit);
    cp.max_images = fit + 1;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_ERR_OOM_DEVICE);
    cp.max_images = fit;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    rp.gpu_mem = 0; /* the CPU engine without a budget: nothing to fill */
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    assert_int_equal(flexdiag_model_load(rt, NULL, &mp, &m), FLEXDIAG_OK);
    assert_int_equal(flexdiag_context_max_images(m, &cp, &max_images), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(max_images, 0);
    assert_non_null(strstr(flexdiag_last_error(NULL), "gpu_mem"));
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}

static void test_cli_generate(void **state) {
    (void)state;
    const char *bin = getenv("FLEXDIAG_BIN");
    char *tmp = tu_tempdir("gen");
    assert_int_equal(tu_system("'%s' generate --cpu --arch micro-janus --prompt 'a red apple' "
                               "--images-per-prompt 2 --out '%s/o' --quiet 2>/dev/null",
                               bin, tmp), 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/o/tokens.json", tmp);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    json_t *imgs = json_object_get(j, "images");
    assert_int_equal(json_array_size(imgs), 2);
    json_t *grid = json_object_get(json_array_get(imgs, 1), "grid");
    assert_int_equal(json_array_size(grid), 8);
    assert_int_equal(json_array_size(json_array_get(grid, 0)), 8);
    json_decref(j);
    /* bad flags: exit 2 and a message naming the flag */
    snprintf(path, sizeof path, "%s/err.txt", tmp);
    assert_int_equal(tu_system("'%s' generate --bogus 1 --out '%s' 2>'%s'", bin, tmp, path), 2);
    char *msg = tu_read_file(path, NULL);
    assert_non_null(strstr(msg, "--bogus"));
    free(msg);
    assert_int_equal(tu_system("'%s' generate --batch x --out '%s' 2>/dev/null", bin, tmp), 2);
    assert_int_equal(tu_system("'%s' generate --policy nope --out '%s' 2>'%s'", bin, tmp, path), 2);
    msg = tu_read_file(path, NULL);
    assert_non_null(strstr(msg, "diagonal"));
    free(msg);
    assert_int_equal(tu_system("'%s' generate --model /nonexistent --out '%s' 2>'%s'", bin, tmp,
                               path), 1);
    msg = tu_read_file(path, NULL);
    assert_non_null(strstr(msg, "/nonexistent"));
    free(msg);
    tu_rmtree(tmp);
    free(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_cancel_and_reuse),
        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_device_policy),
        cmocka_unit_test(test_prefill_chunks),
        cmocka_unit_test(test_shared_prompts),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_sparsity0_is_dense),
        cmocka_unit_test(test_cli_generate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
