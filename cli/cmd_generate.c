/*
 * cmd_generate.c - `flexdiag generate`: prompts in; PNGs, results.jsonl and tokens.json out.
 *
 * Runs through the public API only (runtime -> model -> context -> flexdiag_generate), so the
 * CLI exercises what embedders get. Without --model the builtin tiny-janus model (seeded random
 * weights, noise images) runs anywhere. Image i of the job is sample i % N of prompt i / N.
 * Images are generated block by block: one flexdiag_generate call per --batch images with
 * first_image = the block's first index; sampling is keyed by (seed, image index, step), so
 * the images do not depend on --batch. After each block: decode (flexdiag_decode_images, a few
 * images at a time), convert to uint8, write each PNG atomically (temp + rename), then append
 * its results.jsonl line (one fwrite of the whole line + fflush) and its tokens.json record.
 * tokens.json grows in "tokens.json.tmp.<pid>" and is renamed at the end, after an interrupt
 * too: memory stays O(block) and the file is never seen half-written (rejected: keeping every
 * token until the end, GBs for large prompt sets). Layouts: plain <out>/<prompt>/<sample>.png;
 * geneval <out>/<index:05d>/{metadata.jsonl, samples/<k:04d>.png}; dpg <out>/<id>.png holding
 * the N samples tiled in ceil(sqrt N) columns (2x2 for N = 4, as DPG-Bench's scorer splits it).
 * SIGINT/SIGTERM set a flag and cancel the context (an atomic store: async-signal-safe); the
 * block in flight is dropped, completed files stay, exit code 128 + signal (130 for SIGINT).
 * block_s in results.jsonl is the wall time of the block's generate + decode calls.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/fileio.h"
#include "cli/image_out.h"

#define CMD "generate"
#define DEFAULT_PROMPT "a red apple on a wooden table"
#define DECODE_CHUNK 4            /* images per decode call: bounds the float pixel scratch */
#define PROMPT_FILE_MAX (1 << 20) /* bytes of one DPG <id>.txt; prompts are a few hundred */
#define JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

typedef enum gen_layout { LAYOUT_PLAIN, LAYOUT_GENEVAL, LAYOUT_DPG, LAYOUT_COUNT } gen_layout;
static const char *const layout_names[LAYOUT_COUNT] = {"plain", "geneval", "dpg"};

typedef struct gen_opts {
    cli_model_opts mo;
    cli_policy_opts po;
    const char *prompt, *prompts_file, *out, *layout_name, *batch;
    gen_layout layout;
    int64_t per_prompt, micro_batch, max_prompt_len, top_k, sample_seed;
    double cfg, temperature, top_p;
    int quiet;
} gen_opts;

typedef struct prompt {
    char *text; /* UTF-8 prompt */
    char *meta; /* geneval: its evaluation_metadata.jsonl line, verbatim; else NULL */
    char *id;   /* dpg: prompt id = output file stem; else NULL */
} prompt;

typedef struct prompt_set {
    prompt *p;        /* n prompts, owned */
    int n, cap;       /* count and capacity */
    const char *path; /* --prompts, for messages */
} prompt_set;

/* Everything a run writes; images are emitted in order, so one DPG prompt is pending at most. */
typedef struct gen_out {
    const gen_opts *o;
    const prompt_set *ps;
    FILE *results;        /* <out>/results.jsonl */
    FILE *tokens;         /* <out>/tokens.json.tmp.<pid> until the end */
    char *tokens_tmp;     /* its path (NULL when closed) */
    int32_t per_image;    /* tokens per image */
    int32_t grid_w;       /* ids per row in tokens.json */
    int32_t img_h, img_w; /* decoded image size; 0 = no image decoder */
    json_t *common;       /* record fields shared by all images (model, policy, sampling) */
    uint8_t *dpg_cells;   /* dpg: per_prompt RGB images of the pending prompt */
    json_t *dpg_records;  /* dpg: records of the pending prompt, written with its grid */
    int64_t images_done;  /* images with all outputs written */
    int64_t pngs;         /* PNG files written */
} gen_out;

typedef struct gen_block {
    int64_t first;         /* job index of the block's first image */
    int32_t n;             /* images in the block */
    const int32_t *tokens; /* (n, per_image) ids */
    const uint8_t *rgb;    /* (n, H, W, 3) pixels, NULL without a decoder */
    double seconds;        /* wall time of generate + decode */
} gen_block;

__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "flexdiag " CMD ": ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return rc;
}

/* ---- signals ---- */

static volatile sig_atomic_t g_signal;    /* signal that asked the run to stop; 0 = none */
static _Atomic(flexdiag_context *) g_ctx; /* context the handler cancels; NULL = none */
static atomic_int g_in_handler;           /* handlers running now: teardown waits for 0 */

/* Async-signal-safe: a flag, an atomic load and flexdiag_context_cancel (an atomic store). */
static void on_signal(int sig) {
    atomic_fetch_add(&g_in_handler, 1);
    g_signal = sig;
    flexdiag_context *c = atomic_load(&g_ctx);
    if (c) flexdiag_context_cancel(c);
    atomic_fetch_sub(&g_in_handler, 1);
}

static void signals_install(struct sigaction old[2]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    g_signal = 0;
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
}

/* Stop cancelling c; returns once no handler (on any thread) can still be using it. */
static void signals_forget_context(void) {
    atomic_store(&g_ctx, NULL);
    while (atomic_load(&g_in_handler)) sched_yield();
}

static void signals_restore(const struct sigaction old[2]) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
}

/* ---- prompts ---- */

static void prompts_free(prompt_set *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->p[i].text);
        free(s->p[i].meta);
        free(s->p[i].id);
    }
    free(s->p);
    memset(s, 0, sizeof *s);
}

/* Append a prompt; takes ownership of the strings (freed on failure). */
static int prompts_add(prompt_set *s, char *text, char *meta, char *id) {
    if (text && s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        prompt *p = cap > s->cap ? realloc(s->p, (size_t)cap * sizeof *p) : NULL;
        if (p) s->p = p, s->cap = cap;
    }
    if (!text || s->n == s->cap) {
        free(text);
        free(meta);
        free(id);
        return fail(1, "out of host memory reading the prompts");
    }
    s->p[s->n++] = (prompt){text, meta, id};
    return 0;
}

static int utf8_ok(const char *s) {
    json_t *j = json_string(s); /* NULL for invalid UTF-8 */
    json_decref(j);
    return j != NULL;
}

static int is_blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return 0;
    return 1;
}

/* Strip surrounding whitespace in place. */
static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = 0;
    return s;
}

typedef int (*line_fn)(prompt_set *s, char *line, long no);

/* fn(line) for every non-blank line of s->path, newline stripped; stops at a nonzero return. */
static int each_line(prompt_set *s, line_fn fn) {
    FILE *f = fopen(s->path, "r");
    if (!f) return fail(2, "--prompts: cannot open '%s': %s", s->path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long no = 0;
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        no++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!is_blank(line)) rc = fn(s, line, no);
    }
    if (!rc && ferror(f)) rc = fail(2, "--prompts %s: read error", s->path);
    free(line);
    fclose(f);
    return rc;
}

static int plain_line(prompt_set *s, char *line, long no) {
    if (!utf8_ok(line)) return fail(2, "--prompts %s: line %ld is not valid UTF-8", s->path, no);
    return prompts_add(s, strdup(line), NULL, NULL);
}

/* GenEval evaluation_metadata.jsonl: one object per line with a string "prompt". */
static int geneval_line(prompt_set *s, char *line, long no) {
    json_error_t e;
    json_t *j = json_loads(line, 0, &e);
    if (!j)
        return fail(2, "--prompts %s: line %ld: not valid JSON (%s at column %d); expected one "
                       "GenEval metadata object per line", s->path, no, e.text, e.column);
    json_t *p = json_object_get(j, "prompt");
    int rc = 0;
    if (!json_is_object(j) || !json_is_string(p) || is_blank(json_string_value(p)))
        rc = fail(2, "--prompts %s: line %ld: expected a JSON object with a non-empty string "
                     "\"prompt\"", s->path, no);
    if (!rc) rc = prompts_add(s, strdup(json_string_value(p)), strdup(line), NULL);
    json_decref(j);
    return rc;
}

/* A DPG id names the output file <id>.png, so it must be a plain file name. */
static int dpg_id_ok(const char *id) {
    return *id && strlen(id) < 250 && !strchr(id, '/') && strcmp(id, ".") && strcmp(id, "..");
}

static int dpg_add(prompt_set *s, const char *id, char *text, const char *where) {
    text = trim(text);
    if (!dpg_id_ok(id))
        return fail(2, "--prompts %s: id '%s' cannot name a file (empty, '/', '.' or '..')",
                    where, id);
    if (!*text || !utf8_ok(text))
        return fail(2, "--prompts %s: the prompt is empty or not valid UTF-8", where);
    return prompts_add(s, strdup(text), NULL, strdup(id));
}

/* "<id>\t<prompt>" lines. */
static int dpg_line(prompt_set *s, char *line, long no) {
    char where[4200];
    snprintf(where, sizeof where, "%s line %ld", s->path, no);
    char *tab = strchr(line, '\t');
    if (!tab) return fail(2, "--prompts %s: expected '<id><TAB><prompt>'", where);
    *tab = 0;
    return dpg_add(s, trim(line), tab + 1, where);
}

/* Whole small text file, NUL-terminated; NULL after a message. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf = f ? malloc(PROMPT_FILE_MAX + 1) : NULL;
    size_t n = buf ? fread(buf, 1, PROMPT_FILE_MAX + 1, f) : 0;
    int bad = !buf || ferror(f) || n > PROMPT_FILE_MAX;
    if (f) fclose(f);
    if (bad) {
        fail(2, "--prompts: cannot read '%s' (%s)", path,
             n > PROMPT_FILE_MAX ? "larger than 1 MiB" : strerror(errno));
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* DPG-Bench's prompts folder: one <id>.txt per prompt, taken in name order. */
static int dpg_folder(prompt_set *s) {
    DIR *d = opendir(s->path);
    if (!d) return fail(2, "--prompts: cannot open folder '%s': %s", s->path, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len <= 4 || strcmp(e->d_name + len - 4, ".txt") || e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) rc = fail(1, "out of host memory listing '%s'", s->path);
            else names = nn;
        }
        if (!rc && !(names[n++] = strdup(e->d_name))) rc = fail(1, "out of host memory");
    }
    closedir(d);
    if (!rc && n > 1) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; !rc && i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", s->path, names[i]);
        char *text = read_text(path);
        names[i][strlen(names[i]) - 4] = 0; /* the id */
        rc = text ? dpg_add(s, names[i], text, path) : 2;
        free(text);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!rc && n == 0) rc = fail(2, "--prompts %s: no <id>.txt prompt files here", s->path);
    return rc;
}

/* Two prompts with one id would write the same <id>.png. */
static int dpg_unique(const prompt_set *s) {
    char **ids = malloc((size_t)s->n * sizeof *ids);
    if (!ids) return fail(1, "out of host memory");
    for (int i = 0; i < s->n; i++) ids[i] = s->p[i].id;
    qsort(ids, (size_t)s->n, sizeof *ids, cmp_str);
    int rc = 0;
    for (int i = 1; !rc && i < s->n; i++)
        if (!strcmp(ids[i - 1], ids[i]))
            rc = fail(2, "--prompts %s: id '%s' appears twice", s->path, ids[i]);
    free(ids);
    return rc;
}

static int load_prompts(const gen_opts *o, prompt_set *s) {
    s->path = o->prompts_file;
    int rc = 0;
    struct stat st;
    if (o->layout == LAYOUT_GENEVAL) rc = each_line(s, geneval_line);
    else if (o->layout == LAYOUT_DPG && stat(s->path, &st) == 0 && S_ISDIR(st.st_mode))
        rc = dpg_folder(s);
    else if (o->layout == LAYOUT_DPG) rc = each_line(s, dpg_line);
    else if (o->prompts_file) rc = each_line(s, plain_line);
    else if (!utf8_ok(o->prompt ? o->prompt : DEFAULT_PROMPT))
        rc = fail(2, "--prompt: not valid UTF-8");
    else rc = prompts_add(s, strdup(o->prompt ? o->prompt : DEFAULT_PROMPT), NULL, NULL);
    if (!rc && s->n == 0) rc = fail(2, "--prompts: '%s' holds no prompt", s->path);
    if (!rc && o->layout == LAYOUT_DPG) rc = dpg_unique(s);
    return rc;
}

/* ---- output files ---- */

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
    return ok ? 0 : fail(1, "--out %s: cannot append to results.jsonl: %s", w->o->out,
                         strerror(errno));
}

/* The tokens.json record of image g (appended to the temp file). */
static int tokens_append(gen_out *w, int64_t g, const int32_t *t) {
    int per = (int)w->o->per_prompt;
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

static int tokens_open(gen_out *w) {
    if (asprintf(&w->tokens_tmp, "%s/tokens.json.tmp.%ld", w->o->out, (long)getpid()) < 0) {
        w->tokens_tmp = NULL;
        return fail(1, "out of host memory");
    }
    w->tokens = fopen(w->tokens_tmp, "w");
    if (!w->tokens) {
        int rc = fail(1, "--out %s: cannot create '%s': %s", w->o->out, w->tokens_tmp,
                      strerror(errno));
        free(w->tokens_tmp);
        w->tokens_tmp = NULL;
        return rc;
    }
    fprintf(w->tokens, "{\"tokens_per_image\": %d, \"images\": [\n", w->per_image);
    return 0;
}

/* Complete tokens.json with the images written so far and rename it into place. */
static int tokens_close(gen_out *w) {
    if (!w->tokens) return 0;
    fprintf(w->tokens, "\n]}\n");
    int ok = !ferror(w->tokens) && fflush(w->tokens) == 0 && fsync(fileno(w->tokens)) == 0;
    int err = errno;
    if (fclose(w->tokens) != 0 && ok) ok = 0, err = errno;
    w->tokens = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokens.json", w->o->out);
    if (ok && rename(w->tokens_tmp, path) != 0) ok = 0, err = errno;
    if (!ok) unlink(w->tokens_tmp);
    free(w->tokens_tmp);
    w->tokens_tmp = NULL;
    return ok ? 0 : fail(1, "cannot write '%s': %s", path, strerror(err));
}

/* Path of image g's PNG relative to --out (dpg: its prompt's grid). */
static void image_rel(const gen_out *w, int64_t g, char *rel, size_t cap) {
    long long per = w->o->per_prompt, p = g / per, k = g % per;
    if (w->o->layout == LAYOUT_GENEVAL) snprintf(rel, cap, "%05lld/samples/%04lld.png", p, k);
    else if (w->o->layout == LAYOUT_DPG) snprintf(rel, cap, "%s.png", w->ps->p[p].id);
    else snprintf(rel, cap, "%lld/%lld.png", p, k);
}

/* Folder of prompt p's samples (plain, geneval) and GenEval's metadata.jsonl. */
static int prompt_folder(const gen_out *w, int64_t p) {
    char dir[4200], path[4300];
    const char *fmt = w->o->layout == LAYOUT_GENEVAL ? "%s/%05lld/samples" : "%s/%lld";
    snprintf(dir, sizeof dir, fmt, w->o->out, (long long)p);
    if (cli_mkdirs(dir))
        return fail(1, "--out: cannot create folder '%s': %s", dir, strerror(errno));
    if (w->o->layout != LAYOUT_GENEVAL) return 0;
    snprintf(path, sizeof path, "%s/%05lld/metadata.jsonl", w->o->out, (long long)p);
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
    snprintf(path, sizeof path, "%s/%s", w->o->out, rel);
    return flexdiag__png_write_rgb(path, rgb, pw, ph) == FLEXDIAG_OK ? 0 : cli_fail_io(CMD);
}

/* results.jsonl record of image i of block b; NULL when out of memory. */
static json_t *image_record(const gen_out *w, const gen_block *b, int32_t i, const char *file) {
    int64_t g = b->first + i, per = w->o->per_prompt;
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
    int n = (int)w->o->per_prompt, cols = 1, gw = 0, gh = 0;
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

/* All outputs of image i of block b, in order: tokens record, PNG, results line. */
static int emit_image(gen_out *w, const gen_block *b, int32_t i) {
    int64_t g = b->first + i, per = w->o->per_prompt, k = g % per;
    size_t px = (size_t)w->img_h * (size_t)w->img_w * 3;
    int rc = tokens_append(w, g, b->tokens + (size_t)i * (size_t)w->per_image);
    char rel[4200];
    if (b->rgb) image_rel(w, g, rel, sizeof rel);
    int dpg = b->rgb && w->o->layout == LAYOUT_DPG;
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

/* ---- generation ---- */

typedef struct progress_state {
    double t0, last; /* start and last print (seconds) */
    uint64_t rows;   /* sequences per step (CFG rows counted) */
    int quiet;
} progress_state;

/* Per decode step: a rate line at most once a second; false (cancel) once a signal came, which
 * also covers a signal that landed before flexdiag_generate reset the cancel flag. */
static bool on_progress(int phase, uint64_t done, uint64_t total, void *user) {
    progress_state *p = user;
    if (g_signal) return false;
    double now = cli_now();
    if (p->quiet || phase != 1 || (now - p->last < 1.0 && done != total)) return true;
    p->last = now;
    fprintf(stderr, "step %llu/%llu  %.1f tok/s\n", (unsigned long long)done,
            (unsigned long long)total, (double)(done * p->rows) / (now - p->t0));
    return true;
}

typedef struct gen_run {
    gen_out w;
    flexdiag_model *m;
    flexdiag_context *c;
    flexdiag_request rq;   /* sampling fields fixed; prompts/first_image set per block */
    const char **texts;    /* (batch) prompt of each image of the block */
    int32_t *tokens;       /* (batch, per_image) ids of the block */
    float *pix;            /* (DECODE_CHUNK, H, W, 3) decoder output */
    uint8_t *rgb;          /* (batch, H, W, 3) pixels of the block */
    int64_t total;         /* images in the job */
    int32_t batch;         /* images per block */
    flexdiag_stats sum;    /* counters summed over blocks */
    progress_state prog;
} gen_run;

static int decode_block(gen_run *r, int32_t n) {
    size_t px = (size_t)r->w.img_h * (size_t)r->w.img_w * 3;
    for (int32_t i0 = 0; i0 < n; i0 += DECODE_CHUNK) {
        int32_t m = n - i0 < DECODE_CHUNK ? n - i0 : DECODE_CHUNK;
        flexdiag_status st = flexdiag_decode_images(
            r->m, r->tokens + (size_t)i0 * (size_t)r->w.per_image, m, r->pix);
        if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
        flexdiag__pixels_to_u8(r->pix, (int64_t)((size_t)m * px), r->rgb + (size_t)i0 * px);
    }
    return 0;
}

/* Generate, decode and write images [first, first + n): 0, 1 after a message, -1 when a
 * signal cancelled the block (nothing of it is written). */
static int run_block(gen_run *r, int64_t first, int32_t n) {
    int64_t per = r->w.o->per_prompt;
    for (int32_t i = 0; i < n; i++) r->texts[i] = r->w.ps->p[(first + i) / per].text;
    r->rq.n_prompts = n;
    r->rq.first_image = first;
    r->prog.rows = (uint64_t)n * 2;
    flexdiag_output out = {.tokens = r->tokens};
    double t0 = cli_now();
    r->prog.t0 = r->prog.last = t0;
    flexdiag_status st = flexdiag_generate(r->c, &r->rq, &out);
    if (st == FLEXDIAG_ERR_CANCELLED && g_signal) return -1;
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    flexdiag_stats s;
    flexdiag_context_stats(r->c, &s);
    r->sum.prefill_s += s.prefill_s;
    r->sum.decode_s += s.decode_s;
    r->sum.tokens_generated += s.tokens_generated;
    r->sum.kv_bytes_per_seq = s.kv_bytes_per_seq;
    r->sum.peak_device_bytes = s.peak_device_bytes;
    int rc = r->w.img_h ? decode_block(r, n) : 0;
    gen_block b = {.first = first, .n = n, .tokens = r->tokens,
                   .rgb = r->w.img_h ? r->rgb : NULL, .seconds = cli_now() - t0};
    for (int32_t i = 0; !rc && i < n; i++) rc = emit_image(&r->w, &b, i);
    return rc;
}

static int run_blocks(gen_run *r) {
    for (int64_t first = 0; first < r->total; first += r->batch) {
        if (g_signal) return -1;
        int32_t n = (int32_t)(r->total - first < r->batch ? r->total - first : r->batch);
        double t0 = cli_now();
        int rc = run_block(r, first, n);
        if (rc) return rc;
        if (!r->w.o->quiet)
            fprintf(stderr, "[%lld/%lld images] block of %d in %.2f s\n",
                    (long long)(first + n), (long long)r->total, n, cli_now() - t0);
    }
    return 0;
}

/* Fields every results.jsonl record shares: model, policy (as c's runs resolve it), sampling. */
static int common_fields(gen_out *w, const flexdiag_context *c) {
    flexdiag_policy_info pi = {.struct_size = sizeof pi};
    flexdiag_status st = flexdiag_context_policy(c, &pi);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    const gen_opts *o = w->o;
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    const char *model = o->mo.model ? o->mo.model : (o->mo.arch ? o->mo.arch : mp.arch);
    w->common = json_pack("{s:I, s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:I, s:f}",
                          "seed", (json_int_t)o->sample_seed, "model", model,
                          "policy", flexdiag_policy_name(pi.kind), "n_att", (int)pi.n_att,
                          "n_r", (int)pi.n_r, "sparsity", pi.sparsity,
                          "cfg_weight", o->cfg, "temperature", o->temperature,
                          "top_k", (json_int_t)o->top_k, "top_p", o->top_p);
    w->dpg_records = json_array();
    return w->common && w->dpg_records ? 0 : fail(1, "out of host memory");
}

/* Context params of the job (max_images = the block size r->batch). */
static void context_params(const gen_run *r, const flexdiag_policy_params *pp,
                           flexdiag_context_params *cp) {
    flexdiag_context_params_init(cp);
    cp->policy = *pp;
    cp->max_images = r->batch;
    cp->micro_batch = (int32_t)r->w.o->micro_batch;
    cp->max_prompt_len = (int32_t)r->w.o->max_prompt_len;
}

/* Images per block: --batch N, or auto (the largest context that fits the budget), at most
 * the job's image count. */
static int pick_batch(gen_run *r, const flexdiag_policy_params *pp) {
    flexdiag_context_params cp;
    context_params(r, pp, &cp);
    int32_t b = cli_batch(CMD, r->w.o->batch, r->m, &cp);
    if (b < 1) return 2;
    r->batch = (int32_t)(b < r->total ? b : r->total);
    if (!strcmp(r->w.o->batch, "auto") && !r->w.o->quiet)
        fprintf(stderr, "flexdiag " CMD ": --batch auto: %d image(s) fit the budget; blocks of %d\n",
                b, r->batch);
    return 0;
}

/* Context, request template, buffers and the tokens.json temp file. */
static int prepare(gen_run *r, const flexdiag_policy_params *pp) {
    const gen_opts *o = r->w.o;
    flexdiag_context_params cp;
    context_params(r, pp, &cp);
    cp.progress = on_progress;
    cp.progress_user = &r->prog;
    flexdiag_status st = flexdiag_context_create(r->m, &cp, &r->c);
    if (st != FLEXDIAG_OK) return cli_fail(CMD, st);
    atomic_store(&g_ctx, r->c);
    flexdiag_request_init(&r->rq);
    r->rq.n_prompts = 1;
    r->rq.prompts = r->texts;
    r->rq.images_per_prompt = 1;
    r->rq.cfg_weight = (float)o->cfg;
    r->rq.temperature = (float)o->temperature;
    r->rq.top_k = (int32_t)o->top_k;
    r->rq.top_p = (float)o->top_p;
    r->rq.seed = (uint64_t)o->sample_seed;
    flexdiag_output q = {0};
    if ((st = flexdiag_generate(r->c, &r->rq, &q)) != FLEXDIAG_OK) return cli_fail(CMD, st);
    r->w.per_image = q.tokens_per_image;
    r->w.grid_w = 1;
    while ((r->w.grid_w + 1) * (r->w.grid_w + 1) <= q.tokens_per_image) r->w.grid_w++;
    if (r->w.grid_w * r->w.grid_w != q.tokens_per_image) r->w.grid_w = q.tokens_per_image;
    if ((st = flexdiag_model_image_size(r->m, &r->w.img_h, &r->w.img_w)) != FLEXDIAG_OK)
        return cli_fail(CMD, st);
    if (!r->w.img_h)
        fprintf(stderr, "flexdiag " CMD ": note: the model has no image decoder; writing "
                        "tokens.json and results.jsonl only\n");
    size_t px = (size_t)r->w.img_h * (size_t)r->w.img_w * 3, b = (size_t)r->batch;
    r->tokens = malloc(b * (size_t)r->w.per_image * sizeof *r->tokens);
    r->pix = malloc((px ? DECODE_CHUNK * px : 1) * sizeof *r->pix);
    r->rgb = malloc(px ? b * px : 1);
    r->w.dpg_cells = malloc(px ? (size_t)o->per_prompt * px : 1);
    if (!r->tokens || !r->pix || !r->rgb || !r->w.dpg_cells)
        return fail(1, "no host memory for a block of %d images (lower --batch)", r->batch);
    int rc = common_fields(&r->w, r->c);
    return rc ? rc : tokens_open(&r->w);
}

static void summary(const gen_run *r) {
    const flexdiag_stats *s = &r->sum;
    double total = s->prefill_s + s->decode_s;
    fprintf(stderr,
            "generated %lld image(s) x %d tokens in %.2f s (prefill %.2f s, decode %.2f s): "
            "%.1f tok/s, %.3f img/s; KV %.2f MiB/sequence (policy %s); peak device %.2f GiB; "
            "%lld PNG(s), results.jsonl and tokens.json in %s\n",
            (long long)r->w.images_done, r->w.per_image, total, s->prefill_s, s->decode_s,
            total > 0 ? (double)s->tokens_generated / total : 0.0,
            total > 0 ? (double)r->w.images_done / total : 0.0,
            (double)s->kv_bytes_per_seq / (1 << 20),
            json_string_value(json_object_get(r->w.common, "policy")),
            (double)s->peak_device_bytes / (1 << 30), (long long)r->w.pngs, r->w.o->out);
}

/* The job, with SIGINT/SIGTERM caught from context creation to the final files. */
static int generate_job(gen_run *r, const flexdiag_policy_params *pp) {
    struct sigaction old[2];
    signals_install(old);
    r->texts = calloc((size_t)r->batch, sizeof *r->texts);
    r->prog.quiet = r->w.o->quiet;
    int rc = r->texts ? prepare(r, pp) : fail(1, "out of host memory");
    if (!rc) rc = run_blocks(r);
    signals_forget_context();
    flexdiag_context_destroy(r->c);
    r->c = NULL;
    int rc2 = tokens_close(&r->w);
    if (rc == -1) {
        fprintf(stderr, "flexdiag " CMD ": interrupted after %lld image(s); completed outputs "
                        "are in %s\n", (long long)r->w.images_done, r->w.o->out);
        rc = 128 + (int)g_signal;
    } else if (!rc && !rc2) {
        summary(r);
    }
    signals_restore(old);
    return rc ? rc : rc2;
}

/* ---- flags ---- */

static int check_opts(gen_opts *o) {
    if (!o->out) return fail(2, "--out DIR is required");
    o->layout = LAYOUT_COUNT;
    for (int i = 0; i < LAYOUT_COUNT; i++)
        if (!strcmp(o->layout_name, layout_names[i])) o->layout = (gen_layout)i;
    if (o->layout == LAYOUT_COUNT)
        return fail(2, "--layout: unknown layout '%s' (valid: plain, geneval, dpg)",
                    o->layout_name);
    if (o->prompt && o->prompts_file) return fail(2, "give --prompt or --prompts, not both");
    if (o->layout != LAYOUT_PLAIN && !o->prompts_file)
        return fail(2, "--layout %s reads its prompts from --prompts (%s)", o->layout_name,
                    o->layout == LAYOUT_GENEVAL ? "GenEval's evaluation_metadata.jsonl"
                                                : "a folder of <id>.txt, or <id><TAB><prompt>");
    if (strcmp(o->batch, "auto") && cli_batch(CMD, o->batch, NULL, NULL) < 1) return 2;
    if (o->per_prompt < 1 || o->per_prompt > 65536 || o->micro_batch < 0 ||
        o->micro_batch > INT32_MAX || o->max_prompt_len < 2 || o->max_prompt_len > INT32_MAX)
        return fail(2, "--images-per-prompt must be 1..65536, --micro-batch >= 0, "
                       "--max-prompt-len >= 2");
    if (o->top_k < 0 || o->top_k > INT32_MAX) return fail(2, "--top-k must be >= 0");
    return 0;
}

/* Create --out and results.jsonl before the model loads, so a bad folder fails fast. */
static int open_out(gen_out *w) {
    if (cli_mkdirs(w->o->out))
        return fail(1, "--out: cannot create folder '%s': %s", w->o->out, strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/results.jsonl", w->o->out);
    w->results = fopen(path, "w");
    if (!w->results) return fail(1, "--out: cannot write '%s': %s", path, strerror(errno));
    return 0;
}

int flexdiag_cmd_generate(int argc, char **argv) {
    gen_opts o = {.mo.seed = 1, .per_prompt = 4, .batch = "16", .max_prompt_len = 128,
                  .cfg = 5.0, .temperature = 1.0, .top_p = 1.0, .layout_name = "plain"};
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&o.mo),
        CLI_POLICY_FLAGS(&o.po),
        {"--prompt", CLI_STR, &o.prompt, "prompt text (default: \"" DEFAULT_PROMPT "\")"},
        {"--prompts", CLI_STR, &o.prompts_file, "prompt file (one per line; see --layout)"},
        {"--images-per-prompt", CLI_INT, &o.per_prompt, "images per prompt (default 4)"},
        {"--out", CLI_STR, &o.out, "output folder (created if missing)"},
        {"--layout", CLI_STR, &o.layout_name,
         "plain (<prompt>/<sample>.png, default) | geneval (--prompts evaluation_metadata.jsonl)"
         " | dpg (--prompts folder of <id>.txt or <id>\\t<prompt> lines; <id>.png grids)"},
        {"--batch", CLI_STR, &o.batch,
         "images generated together (default 16), or 'auto': the most that fit --gpu-mem"},
        {"--micro-batch", CLI_INT, &o.micro_batch, "images per micro-batch (default: batch)"},
        {"--max-prompt-len", CLI_INT, &o.max_prompt_len, "prompt capacity in tokens (default 128)"},
        {"--cfg", CLI_F64, &o.cfg, "classifier-free guidance weight (default 5.0)"},
        {"--temperature", CLI_F64, &o.temperature, "sampling temperature (default 1.0)"},
        {"--top-k", CLI_INT, &o.top_k, "top-k sampling (default off)"},
        {"--top-p", CLI_F64, &o.top_p, "top-p sampling (default off)"},
        {"--sample-seed", CLI_INT, &o.sample_seed, "sampling seed (default 0)"},
        {"--quiet", CLI_FLAG, &o.quiet, "no progress lines"},
    };
    int rc = cli_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = check_opts(&o))) return rc;
    flexdiag_policy_params pp;
    if (cli_policy_params(CMD, &o.po, &pp)) return 2;
    prompt_set ps = {0};
    gen_run r = {.w = {.o = &o, .ps = &ps}};
    rc = load_prompts(&o, &ps);
    if (!rc && (int64_t)ps.n * o.per_prompt > INT32_MAX)
        rc = fail(2, "%d prompts x %lld images exceed %d images per run", ps.n,
                  (long long)o.per_prompt, INT32_MAX);
    r.total = (int64_t)ps.n * o.per_prompt;
    if (!rc) rc = open_out(&r.w);
    flexdiag_runtime *rt = NULL;
    if (!rc) rc = cli_open_model(CMD, &o.mo, &rt, &r.m);
    if (!rc) rc = pick_batch(&r, &pp);
    if (!rc) rc = generate_job(&r, &pp);
    if (r.w.results) fclose(r.w.results);
    json_decref(r.w.common);
    json_decref(r.w.dpg_records);
    free(r.w.dpg_cells);
    free(r.texts);
    free(r.tokens);
    free(r.pix);
    free(r.rgb);
    flexdiag_model_destroy(r.m);
    flexdiag_runtime_destroy(rt);
    prompts_free(&ps);
    return rc;
}
