/*
 * prompts.c - reading the prompt sets of `flexdiag generate` (see prompts.h). Files are read
 * line by line, a line up to LINE_MAX_BYTES (so /dev/zero or a stray binary file fails fast
 * instead of growing memory), DPG <id>.txt files whole up to 1 MiB; a prompt's text is at most
 * PROMPT_MAX_BYTES (a prompt that long is far over any prompt capacity, and tokenizing it would
 * take minutes before the capacity refuses it); UTF-8 is
 * checked with jansson, which also parses the GenEval lines. A NUL byte anywhere is refused
 * with its file and line (C strings would end there and cut the prompt); blank lines of the
 * line files are skipped with one note on stderr (how many, and the first). Token-id prompts
 * (--prompt-ids, --prompt-ids-file) are read the same way and kept as ids beside their list.
 */
#include "cli/prompts.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROMPT_FILE_MAX (1 << 20) /* bytes of one DPG <id>.txt; prompts are a few hundred */
#define LINE_MAX_BYTES (1 << 20)  /* bytes of one line of a prompts file (GenEval metadata) */
#define PROMPT_MAX_BYTES (16 << 10) /* bytes of one prompt's text */

const char *const cli_layout_names[CLI_LAYOUT_COUNT] = {"plain", "geneval", "dpg"};

static _Thread_local const char *g_cmd = "generate"; /* command named in messages */

/* One line "flexdiag <cmd>: <what><message>" on stderr. */
static void say(const char *what, const char *fmt, va_list ap) {
    fprintf(stderr, "flexdiag %s: %s", g_cmd, what);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say("", fmt, ap);
    va_end(ap);
    return rc;
}

__attribute__((format(printf, 1, 2))) static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say("note: ", fmt, ap);
    va_end(ap);
}

/* 1-based line of byte offset off in text (n bytes). */
static long line_of(const char *text, size_t off) {
    long no = 1;
    for (size_t i = 0; i < off; i++) no += text[i] == '\n';
    return no;
}

void cli_prompts_free(cli_prompts *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->p[i].text);
        free(s->p[i].meta);
        free(s->p[i].id);
        if (s->ids) free(s->ids[i]);
    }
    free(s->p);
    free(s->ids);
    free(s->n_ids);
    memset(s, 0, sizeof *s);
}

/* Append a prompt; takes ownership of the strings (freed on failure). */
static int prompts_add(cli_prompts *s, char *text, char *meta, char *id) {
    if (text && strlen(text) > PROMPT_MAX_BYTES) {
        int rc = fail(2, "%s: a prompt of %zu bytes (the first: \"%.40s...\"): prompts are at "
                         "most %d bytes (a few hundred tokens fill the prompt capacity)",
                      s->path ? s->path : "--prompt", strlen(text), text, PROMPT_MAX_BYTES);
        free(text), free(meta), free(id);
        return rc;
    }
    if (text && s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        cli_prompt *p = cap > s->cap ? realloc(s->p, (size_t)cap * sizeof *p) : NULL;
        if (p) s->p = p, s->cap = cap;
    }
    if (!text || s->n == s->cap) {
        free(text);
        free(meta);
        free(id);
        return fail(1, "out of host memory reading the prompts");
    }
    s->p[s->n++] = (cli_prompt){text, meta, id};
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

typedef int (*line_fn)(cli_prompts *s, char *line, long no);

/* The next line of f into *buf (grown as getline does, newline kept), at most
 * LINE_MAX_BYTES + 1 bytes of it: its length (LINE_MAX_BYTES + 1 when longer, the rest unread),
 * -1 at the end of f. */
static ssize_t read_line(FILE *f, char **buf, size_t *cap) {
    size_t n = 0;
    int ch = 0;
    while (n <= LINE_MAX_BYTES && (ch = getc(f)) != EOF) {
        if (n + 2 > *cap) {
            size_t nc = *cap ? 2 * *cap : 256;
            char *b = realloc(*buf, nc);
            if (!b) return -1;
            *buf = b, *cap = nc;
        }
        (*buf)[n++] = (char)ch;
        if (ch == '\n') break;
    }
    if (n == 0 && ch == EOF) return -1;
    (*buf)[n] = 0;
    return (ssize_t)n;
}

/* fn(line) for every non-blank line of s->path, newline stripped; stops at a nonzero return.
 * A NUL byte refuses the file (the line would silently end there); blank lines are skipped,
 * with one note that counts them and names the first. */
static int each_line(cli_prompts *s, line_fn fn) {
    const char *flag = s->flag ? s->flag : "--prompts";
    FILE *f = fopen(s->path, "r");
    if (!f) return fail(2, "%s: cannot open '%s': %s", flag, s->path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long no = 0, blank = 0, first_blank = 0;
    int rc = 0;
    while (!rc && (len = read_line(f, &line, &cap)) >= 0) {
        no++;
        if (len > LINE_MAX_BYTES) {
            rc = fail(2, "%s %s: line %ld is longer than %d bytes (is it a prompts file?)", flag,
                      s->path, no, LINE_MAX_BYTES);
            break;
        }
        if (memchr(line, 0, (size_t)len)) {
            rc = fail(2, "%s %s: line %ld holds a NUL byte (is it a text file?)", flag, s->path,
                      no);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!is_blank(line)) rc = fn(s, line, no);
        else if (!blank++) first_blank = no;
    }
    if (!rc && ferror(f)) rc = fail(2, "%s %s: read error", flag, s->path);
    if (!rc && blank)
        note("%s %s: skipped %ld blank line(s), the first at line %ld", flag, s->path, blank,
             first_blank);
    free(line);
    fclose(f);
    return rc;
}

static int plain_line(cli_prompts *s, char *line, long no) {
    if (!utf8_ok(line)) return fail(2, "--prompts %s: line %ld is not valid UTF-8", s->path, no);
    return prompts_add(s, strdup(line), NULL, NULL);
}

/* GenEval evaluation_metadata.jsonl: one object per line with a string "prompt". */
static int geneval_line(cli_prompts *s, char *line, long no) {
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

static int dpg_add(cli_prompts *s, const char *id, char *text, const char *where) {
    text = trim(text);
    if (!dpg_id_ok(id))
        return fail(2, "--prompts %s: id '%s' cannot name a file (empty, '/', '.' or '..')",
                    where, id);
    if (!*text || !utf8_ok(text))
        return fail(2, "--prompts %s: the prompt is empty or not valid UTF-8", where);
    return prompts_add(s, strdup(text), NULL, strdup(id));
}

/* "<id>\t<prompt>" lines. */
static int dpg_line(cli_prompts *s, char *line, long no) {
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
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        fail(2, "--prompts %s: line %ld holds a NUL byte (is it a text file?)", path,
             line_of(buf, (size_t)(nul - buf)));
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
static int dpg_folder(cli_prompts *s) {
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
static int dpg_unique(const cli_prompts *s) {
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

int cli_prompts_load(const char *cmd, cli_layout layout, const char *file, const char *prompt,
                     cli_prompts *s) {
    g_cmd = cmd;
    s->path = file;
    int rc = 0;
    struct stat st;
    if (layout == CLI_LAYOUT_GENEVAL) rc = each_line(s, geneval_line);
    else if (layout == CLI_LAYOUT_DPG && stat(s->path, &st) == 0 && S_ISDIR(st.st_mode))
        rc = dpg_folder(s);
    else if (layout == CLI_LAYOUT_DPG) rc = each_line(s, dpg_line);
    else if (file) rc = each_line(s, plain_line);
    else if (!utf8_ok(prompt)) rc = fail(2, "--prompt: not valid UTF-8");
    else rc = prompts_add(s, strdup(prompt), NULL, NULL);
    if (!rc && s->n == 0) rc = fail(2, "--prompts: '%s' holds no prompt", s->path);
    if (!rc && layout == CLI_LAYOUT_DPG) rc = dpg_unique(s);
    return rc;
}

/* ---- token-id prompts ---- */

/* The ids of list (where names it in messages) as a prompt of s: its text the normalised list
 * "1,2,3". */
static int ids_add(cli_prompts *s, const char *list, const char *where) {
    size_t cap = strlen(list) / 2 + 1, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *text = malloc(strlen(list) + 1);
    if (!ids || !text) {
        free(ids), free(text);
        return fail(1, "out of host memory reading %s", where);
    }
    size_t at = 0;
    for (const char *p = list;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        size_t len = strcspn(p, ", \t\r");
        char *end = NULL;
        errno = 0;
        long long v = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
        if (v < 0 || v > INT32_MAX || errno || end != p + len) {
            free(ids), free(text);
            return fail(2, "%s: '%.*s' is not a token id (expected whole numbers in [0, %d] "
                           "separated by commas: the prompt's ids, BOS included)",
                        where, (int)(len < 40 ? len : 40), p, INT32_MAX);
        }
        ids[n++] = (int32_t)v;
        at += (size_t)sprintf(text + at, "%s%lld", n > 1 ? "," : "", v);
        p += len;
    }
    if (n == 0) {
        free(ids), free(text);
        return fail(2, "%s: no token ids", where);
    }
    int rc = prompts_add(s, text, NULL, NULL);
    int32_t **all = rc ? NULL : realloc(s->ids, (size_t)s->cap * sizeof *all);
    int32_t *counts = all ? realloc(s->n_ids, (size_t)s->cap * sizeof *counts) : NULL;
    if (all) s->ids = all;
    if (counts) s->n_ids = counts;
    if (!rc && !counts) rc = fail(1, "out of host memory reading %s", where);
    if (rc) {
        free(ids);
        return rc;
    }
    s->ids[s->n - 1] = ids;
    s->n_ids[s->n - 1] = (int32_t)n;
    return 0;
}

static int ids_line(cli_prompts *s, char *line, long no) {
    char where[4200];
    snprintf(where, sizeof where, "--prompt-ids-file %s: line %ld", s->path, no);
    return ids_add(s, line, where);
}

int cli_prompts_load_ids(const char *cmd, const char *list, const char *file, cli_prompts *s) {
    g_cmd = cmd;
    s->path = file;
    s->flag = "--prompt-ids-file";
    int rc = file ? each_line(s, ids_line) : ids_add(s, list, "--prompt-ids");
    if (!rc && s->n == 0) rc = fail(2, "--prompt-ids-file: '%s' holds no prompt", file);
    return rc;
}
