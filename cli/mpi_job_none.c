/*
 * mpi_job_none.c - the job's processes without MPI (mpi_job.h): a world of one process, whose
 * collectives return their input and whose hand-out is a counter. Built instead of mpi_job.c
 * when meson finds no MPI (or -Dmpi=disabled).
 * Started by mpirun as one of several processes, this build would not know the others and every
 * process would write every image into the same --out: job_world_init refuses that (exit 2),
 * reading the sizes MPI launchers announce (OMPI_COMM_WORLD_SIZE, PMI_SIZE), and says how to
 * build with MPI.
 */
#include "cli/mpi_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct {
    int64_t next, n;      /* next chunk to hand out, chunks in all */
    int stop;             /* asked to stop: no more chunks */
    job_report_fn report; /* progress, or NULL */
    void *user;
} g_d;

/* Processes the launcher says it started (1 without a launcher). */
static long launched_size(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    return s ? strtol(s, NULL, 10) : 1;
}

int job_world_init(const char *cmd, job_world *w) {
    memset(w, 0, sizeof *w);
    w->size = w->local_size = 1;
    if (gethostname(w->host, sizeof w->host - 1) != 0) snprintf(w->host, sizeof w->host, "?");
    long n = launched_size();
    if (n <= 1) return 0;
    fprintf(stderr, "flexdiag %s: started as one of %ld MPI processes, but this flexdiag was "
                    "built without MPI, so each would run the whole job into the same --out; "
                    "install libopenmpi-dev and rebuild (meson setup -Dmpi=enabled), or run one "
                    "process without mpirun\n", cmd, n);
    return 2;
}

void job_world_fini(job_world *w) { (void)w; }

int job_agree(const job_world *w, int rc) {
    (void)w;
    return rc;
}

void job_bcast(const job_world *w, void *buf, size_t n) { (void)w, (void)buf, (void)n; }

int64_t job_min(const job_world *w, int64_t v) {
    (void)w;
    return v;
}

void job_gather(const job_world *w, const void *mine, size_t n, void *all) {
    (void)w;
    memcpy(all, mine, n);
}

void job_dispatch_start(const job_world *w, int64_t n_chunks, job_report_fn report,
                        void *user) {
    (void)w;
    g_d.next = 0;
    g_d.n = n_chunks;
    g_d.stop = 0;
    g_d.report = report;
    g_d.user = user;
}

int64_t job_dispatch_next(int stop, int64_t images, double busy_s) {
    g_d.stop |= stop;
    if (g_d.report) g_d.report(g_d.user, 0, images, busy_s);
    return g_d.stop || g_d.next >= g_d.n ? -1 : g_d.next++;
}

void job_dispatch_end(void) { g_d.report = NULL; }
