/*
 * token_grids.h - reading the image-token grids of `flexdiag decode` (token_grids.c): a .npy of
 * ids or generate's tokens.json. Also the fuzz target tests/fuzz/fuzz_token_grids.c.
 */
#ifndef FLEXDIAG_CLI_TOKEN_GRIDS_H
#define FLEXDIAG_CLI_TOKEN_GRIDS_H

#include <stdint.h>

/* The grids to decode. */
typedef struct cli_token_grids {
    int32_t *ids;    /* (n, hw) codebook ids */
    int64_t *name;   /* (n) each grid's PNG name: its .npy row or its record's image_index */
    int64_t n;
    const char *cmd; /* the command, for messages */
} cli_token_grids;

/* The grids of path (a tokens.json when its first non-blank byte is '{', else a .npy) with hw
 * ids each, every id in [0, vocab); index >= 0 keeps the tokens.json record of that
 * image_index (a .npy is refused with it). Returns 0, or the exit code after one line naming
 * the file (2: bad contents, 1: unreadable or out of memory); free t either way. */
int cli_token_grids_read(const char *cmd, const char *path, int64_t hw, int32_t vocab,
                         int64_t index, cli_token_grids *t);
void cli_token_grids_free(cli_token_grids *t);

#endif /* FLEXDIAG_CLI_TOKEN_GRIDS_H */
