/*
 * fuzz_resume.c - libFuzzer target for what `flexdiag generate --resume` reads from an --out
 * folder (cli/gen_merge.c gen_merge_folder, with cli/gen_out.c compiled in): the input is split
 * at its first NUL byte into results.jsonl and tokens.json (no NUL: results.jsonl alone), written
 * into a private folder and gathered for a run of 2 prompts x 2 images of 8 x 8 tokens (micro-janus) on the
 * plain layout with 32 x 32 PNGs (present, so records can describe complete images).
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - the return is 0, 1 or 2; 1 and 2 print one line, 2 naming the folder;
 *   - on 0: n_done counts the images marked done, at most 4; results.jsonl is rewritten with
 *     exactly n_done records, each a JSON object whose image_index is a done image, in
 *     increasing order; tokens.json is a JSON document listing the same n_done images.
 *
 * The same entry point is replayed over tests/fuzz/corpus/resume by replay.c in the 'format'
 * suite.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/gen_merge.h"
#include "fuzz_util.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TOTAL 4

static char *dir, *res_path, *tok_path;
static cli_prompt prompt_list[2] = {{"a red apple", NULL, NULL}, {"two cats", NULL, NULL}};

/* The run the records are checked against: what `generate --prompts` with these two prompts,
 * two images each, seed 0, dense micro-janus would record. */
static void run_out(gen_out *w, cli_prompts *ps) {
    *ps = (cli_prompts){.p = prompt_list, .n = 2, .cap = 2, .path = NULL};
    memset(w, 0, sizeof *w);
    w->dir = dir;
    w->layout = CLI_LAYOUT_PLAIN;
    w->per_prompt = 2;
    w->ps = ps;
    w->per_image = 64;
    w->grid_w = 8;
    w->img_h = w->img_w = 32;
    w->eos_id = -1;
    w->common = json_pack("{s:I, s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:I, s:f}", "seed",
                          (json_int_t)0, "model", "micro-janus", "policy", "dense", "n_att", 64,
                          "n_r", 0, "sparsity", 0.0, "cfg_weight", 5.0, "temperature", 1.0,
                          "top_k", (json_int_t)0, "top_p", 1.0);
}

/* results.jsonl after a successful gather: n records of done images, increasing. */
static void check_results(const uint8_t *done, int64_t n) {
    size_t len = 0;
    char *text = tu_read_file(res_path, &len);
    FUZZ_CHECK(text != NULL, "results.jsonl is gone after a gather");
    int64_t lines = 0, last = -1;
    for (char *line = text, *end; line && *line; line = end + 1) {
        end = strchr(line, '\n');
        FUZZ_CHECK(end != NULL, "results.jsonl ends without a newline");
        *end = 0;
        json_t *o = json_loads(line, 0, NULL);
        FUZZ_CHECK(json_is_object(o), line);
        json_int_t g = json_integer_value(json_object_get(o, "image_index"));
        FUZZ_CHECK(g > last && g < TOTAL && done[g], line);
        last = g;
        lines++;
        json_decref(o);
    }
    FUZZ_CHECK(lines == n, "results.jsonl holds another number of records than n_done");
    free(text);
}

/* tokens.json after a successful gather: a JSON document listing n images. */
static void check_tokens(int64_t n) {
    json_t *t = json_load_file(tok_path, 0, NULL);
    FUZZ_CHECK(t != NULL, "tokens.json is not JSON");
    json_t *imgs = json_object_get(t, "images");
    FUZZ_CHECK(json_is_array(imgs) && (int64_t)json_array_size(imgs) == n, "tokens.json images");
    json_decref(t);
}

/* The four images' PNG files (their bytes do not matter to the gather), so that records can
 * describe complete images. */
static void make_pngs(void) {
    static const char *const rel[TOTAL] = {"0/0.png", "0/1.png", "1/0.png", "1/1.png"};
    for (int g = 0; g < TOTAL; g++) {
        char sub[2] = {rel[g][0], 0};
        char *folder = fuzz_path(dir, sub), *png = fuzz_path(dir, rel[g]);
        (void)mkdir(folder, 0777);
        fuzz_write(png, "png", 3);
        free(folder);
        free(png);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) {
        dir = fuzz_tempdir("fuzz-resume");
        res_path = fuzz_path(dir, "results.jsonl");
        tok_path = fuzz_path(dir, "tokens.json");
        make_pngs();
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t rn = nul ? (size_t)(nul - data) : size;
    fuzz_write(res_path, data, rn);
    if (nul) fuzz_write(tok_path, nul + 1, size - rn - 1);
    else remove(tok_path);
    gen_out w;
    cli_prompts ps;
    run_out(&w, &ps);
    uint8_t done[TOTAL] = {0};
    int64_t n = -1;
    fuzz_stderr_begin();
    int rc = gen_merge_folder(&w, TOTAL, done, &n);
    const char *out = fuzz_stderr_end();
    json_decref(w.common);
    FUZZ_CHECK(rc == 0 || rc == 1 || rc == 2, out);
    if (rc) {
        FUZZ_CHECK(strchr(out, '\n') != NULL, out);
        FUZZ_CHECK(rc != 2 || strstr(out, dir) != NULL, out);
        return 0;
    }
    int64_t marked = 0;
    for (int g = 0; g < TOTAL; g++) marked += done[g];
    FUZZ_CHECK(n == marked && n <= TOTAL, "n_done disagrees with done[]");
    check_results(done, n);
    check_tokens(n);
    return 0;
}
