/*
 * fidelity_model.c - model-backed `flexdiag bench fidelity`: every policy teacher-forced on the
 * dense run's tokens, compared with dense.
 *
 * Flow: one dense generation per image (sampled, seed-keyed) gives the token sequence T and the
 * dense CFG logits and per-layer attention outputs along it; then, per policy and sparsity, the
 * same prompt is scored teacher-forced on T under that policy. Per step: KL(dense ‖ policy) of
 * the CFG image-token distribution (softmax of the logits, T = 1), top-1 agreement of the two
 * argmaxes, and the relative L2 error of the attention output of every layer (sequence 0, the
 * conditional row). Because the runs are teacher-forced, every difference comes from the KV
 * policy alone. Resident KV per sequence: all layers, K+V, bf16, prompt + the policy's peak
 * decode rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "bench/bench.h"
#include "bench/fidelity.h"
#include "cli/cli.h"
#include "policy/kv_policy.h"
#include "policy/kvp_calib.h"
#include "runtime/engine/engine.h"
#include "runtime/text/prompt.h"

typedef struct dense_ref {
    int32_t *prompt, np;  /* conditional prompt ids */
    int32_t *tokens, n;   /* dense tokens (n) */
    float *logits;        /* (n, V) CFG logits */
    float *attn;          /* (n - 1, layers, h_q d_h) attention outputs */
    int64_t V, attn_w;    /* vocabulary, attention row width (layers · h_q · d_h) */
} dense_ref;

/* KL(p ‖ q) of softmax(a) and softmax(b) in double; argmax agreement through *same. */
static double kl_softmax(const float *a, const float *b, int64_t V, int *same) {
    double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0, kl = 0;
    int64_t ia = 0, ib = 0;
    for (int64_t i = 0; i < V; i++) {
        if (a[i] > ma) ma = a[i], ia = i;
        if (b[i] > mb) mb = b[i], ib = i;
    }
    for (int64_t i = 0; i < V; i++) {
        sa += exp(a[i] - ma);
        sb += exp(b[i] - mb);
    }
    double la = log(sa), lb = log(sb);
    for (int64_t i = 0; i < V; i++) {
        double lpa = a[i] - ma - la, lpb = b[i] - mb - lb;
        kl += exp(lpa) * (lpa - lpb);
    }
    *same = ia == ib;
    return kl > 0 ? kl : 0;
}

static double rel_err(const float *got, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static flexdiag_context *fid_context(flexdiag_model *m, const flexdiag_policy_params *pol,
                                     const cli_policy_opts *po, int32_t np) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = np;
    cp.policy = *pol;
    cli_policy_calib(po, &cp);
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) cli_fail("bench fidelity", st);
    return c;
}

/* Teacher-forced run of ref's tokens under c's policy: CFG logits and attention outputs. */
static flexdiag_status forced_run(flexdiag_context *c, const dense_ref *ref, const int32_t *forced,
                                  float *logits, float *attn, int32_t *tokens, uint64_t seed) {
    const int32_t *pp = ref->prompt;
    flexdiag_block b = {.n_img = 1, .prompt = &pp, .prompt_len = &ref->np, .n_steps = ref->n,
                        .forced = forced, .cfg_weight = 5.0f, .tokens = tokens,
                        .logits = logits, .attn_out = attn, .sp = {1.0f, 0, 1.0f, seed}};
    return flexdiag__engine_run(c, &b);
}

/* The dense reference: the sampled image with its CFG logits and attention outputs. */
static int dense_reference(flexdiag_model *m, const char *prompt, uint64_t seed, dense_ref *ref) {
    int64_t np = 0;
    flexdiag_status st = flexdiag__prompt_ids(m, prompt, 1, &ref->prompt, &np);
    if (st != FLEXDIAG_OK) return cli_fail("bench fidelity", st);
    ref->np = (int32_t)np;
    flexdiag_policy_params dense;
    flexdiag_policy_params_init(&dense);
    const cli_policy_opts none = CLI_POLICY_OPTS_INIT;
    flexdiag_context *c = fid_context(m, &dense, &none, ref->np);
    if (!c) return 1;
    const flexdiag_lm_config *l = &m->cfg.lm;
    ref->n = c->geo.l_dec;
    ref->V = c->geo.vocab_out;
    ref->attn_w = (int64_t)l->layers * l->heads * l->head_dim;
    ref->tokens = malloc((size_t)ref->n * 4);
    ref->logits = malloc((size_t)ref->n * (size_t)ref->V * 4);
    ref->attn = malloc((size_t)(ref->n - 1 > 0 ? ref->n - 1 : 1) * (size_t)ref->attn_w * 4);
    st = ref->tokens && ref->logits && ref->attn ? FLEXDIAG_OK : FLEXDIAG_ERR_OOM_HOST;
    if (st == FLEXDIAG_OK) st = forced_run(c, ref, NULL, ref->logits, ref->attn, ref->tokens, seed);
    flexdiag_context_destroy(c);
    return st == FLEXDIAG_OK ? 0 : cli_fail("bench fidelity", st);
}

/* A head-typed policy's plan, once per row on stderr: how many KV heads of each type. */
static void print_heads(const flexdiag_context *c, const char *prefix) {
    const flexdiag_kvp_heads *h = c->heads;
    if (!h) return;
    fprintf(stderr, "%s%s at N_att %d: %d window, %d semantic, %d lag-list KV heads of %d "
            "(B_S %d, B_C %d, lag ring %d)\n", prefix, flexdiag__kvp_name(h->kind), h->n_att,
            h->n_heads[FLEXDIAG_HEAD_WINDOW], h->n_heads[FLEXDIAG_HEAD_SEMANTIC],
            h->n_heads[FLEXDIAG_HEAD_LAGS], h->n_layers * h->h_kv, h->b_s, h->b_c, h->lag_ring);
}

static int policy_row(flexdiag_model *m, const dense_ref *ref, flexdiag_fidelity_row *row,
                      const flexdiag_policy_params *pol, const cli_policy_opts *po, int first) {
    flexdiag_context *c = fid_context(m, pol, po, ref->np);
    if (!c) return 1;
    if (first) print_heads(c, "flexdiag bench fidelity: ");
    const flexdiag_lm_config *l = &m->cfg.lm;
    float *logits = malloc((size_t)ref->n * (size_t)ref->V * 4);
    float *attn = malloc((size_t)(ref->n - 1 > 0 ? ref->n - 1 : 1) * (size_t)ref->attn_w * 4);
    int32_t *tok = malloc((size_t)ref->n * 4);
    flexdiag_status st = logits && attn && tok ? FLEXDIAG_OK : FLEXDIAG_ERR_OOM_HOST;
    if (st == FLEXDIAG_OK) st = forced_run(c, ref, ref->tokens, logits, attn, tok, row->seed);
    if (st == FLEXDIAG_OK) {
        double kl = 0, top1 = 0, err = 0, err_max = 0;
        int64_t lw = (int64_t)l->heads * l->head_dim, na = (int64_t)(ref->n - 1) * l->layers;
        for (int32_t t = 0; t < ref->n; t++) {
            int same = 0;
            kl += kl_softmax(ref->logits + (size_t)t * (size_t)ref->V,
                             logits + (size_t)t * (size_t)ref->V, ref->V, &same);
            top1 += same;
        }
        for (int64_t i = 0; i < na; i++) {
            double e = rel_err(attn + i * lw, ref->attn + i * lw, lw);
            err += e;
            err_max = e > err_max ? e : err_max;
        }
        row->kl = kl / ref->n;
        row->top1 = top1 / ref->n;
        row->attn_err = na ? err / (double)na : 0;
        row->attn_err_max = err_max;
        const flexdiag_kvp_params *kp = &c->pd.kp; /* the policy as the context resolved it */
        row->kind = kp->kind;
        row->n_att = kp->n_att;
        row->n_r = kp->n_r;
        row->reported_sparsity = flexdiag__kvp_reported_sparsity(kp);
        row->resident_rows = ref->np + flexdiag__kvp_resident_rows(kp, ref->n - 1);
        row->resident_bytes = (uint64_t)row->resident_rows * 2 * 2 * (uint64_t)l->kv_heads *
                              (uint64_t)l->head_dim * (uint64_t)l->layers;
        row->evictions = c->stats.evictions;
    }
    free(logits);
    free(attn);
    free(tok);
    flexdiag_context_destroy(c);
    return st == FLEXDIAG_OK ? 0 : cli_fail("bench fidelity", st);
}

/* Row r of the table (kinds x sparsities x rings, fidelity.h flexdiag_fidelity_rows_of) as a
 * policy. */
static flexdiag_policy_params row_policy(const flexdiag_policy_kind *kinds, int nk,
                                         const double *sps, int ns, const int32_t *rings,
                                         int n_rings, int r) {
    flexdiag_policy_params pol;
    flexdiag_policy_params_init(&pol);
    int i = 0;
    while (i < nk && r >= flexdiag_fidelity_rows_of(kinds[i], ns, n_rings))
        r -= flexdiag_fidelity_rows_of(kinds[i++], ns, n_rings);
    pol.kind = kinds[i];
    pol.sparsity = kinds[i] == FLEXDIAG_POLICY_DENSE ? 0 : sps[r % ns];
    pol.n_r = bench_has_ring(kinds[i]) ? rings[r / ns] : 0;
    return pol;
}

/* Fold prompt k's row one into the running row sum (k = 0 starts it). */
static void row_add(flexdiag_fidelity_row *sum, const flexdiag_fidelity_row *one, int k) {
    if (k == 0) {
        *sum = *one;
        return;
    }
    sum->attn_err += one->attn_err;
    sum->attn_err_max = one->attn_err_max > sum->attn_err_max ? one->attn_err_max
                                                              : sum->attn_err_max;
    sum->kl += one->kl;
    sum->top1 += one->top1;
    sum->prompt_len += one->prompt_len;
    sum->resident_rows += one->resident_rows;
    sum->resident_bytes += one->resident_bytes;
    sum->evictions += one->evictions;
}

/* The sum of n prompts' rows into their mean (the largest attention error stays the largest). */
static void row_mean(flexdiag_fidelity_row *r, int n) {
    r->attn_err /= n;
    r->kl /= n;
    r->top1 /= n;
    r->prompt_len = (int32_t)((r->prompt_len + n / 2) / n);
    r->resident_rows = (r->resident_rows + n / 2) / n;
    r->resident_bytes = (r->resident_bytes + (uint64_t)n / 2) / (uint64_t)n;
    r->evictions = (r->evictions + (uint64_t)n / 2) / (uint64_t)n;
    r->prompts = n;
}

int flexdiag_fidelity_model(const cli_model_opts *mo, const cli_policy_opts *po,
                            const char *const *prompts, int n_prompts,
                            const flexdiag_policy_kind *kinds, int nk, const double *sps, int ns,
                            const int32_t *rings, int n_rings, uint64_t seed, FILE *json) {
    flexdiag_runtime *rt = NULL;
    flexdiag_model *m = NULL;
    int rc = cli_open_model("bench fidelity", mo, &rt, &m);
    if (rc == 0 && m->cfg.arch != FLEXDIAG_ARCH_JANUS) {
        fprintf(stderr, "flexdiag bench fidelity: the model-backed mode needs a Janus model\n");
        rc = 2;
    }
    int rows = 0;
    for (int i = 0; i < nk; i++) rows += flexdiag_fidelity_rows_of(kinds[i], ns, n_rings);
    flexdiag_fidelity_row *sum = calloc((size_t)rows, sizeof *sum);
    char *skip = calloc((size_t)rows, 1);
    if (rc == 0 && (!sum || !skip)) rc = cli_fail("bench fidelity", FLEXDIAG_ERR_OOM_HOST);
    /* prompt-major: one dense reference in memory at a time; a row is printed once its last
     * prompt is in (with one prompt, as it finishes) */
    for (int k = 0; rc == 0 && k < n_prompts; k++) {
        dense_ref ref = {0};
        rc = dense_reference(m, prompts[k], seed, &ref);
        if (rc == 0 && k == 0) {
            printf("fidelity on %s (%s backend), ", mo->model ? mo->model : m->cfg.name,
                   rt->k->name);
            if (n_prompts == 1) printf("prompt \"%s\" (%d tokens), ", prompts[0], ref.np);
            else printf("%d prompts (means over them), ", n_prompts);
            printf("%d teacher-forced image tokens, sampling seed %llu\n\n", ref.n,
                   (unsigned long long)seed);
            flexdiag_fidelity_md_header(stdout);
        }
        if (rc == 0 && n_prompts > 1)
            fprintf(stderr, "flexdiag bench fidelity: prompt %d/%d\n", k + 1, n_prompts);
        for (int r = 0; rc == 0 && r < rows; r++) {
            flexdiag_policy_params pol = row_policy(kinds, nk, sps, ns, rings, n_rings, r);
            flexdiag_kvp_params kp;
            flexdiag__err_clear();
            if (skip[r] || flexdiag__kvp_resolve(&pol, ref.n, &kp) != FLEXDIAG_OK) {
                if (!skip[r])
                    fprintf(stderr, "flexdiag bench fidelity: skipping %s at sparsity %g, ring "
                            "%d: %s\n", flexdiag__kvp_name(pol.kind), pol.sparsity,
                            (int)pol.n_r, cli_last_error());
                skip[r] = 1;
                continue;
            }
            flexdiag_fidelity_row row = {.mode = "model", .source = mo->model ? mo->model
                                                                                : m->cfg.name,
                                         .sparsity = pol.sparsity, .l_dec = ref.n,
                                         .prompt_len = ref.np, .heads = m->cfg.lm.heads,
                                         .d_head = m->cfg.lm.head_dim, .seed = seed};
            rc = policy_row(m, &ref, &row, &pol, po, k == 0);
            if (rc) break;
            row_add(&sum[r], &row, k);
            if (k < n_prompts - 1) continue;
            row_mean(&sum[r], n_prompts);
            flexdiag_fidelity_md_row(stdout, &sum[r]);
            if (json && flexdiag_fidelity_jsonl_row(json, &sum[r]) != 0) rc = 1;
        }
        free(ref.prompt);
        free(ref.tokens);
        free(ref.logits);
        free(ref.attn);
    }
    free(sum);
    free(skip);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return rc;
}
