/*
 * image_out.c - pixels -> uint8 -> PNG files (models.md §3.5 step 8, reliability.md §2).
 *
 * Conversion follows the Janus reference exactly: fp32 (x + 1) / 2 · 255, clipped to [0, 255],
 * then truncated toward zero by the uint8 cast; NaN (undefined in the reference) becomes 0.
 * The writer never exposes a partial file: libpng writes "<path>.tmp.<pid>" in the destination
 * folder (same filesystem, so rename is atomic), the data is fsync'ed, the temp file renamed
 * over the target and the folder fsync'ed so the new name survives a crash. libpng reports
 * errors through longjmp: every object it may unwind past is created before setjmp and never
 * modified afterwards, and the one cleanup path frees them and removes the temp file.
 * Rejected: writing in place (a SIGINT mid-write leaves a truncated PNG that looks valid to
 * globbing scripts) and stb_image_write (no error reporting).
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/image_out.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"

#define PNG_MAX_SIDE 1000000 /* libpng's default user limit on width and height */

/* ---- conversion ---- */

void flexdiag__pixels_to_u8(const float *x, int64_t n, uint8_t *out) {
    for (int64_t i = 0; i < n; i++) {
        float v = (x[i] + 1.0f) / 2.0f * 255.0f; /* fp32 steps, as numpy float32 does them */
        if (!(v > 0.0f)) v = 0.0f;               /* also NaN */
        if (v > 255.0f) v = 255.0f;
        out[i] = (uint8_t)v; /* truncation toward zero */
    }
}

flexdiag_status flexdiag__png_tile(const uint8_t *const *imgs, int n, int w, int h, int cols,
                                   uint8_t **out, int *out_w, int *out_h) {
    *out = NULL;
    if (n < 1 || w < 1 || h < 1 || cols < 1)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "image grid: %d images of %dx%d in %d columns: all must be >= 1", n, w,
                             h, cols);
    if (cols > n) cols = n;
    int rows = (n + cols - 1) / cols;
    uint64_t bytes;
    if ((int64_t)cols * w > PNG_MAX_SIDE || (int64_t)rows * h > PNG_MAX_SIDE ||
        !flexdiag__mul_ok((uint64_t)cols * (uint64_t)w * 3u, (uint64_t)rows * (uint64_t)h, &bytes))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "image grid: %d x %d cells of %dx%d exceed the PNG limit of %d pixels "
                             "per side; use fewer columns or rows",
                             rows, cols, w, h, PNG_MAX_SIDE);
    uint8_t *g = calloc(1, (size_t)bytes);
    if (!g)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "image grid: no memory for %llu bytes",
                             (unsigned long long)bytes);
    size_t row = (size_t)w * 3, grid_row = row * (size_t)cols;
    for (int i = 0; i < n; i++) {
        if (!imgs[i]) continue; /* an image that failed stays black */
        uint8_t *dst = g + (size_t)(i / cols) * h * grid_row + (size_t)(i % cols) * row;
        for (int y = 0; y < h; y++)
            memcpy(dst + (size_t)y * grid_row, imgs[i] + (size_t)y * row, row);
    }
    *out = g;
    *out_w = cols * w;
    *out_h = rows * h;
    return FLEXDIAG_OK;
}

/* ---- libpng encoding ---- */

typedef struct png_errctx {
    char msg[256]; /* libpng's message */
    int err;       /* errno at the time of the failure (write errors), else 0 */
} png_errctx;

static void on_png_error(png_structp png, png_const_charp msg) {
    png_errctx *c = png_get_error_ptr(png);
    c->err = errno;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) {
    (void)png;
    FLEXDIAG_WARN("libpng: %s", msg);
}

/* Encode the image to f; returns 0, or -1 with ctx filled. */
static int png_encode(FILE *f, const uint8_t *rgb, int w, int h, png_errctx *ctx) {
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, ctx, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        snprintf(ctx->msg, sizeof ctx->msg, "libpng: out of memory");
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, rgb + (size_t)y * 3 * (size_t)w);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return 0;
}

/* ---- atomic file writing ---- */

static flexdiag_status io_fail(const char *path, const char *what, int err) {
    flexdiag_status s = (err == ENOSPC || err == EDQUOT) ? FLEXDIAG_ERR_NO_SPACE : FLEXDIAG_ERR_IO;
    return flexdiag__err(s, "%s: %s: %s", path, what, err ? strerror(err) : "unknown error");
}

/* fsync the folder holding path so a completed rename survives a crash (best effort). */
static void sync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + 1) : strdup(".");
    int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Encode into the open temp file, flush and fsync it, close it. */
static flexdiag_status write_tmp(FILE *f, const char *tmp, const uint8_t *rgb, int w, int h) {
    png_errctx ctx = {{0}, 0};
    int rc = png_encode(f, rgb, w, h, &ctx);
    int err = rc ? ctx.err : 0;
    if (!rc && (fflush(f) != 0 || fsync(fileno(f)) != 0)) rc = -1, err = errno;
    if (fclose(f) != 0 && !rc) rc = -1, err = errno;
    if (!rc) return FLEXDIAG_OK;
    if (ctx.msg[0] && !err) return flexdiag__err(FLEXDIAG_ERR_IO, "%s: libpng: %s", tmp, ctx.msg);
    return io_fail(tmp, ctx.msg[0] ? ctx.msg : "write", err);
}

flexdiag_status flexdiag__png_write_rgb(const char *path, const uint8_t *rgb, int w, int h) {
    if (!path || !*path || !rgb || w < 1 || h < 1 || w > PNG_MAX_SIDE || h > PNG_MAX_SIDE)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "PNG %s: %dx%d pixels: need a path, pixel data and 1..%d pixels per "
                             "side",
                             path ? path : "(null)", w, h, PNG_MAX_SIDE);
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "PNG %s: no memory", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    flexdiag_status st;
    if (!f) {
        st = io_fail(path, "cannot create the temporary file", errno);
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
    } else if ((st = write_tmp(f, tmp, rgb, w, h)) != FLEXDIAG_OK) {
        unlink(tmp);
    } else if (rename(tmp, path) != 0) {
        st = io_fail(path, "cannot rename the temporary file over it", errno);
        unlink(tmp);
    } else {
        sync_parent(path);
    }
    free(tmp);
    return st;
}
