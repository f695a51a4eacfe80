/*
 * store_uring.c - the store's io_uring backend (liburing 2.3; docs/offloading.md §1).
 *
 * One ring, driven by whichever thread calls submit/wait/test (under the store's lock): FIFO
 * entries become SQEs while fewer than queue_depth are in flight, io_uring_submit_and_wait
 * pushes them (and waits for one completion when asked), the CQ is reaped with
 * io_uring_for_each_cqe + one io_uring_cq_advance. The file is registered (IOSQE_FIXED_FILE on
 * every SQE) and so are the caller's staging regions (read_fixed/write_fixed for requests that
 * lie inside one; plain read/write otherwise). user_data = slot index | generation << 32, never
 * a pointer, so a stale completion is caught.
 *
 * Setup flags: CQSIZE (2 × queue depth, so the CQ cannot overflow with queue_depth in flight),
 * SUBMIT_ALL, COOP_TASKRUN; on -EINVAL one flag is dropped at a time and setup retried (fio).
 * SINGLE_ISSUER/DEFER_TASKRUN are not used: they tie the ring to the creating thread (or the
 * first submitter), and the store is created on one thread and driven by the scheduler's I/O
 * thread; for 1 MiB+ requests they buy little.
 */
#include <liburing.h>

#include "offload/store_io.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/core.h"

/* Largest length one SQE carries: io_uring lengths are 32-bit; the remainder is resubmitted. */
#define MAX_SQE_LEN (1u << 30)

typedef struct uring_state {
    struct io_uring ring; /* the ring */
    unsigned inflight;    /* SQEs handed to the kernel whose CQE was not reaped */
    int fixed_file;       /* 1: the file is registered at index 0 */
    int n_registered;     /* buffers registered with the ring */
} uring_state;

/* ---- setup ---- */

static const char *errname(int e) {
    const char *n = strerrorname_np(e);
    return n ? n : "?";
}

/* Why io_uring setup failed, with the sysctl that explains EPERM. */
static void explain_init(int e, char *why, size_t n) {
    int k = snprintf(why, n, "io_uring_queue_init: %s (%s)", strerror(e), errname(e));
    if (k < 0 || (size_t)k >= n) return;
    if (e == EPERM) {
        FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "r");
        int v = -1;
        if (f) {
            if (fscanf(f, "%d", &v) != 1) v = -1;
            fclose(f);
        }
        if (v >= 0)
            snprintf(why + k, n - (size_t)k, ", kernel.io_uring_disabled = %d%s", v,
                     v == 1 ? " (only CAP_SYS_ADMIN or io_uring_group may use it)" : "");
        else
            snprintf(why + k, n - (size_t)k, " (seccomp policy of the container?)");
    } else if (e == ENOSYS) {
        snprintf(why + k, n - (size_t)k, " (kernel without io_uring, or blocked by seccomp)");
    } else if (e == ENOMEM) {
        snprintf(why + k, n - (size_t)k, " (locked memory short: ulimit -l)");
    }
}

static int init_ring(uring_state *u, unsigned qd, char *why, size_t n) {
    /* optional flags, dropped from the back on -EINVAL (older kernels) */
    static const unsigned optional[] = {IORING_SETUP_CQSIZE, IORING_SETUP_SUBMIT_ALL,
                                        IORING_SETUP_COOP_TASKRUN};
    int keep = (int)(sizeof optional / sizeof *optional);
    for (;;) {
        struct io_uring_params p;
        memset(&p, 0, sizeof p);
        for (int i = 0; i < keep; i++) p.flags |= optional[i];
        p.cq_entries = 2 * qd;
        const int r = io_uring_queue_init_params(qd, &u->ring, &p);
        if (r == 0) return 0;
        if (r != -EINVAL || keep == 0) {
            explain_init(-r, why, n);
            return r;
        }
        keep--;
    }
}

/* The opcodes the store issues (IORING_OP_READ/WRITE need 5.6; probing itself needs 5.6). */
static int check_ops(uring_state *u, char *why, size_t n) {
    static const struct {
        int op;
        const char *name;
    } ops[] = {{IORING_OP_READ, "READ"}, {IORING_OP_WRITE, "WRITE"},
               {IORING_OP_READ_FIXED, "READ_FIXED"}, {IORING_OP_WRITE_FIXED, "WRITE_FIXED"}};
    struct io_uring_probe *probe = io_uring_get_probe_ring(&u->ring);
    if (!probe) {
        snprintf(why, n, "io_uring: the kernel cannot probe opcodes (older than 5.6)");
        return -EOPNOTSUPP;
    }
    int r = 0;
    for (size_t i = 0; i < sizeof ops / sizeof *ops && r == 0; i++)
        if (!io_uring_opcode_supported(probe, ops[i].op)) {
            snprintf(why, n, "io_uring: the kernel lacks IORING_OP_%s", ops[i].name);
            r = -EOPNOTSUPP;
        }
    io_uring_free_probe(probe);
    return r;
}

static int uring_open(flexdiag_store *s, char *why, size_t n) {
    uring_state *u = calloc(1, sizeof *u);
    if (!u) {
        snprintf(why, n, "io_uring: no host memory");
        return -ENOMEM;
    }
    int r = init_ring(u, s->queue_depth, why, n);
    if (r == 0) {
        r = check_ops(u, why, n);
        if (r) io_uring_queue_exit(&u->ring);
    }
    if (r) {
        free(u);
        return r;
    }
    const int fr = io_uring_register_files(&u->ring, &s->fd, 1);
    u->fixed_file = fr == 0;
    if (fr) flexdiag__store_add_note(s, "io_uring_register_files: %s: unregistered file",
                                     strerror(-fr));
    s->be_state = u;
    return 0;
}

static void uring_close(flexdiag_store *s) {
    uring_state *u = s->be_state;
    if (!u) return;
    io_uring_queue_exit(&u->ring); /* drops the registered file and buffers too */
    free(u);
    s->be_state = NULL;
}

/* ---- issue and reap ---- */

/* Turn FIFO entries into SQEs while fewer than queue_depth are in flight. */
static void fill(flexdiag_store *s, uring_state *u) {
    while (s->fifo_len && u->inflight < s->queue_depth) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe) break; /* SQ full until the next submit */
        const uint32_t slot = (uint32_t)flexdiag__store_pop(s);
        const flexdiag_store_slot *sl = &s->slots[slot];
        const unsigned len = sl->left < MAX_SQE_LEN ? (unsigned)sl->left : MAX_SQE_LEN;
        const int fd = u->fixed_file ? 0 : s->fd;
        const int fixed = s->registered && sl->buf_index >= 0;
        if (sl->op == FLEXDIAG_STORE_READ) {
            if (fixed)
                io_uring_prep_read_fixed(sqe, fd, sl->buf, len, sl->off, sl->buf_index);
            else
                io_uring_prep_read(sqe, fd, sl->buf, len, sl->off);
        } else {
            if (fixed)
                io_uring_prep_write_fixed(sqe, fd, sl->buf, len, sl->off, sl->buf_index);
            else
                io_uring_prep_write(sqe, fd, sl->buf, len, sl->off);
        }
        if (u->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, (uint64_t)sl->gen << 32 | slot);
        u->inflight++;
    }
}

/* One completion: finish the slot, or requeue its remainder / retry. */
static void complete(flexdiag_store *s, uint64_t user_data, int res) {
    const uint32_t slot = (uint32_t)user_data;
    FLEXDIAG_ASSERT(slot < s->max_requests && s->slots[slot].gen == (uint32_t)(user_data >> 32));
    flexdiag_store_slot *sl = &s->slots[slot];
    if (res < 0) {
        const int e = -res;
        if ((e == EAGAIN || e == EINTR) && ++sl->retries <= FLEXDIAG_STORE_MAX_RETRIES) {
            s->st.retries++;
            flexdiag__store_requeue(s, slot);
        } else {
            flexdiag__store_done(s, slot, e);
        }
        return;
    }
    if (res == 0) { /* nothing moved: end of file on a read, a broken write */
        flexdiag__store_done(s, slot, sl->op == FLEXDIAG_STORE_READ ? -1 : EIO);
        return;
    }
    FLEXDIAG_ASSERT((size_t)res <= sl->left);
    sl->off += (uint64_t)res;
    sl->buf += res;
    sl->left -= (size_t)res;
    sl->retries = 0;
    if (sl->left == 0) {
        flexdiag__store_done(s, slot, 0);
    } else {
        s->st.resubmits++;
        flexdiag__store_requeue(s, slot);
    }
}

static unsigned reap(flexdiag_store *s, uring_state *u) {
    unsigned head, n = 0;
    struct io_uring_cqe *cqe;
    io_uring_for_each_cqe(&u->ring, head, cqe) {
        complete(s, cqe->user_data, cqe->res);
        n++;
    }
    io_uring_cq_advance(&u->ring, n);
    u->inflight -= n;
    return n;
}

/* Fail every request still waiting in the FIFO (the ring broke). */
static void fail_queued(flexdiag_store *s, int e) {
    int32_t slot;
    while ((slot = flexdiag__store_pop(s)) >= 0) flexdiag__store_done(s, (uint32_t)slot, e);
}

static flexdiag_status uring_progress(flexdiag_store *s, int wait) {
    uring_state *u = s->be_state;
    unsigned reaped = reap(s, u);
    for (;;) {
        fill(s, u);
        const unsigned nr = wait && !reaped && u->inflight ? 1 : 0;
        const int r = io_uring_submit_and_wait(&u->ring, nr);
        if (r == -EINTR) { /* a signal: nothing lost, enter again */
            s->st.retries++;
            continue;
        }
        if (r == -EAGAIN || r == -EBUSY) { /* out of resources / CQ overflow: reap, retry */
            const unsigned k = reap(s, u);
            reaped += k;
            if (!k) sched_yield();
            continue;
        }
        if (r < 0) {
            fail_queued(s, -r);
            return flexdiag__err(FLEXDIAG_ERR_IO, "store '%s' (file %s): io_uring_submit_and_wait: "
                                 "%s (%s); %u requests still in flight", s->name, s->path,
                                 strerror(-r), errname(-r), u->inflight);
        }
        reaped += reap(s, u);
        if (!wait || reaped || !u->inflight) return FLEXDIAG_OK;
    }
}

static void uring_kick(flexdiag_store *s) { (void)uring_progress(s, 0); }

static int uring_register(flexdiag_store *s, const flexdiag_store_buf *b, int n, char *why,
                          size_t wn) {
    uring_state *u = s->be_state;
    if (u->n_registered) {
        (void)io_uring_unregister_buffers(&u->ring);
        u->n_registered = 0;
    }
    if (n == 0) return 0;
    struct iovec *iov = calloc((size_t)n, sizeof *iov);
    if (!iov) {
        snprintf(why, wn, "io_uring_register_buffers: no host memory: plain read/write");
        return 0;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        iov[i] = (struct iovec){b[i].base, b[i].bytes};
        total += b[i].bytes;
    }
    const int r = io_uring_register_buffers(&u->ring, iov, (unsigned)n);
    free(iov);
    if (r == 0) {
        u->n_registered = n;
        return 1;
    }
    struct rlimit rl = {0, 0};
    (void)getrlimit(RLIMIT_MEMLOCK, &rl);
    char lim[64] = "unlimited";
    if (rl.rlim_cur != RLIM_INFINITY)
        snprintf(lim, sizeof lim, "%.1f MiB", (double)rl.rlim_cur / 1048576.0);
    snprintf(why, wn, "io_uring_register_buffers of %.1f MiB: %s (%s)%s%s%s: plain read/write "
             "instead of read_fixed/write_fixed", (double)total / 1048576.0, strerror(-r),
             errname(-r), -r == ENOMEM ? ", locked-memory limit (ulimit -l) is " : "",
             -r == ENOMEM ? lim : "", -r == EFAULT ? ", file-backed or unmapped memory" : "");
    return 0;
}

const flexdiag_store_backend flexdiag__store_uring = {
    .name = "io_uring",
    .open = uring_open,
    .close = uring_close,
    .kick = uring_kick,
    .progress = uring_progress,
    .register_buffers = uring_register,
};
