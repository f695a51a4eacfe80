/*
 * test_fault_io.c - every output writer under failing file calls, through the test-only builds
 * flexdiag-fault and flexdiag-bench-fault ($FLEXDIAG_FAULT_BIN, $FLEXDIAG_FAULT_BENCH_BIN; see
 * fault_io.c for the $FLEXDIAG_FAULT rules).
 *
 * Writers: generate's PNGs, results.jsonl, tokens.json and GenEval metadata.jsonl (plain, GenEval
 * and DPG layouts), the .npy files of `score --out` and `decode --raw` (and decode's PNGs), the
 * --json rows of `bench` and `bench fidelity` (synthetic and model-backed). Each case injects
 * one fault (short writes: must succeed, retried; EIO / ENOSPC on the first write and after some
 * images or rows; fsync, close, rename and open failures) and checks the exit code, that the
 * first stderr line names the file and the error, that the fault really fired (fault log), and
 * that what is left is whole and consistent, read with readers independent of the writers:
 * results.jsonl line by line with jansson, tokens.json listing exactly the images of
 * results.jsonl (token hashes recomputed), every PNG complete (libpng) and listed, no temp file
 * except a tokens.json temp the message names; JSON rows whole lines only. micro-janus on the
 * CPU (8x8 tokens, 32x32 pixels) and a tiny random VQ decoder for `decode`.
 */
#include <dirent.h>
#include <jansson.h>
#include <png.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/npy.h"
#include "tiny_vq.h"
#include "util.h"

#define SIDE 32   /* micro-janus image side in pixels */
#define TOKENS 64 /* micro-janus tokens per image */

static const char *g_gen;   /* $FLEXDIAG_FAULT_BIN */
static const char *g_bench; /* $FLEXDIAG_FAULT_BENCH_BIN */
static char *g_root;        /* this run's temp folder */
static int g_case;          /* cases so far: each runs in g_root/c<N> */

/* ---- running ---- */

/* A fresh folder for one case, malloc'ed. */
static char *case_dir(void) {
    char *d = NULL;
    assert_true(asprintf(&d, "%s/c%03d", g_root, ++g_case) > 0);
    assert_int_equal(mkdir(d, 0755), 0);
    return d;
}

/* Run bin with args in dir under fault spec (NULL: none): stdout to out.txt, stderr to err.txt,
 * injected faults logged to fault.log. Returns the exit status. */
__attribute__((format(printf, 4, 5))) static int run(const char *dir, const char *bin,
                                                     const char *fault, const char *fmt, ...) {
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_system("cd '%s' && rm -f fault.log && FLEXDIAG_FAULT='%s' "
                     "FLEXDIAG_FAULT_LOG=fault.log '%s' %s >out.txt 2>err.txt",
                     dir, fault ? fault : "", bin, args);
}

/* dir/name, malloc'ed. */
static char *join(const char *dir, const char *name) {
    char *path = NULL;
    assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
    return path;
}

static char *read_in(const char *dir, const char *name, size_t *n) {
    char *path = join(dir, name);
    char *text = tu_read_file(path, n);
    free(path);
    return text;
}

static int exists_in(const char *dir, const char *name) {
    char *path = join(dir, name);
    int ok = access(path, F_OK) == 0;
    free(path);
    return ok;
}

/* The first stderr line that is not a progress line ("[1/3] ...") names every needle. */
static void assert_first_line(const char *dir, const char *n1, const char *n2) {
    char *err = read_in(dir, "err.txt", NULL), *line = err;
    assert_non_null(err);
    while (*line == '[' && strchr(line, '\n')) line = strchr(line, '\n') + 1;
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    if (!strstr(line, n1) || !strstr(line, n2))
        fail_msg("first stderr line '%s' lacks '%s' or '%s'", line, n1, n2);
    free(err);
}

/* The case's fault really fired. */
static void assert_fired(const char *dir) {
    if (!exists_in(dir, "fault.log")) fail_msg("%s: the injected fault never fired", dir);
}

/* ---- reading what is left ---- */

/* Decodes fully as an 8-bit RGB PNG (libpng's reader). */
static int png_ok(const char *path) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) return 0;
    im.format = PNG_FORMAT_RGB;
    uint8_t *px = malloc(PNG_IMAGE_SIZE(im));
    int ok = px && png_image_finish_read(&im, NULL, px, 0, NULL);
    if (!ok) png_image_free(&im);
    free(px);
    return ok;
}

typedef struct tree {
    int pngs, bad_pngs; /* *.png files, of which not complete */
    int tmps;           /* *.tmp.* files */
    char tokens_tmp[4400]; /* path of a tokens.json.tmp.* file, if any */
} tree;

static void walk(const char *dir, tree *t) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        size_t n = strlen(e->d_name);
        if (S_ISDIR(st.st_mode)) {
            walk(path, t);
        } else if (strstr(e->d_name, ".tmp.")) {
            t->tmps++;
            if (!strncmp(e->d_name, "tokens.json.tmp.", 16))
                snprintf(t->tokens_tmp, sizeof t->tokens_tmp, "%s", path);
        } else if (n > 4 && !strcmp(e->d_name + n - 4, ".png")) {
            t->pngs++;
            t->bad_pngs += !png_ok(path);
        }
    }
    closedir(d);
}

/* Whole lines of a JSON-lines text, each an object, as an array. */
static json_t *parse_lines(const char *text, size_t n, const char *what) {
    if (n && text[n - 1] != '\n') fail_msg("%s ends in a partial line", what);
    json_t *all = json_array();
    for (const char *line = text; line < text + n;) {
        const char *nl = strchr(line, '\n');
        json_error_t e;
        json_t *r = json_loadb(line, (size_t)(nl - line), 0, &e);
        if (!json_is_object(r)) fail_msg("%s line %zu: %s", what, json_array_size(all) + 1, e.text);
        json_array_append_new(all, r);
        line = nl + 1;
    }
    return all;
}

/* FNV-1a 64 of a tokens.json grid (ids as little-endian int32), as hex. */
static void grid_hash(json_t *grid, char hex[17]) {
    size_t count = 0;
    uint64_t h = tu_grid_fnv1a64(grid, &count);
    assert_int_equal(count, TOKENS);
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

/* tokens.json, or the temp file a failed run kept (completed with its tail when the failure
 * left that out), parsed. */
static json_t *load_tokens(const char *path) {
    size_t n = 0;
    char *text = tu_read_file(path, &n);
    assert_non_null(text);
    json_error_t e;
    json_t *j = json_loadb(text, n, 0, &e);
    if (!j) {
        char *whole = NULL;
        assert_true(asprintf(&whole, "%s\n]}\n", text) > 0);
        j = json_loads(whole, 0, &e);
        free(whole);
    }
    if (!j) fail_msg("%s does not parse: %s", path, e.text);
    free(text);
    return j;
}

/* generate's --out o of case dir is consistent: results.jsonl whole lines; tokens.json (or,
 * when kept is set, the temp file the message names instead) lists exactly its images with the
 * same token hashes; every listed PNG complete, no PNG unlisted, no other temp file. Returns the
 * number of images. */
static int check_generate(const char *dir, int kept) {
    char out[4400];
    snprintf(out, sizeof out, "%s/o", dir);
    size_t n = 0;
    char *text = read_in(out, "results.jsonl", &n);
    assert_non_null(text);
    json_t *res = parse_lines(text, n, "results.jsonl");
    free(text);
    tree t = {0};
    walk(out, &t);
    assert_int_equal(t.bad_pngs, 0);
    assert_int_equal(t.tmps, kept ? 1 : 0);
    char tok_path[8800];
    snprintf(tok_path, sizeof tok_path, "%s/tokens.json", out);
    if (kept) {
        assert_true(t.tokens_tmp[0]);
        assert_false(exists_in(out, "tokens.json"));
        char *err = read_in(dir, "err.txt", NULL);
        if (!strstr(err, strrchr(t.tokens_tmp, '/') + 1))
            fail_msg("stderr '%s' does not name the kept %s", err, t.tokens_tmp);
        free(err);
        snprintf(tok_path, sizeof tok_path, "%s", t.tokens_tmp);
    }
    json_t *tok = load_tokens(tok_path), *imgs = json_object_get(tok, "images");
    assert_int_equal(json_array_size(imgs), json_array_size(res));
    json_t *files = json_object();
    for (size_t i = 0; i < json_array_size(res); i++) {
        json_t *r = json_array_get(res, i), *g = json_array_get(imgs, i);
        assert_int_equal(json_integer_value(json_object_get(r, "image_index")),
                         json_integer_value(json_object_get(g, "image_index")));
        char hex[17];
        grid_hash(json_object_get(g, "grid"), hex);
        assert_string_equal(json_string_value(json_object_get(r, "tokens_fnv1a64")), hex);
        const char *file = json_string_value(json_object_get(r, "file"));
        char png[4600];
        snprintf(png, sizeof png, "%s/%s", out, file);
        if (!png_ok(png)) fail_msg("%s is listed in results.jsonl but not a complete PNG", png);
        json_object_set_new(files, file, json_true());
    }
    assert_int_equal(json_object_size(files), t.pngs); /* every PNG listed */
    int images = (int)json_array_size(res);
    json_decref(files);
    json_decref(tok);
    json_decref(res);
    return images;
}

/* ---- generate ---- */

typedef struct gen_case {
    const char *fault;      /* $FLEXDIAG_FAULT */
    int rc;                 /* exit code */
    const char *file, *err; /* in the first stderr line (rc 1) */
    int min, max;           /* images left, inclusive */
    int kept;               /* the tokens.json temp file is kept */
} gen_case;

/* 3 images in 3 blocks. Kept small: a micro-janus image costs ~1.5 s to generate and decode in
 * the sanitizer build, and a run stops at its failure. */
#define PLAIN "--prompt x --images-per-prompt 3 --batch 1 --out o"
#define ONE "--prompt x --images-per-prompt 1 --out o" /* runs that fail only at the end */
/* one thread: faster than two on the 2-core CI machines, where two tests run at once */
#define GEN "generate --cpu --arch micro-janus --quiet --threads 1"
#define ENOSPC_TEXT "No space left on device"
#define EIO_TEXT "Input/output error"

static void write_text(const char *dir, const char *name, const char *text) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* Each case in its own folder (holding file name with text, when name is not NULL). */
static void run_gen_cases(const gen_case *cases, size_t n, const char *args, const char *name,
                          const char *text) {
    for (size_t i = 0; i < n; i++) {
        const gen_case *c = &cases[i];
        char *dir = case_dir();
        if (name) write_text(dir, name, text);
        int rc = run(dir, g_gen, c->fault, GEN " %s", args);
        if (rc != c->rc) fail_msg("%s: exit %d, want %d", c->fault, rc, c->rc);
        if (c->rc) {
            assert_first_line(dir, c->file, c->err);
            assert_fired(dir);
        }
        int images = check_generate(dir, c->kept);
        if (images < c->min || images > c->max)
            fail_msg("%s: %d image(s) left, want %d..%d", c->fault, images, c->min, c->max);
        free(dir);
    }
}

static void test_generate_png(void **state) {
    (void)state;
    static const gen_case cases[] = {
        {"write:EIO:path=.png", 1, "0/0.png", EIO_TEXT, 0, 0, 0},
        /* ~2950-byte PNGs: the second is cut short */
        {"write:ENOSPC:after_bytes=4000:path=.png", 1, "0/1.png", ENOSPC_TEXT, 1, 1, 0},
        {"rename:EXDEV:path=.png", 1, "0/0.png", "Invalid cross-device link", 0, 0, 0},
    };
    run_gen_cases(cases, sizeof cases / sizeof cases[0], PLAIN, NULL, NULL);
    /* one block whose PNGs are written on 3 threads: whichever write fails, the images before
     * it are committed and every PNG after it is taken back */
    static const gen_case parallel[] = {
        {"write:EIO:nth=2:path=.png", 1, ".png", EIO_TEXT, 0, 1, 0},
    };
    run_gen_cases(parallel, 1, "--prompt x --images-per-prompt 3 --batch 3 --threads 3 --out o",
                  NULL, NULL);
}

static void test_generate_results(void **state) {
    (void)state;
    static const gen_case cases[] = {
        {"write:EIO:path=results.jsonl", 1, "results.jsonl", EIO_TEXT, 0, 0, 0},
        /* ~290-byte lines: the second is cut short, then taken back */
        {"write:ENOSPC:after_bytes=400:path=results.jsonl", 1, "results.jsonl", ENOSPC_TEXT, 1,
         1, 0},
        {"fsync:EIO:nth=2:path=results.jsonl", 1, "results.jsonl", EIO_TEXT, 1, 1, 0},
    };
    run_gen_cases(cases, sizeof cases / sizeof cases[0], PLAIN, NULL, NULL);
    static const gen_case at_end[] = {
        {"close:EIO:path=results.jsonl", 1, "results.jsonl", "close failed", 1, 1, 0},
    };
    run_gen_cases(at_end, 1, ONE, NULL, NULL);
    /* results.jsonl cannot be opened: nothing is generated, nothing written */
    char *dir = case_dir();
    assert_int_equal(run(dir, g_gen, "open:EROFS:path=results.jsonl", GEN " " PLAIN), 1);
    assert_first_line(dir, "results.jsonl", "Read-only file system");
    assert_false(exists_in(dir, "o/results.jsonl"));
    assert_false(exists_in(dir, "o/tokens.json"));
    assert_false(exists_in(dir, "o/0"));
    free(dir);
}

static void test_generate_tokens(void **state) {
    (void)state;
    /* tokens.json temp: head and tail on open (2 writes), then record + tail per image; a
     * persistent failure also fails putting the tail back, so the temp file is kept (and named)
     * with the records before it; a failure once is repaired and tokens.json completed */
    static const gen_case cases[] = {
        {"write:EIO:nth=3:path=tokens.json", 1, "tokens.json", EIO_TEXT, 0, 0, 1},
        {"write:EIO:nth=5:once:path=tokens.json", 1, "tokens.json", EIO_TEXT, 1, 1, 0},
        /* 45 bytes of head and tail, ~340-byte records: the second is cut short */
        {"write:ENOSPC:after_bytes=600:path=tokens.json", 1, "tokens.json", ENOSPC_TEXT, 1, 1,
         1},
    };
    run_gen_cases(cases, sizeof cases / sizeof cases[0], PLAIN, NULL, NULL);
    static const gen_case at_end[] = {
        {"fsync:EIO:path=tokens.json", 1, "tokens.json", EIO_TEXT, 1, 1, 1},
        {"rename:EXDEV:path=tokens.json", 1, "tokens.json", "Invalid cross-device link", 1, 1,
         1},
    };
    run_gen_cases(at_end, sizeof at_end / sizeof at_end[0], ONE, NULL, NULL);
    char *dir = case_dir();
    assert_int_equal(run(dir, g_gen, "open:EROFS:path=tokens.json", GEN " " PLAIN), 1);
    assert_first_line(dir, "tokens.json", "Read-only file system");
    size_t n = 1;
    char *res = read_in(dir, "o/results.jsonl", &n);
    assert_non_null(res);
    assert_int_equal(n, 0);
    free(res);
    assert_false(exists_in(dir, "o/tokens.json"));
    free(dir);
}

/* GenEval: a prompt whose metadata.jsonl (or first sample) fails leaves no folder behind. */
static void test_generate_geneval(void **state) {
    (void)state;
    static const gen_case cases[] = {
        {"write:ENOSPC:nth=2:path=metadata.jsonl", 1, "00001/metadata.jsonl", ENOSPC_TEXT, 1, 1,
         0},
        {"rename:EXDEV:path=metadata.jsonl", 1, "00000/metadata.jsonl",
         "Invalid cross-device link", 0, 0, 0},
        {"write:EIO:nth=2:path=.png", 1, "00001/samples/0000.png", EIO_TEXT, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = case_dir();
        write_text(dir, "meta.jsonl", "{\"prompt\": \"a photo of a bench\"}\n"
                                      "{\"prompt\": \"a photo of a red car\"}\n");
        assert_int_equal(run(dir, g_gen, cases[i].fault,
                             GEN " --layout geneval --prompts meta.jsonl --images-per-prompt 1 "
                                 "--out o"),
                         1);
        assert_first_line(dir, cases[i].file, cases[i].err);
        assert_fired(dir);
        int images = check_generate(dir, 0);
        assert_int_equal(images, cases[i].min);
        /* prompt folders: complete (metadata + samples) or absent */
        for (int p = 0; p < 2; p++) {
            char meta[64], sample[64];
            snprintf(meta, sizeof meta, "o/%05d/metadata.jsonl", p);
            snprintf(sample, sizeof sample, "o/%05d/samples/0000.png", p);
            int done = p < images;
            assert_int_equal(exists_in(dir, meta), done);
            assert_int_equal(exists_in(dir, sample), done);
            snprintf(meta, sizeof meta, "o/%05d", p);
            assert_int_equal(exists_in(dir, meta), done);
        }
        free(dir);
    }
}

/* DPG: a prompt's records go with its grid, or not at all. */
static void test_generate_dpg(void **state) {
    (void)state;
    static const gen_case cases[] = {
        {"write:EIO:path=.png", 1, "p0.png", EIO_TEXT, 0, 0, 0},
        {"write:ENOSPC:after_bytes=400:path=results.jsonl", 1, "results.jsonl", ENOSPC_TEXT, 0,
         0, 0},
    };
    run_gen_cases(cases, sizeof cases / sizeof cases[0],
                  "--layout dpg --prompts dpg.tsv --images-per-prompt 2 --out o", "dpg.tsv",
                  "p0\ta zebra next to a tree\np1\ttwo green apples\n");
}

static void test_generate_short_writes(void **state) {
    (void)state;
    static const gen_case cases[] = {{"write:short", 0, NULL, NULL, 3, 3, 0}};
    run_gen_cases(cases, 1, PLAIN, NULL, NULL);
}

/* ---- .npy: score --out, decode --raw (and decode's PNGs) ---- */

static void assert_no_tmp(const char *dir) {
    tree t = {0};
    walk(dir, &t);
    assert_int_equal(t.tmps, 0);
    assert_int_equal(t.bad_pngs, 0);
}

static void test_npy_score(void **state) {
    (void)state;
    static const struct {
        const char *fault, *err;
    } cases[] = {
        {"write:short", NULL},
        {"write:ENOSPC:path=.npy", ENOSPC_TEXT},
        {"write:EIO:nth=2:path=.npy", EIO_TEXT},
        {"fsync:EIO:path=.npy", EIO_TEXT},
        {"rename:EXDEV:path=.npy", "Invalid cross-device link"},
        {"open:EROFS:path=.npy", "Read-only file system"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = case_dir();
        write_text(dir, "in.json", "{\"prompt_ids\": [1, 5, 7, 9], \"image_ids\": [3, 4, 5]}");
        int rc = run(dir, g_gen, cases[i].fault,
                     "score --cpu --arch micro-janus --input in.json --out l.npy --raw");
        assert_no_tmp(dir);
        if (!cases[i].err) {
            assert_int_equal(rc, 0);
            flexdiag_npy a;
            char path[4400];
            snprintf(path, sizeof path, "%s/l.npy", dir);
            assert_int_equal(flexdiag__npy_read(path, &a), FLEXDIAG_OK);
            assert_int_equal(a.ndim, 3);
            assert_int_equal(a.shape[1], 3);
            flexdiag__npy_free(&a);
        } else {
            assert_int_equal(rc, 1);
            assert_first_line(dir, "l.npy", cases[i].err);
            assert_fired(dir);
            assert_false(exists_in(dir, "l.npy"));
        }
        free(dir);
    }
}

/* An output path that is not a regular file is written in place, never replaced by one: a
 * link to /dev/null stays a link to the device, a FIFO stays a FIFO (its reader gets the bytes);
 * a folder is refused naming it. */
static void test_output_not_regular(void **state) {
    (void)state;
    char *dir = case_dir();
    write_text(dir, "in.json", "{\"prompt_ids\": [1, 5, 7, 9], \"image_ids\": [3, 4, 5]}");
    char *link = join(dir, "null.npy"), *fifo = join(dir, "pipe.npy"), *sub = join(dir, "sub");
    assert_int_equal(symlink("/dev/null", link), 0);
    assert_int_equal(run(dir, g_gen, NULL, "score --cpu --arch micro-janus --input in.json "
                                          "--out null.npy"), 0);
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(stat("/dev/null", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(mkfifo(fifo, 0644), 0);
    pid_t reader = fork(); /* the FIFO's reader: everything into got.npy */
    assert_true(reader >= 0);
    if (reader == 0) {
        execlp("sh", "sh", "-c", "cd \"$0\" && exec cat pipe.npy > got.npy", dir, (char *)NULL);
        _exit(127);
    }
    assert_int_equal(run(dir, g_gen, NULL, "score --cpu --arch micro-janus --input in.json "
                                          "--out pipe.npy"), 0);
    int ws = 0;
    assert_int_equal(waitpid(reader, &ws, 0), reader);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    size_t n = 0;
    char *got = read_in(dir, "got.npy", &n);
    assert_true(n > 6);
    assert_memory_equal(got, "\x93NUMPY", 6);
    free(got);
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_not_equal(run(dir, g_gen, NULL, "score --cpu --arch micro-janus --input in.json "
                                              "--out sub"), 0);
    assert_first_line(dir, "sub", "is a folder");
    assert_no_tmp(dir);
    free(link), free(fifo), free(sub), free(dir);
}

/* 3x3-token VQ decoder writing 12x12 images (tests/image/tiny_vq.c), as a model folder. */
static void write_decoder(const char *dir) {
    flexdiag_vq_config c = tv_tiny_config();
    tv_model m;
    tv_build(&m, &c, 3);
    char path[4400];
    snprintf(path, sizeof path, "%s/vq", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(tv_write(&m, path, 1, NULL), 0);
    tv_free(&m);
    int64_t ids[3 * 9], shape[2] = {3, 9};
    for (int i = 0; i < 3 * 9; i++) ids[i] = (i * 7) % 40;
    snprintf(path, sizeof path, "%s/tokens.npy", dir);
    assert_int_equal(flexdiag__npy_write(path, FLEXDIAG_NPY_I64, 2, shape, ids), FLEXDIAG_OK);
}

static void test_npy_decode(void **state) {
    (void)state;
    static const struct {
        const char *fault, *file, *err;
        int pngs, raw; /* PNGs and raw.npy left */
    } cases[] = {
        {"write:short", NULL, NULL, 3, 1},
        {"write:EIO:nth=2:path=.png", "png/1.png", EIO_TEXT, 1, 0},
        {"write:ENOSPC:after_bytes=100:path=raw.npy", "raw.npy", ENOSPC_TEXT, 3, 0},
        {"fsync:EIO:path=raw.npy", "raw.npy", EIO_TEXT, 3, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = case_dir();
        write_decoder(dir);
        int rc = run(dir, g_gen, cases[i].fault,
                     "decode --cpu --model vq --tokens tokens.npy --out png --raw raw.npy "
                     "--batch 1");
        assert_int_equal(rc, cases[i].file ? 1 : 0);
        if (cases[i].file) {
            assert_first_line(dir, cases[i].file, cases[i].err);
            assert_fired(dir);
        }
        tree t = {0};
        walk(dir, &t);
        assert_int_equal(t.tmps, 0);
        assert_int_equal(t.bad_pngs, 0);
        assert_int_equal(t.pngs, cases[i].pngs);
        assert_int_equal(exists_in(dir, "raw.npy"), cases[i].raw);
        free(dir);
    }
}

/* ---- bench and bench fidelity --json ---- */

/* Lines of dir/name (whole JSON lines only), or -1 when the file does not exist. */
static int json_rows(const char *dir, const char *name) {
    size_t n = 0;
    char *text = read_in(dir, name, &n);
    if (!text) return -1;
    json_t *rows = parse_lines(text, n, name);
    int count = (int)json_array_size(rows);
    json_decref(rows);
    free(text);
    return count;
}

/* Markdown rows on stdout (lines starting with "| " that are not the header). */
static int md_rows(const char *dir) {
    char *out = read_in(dir, "out.txt", NULL);
    assert_non_null(out);
    int n = 0;
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        n += !strncmp(l, "| ", 2) && strncmp(l, "| policy", 8);
    free(out);
    return n;
}

typedef struct row_case {
    const char *fault, *err; /* err NULL: the run succeeds */
    int stdout_rows, file_rows;
} row_case;

static void run_row_cases(const row_case *cases, size_t n, const char *args) {
    for (size_t i = 0; i < n; i++) {
        const row_case *c = &cases[i];
        char *dir = case_dir();
        int rc = run(dir, g_bench, c->fault, "%s --json rows.jsonl", args);
        assert_int_equal(rc, c->err ? 1 : 0);
        if (c->err) {
            assert_first_line(dir, "rows.jsonl", c->err);
            assert_fired(dir);
        }
        if (md_rows(dir) != c->stdout_rows)
            fail_msg("%s: %d row(s) on stdout, want %d", c->fault, md_rows(dir), c->stdout_rows);
        if (json_rows(dir, "rows.jsonl") != c->file_rows)
            fail_msg("%s: %d row(s) in rows.jsonl, want %d", c->fault, json_rows(dir, "rows.jsonl"),
                     c->file_rows);
        free(dir);
    }
}

#define BENCH                                                                                      \
    "bench --cpu --arch micro-janus --random-weights --batch 1 --steps 4 --profile-steps 1"

static void test_bench_json(void **state) {
    (void)state;
    /* Each run measures the roofline (seconds under sanitizers), so one run takes short writes
     * (the ~650-byte first row still arrives whole) and a disk that fills up in the second row;
     * fsync failures are left to the fidelity rows, which take the same path (cli/fileio.c). */
    static const row_case cases[] = {
        {"write:short:path=rows.jsonl;write:ENOSPC:after_bytes=900:path=rows.jsonl", ENOSPC_TEXT,
         2, 1},
        {"write:EIO:path=rows.jsonl", EIO_TEXT, 1, 0},
        {"open:EROFS:path=rows.jsonl", "Read-only file system", 0, -1},
    };
    run_row_cases(cases, sizeof cases / sizeof cases[0],
                  BENCH " --policies dense,diagonal --sparsities 0.5");
}

#define FIDELITY "bench fidelity --synthetic grid:4 --policies dense,window,h2o --sparsities 0.5"

static void test_fidelity_json(void **state) {
    (void)state;
    static const row_case cases[] = {
        {"write:short", NULL, 3, 3},
        /* rows are ~700 bytes: the second is cut short, then taken back */
        {"write:ENOSPC:after_bytes=1000:path=rows.jsonl", ENOSPC_TEXT, 2, 1},
        {"write:EIO:path=rows.jsonl", EIO_TEXT, 1, 0},
        {"fsync:EIO:nth=3:path=rows.jsonl", EIO_TEXT, 3, 2},
        {"open:EROFS:path=rows.jsonl", "Read-only file system", 0, -1},
    };
    run_row_cases(cases, sizeof cases / sizeof cases[0], FIDELITY);
    static const row_case model[] = {{"write:EIO:path=rows.jsonl", EIO_TEXT, 1, 0}};
    run_row_cases(model, 1, "bench fidelity --cpu --arch micro-janus --random-weights "
                            "--policies dense,window --sparsities 0.5");
}

int main(void) {
    g_gen = getenv("FLEXDIAG_FAULT_BIN");
    g_bench = getenv("FLEXDIAG_FAULT_BENCH_BIN");
    if (!g_gen || !g_bench || access(g_gen, X_OK) != 0 || access(g_bench, X_OK) != 0) {
        fprintf(stderr, "FLEXDIAG_FAULT_BIN / FLEXDIAG_FAULT_BENCH_BIN (the fault-injection "
                        "builds) are not executable: skipped\n");
        return 77;
    }
    g_root = tu_tempdir("fault");
    if (!g_root) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_short_writes), cmocka_unit_test(test_generate_png),
        cmocka_unit_test(test_generate_results),      cmocka_unit_test(test_generate_tokens),
        cmocka_unit_test(test_generate_geneval),      cmocka_unit_test(test_generate_dpg),
        cmocka_unit_test(test_npy_score),             cmocka_unit_test(test_npy_decode),
        cmocka_unit_test(test_output_not_regular),
        cmocka_unit_test(test_bench_json),            cmocka_unit_test(test_fidelity_json),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) tu_rmtree(g_root); /* kept for a look after a failure */
    free(g_root);
    return rc;
}
