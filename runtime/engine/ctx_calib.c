/*
 * ctx_calib.c - the calibration table of a context whose policy types its heads from one (ssd,
 * hack; docs/policies.md §7.2): read once per geometry pass, checked against the model, reduced
 * to the head plan (policy/kvp_calib.h flexdiag__kvp_heads_make) the policy reads for the life
 * of the context, and freed; and the model config hash that ties a table to its model.
 */
#include <math.h>
#include <stdio.h>

#include "base/core.h"
#include "policy/kvp_calib.h"
#include "runtime/engine/ctx_calib.h"

#define F_CALIB "context_params.policy_calib"

uint64_t flexdiag__model_config_hash(const flexdiag_model_config *m) {
    const flexdiag_lm_config *l = &m->lm;
    char s[1024];
    int n = snprintf(s, sizeof s,
                     "flexdiag-config-v1 arch=%d hidden=%d layers=%d heads=%d kv=%d hd=%d ffn=%d "
                     "vocab=%d max_pos=%d eps=%a theta=%a tie=%d ln=%d bias=%d relu=%d "
                     "pos_rows=%d pos_off=%d qk=%d img_vocab=%d img_embed=%d aligner=%d,%d "
                     "mid=%d img_tokens=%d grid=%d ids=%d,%d,%d,%d,%d,%d,%d,%d,%d",
                     (int)m->arch, l->hidden, l->layers, l->heads, l->kv_heads, l->head_dim,
                     l->ffn, l->vocab, l->max_pos, (double)l->rms_eps, (double)l->rope_theta,
                     l->tie_embed, l->layer_norm, l->bias, l->relu_mlp, l->pos_rows,
                     l->pos_offset, l->qk_rows, m->image_vocab, m->image_embed, m->aligner_dim,
                     m->aligner_depth, m->head_dim_mid, m->image_tokens, m->grid, m->bos_id,
                     m->pad_id, m->boi_id, m->eos_id, m->img_id0, m->row_end_id, m->eoi_id,
                     m->size_id, m->eot_id);
    return flexdiag__fnv1a64(FLEXDIAG_FNV_BASIS, s, (size_t)n < sizeof s ? (size_t)n : sizeof s);
}

/* The table's identity and shape against the context's: "" when they match, else why. */
static void table_mismatch(const flexdiag_kvp_calib *t, const flexdiag_context *c, int32_t w_s,
                           char *why, size_t n) {
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    uint64_t h = flexdiag__model_config_hash(&c->m->cfg);
    if (t->config_hash != h)
        snprintf(why, n, "it was made for another model (config hash %016llx, this model's "
                 "%016llx)", (unsigned long long)t->config_hash, (unsigned long long)h);
    else if (t->w_s != w_s)
        snprintf(why, n, "its image lines are %d tokens, this context's %d", (int)t->w_s,
                 (int)w_s);
    else if (t->l_dec != c->geo.l_dec)
        snprintf(why, n, "its decode length is %d, this context's %d", (int)t->l_dec,
                 (int)c->geo.l_dec);
    else if (t->n_layers != l->layers || t->h_q != l->heads || t->h_kv != l->kv_heads)
        snprintf(why, n, "its shape is %d layers x %d/%d heads, this model's %d x %d/%d",
                 (int)t->n_layers, (int)t->h_q, (int)t->h_kv, l->layers, l->heads, l->kv_heads);
}

/* tau from params ssd_tau: 0 the default, negative 0; NaN refused. */
static flexdiag_status ssd_tau(const flexdiag_context *c, double *tau) {
    double v = c->p.ssd_tau;
    if (isnan(v))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_params.ssd_tau is NaN: give a "
                             "threshold (0 = the default %g)", FLEXDIAG_SSD_TAU_DEFAULT);
    *tau = v == 0 ? FLEXDIAG_SSD_TAU_DEFAULT : v < 0 ? 0 : v;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__ctx_calib_open(flexdiag_context *c, int32_t w_s) {
    flexdiag__ctx_calib_close(c);
    flexdiag_policy_kind kind = c->p.policy.kind;
    if (!flexdiag__kvp_needs_calib(kind)) return FLEXDIAG_OK;
    const char *name = flexdiag__kvp_name(kind), *path = c->p.policy_calib;
    if (w_s < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy %s needs an image grid: a text "
                             "context has none (use another policy)", name);
    if (!path || !*path)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy %s needs a calibration table: give "
                             F_CALIB " FILE (made for this model by flexdiag-bench calibrate)",
                             name);
    double tau = 0;
    FLEXDIAG_TRY(ssd_tau(c, &tau));
    flexdiag_kvp_params kp;
    FLEXDIAG_TRY(flexdiag__kvp_resolve(&c->p.policy, c->geo.l_dec, &kp));
    flexdiag_kvp_calib *t = NULL;
    flexdiag_status st = flexdiag__kvp_calib_read(path, &t);
    if (st != FLEXDIAG_OK) return flexdiag__err_prefix(st, F_CALIB);
    char why[256] = "";
    table_mismatch(t, c, w_s, why, sizeof why);
    if (why[0])
        st = flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, F_CALIB " %s: %s; calibrate this model "
                           "(flexdiag-bench calibrate --model ...)", path, why);
    else
        st = flexdiag__kvp_heads_make(t, kind, kp.n_att, tau, &c->heads);
    flexdiag__kvp_calib_free(t);
    return st;
}

void flexdiag__ctx_calib_close(flexdiag_context *c) {
    flexdiag__kvp_heads_free(c->heads);
    c->heads = NULL;
}
