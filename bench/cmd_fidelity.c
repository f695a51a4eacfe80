/*
 * cmd_fidelity.c - `flexdiag bench fidelity`: attention-output error of every KV policy against
 * dense attention, per requested sparsity, with resident KV rows/bytes and eviction counts.
 *
 * Two runners: synthetic here (--synthetic grid:W, policy/synthetic.h: T = W² decode steps of
 * the 2-D locality model, seeded value vectors, one layer, MHA heads; KL and top-1 need a model
 * head and print "n/a"), and the model-backed one (fidelity_model.c) otherwise. Both fill
 * fidelity.h rows that the printers of fidelity_report.c write, so calls go one way: this file
 * -> fidelity_model.c -> fidelity_report.c. Dense runs once (its sparsity is 0), the Diagonal
 * kinds once per --n-r ring (a comma list); a (policy, sparsity, ring) that fails validation
 * (e.g. streaming with N_att < 5 on a small grid) is reported on stderr and skipped, the other
 * rows still run. The model mode takes --prompt, or --prompts FILE (one a line): each row is
 * then the mean over the prompts' images. --json FILE is opened before
 * anything runs; its rows reach the file through cli/fileio.h (one append + fsync per row, never
 * a partial row), and a row that cannot be written stops the run with exit 1 and one line naming
 * the file (the row is on stdout).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "bench/bench.h"
#include "bench/fidelity.h"
#include "cli/cli.h"
#include "cli/prompts.h"
#include "cli/fileio.h"
#include "policy/kv_policy.h"
#include "policy/synthetic.h"

#define FID_CMD "bench fidelity"
#define FID_MAX_LIST BENCH_MAX_LIST /* policies or sparsities per run */

/* ---- --json ---- */

/* The row printers (fidelity_report.c) write to a stdio stream; for --json that stream is a
 * cookie whose bytes go, whole lines at a time, to the CLI's JSON-lines appender (raw
 * descriptor, one append + fsync per row, a failed row cut off again). */
typedef struct fid_json {
    cli_jsonl out; /* --json FILE */
    char *part;    /* bytes of a line not complete yet, malloc'ed */
    size_t len;    /* bytes in part */
    int failed;    /* an append failed; its message is cli_io_error() */
} fid_json;

/* Cookie write: n bytes at buf; returns n, or 0 once an append failed (the stream's error). */
static ssize_t fid_json_write(void *cookie, const char *buf, size_t n) {
    fid_json *j = cookie;
    char *g = j->failed ? NULL : realloc(j->part, j->len + n);
    if (!g) {
        if (!j->failed) cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", j->out.path);
        j->failed = 1;
        return 0;
    }
    memcpy(g + j->len, buf, n);
    j->part = g;
    j->len += n;
    const char *nl = memrchr(j->part, '\n', j->len);
    size_t whole = nl ? (size_t)(nl - j->part) + 1 : 0;
    if (whole && cli_jsonl_append(&j->out, j->part, whole) != FLEXDIAG_OK) {
        j->failed = 1;
        return 0;
    }
    memmove(j->part, j->part + whole, j->len - whole);
    j->len -= whole;
    return (ssize_t)n;
}

/* --json path as a stream for the printers; NULL after printing the line naming the file. */
static FILE *fid_json_open(fid_json *j, const char *path) {
    memset(j, 0, sizeof *j);
    if (cli_jsonl_open(&j->out, path, 0) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag " FID_CMD ": --json %s\n", cli_io_error());
        return NULL;
    }
    FILE *f = fopencookie(j, "w", (cookie_io_functions_t){.write = fid_json_write});
    if (!f) {
        fprintf(stderr, "flexdiag " FID_CMD ": --json %s: out of memory\n", path);
        (void)cli_jsonl_close(&j->out);
    }
    return f;
}

/* Close f (NULL: no --json); returns rc, or 1 after printing the line of a failed row or
 * close (the rows are on stdout). */
static int fid_json_close(FILE *f, fid_json *j, int rc) {
    if (!f) return rc;
    (void)fclose(f); /* every row was flushed by its printer; a failure is in j->failed */
    if (j->failed) {
        fprintf(stderr, "flexdiag " FID_CMD ": --json %s; the row is on stdout only; stopping\n",
                cli_io_error());
        rc = 1;
    }
    if (cli_jsonl_close(&j->out) != FLEXDIAG_OK && !j->failed) {
        fprintf(stderr, "flexdiag " FID_CMD ": --json %s\n", cli_io_error());
        rc = rc ? rc : 1;
    }
    free(j->part);
    return rc;
}

/* ---- synthetic runner ---- */

typedef struct fid_opts {
    const char *synthetic, *policies, *sparsities, *json, *n_rs;
    int64_t prompt_len, heads, d_head;
    int32_t rings[FID_MAX_LIST]; /* --n-r, parsed (0: the default ring) */
    int n_rings;
    double alpha, sigma, prompt_logit;
    cli_model_opts mo;  /* model-backed mode (no --synthetic); mo.seed seeds everything */
    const char *prompt; /* its prompt text */
    const char *prompts; /* or a file of prompts, one a line: rows are means over them */
    cli_policy_opts po;  /* --calib, --ssd-tau (ssd, hack; model mode) */
} fid_opts;

/* One (policy, sparsity) row; returns 0, 1 on a library error, -1 when skipped. */
static int synth_row(const flexdiag_synth_ctx *ctx, const flexdiag_synth_params *sp,
                     const fid_opts *o, flexdiag_policy_kind kind, double s, int32_t ring,
                     flexdiag_fidelity_row *row) {
    flexdiag_policy_params pub;
    memset(&pub, 0, sizeof pub);
    pub.struct_size = sizeof pub;
    pub.kind = kind;
    pub.sparsity = s;
    pub.n_r = ring;
    flexdiag_kvp_params kp;
    flexdiag__err_clear();
    if (flexdiag__kvp_needs_calib(kind)) {
        fprintf(stderr, "flexdiag " FID_CMD ": skipping %s: the synthetic model has no "
                "calibration table (run it with --model and --calib)\n", flexdiag__kvp_name(kind));
        return -1;
    }
    if (flexdiag__kvp_resolve(&pub, sp->steps, &kp) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag " FID_CMD ": skipping %s at sparsity %g, ring %d: %s\n",
                flexdiag__kvp_name(kind), s, (int)ring, cli_last_error());
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
    for (int i = 0; i < nk; i++)
        total += flexdiag_fidelity_rows_of(kinds[i], ns, o->n_rings);
    for (int i = 0; i < nk; i++)
        for (int r = 0; r < flexdiag_fidelity_rows_of(kinds[i], ns, o->n_rings); r++) {
            flexdiag_fidelity_row row;
            int j = r % ns;
            int32_t ring = bench_has_ring(kinds[i]) ? o->rings[r / ns] : 0;
            fprintf(stderr, "[%d/%d] policy=%s sparsity=%g ring=%d\n", ++done, total,
                    flexdiag__kvp_name(kinds[i]), sps[j], (int)ring);
            int rc = synth_row(ctx, sp, o, kinds[i], sps[j], ring, &row);
            if (rc > 0) return rc;
            if (rc < 0) continue;
            flexdiag_fidelity_md_row(stdout, &row);
            /* a row that cannot be written is reported by fid_json_close */
            if (json && flexdiag_fidelity_jsonl_row(json, &row) != 0) return 1;
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
    sp.seed = (uint64_t)o->mo.seed;
    sp.alpha = o->alpha;
    sp.sigma = o->sigma;
    sp.prompt_logit = o->prompt_logit;
    flexdiag_synth_ctx *ctx = NULL;
    flexdiag_status st = flexdiag__synth_ctx_create(&sp, (int32_t)o->d_head, &ctx);
    if (st != FLEXDIAG_OK) return cli_fail(FID_CMD, st); /* INVALID_ARG names the flag: 2 */
    fid_json fj;
    FILE *json = NULL;
    if (o->json && !(json = fid_json_open(&fj, o->json))) {
        flexdiag__synth_ctx_destroy(ctx);
        return 1;
    }
    int rc = synth_table(ctx, &sp, o, kinds, nk, sps, ns, json);
    rc = fid_json_close(json, &fj, rc);
    flexdiag__synth_ctx_destroy(ctx);
    return rc;
}

/* Ranges of the int flags (the synthetic model's own limits are the library's, naming the
 * flag), then every row's policy through the library's check that needs no decode length: a
 * flag error stops the run; a row that fails only at its decode length is skipped. */
static int check_flags(const fid_opts *o, const flexdiag_policy_kind *kinds, int nk,
                       const double *sps, int ns) {
    if (cli_check_model(FID_CMD, &o->mo)) return 2;
    for (int i = 0; i < nk && !o->synthetic; i++)
        if (flexdiag__kvp_needs_calib(kinds[i]) && !o->po.calib) {
            fprintf(stderr, "flexdiag " FID_CMD ": --policies %s needs --calib FILE, the "
                    "model's calibration table (flexdiag-bench calibrate)\n",
                    flexdiag__kvp_name(kinds[i]));
            return 2;
        }
    for (int i = 0; i < nk; i++)
        for (int r = 0; r < ns * o->n_rings; r++) {
            flexdiag_policy_params pub;
            flexdiag_policy_params_init(&pub);
            pub.kind = kinds[i];
            pub.sparsity = sps[r % ns];
            pub.n_r = bench_has_ring(kinds[i]) ? o->rings[r / ns] : 0;
            flexdiag__err_clear();
            flexdiag_status st = flexdiag__kvp_check(&pub);
            if (st != FLEXDIAG_OK) return cli_fail(FID_CMD, st);
        }
    return 0;
}

/* The model-backed run over --prompt, or --prompts' lines. */
static int model_main(const fid_opts *o, const flexdiag_policy_kind *kinds, int nk,
                      const double *sps, int ns) {
    cli_prompts ps = {0};
    int rc = cli_prompts_load(FID_CMD, CLI_LAYOUT_PLAIN, o->prompts, o->prompt, &ps);
    const char **texts = rc == 0 ? malloc((size_t)ps.n * sizeof *texts) : NULL;
    if (rc == 0 && !texts) rc = cli_fail(FID_CMD, FLEXDIAG_ERR_OOM_HOST);
    for (int i = 0; texts && i < ps.n; i++) texts[i] = ps.p[i].text;
    fid_json fj;
    FILE *json = NULL;
    if (rc == 0 && o->json && !(json = fid_json_open(&fj, o->json))) rc = 1;
    if (rc == 0) {
        rc = flexdiag_fidelity_model(&o->mo, &o->po, texts, ps.n, kinds, nk, sps, ns, o->rings,
                                     o->n_rings, (uint64_t)o->mo.seed, json);
        rc = fid_json_close(json, &fj, rc);
    }
    free(texts);
    cli_prompts_free(&ps);
    return rc;
}

int flexdiag_cmd_bench_fidelity(int argc, char **argv) {
    fid_opts o = {.policies = "dense,window,streaming,h2o,tova,alisa,diagonal,diagonal-sink4",
                  .sparsities = "0.8,0.9,0.925,0.95,0.96", .n_rs = "0", .prompt_len = 50,
                  .heads = 8, .d_head = 64, .alpha = 0.5, .sigma = 0.5, .prompt_logit = 0.0,
                  .mo = {.seed = 1}, .prompt = "a red apple on a wooden table",
                  .po = CLI_POLICY_OPTS_INIT};
    const cli_opt opts[] = {
        {.name = "--synthetic", CLI_STR, &o.synthetic,
         "grid:W, W <= 64: synthetic 2-D locality model"},
        CLI_MODEL_FLAGS_SEED(&o.mo, "seed (default 1) of the random weights, the synthetic "
                                    "noise and values, and the dense run's sampling"),
        {.name = "--prompt", CLI_STR, &o.prompt, "model mode: prompt of the dense reference image"},
        {.name = "--prompts", CLI_STR, &o.prompts,
         "model mode: a file of prompts, one a line; each row is the mean over their images"},
        {.name = "--policies", CLI_STR, &o.policies, "comma list of policies (default: all eight)"},
        {.name = "--sparsities", CLI_STR, &o.sparsities,
         "comma list (default 0.8,0.9,0.925,0.95,0.96)"},
        {.name = "--prompt-len", CLI_INT, &o.prompt_len, "prompt keys (default 50)",
         CLI_INTS(0, 65536, NULL)},
        {.name = "--heads", CLI_INT, &o.heads, "attention heads (default 8)",
         CLI_INTS(1, 1024, NULL)},
        {.name = "--d-head", CLI_INT, &o.d_head, "value vector dims (default 64)",
         CLI_INTS(1, 4096, NULL)},
        {.name = "--n-r", CLI_STR, &o.n_rs,
         "comma list of Diagonal ring sizes, a row each (default 0: "
                                    "max(round(0.5 T), N_att))"},
        {.name = "--alpha", CLI_F64, &o.alpha, "locality strength (default 0.5)"},
        {.name = "--sigma", CLI_F64, &o.sigma, "logit noise std, >= 0 (default 0.5)"},
        {.name = "--prompt-logit", CLI_F64, &o.prompt_logit, "logit of prompt keys (default 0)"},
        {.name = "--json", CLI_STR, &o.json, "append one JSON object per row to FILE"},
        {.name = "--calib", CLI_STR, &o.po.calib,
         "FILE: the model's calibration table, for ssd and hack (flexdiag-bench calibrate)"},
        {.name = "--ssd-tau", CLI_F64, &o.po.ssd_tau,
         "T: ssd's typing threshold (default 0.5; 0: every head spatial)",
         CLI_NUMS(0, 1e9, 0, NULL)},
    };
    int rc = cli_parse(FID_CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if (o.mo.kv) {
        fprintf(stderr, "flexdiag " FID_CMD ": --kv: where the KV cache lives does not change "
                        "fidelity (every home gives the same logits); drop the flag\n");
        return 2;
    }
    flexdiag_policy_kind kinds[FID_MAX_LIST];
    double sps[FID_MAX_LIST];
    int nk, ns;
    if ((rc = bench_parse_policies(FID_CMD, o.policies, kinds, &nk)) != 0) return rc;
    if ((rc = bench_parse_sparsities(FID_CMD, o.sparsities, sps, &ns)) != 0) return rc;
    if ((rc = bench_parse_rings(FID_CMD, o.n_rs, o.rings, &o.n_rings)) != 0) return rc;
    if ((rc = check_flags(&o, kinds, nk, sps, ns)) != 0) return rc;
    if (o.synthetic && o.prompts) {
        fprintf(stderr, "flexdiag " FID_CMD ": --prompts needs a model (--model or --arch); "
                        "--synthetic has no prompt\n");
        return 2;
    }
    if (o.synthetic) return synth_main(&o, kinds, nk, sps, ns);
    return model_main(&o, kinds, nk, sps, ns);
}
