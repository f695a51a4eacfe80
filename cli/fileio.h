/*
 * fileio.h - every file the CLI and the bench tool write goes through here, on raw file
 * descriptors (no stdio): the atomic writer (.npy, PNG, GenEval metadata), the JSON-lines
 * appender (generate's results.jsonl, bench and fidelity --json rows) and the record stream
 * (generate's tokens.json), plus the message of the last failed file operation. Short writes and
 * EINTR are retried; every failure (open, write, fsync, close, rename, truncate) returns a status
 * with a message that names the file, the error and what to do. Plain C on libc and the public
 * header's status codes; nothing here reaches into the library.
 */
#ifndef FLEXDIAG_CLI_FILEIO_H
#define FLEXDIAG_CLI_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

#if defined(__GNUC__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

/* ---- atomic files ---- */

/* One piece of a file being written: len bytes at data (borrowed; NULL when len is 0). */
typedef struct cli_part {
    const void *data;
    size_t len;
} cli_part;

/* Write the concatenation of parts[0..n) to path atomically: "<path>.tmp.<pid>" in the same
 * folder, fsync, rename over path, fsync of the folder, so readers never see a partial file; on
 * failure no temp file is left. FLEXDIAG_ERR_NO_SPACE (ENOSPC, EDQUOT), FLEXDIAG_ERR_NOT_FOUND
 * (no such folder) or FLEXDIAG_ERR_IO, with a message naming path (cli_io_error). A path that
 * exists and is not a regular file (/dev/null, a pipe) is written in place, never replaced; a
 * folder is refused (FLEXDIAG_ERR_INVALID_ARG). */
flexdiag_status cli_write_atomic(const char *path, const cli_part *parts, int n);

/* ---- JSON lines, appended ---- */

typedef struct cli_jsonl {
    int fd;     /* O_WRONLY | O_APPEND */
    char *path; /* owned; NULL when closed */
} cli_jsonl;

/* Open path for appending (created 0644 if missing; emptied first when truncate is set). On
 * failure j stays closed. Statuses as cli_write_atomic's. */
flexdiag_status cli_jsonl_open(cli_jsonl *j, const char *path, int truncate);
/* Append text (len bytes of whole lines: it ends in '\n'; borrowed) in one write, then fsync:
 * the file gains all of it or, after any failure, none of it (bytes that reached the file are
 * cut off again, so it never ends in a partial line; the message says if even that failed). */
flexdiag_status cli_jsonl_append(cli_jsonl *j, const void *text, size_t len);
/* Close j (a no-op when closed); FLEXDIAG_ERR_IO when close reports an error. */
flexdiag_status cli_jsonl_close(cli_jsonl *j);

/* ---- record stream: a file built record by record, then renamed into place ---- */

typedef struct cli_stream {
    int fd;          /* "<path>.tmp.<pid>" */
    char *path;      /* final name, owned; NULL when closed */
    char *tmp;       /* temp name, owned */
    char *tail;      /* closing bytes after the last record, owned */
    size_t tail_len; /* bytes of tail */
    int64_t end;     /* bytes of head + records: where the next record goes */
    int64_t prev;    /* end before the last append (cli_stream_undo goes back to it) */
    int dirty;       /* the bytes from end on are not exactly the tail (a restore failed) */
} cli_stream;

/* Create "<path>.tmp.<pid>" holding head and tail (NUL-terminated, copied). After every call
 * that succeeds the temp file is head + records + tail, a complete file; finishing it only
 * syncs and renames. On failure s stays closed and no temp file is left. */
flexdiag_status cli_stream_open(cli_stream *s, const char *path, const char *head,
                                const char *tail);
/* Append one record (len bytes, borrowed) before the tail. On failure the temp file keeps the
 * records before it (the partial one is cut off and the tail put back where possible). */
flexdiag_status cli_stream_append(cli_stream *s, const void *rec, size_t len);
/* Take back the last appended record (once; later calls do nothing). Keeps the message of the
 * failure that led here: if the file cannot be restored now, cli_stream_finish tries again. */
void cli_stream_undo(cli_stream *s);
/* Complete the file (the tail, if a failure left it out), fsync, rename over path, fsync of the
 * folder, close. On failure the temp file is kept with the records written so far and the
 * message names it. s is closed either way. */
flexdiag_status cli_stream_finish(cli_stream *s);
/* Close s and remove its temp file (a no-op when closed). */
void cli_stream_abort(cli_stream *s);

/* ---- messages ---- */

/* Record the message of a failed file operation for this thread (replacing the previous one)
 * and return st. */
flexdiag_status cli_io_fail(flexdiag_status st, const char *fmt, ...) CLI_PRINTF(2, 3);
/* This thread's last file-operation message ("" if none); never NULL. */
const char *cli_io_error(void);

#endif /* FLEXDIAG_CLI_FILEIO_H */
