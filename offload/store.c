/*
 * store.c - the NVMe store (see store.h): the file, its extents, batches and tickets.
 *
 * Data flow of a batch: submit checks every request, takes a batch and one slot per request,
 * puts the slots on the FIFO and kicks the backend; the backend issues FIFO entries (io_uring
 * SQEs, or a worker's pread/pwrite), requeues remainders and EAGAIN/EINTR, and reports each
 * outcome through flexdiag__store_done, which counts the batch down and keeps its first error
 * message. wait drives the backend until the batch's pending count is 0 and hands the status
 * back on the waiting thread (flexdiag__err is thread-local, so workers write the message into
 * the batch instead).
 *
 * File setup order matters for "nothing left behind": mkstemp, unlink at once, only then
 * fallocate (a crash while reserving 100 GB must not leak them), then switch on O_DIRECT and
 * prove it with one aligned read (fcntl accepts O_DIRECT on some file systems whose reads then
 * fail with EINVAL).
 */
#include "offload/store_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/core.h"

#define MAX_REG_CHUNK (1ull << 30) /* io_uring: one registered buffer is at most 1 GiB */

/* ---- small helpers ---- */

static const char *errname(int e) {
    const char *n = strerrorname_np(e);
    return n ? n : "?";
}

void flexdiag__store_add_note(flexdiag_store *s, const char *fmt, ...) {
    size_t len = strlen(s->note);
    if (len + 3 >= sizeof s->note) return;
    if (len) {
        memcpy(s->note + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->note + len, sizeof s->note - len, fmt, ap);
    va_end(ap);
}

void flexdiag__store_params_init(flexdiag_store_params *p) {
    memset(p, 0, sizeof *p);
    p->name = "store";
    p->io = FLEXDIAG_STORE_IO_AUTO;
    p->queue_depth = 64;
    p->max_requests = 4096;
    p->max_batches = 256;
    p->direct = 1;
}

/* FLEXDIAG_IO overrides an AUTO choice (tests and the bench force a backend with it). */
static flexdiag_status pick_io(flexdiag_store_io asked, flexdiag_store_io *out) {
    *out = asked;
    const char *env = getenv("FLEXDIAG_IO");
    if (asked != FLEXDIAG_STORE_IO_AUTO || !env || !*env || !strcmp(env, "auto")) return FLEXDIAG_OK;
    if (!strcmp(env, "uring") || !strcmp(env, "io_uring"))
        *out = FLEXDIAG_STORE_IO_URING;
    else if (!strcmp(env, "threads"))
        *out = FLEXDIAG_STORE_IO_THREADS;
    else
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "FLEXDIAG_IO=%s: expected uring, threads or auto", env);
    return FLEXDIAG_OK;
}

static flexdiag_status check_params(const flexdiag_store_params *p) {
    const uint32_t qd = p->queue_depth;
    if (!p->dir || !*p->dir)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store: no offload folder given "
                             "(runtime_params.offload_dir)");
    if (p->budget < FLEXDIAG_STORE_ALIGN)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store in %s: budget of %llu bytes is "
                             "below one 4096-byte extent (runtime_params.disk_mem)",
                             p->dir, (unsigned long long)p->budget);
    if (qd < 32 || qd > 4096 || (qd & (qd - 1)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store: queue depth %u: expected a power "
                             "of two in [32, 4096]", qd);
    if (p->max_requests == 0 || p->max_requests > (1u << 24) || p->max_batches == 0 ||
        p->max_batches > (1u << 20) || p->io > FLEXDIAG_STORE_IO_THREADS)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store: max_requests %u, max_batches %u "
                             "or io %d out of range", p->max_requests, p->max_batches, (int)p->io);
    return FLEXDIAG_OK;
}

/* ---- the file ---- */

/* Reserve cap bytes: fallocate, ftruncate where the file system cannot preallocate. */
static flexdiag_status reserve_file(flexdiag_store *s, uint64_t cap) {
    char want[32], have[32];
    flexdiag__fmt_bytes(cap, want, sizeof want);
    struct statvfs vfs;
    /* refuse up front rather than let fallocate fill the disk before it fails */
    if (statvfs(s->dir, &vfs) == 0 && vfs.f_frsize && (uint64_t)vfs.f_bavail < cap / vfs.f_frsize)
        return flexdiag__err(FLEXDIAG_ERR_NO_SPACE,
                             "store '%s': runtime_params.disk_mem asks %s but the offload folder "
                             "%s has only %s free: free space there or lower "
                             "runtime_params.disk_mem",
                             s->name, want, s->dir,
                             flexdiag__fmt_bytes((uint64_t)vfs.f_bavail * vfs.f_frsize, have,
                                                 sizeof have));
    int r;
    do r = fallocate(s->fd, 0, 0, (off_t)cap);
    while (r != 0 && errno == EINTR);
    if (r == 0) return FLEXDIAG_OK;
    const int e = errno;
    if (e == EOPNOTSUPP || e == ENOSYS) {
        if (ftruncate(s->fd, (off_t)cap) == 0) {
            flexdiag__store_add_note(s, "the file system of %s cannot preallocate (fallocate: "
                                     "%s): sparse file, a full disk shows up as ENOSPC on write",
                                     s->dir, errname(e));
            return FLEXDIAG_OK;
        }
        return flexdiag__err(FLEXDIAG_ERR_IO, "store '%s': ftruncate of %s to %s: %s (%s)",
                             s->name, s->path, want, strerror(errno), errname(errno));
    }
    if (e == ENOSPC || e == EDQUOT || e == EFBIG)
        return flexdiag__err(FLEXDIAG_ERR_NO_SPACE,
                             "store '%s': cannot reserve %s in the offload folder %s: "
                             "fallocate: %s (%s)%s: free space there or lower "
                             "runtime_params.disk_mem",
                             s->name, want, s->dir, strerror(e), errname(e),
                             e == EFBIG ? ", larger than the file system's largest file" : "");
    return flexdiag__err(FLEXDIAG_ERR_IO, "store '%s': fallocate of %s in %s: %s (%s)", s->name,
                         want, s->dir, strerror(e), errname(e));
}

/* Switch the file to O_DIRECT and prove it with one aligned read; buffered with a note if the
 * file system refuses. */
static void enable_direct(flexdiag_store *s) {
    const int fl = fcntl(s->fd, F_GETFL);
    int e = 0;
    if (fl < 0 || fcntl(s->fd, F_SETFL, fl | O_DIRECT) != 0) e = errno;
    if (!e) {
        void *probe = NULL;
        if (posix_memalign(&probe, FLEXDIAG_STORE_ALIGN, FLEXDIAG_STORE_ALIGN) != 0) return;
        if (pread(s->fd, probe, FLEXDIAG_STORE_ALIGN, 0) < 0) e = errno;
        free(probe);
        if (e && fl >= 0) (void)fcntl(s->fd, F_SETFL, fl);
    }
    if (!e) {
        s->direct = 1;
        return;
    }
    flexdiag__store_add_note(s, "the file system of %s refuses O_DIRECT (%s): buffered I/O, "
                             "the page cache holds a second copy", s->dir, errname(e));
}

static flexdiag_status open_file(flexdiag_store *s, const flexdiag_store_params *p,
                                 uint64_t cap) {
    int n = snprintf(s->path, sizeof s->path, "%s/flexdiag-store-XXXXXX", p->dir);
    if (n < 0 || (size_t)n >= sizeof s->path)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store: offload folder path too long");
    s->fd = mkostemp(s->path, O_CLOEXEC);
    if (s->fd < 0) {
        const int e = errno;
        return flexdiag__err(e == ENOENT || e == ENOTDIR ? FLEXDIAG_ERR_NOT_FOUND : FLEXDIAG_ERR_IO,
                             "store '%s': cannot create a file in the offload folder %s: %s (%s)",
                             s->name, p->dir, strerror(e), errname(e));
    }
    /* unlinked before anything can fail or crash: the space goes back with the last close */
    if (unlink(s->path) != 0)
        FLEXDIAG_WARN("store '%s': unlink %s: %s: remove it by hand after the run", s->name,
                      s->path, strerror(errno));
    FLEXDIAG_TRY(reserve_file(s, cap));
    if (p->direct) enable_direct(s);
    return FLEXDIAG_OK;
}

/* ---- request and batch tables ---- */

static flexdiag_status alloc_tables(flexdiag_store *s, const flexdiag_store_params *p) {
    s->max_requests = p->max_requests;
    s->max_batches = p->max_batches;
    s->slots = calloc(s->max_requests, sizeof *s->slots);
    s->fifo = calloc(s->max_requests, sizeof *s->fifo);
    s->batches = calloc(s->max_batches, sizeof *s->batches);
    if (!s->slots || !s->fifo || !s->batches)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "store '%s': no host memory for %u request "
                             "slots", s->name, s->max_requests);
    for (uint32_t i = 0; i < s->max_requests; i++) s->slots[i].next = (int32_t)i + 1;
    s->slots[s->max_requests - 1].next = -1;
    s->free_slot = 0;
    for (uint32_t i = 0; i < s->max_batches; i++) s->batches[i].gen = 1;
    return FLEXDIAG_OK;
}

int32_t flexdiag__store_pop(flexdiag_store *s) {
    if (!s->fifo_len) return -1;
    const uint32_t slot = s->fifo[s->fifo_head];
    s->fifo_head = (s->fifo_head + 1) % s->max_requests;
    s->fifo_len--;
    return (int32_t)slot;
}

void flexdiag__store_requeue(flexdiag_store *s, uint32_t slot) {
    FLEXDIAG_ASSERT(s->fifo_len < s->max_requests);
    s->fifo[(s->fifo_head + s->fifo_len) % s->max_requests] = slot;
    s->fifo_len++;
}

void flexdiag__store_done(flexdiag_store *s, uint32_t slot, int err) {
    flexdiag_store_slot *sl = &s->slots[slot];
    flexdiag_store_batch *b = &s->batches[sl->batch];
    const int rd = sl->op == FLEXDIAG_STORE_READ;
    const size_t moved = sl->len0 - sl->left;
    *(rd ? &s->st.bytes_read : &s->st.bytes_written) += moved;
    s->st.requests++;
    if (err) {
        s->st.errors++;
        if (b->st == FLEXDIAG_OK) {
            char what[160] = "";
            if (moved) snprintf(what, sizeof what, " after %zu bytes", moved);
            if (sl->retries > FLEXDIAG_STORE_MAX_RETRIES)
                snprintf(what + strlen(what), sizeof what - strlen(what),
                         " (gave up after %u retries)", sl->retries - 1);
            const int nospace = err == ENOSPC || err == EDQUOT;
            b->st = nospace ? FLEXDIAG_ERR_NO_SPACE : FLEXDIAG_ERR_IO;
            int l = snprintf(b->msg, sizeof b->msg,
                             "store '%s' (file %s, deleted): %s of %zu bytes at offset %llu "
                             "failed%s: ",
                             s->name, s->path, rd ? "read" : "write", sl->len0,
                             (unsigned long long)sl->off0, what);
            if (l < 0 || (size_t)l >= sizeof b->msg) l = (int)strlen(b->msg);
            if (err < 0)
                snprintf(b->msg + l, sizeof b->msg - (size_t)l,
                         "unexpected end of file at offset %llu (was the file truncated?)",
                         (unsigned long long)sl->off);
            else
                snprintf(b->msg + l, sizeof b->msg - (size_t)l, "%s (%s)%s", strerror(err),
                         errname(err), nospace ? ": the offload folder's disk is full" : "");
        }
    }
    FLEXDIAG_ASSERT(b->pending > 0 && s->outstanding > 0);
    b->pending--;
    s->outstanding--;
    sl->gen++;
    sl->next = s->free_slot;
    s->free_slot = (int32_t)slot;
    pthread_cond_broadcast(&s->done_cv);
}

/* ---- lifetime ---- */

static flexdiag_status start_backend(flexdiag_store *s, flexdiag_store_io io) {
    char why[512] = "";
    if (io != FLEXDIAG_STORE_IO_THREADS) {
        const int r = flexdiag__store_uring.open(s, why, sizeof why);
        if (r == 0) {
            s->be = &flexdiag__store_uring;
            return FLEXDIAG_OK;
        }
        if (io == FLEXDIAG_STORE_IO_URING)
            return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "store '%s': io_uring was asked for "
                                 "but is unavailable: %s", s->name, why);
        flexdiag__store_add_note(s, "%s: pread/pwrite thread pool instead", why);
    }
    const int r = flexdiag__store_threads.open(s, why, sizeof why);
    if (r != 0)
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "store '%s': cannot start the I/O threads: "
                             "%s", s->name, why);
    s->be = &flexdiag__store_threads;
    return FLEXDIAG_OK;
}

static void free_store(flexdiag_store *s) {
    if (s->fd >= 0) close(s->fd);
    flexdiag__ranges_fini(&s->ranges);
    pthread_mutex_destroy(&s->alloc_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->work_cv);
    free(s->slots);
    free(s->fifo);
    free(s->batches);
    free(s->bufs);
    free(s);
}

flexdiag_status flexdiag__store_create(const flexdiag_store_params *p, flexdiag_store **out) {
    *out = NULL;
    FLEXDIAG_TRY(check_params(p));
    flexdiag_store_io io;
    FLEXDIAG_TRY(pick_io(p->io, &io));
    flexdiag_store *s = calloc(1, sizeof *s);
    if (!s) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "store: no host memory");
    s->fd = -1;
    snprintf(s->name, sizeof s->name, "%s", p->name && *p->name ? p->name : "store");
    snprintf(s->dir, sizeof s->dir, "%s", p->dir);
    s->queue_depth = p->queue_depth;
    s->io_threads = p->io_threads ? p->io_threads : (p->queue_depth < 16 ? p->queue_depth : 16);
    pthread_mutex_init(&s->alloc_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    const uint64_t cap = p->budget & ~(uint64_t)(FLEXDIAG_STORE_ALIGN - 1);
    flexdiag_status st = flexdiag__ranges_init(&s->ranges, cap, FLEXDIAG_STORE_ALIGN);
    if (st == FLEXDIAG_OK) st = alloc_tables(s, p);
    if (st == FLEXDIAG_OK) st = open_file(s, p, cap);
    if (st == FLEXDIAG_OK) st = start_backend(s, io);
    if (st != FLEXDIAG_OK) {
        free_store(s);
        return st;
    }
    char cb[32];
    FLEXDIAG_INFO("store '%s': %s in %s, %s, %s, queue depth %u%s%s", s->name,
                  flexdiag__fmt_bytes(cap, cb, sizeof cb), s->dir, s->be->name, s->direct ? "O_DIRECT" : "buffered",
                  s->queue_depth, s->note[0] ? ": " : "", s->note);
    if (s->note[0]) FLEXDIAG_WARN("store '%s': %s", s->name, s->note);
    *out = s;
    return FLEXDIAG_OK;
}

void flexdiag__store_destroy(flexdiag_store *s) {
    if (!s) return;
    /* buffers stay in use until their completion arrives: drain before closing anything */
    pthread_mutex_lock(&s->mu);
    while (s->outstanding > 0) {
        if (s->be->progress(s, 1) != FLEXDIAG_OK) {
            FLEXDIAG_WARN("store '%s': %u requests still in flight at close: %s", s->name,
                          s->outstanding, flexdiag__err_msg());
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    s->be->close(s);
    free_store(s);
}

/* ---- extents ---- */

flexdiag_status flexdiag__store_alloc(flexdiag_store *s, uint64_t bytes, const char *what,
                                      flexdiag_store_extent *out) {
    memset(out, 0, sizeof *out);
    if (bytes == 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store '%s': extent of 0 bytes for %s",
                             s->name, what ? what : "?");
    pthread_mutex_lock(&s->alloc_mu);
    uint64_t off = 0;
    const int r = flexdiag__ranges_alloc(&s->ranges, bytes, &off);
    const flexdiag_ranges rs = s->ranges; /* for the message */
    const uint64_t largest = r == 1 ? 0 : flexdiag__ranges_largest(&s->ranges);
    pthread_mutex_unlock(&s->alloc_mu);
    if (r < 0) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "store '%s': no host memory for the "
                                    "extent list", s->name);
    if (r == 0) {
        const uint64_t need = flexdiag__ranges_round(bytes, FLEXDIAG_STORE_ALIGN);
        const uint64_t left = rs.size - rs.used;
        char nb[32], lb[32], bb[32], fb[32];
        return flexdiag__err(FLEXDIAG_ERR_NO_SPACE,
                             "store '%s' (%s): %s needs %llu bytes (%s carved) but only %s of the "
                             "%s budget is left%s (largest free run %s): raise "
                             "runtime_params.disk_mem or "
                             "move more to the CPU tier",
                             s->name, s->dir, what ? what : "an extent", (unsigned long long)bytes,
                             flexdiag__fmt_bytes(need, nb, sizeof nb),
                             flexdiag__fmt_bytes(left, lb, sizeof lb),
                             flexdiag__fmt_bytes(rs.size, bb, sizeof bb),
                             left >= need ? ", fragmented" : "",
                             flexdiag__fmt_bytes(largest, fb, sizeof fb));
    }
    out->off = off;
    out->bytes = bytes;
    out->span = flexdiag__ranges_round(bytes, FLEXDIAG_STORE_ALIGN);
    return FLEXDIAG_OK;
}

void flexdiag__store_free(flexdiag_store *s, const flexdiag_store_extent *e) {
    if (!e || e->bytes == 0) return;
    pthread_mutex_lock(&s->alloc_mu);
    flexdiag__ranges_free(&s->ranges, e->off, e->bytes);
    pthread_mutex_unlock(&s->alloc_mu);
}

/* ---- I/O ---- */

flexdiag_status flexdiag__store_register_buffers(flexdiag_store *s, const flexdiag_store_buf *b,
                                                 int n) {
    if (n < 0 || (n > 0 && !b))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store '%s': %d buffers", s->name, n);
    /* split regions into <= 1 GiB chunks, the largest buffer io_uring registers */
    int chunks = 0;
    for (int i = 0; i < n; i++) {
        if (!b[i].base || !b[i].bytes)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store '%s': registered region %d is "
                                 "empty", s->name, i);
        chunks += (int)((b[i].bytes + MAX_REG_CHUNK - 1) / MAX_REG_CHUNK);
    }
    flexdiag_store_buf *cb = chunks ? calloc((size_t)chunks, sizeof *cb) : NULL;
    if (chunks && !cb) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "store: no host memory");
    int k = 0;
    for (int i = 0; i < n; i++)
        for (size_t o = 0; o < b[i].bytes; o += MAX_REG_CHUNK)
            cb[k++] = (flexdiag_store_buf){(char *)b[i].base + o,
                                           b[i].bytes - o < MAX_REG_CHUNK ? b[i].bytes - o
                                                                          : MAX_REG_CHUNK};
    pthread_mutex_lock(&s->mu);
    if (s->outstanding) {
        pthread_mutex_unlock(&s->mu);
        free(cb);
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store '%s': register_buffers with %u "
                             "requests in flight: wait for them first", s->name, s->outstanding);
    }
    char why[512] = "";
    s->registered = s->be->register_buffers(s, cb, chunks, why, sizeof why);
    free(s->bufs);
    s->bufs = cb;
    s->n_bufs = chunks;
    if (!s->registered && why[0]) {
        flexdiag__store_add_note(s, "%s", why);
        FLEXDIAG_WARN("store '%s': %s", s->name, why);
    }
    pthread_mutex_unlock(&s->mu);
    return FLEXDIAG_OK;
}

/* The registered chunk that holds [p, p + len), -1 if none. */
static int32_t find_buf(const flexdiag_store *s, const char *p, size_t len) {
    if (!s->registered) return -1;
    for (int i = 0; i < s->n_bufs; i++) {
        const char *b = s->bufs[i].base;
        if (p >= b && len <= s->bufs[i].bytes && (size_t)(p - b) <= s->bufs[i].bytes - len)
            return i;
    }
    return -1;
}

static flexdiag_status check_req(const flexdiag_store *s, const flexdiag_store_req *q, int i) {
    const char *why = NULL;
    const uint64_t cap = s->ranges.size;
    if (q->op != FLEXDIAG_STORE_READ && q->op != FLEXDIAG_STORE_WRITE)
        why = "unknown op";
    else if (q->len == 0)
        why = "length 0";
    else if (!q->buf)
        why = "NULL buffer";
    else if (q->off % FLEXDIAG_STORE_ALIGN || q->len % FLEXDIAG_STORE_ALIGN ||
             (uintptr_t)q->buf % FLEXDIAG_STORE_ALIGN)
        why = "offset, length and buffer address must be multiples of 4096 (O_DIRECT)";
    else if (q->off > cap || q->len > cap - q->off)
        why = "beyond the end of the store";
    if (!why) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                         "store '%s': request %d of the batch (%s of %zu bytes at offset %llu, "
                         "buffer %p; store of %llu bytes): %s",
                         s->name, i, q->op == FLEXDIAG_STORE_WRITE ? "write" : "read", q->len,
                         (unsigned long long)q->off, q->buf, (unsigned long long)cap, why);
}

flexdiag_status flexdiag__store_submit(flexdiag_store *s, const flexdiag_store_req *reqs, int n,
                                       flexdiag_store_ticket *ticket) {
    *ticket = 0;
    if (n < 0 || (n > 0 && !reqs) || (uint32_t)n > s->max_requests)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store '%s': batch of %d requests (at "
                             "most %u)", s->name, n, s->max_requests);
    for (int i = 0; i < n; i++) FLEXDIAG_TRY(check_req(s, &reqs[i], i));
    pthread_mutex_lock(&s->mu);
    /* a free batch */
    uint32_t bi = s->max_batches;
    for (uint32_t k = 0; k < s->max_batches; k++) {
        const uint32_t i = (s->next_batch + k) % s->max_batches;
        if (!s->batches[i].in_use) {
            bi = i;
            break;
        }
    }
    if (bi == s->max_batches) {
        pthread_mutex_unlock(&s->mu);
        return flexdiag__err(FLEXDIAG_ERR_BUSY, "store '%s': %u tickets submitted and not yet "
                             "waited for: wait for some first", s->name, s->max_batches);
    }
    /* room for the whole batch: completions free slots */
    flexdiag_status st = FLEXDIAG_OK;
    while (st == FLEXDIAG_OK && s->max_requests - s->outstanding < (uint32_t)n)
        st = s->be->progress(s, 1);
    if (st != FLEXDIAG_OK) {
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    flexdiag_store_batch *b = &s->batches[bi];
    s->next_batch = (bi + 1) % s->max_batches;
    b->in_use = 1;
    b->pending = (uint32_t)n;
    b->st = FLEXDIAG_OK;
    b->msg[0] = 0;
    for (int i = 0; i < n; i++) {
        const int32_t slot = s->free_slot;
        FLEXDIAG_ASSERT(slot >= 0);
        flexdiag_store_slot *sl = &s->slots[slot];
        s->free_slot = sl->next;
        sl->op = (uint8_t)reqs[i].op;
        sl->off = sl->off0 = reqs[i].off;
        sl->buf = reqs[i].buf;
        sl->left = sl->len0 = reqs[i].len;
        sl->batch = bi;
        sl->retries = 0;
        sl->buf_index = find_buf(s, sl->buf, sl->left);
        s->outstanding++;
        flexdiag__store_requeue(s, (uint32_t)slot);
    }
    if (n) s->be->kick(s);
    *ticket = ((uint64_t)b->gen << 32) | bi;
    pthread_mutex_unlock(&s->mu);
    return FLEXDIAG_OK;
}

/* The batch of ticket t (s->mu held), NULL with a message when t is stale or unknown. */
static flexdiag_store_batch *ticket_batch(flexdiag_store *s, flexdiag_store_ticket t) {
    const uint32_t bi = (uint32_t)t, gen = (uint32_t)(t >> 32);
    if (bi < s->max_batches && s->batches[bi].in_use && s->batches[bi].gen == gen)
        return &s->batches[bi];
    flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "store '%s': ticket %#llx is unknown or was already "
                  "waited for", s->name, (unsigned long long)t);
    return NULL;
}

/* Hand a finished batch's status to the caller and free its ticket (store lock held). */
static flexdiag_status release(flexdiag_store_batch *b) {
    const flexdiag_status st = b->st;
    if (st != FLEXDIAG_OK) flexdiag__err(st, "%s", b->msg);
    b->in_use = 0;
    b->gen = b->gen + 1 ? b->gen + 1 : 1;
    return st;
}

flexdiag_status flexdiag__store_wait(flexdiag_store *s, flexdiag_store_ticket ticket) {
    pthread_mutex_lock(&s->mu);
    flexdiag_store_batch *b = ticket_batch(s, ticket);
    flexdiag_status st = b ? FLEXDIAG_OK : FLEXDIAG_ERR_INVALID_ARG;
    while (st == FLEXDIAG_OK && b->pending > 0) {
        FLEXDIAG_ASSERT(s->outstanding > 0);
        st = s->be->progress(s, 1);
    }
    if (st == FLEXDIAG_OK) st = release(b);
    pthread_mutex_unlock(&s->mu);
    return st;
}

flexdiag_status flexdiag__store_test(flexdiag_store *s, flexdiag_store_ticket ticket, int *done) {
    *done = 0;
    pthread_mutex_lock(&s->mu);
    flexdiag_store_batch *b = ticket_batch(s, ticket);
    flexdiag_status st = b ? FLEXDIAG_OK : FLEXDIAG_ERR_INVALID_ARG;
    if (st == FLEXDIAG_OK && b->pending > 0) st = s->be->progress(s, 0);
    if (st == FLEXDIAG_OK) *done = b->pending == 0;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- queries ---- */

const char *flexdiag__store_backend(const flexdiag_store *s) { return s->be->name; }
int flexdiag__store_direct(const flexdiag_store *s) { return s->direct; }
int flexdiag__store_registered(const flexdiag_store *s) { return s->registered; }
const char *flexdiag__store_note(const flexdiag_store *s) { return s->note; }
const char *flexdiag__store_path(const flexdiag_store *s) { return s->path; }

void flexdiag__store_stats(const flexdiag_store *s, flexdiag_store_stats *out) {
    flexdiag_store *m = (flexdiag_store *)s; /* the locks only, not the state */
    pthread_mutex_lock(&m->mu);
    *out = s->st;
    pthread_mutex_unlock(&m->mu);
    pthread_mutex_lock(&m->alloc_mu);
    out->capacity = s->ranges.size;
    out->used = s->ranges.used;
    out->peak = s->ranges.peak;
    out->requested = s->ranges.requested;
    out->largest_free = flexdiag__ranges_largest(&s->ranges);
    pthread_mutex_unlock(&m->alloc_mu);
}
