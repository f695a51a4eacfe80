/*
 * planes_zstd.h - the byte-plane zstd codec of the disk tier (--compress-disk zstd,
 * docs/offloading.md §1.1): a chunk of elements (bf16, fp32, any size up to 8 bytes) is split
 * into byte planes (plane b holds byte b of every element), each plane compressed with zstd (or
 * kept as it is when zstd does not shrink it), behind a self-describing header with a checksum.
 * The high byte of bf16 (sign and exponent) is low-entropy, the low byte is not: splitting lets
 * zstd find the first without the second diluting it.
 *
 * Chunk layout (little-endian), FLEXDIAG_PZ_HDR_BYTES bytes of header, then the planes in order:
 *
 *   0  u32  magic FLEXDIAG_PZ_MAGIC ("FDZ1")
 *   4  u16  version (1)
 *   6  u8   element size = planes, 1 .. FLEXDIAG_PZ_MAX_PLANES
 *   7  u8   stored: bit b set when plane b is kept as it is
 *   8  u32  raw bytes (decoded size; a multiple of the element size)
 *  12  u32  payload bytes (the sum of the plane lengths)
 *  16  u32  plane length [8] (0 past the element size)
 *  48  u64  XXH64 (seed 0) of the header with this field zeroed, then the payload
 *  56  u64  reserved, 0
 *
 * Decoding checks the header against what the caller expects (the raw size and element size
 * its index holds, the chunk's stored length), then the checksum over every stored byte, then
 * decompresses: a flipped byte anywhere, a truncation or a wrong magic is a fault with the byte
 * offset inside the chunk, never a crash or silently wrong output. Faults are values (safe on
 * worker threads, which cannot use the thread's error message); flexdiag__pz_fault_err turns
 * one into a status naming the file and its byte offset.
 *
 * Rejected: zstd's frame checksum alone (it covers the decoded plane, not the header or a plane
 * kept as it is, and a flip in an optional frame field can pass); a CRC table (about 1 GB/s a
 * thread, slower than the decompression it guards).
 */
#ifndef FLEXDIAG_PLANES_ZSTD_H
#define FLEXDIAG_PLANES_ZSTD_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/planes_zstd.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

#define FLEXDIAG_PZ_MAGIC 0x315a4446u /* "FDZ1" little-endian */
#define FLEXDIAG_PZ_VERSION 1
#define FLEXDIAG_PZ_HDR_BYTES 64
#define FLEXDIAG_PZ_MAX_PLANES 8
/* zstd level and chunk of the disk tier, measured on bf16 layer weights (random and trained,
 * tests/offload/bench_planes_zstd, docs/offloading.md §1.1): level 1 stores 0.684 of the raw
 * bytes, levels 3 and 9 0.70 (their block heuristics cost ratio on these planes) at half and a
 * tenth of the compress rate, negative levels 0.79-0.90; one thread decodes 1 MiB chunks at
 * 1.5-1.6 GB/s of raw bytes, 256 KiB ones as fast, 4 MiB ones at 1.05 (planes past the L2). */
#define FLEXDIAG_PZ_LEVEL 1
/* Raw bytes per chunk of the disk tier's layers: the unit one worker decodes. */
#define FLEXDIAG_PZ_CHUNK (1u << 20)

/* What a decode found wrong. */
typedef enum flexdiag_pz_code {
    FLEXDIAG_PZ_E_OK = 0,
    FLEXDIAG_PZ_E_TRUNCATED,  /* fewer bytes than the header or the header's payload */
    FLEXDIAG_PZ_E_MAGIC,    /* not a chunk: the magic differs */
    FLEXDIAG_PZ_E_VERSION,  /* a version this build does not read */
    FLEXDIAG_PZ_E_HEADER,     /* a header field disagrees with itself or with the caller */
    FLEXDIAG_PZ_E_CHECKSUM,   /* the stored bytes do not hash to the header's checksum */
    FLEXDIAG_PZ_E_ZSTD,       /* zstd refused a plane, or it decoded to the wrong size */
} flexdiag_pz_code;

typedef struct flexdiag_pz_fault {
    flexdiag_pz_code code;
    uint64_t at;        /* byte offset inside the chunk where the fault was found */
    uint64_t want, got; /* the values compared (sizes, checksum, magic), when any */
    const char *what;   /* the field or zstd's error name (a static string), or NULL */
} flexdiag_pz_fault;

/* Bytes an encoded chunk of raw bytes may take at most: every plane kept as it is. */
static inline size_t flexdiag__pz_bound(size_t raw) { return FLEXDIAG_PZ_HDR_BYTES + raw; }

/* XXH64 of n bytes with seed (the reference algorithm; exposed for its tests). */
uint64_t flexdiag__xxh64(const void *p, size_t n, uint64_t seed);

/* ---- one chunk ---- */

typedef struct flexdiag_pz_enc flexdiag_pz_enc;
typedef struct flexdiag_pz_dec flexdiag_pz_dec;

/* An encoder of chunks up to max_raw bytes at zstd level (its own zstd context and plane
 * buffer); OOM_HOST when they cannot be allocated. */
flexdiag_status flexdiag__pz_enc_create(int level, size_t max_raw, flexdiag_pz_enc **out);
void flexdiag__pz_enc_destroy(flexdiag_pz_enc *e);
/* Encode n bytes of src (elements of elem bytes: n a multiple of elem, 0 < n <= max_raw,
 * n < 2^32) into dst (cap >= flexdiag__pz_bound(n)); *len = the chunk's bytes. A plane zstd
 * cannot shrink is kept as it is. Message-free (callable on worker threads): 0, or -1 for
 * sizes outside those rules. */
int flexdiag__pz_encode(flexdiag_pz_enc *e, const void *src, size_t n, int elem, void *dst,
                        size_t cap, size_t *len);

/* A decoder of chunks up to max_raw bytes (its zstd context and plane buffer). */
flexdiag_status flexdiag__pz_dec_create(size_t max_raw, flexdiag_pz_dec **out);
void flexdiag__pz_dec_destroy(flexdiag_pz_dec *d);
/* Decode the chunk src (n stored bytes) that must hold raw bytes of elements of elem bytes
 * (raw <= max_raw) into dst. FLEXDIAG_PZ_E_OK, or the fault (also in *f); dst may hold anything
 * after a fault. */
flexdiag_pz_code flexdiag__pz_decode(flexdiag_pz_dec *d, const void *src, size_t n, void *dst,
                                     size_t raw, int elem, flexdiag_pz_fault *f);

/* A fault as text ("checksum 0x... of the stored bytes, the header says 0x..."), into buf. */
const char *flexdiag__pz_fault_str(const flexdiag_pz_fault *f, char *buf, size_t n);
/* FLEXDIAG_ERR_CHECKSUM with "<file>: <what>: corrupt zstd chunk at byte <off + f->at> of the
 * file: <the fault>": off is where the bytes f->at counts from (a chunk, a buffer of chunks)
 * lie in file. */
flexdiag_status flexdiag__pz_fault_err(const flexdiag_pz_fault *f, const char *file, uint64_t off,
                                       const char *what);

/* ---- a buffer as consecutive chunks, coded in parallel ---- */

/* A thread pool with one encoder or decoder per worker, for buffers cut into chunks of chunk raw
 * bytes (the last one shorter). Each worker claims the next chunk until none is left, so a slow
 * chunk does not hold the others. */
typedef struct flexdiag_pz_many flexdiag_pz_many;

/* Chunks of a buffer of raw bytes. */
static inline size_t flexdiag__pz_chunks(size_t raw, size_t chunk) {
    return (raw + chunk - 1) / chunk;
}
/* Bytes raw bytes take at most as chunks: a header per chunk more than raw. */
static inline size_t flexdiag__pz_many_bound(size_t raw, size_t chunk) {
    return flexdiag__pz_chunks(raw, chunk) * FLEXDIAG_PZ_HDR_BYTES + raw;
}

/* threads workers (0: the cores this process may run on), chunk raw bytes per chunk (> 0,
 * < 2^32), encoders when encode != 0 (at FLEXDIAG_PZ_LEVEL), decoders otherwise. */
flexdiag_status flexdiag__pz_many_create(int threads, size_t chunk, int encode,
                                         flexdiag_pz_many **out);
void flexdiag__pz_many_destroy(flexdiag_pz_many *m);
/* Encode raw bytes of src (elements of elem bytes; chunk and raw multiples of elem) as
 * consecutive chunks into dst (cap >= flexdiag__pz_many_bound): offs[i] is where chunk i
 * starts, offs[chunks] the bytes written (offs has chunks + 1 entries). INVALID_ARG for sizes
 * outside those rules. */
flexdiag_status flexdiag__pz_many_encode(flexdiag_pz_many *m, const void *src, size_t raw,
                                         int elem, void *dst, size_t cap, uint64_t *offs);
/* Decode the chunks of src at offs (as many_encode wrote them for raw bytes) into dst. A fault
 * is FLEXDIAG_ERR_CHECKSUM from flexdiag__pz_fault_err for the lowest faulting chunk: src lies
 * at byte off of file, and what names the data. */
flexdiag_status flexdiag__pz_many_decode(flexdiag_pz_many *m, const void *src,
                                         const uint64_t *offs, void *dst, size_t raw, int elem,
                                         const char *file, uint64_t off, const char *what);

#endif /* FLEXDIAG_PLANES_ZSTD_H */
