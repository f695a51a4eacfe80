/*
 * st_write.h - writing safetensors files for the tests (st_write.c): fixtures, corrupt-file
 * cases and fuzz seeds. The library only reads safetensors (runtime/model/safetensors.h).
 */
#ifndef FLEXDIAG_TEST_ST_WRITE_H
#define FLEXDIAG_TEST_ST_WRITE_H

#include <stdint.h>

#include "runtime/model/safetensors.h"

typedef struct flexdiag_st_entry {
    const char *name;                    /* tensor name */
    flexdiag_dtype dtype;                /* stored dtype */
    int32_t ndim;                        /* rank */
    int64_t shape[FLEXDIAG_ST_MAX_DIMS]; /* dims */
    const void *data;                    /* numel x dtype size bytes, little-endian */
} flexdiag_st_entry;

/* Write a valid safetensors file atomically (temp file + rename, cli/fileio.h); the message of
 * a failure is in cli_io_error() or flexdiag_last_error(). */
flexdiag_status flexdiag__st_write(const char *path, const flexdiag_st_entry *entries, int64_t n);

#endif /* FLEXDIAG_TEST_ST_WRITE_H */
