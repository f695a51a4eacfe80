/*
 * st_write.c - writing safetensors files for the tests (st_write.h).
 *
 * The file is written by the CLI's atomic writer (cli/fileio.h: temp file, fsync, rename), so
 * an interrupted write never leaves a partial file at the target name. The header is built with jansson from checked entries (known dtype, rank <= 8, byte size by
 * checked multiplication, unique names), entries laid out in order, padded with spaces to a
 * multiple of 8 as the format recommends; the reader (safetensors.c) validates what this writes.
 */
#include "st_write.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "cli/fileio.h"

/* Validate entry e and return its byte size. */
static flexdiag_status check_entry(const char *path, const flexdiag_st_entry *e, uint64_t *nbytes) {
    const char *name = e->name ? e->name : "(null)";
    if (!e->name || !*e->name || strcmp(e->name, "__metadata__") == 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: tensor name '%s' is not allowed", path,
                             name);
    int size = flexdiag__dtype_size(e->dtype);
    if (size == 0 || e->ndim < 0 || e->ndim > FLEXDIAG_ST_MAX_DIMS)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "%s: tensor '%.*s': bad dtype %d or rank %d", path, FLEXDIAG_ST_NAME_MSG,
                             name, (int)e->dtype, (int)e->ndim);
    uint64_t numel = 1;
    for (int32_t i = 0; i < e->ndim; i++)
        if (e->shape[i] < 0 || !flexdiag__mul_ok(numel, (uint64_t)e->shape[i], &numel))
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "%s: tensor '%.*s': dim %d is negative "
                                 "or the shape overflows",
                                 path, FLEXDIAG_ST_NAME_MSG, name, (int)i);
    if (!flexdiag__mul_ok(numel, (uint64_t)size, nbytes) || *nbytes > INT64_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: tensor '%.*s': size overflows", path,
                             FLEXDIAG_ST_NAME_MSG, name);
    if (*nbytes > 0 && !e->data)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: tensor '%.*s': NULL data", path,
                             FLEXDIAG_ST_NAME_MSG, name);
    return FLEXDIAG_OK;
}

/* JSON entry {dtype, shape, data_offsets}; NULL when out of memory. */
static json_t *entry_json(const flexdiag_st_entry *e, uint64_t begin, uint64_t end) {
    json_t *shape = json_array();
    for (int32_t i = 0; shape && i < e->ndim; i++)
        json_array_append_new(shape, json_integer((json_int_t)e->shape[i]));
    return json_pack("{s:s, s:o, s:[I, I]}", "dtype", flexdiag__dtype_name(e->dtype), "shape",
                     shape, "data_offsets", (json_int_t)begin, (json_int_t)end);
}

/* Header JSON (entries in data order), space-padded so the data starts 8-byte aligned. */
static flexdiag_status build_header(const char *path, const flexdiag_st_entry *entries, int64_t n,
                                    const uint64_t *sizes, char **out, size_t *len) {
    json_t *root = json_object();
    uint64_t pos = 0;
    flexdiag_status s = root ? FLEXDIAG_OK : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "out of memory");
    for (int64_t i = 0; i < n && s == FLEXDIAG_OK; i++) {
        const char *name = entries[i].name;
        json_t *ej =
            json_object_get(root, name) ? NULL : entry_json(&entries[i], pos, pos + sizes[i]);
        if (!ej || json_object_set_new(root, name, ej) != 0) /* set_new frees ej on failure */
            s = flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                              "%s: tensor '%.*s': duplicate or non-UTF-8 name", path,
                              FLEXDIAG_ST_NAME_MSG, name);
        pos += sizes[i];
    }
    char *js = s == FLEXDIAG_OK ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (s != FLEXDIAG_OK) return s;
    size_t jl = js ? strlen(js) : 0, padded = (jl + 7) & ~(size_t)7;
    char *hdr = js ? malloc(padded) : NULL;
    if (!hdr) {
        free(js);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: out of memory for the header", path);
    }
    memcpy(hdr, js, jl);
    memset(hdr + jl, ' ', padded - jl);
    free(js);
    *out = hdr;
    *len = padded;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__st_write(const char *path, const flexdiag_st_entry *entries, int64_t n) {
    if (!path || n < 0 || n > FLEXDIAG_ST_MAX_ENTRIES || (n > 0 && !entries))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "safetensors writer: bad path or %" PRId64 " entries", n);
    uint64_t *sizes = malloc(sizeof *sizes * (size_t)(n + 1));
    cli_part *parts = malloc(sizeof *parts * (size_t)(n + 2));
    flexdiag_status s =
        sizes && parts ? FLEXDIAG_OK : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "out of memory");
    for (int64_t i = 0; i < n && s == FLEXDIAG_OK; i++)
        s = check_entry(path, &entries[i], &sizes[i]);
    char *hdr = NULL;
    size_t hlen = 0;
    if (s == FLEXDIAG_OK) s = build_header(path, entries, n, sizes, &hdr, &hlen);
    if (s == FLEXDIAG_OK) {
        unsigned char pre[8];
        for (int i = 0; i < 8; i++) pre[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
        parts[0] = (cli_part){pre, 8};
        parts[1] = (cli_part){hdr, hlen};
        for (int64_t i = 0; i < n; i++) parts[i + 2] = (cli_part){entries[i].data, sizes[i]};
        s = cli_write_atomic(path, parts, (int)(n + 2));
        if (s != FLEXDIAG_OK) flexdiag__err(s, "%s", cli_io_error());
    }
    free(hdr);
    free(parts);
    free(sizes);
    return s;
}
