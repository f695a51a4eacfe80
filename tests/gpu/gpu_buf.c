/*
 * gpu_buf.c - guarded device buffers shared by the GPU op tests (see gpu_buf.h).
 */
#include "gpu_buf.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/core.h"

static const flexdiag_kernels *K;
static flexdiag_stream *S;

void gpu_buf_use(const flexdiag_kernels *k, flexdiag_stream *s) {
    K = k;
    S = s;
}

static uint8_t guard_byte(size_t i) { return (uint8_t)(0x5Au ^ (i * 131u) ^ (i >> 7)); }
static size_t dbuf_total(const dbuf *b) { return (2 * GUARD_N + b->off + b->n) * b->elem; }
static size_t dbuf_head(const dbuf *b) { return (GUARD_N + b->off) * b->elem; }

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

dbuf dbuf_make(size_t n, size_t elem, size_t off) {
    dbuf b = {NULL, elem, n, off};
    const size_t total = dbuf_total(&b);
    uint8_t *img = xmalloc(total);
    for (size_t i = 0; i < total; i++) img[i] = guard_byte(i);
    memset(img + dbuf_head(&b), 0xFF, n * elem);
    void *p = NULL;
    OK(K->mem_alloc(total, &p));
    b.base = p;
    OK(K->copy_h2d(b.base, img, total, S));
    OK(K->stream_sync(S));
    free(img);
    return b;
}

void *dptr(const dbuf *b) { return b->base + dbuf_head(b); }

void dbuf_put(const dbuf *b, const void *host) {
    OK(K->copy_h2d(dptr(b), host, b->n * b->elem, S));
    OK(K->stream_sync(S));
}

int dbuf_get(const dbuf *b, void *host, const char *label) {
    const size_t total = dbuf_total(b), head = dbuf_head(b), body = b->n * b->elem;
    uint8_t *img = xmalloc(total);
    OK(K->copy_d2h(img, b->base, total, S));
    memcpy(host, img + head, body);
    int ok = 1;
    for (size_t i = 0; i < total && ok; i++) {
        if (i == head) i += body;
        if (i < total && img[i] != guard_byte(i)) {
            fprintf(stderr, "%s: guard byte %zu (%s the output) changed\n", label, i,
                    i < head ? "before" : "after");
            ok = 0;
        }
    }
    free(img);
    return ok;
}

void dbuf_free(dbuf *b) {
    K->mem_free(b->base);
    b->base = NULL;
}
