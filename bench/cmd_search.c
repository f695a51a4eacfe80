/*
 * cmd_search.c - `flexdiag search`: which batch, micro-batch, weight placement, KV homes and
 * policy give the best predicted img/s (tok/s for text) under --gpu-mem / --cpu-mem and a
 * sparsity ceiling (docs/search.md §3).
 *
 * Enumerates batches (powers of two up to --max-batch), micro-batches (the batch, a half, a
 * quarter), weight placements G,100-G,0 in steps of --weight-step, KV homes (100,0,0, and with
 * micro-batches 50,50,0 and 0,100,0, each with the device or, for dense, window and
 * StreamingLLM when the profile has a host read rate, the host attending the host-homed
 * micro-batches), and every --policies entry at each sparsity of the grid
 * up to --max-sparsity (the Diagonal kinds at each --n-r ring). A candidate is kept only when the runtime's own sizing says it fits
 * (cost_model.h); kept ones are ranked by predicted rate, ties to more on the GPU and fewer
 * micro-batches. The top --top are printed with the exact `flexdiag bench` flags that reproduce
 * each; --measure K runs the first K through `flexdiag-bench bench` (this executable, a child
 * process with --json into a temporary file) and prints measured beside predicted; the search
 * then runs in a forked child, so no device context of ours is alive during the measured runs.
 * Nothing is allocated but a runtime (for its budget and op table); no weights are loaded.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/core.h"
#include "bench/bench.h"
#include "bench/cost_model.h"
#include "cli/cli.h"

#define MAX_CANDS 65536 /* candidates kept (a full grid is a few thousand) */
#define MAX_TOP 1000    /* --top at most */

typedef struct search_opts {
    cli_model_opts mo;
    const char *policies, *profile, *n_rs, *fid_prompts;
    double max_sparsity, min_fidelity;
    int64_t prompt_len, gen_len, max_batch, weight_step, top, measure, per_prompt, steps;
    int json;
} search_opts;

typedef struct cand {
    cm_config c;
    cm_memory mem;
    cm_time t;
    double rate; /* img/s (images) or tok/s (text): the ranking key */
    double proj;   /* img/s over --steps tokens as the bench projects it (no --steps: t.img_s) */
    int32_t steps; /* --steps (0: whole images) */
    int32_t n_r;   /* the Diagonal ring as resolved (0: not a Diagonal kind) */
} cand;

/* Top-1 agreement with dense of one (policy, sparsity, resolved ring), from `bench fidelity
 * --model`. */
typedef struct fid {
    flexdiag_policy_kind kind;
    double sparsity, top1;
    int32_t n_r; /* 0: not a Diagonal kind */
} fid;

typedef struct search {
    const search_opts *o;
    fid fids[BENCH_MAX_LIST * 8]; /* --min-fidelity: what the fidelity run measured */
    int32_t rings[BENCH_MAX_LIST]; /* --n-r: Diagonal rings tried (0: the default ring) */
    int n_rings;
    int n_fids;
    cm_model cm;
    cm_profile prof;
    cand *v;
    int n;
    int text; /* rank by tok/s */
    int compress; /* --compress-weights 4bit: the streamed weights packed is a candidate too */
    uint64_t cpu_limit; /* pinned host bytes a configuration may take: --cpu-mem, or
                           HOST_SHARE of this machine's memory */
} search;

/* Without --cpu-mem, the share of the host's physical memory a configuration may pin (the
 * rest stays for the process, the page cache and the OS): on the 128 GiB H200 host the search
 * otherwise offered 322 GB KV homes that the measured runs could not pin. */
#define HOST_SHARE 0.75

static uint64_t host_limit(const search_opts *o) {
    if (o->mo.cpu_mem) return o->mo.cpu_mem;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)(HOST_SHARE * (double)pages * (double)page) : 0;
}

/* Sparsities tried for a sparse policy (those <= --max-sparsity). */
static const double SPARSITIES[] = {0.5, 0.75, 0.9, 0.95, 0.98};

/* ---- enumeration ---- */

static void try_one(search *s, const cm_config *c) {
    if (s->n >= MAX_CANDS) return;
    cand k = {.c = *c};
    if (cm_memory_of(&s->cm, c, s->cpu_limit, &k.mem) != FLEXDIAG_OK) return;
    if (!k.mem.fits_gpu || !k.mem.fits_cpu) return;
    if (s->o->mo.disk_mem && k.mem.disk > s->o->mo.disk_mem) return;
    if (cm_predict(&s->cm, c, &s->prof, &k.t) != FLEXDIAG_OK || !(k.t.img_s > 0)) return;
    k.rate = s->text ? k.t.tok_s : k.t.img_s;
    int32_t l_dec, rpi, ring;
    flexdiag_kvp_params kp;
    if (bench_has_ring(c->policy.kind) &&
        cm_resolve(&s->cm, c, &l_dec, &rpi, &kp, &ring) == FLEXDIAG_OK)
        k.n_r = kp.n_r;
    k.proj = k.t.img_s;
    cm_config w = *c;
    w.steps = (int32_t)s->o->steps;
    cm_time tw;
    if (w.steps && cm_predict(&s->cm, &w, &s->prof, &tw) == FLEXDIAG_OK) k.proj = tw.img_s;
    k.steps = w.steps;
    s->v[s->n++] = k;
}

/* KV homes tried (the splits only with micro-batches; the disk home with --offload-dir). */
static const uint32_t KV_HOMES[4][3] = {{100, 0, 0}, {50, 50, 0}, {0, 100, 0}, {0, 0, 100}};

/* Ways of splitting the weights off the GPU between pinned CPU and disk: all on the CPU, and
 * with --offload-dir also all on disk and half and half. */
static int disk_splits(const search *s) { return s->o->mo.offload_dir ? 3 : 1; }

/* c with KV homes kv and the weights g on the GPU, the rest split by way d (disk_splits). */
static void place(cm_config *c, int kv, int64_t g, int d) {
    uint32_t rest = 100 - (uint32_t)g, disk = d == 0 ? 0 : d == 1 ? rest : rest / 2;
    memcpy(c->kvpct, KV_HOMES[kv], sizeof c->kvpct);
    c->wpct[0] = (uint32_t)g, c->wpct[1] = rest - disk, c->wpct[2] = disk;
}

/* Whether the host may attend c's host-homed micro-batches (runtime/engine/cpu_attn.c): a KV
 * home in host memory, a position-only policy, and a measured host read rate. */
static int cpu_attention_ok(const search *s, const cm_config *c) {
    return c->kvpct[1] > 0 && s->prof.host_read > 0 &&
           flexdiag__kvp_traits(c->policy.kind)->device == FLEXDIAG_KVP_DEV_POSITION;
}

/* c without CPU attention and, where the host may attend, with it for all of the host-homed
 * micro-batches or for three quarters, half or a quarter of them (the device attending the
 * others over streamed rows: the host's memory then feeds both), each distinct count once. */
static void try_attention(search *s, cm_config c) {
    static const uint32_t shares[] = {100, 75, 50, 25};
    c.cpu_attention = 0;
    c.cpu_attn_pct = 0;
    try_one(s, &c);
    c.cpu_attention = 1;
    if (!cpu_attention_ok(s, &c)) return;
    int32_t host, n, last = -1;
    for (int i = 0; i < (int)(sizeof shares / sizeof shares[0]); i++) {
        c.cpu_attn_pct = shares[i] == 100 ? 0 : shares[i];
        cm_host_mbs(&c, &host, &n);
        if (n == last) continue;
        last = n;
        try_one(s, &c);
    }
}

/* Every KV home (host ones with and without CPU attention) and weight placement of one
 * (policy, batch, micro-batch); streamed weights also packed when the user allows it. */
static void try_placements(search *s, cm_config c) {
    int split = c.micro > 0 && c.micro < c.batch;
    for (int kv = 0; kv < (split ? (s->o->mo.offload_dir ? 4 : 3) : 1); kv++)
        for (int64_t g = 100; g >= 0; g -= s->o->weight_step)
            for (int d = 0; d < (g < 100 ? disk_splits(s) : 1); d++) {
                place(&c, kv, g, d);
                c.compress = 0;
                try_attention(s, c);
                c.compress = 1;
                if (g < 100 && s->compress) try_attention(s, c);
            }
}

/* Whether c fits both budgets by the runtime's own sizing. */
static int fits(search *s, const cm_config *c) {
    cm_memory m;
    return cm_memory_of(&s->cm, c, s->cpu_limit, &m) == FLEXDIAG_OK && m.fits_gpu &&
           m.fits_cpu && (!s->o->mo.disk_mem || m.disk <= s->o->mo.disk_mem);
}

/* The largest batch of c's placement, KV homes and micro-batch division div (1: none) that
 * fits, at most --max-batch (fitting is monotone in the batch): bisection. */
static void try_largest(search *s, cm_config c, int div) {
    int32_t lo = 0, hi = (int32_t)s->o->max_batch;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        c.batch = mid;
        c.micro = div == 1 ? 0 : (mid + div - 1) / div;
        if (fits(s, &c)) lo = mid;
        else hi = mid - 1;
    }
    if (lo < div || (lo & (lo - 1)) == 0) return; /* none, or a power of two: tried already */
    c.batch = lo;
    c.micro = div == 1 ? 0 : (lo + div - 1) / div;
    try_one(s, &c);
}

/* Powers of two with every micro-batch division and placement, then, for each placement and
 * division, the largest batch that fits (the batch `--batch auto` would run). */
static void try_batches(search *s, const flexdiag_policy_params *pol) {
    cm_config c = {.prompt_len = (int32_t)s->o->prompt_len, .gen_len = (int32_t)s->o->gen_len,
                   .policy = *pol, .images_per_prompt = (int32_t)s->o->per_prompt};
    for (int64_t b = 1; b <= s->o->max_batch; b *= 2)
        for (int div = 1; div <= 4 && b / div >= 1; div *= 2) {
            c.batch = (int32_t)b;
            c.micro = div == 1 ? 0 : (int32_t)(b / div);
            try_placements(s, c);
        }
    for (int div = 1; div <= 4; div *= 2)
        for (int kv = 0; kv < (div > 1 ? 3 : 1); kv++)
            for (int64_t g = 100; g >= 0; g -= s->o->weight_step)
                for (int d = 0; d < (g < 100 ? disk_splits(s) : 1); d++) {
                    place(&c, kv, g, d);
                    try_largest(s, c, div);
                }
}

/* ---- quality floor (--min-fidelity) ---- */

/* Whether policy pol (its ring resolved as the search's model resolves it) reaches
 * --min-fidelity (always without the flag, and for dense). */
static int good_enough(const search *s, const flexdiag_policy_params *pol) {
    if (s->o->min_fidelity <= 0 || pol->kind == FLEXDIAG_POLICY_DENSE) return 1;
    cm_config c = {.prompt_len = (int32_t)s->o->prompt_len, .gen_len = (int32_t)s->o->gen_len,
                   .policy = *pol};
    int32_t l_dec, rpi, ring;
    flexdiag_kvp_params kp;
    if (cm_resolve(&s->cm, &c, &l_dec, &rpi, &kp, &ring) != FLEXDIAG_OK) return 0;
    int32_t n_r = bench_has_ring(pol->kind) ? kp.n_r : 0;
    for (int i = 0; i < s->n_fids; i++)
        if (s->fids[i].kind == pol->kind && fabs(s->fids[i].sparsity - pol->sparsity) < 1e-9 &&
            s->fids[i].n_r == n_r)
            return s->fids[i].top1 >= s->o->min_fidelity;
    return 0; /* not measured: never returned */
}

/* Comma list of the sparsities of the grid under --max-sparsity into buf. */
static void sparsity_list(const search_opts *o, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (size_t j = 0; j < sizeof SPARSITIES / sizeof *SPARSITIES; j++)
        if (SPARSITIES[j] <= o->max_sparsity + 1e-9 && at < n)
            at += (size_t)snprintf(buf + at, n - at, "%s%g", at ? "," : "", SPARSITIES[j]);
}

/* Teacher-forced top-1 agreement of every sparse (policy, sparsity) on --model, measured by
 * `flexdiag-bench bench fidelity` (this executable, a child process, --json into a temporary
 * file) before the search touches the device; each pair below --min-fidelity is dropped. */
static int measure_fidelity(search *s) {
    const search_opts *o = s->o;
    char tmp[] = "/tmp/flexdiag-fidelity-XXXXXX", sp[256], cmd[8192];
    int fd = mkstemp(tmp);
    if (fd < 0) return 1;
    close(fd);
    sparsity_list(o, sp, sizeof sp);
    char pf[4200] = "";
    if (o->fid_prompts) snprintf(pf, sizeof pf, " --prompts '%s'", o->fid_prompts);
    snprintf(cmd, sizeof cmd, "'/proc/%ld/exe' bench fidelity --model '%s' --policies '%s' "
             "--sparsities '%s' --n-r '%s'%s%s --threads %lld --json '%s' 1>&2", (long)getpid(),
             o->mo.model, o->policies, sp, o->n_rs, pf, o->mo.cpu ? " --cpu" : "",
             (long long)o->mo.threads, tmp);
    fprintf(stderr, "flexdiag search: --min-fidelity: measuring top-1 agreement on %s\n",
            o->mo.model);
    int rc = system(cmd);
    FILE *f = rc == 0 ? fopen(tmp, "r") : NULL;
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0 && s->n_fids < (int)(sizeof s->fids / sizeof *s->fids)) {
        json_t *r = json_loads(line, 0, NULL);
        const char *pol = json_string_value(json_object_get(r, "policy"));
        const json_t *t1 = json_object_get(r, "top1");
        flexdiag_policy_kind k;
        if (pol && flexdiag_policy_from_name(pol, &k) == FLEXDIAG_OK && json_is_number(t1))
            s->fids[s->n_fids++] = (fid){k, json_number_value(json_object_get(r, "sparsity")),
                                         json_number_value(t1),
                                         bench_has_ring(k) ? (int32_t)json_integer_value(
                                                                 json_object_get(r, "n_r"))
                                                           : 0};
        json_decref(r);
    }
    free(line);
    if (f) fclose(f);
    unlink(tmp);
    if (rc != 0) {
        fprintf(stderr, "flexdiag search: --min-fidelity: `bench fidelity` failed (exit %d)\n",
                WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
        return 1;
    }
    for (int i = 0; i < s->n_fids; i++) {
        char ring[32] = "";
        if (s->fids[i].n_r) snprintf(ring, sizeof ring, ", N_r %d", (int)s->fids[i].n_r);
        fprintf(stderr, "flexdiag search: %s at %g%s: top-1 %.4f %s\n",
                flexdiag_policy_name(s->fids[i].kind), s->fids[i].sparsity, ring,
                s->fids[i].top1,
                s->fids[i].top1 >= o->min_fidelity ? "kept" : "below the floor, dropped");
    }
    return 0;
}

/* Every (policy, sparsity[, ring]) of --policies under --max-sparsity (and the quality floor);
 * a ring below a sparsity's N_att fits nothing (the runtime refuses it) and is not kept. */
static int enumerate(search *s) {
    flexdiag_policy_kind kinds[BENCH_MAX_LIST];
    int nk = 0;
    if (bench_parse_policies("search", s->o->policies, kinds, &nk)) return 2;
    for (int k = 0; k < nk; k++) {
        flexdiag_policy_params pol;
        flexdiag_policy_params_init(&pol);
        pol.kind = kinds[k];
        if (kinds[k] == FLEXDIAG_POLICY_DENSE) {
            try_batches(s, &pol);
            continue;
        }
        for (size_t j = 0; j < sizeof SPARSITIES / sizeof *SPARSITIES; j++) {
            if (SPARSITIES[j] > s->o->max_sparsity + 1e-9) break;
            pol.sparsity = SPARSITIES[j];
            for (int r = 0; r < (bench_has_ring(kinds[k]) ? s->n_rings : 1); r++) {
                pol.n_r = bench_has_ring(kinds[k]) ? s->rings[r] : 0;
                if (good_enough(s, &pol)) try_batches(s, &pol);
            }
        }
    }
    return 0;
}

/* Higher rate first; ties to the larger Diagonal ring (a wider window to skip in, at the same
 * cost), more weights on the GPU, more KV on the GPU, fewer micro-batches. */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->rate != y->rate) return x->rate < y->rate ? 1 : -1;
    if (x->n_r != y->n_r) return x->n_r < y->n_r ? 1 : -1;
    if (x->c.wpct[0] != y->c.wpct[0]) return x->c.wpct[0] < y->c.wpct[0] ? 1 : -1;
    if (x->c.compress != y->c.compress) return x->c.compress - y->c.compress;
    if (x->c.kvpct[0] != y->c.kvpct[0]) return x->c.kvpct[0] < y->c.kvpct[0] ? 1 : -1;
    return (x->c.micro == 0 ? 0 : x->c.batch / x->c.micro) -
           (y->c.micro == 0 ? 0 : y->c.batch / y->c.micro);
}

/* ---- output ---- */

/* `flexdiag bench` flags that reproduce candidate k into buf. */
static void repro_flags(const search *s, const cand *k, char *buf, size_t n) {
    const search_opts *o = s->o;
    const cm_config *c = &k->c;
    int at = snprintf(buf, n, "flexdiag bench ");
    if (o->mo.model) at += snprintf(buf + at, n - (size_t)at, "--model %s", o->mo.model);
    else at += snprintf(buf + at, n - (size_t)at, "--arch %s --random-weights",
                        o->mo.arch ? o->mo.arch : "tiny-janus");
    if (o->mo.cpu) at += snprintf(buf + at, n - (size_t)at, " --cpu");
    if (o->mo.gpu_mem) at += snprintf(buf + at, n - (size_t)at, " --gpu-mem %lluK",
                                      (unsigned long long)(o->mo.gpu_mem >> 10));
    at += snprintf(buf + at, n - (size_t)at, " --batch %d", c->batch);
    if (c->micro) at += snprintf(buf + at, n - (size_t)at, " --micro-batch %d", c->micro);
    if (c->wpct[0] != 100)
        at += snprintf(buf + at, n - (size_t)at, " --weights %u,%u,%u", c->wpct[0], c->wpct[1],
                       c->wpct[2]);
    if (c->compress) at += snprintf(buf + at, n - (size_t)at, " --compress-weights 4bit");
    if (c->kvpct[0] != 100)
        at += snprintf(buf + at, n - (size_t)at, " --kv %u,%u,%u", c->kvpct[0], c->kvpct[1],
                       c->kvpct[2]);
    if (c->cpu_attention) at += snprintf(buf + at, n - (size_t)at, " --cpu-attention");
    if (c->cpu_attention && c->cpu_attn_pct)
        at += snprintf(buf + at, n - (size_t)at, " --cpu-attention-share %u", c->cpu_attn_pct);
    if (c->images_per_prompt > 1)
        at += snprintf(buf + at, n - (size_t)at, " --images-per-prompt %d", c->images_per_prompt);
    /* a KV home needs a pool (one sized by the weights alone has no room for it beside them):
     * the configuration's own pinned bytes, not the whole --cpu-mem budget, which the run
     * would pin in full (minutes for 100 GB on a host whose memory grows as it is touched) */
    uint64_t cpu_mem = c->kvpct[0] != 100 ? (k->mem.cpu + (1u << 20) - 1) >> 20 << 20 : 0;
    if (cpu_mem) at += snprintf(buf + at, n - (size_t)at, " --cpu-mem %lluK",
                                (unsigned long long)(cpu_mem >> 10));
    int disk = c->wpct[2] || c->kvpct[2];
    if (disk) at += snprintf(buf + at, n - (size_t)at, " --offload-dir %s", o->mo.offload_dir);
    /* a store sized by the weights alone has no room for a KV home beside them */
    uint64_t disk_mem = o->mo.disk_mem ? o->mo.disk_mem
                        : c->wpct[2] && c->kvpct[2] ? (k->mem.disk + (1u << 20) - 1) >> 20 << 20
                                                    : 0;
    if (disk && disk_mem)
        at += snprintf(buf + at, n - (size_t)at, " --disk-mem %lluK",
                       (unsigned long long)(disk_mem >> 10));
    at += snprintf(buf + at, n - (size_t)at, " --prompt-len %d", c->prompt_len);
    if (c->gen_len) at += snprintf(buf + at, n - (size_t)at, " --gen-len %d", c->gen_len);
    if (c->policy.kind != FLEXDIAG_POLICY_DENSE)
        at += snprintf(buf + at, n - (size_t)at, " --policy %s --sparsity %g",
                       flexdiag_policy_name(c->policy.kind), c->policy.sparsity);
    if (c->policy.n_r > 0) snprintf(buf + at, n - (size_t)at, " --n-r %d", c->policy.n_r);
}

/* The device bytes available as text: "%.3f GiB", or what stands for no budget (the CPU engine
 * without --gpu-mem has none: its arena's budget is UINT64_MAX). */
static const char *avail_text(const search *s, char *buf, size_t n) {
    if (s->cm.avail > UINT64_MAX / 2)
        snprintf(buf, n, "unlimited (the CPU engine without --gpu-mem)");
    else
        snprintf(buf, n, "%.3f GiB", (double)s->cm.avail / (1 << 30));
    return buf;
}

static void print_table_head(const search *s) {
    const cm_profile *p = &s->prof;
    char avail[64];
    printf("flexdiag search: %s (%s), model %s, prompt %lld tokens, %d configurations fit; "
           "device budget available %s\n",
           p->device, p->backend, s->cm.m.cfg.name, (long long)s->o->prompt_len, s->n,
           avail_text(s, avail, sizeof avail));
    printf("\n| # | policy | S | batch | micro | weights G,C,D | KV G,C,D | pred. %s | step ms | "
           "bound | GPU MiB | CPU MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
           s->text ? "tok/s" : "img/s");
}

static void print_row(const search *s, int i, const cand *k, char *flags, size_t n) {
    const cm_config *c = &k->c;
    char attn[32] = "", pol[64];
    if (k->n_r)
        snprintf(pol, sizeof pol, "%s, N_r %d", flexdiag_policy_name(c->policy.kind), k->n_r);
    else snprintf(pol, sizeof pol, "%s", flexdiag_policy_name(c->policy.kind));
    int32_t host, attended;
    cm_host_mbs(c, &host, &attended);
    if (c->cpu_attention) snprintf(attn, sizeof attn, " CPU attn. %d/%d", attended, host);
    printf("| %d | %s | %g | %d | %d | %u,%u,%u%s | %u,%u,%u%s | %.4g | %.3f | %s | %.2f | %.2f |\n",
           i + 1, pol,
           c->policy.kind == FLEXDIAG_POLICY_DENSE ? 0 : c->policy.sparsity, c->batch,
           c->micro ? c->micro : c->batch, c->wpct[0], c->wpct[1], c->wpct[2],
           c->compress ? " 4-bit" : "", c->kvpct[0],
           c->kvpct[1], c->kvpct[2], attn, k->rate, 1e3 * k->t.step_s, k->t.bound,
           (double)k->mem.gpu / (1 << 20), (double)k->mem.cpu / (1 << 20));
    repro_flags(s, k, flags, n);
}

/* Candidate i as one JSON line on out. */
static void print_json(FILE *out, int i, const cand *k, const char *flags, double measured) {
    const cm_config *c = &k->c;
    json_t *o = json_pack(
        "{s:i,s:s,s:f,s:i,s:i,s:[i,i,i],s:[i,i,i],s:b,s:i,s:f,s:f,s:f,s:f,s:f,s:s,s:I,s:I,s:I,"
        "s:s,s:f,s:I}",
        "rank", i + 1, "policy", flexdiag_policy_name(c->policy.kind), "sparsity",
        c->policy.kind == FLEXDIAG_POLICY_DENSE ? 0.0 : c->policy.sparsity, "batch", c->batch,
        "micro_batch", c->micro ? c->micro : c->batch, "weights", c->wpct[0], c->wpct[1],
        c->wpct[2], "kv", c->kvpct[0], c->kvpct[1], c->kvpct[2], "cpu_attention",
        c->cpu_attention, "prompt_len", c->prompt_len,
        "pred_img_per_s", k->t.img_s, "pred_tok_per_s", k->t.tok_s, "pred_step_ms",
        1e3 * k->t.step_s, "pred_prefill_s", k->t.prefill_s, "measured_img_per_s", measured,
        "bound", k->t.bound, "gpu_bytes", (json_int_t)k->mem.gpu, "cpu_bytes",
        (json_int_t)k->mem.cpu, "disk_bytes", (json_int_t)k->mem.disk, "flags", flags,
        "pred_measured_img_per_s", k->proj, "measure_steps", (json_int_t)k->steps);
    if (o) json_object_set_new(o, "compress_weights", json_integer(c->compress ? 4 : 0));
    if (o) json_object_set_new(o, "n_r", json_integer(k->n_r));
    if (o) json_object_set_new(o, "cpu_attention_share",
                               json_integer(c->cpu_attention ? (c->cpu_attn_pct ? c->cpu_attn_pct : 100) : 0));
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (line) fprintf(out, "%s\n", line);
    free(line);
    json_decref(o);
}

/* ---- --measure ---- */

/* img/s of `flexdiag-bench bench <flags>` (this executable) read from its --json row, run over
 * `steps` tokens per image when > 0 (the bench projects the whole image), without the bench's
 * profiling pass (its GEMM / attention split is not what the search compares); -1 after a
 * message when the run failed. The child's table goes to stderr. */
static double measure_one(const char *flags, int64_t steps) {
    char tmp[] = "/tmp/flexdiag-search-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) return -1;
    close(fd);
    unlink(tmp);
    char cmd[8192], win[64] = "";
    if (steps > 0) snprintf(win, sizeof win, " --steps %lld", (long long)steps);
    snprintf(cmd, sizeof cmd, "'/proc/%ld/exe' %s%s --profile-steps 0 --json '%s' 1>&2",
             (long)getpid(), flags + strlen("flexdiag "), win, tmp);
    int rc = system(cmd);
    json_t *row = rc == 0 ? json_load_file(tmp, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    unlink(tmp);
    const json_t *v = json_object_get(row, "img_per_s");
    double r = json_is_number(v) ? json_number_value(v) : -1;
    json_decref(row);
    if (r < 0) fprintf(stderr, "flexdiag search: --measure: `%s` failed (exit %d)\n", flags,
                       WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
    return r;
}

/* The top candidates: the table and the reproducing flags on stdout, or JSON lines (with
 * --json); with cands set, also one JSON line per candidate there, for the measuring parent. */
static void report(const search *s, FILE *cands) {
    int top = s->n < s->o->top ? s->n : (int)s->o->top;
    if (!s->o->json) print_table_head(s);
    else fprintf(stderr, "flexdiag search: %d configurations fit; %d printed\n", s->n, top);
    char flags[top > 0 ? top : 1][1024];
    for (int i = 0; i < top; i++) {
        if (s->o->json) repro_flags(s, &s->v[i], flags[i], sizeof flags[i]);
        else print_row(s, i, &s->v[i], flags[i], sizeof flags[i]);
    }
    if (!s->o->json) {
        printf("\nreproduce:\n");
        for (int i = 0; i < top; i++) printf("  #%d  %s\n", i + 1, flags[i]);
    }
    for (int i = 0; i < top && (cands || s->o->json); i++)
        print_json(cands ? cands : stdout, i, &s->v[i], flags[i], 0);
}

/* The parent of --measure: the candidates' JSON lines from in, the first --measure of them run
 * through the bench, measured beside predicted (as a table, or the JSON lines completed). */
static int measure_cands(const search_opts *o, FILE *in) {
    json_t *c[MAX_TOP];
    int n = 0, max = MAX_TOP;
    char *line = NULL;
    size_t cap = 0;
    while (n < max && getline(&line, &cap, in) > 0)
        if ((c[n] = json_loads(line, 0, NULL))) n++;
    free(line);
    for (int i = 0; i < n; i++) {
        const char *flags = json_string_value(json_object_get(c[i], "flags"));
        double m = i < o->measure && flags ? measure_one(flags, o->steps) : 0;
        json_object_set_new(c[i], "measured_img_per_s", json_real(m));
    }
    char win[96] = "";
    if (o->steps > 0)
        snprintf(win, sizeof win, " (projected from %lld tokens)", (long long)o->steps);
    if (!o->json && n)
        printf("\n| # | predicted img/s%s | measured img/s%s | measured / predicted |\n"
               "|---|---|---|---|\n", win, win);
    for (int i = 0; i < n; i++) {
        double p = json_number_value(json_object_get(c[i], "pred_measured_img_per_s"));
        double m = json_number_value(json_object_get(c[i], "measured_img_per_s"));
        char *s = o->json ? json_dumps(c[i], JSON_COMPACT) : NULL;
        if (s) printf("%s\n", s);
        else if (i < o->measure)
            printf("| %d | %.4g | %.4g | %.2f |\n", i + 1, p, m, m > 0 ? m / p : 0);
        free(s);
        json_decref(c[i]);
    }
    return 0;
}

/* ---- command ---- */

/* The runtime of the flags (for its budget, op table and device name; no model loaded). */
static int open_runtime(const search_opts *o, flexdiag_runtime **rt) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    if (o->mo.cpu) rp.device = -1;
    rp.gpu_mem = o->mo.gpu_mem;
    rp.threads = (int)o->mo.threads;
    flexdiag_status st = flexdiag_runtime_create(&rp, rt);
    return st == FLEXDIAG_OK ? 0 : cli_fail("search", st);
}

/* The search itself; cands: see report. */
static int search_run(const search_opts *o, FILE *cands) {
    search s = {.o = o, .cpu_limit = host_limit(o)};
    if (bench_parse_rings("search", o->n_rs, s.rings, &s.n_rings)) return 2;
    if (o->min_fidelity > 0 && measure_fidelity(&s)) return 1;
    flexdiag_runtime *rt = NULL;
    int rc = open_runtime(o, &rt);
    if (rc) return rc;
    char dev[128], path[4096];
    bench_device_name(rt, dev, sizeof dev);
    if (!o->profile && cm_profile_path(dev, path, sizeof path)) {
        fprintf(stderr, "flexdiag search: neither XDG_CACHE_HOME nor HOME is set: give --profile FILE\n");
        rc = 2;
    }
    if (!rc) rc = cm_profile_read("search", o->profile ? o->profile : path, dev, &s.prof);
    flexdiag_status st = rc ? FLEXDIAG_OK : cm_model_init(&s.cm, rt, o->mo.model, o->mo.arch);
    if (st != FLEXDIAG_OK) rc = cli_fail("search", st);
    s.text = s.cm.m.cfg.arch != FLEXDIAG_ARCH_JANUS && (s.cm.m.cfg.arch != FLEXDIAG_ARCH_CHAMELEON || o->gen_len > 0);
    uint32_t bits = 0;
    if (!rc && cli_compress_bits("search", &o->mo, &bits)) rc = 2;
    s.compress = bits == 4;
    if (!rc && !(s.v = malloc(MAX_CANDS * sizeof *s.v))) rc = 1;
    if (!rc) rc = enumerate(&s);
    if (!rc) qsort(s.v, (size_t)s.n, sizeof *s.v, cand_cmp);
    char avail[64];
    if (!rc && s.n == 0)
        fprintf(stderr, "flexdiag search: no configuration fits --gpu-mem %s and %.3f GiB "
                "of pinned host memory (%s; raise them, or lower --prompt-len)\n",
                avail_text(&s, avail, sizeof avail), (double)s.cpu_limit / (1 << 30),
                o->mo.cpu_mem ? "--cpu-mem" : "three quarters of this machine's memory");
    if (!rc && s.n) report(&s, cands);
    free(s.v);
    flexdiag_runtime_destroy(rt);
    return rc ? rc : s.n ? 0 : 1;
}

/* With --measure the search runs in a child process, so that its device context (which the
 * runtime cannot give back to the driver) is gone before the measured runs charge whatever else
 * holds device memory against their --gpu-mem; the parent never touches the device. */
static int run_search(const search_opts *o) {
    if (o->measure == 0) return search_run(o, NULL);
    int fds[2];
    if (pipe(fds) != 0) {
        perror("flexdiag search: pipe");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("flexdiag search: fork");
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        FILE *w = fdopen(fds[1], "w");
        int rc = w ? search_run(o, w) : 1;
        if (w) fclose(w);
        fflush(stdout);
        _exit(rc);
    }
    close(fds[1]);
    FILE *r = fdopen(fds[0], "r");
    int rc = r ? measure_cands(o, r) : 1, st = 0;
    if (r) fclose(r);
    else close(fds[0]);
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st)) return 1;
    return WEXITSTATUS(st) ? WEXITSTATUS(st) : rc;
}

/* Flags of bench that search decides, or that it does not model yet. */
static int check_flags(const search_opts *o) {
    const char *bad = o->mo.weights ? "--weights" : o->mo.kv ? "--kv" : NULL;
    if (bad) {
        fprintf(stderr, "flexdiag search: %s is what search chooses; drop it\n", bad);
        return 2;
    }
    if (o->mo.disk_mem && !o->mo.offload_dir) {
        fprintf(stderr, "flexdiag search: --disk-mem budgets the disk tier, which --offload-dir "
                "DIR turns on; give both\n");
        return 2;
    }
    if (o->mo.model && (o->mo.arch || o->mo.random_weights)) {
        fprintf(stderr, "flexdiag search: --model sizes a real checkpoint; drop --arch/--random-weights\n");
        return 2;
    }
    if (o->fid_prompts && !(o->min_fidelity > 0)) {
        fprintf(stderr, "flexdiag search: --fidelity-prompts sets what --min-fidelity measures "
                "on: give --min-fidelity X too\n");
        return 2;
    }
    if (o->min_fidelity > 0 && !o->mo.model) {
        fprintf(stderr, "flexdiag search: --min-fidelity measures the policies on a checkpoint: "
                "give --model DIR\n");
        return 2;
    }
    int32_t rings[BENCH_MAX_LIST];
    int n_rings;
    return bench_parse_rings("search", o->n_rs, rings, &n_rings) ? 2 : 0;
}

int flexdiag_cmd_search(int argc, char **argv) {
    search_opts o = {.mo.seed = 1, .policies = "dense", .max_sparsity = 0.9, .prompt_len = 50,
                     .max_batch = 1024, .weight_step = 10, .top = 5, .per_prompt = 1,
                     .n_rs = "0"};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&o.mo),
        {.name = "--prompt-len", CLI_INT, &o.prompt_len, "prompt tokens (default 50)",
         CLI_INTS(2, 1 << 20, NULL)},
        {.name = "--gen-len", CLI_INT, &o.gen_len,
         "text models: new tokens per sequence (default 128)",
         CLI_INTS(0, 1 << 20, "0 = images, or 128 tokens for a text model")},
        {.name = "--policies", CLI_STR, &o.policies,
         "comma list of policies to search (default dense)"},
        {.name = "--max-sparsity", CLI_F64, &o.max_sparsity,
         "quality floor: highest sparsity tried, of 0.5,0.75,0.9,0.95,0.98 (default 0.9)",
         CLI_NUMS(0, 1, 0, NULL)},
        {.name = "--min-fidelity", CLI_F64, &o.min_fidelity,
         "quality floor: top-1 agreement with dense (bench fidelity on --model) a sparse policy "
         "must reach", CLI_NUMS(0, 1, 0, NULL)},
        {.name = "--fidelity-prompts", CLI_STR, &o.fid_prompts,
         "--min-fidelity: a file of prompts (one a line) whose images the agreement is the mean "
         "over (default: one prompt)"},
        {.name = "--n-r", CLI_STR, &o.n_rs,
         "comma list of Diagonal ring sizes tried, the KV memory knob (default 0: the default "
         "ring, max(round(L_dec/2), N_att)); a ring below a sparsity's N_att is skipped"},
        {.name = "--max-batch", CLI_INT, &o.max_batch,
         "largest batch tried, powers of two (default 1024)",
         CLI_INTS(1, 1 << 16, NULL)},
        {.name = "--images-per-prompt", CLI_INT, &o.per_prompt,
         "images per prompt of the job (default 1): with more, sizes the shared prompt KV",
         CLI_INTS(1, 65536, "as generate's")},
        {.name = "--weight-step", CLI_INT, &o.weight_step,
         "GPU share step of --weights in percent (10)",
         CLI_INTS(1, 100, "percent of the layer weights")},
        {.name = "--top", CLI_INT, &o.top, "candidates printed (default 5)",
         CLI_INTS(1, MAX_TOP, NULL)},
        {.name = "--profile", CLI_STR, &o.profile, "profile file (default: flexdiag profile's)"},
        {.name = "--measure", CLI_INT, &o.measure,
         "run the top K through flexdiag bench (default 0)",
         CLI_INTS(0, 1000, NULL)},
        {.name = "--steps", CLI_INT, &o.steps,
         "--measure: tokens per image the measured runs take and the predictions beside them "
         "average over, as `bench --steps` projects (default all; the ranking stays on whole "
         "images)", CLI_INTS(0, INT32_MAX, "0 = whole images")},
        {.name = "--json", CLI_FLAG, &o.json, "one JSON object per candidate on stdout"},
    };
    int rc = cli_parse("search", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if (check_flags(&o)) return 2;
    return run_search(&o);
}
