/*
 * test_image_out.c - pixel conversion and the PNG writer (cli/image_out.c): values of the
 * float -> uint8 rule, byte-exact PNG contents read back through libpng's simplified reading API
 * (a path independent of the writer), atomic replacement with no temp files left behind, clean
 * errors (status and cli_io_error message), and tiling.
 */
#include <dirent.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cli/fileio.h"
#include "cli/image_out.h"
#include "util.h"

static void test_pixels_to_u8(void **state) {
    (void)state;
    const float x[] = {-1.0f, 1.0f,   0.0f,     NAN,       2.0f,       -3.0f,
                       0.5f,  -0.99f, INFINITY, -INFINITY, 0.99607843f};
    /* (x+1)/2*255 in fp32: 0, 255, 127.5, NaN, 382.5, -255, 191.25, 1.275, inf, -inf, 254.5 */
    const uint8_t want[] = {0, 255, 127, 0, 255, 0, 191, 1, 255, 0, 254};
    uint8_t out[sizeof want];
    flexdiag__pixels_to_u8(x, (int64_t)(sizeof x / sizeof *x), out);
    assert_memory_equal(out, want, sizeof want);
}

/* Read path back with libpng's simplified API as 8-bit RGB; returns malloc'ed pixels. */
static uint8_t *read_png(const char *path, int *w, int *h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return NULL;
    img.format = PNG_FORMAT_RGB;
    uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!buf || !png_image_finish_read(&img, NULL, buf, 0, NULL)) {
        png_image_free(&img);
        free(buf);
        return NULL;
    }
    *w = (int)img.width;
    *h = (int)img.height;
    return buf;
}

/* Number of directory entries whose name contains ".tmp.". */
static int count_tmp(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static void test_png_round_trip(void **state) {
    (void)state;
    char *dir = tu_tempdir("png");
    char path[512];
    snprintf(path, sizeof path, "%s/img.png", dir);
    tu_rng r;
    tu_rng_seed(&r, 7);
    const int w = 7, h = 5; /* odd sizes: no row padding assumptions */
    uint8_t px[7 * 5 * 3];
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)tu_rng_int(&r, 0, 255);
    assert_int_equal(flexdiag__png_write_rgb(path, px, w, h), FLEXDIAG_OK);
    int rw = 0, rh = 0;
    uint8_t *back = read_png(path, &rw, &rh);
    assert_non_null(back);
    assert_int_equal(rw, w);
    assert_int_equal(rh, h);
    assert_memory_equal(back, px, sizeof px);
    free(back);
    /* overwrite: the new content replaces the old one whole */
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(255 - px[i]);
    assert_int_equal(flexdiag__png_write_rgb(path, px, w, h), FLEXDIAG_OK);
    back = read_png(path, &rw, &rh);
    assert_non_null(back);
    assert_memory_equal(back, px, sizeof px);
    free(back);
    assert_int_equal(count_tmp(dir), 0);
    tu_rmtree(dir);
    free(dir);
}

static void test_png_errors(void **state) {
    (void)state;
    uint8_t px[12] = {0};
    assert_int_equal(flexdiag__png_write_rgb("/nonexistent-flexdiag-dir/x.png", px, 2, 2),
                     FLEXDIAG_ERR_NOT_FOUND);
    assert_non_null(strstr(cli_io_error(), "/nonexistent-flexdiag-dir/x.png"));
    assert_non_null(strstr(cli_io_error(), "No such file or directory"));
    assert_int_equal(flexdiag__png_write_rgb("x.png", px, 0, 2), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(cli_io_error(), "x.png"));
    /* a folder in place of the target: refused naming it, no temp file written */
    char *dir = tu_tempdir("pngerr");
    char path[512];
    snprintf(path, sizeof path, "%s/taken.png", dir);
    assert_int_equal(tu_system("mkdir '%s' && touch '%s/inner'", path, path), 0);
    assert_int_equal(flexdiag__png_write_rgb(path, px, 2, 2), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(cli_io_error(), "is a folder"));
    assert_int_equal(count_tmp(dir), 0);
    tu_rmtree(dir);
    free(dir);
}

static void test_tile(void **state) {
    (void)state;
    uint8_t a[2 * 2 * 3], b[2 * 2 * 3], c[2 * 2 * 3];
    memset(a, 10, sizeof a);
    memset(b, 20, sizeof b);
    memset(c, 30, sizeof c);
    const uint8_t *imgs[3] = {a, b, c};
    uint8_t *g = NULL;
    int gw = 0, gh = 0;
    assert_int_equal(flexdiag__png_tile(imgs, 3, 2, 2, 2, &g, &gw, &gh), FLEXDIAG_OK);
    assert_int_equal(gw, 4);
    assert_int_equal(gh, 4);
    /* rows of the 4x4 grid: [a a b b] [a a b b] [c c 0 0] [c c 0 0] */
    const uint8_t want_px[16] = {10, 10, 20, 20, 10, 10, 20, 20, 30, 30, 0, 0, 30, 30, 0, 0};
    for (int p = 0; p < 16; p++)
        for (int ch = 0; ch < 3; ch++) assert_int_equal(g[p * 3 + ch], want_px[p]);
    free(g);
    assert_int_equal(flexdiag__png_tile(imgs, 3, 2, 2, 0, &g, &gw, &gh), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(cli_io_error(), "image grid"));
    assert_null(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pixels_to_u8),
        cmocka_unit_test(test_png_round_trip),
        cmocka_unit_test(test_png_errors),
        cmocka_unit_test(test_tile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
