/*
 * cmd_generate.c - `flexdiag generate`: prompts in, image-token grids (and later PNGs) out.
 *
 * Runs through the public API only (runtime -> model -> context -> flexdiag_generate), so the
 * CLI exercises exactly what embedders get. Without --model it uses the builtin tiny-janus
 * model with seeded random weights: the main job runs anywhere, without downloads. Progress
 * (step, tokens/s) goes to stderr, one summary line at the end; the token grids go to
 * --out/tokens.json, written atomically.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "kv_policy.h"

#define DEFAULT_PROMPT "a red apple on a wooden table"
#define MAX_PROMPTS 100000

typedef struct gen_opts {
    cli_model_opts mo;
    cli_policy_opts po;
    const char *prompt, *prompts_file, *out;
    int64_t per_prompt, batch, micro_batch, max_prompt_len, top_k, sample_seed;
    double cfg, temperature, top_p;
    int quiet;
} gen_opts;

typedef struct progress_state {
    double t0, last;     /* start and last print (seconds) */
    uint64_t rows;       /* sequences per step (CFG rows counted) */
    int quiet;
} progress_state;

static bool on_progress(int phase, uint64_t done, uint64_t total, void *user) {
    progress_state *p = user;
    double now = flexdiag__now();
    if (p->quiet || phase != 1 || (now - p->last < 1.0 && done != total)) return true;
    p->last = now;
    fprintf(stderr, "step %llu/%llu  %.1f tok/s\n", (unsigned long long)done,
            (unsigned long long)total, (double)(done * p->rows) / (now - p->t0));
    return true;
}

/* Prompts from --prompt, --prompts FILE (one per line, blank lines skipped) or the default. */
static int load_prompts(const gen_opts *o, char ***out, int *n) {
    *n = 0;
    *out = calloc(MAX_PROMPTS, sizeof **out);
    if (!*out) return 1;
    if (!o->prompts_file) {
        (*out)[(*n)++] = strdup(o->prompt ? o->prompt : DEFAULT_PROMPT);
        return 0;
    }
    FILE *f = fopen(o->prompts_file, "r");
    if (!f) {
        fprintf(stderr, "flexdiag generate: --prompts: cannot open '%s'\n", o->prompts_file);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0 && *n < MAX_PROMPTS) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len > 0) (*out)[(*n)++] = strdup(line);
    }
    free(line);
    fclose(f);
    if (*n == 0) {
        fprintf(stderr, "flexdiag generate: --prompts: '%s' holds no prompt\n", o->prompts_file);
        return 2;
    }
    return 0;
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* out/tokens.json: one record per image with its grid (rows of `grid` ids). */
static int write_tokens(const gen_opts *o, char **prompts, const flexdiag_output *res, int grid) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/tokens.json", o->out);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "flexdiag generate: cannot write '%s'\n", tmp);
        return 1;
    }
    fprintf(f, "{\"tokens_per_image\": %d, \"images\": [\n", res->tokens_per_image);
    for (int i = 0; i < res->n_images; i++) {
        int p = i / (int)o->per_prompt;
        fprintf(f, "{\"prompt_index\": %d, \"sample\": %d, \"prompt\": ", p, i % (int)o->per_prompt);
        json_string(f, prompts[p]);
        fprintf(f, ", \"grid\": [");
        const int32_t *t = res->tokens + (size_t)i * (size_t)res->tokens_per_image;
        for (int r = 0; r < res->tokens_per_image; r++)
            fprintf(f, "%s%d", r % grid ? "," : (r ? "],\n  [" : "\n  ["), t[r]);
        fprintf(f, "]]}%s\n", i + 1 < res->n_images ? "," : "");
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "flexdiag generate: writing '%s' failed\n", path);
        unlink(tmp);
        return 1;
    }
    return 0;
}

static int check_opts(const gen_opts *o) {
    if (!o->out) {
        fprintf(stderr, "flexdiag generate: --out DIR is required\n");
        return 2;
    }
    if (o->prompt && o->prompts_file) {
        fprintf(stderr, "flexdiag generate: give --prompt or --prompts, not both\n");
        return 2;
    }
    if (o->per_prompt < 1 || o->batch < 1 || o->micro_batch < 0 || o->max_prompt_len < 2) {
        fprintf(stderr, "flexdiag generate: --images-per-prompt/--batch must be >= 1, "
                        "--max-prompt-len >= 2\n");
        return 2;
    }
    return 0;
}

static int run(const gen_opts *o, flexdiag_model *m, char **prompts, int n_prompts) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    if (cli_policy_params("generate", &o->po, &cp.policy)) return 2;
    progress_state ps = {.t0 = flexdiag__now(), .quiet = o->quiet};
    cp.max_images = (int32_t)o->batch;
    cp.micro_batch = (int32_t)o->micro_batch;
    cp.max_prompt_len = (int32_t)o->max_prompt_len;
    cp.progress = on_progress;
    cp.progress_user = &ps;
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) return cli_fail("generate", st);
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = n_prompts;
    rq.prompts = (const char *const *)prompts;
    rq.images_per_prompt = (int32_t)o->per_prompt;
    rq.cfg_weight = (float)o->cfg;
    rq.temperature = (float)o->temperature;
    rq.top_k = (int32_t)o->top_k;
    rq.top_p = (float)o->top_p;
    rq.seed = (uint64_t)o->sample_seed;
    flexdiag_output res = {0};
    st = flexdiag_generate(c, &rq, &res); /* size query */
    ps.rows = (uint64_t)(res.n_images < o->batch ? res.n_images : o->batch) * 2;
    res.tokens = st == FLEXDIAG_OK ? malloc((size_t)res.n_images * (size_t)res.tokens_per_image * 4)
                                   : NULL;
    if (st == FLEXDIAG_OK) st = flexdiag_generate(c, &rq, &res);
    int rc = st == FLEXDIAG_OK ? 0 : cli_fail("generate", st);
    flexdiag_stats stats;
    flexdiag_context_stats(c, &stats);
    int grid = 1;
    while ((grid + 1) * (grid + 1) <= res.tokens_per_image) grid++;
    if (grid * grid != res.tokens_per_image) grid = res.tokens_per_image; /* not square: one row */
    if (rc == 0) rc = write_tokens(o, prompts, &res, grid);
    if (rc == 0) {
        double total = stats.prefill_s + stats.decode_s;
        fprintf(stderr,
                "generated %d image(s) x %d tokens in %.2f s (prefill %.2f s, decode %.2f s): "
                "%.1f tok/s, %.3f img/s; KV %.2f MiB/sequence (policy %s); peak device %.2f GiB; "
                "tokens in %s/tokens.json\n",
                res.n_images, res.tokens_per_image, total, stats.prefill_s, stats.decode_s,
                (double)stats.tokens_generated / total, res.n_images / total,
                (double)stats.kv_bytes_per_seq / (1 << 20), flexdiag__kvp_name(cp.policy.kind),
                (double)stats.peak_device_bytes / (1 << 30), o->out);
    }
    free(res.tokens);
    flexdiag_context_destroy(c);
    return rc;
}

int flexdiag_cmd_generate(int argc, char **argv) {
    gen_opts o = {.mo.seed = 1, .per_prompt = 4, .batch = 16, .max_prompt_len = 128,
                  .cfg = 5.0, .temperature = 1.0, .top_p = 1.0, .sample_seed = 0};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&o.mo),
        CLI_POLICY_FLAGS(&o.po),
        {"--prompt", CLI_STR, &o.prompt, "prompt text (default: \"" DEFAULT_PROMPT "\")"},
        {"--prompts", CLI_STR, &o.prompts_file, "file with one prompt per line"},
        {"--images-per-prompt", CLI_INT, &o.per_prompt, "images per prompt (default 4)"},
        {"--out", CLI_STR, &o.out, "output folder (created if missing)"},
        {"--batch", CLI_INT, &o.batch, "images generated together (default 16)"},
        {"--micro-batch", CLI_INT, &o.micro_batch, "images per micro-batch (default: batch)"},
        {"--max-prompt-len", CLI_INT, &o.max_prompt_len, "prompt capacity in tokens (default 128)"},
        {"--cfg", CLI_F64, &o.cfg, "classifier-free guidance weight (default 5.0)"},
        {"--temperature", CLI_F64, &o.temperature, "sampling temperature (default 1.0)"},
        {"--top-k", CLI_INT, &o.top_k, "top-k sampling (default off)"},
        {"--top-p", CLI_F64, &o.top_p, "top-p sampling (default off)"},
        {"--sample-seed", CLI_INT, &o.sample_seed, "sampling seed (default 0)"},
        {"--quiet", CLI_FLAG, &o.quiet, "no progress lines"},
    };
    int rc = cli_parse("generate", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_opts(&o))) return rc;
    if (cli_mkdirs(o.out)) {
        fprintf(stderr, "flexdiag generate: --out: cannot create folder '%s'\n", o.out);
        return 1;
    }
    char **prompts = NULL;
    int n_prompts = 0;
    rc = load_prompts(&o, &prompts, &n_prompts);
    flexdiag_runtime *rt = NULL;
    flexdiag_model *m = NULL;
    if (rc == 0) rc = cli_open_model("generate", &o.mo, &rt, &m);
    if (rc == 0) rc = run(&o, m, prompts, n_prompts);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    for (int i = 0; prompts && i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    return rc;
}
