/*
 * fileio.h - what the CLI's file writers (.npy, PNG, GenEval metadata) share: the one atomic
 * file writer and the message of the last failed file operation. Plain C on libc and the public
 * header's status codes; nothing here reaches into the library.
 */
#ifndef FLEXDIAG_CLI_FILEIO_H
#define FLEXDIAG_CLI_FILEIO_H

#include <stddef.h>

#include "flexdiag.h"

#if defined(__GNUC__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

/* One piece of a file being written: len bytes at data (borrowed; NULL when len is 0). */
typedef struct cli_part {
    const void *data;
    size_t len;
} cli_part;

/* Write the concatenation of parts[0..n) to path atomically: "<path>.tmp.<pid>" in the same
 * folder, fsync, rename over path, fsync of the folder, so readers never see a partial file; on
 * failure no temp file is left. FLEXDIAG_ERR_NO_SPACE (ENOSPC, EDQUOT), FLEXDIAG_ERR_NOT_FOUND
 * (no such folder) or FLEXDIAG_ERR_IO, with a message naming path (cli_io_error). */
flexdiag_status cli_write_atomic(const char *path, const cli_part *parts, int n);

/* Record the message of a failed file operation for this thread (replacing the previous one)
 * and return st. */
flexdiag_status cli_io_fail(flexdiag_status st, const char *fmt, ...) CLI_PRINTF(2, 3);
/* This thread's last file-operation message ("" if none); never NULL. */
const char *cli_io_error(void);

#endif /* FLEXDIAG_CLI_FILEIO_H */
