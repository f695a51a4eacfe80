/*
 * kvp_calib.c - the calibration table of SSD and HACK (docs/policies.md §7.2) and its file:
 * allocation, the version-1 writer, and the reader that checks every field before it trusts
 * one (kvp_calib.h has the layout). A file is read whole, then parsed from memory, so the sizes
 * it claims are checked against the bytes it has before anything is allocated from them.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "policy/kvp_calib.h"

static const char calib_magic[8] = {'F', 'D', 'X', 'C', 'A', 'L', 'I', 'B'};

#define CALIB_MAX_FILE ((uint64_t)1 << 32) /* 4 GiB: far above any model's table */
#define CALIB_MAX_DIM 32767                /* layers, heads, L_dec (lags are int16) */
#define CALIB_SUM_TOL 1e-3                 /* a profile row sums to 1 within this */

uint64_t flexdiag__fnv1a64(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ---- little-endian fields ---- */

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- the table ---- */

/* Payload bytes (P then V) of a shape, 0 on overflow. */
static uint64_t payload_bytes(int32_t n_layers, int32_t h_q, int32_t l_dec) {
    uint64_t heads, p, pb;
    if (!flexdiag__mul_ok((uint64_t)n_layers, (uint64_t)h_q, &heads) ||
        !flexdiag__mul_ok(heads, (uint64_t)l_dec, &p) || !flexdiag__mul_ok(p, 4, &pb))
        return 0;
    return pb + heads * 8;
}

flexdiag_status flexdiag__kvp_calib_alloc(int32_t n_layers, int32_t h_q, int32_t h_kv,
                                          int32_t l_dec, flexdiag_kvp_calib **out) {
    *out = NULL;
    uint64_t pay = payload_bytes(n_layers, h_q, l_dec);
    if (n_layers < 1 || h_q < 1 || h_kv < 1 || l_dec < 1 || pay == 0 || pay > CALIB_MAX_FILE)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "calibration table: bad shape %d layers "
                             "x %d heads x %d lags", (int)n_layers, (int)h_q, (int)l_dec);
    size_t heads = (size_t)n_layers * (size_t)h_q, head = (sizeof(flexdiag_kvp_calib) + 7) & ~7u;
    flexdiag_kvp_calib *t = calloc(1, head + heads * 8 + heads * (size_t)l_dec * 4);
    if (!t)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "calibration table: no host memory for "
                             "%llu bytes", (unsigned long long)pay);
    t->V = (double *)(void *)((char *)t + head);
    t->P = (float *)(void *)(t->V + heads);
    t->n_layers = n_layers, t->h_q = h_q, t->h_kv = h_kv, t->l_dec = l_dec;
    *out = t;
    return FLEXDIAG_OK;
}

void flexdiag__kvp_calib_free(flexdiag_kvp_calib *tab) { free(tab); }

/* ---- writing ---- */

static void encode_header(const flexdiag_kvp_calib *t, unsigned char *h) {
    memset(h, 0, FLEXDIAG_CALIB_HEADER);
    memcpy(h, calib_magic, 8);
    put32(h + 8, FLEXDIAG_CALIB_VERSION);
    put32(h + 12, FLEXDIAG_CALIB_HEADER);
    put64(h + 16, t->config_hash);
    put64(h + 24, t->prompts_hash);
    put64(h + 32, t->seed);
    put64(h + 40, t->pairs);
    const int32_t f[8] = {t->w_s, t->l_dec, t->n_layers, t->h_q, t->h_kv, t->t0, t->t_end,
                          t->n_cal};
    for (int i = 0; i < 8; i++) put32(h + 48 + 4 * i, (uint32_t)f[i]);
    memcpy(h + 80, t->backend, strnlen(t->backend, FLEXDIAG_CALIB_BACKEND - 1));
}

/* The whole file image (malloc'ed) and its size. */
static unsigned char *encode(const flexdiag_kvp_calib *t, size_t *n) {
    size_t heads = (size_t)t->n_layers * (size_t)t->h_q, np = heads * (size_t)t->l_dec;
    *n = FLEXDIAG_CALIB_HEADER + np * 4 + heads * 8 + 8;
    unsigned char *b = malloc(*n), *p = b + FLEXDIAG_CALIB_HEADER;
    if (!b) return NULL;
    encode_header(t, b);
    for (size_t i = 0; i < np; i++, p += 4) {
        uint32_t u;
        memcpy(&u, &t->P[i], 4);
        put32(p, u);
    }
    for (size_t i = 0; i < heads; i++, p += 8) {
        uint64_t u;
        memcpy(&u, &t->V[i], 8);
        put64(p, u);
    }
    put64(p, flexdiag__fnv1a64(FLEXDIAG_FNV_BASIS, b, *n - 8));
    return b;
}

flexdiag_status flexdiag__kvp_calib_write(const char *path, const flexdiag_kvp_calib *tab) {
    size_t n;
    unsigned char *b = encode(tab, &n);
    if (!b) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no host memory to write the "
                                 "calibration table", path);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    int e = errno;
    if (f && fclose(f) != 0) ok = 0, e = errno;
    free(b);
    if (!ok)
        return flexdiag__err(FLEXDIAG_ERR_IO, "%s: cannot write the calibration table: %s", path,
                             strerror(e));
    return FLEXDIAG_OK;
}

/* ---- reading ---- */

/* The header's shape and identity into t (no arrays); a message names what is out of range. */
static flexdiag_status decode_header(const unsigned char *h, const char *name,
                                     flexdiag_kvp_calib *t) {
    if (memcmp(h, calib_magic, 8) != 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: not a flexdiag calibration table "
                             "(no FDXCALIB magic; make one with flexdiag-bench calibrate)", name);
    uint32_t ver = get32(h + 8), hb = get32(h + 12);
    if (ver != FLEXDIAG_CALIB_VERSION)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: calibration table format version %u "
                             "is not supported (this build reads version %u)", name, ver,
                             FLEXDIAG_CALIB_VERSION);
    if (hb != FLEXDIAG_CALIB_HEADER)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: calibration table header of %u "
                             "bytes, version 1 has %d", name, hb, FLEXDIAG_CALIB_HEADER);
    t->config_hash = get64(h + 16), t->prompts_hash = get64(h + 24);
    t->seed = get64(h + 32), t->pairs = get64(h + 40);
    int32_t *f[8] = {&t->w_s, &t->l_dec, &t->n_layers, &t->h_q, &t->h_kv, &t->t0, &t->t_end,
                     &t->n_cal};
    for (int i = 0; i < 8; i++) *f[i] = (int32_t)get32(h + 48 + 4 * i);
    memcpy(t->backend, h + 80, FLEXDIAG_CALIB_BACKEND);
    return FLEXDIAG_OK;
}

/* The header's values against each other ("" when they hold); why names the first bad one. */
static void check_shape(const flexdiag_kvp_calib *t, const unsigned char *h, char *why,
                        size_t n) {
    if (t->n_layers < 1 || t->n_layers > CALIB_MAX_DIM)
        snprintf(why, n, "layers %d not in [1, %d]", (int)t->n_layers, CALIB_MAX_DIM);
    else if (t->h_kv < 1 || t->h_q < t->h_kv || t->h_q > CALIB_MAX_DIM || t->h_q % t->h_kv)
        snprintf(why, n, "h_q %d, h_kv %d: need 1 <= h_kv <= h_q <= %d, h_q a multiple of h_kv",
                 (int)t->h_q, (int)t->h_kv, CALIB_MAX_DIM);
    else if (t->l_dec < 2 || t->l_dec > CALIB_MAX_DIM)
        snprintf(why, n, "L_dec %d not in [2, %d]", (int)t->l_dec, CALIB_MAX_DIM);
    else if (t->w_s < 1 || t->l_dec % t->w_s)
        snprintf(why, n, "W_s %d does not divide L_dec %d into whole lines", (int)t->w_s,
                 (int)t->l_dec);
    else if (t->t0 < 1 || t->t_end <= t->t0 || t->t_end > t->l_dec)
        snprintf(why, n, "recorded steps [%d, %d) not inside [1, L_dec %d]", (int)t->t0,
                 (int)t->t_end, (int)t->l_dec);
    else if (t->n_cal < 1 || t->pairs < 1)
        snprintf(why, n, "n_cal %d and recorded pairs %llu must be >= 1", (int)t->n_cal,
                 (unsigned long long)t->pairs);
    else if (!memchr(t->backend, 0, FLEXDIAG_CALIB_BACKEND))
        snprintf(why, n, "the backend name is not NUL-terminated");
    else {
        for (int i = 96; i < FLEXDIAG_CALIB_HEADER && !why[0]; i++)
            if (h[i]) snprintf(why, n, "reserved header byte %d is not zero", i);
    }
}

/* P and V into t from the payload p, each checked. */
static flexdiag_status decode_arrays(const unsigned char *p, const char *name,
                                     flexdiag_kvp_calib *t) {
    size_t heads = (size_t)t->n_layers * (size_t)t->h_q, L = (size_t)t->l_dec;
    for (size_t r = 0; r < heads; r++) {
        double sum = 0;
        for (size_t l = 0; l < L; l++, p += 4) {
            uint32_t u = get32(p);
            float v;
            memcpy(&v, &u, 4);
            if (!(v >= 0.0f && v <= 1.0f))
                return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: lag profile of layer %zu "
                                     "head %zu at lag %zu is %g, not a probability", name,
                                     r / (size_t)t->h_q, r % (size_t)t->h_q, l, (double)v);
            t->P[r * L + l] = v;
            sum += v;
        }
        if (fabs(sum - 1.0) > CALIB_SUM_TOL)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: lag profile of layer %zu head "
                                 "%zu sums to %g, not 1", name, r / (size_t)t->h_q,
                                 r % (size_t)t->h_q, sum);
    }
    for (size_t r = 0; r < heads; r++, p += 8) {
        uint64_t u = get64(p);
        memcpy(&t->V[r], &u, 8);
        if (!(t->V[r] >= 0.0 && isfinite(t->V[r])))
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: column variance of layer %zu "
                                 "head %zu is %g, not a finite value >= 0", name,
                                 r / (size_t)t->h_q, r % (size_t)t->h_q, t->V[r]);
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__kvp_calib_parse(const void *data, size_t n, const char *name,
                                          flexdiag_kvp_calib **out) {
    *out = NULL;
    const unsigned char *b = data;
    if (n < FLEXDIAG_CALIB_HEADER + 8)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: %zu bytes is too short for a "
                             "calibration table (header %d + checksum 8)", name, n,
                             FLEXDIAG_CALIB_HEADER);
    flexdiag_kvp_calib h;
    memset(&h, 0, sizeof h);
    FLEXDIAG_TRY(decode_header(b, name, &h));
    char why[160] = "";
    check_shape(&h, b, why, sizeof why);
    if (why[0])
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: calibration table header: %s", name,
                             why);
    uint64_t want = FLEXDIAG_CALIB_HEADER + payload_bytes(h.n_layers, h.h_q, h.l_dec) + 8;
    if ((uint64_t)n != want)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: calibration table is %zu bytes, "
                             "its header (%d layers x %d heads x %d lags) needs %llu", name, n,
                             (int)h.n_layers, (int)h.h_q, (int)h.l_dec, (unsigned long long)want);
    if (get64(b + n - 8) != flexdiag__fnv1a64(FLEXDIAG_FNV_BASIS, b, n - 8))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: calibration table checksum does not "
                             "match its contents (the file is damaged)", name);
    flexdiag_kvp_calib *t;
    FLEXDIAG_TRY(flexdiag__kvp_calib_alloc(h.n_layers, h.h_q, h.h_kv, h.l_dec, &t));
    float *P = t->P;
    double *V = t->V;
    *t = h;
    t->P = P, t->V = V;
    flexdiag_status st = decode_arrays(b + FLEXDIAG_CALIB_HEADER, name, t);
    if (st != FLEXDIAG_OK) {
        flexdiag__kvp_calib_free(t);
        return st;
    }
    *out = t;
    return FLEXDIAG_OK;
}

/* The whole file into memory (malloc'ed). */
static flexdiag_status slurp(const char *path, unsigned char **data, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return flexdiag__err(errno == ENOENT ? FLEXDIAG_ERR_NOT_FOUND : FLEXDIAG_ERR_IO,
                             "%s: cannot open the calibration table: %s", path, strerror(errno));
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (sz < 0 || (uint64_t)sz > CALIB_MAX_FILE || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return flexdiag__err(sz < 0 ? FLEXDIAG_ERR_IO : FLEXDIAG_ERR_INVALID_ARG, "%s: cannot "
                             "size the calibration table (not a regular file, or over 4 GiB)",
                             path);
    }
    *data = malloc(sz > 0 ? (size_t)sz : 1);
    size_t got = *data ? fread(*data, 1, (size_t)sz, f) : 0;
    fclose(f);
    if (!*data || got != (size_t)sz) {
        free(*data);
        *data = NULL;
        return flexdiag__err(FLEXDIAG_ERR_IO, "%s: cannot read the calibration table", path);
    }
    *n = (size_t)sz;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__kvp_calib_read(const char *path, flexdiag_kvp_calib **out) {
    *out = NULL;
    unsigned char *data = NULL;
    size_t n = 0;
    FLEXDIAG_TRY(slurp(path, &data, &n));
    flexdiag_status st = flexdiag__kvp_calib_parse(data, n, path, out);
    free(data);
    return st;
}
