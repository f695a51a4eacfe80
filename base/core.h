/*
 * core.h - internal utilities every module shares: error reporting, logging, assertions,
 * bf16 conversion and checked arithmetic.
 *
 * Errors: a failing function records a human-readable message with flexdiag__err() (a
 * thread-local buffer; the first, innermost message wins until flexdiag__err_clear()) and
 * returns the status; callers that add context use flexdiag__err_prefix(). flexdiag_last_error()
 * returns the buffer. This keeps messages precise ("file x: tensor y: ...") without threading
 * message buffers through every signature.
 */
#ifndef FLEXDIAG_CORE_H
#define FLEXDIAG_CORE_H

#include "base/layer.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "flexdiag.h"

#if defined(__GNUC__)
#define FLEXDIAG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define FLEXDIAG_NORETURN __attribute__((noreturn))
#else
#define FLEXDIAG_PRINTF(a, b)
#define FLEXDIAG_NORETURN
#endif

#ifdef __CUDACC__
#define FLEXDIAG_HD __host__ __device__
#else
#define FLEXDIAG_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---- */

/* Record a message for status s (only if none is pending) and return s. */
flexdiag_status flexdiag__err(flexdiag_status s, const char *fmt, ...) FLEXDIAG_PRINTF(2, 3);
/* Prepend "context: " to the pending message; returns s. */
flexdiag_status flexdiag__err_prefix(flexdiag_status s, const char *fmt, ...)
    FLEXDIAG_PRINTF(2, 3);
/* Forget the pending message (call at the start of every public entry point). */
void flexdiag__err_clear(void);
/* The pending message ("" if none). */
const char *flexdiag__err_msg(void);

#define FLEXDIAG_TRY(expr)                                                                         \
    do {                                                                                           \
        flexdiag_status st_ = (expr);                                                              \
        if (st_ != FLEXDIAG_OK) return st_;                                                        \
    } while (0)

/* ---- assertions (programmer errors only; stay on in release) ---- */

FLEXDIAG_NORETURN void flexdiag__assert_fail(const char *expr, const char *func, const char *file,
                                             int line);
#define FLEXDIAG_ASSERT(x)                                                                         \
    do {                                                                                           \
        if (!(x)) flexdiag__assert_fail(#x, __func__, __FILE__, __LINE__);                         \
    } while (0)
#ifndef NDEBUG
#define FLEXDIAG_DASSERT(x) FLEXDIAG_ASSERT(x)
#else
#define FLEXDIAG_DASSERT(x) ((void)0)
#endif

/* ---- logging ---- */

extern flexdiag_log_level flexdiag__log_level;
void flexdiag__log(flexdiag_log_level level, const char *fmt, ...) FLEXDIAG_PRINTF(2, 3);
#define FLEXDIAG_LOG(level, ...)                                                                   \
    do {                                                                                           \
        if ((level) <= flexdiag__log_level) flexdiag__log((level), __VA_ARGS__);                   \
    } while (0)
#define FLEXDIAG_WARN(...) FLEXDIAG_LOG(FLEXDIAG_LOG_WARN, __VA_ARGS__)
#define FLEXDIAG_INFO(...) FLEXDIAG_LOG(FLEXDIAG_LOG_INFO, __VA_ARGS__)

/* ---- bf16 / fp16 ---- */

static inline FLEXDIAG_HD float flexdiag__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline FLEXDIAG_HD uint16_t flexdiag__f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half to float (subnormals, Inf, NaN handled). */
float flexdiag__f16_to_f32(uint16_t h);
/* Float to IEEE half, round to nearest even (subnormals; beyond the half range: Inf; NaN stays
 * NaN). */
uint16_t flexdiag__f32_to_f16(float f);

/* ---- checked arithmetic ---- */

/* *out = a * b; returns 0 on overflow. */
static inline int flexdiag__mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* ---- time and counter-based RNG ---- */

/* Monotonic seconds. */
double flexdiag__now(void);

/* Stateless 64-bit mix of (seed, a, b): the draw for request a at step b never depends on
 * batch composition or thread count. */
static inline FLEXDIAG_HD uint64_t flexdiag__rng64(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t x = seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 2; i++) { /* two rounds of splitmix64's finaliser */
        x += 0x9E3779B97F4A7C15ull;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
    }
    return x;
}

/* Uniform double in [0, 1) from the top 53 bits. */
static inline FLEXDIAG_HD double flexdiag__rng_uniform(uint64_t seed, uint64_t a, uint64_t b) {
    return (double)(flexdiag__rng64(seed, a, b) >> 11) * (1.0 / 9007199254740992.0);
}

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_CORE_H */
