/*
 * gen_progress.c - throughput accounting of a generate job (gen_progress.h).
 *
 * Rates count the images this run makes (a resumed run's kept images are in the "[done/total]"
 * count, not in the rate). The projected finish is the images left at the job's rate so far,
 * printed as a duration and a local clock time. One process keeps its block line (the format
 * tests and users know: "[done/total images] block of n in s s") and appends the rate and
 * finish to it. In an MPI job the ranks report at every chunk boundary (job_dispatch_next) and
 * rank 0 prints a job line at most every GEN_PROGRESS_EVERY_S seconds: one line for the whole
 * job, however many ranks (rejected: a line per rank per block, which floods mpirun's output).
 * At the end rank 0 prints one line per rank (images, busy seconds, images/s, when it ran out of
 * work) and the straggler: the rank that finished last, how long after the first one the job
 * waited for it, and the slowest rate against the mean. Each rank's times count from its own
 * start, taken right after a collective, so they compare across hosts to within its latency.
 */
#include "cli/gen_progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli/cli.h"

int gen_progress_init(gen_progress *p, int ranks, int64_t total, int64_t kept, int64_t todo,
                      int quiet, int text) {
    *p = (gen_progress){.total = total, .kept = kept, .todo = todo, .ranks = ranks,
                        .quiet = quiet, .text = text, .t0 = cli_now()};
    p->images = calloc((size_t)ranks, sizeof *p->images);
    p->busy = calloc((size_t)ranks, sizeof *p->busy);
    if (p->images && p->busy) return 0;
    fprintf(stderr, "flexdiag generate: out of host memory\n");
    return 1;
}

void gen_progress_fini(gen_progress *p) {
    free(p->images);
    free(p->busy);
    p->images = NULL;
    p->busy = NULL;
}

/* What the job makes, and its rate unit. */
static const char *things(const gen_progress *p) { return p->text ? "texts" : "images"; }
static const char *per_s(const gen_progress *p) { return p->text ? "texts/s" : "img/s"; }

/* "3 min 20 s" style duration of s seconds into buf. */
static const char *duration(double s, char *buf, size_t cap) {
    long t = (long)(s + 0.5);
    if (t < 60) snprintf(buf, cap, "%ld s", t);
    else if (t < 3600) snprintf(buf, cap, "%ld min %02ld s", t / 60, t % 60);
    else snprintf(buf, cap, "%ld h %02ld min", t / 3600, t % 3600 / 60);
    return buf;
}

/* "; 2.41 img/s, finish in ~3 min 20 s (14:05:11)" for made of todo images (texts/s for
 * texts) in elapsed s. */
static const char *rate_and_finish(const gen_progress *p, int64_t made, double elapsed,
                                   char *buf, size_t cap) {
    if (made <= 0 || elapsed <= 0) return "";
    double rate = (double)made / elapsed, left = (double)(p->todo - made) / rate;
    time_t at = time(NULL) + (time_t)(left + 0.5);
    struct tm tm;
    char when[32] = "?", dur[32];
    if (localtime_r(&at, &tm))
        strftime(when, sizeof when, left < 86400 ? "%H:%M:%S" : "%Y-%m-%d %H:%M", &tm);
    snprintf(buf, cap, "; %.2f %s, finish in ~%s (%s)", rate, per_s(p),
             duration(left, dur, sizeof dur), when);
    return buf;
}

void gen_progress_block(const gen_progress *p, int64_t made, int32_t n, double block_s) {
    if (p->quiet) return;
    char tail[128];
    fprintf(stderr, "[%lld/%lld %s] block of %d in %.2f s%s\n", (long long)(p->kept + made),
            (long long)p->total, things(p), n, block_s,
            rate_and_finish(p, made, cli_now() - p->t0, tail, sizeof tail));
}

void gen_progress_report(void *user, int rank, int64_t images, double busy_s) {
    gen_progress *p = user;
    p->images[rank] = images;
    p->busy[rank] = busy_s;
    double now = cli_now();
    if (p->quiet || p->ranks < 2 || (p->last > 0 && now - p->last < GEN_PROGRESS_EVERY_S))
        return;
    int64_t made = 0;
    for (int r = 0; r < p->ranks; r++) made += p->images[r];
    if (made == 0) return;
    p->last = now;
    char tail[128];
    fprintf(stderr, "[%lld/%lld %s] %d ranks%s\n", (long long)(p->kept + made),
            (long long)p->total, things(p), p->ranks,
            rate_and_finish(p, made, now - p->t0, tail, sizeof tail));
}

/* Images per second of a rank's busy time. */
static double rank_rate(const gen_rank_end *e) {
    return e->busy_s > 0 ? e->images / e->busy_s : 0;
}

/* The straggler: who finished last and how long the job waited for it; the slowest rate. */
static void straggler(const gen_progress *p, const gen_rank_end *all, double wall) {
    int last = 0, slow = 0;
    double first_end = all[0].finish_s, mean = 0;
    for (int r = 0; r < p->ranks; r++) {
        if (all[r].finish_s > all[last].finish_s) last = r;
        if (all[r].finish_s < first_end) first_end = all[r].finish_s;
        if (rank_rate(&all[r]) < rank_rate(&all[slow])) slow = r;
        mean += rank_rate(&all[r]) / p->ranks;
    }
    double wait = all[last].finish_s - first_end;
    fprintf(stderr, "  straggler: rank %d finished last, %.2f s after the first rank ran out of "
                    "work (%.1f%% of the job); slowest: rank %d at %.2f img/s, %.1f%% under the "
                    "mean %.2f img/s\n", last, wait, wall > 0 ? 100 * wait / wall : 0, slow,
            rank_rate(&all[slow]), mean > 0 ? 100 * (1 - rank_rate(&all[slow]) / mean) : 0,
            mean);
}

void gen_progress_summary(const gen_progress *p, const gen_rank_end *all, const char *out) {
    double wall = 0, images = 0;
    for (int r = 0; r < p->ranks; r++) {
        images += all[r].images;
        if (all[r].finish_s > wall) wall = all[r].finish_s;
    }
    fprintf(stderr, "job: %.0f image(s) by %d ranks in %.2f s: %.2f img/s overall", images,
            p->ranks, wall, wall > 0 ? images / wall : 0);
    if (p->kept) fprintf(stderr, " (%lld more were complete already)", (long long)p->kept);
    fprintf(stderr, "; results.jsonl and tokens.json in %s\n", out);
    if (images == 0) return;
    for (int r = 0; r < p->ranks; r++) {
        char dev[24] = "cpu";
        if (all[r].device >= 0) snprintf(dev, sizeof dev, "device %d", all[r].device);
        fprintf(stderr, "  rank %d on %s (%s): %.0f image(s) in %.2f s busy, %.2f img/s; out of "
                        "work at %.2f s\n", r, all[r].host, dev, all[r].images, all[r].busy_s,
                rank_rate(&all[r]), all[r].finish_s);
    }
    straggler(p, all, wall);
}
