/*
 * cost_model.c - memory verdicts and predicted time of one configuration (cost_model.h), and
 * the profile file.
 *
 * Memory: the model shell holds the config and, for a split placement, a weight_homes whose
 * cut is the one flexdiag__weights_plan makes; flexdiag__context_bytes reads only that cut (the
 * size of the device weight slots), so the device bytes are the runtime's own sizing
 * (flexdiag__context_sizes). The pinned bytes add what the runtime carves from its pool for one
 * context: the host part of the weights, the disk staging of the tiered scheduler and the KV
 * home of the host-homed micro-batches (flexdiag__context_sizes), each rounded to the pool's
 * 4 KiB blocks.
 *
 * Time: the engine runs a decode step layer-major, and the tiered scheduler loads layer j+1's
 * streamed bytes while layer j computes, so a layer costs the largest of its compute (GEMMs at
 * the measured rate for their row count, attention reading the attended KV at the device copy
 * rate), its H2D bytes (streamed weights + the KV rows of host-homed micro-batches), its D2H
 * bytes (written rows back) and its disk bytes, each over the profile's rate; with CPU
 * attention the host-homed micro-batches' KV does not move, their activations do, and the host
 * reads their attended KV at the profile's host read rate beside the device (on a CPU backend,
 * whose "device" is the same cores, in series with the compute). Not modelled:
 * norms, RoPE, sampling, the policy's own work, launch overheads (docs/search.md).
 */
#include "bench/cost_model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/core.h"
#include "offload/sched.h"
#include "policy/kv_policy.h"
#include "runtime/image/vq.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"
#include "runtime/tiers.h"

/* ---- the model shell ---- */

/* Device bytes of a folder model's decoder (runtime/image/vq_choice.c), 0 when it has none. */
static flexdiag_status vq_dir_bytes(const flexdiag_model_config *c, const char *dir,
                                    const flexdiag_safetensors *st, uint64_t *out) {
    flexdiag_vq_config vc;
    flexdiag_safetensors *vqgan = NULL;
    int found = 0;
    *out = 0;
    FLEXDIAG_TRY(flexdiag__vq_config_of_dir(c, st, dir, &vc, &vqgan, &found));
    if (vqgan) flexdiag__st_close(vqgan);
    return found ? flexdiag__vq_device_bytes(&vc, out) : FLEXDIAG_OK;
}

static flexdiag_status shell_from_dir(cm_model *cm, const char *dir) {
    FLEXDIAG_TRY(flexdiag__config_load(dir, &cm->m.cfg));
    flexdiag_safetensors *st = NULL;
    FLEXDIAG_TRY(flexdiag__st_open(dir, &st));
    flexdiag_status r = flexdiag__weights_adapt(&cm->m.cfg, st);
    if (r == FLEXDIAG_OK && cm->m.rt->k->conv2d) r = vq_dir_bytes(&cm->m.cfg, dir, st, &cm->vq_bytes);
    flexdiag__st_close(st);
    return r;
}

flexdiag_status cm_model_init(cm_model *cm, flexdiag_runtime *rt, const char *dir,
                              const char *arch) {
    memset(cm, 0, sizeof *cm);
    cm->m.rt = rt;
    cm->avail = flexdiag__arena_available(&rt->arena);
    if (dir) return shell_from_dir(cm, dir);
    FLEXDIAG_TRY(flexdiag__config_builtin(arch ? arch : "tiny-janus", &cm->m.cfg));
    if (cm->m.cfg.arch != FLEXDIAG_ARCH_JANUS || !rt->k->conv2d) return FLEXDIAG_OK;
    flexdiag_vq_config vc;
    flexdiag__vq_config_builtin(&cm->m.cfg, &vc);
    return flexdiag__vq_device_bytes(&vc, &cm->vq_bytes);
}

/* ---- geometry ---- */

/* The context params of c (what `flexdiag bench` passes for the same flags). */
static void context_params(const cm_config *c, flexdiag_context_params *cp) {
    flexdiag_context_params_init(cp);
    cp->max_images = c->batch;
    cp->micro_batch = c->micro;
    cp->max_prompt_len = c->prompt_len;
    if (c->gen_len > 0) cp->max_new_tokens = c->gen_len;
    cp->text = c->gen_len > 0;
    memcpy(cp->kv_pct, c->kvpct, sizeof cp->kv_pct);
    cp->policy = c->policy;
    cp->cpu_attention = c->cpu_attention != 0;
    cp->cpu_attention_pct = c->cpu_attn_pct;
    if (c->images_per_prompt > 1) cp->images_per_prompt = c->images_per_prompt;
}

flexdiag_status cm_resolve(const cm_model *cm, const cm_config *c, int32_t *l_dec,
                           int32_t *rows_per_img, flexdiag_kvp_params *kp, int32_t *ring) {
    const flexdiag_model_config *m = &cm->m.cfg;
    int image = m->arch == FLEXDIAG_ARCH_JANUS || (m->arch == FLEXDIAG_ARCH_CHAMELEON && !c->gen_len);
    *rows_per_img = image ? 2 : 1;
    *l_dec = !image ? (c->gen_len > 0 ? c->gen_len : 128)
             : m->arch == FLEXDIAG_ARCH_JANUS ? m->image_tokens : m->grid * (m->grid + 1);
    flexdiag__err_clear();
    FLEXDIAG_TRY(flexdiag__kvp_resolve(&c->policy, *l_dec, kp));
    *ring = flexdiag__kvp_ring_rows(kp);
    return FLEXDIAG_OK;
}

/* Micro-batches of c as the context cuts them: size in sequences, count, pinned-homed and
 * disk-homed counts (flexdiag__kv_home_split, the context's own rounding). */
static void micro_batches(const cm_config *c, int32_t rpi, int32_t *mb_seq, int32_t *n_mb,
                          int32_t *host_mb, int32_t *disk_mb) {
    int32_t mb_img = c->micro > 0 && c->micro < c->batch ? c->micro : c->batch;
    *mb_seq = mb_img * rpi;
    *n_mb = (c->batch + mb_img - 1) / mb_img;
    int32_t n[3];
    flexdiag__kv_home_split(*n_mb, c->kvpct, n);
    *host_mb = n[1];
    *disk_mb = n[2];
}

void cm_host_mbs(const cm_config *c, int32_t *host, int32_t *attended) {
    int32_t mb_seq, n_mb, disk;
    micro_batches(c, 1, &mb_seq, &n_mb, host, &disk);
    uint32_t pct = c->cpu_attn_pct ? c->cpu_attn_pct : 100;
    *attended = c->cpu_attention ? (int32_t)(((int64_t)*host * pct + 99) / 100) : 0;
}

static uint64_t round4k(uint64_t x) { return (x + 4095) & ~(uint64_t)4095; }

/* ---- memory ---- */

flexdiag_status cm_memory_of(cm_model *cm, const cm_config *c, uint64_t cpu_mem,
                             cm_memory *out) {
    uint64_t need[3];
    flexdiag_wcut cut;
    flexdiag__err_clear();
    FLEXDIAG_TRY(flexdiag__weights_plan(&cm->m.cfg, c->wpct, c->compress, need, &cut));
    cm->homes.cut = cut;
    cm->m.w.homes = c->wpct[0] != 100 ? &cm->homes : NULL;
    flexdiag_context_params cp;
    context_params(c, &cp);
    size_t ctx = 0, host = 0;
    flexdiag_status st = flexdiag__context_sizes(&cm->m, &cp, &ctx, &host);
    cm->m.w.homes = NULL;
    FLEXDIAG_TRY(st);
    uint64_t kv_disk = 0;
    if (c->kvpct[2]) FLEXDIAG_TRY(flexdiag__context_disk_bytes(&cm->m, &cp, &kv_disk));
    uint64_t kv_home = host ? round4k(host) : 0;
    uint64_t stage = need[2] ? (uint64_t)FLEXDIAG_DISK_STAGE * flexdiag__wcut_disk_stride(&cut) : 0;
    out->gpu = need[0] + cm->vq_bytes + ctx;
    out->cpu = (need[1] ? round4k(need[1]) : 0) + stage + kv_home;
    out->disk = need[2] + kv_disk;
    out->fits_gpu = out->gpu <= cm->avail;
    out->fits_cpu = !cpu_mem || out->cpu <= cpu_mem;
    return FLEXDIAG_OK;
}

/* ---- rates ---- */

/* y at x, log-log interpolation over n samples (xs ascending; zeros skipped), clamped. */
static double interp(const double *xs, const double *ys, int n, double x) {
    int lo = -1, hi = -1;
    for (int i = 0; i < n; i++) {
        if (xs[i] <= 0 || ys[i] <= 0) continue;
        if (xs[i] <= x) lo = i;
        if (xs[i] >= x && hi < 0) hi = i;
    }
    if (lo < 0) return hi < 0 ? 0 : ys[hi];
    if (hi < 0 || hi == lo) return ys[lo];
    double f = log(x / xs[lo]) / log(xs[hi] / xs[lo]);
    return exp(log(ys[lo]) + f * (log(ys[hi]) - log(ys[lo])));
}

/* Seconds of a GEMM of n rows and `flops` FLOPs. */
static double gemm_s(const cm_profile *p, double n, double flops) {
    double r = interp(p->gemm_rows, p->gemm, CM_GEMM_ROWS, n);
    return r > 0 ? flops / r : 0;
}

/* Seconds to move bytes in transfers of `each` bytes at the profile's rates (dir 0 H2D). */
static double copy_s(const cm_profile *p, int dir, double bytes, double each) {
    if (bytes <= 0) return 0;
    double r = interp(p->copy_bytes, dir ? p->d2h : p->h2d, CM_COPY_SIZES, each);
    return r > 0 ? bytes / r : INFINITY;
}

/* ---- time ---- */

/* What a configuration moves and computes, per layer, independent of the step. */
typedef struct shape {
    double layer_params, head_params; /* weights (elements) */
    double dq, dkv, ab;               /* query and KV widths, activation bytes */
    double streamed, disk;            /* bytes per layer: H2D weights, disk weights (as stored) */
    double unpack_s;                  /* seconds a layer's packed weights take to unpack */
    double ew_bytes;                  /* bytes the small ops read and write per row and layer */
    double ops_s;                     /* seconds of a layer's small ops, per micro-batch */
    int32_t l_dec, rpi, ring, mb_seq, n_mb, host_mb, disk_mb, rows;
    int32_t kv_heads;
    flexdiag_kvp_params kp;
} shape;

static flexdiag_status shape_of(const cm_model *cm, const cm_config *c, const cm_profile *p,
                                shape *s) {
    const flexdiag_model_config *m = &cm->m.cfg;
    const flexdiag_lm_config *l = &m->lm;
    double d = l->hidden;
    s->dq = (double)l->heads * l->head_dim;
    s->dkv = (double)l->kv_heads * l->head_dim;
    s->ab = cm->m.rt->k->act_bytes;
    s->layer_params = d * (s->dq + 2 * s->dkv) + s->dq * d + (l->relu_mlp ? 2 : 3) * d * l->ffn;
    s->head_params = m->arch == FLEXDIAG_ARCH_JANUS
                         ? (double)m->head_dim_mid * (d + m->image_vocab) + m->aligner_depth * d * d
                         : (double)(m->arch == FLEXDIAG_ARCH_CHAMELEON && !c->gen_len
                                        ? m->image_vocab : l->vocab) * d;
    /* The small ops of a layer (runtime/engine/layer.c): two norms, Chameleon's q/k norm,
     * kv_append (RoPE in it), the decode attention launch and the activation; their bytes per
     * row: each norm reads and writes d, q/k/v are read and the K/V row and rotated q written,
     * attention reads q and writes its output, SwiGLU reads 2 ffn and writes ffn (ReLU 2 ffn).
     * The residual adds are the GEMMs' accumulation. A configuration the resident scheduler
     * runs (everything on the device) replays a recorded step graph; the rest launch op by op. */
    double qkv = s->dq + 2 * s->dkv;
    int ops = 5 + (l->qk_rows > 0);
    s->ew_bytes = (4 * d + 2 * qkv + 2 * s->dq + (l->relu_mlp ? 2 : 3) * (double)l->ffn +
                   (l->qk_rows > 0 ? 2 * qkv : 0)) * s->ab;
    int resident = c->wpct[0] == 100 && c->kvpct[0] == 100;
    s->ops_s = ops * (resident ? p->op_graph : p->op_eager);
    flexdiag_wcut cut;
    FLEXDIAG_TRY(flexdiag__weights_plan(m, c->wpct, c->compress, NULL, &cut));
    s->disk = (double)flexdiag__wcut_bytes(&cut, FLEXDIAG_TIER_DISK);
    s->streamed = (double)flexdiag__wcut_bytes(&cut, FLEXDIAG_TIER_CPU) + s->disk;
    /* packed weights are unpacked on the device once per layer per step: read packed, write
     * the layer's streamed bytes */
    double raw = (double)(cut.layer_bytes - cut.cut[0]);
    s->unpack_s = cut.q4 && p->hbm > 0 ? (raw + s->streamed) / p->hbm : 0;
    FLEXDIAG_TRY(cm_resolve(cm, c, &s->l_dec, &s->rpi, &s->kp, &s->ring));
    micro_batches(c, s->rpi, &s->mb_seq, &s->n_mb, &s->host_mb, &s->disk_mb);
    s->kv_heads = l->kv_heads;
    s->rows = c->batch * s->rpi;
    return FLEXDIAG_OK;
}

/* Seconds of one layer's resources; returns the layer's time (their max). */
static double layer_max(const double t[CM_RES]) {
    double m = 0;
    for (int i = 0; i < CM_RES; i++) m = fmax(m, t[i]);
    return m;
}

/* One layer of decode step t (0-based): compute, H2D, D2H, disk and host-attention seconds
 * into t4. With CPU attention the KV of the host-homed micro-batches the host attends (its
 * share of them) stays home: their q/k/v rows go down, their outputs up, and the host reads
 * their attended KV at the profile's rate beside the device's work; the rest stream. */
static void decode_layer(const cm_config *c, const cm_profile *p, const shape *s, int32_t t,
                         double t4[CM_RES]) {
    int dense = s->kp.kind == FLEXDIAG_POLICY_DENSE;
    double att = dense || t + 1 < s->kp.n_att ? t + 1 : s->kp.n_att;  /* attended decode rows */
    double res = t + 1 < s->ring ? t + 1 : s->ring;                   /* resident ring prefix */
    int evict_any = flexdiag__kvp_traits(s->kp.kind)->device == FLEXDIAG_KVP_DEV_SLOT_MAP;
    double row_b = 2 * s->dkv * s->ab; /* one K + V row of a sequence */
    double mb = s->mb_seq;
    double kv_read = mb * (c->prompt_len + att) * row_b;
    int32_t host_mb, attended;
    cm_host_mbs(c, &host_mb, &attended);
    double host = attended;                           /* micro-batches the host attends */
    double below = s->host_mb + s->disk_mb;           /* KV homed off the device */
    /* attention reads the attended rows once; hbm counts bytes read + written per second */
    t4[0] = s->n_mb * (gemm_s(p, mb, 2 * mb * s->layer_params) + s->ops_s +
                       (p->hbm > 0 ? mb * s->ew_bytes / p->hbm : 0)) +
            (s->n_mb - host) * (p->hbm > 0 ? kv_read / p->hbm : 0) + s->unpack_s;
    double kv_in = (below - host) * mb * (c->prompt_len + att) * row_b; /* attended rows */
    double kv_out = (below - host) * mb * (evict_any ? res : 1) * row_b;
    double up = host * mb * s->dq * s->ab, down = host * mb * (s->dq + 2 * s->dkv) * s->ab;
    double per = fmax(below, 1);
    t4[1] = copy_s(p, 0, s->streamed, s->streamed) + copy_s(p, 0, up, up / per) +
            (p->kv_h2d > 0 ? kv_in / p->kv_h2d : copy_s(p, 0, kv_in, kv_in / per));
    t4[2] = copy_s(p, 1, kv_out + down, (kv_out + down) / per);
    /* the disk KV home reads every touched row (the resident ones) and writes a 4 KiB page per
     * (sequence, KV head) block for the written row (offload/kv_disk.c) */
    double kv_disk = s->disk_mb * mb * ((c->prompt_len + res) * row_b +
                                        (evict_any ? res * row_b : 2.0 * s->kv_heads * 4096));
    t4[3] = s->disk + kv_disk > 0 ? (p->disk > 0 ? (s->disk + kv_disk) / p->disk : INFINITY) : 0;
    double host_rate = p->host_attn > 0 ? p->host_attn : p->host_read;
    t4[4] = host > 0 ? (host_rate > 0 ? host * kv_read / host_rate : INFINITY) : 0;
    /* host memory: the copies read and write it while the host attention reads the KV home,
     * and together they are bound by its bandwidth (OPT-30B on an H100 host: the weights
     * streamed at 49 GB/s beside 74 GB/s of CPU attention, not at the 55 GB/s link) */
    double host_bytes = s->streamed + up + kv_in + kv_out + down + host * kv_read;
    t4[5] = p->host_read > 0 ? host_bytes / p->host_read : 0;
    if (strcmp(p->backend, "cuda") != 0) { /* no device beside the host: the same cores */
        t4[0] += t4[4];
        t4[4] = t4[5] = 0;
    }
}

/* One layer of the prefill: every micro-batch's prompt through the GEMMs and causal attention,
 * the layer's weights streamed once, the host-homed prompt rows written back. */
static double prefill_layer(const cm_config *c, const cm_profile *p, const shape *s) {
    double tok = (double)s->mb_seq * c->prompt_len, lp = c->prompt_len;
    double t4[CM_RES] = {0};
    t4[0] = s->n_mb * (gemm_s(p, fmin(tok, 4096), 2 * tok * s->layer_params) +
                       gemm_s(p, fmin(tok, 4096), 2 * s->mb_seq * lp * lp * s->dq) + s->ops_s +
                       (p->hbm > 0 ? tok * s->ew_bytes / p->hbm : 0)) +
            s->unpack_s;
    t4[1] = copy_s(p, 0, s->streamed, s->streamed);
    double below = s->host_mb + s->disk_mb;
    double kv_out = below * (double)s->mb_seq * lp * 2 * s->dkv * s->ab;
    t4[2] = copy_s(p, 1, kv_out, kv_out / fmax(below, 1));
    double kv_disk = 2 * s->disk_mb * (double)s->mb_seq * lp * 2 * s->dkv * s->ab; /* read, write */
    t4[3] = s->disk + kv_disk > 0 ? (p->disk > 0 ? (s->disk + kv_disk) / p->disk : INFINITY) : 0;
    return layer_max(t4);
}

flexdiag_status cm_predict(const cm_model *cm, const cm_config *c, const cm_profile *p,
                           cm_time *out) {
    memset(out, 0, sizeof *out);
    shape s;
    FLEXDIAG_TRY(shape_of(cm, c, p, &s));
    double L = cm->m.cfg.lm.layers, sum = 0, acc[CM_RES] = {0};
    int32_t run = c->steps > 0 && c->steps < s.l_dec ? c->steps : s.l_dec; /* bench --steps */
    int32_t n = run > 1 ? run - 1 : 1;
    for (int32_t t = 0; t < n; t++) {
        double t4[CM_RES];
        decode_layer(c, p, &s, t, t4);
        sum += layer_max(t4);
        for (int i = 0; i < CM_RES; i++) acc[i] += t4[i];
    }
    double head = gemm_s(p, s.rows, 2.0 * s.rows * s.head_params);
    out->step_s = L * sum / n + head;
    out->prefill_s = L * prefill_layer(c, p, &s) + head;
    static const char *const names[CM_RES] = {"compute", "h2d", "d2h", "disk", "cpu",
                                              "host memory"};
    int big = 0;
    for (int i = 0; i < CM_RES; i++) {
        out->layer_ms[i] = 1e3 * acc[i] / n;
        if (acc[i] > acc[big]) big = i;
    }
    out->bound = names[big];
    double total = out->prefill_s + out->step_s * (s.l_dec - 1);
    out->img_s = total > 0 ? c->batch / total : 0;
    out->tok_s = total > 0 ? (double)s.rows * s.l_dec / total : 0;
    return FLEXDIAG_OK;
}

/* ---- profile file ---- */

int cm_profile_path(const char *device, char *out, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[3072];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s", xdg);
    else if (home && *home) snprintf(base, sizeof base, "%s/.cache", home);
    else return 1;
    char dev[128];
    snprintf(dev, sizeof dev, "%s", device);
    for (char *q = dev; *q; q++)
        if (*q == ' ' || *q == '/' || *q == '\\' || *q == '"') *q = '_';
    snprintf(out, n, "%s/flexdiag/profile-%s.json", base, dev);
    return 0;
}

static json_t *num_array(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* mkdir -p of path's folder. */
static int make_parent(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *q = buf + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(buf, 0777) && errno != EEXIST) return 1;
        *q = '/';
    }
    return 0;
}

int cm_profile_write(const cm_profile *p, const char *path) {
    json_t *o = json_pack("{s:i,s:s,s:s,s:o,s:o,s:o,s:f,s:f,s:o,s:o,s:I,s:f,s:i,s:f,s:f,s:f,s:f,"
                          "s:f}",
                          "version", 1,
                          "device", p->device, "backend", p->backend, "copy_bytes",
                          num_array(p->copy_bytes, CM_COPY_SIZES), "h2d_Bps",
                          num_array(p->h2d, CM_COPY_SIZES), "d2h_Bps",
                          num_array(p->d2h, CM_COPY_SIZES), "kv_h2d_Bps", p->kv_h2d, "hbm_Bps",
                          p->hbm, "gemm_rows",
                          num_array(p->gemm_rows, CM_GEMM_ROWS), "gemm_flops",
                          num_array(p->gemm, CM_GEMM_ROWS), "gemm_k", (json_int_t)p->gemm_k,
                          "disk_Bps", p->disk, "disk_qd", p->disk_qd, "disk_req_bytes",
                          p->disk_req, "host_read_Bps", p->host_read, "host_attn_Bps",
                          p->host_attn, "op_eager_s", p->op_eager, "op_graph_s", p->op_graph);
    int rc = !o || make_parent(path) || json_dump_file(o, path, JSON_INDENT(2));
    json_decref(o);
    if (rc) fprintf(stderr, "flexdiag profile: cannot write %s: %s\n", path, strerror(errno));
    return rc;
}

/* Copy n numbers of JSON array a into v; 0, or 1 when a is not an array of n numbers. */
static int read_array(const json_t *a, double *v, int n) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) return 1;
    for (int i = 0; i < n; i++) {
        const json_t *x = json_array_get(a, (size_t)i);
        if (!json_is_number(x)) return 1;
        v[i] = json_number_value(x);
    }
    return 0;
}

/* The name of the first field of p the model cannot use (a rate or size not finite and > 0,
 * disk figures negative, sample sizes not increasing), or NULL. */
static const char *profile_invalid(const cm_profile *p) {
    for (int i = 0; i < CM_COPY_SIZES; i++) {
        if (!(isfinite(p->copy_bytes[i]) && p->copy_bytes[i] > 0) ||
            (i && !(p->copy_bytes[i] > p->copy_bytes[i - 1])))
            return "copy_bytes";
        if (!(isfinite(p->h2d[i]) && p->h2d[i] > 0)) return "h2d_Bps";
        if (!(isfinite(p->d2h[i]) && p->d2h[i] > 0)) return "d2h_Bps";
    }
    for (int i = 0; i < CM_GEMM_ROWS; i++) {
        if (!(isfinite(p->gemm_rows[i]) && p->gemm_rows[i] >= 1) ||
            (i && !(p->gemm_rows[i] > p->gemm_rows[i - 1])))
            return "gemm_rows";
        if (!(isfinite(p->gemm[i]) && p->gemm[i] > 0)) return "gemm_flops";
    }
    if (!(isfinite(p->hbm) && p->hbm > 0)) return "hbm_Bps";
    if (p->gemm_k < 1) return "gemm_k";
    if (!(isfinite(p->host_read) && p->host_read >= 0)) return "host_read_Bps";
    if (!(isfinite(p->host_attn) && p->host_attn >= 0)) return "host_attn_Bps";
    if (!(isfinite(p->kv_h2d) && p->kv_h2d >= 0)) return "kv_h2d_Bps";
    if (!(isfinite(p->op_eager) && p->op_eager >= 0 && p->op_eager < 1)) return "op_eager_s";
    if (!(isfinite(p->op_graph) && p->op_graph >= 0 && p->op_graph < 1)) return "op_graph_s";
    if (!(isfinite(p->disk) && p->disk >= 0) || p->disk_qd < 0 ||
        !(isfinite(p->disk_req) && p->disk_req >= 0))
        return "disk_Bps, disk_qd or disk_req_bytes";
    return NULL;
}

int cm_profile_read(const char *cmd, const char *path, const char *device, cm_profile *p) {
    memset(p, 0, sizeof *p);
    json_error_t err;
    json_t *o = json_load_file(path, 0, &err);
    if (!o) {
        fprintf(stderr, "flexdiag %s: cannot read the profile %s: %s (run `flexdiag profile` on "
                "this machine first, or give --profile FILE)\n", cmd, path, err.text);
        return 1;
    }
    const char *dev = NULL, *be = NULL;
    json_int_t k = 0;
    int bad = json_unpack(o, "{s:s,s:s,s:F,s:I,s:F,s:i,s:F}", "device", &dev, "backend", &be,
                          "hbm_Bps", &p->hbm, "gemm_k", &k, "disk_Bps", &p->disk, "disk_qd",
                          &p->disk_qd, "disk_req_bytes", &p->disk_req) ||
              read_array(json_object_get(o, "copy_bytes"), p->copy_bytes, CM_COPY_SIZES) ||
              read_array(json_object_get(o, "h2d_Bps"), p->h2d, CM_COPY_SIZES) ||
              read_array(json_object_get(o, "d2h_Bps"), p->d2h, CM_COPY_SIZES) ||
              read_array(json_object_get(o, "gemm_rows"), p->gemm_rows, CM_GEMM_ROWS) ||
              read_array(json_object_get(o, "gemm_flops"), p->gemm, CM_GEMM_ROWS);
    /* optional: fields newer profiles add (0 when absent) */
    const char *const opt_name[] = {"host_read_Bps", "host_attn_Bps", "kv_h2d_Bps", "op_eager_s",
                                    "op_graph_s"};
    double *const opt_val[] = {&p->host_read, &p->host_attn, &p->kv_h2d, &p->op_eager,
                               &p->op_graph};
    for (int i = 0; i < (int)(sizeof opt_val / sizeof opt_val[0]); i++) {
        const json_t *v = json_object_get(o, opt_name[i]);
        if (v && !json_is_number(v)) bad = 1;
        else if (v && !bad) *opt_val[i] = json_number_value(v);
    }
    if (!bad) {
        snprintf(p->device, sizeof p->device, "%s", dev);
        snprintf(p->backend, sizeof p->backend, "%s", be);
        p->gemm_k = k;
    }
    json_decref(o);
    if (bad) {
        fprintf(stderr, "flexdiag %s: %s is not a flexdiag profile (a field is missing or of "
                "the wrong type); run `flexdiag profile --out %s` again\n", cmd, path, path);
        memset(p, 0, sizeof *p);
        return 1;
    }
    const char *why = profile_invalid(p);
    if (why) {
        fprintf(stderr, "flexdiag %s: %s: %s holds a value no measurement gives (rates must be "
                "finite and > 0, sample sizes increasing); run `flexdiag profile --out %s` "
                "again\n", cmd, path, why, path);
        memset(p, 0, sizeof *p);
        return 1;
    }
    if (device && strcmp(device, p->device)) {
        fprintf(stderr, "flexdiag %s: the profile %s was measured on '%s', not on this machine's "
                "'%s'; run `flexdiag profile` here (or give --profile FILE of this device)\n",
                cmd, path, p->device, device);
        return 2;
    }
    return 0;
}
