/*
 * core.c - error messages, logging, assertions, status strings, the library's version and small
 * numeric helpers shared by every module (see core.h). The error buffer is thread-local so
 * concurrent contexts on different threads never mix messages; logging goes through one
 * replaceable callback.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "flexdiag_version.h"

/* ---- errors ---- */

static _Thread_local char err_buf[1024];
static _Thread_local int err_set;

flexdiag_status flexdiag__err(flexdiag_status s, const char *fmt, ...) {
    if (err_set) return s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    err_set = 1;
    return s;
}

flexdiag_status flexdiag__err_prefix(flexdiag_status s, const char *fmt, ...) {
    char pre[512], old[sizeof err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err_buf, sizeof old);
    const char *rest = err_set ? old : flexdiag_status_str(s);
    int n = snprintf(err_buf, sizeof err_buf, "%s: %s", pre, rest);
    (void)n; /* a longer message is cut to the buffer, as flexdiag__err cuts it */
    err_set = 1;
    return s;
}

void flexdiag__err_clear(void) {
    err_buf[0] = 0;
    err_set = 0;
}

const char *flexdiag__err_msg(void) { return err_buf; }

const char *flexdiag_last_error(const void *handle) {
    (void)handle;
    return err_buf;
}

uint32_t flexdiag_api_version(void) { return FLEXDIAG_API_VERSION; }

const char *flexdiag_version(void) { return FLEXDIAG_VERSION_STRING; }

const char *flexdiag_status_str(flexdiag_status s) {
    switch (s) {
    case FLEXDIAG_OK: return "ok";
    case FLEXDIAG_ERR_INVALID_ARG: return "invalid argument";
    case FLEXDIAG_ERR_UNSUPPORTED: return "unsupported";
    case FLEXDIAG_ERR_NOT_FOUND: return "not found";
    case FLEXDIAG_ERR_IO: return "I/O error";
    case FLEXDIAG_ERR_NO_SPACE: return "no space left";
    case FLEXDIAG_ERR_CORRUPT_MODEL: return "corrupt model file";
    case FLEXDIAG_ERR_CHECKSUM: return "checksum mismatch";
    case FLEXDIAG_ERR_OOM_DEVICE: return "out of device memory";
    case FLEXDIAG_ERR_OOM_PINNED: return "out of pinned memory";
    case FLEXDIAG_ERR_OOM_HOST: return "out of host memory";
    case FLEXDIAG_ERR_CUDA: return "CUDA error";
    case FLEXDIAG_ERR_CANCELLED: return "cancelled";
    case FLEXDIAG_ERR_BUSY: return "busy";
    case FLEXDIAG_ERR_NUMERIC: return "non-finite value";
    case FLEXDIAG_ERR_INTERNAL: return "internal error";
    case FLEXDIAG_ERR_TIMEOUT: return "timed out";
    }
    return "unknown status";
}

/* ---- assertions ---- */

void flexdiag__assert_fail(const char *expr, const char *func, const char *file, int line) {
    fprintf(stderr, "flexdiag: assertion failed: %s in %s at %s:%d\n", expr, func, file, line);
    abort();
}

/* ---- logging ---- */

flexdiag_log_level flexdiag__log_level = FLEXDIAG_LOG_WARN;
static flexdiag_log_fn log_fn;
static void *log_user;

void flexdiag_log_set(flexdiag_log_fn fn, flexdiag_log_level level, void *user) {
    log_fn = fn;
    log_user = user;
    flexdiag__log_level = level;
}

void flexdiag__log(flexdiag_log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_fn) log_fn(level, msg, log_user);
    else fprintf(stderr, "flexdiag: %s: %s\n", names[level], msg);
}

/* ---- numbers and time ---- */

float flexdiag__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) { /* Inf / NaN */
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t flexdiag__f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to Inf */
    if (a < 0x38800000u) {                                   /* below 2^-14: subnormal */
        float v;
        memcpy(&v, &a, 4);
        v *= 16777216.0f; /* in units of 2^-24, exact */
        uint32_t m = (uint32_t)v;
        float frac = v - (float)m;
        if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m); /* m = 1024 is the smallest normal, correctly encoded */
    }
    uint32_t r = a - 0x38000000u + 0xfffu + ((a >> 13) & 1u); /* rebias 127 -> 15, round */
    return (uint16_t)(sign | (r >> 13));
}

double flexdiag__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
