/*
 * token_grids.c - the image-token grids `flexdiag decode` reads (token_grids.h): a .npy of ids
 * (int64 or int32, [n, h·w] in raster order, as transformers' generate returns them; 1-D is one
 * image) or the tokens.json `flexdiag generate` writes (its records' grids, each named by its
 * image_index), told apart by the first non-blank byte ('{'). Every id is checked against the
 * codebook; a bad file gets one line naming it, the record and what was expected.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/fileio.h"
#include "cli/npy.h"
#include "cli/token_grids.h"

void cli_token_grids_free(cli_token_grids *t) {
    free(t->ids);
    free(t->name);
    *t = (cli_token_grids){0};
}

/* Room for n grids of hw ids; 0, or 1 after a message. */
static int cli_token_grids_alloc(cli_token_grids *t, int64_t n, int64_t hw) {
    t->n = n;
    t->ids = malloc((size_t)(n * hw) * sizeof *t->ids + 1);
    t->name = malloc((size_t)n * sizeof *t->name + 1);
    if (t->ids && t->name) return 0;
    fprintf(stderr, "flexdiag %s: no host memory for %lld token ids\n", t->cmd, (long long)(n * hw));
    return 1;
}

/* Id v at (image i, position k) of path into t: 0, or 2 after a message when it is outside the
 * codebook. */
static int put_id(cli_token_grids *t, const char *path, int64_t i, int64_t k, int64_t hw, int64_t v,
                  int32_t vocab) {
    if (v >= 0 && v < vocab) {
        t->ids[i * hw + k] = (int32_t)v;
        return 0;
    }
    fprintf(stderr, "flexdiag %s: --tokens %s: id %lld at image %lld, position %lld is outside "
                    "the codebook [0, %d)\n",
            t->cmd, path, (long long)v, (long long)t->name[i], (long long)k, vocab);
    return 2;
}

/* Token ids of the npy as int32 [n, hw]; after a message naming the file, 2 for bad contents
 * and 1 when it cannot be read. */
static int read_npy(const char *path, int64_t hw, int32_t vocab, cli_token_grids *t) {
    flexdiag_npy a;
    if (flexdiag__npy_read(path, &a) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag %s: --tokens %s (a .npy of ids, or generate's tokens.json)\n",
                t->cmd, cli_io_error());
        return 1;
    }
    int rc = 0;
    int64_t per = a.ndim == 2 ? a.shape[1] : a.numel;
    if (a.dtype != FLEXDIAG_NPY_I64 && a.dtype != FLEXDIAG_NPY_I32) {
        fprintf(stderr, "flexdiag %s: --tokens %s: expected int64 or int32 ids\n", t->cmd, path);
        rc = 2;
    } else if ((a.ndim != 1 && a.ndim != 2) || per != hw || a.numel == 0) {
        fprintf(stderr, "flexdiag %s: --tokens %s: expected shape [n, %lld] (the model's token "
                        "grid), got %d-D with %lld ids per image\n",
                t->cmd, path, (long long)hw, a.ndim, (long long)per);
        rc = 2;
    }
    if (!rc) rc = cli_token_grids_alloc(t, a.numel / hw, hw);
    for (int64_t i = 0; !rc && i < t->n; i++) t->name[i] = i;
    for (int64_t i = 0; !rc && i < a.numel; i++)
        rc = put_id(t, path, i / hw, i % hw, hw,
                    a.dtype == FLEXDIAG_NPY_I64 ? ((const int64_t *)a.data)[i]
                                                : ((const int32_t *)a.data)[i],
                    vocab);
    flexdiag__npy_free(&a);
    return rc;
}

/* Ids in a grid of rows of integers; -1 when it is not one. */
static int64_t grid_ids(const json_t *grid) {
    int64_t k = 0;
    for (size_t row = 0; row < json_array_size(grid); row++) {
        const json_t *ids = json_array_get(grid, row);
        if (!json_is_array(ids)) return -1;
        for (size_t c = 0; c < json_array_size(ids); c++, k++)
            if (!json_is_integer(json_array_get(ids, c))) return -1;
    }
    return json_is_array(grid) ? k : -1;
}

/* Record rec of a tokens.json as grid i of t: its image_index and its rows of ids, hw in all;
 * 0, or 2 after a message naming the file and record. */
static int json_grid(const char *path, const json_t *rec, size_t r, int64_t i, int64_t hw,
                     int32_t vocab, cli_token_grids *t) {
    const json_t *idx = json_object_get(rec, "image_index"), *grid = json_object_get(rec, "grid");
    if (!json_is_integer(idx) || json_integer_value(idx) < 0 || grid_ids(grid) != hw) {
        fprintf(stderr, "flexdiag %s: --tokens %s: record %zu: expected an image_index >= 0 and "
                        "a grid of %lld ids in rows (the model's token grid), as generate "
                        "writes it\n", t->cmd, path, r, (long long)hw);
        return 2;
    }
    t->name[i] = json_integer_value(idx);
    int64_t k = 0;
    int rc = 0;
    for (size_t row = 0; !rc && row < json_array_size(grid); row++) {
        const json_t *ids = json_array_get(grid, row);
        for (size_t c = 0; !rc && c < json_array_size(ids); c++, k++)
            rc = put_id(t, path, i, k, hw, json_integer_value(json_array_get(ids, c)), vocab);
    }
    return rc;
}

/* The grids of generate's tokens.json (every record, or the one whose image_index is index);
 * 0, or 2 after a message naming the file. */
static int read_json(const char *path, int64_t hw, int32_t vocab, int64_t index, cli_token_grids *t) {
    json_error_t e;
    json_t *doc = json_load_file(path, 0, &e);
    const json_t *images = json_object_get(doc, "images");
    if (!json_is_array(images)) {
        fprintf(stderr, "flexdiag %s: --tokens %s: %s (expected generate's tokens.json: "
                        "{\"images\": [{\"image_index\": i, \"grid\": [[...], ...]}, ...]})\n",
                t->cmd, path, doc ? "no \"images\" list" : e.text);
        json_decref(doc);
        return 2;
    }
    size_t n = 0;
    for (size_t r = 0; r < json_array_size(images); r++) {
        const json_t *idx = json_object_get(json_array_get(images, r), "image_index");
        n += index < 0 || (json_is_integer(idx) && json_integer_value(idx) == index);
    }
    int rc = n ? cli_token_grids_alloc(t, (int64_t)n, hw) : 2;
    if (!n)
        fprintf(stderr, "flexdiag %s: --tokens %s: %s\n", t->cmd, path,
                index < 0 ? "no image records" : "no record has that --index");
    for (size_t r = 0, i = 0; !rc && r < json_array_size(images); r++) {
        const json_t *rec = json_array_get(images, r), *idx = json_object_get(rec, "image_index");
        if (index >= 0 && !(json_is_integer(idx) && json_integer_value(idx) == index)) continue;
        rc = json_grid(path, rec, r, (int64_t)i++, hw, vocab, t);
    }
    json_decref(doc);
    return rc;
}

int cli_token_grids_read(const char *cmd, const char *path, int64_t hw, int32_t vocab,
                         int64_t index, cli_token_grids *t) {
    *t = (cli_token_grids){.cmd = cmd};
    FILE *f = fopen(path, "rb");
    int ch = ' ';
    while (f && (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r')) ch = getc(f);
    if (f) fclose(f);
    if (ch == '{') return read_json(path, hw, vocab, index, t);
    if (index >= 0) {
        fprintf(stderr, "flexdiag %s: --index picks a record of a tokens.json; %s is a .npy (give "
                        "its rows you want)\n", cmd, path);
        return 2;
    }
    return read_npy(path, hw, vocab, t);
}
