/*
 * tok_bytes.c - white-box queries on a loaded tokenizer for the tokenizer tests (see
 * tok_bytes.h), through tokenizer_impl.h.
 */
#include "tok_bytes.h"

#include "runtime/text/tokenizer_impl.h"

int64_t tu_tok_ids(const flexdiag_tokenizer *t) { return t->n_ids; }
