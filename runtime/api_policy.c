/*
 * api_policy.c - the public API of KV policies (include/flexdiag.h, API version 3): their
 * command-line names and the resolved budget a context's runs use.
 *
 * Names, validation and resolution are the policy layer's (policy/kv_policy.h:
 * flexdiag__kvp_resolve, which context creation runs through the policy driver), so the CLI, the
 * bench tool and embedders spell, accept and resolve policies one way. A context's policy is
 * read from its policy driver: the parameters its runs use, not the ones it was asked for.
 */
#include <stddef.h>
#include <string.h>

#include "base/core.h"
#include "policy/kv_policy.h"
#include "runtime/api_check.h"
#include "runtime/engine/engine.h"

/* Bytes of flexdiag_policy_info in API version 3: the least a caller may pass. */
#define POLICY_INFO_V3 (offsetof(flexdiag_policy_info, sparsity) + sizeof(double))

const char *flexdiag_policy_name(flexdiag_policy_kind kind) {
    const char *name = flexdiag__kvp_name(kind);
    flexdiag_policy_kind back;
    return flexdiag__kvp_parse(name, &back) == 0 && back == kind ? name : NULL;
}

flexdiag_status flexdiag_policy_from_name(const char *name, flexdiag_policy_kind *out) {
    flexdiag__err_clear();
    if (!name || !out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "policy_from_name: NULL argument");
    if (flexdiag__kvp_parse(name, out) != 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "unknown policy '%s' (valid: %s)", name,
                             flexdiag__kvp_names());
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_context_policy(const flexdiag_context *c, flexdiag_policy_info *out) {
    flexdiag__err_clear();
    if (!c || !out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_policy: NULL argument");
    FLEXDIAG_TRY(flexdiag__check_output(out->struct_size, POLICY_INFO_V3, sizeof *out,
                                        "flexdiag_policy_info"));
    const flexdiag_kvp_params kp = c->pd.kp; /* what the context runs */
    flexdiag_policy_info info = {.struct_size = out->struct_size, .kind = kp.kind,
                                 .n_att = kp.n_att, .n_r = kp.n_r, .l_dec = kp.l_dec,
                                 .sparsity = flexdiag__kvp_reported_sparsity(&kp)};
    memcpy(out, &info, out->struct_size);
    return FLEXDIAG_OK;
}
