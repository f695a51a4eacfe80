/*
 * store_io.h - what store.c shares with its two I/O backends (private to offload/).
 *
 * store.c owns the file, the extents, and the request machinery both backends drive: a table of
 * request slots (max_requests), a FIFO of slots waiting to be issued, and a table of batches
 * (max_batches) whose pending count reaches 0 when their last request finishes. A backend only
 * issues what the FIFO holds and reports each outcome through flexdiag__store_done (short
 * transfers: flexdiag__store_requeue after advancing the slot). Everything below is guarded by
 * store->mu; the thread backend's workers drop it around pread/pwrite, io_uring holds it.
 *
 * Backends: store_uring.c (or store_uring_none.c in a build without liburing) and
 * store_threads.c. Rejected: one vtable per request kind, or the backends owning their queues;
 * one FIFO keeps the ordering, the batch accounting and the error messages in one place.
 */
#ifndef FLEXDIAG_STORE_IO_H
#define FLEXDIAG_STORE_IO_H

#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_OFFLOAD)
#error "offload/store_io.h is private to offload/ (use offload/store.h)"
#endif

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/ranges.h"
#include "offload/store.h"

/* Consecutive EAGAIN/EINTR on one request before it fails: a kernel that keeps refusing is
 * broken, and an endless retry would hang the step. Reset on progress. */
#define FLEXDIAG_STORE_MAX_RETRIES 1000

/* One request slot. */
typedef struct flexdiag_store_slot {
    uint64_t off;      /* bytes: where the next transfer starts (advances on short I/O) */
    char *buf;         /* host address matching off */
    size_t left;       /* bytes still to transfer */
    uint64_t off0;     /* the request as submitted (messages) */
    size_t len0;       /* bytes, the request as submitted */
    uint32_t batch;    /* index of its batch */
    uint32_t gen;      /* bumped on every reuse; io_uring's user_data carries it */
    int32_t buf_index; /* registered buffer holding buf .. buf + left, -1: none */
    int32_t next;      /* free-list link, -1: end */
    uint32_t retries;  /* EAGAIN / EINTR in a row */
    uint8_t op;        /* flexdiag_store_op */
} flexdiag_store_slot;

typedef struct flexdiag_store_batch {
    uint32_t gen;         /* bumped on every reuse; part of the ticket */
    uint32_t pending;     /* requests not yet done */
    int in_use;           /* submitted and not yet waited for */
    flexdiag_status st;   /* first error of the batch, FLEXDIAG_OK so far */
    char msg[512];        /* its message (workers cannot use the thread-local error buffer) */
} flexdiag_store_batch;

/* A backend: open fails with a reason (why) the store logs before it falls back. */
typedef struct flexdiag_store_backend {
    const char *name; /* "io_uring", "threads" */
    /* start on s->fd; 0 or -errno with why (n bytes) filled */
    int (*open)(flexdiag_store *s, char *why, size_t n);
    /* stop; called with nothing queued or in flight, without s->mu */
    void (*close)(flexdiag_store *s);
    /* requests were queued (s->mu held): issue what can be issued */
    void (*kick)(flexdiag_store *s);
    /* make progress (s->mu held); wait != 0: block until at least one request finished.
     * Returns OK or a status with a message when the backend itself broke. */
    flexdiag_status (*progress)(flexdiag_store *s, int wait);
    /* register regions (s->mu held, nothing in flight): 1 active, 0 plain I/O (why filled) */
    int (*register_buffers)(flexdiag_store *s, const flexdiag_store_buf *b, int n, char *why,
                            size_t wn);
} flexdiag_store_backend;

struct flexdiag_store {
    char name[64];                  /* for messages */
    char path[4096];                /* the file (unlinked) */
    char dir[4096];                 /* the offload folder */
    int fd;                         /* open file, O_DIRECT when direct */
    int direct;                     /* 1: O_DIRECT */
    char note[1024];                /* how the store degraded ("; "-separated) */
    uint32_t queue_depth;           /* in flight at most (ring entries / workers' queue) */
    uint32_t io_threads;            /* thread backend workers */

    pthread_mutex_t alloc_mu;       /* guards ranges */
    flexdiag_ranges ranges;         /* extents of the file */

    pthread_mutex_t mu;             /* guards everything below */
    pthread_cond_t done_cv;         /* a request finished */
    pthread_cond_t work_cv;         /* a request was queued, or stop (thread backend) */
    flexdiag_store_slot *slots;     /* (max_requests) */
    uint32_t max_requests;
    int32_t free_slot;              /* head of the free slot list, -1: none */
    uint32_t *fifo;                 /* (max_requests) slots waiting to be issued, circular */
    uint32_t fifo_head, fifo_len;   /* first entry, entries */
    uint32_t outstanding;           /* slots taken (queued, issued or being retried) */
    flexdiag_store_batch *batches;  /* (max_batches) */
    uint32_t max_batches;
    uint32_t next_batch;            /* where the search for a free batch starts */
    flexdiag_store_buf *bufs;       /* (n_bufs) registered regions, each <= 1 GiB */
    int n_bufs;
    int registered;                 /* 1: the backend uses fixed buffers for them */
    flexdiag_store_stats st;        /* I/O counters (accounting fields filled by stats) */

    const flexdiag_store_backend *be; /* backend in use */
    void *be_state;                 /* the backend's own state */
};

/* The two backends; flexdiag__store_uring is unavailable (open fails with ENOSYS) in a build
 * without liburing. */
extern const flexdiag_store_backend flexdiag__store_uring;
extern const flexdiag_store_backend flexdiag__store_threads;

/* FIFO: the next slot to issue (-1 when empty), and put a slot back at the end (short transfer
 * remainder, EAGAIN). s->mu held. */
int32_t flexdiag__store_pop(flexdiag_store *s);
void flexdiag__store_requeue(flexdiag_store *s, uint32_t slot);
/* Finish a slot: err 0 (all transferred), a positive errno, or -1 for an unexpected end of file.
 * Updates its batch and the counters, frees the slot, wakes waiters. s->mu held. */
void flexdiag__store_done(flexdiag_store *s, uint32_t slot, int err);
/* Append "; "-separated text to s->note. */
void flexdiag__store_add_note(flexdiag_store *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif /* FLEXDIAG_STORE_IO_H */
