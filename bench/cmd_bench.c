/*
 * cmd_bench.c - `flexdiag bench`: throughput of image generation against the machine's roofline,
 * and the dispatch to `bench fidelity`.
 *
 * A throughput row: random-weight model of --arch, synthetic prompts of --prompt-len tokens,
 * --batch images (or `auto`: the largest that fits --gpu-mem), an untimed warm-up of three
 * tokens (GEMM plans built and tuned, the step graph recorded), one timed generation (prefill +
 * all decode steps, or --steps of them: then img/s is projected to the full image and the row
 * says so), then a profiling run (stream syncs around every op group) of --profile-steps decode
 * steps from the middle of the generation, at the mean context, for the per-step split GEMM /
 * attention / rest (fractions of those steps' wall time). The roofline is measured in the same process through the same
 * op table: the GEMM rate, and on a GPU the device copy bandwidth (bytes read + written); the
 * decode step's bytes (weights + KV read and written) and FLOPs over those rates give its floor.
 * On the CPU the memory ceiling is the rate at which the runtime's threads read a buffer of the
 * row's own step bytes (from a cache when they fit one): one thread's memcpy of 256 MiB, the
 * ceiling before, was below what the step's threads read, and rows showed 150 % of it. A row
 * without both ceilings prints no roofline.
 * A run longer than 10 s reports its decode step, elapsed time and an estimate of the rest on
 * stderr every 10 s. Markdown on stdout, one JSON object per row with --json FILE (opened before measuring; each
 * row one append + fsync through cli/fileio.h, so the file never holds a partial row; a row
 * that cannot be written stops the run with exit 1, the row being on stdout).
 * A policy search: --policies and --sparsities (comma lists) give one row per (policy,
 * sparsity) pair (dense once) in the same process, on one model and one roofline measurement;
 * each row sizes its own batch (`auto` gives each policy its largest), a row that fails is
 * reported and the sweep goes on, and a last line names the fastest row against dense. Every
 * row's policy flags pass the library's check (flexdiag__kvp_check) before the model loads, so
 * a flag error stops the run at once with exit 2; what depends on the decode length fails its
 * row at context creation.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/core.h"
#include "bench/bench.h"
#include "bench/eta.h"
#include "bench/offload_report.h"
#include "cli/cli.h"
#include "cli/fileio.h"
#include "policy/kv_policy.h"
#include "runtime/engine/engine.h"

typedef struct tp_opts {
    cli_model_opts mo;
    cli_policy_opts po;
    const char *batch, *json, *policies, *sparsities;
    int64_t micro, prompt_len, steps, profile_steps, gen_len, per_prompt;
} tp_opts;

typedef struct roofline {
    double bw;   /* bytes/s, device copy (read + write); 0 on the CPU (a ceiling per row) */
    double gemm; /* FLOP/s, bf16 matmul (fp32 on the CPU) */
} roofline;

typedef struct tp_row {
    flexdiag_policy_info pol;   /* the context's policy, resolved */
    int32_t batch, steps, l_dec;
    double prefill_s, decode_s, img_s, prefill_tps, decode_tps, total_tps, step_ms;
    double split[3];            /* fractions of a profiled step */
    double peak_gib, kv_mib_seq;
    double step_bytes, step_flops, roof_ms, roof_frac;
    double mem_bw;              /* bytes/s, the memory ceiling of roof_ms (0: not measured) */
    int projected;
    double compute_ms;          /* a profiled decode step's op time (GEMM + attention + rest) */
    flexdiag_offload_info oi[2]; /* offload counters before and after the timed run */
} tp_row;

/* ---- roofline measurement ---- */

static double time_op(const flexdiag_kernels *k, flexdiag_stream *s, int reps,
                      flexdiag_status (*fn)(const flexdiag_kernels *, flexdiag_stream *, void **),
                      void **bufs) {
    if (fn(k, s, bufs) != FLEXDIAG_OK || k->stream_sync(s) != FLEXDIAG_OK) return -1; /* warm-up */
    double t0 = flexdiag__now();
    for (int i = 0; i < reps; i++)
        if (fn(k, s, bufs) != FLEXDIAG_OK) return -1;
    if (k->stream_sync(s) != FLEXDIAG_OK) return -1;
    return (flexdiag__now() - t0) / reps;
}

static size_t g_copy_bytes;
static int64_t g_mm;

static flexdiag_status op_copy(const flexdiag_kernels *k, flexdiag_stream *s, void **b) {
    return k->copy_d2d(b[1], b[0], g_copy_bytes, s);
}

static flexdiag_status op_gemm(const flexdiag_kernels *k, flexdiag_stream *s, void **b) {
    return k->matmul(b[2], b[0], b[1], NULL, g_mm, g_mm, g_mm, 0, s);
}

/* Whether rt's backend is a device (bf16 activations) rather than the CPU engine. */
static int on_device(const flexdiag_runtime *rt) { return rt->k->act_bytes == 2; }

/* Measure the GEMM rate on the backend and, on a device, the copy bandwidth (buffers from the
 * device budget, freed: the copy buffers shrink to what the budget has left after the
 * weights). */
static int measure_roofline(flexdiag_runtime *rt, roofline *r) {
    const flexdiag_kernels *k = rt->k;
    int gpu = on_device(rt);
    g_copy_bytes = gpu ? (size_t)2 << 30 : (size_t)256 << 20;
    g_mm = gpu ? 8192 : 512;
    size_t n2 = (size_t)g_mm * (size_t)g_mm, fixed = n2 * (4 + (size_t)k->act_bytes);
    uint64_t avail = flexdiag__arena_available(&rt->arena);
    if (avail < fixed + (64u << 20)) return 1;
    if (2 * g_copy_bytes > avail - fixed) g_copy_bytes = (size_t)((avail - fixed) / 2) & ~(size_t)4095;
    flexdiag_arena *a = &rt->arena;
    void *b[3] = {0};
    int ok = flexdiag__arena_alloc(a, g_copy_bytes, "the bench's roofline", &b[0]) == FLEXDIAG_OK &&
             flexdiag__arena_alloc(a, g_copy_bytes, "the bench's roofline", &b[1]) == FLEXDIAG_OK;
    ok = ok && k->memset0(b[0], g_copy_bytes, rt->s) == FLEXDIAG_OK;
    double t = ok && gpu ? time_op(k, rt->s, 20, op_copy, b) : -1;
    r->bw = t > 0 ? 2.0 * (double)g_copy_bytes / t : 0;
    /* GEMM operands (reusing the copy buffers) hold a non-zero pattern: zeros run faster than
     * real data on some GPUs. x is act (converted on the device from f32), W bf16. */
    float *host = ok ? malloc(n2 * 4) : NULL;
    uint16_t *wh = ok ? malloc(n2 * 2) : NULL;
    for (size_t i = 0; host && wh && i < n2; i++) {
        host[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        wh[i] = flexdiag__f32_to_bf16(host[i] * 0.01f);
    }
    void *dev_f32 = NULL;
    ok = ok && host && wh &&
         flexdiag__arena_alloc(a, n2 * 4, "the bench's roofline", &dev_f32) == FLEXDIAG_OK &&
         k->copy_h2d(dev_f32, host, n2 * 4, rt->s) == FLEXDIAG_OK &&
         k->act_from_f32(b[0], dev_f32, (int64_t)n2, rt->s) == FLEXDIAG_OK &&
         k->copy_h2d(b[1], wh, n2 * 2, rt->s) == FLEXDIAG_OK &&
         flexdiag__arena_alloc(a, n2 * (size_t)k->act_bytes, "the bench's roofline", &b[2]) ==
             FLEXDIAG_OK &&
         k->stream_sync(rt->s) == FLEXDIAG_OK;
    t = ok ? time_op(k, rt->s, gpu ? 20 : 2, op_gemm, b) : -1;
    r->gemm = t > 0 ? 2.0 * (double)g_mm * (double)g_mm * (double)g_mm / t : 0;
    free(host);
    free(wh);
    flexdiag__arena_free(a, dev_f32, n2 * 4);
    flexdiag__arena_free(a, b[0], g_copy_bytes);
    flexdiag__arena_free(a, b[1], g_copy_bytes);
    flexdiag__arena_free(a, b[2], n2 * (size_t)k->act_bytes);
    flexdiag__err_clear();
    return (r->bw > 0 || !gpu) && r->gemm > 0 ? 0 : 1;
}

/* ---- the decode step's bytes and FLOPs ---- */

/* Average over decode steps of the bytes one step must move and the FLOPs it must do. */
static void step_cost(const flexdiag_context *c, int32_t lp, int32_t steps, tp_row *row) {
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_lm_config *l = &m->lm;
    double rows = (double)row->batch * c->geo.rows_per_img, ab = c->m->rt->k->act_bytes;
    double d = l->hidden, dq = (double)l->heads * l->head_dim, dkv = (double)l->kv_heads * l->head_dim;
    double layer_params = d * (dq + 2 * dkv) + dq * d + (l->relu_mlp ? 2 : 3) * d * l->ffn + 2 * d;
    double head_params = m->arch != FLEXDIAG_ARCH_JANUS
                             ? (double)c->geo.vocab_out * d /* lm_head (Chameleon: its code rows) */
                             : (double)m->head_dim_mid * (d + m->image_vocab) +
                                   (double)m->aligner_depth * d * d;
    double wbytes = 2.0 * (layer_params * l->layers + head_params);
    double att = 0; /* mean attended decode rows */
    for (int32_t t = 0; t < steps; t++) {
        int32_t a = t + 1;
        if (row->pol.kind != FLEXDIAG_POLICY_DENSE && a > row->pol.n_att) a = row->pol.n_att;
        att += a;
    }
    att /= steps > 0 ? steps : 1;
    /* attended rows summed over the sequences: a Lumina unconditional row's prompt is 3 ids;
     * the bound reads shared prompt KV once per distinct prompt row (what a cascade would),
     * while each sequence still scores it */
    double att_rows = (c->geo.row_len ? row->batch * (lp + 3.0) : rows * lp) + rows * att;
    double read_rows = c->geo.n_pre && c->n_pf > 0 ? (double)c->n_pf * lp + rows * att : att_rows;
    double kv_read = l->layers * read_rows * 2 * dkv * ab;
    double kv_write = rows * l->layers * 2 * dkv * ab;
    row->step_bytes = wbytes + kv_read + kv_write;
    row->step_flops = 2 * rows * (layer_params * l->layers + head_params) +
                      4 * l->layers * att_rows * dq;
}

/* ---- one run ---- */

int32_t *bench_synthetic_prompt(const flexdiag_context *c, int32_t len, int32_t g) {
    const flexdiag_model_config *m = &c->m->cfg;
    int32_t *p = malloc((size_t)len * 4);
    for (int32_t i = 0; p && i < len; i++)
        p[i] = (int32_t)(flexdiag__rng64(42, (uint64_t)g, (uint64_t)i) % (uint64_t)m->lm.vocab);
    if (p && m->bos_id >= 0) p[0] = m->bos_id;
    if (p && c->geo.row_len && len >= 5) {
        const int32_t tail[4] = {m->eot_id, m->boi_id, m->size_id, m->size_id};
        memcpy(p + len - 4, tail, sizeof tail);
    } else if (p && c->geo.rows_per_img == 2 && m->boi_id >= 0) {
        p[len - 1] = m->boi_id;
    }
    return p;
}

/* Progress of a long run on stderr: after the first PROGRESS_S seconds, one line at most every
 * PROGRESS_S with the decode step, the elapsed time and an estimate of what is left (eta.h; a
 * run that ends sooner prints nothing, so short rows stay quiet). */
#define PROGRESS_S 10.0

typedef struct progress_state {
    const char *what; /* "warm-up", "timed run", "profile" */
    double t0, last;
    bench_eta eta; /* the samples so far, from the run's start */
    flexdiag_context *c;
    flexdiag_offload_info *pf_end; /* optional: the transfer counters once prefill is queued */
} progress_state;

static bool on_progress(int phase, uint64_t done, uint64_t total, void *user) {
    progress_state *p = user;
    if (phase == 0 && done == total && p->pf_end) /* per-decode-step rates leave prefill out */
        (void)flexdiag_context_offload(p->c, p->pf_end);
    double now = flexdiag__now();
    if (phase != 1 || now - p->last < PROGRESS_S || done == 0) return true;
    p->last = now;
    double el = now - p->t0, left = bench_eta_sample(&p->eta, el, done, total);
    if (left < 0) return true;
    fprintf(stderr, "bench: %s: decode step %llu/%llu, %.0f s, ~%.0f s left\n", p->what,
            (unsigned long long)done, (unsigned long long)total, el, left);
    return true;
}

/* The synthetic block: image i draws prompt i / per (one prompt for all when per is 1). */
static flexdiag_status run_block(flexdiag_context *c, int32_t *const *prompt, int32_t per,
                                 int32_t lp, int32_t batch, int32_t steps, double *split,
                                 int32_t split_from, const char *what,
                                 flexdiag_offload_info *pf_end) {
    double t0 = flexdiag__now();
    progress_state ps = {.what = what, .t0 = t0, .last = t0, .c = c, .pf_end = pf_end};
    const int32_t **pp = malloc((size_t)batch * sizeof *pp);
    int32_t *pl = malloc((size_t)batch * 4), *tok = malloc((size_t)batch * (size_t)steps * 4);
    for (int32_t i = 0; pp && pl && i < batch; i++) {
        pp[i] = prompt[per > 1 ? i / per : 0];
        pl[i] = lp;
    }
    flexdiag_block b = {.n_img = batch, .prompt = pp, .prompt_len = pl, .n_steps = steps,
                        .cfg_weight = 5.0f, .tokens = tok,
                        .sp = {1.0f, c->geo.row_len ? FLEXDIAG_LUMINA_TOP_K : 0, 1.0f, 1, 0},
                        .split = split, .split_from = split_from, .progress = on_progress,
                        .progress_user = &ps};
    memset(&c->stats, 0, sizeof c->stats);
    flexdiag_status st = pp && pl && tok ? flexdiag__engine_run(c, &b) : FLEXDIAG_ERR_OOM_HOST;
    free(pp);
    free(pl);
    free(tok);
    return st;
}

static int measure(const tp_opts *o, flexdiag_model *m, flexdiag_context *c, tp_row *row) {
    int32_t lp = (int32_t)o->prompt_len, steps = row->steps, per = (int32_t)o->per_prompt;
    int32_t n_p = per > 1 ? (int32_t)(((int64_t)row->batch + per - 1) / per) : 1;
    int32_t **prompt = calloc((size_t)n_p, sizeof *prompt);
    flexdiag_status st = prompt ? FLEXDIAG_OK : FLEXDIAG_ERR_OOM_HOST;
    for (int32_t g = 0; st == FLEXDIAG_OK && g < n_p; g++)
        if (!(prompt[g] = bench_synthetic_prompt(c, lp, g))) st = FLEXDIAG_ERR_OOM_HOST;
    /* untimed warm-up (prefill + 2 steps): GEMM plans tuned, the step graph recorded */
    if (st == FLEXDIAG_OK)
        st = run_block(c, prompt, per, lp, row->batch, steps < 3 ? steps : 3, NULL, 0,
                       "warm-up", NULL);
    row->oi[0] = row->oi[1] = (flexdiag_offload_info){.struct_size = sizeof row->oi[0]};
    if (st == FLEXDIAG_OK) st = flexdiag_context_offload(c, &row->oi[0]);
    if (st == FLEXDIAG_OK) /* oi[0] is taken again once the timed run's prefill is queued */
        st = run_block(c, prompt, per, lp, row->batch, steps, NULL, 0, "timed run", &row->oi[0]);
    if (st == FLEXDIAG_OK) st = flexdiag_context_offload(c, &row->oi[1]);
    row->prefill_s = c->stats.prefill_s;
    row->decode_s = c->stats.decode_s;
    row->kv_mib_seq = (double)c->stats.kv_bytes_per_seq / (1 << 20);
    /* profile --profile-steps decode steps from the middle of the run (mean context) */
    double split[4] = {0};
    int32_t mid = (steps - 1) / 2, prof = (int32_t)o->profile_steps;
    if (prof > steps - 1 - mid) prof = steps - 1 - mid;
    if (st == FLEXDIAG_OK && prof > 0)
        st = run_block(c, prompt, per, lp, row->batch, mid + prof + 1, split, mid, "profile",
                       NULL);
    for (int32_t g = 0; prompt && g < n_p; g++) free(prompt[g]);
    free(prompt);
    if (st != FLEXDIAG_OK) return cli_fail("bench", st);
    double rows = (double)row->batch * c->geo.rows_per_img, dec_steps = steps - 1;
    row->step_ms = dec_steps > 0 ? 1e3 * row->decode_s / dec_steps : 0;
    double full = row->prefill_s + row->step_ms * 1e-3 * (row->l_dec - 1); /* whole image */
    row->img_s = row->batch / full;
    row->prefill_tps = rows * lp / row->prefill_s;
    row->decode_tps = dec_steps > 0 ? rows * dec_steps / row->decode_s : 0;
    /* FlexGen's total: generated tokens of a whole run over its prefill + decode time */
    row->total_tps = rows * row->l_dec / (row->prefill_s + row->step_ms * 1e-3 * (row->l_dec - 1));
    for (int i = 0; i < 3; i++) row->split[i] = split[3] > 0 ? split[i] / split[3] : 0;
    row->compute_ms = prof > 0 ? 1e3 * (split[0] + split[1] + split[2]) / prof : 0;
    row->peak_gib = (double)atomic_load(&m->rt->arena.peak) / (1 << 30);
    return 0;
}

/* ---- output ---- */

/* The runtime's device for reports ("NVIDIA H200", the CPU's model name). */
static void device_name(const flexdiag_runtime *rt, char *out, size_t n) {
    if (rt->k->device_name) rt->k->device_name(rt->s, out, n);
    else snprintf(out, n, "%s", rt->k->name);
}

/* The memory budget in GiB, or a negative value when there is none (CPU, no --gpu-mem). */
static double budget_gib(const flexdiag_runtime *rt) {
    return rt->arena.budget == UINT64_MAX ? -1.0 : (double)rt->arena.budget / (1 << 30);
}

static void print_header(const flexdiag_runtime *rt, const roofline *r, const tp_opts *o,
                         const flexdiag_model *m) {
    char budget[32] = "none";
    if (budget_gib(rt) >= 0) snprintf(budget, sizeof budget, "%.1f GiB", budget_gib(rt));
    char dev[128];
    device_name(rt, dev, sizeof dev);
    printf("flexdiag bench: backend %s (%s), model %s (random weights), prompt %lld tokens, "
           "memory budget %s\n", rt->k->name, dev, m->cfg.name, (long long)o->prompt_len, budget);
    /* a CPU multiplies at GFLOP/s: keep three significant digits either way */
    int tera = r->gemm >= 1e12;
    char mem[96] = "host read by the runtime's threads at each row's step bytes";
    if (on_device(rt)) snprintf(mem, sizeof mem, "copy %.0f GB/s (read + write)", r->bw / 1e9);
    printf("measured ceilings: %s, %s GEMM %.1f %cFLOP/s\n\n", mem,
           on_device(rt) ? "bf16" : "fp32", r->gemm / (tera ? 1e12 : 1e9), tera ? 'T' : 'G');
    printf("| policy | N_att | N_r | batch | img/s | prefill tok/s | decode tok/s | total tok/s | "
           "step ms | gemm/attn/rest %% | peak GiB | KV MiB/seq | roofline ms | of roofline |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

static void print_row(const tp_row *r) {
    char roof[48] = "– | –"; /* no ceiling measured: no roofline */
    if (r->roof_ms > 0)
        snprintf(roof, sizeof roof, "%.2f | %.0f%%", r->roof_ms, 100 * r->roof_frac);
    printf("| %s | %d | %d | %d | %.3f%s | %.0f | %.0f | %.1f | %.2f | %.0f/%.0f/%.0f | %.2f | "
           "%.1f | %s |\n",
           flexdiag_policy_name(r->pol.kind), r->pol.n_att, r->pol.n_r, r->batch, r->img_s,
           r->projected ? " (proj.)" : "", r->prefill_tps, r->decode_tps, r->total_tps, r->step_ms,
           100 * r->split[0], 100 * r->split[1], 100 * r->split[2], r->peak_gib, r->kv_mib_seq,
           roof);
    fflush(stdout);
}

/* The row as one JSON line appended to --json (json NULL: no --json); 0, or 1 after printing
 * the line that names the file and the error (the row is on stdout already). After a failure
 * json is closed: the sweep stops. */
static int append_json(cli_jsonl *json, const flexdiag_context *c, const tp_opts *o,
                       const roofline *rf, const tp_row *r, const char *extra) {
    if (!json) return 0;
    char budget[32] = "null"; /* JSON null: no budget */
    if (budget_gib(c->m->rt) >= 0) snprintf(budget, sizeof budget, "%.3f", budget_gib(c->m->rt));
    char dev[128];
    device_name(c->m->rt, dev, sizeof dev);
    for (char *q = dev; *q; q++) /* a JSON string without escapes */
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20) *q = ' ';
    time_t now = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    char line[4096]; /* about 1 KiB: 40 short fields and the device name */
    int n = snprintf(line, sizeof line,
            "{\"time\":\"%s\",\"backend\":\"%s\",\"device\":\"%s\",\"arch\":\"%s\","
            "\"random_weights\":true,\"seed\":%lld,"
            "\"policy\":\"%s\",\"n_att\":%d,\"n_r\":%d,\"sparsity\":%.4f,\"batch\":%d,"
            "\"micro_batch\":%d,\"prompt_len\":%lld,\"gen_len\":%d,\"cfg_rows\":%d,"
            "\"provenance\":\"%s\",\"prefill_s\":%.6f,\"decode_s\":%.6f,\"img_per_s\":%.6f,"
            "\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.1f,\"total_tok_s\":%.1f,\"step_ms\":%.4f,"
            "\"split_gemm\":%.4f,"
            "\"split_attn\":%.4f,\"split_rest\":%.4f,\"peak_gpu_gib\":%.4f,\"kv_mib_per_seq\":%.4f,"
            "\"gpu_budget_gib\":%s,\"copy_gbps\":%.1f,\"memory_ceiling\":\"%s\","
            "\"gemm_tflops\":%.2f,\"step_bytes\":%.0f,"
            "\"step_flops\":%.0f,\"roofline_ms\":%.4f,\"roofline_fraction\":%.4f%s}\n",
            ts, c->m->rt->k->name, dev, c->m->cfg.name, (long long)o->mo.seed,
            flexdiag_policy_name(r->pol.kind), r->pol.n_att, r->pol.n_r, r->pol.sparsity,
            r->batch, c->geo.mb_img,
            (long long)o->prompt_len, r->l_dec, c->geo.rows_per_img,
            r->projected ? "projected" : "measured", r->prefill_s, r->decode_s, r->img_s,
            r->prefill_tps, r->decode_tps, r->total_tps, r->step_ms, r->split[0], r->split[1],
            r->split[2],
            r->peak_gib, r->kv_mib_seq, budget, r->mem_bw / 1e9,
            on_device(c->m->rt) ? "device copy" : "host read at the step's bytes",
            rf->gemm / 1e12, r->step_bytes, r->step_flops, r->roof_ms, r->roof_frac, extra);
    flexdiag_status st =
        n > 0 && (size_t)n < sizeof line
            ? cli_jsonl_append(json, line, (size_t)n)
            : cli_io_fail(FLEXDIAG_ERR_INTERNAL, "%s: row longer than %zu bytes", json->path,
                          sizeof line);
    if (st == FLEXDIAG_OK) return 0;
    fprintf(stderr, "flexdiag bench: --json %s; the row is on stdout only; stopping\n",
            cli_io_error());
    (void)cli_jsonl_close(json);
    return 1;
}

/* ---- throughput command ---- */

/* One row: a context for the policy flags po, measured, printed (and appended to json, may be
 * NULL); *img_s gets its img/s. */
static int bench_row(const tp_opts *o, flexdiag_model *m, const roofline *rf,
                     bench_ceilings *ce, const cli_policy_opts *po, cli_jsonl *json,
                     double *img_s) {
    flexdiag_context *c = NULL;
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_prompt_len = (int32_t)o->prompt_len;
    if (o->gen_len > 0) cp.max_new_tokens = (int32_t)o->gen_len;
    cp.text = o->gen_len > 0; /* Lumina-mGPT: text tokens instead of an image */
    cp.images_per_prompt = (int32_t)o->per_prompt;
    cli_kv_homes("bench", &o->mo, &cp);
    if (cli_policy_params("bench", po, &cp.policy)) return 2;
    cli_policy_calib(po, &cp);
    int32_t batch = cli_batch("bench", o->batch, m, &cp);
    if (batch < 1) return 2;
    cp.max_images = batch;
    cp.micro_batch = (int32_t)o->micro;
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) return cli_fail("bench", st);
    tp_row row = {.pol.struct_size = sizeof row.pol, .batch = batch, .l_dec = c->geo.l_dec};
    if ((st = flexdiag_context_policy(c, &row.pol)) != FLEXDIAG_OK) {
        flexdiag_context_destroy(c);
        return cli_fail("bench", st);
    }
    (void)bench_offload_kv_disk_ceiling(c, ce); /* failures reported; the row goes on */
    (void)bench_offload_kv_home_read(c, ce);
    row.steps = o->steps > 0 && o->steps < c->geo.l_dec ? (int32_t)o->steps : c->geo.l_dec;
    row.projected = row.steps < c->geo.l_dec;
    int rc = measure(o, m, c, &row);
    step_cost(c, (int32_t)o->prompt_len, c->geo.l_dec, &row);
    row.mem_bw = rf->bw;
    if (rc == 0 && !on_device(m->rt)) /* failures reported: no roofline */
        (void)bench_read_rate_at(m->rt, (size_t)row.step_bytes, &row.mem_bw);
    /* no roofline without both ceilings (the measurement says it failed): fractions 0 */
    double roof = row.mem_bw > 0 && rf->gemm > 0
                      ? fmax(row.step_bytes / row.mem_bw, row.step_flops / rf->gemm)
                      : 0;
    row.roof_ms = 1e3 * roof;
    row.roof_frac = row.step_ms > 0 ? row.roof_ms / row.step_ms : 0;
    if (rc == 0) {
        bench_ceilings rce = *ce; /* the host read rate again, now: this row's */
        if (ce->host_read > 0) (void)bench_host_read_rate(m->rt, &rce.host_read_after);
        bench_offload_row off;
        bench_offload_row_make(c, &row.oi[0], &row.oi[1], row.steps, row.decode_s,
                               row.compute_ms, &rce, &off);
        char extra[2048];
        bench_offload_json(&off, &rce, extra, sizeof extra);
        print_row(&row);
        bench_offload_print(&off, &rce);
        rc = append_json(json, c, o, rf, &row, extra);
        *img_s = row.img_s;
    }
    flexdiag_context_destroy(c);
    return rc;
}

/* The sweep's lists: --policies / --sparsities, else the single --policy / --sparsity. */
/* Every row's policy flags through the library's validation that needs no decode length
 * (flexdiag__kvp_check): a flag error stops the run before the model loads; what depends on
 * the decode length fails its row at context creation. */
static int check_rows(const tp_opts *o, const flexdiag_policy_kind *kinds, int nk,
                      const double *sps, int ns) {
    for (int k = 0; k < nk; k++)
        for (int j = 0; j < ns; j++) {
            cli_policy_opts po = o->po;
            po.policy = flexdiag_policy_name(kinds[k]);
            po.sparsity = sps[j];
            flexdiag_policy_params pp;
            if (cli_policy_params("bench", &po, &pp)) return 2;
            flexdiag__err_clear();
            flexdiag_status st = flexdiag__kvp_check(&pp);
            if (st != FLEXDIAG_OK) return cli_fail("bench", st);
        }
    return 0;
}

static int sweep_lists(const tp_opts *o, flexdiag_policy_kind *kinds, int *nk, double *sps,
                       int *ns) {
    if (o->sparsities && (o->po.n_att > 0 || !isnan(o->po.sparsity))) {
        fprintf(stderr, "flexdiag bench: --sparsities excludes --n-att and --sparsity\n");
        return 2;
    }
    if (o->policies) {
        if (o->po.policy) {
            fprintf(stderr, "flexdiag bench: give --policy or --policies, not both\n");
            return 2;
        }
        if (bench_parse_policies("bench", o->policies, kinds, nk)) return 2;
    } else {
        flexdiag_policy_params pp;
        if (cli_policy_params("bench", &o->po, &pp)) return 2;
        *nk = 1;
        kinds[0] = pp.kind;
    }
    if (o->sparsities && bench_parse_sparsities("bench", o->sparsities, sps, ns)) return 2;
    if (!o->sparsities) {
        *ns = 1;
        sps[0] = o->po.sparsity;
    }
    return check_rows(o, kinds, *nk, sps, *ns);
}

static int throughput(const tp_opts *o) {
    flexdiag_policy_kind kinds[BENCH_MAX_LIST];
    double sps[BENCH_MAX_LIST];
    int nk = 0, ns = 0, rc = sweep_lists(o, kinds, &nk, sps, &ns);
    if (rc) return rc;
    flexdiag_runtime *rt = NULL;
    flexdiag_model *m = NULL;
    roofline rf = {0};
    cli_jsonl json = {.fd = -1}, *jp = o->json ? &json : NULL;
    if (jp && cli_jsonl_open(jp, o->json, 0) != FLEXDIAG_OK) { /* before any measuring */
        fprintf(stderr, "flexdiag bench: --json %s\n", cli_io_error());
        return 1;
    }
    rc = cli_open_model("bench", &o->mo, &rt, &m);
    if (rc == 0 && measure_roofline(rt, &rf))
        fprintf(stderr, "flexdiag bench: roofline measurement failed; fractions will be 0\n");
    bench_ceilings ce = {0};
    uint32_t kv[3];
    (void)cli_kv_pct("bench", &o->mo, kv);
    if (rc == 0) /* failures reported */
        (void)bench_offload_ceilings(rt, m, kv[0] < 100, o->mo.cpu_attention, &ce);
    if (rc == 0) print_header(rt, &rf, o, m);
    double dense = 0, best = 0;
    int rows = 0, first_rc = 0, best_k = 0, best_s = 0;
    for (int k = 0; rc == 0 && k < nk; k++)
        for (int j = 0; j < ns; j++) {
            int once = kinds[k] == FLEXDIAG_POLICY_DENSE || o->po.n_att > 0; /* no sparsity */
            if (once && j > 0) break;
            cli_policy_opts po = o->po;
            po.policy = flexdiag_policy_name(kinds[k]);
            po.sparsity = sps[j];
            double img_s = 0;
            int row_rc = bench_row(o, m, &rf, &ce, &po, jp, &img_s);
            if (row_rc && jp && !jp->path) rc = row_rc; /* --json failed (reported): stop */
            if (rc) break;
            if (row_rc) { /* reported; the sweep goes on, the exit code is the first failure's */
                if (nk * ns > 1)
                    fprintf(stderr, "flexdiag bench: row %s, sparsity %g failed\n", po.policy,
                            sps[j]);
                if (!first_rc) first_rc = row_rc;
                continue;
            }
            rows++;
            if (kinds[k] == FLEXDIAG_POLICY_DENSE) dense = img_s;
            if (img_s > best) best = img_s, best_k = k, best_s = j;
        }
    if (rows > 1) {
        printf("\nfastest: %s", flexdiag_policy_name(kinds[best_k]));
        if (kinds[best_k] != FLEXDIAG_POLICY_DENSE && o->po.n_att <= 0)
            printf(" at sparsity %g", sps[best_s]);
        printf(", %.3f img/s", best);
        if (dense > 0) printf(" (%.2fx dense)", best / dense);
        printf("\n");
    }
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    if (jp && cli_jsonl_close(jp) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag bench: --json %s\n", cli_io_error());
        rc = rc ? rc : 1;
    }
    return rc ? rc : first_rc;
}

int flexdiag_cmd_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "fidelity")) return flexdiag_cmd_bench_fidelity(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "throughput")) {
        argc--;
        argv++;
    }
    tp_opts o = {.mo.seed = 1, .po = CLI_POLICY_OPTS_INIT, .batch = "16", .prompt_len = 50,
                 .profile_steps = 8, .per_prompt = 1};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&o.mo),
        CLI_POLICY_FLAGS(&o.po),
        {.name = "--batch", CLI_STR, &o.batch, "images per block, or 'auto' (largest that fits)"},
        {.name = "--micro-batch", CLI_INT, &o.micro, "images per micro-batch (default: batch)",
         CLI_INTS(0, INT32_MAX, "0 = the whole batch")},
        {.name = "--prompt-len", CLI_INT, &o.prompt_len, "synthetic prompt tokens (default 50)",
         CLI_INTS(2, 1 << 20, NULL)},
        {.name = "--images-per-prompt", CLI_INT, &o.per_prompt,
         "images of each synthetic prompt; > 1: distinct prompts per group of N images, their "
         "KV prompt rows shared (default 1: one prompt, nothing shared)",
         CLI_INTS(1, 65536, "as generate's")},
        {.name = "--steps", CLI_INT, &o.steps,
         "tokens per image to run (default all; fewer = projected)",
         CLI_INTS(0, INT32_MAX, "0 = all tokens of an image")},
        {.name = "--gen-len", CLI_INT, &o.gen_len,
         "text models (and Lumina-mGPT as one): new tokens per sequence (default 128; images "
         "have a fixed length)", CLI_INTS(0, 1 << 20, "0 = the default")},
        {.name = "--profile-steps", CLI_INT, &o.profile_steps,
         "decode steps of the split profile, from mid-run (8)", CLI_INTS(0, INT32_MAX, NULL)},
        {.name = "--json", CLI_STR, &o.json, "append one JSON object per row to FILE"},
        {.name = "--policies", CLI_STR, &o.policies, "policy search: comma list, one row each"},
        {.name = "--sparsities", CLI_STR, &o.sparsities,
         "policy search: comma list of S per policy"},
    };
    int rc = cli_parse("bench", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if (cli_check_model("bench", &o.mo) ||
        (strcmp(o.batch, "auto") && cli_batch("bench", o.batch, NULL, NULL) < 1))
        return 2;
    return throughput(&o);
}
