/*
 * test_npy.c - the .npy reader and writer (cli/npy.c, over cli/fileio.c's atomic writer).
 *
 * Round trips of every accepted dtype ('<f4', '<i4', '<i8') over ranks 0..3 and an empty array;
 * byte-exact comparison with a file laid out by hand the way numpy's np.save writes it (format
 * 1.0, header padded to a 64-byte data offset); a 2.0 file with double-quoted keys; and the error
 * cases (bad magic, unknown version, Fortran order, big-endian and other dtypes, malformed or
 * duplicate keys, overflowing shapes, truncated or trailing data), each checked for status, file
 * name and reason (cli_io_error: the CLI's writers do not use the library's message buffer).
 * The npy element types carry the library's dtype numbers, checked at compile time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/fileio.h"
#include "cli/npy.h"
#include "runtime/model/safetensors.h"
#include "util.h"

_Static_assert((int)FLEXDIAG_NPY_F32 == (int)FLEXDIAG_DTYPE_F32 &&
                   (int)FLEXDIAG_NPY_I32 == (int)FLEXDIAG_DTYPE_I32 &&
                   (int)FLEXDIAG_NPY_I64 == (int)FLEXDIAG_DTYPE_I64,
               "npy element types must keep the library's dtype numbers (cli/npy.h)");

static char *tmp; /* per-run temp folder */

static char *tpath(const char *name) {
    char *p = NULL;
    assert_true(asprintf(&p, "%s/%s", tmp, name) > 0);
    return p;
}

static void expect_err(flexdiag_status got, flexdiag_status want, const char *file,
                       const char *phrase) {
    const char *msg = cli_io_error();
    int ok = got == want && strstr(msg, file) && strstr(msg, phrase);
    if (!ok)
        print_error("status %d (want %d), message \"%s\"; want file %s phrase \"%s\"\n", got, want,
                    msg, file, phrase);
    assert_true(ok);
}

/* A .npy file as numpy lays it out: preamble of `major`, dict padded with spaces + '\n' to a
 * 64-byte data offset, then data_len bytes of data (copied from data, or zeros). */
static void write_npy_raw(const char *path, int major, const char *dict, const void *data,
                          size_t data_len) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = (pre + dl + 1 + 63) / 64 * 64, hlen = total - pre;
    unsigned char *buf = calloc(1, total + data_len);
    assert_non_null(buf);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hlen - dl - 1);
    buf[total - 1] = '\n';
    if (data) memcpy(buf + total, data, data_len);
    assert_int_equal(tu_write_file(path, buf, total + data_len), 0);
    free(buf);
}

static void test_round_trip(void **state) {
    (void)state;
    float f[24];
    int32_t i4[5] = {-5, 0, 1, INT32_MAX, INT32_MIN};
    int64_t i8 = INT64_MIN + 1;
    tu_rng r;
    tu_rng_seed(&r, 3);
    tu_fill_f32(&r, f, 24, 2.0f);
    const struct {
        int32_t dt;
        int32_t ndim;
        int64_t shape[3];
        const void *data;
        size_t bytes;
    } cases[] = {
        {FLEXDIAG_NPY_F32, 2, {2, 3}, f, 24},   {FLEXDIAG_NPY_F32, 3, {2, 3, 4}, f, 96},
        {FLEXDIAG_NPY_I32, 1, {5}, i4, 20},     {FLEXDIAG_NPY_I64, 0, {0}, &i8, 8},
        {FLEXDIAG_NPY_F32, 2, {0, 7}, NULL, 0},
    };
    char *p = tpath("rt.npy");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_int_equal(
            flexdiag__npy_write(p, cases[c].dt, cases[c].ndim, cases[c].shape, cases[c].data),
            FLEXDIAG_OK);
        size_t len;
        unsigned char *raw = tu_read_file(p, &len);
        assert_int_equal((len - cases[c].bytes) % 64, 0); /* data starts 64-aligned */
        assert_true(raw[6] == 1 && raw[7] == 0 && raw[len - cases[c].bytes - 1] == '\n');
        free(raw);
        flexdiag_npy a;
        assert_int_equal(flexdiag__npy_read(p, &a), FLEXDIAG_OK);
        assert_int_equal(a.dtype, cases[c].dt);
        assert_int_equal(a.ndim, cases[c].ndim);
        int64_t numel = 1;
        for (int32_t d = 0; d < a.ndim; d++) {
            assert_int_equal(a.shape[d], cases[c].shape[d]);
            numel *= a.shape[d];
        }
        assert_int_equal(a.numel, numel);
        if (cases[c].bytes) assert_memory_equal(a.data, cases[c].data, cases[c].bytes);
        flexdiag__npy_free(&a);
        assert_null(a.data);
    }
    free(p);
}

/* np.save("x.npy", np.arange(6, dtype="<i4").reshape(2, 3)) byte for byte. */
static void test_numpy_layout(void **state) {
    (void)state;
    static const char dict[] = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
    unsigned char want[128 + 24];
    memcpy(want, "\x93NUMPY\x01\x00v\x00", 10); /* header length 118 = 'v' */
    memcpy(want + 10, dict, sizeof dict - 1);
    memset(want + 10 + sizeof dict - 1, ' ', 128 - 11 - (sizeof dict - 1));
    want[127] = '\n';
    int32_t data[6] = {0, 1, 2, 3, 4, 5};
    memcpy(want + 128, data, sizeof data);
    char *hand = tpath("hand.npy"), *ours = tpath("ours.npy");
    assert_int_equal(tu_write_file(hand, want, sizeof want), 0);
    flexdiag_npy a;
    assert_int_equal(flexdiag__npy_read(hand, &a), FLEXDIAG_OK);
    assert_true(a.dtype == FLEXDIAG_NPY_I32 && a.ndim == 2 && a.shape[0] == 2 &&
                a.shape[1] == 3 && a.numel == 6);
    assert_memory_equal(a.data, data, sizeof data);
    assert_int_equal(flexdiag__npy_write(ours, a.dtype, a.ndim, a.shape, a.data), FLEXDIAG_OK);
    flexdiag__npy_free(&a);
    size_t len;
    unsigned char *got = tu_read_file(ours, &len);
    assert_int_equal(len, sizeof want);
    assert_memory_equal(got, want, sizeof want);
    free(got);

    /* format 2.0, double quotes, 1-tuple, keys in another order */
    float v[4] = {1.5f, -2, 0, 8};
    write_npy_raw(hand, 2, "{\"shape\": (4,), \"fortran_order\": False, \"descr\": \"<f4\"}", v,
                  sizeof v);
    assert_int_equal(flexdiag__npy_read(hand, &a), FLEXDIAG_OK);
    assert_true(a.dtype == FLEXDIAG_NPY_F32 && a.ndim == 1 && a.shape[0] == 4);
    assert_memory_equal(a.data, v, sizeof v);
    flexdiag__npy_free(&a);
    free(hand);
    free(ours);
}

static void test_errors(void **state) {
    (void)state;
    const struct {
        const char *file;
        int major;
        const char *dict;
        size_t data_len;
        flexdiag_status want;
        const char *phrase;
    } cases[] = {
        {"version9.npy", 9, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4,
         FLEXDIAG_ERR_UNSUPPORTED, "version 9.0"},
        {"fortran.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16,
         FLEXDIAG_ERR_UNSUPPORTED, "Fortran order"},
        {"bigendian.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4,
         FLEXDIAG_ERR_UNSUPPORTED, "big-endian"},
        {"f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", 8,
         FLEXDIAG_ERR_UNSUPPORTED, "dtype '<f8' is not supported"},
        {"rank9.npy", 1,
         "{'descr': '<f4', 'fortran_order': False, 'shape': "
         "(1,1,1,1,1,1,1,1,1), }",
         4, FLEXDIAG_ERR_UNSUPPORTED, "rank exceeds"},
        {"truncated.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20,
         FLEXDIAG_ERR_INVALID_ARG, "needs 24 data bytes but the file holds 20 (truncated)"},
        {"trailing.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", 17,
         FLEXDIAG_ERR_INVALID_ARG, "trailing bytes"},
        {"missing_key.npy", 1, "{'descr': '<f4', 'shape': (1,), }", 4, FLEXDIAG_ERR_INVALID_ARG,
         "is missing"},
        {"dup_key.npy", 1,
         "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
         "'shape': (1,), }",
         4, FLEXDIAG_ERR_INVALID_ARG, "duplicate key"},
        {"extra_key.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4,
         FLEXDIAG_ERR_INVALID_ARG, "unexpected key"},
        {"negative.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 0,
         FLEXDIAG_ERR_INVALID_ARG, "non-negative integer"},
        {"overflow.npy", 1,
         "{'descr': '<f4', 'fortran_order': False, 'shape': "
         "(1099511627776, 1099511627776), }",
         0, FLEXDIAG_ERR_INVALID_ARG, "overflows 64 bits"},
        {"bytes_overflow.npy", 1,
         "{'descr': '<i8', 'fortran_order': False, 'shape': "
         "(4611686018427387904,), }",
         0, FLEXDIAG_ERR_INVALID_ARG, "overflows 64 bits"},
        {"not_dict.npy", 1, "['descr', '<f4']", 0, FLEXDIAG_ERR_INVALID_ARG, "not a dict"},
        {"bad_tuple.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1 2), }", 0,
         FLEXDIAG_ERR_INVALID_ARG, "malformed"},
        {"after_dict.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), } x", 4,
         FLEXDIAG_ERR_INVALID_ARG, "text after the dict"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *p = tpath(cases[i].file);
        write_npy_raw(p, cases[i].major, cases[i].dict, NULL, cases[i].data_len);
        flexdiag_npy a;
        expect_err(flexdiag__npy_read(p, &a), cases[i].want, cases[i].file, cases[i].phrase);
        assert_null(a.data);
        free(p);
    }

    /* raw-byte cases: magic, short file, header length past the end, missing file */
    const struct {
        const char *file, *bytes;
        size_t len;
        flexdiag_status want;
        const char *phrase;
    } raw[] = {
        {"magic.npy", "\x93NUMPX\x01\x00\x00\x00", 10, FLEXDIAG_ERR_INVALID_ARG, "bad magic"},
        {"short.npy", "\x93NUM", 4, FLEXDIAG_ERR_INVALID_ARG, "shorter than"},
        {"hdr_eof.npy", "\x93NUMPY\x01\x00\x40\x00{}", 12, FLEXDIAG_ERR_INVALID_ARG,
         "truncated in the header"},
        {"huge_hdr.npy", "\x93NUMPY\x02\x00\x00\x00\x00\x7f{}", 14, FLEXDIAG_ERR_INVALID_ARG,
         "1 MiB cap"},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        char *p = tpath(raw[i].file);
        assert_int_equal(tu_write_file(p, raw[i].bytes, raw[i].len), 0);
        flexdiag_npy a;
        expect_err(flexdiag__npy_read(p, &a), raw[i].want, raw[i].file, raw[i].phrase);
        free(p);
    }
    char *p = tpath("absent.npy");
    flexdiag_npy a;
    expect_err(flexdiag__npy_read(p, &a), FLEXDIAG_ERR_NOT_FOUND, "absent.npy", "No such file");
    free(p);

    int64_t shape[1] = {2};
    float v[2] = {0, 0};
    p = tpath("w.npy");
    expect_err(flexdiag__npy_write(p, FLEXDIAG_DTYPE_BF16, 1, shape, v), FLEXDIAG_ERR_INVALID_ARG,
               "w.npy", "F32, I32 or I64");
    free(p);
    p = tpath("no_dir/w.npy");
    expect_err(flexdiag__npy_write(p, FLEXDIAG_NPY_F32, 1, shape, v), FLEXDIAG_ERR_NOT_FOUND,
               "no_dir", "folder");
    free(p);
}

static int setup(void **state) {
    (void)state;
    tmp = tu_tempdir("npy");
    return tmp ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(tmp);
    free(tmp);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_numpy_layout),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
