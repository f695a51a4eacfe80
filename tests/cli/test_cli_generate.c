/*
 * test_cli_generate.c - `flexdiag generate` outputs, end to end through the binary.
 *
 * Runs $FLEXDIAG_BIN on the builtin micro-janus model (CPU, 8x8 tokens, 32x32 pixels) and checks
 * the files with readers independent of the writer: PNGs through libpng's simplified read API
 * (a truncated or half-written file fails png_image_finish_read), results.jsonl line by line
 * with jansson (every field present with its type, whole lines only), the token hash recomputed
 * from tokens.json. Covers the plain, GenEval and DPG-Bench layouts, --batch invariance
 * (sampling is keyed by image index, so blocks of 1, 3 or 4 give the same bytes), SIGINT and
 * SIGTERM mid-run (exit 128 + signal, only complete PNGs, one results line per image, no temp
 * files) and the messages of bad --layout, bad metadata lines, bad DPG input and unwritable --out.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <png.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "outdir.h"
#include "util.h"

#define SIDE   32 /* micro-janus image side in pixels (8x8 tokens, 4x upsampling) */
#define TOKENS 64 /* micro-janus tokens per image */

static const char *g_bin; /* $FLEXDIAG_BIN */

/* ---- helpers ---- */

/* Run `flexdiag generate` on micro-janus in dir with extra args; stderr goes to dir/err.txt. */
__attribute__((format(printf, 2, 3))) static int gen(const char *dir, const char *fmt, ...) {
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_system("cd '%s' && '%s' generate --cpu --arch micro-janus --quiet %s 2>err.txt", dir,
                     g_bin, args);
}

/* dir/err.txt contains every given needle (NULL-terminated list). */
static void assert_err_has(const char *dir, ...) {
    char path[8192];
    snprintf(path, sizeof path, "%s/err.txt", dir);
    char *msg = tu_read_file(path, NULL);
    assert_non_null(msg);
    va_list ap;
    va_start(ap, dir);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(msg, s)) fail_msg("stderr '%s' lacks '%s'", msg, s);
    va_end(ap);
    free(msg);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* Decode a whole PNG to RGB with libpng's reader; NULL (with a message) if it is not a
 * complete, valid 8-bit RGB PNG. */
static uint8_t *png_load(const char *path, int *w, int *h) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) {
        fprintf(stderr, "%s: %s\n", path, im.message);
        return NULL;
    }
    if (im.format != PNG_FORMAT_RGB) {
        fprintf(stderr, "%s: format %u, want 8-bit RGB\n", path, im.format);
        png_image_free(&im);
        return NULL;
    }
    uint8_t *rgb = malloc(PNG_IMAGE_SIZE(im));
    if (!rgb || !png_image_finish_read(&im, NULL, rgb, 0, NULL)) {
        fprintf(stderr, "%s: %s\n", path, im.message);
        free(rgb);
        png_image_free(&im);
        return NULL;
    }
    *w = (int)im.width;
    *h = (int)im.height;
    return rgb;
}

static void assert_png(const char *dir, const char *rel, int w, int h) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    int gw = 0, gh = 0;
    uint8_t *rgb = png_load(path, &gw, &gh);
    if (!rgb) fail_msg("%s is not a complete RGB PNG", path);
    assert_int_equal(gw, w);
    assert_int_equal(gh, h);
    free(rgb);
}

typedef struct tree_stats {
    int pngs;     /* *.png files */
    int bad_pngs; /* of which do not decode fully */
    int tmps;     /* *.tmp.* files (left-over temporaries) */
} tree_stats;

static void walk(const char *dir, tree_stats *s) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        size_t n = strlen(e->d_name);
        if (S_ISDIR(st.st_mode)) {
            walk(path, s);
        } else if (strstr(e->d_name, ".tmp.")) {
            s->tmps++;
        } else if (n > 4 && !strcmp(e->d_name + n - 4, ".png")) {
            int w, h;
            uint8_t *rgb = png_load(path, &w, &h);
            s->pngs++;
            s->bad_pngs += !rgb;
            free(rgb);
        }
    }
    closedir(d);
}

static const struct {
    const char *key;
    json_type type;
} fields[] = {
    {"prompt_index", JSON_INTEGER},  {"sample", JSON_INTEGER}, {"image_index", JSON_INTEGER},
    {"prompt", JSON_STRING},         {"file", JSON_STRING},    {"seed", JSON_INTEGER},
    {"model", JSON_STRING},          {"policy", JSON_STRING},  {"n_att", JSON_INTEGER},
    {"n_r", JSON_INTEGER},           {"sparsity", JSON_REAL},  {"cfg_weight", JSON_REAL},
    {"temperature", JSON_REAL},      {"top_k", JSON_INTEGER},  {"top_p", JSON_REAL},
    {"tokens_fnv1a64", JSON_STRING}, {"block_s", JSON_REAL},   {"images_in_block", JSON_INTEGER},
};

/* Every line of out/results.jsonl parsed (whole lines only, all fields typed): a JSON array. */
static json_t *read_results(const char *out) {
    char path[8192];
    snprintf(path, sizeof path, "%s/results.jsonl", out);
    size_t n = 0;
    char *text = tu_read_file(path, &n);
    assert_non_null(text);
    assert_true(n == 0 || text[n - 1] == '\n');
    json_t *all = json_array();
    int no = 0;
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        *nl = 0;
        no++;
        json_error_t e;
        json_t *r = json_loads(line, 0, &e);
        if (!r) fail_msg("results.jsonl line %d does not parse: %s", no, e.text);
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
            json_t *v = json_object_get(r, fields[i].key);
            if (!v || json_typeof(v) != fields[i].type)
                fail_msg("results.jsonl line %d: field %s missing or mistyped", no, fields[i].key);
        }
        assert_int_equal(strlen(json_string_value(json_object_get(r, "tokens_fnv1a64"))), 16);
        json_array_append_new(all, r);
    }
    free(text);
    return all;
}

static json_int_t rec_int(json_t *results, size_t i, const char *key) {
    return json_integer_value(json_object_get(json_array_get(results, i), key));
}

static const char *rec_str(json_t *results, size_t i, const char *key) {
    return json_string_value(json_object_get(json_array_get(results, i), key));
}

/* FNV-1a 64 of image i's grid in out/tokens.json, ids as little-endian int32, as hex. */
static void tokens_hash(json_t *tokens, size_t i, char hex[17]) {
    json_t *grid = json_object_get(json_array_get(json_object_get(tokens, "images"), i), "grid");
    size_t count = 0;
    uint64_t h = tu_grid_fnv1a64(grid, &count);
    assert_int_equal(count, TOKENS);
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

static json_t *read_tokens(const char *out) {
    char path[8192];
    snprintf(path, sizeof path, "%s/tokens.json", out);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) fail_msg("%s does not parse: %s", path, e.text);
    return j;
}

/* ---- tests ---- */

static void test_plain(void **state) {
    (void)state;
    char *tmp = tu_tempdir("cli-plain");
    assert_int_equal(gen(tmp, "--prompt 'a red apple' --images-per-prompt 4 --out o"), 0);
    char out[4096], rel[64];
    snprintf(out, sizeof out, "%s/o", tmp);
    for (int k = 0; k < 4; k++) {
        snprintf(rel, sizeof rel, "0/%d.png", k);
        assert_png(out, rel, SIDE, SIDE);
    }
    tree_stats s = {0};
    walk(out, &s);
    assert_int_equal(s.pngs, 4);
    assert_int_equal(s.bad_pngs, 0);
    assert_int_equal(s.tmps, 0);
    json_t *res = read_results(out), *tok = read_tokens(out);
    assert_int_equal(json_array_size(res), 4);
    assert_int_equal(json_array_size(json_object_get(tok, "images")), 4);
    for (size_t i = 0; i < 4; i++) {
        snprintf(rel, sizeof rel, "0/%zu.png", i);
        assert_string_equal(rec_str(res, i, "file"), rel);
        assert_string_equal(rec_str(res, i, "prompt"), "a red apple");
        assert_string_equal(rec_str(res, i, "model"), "micro-janus");
        assert_string_equal(rec_str(res, i, "policy"), "dense");
        assert_int_equal(rec_int(res, i, "prompt_index"), 0);
        assert_int_equal(rec_int(res, i, "sample"), i);
        assert_int_equal(rec_int(res, i, "image_index"), i);
        assert_int_equal(rec_int(res, i, "images_in_block"), 4);
        assert_int_equal(rec_int(res, i, "n_att"), TOKENS);
        char hex[17];
        tokens_hash(tok, i, hex);
        assert_string_equal(rec_str(res, i, "tokens_fnv1a64"), hex);
    }
    assert_string_not_equal(rec_str(res, 0, "tokens_fnv1a64"), rec_str(res, 1, "tokens_fnv1a64"));
    json_decref(res);
    json_decref(tok);
    tu_rmtree(tmp);
    free(tmp);
}

/* Blocks of 1 and 3 images (3 crosses the prompt boundary and leaves a short last block; its
 * PNGs are written on 3 threads) and --batch auto: same PNG bytes and token hashes. */
static void test_batch_invariance(void **state) {
    (void)state;
    char *tmp = tu_tempdir("cli-batch");
    write_text(tmp, "p.txt", "a red apple\n\nblue car on a road\n");
    static const int batches[] = {1, 3};
    for (int b = 0; b < 2; b++)
        assert_int_equal(gen(tmp, "--prompts p.txt --images-per-prompt 2 --batch %d --threads %d "
                                  "--batching blocks --out b%d",
                             batches[b], batches[b], batches[b]),
                         0);
    /* --batch auto under a budget: whatever it picks, the same images */
    assert_int_equal(gen(tmp, "--prompts p.txt --images-per-prompt 2 --batch auto --gpu-mem 64M "
                              "--out ba"),
                     0);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/b1", tmp);
    json_t *ref = read_results(dir);
    assert_int_equal(json_array_size(ref), 4);
    snprintf(dir, sizeof dir, "%s/ba", tmp);
    json_t *auto_res = read_results(dir);
    assert_int_equal(json_array_size(auto_res), 4);
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(rec_str(auto_res, i, "tokens_fnv1a64"),
                            rec_str(ref, i, "tokens_fnv1a64"));
    json_decref(auto_res);
    for (int b = 1; b < 2; b++) {
        snprintf(dir, sizeof dir, "%s/b%d", tmp, batches[b]);
        json_t *res = read_results(dir);
        assert_int_equal(json_array_size(res), 4);
        for (size_t i = 0; i < 4; i++) {
            assert_string_equal(rec_str(res, i, "tokens_fnv1a64"),
                                rec_str(ref, i, "tokens_fnv1a64"));
            int in_block = i == 3 ? 1 : 3;
            assert_int_equal(rec_int(res, i, "images_in_block"), in_block);
            char a[4200], c[4200];
            snprintf(a, sizeof a, "%s/b1/%s", tmp, rec_str(ref, i, "file"));
            snprintf(c, sizeof c, "%s/%s", dir, rec_str(res, i, "file"));
            size_t na = 0, nc = 0;
            char *da = tu_read_file(a, &na), *dc = tu_read_file(c, &nc);
            assert_non_null(da);
            assert_non_null(dc);
            assert_int_equal(na, nc);
            assert_memory_equal(da, dc, na);
            free(da);
            free(dc);
        }
        json_decref(res);
    }
    assert_string_equal(rec_str(ref, 3, "prompt"), "blue car on a road");
    assert_string_equal(rec_str(ref, 3, "file"), "1/1.png");
    json_decref(ref);
    tu_rmtree(tmp);
    free(tmp);
}

/* --batching continuous (the default) and --batching blocks write the same PNGs and token grids
 * for 5 prompts x 3 images at --batch 4, under every policy. */
static void test_batching(void **state) {
    (void)state;
    static const char *policies[] = {"dense", "window", "streaming", "h2o", "tova", "alisa",
                                     "diagonal", "diagonal-sink4"};
    char *tmp = tu_tempdir("cli-batching");
    write_text(tmp, "p.txt", "a red apple\nblue car\nthree green circles on the left\nsky\n"
                             "a dog\n");
    for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
        const char *sp = strcmp(policies[k], "dense") ? "--sparsity 0.75" : "";
        assert_int_equal(gen(tmp, "--prompts p.txt --images-per-prompt 3 --batch 4 --policy %s %s "
                                  "--out c%zu",
                             policies[k], sp, k),
                         0);
        assert_int_equal(gen(tmp, "--prompts p.txt --images-per-prompt 3 --batch 4 --policy %s %s "
                                  "--batching blocks --out b%zu",
                             policies[k], sp, k),
                         0);
        char c[16], b[16], dir[4096];
        snprintf(c, sizeof c, "c%zu", k);
        snprintf(b, sizeof b, "b%zu", k);
        snprintf(dir, sizeof dir, "%s/%s", tmp, c);
        json_t *res = read_results(dir);
        assert_int_equal(json_array_size(res), 15);
        json_decref(res);
        od_assert_same_outputs(tmp, b, c); /* PNGs, records (timing aside), tokens.json */
    }
    assert_int_equal(gen(tmp, "--batching lockstep --out x"), 2);
    assert_err_has(tmp, "--batching", "lockstep", "continuous, blocks", NULL);
    tu_rmtree(tmp);
    free(tmp);
}

/* --decode sjd with greedy sampling (--top-k 1) is Jacobi decoding: the PNGs and token grids of
 * sequential decoding, each record saying its window; other flags are refused by name. */
static void test_decode_sjd(void **state) {
    (void)state;
    char *tmp = tu_tempdir("cli-sjd");
    write_text(tmp, "p.txt", "a red apple\nblue car\n");
    assert_int_equal(gen(tmp, "--prompts p.txt --images-per-prompt 3 --top-k 1 --out s"), 0);
    assert_int_equal(gen(tmp, "--prompts p.txt --images-per-prompt 3 --top-k 1 --decode sjd "
                              "--draft-len 4 --out j"), 0);
    char a[4200], c[4200];
    snprintf(a, sizeof a, "%s/s", tmp);
    snprintf(c, sizeof c, "%s/j", tmp);
    json_t *ref = read_results(a), *res = read_results(c);
    assert_int_equal(json_array_size(res), 6);
    for (size_t i = 0; i < 6; i++) {
        assert_string_equal(rec_str(res, i, "tokens_fnv1a64"), rec_str(ref, i, "tokens_fnv1a64"));
        assert_int_equal(rec_int(res, i, "draft_len"), 4);
        char pa[4300], pc[4300];
        snprintf(pa, sizeof pa, "%s/%s", a, rec_str(ref, i, "file"));
        snprintf(pc, sizeof pc, "%s/%s", c, rec_str(res, i, "file"));
        size_t na = 0, nc = 0;
        char *da = tu_read_file(pa, &na), *dc = tu_read_file(pc, &nc);
        assert_true(da && dc && na == nc && !memcmp(da, dc, na));
        free(da);
        free(dc);
    }
    json_decref(ref);
    json_decref(res);
    assert_int_equal(gen(tmp, "--decode fast --out x"), 2);
    assert_err_has(tmp, "--decode", "fast", "sequential, sjd", NULL);
    assert_int_equal(gen(tmp, "--decode sjd --policy h2o --sparsity 0.5 --out y"), 1);
    assert_err_has(tmp, "draft_len", "h2o", NULL); /* its lists need every step's scores */
    tu_rmtree(tmp);
    free(tmp);
}

/* --decode gsd (grouped acceptance, lossy): images and records saying the window and the group,
 * the sjd line with the group and the drafts kept by row; --resume refuses another group (or
 * exact SJD) by the flag; --group without gsd, a group out of range and gsd on a text model are
 * refused by name. */
static void test_decode_gsd(void **state) {
    (void)state;
    char *tmp = tu_tempdir("cli-gsd");
    assert_int_equal(gen(tmp, "--prompt 'a red apple' --images-per-prompt 3 --decode gsd "
                              "--draft-len 4 --group 5 --out g"), 0);
    assert_err_has(tmp, "sjd: ", "window 4, group 5: lossy", "drafts kept by row: ", NULL);
    char out[4200];
    snprintf(out, sizeof out, "%s/g", tmp);
    json_t *res = read_results(out);
    assert_int_equal(json_array_size(res), 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(rec_int(res, i, "draft_len"), 4);
        assert_int_equal(rec_int(res, i, "sjd_group"), 5);
        assert_png(out, rec_str(res, i, "file"), SIDE, SIDE);
    }
    json_decref(res);
    assert_int_equal(gen(tmp, "--prompt 'a red apple' --images-per-prompt 3 --decode gsd "
                              "--draft-len 4 --group 6 --resume --out g"), 2);
    assert_err_has(tmp, "sjd_group", "--decode gsd / --group", NULL);
    assert_int_equal(gen(tmp, "--prompt 'a red apple' --images-per-prompt 3 --decode sjd "
                              "--draft-len 4 --resume --out g"), 2);
    assert_err_has(tmp, "sjd_group", NULL);
    assert_int_equal(gen(tmp, "--decode sjd --group 3 --out x"), 2);
    assert_err_has(tmp, "--group", "--decode gsd", NULL);
    assert_int_equal(gen(tmp, "--decode gsd --group 65 --out x"), 2);
    assert_err_has(tmp, "--group", NULL);
    assert_int_equal(tu_system("cd '%s' && '%s' generate --cpu --arch micro-opt --quiet "
                               "--max-new-tokens 8 --decode gsd --out t 2>err.txt", tmp, g_bin),
                     1);
    assert_err_has(tmp, "sjd_group", "text", NULL);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_geneval(void **state) {
    (void)state;
    char *tmp = tu_tempdir("cli-geneval");
    static const char *lines[2] = {
        "{\"tag\": \"single_object\", \"include\": [{\"class\": \"bench\", \"count\": 1}], "
        "\"prompt\": \"a photo of a bench\"}",
        "{\"tag\": \"colors\", \"prompt\": \"a photo of a red car\"}"};
    char meta[1024];
    snprintf(meta, sizeof meta, "%s\n\n%s\n", lines[0], lines[1]);
    write_text(tmp, "evaluation_metadata.jsonl", meta);
    assert_int_equal(gen(tmp, "--layout geneval --prompts evaluation_metadata.jsonl "
                              "--images-per-prompt 2 --out g"),
                     0);
    char out[4096], path[4300], rel[64];
    snprintf(out, sizeof out, "%s/g", tmp);
    for (int p = 0; p < 2; p++) {
        snprintf(path, sizeof path, "%s/%05d/metadata.jsonl", out, p);
        char *got = tu_read_file(path, NULL);
        assert_non_null(got);
        snprintf(meta, sizeof meta, "%s\n", lines[p]);
        assert_string_equal(got, meta);
        free(got);
        for (int k = 0; k < 2; k++) {
            snprintf(rel, sizeof rel, "%05d/samples/%04d.png", p, k);
            assert_png(out, rel, SIDE, SIDE);
        }
    }
    tree_stats s = {0};
    walk(out, &s);
    assert_int_equal(s.pngs, 4);
    assert_int_equal(s.tmps, 0);
    json_t *res = read_results(out);
    assert_int_equal(json_array_size(res), 4);
    assert_string_equal(rec_str(res, 3, "file"), "00001/samples/0001.png");
    assert_string_equal(rec_str(res, 3, "prompt"), "a photo of a red car");
    json_decref(res);
    tu_rmtree(tmp);
    free(tmp);
}

/* Cell (col, row) of a grid image w pixels wide equals img (SIDE x SIDE; NULL = black). */
static int cell_equal(const uint8_t *grid, int w, int col, int row, const uint8_t *img) {
    for (int y = 0; y < SIDE; y++) {
        const uint8_t *g = grid + ((size_t)(row * SIDE + y) * w + (size_t)col * SIDE) * 3;
        for (int x = 0; x < SIDE * 3; x++)
            if (g[x] != (img ? img[(size_t)y * SIDE * 3 + x] : 0)) return 0;
    }
    return 1;
}

/* Grid d/<id>.png vs the plain-layout samples p/0/<k>.png of the same prompt. */
static void assert_grid(const char *tmp, const char *id, int n) {
    char path[4300];
    snprintf(path, sizeof path, "%s/d/%s.png", tmp, id);
    int w, h, sw, sh;
    uint8_t *grid = png_load(path, &w, &h);
    assert_non_null(grid);
    assert_int_equal(w, 2 * SIDE); /* 3 and 4 samples: ceil(sqrt n) = 2 columns, 2 rows */
    assert_int_equal(h, 2 * SIDE);
    for (int k = 0; k < 4; k++) {
        uint8_t *img = NULL;
        if (k < n) {
            snprintf(path, sizeof path, "%s/p/0/%d.png", tmp, k);
            img = png_load(path, &sw, &sh);
            assert_non_null(img);
        }
        if (!cell_equal(grid, w, k % 2, k / 2, img)) fail_msg("%s.png: cell %d differs", id, k);
        free(img);
    }
    free(grid);
}

static void test_dpg(void **state) {
    (void)state;
    char *tmp = tu_tempdir("cli-dpg");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/prompts", tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    write_text(dir, "zebra_1.txt", "a zebra next to a tree\n");
    write_text(dir, "apple_7.txt", "  two green apples \n");
    write_text(dir, "README.md", "not a prompt");
    /* folder form, N = 4: 2x2 grid of the samples the plain layout writes for that prompt */
    assert_int_equal(gen(tmp, "--layout dpg --prompts prompts --batch 3 --out d"), 0);
    assert_int_equal(gen(tmp, "--prompt 'two green apples' --out p"), 0);
    assert_grid(tmp, "apple_7", 4);
    snprintf(dir, sizeof dir, "%s/d", tmp);
    assert_png(dir, "zebra_1.png", 2 * SIDE, 2 * SIDE);
    tree_stats s = {0};
    walk(dir, &s);
    assert_int_equal(s.pngs, 2);
    assert_int_equal(s.tmps, 0);
    json_t *res = read_results(dir);
    assert_int_equal(json_array_size(res), 8);
    assert_string_equal(rec_str(res, 3, "file"), "apple_7.png");
    assert_string_equal(rec_str(res, 5, "file"), "zebra_1.png");
    assert_string_equal(rec_str(res, 5, "prompt"), "a zebra next to a tree");
    json_decref(res);
    /* tab form, N = 3: the first 3 of the same samples, the fourth cell stays black */
    write_text(tmp, "dpg.tsv", "apple_7\ttwo green apples\n");
    assert_int_equal(gen(tmp, "--layout dpg --prompts dpg.tsv --images-per-prompt 3 --out d"), 0);
    assert_grid(tmp, "apple_7", 3);
    res = read_results(dir);
    assert_int_equal(json_array_size(res), 3);
    json_decref(res);
    tu_rmtree(tmp);
    free(tmp);
}

/* Start a long generate, signal it once its first PNG exists, check what it left. */
static void interrupt_run(const char *layout_args, const char *first_png, int sig,
                          int images_per_png) {
    char *tmp = tu_tempdir("cli-sig");
    char dir[4096], png[4300];
    snprintf(dir, sizeof dir, "%s/prompts", tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    char list[1024] = "";
    for (int i = 0; i < 10; i++) { /* 10 prompts x 4 images, as a folder and as a file */
        char name[32], text[64];
        snprintf(name, sizeof name, "p%02d.txt", i);
        snprintf(text, sizeof text, "prompt number %d\n", i);
        write_text(dir, name, text);
        strcat(list, text);
    }
    write_text(tmp, "prompts.txt", list);
    snprintf(png, sizeof png, "%s/o/%s", tmp, first_png);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && exec '%s' generate --cpu --arch micro-janus --quiet --batch 1 "
             "--images-per-prompt 4 %s --out o 2>err.txt",
             tmp, g_bin, layout_args);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0, waited = 0;
    for (int i = 0; i < 60000 && access(png, F_OK) != 0; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            waited = 1;
            break;
        }
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    if (waited) fail_msg("generate ended (status %d) before it could be interrupted", status);
    assert_int_equal(kill(pid, sig), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 128 + sig);
    assert_err_has(tmp, "interrupted after", (char *)NULL);
    snprintf(dir, sizeof dir, "%s/o", tmp);
    tree_stats s = {0};
    walk(dir, &s);
    assert_true(s.pngs >= 1);
    assert_int_equal(s.bad_pngs, 0);
    assert_int_equal(s.tmps, 0);
    json_t *res = read_results(dir), *tok = read_tokens(dir);
    assert_int_equal(json_array_size(res), (size_t)s.pngs * (size_t)images_per_png);
    assert_true(json_array_size(res) < 40); /* it really stopped early */
    assert_true(json_array_size(json_object_get(tok, "images")) >= json_array_size(res));
    for (size_t i = 0; i < json_array_size(res); i++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%s", dir, rec_str(res, i, "file"));
        assert_int_equal(access(path, R_OK), 0);
    }
    json_decref(res);
    json_decref(tok);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_sigint_plain(void **state) {
    (void)state;
    interrupt_run("--prompts prompts.txt", "0/0.png", SIGINT, 1);
}

static void test_sigterm_dpg(void **state) {
    (void)state;
    interrupt_run("--layout dpg --prompts prompts", "p00.png", SIGTERM, 4);
}

static void test_errors(void **state) {
    (void)state;
    char *tmp = tu_tempdir("cli-err");
    assert_int_equal(gen(tmp, "--layout coco --out o"), 2);
    assert_err_has(tmp, "--layout", "coco", "plain, geneval, dpg", (char *)NULL);
    assert_int_equal(gen(tmp, "--layout geneval --out o"), 2);
    assert_err_has(tmp, "--prompts", (char *)NULL);
    write_text(tmp, "meta.jsonl", "{\"prompt\": \"a dog\"}\n{\"prompt\": \"a cat\"\n");
    assert_int_equal(gen(tmp, "--layout geneval --prompts meta.jsonl --out o"), 2);
    assert_err_has(tmp, "meta.jsonl", "line 2", "JSON", (char *)NULL);
    write_text(tmp, "meta.jsonl", "{\"tag\": \"colors\"}\n");
    assert_int_equal(gen(tmp, "--layout geneval --prompts meta.jsonl --out o"), 2);
    assert_err_has(tmp, "meta.jsonl", "line 1", "\"prompt\"", (char *)NULL);
    write_text(tmp, "dpg.tsv", "a1\tone\nno tab here\n");
    assert_int_equal(gen(tmp, "--layout dpg --prompts dpg.tsv --out o"), 2);
    assert_err_has(tmp, "dpg.tsv line 2", "<TAB>", (char *)NULL);
    write_text(tmp, "dpg.tsv", "a1\tone\na1\ttwo\n");
    assert_int_equal(gen(tmp, "--layout dpg --prompts dpg.tsv --out o"), 2);
    assert_err_has(tmp, "'a1' appears twice", (char *)NULL);
    assert_int_equal(gen(tmp, "--prompts missing.txt --out o"), 2);
    assert_err_has(tmp, "missing.txt", (char *)NULL);
    assert_int_equal(gen(tmp, "--prompt x --batch 2x --out o"), 2);
    assert_err_has(tmp, "--batch", "2x", (char *)NULL);
    assert_int_equal(gen(tmp, "--prompt x --batch auto --out o"), 2); /* CPU, no budget */
    assert_err_has(tmp, "--batch auto", "--gpu-mem", (char *)NULL);
    /* a regular file where the output folder should be: no folder can be made under it */
    write_text(tmp, "file", "x");
    assert_int_equal(gen(tmp, "--prompt x --out file/o"), 1);
    assert_err_has(tmp, "--out", "file/o", (char *)NULL);
    assert_int_equal(gen(tmp, "--prompt x --out file"), 1);
    assert_err_has(tmp, "--out", (char *)NULL);
    tu_rmtree(tmp);
    free(tmp);
}

int main(void) {
    g_bin = getenv("FLEXDIAG_BIN");
    if (!g_bin || access(g_bin, X_OK) != 0) {
        fprintf(stderr, "FLEXDIAG_BIN (the flexdiag binary) is not executable: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_batching),
        cmocka_unit_test(test_decode_sjd),   cmocka_unit_test(test_decode_gsd),
        cmocka_unit_test(test_geneval),      cmocka_unit_test(test_dpg),
        cmocka_unit_test(test_sigint_plain), cmocka_unit_test(test_sigterm_dpg),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
