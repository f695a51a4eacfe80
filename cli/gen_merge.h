/*
 * gen_merge.h - the records of an existing --out, gathered into results.jsonl and tokens.json:
 * at the end of an MPI job (the ranks' part files) and at the start of a --resume run (whatever
 * an earlier run, interrupted or not, with or without MPI, left). Every record is checked
 * against this run's configuration; an image counts as complete when its results.jsonl record,
 * its tokens.json record (same token hash) and its PNG are all there (DPG: every sample of its
 * prompt).
 */
#ifndef FLEXDIAG_CLI_GEN_MERGE_H
#define FLEXDIAG_CLI_GEN_MERGE_H

#include <stdint.h>

#include "cli/gen_out.h"

/* Read every record file of w->dir (results.jsonl, tokens.json, and the part and temp files of
 * interrupted runs), check each record against this run (w's prompts, layout, per_image and
 * common fields; total images), rewrite results.jsonl and tokens.json (temp + rename) to hold
 * exactly the complete images in image order, then remove the part and temp files it read.
 * done (total bytes) gets 1 for each complete image, *n_done their count. Returns 0; 2 when a
 * record belongs to another run configuration (one line naming --out, the file, the field and
 * the flag); 1 when a file cannot be read or written (one line naming it). */
int gen_merge_folder(const gen_out *w, int64_t total, uint8_t *done, int64_t *n_done);

/* Remove the part and temp record files that interrupted runs left in dir (a fresh run starts
 * from results.jsonl and tokens.json alone). */
void gen_merge_clear(const char *dir);

#endif /* FLEXDIAG_CLI_GEN_MERGE_H */
