/*
 * fuzz_calib.c - libFuzzer target for the reader of calibration tables (policy/kvp_calib.c
 * flexdiag__kvp_calib_read), the file `--calib` names for the ssd and hack policies. Each input
 * is written into a private temp folder and read through the path API a user's file takes, twice:
 * as it is, and with its last 8 bytes replaced by the checksum of the bytes before them, so
 * mutations also reach the checks behind the checksum (shape, size, profiles, variances).
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - a failed read is FLEXDIAG_ERR_INVALID_ARG, leaves *out NULL and its message names the
 *     file;
 *   - a successful read has a header that holds (checked here from the bytes: magic, version 1,
 *     128-byte header, layers / heads / L_dec / W_s / recorded steps in range, zero reserved
 *     bytes), a size of exactly header + P + V + checksum, a checksum that holds, P rows of
 *     probabilities summing to 1 within 1e-3 and finite variances >= 0, the arrays equal to
 *     the input's bytes;
 *   - what was read writes (flexdiag__kvp_calib_write) and reads back identically.
 *
 * The same entry point is replayed over tests/fuzz/corpus/calib by replay.c in the 'format'
 * suite.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "fuzz_util.h"
#include "policy/kvp_calib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dir, *in_path, *out_path;

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int32_t le32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* The header and size, from the bytes alone. */
static void check_bytes(const flexdiag_kvp_calib *t, const uint8_t *d, size_t n) {
    FUZZ_CHECK(n >= 136 && !memcmp(d, "FDXCALIB", 8), "accepted without the magic");
    FUZZ_CHECK(le32(d + 8) == 1 && le32(d + 12) == 128, "version / header size");
    int32_t w = le32(d + 48), ld = le32(d + 52), L = le32(d + 56), hq = le32(d + 60);
    int32_t hkv = le32(d + 64), t0 = le32(d + 68), te = le32(d + 72);
    FUZZ_CHECK(w == t->w_s && ld == t->l_dec && L == t->n_layers && hq == t->h_q &&
                   hkv == t->h_kv && t0 == t->t0 && te == t->t_end,
               "header fields");
    FUZZ_CHECK(L >= 1 && hkv >= 1 && hq >= hkv && hq % hkv == 0 && ld >= 2 && w >= 1 &&
                   ld % w == 0 && t0 >= 1 && te > t0 && te <= ld && le32(d + 76) >= 1 &&
                   le64(d + 40) >= 1,
               "accepted a header out of range");
    for (int i = 96; i < 128; i++) FUZZ_CHECK(d[i] == 0, "accepted a reserved byte");
    uint64_t heads = (uint64_t)L * (uint64_t)hq;
    FUZZ_CHECK(n == 128 + heads * (uint64_t)ld * 4 + heads * 8 + 8, "size");
    FUZZ_CHECK(le64(d + n - 8) == flexdiag__fnv1a64(FLEXDIAG_FNV_BASIS, d, n - 8), "checksum");
    FUZZ_CHECK(!memcmp(t->P, d + 128, heads * (uint64_t)ld * 4), "P = the payload");
    FUZZ_CHECK(!memcmp(t->V, d + 128 + heads * (uint64_t)ld * 4, heads * 8), "V = the payload");
}

static void check_values(const flexdiag_kvp_calib *t) {
    size_t heads = (size_t)t->n_layers * (size_t)t->h_q, L = (size_t)t->l_dec;
    for (size_t r = 0; r < heads; r++) {
        double s = 0;
        for (size_t l = 0; l < L; l++) {
            float p = t->P[r * L + l];
            FUZZ_CHECK(p >= 0.0f && p <= 1.0f, "accepted a profile entry outside [0, 1]");
            s += p;
        }
        FUZZ_CHECK(fabs(s - 1.0) <= 1e-3, "accepted a profile that is not a distribution");
        FUZZ_CHECK(t->V[r] >= 0.0 && isfinite(t->V[r]), "accepted a bad variance");
    }
}

/* Write t, read it back: the same table. */
static void check_round_trip(const flexdiag_kvp_calib *t) {
    flexdiag_kvp_calib *b = NULL;
    FUZZ_CHECK(flexdiag__kvp_calib_write(out_path, t) == FLEXDIAG_OK, flexdiag__err_msg());
    FUZZ_CHECK(flexdiag__kvp_calib_read(out_path, &b) == FLEXDIAG_OK, flexdiag__err_msg());
    size_t heads = (size_t)t->n_layers * (size_t)t->h_q;
    FUZZ_CHECK(b->config_hash == t->config_hash && b->prompts_hash == t->prompts_hash &&
                   b->seed == t->seed && b->pairs == t->pairs && b->n_cal == t->n_cal &&
                   !strcmp(b->backend, t->backend),
               "round trip identity");
    FUZZ_CHECK(!memcmp(b->P, t->P, heads * (size_t)t->l_dec * 4) &&
                   !memcmp(b->V, t->V, heads * 8),
               "round trip arrays");
    flexdiag__kvp_calib_free(b);
}

static void one(const uint8_t *d, size_t n) {
    fuzz_write(in_path, d, n);
    flexdiag_kvp_calib *t = (flexdiag_kvp_calib *)&t;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__kvp_calib_read(in_path, &t);
    if (st != FLEXDIAG_OK) {
        FUZZ_CHECK(st == FLEXDIAG_ERR_INVALID_ARG, flexdiag__err_msg());
        FUZZ_CHECK(t == NULL, "a failed read left a table");
        FUZZ_CHECK(strstr(flexdiag__err_msg(), in_path) != NULL, flexdiag__err_msg());
        return;
    }
    check_bytes(t, d, n);
    check_values(t);
    check_round_trip(t);
    flexdiag__kvp_calib_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) {
        dir = fuzz_tempdir("fuzz-calib");
        in_path = fuzz_path(dir, "t.calib");
        out_path = fuzz_path(dir, "r.calib");
    }
    one(data, size);
    if (size < 8) return 0;
    uint8_t *fixed = malloc(size);
    memcpy(fixed, data, size);
    uint64_t h = flexdiag__fnv1a64(FLEXDIAG_FNV_BASIS, fixed, size - 8);
    for (int i = 0; i < 8; i++) fixed[size - 8 + i] = (uint8_t)(h >> (8 * i));
    one(fixed, size);
    free(fixed);
    return 0;
}
