/*
 * fault.c - the --wrap functions of fault.h. Every wrapper forwards to __real_* unless a rule
 * or a setup fault is armed. glibc with _FILE_OFFSET_BITS=64 names pread64, pwrite64,
 * fallocate64 and fcntl64; both spellings are wrapped so either build links.
 */
#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

int fi_uring_init_err, fi_register_err, fi_submit_eintr, fi_fallocate_err, fi_odirect_err;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static fi_rule rule;
static int armed, seen, fired;

void fi_set(const fi_rule *r) {
    pthread_mutex_lock(&mu);
    rule = *r;
    if (rule.every < 1) rule.every = 1;
    armed = 1;
    seen = fired = 0;
    pthread_mutex_unlock(&mu);
}

void fi_clear(void) {
    pthread_mutex_lock(&mu);
    armed = 0;
    pthread_mutex_unlock(&mu);
}

int fi_fired(void) {
    pthread_mutex_lock(&mu);
    const int f = fired;
    pthread_mutex_unlock(&mu);
    return f;
}

/* Decide for one transfer: 0 pass, FI_SHORT with *len shortened, FI_ERR with *err. */
static int decide(int op, int64_t off, size_t *len, int *err) {
    int act = 0;
    pthread_mutex_lock(&mu);
    if (armed && (rule.op < 0 || rule.op == op) && (rule.off < 0 || rule.off == off) &&
        (rule.count < 0 || fired < rule.count)) {
        const size_t half = (*len / 2) & ~(size_t)4095;
        if (rule.kind == FI_ERR || half) {
            if (++seen % rule.every == 0) {
                act = rule.kind;
                fired++;
                if (act == FI_SHORT) *len = half;
                *err = rule.err;
            }
        }
    }
    pthread_mutex_unlock(&mu);
    return act;
}

/* ---- pread / pwrite ---- */

#define WRAP_RW(name, bufty, op)                                                                   \
    ssize_t __real_##name(int fd, bufty buf, size_t n, off_t off);                                 \
    ssize_t __wrap_##name(int fd, bufty buf, size_t n, off_t off);                                 \
    ssize_t __wrap_##name(int fd, bufty buf, size_t n, off_t off) {                                \
        int err = 0;                                                                               \
        const int act = decide(op, (int64_t)off, &n, &err);                                        \
        if (act == FI_ERR) {                                                                       \
            errno = err;                                                                           \
            return -1;                                                                             \
        }                                                                                          \
        return __real_##name(fd, buf, n, off);                                                     \
    }
WRAP_RW(pread, void *, 0)
WRAP_RW(pread64, void *, 0)
WRAP_RW(pwrite, const void *, 1)
WRAP_RW(pwrite64, const void *, 1)

/* ---- fallocate, fcntl ---- */

#define WRAP_FALLOCATE(name)                                                                       \
    int __real_##name(int fd, int mode, off_t off, off_t len);                                     \
    int __wrap_##name(int fd, int mode, off_t off, off_t len);                                     \
    int __wrap_##name(int fd, int mode, off_t off, off_t len) {                                    \
        if (fi_fallocate_err) {                                                                    \
            errno = fi_fallocate_err;                                                              \
            return -1;                                                                             \
        }                                                                                          \
        return __real_##name(fd, mode, off, len);                                                  \
    }
WRAP_FALLOCATE(fallocate)
WRAP_FALLOCATE(fallocate64)

#define WRAP_FCNTL(name)                                                                           \
    int __real_##name(int fd, int cmd, ...);                                                       \
    int __wrap_##name(int fd, int cmd, ...);                                                       \
    int __wrap_##name(int fd, int cmd, ...) {                                                      \
        va_list ap;                                                                                \
        va_start(ap, cmd);                                                                         \
        const long arg = va_arg(ap, long); /* every command the store uses takes an int or none */ \
        va_end(ap);                                                                                \
        if (cmd == F_SETFL && (arg & O_DIRECT) && fi_odirect_err) {                               \
            errno = fi_odirect_err;                                                                \
            return -1;                                                                             \
        }                                                                                          \
        return __real_##name(fd, cmd, arg);                                                        \
    }
WRAP_FCNTL(fcntl)
WRAP_FCNTL(fcntl64)

/* ---- liburing ---- */
#ifdef FI_HAVE_URING
#include <liburing.h>

/* NOP'd requests whose CQE res must become -errno. */
static struct {
    uint64_t user_data;
    int res;
} nops[4096];
static int n_nops;

static void rewrite_sqes(struct io_uring *ring) {
    struct io_uring_sq *sq = &ring->sq;
    for (unsigned i = sq->sqe_head; i != sq->sqe_tail; i++) {
        struct io_uring_sqe *sqe = &sq->sqes[i & sq->ring_mask];
        int op;
        if (sqe->opcode == IORING_OP_READ || sqe->opcode == IORING_OP_READ_FIXED)
            op = 0;
        else if (sqe->opcode == IORING_OP_WRITE || sqe->opcode == IORING_OP_WRITE_FIXED)
            op = 1;
        else
            continue;
        size_t len = sqe->len;
        int err = 0;
        const int act = decide(op, (int64_t)sqe->off, &len, &err);
        if (act == FI_SHORT) {
            sqe->len = (unsigned)len;
        } else if (act == FI_ERR && n_nops < (int)(sizeof nops / sizeof *nops)) {
            const uint64_t ud = sqe->user_data;
            io_uring_prep_nop(sqe);
            sqe->user_data = ud;
            nops[n_nops].user_data = ud;
            nops[n_nops++].res = -err;
        }
    }
}

static void rewrite_cqes(struct io_uring *ring) {
    struct io_uring_cq *cq = &ring->cq;
    const unsigned tail = __atomic_load_n(cq->ktail, __ATOMIC_ACQUIRE);
    for (unsigned h = *cq->khead; h != tail && n_nops; h++) {
        struct io_uring_cqe *cqe = &cq->cqes[h & cq->ring_mask];
        for (int k = 0; k < n_nops; k++)
            if (nops[k].user_data == cqe->user_data) {
                cqe->res = nops[k].res;
                nops[k] = nops[--n_nops];
                break;
            }
    }
}

int __real_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p);
int __wrap_io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
                                      struct io_uring_params *p) {
    if (fi_uring_init_err) return fi_uring_init_err;
    return __real_io_uring_queue_init_params(entries, ring, p);
}

int __real_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n);
int __wrap_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n);
int __wrap_io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n) {
    if (fi_register_err) return fi_register_err;
    return __real_io_uring_register_buffers(ring, iov, n);
}

int __real_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring) {
    rewrite_sqes(ring);
    const int r = __real_io_uring_submit(ring);
    rewrite_cqes(ring);
    return r;
}

int __real_io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr);
int __wrap_io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr);
int __wrap_io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr) {
    if (fi_submit_eintr > 0) {
        fi_submit_eintr--;
        return -EINTR;
    }
    rewrite_sqes(ring);
    const int r = __real_io_uring_submit_and_wait(ring, wait_nr);
    rewrite_cqes(ring);
    return r;
}
#endif
