/*
 * gen_writer.h - generate's output stage on a thread of its own: while block k+1 generates,
 * block k is decoded to pixels and its files are written (gen_out.h), so the device does not wait
 * for PNG encoding and fsyncs. One block is in the writer at a time; handing over the next waits
 * for it. The first failure is kept: every later call returns its exit code, and
 * gen_writer_failed tells a running block to stop (its progress callback cancels it).
 */
#ifndef FLEXDIAG_CLI_GEN_WRITER_H
#define FLEXDIAG_CLI_GEN_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/gen_out.h"
#include "flexdiag.h"

typedef struct gen_writer gen_writer;

/* A writer for blocks of up to batch images into w (its per_image, img_h, img_w and
 * text_model set); m decodes the pixels when w->img_h > 0; PNGs are written on up to threads
 * threads. w belongs to the writer until gen_writer_close. 0, or 1 after a message. */
int gen_writer_open(gen_writer **out, gen_out *w, flexdiag_model *m, int32_t batch,
                    int threads);
/* Hand over block [first, first + n) with its tokens (copied) and the seconds its generate
 * call took, once the previous block is written: 0, or the exit code of a failure. */
int gen_writer_put(gen_writer *g, int64_t first, int32_t n, const int32_t *tokens,
                   double generate_s);
/* Wait until every block handed over is written: 0, or the exit code of a failure. */
int gen_writer_wait(gen_writer *g);
/* Whether a block failed to be written (safe from any thread). */
bool gen_writer_failed(const gen_writer *g);
/* Wait for the writer and free it; NULL is a no-op. */
void gen_writer_close(gen_writer *g);

#endif /* FLEXDIAG_CLI_GEN_WRITER_H */
