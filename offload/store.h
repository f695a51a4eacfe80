/*
 * store.h - the NVMe tier: one preallocated, unlinked file carved into 4 KiB-aligned extents,
 * read and written in asynchronous batches (docs/offloading.md §1).
 *
 * create: mkstemp in the offload folder, unlink at once (a crash leaves nothing behind),
 * fallocate the budget (ftruncate where the file system cannot preallocate), O_DIRECT where the
 * file system allows it (buffered otherwise, with a note). Extents are carved first-fit with
 * exact accounting (offload/ranges.h); a request over budget is FLEXDIAG_ERR_NO_SPACE naming the
 * store, the request and what is left.
 *
 * I/O: submit a batch of requests (read or write, store offset, length, host buffer; all
 * multiples of 4096) and get a ticket; wait (or test) on the ticket. Two backends behind one
 * semantics: io_uring (registered file, registered buffers for the staging regions the caller
 * registers, read_fixed/write_fixed on them) and a pread/pwrite thread pool, chosen at create
 * time: io_uring unless FLEXDIAG_IO=threads, the params say so, this build lacks liburing, or
 * io_uring_queue_init fails (ENOSYS, EPERM under seccomp or the sysctl, old kernel). Short
 * transfers are resubmitted for the remainder, EAGAIN and EINTR retried; any other error fails
 * its batch with a status (FLEXDIAG_ERR_IO, FLEXDIAG_ERR_NO_SPACE for ENOSPC/EDQUOT) whose
 * message names the file, offset, length and errno, and the store stays usable.
 *
 * Threads: extent alloc/free and the queries may be called from any thread. The I/O calls
 * (submit, wait, test, register_buffers) come from one thread at a time (the scheduler's I/O
 * thread); they are serialised by a lock, so misuse costs time, never corruption.
 */
#ifndef FLEXDIAG_STORE_H
#define FLEXDIAG_STORE_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/store.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stddef.h>
#include <stdint.h>

#include "flexdiag.h"

/* Alignment of extents, request offsets, lengths and buffers: 4096 covers the logical block
 * size of every NVMe/SATA device we target (512 or 4096), so O_DIRECT accepts every request. */
#define FLEXDIAG_STORE_ALIGN 4096u

typedef enum flexdiag_store_io {
    FLEXDIAG_STORE_IO_AUTO = 0,    /* io_uring, else threads; FLEXDIAG_IO=uring|threads overrides */
    FLEXDIAG_STORE_IO_URING = 1,   /* io_uring or fail (FLEXDIAG_ERR_UNSUPPORTED) */
    FLEXDIAG_STORE_IO_THREADS = 2, /* the pread/pwrite thread pool */
} flexdiag_store_io;

typedef enum flexdiag_store_op {
    FLEXDIAG_STORE_READ = 0,  /* file -> host buffer */
    FLEXDIAG_STORE_WRITE = 1, /* host buffer -> file */
} flexdiag_store_op;

typedef struct flexdiag_store flexdiag_store;
typedef uint64_t flexdiag_store_ticket; /* one submitted batch; 0 is never a valid ticket */

typedef struct flexdiag_store_params {
    const char *dir;          /* folder of the store file (--offload-dir); copied */
    uint64_t budget;          /* bytes (--disk-mem), rounded down to 4096; >= 4096 */
    const char *name;         /* for messages ("weights", "kv"); copied; default "store" */
    flexdiag_store_io io;     /* backend choice, default AUTO */
    uint32_t queue_depth;     /* requests in flight in the kernel/pool; power of two in
                                 [32, 4096], default 64 */
    uint32_t io_threads;      /* workers of the thread backend; 0 = min(queue_depth, 16) */
    uint32_t max_requests;    /* requests submitted and not yet complete, all batches; default
                                 4096; a larger batch is INVALID_ARG */
    uint32_t max_batches;     /* tickets submitted and not yet waited for; default 256 */
    int direct;               /* 1 (default): O_DIRECT where the file system allows it */
} flexdiag_store_params;

/* An extent of the store file. */
typedef struct flexdiag_store_extent {
    uint64_t off;   /* bytes from the start of the file, multiple of 4096 */
    uint64_t bytes; /* bytes asked for (exact) */
    uint64_t span;  /* bytes carved: bytes rounded up to 4096 */
} flexdiag_store_extent;

/* One transfer of a batch. */
typedef struct flexdiag_store_req {
    flexdiag_store_op op; /* read or write */
    uint64_t off;         /* bytes from the start of the file (extent.off + offset inside),
                             multiple of 4096 */
    size_t len;           /* bytes, multiple of 4096, > 0; off + len within the file */
    void *buf;            /* host memory, 4096-aligned, len bytes; borrowed until the ticket is
                             waited for (a read writes it, a write must not change it) */
} flexdiag_store_req;

/* A host region for registered (fixed-buffer) I/O: the staging slab of the pinned pool. */
typedef struct flexdiag_store_buf {
    void *base;   /* start; anonymous memory (mmap, malloc) */
    size_t bytes; /* length */
} flexdiag_store_buf;

typedef struct flexdiag_store_stats {
    uint64_t capacity;      /* bytes of the file (the budget rounded down to 4096) */
    uint64_t used;          /* bytes carved by live extents (4096 multiples) */
    uint64_t peak;          /* high-water mark of used */
    uint64_t requested;     /* exact bytes of the live extents */
    uint64_t largest_free;  /* bytes of the largest free run */
    uint64_t bytes_read;    /* bytes transferred file -> host */
    uint64_t bytes_written; /* bytes transferred host -> file */
    uint64_t requests;      /* requests completed (successfully or not) */
    uint64_t resubmits;     /* remainders resubmitted after short transfers */
    uint64_t retries;       /* EAGAIN / EINTR retries */
    uint64_t errors;        /* requests that failed */
} flexdiag_store_stats;

/* ---- lifetime ---- */

/* Defaults into p (dir NULL, budget 0: the caller sets both). */
void flexdiag__store_params_init(flexdiag_store_params *p);
/* Create the store file and start the I/O backend; *out owned by the caller. NO_SPACE when the
 * folder cannot hold the budget, IO when it cannot be used, UNSUPPORTED when io_uring was
 * required and is unavailable. On failure *out is NULL and nothing is left in dir. */
flexdiag_status flexdiag__store_create(const flexdiag_store_params *p, flexdiag_store **out);
/* Wait for every request in flight, stop the backend, close (and so delete) the file. NULL is a
 * no-op. Tickets not waited for are dropped. */
void flexdiag__store_destroy(flexdiag_store *s);

/* ---- extents ---- */

/* Carve an extent of bytes (> 0) for `what` (a name for messages; borrowed for the call).
 * NO_SPACE over budget or when no free run is large enough (the message says which). */
flexdiag_status flexdiag__store_alloc(flexdiag_store *s, uint64_t bytes, const char *what,
                                      flexdiag_store_extent *out);
/* Return an extent (as alloc filled it); its data is gone. No I/O on it may be in flight. */
void flexdiag__store_free(flexdiag_store *s, const flexdiag_store_extent *e);

/* ---- I/O ---- */

/* Register host regions for fixed-buffer I/O (replacing earlier ones; no I/O may be in flight).
 * Requests whose buffer lies inside one use read_fixed/write_fixed. Where the kernel refuses
 * (RLIMIT_MEMLOCK, file-backed memory) the store keeps plain I/O and says so in its note: that
 * is OK, not an error. INVALID_ARG for bad regions or I/O in flight. */
flexdiag_status flexdiag__store_register_buffers(flexdiag_store *s, const flexdiag_store_buf *b,
                                                 int n);
/* Queue n requests (copied) as one batch and start them; *ticket identifies it. All requests are
 * checked first (INVALID_ARG names the bad one; nothing is queued then). May wait for earlier
 * requests when max_requests are outstanding; BUSY when max_batches tickets are unwaited. */
flexdiag_status flexdiag__store_submit(flexdiag_store *s, const flexdiag_store_req *reqs, int n,
                                       flexdiag_store_ticket *ticket);
/* Wait until every request of the batch is done and release the ticket: OK, or the first
 * error of the batch (IO / NO_SPACE, message naming file, offset, length, errno). INVALID_ARG
 * for a ticket that is unknown or already waited for. */
flexdiag_status flexdiag__store_wait(flexdiag_store *s, flexdiag_store_ticket ticket);
/* Make progress without blocking; *done = 1 when the batch is complete (then wait returns at
 * once with its status). */
flexdiag_status flexdiag__store_test(flexdiag_store *s, flexdiag_store_ticket ticket, int *done);

/* ---- queries ---- */

/* "io_uring" or "threads": the backend in use (for the bench row). */
const char *flexdiag__store_backend(const flexdiag_store *s);
/* 1 when the file is open O_DIRECT, 0 when buffered. */
int flexdiag__store_direct(const flexdiag_store *s);
/* 1 when fixed-buffer I/O is active for the registered regions. */
int flexdiag__store_registered(const flexdiag_store *s);
/* How the store degraded, "" when it did not: why threads, why buffered, why not preallocated,
 * why not registered ("; "-separated). Valid for the store's lifetime. */
const char *flexdiag__store_note(const flexdiag_store *s);
/* The file's path (already unlinked), for messages. */
const char *flexdiag__store_path(const flexdiag_store *s);
/* Byte accounting and I/O counters. */
void flexdiag__store_stats(const flexdiag_store *s, flexdiag_store_stats *out);

#endif /* FLEXDIAG_STORE_H */
