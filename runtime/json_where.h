/*
 * json_where.h - where in its text a jansson load error is, for messages (private to runtime/).
 * jansson gives line -1 (and position 0) for errors that are about no place in the text: a
 * file it cannot open, an allocation; those messages then say no position at all.
 */
#ifndef FLEXDIAG_JSON_WHERE_H
#define FLEXDIAG_JSON_WHERE_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/json_where.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <jansson.h>
#include <stdio.h>

/* " at line L column C" when je names a place in the text, else ""; written into buf (n bytes),
 * which is returned. */
static inline const char *flexdiag__json_where(const json_error_t *je, char *buf, size_t n) {
    if (je->line > 0)
        snprintf(buf, n, " at line %d column %d", je->line, je->column);
    else if (n > 0)
        buf[0] = '\0';
    return buf;
}

#endif /* FLEXDIAG_JSON_WHERE_H */
