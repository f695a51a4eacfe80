/*
 * test_cli_flags.c - flags and inputs the commands must refuse, or accept, and report right
 * (issue #12), end to end through $FLEXDIAG_BIN (`flexdiag bench` and `flexdiag policy-trace`
 * exec the bench tool next to it).
 *
 * 1. A table of bad flags over generate, score, bench, bench fidelity and policy-trace: each
 *    exits 2 and the FIRST stderr line names the flag (and its value or the rule).
 * 2. Policy parity: the same policy flags are accepted or refused alike by generate, score and
 *    policy-trace (bench's refusals are in the table: an accepted bench row takes seconds), with
 *    L_dec = 64 everywhere (micro-janus, synthetic grid:8);
 * 3. and generate's results.jsonl records the policy the run used (N_att, N_r as resolved), or
 *    nothing when the policy is refused.
 * 4. Prompt files: a NUL byte is refused with file and line; blank lines are skipped with one
 *    note (count and first line), for plain, GenEval and DPG files and DPG folders.
 * 5. A model folder with NaN weights (a small Llama written with tests/st_write.c): score exits
 *    1 naming the non-finite logits and writes no .npy, as generate refuses to sample them.
 * 6. Leftovers: no command registers a flag twice (--help lists each once; bench fidelity had
 *    --seed twice); generate's progress rate counts the rows an image really runs (1 without
 *    CFG), checked against the summary's rate on the Llama model; bench fidelity's --n-r list
 *    (a row per Diagonal ring) and --prompts (rows the means over the prompts' images).
 * micro-janus on the CPU; the whole file runs in a few seconds.
 */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/core.h"
#include "cli/npy.h"
#include "runtime/text/tokenizer.h"
#include "st_write.h"
#include "util.h"

static const char *g_bin; /* $FLEXDIAG_BIN */
static char *g_dir;       /* temporary folder of this run */

#define GEN "generate --cpu --arch micro-janus --quiet --images-per-prompt 1 --batch 1 --out o "
#define SCORE "score --cpu --arch micro-janus --input in.json --out s.npy "
#define BENCH "bench --cpu --arch micro-janus --random-weights --batch 1 --steps 2 " \
              "--profile-steps 1 "
#define TRACE "policy-trace --synthetic grid:8 --heads 1 "
#define FID "bench fidelity --synthetic grid:4 --heads 1 --d-head 4 "

/* ---- helpers ---- */

/* Run `flexdiag ARGS` in g_dir (stdout to out.txt, stderr to err.txt); its exit status. */
__attribute__((format(printf, 1, 2))) static int run(const char *fmt, ...) {
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_system("cd '%s' && rm -rf o o2 s.npy && '%s' %s >out.txt 2>err.txt", g_dir, g_bin,
                     args);
}

static char *read_in_dir(const char *name) { return tu_read_in(g_dir, name); }

static void write_in_dir(const char *name, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    assert_int_equal(tu_write_file(path, data, n), 0);
}

static void write_text(const char *name, const char *text) {
    write_in_dir(name, text, strlen(text));
}

static int exists_in_dir(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return access(path, F_OK) == 0;
}

/* The first line of err.txt (malloc'ed, "" when empty). */
static char *first_err_line(void) {
    char *err = read_in_dir("err.txt");
    assert_non_null(err);
    char *nl = strchr(err, '\n');
    if (nl) *nl = 0;
    return err;
}

/* Exit code rc and a first stderr line holding both needles (needle2 may be NULL). */
static void expect_run(int got, int rc, const char *args, const char *needle,
                       const char *needle2) {
    char *line = first_err_line();
    if (got != rc || !strstr(line, needle) || (needle2 && !strstr(line, needle2)))
        fail_msg("flexdiag %s: exit %d (want %d), first stderr line '%s' (want '%s'%s%s)", args,
                 got, rc, line, needle, needle2 ? " and " : "", needle2 ? needle2 : "");
    free(line);
}

/* ---- 1. bad flags: exit 2, the first stderr line names the flag ---- */

typedef struct flag_case {
    const char *args;    /* command and flags */
    const char *needle;  /* the first stderr line names this */
    const char *needle2; /* and this, or NULL */
} flag_case;

static const flag_case bad_flags[] = {
    /* policy: the library's one validation, the same wording from every command */
    {GEN "--policy diagonal --n-att 8 --n-r 2", "--n-att 8 exceeds --n-r 2", "raise --n-r"},
    {GEN "--policy diagonal-sink4 --n-att 9 --n-r 5", "--n-att 9 exceeds --n-r 5", NULL},
    {GEN "--policy diagonal --n-r 2 --sparsity 0.5", "--sparsity 0.5 gives N_att 32", "--n-r 2"},
    {GEN "--policy diagonal --n-att 0", "needs a budget", "--n-att"},
    {GEN "--policy h2o", "needs a budget", "--sparsity"},
    {GEN "--policy window --n-att 8 --sparsity 0.5", "--n-att", "--sparsity"},
    {GEN "--policy window --sparsity 1.5", "--sparsity 1.5", "[0, 1]"},
    {GEN "--policy window --sparsity -0.1", "--sparsity -0.1", "[0, 1]"},
    {GEN "--policy window --sparsity nan", "--sparsity", "nan"},
    {GEN "--policy streaming --n-att 3", "--n-att 3", "streaming"},
    {GEN "--policy window --n-att 65", "--n-att 65 exceeds the decode length 64", NULL},
    {GEN "--policy diagonal --n-att 8 --n-r 40000", "--n-r 40000", NULL},
    {GEN "--policy window --n-att 5000000000", "--n-att 5000000000", NULL},
    {GEN "--policy window --n-att -3", "--n-att -3", NULL},
    {GEN "--policy nope", "--policy", "nope"},
    /* sampling and sizes: the CLI's range checks */
    {GEN "--temperature 0", "--temperature 0", "(0, 100]"},
    {GEN "--temperature nan", "--temperature", "nan"},
    {GEN "--top-p 2", "--top-p 2", "(0, 1]"},
    {GEN "--top-p 0", "--top-p 0", "(0, 1]"},
    {GEN "--cfg nan", "--cfg", "nan"},
    {GEN "--cfg inf", "--cfg", "inf"},
    {GEN "--cfg -1", "--cfg -1", "[0, 100]"},
    {GEN "--top-k -1", "--top-k -1", NULL},
    {GEN "--images-per-prompt 0", "--images-per-prompt 0", "[1, 65536]"},
    {GEN "--micro-batch -1", "--micro-batch -1", NULL},
    {GEN "--max-prompt-len 1", "--max-prompt-len 1", NULL},
    {GEN "--sample-seed -1", "--sample-seed -1", NULL},
    {GEN "--seed -1", "--seed -1", NULL},
    {GEN "--threads -3", "--threads -3", "[0, 1024]"},
    {GEN "--gpu-mem nan", "--gpu-mem", "nan"},
    {GEN "--gpu-mem 1e30G", "--gpu-mem", NULL},
    {GEN "--batch 0", "--batch", NULL},
    /* offloading: the placement and the tier it needs */
    {GEN "--weights 0,50", "--weights 0,50", "add up to 100"},
    {GEN "--weights 60,50,0", "--weights 60,50,0", "add up to 100"},
    {GEN "--weights 0,0,100", "on disk but no --offload-dir", NULL},
    {SCORE "--weights a,b,c", "--weights a,b,c", NULL},
    {BENCH "--weights 1,2", "--weights 1,2", NULL},
    {GEN "--kv 50,60,0", "--kv 50,60,0", "add up to 100"},
    {BENCH "--kv 0,0,100", "--kv 0,0,100 puts KV on disk", "--offload-dir"},
    {SCORE "--kv x", "--kv x", NULL},
    {SCORE "--policy diagonal --n-att 8 --n-r 2", "--n-att 8 exceeds --n-r 2", NULL},
    {SCORE "--policy tova", "needs a budget", NULL},
    {SCORE "--policy window --sparsity inf", "--sparsity", "inf"},
    {SCORE "--threads 5000", "--threads 5000", NULL},
    {BENCH "--policy diagonal --n-att 8 --n-r 2", "--n-att 8 exceeds --n-r 2", NULL},
    {BENCH "--policy diagonal --n-att 0", "needs a budget", NULL},
    {BENCH "--policies dense,h2o", "needs a budget", NULL},
    {BENCH "--policies h2o --sparsity 0.5 --sparsities 0.5", "--sparsities", NULL},
    {BENCH "--policy window --sparsity nan", "--sparsity", "nan"},
    {BENCH "--micro-batch -1", "--micro-batch -1", NULL},
    {BENCH "--prompt-len 1", "--prompt-len 1", NULL},
    {TRACE "--policy diagonal --n-att 0", "needs a budget", NULL},
    {TRACE "--policy diagonal --n-att 8 --n-r 2", "--n-att 8 exceeds --n-r 2", NULL},
    {TRACE "--policy window --n-att 65", "--n-att 65 exceeds the decode length 64", NULL},
    {TRACE "--policy window --n-att 4 --heads 5000", "--heads 5000", "[1, 1024]"},
    {TRACE "--policy window --n-att 4 --steps 5000", "--steps 5000", "[1, 4096]"},
    {TRACE "--policy window --n-att 4 --alpha inf", "--alpha", "inf"},
    {"policy-trace --synthetic grid:100 --policy window --n-att 4", "--synthetic", "64"},
    {FID "--policies diagonal --n-r 40000", "--n-r 40000", NULL},
    {FID "--policies diagonal-sink4 --n-r 3", "--n-r 3", NULL},
    {FID "--policies diagonal --n-r 8,x", "--n-r x", "comma list"},
    {FID "--policies dense --prompts in.json", "--prompts needs a model", NULL},
    {FID "--policies dense --heads 0", "--heads 0", NULL},
    {FID "--policies dense --sigma -1", "--sigma", NULL},
    {FID "--policies dense --seed -2", "--seed -2", NULL},
};

static void test_bad_flags(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++) {
        const flag_case *c = &bad_flags[i];
        expect_run(run("%s", c->args), 2, c->args, c->needle, c->needle2);
    }
}

/* ---- 2, 3. the same policy flags: the same answer from every command; what generate
 * records is what ran ---- */

/* o/results.jsonl's first record has n_att and n_r. */
static void expect_recorded(const char *flags, int n_att, int n_r) {
    char *text = read_in_dir("o/results.jsonl");
    assert_non_null(text);
    json_error_t e;
    json_t *rec = json_loads(text, JSON_DISABLE_EOF_CHECK, &e);
    if (!rec) fail_msg("results.jsonl: %s", e.text);
    json_int_t got_att = json_integer_value(json_object_get(rec, "n_att"));
    json_int_t got_r = json_integer_value(json_object_get(rec, "n_r"));
    if (got_att != n_att || got_r != n_r)
        fail_msg("generate %s: results.jsonl records n_att %lld n_r %lld, the run used %d / %d",
                 flags, (long long)got_att, (long long)got_r, n_att, n_r);
    json_decref(rec);
    free(text);
}

static void test_policy_parity(void **state) {
    (void)state;
    static const struct {
        const char *flags;
        int rc;         /* 0 accepted, 2 refused */
        int n_att, n_r; /* accepted: what runs (and generate records) */
    } cases[] = {
        {"--policy diagonal --n-att 8 --n-r 8", 0, 8, 8},
        {"--policy diagonal --n-att 8 --n-r 16", 0, 8, 16},
        {"--policy diagonal --sparsity 0.5", 0, 32, 32},
        {"--policy diagonal --n-att 8 --n-r 2", 2, 0, 0},
        {"--policy diagonal --n-att 0", 2, 0, 0},
        {"--policy window --sparsity 1", 0, 1, 0},
        {"--policy window --sparsity 1.01", 2, 0, 0},
        {"--policy window --sparsity 0.5 --n-att 4", 2, 0, 0},
        {"--policy streaming --n-att 4", 2, 0, 0},
        {"--policy streaming --n-att 5", 0, 5, 0},
        {"--policy diagonal-sink4 --n-att 5 --n-r 5", 0, 5, 5},
        {"--policy diagonal-sink4 --n-att 5 --n-r 4", 2, 0, 0},
        {"--policy tova --n-att 65", 2, 0, 0},
        {"--policy dense --sparsity 0.9", 0, 64, 0}, /* dense ignores the budget */
    };
    static const char *cmds[] = {GEN, SCORE, TRACE};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t j = 0; j < sizeof cmds / sizeof cmds[0]; j++) {
            int rc = run("%s%s", cmds[j], cases[i].flags);
            if (rc != cases[i].rc) {
                char *line = first_err_line();
                fail_msg("flexdiag %s%s: exit %d, want %d ('%s')", cmds[j], cases[i].flags, rc,
                         cases[i].rc, line);
            }
            if (j == 0 && rc == 0) expect_recorded(cases[i].flags, cases[i].n_att, cases[i].n_r);
            if (j == 0 && rc != 0) { /* a refused policy writes no record */
                char *text = read_in_dir("o/results.jsonl");
                assert_true(!text || !*text);
                free(text);
            }
        }
}

/* ---- 4. prompt files ---- */

static void test_prompt_files(void **state) {
    (void)state;
    static const char nul_plain[] = "a cat\nb dog\nc b\0ird\n";
    write_in_dir("nul.txt", nul_plain, sizeof nul_plain - 1);
    expect_run(run(GEN "--prompts nul.txt"), 2, "--prompts nul.txt", "nul.txt",
               "line 3 holds a NUL byte");
    static const char nul_meta[] = "{\"prompt\": \"a dog\"}\n{\"prompt\": \"a\0cat\"}\n";
    write_in_dir("nul.jsonl", nul_meta, sizeof nul_meta - 1);
    expect_run(run(GEN "--layout geneval --prompts nul.jsonl"), 2, "geneval nul.jsonl",
               "nul.jsonl", "line 2 holds a NUL byte");
    static const char nul_dpg[] = "a1\tone\0\n";
    write_in_dir("nul.tsv", nul_dpg, sizeof nul_dpg - 1);
    expect_run(run(GEN "--layout dpg --prompts nul.tsv"), 2, "dpg nul.tsv", "nul.tsv",
               "line 1 holds a NUL byte");
    assert_int_equal(tu_system("mkdir -p '%s/dpgdir'", g_dir), 0);
    static const char nul_txt[] = "one line\nand \0 more\n";
    write_in_dir("dpgdir/p1.txt", nul_txt, sizeof nul_txt - 1);
    expect_run(run(GEN "--layout dpg --prompts dpgdir"), 2, "dpg dpgdir", "dpgdir/p1.txt",
               "line 2 holds a NUL byte");
    /* unbounded input fails fast: an endless line, a prompt longer than 16 KiB */
    expect_run(run(GEN "--prompts /dev/zero"), 2, "--prompts /dev/zero", "/dev/zero",
               "line 1 is longer than");
    char *longp = malloc(20001);
    assert_non_null(longp);
    memset(longp, 'a', 20000);
    longp[20000] = '\n';
    write_in_dir("long.txt", longp, 20001);
    free(longp);
    expect_run(run(GEN "--prompts long.txt"), 2, "--prompts long.txt", "long.txt",
               "a prompt of 20000 bytes");
    /* blank lines: skipped, one note with the count and the first; the run goes on */
    write_text("blank.txt", "a cat\n\n  \nb dog\n\n");
    expect_run(run(GEN "--prompts blank.txt"), 0, "--prompts blank.txt", "note:",
               "skipped 3 blank line(s), the first at line 2");
    char *err = read_in_dir("err.txt");
    const char *note = strstr(err, "blank line");
    assert_null(strstr(note + 1, "blank line")); /* one note, not one per line */
    free(err);
    char *text = read_in_dir("o/results.jsonl");
    int lines = 0;
    for (const char *p = text; p && (p = strchr(p, '\n')); p++) lines++;
    assert_int_equal(lines, 2);
    free(text);
    write_text("blank.jsonl", "\n{\"prompt\": \"a dog\"}\n");
    expect_run(run(GEN "--layout geneval --prompts blank.jsonl"), 0, "geneval blank.jsonl",
               "skipped 1 blank line(s)", "line 1");
    write_text("blank.tsv", "a1\tone\n\t \n\na2\ttwo\n");
    expect_run(run(GEN "--layout dpg --prompts blank.tsv"), 0, "dpg blank.tsv",
               "skipped 2 blank line(s)", "line 2");
}

/* ---- 5. a model with NaN weights ---- */

/* A small Llama folder (the golden fixture's shapes, vocab 512, the tokenizer test's mini.json
 * BPE) with seeded weights; nan_norm puts NaN in model.norm.weight. */
static void write_llama(const char *dir, int nan_norm) {
    static const char config[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
        "\"bos_token_id\": 1, \"eos_token_id\": 2, \"head_dim\": 16, \"hidden_act\": \"silu\", "
        "\"hidden_size\": 64, \"intermediate_size\": 160, \"max_position_embeddings\": 512, "
        "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"num_key_value_heads\": 2, "
        "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
        "\"vocab_size\": 512}";
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, config, sizeof config - 1), 0);
    char *tok = tu_data_path("tokenizer/data/mini.json");
    assert_int_equal(tu_system("cp '%s' '%s/tokenizer.json'", tok, dir), 0);
    free(tok);
    enum { V = 512, D = 64, F = 160, KV = 32, L = 2, N = 3 + 9 * L };
    static char names[N][64];
    flexdiag_st_entry e[N];
    int n = 0;
#define T2(nm, a, b) e[n] = (flexdiag_st_entry){names[n], FLEXDIAG_DTYPE_BF16, 2, {a, b}, NULL}, \
                     snprintf(names[n++], 64, "%s", nm)
#define T1(nm, a) e[n] = (flexdiag_st_entry){names[n], FLEXDIAG_DTYPE_BF16, 1, {a}, NULL}, \
                  snprintf(names[n++], 64, "%s", nm)
    T2("lm_head.weight", V, D);
    T2("model.embed_tokens.weight", V, D);
    T1("model.norm.weight", D);
    for (int l = 0; l < L; l++) {
        static const char *mats[] = {"mlp.down_proj", "mlp.gate_proj", "mlp.up_proj",
                                     "self_attn.k_proj", "self_attn.o_proj", "self_attn.q_proj",
                                     "self_attn.v_proj"};
        static const int64_t rows[] = {D, F, F, KV, D, D, KV}, cols[] = {F, D, D, D, D, D, D};
        char nm[64];
        for (int i = 0; i < 7; i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, mats[i]);
            T2(nm, rows[i], cols[i]);
        }
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        T1(nm, D);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        T1(nm, D);
    }
#undef T1
#undef T2
    assert_int_equal(n, N);
    tu_rng r;
    tu_rng_seed(&r, 12);
    for (int i = 0; i < n; i++) {
        int64_t cnt = e[i].shape[0] * (e[i].ndim == 2 ? e[i].shape[1] : 1);
        uint16_t *w = malloc((size_t)cnt * 2);
        assert_non_null(w);
        if (e[i].ndim == 1) /* norms: 1.0, or NaN */
            for (int64_t j = 0; j < cnt; j++)
                w[j] = nan_norm && !strcmp(e[i].name, "model.norm.weight") ? 0x7fc0 : 0x3f80;
        else
            tu_fill_bf16(&r, w, cnt, 0.05f);
        e[i].data = w;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(flexdiag__st_write(path, e, n), FLEXDIAG_OK);
    for (int i = 0; i < n; i++) free((void *)e[i].data);
}

static void test_nan_weights(void **state) {
    (void)state;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/nan-llama", g_dir);
    assert_int_equal(tu_system("mkdir -p '%s'", dir), 0);
    write_llama(dir, 1);
    static const char in[] = "{\"prompt_ids\": [1, 40, 41], \"image_ids\": [42, 43, 44]}";
    write_text("llama_in.json", in);
    char args[4400];
    snprintf(args, sizeof args, "score --cpu --model '%s' --input llama_in.json --out s.npy", dir);
    expect_run(run("%s", args), 1, args, "not finite", "NaN");
    assert_false(exists_in_dir("s.npy"));
    snprintf(args, sizeof args, "score --cpu --model '%s' --input llama_in.json --out s.npy "
             "--raw", dir);
    expect_run(run("%s", args), 1, args, "per-row logits are not finite", NULL);
    assert_false(exists_in_dir("s.npy"));
    /* generate refuses the same weights where it samples */
    assert_int_equal(run("generate --cpu --quiet --model '%s' --prompt 'ab' "
                         "--images-per-prompt 1 --out o", dir), 1);
    char *err = read_in_dir("err.txt");
    if (!strstr(err, "not finite")) fail_msg("generate on NaN weights: stderr '%s'", err);
    free(err);
}

/* Text generation on a Llama folder with a tokenizer (mini.json): `generate --top-k 1
 * --max-new-tokens N` writes, per sample, the N ids and their text to results.jsonl and prints
 * the prompt and text; the ids are greedy (each the argmax of the model's own teacher-forced
 * logits given the prompt and the ids before it, scored by `score`), the same for every sample,
 * and the text is the tokenizer's decode of the ids. */
/* Run generate on the text model in dir; the first two records' ids (n of them, before EOS),
 * text and stop reason; 0 or a failure. */
typedef struct text_rec {
    int32_t ids[16];
    int32_t n;
    char text[512];
    char stop[16];
} text_rec;

static void text_records(const char *dir, int32_t n_new, text_rec rec[2], char **out) {
    int grc = run("generate --cpu --model '%s' --prompt 'hello world' --top-k 1 "
                  "--max-new-tokens %d --images-per-prompt 2 --out o", dir, n_new);
    if (grc) {
        char *err = read_in_dir("err.txt");
        fail_msg("generate (text): exit %d: %s", grc, err ? err : "");
    }
    char *text = read_in_dir("o/results.jsonl");
    assert_non_null(text);
    json_error_t e;
    size_t at = 0;
    for (int k = 0; k < 2; k++) {
        json_t *r = json_loads(text + at, JSON_DISABLE_EOF_CHECK, &e);
        if (!r) fail_msg("results.jsonl line %d: %s", k + 1, e.text);
        at += e.position;
        while (text[at] == '\n') at++;
        json_t *arr = json_object_get(r, "ids");
        rec[k].n = (int32_t)json_array_size(arr);
        assert_true(rec[k].n <= n_new && n_new <= 16);
        for (int32_t i = 0; i < rec[k].n; i++)
            rec[k].ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
        assert_non_null(json_string_value(json_object_get(r, "text")));
        snprintf(rec[k].text, sizeof rec[k].text, "%s", json_string_value(json_object_get(r, "text")));
        snprintf(rec[k].stop, sizeof rec[k].stop, "%s", json_string_value(json_object_get(r, "stop")));
        assert_true(!strcmp(rec[k].stop, rec[k].n == n_new ? "length" : "eos"));
        json_decref(r);
    }
    free(text);
    *out = read_in_dir("out.txt");
}

/* Text generation on a Llama folder with a tokenizer (mini.json): `generate --top-k 1
 * --max-new-tokens N` writes, per sample, the ids before the first EOS, their text and why it
 * stopped to results.jsonl and prints the prompt and text; the ids are greedy (each the argmax of
 * the model's own teacher-forced logits given the prompt and the ids before it, scored by
 * `score`), the same for every sample, and the text is the tokenizer's decode of the ids. With
 * the config's eos_token_id set to a token the run produces, the continuation ends before it. */
static void test_text_generation(void **state) {
    (void)state;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/text-llama", g_dir);
    assert_int_equal(tu_system("mkdir -p '%s'", dir), 0);
    write_llama(dir, 0);
    enum { N = 6 };
    text_rec rec[2];
    char *out = NULL;
    text_records(dir, N, rec, &out);
    assert_int_equal(rec[0].n, rec[1].n); /* greedy: every sample the same */
    assert_memory_equal(rec[0].ids, rec[1].ids, (size_t)rec[0].n * 4);
    assert_string_equal(rec[0].text, rec[1].text);
    char line[600];
    snprintf(line, sizeof line, "[0] hello world%s\n", rec[0].text);
    if (!strstr(out, line)) fail_msg("stdout lacks '%s': '%s'", line, out);
    free(out);
    /* the decode of the ids is the text: through the library's tokenizer */
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    rp.device = -1;
    flexdiag_runtime *rt = NULL;
    flexdiag_model *m = NULL;
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    assert_int_equal(flexdiag_runtime_create(&rp, &rt), FLEXDIAG_OK);
    assert_int_equal(flexdiag_model_load(rt, dir, &mp, &m), FLEXDIAG_OK);
    char dec[512];
    size_t len = 0;
    assert_int_equal(flexdiag_detokenize(m, rec[0].ids, rec[0].n, true, dec, sizeof dec, &len),
                     FLEXDIAG_OK);
    assert_string_equal(dec, rec[0].text);
    int32_t eos = -2;
    assert_int_equal(flexdiag_model_eos(m, &eos), FLEXDIAG_OK);
    assert_int_equal(eos, 2); /* write_llama's eos_token_id */
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    /* greedy: `score` the continuation (the EOS it stopped at included); row i's argmax is id i.
     * The prompt as generate builds it for a text model: BOS (bos_token_id 1) + encode(...). */
    int32_t full[N + 1], nf = rec[0].n;
    memcpy(full, rec[0].ids, (size_t)nf * 4);
    if (nf < N) full[nf++] = 2;
    char *tp = tu_data_path("tokenizer/data/mini.json");
    flexdiag_tokenizer *tk = NULL;
    assert_int_equal(flexdiag__tok_load(tp, &tk), FLEXDIAG_OK);
    free(tp);
    int32_t *pids = NULL;
    int64_t np = 0;
    assert_int_equal(flexdiag__tok_encode(tk, "hello world", 11, &pids, &np), FLEXDIAG_OK);
    flexdiag__tok_destroy(tk);
    char in[1024];
    int n = snprintf(in, sizeof in, "{\"prompt_ids\": [1");
    for (int64_t i = 0; i < np; i++) n += snprintf(in + n, sizeof in - (size_t)n, ", %d", pids[i]);
    free(pids);
    n += snprintf(in + n, sizeof in - (size_t)n, "], \"image_ids\": [");
    for (int i = 0; i < nf; i++)
        n += snprintf(in + n, sizeof in - (size_t)n, "%s%d", i ? ", " : "", full[i]);
    snprintf(in + n, sizeof in - (size_t)n, "]}");
    write_text("greedy_in.json", in);
    char args[4400];
    snprintf(args, sizeof args, "score --cpu --model '%s' --input greedy_in.json --out s.npy",
             dir);
    assert_int_equal(run("%s", args), 0);
    char npy[4300];
    snprintf(npy, sizeof npy, "%s/s.npy", g_dir);
    flexdiag_npy a;
    assert_int_equal(flexdiag__npy_read(npy, &a), FLEXDIAG_OK);
    assert_int_equal(a.shape[0], nf);
    int64_t V = a.shape[1];
    for (int i = 0; i < nf; i++) {
        const float *row = (const float *)a.data + (size_t)i * (size_t)V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        if (best != full[i]) fail_msg("token %d: generated %d, argmax %lld", i, full[i],
                                      (long long)best);
    }
    flexdiag__npy_free(&a);
    /* an EOS the run produces: the continuation ends before its first occurrence */
    printf("  text generation: %d of %d ids (%s): \"%s\"\n", rec[0].n, N, rec[0].stop,
           rec[0].text);
    if (rec[0].n >= 2) {
        int32_t stop = rec[0].ids[rec[0].n / 2], first = 0;
        while (rec[0].ids[first] != stop) first++;
        assert_int_equal(tu_system("sed -i 's/\"eos_token_id\": 2/\"eos_token_id\": %d/' "
                                   "'%s/config.json'", stop, dir), 0);
        text_rec r2[2];
        text_records(dir, N, r2, &out);
        free(out);
        assert_int_equal(r2[0].n, first);
        assert_string_equal(r2[0].stop, "eos");
        assert_memory_equal(r2[0].ids, rec[0].ids, (size_t)first * 4);
    }
}

/* ---- 6. leftovers ---- */

/* Every flag of every command's --help appears once. */
static void test_flags_unique(void **state) {
    (void)state;
    static const char *cmds[] = {"generate", "score", "decode", "bench", "bench fidelity",
                                 "policy-trace"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        assert_int_equal(run("%s --help", cmds[i]), 0);
        char *out = read_in_dir("out.txt");
        assert_non_null(out);
        char seen[64][32];
        int n = 0;
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
            char flag[32];
            if (sscanf(line, " %31s", flag) != 1 || strncmp(flag, "--", 2)) continue;
            for (int j = 0; j < n; j++)
                if (!strcmp(seen[j], flag))
                    fail_msg("flexdiag %s --help lists %s twice", cmds[i], flag);
            assert_true(n < 64);
            snprintf(seen[n++], sizeof seen[0], "%s", flag);
        }
        assert_true(n > 3);
        free(out);
    }
    /* fidelity's one --seed reaches the synthetic model */
    assert_int_equal(run(FID "--policies dense --seed 5"), 0);
    char *out = read_in_dir("out.txt");
    assert_non_null(strstr(out, "seed 5"));
    free(out);
}

/* generate without --batch: the largest block that fits when there is a device budget
 * (--gpu-mem here), evened over a job that needs more than one under --batching blocks (all
 * of it as slots under the default continuous batching), and 16 images on the CPU engine
 * without a budget. */
static void test_default_batch(void **state) {
    (void)state;
    assert_int_equal(run("generate --cpu --arch micro-janus --gpu-mem 64M --images-per-prompt 40 "
                         "--batching blocks --out o"),
                     0);
    char *err = read_in_dir("err.txt");
    unsigned fit = 0, block = 0;
    const char *line = strstr(err, "no --batch (the largest block that fits): ");
    assert_non_null(line);
    assert_int_equal(sscanf(line, "no --batch (the largest block that fits): %u image(s) fit the "
                                  "budget; blocks of %u", &fit, &block),
                     2);
    assert_true(fit > 16 && block == 40); /* more than the CPU default, capped by the job */
    free(err);
    /* continuous: every slot that fits, none evened away */
    assert_int_equal(run("generate --cpu --arch micro-janus --gpu-mem 20M --images-per-prompt 30 "
                         "--out o3"),
                     0);
    err = read_in_dir("err.txt");
    line = strstr(err, "no --batch (the largest block that fits): ");
    assert_non_null(line);
    unsigned slots = 0;
    assert_int_equal(sscanf(line, "no --batch (the largest block that fits): %u image(s) fit the "
                                  "budget; slots of %u", &fit, &slots),
                     2);
    assert_true(fit >= 15 && fit < 30 && slots == fit);
    free(err);
    /* a job larger than the largest block runs in as few blocks, of equal size */
    assert_int_equal(run("generate --cpu --arch micro-janus --gpu-mem 20M --images-per-prompt 30 "
                         "--batching blocks --out o2"),
                     0);
    err = read_in_dir("err.txt");
    line = strstr(err, "no --batch (the largest block that fits): ");
    assert_non_null(line);
    assert_int_equal(sscanf(line, "no --batch (the largest block that fits): %u image(s) fit the "
                                  "budget; blocks of %u", &fit, &block),
                     2);
    unsigned blocks = (30 + fit - 1) / fit;
    assert_true(fit >= 15 && fit < 30 && block <= fit && block == (30 + blocks - 1) / blocks);
    free(err);
    assert_int_equal(run("generate --cpu --arch micro-janus --images-per-prompt 20 --out o"), 0);
    err = read_in_dir("err.txt");
    assert_non_null(strstr(err, "block of 16"));
    assert_null(strstr(err, "largest block"));
    free(err);
}

/* The last progress line's rate (rows x steps / s) against the summary's (tokens / s, rows
 * counted): the same quantity, so about equal; counting 2 rows per image for a model without
 * CFG made it twice the summary's. */
static void test_progress_rows(void **state) {
    (void)state;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/llama", g_dir);
    assert_int_equal(tu_system("mkdir -p '%s'", dir), 0);
    write_llama(dir, 0);
    assert_int_equal(run("generate --cpu --model '%s' --prompt 'ab' --images-per-prompt 4 "
                         "--batch 4 --out o", dir),
                     0);
    char *err = read_in_dir("err.txt");
    double step_rate = 0, sum_rate = 0;
    for (char *line = strtok(err, "\n"); line; line = strtok(NULL, "\n")) {
        unsigned done, total;
        double rate;
        if (sscanf(line, "step %u/%u %lf tok/s", &done, &total, &rate) == 3 && done == total)
            step_rate = rate;
        const char *s = strstr(line, "): ");
        if (!strncmp(line, "generated ", 10) && s) sum_rate = strtod(s + 3, NULL);
    }
    free(err);
    if (!(step_rate > 0 && sum_rate > 0))
        fail_msg("no final progress line or no summary rate (%g, %g)", step_rate, sum_rate);
    double ratio = step_rate / sum_rate;
    fprintf(stderr, "  progress %.0f tok/s, summary %.0f tok/s (ratio %.2f)\n", step_rate,
            sum_rate, ratio);
    if (ratio < 0.55 || ratio > 1.45)
        fail_msg("progress rate %.0f tok/s vs summary %.0f tok/s: ratio %.2f", step_rate,
                 sum_rate, ratio);
}

/* bench fidelity --n-r takes a list: a row per ring for the Diagonal kinds (one for the
 * others), a (sparsity, ring) whose N_att exceeds the ring skipped with a message. grid:4 has
 * L_dec 16: sparsity 0.5 attends 8, 0.9 attends 2; the default ring is 8. */
static void test_fidelity_rings(void **state) {
    (void)state;
    assert_int_equal(run(FID "--policies dense,window,diagonal --sparsities 0.5,0.9 --n-r 0,4 "
                             "--json f.jsonl"),
                     0);
    char *err = read_in_dir("err.txt"), *rows = read_in_dir("f.jsonl");
    assert_non_null(strstr(err, "skipping diagonal at sparsity 0.5, ring 4: --sparsity 0.5 "
                                "gives N_att 8, which exceeds --n-r 4"));
    const char *want[] = {"dense:0", "window:0", "window:0", "diagonal:8", "diagonal:8",
                          "diagonal:4"};
    int n = 0;
    for (char *line = strtok(rows, "\n"); line; line = strtok(NULL, "\n"), n++) {
        json_t *r = json_loads(line, 0, NULL);
        char got[64];
        snprintf(got, sizeof got, "%s:%d", json_string_value(json_object_get(r, "policy")),
                 (int)json_integer_value(json_object_get(r, "n_r")));
        json_decref(r);
        if (n >= 6 || strcmp(got, want[n])) fail_msg("row %d: %s", n, got);
    }
    assert_int_equal(n, 6);
    free(err);
    free(rows);
    assert_int_equal(tu_system("rm -f '%s/f.jsonl'", g_dir), 0);
}

/* Field key of every row of the bench fidelity JSONL file name, in order, into out (n rows). */
static int fidelity_rows(const char *name, const char *key, double *out, int n) {
    char *rows = read_in_dir(name);
    assert_non_null(rows);
    int k = 0;
    for (char *line = strtok(rows, "\n"); line && k < n; line = strtok(NULL, "\n"), k++) {
        json_t *r = json_loads(line, 0, NULL);
        out[k] = json_number_value(json_object_get(r, key));
        json_decref(r);
    }
    free(rows);
    return k;
}

/* bench fidelity --prompts FILE (model mode): each row is the mean over the prompts' images:
 * its top-1 and KL equal the means of the single-prompt runs, its largest attention error the
 * larger of theirs, and the rows say how many prompts they average. */
static void test_fidelity_prompts(void **state) {
    (void)state;
    const char *f = "bench fidelity --arch micro-janus --random-weights --cpu --threads 2 "
                    "--policies dense,window --sparsities 0.75";
    write_text("two.txt", "a red apple\na blue cube\n");
    assert_int_equal(run("%s --prompt 'a red apple' --json f1.jsonl", f), 0);
    assert_int_equal(run("%s --prompt 'a blue cube' --json f2.jsonl", f), 0);
    assert_int_equal(run("%s --prompts two.txt --json f12.jsonl", f), 0);
    double a[2], b[2], m[2];
    /* top-1 and KL: the means; the largest attention error: the larger */
    const char *keys[] = {"top1", "kl", "attn_err_max"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(fidelity_rows("f1.jsonl", keys[k], a, 2), 2);
        assert_int_equal(fidelity_rows("f2.jsonl", keys[k], b, 2), 2);
        assert_int_equal(fidelity_rows("f12.jsonl", keys[k], m, 2), 2);
        for (int r = 0; r < 2; r++) {
            double want = k < 2 ? (a[r] + b[r]) / 2 : a[r] > b[r] ? a[r] : b[r];
            if (!(fabs(m[r] - want) <= 1e-5 * (1 + fabs(want)))) /* JSON keeps 6 digits */
                fail_msg("row %d %s: %g, want %g", r, keys[k], m[r], want);
        }
    }
    assert_int_equal(fidelity_rows("f1.jsonl", "prompts", a, 2), 2);
    assert_int_equal(fidelity_rows("f12.jsonl", "prompts", m, 2), 2);
    assert_true(a[0] == 1 && a[1] == 1 && m[0] == 2 && m[1] == 2);
    char *out = read_in_dir("out.txt");
    assert_non_null(strstr(out, "2 prompts (means over them)"));
    free(out);
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tempdir("flags");
    if (!g_dir) return -1;
    static const char in[] = "{\"prompt_ids\": [256, 259, 58, 97, 261], "
                             "\"image_ids\": [3, 4, 5, 6], \"cfg_weight\": 5.0}";
    char path[4096];
    snprintf(path, sizeof path, "%s/in.json", g_dir);
    return tu_write_file(path, in, strlen(in));
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

int main(void) {
    g_bin = getenv("FLEXDIAG_BIN");
    if (!g_bin || access(g_bin, X_OK) != 0) {
        fprintf(stderr, "test_cli_flags: FLEXDIAG_BIN (the flexdiag binary) is not executable "
                        "(run through meson test): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_flags),   cmocka_unit_test(test_policy_parity),
        cmocka_unit_test(test_prompt_files), cmocka_unit_test(test_nan_weights),
        cmocka_unit_test(test_flags_unique), cmocka_unit_test(test_progress_rows),
        cmocka_unit_test(test_text_generation), cmocka_unit_test(test_default_batch),
        cmocka_unit_test(test_fidelity_rings), cmocka_unit_test(test_fidelity_prompts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
