/*
 * gen_out.c - the files `flexdiag generate` writes (see gen_out.h). Each PNG is written
 * atomically (temp + rename); its results.jsonl line follows as one fwrite of the whole line +
 * fflush, then its tokens.json record. tokens.json grows in "tokens.json.tmp.<pid>" and is
 * renamed at the end, after an interrupt too: memory stays O(block) and the file is never seen
 * half-written (rejected: keeping every token until the end, GBs for large prompt sets). DPG
 * grids hold the N samples of a prompt tiled in ceil(sqrt N) columns (2x2 for N = 4, as
 * DPG-Bench's scorer splits it).
 */
#include "cli/gen_out.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/fileio.h"
#include "cli/image_out.h"

#define CMD "generate"
#define JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "flexdiag " CMD ": ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return rc;
}

int gen_out_open(gen_out *w) {
    if (cli_mkdirs(w->dir))
        return fail(1, "--out: cannot create folder '%s': %s", w->dir, strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/results.jsonl", w->dir);
    w->results = fopen(path, "w");
    if (!w->results) return fail(1, "--out: cannot write '%s': %s", path, strerror(errno));
    w->dpg_records = json_array();
    return w->dpg_records ? 0 : fail(1, "out of host memory");
}

void gen_out_free(gen_out *w) {
    if (w->results) fclose(w->results);
    w->results = NULL;
    json_decref(w->dpg_records);
    w->dpg_records = NULL;
}

/* One results.jsonl record as a single write of the whole line, flushed. */
static int results_append(gen_out *w, json_t *rec) {
    size_t n = json_dumpb(rec, NULL, 0, JSON_FLAGS);
    char *buf = n ? malloc(n + 1) : NULL;
    int ok = buf && json_dumpb(rec, buf, n, JSON_FLAGS) == n;
    if (ok) {
        buf[n] = '\n';
        ok = fwrite(buf, 1, n + 1, w->results) == n + 1 && fflush(w->results) == 0;
    }
    free(buf);
    return ok ? 0 : fail(1, "--out %s: cannot append to results.jsonl: %s", w->dir,
                         strerror(errno));
}

/* The tokens.json record of image g (appended to the temp file). */
static int tokens_append(gen_out *w, int64_t g, const int32_t *t) {
    int per = (int)w->per_prompt;
    const char *text = w->ps->p[g / per].text;
    json_t *js = json_string(text); /* valid UTF-8: checked when the prompts were read */
    char *ptext = json_dumps(js, JSON_ENCODE_ANY);
    json_decref(js);
    fprintf(w->tokens, "%s{\"prompt_index\": %lld, \"sample\": %lld, \"image_index\": %lld, "
                       "\"prompt\": %s, \"grid\": [",
            g ? ",\n" : "", (long long)(g / per), (long long)(g % per), (long long)g,
            ptext ? ptext : "null");
    free(ptext);
    for (int32_t r = 0; r < w->per_image; r++)
        fprintf(w->tokens, "%s%d", r % w->grid_w ? "," : (r ? "],\n  [" : "\n  ["), t[r]);
    fprintf(w->tokens, "]]}");
    return ferror(w->tokens) ? fail(1, "cannot write '%s': %s", w->tokens_tmp, strerror(errno))
                             : 0;
}

int gen_out_tokens_open(gen_out *w) {
    if (asprintf(&w->tokens_tmp, "%s/tokens.json.tmp.%ld", w->dir, (long)getpid()) < 0) {
        w->tokens_tmp = NULL;
        return fail(1, "out of host memory");
    }
    w->tokens = fopen(w->tokens_tmp, "w");
    if (!w->tokens) {
        int rc = fail(1, "--out %s: cannot create '%s': %s", w->dir, w->tokens_tmp,
                      strerror(errno));
        free(w->tokens_tmp);
        w->tokens_tmp = NULL;
        return rc;
    }
    fprintf(w->tokens, "{\"tokens_per_image\": %d, \"images\": [\n", w->per_image);
    return 0;
}

int gen_out_tokens_close(gen_out *w) {
    if (!w->tokens) return 0;
    fprintf(w->tokens, "\n]}\n");
    int ok = !ferror(w->tokens) && fflush(w->tokens) == 0 && fsync(fileno(w->tokens)) == 0;
    int err = errno;
    if (fclose(w->tokens) != 0 && ok) ok = 0, err = errno;
    w->tokens = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokens.json", w->dir);
    if (ok && rename(w->tokens_tmp, path) != 0) ok = 0, err = errno;
    if (!ok) unlink(w->tokens_tmp);
    free(w->tokens_tmp);
    w->tokens_tmp = NULL;
    return ok ? 0 : fail(1, "cannot write '%s': %s", path, strerror(err));
}

/* Path of image g's PNG relative to --out (dpg: its prompt's grid). */
static void image_rel(const gen_out *w, int64_t g, char *rel, size_t cap) {
    long long per = w->per_prompt, p = g / per, k = g % per;
    if (w->layout == CLI_LAYOUT_GENEVAL) snprintf(rel, cap, "%05lld/samples/%04lld.png", p, k);
    else if (w->layout == CLI_LAYOUT_DPG) snprintf(rel, cap, "%s.png", w->ps->p[p].id);
    else snprintf(rel, cap, "%lld/%lld.png", p, k);
}

/* Folder of prompt p's samples (plain, geneval) and GenEval's metadata.jsonl. */
static int prompt_folder(const gen_out *w, int64_t p) {
    char dir[4200], path[4300];
    const char *fmt = w->layout == CLI_LAYOUT_GENEVAL ? "%s/%05lld/samples" : "%s/%lld";
    snprintf(dir, sizeof dir, fmt, w->dir, (long long)p);
    if (cli_mkdirs(dir))
        return fail(1, "--out: cannot create folder '%s': %s", dir, strerror(errno));
    if (w->layout != CLI_LAYOUT_GENEVAL) return 0;
    snprintf(path, sizeof path, "%s/%05lld/metadata.jsonl", w->dir, (long long)p);
    const char *meta = w->ps->p[p].meta;
    size_t n = strlen(meta);
    char *line = malloc(n + 2);
    if (!line) return fail(1, "out of host memory");
    memcpy(line, meta, n);
    line[n] = '\n';
    cli_part part = {line, n + 1};
    flexdiag_status st = cli_write_atomic(path, &part, 1);
    free(line);
    return st == FLEXDIAG_OK ? 0 : cli_fail_io(CMD);
}

static int write_png(const gen_out *w, const char *rel, const uint8_t *rgb, int pw, int ph) {
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", w->dir, rel);
    return flexdiag__png_write_rgb(path, rgb, pw, ph) == FLEXDIAG_OK ? 0 : cli_fail_io(CMD);
}

/* results.jsonl record of image i of block b; NULL when out of memory. */
static json_t *image_record(const gen_out *w, const gen_block *b, int32_t i, const char *file) {
    int64_t g = b->first + i, per = w->per_prompt;
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx",
             (unsigned long long)cli_fnv1a64_ids(b->tokens + (size_t)i * (size_t)w->per_image,
                                                 w->per_image));
    json_t *r = json_pack("{s:I, s:I, s:I, s:s, s:s?}", "prompt_index", (json_int_t)(g / per),
                          "sample", (json_int_t)(g % per), "image_index", (json_int_t)g,
                          "prompt", w->ps->p[g / per].text, "file", file);
    if (!r || json_object_update(r, w->common) != 0 ||
        json_object_set_new(r, "tokens_fnv1a64", json_string(hash)) != 0 ||
        json_object_set_new(r, "block_s", json_real(b->seconds)) != 0 ||
        json_object_set_new(r, "images_in_block", json_integer(b->n)) != 0) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* DPG: the pending prompt's samples tiled into <id>.png, then their records. */
static int dpg_flush(gen_out *w, const char *rel) {
    int n = (int)w->per_prompt, cols = 1, gw = 0, gh = 0;
    while (cols * cols < n) cols++; /* ceil(sqrt n): 2x2 for 4 samples */
    size_t px = (size_t)w->img_h * (size_t)w->img_w * 3;
    const uint8_t **cells = malloc((size_t)n * sizeof *cells);
    if (!cells) return fail(1, "out of host memory");
    for (int k = 0; k < n; k++) cells[k] = w->dpg_cells + (size_t)k * px;
    uint8_t *grid = NULL;
    flexdiag_status st = flexdiag__png_tile(cells, n, w->img_w, w->img_h, cols, &grid, &gw, &gh);
    int rc = st == FLEXDIAG_OK ? write_png(w, rel, grid, gw, gh) : cli_fail_io(CMD);
    free(grid);
    free(cells);
    if (!rc) w->pngs++;
    for (size_t k = 0; !rc && k < json_array_size(w->dpg_records); k++)
        rc = results_append(w, json_array_get(w->dpg_records, k));
    if (!rc) w->images_done += n;
    json_array_clear(w->dpg_records);
    return rc;
}

/* In order: tokens record, PNG, results line. */
int gen_out_emit(gen_out *w, const gen_block *b, int32_t i) {
    int64_t g = b->first + i, per = w->per_prompt, k = g % per;
    size_t px = (size_t)w->img_h * (size_t)w->img_w * 3;
    int rc = tokens_append(w, g, b->tokens + (size_t)i * (size_t)w->per_image);
    char rel[4200];
    if (b->rgb) image_rel(w, g, rel, sizeof rel);
    int dpg = b->rgb && w->layout == CLI_LAYOUT_DPG;
    if (!rc && dpg) memcpy(w->dpg_cells + (size_t)k * px, b->rgb + (size_t)i * px, px);
    else if (!rc && b->rgb) {
        rc = k == 0 ? prompt_folder(w, g / per) : 0;
        if (!rc) rc = write_png(w, rel, b->rgb + (size_t)i * px, w->img_w, w->img_h);
        if (!rc) w->pngs++;
    }
    json_t *rec = rc ? NULL : image_record(w, b, i, b->rgb ? rel : NULL);
    if (!rc && !rec) rc = fail(1, "out of host memory");
    if (!rc && dpg) {
        rc = json_array_append(w->dpg_records, rec) ? fail(1, "out of host memory") : 0;
        if (!rc && k == per - 1) rc = dpg_flush(w, rel);
    } else if (!rc) {
        rc = results_append(w, rec);
        if (!rc) w->images_done++;
    }
    json_decref(rec);
    return rc;
}
