/*
 * tok_bytes.h - the tests' oracle for decode(encode(x)) == x: the bytes a sequence of token ids
 * stands for, read from a loaded tokenizer's id table (tok_bytes.c). The library has no decoder.
 */
#ifndef FLEXDIAG_TESTS_TOK_BYTES_H
#define FLEXDIAG_TESTS_TOK_BYTES_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/text/tokenizer.h"

/* The bytes of ids[0..n): byte-level symbols mapped back to bytes, other tokens (added tokens)
 * verbatim. malloc'ed and NUL-terminated (*len excludes the NUL); NULL for an id the tokenizer
 * does not have. */
char *tu_tok_bytes(const flexdiag_tokenizer *t, const int32_t *ids, int64_t n, size_t *len);
/* 1 + the largest id of t. */
int64_t tu_tok_ids(const flexdiag_tokenizer *t);

#endif /* FLEXDIAG_TESTS_TOK_BYTES_H */
