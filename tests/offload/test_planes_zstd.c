/*
 * test_planes_zstd.c - the byte-plane zstd codec of the disk tier (offload/planes_zstd.h): XXH64
 * against published vectors; round trips of bf16 weights, fp32, constant and random bytes at
 * every element size and at sizes that leave a one-element plane; every byte of an encoded chunk
 * flipped, every truncation, a wrong magic, version, element size or raw size: each a fault
 * with its offset, never a decode that passes; many chunks on a thread pool, with a corrupt
 * chunk's message naming the file and the byte offset in it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"
#include "flexdiag.h"
#include "offload/planes_zstd.h"
#include "util.h"

static void test_xxh64_vectors(void **state) {
    (void)state;
    assert_true(flexdiag__xxh64("", 0, 0) == 0xEF46DB3751D8E999ull);
    assert_true(flexdiag__xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5Bull);
    assert_true(flexdiag__xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ull);
    const char *s = "Nobody inspects the spammish repetition"; /* 39 bytes: the 32-byte lanes */
    assert_true(flexdiag__xxh64(s, strlen(s), 0) == 0xFBCEA83C8A378BF1ull);
}

/* n bytes of data of kind k: 0 bf16 N(0, 0.02²), 1 fp32 N(0, 1), 2 zeros, 3 random bytes. */
static uint8_t *make(int k, size_t n, uint64_t seed) {
    uint8_t *p = malloc(n + 8);
    tu_rng r;
    tu_rng_seed(&r, seed);
    if (k == 0) tu_fill_bf16(&r, (uint16_t *)p, (int64_t)(n + 1) / 2, 0.02f);
    else if (k == 1) tu_fill_f32(&r, (float *)p, (int64_t)(n + 3) / 4, 1.0f);
    else if (k == 2) memset(p, 0, n);
    else
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)tu_rng_u64(&r);
    return p;
}

/* Encode src (n bytes, elem) and decode it back: the same bytes; the chunk's length. */
static size_t round_trip(flexdiag_pz_enc *e, flexdiag_pz_dec *d, const uint8_t *src, size_t n,
                         int elem, uint8_t *chunk) {
    size_t len = 0;
    assert_int_equal(flexdiag__pz_encode(e, src, n, elem, chunk, flexdiag__pz_bound(n), &len), 0);
    assert_true(len >= FLEXDIAG_PZ_HDR_BYTES && len <= flexdiag__pz_bound(n));
    uint8_t *out = malloc(n);
    flexdiag_pz_fault f;
    assert_int_equal(flexdiag__pz_decode(d, chunk, len, out, n, elem, &f), FLEXDIAG_PZ_E_OK);
    assert_memory_equal(out, src, n);
    free(out);
    return len;
}

static void test_round_trips(void **state) {
    (void)state;
    enum { MAX = 1 << 20 };
    flexdiag_pz_enc *e;
    flexdiag_pz_dec *d;
    assert_int_equal(flexdiag__pz_enc_create(FLEXDIAG_PZ_LEVEL, MAX, &e), FLEXDIAG_OK);
    assert_int_equal(flexdiag__pz_dec_create(MAX, &d), FLEXDIAG_OK);
    uint8_t *chunk = malloc(flexdiag__pz_bound(MAX));
    static const size_t sizes[] = {8, 24, 4096, 65536 + 8, MAX};
    for (int k = 0; k < 4; k++)
        for (int elem = 1; elem <= FLEXDIAG_PZ_MAX_PLANES; elem *= 2)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                uint8_t *src = make(k, sizes[s], (uint64_t)(k * 100 + elem) + s);
                size_t len = round_trip(e, d, src, sizes[s], elem, chunk);
                if (k == 2 && sizes[s] >= 4096) /* zeros: every plane shrinks */
                    assert_true(len < sizes[s] / 16);
                if (k == 3) /* random bytes: every plane kept as it is */
                    assert_int_equal(len, flexdiag__pz_bound(sizes[s]));
                free(src);
            }
    /* bf16 weights: the high plane (sign, exponent) shrinks, the low one does not */
    uint8_t *w = make(0, MAX, 3);
    size_t len = round_trip(e, d, w, MAX, 2, chunk);
    assert_true(len < MAX * 85 / 100 && len > MAX / 2);
    /* a one-element plane, odd element counts */
    round_trip(e, d, w, 2, 2, chunk);
    round_trip(e, d, w, 6, 2, chunk);
    round_trip(e, d, w, 1, 1, chunk);
    free(w);
    free(chunk);
    flexdiag__pz_enc_destroy(e);
    flexdiag__pz_dec_destroy(d);
}

static void test_encode_refusals(void **state) {
    (void)state;
    flexdiag_pz_enc *e;
    assert_int_equal(flexdiag__pz_enc_create(1, 4096, &e), FLEXDIAG_OK);
    uint8_t src[4096] = {0}, dst[4096 + 64];
    size_t len;
    assert_int_equal(flexdiag__pz_encode(e, src, 4095, 2, dst, sizeof dst, &len), -1); /* elem */
    assert_int_equal(flexdiag__pz_encode(e, src, 0, 2, dst, sizeof dst, &len), -1);
    assert_int_equal(flexdiag__pz_encode(e, src, 4096, 9, dst, sizeof dst, &len), -1);
    assert_int_equal(flexdiag__pz_encode(e, src, 4096, 2, dst, 4096, &len), -1); /* cap */
    assert_int_equal(flexdiag__pz_encode(e, dst, 4098, 2, dst, sizeof dst, &len), -1); /* max */
    flexdiag__pz_enc_destroy(e);
}

/* A chunk of 2048 bf16 weights whose planes compress, and one of random bytes kept as they are:
 * every flipped byte and every truncation is a fault at an offset inside the chunk. */
static void faults_of(const uint8_t *src, size_t n, int elem) {
    flexdiag_pz_enc *e;
    flexdiag_pz_dec *d;
    assert_int_equal(flexdiag__pz_enc_create(1, n, &e), FLEXDIAG_OK);
    assert_int_equal(flexdiag__pz_dec_create(n, &d), FLEXDIAG_OK);
    size_t cap = flexdiag__pz_bound(n), len;
    uint8_t *c = malloc(cap), *bad = malloc(cap), *out = malloc(n);
    assert_int_equal(flexdiag__pz_encode(e, src, n, elem, c, cap, &len), 0);
    flexdiag_pz_fault f;
    char why[256];
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit += 7) {
            memcpy(bad, c, len);
            bad[i] ^= (uint8_t)(1u << bit);
            flexdiag_pz_code r = flexdiag__pz_decode(d, bad, len, out, n, elem, &f);
            if (r == FLEXDIAG_PZ_E_OK)
                fail_msg("byte %zu bit %d flipped: decoded without a fault", i, bit);
            assert_int_equal(f.code, r);
            assert_true(f.at <= len);
            assert_non_null(flexdiag__pz_fault_str(&f, why, sizeof why));
        }
    for (size_t k = 0; k < len; k++) {
        flexdiag_pz_code r = flexdiag__pz_decode(d, c, k, out, n, elem, &f);
        assert_int_equal(r, FLEXDIAG_PZ_E_TRUNCATED);
        assert_int_equal(f.at, k);
    }
    /* a byte past the chunk (the index says it is longer) */
    assert_int_equal(flexdiag__pz_decode(d, c, len + 1, out, n, elem, &f), FLEXDIAG_PZ_E_HEADER);
    free(c);
    free(bad);
    free(out);
    flexdiag__pz_enc_destroy(e);
    flexdiag__pz_dec_destroy(d);
}

static void test_flips_and_truncations(void **state) {
    (void)state;
    uint8_t *w = make(0, 4096, 5), *r = make(3, 1024, 6), *z = make(2, 4096, 7);
    faults_of(w, 4096, 2);
    faults_of(r, 1024, 4);
    faults_of(z, 4096, 1);
    free(w);
    free(r);
    free(z);
}

/* Wrong magic, version, element size, raw size: each named. */
static void test_header_faults(void **state) {
    (void)state;
    enum { N = 8192 };
    uint8_t *w = make(0, N, 9), c[N + 64], out[N];
    flexdiag_pz_enc *e;
    flexdiag_pz_dec *d;
    assert_int_equal(flexdiag__pz_enc_create(1, N, &e), FLEXDIAG_OK);
    assert_int_equal(flexdiag__pz_dec_create(N, &d), FLEXDIAG_OK);
    size_t len;
    assert_int_equal(flexdiag__pz_encode(e, w, N, 2, c, sizeof c, &len), 0);
    flexdiag_pz_fault f;
    char why[256];
    assert_int_equal(flexdiag__pz_decode(d, c, len, out, N, 4, &f), FLEXDIAG_PZ_E_HEADER);
    assert_non_null(strstr(flexdiag__pz_fault_str(&f, why, sizeof why), "element size"));
    assert_int_equal(flexdiag__pz_decode(d, c, len, out, N - 2, 2, &f), FLEXDIAG_PZ_E_HEADER);
    assert_non_null(strstr(flexdiag__pz_fault_str(&f, why, sizeof why), "raw bytes"));
    assert_int_equal(f.at, 8);
    c[5] = 7; /* version 0x0701 */
    assert_int_equal(flexdiag__pz_decode(d, c, len, out, N, 2, &f), FLEXDIAG_PZ_E_VERSION);
    memcpy(c, "PK\3\4", 4);
    assert_int_equal(flexdiag__pz_decode(d, c, len, out, N, 2, &f), FLEXDIAG_PZ_E_MAGIC);
    assert_int_equal(f.at, 0);
    assert_non_null(strstr(flexdiag__pz_fault_str(&f, why, sizeof why), "wrong magic 0x04034b50"));
    assert_int_equal(flexdiag__pz_decode(d, c, 2, out, N, 2, &f), FLEXDIAG_PZ_E_TRUNCATED);
    free(w);
    flexdiag__pz_enc_destroy(e);
    flexdiag__pz_dec_destroy(d);
}

/* 300 KiB + 6 bytes of bf16 weights in 16 KiB chunks on two threads: the same bytes back; one
 * byte of chunk 7 flipped is a CHECKSUM status naming the file and the flipped chunk's checksum
 * field at its byte offset in the file (the buffer said to lie at byte 1 MiB). */
static void test_many_chunks(void **state) {
    (void)state;
    const size_t raw = 300 * 1024 + 6, chunk = 16384;
    uint8_t *w = make(0, raw, 11), *out = malloc(raw);
    size_t cap = flexdiag__pz_many_bound(raw, chunk), nc = flexdiag__pz_chunks(raw, chunk);
    uint8_t *dst = malloc(cap);
    uint64_t *offs = calloc(nc + 1, sizeof *offs);
    flexdiag_pz_many *enc, *dec;
    assert_int_equal(flexdiag__pz_many_create(2, chunk, 1, &enc), FLEXDIAG_OK);
    assert_int_equal(flexdiag__pz_many_create(2, chunk, 0, &dec), FLEXDIAG_OK);
    assert_int_equal(flexdiag__pz_many_encode(enc, w, raw, 2, dst, cap, offs), FLEXDIAG_OK);
    assert_true(offs[nc] < raw * 85 / 100);
    for (size_t i = 0; i < nc; i++) assert_true(offs[i] < offs[i + 1]);
    assert_int_equal(flexdiag__pz_many_decode(dec, dst, offs, out, raw, 2, "f.bin", 0, "weights"),
                     FLEXDIAG_OK);
    assert_memory_equal(out, w, raw);
    /* refusals: elements that do not divide the size, a buffer below the bound */
    assert_int_equal(flexdiag__pz_many_encode(enc, w, raw, 4, dst, cap, offs),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(flexdiag__pz_many_encode(enc, w, raw, 2, dst, cap - 1, offs),
                     FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(flexdiag__pz_many_encode(enc, w, raw, 2, dst, cap, offs), FLEXDIAG_OK);
    flexdiag__err_clear(); /* the refusals' messages */
    dst[offs[7] + 200] ^= 0x10;
    dst[offs[9] + 100] ^= 0x10; /* a later chunk too: the lowest one is named */
    assert_int_equal(flexdiag__pz_many_decode(dec, dst, offs, out, raw, 2, "f.bin", 1 << 20,
                                              "layer 3's disk weights"),
                     FLEXDIAG_ERR_CHECKSUM);
    char want[128];
    snprintf(want, sizeof want, "f.bin: layer 3's disk weights: corrupt zstd chunk at byte %llu",
             (unsigned long long)((1 << 20) + offs[7] + 48));
    const char *msg = flexdiag_last_error(NULL);
    if (!strstr(msg, want)) fail_msg("message '%s' lacks '%s'", msg, want);
    assert_non_null(strstr(msg, "checksum mismatch"));
    flexdiag__pz_many_destroy(enc);
    flexdiag__pz_many_destroy(dec);
    free(w);
    free(out);
    free(dst);
    free(offs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xxh64_vectors),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_encode_refusals),
        cmocka_unit_test(test_flips_and_truncations),
        cmocka_unit_test(test_header_faults),
        cmocka_unit_test(test_many_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
