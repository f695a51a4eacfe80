/*
 * tok_bytes.h - white-box queries on a loaded tokenizer for the tokenizer tests (tok_bytes.c);
 * decode(encode(x)) == x is checked with the library's own flexdiag__tok_decode.
 */
#ifndef FLEXDIAG_TESTS_TOK_BYTES_H
#define FLEXDIAG_TESTS_TOK_BYTES_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/text/tokenizer.h"

/* 1 + the largest id of t. */
int64_t tu_tok_ids(const flexdiag_tokenizer *t);

#endif /* FLEXDIAG_TESTS_TOK_BYTES_H */
