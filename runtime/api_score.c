/*
 * api_score.c - teacher-forced scoring in the public API (include/flexdiag.h, API version 3):
 * checks the request, answers the size query and hands the run to the engine
 * (flexdiag__context_score), which marks the context busy for the call.
 */
#include <stddef.h>
#include <string.h>

#include "base/core.h"
#include "runtime/api_check.h"
#include "runtime/engine/engine.h"

/* Bytes of flexdiag_score_output in API version 3: the least a caller may pass. */
#define SCORE_OUTPUT_V3 (offsetof(flexdiag_score_output, raw) + sizeof(float *))

void flexdiag_score_request_init(flexdiag_score_request *r) {
    memset(r, 0, sizeof *r);
    r->struct_size = sizeof *r;
    r->cfg_weight = 5.0f;
}

flexdiag_status flexdiag_score(flexdiag_context *c, const flexdiag_score_request *req,
                               flexdiag_score_output *out) {
    flexdiag__err_clear();
    if (!c || !req || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "score: NULL argument");
    FLEXDIAG_TRY(flexdiag__check_params(req->struct_size, sizeof *req, "flexdiag_score_request"));
    FLEXDIAG_TRY(flexdiag__check_output(out->struct_size, SCORE_OUTPUT_V3, sizeof *out,
                                        "flexdiag_score_output"));
    flexdiag_score_request r;
    flexdiag_score_request_init(&r);
    memcpy(&r, req, req->struct_size);
    out->vocab = c->vocab_out;
    out->rows = c->rows_per_img;
    if (!out->logits && !out->raw) return FLEXDIAG_OK; /* size query */
    if (!r.prompt_ids || r.prompt_len < 1 || !r.ids || r.n < 1 || !(r.cfg_weight == r.cfg_weight))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "score: need prompt_ids with prompt_len >= 1, ids with n >= 1 and a "
                             "numeric cfg_weight");
    return flexdiag__context_score(c, r.prompt_ids, r.prompt_len, r.ids, r.n, r.cfg_weight,
                                   out->logits, out->raw);
}
