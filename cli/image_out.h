/*
 * image_out.h - decoded pixels to files: float -> uint8 conversion of the Janus reference
 * (docs/architecture.md §4.1 step 8), grid tiling of several images, and an atomic 8-bit RGB PNG
 * writer (cli_write_atomic: an interrupted run never leaves a partial PNG). Plain C on libpng;
 * failures return a status of the public header and leave their message in cli_io_error().
 */
#ifndef FLEXDIAG_IMAGE_OUT_H
#define FLEXDIAG_IMAGE_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = trunc(clip((x[i] + 1) / 2 · 255, 0, 255)) computed in fp32 like the reference's
 * numpy code; NaN -> 0. x and out hold n elements (borrowed). */
void flexdiag__pixels_to_u8(const float *x, int64_t n, uint8_t *out);

/* Write w×h interleaved RGB (rgb: h rows of 3·w bytes, borrowed) to path as an 8-bit PNG,
 * atomically; on any failure path is untouched. Errors name the path: FLEXDIAG_ERR_INVALID_ARG
 * (sizes), FLEXDIAG_ERR_IO (libpng), or cli_write_atomic's (NO_SPACE, NOT_FOUND, IO). */
flexdiag_status flexdiag__png_write_rgb(const char *path, const uint8_t *rgb, int w, int h);

/* Encode w×h interleaved RGB (borrowed) as the same 8-bit PNG bytes the writer above puts in a
 * file, into *out (malloc'ed, caller frees; *len bytes). FLEXDIAG_ERR_INVALID_ARG (sizes),
 * FLEXDIAG_ERR_IO (libpng, out of memory included). */
flexdiag_status flexdiag__png_encode(const uint8_t *rgb, int w, int h, uint8_t **out,
                                     size_t *len);

/* Whether path holds a whole PNG that decodes (every row read by libpng), of w×h pixels when
 * w > 0 (any size otherwise): what --resume keeps (a file cut short or overwritten is made
 * again). */
int flexdiag__png_whole(const char *path, int w, int h);

/* Tile n images of w×h RGB (imgs[i], borrowed) into a grid of `cols` columns and
 * ceil(n / cols) rows in row-major order; cells without an image are black. *out is malloc'ed
 * (caller frees), *out_w = cols·w, *out_h = rows·h. FLEXDIAG_ERR_INVALID_ARG for sizes that are
 * not positive or exceed the PNG limit, FLEXDIAG_ERR_OOM_HOST. */
flexdiag_status flexdiag__png_tile(const uint8_t *const *imgs, int n, int w, int h, int cols,
                                   uint8_t **out, int *out_w, int *out_h);

#ifdef __cplusplus
}
#endif

#endif /* FLEXDIAG_IMAGE_OUT_H */
