/*
 * fuzz_util.c - helpers of the file-parser fuzz targets (fuzz_util.h). The parsers read files,
 * so each target writes its input into a private temp folder (tests/util.c's tu_tempdir, under
 * $TMPDIR: point it at a tmpfs such as /dev/shm for speed); the folder is removed by an atexit
 * handler when the fuzzer or the replay ends normally. The stderr capture swaps glibc's stderr
 * stream for an open_memstream buffer: libFuzzer keeps the stream it saw at start-up and the
 * sanitizers write to descriptor 2, so their reports are not captured.
 */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>

#include "util.h"

#define MAX_DIRS 4 /* temp folders per process; each target makes one */

static char *dirs[MAX_DIRS];
static int n_dirs;

_Noreturn void fuzz_fail(const char *file, int line, const char *expr, const char *detail) {
    fprintf(stderr, "%s:%d: fuzz check failed: %s (%s)\n", file, line, expr, detail);
    abort();
}

static void remove_dirs(void) {
    for (int i = 0; i < n_dirs; i++) tu_rmtree(dirs[i]);
}

char *fuzz_tempdir(const char *tag) {
    char *d = tu_tempdir(tag);
    FUZZ_CHECK(d != NULL, "cannot create a temp folder under $TMPDIR");
    FUZZ_CHECK(n_dirs < MAX_DIRS, "too many temp folders");
    if (n_dirs == 0) atexit(remove_dirs);
    dirs[n_dirs++] = d;
    return d;
}

char *fuzz_path(const char *dir, const char *name) {
    char *p = NULL;
    FUZZ_CHECK(asprintf(&p, "%s/%s", dir, name) > 0, "out of memory");
    return p;
}

void fuzz_write(const char *path, const void *data, size_t n) {
    FUZZ_CHECK(tu_write_file(path, data, n) == 0, path);
}

static FILE *saved_stderr; /* the real stream while a capture runs */
static char *captured;     /* open_memstream buffer */
static size_t captured_len;

void fuzz_stderr_begin(void) {
    free(captured);
    captured = NULL;
    FILE *m = open_memstream(&captured, &captured_len);
    FUZZ_CHECK(m != NULL, "open_memstream failed");
    saved_stderr = stderr;
    stderr = m;
}

const char *fuzz_stderr_end(void) {
    fclose(stderr);
    stderr = saved_stderr;
    return captured ? captured : "";
}
