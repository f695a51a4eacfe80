/*
 * gen_out.c - the files `flexdiag generate` writes (see gen_out.h).
 *
 * An image (for DPG: a prompt's samples, with their grid) is written in one order: its PNG
 * (atomic: temp + rename), its tokens.json record, its results.jsonl line; the results line is
 * the commit. Records are built in memory first, and a failed write takes back what came before
 * it for that image (a failed tokens record removes the PNG; a failed results line undoes the
 * tokens record and removes the PNG). The first failure stops the job with one line naming the
 * file, so results.jsonl, tokens.json and the PNGs always describe the same images, and
 * fileio.c keeps each of them whole (no partial line, record or PNG). A block of plain or
 * GenEval images is written the same way with its PNGs encoded and written on several threads
 * (an image's encoding costs as much as a few decode steps of a large batch), then the records
 * of the images before the first failed PNG in one commit; the PNGs after it are removed.
 * tokens.json grows in "tokens.json.tmp.<pid>" (always a complete file, see fileio.c) and is
 * renamed at the end, after an interrupt or a failure too: memory stays O(block) and the file is
 * never seen half-written (rejected: keeping every token until the end, GBs for large prompt
 * sets). A reused --out is announced, never cleaned: its older PNGs stay (those at this run's
 * paths are replaced); results.jsonl and tokens.json start afresh (cmd_generate.c also removes
 * the part and temp record files of an interrupted run: gen_merge_clear). DPG grids hold the N samples
 * of a prompt tiled in ceil(sqrt N) columns (2x2 for N = 4, as DPG-Bench's scorer splits it).
 * With gen_out.part set (the processes of an MPI job, a --resume run) the same records go to
 * results.jsonl<part> and tokens.json<part>; PNGs go to their final paths either way, so
 * processes writing one --out never share a file (GenEval's metadata.jsonl is written by the
 * process that makes the prompt's sample 0; others only make the folder).
 */
#include "cli/gen_out.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/image_out.h"

#define CMD "generate"
#define JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))
#define SCAN_DEPTH 3 /* levels under --out holding PNGs: <out>/<p>/samples/<k>.png (geneval) */

/* One line "flexdiag generate: ..." on stderr; returns rc. */
#define fail(rc, ...) cli_errorf(CMD, (rc), __VA_ARGS__)

/* The line of a failed write (cli_io_error), and exit code 1: the job stops here. left names a
 * PNG that could not be taken back (errno e), or is NULL. */
static int stop(const gen_out *w, const char *left, int e) {
    fprintf(stderr, "flexdiag " CMD ": %s; stopped after %lld complete image(s) in %s",
            cli_io_error(), (long long)w->images_done, w->dir);
    if (left) fprintf(stderr, "; %s is left over: removing it failed: %s", left, strerror(e));
    fputc('\n', stderr);
    return 1;
}

/* ---- opening, closing ---- */

/* Whether name is a PNG's temp file, "<name>.png.tmp.<digits>" (cli_write_atomic's). */
static int png_temp(const char *name) {
    const char *t = strstr(name, ".png.tmp.");
    if (!t || !t[9]) return 0;
    for (t += 9; *t; t++)
        if (*t < '0' || *t > '9') return 0;
    return 1;
}

/* Regular *.png files under dir, depth levels deep (symbolic links not followed); with
 * drop_temps, PNG temp files there are removed (a killed process's). */
static int64_t walk_pngs(const char *dir, int depth, int drop_temps) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = strlen(e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode) && depth > 1) n += walk_pngs(path, depth - 1, drop_temps);
        else if (S_ISREG(st.st_mode) && len > 4 && !strcmp(e->d_name + len - 4, ".png")) n++;
        else if (S_ISREG(st.st_mode) && drop_temps && png_temp(e->d_name)) (void)unlink(path);
    }
    closedir(d);
    return n;
}

static int64_t count_pngs(const char *dir, int depth) { return walk_pngs(dir, depth, 0); }

void gen_out_drop_png_temps(const char *dir) { (void)walk_pngs(dir, SCAN_DEPTH, 1); }

/* The warning about an earlier run's PNGs, and --out made. */
static int make_dir(const gen_out *w) {
    int64_t older = count_pngs(w->dir, SCAN_DEPTH);
    if (older > 0)
        fprintf(stderr, "flexdiag " CMD ": warning: --out %s already holds %lld PNG(s) from an "
                        "earlier run; they are kept (this run replaces those at the paths it "
                        "writes), results.jsonl and tokens.json will describe this run only\n",
                w->dir, (long long)older);
    if (cli_mkdirs(w->dir))
        return fail(1, "--out: cannot create folder '%s': %s", w->dir, strerror(errno));
    return 0;
}

/* Open results.jsonl<part> emptied. */
static int results_open(gen_out *w) {
    char path[4200];
    snprintf(path, sizeof path, "%s/results.jsonl%s", w->dir, w->part ? w->part : "");
    return cli_jsonl_open(&w->results, path, 1) == FLEXDIAG_OK ? 0 : cli_fail_io(CMD);
}

/* An earlier run's tokens.json would contradict the emptied results.jsonl until the end. */
static void tokens_remove(const gen_out *w) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokens.json", w->dir);
    (void)unlink(path);
}

int gen_out_open(gen_out *w) {
    if (w->part) return results_open(w);
    int rc = make_dir(w);
    if (!rc) rc = results_open(w);
    if (!rc) tokens_remove(w);
    return rc;
}

int gen_out_reset(const gen_out *w) {
    gen_out d = *w;
    d.part = NULL;
    int rc = make_dir(&d);
    if (!rc) rc = results_open(&d);
    if (!rc && cli_jsonl_close(&d.results) != FLEXDIAG_OK) rc = cli_fail_io(CMD);
    if (!rc) tokens_remove(&d);
    return rc;
}

void gen_out_free(gen_out *w) {
    cli_stream_abort(&w->tokens);
    (void)cli_jsonl_close(&w->results);
    free(w->pend_tokens);
    free(w->pend_results);
    w->pend_tokens = w->pend_results = NULL;
    w->pend_tokens_len = w->pend_results_len = 0;
    w->pending = 0;
}

int gen_out_tokens_open(gen_out *w) {
    char path[4200], head[96];
    snprintf(path, sizeof path, "%s/tokens.json%s", w->dir, w->part ? w->part : "");
    snprintf(head, sizeof head, GEN_OUT_TOKENS_HEAD, w->per_image);
    return cli_stream_open(&w->tokens, path, head, GEN_OUT_TOKENS_TAIL) == FLEXDIAG_OK
               ? 0
               : cli_fail_io(CMD);
}

int gen_out_tokens_close(gen_out *w) {
    int rc = 0;
    if (w->tokens.path && cli_stream_finish(&w->tokens) != FLEXDIAG_OK)
        rc = fail(1, "%s (it lists the %lld image(s) of results.jsonl)", cli_io_error(),
                  (long long)w->images_done);
    if (cli_jsonl_close(&w->results) != FLEXDIAG_OK) rc = cli_fail_io(CMD);
    return rc;
}

/* ---- records ---- */

/* Append n bytes at p to the text *t of *len bytes (grown); 0, or -1 when out of memory. */
static int text_add(char **t, size_t *len, const char *p, size_t n) {
    char *g = realloc(*t, *len + n + 1);
    if (!g) return -1;
    memcpy(g + *len, p, n);
    *len += n;
    g[*len] = 0;
    *t = g;
    return 0;
}

/* The tokens.json record of image g (t: its per_image ids), with the ",\n" that separates it
 * from an earlier one, malloc'ed (*len bytes); NULL when out of memory. */
static char *tokens_record(const gen_out *w, int64_t g, const int32_t *t, size_t *len) {
    long long per = w->per_prompt;
    json_t *js = json_string(w->ps->p[g / per].text); /* valid UTF-8: checked when read */
    char *ptext = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
    json_decref(js);
    /* per id at most 6 bytes of separator ("],\n  [") and 11 of digits */
    size_t cap = (ptext ? strlen(ptext) : 0) + 200 + (size_t)w->per_image * 18;
    char *r = ptext ? malloc(cap) : NULL;
    size_t n = 0;
    if (r)
        n = (size_t)snprintf(r, cap, "%s{\"prompt_index\": %lld, \"sample\": %lld, "
                                     "\"image_index\": %lld, \"prompt\": %s, \"grid\": [",
                             w->images_done + w->pending ? GEN_OUT_TOKENS_SEP : "",
                             (long long)g / per,
                             (long long)g % per, (long long)g, ptext);
    for (int32_t i = 0; r && i < w->per_image; i++)
        n += (size_t)snprintf(r + n, cap - n, "%s%d",
                              i % w->grid_w ? "," : (i ? "],\n  [" : "\n  ["), t[i]);
    if (r) n += (size_t)snprintf(r + n, cap - n, "]]}");
    free(ptext);
    *len = n;
    return r;
}

char *gen_out_text(const gen_out *w, const int32_t *ids, int32_t *n, size_t *len) {
    *n = 0;
    while (*n < w->per_image && ids[*n] != w->eos_id) (*n)++;
    if (flexdiag_detokenize(w->text_model, ids, *n, true, NULL, 0, len) != FLEXDIAG_OK)
        return NULL;
    char *text = malloc(*len + 1);
    if (text && flexdiag_detokenize(w->text_model, ids, *n, true, text, *len + 1, len) !=
                    FLEXDIAG_OK) {
        free(text);
        return NULL;
    }
    return text;
}

/* A text model's record: the generated ids before the first EOS, their text (special tokens
 * dropped) and why it stopped ("eos" or "length"); -1 when out of memory. */
static int text_fields(const gen_out *w, const int32_t *ids, json_t *r) {
    size_t len = 0;
    int32_t n = 0;
    char *text = gen_out_text(w, ids, &n, &len);
    json_t *arr = json_array();
    int ok = text && arr;
    for (int32_t k = 0; ok && k < n; k++)
        ok = json_array_append_new(arr, json_integer(ids[k])) == 0;
    ok = ok && json_object_set_new(r, "text", json_stringn(text, len)) == 0 &&
         json_object_set_new(r, "stop", json_string(n < w->per_image ? "eos" : "length")) == 0;
    if (!ok) json_decref(arr); /* set_new below takes arr whatever it returns */
    ok = ok && json_object_set_new(r, "ids", arr) == 0;
    free(text);
    return ok ? 0 : -1;
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
    if (r && w->text_model && text_fields(w, b->tokens + (size_t)i * (size_t)w->per_image, r)) {
        json_decref(r);
        return NULL;
    }
    if (!r || json_object_update(r, w->common) != 0 ||
        json_object_set_new(r, "tokens_fnv1a64", json_string(hash)) != 0 ||
        json_object_set_new(r, "block_s", json_real(b->seconds)) != 0 ||
        json_object_set_new(r, "images_in_block", json_integer(b->n)) != 0) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* Add image i of block b (its PNG at file, or NULL) to the pending records; -1 when out of
 * memory. */
static int queue_image(gen_out *w, const gen_block *b, int32_t i, const char *file) {
    size_t tl = 0;
    char *tok = tokens_record(w, b->first + i, b->tokens + (size_t)i * (size_t)w->per_image, &tl);
    json_t *rec = image_record(w, b, i, file);
    size_t rl = rec ? json_dumpb(rec, NULL, 0, JSON_FLAGS) : 0;
    char *line = rl ? malloc(rl + 1) : NULL;
    int ok = tok && line && json_dumpb(rec, line, rl, JSON_FLAGS) == rl;
    if (ok) line[rl] = '\n';
    ok = ok && text_add(&w->pend_tokens, &w->pend_tokens_len, tok, tl) == 0 &&
         text_add(&w->pend_results, &w->pend_results_len, line, rl + 1) == 0;
    free(tok);
    free(line);
    json_decref(rec);
    if (ok) w->pending++;
    return ok ? 0 : -1;
}

/* ---- commit ---- */

/* Write the pending images: their PNG (rel, pw x ph pixels; none when rgb is NULL), their
 * tokens.json records, their results.jsonl lines. On a failure, take back what was written for
 * them and stop. */
/* Write the pending images' tokens.json records and results.jsonl lines (their pngs PNG files
 * are in place); a failure takes back the tokens records. */
static flexdiag_status commit_records(gen_out *w, int64_t pngs) {
    flexdiag_status st = cli_stream_append(&w->tokens, w->pend_tokens, w->pend_tokens_len);
    if (st != FLEXDIAG_OK) return st;
    st = cli_jsonl_append(&w->results, w->pend_results, w->pend_results_len);
    if (st != FLEXDIAG_OK) {
        cli_stream_undo(&w->tokens);
        return st;
    }
    w->images_done += w->pending;
    w->pngs += pngs;
    w->pending = 0;
    w->pend_tokens_len = w->pend_results_len = 0;
    return FLEXDIAG_OK;
}

/* Forget the pending records (after a failure that takes their images back). */
static void drop_pending(gen_out *w) {
    w->pending = 0;
    w->pend_tokens_len = w->pend_results_len = 0;
}

/* Write the pending images: their PNG (rel, pw x ph pixels; none when rgb is NULL), their
 * tokens.json records, their results.jsonl lines. On a failure, take back what was written for
 * them and stop. */
static int commit(gen_out *w, const char *rel, const uint8_t *rgb, int pw, int ph) {
    char png[8400];
    if (rgb) snprintf(png, sizeof png, "%s/%s", w->dir, rel);
    flexdiag_status st = rgb ? flexdiag__png_write_rgb(png, rgb, pw, ph) : FLEXDIAG_OK;
    int png_made = rgb && st == FLEXDIAG_OK;
    if (st == FLEXDIAG_OK) st = commit_records(w, rgb != NULL);
    if (st == FLEXDIAG_OK) return 0;
    int left = png_made && unlink(png) != 0;
    return stop(w, left ? png : NULL, errno);
}

void gen_out_image_rel(const gen_out *w, int64_t g, char *rel, size_t cap) {
    long long per = w->per_prompt, p = g / per, k = g % per;
    if (w->layout == CLI_LAYOUT_GENEVAL) snprintf(rel, cap, "%05lld/samples/%04lld.png", p, k);
    else if (w->layout == CLI_LAYOUT_DPG) snprintf(rel, cap, "%s.png", w->ps->p[p].id);
    else snprintf(rel, cap, "%lld/%lld.png", p, k);
}

/* Folder of prompt p's samples (plain, geneval) and, with meta, GenEval's metadata.jsonl; a
 * failure's message is cli_io_error's. */
static flexdiag_status prompt_folder(const gen_out *w, int64_t p, int meta) {
    char dir[4200], path[4300];
    const char *fmt = w->layout == CLI_LAYOUT_GENEVAL ? "%s/%05lld/samples" : "%s/%lld";
    snprintf(dir, sizeof dir, fmt, w->dir, (long long)p);
    if (cli_mkdirs(dir))
        return cli_io_fail(FLEXDIAG_ERR_IO, "--out: cannot create folder '%s': %s", dir,
                           strerror(errno));
    if (w->layout != CLI_LAYOUT_GENEVAL || !meta) return FLEXDIAG_OK;
    snprintf(path, sizeof path, "%s/%05lld/metadata.jsonl", w->dir, (long long)p);
    const char *text = w->ps->p[p].meta;
    size_t n = strlen(text);
    char *line = malloc(n + 2);
    if (!line) return cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "%s: out of host memory", path);
    memcpy(line, text, n);
    line[n] = '\n';
    cli_part part = {line, n + 1};
    flexdiag_status st = cli_write_atomic(path, &part, 1);
    free(line);
    return st;
}

/* After prompt p's first image failed: remove its folder (geneval: with metadata.jsonl) when
 * nothing else is in it, as if the prompt had not started; a reused folder stays as it is. */
static void prompt_folder_undo(const gen_out *w, int64_t p) {
    char dir[4200], path[4300];
    if (w->layout == CLI_LAYOUT_GENEVAL) {
        snprintf(dir, sizeof dir, "%s/%05lld/samples", w->dir, (long long)p);
        if (rmdir(dir) != 0) return;
        snprintf(path, sizeof path, "%s/%05lld/metadata.jsonl", w->dir, (long long)p);
        (void)unlink(path);
        snprintf(dir, sizeof dir, "%s/%05lld", w->dir, (long long)p);
    } else {
        snprintf(dir, sizeof dir, "%s/%lld", w->dir, (long long)p);
    }
    (void)rmdir(dir);
}

/* DPG: the pending prompt's samples tiled into <id>.png, committed with their records. */
static int dpg_commit(gen_out *w, const char *rel) {
    int n = (int)w->per_prompt, cols = 1, gw = 0, gh = 0;
    while (cols * cols < n) cols++; /* ceil(sqrt n): 2x2 for 4 samples */
    size_t px = (size_t)w->img_h * (size_t)w->img_w * 3;
    const uint8_t **cells = malloc((size_t)n * sizeof *cells);
    if (!cells) return fail(1, "out of host memory");
    for (int k = 0; k < n; k++) cells[k] = w->dpg_cells + (size_t)k * px;
    uint8_t *grid = NULL;
    flexdiag_status st = flexdiag__png_tile(cells, n, w->img_w, w->img_h, cols, &grid, &gw, &gh);
    int rc = st == FLEXDIAG_OK ? commit(w, rel, grid, gw, gh) : cli_fail_io(CMD);
    free(grid);
    free(cells);
    return rc;
}

/* Image i of block b one at a time: DPG (its prompt's grid, committed with the prompt's last
 * sample) and images without pixels. */
static int emit_one(gen_out *w, const gen_block *b, int32_t i) {
    int64_t g = b->first + i, k = g % w->per_prompt;
    size_t px = (size_t)w->img_h * (size_t)w->img_w * 3;
    char rel[4200];
    if (b->rgb) gen_out_image_rel(w, g, rel, sizeof rel);
    if (queue_image(w, b, i, b->rgb ? rel : NULL)) return fail(1, "out of host memory");
    if (!b->rgb) return commit(w, NULL, NULL, 0, 0);
    memcpy(w->dpg_cells + (size_t)k * px, b->rgb + (size_t)i * px, px);
    return k == w->per_prompt - 1 ? dpg_commit(w, rel) : 0;
}

/* ---- a block's PNGs, written in parallel ---- */

typedef struct png_job {
    const gen_out *w;
    const gen_block *b;
    int32_t n;               /* images [0, n) of b */
    atomic_int next;         /* next image to take */
    atomic_int first_fail;   /* lowest image whose write failed (n: none); later ones are skipped */
    flexdiag_status *st;     /* (n) each image's write; FLEXDIAG_ERR_CANCELLED: skipped */
    char **msg;              /* (n) message of a failed write, malloc'ed */
} png_job;

static void png_path(const gen_out *w, int64_t g, char *path, size_t cap) {
    char rel[4200];
    gen_out_image_rel(w, g, rel, sizeof rel);
    snprintf(path, cap, "%s/%s", w->dir, rel);
}

static void *png_worker(void *arg) {
    png_job *j = arg;
    size_t px = (size_t)j->w->img_h * (size_t)j->w->img_w * 3;
    for (int32_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        if (i > atomic_load(&j->first_fail)) {
            j->st[i] = FLEXDIAG_ERR_CANCELLED;
            continue;
        }
        char path[8400];
        png_path(j->w, j->b->first + i, path, sizeof path);
        j->st[i] = flexdiag__png_write_rgb(path, j->b->rgb + (size_t)i * px, j->w->img_w,
                                           j->w->img_h);
        if (j->st[i] == FLEXDIAG_OK) continue;
        j->msg[i] = strdup(cli_io_error());
        int f = atomic_load(&j->first_fail);
        while (i < f && !atomic_compare_exchange_weak(&j->first_fail, &f, i)) {}
    }
    return NULL;
}

/* Run the job on up to threads threads, this one among them. */
static void write_pngs(png_job *j, int threads) {
    enum { MAX_THREADS = 64 };
    pthread_t t[MAX_THREADS];
    int want = threads < j->n ? threads : j->n, made = 0;
    if (want > MAX_THREADS) want = MAX_THREADS;
    for (int k = 1; k < want; k++) made += pthread_create(&t[made], NULL, png_worker, j) == 0;
    png_worker(j);
    for (int k = 0; k < made; k++) pthread_join(t[k], NULL);
}

/* Remove the PNGs of images [i0, i1) that the job wrote; the first that cannot be removed is
 * kept in left (errno *e). */
static void unlink_pngs(const png_job *j, int32_t i0, int32_t i1, char *left, size_t cap, int *e) {
    for (int32_t i = i0; i < i1; i++) {
        char path[8400];
        if (j->st[i] != FLEXDIAG_OK) continue;
        png_path(j->w, j->b->first + i, path, sizeof path);
        if (unlink(path) == 0 || left[0]) continue;
        *e = errno;
        snprintf(left, cap, "%s", path);
    }
}

/* Remove the folders of the prompts whose first image is among images [i0, i1) of b and that
 * hold nothing else. */
static void undo_folders(const gen_out *w, const gen_block *b, int32_t i0, int32_t i1) {
    for (int32_t i = i0; i < i1; i++)
        if ((b->first + i) % w->per_prompt == 0) prompt_folder_undo(w, (b->first + i) / w->per_prompt);
}

/* Make the prompt folders of b's images in order: the images [0, returned) have theirs; at a
 * failure the message is cli_io_error's. */
static int32_t make_folders(const gen_out *w, const gen_block *b) {
    for (int32_t i = 0; i < b->n; i++) {
        int64_t g = b->first + i, k = g % w->per_prompt;
        /* a block that starts inside a prompt (another rank's, or resumed) makes its folder too */
        if ((k == 0 || i == 0) && prompt_folder(w, g / w->per_prompt, k == 0) != FLEXDIAG_OK)
            return i;
    }
    return b->n;
}

/* Queue and commit the records of images [0, e) of b, whose PNGs are written; a failure takes
 * the PNGs back (left, *err as unlink_pngs). */
static flexdiag_status commit_written(gen_out *w, const png_job *j, int32_t e, char *left,
                                      size_t cap, int *err) {
    flexdiag_status st = FLEXDIAG_OK;
    for (int32_t i = 0; st == FLEXDIAG_OK && i < e; i++) {
        char rel[4200];
        gen_out_image_rel(w, j->b->first + i, rel, sizeof rel);
        if (queue_image(w, j->b, i, rel)) st = cli_io_fail(FLEXDIAG_ERR_OOM_HOST, "out of host memory");
    }
    if (st == FLEXDIAG_OK) st = commit_records(w, e);
    if (st == FLEXDIAG_OK) return st;
    drop_pending(w);
    unlink_pngs(j, 0, e, left, cap, err);
    return st;
}

/* The block's PNGs on threads threads, then the records of the images before the first failure
 * (folder or PNG) in one commit; what the failure leaves is taken back. */
static int emit_pngs(gen_out *w, const gen_block *b, int threads) {
    png_job j = {.w = w, .b = b};
    int32_t made = make_folders(w, b);
    j.n = made;
    char *why = made < b->n ? strdup(cli_io_error()) : NULL, left[8400] = "";
    atomic_init(&j.next, 0);
    atomic_init(&j.first_fail, j.n);
    j.st = calloc((size_t)b->n + 1, sizeof *j.st);
    j.msg = calloc((size_t)b->n + 1, sizeof *j.msg);
    int e = 0, rc = 0;
    if (!j.st || !j.msg) {
        free(why);
        why = strdup("out of host memory");
        j.n = 0;
    }
    write_pngs(&j, threads);
    int32_t ok = 0;
    while (ok < j.n && j.st[ok] == FLEXDIAG_OK) ok++;
    if (ok < j.n) {
        free(why);
        why = j.msg[ok] ? strdup(j.msg[ok]) : NULL;
        unlink_pngs(&j, ok + 1, j.n, left, sizeof left, &e);
    }
    int32_t failed_at = ok; /* the first image not committed */
    if (ok && commit_written(w, &j, ok, left, sizeof left, &e) != FLEXDIAG_OK) {
        failed_at = 0;
        rc = 1;
    } else if (ok < b->n) {
        (void)cli_io_fail(FLEXDIAG_ERR_IO, "%s", why ? why : "out of host memory");
        rc = 1;
    }
    if (rc) {
        undo_folders(w, b, failed_at, made < b->n ? made + 1 : b->n);
        rc = stop(w, left[0] ? left : NULL, e);
    }
    for (int32_t i = 0; j.msg && i < j.n; i++) free(j.msg[i]);
    free(j.msg);
    free(j.st);
    free(why);
    return rc;
}

int gen_out_emit_block(gen_out *w, const gen_block *b, int threads) {
    if (b->rgb && w->layout != CLI_LAYOUT_DPG) return emit_pngs(w, b, threads);
    int rc = 0;
    for (int32_t i = 0; !rc && i < b->n; i++) rc = emit_one(w, b, i);
    return rc;
}
