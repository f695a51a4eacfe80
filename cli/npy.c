/*
 * npy.c - NumPy .npy reader and writer for the CLI's exchange files (logits, token grids).
 *
 * Format (numpy/lib/format.py): magic "\x93NUMPY", major and minor version bytes, a header
 * length (u16 LE in 1.0, u32 LE in 2.0/3.0), then a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and ended by
 * '\n', then the raw C-order data. We parse that dict with a small strict scanner (not a Python
 * evaluator): quoted keys, the three required keys once each, string / True|False / int tuple
 * values. Only little-endian '<f4', '<i4', '<i8' in C order are accepted; anything else is
 * FLEXDIAG_ERR_UNSUPPORTED with the reason. Malformed files (bad magic, bad header, truncated or
 * trailing data) are FLEXDIAG_ERR_INVALID_ARG: an .npy is a user-supplied argument, not a model
 * file, so FLEXDIAG_ERR_CORRUPT_MODEL would mislead. All sizes are checked against the file size
 * before the data buffer is allocated. Every failure records its message once, where it is
 * detected (cli_io_fail), and the status travels up unchanged.
 *
 * Writes produce format 1.0 with the header padded so the data starts at a multiple of 64 bytes
 * (what numpy itself writes), atomically through cli_write_atomic.
 */
#include "cli/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/fileio.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_HEADER_CAP (1u << 20) /* bytes of header dict; numpy's own reader caps at 10000 */
#define NPY_ALIGN 64              /* data offset alignment numpy uses when writing */

#define NPY_TRY(expr)                                                                              \
    do {                                                                                           \
        flexdiag_status st_ = (expr);                                                              \
        if (st_ != FLEXDIAG_OK) return st_;                                                        \
    } while (0)

/* ---- header dict scanner ---- */

typedef struct npy_cursor {
    const char *p;   /* next character */
    const char *end; /* one past the header */
} npy_cursor;

typedef struct npy_header {
    char descr[16];                       /* e.g. "<f4" */
    int fortran;                          /* fortran_order value */
    int32_t ndim;                         /* rank */
    int64_t shape[FLEXDIAG_NPY_MAX_DIMS]; /* dims */
    unsigned seen;                        /* bit 0 descr, 1 fortran_order, 2 shape */
} npy_header;

static void skip_ws(npy_cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* Consume ch (after whitespace); 1 on success. */
static int eat(npy_cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A '...' or "..." literal without escapes into out (cap bytes incl. NUL); 1 on success. */
static int scan_string(npy_cursor *c, char *out, size_t cap) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap) return 0;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    out[n] = 0;
    return 1;
}

static int scan_word(npy_cursor *c, const char *w) {
    size_t n = strlen(w);
    skip_ws(c);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* Non-negative decimal that fits int64; 1 on success. */
static int scan_int(npy_cursor *c, int64_t *v) {
    skip_ws(c);
    int64_t x = 0;
    const char *start = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        int d = *c->p++ - '0';
        if (x > (INT64_MAX - d) / 10) return 0;
        x = x * 10 + d;
    }
    *v = x;
    return c->p > start;
}

static const char rank_limit[] = "rank exceeds flexdiag's limit of 8";

/* "(a, b, ...)" with an optional trailing comma; "()" is rank 0. Returns a reason or NULL. */
static const char *scan_shape(npy_cursor *c, npy_header *h) {
    if (!eat(c, '(')) return "shape is not a tuple";
    h->ndim = 0;
    while (!eat(c, ')')) {
        if (h->ndim == FLEXDIAG_NPY_MAX_DIMS) return rank_limit;
        if (!scan_int(c, &h->shape[h->ndim]))
            return "shape holds something other than a non-negative integer";
        h->ndim++;
        if (!eat(c, ',')) {
            if (!eat(c, ')')) return "shape tuple is malformed";
            break;
        }
    }
    return NULL;
}

/* The value of key (bit = its seen flag); returns a reason or NULL. */
static const char *scan_value(npy_cursor *c, npy_header *h, const char *key) {
    if (strcmp(key, "descr") == 0) {
        h->seen |= 1;
        return scan_string(c, h->descr, sizeof h->descr) ? NULL : "descr is not a short string";
    }
    if (strcmp(key, "fortran_order") == 0) {
        h->seen |= 2;
        h->fortran = scan_word(c, "True");
        return h->fortran || scan_word(c, "False") ? NULL : "fortran_order is not True or False";
    }
    if (strcmp(key, "shape") == 0) {
        h->seen |= 4;
        return scan_shape(c, h);
    }
    return "unexpected key (only descr, fortran_order and shape are allowed)";
}

/* Parse the header dict; returns a reason or NULL. */
static const char *scan_dict(npy_cursor *c, npy_header *h) {
    memset(h, 0, sizeof *h);
    if (!eat(c, '{')) return "header is not a dict";
    while (!eat(c, '}')) {
        char key[32];
        if (!scan_string(c, key, sizeof key) || !eat(c, ':')) return "malformed key";
        unsigned before = h->seen;
        const char *why = scan_value(c, h, key);
        if (why) return why;
        if (h->seen == before) return "duplicate key";
        if (!eat(c, ',')) {
            if (!eat(c, '}')) return "malformed dict";
            break;
        }
    }
    skip_ws(c);
    if (c->p != c->end) return "text after the dict";
    return h->seen == 7 ? NULL : "descr, fortran_order or shape is missing";
}

/* ---- read ---- */

static flexdiag_status bad(const char *path, const char *why) {
    return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "%s: not a valid .npy file: %s", path, why);
}

static int dtype_size(int32_t dtype) { return dtype == FLEXDIAG_NPY_I64 ? 8 : 4; }

/* Read exactly n bytes at off (retrying short reads and EINTR); what names the part. */
static flexdiag_status pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                                  const char *what) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return cli_io_fail(FLEXDIAG_ERR_IO, "%s: reading %s: %s", path, what,
                               r < 0 ? strerror(errno) : "file truncated");
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return FLEXDIAG_OK;
}

/* Magic, version and header length; *hdr_at / *hdr_len locate the dict. */
static flexdiag_status read_preamble(int fd, const char *path, uint64_t size, uint64_t *hdr_at,
                                     uint64_t *hdr_len) {
    unsigned char pre[12];
    if (size < 10) return bad(path, "shorter than the 10-byte preamble");
    NPY_TRY(pread_full(fd, pre, size < 12 ? 10 : 12, 0, path, "the preamble"));
    if (memcmp(pre, NPY_MAGIC, 6) != 0) return bad(path, "bad magic (expected \\x93NUMPY)");
    if (pre[6] == 1) {
        *hdr_at = 10;
        *hdr_len = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    } else if ((pre[6] == 2 || pre[6] == 3) && size >= 12) {
        *hdr_at = 12;
        *hdr_len = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 |
                   (uint64_t)pre[11] << 24;
    } else {
        return cli_io_fail(FLEXDIAG_ERR_UNSUPPORTED,
                           "%s: .npy format version %d.%d is not supported (1.0, 2.0, 3.0 are)",
                           path, pre[6], pre[7]);
    }
    if (*hdr_len > NPY_HEADER_CAP) return bad(path, "header longer than the 1 MiB cap");
    if (*hdr_at + *hdr_len > size) return bad(path, "truncated in the header");
    return FLEXDIAG_OK;
}

/* descr and fortran_order -> dtype, or UNSUPPORTED with the reason. */
static flexdiag_status header_dtype(const char *path, const npy_header *h, int32_t *dt) {
    static const struct {
        const char *descr;
        int32_t dt;
    } ok[] = {{"<f4", FLEXDIAG_NPY_F32}, {"<i4", FLEXDIAG_NPY_I32}, {"<i8", FLEXDIAG_NPY_I64}};
    if (h->fortran)
        return cli_io_fail(FLEXDIAG_ERR_UNSUPPORTED,
                           "%s: array is in Fortran order; save it with np.ascontiguousarray "
                           "first",
                           path);
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (strcmp(h->descr, ok[i].descr) == 0) {
            *dt = ok[i].dt;
            return FLEXDIAG_OK;
        }
    }
    return cli_io_fail(FLEXDIAG_ERR_UNSUPPORTED,
                       "%s: dtype '%s' is not supported%s (use little-endian float32, int32 or "
                       "int64: '<f4', '<i4', '<i8')",
                       path, h->descr, h->descr[0] == '>' ? " (big-endian)" : "");
}

/* Parse the dict at [at, at + len) into out's dtype, rank, shape and numel (checked). */
static flexdiag_status read_header(int fd, const char *path, uint64_t at, uint64_t len,
                                   flexdiag_npy *out) {
    char *buf = malloc(len ? len : 1);
    if (!buf) return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    flexdiag_status s = pread_full(fd, buf, len, at, path, "the header");
    npy_header h;
    npy_cursor c = {buf, buf + len};
    const char *why = s == FLEXDIAG_OK ? scan_dict(&c, &h) : NULL;
    free(buf);
    if (s != FLEXDIAG_OK) return s;
    if (why == rank_limit) return cli_io_fail(FLEXDIAG_ERR_UNSUPPORTED, "%s: %s", path, why);
    if (why) return bad(path, why);
    NPY_TRY(header_dtype(path, &h, &out->dtype));
    uint64_t numel = 1;
    for (int32_t i = 0; i < h.ndim; i++) {
        if (__builtin_mul_overflow(numel, (uint64_t)h.shape[i], &numel) || numel > INT64_MAX)
            return bad(path, "element count of the shape overflows 64 bits");
        out->shape[i] = h.shape[i];
    }
    out->ndim = h.ndim;
    out->numel = (int64_t)numel;
    return FLEXDIAG_OK;
}

/* Data of out (size checked against the file before allocating). */
static flexdiag_status read_data(int fd, const char *path, uint64_t at, uint64_t size,
                                 flexdiag_npy *out) {
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)out->numel, (uint64_t)dtype_size(out->dtype), &nbytes))
        return bad(path, "data size overflows 64 bits");
    if (size - at != nbytes)
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG,
                           "%s: not a valid .npy file: the shape needs %" PRIu64
                           " data bytes but the file holds %" PRIu64 " (%s)",
                           path, nbytes, size - at,
                           size - at < nbytes ? "truncated" : "trailing bytes");
    out->data = malloc(nbytes ? nbytes : 1);
    if (!out->data)
        return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory for %" PRIu64 " bytes", path,
                           nbytes);
    return pread_full(fd, out->data, nbytes, at, path, "the data");
}

flexdiag_status flexdiag__npy_read(const char *path, flexdiag_npy *out) {
    if (!out) return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "npy: no output given");
    memset(out, 0, sizeof *out);
    if (!path) return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "npy: no path given");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = fd < 0 ? errno : EINVAL;
        if (fd >= 0) close(fd);
        return cli_io_fail(e == ENOENT ? FLEXDIAG_ERR_NOT_FOUND : FLEXDIAG_ERR_IO,
                           "%s: cannot open .npy file: %s", path,
                           e == EINVAL ? "not a regular file" : strerror(e));
    }
    uint64_t size = (uint64_t)sb.st_size, at = 0, len = 0;
    flexdiag_status s = read_preamble(fd, path, size, &at, &len);
    if (s == FLEXDIAG_OK) s = read_header(fd, path, at, len, out);
    if (s == FLEXDIAG_OK) s = read_data(fd, path, at + len, size, out);
    close(fd);
    if (s != FLEXDIAG_OK) flexdiag__npy_free(out);
    return s;
}

void flexdiag__npy_free(flexdiag_npy *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---- write ---- */

/* Dict text for dtype and shape, padded with spaces and '\n' to a 64-byte data offset. */
static char *format_header(int32_t dtype, int32_t ndim, const int64_t *shape, size_t *len) {
    const char *descr = dtype == FLEXDIAG_NPY_F32   ? "<f4"
                        : dtype == FLEXDIAG_NPY_I32 ? "<i4"
                                                    : "<i8";
    char dims[FLEXDIAG_NPY_MAX_DIMS * 24 + 8];
    size_t used = 0;
    for (int32_t i = 0; i < ndim; i++)
        used += (size_t)snprintf(dims + used, sizeof dims - used, "%s%" PRId64, i ? ", " : "",
                                 shape[i]);
    if (ndim == 1) snprintf(dims + used, sizeof dims - used, ",");
    if (ndim == 0) dims[0] = 0;
    char dict[sizeof dims + 80];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, dims);
    size_t total = ((10 + (size_t)n + 1 + NPY_ALIGN - 1) / NPY_ALIGN) * NPY_ALIGN;
    char *hdr = malloc(total - 10);
    if (!hdr) return NULL;
    memcpy(hdr, dict, (size_t)n);
    memset(hdr + n, ' ', total - 10 - (size_t)n);
    hdr[total - 11] = '\n';
    *len = total - 10;
    return hdr;
}

flexdiag_status flexdiag__npy_write(const char *path, int32_t dtype, int32_t ndim,
                                    const int64_t *shape, const void *data) {
    if (!path ||
        (dtype != FLEXDIAG_NPY_F32 && dtype != FLEXDIAG_NPY_I32 && dtype != FLEXDIAG_NPY_I64) ||
        ndim < 0 || ndim > FLEXDIAG_NPY_MAX_DIMS || (ndim > 0 && !shape))
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG,
                           "%s: npy write needs F32, I32 or I64 and rank 0..8 (got dtype %d, "
                           "rank %d)",
                           path ? path : "(null)", (int)dtype, (int)ndim);
    uint64_t nbytes = (uint64_t)dtype_size(dtype);
    for (int32_t i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(nbytes, (uint64_t)shape[i], &nbytes))
            return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG,
                               "%s: npy write: dim %d is negative or the size overflows", path,
                               (int)i);
    if (nbytes > 0 && !data)
        return cli_io_fail(FLEXDIAG_ERR_INVALID_ARG, "%s: npy write: NULL data", path);
    size_t hlen;
    char *hdr = format_header(dtype, ndim, shape, &hlen);
    if (!hdr) return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    unsigned char pre[10];
    memcpy(pre, NPY_MAGIC "\x01\x00", 8); /* magic, version 1.0 */
    pre[8] = (unsigned char)(hlen & 0xff);   /* header length, u16 LE */
    pre[9] = (unsigned char)(hlen >> 8);
    cli_part parts[3] = {{pre, sizeof pre}, {hdr, hlen}, {data, (size_t)nbytes}};
    flexdiag_status s = cli_write_atomic(path, parts, 3);
    free(hdr);
    return s;
}
