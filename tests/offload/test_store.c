/*
 * test_store.c - the NVMe store (offload/store.h) on both I/O backends: round trips of random
 * sizes and offsets over many extents (registered and plain buffers, several tickets in flight,
 * more requests than the queue depth), extent accounting and budget refusal, request checks,
 * the unlinked file, tmpfs and refused O_DIRECT, the fallocate fallbacks, and injected faults
 * (fault.h: short transfers and EINTR/EAGAIN must succeed with identical data; EIO, ENOSPC and a
 * truncated file must fail the batch with a message naming file, offset and errno while the
 * store stays usable). The io_uring group is skipped, with a note, where the kernel refuses
 * io_uring_queue_init.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/core.h"
#include "fault.h"
#include "offload/store.h"
#include "util.h"

#ifdef FI_HAVE_URING
#include <liburing.h>
#endif

#define KIB 4096u
#define MIB (1024u * 1024u)

static flexdiag_store_io g_io; /* backend of the running group */
static int g_uring_ok;         /* this kernel sets up rings */

/* ---- helpers ---- */

static flexdiag_store *mk(const char *dir, uint64_t budget, flexdiag_store_params *over) {
    flexdiag_store_params p;
    flexdiag__store_params_init(&p);
    if (over) p = *over;
    p.dir = dir;
    p.budget = budget;
    p.io = g_io;
    flexdiag_store *s = NULL;
    flexdiag__err_clear();
    const flexdiag_status st = flexdiag__store_create(&p, &s);
    if (st != FLEXDIAG_OK) fprintf(stderr, "store_create: %s\n", flexdiag__err_msg());
    assert_int_equal(st, FLEXDIAG_OK);
    assert_string_equal(flexdiag__store_backend(s),
                        g_io == FLEXDIAG_STORE_IO_URING ? "io_uring" : "threads");
    return s;
}

static void *abuf(size_t n) {
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, KIB, n), 0);
    return p;
}

static void fill_rand(tu_rng *r, void *p, size_t n) {
    uint64_t *w = p;
    for (size_t i = 0; i < n / 8; i++) w[i] = tu_rng_u64(r);
}

/* One-request batch, waited for: the status. */
static flexdiag_status io1(flexdiag_store *s, flexdiag_store_op op, uint64_t off, size_t len,
                           void *buf) {
    flexdiag_store_req q = {op, off, len, buf};
    flexdiag_store_ticket t;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__store_submit(s, &q, 1, &t);
    if (st == FLEXDIAG_OK) st = flexdiag__store_wait(s, t);
    return st;
}

/* Write random data to [off, off + len) and read it back (a smaller second transfer shape). */
static void roundtrip(flexdiag_store *s, tu_rng *r, uint64_t off, size_t len) {
    char *w = abuf(len), *g = abuf(len);
    fill_rand(r, w, len);
    memset(g, 0xAB, len);
    assert_int_equal(io1(s, FLEXDIAG_STORE_WRITE, off, len, w), FLEXDIAG_OK);
    assert_int_equal(io1(s, FLEXDIAG_STORE_READ, off, len, g), FLEXDIAG_OK);
    assert_memory_equal(w, g, len);
    free(w);
    free(g);
}

/* Entries of dir (besides . and ..). */
static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* This process's descriptor of the store file in dir (found through /proc: "(deleted)"), -1. */
static int store_fd(const char *dir, int *deleted) {
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    char want[4200], link[4200], path[300];
    snprintf(want, sizeof want, "%s/flexdiag-store-", dir);
    int fd = -1;
    for (struct dirent *e; (e = readdir(d));) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        const ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        if (strncmp(link, want, strlen(want)) == 0) {
            fd = atoi(e->d_name);
            *deleted = strstr(link, " (deleted)") != NULL;
        }
    }
    closedir(d);
    return fd;
}

/* ---- round trips ---- */

/* Many extents of random sizes; random aligned requests inside them, one per extent per batch
 * (requests of one batch never overlap), batches of writes then several read batches in flight
 * at once, waited for in reverse; registered and plain buffers alternate. A shadow copy of the
 * file is the oracle. */
static void test_roundtrip_random(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    const uint64_t budget = 48ull * MIB;
    flexdiag_store_params p;
    flexdiag__store_params_init(&p);
    p.queue_depth = 32; /* batches of up to 40 requests overflow the ring into the FIFO */
    flexdiag_store *s = mk(dir, budget, &p);
    tu_rng r;
    tu_rng_seed(&r, 1234);
    enum { MAXE = 40 };
    flexdiag_store_extent ext[MAXE];
    int ne = 0;
    while (ne < MAXE) {
        const uint64_t bytes = (uint64_t)tu_rng_int(&r, 1, 2 * MIB);
        if (flexdiag__store_alloc(s, bytes, "test extent", &ext[ne]) != FLEXDIAG_OK) break;
        assert_int_equal(ext[ne].off % KIB, 0);
        assert_int_equal(ext[ne].span % KIB, 0);
        ne++;
    }
    assert_true(ne >= 20);
    char *shadow = calloc(1, budget);
    const size_t stage_bytes = (size_t)MAXE * MIB;
    char *reg = abuf(stage_bytes), *plain = abuf(stage_bytes);
    flexdiag_store_buf rb = {reg, stage_bytes};
    assert_int_equal(flexdiag__store_register_buffers(s, &rb, 1), FLEXDIAG_OK);
    printf("  %s: %d extents, %s, %s%s%s\n", flexdiag__store_backend(s), ne,
           flexdiag__store_direct(s) ? "O_DIRECT" : "buffered",
           flexdiag__store_registered(s) ? "registered buffers" : "plain buffers",
           flexdiag__store_note(s)[0] ? ", note: " : "", flexdiag__store_note(s));
    uint64_t written = 0, read = 0;
    for (int round = 0; round < 12; round++) {
        char *stage = round % 2 ? plain : reg;
        /* writes: one random range in each of a random subset of extents */
        flexdiag_store_req q[MAXE];
        int nq = 0;
        for (int e = 0; e < ne; e++) {
            if (tu_rng_int(&r, 0, 2) == 0) continue;
            const uint64_t pages = ext[e].span / KIB;
            const uint64_t first = (uint64_t)tu_rng_int(&r, 0, (int64_t)pages - 1);
            uint64_t np = (uint64_t)tu_rng_int(&r, 1, (int64_t)(pages - first));
            if (np > MIB / KIB) np = MIB / KIB;
            q[nq] = (flexdiag_store_req){FLEXDIAG_STORE_WRITE, ext[e].off + first * KIB,
                                         np * KIB, stage + (size_t)nq * MIB};
            fill_rand(&r, q[nq].buf, q[nq].len);
            memcpy(shadow + q[nq].off, q[nq].buf, q[nq].len);
            written += q[nq].len;
            nq++;
        }
        flexdiag_store_ticket t;
        assert_int_equal(flexdiag__store_submit(s, q, nq, &t), FLEXDIAG_OK);
        assert_int_equal(flexdiag__store_wait(s, t), FLEXDIAG_OK);
        /* reads: three batches in flight, each one range per extent, waited in reverse */
        flexdiag_store_ticket rt[3];
        flexdiag_store_req rq[3][MAXE / 3 + 1];
        int rn[3] = {0, 0, 0};
        for (int e = 0; e < ne && e < 3 * (MAXE / 3); e++) {
            const int b = e % 3;
            const uint64_t pages = ext[e].span / KIB;
            const uint64_t first = (uint64_t)tu_rng_int(&r, 0, (int64_t)pages - 1);
            uint64_t np = (uint64_t)tu_rng_int(&r, 1, (int64_t)(pages - first));
            if (np > MIB / KIB) np = MIB / KIB;
            rq[b][rn[b]] = (flexdiag_store_req){FLEXDIAG_STORE_READ, ext[e].off + first * KIB,
                                                np * KIB, stage + (size_t)e * MIB};
            memset(rq[b][rn[b]].buf, 0x5A, rq[b][rn[b]].len);
            read += np * KIB;
            rn[b]++;
        }
        for (int b = 0; b < 3; b++)
            assert_int_equal(flexdiag__store_submit(s, rq[b], rn[b], &rt[b]), FLEXDIAG_OK);
        for (int b = 2; b >= 0; b--) {
            assert_int_equal(flexdiag__store_wait(s, rt[b]), FLEXDIAG_OK);
            for (int i = 0; i < rn[b]; i++)
                assert_memory_equal(rq[b][i].buf, shadow + rq[b][i].off, rq[b][i].len);
        }
    }
    flexdiag_store_stats st;
    flexdiag__store_stats(s, &st);
    assert_int_equal(st.bytes_written, written);
    assert_int_equal(st.bytes_read, read);
    assert_int_equal(st.errors, 0);
    for (int e = 0; e < ne; e++) flexdiag__store_free(s, &ext[e]);
    flexdiag__store_stats(s, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.requested, 0);
    assert_int_equal(st.largest_free, st.capacity);
    flexdiag__store_destroy(s);
    assert_int_equal(dir_entries(dir), 0);
    free(shadow);
    free(reg);
    free(plain);
    tu_rmtree(dir);
    free(dir);
}

/* More requests than max_requests across batches: submit waits for slots; data intact. */
static void test_queue_overflow(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store_params p;
    flexdiag__store_params_init(&p);
    p.queue_depth = 32;
    p.max_requests = 64;
    flexdiag_store *s = mk(dir, 4 * MIB, &p);
    enum { NB = 4, PER = 60 };
    char *w = abuf(NB * PER * KIB), *g = abuf(NB * PER * KIB);
    tu_rng r;
    tu_rng_seed(&r, 7);
    fill_rand(&r, w, NB * PER * KIB);
    flexdiag_store_req q[PER];
    flexdiag_store_ticket t[NB];
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < PER; i++) {
            const size_t k = (size_t)(b * PER + i);
            q[i] = (flexdiag_store_req){FLEXDIAG_STORE_WRITE, k * KIB, KIB, w + k * KIB};
        }
        assert_int_equal(flexdiag__store_submit(s, q, PER, &t[b]), FLEXDIAG_OK);
    }
    for (int b = 0; b < NB; b++) assert_int_equal(flexdiag__store_wait(s, t[b]), FLEXDIAG_OK);
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < PER; i++) {
            const size_t k = (size_t)(b * PER + i);
            q[i] = (flexdiag_store_req){FLEXDIAG_STORE_READ, k * KIB, KIB, g + k * KIB};
        }
        assert_int_equal(flexdiag__store_submit(s, q, PER, &t[b]), FLEXDIAG_OK);
    }
    for (int b = NB - 1; b >= 0; b--) assert_int_equal(flexdiag__store_wait(s, t[b]), FLEXDIAG_OK);
    assert_memory_equal(w, g, NB * PER * KIB);
    /* a batch larger than max_requests can never fit */
    flexdiag_store_req big[65];
    for (int i = 0; i < 65; i++) big[i] = (flexdiag_store_req){FLEXDIAG_STORE_READ, 0, KIB, g};
    flexdiag_store_ticket bt;
    assert_int_equal(flexdiag__store_submit(s, big, 65, &bt), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__store_destroy(s);
    free(w);
    free(g);
    tu_rmtree(dir);
    free(dir);
}

/* ---- extents and requests ---- */

static void test_budget_refusal(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store_params p;
    flexdiag__store_params_init(&p);
    p.name = "kv";
    flexdiag_store *s = mk(dir, MIB + 100, &p); /* rounded down to 1 MiB */
    flexdiag_store_stats st;
    flexdiag__store_stats(s, &st);
    assert_int_equal(st.capacity, MIB);
    /* exact accounting: 5000 bytes carve 8192 */
    flexdiag_store_extent a, b, c, d, x;
    assert_int_equal(flexdiag__store_alloc(s, 5000, "a", &a), FLEXDIAG_OK);
    assert_int_equal(a.span, 8192);
    flexdiag__store_stats(s, &st);
    assert_int_equal(st.used, 8192);
    assert_int_equal(st.requested, 5000);
    flexdiag__store_free(s, &a);
    /* four quarters fill it; the fifth byte is refused with a message naming who and what */
    assert_int_equal(flexdiag__store_alloc(s, MIB / 4, "q0", &a), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_alloc(s, MIB / 4, "q1", &b), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_alloc(s, MIB / 4, "q2", &c), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_alloc(s, MIB / 4, "q3", &d), FLEXDIAG_OK);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_alloc(s, 1, "layer 7 weights", &x), FLEXDIAG_ERR_NO_SPACE);
    const char *m = flexdiag__err_msg();
    printf("  refusal: %s\n", m);
    assert_non_null(strstr(m, "'kv'"));
    assert_non_null(strstr(m, "layer 7 weights"));
    assert_non_null(strstr(m, "needs 1 bytes"));
    assert_non_null(strstr(m, "runtime_params.disk_mem"));
    /* fragmentation: half free in two runs, a half-sized extent is refused as fragmented */
    flexdiag__store_free(s, &a);
    flexdiag__store_free(s, &c);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_alloc(s, MIB / 2, "half", &x), FLEXDIAG_ERR_NO_SPACE);
    assert_non_null(strstr(flexdiag__err_msg(), "fragmented"));
    /* coalescing: freeing b joins a, b, c into one run */
    flexdiag__store_free(s, &b);
    assert_int_equal(flexdiag__store_alloc(s, 3 * MIB / 4, "three quarters", &x), FLEXDIAG_OK);
    assert_int_equal(x.off, 0);
    flexdiag__store_stats(s, &st);
    assert_int_equal(st.used, MIB);
    assert_int_equal(st.peak, MIB);
    flexdiag__store_free(s, &x);
    flexdiag__store_free(s, &d);
    assert_int_equal(flexdiag__store_alloc(s, 0, "zero", &x), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}

static void test_request_checks(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, MIB, NULL);
    char *buf = abuf(2 * KIB * 2);
    const struct {
        flexdiag_store_req q;
        const char *why;
    } bad[] = {
        {{FLEXDIAG_STORE_READ, 512, KIB, buf}, "multiples of 4096"},
        {{FLEXDIAG_STORE_READ, 0, 1000, buf}, "multiples of 4096"},
        {{FLEXDIAG_STORE_WRITE, 0, KIB, buf + 8}, "multiples of 4096"},
        {{FLEXDIAG_STORE_READ, MIB, KIB, buf}, "beyond the end"},
        {{FLEXDIAG_STORE_READ, MIB - KIB, 2 * KIB, buf}, "beyond the end"},
        {{FLEXDIAG_STORE_READ, UINT64_MAX - KIB + 1, KIB, buf}, "beyond the end"},
        {{FLEXDIAG_STORE_READ, 0, 0, buf}, "length 0"},
        {{FLEXDIAG_STORE_READ, 0, KIB, NULL}, "NULL buffer"},
        {{(flexdiag_store_op)7, 0, KIB, buf}, "unknown op"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        /* the bad request second: nothing of the batch may be queued */
        flexdiag_store_req q[2] = {{FLEXDIAG_STORE_READ, 0, KIB, buf}, bad[i].q};
        flexdiag_store_ticket t = 99;
        flexdiag__err_clear();
        assert_int_equal(flexdiag__store_submit(s, q, 2, &t), FLEXDIAG_ERR_INVALID_ARG);
        assert_int_equal(t, 0);
        assert_non_null(strstr(flexdiag__err_msg(), bad[i].why));
        assert_non_null(strstr(flexdiag__err_msg(), "request 1"));
    }
    flexdiag_store_stats st;
    flexdiag__store_stats(s, &st);
    assert_int_equal(st.requests, 0);
    /* tickets: an empty batch is done at once; a waited ticket is stale; garbage is refused */
    flexdiag_store_ticket t;
    assert_int_equal(flexdiag__store_submit(s, NULL, 0, &t), FLEXDIAG_OK);
    int done = 0;
    assert_int_equal(flexdiag__store_test(s, t, &done), FLEXDIAG_OK);
    assert_int_equal(done, 1);
    assert_int_equal(flexdiag__store_wait(s, t), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_wait(s, t), FLEXDIAG_ERR_INVALID_ARG);
    assert_int_equal(flexdiag__store_wait(s, 0x12345678ull), FLEXDIAG_ERR_INVALID_ARG);
    /* test() polls a real batch to completion */
    flexdiag_store_req q = {FLEXDIAG_STORE_READ, 0, KIB, buf};
    assert_int_equal(flexdiag__store_submit(s, &q, 1, &t), FLEXDIAG_OK);
    for (done = 0; !done;) assert_int_equal(flexdiag__store_test(s, t, &done), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_wait(s, t), FLEXDIAG_OK);
    /* the store still works */
    tu_rng r;
    tu_rng_seed(&r, 3);
    roundtrip(s, &r, 0, 2 * KIB * 2);
    flexdiag__store_destroy(s);
    free(buf);
    tu_rmtree(dir);
    free(dir);
}

/* max_batches unwaited tickets: the next submit is BUSY until one is waited for. */
static void test_ticket_limit(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store_params p;
    flexdiag__store_params_init(&p);
    p.max_batches = 4;
    flexdiag_store *s = mk(dir, MIB, &p);
    char *buf = abuf(KIB);
    flexdiag_store_req q = {FLEXDIAG_STORE_READ, 0, KIB, buf};
    flexdiag_store_ticket t[5];
    for (int i = 0; i < 4; i++) assert_int_equal(flexdiag__store_submit(s, &q, 1, &t[i]), 0);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_submit(s, &q, 1, &t[4]), FLEXDIAG_ERR_BUSY);
    assert_int_equal(flexdiag__store_wait(s, t[2]), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_submit(s, &q, 1, &t[4]), FLEXDIAG_OK);
    assert_int_not_equal(t[4], t[2]); /* a reused batch gets a new ticket */
    assert_int_equal(flexdiag__store_wait(s, t[2]), FLEXDIAG_ERR_INVALID_ARG);
    /* destroy with tickets never waited for: drained, no leak */
    flexdiag__store_destroy(s);
    free(buf);
    tu_rmtree(dir);
    free(dir);
}

/* ---- the file ---- */

static void test_unlinked(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, 2 * MIB, NULL);
    assert_int_equal(dir_entries(dir), 0);
    int deleted = 0;
    const int fd = store_fd(dir, &deleted);
    assert_true(fd >= 0);
    assert_true(deleted);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    assert_int_equal(sb.st_nlink, 0);
    assert_int_equal(sb.st_size, 2 * MIB);
    assert_non_null(strstr(flexdiag__store_path(s), dir));
    flexdiag__store_destroy(s);
    assert_int_equal(store_fd(dir, &deleted), -1);
    tu_rmtree(dir);
    free(dir);
}

/* /dev/shm (tmpfs): O_DIRECT where the kernel allows it (6.6+), buffered otherwise. */
static void test_tmpfs(void **state) {
    (void)state;
    struct stat sb;
    if (stat("/dev/shm", &sb) != 0 || !S_ISDIR(sb.st_mode) || access("/dev/shm", W_OK) != 0) {
        printf("  no writable /dev/shm: tmpfs case not run\n");
        return;
    }
    char dir[] = "/dev/shm/flexdiag-store-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    flexdiag_store *s = mk(dir, 4 * MIB, NULL);
    printf("  tmpfs: %s%s%s\n", flexdiag__store_direct(s) ? "O_DIRECT accepted" : "buffered",
           flexdiag__store_note(s)[0] ? ": " : "", flexdiag__store_note(s));
    if (!flexdiag__store_direct(s)) assert_non_null(strstr(flexdiag__store_note(s), "O_DIRECT"));
    tu_rng r;
    tu_rng_seed(&r, 5);
    roundtrip(s, &r, MIB, 2 * MIB);
    flexdiag__store_destroy(s);
    assert_int_equal(dir_entries(dir), 0);
    rmdir(dir);
}

/* A file system that refuses O_DIRECT (forced through fcntl): buffered, noted, still works. */
static void test_odirect_refused(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    fi_odirect_err = EINVAL;
    flexdiag_store *s = mk(dir, 2 * MIB, NULL);
    fi_odirect_err = 0;
    assert_int_equal(flexdiag__store_direct(s), 0);
    assert_non_null(strstr(flexdiag__store_note(s), "refuses O_DIRECT (EINVAL)"));
    tu_rng r;
    tu_rng_seed(&r, 6);
    roundtrip(s, &r, 0, 2 * MIB);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}

static void test_fallocate(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store_params p;
    flexdiag__store_params_init(&p);
    p.dir = dir;
    p.io = g_io;
    flexdiag_store *s = NULL;
    /* ENOSPC: NO_SPACE naming the folder; nothing left behind */
    p.budget = 4 * MIB;
    fi_fallocate_err = ENOSPC;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_ERR_NO_SPACE);
    fi_fallocate_err = 0;
    assert_null(s);
    printf("  ENOSPC: %s\n", flexdiag__err_msg());
    assert_non_null(strstr(flexdiag__err_msg(), dir));
    assert_non_null(strstr(flexdiag__err_msg(), "ENOSPC"));
    assert_int_equal(dir_entries(dir), 0);
    /* more than the disk has free: refused before fallocate runs */
    p.budget = 1ull << 60;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_ERR_NO_SPACE);
    assert_non_null(strstr(flexdiag__err_msg(), "free"));
    assert_int_equal(dir_entries(dir), 0);
    /* EOPNOTSUPP: sparse file via ftruncate, noted, usable */
    p.budget = 4 * MIB;
    fi_fallocate_err = EOPNOTSUPP;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_OK);
    fi_fallocate_err = 0;
    assert_non_null(strstr(flexdiag__store_note(s), "cannot preallocate"));
    tu_rng r;
    tu_rng_seed(&r, 8);
    roundtrip(s, &r, MIB, 3 * MIB);
    flexdiag__store_destroy(s);
    /* a folder that does not exist */
    p.dir = "/nonexistent/flexdiag";
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_ERR_NOT_FOUND);
    assert_non_null(strstr(flexdiag__err_msg(), "/nonexistent/flexdiag"));
    tu_rmtree(dir);
    free(dir);
}

/* ---- injected faults ---- */

/* Write and read back `n` MiB-sized requests in one batch each under the armed rule. */
static void batch_roundtrip(flexdiag_store *s, int n, uint64_t seed) {
    char *w = abuf((size_t)n * MIB), *g = abuf((size_t)n * MIB);
    tu_rng r;
    tu_rng_seed(&r, seed);
    fill_rand(&r, w, (size_t)n * MIB);
    memset(g, 0, (size_t)n * MIB);
    flexdiag_store_req q[16];
    flexdiag_store_ticket t;
    for (int i = 0; i < n; i++)
        q[i] = (flexdiag_store_req){FLEXDIAG_STORE_WRITE, (uint64_t)i * MIB, MIB,
                                    w + (size_t)i * MIB};
    assert_int_equal(flexdiag__store_submit(s, q, n, &t), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_wait(s, t), FLEXDIAG_OK);
    for (int i = 0; i < n; i++) {
        q[i].op = FLEXDIAG_STORE_READ;
        q[i].buf = g + (size_t)i * MIB;
    }
    assert_int_equal(flexdiag__store_submit(s, q, n, &t), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_wait(s, t), FLEXDIAG_OK);
    assert_memory_equal(w, g, (size_t)n * MIB);
    free(w);
    free(g);
}

static void test_fault_short(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, 8 * MIB, NULL);
    /* every transfer of both directions halved until it is one page: many resubmits */
    fi_set(&(fi_rule){.kind = FI_SHORT, .op = -1, .every = 1, .count = -1, .off = -1});
    batch_roundtrip(s, 8, 11);
    const int fired = fi_fired();
    fi_clear();
    flexdiag_store_stats st;
    flexdiag__store_stats(s, &st);
    printf("  short transfers injected %d, resubmits %llu\n", fired,
           (unsigned long long)st.resubmits);
    assert_true(fired > 0);
    assert_true(st.resubmits >= (uint64_t)fired);
    assert_int_equal(st.errors, 0);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}

static void test_fault_retry(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, 8 * MIB, NULL);
    const int errs[] = {EINTR, EAGAIN};
    for (int k = 0; k < 2; k++) {
        fi_set(&(fi_rule){.kind = FI_ERR, .err = errs[k], .op = -1, .every = 2, .count = 6,
                          .off = -1});
        batch_roundtrip(s, 8, 20 + (uint64_t)k);
        assert_int_equal(fi_fired(), 6);
        fi_clear();
    }
    if (g_io == FLEXDIAG_STORE_IO_URING) fi_submit_eintr = 3; /* -EINTR from submit_and_wait */
    batch_roundtrip(s, 4, 30);
    assert_int_equal(fi_submit_eintr, 0);
    flexdiag_store_stats st;
    flexdiag__store_stats(s, &st);
    assert_true(st.retries >= 12);
    assert_int_equal(st.errors, 0);
    /* a request that never stops failing with EAGAIN gives up with a message */
    fi_set(&(fi_rule){.kind = FI_ERR, .err = EAGAIN, .op = 0, .every = 1, .count = -1,
                      .off = 2 * MIB});
    char *buf = abuf(MIB);
    assert_int_equal(io1(s, FLEXDIAG_STORE_READ, 2 * MIB, MIB, buf), FLEXDIAG_ERR_IO);
    fi_clear();
    assert_non_null(strstr(flexdiag__err_msg(), "gave up"));
    assert_non_null(strstr(flexdiag__err_msg(), "EAGAIN"));
    free(buf);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}

/* EIO on one read of a batch: the batch fails naming file, offset, length and errno; the other
 * requests and later batches are unaffected; the same offset reads fine afterwards. */
static void test_fault_eio(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, 8 * MIB, NULL);
    batch_roundtrip(s, 8, 40); /* known contents */
    char *g = abuf(8 * MIB), *w = abuf(8 * MIB);
    flexdiag_store_req q[8];
    for (int i = 0; i < 8; i++)
        q[i] = (flexdiag_store_req){FLEXDIAG_STORE_READ, (uint64_t)i * MIB, MIB,
                                    w + (size_t)i * MIB};
    flexdiag_store_ticket t0, t1;
    assert_int_equal(flexdiag__store_submit(s, q, 8, &t0), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_wait(s, t0), FLEXDIAG_OK);
    fi_set(&(fi_rule){.kind = FI_ERR, .err = EIO, .op = 0, .every = 1, .count = 1,
                      .off = 5 * MIB});
    for (int i = 0; i < 8; i++) q[i].buf = g + (size_t)i * MIB;
    assert_int_equal(flexdiag__store_submit(s, q, 4, &t0), FLEXDIAG_OK);     /* 0..3 MiB */
    assert_int_equal(flexdiag__store_submit(s, q + 4, 4, &t1), FLEXDIAG_OK); /* 4..7 MiB */
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_wait(s, t1), FLEXDIAG_ERR_IO);
    fi_clear();
    const char *m = flexdiag__err_msg();
    printf("  EIO: %s\n", m);
    assert_non_null(strstr(m, flexdiag__store_path(s)));
    assert_non_null(strstr(m, "read of 1048576 bytes at offset 5242880"));
    assert_non_null(strstr(m, "Input/output error (EIO)"));
    assert_int_equal(flexdiag__store_wait(s, t0), FLEXDIAG_OK);
    assert_memory_equal(g, w, 4 * MIB);
    assert_memory_equal(g + 4 * MIB, w + 4 * MIB, MIB); /* the batch's other requests finished */
    assert_int_equal(io1(s, FLEXDIAG_STORE_READ, 5 * MIB, MIB, g), FLEXDIAG_OK);
    assert_memory_equal(g, w + 5 * MIB, MIB);
    flexdiag_store_stats st;
    flexdiag__store_stats(s, &st);
    assert_int_equal(st.errors, 1);
    free(g);
    free(w);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}

static void test_fault_enospc(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, 4 * MIB, NULL);
    char *w = abuf(MIB);
    memset(w, 1, MIB);
    fi_set(&(fi_rule){.kind = FI_ERR, .err = ENOSPC, .op = 1, .every = 1, .count = 1, .off = -1});
    assert_int_equal(io1(s, FLEXDIAG_STORE_WRITE, 3 * MIB, MIB, w), FLEXDIAG_ERR_NO_SPACE);
    fi_clear();
    const char *m = flexdiag__err_msg();
    assert_non_null(strstr(m, "write of 1048576 bytes at offset 3145728"));
    assert_non_null(strstr(m, "ENOSPC"));
    assert_non_null(strstr(m, flexdiag__store_path(s)));
    tu_rng r;
    tu_rng_seed(&r, 9);
    roundtrip(s, &r, 3 * MIB, MIB);
    free(w);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}

/* The file shrinks under the store (truncated while streaming): a read past the new end fails
 * with IO and "end of file", not a hang or garbage. */
static void test_truncated(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, 4 * MIB, NULL);
    int deleted;
    const int fd = store_fd(dir, &deleted);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 2 * MIB + 2 * KIB * 2), 0);
    char *g = abuf(MIB);
    flexdiag__err_clear();
    assert_int_equal(io1(s, FLEXDIAG_STORE_READ, 2 * MIB, MIB, g), FLEXDIAG_ERR_IO);
    assert_non_null(strstr(flexdiag__err_msg(), "end of file"));
    assert_non_null(strstr(flexdiag__err_msg(), "after 16384 bytes"));
    assert_int_equal(io1(s, FLEXDIAG_STORE_READ, MIB, MIB, g), FLEXDIAG_OK);
    free(g);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}

/* ---- backend choice (not per group) ---- */

static void test_backend_choice(void **state) {
    (void)state;
    char *dir = tu_tempdir("storetest");
    flexdiag_store_params p;
    flexdiag__store_params_init(&p);
    p.dir = dir;
    p.budget = MIB;
    flexdiag_store *s = NULL;
    /* FLEXDIAG_IO overrides AUTO only */
    setenv("FLEXDIAG_IO", "threads", 1);
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_OK);
    assert_string_equal(flexdiag__store_backend(s), "threads");
    assert_string_equal(flexdiag__store_note(s), "");
    flexdiag__store_destroy(s);
    setenv("FLEXDIAG_IO", "bogus", 1);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_ERR_INVALID_ARG);
    assert_non_null(strstr(flexdiag__err_msg(), "FLEXDIAG_IO=bogus"));
    unsetenv("FLEXDIAG_IO");
    p.queue_depth = 48;
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_ERR_INVALID_ARG);
    p.queue_depth = 64;
#ifdef FI_HAVE_URING
    /* io_uring refused at setup: AUTO falls back to threads and says why; URING fails */
    const int errs[] = {-ENOSYS, -EPERM};
    for (int k = 0; k < 2; k++) {
        fi_uring_init_err = errs[k];
        assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_OK);
        printf("  io_uring_queue_init %s -> %s: %s\n", strerrorname_np(-errs[k]),
               flexdiag__store_backend(s), flexdiag__store_note(s));
        assert_string_equal(flexdiag__store_backend(s), "threads");
        assert_non_null(strstr(flexdiag__store_note(s), strerrorname_np(-errs[k])));
        tu_rng r;
        tu_rng_seed(&r, 10);
        roundtrip(s, &r, 0, MIB);
        flexdiag__store_destroy(s);
    }
    p.io = FLEXDIAG_STORE_IO_URING;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_ERR_UNSUPPORTED);
    assert_non_null(strstr(flexdiag__err_msg(), "EPERM"));
    fi_uring_init_err = 0;
#else
    p.io = FLEXDIAG_STORE_IO_URING;
    flexdiag__err_clear();
    assert_int_equal(flexdiag__store_create(&p, &s), FLEXDIAG_ERR_UNSUPPORTED);
    assert_non_null(strstr(flexdiag__err_msg(), "liburing"));
#endif
    assert_int_equal(dir_entries(dir), 0);
    tu_rmtree(dir);
    free(dir);
}

#ifdef FI_HAVE_URING
/* Buffer registration refused (RLIMIT_MEMLOCK): plain read/write, noted, data intact. */
static void test_register_refused(void **state) {
    (void)state;
    if (!g_uring_ok) {
        printf("  io_uring unusable here: not run\n");
        return;
    }
    char *dir = tu_tempdir("storetest");
    flexdiag_store *s = mk(dir, 4 * MIB, NULL);
    char *stage = abuf(2 * MIB);
    flexdiag_store_buf b = {stage, 2 * MIB};
    fi_register_err = -ENOMEM;
    assert_int_equal(flexdiag__store_register_buffers(s, &b, 1), FLEXDIAG_OK);
    fi_register_err = 0;
    assert_int_equal(flexdiag__store_registered(s), 0);
    assert_non_null(strstr(flexdiag__store_note(s), "ulimit -l"));
    tu_rng r;
    tu_rng_seed(&r, 12);
    fill_rand(&r, stage, MIB);
    assert_int_equal(io1(s, FLEXDIAG_STORE_WRITE, 0, MIB, stage), FLEXDIAG_OK);
    assert_int_equal(io1(s, FLEXDIAG_STORE_READ, 0, MIB, stage + MIB), FLEXDIAG_OK);
    assert_memory_equal(stage, stage + MIB, MIB);
    /* registering again works, and no I/O may be in flight while it happens */
    assert_int_equal(flexdiag__store_register_buffers(s, &b, 1), FLEXDIAG_OK);
    assert_int_equal(flexdiag__store_registered(s), 1);
    flexdiag_store_req q = {FLEXDIAG_STORE_READ, 0, MIB, stage + MIB};
    flexdiag_store_ticket t;
    assert_int_equal(flexdiag__store_submit(s, &q, 1, &t), FLEXDIAG_OK);
    const flexdiag_status st = flexdiag__store_register_buffers(s, &b, 1);
    assert_int_equal(flexdiag__store_wait(s, t), FLEXDIAG_OK);
    /* the read may have finished before the call: either refused or accepted */
    assert_true(st == FLEXDIAG_OK || st == FLEXDIAG_ERR_INVALID_ARG);
    assert_memory_equal(stage, stage + MIB, MIB);
    free(stage);
    flexdiag__store_destroy(s);
    tu_rmtree(dir);
    free(dir);
}
#endif

/* ---- groups ---- */

static int use_threads(void **state) {
    (void)state;
    g_io = FLEXDIAG_STORE_IO_THREADS;
    return 0;
}

static int use_uring(void **state) {
    (void)state;
    g_io = FLEXDIAG_STORE_IO_URING;
    return 0;
}

/* 1 when this kernel lets us set up a ring (the io_uring group runs), else 0 with why. */
static int uring_usable(void) {
#ifdef FI_HAVE_URING
    struct io_uring ring;
    const int r = io_uring_queue_init(8, &ring, 0);
    if (r == 0) {
        io_uring_queue_exit(&ring);
        return 1;
    }
    fprintf(stderr, "test_store: io_uring_queue_init: %s: io_uring half skipped\n",
            strerror(-r));
#else
    fprintf(stderr, "test_store: built without liburing: io_uring half skipped\n");
#endif
    return 0;
}

int main(void) {
    flexdiag__log_level = FLEXDIAG_LOG_ERROR; /* notes are checked, not printed twice */
    unsetenv("FLEXDIAG_IO");
    const struct CMUnitTest per_backend[] = {
        cmocka_unit_test(test_roundtrip_random), cmocka_unit_test(test_queue_overflow),
        cmocka_unit_test(test_budget_refusal),   cmocka_unit_test(test_request_checks),
        cmocka_unit_test(test_ticket_limit),     cmocka_unit_test(test_unlinked),
        cmocka_unit_test(test_tmpfs),            cmocka_unit_test(test_odirect_refused),
        cmocka_unit_test(test_fallocate),        cmocka_unit_test(test_fault_short),
        cmocka_unit_test(test_fault_retry),      cmocka_unit_test(test_fault_eio),
        cmocka_unit_test(test_fault_enospc),     cmocka_unit_test(test_truncated),
    };
    const struct CMUnitTest choice[] = {
        cmocka_unit_test(test_backend_choice),
#ifdef FI_HAVE_URING
        cmocka_unit_test_setup(test_register_refused, use_uring),
#endif
    };
    int fails = cmocka_run_group_tests_name("store/threads", per_backend, use_threads, NULL);
    g_uring_ok = uring_usable();
    if (g_uring_ok)
        fails += cmocka_run_group_tests_name("store/io_uring", per_backend, use_uring, NULL);
    fails += cmocka_run_group_tests_name("store/backend", choice, NULL, NULL);
    return fails ? 1 : 0;
}
