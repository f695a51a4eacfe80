/*
 * fault_io.c - failing file calls on demand, for the test-only builds flexdiag-fault and
 * flexdiag-bench-fault (tests/fault/meson.build). Those link the product's own objects and
 * libraries with -Wl,--wrap=<call> for every call cli/fileio.c makes, so each such call from the
 * product lands in __wrap_<call> here, which calls the real one (__real_<call>) unless
 * $FLEXDIAG_FAULT asks for a failure. The product has no test hooks; the real binaries are
 * untouched. --wrap redirects only calls from the linked objects: libc's own (fopen inside
 * jansson, stdio) and the shared library's are never seen here.
 *
 * $FLEXDIAG_FAULT holds rules separated by ';', each "call:what[:option]...":
 *   call          open, write (write, pwrite), fsync (fsync, fdatasync), close, rename,
 *                 truncate (ftruncate), unlink
 *   what          an errno name (ENOSPC, EIO, EDQUOT, EROFS, EXDEV, EACCES, EPERM, ENOENT), or
 *                 "short" (write only: at most half the bytes, at least one; the call succeeds)
 *   nth=K         the K-th matching call is the first to fail (default 1)
 *   once          only that call fails; without it every matching call from then on fails, as
 *                 a broken disk stays broken
 *   after_bytes=N write only: the first N bytes to matching files pass, the write that crosses
 *                 N is cut short at N and every later one fails (a file system filling up)
 *   path=S        only files whose path contains S (rename: either name; "tokens.json" also
 *                 matches its temp file "tokens.json.tmp.<pid>")
 * Calls on descriptors that were not opened through the wrapped open (stdout, stderr, files
 * libc opened) never fail; the shim remembers each wrapped open's path by descriptor for the
 * path filter. $FLEXDIAG_FAULT_LOG=FILE gets one line per injected fault, so a test can tell
 * that its fault really fired. Rejected: LD_PRELOAD (the tool links libflexdiag.so, whose calls
 * would be caught too; and sanitizer runtimes want to come first).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* The real calls (--wrap resolves __real_x to x) and the wrappers the product calls. */
int __real_open(const char *path, int flags, ...);
int __real_open64(const char *path, int flags, ...);
ssize_t __real_write(int fd, const void *buf, size_t n);
ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __real_pwrite64(int fd, const void *buf, size_t n, off_t off);
int __real_fsync(int fd);
int __real_fdatasync(int fd);
int __real_close(int fd);
int __real_rename(const char *from, const char *to);
int __real_ftruncate(int fd, off_t len);
int __real_ftruncate64(int fd, off_t len);
int __real_unlink(const char *path);
int __wrap_open(const char *path, int flags, ...);
int __wrap_open64(const char *path, int flags, ...);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pwrite64(int fd, const void *buf, size_t n, off_t off);
int __wrap_fsync(int fd);
int __wrap_fdatasync(int fd);
int __wrap_close(int fd);
int __wrap_rename(const char *from, const char *to);
int __wrap_ftruncate(int fd, off_t len);
int __wrap_ftruncate64(int fd, off_t len);
int __wrap_unlink(const char *path);

enum { C_OPEN, C_WRITE, C_FSYNC, C_CLOSE, C_RENAME, C_TRUNCATE, C_UNLINK, C_COUNT };
static const char *const call_names[C_COUNT] = {"open",  "write",    "fsync", "close",
                                                "rename", "truncate", "unlink"};

#define MAX_RULES 8
#define MAX_FD 4096 /* descriptors tracked for path filters; higher ones never fail */

typedef struct rule {
    int call;         /* C_* */
    int err;          /* errno to fail with; 0 = short write */
    long long nth;    /* first failing matching call, 1-based */
    long long after;  /* bytes that pass (write); -1 = not a byte rule */
    int once;         /* fail one call only */
    char path[256];   /* substring filter; "" = any tracked file */
    long long seen;   /* matching calls so far */
    long long bytes;  /* bytes let through so far (after_bytes) */
    long long fired;  /* faults injected */
} rule;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static rule g_rules[MAX_RULES];
static int g_n;
static char *g_fd_path[MAX_FD]; /* path of each tracked descriptor, malloc'ed */

/* ---- the rules ---- */

static int errno_named(const char *s) {
    static const struct {
        const char *name;
        int e;
    } names[] = {{"ENOSPC", ENOSPC}, {"EIO", EIO},       {"EDQUOT", EDQUOT}, {"EROFS", EROFS},
                 {"EXDEV", EXDEV},   {"EACCES", EACCES}, {"EPERM", EPERM},   {"ENOENT", ENOENT},
                 {"short", 0}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) return names[i].e;
    return -1;
}

/* A bad spec is a broken test: say so and stop (exit 99 is no product exit code). */
static void bad_spec(const char *spec, const char *why) {
    fprintf(stderr, "fault_io: FLEXDIAG_FAULT '%s': %s\n", spec, why);
    _exit(99);
}

/* One option of rule r ("nth=3", "once", ...). */
static void parse_option(rule *r, char *opt, const char *spec) {
    if (!strcmp(opt, "once")) r->once = 1;
    else if (!strncmp(opt, "nth=", 4)) r->nth = atoll(opt + 4);
    else if (!strncmp(opt, "after_bytes=", 12)) r->after = atoll(opt + 12);
    else if (!strncmp(opt, "path=", 5)) snprintf(r->path, sizeof r->path, "%s", opt + 5);
    else bad_spec(spec, "unknown option (nth=K, once, after_bytes=N, path=S)");
    if (r->nth < 1 || (r->after >= 0 && r->call != C_WRITE))
        bad_spec(spec, "nth must be >= 1; after_bytes is for write");
}

/* "call:what[:option]..." into r. */
static void parse_rule(rule *r, char *text, const char *spec) {
    memset(r, 0, sizeof *r);
    r->nth = 1;
    r->after = -1;
    r->call = -1;
    char *save = NULL, *tok = strtok_r(text, ":", &save);
    for (int c = 0; tok && c < C_COUNT; c++)
        if (!strcmp(tok, call_names[c])) r->call = c;
    tok = r->call >= 0 ? strtok_r(NULL, ":", &save) : NULL;
    r->err = tok ? errno_named(tok) : -1;
    if (r->err < 0 || (r->err == 0 && r->call != C_WRITE))
        bad_spec(spec, "expected call:what (calls: open write fsync close rename truncate "
                       "unlink; what: ENOSPC EIO EDQUOT EROFS EXDEV EACCES EPERM ENOENT short)");
    while ((tok = strtok_r(NULL, ":", &save))) parse_option(r, tok, spec);
    if (r->after >= 0 && r->err == 0) bad_spec(spec, "after_bytes needs an errno, not short");
}

static void load_rules(void) {
    const char *spec = getenv("FLEXDIAG_FAULT");
    if (!spec || !*spec) return;
    char *copy = strdup(spec), *save = NULL;
    if (!copy) bad_spec(spec, "out of memory");
    for (char *t = strtok_r(copy, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
        if (g_n == MAX_RULES) bad_spec(spec, "more than 8 rules");
        parse_rule(&g_rules[g_n++], t, spec);
    }
    free(copy);
}

/* One line per injected fault to $FLEXDIAG_FAULT_LOG (real calls: never injected into). */
static void log_fault(const rule *r, const char *path, const char *what) {
    const char *log = getenv("FLEXDIAG_FAULT_LOG");
    if (!log) return;
    char line[600];
    int n = snprintf(line, sizeof line, "%s %s %s\n", call_names[r->call], what, path);
    int fd = __real_open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (n > 0) (void)!__real_write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    __real_close(fd);
}

/* Whether rule r covers this call on path (and, for rename, path2). */
static int rule_matches(const rule *r, int call, const char *path, const char *path2) {
    if (r->call != call || !path) return 0;
    return !r->path[0] || strstr(path, r->path) || (path2 && strstr(path2, r->path));
}

/* The errno this call fails with (0: let it through; for writes *n may shrink). The call is on
 * path (and path2), or when path is NULL on descriptor fd. */
static int decide(int call, int fd, const char *path, const char *path2, size_t *n) {
    pthread_once(&g_once, load_rules);
    int fail = 0;
    pthread_mutex_lock(&g_mu);
    if (!path && fd >= 0 && fd < MAX_FD) path = g_fd_path[fd];
    for (int i = 0; i < g_n && !fail; i++) {
        rule *r = &g_rules[i];
        if (!rule_matches(r, call, path, path2)) continue;
        r->seen++;
        if (r->after >= 0) { /* a file system filling up */
            if (r->bytes >= r->after) fail = r->err;
            else if (r->bytes + (long long)*n > r->after) *n = (size_t)(r->after - r->bytes);
            if (!fail) r->bytes += (long long)*n;
            if (fail || r->bytes == r->after) r->fired++, log_fault(r, path, fail ? "fail" : "cut");
            continue;
        }
        if (r->seen < r->nth || (r->once && r->fired)) continue;
        r->fired++;
        if (r->err) fail = r->err;
        else if (*n > 1) *n /= 2;
        log_fault(r, path, r->err ? "fail" : "short");
    }
    pthread_mutex_unlock(&g_mu);
    return fail;
}

/* ---- descriptors ---- */

static void fd_track(int fd, const char *path) {
    if (fd < 0 || fd >= MAX_FD) return;
    pthread_mutex_lock(&g_mu);
    free(g_fd_path[fd]);
    g_fd_path[fd] = strdup(path);
    pthread_mutex_unlock(&g_mu);
}

static void fd_forget(int fd) {
    if (fd < 0 || fd >= MAX_FD) return;
    pthread_mutex_lock(&g_mu);
    free(g_fd_path[fd]);
    g_fd_path[fd] = NULL;
    pthread_mutex_unlock(&g_mu);
}

/* ---- the wrappers ---- */

/* errno e, return -1. */
static int failed(int e) {
    errno = e;
    return -1;
}

/* open's third argument is there only with O_CREAT or O_TMPFILE (which includes O_DIRECTORY). */
static int takes_mode(int flags) { return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE; }

static int open_common(const char *path, int flags, mode_t mode, int large) {
    size_t n = 0;
    int e = decide(C_OPEN, -1, path, NULL, &n);
    if (e) return failed(e);
    int fd = large ? __real_open64(path, flags, mode) : __real_open(path, flags, mode);
    if (fd >= 0) fd_track(fd, path);
    return fd;
}

int __wrap_open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = takes_mode(flags) ? (mode_t)va_arg(ap, int) : 0;
    va_end(ap);
    return open_common(path, flags, mode, 0);
}

int __wrap_open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = takes_mode(flags) ? (mode_t)va_arg(ap, int) : 0;
    va_end(ap);
    return open_common(path, flags, mode, 1);
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    int e = decide(C_WRITE, fd, NULL, NULL, &n);
    return e ? failed(e) : __real_write(fd, buf, n);
}

ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off) {
    int e = decide(C_WRITE, fd, NULL, NULL, &n);
    return e ? failed(e) : __real_pwrite(fd, buf, n, off);
}

ssize_t __wrap_pwrite64(int fd, const void *buf, size_t n, off_t off) {
    int e = decide(C_WRITE, fd, NULL, NULL, &n);
    return e ? failed(e) : __real_pwrite64(fd, buf, n, off);
}

int __wrap_fsync(int fd) {
    size_t n = 0;
    int e = decide(C_FSYNC, fd, NULL, NULL, &n);
    return e ? failed(e) : __real_fsync(fd);
}

int __wrap_fdatasync(int fd) {
    size_t n = 0;
    int e = decide(C_FSYNC, fd, NULL, NULL, &n);
    return e ? failed(e) : __real_fdatasync(fd);
}

/* A failing close still releases the descriptor, as Linux's does. */
int __wrap_close(int fd) {
    size_t n = 0;
    int e = decide(C_CLOSE, fd, NULL, NULL, &n);
    fd_forget(fd);
    int rc = __real_close(fd);
    return e ? failed(e) : rc;
}

int __wrap_rename(const char *from, const char *to) {
    size_t n = 0;
    int e = decide(C_RENAME, -1, from, to, &n);
    return e ? failed(e) : __real_rename(from, to);
}

int __wrap_ftruncate(int fd, off_t len) {
    size_t n = 0;
    int e = decide(C_TRUNCATE, fd, NULL, NULL, &n);
    return e ? failed(e) : __real_ftruncate(fd, len);
}

int __wrap_ftruncate64(int fd, off_t len) {
    size_t n = 0;
    int e = decide(C_TRUNCATE, fd, NULL, NULL, &n);
    return e ? failed(e) : __real_ftruncate64(fd, len);
}

int __wrap_unlink(const char *path) {
    size_t n = 0;
    int e = decide(C_UNLINK, -1, path, NULL, &n);
    return e ? failed(e) : __real_unlink(path);
}
