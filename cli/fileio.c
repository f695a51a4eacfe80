/*
 * fileio.c - the CLI's atomic file writer and its file-error message (see fileio.h).
 *
 * A file is written to "<path>.tmp.<pid>" in the target's folder (same file system, so the
 * rename is atomic), fsync'ed, renamed over the target and the folder fsync'ed so the new name
 * survives a crash: an interrupted run never leaves a partial file under the target name.
 * Messages live in a thread-local buffer, replaced by each failure.
 */
#include "cli/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Thread_local char io_err[1024];

flexdiag_status cli_io_fail(flexdiag_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(io_err, sizeof io_err, fmt, ap);
    va_end(ap);
    return st;
}

const char *cli_io_error(void) { return io_err; }

/* FLEXDIAG_ERR_NO_SPACE, FLEXDIAG_ERR_NOT_FOUND or FLEXDIAG_ERR_IO for errno value e. */
static flexdiag_status errno_status(int e) {
    return e == ENOSPC || e == EDQUOT ? FLEXDIAG_ERR_NO_SPACE
           : e == ENOENT              ? FLEXDIAG_ERR_NOT_FOUND
                                      : FLEXDIAG_ERR_IO;
}

static flexdiag_status write_all(int fd, const void *p, size_t n, const char *path) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return cli_io_fail(errno_status(e), "%s: write failed: %s", path, strerror(e));
        }
        p = (const char *)p + w;
        n -= (size_t)w;
    }
    return FLEXDIAG_OK;
}

/* Best effort: make the rename durable (some file systems refuse fsync on folders). */
static void sync_parent(const char *path) {
    char *copy = strdup(path);
    int fd = copy ? open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(copy);
}

flexdiag_status cli_write_atomic(const char *path, const cli_part *parts, int n) {
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0)
        return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        flexdiag_status s = cli_io_fail(errno_status(e), "%s: cannot create %s: %s%s", path,
                                        tmp, strerror(e),
                                        e == ENOENT ? " (does the folder exist?)" : "");
        free(tmp);
        return s;
    }
    flexdiag_status s = FLEXDIAG_OK;
    for (int i = 0; i < n && s == FLEXDIAG_OK; i++)
        s = write_all(fd, parts[i].data, parts[i].len, path);
    if (s == FLEXDIAG_OK && fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        s = cli_io_fail(errno_status(errno), "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && s == FLEXDIAG_OK)
        s = cli_io_fail(errno_status(errno), "%s: close failed: %s", path, strerror(errno));
    if (s == FLEXDIAG_OK && rename(tmp, path) != 0)
        s = cli_io_fail(FLEXDIAG_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp,
                        strerror(errno));
    if (s != FLEXDIAG_OK)
        unlink(tmp);
    else
        sync_parent(path);
    free(tmp);
    return s;
}
