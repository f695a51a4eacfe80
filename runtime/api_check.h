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
#include "flexdiag.h"

/* A params struct: least <= got <= want (bytes; least: its first version's size, what the
 * oldest program that can pass it has); below, "call <what>_init() first"; above, the program
 * was built against a newer flexdiag.h than this library. */
static inline flexdiag_status flexdiag__check_params(uint32_t got, size_t least, size_t want,
                                                     const char *what) {
    if (got > want)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s.struct_size is %u, larger than this library's %zu (API version "
                             "%u): the program was compiled against a newer flexdiag.h; run it "
                             "with the library of that version",
                             what, got, want, (unsigned)FLEXDIAG_API_VERSION);
    if (got < least)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s.struct_size is %u (expected %zu..%zu): call %s_init() first",
                             what, got, least, want, what);
    return FLEXDIAG_OK;
}

/* The size of a struct's first version: the end of the last field it had. */
#define FLEXDIAG_FIRST_SIZE(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

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
