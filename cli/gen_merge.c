/*
 * gen_merge.c - gathering the records of an --out folder (gen_merge.h).
 *
 * Record files are results.jsonl and tokens.json, each optionally followed by ".part-<rank>"
 * (a process of an MPI job or of a --resume run) and ".tmp.<pid>" (a file still being written:
 * gen_out.c's tokens streams, a merge cut short). Whatever process wrote a record, its bytes are
 * what one process writing the whole job writes for that image (gen_out.c renders both), so the
 * merge copies records verbatim: an index per image holds where its results line and its tokens
 * record are (file, offset, length) and their token hashes; memory is O(images), never
 * O(tokens). Files are read in a fixed order (results.jsonl and tokens.json first, then the
 * others by name) and a later record of an image replaces an earlier one; an image is complete
 * when its two records carry the same hash and its PNG exists (PNGs are renamed into place whole,
 * so existing is enough). Lines that do not parse and a tokens record cut short are what a killed
 * writer leaves: they are skipped, and their images made again.
 * Every record that parses must belong to this run: image index within the job, its prompt,
 * prompt index and sample (--images-per-prompt), its file (--layout) and the fields every record
 * shares (sampling seed, model, policy, sampling settings); one that differs stops the run with
 * exit code 2 before anything is written. The output is written as gen_out.c writes it, through
 * fileio.c's record stream (temp file + rename), tokens.json first and results.jsonl last (the
 * commit); the part and temp files are removed only after both renames, so an interruption at
 * any point leaves every complete image findable by the next merge.
 */
#include "cli/gen_merge.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/image_out.h"

#define CMD "generate"
#define JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9)) /* as gen_out.c writes records */
#define SHOW_MAX 60 /* characters of a differing value quoted in the message */

/* Where one record of an image is. */
typedef struct rec_at {
    int32_t file;  /* index into merge.files; -1 = none */
    int64_t off;   /* bytes from the file's start */
    int64_t len;   /* bytes of the record (results: the line with its '\n') */
    uint64_t hash; /* FNV-1a 64 of the image's token ids */
} rec_at;

typedef struct src_file {
    char *name; /* in --out, owned */
    int base;   /* results.jsonl or tokens.json themselves (never removed) */
    int tokens; /* a tokens.json file (else results.jsonl) */
    FILE *f;    /* open while merging; NULL when unreadable */
} src_file;

typedef struct merge {
    const gen_out *w;
    int64_t total;  /* images in the job */
    src_file *files;
    int n_files;
    rec_at *res, *tok;  /* (total) each image's results line and tokens record */
    int64_t skipped;    /* records that did not parse (cut short by a killed writer) */
    int32_t *ids;       /* (per_image) scratch for a grid */
} merge;

/* One line "flexdiag generate: ..." on stderr; returns rc. */
#define fail(rc, ...) cli_errorf(CMD, (rc), __VA_ARGS__)

/* ---- the record files ---- */

/* s is "" or ".part-<digits>", then "" or ".tmp.<digits>"; *plain = s is "". */
static int record_suffix(const char *s, int *plain) {
    *plain = !*s;
    static const char *const parts[2] = {".part-", ".tmp."};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(parts[i]);
        if (strncmp(s, parts[i], n)) continue;
        s += n;
        if (*s < '0' || *s > '9') return 0;
        while (*s >= '0' && *s <= '9') s++;
    }
    return !*s;
}

/* Whether name is a record file; *tokens and *base say which kind. */
static int record_file(const char *name, int *tokens, int *base) {
    static const char *const stems[2] = {"results.jsonl", "tokens.json"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(stems[i]);
        if (!strncmp(name, stems[i], n) && record_suffix(name + n, base)) {
            *tokens = i;
            return 1;
        }
    }
    return 0;
}

/* results.jsonl, tokens.json, then the others by name. */
static int file_order(const void *a, const void *b) {
    const src_file *x = a, *y = b;
    if (x->base != y->base) return y->base - x->base;
    return strcmp(x->name, y->name);
}

/* The record files of dir, ordered; 0, or 1 when out of memory. A missing folder has none. */
static int list_files(merge *m, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int cap = 0, rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        int tokens, base;
        if (!record_file(e->d_name, &tokens, &base)) continue;
        if (m->n_files == cap) {
            cap = cap ? 2 * cap : 8;
            src_file *g = realloc(m->files, (size_t)cap * sizeof *g);
            if (!g) rc = 1;
            else m->files = g;
        }
        char *name = rc ? NULL : strdup(e->d_name);
        if (!name) rc = 1;
        else m->files[m->n_files++] = (src_file){name, base, tokens, NULL};
    }
    closedir(d);
    if (m->n_files) qsort(m->files, (size_t)m->n_files, sizeof *m->files, file_order);
    return rc ? fail(1, "out of host memory") : 0;
}

/* --out/name into path. */
static void out_path(const merge *m, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", m->w->dir, name);
}

/* ---- checking a record against this run ---- */

/* value (NULL: missing) as compact JSON, shortened to SHOW_MAX characters, malloc'ed. */
static char *show(const json_t *value) {
    char *s = value ? json_dumps(value, JSON_FLAGS | JSON_ENCODE_ANY) : strdup("(missing)");
    if (s && strlen(s) > SHOW_MAX) strcpy(s + SHOW_MAX - 3, "...");
    return s;
}

/* The line saying that record number `where` of file f (0: its head), of image g, has field
 * with value `had` where this run has `want` (set by `flag`); returns 2. */
static int differs(const merge *m, int f, int64_t where, int64_t g, const char *field,
                   const json_t *had, const json_t *want, const char *flag) {
    char *h = show(had), *w = show(want), at[96] = "";
    if (where > 0)
        snprintf(at, sizeof at, " %s %lld (image %lld)", m->files[f].tokens ? "record" : "line",
                 (long long)where, (long long)g);
    fprintf(stderr, "flexdiag " CMD ": --out %s holds another run's images: %s%s has \"%s\": "
                    "%s, this run has %s (%s); resume with that run's flags or write to another "
                    "--out\n", m->w->dir, m->files[f].name, at, field, h ? h : "?",
            w ? w : "?", flag);
    free(h);
    free(w);
    return 2;
}

/* Whether a and b print the same (reals as records print them, so a value read back equals
 * the one this run would write). */
static int same_json(const json_t *a, const json_t *b) {
    if (!a || !b) return a == b;
    char *x = json_dumps(a, JSON_FLAGS | JSON_ENCODE_ANY);
    char *y = json_dumps(b, JSON_FLAGS | JSON_ENCODE_ANY);
    int same = x && y && !strcmp(x, y);
    free(x);
    free(y);
    return same;
}

/* The flag behind each field every record shares (gen_out's common fields). */
static const struct {
    const char *field, *flag;
} common_flags[] = {
    {"seed", "--sample-seed"},      {"model", "--model / --arch"},
    {"policy", "--policy"},         {"n_att", "--n-att / --sparsity"},
    {"n_r", "--n-r"},               {"sparsity", "--sparsity / --n-att"},
    {"cfg_weight", "--cfg"},        {"temperature", "--temperature"},
    {"top_k", "--top-k"},           {"top_p", "--top-p"},
    {"draft_len", "--decode sjd / --draft-len"}, /* absent for sequential decoding */
    {"sjd_group", "--decode gsd / --group"},     /* absent unless grouped (lossy) */
};

/* Image index of record r (where: its line or record number in file f): 0 with *g set, or 2
 * when it lies outside this job. */
static int image_of(const merge *m, int f, int64_t where, const json_t *r, int64_t *g) {
    json_t *v = json_object_get(r, "image_index");
    *g = json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
    if (*g >= 0 && *g < m->total) return 0;
    json_t *want = json_sprintf("0 .. %lld", (long long)m->total - 1);
    int rc = differs(m, f, where, *g, "image_index", v, want, "--prompts / --images-per-prompt");
    json_decref(want);
    return rc;
}

/* The fields that place image g: prompt index, sample, prompt text. */
static int check_place(const merge *m, int f, int64_t where, const json_t *r, int64_t g) {
    int64_t per = m->w->per_prompt;
    json_t *want[3] = {json_integer(g / per), json_integer(g % per),
                       json_string(m->w->ps->p[g / per].text)};
    static const char *const keys[3] = {"prompt_index", "sample", "prompt"};
    static const char *const flags[3] = {"--images-per-prompt", "--images-per-prompt",
                                         "--prompt / --prompts"};
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++)
        if (!same_json(json_object_get(r, keys[i]), want[i]))
            rc = differs(m, f, where, g, keys[i], json_object_get(r, keys[i]), want[i], flags[i]);
    for (int i = 0; i < 3; i++) json_decref(want[i]);
    return rc;
}

/* A results record: its place, its file (the layout) and the shared fields. */
static int check_result(const merge *m, int f, int64_t line, const json_t *r, int64_t g) {
    int rc = check_place(m, f, line, r, g);
    char rel[4200];
    if (m->w->img_h) gen_out_image_rel(m->w, g, rel, sizeof rel);
    json_t *file = m->w->img_h ? json_string(rel) : json_null();
    if (!rc && !same_json(json_object_get(r, "file"), file))
        rc = differs(m, f, line, g, "file", json_object_get(r, "file"), file,
                     "--layout, or the prompt ids of --prompts");
    json_decref(file);
    for (size_t i = 0; !rc && i < sizeof common_flags / sizeof common_flags[0]; i++) {
        const char *k = common_flags[i].field;
        json_t *want = json_object_get(m->w->common, k);
        if (!same_json(json_object_get(r, k), want)) /* a field one side lacks differs too */
            rc = differs(m, f, line, g, k, json_object_get(r, k), want, common_flags[i].flag);
    }
    return rc;
}

/* ---- reading ---- */

/* The token hash of a results record; 0 when it has none (never a valid image's: records
 * without one are skipped). */
static int result_hash(const json_t *r, uint64_t *h) {
    const char *s = json_string_value(json_object_get(r, "tokens_fnv1a64"));
    char *end = NULL;
    if (!s || strlen(s) != 16) return 0;
    *h = strtoull(s, &end, 16);
    return end && !*end;
}

/* Index every line of results file f. */
static int read_results(merge *m, int f) {
    FILE *fp = m->files[f].f;
    char *line = NULL;
    size_t cap = 0;
    int64_t off = 0, no = 0;
    int rc = 0;
    for (ssize_t n; !rc && (n = getline(&line, &cap, fp)) > 0; off += n) {
        no++;
        json_t *r = line[n - 1] == '\n' ? json_loadb(line, (size_t)n, 0, NULL) : NULL;
        int64_t g = -1;
        uint64_t h = 0;
        if (r && !(rc = image_of(m, f, no, r, &g)) && !(rc = check_result(m, f, no, r, g)) &&
            result_hash(r, &h))
            m->res[g] = (rec_at){f, off, n, h};
        else if (!rc)
            m->skipped++;
        json_decref(r);
    }
    free(line);
    return rc;
}

/* The next character after blanks. */
static int next_char(FILE *fp) {
    int c;
    do c = fgetc(fp);
    while (c == ' ' || c == '\n' || c == '\t' || c == '\r');
    return c;
}

/* The hash of a tokens record's grid (rows of ids), when it holds per_image ids. */
static int grid_hash(merge *m, const json_t *grid, uint64_t *h) {
    int32_t n = 0, per = m->w->per_image;
    size_t i, j;
    json_t *row, *id;
    json_array_foreach(grid, i, row) {
        json_array_foreach(row, j, id) {
            if (n == per || !json_is_integer(id)) return 0;
            m->ids[n++] = (int32_t)json_integer_value(id);
        }
    }
    *h = cli_fnv1a64_ids(m->ids, n);
    return n == per;
}

/* tokens.json's head, checked: 0 (*ok = 0 when the file has no head: created, never written),
 * or 2 when its tokens per image differ from this run's. */
static int read_tokens_head(const merge *m, int f, int *ok) {
    int per = -1, pos = -1;
    *ok = fscanf(m->files[f].f, " {\"tokens_per_image\": %d, \"images\": [%n", &per, &pos) == 1 &&
          pos > 0;
    if (!*ok || per == m->w->per_image) return 0;
    json_t *had = json_integer(per), *want = json_integer(m->w->per_image);
    int rc = differs(m, f, 0, 0, "tokens_per_image", had, want, "--model / --arch");
    json_decref(had);
    json_decref(want);
    return rc;
}

/* Index every record of tokens file f, up to the first one cut short. */
static int read_tokens(merge *m, int f) {
    FILE *fp = m->files[f].f;
    int ok = 0, rc = read_tokens_head(m, f, &ok);
    for (int64_t no = 1; !rc && ok; no++) {
        int c = next_char(fp);
        if (c == ',') c = next_char(fp);
        if (c != '{' || ungetc(c, fp) == EOF) break; /* ']': the tail */
        int64_t off = (int64_t)ftell(fp), g = -1;
        json_t *r = json_loadf(fp, JSON_DISABLE_EOF_CHECK, NULL);
        uint64_t h = 0;
        ok = r != NULL;
        if (ok && !(rc = image_of(m, f, no, r, &g)) && !(rc = check_place(m, f, no, r, g)) &&
            grid_hash(m, json_object_get(r, "grid"), &h))
            m->tok[g] = (rec_at){f, off, (int64_t)ftell(fp) - off, h};
        else if (!rc)
            m->skipped++;
        json_decref(r);
    }
    return rc;
}

/* Open and index every record file. */
static int read_all(merge *m) {
    int rc = 0;
    for (int f = 0; !rc && f < m->n_files; f++) {
        char path[4400];
        out_path(m, m->files[f].name, path, sizeof path);
        m->files[f].f = fopen(path, "r");
        if (!m->files[f].f) return fail(1, "--out: cannot read %s: %s", path, strerror(errno));
        struct stat st; /* a folder opens, reads as nothing, and its records would be lost */
        if (fstat(fileno(m->files[f].f), &st) || !S_ISREG(st.st_mode))
            return fail(1, "--out: %s is not a file (a folder?): move it away (nothing was "
                           "changed)", path);
        rc = m->files[f].tokens ? read_tokens(m, f) : read_results(m, f);
    }
    return rc;
}

/* ---- complete images ---- */

/* Whether image g's PNG is there and whole (always, for a model without an image decoder):
 * a regular file that decodes, of the image's size (a DPG grid: any size). */
static int png_there(const merge *m, int64_t g) {
    if (!m->w->img_h) return 1;
    char rel[4200], path[8600];
    gen_out_image_rel(m->w, g, rel, sizeof rel);
    out_path(m, rel, path, sizeof path);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return 0;
    int dpg = m->w->layout == CLI_LAYOUT_DPG;
    return flexdiag__png_whole(path, dpg ? 0 : m->w->img_w, dpg ? 0 : m->w->img_h);
}

/* done[g] for every image; a DPG prompt counts only with all its samples (one grid). */
static int64_t mark_done(const merge *m, uint8_t *done) {
    for (int64_t g = 0; g < m->total; g++)
        done[g] = m->res[g].file >= 0 && m->tok[g].file >= 0 &&
                  m->res[g].hash == m->tok[g].hash && png_there(m, g);
    int64_t per = m->w->per_prompt, n = 0;
    for (int64_t p0 = 0; m->w->layout == CLI_LAYOUT_DPG && p0 < m->total; p0 += per) {
        int all = 1;
        for (int64_t k = 0; k < per; k++) all &= done[p0 + k];
        memset(done + p0, all, (size_t)per);
    }
    for (int64_t g = 0; g < m->total; g++) n += done[g];
    return n;
}

/* ---- writing ---- */

/* Copy record at (with sep before it) to stream s; buf grows as needed. */
static int copy_record(const merge *m, const rec_at *at, const char *sep, cli_stream *s,
                       char **buf, size_t *cap) {
    size_t ns = strlen(sep), need = ns + (size_t)at->len;
    if (need > *cap) {
        char *g = realloc(*buf, need);
        if (!g) return fail(1, "out of host memory");
        *buf = g;
        *cap = need;
    }
    memcpy(*buf, sep, ns);
    const src_file *src = &m->files[at->file];
    ssize_t got = pread(fileno(src->f), *buf + ns, (size_t)at->len, (off_t)at->off);
    if (got != (ssize_t)at->len)
        return fail(1, "--out: cannot read %s/%s again: %s", m->w->dir, src->name,
                    got < 0 ? strerror(errno) : "it became shorter");
    return cli_stream_append(s, *buf, need) == FLEXDIAG_OK ? 0 : cli_fail_io(CMD);
}

/* One output file (name; head and tail around the records of the done images, from recs). */
static int write_file(const merge *m, const char *name, const char *head, const char *sep,
                      const char *tail, const rec_at *recs, const uint8_t *done) {
    char path[4400];
    out_path(m, name, path, sizeof path);
    cli_stream s;
    if (cli_stream_open(&s, path, head, tail) != FLEXDIAG_OK) return cli_fail_io(CMD);
    char *buf = NULL;
    size_t cap = 0;
    int rc = 0, first = 1;
    for (int64_t g = 0; !rc && g < m->total; g++) {
        if (!done[g]) continue;
        rc = copy_record(m, &recs[g], first ? "" : sep, &s, &buf, &cap);
        first = 0;
    }
    free(buf);
    if (rc) {
        cli_stream_abort(&s);
        return rc;
    }
    return cli_stream_finish(&s) == FLEXDIAG_OK ? 0 : cli_fail_io(CMD);
}

/* The temp file name fileio.c gives an output file of this process: a source of that very
 * name (a pid used again) is unlinked first, so that creating the temp file cannot empty it
 * (this process still reads it through its open descriptor). */
static void free_temp_names(const merge *m) {
    char own[2][64];
    snprintf(own[0], sizeof own[0], "tokens.json.tmp.%ld", (long)getpid());
    snprintf(own[1], sizeof own[1], "results.jsonl.tmp.%ld", (long)getpid());
    for (int f = 0; f < m->n_files; f++) {
        if (strcmp(m->files[f].name, own[0]) && strcmp(m->files[f].name, own[1])) continue;
        char path[4400];
        out_path(m, m->files[f].name, path, sizeof path);
        (void)unlink(path);
    }
}

static int write_all_files(const merge *m, const uint8_t *done) {
    char head[96];
    snprintf(head, sizeof head, GEN_OUT_TOKENS_HEAD, m->w->per_image);
    free_temp_names(m);
    int rc = write_file(m, "tokens.json", head, GEN_OUT_TOKENS_SEP, GEN_OUT_TOKENS_TAIL, m->tok,
                        done);
    return rc ? rc : write_file(m, "results.jsonl", "", "", "", m->res, done);
}

/* ---- entry points ---- */

static void merge_free(merge *m) {
    for (int f = 0; f < m->n_files; f++) {
        if (m->files[f].f) fclose(m->files[f].f);
        free(m->files[f].name);
    }
    free(m->files);
    free(m->res);
    free(m->tok);
    free(m->ids);
}

/* Remove the part and temp files of m (after a merge: all of them were read). */
static void remove_parts(const merge *m) {
    for (int f = 0; f < m->n_files; f++) {
        if (m->files[f].base) continue;
        char path[4400];
        out_path(m, m->files[f].name, path, sizeof path);
        (void)unlink(path);
    }
}

int gen_merge_folder(const gen_out *w, int64_t total, uint8_t *done, int64_t *n_done) {
    merge m = {.w = w, .total = total};
    m.res = malloc((size_t)(total ? total : 1) * sizeof *m.res);
    m.tok = malloc((size_t)(total ? total : 1) * sizeof *m.tok);
    m.ids = malloc((size_t)w->per_image * sizeof *m.ids);
    int rc = m.res && m.tok && m.ids ? list_files(&m, w->dir) : fail(1, "out of host memory");
    for (int64_t g = 0; !rc && g < total; g++) m.res[g] = m.tok[g] = (rec_at){.file = -1};
    if (!rc) rc = read_all(&m);
    if (!rc) *n_done = mark_done(&m, done);
    if (!rc) rc = write_all_files(&m, done);
    if (!rc) remove_parts(&m);
    if (!rc && m.skipped)
        fprintf(stderr, "flexdiag " CMD ": note: %lld record(s) in %s were cut short by an "
                        "interrupted write; their images are made again\n",
                (long long)m.skipped, w->dir);
    merge_free(&m);
    return rc;
}

void gen_merge_clear(const char *dir) {
    gen_out w = {.dir = dir};
    merge m = {.w = &w};
    if (!list_files(&m, dir)) remove_parts(&m);
    merge_free(&m);
}
