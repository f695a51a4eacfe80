/*
 * planes_zstd.c - the byte-plane zstd chunk codec (planes_zstd.h): XXH64, plane split and
 * merge, one chunk's encode and decode with its checks, and a buffer cut into chunks coded in
 * parallel on a thread pool.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "base/core.h"
#include "base/thread_pool.h"
#include "offload/planes_zstd.h"

/* ---- XXH64 (the reference algorithm) ---- */

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t xround(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }

static uint64_t xmerge(uint64_t h, uint64_t v) { return (h ^ xround(0, v)) * P1 + P4; }

uint64_t flexdiag__xxh64(const void *data, size_t n, uint64_t seed) {
    const uint8_t *p = data, *end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        for (; end - p >= 32; p += 32) {
            v1 = xround(v1, rd64(p));
            v2 = xround(v2, rd64(p + 8));
            v3 = xround(v3, rd64(p + 16));
            v4 = xround(v4, rd64(p + 24));
        }
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = xmerge(xmerge(xmerge(xmerge(h, v1), v2), v3), v4);
    } else {
        h = seed + P5;
    }
    h += n;
    for (; end - p >= 8; p += 8) h = rotl(h ^ xround(0, rd64(p)), 27) * P1 + P4;
    if (end - p >= 4) {
        h = rotl(h ^ (uint64_t)rd32(p) * P1, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl(h ^ *p * P5, 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    return h ^ (h >> 32);
}

/* ---- header ---- */

enum { H_MAGIC = 0, H_VERSION = 4, H_ELEM = 6, H_STORED = 7, H_RAW = 8, H_PAYLOAD = 12,
       H_PLANES = 16, H_SUM = 48, H_RESERVED = 56 };

static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The checksum of a chunk: XXH64 of its header (checksum field zeroed) seeded with the XXH64 of
 * its payload. */
static uint64_t chunk_sum(const uint8_t *hdr, const uint8_t *payload, size_t n) {
    uint8_t h[FLEXDIAG_PZ_HDR_BYTES];
    memcpy(h, hdr, sizeof h);
    wr64(h + H_SUM, 0);
    return flexdiag__xxh64(h, sizeof h, flexdiag__xxh64(payload, n, 0));
}

/* ---- planes ---- */

/* Byte b of every element of src into plane b of dst (planes of m bytes each). */
static void split(uint8_t *dst, const uint8_t *src, size_t m, int elem) {
    if (elem == 2) {
        uint8_t *lo = dst, *hi = dst + m;
        for (size_t i = 0; i < m; i++) {
            lo[i] = src[2 * i];
            hi[i] = src[2 * i + 1];
        }
        return;
    }
    for (int b = 0; b < elem; b++)
        for (size_t i = 0; i < m; i++) dst[(size_t)b * m + i] = src[i * (size_t)elem + b];
}

/* The inverse of split. */
static void merge(uint8_t *dst, const uint8_t *src, size_t m, int elem) {
    if (elem == 2) {
        const uint8_t *lo = src, *hi = src + m;
        for (size_t i = 0; i < m; i++) {
            dst[2 * i] = lo[i];
            dst[2 * i + 1] = hi[i];
        }
        return;
    }
    for (int b = 0; b < elem; b++)
        for (size_t i = 0; i < m; i++) dst[i * (size_t)elem + b] = src[(size_t)b * m + i];
}

/* ---- encoder ---- */

struct flexdiag_pz_enc {
    ZSTD_CCtx *cctx;
    int level;
    size_t max_raw;
    uint8_t *planes; /* max_raw bytes */
};

flexdiag_status flexdiag__pz_enc_create(int level, size_t max_raw, flexdiag_pz_enc **out) {
    *out = NULL;
    flexdiag_pz_enc *e = calloc(1, sizeof *e);
    if (e) {
        e->cctx = ZSTD_createCCtx();
        e->planes = malloc(max_raw ? max_raw : 1);
    }
    if (!e || !e->cctx || !e->planes) {
        flexdiag__pz_enc_destroy(e);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "zstd encoder: out of host memory");
    }
    e->level = level;
    e->max_raw = max_raw;
    *out = e;
    return FLEXDIAG_OK;
}

void flexdiag__pz_enc_destroy(flexdiag_pz_enc *e) {
    if (!e) return;
    ZSTD_freeCCtx(e->cctx);
    free(e->planes);
    free(e);
}

int flexdiag__pz_encode(flexdiag_pz_enc *e, const void *src, size_t n, int elem, void *dst,
                        size_t cap, size_t *len) {
    if (elem < 1 || elem > FLEXDIAG_PZ_MAX_PLANES || n == 0 || n > e->max_raw ||
        n % (size_t)elem || n > UINT32_MAX || cap < flexdiag__pz_bound(n))
        return -1;
    size_t m = n / (size_t)elem;
    split(e->planes, src, m, elem);
    uint8_t *h = dst, *at = h + FLEXDIAG_PZ_HDR_BYTES;
    memset(h, 0, FLEXDIAG_PZ_HDR_BYTES);
    uint8_t stored = 0;
    for (int b = 0; b < elem; b++) {
        const uint8_t *plane = e->planes + (size_t)b * m;
        /* room for one byte less than the plane: zstd succeeds only when it shrinks it */
        size_t r = m > 1 ? ZSTD_compressCCtx(e->cctx, at, m - 1, plane, m, e->level) : 0;
        if (m <= 1 || ZSTD_isError(r)) {
            memcpy(at, plane, m);
            r = m;
            stored |= (uint8_t)(1u << b);
        }
        wr32(h + H_PLANES + 4 * b, (uint32_t)r);
        at += r;
    }
    size_t payload = (size_t)(at - h) - FLEXDIAG_PZ_HDR_BYTES;
    wr32(h + H_MAGIC, FLEXDIAG_PZ_MAGIC);
    wr16(h + H_VERSION, FLEXDIAG_PZ_VERSION);
    h[H_ELEM] = (uint8_t)elem;
    h[H_STORED] = stored;
    wr32(h + H_RAW, (uint32_t)n);
    wr32(h + H_PAYLOAD, (uint32_t)payload);
    wr64(h + H_SUM, chunk_sum(h, h + FLEXDIAG_PZ_HDR_BYTES, payload));
    *len = FLEXDIAG_PZ_HDR_BYTES + payload;
    return 0;
}

/* ---- decoder ---- */

struct flexdiag_pz_dec {
    ZSTD_DCtx *dctx;
    size_t max_raw;
    uint8_t *planes; /* max_raw bytes */
};

flexdiag_status flexdiag__pz_dec_create(size_t max_raw, flexdiag_pz_dec **out) {
    *out = NULL;
    flexdiag_pz_dec *d = calloc(1, sizeof *d);
    if (d) {
        d->dctx = ZSTD_createDCtx();
        d->planes = malloc(max_raw ? max_raw : 1);
    }
    if (!d || !d->dctx || !d->planes) {
        flexdiag__pz_dec_destroy(d);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "zstd decoder: out of host memory");
    }
    d->max_raw = max_raw;
    *out = d;
    return FLEXDIAG_OK;
}

void flexdiag__pz_dec_destroy(flexdiag_pz_dec *d) {
    if (!d) return;
    ZSTD_freeDCtx(d->dctx);
    free(d->planes);
    free(d);
}

static flexdiag_pz_code fault(flexdiag_pz_fault *f, flexdiag_pz_code code, uint64_t at,
                              uint64_t want, uint64_t got, const char *what) {
    *f = (flexdiag_pz_fault){code, at, want, got, what};
    return code;
}

/* The header of a chunk of n bytes against the caller's raw size and element size, and its
 * plane lengths against each other (the checksum comes after). */
static flexdiag_pz_code check_header(const uint8_t *h, size_t n, size_t raw, int elem,
                                     flexdiag_pz_fault *f) {
    if (n < 4) return fault(f, FLEXDIAG_PZ_E_TRUNCATED, n, FLEXDIAG_PZ_HDR_BYTES, n, "header");
    if (rd32(h + H_MAGIC) != FLEXDIAG_PZ_MAGIC)
        return fault(f, FLEXDIAG_PZ_E_MAGIC, H_MAGIC, FLEXDIAG_PZ_MAGIC, rd32(h + H_MAGIC), "magic");
    if (n < FLEXDIAG_PZ_HDR_BYTES)
        return fault(f, FLEXDIAG_PZ_E_TRUNCATED, n, FLEXDIAG_PZ_HDR_BYTES, n, "header");
    if (rd16(h + H_VERSION) != FLEXDIAG_PZ_VERSION)
        return fault(f, FLEXDIAG_PZ_E_VERSION, H_VERSION, FLEXDIAG_PZ_VERSION,
                     rd16(h + H_VERSION), "version");
    if (h[H_ELEM] != elem)
        return fault(f, FLEXDIAG_PZ_E_HEADER, H_ELEM, (uint64_t)elem, h[H_ELEM], "element size");
    if (rd32(h + H_RAW) != raw)
        return fault(f, FLEXDIAG_PZ_E_HEADER, H_RAW, raw, rd32(h + H_RAW), "raw bytes");
    if (h[H_STORED] >> elem)
        return fault(f, FLEXDIAG_PZ_E_HEADER, H_STORED, 0, h[H_STORED] >> elem, "stored planes");
    size_t m = raw / (size_t)elem;
    uint64_t sum = 0;
    for (int b = 0; b < FLEXDIAG_PZ_MAX_PLANES; b++) {
        uint64_t len = rd32(h + H_PLANES + 4 * b);
        int kept = (h[H_STORED] >> b) & 1;
        int ok = b >= elem ? len == 0 : kept ? len == m : len > 0 && len < m;
        if (!ok) return fault(f, FLEXDIAG_PZ_E_HEADER, H_PLANES + 4 * b, m, len, "plane length");
        sum += len;
    }
    if (rd32(h + H_PAYLOAD) != sum)
        return fault(f, FLEXDIAG_PZ_E_HEADER, H_PAYLOAD, sum, rd32(h + H_PAYLOAD), "payload bytes");
    if (rd64(h + H_RESERVED) != 0)
        return fault(f, FLEXDIAG_PZ_E_HEADER, H_RESERVED, 0, rd64(h + H_RESERVED), "reserved");
    if (n < FLEXDIAG_PZ_HDR_BYTES + sum)
        return fault(f, FLEXDIAG_PZ_E_TRUNCATED, n, FLEXDIAG_PZ_HDR_BYTES + sum, n, "payload");
    if (n > FLEXDIAG_PZ_HDR_BYTES + sum)
        return fault(f, FLEXDIAG_PZ_E_HEADER, H_PAYLOAD, n - FLEXDIAG_PZ_HDR_BYTES, sum,
                     "payload bytes");
    return FLEXDIAG_PZ_E_OK;
}

flexdiag_pz_code flexdiag__pz_decode(flexdiag_pz_dec *d, const void *src, size_t n, void *dst,
                                     size_t raw, int elem, flexdiag_pz_fault *f) {
    const uint8_t *h = src;
    *f = (flexdiag_pz_fault){0};
    if (elem < 1 || elem > FLEXDIAG_PZ_MAX_PLANES || raw == 0 || raw > d->max_raw ||
        raw % (size_t)elem)
        return fault(f, FLEXDIAG_PZ_E_HEADER, 0, d->max_raw, raw, "expected raw bytes");
    flexdiag_pz_code c = check_header(h, n, raw, elem, f);
    if (c != FLEXDIAG_PZ_E_OK) return c;
    size_t payload = n - FLEXDIAG_PZ_HDR_BYTES;
    uint64_t sum = chunk_sum(h, h + FLEXDIAG_PZ_HDR_BYTES, payload);
    if (sum != rd64(h + H_SUM))
        return fault(f, FLEXDIAG_PZ_E_CHECKSUM, H_SUM, rd64(h + H_SUM), sum, "checksum");
    size_t m = raw / (size_t)elem, at = FLEXDIAG_PZ_HDR_BYTES;
    uint8_t *planes = elem == 1 ? dst : d->planes;
    for (int b = 0; b < elem; b++) {
        size_t len = rd32(h + H_PLANES + 4 * b);
        uint8_t *out = planes + (size_t)b * m;
        if ((h[H_STORED] >> b) & 1) {
            memcpy(out, h + at, m);
        } else {
            size_t r = ZSTD_decompressDCtx(d->dctx, out, m, h + at, len);
            if (ZSTD_isError(r))
                return fault(f, FLEXDIAG_PZ_E_ZSTD, at, m, 0, ZSTD_getErrorName(r));
            if (r != m) return fault(f, FLEXDIAG_PZ_E_ZSTD, at, m, r, "plane size");
        }
        at += len;
    }
    if (elem > 1) merge(dst, planes, m, elem);
    return FLEXDIAG_PZ_E_OK;
}

const char *flexdiag__pz_fault_str(const flexdiag_pz_fault *f, char *buf, size_t n) {
    unsigned long long w = (unsigned long long)f->want, g = (unsigned long long)f->got;
    const char *what = f->what ? f->what : "";
    switch (f->code) {
    case FLEXDIAG_PZ_E_OK: snprintf(buf, n, "no fault"); break;
    case FLEXDIAG_PZ_E_TRUNCATED:
        snprintf(buf, n, "truncated: %llu bytes where the %s needs %llu", g, what, w);
        break;
    case FLEXDIAG_PZ_E_MAGIC:
        snprintf(buf, n, "wrong magic 0x%08llx (a chunk starts with 0x%08llx)", g, w);
        break;
    case FLEXDIAG_PZ_E_VERSION: snprintf(buf, n, "version %llu, this build reads %llu", g, w); break;
    case FLEXDIAG_PZ_E_HEADER:
        snprintf(buf, n, "header field '%s' is %llu, expected %llu", what, g, w);
        break;
    case FLEXDIAG_PZ_E_CHECKSUM:
        snprintf(buf, n, "checksum mismatch: the stored bytes hash to 0x%016llx, the header "
                 "says 0x%016llx", g, w);
        break;
    case FLEXDIAG_PZ_E_ZSTD:
        snprintf(buf, n, "zstd could not decode a plane (%s; %llu bytes expected, %llu decoded)",
                 what, w, g);
        break;
    }
    return buf;
}

flexdiag_status flexdiag__pz_fault_err(const flexdiag_pz_fault *f, const char *file, uint64_t off,
                                       const char *what) {
    char why[256];
    return flexdiag__err(FLEXDIAG_ERR_CHECKSUM,
                         "%s: %s: corrupt zstd chunk at byte %llu of the file: %s",
                         file, what, (unsigned long long)(off + f->at),
                         flexdiag__pz_fault_str(f, why, sizeof why));
}

/* ---- a buffer as chunks on a pool ---- */

struct flexdiag_pz_many {
    flexdiag_pool *pool;
    int n;                 /* codecs: one per worker */
    size_t chunk;          /* raw bytes per chunk */
    flexdiag_pz_enc **enc; /* (n) or NULL */
    flexdiag_pz_dec **dec; /* (n) or NULL */
    pthread_mutex_t mu;    /* guards a job's first fault */
};

flexdiag_status flexdiag__pz_many_create(int threads, size_t chunk, int encode,
                                         flexdiag_pz_many **out) {
    *out = NULL;
    if (chunk == 0 || chunk > UINT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "zstd chunks of %zu bytes", chunk);
    flexdiag_pz_many *m = calloc(1, sizeof *m);
    if (!m) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "zstd codec: out of host memory");
    pthread_mutex_init(&m->mu, NULL);
    m->chunk = chunk;
    flexdiag_status st = flexdiag__pool_create(threads, &m->pool);
    if (st == FLEXDIAG_OK) {
        m->n = flexdiag__pool_workers(m->pool);
        if (encode) m->enc = calloc((size_t)m->n, sizeof *m->enc);
        else m->dec = calloc((size_t)m->n, sizeof *m->dec);
        if (!m->enc && !m->dec)
            st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "zstd codec: out of host memory");
    }
    for (int i = 0; st == FLEXDIAG_OK && i < m->n; i++)
        st = encode ? flexdiag__pz_enc_create(FLEXDIAG_PZ_LEVEL, chunk, &m->enc[i])
                    : flexdiag__pz_dec_create(chunk, &m->dec[i]);
    if (st != FLEXDIAG_OK) {
        flexdiag__pz_many_destroy(m);
        return st;
    }
    *out = m;
    return FLEXDIAG_OK;
}

void flexdiag__pz_many_destroy(flexdiag_pz_many *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        if (m->enc) flexdiag__pz_enc_destroy(m->enc[i]);
        if (m->dec) flexdiag__pz_dec_destroy(m->dec[i]);
    }
    free(m->enc);
    free(m->dec);
    flexdiag__pool_destroy(m->pool);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* One parallel job over the chunks of a buffer. */
typedef struct job {
    flexdiag_pz_many *m;
    const uint8_t *src;
    uint8_t *dst;
    uint64_t *offs;        /* encode: chunk i's bytes into offs[i + 1]; decode: read only */
    size_t raw, n_chunks;
    int elem;
    _Atomic size_t next;   /* the next chunk to claim */
    atomic_int failed;     /* encode: chunks refused (cannot happen after the checks) */
    size_t bad;            /* decode: the lowest faulting chunk, n_chunks when none */
    flexdiag_pz_fault f;   /* its fault */
} job;

static size_t chunk_raw(const job *j, size_t i) {
    size_t lo = i * j->m->chunk;
    return j->raw - lo < j->m->chunk ? j->raw - lo : j->m->chunk;
}

/* Encode the chunks task t claims, chunk i at its bound's slot dst + i * bound(chunk). */
static void enc_task(void *ctx, int64_t t, void *scratch) {
    (void)scratch;
    job *j = ctx;
    size_t slot = flexdiag__pz_bound(j->m->chunk);
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n_chunks;) {
        size_t len = 0;
        if (flexdiag__pz_encode(j->m->enc[t], j->src + i * j->m->chunk, chunk_raw(j, i), j->elem,
                                j->dst + i * slot, slot, &len))
            atomic_fetch_add(&j->failed, 1);
        j->offs[i + 1] = len;
    }
}

static void dec_task(void *ctx, int64_t t, void *scratch) {
    (void)scratch;
    job *j = ctx;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n_chunks;) {
        flexdiag_pz_fault f;
        if (flexdiag__pz_decode(j->m->dec[t], j->src + j->offs[i], j->offs[i + 1] - j->offs[i],
                                j->dst + i * j->m->chunk, chunk_raw(j, i), j->elem, &f) ==
            FLEXDIAG_PZ_E_OK)
            continue;
        f.at += j->offs[i];
        pthread_mutex_lock(&j->m->mu);
        if (i < j->bad) {
            j->bad = i;
            j->f = f;
        }
        pthread_mutex_unlock(&j->m->mu);
    }
}

static int64_t tasks(const flexdiag_pz_many *m, size_t n_chunks) {
    return (int64_t)(n_chunks < (size_t)m->n ? n_chunks : (size_t)m->n);
}

flexdiag_status flexdiag__pz_many_encode(flexdiag_pz_many *m, const void *src, size_t raw,
                                         int elem, void *dst, size_t cap, uint64_t *offs) {
    if (!m->enc || elem < 1 || elem > FLEXDIAG_PZ_MAX_PLANES || raw == 0 ||
        raw % (size_t)elem || m->chunk % (size_t)elem || cap < flexdiag__pz_many_bound(raw, m->chunk))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "zstd encode: %zu bytes of %d-byte elements in chunks of %zu into "
                             "%zu bytes",
                             raw, elem, m->chunk, cap);
    job j = {.m = m, .src = src, .dst = dst, .offs = offs, .raw = raw, .elem = elem,
             .n_chunks = flexdiag__pz_chunks(raw, m->chunk)};
    FLEXDIAG_TRY(flexdiag__pool_parallel_for(m->pool, tasks(m, j.n_chunks), 0, enc_task, &j));
    if (atomic_load(&j.failed))
        return flexdiag__err(FLEXDIAG_ERR_INTERNAL, "zstd encode: a chunk was refused");
    /* close the gaps: chunk i moves down from its slot to the end of chunk i - 1 */
    size_t slot = flexdiag__pz_bound(m->chunk);
    offs[0] = 0;
    for (size_t i = 0; i < j.n_chunks; i++) {
        size_t len = offs[i + 1];
        memmove((uint8_t *)dst + offs[i], (uint8_t *)dst + i * slot, len);
        offs[i + 1] = offs[i] + len;
    }
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__pz_many_decode(flexdiag_pz_many *m, const void *src,
                                         const uint64_t *offs, void *dst, size_t raw, int elem,
                                         const char *file, uint64_t off, const char *what) {
    size_t n_chunks = flexdiag__pz_chunks(raw, m->chunk);
    if (!m->dec || raw == 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "zstd decode of %zu bytes without decoders",
                             raw);
    job j = {.m = m, .src = src, .dst = dst, .offs = (uint64_t *)offs, .raw = raw, .elem = elem,
             .n_chunks = n_chunks, .bad = n_chunks};
    FLEXDIAG_TRY(flexdiag__pool_parallel_for(m->pool, tasks(m, n_chunks), 0, dec_task, &j));
    if (j.bad == n_chunks) return FLEXDIAG_OK;
    return flexdiag__pz_fault_err(&j.f, file, off, what);
}
