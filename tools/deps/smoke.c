/*
 * smoke.c - end-to-end check of the offline dependency bundle on a GPU host.
 *
 * tools/deps/unpack.sh extracts Debian's jansson, pcre2, libpng (+ zlib), liburing and cmocka
 * into a private prefix. This program is compiled with the flags pkg-config reports for them
 * and calls each library once, so a wrong include path, a missing .so symlink or a library
 * that does not load on the host fails here, independently of the state of flexdiag's own code.
 * It is itself a cmocka test program, which checks cmocka. io_uring may be refused by the host
 * kernel or sandbox: the check reports that as a skip, since the library itself did load.
 * Build and run: tools/deps/check.sh (after eval "$(tools/deps/unpack.sh)").
 */
#define _GNU_SOURCE /* liburing.h needs sigset_t and AT_FDCWD, as in flexdiag's build */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <liburing.h>
#include <pcre2.h>
#include <png.h>
#include <zlib.h>

/* jansson: parse UTF-8 JSON and read a value back. */
static void test_jansson(void **state)
{
    (void)state;
    json_error_t err;
    json_t *root = json_loads("{\"name\": \"\\u4e2d\", \"n\": [1, 2, 3]}", 0, &err);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(root, "n")), 3);
    assert_string_equal(json_string_value(json_object_get(root, "name")), "\xe4\xb8\xad");
    json_decref(root);
}

/* pcre2: a Unicode property class, as the tokenizer's pre-tokenizer regexes use. */
static void test_pcre2(void **state)
{
    (void)state;
    int code = 0;
    PCRE2_SIZE off = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "\\s?\\p{L}+", PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    assert_non_null(re);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    const char *text = "12 caf\xc3\xa9!";
    int rc = pcre2_match(re, (PCRE2_SPTR)text, strlen(text), 0, 0, md, NULL);
    assert_int_equal(rc, 1);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    assert_int_equal(ov[0], 2);
    assert_int_equal(ov[1], 8); /* " café" is 6 bytes */
    pcre2_match_data_free(md);
    pcre2_code_free(re);
}

/* libpng (and zlib through it): encode a 2x2 RGB image in memory and decode it again. */
static void test_png(void **state)
{
    (void)state;
    const uint8_t rgb[12] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = 2;
    img.height = 2;
    img.format = PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    assert_true(png_image_write_to_memory(&img, NULL, &size, 0, rgb, 0, NULL));
    uint8_t buf[1024];
    assert_true(size <= sizeof buf);
    assert_true(png_image_write_to_memory(&img, buf, &size, 0, rgb, 0, NULL));
    png_image back;
    memset(&back, 0, sizeof back);
    back.version = PNG_IMAGE_VERSION;
    assert_true(png_image_begin_read_from_memory(&back, buf, size));
    back.format = PNG_FORMAT_RGB;
    uint8_t out[12];
    assert_true(png_image_finish_read(&back, NULL, out, 0, NULL));
    assert_memory_equal(out, rgb, sizeof rgb);
    assert_non_null(zlibVersion());
}

/* liburing: set up and tear down a ring (the kernel or sandbox may refuse: skip). */
static void test_uring(void **state)
{
    (void)state;
    struct io_uring ring;
    int rc = io_uring_queue_init(8, &ring, 0);
    if (rc < 0) {
        fprintf(stderr, "io_uring_queue_init: %s (library loaded; ring refused here)\n",
                strerror(-rc));
        skip();
    }
    io_uring_queue_exit(&ring);
}

int main(void)
{
    printf("jansson %s, pcre2 %d.%d, libpng %s, zlib %s\n", JANSSON_VERSION, PCRE2_MAJOR,
           PCRE2_MINOR, png_get_libpng_ver(NULL), zlibVersion());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jansson),
        cmocka_unit_test(test_pcre2),
        cmocka_unit_test(test_png),
        cmocka_unit_test(test_uring),
    };
    return cmocka_run_group_tests_name("deps_bundle", tests, NULL, NULL);
}
