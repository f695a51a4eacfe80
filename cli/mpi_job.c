/*
 * mpi_job.c - the job's processes on MPI (mpi_job.h); built when meson finds MPI.
 *
 * MPI is initialised only when a launcher started the process (Open MPI's mpirun sets
 * OMPI_COMM_WORLD_SIZE, PMIx launchers PMIX_RANK, PMI ones PMI_RANK): a plain `flexdiag
 * generate` stays one process that never touches MPI, so it neither pays MPI's start-up nor
 * depends on a working MPI install. Rank, size and the ranks on this host come from MPI itself
 * (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), never from the launcher's variables.
 * Hand-out: rank 0 keeps the chunk counter. Its own work loop takes chunks under a mutex; a
 * thread on rank 0 answers the other ranks' requests (one message each way per chunk), polling
 * MPI_Test with a 1 ms sleep so that it costs no core. Rejected: an MPI window with
 * MPI_Fetch_and_op, which needs rank 0's progress to answer on interconnects without hardware
 * atomics (Open MPI over TCP has no progress thread), so ranks would wait for rank 0 to finish
 * its block; and a blocking MPI_Recv in the thread, which spins a core. The thread is the only
 * MPI caller on rank 0 while it runs (MPI_THREAD_SERIALIZED is enough): rank 0's main thread
 * calls MPI again only after job_dispatch_end has joined it.
 */
#include "cli/mpi_job.h"

#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TAG_ASK 1   /* rank -> rank 0: double[3] {stop, images, busy_s} */
#define TAG_CHUNK 2 /* rank 0 -> rank: int64 chunk index or -1 */
#define POLL_NS 1000000L /* 1 ms between the hand-out thread's polls: a chunk takes far longer */

/* The hand-out; one per process (a job is one per process). */
static struct {
    const job_world *w;
    pthread_mutex_t lock;
    pthread_t thread;
    int thread_on;        /* rank 0 of a world of several: the thread runs */
    int64_t next, n;      /* next chunk to hand out, chunks in all */
    int stop;             /* some rank asked to stop: no more chunks */
    job_report_fn report; /* rank 0: progress of every rank, or NULL */
    void *user;
} g_d = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- world ---- */

/* Whether an MPI launcher started this process. */
static int launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

int job_world_init(const char *cmd, job_world *w) {
    memset(w, 0, sizeof *w);
    w->size = w->local_size = 1;
    if (gethostname(w->host, sizeof w->host - 1) != 0) snprintf(w->host, sizeof w->host, "?");
    if (!launched()) return 0;
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "flexdiag %s: MPI_Init failed (started by mpirun? check the MPI "
                        "install)\n", cmd);
        return 1;
    }
    w->mpi = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &w->local_rank);
    MPI_Comm_size(node, &w->local_size);
    MPI_Comm_free(&node);
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS)
        snprintf(w->host, sizeof w->host, "%.*s", len, name);
    if (provided >= MPI_THREAD_SERIALIZED) return 0;
    fprintf(stderr, "flexdiag %s: this MPI offers thread level %d; the chunk hand-out needs "
                    "MPI_THREAD_SERIALIZED (%d)\n", cmd, provided, MPI_THREAD_SERIALIZED);
    return 1;
}

void job_world_fini(job_world *w) {
    if (w->mpi) MPI_Finalize();
    w->mpi = 0;
}

/* ---- collectives ---- */

int job_agree(const job_world *w, int rc) {
    int all = rc;
    if (w->mpi) MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

void job_bcast(const job_world *w, void *buf, size_t n) {
    if (w->mpi && n) MPI_Bcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
}

int64_t job_min(const job_world *w, int64_t v) {
    int64_t all = v;
    if (w->mpi) MPI_Allreduce(&v, &all, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

void job_gather(const job_world *w, const void *mine, size_t n, void *all) {
    if (!w->mpi) {
        memcpy(all, mine, n);
        return;
    }
    MPI_Gather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
}

/* ---- hand-out ---- */

/* Record rank's report and take the next chunk (-1: none, or stopping). */
static int64_t take(int rank, int stop, int64_t images, double busy_s) {
    pthread_mutex_lock(&g_d.lock);
    g_d.stop |= stop;
    if (g_d.report) g_d.report(g_d.user, rank, images, busy_s);
    int64_t c = g_d.stop || g_d.next >= g_d.n ? -1 : g_d.next++;
    pthread_mutex_unlock(&g_d.lock);
    return c;
}

/* Rank 0's thread: answer requests until every other rank has had its -1. */
static void *serve(void *arg) {
    (void)arg;
    const struct timespec nap = {0, POLL_NS};
    for (int ended = 0; ended < g_d.w->size - 1;) {
        double ask[3];
        MPI_Request rq;
        MPI_Status st;
        MPI_Irecv(ask, 3, MPI_DOUBLE, MPI_ANY_SOURCE, TAG_ASK, MPI_COMM_WORLD, &rq);
        for (int got = 0; !got;) {
            MPI_Test(&rq, &got, &st);
            if (!got) nanosleep(&nap, NULL);
        }
        int64_t c = take(st.MPI_SOURCE, ask[0] != 0, (int64_t)ask[1], ask[2]);
        MPI_Send(&c, 1, MPI_INT64_T, st.MPI_SOURCE, TAG_CHUNK, MPI_COMM_WORLD);
        ended += c < 0;
    }
    return NULL;
}

void job_dispatch_start(const job_world *w, int64_t n_chunks, job_report_fn report,
                        void *user) {
    g_d.w = w;
    g_d.next = 0;
    g_d.n = n_chunks;
    g_d.stop = 0;
    g_d.report = w->rank == 0 ? report : NULL;
    g_d.user = user;
    g_d.thread_on = w->rank == 0 && w->size > 1;
    if (!g_d.thread_on || pthread_create(&g_d.thread, NULL, serve, NULL) == 0) return;
    /* the other ranks are already asking: without an answer they would wait for ever */
    fprintf(stderr, "flexdiag generate: cannot start the chunk hand-out thread on rank 0; "
                    "stopping the job\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int64_t job_dispatch_next(int stop, int64_t images, double busy_s) {
    if (g_d.w->rank == 0) return take(0, stop, images, busy_s);
    double ask[3] = {stop ? 1.0 : 0.0, (double)images, busy_s};
    int64_t c = -1;
    MPI_Send(ask, 3, MPI_DOUBLE, 0, TAG_ASK, MPI_COMM_WORLD);
    MPI_Recv(&c, 1, MPI_INT64_T, 0, TAG_CHUNK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return c;
}

void job_dispatch_end(void) {
    if (g_d.thread_on) pthread_join(g_d.thread, NULL);
    g_d.thread_on = 0;
    g_d.report = NULL;
}
