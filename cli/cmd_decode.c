/*
 * cmd_decode.c - `flexdiag decode`: image-token grids (.npy, or the tokens.json of `flexdiag
 * generate`) -> PNG files through the VQ-16 decoder, optionally also the float pixels before
 * quantisation to uint8 (--raw, .npy).
 *
 *   flexdiag decode --model DIR --tokens FILE.npy|tokens.json --out DIR [--index I] [--raw F]
 *
 * A .npy holds int64 (or int32) [n, h·w] in raster order, as transformers' generate returns them
 * (a 1-D array is one image); a tokens.json (told apart by its first byte, '{') holds generate's
 * records, each grid with its image_index (--index picks one): token_grids.c reads both. Only
 * the model's image decoder is loaded (flexdiag_decoder_load); images are decoded --batch at a time on CUDA when the build has
 * it, a device answers and the backend has the image-decoder ops, else on the CPU (--cpu forces
 * it). PNGs go to DIR/<i>.png (i = row of the .npy, or the record's image_index), each written
 * atomically; --raw holds float32 [n, H, W, 3] in the model's range (≈ [-1, 1]), as
 * decode_image_tokens returns. Timing goes to stderr; stdout stays empty.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/fileio.h"
#include "cli/image_out.h"
#include "cli/npy.h"
#include "cli/token_grids.h"

#define CMD "decode"

typedef struct decode_opts {
    const char *model, *tokens, *out, *raw;
    int cpu;
    int64_t batch, threads, index;
} decode_opts;

/* PNGs of images [first, first + m) from their float pixels, named by t. */
static int write_pngs(const char *dir, const float *pix, const cli_token_grids *t, int64_t first,
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
                      const cli_token_grids *t) {
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
    cli_token_grids t = {0};
    if (st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
    else
        rc = cli_token_grids_read(CMD, o.tokens, (int64_t)di.grid_h * di.grid_w,
                                  di.codebook_size, o.index, &t);
    double t1 = cli_now();
    if (!rc) rc = decode_all(&o, d, &di, &t);
    if (!rc)
        fprintf(stderr, "flexdiag %s: %lld image(s) on %s: load %.2f s, decode %.2f s (%.3f "
                        "s/image)\n",
                CMD, (long long)t.n, di.backend, t1 - t0, cli_now() - t1,
                (cli_now() - t1) / (double)t.n);
    cli_token_grids_free(&t);
    flexdiag_decoder_destroy(d);
    flexdiag_runtime_destroy(rt);
    return rc;
}
