/*
 * tokenizer.h - byte-level BPE tokenizer read from a Hugging Face `tokenizers` tokenizer.json,
 * and the Janus-Pro prompt template (docs/architecture.md §4.1, docs/formats.md §3).
 *
 * Encoding reproduces the `tokenizers` library (encode(text, add_special_tokens=False)) for the
 * configurations DeepSeek-LLM / Janus ship: added tokens split out first (exact strings, leftmost
 * longest), normalizer null, a pre-tokenizer made of Split (regex or string) and ByteLevel steps,
 * then a BPE model ranked by its merges. Unsupported options are refused at load time with a
 * message naming the option, never silently ignored. Special ids are always resolved by string
 * (they differ between Janus-Pro 1B and 7B); nothing here hard-codes an id.
 *
 * A loaded tokenizer is immutable: encode/decode may run concurrently on one handle.
 */
#ifndef FLEXDIAG_TOKENIZER_H
#define FLEXDIAG_TOKENIZER_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/text/tokenizer.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token strings of the Janus template. BOS/EOS/pad use U+FF5C (fullwidth bar) and U+2581. */
#define FLEXDIAG_TOK_BOS "<｜begin▁of▁sentence｜>"
#define FLEXDIAG_TOK_EOS "<｜end▁of▁sentence｜>"
#define FLEXDIAG_TOK_PAD "<｜▁pad▁｜>"
#define FLEXDIAG_TOK_BOI "<begin_of_image>"

typedef struct flexdiag_tokenizer flexdiag_tokenizer;

/* Ids of the tokens the Janus generation procedure needs, resolved by string. */
typedef struct flexdiag_janus_tokens {
    int32_t bos; /* <｜begin▁of▁sentence｜>, first id of every row */
    int32_t pad; /* <｜▁pad▁｜>, fills the unconditional rows */
    int32_t boi; /* <begin_of_image>, last prompt id */
} flexdiag_janus_tokens;

/* ---- load ---- */

/* Read and validate tokenizer.json at path (copied). Errors name the file and the offending
 * field: FLEXDIAG_ERR_IO (unreadable), FLEXDIAG_ERR_CORRUPT_MODEL (malformed JSON, bad merges,
 * bad regex with PCRE2's message and offset), FLEXDIAG_ERR_UNSUPPORTED (options not implemented).
 * On failure *out == NULL. */
flexdiag_status flexdiag__tok_load(const char *path, flexdiag_tokenizer **out);
/* Same from an in-memory JSON document (copied); name labels messages. */
flexdiag_status flexdiag__tok_load_json(const char *json, size_t len, const char *name,
                                        flexdiag_tokenizer **out);
/* Free t; NULL is a no-op. */
void flexdiag__tok_destroy(flexdiag_tokenizer *t);

/* ---- queries ---- */

/* Id of the exact token string (added tokens first, then model.vocab), or -1 if absent. */
int32_t flexdiag__tok_id(const flexdiag_tokenizer *t, const char *token);
/* Like flexdiag__tok_id but absence is FLEXDIAG_ERR_NOT_FOUND naming the token and the file. */
flexdiag_status flexdiag__tok_require_id(const flexdiag_tokenizer *t, const char *token,
                                         int32_t *id);

/* ---- encode ---- */

/* Encode len bytes of UTF-8 text (borrowed) exactly like tokenizers' encode(text,
 * add_special_tokens=False): no BOS. *ids is malloc'ed (caller frees; non-NULL even when
 * *n == 0). Invalid UTF-8 -> FLEXDIAG_ERR_INVALID_ARG naming the byte offset. */
flexdiag_status flexdiag__tok_encode(const flexdiag_tokenizer *t, const char *text, size_t len,
                                     int32_t **ids, int64_t *n);

/* ---- decode ---- */

/* The text of n ids, like tokenizers' decode(ids, skip_special_tokens): *out is malloc'ed,
 * NUL-terminated UTF-8 of *len bytes (caller frees). An id the tokenizer has no token for (a
 * model vocabulary padded past the tokenizer's) adds nothing, as in the library. */
flexdiag_status flexdiag__tok_decode(const flexdiag_tokenizer *t, const int32_t *ids, int64_t n,
                                     bool skip_special, char **out, size_t *len);

/* ---- Janus-Pro ---- */

/* BOS, pad and <begin_of_image> ids; a missing one is FLEXDIAG_ERR_NOT_FOUND naming it. */
flexdiag_status flexdiag__janus_tokens(const flexdiag_tokenizer *t, flexdiag_janus_tokens *out);
/* Conditional prompt ids: [BOS] + encode(strip("<|User|>: " + strip(prompt) +
 * "\n\n<|Assistant|>:")) + [<begin_of_image>]. prompt is NUL-terminated UTF-8 (borrowed);
 * *ids is malloc'ed (caller frees). */
flexdiag_status flexdiag__janus_prompt_ids(const flexdiag_tokenizer *t, const char *prompt,
                                           int32_t **ids, int64_t *n);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_TOKENIZER_H */
