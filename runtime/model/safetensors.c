/*
 * safetensors.c - the validated safetensors reader (one file, a folder, or a sharded
 * model.safetensors.index.json), the atomic writer, and the file helpers npy.c shares.
 *
 * Open: every header is checked (docs/formats.md §2.5) before anything is sized from it: the
 * 8-byte length prefix against a 100 MB cap and the file size, '{' start, UTF-8, a structural
 * pre-scan (nesting depth, entry count) so jansson never builds a tree for a hostile header,
 * JSON with duplicate keys rejected, dtype, shape and data_offsets of each entry with checked
 * multiplication, then full contiguous coverage of the data section. An index is
 * checked both ways: every listed tensor lives in its shard, every shard tensor is listed there.
 * Tensors end up sorted by name for binary search; each file keeps one descriptor open.
 *
 * Reads use pread into the caller's buffer (via an 8 MiB bounce buffer when converting), never
 * mmap: a mapped file that is truncated while we run raises SIGBUS on access, which a library
 * cannot recover from, whereas pread returns 0 and we report FLEXDIAG_ERR_IO naming the tensor.
 *
 * Dtypes: BF16/F16/F32 convert to bf16 or fp32; I32/I64 and the other standard safetensors
 * dtypes (F64, U8, F8_*, ...) are validated with their sizes so checkpoints holding them open,
 * but only flexdiag__st_read_raw copies them. Unknown dtype strings fail the open, because their
 * size, and so the layout check, is unknown.
 */
#include "runtime/model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <libgen.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/core.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

#define ST_HEADER_CAP 100000000ull /* header bytes; the reference Rust reader's limit */

/* Read exactly n bytes at off from fd (retrying short reads and EINTR). Errors are
 * FLEXDIAG_ERR_IO naming path and what ("tensor 'x'", "header"): strerror, or "file truncated"
 * when the file ends first. */
static flexdiag_status pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                                  const char *what);
#define ST_CHUNK ((size_t)8 << 20) /* bounce buffer for converting reads: bounded memory */
#define ST_MAX_DEPTH 3             /* root { entry { shape [ : valid headers never nest deeper */

/* ---- dtypes ---- */

static const struct st_dtype {
    const char *name; /* safetensors spelling */
    int code;         /* flexdiag_dtype value or stored-only FLEXDIAG_DTYPE_* */
    int size;         /* bytes per element */
} dtypes[] = {
    {"BF16", FLEXDIAG_DTYPE_BF16, 2},       {"F16", FLEXDIAG_DTYPE_F16, 2},
    {"F32", FLEXDIAG_DTYPE_F32, 4},         {"I32", FLEXDIAG_DTYPE_I32, 4},
    {"I64", FLEXDIAG_DTYPE_I64, 8},         {"F64", FLEXDIAG_DTYPE_F64, 8},
    {"BOOL", FLEXDIAG_DTYPE_BOOL, 1},       {"U8", FLEXDIAG_DTYPE_U8, 1},
    {"I8", FLEXDIAG_DTYPE_I8, 1},           {"I16", FLEXDIAG_DTYPE_I16, 2},
    {"U16", FLEXDIAG_DTYPE_U16, 2},         {"U32", FLEXDIAG_DTYPE_U32, 4},
    {"U64", FLEXDIAG_DTYPE_U64, 8},         {"F8_E4M3", FLEXDIAG_DTYPE_F8_E4M3, 1},
    {"F8_E5M2", FLEXDIAG_DTYPE_F8_E5M2, 1}, {"F8_E8M0", FLEXDIAG_DTYPE_F8_E8M0, 1},
    {"C64", FLEXDIAG_DTYPE_C64, 8},
};

static const struct st_dtype *dtype_info(int code) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].code == code) return &dtypes[i];
    return NULL;
}

int flexdiag__dtype_parse(const char *str) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].name, str) == 0) return dtypes[i].code;
    return -1;
}

int flexdiag__dtype_size(flexdiag_dtype dt) {
    const struct st_dtype *d = dtype_info((int)dt);
    return d ? d->size : 0;
}

const char *flexdiag__dtype_name(flexdiag_dtype dt) {
    const struct st_dtype *d = dtype_info((int)dt);
    return d ? d->name : "unknown";
}

/* ---- reader state ---- */

typedef struct st_file {
    char *path;                 /* as opened (owned) */
    int fd;                     /* read-only descriptor held for the reader's lifetime */
    uint64_t size;              /* bytes at open */
    atomic_int rounding_logged; /* 1 once the F32 -> bf16 rounding INFO was logged */
} st_file;

struct flexdiag_safetensors {
    st_file *files;              /* n_files opened files (shards in index order) */
    int32_t n_files;             /* files used */
    flexdiag_st_tensor *tensors; /* n_tensors entries, sorted by name once open returns */
    int64_t n_tensors;           /* tensors used */
    int64_t cap_tensors;         /* tensors allocated */
};

/* Open path read-only and append it to st's file list; *idx receives its index. */
static flexdiag_status add_file(flexdiag_safetensors *st, const char *path, int32_t *idx) {
    /* O_NONBLOCK: opening a FIFO must not hang; it is then rejected as not a regular file */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return flexdiag__err(e == ENOENT ? FLEXDIAG_ERR_NOT_FOUND : FLEXDIAG_ERR_IO,
                             "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return flexdiag__err(FLEXDIAG_ERR_IO, "%s: not a regular file", path);
    }
    st_file *files = realloc(st->files, sizeof *files * (size_t)(st->n_files + 1));
    char *copy = strdup(path);
    if (files) st->files = files;
    if (!files || !copy) {
        close(fd);
        free(copy);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    }
    st_file *f = &st->files[st->n_files];
    f->path = copy;
    f->fd = fd;
    f->size = (uint64_t)sb.st_size;
    atomic_init(&f->rounding_logged, 0);
    *idx = st->n_files++;
    return FLEXDIAG_OK;
}

/* Room for `more` tensors; the array always exists afterwards (no NULL + 0 arithmetic). */
static int reserve_tensors(flexdiag_safetensors *st, int64_t more) {
    int64_t need = st->n_tensors + more > 0 ? st->n_tensors + more : 1;
    if (need <= st->cap_tensors) return 1;
    int64_t cap = st->cap_tensors * 2 > need ? st->cap_tensors * 2 : need;
    flexdiag_st_tensor *t = realloc(st->tensors, sizeof *t * (size_t)cap);
    if (!t) return 0;
    st->tensors = t;
    st->cap_tensors = cap;
    return 1;
}

/* ---- header checks ---- */

/* Offset of the first byte that is not valid UTF-8 (overlong forms, surrogates and code points
 * above U+10FFFF included), or -1. */
static int64_t utf8_bad_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len = c < 0x80             ? 1
                     : (c & 0xe0) == 0xc0 ? 2
                     : (c & 0xf0) == 0xe0 ? 3
                     : (c & 0xf8) == 0xf0 ? 4
                                          : 0;
        if (len == 0 || i + len > n) return (int64_t)i;
        uint32_t cp = len == 1 ? c : c & (0x7fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (s[i + k] & 0x3fu);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return (int64_t)i;
        i += len;
    }
    return -1;
}

/* Structural pass before jansson builds a tree: nesting depth and the top-level member count,
 * so a header with millions of entries or deep nesting is rejected without allocating. Malformed
 * JSON passes through here and is reported by the parser. */
static flexdiag_status prescan_header(const char *path, const char *h, size_t n) {
    int depth = 0, in_str = 0;
    size_t commas = 0;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if ((c == '{' || c == '[') && ++depth > ST_MAX_DEPTH) {
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: header nests deeper than %d levels at header offset %zu "
                                 "(safetensors headers never do)",
                                 path, ST_MAX_DEPTH, i);
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',' && depth == 1 && ++commas > FLEXDIAG_ST_MAX_ENTRIES) { /* + __metadata__ */
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: header lists over %d entries, more than the cap of %d",
                                 path, FLEXDIAG_ST_MAX_ENTRIES + 1, FLEXDIAG_ST_MAX_ENTRIES);
        }
    }
    return FLEXDIAG_OK;
}

/* Syntax checks of the n header bytes: '{' start, UTF-8, JSON without duplicate keys. */
static flexdiag_status parse_header(const char *path, const char *hdr, size_t n, json_t **root) {
    json_error_t jerr;
    if (n == 0 || hdr[0] != '{')
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: header does not start with '{' (not a safetensors file)", path);
    int64_t bad = utf8_bad_at((const unsigned char *)hdr, n);
    if (bad >= 0)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: header is not valid UTF-8 (byte 0x%02x at header offset %" PRId64
                             ")",
                             path, (unsigned char)hdr[bad], bad);
    FLEXDIAG_TRY(prescan_header(path, hdr, n));
    *root = json_loadb(hdr, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: header is not valid JSON at header offset %d: %s", path,
                             jerr.position, jerr.text);
    return FLEXDIAG_OK; /* an object: it starts with '{' and jansson rejects trailing text */
}

/* Read and syntax-check the JSON header of file f: length prefix, caps, UTF-8, '{', JSON. */
static flexdiag_status load_header(const st_file *f, json_t **root, uint64_t *data_start) {
    if (f->size < 8)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: file is %" PRIu64 " bytes, shorter than the 8-byte header "
                             "length (not a safetensors file)",
                             f->path, f->size);
    unsigned char pre[8];
    FLEXDIAG_TRY(pread_full(f->fd, pre, 8, 0, f->path, "the header length"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | pre[i];
    if (n > ST_HEADER_CAP)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: header length %" PRIu64 " exceeds the %llu-byte cap (file is "
                             "not safetensors or is corrupt)",
                             f->path, n, ST_HEADER_CAP);
    if (8 + n > f->size)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: header length %" PRIu64 " needs %" PRIu64 " bytes but the file "
                             "has %" PRIu64 " (truncated in the header?)",
                             f->path, n, 8 + n, f->size);
    char *hdr = malloc(n ? n : 1);
    if (!hdr)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory for the header", f->path);
    *data_start = 8 + n;
    flexdiag_status s = pread_full(f->fd, hdr, n, 8, f->path, "the header");
    if (s == FLEXDIAG_OK) s = parse_header(f->path, hdr, n, root);
    free(hdr);
    return s;
}

static flexdiag_status check_metadata(const char *path, json_t *meta) {
    if (!json_is_object(meta))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: __metadata__ must be an object of strings", path);
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: __metadata__ value '%.*s' is not a string (metadata "
                                 "values must be strings)",
                                 path, FLEXDIAG_ST_NAME_MSG, key);
    }
    return FLEXDIAG_OK;
}

/* "[2, 3]" of a shape array, for messages. */
static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int32_t ndim) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < ndim && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Shape array -> t->ndim, t->shape, t->numel (checked). */
static flexdiag_status parse_shape(const char *path, const char *name, json_t *sh,
                                   flexdiag_st_tensor *t) {
    if (!json_is_array(sh))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': shape must be an array of non-negative integers",
                             path, FLEXDIAG_ST_NAME_MSG, name);
    size_t nd = json_array_size(sh);
    if (nd > FLEXDIAG_ST_MAX_DIMS)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: tensor '%.*s': rank %zu exceeds flexdiag's limit of %d", path,
                             FLEXDIAG_ST_NAME_MSG, name, nd, FLEXDIAG_ST_MAX_DIMS);
    uint64_t numel = 1;
    int overflow = 0;
    t->ndim = (int32_t)nd;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(sh, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%.*s': shape dim %zu is not a non-negative integer",
                                 path, FLEXDIAG_ST_NAME_MSG, name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
        overflow |= !flexdiag__mul_ok(numel, (uint64_t)t->shape[i], &numel);
    }
    if (overflow || numel > INT64_MAX) {
        char sbuf[256];
        fmt_shape(sbuf, sizeof sbuf, t->shape, t->ndim);
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': element count of shape %s overflows 64 bits", path,
                             FLEXDIAG_ST_NAME_MSG, name, sbuf);
    }
    t->numel = (int64_t)numel;
    return FLEXDIAG_OK;
}

static flexdiag_status parse_offsets(const char *path, const char *name, json_t *off,
                                     uint64_t *begin, uint64_t *end) {
    json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(b) ||
        !json_is_integer(e) || json_integer_value(b) < 0 || json_integer_value(e) < 0)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': data_offsets must be [begin, end] of non-negative "
                             "integers",
                             path, FLEXDIAG_ST_NAME_MSG, name);
    *begin = (uint64_t)json_integer_value(b);
    *end = (uint64_t)json_integer_value(e);
    if (*end < *begin)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 ") end "
                             "before they begin",
                             path, FLEXDIAG_ST_NAME_MSG, name, *begin, *end);
    return FLEXDIAG_OK;
}

/* One header entry -> t (name borrowed from the JSON tree, offset relative to the data). */
static flexdiag_status parse_entry(const char *path, const char *name, json_t *v,
                                   flexdiag_st_tensor *t) {
    if (!json_is_object(v))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': entry must be an object with dtype, shape and "
                             "data_offsets",
                             path, FLEXDIAG_ST_NAME_MSG, name);
    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': dtype must be a string", path, FLEXDIAG_ST_NAME_MSG, name);
    int code = flexdiag__dtype_parse(json_string_value(dt));
    if (code < 0)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "%s: tensor '%.*s': unknown dtype '%.32s' (flexdiag reads BF16, "
                             "F16, F32, I32, I64 and skips other standard safetensors dtypes)",
                             path, FLEXDIAG_ST_NAME_MSG, name, json_string_value(dt));
    t->name = name;
    t->dtype = (flexdiag_dtype)code;
    FLEXDIAG_TRY(parse_shape(path, name, json_object_get(v, "shape"), t));
    uint64_t begin = 0, end = 0, nbytes;
    FLEXDIAG_TRY(parse_offsets(path, name, json_object_get(v, "data_offsets"), &begin, &end));
    int size = flexdiag__dtype_size(t->dtype);
    char sbuf[256];
    fmt_shape(sbuf, sizeof sbuf, t->shape, t->ndim);
    if (!flexdiag__mul_ok((uint64_t)t->numel, (uint64_t)size, &nbytes) || nbytes > INT64_MAX)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': byte size of shape %s of %s overflows 64 bits",
                             path, FLEXDIAG_ST_NAME_MSG, name, sbuf, flexdiag__dtype_name(t->dtype));
    if (end - begin != nbytes)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64
                             ") hold %" PRIu64 " bytes but shape %s of %s needs %" PRIu64,
                             path, FLEXDIAG_ST_NAME_MSG, name, begin, end, end - begin, sbuf,
                             flexdiag__dtype_name(t->dtype), nbytes);
    t->offset = begin;
    t->nbytes = nbytes;
    return FLEXDIAG_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const flexdiag_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Sorted by begin, the tensors must tile [0, data_size) exactly: no hole, overlap or tail. */
static flexdiag_status check_layout(const char *path, flexdiag_st_tensor *t, int64_t n,
                                    uint64_t data_size) {
    if (n > 1) qsort(t, (size_t)n, sizeof *t, cmp_begin);
    uint64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t b = t[i].offset, e = b + t[i].nbytes;
        if (b > pos && i == 0)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%.*s': first tensor begins at %" PRIu64 ", not 0 "
                                 "(hole at the start of the data)",
                                 path, FLEXDIAG_ST_NAME_MSG, t[i].name, b);
        if (b > pos)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%.*s': hole of %" PRIu64 " bytes before it (tensor "
                                 "'%.*s' ends at %" PRIu64 ", this one begins at %" PRIu64 ")",
                                 path, FLEXDIAG_ST_NAME_MSG, t[i].name, b - pos, FLEXDIAG_ST_NAME_MSG, t[i - 1].name,
                                 pos, b);
        if (b < pos)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 ") "
                                 "overlap tensor '%.*s', which ends at %" PRIu64,
                                 path, FLEXDIAG_ST_NAME_MSG, t[i].name, b, e, FLEXDIAG_ST_NAME_MSG, t[i - 1].name,
                                 pos);
        if (e > data_size)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 ") run "
                                 "past the end of the %" PRIu64 "-byte data section (file "
                                 "truncated?)",
                                 path, FLEXDIAG_ST_NAME_MSG, t[i].name, b, e, data_size);
        pos = e;
    }
    if (pos != data_size)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: %" PRIu64 " bytes of trailing data after the last tensor "
                             "(tensors cover %" PRIu64 " of %" PRIu64 " data bytes)",
                             path, data_size - pos, pos, data_size);
    return FLEXDIAG_OK;
}

/* Parse every entry of root into st->tensors[n_tensors..), check the layout, copy the names. */
static flexdiag_status parse_entries(flexdiag_safetensors *st, int32_t fi, json_t *root,
                                     uint64_t data_start) {
    const st_file *f = &st->files[fi];
    json_t *meta = json_object_get(root, "__metadata__");
    if (meta) FLEXDIAG_TRY(check_metadata(f->path, meta));
    size_t n = json_object_size(root) - (meta != NULL);
    if (n > FLEXDIAG_ST_MAX_ENTRIES)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: header lists %zu tensors, more than the cap of %d", f->path, n,
                             FLEXDIAG_ST_MAX_ENTRIES);
    if (!reserve_tensors(st, (int64_t)n))
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory for %zu tensors", f->path,
                             n);
    flexdiag_st_tensor *t = st->tensors + st->n_tensors;
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (v == meta) continue;
        memset(&t[i], 0, sizeof t[i]);
        FLEXDIAG_TRY(parse_entry(f->path, key, v, &t[i]));
        t[i++].file = fi;
    }
    FLEXDIAG_TRY(check_layout(f->path, t, (int64_t)n, f->size - data_start));
    for (i = 0; i < n; i++) {
        char *name = strdup(t[i].name);
        if (!name) {
            while (i-- > 0) free((char *)t[i].name);
            return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", f->path);
        }
        t[i].name = name;
        t[i].offset += data_start;
    }
    st->n_tensors += (int64_t)n;
    return FLEXDIAG_OK;
}

/* Open one .safetensors file, validate it fully and append its tensors. */
static flexdiag_status open_file(flexdiag_safetensors *st, const char *path) {
    int32_t fi = -1;
    FLEXDIAG_TRY(add_file(st, path, &fi));
    json_t *root = NULL;
    uint64_t data_start = 0;
    FLEXDIAG_TRY(load_header(&st->files[fi], &root, &data_start));
    flexdiag_status s = parse_entries(st, fi, root, data_start);
    json_decref(root);
    return s;
}

/* ---- sharded index ---- */

/* Whole JSON file (size-capped before allocation), parsed with duplicate keys rejected. */
static flexdiag_status load_json_file(const char *path, json_t **root) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return flexdiag__err(e == ENOENT ? FLEXDIAG_ERR_NOT_FOUND : FLEXDIAG_ERR_IO,
                             "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    flexdiag_status s = FLEXDIAG_OK;
    char *buf = NULL;
    json_error_t jerr;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        s = flexdiag__err(FLEXDIAG_ERR_IO, "%s: not a readable regular file", path);
    else if ((uint64_t)sb.st_size > ST_HEADER_CAP)
        s = flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                          "%s: index is %lld bytes, over the %llu-byte cap", path,
                          (long long)sb.st_size, ST_HEADER_CAP);
    else if (!(buf = malloc((size_t)sb.st_size + 1)))
        s = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    else
        s = pread_full(fd, buf, (size_t)sb.st_size, 0, path, "the index");
    if (s == FLEXDIAG_OK &&
        !(*root = json_loadb(buf, (size_t)sb.st_size, JSON_REJECT_DUPLICATES, &jerr)))
        s = flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: not valid JSON at byte %d: %s", path,
                          jerr.position, jerr.text);
    free(buf);
    close(fd);
    return s;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Check weight_map's values and return its distinct shard names, sorted (borrowed strings). */
static flexdiag_status list_shards(const char *path, json_t *wm, const char ***out, size_t *n) {
    if (!json_is_object(wm))
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: index has no \"weight_map\" object (tensor -> shard file)", path);
    size_t cnt = json_object_size(wm), k = 0;
    if (cnt == 0) /* also keeps "an open reader has at least one file" true */
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL, "%s: weight_map is empty (no tensors)",
                             path);
    if (cnt > FLEXDIAG_ST_MAX_ENTRIES)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: weight_map lists %zu tensors, more than the cap of %d", path,
                             cnt, FLEXDIAG_ST_MAX_ENTRIES);
    const char **names = malloc(sizeof *names * cnt);
    if (!names) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *s = json_string_value(v);
        if (!s || !*s || strchr(s, '/') || strstr(s, "..")) {
            free(names);
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%.*s': shard '%.*s' must be a plain file name in the "
                                 "index's folder (no '/', no '..')",
                                 path, FLEXDIAG_ST_NAME_MSG, key, FLEXDIAG_ST_NAME_MSG, s ? s : "(not a string)");
        }
        names[k++] = s;
    }
    if (cnt > 1) qsort(names, cnt, sizeof *names, cmp_str);
    size_t u = 0;
    for (k = 0; k < cnt; k++)
        if (u == 0 || strcmp(names[u - 1], names[k]) != 0) names[u++] = names[k];
    *out = names;
    *n = u;
    return FLEXDIAG_OK;
}

/* Every shard tensor must be listed under its own shard; every listed tensor must exist. */
static flexdiag_status check_index_map(flexdiag_safetensors *st, const char *path, json_t *wm,
                                       const char **shards) {
    for (int64_t i = 0; i < st->n_tensors; i++) {
        const flexdiag_st_tensor *t = &st->tensors[i];
        const char *want = json_string_value(json_object_get(wm, t->name));
        if (!want || strcmp(want, shards[t->file]) != 0)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: tensor '%.*s' is in shard '%s' but the index %s%.*s%s "
                                 "(tensors must be listed once, under the shard holding them)",
                                 path, FLEXDIAG_ST_NAME_MSG, t->name, shards[t->file],
                                 want ? "maps it to '" : "does not list it", FLEXDIAG_ST_NAME_MSG,
                                 want ? want : "", want ? "'" : "");
    }
    if ((size_t)st->n_tensors == json_object_size(wm)) return FLEXDIAG_OK;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!flexdiag__st_find(st, key))
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: index lists tensor '%.*s' in shard '%s', which does not "
                                 "hold it",
                                 path, FLEXDIAG_ST_NAME_MSG, key, json_string_value(v));
    }
    return FLEXDIAG_OK;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const flexdiag_st_tensor *)a)->name, ((const flexdiag_st_tensor *)b)->name);
}

static void sort_by_name(flexdiag_safetensors *st) {
    if (st->n_tensors > 1) qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_name);
}

/* Open every shard of index `path` once (file i = shard i) and cross-check the weight_map. */
static flexdiag_status open_index(flexdiag_safetensors *st, const char *path) {
    json_t *root = NULL;
    FLEXDIAG_TRY(load_json_file(path, &root));
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    const char **shards = NULL;
    size_t n = 0;
    char *dir_copy = strdup(path);
    flexdiag_status s = dir_copy ? list_shards(path, wm, &shards, &n)
                                 : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "out of memory");
    const char *dir = dir_copy ? dirname(dir_copy) : "";
    for (size_t i = 0; s == FLEXDIAG_OK && i < n; i++) {
        char *sp = NULL;
        if (asprintf(&sp, "%s/%s", dir, shards[i]) < 0) {
            s = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "out of memory");
            break;
        }
        s = open_file(st, sp);
        if (s != FLEXDIAG_OK) flexdiag__err_prefix(s, "index %s", path);
        free(sp);
    }
    if (s == FLEXDIAG_OK) {
        sort_by_name(st);
        s = check_index_map(st, path, wm, shards);
    }
    free(shards);
    free(dir_copy);
    json_decref(root);
    return s;
}

/* ---- open / query ---- */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static flexdiag_status open_folder(flexdiag_safetensors *st, const char *path) {
    static const char *const names[] = {"model.safetensors.index.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *p = NULL;
        struct stat sb;
        if (asprintf(&p, "%s/%s", path, names[i]) < 0)
            return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "out of memory");
        if (stat(p, &sb) == 0) {
            flexdiag_status s = i == 0 ? open_index(st, p) : open_file(st, p);
            free(p);
            return s;
        }
        free(p);
    }
    return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND,
                         "%s: folder holds neither model.safetensors.index.json nor "
                         "model.safetensors (pass the checkpoint file or index explicitly)",
                         path);
}

flexdiag_status flexdiag__st_open(const char *path, flexdiag_safetensors **out) {
    FLEXDIAG_ASSERT(out != NULL);
    *out = NULL;
    if (!path || !*path)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "safetensors: no path given");
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        return flexdiag__err(e == ENOENT ? FLEXDIAG_ERR_NOT_FOUND : FLEXDIAG_ERR_IO,
                             "%s: cannot open checkpoint: %s", path, strerror(e));
    }
    flexdiag_safetensors *st = calloc(1, sizeof *st);
    if (!st) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory", path);
    flexdiag_status s = S_ISDIR(sb.st_mode)        ? open_folder(st, path)
                        : ends_with(path, ".json") ? open_index(st, path)
                                                   : open_file(st, path);
    if (s != FLEXDIAG_OK) {
        flexdiag__st_close(st);
        return s;
    }
    sort_by_name(st);
    *out = st;
    return FLEXDIAG_OK;
}

void flexdiag__st_close(flexdiag_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    for (int32_t i = 0; i < st->n_files; i++) {
        close(st->files[i].fd);
        free(st->files[i].path);
    }
    free(st->tensors);
    free(st->files);
    free(st);
}

int64_t flexdiag__st_count(const flexdiag_safetensors *st) { return st->n_tensors; }

const flexdiag_st_tensor *flexdiag__st_at(const flexdiag_safetensors *st, int64_t i) {
    FLEXDIAG_ASSERT(i >= 0 && i < st->n_tensors);
    return &st->tensors[i];
}

const flexdiag_st_tensor *flexdiag__st_find(const flexdiag_safetensors *st, const char *name) {
    flexdiag_st_tensor key = {.name = name};
    if (st->n_tensors == 0) return NULL;
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, cmp_name);
}

const char *flexdiag__st_file_path(const flexdiag_safetensors *st, int32_t file) {
    FLEXDIAG_ASSERT(file >= 0 && file < st->n_files);
    return st->files[file].path;
}

/* ---- reads ---- */

static flexdiag_status pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                                  const char *what) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return flexdiag__err(FLEXDIAG_ERR_IO, "%s: read error in %s at offset %" PRIu64 ": %s",
                                 path, what, off + done, strerror(errno));
        if (r == 0)
            return flexdiag__err(FLEXDIAG_ERR_IO,
                                 "%s: file truncated while reading %s (got %zu "
                                 "of %zu bytes at offset %" PRIu64 ")",
                                 path, what, done, n, off);
        done += (size_t)r;
    }
    return FLEXDIAG_OK;
}

/* Bytes [from, from + n) of t's data into buf. */
static flexdiag_status read_span(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                 void *buf, uint64_t from, size_t n) {
    char what[FLEXDIAG_ST_NAME_MSG + 16];
    snprintf(what, sizeof what, "tensor '%.*s'", FLEXDIAG_ST_NAME_MSG, t->name);
    const st_file *f = &st->files[t->file];
    return pread_full(f->fd, buf, n, t->offset + from, f->path, what);
}

typedef void (*convert_fn)(void *dst, const void *src, size_t n);

static void f16_to_bf16(void *dst, const void *src, size_t n) {
    const uint16_t *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = flexdiag__f32_to_bf16(flexdiag__f16_to_f32(s[i]));
}

static void f32_to_bf16(void *dst, const void *src, size_t n) {
    const float *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = flexdiag__f32_to_bf16(s[i]);
}

static void bf16_to_f32(void *dst, const void *src, size_t n) {
    const uint16_t *s = src;
    float *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = flexdiag__bf16_to_f32(s[i]);
}

static void f16_to_f32(void *dst, const void *src, size_t n) {
    const uint16_t *s = src;
    float *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = flexdiag__f16_to_f32(s[i]);
}

/* Read t chunk by chunk through a bounce buffer, converting each chunk into dst. */
static flexdiag_status read_converted(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                      void *dst, size_t dst_elem, convert_fn fn) {
    size_t esz = (size_t)flexdiag__dtype_size(t->dtype), per = ST_CHUNK / esz;
    size_t total = (size_t)t->numel;
    void *buf = malloc(total < per ? total * esz + 1 : ST_CHUNK);
    if (!buf)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                             "tensor '%.*s': out of memory for the read buffer", FLEXDIAG_ST_NAME_MSG,
                             t->name);
    flexdiag_status s = FLEXDIAG_OK;
    for (size_t done = 0; done < total && s == FLEXDIAG_OK; done += per) {
        size_t k = total - done < per ? total - done : per;
        s = read_span(st, t, buf, done * esz, k * esz);
        if (s == FLEXDIAG_OK) fn((char *)dst + done * dst_elem, buf, k);
    }
    free(buf);
    return s;
}

static flexdiag_status not_convertible(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                       const char *to) {
    return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                         "%s: tensor '%.*s': dtype %s cannot be read as %s (flexdiag converts "
                         "BF16, F16 and F32)",
                         st->files[t->file].path, FLEXDIAG_ST_NAME_MSG, t->name,
                         flexdiag__dtype_name(t->dtype), to);
}

static flexdiag_status check_read_args(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                       const void *dst) {
    FLEXDIAG_ASSERT(st && t && t->file >= 0 && t->file < st->n_files);
    if (!dst && t->numel > 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "tensor '%.*s': NULL destination",
                             FLEXDIAG_ST_NAME_MSG, t->name);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__st_read_bf16(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                       uint16_t *dst) {
    FLEXDIAG_TRY(check_read_args(st, t, dst));
    switch ((int)t->dtype) {
    case FLEXDIAG_DTYPE_BF16: return read_span(st, t, dst, 0, (size_t)t->nbytes);
    case FLEXDIAG_DTYPE_F16: return read_converted(st, t, dst, 2, f16_to_bf16);
    case FLEXDIAG_DTYPE_F32: {
        st_file *f = &st->files[t->file];
        if (!atomic_exchange(&f->rounding_logged, 1))
            FLEXDIAG_INFO("%s: F32 tensors are rounded to bf16 (nearest even), first '%.*s'",
                          f->path, FLEXDIAG_ST_NAME_MSG, t->name);
        return read_converted(st, t, dst, 2, f32_to_bf16);
    }
    default: return not_convertible(st, t, "bf16");
    }
}

flexdiag_status flexdiag__st_read_f32(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                      float *dst) {
    FLEXDIAG_TRY(check_read_args(st, t, dst));
    switch ((int)t->dtype) {
    case FLEXDIAG_DTYPE_BF16: return read_converted(st, t, dst, 4, bf16_to_f32);
    case FLEXDIAG_DTYPE_F16: return read_converted(st, t, dst, 4, f16_to_f32);
    case FLEXDIAG_DTYPE_F32: return read_span(st, t, dst, 0, (size_t)t->nbytes);
    default: return not_convertible(st, t, "fp32");
    }
}

flexdiag_status flexdiag__st_read_raw(const flexdiag_safetensors *st, const flexdiag_st_tensor *t,
                                      void *dst) {
    FLEXDIAG_TRY(check_read_args(st, t, dst));
    return read_span(st, t, dst, 0, (size_t)t->nbytes);
}
