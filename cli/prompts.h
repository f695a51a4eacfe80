/*
 * prompts.h - the prompt sets `flexdiag generate` reads: one --prompt, a plain file (one prompt
 * per line), GenEval's evaluation_metadata.jsonl (one JSON object per line, kept verbatim for
 * the output layout) and DPG-Bench's prompts (a folder of <id>.txt, or <id><TAB><prompt> lines).
 * Every prompt is checked to be valid UTF-8; errors print one line naming the file and line.
 * A prompt may also come as token ids (--prompt-ids 1,2,3, or --prompt-ids-file with one such
 * list a line) for a model without tokenizer.json: fed as they are, BOS and template included.
 */
#ifndef FLEXDIAG_CLI_PROMPTS_H
#define FLEXDIAG_CLI_PROMPTS_H

#include <stdint.h>

typedef enum cli_layout {
    CLI_LAYOUT_PLAIN,   /* <out>/<prompt>/<sample>.png */
    CLI_LAYOUT_GENEVAL, /* <out>/<index:05d>/{metadata.jsonl, samples/<k:04d>.png} */
    CLI_LAYOUT_DPG,     /* <out>/<id>.png grids */
    CLI_LAYOUT_COUNT
} cli_layout;

/* "plain", "geneval", "dpg". */
extern const char *const cli_layout_names[CLI_LAYOUT_COUNT];

typedef struct cli_prompt {
    char *text; /* UTF-8 prompt; for token ids, their list "1,2,3" (what the records show) */
    char *meta; /* geneval: its evaluation_metadata.jsonl line, verbatim; else NULL */
    char *id;   /* dpg: prompt id = output file stem; else NULL */
} cli_prompt;

typedef struct cli_prompts {
    cli_prompt *p;    /* n prompts, owned */
    int n, cap;       /* count and capacity */
    const char *path; /* --prompts, for messages (borrowed) */
    const char *flag; /* the flag that named path, for messages; NULL: "--prompts" */
    int32_t **ids;    /* (n) token-id prompts: prompt i's ids, owned; NULL for text prompts */
    int32_t *n_ids;   /* (n) their counts */
} cli_prompts;

/* Fill s (zeroed by the caller) from file (--prompts, read as layout says) or, without a file,
 * from the single prompt text. cmd names the command in messages. Returns 0, or the exit code
 * after printing one line: 2 for bad input (naming the file and line), 1 when out of memory.
 * s holds what was read so far either way; free it with cli_prompts_free. */
int cli_prompts_load(const char *cmd, cli_layout layout, const char *file, const char *prompt,
                     cli_prompts *s);
/* Fill s (zeroed by the caller) with token-id prompts: the one list of --prompt-ids (list), or
 * one list a line of --prompt-ids-file (file). A list is whole numbers in [0, 2^31) separated
 * by commas or spaces. Returns 0, or the exit code after one line naming the flag (and line):
 * 2 for bad input, 1 when out of memory. */
int cli_prompts_load_ids(const char *cmd, const char *list, const char *file, cli_prompts *s);
void cli_prompts_free(cli_prompts *s);

#endif /* FLEXDIAG_CLI_PROMPTS_H */
