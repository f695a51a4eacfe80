/*
 * bench_gen_out.c - what writing generate's outputs costs per image (run by hand, not a test):
 * <build>/tests/cli/bench_gen_out [images [threads [side]]] writes one block of images (default
 * 64 of 384 x 384 pixels, Janus-Pro's) into a temp folder through gen_out_emit_block (PNG
 * encode, temp file, fsync, rename; the block's tokens.json records and results.jsonl lines)
 * on 1 thread and on threads threads (default: the cores), for noise pixels (the random-weight
 * models' images, which compress worst) and for smooth ones, and prints ms per image.
 * Generation to compare with: Janus-Pro-7B shapes make an image in about 34 ms at the H200's
 * largest Diagonal batch (bench/RESULTS.md).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/gen_out.h"
#include "util.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n images of side x side RGB: noise (xorshift) or a smooth gradient per image. */
static uint8_t *pixels(int n, int side, int noise) {
    size_t px = (size_t)side * (size_t)side * 3;
    uint8_t *rgb = malloc((size_t)n * px);
    uint32_t x = 2463534242u;
    for (size_t i = 0; rgb && i < (size_t)n * px; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        size_t p = i % px / 3;
        rgb[i] = noise ? (uint8_t)x : (uint8_t)(p % (size_t)side / 2 + p / (size_t)side / 3 + i / px);
    }
    return rgb;
}

/* Seconds to write the block through a fresh gen_out in dir/<name>. */
static double write_block(const char *dir, const char *name, const gen_block *b, int side,
                          int threads) {
    static cli_prompt prompt = {"a red apple on a wooden table", NULL, NULL};
    cli_prompts ps = {.p = &prompt, .n = 1, .cap = 1};
    char out[4096];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    gen_out w = {.dir = out, .layout = CLI_LAYOUT_PLAIN, .per_prompt = b->n, .ps = &ps,
                 .per_image = 576, .grid_w = 24, .img_h = side, .img_w = side, .eos_id = -1};
    w.common = json_pack("{s:s}", "model", "bench");
    if (gen_out_open(&w) || gen_out_tokens_open(&w)) exit(1);
    double t0 = now();
    int rc = gen_out_emit_block(&w, b, threads);
    double s = now() - t0;
    if (rc || gen_out_tokens_close(&w)) exit(1);
    gen_out_free(&w);
    json_decref(w.common);
    return s;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int side = argc > 3 ? atoi(argv[3]) : 384;
    if (n < 1 || threads < 1 || side < 8) {
        fprintf(stderr, "usage: bench_gen_out [images [threads [side]]]\n");
        return 2;
    }
    char *dir = tu_tempdir("bench-gen-out");
    int32_t *tokens = calloc((size_t)n * 576, sizeof *tokens);
    printf("%d images of %dx%d in one block, folder %s\n", n, side, side, dir);
    printf("%-7s %8s %12s %12s\n", "pixels", "threads", "ms/image", "MB/image");
    for (int noise = 1; noise >= 0; noise--) {
        uint8_t *rgb = pixels(n, side, noise);
        if (!rgb || !tokens) return 1;
        gen_block b = {.first = 0, .n = n, .tokens = tokens, .rgb = rgb};
        int ts[2] = {1, threads};
        for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
            char name[64];
            snprintf(name, sizeof name, "%s-%d", noise ? "noise" : "smooth", ts[k]);
            double s = write_block(dir, name, &b, side, ts[k]);
            char png[4200];
            snprintf(png, sizeof png, "%s/%s/0/0.png", dir, name);
            size_t bytes = 0;
            free(tu_read_file(png, &bytes));
            printf("%-7s %8d %12.2f %12.3f\n", noise ? "noise" : "smooth", ts[k], 1e3 * s / n,
                   (double)bytes / 1e6);
        }
        free(rgb);
    }
    free(tokens);
    tu_rmtree(dir);
    free(dir);
    return 0;
}
