/*
 * api_check.h - the struct_size checks every public entry point makes (private to runtime/):
 * params structs the caller filled with their _init() (from their first version's size up;
 * longer ones, from a program built against a newer flexdiag.h, when every byte this library
 * does not know is zero), the copy of such a struct over the library's defaults, and output
 * structs the caller sized itself (its first version's size up to ours). Each failure names
 * the struct and the fix (docs/abi.md, "struct_size").
 */
#ifndef FLEXDIAG_API_CHECK_H
#define FLEXDIAG_API_CHECK_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/api_check.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/core.h"
#include "flexdiag.h"

/* A struct_size above this is no version of any struct (an uninitialised struct): refused
 * before its bytes are read. */
#define FLEXDIAG_STRUCT_SIZE_MAX 4096u

/* The struct_size a caller wrote at the start of its struct p. */
static inline uint32_t flexdiag__struct_size(const void *p) {
    uint32_t got;
    memcpy(&got, p, sizeof got);
    return got;
}

/* The first byte of p in [from, to) that is not zero, or `to`. */
static inline size_t flexdiag__first_nonzero(const void *p, size_t from, size_t to) {
    const unsigned char *b = p;
    while (from < to && b[from] == 0) from++;
    return from;
}

/* A params struct p (struct_size first): least <= struct_size (least: its first version's
 * size, what the oldest program that can pass it has; below: "call <what>_init() first"), and
 * the bytes past want (this library's size) all zero: a program built against a newer
 * flexdiag.h that leaves the newer fields at zero asks nothing this library cannot do (the
 * Linux kernel's copy_struct_from_user rule). A non-zero byte there is refused naming its
 * offset. */
static inline flexdiag_status flexdiag__check_params(const void *p, size_t least, size_t want,
                                                     const char *what) {
    uint32_t got = flexdiag__struct_size(p);
    if (got < least || got > FLEXDIAG_STRUCT_SIZE_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s.struct_size is %u, the size of no version of it (%zu..%u): "
                             "call %s_init() first",
                             what, got, least, FLEXDIAG_STRUCT_SIZE_MAX, what);
    size_t bad = flexdiag__first_nonzero(p, want, got);
    if (bad < got)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s.struct_size is %u, larger than this library's %zu (API version "
                             "%u), and byte %zu is not zero: the program sets a field this "
                             "library does not have (compiled against a newer flexdiag.h); run "
                             "it with the library of that version, or leave that field at 0",
                             what, got, want, (unsigned)FLEXDIAG_API_VERSION, bad);
    return FLEXDIAG_OK;
}

/* Copy the checked params struct src over dst (this library's struct of want bytes, holding
 * its defaults): the bytes both versions have; dst keeps its defaults past an older caller's
 * struct and gets struct_size = want. */
static inline void flexdiag__params_copy(void *dst, const void *src, size_t want) {
    uint32_t got = flexdiag__struct_size(src), size = (uint32_t)want;
    memcpy(dst, src, got < want ? got : want);
    memcpy(dst, &size, sizeof size);
}

/* Write the library's defaults def (want bytes) into the caller's params struct p of size
 * bytes (the caller's sizeof): the bytes both have, zeros past want, struct_size = size. Nothing
 * past size is written. */
static inline void flexdiag__params_fill(void *p, size_t size, const void *def, size_t want) {
    uint32_t s = (uint32_t)size;
    if (size < sizeof s) return; /* no struct_size to set: the call that takes it refuses it */
    memcpy(p, def, size < want ? size : want);
    if (size > want) memset((char *)p + want, 0, size - want);
    memcpy(p, &s, sizeof s);
}

/* The size of a struct's first version: the end of the last field it had. */
#define FLEXDIAG_FIRST_SIZE(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

/* An output struct: least <= got <= want (bytes), else "set it to sizeof(<what>)". A larger
 * one is refused, not filled in part: its newer fields would read as zeros the library never
 * wrote. */
static inline flexdiag_status flexdiag__check_output(uint32_t got, size_t least, size_t want,
                                                     const char *what) {
    if (got < least || got > want)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s.struct_size is %u (expected %zu..%zu): set it to sizeof(%s)",
                             what, got, least, want, what);
    return FLEXDIAG_OK;
}

#endif /* FLEXDIAG_API_CHECK_H */
