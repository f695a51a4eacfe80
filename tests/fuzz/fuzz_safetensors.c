/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors header and index parsers.
 *
 * Each input is written twice into a private temp folder: as "t.safetensors" (opened as a
 * checkpoint file) and as "model.safetensors.index.json" (opened as a sharded index whose
 * weight_map may name "t.safetensors" itself or the fixed valid shard "s1.safetensors" holding
 * tensors "a" F32 [2] and "b" BF16 [3]). The reader goes through files, not a memory API, so the
 * fuzzer exercises exactly the code a user's checkpoint reaches.
 *
 * Properties checked beyond "no crash, no sanitizer report": a failed open leaves *out NULL and
 * a message; a successful open yields tensors sorted by name, each found by flexdiag__st_find,
 * with nbytes = numel x dtype size, and every tensor reads back (raw and, for BF16/F16/F32,
 * converted) without error, since the file does not change between open and read.
 *
 * The same entry point is replayed over tests/fuzz/corpus/safetensors by replay.c in the
 * 'format' suite, so the saved corpus runs in CI without clang or libFuzzer.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "runtime/model/safetensors.h"
#include "st_write.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(x)                                                                              \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_safetensors: check failed: %s (%s)\n", #x,                       \
                    flexdiag_last_error(NULL));                                                    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static char *dir, *file_path, *index_path, *shard_path; /* temp folder and its three files */

static void cleanup(void) {
    unlink(file_path);
    unlink(index_path);
    unlink(shard_path);
    rmdir(dir);
}

/* Temp folder with the fixed valid shard; runs once per process. */
static void setup_once(void) {
    static const float a[2] = {1.0f, -2.0f};
    static const uint16_t b[3] = {0x3f80, 0x4000, 0xc040};
    const char *base = getenv("TMPDIR");
    FUZZ_CHECK(asprintf(&dir, "%s/flexdiag-fuzz-XXXXXX", base ? base : "/tmp") > 0);
    FUZZ_CHECK(mkdtemp(dir) != NULL);
    FUZZ_CHECK(asprintf(&file_path, "%s/t.safetensors", dir) > 0);
    FUZZ_CHECK(asprintf(&index_path, "%s/model.safetensors.index.json", dir) > 0);
    FUZZ_CHECK(asprintf(&shard_path, "%s/s1.safetensors", dir) > 0);
    flexdiag_st_entry es[2] = {
        {.name = "a", .dtype = FLEXDIAG_DTYPE_F32, .ndim = 1, .shape = {2}, .data = a},
        {.name = "b", .dtype = FLEXDIAG_DTYPE_BF16, .ndim = 1, .shape = {3}, .data = b}};
    FUZZ_CHECK(flexdiag__st_write(shard_path, es, 2) == FLEXDIAG_OK);
    flexdiag_log_set(NULL, FLEXDIAG_LOG_ERROR, NULL); /* the rounding INFO line is noise here */
    atexit(cleanup);
}

static void write_input(const char *path, const uint8_t *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0);
    while (size > 0) {
        ssize_t w = write(fd, data, size);
        FUZZ_CHECK(w > 0);
        data += w;
        size -= (size_t)w;
    }
    FUZZ_CHECK(close(fd) == 0);
}

/* Read t every way its dtype allows; all must succeed on an unchanged file. */
static void read_all_ways(const flexdiag_safetensors *st, const flexdiag_st_tensor *t) {
    void *raw = malloc(t->nbytes + 1);
    float *f = malloc((size_t)t->numel * 4 + 4);
    FUZZ_CHECK(raw && f);
    FUZZ_CHECK(flexdiag__st_read_raw(st, t, raw) == FLEXDIAG_OK);
    int convertible = t->dtype == FLEXDIAG_DTYPE_BF16 || t->dtype == FLEXDIAG_DTYPE_F16 ||
                      t->dtype == FLEXDIAG_DTYPE_F32;
    flexdiag_status want = convertible ? FLEXDIAG_OK : FLEXDIAG_ERR_UNSUPPORTED;
    FUZZ_CHECK(flexdiag__st_read_f32(st, t, f) == want);
    FUZZ_CHECK(flexdiag__st_read_bf16(st, t, (uint16_t *)f) == want);
    free(raw);
    free(f);
}

static void exercise(const char *path) {
    flexdiag_safetensors *st = (flexdiag_safetensors *)&st;
    flexdiag__err_clear();
    if (flexdiag__st_open(path, &st) != FLEXDIAG_OK) {
        FUZZ_CHECK(st == NULL && flexdiag_last_error(NULL)[0] != 0);
        return;
    }
    int64_t n = flexdiag__st_count(st);
    for (int64_t i = 0; i < n; i++) {
        const flexdiag_st_tensor *t = flexdiag__st_at(st, i);
        uint64_t size = (uint64_t)flexdiag__dtype_size(t->dtype);
        FUZZ_CHECK(i == 0 || strcmp(flexdiag__st_at(st, i - 1)->name, t->name) < 0);
        FUZZ_CHECK(flexdiag__st_find(st, t->name) == t);
        FUZZ_CHECK(size > 0 && t->numel >= 0 && (uint64_t)t->numel * size == t->nbytes);
        FUZZ_CHECK(flexdiag__st_file_path(st, t->file) != NULL);
        flexdiag__err_clear();
        read_all_ways(st, t);
    }
    flexdiag__st_close(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) setup_once();
    write_input(file_path, data, size);
    exercise(file_path);
    write_input(index_path, data, size);
    exercise(index_path);
    return 0;
}
