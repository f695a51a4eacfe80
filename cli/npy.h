/*
 * npy.h - NumPy .npy files (format 1.0/2.0, little-endian, C order): the exchange format of the
 * CLI (score logits, policy-trace logits, decode token grids). Writes are atomic (temp + rename).
 */
#ifndef FLEXDIAG_NPY_H
#define FLEXDIAG_NPY_H

#include <stdint.h>

#include "flexdiag.h"
#include "runtime/model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flexdiag_npy {
    flexdiag_dtype dtype;                /* F32, I32 or I64 ('<f4', '<i4', '<i8') */
    int32_t ndim;                        /* rank */
    int64_t shape[FLEXDIAG_ST_MAX_DIMS]; /* dims */
    int64_t numel;                       /* product of shape */
    void *data;                          /* numel elements, owned (free with flexdiag__npy_free) */
} flexdiag_npy;

/* Read path; errors name the file and the reason (bad magic, unsupported dtype, Fortran order,
 * truncated data). */
flexdiag_status flexdiag__npy_read(const char *path, flexdiag_npy *out);
void flexdiag__npy_free(flexdiag_npy *a);
/* Write data (numel of shape) as dtype F32, I32 or I64, atomically. */
flexdiag_status flexdiag__npy_write(const char *path, flexdiag_dtype dtype, int32_t ndim,
                                    const int64_t *shape, const void *data);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_NPY_H */
