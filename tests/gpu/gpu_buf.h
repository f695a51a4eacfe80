/*
 * gpu_buf.h - device buffers between guard regions for the GPU op tests (docs/architecture.md
 * §10.2): every output lives between GUARD_N known elements on each side that must come back
 * bit-identical, and its body starts poisoned (0xFF bytes) so an unwritten element shows. One
 * backend and stream per test process, set once with gpu_buf_use().
 */
#ifndef FLEXDIAG_TEST_GPU_BUF_H
#define FLEXDIAG_TEST_GPU_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define GUARD_N 1024 /* guard elements before and after every device buffer */

/* Fail the current cmocka test, naming the call, the status and the error message, unless expr
 * returns FLEXDIAG_OK (needs <cmocka.h> and core.h where it is used). */
#define OK(expr)                                                                                   \
    do {                                                                                           \
        flexdiag_status st_ = (expr);                                                              \
        if (st_ != FLEXDIAG_OK)                                                                    \
            fail_msg("%s: %s: %s", #expr, flexdiag_status_str(st_), flexdiag__err_msg());        \
    } while (0)

typedef struct dbuf {
    uint8_t *base; /* device allocation */
    size_t elem;   /* element size in bytes */
    size_t n;      /* body elements */
    size_t off;    /* extra elements before the body (misaligns it) */
} dbuf;

/* Backend and stream every dbuf_* call uses (borrowed). */
void gpu_buf_use(const flexdiag_kernels *k, flexdiag_stream *s);
/* malloc that fails the test on NULL (0 bytes allowed). */
void *xmalloc(size_t bytes);
/* n elements of elem bytes, off elements past the leading guard; body poisoned with 0xFF. */
dbuf dbuf_make(size_t n, size_t elem, size_t off);
/* Device pointer of the body. */
void *dptr(const dbuf *b);
/* Upload n·elem bytes of host data into the body. */
void dbuf_put(const dbuf *b, const void *host);
/* Copy the body to host; returns 0 (and says so, naming label) if a guard byte changed. */
int dbuf_get(const dbuf *b, void *host, const char *label);
void dbuf_free(dbuf *b);

#endif /* FLEXDIAG_TEST_GPU_BUF_H */
