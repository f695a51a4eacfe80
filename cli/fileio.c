/*
 * fileio.c - the CLI's file writers on raw descriptors and their file-error message (fileio.h).
 *
 * Three shapes of output share one set of checked calls (short writes and EINTR retried; every
 * failure a status and a message "<file>: <what> failed: <error> (<what to do>)"):
 *  - atomic files: "<path>.tmp.<pid>" in the target's folder (same file system, so the rename
 *    is atomic), fsync'ed, renamed over the target and the folder fsync'ed: a failed or
 *    interrupted run never leaves a partial file under the target name, nor a temp file.
 *  - JSON lines: O_APPEND, one write of whole lines, then fsync; after a failure the file is cut
 *    back to where those lines began, so it never ends in a partial line and a line that is in
 *    the file was synced. Rejected: stdio, whose buffer flushes part of a line when it fills and
 *    reports a full disk only at fclose, after the caller has moved on.
 *  - record streams: the temp file always holds head + records + tail; a record is written over
 *    the tail (pwrite at the end of the records) and the tail put back after it, so a failed
 *    record is cut off and finishing needs no write at all. Rejected: writing the tail last (a
 *    full disk at the very end would cost the whole file).
 * Messages live in a thread-local buffer, replaced by each failure; a cleanup that fails after
 * the first failure adds to the message instead of replacing it.
 */
#include "cli/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- messages ---- */

static _Thread_local char io_err[1024];

flexdiag_status cli_io_fail(flexdiag_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(io_err, sizeof io_err, fmt, ap);
    va_end(ap);
    return st;
}

const char *cli_io_error(void) { return io_err; }

/* Add to the message of the failure recorded last. */
CLI_PRINTF(1, 2) static void io_note(const char *fmt, ...) {
    size_t n = strlen(io_err);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(io_err + n, sizeof io_err - n, fmt, ap);
    va_end(ap);
}

/* FLEXDIAG_ERR_NO_SPACE, FLEXDIAG_ERR_NOT_FOUND or FLEXDIAG_ERR_IO for errno value e. */
static flexdiag_status errno_status(int e) {
    return e == ENOSPC || e == EDQUOT ? FLEXDIAG_ERR_NO_SPACE
           : e == ENOENT              ? FLEXDIAG_ERR_NOT_FOUND
                                      : FLEXDIAG_ERR_IO;
}

/* What to do about errno value e, as " (hint)", or "". */
static const char *errno_hint(int e) {
    switch (e) {
    case ENOSPC: return " (the file system is full: free space or write elsewhere)";
    case EDQUOT: return " (disk quota exceeded: free space or write elsewhere)";
    case EROFS: return " (the file system is read-only: write elsewhere)";
    case ENOENT: return " (does the folder exist?)";
    case EACCES:
    case EPERM: return " (check the permissions of the file and its folder)";
    case EIO: return " (the device reported an error: check it, e.g. with dmesg)";
    default: return "";
    }
}

/* Record "<path>: <what>: <error> (hint)" and return its status. */
static flexdiag_status sys_fail(const char *path, const char *what, int e) {
    return cli_io_fail(errno_status(e), "%s: %s: %s%s", path, what, strerror(e), errno_hint(e));
}

/* ---- checked calls ---- */

/* open(path, flags | O_CLOEXEC, 0644), retrying EINTR; -1 with errno set. */
static int open_retry(const char *path, int flags) {
    int fd;
    do fd = open(path, flags | O_CLOEXEC, 0644);
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* Write n bytes at p to fd, at offset off (off < 0: at the file position), retrying short
 * writes and EINTR; *done gets the bytes written, also on failure. */
static flexdiag_status write_all(int fd, const void *p, size_t n, int64_t off, const char *path,
                                 size_t *done) {
    *done = 0;
    while (*done < n) {
        const char *q = (const char *)p + *done;
        ssize_t w = off < 0 ? write(fd, q, n - *done)
                            : pwrite(fd, q, n - *done, (off_t)(off + (int64_t)*done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return sys_fail(path, "write failed", w < 0 ? errno : EIO);
        *done += (size_t)w;
    }
    return FLEXDIAG_OK;
}

/* fsync fd; descriptors that cannot be synced (pipes, character devices) pass. */
static flexdiag_status sync_fd(int fd, const char *path) {
    while (fsync(fd) != 0) {
        if (errno == EINVAL || errno == EROFS) return FLEXDIAG_OK;
        if (errno != EINTR) return sys_fail(path, "fsync failed", errno);
    }
    return FLEXDIAG_OK;
}

/* close fd (released even when close reports an error, as Linux does). */
static flexdiag_status close_fd(int fd, const char *path) {
    if (close(fd) == 0 || errno == EINTR) return FLEXDIAG_OK;
    return sys_fail(path, "close failed", errno);
}

/* Create tmp, the temp file of path; -1 after recording "<path>: cannot create <tmp>: ...". */
static int create_temp(const char *path, const char *tmp, flexdiag_status *st) {
    int fd = open_retry(tmp, O_WRONLY | O_CREAT | O_TRUNC), e = errno;
    if (fd < 0)
        *st = cli_io_fail(errno_status(e), "%s: cannot create its temp file %s: %s%s", path, tmp,
                          strerror(e), errno_hint(e));
    return fd;
}

/* Record "<path>: cannot rename <tmp> into place: <error>". */
static flexdiag_status rename_fail(const char *path, const char *tmp, int e) {
    return cli_io_fail(errno_status(e), "%s: cannot rename %s into place: %s%s", path, tmp,
                       strerror(e), errno_hint(e));
}

/* Best effort: make a rename durable (some file systems refuse fsync on folders). */
static void sync_parent(const char *path) {
    char *copy = strdup(path);
    int fd = copy ? open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(copy);
}

/* "<path>.tmp.<pid>", malloc'ed; NULL when out of memory. */
static char *temp_name(const char *path) {
    char *tmp = NULL;
    return asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0 ? NULL : tmp;
}

/* ---- atomic files ---- */

/* parts written straight into path, something other than a regular file (a device, a pipe):
 * a temp file renamed over it would replace it with a regular file. A folder is refused. */
static flexdiag_status write_in_place(const char *path, const struct stat *st,
                                      const cli_part *parts, int n) {
    if (S_ISDIR(st->st_mode))
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "%s is a folder: give a file path", path);
    int fd = open_retry(path, O_WRONLY);
    if (fd < 0) return sys_fail(path, "cannot open for writing", errno);
    flexdiag_status s = FLEXDIAG_OK;
    size_t done;
    for (int i = 0; i < n && s == FLEXDIAG_OK; i++)
        s = write_all(fd, parts[i].data, parts[i].len, -1, path, &done);
    if (s == FLEXDIAG_OK) s = sync_fd(fd, path);
    flexdiag_status c = close_fd(fd, path);
    return s == FLEXDIAG_OK ? c : s;
}

flexdiag_status cli_write_atomic(const char *path, const cli_part *parts, int n) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return write_in_place(path, &st, parts, n);
    char *tmp = temp_name(path);
    if (!tmp) return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    flexdiag_status s = FLEXDIAG_OK;
    int fd = create_temp(path, tmp, &s);
    size_t done;
    for (int i = 0; fd >= 0 && i < n && s == FLEXDIAG_OK; i++)
        s = write_all(fd, parts[i].data, parts[i].len, -1, path, &done);
    if (fd >= 0 && s == FLEXDIAG_OK) s = sync_fd(fd, path);
    if (fd >= 0) {
        flexdiag_status c = close_fd(fd, path);
        if (s == FLEXDIAG_OK) s = c;
    }
    if (fd >= 0 && s == FLEXDIAG_OK && rename(tmp, path) != 0) s = rename_fail(path, tmp, errno);
    if (fd >= 0 && s != FLEXDIAG_OK) unlink(tmp);
    if (s == FLEXDIAG_OK) sync_parent(path);
    free(tmp);
    return s;
}

/* ---- JSON lines ---- */

flexdiag_status cli_jsonl_open(cli_jsonl *j, const char *path, int truncate) {
    j->fd = -1;
    j->path = NULL;
    char *copy = strdup(path);
    if (!copy) return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    j->fd = open_retry(path, O_WRONLY | O_APPEND | O_CREAT | (truncate ? O_TRUNC : 0));
    if (j->fd >= 0) {
        j->path = copy;
        return FLEXDIAG_OK;
    }
    int e = errno;
    free(copy);
    return sys_fail(path, "cannot open for appending", e);
}

/* After a failed append of which written bytes reached the file: cut it back to start. */
static void jsonl_cut(const cli_jsonl *j, int64_t start, size_t written) {
    if (written == 0) return;
    if (start >= 0 && ftruncate(j->fd, (off_t)start) == 0) return;
    io_note("; it may now end in a partial line: cutting it back failed: %s",
            start < 0 ? "the file is not seekable" : strerror(errno));
}

flexdiag_status cli_jsonl_append(cli_jsonl *j, const void *text, size_t len) {
    if (!j->path || len == 0 || ((const char *)text)[len - 1] != '\n')
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "%s: append needs an open file and whole "
                           "lines", j->path ? j->path : "(closed file)");
    int64_t start = (int64_t)lseek(j->fd, 0, SEEK_END); /* where O_APPEND puts the text */
    size_t done = 0;
    flexdiag_status s = write_all(j->fd, text, len, -1, j->path, &done);
    if (s == FLEXDIAG_OK) s = sync_fd(j->fd, j->path);
    if (s != FLEXDIAG_OK) jsonl_cut(j, start, done);
    return s;
}

flexdiag_status cli_jsonl_close(cli_jsonl *j) {
    if (!j->path) return FLEXDIAG_OK;
    flexdiag_status s = close_fd(j->fd, j->path);
    free(j->path);
    j->path = NULL;
    j->fd = -1;
    return s;
}

/* ---- record streams ---- */

/* Put the tail right after the records (and, when dirty, cut what follows it). On failure the
 * file is cut back to the records where possible and s stays dirty. */
static flexdiag_status put_tail(cli_stream *s) {
    size_t done;
    flexdiag_status st = write_all(s->fd, s->tail, s->tail_len, s->end, s->tmp, &done);
    if (st == FLEXDIAG_OK && s->dirty &&
        ftruncate(s->fd, (off_t)(s->end + (int64_t)s->tail_len)) != 0)
        st = sys_fail(s->tmp, "truncate failed", errno);
    s->dirty = st != FLEXDIAG_OK;
    if (s->dirty) (void)ftruncate(s->fd, (off_t)s->end);
    return st;
}

/* put_tail after a failure, keeping that failure's message (finish reports a second one). */
static void put_tail_quietly(cli_stream *s) {
    char saved[sizeof io_err];
    memcpy(saved, io_err, sizeof saved);
    s->dirty = 1;
    (void)put_tail(s);
    memcpy(io_err, saved, sizeof saved);
}

void cli_stream_abort(cli_stream *s) {
    if (!s->path) return;
    if (s->fd >= 0) {
        close(s->fd);
        unlink(s->tmp);
    }
    free(s->path);
    free(s->tmp);
    free(s->tail);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

flexdiag_status cli_stream_open(cli_stream *s, const char *path, const char *head,
                                const char *tail) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->path = strdup(path);
    s->tmp = temp_name(path);
    s->tail = strdup(tail);
    if (!s->path || !s->tmp || !s->tail) {
        cli_stream_abort(s);
        return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    }
    s->tail_len = strlen(tail);
    s->end = s->prev = (int64_t)strlen(head);
    flexdiag_status st = FLEXDIAG_OK;
    s->fd = create_temp(path, s->tmp, &st);
    size_t done;
    if (s->fd >= 0) st = write_all(s->fd, head, strlen(head), 0, s->tmp, &done);
    if (st == FLEXDIAG_OK) st = put_tail(s);
    if (st != FLEXDIAG_OK) cli_stream_abort(s);
    return st;
}

flexdiag_status cli_stream_append(cli_stream *s, const void *rec, size_t len) {
    if (!s->path)
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "record stream: append after it closed");
    int64_t at = s->end;
    size_t done;
    flexdiag_status st = write_all(s->fd, rec, len, at, s->tmp, &done);
    if (st == FLEXDIAG_OK) {
        s->end = at + (int64_t)len;
        st = put_tail(s);
    }
    if (st == FLEXDIAG_OK) {
        s->prev = at;
        return FLEXDIAG_OK;
    }
    s->end = at; /* back to the records before this one */
    put_tail_quietly(s);
    return st;
}

void cli_stream_undo(cli_stream *s) {
    if (!s->path || s->prev == s->end) return;
    s->end = s->prev;
    put_tail_quietly(s);
}

flexdiag_status cli_stream_finish(cli_stream *s) {
    if (!s->path) return FLEXDIAG_OK;
    flexdiag_status st = s->dirty ? put_tail(s) : FLEXDIAG_OK;
    if (st == FLEXDIAG_OK) st = sync_fd(s->fd, s->tmp);
    flexdiag_status c = close_fd(s->fd, s->tmp);
    s->fd = -1;
    if (st == FLEXDIAG_OK) st = c;
    if (st == FLEXDIAG_OK && rename(s->tmp, s->path) != 0) st = rename_fail(s->path, s->tmp, errno);
    if (st == FLEXDIAG_OK) sync_parent(s->path);
    else if (s->dirty)
        io_note("; %s was not written: its records so far are kept in %s, without the closing "
                "bytes", s->path, s->tmp);
    else
        io_note("; %s was not written: it is kept, complete, in %s", s->path, s->tmp);
    free(s->path);
    free(s->tmp);
    free(s->tail);
    memset(s, 0, sizeof *s);
    s->fd = -1;
    return st;
}
