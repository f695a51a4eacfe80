/*
 * vocab_map.c - Chameleon's (Lumina-mGPT's) image vocabulary: which ids are image codes, which
 * VQGAN code each of them stands for, and the structural ids of an image.
 *
 * config.json carries `vocabulary_map` (token name -> id). Image codes are the names
 * "IMGIMG<letters>Z": the letters A..J are the decimal digits of the code index. Their ids must
 * form one contiguous range (the head computes that slice of lm_head); the code of each id is
 * read from its name, never assumed to be id - first id. The structural tokens are named too:
 * <racm3:break> starts an image, <eoss> ends it, <reserved08799> ends a row of codes,
 * <reserved08706> ends the text of the prompt, and <reserved{8800 + n}> is the height or width
 * of n 32-pixel cells (n = grid / 2 for 16-pixel codes). The grid is the config's "image_grid"
 * (flexdiag's key; 32 = the 512-pixel Lumina-mGPT-7B-512 when absent).
 * Only image generation needs the image vocabulary: a map whose codes are not one range, or
 * that lacks a structural token, leaves a text model (image_vocab 0) and says why in no_image.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/model/vocab_map.h"

#define GRID_DEFAULT 32
#define GRID_MAX 256

/* Code index of an image token name, or -1 when the name is not one. */
static int64_t code_of_name(const char *name) {
    size_t n = strlen(name);
    if (n < 8 || strncmp(name, "IMGIMG", 6) != 0 || name[n - 1] != 'Z') return -1;
    int64_t code = 0;
    for (size_t i = 6; i + 1 < n; i++) {
        if (name[i] < 'A' || name[i] > 'J' || code > (int64_t)1 << 40) return -1;
        code = code * 10 + (name[i] - 'A');
    }
    return code;
}

/* The id of structural token name into *out; 0 when the map has none in [0, vocab), the
 * reason then in m->no_image. */
static int need_id(json_t *map, const char *name, int32_t vocab, flexdiag_model_config *m,
                   int32_t *out) {
    json_t *v = json_object_get(map, name);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
        snprintf(m->no_image, sizeof m->no_image,
                 "vocabulary_map has no valid id for \"%s\" (an integer in [0, %d)); "
                 "Lumina-mGPT image generation needs it", name, vocab);
        return 0;
    }
    *out = (int32_t)json_integer_value(v);
    return 1;
}

/* First image id and count: the image names' ids must be one contiguous range (else no image
 * codes, the reason in m->no_image). */
static flexdiag_status code_range(const char *file, json_t *map, int32_t vocab,
                                  flexdiag_model_config *m) {
    int64_t lo = INT64_MAX, hi = -1, count = 0;
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (code_of_name(name) < 0) continue;
        int64_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= vocab)
            return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                                 "%s: vocabulary_map[\"%s\"] is not an id in [0, %d)", file, name,
                                 vocab);
        lo = id < lo ? id : lo;
        hi = id > hi ? id : hi;
        count++;
    }
    if (count == 0) return FLEXDIAG_OK; /* a text-only vocabulary */
    if (hi - lo + 1 != count) {
        snprintf(m->no_image, sizeof m->no_image,
                 "the %lld image-code ids of vocabulary_map span [%lld, %lld], not one "
                 "contiguous range; flexdiag's image head needs one",
                 (long long)count, (long long)lo, (long long)hi);
        return FLEXDIAG_OK;
    }
    m->img_id0 = (int32_t)lo;
    m->image_vocab = (int32_t)count;
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vocab_map_ids(const char *file, json_t *root,
                                        flexdiag_model_config *m) {
    m->img_id0 = m->row_end_id = m->eoi_id = m->size_id = m->eot_id = -1;
    m->image_vocab = m->grid = m->image_tokens = 0;
    m->no_image[0] = '\0';
    json_t *map = json_object_get(root, "vocabulary_map");
    if (!json_is_object(map)) return FLEXDIAG_OK; /* text only */
    int32_t V = m->lm.vocab;
    FLEXDIAG_TRY(code_range(file, map, V, m));
    if (m->image_vocab == 0) return FLEXDIAG_OK;
    json_t *g = json_object_get(root, "image_grid");
    json_int_t grid = g ? (json_is_integer(g) ? json_integer_value(g) : -1) : GRID_DEFAULT;
    if (grid < 2 || grid > GRID_MAX || grid % 2)
        return flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                             "%s: image_grid must be an even integer in [2, %d] (codes per image "
                             "side: 32 for 512 px, 48 for 768 px)",
                             file, GRID_MAX);
    char size[32];
    snprintf(size, sizeof size, "<reserved%05d>", 8800 + (int)grid / 2);
    if (need_id(map, "<racm3:break>", V, m, &m->boi_id) &&
        need_id(map, "<eoss>", V, m, &m->eoi_id) &&
        need_id(map, "<reserved08799>", V, m, &m->row_end_id) &&
        need_id(map, "<reserved08706>", V, m, &m->eot_id) &&
        need_id(map, size, V, m, &m->size_id)) {
        m->grid = (int32_t)grid;
        m->image_tokens = m->grid * m->grid;
        return FLEXDIAG_OK;
    }
    m->img_id0 = m->boi_id = m->row_end_id = m->eoi_id = m->size_id = m->eot_id = -1;
    m->image_vocab = 0; /* a text model */
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__vocab_map_codes(const char *dir, const flexdiag_model_config *m,
                                          int32_t **codes) {
    *codes = NULL;
    if (m->arch != FLEXDIAG_ARCH_CHAMELEON || m->image_vocab < 1) return FLEXDIAG_OK;
    int32_t *t = malloc((size_t)m->image_vocab * sizeof *t);
    if (!t) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "vocabulary map: no host memory");
    if (!dir) { /* builtin shapes: code = id - first id */
        for (int32_t i = 0; i < m->image_vocab; i++) t[i] = i;
        *codes = t;
        return FLEXDIAG_OK;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *map = json_object_get(root, "vocabulary_map");
    flexdiag_status st = map ? FLEXDIAG_OK
                             : flexdiag__err(FLEXDIAG_ERR_IO, "%s: cannot read vocabulary_map "
                                             "again (%s)", path, je.text);
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        int64_t code = code_of_name(name);
        if (code < 0 || st != FLEXDIAG_OK) continue;
        if (code >= m->image_vocab)
            st = flexdiag__err(FLEXDIAG_ERR_CORRUPT_MODEL,
                               "%s: vocabulary_map[\"%s\"] names code %lld, but the vocabulary "
                               "has %d image codes (0 .. %d)",
                               path, name, (long long)code, m->image_vocab, m->image_vocab - 1);
        else
            t[json_integer_value(v) - m->img_id0] = (int32_t)code;
    }
    json_decref(root);
    if (st != FLEXDIAG_OK) {
        free(t);
        return st;
    }
    *codes = t;
    return FLEXDIAG_OK;
}

void flexdiag__image_codes(const flexdiag_model_config *m, const int32_t *codes,
                           const int32_t *ids, int32_t *out) {
    if (m->arch != FLEXDIAG_ARCH_CHAMELEON) {
        memcpy(out, ids, (size_t)m->image_tokens * sizeof *out);
        return;
    }
    for (int32_t r = 0; r < m->grid; r++)
        for (int32_t x = 0; x < m->grid; x++) {
            int32_t id = ids[r * (m->grid + 1) + x] - m->img_id0;
            out[r * m->grid + x] = id >= 0 && id < m->image_vocab ? codes[id] : -1;
        }
}
