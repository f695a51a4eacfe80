/*
 * offload_report.c - the transfer ceilings and the offload columns of a bench row
 * (offload_report.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "base/thread_pool.h"
#include "bench/offload_report.h"
#include "bench/timing.h"
#include "runtime/engine/engine.h"

#define CEIL_REPS 8
#define DISK_QD 64                       /* the store's default queue depth */
#define DISK_MAX_BYTES (4ull << 30)      /* read at most this much for the disk ceiling */

/* ---- ceilings ---- */

/* Pinned H2D / D2H at the size of a weight slot, or 256 MiB when only the KV moves (capped by
 * what the budget has left). */
static int copy_ceilings(flexdiag_runtime *rt, const flexdiag_model *m, bench_ceilings *out) {
    const flexdiag_kernels *k = rt->k;
    size_t n = m->w.homes ? flexdiag__sched_tiered_slot_bytes(m->w.homes) : (size_t)256 << 20;
    uint64_t avail = flexdiag__arena_available(&rt->arena);
    if (n > avail / 2) n = (size_t)(avail / 2);
    if (n > (1u << 30)) n = 1u << 30;
    n &= ~(size_t)4095;
    if (n < 4096) return 0;
    void *dev = NULL, *host = NULL;
    flexdiag_stream *cs = NULL;
    int pinned = k->host_alloc != NULL;
    flexdiag_status st = flexdiag__arena_alloc(&rt->arena, n, "the bench's copy ceiling", &dev);
    if (st == FLEXDIAG_OK) st = pinned ? k->host_alloc(n, &host) : FLEXDIAG_OK;
    if (st == FLEXDIAG_OK && !pinned && !(host = malloc(n))) st = FLEXDIAG_ERR_OOM_HOST;
    if (st == FLEXDIAG_OK) memset(host, 1, n);
    if (st == FLEXDIAG_OK) st = k->copy_stream_create(rt->p.device, &cs);
    double h = st == FLEXDIAG_OK ? bench_time_copy(k, cs, dev, NULL, host, n, 0, CEIL_REPS) : -1;
    double d = st == FLEXDIAG_OK ? bench_time_copy(k, cs, dev, NULL, host, n, 1, CEIL_REPS) : -1;
    out->copy_bytes = n;
    out->h2d = h > 0 ? (double)n / h : 0;
    out->d2h = d > 0 ? (double)n / d : 0;
    k->stream_destroy(cs);
    if (pinned) k->host_free(host);
    else free(host);
    flexdiag__arena_free(&rt->arena, dev, n);
    if (st == FLEXDIAG_OK) return 0;
    fprintf(stderr, "flexdiag bench: copy ceiling not measured: %s\n", flexdiag__err_msg());
    return 1;
}

/* O_DIRECT reads of a store extent (the weights' or a KV home's own) at the schedulers'
 * request size, DISK_QD requests in flight all the time: two batches of DISK_QD / 2, the next
 * submitted as soon as one completes (as the scheduler keeps layers' reads queued). */
static int disk_ceiling(flexdiag_runtime *rt, const flexdiag_store_extent *ext,
                        bench_ceilings *out) {
    uint64_t total = ext->span < DISK_MAX_BYTES ? ext->span : DISK_MAX_BYTES;
    size_t req = FLEXDIAG_SCHED_READ_CHUNK;
    const int half = DISK_QD / 2;
    total -= total % req;
    if (total == 0) req = (size_t)ext->span, total = req;
    /* the buffers come from the pinned pool where it has room: registered with the store like
     * the scheduler's staging, so both read the same way */
    size_t bytes = (size_t)DISK_QD * req;
    char *buf = NULL;
    int pooled = rt->pool && flexdiag__host_pool_alloc(rt->pool, bytes, "the bench's disk ceiling",
                                                       (void **)&buf) == FLEXDIAG_OK;
    flexdiag__err_clear();
    if (!pooled && posix_memalign((void **)&buf, FLEXDIAG_STORE_ALIGN, bytes)) return 1;
    flexdiag_store_req rq[DISK_QD];
    flexdiag_store_ticket tk[2] = {0, 0};
    flexdiag_status st = FLEXDIAG_OK;
    uint64_t at = 0;
    double t0 = flexdiag__now();
    for (int b = 0; st == FLEXDIAG_OK && (at < total || tk[0] || tk[1]); b ^= 1) {
        if (tk[b]) st = flexdiag__store_wait(rt->store, tk[b]);
        tk[b] = 0;
        int n = 0;
        for (; st == FLEXDIAG_OK && n < half && at < total; n++, at += req)
            rq[b * half + n] = (flexdiag_store_req){FLEXDIAG_STORE_READ, ext->off + at, req,
                                                    buf + (size_t)(b * half + n) * req};
        if (n) st = flexdiag__store_submit(rt->store, rq + b * half, n, &tk[b]);
    }
    for (int b = 0; b < 2; b++)
        if (tk[b]) (void)flexdiag__store_wait(rt->store, tk[b]);
    double s = flexdiag__now() - t0;
    if (pooled) flexdiag__host_pool_free(rt->pool, buf, bytes);
    else free(buf);
    out->disk = st == FLEXDIAG_OK && s > 0 ? (double)total / s : 0;
    out->disk_req = req;
    out->disk_qd = DISK_QD;
    if (st == FLEXDIAG_OK) return 0;
    fprintf(stderr, "flexdiag bench: disk ceiling not measured: %s\n", flexdiag__err_msg());
    return 1;
}

/* ---- host memory read rate (the CPU attention's bound) ---- */

#define HOST_READ_BYTES ((size_t)2 << 30) /* far beyond any last-level cache */
#define HOST_READ_TASK ((size_t)4 << 20)

#define READ_TASK_MIN ((size_t)16 << 10) /* bytes of a task reading a small buffer */

typedef struct read_job {
    const uint32_t *buf;
    size_t task;    /* bytes per task, a multiple of 64 */
    uint32_t *sums; /* one per task: keeps the reads alive */
} read_job;

/* Integer sums: any bytes (a KV home's bf16 pairs read as floats would hit denormals). */
static void read_task(void *ctx, int64_t t, void *scratch) {
    (void)scratch;
    const read_job *j = ctx;
    const uint32_t *p = j->buf + (size_t)t * (j->task / sizeof(uint32_t));
    uint32_t part[16] = {0};
    for (size_t i = 0; i < j->task / sizeof(uint32_t); i += 16)
        for (int l = 0; l < 16; l++) part[l] += p[i + l];
    uint32_t s = 0;
    for (int l = 0; l < 16; l++) s += part[l];
    j->sums[t] = s;
}

/* Bytes/s of the best of `passes` passes of the pool's threads summing [buf, buf + bytes) in
 * tasks of `task` bytes (the whole tasks in it), or of fewer passes (at least one) once they
 * have taken BENCH_SAMPLE_BUDGET_S. */
static flexdiag_status read_rate_tasks(const flexdiag_runtime *rt, const void *buf, size_t bytes,
                                       size_t task, int passes, double *out) {
    int64_t n_tasks = (int64_t)(bytes / task);
    uint32_t *sums = calloc((size_t)n_tasks + 1, sizeof *sums);
    flexdiag_pool *pool = NULL;
    flexdiag_status st = sums ? flexdiag__pool_create(rt->p.threads, &pool)
                              : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "no host memory");
    read_job j = {buf, task, sums};
    double best = 0, spent = 0;
    for (int pass = 0; st == FLEXDIAG_OK && pass < passes && spent < BENCH_SAMPLE_BUDGET_S; pass++) {
        double t0 = flexdiag__now();
        st = flexdiag__pool_parallel_for(pool, n_tasks, 0, read_task, &j);
        double s = flexdiag__now() - t0;
        spent += s;
        if (s > 0 && (double)n_tasks * (double)task / s > best)
            best = (double)n_tasks * (double)task / s;
    }
    flexdiag__pool_destroy(pool);
    free(sums);
    *out = st == FLEXDIAG_OK ? best : 0;
    return st;
}

static flexdiag_status read_rate(const flexdiag_runtime *rt, const void *buf, size_t bytes,
                                 int passes, double *out) {
    return read_rate_tasks(rt, buf, bytes, HOST_READ_TASK, passes, out);
}

int bench_read_rate_at(const flexdiag_runtime *rt, size_t bytes, double *out) {
    size_t task = bytes / 64 & ~(size_t)63; /* up to 64 tasks: every thread busy */
    task = task < READ_TASK_MIN ? READ_TASK_MIN : task > HOST_READ_TASK ? HOST_READ_TASK : task;
    size_t n = (bytes + task - 1) / task * task;
    void *buf = malloc(n);
    flexdiag_status st = buf ? FLEXDIAG_OK : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "no host memory");
    if (st == FLEXDIAG_OK) memset(buf, 1, n);
    if (st == FLEXDIAG_OK) st = read_rate_tasks(rt, buf, n, task, 20, out);
    free(buf);
    if (st == FLEXDIAG_OK) return 0;
    *out = 0;
    fprintf(stderr, "flexdiag bench: read rate at %zu bytes not measured: %s\n", n,
            flexdiag__err_msg());
    return 1;
}

int bench_host_read_rate(const flexdiag_runtime *rt, double *out) {
    void *buf = malloc(HOST_READ_BYTES);
    flexdiag_status st = buf ? FLEXDIAG_OK : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "no host memory");
    if (st == FLEXDIAG_OK) memset(buf, 1, HOST_READ_BYTES);
    if (st == FLEXDIAG_OK) st = read_rate(rt, buf, HOST_READ_BYTES, 3, out);
    free(buf);
    if (st == FLEXDIAG_OK) return 0;
    *out = 0;
    fprintf(stderr, "flexdiag bench: host read rate not measured: %s\n", flexdiag__err_msg());
    return 1;
}

int bench_offload_kv_home_read(const flexdiag_context *c, bench_ceilings *out) {
    if (!c->homes.ca || !c->homes.kv_host) return 0;
    size_t bytes = (size_t)c->m->cfg.lm.layers * 2 * (size_t)(c->homes.s_disk - c->homes.s_host) * c->geo.seq_bytes;
    if (read_rate(c->m->rt, c->homes.kv_host, bytes, 2, &out->home_read) == FLEXDIAG_OK) return 0;
    fprintf(stderr, "flexdiag bench: KV home read rate not measured: %s\n", flexdiag__err_msg());
    return 1;
}

/* ---- the CPU attention kernel's rate (the cost model's CPU attention term) ---- */

#define HA_SEQ 16     /* sequences of one micro-batch home */
#define HA_HEADS 32   /* KV heads (Janus-Pro-7B's) */
#define HA_DH 128
#define HA_PROMPT 50
#define HA_RING 288   /* every row attended: 338 per (sequence, head) */
#define HA_BYTES ((size_t)512 << 20) /* KV of the homes visited in turn: past the last-level cache */

int bench_host_attn_rate(const flexdiag_runtime *rt, double *out) {
    *out = 0;
    const int act = rt->k->act_bytes;
    const size_t rows = HA_PROMPT + HA_RING, home = (size_t)HA_SEQ * HA_HEADS * rows * HA_DH * act;
    const int homes = (int)(HA_BYTES / (2 * home)); /* 12 of bf16, 6 of fp32 */
    char *kv = malloc(2 * (size_t)homes * home);
    void *qkv = calloc((size_t)HA_SEQ * 3 * HA_HEADS * HA_DH, (size_t)act);
    void *att = calloc((size_t)HA_SEQ * HA_HEADS * HA_DH, (size_t)act);
    float *cs = calloc((size_t)HA_SEQ * HA_DH, sizeof *cs);
    int32_t lp[HA_SEQ], pos[HA_SEQ], wrow[HA_SEQ * HA_HEADS], n_slots[HA_SEQ];
    int32_t slots[HA_SEQ * HA_RING]; /* one list per sequence, as the engine passes them */
    flexdiag_stream *cpu = NULL;
    flexdiag_status st = kv && qkv && att && cs ? FLEXDIAG_OK
                                                : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "no host memory");
    if (st == FLEXDIAG_OK) st = flexdiag__kernels_cpu()->stream_create(-1, rt->p.threads, &cpu);
    if (st == FLEXDIAG_OK) memset(kv, 0x3c, 2 * (size_t)homes * home); /* bf16 0.0115 / fp32 0.0115 */
    for (int i = 0; i < HA_SEQ; i++) lp[i] = HA_PROMPT, pos[i] = HA_PROMPT + HA_RING;
    for (int i = 0; i < HA_SEQ * HA_HEADS; i++) wrow[i] = HA_PROMPT + HA_RING - 1;
    for (int i = 0; i < HA_SEQ * HA_RING; i++) slots[i] = i % HA_RING;
    for (int i = 0; i < HA_SEQ; i++) n_slots[i] = HA_RING;
    flexdiag_host_attn h = {
        .out = att, .qkv = qkv, .rows = wrow, .cs = cs, .act_bytes = act,
        .a = {.n_seq = HA_SEQ, .h_q = HA_HEADS, .h_kv = HA_HEADS, .d_h = HA_DH,
              .p_cap = HA_PROMPT, .ring = HA_RING, .scale = 0.088f, .lp = lp, .slots = slots,
              .n_slots = n_slots, .max_slots = HA_RING, .shared_slots = FLEXDIAG_SLOTS_PER_SEQ,
              .pos = pos, .rope_theta = 10000.0f}};
    double t0 = 0;
    for (int i = 0; st == FLEXDIAG_OK && i < 2 * homes; i++) { /* the second pass is timed */
        if (i == homes) t0 = flexdiag__now();
        h.k = kv + (size_t)(i % homes) * 2 * home;
        h.v = (char *)h.k + home;
        st = flexdiag__host_attn_decode(&h, cpu);
    }
    double s = flexdiag__now() - t0;
    if (cpu) flexdiag__kernels_cpu()->stream_destroy(cpu);
    free(kv);
    free(qkv);
    free(att);
    free(cs);
    if (st == FLEXDIAG_OK && s > 0) *out = 2.0 * homes * (double)home / s;
    if (st == FLEXDIAG_OK) return 0;
    fprintf(stderr, "flexdiag profile: CPU attention rate not measured: %s\n", flexdiag__err_msg());
    return 1;
}

int bench_offload_ceilings(flexdiag_runtime *rt, const flexdiag_model *m, int kv_homes,
                           int cpu_attention, bench_ceilings *out) {
    memset(out, 0, sizeof *out);
    if (!m->w.homes && !kv_homes) return 0;
    int rc = copy_ceilings(rt, m, out);
    if (m->w.homes && m->w.homes->store) rc |= disk_ceiling(rt, &m->w.homes->ext, out);
    if (cpu_attention) rc |= bench_host_read_rate(rt, &out->host_read);
    return rc;
}

int bench_offload_kv_disk_ceiling(const flexdiag_context *c, bench_ceilings *out) {
    if (out->disk > 0 || !c->homes.kv_disk.bytes) return 0;
    return disk_ceiling(c->m->rt, &c->homes.kv_disk, out);
}

/* ---- the row ---- */

void bench_offload_row_make(const flexdiag_context *c, const flexdiag_offload_info *before,
                            const flexdiag_offload_info *after, int32_t n_steps, double decode_s,
                            double compute_ms, const bench_ceilings *ce, bench_offload_row *out) {
    memset(out, 0, sizeof *out);
    out->oi = *after;
    out->compute_ms = compute_ms;
    uint64_t loads = after->loads - before->loads;
    double L = c->m->cfg.lm.layers, steps = n_steps > 1 ? n_steps - 1 : 1;
    if (loads) {
        out->h2d_step = (double)(after->h2d_bytes - before->h2d_bytes) / (double)loads * L;
        out->disk_step = (double)(after->disk_read_bytes - before->disk_read_bytes) /
                         (double)loads * L;
    }
    out->kv_h2d_step = (double)(after->kv_h2d_bytes - before->kv_h2d_bytes) / steps;
    out->kv_d2h_step = (double)(after->kv_d2h_bytes - before->kv_d2h_bytes) / steps;
    out->kv_disk_step = (double)(after->kv_disk_read_bytes - before->kv_disk_read_bytes +
                                 after->kv_disk_write_bytes - before->kv_disk_write_bytes) /
                        steps;
    out->ca_kv_step = (double)(after->cpu_attn_kv_bytes - before->cpu_attn_kv_bytes) / steps;
    out->ca_s_step = (after->cpu_attn_s - before->cpu_attn_s) / steps;
    out->ca_rows_step = (double)(after->cpu_attn_d2h_bytes - before->cpu_attn_d2h_bytes +
                                 after->cpu_attn_h2d_bytes - before->cpu_attn_h2d_bytes) /
                        steps;
    double step = n_steps > 1 ? decode_s / (n_steps - 1) : 0;
    if (step <= 0) return;
    double up = out->h2d_step + out->kv_h2d_step; /* weights and KV share the link */
    out->h2d_rate = up / step;
    out->disk_rate = (out->disk_step + out->kv_disk_step) / step;
    double bound = compute_ms * 1e-3;
    if (ce->h2d > 0) bound = fmax(bound, up / ce->h2d);
    if (ce->d2h > 0) bound = fmax(bound, out->kv_d2h_step / ce->d2h);
    if (ce->disk > 0) bound = fmax(bound, (out->disk_step + out->kv_disk_step) / ce->disk);
    /* the host's memory feeds the CPU attention and every copy to the device at once */
    double host = fmax(ce->host_read, ce->host_read_after);
    if (host > 0 && out->ca_kv_step > 0) bound = fmax(bound, (out->ca_kv_step + up) / host);
    out->overlap = bound > 0 ? step / bound : 0;
}

/* Whether the row moved anything: weights split (tiered) or KV homes. */
static int offloaded(const flexdiag_offload_info *o) {
    return strcmp(o->scheduler, "resident") != 0;
}

void bench_offload_print(const bench_offload_row *r, const bench_ceilings *ce) {
    const flexdiag_offload_info *o = &r->oi;
    if (!offloaded(o)) return;
    double all = (double)(o->weights_bytes[0] + o->weights_bytes[1] + o->weights_bytes[2]);
    if (o->kv_pct[0] != 100)
        printf("  offload: KV homes %u/%u/%u %% of the micro-batches GPU/CPU/disk (%.2f / %.2f / "
               "%.2f GB); per decode step KV H2D %.3f GB, D2H %.3f GB, disk %.3f GB read and "
               "written; pinned pool %.2f GB (%s)\n",
               o->kv_pct[0], o->kv_pct[1], o->kv_pct[2], o->kv_bytes[0] / 1e9,
               o->kv_bytes[1] / 1e9, o->kv_bytes[2] / 1e9, r->kv_h2d_step / 1e9,
               r->kv_d2h_step / 1e9, r->kv_disk_step / 1e9, o->pinned_budget / 1e9,
               o->pinned_note ? o->pinned_note : o->pinned ? "pinned" : "not pinned");
    if (o->weights_pct[0] != 100)
        printf("  offload: weights requested %u/%u/%u %% GPU/CPU/disk, realised %.2f/%.2f/%.2f %% "
               "(%.2f / %.2f / %.2f GB); pinned pool %.2f GB (%s); disk %.2f GB (%s%s%s)\n",
               o->weights_pct[0], o->weights_pct[1], o->weights_pct[2],
               100 * o->weights_bytes[0] / all, 100 * o->weights_bytes[1] / all,
               100 * o->weights_bytes[2] / all, o->weights_bytes[0] / 1e9, o->weights_bytes[1] / 1e9,
               o->weights_bytes[2] / 1e9, o->pinned_budget / 1e9,
               o->pinned_note ? o->pinned_note : o->pinned ? "pinned" : "not pinned",
               o->disk_budget / 1e9,
               o->disk_io ? o->disk_io : "none", o->disk_note && *o->disk_note ? ": " : "",
               o->disk_note ? o->disk_note : "");
    if (o->cpu_attention) {
        double host = fmax(ce->host_read, ce->host_read_after);
        printf("  offload: CPU attention (%d of %d CPU-homed micro-batches) per decode step: host "
               "KV read %.3f GB in %.2f ms of host "
               "time (%.1f GB/s; host read ceiling %.1f GB/s before the run, %.1f after: bound "
               "%.2f ms at the higher; the KV home itself read at %.1f GB/s: bound %.2f ms), "
               "q/k/v rows and outputs %.1f MB over the link\n",
               o->cpu_attn_mb, o->host_mb, r->ca_kv_step / 1e9, r->ca_s_step * 1e3,
               r->ca_s_step > 0 ? r->ca_kv_step / r->ca_s_step / 1e9 : 0, ce->host_read / 1e9,
               ce->host_read_after / 1e9, host > 0 ? r->ca_kv_step / host * 1e3 : 0,
               ce->home_read / 1e9, ce->home_read > 0 ? r->ca_kv_step / ce->home_read * 1e3 : 0,
               r->ca_rows_step / 1e6);
    }
    printf("  offload: per decode step H2D %.3f GB at %.1f GB/s (ceiling %.1f GB/s pinned, %.0f "
           "%%), disk %.3f GB at %.2f GB/s (ceiling %.2f GB/s O_DIRECT, %.0f %%); compute %.2f "
           "ms; overlap efficiency %.3f\n",
           (r->h2d_step + r->kv_h2d_step) / 1e9, r->h2d_rate / 1e9, ce->h2d / 1e9,
           ce->h2d > 0 ? 100 * r->h2d_rate / ce->h2d : 0, (r->disk_step + r->kv_disk_step) / 1e9,
           r->disk_rate / 1e9,
           ce->disk / 1e9, ce->disk > 0 ? 100 * r->disk_rate / ce->disk : 0, r->compute_ms,
           r->overlap);
    fflush(stdout);
}

void bench_offload_json(const bench_offload_row *r, const bench_ceilings *ce, char *buf, size_t n) {
    const flexdiag_offload_info *o = &r->oi;
    if (!offloaded(o)) {
        snprintf(buf, n, ",\"sched\":\"resident\"");
        return;
    }
    int k = snprintf(buf, n,
             ",\"sched\":\"%s\",\"kv_req\":[%u,%u,%u],\"kv_bytes\":[%llu,%llu,%llu],"
             "\"kv_h2d_step_bytes\":%.0f,\"kv_d2h_step_bytes\":%.0f,"
             "\"kv_disk_step_bytes\":%.0f,\"cpu_attention\":%s,"
             "\"cpu_attn_kv_step_bytes\":%.0f,\"cpu_attn_step_s\":%.6f,"
             "\"cpu_attn_rows_step_bytes\":%.0f,\"host_read_ceiling_gbps\":%.3f,"
             "\"host_read_after_gbps\":%.3f,\"kv_home_read_gbps\":%.3f,"
             "\"host_mb\":%d,\"cpu_attn_mb\":%d",
             o->scheduler, o->kv_pct[0], o->kv_pct[1], o->kv_pct[2],
             (unsigned long long)o->kv_bytes[0], (unsigned long long)o->kv_bytes[1],
             (unsigned long long)o->kv_bytes[2], r->kv_h2d_step, r->kv_d2h_step, r->kv_disk_step,
             o->cpu_attention ? "true" : "false", r->ca_kv_step,
             r->ca_s_step, r->ca_rows_step, ce->host_read / 1e9, ce->host_read_after / 1e9,
             ce->home_read / 1e9, o->host_mb, o->cpu_attn_mb);
    if (k < 0 || (size_t)k >= n) return;
    buf += k;
    n -= (size_t)k;
    snprintf(buf, n,
             ",\"weights_req\":[%u,%u,%u],"
             "\"weights_bytes\":[%llu,%llu,%llu],\"pinned_bytes\":%llu,\"pinned\":%s,"
             "\"disk_bytes\":%llu,\"disk_io\":\"%s\",\"h2d_step_bytes\":%.0f,"
             "\"disk_step_bytes\":%.0f,\"h2d_gbps\":%.3f,\"disk_gbps\":%.3f,"
             "\"h2d_ceiling_gbps\":%.3f,\"d2h_ceiling_gbps\":%.3f,\"disk_ceiling_gbps\":%.3f,"
             "\"disk_ceiling_req\":%zu,\"disk_ceiling_qd\":%d,\"compute_ms\":%.4f,"
             "\"overlap_efficiency\":%.4f",
             o->weights_pct[0], o->weights_pct[1], o->weights_pct[2],
             (unsigned long long)o->weights_bytes[0], (unsigned long long)o->weights_bytes[1],
             (unsigned long long)o->weights_bytes[2], (unsigned long long)o->pinned_budget,
             o->pinned ? "true" : "false", (unsigned long long)o->disk_budget,
             o->disk_io ? o->disk_io : "none", r->h2d_step, r->disk_step, r->h2d_rate / 1e9,
             r->disk_rate / 1e9, ce->h2d / 1e9, ce->d2h / 1e9, ce->disk / 1e9, ce->disk_req,
             ce->disk_qd, r->compute_ms, r->overlap);
}
