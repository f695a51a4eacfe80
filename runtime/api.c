/*
 * api.c - the public C API (include/flexdiag.h) on top of the engine.
 *
 * Entry points clear the thread's error message, check params (struct_size first), and turn
 * every failure into a status plus a message; nothing here aborts or exits. The runtime picks
 * the backend: CUDA when the build has it, device >= 0 and a device answers; otherwise the CPU
 * engine (logged once). Generation goes through the context's request queue (api_queue.c);
 * scoring takes the context for its call (FLEXDIAG_ERR_BUSY beside the queue's engine thread)
 * and honours cancel at the next layer boundary.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/api_check.h"
#include "runtime/api_queue.h"
#include "runtime/engine/engine.h"
#include "runtime/text/prompt.h"
#include "runtime/text/tokenizer.h"
#include "runtime/image/vq.h"
#include "runtime/model/vocab_map.h"
#include "runtime/tiers.h"

#define GPU_MARGIN (1ull << 30) /* bytes left to the driver/other processes by default */
/* Device memory the process takes after start-up outside the arena: kernels the driver loads
 * on first launch (cuBLAS's among them) and launch-graph instances. Charged with --gpu-mem so
 * the device's used memory stays under the flag. */
#define GPU_LATE_RESERVE (256ull << 20)

/* ---- params ---- */

/* What the _init() functions set; each takes the caller's size (flexdiag.h: the _init() macros
 * pass sizeof) and writes no byte past it. The functions named like the macros are the entry
 * points of programs built before API version 14: they write the structs as API version 13
 * had them (docs/abi.md §6). */
#define RUNTIME_PARAMS_V13 FLEXDIAG_FIRST_SIZE(flexdiag_runtime_params, offload_dir)
#define MODEL_PARAMS_V13 FLEXDIAG_FIRST_SIZE(flexdiag_model_params, compress_weights)
#define POLICY_PARAMS_V13 sizeof(flexdiag_policy_params)
#define CONTEXT_PARAMS_V13 FLEXDIAG_FIRST_SIZE(flexdiag_context_params, batching)
#define REQUEST_V13 FLEXDIAG_FIRST_SIZE(flexdiag_request, first_image)

void flexdiag_runtime_params_init_size(flexdiag_runtime_params *p, size_t size) {
    flexdiag_runtime_params d = {.struct_size = sizeof d, .device = flexdiag__have_cuda() ? 0 : -1};
    flexdiag__params_fill(p, size, &d, sizeof d);
}

void flexdiag_model_params_init_size(flexdiag_model_params *p, size_t size) {
    flexdiag_model_params d = {.struct_size = sizeof d, .arch = "tiny-janus",
                               .random_weights = true, .seed = 1};
    flexdiag__params_fill(p, size, &d, sizeof d);
}

void flexdiag_policy_params_init_size(flexdiag_policy_params *p, size_t size) {
    flexdiag_policy_params d = {.struct_size = sizeof d, .kind = FLEXDIAG_POLICY_DENSE};
    flexdiag__params_fill(p, size, &d, sizeof d);
}

void flexdiag_context_params_init_size(flexdiag_context_params *p, size_t size) {
    flexdiag_context_params d = {.struct_size = sizeof d, .max_images = 16, .max_prompt_len = 128,
                                 .max_new_tokens = 128};
    flexdiag_policy_params_init(&d.policy);
    flexdiag__params_fill(p, size, &d, sizeof d);
}

void flexdiag_request_init_size(flexdiag_request *r, size_t size) {
    flexdiag_request d = {.struct_size = sizeof d, .images_per_prompt = 1, .cfg_weight = 5.0f,
                          .temperature = 1.0f, .top_p = 1.0f};
    flexdiag__params_fill(r, size, &d, sizeof d);
}

void(flexdiag_runtime_params_init)(flexdiag_runtime_params *p) {
    flexdiag_runtime_params_init_size(p, RUNTIME_PARAMS_V13);
}

void(flexdiag_model_params_init)(flexdiag_model_params *p) {
    flexdiag_model_params_init_size(p, MODEL_PARAMS_V13);
}

void(flexdiag_policy_params_init)(flexdiag_policy_params *p) {
    flexdiag_policy_params_init_size(p, POLICY_PARAMS_V13);
}

void(flexdiag_context_params_init)(flexdiag_context_params *p) {
    flexdiag_context_params_init_size(p, CONTEXT_PARAMS_V13);
}

void(flexdiag_request_init)(flexdiag_request *r) { flexdiag_request_init_size(r, REQUEST_V13); }

/* ---- runtime ---- */

int flexdiag_device_count(void) {
    const flexdiag_kernels *cuda = flexdiag__kernels_cuda();
    return cuda && cuda->device_count ? cuda->device_count() : 0;
}

/* CUDA when built with it, device >= 0 and the device answers; else the CPU engine. A failed
 * CUDA start of device 0 (the default) warns in one line with its short reason (the backend's
 * message: the failing call and the fix are in it, logged in full at debug level) and runs on
 * the CPU; a device above 0 was asked for by number, so its failure is the caller's error. */
static flexdiag_status pick_backend(flexdiag_runtime *rt) {
    const flexdiag_kernels *cuda = flexdiag__kernels_cuda();
    if (rt->p.device >= 0 && cuda) {
        flexdiag_status st = cuda->stream_create(rt->p.device, rt->p.threads, &rt->s);
        if (st == FLEXDIAG_OK) {
            rt->k = cuda;
            return FLEXDIAG_OK;
        }
        if (rt->p.device > 0)
            return flexdiag__err_prefix(FLEXDIAG_ERR_INVALID_ARG,
                                        "runtime_params.device is %d, but CUDA cannot start it "
                                        "(give a device that exists, or -1: the CPU engine)",
                                        rt->p.device);
        if (st == FLEXDIAG_ERR_UNSUPPORTED) /* no device or no driver: an expected setup */
            FLEXDIAG_WARN("no usable CUDA device (%s); running on the CPU (pass --cpu to choose "
                          "the CPU and skip this check)", flexdiag__err_msg());
        else
            FLEXDIAG_WARN("CUDA device %d unusable (%s); running on the CPU (pass --cpu to "
                          "choose the CPU and skip this check)", rt->p.device, flexdiag__err_msg());
        flexdiag__err_clear();
    } else if (rt->p.device > 0) { /* 0 is a CUDA build's default: kept as the CPU there */
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "runtime_params.device is %d, but this library was built without "
                             "CUDA: give device -1 (the CPU engine)", rt->p.device);
    } else if (rt->p.device == 0) {
        FLEXDIAG_INFO("built without CUDA; using the CPU engine");
    }
    rt->k = flexdiag__kernels_cpu();
    return rt->k->stream_create(-1, rt->p.threads, &rt->s);
}

/* The device budget. With --gpu-mem it covers everything the process holds on the device: what
 * is in use once the backend is up (the CUDA context, the runtime stream's library handles and
 * workspace, anything else on the device) and GPU_LATE_RESERVE are charged before the first
 * allocation, so the device's used memory stays at or under the flag. Without it the arena gets
 * the free memory less a margin. */
static flexdiag_status budget_init(flexdiag_runtime *rt) {
    uint64_t budget = rt->p.gpu_mem;
    size_t free_b = 0, total_b = 0;
    int known = rt->k->mem_info && rt->k->mem_info(&free_b, &total_b) == FLEXDIAG_OK;
    if (known && budget > total_b)
        return flexdiag__err(FLEXDIAG_ERR_OOM_DEVICE,
                             "runtime_params.gpu_mem asks for %.2f GiB but the device has %.2f "
                             "GiB in all",
                             (double)budget / (1 << 30), (double)total_b / (1 << 30));
    if (known && budget == 0) budget = free_b > GPU_MARGIN ? free_b - GPU_MARGIN : 0;
    flexdiag__arena_init(&rt->arena, rt->k, budget);
    if (!known || !rt->p.gpu_mem)
        return flexdiag__arena_charge(&rt->arena, (int64_t)rt->k->stream_bytes, "stream workspace");
    uint64_t in_use = (uint64_t)(total_b - free_b);
    FLEXDIAG_TRY(flexdiag__arena_charge(&rt->arena, (int64_t)in_use,
                                        "device memory in use at start (CUDA context, library "
                                        "handles, other processes)"));
    return flexdiag__arena_charge(&rt->arena, (int64_t)GPU_LATE_RESERVE,
                                  "kernels loaded on first launch and launch graphs");
}

flexdiag_status flexdiag_runtime_create(const flexdiag_runtime_params *p, flexdiag_runtime **out) {
    flexdiag__err_clear();
    if (!out || !p) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "runtime_create: NULL argument");
    *out = NULL;
    FLEXDIAG_TRY(flexdiag__check_params(p, FLEXDIAG_FIRST_SIZE(flexdiag_runtime_params, threads),
                                        sizeof *p, "flexdiag_runtime_params"));
    flexdiag_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "runtime: no memory");
    pthread_mutex_init(&rt->s_mu, NULL);
    flexdiag__params_copy(&rt->p, p, sizeof rt->p);
    pthread_mutex_init(&rt->tier_mu, NULL);
    if (rt->p.offload_dir && !(rt->offload_dir = strdup(rt->p.offload_dir))) {
        flexdiag_runtime_destroy(rt);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "runtime: no memory");
    }
    rt->p.offload_dir = rt->offload_dir;
    if (rt->p.compress_disk > 1) {
        uint32_t v = rt->p.compress_disk;
        flexdiag_runtime_destroy(rt);
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "runtime_params.compress_disk is %u: 0 (none) or 1 (zstd)", v);
    }
    flexdiag_status st = pick_backend(rt);
    if (st == FLEXDIAG_OK) st = budget_init(rt);
    if (st != FLEXDIAG_OK) {
        flexdiag_runtime_destroy(rt);
        return st;
    }
    *out = rt;
    return FLEXDIAG_OK;
}

void flexdiag_runtime_destroy(flexdiag_runtime *rt) {
    if (!rt) return;
    if (rt->s) rt->k->stream_destroy(rt->s);
    flexdiag__tiers_free(rt);
    pthread_mutex_destroy(&rt->s_mu);
    pthread_mutex_destroy(&rt->tier_mu);
    free(rt->offload_dir);
    free(rt);
}

flexdiag_status flexdiag_runtime_budget(const flexdiag_runtime *rt, uint64_t *bytes) {
    flexdiag__err_clear();
    if (!rt || !bytes) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "runtime_budget: NULL argument");
    *bytes = rt->arena.budget == UINT64_MAX ? 0 : rt->arena.budget;
    return FLEXDIAG_OK;
}

/* ---- model ---- */

/* Pick the decoder backend and charge its memory to the arena when it lives on the device. */
static flexdiag_status vq_backend(flexdiag_model *m, const flexdiag_vq_config *vc) {
    flexdiag_runtime *rt = m->rt;
    m->vq_k = rt->k;
    m->vq_s = rt->s;
    if (!rt->k->conv2d) { /* no image ops on this backend yet: decode on the CPU */
        m->vq_k = flexdiag__kernels_cpu();
        FLEXDIAG_TRY(m->vq_k->stream_create(-1, rt->p.threads, &m->vq_s));
        FLEXDIAG_INFO("backend %s has no image-decoder ops: the VQ decoder runs on the CPU",
                      rt->k->name);
        return FLEXDIAG_OK;
    }
    uint64_t bytes = 0;
    FLEXDIAG_TRY(flexdiag__vq_device_bytes(vc, &bytes));
    FLEXDIAG_TRY(flexdiag__arena_charge(&rt->arena, (int64_t)bytes, "the VQ image decoder"));
    m->vq_charge = bytes;
    return FLEXDIAG_OK;
}

/* The decoder of a folder model, when it has one: in its checkpoint st (Janus), or a
 * Chameleon folder's vqgan.safetensors beside it. */
static flexdiag_status vq_from_dir(flexdiag_model *m, const flexdiag_safetensors *st,
                                   const char *path) {
    flexdiag_vq_config vc;
    flexdiag_safetensors *vqgan = NULL;
    int found = 0;
    FLEXDIAG_TRY(flexdiag__vq_config_of_dir(&m->cfg, st, path, &vc, &vqgan, &found));
    flexdiag_status r = found ? vq_backend(m, &vc) : FLEXDIAG_OK;
    if (r == FLEXDIAG_OK && found)
        r = flexdiag__vq_create(m->vq_k, m->vq_s, vqgan ? vqgan : st, &vc, FLEXDIAG__VQ_BATCH,
                                &m->vq);
    if (vqgan) flexdiag__st_close(vqgan);
    return r;
}

/* Builtin models get a seeded random decoder: small for the toy shapes, VQ-16 for full ones. */
static flexdiag_status vq_builtin(flexdiag_model *m, uint64_t seed) {
    flexdiag_vq_config vc;
    flexdiag__vq_config_builtin(&m->cfg, &vc);
    FLEXDIAG_TRY(vq_backend(m, &vc));
    return flexdiag__vq_create_random(m->vq_k, m->vq_s, &vc, seed ^ 0x5157, FLEXDIAG__VQ_BATCH,
                                      &m->vq);
}

/* Where the layer weights of m go under pct (GPU, CPU, disk percent): the tiers made first. */
static flexdiag_status place_for(flexdiag_model *m, const flexdiag_model_params *mp,
                                 flexdiag_weights_place *out) {
    const uint32_t *pct = mp->weights_pct;
    if (mp->compress_weights != 0 && mp->compress_weights != 4)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "model_params.compress_weights is %u: 0 (none) or 4 (4-bit "
                             "groups)",
                             mp->compress_weights);
    *out = (flexdiag_weights_place){
        .pct = {pct[0], pct[1], pct[2]},
        .compress = (mp->compress_weights == 4 ? FLEXDIAG_WCOMPRESS_Q4 : 0) |
                    (m->rt->p.compress_disk == 1 ? FLEXDIAG_WCOMPRESS_ZSTD : 0),
        .threads = m->rt->p.threads};
    uint64_t need[3];
    flexdiag_wcut cut;
    FLEXDIAG_TRY(flexdiag__weights_plan(&m->cfg, pct, out->compress, need, &cut));
    FLEXDIAG_TRY(flexdiag__tiers_prepare(m->rt, &cut, need));
    out->pool = m->rt->pool;
    out->store = m->rt->store;
    return FLEXDIAG_OK;
}

/* A Chameleon model whose vocabulary cannot frame images runs as a text decoder: said once,
 * at load (a warning when it names image codes, so looks meant to draw). */
static void note_text_only(const flexdiag_model_config *c) {
    if (c->arch != FLEXDIAG_ARCH_CHAMELEON || c->image_vocab > 0) return;
    if (c->no_image[0])
        FLEXDIAG_WARN("%s: %s; the model runs as a text decoder", c->source, c->no_image);
    else
        FLEXDIAG_INFO("%s: the vocabulary names no image codes (IMGIMG...Z tokens); the model "
                      "runs as a text decoder", c->source);
}

static flexdiag_status model_from_dir(flexdiag_model *m, const char *path,
                                      const flexdiag_model_params *mp) {
    flexdiag_runtime *rt = m->rt;
    m->dir = strdup(path);
    if (!m->dir) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "model: no memory");
    FLEXDIAG_TRY(flexdiag__config_load(path, &m->cfg));
    note_text_only(&m->cfg);
    char tj[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
    FILE *f = fopen(tj, "rb");
    if (f) {
        fclose(f);
        FLEXDIAG_TRY(flexdiag__tok_load(tj, &m->tok));
        FLEXDIAG_TRY(flexdiag__special_ids(m));
    }
    flexdiag_safetensors *st = NULL;
    FLEXDIAG_TRY(flexdiag__st_open(path, &st));
    flexdiag_weights_place pl;
    flexdiag_status r = flexdiag__weights_adapt(&m->cfg, st);
    if (r == FLEXDIAG_OK) r = place_for(m, mp, &pl);
    if (r == FLEXDIAG_OK) r = flexdiag__weights_load(&rt->arena, rt->s, &m->cfg, st, &pl, &m->w);
    if (r == FLEXDIAG_OK) r = vq_from_dir(m, st, path);
    flexdiag__st_close(st);
    return r;
}

flexdiag_status flexdiag_model_load(flexdiag_runtime *rt, const char *path,
                                    const flexdiag_model_params *p, flexdiag_model **out) {
    flexdiag__err_clear();
    if (!rt || !out || !p) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "model_load: NULL argument");
    *out = NULL;
    FLEXDIAG_TRY(flexdiag__check_params(p, FLEXDIAG_FIRST_SIZE(flexdiag_model_params, seed),
                                        sizeof *p, "flexdiag_model_params"));
    flexdiag_model_params mp = {0};
    flexdiag__params_copy(&mp, p, sizeof mp); /* fields after an older caller's struct stay 0 */
    flexdiag_model *m = calloc(1, sizeof *m);
    if (!m) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "model: no memory");
    m->rt = rt;
    flexdiag_status st;
    flexdiag_weights_place pl;
    if (path) {
        st = model_from_dir(m, path, &mp);
    } else {
        st = flexdiag__config_builtin(mp.arch, &m->cfg);
        if (st == FLEXDIAG_OK) st = place_for(m, &mp, &pl);
        if (st == FLEXDIAG_OK)
            st = flexdiag__weights_random(&rt->arena, rt->s, &m->cfg, mp.seed, &pl, &m->w);
        if (st == FLEXDIAG_OK && m->cfg.arch == FLEXDIAG_ARCH_JANUS) st = vq_builtin(m, mp.seed);
    }
    if (st == FLEXDIAG_OK) st = flexdiag__vocab_map_codes(path, &m->cfg, &m->img_codes);
    if (st != FLEXDIAG_OK) {
        flexdiag_model_destroy(m);
        return st;
    }
    *out = m;
    return FLEXDIAG_OK;
}

void flexdiag_model_destroy(flexdiag_model *m) {
    if (!m) return;
    flexdiag__vq_destroy(m->vq);
    if (m->vq_s && m->vq_s != m->rt->s) m->vq_k->stream_destroy(m->vq_s);
    flexdiag__arena_charge(&m->rt->arena, -(int64_t)m->vq_charge, "VQ decoder");
    flexdiag__weights_free(&m->rt->arena, &m->w);
    flexdiag__tok_destroy(m->tok);
    free(m->img_codes);
    free(m->dir);
    free(m);
}

flexdiag_status flexdiag_model_eos(const flexdiag_model *m, int32_t *eos) {
    flexdiag__err_clear();
    if (!m || !eos) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "model_eos: NULL argument");
    *eos = m->cfg.arch == FLEXDIAG_ARCH_JANUS ? -1 : m->cfg.eos_id;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_detokenize(const flexdiag_model *m, const int32_t *ids, int32_t n,
                                    bool skip_special, char *out, size_t cap, size_t *len) {
    flexdiag__err_clear();
    if (!m || (!ids && n > 0) || n < 0 || !len || (!out && cap))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "detokenize: NULL argument or n < 0");
    if (!m->tok)
        return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND, "%s has no tokenizer.json: no text to give",
                             m->dir ? m->dir : m->cfg.name);
    char *text = NULL;
    FLEXDIAG_TRY(flexdiag__tok_decode(m->tok, ids, n, skip_special, &text, len));
    if (cap) {
        size_t k = *len < cap ? *len : cap - 1;
        memcpy(out, text, k);
        out[k] = '\0';
    }
    free(text);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_model_image_size(const flexdiag_model *m, int32_t *h, int32_t *w) {
    if (!m || !h || !w) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "image_size: NULL argument");
    *h = *w = 0;
    if (m->vq) flexdiag__vq_image_size(flexdiag__vq_get_config(m->vq), h, w);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_decode_images(flexdiag_model *m, const int32_t *tokens, int32_t n,
                                       float *pixels) {
    flexdiag__err_clear();
    if (!m || !tokens || !pixels || n < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "decode_images: NULL argument or n < 0");
    if (!m->vq)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s has no image decoder (no gen_vision_model / vqmodel tensors)",
                             m->dir ? m->dir : m->cfg.name);
    pthread_mutex_lock(&m->rt->s_mu); /* the runtime's stream and the decoder's scratch */
    flexdiag_status st = flexdiag__vq_decode(m->vq, m->vq_s, tokens, n, pixels);
    pthread_mutex_unlock(&m->rt->s_mu);
    return st;
}

/* ---- context ---- */

/* Fail before any allocation when the context cannot fit, naming the largest batch that does. */
static flexdiag_status check_fits(const flexdiag_model *m, const flexdiag_context_params *p) {
    size_t need = 0, host = 0;
    FLEXDIAG_TRY(flexdiag__context_sizes(m, p, &need, &host));
    uint64_t avail = flexdiag__arena_available(&m->rt->arena);
    uint64_t host_avail = flexdiag__context_host_avail(m);
    if (need <= avail && host <= host_avail) return FLEXDIAG_OK;
    int32_t fit = flexdiag__context_fit(m, p, avail);
    if (need <= avail)
        return flexdiag__err(FLEXDIAG_ERR_OOM_PINNED,
                             "a batch of %d image(s) keeps %.3f GiB of KV cache in pinned host "
                             "memory (context_params.kv_pct), but %.3f GiB of the pool is free; "
                             "the largest batch that fits is %d (raise runtime_params.cpu_mem or "
                             "keep more KV on the GPU)",
                             p->max_images, (double)host / (1u << 30),
                             (double)host_avail / (1u << 30), fit);
    return flexdiag__err(FLEXDIAG_ERR_OOM_DEVICE,
                         "a batch of %d image(s) needs %.3f GiB of device memory for KV cache and "
                         "scratch, but %.3f GiB is available under the budget after the weights; "
                         "the largest batch that fits is %d%s",
                         p->max_images, (double)need / (1u << 30), (double)avail / (1u << 30), fit,
                         fit ? "" : " (lower context_params.max_prompt_len or raise "
                                        "runtime_params.gpu_mem)");
}

flexdiag_status flexdiag_context_max_images(const flexdiag_model *m,
                                            const flexdiag_context_params *p, int32_t *out) {
    flexdiag__err_clear();
    if (!m || !p || !out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_max_images: NULL argument");
    *out = 0;
    FLEXDIAG_TRY(flexdiag__check_params(p,
                                        FLEXDIAG_FIRST_SIZE(flexdiag_context_params, progress_user),
                                        sizeof *p, "flexdiag_context_params"));
    flexdiag_context_params q;
    flexdiag_context_params_init(&q);
    flexdiag__params_copy(&q, p, sizeof q);
    /* the params' own errors (policy, lengths) first: the fit below only sees "too big" */
    flexdiag_context_params one = q;
    one.max_images = 1;
    size_t need = 0;
    FLEXDIAG_TRY(flexdiag__context_bytes(m, &one, &need));
    if (m->rt->arena.budget == UINT64_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "flexdiag_context_max_images has no memory budget to fill: the CPU "
                             "engine has none unless runtime_params.gpu_mem gives one; or give "
                             "context_params.max_images a number");
    *out = flexdiag__context_fit(m, &q, flexdiag__arena_available(&m->rt->arena));
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_context_create(flexdiag_model *m, const flexdiag_context_params *p,
                                        flexdiag_context **out) {
    flexdiag__err_clear();
    if (!m || !p || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_create: NULL argument");
    *out = NULL;
    FLEXDIAG_TRY(flexdiag__check_params(p,
                                        FLEXDIAG_FIRST_SIZE(flexdiag_context_params, progress_user),
                                        sizeof *p, "flexdiag_context_params"));
    flexdiag_context *c = calloc(1, sizeof *c);
    if (!c) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "context: no memory");
    c->m = m;
    flexdiag_context_params_init(&c->p);
    flexdiag__params_copy(&c->p, p, sizeof c->p);
    flexdiag_status st = check_fits(m, &c->p);
    if (st == FLEXDIAG_OK) st = flexdiag__context_alloc(c);
    if (st == FLEXDIAG_OK) st = flexdiag__queue_create(c);
    if (st != FLEXDIAG_OK) {
        flexdiag_context_destroy(c);
        return st;
    }
    *out = c;
    return FLEXDIAG_OK;
}

void flexdiag_context_destroy(flexdiag_context *c) {
    if (!c) return;
    flexdiag__queue_destroy(c); /* its requests end, its engine thread stops */
    flexdiag__context_free(c);
    free(c);
}

flexdiag_status flexdiag_context_cancel(flexdiag_context *c) {
    if (!c) { /* the thread's message is touched only here: a signal handler may cancel */
        flexdiag__err_clear();
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_cancel: NULL context");
    }
    atomic_store(&c->cancel, 1); /* a scoring call in flight */
    flexdiag__queue_cancel_all(c);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_context_stats(const flexdiag_context *c, flexdiag_stats *out) {
    flexdiag__err_clear();
    if (!c || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_stats: NULL argument");
    *out = c->stats;
    out->peak_device_bytes = atomic_load(&((flexdiag_context *)c)->m->rt->arena.peak);
    return FLEXDIAG_OK;
}
