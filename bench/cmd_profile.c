/*
 * cmd_profile.c - `flexdiag profile`: measures this machine once for the policy search and
 * writes the rates as JSON (cost_model.h cm_profile; docs/search.md §1).
 *
 * Through the runtime's op table, as the engine moves and computes: pinned H2D and D2H copies
 * on a copy stream at four transfer sizes and a KV home's strided load, the device copy rate (bytes read + written), bf16
 * GEMM rates for six row counts n of (n, k) x (k, 4k), the host memory read rate and the CPU
 * attention kernel's, the time of one small op (launched directly and replayed from a launch
 * graph: what the engine's norms, activations and KV appends cost beyond their bytes), and with
 * --offload-dir the store's O_DIRECT read rate at the scheduler's request size and queue depth. On the CPU backend the
 * "device" is host memory, so every rate is the CPU's. Buffers come from the device budget.
 * Progress goes to stderr, the file path to stdout. The file's folder is made and the file
 * checked writable before anything is measured.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "bench/bench.h"
#include "bench/cost_model.h"
#include "bench/offload_report.h"
#include "bench/timing.h"
#include "cli/cli.h"
#include "offload/sched.h"
#include "offload/store.h"
#include "runtime/engine/engine.h"

#define REPS 4                              /* timed repeats per sample (timing.h) */
#define DISK_QD 64                          /* the store's default queue depth */
#define DISK_BYTES ((uint64_t)256 << 20)    /* file region read for the disk rate */

typedef struct prof_opts {
    const char *out, *offload_dir;
    int cpu;
    int64_t threads;
} prof_opts;

/* Progress of a phase: one line redrawn on a terminal, only the finished line in a log. */
static void progress(const char *what, int i, int n) {
    int tty = isatty(fileno(stderr));
    if (!tty && i != n) return;
    fprintf(stderr, "%sflexdiag profile: %-28s %d/%d", tty ? "\r" : "", what, i, n);
    if (i == n) fputc('\n', stderr);
    fflush(stderr);
}

/* The runtime's device for reports and profile names ("NVIDIA H200", the CPU's model name). */
void bench_device_name(const flexdiag_runtime *rt, char *out, size_t n) {
    if (rt->k->device_name) rt->k->device_name(rt->s, out, n);
    else snprintf(out, n, "%s", rt->k->name);
}

/* ---- copies ---- */

typedef struct kv_load_call {
    const flexdiag_kernels *k;
    flexdiag_stream *s;
    void *dev;
    const void *host;
    size_t width, pitch, rows;
} kv_load_call;

static flexdiag_status kv_load_once(void *ctx) {
    const kv_load_call *c = ctx;
    return c->k->copy_h2d_2d_async(c->dev, c->pitch, c->host, c->pitch, c->width, c->rows, c->s);
}

/* Bytes/s of a KV home's load (offload/sched_kv.c): copy_h2d_2d_async of 66 rows of 256 bytes
 * out of every 626-row (sequence, KV head) block in a top-byte pinned buffer (Janus-Pro-7B
 * shapes early in an image), -1 on failure. On CUDA the device gathers these rows itself. */
static double time_kv_load(const flexdiag_kernels *k, flexdiag_stream *s, void *dev, void *host,
                           size_t top) {
    kv_load_call c = {k, s, dev, host, 66 * 256, 626 * 256, top / (626 * 256)};
    double t = bench_time_calls(k, s, REPS, kv_load_once, &c);
    return t > 0 ? (double)(c.width * c.rows) / t : -1;
}

static int measure_copies(flexdiag_runtime *rt, cm_profile *p) {
    const flexdiag_kernels *k = rt->k;
    int gpu = k->act_bytes == 2;
    size_t top = gpu ? (size_t)512 << 20 : (size_t)32 << 20;
    const size_t sizes[CM_COPY_SIZES] = {top >> 9, top >> 5, top >> 2, top};
    void *dev = NULL, *dev2 = NULL, *host = NULL;
    flexdiag_stream *cs = NULL;
    flexdiag_status st = flexdiag__arena_alloc(&rt->arena, top, "the profile's copies", &dev);
    if (st == FLEXDIAG_OK) st = flexdiag__arena_alloc(&rt->arena, top, "the profile's copies", &dev2);
    if (st == FLEXDIAG_OK) st = k->host_alloc ? k->host_alloc(top, &host) : FLEXDIAG_OK;
    if (st == FLEXDIAG_OK && !k->host_alloc && !(host = malloc(top))) st = FLEXDIAG_ERR_OOM_HOST;
    if (st == FLEXDIAG_OK) memset(host, 1, top);
    if (st == FLEXDIAG_OK) st = k->copy_stream_create(rt->p.device, &cs);
    for (int i = 0; st == FLEXDIAG_OK && i < CM_COPY_SIZES; i++) {
        progress("pinned H2D / D2H", i, CM_COPY_SIZES);
        double h = bench_time_copy(k, cs, dev, NULL, host, sizes[i], 0, REPS);
        double d = bench_time_copy(k, cs, dev, NULL, host, sizes[i], 1, REPS);
        p->copy_bytes[i] = (double)sizes[i];
        p->h2d[i] = h > 0 ? (double)sizes[i] / h : 0;
        p->d2h[i] = d > 0 ? (double)sizes[i] / d : 0;
    }
    if (st == FLEXDIAG_OK) progress("pinned H2D / D2H", CM_COPY_SIZES, CM_COPY_SIZES);
    double kv = st == FLEXDIAG_OK ? time_kv_load(k, cs, dev, host, top) : -1;
    p->kv_h2d = kv > 0 ? kv : 0;
    double t = st == FLEXDIAG_OK ? bench_time_copy(k, rt->s, dev, dev2, NULL, top, 2, REPS) : -1;
    p->hbm = t > 0 ? 2.0 * (double)top / t : 0;
    if (cs) k->stream_destroy(cs);
    if (k->host_alloc) k->host_free(host);
    else free(host);
    flexdiag__arena_free(&rt->arena, dev, top);
    flexdiag__arena_free(&rt->arena, dev2, top);
    if (st == FLEXDIAG_OK && p->hbm > 0) return 0;
    fprintf(stderr, "flexdiag profile: copy rates not measured: %s\n", flexdiag__err_msg());
    return 1;
}

/* ---- GEMM ---- */

typedef struct gemm_call {
    flexdiag_runtime *rt;
    void *x, *out;
    const uint16_t *w;
    int64_t n, kk, nn;
} gemm_call;

static flexdiag_status gemm_once(void *ctx) {
    const gemm_call *c = ctx;
    return c->rt->k->matmul(c->out, c->x, c->w, NULL, c->n, c->kk, c->nn, 0, c->rt->s);
}

/* FLOP/s of out (n, nn) = x (n, kk) W (nn, kk)^T on rt's stream; x and W hold a non-zero
 * pattern (zeros run faster than real data on some GPUs). */
static double time_gemm(flexdiag_runtime *rt, void *x, const uint16_t *w, void *out, int64_t n,
                        int64_t kk, int64_t nn) {
    gemm_call c = {rt, x, out, w, n, kk, nn};
    double s = bench_time_calls(rt->k, rt->s, REPS, gemm_once, &c);
    return s > 0 ? 2.0 * (double)n * (double)kk * (double)nn / s : 0;
}

/* Fill n act values at dev from a pattern (through an f32 buffer of the arena). */
static flexdiag_status fill_act(flexdiag_runtime *rt, void *dev, size_t n) {
    const flexdiag_kernels *k = rt->k;
    float *h = malloc(n * 4);
    void *f = NULL;
    flexdiag_status st = h ? flexdiag__arena_alloc(&rt->arena, n * 4, "the profile's GEMMs", &f)
                           : FLEXDIAG_ERR_OOM_HOST;
    for (size_t i = 0; h && i < n; i++) h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    if (st == FLEXDIAG_OK) st = k->copy_h2d(f, h, n * 4, rt->s);
    if (st == FLEXDIAG_OK) st = k->act_from_f32(dev, f, (int64_t)n, rt->s);
    if (st == FLEXDIAG_OK) st = k->stream_sync(rt->s);
    flexdiag__arena_free(&rt->arena, f, n * 4);
    free(h);
    return st;
}

static int measure_gemms(flexdiag_runtime *rt, cm_profile *p) {
    const flexdiag_kernels *k = rt->k;
    int gpu = k->act_bytes == 2;
    /* W as wide as a 7B layer's gate/up GEMM (n = 4k): a square 4096 x 4096 weight is small
     * enough that launch and tail effects halve the small-row rates the models never see */
    const int64_t kk = gpu ? 4096 : 256, nn = 4 * kk;
    const int64_t rows[CM_GEMM_ROWS] = {1, 8, 32, 128, 512, 4096};
    size_t xa = (size_t)rows[CM_GEMM_ROWS - 1] * (size_t)kk, wn = (size_t)kk * (size_t)nn;
    size_t oa = (size_t)rows[CM_GEMM_ROWS - 1] * (size_t)nn;
    size_t ab = (size_t)k->act_bytes;
    void *x = NULL, *out = NULL, *w = NULL;
    uint16_t *wh = malloc(wn * 2);
    flexdiag_status st = wh ? FLEXDIAG_OK : FLEXDIAG_ERR_OOM_HOST;
    for (size_t i = 0; wh && i < wn; i++)
        wh[i] = flexdiag__f32_to_bf16((float)((i * 40503u) % 1000) / 1e5f - 0.005f);
    if (st == FLEXDIAG_OK) st = flexdiag__arena_alloc(&rt->arena, xa * ab, "the profile's GEMMs", &x);
    if (st == FLEXDIAG_OK) st = flexdiag__arena_alloc(&rt->arena, oa * ab, "the profile's GEMMs", &out);
    if (st == FLEXDIAG_OK) st = flexdiag__arena_alloc(&rt->arena, wn * 2, "the profile's GEMMs", &w);
    if (st == FLEXDIAG_OK) st = k->copy_h2d(w, wh, wn * 2, rt->s);
    if (st == FLEXDIAG_OK) st = fill_act(rt, x, xa);
    p->gemm_k = kk;
    for (int i = 0; st == FLEXDIAG_OK && i < CM_GEMM_ROWS; i++) {
        progress("GEMM rates by rows", i, CM_GEMM_ROWS);
        p->gemm_rows[i] = (double)rows[i];
        p->gemm[i] = time_gemm(rt, x, w, out, rows[i], kk, nn);
    }
    if (st == FLEXDIAG_OK) progress("GEMM rates by rows", CM_GEMM_ROWS, CM_GEMM_ROWS);
    free(wh);
    flexdiag__arena_free(&rt->arena, x, xa * ab);
    flexdiag__arena_free(&rt->arena, out, oa * ab);
    flexdiag__arena_free(&rt->arena, w, wn * 2);
    if (st == FLEXDIAG_OK && p->gemm[0] > 0) return 0;
    fprintf(stderr, "flexdiag profile: GEMM rates not measured: %s\n", flexdiag__err_msg());
    return 1;
}

/* ---- small ops ---- */

#define OP_CHAIN 64 /* small ops per timed chain */

typedef struct op_chain_call {
    flexdiag_runtime *rt;
    void *out, *graph;
    const void *gu;
} op_chain_call;

static flexdiag_status op_chain_once(void *ctx) {
    const op_chain_call *c = ctx;
    const flexdiag_kernels *k = c->rt->k;
    if (c->graph) return k->graph_launch(c->graph, c->rt->s);
    flexdiag_status st = FLEXDIAG_OK;
    for (int j = 0; st == FLEXDIAG_OK && j < OP_CHAIN; j++)
        st = k->swiglu(c->out, c->gu, 1, 1024, c->rt->s);
    return st;
}

/* Seconds per op of a chain of OP_CHAIN swiglu ops over one 1024-wide row on rt's stream,
 * replayed from a launch graph (graph 1; the backend has graphs) or launched one by one. */
static double time_op_chain(flexdiag_runtime *rt, void *out, const void *gu, int graph) {
    const flexdiag_kernels *k = rt->k;
    op_chain_call c = {rt, out, NULL, gu};
    if (graph) {
        flexdiag_status st = k->graph_begin(rt->s);
        for (int i = 0; st == FLEXDIAG_OK && i < OP_CHAIN; i++)
            st = k->swiglu(out, gu, 1, 1024, rt->s);
        flexdiag_status st2 = k->graph_end(rt->s, &c.graph);
        if (st != FLEXDIAG_OK || st2 != FLEXDIAG_OK) {
            if (c.graph) k->graph_destroy(c.graph);
            return -1;
        }
    }
    double t = bench_time_calls(k, rt->s, REPS, op_chain_once, &c);
    if (c.graph) k->graph_destroy(c.graph);
    return t > 0 ? t / OP_CHAIN : -1;
}

static int measure_ops(flexdiag_runtime *rt, cm_profile *p) {
    const flexdiag_kernels *k = rt->k;
    size_t ab = (size_t)k->act_bytes;
    void *gu = NULL, *out = NULL;
    flexdiag_status st = flexdiag__arena_alloc(&rt->arena, 2048 * ab, "the profile's small ops", &gu);
    if (st == FLEXDIAG_OK) st = flexdiag__arena_alloc(&rt->arena, 1024 * ab, "the profile's small ops", &out);
    if (st == FLEXDIAG_OK) st = fill_act(rt, gu, 2048);
    double e = st == FLEXDIAG_OK ? time_op_chain(rt, out, gu, 0) : -1;
    double g = e > 0 && k->graph_begin ? time_op_chain(rt, out, gu, 1) : -1;
    flexdiag__arena_free(&rt->arena, gu, 2048 * ab);
    flexdiag__arena_free(&rt->arena, out, 1024 * ab);
    p->op_eager = e > 0 ? e : 0;
    p->op_graph = g > 0 ? g : p->op_eager; /* no graphs: the engine launches op by op */
    if (e > 0) return 0;
    fprintf(stderr, "flexdiag profile: small-op time not measured: %s\n", flexdiag__err_msg());
    return 1;
}

/* ---- disk ---- */

/* Submit and wait one batch of n requests of op over [at, at + n·req) through buf. */
static flexdiag_status disk_batch(flexdiag_store *s, int op, uint64_t at, int n, size_t req,
                                  char *buf) {
    flexdiag_store_req rq[DISK_QD];
    for (int i = 0; i < n; i++)
        rq[i] = (flexdiag_store_req){op, at + (uint64_t)i * req, req, buf + (size_t)i * req};
    flexdiag_store_ticket t = 0;
    FLEXDIAG_TRY(flexdiag__store_submit(s, rq, n, &t));
    return flexdiag__store_wait(s, t);
}

/* Write DISK_BYTES to a store in dir, then read them back DISK_QD requests at a time. */
static int measure_disk(const char *dir, cm_profile *p) {
    flexdiag_store_params sp;
    flexdiag__store_params_init(&sp);
    sp.dir = dir;
    sp.budget = DISK_BYTES;
    sp.name = "the profile's disk test (--offload-dir)";
    flexdiag_store *s = NULL;
    flexdiag_store_extent e = {0};
    size_t req = FLEXDIAG_SCHED_READ_CHUNK, span = (size_t)DISK_QD * req;
    char *buf = NULL;
    flexdiag_status st = flexdiag__store_create(&sp, &s);
    if (st == FLEXDIAG_OK) st = flexdiag__store_alloc(s, DISK_BYTES, "the profile's disk test", &e);
    if (st == FLEXDIAG_OK && posix_memalign((void **)&buf, FLEXDIAG_STORE_ALIGN, span))
        st = FLEXDIAG_ERR_OOM_HOST;
    if (st == FLEXDIAG_OK) memset(buf, 7, span);
    int n = (int)(DISK_BYTES / req);
    for (uint64_t at = 0; st == FLEXDIAG_OK && at < DISK_BYTES; at += span)
        st = disk_batch(s, FLEXDIAG_STORE_WRITE, e.off + at, n < DISK_QD ? n : DISK_QD, req, buf);
    double t0 = flexdiag__now();
    for (uint64_t at = 0; st == FLEXDIAG_OK && at < DISK_BYTES; at += span) {
        progress("disk O_DIRECT reads", (int)(at / span), (int)(DISK_BYTES / span));
        st = disk_batch(s, FLEXDIAG_STORE_READ, e.off + at, n < DISK_QD ? n : DISK_QD, req, buf);
    }
    double secs = flexdiag__now() - t0;
    if (st == FLEXDIAG_OK) progress("disk O_DIRECT reads", 1, 1);
    free(buf);
    flexdiag__store_destroy(s);
    p->disk = st == FLEXDIAG_OK && secs > 0 ? (double)DISK_BYTES / secs : 0;
    p->disk_qd = DISK_QD;
    p->disk_req = (double)req;
    if (st == FLEXDIAG_OK) return 0;
    fprintf(stderr, "flexdiag profile: --offload-dir %s: disk rate not measured: %s\n", dir,
            flexdiag__err_msg());
    return 1;
}

/* ---- command ---- */

/* Where the profile goes (--out, or the cache path of device), its folder made and the file
 * checked writable before anything is measured: 0, or an exit code after a message. */
static int out_path(const prof_opts *o, const char *device, char *path, size_t n) {
    if (!o->out && cm_profile_path(device, path, n)) {
        fprintf(stderr, "flexdiag profile: neither XDG_CACHE_HOME nor HOME is set: give --out "
                        "FILE\n");
        return 2;
    }
    if (o->out) snprintf(path, n, "%s", o->out);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = 0;
    if (slash && slash != dir && cli_mkdirs(dir)) {
        fprintf(stderr, "flexdiag profile: %s %s: cannot make the folder %s (nothing was run)\n",
                o->out ? "--out" : "the profile", path, dir);
        return 1;
    }
    return cli_check_writable("profile", o->out ? "--out" : "the profile", path);
}

static int profile(const prof_opts *o) {
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    if (o->cpu) rp.device = -1;
    rp.threads = (int)o->threads;
    flexdiag_runtime *rt = NULL;
    flexdiag_status st = flexdiag_runtime_create(&rp, &rt);
    if (st != FLEXDIAG_OK) return cli_fail("profile", st);
    cm_profile p;
    memset(&p, 0, sizeof p);
    bench_device_name(rt, p.device, sizeof p.device);
    snprintf(p.backend, sizeof p.backend, "%s", rt->k->name);
    char path[4096];
    int rc = out_path(o, p.device, path, sizeof path);
    if (rc) {
        flexdiag_runtime_destroy(rt);
        return rc;
    }
    double t0 = flexdiag__now();
    rc = measure_copies(rt, &p) || measure_gemms(rt, &p) || measure_ops(rt, &p);
    if (!rc) {
        progress("host memory read", 0, 2);
        rc = bench_host_read_rate(rt, &p.host_read);
        if (!rc) progress("host memory read", 1, 2);
        if (!rc) rc = bench_host_attn_rate(rt, &p.host_attn);
        if (!rc) progress("host memory read", 2, 2);
    }
    if (!rc && o->offload_dir) rc = measure_disk(o->offload_dir, &p);
    flexdiag_runtime_destroy(rt);
    if (!rc) rc = cm_profile_write(&p, path);
    if (rc) return 1;
    fprintf(stderr, "flexdiag profile: %s (%s) measured in %.1f s: H2D %.2f GB/s, copy %.1f "
            "GB/s, KV load %.2f GB/s, GEMM %.1f GFLOP/s at %g rows, small op %.2f us (%.2f us "
            "from a graph), host read %.1f GB/s, CPU attention %.1f GB/s%s\n",
            p.device, p.backend, flexdiag__now() - t0, p.h2d[CM_COPY_SIZES - 1] / 1e9,
            p.hbm / 1e9, p.kv_h2d / 1e9, p.gemm[CM_GEMM_ROWS - 1] / 1e9,
            p.gemm_rows[CM_GEMM_ROWS - 1], 1e6 * p.op_eager, 1e6 * p.op_graph,
            p.host_read / 1e9, p.host_attn / 1e9,
            o->offload_dir ? "" : "; no disk rate (no --offload-dir)");
    printf("%s\n", path);
    return 0;
}

int flexdiag_cmd_profile(int argc, char **argv) {
    prof_opts o = {0};
    const cli_opt opts[] = {
        {.name = "--out", CLI_STR, &o.out,
         "profile file (default $XDG_CACHE_HOME or ~/.cache: flexdiag/profile-<device>.json)"},
        {.name = "--offload-dir", CLI_STR, &o.offload_dir,
         "folder on the disk the store will use: measure its O_DIRECT read rate"},
        {.name = "--cpu", CLI_FLAG, &o.cpu, "profile the CPU engine even if a GPU is present"},
        {.name = "--threads", CLI_INT, &o.threads, "CPU threads (default 0: all cores)",
         CLI_INTS(0, CLI_MAX_THREADS, "0 = all cores")},
    };
    int rc = cli_parse("profile", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    return profile(&o);
}
