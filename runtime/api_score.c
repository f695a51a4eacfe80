/*
 * api_score.c - teacher-forced scoring in the public API (include/flexdiag.h, API version 3):
 * checks the request, answers the size query, hands the run to the engine
 * (flexdiag__context_score, which marks the context busy for the call) and checks that every
 * logit it returns is finite. Generation refuses non-finite logits where it samples (the
 * sampler's FLEXDIAG_ERR_NUMERIC); scoring samples nothing, so the same refusal happens here,
 * once over the outputs, rather than handing NaN to the caller as a result.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "base/core.h"
#include "runtime/api_check.h"
#include "runtime/engine/engine.h"

/* Bytes of flexdiag_score_output in API version 3: the least a caller may pass. */
#define SCORE_OUTPUT_V3 (offsetof(flexdiag_score_output, raw) + sizeof(float *))

void flexdiag_score_request_init_size(flexdiag_score_request *r, size_t size) {
    flexdiag_score_request d = {.struct_size = sizeof d, .cfg_weight = 5.0f};
    flexdiag__params_fill(r, size, &d, sizeof d);
}

/* a program built before API version 14 (the struct of API version 13) */
void(flexdiag_score_request_init)(flexdiag_score_request *r) {
    flexdiag_score_request_init_size(r, FLEXDIAG_FIRST_SIZE(flexdiag_score_request, cfg_weight));
}

/* FLEXDIAG_ERR_NUMERIC naming the first non-finite value of x (rows, n, vocab), if any; x may
 * be NULL (not wanted). */
static flexdiag_status check_finite(const float *x, int32_t rows, int32_t n, int32_t vocab,
                                    const char *what) {
    size_t total = x ? (size_t)rows * (size_t)n * (size_t)vocab : 0;
    for (size_t i = 0; i < total; i++)
        if (!isfinite(x[i])) {
            size_t pos = i / (size_t)vocab;
            return flexdiag__err(FLEXDIAG_ERR_NUMERIC, "the %s logits are not finite "
                                 "(%g at row %zu, position %zu, id %zu): the model produced "
                                 "NaN/Inf; check its weights", what, (double)x[i],
                                 pos / (size_t)n, pos % (size_t)n, i % (size_t)vocab);
        }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag_score(flexdiag_context *c, const flexdiag_score_request *req,
                               flexdiag_score_output *out) {
    flexdiag__err_clear();
    if (!c || !req || !out) return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "score: NULL argument");
    FLEXDIAG_TRY(flexdiag__check_params(req, sizeof *req, sizeof *req, "flexdiag_score_request"));
    FLEXDIAG_TRY(flexdiag__check_output(out->struct_size, SCORE_OUTPUT_V3, sizeof *out,
                                        "flexdiag_score_output"));
    flexdiag_score_request r;
    flexdiag_score_request_init(&r);
    flexdiag__params_copy(&r, req, sizeof r);
    out->vocab = c->geo.vocab_out;
    out->rows = c->geo.rows_per_img;
    if (!out->logits && !out->raw) return FLEXDIAG_OK; /* size query */
    if (!r.prompt_ids || r.prompt_len < 1 || !r.ids || r.n < 1 || !isfinite(r.cfg_weight))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "score: need prompt_ids with prompt_len >= 1, ids with n >= 1 and a "
                             "finite cfg_weight");
    FLEXDIAG_TRY(flexdiag__context_score(c, r.prompt_ids, r.prompt_len, r.ids, r.n, r.cfg_weight,
                                         out->logits, out->raw));
    FLEXDIAG_TRY(check_finite(out->logits, 1, r.n, out->vocab, "CFG-combined"));
    return check_finite(out->raw, out->rows, r.n, out->vocab, "per-row");
}
