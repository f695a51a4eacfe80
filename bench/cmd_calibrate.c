/*
 * cmd_calibrate.c - `flexdiag-bench calibrate`: the calibration table of an image model for the
 * head-typed policies ssd and hack (docs/policies.md §7.2). Dense generation (the internal
 * collector kind FLEXDIAG__POLICY_CALIBRATE: dense attention, the profile summed in its policy
 * state) of the first --n-cal prompts of --prompts, one image at a time, sampled with --seed
 * (prompt i is image i of the sampling key) and CFG; then the table (policy/kvp_calib.h) is
 * stamped with the model's config hash, the prompt file's FNV-1a 64, n_cal, the seed and the
 * backend, written to --out, and summarised: per sparsity, the head types ssd (tau 0.5) and
 * hack would use.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "bench/bench.h"
#include "cli/cli.h"
#include "cli/prompts.h"
#include "policy/kvp_calib.h"
#include "runtime/engine/ctx_calib.h"
#include "runtime/engine/engine.h"
#include "runtime/text/prompt.h"

#define CMD "calibrate"

typedef struct cal_opts {
    cli_model_opts mo;   /* --model etc.; mo.seed: the sampling seed (and random weights) */
    const char *prompts; /* --prompts FILE, one a line */
    const char *out;     /* --out FILE */
    int64_t n_cal;       /* --n-cal N */
    double cfg;          /* --cfg W */
} cal_opts;

/* FNV-1a 64 of the file's bytes into *h; 0, or 1 after a message. */
static int file_hash(const char *path, uint64_t *h) {
    FILE *f = fopen(path, "rb");
    if (!f) return cli_errorf(CMD, 2, "--prompts %s: cannot read it", path);
    unsigned char buf[65536];
    size_t n;
    *h = FLEXDIAG_FNV_BASIS;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) *h = flexdiag__fnv1a64(*h, buf, n);
    int bad = ferror(f);
    fclose(f);
    return bad ? cli_errorf(CMD, 1, "--prompts %s: read error", path) : 0;
}

/* The prompts' ids (n of them) and the longest; 0 or an exit code after a message. */
static int prompt_ids(flexdiag_model *m, const cli_prompts *ps, int n, int32_t **ids,
                      int32_t *len, int32_t *longest) {
    *longest = 1;
    for (int i = 0; i < n; i++) {
        int64_t np = 0;
        flexdiag__err_clear();
        flexdiag_status st = flexdiag__prompt_ids(m, ps->p[i].text, 1, &ids[i], &np);
        if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
        len[i] = (int32_t)np;
        *longest = len[i] > *longest ? len[i] : *longest;
    }
    return 0;
}

/* One dense image of every prompt through the collector; its table (identity not set). */
static int collect(flexdiag_model *m, const cal_opts *o, int32_t *const *ids,
                   const int32_t *len, int32_t longest, flexdiag_kvp_calib **tab) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 1;
    cp.max_prompt_len = longest;
    cp.policy.kind = FLEXDIAG__POLICY_CALIBRATE;
    flexdiag_context *c = NULL;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    if (c->geo.rows_per_img != 2) {
        flexdiag_context_destroy(c);
        return cli_errorf(CMD, 2, "the model generates text: calibration is for image models");
    }
    int32_t *tokens = malloc((size_t)c->geo.l_dec * 4);
    st = tokens ? FLEXDIAG_OK : FLEXDIAG_ERR_OOM_HOST;
    double t0 = cli_now();
    for (int i = 0; st == FLEXDIAG_OK && i < (int)o->n_cal; i++) {
        const int32_t *p = ids[i];
        flexdiag_block b = {.n_img = 1, .prompt = &p, .prompt_len = &len[i],
                            .n_steps = c->geo.l_dec, .img0 = i, .cfg_weight = (float)o->cfg,
                            .sp = {1.0f, 0, 1.0f, (uint64_t)o->mo.seed, 0}, .tokens = tokens};
        st = flexdiag__engine_run(c, &b);
        fprintf(stderr, "flexdiag-bench " CMD ": image %d/%d (%.1f s)\n", i + 1, (int)o->n_cal,
                cli_now() - t0);
    }
    if (st == FLEXDIAG_OK) st = flexdiag__kvp_calib_export(c->pd.kvp, tab);
    free(tokens);
    flexdiag_context_destroy(c);
    return st == FLEXDIAG_OK ? 0 : cli_fail(CMD, st);
}

/* The head types the table gives ssd (tau 0.5) and hack at a few sparsities. */
static void summary(const flexdiag_kvp_calib *t) {
    static const double sps[4] = {0.8, 0.9, 0.95, 0.96};
    int32_t n = t->n_layers * t->h_kv;
    for (int i = 0; i < 4; i++) {
        int32_t n_att = (int32_t)lround((1.0 - sps[i]) * t->l_dec);
        flexdiag_kvp_heads *s = NULL, *h = NULL;
        flexdiag__err_clear();
        if (n_att < 2 || flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_SSD, n_att,
                                                  FLEXDIAG_SSD_TAU_DEFAULT, &s) != FLEXDIAG_OK)
            continue;
        printf("  sparsity %.2f (N_att %d): ssd %d of %d KV heads spatial", sps[i], n_att,
               s->n_heads[FLEXDIAG_HEAD_WINDOW], n);
        flexdiag__err_clear();
        if (flexdiag__kvp_heads_make(t, FLEXDIAG_POLICY_HACK, n_att, 0, &h) == FLEXDIAG_OK)
            printf("; hack %d contextual (B_C %d), %d structural (B_S %d, lag ring %d)\n",
                   h->n_heads[FLEXDIAG_HEAD_SEMANTIC], h->b_c, h->n_heads[FLEXDIAG_HEAD_LAGS],
                   h->b_s, h->lag_ring);
        else
            printf("; hack: %s\n", flexdiag__err_msg());
        flexdiag__kvp_heads_free(s);
        flexdiag__kvp_heads_free(h);
    }
}

/* Stamp, write and summarise the table; 0 or an exit code. */
static int finish(const cal_opts *o, const flexdiag_runtime *rt, const flexdiag_model *m,
                  uint64_t prompts_hash, flexdiag_kvp_calib *t) {
    t->config_hash = flexdiag__model_config_hash(&m->cfg);
    t->prompts_hash = prompts_hash;
    t->seed = (uint64_t)o->mo.seed;
    t->n_cal = (int32_t)o->n_cal;
    snprintf(t->backend, sizeof t->backend, "%s", rt->k->name);
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__kvp_calib_write(o->out, t);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    printf("wrote %s: %d layers x %d/%d heads, L_dec %d, W_s %d, %llu recorded (step, row) "
           "pairs of %d images (steps %d..%d), config hash %016llx\n", o->out, t->n_layers,
           t->h_q, t->h_kv, t->l_dec, t->w_s, (unsigned long long)t->pairs, t->n_cal, t->t0,
           t->t_end - 1, (unsigned long long)t->config_hash);
    summary(t);
    return 0;
}

static int calibrate(const cal_opts *o) {
    cli_prompts ps = {0};
    uint64_t ph = 0;
    int rc = file_hash(o->prompts, &ph);
    if (!rc) rc = cli_prompts_load(CMD, CLI_LAYOUT_PLAIN, o->prompts, NULL, &ps);
    if (!rc && ps.n < o->n_cal)
        rc = cli_errorf(CMD, 2, "--prompts %s has %d prompts, --n-cal asks for %lld", o->prompts,
                        ps.n, (long long)o->n_cal);
    flexdiag_runtime *rt = NULL;
    flexdiag_model *m = NULL;
    if (!rc) rc = cli_open_model(CMD, &o->mo, &rt, &m);
    if (!rc && m->cfg.grid < 1)
        rc = cli_errorf(CMD, 2, "the model has no image grid: calibration is for image models");
    int32_t **ids = rc ? NULL : calloc((size_t)o->n_cal, sizeof *ids);
    int32_t *len = rc ? NULL : calloc((size_t)o->n_cal, sizeof *len), longest = 0;
    if (!rc && (!ids || !len)) rc = cli_fail(CMD, FLEXDIAG_ERR_OOM_HOST);
    if (!rc) rc = prompt_ids(m, &ps, (int)o->n_cal, ids, len, &longest);
    flexdiag_kvp_calib *t = NULL;
    if (!rc) rc = collect(m, o, ids, len, longest, &t);
    if (!rc) rc = finish(o, rt, m, ph, t);
    flexdiag__kvp_calib_free(t);
    for (int i = 0; ids && i < (int)o->n_cal; i++) free(ids[i]);
    free(ids);
    free(len);
    cli_prompts_free(&ps);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    return rc;
}

int flexdiag_cmd_calibrate(int argc, char **argv) {
    cal_opts o = {.mo = {.seed = 0}, .n_cal = 8, .cfg = 5.0};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS_SEED(&o.mo, "sampling seed of the dense images (default 0; also the "
                                    "random weights of a builtin shape)"),
        {.name = "--prompts", CLI_STR, &o.prompts, "FILE: prompts, one a line (required)"},
        {.name = "--n-cal", CLI_INT, &o.n_cal, "images: the first N prompts (default 8)",
         CLI_INTS(1, 1 << 20, NULL)},
        {.name = "--cfg", CLI_F64, &o.cfg, "CFG weight of the dense images (default 5)",
         CLI_NUMS(0, 1e6, 0, NULL)},
        {.name = "--out", CLI_STR, &o.out, "FILE: the calibration table (required)"},
    };
    int rc = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if (!o.prompts || !o.out)
        return cli_errorf(CMD, 2, "--prompts FILE and --out FILE are required");
    if (cli_check_model(CMD, &o.mo)) return 2;
    if (cli_check_writable(CMD, "--out", o.out)) return 1;
    return calibrate(&o);
}
