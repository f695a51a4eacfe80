/*
 * cmd_policy_trace.c - `flexdiag policy-trace`: run one KV policy's state machine (the same code
 * the engine drives) over given attention logits and print, for every step and head, which
 * decode positions were attended, which are resident and which were evicted.
 *
 * Logits come from a float32 .npy [heads, T, Lp + T] (row t of head h: query t's pre-softmax
 * logits over the Lp prompt keys, then decode keys 0..T-1; keys > t are ignored) or from the
 * synthetic grid model (policy/synthetic.h). One sequence, one layer, h_q = h_kv = heads; the
 * policy is resolved with L_dec = T. Output is JSONL on stdout, one object per (step, head):
 *   {"t":3,"head":0,"attended":[0,1,2,3],"resident":[0,1,2,3],"evicted":[]}
 * ("evicted": positions whose row was overwritten at this step). Part of the analysis tool
 * (flexdiag-bench): it replays the host policy state machines, which are library internals.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "bench/bench.h"
#include "cli/cli.h"
#include "cli/npy.h"
#include "policy/kv_policy.h"
#include "policy/kvp_replay.h"
#include "policy/synthetic.h"

#define TRACE_CMD "policy-trace"

typedef struct trace_opts {
    cli_policy_opts po;                 /* --policy, --sparsity, --n-att, --n-r */
    const char *logits, *synthetic;     /* the two logit sources */
    int64_t steps, prompt_len, heads;   /* -1 = from the file (or the synthetic defaults) */
    int64_t seed;                       /* synthetic noise seed */
    double alpha, sigma, prompt_logit;  /* synthetic model */
} trace_opts;

/* The logit tensor and its dims, from either source. */
typedef struct trace_input {
    float *logits;        /* (heads, steps, lp + steps) */
    flexdiag_npy npy;     /* owns logits when read from a file */
    int32_t heads, steps, lp;
} trace_input;

/* ---- inputs ---- */

/* Check shape [heads, T, Lp + T] against the flags that were given (-1 = not given). */
static int check_shape(const trace_opts *o, const flexdiag_npy *a, trace_input *in) {
    const int64_t *s = a->shape;
    if (a->dtype != FLEXDIAG_NPY_F32 || a->ndim != 3) {
        fprintf(stderr, "flexdiag " TRACE_CMD ": --logits %s: expected a float32 array of shape "
                "[heads, T, Lp+T], got rank %d%s\n", o->logits, (int)a->ndim,
                a->dtype != FLEXDIAG_NPY_F32 ? " and a non-float32 dtype" : "");
        return 1;
    }
    int64_t t = o->steps >= 0 ? o->steps : s[1];
    int64_t lp = o->prompt_len >= 0 ? o->prompt_len : s[2] - t;
    char why[160] = "";
    if (s[1] != t)
        snprintf(why, sizeof why, "dimension 1 is T = %lld but --steps is %lld", (long long)s[1],
                 (long long)t);
    else if (s[2] != lp + t || lp < 0)
        snprintf(why, sizeof why, "last dimension %lld must be Lp + T = %lld + %lld%s",
                 (long long)s[2], (long long)lp, (long long)t,
                 o->prompt_len >= 0 ? " (--prompt-len)" : " (T > last dimension)");
    else if (o->heads >= 0 && o->heads != s[0])
        snprintf(why, sizeof why, "dimension 0 is %lld heads but --heads is %lld",
                 (long long)s[0], (long long)o->heads);
    else if (t < 1 || t > 32767 || s[0] < 1)
        snprintf(why, sizeof why, "need heads >= 1 and 1 <= T <= 32767");
    if (why[0]) {
        fprintf(stderr, "flexdiag " TRACE_CMD ": --logits %s: shape [%lld, %lld, %lld] is not "
                "[heads, T, Lp+T]: %s\n", o->logits, (long long)s[0], (long long)s[1],
                (long long)s[2], why);
        return 1;
    }
    in->heads = (int32_t)s[0];
    in->steps = (int32_t)t;
    in->lp = (int32_t)lp;
    in->logits = a->data;
    return 0;
}

/* Every logit a query can see (prompt and keys <= t) must be finite. */
static int check_finite(const trace_opts *o, const trace_input *in) {
    size_t stride = (size_t)in->lp + (size_t)in->steps;
    for (int32_t h = 0; h < in->heads; h++)
        for (int32_t t = 0; t < in->steps; t++) {
            const float *row = in->logits + ((size_t)h * (size_t)in->steps + (size_t)t) * stride;
            for (int32_t k = 0; k <= in->lp + t; k++)
                if (!isfinite(row[k])) {
                    fprintf(stderr, "flexdiag " TRACE_CMD ": --logits %s: non-finite logit at "
                            "head %d, step %d, key %d\n", o->logits, (int)h, (int)t, (int)k);
                    return 1;
                }
        }
    return 0;
}

static int load_file(const trace_opts *o, trace_input *in) {
    if (flexdiag__npy_read(o->logits, &in->npy) != FLEXDIAG_OK) return cli_fail_io(TRACE_CMD);
    if (check_shape(o, &in->npy, in) || check_finite(o, in)) return 1;
    return 0;
}

static int load_synthetic(const trace_opts *o, trace_input *in) {
    int32_t w;
    flexdiag__err_clear();
    if (flexdiag__synth_parse(o->synthetic, &w) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag " TRACE_CMD ": %s\n", flexdiag_last_error(NULL));
        return 2;
    }
    flexdiag_synth_params sp;
    flexdiag__synth_params_init(&sp, w);
    sp.heads = o->heads >= 0 ? (int32_t)o->heads : 1;
    sp.steps = o->steps >= 0 ? (int32_t)o->steps : w * w;
    sp.prompt_len = o->prompt_len >= 0 ? (int32_t)o->prompt_len : 50;
    sp.seed = (uint64_t)o->seed;
    sp.alpha = o->alpha;
    sp.sigma = o->sigma;
    sp.prompt_logit = o->prompt_logit;
    flexdiag_status st = flexdiag__synth_check(&sp); /* before sizing the tensor */
    if (st != FLEXDIAG_OK) return cli_fail(TRACE_CMD, st);
    size_t n = (size_t)sp.heads * (size_t)sp.steps * ((size_t)sp.prompt_len + (size_t)sp.steps);
    in->logits = malloc(n * sizeof(float));
    if (!in->logits) {
        fprintf(stderr, "flexdiag " TRACE_CMD ": cannot allocate %zu MiB of logits\n", n >> 18);
        return 1;
    }
    flexdiag__synth_fill(&sp, in->logits); /* checked above */
    in->heads = sp.heads;
    in->steps = sp.steps;
    in->lp = sp.prompt_len;
    return 0;
}

/* ---- trace ---- */

static void print_list(const char *key, const int32_t *v, int32_t n) {
    printf(",\"%s\":[", key);
    for (int32_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)v[i]);
    putchar(']');
}

static void sort_i32(int32_t *a, int32_t n) {
    for (int32_t i = 1; i < n; i++) {
        int32_t v = a[i], j = i - 1;
        for (; j >= 0 && a[j] > v; j--) a[j + 1] = a[j];
        a[j + 1] = v;
    }
}

/* Positions in before (ascending) missing from after (ascending) into out. */
static int32_t set_minus(const int32_t *before, int32_t nb, const int32_t *after, int32_t na,
                         int32_t *out) {
    int32_t n = 0, j = 0;
    for (int32_t i = 0; i < nb; i++) {
        while (j < na && after[j] < before[i]) j++;
        if (j == na || after[j] != before[i]) out[n++] = before[i];
    }
    return n;
}

/* One JSON line per (t, head); prev holds each head's resident set of the previous step. */
static void trace_run(flexdiag_kvp_replay *r, const trace_input *in, int32_t *prev,
                      int32_t *n_prev, int32_t *cur, int32_t *tmp) {
    int32_t ring = r->ring;
    for (int32_t t = 0; t < in->steps; t++) {
        flexdiag__kvp_replay_step(r, t, in->logits);
        for (int32_t h = 0; h < in->heads; h++) {
            int32_t *pv = prev + (size_t)h * (size_t)ring, n = r->ns[h];
            int32_t nc = flexdiag__kvp_replay_resident(r, h, cur);
            memcpy(tmp, r->att + (size_t)h * (size_t)r->ms, (size_t)n * sizeof(int32_t));
            sort_i32(tmp, n);
            printf("{\"t\":%d,\"head\":%d", (int)t, (int)h);
            print_list("attended", tmp, n);
            print_list("resident", cur, nc);
            print_list("evicted", tmp, set_minus(pv, n_prev[h], cur, nc, tmp));
            puts("}");
            memcpy(pv, cur, (size_t)nc * sizeof(int32_t));
            n_prev[h] = nc;
        }
    }
}

/* The policy pub (checked by check_flags) resolved for L_dec = T, traced step by step. */
static int trace_policy(const flexdiag_policy_params *pub, const trace_input *in) {
    flexdiag_kvp_params kp;
    flexdiag_kvp_replay *r = NULL;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__kvp_resolve(pub, in->steps, &kp);
    if (st == FLEXDIAG_OK) st = flexdiag__kvp_replay_create(&kp, in->heads, in->lp, &r);
    if (st != FLEXDIAG_OK) return cli_fail(TRACE_CMD, st);
    size_t ring = (size_t)r->ring;
    int32_t *prev = malloc((size_t)in->heads * ring * sizeof(int32_t));
    int32_t *n_prev = calloc((size_t)in->heads, sizeof(int32_t));
    int32_t *cur = malloc(ring * sizeof(int32_t)), *tmp = malloc(ring * sizeof(int32_t));
    int rc = 0;
    if (prev && n_prev && cur && tmp) {
        trace_run(r, in, prev, n_prev, cur, tmp);
        if (fflush(stdout) != 0) rc = 1;
    } else {
        fprintf(stderr, "flexdiag " TRACE_CMD ": out of host memory\n");
        rc = 1;
    }
    free(prev);
    free(n_prev);
    free(cur);
    free(tmp);
    flexdiag__kvp_replay_destroy(r);
    return rc;
}

/* Flag checks: ranges, the logit source, and the policy through the library's validation that
 * needs no decode length (the rest runs when T is known); returns 0 or the exit code. */
static int check_flags(const trace_opts *o, flexdiag_policy_params *pub) {
    if (!o->po.policy) {
        fprintf(stderr, "flexdiag " TRACE_CMD ": --policy is required (one of %s)\n",
                flexdiag__kvp_names());
        return 2;
    }
    if (!o->logits == !o->synthetic) {
        fprintf(stderr, "flexdiag " TRACE_CMD ": give exactly one of --logits FILE.npy and "
                "--synthetic grid:W\n");
        return 2;
    }
    if (cli_policy_params(TRACE_CMD, &o->po, pub)) return 2;
    if (o->po.calib || !isnan(o->po.ssd_tau) || flexdiag__kvp_needs_calib(pub->kind)) {
        fprintf(stderr, "flexdiag " TRACE_CMD ": ssd and hack (--calib, --ssd-tau) type their heads "
                "from a model's calibration table, which a replay of logits has not; run them "
                "with generate, bench or bench fidelity\n");
        return 2;
    }
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__kvp_check(pub);
    return st == FLEXDIAG_OK ? 0 : cli_fail(TRACE_CMD, st);
}

int flexdiag_cmd_policy_trace(int argc, char **argv) {
    trace_opts o = {CLI_POLICY_OPTS_INIT, NULL, NULL, -1, -1, -1, 1, 0.5, 0.5, 0.0};
    const cli_opt opts[] = {
        CLI_POLICY_FLAGS(&o.po),
        {.name = "--steps", CLI_INT, &o.steps,
         "decode steps T = L_dec (default: from the file / W*W)",
         CLI_INTS(-1, 32767, "-1 = from the file, or W*W")},
        {.name = "--prompt-len", CLI_INT, &o.prompt_len, "prompt keys Lp (default: file / 50)",
         CLI_INTS(-1, INT32_MAX, "-1 = from the file, or 50")},
        {.name = "--logits", CLI_STR, &o.logits,
         "float32 .npy [heads, T, Lp+T] of pre-softmax logits"},
        {.name = "--synthetic", CLI_STR, &o.synthetic,
         "grid:W, W <= 64: synthetic 2-D locality logits"},
        {.name = "--heads", CLI_INT, &o.heads, "heads (default: file / 1)",
         CLI_INTS(-1, INT32_MAX, "-1 = from the file, or 1")},
        {.name = "--seed", CLI_INT, &o.seed, "synthetic noise seed (default 1)",
         CLI_INTS(0, INT64_MAX, NULL)},
        {.name = "--alpha", CLI_F64, &o.alpha, "synthetic locality strength (default 0.5)"},
        {.name = "--sigma", CLI_F64, &o.sigma, "synthetic logit noise std (default 0.5)"},
        {.name = "--prompt-logit", CLI_F64, &o.prompt_logit, "synthetic prompt logit (default 0)"},
    };
    int rc = cli_parse(TRACE_CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    flexdiag_policy_params pub;
    if ((rc = check_flags(&o, &pub))) return rc;
    trace_input in;
    memset(&in, 0, sizeof in);
    rc = o.logits ? load_file(&o, &in) : load_synthetic(&o, &in);
    if (rc == 0) rc = trace_policy(&pub, &in);
    if (o.logits) flexdiag__npy_free(&in.npy);
    else free(in.logits);
    return rc;
}
