/*
 * mpi_job.h - the processes of one `flexdiag generate` job: the MPI world (rank, size, the
 * ranks sharing this host), the few collectives the job needs, and the dynamic hand-out of its
 * chunks. Two implementations, one chosen by meson: mpi_job.c on MPI (-Dmpi=auto|enabled and
 * an MPI found), mpi_job_none.c without it (a world of one process; refuses to run as one of
 * several processes an MPI launcher started). Without a launcher (no mpirun, srun) MPI is never
 * initialised and the job is one process, as in a build without MPI.
 * Hand-out: chunk indices 0, 1, ... go to whichever rank asks first; every rank calls
 * job_dispatch_next until it answers -1 (the chunks ran out, or some rank asked to stop), and
 * each call reports that rank's progress to rank 0, where a callback sees every report.
 * Collectives (job_agree, job_bcast, job_min, job_gather) are called by every rank in the
 * same order.
 */
#ifndef FLEXDIAG_CLI_MPI_JOB_H
#define FLEXDIAG_CLI_MPI_JOB_H

#include <stddef.h>
#include <stdint.h>

typedef struct job_world {
    int rank, size;             /* this process in the job; 0 and 1 without MPI */
    int local_rank, local_size; /* among the job's processes on this host */
    int mpi;                    /* 1: MPI is initialised (job_world_fini finalises it) */
    char host[64];              /* this host's name, for messages */
} job_world;

/* Progress report of one rank: images it completed and seconds it spent on its chunks so far.
 * Called on rank 0 only, one call at a time (from a hand-out thread or the caller's). */
typedef void (*job_report_fn)(void *user, int rank, int64_t images, double busy_s);

/* Join the job: MPI_Init (threads: serialized) when an MPI launcher started this process.
 * 0, or an exit code after one line naming the problem (cmd names the command). */
int job_world_init(const char *cmd, job_world *w);
/* Leave the job (MPI_Finalize when initialised). */
void job_world_fini(job_world *w);

/* The largest of every rank's rc (exit codes: any failure stops every rank). */
int job_agree(const job_world *w, int rc);
/* Rank 0's n bytes at buf to every rank (n < 2^31). */
void job_bcast(const job_world *w, void *buf, size_t n);
/* The smallest of every rank's v. */
int64_t job_min(const job_world *w, int64_t v);
/* Every rank's n bytes at mine, in rank order, into all (size * n bytes) on rank 0. */
void job_gather(const job_world *w, const void *mine, size_t n, void *all);

/* Start handing out chunks 0 .. n_chunks - 1 (w is borrowed until job_dispatch_end); report
 * (may be NULL) gets every rank's progress on rank 0. No other job_* call may come between this
 * and job_dispatch_end. */
void job_dispatch_start(const job_world *w, int64_t n_chunks, job_report_fn report,
                        void *user);
/* Report this rank's progress and take the next chunk: its index, or -1 when none is left or
 * some rank asked to stop; stop != 0 asks every rank to stop after its current chunk. */
int64_t job_dispatch_next(int stop, int64_t images, double busy_s);
/* After this rank's last job_dispatch_next: on rank 0, wait until every rank has had its -1. */
void job_dispatch_end(void);

#endif /* FLEXDIAG_CLI_MPI_JOB_H */
