/*
 * fuzz_prompts.c - libFuzzer target for the prompt-set reader of `flexdiag generate`
 * (cli/prompts.c cli_prompts_load). Every input goes through all five ways a prompt set arrives:
 *   1. --prompt TEXT (the input up to its first NUL, as argv would carry it);
 *   2. --prompts FILE, plain layout (one prompt per line); 3. geneval (evaluation_metadata.jsonl
 *      lines); 4. dpg, "<id><TAB><prompt>" lines - the input written once as p.txt;
 *   5. dpg, a folder of <id>.txt files, when the input holds a 0x1e (ASCII record separator):
 *      the input split at each 0x1e into at most MAX_FILES parts, each "<id>\n<prompt>"; a part
 *      whose id cannot be a file name (empty, '/', NUL, '.', '..', too long) is not written.
 *      Only then, because the reader's 1 MiB buffer per file costs milliseconds under ASan.
 * What the reader prints is captured, not shown.
 *
 * Properties checked beyond "no crash, no sanitizer report": a failure returns 2 (1 only when
 * out of memory) after printing a "flexdiag fuzz: " line; a success holds at least one prompt,
 * never more than the input has lines, each valid UTF-8 (checked here independently) and found
 * in the input (for GenEval, its metadata line); plain prompts are non-blank lines without their
 * line end; GenEval prompts are the "prompt" of their metadata line, kept verbatim; DPG prompts
 * are trimmed and non-empty, with unique ids that can name a file, and in folder form the ids
 * are written files, in name order; --prompt TEXT is taken exactly when it is valid UTF-8;
 * token-id prompts (the input as --prompt-ids-file and as --prompt-ids) are non-empty lists of
 * ids in [0, 2^31) written in the input, or a refusal naming the flag; cli_prompts_free leaves
 * the set zeroed.
 *
 * The same entry point is replayed over tests/fuzz/corpus/prompts by replay.c in the 'format'
 * suite.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/prompts.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FILES 4  /* <id>.txt files of the folder form */
#define MAX_STEM 200 /* bytes of an id written as a file name (NAME_MAX is 255) */

static char *dir, *file, *folder; /* temp folder, p.txt, the DPG folder */
static char *written[MAX_FILES];  /* <id>.txt names in the folder now */
static int n_written;

typedef struct input {
    const uint8_t *d; /* the fuzz input */
    size_t n;         /* bytes */
} input;

/* ---- independent checks ---- */

/* Valid UTF-8 by decoding code points (no overlongs, surrogates or values above U+10FFFF). */
static int utf8_valid(const char *s) {
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        uint32_t cp = *p;
        int k = cp < 0x80             ? 0
                : (cp & 0xe0) == 0xc0 ? 1
                : (cp & 0xf0) == 0xe0 ? 2
                : (cp & 0xf8) == 0xf0 ? 3
                                      : -1;
        if (k < 0) return 0;
        if (k) cp &= 0x3fu >> k;
        for (int j = 1; j <= k; j++) {
            if ((p[j] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (p[j] & 0x3f);
        }
        if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        p += k + 1;
    }
    return 1;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static int blank(const char *s) {
    while (is_space(*s)) s++;
    return *s == 0;
}

static int id_ok(const char *id) {
    return *id && strlen(id) < 250 && !strchr(id, '/') && strcmp(id, ".") && strcmp(id, "..");
}

static size_t count_lines(const input *in) {
    size_t n = 1;
    for (size_t i = 0; i < in->n; i++) n += in->d[i] == '\n';
    return n;
}

/* Folder form: every id names a written, visible <id>.txt, and they come in name order. */
static void check_dpg_files(const cli_prompts *s) {
    char prev[MAX_STEM + 8] = "", name[MAX_STEM + 8];
    for (int i = 0; i < s->n; i++) {
        int found = 0;
        snprintf(name, sizeof name, "%s.txt", s->p[i].id);
        for (int k = 0; k < n_written; k++) found |= strcmp(written[k], name) == 0;
        FUZZ_CHECK(found && name[0] != '.', name);
        FUZZ_CHECK(i == 0 || strcmp(prev, name) < 0, name);
        memcpy(prev, name, sizeof prev);
    }
}

static void check_dpg(const cli_prompts *s, int folder_form) {
    for (int i = 0; i < s->n; i++) {
        const char *id = s->p[i].id, *t = s->p[i].text;
        FUZZ_CHECK(id != NULL && id_ok(id) && s->p[i].meta == NULL, "DPG id");
        FUZZ_CHECK(*t && !is_space(t[0]) && !is_space(t[strlen(t) - 1]), t);
        for (int j = 0; j < i; j++) FUZZ_CHECK(strcmp(s->p[j].id, id) != 0, id);
    }
    if (folder_form) check_dpg_files(s);
}

static void check_geneval(const cli_prompts *s) {
    for (int i = 0; i < s->n; i++) {
        FUZZ_CHECK(s->p[i].meta != NULL && s->p[i].id == NULL, "GenEval prompt");
        json_t *j = json_loads(s->p[i].meta, 0, NULL);
        const char *p = json_string_value(json_object_get(j, "prompt"));
        FUZZ_CHECK(json_is_object(j) && p != NULL && strcmp(p, s->p[i].text) == 0, s->p[i].meta);
        json_decref(j);
    }
}

static void check_plain(const cli_prompts *s) {
    for (int i = 0; i < s->n; i++) {
        const char *t = s->p[i].text;
        size_t n = strlen(t);
        FUZZ_CHECK(s->p[i].meta == NULL && s->p[i].id == NULL && !blank(t), t);
        FUZZ_CHECK(!strchr(t, '\n') && t[n - 1] != '\r', t);
    }
}

/* A loaded set: common properties, then the layout's. */
static void check_set(const cli_prompts *s, cli_layout layout, const input *in, int folder_form) {
    FUZZ_CHECK(s->n >= 1 && (size_t)s->n <= count_lines(in) && s->p != NULL, "prompt count");
    for (int i = 0; i < s->n; i++) { /* GenEval: the JSON line is in the input, not the text */
        const char *t = s->p[i].text, *raw = layout == CLI_LAYOUT_GENEVAL ? s->p[i].meta : t;
        FUZZ_CHECK(t != NULL && utf8_valid(t), "prompt is not valid UTF-8");
        FUZZ_CHECK(raw && memmem(in->d, in->n, raw, strlen(raw)) != NULL, "prompt not in input");
    }
    if (layout == CLI_LAYOUT_DPG)
        check_dpg(s, folder_form);
    else if (layout == CLI_LAYOUT_GENEVAL)
        check_geneval(s);
    else
        check_plain(s);
}

/* ---- the five ways in ---- */

/* Load (file or prompt) as layout and check the result, whichever way it goes. */
static void load_checked(cli_layout layout, const char *path, const char *prompt, const input *in,
                         int folder_form) {
    static const cli_prompts zero;
    cli_prompts s = {0};
    fuzz_stderr_begin();
    int rc = cli_prompts_load("fuzz", layout, path, prompt, &s);
    const char *out = fuzz_stderr_end();
    if (rc == 0)
        check_set(&s, layout, in, folder_form);
    else
        FUZZ_CHECK((rc == 1 || rc == 2) && strstr(out, "flexdiag fuzz: ") != NULL, out);
    cli_prompts_free(&s);
    FUZZ_CHECK(memcmp(&s, &zero, sizeof zero) == 0, "cli_prompts_free");
}

static void check_prompt_arg(const input *in) {
    char *text = strndup((const char *)in->d, in->n);
    cli_prompts s = {0};
    FUZZ_CHECK(text != NULL, "out of memory");
    fuzz_stderr_begin();
    int rc = cli_prompts_load("fuzz", CLI_LAYOUT_PLAIN, NULL, text, &s);
    const char *out = fuzz_stderr_end();
    FUZZ_CHECK(rc == (utf8_valid(text) ? 0 : 2), out);
    FUZZ_CHECK(rc != 0 || (s.n == 1 && strcmp(s.p[0].text, text) == 0), "--prompt text");
    cli_prompts_free(&s);
    free(text);
}

/* Token-id prompts (--prompt-ids LIST, --prompt-ids-file FILE): each list non-empty, every id
 * in [0, 2^31) and written in the input, the record text the ids joined by commas; a refusal
 * is exit 1 or 2 with one line naming the flag. */
static void check_ids(const char *list, const char *path, const input *in) {
    static const cli_prompts zero;
    cli_prompts s = {0};
    fuzz_stderr_begin();
    int rc = cli_prompts_load_ids("fuzz", list, path, &s);
    const char *out = fuzz_stderr_end();
    if (rc != 0) {
        FUZZ_CHECK((rc == 1 || rc == 2) && strstr(out, "--prompt-ids") != NULL, out);
    } else {
        FUZZ_CHECK(s.n >= 1 && (size_t)s.n <= count_lines(in) && s.ids && s.n_ids, "id lists");
        for (int i = 0; i < s.n; i++) {
            char want[64 * 12] = "", num[16];
            size_t at = 0;
            FUZZ_CHECK(s.n_ids[i] >= 1, "an empty id list");
            for (int32_t k = 0; k < s.n_ids[i]; k++) {
                FUZZ_CHECK(s.ids[i][k] >= 0, "a negative id");
                int w = snprintf(num, sizeof num, "%d", s.ids[i][k]);
                FUZZ_CHECK(memmem(in->d, in->n, num, (size_t)w) != NULL, "id not in input");
                if (at + (size_t)w + 2 < sizeof want)
                    at += (size_t)snprintf(want + at, sizeof want - at, "%s%s", k ? "," : "", num);
            }
            if (at + 2 < sizeof want) FUZZ_CHECK(strcmp(s.p[i].text, want) == 0, s.p[i].text);
        }
    }
    cli_prompts_free(&s);
    FUZZ_CHECK(memcmp(&s, &zero, sizeof zero) == 0, "cli_prompts_free");
}

/* Can stem[0..n) name a file in the folder? */
static int stem_ok(const uint8_t *stem, size_t n) {
    return n > 0 && n <= MAX_STEM && !memchr(stem, '/', n) && !memchr(stem, 0, n) &&
           !(n == 1 && stem[0] == '.') && !(n == 2 && stem[0] == '.' && stem[1] == '.');
}

/* One part "<id>\n<prompt>" -> <id>.txt (skipped when the id cannot name a file). */
static void write_part(const uint8_t *p, size_t n) {
    const uint8_t *nl = memchr(p, '\n', n);
    size_t stem = nl ? (size_t)(nl - p) : n, body = nl ? n - stem - 1 : 0;
    if (!stem_ok(p, stem)) return;
    char name[MAX_STEM + 8];
    snprintf(name, sizeof name, "%.*s.txt", (int)stem, (const char *)p);
    for (int k = 0; k < n_written; k++)
        if (!strcmp(written[k], name)) return; /* a repeated id keeps its first file */
    char *path = fuzz_path(folder, name);
    fuzz_write(path, nl ? nl + 1 : p + n, body);
    free(path);
    written[n_written++] = strdup(name);
}

static void clear_folder(void) {
    for (int k = 0; k < n_written; k++) {
        char *path = fuzz_path(folder, written[k]);
        unlink(path);
        free(path);
        free(written[k]);
    }
    n_written = 0;
}

static void fill_folder(const input *in) {
    const uint8_t *p = in->d, *end = in->d + in->n;
    while (n_written < MAX_FILES) {
        const uint8_t *sep = memchr(p, 0x1e, (size_t)(end - p));
        write_part(p, (size_t)((sep ? sep : end) - p));
        if (!sep) break;
        p = sep + 1;
    }
}

static void setup_once(void) {
    dir = fuzz_tempdir("fuzz-prompts");
    file = fuzz_path(dir, "p.txt");
    folder = fuzz_path(dir, "dpg");
    FUZZ_CHECK(mkdir(folder, 0700) == 0, folder);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const input in = {data, size};
    if (!dir) setup_once();
    check_prompt_arg(&in);
    fuzz_write(file, data, size);
    load_checked(CLI_LAYOUT_PLAIN, file, NULL, &in, 0);
    load_checked(CLI_LAYOUT_GENEVAL, file, NULL, &in, 0);
    load_checked(CLI_LAYOUT_DPG, file, NULL, &in, 0);
    check_ids(NULL, file, &in);
    char *list = strndup((const char *)data, size);
    FUZZ_CHECK(list != NULL, "out of memory");
    check_ids(list, NULL, &in);
    free(list);
    if (!memchr(data, 0x1e, size)) return 0;
    fill_folder(&in);
    load_checked(CLI_LAYOUT_DPG, folder, NULL, &in, 1);
    clear_folder();
    return 0;
}
