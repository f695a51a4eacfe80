/*
 * store_threads.c - the store's pread/pwrite backend: a fixed set of worker threads, the
 * fallback where io_uring is missing or refused (docs/offloading.md §1), and the forced choice of
 * FLEXDIAG_IO=threads.
 *
 * Each worker takes a slot from the store's FIFO, drops the lock, transfers it to the end
 * (looping over short transfers, retrying EINTR at once and EAGAIN after a short sleep), then
 * reports the outcome under the lock. Blocking calls make the worker count the queue depth, so
 * io_threads (default min(queue depth, 16)) bounds what is in flight; NVMe saturates at a
 * handful of 1 MiB+ requests. base/thread_pool.h was not used: its parallel_for runs one job
 * to completion on the caller's thread, while the store needs workers that run while the
 * caller returns (submit now, wait later).
 */
#include "offload/store_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/core.h"

typedef struct threads_state {
    pthread_t *th; /* (n) workers */
    int n;         /* workers started */
    int stop;      /* set by close (under s->mu): workers exit once the FIFO is empty */
} threads_state;

/* Transfer one request to the end; 0, a positive errno, or -1 at end of file. Counts
 * resubmits and retries into *resub and *retry. */
static int transfer(const flexdiag_store *s, flexdiag_store_slot *sl, uint64_t *resub,
                    uint64_t *retry) {
    while (sl->left > 0) {
        const ssize_t r = sl->op == FLEXDIAG_STORE_READ ? pread(s->fd, sl->buf, sl->left,
                                                                (off_t)sl->off)
                                                        : pwrite(s->fd, sl->buf, sl->left,
                                                                 (off_t)sl->off);
        if (r > 0) {
            sl->off += (uint64_t)r;
            sl->buf += r;
            sl->left -= (size_t)r;
            sl->retries = 0;
            if (sl->left) (*resub)++;
            continue;
        }
        if (r == 0) return sl->op == FLEXDIAG_STORE_READ ? -1 : EIO; /* a write of 0: broken */
        const int e = errno;
        if (e != EINTR && e != EAGAIN) return e;
        if (++sl->retries > FLEXDIAG_STORE_MAX_RETRIES) return e;
        (*retry)++;
        if (e == EAGAIN) { /* back off: 10 us growing to 1 ms */
            const long us = sl->retries < 100 ? 10L * sl->retries : 1000L;
            nanosleep(&(struct timespec){0, us * 1000L}, NULL);
        }
    }
    return 0;
}

static void *worker(void *arg) {
    flexdiag_store *s = arg;
    threads_state *t = s->be_state;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        const int32_t slot = flexdiag__store_pop(s);
        if (slot < 0) {
            if (t->stop) break;
            pthread_cond_wait(&s->work_cv, &s->mu);
            continue;
        }
        flexdiag_store_slot sl = s->slots[slot]; /* a private copy while the lock is dropped */
        pthread_mutex_unlock(&s->mu);
        uint64_t resub = 0, retry = 0;
        const int err = transfer(s, &sl, &resub, &retry);
        pthread_mutex_lock(&s->mu);
        s->slots[slot] = sl;
        s->st.resubmits += resub;
        s->st.retries += retry;
        flexdiag__store_done(s, (uint32_t)slot, err);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void threads_close(flexdiag_store *s) {
    threads_state *t = s->be_state;
    if (!t) return;
    pthread_mutex_lock(&s->mu);
    t->stop = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < t->n; i++) pthread_join(t->th[i], NULL);
    free(t->th);
    free(t);
    s->be_state = NULL;
}

static int threads_open(flexdiag_store *s, char *why, size_t n) {
    threads_state *t = calloc(1, sizeof *t);
    if (t) t->th = calloc(s->io_threads, sizeof *t->th);
    if (!t || !t->th) {
        free(t);
        snprintf(why, n, "no host memory");
        return -ENOMEM;
    }
    s->be_state = t;
    for (uint32_t i = 0; i < s->io_threads; i++) {
        const int e = pthread_create(&t->th[i], NULL, worker, s);
        if (e) {
            snprintf(why, n, "pthread_create of worker %u: %s", i, strerror(e));
            threads_close(s);
            return -e;
        }
        t->n++;
    }
    return 0;
}

static void threads_kick(flexdiag_store *s) { pthread_cond_broadcast(&s->work_cv); }

static flexdiag_status threads_progress(flexdiag_store *s, int wait) {
    if (wait) pthread_cond_wait(&s->done_cv, &s->mu);
    return FLEXDIAG_OK;
}

static int threads_register(flexdiag_store *s, const flexdiag_store_buf *b, int n, char *why,
                            size_t wn) {
    (void)s, (void)b, (void)n;
    if (wn) why[0] = 0; /* pread/pwrite have no fixed buffers: nothing degraded */
    return 0;
}

const flexdiag_store_backend flexdiag__store_threads = {
    .name = "threads",
    .open = threads_open,
    .close = threads_close,
    .kick = threads_kick,
    .progress = threads_progress,
    .register_buffers = threads_register,
};
