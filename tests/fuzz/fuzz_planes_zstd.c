/*
 * fuzz_planes_zstd.c - libFuzzer target for the chunk decoder of the disk tier's zstd codec
 * (offload/planes_zstd.c flexdiag__pz_decode), which reads chunks back from the store file: a
 * disk that returns bad data must give a fault, never a crash or wrong bytes.
 *
 * Input: byte 0 the element size (1 + b % 8), bytes 1-2 a position p (u16), bytes 3-6 the raw
 * size the caller expects (u32, at most 1 MiB), then the chunk bytes C.
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - C decoded as a chunk: a fault has a known code and an offset inside C (a header field
 *     faults before the checksum is read); a success means C's header says what the caller
 *     expects (magic, version, element size, raw size), C is exactly header + payload, and its
 *     checksum holds (recomputed here); the decoded bytes encode and decode again to themselves;
 *   - C taken as data (cut to whole elements): it encodes within the bound and decodes to
 *     itself; that chunk with byte p flipped (bit p >> 13), or cut to p bytes, is a fault.
 *
 * The same entry point is replayed over tests/fuzz/corpus/planes_zstd by replay.c in the
 * 'format' suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "offload/planes_zstd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_RAW (1u << 20)

static flexdiag_pz_enc *enc;
static flexdiag_pz_dec *dec;
static uint8_t *out, *chunk, *again; /* MAX_RAW, bound(MAX_RAW), bound(MAX_RAW) */

static void setup(void) {
    if (enc) return;
    FUZZ_CHECK(flexdiag__pz_enc_create(FLEXDIAG_PZ_LEVEL, MAX_RAW, &enc) == FLEXDIAG_OK, "");
    FUZZ_CHECK(flexdiag__pz_dec_create(MAX_RAW, &dec) == FLEXDIAG_OK, "");
    out = malloc(MAX_RAW);
    chunk = malloc(flexdiag__pz_bound(MAX_RAW));
    again = malloc(flexdiag__pz_bound(MAX_RAW));
    FUZZ_CHECK(out && chunk && again, "out of memory");
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Encode src (n bytes) and decode it: the same bytes; the chunk's length. */
static size_t encode_back(const uint8_t *src, size_t n, int elem, uint8_t *dst) {
    size_t len = 0;
    FUZZ_CHECK(flexdiag__pz_encode(enc, src, n, elem, dst, flexdiag__pz_bound(n), &len) == 0, "");
    FUZZ_CHECK(len >= FLEXDIAG_PZ_HDR_BYTES && len <= flexdiag__pz_bound(n), "length in bound");
    flexdiag_pz_fault f;
    FUZZ_CHECK(flexdiag__pz_decode(dec, dst, len, out, n, elem, &f) == FLEXDIAG_PZ_E_OK,
               "an encoded chunk decodes");
    FUZZ_CHECK(memcmp(out, src, n) == 0, "round trip");
    return len;
}

/* What a successful decode of c (n bytes) implies about it, checked on its bytes. */
static void check_accepted(const uint8_t *c, size_t n, size_t raw, int elem) {
    FUZZ_CHECK(n >= FLEXDIAG_PZ_HDR_BYTES, "accepted a chunk shorter than its header");
    FUZZ_CHECK(le32(c) == FLEXDIAG_PZ_MAGIC && c[4] == FLEXDIAG_PZ_VERSION && c[5] == 0,
               "accepted a wrong magic or version");
    FUZZ_CHECK(c[6] == elem && le32(c + 8) == raw, "accepted a chunk of other sizes");
    FUZZ_CHECK(le32(c + 12) == n - FLEXDIAG_PZ_HDR_BYTES, "payload = the chunk after its header");
    uint8_t h[FLEXDIAG_PZ_HDR_BYTES];
    memcpy(h, c, sizeof h);
    memset(h + 48, 0, 8);
    uint64_t sum = flexdiag__xxh64(h, sizeof h, flexdiag__xxh64(c + sizeof h, n - sizeof h, 0)),
             stored;
    memcpy(&stored, c + 48, 8);
    FUZZ_CHECK(sum == stored, "accepted a chunk whose checksum does not hold");
    uint8_t *copy = malloc(raw);
    FUZZ_CHECK(copy != NULL, "out of memory");
    memcpy(copy, out, raw);
    encode_back(copy, raw, elem, again);
    free(copy);
}

/* Decode c as a chunk of raw bytes. */
static void decode_as_chunk(const uint8_t *c, size_t n, size_t raw, int elem) {
    flexdiag_pz_fault f;
    flexdiag_pz_code r = flexdiag__pz_decode(dec, c, n, out, raw, elem, &f);
    FUZZ_CHECK(r == f.code, "the returned code is the fault's");
    if (r == FLEXDIAG_PZ_E_OK) {
        check_accepted(c, n, raw, elem);
        return;
    }
    FUZZ_CHECK(r >= FLEXDIAG_PZ_E_TRUNCATED && r <= FLEXDIAG_PZ_E_ZSTD, "fault code");
    FUZZ_CHECK(f.at <= n, "fault offset inside the chunk");
    char why[256];
    FUZZ_CHECK(flexdiag__pz_fault_str(&f, why, sizeof why)[0] != '\0', "fault text");
}

/* Encode c as data; one flipped byte or a truncation of the chunk is a fault. */
static void encode_and_break(const uint8_t *c, size_t n, int elem, uint16_t p) {
    n -= n % (size_t)elem;
    if (n == 0 || n > MAX_RAW) return;
    size_t len = encode_back(c, n, elem, chunk);
    flexdiag_pz_fault f;
    size_t at = p % len;
    chunk[at] ^= (uint8_t)(1u << (p >> 13));
    FUZZ_CHECK(flexdiag__pz_decode(dec, chunk, len, out, n, elem, &f) != FLEXDIAG_PZ_E_OK,
               "a flipped byte decoded");
    FUZZ_CHECK(f.at <= len, "fault offset inside the chunk");
    chunk[at] ^= (uint8_t)(1u << (p >> 13));
    FUZZ_CHECK(flexdiag__pz_decode(dec, chunk, at, out, n, elem, &f) == FLEXDIAG_PZ_E_TRUNCATED,
               "a truncated chunk decoded");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 7) return 0;
    setup();
    int elem = 1 + data[0] % FLEXDIAG_PZ_MAX_PLANES;
    uint16_t p = (uint16_t)(data[1] | data[2] << 8);
    uint32_t raw = le32(data + 3);
    if (raw > MAX_RAW) raw = MAX_RAW;
    const uint8_t *c = data + 7;
    size_t n = size - 7;
    if (raw > 0 && raw % (uint32_t)elem == 0) decode_as_chunk(c, n, raw, elem);
    encode_and_break(c, n, elem, p);
    return 0;
}
