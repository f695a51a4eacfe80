/*
 * tiers.c - the pinned host pool and the NVMe store of a runtime (tiers.h), and the public
 * report of where a context's weights live (flexdiag_context_offload).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/ranges.h"
#include "runtime/api_check.h"
#include "runtime/engine/engine.h"
#include "runtime/tiers.h"

/* Contexts whose disk staging a pool sized without runtime_params.cpu_mem has room for. */
#define STAGED_CONTEXTS 4

static flexdiag_status pool_make(flexdiag_runtime *rt, uint64_t need) {
    char a[32], b[32];
    if (rt->p.cpu_mem && need > rt->p.cpu_mem)
        return flexdiag__err(FLEXDIAG_ERR_OOM_PINNED,
                             "runtime_params.cpu_mem %s is too small: the weight placement needs "
                             "%s of pinned host memory (raise runtime_params.cpu_mem or move "
                             "weights with model_params.weights_pct)",
                             flexdiag__fmt_bytes(rt->p.cpu_mem, a, sizeof a),
                             flexdiag__fmt_bytes(need, b, sizeof b));
    flexdiag_host_pool_params hp;
    flexdiag__host_pool_params_init(&hp);
    hp.budget = flexdiag__ranges_round(rt->p.cpu_mem ? rt->p.cpu_mem : need, 4096);
    hp.k = rt->k;
    hp.name = "pinned host pool (runtime_params.cpu_mem)";
    char bus[64] = "";
    if (rt->k->pci_bus_id && rt->k->pci_bus_id(rt->p.device, bus, sizeof bus) == FLEXDIAG_OK)
        hp.pci_bus_id = bus;
    flexdiag__err_clear();
    return flexdiag__host_pool_create(&hp, &rt->pool);
}

/* The store, for `who` ("the weight placement", "the KV placement") needing `need` bytes;
 * `move` names the params field that moves that data elsewhere. */
static flexdiag_status store_make(flexdiag_runtime *rt, uint64_t need, const char *who,
                                  const char *move) {
    char a[32], b[32];
    if (!rt->offload_dir)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s puts %s on disk but no runtime_params.offload_dir was given",
                             who, flexdiag__fmt_bytes(need, b, sizeof b));
    if (rt->p.disk_mem && need > rt->p.disk_mem)
        return flexdiag__err(FLEXDIAG_ERR_NO_SPACE,
                             "runtime_params.disk_mem %s is too small: %s needs %s on disk "
                             "(raise runtime_params.disk_mem or move data off the disk with %s)",
                             flexdiag__fmt_bytes(rt->p.disk_mem, a, sizeof a), who,
                             flexdiag__fmt_bytes(need, b, sizeof b), move);
    flexdiag_store_params sp;
    flexdiag__store_params_init(&sp);
    sp.dir = rt->offload_dir;
    sp.budget = flexdiag__ranges_round(rt->p.disk_mem ? rt->p.disk_mem : need, 4096);
    sp.name = "offload store (runtime_params.offload_dir, runtime_params.disk_mem)";
    FLEXDIAG_TRY(flexdiag__store_create(&sp, &rt->store));
    if (!rt->pool) return FLEXDIAG_OK;
    flexdiag_store_buf buf = {flexdiag__host_pool_base(rt->pool),
                              flexdiag__host_pool_bytes(rt->pool)};
    return flexdiag__store_register_buffers(rt->store, &buf, 1);
}

flexdiag_status flexdiag__tiers_prepare(flexdiag_runtime *rt, const flexdiag_wcut *cut,
                                        const uint64_t need[3]) {
    if (need[1] == 0 && need[2] == 0) return FLEXDIAG_OK;
    uint64_t stage = need[2] ? (uint64_t)FLEXDIAG_DISK_STAGE * flexdiag__wcut_disk_stride(cut) : 0;
    pthread_mutex_lock(&rt->tier_mu);
    flexdiag_status st = FLEXDIAG_OK;
    if (!rt->pool) st = pool_make(rt, need[1] + STAGED_CONTEXTS * stage);
    if (st == FLEXDIAG_OK && need[2] && !rt->store)
        st = store_make(rt, need[2], "the weight placement", "model_params.weights_pct");
    pthread_mutex_unlock(&rt->tier_mu);
    return st;
}

flexdiag_status flexdiag__tiers_pool_alloc(flexdiag_runtime *rt, size_t bytes, const char *what,
                                           void **out) {
    pthread_mutex_lock(&rt->tier_mu);
    flexdiag_status st = rt->pool ? FLEXDIAG_OK : pool_make(rt, bytes);
    if (st == FLEXDIAG_OK) st = flexdiag__host_pool_alloc(rt->pool, bytes, what, out);
    pthread_mutex_unlock(&rt->tier_mu);
    return st;
}

flexdiag_status flexdiag__tiers_store_alloc(flexdiag_runtime *rt, uint64_t bytes, const char *what,
                                            flexdiag_store_extent *out) {
    pthread_mutex_lock(&rt->tier_mu);
    flexdiag_status st = rt->store ? FLEXDIAG_OK
                                   : store_make(rt, bytes, "the KV placement",
                                                "context_params.kv_pct");
    if (st == FLEXDIAG_OK) st = flexdiag__store_alloc(rt->store, bytes, what, out);
    pthread_mutex_unlock(&rt->tier_mu);
    return st;
}

void flexdiag__tiers_free(flexdiag_runtime *rt) {
    flexdiag__store_destroy(rt->store);
    flexdiag__host_pool_destroy(rt->pool);
    rt->store = NULL;
    rt->pool = NULL;
}

/* The fields of flexdiag_offload_info a program built against API version 4 knows. */
#define OFFLOAD_INFO_V4 (offsetof(flexdiag_offload_info, disk_wait_s) + sizeof(double))

/* Every field of the info of c into *out (the whole current struct). */
static void offload_fill(const flexdiag_context *c, flexdiag_offload_info *out) {
    const flexdiag_runtime *rt = c->m->rt;
    const flexdiag_weights *w = &c->m->w;
    memset(out, 0, sizeof *out);
    out->scheduler = c->sched->ops->name;
    uint64_t L = (uint64_t)c->m->cfg.lm.layers;
    if (w->homes) {
        for (int t = 0; t < 3; t++) {
            out->weights_pct[t] = w->homes->cut.pct[t];
            out->weights_bytes[t] = L * flexdiag__wcut_bytes(&w->homes->cut, t);
        }
    } else {
        out->weights_pct[0] = 100;
        out->weights_bytes[0] = L * w->layer_bytes;
    }
    if (rt->pool) {
        flexdiag_host_pool_stats ps;
        flexdiag__host_pool_stats(rt->pool, &ps);
        out->pinned_budget = ps.budget;
        out->pinned_used = ps.used;
        out->pinned = ps.pinned;
        out->pinned_note = flexdiag__host_pool_note(rt->pool);
    }
    if (rt->store) {
        flexdiag_store_stats ss;
        flexdiag__store_stats(rt->store, &ss);
        out->disk_budget = ss.capacity;
        out->disk_used = ss.used;
        out->disk_io = flexdiag__store_backend(rt->store);
        out->disk_note = flexdiag__store_note(rt->store);
    }
    if (c->sched->ops->stats) {
        flexdiag_sched_stats s;
        c->sched->ops->stats(c->sched, &s);
        out->loads = s.loads;
        out->h2d_bytes = s.h2d_bytes;
        out->disk_read_bytes = s.disk_bytes;
        out->disk_wait_s = s.disk_wait_s;
        out->kv_h2d_bytes = s.kv_h2d_bytes;
        out->kv_d2h_bytes = s.kv_d2h_bytes;
        out->kv_disk_read_bytes = s.kv_disk_read_bytes;
        out->kv_disk_write_bytes = s.kv_disk_write_bytes;
        out->kv_disk_wait_s = s.kv_disk_wait_s;
    }
    memcpy(out->kv_pct, c->p.kv_pct, sizeof out->kv_pct);
    if (!out->kv_pct[0] && !out->kv_pct[1] && !out->kv_pct[2]) out->kv_pct[0] = 100;
    out->kv_bytes[0] = (uint64_t)L * 2 * (uint64_t)c->homes.s_host * c->geo.seq_bytes;
    out->kv_bytes[1] = (uint64_t)L * 2 * (uint64_t)(c->homes.s_disk - c->homes.s_host) * c->geo.seq_bytes;
    out->kv_bytes[2] = (uint64_t)L * 2 * (uint64_t)(c->geo.n_seq - c->homes.s_disk) * c->geo.seq_bytes;
    flexdiag__cpu_attn_stats(c, out);
}

flexdiag_status flexdiag_context_offload(const flexdiag_context *c, flexdiag_offload_info *out) {
    flexdiag__err_clear();
    if (!c || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_offload: NULL argument");
    FLEXDIAG_TRY(flexdiag__check_output(out->struct_size, OFFLOAD_INFO_V4, sizeof *out,
                                        "flexdiag_offload_info"));
    flexdiag_offload_info all;
    offload_fill(c, &all);
    uint32_t size = out->struct_size; /* an older program's struct: the fields it has */
    memcpy(out, &all, size);
    out->struct_size = size;
    return FLEXDIAG_OK;
}
