/*
 * old_header.c - a program as it was written against an older flexdiag.h, run against this
 * library (docs/abi.md: "a program built against an older header runs against a newer
 * library"). meson builds it three times: against tests/abi/api4/flexdiag.h (API version 4),
 * tests/abi/api9/flexdiag.h (API version 9) and include/flexdiag.h (today's, the reference).
 *
 * Params structs are filled by the library's _init() functions, as programs do, with guard
 * bytes after each struct that must come back untouched: an _init() that writes past the
 * program's struct exits 3 (docs/abi.md, "Known break"); any other failure exits 1. With
 * FLEXDIAG_ABI_OWN_SIZE=1 in the environment each _init() fills a scratch buffer instead and
 * the program keeps the bytes its header has, struct_size = its sizeof (what an _init() that
 * knows the caller's size gives): the library's side of the struct_size rule alone.
 *
 * The session, on the micro-janus builtin (fast in sanitizer builds too): a runtime, a model,
 * a context, 2 images of one prompt (API >= 9: sharing the prompt's KV, images_per_prompt 2),
 * the codes in the codebook, the offload info at the program's size, one image decoded to
 * finite pixels. It prints "tokens <FNV-1a hash>", which tests/abi/old_headers.sh compares
 * across the builds: the images do not depend on the header a program was built with.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexdiag.h"

#define GUARD 256   /* bytes checked after each struct */
#define FILL 0xa5   /* what they hold */
#define N_IMAGES 2
#define TOKENS 64     /* per micro-janus image */
#define CODEBOOK 256  /* micro-janus image codes */

/* A struct of this program's header with guard bytes after it. */
#define GUARDED(type)                                                                              \
    struct {                                                                                       \
        type v;                                                                                    \
        unsigned char guard[GUARD];                                                                \
    }

static int fail(const char *what, flexdiag_status st) {
    fprintf(stderr, "FAIL %s: %s (%s)\n", what, flexdiag_status_str(st), flexdiag_last_error(NULL));
    return 1;
}

/* 1 when the guard after a struct of `size` bytes was written (its first changed byte named). */
static int guard_broken(const unsigned char *guard, size_t size, const char *what) {
    for (size_t i = 0; i < GUARD; i++)
        if (guard[i] != FILL) {
            fprintf(stderr, "FAIL %s wrote byte %zu of a %zu-byte struct (API version %u)\n", what,
                    size + i, size, (unsigned)FLEXDIAG_API_VERSION);
            return 1;
        }
    return 0;
}

#define CHECK_GUARD(g, what) guard_broken((g).guard, sizeof (g).v, what)

#define KNOWN_BREAK 3 /* exit status: an _init() wrote past this program's struct */
static int own_size;  /* FLEXDIAG_ABI_OWN_SIZE=1: params sized by this program */

/* Fill the params struct g.v (guard after it) with the library's init_fn: in place, the guard
 * checked (returns KNOWN_BREAK from the caller when broken), or through a scratch buffer with
 * struct_size = this program's sizeof. */
#define INIT_PARAMS(g, init_fn)                                                                    \
    do {                                                                                           \
        memset(&(g), FILL, sizeof(g));                                                             \
        if (own_size) {                                                                            \
            static _Alignas(16) unsigned char scratch_[4096];                                      \
            memset(scratch_, 0, sizeof scratch_);                                                  \
            init_fn((__typeof__(&(g).v))scratch_);                                                 \
            memcpy(&(g).v, scratch_, sizeof(g).v);                                                 \
            (g).v.struct_size = sizeof(g).v;                                                       \
        } else {                                                                                   \
            init_fn(&(g).v);                                                                       \
            if (CHECK_GUARD(g, #init_fn)) return KNOWN_BREAK;                                      \
        }                                                                                          \
    } while (0)

static uint64_t fnv1a(const int32_t *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof *x; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int check_tokens(const flexdiag_output *out) {
    if (out->n_images != N_IMAGES || out->tokens_per_image != TOKENS) {
        fprintf(stderr, "FAIL output: %d images of %d tokens\n", out->n_images,
                out->tokens_per_image);
        return 1;
    }
    for (int32_t i = 0; i < N_IMAGES * TOKENS; i++)
        if (out->tokens[i] < 0 || out->tokens[i] >= CODEBOOK) {
            fprintf(stderr, "FAIL token %d is %d, outside the codebook\n", i, out->tokens[i]);
            return 1;
        }
    return 0;
}

/* The offload info of API version 4 at this program's size: filled, nothing written past. */
static int check_offload(const flexdiag_context *c) {
    GUARDED(flexdiag_offload_info) oi;
    memset(&oi, FILL, sizeof oi);
    oi.v.struct_size = sizeof oi.v;
    flexdiag_status st = flexdiag_context_offload(c, &oi.v);
    if (st != FLEXDIAG_OK) return fail("flexdiag_context_offload", st);
    if (oi.v.struct_size != sizeof oi.v || oi.v.weights_pct[0] != 100 || !oi.v.scheduler) {
        fprintf(stderr, "FAIL offload info: struct_size %u, weights_pct[0] %u\n",
                oi.v.struct_size, oi.v.weights_pct[0]);
        return 1;
    }
    return CHECK_GUARD(oi, "flexdiag_context_offload");
}

static int check_pixels(flexdiag_model *m, const int32_t *tokens) {
    int32_t h = 0, w = 0;
    flexdiag_status st = flexdiag_model_image_size(m, &h, &w);
    if (st != FLEXDIAG_OK) return fail("flexdiag_model_image_size", st);
    float *px = malloc((size_t)h * w * 3 * sizeof *px);
    if (!px || h < 1 || w < 1) return fail("image size or memory", FLEXDIAG_ERR_OOM_HOST);
    st = flexdiag_decode_images(m, tokens, 1, px);
    int bad = st != FLEXDIAG_OK ? fail("flexdiag_decode_images", st) : 0;
    for (int64_t i = 0; !bad && i < (int64_t)h * w * 3; i++)
        if (!isfinite(px[i])) bad = fail("decoded pixel not finite", FLEXDIAG_ERR_NUMERIC);
    free(px);
    return bad;
}

/* Generate, check and hash the images of one context of m. */
static int run_context(flexdiag_model *m) {
    GUARDED(flexdiag_context_params) cp;
    INIT_PARAMS(cp, flexdiag_context_params_init);
    cp.v.max_images = N_IMAGES;
    cp.v.max_prompt_len = 32;
#if FLEXDIAG_API_VERSION >= 9
    cp.v.images_per_prompt = N_IMAGES; /* a field since API version 9 */
#endif
    GUARDED(flexdiag_request) rq;
    INIT_PARAMS(rq, flexdiag_request_init); /* (its size never changed) */
    static const char *const prompts[] = {"a red apple"};
    rq.v.n_prompts = 1;
    rq.v.prompts = prompts;
    rq.v.images_per_prompt = N_IMAGES;
    rq.v.seed = 11;

    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(m, &cp.v, &c);
    if (st != FLEXDIAG_OK) return fail("flexdiag_context_create", st);
    int32_t tokens[N_IMAGES * TOKENS];
    flexdiag_output out = {.tokens = tokens};
    st = flexdiag_generate(c, &rq.v, &out);
    int bad = st != FLEXDIAG_OK ? fail("flexdiag_generate", st) : 0;
    if (!bad) bad = check_tokens(&out) || check_offload(c) || check_pixels(m, tokens);
    if (!bad) printf("tokens %016llx\n", (unsigned long long)fnv1a(tokens, N_IMAGES * TOKENS));
    flexdiag_context_destroy(c);
    return bad;
}

static int run_model(flexdiag_runtime *rt) {
    GUARDED(flexdiag_model_params) mp;
    INIT_PARAMS(mp, flexdiag_model_params_init);
    mp.v.arch = "micro-janus";
    flexdiag_model *m = NULL;
    flexdiag_status st = flexdiag_model_load(rt, NULL, &mp.v, &m);
    if (st != FLEXDIAG_OK) return fail("flexdiag_model_load", st);
    int bad = run_context(m);
    flexdiag_model_destroy(m);
    return bad;
}

int main(void) {
    if (flexdiag_api_version() < FLEXDIAG_API_VERSION) {
        fprintf(stderr, "FAIL the library's API version %u is older than the header's %u\n",
                flexdiag_api_version(), (unsigned)FLEXDIAG_API_VERSION);
        return 1;
    }
    const char *env = getenv("FLEXDIAG_ABI_OWN_SIZE");
    own_size = env && !strcmp(env, "1");
    GUARDED(flexdiag_runtime_params) rp;
    INIT_PARAMS(rp, flexdiag_runtime_params_init);
    rp.v.device = -1;
    rp.v.threads = 1;
    flexdiag_runtime *rt = NULL;
    flexdiag_status st = flexdiag_runtime_create(&rp.v, &rt);
    if (st != FLEXDIAG_OK) return fail("flexdiag_runtime_create", st);
    int bad = run_model(rt);
    flexdiag_runtime_destroy(rt);
    return bad;
}
