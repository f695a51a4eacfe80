/*
 * util.h - helpers shared by the test executables: deterministic random data, the
 * kernel-vs-reference comparison of docs/architecture.md §10.2 (NaN/Inf pattern, atol + rtol·|ref|,
 * nmse), temporary folders and fixture paths. Tests may abort (cmocka asserts); the library never
 * does.
 */
#ifndef FLEXDIAG_TEST_UTIL_H
#define FLEXDIAG_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

struct json_t;

/* xorshift-based generator: same stream on every machine. */
typedef struct tu_rng { uint64_t s; } tu_rng;
void tu_rng_seed(tu_rng *r, uint64_t seed);
uint64_t tu_rng_u64(tu_rng *r);
double tu_rng_uniform(tu_rng *r);          /* [0, 1) */
double tu_rng_normal(tu_rng *r);           /* N(0, 1) */
int64_t tu_rng_int(tu_rng *r, int64_t lo, int64_t hi); /* [lo, hi] inclusive */
void tu_fill_f32(tu_rng *r, float *x, int64_t n, float scale);     /* N(0, scale²) */
void tu_fill_bf16(tu_rng *r, uint16_t *x, int64_t n, float scale); /* N(0, scale²) rounded */
/* n bf16 values widened to a new fp32 array (malloc'ed; aborts when memory runs out). */
float *tu_bf16_to_f32(const uint16_t *x, int64_t n);

/* docs/architecture.md §10.2 comparison; prints up to 5 mismatches with label; returns 1 when all
 * hold. */
int tu_allclose(const char *label, const float *got, const float *ref, int64_t n, double atol,
                double rtol, double max_nmse);
/* ‖got − ref‖₂ / ‖ref‖₂ (in double). */
double tu_rel_l2(const float *got, const float *ref, int64_t n);

/* mkdtemp under $TMPDIR (or /tmp); returns a malloc'ed path. tu_rmtree removes it. */
char *tu_tempdir(const char *tag);
void tu_rmtree(const char *path);
/* $FLEXDIAG_TEST_DATA/rel (the tests/ source folder), malloc'ed. */
char *tu_data_path(const char *rel);
/* Write / read a whole file; read returns malloc'ed bytes (NUL-terminated) or NULL. */
int tu_write_file(const char *path, const void *data, size_t n);
void *tu_read_file(const char *path, size_t *n);
/* A CUDA stream on device 0 for GPU test `name`: 0 with *s set, or the exit code to return
 * from main() (77 = skip, with the reason on stderr; 1 = the device failed). */
struct flexdiag_stream;
int tu_cuda_stream(const char *name, struct flexdiag_stream **s);
/* check(k) on the CPU reference table (which 0), the CPU fast table (1) or CUDA (2: only when
 * a device is visible; otherwise a note on stderr and nothing run). For tests that hold every
 * backend to the same result. */
struct flexdiag_kernels;
void tu_on_table(int which, void (*check)(const struct flexdiag_kernels *k));
/* Run a shell command, return its exit status (-1 on failure to run). */
int tu_system(const char *fmt, ...);
/* Run `bin ARGS` in folder dir (stdout to dir/out.txt, stderr to dir/err.txt): its exit status. */
int tu_run_in(const char *dir, const char *bin, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* dir/name read whole (malloc'ed, NUL-terminated), or NULL. */
char *tu_read_in(const char *dir, const char *name);

/* FNV-1a 64 of a tokens.json grid (rows of ids, taken as little-endian int32 bytes): the token
 * hash results.jsonl records, recomputed independently of the CLI; *count = ids hashed. */
uint64_t tu_grid_fnv1a64(const struct json_t *grid, size_t *count);

#endif /* FLEXDIAG_TEST_UTIL_H */
