/*
 * cmd_decode.c - `flexdiag decode`: image-token grids (.npy, or the tokens.json of `flexdiag
 * generate`) -> PNG files through the VQ-16 decoder, optionally also the float pixels before
 * quantisation to uint8 (--raw, .npy).
 *
 *   flexdiag decode --model DIR --tokens FILE.npy|tokens.json --out DIR [--index I] [--raw F]
 *
 * A .npy holds int64 (or int32) [n, h·w] in raster order, as transformers' generate returns them
 * (a 1-D array is one image); a tokens.json (told apart by its first byte, '{') holds generate's
 * records, each grid with its image_index (--index picks one). Only the model's image decoder is
 * loaded (flexdiag_decoder_load); images are decoded --batch at a time on CUDA when the build has
 * it, a device answers and the backend has the image-decoder ops, else on the CPU (--cpu forces
 * it). PNGs go to DIR/<i>.png (i = row of the .npy, or the record's image_index), each written
 * atomically; --raw holds float32 [n, H, W, 3] in the model's range (≈ [-1, 1]), as
 * decode_image_tokens returns. Timing goes to stderr; stdout stays empty.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/fileio.h"
#include "cli/image_out.h"
#include "cli/npy.h"

#define CMD "decode"

typedef struct decode_opts {
    const char *model, *tokens, *out, *raw;
    int cpu;
    int64_t batch, threads, index;
} decode_opts;

/* The grids to decode. */
typedef struct token_set {
    int32_t *ids;   /* (n, hw) codebook ids */
    int64_t *name;  /* (n) each grid's PNG name: its .npy row or its record's image_index */
    int64_t n;
} token_set;

static void token_set_free(token_set *t) {
    free(t->ids);
    free(t->name);
    *t = (token_set){0};
}

/* Room for n grids of hw ids; 0, or 1 after a message. */
static int token_set_alloc(token_set *t, int64_t n, int64_t hw) {
    t->n = n;
    t->ids = malloc((size_t)(n * hw) * sizeof *t->ids + 1);
    t->name = malloc((size_t)n * sizeof *t->name + 1);
    if (t->ids && t->name) return 0;
    fprintf(stderr, "flexdiag %s: no host memory for %lld token ids\n", CMD, (long long)(n * hw));
    return 1;
}

/* Id v at (image i, position k) of path into t: 0, or 2 after a message when it is outside the
 * codebook. */
static int put_id(token_set *t, const char *path, int64_t i, int64_t k, int64_t hw, int64_t v,
                  int32_t vocab) {
    if (v >= 0 && v < vocab) {
        t->ids[i * hw + k] = (int32_t)v;
        return 0;
    }
    fprintf(stderr, "flexdiag %s: --tokens %s: id %lld at image %lld, position %lld is outside "
                    "the codebook [0, %d)\n",
            CMD, path, (long long)v, (long long)t->name[i], (long long)k, vocab);
    return 2;
}

/* Token ids of the npy as int32 [n, hw]; after a message naming the file, 2 for bad contents
 * and 1 when it cannot be read. */
static int read_npy(const char *path, int64_t hw, int32_t vocab, token_set *t) {
    flexdiag_npy a;
    if (flexdiag__npy_read(path, &a) != FLEXDIAG_OK)
        return cli_errorf(CMD, 1, "--tokens %s (a .npy of ids, or generate's tokens.json)",
                          cli_io_error());
    int rc = 0;
    int64_t per = a.ndim == 2 ? a.shape[1] : a.numel;
    if (a.dtype != FLEXDIAG_NPY_I64 && a.dtype != FLEXDIAG_NPY_I32) {
        fprintf(stderr, "flexdiag %s: --tokens %s: expected int64 or int32 ids\n", CMD, path);
        rc = 2;
    } else if ((a.ndim != 1 && a.ndim != 2) || per != hw || a.numel == 0) {
        fprintf(stderr, "flexdiag %s: --tokens %s: expected shape [n, %lld] (the model's token "
                        "grid), got %d-D with %lld ids per image\n",
                CMD, path, (long long)hw, a.ndim, (long long)per);
        rc = 2;
    }
    if (!rc) rc = token_set_alloc(t, a.numel / hw, hw);
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
                     int32_t vocab, token_set *t) {
    const json_t *idx = json_object_get(rec, "image_index"), *grid = json_object_get(rec, "grid");
    if (!json_is_integer(idx) || json_integer_value(idx) < 0 || grid_ids(grid) != hw) {
        fprintf(stderr, "flexdiag %s: --tokens %s: record %zu: expected an image_index >= 0 and "
                        "a grid of %lld ids in rows (the model's token grid), as generate "
                        "writes it\n", CMD, path, r, (long long)hw);
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
static int read_json(const char *path, int64_t hw, int32_t vocab, int64_t index, token_set *t) {
    json_error_t e;
    json_t *doc = json_load_file(path, 0, &e);
    const json_t *images = json_object_get(doc, "images");
    if (!json_is_array(images)) {
        fprintf(stderr, "flexdiag %s: --tokens %s: %s (expected generate's tokens.json: "
                        "{\"images\": [{\"image_index\": i, \"grid\": [[...], ...]}, ...]})\n",
                CMD, path, doc ? "no \"images\" list" : e.text);
        json_decref(doc);
        return 2;
    }
    size_t n = 0;
    for (size_t r = 0; r < json_array_size(images); r++) {
        const json_t *idx = json_object_get(json_array_get(images, r), "image_index");
        n += index < 0 || (json_is_integer(idx) && json_integer_value(idx) == index);
    }
    int rc = n ? token_set_alloc(t, (int64_t)n, hw) : 2;
    if (!n)
        fprintf(stderr, "flexdiag %s: --tokens %s: %s\n", CMD, path,
                index < 0 ? "no image records" : "no record has that --index");
    for (size_t r = 0, i = 0; !rc && r < json_array_size(images); r++) {
        const json_t *rec = json_array_get(images, r), *idx = json_object_get(rec, "image_index");
        if (index >= 0 && !(json_is_integer(idx) && json_integer_value(idx) == index)) continue;
        rc = json_grid(path, rec, r, (int64_t)i++, hw, vocab, t);
    }
    json_decref(doc);
    return rc;
}

/* The grids of --tokens: a tokens.json when its first non-blank byte is '{', else a .npy. */
static int read_tokens(const decode_opts *o, int64_t hw, int32_t vocab, token_set *t) {
    FILE *f = fopen(o->tokens, "rb");
    int ch = ' ';
    while (f && (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r')) ch = getc(f);
    if (f) fclose(f);
    if (ch == '{') return read_json(o->tokens, hw, vocab, o->index, t);
    if (o->index >= 0) {
        fprintf(stderr, "flexdiag %s: --index picks a record of a tokens.json; %s is a .npy (give "
                        "its rows you want)\n", CMD, o->tokens);
        return 2;
    }
    return read_npy(o->tokens, hw, vocab, t);
}

/* PNGs of images [first, first + m) from their float pixels, named by t. */
static int write_pngs(const char *dir, const float *pix, const token_set *t, int64_t first,
                      int64_t m, int32_t h, int32_t w, uint8_t *rgb) {
    int64_t px = (int64_t)h * w * 3;
    for (int64_t i = 0; i < m; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%lld.png", dir, (long long)t->name[first + i]);
        flexdiag__pixels_to_u8(pix + i * px, px, rgb);
        if (flexdiag__png_write_rgb(path, rgb, w, h) != FLEXDIAG_OK) return cli_fail_io(CMD);
    }
    return 0;
}

/* Decode all n images batch by batch; pixels of all images are kept only for --raw. */
static int decode_all(const decode_opts *o, flexdiag_decoder *d, const flexdiag_decoder_info *di,
                      const token_set *t) {
    const int32_t *ids = t->ids;
    int64_t n = t->n;
    int32_t h = di->image_h, w = di->image_w;
    int64_t hw = (int64_t)di->grid_h * di->grid_w, px = (int64_t)h * w * 3;
    int64_t keep = o->raw ? n : (n < o->batch ? n : o->batch);
    float *pix = malloc((size_t)(keep * px) * sizeof *pix);
    uint8_t *rgb = malloc((size_t)px);
    int rc = 0;
    if (!pix || !rgb) {
        fprintf(stderr, "flexdiag %s: no host memory for %lld images of %dx%d pixels: lower "
                "--batch\n", CMD, (long long)keep, w, h);
        rc = 1;
    }
    for (int64_t i0 = 0; !rc && i0 < n; i0 += o->batch) {
        int64_t m = n - i0 < o->batch ? n - i0 : o->batch;
        float *dst = o->raw ? pix + i0 * px : pix;
        flexdiag_status st = flexdiag_decoder_decode(d, ids + i0 * hw, (int32_t)m, dst);
        if (st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
        else if (o->out) rc = write_pngs(o->out, dst, t, i0, m, h, w, rgb);
    }
    int64_t shape[4] = {n, h, w, 3};
    if (!rc && o->raw && flexdiag__npy_write(o->raw, FLEXDIAG_NPY_F32, 4, shape, pix))
        rc = cli_fail_io(CMD);
    free(rgb);
    free(pix);
    return rc;
}

static int check_flags(const decode_opts *o) {
    if (!o->model || !o->tokens) {
        fprintf(stderr, "flexdiag %s: --model DIR and --tokens FILE (.npy or generate's "
                        "tokens.json) are required\n", CMD);
        return 2;
    }
    if (!o->out && !o->raw) {
        fprintf(stderr, "flexdiag %s: give --out DIR (PNGs) and/or --raw FILE.npy\n", CMD);
        return 2;
    }
    if (o->raw && cli_check_writable(CMD, "--raw", o->raw)) return 1;
    if (o->out && cli_mkdirs(o->out) != 0) {
        fprintf(stderr, "flexdiag %s: --out %s: cannot create the folder\n", CMD, o->out);
        return 1;
    }
    return 0;
}

int flexdiag_cmd_decode(int argc, char **argv) {
    decode_opts o = {.batch = 4, .index = -1};
    const cli_opt opts[] = {
        {.name = "--model", CLI_STR, &o.model, "model folder (config.json + safetensors)"},
        {.name = "--tokens", CLI_STR, &o.tokens,
         "image token ids: int64 .npy [n, h*w], or the tokens.json of flexdiag generate"},
        {.name = "--index", CLI_INT, &o.index,
         "with a tokens.json: decode only the image of this image_index (default: all)",
         CLI_INTS(-1, INT32_MAX, "-1 = every image")},
        {.name = "--out", CLI_STR, &o.out,
         "folder for <i>.png, i the .npy row or the image_index (created if missing)"},
        {.name = "--raw", CLI_STR, &o.raw, "also write float32 pixels [n, H, W, 3] to this .npy"},
        {.name = "--cpu", CLI_FLAG, &o.cpu, "decode on the CPU even if a GPU is present"},
        {.name = "--batch", CLI_INT, &o.batch, "images decoded together (default 4)",
         CLI_INTS(1, 4096, NULL)},
        {.name = "--threads", CLI_INT, &o.threads, "CPU threads (default 0: all cores)",
         CLI_INTS(0, CLI_MAX_THREADS, "0 = all cores")},
    };
    int rc = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_flags(&o))) return rc;

    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    if (o.cpu) rp.device = -1;
    rp.threads = (int)o.threads;
    flexdiag_runtime *rt = NULL;
    flexdiag_status st = flexdiag_runtime_create(&rp, &rt);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    double t0 = cli_now();
    flexdiag_decoder *d = NULL;
    flexdiag_decoder_info di = {.struct_size = sizeof di};
    st = flexdiag_decoder_load(rt, o.model, (int32_t)o.batch, &d);
    if (st == FLEXDIAG_OK) st = flexdiag_decoder_get_info(d, &di);
    token_set t = {0};
    if (st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
    else rc = read_tokens(&o, (int64_t)di.grid_h * di.grid_w, di.codebook_size, &t);
    double t1 = cli_now();
    if (!rc) rc = decode_all(&o, d, &di, &t);
    if (!rc)
        fprintf(stderr, "flexdiag %s: %lld image(s) on %s: load %.2f s, decode %.2f s (%.3f "
                        "s/image)\n",
                CMD, (long long)t.n, di.backend, t1 - t0, cli_now() - t1,
                (cli_now() - t1) / (double)t.n);
    token_set_free(&t);
    flexdiag_decoder_destroy(d);
    flexdiag_runtime_destroy(rt);
    return rc;
}
