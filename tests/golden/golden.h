/*
 * golden.h - what the golden test files share (golden.c): the backend under test (the CPU
 * engine, or CUDA device 0 in test_golden_cuda) with its tolerance, fixture paths, arrays and
 * JSON, model and context opening, teacher-forced runs, the relative-L2 check, the per-fixture
 * test groups, and the tests of each fixture (golden_janus.c, golden_text.c,
 * golden_chameleon.c). The fixtures are tools/golden/make_fixtures.py's, in tests/golden/data/.
 */
#ifndef FLEXDIAG_TEST_GOLDEN_H
#define FLEXDIAG_TEST_GOLDEN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/npy.h"
#include "runtime/engine/engine.h"

struct CMUnitTest;

typedef struct gd_backend {
    int device;      /* runtime device: -1 = the CPU engine, 0 = CUDA device 0 */
    double tol;      /* relative L2 bound of every logits and hidden-state check */
    const char *tag; /* "cpu" or "cuda", in the printed lines */
} gd_backend;

extern gd_backend gd_be; /* set by main() before any group runs */

/* ---- fixtures ---- */

/* $FLEXDIAG_TEST_DATA/golden/data/<model>/<file>, malloc'ed ("" gives the folder). */
char *gd_fixture(const char *model, const char *file);
/* A fixture .npy (asserts it reads); free with flexdiag__npy_free. */
flexdiag_npy gd_npy(const char *model, const char *file);
/* A fixture JSON file (asserts it parses); json_decref it. */
json_t *gd_json(const char *model, const char *file);
/* The integers of a JSON array (malloc'ed, *n of them). */
int32_t *gd_json_ids(const json_t *arr, int32_t *n);
/* The ids of an int64 .npy as int32 (malloc'ed). */
int32_t *gd_npy_ids(const flexdiag_npy *a);

/* ---- runs ---- */

/* Runtime on gd_be's device and the model in dir (asserts both open). */
void gd_open_model(const char *dir, flexdiag_runtime **rt, flexdiag_model **m);
void gd_close_model(flexdiag_runtime *rt, flexdiag_model *m);
/* A context for images images of prompts up to np ids and n new ids; text sets the context
 * param of that name (Chameleon as a text decoder). */
flexdiag_context *gd_context(flexdiag_model *m, int32_t images, int32_t np, int32_t n, bool text);
/* Teacher forcing of a text decoder: all[0..np) as the prompt, then all[np..T) forced; the
 * logits (T - np, V) into logits (row i predicts all[np + i]), and when hidden is given the
 * output of every layer at the first n_hidden_pos positions (layers, n_hidden_pos, d). */
void gd_teacher_forced(flexdiag_model *m, bool text, const int32_t *all, int32_t T, int32_t np,
                       float *logits, float *hidden, int32_t n_hidden_pos);
/* Assert ‖got − ref‖ / ‖ref‖ <= gd_be.tol, printing the value under what. */
void gd_expect_close(const char *what, const float *got, const float *ref, int64_t n);

/* ---- groups ---- */

/* Run tests as group `name` when fixture model is there (golden.json with our magic and
 * version, and need when not NULL); *ran counts the groups run. Returns the failed tests, or 1
 * for a fixture whose manifest is wrong; a missing one is skipped with a line on stderr. */
int gd_group(const char *name, const char *model, const char *need,
             const struct CMUnitTest *tests, size_t n, int *ran);
#define GD_GROUP(name, model, need, tests, ran)                                                   \
    gd_group(name, model, need, tests, sizeof(tests) / sizeof((tests)[0]), ran)

/* ---- the tests (state unused) ---- */

/* Janus (golden_janus.c) */
void test_janus_logits(void **state);         /* CFG, cond, uncond generation-head logits */
void test_janus_hidden(void **state);         /* every layer's output, first positions */
void test_janus_original_names(void **state); /* deepseek-ai names and config: same bits */
void test_janus_score_cli(void **state);      /* `flexdiag score` as a process */
/* Llama and OPT (golden_text.c) */
void test_llama(void **state);             /* GQA logits and hidden states */
void test_opt(void **state);               /* logits, hidden, the left-padded batch */
void test_opt_greedy_logits(void **state); /* teacher-forced logits of the greedy text */
void test_opt_prompt_ids(void **state);    /* [BOS] + encode(prompt) as transformers */
void test_opt_tokenizer(void **state);     /* GPT-2 byte-level encode / decode cases */
void test_opt_generate_cli(void **state);  /* `flexdiag generate --top-k 1` = generate() */
/* The trained shapes-janus (golden_shapes.c) */
void test_shapes_logits(void **state); /* cond, uncond, CFG logits against its PyTorch */
/* Chameleon (golden_chameleon.c) */
void test_chameleon_text(void **state);      /* text-mode logits and hidden states */
void test_chameleon_qk_layouts(void **state); /* [heads, d_h] QK norms: same bits */
void test_chameleon_image(void **state);     /* image-mode CFG logits over the codes */
void test_chameleon_vqgan(void **state);     /* generate + a vqgan.safetensors: pixels */

#endif /* FLEXDIAG_TEST_GOLDEN_H */
