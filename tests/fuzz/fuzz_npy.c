/*
 * fuzz_npy.c - libFuzzer target for the CLI's .npy reader (cli/npy.c flexdiag__npy_read), which
 * reads user-supplied score inputs, token grids and logits. Each input is written into a private
 * temp folder as t.npy and read back through the path API a user's file takes.
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - a failed read is FLEXDIAG_ERR_INVALID_ARG or FLEXDIAG_ERR_UNSUPPORTED, leaves the output
 *     all zero (data NULL) and a message naming the file (cli_io_error);
 *   - a successful read has a known dtype, rank 0..8, non-negative dims whose product is numel,
 *     and, checked against the input bytes independently of the reader (preamble: version byte,
 *     u16 or u32 header length), numel x dtype size = the bytes after the header, which are
 *     exactly the data returned;
 *   - what was read writes (flexdiag__npy_write, to r.npy) and reads back identically, when it
 *     holds elements: the reader takes any dims whose product fits int64, so also (2^62, 0),
 *     while the writer takes dims whose byte size fits (numpy's rule), so such an empty array
 *     does not write.
 *
 * The same entry point is replayed over tests/fuzz/corpus/npy by replay.c in the 'format'
 * suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/fileio.h"
#include "cli/npy.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dir, *in_path, *out_path; /* temp folder, the input, the round-trip copy */

static size_t dtype_size(int32_t dtype) { return dtype == FLEXDIAG_NPY_I64 ? 8 : 4; }

/* Offset of the data from the preamble alone: 10 + u16 length (1.x), 12 + u32 length. */
static uint64_t data_offset(const uint8_t *d, size_t size) {
    FUZZ_CHECK(size >= 10, "accepted a file shorter than the preamble");
    if (d[6] == 1) return 10 + ((uint64_t)d[8] | (uint64_t)d[9] << 8);
    FUZZ_CHECK(size >= 12, "accepted a short version 2/3 preamble");
    return 12 +
           ((uint64_t)d[8] | (uint64_t)d[9] << 8 | (uint64_t)d[10] << 16 | (uint64_t)d[11] << 24);
}

static void check_failed(flexdiag_status st, const flexdiag_npy *a) {
    static const flexdiag_npy zero;
    const char *msg = cli_io_error();
    FUZZ_CHECK(st == FLEXDIAG_ERR_INVALID_ARG || st == FLEXDIAG_ERR_UNSUPPORTED, msg);
    FUZZ_CHECK(memcmp(a, &zero, sizeof zero) == 0, "failed read left output behind");
    FUZZ_CHECK(strstr(msg, in_path) != NULL, msg);
}

static void check_array(const flexdiag_npy *a, const uint8_t *d, size_t size) {
    FUZZ_CHECK(a->dtype == FLEXDIAG_NPY_F32 || a->dtype == FLEXDIAG_NPY_I32 ||
                   a->dtype == FLEXDIAG_NPY_I64,
               "dtype");
    FUZZ_CHECK(a->ndim >= 0 && a->ndim <= FLEXDIAG_NPY_MAX_DIMS && a->data != NULL, "rank");
    uint64_t numel = 1;
    for (int32_t i = 0; i < a->ndim; i++) {
        FUZZ_CHECK(a->shape[i] >= 0, "negative dim");
        FUZZ_CHECK(!__builtin_mul_overflow(numel, (uint64_t)a->shape[i], &numel),
                   "accepted a shape whose element count overflows");
    }
    uint64_t at = data_offset(d, size), nbytes = (uint64_t)a->numel * dtype_size(a->dtype);
    FUZZ_CHECK(a->numel >= 0 && (uint64_t)a->numel == numel, "numel = product of dims");
    FUZZ_CHECK(at <= size && size - at == nbytes, "numel x dtype size = data bytes");
    FUZZ_CHECK(memcmp(a->data, d + at, nbytes) == 0, "data = the bytes after the header");
}

/* Write a, read it back: the same array. */
static void check_round_trip(const flexdiag_npy *a) {
    flexdiag_npy b;
    size_t nbytes = (size_t)a->numel * dtype_size(a->dtype);
    FUZZ_CHECK(flexdiag__npy_write(out_path, a->dtype, a->ndim, a->shape, a->data) == FLEXDIAG_OK,
               cli_io_error());
    FUZZ_CHECK(flexdiag__npy_read(out_path, &b) == FLEXDIAG_OK, cli_io_error());
    FUZZ_CHECK(b.dtype == a->dtype && b.ndim == a->ndim && b.numel == a->numel, "round trip");
    FUZZ_CHECK(memcmp(b.shape, a->shape, sizeof a->shape) == 0, "round trip shape");
    FUZZ_CHECK(memcmp(b.data, a->data, nbytes) == 0, "round trip data");
    flexdiag__npy_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) {
        dir = fuzz_tempdir("fuzz-npy");
        in_path = fuzz_path(dir, "t.npy");
        out_path = fuzz_path(dir, "r.npy");
    }
    fuzz_write(in_path, data, size);
    flexdiag_npy a;
    memset(&a, 0xab, sizeof a);
    flexdiag_status st = flexdiag__npy_read(in_path, &a);
    if (st != FLEXDIAG_OK) {
        check_failed(st, &a);
        return 0;
    }
    check_array(&a, data, size);
    if (a.numel > 0) check_round_trip(&a);
    flexdiag__npy_free(&a);
    return 0;
}
