/*
 * cmd_fidelity.c - `flexdiag bench fidelity`: attention-output error of every KV policy against
 * dense attention, per requested sparsity, with resident KV rows/bytes and eviction counts.
 *
 * Two runners: synthetic here (--synthetic grid:W, policy/synthetic.h: T = W² decode steps of
 * the 2-D locality model, seeded value vectors, one layer, MHA heads; KL and top-1 need a model
 * head and print "n/a"), and the model-backed one (fidelity_model.c) otherwise. Both fill
 * fidelity.h rows that the printers of fidelity_report.c write, so calls go one way: this file
 * -> fidelity_model.c -> fidelity_report.c. Dense runs once (its sparsity is 0); a (policy,
 * sparsity) pair that fails validation (e.g. streaming with N_att < 5 on a small grid) is
 * reported on stderr and skipped, the other rows still run.
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
#include "policy/synthetic.h"

#define FID_CMD "bench fidelity"
#define FID_MAX_LIST BENCH_MAX_LIST /* policies or sparsities per run */

/* ---- synthetic runner ---- */

typedef struct fid_opts {
    const char *synthetic, *policies, *sparsities, *json;
    int64_t prompt_len, heads, d_head, seed, n_r;
    double alpha, sigma, prompt_logit;
    cli_model_opts mo;  /* model-backed mode (no --synthetic) */
    const char *prompt; /* its prompt text */
} fid_opts;

/* One (policy, sparsity) row; returns 0, 1 on a library error, -1 when skipped. */
static int synth_row(const flexdiag_synth_ctx *ctx, const flexdiag_synth_params *sp,
                     const fid_opts *o, flexdiag_policy_kind kind, double s,
                     flexdiag_fidelity_row *row) {
    flexdiag_policy_params pub;
    memset(&pub, 0, sizeof pub);
    pub.struct_size = sizeof pub;
    pub.kind = kind;
    pub.sparsity = s;
    pub.n_r = (int32_t)o->n_r;
    flexdiag_kvp_params kp;
    flexdiag__err_clear();
    if (flexdiag__kvp_resolve(&pub, sp->steps, &kp) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag " FID_CMD ": skipping %s at sparsity %g: %s\n",
                flexdiag__kvp_name(kind), s, flexdiag_last_error(NULL));
        return -1;
    }
    flexdiag_synth_fidelity f;
    flexdiag_status st = flexdiag__synth_run(ctx, &kp, &f);
    if (st != FLEXDIAG_OK) return cli_fail(FID_CMD, st);
    *row = (flexdiag_fidelity_row){
        .mode = "synthetic", .source = o->synthetic, .kind = kind,
        .sparsity = kind == FLEXDIAG_POLICY_DENSE ? 0.0 : s,
        .reported_sparsity = flexdiag__kvp_reported_sparsity(&kp), .n_att = kp.n_att,
        .n_r = kp.n_r, .l_dec = sp->steps, .prompt_len = sp->prompt_len, .heads = sp->heads,
        .d_head = (int32_t)o->d_head, .seed = sp->seed, .attn_err = f.attn_err,
        .attn_err_max = f.attn_err_max, .kl = NAN, .top1 = NAN,
        .resident_rows = f.resident_rows, .resident_bytes = f.resident_bytes,
        .evictions = f.evictions};
    return 0;
}

/* Every policy x sparsity (dense once): markdown to stdout, JSONL to json (may be NULL). */
static int synth_table(const flexdiag_synth_ctx *ctx, const flexdiag_synth_params *sp,
                       const fid_opts *o, const flexdiag_policy_kind *kinds, int nk,
                       const double *sps, int ns, FILE *json) {
    printf("synthetic %s: T %d, prompt %d, heads %d, d_head %d, alpha %g, sigma %g, "
           "prompt logit %g, seed %llu; KL/top-1 need a model (n/a)\n\n", o->synthetic,
           (int)sp->steps, (int)sp->prompt_len, (int)sp->heads, (int)o->d_head, sp->alpha,
           sp->sigma, sp->prompt_logit, (unsigned long long)sp->seed);
    flexdiag_fidelity_md_header(stdout);
    int total = 0, done = 0;
    for (int i = 0; i < nk; i++) total += kinds[i] == FLEXDIAG_POLICY_DENSE ? 1 : ns;
    for (int i = 0; i < nk; i++)
        for (int j = 0; j < (kinds[i] == FLEXDIAG_POLICY_DENSE ? 1 : ns); j++) {
            flexdiag_fidelity_row row;
            fprintf(stderr, "[%d/%d] policy=%s sparsity=%g\n", ++done, total,
                    flexdiag__kvp_name(kinds[i]), sps[j]);
            int rc = synth_row(ctx, sp, o, kinds[i], sps[j], &row);
            if (rc > 0) return rc;
            if (rc < 0) continue;
            flexdiag_fidelity_md_row(stdout, &row);
            if (json && flexdiag_fidelity_jsonl_row(json, &row) != 0) {
                fprintf(stderr, "flexdiag " FID_CMD ": --json: write failed\n");
                return 1;
            }
        }
    return 0;
}

static int synth_main(const fid_opts *o, const flexdiag_policy_kind *kinds, int nk,
                      const double *sps, int ns) {
    int32_t w;
    flexdiag__err_clear();
    if (flexdiag__synth_parse(o->synthetic, &w) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag " FID_CMD ": %s\n", flexdiag_last_error(NULL));
        return 2;
    }
    flexdiag_synth_params sp;
    flexdiag__synth_params_init(&sp, w);
    sp.prompt_len = (int32_t)o->prompt_len;
    sp.heads = (int32_t)o->heads;
    sp.seed = (uint64_t)o->seed;
    sp.alpha = o->alpha;
    sp.sigma = o->sigma;
    sp.prompt_logit = o->prompt_logit;
    if (o->prompt_len != sp.prompt_len || o->heads != sp.heads || o->d_head != (int32_t)o->d_head) {
        fprintf(stderr, "flexdiag " FID_CMD ": --prompt-len %lld, --heads %lld or --d-head %lld "
                "out of range\n", (long long)o->prompt_len, (long long)o->heads,
                (long long)o->d_head);
        return 2;
    }
    flexdiag_synth_ctx *ctx = NULL;
    flexdiag_status st = flexdiag__synth_ctx_create(&sp, (int32_t)o->d_head, &ctx);
    if (st != FLEXDIAG_OK) return cli_fail(FID_CMD, st);
    FILE *json = NULL;
    if (o->json && !(json = fopen(o->json, "a"))) {
        fprintf(stderr, "flexdiag " FID_CMD ": --json %s: cannot open for appending\n", o->json);
        flexdiag__synth_ctx_destroy(ctx);
        return 1;
    }
    int rc = synth_table(ctx, &sp, o, kinds, nk, sps, ns, json);
    if (json && fclose(json) != 0 && rc == 0) rc = 1;
    flexdiag__synth_ctx_destroy(ctx);
    return rc;
}

int flexdiag_cmd_bench_fidelity(int argc, char **argv) {
    fid_opts o = {NULL, "dense,window,streaming,h2o,tova,alisa,diagonal,diagonal-sink4",
                  "0.8,0.9,0.925,0.95,0.96", NULL, 50, 8, 64, 1, 0, 0.5, 0.5, 0.0,
                  {.seed = 1}, "a red apple on a wooden table"};
    const cli_opt opts[] = {
        {"--synthetic", CLI_STR, &o.synthetic, "grid:W - synthetic 2-D locality model"},
        CLI_MODEL_FLAGS(&o.mo),
        {"--prompt", CLI_STR, &o.prompt, "model mode: prompt of the dense reference image"},
        {"--policies", CLI_STR, &o.policies, "comma list of policies (default: all eight)"},
        {"--sparsities", CLI_STR, &o.sparsities, "comma list (default 0.8,0.9,0.925,0.95,0.96)"},
        {"--prompt-len", CLI_INT, &o.prompt_len, "prompt keys (default 50)"},
        {"--heads", CLI_INT, &o.heads, "attention heads (default 8)"},
        {"--d-head", CLI_INT, &o.d_head, "value vector dims (default 64)"},
        {"--seed", CLI_INT, &o.seed, "noise and value seed (default 1)"},
        {"--n-r", CLI_INT, &o.n_r, "Diagonal ring size (default max(round(0.5 T), N_att))"},
        {"--alpha", CLI_F64, &o.alpha, "locality strength (default 0.5)"},
        {"--sigma", CLI_F64, &o.sigma, "logit noise std (default 0.5)"},
        {"--prompt-logit", CLI_F64, &o.prompt_logit, "logit of prompt keys (default 0)"},
        {"--json", CLI_STR, &o.json, "append one JSON object per row to FILE"},
    };
    int rc = cli_parse(FID_CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    flexdiag_policy_kind kinds[FID_MAX_LIST];
    double sps[FID_MAX_LIST];
    int nk, ns;
    if ((rc = bench_parse_policies(FID_CMD, o.policies, kinds, &nk)) != 0) return rc;
    if ((rc = bench_parse_sparsities(FID_CMD, o.sparsities, sps, &ns)) != 0) return rc;
    if (o.n_r < 0 || o.n_r > 32767) {
        fprintf(stderr, "flexdiag " FID_CMD ": --n-r %lld must be in [0, 32767]\n",
                (long long)o.n_r);
        return 2;
    }
    if (o.synthetic) return synth_main(&o, kinds, nk, sps, ns);
    FILE *json = NULL;
    if (o.json && !(json = fopen(o.json, "a"))) {
        fprintf(stderr, "flexdiag " FID_CMD ": --json %s: cannot open for appending\n", o.json);
        return 1;
    }
    rc = flexdiag_fidelity_model(&o.mo, o.prompt, kinds, nk, sps, ns, (int32_t)o.n_r,
                                 (uint64_t)o.seed, json);
    if (json && fclose(json) != 0 && rc == 0) rc = 1;
    return rc;
}
