/*
 * offload_runs.c - the weight-placement scenario (offload_runs.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "base/core.h"
#include "engine/offload_runs.h"
#include "flexdiag.h"
#include "kernels/cpu/cpu_ops.h"
#include "offload/planes_zstd.h"
#include "offload/weight_homes.h"
#include "runtime/engine/engine.h"

#define N_PROMPTS 3
#define PER_PROMPT 2
#define N_IMG (N_PROMPTS * PER_PROMPT)

typedef struct run {
    int32_t *tokens;      /* (N_IMG, per image) */
    float *logits;        /* (n, vocab) of one scored image */
    int32_t per_img, vocab;
    char sched[16];
    uint64_t weights_bytes[3], h2d_bytes, disk_read_bytes, loads;
    uint64_t kv_bytes[3], kv_h2d_bytes, kv_d2h_bytes, kv_disk_read, kv_disk_write;
    uint64_t ca_d2h_bytes, ca_h2d_bytes, ca_kv_bytes; /* CPU attention */
    int32_t host_mb, ca_mb; /* micro-batches homed on the host, attended there */
} run;

static void ok(flexdiag_status st) {
    if (st != FLEXDIAG_OK) fprintf(stderr, "offload_runs: %s\n", flexdiag_last_error(NULL));
    assert_int_equal(st, FLEXDIAG_OK);
}

/* Prompts as ids, valid in every builtin vocabulary (image and text models alike); they end
 * with micro-lumina's image start and size tokens (69, 72, 72), plain ids elsewhere. */
static const int32_t p0[] = {256, 112, 48, 69, 72, 72},
                     p1[] = {256, 97, 32, 108, 111, 110, 103, 69, 72, 72},
                     p2[] = {256, 50, 69, 72, 72};
static const int32_t *const prompt_ids[N_PROMPTS] = {p0, p1, p2};
static const int32_t prompt_lens[N_PROMPTS] = {6, 10, 5};

static void request(flexdiag_request *rq) {
    flexdiag_request_init(rq);
    rq->n_prompts = N_PROMPTS;
    rq->prompt_ids = prompt_ids;
    rq->prompt_lens = prompt_lens;
    rq->images_per_prompt = PER_PROMPT;
    rq->seed = 11;
}

/* While *user is set: cancel the run halfway through its prefill's layers (a pass abandoned
 * part-way, whose loads the scheduler must drop before the next run on the context). */
static bool cancel_half(int phase, uint64_t done, uint64_t total, void *user) {
    return !(*(const int *)user && phase == 0 && done * 2 >= total);
}

/* KV homes and policy of a context (kv all 0: on the device). */
typedef struct kv_case {
    uint32_t kv[3];
    flexdiag_policy_kind kind;
    int cpu_attention;      /* the host attends the host-homed micro-batches */
    const int32_t *score;   /* the image ids to score (NULL: the run's own first image) */
    uint32_t share;         /* cpu_attention_pct (0: all of them) */
} kv_case;

/* One context on m: a cancelled generate (when cancel), the full generate, a scored image. */
static void run_context_kv(flexdiag_model *m, int32_t batch, int32_t micro, int cancel,
                           const kv_case *kc, run *out) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = batch;
    cp.micro_batch = micro;
    cp.max_prompt_len = 32;
    memcpy(cp.kv_pct, kc->kv, sizeof cp.kv_pct);
    cp.policy.kind = kc->kind;
    cp.cpu_attention = kc->cpu_attention;
    cp.cpu_attention_pct = kc->share;
    /* N_att a quarter of the decode length, N_r (Diagonal's ring) half of it: a sparse
     * policy attends fewer ring rows than it keeps */
    cp.policy.sparsity = kc->kind == FLEXDIAG_POLICY_DENSE ? 0.0 : 0.75;
    int armed = cancel;
    cp.progress = cancel_half;
    cp.progress_user = &armed;
    flexdiag_context *c = NULL;
    ok(flexdiag_context_create(m, &cp, &c));
    flexdiag_request rq;
    request(&rq);
    flexdiag_output o = {0};
    ok(flexdiag_generate(c, &rq, &o));
    out->per_img = o.tokens_per_image;
    o.tokens = out->tokens = malloc((size_t)N_IMG * (size_t)o.tokens_per_image * 4);
    if (cancel) { /* then the same context again, its scheduler mid-cycle */
        assert_int_equal(flexdiag_generate(c, &rq, &o), FLEXDIAG_ERR_CANCELLED);
        armed = 0;
    }
    ok(flexdiag_generate(c, &rq, &o));
    flexdiag_score_request sr;
    flexdiag_score_request_init(&sr);
    const int32_t prompt[5] = {1, 5, 69, 72, 72};
    sr.prompt_ids = prompt;
    sr.prompt_len = 5;
    sr.ids = kc->score ? kc->score : out->tokens;
    sr.n = o.tokens_per_image;
    flexdiag_score_output so = {.struct_size = sizeof so};
    ok(flexdiag_score(c, &sr, &so));
    out->vocab = so.vocab;
    so.logits = out->logits = malloc((size_t)sr.n * (size_t)so.vocab * 4);
    ok(flexdiag_score(c, &sr, &so));
    flexdiag_offload_info oi = {.struct_size = sizeof oi};
    ok(flexdiag_context_offload(c, &oi));
    snprintf(out->sched, sizeof out->sched, "%s", oi.scheduler);
    memcpy(out->weights_bytes, oi.weights_bytes, sizeof out->weights_bytes);
    out->h2d_bytes = oi.h2d_bytes;
    out->disk_read_bytes = oi.disk_read_bytes;
    out->loads = oi.loads;
    out->kv_h2d_bytes = oi.kv_h2d_bytes;
    out->kv_d2h_bytes = oi.kv_d2h_bytes;
    out->kv_disk_read = oi.kv_disk_read_bytes;
    out->kv_disk_write = oi.kv_disk_write_bytes;
    assert_int_equal(oi.cpu_attention, kc->cpu_attention);
    out->ca_d2h_bytes = oi.cpu_attn_d2h_bytes;
    out->ca_h2d_bytes = oi.cpu_attn_h2d_bytes;
    out->ca_kv_bytes = oi.cpu_attn_kv_bytes;
    out->host_mb = oi.host_mb;
    out->ca_mb = oi.cpu_attn_mb;
    memcpy(out->kv_bytes, oi.kv_bytes, sizeof out->kv_bytes);
    flexdiag_context_destroy(c);
}

static void run_context(flexdiag_model *m, int32_t batch, int32_t micro, int cancel, run *out) {
    const kv_case device = {{100, 0, 0}, FLEXDIAG_POLICY_DENSE, 0, NULL, 0};
    run_context_kv(m, batch, micro, cancel, &device, out);
}

/* compress: model_params.compress_weights, plus 1 << 8 for runtime_params.compress_disk zstd */
#define ZSTD_DISK (1u << 8)

static void open_model_q(int device, const char *arch, const uint32_t pct[3], const char *dir,
                         uint64_t cpu_mem, uint32_t compress, flexdiag_runtime **rt,
                         flexdiag_model **m) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = device;
    rp.cpu_mem = cpu_mem;
    rp.threads = device < 0 ? 2 : 0;
    rp.offload_dir = dir;
    rp.compress_disk = (compress & ZSTD_DISK) != 0;
    compress &= ~ZSTD_DISK;
    ok(flexdiag_runtime_create(&rp, rt));
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = arch;
    mp.seed = 7;
    memcpy(mp.weights_pct, pct, sizeof mp.weights_pct);
    mp.compress_weights = compress;
    ok(flexdiag_model_load(*rt, NULL, &mp, m));
}

static void open_model(int device, const char *arch, const uint32_t pct[3], const char *dir,
                       uint64_t cpu_mem, flexdiag_runtime **rt, flexdiag_model **m) {
    open_model_q(device, arch, pct, dir, cpu_mem, 0, rt, m);
}

static void same(const run *a, const run *b, const char *what) {
    size_t nt = (size_t)N_IMG * (size_t)a->per_img;
    if (memcmp(a->tokens, b->tokens, nt * 4) || memcmp(a->logits, b->logits,
                                                        (size_t)a->per_img * (size_t)a->vocab * 4))
        fail_msg("placement %s: tokens or logits differ from the resident run", what);
}

static void run_free(run *r) {
    free(r->tokens);
    free(r->logits);
}

void to_run_placements(int device, const char *arch, int32_t batch, int32_t micro,
                       const char *dir) {
    static const uint32_t places[][3] = {{100, 0, 0}, {50, 50, 0}, {0, 100, 0},
                                         {30, 40, 30}, {0, 0, 100}, {73, 0, 27}};
    int n = (int)(sizeof places / sizeof places[0]);
    run ref = {0};
    for (int i = 0; i < n; i++) {
        const uint32_t *p = places[i];
        char what[32];
        snprintf(what, sizeof what, "%u,%u,%u", p[0], p[1], p[2]);
        flexdiag_runtime *rt;
        flexdiag_model *m;
        open_model(device, arch, p, dir, 0, &rt, &m);
        run r = {0};
        run_context(m, batch, micro, i == 3, &r);
        if (i == 0) {
            assert_string_equal(r.sched, "resident");
            ref = r;
        } else {
            assert_string_equal(r.sched, "tiered");
            uint64_t total = ref.weights_bytes[0];
            for (int t = 0; t < 3; t++) { /* realised within 1 % of the request */
                double got = 100.0 * (double)r.weights_bytes[t] / (double)total;
                if (got < p[t] - 1.0 || got > p[t] + 1.0)
                    fail_msg("placement %s: tier %d holds %.2f %%", what, t, got);
            }
            assert_int_equal(r.weights_bytes[0] + r.weights_bytes[1] + r.weights_bytes[2], total);
            assert_true(r.loads > 0 && r.h2d_bytes > 0);
            assert_true((r.disk_read_bytes > 0) == (p[2] > 0));
            same(&ref, &r, what);
            run_free(&r);
        }
        if (i == 1) { /* two contexts on one split model, one after another, then again */
            run a = {0}, b = {0};
            run_context(m, batch, micro, 0, &a);
            run_context(m, batch > 1 ? batch / 2 : 1, 0, 0, &b);
            same(&ref, &a, "50,50,0 (second context)");
            assert_memory_equal(ref.logits, b.logits, (size_t)ref.per_img * ref.vocab * 4);
            run_free(&a);
            run_free(&b);
        }
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
    }
    run_free(&ref);
}

void to_run_kv_homes(int device, const char *arch, int32_t batch, int32_t micro,
                     const char *dir, int quick) {
    /* half the micro-batches on the host, all of them, all on disk, one in each home (quick:
     * the second and the last) */
    static const uint32_t kv[][3] = {{50, 50, 0}, {0, 100, 0}, {0, 0, 100}, {34, 32, 34}};
    enum { N_KV = sizeof kv / sizeof kv[0] };
    static const uint32_t wsplit[3] = {50, 50, 0}, wdev[3] = {100, 0, 0};
    uint64_t moved[FLEXDIAG_POLICY_DIAGONAL_SINK4 + 1] = {0}; /* KV H2D bytes, all on the host */
    for (int k = 0; k <= FLEXDIAG_POLICY_DIAGONAL_SINK4; k++) {
        flexdiag_runtime *rt;
        flexdiag_model *m;
        open_model(device, arch, wdev, dir, 64u << 20, &rt, &m); /* KV homes of all sizes */
        run ref = {0};
        kv_case kc = {{100, 0, 0}, (flexdiag_policy_kind)k, 0, NULL, 0};
        run_context_kv(m, batch, micro, 0, &kc, &ref);
        assert_true(ref.kv_bytes[1] == 0 && ref.kv_h2d_bytes == 0);
        for (int i = 0; i < N_KV; i++) {
            if (quick && (i == 0 || i == 2)) continue; /* all on the host, one in each home */
            char what[64];
            snprintf(what, sizeof what, "--kv %u,%u,%u, policy %s", kv[i][0], kv[i][1], kv[i][2],
                     flexdiag_policy_name((flexdiag_policy_kind)k));
            memcpy(kc.kv, kv[i], sizeof kc.kv);
            run r = {0};
            run_context_kv(m, batch, micro, (i == 1 || i == 2) && k == 0, &kc, &r);
            assert_string_equal(r.sched, "kv-homes");
            assert_true(r.kv_h2d_bytes > 0 && r.kv_d2h_bytes > 0);
            /* only the written row goes back, where the policy writes the same slot in every
             * head (H2O and TOVA write back their resident rows) */
            if (k != FLEXDIAG_POLICY_H2O && k != FLEXDIAG_POLICY_TOVA)
                assert_true(4 * r.kv_d2h_bytes < r.kv_h2d_bytes);
            for (int h = 0; h < 3; h++) /* every asked home holds KV, the others none */
                if ((r.kv_bytes[h] > 0) != (kv[i][h] > 0))
                    fail_msg("%s: %llu KV bytes in home %d", what,
                             (unsigned long long)r.kv_bytes[h], h);
            assert_int_equal(r.kv_bytes[0] + r.kv_bytes[1] + r.kv_bytes[2], ref.kv_bytes[0]);
            /* a disk home reads and writes pages of the file, the others never touch it */
            assert_true((r.kv_disk_read > 0 && r.kv_disk_write > 0) == (kv[i][2] > 0));
            same(&ref, &r, what);
            if (i == 1) moved[k] = r.kv_h2d_bytes;
            if (i == 2 && r.kv_h2d_bytes != moved[k]) /* from disk, the same rows move */
                fail_msg("%s: %llu KV bytes to the device, from the pinned home %llu", what,
                         (unsigned long long)r.kv_h2d_bytes, (unsigned long long)moved[k]);
            run_free(&r);
        }
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
        /* the KV and the weights below the device together: --cpu-mem covers both */
        open_model(device, arch, wsplit, dir, 64u << 20, &rt, &m);
        run r = {0};
        memcpy(kc.kv, kv[1], sizeof kc.kv);
        run_context_kv(m, batch, micro, 0, &kc, &r);
        same(&ref, &r, "--weights 50,50,0 --kv 0,100,0");
        assert_true(r.h2d_bytes > 0 && r.kv_h2d_bytes > 0);
        run_free(&r);
        run_free(&ref);
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
    }
    /* Only attended rows move: every sparse policy at the same N_att reads min(t + 1, N_att)
     * ring rows per (sequence, KV head) at step t (Diagonal and ALISA keep more resident, the
     * Diagonal ring being twice N_att here), so all move the bytes the sliding window moves,
     * and dense more. */
    for (int k = FLEXDIAG_POLICY_DENSE + 1; k <= FLEXDIAG_POLICY_DIAGONAL_SINK4; k++)
        if (moved[k] != moved[FLEXDIAG_POLICY_WINDOW])
            fail_msg("policy %s moved %llu KV bytes to the device, the window %llu",
                     flexdiag_policy_name((flexdiag_policy_kind)k), (unsigned long long)moved[k],
                     (unsigned long long)moved[FLEXDIAG_POLICY_WINDOW]);
    assert_true(moved[FLEXDIAG_POLICY_DENSE] > moved[FLEXDIAG_POLICY_WINDOW]);
}

/* Relative L2 distance of n floats b from a. */
/* The rows placement pct streams packed, packed and unpacked by the plain C reference, in the
 * resident model's device memory (copied down and up through its backend). */
static void round_streamed(flexdiag_model *m, const uint32_t pct[3]) {
    const flexdiag_kernels *k = m->rt->k;
    flexdiag_wcut cut;
    assert_int_equal(flexdiag__weights_plan(&m->cfg, pct, 1, NULL, &cut), FLEXDIAG_OK);
    flexdiag_wpiece pc[FLEXDIAG_WPIECES_MAX];
    int n = flexdiag__wcut_pieces(&cut, pc);
    for (int32_t j = 0; j < m->cfg.lm.layers; j++)
        for (int i = 0; i < n; i++) {
            if (!pc[i].pack) continue;
            char *dev = (char *)m->w.layer0 + (size_t)j * m->w.layer_bytes + pc[i].off;
            uint16_t *w = malloc(pc[i].bytes);
            uint8_t *p = malloc((size_t)pc[i].rows * flexdiag__wq4_row_bytes(pc[i].cols));
            assert_int_equal(k->copy_d2h(w, dev, pc[i].bytes, m->rt->s), FLEXDIAG_OK);
            assert_int_equal(flexdiag__wq4_pack(p, w, pc[i].rows, pc[i].cols, "t"), FLEXDIAG_OK);
            assert_int_equal(flexdiag__cpu_wq4_unpack(w, p, pc[i].rows, pc[i].cols, NULL),
                             FLEXDIAG_OK);
            assert_int_equal(k->copy_h2d(dev, w, pc[i].bytes, m->rt->s), FLEXDIAG_OK);
            assert_int_equal(k->stream_sync(m->rt->s), FLEXDIAG_OK);
            free(w);
            free(p);
        }
}

void to_run_compressed(int device, const char *arch, int32_t batch, int32_t micro,
                       const char *dir) {
    static const uint32_t places[][3] = {{0, 100, 0}, {0, 30, 70}, {50, 50, 0}, {20, 0, 80}};
    static const uint32_t all[3] = {100, 0, 0};
    for (int i = 0; i < (int)(sizeof places / sizeof places[0]); i++) {
        const uint32_t *p = places[i];
        char what[48];
        snprintf(what, sizeof what, "%u,%u,%u compressed", p[0], p[1], p[2]);
        flexdiag_runtime *rt;
        flexdiag_model *m;
        run ref = {0}, r = {0};
        open_model(device, arch, all, dir, 0, &rt, &m);
        round_streamed(m, p);
        run_context(m, batch, micro, 0, &ref);
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
        open_model_q(device, arch, p, dir, 0, 4, &rt, &m);
        run_context(m, batch, micro, i == 1, &r);
        assert_string_equal(r.sched, "tiered");
        uint64_t below = r.weights_bytes[1] + r.weights_bytes[2];
        /* packed: 9/32 of the matrices' bytes (4.5 bits a value); norms stay as they are */
        assert_true(below > 0 && (double)below < 0.3 * (double)ref.weights_bytes[0] *
                                                     (100 - p[0]) / 100.0 + 4096.0 * 64);
        assert_true(r.h2d_bytes > 0);
        same(&ref, &r, what);
        run_free(&ref);
        run_free(&r);
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
    }
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)a[i] * (double)a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

void to_run_cpu_attention(int device, const char *arch, int32_t batch, double tol,
                          int n_kinds, const char *dir) {
    static const flexdiag_policy_kind kinds[] = {FLEXDIAG_POLICY_DENSE, FLEXDIAG_POLICY_WINDOW,
                                                 FLEXDIAG_POLICY_STREAMING};
    static const uint32_t wdev[3] = {100, 0, 0};
    /* 1, 2, all micro-batches on the host; half on the device, half on disk; all on the host,
     * half of them attended there and half streamed to the device */
    const int32_t micro[] = {batch, batch / 2, 1, batch / 2, batch / 2, 1};
    const uint32_t homes[][3] = {{0, 100, 0}, {0, 100, 0}, {0, 100, 0},
                                 {50, 50, 0}, {0, 50, 50},  {0, 100, 0}};
    const uint32_t share[] = {0, 0, 0, 0, 0, 50};
    enum { N_HOMES = sizeof homes / sizeof homes[0] };
    for (int k = 0; k < n_kinds && k < (int)(sizeof kinds / sizeof kinds[0]); k++) {
        flexdiag_runtime *rt;
        flexdiag_model *m;
        open_model(device, arch, wdev, dir, 64u << 20, &rt, &m);
        run ref = {0};
        kv_case kc = {{100, 0, 0}, kinds[k], 0, NULL, 0};
        run_context_kv(m, batch, 0, 0, &kc, &ref);
        kc.score = ref.tokens; /* every run scores the resident run's first image */
        for (int i = 0; i < N_HOMES; i++) {
            char what[96];
            snprintf(what, sizeof what,
                     "--kv %u,%u,%u --cpu-attention (share %u), micro-batch %d, policy %s",
                     homes[i][0], homes[i][1], homes[i][2], share[i], micro[i],
                     flexdiag_policy_name(kinds[k]));
            memcpy(kc.kv, homes[i], sizeof kc.kv);
            kc.cpu_attention = 1;
            kc.share = share[i];
            run r = {0};
            run_context_kv(m, batch, micro[i], i == 2, &kc, &r);
            /* the decode steps move no KV of the micro-batches the host attends: the prompt rows
             * go home once; the device attends a disk-homed micro-batch, or a pinned-homed one
             * past the share, over its streamed rows */
            assert_true(r.ca_kv_bytes > 0 && r.ca_d2h_bytes > 0 && r.ca_h2d_bytes > 0);
            assert_true((r.kv_h2d_bytes > 0) == (homes[i][2] > 0 || share[i] > 0));
            int32_t want = share[i] ? (r.host_mb * (int32_t)share[i] + 99) / 100 : r.host_mb;
            assert_true(r.host_mb > 0);
            assert_int_equal(r.ca_mb, want);
            assert_true(r.kv_d2h_bytes > 0);
            size_t nl = (size_t)ref.per_img * (size_t)ref.vocab;
            double d = rel_l2(ref.logits, r.logits, nl);
            if (tol > 0) printf("cpu attention: %s: scored logits relative L2 %.3g\n", what, d);
            if (tol == 0 ? memcmp(ref.logits, r.logits, nl * 4) != 0 : d > tol)
                fail_msg("%s: scored logits %.3g relative L2 from the resident run's (limit %.3g)",
                         what, d, tol);
            if (tol == 0 && memcmp(ref.tokens, r.tokens, (size_t)N_IMG * ref.per_img * 4))
                fail_msg("%s: tokens differ from the resident run's", what);
            run_free(&r);
        }
        run_free(&ref);
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
    }
}

void to_run_zstd_disk(int device, const char *arch, int32_t batch, int32_t micro,
                      const char *dir) {
    /* placements with disk bytes; the last streams 4-bit groups, so its disk planes are bytes */
    static const uint32_t places[][3] = {{0, 0, 100}, {30, 40, 30}, {73, 0, 27}, {20, 0, 80}};
    static const uint32_t q4[] = {0, 0, 0, 4};
    static const uint32_t all[3] = {100, 0, 0};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    run ref = {0};
    open_model(device, arch, all, dir, 0, &rt, &m);
    run_context(m, batch, micro, 0, &ref);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    for (int i = 0; i < (int)(sizeof places / sizeof places[0]); i++) {
        const uint32_t *p = places[i];
        char what[64];
        snprintf(what, sizeof what, "%u,%u,%u%s, zstd on disk", p[0], p[1], p[2],
                 q4[i] ? " 4-bit" : "");
        run raw = {0}, z = {0}, z2 = {0};
        open_model_q(device, arch, p, dir, 0, q4[i], &rt, &m);
        run_context(m, batch, micro, 0, &raw);
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
        open_model_q(device, arch, p, dir, 0, q4[i] | ZSTD_DISK, &rt, &m);
        run_context(m, batch, micro, i == 1, &z); /* a cancelled run on the zstd tier */
        run_context(m, batch > 1 ? batch / 2 : 1, 0, 0, &z2); /* a second context */
        flexdiag_model_destroy(m);
        flexdiag_runtime_destroy(rt);
        /* the same bytes reach the device: the raw disk tier's tokens and logits */
        same(&raw, &z, what);
        assert_memory_equal(raw.logits, z2.logits, (size_t)raw.per_img * raw.vocab * 4);
        if (!q4[i]) same(&ref, &z, what);
        assert_memory_equal(raw.weights_bytes, z.weights_bytes, sizeof raw.weights_bytes);
        if (i != 1) /* the cancelled run loaded some layers more */
            assert_true(raw.loads == z.loads && raw.h2d_bytes == z.h2d_bytes);
        /* fewer bytes read: bf16 layers store 0.7 of their bytes (4-bit groups barely shrink) */
        if (!(z.disk_read_bytes > 0 && z.disk_read_bytes <= raw.disk_read_bytes))
            fail_msg("%s: %llu bytes read, raw %llu", what, (unsigned long long)z.disk_read_bytes,
                     (unsigned long long)raw.disk_read_bytes);
        if (!q4[i] && !(z.disk_read_bytes * 100 < raw.disk_read_bytes * 85))
            fail_msg("%s: %llu bytes read, raw %llu", what, (unsigned long long)z.disk_read_bytes,
                     (unsigned long long)raw.disk_read_bytes);
        run_free(&raw);
        run_free(&z);
        run_free(&z2);
    }
    run_free(&ref);
}

/* Flip one byte of the first chunk of layer j's record through the store (a page read, changed
 * and written back); *at = the record's byte offset in the store file. */
static void corrupt_record(flexdiag_model *m, int32_t j, uint64_t *at) {
    const flexdiag_weight_homes *h = m->w.homes;
    flexdiag_store *st = m->rt->store;
    char *page = aligned_alloc(FLEXDIAG_STORE_ALIGN, FLEXDIAG_STORE_ALIGN);
    *at = flexdiag__whomes_disk_off(h, j);
    flexdiag_store_ticket t;
    flexdiag_store_req rq = {FLEXDIAG_STORE_READ, *at, FLEXDIAG_STORE_ALIGN, page};
    ok(flexdiag__store_submit(st, &rq, 1, &t));
    ok(flexdiag__store_wait(st, t));
    page[FLEXDIAG_PZ_HDR_BYTES + 100] ^= 0x20; /* in the first plane's bytes */
    rq.op = FLEXDIAG_STORE_WRITE;
    ok(flexdiag__store_submit(st, &rq, 1, &t));
    ok(flexdiag__store_wait(st, t));
    free(page);
}

void to_run_zstd_corrupt(int device, const char *arch, const char *dir) {
    static const uint32_t disk[3] = {0, 0, 100};
    flexdiag_runtime *rt;
    flexdiag_model *m;
    open_model_q(device, arch, disk, dir, 0, ZSTD_DISK, &rt, &m);
    assert_true(m->w.homes && m->w.homes->cut.zstd);
    uint64_t at;
    corrupt_record(m, 1, &at);
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.max_prompt_len = 32;
    flexdiag_context *c = NULL;
    ok(flexdiag_context_create(m, &cp, &c));
    flexdiag_request rq;
    request(&rq);
    rq.n_prompts = 1;
    rq.images_per_prompt = 1;
    flexdiag_output o = {0};
    ok(flexdiag_generate(c, &rq, &o)); /* the sizes */
    o.tokens = malloc((size_t)o.n_images * (size_t)o.tokens_per_image * 4);
    flexdiag_status st = flexdiag_generate(c, &rq, &o);
    free(o.tokens);
    const char *msg = flexdiag_last_error(NULL);
    char want[160];
    /* the checksum field of the record's first chunk, in the file */
    snprintf(want, sizeof want, "the disk part of layer 1's weights: corrupt zstd chunk at byte %llu "
             "of the file: checksum mismatch", (unsigned long long)(at + 48));
    if (st != FLEXDIAG_ERR_CHECKSUM || !strstr(msg, want) ||
        !strstr(msg, flexdiag__store_path(m->rt->store)))
        fail_msg("status %d, message '%s' (wanted '%s' and the store file)", st, msg, want);
    flexdiag_context_destroy(c);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
}
