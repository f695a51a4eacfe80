/*
 * cmd_decode.c - `flexdiag decode`: image-token grids (.npy) -> PNG files through the VQ-16
 * decoder, optionally also the float pixels before quantisation to uint8 (--raw, .npy).
 *
 *   flexdiag decode --model DIR --tokens FILE.npy --out DIR [--raw FILE.npy] [--cpu]
 *
 * Tokens are int64 (or int32) [n, h·w] in raster order, as transformers' generate returns them
 * (a 1-D array is one image). Only the model's image decoder is loaded (flexdiag_decoder_load);
 * images are decoded --batch at a time on CUDA when the build has it, a device answers and the
 * backend has the image-decoder ops, else on the CPU (--cpu forces it). PNGs go to DIR/<i>.png
 * (i = row of the tokens file), each written atomically; --raw holds float32 [n, H, W, 3] in the
 * model's range (≈ [-1, 1]), as decode_image_tokens returns. Timing goes to stderr; stdout stays
 * empty.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/image_out.h"
#include "cli/npy.h"

#define CMD "decode"

typedef struct decode_opts {
    const char *model, *tokens, *out, *raw;
    int cpu;
    int64_t batch, threads;
} decode_opts;

/* Token ids of the npy as int32 [n, hw]; after a message naming the file, 2 for bad contents
 * and 1 when it cannot be read. */
static int read_tokens(const char *path, int64_t hw, int32_t vocab, int32_t **ids, int64_t *n) {
    flexdiag_npy a;
    if (flexdiag__npy_read(path, &a) != FLEXDIAG_OK) return cli_fail_io(CMD);
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
    *n = rc ? 0 : a.numel / hw;
    *ids = rc ? NULL : malloc((size_t)a.numel * sizeof **ids);
    if (!rc && !*ids) {
        fprintf(stderr, "flexdiag %s: no host memory for %lld token ids\n", CMD,
                (long long)a.numel);
        rc = 1;
    }
    for (int64_t i = 0; !rc && i < a.numel; i++) {
        int64_t v = a.dtype == FLEXDIAG_NPY_I64 ? ((const int64_t *)a.data)[i]
                                                : ((const int32_t *)a.data)[i];
        if (v < 0 || v >= vocab) {
            fprintf(stderr, "flexdiag %s: --tokens %s: id %lld at image %lld, position %lld is "
                            "outside the codebook [0, %d)\n",
                    CMD, path, (long long)v, (long long)(i / hw), (long long)(i % hw), vocab);
            rc = 2;
        }
        if (!rc) (*ids)[i] = (int32_t)v;
    }
    flexdiag__npy_free(&a);
    if (rc) {
        free(*ids);
        *ids = NULL;
    }
    return rc;
}

/* PNGs of images [first, first + m) from their float pixels. */
static int write_pngs(const char *dir, const float *pix, int64_t first, int64_t m, int32_t h,
                      int32_t w, uint8_t *rgb) {
    int64_t px = (int64_t)h * w * 3;
    for (int64_t i = 0; i < m; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%lld.png", dir, (long long)(first + i));
        flexdiag__pixels_to_u8(pix + i * px, px, rgb);
        if (flexdiag__png_write_rgb(path, rgb, w, h) != FLEXDIAG_OK) return cli_fail_io(CMD);
    }
    return 0;
}

/* Decode all n images batch by batch; pixels of all images are kept only for --raw. */
static int decode_all(const decode_opts *o, flexdiag_decoder *d, const flexdiag_decoder_info *di,
                      const int32_t *ids, int64_t n) {
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
        else if (o->out) rc = write_pngs(o->out, dst, i0, m, h, w, rgb);
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
        fprintf(stderr, "flexdiag %s: --model DIR and --tokens FILE.npy are required\n", CMD);
        return 2;
    }
    if (!o->out && !o->raw) {
        fprintf(stderr, "flexdiag %s: give --out DIR (PNGs) and/or --raw FILE.npy\n", CMD);
        return 2;
    }
    if (o->out && cli_mkdirs(o->out) != 0) {
        fprintf(stderr, "flexdiag %s: --out %s: cannot create the folder\n", CMD, o->out);
        return 1;
    }
    return 0;
}

int flexdiag_cmd_decode(int argc, char **argv) {
    decode_opts o = {.batch = 4};
    const cli_opt opts[] = {
        {.name = "--model", CLI_STR, &o.model, "model folder (config.json + safetensors)"},
        {.name = "--tokens", CLI_STR, &o.tokens, "image token ids, int64 .npy [n, h*w]"},
        {.name = "--out", CLI_STR, &o.out, "folder for <i>.png (created if missing)"},
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
    int32_t *ids = NULL;
    int64_t n = 0;
    if (st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
    else rc = read_tokens(o.tokens, (int64_t)di.grid_h * di.grid_w, di.codebook_size, &ids, &n);
    double t1 = cli_now();
    if (!rc) rc = decode_all(&o, d, &di, ids, n);
    if (!rc)
        fprintf(stderr, "flexdiag %s: %lld image(s) on %s: load %.2f s, decode %.2f s (%.3f "
                        "s/image)\n",
                CMD, (long long)n, di.backend, t1 - t0, cli_now() - t1,
                (cli_now() - t1) / (double)n);
    free(ids);
    flexdiag_decoder_destroy(d);
    flexdiag_runtime_destroy(rt);
    return rc;
}
