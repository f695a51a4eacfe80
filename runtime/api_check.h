/*
 * api_check.h - the struct_size checks every public entry point makes (private to runtime/):
 * params structs the caller filled with their _init() (any size up to ours: older callers pass
 * shorter ones), and output structs the caller sized itself (at least the first version that
 * has them). Both fail with a message naming the struct and the fix.
 */
#ifndef FLEXDIAG_API_CHECK_H
#define FLEXDIAG_API_CHECK_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/api_check.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "base/core.h"

/* A params struct: 1 <= got <= want (bytes), else "call <what>_init() first". */
static inline flexdiag_status flexdiag__check_params(uint32_t got, size_t want, const char *what) {
    if (got == 0 || got > want)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s.struct_size is %u (expected %zu): call %s_init() first", what,
                             got, want, what);
    return FLEXDIAG_OK;
}

/* An output struct: least <= got <= want (bytes), else "set it to sizeof(<what>)". */
static inline flexdiag_status flexdiag__check_output(uint32_t got, size_t least, size_t want,
                                                     const char *what) {
    if (got < least || got > want)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s.struct_size is %u (expected %zu): set it to sizeof(%s)", what,
                             got, want, what);
    return FLEXDIAG_OK;
}

#endif /* FLEXDIAG_API_CHECK_H */
