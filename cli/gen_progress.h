/*
 * gen_progress.h - throughput accounting of a `flexdiag generate` job on stderr: while it runs,
 * the images done, the rate and the projected finish (one process: on each block line; an MPI
 * job: rank 0 prints a job line at most every GEN_PROGRESS_EVERY_S seconds from every rank's
 * reports); at the end of an MPI job, images/s per rank and overall and the straggler.
 */
#ifndef FLEXDIAG_CLI_GEN_PROGRESS_H
#define FLEXDIAG_CLI_GEN_PROGRESS_H

#include <stdint.h>

#define GEN_PROGRESS_EVERY_S 10.0 /* seconds between an MPI job's progress lines */

typedef struct gen_progress {
    int64_t total;  /* images in the job */
    int64_t kept;   /* images complete in --out before this run (--resume) */
    int64_t todo;   /* images this run makes */
    int ranks;      /* processes of the job */
    int quiet;      /* --quiet: no progress lines (the end summary stays) */
    int text;       /* a text model's job: its "images" are texts (texts, texts/s) */
    double t0;      /* start of the generation, cli_now() seconds */
    double last;    /* last job line, cli_now() seconds; 0 = none yet */
    int64_t *images; /* (ranks) images each rank completed, as last reported */
    double *busy;    /* (ranks) seconds each rank spent on its chunks, as last reported */
} gen_progress;

/* One rank's account at the end of the job (gathered as bytes to rank 0). */
typedef struct gen_rank_end {
    double images;   /* images it completed */
    double busy_s;   /* seconds on its chunks */
    double finish_s; /* seconds from the job's start to when it ran out of chunks */
    int32_t device;  /* CUDA device it asked for; -1 = --cpu */
    char host[52];   /* host name */
} gen_rank_end;

/* Start accounting at cli_now(); 0, or 1 when out of memory (after one line). */
int gen_progress_init(gen_progress *p, int ranks, int64_t total, int64_t kept, int64_t todo,
                      int quiet, int text);
void gen_progress_fini(gen_progress *p);
/* A job_report_fn (user = the gen_progress): rank's images and busy seconds so far; prints a
 * job line when one is due (several ranks). */
void gen_progress_report(void *user, int rank, int64_t images, double busy_s);
/* One process: the line after a block of n images that took block_s seconds; made = images
 * this run completed so far (a DPG prompt in progress included). */
void gen_progress_block(const gen_progress *p, int64_t made, int32_t n, double block_s);
/* The end of a job of several ranks (all: one gen_rank_end per rank, in rank order). */
void gen_progress_summary(const gen_progress *p, const gen_rank_end *all, const char *out);

#endif /* FLEXDIAG_CLI_GEN_PROGRESS_H */
