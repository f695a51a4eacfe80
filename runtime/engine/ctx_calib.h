/*
 * ctx_calib.h - a context's calibration table (policies ssd and hack, docs/policies.md §7.2):
 * the file context_params.policy_calib names is read, checked against the context's model and
 * turned into the head plan its policy reads (kv_policy.h params heads), owned by the context.
 * Also the model config hash a table carries, which `flexdiag-bench calibrate` writes.
 */
#ifndef FLEXDIAG_CTX_CALIB_H
#define FLEXDIAG_CTX_CALIB_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/engine/ctx_calib.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "runtime/engine/engine.h"

#define FLEXDIAG_SSD_TAU_DEFAULT 0.5 /* context_params ssd_tau 0 */

/* FNV-1a 64 of the config fields that shape a model's attention and vocabulary (architecture,
 * the decoder's sizes and variant, the image geometry and special ids; not the name, the
 * source path or the weights): the table of one model is refused by another. */
uint64_t flexdiag__model_config_hash(const flexdiag_model_config *cfg);
/* For a policy that needs one (flexdiag__kvp_needs_calib): read c->p.policy_calib, check it
 * against c's model (config hash, W_s = w_s, decode length, layers, heads) and make c->heads
 * for the resolved budget and tau (ssd_tau: 0 = the default, negative = 0). Any earlier plan of
 * c is freed first; nothing is made for the other policies. FLEXDIAG_ERR_INVALID_ARG naming
 * context_params.policy_calib (or ssd_tau) and the fix. */
flexdiag_status flexdiag__ctx_calib_open(flexdiag_context *c, int32_t w_s);
/* Free c->heads (NULL afterwards). */
void flexdiag__ctx_calib_close(flexdiag_context *c);

#endif /* FLEXDIAG_CTX_CALIB_H */
