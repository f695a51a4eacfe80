/*
 * score_input.h - the JSON input of `flexdiag score`: {"prompt_ids": [...], "image_ids": [...],
 * "cfg_weight": 5.0}. prompt_ids is the conditional row from BOS through <begin_of_image>,
 * image_ids the tokens to score (a text continuation for Llama models), cfg_weight the CFG
 * weight (5.0 when absent). Its own file so the command and the fuzz target
 * (tests/fuzz/fuzz_score_input.c) run the same parser. Plain C on jansson.
 */
#ifndef FLEXDIAG_CLI_SCORE_INPUT_H
#define FLEXDIAG_CLI_SCORE_INPUT_H

#include <stdint.h>

/* Ids per array: bounds what a malformed file can make us allocate; real prompts hold about a
 * hundred ids and a Janus image 576. */
#define CLI_SCORE_MAX_IDS 1000000

typedef struct cli_score_input {
    int32_t *prompt; /* np prompt ids, each in [0, INT32_MAX], malloc'ed */
    int32_t *ids;    /* n ids to score, each in [0, INT32_MAX], malloc'ed */
    int32_t np, n;   /* counts, 1..CLI_SCORE_MAX_IDS each */
    double cfg;      /* cfg_weight */
} cli_score_input;

/* Read file (--input; borrowed) into *in. Returns 0, or the exit code after printing one line
 * "flexdiag <cmd>: ..." naming the file (and the key): 2 for bad input, 1 when out of memory.
 * On failure *in is zeroed and owns nothing. */
int cli_score_input_read(const char *cmd, const char *file, cli_score_input *in);
/* Free in's arrays and zero it. */
void cli_score_input_free(cli_score_input *in);

#endif /* FLEXDIAG_CLI_SCORE_INPUT_H */
