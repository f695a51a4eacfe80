/*
 * prompt.h - turning text prompts into model token ids (see prompt.c).
 */
#ifndef FLEXDIAG_PROMPT_H
#define FLEXDIAG_PROMPT_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/text/prompt.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "flexdiag.h"

/* Conditional prompt ids for text (Janus: BOS + template + <begin_of_image>; Chameleon with
 * image set: BOS + template + end of turn + image start + size twice; text models: [BOS] +
 * encoding). *ids is malloc'ed and owned by the caller. */
flexdiag_status flexdiag__prompt_ids(const flexdiag_model *m, const char *text, int image,
                                     int32_t **ids, int64_t *n);
/* Fill special ids still unknown after the config (-1) from the tokenizer, by string. */
flexdiag_status flexdiag__special_ids(flexdiag_model *m);

#endif /* FLEXDIAG_PROMPT_H */
