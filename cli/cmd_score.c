/*
 * cmd_score.c - `flexdiag score`: teacher-forced logits of given image tokens.
 *
 * Input JSON {"prompt_ids": [...], "image_ids": [...], "cfg_weight": 5.0}, read by
 * cli/score_input.c: prompt_ids is the conditional row from BOS through <begin_of_image>; the
 * unconditional row follows the Janus rule. Output: float32 .npy [n, image_vocab], row i =
 * CFG-combined logits predicting image token i from the prompt and image tokens < i; with --raw
 * [2, n, image_vocab] (conditional, unconditional). For Llama models the ids are a text
 * continuation and the logits plain ([n, vocab]; --raw [1, n, vocab]). Under --policy X the run
 * uses policy X, so the output can be compared with dense.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/npy.h"
#include "cli/score_input.h"

static int score(flexdiag_model *m, const cli_score_input *in, const flexdiag_policy_params *pol,
                 const cli_policy_opts *po, const cli_model_opts *mo, const char *out, int raw) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cli_kv_homes("score", mo, &cp);
    cp.max_images = 1;
    cp.max_prompt_len = in->np;
    cp.max_new_tokens = in->n;
    cp.policy = *pol;
    cli_policy_calib(po, &cp);
    flexdiag_context *c = NULL;
    flexdiag_status st = flexdiag_context_create(m, &cp, &c);
    if (st != FLEXDIAG_OK) return cli_fail("score", st);
    flexdiag_score_request rq;
    flexdiag_score_request_init(&rq);
    rq.prompt_ids = in->prompt;
    rq.prompt_len = in->np;
    rq.ids = in->ids;
    rq.n = in->n;
    rq.cfg_weight = (float)in->cfg;
    flexdiag_score_output so = {.struct_size = sizeof so};
    st = flexdiag_score(c, &rq, &so); /* size query: vocab and rows */
    int64_t V = so.vocab, rows = raw ? so.rows : 1;
    float *buf = st == FLEXDIAG_OK ? malloc((size_t)rows * (size_t)in->n * (size_t)V * 4) : NULL;
    if (st == FLEXDIAG_OK && !buf) {
        fprintf(stderr, "flexdiag score: no host memory for %lld x %d logits\n",
                (long long)rows * V, in->n);
        flexdiag_context_destroy(c);
        return 1;
    }
    *(raw ? &so.raw : &so.logits) = buf;
    if (st == FLEXDIAG_OK) st = flexdiag_score(c, &rq, &so);
    flexdiag_context_destroy(c);
    int rc = st == FLEXDIAG_OK ? 0 : cli_fail("score", st);
    int64_t shape3[3] = {rows, in->n, V}, *shape = raw ? shape3 : shape3 + 1;
    if (!rc && flexdiag__npy_write(out, FLEXDIAG_NPY_F32, raw ? 3 : 2, shape, buf))
        rc = cli_fail_io("score");
    free(buf);
    if (!rc)
        fprintf(stderr, "scored %d token(s) after a %d-token prompt: %s\n", in->n, in->np, out);
    return rc;
}

int flexdiag_cmd_score(int argc, char **argv) {
    cli_model_opts mo = {.seed = 1};
    cli_policy_opts po = CLI_POLICY_OPTS_INIT;
    const char *input = NULL, *out = NULL;
    int raw = 0;
    const cli_opt opts[] = {
        CLI_MODEL_FLAGS(&mo),
        CLI_POLICY_FLAGS(&po),
        {.name = "--input", CLI_STR, &input, "JSON {prompt_ids, image_ids, cfg_weight}"},
        {.name = "--out", CLI_STR, &out, "output .npy (float32)"},
        {.name = "--raw", CLI_FLAG, &raw,
         "write per-row logits [rows, n, V] instead of CFG-combined"},
    };
    int rc = cli_parse("score", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (rc) return rc == 1 ? 0 : rc;
    if (!input || !out) {
        fprintf(stderr, "flexdiag score: --input FILE.json and --out FILE.npy are required\n");
        return 2;
    }
    flexdiag_policy_params pol;
    if (cli_policy_params("score", &po, &pol)) return 2;
    if (cli_check_writable("score", "--out", out)) return 1;
    cli_score_input in;
    rc = cli_score_input_read("score", input, &in);
    flexdiag_runtime *rt = NULL;
    flexdiag_model *m = NULL;
    if (rc == 0) rc = cli_open_model("score", &mo, &rt, &m);
    if (rc == 0) rc = score(m, &in, &pol, &po, &mo, out, raw);
    flexdiag_model_destroy(m);
    flexdiag_runtime_destroy(rt);
    cli_score_input_free(&in);
    return rc;
}
