/*
 * test_cli_firstrun.c - what a first run of the command-line tools meets (issue 40), end to end
 * through $FLEXDIAG_BIN and $FLEXDIAG_BENCH_BIN on the builtin micro models on the CPU.
 *
 * version: every subcommand of both tools prints the version with --version, and --help lists
 * it.
 * ranges: every range a command's --help advertises ("a whole number in [lo, hi]", "a number in
 * (lo, hi]") is the one its parser checks: both bounds pass the parser (the run stops at an
 * unknown flag after them instead), a value just outside is refused naming the flag. --arch's
 * list is the library's table of builtin shapes, and the library accepts each.
 * overflow: int flags at the int32 limit whose products overflowed (bench --images-per-prompt
 * 2147483647: UBSan's signed overflow, then a crash) are refused naming the flag; the largest
 * accepted --images-per-prompt runs.
 * text: a text model (the golden OPT fixture with the tokenizer test's mini.json) makes one
 * continuation per prompt by default (not the image default of 4 identical greedy lines), and
 * the summary speaks of texts and tokens: no img/s, no PNG count.
 * prompt ids: --prompt-ids feeds ids as given (the same continuation as the text prompt they
 * encode), --prompt-ids-file one prompt a line, on models without tokenizer.json too (micro-opt,
 * micro-lumina as a text model); malformed or out-of-vocabulary ids, and text prompts for a
 * model without a tokenizer, are refused naming the flag.
 * decode: `decode --tokens tokens.json` takes generate's tokens.json and writes <image_index>.png,
 * the same bytes generate wrote (the golden Janus fixture); --index picks one record; a file that
 * is neither, a missing index and --index on a .npy are refused naming the flag.
 * outputs first: profile --out, score --out, decode --raw and requests --json that cannot be
 * written are refused before anything is loaded or measured (profile measured 30 s first).
 * records in a folder: --resume on an --out whose results.jsonl (or a part file) became a folder
 * is refused at once and tokens.json keeps its bytes (it was replaced by an empty list, the
 * records "kept" in a 0-byte temporary file); a fresh run whose tokens.json is a folder stops
 * before generating.
 * long prompts: a prompt near the 16 KiB cap is tokenised and refused by the default prompt
 * capacity at once (a 100,000-character one ran for minutes); one over the cap is refused
 * before the model loads; SIGTERM while a long prompt's block runs (half the cap, capacity
 * raised: its prefill takes about a second here, 15 s under the sanitizers) ends the run at the
 * next layer with exit 143 and the earlier image kept. The engine checks for cancellation between
 * layers, so the wait is one layer's prefill (0.1-1.8 s here in a release build); the bound
 * below only catches a run that ignores the signal, as the 100,000-character prompt did for
 * minutes.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "flexdiag.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "util.h"

static const char *g_bin;   /* $FLEXDIAG_BIN */
static const char *g_bench; /* $FLEXDIAG_BENCH_BIN */
static char *g_dir;         /* temporary folder of this run */

/* ---- helpers ---- */

/* `bin ARGS` run in g_dir (tests/util.h tu_run_in); a file of g_dir read whole. */
#define run(bin, ...) tu_run_in(g_dir, bin, __VA_ARGS__)
#define read_in_dir(name) tu_read_in(g_dir, name)

/* The whole of file name in g_dir holds needle (a cmocka failure quoting it otherwise). */
static void assert_file_has(const char *name, const char *needle) {
    char *text = read_in_dir(name);
    if (!text || !strstr(text, needle))
        fail_msg("%s lacks '%s': '%s'", name, needle, text ? text : "(missing)");
    free(text);
}

/* ---- --version everywhere ---- */

static void test_version(void **state) {
    (void)state;
    static const char *flexdiag_cmds[] = {"generate", "score", "decode", "policy-trace",
                                          "bench", "bench fidelity", "bench throughput",
                                          "profile", "search"};
    static const char *bench_cmds[] = {"bench", "bench fidelity", "policy-trace", "profile",
                                       "search", "requests"};
    char want[64];
    snprintf(want, sizeof want, "flexdiag %s\n", flexdiag_version());
    for (size_t i = 0; i < sizeof flexdiag_cmds / sizeof *flexdiag_cmds; i++) {
        if (run(g_bin, "%s --version", flexdiag_cmds[i]))
            fail_msg("flexdiag %s --version: not exit 0", flexdiag_cmds[i]);
        assert_file_has("out.txt", want);
        assert_int_equal(run(g_bin, "%s --help", flexdiag_cmds[i]), 0);
        assert_file_has("out.txt", "--version");
    }
    for (size_t i = 0; i < sizeof bench_cmds / sizeof *bench_cmds; i++) {
        if (run(g_bench, "%s --version", bench_cmds[i]))
            fail_msg("flexdiag-bench %s --version: not exit 0", bench_cmds[i]);
        assert_file_has("out.txt", want);
    }
}

/* ---- advertised ranges are the parser's ---- */

#define SENTINEL "--zz-not-a-flag" /* the parser's last word when every value before passed */

/* `cmd flag value SENTINEL` with bin: the parser took value (the unknown sentinel stopped the
 * run) or refused it naming flag; returns 1 when taken. */
static int parser_takes(const char *bin, const char *cmd, const char *flag, const char *value) {
    int rc = run(bin, "%s %s %s " SENTINEL, cmd, flag, value);
    char *err = read_in_dir("err.txt");
    assert_non_null(err);
    int taken = strstr(err, "unknown flag '" SENTINEL "'") != NULL;
    char named[96];
    snprintf(named, sizeof named, ": %s", flag);
    if (rc != 2 || (!taken && !strstr(err, named)))
        fail_msg("%s %s %s: exit %d, stderr '%s'", cmd, flag, value, rc, err);
    free(err);
    return taken;
}

/* The value strings just outside an int range [lo, hi] ("" when the bound is the type's). */
static void int_outside(int64_t lo, int64_t hi, char out[2][32]) {
    snprintf(out[0], 32, "%" PRId64, lo - 1);
    if (lo == INT64_MIN) out[0][0] = 0;
    if (hi == INT64_MAX) snprintf(out[1], 32, "9223372036854775808"); /* strtoll: ERANGE */
    else snprintf(out[1], 32, "%" PRId64, hi + 1);
}

/* One help line's range, checked against the parser: bounds taken, just outside refused. */
static int check_range(const char *bin, const char *cmd, const char *line) {
    char flag[64];
    if (sscanf(line, " %63s", flag) != 1 || strncmp(flag, "--", 2)) return 0;
    const char *at = strstr(line, "; a whole number in [");
    const char *num = strstr(line, "; a number in ");
    char in[2][32], out[2][32];
    if (at) {
        long long lo, hi;
        assert_int_equal(sscanf(at, "; a whole number in [%lld, %lld]", &lo, &hi), 2);
        snprintf(in[0], 32, "%lld", lo), snprintf(in[1], 32, "%lld", hi);
        int_outside(lo, hi, out);
    } else if (num) {
        char open;
        double lo, hi;
        assert_int_equal(sscanf(num, "; a number in %c%lf, %lf]", &open, &lo, &hi), 3);
        double step = 1e-3 * fmax(1.0, fmax(fabs(lo), fabs(hi)));
        snprintf(in[0], 32, "%.17g", open == '(' ? lo + step : lo);
        snprintf(in[1], 32, "%.17g", hi);
        snprintf(out[0], 32, "%.17g", open == '(' ? lo : lo - step);
        snprintf(out[1], 32, "%.17g", hi + step);
    } else {
        return 0;
    }
    for (int b = 0; b < 2; b++) {
        if (!parser_takes(bin, cmd, flag, in[b]))
            fail_msg("%s: help says '%s' takes %s; the parser refused it", cmd, flag, in[b]);
        if (out[b][0] && parser_takes(bin, cmd, flag, out[b]))
            fail_msg("%s: help's range of %s excludes %s; the parser took it", cmd, flag,
                     out[b]);
    }
    return 1;
}

/* Every ranged flag of `bin cmd --help`; the number checked. */
static int check_command_ranges(const char *bin, const char *cmd) {
    assert_int_equal(run(bin, "%s --help", cmd), 0);
    char *help = read_in_dir("out.txt");
    assert_non_null(help);
    int n = 0;
    for (char *line = help; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", line);
        n += check_range(bin, cmd, copy);
        line = nl ? nl + 1 : NULL;
    }
    free(help);
    return n;
}

static void test_ranges(void **state) {
    (void)state;
    static const char *cmds[] = {"generate", "score", "decode", "policy-trace", "bench",
                                 "bench fidelity", "profile", "search"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (check_command_ranges(g_bin, cmds[i]) == 0)
            fail_msg("flexdiag %s --help advertises no range", cmds[i]);
    assert_true(check_command_ranges(g_bench, "requests") > 0);
}

/* --arch's help lists the library's builtin shapes, and the library builds each. */
static void test_archs(void **state) {
    (void)state;
    assert_int_equal(run(g_bin, "generate --help"), 0);
    char *help = read_in_dir("out.txt"), *line = strstr(help, "  --arch ");
    assert_non_null(line);
    line[strcspn(line, "\n")] = 0;
    int32_t n = 0;
    for (; flexdiag_builtin_arch(n); n++) {
        const char *name = flexdiag_builtin_arch(n);
        char listed[80];
        snprintf(listed, sizeof listed, " %s%s", name, n ? "" : " (default)");
        if (!strstr(line, listed)) fail_msg("--arch help '%s' lacks '%s'", line, listed);
        flexdiag_model_config c;
        if (flexdiag__config_builtin(name, &c) != FLEXDIAG_OK)
            fail_msg("--arch %s is listed but refused: %s", name, flexdiag_last_error(NULL));
    }
    assert_true(n >= 11);
    assert_string_equal(flexdiag_builtin_arch(0), "tiny-janus");
    flexdiag_model_config c;
    assert_int_equal(flexdiag__config_builtin("no-such-shape", &c), FLEXDIAG_ERR_INVALID_ARG);
    free(help);
}

/* ---- int flags whose products overflowed ---- */

static void test_overflow(void **state) {
    (void)state;
    static const struct {
        const char *args, *flag;
    } cases[] = {
        {"bench --cpu --arch micro-janus --random-weights --images-per-prompt 2147483647",
         "--images-per-prompt 2147483647"},
        {"bench --cpu --arch micro-janus --random-weights --prompt-len 2147483647",
         "--prompt-len 2147483647"},
        {"generate --cpu --arch micro-janus --max-prompt-len 2147483647 --out o",
         "--max-prompt-len 2147483647"},
        {"search --cpu --arch micro-janus --random-weights --images-per-prompt 2147483647",
         "--images-per-prompt 2147483647"},
        {"bench fidelity --synthetic grid:4 --d-head 2147483647", "--d-head 2147483647"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run(g_bin, "%s", cases[i].args);
        char *err = read_in_dir("err.txt");
        if (rc != 2 || !err || !strstr(err, cases[i].flag) || !strstr(err, "out of range"))
            fail_msg("flexdiag %s: exit %d, stderr '%s'", cases[i].args, rc, err ? err : "");
        free(err);
    }
    /* one distinct prompt for a batch of 2 at the largest --images-per-prompt */
    assert_int_equal(run(g_bin, "bench --cpu --arch micro-janus --random-weights --batch 2 "
                                "--images-per-prompt 65536 --steps 2 --profile-steps 1"),
                     0);
    assert_file_has("out.txt", "| dense |");
}

/* ---- text models ---- */

/* g_dir/opt: the golden OPT fixture (vocabulary 320) with mini.json as its tokenizer.json. */
static void write_opt(void) {
    char *src = tu_data_path("golden/data/opt"), *tok = tu_data_path("tokenizer/data/mini.json");
    assert_int_equal(tu_system("cd '%s' && rm -rf opt && mkdir opt && cp '%s'/config.json "
                               "'%s'/generation_config.json '%s'/model.safetensors opt/ && "
                               "cp '%s' opt/tokenizer.json", g_dir, src, src, src, tok),
                     0);
    free(src);
    free(tok);
}

/* Lines of file name in g_dir. */
static int lines_in(const char *name) {
    char *text = read_in_dir(name);
    assert_non_null(text);
    int n = 0;
    for (const char *p = text; (p = strchr(p, '\n')); p++) n++;
    free(text);
    return n;
}

/* stderr of the last run lacks needle. */
static void assert_err_lacks(const char *needle) {
    char *err = read_in_dir("err.txt");
    if (err && strstr(err, needle)) fail_msg("stderr has '%s': '%s'", needle, err);
    free(err);
}

static void test_text_defaults(void **state) {
    (void)state;
    write_opt();
    assert_int_equal(run(g_bin, "generate --cpu --model opt --prompt 'hello world' "
                                "--max-new-tokens 4 --top-k 1 --out t"), 0);
    assert_int_equal(lines_in("out.txt"), 1); /* "[0] hello world<text>" once */
    assert_file_has("out.txt", "[0] hello world");
    assert_int_equal(lines_in("t/results.jsonl"), 1);
    assert_file_has("err.txt", "[1/1 texts]");
    assert_file_has("err.txt", "generated 1 text(s)");
    assert_file_has("err.txt", " tok/s");
    assert_err_lacks("img/s");
    assert_err_lacks("PNG");
    assert_err_lacks("image decoder");
    /* an explicit count still holds */
    assert_int_equal(run(g_bin, "generate --cpu --model opt --prompt 'hello world' "
                                "--max-new-tokens 4 --images-per-prompt 3 --out t3"), 0);
    assert_int_equal(lines_in("t3/results.jsonl"), 3);
    assert_file_has("err.txt", "generated 3 text(s)");
    /* an image model keeps 4 per prompt, its images and PNGs */
    assert_int_equal(run(g_bin, "generate --cpu --arch micro-janus --out i"), 0);
    assert_int_equal(lines_in("i/results.jsonl"), 4);
    assert_file_has("err.txt", "generated 4 image(s)");
    assert_file_has("err.txt", "4 PNG(s)");
}

/* The grid of tokens.json record k in folder dir (a JSON array, owned by the caller). */
static json_t *grid_of(const char *dir, int k) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/tokens.json", g_dir, dir);
    json_error_t e;
    json_t *doc = json_load_file(path, 0, &e);
    if (!doc) fail_msg("%s: %s", path, e.text);
    json_t *grid = json_incref(json_object_get(json_array_get(json_object_get(doc, "images"),
                                                              (size_t)k), "grid"));
    json_decref(doc);
    assert_non_null(grid);
    return grid;
}

static void test_prompt_ids(void **state) {
    (void)state;
    write_opt();
    /* the ids the text prompt becomes: BOS (2 in the OPT config) + mini.json's encoding */
    char *tp = tu_data_path("tokenizer/data/mini.json");
    flexdiag_tokenizer *tk = NULL;
    assert_int_equal(flexdiag__tok_load(tp, &tk), FLEXDIAG_OK);
    free(tp);
    int32_t *ids = NULL;
    int64_t n = 0;
    assert_int_equal(flexdiag__tok_encode(tk, "hello world", 11, &ids, &n), FLEXDIAG_OK);
    flexdiag__tok_destroy(tk);
    char list[512] = "2";
    for (int64_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), ",%d", ids[i]);
    free(ids);
    const char *flags = "--cpu --model opt --max-new-tokens 6 --top-k 1 --quiet";
    assert_int_equal(run(g_bin, "generate %s --prompt 'hello world' --out a", flags), 0);
    assert_int_equal(run(g_bin, "generate %s --prompt-ids %s --out b", flags, list), 0);
    json_t *ga = grid_of("a", 0), *gb = grid_of("b", 0);
    assert_true(json_equal(ga, gb));
    json_decref(ga);
    json_decref(gb);
    assert_file_has("b/results.jsonl", list); /* the record's prompt is the list */
    /* a file of id prompts, on models without tokenizer.json */
    char path[4200];
    snprintf(path, sizeof path, "%s/ids.txt", g_dir);
    static const char id_lines[] = "2,5,7\n\n2 9\n";
    assert_int_equal(tu_write_file(path, id_lines, sizeof id_lines - 1), 0);
    assert_int_equal(run(g_bin, "generate --cpu --arch micro-opt --random-weights "
                                "--prompt-ids-file ids.txt --max-new-tokens 3 --out c"), 0);
    assert_int_equal(lines_in("c/results.jsonl"), 2);
    assert_int_equal(run(g_bin, "generate --cpu --arch micro-lumina --random-weights "
                                "--prompt-ids 0,5,6 --max-new-tokens 3 --out d"), 0);
    assert_int_equal(lines_in("d/results.jsonl"), 1);
    assert_file_has("err.txt", "generated 1 text(s)");
}

static void test_prompt_ids_refused(void **state) {
    (void)state;
    static const struct {
        const char *args, *n1, *n2;
    } cases[] = {
        {"--prompt-ids 2,x,7", "--prompt-ids", "'x' is not a token id"},
        {"--prompt-ids 2,-3", "--prompt-ids", "'-3'"},
        {"--prompt-ids 2,4294967296", "--prompt-ids", "4294967296"},
        {"--prompt-ids ,", "--prompt-ids", "no token ids"},
        {"--prompt-ids 2,99999", "--prompt-ids", "outside the vocabulary"},
        {"--prompt-ids-file bad.txt", "--prompt-ids-file", "line 2"},
        {"--prompt-ids-file missing.txt", "--prompt-ids-file", "missing.txt"},
        {"--prompt-ids 2 --prompt hi", "--prompt-ids", "one of"},
        {"--prompt-ids 2 --layout dpg", "--prompt-ids", "--layout plain"},
        {"--prompt hi", "no tokenizer.json", "--prompt-ids"},
    };
    char path[4200];
    snprintf(path, sizeof path, "%s/bad.txt", g_dir);
    static const char bad[] = "2,3\n2,3.5\n";
    assert_int_equal(tu_write_file(path, bad, sizeof bad - 1), 0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run(g_bin, "generate --cpu --arch micro-opt --random-weights --quiet "
                            "--max-new-tokens 2 --out r %s", cases[i].args);
        char *err = read_in_dir("err.txt");
        if (rc != 2 || !err || !strstr(err, cases[i].n1) || !strstr(err, cases[i].n2))
            fail_msg("generate %s: exit %d, stderr '%s'", cases[i].args, rc, err ? err : "");
        free(err);
    }
}

/* ---- decode takes generate's tokens.json ---- */

/* Files a and b of g_dir hold the same bytes. */
static void assert_same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/%s", g_dir, a);
    snprintf(pb, sizeof pb, "%s/%s", g_dir, b);
    void *da = tu_read_file(pa, &na), *db = tu_read_file(pb, &nb);
    if (!da || !db || na != nb || memcmp(da, db, na)) fail_msg("%s and %s differ", a, b);
    free(da);
    free(db);
}

static void test_decode_tokens_json(void **state) {
    (void)state;
    char *janus = tu_data_path("golden/data/janus"), path[4200];
    snprintf(path, sizeof path, "%s/two.txt", g_dir);
    static const char prompts[] = "a red apple\ntwo cats\n";
    assert_int_equal(tu_write_file(path, prompts, sizeof prompts - 1), 0);
    assert_int_equal(run(g_bin, "generate --cpu --model '%s' --prompts two.txt "
                                "--images-per-prompt 2 --quiet --out g", janus), 0);
    assert_int_equal(run(g_bin, "decode --cpu --model '%s' --tokens g/tokens.json --out d",
                         janus), 0);
    for (int i = 0; i < 4; i++) { /* image i is sample i % 2 of prompt i / 2 */
        char a[64], b[64];
        snprintf(a, sizeof a, "d/%d.png", i);
        snprintf(b, sizeof b, "g/%d/%d.png", i / 2, i % 2);
        assert_same_file(a, b);
    }
    assert_int_equal(run(g_bin, "decode --cpu --model '%s' --tokens g/tokens.json --index 3 "
                                "--out one", janus), 0);
    assert_same_file("one/3.png", "g/1/1.png");
    assert_int_equal(tu_system("test ! -e '%s/one/0.png'", g_dir), 0);
    static const struct {
        const char *args, *needle;
    } bad[] = {
        {"--tokens g/results.jsonl --out x", "--tokens"},
        {"--tokens g/tokens.json --index 9 --out x", "--index"},
        {"--tokens two.txt --out x", "--tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run(g_bin, "decode --cpu --model '%s' %s", janus, bad[i].args);
        char *err = read_in_dir("err.txt");
        if (rc == 0 || !err || !strstr(err, bad[i].needle))
            fail_msg("decode %s: exit %d, stderr '%s'", bad[i].args, rc, err ? err : "");
        free(err);
    }
    free(janus);
}

/* ---- outputs checked before the work ---- */

static void test_outputs_first(void **state) {
    (void)state;
    char path[4200];
    snprintf(path, sizeof path, "%s/afile", g_dir);
    assert_int_equal(tu_write_file(path, "x", 1), 0);
    static const struct {
        int tool; /* 0 flexdiag, 1 flexdiag-bench */
        const char *args, *n1, *n2;
    } cases[] = {
        {0, "profile --cpu --threads 1 --out afile/p.json", "--out afile/p.json", "nothing was run"},
        {0, "profile --cpu --threads 1 --out .", "is a folder", "nothing was run"},
        {0, "score --model no-model --input no.json --out nofolder/s.npy", "--out nofolder/s.npy",
         "nothing was run"},
        {0, "decode --model no-model --tokens no.npy --raw nofolder/r.npy", "--raw nofolder/r.npy",
         "nothing was run"},
        {1, "requests --arch micro-opt --random-weights --json nofolder/r.jsonl", "--json",
         "nofolder/r.jsonl"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run(cases[i].tool ? g_bench : g_bin, "%s", cases[i].args);
        char *err = read_in_dir("err.txt");
        if (rc != 1 || !err || !strstr(err, cases[i].n1) || !strstr(err, cases[i].n2) ||
            strchr(err, '\n') != err + strlen(err) - 1) /* that line alone: nothing measured */
            fail_msg("%s: exit %d, stderr '%s'", cases[i].args, rc, err ? err : "");
        free(err);
    }
    /* the check's probe files are gone */
    assert_int_equal(tu_system("test -z \"$(ls -a '%s' | grep flexdiag-write-check)\"", g_dir), 0);
}

/* ---- record files that became folders ---- */

static void test_records_folder(void **state) {
    (void)state;
    const char *gen = "generate --cpu --arch micro-janus --images-per-prompt 2 --quiet --out rf";
    assert_int_equal(run(g_bin, "%s", gen), 0);
    char *before = read_in_dir("rf/tokens.json");
    assert_non_null(before);
    static const char *const swaps[] = {"rm rf/results.jsonl && mkdir rf/results.jsonl",
                                        "rmdir rf/results.jsonl && touch rf/results.jsonl && "
                                        "mkdir rf/results.jsonl.part-0"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tu_system("cd '%s' && %s", g_dir, swaps[i]), 0);
        assert_int_equal(run(g_bin, "%s --resume", gen), 1);
        assert_file_has("err.txt", "move it");
        assert_file_has("err.txt", "nothing was changed");
        char *after = read_in_dir("rf/tokens.json");
        if (!after || strcmp(after, before)) fail_msg("swap %d: tokens.json changed", i);
        free(after);
        assert_int_equal(tu_system("cd '%s' && test -z \"$(ls rf | grep tmp)\"", g_dir), 0);
    }
    free(before);
    assert_int_equal(tu_system("cd '%s' && rm -rf rf && mkdir -p rf/tokens.json", g_dir), 0);
    assert_int_equal(run(g_bin, "%s", gen), 1);
    assert_file_has("err.txt", "rf/tokens.json is a folder");
    assert_int_equal(tu_system("test ! -e '%s/rf/0'", g_dir), 0); /* no image was made */
}

/* ---- signals during a long prompt ---- */

#define NEAR_CAP 16000 /* characters of a prompt near the 16 KiB cap (cli/prompts.c) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n characters of words. */
static char *words(size_t n) {
    static const char w[] = "a red apple on a wooden table ";
    char *p = malloc(n + 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = w[i % (sizeof w - 1)];
    p[n] = 0;
    return p;
}

/* Start `flexdiag ARGS` in g_dir (stderr to err.txt); its pid. */
static pid_t start(const char *args) {
    char cmd[12288];
    snprintf(cmd, sizeof cmd, "cd '%s' && exec '%s' %s >out.txt 2>err.txt", g_dir, g_bin, args);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void test_long_prompt_signal(void **state) {
    (void)state;
    char *janus = tu_data_path("golden/data/janus"), path[4200], args[4400];
    char *near = words(NEAR_CAP), *over = words(16385);
    snprintf(path, sizeof path, "%s/near.txt", g_dir);
    assert_int_equal(tu_write_file(path, near, NEAR_CAP), 0);
    snprintf(path, sizeof path, "%s/over.txt", g_dir);
    assert_int_equal(tu_write_file(path, over, 16385), 0);
    /* default capacity: tokenised and refused at once; over the cap: refused unread */
    double t0 = now_s();
    assert_int_equal(run(g_bin, "generate --cpu --model '%s' --prompts near.txt --out n", janus), 2);
    double took = now_s() - t0;
    assert_file_has("err.txt", "maximum prompt length");
    if (took > 5) fail_msg("a prompt near the cap took %.1f s to refuse", took);
    assert_int_equal(run(g_bin, "generate --cpu --model '%s' --prompts over.txt --out n", janus), 2);
    assert_file_has("err.txt", "at most 16384 bytes");
    /* a short prompt, then a long one whose prefill runs: SIGTERM during its block */
    char *two = malloc(NEAR_CAP / 2 + 32);
    assert_non_null(two);
    snprintf(two, NEAR_CAP / 2 + 32, "a red apple\n%.*s\n", NEAR_CAP / 2, near);
    snprintf(path, sizeof path, "%s/two.txt", g_dir);
    assert_int_equal(tu_write_file(path, two, strlen(two)), 0);
    snprintf(args, sizeof args, "generate --cpu --model '%s' --prompts two.txt --quiet "
             "--images-per-prompt 1 --batching blocks --batch 1 --max-prompt-len 8192 --out s",
             janus);
    pid_t pid = start(args);
    snprintf(path, sizeof path, "%s/s/0/0.png", g_dir);
    int status = 0;
    for (int i = 0; i < 30000 && access(path, F_OK) != 0; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) fail_msg("generate ended (%d) too soon", status);
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    t0 = now_s();
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    took = now_s() - t0;
    printf("  SIGTERM during the long prompt's block: exit after %.2f s\n", took);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 143);
    if (took > 60) fail_msg("SIGTERM took %.1f s to stop the run", took);
    assert_int_equal(lines_in("s/results.jsonl"), 1); /* the first image, kept */
    json_t *g = grid_of("s", 0);
    json_decref(g);
    assert_int_equal(tu_system("cd '%s' && test -z \"$(ls -a s s/0 | grep tmp)\"", g_dir), 0);
    free(two);
    free(near);
    free(over);
    free(janus);
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tempdir("firstrun");
    return g_dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void) {
    g_bin = getenv("FLEXDIAG_BIN");
    g_bench = getenv("FLEXDIAG_BENCH_BIN");
    if (!g_bin || !g_bench) {
        fprintf(stderr, "test_cli_firstrun: FLEXDIAG_BIN or FLEXDIAG_BENCH_BIN unset (run "
                        "through meson test): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_archs),
        cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_text_defaults),
        cmocka_unit_test(test_prompt_ids),
        cmocka_unit_test(test_prompt_ids_refused),
        cmocka_unit_test(test_decode_tokens_json),
        cmocka_unit_test(test_outputs_first),
        cmocka_unit_test(test_records_folder),
        cmocka_unit_test(test_long_prompt_signal),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
