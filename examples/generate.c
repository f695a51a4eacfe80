/*
 * generate.c - the smallest complete program on libflexdiag: images of a prompt, written as
 * PPM files into a folder.
 *
 *   cc examples/generate.c $(pkg-config --cflags --libs flexdiag) -o generate
 *   ./generate out ["a red apple" [ARCH]]      # writes out/0.ppm .. out/3.ppm
 *
 * The order every embedding program follows: a runtime (devices, memory budget), a model
 * loaded once (here a built-in shape, tiny-janus unless ARCH names another: seeded random
 * weights, so the images are noise, but it needs no download), a context (the batch and its
 * KV cache), then requests. The library hands back image tokens; flexdiag_decode_images turns
 * them into float pixels, and this file writes those as binary PPM (P6), which needs no image
 * library. Every call returns a flexdiag_status; flexdiag_last_error() says what went wrong
 * in words.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <flexdiag.h>

#define N_IMAGES 4

/* Stop with the library's message when a call failed. */
static void check(flexdiag_status st, const char *what) {
    if (st == FLEXDIAG_OK) return;
    fprintf(stderr, "%s: %s: %s\n", what, flexdiag_status_str(st), flexdiag_last_error(NULL));
    exit(1);
}

/* The decoder's pixels are about [-1, 1]: (x + 1) / 2 * 255, clipped, as the CLI converts. */
static unsigned char to_u8(float x) {
    float v = (x + 1.0f) / 2.0f * 255.0f;
    return v > 255.0f ? 255 : v > 0.0f ? (unsigned char)v : 0;
}

/* One image (h, w, 3 floats) as dir/<index>.ppm. */
static void write_ppm(const char *dir, int index, const float *px, int h, int w) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.ppm", dir, index);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fprintf(f, "P6\n%d %d\n255\n", w, h);
    for (long i = 0; i < (long)h * w * 3; i++) fputc(to_u8(px[i]), f);
    if (fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    printf("wrote %s (%dx%d)\n", path, w, h);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s OUT_FOLDER [PROMPT [ARCH]]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    const char *prompt = argc > 2 ? argv[2] : "a red apple";
    const char *arch = argc > 3 ? argv[3] : "tiny-janus";
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        perror(dir);
        return 1;
    }
    printf("libflexdiag %s (API version %u)\n", flexdiag_version(), flexdiag_api_version());

    /* 1. runtime: every params struct is filled by its _init() first (defaults, struct_size),
     *    then the fields we care about. The default device is the GPU when the library was
     *    built with CUDA and one is present, else the CPU. */
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    flexdiag_runtime *rt = NULL;
    check(flexdiag_runtime_create(&rp, &rt), "flexdiag_runtime_create");

    /* 2. model: path NULL loads a built-in shape (a model folder would be its path) */
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    mp.arch = arch;
    flexdiag_model *model = NULL;
    check(flexdiag_model_load(rt, NULL, &mp, &model), "flexdiag_model_load");

    /* 3. context: up to N_IMAGES images generated together */
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = N_IMAGES;
    flexdiag_context *ctx = NULL;
    check(flexdiag_context_create(model, &cp, &ctx), "flexdiag_context_create");

    /* 4. request: one prompt, N_IMAGES samples of it; the same seed draws the same images */
    flexdiag_request rq;
    flexdiag_request_init(&rq);
    rq.n_prompts = 1;
    rq.prompts = &prompt;
    rq.images_per_prompt = N_IMAGES;
    rq.seed = 1;

    /* 5. generate: a call without a token buffer asks for the sizes, the second fills it */
    flexdiag_output out = {0};
    check(flexdiag_generate(ctx, &rq, &out), "flexdiag_generate (sizes)");
    out.tokens = malloc(sizeof(int32_t) * out.n_images * out.tokens_per_image);
    if (!out.tokens) return 1;
    check(flexdiag_generate(ctx, &rq, &out), "flexdiag_generate");

    /* 6. decode the image tokens to pixels and write them */
    int32_t h = 0, w = 0;
    check(flexdiag_model_image_size(model, &h, &w), "flexdiag_model_image_size");
    float *px = malloc(sizeof(float) * out.n_images * h * w * 3);
    if (!px) return 1;
    check(flexdiag_decode_images(model, out.tokens, out.n_images, px), "flexdiag_decode_images");
    for (int i = 0; i < out.n_images; i++) write_ppm(dir, i, px + (long)i * h * w * 3, h, w);

    /* 7. destroy in reverse order: contexts, then models, then the runtime */
    free(px);
    free(out.tokens);
    flexdiag_context_destroy(ctx);
    flexdiag_model_destroy(model);
    flexdiag_runtime_destroy(rt);
    return 0;
}
