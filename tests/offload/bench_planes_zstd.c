/*
 * bench_planes_zstd.c - measurement of the disk tier's byte-plane zstd codec (not a test), on
 * two sets of bf16 layer weights: the engine's --random-weights draw (Irwin-Hall(4) scaled to
 * N(0, 0.02²), runtime/model/weights.c) and the decoder layers of a trained model (default
 * models/shapes-janus).
 *
 * 1. The codec on one thread, per zstd level and chunk size: the ratio (stored / raw bytes) and
 *    the compress and decompress rates (raw bytes per second).
 * 2. The disk tier end to end at FLEXDIAG_PZ_LEVEL and FLEXDIAG_PZ_CHUNK: the layers written to a
 *    store in DIR, raw and as chunks, then read back as the tiered scheduler reads them (4 MiB
 *    requests, three layers in flight, a layer's chunks decoded by THREADS workers when its
 *    read is taken): the raw read rate, and the compressed bytes read per second and the raw
 *    bytes delivered per second (the effective rate) with decompression; the median of five
 *    passes each, raw and compressed passes alternating.
 *
 *     bench_planes_zstd [MODEL_DIR [DIR [THREADS [RANDOM_MIB]]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/planes_zstd.h"
#include "offload/ranges.h"
#include "offload/store.h"
#include "runtime/model/safetensors.h"

#define MIB (1024ull * 1024ull)
#define LAYER (8 * MIB) /* raw bytes per layer of the end-to-end run */
#define READ_CHUNK (4 * MIB)
#define AHEAD 3
#define REPEATS 5

typedef struct set {
    const char *name;
    uint8_t *p;
    size_t n;
} set;

static void die(const char *what) {
    fprintf(stderr, "bench_planes_zstd: %s: %s\n", what, flexdiag__err_msg());
    exit(1);
}

/* n bytes of --random-weights matrices. */
static set random_set(size_t n) {
    uint16_t *w = malloc(n);
    for (size_t i = 0; i < n / 2; i++) {
        uint64_t r = flexdiag__rng64(1, 3, i);
        float u = (float)((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48)) /
                      65536.0f - 2.0f;
        w[i] = flexdiag__f32_to_bf16(u * 0.02f * 1.7320508f);
    }
    return (set){"random (--random-weights)", (uint8_t *)w, n};
}

/* The bf16 tensors of the decoder layers of the model in dir, one after another. */
static set model_set(const char *dir) {
    flexdiag_safetensors *st;
    if (flexdiag__st_open(dir, &st) != FLEXDIAG_OK) die(dir);
    size_t n = 0;
    for (int64_t i = 0; i < flexdiag__st_count(st); i++) {
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        if (t->dtype == FLEXDIAG_DTYPE_BF16 && strstr(t->name, "layers.")) n += t->nbytes;
    }
    uint8_t *p = malloc(n ? n : 1);
    size_t at = 0;
    for (int64_t i = 0; i < flexdiag__st_count(st); i++) {
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        if (t->dtype != FLEXDIAG_DTYPE_BF16 || !strstr(t->name, "layers.")) continue;
        if (flexdiag__st_read_raw(st, t, p + at) != FLEXDIAG_OK) die(t->name);
        at += t->nbytes;
    }
    flexdiag__st_close(st);
    return (set){dir, p, n};
}

/* 1: one thread, every level and chunk size. */
static void codec_rows(const set *s) {
    static const int levels[] = {-5, -1, 1, 3, 9};
    static const size_t chunks[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
    uint8_t *dst = malloc(flexdiag__pz_many_bound(s->n, 64 << 10)), *out = malloc(s->n);
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++)
        for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
            flexdiag_pz_enc *e;
            flexdiag_pz_dec *d;
            if (flexdiag__pz_enc_create(levels[l], chunks[c], &e) ||
                flexdiag__pz_dec_create(chunks[c], &d))
                die("codec");
            size_t nc = flexdiag__pz_chunks(s->n, chunks[c]), stored = 0;
            size_t *len = malloc(nc * sizeof *len);
            double t0 = flexdiag__now();
            for (size_t i = 0; i < nc; i++) {
                size_t raw = s->n - i * chunks[c] < chunks[c] ? s->n - i * chunks[c] : chunks[c];
                flexdiag__pz_encode(e, s->p + i * chunks[c], raw, 2, dst + stored,
                                    flexdiag__pz_bound(raw), &len[i]);
                stored += len[i];
            }
            double t1 = flexdiag__now();
            size_t at = 0;
            for (size_t i = 0; i < nc; i++) {
                size_t raw = s->n - i * chunks[c] < chunks[c] ? s->n - i * chunks[c] : chunks[c];
                flexdiag_pz_fault f;
                if (flexdiag__pz_decode(d, dst + at, len[i], out + i * chunks[c], raw, 2, &f))
                    die("decode");
                at += len[i];
            }
            double t2 = flexdiag__now();
            if (memcmp(out, s->p, s->n)) die("round trip");
            printf("| %s | %d | %zu KiB | %.3f | %.2f | %.2f |\n", s->name, levels[l],
                   chunks[c] >> 10, (double)stored / (double)s->n, (double)s->n / (t1 - t0) / 1e9,
                   (double)s->n / (t2 - t1) / 1e9);
            free(len);
            flexdiag__pz_enc_destroy(e);
            flexdiag__pz_dec_destroy(d);
        }
    free(dst);
    free(out);
}

/* The layers of s (LAYER raw bytes each, the set repeated to fill them), written at stride. */
typedef struct layers {
    int n;
    size_t stride;          /* store bytes per layer */
    uint64_t *bytes;        /* (n) bytes stored */
    uint64_t **offs;        /* (n) chunk offsets, NULL raw */
    flexdiag_store_extent e;
} layers;

static layers write_layers(flexdiag_store *st, const set *s, int n, flexdiag_pz_many *enc) {
    layers L = {.n = n};
    size_t nc = flexdiag__pz_chunks(LAYER, FLEXDIAG_PZ_CHUNK);
    L.stride = flexdiag__ranges_round(enc ? flexdiag__pz_many_bound(LAYER, FLEXDIAG_PZ_CHUNK)
                                          : LAYER, 4096);
    L.bytes = calloc((size_t)n, sizeof *L.bytes);
    L.offs = calloc((size_t)n, sizeof *L.offs);
    if (flexdiag__store_alloc(st, (uint64_t)n * L.stride, "layers", &L.e)) die("alloc");
    uint8_t *raw = aligned_alloc(4096, LAYER), *buf = aligned_alloc(4096, L.stride);
    for (int j = 0; j < n; j++) {
        for (size_t i = 0; i < LAYER; i++) raw[i] = s->p[((size_t)j * LAYER + i) % s->n];
        memset(buf, 0, L.stride);
        if (enc) {
            L.offs[j] = calloc(nc + 1, sizeof **L.offs);
            if (flexdiag__pz_many_encode(enc, raw, LAYER, 2, buf, L.stride, L.offs[j])) die("enc");
            L.bytes[j] = L.offs[j][nc];
        } else {
            memcpy(buf, raw, LAYER);
            L.bytes[j] = LAYER;
        }
        flexdiag_store_req rq = {FLEXDIAG_STORE_WRITE, L.e.off + (uint64_t)j * L.stride, L.stride,
                                 buf};
        flexdiag_store_ticket t;
        if (flexdiag__store_submit(st, &rq, 1, &t) || flexdiag__store_wait(st, t)) die("write");
    }
    free(raw);
    free(buf);
    return L;
}

/* Read every layer as the scheduler does; the seconds it took, *read = bytes read. */
static double read_layers(flexdiag_store *st, const layers *L, flexdiag_pz_many *dec,
                          uint64_t *read) {
    uint8_t *in[AHEAD], *out = aligned_alloc(4096, LAYER);
    flexdiag_store_ticket tk[AHEAD];
    flexdiag_store_req rq[64];
    *read = 0;
    for (int i = 0; i < AHEAD; i++) in[i] = aligned_alloc(4096, L->stride);
    double t0 = flexdiag__now();
    for (int j = 0; j < L->n + AHEAD; j++) {
        if (j >= AHEAD) { /* take layer j - AHEAD */
            int k = j - AHEAD;
            if (flexdiag__store_wait(st, tk[k % AHEAD])) die("read");
            if (dec && flexdiag__pz_many_decode(dec, in[k % AHEAD], L->offs[k], out, LAYER, 2,
                                                "store", 0, "layer"))
                die("decode");
        }
        if (j >= L->n) continue;
        size_t len = flexdiag__ranges_round(L->bytes[j], 4096), nq = 0;
        for (size_t at = 0; at < len; at += READ_CHUNK, nq++)
            rq[nq] = (flexdiag_store_req){FLEXDIAG_STORE_READ, L->e.off + (uint64_t)j * L->stride + at,
                                          len - at < READ_CHUNK ? len - at : READ_CHUNK,
                                          in[j % AHEAD] + at};
        if (flexdiag__store_submit(st, rq, (int)nq, &tk[j % AHEAD])) die("submit");
        *read += len;
    }
    double dt = flexdiag__now() - t0;
    for (int i = 0; i < AHEAD; i++) free(in[i]);
    free(out);
    return dt;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t) {
    qsort(t, REPEATS, sizeof *t, cmp_double);
    return t[REPEATS / 2];
}

/* 2: the disk tier end to end (the median of REPEATS passes each). */
static void disk_rows(const set *s, const char *dir, int threads) {
    const int n = 64; /* 512 MiB of layers */
    flexdiag_store_params sp;
    flexdiag__store_params_init(&sp);
    sp.dir = dir;
    sp.budget = (uint64_t)n * flexdiag__ranges_round(flexdiag__pz_many_bound(LAYER, FLEXDIAG_PZ_CHUNK), 4096) * 2 + 4096;
    flexdiag_store *st;
    flexdiag_pz_many *enc, *dec;
    if (flexdiag__store_create(&sp, &st) || flexdiag__pz_many_create(threads, FLEXDIAG_PZ_CHUNK, 1, &enc) ||
        flexdiag__pz_many_create(threads, FLEXDIAG_PZ_CHUNK, 0, &dec))
        die("setup");
    layers raw = write_layers(st, s, n, NULL), z = write_layers(st, s, n, enc);
    uint64_t rb, zb;
    double r[REPEATS], q[REPEATS];
    for (int i = 0; i < REPEATS; i++) { /* alternating, so a drift of the disk hits both */
        r[i] = read_layers(st, &raw, NULL, &rb);
        q[i] = read_layers(st, &z, dec, &zb);
    }
    double tr = median(r), tz = median(q);
    double total = (double)n * LAYER;
    printf("| %s | %s, %s | %d | %.3f | %.2f | %.2f | %.2f | %.2f |\n", s->name,
           flexdiag__store_backend(st), flexdiag__store_direct(st) ? "O_DIRECT" : "buffered",
           threads, (double)zb / (double)rb, total / tr / 1e9, (double)zb / tz / 1e9, total / tz / 1e9,
           tr / tz);
    flexdiag__store_destroy(st);
    flexdiag__pz_many_destroy(enc);
    flexdiag__pz_many_destroy(dec);
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : "models/shapes-janus";
    const char *tmp = getenv("TMPDIR");
    const char *dir = argc > 2 ? argv[2] : tmp && *tmp ? tmp : "/tmp";
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    size_t rnd = (size_t)(argc > 4 ? atof(argv[4]) : 32) * MIB;
    set sets[2] = {random_set(rnd), model_set(model)};
    printf("| weights | level | chunk | stored/raw | compress GB/s (1 thread) | decompress GB/s "
           "(1 thread) |\n|---|---|---|---|---|---|\n");
    for (int i = 0; i < 2; i++) codec_rows(&sets[i]);
    printf("\n| weights | store | threads | read/raw | raw read GB/s | zstd read GB/s (stored "
           "bytes) | zstd effective GB/s (raw bytes) | speed-up |\n|---|---|---|---|---|---|---|"
           "---|---|\n");
    for (int i = 0; i < 2; i++) disk_rows(&sets[i], dir, threads);
    free(sets[0].p);
    free(sets[1].p);
    return 0;
}
