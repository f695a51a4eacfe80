/*
 * test_safetensors.c - the safetensors reader and writer (runtime/safetensors.c).
 *
 * Good files are written with flexdiag__st_write (BF16/F16/F32/I32/I64/F64, rank 0, empty,
 * a tensor larger than the 8 MiB read chunk, sharded indexes, folders) and read back bit-exact.
 * Corrupt files follow docs/architecture.md §10.1: a table of headers built by hand as raw bytes,
 * plus truncations of a valid file. Every failure asserts the exact status and that the message
 * names the file, the tensor (when there is one) and a key phrase. A file truncated after open must
 * give FLEXDIAG_ERR_IO on read, never a crash.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/core.h"
#include "runtime/model/safetensors.h"
#include "st_write.h"
#include "util.h"

static char *tmp; /* per-run temp folder */

static char *tpath(const char *fmt, ...) FLEXDIAG_PRINTF(1, 2);
static char *tpath(const char *fmt, ...) {
    char name[256], *p = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    assert_true(asprintf(&p, "%s/%s", tmp, name) > 0);
    return p;
}

/* Status and message checks; prints the message when something is off. */
static void expect_err(flexdiag_status got, flexdiag_status want, const char *file,
                       const char *tensor, const char *phrase) {
    const char *msg = flexdiag_last_error(NULL);
    int ok = got == want && (!file || strstr(msg, file)) && (!phrase || strstr(msg, phrase));
    char quoted[256];
    if (tensor) {
        snprintf(quoted, sizeof quoted, "'%s'", tensor);
        ok = ok && strstr(msg, quoted);
    }
    if (!ok)
        print_error("status %d (want %d), message \"%s\"; want file %s tensor %s phrase \"%s\"\n",
                    got, want, msg, file ? file : "-", tensor ? tensor : "-",
                    phrase ? phrase : "-");
    assert_true(ok);
}

/* u64 LE length of json, json, then data_len zero bytes. */
static void write_st_raw(const char *path, const char *json, size_t data_len) {
    size_t n = strlen(json);
    unsigned char *buf = calloc(1, 8 + n + data_len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, json, n);
    assert_int_equal(tu_write_file(path, buf, 8 + n + data_len), 0);
    free(buf);
}

static flexdiag_st_entry entry(const char *name, flexdiag_dtype dt, const void *data, int32_t ndim,
                               int64_t d0, int64_t d1) {
    flexdiag_st_entry e = {.name = name, .dtype = dt, .ndim = ndim, .data = data};
    e.shape[0] = d0;
    e.shape[1] = d1;
    return e;
}

/* ---- good files ---- */

static int n_rounding_logs;
static void count_rounding(flexdiag_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == FLEXDIAG_LOG_INFO && strstr(msg, "rounded")) n_rounding_logs++;
}

static void test_round_trip(void **state) {
    (void)state;
    tu_rng r;
    tu_rng_seed(&r, 1);
    uint16_t bf[6], f16[4] = {0x3c00, 0xc000, 0x0001, 0x7bff}, scalar = 0x4049;
    float f32[6] = {1.0f, 1.00390625f, 1.01171875f, -3.5e-3f, 65504.0f, 0.0f};
    int32_t i32[3] = {-1, 0, 7};
    int64_t i64[2] = {INT64_MIN, 123456789012345};
    double f64[2] = {1.5, -2.25};
    tu_fill_bf16(&r, bf, 6, 1.0f);
    flexdiag_st_entry es[] = {
        entry("w.bf16", FLEXDIAG_DTYPE_BF16, bf, 2, 2, 3),
        entry("w.f16", FLEXDIAG_DTYPE_F16, f16, 1, 4, 0),
        entry("w.f32", FLEXDIAG_DTYPE_F32, f32, 2, 3, 2),
        entry("ids.i32", FLEXDIAG_DTYPE_I32, i32, 1, 3, 0),
        entry("ids.i64", FLEXDIAG_DTYPE_I64, i64, 1, 2, 0),
        entry("scalar", FLEXDIAG_DTYPE_BF16, &scalar, 0, 0, 0),
        entry("empty", FLEXDIAG_DTYPE_F32, NULL, 2, 0, 5),
        entry("extra.f64", FLEXDIAG_DTYPE_F64, f64, 1, 2, 0),
    };
    char *p = tpath("round_trip.safetensors");
    assert_int_equal(flexdiag__st_write(p, es, 8), FLEXDIAG_OK);

    size_t len;
    unsigned char *raw = tu_read_file(p, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | raw[i];
    assert_true(n % 8 == 0 && raw[8] == '{' && (raw[8 + n - 1] == ' ' || raw[8 + n - 1] == '}'));
    assert_int_equal(len, 8 + n + 12 + 8 + 24 + 12 + 16 + 2 + 0 + 16);
    free(raw);

    flexdiag_safetensors *st;
    assert_int_equal(flexdiag__st_open(p, &st), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_count(st), 8);
    for (int64_t i = 1; i < 8; i++)
        assert_true(strcmp(flexdiag__st_at(st, i - 1)->name, flexdiag__st_at(st, i)->name) < 0);
    assert_null(flexdiag__st_find(st, "nope"));
    assert_string_equal(flexdiag__st_file_path(st, 0), p);

    const flexdiag_st_tensor *t = flexdiag__st_find(st, "w.bf16");
    assert_non_null(t);
    assert_int_equal(t->dtype, FLEXDIAG_DTYPE_BF16);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, 12);
    assert_int_equal(t->offset, 8 + n); /* first in data order */
    uint16_t got16[6];
    float got32[6];
    assert_int_equal(flexdiag__st_read_bf16(st, t, got16), FLEXDIAG_OK);
    assert_memory_equal(got16, bf, sizeof bf);
    assert_int_equal(flexdiag__st_read_f32(st, t, got32), FLEXDIAG_OK);
    for (int i = 0; i < 6; i++) assert_true(got32[i] == flexdiag__bf16_to_f32(bf[i]));

    t = flexdiag__st_find(st, "w.f16");
    assert_int_equal(flexdiag__st_read_bf16(st, t, got16), FLEXDIAG_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(got16[i], flexdiag__f32_to_bf16(flexdiag__f16_to_f32(f16[i])));
    assert_int_equal(flexdiag__st_read_f32(st, t, got32), FLEXDIAG_OK);
    assert_true(got32[0] == 1.0f && got32[1] == -2.0f && got32[3] == 65504.0f);

    t = flexdiag__st_find(st, "w.f32");
    flexdiag_log_set(count_rounding, FLEXDIAG_LOG_INFO, NULL);
    n_rounding_logs = 0;
    assert_int_equal(flexdiag__st_read_bf16(st, t, got16), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_read_bf16(st, t, got16), FLEXDIAG_OK);
    assert_int_equal(n_rounding_logs, 1); /* once per file */
    flexdiag_log_set(NULL, FLEXDIAG_LOG_WARN, NULL);
    assert_int_equal(got16[1], 0x3f80); /* tie rounds to even */
    assert_int_equal(got16[2], 0x3f82);
    for (int i = 0; i < 6; i++) assert_int_equal(got16[i], flexdiag__f32_to_bf16(f32[i]));
    assert_int_equal(flexdiag__st_read_f32(st, t, got32), FLEXDIAG_OK);
    assert_memory_equal(got32, f32, sizeof f32);

    int64_t g64[2];
    int32_t g32[3];
    t = flexdiag__st_find(st, "ids.i64");
    assert_int_equal(flexdiag__st_read_raw(st, t, g64), FLEXDIAG_OK);
    assert_memory_equal(g64, i64, sizeof i64);
    expect_err(flexdiag__st_read_bf16(st, t, got16), FLEXDIAG_ERR_UNSUPPORTED, "round_trip",
               "ids.i64", "I64");
    flexdiag__err_clear();
    t = flexdiag__st_find(st, "ids.i32");
    assert_int_equal(flexdiag__st_read_raw(st, t, g32), FLEXDIAG_OK);
    assert_memory_equal(g32, i32, sizeof i32);
    expect_err(flexdiag__st_read_f32(st, t, got32), FLEXDIAG_ERR_UNSUPPORTED, "round_trip",
               "ids.i32", "I32");
    flexdiag__err_clear();

    t = flexdiag__st_find(st, "extra.f64"); /* stored-only dtype: opens, raw only */
    assert_int_equal(t->dtype, FLEXDIAG_DTYPE_F64);
    assert_string_equal(flexdiag__dtype_name(t->dtype), "F64");
    expect_err(flexdiag__st_read_f32(st, t, got32), FLEXDIAG_ERR_UNSUPPORTED, "round_trip",
               "extra.f64", "F64");
    flexdiag__err_clear();
    double gd[2];
    assert_int_equal(flexdiag__st_read_raw(st, t, gd), FLEXDIAG_OK);
    assert_true(gd[0] == 1.5 && gd[1] == -2.25);

    t = flexdiag__st_find(st, "scalar");
    assert_true(t->ndim == 0 && t->numel == 1 && t->nbytes == 2);
    assert_int_equal(flexdiag__st_read_bf16(st, t, got16), FLEXDIAG_OK);
    assert_int_equal(got16[0], scalar);
    t = flexdiag__st_find(st, "empty");
    assert_true(t->ndim == 2 && t->shape[1] == 5 && t->numel == 0 && t->nbytes == 0);
    assert_int_equal(flexdiag__st_read_f32(st, t, NULL), FLEXDIAG_OK);
    flexdiag__st_close(st);
    free(p);
}

/* A tensor larger than the 8 MiB bounce buffer converts chunk by chunk. */
static void test_large_chunked(void **state) {
    (void)state;
    int64_t n = 3 * 1024 * 1024 + 7;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    uint16_t *b = malloc((size_t)n * 2);
    tu_rng r;
    tu_rng_seed(&r, 2);
    tu_fill_f32(&r, x, n, 3.0f);
    flexdiag_st_entry e = entry("big", FLEXDIAG_DTYPE_F32, x, 1, n, 0);
    char *p = tpath("large.safetensors");
    assert_int_equal(flexdiag__st_write(p, &e, 1), FLEXDIAG_OK);
    flexdiag_safetensors *st;
    assert_int_equal(flexdiag__st_open(p, &st), FLEXDIAG_OK);
    const flexdiag_st_tensor *t = flexdiag__st_find(st, "big");
    assert_int_equal(flexdiag__st_read_bf16(st, t, b), FLEXDIAG_OK);
    for (int64_t i = 0; i < n; i++)
        if (b[i] != flexdiag__f32_to_bf16(x[i])) fail_msg("element %lld differs", (long long)i);
    assert_int_equal(flexdiag__st_read_f32(st, t, y), FLEXDIAG_OK);
    assert_memory_equal(x, y, (size_t)n * 4);
    flexdiag__st_close(st);
    free(p);
    free(x);
    free(y);
    free(b);
}

/* ---- corrupt files ---- */

typedef struct bad_case {
    const char *file;     /* file name (also expected in the message) */
    const char *json;     /* header text, or NULL to write raw */
    size_t len;           /* data bytes after the header, or raw's length */
    const char *raw;      /* whole file when json is NULL */
    flexdiag_status want; /* expected status */
    const char *tensor;   /* quoted in the message, or NULL */
    const char *phrase;   /* key phrase of the message */
} bad_case;

#define E(name, dt, shape, b, e)                                                                   \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"
#define C FLEXDIAG_ERR_CORRUPT_MODEL

static const bad_case bad_cases[] = {
    {"short.safetensors", NULL, 5, "\x01\x02\x03\x04\x05", C, NULL, "shorter than the 8-byte"},
    {"empty.safetensors", NULL, 0, "", C, NULL, "shorter than the 8-byte"},
    {"giant.safetensors", NULL, 16, "\x00\x28\x6b\xee\x00\x00\x00\x00{}      ", C, NULL,
     "header length 4000000000 exceeds the 100000000-byte cap"},
    {"hdr_past_eof.safetensors", NULL, 10, "\x40\x00\x00\x00\x00\x00\x00\x00{}", C, NULL,
     "truncated in the header"},
    {"zero_hdr.safetensors", NULL, 8, "\x00\x00\x00\x00\x00\x00\x00\x00", C, NULL,
     "does not start with '{'"},
    {"bad_json.safetensors", "{" E("a", "F32", "[1]", 0, 4), 4, NULL, C, NULL, "not valid JSON"},
    {"bad_utf8.safetensors", "{" E("a\xff", "F32", "[1]", 0, 4) "}", 4, NULL, C, NULL,
     "not valid UTF-8"},
    {"overlong_utf8.safetensors", "{" E("a\xc0\xaf", "F32", "[1]", 0, 4) "}", 4, NULL, C, NULL,
     "not valid UTF-8"},
    {"nul_key.safetensors", "{" E("a\\u0000b", "F32", "[1]", 0, 4) "}", 4, NULL, C, NULL,
     "not valid JSON"},
    {"dup_keys.safetensors", "{" E("a", "F32", "[1]", 0, 4) "," E("a", "F32", "[1]", 4, 8) "}", 8,
     NULL, C, NULL, "duplicate"},
    {"space_start.safetensors", " {" E("a", "F32", "[1]", 0, 4) "}", 4, NULL, C, NULL,
     "does not start with '{'"},
    {"deep.safetensors", "{\"a\":{\"shape\":[[1]]}}", 0, NULL, C, NULL,
     "nests deeper than 3 levels"},
    {"array_start.safetensors", "[1]     ", 0, NULL, C, NULL, "does not start with '{'"},
    {"trailing_text.safetensors", "{} x", 0, NULL, C, NULL, "not valid JSON"},
    {"meta_value.safetensors", "{\"__metadata__\":{\"format\":1}," E("a", "F32", "[1]", 0, 4) "}",
     4, NULL, C, NULL, "__metadata__ value 'format' is not a string"},
    {"meta_type.safetensors", "{\"__metadata__\":\"pt\"," E("a", "F32", "[1]", 0, 4) "}", 4, NULL,
     C, NULL, "__metadata__ must be an object"},
    {"unknown_dtype.safetensors", "{" E("a", "Q4", "[1]", 0, 4) "}", 4, NULL,
     FLEXDIAG_ERR_UNSUPPORTED, "a", "unknown dtype 'Q4'"},
    {"dtype_type.safetensors", "{\"a\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     NULL, C, "a", "dtype must be a string"},
    {"entry_type.safetensors", "{\"a\":5}", 0, NULL, C, "a", "entry must be an object"},
    {"negative_shape.safetensors", "{" E("a", "F32", "[-1,2]", 0, 4) "}", 4, NULL, C, "a",
     "shape dim 0 is not a non-negative integer"},
    {"float_shape.safetensors", "{" E("a", "F32", "[1,2.0]", 0, 8) "}", 8, NULL, C, "a",
     "shape dim 1 is not a non-negative integer"},
    {"shape_type.safetensors", "{" E("a", "F32", "7", 0, 4) "}", 4, NULL, C, "a",
     "shape must be an array"},
    {"shape_overflow.safetensors", "{" E("a", "U8", "[1099511627776,1099511627776]", 0, 4) "}", 4,
     NULL, C, "a", "overflows 64 bits"},
    {"bytes_overflow.safetensors", "{" E("a", "F32", "[4611686018427387904]", 0, 4) "}", 4, NULL, C,
     "a", "byte size of shape [4611686018427387904] of F32 overflows"},
    {"rank9.safetensors", "{" E("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, NULL,
     FLEXDIAG_ERR_UNSUPPORTED, "a", "rank 9 exceeds"},
    {"offsets_reversed.safetensors", "{" E("a", "U8", "[4]", 8, 4) "}", 8, NULL, C, "a",
     "[8, 4) end before they begin"},
    {"offsets_negative.safetensors", "{" E("a", "U8", "[4]", -4, 0) "}", 4, NULL, C, "a",
     "data_offsets must be"},
    {"offsets_missing.safetensors", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, NULL, C, "a",
     "data_offsets must be"},
    {"offsets_huge.safetensors", "{" E("a", "U8", "[1]", 0, 99999999999999999999) "}", 1, NULL, C,
     NULL, "not valid JSON"},
    {"size_mismatch.safetensors", "{" E("a.weight", "BF16", "[2,3]", 0, 10) "}", 10, NULL, C,
     "a.weight", "data_offsets [0, 10) hold 10 bytes but shape [2, 3] of BF16 needs 12"},
    {"first_not_zero.safetensors", "{" E("a", "F32", "[2]", 4, 12) "}", 12, NULL, C, "a",
     "first tensor begins at 4"},
    {"hole.safetensors", "{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 12, 20) "}", 20,
     NULL, C, "b", "hole of 4 bytes"},
    {"overlap.safetensors", "{" E("b", "F32", "[2]", 4, 12) "," E("a", "F32", "[2]", 0, 8) "}", 12,
     NULL, C, "b", "overlap tensor 'a'"},
    {"empty_inside.safetensors", "{" E("a", "F32", "[2]", 0, 8) "," E("z", "F32", "[0]", 4, 4) "}",
     8, NULL, C, "z", "overlap tensor 'a'"},
    {"past_eof.safetensors", "{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 8, 16) "}", 12,
     NULL, C, "b", "past the end of the 12-byte data section"},
    {"trailing_data.safetensors", "{" E("a", "F32", "[2]", 0, 8) "}", 12, NULL, C, NULL,
     "4 bytes of trailing data after the last tensor"},
    {"no_tensors_data.safetensors", "{}", 3, NULL, C, NULL, "3 bytes of trailing data"},
};

static void test_corrupt_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        char *p = tpath("%s", c->file);
        if (c->json)
            write_st_raw(p, c->json, c->len);
        else
            assert_int_equal(tu_write_file(p, c->raw, c->len), 0);
        flexdiag_safetensors *st = (flexdiag_safetensors *)p;
        flexdiag__err_clear();
        flexdiag_status s = flexdiag__st_open(p, &st);
        assert_null(st);
        expect_err(s, c->want, c->file, c->tensor, c->phrase);
        free(p);
    }
    flexdiag__err_clear();
}

/* Metadata of strings, an empty header and an entry with extra keys are fine. */
static void test_valid_handmade(void **state) {
    (void)state;
    char *p = tpath("handmade.safetensors");
    write_st_raw(p,
                 "{\"__metadata__\":{\"format\":\"pt\"}," E("b", "U8", "[0]", 4, 4) "," E(
                     "a", "F32", "[1]", 0, 4) "}    ",
                 4);
    flexdiag_safetensors *st;
    assert_int_equal(flexdiag__st_open(p, &st), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_count(st), 2);
    assert_string_equal(flexdiag__st_at(st, 0)->name, "a");
    assert_int_equal(flexdiag__st_find(st, "b")->dtype, FLEXDIAG_DTYPE_U8);
    flexdiag__st_close(st);
    write_st_raw(p, "{}", 0);
    assert_int_equal(flexdiag__st_open(p, &st), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_count(st), 0);
    flexdiag__st_close(st);
    free(p);
}

/* Entry cap: 1,000,001 tensors fail after parsing; one more member fails in the structural
 * pre-scan, before jansson allocates anything. */
static void test_entry_cap(void **state) {
    (void)state;
    for (size_t n = 1000001; n <= 1000002; n++) {
        size_t cap = n * 16 + 16, used = 1;
        char *json = malloc(cap);
        json[0] = '{';
        for (size_t i = 0; i < n; i++)
            used += (size_t)snprintf(json + used, cap - used, "%s\"%zx\":0", i ? "," : "", i);
        snprintf(json + used, cap - used, "}");
        char *p = tpath("many%zu.safetensors", n);
        write_st_raw(p, json, 0);
        free(json);
        flexdiag_safetensors *st;
        flexdiag__err_clear();
        expect_err(flexdiag__st_open(p, &st), C, "many", NULL,
                   n == 1000001 ? "header lists 1000001 tensors, more than the cap"
                                : "over 1000001 entries, more than the cap");
        flexdiag__err_clear();
        unlink(p);
        free(p);
    }
}

/* A valid two-tensor file cut in the header, mid-tensor and at the last byte. */
static void test_truncated_files(void **state) {
    (void)state;
    uint16_t a[4] = {1, 2, 3, 4};
    float b[4] = {1, 2, 3, 4};
    flexdiag_st_entry es[2] = {entry("a", FLEXDIAG_DTYPE_BF16, a, 1, 4, 0),
                               entry("b", FLEXDIAG_DTYPE_F32, b, 1, 4, 0)};
    char *p = tpath("full.safetensors");
    assert_int_equal(flexdiag__st_write(p, es, 2), FLEXDIAG_OK);
    size_t len;
    unsigned char *raw = tu_read_file(p, &len);
    size_t hdr_end = len - 24;
    const struct {
        const char *file;
        size_t keep;
        const char *tensor, *phrase;
    } cuts[] = {
        {"cut_prefix.safetensors", 4, NULL, "shorter than the 8-byte"},
        {"cut_header.safetensors", 8 + (hdr_end - 8) / 2, NULL, "truncated in the header"},
        {"cut_mid.safetensors", hdr_end + 12, "b", "past the end"},
        {"cut_last.safetensors", len - 1, "b", "past the end of the 23-byte data section"},
    };
    for (size_t i = 0; i < 4; i++) {
        char *q = tpath("%s", cuts[i].file);
        assert_int_equal(tu_write_file(q, raw, cuts[i].keep), 0);
        flexdiag_safetensors *st;
        flexdiag__err_clear();
        expect_err(flexdiag__st_open(q, &st), C, cuts[i].file, cuts[i].tensor, cuts[i].phrase);
        free(q);
    }
    flexdiag__err_clear();
    free(raw);
    free(p);
}

/* Truncation after open is an I/O error on read (pread sees EOF), not SIGBUS. */
static void test_truncated_after_open(void **state) {
    (void)state;
    float a[1024] = {0}, b[16] = {0};
    flexdiag_st_entry es[2] = {entry("a", FLEXDIAG_DTYPE_F32, a, 1, 1024, 0),
                               entry("b", FLEXDIAG_DTYPE_F32, b, 1, 16, 0)};
    char *p = tpath("shrinks.safetensors");
    assert_int_equal(flexdiag__st_write(p, es, 2), FLEXDIAG_OK);
    flexdiag_safetensors *st;
    assert_int_equal(flexdiag__st_open(p, &st), FLEXDIAG_OK);
    const flexdiag_st_tensor *ta = flexdiag__st_find(st, "a"), *tb = flexdiag__st_find(st, "b");
    assert_int_equal(truncate(p, (off_t)(ta->offset + 100)), 0);
    float got[1024];
    uint16_t got16[1024];
    flexdiag__err_clear();
    expect_err(flexdiag__st_read_f32(st, ta, got), FLEXDIAG_ERR_IO, "shrinks.safetensors", "a",
               "file truncated while reading tensor");
    flexdiag__err_clear();
    expect_err(flexdiag__st_read_bf16(st, ta, got16), FLEXDIAG_ERR_IO, "shrinks", "a", "truncated");
    flexdiag__err_clear();
    expect_err(flexdiag__st_read_raw(st, tb, got), FLEXDIAG_ERR_IO, "shrinks", "b", "truncated");
    flexdiag__err_clear();
    flexdiag__st_close(st);
    free(p);
}

/* ---- sharded index and folders ---- */

static void write_shards(void) {
    static const float v[4] = {1, 2, 3, 4};
    flexdiag_st_entry s1[2] = {entry("a", FLEXDIAG_DTYPE_F32, v, 1, 2, 0),
                               entry("b", FLEXDIAG_DTYPE_F32, v + 2, 1, 2, 0)};
    flexdiag_st_entry s2[1] = {entry("c", FLEXDIAG_DTYPE_F32, v, 1, 4, 0)};
    flexdiag_st_entry s3[2] = {entry("a", FLEXDIAG_DTYPE_F32, v, 1, 1, 0),
                               entry("z", FLEXDIAG_DTYPE_F32, v, 1, 1, 0)};
    char *p1 = tpath("s1.safetensors"), *p2 = tpath("s2.safetensors"),
         *p3 = tpath("s3.safetensors");
    assert_int_equal(flexdiag__st_write(p1, s1, 2), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_write(p2, s2, 1), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_write(p3, s3, 2), FLEXDIAG_OK);
    free(p1);
    free(p2);
    free(p3);
}

static void test_index_good(void **state) {
    (void)state;
    write_shards();
    char *p = tpath("good.index.json");
    const char *js = "{\"metadata\":{\"total_size\":32},\"weight_map\":{\"c\":\"s2.safetensors\","
                     "\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\"}}";
    assert_int_equal(tu_write_file(p, js, strlen(js)), 0);
    flexdiag_safetensors *st;
    assert_int_equal(flexdiag__st_open(p, &st), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_count(st), 3);
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) assert_string_equal(flexdiag__st_at(st, i)->name, names[i]);
    const flexdiag_st_tensor *c = flexdiag__st_find(st, "c"), *b = flexdiag__st_find(st, "b");
    assert_non_null(strstr(flexdiag__st_file_path(st, c->file), "/s2.safetensors"));
    assert_non_null(strstr(flexdiag__st_file_path(st, b->file), "/s1.safetensors"));
    float got[4];
    assert_int_equal(flexdiag__st_read_f32(st, c, got), FLEXDIAG_OK);
    assert_true(got[0] == 1 && got[3] == 4);
    assert_int_equal(flexdiag__st_read_f32(st, b, got), FLEXDIAG_OK);
    assert_true(got[0] == 3 && got[1] == 4);
    flexdiag__st_close(st);
    free(p);
}

static void test_index_errors(void **state) {
    (void)state;
    write_shards();
    const struct {
        const char *file, *json;
        flexdiag_status want;
        const char *tensor, *phrase;
    } cases[] = {
        {"dotdot.index.json",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
         "\"c\":\"../s2.safetensors\"}}",
         C, "c", "plain file name"},
        {"slash.index.json", "{\"weight_map\":{\"c\":\"sub/s2.safetensors\"}}", C, "c", "no '/'"},
        {"missing_tensor.index.json",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1."
         "safetensors\",\"c\":\"s2.safetensors\",\"d\":\"s2.safetensors\"}}",
         C, "d", "in shard 's2.safetensors', which does not hold it"},
        {"unlisted.index.json",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2."
         "safetensors\"}}",
         C, "b", "does not list it"},
        {"wrong_shard.index.json",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2."
         "safetensors\",\"c\":\"s2.safetensors\"}}",
         C, "b", "maps it to 's2.safetensors'"},
        {"dup_across.index.json",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1."
         "safetensors\",\"z\":\"s3.safetensors\"}}",
         C, "a", "is in shard 's3.safetensors'"},
        {"missing_shard.index.json", "{\"weight_map\":{\"a\":\"nope.safetensors\"}}",
         FLEXDIAG_ERR_NOT_FOUND, NULL, "nope.safetensors"},
        {"no_map.index.json", "{\"metadata\":{}}", C, NULL, "weight_map"},
        {"empty_map.index.json", "{\"weight_map\":{}}", C, NULL, "weight_map is empty"},
        {"map_value.index.json", "{\"weight_map\":{\"a\":1}}", C, "a", "plain file name"},
        {"not_json.index.json", "{\"weight_map\":", C, NULL, "not valid JSON"},
        {"dup_key.index.json",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1."
         "safetensors\"}}",
         C, NULL, "duplicate"},
        {"bad_shard.index.json", "{\"weight_map\":{\"x\":\"bad_json.safetensors\"}}", C, NULL,
         "bad_json.safetensors: header is not valid JSON"},
    };
    char *bad = tpath("bad_json.safetensors");
    write_st_raw(bad, "{\"x\":", 0);
    free(bad);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *p = tpath("%s", cases[i].file);
        assert_int_equal(tu_write_file(p, cases[i].json, strlen(cases[i].json)), 0);
        flexdiag_safetensors *st;
        flexdiag__err_clear();
        expect_err(flexdiag__st_open(p, &st), cases[i].want, cases[i].file, cases[i].tensor,
                   cases[i].phrase);
        assert_null(st);
        free(p);
    }
    flexdiag__err_clear();
}

static void test_folders(void **state) {
    (void)state;
    char *d1 = tpath("folder_index"), *d2 = tpath("folder_single"), *d3 = tpath("folder_empty");
    assert_int_equal(tu_system("mkdir -p '%s' '%s' '%s'", d1, d2, d3), 0);
    static const float v[2] = {5, 6};
    flexdiag_st_entry e = entry("w", FLEXDIAG_DTYPE_F32, v, 1, 2, 0);
    char *shard = tpath("folder_index/model-00001-of-00001.safetensors");
    char *index = tpath("folder_index/model.safetensors.index.json");
    char *single = tpath("folder_single/model.safetensors");
    const char *js = "{\"weight_map\":{\"w\":\"model-00001-of-00001.safetensors\"}}";
    assert_int_equal(flexdiag__st_write(shard, &e, 1), FLEXDIAG_OK);
    assert_int_equal(tu_write_file(index, js, strlen(js)), 0);
    assert_int_equal(flexdiag__st_write(single, &e, 1), FLEXDIAG_OK);
    flexdiag_safetensors *st;
    assert_int_equal(flexdiag__st_open(d1, &st), FLEXDIAG_OK);
    assert_non_null(strstr(flexdiag__st_file_path(st, 0), "model-00001-of-00001"));
    flexdiag__st_close(st);
    assert_int_equal(flexdiag__st_open(d2, &st), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_count(st), 1);
    flexdiag__st_close(st);
    flexdiag__err_clear();
    expect_err(flexdiag__st_open(d3, &st), FLEXDIAG_ERR_NOT_FOUND, "folder_empty", NULL,
               "neither model.safetensors.index.json nor model.safetensors");
    flexdiag__err_clear();
    char *missing = tpath("no_such.safetensors");
    expect_err(flexdiag__st_open(missing, &st), FLEXDIAG_ERR_NOT_FOUND, "no_such.safetensors", NULL,
               "No such file");
    flexdiag__err_clear();
    free(d1), free(d2), free(d3), free(shard), free(index), free(single), free(missing);
}

/* ---- writer ---- */

static int temp_files_left(void) {
    DIR *d = opendir(tmp);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += strstr(de->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static void test_writer(void **state) {
    (void)state;
    static const float v[4] = {1, 2, 3, 4};
    char *p = tpath("w.safetensors");
    flexdiag_st_entry dup[2] = {entry("x", FLEXDIAG_DTYPE_F32, v, 1, 2, 0),
                                entry("x", FLEXDIAG_DTYPE_F32, v, 1, 2, 0)};
    flexdiag__err_clear();
    expect_err(flexdiag__st_write(p, dup, 2), FLEXDIAG_ERR_INVALID_ARG, "w.safetensors", "x",
               "duplicate");
    flexdiag__err_clear();
    flexdiag_st_entry bad = entry("r", FLEXDIAG_DTYPE_F32, v, 9, 1, 1);
    expect_err(flexdiag__st_write(p, &bad, 1), FLEXDIAG_ERR_INVALID_ARG, "w.safetensors", "r",
               "rank");
    flexdiag__err_clear();
    bad = entry("n", FLEXDIAG_DTYPE_F32, NULL, 1, 2, 0);
    expect_err(flexdiag__st_write(p, &bad, 1), FLEXDIAG_ERR_INVALID_ARG, NULL, "n", "NULL data");
    flexdiag__err_clear();
    bad = entry("neg", FLEXDIAG_DTYPE_F32, v, 1, -2, 0);
    expect_err(flexdiag__st_write(p, &bad, 1), FLEXDIAG_ERR_INVALID_ARG, NULL, "neg", "negative");
    flexdiag__err_clear();
    char *nodir = tpath("no_dir/x.safetensors");
    flexdiag_st_entry ok1 = entry("x", FLEXDIAG_DTYPE_F32, v, 1, 4, 0);
    expect_err(flexdiag__st_write(nodir, &ok1, 1), FLEXDIAG_ERR_NOT_FOUND, "no_dir", NULL,
               "folder");
    flexdiag__err_clear();

    /* rewriting replaces the file atomically and leaves no temp file */
    flexdiag_st_entry ok2 = entry("y", FLEXDIAG_DTYPE_F32, v + 2, 1, 2, 0);
    assert_int_equal(flexdiag__st_write(p, &ok1, 1), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_write(p, &ok2, 1), FLEXDIAG_OK);
    assert_int_equal(temp_files_left(), 0);
    flexdiag_safetensors *st;
    assert_int_equal(flexdiag__st_open(p, &st), FLEXDIAG_OK);
    assert_int_equal(flexdiag__st_count(st), 1);
    float got[2];
    assert_int_equal(flexdiag__st_read_f32(st, flexdiag__st_find(st, "y"), got), FLEXDIAG_OK);
    assert_true(got[0] == 3 && got[1] == 4);
    flexdiag__st_close(st);
    assert_int_equal(flexdiag__dtype_parse("F8_E4M3"), FLEXDIAG_DTYPE_F8_E4M3);
    assert_int_equal(flexdiag__dtype_parse("F4"), -1);
    assert_int_equal(flexdiag__dtype_size(FLEXDIAG_DTYPE_I64), 8);
    free(p);
    free(nodir);
}

static int setup(void **state) {
    (void)state;
    tmp = tu_tempdir("format");
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
        cmocka_unit_test(test_large_chunked),
        cmocka_unit_test(test_corrupt_table),
        cmocka_unit_test(test_valid_handmade),
        cmocka_unit_test(test_entry_cap),
        cmocka_unit_test(test_truncated_files),
        cmocka_unit_test(test_truncated_after_open),
        cmocka_unit_test(test_index_good),
        cmocka_unit_test(test_index_errors),
        cmocka_unit_test(test_folders),
        cmocka_unit_test(test_writer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
