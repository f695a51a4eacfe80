/*
 * score_input.c - reading the JSON input of `flexdiag score` (score_input.h). jansson parses the
 * whole file with duplicate keys rejected; each id array must be non-empty, at most
 * CLI_SCORE_MAX_IDS long and hold integers in [0, INT32_MAX]; cfg_weight, when present, must be a
 * number. Every failure prints one line naming the file and the key or element (control
 * characters of the input quoted in a parse error are escaped), and frees what was read, so the
 * caller has nothing to clean up. Whether the ids fit the model's vocabularies is the library's
 * check (flexdiag_score), which knows them.
 */
#include "cli/score_input.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFG_DEFAULT 5.0 /* Janus-Pro's guidance scale */

/* root[key] as token ids into malloc'ed *out (*n of them); 0, or an exit code after a message. */
static int read_ids(const char *cmd, const char *file, const json_t *root, const char *key,
                    int32_t **out, int32_t *n) {
    const json_t *a = json_object_get(root, key);
    size_t len = json_array_size(a); /* 0 when a is not an array */
    if (len == 0 || len > CLI_SCORE_MAX_IDS) {
        fprintf(stderr, "flexdiag %s: %s: \"%s\" must be a non-empty array of token ids\n", cmd,
                file, key);
        return 2;
    }
    int32_t *ids = malloc(len * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "flexdiag %s: %s: out of host memory for %zu token ids\n", cmd, file, len);
        return 1;
    }
    for (size_t i = 0; i < len; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            fprintf(stderr, "flexdiag %s: %s: %s[%zu] is not a token id\n", cmd, file, key, i);
            free(ids);
            return 2;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    *out = ids;
    *n = (int32_t)len;
    return 0;
}

/* root["cfg_weight"] into *cfg (CFG_DEFAULT when absent); 0, or 2 after a message. */
static int read_cfg(const char *cmd, const char *file, const json_t *root, double *cfg) {
    const json_t *w = json_object_get(root, "cfg_weight");
    *cfg = CFG_DEFAULT;
    if (!w) return 0;
    if (!json_is_number(w)) {
        fprintf(stderr, "flexdiag %s: %s: cfg_weight must be a number\n", cmd, file);
        return 2;
    }
    *cfg = json_number_value(w);
    return 0;
}

/* The parse error on one line: jansson's text quotes the input near the error, raw bytes and
 * all, so control characters (a newline, an escape sequence) are printed as \xNN. The place is
 * printed when jansson knows one (line -1: the file could not be opened or read). */
static int json_fail(const char *cmd, const char *file, const json_error_t *je) {
    fprintf(stderr, "flexdiag %s: --input %s: ", cmd, file);
    for (const unsigned char *p = (const unsigned char *)je->text; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            fprintf(stderr, "\\x%02x", *p);
        else
            fputc(*p, stderr);
    }
    if (je->line > 0) fprintf(stderr, " (line %d, column %d)", je->line, je->column);
    fputc('\n', stderr);
    return 2;
}

int cli_score_input_read(const char *cmd, const char *file, cli_score_input *in) {
    memset(in, 0, sizeof *in);
    json_error_t je;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
    if (!root) return json_fail(cmd, file, &je);
    int rc = read_ids(cmd, file, root, "prompt_ids", &in->prompt, &in->np);
    if (rc == 0) rc = read_ids(cmd, file, root, "image_ids", &in->ids, &in->n);
    if (rc == 0) rc = read_cfg(cmd, file, root, &in->cfg);
    json_decref(root);
    if (rc) cli_score_input_free(in);
    return rc;
}

void cli_score_input_free(cli_score_input *in) {
    free(in->prompt);
    free(in->ids);
    memset(in, 0, sizeof *in);
}
