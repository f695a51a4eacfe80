/*
 * image_out.c - pixels -> uint8 -> PNG files (docs/architecture.md §4.1 step 8, docs/formats.md
 * §1).
 *
 * Conversion follows the Janus reference exactly: fp32 (x + 1) / 2 · 255, clipped to [0, 255],
 * then truncated toward zero by the uint8 cast; NaN (undefined in the reference) becomes 0.
 * A PNG is encoded into memory and handed to cli_write_atomic (temp file, fsync, rename, fsync
 * of the folder), the CLI's one atomic writer, so no partial file is ever seen under its name.
 * libpng reports errors through longjmp: every object it may unwind past is created before
 * setjmp and never modified afterwards, and the one cleanup path frees them.
 * Rejected: writing in place (a SIGINT mid-write leaves a truncated PNG that looks valid to
 * globbing scripts) and stb_image_write (no error reporting).
 */
#include "cli/image_out.h"

#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/fileio.h"

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
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG,
                           "image grid: %d images of %dx%d in %d columns: all must be >= 1", n, w,
                           h, cols);
    if (cols > n) cols = n;
    int rows = (n + cols - 1) / cols;
    uint64_t bytes;
    if ((int64_t)cols * w > PNG_MAX_SIDE || (int64_t)rows * h > PNG_MAX_SIDE ||
        __builtin_mul_overflow((uint64_t)cols * (uint64_t)w * 3u, (uint64_t)rows * (uint64_t)h,
                               &bytes))
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG,
                           "image grid: %d x %d cells of %dx%d exceed the PNG limit of %d pixels "
                           "per side; use fewer columns or rows",
                           rows, cols, w, h, PNG_MAX_SIDE);
    uint8_t *g = calloc(1, (size_t)bytes);
    if (!g)
        return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "image grid: no memory for %llu bytes",
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

typedef struct png_mem {
    unsigned char *buf; /* encoded bytes so far (malloc'ed) */
    size_t len, cap;    /* used and allocated bytes */
    char msg[256];      /* libpng's message after a failure */
} png_mem;

static void on_png_error(png_structp png, png_const_charp msg) {
    png_mem *m = png_get_error_ptr(png);
    snprintf(m->msg, sizeof m->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) {
    (void)png;
    fprintf(stderr, "flexdiag: warning: libpng: %s\n", msg);
}

static void on_png_write(png_structp png, png_bytep data, size_t n) {
    png_mem *m = png_get_io_ptr(png);
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 1 << 16;
        while (cap < m->len + n) cap *= 2;
        unsigned char *b = realloc(m->buf, cap);
        if (!b) png_error(png, "out of memory for the encoded image");
        m->buf = b;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, data, n);
    m->len += n;
}

static void on_png_flush(png_structp png) { (void)png; }

/* Encode the image into m; returns 0, or -1 with m->msg set. */
static int png_encode(png_mem *m, const uint8_t *rgb, int w, int h) {
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, m, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        snprintf(m->msg, sizeof m->msg, "out of memory");
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return -1;
    }
    png_set_write_fn(png, m, on_png_write, on_png_flush);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, rgb + (size_t)y * 3 * (size_t)w);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return 0;
}

flexdiag_status flexdiag__png_write_rgb(const char *path, const uint8_t *rgb, int w, int h) {
    if (!path || !*path || !rgb || w < 1 || h < 1 || w > PNG_MAX_SIDE || h > PNG_MAX_SIDE)
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG,
                           "PNG %s: %dx%d pixels: need a path, pixel data and 1..%d pixels per "
                           "side",
                           path ? path : "(null)", w, h, PNG_MAX_SIDE);
    png_mem m = {0};
    flexdiag_status st;
    if (png_encode(&m, rgb, w, h) != 0) {
        st = cli_io_fail(FLEXDIAG_ERR_IO, "PNG %s: libpng: %s", path, m.msg);
    } else {
        cli_part part = {m.buf, m.len};
        st = cli_write_atomic(path, &part, 1);
    }
    free(m.buf);
    return st;
}

flexdiag_status flexdiag__png_encode(const uint8_t *rgb, int w, int h, uint8_t **out,
                                     size_t *len) {
    *out = NULL;
    *len = 0;
    if (!rgb || w < 1 || h < 1 || w > PNG_MAX_SIDE || h > PNG_MAX_SIDE)
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "PNG of %dx%d pixels: need pixel data and "
                           "1..%d pixels per side", w, h, PNG_MAX_SIDE);
    png_mem m = {0};
    if (png_encode(&m, rgb, w, h) != 0) {
        free(m.buf);
        return cli_io_fail(FLEXDIAG_ERR_IO, "PNG encoding: libpng: %s", m.msg);
    }
    *out = m.buf;
    *len = m.len;
    return FLEXDIAG_OK;
}

int flexdiag__png_whole(const char *path, int w, int h) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) return 0;
    im.format = PNG_FORMAT_RGB;
    size_t bytes = PNG_IMAGE_SIZE(im);
    uint8_t *buf = (w <= 0 || ((int)im.width == w && (int)im.height == h)) ? malloc(bytes) : NULL;
    int ok = buf && png_image_finish_read(&im, NULL, buf, 0, NULL);
    if (!buf) png_image_free(&im);
    free(buf);
    return ok;
}
