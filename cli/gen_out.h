/*
 * gen_out.h - what `flexdiag generate` writes, image by image: the PNG (or, for DPG, its
 * prompt's grid), the tokens.json record and the results.jsonl record, in the output layout of
 * prompts.h. Images are emitted in job order, so one DPG prompt is pending at most. An image is
 * written whole or not at all: after a failed write, results.jsonl, tokens.json and the PNGs
 * describe exactly the images before it. A process of an MPI job (and a --resume run) writes its
 * records into part files instead (results.jsonl.part-<rank>, tokens.json.part-<rank>), each
 * in the same format, which gen_merge.c merges in image order at the end.
 */
#ifndef FLEXDIAG_CLI_GEN_OUT_H
#define FLEXDIAG_CLI_GEN_OUT_H

#include <jansson.h>
#include <stdint.h>

#include "cli/fileio.h"
#include "cli/prompts.h"

typedef struct gen_out {
    /* set by the caller before gen_out_open */
    const char *dir;       /* --out */
    cli_layout layout;     /* --layout */
    int64_t per_prompt;    /* --images-per-prompt */
    const cli_prompts *ps; /* the prompts (image g is sample g % per_prompt of prompt g / per) */
    const char *part;      /* NULL: write results.jsonl and tokens.json; ".part-<rank>": write
                              results.jsonl.part-<rank> and tokens.json.part-<rank> */
    /* set by the caller before the first image */
    int32_t per_image;    /* tokens per image */
    int32_t grid_w;       /* ids per row in tokens.json */
    int32_t img_h, img_w; /* decoded image size; 0 = no image decoder */
    json_t *common;       /* record fields shared by all images (model, policy, sampling), owned */
    const flexdiag_model *text_model; /* a text model with a tokenizer: each record gets its
                                         generated "text" and "ids"; NULL otherwise */
    int32_t eos_id;       /* with text_model: the continuation ends before it (-1: none) */
    uint8_t *dpg_cells;   /* dpg: per_prompt RGB images of the pending prompt, owned */
    /* owned here */
    cli_jsonl results;   /* <out>/results.jsonl */
    cli_stream tokens;   /* <out>/tokens.json, built in its temp file */
    char *pend_tokens;   /* tokens.json records of the images not written yet (dpg: the pending
                            prompt's), malloc'ed text */
    char *pend_results;  /* their results.jsonl lines, malloc'ed text */
    size_t pend_tokens_len, pend_results_len; /* bytes of text in each */
    int64_t pending;     /* images in pend_* */
    int64_t images_done; /* images with all outputs written */
    int64_t pngs;        /* PNG files written */
} gen_out;

/* One block's generated images, ready to write. */
typedef struct gen_block {
    int64_t first;         /* job index of the block's first image */
    int32_t n;             /* images in the block */
    const int32_t *tokens; /* (n, per_image) ids */
    const uint8_t *rgb;    /* (n, H, W, 3) pixels, NULL without a decoder */
    double seconds;        /* wall time of generate + decode */
} gen_block;

/* tokens.json: this head (printf format of tokens_per_image), records separated by ",\n", the
 * tail. */
#define GEN_OUT_TOKENS_HEAD "{\"tokens_per_image\": %d, \"images\": [\n"
#define GEN_OUT_TOKENS_SEP ",\n"
#define GEN_OUT_TOKENS_TAIL "\n]}\n"

/* Without part: create --out and results.jsonl (before the model loads, so a bad folder fails
 * fast), after a warning when --out already holds PNGs (they are kept), and remove an earlier
 * tokens.json. With part: open results.jsonl<part> in the folder gen_out_reset or a resume
 * made. These return 0, or an exit code after printing one line naming the file; a failed
 * write stops the job. */
int gen_out_open(gen_out *w);
/* What gen_out_open does to --out without part, for a job whose records go to part files: the
 * warning, the folder, an empty results.jsonl, no tokens.json. */
int gen_out_reset(const gen_out *w);
/* Start tokens.json (in its temp file); needs per_image. */
int gen_out_tokens_open(gen_out *w);
/* All outputs of block b's images, in image order: the PNGs of a block (plain and GenEval
 * layouts) are encoded and written on up to threads threads, then the records of the images
 * before the first failure are committed together; DPG grids and records without pixels go
 * one image at a time. */
int gen_out_emit_block(gen_out *w, const gen_block *b, int threads);
/* Complete tokens.json with the images written so far, rename it into place and close
 * results.jsonl (if tokens.json cannot be completed, its temp file is kept and named). */
int gen_out_tokens_close(gen_out *w);
/* Remove the PNG temp files ("x.png.tmp.<pid>") a killed run left under dir; call only while
 * no process of this job writes there. */
void gen_out_drop_png_temps(const char *dir);
/* Close and free what gen_out owns (not the caller's fields). */
void gen_out_free(gen_out *w);

/* Path of image g's PNG relative to --out (dpg: its prompt's grid). */
void gen_out_image_rel(const gen_out *w, int64_t g, char *rel, size_t cap);

/* A text model's continuation (ids, per_image of them): *n gets the ids before the first EOS,
 * the result their text (malloc'ed, *len bytes, special tokens dropped); NULL when out of
 * memory. */
char *gen_out_text(const gen_out *w, const int32_t *ids, int32_t *n, size_t *len);

#endif /* FLEXDIAG_CLI_GEN_OUT_H */
