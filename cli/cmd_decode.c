/*
 * cmd_decode.c - `flexdiag decode`: image-token grids (.npy) -> PNG files through the VQ-16
 * decoder, optionally also the float pixels before quantisation to uint8 (--raw, .npy).
 *
 *   flexdiag decode --model DIR --tokens FILE.npy --out DIR [--raw FILE.npy] [--cpu]
 *
 * Tokens are int64 (or int32) [n, h·w] in raster order, as transformers' generate returns them
 * (a 1-D array is one image). Images are decoded --batch at a time on CUDA when the build has
 * it, a device answers and the backend has the image-decoder ops, else on the CPU (--cpu forces
 * it). PNGs go to DIR/<i>.png (i = row of the tokens file), each written atomically; --raw
 * holds float32 [n, H, W, 3] in the model's range (≈ [-1, 1]), as decode_image_tokens returns.
 * Timing goes to stderr; stdout stays empty.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "base/core.h"
#include "cli/image_out.h"
#include "kernels/kernels.h"
#include "cli/npy.h"
#include "runtime/image/vq.h"

#define CMD "decode"

typedef struct decode_opts {
    const char *model, *tokens, *out, *raw;
    int cpu;
    int64_t batch, threads;
} decode_opts;

/* The backend: CUDA when usable and complete, else the CPU; *s is its stream. */
static const flexdiag_kernels *pick_backend(const decode_opts *o, flexdiag_stream **s) {
    const flexdiag_kernels *cuda = o->cpu ? NULL : flexdiag__kernels_cuda();
    if (cuda && !(cuda->vq_lookup && cuda->conv2d && cuda->groupnorm && cuda->upsample2x &&
                  cuda->attn_spatial && cuda->to_nhwc)) {
        fprintf(stderr, "flexdiag %s: the CUDA backend has no image-decoder ops yet; decoding "
                        "on the CPU\n", CMD);
        cuda = NULL;
    }
    if (cuda && cuda->stream_create(0, (int)o->threads, s) == FLEXDIAG_OK) return cuda;
    if (cuda) {
        fprintf(stderr, "flexdiag %s: no usable CUDA device (%s); decoding on the CPU\n", CMD,
                flexdiag__err_msg());
        flexdiag__err_clear();
    }
    const flexdiag_kernels *cpu = flexdiag__kernels_cpu();
    return cpu->stream_create(-1, (int)o->threads, s) == FLEXDIAG_OK ? cpu : NULL;
}

/* Token ids of the npy as int32 [n, hw]; 2 after a message naming the file. */
static int read_tokens(const char *path, int64_t hw, int32_t vocab, int32_t **ids, int64_t *n) {
    flexdiag_npy a;
    flexdiag_status st = flexdiag__npy_read(path, &a);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    int rc = 0;
    int64_t per = a.ndim == 2 ? a.shape[1] : a.numel;
    if (a.dtype != FLEXDIAG_DTYPE_I64 && a.dtype != FLEXDIAG_DTYPE_I32) {
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
    if (!rc && !*ids) rc = cli_fail(CMD, flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "no memory"));
    for (int64_t i = 0; !rc && i < a.numel; i++) {
        int64_t v = a.dtype == FLEXDIAG_DTYPE_I64 ? ((const int64_t *)a.data)[i]
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
        flexdiag_status st = flexdiag__png_write_rgb(path, rgb, w, h);
        if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    }
    return 0;
}

/* Decode all n images batch by batch; pixels of all images are kept only for --raw. */
static int decode_all(const decode_opts *o, flexdiag_vq *vq, flexdiag_stream *s,
                      const int32_t *ids, int64_t n) {
    const flexdiag_vq_config *c = flexdiag__vq_get_config(vq);
    int32_t h, w;
    flexdiag__vq_image_size(c, &h, &w);
    int64_t hw = (int64_t)c->grid_h * c->grid_w, px = (int64_t)h * w * 3;
    int64_t keep = o->raw ? n : (n < o->batch ? n : o->batch);
    float *pix = malloc((size_t)(keep * px) * sizeof *pix);
    uint8_t *rgb = malloc((size_t)px);
    int rc = pix && rgb ? 0 : cli_fail(CMD, flexdiag__err(FLEXDIAG_ERR_OOM_HOST,
                                                          "no host memory for %lld images of "
                                                          "%dx%d pixels: lower --batch",
                                                          (long long)keep, w, h));
    for (int64_t i0 = 0; !rc && i0 < n; i0 += o->batch) {
        int64_t m = n - i0 < o->batch ? n - i0 : o->batch;
        float *dst = o->raw ? pix + i0 * px : pix;
        flexdiag_status st = flexdiag__vq_decode(vq, s, ids + i0 * hw, m, dst);
        if (st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
        else if (o->out) rc = write_pngs(o->out, dst, i0, m, h, w, rgb);
    }
    if (!rc && o->raw) {
        int64_t shape[4] = {n, h, w, 3};
        flexdiag_status st = flexdiag__npy_write(o->raw, FLEXDIAG_DTYPE_F32, 4, shape, pix);
        if (st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
    }
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
    if (o->batch < 1 || o->batch > 4096) {
        fprintf(stderr, "flexdiag %s: --batch %lld: give 1..4096\n", CMD, (long long)o->batch);
        return 2;
    }
    if (o->threads < 0 || o->threads > 1024) {
        fprintf(stderr, "flexdiag %s: --threads %lld: give 0 (all cores) .. 1024\n", CMD,
                (long long)o->threads);
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
        {"--model", CLI_STR, &o.model, "model folder (config.json + safetensors)"},
        {"--tokens", CLI_STR, &o.tokens, "image token ids, int64 .npy [n, h*w]"},
        {"--out", CLI_STR, &o.out, "folder for <i>.png (created if missing)"},
        {"--raw", CLI_STR, &o.raw, "also write float32 pixels [n, H, W, 3] to this .npy"},
        {"--cpu", CLI_FLAG, &o.cpu, "decode on the CPU even if a GPU is present"},
        {"--batch", CLI_INT, &o.batch, "images decoded together (default 4)"},
        {"--threads", CLI_INT, &o.threads, "CPU threads (default: all cores)"},
    };
    int rc = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_flags(&o))) return rc;

    flexdiag__err_clear();
    flexdiag_stream *s = NULL;
    const flexdiag_kernels *k = pick_backend(&o, &s);
    if (!k) return cli_fail(CMD, FLEXDIAG_ERR_INTERNAL);
    double t0 = flexdiag__now();
    flexdiag_vq *vq = NULL;
    flexdiag_status st = flexdiag__vq_load(k, s, o.model, o.batch, &vq);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (st != FLEXDIAG_OK) rc = cli_fail(CMD, st);
    else {
        const flexdiag_vq_config *c = flexdiag__vq_get_config(vq);
        rc = read_tokens(o.tokens, (int64_t)c->grid_h * c->grid_w, c->codebook_size, &ids, &n);
    }
    double t1 = flexdiag__now();
    if (!rc) rc = decode_all(&o, vq, s, ids, n);
    if (!rc)
        fprintf(stderr, "flexdiag %s: %lld image(s) on %s: load %.2f s, decode %.2f s (%.3f "
                        "s/image)\n",
                CMD, (long long)n, k->name, t1 - t0, flexdiag__now() - t1,
                (flexdiag__now() - t1) / (double)n);
    free(ids);
    flexdiag__vq_destroy(vq);
    k->stream_destroy(s);
    return rc;
}
