/*
 * npy.h - NumPy .npy files (format 1.0/2.0/3.0, little-endian, C order): the exchange format of
 * the CLI (score logits, decode token grids and pixels, policy-trace logits). Writes are atomic
 * (cli/fileio.h). Plain C: failures return a status of the public header and leave their
 * message in cli_io_error().
 */
#ifndef FLEXDIAG_NPY_H
#define FLEXDIAG_NPY_H

#include <stdint.h>

#include "flexdiag.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLEXDIAG_NPY_MAX_DIMS 8 /* rank limit */

/* Element types ('<f4', '<i4', '<i8'). They carry the library's own numbers for these dtypes
 * (runtime/model/safetensors.h; tests/format/test_npy.c checks), so white-box tests may pass
 * either spelling. */
enum { FLEXDIAG_NPY_F32 = 2, FLEXDIAG_NPY_I32 = 3, FLEXDIAG_NPY_I64 = 4 };

typedef struct flexdiag_npy {
    int32_t dtype;                        /* FLEXDIAG_NPY_F32, _I32 or _I64 */
    int32_t ndim;                         /* rank */
    int64_t shape[FLEXDIAG_NPY_MAX_DIMS]; /* dims */
    int64_t numel;                        /* product of shape */
    void *data;                           /* numel elements, owned (flexdiag__npy_free) */
} flexdiag_npy;

/* Read path into *out (data malloc'ed, caller frees with flexdiag__npy_free). Malformed files
 * (bad magic or header, truncated or trailing data) are FLEXDIAG_ERR_INVALID_ARG, an unsupported
 * version, dtype, rank or Fortran order FLEXDIAG_ERR_UNSUPPORTED, a missing file
 * FLEXDIAG_ERR_NOT_FOUND; messages name the file and the reason. */
flexdiag_status flexdiag__npy_read(const char *path, flexdiag_npy *out);
/* Free a's data and clear it; NULL is a no-op. */
void flexdiag__npy_free(flexdiag_npy *a);
/* Write data (borrowed; numel of shape elements of dtype F32, I32 or I64) to path atomically,
 * format 1.0 with the data 64-byte aligned as numpy writes it. */
flexdiag_status flexdiag__npy_write(const char *path, int32_t dtype, int32_t ndim,
                                    const int64_t *shape, const void *data);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_NPY_H */
