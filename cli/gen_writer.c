/*
 * gen_writer.c - generate's output stage on its own thread (gen_writer.h). The thread waits for
 * a block, decodes it DECODE_CHUNK images a call (flexdiag_decode_images runs on the runtime's
 * own stream, beside the context that generates the next block), converts the pixels to 8 bits
 * and hands the block to gen_out_emit_block; a text model's continuations are then printed in
 * image order. The block's tokens are copied at hand-over, so the caller's buffer is free for
 * the next block at once. Rejected: writing on the calling thread (the device idled for the
 * decode, every PNG's encoding and three fsyncs per image: at Janus shapes on the CPU of a GPU
 * host as long as generating the image) and one thread per image (the records must be committed
 * in image order anyway; gen_out writes a block's PNGs in parallel).
 */
#include "cli/gen_writer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/image_out.h"

#define CMD "generate"
#define DECODE_CHUNK 4 /* images per decode call: bounds the float pixel scratch */

struct gen_writer {
    gen_out *w;
    flexdiag_model *m;
    int threads;
    int32_t *tokens;       /* (batch, per_image) the block being written */
    float *pix;            /* (DECODE_CHUNK, H, W, 3) decoder output */
    uint8_t *rgb;          /* (batch, H, W, 3) */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* a block came, a block is done, or closing */
    int has_block;         /* a block is handed over and not yet written */
    int closing;
    int64_t first;         /* the block: its first image, its size, its generate seconds */
    int32_t n;
    double generate_s;
    int rc;                /* first failure's exit code (0: none) */
    atomic_bool failed;
};

/* The pixels of the block's n images into g->rgb; returns the seconds it took, or -1 after a
 * message. */
static double decode_block(gen_writer *g, int32_t n) {
    const gen_out *w = g->w;
    size_t px = (size_t)w->img_h * (size_t)w->img_w * 3;
    double t0 = cli_now();
    for (int32_t i0 = 0; i0 < n; i0 += DECODE_CHUNK) {
        int32_t m = n - i0 < DECODE_CHUNK ? n - i0 : DECODE_CHUNK;
        flexdiag_status st = flexdiag_decode_images(
            g->m, g->tokens + (size_t)i0 * (size_t)w->per_image, m, g->pix);
        if (st != FLEXDIAG_OK) {
            (void)cli_fail(CMD, st);
            return -1;
        }
        flexdiag__pixels_to_u8(g->pix, (int64_t)((size_t)m * px), g->rgb + (size_t)i0 * px);
    }
    return cli_now() - t0;
}

/* A text model's continuation of job item first + i on stdout: the prompt, then the text up to
 * the first EOS. */
static void print_text(const gen_writer *g, int32_t i) {
    const gen_out *w = g->w;
    int64_t item = g->first + i;
    size_t len = 0;
    int32_t n = 0;
    char *text = gen_out_text(w, g->tokens + (size_t)i * (size_t)w->per_image, &n, &len);
    if (text)
        printf("[%lld] %s%s\n", (long long)item, w->ps->p[item / w->per_prompt].text, text);
    free(text);
}

/* Decode and write the block in hand: 0, or 1 after a message. */
static int write_block(gen_writer *g) {
    gen_block b = {.first = g->first, .n = g->n, .tokens = g->tokens, .seconds = g->generate_s};
    if (g->w->img_h) {
        double s = decode_block(g, g->n);
        if (s < 0) return 1;
        b.rgb = g->rgb;
        b.seconds += s;
    }
    int rc = gen_out_emit_block(g->w, &b, g->threads);
    for (int32_t i = 0; !rc && g->w->text_model && i < g->n; i++) print_text(g, i);
    if (!rc && g->w->text_model) fflush(stdout);
    return rc;
}

static void *writer_main(void *arg) {
    gen_writer *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->has_block && !g->closing) pthread_cond_wait(&g->cv, &g->mu);
        if (!g->has_block) break;
        pthread_mutex_unlock(&g->mu);
        int rc = write_block(g);
        pthread_mutex_lock(&g->mu);
        if (rc && !g->rc) {
            g->rc = rc;
            atomic_store(&g->failed, true);
        }
        g->has_block = 0;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Free g and its buffers (the thread and its locks are gone or were never made). */
static void free_writer(gen_writer *g) {
    free(g->tokens);
    free(g->pix);
    free(g->rgb);
    free(g);
}

int gen_writer_open(gen_writer **out, gen_out *w, flexdiag_model *m, int32_t batch,
                    int threads) {
    *out = NULL;
    gen_writer *g = calloc(1, sizeof *g);
    size_t px = (size_t)w->img_h * (size_t)w->img_w * 3;
    if (!g) return cli_errorf(CMD, 1, "out of host memory");
    *g = (gen_writer){.w = w, .m = m, .threads = threads > 0 ? threads : 1};
    atomic_init(&g->failed, false);
    g->tokens = malloc((size_t)batch * (size_t)w->per_image * sizeof *g->tokens);
    if (w->img_h) {
        g->pix = malloc((size_t)DECODE_CHUNK * px * sizeof *g->pix);
        g->rgb = malloc((size_t)batch * px);
    }
    if (!g->tokens || (w->img_h && (!g->pix || !g->rgb))) {
        free_writer(g);
        return cli_errorf(CMD, 1, "out of host memory for a block of %d images (lower --batch)",
                          batch);
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    int e = pthread_create(&g->thread, NULL, writer_main, g);
    if (e) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free_writer(g);
        return cli_errorf(CMD, 1, "cannot start the output thread: %s", strerror(e));
    }
    *out = g;
    return 0;
}

/* Wait (mu held) until no block is in hand; the failure's exit code. */
static int idle(gen_writer *g) {
    while (g->has_block) pthread_cond_wait(&g->cv, &g->mu);
    return g->rc;
}

int gen_writer_put(gen_writer *g, int64_t first, int32_t n, const int32_t *tokens,
                   double generate_s) {
    pthread_mutex_lock(&g->mu);
    int rc = idle(g);
    if (!rc) {
        memcpy(g->tokens, tokens, (size_t)n * (size_t)g->w->per_image * sizeof *tokens);
        g->first = first;
        g->n = n;
        g->generate_s = generate_s;
        g->has_block = 1;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

int gen_writer_wait(gen_writer *g) {
    pthread_mutex_lock(&g->mu);
    int rc = idle(g);
    pthread_mutex_unlock(&g->mu);
    return rc;
}

bool gen_writer_failed(const gen_writer *g) { return g && atomic_load(&g->failed); }

void gen_writer_close(gen_writer *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    (void)idle(g);
    g->closing = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free_writer(g);
}
