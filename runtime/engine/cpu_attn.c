/*
 * cpu_attn.c - CPU attention of a context's host-homed micro-batches (cpu_attn.h): the
 * workspaces, the host-function queue and the attention threads, and the two halves a layer
 * calls.
 *
 * Per host micro-batch one workspace in pinned memory (after the context's KV home): its q/k/v
 * rows (copied down on the compute stream right after the projection, before the next
 * micro-batch's projection reuses the buffer), its attention output, and the RoPE angles
 * (computed by a step's first job on the workspace, kept for its other layers: same
 * positions). Per (layer, host micro-batch) one job descriptor: the host pointers of the step's
 * plan (shared by every sequence: position-only policies), the micro-batch's K/V home of that
 * layer. The host may run any number of layers ahead of the device, so descriptors are never
 * shared between layers; a step's jobs are all done when the step's ids come back (the compute
 * stream waited for each), so the next step may rewrite them. Jobs run in queue order on the
 * host-function queue (a copy stream of the device backend: cudaLaunchHostFunc on CUDA, the
 * queue's worker on the CPU backends) and use the threads of their own "cpu" stream, bound to
 * the KV home's NUMA node; a failure is kept with its message and reported after the step.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/numa.h"
#include "runtime/engine/cpu_attn.h"

typedef struct ca_ws {
    void *qkv, *out;                /* (mb_seq, qkv width), (mb_seq, h_q·d_h) act */
    float *cs;                      /* (mb_seq, d_h) RoPE scratch */
    int32_t *cs_pos;                /* (mb_seq) the positions cs holds the angles of */
    int32_t cs_n;                   /* sequences of cs_pos (-1: cs holds none) */
    flexdiag_event *q_ready, *done; /* compute: rows are down; queue: the job is done */
} ca_ws;

typedef struct ca_job {
    flexdiag_host_attn h;
    struct flexdiag_cpu_attn *ca;
    ca_ws *w;          /* its workspace */
    uint64_t kv_bytes; /* host KV bytes the job reads */
} ca_job;

struct flexdiag_cpu_attn {
    const flexdiag_kernels *k; /* the device backend */
    flexdiag_stream *queue;    /* its host-function queue */
    flexdiag_stream *cpu;      /* "cpu" stream: the attention threads */
    int numa_node;             /* the node they run on (-1: not bound) */
    int32_t n_ws, n_layers;
    ca_ws *ws;                 /* (n_ws) */
    int32_t *cs_pos;           /* (n_ws, mb_seq): the workspaces' cs_pos */
    ca_job *jobs;              /* (n_layers, n_ws) */
    void *host;                /* the workspaces' pinned block (the context's) */
    atomic_int st;             /* first failure of a job (FLEXDIAG_OK: none) */
    char msg[512];             /* its message */
    uint64_t kv_bytes, d2h_bytes, h2d_bytes; /* counters: jobs (queue thread), engine */
    double busy_s;             /* host seconds inside the jobs (queue thread) */
};

/* ---- sizes ---- */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t qkv_bytes(const flexdiag_context *c, int32_t n) {
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    return (size_t)n * (size_t)(l->heads + 2 * l->kv_heads) * (size_t)l->head_dim *
           (size_t)c->m->rt->k->act_bytes;
}

static size_t out_bytes(const flexdiag_context *c, int32_t n) {
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    return (size_t)n * (size_t)l->heads * (size_t)l->head_dim * (size_t)c->m->rt->k->act_bytes;
}

static size_t ws_bytes(const flexdiag_context *c) {
    return align64(qkv_bytes(c, c->geo.mb_seq)) + align64(out_bytes(c, c->geo.mb_seq)) +
           align64((size_t)c->geo.mb_seq * (size_t)c->m->cfg.lm.head_dim * sizeof(float));
}

/* Micro-batches the host attends: [s_host, s_ca). */
static int32_t host_mbs(const flexdiag_context *c) {
    return (c->homes.s_ca - c->homes.s_host + c->geo.mb_seq - 1) / c->geo.mb_seq;
}

size_t flexdiag__cpu_attn_host_bytes(const flexdiag_context *c) {
    return c->p.cpu_attention ? (size_t)host_mbs(c) * ws_bytes(c) : 0;
}

flexdiag_status flexdiag__cpu_attn_allowed(const flexdiag_context *c) {
    if (!c->p.cpu_attention) return FLEXDIAG_OK;
    if (c->homes.s_host == c->homes.s_disk)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "context_params.cpu_attention attends the micro-batches whose KV "
                             "lives in pinned host memory, and this block has none: give "
                             "context_params.kv_pct a CPU share (e.g. 0,100,0)");
    if (!c->pd.shared_slots || c->pd.scored)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "context_params.cpu_attention: policy %s keeps per-sequence state "
                             "that its attention updates (slot lists, scores) on the device; "
                             "CPU attention supports dense, window and streaming. Drop "
                             "context_params.cpu_attention: the device then attends the rows it "
                             "streams from the host KV home",
                             flexdiag_policy_name(c->p.policy.kind));
    return FLEXDIAG_OK;
}

/* ---- lifetime ---- */

static flexdiag_status open_ws(flexdiag_context *c, flexdiag_cpu_attn *ca) {
    size_t per = ws_bytes(c);
    for (int32_t i = 0; i < ca->n_ws; i++) {
        char *p = (char *)ca->host + (size_t)i * per;
        ca_ws *w = &ca->ws[i];
        w->qkv = p;
        w->out = p + align64(qkv_bytes(c, c->geo.mb_seq));
        w->cs = (float *)((char *)w->out + align64(out_bytes(c, c->geo.mb_seq)));
        w->cs_pos = ca->cs_pos + (size_t)i * (size_t)c->geo.mb_seq;
        w->cs_n = -1;
        FLEXDIAG_TRY(ca->k->event_create(c->s, &w->q_ready));
        FLEXDIAG_TRY(ca->k->event_create(ca->queue, &w->done));
    }
    for (int32_t i = 0; i < ca->n_layers * ca->n_ws; i++) ca->jobs[i].ca = ca;
    return FLEXDIAG_OK;
}

/* The attention threads, on the NUMA node the pinned pool (the KV home) is bound to when it is
 * bound to one: they are created while this thread's affinity is that node's CPUs (within its
 * own mask), so they inherit it and --threads 0 counts the node's cores. */
static flexdiag_status open_threads(const flexdiag_runtime *rt, flexdiag_cpu_attn *ca) {
    flexdiag_host_pool_stats ps = {.numa_node = -1};
    if (rt->pool) flexdiag__host_pool_stats(rt->pool, &ps);
    cpu_set_t old, set;
    int bind = ps.numa_node >= 0 && flexdiag__numa_node_cpus(ps.numa_node, &set) == 0 &&
               pthread_getaffinity_np(pthread_self(), sizeof old, &old) == 0;
    if (bind) {
        CPU_AND(&set, &set, &old);
        bind = CPU_COUNT(&set) > 0 &&
               pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
    }
    flexdiag_status st = flexdiag__kernels_cpu()->stream_create(-1, rt->p.threads, &ca->cpu);
    if (bind) (void)pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    ca->numa_node = bind ? ps.numa_node : -1;
    return st;
}

static flexdiag_status open_all(flexdiag_context *c, flexdiag_cpu_attn *ca) {
    const flexdiag_runtime *rt = c->m->rt;
    if (!ca->k->host_fn || !ca->k->copy_stream_create)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "context_params.cpu_attention: backend %s cannot run host "
                             "functions in stream order",
                             ca->k->name);
    FLEXDIAG_TRY(ca->k->copy_stream_create(rt->p.device, &ca->queue));
    FLEXDIAG_TRY(open_threads(rt, ca));
    ca->ws = calloc((size_t)ca->n_ws, sizeof *ca->ws);
    ca->jobs = calloc((size_t)ca->n_ws * (size_t)ca->n_layers, sizeof *ca->jobs);
    ca->cs_pos = calloc((size_t)ca->n_ws * (size_t)c->geo.mb_seq, sizeof *ca->cs_pos);
    if (!ca->ws || !ca->jobs || !ca->cs_pos)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "CPU attention: no host memory");
    return open_ws(c, ca);
}

flexdiag_status flexdiag__cpu_attn_open(flexdiag_context *c, void *ws) {
    if (!c->p.cpu_attention) return FLEXDIAG_OK;
    flexdiag_cpu_attn *ca = calloc(1, sizeof *ca);
    if (!ca) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "CPU attention: no host memory");
    *ca = (flexdiag_cpu_attn){.k = c->m->rt->k, .n_ws = host_mbs(c),
                              .n_layers = c->m->cfg.lm.layers, .host = ws};
    atomic_init(&ca->st, FLEXDIAG_OK);
    c->homes.ca = ca;
    return open_all(c, ca);
}

void flexdiag__cpu_attn_close(flexdiag_context *c) {
    flexdiag_cpu_attn *ca = c->homes.ca;
    if (!ca) return;
    if (ca->queue) ca->k->stream_destroy(ca->queue); /* waits for the jobs */
    if (ca->cpu) flexdiag__kernels_cpu()->stream_destroy(ca->cpu);
    for (int32_t i = 0; ca->ws && i < ca->n_ws; i++) {
        ca->k->event_destroy(ca->ws[i].q_ready);
        ca->k->event_destroy(ca->ws[i].done);
    }
    free(ca->ws);
    free(ca->jobs);
    free(ca->cs_pos);
    free(ca);
    c->homes.ca = NULL;
}

/* ---- the two halves ---- */

/* Whether w's RoPE angles are those of positions pos (n sequences): the layers of a step
 * attend at the same positions, so only a step's first job on w computes them. */
static int angles_kept(const ca_ws *w, const int32_t *pos, int32_t n) {
    return pos && w->cs_n == n && memcmp(w->cs_pos, pos, (size_t)n * sizeof *pos) == 0;
}

/* The host job: append and attend; a failure is kept for flexdiag__cpu_attn_status. Jobs run
 * one at a time in queue order, so a workspace's angles are never computed and read at once. */
static void job_run(void *arg) {
    ca_job *j = arg;
    flexdiag_cpu_attn *ca = j->ca;
    if (atomic_load(&ca->st) != FLEXDIAG_OK) return;
    const flexdiag_attn_args *a = &j->h.a;
    j->h.cs_ready = angles_kept(j->w, a->pos, a->n_seq);
    double t0 = flexdiag__now();
    flexdiag_status st = flexdiag__host_attn_decode(&j->h, ca->cpu);
    ca->busy_s += flexdiag__now() - t0;
    ca->kv_bytes += j->kv_bytes;
    j->w->cs_n = st == FLEXDIAG_OK && a->pos && j->h.act_bytes == 2 ? a->n_seq : -1;
    if (j->w->cs_n > 0) memcpy(j->w->cs_pos, a->pos, (size_t)a->n_seq * sizeof *a->pos);
    if (st == FLEXDIAG_OK) return;
    snprintf(ca->msg, sizeof ca->msg, "%s", flexdiag__err_msg());
    atomic_store(&ca->st, st);
}

/* The job of io: host pointers of the step's plan, io's home spans and its workspace. */
static void fill_job(const run_state *r, const flexdiag_layer_io *io, ca_ws *w, ca_job *j) {
    const flexdiag_context *c = r->c;
    const flexdiag_sched_io *m = &io->mem;
    j->w = w;
    j->h = (flexdiag_host_attn){.out = w->out, .qkv = w->qkv, .k = m->k, .v = m->v,
                                .rows = c->pd.h_rows + (size_t)m->s0 * (size_t)io->a.h_kv,
                                .a = io->a, .cs = w->cs, .act_bytes = (int)r->act};
    flexdiag_attn_args *a = &j->h.a;
    a->lp = r->lp + m->s0;
    a->slots = c->pd.h_slots + (size_t)m->s0 * (size_t)c->pd.max_slots; /* one per sequence */
    a->n_slots = c->pd.h_nslots + m->s0;
    a->pos = io->a.pos ? c->up.pos + m->s0 : NULL;
    uint64_t rows = 0;
    for (int32_t s = 0; s < m->n_seq; s++) rows += (uint64_t)a->lp[s] + (uint64_t)a->n_slots[s];
    j->kv_bytes = rows * 2 * (uint64_t)a->h_kv * (uint64_t)a->d_h * r->act;
}

static int32_t ws_index(const flexdiag_context *c, const flexdiag_sched_io *m) {
    return (m->s0 - c->homes.s_host) / c->geo.mb_seq;
}

flexdiag_status flexdiag__cpu_attn_send(const run_state *r, const flexdiag_layer_io *io) {
    flexdiag_cpu_attn *ca = r->c->homes.ca;
    const flexdiag_sched_io *m = &io->mem;
    int32_t i = ws_index(r->c, m);
    ca_ws *w = &ca->ws[i];
    ca_job *j = &ca->jobs[(size_t)m->layer * (size_t)ca->n_ws + (size_t)i];
    size_t bytes = qkv_bytes(r->c, m->n_seq);
    FLEXDIAG_TRY(ca->k->copy_d2h_async(w->qkv, r->c->b.qkv, bytes, r->s));
    FLEXDIAG_TRY(ca->k->event_record(w->q_ready, r->s));
    ca->d2h_bytes += bytes;
    fill_job(r, io, w, j);
    FLEXDIAG_TRY(ca->k->stream_wait_event(ca->queue, w->q_ready));
    FLEXDIAG_TRY(ca->k->host_fn(ca->queue, job_run, j));
    return ca->k->event_record(w->done, ca->queue);
}

flexdiag_status flexdiag__cpu_attn_recv(const run_state *r, const flexdiag_layer_io *io) {
    flexdiag_cpu_attn *ca = r->c->homes.ca;
    ca_ws *w = &ca->ws[ws_index(r->c, &io->mem)];
    size_t bytes = out_bytes(r->c, io->mem.n_seq);
    FLEXDIAG_TRY(ca->k->stream_wait_event(r->s, w->done));
    FLEXDIAG_TRY(ca->k->copy_h2d_async(r->c->b.att, w->out, bytes, r->s));
    ca->h2d_bytes += bytes;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__cpu_attn_status(const flexdiag_context *c) {
    const flexdiag_cpu_attn *ca = c->homes.ca;
    flexdiag_status st = ca ? (flexdiag_status)atomic_load(&ca->st) : FLEXDIAG_OK;
    if (st == FLEXDIAG_OK) return FLEXDIAG_OK;
    return flexdiag__err(st, "CPU attention: %s", ca->msg);
}

void flexdiag__cpu_attn_stats(const flexdiag_context *c, flexdiag_offload_info *out) {
    const flexdiag_cpu_attn *ca = c->homes.ca;
    out->cpu_attention = ca != NULL;
    out->host_mb = (c->homes.s_disk - c->homes.s_host + c->geo.mb_seq - 1) / c->geo.mb_seq;
    out->cpu_attn_mb = ca ? host_mbs(c) : 0;
    if (!ca) return;
    out->cpu_attn_d2h_bytes = ca->d2h_bytes;
    out->cpu_attn_h2d_bytes = ca->h2d_bytes;
    out->cpu_attn_kv_bytes = ca->kv_bytes;
    out->cpu_attn_s = ca->busy_s;
}
